//! A rustls [`SigningKey`] whose private half lives on a key server.
//!
//! rustls calls [`Signer::sign`] synchronously in the middle of processing a ClientHello (TLS 1.3
//! CertificateVerify, TLS 1.2 ServerKeyExchange). The edge only ever runs that processing on its
//! bounded blocking pool (see `edge::conn`), so `sign` may wait: it hands the request to the async
//! runtime (where the pooled key-server connections live) and blocks this pool thread on a channel
//! until the answer comes or a guard timeout passes. It never blocks a reactor thread.

use std::sync::{mpsc, Arc};
use std::time::Duration;

use openssl::hash::{hash, MessageDigest};
use rustls::sign::{Signer, SigningKey};
use rustls::{SignatureAlgorithm, SignatureScheme};

use super::pool::KeyServerPool;
use crate::client::KeyId;
use crate::wire::Opcode;

/// The kind of public key a site certificate carries, which fixes the schemes we can offer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SiteKeyKind {
    /// RSA: PSS (preferred, the only RSA form in TLS 1.3) and PKCS#1 v1.5, SHA-256/384/512.
    Rsa,
    /// ECDSA on P-256 (with SHA-256).
    EcdsaP256,
    /// ECDSA on P-384 (with SHA-384).
    EcdsaP384,
    /// ECDSA on P-521 (with SHA-512).
    EcdsaP521,
    /// Ed25519 (the key server gets the whole message).
    Ed25519,
}

impl SiteKeyKind {
    /// Schemes in order of preference.
    pub fn schemes(self) -> &'static [SignatureScheme] {
        use SignatureScheme::*;
        match self {
            SiteKeyKind::Rsa => &[
                RSA_PSS_SHA256,
                RSA_PSS_SHA384,
                RSA_PSS_SHA512,
                RSA_PKCS1_SHA256,
                RSA_PKCS1_SHA384,
                RSA_PKCS1_SHA512,
            ],
            SiteKeyKind::EcdsaP256 => &[ECDSA_NISTP256_SHA256],
            SiteKeyKind::EcdsaP384 => &[ECDSA_NISTP384_SHA384],
            SiteKeyKind::EcdsaP521 => &[ECDSA_NISTP521_SHA512],
            SiteKeyKind::Ed25519 => &[ED25519],
        }
    }

    fn algorithm(self) -> SignatureAlgorithm {
        match self {
            SiteKeyKind::Rsa => SignatureAlgorithm::RSA,
            SiteKeyKind::EcdsaP256 | SiteKeyKind::EcdsaP384 | SiteKeyKind::EcdsaP521 => {
                SignatureAlgorithm::ECDSA
            }
            SiteKeyKind::Ed25519 => SignatureAlgorithm::ED25519,
        }
    }
}

/// The key-server opcode for a TLS signature scheme, and the digest the edge computes first
/// (`None`: the whole message is sent, Ed25519).
pub fn opcode_for(scheme: SignatureScheme) -> Option<(Opcode, Option<MessageDigest>)> {
    use SignatureScheme::*;
    Some(match scheme {
        RSA_PKCS1_SHA256 => (Opcode::RsaSignSha256, Some(MessageDigest::sha256())),
        RSA_PKCS1_SHA384 => (Opcode::RsaSignSha384, Some(MessageDigest::sha384())),
        RSA_PKCS1_SHA512 => (Opcode::RsaSignSha512, Some(MessageDigest::sha512())),
        RSA_PSS_SHA256 => (Opcode::RsaPssSignSha256, Some(MessageDigest::sha256())),
        RSA_PSS_SHA384 => (Opcode::RsaPssSignSha384, Some(MessageDigest::sha384())),
        RSA_PSS_SHA512 => (Opcode::RsaPssSignSha512, Some(MessageDigest::sha512())),
        ECDSA_NISTP256_SHA256 => (Opcode::EcdsaSignSha256, Some(MessageDigest::sha256())),
        ECDSA_NISTP384_SHA384 => (Opcode::EcdsaSignSha384, Some(MessageDigest::sha384())),
        ECDSA_NISTP521_SHA512 => (Opcode::EcdsaSignSha512, Some(MessageDigest::sha512())),
        ED25519 => (Opcode::Ed25519Sign, None),
        _ => return None,
    })
}

/// A site key held by a key server, named by SKI.
#[derive(Debug, Clone)]
pub struct RemoteSigningKey {
    site: Arc<str>,
    key: KeyId,
    kind: SiteKeyKind,
    pool: Arc<KeyServerPool>,
    runtime: tokio::runtime::Handle,
}

impl RemoteSigningKey {
    /// A key for site `site` (used in log lines), found on `pool` by `key`; requests are run on
    /// `runtime`.
    pub fn new(
        site: &str,
        key: KeyId,
        kind: SiteKeyKind,
        pool: Arc<KeyServerPool>,
        runtime: tokio::runtime::Handle,
    ) -> RemoteSigningKey {
        RemoteSigningKey {
            site: Arc::from(site),
            key,
            kind,
            pool,
            runtime,
        }
    }
}

impl SigningKey for RemoteSigningKey {
    fn choose_scheme(&self, offered: &[SignatureScheme]) -> Option<Box<dyn Signer>> {
        let scheme = self
            .kind
            .schemes()
            .iter()
            .find(|s| offered.contains(s))
            .copied()?;
        Some(Box::new(RemoteSigner {
            key: self.clone(),
            scheme,
        }))
    }

    fn algorithm(&self) -> SignatureAlgorithm {
        self.kind.algorithm()
    }
}

#[derive(Debug)]
struct RemoteSigner {
    key: RemoteSigningKey,
    scheme: SignatureScheme,
}

impl Signer for RemoteSigner {
    fn sign(&self, message: &[u8]) -> Result<Vec<u8>, rustls::Error> {
        let (opcode, md) = opcode_for(self.scheme)
            .ok_or_else(|| rustls::Error::General("unsupported signature scheme".into()))?;
        let input = match md {
            Some(md) => hash(md, message)
                .map_err(|e| rustls::Error::General(format!("hashing: {e}")))?
                .to_vec(),
            None => message.to_vec(),
        };
        let key = self.key.clone();
        // Every key server of the group may be tried once, each bounded by the operation
        // timeout (connect, then request): this guard only catches a runtime that stopped.
        let guard = key
            .pool
            .operation_timeout()
            .saturating_mul(2)
            .saturating_mul(u32::try_from(key.pool.len().max(1)).unwrap_or(u32::MAX))
            .saturating_add(Duration::from_secs(1));
        let (tx, rx) = mpsc::channel();
        let k = key.clone();
        key.runtime.spawn(async move {
            let _ = tx.send(k.pool.sign(&k.key, opcode, &input).await);
        });
        let result = match rx.recv_timeout(guard) {
            Ok(r) => r.map_err(|e| e.to_string()),
            Err(_) => Err(format!("no answer within the guard of {guard:?}")),
        };
        result.map_err(|e| {
            tracing::error!(site = %key.site, scheme = ?self.scheme, error = %e,
                "remote signature failed; aborting the handshake");
            rustls::Error::General(format!("remote signature failed: {e}"))
        })
    }

    fn scheme(&self) -> SignatureScheme {
        self.scheme
    }
}
