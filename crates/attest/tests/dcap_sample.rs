//! Real Intel DCAP sample quotes (shipped in the `dcap-qvl` package) through our verifier.
//!
//! The samples' report_data is not one of our bindings, so binding is checked by passing the sample's
//! own report_data as expected (accepted) and any other value (rejected).

mod common;

use dcap_qvl::quote::{Quote, Report};
use mbx_attest::{
    quote_measurement_unverified, quote_report_data_unverified, verify, verify_bytes,
    verify_dcap_quote, AttestError, Collateral, DcapEvidence, Evidence, EvidenceKind, HexBytes,
    Policy, TcbStatus, TeeKind,
};
use sha2::{Digest, Sha384};

struct SgxFacts {
    mr_enclave: [u8; 32],
    mr_signer: [u8; 32],
    isv_svn: u16,
    debug: bool,
    report_data: [u8; 64],
}

fn sgx_facts(quote: &[u8]) -> SgxFacts {
    let q = Quote::parse(quote).expect("sample parses");
    let Report::SgxEnclave(r) = q.report else {
        panic!("SGX sample is not an SGX quote")
    };
    SgxFacts {
        mr_enclave: r.mr_enclave,
        mr_signer: r.mr_signer,
        isv_svn: r.isv_svn,
        debug: r.attributes[0] & 0x02 != 0,
        report_data: r.report_data,
    }
}

/// Accepts exactly the SGX sample: its measurement and signer, its SVN, its TCB status.
fn sgx_policy(f: &SgxFacts) -> Policy {
    Policy {
        measurements: vec![HexBytes::from(f.mr_enclave)],
        signers: vec![HexBytes::from(f.mr_signer)],
        min_svn: f.isv_svn,
        allow_debug: f.debug,
        accepted_tcb_statuses: vec![
            TcbStatus::UpToDate,
            TcbStatus::ConfigurationAndSWHardeningNeeded,
        ],
        ..Policy::default()
    }
}

fn valid_now(s: &common::Sample) -> u64 {
    let w = common::validity_window(s);
    w.not_before + (w.not_after - w.not_before) / 2
}

#[test]
fn sgx_sample_accepted_at_a_valid_time() {
    let s = common::sgx();
    let f = sgx_facts(&s.quote);
    let now = valid_now(&s);
    let claims = verify_dcap_quote(
        &s.quote,
        &s.collateral_json,
        &f.report_data,
        &sgx_policy(&f),
        now,
    )
    .expect("sample accepted");
    assert_eq!(claims.tee, TeeKind::Sgx);
    assert_eq!(claims.measurement, f.mr_enclave);
    assert_eq!(claims.signer, f.mr_signer);
    assert_eq!(claims.svn, f.isv_svn);
    assert_eq!(claims.debug, f.debug);
    assert_eq!(
        claims.tcb_status,
        Some(TcbStatus::ConfigurationAndSWHardeningNeeded)
    );
    assert!(claims.to_string().starts_with("tee=sgx measurement="));
    // The claims say until when the collateral holds: to that second, and not one more.
    let last = claims
        .collateral_valid_until
        .expect("DCAP claims carry their collateral's end");
    assert!(claims.platform_key.is_none());
    let at = |t| {
        verify_dcap_quote(
            &s.quote,
            &s.collateral_json,
            &f.report_data,
            &sgx_policy(&f),
            t,
        )
    };
    assert!(last >= now && at(last).is_ok());
    assert!(at(last + 1).is_err());

    // A policy that bounds the collateral's age: accepted up to the bound, refused a second
    // after it, also when the claims are used again for a resumed session.
    let issued = claims
        .collateral_issued_at
        .expect("DCAP claims carry when their collateral was issued");
    assert!(issued <= now, "{issued} {now}");
    let bounded = |max| Policy {
        max_collateral_age: max,
        ..sgx_policy(&f)
    };
    let age = now - issued;
    let at_age = |max| {
        verify_dcap_quote(
            &s.quote,
            &s.collateral_json,
            &f.report_data,
            &bounded(max),
            now,
        )
    };
    assert!(at_age(age).is_ok());
    assert!(
        matches!(at_age(age - 1), Err(AttestError::CollateralTooOld { max, .. }) if max == age - 1),
        "{:?}",
        at_age(age - 1)
    );
    assert!(mbx_attest::recheck_claims(&claims, now, now, &bounded(age)).is_ok());
    assert!(matches!(
        mbx_attest::recheck_claims(&claims, now, now + 1, &bounded(age)),
        Err(AttestError::CollateralTooOld { .. })
    ));

    // The same through the evidence encoding and the dispatching entry point.
    let ev = Evidence::Dcap(DcapEvidence::new(s.quote.clone(), s.collateral_json.clone()).unwrap());
    assert_eq!(
        verify_bytes(&ev.to_bytes(), &f.report_data, &sgx_policy(&f), now).unwrap(),
        claims
    );
    // And with the collateral compressed (evidence kind 3), as a Gramine middlebox sends it.
    let z = Collateral::deflate(&s.collateral_json).unwrap();
    let ev = Evidence::Dcap(DcapEvidence::with_collateral(s.quote.clone(), z).unwrap());
    assert_eq!(ev.kind(), EvidenceKind::DcapDeflated);
    assert_eq!(
        verify_bytes(&ev.to_bytes(), &f.report_data, &sgx_policy(&f), now).unwrap(),
        claims
    );
    assert_eq!(
        quote_report_data_unverified(&s.quote).unwrap(),
        f.report_data
    );
    assert_eq!(
        quote_measurement_unverified(&s.quote).unwrap(),
        f.mr_enclave
    );
}

