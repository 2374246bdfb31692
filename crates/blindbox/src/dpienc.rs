//! DPIEnc (paper §3.1–3.2, §5): the sender's token encryption and salt management.
//!
//! * Keyword key: `K_t = AES_k(t ‖ 0⁸)` — the 8-byte token padded with zeros to one AES block. The
//!   middlebox gets `K_r` for each rule chunk `r` from the garbled-circuit setup without learning `k`.
//! * `Enc(salt, t) = AES_{K_t}(0⁸ ‖ salt_be64)` truncated to its first 5 bytes (40 bits).
//! * Salts are never sent per token: the sender announces `salt0`, encrypts the `c`-th occurrence of
//!   `t` in the current epoch with `salt0 + step·c`, and after every `P` bytes of stream starts a new
//!   epoch with `salt0 ← salt0 + step·(max_c + 1)`, announced in-band. So no two encryptions of the
//!   same token in a flow share a salt, and the middlebox can still precompute the one ciphertext it
//!   expects next for each rule chunk.
//! * Protocol III (`step = 2`): `c1 = Enc(salt, t)` with even `salt`, plus
//!   `c2 = AES_{K_t}(0⁸ ‖ (salt+1)_be64) ⊕ flow_key` (a full block). A middlebox that matched `t`
//!   computes `c2 ⊕ AES_{K_r}(salt+1)` = `flow_key`. `flow_key` is an AES-128 key per flow and
//!   direction under which the sender seals the primary channel's traffic secrets once
//!   ([`seal_secrets`]); so the key that c2 wraps fits in one block whatever the TLS suite.
//!
//! Key schedules: the middlebox keeps the expanded `K_r` of every rule chunk for the whole
//! connection (it holds `K_r` anyway). The sender keeps only the per-epoch counts (in a table
//! hashed with a per-flow random seed) and computes `K_t` and its schedule for every token
//! (profiling showed caching the 176-byte schedules cost more in table traffic than the
//! expansion it saved). On x86_64 with AES-NI (detected at run time) it counts the tokens in
//! stream order and, every 32 tokens, runs `K_t = AES_k(t)`, `K_t`'s schedule and the salt
//! encryptions for all 32 in registers (`aesni`, the crate's only `unsafe`; four tokens per
//! instruction with 512-bit VAES), then appends their messages. Elsewhere the
//! portable path computes all `K_t` of a push in one pipelined multi-block AES call, then the
//! salts, then the ciphertexts with eight `K_t` schedules expanded in lockstep (`aes8`). Both
//! give the same bytes (tests run both).
//!
//! `flow_key` and the first `salt0` come from the primary session's exporter ([`crate::keys`]),
//! so the receiver can recompute every `c2` and check it.

use aes::cipher::{BlockEncrypt, KeyInit};
use aes::Aes128Enc as Aes128;
use aws_lc_rs::aead;
use subtle::ConstantTimeEq;
use zeroize::{Zeroize, ZeroizeOnDrop, Zeroizing};

use crate::aes8;
use crate::aesni;
use crate::tokenize::{FlowEvent, Lane, Token, WindowRun, TOKEN_LEN};

/// Bytes of a truncated DPIEnc ciphertext.
pub const C1_LEN: usize = 5;

/// A truncated DPIEnc ciphertext.
pub type C1 = [u8; C1_LEN];

/// Errors of this module.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DpiEncError {
    #[error("sealed secrets failed authentication (wrong flow key or tampered)")]
    SecretsAuth,
    #[error("sealed secrets too short")]
    SecretsTruncated,
}

/// The token-encryption key `k` (derived by both endpoints from the primary session).
pub struct TokenKey {
    cipher: Aes128,
    /// `k`'s schedule for the AES-NI path: `None` without AES-NI / SSSE3 (or off x86_64), and
    /// when tests force the portable path.
    ni: Option<aesni::DpiEncNi>,
}

impl TokenKey {
    pub fn new(k: &[u8; 16]) -> Self {
        Self {
            cipher: Aes128::new(k.into()),
            ni: aesni::DpiEncNi::new(k),
        }
    }

    /// The same key on the portable path only (tests keep both paths covered).
    #[cfg(test)]
    pub(crate) fn portable(k: &[u8; 16]) -> Self {
        Self {
            cipher: Aes128::new(k.into()),
            ni: None,
        }
    }

    /// The same key on one AES-NI kernel (`None` if the CPU lacks it; tests force each).
    #[cfg(test)]
    pub(crate) fn with_kernel(k: &[u8; 16], kernel: aesni::Kernel) -> Option<Self> {
        Some(Self {
            cipher: Aes128::new(k.into()),
            ni: Some(aesni::DpiEncNi::with_kernel(k, kernel)?),
        })
    }

    /// Whether the sender's batched path uses AES-NI with this key.
    #[cfg(test)]
    pub(crate) fn uses_aesni(&self) -> bool {
        self.ni.is_some()
    }

    /// `K_t = AES_k(t ‖ 0⁸)`. Exposed for the rule-preparation setup and for tests, which stand in
    /// for the garbled circuit; the middlebox never holds a `TokenKey`.
    pub fn keyword_key(&self, t: &Token) -> KeywordKey {
        let mut block = [0u8; 16];
        block[..8].copy_from_slice(t);
        let mut b = block.into();
        self.cipher.encrypt_block(&mut b);
        let out = KeywordKey(b.into());
        block.zeroize();
        out
    }
}

impl std::fmt::Debug for TokenKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenKey(..)")
    }
}

/// `AES_k(r)` for one keyword chunk: the AES key under which that chunk's salts are encrypted.
#[derive(Clone, Zeroize, ZeroizeOnDrop)]
pub struct KeywordKey(pub(crate) [u8; 16]);

impl KeywordKey {
    /// Wraps a value obtained from the rule-preparation setup.
    pub fn from_bytes(b: [u8; 16]) -> Self {
        Self(b)
    }

    /// The expanded key schedule.
    pub fn cipher(&self) -> Aes128 {
        Aes128::new((&self.0).into())
    }
}

impl std::fmt::Debug for KeywordKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeywordKey(..)")
    }
}

/// The AES input block of `salt`: eight zero bytes, then `salt` big-endian.
#[inline]
pub(crate) fn salt_block(salt: u64) -> [u8; 16] {
    let mut block = [0u8; 16];
    block[8..].copy_from_slice(&salt.to_be_bytes());
    block
}

/// `AES_{K}(salt)`, the full block.
pub fn salted_block(keyword: &Aes128, salt: u64) -> [u8; 16] {
    let mut b = salt_block(salt).into();
    keyword.encrypt_block(&mut b);
    b.into()
}

/// `Enc(salt, t)`: the first 5 bytes of `AES_{K_t}(salt)`.
pub fn enc(keyword: &Aes128, salt: u64) -> C1 {
    let full = salted_block(keyword, salt);
    let mut c = [0u8; C1_LEN];
    c.copy_from_slice(&full[..C1_LEN]);
    c
}

/// Salt step: 1 for Protocols I/II, 2 for Protocol III (even salts for c1, odd for c2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SaltScheme {
    ExactMatch,
    ProbableCause,
}

impl SaltScheme {
    /// How far the salt moves per occurrence of a token.
    pub fn step(self) -> u64 {
        match self {
            SaltScheme::ExactMatch => 1,
            SaltScheme::ProbableCause => 2,
        }
    }

    /// The salt of the `count`-th occurrence (0-based) in an epoch starting at `salt0`.
    pub fn salt(self, salt0: u64, count: u64) -> u64 {
        salt0.wrapping_add(self.step().wrapping_mul(count))
    }

