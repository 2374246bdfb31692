//! BlindBox (Sherry et al., SIGCOMM 2015): a middlebox detects rule keywords in traffic it cannot
//! decrypt.
//!
//! Sans-I/O building blocks, in pipeline order:
//! * [`http`] frames HTTP/1.1 so non-text bodies are not tokenized;
//! * [`tokenize`] turns a flow into 8-byte tokens (window or delimiter tokenization), streaming;
//! * [`dpienc`] encrypts tokens with DPIEnc and manages salts (Protocols I/II, and III's `c2`);
//! * [`sender`] chains the two for one direction of a flow (the receiver re-runs it to validate);
//! * [`rules`] parses Snort rules, classifies them (Protocol I / II / III) and computes Table 1;
//! * [`detect`] is the middlebox's per-flow detection over encrypted tokens;
//! * [`plaintext`] is the Aho–Corasick reference matcher used as the oracle.
//!
//! See `docs/blindbox.md` for the privacy models and what the middlebox learns.

#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

pub mod detect;
pub mod dpienc;
pub mod http;
pub mod plaintext;
pub mod rules;
pub mod sender;
pub mod tokenize;

pub use detect::{
    Alert, DetectError, DetectionPlan, Detector, EncryptedRules, Event, ProbableCause,
};
pub use dpienc::{EncToken, FlowKey, KeywordKey, SaltScheme, TokenEncryptor, TokenKey, TokenMsg};
pub use rules::{classify, parse_rules, BufferPolicy, Protocol, Rule};
pub use sender::Sender;
pub use tokenize::{CaseMode, FlowTokenizer, Tokenization};