#[test]
fn sgx_sample_rejected_when_expired() {
    let s = common::sgx();
    let f = sgx_facts(&s.quote);
    let ev = Evidence::Dcap(DcapEvidence::new(s.quote.clone(), s.collateral_json.clone()).unwrap());
    let w = common::validity_window(&s);
    // After the TCB info / QE identity nextUpdate, and after the end of the whole window.
    for now in [w.json_next_update + 1, w.not_after + 1] {
        let r = verify(&ev, &f.report_data, &sgx_policy(&f), now);
        assert!(
            matches!(&r, Err(AttestError::Dcap(m)) if m.contains("expired")),
            "now={now}: {r:?}"
        );
    }
    // Before the collateral was issued.
    let r = verify(&ev, &f.report_data, &sgx_policy(&f), w.not_before - 1);
    assert!(matches!(r, Err(AttestError::Dcap(_))), "{r:?}");
}

#[test]
fn sgx_sample_rejected_when_one_bit_is_flipped() {
    let s = common::sgx();
    let f = sgx_facts(&s.quote);
    let now = valid_now(&s);

    // Flip a bit of report_data inside the signed report and *expect the flipped value*: only the
    // quote signature can catch this.
    let pos = s
        .quote
        .windows(64)
        .position(|w| w == f.report_data)
        .expect("report_data is in the quote");
    let mut tampered = s.quote.clone();
    tampered[pos] ^= 0x01;
    let mut flipped_rd = f.report_data;
    flipped_rd[0] ^= 0x01;
    let r = verify_dcap_quote(
        &tampered,
        &s.collateral_json,
        &flipped_rd,
        &sgx_policy(&f),
        now,
    );
    assert!(
        matches!(&r, Err(AttestError::Dcap(m)) if m.contains("signature")),
        "{r:?}"
    );

    // Flip MRENCLAVE and let the policy accept the flipped value: again only the signature catches it.
    let pos = s
        .quote
        .windows(32)
        .position(|w| w == f.mr_enclave)
        .expect("mr_enclave is in the quote");
    let mut tampered = s.quote.clone();
    tampered[pos + 31] ^= 0x80;
    let mut policy = sgx_policy(&f);
    let mut flipped_m = f.mr_enclave;
    flipped_m[31] ^= 0x80;
    policy.measurements.push(HexBytes::from(flipped_m));
    let r = verify_dcap_quote(&tampered, &s.collateral_json, &f.report_data, &policy, now);
    assert!(
        matches!(&r, Err(AttestError::Dcap(m)) if m.contains("signature")),
        "{r:?}"
    );

    // A spread of single-bit flips over the header, report and signature area.
    for pos in (0..s.quote.len().min(1100)).step_by(37) {
        let mut tampered = s.quote.clone();
        tampered[pos] ^= 0x04;
        let r = verify_dcap_quote(&tampered, &s.collateral_json, &f.report_data, &policy, now);
        assert!(r.is_err(), "bit flip at byte {pos} accepted");
    }
}

