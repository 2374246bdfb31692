//! Private keys that stay inside a PKCS#11 token (an HSM, or SoftHSM2 in tests).
//!
//! [`Pkcs11Token::open`] loads the token's module (dlopen through the `cryptoki` crate, so there
//! is no build-time C dependency), finds the token by label, logs in with the PIN read from a
//! file, and lists its private keys. Each key's public half is read off the token (from the
//! private-key object for RSA, from the matching public-key object — same `CKA_ID` — for EC and
//! Ed25519) to compute the SKI the key is found by, exactly like a file key.
//!
//! Operations map to token mechanisms: PKCS#1 v1.5 signatures are `CKM_RSA_PKCS` over a
//! DigestInfo we build (the protocol sends a digest, and MD5‖SHA-1 has no DigestInfo); RSA-PSS is
//! `CKM_RSA_PKCS_PSS` with MGF1 of the same hash and salt = digest length; raw decryption is
//! `CKM_RSA_X_509`; ECDSA is `CKM_ECDSA` over the digest, its raw r‖s re-encoded as DER; Ed25519
//! is `CKM_EDDSA`. Sessions are pooled: each operation borrows an idle session (opening one if
//! none is idle), so concurrent requests run on separate sessions.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use cryptoki::context::{CInitializeArgs, Pkcs11};
use cryptoki::error::RvError;
use cryptoki::mechanism::eddsa::{EddsaParams, EddsaSignatureScheme};
use cryptoki::mechanism::rsa::{PkcsMgfType, PkcsPssParams};
use cryptoki::mechanism::{Mechanism, MechanismType};
use cryptoki::object::{Attribute, AttributeType, KeyType, ObjectClass, ObjectHandle};
use cryptoki::session::{Session, UserType};
use cryptoki::slot::Slot;
use cryptoki::types::AuthPin;
use openssl::bn::BigNum;
use openssl::ec::{EcGroup, EcKey, EcPoint};
use openssl::ecdsa::EcdsaSig;
use openssl::nid::Nid;
use openssl::pkey::{Id, PKey};
use openssl::rsa::Rsa;
use serde::Deserialize;
use zeroize::Zeroizing;

use crate::keys::{
    rsa_modulus_digest, Curve, HashAlg, KeyAlgorithm, KeyHandle, KeyOperation, KeyStoreError,
    OperationError,
};
use crate::x509;

/// One `[[pkcs11]]` table of the key server's configuration.
///
/// ```toml
/// [[pkcs11]]
/// module = "/usr/lib/softhsm/libsofthsm2.so"
/// token_label = "keyless"
/// pin_file = "/etc/mbx/keyless/token.pin"
/// labels = ["www"]        # optional: only these CKA_LABELs
/// ids = ["01"]            # optional: only these CKA_IDs (hex)
/// ```
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Pkcs11Config {
    /// The PKCS#11 module (shared library).
    pub module: PathBuf,
    /// The token's label (`CKA_LABEL` of the token, trailing blanks ignored).
    pub token_label: String,
    /// A file holding the user PIN (trailing newline ignored). The PIN is never logged.
    pub pin_file: PathBuf,
    /// Only private keys with one of these labels (empty: no label filter).
    #[serde(default)]
    pub labels: Vec<String>,
    /// Only private keys with one of these IDs, hex (empty: no ID filter).
    #[serde(default)]
    pub ids: Vec<String>,
    /// Idle sessions kept open for reuse.
    #[serde(default = "default_idle_sessions")]
    pub idle_sessions: usize,
}

fn default_idle_sessions() -> usize {
    16
}

fn token_err(what: &str) -> impl Fn(cryptoki::error::Error) -> KeyStoreError + '_ {
    move |e| KeyStoreError::Token(format!("{what}: {e}"))
}

