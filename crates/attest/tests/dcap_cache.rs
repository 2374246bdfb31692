//! A platform verified in full has its later quotes checked by their own signature alone
//! (`mbx_attest::dcap_cache`), and by nothing less: every test here fails if that signature check,
//! the template comparison or the time window is taken out.
//!
//! The Intel samples stand in for a platform: a changed report_data plays "the next session's
//! quote", which the real platform would sign and we cannot (so it must be refused).

mod common;

use dcap_qvl::quote::{Quote, Report};
use mbx_attest::{
    AttestError, Collateral, DcapCounts, DcapEvidence, DcapVerifier, HexBytes, Policy,
};
use parity_scale_codec::Encode;

use common::{platforms, Platform};

const WINDOW: u64 = 600;

/// What the tests do with a platform (`common::Platform` is this crate's type).
impl Platform {
    fn check(
        &self,
        v: &DcapVerifier,
        quote: &[u8],
        report_data: &[u8; 64],
        at: u64,
    ) -> Result<(), AttestError> {
        v.verify_quote(quote, &self.collateral, report_data, &self.policy, at)
            .map(drop)
    }

    /// The platform checked once in full, so that `v` remembers it.
    fn remembered(&self) -> DcapVerifier {
        let v = DcapVerifier::new(4, WINDOW);
        self.check(&v, &self.quote, &self.report_data, self.now)
            .expect("sample accepted");
        assert_eq!(v.counts(), counts(1, 0), "checked once in full");
        v
    }

    /// The quote with another report_data, its signature (and any padding) left as it was.
    fn with_report_data(&self, report_data: [u8; 64]) -> Vec<u8> {
        let mut q = Quote::parse(&self.quote).expect("parses");
        let padding = &self.quote[q.encode().len()..];
        match &mut q.report {
            Report::SgxEnclave(r) => r.report_data = report_data,
            Report::TD10(r) => r.report_data = report_data,
            _ => unreachable!(),
        }
        [q.encode().as_slice(), padding].concat()
    }
}

fn counts(full: u64, signature_only: u64) -> DcapCounts {
    DcapCounts {
        full,
        signature_only,
    }
}

#[test]
fn the_samples_are_in_their_canonical_encoding() {
    // Otherwise nothing below would reach the remembered path. The TDX sample is padded with
    // zeros after the quote, as TDX quotes often are.
    for p in platforms() {
        let encoded = Quote::parse(&p.quote).expect("parses").encode();
        assert!(p.quote.starts_with(&encoded));
        assert!(p.quote[encoded.len()..].iter().all(|&b| b == 0));
    }
}

#[test]
fn a_second_quote_of_a_verified_platform_is_checked_by_its_signature_alone() {
    for p in platforms() {
        let v = p.remembered();
        for later in [p.now, p.now + 1, p.now + WINDOW] {
            p.check(&v, &p.quote, &p.report_data, later)
                .expect("accepted again");
        }
        assert_eq!(v.counts(), counts(1, 3));
    }
}

/// `quote`, expected to carry `report_data`, is refused by the signature check on the remembered
/// path: no full check runs.
fn refused_by_its_signature(p: &Platform, quote: &[u8], report_data: &[u8; 64]) {
    let v = p.remembered();
    let r = p.check(&v, quote, report_data, p.now + 1);
    assert!(
        matches!(&r, Err(AttestError::Dcap(m)) if m.contains("signature")),
        "{r:?}"
    );
    assert_eq!(v.counts(), counts(1, 0));
}

#[test]
fn a_quote_whose_report_data_changed_is_refused_by_its_signature() {
    for p in platforms() {
        let mut other = p.report_data;
        other[7] ^= 0x20;
        refused_by_its_signature(&p, &p.with_report_data(other), &other);
    }
}

#[test]
fn a_changed_signature_is_refused() {
    for p in platforms() {
        let signed = Quote::parse(&p.quote).expect("parses").signed_length();
        // The signature is the first field of the authentication data, after its u32 length.
        let mut tampered = p.quote.clone();
        tampered[signed + 4 + 10] ^= 0x01;
        refused_by_its_signature(&p, &tampered, &p.report_data);
    }
}

