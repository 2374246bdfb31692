//! TLS 1.3 key schedule pieces the record layer needs (RFC 8446 §7.1–§7.3).

use aws_lc_rs::hkdf;
use zeroize::Zeroizing;

use crate::error::RecordError;
use crate::keys::TrafficKeys;
use crate::suite::{CipherSuite, HashAlg, TlsVersion};

const LABEL_PREFIX: &[u8] = b"tls13 ";

/// An output length for `aws-lc-rs`'s HKDF.
struct Len(usize);

impl hkdf::KeyType for Len {
    fn len(&self) -> usize {
        self.0
    }
}

/// HKDF-Expand-Label(secret, label, context, len) (RFC 8446 §7.1). `label` is given without
/// the `"tls13 "` prefix, which is added here.
pub fn hkdf_expand_label(
    hash: HashAlg,
    secret: &[u8],
    label: &[u8],
    context: &[u8],
    len: usize,
) -> Result<Zeroizing<Vec<u8>>, RecordError> {
    let out_len = u16::try_from(len).map_err(|_| RecordError::KeyDerivation)?;
    let label_len =
        u8::try_from(LABEL_PREFIX.len() + label.len()).map_err(|_| RecordError::KeyDerivation)?;
    let context_len = u8::try_from(context.len()).map_err(|_| RecordError::KeyDerivation)?;
    // struct { uint16 length; opaque label<7..255>; opaque context<0..255>; } HkdfLabel;
    let len_be = out_len.to_be_bytes();
    let info: [&[u8]; 6] = [
        &len_be,
        core::slice::from_ref(&label_len),
        LABEL_PREFIX,
        label,
        core::slice::from_ref(&context_len),
        context,
    ];
    let prk = hkdf::Prk::new_less_safe(hash.hkdf(), secret);
    let okm = prk
        .expand(&info, Len(len))
        .map_err(|_| RecordError::KeyDerivation)?;
    let mut out = Zeroizing::new(vec![0u8; len]);
    okm.fill(&mut out).map_err(|_| RecordError::KeyDerivation)?;
    Ok(out)
}

/// The record key and IV of a traffic secret: `[sender]_write_key` / `_iv` (RFC 8446 §7.3).
pub fn traffic_keys(
    suite: &CipherSuite,
    traffic_secret: &[u8],
) -> Result<TrafficKeys, RecordError> {
    if suite.version != TlsVersion::Tls13 {
        return Err(RecordError::UnsupportedCipherSuite(suite.id));
    }
    if traffic_secret.len() != suite.hash.output_len() {
        return Err(RecordError::BadSecretLength);
    }
    let key = hkdf_expand_label(
        suite.hash,
        traffic_secret,
        b"key",
        &[],
        suite.aead.key_len(),
    )?;
    let iv = hkdf_expand_label(
        suite.hash,
        traffic_secret,
        b"iv",
        &[],
        suite.aead.nonce_len(),
    )?;
    TrafficKeys::new(suite.aead, &key, &iv)
}

/// The next generation of an application traffic secret after a KeyUpdate (RFC 8446 §7.2).
pub fn next_traffic_secret(
    hash: HashAlg,
    secret: &[u8],
) -> Result<Zeroizing<Vec<u8>>, RecordError> {
    if secret.len() != hash.output_len() {
        return Err(RecordError::BadSecretLength);
    }
    hkdf_expand_label(hash, secret, b"traffic upd", &[], hash.output_len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_out_of_range_inputs() {
        let s = [0u8; 32];
        assert_eq!(
            hkdf_expand_label(HashAlg::Sha256, &s, &[b'a'; 250], &[], 16).err(),
            Some(RecordError::KeyDerivation)
        );
        assert_eq!(
            hkdf_expand_label(HashAlg::Sha256, &s, b"key", &[0; 256], 16).err(),
            Some(RecordError::KeyDerivation)
        );
        // HKDF output is limited to 255 hash blocks
        assert_eq!(
            hkdf_expand_label(HashAlg::Sha256, &s, b"key", &[], 255 * 32 + 1).err(),
            Some(RecordError::KeyDerivation)
        );
        assert!(hkdf_expand_label(HashAlg::Sha256, &s, b"key", &[], 255 * 32).is_ok());
        assert_eq!(
            traffic_keys(&CipherSuite::TLS13_AES_256_GCM_SHA384, &s).err(),
            Some(RecordError::BadSecretLength)
        );
        assert_eq!(
            traffic_keys(&CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256, &s).err(),
            Some(RecordError::UnsupportedCipherSuite(0xc02f))
        );
    }
}
