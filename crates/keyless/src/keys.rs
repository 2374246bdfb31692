//! Private keys and the operations the key server performs with them.
//!
//! [`KeyOperation`] is what an opcode asks for; [`KeyHandle`] is anything that can perform it (a
//! key in memory, or a PKCS#11 token object: [`crate::pkcs11::Pkcs11Key`]); [`KeyStore`] finds a
//! handle by SKI or by certificate digest. [`KeyStore::load_dir`] reads a directory of PEM/DER private keys (PKCS#8,
//! PKCS#1 RSA, SEC1 EC) and certificates; a certificate whose public key matches a key lends
//! that key its host names, which authorization rules may name.
//!
//! All private-key arithmetic is OpenSSL's: RSA private operations use blinding and
//! constant-time modular exponentiation (OpenSSL defaults), and `EVP_PKEY_sign` signs a digest
//! computed elsewhere, which is what the protocol sends (ring can only sign whole messages).

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use openssl::ec::EcKey;
use openssl::md::Md;
use openssl::nid::Nid;
use openssl::pkey::{Id, PKey, Private};
use openssl::pkey_ctx::PkeyCtx;
use openssl::rsa::{Padding, Rsa};
use openssl::sign::{RsaPssSaltlen, Signer};
use rustls_pki_types::pem::{PemObject, SectionKind};
use zeroize::Zeroizing;

use crate::wire::{ErrorCode, Opcode};
use crate::x509;

/// The hash whose digest a signing request carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HashAlg {
    /// MD5 ‖ SHA-1, 36 bytes (TLS 1.0/1.1 RSA signatures, no DigestInfo).
    Md5Sha1,
    /// SHA-1, 20 bytes.
    Sha1,
    /// SHA-224, 28 bytes.
    Sha224,
    /// SHA-256, 32 bytes.
    Sha256,
    /// SHA-384, 48 bytes.
    Sha384,
    /// SHA-512, 64 bytes.
    Sha512,
}

impl HashAlg {
    /// Digest length in bytes; a request whose digest has another length is error 0x07.
    pub fn digest_len(self) -> usize {
        match self {
            HashAlg::Md5Sha1 => 36,
            HashAlg::Sha1 => 20,
            HashAlg::Sha224 => 28,
            HashAlg::Sha256 => 32,
            HashAlg::Sha384 => 48,
            HashAlg::Sha512 => 64,
        }
    }

    /// OpenSSL's digest, `None` for MD5‖SHA-1 (signed raw, without DigestInfo).
    fn md(self) -> Option<&'static openssl::md::MdRef> {
        match self {
            HashAlg::Md5Sha1 => None,
            HashAlg::Sha1 => Some(Md::sha1()),
            HashAlg::Sha224 => Some(Md::sha224()),
            HashAlg::Sha256 => Some(Md::sha256()),
            HashAlg::Sha384 => Some(Md::sha384()),
            HashAlg::Sha512 => Some(Md::sha512()),
        }
    }
}

/// A private-key operation, one per key opcode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KeyOperation {
    /// Raw RSA decryption (no padding removed): the edge unpads, so we are no padding oracle.
    RsaDecryptRaw,
    /// RSA PKCS#1 v1.5 signature of a precomputed digest.
    RsaPkcs1Sign(HashAlg),
    /// RSA-PSS signature of a precomputed digest, MGF1 with the same hash, salt = digest length.
    RsaPssSign(HashAlg),
    /// ECDSA signature of a precomputed digest, DER encoded.
    EcdsaSign(HashAlg),
    /// Ed25519 signature of the whole message.
    Ed25519Sign,
}