#[test]
fn any_other_change_to_the_quote_is_checked_in_full() {
    for p in platforms() {
        let v = p.remembered();
        // A byte of the header (its version field stays), of the body, of the QE report:
        // refused by the full check.
        let signed = Quote::parse(&p.quote).expect("parses").signed_length();
        for pos in [10, 100, signed + 4 + 64 + 64 + 20] {
            let mut tampered = p.quote.clone();
            tampered[pos] ^= 0x01;
            let r = p.check(&v, &tampered, &p.report_data, p.now + 1);
            assert!(r.is_err(), "byte {pos}: {r:?}");
        }
        // The last byte (the end of the PCK chain's PEM; the TDX sample's padding, which
        // dcap-qvl ignores): whatever the full check says, it ran.
        let mut tampered = p.quote.clone();
        *tampered.last_mut().expect("bytes") ^= 0x01;
        let _ = p.check(&v, &tampered, &p.report_data, p.now + 1);
        let c = v.counts();
        assert_eq!(c.signature_only, 0);
        // One check to remember it, four refused in full.
        assert_eq!(c.full, 5, "{c:?}");
    }
}

#[test]
fn other_collateral_is_another_platform() {
    for p in platforms() {
        let v = p.remembered();
        // The same collateral with one more space: other bytes, checked in full, then remembered.
        let mut collateral = p.collateral.clone();
        collateral.push(b' ');
        let run = || v.verify_quote(&p.quote, &collateral, &p.report_data, &p.policy, p.now + 1);
        run().expect("still valid collateral");
        assert_eq!(v.counts(), counts(2, 0));
        run().expect("accepted again");
        assert_eq!(v.counts(), counts(2, 1));
    }
}

#[test]
fn outside_its_window_a_platform_is_checked_in_full() {
    for p in platforms() {
        let v = p.remembered();
        // Before the full check (a clock set back) and after the window.
        p.check(&v, &p.quote, &p.report_data, p.now - 1)
            .expect("still valid");
        assert_eq!(v.counts().signature_only, 0);
        let after = p.now + WINDOW + 1;
        if after <= p.not_after {
            p.check(&v, &p.quote, &p.report_data, after)
                .expect("still valid");
            assert_eq!(v.counts().signature_only, 0);
        }
        // Expired: refused however recently the platform was seen.
        let r = p.check(&v, &p.quote, &p.report_data, p.not_after + 1);
        assert!(matches!(&r, Err(AttestError::Dcap(_))), "{r:?}");
    }
}

#[test]
fn a_platform_is_remembered_until_its_collateral_expires_and_no_longer() {
    for p in platforms() {
        // A window longer than the collateral lives: the collateral's expiry bounds it.
        let v = DcapVerifier::new(4, u64::MAX);
        p.check(&v, &p.quote, &p.report_data, p.now)
            .expect("valid now");
        p.check(&v, &p.quote, &p.report_data, p.not_after)
            .expect("valid to the last second");
        assert_eq!(v.counts(), counts(1, 1));
        let r = p.check(&v, &p.quote, &p.report_data, p.not_after + 1);
        assert!(matches!(&r, Err(AttestError::Dcap(_))), "{r:?}");
        assert_eq!(v.counts(), counts(2, 1));
    }
}

#[test]
fn the_binding_and_the_policy_still_apply_to_a_remembered_platform() {
    for p in platforms() {
        let v = p.remembered();
        let mut other = p.report_data;
        other[0] ^= 1;
        let r = p.check(&v, &p.quote, &other, p.now + 1);
        assert!(matches!(r, Err(AttestError::ReportDataMismatch)), "{r:?}");

        let strict = Policy {
            measurements: vec![HexBytes::from([0u8; 32])],
            ..p.policy.clone()
        };
        let r = v.verify_quote(&p.quote, &p.collateral, &p.report_data, &strict, p.now + 1);
        assert!(
            matches!(r, Err(AttestError::MeasurementNotAllowed(_))),
            "{r:?}"
        );
        assert_eq!(v.counts(), counts(1, 2));
    }
}

#[test]
fn a_verifier_remembers_no_more_platforms_than_its_capacity() {
    let [sgx, tdx] = platforms();
    let v = DcapVerifier::new(1, WINDOW);
    for p in [&sgx, &tdx, &sgx] {
        p.check(&v, &p.quote, &p.report_data, p.now)
            .expect("accepted");
    }
    // Each one pushed the other out.
    assert_eq!(v.counts(), counts(3, 0));
    // None: a full check each time.
    let v = DcapVerifier::new(0, WINDOW);
    for _ in 0..2 {
        sgx.check(&v, &sgx.quote, &sgx.report_data, sgx.now)
            .expect("accepted");
    }
    assert_eq!(v.counts(), counts(2, 0));
}

