//! BlindBox Detect (paper §3.2, §4, §5): the middlebox's per-flow state over encrypted tokens.
//!
//! Setup: a [`DetectionPlan`] splits every rule keyword into 8-byte chunks (the values the
//! middlebox needs `AES_k(r)` for, [`DetectionPlan::chunks`]). The middlebox never holds `k`:
//! [`EncryptedRules::new`] takes the `AES_k(r)` values, which come from the garbled-circuit rule
//! preparation (tests compute them directly).
//!
//! Per flow, [`Detector`] keeps for each chunk `r` its count `ct*(r)` and the one ciphertext
//! `Enc(salt0 + step·ct*(r), r)` it expects next, in an open-addressing table keyed by that
//! 5-byte ciphertext behind a 32 KiB prefix bitmap: one bitmap load per token whatever the number
//! of rules, a table probe for the few that pass. A hit bumps the count and replaces the entry; a
//! salt announcement resets all counts and recomputes every expectation, eight chunk keys per
//! AES pass (`aes8`, with the schedules expanded once per rule set). Keyword
//! occurrences are rebuilt from chunk hits at their stream offsets (window mode: every chunk;
//! delimiter mode: the first and last chunk): hits of a keyword's earlier chunks are remembered
//! (per message, pruned once out of reach), and when its last chunk hits, the earlier ones are
//! looked up at their offsets. Rules are evaluated with Snort's positional semantics per HTTP
//! message ([`MatchRule::satisfied`]).
//!
//! Protocol III rules (pcre, short keywords, ...) contribute their >= 8-byte keywords as triggers:
//! when one occurs, the detector recovers the flow key from the hit token's `c2` and emits a
//! [`ProbableCause`] carrying it, so the flow can be decrypted and the full rule run.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use aes::Aes128Enc as Aes128;
use zeroize::Zeroizing;

use crate::aes8;
use crate::channel::TokenBatch;
use crate::dpienc::{
    enc, recover_flow_key, salt_block, EncToken, FlowKey, KeywordKey, SaltScheme, SeededTokenState,
    TokenMsg, C1, C1_LEN,
};
use crate::rules::{
    classify, Action, BufferPolicy, Direction, MatchRule, Protocol, Rule, MAX_OCCURRENCES,
    MIN_KEYWORD,
};
use crate::tokenize::{Lane, Token, Tokenization, TOKEN_LEN};

/// Errors: a token stream that does not follow the protocol (a misbehaving endpoint).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DetectError {
    #[error("{got} keyword keys given, the plan has {expected} chunks")]
    KeyCount { expected: usize, got: usize },
    #[error("token before any salt announcement")]
    TokenBeforeSalt,
    #[error("stream offset went backwards ({got} after {last})")]
    OffsetRegression { last: u64, got: u64 },
    #[error("Protocol III token without c2")]
    MissingC2,
    #[error("c2 in a Protocol I/II flow")]
    UnexpectedC2,
}

/// Who a content belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Owner {
    /// Content `j` of match rule `r`.
    Rule(u32, u32),
    /// A keyword of Protocol III rule `t`.
    Trigger(u32),
}

#[derive(Clone, Debug)]
struct PlanContent {
    owner: Owner,
    /// Folded-lane hits count too (a `nocase` content).
    any_lane: bool,
    /// Every chunk but the last: `(chunk id, offset in the keyword)`.
    earlier: Vec<(u32, u64)>,
}

#[derive(Clone, Copy, Debug)]
struct ChunkUse {
    content: u32,
    rel: u64,
    /// Folded-lane hits count too (a `nocase` content).
    any_lane: bool,
}

/// A Protocol III rule as a trigger.
#[derive(Clone, Debug)]
struct Trigger {
    sid: u32,
    flow: Option<Direction>,
}

/// Rules compiled to chunks for one tokenization mode.
#[derive(Clone, Debug)]
pub struct DetectionPlan {
    mode: Tokenization,
    rules: Vec<MatchRule>,
    triggers: Vec<Trigger>,
    contents: Vec<PlanContent>,
    chunks: Vec<Token>,
    /// Per chunk: the contents it is the last chunk of (an occurrence completes on its hit).
    uses: Vec<Vec<ChunkUse>>,
    /// Per chunk: whether it is an earlier chunk of some content (its hits are remembered until
    /// the content's last chunk can arrive).
    recorded: Vec<bool>,
    /// The largest `last_rel` of any content: how long a remembered hit can matter.
    max_span: u64,
    needs_folding: bool,
}

/// Relative offsets of the chunks that represent a keyword of length `len` (>= 8).
pub fn chunk_offsets(len: usize, mode: Tokenization) -> Vec<usize> {
    if len < TOKEN_LEN {
        return Vec::new();
    }
    let last = len - TOKEN_LEN;
    let mut v: Vec<usize> = match mode {
        Tokenization::Window => (0..=last).step_by(TOKEN_LEN).collect(),
        Tokenization::Delimiter => vec![0],
    };
    if v.last() != Some(&last) {
        v.push(last);
    }
    v
}

