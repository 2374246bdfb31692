//! Parse arbitrary bytes as a serialized circuit. Parsing must never panic; an accepted circuit
//! must round-trip, and (when small) its garbled evaluation must equal its cleartext evaluation.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mbx_garble::{evaluate, garble, Circuit, Decoding, GarbleSeed, Label};

fuzz_target!(|data: &[u8]| {
    let _ = Decoding::from_bytes(data, data.len() / 17);
    let Ok(c) = Circuit::from_bytes(data) else {
        return;
    };
    let again = Circuit::from_bytes(&c.to_bytes()).expect("re-serialized circuit parses");
    assert_eq!(again, c);
    if c.wires() > 20_000 {
        return;
    }
    let gb: Vec<bool> = (0..c.garbler_inputs()).map(|i| i % 3 == 0).collect();
    let eb: Vec<bool> = (0..c.evaluator_inputs()).map(|i| i % 2 == 1).collect();
    let expected = c.eval(&gb, &eb).expect("input lengths match");
    let gc = garble(&c, &GarbleSeed::new([3; 16]), 1, &gb).expect("garbles");
    let el: Vec<Label> = gc
        .evaluator_pairs
        .iter()
        .zip(&eb)
        .map(|(p, &b)| p.select(b))
        .collect();
    let out =
        evaluate(&c, 1, &gc.tables, &gc.garbler_labels, &el, &gc.decoding).expect("evaluates");
    assert_eq!(out, expected);
});
