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
//! * [`channel`] is the token channel's wire format (frames, deframer, tags);
//! * [`keys`] derives `k`, `k_rand`, flow keys and channel keys from the primary session's exporter;
//! * [`flow`] puts it together: sender, middlebox and receiver of one direction (validation,
//!   Protocol III decryption); [`fullrule`] evaluates full rules (`pcre`) on decrypted flows;
//! * [`plaintext`] is the Aho–Corasick reference matcher used as the oracle;
//! * `names` (private) gives the configuration enums their `FromStr` and `Display` names;
//! * `aes8` (private) runs AES-128 under eight keys at once, key schedules included;
//! * `aesni` (private, x86_64) is the sender's DPIEnc in AES-NI registers, chosen at run time —
//!   the crate's only `unsafe` code (see the module and `docs/blindbox.md`).
//!
//! See `docs/blindbox.md` for the privacy models and what the middlebox learns.

// `unsafe` is denied everywhere except in `aesni` (AES-NI intrinsics after run-time detection).
#![deny(unsafe_code)]
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

mod aes8;
#[allow(unsafe_code)]
mod aesni;
pub mod channel;
pub mod detect;
pub mod dpienc;
pub mod flow;
pub mod fullrule;
pub mod http;
pub mod keys;
mod names;
pub mod plaintext;
pub mod rules;
pub mod sender;
pub mod tokenize;

pub use channel::{ChannelParams, Privacy};
pub use detect::{
    Alert, DetectError, DetectionPlan, Detector, EncryptedRules, Event, ProbableCause,
};
pub use dpienc::{EncToken, FlowKey, KeywordKey, SaltScheme, TokenEncryptor, TokenKey, TokenMsg};
pub use flow::{
    Culprit, FlowConfig, FlowOutput, FlowReceiver, FlowSender, MbEvent, MiddleboxFlow,
    Misbehaviour, PrimaryKeys, ValidationError,
};
pub use keys::SessionKeys;
pub use rules::{classify, parse_rules, BufferPolicy, Protocol, Rule};
pub use sender::Sender;
pub use tokenize::{CaseMode, FlowTokenizer, Tokenization};
