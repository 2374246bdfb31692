//! mbTLS (Middlebox TLS, Naylor et al., CoNEXT 2017) for mbx.
//!
//! mbTLS adds middleboxes to a TLS session without giving any of them the endpoints' keys: each
//! hop between adjacent nodes has its own fresh AEAD keys, handed to a middlebox by the endpoint
//! on its side over a secondary TLS session, and the primary (end-to-end) session's keys bridge
//! the client side and the server side. The protocol is specified in `shared/specs/mbtls.md` and
//! our design (wire layouts, handshake plan) in `docs/mbtls.md`.
//!
//! This crate is sans-I/O (architecture principle 1):
//! - [`wire`]: the Appendix A formats — encapsulated records, key material (TLS 1.2 paper layout
//!   and our TLS 1.3 layout), middlebox announcements, the MiddleboxSupport extension.
//! - [`keys`]: fresh per-hop keys and the key material each middlebox receives.
//! - [`relay`]: a middlebox's data phase: decrypt from one hop, run the app, re-encrypt for the
//!   other hop; fail closed on any bad record.
//! - [`endpoint`]: an endpoint's record layer after the handshake, under the keys of its hop.
//! - [`handshake`]: the handshake cores over real TLS engines, for the three roles: client,
//!   middlebox (client side or server side) and server, every join mode, TLS 1.2 and 1.3.
//! - [`driver`]: thin tokio drivers (client, client proxy, middlebox, server) that only move
//!   bytes between sockets and the sans-I/O cores above.
//!
//! The crates an embedder also needs are re-exported ([`engine`], [`attest`], [`apps`],
//! [`TlsVersion`]); `examples/embed.rs` runs a client, a middlebox with its own app and a
//! server on loopback in about 140 lines.

// Network input must never panic the process: no unwrap/expect/panic outside tests.
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]
#![forbid(unsafe_code)]

mod direct;
pub mod driver;
pub mod endpoint;
pub mod error;
pub mod handshake;
pub mod hop;
mod key_update;
pub mod keys;
pub mod relay;
pub mod wire;

pub use endpoint::{EndpointDataPhase, EndpointEvent};
pub use error::MbtlsError;
pub use hop::{Alert, Side};
pub use keys::{
    client_side_keys, server_side_keys, DirectionKeys, HopKeys, SideKeys, TrafficSecret,
};
/// Middlebox applications (the [`MiddleboxApp`](mbx_apps::MiddleboxApp) interface and ours).
pub use mbx_apps as apps;
/// Attestation: evidence, policies, the simulated and DCAP attesters.
pub use mbx_attest as attest;
/// The TLS engines and their configuration.
pub use mbx_engine as engine;
pub use mbx_record::TlsVersion;
pub use relay::{FailCause, Leaving, MiddleboxRelay, RelayEvent};
pub use wire::{
    Encapsulated, KeyMaterial, MiddleboxSupport, CT_ENCAPSULATED, CT_KEY_MATERIAL,
    CT_MIDDLEBOX_ANNOUNCEMENT, MIDDLEBOX_SUPPORT_EXTENSION,
};
