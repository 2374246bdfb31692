//! mbTLS measurements (paper §5): handshake CPU per role (Figure 5), middlebox relay
//! throughput against `openssl speed` (Figure 7), and fetch time through one middlebox with
//! emulated RTTs (Figure 6). Writes `docs/bench/mbtls.json` (every sample) and
//! `docs/bench/mbtls.png`.
//!
//! `cargo run --release -p mbx-mbtls --example mbtls_bench`
//!
//! Every figure is repeated `REPS` times (after a warm-up round) and reported as median and
//! min–max. The machine's 2 cores are shared with everything else running, so the load average
//! is recorded at the start and the end.

mod fetch;
mod handshake;
mod plot;
mod relay;
mod setup;
mod tls_io;

use std::time::Instant;

use mbx_record::TlsVersion;
use mbx_testbed::bench::{self, med, stats};
use mbx_testbed::pki::KeyType;
use serde_json::{json, Value};

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

const REPS: usize = 5;
/// Handshakes per configuration per repetition.
const HANDSHAKES: usize = 60;
/// Fetches per path per version.
const FETCHES: usize = 40;

/// The 1-, 5- and 15-minute load averages (0 where unreadable).
fn loadavg() -> [f64; 3] {
    bench::loadavg().map(|x| x.unwrap_or(0.0))
}

/// Configurations measured again with RSA-2048 keys (the paper's ECDHE-RSA setting).
const RSA_CONFIGS: [&str; 8] = [
    "plain TLS",
    "split TLS",
    "mbTLS 0+0",
    "mbTLS 0+0 (discovery off)",
    "mbTLS 0+1",
    "mbTLS 0+1 (evidence in certificate)",
    "mbTLS 0+2",
    // How much of the middlebox's cost is its (simulated) evidence.
    "mbTLS 1+1 (no evidence)",
];

fn main() -> Res<()> {
    let started = Instant::now();
    if std::env::var_os("MBTLS_BENCH_RELAY_ONLY").is_some() {
        // For profiling (e.g. under `perf record`): the in-process relay only, nothing written.
        return relay::in_process_only(20);
    }
    if let Some(json) = std::env::var_os("MBTLS_BENCH_REPLOT") {
        // Draws docs/bench/mbtls.png again from a saved report (e.g. one of several runs kept
        // aside), measuring nothing.
        let report: Value = serde_json::from_slice(&std::fs::read(json)?)?;
        let out = mbx_testbed::bench::report_dir()?.join("mbtls.png");
        plot::plot(&report, &out)?;
        println!("wrote {}", out.display());
        return Ok(());
    }
    if std::env::var_os("MBTLS_BENCH_RELAY_TCP_ONLY").is_some() {
        // For profiling: the relay over TCP (and the in-process figures), 5 samples, printed.
        let setup = setup::Setup::new(KeyType::EcdsaP256)?;
        relay::run(&setup, 5)?;
        return Ok(());
    }
    if let Some(n) = std::env::var_os("MBTLS_BENCH_RELAY_TCP_BOUND_ONLY") {
        // For profiling: the middlebox-bound relay over TCP only, `n` samples, printed.
        let n = n.to_string_lossy().parse().unwrap_or(20);
        let setup = setup::Setup::new(KeyType::EcdsaP256)?;
        return relay::tcp_bound_only(&setup, n);
    }
    if let Some(n) = std::env::var_os("MBTLS_BENCH_FETCH_ONLY") {
        // The fetch benchmark only (`n` pairs per version, default FETCHES), with when each
        // flight left its sender on both links (median per path), printed, nothing written.
        let n = n.to_string_lossy().parse().unwrap_or(FETCHES);
        let setup = setup::Setup::new(KeyType::EcdsaP256)?;
        fetch::run(&setup, n, true)?;
        return Ok(());
    }
    if let Some(name) = std::env::var_os("MBTLS_BENCH_HANDSHAKE_ONLY") {
        // For profiling: handshake configurations (TLS 1.3, or 1.2 with MBTLS_BENCH_VERSION=1.2;
        // ECDSA, or RSA-2048 with MBTLS_BENCH_KEYS=rsa), printed, nothing written.
        // Several configurations, interleaved: names separated by commas.
        let names = name.to_string_lossy().into_owned();
        let names: Vec<&str> = names.split(',').map(str::trim).collect();
        let keys = match std::env::var("MBTLS_BENCH_KEYS").as_deref() {
            Ok("rsa") => KeyType::Rsa2048,
            _ => KeyType::EcdsaP256,
        };
        let setup = setup::Setup::new(keys)?;
        let version = match std::env::var("MBTLS_BENCH_VERSION").as_deref() {
            Ok("1.2") => TlsVersion::Tls12,
            _ => TlsVersion::Tls13,
        };
        let count = std::env::var("MBTLS_BENCH_HANDSHAKES")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(400);
        handshake::run(&setup, version, count, 1, Some(&names))?;
        return Ok(());
    }
    let load_start = loadavg();
    let setup = setup::Setup::new(KeyType::EcdsaP256)?;
    let mut hs = serde_json::Map::new();
    for (label, v) in [
        ("TLS 1.3", TlsVersion::Tls13),
        ("TLS 1.2", TlsVersion::Tls12),
    ] {
        hs.insert(
            label.into(),
            handshake::run(&setup, v, HANDSHAKES, REPS, None)?,
        );
    }
    let hs = Value::Object(hs);
    let targets_hs = handshake_targets(&hs);
    let rsa_setup = setup::Setup::new(KeyType::Rsa2048)?;
    let rsa = json!({
        "TLS 1.3": handshake::run(&rsa_setup, TlsVersion::Tls13, HANDSHAKES, REPS, Some(&RSA_CONFIGS))?
    });
    let targets_rsa = handshake_targets(&rsa);
    let relay = relay::run(&setup, REPS)?;
    let fetch = fetch::run(&setup, FETCHES, false)?;
    let report = json!({
        "machine": {
            "cpu": bench::cpu_name(),
            "cores": bench::cores(),
            "loadavg_start": load_start,
            "loadavg_end": loadavg(),
        },
        "repetitions": REPS,
        "certificates": "ECDSA P-256 for every server, middlebox and CA (handshake_rsa2048: RSA-2048 for all)",
        "handshake": {
            "handshakes_per_rep": HANDSHAKES,
            "unit": "CPU µs per handshake (mean over the handshakes of one repetition); samples = repetitions, in order",
            "rows_not_built": [],
            "results": hs,
            "targets": targets_hs,
        },
        "handshake_rsa2048": {
            "results": rsa,
            "targets": targets_rsa,
        },
        "relay": relay,
        "fetch": fetch,
        "paper": {
            "fig5": "ECDHE-RSA; mbTLS middlebox cheaper than split TLS (one handshake, not two); each server-side middlebox adds ~20% of a no-middlebox server handshake; endpoints without middlebox close to TLS",
            "fig6": "Azure inter-DC paths: +0.7% on average, +1.2% worst (10 ms of 800 ms), same four-flight shape",
            "fig7": "middlebox saturated with several clients: decrypt+re-encrypt plateaus ~7 Gbit/s (forward-only higher), 40 Gbit/s NICs",
        },
        "runtime_s": started.elapsed().as_secs_f64(),
    });
    let out = mbx_testbed::bench::write_report("mbtls", &report)?;
    plot::plot(&report, &out.join("mbtls.png"))?;
    println!(
        "wrote docs/bench/mbtls.json and mbtls.png in {:.0} s (load average {:?} → {:?})",
        started.elapsed().as_secs_f64(),
        load_start,
        loadavg()
    );
    Ok(())
}

