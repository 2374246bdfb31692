//! Record headers, size limits and the record deframer.
//!
//! A TLS connection is a stream of records: a 5-byte header (type, version, length) followed by
//! `length` bytes (RFC 8446 §5.1). The deframer ([`RecordReader`]) turns an arbitrarily split
//! byte stream back into whole records, validating each header as soon as its 5 bytes arrive so
//! that a bogus length is rejected without waiting for (or buffering) the claimed payload.

use crate::codec::Reader;
use crate::content::{version, ContentType};
use crate::error::WireError;

/// Size of a record header on the wire.
pub const HEADER_LEN: usize = 5;
/// Largest plaintext fragment: 2^14 (RFC 5246 §6.2.1, RFC 8446 §5.1).
pub const MAX_PLAINTEXT_LEN: usize = 1 << 14;
/// Largest TLS 1.2 protected fragment: 2^14 + 2048 (RFC 5246 §6.2.3).
pub const MAX_CIPHERTEXT_LEN_TLS12: usize = (1 << 14) + 2048;
/// Largest TLS 1.3 protected fragment: 2^14 + 256 (RFC 8446 §5.2).
pub const MAX_CIPHERTEXT_LEN_TLS13: usize = (1 << 14) + 256;

/// The 5-byte record header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordHeader {
    pub content_type: ContentType,
    pub version: u16,
    pub length: u16,
}

impl RecordHeader {
    /// Decode the first 5 bytes of `buf` (more bytes may follow). No policy checks.
    pub fn parse(buf: &[u8]) -> Result<RecordHeader, WireError> {
        if buf.len() < HEADER_LEN {
            return Err(WireError::Truncated {
                needed: HEADER_LEN - buf.len(),
            });
        }
        let mut r = Reader::new(buf);
        Ok(RecordHeader {
            content_type: ContentType(r.u8()?),
            version: r.u16()?,
            length: r.u16()?,
        })
    }

    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let [v0, v1] = self.version.to_be_bytes();
        let [l0, l1] = self.length.to_be_bytes();
        [self.content_type.0, v0, v1, l0, l1]
    }

    /// Check this header against a deframing policy.
    pub fn validate(&self, cfg: &DeframerConfig) -> Result<(), WireError> {
        if (self.version >> 8) as u8 != version::MAJOR {
            return Err(WireError::BadVersion(self.version));
        }
        let len = usize::from(self.length);
        if len > cfg.max_fragment_len {
            return Err(WireError::RecordOverflow {
                len,
                max: cfg.max_fragment_len,
            });
        }
        if !cfg.accepts(self.content_type) {
            return Err(WireError::UnknownContentType(self.content_type));
        }
        if len == 0 && !self.content_type.may_be_empty() {
            return Err(WireError::EmptyRecord(self.content_type));
        }
        Ok(())
    }
}

/// Append one record (header + `payload`) to `out`.
pub fn encode_record(
    content_type: ContentType,
    version: u16,
    payload: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), WireError> {
    let length = u16::try_from(payload.len()).map_err(|_| WireError::TooLong {
        len: payload.len(),
        max: usize::from(u16::MAX),
    })?;
    let h = RecordHeader {
        content_type,
        version,
        length,
    };
    out.extend_from_slice(&h.encode());
    out.extend_from_slice(payload);
    Ok(())
}

/// What the deframer accepts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeframerConfig {
    /// Largest accepted `length` field.
    pub max_fragment_len: usize,
    /// Reject content types that are neither known (20..=24) nor listed in `extra_types`.
    pub strict_content_type: bool,
    /// Further accepted types, e.g. mbTLS's 30/31/32.
    pub extra_types: Vec<ContentType>,
}

impl DeframerConfig {
    /// Strict, with the TLS 1.2 ciphertext limit: the largest limit any TLS record may have.
    pub fn tls12() -> Self {
        DeframerConfig {
            max_fragment_len: MAX_CIPHERTEXT_LEN_TLS12,
            strict_content_type: true,
            extra_types: Vec::new(),
        }
    }

    /// Strict, with the TLS 1.3 ciphertext limit.
    pub fn tls13() -> Self {
        DeframerConfig {
            max_fragment_len: MAX_CIPHERTEXT_LEN_TLS13,
            ..Self::tls12()
        }
    }

    /// Also accept `ct`.
    pub fn with_extra_type(mut self, ct: ContentType) -> Self {
        self.extra_types.push(ct);
        self
    }

