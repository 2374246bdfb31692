//! Shared benchmark workload (included by `benches/blindbox.rs` and `examples/blindbox_bench.rs`; not a bench target itself):
//! a text-heavy HTTP corpus, rule sets of 1 and 3,000 keywords, and the pipelines measured.
#![allow(dead_code)]

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;

use mbx_blindbox::detect::{DetectionPlan, Detector, EncryptedRules};
use mbx_blindbox::dpienc::{KeywordKey, SaltScheme, TokenEncryptor, TokenKey, TokenMsg};
use mbx_blindbox::rules::{parse_rule, parse_rules, BufferPolicy, Rule};
use mbx_blindbox::sender::Sender;
use mbx_blindbox::tokenize::{CaseMode, FlowTokenizer, Tokenization};

pub const K: [u8; 16] = [0x2b; 16];
pub const PACKET: usize = 1500;
/// Salt reset period P used throughout (bytes).
pub const PERIOD: u64 = 1 << 16;

/// Deterministic xorshift.
pub struct Rng(u64);
impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

const WORDS: &[&str] = &[
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "that",
    "for",
    "it",
    "as",
    "was",
    "with",
    "be",
    "by",
    "on",
    "not",
    "he",
    "this",
    "are",
    "or",
    "his",
    "from",
    "at",
    "which",
    "but",
    "have",
    "an",
    "had",
    "they",
    "you",
    "were",
    "their",
    "one",
    "all",
    "we",
    "can",
    "her",
    "has",
    "there",
    "been",
    "if",
    "more",
    "when",
    "will",
    "would",
    "who",
    "so",
    "no",
    "network",
    "middlebox",
    "encrypted",
    "traffic",
    "inspection",
    "privacy",
    "protocol",
    "keyword",
    "detection",
    "performance",
    "throughput",
    "government",
    "university",
    "international",
    "development",
    "information",
    "management",
    "community",
    "experience",
    "environment",
    "application",
    "technology",
    "organization",
    "relationship",
    "understanding",
    "particularly",
];

/// A text-heavy HTTP/1.1 response stream of about `len` bytes (HTML pages with prose).
pub fn corpus(len: usize, seed: u64) -> Vec<u8> {
    let mut r = Rng::new(seed);
    let mut out = Vec::with_capacity(len + 8192);
    while out.len() < len {
        let mut body =
            String::from("<!DOCTYPE html><html><head><title>page</title></head><body>\n");
        for _ in 0..40 {
            body.push_str("<p class=\"text\">");
            for i in 0..(20 + r.below(40)) {
                if i > 0 {
                    body.push(' ');
                }
                body.push_str(WORDS[r.below(WORDS.len())]);
                if r.below(12) == 0 {
                    body.push(',');
                }
            }
            body.push_str(".</p>\n");
            if r.below(5) == 0 {
                body.push_str(&format!(
                    "<a href=\"/articles/{}/{}.html\">more</a>\n",
                    r.below(10_000),
                    WORDS[r.below(WORDS.len())]
                ));
            }
        }
        body.push_str("</body></html>\n");
        out.extend_from_slice(
            format!(
                "HTTP/1.1 200 OK\r\nServer: bench\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: {}\r\n\r\n",
                body.len()
            )
            .as_bytes(),
        );
        out.extend_from_slice(body.as_bytes());
    }
    out
}

fn shared_dir() -> PathBuf {
    std::env::var_os("MBX_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared"))
}

/// `n` single-keyword rules: the distinct >= 8-byte keywords of the Snort community rules, then
/// random 8–16 byte keywords to fill up (deterministic).
pub fn rules(n: usize) -> Vec<Rule> {
    let mut keywords: BTreeSet<Vec<u8>> = BTreeSet::new();
    let path = shared_dir().join("data/snort-community/community.rules");
    if let Ok(text) = std::fs::read_to_string(&path) {
        for r in parse_rules(&text, true).rules {
            for c in r.contents {
                if c.pattern.len() >= 8 && !c.negated {
                    keywords.insert(c.pattern);
                }
            }
        }
    }
    let mut kw: Vec<Vec<u8>> = keywords.into_iter().collect();
    let mut r = Rng::new(7);
    while kw.len() < n {
        let len = 8 + r.below(9);
        kw.push((0..len).map(|_| b'a' + r.below(26) as u8).collect());
    }
    kw.truncate(n);
    kw.iter()
        .enumerate()
        .map(|(i, k)| {
            let hex: String = k.iter().map(|b| format!("{b:02x}")).collect();
            parse_rule(
                &format!(
                    "alert tcp any any -> any any (content:\"|{hex}|\"; sid:{};)",
                    i + 1
                ),
                1,
            )
            .expect("generated rule")
        })
        .collect()
}

/// The keywords of `rules` (for the plaintext baselines).
pub fn keywords(rules: &[Rule]) -> Vec<Vec<u8>> {
    rules
        .iter()
        .flat_map(|r| r.contents.iter().map(|c| c.pattern.clone()))
        .collect()
}

/// Encrypted rules with `AES_k(r)` computed from `k` (standing in for the setup).
pub fn encrypted(rules: &[Rule], mode: Tokenization) -> Arc<EncryptedRules> {
    let plan = DetectionPlan::new(rules, mode, BufferPolicy::Approximate);
    let key = TokenKey::new(&K);
    let keys: Vec<KeywordKey> = plan.chunks().iter().map(|c| key.keyword_key(c)).collect();
    Arc::new(EncryptedRules::new(plan, &keys).expect("keys"))
}

pub fn sender(mode: Tokenization) -> Sender {
    Sender::new(
        FlowTokenizer::new(mode, CaseMode::Exact, true),
        TokenEncryptor::new(TokenKey::new(&K), 1 << 40, PERIOD),
    )
}

/// Tokenizes and encrypts `data` in `PACKET`-sized pushes.
pub fn encrypt_flow(data: &[u8], mode: Tokenization) -> Vec<TokenMsg> {
    let mut s = sender(mode);
    let mut out = Vec::new();
    for p in data.chunks(PACKET) {
        s.push(p, &mut out);
    }
    s.finish(&mut out);
    out
}

pub fn detector(rules: &Arc<EncryptedRules>) -> Detector {
    Detector::new(Arc::clone(rules), SaltScheme::ExactMatch, None)
}

pub fn count_tokens(msgs: &[TokenMsg]) -> usize {
    msgs.iter()
        .filter(|m| matches!(m, TokenMsg::Token(_)))
        .count()
}