/// One context per module for the whole process: `C_Initialize` may run only once per module,
/// and a reload must reuse it while the old keys are still in use.
fn context(module: &Path) -> Result<Pkcs11, KeyStoreError> {
    static CONTEXTS: OnceLock<Mutex<HashMap<PathBuf, Pkcs11>>> = OnceLock::new();
    let mut map = CONTEXTS
        .get_or_init(|| Mutex::new(HashMap::new()))
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(ctx) = map.get(module) {
        return Ok(ctx.clone());
    }
    let ctx = Pkcs11::new(module)
        .map_err(|e| KeyStoreError::Token(format!("loading module {}: {e}", module.display())))?;
    match ctx.initialize(CInitializeArgs::OsThreads) {
        Ok(()) | Err(cryptoki::error::Error::Pkcs11(RvError::CryptokiAlreadyInitialized, _)) => {}
        Err(e) => return Err(token_err("C_Initialize")(e)),
    }
    map.insert(module.to_owned(), ctx.clone());
    Ok(ctx)
}

/// A logged-in token with a pool of sessions.
pub struct Pkcs11Token {
    ctx: Pkcs11,
    slot: Slot,
    label: String,
    pin: AuthPin,
    idle: Mutex<Vec<Session>>,
    max_idle: usize,
}

impl fmt::Debug for Pkcs11Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // No PIN here, ever.
        f.debug_struct("Pkcs11Token")
            .field("label", &self.label)
            .field("slot", &self.slot)
            .finish_non_exhaustive()
    }
}

