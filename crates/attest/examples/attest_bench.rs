//! What checking one piece of evidence costs an endpoint, per kind: simulated evidence (what the
//! mbTLS benchmarks use), an Intel DCAP quote checked in full by `dcap-qvl` (the baseline), and a
//! quote of a platform the verifier already checked in full (`mbx_attest::dcap_cache`: its
//! signature alone), beside one bare ECDSA P-256 verification (the floor of any quote check);
//! each DCAP check with the collateral as JSON (evidence kind 2) and compressed (kind 3), and
//! what compressing it costs the middlebox.
//!
//! `cargo run --release -p mbx-attest --example attest_bench` (≈ 2 s). CPU time of this thread
//! per check, 5 repetitions after a warm-up, checks interleaved; median (min–max); ratios per
//! repetition. Writes `docs/bench/attest.json` and `docs/bench/attest.png`.

#[path = "../tests/common/mod.rs"]
mod common;

use std::path::Path;
use std::sync::Arc;

use aws_lc_rs::signature::{UnparsedPublicKey, ECDSA_P256_SHA256_FIXED};
use dcap_qvl::quote::{AuthData, Quote};
use mbx_attest::{
    report_data, sim, verify_bytes, Attester, Collateral, DcapEvidence, DcapVerifier, Evidence,
    HexBytes, Policy, SimulatedAttester, SimulatedPlatform,
};
use mbx_testbed::bench::{self, med, stats};
use plotters::prelude::*;
use serde_json::{json, Value};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

const REPS: usize = 5;
const CHECKS: usize = 200;

/// One way of checking evidence, run `CHECKS` times per repetition.
struct Case {
    name: String,
    evidence_bytes: usize,
    run: Box<dyn Fn() -> bool>,
}

/// This thread's CPU time, µs.
fn thread_cpu_us() -> f64 {
    bench::calling_thread_cpu_ns() as f64 / 1e3
}

/// A DCAP sample as "a platform" (`tests/common`): full, remembered, through `verify_bytes`, and
/// the one ECDSA verification beneath them.
fn dcap_cases(name: &str, s: common::Sample, cases: &mut Vec<Case>) -> Res<()> {
    let p = common::platform(s);
    let q = Quote::parse(&p.quote)?;
    let (rd, now, policy) = (p.report_data, p.now, p.policy.clone());
    let plain = DcapEvidence::new(p.quote.clone(), p.collateral.clone())?;
    let bytes = Evidence::Dcap(plain.clone()).to_bytes();
    let size = bytes.len();
    let deflated = Collateral::deflate(&p.collateral)?;
    let compressed = DcapEvidence::with_collateral(p.quote.clone(), deflated)?;
    for (form, ev) in [("", plain), ("compressed, ", compressed)] {
        let size = Evidence::Dcap(ev.clone()).to_bytes().len();
        for (label, remembered) in [
            ("full check (dcap-qvl)", false),
            ("platform remembered", true),
        ] {
            // Capacity 0: every quote in full; otherwise the platform is checked in full at
            // the warm-up and remembered for the hour.
            let v = DcapVerifier::new(usize::from(remembered), 3600);
            let (ev, policy) = (ev.clone(), policy.clone());
            cases.push(Case {
                name: format!("{name}, {form}{label}"),
                evidence_bytes: size,
                run: Box::new(move || v.verify_evidence(&ev, &rd, &policy, now).is_ok()),
            });
        }
    }
    // What a middlebox spends compressing its platform's collateral (once per platform).
    let collateral = p.collateral.clone();
    cases.push(Case {
        name: format!("{name}, compressing the collateral"),
        evidence_bytes: 0,
        run: Box::new(move || Collateral::deflate(&collateral).is_ok()),
    });
    // The shared verifier behind verify_bytes (what an mbTLS endpoint calls) remembers too.
    let policy2 = policy.clone();
    cases.push(Case {
        name: format!("{name}, verify_bytes (shared verifier)"),
        evidence_bytes: size,
        run: Box::new(move || verify_bytes(&bytes, &rd, &policy2, now).is_ok()),
    });
    // The floor: the attestation key's signature over header and body, nothing else.
    let (sig, key) = match &q.auth_data {
        AuthData::V3(a) => (a.ecdsa_signature, a.ecdsa_attestation_key),
        AuthData::V4(a) => (a.ecdsa_signature, a.ecdsa_attestation_key),
    };
    let mut public = [0x04u8; 65];
    public[1..].copy_from_slice(&key);
    let signed = p.quote[..q.signed_length()].to_vec();
    cases.push(Case {
        name: format!("{name}, one ECDSA P-256 verify"),
        evidence_bytes: 0,
        run: Box::new(move || {
            UnparsedPublicKey::new(&ECDSA_P256_SHA256_FIXED, &public)
                .verify(&signed, &sig)
                .is_ok()
        }),
    });
    Ok(())
}

fn sim_case() -> Res<Case> {
    let platform = Arc::new(SimulatedPlatform::from_seed(&[1; 32])?);
    let measurement = sim::measure("bench", b"");
    let attester = SimulatedAttester::new(platform.clone(), measurement, sim::signer_id("bench"));
    let rd = report_data(b"spki", &[7; 32]);
    let bytes = attester.evidence(&rd)?.to_bytes();
    let policy = Policy {
        allow_simulated: true,
        measurements: vec![HexBytes::from(measurement)],
        sim_platform_keys: vec![HexBytes::from(platform.public_key())],
        ..Policy::default()
    };
    Ok(Case {
        name: "simulated (Ed25519 platform key)".into(),
        evidence_bytes: bytes.len(),
        run: Box::new(move || verify_bytes(&bytes, &rd, &policy, 1_700_000_000).is_ok()),
    })
}

