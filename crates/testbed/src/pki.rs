//! A throw-away test PKI built with `rcgen`.
//!
//! `rcgen` with the `ring` backend cannot generate RSA keys, so RSA keys are generated with OpenSSL
//! and handed to `rcgen` as PKCS#8 PEM. Every PKI has a random root key, so two [`TestPki`]s are
//! unrelated: one is the "wrong CA" for the other.

use std::fs;
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType, SerialNumber, SignatureAlgorithm,
};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use time::{Duration, OffsetDateTime};
use zeroize::Zeroizing;

/// Errors from building or writing the test PKI.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    /// `rcgen` rejected the parameters or failed to sign.
    #[error("certificate generation failed: {0}")]
    Rcgen(#[from] rcgen::Error),
    /// OpenSSL failed to generate an RSA key.
    #[error("RSA key generation failed: {0}")]
    Openssl(#[from] openssl::error::ErrorStack),
    /// Writing PEM files failed.
    #[error("writing {path}: {error}")]
    Io {
        /// File that could not be written.
        path: PathBuf,
        /// Underlying error.
        error: std::io::Error,
    },
}

/// Key algorithm of a certificate's subject key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KeyType {
    /// RSA 2048-bit, signs with RSA PKCS#1 v1.5 SHA-256.
    Rsa2048,
    /// RSA 3072-bit.
    Rsa3072,
    /// RSA 4096-bit.
    Rsa4096,
    /// ECDSA on P-256 with SHA-256.
    EcdsaP256,
    /// ECDSA on P-384 with SHA-384.
    EcdsaP384,
    /// Ed25519.
    Ed25519,
}

impl KeyType {
    /// All key types, for tests that loop over them.
    pub const ALL: [KeyType; 6] = [
        KeyType::Rsa2048,
        KeyType::Rsa3072,
        KeyType::Rsa4096,
        KeyType::EcdsaP256,
        KeyType::EcdsaP384,
        KeyType::Ed25519,
    ];

    fn algorithm(self) -> &'static SignatureAlgorithm {
        match self {
            KeyType::Rsa2048 | KeyType::Rsa3072 | KeyType::Rsa4096 => &rcgen::PKCS_RSA_SHA256,
            KeyType::EcdsaP256 => &rcgen::PKCS_ECDSA_P256_SHA256,
            KeyType::EcdsaP384 => &rcgen::PKCS_ECDSA_P384_SHA384,
            KeyType::Ed25519 => &rcgen::PKCS_ED25519,
        }
    }

    fn rsa_bits(self) -> Option<u32> {
        match self {
            KeyType::Rsa2048 => Some(2048),
            KeyType::Rsa3072 => Some(3072),
            KeyType::Rsa4096 => Some(4096),
            _ => None,
        }
    }

    /// Whether this is an RSA key (TLS 1.2 RSA key exchange needs keyEncipherment).
    pub fn is_rsa(self) -> bool {
        self.rsa_bits().is_some()
    }

    /// Generates a fresh key pair; the PKCS#8 DER is returned alongside so callers can keep a
    /// zeroizing copy.
    fn generate(self) -> Result<(KeyPair, Zeroizing<Vec<u8>>), PkiError> {
        // ring writes Ed25519 keys as PKCS#8 v2, which OpenSSL 3.0 (and so nginx, s_server)
        // cannot read; OpenSSL's PKCS#8 v1 output is read by both.
        let openssl_key = match (self, self.rsa_bits()) {
            (_, Some(bits)) => Some(openssl::pkey::PKey::from_rsa(openssl::rsa::Rsa::generate(
                bits,
            )?)?),
            (KeyType::Ed25519, None) => Some(openssl::pkey::PKey::generate_ed25519()?),
            _ => None,
        };
        let key = match openssl_key {
            Some(pkey) => {
                let pem = Zeroizing::new(pkey.private_key_to_pem_pkcs8()?);
                let pem_str =
                    std::str::from_utf8(&pem).map_err(|_| rcgen::Error::CouldNotParseKeyPair)?;
                KeyPair::from_pkcs8_pem_and_sign_algo(pem_str, self.algorithm())?
            }
            None => KeyPair::generate_for(self.algorithm())?,
        };
        let der = Zeroizing::new(key.serialize_der());
        Ok((key, der))
    }
}

