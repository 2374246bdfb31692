//! ClientHello and ServerHello parsing (RFC 8446 §4.1.2, §4.1.3; RFC 5246 §7.4.1).
//!
//! The parsers borrow from the input and return extensions as raw `(type, data)` slices:
//! mbTLS and maTLS add their own extensions, and callers interpret what they know. Structure is
//! validated strictly: overrunning lengths, trailing bytes and duplicated extensions are errors.

use crate::codec::Reader;
use crate::error::WireError;
use crate::handshake::{parse_handshake, HandshakeType, DEFAULT_MAX_HANDSHAKE_LEN};

/// Extension type numbers (IANA "TLS ExtensionType Values").
pub mod extension_type {
    pub const SERVER_NAME: u16 = 0;
    pub const STATUS_REQUEST: u16 = 5;
    pub const SUPPORTED_GROUPS: u16 = 10;
    pub const EC_POINT_FORMATS: u16 = 11;
    pub const SIGNATURE_ALGORITHMS: u16 = 13;
    pub const ALPN: u16 = 16;
    pub const SIGNED_CERTIFICATE_TIMESTAMP: u16 = 18;
    pub const ENCRYPT_THEN_MAC: u16 = 22;
    pub const EXTENDED_MASTER_SECRET: u16 = 23;
    pub const SESSION_TICKET: u16 = 35;
    pub const PRE_SHARED_KEY: u16 = 41;
    pub const EARLY_DATA: u16 = 42;
    pub const SUPPORTED_VERSIONS: u16 = 43;
    pub const COOKIE: u16 = 44;
    pub const PSK_KEY_EXCHANGE_MODES: u16 = 45;
    pub const SIGNATURE_ALGORITHMS_CERT: u16 = 50;
    pub const KEY_SHARE: u16 = 51;
    pub const RENEGOTIATION_INFO: u16 = 0xff01;
}

/// The ServerHello.random of a HelloRetryRequest: SHA-256("HelloRetryRequest") (RFC 8446 §4.1.3).
pub const HELLO_RETRY_REQUEST_RANDOM: [u8; 32] = [
    0xcf, 0x21, 0xad, 0x74, 0xe5, 0x9a, 0x61, 0x11, 0xbe, 0x1d, 0x8c, 0x02, 0x1e, 0x65, 0xb8, 0x91,
    0xc2, 0xa2, 0x11, 0x16, 0x7a, 0xbb, 0x8c, 0x5e, 0x07, 0x9e, 0x09, 0xe2, 0xc8, 0xa8, 0x33, 0x9c,
];

/// One extension as it appears on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extension<'a> {
    pub typ: u16,
    pub data: &'a [u8],
}

/// Parse `Extension extensions<0..2^16-1>` from the rest of `r`, which must hold exactly that
/// vector. Rejects duplicates.
fn parse_extensions<'a>(r: &mut Reader<'a>) -> Result<Vec<Extension<'a>>, WireError> {
    let mut list = r.sub_u16()?;
    r.finish()?;
    let mut out = Vec::new();
    while !list.is_empty() {
        let typ = list.u16()?;
        let data = list.vec_u16()?;
        out.push(Extension { typ, data });
    }
    // Sort a copy of the types rather than comparing pairwise: the list can hold ~16k entries.
    let mut types: Vec<u16> = out.iter().map(|e| e.typ).collect();
    types.sort_unstable();
    if let Some(w) = types.windows(2).find(|w| w.first() == w.get(1)) {
        return Err(WireError::DuplicateExtension(
            w.first().copied().unwrap_or(0),
        ));
    }
    Ok(out)
}

/// Big-endian u16s from a slice of even length (a trailing odd byte is ignored; callers check).
fn be_u16s(data: &[u8]) -> Vec<u16> {
    data.chunks_exact(2)
        .filter_map(|c| <[u8; 2]>::try_from(c).ok())
        .map(u16::from_be_bytes)
        .collect()
}

fn find_extension<'a>(exts: &[Extension<'a>], typ: u16) -> Option<&'a [u8]> {
    exts.iter().find(|e| e.typ == typ).map(|e| e.data)
}

/// A parsed ClientHello. Borrowed from the message body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientHello<'a> {
    pub legacy_version: u16,
    pub random: [u8; 32],
    pub session_id: &'a [u8],
    pub cipher_suites: Vec<u16>,
    pub compression_methods: &'a [u8],
    pub extensions: Vec<Extension<'a>>,
}