#[test]
fn sgx_sample_rejected_with_wrong_measurement() {
    let s = common::sgx();
    let f = sgx_facts(&s.quote);
    let mut policy = sgx_policy(&f);
    let mut other = f.mr_enclave;
    other[0] ^= 0xff;
    policy.measurements = vec![HexBytes::from(other)];
    let r = verify_dcap_quote(
        &s.quote,
        &s.collateral_json,
        &f.report_data,
        &policy,
        valid_now(&s),
    );
    assert!(
        matches!(r, Err(AttestError::MeasurementNotAllowed(_))),
        "{r:?}"
    );
}

#[test]
fn sgx_sample_rejected_when_report_data_does_not_match() {
    let s = common::sgx();
    let f = sgx_facts(&s.quote);
    let mut expected = f.report_data;
    expected[63] ^= 0x01;
    let r = verify_dcap_quote(
        &s.quote,
        &s.collateral_json,
        &expected,
        &sgx_policy(&f),
        valid_now(&s),
    );
    assert!(matches!(r, Err(AttestError::ReportDataMismatch)), "{r:?}");
    // An ordinary session binding is of course not the sample's report_data either.
    let binding = mbx_attest::report_data(b"spki", &[0u8; 32]);
    let r = verify_dcap_quote(
        &s.quote,
        &s.collateral_json,
        &binding,
        &sgx_policy(&f),
        valid_now(&s),
    );
    assert!(matches!(r, Err(AttestError::ReportDataMismatch)), "{r:?}");
}

#[test]
fn sgx_sample_rejected_by_signer_svn_and_tcb_rules() {
    let s = common::sgx();
    let f = sgx_facts(&s.quote);
    let now = valid_now(&s);
    let run = |p: &Policy| verify_dcap_quote(&s.quote, &s.collateral_json, &f.report_data, p, now);

    let mut p = sgx_policy(&f);
    let mut other = f.mr_signer;
    other[5] ^= 1;
    p.signers = vec![HexBytes::from(other)];
    assert!(matches!(run(&p), Err(AttestError::SignerNotAllowed(_))));

    let mut p = sgx_policy(&f);
    p.min_svn = f.isv_svn + 1;
    assert!(matches!(run(&p), Err(AttestError::SvnTooLow { .. })));

    // The default TCB list (UpToDate only) refuses this platform's status.
    let mut p = sgx_policy(&f);
    p.accepted_tcb_statuses = Policy::default().accepted_tcb_statuses;
    assert!(matches!(
        run(&p),
        Err(AttestError::TcbStatusNotAllowed(
            TcbStatus::ConfigurationAndSWHardeningNeeded
        ))
    ));
}

#[test]
fn sgx_sample_with_broken_collateral_is_rejected() {
    let s = common::sgx();
    let f = sgx_facts(&s.quote);
    let now = valid_now(&s);
    let r = verify_dcap_quote(&s.quote, b"{not json", &f.report_data, &sgx_policy(&f), now);
    assert!(matches!(r, Err(AttestError::Collateral(_))), "{r:?}");
    // Collateral of another platform (the TDX sample's) does not verify the SGX quote.
    let other = common::tdx();
    let r = verify_dcap_quote(
        &s.quote,
        &other.collateral_json,
        &f.report_data,
        &sgx_policy(&f),
        now,
    );
    assert!(r.is_err(), "{r:?}");
}

