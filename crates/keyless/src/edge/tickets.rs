//! Session tickets sealed with a key that belongs to one origin.
//!
//! Edges that serve the same origin share its ticket-key file, so a client resumes on any of them;
//! edges of different origins have different keys, so a ticket from one origin's edge is useless
//! at another's (the paper's recommended option). Ticket = key name (16) ‖ nonce (12) ‖
//! ChaCha20-Poly1305(state, aad = key name). The AEAD key and the key name are derived from the
//! file's 32 secret bytes with HKDF-SHA256 under separate labels.

use std::path::Path;

use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey, CHACHA20_POLY1305, NONCE_LEN};
use aws_lc_rs::hkdf;
use aws_lc_rs::rand::{SecureRandom, SystemRandom};
use rustls::server::ProducesTickets;
use zeroize::Zeroizing;

const NAME_LEN: usize = 16;
/// Secret bytes a ticket-key file holds (as 64 hex digits).
pub const TICKET_SECRET_LEN: usize = 32;

/// A ticket key that cannot be loaded.
#[derive(Debug, thiserror::Error)]
pub enum TicketKeyError {
    /// The file cannot be read.
    #[error("ticket key {path}: {error}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        error: std::io::Error,
    },
    /// The file does not hold 64 hex digits.
    #[error(
        "ticket key {0}: expected 64 hex digits (32 random bytes, e.g. `openssl rand -hex 32`)"
    )]
    Format(String),
    /// No randomness or key setup failure.
    #[error("ticket key setup failed")]
    Crypto,
}

struct Len(usize);
impl hkdf::KeyType for Len {
    fn len(&self) -> usize {
        self.0
    }
}

/// An origin's ticket sealer.
pub struct TicketKey {
    name: [u8; NAME_LEN],
    key: LessSafeKey,
    lifetime: u32,
    rng: SystemRandom,
}

impl std::fmt::Debug for TicketKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TicketKey")
            .field("name", &hex::encode(self.name))
            .finish_non_exhaustive()
    }
}

impl TicketKey {
    /// A key from 32 secret bytes; tickets advertise `lifetime` seconds.
    pub fn from_secret(
        secret: &[u8; TICKET_SECRET_LEN],
        lifetime: u32,
    ) -> Result<TicketKey, TicketKeyError> {
        let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, b"mbx keyless ticket key v1").extract(secret);
        let mut name = [0u8; NAME_LEN];
        prk.expand(&[b"key name"], Len(NAME_LEN))
            .and_then(|okm| okm.fill(&mut name))
            .map_err(|_| TicketKeyError::Crypto)?;
        let mut key_bytes = Zeroizing::new([0u8; 32]);
        prk.expand(&[b"aead key"], Len(32))
            .and_then(|okm| okm.fill(&mut key_bytes[..]))
            .map_err(|_| TicketKeyError::Crypto)?;
        let key = UnboundKey::new(&CHACHA20_POLY1305, &key_bytes[..])
            .map_err(|_| TicketKeyError::Crypto)?;
        Ok(TicketKey {
            name,
            key: LessSafeKey::new(key),
            lifetime,
            rng: SystemRandom::new(),
        })
    }

    /// A fresh random key (tickets then resume on this process only).
    pub fn random(lifetime: u32) -> Result<TicketKey, TicketKeyError> {
        let mut secret = Zeroizing::new([0u8; TICKET_SECRET_LEN]);
        SystemRandom::new()
            .fill(&mut secret[..])
            .map_err(|_| TicketKeyError::Crypto)?;
        TicketKey::from_secret(&secret, lifetime)
    }

    /// Reads the secret from a file of 64 hex digits (surrounding whitespace ignored).
    pub fn load(path: &Path, lifetime: u32) -> Result<TicketKey, TicketKeyError> {
        let shown = path.display().to_string();
        let text = Zeroizing::new(std::fs::read_to_string(path).map_err(|error| {
            TicketKeyError::Read {
                path: shown.clone(),
                error,
            }
        })?);
        let secret = parse_secret(&text, &shown)?;
        TicketKey::from_secret(&secret, lifetime)
    }

    /// The public key name carried in every ticket (tells keys apart in logs and checks).
    pub fn name(&self) -> [u8; NAME_LEN] {
        self.name
    }
}

/// 64 hex digits → 32 bytes.
pub fn parse_secret(
    text: &str,
    shown: &str,
) -> Result<Zeroizing<[u8; TICKET_SECRET_LEN]>, TicketKeyError> {
    let bytes = Zeroizing::new(
        hex::decode(text.trim()).map_err(|_| TicketKeyError::Format(shown.to_owned()))?,
    );
    let mut out = Zeroizing::new([0u8; TICKET_SECRET_LEN]);
    if bytes.len() != TICKET_SECRET_LEN {
        return Err(TicketKeyError::Format(shown.to_owned()));
    }
    out.copy_from_slice(&bytes);
    Ok(out)
}

impl ProducesTickets for TicketKey {
    fn enabled(&self) -> bool {
        true
    }

    fn lifetime(&self) -> u32 {
        self.lifetime
    }

    fn encrypt(&self, plain: &[u8]) -> Option<Vec<u8>> {
        let mut nonce = [0u8; NONCE_LEN];
        self.rng.fill(&mut nonce).ok()?;
        let mut out = Vec::with_capacity(NAME_LEN + NONCE_LEN + plain.len() + 16);
        out.extend_from_slice(&self.name);
        out.extend_from_slice(&nonce);
        let mut sealed = plain.to_vec();
        self.key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(self.name),
                &mut sealed,
            )
            .ok()?;
        out.extend_from_slice(&sealed);
        Some(out)
    }

    fn decrypt(&self, cipher: &[u8]) -> Option<Vec<u8>> {
        let name = cipher.get(..NAME_LEN)?;
        // The name is public; a different origin's key simply does not match.
        if name != self.name {
            return None;
        }
        let nonce =
            Nonce::try_assume_unique_for_key(cipher.get(NAME_LEN..NAME_LEN + NONCE_LEN)?).ok()?;
        let mut sealed = cipher.get(NAME_LEN + NONCE_LEN..)?.to_vec();
        let plain = self
            .key
            .open_in_place(nonce, Aad::from(self.name), &mut sealed)
            .ok()?;
        let len = plain.len();
        sealed.truncate(len);
        Some(sealed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tickets_open_only_under_the_same_secret() {
        let a = TicketKey::from_secret(&[1; 32], 3600).unwrap();
        let a2 = TicketKey::from_secret(&[1; 32], 3600).unwrap();
        let b = TicketKey::from_secret(&[2; 32], 3600).unwrap();
        let t = a.encrypt(b"session state").unwrap();
        assert_eq!(a2.decrypt(&t).unwrap(), b"session state");
        assert!(b.decrypt(&t).is_none());
        // Same name but altered ciphertext fails authentication.
        let mut bad = t.clone();
        *bad.last_mut().unwrap() ^= 1;
        assert!(a.decrypt(&bad).is_none());
        assert!(a.decrypt(&t[..10]).is_none());
        assert!(parse_secret("zz", "f").is_err());
        assert!(parse_secret(&"ab".repeat(31), "f").is_err());
        assert_eq!(
            *parse_secret(&format!(" {}\n", "01".repeat(32)), "f").unwrap(),
            [1; 32]
        );
    }
}
