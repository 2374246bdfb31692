//! Setup benchmark: time and bytes per party for 1, 100, 1,000 and all chunks of the Snort
//! community rules, the three parties on loopback TCP in one process (2 tokio workers; each party
//! garbles / evaluates on up to `workers` threads), plus per-circuit garbling and evaluation
//! costs. Writes `docs/bench/blindbox-setup.json` and `docs/bench/blindbox-setup.png`.
//!
//! `cargo run --release -p mbx-blindbox-setup --example setup_bench -- [runs] [full_runs]`
//! (defaults 3 and 1: the full rule set takes most of the machine for several seconds).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use mbx_blindbox::rules::BufferPolicy;
use mbx_blindbox::tokenize::Tokenization;
use mbx_blindbox_setup::driver::{run_endpoint, run_middlebox, PartyStats};
use mbx_blindbox_setup::{
    default_workers, Endpoint, EndpointConfig, EndpointKeys, Middlebox, MiddleboxConfig, RgKey,
    SignedChunk, TaggedRules,
};
use mbx_garble::{Evaluator, Garbler, Label, TranscriptHasher};
use mbx_testbed::bench::{self, Summary};
use plotters::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use tokio::net::{TcpListener, TcpStream};

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

#[derive(Clone, Copy, Debug)]
struct Run {
    wall: Duration,
    mb: PartyStats,
    full: PartyStats,
    hash: PartyStats,
}

async fn one_run(chunks: Vec<SignedChunk>, rg: &RgKey, seed: u64) -> Res<Run> {
    let mut rng = StdRng::seed_from_u64(seed);
    let k: [u8; 16] = rng.gen();
    let k_rand: [u8; 32] = rng.gen();
    let workers = workers();
    let ep = |s: u64| {
        Endpoint::new(
            EndpointKeys::from_parts(k, k_rand),
            rg,
            EndpointConfig {
                workers,
                group: std::env::var("MBX_GROUP")
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0),
                ..EndpointConfig::default()
            },
            &mut StdRng::seed_from_u64(s),
        )
    };
    let (a, b) = (ep(seed + 1)?, ep(seed + 2)?);
    let mb = Middlebox::new(chunks, mb_config(), &mut rng)?;
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let start = Instant::now();
    let sa = TcpStream::connect(addr).await?;
    let (full, _) = listener.accept().await?;
    let sb = TcpStream::connect(addr).await?;
    let (hash, _) = listener.accept().await?;
    let ta = tokio::spawn(run_endpoint(sa, a, |_| {}));
    let tb = tokio::spawn(run_endpoint(sb, b, |_| {}));
    let total = mb.progress().circuits_total;
    let mut next_report = 0u32;
    let (outcome, mb_stats) = run_middlebox(full, hash, mb, |p| {
        if total >= 2000 && p.circuits_done >= next_report {
            eprintln!("  {} / {} circuits", p.circuits_done, total);
            next_report = p.circuits_done + 500;
        }
    })
    .await?;
    let wall = start.elapsed();
    if !outcome.refused().is_empty() {
        return Err("chunks refused in an honest run".into());
    }
    Ok(Run {
        wall,
        mb: mb_stats,
        full: ta.await??,
        hash: tb.await??,
    })
}

/// The middlebox configuration: defaults, overridable with `MBX_BATCH` / `MBX_WINDOW`.
fn mb_config() -> MiddleboxConfig {
    fn env<T: std::str::FromStr>(k: &str) -> Option<T> {
        std::env::var(k).ok().and_then(|v| v.parse().ok())
    }
    let d = MiddleboxConfig::default();
    MiddleboxConfig {
        batch: env("MBX_BATCH").unwrap_or(d.batch),
        window: env("MBX_WINDOW").unwrap_or(d.window),
        workers: workers(),
    }
}