impl KeyOperation {
    /// The operation an opcode asks for. Response opcodes are error 0x06; seal, unseal, RPC,
    /// custom and ping (which is no key operation) are error 0x05.
    pub fn from_opcode(op: Opcode) -> Result<KeyOperation, ErrorCode> {
        use HashAlg::*;
        Ok(match op {
            Opcode::RsaDecrypt => KeyOperation::RsaDecryptRaw,
            Opcode::RsaSignMd5Sha1 => KeyOperation::RsaPkcs1Sign(Md5Sha1),
            Opcode::RsaSignSha1 => KeyOperation::RsaPkcs1Sign(Sha1),
            Opcode::RsaSignSha224 => KeyOperation::RsaPkcs1Sign(Sha224),
            Opcode::RsaSignSha256 => KeyOperation::RsaPkcs1Sign(Sha256),
            Opcode::RsaSignSha384 => KeyOperation::RsaPkcs1Sign(Sha384),
            Opcode::RsaSignSha512 => KeyOperation::RsaPkcs1Sign(Sha512),
            Opcode::EcdsaSignMd5Sha1 => KeyOperation::EcdsaSign(Md5Sha1),
            Opcode::EcdsaSignSha1 => KeyOperation::EcdsaSign(Sha1),
            Opcode::EcdsaSignSha224 => KeyOperation::EcdsaSign(Sha224),
            Opcode::EcdsaSignSha256 => KeyOperation::EcdsaSign(Sha256),
            Opcode::EcdsaSignSha384 => KeyOperation::EcdsaSign(Sha384),
            Opcode::EcdsaSignSha512 => KeyOperation::EcdsaSign(Sha512),
            Opcode::Ed25519Sign => KeyOperation::Ed25519Sign,
            Opcode::RsaPssSignSha256 => KeyOperation::RsaPssSign(Sha256),
            Opcode::RsaPssSignSha384 => KeyOperation::RsaPssSign(Sha384),
            Opcode::RsaPssSignSha512 => KeyOperation::RsaPssSign(Sha512),
            Opcode::Response | Opcode::Pong | Opcode::Error => {
                return Err(ErrorCode::UnexpectedOpcode)
            }
            Opcode::Seal | Opcode::Unseal | Opcode::Rpc | Opcode::Custom | Opcode::Ping => {
                return Err(ErrorCode::BadOpcode)
            }
        })
    }

    /// The opcode that asks for this operation; `None` for RSA-PSS with a hash the protocol has
    /// no opcode for (only SHA-256/384/512 exist).
    pub fn opcode(self) -> Option<Opcode> {
        use HashAlg::*;
        Some(match self {
            KeyOperation::RsaDecryptRaw => Opcode::RsaDecrypt,
            KeyOperation::RsaPkcs1Sign(Md5Sha1) => Opcode::RsaSignMd5Sha1,
            KeyOperation::RsaPkcs1Sign(Sha1) => Opcode::RsaSignSha1,
            KeyOperation::RsaPkcs1Sign(Sha224) => Opcode::RsaSignSha224,
            KeyOperation::RsaPkcs1Sign(Sha256) => Opcode::RsaSignSha256,
            KeyOperation::RsaPkcs1Sign(Sha384) => Opcode::RsaSignSha384,
            KeyOperation::RsaPkcs1Sign(Sha512) => Opcode::RsaSignSha512,
            KeyOperation::EcdsaSign(Md5Sha1) => Opcode::EcdsaSignMd5Sha1,
            KeyOperation::EcdsaSign(Sha1) => Opcode::EcdsaSignSha1,
            KeyOperation::EcdsaSign(Sha224) => Opcode::EcdsaSignSha224,
            KeyOperation::EcdsaSign(Sha256) => Opcode::EcdsaSignSha256,
            KeyOperation::EcdsaSign(Sha384) => Opcode::EcdsaSignSha384,
            KeyOperation::EcdsaSign(Sha512) => Opcode::EcdsaSignSha512,
            KeyOperation::Ed25519Sign => Opcode::Ed25519Sign,
            KeyOperation::RsaPssSign(Sha256) => Opcode::RsaPssSignSha256,
            KeyOperation::RsaPssSign(Sha384) => Opcode::RsaPssSignSha384,
            KeyOperation::RsaPssSign(Sha512) => Opcode::RsaPssSignSha512,
            KeyOperation::RsaPssSign(Md5Sha1 | Sha1 | Sha224) => return None,
        })
    }
}

/// Why an operation was refused or failed; maps to the wire's error byte.
#[derive(Debug, thiserror::Error)]
pub enum OperationError {
    /// The input's length does not fit the operation (digest length, RSA block size).
    #[error("input of {got} bytes, expected {expected}")]
    InputLength {
        /// Required length.
        expected: usize,
        /// Length received.
        got: usize,
    },
    /// This key cannot perform this operation (e.g. ECDSA with an RSA key).
    #[error("{op:?} is not possible with a {alg} key")]
    WrongKeyType {
        /// The requested operation.
        op: KeyOperation,
        /// The key's algorithm.
        alg: KeyAlgorithm,
    },
    /// The cryptographic library failed.
    #[error("cryptographic operation failed: {0}")]
    Crypto(#[from] openssl::error::ErrorStack),
    /// The PKCS#11 token refused or failed the operation.
    #[error("token operation failed: {0}")]
    Token(String),
}

impl OperationError {
    /// The error byte sent to the edge.
    pub fn code(&self) -> ErrorCode {
        match self {
            OperationError::InputLength { .. } => ErrorCode::FormatError,
            OperationError::WrongKeyType { .. } => ErrorCode::BadOpcode,
            OperationError::Crypto(_) | OperationError::Token(_) => ErrorCode::CryptoFailure,
        }
    }
}

/// ECDSA curves we accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Curve {
    /// NIST P-256.
    P256,
    /// NIST P-384.
    P384,
    /// NIST P-521.
    P521,
}