/// What a leaf certificate is for; decides its extended key usages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// TLS server: serverAuth.
    Server,
    /// Middlebox: serverAuth and clientAuth, since a middlebox faces both endpoints.
    Middlebox,
    /// TLS client: clientAuth.
    Client,
}

/// Validity window of an issued certificate, relative to now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Validity {
    /// Valid from one day ago to one year from now.
    Current,
    /// Valid from 30 days ago until one day ago.
    Expired,
    /// Valid from tomorrow for 30 days.
    NotYetValid,
    /// Valid from one day ago until this long from now (whole seconds).
    ExpiresIn(std::time::Duration),
    /// Explicit window.
    Custom {
        /// Start of validity.
        not_before: OffsetDateTime,
        /// End of validity.
        not_after: OffsetDateTime,
    },
}

impl Validity {
    fn window(self) -> (OffsetDateTime, OffsetDateTime) {
        let now = OffsetDateTime::now_utc();
        match self {
            Validity::Current => (now - Duration::days(1), now + Duration::days(365)),
            Validity::Expired => (now - Duration::days(30), now - Duration::days(1)),
            Validity::NotYetValid => (now + Duration::days(1), now + Duration::days(30)),
            Validity::ExpiresIn(d) => (
                now - Duration::days(1),
                now + Duration::seconds(i64::try_from(d.as_secs()).unwrap_or(i64::MAX)),
            ),
            Validity::Custom {
                not_before,
                not_after,
            } => (not_before, not_after),
        }
    }
}

/// Description of a leaf certificate to issue.
#[derive(Debug, Clone)]
pub struct LeafSpec {
    /// Subject common name.
    pub common_name: String,
    /// What the certificate is for.
    pub role: Role,
    /// Subject key algorithm.
    pub key_type: KeyType,
    /// subjectAltName DNS names.
    pub dns_names: Vec<String>,
    /// subjectAltName IP addresses.
    pub ips: Vec<IpAddr>,
    /// Validity window.
    pub validity: Validity,
}

impl LeafSpec {
    /// A leaf for `role` named `name`, ECDSA P-256, currently valid, with `name` as the only DNS SAN.
    pub fn new(role: Role, name: &str) -> Self {
        LeafSpec {
            common_name: name.to_owned(),
            role,
            key_type: KeyType::EcdsaP256,
            dns_names: vec![name.to_owned()],
            ips: Vec::new(),
            validity: Validity::Current,
        }
    }

    /// Server certificate for `name`, also valid for 127.0.0.1 and ::1 so loopback tests can
    /// connect by IP.
    pub fn server(name: &str) -> Self {
        LeafSpec::new(Role::Server, name)
            .ip(IpAddr::V4(Ipv4Addr::LOCALHOST))
            .ip(IpAddr::V6(Ipv6Addr::LOCALHOST))
    }

    /// Middlebox certificate for `name` (serverAuth + clientAuth), also valid for 127.0.0.1.
    pub fn middlebox(name: &str) -> Self {
        LeafSpec::new(Role::Middlebox, name).ip(IpAddr::V4(Ipv4Addr::LOCALHOST))
    }

    /// Client certificate (clientAuth) with `name` as common name and DNS SAN.
    pub fn client(name: &str) -> Self {
        LeafSpec::new(Role::Client, name)
    }

    /// Sets the key type.
    pub fn key_type(mut self, key_type: KeyType) -> Self {
        self.key_type = key_type;
        self
    }

    /// Adds a DNS SAN.
    pub fn dns(mut self, name: &str) -> Self {
        self.dns_names.push(name.to_owned());
        self
    }

    /// Adds an IP SAN.
    pub fn ip(mut self, ip: IpAddr) -> Self {
        self.ips.push(ip);
        self
    }

    /// Sets the validity window.
    pub fn validity(mut self, validity: Validity) -> Self {
        self.validity = validity;
        self
    }
}