    pub fn accepts(&self, ct: ContentType) -> bool {
        !self.strict_content_type || ct.is_known() || self.extra_types.contains(&ct)
    }
}

impl Default for DeframerConfig {
    fn default() -> Self {
        Self::tls12()
    }
}

/// One complete record, header included (the form [`RecordHeader`] and record protection use).
#[derive(Clone, PartialEq, Eq)]
pub struct Record {
    header: RecordHeader,
    bytes: Vec<u8>,
}

impl Record {
    /// Build from complete record bytes; the length field must match exactly.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Record, WireError> {
        let header = RecordHeader::parse(&bytes)?;
        let want = HEADER_LEN + usize::from(header.length);
        match bytes.len() {
            n if n < want => Err(WireError::Truncated { needed: want - n }),
            n if n > want => Err(WireError::TrailingBytes(n - want)),
            _ => Ok(Record { header, bytes }),
        }
    }

    pub fn header(&self) -> RecordHeader {
        self.header
    }

    pub fn content_type(&self) -> ContentType {
        self.header.content_type
    }

    /// The payload (fragment) after the header.
    pub fn payload(&self) -> &[u8] {
        self.bytes.get(HEADER_LEN..).unwrap_or(&[])
    }

    /// The whole record, header included.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }
}

impl core::fmt::Debug for Record {
    // Payloads may be large and are often ciphertext: show only the header.
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Record")
            .field("header", &self.header)
            .finish_non_exhaustive()
    }
}

/// Accumulates stream bytes and yields complete records.
///
/// Errors are sticky: once the stream is found malformed it cannot be resynchronised (record
/// boundaries are lost), so every later call returns the same error.
#[derive(Debug)]
pub struct RecordReader {
    cfg: DeframerConfig,
    buf: Vec<u8>,
    start: usize,
    failed: Option<WireError>,
}

impl RecordReader {
    pub fn new(cfg: DeframerConfig) -> Self {
        RecordReader {
            cfg,
            buf: Vec::new(),
            start: 0,
            failed: None,
        }
    }

    pub fn config(&self) -> &DeframerConfig {
        &self.cfg
    }

    /// Change the policy mid-stream, e.g. to the TLS 1.3 limit once 1.3 is negotiated.
    pub fn set_config(&mut self, cfg: DeframerConfig) {
        self.cfg = cfg;
    }

