//! Parse arbitrary text as a Snort rule file: must never panic; every parsed rule must classify,
//! compile into a detection plan and evaluate positions without panicking.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mbx_blindbox::detect::DetectionPlan;
use mbx_blindbox::rules::{classify, parse_rule, parse_rules, BufferPolicy, MatchRule};
use mbx_blindbox::tokenize::Tokenization;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let _ = parse_rule(&text, 1);
    let file = parse_rules(&text, true);
    for policy in [BufferPolicy::Approximate, BufferPolicy::Strict] {
        for r in &file.rules {
            let _ = classify(r, policy);
            if let Some(m) = MatchRule::from_rule(r, policy) {
                // Occurrences derived from the input bytes.
                let occ: Vec<Vec<u64>> = m
                    .contents
                    .iter()
                    .enumerate()
                    .map(|(j, _)| {
                        data.iter()
                            .skip(j)
                            .step_by(3)
                            .map(|&b| u64::from(b))
                            .collect::<Vec<_>>()
                    })
                    .map(|mut v| {
                        v.sort_unstable();
                        v.dedup();
                        v
                    })
                    .collect();
                let _ = m.satisfied(&occ);
            }
        }
        for mode in [Tokenization::Window, Tokenization::Delimiter] {
            let _ = DetectionPlan::new(&file.rules, mode, policy);
        }
    }
});
