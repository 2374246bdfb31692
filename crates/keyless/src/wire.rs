//! The key-server wire protocol as a sans-I/O codec.
//!
//! A message is an 8-byte [`Header`] (`major 1 | minor 0 | body_length u16 | request_id u32`)
//! followed by a body of items `tag u8 | length u16 | value`. This module turns bytes into a typed
//! [`Message`] and back, and [`Deframer`] cuts a byte stream carrying many messages into frames.
//!
//! Decoding errors come in two kinds because the key server must treat them differently:
//! a [`FormatError`] concerns one message whose framing is intact (answer error 0x07, keep the
//! connection), while a [`FrameError`] means the stream itself can no longer be trusted
//! (close the connection).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use mbx_wire::Reader;
use zeroize::{Zeroize, Zeroizing};

/// Protocol major version we speak; a request with another major gets error 0x04.
pub const VERSION_MAJOR: u8 = 1;
/// Protocol minor version we send; receivers ignore the minor.
pub const VERSION_MINOR: u8 = 0;
/// Size of the fixed message header.
pub const HEADER_LEN: usize = 8;
/// Senders pad every message to at least this many bytes (header included), so that responses to
/// one operation all have the same length on the wire (paper §IV-D, length side channel).
pub const MIN_MESSAGE_LEN: usize = 1024;
/// Default maximum body length a receiver accepts before closing the connection. Requests are
/// padded to 1 KiB and carry at most a 512-byte RSA-4096 block or a short TLS signing input, so
/// 16 KiB leaves ample room while bounding what one peer can make us buffer.
pub const DEFAULT_MAX_BODY_LEN: usize = 16 * 1024;

/// Item tags (spec table "Body").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Tag {
    /// SHA-256 of the upper-case hex text of the RSA modulus (32 bytes).
    CertificateDigest = 0x01,
    /// UTF-8 server name.
    Sni = 0x02,
    /// Client IP address (4 or 16 bytes).
    ClientIp = 0x03,
    /// Subject key identifier (20 bytes, RFC 5280 method 1).
    Ski = 0x04,
    /// Server IP address (4 or 16 bytes).
    ServerIp = 0x05,
    /// Certificate id (string).
    CertificateId = 0x06,
    /// Operation code (1 byte).
    Opcode = 0x11,
    /// Operation input or output.
    Payload = 0x12,
    /// Custom function name (string).
    CustomFunctionName = 0x13,
    /// Extra bytes.
    Extra = 0x14,
    /// Tracing span context.
    TracingSpanContext = 0x15,
    /// Request context (a JSON object; carried, not interpreted).
    RequestContext = 0x16,
    /// Compliance region (1 byte).
    ComplianceRegion = 0x17,
    /// Padding: zeros, ignored by receivers.
    Padding = 0x20,
}

impl Tag {
    /// Every known tag, in numeric order.
    pub const ALL: [Tag; 14] = [
        Tag::CertificateDigest,
        Tag::Sni,
        Tag::ClientIp,
        Tag::Ski,
        Tag::ServerIp,
        Tag::CertificateId,
        Tag::Opcode,
        Tag::Payload,
        Tag::CustomFunctionName,
        Tag::Extra,
        Tag::TracingSpanContext,
        Tag::RequestContext,
        Tag::ComplianceRegion,
        Tag::Padding,
    ];

    /// The tag's byte on the wire.
    pub fn to_u8(self) -> u8 {
        self as u8
    }

    /// The known tag for `byte`, or `None` for a tag receivers skip.
    pub fn from_u8(byte: u8) -> Option<Tag> {
        Tag::ALL.into_iter().find(|t| t.to_u8() == byte)
    }
}

/// Operation codes (spec table "Opcodes").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Opcode {
    /// RSA decrypt: returns the raw block with its padding in place.
    RsaDecrypt = 0x01,
    /// RSA PKCS#1 v1.5 sign of a 36-byte MD5‖SHA-1 digest, no DigestInfo.
    RsaSignMd5Sha1 = 0x02,
    /// RSA PKCS#1 v1.5 sign of a SHA-1 digest.
    RsaSignSha1 = 0x03,
    /// RSA PKCS#1 v1.5 sign of a SHA-224 digest.
    RsaSignSha224 = 0x04,
    /// RSA PKCS#1 v1.5 sign of a SHA-256 digest.
    RsaSignSha256 = 0x05,
    /// RSA PKCS#1 v1.5 sign of a SHA-384 digest.
    RsaSignSha384 = 0x06,
    /// RSA PKCS#1 v1.5 sign of a SHA-512 digest.
    RsaSignSha512 = 0x07,
    /// ECDSA sign of a 36-byte MD5‖SHA-1 digest (DER signature).
    EcdsaSignMd5Sha1 = 0x12,
    /// ECDSA sign of a SHA-1 digest.
    EcdsaSignSha1 = 0x13,
    /// ECDSA sign of a SHA-224 digest.
    EcdsaSignSha224 = 0x14,
    /// ECDSA sign of a SHA-256 digest.
    EcdsaSignSha256 = 0x15,
    /// ECDSA sign of a SHA-384 digest.
    EcdsaSignSha384 = 0x16,
    /// ECDSA sign of a SHA-512 digest.
    EcdsaSignSha512 = 0x17,
    /// Ed25519 sign; the payload is the whole message.
    Ed25519Sign = 0x18,
    /// Seal (not supported: error 0x05).
    Seal = 0x21,
    /// Unseal (not supported: error 0x05).
    Unseal = 0x22,
    /// RPC (not supported: error 0x05).
    Rpc = 0x23,
    /// Custom function (not supported: error 0x05).
    Custom = 0x24,
    /// RSA-PSS sign of a SHA-256 digest, salt length 32.
    RsaPssSignSha256 = 0x35,
    /// RSA-PSS sign of a SHA-384 digest, salt length 48.
    RsaPssSignSha384 = 0x36,
    /// RSA-PSS sign of a SHA-512 digest, salt length 64.
    RsaPssSignSha512 = 0x37,
    /// Successful response.
    Response = 0xF0,
    /// Ping: the payload is echoed in a pong.
    Ping = 0xF1,
    /// Pong: answer to a ping.
    Pong = 0xF2,
    /// Error response; the payload is one [`ErrorCode`] byte.
    Error = 0xFF,
}