impl DetectionPlan {
    /// Compiles `rules`: Protocol I/II rules (under `policy`) for exact matching, Protocol III rules
    /// as probable-cause triggers; rules that are not addressable are left out.
    pub fn new<'a>(
        rules: impl IntoIterator<Item = &'a Rule>,
        mode: Tokenization,
        policy: BufferPolicy,
    ) -> Self {
        let mut plan = Self {
            mode,
            rules: Vec::new(),
            triggers: Vec::new(),
            contents: Vec::new(),
            chunks: Vec::new(),
            uses: Vec::new(),
            recorded: Vec::new(),
            max_span: 0,
            needs_folding: false,
        };
        let mut chunk_ids: HashMap<Token, u32> = HashMap::new();
        for rule in rules {
            match classify(rule, policy).protocol {
                Protocol::I | Protocol::II => {
                    let Some(m) = MatchRule::from_rule(rule, policy) else {
                        continue;
                    };
                    let r = plan.rules.len() as u32;
                    for (j, c) in m.contents.iter().enumerate() {
                        plan.add_content(
                            Owner::Rule(r, j as u32),
                            &c.pattern,
                            c.nocase,
                            &mut chunk_ids,
                        );
                    }
                    plan.rules.push(m);
                }
                Protocol::III => {
                    let t = plan.triggers.len() as u32;
                    for c in rule
                        .contents
                        .iter()
                        .filter(|c| !c.negated && c.pattern.len() >= MIN_KEYWORD)
                    {
                        plan.add_content(Owner::Trigger(t), &c.pattern, c.nocase, &mut chunk_ids);
                    }
                    plan.triggers.push(Trigger {
                        sid: rule.sid.unwrap_or_default(),
                        flow: rule.flow,
                    });
                }
                Protocol::NotAddressable => {}
            }
        }
        plan
    }

    fn add_content(
        &mut self,
        owner: Owner,
        pattern: &[u8],
        nocase: bool,
        ids: &mut HashMap<Token, u32>,
    ) {
        let offsets = chunk_offsets(pattern.len(), self.mode);
        let content = self.contents.len() as u32;
        self.needs_folding |= nocase;
        let last = offsets.len().saturating_sub(1);
        let mut earlier = Vec::new();
        for (index, &rel) in offsets.iter().enumerate() {
            let mut value = [0u8; TOKEN_LEN];
            if let Some(src) = pattern.get(rel..rel + TOKEN_LEN) {
                value.copy_from_slice(src);
            }
            if nocase {
                value.make_ascii_lowercase();
            }
            let id = *ids.entry(value).or_insert_with(|| {
                self.chunks.push(value);
                self.uses.push(Vec::new());
                self.recorded.push(false);
                (self.chunks.len() - 1) as u32
            });
            if index < last {
                earlier.push((id, rel as u64));
                if let Some(r) = self.recorded.get_mut(id as usize) {
                    *r = true;
                }
            } else if let Some(u) = self.uses.get_mut(id as usize) {
                u.push(ChunkUse {
                    content,
                    rel: rel as u64,
                    any_lane: nocase,
                });
            }
        }
        let last_rel = offsets.last().copied().unwrap_or_default() as u64;
        self.max_span = self.max_span.max(last_rel);
        self.contents.push(PlanContent {
            owner,
            any_lane: nocase,
            earlier,
        });
    }

    /// The distinct chunk values, in the order [`EncryptedRules::new`] wants their `AES_k(r)`.
    pub fn chunks(&self) -> &[Token] {
        &self.chunks
    }

    /// The exact-match (Protocol I/II) rules.
    pub fn match_rules(&self) -> &[MatchRule] {
        &self.rules
    }

    /// Number of Protocol III trigger rules.
    pub fn trigger_count(&self) -> usize {
        self.triggers.len()
    }

    /// Whether some keyword is `nocase`: the endpoints must then send the folded lane
    /// ([`CaseMode::Dual`](crate::tokenize::CaseMode)).
    pub fn needs_folding(&self) -> bool {
        self.needs_folding
    }

    pub fn mode(&self) -> Tokenization {
        self.mode
    }
}

/// A plan together with the expanded `AES_k(r)` key of each chunk (kept for the connection).
pub struct EncryptedRules {
    plan: DetectionPlan,
    ciphers: Vec<Aes128>,
    /// The same key schedules eight chunks per entry, for the salt resets' eight-lane AES
    /// (`aes8`).
    schedules: Vec<aes8::Schedule8>,
}

impl EncryptedRules {
    /// `keys[i]` is `AES_k(plan.chunks()[i])`, as produced by the rule-preparation setup.
    pub fn new(plan: DetectionPlan, keys: &[KeywordKey]) -> Result<Self, DetectError> {
        if keys.len() != plan.chunks.len() {
            return Err(DetectError::KeyCount {
                expected: plan.chunks.len(),
                got: keys.len(),
            });
        }
        let ciphers = keys.iter().map(KeywordKey::cipher).collect();
        let schedules = keys
            .chunks(aes8::LANES)
            .map(|group| {
                let mut raw = Zeroizing::new([0u128; aes8::LANES]);
                raw.iter_mut()
                    .zip(group)
                    .for_each(|(r, k)| *r = u128::from_le_bytes(k.0));
                aes8::Schedule8::new(&raw)
            })
            .collect();
        Ok(Self {
            plan,
            ciphers,
            schedules,
        })
    }

    pub fn plan(&self) -> &DetectionPlan {
        &self.plan
    }
}

impl std::fmt::Debug for EncryptedRules {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EncryptedRules")
            .field("chunks", &self.ciphers.len())
            .finish_non_exhaustive()
    }
}

/// A Protocol I/II rule matched.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Alert {
    pub sid: u32,
    pub action: Action,
    /// Stream offset of the HTTP message the rule matched in.
    pub message_start: u64,
}

impl Alert {
    /// Whether the rule's action blocks the flow.
    pub fn blocks(&self) -> bool {
        matches!(self.action, Action::Drop | Action::Reject | Action::Sdrop)
    }
}

/// A Protocol III keyword matched: the middlebox may now decrypt the flow.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbableCause {
    pub sid: u32,
    pub message_start: u64,
    /// Stream offset of the keyword.
    pub offset: u64,
    /// Recovered from the hit token's `c2`; opens the sealed traffic secrets
    /// ([`open_secrets`](crate::dpienc::open_secrets)).
    pub flow_key: FlowKey,
}

/// What the detector reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    Alert(Alert),
    ProbableCause(ProbableCause),
}