#[test]
fn tdx_sample_accepted_and_mapped() {
    let s = common::tdx();
    let q = Quote::parse(&s.quote).expect("TDX sample parses");
    let td = q.report.as_td10().expect("TDX report");
    let now = valid_now(&s);
    // The measurement pins MRTD, the host-set identities and the RTMRs, restated here.
    let mut h = Sha384::new();
    h.update(b"mbx tdx measurement v1\0");
    for field in [
        td.mr_td,
        td.mr_config_id,
        td.mr_owner,
        td.mr_owner_config,
        td.rt_mr0,
        td.rt_mr1,
        td.rt_mr2,
        td.rt_mr3,
    ] {
        h.update(field);
    }
    let measurement: [u8; 48] = h.finalize().into();
    // MRTD alone, which measures only the TD's firmware, is not a measurement the TD meets.
    let firmware_only = Policy {
        measurements: vec![HexBytes::from(td.mr_td)],
        allow_debug: true,
        accepted_tcb_statuses: TcbStatus::ALL.to_vec(),
        ..Policy::default()
    };
    let r = verify_dcap_quote(
        &s.quote,
        &s.collateral_json,
        &td.report_data,
        &firmware_only,
        now,
    );
    assert!(
        matches!(r, Err(AttestError::MeasurementNotAllowed(_))),
        "{r:?}"
    );
    let mut policy = Policy {
        measurements: vec![HexBytes::from(measurement)],
        allow_debug: td.td_attributes[0] != 0,
        accepted_tcb_statuses: vec![TcbStatus::UpToDate],
        ..Policy::default()
    };
    let first = verify_dcap_quote(&s.quote, &s.collateral_json, &td.report_data, &policy, now);
    // Accept whatever status this sample has, but only after seeing that the rule refused it
    // unless it already is UpToDate.
    let claims = match first {
        Ok(c) => c,
        Err(AttestError::TcbStatusNotAllowed(status)) => {
            policy.accepted_tcb_statuses.push(status);
            verify_dcap_quote(&s.quote, &s.collateral_json, &td.report_data, &policy, now)
                .expect("TDX sample accepted")
        }
        Err(e) => panic!("TDX sample rejected: {e}"),
    };
    assert_eq!(claims.tee, TeeKind::Tdx);
    assert_eq!(claims.measurement.len(), 48);
    assert_eq!(claims.measurement, measurement);
    assert_eq!(quote_measurement_unverified(&s.quote).unwrap(), measurement);
    assert!(claims.signer.is_empty());

    // TDX has no signer: a policy that requires one refuses it.
    policy.signers = vec![HexBytes::from([0u8; 32])];
    let r = verify_dcap_quote(&s.quote, &s.collateral_json, &td.report_data, &policy, now);
    assert!(matches!(r, Err(AttestError::SignerNotAllowed(_))), "{r:?}");
}

mod untrusted {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// A real quote cut anywhere is an error, never a panic.
        #[test]
        fn truncated_sample_quote_is_an_error(cut in 0usize..4600) {
            let s = common::sgx();
            let f = sgx_facts(&s.quote);
            let cut = cut.min(s.quote.len() - 1);
            let r = verify_dcap_quote(&s.quote[..cut], &s.collateral_json, &f.report_data,
                &sgx_policy(&f), valid_now(&s));
            prop_assert!(r.is_err());
        }

        /// Random byte edits in the signed part of a real quote (header, report, signature,
        /// attestation key, QE report and its signature: the first 1012 bytes) are rejected.
        #[test]
        fn mutated_signed_part_of_sample_is_rejected(
            edits in proptest::collection::vec((0usize..1012, 1u8..=255), 1..3),
        ) {
            let s = common::sgx();
            let f = sgx_facts(&s.quote);
            let mut quote = s.quote.clone();
            for (i, x) in edits {
                quote[i] ^= x;
            }
            let r = verify_dcap_quote(&quote, &s.collateral_json, &f.report_data,
                &sgx_policy(&f), valid_now(&s));
            prop_assert!(r.is_err());
        }

        /// Edits anywhere in the quote or the collateral never panic. (Some are accepted, rightly:
        /// PEM line breaks, the chain's copy of the root CA that is replaced by Intel's pinned
        /// root, and collateral fields unused for quotes that embed their PCK chain.)
        #[test]
        fn mutated_sample_never_panics(
            in_quote in any::<bool>(),
            edits in proptest::collection::vec((any::<prop::sample::Index>(), 1u8..=255), 1..3),
        ) {
            let s = common::sgx();
            let f = sgx_facts(&s.quote);
            let (mut quote, mut coll) = (s.quote.clone(), s.collateral_json.clone());
            let target = if in_quote { &mut quote } else { &mut coll };
            let len = target.len();
            for (i, x) in edits {
                target[i.index(len)] ^= x;
            }
            let _ = verify_dcap_quote(&quote, &coll, &f.report_data, &sgx_policy(&f), valid_now(&s));
        }
    }
}