/// An extension whose value depends on the leaf's key: its OID, and the function of the key's
/// DER SubjectPublicKeyInfo that gives its value.
pub type KeyBoundExtension<'a> = (&'a [u64], &'a dyn Fn(&[u8]) -> Vec<u8>);

/// A certificate authority: a root (from [`TestPki::new`]) or an intermediate (from
/// [`TestPki::intermediate`]) that issues leaves.
pub struct TestPki {
    name: String,
    issuer: Issuer<'static, KeyPair>,
    /// This CA's own certificate.
    ca_der: CertificateDer<'static>,
    /// Intermediates from this CA up to, excluding, the root (empty for a root).
    intermediates: Vec<CertificateDer<'static>>,
    root_der: CertificateDer<'static>,
}

impl std::fmt::Debug for TestPki {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestPki")
            .field("name", &self.name)
            .field("intermediates", &self.intermediates.len())
            .finish_non_exhaustive()
    }
}

fn ca_params(name: &str, pki_name: &str) -> CertificateParams {
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, name);
    dn.push(DnType::OrganizationName, format!("mbx test PKI {pki_name}"));
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let (not_before, not_after) = Validity::Current.window();
    params.not_before = not_before;
    params.not_after = not_after + Duration::days(365);
    params.use_authority_key_identifier_extension = true;
    params
}

fn random_serial() -> Result<SerialNumber, PkiError> {
    let mut bytes = [0u8; 16];
    openssl::rand::rand_bytes(&mut bytes)?;
    // Positive, non-zero leading byte keeps the DER INTEGER at a fixed 16 bytes.
    bytes[0] = (bytes[0] & 0x7f) | 0x01;
    Ok(SerialNumber::from_slice(&bytes))
}

impl TestPki {
    /// A new root CA named `name` with an ECDSA P-256 key.
    pub fn new(name: &str) -> Result<Self, PkiError> {
        Self::with_key_type(name, KeyType::EcdsaP256)
    }

    /// A new root CA with the given key type.
    pub fn with_key_type(name: &str, key_type: KeyType) -> Result<Self, PkiError> {
        let (key, _der) = key_type.generate()?;
        let mut params = ca_params(&format!("{name} Root CA"), name);
        params.serial_number = Some(random_serial()?);
        let cert = params.self_signed(&key)?;
        let der = cert.der().clone();
        Ok(TestPki {
            name: name.to_owned(),
            issuer: Issuer::new(params, key),
            ca_der: der.clone(),
            intermediates: Vec::new(),
            root_der: der,
        })
    }

    /// An intermediate CA signed by this CA. Leaves it issues carry the intermediate(s) in their
    /// chain; the trust anchor stays this PKI's root.
    pub fn intermediate(&self, name: &str) -> Result<TestPki, PkiError> {
        let (key, _der) = KeyType::EcdsaP256.generate()?;
        let mut params = ca_params(&format!("{name} Intermediate CA"), &self.name);
        params.serial_number = Some(random_serial()?);
        let cert = params.signed_by(&key, &self.issuer)?;
        let der = cert.der().clone();
        let mut intermediates = vec![der.clone()];
        intermediates.extend(self.intermediates.iter().cloned());
        Ok(TestPki {
            name: name.to_owned(),
            issuer: Issuer::new(params, key),
            ca_der: der,
            intermediates,
            root_der: self.root_der.clone(),
        })
    }

