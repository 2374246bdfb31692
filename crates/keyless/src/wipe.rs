//! Wiping byte buffers a word at a time.
//!
//! `zeroize` wipes a `[u8]` with one volatile store per byte; the key server wipes about 2 KiB
//! per request (request and response bytes), which at that rate costs as much CPU as its TLS
//! records. [`wipe`] wipes the aligned middle as `u64`s (still volatile stores, through
//! `zeroize`) and only the unaligned ends byte by byte.

use zeroize::Zeroize;

/// Overwrites `bytes` with zeros in a way the compiler does not remove.
pub fn wipe(bytes: &mut [u8]) {
    let (head, words, tail) = bytemuck::pod_align_to_mut::<u8, u64>(bytes);
    head.zeroize();
    words.zeroize();
    tail.zeroize();
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
    wipe(buf);
    *buf = grown;
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
