//! Full rule evaluation on decrypted traffic (Protocol III, paper §5): contents at any length,
//! negated contents, positions and `pcre`.
//!
//! Used by the middlebox after a probable-cause hit let it decrypt the flow. `pcre` runs with the
//! `regex` crate over bytes (`unicode(false)`: `.` and classes match bytes, as in PCRE without
//! UTF mode). Snort flags `i`, `s`, `m`, `x` become the regex flags of the same name and `G`
//! swaps greediness. Other flags (`R` relative, the buffer flags `U H P C K M S Y D I B`, `O`,
//! `A`, `E`) are not evaluated: the pattern runs over the whole HTTP message, which can only add
//! alerts, and every alert lists them in [`FullAlert::ignored`]. Patterns the `regex` crate cannot
//! compile (backreferences, lookaround) and unknown flags make the rule unevaluable; it is
//! reported by [`FullRuleSet::unevaluable`], never silently dropped.
//!
//! Approximations, also listed in `ignored`: negated contents fail the rule if the pattern occurs
//! anywhere in the message (their position modifiers are not applied), relative positions of the
//! contents after a negated one are measured from the previous positive content, and options of
//! kind `Detection` (`byte_test`, `flowbits`, ...) are not evaluated.

use regex::bytes::{Regex, RegexBuilder};

use crate::detect::Alert;
use crate::rules::{
    classify, Action, BufferPolicy, Direction, MatchContent, MatchRule, Protocol, Rule,
    UnsupportedKind, MAX_OCCURRENCES,
};

/// Why a `pcre` option could not be compiled.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PcreError {
    #[error("pcre without delimiters")]
    Delimiters,
    #[error("unknown pcre flag {0:?}")]
    UnknownFlag(char),
    #[error("regex: {0}")]
    Regex(String),
}

/// A compiled `pcre` and the Snort flags it ignores.
#[derive(Debug, Clone)]
pub struct Pcre {
    pub regex: Regex,
    /// `pcre:!"..."`: the rule needs the pattern to be absent.
    pub negated: bool,
    pub ignored_flags: Vec<char>,
}

/// Translates a Snort `pcre` value (`/pattern/flags` or `m<d>pattern<d>flags`).
pub fn translate_pcre(value: &str) -> Result<Pcre, PcreError> {
    let (negated, value) = match value.strip_prefix('!') {
        Some(v) => (true, v.trim_start()),
        None => (false, value),
    };
    let (delim, rest) = if let Some(r) = value.strip_prefix('/') {
        ('/', r)
    } else if let Some(r) = value.strip_prefix('m') {
        let mut chars = r.chars();
        let d = chars.next().ok_or(PcreError::Delimiters)?;
        (d, chars.as_str())
    } else {
        return Err(PcreError::Delimiters);
    };
    let end = rest.rfind(delim).ok_or(PcreError::Delimiters)?;
    let pattern = rest.get(..end).ok_or(PcreError::Delimiters)?;
    let flags = rest.get(end + delim.len_utf8()..).unwrap_or_default();
    let mut b = RegexBuilder::new(pattern);
    b.unicode(false).size_limit(1 << 22).dfa_size_limit(1 << 22);
    let mut ignored = Vec::new();
    for f in flags.chars() {
        match f {
            'i' => {
                b.case_insensitive(true);
            }
            's' => {
                b.dot_matches_new_line(true);
            }
            'm' => {
                b.multi_line(true);
            }
            'x' => {
                b.ignore_whitespace(true);
            }
            'G' => {
                b.swap_greed(true);
            }
            'R' | 'U' | 'H' | 'P' | 'C' | 'K' | 'M' | 'S' | 'Y' | 'D' | 'I' | 'B' | 'O' | 'A'
            | 'E' => ignored.push(f),
            other => return Err(PcreError::UnknownFlag(other)),
        }
    }
    let regex = b.build().map_err(|e| PcreError::Regex(e.to_string()))?;
    Ok(Pcre {
        regex,
        negated,
        ignored_flags: ignored,
    })
}