/// Per-repetition CPU µs of `role` in configuration `config` (empty if absent).
fn role_samples(rows: &Value, config: &str, role: &str) -> Vec<f64> {
    rows.as_array()
        .and_then(|rows| rows.iter().find(|r| r["config"] == config))
        .and_then(|r| r["roles"].as_array())
        .and_then(|roles| roles.iter().find(|x| x["role"] == role))
        .and_then(|x| x["cpu_us"]["samples"].as_array())
        .map(|v| v.iter().filter_map(Value::as_f64).collect())
        .unwrap_or_default()
}

/// Per-repetition ratios `f(a_i, b_i)` (paired: same repetition, same load).
fn paired(a: &[f64], b: &[f64], f: impl Fn(f64, f64) -> f64) -> Value {
    let v: Vec<f64> = a.iter().zip(b).map(|(x, y)| f(*x, *y)).collect();
    stats(&v)
}

/// The three handshake targets, per version, as medians of paired per-repetition
/// ratios.
fn handshake_targets(hs: &Value) -> Value {
    let mut out = serde_json::Map::new();
    for (label, rows) in hs.as_object().into_iter().flatten() {
        let r = |cfg: &str, role: &str| role_samples(rows, cfg, role);
        let split_mb = r("split TLS", "middlebox");
        let over = |a: Vec<f64>, b: &[f64]| paired(&a, b, |x, y| x / y);
        let s0 = r("mbTLS 0+0", "server");
        let added = |cfg: &str, k: f64| paired(&r(cfg, "server"), &s0, move |x, y| (x - y) / k / y);
        let mut t = json!({
            "server_cost_per_added_server_side_middlebox": {
                "one": added("mbTLS 0+1", 1.0),
                "two": added("mbTLS 0+2", 2.0),
                // Its evidence in its certificate, checked once (docs/mbtls.md §4.8).
                "one_evidence_in_certificate": added("mbTLS 0+1 (evidence in certificate)", 1.0),
                "target_max": 0.2,
            },
            "endpoint_no_middlebox_over_plain": {
                "client": over(r("mbTLS 0+0", "client"), &r("plain TLS", "client")),
                "client_discovery_off": over(
                    r("mbTLS 0+0 (discovery off)", "client"),
                    &r("plain TLS", "client"),
                ),
                "server": over(s0.clone(), &r("plain TLS", "server")),
                "target_max": 1.1,
            },
            "middlebox_over_split": {
                "server_side_mbtls_0+1": over(r("mbTLS 0+1", "server-side middlebox 1"), &split_mb),
                "target_max": 0.6,
            },
        });
        if !r("plain TLS resumed", "client").is_empty() {
            // Resumed sessions: mbTLS against plain TLS, and against a full mbTLS handshake.
            let mb = |role: &str| r("mbTLS 0+0 resumed", role);
            let minus = |a: Vec<f64>, b: Vec<f64>| -> Vec<f64> {
                a.iter().zip(&b).map(|(x, y)| x - y).collect()
            };
            let server_added = minus(r("mbTLS 0+1 resumed", "server"), mb("server"));
            let client_added = minus(r("mbTLS 1+0 resumed", "client"), mb("client"));
            t["resumed"] = json!({
                "client_over_plain_resumed": over(mb("client"), &r("plain TLS resumed", "client")),
                "client_discovery_off_over_plain_resumed": over(
                    r("mbTLS 0+0 resumed (discovery off)", "client"),
                    &r("plain TLS resumed", "client"),
                ),
                "server_over_plain_resumed": over(mb("server"), &r("plain TLS resumed", "server")),
                "client_resumed_over_full": over(mb("client"), &r("mbTLS 0+0", "client")),
                "server_resumed_over_full": over(mb("server"), &s0),
                // Every session resumed, the secondary ones too (docs/mbtls.md §4.7): what a
                // server-side middlebox adds to the server, over a full and over a resumed
                // no-middlebox server handshake; what a client-side one adds to the client,
                // over a full no-middlebox client handshake.
                "server_cost_per_server_side_middlebox_resumed": {
                    "over_full": paired(&server_added, &s0, |d, y| d / y),
                    "over_resumed": paired(&server_added, &mb("server"), |d, y| d / y),
                },
                "client_cost_per_client_side_middlebox_resumed_over_full": paired(
                    &client_added,
                    &r("mbTLS 0+0", "client"),
                    |d, y| d / y,
                ),
            });
        }
        if !r("mbTLS 1+1 (no evidence)", "client").is_empty() {
            t["middlebox_over_split"]["client_side_no_evidence"] = over(
                r("mbTLS 1+1 (no evidence)", "client-side middlebox 1"),
                &split_mb,
            );
            t["middlebox_over_split"]["server_side_no_evidence"] = over(
                r("mbTLS 1+1 (no evidence)", "server-side middlebox 1"),
                &split_mb,
            );
        }
        if !r("mbTLS 1+1", "client").is_empty() {
            t["middlebox_over_split"]["client_side_mbtls_1+0"] =
                over(r("mbTLS 1+0", "client-side middlebox 1"), &split_mb);
            t["middlebox_over_split"]["client_side_mbtls_1+1"] =
                over(r("mbTLS 1+1", "client-side middlebox 1"), &split_mb);
            // What the simulated attestation costs each role (µs, paired).
            let ev = |role: &str| {
                paired(
                    &r("mbTLS 1+1", role),
                    &r("mbTLS 1+1 (no evidence)", role),
                    |x, y| x - y,
                )
            };
            t["evidence_cost_us"] = json!({
                "client": ev("client"),
                "client-side middlebox": ev("client-side middlebox 1"),
                "server-side middlebox": ev("server-side middlebox 1"),
                "server": ev("server"),
            });
        }
        let brief: Vec<String> = [
            (
                "mb/split",
                &t["middlebox_over_split"]["server_side_mbtls_0+1"],
            ),
            (
                "server per added mb",
                &t["server_cost_per_added_server_side_middlebox"]["one"],
            ),
            (
                "server per added mb (evidence in certificate)",
                &t["server_cost_per_added_server_side_middlebox"]["one_evidence_in_certificate"],
            ),
            (
                "client 0+0/plain",
                &t["endpoint_no_middlebox_over_plain"]["client"],
            ),
            (
                "client 0+0 discovery off/plain",
                &t["endpoint_no_middlebox_over_plain"]["client_discovery_off"],
            ),
            (
                "server 0+0/plain",
                &t["endpoint_no_middlebox_over_plain"]["server"],
            ),
        ]
        .iter()
        .map(|(k, v)| format!("{k} {:.2}", med(v)))
        .collect();
        println!("handshake targets {label}: {}", brief.join(", "));
        out.insert(label.clone(), t);
    }
    Value::Object(out)
}
