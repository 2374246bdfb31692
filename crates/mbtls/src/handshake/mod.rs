//! Handshake cores (sans-I/O). Built so far: a client with **one client-side middlebox**,
//! pre-configured or discovered with approval ([`ClientHandshake`], [`MiddleboxHandshake`]);
//! the server is any TLS server (the primary handshake is plain TLS to it). Design and the remaining join modes: `docs/mbtls.md` §4.

mod client;
mod demux;
mod middlebox;

pub use client::{
    Approver, ClientHandshake, ClientHandshakeConfig, ClientHandshakeEvent, ClientMiddlebox,
    HopFingerprint, SessionSummary,
};
pub use demux::{hello_records, Demux, Piece};
pub use middlebox::{MiddleboxHandshake, MiddleboxHandshakeConfig, MiddleboxHandshakeEvent};

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