/// A Protocol III rule compiled for plaintext evaluation.
#[derive(Debug, Clone)]
pub struct FullRule {
    pub sid: u32,
    pub action: Action,
    pub flow: Option<Direction>,
    positive: MatchRule,
    negated: Vec<(Vec<u8>, bool)>,
    pcres: Vec<Pcre>,
    /// What this evaluation does not check (see the module docs).
    pub ignored: Vec<String>,
}

/// A full rule matched in a decrypted HTTP message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FullAlert {
    pub alert: Alert,
    /// Options and flags not evaluated (the match is a superset of Snort's).
    pub ignored: Vec<String>,
}

fn find_all(hay: &[u8], needle: &[u8], nocase: bool, out: &mut Vec<usize>) {
    if needle.is_empty() || hay.len() < needle.len() {
        return;
    }
    for (i, w) in hay.windows(needle.len()).enumerate() {
        let eq = if nocase {
            w.eq_ignore_ascii_case(needle)
        } else {
            w == needle
        };
        if eq {
            out.push(i);
        }
    }
}

impl FullRule {
    /// Compiles `rule` (any classification; the middlebox uses it for Protocol III rules).
    pub fn new(rule: &Rule) -> Result<Self, PcreError> {
        let mut ignored = Vec::new();
        let mut positive = Vec::new();
        let mut negated = Vec::new();
        for c in &rule.contents {
            if c.negated {
                negated.push((c.pattern.clone(), c.nocase));
                if c.positional() {
                    ignored.push("position of a negated content".to_string());
                }
            } else {
                positive.push(MatchContent {
                    pattern: c.pattern.clone(),
                    nocase: c.nocase,
                    offset: c.offset,
                    depth: c.depth,
                    distance: c.distance,
                    within: c.within,
                });
            }
        }
        let mut pcres = Vec::new();
        for p in &rule.pcre {
            let c = translate_pcre(p)?;
            for f in &c.ignored_flags {
                ignored.push(format!("pcre flag {f}"));
            }
            pcres.push(c);
        }
        for u in &rule.unsupported {
            if u.kind != UnsupportedKind::Metadata {
                ignored.push(u.name.clone());
            }
        }
        ignored.sort();
        ignored.dedup();
        Ok(Self {
            sid: rule.sid.unwrap_or_default(),
            action: rule.action,
            flow: rule.flow,
            positive: MatchRule {
                sid: rule.sid.unwrap_or_default(),
                action: rule.action,
                flow: rule.flow,
                contents: positive,
            },
            negated,
            pcres,
            ignored,
        })
    }

    /// Whether the rule matches one HTTP message, given as its inspected segments
    /// (offset relative to the message start, bytes).
    pub fn matches(&self, segments: &[(u64, &[u8])]) -> bool {
        let mut occ: Vec<Vec<u64>> = Vec::with_capacity(self.positive.contents.len());
        let mut scratch = Vec::new();
        for c in &self.positive.contents {
            let mut list = Vec::new();
            for &(off, bytes) in segments {
                scratch.clear();
                find_all(bytes, &c.pattern, c.nocase, &mut scratch);
                list.extend(scratch.iter().map(|&i| off + i as u64));
            }
            list.sort_unstable();
            list.dedup();
            list.truncate(MAX_OCCURRENCES);
            if list.is_empty() {
                return false;
            }
            occ.push(list);
        }
        if !self.positive.satisfied(&occ) {
            return false;
        }
        for (pattern, nocase) in &self.negated {
            for &(_, bytes) in segments {
                scratch.clear();
                find_all(bytes, pattern, *nocase, &mut scratch);
                if !scratch.is_empty() {
                    return false;
                }
            }
        }
        self.pcres
            .iter()
            .all(|p| segments.iter().any(|(_, b)| p.regex.is_match(b)) != p.negated)
    }
}

/// The Protocol III rules of a rule set, compiled for the decrypted flow.
#[derive(Debug, Clone, Default)]
pub struct FullRuleSet {
    rules: Vec<FullRule>,
    unevaluable: Vec<(u32, PcreError)>,
}