fn main() -> Res<()> {
    let mut cases = vec![sim_case()?];
    dcap_cases("DCAP SGX", common::sgx(), &mut cases)?;
    dcap_cases("DCAP TDX", common::tdx(), &mut cases)?;
    let mut us: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
    for rep in 0..=REPS {
        for (i, c) in cases.iter().enumerate() {
            let start = thread_cpu_us();
            for _ in 0..CHECKS {
                if !(c.run)() {
                    return Err(format!("{}: evidence refused", c.name).into());
                }
            }
            if rep > 0 {
                us[i].push((thread_cpu_us() - start) / CHECKS as f64);
            }
        }
    }
    let rows: Vec<Value> = cases
        .iter()
        .zip(&us)
        .map(|(c, v)| json!({"check": c.name, "evidence_bytes": c.evidence_bytes, "cpu_us": stats(v)}))
        .collect();
    // Ratios per repetition; a name that matches no case is an error, not another case's row.
    let index = |n: &str| {
        cases
            .iter()
            .position(|c| c.name == n)
            .ok_or_else(|| format!("no case {n:?}"))
    };
    let mut ratios = serde_json::Map::new();
    for tee in ["DCAP SGX", "DCAP TDX"] {
        let case = |what: &str| format!("{tee}, {what}");
        let (full, remembered) = (case("full check (dcap-qvl)"), case("platform remembered"));
        for (label, a, b) in [
            ("remembered / full", remembered.clone(), full.clone()),
            (
                "remembered / one ECDSA verify",
                remembered,
                case("one ECDSA P-256 verify"),
            ),
            (
                "simulated / full",
                "simulated (Ed25519 platform key)".into(),
                full.clone(),
            ),
            (
                "compressed full / full",
                case("compressed, full check (dcap-qvl)"),
                full.clone(),
            ),
            (
                "compressed remembered / full",
                case("compressed, platform remembered"),
                full,
            ),
        ] {
            let (a, b) = (&us[index(&a)?], &us[index(&b)?]);
            let per_rep: Vec<f64> = a.iter().zip(b).map(|(x, y)| x / y).collect();
            ratios.insert(format!("{tee}: {label}"), stats(&per_rep));
        }
    }
    let report = json!({
        "cpu": bench::cpu_name(),
        "cores": bench::cores(),
        "loadavg": bench::loadavg_text(),
        "method": format!("thread CPU per check, {CHECKS} checks x {REPS} repetitions after a warm-up, interleaved"),
        "checks": rows,
        "ratios": ratios,
    });
    for r in &rows {
        let s = &r["cpu_us"];
        println!(
            "{:<48} {:>8.1} µs ({:.1}-{:.1}), evidence {} B",
            r["check"].as_str().unwrap_or(""),
            med(s),
            s["min"].as_f64().unwrap_or(0.0),
            s["max"].as_f64().unwrap_or(0.0),
            r["evidence_bytes"]
        );
    }
    for (k, v) in &ratios {
        println!("{k:<48} {:.3}", med(v));
    }
    let out = mbx_testbed::bench::write_report("attest", &report)?;
    plot(&rows, &out.join("attest.png"))?;
    println!("wrote docs/bench/attest.json and attest.png");
    Ok(())
}

/// One bar per check: median µs per check, whisker min-max.
fn plot(rows: &[Value], path: &Path) -> Res<()> {
    let root = BitMapBackend::new(path, (1000, 700)).into_drawing_area();
    root.fill(&WHITE)?;
    if let Some(font) = bench::sans_font() {
        plotters::style::register_font("sans-serif", FontStyle::Normal, font)
            .map_err(|_| "font")?;
    }
    let max = rows
        .iter()
        .map(|r| r["cpu_us"]["max"].as_f64().unwrap_or(0.0))
        .fold(0.0, f64::max)
        * 1.1;
    let n = rows.len();
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "evidence check, CPU µs per check (median, whisker min-max)",
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(30)
        .y_label_area_size(380)
        .build_cartesian_2d(0.0..max.max(1.0), -0.5..n as f64 - 0.5)?;
    // Row i at height n - 1 - i: top to bottom in the order of the rows.
    let at = |y: f64| {
        (y.round() >= 0.0 && (y - y.round()).abs() < 0.01).then(|| n - 1 - y.round() as usize)
    };
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(n)
        .y_label_formatter(&|y| match at(*y) {
            Some(i) if i < n => rows[i]["check"].as_str().unwrap_or("").to_string(),
            _ => String::new(),
        })
        .draw()?;
    for (i, r) in rows.iter().enumerate() {
        let (y, s) = ((n - 1 - i) as f64, &r["cpu_us"]);
        let bar = [(0.0, y - 0.35), (med(s), y + 0.35)];
        chart.draw_series([Rectangle::new(bar, BLUE.mix(0.5).filled())])?;
        let (lo, hi) = (
            s["min"].as_f64().unwrap_or(0.0),
            s["max"].as_f64().unwrap_or(0.0),
        );
        chart.draw_series([PathElement::new(
            vec![(lo, y), (hi, y)],
            BLACK.stroke_width(2),
        )])?;
    }
    root.present()?;
    Ok(())
}
