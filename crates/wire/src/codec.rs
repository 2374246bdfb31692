//! A bounds-checked cursor over untrusted bytes, and the matching writer.
//!
//! All TLS structures are built from big-endian integers and length-prefixed vectors
//! (RFC 8446 §3). The [`Reader`] returns [`WireError::Truncated`] instead of panicking when the
//! input is short, so parsers can be written as straight-line `?` code.

use crate::error::WireError;

/// A read cursor over a byte slice. Never panics.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    /// Bytes consumed so far.
    pub fn position(&self) -> usize {
        self.pos
    }

    /// Bytes not yet consumed.
    pub fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }

    pub fn is_empty(&self) -> bool {
        self.remaining() == 0
    }

    /// The unconsumed bytes, without consuming them.
    pub fn rest(&self) -> &'a [u8] {
        self.buf.get(self.pos..).unwrap_or(&[])
    }

    /// Consume exactly `n` bytes.
    pub fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        let rem = self.remaining();
        if n > rem {
            return Err(WireError::Truncated { needed: n - rem });
        }
        let out = self
            .buf
            .get(self.pos..self.pos + n)
            .ok_or(WireError::Truncated { needed: n })?;
        self.pos += n;
        Ok(out)
    }

    /// Consume everything that is left.
    pub fn take_rest(&mut self) -> &'a [u8] {
        let out = self.rest();
        self.pos = self.buf.len();
        out
    }

    /// Consume a fixed-size array.
    pub fn array<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        let s = self.take(N)?;
        let mut out = [0u8; N];
        out.copy_from_slice(s);
        Ok(out)
    }

    pub fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.array::<1>()?[0])
    }

    pub fn u16(&mut self) -> Result<u16, WireError> {
        Ok(u16::from_be_bytes(self.array()?))
    }

    pub fn u24(&mut self) -> Result<u32, WireError> {
        let [a, b, c] = self.array()?;
        Ok(u32::from_be_bytes([0, a, b, c]))
    }

    pub fn u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_be_bytes(self.array()?))
    }

    pub fn u64(&mut self) -> Result<u64, WireError> {
        Ok(u64::from_be_bytes(self.array()?))
    }

    /// A vector with a one-byte length prefix (`opaque x<0..2^8-1>`).
    pub fn vec_u8(&mut self) -> Result<&'a [u8], WireError> {
        let n = self.u8()? as usize;
        self.take(n)
    }

    /// A vector with a two-byte length prefix (`opaque x<0..2^16-1>`).
    pub fn vec_u16(&mut self) -> Result<&'a [u8], WireError> {
        let n = self.u16()? as usize;
        self.take(n)
    }

    /// A vector with a three-byte length prefix (`opaque x<0..2^24-1>`).
    pub fn vec_u24(&mut self) -> Result<&'a [u8], WireError> {
        let n = self.u24()? as usize;
        self.take(n)
    }

    /// A sub-reader over a one-byte-length-prefixed vector.
    pub fn sub_u8(&mut self) -> Result<Reader<'a>, WireError> {
        self.vec_u8().map(Reader::new)
    }

    /// A sub-reader over a two-byte-length-prefixed vector.
    pub fn sub_u16(&mut self) -> Result<Reader<'a>, WireError> {
        self.vec_u16().map(Reader::new)
    }

    /// A sub-reader over a three-byte-length-prefixed vector.
    pub fn sub_u24(&mut self) -> Result<Reader<'a>, WireError> {
        self.vec_u24().map(Reader::new)
    }

    /// Succeed only if every byte was consumed: trailing bytes are an error in TLS.
    pub fn finish(&self) -> Result<(), WireError> {
        match self.remaining() {
            0 => Ok(()),
            n => Err(WireError::TrailingBytes(n)),
        }
    }
}

/// The longest prefix of `text` of at most `max` bytes that ends at a character boundary: text
/// cut to fit a length field without splitting a character.
pub fn text_prefix(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.get(..end).unwrap_or_default()
}

/// `text` with each control character replaced by `?`: a peer's words (a name, an error)
/// printed to a terminal or a log line cannot steer either.
pub fn printable(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

/// Appends TLS encodings to a `Vec<u8>`.
#[derive(Debug)]
pub struct Writer<'a> {
    buf: &'a mut Vec<u8>,
}

impl<'a> Writer<'a> {
    pub fn new(buf: &'a mut Vec<u8>) -> Self {
        Writer { buf }
    }