    /// The next epoch's `salt0` after an epoch whose largest count was `max_count`.
    pub fn next_salt0(self, salt0: u64, max_count: u64) -> u64 {
        self.salt(salt0, max_count.wrapping_add(1))
    }
}

/// A per-flow AES-128 key, wrapped into every Protocol III token's `c2`.
#[derive(Clone, Zeroize, ZeroizeOnDrop)]
pub struct FlowKey(pub(crate) [u8; 16]);

impl FlowKey {
    pub fn from_bytes(b: [u8; 16]) -> Self {
        Self(b)
    }

    /// The raw key (for the decryption element that opens the sealed secrets).
    pub fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }
}

impl PartialEq for FlowKey {
    fn eq(&self, other: &Self) -> bool {
        self.0.ct_eq(&other.0).into()
    }
}

impl Eq for FlowKey {}

impl std::fmt::Debug for FlowKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FlowKey(..)")
    }
}

/// One encrypted token as the sender emits it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct EncToken {
    /// Stream offset (on the wire only in delimiter mode; derivable in window mode).
    pub offset: u64,
    /// Lane (implicit by order on the wire).
    pub lane: Lane,
    pub c1: C1,
    /// Protocol III only.
    pub c2: Option<[u8; 16]>,
}

/// The token channel's messages for one direction of a flow, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TokenMsg {
    /// `salt0` for the tokens that follow (initial value, then at every reset).
    Salt(u64),
    /// A new HTTP message starts at this stream offset.
    MessageStart(u64),
    Token(EncToken),
}

/// Hasher for tables whose keys an endpoint chooses (the sender's per-epoch counts, keyed by
/// plaintext tokens the receiver re-counts; the detector's partial occurrences, keyed by
/// sender-chosen offsets): keyed with a per-table random seed the sender never sees (a folded
/// 64×64→128-bit multiply, as in `foldhash`). SipHash cost more than a third of the per-token
/// work.
#[derive(Clone, Copy)]
pub(crate) struct SeededTokenHasher {
    seed: [u64; 2],
    state: u64,
}

#[inline(always)]
fn fold_mul(a: u64, b: u64) -> u64 {
    let m = u128::from(a) * u128::from(b);
    (m as u64) ^ ((m >> 64) as u64)
}

impl std::hash::Hasher for SeededTokenHasher {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.state = self.state.rotate_left(8) ^ u64::from(*b);
        }
    }

    fn write_u32(&mut self, v: u32) {
        self.write_u64(u64::from(v));
    }

    fn write_u64(&mut self, v: u64) {
        self.state = fold_mul(self.state ^ v ^ self.seed[1], 0x9E37_79B9_7F4A_7C15);
    }

    fn write_usize(&mut self, _: usize) {}

    fn finish(&self) -> u64 {
        fold_mul(self.state ^ self.seed[0], self.seed[1] | 1)
    }
}

/// [`std::hash::BuildHasher`] with a random seed per table.
#[derive(Clone, Copy)]
pub(crate) struct SeededTokenState([u64; 2]);

impl SeededTokenState {
    pub(crate) fn random() -> Self {
        use aws_lc_rs::rand::SecureRandom;
        let mut b = [0u8; 16];
        // Without system randomness the table still works, only with a guessable hash.
        let _ = aws_lc_rs::rand::SystemRandom::new().fill(&mut b);
        let mut lo = [0u8; 8];
        let mut hi = [0u8; 8];
        lo.copy_from_slice(&b[..8]);
        hi.copy_from_slice(&b[8..]);
        Self([
            u64::from_le_bytes(lo) ^ 0x243F_6A88_85A3_08D3,
            u64::from_le_bytes(hi) ^ 0x1319_8A2E_0370_7344,
        ])
    }
}

impl std::hash::BuildHasher for SeededTokenState {
    type Hasher = SeededTokenHasher;

    fn build_hasher(&self) -> SeededTokenHasher {
        SeededTokenHasher {
            seed: self.0,
            state: 0,
        }
    }
}

/// Largest count a [`CountTable`] slot can hold (48 bits, next to a 16-bit epoch tag). An epoch
/// in which a token occurs this often ends early (never in practice: 2⁴⁷ tokens).
const COUNT_LIMIT: u64 = 1 << 47;
const COUNT_MASK: u64 = (1 << 48) - 1;

/// Slots of the smallest [`CountTable`].
const MIN_COUNT_SLOTS: usize = 1024;

/// The most slots a [`CountTable`] grows fourfold towards (2 MiB: an epoch of P = 64 KiB).
const MAX_PRESIZED_SLOTS: usize = 1 << 17;

/// The sender's per-epoch occurrence counts: open addressing (linear probing, at most half
/// full) keyed by the token as a `u64`, hashed with a per-flow random seed (the receiver
/// re-counts sender-chosen plaintext, so the probe sequences must not be predictable). A slot
/// holds key, count and a 16-bit epoch tag side by side (one cache line per token; an epoch's
/// table can outgrow L2); a slot whose tag is not the current epoch's is empty, so a new epoch
/// clears nothing (a full wipe every 65,535 epochs, when the tag wraps). Tokens are plaintext:
/// wiped on drop.
struct CountTable {
    /// `(token, tag << 48 | occurrences so far)`.
    slots: Vec<(u64, u64)>,
    /// Current epoch's tag (`1..=0xFFFF`) in the top 16 bits.
    tag: u64,
    /// Distinct tokens this epoch.
    len: usize,
    mask: usize,
    seed: [u64; 2],
    /// The size it grows fourfold towards (see [`Self::for_period`]).
    epoch_slots: usize,
}

impl CountTable {
    #[cfg(test)]
    fn new(seed: [u64; 2]) -> Self {
        Self::with_slots(seed, MIN_COUNT_SLOTS)
    }

    /// A table for epochs of `period` bytes, growing towards the epoch's size: an epoch has at
    /// most `period` tokens per lane, so with `2 · period` slots it needs no more (one lane) and
    /// typical text, where a quarter to a half of the tokens are distinct, keeps it an eighth to
    /// a quarter full, where a probe rarely meets another token. Doubling a table up to half
    /// full instead made the sender ≈ 12% slower (docs/blindbox.md). It starts small, so a
    /// short flow zeroes kilobytes, not megabytes, and below the epoch's size it grows whenever
    /// it is a quarter full: fourfold, or once past an eighth of the epoch's size straight to it
    /// (few growths, low load). The epoch's size is capped at [`MAX_PRESIZED_SLOTS`]; from
    /// there it doubles at half full.
    fn for_period(seed: [u64; 2], period: u64) -> Self {
        let mut table = Self::with_slots(seed, MIN_COUNT_SLOTS);
        table.epoch_slots = usize::try_from(period.saturating_mul(2))
            .unwrap_or(MAX_PRESIZED_SLOTS)
            .clamp(MIN_COUNT_SLOTS, MAX_PRESIZED_SLOTS)
            .next_power_of_two();
        table
    }

    fn with_slots(seed: [u64; 2], slots: usize) -> Self {
        Self {
            slots: vec![(0, 0); slots],
            tag: 1 << 48,
            len: 0,
            mask: slots - 1,
            seed,
            epoch_slots: slots,
        }
    }

    #[inline]
    fn home(&self, key: u64) -> usize {
        self.hash(key) as usize & self.mask
    }

    /// The seeded hash of `key` (its home slot is the low bits, whatever the table's size).
    #[inline(always)]
    fn hash(&self, key: u64) -> u64 {
        seeded_hash(self.seed, key)
    }

