//! The simulated backend end to end: attester → encoding → verifier, and every refusal.

use std::sync::Arc;

use mbx_attest::sim::{measure, signer_id};
use mbx_attest::{
    report_data, verify, verify_bytes, AttestError, Attester, DefaultVerifier, Evidence, HexBytes,
    Policy, SimulatedAttester, SimulatedPlatform, TeeKind, Verifier,
};

const SPKI: &[u8] = b"DER SubjectPublicKeyInfo of the middlebox TLS key";
const PROGRAM: &str = "mbx-mbox/header-insert@0.1.0";
const CONFIG: &[u8] = b"header = \"X-Mbx: 1\"";
const SIGNER: &str = "mbx test signer";
const NOW: u64 = 1_700_000_000;

struct Fixture {
    attester: SimulatedAttester,
    policy: Policy,
}

fn platform(seed: u8) -> Arc<SimulatedPlatform> {
    Arc::new(SimulatedPlatform::from_seed(&[seed; 32]).unwrap())
}

/// A middlebox with SVN 2, and a policy that accepts exactly it.
fn fixture() -> Fixture {
    let platform = platform(1);
    let mut attester = SimulatedAttester::new(
        platform.clone(),
        measure(PROGRAM, CONFIG),
        signer_id(SIGNER),
    );
    attester.svn = 2;
    let policy = Policy {
        allow_simulated: true,
        measurements: vec![HexBytes::from(measure(PROGRAM, CONFIG))],
        signers: vec![HexBytes::from(signer_id(SIGNER))],
        min_svn: 2,
        sim_platform_keys: vec![HexBytes::from(platform.public_key())],
        ..Policy::default()
    };
    Fixture { attester, policy }
}

/// The binder of "this handshake" (the secondary session's exporter value).
fn binding(exporter: u8) -> [u8; 64] {
    report_data(SPKI, &[exporter; 32])
}

fn evidence(a: &SimulatedAttester, exporter: u8) -> Evidence {
    a.evidence(&binding(exporter)).unwrap()
}

#[test]
fn accepted_when_everything_matches() {
    let f = fixture();
    let ev = evidence(&f.attester, 1);
    let claims = verify(&ev, &binding(1), &f.policy, NOW).unwrap();
    assert_eq!(claims.tee, TeeKind::Simulated);
    assert_eq!(claims.measurement, measure(PROGRAM, CONFIG));
    assert_eq!(claims.signer, signer_id(SIGNER));
    assert_eq!(claims.svn, 2);
    assert!(!claims.debug);
    assert_eq!(claims.tcb_status, None);
    // The platform that signed, for later uses of the claims; no collateral to expire.
    assert_eq!(
        claims.platform_key.as_deref(),
        Some(&platform(1).public_key()[..])
    );
    assert_eq!(claims.collateral_valid_until, None);
    // Same result over the wire encoding and through the trait object.
    assert_eq!(
        verify_bytes(&ev.to_bytes(), &binding(1), &f.policy, NOW).unwrap(),
        claims
    );
    let v: &dyn Verifier = &DefaultVerifier;
    assert_eq!(v.verify(&ev, &binding(1), &f.policy, NOW).unwrap(), claims);
}

#[test]
fn default_policy_rejects_simulated_evidence() {
    let f = fixture();
    let ev = evidence(&f.attester, 1);
    assert!(matches!(
        verify(&ev, &binding(1), &Policy::default(), NOW),
        Err(AttestError::SimulatedNotAllowed)
    ));
    // A policy that would accept everything else still refuses until allow_simulated is set.
    let mut p = f.policy.clone();
    p.allow_simulated = Policy::default().allow_simulated;
    assert!(matches!(
        verify(&ev, &binding(1), &p, NOW),
        Err(AttestError::SimulatedNotAllowed)
    ));
    p.allow_simulated = true;
    assert!(verify(&ev, &binding(1), &p, NOW).is_ok());
    // From TOML: the default stays false; the explicit setting turns it on.
    let toml = |extra: &str| {
        format!(
            "[attestation]\nmeasurements = [\"{}\"]\nsim_platform_keys = [\"{}\"]\n{extra}",
            hex::encode(measure(PROGRAM, CONFIG)),
            hex::encode(f.attester.platform.public_key()),
        )
    };
    let p = Policy::from_toml_str(&toml("")).unwrap();
    assert!(matches!(
        verify(&ev, &binding(1), &p, NOW),
        Err(AttestError::SimulatedNotAllowed)
    ));
    let p = Policy::from_toml_str(&toml("allow_simulated = true")).unwrap();
    assert!(verify(&ev, &binding(1), &p, NOW).is_ok());
}

