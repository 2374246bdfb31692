//! Evidence arrives from the network: garbage, truncation and mutation give errors, never panics.

use std::sync::Arc;

use mbx_attest::evidence::{MAGIC, VERSION};
use mbx_attest::sim::{measure, signer_id};
use mbx_attest::{
    report_data, verify_bytes, Attester, DcapEvidence, Evidence, HexBytes, Policy,
    SimulatedAttester, SimulatedPlatform, TcbStatus,
};
use proptest::prelude::*;

/// Accepts as much as a policy can, so that only decoding and cryptography stand in the way.
fn lenient(platform_key: [u8; 32], measurement: [u8; 32]) -> Policy {
    Policy {
        allow_simulated: true,
        allow_debug: true,
        measurements: vec![HexBytes::from(measurement)],
        sim_platform_keys: vec![HexBytes::from(platform_key)],
        accepted_tcb_statuses: TcbStatus::ALL.to_vec(),
        ..Policy::default()
    }
}

struct Setup {
    good: Vec<u8>,
    rd: [u8; 64],
    policy: Policy,
}

fn setup() -> Setup {
    let platform = Arc::new(SimulatedPlatform::from_seed(&[3; 32]).unwrap());
    let m = measure("p", b"c");
    let rd = report_data(b"spki", &[1; 32]);
    let good = SimulatedAttester::new(platform.clone(), m, signer_id("s"))
        .evidence(&rd)
        .unwrap()
        .to_bytes();
    Setup {
        good,
        rd,
        policy: lenient(platform.public_key(), m),
    }
}

fn header(kind: u8) -> Vec<u8> {
    let mut v = MAGIC.to_vec();
    v.extend_from_slice(&[VERSION, kind]);
    v
}

#[test]
fn every_truncation_of_valid_evidence_is_an_error() {
    let s = setup();
    assert!(verify_bytes(&s.good, &s.rd, &s.policy, 0).is_ok());
    for len in 0..s.good.len() {
        assert!(Evidence::from_bytes(&s.good[..len]).is_err(), "len {len}");
    }
}

proptest! {
    #[test]
    fn garbage_is_an_error_not_a_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        let s = setup();
        prop_assert!(verify_bytes(&bytes, &s.rd, &s.policy, 0).is_err());
    }

    #[test]
    fn garbage_after_a_valid_header_is_an_error(
        kind in 0u8..4,
        body in proptest::collection::vec(any::<u8>(), 0..400),
    ) {
        let s = setup();
        let mut b = header(kind);
        b.extend_from_slice(&body);
        prop_assert!(verify_bytes(&b, &s.rd, &s.policy, 0).is_err());
    }

    #[test]
    fn mutated_simulated_evidence_is_rejected(
        edits in proptest::collection::vec((any::<prop::sample::Index>(), 1u8..=255), 1..4),
    ) {
        let s = setup();
        let mut b = s.good.clone();
        for (i, x) in edits {
            b[i.index(s.good.len())] ^= x;
        }
        prop_assert!(verify_bytes(&b, &s.rd, &s.policy, 0).is_err());
    }

    #[test]
    fn truncated_simulated_evidence_is_rejected(cut in 0usize..229) {
        let s = setup();
        prop_assert!(verify_bytes(&s.good[..cut.min(s.good.len() - 1)], &s.rd, &s.policy, 0).is_err());
    }

    #[test]
    fn garbage_dcap_quote_and_collateral_are_errors(
        quote in proptest::collection::vec(any::<u8>(), 0..2000),
        collateral in proptest::collection::vec(any::<u8>(), 0..200),
    ) {
        let s = setup();
        let ev = Evidence::Dcap(DcapEvidence::new(quote, collateral).unwrap());
        prop_assert!(verify_bytes(&ev.to_bytes(), &s.rd, &s.policy, 0).is_err());
    }
}
