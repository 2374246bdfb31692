//! Detection equivalence: encrypted detection (sender → DPIEnc → detector) raises exactly the
//! alerts of the plaintext Aho–Corasick matcher, for every Protocol I/II community rule, on a
//! generated HTTP/raw corpus that embeds the rules' keywords at known places. Also the delimiter
//! tokenization's miss rate on the same corpus, and the privacy of non-matching flows.

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;

use mbx_blindbox::detect::{Alert, DetectionPlan, Detector, EncryptedRules, Event};
use mbx_blindbox::dpienc::{FlowKey, KeywordKey, SaltScheme, TokenEncryptor, TokenKey, TokenMsg};
use mbx_blindbox::plaintext::PlaintextMatcher;
use mbx_blindbox::rules::{parse_rules, BufferPolicy, Direction, MatchRule, Rule};
use mbx_blindbox::sender::Sender;
use mbx_blindbox::tokenize::{CaseMode, FlowTokenizer, Tokenization};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const K: [u8; 16] = *b"test token key k";
const WORDS: &[&str] = &[
    "alpha", "bravo", "lima", "oscar", "tango", "zulu", "index", "html", "page", "value",
];
const SEPS: &[&str] = &[" ", "/", ".", "=", "&", ", ", "-", "\r\n"];

struct Flow {
    bytes: Vec<u8>,
    dir: Direction,
}

fn filler(rng: &mut StdRng, len: usize) -> Vec<u8> {
    let mut v = Vec::new();
    while v.len() < len {
        v.extend_from_slice(WORDS[rng.gen_range(0..WORDS.len())].as_bytes());
        v.extend_from_slice(SEPS[rng.gen_range(0..SEPS.len())].as_bytes());
    }
    v.truncate(len);
    v
}

fn write_at(buf: &mut Vec<u8>, rng: &mut StdRng, p: usize, pat: &[u8], nocase: bool) {
    if buf.len() < p + pat.len() {
        let extra = p + pat.len() - buf.len();
        let f = filler(rng, extra);
        buf.extend_from_slice(&f);
    }
    for (i, &b) in pat.iter().enumerate() {
        let b = if nocase && rng.gen_bool(0.5) {
            b.to_ascii_uppercase()
        } else {
            b
        };
        buf[p + i] = b;
    }
}

/// A message body that satisfies the rule's positional constraints (when they are satisfiable),
/// with positions counted from the start of the message. `aligned`: the filler bytes just before
/// and after each keyword are spaces (keywords on word boundaries, as in real traffic).
fn payload(rule: &MatchRule, rng: &mut StdRng, lead: usize, aligned: bool) -> Vec<u8> {
    let mut buf = filler(rng, lead);
    let mut spans = Vec::new();
    let mut prev_end: i64 = 0;
    for c in &rule.contents {
        let len = c.pattern.len() as i64;
        let relative = c.distance.is_some() || c.within.is_some();
        let p = if relative {
            (prev_end + c.distance.unwrap_or(0)).max(0)
        } else {
            let lo = c.offset.unwrap_or(0).max(0);
            let fits = |p: i64| c.depth.is_none_or(|d| p + len <= lo + d);
            if prev_end >= lo && fits(prev_end) {
                prev_end
            } else if fits(lo.max(lead as i64)) {
                lo.max(lead as i64)
            } else {
                lo
            }
        };
        write_at(&mut buf, rng, p as usize, &c.pattern, c.nocase);
        spans.push(p as usize..(p + len) as usize);
        prev_end = p + len;
    }
    let n = rng.gen_range(0..40);
    let tail = filler(rng, n);
    buf.extend_from_slice(&tail);
    if aligned {
        for s in &spans {
            for q in [s.start.checked_sub(1), Some(s.end)].into_iter().flatten() {
                if q < buf.len() && !spans.iter().any(|t| t.contains(&q)) {
                    buf[q] = b' ';
                }
            }
        }
    }
    buf
}

fn http_message(dir: Direction, body: &[u8], kind: u8) -> Vec<u8> {
    let mut m = Vec::new();
    match (dir, kind % 3) {
        (Direction::ToServer, 0) => {
            m.extend_from_slice(format!("POST /submit HTTP/1.1\r\nHost: example.test\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\r\n", body.len()).as_bytes());
            m.extend_from_slice(body);
        }
        (Direction::ToServer, 1) => {
            // Keywords inside an image body are not inspected by either matcher.
            m.extend_from_slice(format!("POST /upload HTTP/1.1\r\nContent-Type: image/png\r\nContent-Length: {}\r\n\r\n", body.len()).as_bytes());
            m.extend_from_slice(body);
        }
        (Direction::ToServer, _) => {
            let line: Vec<u8> = body
                .iter()
                .map(|&b| if b == b'\r' || b == b'\n' { b' ' } else { b })
                .collect();
            m.extend_from_slice(b"GET /q HTTP/1.1\r\nX-Data: ");
            m.extend_from_slice(&line);
            m.extend_from_slice(b"\r\n\r\n");
        }
        (Direction::ToClient, 0) => {
            m.extend_from_slice(
                format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: {}\r\n\r\n",
                    body.len()
                )
                .as_bytes(),
            );
            m.extend_from_slice(body);
        }
        (Direction::ToClient, 1) => {
            m.extend_from_slice(b"HTTP/1.1 200 OK\r\nContent-Type: font/woff2\r\nTransfer-Encoding: chunked\r\n\r\n");
            m.extend_from_slice(format!("{:x}\r\n", body.len()).as_bytes());
            m.extend_from_slice(body);
            m.extend_from_slice(b"\r\n0\r\n\r\n");
        }
        (Direction::ToClient, _) => {
            m.extend_from_slice(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n");
            let half = body.len() / 2;
            for part in [&body[..half], &body[half..]] {
                m.extend_from_slice(format!("{:x}\r\n", part.len()).as_bytes());
                m.extend_from_slice(part);
                m.extend_from_slice(b"\r\n");
            }
            m.extend_from_slice(b"0\r\n\r\n");
        }
    }
    m
}