impl Opcode {
    /// Every known opcode, in numeric order.
    pub const ALL: [Opcode; 25] = [
        Opcode::RsaDecrypt,
        Opcode::RsaSignMd5Sha1,
        Opcode::RsaSignSha1,
        Opcode::RsaSignSha224,
        Opcode::RsaSignSha256,
        Opcode::RsaSignSha384,
        Opcode::RsaSignSha512,
        Opcode::EcdsaSignMd5Sha1,
        Opcode::EcdsaSignSha1,
        Opcode::EcdsaSignSha224,
        Opcode::EcdsaSignSha256,
        Opcode::EcdsaSignSha384,
        Opcode::EcdsaSignSha512,
        Opcode::Ed25519Sign,
        Opcode::Seal,
        Opcode::Unseal,
        Opcode::Rpc,
        Opcode::Custom,
        Opcode::RsaPssSignSha256,
        Opcode::RsaPssSignSha384,
        Opcode::RsaPssSignSha512,
        Opcode::Response,
        Opcode::Ping,
        Opcode::Pong,
        Opcode::Error,
    ];

    /// The opcode's byte on the wire.
    pub fn to_u8(self) -> u8 {
        self as u8
    }

    /// The known opcode for `byte`.
    pub fn from_u8(byte: u8) -> Option<Opcode> {
        Opcode::ALL.into_iter().find(|o| o.to_u8() == byte)
    }

    /// Opcodes that only a key server sends; a request carrying one gets error 0x06.
    pub fn is_response(self) -> bool {
        matches!(self, Opcode::Response | Opcode::Pong | Opcode::Error)
    }
}

/// Error bytes carried in the payload of an [`Opcode::Error`] response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum ErrorCode {
    /// No error.
    None = 0x00,
    /// The private-key operation failed.
    CryptoFailure = 0x01,
    /// No such key, or the edge is not authorized for it (the two are indistinguishable).
    KeyNotFound = 0x02,
    /// Read error.
    ReadError = 0x03,
    /// The request's major version is not 1.
    VersionMismatch = 0x04,
    /// Unknown or unsupported opcode, or an opcode the key cannot perform.
    BadOpcode = 0x05,
    /// A response opcode was sent as a request.
    UnexpectedOpcode = 0x06,
    /// Malformed body or wrong input length.
    FormatError = 0x07,
    /// Internal error.
    Internal = 0x08,
    /// Certificate not found.
    CertNotFound = 0x09,
    /// Expired.
    Expired = 0x0A,
    /// Remote configuration.
    RemoteConfiguration = 0x0B,
}

impl ErrorCode {
    /// Every error code, in numeric order.
    pub const ALL: [ErrorCode; 12] = [
        ErrorCode::None,
        ErrorCode::CryptoFailure,
        ErrorCode::KeyNotFound,
        ErrorCode::ReadError,
        ErrorCode::VersionMismatch,
        ErrorCode::BadOpcode,
        ErrorCode::UnexpectedOpcode,
        ErrorCode::FormatError,
        ErrorCode::Internal,
        ErrorCode::CertNotFound,
        ErrorCode::Expired,
        ErrorCode::RemoteConfiguration,
    ];

    /// The error's byte on the wire.
    pub fn to_u8(self) -> u8 {
        self as u8
    }

    /// The known error code for `byte`.
    pub fn from_u8(byte: u8) -> Option<ErrorCode> {
        ErrorCode::ALL.into_iter().find(|e| e.to_u8() == byte)
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let text = match self {
            ErrorCode::None => "no error",
            ErrorCode::CryptoFailure => "cryptography failure",
            ErrorCode::KeyNotFound => "key not found",
            ErrorCode::ReadError => "read error",
            ErrorCode::VersionMismatch => "version mismatch",
            ErrorCode::BadOpcode => "bad opcode",
            ErrorCode::UnexpectedOpcode => "unexpected opcode",
            ErrorCode::FormatError => "format error",
            ErrorCode::Internal => "internal error",
            ErrorCode::CertNotFound => "certificate not found",
            ErrorCode::Expired => "expired",
            ErrorCode::RemoteConfiguration => "remote configuration",
        };
        write!(f, "{text} (0x{:02x})", self.to_u8())
    }
}