mod untrusted {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, .. ProptestConfig::default() })]

        /// Any bit flipped in the signed part of a remembered platform's quote is refused, its
        /// report_data expected as flipped (so only the checks themselves can refuse it).
        #[test]
        fn a_remembered_platform_accepts_no_flipped_bit(which in 0usize..2, at in any::<prop::sample::Index>(), bit in 0u8..8) {
            let p = &platforms()[which];
            let v = p.remembered();
            let signed = Quote::parse(&p.quote).expect("parses").signed_length();
            let mut tampered = p.quote.clone();
            tampered[at.index(signed)] ^= 1 << bit;
            let expected = Quote::parse(&tampered).ok().map(|q| match q.report {
                Report::SgxEnclave(r) => r.report_data,
                Report::TD10(r) => r.report_data,
                _ => [0; 64],
            });
            if let Some(rd) = expected {
                let r = p.check(&v, &tampered, &rd, p.now + 1);
                prop_assert!(r.is_err(), "{r:?}");
                prop_assert_eq!(v.counts().signature_only, 0);
            }
        }
    }
}

/// The platform's evidence with its collateral compressed (evidence kind 3) at `level`.
fn deflated(p: &Platform, level: u8) -> DcapEvidence {
    let z = miniz_oxide::deflate::compress_to_vec(&p.collateral, level);
    DcapEvidence::with_collateral(p.quote.clone(), Collateral::Deflated(z)).expect("evidence")
}

#[test]
fn compressed_collateral_is_checked_and_remembered_by_the_bytes_that_travelled() {
    for p in platforms() {
        let v = DcapVerifier::new(4, WINDOW);
        let ev = deflated(&p, 6);
        // Intel's collateral compresses to under a third.
        assert!(3 * ev.collateral().wire_bytes().len() < p.collateral.len());
        let check =
            |ev: &DcapEvidence, rd: &[u8; 64]| v.verify_evidence(ev, rd, &p.policy, p.now + 1);
        let claims = check(&ev, &p.report_data).expect("accepted compressed");
        assert_eq!(v.counts(), counts(1, 0));
        check(&ev, &p.report_data).expect("accepted again");
        assert_eq!(v.counts(), counts(1, 1));
        // The same JSON uncompressed, or compressed otherwise, is another template.
        let plain = v.verify_quote(
            &p.quote,
            &p.collateral,
            &p.report_data,
            &p.policy,
            p.now + 1,
        );
        assert_eq!(plain.expect("accepted"), claims);
        assert_eq!(v.counts(), counts(2, 1));
        check(&deflated(&p, 1), &p.report_data).expect("accepted");
        assert_eq!(v.counts(), counts(3, 1));
        // Another report_data on the remembered compressed template: the signature refuses it.
        let mut other = p.report_data;
        other[3] ^= 1;
        let tampered =
            DcapEvidence::with_collateral(p.with_report_data(other), ev.collateral().clone())
                .expect("evidence");
        let r = check(&tampered, &other);
        assert!(
            matches!(&r, Err(AttestError::Dcap(m)) if m.contains("signature")),
            "{r:?}"
        );
        assert_eq!(v.counts(), counts(3, 1));
        // A damaged stream: checked in full (another template), and refused.
        let mut z = ev.collateral().wire_bytes().to_vec();
        let mid = z.len() / 2;
        z[mid] ^= 0x55;
        let damaged =
            DcapEvidence::with_collateral(p.quote.clone(), Collateral::Deflated(z)).expect("ok");
        assert!(check(&damaged, &p.report_data).is_err());
        assert_eq!(v.counts().signature_only, 1);
    }
}

#[test]
fn a_minimum_tcb_evaluation_refuses_older_collateral_on_either_path() {
    for p in platforms() {
        let v = DcapVerifier::new(4, WINDOW);
        let claims = v
            .verify_quote(&p.quote, &p.collateral, &p.report_data, &p.policy, p.now)
            .expect("accepted");
        let number = claims
            .tcb_evaluation_data_number
            .expect("DCAP claims carry it");
        assert!(claims
            .to_string()
            .contains(&format!("tcb_evaluation={number}")));
        for (min, accepted) in [(number, true), (number + 1, false)] {
            let policy = Policy {
                min_tcb_evaluation_data_number: min,
                ..p.policy.clone()
            };
            // Remembered now: the policy still sees the number.
            let r = v.verify_quote(&p.quote, &p.collateral, &p.report_data, &policy, p.now);
            assert_eq!(r.is_ok(), accepted, "{r:?}");
            if !accepted {
                assert!(
                    matches!(r, Err(AttestError::TcbEvaluationTooOld { number: n, min: m }) if n == number && m == min)
                );
            }
        }
        assert_eq!(v.counts(), counts(1, 2));
        // And on a full check.
        let policy = Policy {
            min_tcb_evaluation_data_number: number + 1,
            ..p.policy.clone()
        };
        let r =
            mbx_attest::verify_dcap_quote(&p.quote, &p.collateral, &p.report_data, &policy, p.now);
        assert!(
            matches!(r, Err(AttestError::TcbEvaluationTooOld { .. })),
            "{r:?}"
        );
    }
}