#[test]
fn wrong_report_data_rejected() {
    let f = fixture();
    let ev = evidence(&f.attester, 1);
    // Evidence bound to another TLS key (e.g. a man in the middle's) for the same exporter.
    let other_key = report_data(b"another SPKI", &[1; 32]);
    assert!(matches!(
        verify(&ev, &other_key, &f.policy, NOW),
        Err(AttestError::ReportDataMismatch)
    ));
}

#[test]
fn evidence_replayed_from_an_earlier_handshake_rejected() {
    let f = fixture();
    // Handshake 1 had exporter value 1; the evidence is replayed into handshake 2 (exporter 2).
    let old = evidence(&f.attester, 1);
    assert!(verify(&old, &binding(1), &f.policy, NOW).is_ok());
    assert!(matches!(
        verify(&old, &binding(2), &f.policy, NOW),
        Err(AttestError::ReportDataMismatch)
    ));
}

#[test]
fn wrong_measurement_rejected() {
    let f = fixture();
    // Same program, other configuration: another measurement.
    let mut a = f.attester.clone();
    a.measurement = measure(PROGRAM, b"header = \"X-Evil: 1\"");
    assert!(matches!(
        verify(&evidence(&a, 1), &binding(1), &f.policy, NOW),
        Err(AttestError::MeasurementNotAllowed(_))
    ));
}

#[test]
fn wrong_signer_rejected() {
    let f = fixture();
    let mut a = f.attester.clone();
    a.signer = signer_id("someone else");
    assert!(matches!(
        verify(&evidence(&a, 1), &binding(1), &f.policy, NOW),
        Err(AttestError::SignerNotAllowed(_))
    ));
}

#[test]
fn svn_below_minimum_rejected() {
    let f = fixture();
    let mut a = f.attester.clone();
    a.svn = 1;
    assert!(matches!(
        verify(&evidence(&a, 1), &binding(1), &f.policy, NOW),
        Err(AttestError::SvnTooLow { svn: 1, min: 2 })
    ));
}

#[test]
fn debug_rejected_unless_allowed() {
    let f = fixture();
    let mut a = f.attester.clone();
    a.debug = true;
    let ev = evidence(&a, 1);
    assert!(matches!(
        verify(&ev, &binding(1), &f.policy, NOW),
        Err(AttestError::DebugNotAllowed)
    ));
    let mut p = f.policy.clone();
    p.allow_debug = true;
    assert!(verify(&ev, &binding(1), &p, NOW).unwrap().debug);
}

#[test]
fn untrusted_platform_key_rejected() {
    let f = fixture();
    let mut a = f.attester.clone();
    a.platform = platform(2);
    assert!(matches!(
        verify(&evidence(&a, 1), &binding(1), &f.policy, NOW),
        Err(AttestError::UntrustedPlatformKey(_))
    ));
    // An empty trust list trusts nothing.
    let mut p = f.policy.clone();
    p.sim_platform_keys.clear();
    assert!(matches!(
        verify(&evidence(&f.attester, 1), &binding(1), &p, NOW),
        Err(AttestError::UntrustedPlatformKey(_))
    ));
}

#[test]
fn tampered_evidence_rejected_by_signature() {
    let f = fixture();
    let Evidence::Simulated(good) = evidence(&f.attester, 1) else {
        unreachable!()
    };

    // A flipped signature bit.
    let mut ev = good.clone();
    ev.signature[10] ^= 0x01;
    assert!(matches!(
        verify(&Evidence::Simulated(ev), &binding(1), &f.policy, NOW),
        Err(AttestError::BadSignature)
    ));

    // Fields rewritten to values the policy accepts: only the signature can tell.
    let mut lenient = f.policy.clone();
    lenient.allow_debug = true;
    lenient.min_svn = 3;
    let mut ev = good.clone();
    ev.svn = 3;
    ev.debug = true;
    assert!(matches!(
        verify(&Evidence::Simulated(ev), &binding(1), &lenient, NOW),
        Err(AttestError::BadSignature)
    ));

    // report_data rewritten to this session's binding (replay with a patched binding).
    let mut ev = good;
    ev.report_data = binding(2);
    assert!(matches!(
        verify(&Evidence::Simulated(ev), &binding(2), &f.policy, NOW),
        Err(AttestError::BadSignature)
    ));
}

#[test]
fn every_single_byte_change_of_the_encoding_is_rejected() {
    let f = fixture();
    let good = evidence(&f.attester, 1).to_bytes();
    let mut lenient = f.policy.clone();
    lenient.allow_debug = true;
    for i in 0..good.len() {
        let mut b = good.clone();
        b[i] ^= 0x01;
        assert!(
            verify_bytes(&b, &binding(1), &lenient, NOW).is_err(),
            "flip at byte {i} accepted"
        );
    }
}
