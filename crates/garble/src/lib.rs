//! Garbled circuits for BlindBox's obfuscated rule encryption (paper §3.3).
//!
//! The middlebox must obtain `AES_k(r)` for each rule chunk `r` without learning `k`, while the
//! endpoints must not learn `r`. The endpoints garble a circuit that computes `AES_k(r)` (and checks
//! the rule generator's tag on `r`); the middlebox evaluates it on labels for `r` it obtains by
//! oblivious transfer. This crate is the garbling half:
//!
//! * [`circuit`] — circuit format (XOR/AND/INV gates, garbler and evaluator inputs), builder,
//!   compact serialization with a never-panicking parser, and the cleartext reference evaluator.
//! * [`aes_circuit`] — AES-128 with round keys as garbler inputs (5,120 AND gates, Boyar–Peralta
//!   S-box), and the BlindBox circuit with the in-circuit tag check (10,495 AND gates).
//! * [`garble`](mod@garble) / [`evaluate`](mod@evaluate) — free-XOR + half-gates over a fixed-key-AES TCCR hash, deterministic
//!   given a seed, streaming tables in chunks, with checked output decoding.
//! * [`transcript`] — the digest one endpoint sends instead of a second full circuit.
//! * `vaes` (private, x86_64) — the fixed-key hash and the AND-gate batches on VAES,
//!   chosen at run time; the crate's only `unsafe` code (see the module). Elsewhere the `aes`
//!   crate runs π (AES-NI or its software fallback) and the output is the same.
//!
//! Oblivious transfer and the three-party setup protocol live elsewhere.
// `unsafe` is denied everywhere except in `vaes` (VAES intrinsics after run-time detection).
#![deny(unsafe_code)]
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

pub mod aes_circuit;
pub mod circuit;
pub mod error;
pub mod evaluate;
pub mod garble;
mod hash;
pub mod label;
mod sbox;
pub mod transcript;
// Its intrinsics were stabilized in Rust 1.89, the workspace's minimum version.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod vaes;

pub use aes_circuit::{
    aes128_circuit, aes128_garbler_inputs, blindbox_circuit, blindbox_circuit_for,
    blindbox_evaluator_inputs, blindbox_garbler_inputs, blindbox_token_evaluator_inputs,
    blindbox_token_garbler_inputs, block_from_bits, round_keys, Layout, AES_AND_GATES,
    BLINDBOX_AND_GATES, BLINDBOX_TOKEN_AND_GATES,
};
pub use circuit::{
    bits_to_bytes, bytes_to_bits, Circuit, CircuitBuilder, Gate, GateCounts, Op, Wire,
};
pub use error::Error;
pub use evaluate::{evaluate, Evaluator};
pub use garble::{garble, Decoding, GarbledCircuit, Garbler, TABLE_BYTES_PER_AND};
pub use label::{GarbleSeed, Label, LabelPair, LabelSeed};
pub use transcript::{hash_garbling, TranscriptHasher};
