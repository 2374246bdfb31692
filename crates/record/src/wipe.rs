//! Wiping secret bytes a word at a time, and a byte buffer that wipes itself.
//!
//! `zeroize` wipes a `[u8]` (and a `Vec<u8>`, spare capacity included) with one volatile store
//! per byte. For record-sized buffers that costs more CPU than the AES-GCM pass that produced
//! the plaintext. [`wipe`] wipes the aligned middle as `u64`s (still volatile stores, through
//! `zeroize`, so the compiler cannot drop them) and only the unaligned ends byte by byte. The
//! casts are `bytemuck`'s checked ones: no `unsafe` here.

use core::fmt;
use core::ops::{Deref, DerefMut};

use zeroize::{Zeroize, ZeroizeOnDrop};

/// Overwrites `bytes` with zeros in a way the compiler does not remove.
pub fn wipe(bytes: &mut [u8]) {
    let (head, words, tail) = bytemuck::pod_align_to_mut::<u8, u64>(bytes);
    head.zeroize();
    words.zeroize();
    tail.zeroize();
}

/// Wipes all of `buf`'s allocation (its bytes and its spare capacity), then empties it. The
/// allocation is kept for reuse.
pub fn wipe_vec(buf: &mut Vec<u8>) {
    // Spare capacity may hold bytes of earlier contents (e.g. after `truncate`). Making it part
    // of the slice (zero-filled) lets it be wiped word-wise as well.
    let cap = buf.capacity();
    buf.resize(cap, 0);
    wipe(buf);
    buf.clear();
}

/// Makes room for `additional` more bytes in `buf` without leaving a copy of its contents in
/// freed memory: if it must grow, the bytes move to a larger allocation (at least double) and
/// the old one is wiped before it is freed, which `Vec::reserve` would not do.
pub fn reserve(buf: &mut Vec<u8>, additional: usize) {
    if buf.capacity() - buf.len() >= additional {
        return;
    }
    let capacity = buf
        .len()
        .saturating_add(additional)
        .max(buf.capacity().saturating_mul(2));
    let mut grown = Vec::with_capacity(capacity);
    grown.extend_from_slice(buf);
    wipe_vec(buf);
    *buf = grown;
}

/// Secret bytes (e.g. an opened record's plaintext) that are wiped, word-wise and including
/// any spare capacity, when dropped. Dereferences to `[u8]`; it cannot grow, so no
/// reallocation can leave an unwiped copy behind.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct SecretBytes(Vec<u8>);

impl SecretBytes {
    /// Takes ownership of `bytes`; they are wiped when the result is dropped.
    pub fn new(bytes: Vec<u8>) -> Self {
        SecretBytes(bytes)
    }

    /// Keeps the first `len` bytes; the rest stays in the allocation until it is wiped.
    pub fn truncate(&mut self, len: usize) {
        self.0.truncate(len);
    }
}

impl From<Vec<u8>> for SecretBytes {
    fn from(bytes: Vec<u8>) -> Self {
        SecretBytes(bytes)
    }
}

impl Deref for SecretBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl DerefMut for SecretBytes {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.0
    }
}

impl AsRef<[u8]> for SecretBytes {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl Zeroize for SecretBytes {
    fn zeroize(&mut self) {
        wipe_vec(&mut self.0);
    }
}

impl Drop for SecretBytes {
    fn drop(&mut self) {
        wipe_vec(&mut self.0);
    }
}

impl ZeroizeOnDrop for SecretBytes {}

impl fmt::Debug for SecretBytes {
    // Never print the bytes.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SecretBytes")
            .field("len", &self.0.len())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wipes_every_byte_at_any_alignment_and_length() {
        let mut buf = [0xA5u8; 100];
        for start in 0..9 {
            for end in start..buf.len() {
                buf.fill(0xA5);
                wipe(&mut buf[start..end]);
                assert!(buf[start..end].iter().all(|&b| b == 0));
                assert!(buf[..start].iter().all(|&b| b == 0xA5));
                assert!(buf[end..].iter().all(|&b| b == 0xA5));
            }
        }
    }

    #[test]
    fn wipe_vec_empties_and_keeps_the_allocation() {
        let mut v = vec![0xA5u8; 64];
        v.truncate(10);
        let ptr = v.as_ptr();
        wipe_vec(&mut v);
        assert!(v.is_empty());
        assert_eq!(v.capacity(), 64);
        assert_eq!(v.as_ptr(), ptr);
    }

    #[test]
    fn reserve_keeps_the_bytes_and_makes_room() {
        let mut buf = Vec::with_capacity(4);
        buf.extend_from_slice(b"abc");
        reserve(&mut buf, 1);
        assert_eq!(buf.capacity(), 4, "room enough: no new allocation");
        reserve(&mut buf, 10);
        assert!(buf.capacity() >= 13);
        assert_eq!(buf, b"abc");
    }

    #[test]
    fn secret_bytes_derefs_and_hides_contents() {
        let mut s = SecretBytes::new(b"secret".to_vec());
        assert_eq!(&s[..], b"secret");
        s.truncate(3);
        assert_eq!(&*s, b"sec");
        assert_eq!(format!("{s:?}"), "SecretBytes { len: 3, .. }");
        s.zeroize();
        assert!(s.is_empty());
    }
}
