//! Errors of this crate. None of them carries secret material.

/// Everything that can go wrong while parsing, building, garbling or evaluating a circuit.
#[derive(Debug, thiserror::Error, PartialEq, Eq, Clone)]
pub enum Error {
    /// Serialized circuit does not start with the format's magic bytes.
    #[error("not a serialized circuit (bad magic)")]
    BadMagic,
    /// Serialized circuit ends in the middle of a field.
    #[error("serialized circuit is truncated")]
    Truncated,
    /// A variable-length integer is longer than 10 bytes or overflows.
    #[error("malformed varint")]
    BadVarint,
    /// A count exceeds what the format (or the remaining input) allows.
    #[error("circuit too large: {0}")]
    TooLarge(&'static str),
    /// Unknown gate opcode.
    #[error("unknown gate opcode {0}")]
    BadOpcode(u8),
    /// A gate reads a wire that is not defined before it (not topological), or an output is undefined.
    #[error("gate {gate} reads undefined wire {wire}")]
    UndefinedWire { gate: u64, wire: u64 },
    /// An output names a wire that does not exist.
    #[error("output {index} names undefined wire {wire}")]
    UndefinedOutput { index: u64, wire: u64 },
    /// Bytes left after the last output.
    #[error("trailing bytes after circuit")]
    TrailingBytes,
    /// Input vector of the wrong length for this circuit.
    #[error("expected {expected} {what} inputs, got {got}")]
    InputLength {
        what: &'static str,
        expected: usize,
        got: usize,
    },
    /// Evaluator received more table bytes than the circuit has AND gates.
    #[error("more garbled-table bytes than the circuit needs")]
    ExtraTables,
    /// Evaluator finished before receiving all tables.
    #[error("garbled tables incomplete: {have} of {need} bytes")]
    MissingTables { have: u64, need: u64 },
    /// Garbler asked for its decoding information before all gates were garbled.
    #[error("garbling not finished")]
    NotFinished,
    /// Decoding information has the wrong size for this circuit.
    #[error("decoding information malformed")]
    BadDecoding,
    /// An output label matches neither label of its wire: the input labels, the tables or the
    /// decoding information do not belong to one garbling.
    #[error("output label {0} failed its check (labels or tables from a different garbling)")]
    OutputCheck(usize),
}
