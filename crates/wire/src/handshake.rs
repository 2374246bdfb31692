//! Handshake message framing: `type: u8, length: u24, body` (RFC 8446 §4).
//!
//! Handshake messages may be split across records and several may share one record, so the
//! [`HandshakeDeframer`] reassembles them from the concatenated handshake-record payloads.

use core::fmt;

use crate::codec::{Reader, Writer};
use crate::error::WireError;

/// Size of a handshake message header.
pub const HANDSHAKE_HEADER_LEN: usize = 4;
/// Default largest accepted handshake message body. Certificate chains are the largest
/// messages in practice; 64 KiB is a common bound (rustls and OpenSSL use similar ones).
pub const DEFAULT_MAX_HANDSHAKE_LEN: usize = 0x1_0000;

/// A handshake message type. Open (newtype) so unknown and new types pass through.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HandshakeType(pub u8);

impl HandshakeType {
    pub const HELLO_REQUEST: HandshakeType = HandshakeType(0);
    pub const CLIENT_HELLO: HandshakeType = HandshakeType(1);
    pub const SERVER_HELLO: HandshakeType = HandshakeType(2);
    pub const NEW_SESSION_TICKET: HandshakeType = HandshakeType(4);
    pub const END_OF_EARLY_DATA: HandshakeType = HandshakeType(5);
    pub const ENCRYPTED_EXTENSIONS: HandshakeType = HandshakeType(8);
    pub const CERTIFICATE: HandshakeType = HandshakeType(11);
    pub const SERVER_KEY_EXCHANGE: HandshakeType = HandshakeType(12);
    pub const CERTIFICATE_REQUEST: HandshakeType = HandshakeType(13);
    pub const SERVER_HELLO_DONE: HandshakeType = HandshakeType(14);
    pub const CERTIFICATE_VERIFY: HandshakeType = HandshakeType(15);
    pub const CLIENT_KEY_EXCHANGE: HandshakeType = HandshakeType(16);
    pub const FINISHED: HandshakeType = HandshakeType(20);
    pub const KEY_UPDATE: HandshakeType = HandshakeType(24);
    pub const MESSAGE_HASH: HandshakeType = HandshakeType(254);
}

impl fmt::Debug for HandshakeType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HandshakeType({})", self.0)
    }
}

/// One complete handshake message, kept in its encoded form (transcript hashes need the
/// exact bytes).
#[derive(Clone, PartialEq, Eq)]
pub struct HandshakeMessage {
    typ: HandshakeType,
    raw: Vec<u8>,
}

impl HandshakeMessage {
    /// Parse exactly one message (header + body) from `raw`.
    pub fn parse(raw: &[u8], max_len: usize) -> Result<HandshakeMessage, WireError> {
        let (typ, body) = parse_handshake(raw, max_len)?;
        let _ = body;
        Ok(HandshakeMessage {
            typ,
            raw: raw.to_vec(),
        })
    }

    /// Build a message from a type and a body.
    pub fn new(typ: HandshakeType, body: &[u8]) -> Result<HandshakeMessage, WireError> {
        let mut raw = Vec::with_capacity(HANDSHAKE_HEADER_LEN + body.len());
        encode_handshake(typ, body, &mut raw)?;
        Ok(HandshakeMessage { typ, raw })
    }

    pub fn typ(&self) -> HandshakeType {
        self.typ
    }

    /// The body, without the 4-byte header.
    pub fn body(&self) -> &[u8] {
        self.raw.get(HANDSHAKE_HEADER_LEN..).unwrap_or(&[])
    }

    /// The whole encoded message, header included.
    pub fn as_bytes(&self) -> &[u8] {
        &self.raw
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.raw
    }
}

impl fmt::Debug for HandshakeMessage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HandshakeMessage")
            .field("typ", &self.typ)
            .field("body_len", &self.body().len())
            .finish()
    }
}

/// Append a handshake message (header + body) to `out`.
pub fn encode_handshake(
    typ: HandshakeType,
    body: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), WireError> {
    let len = u32::try_from(body.len()).map_err(|_| WireError::TooLong {
        len: body.len(),
        max: 0x00ff_ffff,
    })?;
    let mark = out.len();
    let mut w = Writer::new(out);
    w.u8(typ.0);
    if let Err(e) = w.u24(len) {
        out.truncate(mark);
        return Err(e);
    }
    out.extend_from_slice(body);
    Ok(())
}