impl FullRuleSet {
    /// Compiles the rules `policy` classifies as Protocol III.
    pub fn new<'a>(rules: impl IntoIterator<Item = &'a Rule>, policy: BufferPolicy) -> Self {
        let mut s = Self::default();
        for r in rules {
            if classify(r, policy).protocol != Protocol::III {
                continue;
            }
            match FullRule::new(r) {
                Ok(f) => s.rules.push(f),
                Err(e) => s.unevaluable.push((r.sid.unwrap_or_default(), e)),
            }
        }
        s
    }

    pub fn rules(&self) -> &[FullRule] {
        &self.rules
    }

    /// Rules that cannot be evaluated, with the reason.
    pub fn unevaluable(&self) -> &[(u32, PcreError)] {
        &self.unevaluable
    }

    /// Evaluates every rule for direction `dir` on one message.
    pub fn eval_message(
        &self,
        message_start: u64,
        segments: &[(u64, &[u8])],
        dir: Option<Direction>,
        out: &mut Vec<FullAlert>,
    ) {
        for r in &self.rules {
            let applies = match (r.flow, dir) {
                (Some(w), Some(h)) => w == h,
                _ => true,
            };
            if applies && r.matches(segments) {
                out.push(FullAlert {
                    alert: Alert {
                        sid: r.sid,
                        action: r.action,
                        message_start,
                    },
                    ignored: r.ignored.clone(),
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::parse_rule;

    #[test]
    fn pcre_flags_translate() {
        let p = translate_pcre("/dir\\s+c:/i").unwrap();
        assert!(p.regex.is_match(b"DIR  C:"));
        assert!(!translate_pcre("/dir\\s+c:/")
            .unwrap()
            .regex
            .is_match(b"DIR C:"));
        assert!(translate_pcre("/a.b/s").unwrap().regex.is_match(b"a\nb"));
        assert!(!translate_pcre("/a.b/").unwrap().regex.is_match(b"a\nb"));
        assert!(translate_pcre("/^x$/m").unwrap().regex.is_match(b"a\nx\nb"));
        assert!(translate_pcre("/a b c/x").unwrap().regex.is_match(b"abc"));
        assert!(translate_pcre("m#/etc/passwd#")
            .unwrap()
            .regex
            .is_match(b"/etc/passwd"));
        assert_eq!(
            translate_pcre("/x/UR").unwrap().ignored_flags,
            vec!['U', 'R']
        );
        assert_eq!(
            translate_pcre("/x/q").unwrap_err(),
            PcreError::UnknownFlag('q')
        );
        assert!(matches!(
            translate_pcre("/(a)\\1/"),
            Err(PcreError::Regex(_))
        ));
        assert!(translate_pcre("/\\xff\\x00/")
            .unwrap()
            .regex
            .is_match(&[0xff, 0]));
    }

    #[test]
    fn full_rule_contents_negation_and_pcre() {
        let r = parse_rule(
            r#"alert tcp any any -> any any (content:"cmd.exe"; content:"/c"; distance:0; content:!"safe"; pcre:"/dir\s+c:/i"; sid:9;)"#,
            1,
        )
        .unwrap();
        let f = FullRule::new(&r).unwrap();
        assert!(f.matches(&[(0, b"GET /cmd.exe?/c+DIR  C: HTTP/1.1")]));
        assert!(
            !f.matches(&[(0, b"GET /cmd.exe?/c+DIR  C: safe")]),
            "negated"
        );
        assert!(!f.matches(&[(0, b"GET /cmd.exe?/c+ls")]), "pcre");
        assert!(!f.matches(&[(0, b"GET /c cmd.exe dir c:")]), "order");
        let n = parse_rule(
            r#"alert tcp any any -> any any (content:"cmd.exe"; pcre:!"/dir\s+c:/i"; sid:9;)"#,
            1,
        )
        .unwrap();
        let f = FullRule::new(&n).unwrap();
        assert!(
            !f.matches(&[(0, b"cmd.exe dir c:")]),
            "negated pcre present"
        );
        assert!(f.matches(&[(0, b"cmd.exe ls")]), "negated pcre absent");
    }
}