impl<'a> ClientHello<'a> {
    /// Parse a ClientHello body (the bytes after the 4-byte handshake header).
    pub fn parse(body: &'a [u8]) -> Result<ClientHello<'a>, WireError> {
        let mut r = Reader::new(body);
        let legacy_version = r.u16()?;
        let random = r.array::<32>()?;
        let session_id = r.vec_u8()?;
        if session_id.len() > 32 {
            return Err(WireError::Malformed("session_id longer than 32 bytes"));
        }
        let suites = r.vec_u16()?;
        if suites.is_empty() || suites.len() % 2 != 0 {
            return Err(WireError::Malformed("cipher_suites length"));
        }
        let cipher_suites = be_u16s(suites);
        let compression_methods = r.vec_u8()?;
        if compression_methods.is_empty() {
            return Err(WireError::Malformed("empty compression_methods"));
        }
        // Extensions are optional before TLS 1.2 (RFC 5246 §7.4.1.2): absent means none.
        let extensions = if r.is_empty() {
            Vec::new()
        } else {
            parse_extensions(&mut r)?
        };
        Ok(ClientHello {
            legacy_version,
            random,
            session_id,
            cipher_suites,
            compression_methods,
            extensions,
        })
    }

    /// Parse a complete handshake message (header included) that must be a ClientHello.
    pub fn parse_message(raw: &'a [u8]) -> Result<ClientHello<'a>, WireError> {
        let (typ, body) = parse_handshake(raw, DEFAULT_MAX_HANDSHAKE_LEN)?;
        if typ != HandshakeType::CLIENT_HELLO {
            return Err(WireError::UnexpectedMessage {
                expected: HandshakeType::CLIENT_HELLO.0,
                got: typ.0,
            });
        }
        Self::parse(body)
    }

    /// The data of extension `typ`, if present.
    pub fn extension(&self, typ: u16) -> Option<&'a [u8]> {
        find_extension(&self.extensions, typ)
    }

    /// The `host_name` from server_name (RFC 6066 §3), if the extension is present and names a
    /// host. The name must be ASCII (IDNs are sent as A-labels).
    pub fn server_name(&self) -> Result<Option<&'a str>, WireError> {
        let Some(data) = self.extension(extension_type::SERVER_NAME) else {
            return Ok(None);
        };
        let mut r = Reader::new(data);
        let mut list = r.sub_u16()?;
        r.finish()?;
        if list.is_empty() {
            return Err(WireError::Malformed("empty server_name_list"));
        }
        let mut host = None;
        while !list.is_empty() {
            let name_type = list.u8()?;
            let name = list.vec_u16()?;
            if name_type == 0 {
                if host.is_some() {
                    return Err(WireError::Malformed("two host_name entries"));
                }
                if name.is_empty() || !name.is_ascii() {
                    return Err(WireError::Malformed("host_name"));
                }
                host = core::str::from_utf8(name).ok();
            }
        }
        Ok(host)
    }

    /// The versions offered in supported_versions (RFC 8446 §4.2.1), in the client's order.
    pub fn supported_versions(&self) -> Result<Option<Vec<u16>>, WireError> {
        let Some(data) = self.extension(extension_type::SUPPORTED_VERSIONS) else {
            return Ok(None);
        };
        let mut r = Reader::new(data);
        let list = r.vec_u8()?;
        r.finish()?;
        if list.is_empty() || list.len() % 2 != 0 {
            return Err(WireError::Malformed("supported_versions length"));
        }
        Ok(Some(be_u16s(list)))
    }

    /// The protocol names offered in ALPN (RFC 7301 §3.1).
    pub fn alpn_protocols(&self) -> Result<Option<Vec<&'a [u8]>>, WireError> {
        let Some(data) = self.extension(extension_type::ALPN) else {
            return Ok(None);
        };
        let mut r = Reader::new(data);
        let mut list = r.sub_u16()?;
        r.finish()?;
        let mut out = Vec::new();
        while !list.is_empty() {
            let p = list.vec_u8()?;
            if p.is_empty() {
                return Err(WireError::Malformed("empty ALPN protocol name"));
            }
            out.push(p);
        }
        if out.is_empty() {
            return Err(WireError::Malformed("empty ALPN list"));
        }
        Ok(Some(out))
    }
}

/// A parsed ServerHello (or HelloRetryRequest, which shares its format).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerHello<'a> {
    pub legacy_version: u16,
    pub random: [u8; 32],
    pub session_id: &'a [u8],
    pub cipher_suite: u16,
    pub compression_method: u8,
    pub extensions: Vec<Extension<'a>>,
}

impl<'a> ServerHello<'a> {
    /// Parse a ServerHello body (the bytes after the 4-byte handshake header).
    pub fn parse(body: &'a [u8]) -> Result<ServerHello<'a>, WireError> {
        let mut r = Reader::new(body);
        let legacy_version = r.u16()?;
        let random = r.array::<32>()?;
        let session_id = r.vec_u8()?;
        if session_id.len() > 32 {
            return Err(WireError::Malformed("session_id longer than 32 bytes"));
        }
        let cipher_suite = r.u16()?;
        let compression_method = r.u8()?;
        let extensions = if r.is_empty() {
            Vec::new()
        } else {
            parse_extensions(&mut r)?
        };
        Ok(ServerHello {
            legacy_version,
            random,
            session_id,
            cipher_suite,
            compression_method,
            extensions,
        })
    }

    /// Parse a complete handshake message (header included) that must be a ServerHello.
    pub fn parse_message(raw: &'a [u8]) -> Result<ServerHello<'a>, WireError> {
        let (typ, body) = parse_handshake(raw, DEFAULT_MAX_HANDSHAKE_LEN)?;
        if typ != HandshakeType::SERVER_HELLO {
            return Err(WireError::UnexpectedMessage {
                expected: HandshakeType::SERVER_HELLO.0,
                got: typ.0,
            });
        }
        Self::parse(body)
    }

    pub fn extension(&self, typ: u16) -> Option<&'a [u8]> {
        find_extension(&self.extensions, typ)
    }

    /// The version in supported_versions (exactly one u16, RFC 8446 §4.2.1), if present.
    pub fn supported_versions(&self) -> Result<Option<u16>, WireError> {
        let Some(data) = self.extension(extension_type::SUPPORTED_VERSIONS) else {
            return Ok(None);
        };
        let mut r = Reader::new(data);
        let v = r.u16()?;
        r.finish()?;
        Ok(Some(v))
    }

    /// The negotiated version: supported_versions when present, else legacy_version.
    pub fn selected_version(&self) -> Result<u16, WireError> {
        Ok(self.supported_versions()?.unwrap_or(self.legacy_version))
    }

    /// True when this is a HelloRetryRequest (RFC 8446 §4.1.3).
    pub fn is_hello_retry_request(&self) -> bool {
        self.random == HELLO_RETRY_REQUEST_RANDOM
    }
}
