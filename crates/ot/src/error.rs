//! Typed errors: every malformed or out-of-place message maps to one of these, never a panic.

/// What went wrong in an OT exchange.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OtError {
    /// The message ended before a field it must contain.
    #[error("OT message truncated")]
    Truncated,
    /// The message is longer than its header says.
    #[error("OT message has {0} trailing bytes")]
    Trailing(usize),
    /// The first byte is not the message type expected at this point.
    #[error("unexpected OT message type {got:#04x}, expected {expected:#04x}")]
    UnexpectedType {
        /// Type byte found.
        got: u8,
        /// Type byte expected.
        expected: u8,
    },
    /// A group element does not decode to a valid (non-identity) Ristretto point.
    #[error("invalid group element in base OT message")]
    InvalidPoint,
    /// A batch is empty or larger than [`crate::MAX_BATCH`].
    #[error("batch of {0} OTs is outside 1..={max}", max = crate::MAX_BATCH)]
    BatchSize(usize),
    /// A batch arrived out of order.
    #[error("OT batch {got} out of order, expected {expected}")]
    OutOfOrder {
        /// Batch index expected next.
        expected: u64,
        /// Batch index found.
        got: u64,
    },
    /// The number of OTs in a message does not match what the caller supplied or awaits.
    #[error("OT batch has {expected} OTs, got {got}")]
    CountMismatch {
        /// Number the batch has.
        expected: usize,
        /// Number supplied or found.
        got: usize,
    },
    /// A transfer arrived while no extension batch was outstanding.
    #[error("no OT batch outstanding")]
    NoPendingBatch,
    /// The receiver's extension message failed the KOS consistency check: it deviated from the
    /// protocol (or the message was corrupted). The sender refuses all further batches.
    #[error("OT extension consistency check failed")]
    ConsistencyCheck,
    /// An earlier consistency-check failure ended this session.
    #[error("OT session aborted after a failed consistency check")]
    Aborted,
    /// The base OT has not completed yet.
    #[error("base OT not completed")]
    BaseOtPending,
    /// The base OT already completed.
    #[error("base OT already completed")]
    BaseOtDone,
}
