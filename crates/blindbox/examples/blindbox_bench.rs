//! Benchmark runner: measures the paper's Table 2 rows and the plaintext baselines in one run,
//! several times each, and writes `docs/bench/blindbox.json` and `docs/bench/blindbox.png`.
//!
//! `cargo run --release -p mbx-blindbox --example blindbox_bench [-- RUNS [CORPUS_MIB]]`
//! (defaults: 5 runs over a 2 MiB text-heavy HTTP corpus). Single-threaded: every figure is per
//! core.

#[path = "../benches/support/workload.rs"]
mod workload;

use std::sync::Arc;
use std::time::Instant;

use aho_corasick::{AhoCorasick, AhoCorasickKind, MatchKind};
use mbx_blindbox::channel::{ChannelParams, ChannelWriter, FrameAuth, Privacy};
use mbx_blindbox::dpienc::{TokenEncryptor, TokenKey};
use mbx_blindbox::flow::MiddleboxFlow;
use mbx_blindbox::fullrule::FullRuleSet;
use mbx_blindbox::rules::Direction;
use mbx_blindbox::sender::Sender;
use mbx_blindbox::tokenize::{CaseMode, FlowTokenizer, Tokenization};
use mbx_record::{Aead, ContentType, RecordSealer, TlsVersion, TrafficKeys};
use mbx_testbed::bench;
use plotters::prelude::*;
use serde_json::{json, Value};
use workload::*;

/// Median, min and max of `runs` timings of `f` (seconds).
fn measure(runs: usize, mut f: impl FnMut()) -> (f64, f64, f64) {
    f(); // warm-up
    let v: Vec<f64> = (0..runs.max(1))
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .collect();
    let s = bench::Summary::of(&v).expect("at least one run");
    (s.median, s.min, s.max)
}

/// The token channel bytes of `data` (one flow, `PACKET`-sized pushes).
fn channel_bytes(data: &[u8], mode: Tokenization, case: CaseMode) -> (Vec<u8>, u64) {
    let params = ChannelParams {
        tokenization: mode,
        case,
        privacy: Privacy::ExactMatch,
        direction: Direction::ToClient,
    };
    let mut out = Vec::new();
    let mut w = ChannelWriter::new(params, FrameAuth::new(&[7; 32]), &mut out);
    let mut s = Sender::new(
        FlowTokenizer::new(mode, case, true),
        TokenEncryptor::new(TokenKey::new(&K), 1 << 40, PERIOD),
    );
    let mut msgs = Vec::new();
    for p in data.chunks(PACKET) {
        s.push(p, &mut msgs);
        w.push_all(&msgs, &mut out).expect("well-formed");
        msgs.clear();
        w.flush(&mut out);
    }
    s.finish(&mut msgs);
    for m in msgs.drain(..) {
        w.push(&m, &mut out).expect("well-formed");
    }
    w.finish(&mut out).expect("finish");
    (out, w.tokens())
}

struct Row {
    name: String,
    group: &'static str,
    med: f64,
    min: f64,
    max: f64,
    bytes: usize,
    tokens: u64,
}