    /// Bytes written to the underlying buffer in total (including what was there before).
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    pub fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }

    pub fn u16(&mut self, v: u16) {
        self.buf.extend_from_slice(&v.to_be_bytes());
    }

    /// A 24-bit integer; fails if `v` does not fit.
    pub fn u24(&mut self, v: u32) -> Result<(), WireError> {
        if v > 0x00ff_ffff {
            return Err(WireError::TooLong {
                len: v as usize,
                max: 0x00ff_ffff,
            });
        }
        let [_, a, b, c] = v.to_be_bytes();
        self.buf.extend_from_slice(&[a, b, c]);
        Ok(())
    }

    pub fn u32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_be_bytes());
    }

    pub fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_be_bytes());
    }

    pub fn bytes(&mut self, v: &[u8]) {
        self.buf.extend_from_slice(v);
    }

    /// `opaque x<0..2^8-1>`.
    pub fn vec_u8(&mut self, v: &[u8]) -> Result<(), WireError> {
        self.prefixed(1, |w| {
            w.bytes(v);
            Ok(())
        })
    }

    /// `opaque x<0..2^16-1>`.
    pub fn vec_u16(&mut self, v: &[u8]) -> Result<(), WireError> {
        self.prefixed(2, |w| {
            w.bytes(v);
            Ok(())
        })
    }

    /// `opaque x<0..2^24-1>`.
    pub fn vec_u24(&mut self, v: &[u8]) -> Result<(), WireError> {
        self.prefixed(3, |w| {
            w.bytes(v);
            Ok(())
        })
    }

    /// Write a length prefix of `width` bytes (1..=3) and then whatever `body` writes; the
    /// prefix is filled in afterwards. On error the buffer is restored to its previous length.
    pub fn prefixed<F>(&mut self, width: usize, body: F) -> Result<(), WireError>
    where
        F: FnOnce(&mut Writer<'_>) -> Result<(), WireError>,
    {
        let max: usize = match width {
            1 => 0xff,
            2 => 0xffff,
            3 => 0x00ff_ffff,
            _ => return Err(WireError::Malformed("length prefix width")),
        };
        let start = self.buf.len();
        self.buf.resize(start + width, 0);
        let result = body(&mut Writer { buf: self.buf });
        let len = self.buf.len() - start - width;
        if let Err(e) = result {
            self.buf.truncate(start);
            return Err(e);
        }
        if len > max {
            self.buf.truncate(start);
            return Err(WireError::TooLong { len, max });
        }
        let be = (len as u32).to_be_bytes();
        if let (Some(dst), Some(src)) =
            (self.buf.get_mut(start..start + width), be.get(4 - width..))
        {
            dst.copy_from_slice(src);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_cut_at_a_character_boundary() {
        assert_eq!(text_prefix("abc", 5), "abc");
        assert_eq!(text_prefix("abc", 2), "ab");
        // "é" is two bytes: a cut inside it keeps the text before it.
        assert_eq!(text_prefix("aé", 2), "a");
        assert_eq!(text_prefix("aé", 3), "aé");
        assert_eq!(text_prefix("", 0), "");
    }

    #[test]
    fn reader_reads_integers_and_vectors() {
        let data = [1, 0, 2, 0, 0, 3, 0, 0, 0, 4, 2, 0xaa, 0xbb, 9];
        let mut r = Reader::new(&data);
        assert_eq!(r.u8().unwrap(), 1);
        assert_eq!(r.u16().unwrap(), 2);
        assert_eq!(r.u24().unwrap(), 3);
        assert_eq!(r.u32().unwrap(), 4);
        assert_eq!(r.vec_u8().unwrap(), &[0xaa, 0xbb]);
        assert_eq!(r.finish(), Err(WireError::TrailingBytes(1)));
        assert_eq!(r.u8().unwrap(), 9);
        assert_eq!(r.finish(), Ok(()));
        assert_eq!(r.u8(), Err(WireError::Truncated { needed: 1 }));
    }

    #[test]
    fn reader_rejects_overrunning_vector() {
        let mut r = Reader::new(&[0, 5, 1, 2]);
        assert_eq!(r.vec_u16(), Err(WireError::Truncated { needed: 3 }));
    }

    #[test]
    fn writer_round_trips() {
        let mut buf = Vec::new();
        let mut w = Writer::new(&mut buf);
        w.u8(1);
        w.u16(0x0203);
        w.u24(0x040506).unwrap();
        w.u32(7);
        w.vec_u16(b"hi").unwrap();
        w.prefixed(3, |w| w.vec_u8(b"x")).unwrap();
        let mut r = Reader::new(&buf);
        assert_eq!(r.u8().unwrap(), 1);
        assert_eq!(r.u16().unwrap(), 0x0203);
        assert_eq!(r.u24().unwrap(), 0x040506);
        assert_eq!(r.u32().unwrap(), 7);
        assert_eq!(r.vec_u16().unwrap(), b"hi");
        let mut sub = r.sub_u24().unwrap();
        assert_eq!(sub.vec_u8().unwrap(), b"x");
        sub.finish().unwrap();
        r.finish().unwrap();
    }

    #[test]
    fn writer_rejects_overlong_vectors_and_restores() {
        let mut buf = vec![9];
        let mut w = Writer::new(&mut buf);
        assert_eq!(
            w.vec_u8(&[0; 256]),
            Err(WireError::TooLong { len: 256, max: 255 })
        );
        assert!(w.u24(0x0100_0000).is_err());
        assert_eq!(buf, vec![9]);
    }
}
