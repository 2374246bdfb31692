//! The tagged-rules file: what the rule generator (RG) hands the middlebox.
//!
//! RG parses a Snort rule file, splits every keyword the detector can use into the 8-byte chunks
//! [`DetectionPlan`] asks `AES_k(r)` for, and tags each distinct chunk with `AES_{k_RG}(t ‖ 0⁸)`.
//! The chunk set is the union over both tokenization modes and both buffer policies, so the
//! middlebox can pick either at connection time. The rule text travels verbatim: the middlebox
//! re-parses it and rebuilds exactly the plan RG saw, then looks each plan chunk's tag up here.
//!
//! Format (UTF-8 text, versioned; canonical, so parse ∘ write is the identity):
//!
//! ```text
//! mbx-blindbox tagged-rules v1
//! key-id <16 hex: RgKey::key_id of the signing key>
//! include-commented <0|1>
//! chunks <n>
//! <chunk: 16 hex> <tag: 32 hex> <sid>[,<sid>…]     (n lines, chunks strictly ascending)
//! rules <byte length>
//! <the rule text, exactly that many bytes>
//! ```
//!
//! The sids after a chunk are the rules (sid 0 when a rule has none) that use it: the mapping
//! from chunks back to rules, for audit and for the lead's tooling; detection itself rebuilds
//! the mapping from the rule text. The tags are the only authentication: the middlebox cannot
//! make valid ones without `k_RG`, and a chunk with a wrong tag comes out of the setup as zero.

use std::collections::BTreeMap;

use mbx_blindbox::detect::DetectionPlan;
use mbx_blindbox::rules::{parse_rules, BufferPolicy, Rule, RuleFile};
use mbx_blindbox::tokenize::{Token, Tokenization, TOKEN_LEN};

use crate::error::FileError;
use crate::keyfile::RgKey;

/// First line of a tagged-rules file.
pub const TAGGED_HEADER: &str = "mbx-blindbox tagged-rules v1";
/// Most chunks a file may list (≈ 128× the community rule set).
pub const MAX_CHUNKS: usize = 1 << 20;

/// One signed chunk as the setup consumes it: the chunk and its RG tag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SignedChunk {
    pub chunk: Token,
    pub tag: [u8; 16],
}

/// One line of the chunk table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkTag {
    pub chunk: Token,
    pub tag: [u8; 16],
    /// Sids of the rules using the chunk, ascending, distinct (0 = a rule without sid).
    pub sids: Vec<u32>,
}

/// Tags every distinct chunk any [`DetectionPlan`] of `rules` can ask for (window and delimiter
/// tokenization, approximate and strict buffers), sorted by chunk.
pub fn tag_chunks(rules: &[Rule], key: &RgKey) -> Vec<ChunkTag> {
    let mut map: BTreeMap<Token, Vec<u32>> = BTreeMap::new();
    for rule in rules {
        for mode in [Tokenization::Window, Tokenization::Delimiter] {
            for policy in [BufferPolicy::Approximate, BufferPolicy::Strict] {
                let plan = DetectionPlan::new(std::iter::once(rule), mode, policy);
                for c in plan.chunks() {
                    let sids = map.entry(*c).or_default();
                    let sid = rule.sid.unwrap_or(0);
                    if !sids.contains(&sid) {
                        sids.push(sid);
                    }
                }
            }
        }
    }
    let tagger = key.tagger();
    map.into_iter()
        .map(|(chunk, mut sids)| {
            sids.sort_unstable();
            ChunkTag {
                chunk,
                tag: tagger.tag(&chunk),
                sids,
            }
        })
        .collect()
}

/// A parsed or freshly signed tagged-rules file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaggedRules {
    key_id: [u8; 8],
    include_commented: bool,
    chunks: Vec<ChunkTag>,
    rules_text: String,
}

impl TaggedRules {
    /// RG's side (`rules sign`): parses `rules_text` (commented-out rules included if asked)
    /// and tags its chunks with `key`.
    pub fn sign(rules_text: &str, include_commented: bool, key: &RgKey) -> Self {
        let file = parse_rules(rules_text, include_commented);
        Self {
            key_id: key.key_id(),
            include_commented,
            chunks: tag_chunks(&file.rules, key),
            rules_text: rules_text.to_string(),
        }
    }