/// A key's algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KeyAlgorithm {
    /// RSA with a modulus of this many bits (2048–4096).
    Rsa {
        /// Modulus size in bits.
        bits: u32,
    },
    /// ECDSA on a NIST curve.
    Ecdsa(Curve),
    /// Ed25519.
    Ed25519,
}

impl fmt::Display for KeyAlgorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyAlgorithm::Rsa { bits } => write!(f, "RSA-{bits}"),
            KeyAlgorithm::Ecdsa(c) => write!(f, "ECDSA {c:?}"),
            KeyAlgorithm::Ed25519 => f.write_str("Ed25519"),
        }
    }
}

/// Something that holds a private key and performs [`KeyOperation`]s with it. The key server
/// only sees this trait, so that a PKCS#11 token object can stand in for an in-memory key.
pub trait KeyHandle: Send + Sync + fmt::Debug {
    /// Subject key identifier (RFC 5280 method 1).
    fn ski(&self) -> [u8; 20];
    /// SHA-256 of the upper-case hex RSA modulus; `None` for non-RSA keys.
    fn certificate_digest(&self) -> Option<[u8; 32]>;
    /// Host names of the certificates that carry this key (lower case).
    fn hostnames(&self) -> &[String];
    /// The key's algorithm.
    fn algorithm(&self) -> KeyAlgorithm;
    /// Performs `op` on `input` (a digest, a message or an RSA block).
    fn perform(&self, op: KeyOperation, input: &[u8])
        -> Result<Zeroizing<Vec<u8>>, OperationError>;
}

/// A private key held in process memory by OpenSSL.
pub struct SoftwareKey {
    pkey: PKey<Private>,
    algorithm: KeyAlgorithm,
    ski: [u8; 20],
    digest: Option<[u8; 32]>,
    hostnames: Vec<String>,
}

impl fmt::Debug for SoftwareKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SoftwareKey")
            .field("algorithm", &self.algorithm)
            .field("ski", &hex::encode(self.ski))
            .field("hostnames", &self.hostnames)
            .finish_non_exhaustive()
    }
}