/// The 8-byte message header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Major version (1).
    pub major: u8,
    /// Minor version (0).
    pub minor: u8,
    /// Length of the body that follows.
    pub body_length: u16,
    /// Chosen by the client; echoed in the response.
    pub request_id: u32,
}

impl Header {
    /// Parses the first 8 bytes of `bytes`; never fails on values, only on a short input.
    pub fn parse(bytes: &[u8]) -> Option<Header> {
        let mut r = Reader::new(bytes);
        Some(Header {
            major: r.u8().ok()?,
            minor: r.u8().ok()?,
            body_length: r.u16().ok()?,
            request_id: r.u32().ok()?,
        })
    }

    /// The header's 8 bytes.
    pub fn to_bytes(&self) -> [u8; HEADER_LEN] {
        let l = self.body_length.to_be_bytes();
        let id = self.request_id.to_be_bytes();
        [
            self.major, self.minor, l[0], l[1], id[0], id[1], id[2], id[3],
        ]
    }
}

/// A malformed body: the message is answered with error 0x07 and the connection stays open.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    /// An item header or value runs past the end of the body.
    #[error("item truncated")]
    Truncated,
    /// A known tag appears twice.
    #[error("tag 0x{0:02x} repeated")]
    RepeatedTag(u8),
    /// A fixed-length item has the wrong length.
    #[error("tag 0x{tag:02x} has length {len}")]
    BadLength {
        /// The item's tag.
        tag: u8,
        /// Its length.
        len: usize,
    },
    /// A string item is not UTF-8.
    #[error("tag 0x{0:02x} is not UTF-8")]
    NotUtf8(u8),
    /// The header's body length does not match the bytes given.
    #[error("body length {declared} but {actual} bytes follow the header")]
    LengthMismatch {
        /// Length in the header.
        declared: usize,
        /// Bytes present.
        actual: usize,
    },
}

/// A broken stream: the connection must be closed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The header announces a body longer than the configured maximum.
    #[error("body length {len} exceeds the maximum {max}")]
    BodyTooLong {
        /// Announced length.
        len: usize,
        /// Configured maximum.
        max: usize,
    },
    /// Fewer than 8 bytes: no header to answer.
    #[error("message shorter than its 8-byte header")]
    NoHeader,
    /// The stream already failed; nothing after the failure is read.
    #[error("stream already failed")]
    Poisoned,
}

/// Errors when encoding a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    /// An item value is longer than 65535 bytes.
    #[error("item 0x{tag:02x} of {len} bytes does not fit a u16 length")]
    ItemTooLong {
        /// The item's tag.
        tag: u8,
        /// Its length.
        len: usize,
    },
    /// The body is longer than 65535 bytes.
    #[error("body of {0} bytes does not fit a u16 length")]
    BodyTooLong(usize),
}

/// The decoded body: one optional field per known tag. Padding is not kept.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Body {
    /// 0x01: SHA-256 of the upper-case hex RSA modulus.
    pub certificate_digest: Option<[u8; 32]>,
    /// 0x02: server name.
    pub sni: Option<String>,
    /// 0x03: client IP.
    pub client_ip: Option<IpAddr>,
    /// 0x04: subject key identifier.
    pub ski: Option<[u8; 20]>,
    /// 0x05: server IP.
    pub server_ip: Option<IpAddr>,
    /// 0x06: certificate id.
    pub certificate_id: Option<String>,
    /// 0x11: opcode byte, kept raw so that an unknown value can be answered with error 0x05
    /// (see [`Opcode::from_u8`]).
    pub opcode: Option<u8>,
    /// 0x12: operation input or output.
    pub payload: Option<Vec<u8>>,
    /// 0x13: custom function name.
    pub custom_function_name: Option<String>,
    /// 0x14: extra bytes.
    pub extra: Option<Vec<u8>>,
    /// 0x15: tracing span context.
    pub tracing_span_context: Option<Vec<u8>>,
    /// 0x16: request context (JSON text; not interpreted by this crate).
    pub request_context: Option<Vec<u8>>,
    /// 0x17: compliance region.
    pub compliance_region: Option<u8>,
}

/// Payloads carry RSA blocks that hold premaster secrets: wipe them when the body goes away.
impl Drop for Body {
    fn drop(&mut self) {
        if let Some(p) = self.payload.as_mut() {
            p.zeroize();
        }
    }
}

impl Body {
    /// A body with just an opcode and a payload.
    pub fn op(opcode: Opcode, payload: impl Into<Vec<u8>>) -> Body {
        let mut body = Body::default();
        body.opcode = Some(opcode.to_u8());
        body.payload = Some(payload.into());
        body
    }

    /// The error response body for `code`.
    pub fn error(code: ErrorCode) -> Body {
        Body::op(Opcode::Error, vec![code.to_u8()])
    }

    /// The known opcode, if the item is present and known.
    pub fn known_opcode(&self) -> Option<Opcode> {
        self.opcode.and_then(Opcode::from_u8)
    }
}

/// A whole message: request id and body. The version is implied (we always send 1.0).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// Request id, echoed by responses.
    pub request_id: u32,
    /// The body.
    pub body: Body,
}

fn put_item(out: &mut Vec<u8>, tag: Tag, value: &[u8]) -> Result<(), EncodeError> {
    let len = u16::try_from(value.len()).map_err(|_| EncodeError::ItemTooLong {
        tag: tag.to_u8(),
        len: value.len(),
    })?;
    out.push(tag.to_u8());
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(value);
    Ok(())
}