fn corpus(rules: &[MatchRule], rng: &mut StdRng, aligned: bool) -> Vec<Flow> {
    let mut flows = Vec::new();
    // One raw flow per rule: the payload alone, positions exactly as the rule wants them.
    for r in rules {
        let dir = r.flow.unwrap_or(Direction::ToServer);
        let lead = if rng.gen_bool(0.5) {
            0
        } else {
            rng.gen_range(0..20)
        };
        flows.push(Flow {
            bytes: payload(r, rng, lead, aligned),
            dir,
        });
    }
    // HTTP flows: several messages per flow, each embedding one rule's keywords, plus keywords of
    // other rules sprinkled at random places.
    for dir in [Direction::ToServer, Direction::ToClient] {
        let group: Vec<&MatchRule> = rules
            .iter()
            .filter(|r| r.flow.is_none_or(|f| f == dir))
            .collect();
        for chunk in group.chunks(8) {
            let mut bytes = Vec::new();
            for (i, r) in chunk.iter().enumerate() {
                let lead = rng.gen_range(0..10);
                let mut body = payload(r, rng, lead, aligned);
                if rng.gen_bool(0.3) {
                    let other = &rules[rng.gen_range(0..rules.len())];
                    let c = &other.contents[rng.gen_range(0..other.contents.len())];
                    let at = rng.gen_range(0..=body.len());
                    body.splice(at..at, c.pattern.iter().copied());
                }
                bytes.extend(http_message(dir, &body, (i + rng.gen_range(0..3)) as u8));
            }
            flows.push(Flow { bytes, dir });
        }
    }
    flows
}

fn encrypted_rules(rules: &[Rule], mode: Tokenization) -> Arc<EncryptedRules> {
    let plan = DetectionPlan::new(rules, mode, BufferPolicy::Approximate);
    // Stand-in for the garbled-circuit setup: the test knows k.
    let key = TokenKey::new(&K);
    let keys: Vec<KeywordKey> = plan.chunks().iter().map(|c| key.keyword_key(c)).collect();
    Arc::new(EncryptedRules::new(plan, &keys).expect("key count"))
}

fn encrypted_alerts(
    rules: &Arc<EncryptedRules>,
    flow: &Flow,
    mode: Tokenization,
    rng: &mut StdRng,
) -> BTreeSet<(u32, u64)> {
    let enc = TokenEncryptor::new(TokenKey::new(&K), rng.gen(), 256);
    let mut sender = Sender::new(FlowTokenizer::new(mode, CaseMode::Dual, true), enc);
    let mut det = Detector::new(Arc::clone(rules), SaltScheme::ExactMatch, Some(flow.dir));
    let mut msgs = Vec::new();
    let mut events = Vec::new();
    // The flow arrives in pieces of random size.
    let mut rest = &flow.bytes[..];
    while !rest.is_empty() {
        let n = rng.gen_range(1..=rest.len().min(97));
        sender.push(&rest[..n], &mut msgs);
        rest = &rest[n..];
        for m in msgs.drain(..) {
            det.process(&m, &mut events).expect("honest sender");
        }
    }
    sender.finish(&mut msgs);
    for m in msgs.drain(..) {
        det.process(&m, &mut events).expect("honest sender");
    }
    events
        .into_iter()
        .map(|e| match e {
            Event::Alert(Alert {
                sid, message_start, ..
            }) => (sid, message_start),
            Event::ProbableCause(p) => panic!("no Protocol III rules here: {p:?}"),
        })
        .collect()
}

fn exact_match_rules() -> (Vec<Rule>, Vec<MatchRule>) {
    let file = parse_rules(&common::community_rules(), true);
    let rules: Vec<Rule> = file
        .rules
        .into_iter()
        .filter(|r| MatchRule::from_rule(r, BufferPolicy::Approximate).is_some())
        .collect();
    let match_rules = rules
        .iter()
        .filter_map(|r| MatchRule::from_rule(r, BufferPolicy::Approximate))
        .collect();
    (rules, match_rules)
}

