//! TLS wire codecs for mbx: records, handshake framing, hello parsing.
//!
//! Everything here is sans-I/O and crypto-free: it turns bytes into typed values and back.
//! Every parser works on untrusted network input and reports problems as [`WireError`];
//! none of them panics, whatever the bytes.

// Network input must never panic the process: no unwrap/expect/panic outside tests.
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]
pub mod codec;
pub mod content;
pub mod error;
pub mod handshake;
pub mod hello;
pub mod record;

pub use codec::{printable, text_prefix, Reader, Writer};
pub use content::{version, ContentType};
pub use error::WireError;
pub use handshake::{HandshakeDeframer, HandshakeMessage, HandshakeType};
pub use hello::{extension_type, ClientHello, Extension, ServerHello};
pub use record::{DeframerConfig, Record, RecordHeader, RecordReader};