fn ip_bytes(ip: &IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(v4) => v4.octets().to_vec(),
        IpAddr::V6(v6) => v6.octets().to_vec(),
    }
}

/// Encodes the body's items in tag order, without padding.
pub fn encode_body(body: &Body) -> Result<Vec<u8>, EncodeError> {
    let mut out = Vec::with_capacity(MIN_MESSAGE_LEN);
    encode_body_into(body, &mut out)?;
    Ok(out)
}

/// Appends the body's items to `out`; on error, part of them may have been appended.
fn encode_body_into(body: &Body, out: &mut Vec<u8>) -> Result<(), EncodeError> {
    let out = &mut *out;
    if let Some(v) = &body.certificate_digest {
        put_item(out, Tag::CertificateDigest, v)?;
    }
    if let Some(v) = &body.sni {
        put_item(out, Tag::Sni, v.as_bytes())?;
    }
    if let Some(v) = &body.client_ip {
        put_item(out, Tag::ClientIp, &ip_bytes(v))?;
    }
    if let Some(v) = &body.ski {
        put_item(out, Tag::Ski, v)?;
    }
    if let Some(v) = &body.server_ip {
        put_item(out, Tag::ServerIp, &ip_bytes(v))?;
    }
    if let Some(v) = &body.certificate_id {
        put_item(out, Tag::CertificateId, v.as_bytes())?;
    }
    if let Some(v) = body.opcode {
        put_item(out, Tag::Opcode, &[v])?;
    }
    if let Some(v) = &body.payload {
        put_item(out, Tag::Payload, v)?;
    }
    if let Some(v) = &body.custom_function_name {
        put_item(out, Tag::CustomFunctionName, v.as_bytes())?;
    }
    if let Some(v) = &body.extra {
        put_item(out, Tag::Extra, v)?;
    }
    if let Some(v) = &body.tracing_span_context {
        put_item(out, Tag::TracingSpanContext, v)?;
    }
    if let Some(v) = &body.request_context {
        put_item(out, Tag::RequestContext, v)?;
    }
    if let Some(v) = body.compliance_region {
        put_item(out, Tag::ComplianceRegion, &[v])?;
    }
    Ok(())
}

/// Encodes a whole message (version 1.0), padded with a 0x20 item to at least
/// [`MIN_MESSAGE_LEN`] bytes. Bodies of equal length give messages of equal length.
pub fn encode(message: &Message) -> Result<Vec<u8>, EncodeError> {
    let mut out = Vec::with_capacity(MIN_MESSAGE_LEN);
    encode_into(message, &mut out)?;
    Ok(out)
}

/// As [`encode`], appending the message to `out` (the key server writes a run of responses into
/// one buffer this way, with no temporary copy of any body). On error `out` is left as it was,
/// and the bytes appended meanwhile are wiped.
pub fn encode_into(message: &Message, out: &mut Vec<u8>) -> Result<(), EncodeError> {
    let start = out.len();
    let result = append_message(message, out, start);
    if result.is_err() {
        if let Some(partial) = out.get_mut(start..) {
            partial.zeroize();
        }
        out.truncate(start);
    }
    result
}

fn append_message(message: &Message, out: &mut Vec<u8>, start: usize) -> Result<(), EncodeError> {
    out.extend_from_slice(&[0u8; HEADER_LEN]);
    encode_body_into(&message.body, out)?;
    let unpadded = out.len() - start;
    if unpadded < MIN_MESSAGE_LEN {
        // The padding item's own 3-byte header counts too; near the limit it overshoots a little.
        let pad = MIN_MESSAGE_LEN.saturating_sub(unpadded + 3);
        let pad_len = u16::try_from(pad).map_err(|_| EncodeError::ItemTooLong {
            tag: Tag::Padding.to_u8(),
            len: pad,
        })?;
        out.push(Tag::Padding.to_u8());
        out.extend_from_slice(&pad_len.to_be_bytes());
        out.resize(out.len() + pad, 0);
    }
    let body_len = out.len() - start - HEADER_LEN;
    let body_length = u16::try_from(body_len).map_err(|_| EncodeError::BodyTooLong(body_len))?;
    let header = Header {
        major: VERSION_MAJOR,
        minor: VERSION_MINOR,
        body_length,
        request_id: message.request_id,
    };
    if let Some(slot) = out.get_mut(start..start + HEADER_LEN) {
        slot.copy_from_slice(&header.to_bytes());
    }
    Ok(())
}

fn set_once<T>(slot: &mut Option<T>, tag: u8, value: T) -> Result<(), FormatError> {
    if slot.is_some() {
        return Err(FormatError::RepeatedTag(tag));
    }
    *slot = Some(value);
    Ok(())
}

fn fixed<const N: usize>(tag: u8, value: &[u8]) -> Result<[u8; N], FormatError> {
    value.try_into().map_err(|_| FormatError::BadLength {
        tag,
        len: value.len(),
    })
}