/// Errors from loading keys.
#[derive(Debug, thiserror::Error)]
pub enum KeyStoreError {
    /// A file or directory could not be read.
    #[error("reading {path}: {error}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The cause.
        error: std::io::Error,
    },
    /// A file holds neither a usable private key nor a certificate.
    #[error("{path}: {reason}")]
    BadFile {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A key type or size we do not serve.
    #[error("unsupported key: {0}")]
    Unsupported(String),
    /// OpenSSL refused the key.
    #[error("invalid key: {0}")]
    Openssl(#[from] openssl::error::ErrorStack),
    /// Two files hold the same key.
    #[error("duplicate key with SKI {0}")]
    Duplicate(String),
    /// A PKCS#11 token could not be opened or read.
    #[error("PKCS#11: {0}")]
    Token(String),
}

/// SHA-256 of the upper-case hexadecimal text of an RSA modulus (the protocol's certificate
/// digest).
pub fn rsa_modulus_digest(modulus_be: &[u8]) -> [u8; 32] {
    let hex = hex::encode_upper(x509::strip_leading_zeros(modulus_be));
    openssl::sha::sha256(hex.as_bytes())
}

impl SoftwareKey {
    /// Wraps an OpenSSL key after checking its type: RSA 2048–4096 bits, ECDSA P-256/P-384/P-521
    /// or Ed25519.
    pub fn from_pkey(pkey: PKey<Private>) -> Result<SoftwareKey, KeyStoreError> {
        let (algorithm, digest) = match pkey.id() {
            Id::RSA => {
                let rsa = pkey.rsa()?;
                let bits = rsa.n().num_bits().unsigned_abs();
                if !(2048..=4096).contains(&bits) {
                    return Err(KeyStoreError::Unsupported(format!("RSA-{bits}")));
                }
                (
                    KeyAlgorithm::Rsa { bits },
                    Some(rsa_modulus_digest(&rsa.n().to_vec())),
                )
            }
            Id::EC => {
                let ec = pkey.ec_key()?;
                let curve = match ec.group().curve_name() {
                    Some(Nid::X9_62_PRIME256V1) => Curve::P256,
                    Some(Nid::SECP384R1) => Curve::P384,
                    Some(Nid::SECP521R1) => Curve::P521,
                    other => return Err(KeyStoreError::Unsupported(format!("EC curve {other:?}"))),
                };
                (KeyAlgorithm::Ecdsa(curve), None)
            }
            Id::ED25519 => (KeyAlgorithm::Ed25519, None),
            other => return Err(KeyStoreError::Unsupported(format!("{other:?}"))),
        };
        let spki = pkey.public_key_to_der()?;
        let ski =
            x509::ski_from_spki(&spki).map_err(|e| KeyStoreError::Unsupported(e.to_string()))?;
        Ok(SoftwareKey {
            pkey,
            algorithm,
            ski,
            digest,
            hostnames: Vec::new(),
        })
    }

    /// A DER key in any of PKCS#8, PKCS#1 (RSA) or SEC1 (EC).
    pub fn from_der(der: &[u8]) -> Result<SoftwareKey, KeyStoreError> {
        let pkey = PKey::private_key_from_pkcs8(der)
            .or_else(|_| Rsa::private_key_from_der(der).and_then(PKey::from_rsa))
            .or_else(|_| EcKey::private_key_from_der(der).and_then(PKey::from_ec_key))?;
        SoftwareKey::from_pkey(pkey)
    }

    /// The first private key in PEM text (`PRIVATE KEY`, `RSA PRIVATE KEY` or `EC PRIVATE KEY`).
    pub fn from_pem(pem: &[u8]) -> Result<SoftwareKey, KeyStoreError> {
        for section in <(SectionKind, Vec<u8>)>::pem_slice_iter(pem) {
            let (kind, der) =
                section.map_err(|e| KeyStoreError::Unsupported(format!("PEM: {e}")))?;
            let der = Zeroizing::new(der);
            if let Some(key) = key_from_section(kind, &der)? {
                return Ok(key);
            }
        }
        Err(KeyStoreError::Unsupported("no private key in PEM".into()))
    }

    /// Adds host names (from a certificate for this key).
    pub fn add_hostnames(&mut self, names: impl IntoIterator<Item = String>) {
        self.hostnames
            .extend(names.into_iter().map(|n| n.to_ascii_lowercase()));
        self.hostnames.sort();
        self.hostnames.dedup();
    }

    fn check_len(input: &[u8], expected: usize) -> Result<(), OperationError> {
        if input.len() != expected {
            return Err(OperationError::InputLength {
                expected,
                got: input.len(),
            });
        }
        Ok(())
    }

    fn rsa_sign(
        &self,
        padding: Padding,
        hash: HashAlg,
        digest: &[u8],
    ) -> Result<Vec<u8>, OperationError> {
        Self::check_len(digest, hash.digest_len())?;
        let mut ctx = PkeyCtx::new(&self.pkey)?;
        ctx.sign_init()?;
        ctx.set_rsa_padding(padding)?;
        if let Some(md) = hash.md() {
            ctx.set_signature_md(md)?;
            if padding == Padding::PKCS1_PSS {
                ctx.set_rsa_mgf1_md(md)?;
                ctx.set_rsa_pss_saltlen(RsaPssSaltlen::DIGEST_LENGTH)?;
            }
        }
        let mut sig = Vec::new();
        ctx.sign_to_vec(digest, &mut sig)?;
        Ok(sig)
    }
}

fn key_from_section(kind: SectionKind, der: &[u8]) -> Result<Option<SoftwareKey>, KeyStoreError> {
    let pkey = match kind {
        SectionKind::PrivateKey => PKey::private_key_from_pkcs8(der)?,
        SectionKind::RsaPrivateKey => PKey::from_rsa(Rsa::private_key_from_der(der)?)?,
        SectionKind::EcPrivateKey => PKey::from_ec_key(EcKey::private_key_from_der(der)?)?,
        _ => return Ok(None),
    };
    SoftwareKey::from_pkey(pkey).map(Some)
}

impl KeyHandle for SoftwareKey {
    fn ski(&self) -> [u8; 20] {
        self.ski
    }

    fn certificate_digest(&self) -> Option<[u8; 32]> {
        self.digest
    }

    fn hostnames(&self) -> &[String] {
        &self.hostnames
    }

    fn algorithm(&self) -> KeyAlgorithm {
        self.algorithm
    }

    fn perform(
        &self,
        op: KeyOperation,
        input: &[u8],
    ) -> Result<Zeroizing<Vec<u8>>, OperationError> {
        let out = match (op, self.algorithm) {
            (KeyOperation::RsaDecryptRaw, KeyAlgorithm::Rsa { .. }) => {
                // The block must be exactly the modulus size; OpenSSL refuses values ≥ n.
                Self::check_len(input, self.pkey.size())?;
                let mut ctx = PkeyCtx::new(&self.pkey)?;
                ctx.decrypt_init()?;
                ctx.set_rsa_padding(Padding::NONE)?;
                let mut out = Zeroizing::new(Vec::new());
                ctx.decrypt_to_vec(input, &mut out)?;
                return Ok(out);
            }
            (KeyOperation::RsaPkcs1Sign(h), KeyAlgorithm::Rsa { .. }) => {
                self.rsa_sign(Padding::PKCS1, h, input)?
            }
            (KeyOperation::RsaPssSign(h), KeyAlgorithm::Rsa { .. })
                if matches!(h, HashAlg::Sha256 | HashAlg::Sha384 | HashAlg::Sha512) =>
            {
                self.rsa_sign(Padding::PKCS1_PSS, h, input)?
            }
            (KeyOperation::EcdsaSign(h), KeyAlgorithm::Ecdsa(_)) => {
                Self::check_len(input, h.digest_len())?;
                // No digest is set: OpenSSL's ECDSA signs the given bytes (truncated to the order
                // size) and would refuse MD5‖SHA-1 as a digest name. The length check is ours.
                let mut ctx = PkeyCtx::new(&self.pkey)?;
                ctx.sign_init()?;
                let mut sig = Vec::new();
                ctx.sign_to_vec(input, &mut sig)?;
                sig
            }
            (KeyOperation::Ed25519Sign, KeyAlgorithm::Ed25519) => {
                let mut signer = Signer::new_without_digest(&self.pkey)?;
                signer.sign_oneshot_to_vec(input)?
            }
            (op, alg) => return Err(OperationError::WrongKeyType { op, alg }),
        };
        Ok(Zeroizing::new(out))
    }
}

/// Keys indexed by SKI and by certificate digest.
#[derive(Debug, Default, Clone)]
pub struct KeyStore {
    keys: Vec<Arc<dyn KeyHandle>>,
    by_ski: HashMap<[u8; 20], usize>,
    by_digest: HashMap<[u8; 32], usize>,
}

/// File name endings the directory loader looks at; other files are ignored.
const KEY_DIR_EXTENSIONS: [&str; 5] = ["pem", "key", "der", "crt", "cer"];

impl KeyStore {
    /// An empty store.
    pub fn new() -> KeyStore {
        KeyStore::default()
    }

    /// Adds a key; a second key with the same SKI is an error.
    pub fn insert(&mut self, key: Arc<dyn KeyHandle>) -> Result<(), KeyStoreError> {
        let ski = key.ski();
        if self.by_ski.contains_key(&ski) {
            return Err(KeyStoreError::Duplicate(hex::encode(ski)));
        }
        let index = self.keys.len();
        self.by_ski.insert(ski, index);
        if let Some(d) = key.certificate_digest() {
            self.by_digest.insert(d, index);
        }
        self.keys.push(key);
        Ok(())
    }

    /// Loads every `.pem`, `.key`, `.der`, `.crt` and `.cer` file of `dir` (not recursive).
    /// Each PEM file may hold one private key and any number of certificates; a DER file holds a
    /// key (PKCS#8, PKCS#1 or SEC1) or one certificate. A file that holds neither is an error, so
    /// a broken key never goes unnoticed. Certificates whose public key matches a key add their
    /// names to that key; other certificates are ignored.
    pub fn load_dir(dir: &Path) -> Result<KeyStore, KeyStoreError> {
        KeyStore::load_dir_with(dir, Vec::new())
    }

    /// As [`KeyStore::load_dir`], plus keys held by PKCS#11 tokens; certificates in `dir` lend
    /// their names to token keys too.
    pub fn load_dir_with(
        dir: &Path,
        mut token_keys: Vec<crate::pkcs11::Pkcs11Key>,
    ) -> Result<KeyStore, KeyStoreError> {
        let io = |path: &Path| {
            let path = path.to_owned();
            move |error| KeyStoreError::Io { path, error }
        };
        let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(io(dir))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.is_file()
                    && p.extension().and_then(|e| e.to_str()).is_some_and(|e| {
                        KEY_DIR_EXTENSIONS.contains(&e.to_ascii_lowercase().as_str())
                    })
            })
            .collect();
        paths.sort();
        let mut keys: Vec<SoftwareKey> = Vec::new();
        let mut certs: Vec<Vec<u8>> = Vec::new();
        for path in &paths {
            let data = Zeroizing::new(std::fs::read(path).map_err(io(path))?);
            let bad = |reason: String| KeyStoreError::BadFile {
                path: path.clone(),
                reason,
            };
            let before = (keys.len(), certs.len());
            if data.windows(11).any(|w| w == b"-----BEGIN ") {
                for section in <(SectionKind, Vec<u8>)>::pem_slice_iter(&data) {
                    let (kind, der) = section.map_err(|e| bad(format!("PEM: {e}")))?;
                    let der = Zeroizing::new(der);
                    if kind == SectionKind::Certificate {
                        certs.push(der.to_vec());
                    } else if let Some(key) =
                        key_from_section(kind, &der).map_err(|e| bad(e.to_string()))?
                    {
                        keys.push(key);
                    }
                }
            } else if let Ok(key) = SoftwareKey::from_der(&data) {
                keys.push(key);
            } else if x509::ski_from_certificate(&data).is_ok() {
                certs.push(data.to_vec());
            }
            if (keys.len(), certs.len()) == before {
                return Err(bad("neither a private key nor a certificate".into()));
            }
        }
        for cert in &certs {
            let Ok(ski) = x509::ski_from_certificate(cert) else {
                continue;
            };
            if let Some(key) = keys.iter_mut().find(|k| k.ski == ski) {
                let names = x509::certificate_names(cert).unwrap_or_default();
                key.add_hostnames(names);
            }
            if let Some(key) = token_keys.iter_mut().find(|k| k.ski() == ski) {
                let names = x509::certificate_names(cert).unwrap_or_default();
                key.add_hostnames(names);
            }
        }
        let mut store = KeyStore::new();
        for key in keys {
            tracing::debug!(algorithm = %key.algorithm, ski = %hex::encode(key.ski), hostnames = ?key.hostnames, "loaded key");
            store.insert(Arc::new(key))?;
        }
        for key in token_keys {
            tracing::debug!(algorithm = %key.algorithm(), ski = %hex::encode(key.ski()), label = key.label(), hostnames = ?key.hostnames(), "loaded token key");
            store.insert(Arc::new(key))?;
        }
        Ok(store)
    }

    /// The key with this SKI.
    pub fn by_ski(&self, ski: &[u8; 20]) -> Option<&Arc<dyn KeyHandle>> {
        self.by_ski.get(ski).and_then(|&i| self.keys.get(i))
    }

    /// The RSA key with this certificate digest.
    pub fn by_digest(&self, digest: &[u8; 32]) -> Option<&Arc<dyn KeyHandle>> {
        self.by_digest.get(digest).and_then(|&i| self.keys.get(i))
    }

    /// Finds a key by SKI, else by digest (the spec's lookup order).
    pub fn find(
        &self,
        ski: Option<&[u8; 20]>,
        digest: Option<&[u8; 32]>,
    ) -> Option<&Arc<dyn KeyHandle>> {
        ski.and_then(|s| self.by_ski(s))
            .or_else(|| digest.and_then(|d| self.by_digest(d)))
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether the store holds no key.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// All keys.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<dyn KeyHandle>> {
        self.keys.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_opcode_maps_to_an_operation_and_back() {
        let mut key_ops = 0;
        for op in Opcode::ALL {
            match KeyOperation::from_opcode(op) {
                Ok(k) => {
                    assert_eq!(k.opcode(), Some(op));
                    key_ops += 1;
                }
                Err(ErrorCode::UnexpectedOpcode) => assert!(op.is_response()),
                Err(ErrorCode::BadOpcode) => assert!(matches!(
                    op,
                    Opcode::Seal | Opcode::Unseal | Opcode::Rpc | Opcode::Custom | Opcode::Ping
                )),
                Err(e) => panic!("{op:?}: {e}"),
            }
        }
        assert_eq!(key_ops, 1 + 6 + 6 + 1 + 3);
        assert_eq!(KeyOperation::RsaPssSign(HashAlg::Sha1).opcode(), None);
    }
}