    /// Name given at creation.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// DER of the root certificate (the trust anchor).
    pub fn root_der(&self) -> &CertificateDer<'static> {
        &self.root_der
    }

    /// PEM of the root certificate.
    pub fn root_pem(&self) -> String {
        pem_cert(&self.root_der)
    }

    /// DER of this CA's own certificate (the root for a root PKI).
    pub fn ca_der(&self) -> &CertificateDer<'static> {
        &self.ca_der
    }

    /// Issues a leaf certificate.
    pub fn issue(&self, spec: &LeafSpec) -> Result<IssuedCert, PkiError> {
        self.issue_with_extension(spec, None)
    }

    /// [`issue`](Self::issue), with an extension whose value is made for the leaf's key:
    /// `extension` = (OID, a function of the key's DER SubjectPublicKeyInfo giving the
    /// extension's value), e.g. attestation evidence bound to the key.
    pub fn issue_with_extension(
        &self,
        spec: &LeafSpec,
        extension: Option<KeyBoundExtension<'_>>,
    ) -> Result<IssuedCert, PkiError> {
        let (key, key_der) = spec.key_type.generate()?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, spec.common_name.as_str());
        dn.push(
            DnType::OrganizationName,
            format!("mbx test PKI {}", self.name),
        );
        params.distinguished_name = dn;
        let mut sans = Vec::new();
        for name in &spec.dns_names {
            sans.push(SanType::DnsName(name.clone().try_into()?));
        }
        sans.extend(spec.ips.iter().map(|ip| SanType::IpAddress(*ip)));
        params.subject_alt_names = sans;
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        if spec.key_type.is_rsa() {
            params.key_usages.push(KeyUsagePurpose::KeyEncipherment);
        }
        params.extended_key_usages = match spec.role {
            Role::Server => vec![ExtendedKeyUsagePurpose::ServerAuth],
            Role::Client => vec![ExtendedKeyUsagePurpose::ClientAuth],
            Role::Middlebox => vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
        };
        let (not_before, not_after) = spec.validity.window();
        params.not_before = not_before;
        params.not_after = not_after;
        params.use_authority_key_identifier_extension = true;
        params.serial_number = Some(random_serial()?);
        if let Some((oid, value_for)) = extension {
            use rcgen::PublicKeyData as _;
            let value = value_for(&key.subject_public_key_info());
            params
                .custom_extensions
                .push(rcgen::CustomExtension::from_oid_content(oid, value));
        }
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(IssuedCert {
            key_type: spec.key_type,
            cert_der: cert.der().clone(),
            intermediates: self.intermediates.clone(),
            root_der: self.root_der.clone(),
            key_pkcs8: key_der,
        })
    }
}

fn pem_cert(der: &[u8]) -> String {
    pem_encode("CERTIFICATE", der)
}

/// Minimal PEM encoder (base64 with 64-column lines) so keys can be rendered into zeroizing
/// buffers.
fn pem_encode(label: &str, der: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut b64 = Zeroizing::new(Vec::with_capacity(der.len().div_ceil(3) * 4));
    for chunk in der.chunks(3) {
        let b = [
            chunk.first().copied().unwrap_or(0),
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        let idx = |shift: u32| ALPHABET[((n >> shift) & 0x3f) as usize];
        b64.push(idx(18));
        b64.push(idx(12));
        b64.push(if chunk.len() > 1 { idx(6) } else { b'=' });
        b64.push(if chunk.len() > 2 { idx(0) } else { b'=' });
    }
    let mut out = String::with_capacity(b64.len() + b64.len() / 64 + 64);
    out.push_str("-----BEGIN ");
    out.push_str(label);
    out.push_str("-----\n");
    for line in b64.chunks(64) {
        // The alphabet is ASCII, so every byte is a char.
        out.extend(line.iter().map(|&c| char::from(c)));
        out.push('\n');
    }
    out.push_str("-----END ");
    out.push_str(label);
    out.push_str("-----\n");
    out
}

/// A leaf certificate, its chain and its private key.
pub struct IssuedCert {
    key_type: KeyType,
    cert_der: CertificateDer<'static>,
    intermediates: Vec<CertificateDer<'static>>,
    root_der: CertificateDer<'static>,
    key_pkcs8: Zeroizing<Vec<u8>>,
}

impl std::fmt::Debug for IssuedCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IssuedCert")
            .field("key_type", &self.key_type)
            .field("intermediates", &self.intermediates.len())
            .finish_non_exhaustive()
    }
}