impl Event {
    /// The alert, for an [`Event::Alert`].
    pub fn as_alert(&self) -> Option<&Alert> {
        match self {
            Event::Alert(a) => Some(a),
            Event::ProbableCause(_) => None,
        }
    }
}

/// Per-flow detection state (one direction).
pub struct Detector {
    rules: Arc<EncryptedRules>,
    scheme: SaltScheme,
    dir: Option<Direction>,
    salt0: Option<u64>,
    counts: Vec<u64>,
    expected: Vec<C1>,
    table: C1Table,
    /// One bit per ciphertext prefix that may be in `table` (a superset; rebuilt at each salt).
    filter: Vec<u64>,
    last_offset: u64,
    message_start: u64,
    /// Hits of chunks that are not the last of their keyword, in the current message:
    /// `(chunk id, offset)` → lanes (bit 0 exact, bit 1 folded).
    recent: HashMap<(u32, u64), u8, SeededTokenState>,
    /// Size of `recent` at which hits out of reach are dropped.
    prune_at: usize,
    occ: HashMap<u32, Vec<u64>, SeededTokenState>,
    fired: HashSet<u32, SeededTokenState>,
    triggered: HashSet<u32, SeededTokenState>,
    flow_key: Option<FlowKey>,
    hits: u64,
    /// Chunk ids of the current hit (reused).
    hit_ids: Vec<u32>,
}

impl std::fmt::Debug for Detector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Detector")
            .field("scheme", &self.scheme)
            .field("salt0", &self.salt0)
            .field("hits", &self.hits)
            .finish_non_exhaustive()
    }
}

/// Open-addressing table from expected ciphertext to chunk id (linear probing, backward-shift
/// deletion, at most half full). Its keys are the expected ciphertexts, AES outputs under the
/// chunk keys, uniformly distributed and not chosen by the sender, so one multiplication spreads
/// them and a lookup of any attacker-chosen ciphertext probes as few slots as a random one.
/// Equal expectations (a 2⁻⁴⁰ event per pair) are separate entries with the same key.
#[derive(Clone, Debug)]
struct C1Table {
    /// `(key | OCCUPIED, chunk id)`, key 0 for an empty slot; side by side so an insert or a
    /// probe touches one cache line.
    slots: Vec<(u64, u32)>,
    mask: usize,
    len: usize,
}

const OCCUPIED: u64 = 1 << 63;

fn c1_key(c: &C1) -> u64 {
    let mut b = [0u8; 8];
    b[..C1_LEN].copy_from_slice(c);
    u64::from_le_bytes(b) | OCCUPIED
}

impl C1Table {
    fn with_capacity(n: usize) -> Self {
        let slots = (2 * n).max(16).next_power_of_two();
        Self {
            slots: vec![(0, 0); slots],
            mask: slots - 1,
            len: 0,
        }
    }

    #[inline]
    fn home(&self, key: u64) -> usize {
        (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 20) as usize & self.mask
    }

    fn clear(&mut self) {
        self.slots.iter_mut().for_each(|s| s.0 = 0);
        self.len = 0;
    }

    fn insert(&mut self, key: u64, id: u32) {
        if 2 * (self.len + 1) > self.slots.len() {
            let mut bigger = Self::with_capacity(self.slots.len());
            for &(k, i) in &self.slots {
                if k != 0 {
                    bigger.insert(k, i);
                }
            }
            *self = bigger;
        }
        let mut i = self.home(key);
        while self.slots.get(i).is_some_and(|s| s.0 != 0) {
            i = (i + 1) & self.mask;
        }
        if let Some(s) = self.slots.get_mut(i) {
            *s = (key, id);
            self.len += 1;
        }
    }

    /// Appends the ids stored under `key` to `out`.
    #[inline]
    fn find(&self, key: u64, out: &mut Vec<u32>) {
        let mut i = self.home(key);
        while let Some(&(k, id)) = self.slots.get(i) {
            if k == 0 {
                return;
            }
            if k == key {
                out.push(id);
            }
            i = (i + 1) & self.mask;
        }
    }

    fn remove(&mut self, key: u64, id: u32) {
        let mut i = self.home(key);
        loop {
            match self.slots.get(i) {
                Some(&(k, d)) if k != 0 => {
                    if k == key && d == id {
                        break;
                    }
                }
                _ => return,
            }
            i = (i + 1) & self.mask;
        }
        // Backward shift: move later entries of the run into the hole when their home allows.
        let mut hole = i;
        let mut j = (i + 1) & self.mask;
        while let Some(&(k, d)) = self.slots.get(j) {
            if k == 0 {
                break;
            }
            let home = self.home(k);
            if j.wrapping_sub(home) & self.mask >= j.wrapping_sub(hole) & self.mask {
                if let Some(h) = self.slots.get_mut(hole) {
                    *h = (k, d);
                }
                hole = j;
            }
            j = (j + 1) & self.mask;
        }
        if let Some(h) = self.slots.get_mut(hole) {
            h.0 = 0;
        }
        self.len -= 1;
    }
}

/// Bits of the prefilter (32 KiB, stays in L1/L2): with 10k chunks about 4% of the tokens that
/// match nothing get past it to the table.
const FILTER_BITS: usize = 1 << 18;

fn filter_index(c: &C1) -> usize {
    (usize::from(c[0]) | usize::from(c[1]) << 8 | usize::from(c[2]) << 16) & (FILTER_BITS - 1)
}

/// Whether `c`'s prefilter bit is set (only then can the table hold `c`).
#[inline]
fn filter_hit(filter: &[u64], c: &C1) -> bool {
    let fi = filter_index(c);
    filter.get(fi / 64).is_some_and(|w| w >> (fi % 64) & 1 == 1)
}

/// Remembered hits above which those out of any keyword's reach are pruned.
const PRUNE_AT: usize = 4096;

