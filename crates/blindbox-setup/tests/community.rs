//! End to end on Snort community rules: RG signs a sample of Protocol I/II rules, the real
//! three-party setup produces the keys, and the middlebox's encrypted detection raises exactly
//! the plaintext matcher's alerts.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;

use mbx_blindbox::detect::Detector;
use mbx_blindbox::dpienc::{SaltScheme, TokenEncryptor, TokenKey};
use mbx_blindbox::plaintext::PlaintextMatcher;
use mbx_blindbox::rules::{parse_rules, BufferPolicy, MatchRule};
use mbx_blindbox::sender::Sender;
use mbx_blindbox::tokenize::{CaseMode, FlowTokenizer, Tokenization};
use mbx_blindbox_setup::{
    Endpoint, EndpointConfig, EndpointKeys, Middlebox, MiddleboxConfig, Peer, RgKey, TaggedRules,
};
use rand::rngs::StdRng;
use rand::SeedableRng;

const K: [u8; 16] = [0x11; 16];

fn community_rules() -> String {
    let path = std::env::var_os("MBX_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared"))
        .join("data/snort-community/community.rules");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

#[test]
fn community_sample_detected_with_keys_from_the_real_setup() {
    // A sample of single-line Protocol I/II rules (commented ones uncommented), as RG's input.
    let text = community_rules();
    let mut sample = String::new();
    let mut seen = 0;
    for line in text.lines() {
        let line = line.strip_prefix("# ").unwrap_or(line);
        if !line.starts_with("alert tcp") || line.ends_with('\\') {
            continue;
        }
        let Some(rule) = parse_rules(line, false).rules.pop() else {
            continue;
        };
        if MatchRule::from_rule(&rule, BufferPolicy::Approximate).is_some() {
            seen += 1;
            if seen % 40 == 0 {
                sample.push_str(line);
                sample.push('\n');
            }
        }
    }
    let rg = RgKey::from_bytes([0x22; 16]);
    let tagged = TaggedRules::parse(&TaggedRules::sign(&sample, false, &rg).to_bytes()).unwrap();
    let rules = tagged.rule_file().rules;
    assert!(rules.len() >= 25, "{} rules sampled", rules.len());
    let mode = Tokenization::Window;
    let plan = tagged.plan(mode, BufferPolicy::Approximate);
    let chunks = tagged.signed_chunks(&plan).unwrap();

    let cfg = EndpointConfig {
        workers: 2,
        ..EndpointConfig::default()
    };
    let ep = |seed| {
        Endpoint::new(
            EndpointKeys::from_parts(K, [0x33; 32]),
            &rg,
            cfg.clone(),
            &mut StdRng::seed_from_u64(seed),
        )
        .unwrap()
    };
    let (mut full, mut hash) = (ep(1), ep(2));
    let mut mb = Middlebox::new(
        chunks,
        MiddleboxConfig {
            batch: 16,
            window: 2,
            workers: 2,
        },
        &mut StdRng::seed_from_u64(3),
    )
    .unwrap();
    while !(mb.is_done() && full.is_done() && hash.is_done()) {
        let mut moved = false;
        while let Some(f) = mb.poll_transmit(Peer::Full).unwrap() {
            full.receive(&f).unwrap();
            moved = true;
        }
        while let Some(f) = mb.poll_transmit(Peer::Hash).unwrap() {
            hash.receive(&f).unwrap();
            moved = true;
        }
        while let Some(f) = full.poll_transmit().unwrap() {
            mb.receive(Peer::Full, &f).unwrap();
            moved = true;
        }
        while let Some(f) = hash.poll_transmit().unwrap() {
            mb.receive(Peer::Hash, &f).unwrap();
            moved = true;
        }
        assert!(moved, "stalled");
    }
    let encrypted = Arc::new(mb.finish().unwrap().into_encrypted_rules(plan).unwrap());

    // One HTTP request per rule with all its contents in the body.
    let match_rules: Vec<MatchRule> = rules
        .iter()
        .filter_map(|r| MatchRule::from_rule(r, BufferPolicy::Approximate))
        .collect();
    let mut flow = Vec::new();
    for (i, m) in match_rules.iter().enumerate() {
        let mut body = b"lorem ipsum ".to_vec();
        for c in &m.contents {
            body.extend_from_slice(&c.pattern);
            body.extend_from_slice(b" dolor ");
        }
        flow.extend_from_slice(
            format!(
                "POST /r/{i} HTTP/1.1\r\nHost: t\r\nContent-Type: text/html\r\nContent-Length: {}\r\n\r\n",
                body.len()
            )
            .as_bytes(),
        );
        flow.extend_from_slice(&body);
    }
    let want: BTreeSet<(u32, u64)> = PlaintextMatcher::new(match_rules.clone())
        .unwrap()
        .scan_flow(&flow, true, None)
        .into_iter()
        .map(|a| (a.sid, a.message_start))
        .collect();
    assert!(
        want.len() * 2 >= match_rules.len(),
        "{} alerts for {} rules",
        want.len(),
        match_rules.len()
    );

    let enc = TokenEncryptor::new(TokenKey::new(&K), 1 << 30, 1 << 16);
    let mut sender = Sender::new(FlowTokenizer::new(mode, CaseMode::Dual, true), enc);
    let mut det = Detector::new(encrypted, SaltScheme::ExactMatch, None);
    let mut msgs = Vec::new();
    let mut events = Vec::new();
    for piece in flow.chunks(1500) {
        sender.push(piece, &mut msgs);
        for m in msgs.drain(..) {
            det.process(&m, &mut events).unwrap();
        }
    }
    sender.finish(&mut msgs);
    for m in msgs.drain(..) {
        det.process(&m, &mut events).unwrap();
    }
    let got: BTreeSet<(u32, u64)> = events
        .iter()
        .filter_map(|e| e.as_alert().map(|a| (a.sid, a.message_start)))
        .collect();
    eprintln!(
        "{} rules, {} chunks set up, {} alerts, all detected",
        match_rules.len(),
        tagged.chunks().len(),
        want.len()
    );
    assert_eq!(got, want);
}