    /// Counts one occurrence of `token`; returns the number of earlier ones this epoch.
    /// The caller starts a new epoch before a count reaches [`COUNT_LIMIT`].
    #[inline(always)]
    fn bump(&mut self, token: &Token) -> u64 {
        self.reserve(1);
        let mut table = self.open();
        let key = u64::from_le_bytes(*token);
        table.bump(key, table.hash(key))
    }

    /// Makes room for `n` more distinct tokens, so that the next `n` bumps through
    /// [`Self::open`] (which does not grow the table) keep it at most half full.
    #[inline(always)]
    fn reserve(&mut self, n: usize) {
        // Below the epoch's size a quarter full is full (see `for_period`).
        let per_slot = if self.slots.len() < self.epoch_slots {
            4
        } else {
            2
        };
        while per_slot * (self.len + n) > self.slots.len() {
            self.grow();
        }
    }

    /// The table opened for a run of bumps (see [`OpenTable`]); no growth check in them, so the
    /// AES-NI kernel can run them between its rounds without a call that would spill its
    /// registers ([`Self::reserve`] first).
    #[inline(always)]
    fn open(&mut self) -> OpenTable<'_> {
        OpenTable {
            slots: &mut self.slots,
            len: &mut self.len,
            added: 0,
            mask: self.mask,
            tag: self.tag,
            seed: self.seed,
        }
    }

    #[cold]
    #[inline(never)]
    fn grow(&mut self) {
        let size = if self.slots.len() < self.epoch_slots {
            // Fourfold while small; past an eighth of the epoch's size straight to it (each
            // growth re-inserts every token, and a flow that big is likely to fill an epoch).
            let four = self.slots.len() * 4;
            if four > self.epoch_slots / 8 {
                self.epoch_slots
            } else {
                four
            }
        } else {
            self.slots.len() * 2
        };
        let mut bigger = Self::with_slots(self.seed, size);
        bigger.tag = self.tag;
        bigger.epoch_slots = self.epoch_slots;
        for &(k, c) in &self.slots {
            if c & !COUNT_MASK != self.tag {
                continue;
            }
            let mut j = bigger.home(k);
            while bigger
                .slots
                .get(j)
                .is_some_and(|s| s.1 & !COUNT_MASK == bigger.tag)
            {
                j = (j + 1) & bigger.mask;
            }
            if let Some(s) = bigger.slots.get_mut(j) {
                *s = (k, c);
                bigger.len += 1;
            }
        }
        *self = bigger;
    }

    fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn len(&self) -> usize {
        self.len
    }

    /// Starts a new epoch: every slot becomes empty.
    fn clear(&mut self) {
        self.len = 0;
        self.tag = self.tag.wrapping_add(1 << 48);
        if self.tag == 0 {
            for s in self.slots.iter_mut() {
                *s = (0, 0);
            }
            self.tag = 1 << 48;
        }
    }
}

/// The count table's hash: its home slot is the low bits, whatever the table's size.
#[inline(always)]
fn seeded_hash(seed: [u64; 2], key: u64) -> u64 {
    fold_mul(key ^ seed[0], seed[1] | 1)
}

/// A [`CountTable`] opened for a run of bumps, with its fixed fields copied into locals: inside
/// the AES kernel the compiler reloaded each of them through the table's reference for every
/// token. The number of new tokens is written back when it is dropped.
struct OpenTable<'t> {
    slots: &'t mut [(u64, u64)],
    len: &'t mut usize,
    added: usize,
    mask: usize,
    tag: u64,
    seed: [u64; 2],
}

impl OpenTable<'_> {
    #[inline(always)]
    fn hash(&self, key: u64) -> u64 {
        seeded_hash(self.seed, key)
    }

    /// Prefetches the home slot of the key with hash `hash` (a few tokens before it is counted:
    /// an epoch's table can outgrow L1/L2, and the counting is otherwise one dependent miss at a
    /// time).
    #[inline(always)]
    fn prefetch(&self, hash: u64) {
        if let Some(s) = self.slots.get(hash as usize & self.mask) {
            aesni::prefetch(s);
        }
    }

    /// Counts `key` (whose [`Self::hash`] is `hash`); returns its earlier occurrences this
    /// epoch.
    #[inline(always)]
    fn bump(&mut self, key: u64, hash: u64) -> u64 {
        let tag = self.tag;
        let mut i = hash as usize & self.mask;
        // At most half full: the probe ends at a free slot. Whether the token is new or seen
        // before is a select, not a branch (it is as unpredictable as the text); only a slot
        // holding another token branches, rare in a table sized for its epoch.
        loop {
            let Some(s) = self.slots.get_mut(i) else {
                return 0;
            };
            let live = s.1 & !COUNT_MASK == tag;
            let seen = live & (s.0 == key);
            if live & !seen {
                i = (i + 1) & self.mask;
                continue;
            }
            let count = if seen { s.1 & COUNT_MASK } else { 0 };
            *s = (key, tag | (count + 1).min(COUNT_MASK));
            self.added += usize::from(!seen);
            return count;
        }
    }
}

impl Drop for OpenTable<'_> {
    fn drop(&mut self) {
        *self.len += self.added;
    }
}

impl Drop for CountTable {
    fn drop(&mut self) {
        for s in self.slots.iter_mut() {
            s.0.zeroize();
        }
    }
}

/// The sender's DPIEnc state for one direction of a flow.
pub struct TokenEncryptor {
    key: TokenKey,
    scheme: SaltScheme,
    salt0: u64,
    period: u64,
    epoch_start: Option<u64>,
    counts: CountTable,
    max_count: u64,
    flow_key: Option<FlowKey>,
    announced: bool,
    /// `K_t` blocks of the current run (zeroized after use).
    scratch: Vec<aes::Block>,
    /// Tokens of the current run waiting for their ciphertexts.
    jobs: Vec<Job>,
    /// Round keys of the eight-key AES (zeroized after each run and on drop).
    aes_work: aes8::Work,
    /// The AES-NI path's batch (boxed: 1.6 KB).
    pending: Box<Pending>,
    /// The AES-NI path's next batch, counted while the kernel encrypts `pending`.
    pending_next: Box<Pending>,
}

/// Events per pass of the portable path of [`TokenEncryptor::process_all`] (a multiple of the AES
/// lanes).
const RUN: usize = 256;

/// How many events ahead the AES-NI path prefetches count-table slots.
const PREFETCH_AHEAD: usize = 16;

/// Tokenizer events by index, for the AES-NI path (which looks ahead to prefetch count-table
/// slots): a slice of events, or a window run read straight from the bytes.
trait EventRun: Copy {
    fn len(&self) -> usize;
    fn event(&self, i: usize) -> Option<FlowEvent>;
    /// Event `i`'s token as a little-endian `u64` (`None` past the end or for other events).
    fn token_key(&self, i: usize) -> Option<u64>;
    /// Event `i` if it is a token: its offset, lane and [`Self::token_key`].
    fn token(&self, i: usize) -> Option<(u64, Lane, u64)>;
}

impl EventRun for &[FlowEvent] {
    #[inline(always)]
    fn len(&self) -> usize {
        <[FlowEvent]>::len(self)
    }
    #[inline(always)]
    fn event(&self, i: usize) -> Option<FlowEvent> {
        self.get(i).copied()
    }
    #[inline(always)]
    fn token_key(&self, i: usize) -> Option<u64> {
        self.token(i).map(|(_, _, key)| key)
    }
    #[inline(always)]
    fn token(&self, i: usize) -> Option<(u64, Lane, u64)> {
        match self.get(i) {
            Some(FlowEvent::Token {
                offset,
                lane,
                token,
            }) => Some((*offset, *lane, u64::from_le_bytes(*token))),
            _ => None,
        }
    }
}

