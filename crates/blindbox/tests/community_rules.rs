//! The rule parser and classifier on the whole Snort community rule set, and the paper's Table 1.

mod common;

use mbx_blindbox::rules::{parse_rules, stats, table1_report, BufferPolicy, Rule, UnsupportedKind};

#[test]
fn community_rules_parse_and_table1() {
    let text = common::community_rules();
    let file = parse_rules(&text, true);
    for e in &file.errors {
        println!("parse error: {e}");
    }
    assert!(file.errors.is_empty(), "{} parse errors", file.errors.len());
    // Every rule line was parsed: count lines that look like rules.
    let rule_lines = text
        .lines()
        .map(|l| l.trim().trim_start_matches('#').trim_start())
        .filter(|l| {
            ["alert ", "drop ", "log ", "pass ", "reject ", "sdrop "]
                .iter()
                .any(|a| l.starts_with(a))
                && l.contains('(')
        })
        .count();
    assert_eq!(file.rules.len(), rule_lines);
    assert!(file.rules.len() > 3900);

    let all: Vec<&Rule> = file.rules.iter().collect();
    let active: Vec<&Rule> = file.rules.iter().filter(|r| !r.commented).collect();
    let http: Vec<&Rule> = file.rules.iter().filter(|r| r.is_http()).collect();
    println!("{}", table1_report(&file));
    for policy in [BufferPolicy::Approximate, BufferPolicy::Strict] {
        for set in [&all, &active, &http] {
            let r = stats(set.iter().copied(), policy).row;
            assert_eq!(r.p1 + r.p2 + r.p3 + r.none, r.total);
        }
    }
    let s = stats(all.iter().copied(), BufferPolicy::Approximate);
    // Treating buffer modifiers strictly can only move rules out of Protocols I/II.
    let a = stats(http.iter().copied(), BufferPolicy::Approximate).row;
    let st = stats(http.iter().copied(), BufferPolicy::Strict).row;
    assert!(st.p1 + st.p2 <= a.p1 + a.p2);
    assert_eq!(st.p1 + st.p2 + st.p3, a.p1 + a.p2 + a.p3);
    assert!(s
        .unsupported
        .keys()
        .any(|(k, n)| *k == UnsupportedKind::Detection && n == "byte_test"));
}
