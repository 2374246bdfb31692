//! Quick timing of the BlindBox circuit: `cargo run --release -p mbx-garble --example
//! garble_profile -- [iterations] [garble|eval|both] [token64|block128]`. Prints the median and spread per circuit (the
//! minimum is the least disturbed by other load on a shared machine), and the transcript digest of
//! one fixed garbling (the known answer in `tests/garbling.rs`).

use std::time::Instant;

use mbx_garble::*;

fn stats(name: &str, mut v: Vec<f64>, ands: f64) {
    v.sort_by(f64::total_cmp);
    let q = |p: f64| v[((v.len() - 1) as f64 * p).round() as usize] * 1e6;
    println!(
        "{name}: median {:.1} µs ({:.1} ns/AND); min {:.1}, p10 {:.1}, p90 {:.1}, max {:.1} µs",
        q(0.5),
        q(0.5) * 1e3 / ands,
        q(0.0),
        q(0.1),
        q(0.9),
        q(1.0)
    );
}

fn main() {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(200);
    let what = args.next().unwrap_or_else(|| "both".into());
    let layout = match args.next().as_deref() {
        Some("block128") => Layout::Block128,
        _ => Layout::Token64,
    };
    let c = blindbox_circuit_for(layout).unwrap_or_else(|e| panic!("{e}"));
    let ands = c.counts().and as f64;
    let gb = match layout {
        Layout::Token64 => blindbox_token_garbler_inputs(&[3; 16], &[4; 16]),
        Layout::Block128 => blindbox_garbler_inputs(&[3; 16], &[4; 16]),
    };
    let seed = GarbleSeed::new([7; 16]);
    let mut buf = Vec::with_capacity(1 << 16);
    let counts = c.counts();
    let digest = hash_garbling(&c, &seed, 5, &gb).unwrap_or_else(|e| panic!("{e}"));
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    println!(
        "{layout:?}: {} AND, {} XOR, {} INV, {} label slots; transcript digest {hex}",
        counts.and,
        counts.xor,
        counts.inv,
        c.label_slots()
    );
    if what != "eval" {
        let mut t = Vec::with_capacity(n);
        for i in 0..n {
            let s = Instant::now();
            let mut g = Garbler::new(&c, &seed, i as u64, &gb).unwrap_or_else(|e| panic!("{e}"));
            let _ = g.evaluator_input_pairs();
            loop {
                buf.clear();
                if g.write_tables(&mut buf, 2048) == 0 {
                    break;
                }
                std::hint::black_box(&buf);
            }
            std::hint::black_box(g.decoding().unwrap_or_else(|e| panic!("{e}")));
            t.push(s.elapsed().as_secs_f64());
        }
        stats("garble (streamed)", t, ands);
    }
    if what != "garble" {
        let gc = garble(&c, &seed, 1, &gb).unwrap_or_else(|e| panic!("{e}"));
        let el: Vec<Label> = gc.evaluator_pairs.iter().map(|p| p.select(false)).collect();
        let mut t = Vec::with_capacity(n);
        for _ in 0..n {
            let s = Instant::now();
            let mut e =
                Evaluator::new(&c, 1, &gc.garbler_labels, &el).unwrap_or_else(|e| panic!("{e}"));
            for chunk in gc.tables.chunks(1 << 16) {
                e.feed(chunk).unwrap_or_else(|e| panic!("{e}"));
            }
            std::hint::black_box(e.finish(&gc.decoding).unwrap_or_else(|e| panic!("{e}")));
            t.push(s.elapsed().as_secs_f64());
        }
        stats("evaluate", t, ands);
    }
}
