//! Attestation evidence from arbitrary bytes: decoding never panics and what decodes encodes back
//! to the same bytes; checking it (simulated, or DCAP through the process-wide verifier, which
//! remembers platforms from one input to the next) never panics and never accepts. Seed the
//! corpus with encoded DCAP evidence of Intel's sample quotes (fuzz/README.md) to reach past the
//! parsers.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mbx_attest::{verify, Evidence, HexBytes, Policy, TcbStatus};

/// A time inside Intel's sample collateral (2025), so that expiry is not the only answer.
const NOW: u64 = 1_740_000_000;

fuzz_target!(|data: &[u8]| {
    let Ok(ev) = Evidence::from_bytes(data) else {
        return;
    };
    assert_eq!(ev.to_bytes(), data, "decoding is exact");
    // As lenient as a policy gets; only the cryptography and the binding stand in the way.
    let policy = Policy {
        allow_simulated: true,
        allow_debug: true,
        measurements: vec![HexBytes::from([0u8; 32]), HexBytes::from([0u8; 48])],
        sim_platform_keys: vec![HexBytes::from([1u8; 32])],
        accepted_tcb_statuses: vec![TcbStatus::UpToDate, TcbStatus::OutOfDate],
        ..Policy::default()
    };
    let r = verify(&ev, &[0x5a; 64], &policy, NOW);
    assert!(r.is_err(), "accepted {ev:?}");
});
