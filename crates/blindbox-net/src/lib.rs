//! BlindBox over the network (paper §2, Figure 1): endpoints and a middlebox on TCP.
//!
//! Each hop (client ↔ middlebox, middlebox ↔ server) is one TCP connection carrying four
//! streams ([`mux`]): the primary TLS session (end to end), the token channel (end to end), a
//! hop-local control stream ([`control`]) and the hop-local rule setup. [`Endpoint`] and
//! [`Middlebox`] are sans-I/O state machines; [`driver`] runs them on tokio sockets.
//!
//! The middlebox needs its encrypted rules (`AES_k(r)` per rule chunk) before data may flow.
//! It gets them only from the garbled-circuit setup of `mbx-blindbox-setup`, run with both
//! endpoints over the setup streams right after the primary handshake, for the chunks of a
//! tagged-rules file signed by the rule generator ([`RuleBook`]). A failed setup refuses the
//! connection at every party.

#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]
#![forbid(unsafe_code)]

pub mod control;
pub mod driver;
pub mod endpoint;
pub mod middlebox;
pub mod mux;
pub mod rules;

pub use endpoint::{Endpoint, EndpointEvent, SetupConfig};
pub use middlebox::{Middlebox, MiddleboxEvent};
pub use rules::{Policy, RuleBook};

use mbx_blindbox::flow::{FlowError, ValidationError};

/// Why a BlindBox connection failed. Every error is fatal for the connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NetError {
    #[error("hop wire: {0}")]
    Mux(#[from] mux::MuxError),
    #[error("TLS: {0}")]
    Engine(String),
    #[error("BlindBox flow: {0}")]
    Flow(String),
    /// The receiver's validation failed; names the culprit (sender or path).
    #[error("validation: {0}")]
    Validation(#[from] ValidationError),
    #[error("protocol violation: {0}")]
    Protocol(&'static str),
    /// The middlebox refused the connection (e.g. its rule setup failed).
    #[error("refused by the middlebox: {0}")]
    Refused(String),
    /// This endpoint's side of the rule setup failed (the middlebox is told, with `Abort`).
    #[error("rule setup: {0}")]
    Setup(String),
}

impl From<FlowError> for NetError {
    fn from(e: FlowError) -> Self {
        NetError::Flow(e.to_string())
    }
}

impl From<mbx_engine::EngineError> for NetError {
    fn from(e: mbx_engine::EngineError) -> Self {
        NetError::Engine(e.to_string())
    }
}