    /// Builds a file from its parts (tests, tools); chunks are sorted and must be distinct.
    pub fn from_parts(
        key_id: [u8; 8],
        include_commented: bool,
        mut chunks: Vec<ChunkTag>,
        rules_text: String,
    ) -> Result<Self, FileError> {
        chunks.sort_by_key(|c| c.chunk);
        if chunks.windows(2).any(|w| w[0].chunk == w[1].chunk) {
            return Err(FileError::Malformed {
                line: 0,
                what: "duplicate chunk",
            });
        }
        for c in &mut chunks {
            c.sids.sort_unstable();
            c.sids.dedup();
            if c.sids.is_empty() {
                c.sids.push(0);
            }
        }
        Ok(Self {
            key_id,
            include_commented,
            chunks,
            rules_text,
        })
    }

    pub fn key_id(&self) -> [u8; 8] {
        self.key_id
    }

    pub fn include_commented(&self) -> bool {
        self.include_commented
    }

    pub fn chunks(&self) -> &[ChunkTag] {
        &self.chunks
    }

    pub fn rules_text(&self) -> &str {
        &self.rules_text
    }

    /// The rules, parsed exactly as RG parsed them.
    pub fn rule_file(&self) -> RuleFile {
        parse_rules(&self.rules_text, self.include_commented)
    }

    /// The middlebox's detection plan for the tokenization the endpoints use.
    pub fn plan(&self, mode: Tokenization, policy: BufferPolicy) -> DetectionPlan {
        DetectionPlan::new(&self.rule_file().rules, mode, policy)
    }

    /// The setup's input for `plan`: each plan chunk with its tag, in `plan.chunks()` order.
    /// Fails if a chunk has no tag (the file was not signed for these rules).
    pub fn signed_chunks(&self, plan: &DetectionPlan) -> Result<Vec<SignedChunk>, FileError> {
        plan.chunks()
            .iter()
            .map(|c| {
                let i = self
                    .chunks
                    .binary_search_by(|x| x.chunk.cmp(c))
                    .map_err(|_| FileError::Unsigned(hex::encode(c)))?;
                let tag = self
                    .chunks
                    .get(i)
                    .map(|x| x.tag)
                    .ok_or_else(|| FileError::Unsigned(hex::encode(c)))?;
                Ok(SignedChunk { chunk: *c, tag })
            })
            .collect()
    }

    /// Checks every tag under `key` (RG or an endpoint auditing a file); names the first bad one.
    pub fn verify(&self, key: &RgKey) -> Result<(), FileError> {
        let tagger = key.tagger();
        let mut bad = subtle::Choice::from(0);
        let mut first = None;
        for c in &self.chunks {
            let ok = subtle::ConstantTimeEq::ct_eq(&tagger.tag(&c.chunk)[..], &c.tag[..]);
            if first.is_none() && !bool::from(ok) {
                first = Some(hex::encode(c.chunk));
            }
            bad |= !ok;
        }
        match first {
            Some(c) if bool::from(bad) => Err(FileError::BadTag(c)),
            _ => Ok(()),
        }
    }

