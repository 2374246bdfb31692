//! rustls configurations for the edge ↔ key-server link: mutual TLS 1.3 and 1.2 with the `ring`
//! provider, required client certificates from a configured CA, and a deny list checked during the
//! handshake.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::WebPkiClientVerifier;
use rustls::{CertificateError, DigitallySignedStruct, DistinguishedName, RootCertStore};
use rustls_pki_types::pem::PemObject;

use crate::x509;

/// Errors while building a TLS configuration.
#[derive(Debug, thiserror::Error)]
pub enum TlsSetupError {
    /// A PEM file could not be read or holds nothing usable.
    #[error("{path}: {reason}")]
    Pem {
        /// The file.
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// rustls refused the configuration.
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
    /// The client verifier could not be built (e.g. no trust anchor).
    #[error("client verifier: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
    /// A deny-list entry is not hexadecimal of the right length.
    #[error("deny list entry {0:?} is not valid hex")]
    DenyEntry(String),
}

/// Reads every certificate of a PEM file.
pub fn load_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsSetupError> {
    let bad = |reason: String| TlsSetupError::Pem {
        path: path.display().to_string(),
        reason,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| bad(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(e.to_string()))?;
    if certs.is_empty() {
        return Err(bad("no certificate".into()));
    }
    Ok(certs)
}

/// Reads the first private key of a PEM file.
pub fn load_private_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsSetupError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| TlsSetupError::Pem {
        path: path.display().to_string(),
        reason: e.to_string(),
    })
}

/// Certificates refused even though they chain to the CA: by SHA-256 of the DER certificate, or
/// by serial number (leading zeros ignored).
#[derive(Debug, Clone, Default)]
pub struct DenyList {
    sha256: HashSet<[u8; 32]>,
    serials: HashSet<Vec<u8>>,
}

fn parse_hex(text: &str) -> Result<Vec<u8>, TlsSetupError> {
    let clean: String = text.chars().filter(|c| *c != ':').collect();
    hex::decode(clean).map_err(|_| TlsSetupError::DenyEntry(text.to_owned()))
}

impl DenyList {
    /// An empty deny list.
    pub fn new() -> DenyList {
        DenyList::default()
    }

    /// Builds a list from hex strings (colons allowed).
    pub fn from_hex(sha256: &[String], serials: &[String]) -> Result<DenyList, TlsSetupError> {
        let mut list = DenyList::new();
        for s in sha256 {
            let bytes: [u8; 32] = parse_hex(s)?
                .try_into()
                .map_err(|_| TlsSetupError::DenyEntry(s.clone()))?;
            list.sha256.insert(bytes);
        }
        for s in serials {
            list.deny_serial(&parse_hex(s)?);
        }
        Ok(list)
    }

    /// Denies a certificate by its SHA-256.
    pub fn deny_sha256(&mut self, digest: [u8; 32]) {
        self.sha256.insert(digest);
    }

    /// Denies a certificate by serial number.
    pub fn deny_serial(&mut self, serial: &[u8]) {
        self.serials
            .insert(x509::strip_leading_zeros(serial).to_vec());
    }

    /// Whether `cert_der` is denied. An unparsable certificate is denied.
    pub fn is_denied(&self, cert_der: &[u8]) -> bool {
        if self.sha256.contains(&x509::certificate_sha256(cert_der)) {
            return true;
        }
        if self.serials.is_empty() {
            return false;
        }
        match x509::certificate_serial(cert_der) {
            Ok(serial) => self.serials.contains(&serial),
            Err(_) => true,
        }
    }
}

/// WebPKI client verification followed by the deny list, so a denied certificate fails the
/// handshake with a `certificate_revoked` alert.
#[derive(Debug)]
struct DenyListVerifier {
    inner: Arc<dyn ClientCertVerifier>,
    deny: DenyList,
}

impl ClientCertVerifier for DenyListVerifier {
    fn offer_client_auth(&self) -> bool {
        self.inner.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.inner.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .inner
            .verify_client_cert(end_entity, intermediates, now)?;
        if self.deny.is_denied(end_entity) {
            tracing::warn!(
                sha256 = %hex::encode(x509::certificate_sha256(end_entity)),
                "edge certificate is on the deny list"
            );
            return Err(rustls::Error::InvalidCertificate(CertificateError::Revoked));
        }
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn roots(certs: &[CertificateDer<'static>]) -> Result<RootCertStore, TlsSetupError> {
    let mut store = RootCertStore::empty();
    for c in certs {
        store.add(c.clone())?;
    }
    Ok(store)
}

/// The key server's TLS configuration: its own chain and key, TLS 1.3 and 1.2, and a REQUIRED
/// client certificate chaining to `edge_ca` (expired, unknown-CA and denied certificates fail
/// the handshake).
pub fn server_config(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    edge_ca: &[CertificateDer<'static>],
    deny: DenyList,
) -> Result<Arc<rustls::ServerConfig>, TlsSetupError> {
    let provider = provider();
    let inner =
        WebPkiClientVerifier::builder_with_provider(Arc::new(roots(edge_ca)?), provider.clone())
            .build()?;
    let verifier = Arc::new(DenyListVerifier { inner, deny });
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)?;
    Ok(Arc::new(config))
}

/// The edge's TLS configuration towards key servers: trusts `server_ca`, presents `identity`
/// (chain and key) when given, TLS 1.3 and 1.2 (or only `versions` when not empty).
pub fn client_config(
    server_ca: &[CertificateDer<'static>],
    identity: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> Result<Arc<rustls::ClientConfig>, TlsSetupError> {
    let versions = if versions.is_empty() {
        &[&rustls::version::TLS13, &rustls::version::TLS12][..]
    } else {
        versions
    };
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(versions)?
        .with_root_certificates(roots(server_ca)?);
    let config = match identity {
        Some((chain, key)) => builder.with_client_auth_cert(chain, key)?,
        None => builder.with_no_client_auth(),
    };
    Ok(Arc::new(config))
}
