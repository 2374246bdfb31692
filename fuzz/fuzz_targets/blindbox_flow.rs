//! One direction of a flow as arbitrary bytes: tokenization must not depend on how the flow is
//! split (the first byte picks the split point), and encrypted detection must raise exactly the
//! plaintext matcher's alerts.
#![no_main]

use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use mbx_blindbox::detect::{DetectionPlan, Detector, EncryptedRules, Event};
use mbx_blindbox::dpienc::{KeywordKey, SaltScheme, TokenEncryptor, TokenKey};
use mbx_blindbox::plaintext::PlaintextMatcher;
use mbx_blindbox::rules::{parse_rules, BufferPolicy, MatchRule};
use mbx_blindbox::sender::Sender;
use mbx_blindbox::tokenize::{CaseMode, FlowEvent, FlowTokenizer, Tokenization};

const RULES: &str = r#"
alert tcp any any -> any any (content:"GET /admin"; depth:10; content:"password="; distance:0; within:64; sid:1;)
alert tcp any any -> any any (content:"cmd.exe?/c"; nocase; sid:2;)
alert tcp any any -> any any (content:"|00 01 02 03 04 05 06 07|"; offset:2; sid:3;)
alert tcp any any -> any any (content:"AAAAAAAAAAAAAAAAAAAA"; sid:4;)
"#;
const K: [u8; 16] = [0x11; 16];

fn setup() -> &'static (Arc<EncryptedRules>, PlaintextMatcher) {
    static S: OnceLock<(Arc<EncryptedRules>, PlaintextMatcher)> = OnceLock::new();
    S.get_or_init(|| {
        let file = parse_rules(RULES, false);
        let plan = DetectionPlan::new(&file.rules, Tokenization::Window, BufferPolicy::Approximate);
        let key = TokenKey::new(&K);
        let keys: Vec<KeywordKey> = plan.chunks().iter().map(|c| key.keyword_key(c)).collect();
        let er = Arc::new(EncryptedRules::new(plan, &keys).expect("keys"));
        let m = file
            .rules
            .iter()
            .filter_map(|r| MatchRule::from_rule(r, BufferPolicy::Approximate))
            .collect();
        (er, PlaintextMatcher::new(m).expect("automaton"))
    })
}

fn tokenize(mode: Tokenization, parts: &[&[u8]]) -> Vec<FlowEvent> {
    let mut t = FlowTokenizer::new(mode, CaseMode::Dual, true);
    let mut out = Vec::new();
    for p in parts {
        t.push(p, &mut out);
    }
    t.finish(&mut out);
    out
}

fuzz_target!(|data: &[u8]| {
    let Some((&split, flow)) = data.split_first() else {
        return;
    };
    let cut = usize::from(split).min(flow.len());
    for mode in [Tokenization::Window, Tokenization::Delimiter] {
        let whole = tokenize(mode, &[flow]);
        let parts = tokenize(mode, &[&flow[..cut], &flow[cut..]]);
        assert_eq!(whole, parts);
    }
    let (er, oracle) = setup();
    let mut sender = Sender::new(
        FlowTokenizer::new(Tokenization::Window, CaseMode::Dual, true),
        TokenEncryptor::new(TokenKey::new(&K), u64::from(split) << 32, 64),
    );
    let mut msgs = Vec::new();
    sender.push(&flow[..cut], &mut msgs);
    sender.push(&flow[cut..], &mut msgs);
    sender.finish(&mut msgs);
    let mut det = Detector::new(Arc::clone(er), SaltScheme::ExactMatch, None);
    let mut events = Vec::new();
    for m in &msgs {
        det.process(m, &mut events).expect("honest sender");
    }
    let mut got: Vec<(u32, u64)> = events
        .iter()
        .filter_map(|e| match e {
            Event::Alert(a) => Some((a.sid, a.message_start)),
            Event::ProbableCause(_) => None,
        })
        .collect();
    let mut want: Vec<(u32, u64)> = oracle
        .scan_flow(flow, true, None)
        .into_iter()
        .map(|a| (a.sid, a.message_start))
        .collect();
    got.sort_unstable();
    want.sort_unstable();
    assert_eq!(got, want);
});
