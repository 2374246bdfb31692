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
//! hashed with a per-flow random seed); it computes `K_t` for every token, all `K_t` of a push in
//! one pipelined multi-block AES call, and expands `K_t` per token (profiling showed caching the
//! 176-byte schedules cost more in table traffic than the expansion it saved).
//!
//! `flow_key` and the first `salt0` come from the primary session's exporter ([`crate::keys`]),
//! so the receiver can recompute every `c2` and check it.

use std::collections::HashMap;

use aes::cipher::{BlockEncrypt, KeyInit};
use aes::Aes128Enc as Aes128;
use ring::aead;
use subtle::ConstantTimeEq;
use zeroize::{Zeroize, ZeroizeOnDrop, Zeroizing};

use crate::tokenize::{FlowEvent, Lane, Token};

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
}

impl TokenKey {
    pub fn new(k: &[u8; 16]) -> Self {
        Self {
            cipher: Aes128::new(k.into()),
        }
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

fn salt_block(salt: u64) -> [u8; 16] {
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

/// Hasher for the sender's per-epoch count table. Its keys are plaintext tokens, which a
/// malicious sender chooses and the receiver re-counts, so the hash is keyed with a per-flow random
/// seed the sender never sees (a folded 64×64→128-bit multiply, as in `foldhash`); SipHash cost
/// more than a third of the per-token work.
#[derive(Clone, Copy)]
struct SeededTokenHasher {
    seed: [u64; 2],
    state: u64,
}

impl std::hash::Hasher for SeededTokenHasher {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.state = self.state.rotate_left(8) ^ u64::from(*b);
        }
    }

    fn write_usize(&mut self, _: usize) {}

    fn finish(&self) -> u64 {
        let m = u128::from(self.state ^ self.seed[0]) * u128::from(self.seed[1] | 1);
        (m as u64) ^ ((m >> 64) as u64)
    }
}

#[derive(Clone, Copy)]
struct SeededTokenState([u64; 2]);

impl SeededTokenState {
    fn random() -> Self {
        use ring::rand::SecureRandom;
        let mut b = [0u8; 16];
        // Without system randomness the table still works, only with a guessable hash.
        let _ = ring::rand::SystemRandom::new().fill(&mut b);
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

struct CountEntry {
    count: u64,
}

/// The sender's DPIEnc state for one direction of a flow.
pub struct TokenEncryptor {
    key: TokenKey,
    scheme: SaltScheme,
    salt0: u64,
    period: u64,
    epoch_start: Option<u64>,
    counts: HashMap<Token, CountEntry, SeededTokenState>,
    max_count: u64,
    flow_key: Option<FlowKey>,
    announced: bool,
    /// `K_t` blocks of the current run (zeroized after use).
    scratch: Vec<aes::Block>,
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
            counts: HashMap::with_hasher(SeededTokenState::random()),
            max_count: 0,
            flow_key: None,
            announced: false,
            scratch: Vec::new(),
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

    /// Encrypts a run of tokenizer events: every `K_t = AES_k(t)` of the run is computed in one
    /// pipelined multi-block AES call (8 blocks in flight with AES-NI) before the per-token work.
    /// Same output as calling [`Self::process`] on each event.
    pub fn process_all(&mut self, evs: &[FlowEvent], out: &mut Vec<TokenMsg>) {
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
        for (ev, b) in evs.iter().zip(blocks.iter()) {
            let kt = KeywordKey((*b).into());
            self.process_with(ev, &kt, out);
        }
        blocks.iter_mut().for_each(|b| b.zeroize());
        self.scratch = blocks;
    }

    fn process_with(&mut self, ev: &FlowEvent, kt: &KeywordKey, out: &mut Vec<TokenMsg>) {
        if !self.announced {
            self.announced = true;
            out.push(TokenMsg::Salt(self.salt0));
        }
        match *ev {
            FlowEvent::MessageStart(o) => out.push(TokenMsg::MessageStart(o)),
            FlowEvent::Token {
                offset,
                lane,
                token,
            } => {
                let start = *self.epoch_start.get_or_insert(offset);
                if offset.saturating_sub(start) >= self.period {
                    self.reset(offset);
                    out.push(TokenMsg::Salt(self.salt0));
                }
                out.push(TokenMsg::Token(self.encrypt(offset, lane, &token, kt)));
            }
        }
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
        let entry = self.counts.entry(*token).or_insert(CountEntry { count: 0 });
        let count = entry.count;
        let salt = self.scheme.salt(self.salt0, count);
        let cipher = kt.cipher();
        let c1 = enc(&cipher, salt);
        let c2 = self.flow_key.as_ref().map(|fk| {
            let mut block = salted_block(&cipher, salt.wrapping_add(1));
            for (b, k) in block.iter_mut().zip(fk.0.iter()) {
                *b ^= k;
            }
            block
        });
        entry.count += 1;
        self.max_count = self.max_count.max(count);
        EncToken {
            offset,
            lane,
            c1,
            c2,
        }
    }
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
