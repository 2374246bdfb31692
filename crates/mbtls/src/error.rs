//! The crate's error type.

use mbx_record::RecordError;
use mbx_wire::WireError;

use crate::hop::Alert;

/// Why an mbTLS operation failed. Carries no secret data.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MbtlsError {
    /// Bytes that do not decode as the expected mbTLS or TLS structure.
    #[error("wire format: {0}")]
    Wire(#[from] WireError),
    /// Record protection failed (outgoing) or key material is unusable.
    #[error("record layer: {0}")]
    Record(#[from] RecordError),
    /// Key generation needs randomness and the system source failed.
    #[error("system random number generator failed")]
    Random,
    /// The session was closed (by an alert or close_notify) and carries no more data.
    #[error("session closed")]
    Closed,
    /// The session ended with a fatal alert (sent or received).
    #[error("session failed with alert {0}")]
    Failed(Alert),
    /// Key material that is internally inconsistent (e.g. hops of different suites).
    #[error("inconsistent key material: {0}")]
    KeyMaterial(&'static str),
    /// What was asked cannot be done in this session (it leaves the session as it was).
    #[error("not possible in this session: {0}")]
    Unsupported(&'static str),
}