impl Row {
    fn mbps(&self, t: f64) -> f64 {
        self.bytes as f64 * 8.0 / t / 1e6
    }
    fn json(&self) -> Value {
        let packets = self.bytes as f64 / PACKET as f64;
        json!({
            "name": self.name,
            "group": self.group,
            "seconds": {"median": self.med, "min": self.min, "max": self.max},
            "plaintext_bytes": self.bytes,
            "tokens": self.tokens,
            "mbit_per_s": {"median": self.mbps(self.med), "min": self.mbps(self.max), "max": self.mbps(self.min)},
            "ns_per_token": if self.tokens > 0 { json!(self.med * 1e9 / self.tokens as f64) } else { Value::Null },
            "us_per_1500_byte_packet": self.med * 1e6 / packets,
        })
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let runs: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(5);
    let mib: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(2);
    // The machine is shared: the load average when the run started helps read the spread.
    let load_at_start = bench::loadavg_text();
    let data = corpus(mib << 20, 1);
    let n = data.len();
    let mut rows: Vec<Row> = Vec::new();
    let mut row = |name: &str, group, (med, min, max): (f64, f64, f64), tokens| {
        eprintln!(
            "{name}: median {:.3} ms (min {:.3}, max {:.3})",
            med * 1e3,
            min * 1e3,
            max * 1e3
        );
        rows.push(Row {
            name: name.into(),
            group,
            med,
            min,
            max,
            bytes: n,
            tokens,
        });
    };

    // Sender: tokenize + DPIEnc (window, exact lane), as Table 2's "client encrypt".
    let (_, window_tokens) = channel_bytes(&data, Tokenization::Window, CaseMode::Exact);
    row(
        "sender tokenize+encrypt (window)",
        "sender",
        measure(runs, || {
            let mut s = sender(Tokenization::Window);
            let mut out = Vec::new();
            for p in data.chunks(PACKET) {
                s.push(p, &mut out);
                out.clear();
            }
        }),
        window_tokens,
    );
    // The same bytes as flows of one packet each, a new sender (and count table) per flow:
    // what a flow's setup costs (tokens differ from the row above: no HTTP framing, and each
    // flow's last 7 bytes start no token).
    let short_tokens = data
        .chunks(PACKET)
        .map(|p| p.len().saturating_sub(7) as u64)
        .sum();
    row(
        "sender, one-packet flows (new sender per 1,500 bytes)",
        "sender",
        measure(runs, || {
            let mut out = Vec::new();
            for p in data.chunks(PACKET) {
                let mut s = Sender::new(
                    FlowTokenizer::new(Tokenization::Window, CaseMode::Exact, false),
                    TokenEncryptor::new(TokenKey::new(&K), 1 << 40, PERIOD),
                );
                s.push(p, &mut out);
                s.finish(&mut out);
                out.clear();
            }
        }),
        short_tokens,
    );
    row(
        "sender + channel framing (window)",
        "sender",
        measure(runs, || {
            std::hint::black_box(channel_bytes(&data, Tokenization::Window, CaseMode::Exact));
        }),
        window_tokens,
    );
    row(
        "baseline: TLS 1.3 AES-128-GCM record sealing",
        "sender",
        measure(runs, || {
            let keys = TrafficKeys::new(Aead::Aes128Gcm, &[1; 16], &[2; 12]).expect("keys");
            let mut sealer = RecordSealer::new(TlsVersion::Tls13, keys, 0);
            let mut out = Vec::with_capacity(n + n / 10);
            for p in data.chunks(PACKET) {
                sealer
                    .seal(ContentType::APPLICATION_DATA, p, &mut out)
                    .expect("seal");
            }
        }),
        0,
    );

    // Middlebox: deframe + detect + forward, on window tokens.
    let (chan, _) = channel_bytes(&data, Tokenization::Window, CaseMode::Exact);
    for rule_count in [1usize, 3000] {
        let rs = rules(rule_count);
        let enc = encrypted(&rs, Tokenization::Window);
        let full = Arc::new(FullRuleSet::default());
        // The forwarding buffer is allocated once: a fresh 10 MiB buffer per run would make
        // page faults part of the figure.
        let mut fwd = Vec::with_capacity(chan.len());
        row(
            &format!("middlebox detect, {rule_count} rules (window tokens)"),
            "middlebox",
            measure(runs, || {
                let mut mb = MiddleboxFlow::new(Arc::clone(&enc), Arc::clone(&full));
                fwd.clear();
                let mut ev = Vec::new();
                // The channel arrives in pieces of about one packet's worth of tokens.
                for piece in chan.chunks(PACKET * 5) {
                    mb.token_in(piece, &mut fwd, &mut ev).expect("detect");
                }
            }),
            window_tokens,
        );
        let kw = keywords(&rs);
        let ac = AhoCorasick::builder()
            .match_kind(MatchKind::Standard)
            .kind(Some(AhoCorasickKind::DFA))
            .build(&kw)
            .expect("automaton");
        row(
            &format!("baseline: aho-corasick DFA, {rule_count} keywords (plaintext)"),
            "middlebox",
            measure(runs, || {
                let mut hits = 0usize;
                for p in data.chunks(PACKET) {
                    hits += ac.find_overlapping_iter(p).count();
                }
                std::hint::black_box(hits);
            }),
            0,
        );
    }

    #[cfg(feature = "bench-hyperscan")]
    for rule_count in [1usize, 3000] {
        use hyperscan::prelude::*;
        let kw = keywords(&rules(rule_count));
        let patterns: Patterns = kw
            .iter()
            .enumerate()
            .map(|(i, k)| {
                let expr: String = k.iter().map(|b| format!("\\x{b:02x}")).collect();
                let mut p = Pattern::with_flags(expr, CompileFlags::empty()).expect("pattern");
                p.id = Some(i);
                p
            })
            .collect();
        let db: BlockDatabase = patterns.build().expect("hyperscan database");
        let scratch = db.alloc_scratch().expect("scratch");
        row(
            &format!("baseline: Hyperscan, {rule_count} keywords (plaintext)"),
            "middlebox",
            measure(runs, || {
                let mut hits = 0usize;
                for p in data.chunks(PACKET) {
                    db.scan(p, &scratch, |_, _, _, _| {
                        hits += 1;
                        Matching::Continue
                    })
                    .expect("scan");
                }
                std::hint::black_box(hits);
            }),
            0,
        );
    }

    // Bandwidth: token channel bytes per plaintext byte.
    let mut bandwidth = Vec::new();
    for (mode, mname) in [
        (Tokenization::Window, "window"),
        (Tokenization::Delimiter, "delimiter"),
    ] {
        for (case, cname) in [
            (CaseMode::Exact, "exact lane"),
            (CaseMode::Dual, "exact + folded lanes"),
        ] {
            let (bytes, tokens) = channel_bytes(&data, mode, case);
            bandwidth.push(json!({
                "tokenization": mname,
                "lanes": cname,
                "plaintext_bytes": n,
                "tokens": tokens,
                "channel_bytes": bytes.len(),
                "overhead": bytes.len() as f64 / n as f64,
            }));
        }
    }

    let get = |name: &str| {
        rows.iter()
            .find(|r| r.name.starts_with(name))
            .map(|r| r.mbps(r.med))
            .unwrap_or(f64::NAN)
    };
    let ratios = json!({
        "detect_3000_vs_aho_corasick": get("baseline: aho-corasick DFA, 3000") / get("middlebox detect, 3000"),
        "detect_1_vs_aho_corasick": get("baseline: aho-corasick DFA, 1 ") / get("middlebox detect, 1 "),
        "detect_3000_vs_hyperscan": get("baseline: Hyperscan, 3000") / get("middlebox detect, 3000"),
        "sender_vs_hyperscan_3000": get("baseline: Hyperscan, 3000") / get("sender tokenize+encrypt"),
        "sender_vs_tls_seal": get("baseline: TLS") / get("sender tokenize+encrypt"),
        "detect_3000_vs_paper_186_mbps": get("middlebox detect, 3000") / 186.0,
        "sender_vs_paper_130_mbps": get("sender tokenize+encrypt") / 130.0,
    });
    let report = json!({
        "machine": bench::cpu_name(),
        "load_average_at_start": load_at_start,
        "runs": runs,
        "corpus": {"bytes": n, "kind": "text-heavy HTTP/1.1 responses (HTML prose)", "packet_bytes": PACKET, "salt_period_bytes": PERIOD},
        "rows": rows.iter().map(Row::json).collect::<Vec<_>>(),
        "bandwidth": bandwidth,
        "ratios": ratios,
        "paper": {
            "client_encrypt_ns_per_token": 69, "client_encrypt_us_per_packet": 90,
            "mb_detect_3k_ns_per_token": 137, "mb_detect_3k_us_per_packet": 33,
            "mb_mbit_per_s": [166, 186], "snort_plaintext_mbit_per_s": 85,
        },
    });
    let dir =
        mbx_testbed::bench::write_report("blindbox", &report).expect("docs/bench/blindbox.json");
    plot(&rows, &dir.join("blindbox.png")).expect("plot");
    println!(
        "{}",
        serde_json::to_string_pretty(&report["ratios"]).unwrap_or_default()
    );
    for r in &rows {
        println!("{:<62} {:>10.1} Mbit/s", r.name, r.mbps(r.med));
    }
}

/// Horizontal bars, log scale: median Mbit/s per row with the min–max spread as a whisker.
/// Labels use a system font when one is found (DejaVu); otherwise the bars are drawn unlabelled
/// and the JSON names them in the same order.
fn plot(rows: &[Row], path: &std::path::Path) -> Result<(), Box<dyn std::error::Error>> {
    let root = BitMapBackend::new(path, (1100, 60 + 44 * rows.len() as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    if let Some(font) = bench::sans_font() {
        plotters::style::register_font("sans-serif", FontStyle::Normal, font)
            .map_err(|_| "font")?;
    }
    let max = rows.iter().map(|r| r.mbps(r.min)).fold(1.0, f64::max) * 2.0;
    let (left, right) = root.split_horizontally(420);
    let label_style = ("sans-serif", 15).into_font();
    for (i, r) in rows.iter().enumerate() {
        let y = 40 + 44 * i as i32;
        let _ = left.draw(&Text::new(r.name.clone(), (6, y + 8), label_style.clone()));
    }
    let mut chart = ChartBuilder::on(&right)
        .margin(10)
        .x_label_area_size(30)
        .build_cartesian_2d((1.0..max).log_scale(), 0..rows.len() as i32)?;
    let _ = chart
        .configure_mesh()
        .disable_y_mesh()
        .x_desc("Mbit/s per core (log)")
        .draw();
    let n = rows.len() as i32;
    for (i, r) in rows.iter().enumerate() {
        let y = n - 1 - i as i32;
        let color = if r.name.starts_with("baseline") {
            BLUE.mix(0.5)
        } else {
            RED.mix(0.7)
        };
        chart.draw_series(std::iter::once(Rectangle::new(
            [(1.0, y), (r.mbps(r.med), y + 1)],
            color.filled(),
        )))?;
        chart.draw_series(std::iter::once(PathElement::new(
            vec![(r.mbps(r.max), y), (r.mbps(r.min), y)],
            BLACK.stroke_width(3),
        )))?;
    }
    root.present()?;
    Ok(())
}