fn ip(tag: u8, value: &[u8]) -> Result<IpAddr, FormatError> {
    match value.len() {
        4 => Ok(IpAddr::V4(Ipv4Addr::from(fixed::<4>(tag, value)?))),
        16 => Ok(IpAddr::V6(Ipv6Addr::from(fixed::<16>(tag, value)?))),
        len => Err(FormatError::BadLength { tag, len }),
    }
}

fn text(tag: u8, value: &[u8]) -> Result<String, FormatError> {
    String::from_utf8(value.to_vec()).map_err(|_| FormatError::NotUtf8(tag))
}

/// Decodes a body. Unknown tags and padding are skipped; a repeated known tag, a fixed-length item
/// of the wrong length (opcode and compliance region 1, digest 32, SKI 20, IPs 4 or 16) or a
/// string that is not UTF-8 is a [`FormatError`].
pub fn decode_body(bytes: &[u8]) -> Result<Body, FormatError> {
    let mut r = Reader::new(bytes);
    let mut body = Body::default();
    let mut padding_seen = false;
    while !r.is_empty() {
        let tag = r.u8().map_err(|_| FormatError::Truncated)?;
        let value = r.vec_u16().map_err(|_| FormatError::Truncated)?;
        let Some(known) = Tag::from_u8(tag) else {
            continue;
        };
        match known {
            Tag::CertificateDigest => {
                set_once(&mut body.certificate_digest, tag, fixed(tag, value)?)?
            }
            Tag::Sni => set_once(&mut body.sni, tag, text(tag, value)?)?,
            Tag::ClientIp => set_once(&mut body.client_ip, tag, ip(tag, value)?)?,
            Tag::Ski => set_once(&mut body.ski, tag, fixed(tag, value)?)?,
            Tag::ServerIp => set_once(&mut body.server_ip, tag, ip(tag, value)?)?,
            Tag::CertificateId => set_once(&mut body.certificate_id, tag, text(tag, value)?)?,
            Tag::Opcode => {
                let [b] = fixed::<1>(tag, value)?;
                set_once(&mut body.opcode, tag, b)?
            }
            Tag::Payload => set_once(&mut body.payload, tag, value.to_vec())?,
            Tag::CustomFunctionName => {
                set_once(&mut body.custom_function_name, tag, text(tag, value)?)?
            }
            Tag::Extra => set_once(&mut body.extra, tag, value.to_vec())?,
            Tag::TracingSpanContext => {
                set_once(&mut body.tracing_span_context, tag, value.to_vec())?
            }
            Tag::RequestContext => set_once(&mut body.request_context, tag, value.to_vec())?,
            Tag::ComplianceRegion => {
                let [b] = fixed::<1>(tag, value)?;
                set_once(&mut body.compliance_region, tag, b)?
            }
            Tag::Padding => {
                if padding_seen {
                    return Err(FormatError::RepeatedTag(tag));
                }
                padding_seen = true;
            }
        }
    }
    Ok(body)
}

/// One message cut from a stream: its header and its body bytes (not yet decoded, so that the
/// receiver can check the version before looking at the body).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// The header.
    pub header: Header,
    /// Exactly `header.body_length` bytes (zeroized on drop: it may hold an RSA block).
    pub body: Zeroizing<Vec<u8>>,
}

impl Frame {
    /// Splits one complete message (header and body, nothing more) into a frame. The body length
    /// is checked against `max_body_len` from the header alone.
    pub fn from_message(bytes: &[u8], max_body_len: usize) -> Result<Frame, FrameOrFormat> {
        let header = Header::parse(bytes).ok_or(FrameOrFormat::Frame(FrameError::NoHeader))?;
        let len = usize::from(header.body_length);
        if len > max_body_len {
            return Err(FrameOrFormat::Frame(FrameError::BodyTooLong {
                len,
                max: max_body_len,
            }));
        }
        let body = bytes.get(HEADER_LEN..).unwrap_or_default();
        if body.len() != len {
            return Err(FrameOrFormat::Format {
                header,
                error: FormatError::LengthMismatch {
                    declared: len,
                    actual: body.len(),
                },
            });
        }
        Ok(Frame {
            header,
            body: Zeroizing::new(body.to_vec()),
        })
    }

    /// Decodes the body into a message (the version is not checked here).
    pub fn decode(&self) -> Result<Message, FormatError> {
        Ok(Message {
            request_id: self.header.request_id,
            body: decode_body(&self.body)?,
        })
    }
}

/// Either a broken frame (close) or a format error in a message whose header is known (answer).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameOrFormat {
    /// Close the connection.
    #[error(transparent)]
    Frame(#[from] FrameError),
    /// Answer `header.request_id` with error 0x07.
    #[error("request {}: {error}", header.request_id)]
    Format {
        /// The message's header.
        header: Header,
        /// What is wrong.
        error: FormatError,
    },
}

/// Decodes one complete message (header and body). Versions are not checked.
pub fn decode(bytes: &[u8], max_body_len: usize) -> Result<Message, FrameOrFormat> {
    let frame = Frame::from_message(bytes, max_body_len)?;
    frame.decode().map_err(|error| FrameOrFormat::Format {
        header: frame.header,
        error,
    })
}

/// Cuts a byte stream into [`Frame`]s. Push bytes in any split; the body length is checked from
/// the header alone, before any body byte is buffered. Errors are sticky. Buffered bytes are
/// wiped once consumed (when the next push compacts the buffer) and on drop.
#[derive(Debug)]
pub struct Deframer {
    buf: Vec<u8>,
    /// Bytes at the front of `buf` already returned as frames (still to be wiped).
    consumed: usize,
    max_body_len: usize,
    failed: bool,
}

