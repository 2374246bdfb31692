//! Handshake cores (sans-I/O), with any number of middleboxes per side.
//! - Client side: [`ClientHandshake`] with pre-configured or discovered (approved)
//!   [`MiddleboxHandshake`]s; the server may be legacy.
//! - Server side: [`ServerHandshake`] with pre-configured or discovered (approved)
//!   [`ServerSideMiddlebox`]es, which announce themselves; the client may be legacy.
//!
//! Both sides together give `client → M1 … → Mk → server` with the primary keys as the bridge
//! between the last client-side and the first server-side middlebox. The two middlebox cores
//! share their plumbing (`wires`). Design: `docs/mbtls.md` §4.

mod client;
mod demux;
mod endpoint_core;
mod middlebox;
mod server;
mod server_side;
mod wires;

pub use client::{ClientHandshake, ClientHandshakeConfig, ClientMiddlebox};
pub use demux::{hello_records, Demux, Piece};
pub use endpoint_core::{
    Approver, ClientHandshakeEvent, HopFingerprint, ServerHandshakeEvent, SessionSummary,
};
pub use middlebox::{MiddleboxHandshake, MiddleboxHandshakeConfig, MiddleboxHandshakeEvent};
pub use server::{ServerHandshake, ServerHandshakeConfig, ServerMiddlebox};
pub use server_side::{ServerSideMiddlebox, ANNOUNCEMENT_REFUSED, MAX_COPIED_BYTES};

use mbx_attest::AttestError;
use mbx_engine::EngineError;

/// Why a handshake core stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HandshakeError {
    #[error(transparent)]
    Mbtls(#[from] crate::MbtlsError),
    #[error("TLS engine: {0}")]
    Engine(#[from] EngineError),
    #[error("attestation: {0}")]
    Attestation(#[from] AttestError),
    #[error("protocol violation: {0}")]
    Protocol(&'static str),
    #[error("configuration: {0}")]
    Config(&'static str),
}

impl From<mbx_wire::WireError> for HandshakeError {
    fn from(e: mbx_wire::WireError) -> Self {
        HandshakeError::Mbtls(e.into())
    }
}