impl Detector {
    /// `dir`: the direction of this flow (rules with `flow:` for the other direction do not apply);
    /// `None` applies every rule.
    pub fn new(rules: Arc<EncryptedRules>, scheme: SaltScheme, dir: Option<Direction>) -> Self {
        let n = rules.plan.chunks.len();
        let seeded = SeededTokenState::random();
        Self {
            rules,
            scheme,
            dir,
            salt0: None,
            counts: vec![0; n],
            expected: vec![[0; 5]; n],
            table: C1Table::with_capacity(n),
            filter: vec![0; FILTER_BITS / 64],
            last_offset: 0,
            message_start: 0,
            recent: HashMap::with_hasher(seeded),
            prune_at: PRUNE_AT,
            occ: HashMap::with_hasher(seeded),
            fired: HashSet::with_hasher(seeded),
            triggered: HashSet::with_hasher(seeded),
            flow_key: None,
            hits: 0,
            hit_ids: Vec::new(),
        }
    }

    /// Chunk hits so far (each reveals one keyword occurrence to the middlebox).
    pub fn hits(&self) -> u64 {
        self.hits
    }

    /// Processes one token-channel message.
    pub fn process(&mut self, msg: &TokenMsg, out: &mut Vec<Event>) -> Result<(), DetectError> {
        match *msg {
            TokenMsg::Salt(s) => {
                self.reset_salt(s);
                Ok(())
            }
            TokenMsg::MessageStart(o) => {
                self.advance(o)?;
                self.message_start = o;
                self.recent.clear();
                self.occ.clear();
                self.fired.clear();
                self.triggered.clear();
                Ok(())
            }
            TokenMsg::Token(t) => {
                let Some(salt0) = self.salt0 else {
                    return Err(DetectError::TokenBeforeSalt);
                };
                match (self.scheme, t.c2.is_some()) {
                    (SaltScheme::ProbableCause, false) => return Err(DetectError::MissingC2),
                    (SaltScheme::ExactMatch, true) => return Err(DetectError::UnexpectedC2),
                    _ => {}
                }
                self.advance(t.offset)?;
                if t.offset < self.message_start {
                    return Err(DetectError::OffsetRegression {
                        last: self.message_start,
                        got: t.offset,
                    });
                }
                let rules = Arc::clone(&self.rules);
                self.candidate(&rules, salt0, &t, out);
                Ok(())
            }
        }
    }

    /// The table lookup for one token whose offset was checked.
    #[inline]
    fn candidate(
        &mut self,
        rules: &EncryptedRules,
        salt0: u64,
        t: &EncToken,
        out: &mut Vec<Event>,
    ) {
        if filter_hit(&self.filter, &t.c1) {
            self.lookup(rules, salt0, t, out);
        }
    }

    /// The table lookup for a token that passed the prefilter.
    #[inline]
    fn lookup(&mut self, rules: &EncryptedRules, salt0: u64, t: &EncToken, out: &mut Vec<Event>) {
        let mut ids = std::mem::take(&mut self.hit_ids);
        ids.clear();
        self.table.find(c1_key(&t.c1), &mut ids);
        for &id in &ids {
            self.on_hit(rules, id, salt0, t.offset, t.lane, t.c2.as_ref(), out);
        }
        self.hit_ids = ids;
        if self.recent.len() > self.prune_at {
            self.prune(t.offset);
            // Hits still within reach of a keyword stay; prune again only once they doubled.
            self.prune_at = (2 * self.recent.len()).max(PRUNE_AT);
        }
    }

    /// A whole token frame: the same result as [`Self::process`] on each of its tokens, with
    /// the protocol checks done once per frame (its offsets were validated when it was decoded)
    /// and only prefilter candidates looked up. The middlebox's hot path.
    pub fn process_batch(
        &mut self,
        batch: &TokenBatch,
        out: &mut Vec<Event>,
    ) -> Result<(), DetectError> {
        let Some(salt0) = self.salt0 else {
            return Err(DetectError::TokenBeforeSalt);
        };
        match (self.scheme, batch.has_c2()) {
            (SaltScheme::ProbableCause, false) => return Err(DetectError::MissingC2),
            (SaltScheme::ExactMatch, true) => return Err(DetectError::UnexpectedC2),
            _ => {}
        }
        let first = batch.first_offset();
        self.advance(first)?;
        if first < self.message_start {
            return Err(DetectError::OffsetRegression {
                last: self.message_start,
                got: first,
            });
        }
        let rules = Arc::clone(&self.rules);
        if let Some((data, entry_len, lanes)) = batch.window_entries() {
            // Window mode: fixed-size entries, offsets implicit. The scan between candidates
            // only reads the prefilter; a candidate (which may change it) is handled outside.
            let entry_len = entry_len.max(C1_LEN);
            let mut i = 0usize;
            while let Some(rest) = data.get(i * entry_len..) {
                let filter = self.filter.as_slice();
                let Some(k) = rest.chunks_exact(entry_len).position(|e| {
                    e.first_chunk::<C1_LEN>()
                        .is_some_and(|c1| filter_hit(filter, c1))
                }) else {
                    break;
                };
                i += k;
                if let Some((c1, more)) = rest
                    .get(k * entry_len..(k + 1) * entry_len)
                    .and_then(|e| e.split_first_chunk::<C1_LEN>())
                {
                    let t = EncToken {
                        offset: first.wrapping_add((i / lanes) as u64),
                        lane: if i.is_multiple_of(lanes) {
                            Lane::Exact
                        } else {
                            Lane::Folded
                        },
                        c1: *c1,
                        c2: more.first_chunk::<16>().copied(),
                    };
                    self.lookup(&rules, salt0, &t, out);
                }
                i += 1;
            }
            let positions = (data.len() / entry_len.max(1) / lanes) as u64;
            let last = first.wrapping_add(positions.saturating_sub(1));
            self.last_offset = self.last_offset.max(last);
            return Ok(());
        }
        let mut last = first;
        batch.for_each_entry(|offset, lane, c1, c2| {
            last = offset;
            if filter_hit(&self.filter, c1) {
                let t = EncToken {
                    offset,
                    lane,
                    c1: *c1,
                    c2: c2.copied(),
                };
                self.lookup(&rules, salt0, &t, out);
            }
        });
        self.last_offset = self.last_offset.max(last);
        Ok(())
    }

