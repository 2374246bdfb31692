//! Errors of record protection and key derivation.

use mbx_wire::WireError;

/// Why a record could not be protected or opened, or keys could not be derived.
///
/// Every variant maps to a fatal alert; `BadRecordMac` deliberately says nothing about which
/// check failed (tag, or a length that cannot hold a tag), so errors are no decryption oracle.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RecordError {
    /// The record is not well formed at the framing level.
    #[error("record framing: {0}")]
    Wire(#[from] WireError),
    /// Authentication failed (or the record is too short to hold the AEAD overhead).
    #[error("bad record MAC")]
    BadRecordMac,
    /// The 64-bit sequence number would wrap: the keys must be replaced first.
    #[error("sequence number exhausted")]
    SequenceExhausted,
    /// The key protected as many records as its AEAD safely allows
    /// ([`Aead::confidentiality_limit`](crate::Aead::confidentiality_limit)): nothing more may
    /// be sealed with it.
    #[error("the key reached its AEAD's confidentiality limit (RFC 8446 §5.5)")]
    KeyUsageLimit,
    /// A plaintext or ciphertext exceeds the protocol's size limit.
    #[error("record overflow")]
    RecordOverflow,
    /// A content type that is not allowed here (outer type of a TLS 1.3 record other than
    /// application_data, a type outside the allowed set, or 0 as TLS 1.3 inner type).
    #[error("unexpected content type")]
    UnexpectedContentType,
    /// A TLS 1.3 inner plaintext made only of zeros: there is no content type (RFC 8446 §5.4).
    #[error("TLS 1.3 inner plaintext has no content type")]
    MissingInnerContentType,
    /// A zero-length fragment of a type that must not be empty (RFC 8446 §5.1, RFC 5246 §6.2.1).
    #[error("empty fragment of a type that must not be empty")]
    EmptyFragment,
    /// The cipher suite is unknown, or not usable with the requested protocol version.
    #[error("unsupported cipher suite 0x{0:04x}")]
    UnsupportedCipherSuite(u16),
    /// Key length does not match the AEAD.
    #[error("bad key length")]
    BadKeyLength,
    /// IV length does not match the AEAD, or the protocol version the keys are used with.
    #[error("bad IV length")]
    BadIvLength,
    /// A secret of the wrong length for the hash / protocol.
    #[error("bad secret length")]
    BadSecretLength,
    /// Padding was requested for TLS 1.2, which has none.
    #[error("padding is only available in TLS 1.3")]
    PaddingNotAllowed,
    /// An explicit nonce was set where there is none (TLS 1.3, ChaCha20) or after the first record.
    #[error("explicit nonces exist only in TLS 1.2 AES-GCM and are fixed before the first record")]
    UnexpectedExplicitNonce,
    /// HKDF-Expand-Label inputs out of range (label/context over 255 bytes, output too long).
    #[error("key derivation input out of range")]
    KeyDerivation,
    /// An earlier open failed; this opener stays unusable (fail closed).
    #[error("record opener is unusable after an earlier failure")]
    Poisoned,
    /// The AEAD implementation refused to seal (cannot happen with valid lengths).
    #[error("encryption failed")]
    EncryptFailed,
}