/// Threads per party: all cores unless `MBX_WORKERS` says otherwise.
fn workers() -> usize {
    std::env::var("MBX_WORKERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(default_workers)
}

/// Median (mean of the middle two for an even count; NaN when empty).
fn median(v: Vec<f64>) -> f64 {
    Summary::of(&v).map_or(f64::NAN, |s| s.median)
}

/// Per-circuit costs on one core: garble (streamed), transcript hash, evaluate.
fn per_circuit(samples: u32) -> Res<serde_json::Value> {
    let circuit = mbx_blindbox_setup::common::setup_circuit()?;
    let ands = circuit.counts().and as f64;
    let inputs = mbx_garble::blindbox_token_garbler_inputs(&[3; 16], &[4; 16]);
    let (mut tg, mut th, mut te) = (Vec::new(), Vec::new(), Vec::new());
    let mut bytes = 0;
    for i in 0..samples {
        let seed = mbx_garble::GarbleSeed::new([i as u8; 16]);
        let t = Instant::now();
        let mut g = Garbler::new(&circuit, &seed, u64::from(i), &inputs)?;
        let mut tables = Vec::with_capacity(circuit.counts().table_bytes());
        while g.write_tables(&mut tables, usize::MAX) > 0 {}
        let dec = g.decoding()?;
        tg.push(t.elapsed().as_secs_f64());
        let pairs = g.evaluator_input_pairs();
        let labels: Vec<Label> = pairs.iter().map(|p| p.select(i % 3 == 0)).collect();
        let seed_l = g.garbler_label_seed();
        bytes = tables.len() + dec.to_bytes().len() + 16;
        let t = Instant::now();
        let mut h = TranscriptHasher::new(&circuit, u64::from(i));
        h.update_tables(&tables);
        let _ = h.finish(&seed_l, &dec);
        th.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        let gl = seed_l.expand(circuit.garbler_inputs());
        let mut e = Evaluator::new(&circuit, u64::from(i), &gl, &labels)?;
        e.feed(&tables)?;
        let _ = e.finish(&dec)?;
        te.push(t.elapsed().as_secs_f64());
    }
    let (g, h, e) = (median(tg), median(th), median(te));
    Ok(json!({
        "and_gates": circuit.counts().and,
        "garble_us": g * 1e6, "garble_ns_per_and": g * 1e9 / ands,
        "evaluate_us": e * 1e6, "evaluate_ns_per_and": e * 1e9 / ands,
        "transcript_hash_us": h * 1e6,
        "bytes_per_circuit": bytes,
        "wire_bytes_per_circuit_frame": bytes + 5 + 4 + 4,
    }))
}

fn party(runs: &[Run], f: impl Fn(&Run) -> PartyStats) -> serde_json::Value {
    json!({
        "seconds": median(runs.iter().map(|r| f(r).elapsed.as_secs_f64()).collect()),
        "busy_seconds": median(runs.iter().map(|r| f(r).busy.as_secs_f64()).collect()),
        "bytes_sent": f(&runs[0]).bytes_sent,
        "bytes_received": f(&runs[0]).bytes_received,
    })
}

/// `--replot`: redraw the PNG from the JSON without measuring.
fn replot() -> Res<()> {
    let out = mbx_testbed::bench::report_dir()?;
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("blindbox-setup.json"))?)?;
    let rows: Vec<(usize, f64, u64)> = v["setup"]
        .as_array()
        .ok_or("no setup rows")?
        .iter()
        .map(|r| {
            let n = r["chunks"].as_u64().unwrap_or(0) as usize;
            let t = r["wall_seconds_median"].as_f64().unwrap_or(f64::NAN);
            let b = ["middlebox", "full_endpoint", "hash_endpoint"]
                .iter()
                .map(|p| r[p]["bytes_sent"].as_u64().unwrap_or(0))
                .sum();
            (n, t, b)
        })
        .collect();
    plot(&rows, &out.join("blindbox-setup.png"))
}

