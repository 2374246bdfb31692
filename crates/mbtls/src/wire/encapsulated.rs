//! `EncapsulatedRecord`: `subchannel_id: u8` then one complete inner TLS record.
//!
//! Secondary-handshake records (and the secondary session's application data, which carries
//! evidence and key material) travel over the primary connection inside these, one subchannel
//! per middlebox. Announcements are empty inner records of type 32.

use mbx_wire::record::{encode_record, HEADER_LEN};
use mbx_wire::{ContentType, Reader, Record, RecordHeader, WireError};

use super::{malformed, CT_ENCAPSULATED, CT_MIDDLEBOX_ANNOUNCEMENT};

/// Largest inner record payload: 2^14 − 1 (Appendix A: the subchannel id takes one byte of the
/// outer record's 2^14).
pub const MAX_INNER_PAYLOAD_LEN: usize = (1 << 14) - 1;

/// Largest plaintext a secondary session may put in one record so that the record fits an
/// encapsulated record: [`MAX_INNER_PAYLOAD_LEN`] less the largest AEAD expansion of our
/// suites (TLS 1.2 AES-GCM: 8-byte explicit nonce and 16-byte tag; TLS 1.3 adds 17).
pub const MAX_INNER_PLAINTEXT_LEN: usize = MAX_INNER_PAYLOAD_LEN - 24;

/// One decoded encapsulated record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Encapsulated {
    pub subchannel: u8,
    /// The complete inner record, header included.
    pub inner: Record,
}

/// Inner record types we carry: the secondary session's records (20–23) and announcements.
fn inner_type_ok(ct: ContentType) -> bool {
    matches!(ct.0, 20..=23) || ct == CT_MIDDLEBOX_ANNOUNCEMENT
}

fn check_inner(h: &RecordHeader) -> Result<(), WireError> {
    if (h.version >> 8) as u8 != mbx_wire::version::MAJOR {
        return Err(WireError::BadVersion(h.version));
    }
    if !inner_type_ok(h.content_type) {
        return Err(WireError::UnknownContentType(h.content_type));
    }
    let len = usize::from(h.length);
    if len > MAX_INNER_PAYLOAD_LEN {
        return Err(WireError::RecordOverflow {
            len,
            max: MAX_INNER_PAYLOAD_LEN,
        });
    }
    if len == 0 && !h.content_type.may_be_empty() {
        return Err(WireError::EmptyRecord(h.content_type));
    }
    if h.content_type == CT_MIDDLEBOX_ANNOUNCEMENT && len != 0 {
        return Err(malformed("non-empty middlebox announcement"));
    }
    Ok(())
}

impl Encapsulated {
    /// Wrap `inner` for subchannel `subchannel`, checking the inner record's limits.
    pub fn new(subchannel: u8, inner: Record) -> Result<Self, WireError> {
        check_inner(&inner.header())?;
        Ok(Encapsulated { subchannel, inner })
    }

    /// Decode the payload of an outer record of type 30.
    pub fn parse(outer_payload: &[u8]) -> Result<Self, WireError> {
        let mut r = Reader::new(outer_payload);
        let subchannel = r.u8()?;
        let rest = r.take_rest();
        let header = RecordHeader::parse(rest)?;
        check_inner(&header)?;
        let inner = Record::from_bytes(rest.to_vec())?;
        Ok(Encapsulated { subchannel, inner })
    }

    /// Decode an outer record, which must be of type 30.
    pub fn from_record(outer: &Record) -> Result<Self, WireError> {
        if outer.content_type() != CT_ENCAPSULATED {
            return Err(WireError::UnknownContentType(outer.content_type()));
        }
        Self::parse(outer.payload())
    }

    /// True for a middlebox announcement (an empty inner record of type 32).
    pub fn is_announcement(&self) -> bool {
        self.inner.content_type() == CT_MIDDLEBOX_ANNOUNCEMENT
    }

    /// Append the outer record (type 30, `outer_version` in its header) to `out`.
    pub fn encode(&self, outer_version: u16, out: &mut Vec<u8>) -> Result<(), WireError> {
        let inner = self.inner.as_bytes();
        let mut payload = Vec::with_capacity(1 + inner.len());
        payload.push(self.subchannel);
        payload.extend_from_slice(inner);
        encode_record(CT_ENCAPSULATED, outer_version, &payload, out)
    }

    /// Split a stream of inner records (e.g. an engine's outgoing flight) into encapsulated
    /// records for `subchannel`, appended to `out`. The stream must consist of whole records.
    pub fn wrap_stream(
        subchannel: u8,
        records: &[u8],
        outer_version: u16,
        out: &mut Vec<u8>,
    ) -> Result<(), WireError> {
        let mut rest = records;
        while !rest.is_empty() {
            let h = RecordHeader::parse(rest)?;
            let total = HEADER_LEN + usize::from(h.length);
            let Some(one) = rest.get(..total) else {
                return Err(WireError::Truncated {
                    needed: total - rest.len(),
                });
            };
            let enc = Encapsulated::new(subchannel, Record::from_bytes(one.to_vec())?)?;
            enc.encode(outer_version, out)?;
            rest = rest.get(total..).unwrap_or(&[]);
        }
        Ok(())
    }
}