    /// The file's bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        use std::fmt::Write;
        let mut s = String::with_capacity(self.rules_text.len() + self.chunks.len() * 64 + 128);
        let _ = writeln!(s, "{TAGGED_HEADER}");
        let _ = writeln!(s, "key-id {}", hex::encode(self.key_id));
        let _ = writeln!(s, "include-commented {}", u8::from(self.include_commented));
        let _ = writeln!(s, "chunks {}", self.chunks.len());
        for c in &self.chunks {
            let sids: Vec<String> = c.sids.iter().map(u32::to_string).collect();
            let _ = writeln!(
                s,
                "{} {} {}",
                hex::encode(c.chunk),
                hex::encode(c.tag),
                sids.join(",")
            );
        }
        let _ = writeln!(s, "rules {}", self.rules_text.len());
        s.push_str(&self.rules_text);
        s.into_bytes()
    }

    /// Parses a file. Never panics; rejects anything but the canonical form.
    pub fn parse(bytes: &[u8]) -> Result<Self, FileError> {
        let mut rd = Lines {
            rest: bytes,
            line: 0,
        };
        if rd.next()? != TAGGED_HEADER.as_bytes() {
            return Err(FileError::BadHeader("tagged-rules"));
        }
        let key_id: [u8; 8] = rd.hex_field(b"key-id ")?;
        let include_commented = match rd.field(b"include-commented ")? {
            b"0" => false,
            b"1" => true,
            _ => return Err(rd.err("include-commented must be 0 or 1")),
        };
        let n = rd.number(b"chunks ")?;
        if n > MAX_CHUNKS {
            return Err(rd.err("too many chunks"));
        }
        let mut chunks: Vec<ChunkTag> = Vec::with_capacity(n.min(4096));
        for _ in 0..n {
            let line = rd.next()?;
            let mut parts = line.split(|&b| b == b' ');
            let (Some(c), Some(t), Some(s), None) =
                (parts.next(), parts.next(), parts.next(), parts.next())
            else {
                return Err(rd.err("chunk line needs chunk, tag and sids"));
            };
            let chunk: Token = decode_hex(c).ok_or_else(|| rd.err("bad chunk hex"))?;
            let tag: [u8; 16] = decode_hex(t).ok_or_else(|| rd.err("bad tag hex"))?;
            let mut sids = Vec::new();
            for sid in s.split(|&b| b == b',') {
                let v = parse_decimal(sid).ok_or_else(|| rd.err("bad sid"))?;
                let v = u32::try_from(v).map_err(|_| rd.err("sid out of range"))?;
                if sids.last().is_some_and(|&l| l >= v) {
                    return Err(rd.err("sids must ascend"));
                }
                sids.push(v);
            }
            if chunks.last().is_some_and(|l| l.chunk >= chunk) {
                return Err(rd.err("chunks must ascend"));
            }
            chunks.push(ChunkTag { chunk, tag, sids });
        }
        let len = rd.number(b"rules ")?;
        if rd.rest.len() != len {
            return Err(rd.err("rule text length differs from the rules line"));
        }
        let rules_text = std::str::from_utf8(rd.rest)
            .map_err(|_| FileError::NotUtf8)?
            .to_string();
        Ok(Self {
            key_id,
            include_commented,
            chunks,
            rules_text,
        })
    }

    /// Reads and parses a file.
    pub fn load(path: &std::path::Path) -> Result<Self, FileError> {
        let bytes =
            std::fs::read(path).map_err(|e| FileError::Io(format!("{}: {e}", path.display())))?;
        Self::parse(&bytes)
    }

    /// Writes the file.
    pub fn save(&self, path: &std::path::Path) -> Result<(), FileError> {
        std::fs::write(path, self.to_bytes())
            .map_err(|e| FileError::Io(format!("{}: {e}", path.display())))
    }
}

const _: () = assert!(TOKEN_LEN == 8);

struct Lines<'a> {
    rest: &'a [u8],
    line: usize,
}

impl<'a> Lines<'a> {
    fn err(&self, what: &'static str) -> FileError {
        FileError::Malformed {
            line: self.line,
            what,
        }
    }

    fn next(&mut self) -> Result<&'a [u8], FileError> {
        self.line += 1;
        let at = self
            .rest
            .iter()
            .position(|&b| b == b'\n')
            .ok_or(FileError::Malformed {
                line: self.line,
                what: "missing line",
            })?;
        let (line, rest) = self.rest.split_at(at);
        self.rest = rest.get(1..).unwrap_or_default();
        Ok(line)
    }

    fn field(&mut self, name: &[u8]) -> Result<&'a [u8], FileError> {
        let line = self.next()?;
        line.strip_prefix(name)
            .ok_or_else(|| self.err("unexpected field"))
    }

    fn number(&mut self, name: &[u8]) -> Result<usize, FileError> {
        let v = self.field(name)?;
        parse_decimal(v)
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| self.err("bad number"))
    }

    fn hex_field<const N: usize>(&mut self, name: &[u8]) -> Result<[u8; N], FileError> {
        let v = self.field(name)?;
        decode_hex(v).ok_or_else(|| self.err("bad hex"))
    }
}

/// Canonical decimal: digits only, no leading zeros (except "0"), at most 10 digits.
fn parse_decimal(s: &[u8]) -> Option<u64> {
    if s.is_empty() || s.len() > 10 || (s.len() > 1 && s.first() == Some(&b'0')) {
        return None;
    }
    s.iter().try_fold(0u64, |acc, &b| {
        b.is_ascii_digit().then(|| acc * 10 + u64::from(b - b'0'))
    })
}

