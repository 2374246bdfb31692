//! BlindBox setup (paper §3.3): how the middlebox obtains `AES_k(r)` for each rule chunk `r`
//! signed by the rule generator, without learning `k`, while the endpoints never learn `r`.
//!
//! * [`keyfile`] — `k_RG` and its key file; [`tagged`] — the tagged-rules file RG signs
//!   (`rules sign`) and the middlebox loads.
//! * [`wire`] — the setup messages and their framing.
//! * [`endpoint`] / [`middlebox`] — the sans-I/O state machines: an endpoint garbles (full
//!   circuits or transcript digests, as the middlebox asks) and answers OT; the middlebox
//!   checks labels, transcripts and outputs and builds the detection state.
//! * [`driver`] — thin tokio drivers over TCP.
//!
//! Protocol, formats and trust assumptions: `docs/blindbox-setup.md`.

#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

pub mod common;
pub mod driver;
pub mod endpoint;
pub mod error;
pub mod keyfile;
pub mod middlebox;
pub mod tagged;
pub mod wire;

pub use common::{default_workers, Progress};
pub use endpoint::{Endpoint, EndpointConfig, EndpointKeys};
pub use error::{FileError, SetupError};
pub use keyfile::RgKey;
pub use middlebox::{Middlebox, MiddleboxConfig, SetupOutcome};
pub use tagged::{tag_chunks, ChunkTag, SignedChunk, TaggedRules};
pub use wire::{Message, Peer, Role};