fn main() -> Res<()> {
    if std::env::args().any(|a| a == "--replot") {
        return replot();
    }
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let runs = args.first().copied().unwrap_or(3).max(1);
    let full_runs = args.get(1).copied().unwrap_or(1).max(1);
    let rules_path = repo_root().join("../shared/data/snort-community/community.rules");
    let rules_path = if rules_path.exists() {
        rules_path
    } else {
        PathBuf::from("/work/shared/data/snort-community/community.rules")
    };
    let text = std::fs::read_to_string(&rules_path)?;
    let rg = RgKey::generate(&mut StdRng::seed_from_u64(42));
    let t = Instant::now();
    let tagged = TaggedRules::sign(&text, true, &rg);
    let sign_s = t.elapsed().as_secs_f64();
    let file_bytes = tagged.to_bytes().len();
    let plan = tagged.plan(Tokenization::Window, BufferPolicy::Approximate);
    let all = tagged.signed_chunks(&plan)?;
    eprintln!(
        "community rules: {} tagged chunks, plan (window) {} chunks; signed in {:.2} s",
        tagged.chunks().len(),
        all.len(),
        sign_s
    );

    let micro = per_circuit(30)?;
    eprintln!("per circuit: {micro}");

    let load_before = loadavg();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let mut rows = Vec::new();
    let mut plot_rows = Vec::new();
    let max_n: usize = std::env::var("MBX_MAX_CHUNKS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(usize::MAX);
    for n in [1usize, 100, 1000, all.len()]
        .into_iter()
        .filter(|&n| n <= max_n)
    {
        let reps = if n == all.len() { full_runs } else { runs };
        let mut results = Vec::new();
        for rep in 0..reps {
            let chunks = all.get(..n).ok_or("n")?.to_vec();
            let r = rt.block_on(one_run(chunks, &rg, 1000 * rep as u64 + n as u64))?;
            eprintln!(
                "{n:>5} chunks: wall {:.3} s; busy: mb {:.3} s, full {:.3} s, hash {:.3} s; full endpoint sent {} B; hash endpoint sent {} B",
                r.wall.as_secs_f64(),
                r.mb.busy.as_secs_f64(),
                r.full.busy.as_secs_f64(),
                r.hash.busy.as_secs_f64(),
                r.full.bytes_sent,
                r.hash.bytes_sent
            );
            results.push(r);
        }
        let wall = median(results.iter().map(|r| r.wall.as_secs_f64()).collect());
        let spread: Vec<f64> = results.iter().map(|r| r.wall.as_secs_f64()).collect();
        plot_rows.push((
            n,
            wall,
            results[0].full.bytes_sent + results[0].hash.bytes_sent + results[0].mb.bytes_sent,
        ));
        rows.push(json!({
            "chunks": n,
            "runs": reps,
            "wall_seconds_median": wall,
            "wall_seconds_all": spread,
            "ms_per_chunk": wall * 1e3 / n as f64,
            "middlebox": party(&results, |r| r.mb),
            "full_endpoint": party(&results, |r| r.full),
            "hash_endpoint": party(&results, |r| r.hash),
            "bytes_on_wire_total": results[0].mb.bytes_sent + results[0].mb.bytes_received,
        }));
    }
    let report = json!({
        "what": "BlindBox setup (garbled circuits + OT) over loopback TCP, three parties in one process",
        "machine": { "cpu": bench::cpu_name(), "cores": default_workers(), "loadavg_1min_before": load_before, "loadavg_1min_after": loadavg(), "note": "shared 2-core VM; other jobs' load shows in the load averages" },
        "config": { "circuit": "Token64 (8-byte chunks), tag check in circuit", "batch": mb_config().batch, "window": mb_config().window, "workers_per_party": workers(), "tokio_workers": 2 },
        "rules": { "file": "shared/data/snort-community/community.rules", "include_commented": true, "tagged_chunks": tagged.chunks().len(), "plan_chunks_window": all.len(), "sign_seconds": sign_s, "tagged_file_bytes": file_bytes },
        "per_circuit": micro,
        "setup": rows,
        "paper": { "setup_1_keyword_ms": 588, "setup_3k_rules_s": 97, "garble_us_per_circuit": 1042, "bytes_per_circuit": 599000 },
    });
    let out = mbx_testbed::bench::write_report("blindbox-setup", &report)?;
    plot(&plot_rows, &out.join("blindbox-setup.png"))?;
    eprintln!("wrote {}", out.join("blindbox-setup.json").display());
    Ok(())
}

/// The 1-minute load average (other jobs on the shared machine).
fn loadavg() -> f64 {
    bench::loadavg()[0].unwrap_or(f64::NAN)
}

/// Two panels, log-log: setup wall time and total bytes on the wire against the chunk count,
/// with the paper's two setup points for comparison.
fn plot(rows: &[(usize, f64, u64)], path: &Path) -> Res<()> {
    let root = BitMapBackend::new(path, (1100, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    if let Some(font) = bench::sans_font() {
        plotters::style::register_font("sans-serif", FontStyle::Normal, font)
            .map_err(|_| "font")?;
    }
    let (left, right) = root.split_horizontally(550);
    let max_n = rows.iter().map(|r| r.0).max().unwrap_or(1).max(10_000) as f64;
    let max_t = rows.iter().map(|r| r.1).fold(100.0, f64::max) * 1.5;
    let mut c = ChartBuilder::on(&left)
        .margin(15)
        .caption("setup wall time (s)", ("sans-serif", 18))
        .x_label_area_size(35)
        .y_label_area_size(50)
        .build_cartesian_2d((0.8..max_n * 1.2).log_scale(), (0.001..max_t).log_scale())?;
    c.configure_mesh().x_desc("rule chunks").draw()?;
    c.draw_series(std::iter::once(PathElement::new(
        rows.iter().map(|r| (r.0 as f64, r.1)).collect::<Vec<_>>(),
        RED.stroke_width(3),
    )))?
    .label("mbx (loopback, 2 cores)")
    .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED.stroke_width(3)));
    c.draw_series(
        rows.iter()
            .map(|r| Circle::new((r.0 as f64, r.1), 5, RED.filled())),
    )?;
    let paper = [(1.0, 0.588), (10_000.0, 97.0)];
    c.draw_series(std::iter::once(PathElement::new(
        vec![(0.8, 10.0), (max_n * 1.2, 10.0)],
        BLACK.mix(0.5).stroke_width(1),
    )))?
    .label("target: community rules in 10 s")
    .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK.mix(0.5)));
    c.draw_series(paper.iter().map(|&p| Circle::new(p, 6, BLUE.filled())))?
        .label("paper (1 keyword; 3K rules ≈ 10k chunks)")
        .legend(|(x, y)| Circle::new((x + 10, y), 5, BLUE.filled()));
    c.configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()?;
    let mb = |b: u64| b as f64 / 1e6;
    let max_b = mb(rows.iter().map(|r| r.2).max().unwrap_or(1)) * 2.0;
    let mut c = ChartBuilder::on(&right)
        .margin(15)
        .caption("megabytes on the wire (both links)", ("sans-serif", 18))
        .x_label_area_size(35)
        .y_label_area_size(60)
        .build_cartesian_2d((0.8..max_n * 1.2).log_scale(), (0.01..max_b).log_scale())?;
    c.configure_mesh().x_desc("rule chunks").draw()?;
    let ours: Vec<(f64, f64)> = rows.iter().map(|r| (r.0 as f64, mb(r.2))).collect();
    c.draw_series(std::iter::once(PathElement::new(
        ours.clone(),
        RED.stroke_width(3),
    )))?
    .label("mbx: one full circuit + one digest per chunk")
    .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED.stroke_width(3)));
    c.draw_series(ours.iter().map(|&p| Circle::new(p, 5, RED.filled())))?;
    // The paper's 599 KB per garbled circuit, for scale.
    c.draw_series(std::iter::once(PathElement::new(
        vec![(1.0, 0.599), (max_n, 0.599 * max_n)],
        BLUE.mix(0.6).stroke_width(2),
    )))?
    .label("paper: 599 KB per circuit")
    .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE.mix(0.6).stroke_width(2)));
    c.configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()?;
    root.present()?;
    Ok(())
}
