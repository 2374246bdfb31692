//! Typed errors. None carries secret material; the check failures name the check, never the OT
//! index or the input bit involved (an endpoint could use that to learn the middlebox's rules
//! by selective failure, see `docs/blindbox-setup.md`).

use crate::wire::Peer;

/// Errors of the key file and the tagged-rules file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FileError {
    #[error("not a {0} file (bad header line)")]
    BadHeader(&'static str),
    #[error("line {line}: {what}")]
    Malformed { line: usize, what: &'static str },
    #[error("file is not UTF-8")]
    NotUtf8,
    #[error("{0}")]
    Io(String),
    /// A chunk of the detection plan has no tag in the tagged-rules file.
    #[error("rule chunk {0} has no RG tag in the tagged-rules file")]
    Unsigned(String),
    /// A tag does not verify under the given `k_RG`.
    #[error("tag of chunk {0} does not verify under this k_RG")]
    BadTag(String),
}

/// Everything that ends a setup. Fatal: the state machine refuses all further input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SetupError {
    /// A frame header is malformed or announces more than [`crate::wire::MAX_FRAME`] bytes.
    #[error("{peer}: malformed frame: {what}")]
    Frame { peer: Peer, what: &'static str },
    /// A message body is malformed, out of place or inconsistent with what was announced.
    #[error("{peer}: protocol violation: {what}")]
    Protocol { peer: Peer, what: &'static str },
    /// The oblivious transfer with a peer failed (malformed or out-of-order OT message, or,
    /// at an endpoint, the middlebox failed the OT extension's consistency check).
    #[error("{peer}: oblivious transfer failed: {err}")]
    Ot { peer: Peer, err: mbx_ot::OtError },
    /// The endpoints' labels for the middlebox's inputs (obtained by OT from each) differ:
    /// an endpoint garbled with other randomness or sent other labels. Which OT differed is not
    /// said on purpose.
    #[error("check failed: the two endpoints' input labels differ")]
    LabelMismatch,
    /// The full garbled circuit does not hash to the other endpoint's transcript digest:
    /// different tables, label seed or decoding information.
    #[error("check failed: the garbled circuit does not match the other endpoint's digest")]
    TranscriptMismatch,
    /// Evaluation failed its output-label check (labels and tables from different garblings).
    #[error("check failed: garbled-circuit evaluation ({0})")]
    Evaluation(mbx_garble::Error),
    /// The middlebox announced more chunks than this endpoint accepts.
    #[error("middlebox announced {got} rule chunks, this endpoint accepts at most {max}")]
    TooManyChunks { got: u32, max: u32 },
    /// The peer closed the connection or aborted before the setup finished.
    #[error("{peer}: setup aborted before it finished")]
    Aborted { peer: Peer },
    /// Local misuse: the result was asked for before the setup finished, or the plan given to
    /// [`crate::middlebox::SetupOutcome::into_encrypted_rules`] is not the one the setup ran on.
    #[error("{0}")]
    Usage(&'static str),
    /// Some chunks came out as zero: their RG tag did not verify inside the circuit.
    #[error("{count} rule chunks were refused (their RG tag did not verify)")]
    Refused { count: usize },
    /// The garbling library refused an input (a bug or an inconsistent circuit).
    #[error("garbling: {0}")]
    Garble(mbx_garble::Error),
}
