//! mbTLS wire formats (paper Appendix A; numbers from `shared/specs/mbtls.md`).
//!
//! Every decoder takes untrusted bytes and returns [`WireError`] on anything unexpected,
//! including trailing bytes; none panics.

mod encapsulated;
mod key_material;
mod secondary;
mod support;

pub use encapsulated::{
    announcement_record, Encapsulated, MAX_INNER_PAYLOAD_LEN, MAX_INNER_PLAINTEXT_LEN,
};
pub use key_material::{KeyMaterial, MAX_KEY_MATERIAL_LEN};
pub use secondary::{
    SecondaryMessage, SecondaryReader, MAX_REFUSED_LEN, MSG_EVIDENCE, MSG_KEY_MATERIAL, MSG_REFUSED,
};
pub use support::{MiddleboxSupport, MAX_IDENTITY_LEN};

use mbx_wire::{ContentType, DeframerConfig, WireError};

/// Record type of an encapsulated (subchannel) record.
pub const CT_ENCAPSULATED: ContentType = ContentType(30);
/// Record type of key material (the paper's `MBTLSKeyMaterial`). In our design key material
/// travels as application data of the secondary session; the number tags that message.
pub const CT_KEY_MATERIAL: ContentType = ContentType(31);
/// Record type of a middlebox announcement (an empty inner record of an encapsulated record).
pub const CT_MIDDLEBOX_ANNOUNCEMENT: ContentType = ContentType(32);

/// Codepoint of the MiddleboxSupport ClientHello extension: 0xFF6D ("m"), in the private-use
/// range 0xFF00–0xFFFF. Not 0xFF01, which is renegotiation_info (RFC 5746): OpenSSL owns that
/// one and refuses to register it as a custom extension.
pub const MIDDLEBOX_SUPPORT_EXTENSION: u16 = 0xFF6D;

/// The deframer policy for a connection that carries mbTLS records: the standard types plus
/// 30/31/32, with the TLS 1.2 ciphertext limit (an encapsulated record is at most
/// 1 + 5 + (2^14 − 1) bytes, well inside it).
pub fn deframer_config() -> DeframerConfig {
    DeframerConfig::tls12()
        .with_extra_type(CT_ENCAPSULATED)
        .with_extra_type(CT_KEY_MATERIAL)
        .with_extra_type(CT_MIDDLEBOX_ANNOUNCEMENT)
}

pub(crate) fn malformed(what: &'static str) -> WireError {
    WireError::Malformed(what)
}