/// The `Exact` token at each offset `first + i` of `bytes` ([`WindowRun::Tokens`]).
#[derive(Clone, Copy)]
struct WindowTokens<'a> {
    first: u64,
    bytes: &'a [u8],
}

impl EventRun for WindowTokens<'_> {
    #[inline(always)]
    fn len(&self) -> usize {
        self.bytes.len().saturating_sub(TOKEN_LEN - 1)
    }
    #[inline(always)]
    fn event(&self, i: usize) -> Option<FlowEvent> {
        let token = self.bytes.get(i..i + TOKEN_LEN)?.try_into().ok()?;
        Some(FlowEvent::Token {
            offset: self.first + i as u64,
            lane: Lane::Exact,
            token,
        })
    }
    #[inline(always)]
    fn token_key(&self, i: usize) -> Option<u64> {
        let token = self.bytes.get(i..i + TOKEN_LEN)?.try_into().ok()?;
        Some(u64::from_le_bytes(token))
    }
    #[inline(always)]
    fn token(&self, i: usize) -> Option<(u64, Lane, u64)> {
        Some((self.first + i as u64, Lane::Exact, self.token_key(i)?))
    }
}

/// The AES-NI path's counting step: the salts of a run's tokens, in stream order, into a batch
/// (see [`TokenEncryptor::process_run_ni`]).
struct SaltCounter<'a, R> {
    counts: &'a mut CountTable,
    max_count: &'a mut u64,
    epoch_start: &'a mut Option<u64>,
    period: u64,
    salt0: u64,
    scheme: SaltScheme,
    run: R,
}

impl<R: EventRun> SaltCounter<'_, R> {
    /// Counts up to `budget` tokens from event `*at` on into `batch`. Stops early when the batch
    /// is full, at the end of the run, at an event that is not a token, or at a token that
    /// starts a new epoch (the caller handles those). The count table must have room for the
    /// tokens ([`CountTable::reserve`] of a batch first).
    #[inline(always)]
    fn fill(&mut self, at: &mut usize, batch: &mut Pending, budget: usize) {
        let mut i = *at;
        let stop = (i + budget.min(aesni::LANES - batch.len)).min(self.run.len());
        // The flow's first token starts the first epoch; the epoch ends P bytes after its first.
        if self.epoch_start.is_none() {
            *self.epoch_start = self.run.token(i).map(|(offset, _, _)| offset);
        }
        let epoch_end = self.epoch_start.and_then(|s| epoch_end(s, self.period));
        // Locals, kept in registers (see `OpenTable`).
        let (run, salt0, scheme) = (self.run, self.salt0, self.scheme);
        let mut max_count = *self.max_count;
        let mut table = self.counts.open();
        while i < stop {
            if let Some(ahead) = run.token_key(i + PREFETCH_AHEAD) {
                table.prefetch(table.hash(ahead));
            }
            let Some((offset, lane, key)) = run.token(i) else {
                break;
            };
            if epoch_end.is_some_and(|end| offset >= end) || max_count >= COUNT_LIMIT {
                break;
            }
            let count = table.bump(key, table.hash(key));
            max_count = max_count.max(count);
            let n = batch.len;
            if let (Some(o), Some(l), Some(t), Some(s)) = (
                batch.offset.get_mut(n),
                batch.lane.get_mut(n),
                batch.token.get_mut(n),
                batch.salt.get_mut(n),
            ) {
                *o = offset;
                *l = lane;
                *t = key;
                *s = scheme.salt(salt0, count);
                batch.len += 1;
            }
            i += 1;
        }
        drop(table);
        *self.max_count = max_count;
        *at = i;
    }
}

/// The first offset past the epoch that starts at `start` (`None`: the epoch never ends by
/// offset, its end being past `u64::MAX`).
#[inline(always)]
fn epoch_end(start: u64, period: u64) -> Option<u64> {
    start.checked_add(period)
}

/// The next batch's counting, run by the kernel between its rounds (a share of the batch per
/// call).
struct Counting<'c, 'a, R> {
    salts: &'c mut SaltCounter<'a, R>,
    at: &'c mut usize,
    batch: &'c mut Pending,
}

impl<R: EventRun> aesni::Between for Counting<'_, '_, R> {
    #[inline(always)]
    fn between(&mut self) {
        let per_call = aesni::LANES.div_ceil(aesni::BETWEEN_CALLS);
        self.salts.fill(self.at, self.batch, per_call);
    }
}

/// A token whose salt is known and whose ciphertexts are still to be computed.
struct Job {
    /// Index of its message in the output.
    msg: usize,
    /// Index of its event (and `K_t`) in the run.
    ev: usize,
    salt: u64,
}

/// Up to [`aesni::LANES`] tokens whose salts are known, waiting for the AES-NI kernel; their
/// messages are appended to the output when the kernel has run (before any other message).
struct Pending {
    offset: [u64; aesni::LANES],
    lane: [Lane; aesni::LANES],
    /// Tokens as little-endian `u64`s.
    token: [u64; aesni::LANES],
    salt: [u64; aesni::LANES],
    len: usize,
    /// The kernel's outputs (kept here so that no batch zeroes them first).
    c1: [u64; aesni::LANES],
    /// `AES_{K_t}(salt + 1)`: wiped after each Protocol III batch.
    c2: [u128; aesni::LANES],
}

impl Default for Pending {
    fn default() -> Self {
        Self {
            offset: [0; aesni::LANES],
            lane: [Lane::Exact; aesni::LANES],
            token: [0; aesni::LANES],
            salt: [0; aesni::LANES],
            len: 0,
            c1: [0; aesni::LANES],
            c2: [0; aesni::LANES],
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        // Plaintext tokens.
        self.token.zeroize();
    }
}

impl TokenEncryptor {
    /// Protocols I/II. `period` is P in bytes of stream (at least 1).
    pub fn new(key: TokenKey, salt0: u64, period: u64) -> Self {
        Self {
            key,
            scheme: SaltScheme::ExactMatch,
            salt0,
            period: period.max(1),
            epoch_start: None,
            counts: CountTable::for_period(SeededTokenState::random().0, period.max(1)),
            max_count: 0,
            flow_key: None,
            announced: false,
            scratch: Vec::new(),
            jobs: Vec::new(),
            aes_work: aes8::Work::default(),
            pending: Box::default(),
            pending_next: Box::default(),
        }
    }

    /// Protocol III: `salt0` is rounded down to even, and every token carries `c2`.
    pub fn with_flow_key(key: TokenKey, salt0: u64, period: u64, flow_key: FlowKey) -> Self {
        let mut s = Self::new(key, salt0 & !1, period);
        s.scheme = SaltScheme::ProbableCause;
        s.flow_key = Some(flow_key);
        s
    }

    /// The current epoch's `salt0`.
    pub fn salt0(&self) -> u64 {
        self.salt0
    }

    /// Encrypts one tokenizer event.
    pub fn process(&mut self, ev: &FlowEvent, out: &mut Vec<TokenMsg>) {
        let kt = match ev {
            FlowEvent::Token { token, .. } => self.key.keyword_key(token),
            FlowEvent::MessageStart(_) => KeywordKey([0; 16]),
        };
        self.process_with(ev, &kt, out);
    }

    /// Encrypts a run of tokenizer events: the salts in order (counts, epochs) and the DPIEnc
    /// encryptions — with AES-NI 32 tokens at a time, `K_t`, its schedule and the salt blocks
    /// in registers (`aesni`); otherwise every `K_t = AES_k(t)` of the run in one pipelined
    /// multi-block AES call, then eight key schedules expanded in lockstep (`aes8`). Same output
    /// as calling [`Self::process`] on each event.
    pub fn process_all(&mut self, evs: &[FlowEvent], out: &mut Vec<TokenMsg>) {
        // With AES-NI, one pipeline over the whole slice (each call starts and drains it).
        if self.process_run_ni(evs, out) {
            return;
        }
        // In slices, so the per-token scratch stays in L1.
        for part in evs.chunks(RUN) {
            self.process_run_portable(part, out);
        }
    }

