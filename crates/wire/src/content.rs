//! Record content types and protocol version numbers.

use core::fmt;

/// A record content type (RFC 8446 §5.1).
///
/// A newtype rather than an enum: mbTLS adds its own types (30, 31, 32) and a codec must be able
/// to carry types it does not know without losing them.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ContentType(pub u8);

impl ContentType {
    pub const CHANGE_CIPHER_SPEC: ContentType = ContentType(20);
    pub const ALERT: ContentType = ContentType(21);
    pub const HANDSHAKE: ContentType = ContentType(22);
    pub const APPLICATION_DATA: ContentType = ContentType(23);
    pub const HEARTBEAT: ContentType = ContentType(24);

    /// True for the content types defined by the TLS RFCs (20..=24).
    pub const fn is_known(self) -> bool {
        matches!(self.0, 20..=24)
    }

    /// The IANA name, for the known types.
    pub const fn name(self) -> Option<&'static str> {
        match self.0 {
            20 => Some("change_cipher_spec"),
            21 => Some("alert"),
            22 => Some("handshake"),
            23 => Some("application_data"),
            24 => Some("heartbeat"),
            _ => None,
        }
    }

    /// Whether a zero-length fragment of this type is legal.
    ///
    /// RFC 5246 §6.2.1 forbids empty handshake, alert and change_cipher_spec fragments; RFC 8446
    /// §5.1 repeats it for handshake and alert. Heartbeat messages have a fixed header, so they
    /// are never empty either. Application data may be empty, and so may types we do not know
    /// (their owner decides).
    pub const fn may_be_empty(self) -> bool {
        !matches!(self.0, 20 | 21 | 22 | 24)
    }
}

impl fmt::Debug for ContentType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => write!(f, "{n}({})", self.0),
            None => write!(f, "ContentType({})", self.0),
        }
    }
}

impl From<u8> for ContentType {
    fn from(v: u8) -> Self {
        ContentType(v)
    }
}

impl From<ContentType> for u8 {
    fn from(v: ContentType) -> Self {
        v.0
    }
}

/// Protocol version numbers as they appear on the wire (big-endian u16).
pub mod version {
    pub const SSL3_0: u16 = 0x0300;
    pub const TLS1_0: u16 = 0x0301;
    pub const TLS1_1: u16 = 0x0302;
    pub const TLS1_2: u16 = 0x0303;
    pub const TLS1_3: u16 = 0x0304;

    /// The major byte every SSL3/TLS version shares; anything else is not TLS.
    pub const MAJOR: u8 = 0x03;
}