impl Drop for Deframer {
    fn drop(&mut self) {
        self.buf.zeroize();
    }
}

impl Deframer {
    /// A deframer that refuses bodies longer than `max_body_len`.
    pub fn new(max_body_len: usize) -> Deframer {
        Deframer {
            buf: Vec::new(),
            consumed: 0,
            max_body_len,
            failed: false,
        }
    }

    /// Appends bytes read from the stream.
    pub fn push(&mut self, bytes: &[u8]) {
        if self.failed {
            return;
        }
        self.compact();
        crate::wipe::reserve(&mut self.buf, bytes.len());
        self.buf.extend_from_slice(bytes);
    }

    /// Moves the unconsumed bytes to the front and wipes the bytes they leave behind: every
    /// consumed byte is wiped exactly once, and no stale copy of a pending byte stays.
    fn compact(&mut self) {
        if self.consumed == 0 {
            return;
        }
        let len = self.buf.len();
        let rest = len - self.consumed;
        self.buf.copy_within(self.consumed.., 0);
        if let Some(stale) = self.buf.get_mut(rest..) {
            crate::wipe::wipe(stale);
        }
        self.buf.truncate(rest);
        self.consumed = 0;
    }

    /// Bytes buffered but not yet returned as a frame.
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.consumed
    }

    /// The next whole frame, `Ok(None)` if more bytes are needed.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, FrameError> {
        if self.failed {
            return Err(FrameError::Poisoned);
        }
        let Some(header) = Header::parse(self.buf.get(self.consumed..).unwrap_or_default()) else {
            return Ok(None);
        };
        let len = usize::from(header.body_length);
        if len > self.max_body_len {
            self.failed = true;
            self.buf.zeroize();
            self.consumed = 0;
            return Err(FrameError::BodyTooLong {
                len,
                max: self.max_body_len,
            });
        }
        let body_start = self.consumed + HEADER_LEN;
        let Some(body) = self.buf.get(body_start..body_start + len) else {
            return Ok(None);
        };
        let frame = Frame {
            header,
            body: Zeroizing::new(body.to_vec()),
        };
        self.consumed += HEADER_LEN + len;
        if self.consumed == self.buf.len() {
            // Everything consumed: wipe now, so an idle connection holds no request bytes.
            self.compact();
        }
        Ok(Some(frame))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn item(tag: u8, value: &[u8]) -> Vec<u8> {
        let mut v = vec![tag];
        v.extend_from_slice(&(value.len() as u16).to_be_bytes());
        v.extend_from_slice(value);
        v
    }

    fn message(body: &[u8]) -> Vec<u8> {
        let mut v = Header {
            major: 1,
            minor: 0,
            body_length: body.len() as u16,
            request_id: 7,
        }
        .to_bytes()
        .to_vec();
        v.extend_from_slice(body);
        v
    }

    #[test]
    fn encode_into_appends_what_encode_returns_and_leaves_out_alone_on_error() {
        let ok = Message {
            request_id: 7,
            body: Body::op(Opcode::Pong, b"pong".to_vec()),
        };
        let mut out = b"prefix".to_vec();
        encode_into(&ok, &mut out).unwrap();
        encode_into(&ok, &mut out).unwrap();
        let one = encode(&ok).unwrap();
        assert_eq!(out.len(), 6 + 2 * one.len());
        assert_eq!(&out[..6], b"prefix");
        assert_eq!(&out[6..6 + one.len()], &one[..]);
        assert_eq!(&out[6 + one.len()..], &one[..]);

        // An item too long for its u16 length fails after the header and earlier items went in.
        let mut too_long = Body::op(Opcode::Response, vec![0xEE; 70_000]);
        too_long.sni = Some("site.test".into());
        let before = out.clone();
        assert!(encode_into(
            &Message {
                request_id: 8,
                body: too_long,
            },
            &mut out,
        )
        .is_err());
        assert_eq!(out, before);
    }

    #[test]
    fn numbers_match_the_spec_tables() {
        let tags: Vec<u8> = Tag::ALL.iter().map(|t| t.to_u8()).collect();
        assert_eq!(
            tags,
            [0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x20]
        );
        let ops: Vec<u8> = Opcode::ALL.iter().map(|o| o.to_u8()).collect();
        assert_eq!(
            ops,
            [
                0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18,
                0x21, 0x22, 0x23, 0x24, 0x35, 0x36, 0x37, 0xF0, 0xF1, 0xF2, 0xFF
            ]
        );
        let errs: Vec<u8> = ErrorCode::ALL.iter().map(|e| e.to_u8()).collect();
        assert_eq!(errs, (0x00..=0x0B).collect::<Vec<u8>>());
        for b in 0..=255u8 {
            if let Some(t) = Tag::from_u8(b) {
                assert_eq!(t.to_u8(), b);
            }
            if let Some(o) = Opcode::from_u8(b) {
                assert_eq!(o.to_u8(), b);
            }
            if let Some(e) = ErrorCode::from_u8(b) {
                assert_eq!(e.to_u8(), b);
            }
        }
        assert!(Opcode::Response.is_response() && Opcode::Pong.is_response());
        assert!(Opcode::Error.is_response() && !Opcode::Ping.is_response());
    }

    #[test]
    fn header_layout() {
        let h = Header {
            major: 1,
            minor: 0,
            body_length: 0x0102,
            request_id: 0x0A0B0C0D,
        };
        assert_eq!(h.to_bytes(), [1, 0, 1, 2, 0x0A, 0x0B, 0x0C, 0x0D]);
        assert_eq!(Header::parse(&h.to_bytes()), Some(h));
        assert_eq!(Header::parse(&[1, 0, 0]), None);
    }

    #[test]
    fn encoder_pads_to_1024_with_item_0x20() {
        let msg = Message {
            request_id: 9,
            body: Body::op(Opcode::Ping, b"hi".to_vec()),
        };
        let bytes = encode(&msg).unwrap();
        assert_eq!(bytes.len(), MIN_MESSAGE_LEN);
        // opcode item (4) + payload item (5), then padding.
        assert_eq!(bytes[HEADER_LEN + 9], 0x20);
        assert!(bytes[HEADER_LEN + 12..].iter().all(|&b| b == 0));
        assert_eq!(decode(&bytes, DEFAULT_MAX_BODY_LEN).unwrap(), msg);
        // A message already over the minimum is not padded.
        let big = Message {
            request_id: 1,
            body: Body::op(Opcode::Ping, vec![1u8; 2000]),
        };
        let bytes = encode(&big).unwrap();
        assert_eq!(bytes.len(), HEADER_LEN + 4 + 3 + 2000);
        // Every body size near the limit still ends up at least 1024 bytes.
        for n in 990..1030 {
            let m = Message {
                request_id: 1,
                body: Body::op(Opcode::Ping, vec![0u8; n]),
            };
            let b = encode(&m).unwrap();
            assert!(b.len() >= MIN_MESSAGE_LEN, "{n}");
            assert_eq!(decode(&b, DEFAULT_MAX_BODY_LEN).unwrap(), m);
        }
    }

    #[test]
    fn unknown_tags_are_skipped_and_any_padding_accepted() {
        let mut body = item(0x11, &[0xF1]);
        body.extend(item(0x7E, b"whatever"));
        body.extend(item(0x20, b"not zeros"));
        body.extend(item(0x7E, b"again"));
        let m = decode(&message(&body), DEFAULT_MAX_BODY_LEN).unwrap();
        assert_eq!(m.body.opcode, Some(0xF1));
        assert_eq!(m.request_id, 7);
    }

    fn format_error(body: &[u8]) -> FormatError {
        match decode(&message(body), DEFAULT_MAX_BODY_LEN) {
            Err(FrameOrFormat::Format { header, error }) => {
                assert_eq!(header.request_id, 7);
                error
            }
            other => panic!("expected a format error, got {other:?}"),
        }
    }

    #[test]
    fn every_repeated_known_tag_is_a_format_error() {
        let values: [(u8, &[u8]); 14] = [
            (0x01, &[0u8; 32]),
            (0x02, b"a"),
            (0x03, &[1, 2, 3, 4]),
            (0x04, &[0u8; 20]),
            (0x05, &[1, 2, 3, 4]),
            (0x06, b"id"),
            (0x11, &[1]),
            (0x12, b"p"),
            (0x13, b"f"),
            (0x14, b"x"),
            (0x15, b"s"),
            (0x16, b"{}"),
            (0x17, &[1]),
            (0x20, &[0, 0]),
        ];
        for (tag, value) in values {
            let once = item(tag, value);
            assert!(decode_body(&once).is_ok(), "tag {tag:#x} once");
            let mut twice = once.clone();
            twice.extend(item(0x7E, b""));
            twice.extend(once);
            assert_eq!(format_error(&twice), FormatError::RepeatedTag(tag));
        }
        // Repeated unknown tags are fine.
        let mut body = item(0x7E, b"");
        body.extend(item(0x7E, b""));
        assert!(decode_body(&body).is_ok());
    }

    #[test]
    fn opcode_of_wrong_length_is_a_format_error() {
        for len in [0usize, 2, 3] {
            assert_eq!(
                format_error(&item(0x11, &vec![1; len])),
                FormatError::BadLength { tag: 0x11, len }
            );
        }
    }

    #[test]
    fn ip_of_wrong_length_is_a_format_error() {
        for tag in [0x03u8, 0x05] {
            for len in [0usize, 3, 5, 15, 17] {
                assert_eq!(
                    format_error(&item(tag, &vec![1; len])),
                    FormatError::BadLength { tag, len }
                );
            }
            assert_eq!(
                decode_body(&item(tag, &[10, 0, 0, 1]))
                    .unwrap()
                    .client_ip
                    .is_some(),
                tag == 0x03
            );
            assert!(decode_body(&item(tag, &[0; 16])).is_ok());
        }
    }

    #[test]
    fn other_fixed_items_and_strings_are_checked() {
        assert_eq!(
            format_error(&item(0x01, &[0; 31])),
            FormatError::BadLength { tag: 0x01, len: 31 }
        );
        assert_eq!(
            format_error(&item(0x04, &[0; 21])),
            FormatError::BadLength { tag: 0x04, len: 21 }
        );
        assert_eq!(
            format_error(&item(0x17, &[])),
            FormatError::BadLength { tag: 0x17, len: 0 }
        );
        for tag in [0x02u8, 0x06, 0x13] {
            assert_eq!(
                format_error(&item(tag, &[0xFF, 0xFE])),
                FormatError::NotUtf8(tag)
            );
        }
    }

    #[test]
    fn truncated_items_are_format_errors() {
        assert_eq!(format_error(&[0x11]), FormatError::Truncated);
        assert_eq!(format_error(&[0x11, 0x00]), FormatError::Truncated);
        assert_eq!(
            format_error(&[0x12, 0x00, 0x05, 1, 2]),
            FormatError::Truncated
        );
    }

    #[test]
    fn header_and_length_mismatch() {
        assert_eq!(
            decode(&[1, 0, 0], DEFAULT_MAX_BODY_LEN),
            Err(FrameOrFormat::Frame(FrameError::NoHeader))
        );
        let mut m = message(&item(0x11, &[1]));
        m.push(0);
        assert!(matches!(
            decode(&m, DEFAULT_MAX_BODY_LEN),
            Err(FrameOrFormat::Format {
                error: FormatError::LengthMismatch {
                    declared: 4,
                    actual: 5
                },
                ..
            })
        ));
    }

    #[test]
    fn oversized_body_is_a_frame_error_not_a_format_error() {
        let m = message(&[0x20; 100]);
        assert!(Frame::from_message(&m, 100).is_ok());
        assert_eq!(
            decode(&m, 99),
            Err(FrameOrFormat::Frame(FrameError::BodyTooLong {
                len: 100,
                max: 99
            }))
        );
    }

    #[test]
    fn deframer_checks_length_before_buffering_and_is_sticky() {
        let mut d = Deframer::new(64);
        d.push(&[1, 0, 0xFF, 0xFF, 0, 0, 0, 1]);
        assert_eq!(
            d.next_frame(),
            Err(FrameError::BodyTooLong {
                len: 0xFFFF,
                max: 64
            })
        );
        d.push(&message(&item(0x11, &[0xF1])));
        assert_eq!(d.next_frame(), Err(FrameError::Poisoned));
        assert_eq!(d.buffered(), 0);
    }

    #[test]
    fn deframer_splits_a_stream_at_any_point() {
        let msgs: Vec<Message> = (0..5)
            .map(|i| Message {
                request_id: i,
                body: Body::op(Opcode::Ping, vec![i as u8; i as usize * 300]),
            })
            .collect();
        let stream: Vec<u8> = msgs.iter().flat_map(|m| encode(m).unwrap()).collect();
        for chunk in [1usize, 7, 1000, stream.len()] {
            let mut d = Deframer::new(DEFAULT_MAX_BODY_LEN);
            let mut out = Vec::new();
            for piece in stream.chunks(chunk) {
                d.push(piece);
                while let Some(f) = d.next_frame().unwrap() {
                    out.push(f.decode().unwrap());
                }
            }
            assert_eq!(out, msgs);
            assert_eq!(d.buffered(), 0);
        }
    }

    fn arb_ip() -> impl Strategy<Value = IpAddr> {
        prop_oneof![
            any::<[u8; 4]>().prop_map(|b| IpAddr::V4(Ipv4Addr::from(b))),
            any::<[u8; 16]>().prop_map(|b| IpAddr::V6(Ipv6Addr::from(b))),
        ]
    }

    fn arb_bytes() -> impl Strategy<Value = Vec<u8>> {
        proptest::collection::vec(any::<u8>(), 0..600)
    }

    prop_compose! {
        fn arb_body()(
            certificate_digest in proptest::option::of(any::<[u8; 32]>()),
            sni in proptest::option::of(".{0,40}"),
            client_ip in proptest::option::of(arb_ip()),
            ski in proptest::option::of(any::<[u8; 20]>()),
            server_ip in proptest::option::of(arb_ip()),
            certificate_id in proptest::option::of(".{0,20}"),
            opcode in proptest::option::of(any::<u8>()),
            payload in proptest::option::of(arb_bytes()),
            custom_function_name in proptest::option::of(".{0,20}"),
            extra in proptest::option::of(arb_bytes()),
            tracing_span_context in proptest::option::of(arb_bytes()),
            request_context in proptest::option::of(arb_bytes()),
            compliance_region in proptest::option::of(any::<u8>()),
        ) -> Body {
            Body {
                certificate_digest, sni, client_ip, ski, server_ip, certificate_id, opcode,
                payload, custom_function_name, extra, tracing_span_context, request_context,
                compliance_region,
            }
        }
    }

    proptest! {
        #[test]
        fn decode_encode_round_trip(request_id in any::<u32>(), body in arb_body()) {
            let msg = Message { request_id, body };
            let bytes = encode(&msg).unwrap();
            prop_assert!(bytes.len() >= MIN_MESSAGE_LEN);
            prop_assert_eq!(decode(&bytes, usize::from(u16::MAX)).unwrap(), msg);
        }

        #[test]
        fn decoder_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..2000)) {
            let _ = decode(&bytes, DEFAULT_MAX_BODY_LEN);
            let _ = decode_body(&bytes);
            let mut d = Deframer::new(512);
            d.push(&bytes);
            while let Ok(Some(_)) = d.next_frame() {}
        }
    }
}