#[test]
fn encrypted_detection_equals_plaintext_and_delimiter_miss_rate() {
    let (rules, match_rules) = exact_match_rules();
    assert!(
        match_rules.len() > 1000,
        "{} Protocol I/II rules",
        match_rules.len()
    );
    let oracle = PlaintextMatcher::new(match_rules.clone()).expect("automaton");
    let window = encrypted_rules(&rules, Tokenization::Window);
    let delim = encrypted_rules(&rules, Tokenization::Delimiter);
    let mut rng = StdRng::seed_from_u64(0xB11D_B0C5);
    for aligned in [false, true] {
        let flows = corpus(&match_rules, &mut rng, aligned);
        let mut fired = BTreeSet::new();
        let (mut oracle_total, mut delim_missed, mut delim_extra) = (0usize, 0usize, 0usize);
        for (i, flow) in flows.iter().enumerate() {
            let expected: BTreeSet<(u32, u64)> = oracle
                .scan_flow(&flow.bytes, true, Some(flow.dir))
                .into_iter()
                .map(|a| (a.sid, a.message_start))
                .collect();
            let got = encrypted_alerts(&window, flow, Tokenization::Window, &mut rng);
            assert_eq!(
                got,
                expected,
                "flow {i}: {:?}",
                String::from_utf8_lossy(&flow.bytes)
            );
            let d = encrypted_alerts(&delim, flow, Tokenization::Delimiter, &mut rng);
            oracle_total += expected.len();
            delim_missed += expected.difference(&d).count();
            delim_extra += d.difference(&expected).count();
            fired.extend(expected.iter().map(|(sid, _)| *sid));
        }
        let all_sids: BTreeSet<u32> = match_rules.iter().map(|r| r.sid).collect();
        let miss_rate = delim_missed as f64 / oracle_total.max(1) as f64;
        println!(
            "corpus (keywords on word boundaries: {aligned}): {} flows, {} bytes; {} Protocol I/II rules, \
             {} fired at least once; {} alerts",
            flows.len(),
            flows.iter().map(|f| f.bytes.len()).sum::<usize>(),
            all_sids.len(),
            fired.len(),
            oracle_total
        );
        println!("  window tokenization: 0 missed, 0 extra (asserted per flow)");
        println!(
            "  delimiter tokenization: {delim_missed} of {oracle_total} alerts missed ({:.1}%), {delim_extra} extra",
            100.0 * miss_rate
        );
        // Not vacuous: most rules' generated payloads do trigger them.
        assert!(
            fired.len() * 10 >= all_sids.len() * 9,
            "{} of {} rules fired",
            fired.len(),
            all_sids.len()
        );
        assert!((0.0..=1.0).contains(&miss_rate));
        assert!(delim_missed <= oracle_total);
    }
}

/// A flow with no keyword leaves the detector exactly as the salt announcements alone would: no
/// count moved, no partial match, and no plaintext token anywhere in its state.
#[test]
fn non_matching_flow_leaves_nothing() {
    let (rules, match_rules) = exact_match_rules();
    let oracle = PlaintextMatcher::new(match_rules).expect("automaton");
    let mut rng = StdRng::seed_from_u64(7);
    for scheme in [SaltScheme::ExactMatch, SaltScheme::ProbableCause] {
        let er = encrypted_rules(&rules, Tokenization::Window);
        let text: Vec<u8> = (0..3000)
            .map(|_| b"qwxzjk0123456789 "[rng.gen_range(0..17)])
            .collect();
        // No HTTP head: header names such as "Content-Type" are chunks of rule keywords.
        let flow = text;
        assert!(oracle.scan_flow(&flow, true, None).is_empty());
        let enc = match scheme {
            SaltScheme::ExactMatch => TokenEncryptor::new(TokenKey::new(&K), 1 << 40, 1000),
            SaltScheme::ProbableCause => TokenEncryptor::with_flow_key(
                TokenKey::new(&K),
                1 << 40,
                1000,
                FlowKey::from_bytes([9; 16]),
            ),
        };
        let mut sender = Sender::new(
            FlowTokenizer::new(Tokenization::Window, CaseMode::Dual, true),
            enc,
        );
        let mut msgs = Vec::new();
        sender.push(&flow, &mut msgs);
        sender.finish(&mut msgs);
        let mut det = Detector::new(Arc::clone(&er), scheme, None);
        let mut reference = Detector::new(er, scheme, None);
        let mut events = Vec::new();
        let mut salts = 0;
        for m in &msgs {
            det.process(m, &mut events).expect("honest");
            if let TokenMsg::Salt(_) = m {
                salts += 1;
                reference.process(m, &mut events).expect("honest");
            }
        }
        assert!(salts >= 3, "resets happened");
        assert!(events.is_empty());
        assert_eq!(det.hits(), 0);
        assert!(det.counts().iter().all(|&c| c == 0));
        assert!(det.flow_key().is_none());
        let state = det.audit_bytes();
        assert_eq!(
            state,
            reference.audit_bytes(),
            "state depends only on rules and salts"
        );
        let state_windows: std::collections::HashSet<&[u8]> = state.windows(8).collect();
        for w in flow.windows(8) {
            assert!(
                !state_windows.contains(w),
                "plaintext token {:?} in state",
                String::from_utf8_lossy(w)
            );
        }
    }
}
