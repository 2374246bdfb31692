//! The one error type of the wire codecs.

use crate::content::ContentType;

/// Why bytes could not be decoded (or a value could not be encoded).
///
/// Variants carry enough detail to choose the right TLS alert; none carries secret data.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// The input ended before a complete value: `needed` more bytes were expected.
    #[error("truncated input: {needed} more byte(s) needed")]
    Truncated { needed: usize },
    /// A complete value was followed by bytes that belong to nothing.
    #[error("{0} trailing byte(s) after a complete value")]
    TrailingBytes(usize),
    /// A record's length field exceeds the limit for its protection state.
    #[error("record length {len} exceeds the limit of {max}")]
    RecordOverflow { len: usize, max: usize },
    /// A record carried a content type we do not accept (strict mode).
    #[error("unknown content type {0:?}")]
    UnknownContentType(ContentType),
    /// A record version whose major byte is not 3 (not SSL3/TLS): the stream is not TLS.
    #[error("bad record version 0x{version:04x}{hint}", version = .0, hint = text_hint(*.0))]
    BadVersion(u16),
    /// A zero-length record of a type for which that is illegal (RFC 5246 §6.2.1, RFC 8446 §5.1).
    #[error("zero-length record of type {0:?}")]
    EmptyRecord(ContentType),
    /// A handshake message longer than the configured maximum.
    #[error("handshake message length {len} exceeds the limit of {max}")]
    HandshakeTooLarge { len: usize, max: usize },
    /// The same extension type appears twice in one hello (RFC 8446 §4.2).
    #[error("duplicate extension {0}")]
    DuplicateExtension(u16),
    /// The handshake message was not of the type the parser expects.
    #[error("unexpected handshake message type {got} (expected {expected})")]
    UnexpectedMessage { expected: u8, got: u8 },
    /// A structurally invalid field; the string names it (static, never input data).
    #[error("malformed {0}")]
    Malformed(&'static str),
    /// A value is too long for the length prefix (or field) it has to fit in.
    #[error("value of length {len} does not fit a field of at most {max}")]
    TooLong { len: usize, max: usize },
}

/// Two printable ASCII bytes where a record's version should be are most likely text: an HTTP
/// request sent to a TLS port ("GET /…" gives 0x4554), or an HTTP server's answer to TLS sent
/// to its plain port ("HTTP/…" gives 0x5454). Which end is the wrong one cannot be told here:
/// say both.
fn text_hint(version: u16) -> &'static str {
    if version.to_be_bytes().iter().all(|b| b.is_ascii_graphic()) {
        " (text, not TLS: the peer speaks plain text, such as HTTP; is that port plain HTTP, or is plain HTTP being sent to a TLS port?)"
    } else {
        ""
    }
}

#[cfg(test)]
mod text_hint_tests {
    use super::WireError;

    #[test]
    fn a_version_made_of_text_says_the_peer_is_not_speaking_tls() {
        let said = WireError::BadVersion(u16::from_be_bytes(*b"ET")).to_string();
        assert!(
            said.ends_with("is plain HTTP being sent to a TLS port?)"),
            "{said}"
        );
        assert_eq!(
            WireError::BadVersion(0x0403).to_string(),
            "bad record version 0x0403"
        );
    }
}