    /// [`Self::process_all`] over the events of a [`WindowRun`] (the sender's path for
    /// window-tokenized, exact-lane flows): same output, without the events in between.
    pub fn process_window_run(&mut self, run: WindowRun<'_>, out: &mut Vec<TokenMsg>) {
        if let WindowRun::Tokens { first, bytes } = run {
            if self.process_run_ni(WindowTokens { first, bytes }, out) {
                return;
            }
        }
        self.process_all(&run.events(), out);
    }

    /// [`Self::process_all`] for one slice without AES-NI.
    fn process_run_portable(&mut self, evs: &[FlowEvent], out: &mut Vec<TokenMsg>) {
        let mut blocks = std::mem::take(&mut self.scratch);
        blocks.clear();
        blocks.extend(evs.iter().map(|ev| {
            let mut b = aes::Block::default();
            if let FlowEvent::Token { token, .. } = ev {
                b[..8].copy_from_slice(token);
            }
            b
        }));
        self.key.cipher.encrypt_blocks(&mut blocks);
        // Salts in stream order; the ciphertexts are filled in below.
        let mut jobs = std::mem::take(&mut self.jobs);
        jobs.clear();
        if !evs.is_empty() {
            self.announce_once(out);
        }
        for (i, ev) in evs.iter().enumerate() {
            match *ev {
                FlowEvent::MessageStart(o) => out.push(TokenMsg::MessageStart(o)),
                FlowEvent::Token {
                    offset,
                    lane,
                    token,
                } => {
                    self.new_epoch_if_due(offset, out);
                    let salt = self.next_salt(&token);
                    jobs.push(Job {
                        msg: out.len(),
                        ev: i,
                        salt,
                    });
                    out.push(TokenMsg::Token(EncToken {
                        offset,
                        lane,
                        c1: [0; C1_LEN],
                        c2: None,
                    }));
                }
            }
        }
        let p3 = self.flow_key.is_some();
        let mut states = [aes::Block8::default(), aes::Block8::default()];
        let nstates = if p3 { 2 } else { 1 };
        for group in jobs.chunks(aes8::LANES) {
            let mut keys = [0u128; aes8::LANES];
            for (j, job) in group.iter().enumerate() {
                if let (Some(k), Some(b)) = (keys.get_mut(j), blocks.get(job.ev)) {
                    *k = u128::from_le_bytes((*b).into());
                }
                if let Some(b) = states[0].get_mut(j) {
                    *b = salt_block(job.salt).into();
                }
                if let Some(b) = states[1].get_mut(j) {
                    *b = salt_block(job.salt.wrapping_add(1)).into();
                }
            }
            aes8::encrypt8(&keys, &mut states[..nstates], &mut self.aes_work);
            keys.zeroize();
            for (j, job) in group.iter().enumerate() {
                let Some(TokenMsg::Token(t)) = out.get_mut(job.msg) else {
                    continue;
                };
                if let Some(b) = states[0].get(j) {
                    t.c1.copy_from_slice(&b[..C1_LEN]);
                }
                if let (Some(fk), Some(b)) = (self.flow_key.as_ref(), states[1].get(j)) {
                    let mut c2: [u8; 16] = (*b).into();
                    for (c, k) in c2.iter_mut().zip(fk.0.iter()) {
                        *c ^= k;
                    }
                    t.c2 = Some(c2);
                }
            }
        }
        for s in states.iter_mut() {
            s.iter_mut().for_each(|b| b.zeroize());
        }
        self.aes_work.zeroize();
        blocks.iter_mut().for_each(|b| b.zeroize());
        self.scratch = blocks;
        self.jobs = jobs;
    }

    /// [`Self::process_all`] on the AES-NI path, pipelined: salts in stream order as on the
    /// portable path, [`aesni::LANES`] tokens at a time, and while the kernel computes one
    /// batch's ciphertexts (`K_t`, its schedule and the salt blocks all in registers) it counts
    /// the next batch's tokens between its rounds, so the count table's integer work and the
    /// kernel's vector work run at the same time. A message start or a new epoch first flushes
    /// the batches, so the order is the stream's. Returns `false`, having done nothing, without
    /// AES-NI (the caller then takes the portable path).
    fn process_run_ni(&mut self, run: impl EventRun, out: &mut Vec<TokenMsg>) -> bool {
        if self.key.ni.is_none() {
            return false;
        }
        let n = run.len();
        if n == 0 {
            return true;
        }
        out.reserve(n + 1);
        self.announce_once(out);
        let mut cur = std::mem::take(&mut self.pending);
        let mut next = std::mem::take(&mut self.pending_next);
        let mut at = 0;
        while at < n {
            let Self {
                key,
                flow_key,
                counts,
                max_count,
                epoch_start,
                period,
                salt0,
                scheme,
                ..
            } = self;
            // Checked on entry; the borrow is taken again after `reset` needed all of `self`.
            let Some(ni) = key.ni.as_ref() else {
                break;
            };
            let mut salts = SaltCounter {
                counts,
                max_count,
                epoch_start,
                period: *period,
                salt0: *salt0,
                scheme: *scheme,
                run,
            };
            salts.counts.reserve(aesni::LANES);
            salts.fill(&mut at, &mut cur, aesni::LANES);
            while cur.len > 0 {
                // Room for the next batch, which the kernel counts.
                salts.counts.reserve(aesni::LANES);
                let mut counting = Counting {
                    salts: &mut salts,
                    at: &mut at,
                    batch: &mut next,
                };
                run_batch(ni, flow_key.as_ref(), &mut cur, out, &mut counting);
                std::mem::swap(&mut cur, &mut next);
                // Tops the batch up (the kernel's calls fill it only as far as they may).
                salts.counts.reserve(aesni::LANES);
                salts.fill(&mut at, &mut cur, aesni::LANES);
            }
            // Both batches are empty: the run ended, or event `at` needs the stream flushed.
            match run.event(at) {
                None => break,
                Some(FlowEvent::MessageStart(o)) => out.push(TokenMsg::MessageStart(o)),
                Some(FlowEvent::Token { offset, .. }) => {
                    self.reset(offset);
                    out.push(TokenMsg::Salt(self.salt0));
                    continue;
                }
            }
            at += 1;
        }
        self.pending = cur;
        self.pending_next = next;
        true
    }

    /// The salt of the next occurrence of `token` in this epoch (counts it).
    #[inline(always)]
    fn next_salt(&mut self, token: &Token) -> u64 {
        let count = self.counts.bump(token);
        self.max_count = self.max_count.max(count);
        self.scheme.salt(self.salt0, count)
    }

    /// Announces the first epoch's `salt0` before the flow's first message.
    #[inline(always)]
    fn announce_once(&mut self, out: &mut Vec<TokenMsg>) {
        if !self.announced {
            self.announced = true;
            out.push(TokenMsg::Salt(self.salt0));
        }
    }

    fn process_with(&mut self, ev: &FlowEvent, kt: &KeywordKey, out: &mut Vec<TokenMsg>) {
        self.announce_once(out);
        match *ev {
            FlowEvent::MessageStart(o) => out.push(TokenMsg::MessageStart(o)),
            FlowEvent::Token {
                offset,
                lane,
                token,
            } => {
                self.new_epoch_if_due(offset, out);
                out.push(TokenMsg::Token(self.encrypt(offset, lane, &token, kt)));
            }
        }
    }

