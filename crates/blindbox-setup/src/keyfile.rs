//! `k_RG`, the rule generator's tagging key, and its key file.
//!
//! RG tags every rule chunk `t` with `AES_{k_RG}(t ‖ 0⁸)`; the endpoints hold `k_RG` in their
//! configuration and garble the tag check into every circuit, so the middlebox obtains
//! `AES_k(t)` only for chunks RG signed. Whoever holds `k_RG` can sign chunks of its choice, so
//! the key file is written with mode 0600 and the key is wiped from memory on drop.
//!
//! File format (text, versioned):
//!
//! ```text
//! mbx-blindbox rg-key v1
//! <32 lowercase or uppercase hex digits>
//! ```
//!
//! Nothing else but one optional trailing newline.

use aes::cipher::{BlockEncrypt, KeyInit};
use aes::Aes128Enc;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use zeroize::{Zeroize, ZeroizeOnDrop, Zeroizing};

use crate::error::FileError;
use mbx_blindbox::tokenize::Token;

/// First line of a key file.
pub const KEY_FILE_HEADER: &str = "mbx-blindbox rg-key v1";

/// The rule generator's tagging key `k_RG` (AES-128).
#[derive(Clone, Zeroize, ZeroizeOnDrop)]
pub struct RgKey([u8; 16]);

impl RgKey {
    pub fn from_bytes(bytes: [u8; 16]) -> Self {
        Self(bytes)
    }

    /// A fresh random key (what `rules keygen` would write).
    pub fn generate<R: rand::RngCore + rand::CryptoRng>(rng: &mut R) -> Self {
        let mut k = [0u8; 16];
        rng.fill_bytes(&mut k);
        let key = Self(k);
        k.zeroize();
        key
    }

    pub(crate) fn bytes(&self) -> &[u8; 16] {
        &self.0
    }

    /// Public identifier of the key (first 8 bytes of a domain-separated SHA-256): lets a
    /// tagged-rules file say which key signed it, so a mismatch is reported before a setup.
    pub fn key_id(&self) -> [u8; 8] {
        let d = Sha256::new()
            .chain_update(b"mbx-blindbox rg key id v1")
            .chain_update(self.0)
            .finalize();
        let mut id = [0u8; 8];
        id.copy_from_slice(&d[..8]);
        id
    }

    /// The tag of chunk `t`: `AES_{k_RG}(t ‖ 0⁸)`, what the circuit recomputes and compares.
    pub fn tag(&self, t: &Token) -> [u8; 16] {
        self.tagger().tag(t)
    }

    /// A key schedule for tagging many chunks.
    pub(crate) fn tagger(&self) -> Tagger {
        Tagger(Aes128Enc::new((&self.0).into()))
    }

    /// Whether `tag` is the tag of `t`, in constant time.
    pub fn verify(&self, t: &Token, tag: &[u8; 16]) -> bool {
        bool::from(self.tag(t).ct_eq(tag))
    }

    /// The key file's text.
    pub fn to_file_string(&self) -> Zeroizing<String> {
        let mut s = Zeroizing::new(String::with_capacity(KEY_FILE_HEADER.len() + 34));
        s.push_str(KEY_FILE_HEADER);
        s.push('\n');
        s.push_str(&Zeroizing::new(hex::encode(self.0)));
        s.push('\n');
        s
    }

    /// Parses a key file. Never panics.
    pub fn parse(text: &[u8]) -> Result<Self, FileError> {
        let text = std::str::from_utf8(text).map_err(|_| FileError::NotUtf8)?;
        let text = text.strip_suffix('\n').unwrap_or(text);
        let mut lines = text.split('\n');
        if lines.next() != Some(KEY_FILE_HEADER) {
            return Err(FileError::BadHeader("k_RG key"));
        }
        let hex_line = lines.next().ok_or(FileError::Malformed {
            line: 2,
            what: "missing key",
        })?;
        if lines.next().is_some() {
            return Err(FileError::Malformed {
                line: 3,
                what: "trailing lines",
            });
        }
        let mut k = [0u8; 16];
        if hex_line.len() != 32 || hex::decode_to_slice(hex_line, &mut k).is_err() {
            k.zeroize();
            return Err(FileError::Malformed {
                line: 2,
                what: "key must be 32 hex digits",
            });
        }
        let key = Self(k);
        k.zeroize();
        Ok(key)
    }

    /// Reads a key file.
    pub fn load(path: &std::path::Path) -> Result<Self, FileError> {
        let bytes = Zeroizing::new(
            std::fs::read(path).map_err(|e| FileError::Io(format!("{}: {e}", path.display())))?,
        );
        Self::parse(&bytes)
    }

    /// Writes a new key file readable by its owner only; refuses to overwrite one.
    pub fn save(&self, path: &std::path::Path) -> Result<(), FileError> {
        use std::io::Write;
        let mut opts = std::fs::OpenOptions::new();
        opts.write(true).create_new(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            opts.mode(0o600);
        }
        let io = |e: std::io::Error| FileError::Io(format!("{}: {e}", path.display()));
        let mut f = opts.open(path).map_err(io)?;
        f.write_all(self.to_file_string().as_bytes()).map_err(io)?;
        f.sync_all().map_err(io)
    }
}

impl std::fmt::Debug for RgKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RgKey(id {})", hex::encode(self.key_id()))
    }
}

/// An expanded `k_RG` (wiped on drop by the `aes` crate's `zeroize` feature).
pub(crate) struct Tagger(Aes128Enc);

impl Tagger {
    pub(crate) fn tag(&self, t: &Token) -> [u8; 16] {
        let mut block = [0u8; 16];
        block[..8].copy_from_slice(t);
        let mut b = block.into();
        self.0.encrypt_block(&mut b);
        b.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_file_round_trip_and_rejects() {
        let k = RgKey::from_bytes([7; 16]);
        let text = k.to_file_string();
        let back = RgKey::parse(text.as_bytes()).unwrap();
        assert_eq!(back.bytes(), k.bytes());
        assert!(RgKey::parse(text.trim_end().as_bytes()).is_ok());
        assert_eq!(
            RgKey::parse(b"mbx-blindbox rg-key v2\n00000000000000000000000000000000\n")
                .unwrap_err(),
            FileError::BadHeader("k_RG key")
        );
        assert!(RgKey::parse(b"mbx-blindbox rg-key v1\n0000\n").is_err());
        assert!(
            RgKey::parse(b"mbx-blindbox rg-key v1\n0000000000000000000000000000000g\n").is_err()
        );
        assert!(
            RgKey::parse(b"mbx-blindbox rg-key v1\n00000000000000000000000000000000\nx").is_err()
        );
    }

    #[test]
    fn tag_is_aes_of_padded_chunk() {
        let k = RgKey::from_bytes(*b"0123456789abcdef");
        let t = *b"evil.exe";
        let mut block = [0u8; 16];
        block[..8].copy_from_slice(&t);
        let mut b = block.into();
        Aes128Enc::new(b"0123456789abcdef".into()).encrypt_block(&mut b);
        let expect: [u8; 16] = b.into();
        assert_eq!(k.tag(&t), expect);
        assert!(k.verify(&t, &expect));
        assert!(!k.verify(b"evil.ex_", &expect));
    }

    #[test]
    fn save_refuses_overwrite_and_is_private() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("rg.key");
        let k = RgKey::from_bytes([1; 16]);
        k.save(&p).unwrap();
        assert!(k.save(&p).is_err());
        assert_eq!(RgKey::load(&p).unwrap().bytes(), k.bytes());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&p).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }
}
