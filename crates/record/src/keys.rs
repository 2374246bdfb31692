//! Traffic keys: an AEAD key and its IV, zeroized on drop.

use core::fmt;

use zeroize::Zeroizing;

use crate::error::RecordError;
use crate::suite::Aead;

/// Domain separator for [`TrafficKeys::fingerprint`], so a fingerprint can never collide with
/// any other use of SHA-256 over key bytes.
const FINGERPRINT_DOMAIN: &[u8] = b"mbx-record traffic-key fingerprint v1\0";

/// Key and IV for one direction of one connection (or hop).
///
/// The IV is 12 bytes for TLS 1.3 and for TLS 1.2 ChaCha20-Poly1305 (RFC 7905), or 4 bytes
/// for TLS 1.2 AES-GCM (the implicit salt of RFC 5288).
#[derive(Clone)]
pub struct TrafficKeys {
    aead: Aead,
    key: Zeroizing<Vec<u8>>,
    iv: Zeroizing<Vec<u8>>,
}

impl TrafficKeys {
    pub fn new(aead: Aead, key: &[u8], iv: &[u8]) -> Result<Self, RecordError> {
        if key.len() != aead.key_len() {
            return Err(RecordError::BadKeyLength);
        }
        let iv_ok = match aead {
            Aead::Aes128Gcm | Aead::Aes256Gcm => iv.len() == 12 || iv.len() == 4,
            Aead::ChaCha20Poly1305 => iv.len() == 12,
        };
        if !iv_ok {
            return Err(RecordError::BadIvLength);
        }
        Ok(TrafficKeys {
            aead,
            key: Zeroizing::new(key.to_vec()),
            iv: Zeroizing::new(iv.to_vec()),
        })
    }

    pub fn aead(&self) -> Aead {
        self.aead
    }

    pub fn key(&self) -> &[u8] {
        &self.key
    }

    pub fn iv(&self) -> &[u8] {
        &self.iv
    }

    /// A non-secret identifier of the key, for logs and for showing which keys a hop uses:
    /// the first 8 bytes of SHA-256(domain ‖ aead id ‖ SHA-256(key)).
    ///
    /// The inner hash keeps the key itself out of any structure that might be logged or
    /// reused; the domain string separates it from every other hash of key material. 64 bits
    /// identify keys among a handful of hops; it is not meant to resist chosen collisions.
    pub fn fingerprint(&self) -> [u8; 8] {
        let inner = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, &self.key);
        let mut ctx = aws_lc_rs::digest::Context::new(&aws_lc_rs::digest::SHA256);
        ctx.update(FINGERPRINT_DOMAIN);
        ctx.update(&[aead_code(self.aead)]);
        ctx.update(inner.as_ref());
        let outer = ctx.finish();
        let mut out = [0u8; 8];
        if let Some(src) = outer.as_ref().get(..8) {
            out.copy_from_slice(src);
        }
        out
    }
}

fn aead_code(aead: Aead) -> u8 {
    match aead {
        Aead::Aes128Gcm => 1,
        Aead::Aes256Gcm => 2,
        Aead::ChaCha20Poly1305 => 3,
    }
}

impl fmt::Debug for TrafficKeys {
    // Never print key material: the fingerprint is enough to tell keys apart.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let fp: String = self
            .fingerprint()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        f.debug_struct("TrafficKeys")
            .field("aead", &self.aead)
            .field("iv_len", &self.iv.len())
            .field("fingerprint", &fp)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_are_checked() {
        assert_eq!(
            TrafficKeys::new(Aead::Aes128Gcm, &[0; 32], &[0; 12]).err(),
            Some(RecordError::BadKeyLength)
        );
        assert_eq!(
            TrafficKeys::new(Aead::ChaCha20Poly1305, &[0; 32], &[0; 4]).err(),
            Some(RecordError::BadIvLength)
        );
        assert_eq!(
            TrafficKeys::new(Aead::Aes256Gcm, &[0; 32], &[0; 8]).err(),
            Some(RecordError::BadIvLength)
        );
        assert!(TrafficKeys::new(Aead::Aes256Gcm, &[0; 32], &[0; 4]).is_ok());
    }

    #[test]
    fn fingerprint_depends_on_key_and_aead_only() {
        let a = TrafficKeys::new(Aead::Aes256Gcm, &[1; 32], &[0; 12]).unwrap();
        let b = TrafficKeys::new(Aead::Aes256Gcm, &[1; 32], &[9; 12]).unwrap();
        let c = TrafficKeys::new(Aead::Aes256Gcm, &[2; 32], &[0; 12]).unwrap();
        let d = TrafficKeys::new(Aead::ChaCha20Poly1305, &[1; 32], &[0; 12]).unwrap();
        assert_eq!(a.fingerprint(), b.fingerprint());
        assert_ne!(a.fingerprint(), c.fingerprint());
        assert_ne!(a.fingerprint(), d.fingerprint());
        // not a prefix of the plain hash of the key
        let plain = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, &[1; 32]);
        assert_ne!(&a.fingerprint()[..], &plain.as_ref()[..8]);
        // Debug never shows key bytes
        let dbg = format!("{a:?}");
        assert!(!dbg.contains("0101"), "{dbg}");
    }
}