    /// Starts a new epoch (and announces its `salt0`) when `offset` is P or more past the
    /// epoch's first token, or, never in practice, when a count reached [`COUNT_LIMIT`].
    #[inline(always)]
    fn new_epoch_if_due(&mut self, offset: u64, out: &mut Vec<TokenMsg>) {
        if self.epoch_due(offset) {
            self.reset(offset);
            out.push(TokenMsg::Salt(self.salt0));
        }
    }

    /// Whether the token at `offset` starts a new epoch (see [`Self::new_epoch_if_due`]).
    #[inline(always)]
    fn epoch_due(&mut self, offset: u64) -> bool {
        let start = *self.epoch_start.get_or_insert(offset);
        epoch_end(start, self.period).is_some_and(|end| offset >= end)
            || self.max_count >= COUNT_LIMIT
    }

    fn reset(&mut self, offset: u64) {
        let had_tokens = !self.counts.is_empty();
        self.counts.clear();
        if had_tokens {
            self.salt0 = self.scheme.next_salt0(self.salt0, self.max_count);
        }
        self.max_count = 0;
        self.epoch_start = Some(offset);
    }

    fn encrypt(&mut self, offset: u64, lane: Lane, token: &Token, kt: &KeywordKey) -> EncToken {
        let salt = self.next_salt(token);
        let cipher = kt.cipher();
        let c1 = enc(&cipher, salt);
        let c2 = self.flow_key.as_ref().map(|fk| {
            let mut block = salted_block(&cipher, salt.wrapping_add(1));
            for (b, k) in block.iter_mut().zip(fk.0.iter()) {
                *b ^= k;
            }
            block
        });
        EncToken {
            offset,
            lane,
            c1,
            c2,
        }
    }
}

/// Computes the pending tokens' ciphertexts (AES-NI path) with `between` run during the kernel
/// (see [`aesni::DpiEncNi::encrypt_batch`]), appends their messages to `out` and empties
/// `pending`.
#[inline]
fn run_batch(
    ni: &aesni::DpiEncNi,
    flow_key: Option<&FlowKey>,
    pending: &mut Pending,
    out: &mut Vec<TokenMsg>,
    between: &mut impl aesni::Between,
) {
    let n = pending.len;
    if n == 0 {
        return;
    }
    pending.len = 0;
    let p = pending;
    let Some(fk) = flow_key else {
        ni.encrypt_batch(&p.token, &p.salt, &mut p.c1, &mut p.c2, false, between);
        out.extend(
            p.offset
                .iter()
                .zip(p.lane.iter())
                .zip(p.c1.iter())
                .take(n)
                .map(|((offset, lane), c1)| kernel_msg(*offset, *lane, *c1, None)),
        );
        return;
    };
    ni.encrypt_batch(&p.token, &p.salt, &mut p.c1, &mut p.c2, true, between);
    let fk = u128::from_le_bytes(fk.0);
    out.extend(
        p.offset
            .iter()
            .zip(p.lane.iter())
            .zip(p.c1.iter().zip(p.c2.iter()))
            .take(n)
            .map(|((offset, lane), (c1, c2))| {
                kernel_msg(*offset, *lane, *c1, Some((c2 ^ fk).to_le_bytes()))
            }),
    );
    // `AES_{K_t}(salt + 1)` next to `c2` would give the flow key.
    p.c2.zeroize();
}

/// A token message from the kernel's `c1` output (DPIEnc keeps its first [`C1_LEN`] bytes).
#[inline(always)]
fn kernel_msg(offset: u64, lane: Lane, c1: u64, c2: Option<[u8; 16]>) -> TokenMsg {
    let mut c = [0u8; C1_LEN];
    c.copy_from_slice(&c1.to_le_bytes()[..C1_LEN]);
    TokenMsg::Token(EncToken {
        offset,
        lane,
        c1: c,
        c2,
    })
}

impl std::fmt::Debug for TokenEncryptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenEncryptor")
            .field("scheme", &self.scheme)
            .field("salt0", &self.salt0)
            .field("period", &self.period)
            .field("distinct_tokens", &self.counts.len())
            .finish_non_exhaustive()
    }
}

/// Associated data binding sealed secrets to their purpose.
const SEAL_AAD: &[u8] = b"mbx-blindbox p3 traffic secrets v1";

/// Seals the primary channel's traffic secrets under `flow_key`: AES-128-GCM, all-zero nonce (the
/// key is fresh per flow and seals exactly one message), fixed associated data. Sent once on the
/// token channel.
pub fn seal_secrets(flow_key: &FlowKey, secrets: &[u8]) -> Result<Vec<u8>, DpiEncError> {
    let key = aead::LessSafeKey::new(
        aead::UnboundKey::new(&aead::AES_128_GCM, &flow_key.0)
            .map_err(|_| DpiEncError::SecretsAuth)?,
    );
    let mut buf = secrets.to_vec();
    key.seal_in_place_append_tag(
        aead::Nonce::assume_unique_for_key([0u8; 12]),
        aead::Aad::from(SEAL_AAD),
        &mut buf,
    )
    .map_err(|_| DpiEncError::SecretsAuth)?;
    Ok(buf)
}

/// Opens what [`seal_secrets`] produced, with a flow key recovered from a Protocol III hit.
pub fn open_secrets(flow_key: &FlowKey, sealed: &[u8]) -> Result<Zeroizing<Vec<u8>>, DpiEncError> {
    if sealed.len() < aead::AES_128_GCM.tag_len() {
        return Err(DpiEncError::SecretsTruncated);
    }
    let key = aead::LessSafeKey::new(
        aead::UnboundKey::new(&aead::AES_128_GCM, &flow_key.0)
            .map_err(|_| DpiEncError::SecretsAuth)?,
    );
    let mut buf = Zeroizing::new(sealed.to_vec());
    let n = key
        .open_in_place(
            aead::Nonce::assume_unique_for_key([0u8; 12]),
            aead::Aad::from(SEAL_AAD),
            &mut buf,
        )
        .map_err(|_| DpiEncError::SecretsAuth)?
        .len();
    buf.truncate(n);
    Ok(buf)
}