    /// Bytes received but not yet returned as records.
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.start
    }

    /// Gives the buffer's memory back when nothing is buffered (an idle connection).
    pub fn release_if_empty(&mut self) {
        if self.buffered() == 0 {
            self.buf = Vec::new();
            self.start = 0;
        }
    }

    /// Take bytes from the stream.
    pub fn push(&mut self, data: &[u8]) {
        if self.start > 0 && self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
        }
        self.buf.extend_from_slice(data);
    }

    /// The next complete record; `Ok(None)` means more bytes are needed.
    pub fn next_record(&mut self) -> Result<Option<Record>, WireError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        match self.try_next() {
            Ok(r) => Ok(r),
            Err(e) => {
                self.failed = Some(e.clone());
                Err(e)
            }
        }
    }

    fn try_next(&mut self) -> Result<Option<Record>, WireError> {
        let pending = self.buf.get(self.start..).unwrap_or(&[]);
        if pending.len() < HEADER_LEN {
            return Ok(None);
        }
        let header = RecordHeader::parse(pending)?;
        header.validate(&self.cfg)?;
        let total = HEADER_LEN + usize::from(header.length);
        let Some(bytes) = pending.get(..total) else {
            return Ok(None);
        };
        let rec = Record {
            header,
            bytes: bytes.to_vec(),
        };
        self.start += total;
        // Compact once the consumed prefix dominates, so memory stays bounded by one record
        // plus whatever the caller pushed.
        if self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
        } else if self.start > self.buf.len() / 2 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        Ok(Some(rec))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(ct: u8, ver: u16, payload: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        encode_record(ContentType(ct), ver, payload, &mut v).unwrap();
        v
    }

    #[test]
    fn header_round_trip() {
        let h = RecordHeader {
            content_type: ContentType::HANDSHAKE,
            version: 0x0301,
            length: 0x1234,
        };
        assert_eq!(h.encode(), [22, 3, 1, 0x12, 0x34]);
        assert_eq!(RecordHeader::parse(&h.encode()).unwrap(), h);
        assert_eq!(
            RecordHeader::parse(&[22, 3]),
            Err(WireError::Truncated { needed: 3 })
        );
    }

    #[test]
    fn deframes_records_split_anywhere() {
        let mut stream = rec(22, 0x0301, b"hello");
        stream.extend(rec(23, 0x0303, b""));
        stream.extend(rec(21, 0x0303, &[1, 0]));
        let mut rr = RecordReader::new(DeframerConfig::tls12());
        let mut got = Vec::new();
        for b in &stream {
            rr.push(&[*b]);
            while let Some(r) = rr.next_record().unwrap() {
                got.push(r);
            }
        }
        assert_eq!(got.len(), 3);
        assert_eq!(got[0].payload(), b"hello");
        assert_eq!(got[1].content_type(), ContentType::APPLICATION_DATA);
        assert_eq!(got[2].as_bytes(), &[21, 3, 3, 0, 2, 1, 0]);
        assert_eq!(rr.buffered(), 0);
    }

    #[test]
    fn need_more_on_partial_input() {
        let mut rr = RecordReader::new(DeframerConfig::tls12());
        rr.push(&[22, 3, 3, 0, 4, 1, 2]);
        assert_eq!(rr.next_record(), Ok(None));
        rr.push(&[3, 4]);
        assert_eq!(rr.next_record().unwrap().unwrap().payload(), &[1, 2, 3, 4]);
    }

    #[test]
    fn oversize_rejected_from_header_alone() {
        let mut rr = RecordReader::new(DeframerConfig::tls13());
        let len = (MAX_CIPHERTEXT_LEN_TLS13 + 1) as u16;
        rr.push(&[23, 3, 3, (len >> 8) as u8, len as u8]);
        assert_eq!(
            rr.next_record(),
            Err(WireError::RecordOverflow {
                len: MAX_CIPHERTEXT_LEN_TLS13 + 1,
                max: MAX_CIPHERTEXT_LEN_TLS13
            })
        );
        // exactly at the limit is fine (needs more bytes)
        let mut rr = RecordReader::new(DeframerConfig::tls13());
        let len = MAX_CIPHERTEXT_LEN_TLS13 as u16;
        rr.push(&[23, 3, 3, (len >> 8) as u8, len as u8]);
        assert_eq!(rr.next_record(), Ok(None));
    }

    #[test]
    fn errors_are_sticky() {
        let mut rr = RecordReader::new(DeframerConfig::tls12());
        rr.push(&[99, 3, 3, 0, 1, 0]);
        assert_eq!(
            rr.next_record(),
            Err(WireError::UnknownContentType(ContentType(99)))
        );
        rr.push(&rec(23, 0x0303, b"ok"));
        assert!(rr.next_record().is_err());
    }

    #[test]
    fn unknown_type_policy() {
        let data = rec(30, 0x0303, b"x");
        let mut strict = RecordReader::new(DeframerConfig::tls12());
        strict.push(&data);
        assert!(matches!(
            strict.next_record(),
            Err(WireError::UnknownContentType(_))
        ));
        let mut extra = RecordReader::new(DeframerConfig::tls12().with_extra_type(ContentType(30)));
        extra.push(&data);
        assert!(extra.next_record().unwrap().is_some());
        let mut lax = RecordReader::new(DeframerConfig {
            strict_content_type: false,
            ..DeframerConfig::tls12()
        });
        lax.push(&data);
        assert!(lax.next_record().unwrap().is_some());
    }

    #[test]
    fn bad_major_version_and_empty_records() {
        let mut rr = RecordReader::new(DeframerConfig::tls12());
        rr.push(&[22, 4, 3, 0, 1, 0]);
        assert_eq!(rr.next_record(), Err(WireError::BadVersion(0x0403)));
        for ct in [20u8, 21, 22, 24] {
            let mut rr = RecordReader::new(DeframerConfig::tls12());
            rr.push(&[ct, 3, 3, 0, 0]);
            assert_eq!(
                rr.next_record(),
                Err(WireError::EmptyRecord(ContentType(ct)))
            );
        }
    }

    #[test]
    fn record_from_bytes_checks_length() {
        assert!(Record::from_bytes(rec(23, 0x0303, b"abc")).is_ok());
        let mut long = rec(23, 0x0303, b"abc");
        long.push(0);
        assert_eq!(Record::from_bytes(long), Err(WireError::TrailingBytes(1)));
        let mut short = rec(23, 0x0303, b"abc");
        short.pop();
        assert_eq!(
            Record::from_bytes(short),
            Err(WireError::Truncated { needed: 1 })
        );
    }
}
