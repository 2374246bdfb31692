//! Locating and reading the DCAP sample quotes shipped inside the `dcap-qvl` crate package.
//!
//! The samples are not copied into this repository: the package directory is found through
//! `cargo metadata` at test time.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;

use dcap_qvl::QuoteCollateralV3;

fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string())
}

fn host_triple() -> Option<String> {
    let out = Command::new("rustc").arg("-vV").output().ok()?;
    String::from_utf8(out.stdout)
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_string))
}

fn metadata() -> serde_json::Value {
    let run = |offline: bool| {
        let mut cmd = Command::new(cargo());
        cmd.args(["metadata", "--format-version", "1"])
            .current_dir(env!("CARGO_MANIFEST_DIR"));
        if offline {
            // Filtering to the host keeps cargo from needing other platforms' crates.
            cmd.arg("--offline");
            if let Some(host) = host_triple() {
                cmd.args(["--filter-platform", &host]);
            }
        }
        cmd.output().ok().filter(|o| o.status.success())
    };
    let out = run(true)
        .or_else(|| run(false))
        .expect("cargo metadata failed");
    serde_json::from_slice(&out.stdout).expect("cargo metadata output is JSON")
}

/// `<dcap-qvl package>/sample` (looked up once per test binary).
pub fn sample_dir() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(find_sample_dir).clone()
}