impl Pkcs11Token {
    /// Opens the token named in `config`, logs in and returns its private keys.
    pub fn open(config: &Pkcs11Config) -> Result<Vec<Pkcs11Key>, KeyStoreError> {
        let pin_text =
            Zeroizing::new(std::fs::read_to_string(&config.pin_file).map_err(|error| {
                KeyStoreError::Io {
                    path: config.pin_file.clone(),
                    error,
                }
            })?);
        let pin = AuthPin::new(pin_text.trim_end_matches(['\r', '\n']).to_owned());
        let ctx = context(&config.module)?;
        let slot = ctx
            .get_slots_with_token()
            .map_err(token_err("listing slots"))?
            .into_iter()
            .find(|&s| {
                ctx.get_token_info(s)
                    .is_ok_and(|t| t.label().trim_end() == config.token_label)
            })
            .ok_or_else(|| {
                KeyStoreError::Token(format!("no token labelled {:?}", config.token_label))
            })?;
        let token = Arc::new(Pkcs11Token {
            ctx,
            slot,
            label: config.token_label.clone(),
            pin,
            idle: Mutex::new(Vec::new()),
            max_idle: config.idle_sessions.max(1),
        });
        let ids = config
            .ids
            .iter()
            .map(|h| {
                hex::decode(h.replace(':', ""))
                    .map_err(|e| KeyStoreError::Token(format!("CKA_ID {h:?}: {e}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let keys = token
            .with_session(|s| token.find_keys(s, &config.labels, &ids))
            .map_err(token_err("reading keys"))??;
        tracing::info!(token = %config.token_label, keys = keys.len(), "PKCS#11 token opened");
        Ok(keys)
    }

    /// A session, logged in: an idle one, or a new one.
    fn session(&self) -> Result<Session, cryptoki::error::Error> {
        if let Some(s) = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop() {
            return Ok(s);
        }
        let s = self.ctx.open_ro_session(self.slot)?;
        // Login state is per application and token: only the first session really logs in.
        match s.login(UserType::User, Some(&self.pin)) {
            Ok(()) | Err(cryptoki::error::Error::Pkcs11(RvError::UserAlreadyLoggedIn, _)) => Ok(s),
            Err(e) => Err(e),
        }
    }

    /// Runs `f` on a pooled session; the session goes back to the pool unless the token said
    /// it is no longer usable.
    fn with_session<R>(
        &self,
        f: impl FnOnce(&Session) -> Result<R, cryptoki::error::Error>,
    ) -> Result<R, cryptoki::error::Error> {
        let s = self.session()?;
        let r = f(&s);
        let broken = matches!(
            &r,
            Err(cryptoki::error::Error::Pkcs11(
                RvError::SessionHandleInvalid
                    | RvError::SessionClosed
                    | RvError::DeviceRemoved
                    | RvError::TokenNotPresent
                    | RvError::UserNotLoggedIn,
                _
            ))
        );
        if !broken {
            let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
            if idle.len() < self.max_idle {
                idle.push(s);
            }
        }
        r
    }

    fn find_keys(
        self: &Arc<Self>,
        s: &Session,
        labels: &[String],
        ids: &[Vec<u8>],
    ) -> Result<Result<Vec<Pkcs11Key>, KeyStoreError>, cryptoki::error::Error> {
        let mut keys = Vec::new();
        for handle in s.find_objects(&[Attribute::Class(ObjectClass::PRIVATE_KEY)])? {
            let attrs = s.get_attributes(
                handle,
                &[
                    AttributeType::Id,
                    AttributeType::Label,
                    AttributeType::KeyType,
                ],
            )?;
            let (mut id, mut label, mut key_type) = (Vec::new(), String::new(), None);
            for a in attrs {
                match a {
                    Attribute::Id(v) => id = v,
                    Attribute::Label(v) => label = String::from_utf8_lossy(&v).into_owned(),
                    Attribute::KeyType(t) => key_type = Some(t),
                    _ => {}
                }
            }
            if (!labels.is_empty() && !labels.contains(&label))
                || (!ids.is_empty() && !ids.contains(&id))
            {
                continue;
            }
            let public = match key_type {
                Some(KeyType::RSA) => rsa_public(s, handle)?,
                Some(KeyType::EC) | Some(KeyType::EC_EDWARDS) => {
                    let Some(public) = s
                        .find_objects(&[
                            Attribute::Class(ObjectClass::PUBLIC_KEY),
                            Attribute::Id(id.clone()),
                        ])?
                        .into_iter()
                        .next()
                    else {
                        return Ok(Err(KeyStoreError::Token(format!(
                            "key {label:?} (id {}): no public key with the same CKA_ID",
                            hex::encode(&id)
                        ))));
                    };
                    ec_public(s, public, key_type == Some(KeyType::EC_EDWARDS))?
                }
                other => {
                    tracing::warn!(label, key_type = ?other, "skipping token key of unsupported type");
                    continue;
                }
            };
            let public = match public {
                Ok(p) => p,
                Err(e) => return Ok(Err(KeyStoreError::Token(format!("key {label:?}: {e}")))),
            };
            let key = match Pkcs11Key::new(Arc::clone(self), handle, label, public) {
                Ok(k) => k,
                Err(e) => return Ok(Err(e)),
            };
            keys.push(key);
        }
        Ok(Ok(keys))
    }
}

/// The public half of a token key, as a DER SubjectPublicKeyInfo and its algorithm.
struct PublicKey {
    spki: Vec<u8>,
    algorithm: KeyAlgorithm,
    modulus: Option<Vec<u8>>,
}

fn rsa_public(
    s: &Session,
    handle: ObjectHandle,
) -> Result<Result<PublicKey, String>, cryptoki::error::Error> {
    let (mut n, mut e) = (None, None);
    for a in s.get_attributes(
        handle,
        &[AttributeType::Modulus, AttributeType::PublicExponent],
    )? {
        match a {
            Attribute::Modulus(v) => n = Some(v),
            Attribute::PublicExponent(v) => e = Some(v),
            _ => {}
        }
    }
    let (Some(n), Some(e)) = (n, e) else {
        return Ok(Err("RSA key without modulus or exponent".into()));
    };
    Ok((|| {
        let rsa = Rsa::from_public_components(BigNum::from_slice(&n)?, BigNum::from_slice(&e)?)?;
        let bits = rsa.n().num_bits().unsigned_abs();
        let spki = PKey::from_rsa(rsa)?.public_key_to_der()?;
        Ok::<_, openssl::error::ErrorStack>((spki, bits))
    })()
    .map_err(|e| e.to_string())
    .and_then(|(spki, bits)| {
        if !(2048..=4096).contains(&bits) {
            return Err(format!("unsupported RSA-{bits}"));
        }
        Ok(PublicKey {
            spki,
            algorithm: KeyAlgorithm::Rsa { bits },
            modulus: Some(n),
        })
    }))
}

/// DER OIDs of the curves we serve, as `CKA_EC_PARAMS` holds them.
const P256_OID: &[u8] = &[0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07];
const P384_OID: &[u8] = &[0x06, 0x05, 0x2b, 0x81, 0x04, 0x00, 0x22];
const P521_OID: &[u8] = &[0x06, 0x05, 0x2b, 0x81, 0x04, 0x00, 0x23];
const ED25519_OID: &[u8] = &[0x06, 0x03, 0x2b, 0x65, 0x70];
/// Some tokens name Ed25519 by a PrintableString instead of the OID.
const ED25519_NAME: &[u8] = b"\x13\x0cedwards25519";

/// `CKA_EC_POINT` is a DER OCTET STRING around the point (some tokens omit the wrapper).
fn unwrap_octet_string(v: &[u8], point_len: usize) -> Option<&[u8]> {
    if v.len() == point_len && (point_len == 32 || v.first() == Some(&0x04)) {
        return Some(v);
    }
    let (&tag, rest) = v.split_first()?;
    if tag != 0x04 {
        return None;
    }
    let (&len0, rest) = rest.split_first()?;
    let body = match len0 {
        0x81 => rest.get(1..)?,
        0x82 => rest.get(2..)?,
        n if n < 0x80 => rest,
        _ => return None,
    };
    (body.len() == point_len).then_some(body)
}

fn ec_public(
    s: &Session,
    handle: ObjectHandle,
    edwards: bool,
) -> Result<Result<PublicKey, String>, cryptoki::error::Error> {
    let (mut params, mut point) = (Vec::new(), Vec::new());
    for a in s.get_attributes(handle, &[AttributeType::EcParams, AttributeType::EcPoint])? {
        match a {
            Attribute::EcParams(v) => params = v,
            Attribute::EcPoint(v) => point = v,
            _ => {}
        }
    }
    if edwards {
        if params != ED25519_OID && params != ED25519_NAME {
            return Ok(Err("unsupported Edwards curve (only Ed25519)".into()));
        }
        let Some(raw) = unwrap_octet_string(&point, 32) else {
            return Ok(Err("malformed Ed25519 CKA_EC_POINT".into()));
        };
        return Ok(PKey::public_key_from_raw_bytes(raw, Id::ED25519)
            .and_then(|p| p.public_key_to_der())
            .map(|spki| PublicKey {
                spki,
                algorithm: KeyAlgorithm::Ed25519,
                modulus: None,
            })
            .map_err(|e| e.to_string()));
    }
    let (curve, nid, field) = match params.as_slice() {
        p if p == P256_OID => (Curve::P256, Nid::X9_62_PRIME256V1, 32),
        p if p == P384_OID => (Curve::P384, Nid::SECP384R1, 48),
        p if p == P521_OID => (Curve::P521, Nid::SECP521R1, 66),
        _ => return Ok(Err("unsupported EC curve".into())),
    };
    let Some(raw) = unwrap_octet_string(&point, 1 + 2 * field) else {
        return Ok(Err("malformed CKA_EC_POINT".into()));
    };
    Ok((|| {
        let group = EcGroup::from_curve_name(nid)?;
        let mut bn = openssl::bn::BigNumContext::new()?;
        let point = EcPoint::from_bytes(&group, raw, &mut bn)?;
        PKey::from_ec_key(EcKey::from_public_key(&group, &point)?)?.public_key_to_der()
    })()
    .map(|spki| PublicKey {
        spki,
        algorithm: KeyAlgorithm::Ecdsa(curve),
        modulus: None,
    })
    .map_err(|e| e.to_string()))
}

/// The DER DigestInfo prefix PKCS#1 v1.5 puts before a digest (RFC 8017 §9.2, note 1); empty
/// for TLS 1.0/1.1's MD5‖SHA-1, which is signed bare.
fn digest_info_prefix(hash: HashAlg) -> &'static [u8] {
    match hash {
        HashAlg::Md5Sha1 => &[],
        HashAlg::Sha1 => &[
            0x30, 0x21, 0x30, 0x09, 0x06, 0x05, 0x2b, 0x0e, 0x03, 0x02, 0x1a, 0x05, 0x00, 0x04,
            0x14,
        ],
        HashAlg::Sha224 => &[
            0x30, 0x2d, 0x30, 0x0d, 0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02,
            0x04, 0x05, 0x00, 0x04, 0x1c,
        ],
        HashAlg::Sha256 => &[
            0x30, 0x31, 0x30, 0x0d, 0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02,
            0x01, 0x05, 0x00, 0x04, 0x20,
        ],
        HashAlg::Sha384 => &[
            0x30, 0x41, 0x30, 0x0d, 0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02,
            0x02, 0x05, 0x00, 0x04, 0x30,
        ],
        HashAlg::Sha512 => &[
            0x30, 0x51, 0x30, 0x0d, 0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02,
            0x03, 0x05, 0x00, 0x04, 0x40,
        ],
    }
}

/// The PSS parameters for a hash: MGF1 with the same hash, salt = digest length.
fn pss_params(hash: HashAlg) -> Option<PkcsPssParams> {
    let (hash_alg, mgf) = match hash {
        HashAlg::Sha256 => (MechanismType::SHA256, PkcsMgfType::MGF1_SHA256),
        HashAlg::Sha384 => (MechanismType::SHA384, PkcsMgfType::MGF1_SHA384),
        HashAlg::Sha512 => (MechanismType::SHA512, PkcsMgfType::MGF1_SHA512),
        _ => return None,
    };
    let s_len = u64::try_from(hash.digest_len()).ok()?.into();
    Some(PkcsPssParams {
        hash_alg,
        mgf,
        s_len,
    })
}

/// A private key on a PKCS#11 token.
pub struct Pkcs11Key {
    token: Arc<Pkcs11Token>,
    handle: ObjectHandle,
    label: String,
    algorithm: KeyAlgorithm,
    ski: [u8; 20],
    digest: Option<[u8; 32]>,
    /// RSA modulus size in bytes (the raw-decrypt block size).
    modulus_len: usize,
    hostnames: Vec<String>,
}

impl fmt::Debug for Pkcs11Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pkcs11Key")
            .field("token", &self.token.label)
            .field("label", &self.label)
            .field("algorithm", &self.algorithm)
            .field("ski", &hex::encode(self.ski))
            .field("hostnames", &self.hostnames)
            .finish_non_exhaustive()
    }
}

impl Pkcs11Key {
    fn new(
        token: Arc<Pkcs11Token>,
        handle: ObjectHandle,
        label: String,
        public: PublicKey,
    ) -> Result<Pkcs11Key, KeyStoreError> {
        let ski = x509::ski_from_spki(&public.spki)
            .map_err(|e| KeyStoreError::Unsupported(e.to_string()))?;
        let modulus_len = public
            .modulus
            .as_deref()
            .map_or(0, |n| x509::strip_leading_zeros(n).len());
        Ok(Pkcs11Key {
            token,
            handle,
            label,
            algorithm: public.algorithm,
            ski,
            digest: public.modulus.as_deref().map(rsa_modulus_digest),
            modulus_len,
            hostnames: Vec::new(),
        })
    }

    /// The key's `CKA_LABEL`.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// Adds host names (from a certificate for this key).
    pub fn add_hostnames(&mut self, names: impl IntoIterator<Item = String>) {
        self.hostnames
            .extend(names.into_iter().map(|n| n.to_ascii_lowercase()));
        self.hostnames.sort();
        self.hostnames.dedup();
    }

    fn run(
        &self,
        mechanism: &Mechanism,
        data: &[u8],
        decrypt: bool,
    ) -> Result<Vec<u8>, OperationError> {
        self.token
            .with_session(|s| {
                if decrypt {
                    s.decrypt(mechanism, self.handle, data)
                } else {
                    s.sign(mechanism, self.handle, data)
                }
            })
            .map_err(|e| OperationError::Token(e.to_string()))
    }
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

impl KeyHandle for Pkcs11Key {
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
                check_len(input, self.modulus_len)?;
                let plain = Zeroizing::new(self.run(&Mechanism::RsaX509, input, true)?);
                // Tokens may drop leading zero bytes; the edge expects the full block.
                let mut out = Zeroizing::new(vec![0u8; self.modulus_len]);
                let start = self.modulus_len.checked_sub(plain.len()).ok_or(
                    OperationError::InputLength {
                        expected: self.modulus_len,
                        got: plain.len(),
                    },
                )?;
                if let Some(dst) = out.get_mut(start..) {
                    dst.copy_from_slice(&plain);
                }
                return Ok(out);
            }
            (KeyOperation::RsaPkcs1Sign(h), KeyAlgorithm::Rsa { .. }) => {
                check_len(input, h.digest_len())?;
                let mut data = digest_info_prefix(h).to_vec();
                data.extend_from_slice(input);
                self.run(&Mechanism::RsaPkcs, &data, false)?
            }
            (KeyOperation::RsaPssSign(h), KeyAlgorithm::Rsa { .. }) if pss_params(h).is_some() => {
                check_len(input, h.digest_len())?;
                let params = pss_params(h).ok_or(OperationError::WrongKeyType {
                    op,
                    alg: self.algorithm,
                })?;
                self.run(&Mechanism::RsaPkcsPss(params), input, false)?
            }
            (KeyOperation::EcdsaSign(h), KeyAlgorithm::Ecdsa(_)) => {
                check_len(input, h.digest_len())?;
                let raw = self.run(&Mechanism::Ecdsa, input, false)?;
                // CKM_ECDSA returns r‖s, each as long as the field; TLS wants DER.
                let half = raw.len() / 2;
                let (r, s) = raw.split_at(half);
                if r.is_empty() || r.len() != s.len() {
                    return Err(OperationError::Token(format!(
                        "ECDSA signature of {} bytes",
                        raw.len()
                    )));
                }
                EcdsaSig::from_private_components(BigNum::from_slice(r)?, BigNum::from_slice(s)?)?
                    .to_der()?
            }
            (KeyOperation::Ed25519Sign, KeyAlgorithm::Ed25519) => self.run(
                &Mechanism::Eddsa(EddsaParams::new(EddsaSignatureScheme::Pure)),
                input,
                false,
            )?,
            (op, alg) => return Err(OperationError::WrongKeyType { op, alg }),
        };
        Ok(Zeroizing::new(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_info_prefixes_end_with_the_digest_length() {
        for h in [
            HashAlg::Sha1,
            HashAlg::Sha224,
            HashAlg::Sha256,
            HashAlg::Sha384,
            HashAlg::Sha512,
        ] {
            let p = digest_info_prefix(h);
            assert_eq!(usize::from(p[p.len() - 1]), h.digest_len());
            // The outer SEQUENCE covers the rest of the prefix plus the digest.
            assert_eq!(usize::from(p[1]), p.len() - 2 + h.digest_len());
        }
        assert!(digest_info_prefix(HashAlg::Md5Sha1).is_empty());
    }

    #[test]
    fn ec_point_wrapper_is_removed_only_when_it_fits() {
        let point = [4u8; 65];
        let mut wrapped = vec![0x04, 65];
        wrapped.extend_from_slice(&point);
        assert_eq!(unwrap_octet_string(&wrapped, 65), Some(&point[..]));
        assert_eq!(unwrap_octet_string(&point, 65), Some(&point[..]));
        assert_eq!(unwrap_octet_string(&wrapped[..60], 65), None);
        let mut long = vec![0x04, 0x81, 133];
        long.extend_from_slice(&[4u8; 133]);
        assert_eq!(unwrap_octet_string(&long, 133).map(<[u8]>::len), Some(133));
    }
}
