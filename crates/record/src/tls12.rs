//! TLS 1.2 PRF and key block (RFC 5246 §5, §6.3).

use aws_lc_rs::hmac;
use zeroize::Zeroizing;

use crate::error::RecordError;
use crate::keys::TrafficKeys;
use crate::suite::{CipherSuite, HashAlg, TlsVersion};

/// PRF(secret, label, seed) = P_hash(secret, label ‖ seed), truncated to `len` (RFC 5246 §5).
pub fn prf(
    hash: HashAlg,
    secret: &[u8],
    label: &[u8],
    seed: &[u8],
    len: usize,
) -> Zeroizing<Vec<u8>> {
    let key = hmac::Key::new(hash.hmac(), secret);
    let mut out = Zeroizing::new(Vec::with_capacity(len + hash.output_len()));
    // A(1) = HMAC(secret, label ‖ seed); A(i) = HMAC(secret, A(i-1)).
    let mut a = {
        let mut ctx = hmac::Context::with_key(&key);
        ctx.update(label);
        ctx.update(seed);
        Zeroizing::new(ctx.sign().as_ref().to_vec())
    };
    while out.len() < len {
        let mut ctx = hmac::Context::with_key(&key);
        ctx.update(&a);
        ctx.update(label);
        ctx.update(seed);
        out.extend_from_slice(ctx.sign().as_ref());
        a = Zeroizing::new(hmac::sign(&key, &a).as_ref().to_vec());
    }
    out.truncate(len);
    out
}

/// The two directions' keys of a TLS 1.2 connection.
#[derive(Debug, Clone)]
pub struct KeyBlock {
    pub client_write: TrafficKeys,
    pub server_write: TrafficKeys,
}

/// Length of a TLS 1.2 master secret (RFC 5246 §8.1).
pub const MASTER_SECRET_LEN: usize = 48;

/// Derive the key block of an AEAD suite (RFC 5246 §6.3): no MAC keys, then
/// client_write_key, server_write_key, client_write_IV, server_write_IV, with the IV lengths
/// of RFC 5288 (4-byte salt) or RFC 7905 (12-byte IV).
pub fn key_block(
    suite: &CipherSuite,
    master_secret: &[u8],
    client_random: &[u8; 32],
    server_random: &[u8; 32],
) -> Result<KeyBlock, RecordError> {
    if suite.version != TlsVersion::Tls12 {
        return Err(RecordError::UnsupportedCipherSuite(suite.id));
    }
    if master_secret.len() != MASTER_SECRET_LEN {
        return Err(RecordError::BadSecretLength);
    }
    let key_len = suite.aead.key_len();
    let iv_len = suite.aead.tls12_fixed_iv_len();
    let mut seed = [0u8; 64];
    seed[..32].copy_from_slice(server_random);
    seed[32..].copy_from_slice(client_random);
    let block = prf(
        suite.hash,
        master_secret,
        b"key expansion",
        &seed,
        2 * key_len + 2 * iv_len,
    );
    let part = |from: usize, len: usize| -> Result<&[u8], RecordError> {
        block
            .get(from..from + len)
            .ok_or(RecordError::KeyDerivation)
    };
    let client_key = part(0, key_len)?;
    let server_key = part(key_len, key_len)?;
    let client_iv = part(2 * key_len, iv_len)?;
    let server_iv = part(2 * key_len + iv_len, iv_len)?;
    Ok(KeyBlock {
        client_write: TrafficKeys::new(suite.aead, client_key, client_iv)?,
        server_write: TrafficKeys::new(suite.aead, server_key, server_iv)?,
    })
}