fn find_sample_dir() -> PathBuf {
    let meta = metadata();
    let manifest = meta["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .find(|p| p["name"] == "dcap-qvl")
        .and_then(|p| p["manifest_path"].as_str())
        .expect("dcap-qvl is a dependency");
    PathBuf::from(manifest)
        .parent()
        .expect("manifest has a parent")
        .join("sample")
}

/// A sample quote and its collateral JSON.
pub struct Sample {
    pub quote: Vec<u8>,
    pub collateral_json: Vec<u8>,
    pub collateral: QuoteCollateralV3,
}

pub fn load(quote_file: &str, collateral_file: &str) -> Sample {
    let dir = sample_dir();
    let quote = std::fs::read(dir.join(quote_file)).expect("sample quote");
    let collateral_json = std::fs::read(dir.join(collateral_file)).expect("sample collateral");
    let collateral = serde_json::from_slice(&collateral_json).expect("collateral parses");
    Sample {
        quote,
        collateral_json,
        collateral,
    }
}

pub fn sgx() -> Sample {
    load("sgx_quote", "sgx_quote_collateral.json")
}

pub fn tdx() -> Sample {
    load("tdx_quote", "tdx_quote_collateral.json")
}

/// Seconds since the epoch of an RFC 3339 UTC time `YYYY-MM-DDTHH:MM:SSZ` (Intel's format).
pub fn rfc3339_utc(s: &str) -> u64 {
    let n = |r: std::ops::Range<usize>| -> i64 { s[r].parse().expect("digits") };
    assert!(
        s.len() >= 20 && s.ends_with('Z'),
        "unexpected time format {s}"
    );
    let (y, m, d) = (n(0..4), n(5..7), n(8..10));
    let (hh, mm, ss) = (n(11..13), n(14..16), n(17..19));
    // Days from civil (proleptic Gregorian), H. Hinnant's algorithm.
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146097 + doe - 719468;
    u64::try_from(days * 86400 + hh * 3600 + mm * 60 + ss).expect("after 1970")
}

fn json_window(json: &str) -> (u64, u64) {
    let v: serde_json::Value = serde_json::from_str(json).expect("collateral JSON");
    // Either the signed body itself or the PCCS wrapper around it.
    let inner = v
        .get("tcbInfo")
        .or_else(|| v.get("enclaveIdentity"))
        .unwrap_or(&v);
    (
        rfc3339_utc(inner["issueDate"].as_str().expect("issueDate")),
        rfc3339_utc(inner["nextUpdate"].as_str().expect("nextUpdate")),
    )
}

fn pem_cert_windows(pem: &[u8]) -> Vec<(u64, u64)> {
    let start = match pem.windows(10).position(|w| w == b"-----BEGIN") {
        Some(p) => p,
        None => return Vec::new(),
    };
    x509_parser::pem::Pem::iter_from_buffer(&pem[start..])
        .map_while(Result::ok)
        .map(|p| {
            let cert = p.parse_x509().expect("certificate");
            let v = cert.validity();
            (
                v.not_before.timestamp() as u64,
                v.not_after.timestamp() as u64,
            )
        })
        .collect()
}

/// The interval in which every piece of the collateral (and the quote's PCK chain) is valid,
/// computed independently of `dcap-qvl`.
pub struct Window {
    pub not_before: u64,
    pub not_after: u64,
    /// The earliest `nextUpdate` of the TCB info and QE identity.
    pub json_next_update: u64,
}

pub fn validity_window(s: &Sample) -> Window {
    let c = &s.collateral;
    let mut lower = Vec::new();
    let mut upper = Vec::new();
    let mut json_next_update = u64::MAX;

    for (issue, next) in [json_window(&c.tcb_info), json_window(&c.qe_identity)] {
        lower.push(issue);
        upper.push(next);
        json_next_update = json_next_update.min(next);
    }
    for crl in [&c.root_ca_crl, &c.pck_crl] {
        let (_, crl) = x509_parser::parse_x509_crl(crl).expect("CRL");
        lower.push(crl.last_update().timestamp() as u64);
        if let Some(next) = crl.next_update() {
            upper.push(next.timestamp() as u64);
        }
    }
    let mut chains: Vec<&[u8]> = vec![
        c.pck_crl_issuer_chain.as_bytes(),
        c.tcb_info_issuer_chain.as_bytes(),
        c.qe_identity_issuer_chain.as_bytes(),
        &s.quote,
    ];
    if let Some(pck) = &c.pck_certificate_chain {
        chains.push(pck.as_bytes());
    }
    for chain in chains {
        for (nb, na) in pem_cert_windows(chain) {
            lower.push(nb);
            upper.push(na);
        }
    }
    let not_before = lower.into_iter().max().expect("some bounds");
    let not_after = upper.into_iter().min().expect("some bounds");
    assert!(
        not_before < not_after,
        "sample collateral has no validity window"
    );
    Window {
        not_before,
        not_after,
        json_next_update,
    }
}

/// A sample as "a platform": its bytes, the report_data it is bound to, a policy accepting exactly
/// its measurement whatever its TCB status, a time in the middle of its validity window.
pub struct Platform {
    pub quote: Vec<u8>,
    pub collateral: Vec<u8>,
    pub report_data: [u8; 64],
    pub policy: mbx_attest::Policy,
    pub now: u64,
    pub not_after: u64,
}

pub fn platform(s: Sample) -> Platform {
    use dcap_qvl::quote::{Quote, Report};
    use mbx_attest::{HexBytes, Policy, TcbStatus};
    let q = Quote::parse(&s.quote).expect("sample parses");
    let (report_data, measurement, debug) = match &q.report {
        Report::SgxEnclave(r) => (
            r.report_data,
            r.mr_enclave.to_vec(),
            r.attributes[0] & 2 != 0,
        ),
        Report::TD10(r) => (
            r.report_data,
            mbx_attest::quote_measurement_unverified(&s.quote).expect("TDX measurement"),
            r.td_attributes[0] != 0,
        ),
        other => panic!("unexpected sample body {other:?}"),
    };
    let w = validity_window(&s);
    let policy = Policy {
        measurements: vec![HexBytes(measurement)],
        allow_debug: debug,
        accepted_tcb_statuses: TcbStatus::ALL.to_vec(),
        ..Policy::default()
    };
    Platform {
        quote: s.quote,
        collateral: s.collateral_json,
        report_data,
        policy,
        now: w.not_before + (w.not_after - w.not_before) / 2,
        not_after: w.not_after,
    }
}

/// The SGX and the TDX sample as platforms.
pub fn platforms() -> [Platform; 2] {
    [platform(sgx()), platform(tdx())]
}