/// The MiddleboxAnnouncement a server-side middlebox sends (Appendix A: an empty message, in an
/// encapsulated record), on `subchannel`.
pub fn announcement_record(subchannel: u8, version: u16) -> Result<Vec<u8>, WireError> {
    let mut inner = Vec::with_capacity(HEADER_LEN);
    encode_record(CT_MIDDLEBOX_ANNOUNCEMENT, version, &[], &mut inner)?;
    let enc = Encapsulated::new(subchannel, Record::from_bytes(inner)?)?;
    let mut out = Vec::new();
    enc.encode(version, &mut out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(ct: u8, payload: &[u8]) -> Record {
        let mut v = Vec::new();
        encode_record(ContentType(ct), 0x0303, payload, &mut v).unwrap();
        Record::from_bytes(v).unwrap()
    }

    #[test]
    fn round_trip_and_exact_bytes() {
        let e = Encapsulated::new(7, rec(22, b"hello")).unwrap();
        let mut out = Vec::new();
        e.encode(0x0303, &mut out).unwrap();
        assert_eq!(
            out,
            [30, 3, 3, 0, 11, 7, 22, 3, 3, 0, 5, b'h', b'e', b'l', b'l', b'o']
        );
        let outer = Record::from_bytes(out).unwrap();
        assert_eq!(Encapsulated::from_record(&outer).unwrap(), e);
    }

    #[test]
    fn inner_payload_limit_is_2_14_minus_1() {
        let ok = rec(23, &vec![0; MAX_INNER_PAYLOAD_LEN]);
        let e = Encapsulated::new(0, ok).unwrap();
        let mut out = Vec::new();
        e.encode(0x0303, &mut out).unwrap();
        let outer = Record::from_bytes(out).unwrap();
        assert!(Encapsulated::from_record(&outer).is_ok());
        let big = rec(23, &vec![0; MAX_INNER_PAYLOAD_LEN + 1]);
        assert!(matches!(
            Encapsulated::new(0, big.clone()),
            Err(WireError::RecordOverflow { .. })
        ));
        let mut payload = vec![0u8];
        payload.extend_from_slice(big.as_bytes());
        assert!(matches!(
            Encapsulated::parse(&payload),
            Err(WireError::RecordOverflow { .. })
        ));
    }

    #[test]
    fn rejects_bad_inner_records() {
        // nested encapsulation, unknown type, wrong length, trailing bytes, bad version
        assert!(Encapsulated::parse(&[1, 30, 3, 3, 0, 1, 0]).is_err());
        assert!(Encapsulated::parse(&[1, 99, 3, 3, 0, 1, 0]).is_err());
        assert!(Encapsulated::parse(&[1, 22, 3, 3, 0, 2, 0]).is_err());
        assert!(Encapsulated::parse(&[1, 22, 3, 3, 0, 1, 0, 0]).is_err());
        assert!(Encapsulated::parse(&[1, 22, 4, 3, 0, 1, 0]).is_err());
        assert!(Encapsulated::parse(&[1, 22, 3, 3, 0, 0]).is_err());
        assert!(Encapsulated::parse(&[1]).is_err());
        assert!(Encapsulated::parse(&[]).is_err());
        // a non-empty announcement
        assert!(Encapsulated::parse(&[1, 32, 3, 3, 0, 1, 0]).is_err());
        // wrong outer type
        assert!(Encapsulated::from_record(&rec(22, &[1, 22, 3, 3, 0, 1, 0])).is_err());
    }

    #[test]
    fn announcement() {
        let a = announcement_record(3, 0x0303).unwrap();
        assert_eq!(a, [30, 3, 3, 0, 6, 3, 32, 3, 3, 0, 0]);
        let e = Encapsulated::from_record(&Record::from_bytes(a).unwrap()).unwrap();
        assert!(e.is_announcement());
        assert_eq!(e.subchannel, 3);
    }

    #[test]
    fn wrap_stream_splits_records() {
        let mut flight = rec(22, b"one").into_bytes();
        flight.extend(rec(20, &[1]).into_bytes());
        let mut out = Vec::new();
        Encapsulated::wrap_stream(2, &flight, 0x0303, &mut out).unwrap();
        let mut rr = mbx_wire::RecordReader::new(super::super::deframer_config());
        rr.push(&out);
        let a = Encapsulated::from_record(&rr.next_record().unwrap().unwrap()).unwrap();
        let b = Encapsulated::from_record(&rr.next_record().unwrap().unwrap()).unwrap();
        assert_eq!(a.inner.payload(), b"one");
        assert_eq!(b.inner.content_type(), ContentType::CHANGE_CIPHER_SPEC);
        assert!(
            Encapsulated::wrap_stream(2, &flight[..flight.len() - 1], 0x0303, &mut out).is_err()
        );
    }
}