    fn advance(&mut self, offset: u64) -> Result<(), DetectError> {
        if offset < self.last_offset {
            return Err(DetectError::OffsetRegression {
                last: self.last_offset,
                got: offset,
            });
        }
        self.last_offset = offset;
        Ok(())
    }

    fn insert(&mut self, ct: C1, id: u32) {
        let fi = filter_index(&ct);
        if let Some(w) = self.filter.get_mut(fi / 64) {
            *w |= 1 << (fi % 64);
        }
        self.table.insert(c1_key(&ct), id);
    }

    fn reset_salt(&mut self, salt0: u64) {
        self.salt0 = Some(salt0);
        self.table.clear();
        self.filter.iter_mut().for_each(|w| *w = 0);
        self.counts.iter_mut().for_each(|c| *c = 0);
        let rules = Arc::clone(&self.rules);
        // Enc(salt0, r) for every chunk, eight chunk keys at a time.
        let block = aes::Block::from(salt_block(salt0));
        let n = rules.ciphers.len();
        for (g, schedule) in rules.schedules.iter().enumerate() {
            let mut states = [aes::Block8::from([block; aes8::LANES])];
            schedule.encrypt(&mut states);
            for (j, b) in states[0].iter().enumerate() {
                let id = g * aes8::LANES + j;
                if id >= n {
                    break;
                }
                let mut ct = [0u8; C1_LEN];
                ct.copy_from_slice(&b[..C1_LEN]);
                if let Some(e) = self.expected.get_mut(id) {
                    *e = ct;
                }
                self.insert(ct, id as u32);
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn on_hit(
        &mut self,
        rules: &EncryptedRules,
        id: u32,
        salt0: u64,
        offset: u64,
        lane: Lane,
        c2: Option<&[u8; 16]>,
        out: &mut Vec<Event>,
    ) {
        let idx = id as usize;
        let (Some(cipher), Some(count)) = (rules.ciphers.get(idx), self.counts.get(idx).copied())
        else {
            return;
        };
        self.hits += 1;
        let salt = self.scheme.salt(salt0, count);
        // Replace the entry: the next occurrence of this chunk uses the next salt.
        let old = self.expected.get(idx).copied().unwrap_or_default();
        self.table.remove(c1_key(&old), id);
        let next = enc(cipher, self.scheme.salt(salt0, count + 1));
        if let Some(e) = self.expected.get_mut(idx) {
            *e = next;
        }
        if let Some(c) = self.counts.get_mut(idx) {
            *c = count + 1;
        }
        self.insert(next, id);

        let plan = &rules.plan;
        let lane_bit = match lane {
            Lane::Exact => 1u8,
            Lane::Folded => 2,
        };
        if plan.recorded.get(idx).copied().unwrap_or(false) && offset >= self.message_start {
            *self.recent.entry((id, offset)).or_insert(0) |= lane_bit;
        }
        let uses = plan.uses.get(idx).map(Vec::as_slice).unwrap_or_default();
        let mut key_candidate: Option<FlowKey> = None;
        for u in uses {
            if !u.any_lane && lane == Lane::Folded {
                continue;
            }
            let Some(start) = offset.checked_sub(u.rel) else {
                continue;
            };
            if start < self.message_start {
                continue;
            }
            let Some(content) = plan.contents.get(u.content as usize) else {
                continue;
            };
            // The earlier chunks arrived before (lower offsets): each must have hit at its place
            // in a lane this content accepts.
            let accept = if content.any_lane { 3 } else { 1 };
            let complete = content.earlier.iter().all(|&(c, rel)| {
                start.checked_add(rel).is_some_and(|o| {
                    self.recent
                        .get(&(c, o))
                        .is_some_and(|&lanes| lanes & accept != 0)
                })
            });
            if !complete {
                continue;
            }
            match content.owner {
                Owner::Rule(r, _) => self.on_rule_content(rules, r, u.content, start, out),
                Owner::Trigger(t) => {
                    let Some(trigger) = plan.triggers.get(t as usize) else {
                        continue;
                    };
                    if !applies(trigger.flow, self.dir) || self.triggered.contains(&t) {
                        continue;
                    }
                    let Some(c2) = c2 else { continue };
                    let key = key_candidate
                        .get_or_insert_with(|| recover_flow_key(cipher, salt, c2))
                        .clone();
                    self.triggered.insert(t);
                    if self.flow_key.is_none() {
                        self.flow_key = Some(key.clone());
                    }
                    out.push(Event::ProbableCause(ProbableCause {
                        sid: trigger.sid,
                        message_start: self.message_start,
                        offset: start,
                        flow_key: key,
                    }));
                }
            }
        }
    }

    fn on_rule_content(
        &mut self,
        rules: &EncryptedRules,
        r: u32,
        content: u32,
        start: u64,
        out: &mut Vec<Event>,
    ) {
        // A rule reports once per message: once it fired, its occurrences no longer matter.
        if self.fired.contains(&r) {
            return;
        }
        let rel = start - self.message_start;
        let list = self.occ.entry(content).or_default();
        if list.last() == Some(&rel) || list.len() >= MAX_OCCURRENCES {
            return;
        }
        list.push(rel);
        let Some(rule) = rules.plan.rules.get(r as usize) else {
            return;
        };
        if !rule.applies(self.dir) {
            return;
        }
        if rule.contents.len() == 1 {
            // The earlier occurrences did not satisfy the rule; only the new one can.
            if rule.satisfied_slices(&[std::slice::from_ref(&rel)]) {
                self.fired.insert(r);
                out.push(Event::Alert(Alert {
                    sid: rule.sid,
                    action: rule.action,
                    message_start: self.message_start,
                }));
            }
            return;
        }
        // Gather this rule's occurrence lists (its contents are consecutive in the plan).
        let first = content - self.content_index(r, content);
        let occ: Vec<Vec<u64>> = (0..rule.contents.len() as u32)
            .map(|j| self.occ.get(&(first + j)).cloned().unwrap_or_default())
            .collect();
        if occ.iter().any(Vec::is_empty) {
            return;
        }
        if rule.satisfied(&occ) {
            self.fired.insert(r);
            out.push(Event::Alert(Alert {
                sid: rule.sid,
                action: rule.action,
                message_start: self.message_start,
            }));
        }
    }

    fn content_index(&self, _r: u32, content: u32) -> u32 {
        match self
            .rules
            .plan
            .contents
            .get(content as usize)
            .map(|c| c.owner)
        {
            Some(Owner::Rule(_, j)) => j,
            _ => 0,
        }
    }

    fn prune(&mut self, offset: u64) {
        let span = self.rules.plan.max_span;
        self.recent
            .retain(|&(_, o), _| o.saturating_add(span) >= offset);
    }

    /// The flow key recovered by a Protocol III trigger, if any.
    pub fn flow_key(&self) -> Option<&FlowKey> {
        self.flow_key.as_ref()
    }

    /// Everything this flow's state holds, serialized (expected ciphertexts, counts, partial and
    /// complete keyword occurrences, recovered key). For privacy audits: after a flow that matched
    /// no keyword it must be a function of the rules and salts only.
    pub fn audit_bytes(&self) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&self.salt0.unwrap_or_default().to_be_bytes());
        for (e, c) in self.expected.iter().zip(&self.counts) {
            v.extend_from_slice(e);
            v.extend_from_slice(&c.to_be_bytes());
        }
        let mut recent: Vec<_> = self.recent.iter().collect();
        recent.sort_unstable();
        for ((c, o), lanes) in recent {
            v.extend_from_slice(&c.to_be_bytes());
            v.extend_from_slice(&o.to_be_bytes());
            v.push(*lanes);
        }
        let mut occ: Vec<_> = self.occ.iter().collect();
        occ.sort();
        for (c, list) in occ {
            v.extend_from_slice(&c.to_be_bytes());
            for s in list {
                v.extend_from_slice(&s.to_be_bytes());
            }
        }
        if let Some(k) = &self.flow_key {
            v.extend_from_slice(k.as_bytes());
        }
        v
    }

    /// Counts per chunk (for tests and audits).
    pub fn counts(&self) -> &[u64] {
        &self.counts
    }
}

fn applies(want: Option<Direction>, have: Option<Direction>) -> bool {
    match (want, have) {
        (Some(w), Some(h)) => w == h,
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dpienc::{TokenEncryptor, TokenKey};
    use crate::rules::parse_rule;
    use crate::tokenize::{CaseMode, FlowEvent, FlowTokenizer};

    const K: [u8; 16] = [0x42; 16];

    fn setup(rules: &[&str], mode: Tokenization) -> Arc<EncryptedRules> {
        let parsed: Vec<Rule> = rules.iter().map(|r| parse_rule(r, 1).unwrap()).collect();
        let plan = DetectionPlan::new(&parsed, mode, BufferPolicy::Approximate);
        let key = TokenKey::new(&K);
        let keys: Vec<KeywordKey> = plan.chunks().iter().map(|c| key.keyword_key(c)).collect();
        Arc::new(EncryptedRules::new(plan, &keys).unwrap())
    }

    fn send(data: &[u8], mode: Tokenization, enc: &mut TokenEncryptor) -> Vec<TokenMsg> {
        let mut t = FlowTokenizer::new(mode, CaseMode::Dual, true);
        let mut evs = Vec::new();
        t.push(data, &mut evs);
        t.finish(&mut evs);
        let mut out = Vec::new();
        for e in &evs {
            enc.process(e, &mut out);
        }
        out
    }

    fn run(det: &mut Detector, msgs: &[TokenMsg]) -> Vec<Event> {
        let mut out = Vec::new();
        for m in msgs {
            det.process(m, &mut out).unwrap();
        }
        out
    }

    #[test]
    fn repeated_keyword_hits_every_time_across_resets() {
        let rules = setup(
            &[r#"alert tcp any any -> any any (content:"EVILWORD"; sid:7;)"#],
            Tokenization::Window,
        );
        let mut enc = TokenEncryptor::new(TokenKey::new(&K), 77, 40);
        let data = b"GET /EVILWORD?EVILWORD HTTP/1.1\r\nX: EVILWORD EVILWORD EVILWORD\r\n\r\nGET /EVILWORD HTTP/1.1\r\n\r\n";
        let msgs = send(data, Tokenization::Window, &mut enc);
        assert!(
            msgs.iter()
                .filter(|m| matches!(m, TokenMsg::Salt(_)))
                .count()
                >= 2,
            "resets happened"
        );
        let mut det = Detector::new(rules, SaltScheme::ExactMatch, None);
        let events = run(&mut det, &msgs);
        // One alert per HTTP message, every occurrence (6 total) seen as a hit despite the resets.
        assert_eq!(events.len(), 2);
        assert_eq!(det.hits(), 6);
    }

    #[test]
    fn missing_a_reset_announcement_loses_sync() {
        // The check the previous test relies on: if the detector ignored salt announcements,
        // hits after a reset would be missed.
        let rules = setup(
            &[r#"alert tcp any any -> any any (content:"EVILWORD"; sid:7;)"#],
            Tokenization::Window,
        );
        let mut enc = TokenEncryptor::new(TokenKey::new(&K), 77, 20);
        // "zzzzzzzz" repeats in the first epoch, so the new salt0 is not where the old schedule
        // would have put the second EVILWORD.
        let msgs = send(
            b"EVILWORD zzzzzzzzzzzzzzzz EVILWORD",
            Tokenization::Window,
            &mut enc,
        );
        let mut first_salt = true;
        let filtered: Vec<TokenMsg> = msgs
            .iter()
            .copied()
            .filter(|m| match m {
                TokenMsg::Salt(_) if first_salt => {
                    first_salt = false;
                    true
                }
                TokenMsg::Salt(_) => false,
                _ => true,
            })
            .collect();
        let mut full = Detector::new(Arc::clone(&rules), SaltScheme::ExactMatch, None);
        run(&mut full, &msgs);
        assert_eq!(full.hits(), 2);
        let mut det = Detector::new(rules, SaltScheme::ExactMatch, None);
        run(&mut det, &filtered);
        assert_eq!(det.hits(), 1, "the occurrence after the reset is missed");
    }

    #[test]
    fn positions_and_direction() {
        let rules = setup(
            &[
                r#"alert tcp any any -> any any (flow:to_server; content:"GET /admin"; depth:10; content:"password="; distance:0; within:100; sid:1;)"#,
                r#"drop tcp any any -> any any (flow:to_client; content:"GET /admin"; sid:2;)"#,
            ],
            Tokenization::Window,
        );
        let mut enc = TokenEncryptor::new(TokenKey::new(&K), 5, 1 << 20);
        let msgs = send(b"GET /admin?password=1 HTTP/1.1\r\n\r\nPOST /x HTTP/1.1\r\nContent-Length: 20\r\n\r\nGET /admin?password", Tokenization::Window, &mut enc);
        let events = run(
            &mut Detector::new(
                Arc::clone(&rules),
                SaltScheme::ExactMatch,
                Some(Direction::ToServer),
            ),
            &msgs,
        );
        assert_eq!(
            events,
            vec![Event::Alert(Alert {
                sid: 1,
                action: Action::Alert,
                message_start: 0
            })]
        );
        // sid 1 needs the keyword within the first 10 bytes: not in the second message's body.
        let events = run(
            &mut Detector::new(rules, SaltScheme::ExactMatch, Some(Direction::ToClient)),
            &msgs,
        );
        assert_eq!(events.len(), 2, "sid 2 in both messages");
        for e in &events {
            let Event::Alert(a) = e else { panic!() };
            assert_eq!(a.sid, 2);
            assert!(a.blocks());
        }
    }

    #[test]
    fn nocase_needs_the_folded_lane_and_case_sensitive_ignores_it() {
        let rules = setup(
            &[
                r#"alert tcp any any -> any any (content:"select * from"; nocase; sid:1;)"#,
                r#"alert tcp any any -> any any (content:"union all"; sid:2;)"#,
            ],
            Tokenization::Window,
        );
        let mut enc = TokenEncryptor::new(TokenKey::new(&K), 9, 1 << 20);
        let msgs = send(
            b"SeLeCt * FrOm users UNION ALL",
            Tokenization::Window,
            &mut enc,
        );
        let events = run(
            &mut Detector::new(Arc::clone(&rules), SaltScheme::ExactMatch, None),
            &msgs,
        );
        assert_eq!(
            events,
            vec![Event::Alert(Alert {
                sid: 1,
                action: Action::Alert,
                message_start: 0
            })]
        );
        // Without the folded lane the nocase keyword is missed.
        let exact_only: Vec<TokenMsg> = msgs
            .into_iter()
            .filter(|m| {
                !matches!(
                    m,
                    TokenMsg::Token(EncToken {
                        lane: Lane::Folded,
                        ..
                    })
                )
            })
            .collect();
        let events = run(
            &mut Detector::new(rules, SaltScheme::ExactMatch, None),
            &exact_only,
        );
        assert!(events.is_empty());
    }

    #[test]
    fn probable_cause_recovers_the_flow_key() {
        let rules = setup(
            &[r#"alert tcp any any -> any any (content:"cmd.exe?/c"; pcre:"/dir\s+c:/i"; sid:3;)"#],
            Tokenization::Window,
        );
        assert_eq!(rules.plan().trigger_count(), 1);
        let fk = FlowKey::from_bytes([0xa5; 16]);
        let mut enc = TokenEncryptor::with_flow_key(TokenKey::new(&K), 1000, 1 << 20, fk.clone());
        let msgs = send(
            b"GET /scripts/cmd.exe?/c+dir+c:\\ HTTP/1.1\r\n\r\n",
            Tokenization::Window,
            &mut enc,
        );
        let mut det = Detector::new(rules, SaltScheme::ProbableCause, None);
        let events = run(&mut det, &msgs);
        assert_eq!(events.len(), 1);
        let Event::ProbableCause(pc) = &events[0] else {
            panic!()
        };
        assert_eq!((pc.sid, pc.offset), (3, 13));
        assert_eq!(pc.flow_key, fk);
    }

    #[test]
    fn protocol_violations_are_errors() {
        let rules = setup(
            &[r#"alert tcp any any -> any any (content:"EVILWORD"; sid:7;)"#],
            Tokenization::Window,
        );
        let tok = |offset| {
            TokenMsg::Token(EncToken {
                offset,
                lane: Lane::Exact,
                c1: [0; 5],
                c2: None,
            })
        };
        let mut det = Detector::new(Arc::clone(&rules), SaltScheme::ExactMatch, None);
        let mut out = Vec::new();
        assert_eq!(
            det.process(&tok(0), &mut out),
            Err(DetectError::TokenBeforeSalt)
        );
        det.process(&TokenMsg::Salt(1), &mut out).unwrap();
        det.process(&tok(5), &mut out).unwrap();
        assert_eq!(
            det.process(&tok(4), &mut out),
            Err(DetectError::OffsetRegression { last: 5, got: 4 })
        );
        let mut det3 = Detector::new(rules, SaltScheme::ProbableCause, None);
        det3.process(&TokenMsg::Salt(2), &mut out).unwrap();
        assert_eq!(det3.process(&tok(0), &mut out), Err(DetectError::MissingC2));
    }

    #[test]
    fn hostile_offsets_do_not_panic() {
        // A sender may claim any offsets; with correct ciphertexts the hits go through the
        // positional logic near u64::MAX.
        let rules = setup(
            &[
                r#"alert tcp any any -> any any (content:"EVILWORDEVILWORD"; content:"OTHERWORD"; distance:5; within:30; sid:7;)"#,
            ],
            Tokenization::Window,
        );
        let mut enc = TokenEncryptor::new(TokenKey::new(&K), u64::MAX - 1, 4);
        let mut msgs = Vec::new();
        for (i, t) in [b"EVILWORD", b"EVILWORD", b"OTHERWOR", b"THERWORD"]
            .iter()
            .enumerate()
        {
            let offset = u64::MAX - 40 + 8 * i as u64;
            enc.process(
                &FlowEvent::Token {
                    offset,
                    lane: Lane::Exact,
                    token: **t,
                },
                &mut msgs,
            );
        }
        let mut det = Detector::new(rules, SaltScheme::ExactMatch, None);
        let mut out = Vec::new();
        det.process(&TokenMsg::MessageStart(u64::MAX - 50), &mut out)
            .unwrap();
        for m in &msgs {
            det.process(m, &mut out).unwrap();
        }
        assert!(det.hits() >= 2);
    }

    #[test]
    fn batch_path_equals_per_token_path() {
        use crate::channel::{
            frame_msgs, ChannelParams, ChannelWriter, Deframer, Frame, FrameAuth,
        };
        let rules = setup(
            &[
                r#"alert tcp any any -> any any (content:"EVILWORD"; sid:7;)"#,
                r#"alert tcp any any -> any any (content:"select * from"; nocase; content:"password"; distance:0; within:40; sid:8;)"#,
            ],
            Tokenization::Window,
        );
        let mut enc = TokenEncryptor::new(TokenKey::new(&K), 3, 64);
        let msgs = send(
            b"GET /EVILWORD HTTP/1.1\r\n\r\nPOST /q HTTP/1.1\r\nContent-Length: 43\r\n\r\nSELECT * FROM users where password=EVILWORD",
            Tokenization::Window,
            &mut enc,
        );
        let params = ChannelParams {
            tokenization: Tokenization::Window,
            case: CaseMode::Dual,
            privacy: crate::channel::Privacy::ExactMatch,
            direction: Direction::ToServer,
        };
        let mut bytes = Vec::new();
        let mut w = ChannelWriter::new(params, FrameAuth::new(&[0; 32]), &mut bytes);
        for m in &msgs {
            w.push(m, &mut bytes).unwrap();
        }
        w.finish(&mut bytes).unwrap();
        let mut d = Deframer::new();
        d.push(&bytes);
        let mut batch = Detector::new(Arc::clone(&rules), SaltScheme::ExactMatch, None);
        let mut single = Detector::new(rules, SaltScheme::ExactMatch, None);
        let (mut eb, mut es) = (Vec::new(), Vec::new());
        while let Some(f) = d.next_frame().unwrap() {
            match &f.frame {
                Frame::Tokens(b) => batch.process_batch(b, &mut eb).unwrap(),
                other => {
                    let mut v = Vec::new();
                    frame_msgs(other, &mut v);
                    for m in &v {
                        batch.process(m, &mut eb).unwrap();
                    }
                }
            }
        }
        for m in &msgs {
            single.process(m, &mut es).unwrap();
        }
        assert_eq!(eb.len(), 3);
        assert_eq!(eb, es);
        assert_eq!(batch.audit_bytes(), single.audit_bytes());
        assert_eq!(batch.hits(), single.hits());
    }

    proptest::proptest! {
        /// The ciphertext table agrees with a reference multimap under inserts, removals and
        /// lookups (few distinct keys, so equal keys, long probe runs, wrap-around and growth).
        #[test]
        fn c1_table_is_a_multimap(ops in proptest::collection::vec((0u8..3, 0u8..12, 0u32..6), 0..300)) {
            let mut t = C1Table::with_capacity(1);
            let mut reference: Vec<(u64, u32)> = Vec::new();
            for (op, k, id) in ops {
                let key = c1_key(&[k, 0, 0, 0, k / 3]);
                match op {
                    0 => {
                        t.insert(key, id);
                        reference.push((key, id));
                    }
                    1 => {
                        if let Some(i) = reference.iter().position(|&e| e == (key, id)) {
                            reference.swap_remove(i);
                            t.remove(key, id);
                        }
                    }
                    _ => {}
                }
                let mut got = Vec::new();
                t.find(key, &mut got);
                got.sort_unstable();
                let mut want: Vec<u32> =
                    reference.iter().filter(|e| e.0 == key).map(|e| e.1).collect();
                want.sort_unstable();
                proptest::prop_assert_eq!(got, want);
                proptest::prop_assert_eq!(t.len, reference.len());
            }
        }
    }

    #[test]
    fn chunking() {
        assert_eq!(chunk_offsets(8, Tokenization::Window), vec![0]);
        assert_eq!(chunk_offsets(11, Tokenization::Window), vec![0, 3]);
        assert_eq!(chunk_offsets(16, Tokenization::Window), vec![0, 8]);
        assert_eq!(chunk_offsets(20, Tokenization::Window), vec![0, 8, 12]);
        assert_eq!(chunk_offsets(20, Tokenization::Delimiter), vec![0, 12]);
        assert!(chunk_offsets(7, Tokenization::Window).is_empty());
    }
}