/// Split exactly one encoded message into type and body.
pub fn parse_handshake(raw: &[u8], max_len: usize) -> Result<(HandshakeType, &[u8]), WireError> {
    let mut r = Reader::new(raw);
    let typ = HandshakeType(r.u8()?);
    let len = r.u24()? as usize;
    if len > max_len {
        return Err(WireError::HandshakeTooLarge { len, max: max_len });
    }
    let body = r.take(len)?;
    r.finish()?;
    Ok((typ, body))
}

/// Reassembles handshake messages from a byte stream (the concatenation of handshake-record
/// payloads). Errors are sticky, like [`crate::RecordReader`].
#[derive(Debug)]
pub struct HandshakeDeframer {
    max_len: usize,
    buf: Vec<u8>,
    failed: Option<WireError>,
}

impl HandshakeDeframer {
    pub fn new(max_len: usize) -> Self {
        HandshakeDeframer {
            max_len,
            buf: Vec::new(),
            failed: None,
        }
    }

    pub fn push(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    /// Bytes held that do not yet form a complete message. TLS 1.3 requires this to be zero
    /// at a key change (RFC 8446 §5.1), so callers check it there.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// Bytes of buffer capacity held (reassembly keeps its allocation between messages).
    pub fn capacity(&self) -> usize {
        self.buf.capacity()
    }

    /// The next complete message; `Ok(None)` means more bytes are needed.
    pub fn next_message(&mut self) -> Result<Option<HandshakeMessage>, WireError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let mut r = Reader::new(&self.buf);
        let (Ok(typ), Ok(len)) = (r.u8(), r.u24()) else {
            return Ok(None);
        };
        let len = len as usize;
        if len > self.max_len {
            let e = WireError::HandshakeTooLarge {
                len,
                max: self.max_len,
            };
            self.failed = Some(e.clone());
            return Err(e);
        }
        let total = HANDSHAKE_HEADER_LEN + len;
        if self.buf.len() < total {
            return Ok(None);
        }
        let raw: Vec<u8> = self.buf.drain(..total).collect();
        Ok(Some(HandshakeMessage {
            typ: HandshakeType(typ),
            raw,
        }))
    }
}

impl Default for HandshakeDeframer {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_HANDSHAKE_LEN)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_and_reassemble() {
        let mut stream = Vec::new();
        encode_handshake(HandshakeType::FINISHED, &[7; 32], &mut stream).unwrap();
        encode_handshake(HandshakeType(99), &[], &mut stream).unwrap();
        let mut d = HandshakeDeframer::default();
        let mut got = Vec::new();
        for chunk in stream.chunks(3) {
            d.push(chunk);
            while let Some(m) = d.next_message().unwrap() {
                got.push(m);
            }
        }
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].typ(), HandshakeType::FINISHED);
        assert_eq!(got[0].body(), &[7; 32]);
        assert_eq!(got[1].typ(), HandshakeType(99));
        assert_eq!(got[1].as_bytes(), &[99, 0, 0, 0]);
        assert_eq!(d.buffered(), 0);
    }

    #[test]
    fn too_large_is_rejected_from_header() {
        let mut d = HandshakeDeframer::new(100);
        d.push(&[1, 0, 0, 101]);
        assert_eq!(
            d.next_message(),
            Err(WireError::HandshakeTooLarge { len: 101, max: 100 })
        );
        assert!(d.next_message().is_err());
        let mut d = HandshakeDeframer::new(100);
        d.push(&[1, 0, 0, 100]);
        assert_eq!(d.next_message(), Ok(None));
    }

    #[test]
    fn parse_exactly_one() {
        assert_eq!(
            parse_handshake(&[20, 0, 0, 1, 9], 10).unwrap(),
            (HandshakeType::FINISHED, &[9u8][..])
        );
        assert_eq!(
            parse_handshake(&[20, 0, 0, 1, 9, 9], 10),
            Err(WireError::TrailingBytes(1))
        );
        assert_eq!(
            parse_handshake(&[20, 0, 0, 2, 9], 10),
            Err(WireError::Truncated { needed: 1 })
        );
    }
}
