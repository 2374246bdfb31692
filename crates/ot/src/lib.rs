//! Oblivious transfer for BlindBox rule preparation (paper §3.3).
//!
//! The middlebox (OT receiver) obtains, for every evaluator input bit of every garbled circuit
//! (128 bits of rule chunk plus 128 bits of tag), the label of its bit from each endpoint (OT
//! sender), without the endpoint learning the bit and without the middlebox learning the other
//! label. About two million 128-bit label transfers per endpoint for the community rules.
//!
//! # Protocol
//! * **Base OT**: 128 Masny–Rindal "endemic" OTs over Ristretto255 (`curve25519-dalek`), run once per session with the roles reversed (the middlebox sends,
//!   the endpoint chooses the bits of its secret Δ).
//! * **Extension**: IKNP with the KOS15 consistency check. For a batch of `n` choices the
//!   receiver sends the `128 × (n + pad)` bit matrix `u` (16 bytes per OT) and two 16-byte check
//!   values; the sender answers with `(m0 ⊕ H(j, q_j), m1 ⊕ H(j, q_j ⊕ Δ))`, 32 bytes per OT.
//!   `H` is the tweakable circular correlation-robust hash from fixed-key AES (GKWY20). Column
//!   PRGs are AES-128-CTR keyed by the base-OT seeds and continue across batches.
//! * **Random OT → chosen messages**: the extension yields random OTs with the receiver's real
//!   choice bits; the sender's pairs are one-time-padded with them.
//! * **Batches** stream with bounded memory: any number of batches of 1..=[`MAX_BATCH`] OTs, each
//!   one extension message and one transfer message, processed in order, several may be in
//!   flight. Message sizes: setup 33 B, base reply 8,193 B, extension `45 + 16·(⌈n/128⌉·128+256)`
//!   B, transfer `13 + 32·n` B.
//! * **Speed** (`cargo bench -p mbx-ot`, both sides on one core of the 2-core dev machine):
//!   128 base OTs ≈ 45 ms; 2^20 label transfers ≈ 165 ms in batches of 2^16 (≈ 6.4 M OT/s)
//!   but ≈ 370 ms as one 2^20 batch (the transpose then misses cache), so use batches of
//!   about 2^16.
//!
//! # Security model and what this gives
//! * The **middlebox may be malicious** toward the endpoints' garbling secrets: if it learned
//!   both labels of an input wire it could evaluate a circuit on a second input (e.g. a rule it
//!   made up) and break garbled-circuit security. Plain IKNP is only semi-honest: a receiver
//!   sending an inconsistent `u` learns bits of Δ, hence both labels. The KOS check makes the
//!   sender verify, before anything depending on Δ leaves it, that `u` is consistent; a cheating
//!   receiver passes only by guessing the Δ bits it attacks (each guess halves its chance), and a
//!   failed check aborts the session for good ([`OtError::Aborted`]) so it cannot retry. The
//!   check is made non-interactive by deriving its challenge from a hash of `u` (Fiat–Shamir),
//!   and uses the POLYVAL polynomial hash (`χ_j` = powers of one challenge) as the linear
//!   universal hash: the soundness error gains a term `n/2^128` per batch plus grinding
//!   (hash queries × that), negligible here. The base OT is secure against a malicious base
//!   sender (the middlebox) for the receiver's choices: `(r0, r1)` are uniform points whatever Δ.
//! * **Endpoints are semi-honest** (toward each other and in this OT): the receiver's choices
//!   (the rule bits) are hidden from the sender computationally even if it deviates, since every
//!   column of `u` is padded by a PRG stream the sender cannot compute, and the check values
//!   are masked by 256 extra rows with random choices. What a malicious sender *can* do in any
//!   OT is selective failure: send a wrong label on one side only and watch whether the
//!   middlebox later aborts. BlindBox's middlebox compares the labels from both endpoints; the
//!   setup protocol should abort without saying which OT mismatched, and the paper's assumption
//!   that at least one endpoint is honest is what makes the compared labels trustworthy.
//! * Labels, Δ, base-OT secrets and seeds are wiped on drop (`zeroize`); the check compares in
//!   constant time; choice bits and Δ bits select without branches.
//!
//! # Why not `cryprot-ot`
//! `cryprot-ot` 0.3 implements the same protocols (Chou–Orlandi base OT, IKNP, KOS, silent OT)
//! but every protocol is an `async` method over its own `cryprot_net::Connection` (QUIC-based
//! networking), so it cannot be driven as a sans-I/O state machine over our byte transport; it
//! also needs edition 2024, `rand` 0.10, rayon and bitvec. Here the heavy parts come from
//! maintained crates (`curve25519-dalek`, `aes` with AES-NI detection, `polyval` with PCLMULQDQ
//! detection, `sha2`) and this crate keeps only the protocol logic. Masny–Rindal was preferred
//! over Chou–Orlandi because its endemic security is exactly what OT extension needs and it
//! avoids the gap found in the original CO15 proof (Genç–Iovino–Rial 2017).
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

mod base;
mod error;
mod kos;
mod prim;
mod receiver;
mod sender;
mod wire;

pub use error::OtError;
pub use receiver::{Labels, OtReceiver};
pub use sender::OtSender;
pub use wire::peek_extend;

/// Bytes of one transferred message (a wire label).
pub const LABEL_LEN: usize = 16;
/// Base OTs per session: the computational security parameter κ.
pub const BASE_OTS: usize = 128;
/// Extra rows with random choices per batch that mask the consistency-check value.
pub const PAD_ROWS: usize = 256;
/// Largest batch one extension message may carry (about 64 MiB of `u`).
pub const MAX_BATCH: usize = 1 << 22;