/// Paths written by [`IssuedCert::write_to`].
#[derive(Debug, Clone)]
pub struct PkiFiles {
    /// Leaf certificate alone (PEM).
    pub cert: PathBuf,
    /// Leaf followed by intermediates (PEM): what nginx `ssl_certificate` and `s_server -cert` want.
    pub chain: PathBuf,
    /// Intermediates only (PEM, possibly empty): for `openssl verify -untrusted` / `s_server -cert_chain`.
    pub intermediates: PathBuf,
    /// PKCS#8 private key (PEM, mode 0600).
    pub key: PathBuf,
    /// Root CA certificate (PEM): for `--cacert` / `-CAfile`.
    pub ca: PathBuf,
}

impl IssuedCert {
    /// Subject key type.
    pub fn key_type(&self) -> KeyType {
        self.key_type
    }

    /// Leaf certificate DER.
    pub fn cert_der(&self) -> &CertificateDer<'static> {
        &self.cert_der
    }

    /// Leaf certificate PEM.
    pub fn cert_pem(&self) -> String {
        pem_cert(&self.cert_der)
    }

    /// Leaf followed by intermediates (the chain a server sends), DER.
    pub fn chain_der(&self) -> Vec<CertificateDer<'static>> {
        let mut chain = vec![self.cert_der.clone()];
        chain.extend(self.intermediates.iter().cloned());
        chain
    }

    /// Leaf followed by intermediates, PEM.
    pub fn chain_pem(&self) -> String {
        self.chain_der().iter().map(|c| pem_cert(c)).collect()
    }

    /// Intermediates only, DER (empty when issued by a root).
    pub fn intermediates_der(&self) -> &[CertificateDer<'static>] {
        &self.intermediates
    }

    /// Root certificate DER (trust anchor).
    pub fn root_der(&self) -> &CertificateDer<'static> {
        &self.root_der
    }

    /// Root certificate PEM.
    pub fn root_pem(&self) -> String {
        pem_cert(&self.root_der)
    }

    /// PKCS#8 private key DER.
    pub fn key_pkcs8_der(&self) -> &[u8] {
        &self.key_pkcs8
    }

    /// PKCS#8 private key PEM, zeroized when dropped.
    pub fn key_pem(&self) -> Zeroizing<String> {
        Zeroizing::new(pem_encode("PRIVATE KEY", &self.key_pkcs8))
    }

    /// The key as a `rustls` private key (a copy; the caller owns its lifetime).
    pub fn private_key(&self) -> PrivateKeyDer<'static> {
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.key_pkcs8.to_vec()))
    }

    /// Writes `leaf.crt`, `leaf.chain.crt`, `leaf.intermediates.crt`, `leaf.key` (0600) and
    /// `leaf.ca.crt` into `dir`; use [`IssuedCert::write_to_named`] to choose the stem.
    pub fn write_to(&self, dir: &Path) -> Result<PkiFiles, PkiError> {
        self.write_to_named(dir, "leaf")
    }

    /// Like [`IssuedCert::write_to`] with a chosen file stem, so several certificates can share a
    /// directory.
    pub fn write_to_named(&self, dir: &Path, stem: &str) -> Result<PkiFiles, PkiError> {
        let files = PkiFiles {
            cert: dir.join(format!("{stem}.crt")),
            chain: dir.join(format!("{stem}.chain.crt")),
            intermediates: dir.join(format!("{stem}.intermediates.crt")),
            key: dir.join(format!("{stem}.key")),
            ca: dir.join(format!("{stem}.ca.crt")),
        };
        write_file(&files.cert, self.cert_pem().as_bytes(), 0o644)?;
        write_file(&files.chain, self.chain_pem().as_bytes(), 0o644)?;
        let inter: String = self.intermediates.iter().map(|c| pem_cert(c)).collect();
        write_file(&files.intermediates, inter.as_bytes(), 0o644)?;
        write_file(&files.key, self.key_pem().as_bytes(), 0o600)?;
        write_file(&files.ca, self.root_pem().as_bytes(), 0o644)?;
        Ok(files)
    }
}

fn write_file(path: &Path, data: &[u8], mode: u32) -> Result<(), PkiError> {
    use std::os::unix::fs::OpenOptionsExt;
    let io = |error| PkiError::Io {
        path: path.to_owned(),
        error,
    };
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(path)
        .map_err(io)?;
    f.write_all(data).map_err(io)?;
    Ok(())
}
