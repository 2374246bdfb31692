//! Minimal record-boundary helpers over raw TLS byte streams.
//!
//! The engines hand whole records, never fragments, to the TLS libraries, so that after an export
//! every byte the library has not processed is still ours (a library holding half a record would
//! make the next sequence number ambiguous). These helpers only read the 5-byte record header and
//! the plaintext handshake messages at the start of a connection; all record protection lives in
//! `mbx-record`.

use mbx_wire::handshake::DEFAULT_MAX_HANDSHAKE_LEN;
use mbx_wire::{
    ContentType, DeframerConfig, HandshakeDeframer, HandshakeType, RecordHeader, ServerHello,
};

use crate::EngineError;

pub(crate) const CT_CHANGE_CIPHER_SPEC: u8 = ContentType::CHANGE_CIPHER_SPEC.0;
pub(crate) const CT_ALERT: u8 = ContentType::ALERT.0;
pub(crate) const CT_HANDSHAKE: u8 = ContentType::HANDSHAKE.0;
pub(crate) const CT_APPLICATION_DATA: u8 = ContentType::APPLICATION_DATA.0;

/// Length of the first complete record at the start of `buf`, `Ok(None)` if more bytes are
/// needed, an error if the header cannot be a TLS record (checked with the TLS 1.2 limits, the
/// larger of the two).
pub(crate) fn complete_record_len(buf: &[u8]) -> Result<Option<usize>, EngineError> {
    if buf.len() < mbx_wire::record::HEADER_LEN {
        return Ok(None);
    }
    let header =
        RecordHeader::parse(buf).map_err(|_| EngineError::Malformed("not a TLS record header"))?;
    header
        .validate(&DeframerConfig::tls12())
        .map_err(|_| EngineError::Malformed("not an acceptable TLS record header"))?;
    let total = mbx_wire::record::HEADER_LEN + usize::from(header.length);
    Ok((buf.len() >= total).then_some(total))
}

/// Number of leading bytes of `buf` that form complete records.
pub(crate) fn complete_prefix_len(buf: &[u8]) -> Result<usize, EngineError> {
    let mut off = 0;
    while let Some(rest) = buf.get(off..) {
        match complete_record_len(rest)? {
            Some(n) => off += n,
            None => break,
        }
    }
    Ok(off)
}

/// Reassembles the plaintext handshake messages carried by the leading handshake records of
/// `stream` (skipping TLS 1.3 compatibility ChangeCipherSpecs, stopping at any other record
/// type) and returns the first message of type `msg_type`, header included, plus the number of
/// stream bytes spanned by the records up to and including the one that completes it.
pub(crate) fn first_handshake_message(
    stream: &[u8],
    msg_type: u8,
) -> Result<Option<(Vec<u8>, usize)>, EngineError> {
    let mut messages = HandshakeDeframer::new(DEFAULT_MAX_HANDSHAKE_LEN);
    let mut off = 0;
    while let Some(rest) = stream.get(off..) {
        let Some(n) = complete_record_len(rest)? else {
            return Ok(None);
        };
        off += n;
        match rest.first().copied() {
            Some(CT_HANDSHAKE) => messages.push(
                rest.get(mbx_wire::record::HEADER_LEN..n)
                    .unwrap_or_default(),
            ),
            Some(CT_CHANGE_CIPHER_SPEC) => continue,
            _ => return Ok(None),
        }
        while let Some(msg) = messages
            .next_message()
            .map_err(|_| EngineError::Malformed("bad handshake message framing"))?
        {
            if msg.typ() == HandshakeType(msg_type) {
                return Ok(Some((msg.into_bytes(), off)));
            }
        }
    }
    Ok(None)
}

/// The server random of the (non-HelloRetryRequest) ServerHello in a server→client byte stream.
pub(crate) fn server_random(stream: &[u8]) -> Result<Option<[u8; 32]>, EngineError> {
    let mut off = 0;
    while let Some(rest) = stream.get(off..) {
        let Some((msg, used)) = first_handshake_message(rest, HandshakeType::SERVER_HELLO.0)?
        else {
            return Ok(None);
        };
        let hello = ServerHello::parse_message(&msg)
            .map_err(|_| EngineError::Malformed("bad ServerHello"))?;
        if !hello.is_hello_retry_request() {
            return Ok(Some(hello.random));
        }
        off += used;
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(ct: u8, payload: &[u8]) -> Vec<u8> {
        let mut v = vec![ct, 3, 3];
        v.extend_from_slice(&(payload.len() as u16).to_be_bytes());
        v.extend_from_slice(payload);
        v
    }

    #[test]
    fn prefix_counts_only_whole_records() {
        let mut s = rec(23, b"abc");
        s.extend(rec(23, b"defg"));
        let whole = s.len();
        s.extend_from_slice(&[23, 3, 3, 0, 10, 1]);
        assert_eq!(complete_prefix_len(&s).unwrap(), whole);
        assert!(complete_prefix_len(&[99, 3, 3, 0, 0]).is_err());
        assert!(complete_prefix_len(&[23, 3, 3, 0xff, 0xff]).is_err());
    }

    #[test]
    fn handshake_message_reassembled_across_records() {
        let mut msg = vec![1, 0, 0, 40];
        msg.extend((0..40u8).collect::<Vec<_>>());
        let mut s = rec(22, &msg[..10]);
        s.extend(rec(22, &msg[10..]));
        let (m, used) = first_handshake_message(&s, 1).unwrap().unwrap();
        assert_eq!(m, msg);
        assert_eq!(used, s.len());
        assert_eq!(first_handshake_message(&s[..s.len() - 1], 1).unwrap(), None);
    }
}
