//! The middlebox's rules: a tagged-rules file from the rule generator, prepared once per
//! process for both tokenizations, with the middlebox's blocking policy.
//!
//! The chunks of each plan carry their RG tags; the rule setup turns them into `AES_k(r)` per
//! connection. Nothing here holds or computes an encryption under `k`.

use std::collections::HashMap;
use std::sync::Arc;

use mbx_blindbox::detect::DetectionPlan;
use mbx_blindbox::fullrule::FullRuleSet;
use mbx_blindbox::rules::{Action, BufferPolicy};
use mbx_blindbox::tokenize::Tokenization;
use mbx_blindbox_setup::{FileError, MiddleboxConfig, SignedChunk, TaggedRules};

/// What the middlebox does when a rule matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Policy {
    /// Monitor only: every match is an alert, nothing is blocked (`drop` rules included).
    Alert,
    /// As the rules say: `drop`, `reject` and `sdrop` rules cut the connection, the others alert.
    #[default]
    Block,
    /// Every match cuts the connection.
    BlockAll,
}

impl std::str::FromStr for Policy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "alert" => Ok(Policy::Alert),
            "block" => Ok(Policy::Block),
            "block-all" => Ok(Policy::BlockAll),
            other => Err(format!(
                "unknown policy {other:?} (use alert, block or block-all)"
            )),
        }
    }
}

/// One tokenization's plan and its signed chunks, in plan order.
pub(crate) struct Prepared {
    pub plan: DetectionPlan,
    pub chunks: Vec<SignedChunk>,
}

/// The rules a middlebox serves every connection with.
pub struct RuleBook {
    window: Prepared,
    delimiter: Prepared,
    full: Arc<FullRuleSet>,
    messages: HashMap<u32, String>,
    rules: usize,
    policy: Policy,
    /// Batch, window and threads of the garbled-circuit setup (memory and parallelism bounds).
    pub setup: MiddleboxConfig,
}

impl std::fmt::Debug for RuleBook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuleBook")
            .field("rules", &self.rules)
            .field("window_chunks", &self.window.chunks.len())
            .field("delimiter_chunks", &self.delimiter.chunks.len())
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl RuleBook {
    /// Prepares `tagged` (as loaded from RG's file). Fails if a chunk of either plan has no tag
    /// (the file was not signed for these rules). Tags that do not verify are only found by
    /// the setup (the middlebox cannot check them: it has no `k_RG`), which then refuses the
    /// connection.
    pub fn new(
        tagged: &TaggedRules,
        buffer: BufferPolicy,
        policy: Policy,
        setup: MiddleboxConfig,
    ) -> Result<Self, FileError> {
        let mut file = tagged.rule_file();
        for r in &mut file.rules {
            r.action = match (policy, r.action) {
                (Policy::Alert, Action::Drop | Action::Reject | Action::Sdrop) => Action::Alert,
                (Policy::BlockAll, _) => Action::Drop,
                (_, a) => a,
            };
        }
        let prepare = |mode| -> Result<Prepared, FileError> {
            let plan = DetectionPlan::new(&file.rules, mode, buffer);
            let chunks = tagged.signed_chunks(&plan)?;
            Ok(Prepared { plan, chunks })
        };
        let messages = file
            .rules
            .iter()
            .filter_map(|r| Some((r.sid?, r.msg.clone()?)))
            .collect();
        Ok(RuleBook {
            window: prepare(Tokenization::Window)?,
            delimiter: prepare(Tokenization::Delimiter)?,
            full: Arc::new(FullRuleSet::new(&file.rules, buffer)),
            messages,
            rules: file.rules.len(),
            policy,
            setup,
        })
    }

    pub(crate) fn prepared(&self, mode: Tokenization) -> &Prepared {
        match mode {
            Tokenization::Window => &self.window,
            Tokenization::Delimiter => &self.delimiter,
        }
    }

    pub(crate) fn full(&self) -> Arc<FullRuleSet> {
        self.full.clone()
    }

    /// The `msg` of rule `sid`, for reports.
    pub fn message(&self, sid: u32) -> Option<&str> {
        self.messages.get(&sid).map(String::as_str)
    }

    /// Rule chunks the setup encrypts per connection for `mode`.
    pub fn chunk_count(&self, mode: Tokenization) -> usize {
        self.prepared(mode).chunks.len()
    }

    /// Rules parsed from the file.
    pub fn rule_count(&self) -> usize {
        self.rules
    }

    pub fn policy(&self) -> Policy {
        self.policy
    }
}