/// Lowercase hex of exactly `N` bytes.
fn decode_hex<const N: usize>(s: &[u8]) -> Option<[u8; N]> {
    if s.len() != 2 * N || s.iter().any(|b| b.is_ascii_uppercase()) {
        return None;
    }
    let mut out = [0u8; N];
    hex::decode_to_slice(s, &mut out).ok()?;
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const RULES: &str =
        "alert tcp any any -> any 80 (msg:\"a\"; content:\"evil.exe download\"; sid:1;)\n\
        alert tcp any any -> any 80 (msg:\"b\"; content:\"Malware-Agent\"; nocase; sid:2;)\n\
        alert tcp any any -> any 80 (msg:\"c\"; content:\"evil.exe\"; pcre:\"/x/\"; sid:3;)\n\
        alert tcp any any -> any 80 (msg:\"d\"; content:\"ab\"; sid:4;)\n";

    #[test]
    fn signs_every_plan_chunk_and_round_trips() {
        let key = RgKey::from_bytes([3; 16]);
        let t = TaggedRules::sign(RULES, false, &key);
        // "evil.exe download" (window: 0, 8, 9), "malware-agent" lowercased (0, 5), "evil.exe".
        let chunks: Vec<&[u8]> = t.chunks().iter().map(|c| &c.chunk[..]).collect();
        assert!(chunks.contains(&&b"evil.exe"[..]));
        assert!(chunks.contains(&&b"malware-"[..]));
        assert!(chunks.contains(&&b"re-agent"[..]));
        let evil = t.chunks().iter().find(|c| &c.chunk == b"evil.exe").unwrap();
        assert_eq!(evil.sids, vec![1, 3]);
        assert!(t.verify(&key).is_ok());
        assert_eq!(TaggedRules::parse(&t.to_bytes()).unwrap(), t);
        for mode in [Tokenization::Window, Tokenization::Delimiter] {
            for policy in [BufferPolicy::Approximate, BufferPolicy::Strict] {
                let plan = t.plan(mode, policy);
                let signed = t.signed_chunks(&plan).unwrap();
                assert_eq!(signed.len(), plan.chunks().len());
                for s in signed {
                    assert_eq!(s.tag, key.tag(&s.chunk));
                }
            }
        }
    }

    #[test]
    fn verify_names_a_bad_tag_and_unsigned_chunks_are_refused() {
        let key = RgKey::from_bytes([3; 16]);
        let mut t = TaggedRules::sign(RULES, false, &key);
        assert!(t.verify(&RgKey::from_bytes([4; 16])).is_err());
        t.chunks[0].tag[0] ^= 1;
        assert!(matches!(t.verify(&key), Err(FileError::BadTag(_))));
        let plan = t.plan(Tokenization::Window, BufferPolicy::Approximate);
        t.chunks.retain(|c| &c.chunk != b"evil.exe");
        assert!(matches!(
            t.signed_chunks(&plan),
            Err(FileError::Unsigned(c)) if c == hex::encode(b"evil.exe")
        ));
    }

    #[test]
    fn rejects_non_canonical_files() {
        let key = RgKey::from_bytes([3; 16]);
        let good = TaggedRules::sign(RULES, true, &key).to_bytes();
        let text = String::from_utf8(good.clone()).unwrap();
        let bad = [
            text.replacen("v1", "v2", 1),
            text.replacen("include-commented 1", "include-commented 2", 1),
            text.replacen("rules ", "rules 0", 1),
            format!("{text}x"),
            text.replacen("chunks ", "chunks 0", 1),
        ];
        for b in bad {
            assert!(TaggedRules::parse(b.as_bytes()).is_err(), "{b:.120}");
        }
        // Swap two chunk lines: order is part of the canonical form.
        let lines: Vec<&str> = text.lines().collect();
        let mut swapped = lines.clone();
        swapped.swap(4, 5);
        let swapped = swapped.join("\n") + "\n";
        assert!(TaggedRules::parse(swapped.as_bytes()).is_err());
        for cut in 0..good.len().min(400) {
            let _ = TaggedRules::parse(&good[..cut]);
        }
    }

    fn arb_tagged() -> impl Strategy<Value = TaggedRules> {
        (
            any::<[u8; 8]>(),
            any::<bool>(),
            proptest::collection::btree_map(
                any::<[u8; 8]>(),
                (
                    any::<[u8; 16]>(),
                    proptest::collection::btree_set(any::<u32>(), 1..4),
                ),
                0..20,
            ),
            ".{0,200}",
        )
            .prop_map(|(id, inc, map, text)| {
                let chunks = map
                    .into_iter()
                    .map(|(chunk, (tag, sids))| ChunkTag {
                        chunk,
                        tag,
                        sids: sids.into_iter().collect(),
                    })
                    .collect();
                TaggedRules::from_parts(id, inc, chunks, text).unwrap()
            })
    }

    proptest! {
        #[test]
        fn round_trip(t in arb_tagged()) {
            let bytes = t.to_bytes();
            let back = TaggedRules::parse(&bytes).unwrap();
            prop_assert_eq!(&back, &t);
            prop_assert_eq!(back.to_bytes(), bytes);
        }

        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = TaggedRules::parse(&bytes);
            let mut prefixed = format!("{TAGGED_HEADER}\n").into_bytes();
            prefixed.extend_from_slice(&bytes);
            let _ = TaggedRules::parse(&prefixed);
        }
    }
}
