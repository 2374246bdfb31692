//! The reference matcher over plaintext: the oracle the encrypted detector is checked against.
//!
//! Same semantics as [`Detector`](crate::detect::Detector): the same HTTP framing (skipped bodies,
//! one evaluation per HTTP message), keywords matched only inside one contiguous inspected segment,
//! `nocase` as ASCII case folding, and positions evaluated by [`MatchRule::satisfied`]. Keywords are
//! found with the `aho-corasick` crate (one automaton for case-sensitive, one for `nocase`
//! keywords), so nothing here shares code with the tokenizer or the chunking it checks.

use aho_corasick::{AhoCorasick, MatchKind};

use crate::detect::Alert;
use crate::http::{FrameEvent, HttpFramer};
use crate::rules::{Direction, MatchRule, MAX_OCCURRENCES};

/// Errors building the automata.
#[derive(Debug, thiserror::Error)]
#[error("building the keyword automaton: {0}")]
pub struct PlaintextError(#[from] aho_corasick::BuildError);

/// An inspected run of bytes and its stream offset.
type Segment<'a> = (u64, &'a [u8]);

/// Aho–Corasick over the rules' keywords.
#[derive(Debug)]
pub struct PlaintextMatcher {
    rules: Vec<MatchRule>,
    exact: AhoCorasick,
    exact_ids: Vec<(usize, usize)>,
    folded: AhoCorasick,
    folded_ids: Vec<(usize, usize)>,
}

impl PlaintextMatcher {
    pub fn new(rules: Vec<MatchRule>) -> Result<Self, PlaintextError> {
        let mut exact = (Vec::new(), Vec::new());
        let mut folded = (Vec::new(), Vec::new());
        for (r, rule) in rules.iter().enumerate() {
            for (j, c) in rule.contents.iter().enumerate() {
                let target = if c.nocase { &mut folded } else { &mut exact };
                target.0.push(c.pattern.clone());
                target.1.push((r, j));
            }
        }
        let build = |pats: &[Vec<u8>], nocase: bool| {
            AhoCorasick::builder()
                .match_kind(MatchKind::Standard)
                .ascii_case_insensitive(nocase)
                .build(pats)
        };
        Ok(Self {
            exact: build(&exact.0, false)?,
            exact_ids: exact.1,
            folded: build(&folded.0, true)?,
            folded_ids: folded.1,
            rules,
        })
    }

    pub fn rules(&self) -> &[MatchRule] {
        &self.rules
    }

    /// Scans one direction of a flow; `http` as for the tokenizer. One alert per rule per message.
    pub fn scan_flow(&self, flow: &[u8], http: bool, dir: Option<Direction>) -> Vec<Alert> {
        let mut framer = if http {
            HttpFramer::new()
        } else {
            HttpFramer::raw()
        };
        let mut alerts = Vec::new();
        let mut message: Option<(u64, Vec<Segment<'_>>)> = None;
        for ev in framer.push(flow) {
            match ev {
                FrameEvent::MessageStart(o) => {
                    if let Some((start, segs)) = message.take() {
                        self.eval_message(start, &segs, dir, &mut alerts);
                    }
                    message = Some((o, Vec::new()));
                }
                FrameEvent::Inspect { offset, range } => {
                    if let (Some((_, segs)), Some(bytes)) = (message.as_mut(), flow.get(range)) {
                        segs.push((offset, bytes));
                    }
                }
                FrameEvent::Skip { .. } => {}
            }
        }
        if let Some((start, segs)) = message {
            self.eval_message(start, &segs, dir, &mut alerts);
        }
        alerts
    }

    fn eval_message(
        &self,
        start: u64,
        segs: &[(u64, &[u8])],
        dir: Option<Direction>,
        out: &mut Vec<Alert>,
    ) {
        let mut occ: Vec<Vec<Vec<u64>>> = self
            .rules
            .iter()
            .map(|r| vec![Vec::new(); r.contents.len()])
            .collect();
        for &(offset, bytes) in segs {
            for (ac, ids) in [
                (&self.exact, &self.exact_ids),
                (&self.folded, &self.folded_ids),
            ] {
                for m in ac.find_overlapping_iter(bytes) {
                    let Some(&(r, j)) = ids.get(m.pattern().as_usize()) else {
                        continue;
                    };
                    if let Some(list) = occ.get_mut(r).and_then(|o| o.get_mut(j)) {
                        list.push(offset + m.start() as u64 - start);
                    }
                }
            }
        }
        for (rule, mut lists) in self.rules.iter().zip(occ) {
            if !rule.applies(dir) {
                continue;
            }
            for l in &mut lists {
                l.sort_unstable();
                l.dedup();
                l.truncate(MAX_OCCURRENCES);
            }
            if lists.iter().all(|l| !l.is_empty()) && rule.satisfied(&lists) {
                out.push(Alert {
                    sid: rule.sid,
                    action: rule.action,
                    message_start: start,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::{parse_rule, BufferPolicy};

    fn matcher(rules: &[&str]) -> PlaintextMatcher {
        let m = rules
            .iter()
            .map(|r| {
                MatchRule::from_rule(&parse_rule(r, 1).unwrap(), BufferPolicy::Approximate).unwrap()
            })
            .collect();
        PlaintextMatcher::new(m).unwrap()
    }

    #[test]
    fn per_message_offsets_nocase_and_skipped_bodies() {
        let m = matcher(&[
            r#"alert tcp any any -> any any (content:"GET /admin"; depth:10; sid:1;)"#,
            r#"alert tcp any any -> any any (content:"secret-word"; nocase; sid:2;)"#,
        ]);
        let flow = b"POST / HTTP/1.1\r\nContent-Type: image/png\r\nContent-Length: 11\r\n\r\nsecret-wordGET /admin HTTP/1.1\r\nX: SECRET-Word\r\n\r\n";
        let alerts = m.scan_flow(flow, true, None);
        let start2 = flow.windows(10).position(|w| w == b"GET /admin").unwrap() as u64;
        assert_eq!(
            alerts,
            vec![
                Alert {
                    sid: 1,
                    action: crate::rules::Action::Alert,
                    message_start: start2
                },
                Alert {
                    sid: 2,
                    action: crate::rules::Action::Alert,
                    message_start: start2
                },
            ]
        );
    }
}
