//! Keyless SSL (TLS handshake proxying): the site's private key stays on a key server, and CDN
//! edges ask it for the one private-key operation each handshake needs.
//!
//! * [`wire`]: the binary key-server protocol (header, items, opcodes, error bytes) as a sans-I/O
//!   codec, with a deframer for a stream of pipelined messages.
//! * [`keys`]: private keys from a directory (PKCS#8, PKCS#1, SEC1; PEM or DER), found by SKI or
//!   certificate digest, and the operations each opcode asks for.
//! * [`pkcs11`]: keys that stay inside a PKCS#11 token (HSM; SoftHSM2 in tests), with pooled
//!   sessions.
//! * [`server`]: the request handler (sans-I/O) and the tokio/rustls driver with required client
//!   certificates, authorization per edge, and a worker pool for the signing work.
//! * [`client`]: the edge-side library: pipelined requests, timeouts, and RSA premaster
//!   unpadding in constant time on the edge ([`premaster`]).
//! * [`edge`]: the edge server: rustls with a remote signing key on pooled key-server
//!   connections, certificate by SNI, Host check, caching reverse proxy, per-origin tickets.
//! * [`tls`]: the rustls configurations of both ends (mutual TLS 1.3/1.2, deny list).
//!
//! See `docs/keyless.md` for deployment and the protocol choices.

// Network input must never panic the process: no unwrap/expect/panic outside tests.
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

pub mod client;
pub mod edge;
pub mod keys;
pub mod pkcs11;
pub mod premaster;
pub mod server;
pub mod tls;
/// Word-wise wiping of secret buffers (shared with the record layer).
pub use mbx_record::wipe;
pub mod wire;
pub mod x509;

pub use client::{ClientError, ClientOptions, KeyId, KeylessClient};
pub use keys::{
    HashAlg, KeyAlgorithm, KeyHandle, KeyOperation, KeyStore, KeyStoreError, OperationError,
    SoftwareKey,
};
pub use server::{
    Authorization, EdgeIdentity, KeyServer, KeyServerCore, RunningServer, ServerConfig,
    ServerError, DEFAULT_PORT,
};
pub use wire::{Body, ErrorCode, Message, Opcode, Tag};