/// Recovers the flow key from a Protocol III token whose `c1` matched the chunk with key `keyword`
/// at (even) salt `salt`.
pub fn recover_flow_key(keyword: &Aes128, salt: u64, c2: &[u8; 16]) -> FlowKey {
    let mut block = salted_block(keyword, salt.wrapping_add(1));
    for (b, c) in block.iter_mut().zip(c2.iter()) {
        *b ^= c;
    }
    let fk = FlowKey(block);
    block.zeroize();
    fk
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenize::Lane;
    use std::collections::HashSet;

    fn tok(s: &[u8; 8], offset: u64) -> FlowEvent {
        FlowEvent::Token {
            offset,
            lane: Lane::Exact,
            token: *s,
        }
    }

    fn tokens(msgs: &[TokenMsg]) -> Vec<EncToken> {
        msgs.iter()
            .filter_map(|m| match m {
                TokenMsg::Token(t) => Some(*t),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn aes_known_answer() {
        // FIPS-197 C.1 (AES-128): checks the `aes` crate is used as plain AES-128.
        let key: [u8; 16] = core::array::from_fn(|i| i as u8);
        let pt: [u8; 16] = core::array::from_fn(|i| (i as u8) * 0x11);
        let mut b = pt.into();
        aes::Aes128::new(&key.into()).encrypt_block(&mut b);
        let ct: [u8; 16] = b.into();
        assert_eq!(ct.to_vec(), hex_lit("69c4e0d86a7b0430d8cdb78070b4c55a"));
    }

    fn hex_lit(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn equal_tokens_never_repeat_a_ciphertext() {
        let mut e = TokenEncryptor::new(TokenKey::new(&[7; 16]), 1000, 1 << 20);
        let mut out = Vec::new();
        for i in 0..500 {
            e.process(&tok(b"AAAAAAAA", i), &mut out);
            e.process(&tok(b"BBBBBBBB", i), &mut out);
        }
        let cts: HashSet<C1> = tokens(&out).iter().map(|t| t.c1).collect();
        assert_eq!(cts.len(), 1000);
    }

    proptest::proptest! {
        /// Across resets too, two occurrences of one token never share a ciphertext (so never a
        /// salt), whatever the period and the token sequence.
        #[test]
        fn no_repeat_across_resets(seq in proptest::collection::vec((0u8..4, 1u64..5), 1..400),
                                   period in 1u64..40, salt0 in proptest::prelude::any::<u64>()) {
            let mut e = TokenEncryptor::new(TokenKey::new(&[5; 16]), salt0, period);
            let mut out = Vec::new();
            let mut offset = 0;
            let mut values = Vec::new();
            for (v, step) in seq {
                offset += step;
                values.push(v);
                e.process(&tok(&[b'a' + v; 8], offset), &mut out);
            }
            let mut seen = HashSet::new();
            for (v, t) in values.iter().zip(tokens(&out)) {
                proptest::prop_assert!(seen.insert((*v, t.c1)), "repeated ciphertext for token {}", v);
            }
        }
    }

    #[test]
    fn salts_follow_counts_and_resets() {
        let key = TokenKey::new(&[9; 16]);
        let ka = key.keyword_key(b"AAAAAAAA").cipher();
        let kb = key.keyword_key(b"BBBBBBBB").cipher();
        let mut e = TokenEncryptor::new(TokenKey::new(&[9; 16]), 50, 10);
        let mut out = Vec::new();
        // Epoch 1 (offsets 0..10): A, B, A, A  -> max count 2.
        for (i, t) in [b"AAAAAAAA", b"BBBBBBBB", b"AAAAAAAA", b"AAAAAAAA"]
            .iter()
            .enumerate()
        {
            e.process(&tok(t, i as u64), &mut out);
        }
        // Offset 10 starts epoch 2 with salt0 = 50 + 3.
        e.process(&tok(b"AAAAAAAA", 10), &mut out);
        e.process(&tok(b"BBBBBBBB", 11), &mut out);
        let expect = vec![
            TokenMsg::Salt(50),
            TokenMsg::Token(EncToken {
                offset: 0,
                lane: Lane::Exact,
                c1: enc(&ka, 50),
                c2: None,
            }),
            TokenMsg::Token(EncToken {
                offset: 1,
                lane: Lane::Exact,
                c1: enc(&kb, 50),
                c2: None,
            }),
            TokenMsg::Token(EncToken {
                offset: 2,
                lane: Lane::Exact,
                c1: enc(&ka, 51),
                c2: None,
            }),
            TokenMsg::Token(EncToken {
                offset: 3,
                lane: Lane::Exact,
                c1: enc(&ka, 52),
                c2: None,
            }),
            TokenMsg::Salt(53),
            TokenMsg::Token(EncToken {
                offset: 10,
                lane: Lane::Exact,
                c1: enc(&ka, 53),
                c2: None,
            }),
            TokenMsg::Token(EncToken {
                offset: 11,
                lane: Lane::Exact,
                c1: enc(&kb, 53),
                c2: None,
            }),
        ];
        assert_eq!(out, expect);
    }

    #[test]
    fn protocol3_pairs_and_key_recovery() {
        let key = TokenKey::new(&[3; 16]);
        let ka = key.keyword_key(b"AAAAAAAA").cipher();
        let fk = FlowKey::from_bytes([0x5a; 16]);
        let mut e =
            TokenEncryptor::with_flow_key(TokenKey::new(&[3; 16]), 101, 1 << 20, fk.clone());
        let mut out = Vec::new();
        e.process(&tok(b"AAAAAAAA", 0), &mut out);
        e.process(&tok(b"AAAAAAAA", 1), &mut out);
        assert_eq!(out[0], TokenMsg::Salt(100), "salt0 rounded to even");
        let toks = tokens(&out);
        assert_eq!(toks[0].c1, enc(&ka, 100));
        assert_eq!(toks[1].c1, enc(&ka, 102));
        // c1 and c2 never use the same salt: c1 ⊕ c2 does not reveal the key.
        let c2 = toks[0].c2.unwrap();
        assert_ne!(salted_block(&ka, 100), salted_block(&ka, 101));
        assert_eq!(recover_flow_key(&ka, 100, &c2), fk);
        assert_eq!(recover_flow_key(&ka, 102, &toks[1].c2.unwrap()), fk);
        // The wrong chunk key recovers garbage.
        let kb = key.keyword_key(b"BBBBBBBB").cipher();
        assert_ne!(recover_flow_key(&kb, 100, &c2), fk);
    }

    proptest::proptest! {
        /// The batched path (eight-key AES, salts first) gives exactly the per-event path's
        /// messages, in both salt schemes, across epochs and message starts, for any run split.
        #[test]
        fn batched_equals_per_event(seq in proptest::collection::vec((0u8..6, 0u64..4, proptest::prelude::any::<bool>()), 0..600),
                                    cut in 0usize..601, period in 1u64..300, p3 in proptest::prelude::any::<bool>()) {
            let key = [0x31; 16];
            let make_with = |k: TokenKey| if p3 {
                TokenEncryptor::with_flow_key(k, 99, period, FlowKey::from_bytes([0x77; 16]))
            } else {
                TokenEncryptor::new(k, 99, period)
            };
            let make = || make_with(TokenKey::new(&key));
            let mut offset = 0;
            let evs: Vec<FlowEvent> = seq.iter().map(|&(v, step, msg)| {
                offset += step;
                if msg && v == 0 {
                    FlowEvent::MessageStart(offset)
                } else {
                    FlowEvent::Token { offset, lane: if msg { Lane::Folded } else { Lane::Exact }, token: [b'a' + v; 8] }
                }
            }).collect();
            let (mut one, mut all) = (Vec::new(), Vec::new());
            let mut e = make();
            for ev in &evs {
                e.process(ev, &mut one);
            }
            let mut b = make();
            let cut = cut.min(evs.len());
            b.process_all(&evs[..cut], &mut all);
            b.process_all(&evs[cut..], &mut all);
            proptest::prop_assert_eq!(&one, &all);
            // The portable batched path (`aes8`), forced even where AES-NI is available.
            let mut soft = Vec::new();
            let mut c = make_with(TokenKey::portable(&key));
            c.process_all(&evs[..cut], &mut soft);
            c.process_all(&evs[cut..], &mut soft);
            proptest::prop_assert_eq!(&one, &soft);
            // Each AES-NI kernel the CPU has, forced.
            for kernel in aesni::available_kernels() {
                let mut forced = Vec::new();
                let mut c = make_with(TokenKey::with_kernel(&key, kernel).expect("available"));
                c.process_all(&evs[..cut], &mut forced);
                c.process_all(&evs[cut..], &mut forced);
                proptest::prop_assert_eq!(&one, &forced, "{:?}", kernel);
            }
        }
    }

    /// A long stream (many epochs, message starts, both salt schemes, random keys): the AES-NI
    /// path and the forced portable path emit identical messages; on a CPU with AES-NI the
    /// AES-NI path is the one `TokenKey::new` picks.
    #[test]
    fn aesni_and_portable_paths_agree() {
        use rand::{Rng, SeedableRng};
        #[cfg(target_arch = "x86_64")]
        assert_eq!(
            TokenKey::new(&[0; 16]).uses_aesni(),
            std::arch::is_x86_feature_detected!("aes")
                && std::arch::is_x86_feature_detected!("ssse3")
        );
        assert!(!TokenKey::portable(&[0; 16]).uses_aesni());
        let mut rng = rand::rngs::StdRng::seed_from_u64(21);
        for round in 0..8 {
            let key: [u8; 16] = rng.gen();
            let salt0 = if round == 0 { u64::MAX - 3 } else { rng.gen() };
            let period = [1, 7, 300, 5000][round % 4];
            let mut offset = 0u64;
            let evs: Vec<FlowEvent> = (0..20_000)
                .map(|i| {
                    offset += u64::from(rng.gen_range(0u8..3));
                    if i % 997 == 0 {
                        FlowEvent::MessageStart(offset)
                    } else {
                        let v = rng.gen_range(0u64..64);
                        FlowEvent::Token {
                            offset,
                            lane: Lane::Exact,
                            token: ((v * 0x0101_0101_0101_0101) ^ rng.gen_range(0u64..4))
                                .to_le_bytes(),
                        }
                    }
                })
                .collect();
            let p3 = round % 2 == 1;
            let make = |k: TokenKey| {
                if p3 {
                    TokenEncryptor::with_flow_key(k, salt0, period, FlowKey::from_bytes(key))
                } else {
                    TokenEncryptor::new(k, salt0, period)
                }
            };
            let (mut fast, mut soft) = (Vec::new(), Vec::new());
            make(TokenKey::new(&key)).process_all(&evs, &mut fast);
            make(TokenKey::portable(&key)).process_all(&evs, &mut soft);
            assert_eq!(fast, soft, "round {round}");
            for kernel in aesni::available_kernels() {
                let mut forced = Vec::new();
                make(TokenKey::with_kernel(&key, kernel).expect("available"))
                    .process_all(&evs, &mut forced);
                assert_eq!(forced, soft, "round {round} {kernel:?}");
            }
        }
    }

    /// A table for 64 KiB epochs starts small (a short flow allocates 16 KiB), grows fourfold
    /// at a quarter full and, past an eighth of the epoch's size (2 · P slots), straight to it,
    /// then doubles at half full; a short period's table doubles at half full from the start.
    #[test]
    fn count_table_grows_fourfold_towards_the_epoch_size() {
        let mut t = CountTable::for_period([3, 9], 1 << 16);
        let mut sizes = vec![t.slots.len()];
        for i in 0..70_000u64 {
            assert_eq!(t.bump(&i.to_le_bytes()), 0);
            if sizes.last() != Some(&t.slots.len()) {
                sizes.push(t.slots.len());
                // Grown on the token that made it more than a quarter (half) full.
                let limit = if t.slots.len() <= 1 << 17 { 4 } else { 2 };
                assert!(limit * (t.len() - 1) <= sizes[sizes.len() - 2], "{sizes:?}");
            }
        }
        assert_eq!(sizes, [1 << 10, 1 << 12, 1 << 14, 1 << 17, 1 << 18]);
        assert_eq!(t.bump(&0u64.to_le_bytes()), 1, "counts survive the growths");
        let mut small = CountTable::for_period([3, 9], 100);
        for i in 0..=(MIN_COUNT_SLOTS / 2) as u64 {
            small.bump(&i.to_le_bytes());
        }
        assert_eq!(small.slots.len(), 2 * MIN_COUNT_SLOTS);
    }

    /// More distinct tokens in one epoch than the epoch-sized table holds: the AES-NI pipeline
    /// grows the table between batches (never from inside the kernel) and still counts as the
    /// per-event path does, repeats after the growth included.
    #[test]
    fn pipeline_grows_the_count_table_mid_epoch() {
        let key = [0x5a; 16];
        let distinct = (MAX_PRESIZED_SLOTS / 2 + 3_000) as u64;
        let token = |i: u64| FlowEvent::Token {
            offset: i,
            lane: Lane::Exact,
            token: i.wrapping_mul(0x9E37_79B9_7F4A_7C15).to_le_bytes(),
        };
        // Then the first tokens again (counts of 1), at later offsets.
        let evs: Vec<FlowEvent> = (0..distinct)
            .map(token)
            .chain((0..2_000).map(|i| match token(i) {
                FlowEvent::Token { lane, token, .. } => FlowEvent::Token {
                    offset: distinct + i,
                    lane,
                    token,
                },
                other => other,
            }))
            .collect();
        let mut reference = Vec::new();
        let mut e = TokenEncryptor::new(TokenKey::portable(&key), 7, u64::MAX);
        for ev in &evs {
            e.process(ev, &mut reference);
        }
        assert!(e.counts.slots.len() > MAX_PRESIZED_SLOTS, "the table grew");
        for kernel in aesni::available_kernels() {
            let mut c = TokenEncryptor::new(
                TokenKey::with_kernel(&key, kernel).expect("available"),
                7,
                u64::MAX,
            );
            let mut out = Vec::new();
            c.process_all(&evs, &mut out);
            assert_eq!(out, reference, "{kernel:?}");
            assert!(c.counts.slots.len() > MAX_PRESIZED_SLOTS, "{kernel:?}");
        }
    }

    proptest::proptest! {
        /// The count table counts like a map, across growth and epoch clears.
        #[test]
        fn count_table_counts(seq in proptest::collection::vec((0u16..1200, proptest::prelude::any::<bool>()), 0..3000)) {
            let mut t = CountTable::new([3, 5]);
            let mut reference = std::collections::HashMap::new();
            for (v, clear) in seq {
                if clear && v % 500 == 0 {
                    t.clear();
                    reference.clear();
                    proptest::prop_assert!(t.is_empty());
                    continue;
                }
                let [a, b] = v.to_le_bytes();
                let token = [a, b, 2, 3, 4, 5, 6, a / 2];
                let c = reference.entry(token).or_insert(0u64);
                proptest::prop_assert_eq!(t.bump(&token), *c);
                *c += 1;
                proptest::prop_assert_eq!(t.len(), reference.len());
            }
        }
    }

    /// A new epoch empties the table by its tag; when the 16-bit tag wraps the slots are wiped.
    #[test]
    fn count_table_epoch_tags_wrap() {
        let mut t = CountTable::new([1, 2]);
        let a = *b"aaaaaaaa";
        let b = *b"bbbbbbbb";
        for epoch in 0..70_000u32 {
            if epoch % 9_999 == 0 || epoch > 65_530 && epoch < 65_540 {
                assert_eq!(t.bump(&a), 0);
                assert_eq!(t.bump(&a), 1);
                assert_eq!(t.bump(&b), 0);
                assert_eq!(t.len(), 2);
            }
            t.clear();
            assert!(t.is_empty());
        }
        assert_eq!(t.bump(&a), 0);
        assert_eq!(t.bump(&b), 0);
        assert_eq!(t.bump(&b), 1);
    }

    #[test]
    fn sealed_secrets_round_trip_and_reject_wrong_key() {
        let fk = FlowKey::from_bytes([1; 16]);
        let sealed = seal_secrets(&fk, b"CLIENT_TRAFFIC_SECRET_0 ...").unwrap();
        assert_eq!(
            &open_secrets(&fk, &sealed).unwrap()[..],
            b"CLIENT_TRAFFIC_SECRET_0 ..."
        );
        assert_eq!(
            open_secrets(&FlowKey::from_bytes([2; 16]), &sealed).unwrap_err(),
            DpiEncError::SecretsAuth
        );
        assert_eq!(
            open_secrets(&fk, &sealed[..4]).unwrap_err(),
            DpiEncError::SecretsTruncated
        );
    }
}
