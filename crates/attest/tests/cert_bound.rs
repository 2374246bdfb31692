//! Evidence carried in a certificate (the spec's second binding mode): accepted only where the
//! policy says so, bound to the certificate's own key and to its nonce.

use std::sync::Arc;

use mbx_attest::cert_bound::{CertificateEvidence, EVIDENCE_EXTENSION_OID};
use mbx_attest::sim::{measure, signer_id};
use mbx_attest::{
    verify_certificate_evidence, AttestError, HexBytes, Policy, SimulatedAttester,
    SimulatedPlatform, TeeKind,
};

const NOW: u64 = 1_700_000_000;
const NONCE: &[u8] = b"the CA's challenge";

/// What a certificate or a request for mb.test says: `extension` (an extension value), if any.
fn params(extension: Option<Vec<u8>>) -> rcgen::CertificateParams {
    let mut params = rcgen::CertificateParams::new(vec!["mb.test".to_string()]).unwrap();
    if let Some(value) = extension {
        params
            .custom_extensions
            .push(rcgen::CustomExtension::from_oid_content(
                &EVIDENCE_EXTENSION_OID,
                value,
            ));
    }
    params
}

/// A certificate for `key` carrying `extension` (an extension value), if any.
fn certificate(key: &rcgen::KeyPair, extension: Option<Vec<u8>>) -> Vec<u8> {
    params(extension).self_signed(key).unwrap().der().to_vec()
}

struct Fixture {
    attester: SimulatedAttester,
    policy: Policy,
}

fn fixture() -> Fixture {
    let platform = Arc::new(SimulatedPlatform::from_seed(&[3; 32]).unwrap());
    let attester = SimulatedAttester::new(
        platform.clone(),
        measure("mbx-mbox", b""),
        signer_id("mbx test signer"),
    );
    let policy = Policy {
        allow_simulated: true,
        measurements: vec![HexBytes::from(measure("mbx-mbox", b""))],
        sim_platform_keys: vec![HexBytes::from(platform.public_key())],
        certificate_evidence: true,
        ..Policy::default()
    };
    Fixture { attester, policy }
}

/// The DER SubjectPublicKeyInfo of `key`.
fn spki(key: &rcgen::KeyPair) -> Vec<u8> {
    use rcgen::PublicKeyData as _;
    key.subject_public_key_info()
}

/// The evidence for `key` and `nonce`, as an extension value.
fn extension(f: &Fixture, key: &rcgen::KeyPair, nonce: &[u8]) -> Vec<u8> {
    CertificateEvidence::make(&f.attester, &spki(key), nonce)
        .unwrap()
        .encode()
        .unwrap()
}

#[test]
fn evidence_in_the_certificate_is_accepted_where_the_policy_allows_it() {
    let f = fixture();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = certificate(&key, Some(extension(&f, &key, NONCE)));
    let claims = verify_certificate_evidence(&cert, &f.policy, NOW).unwrap();
    assert_eq!(claims.tee, TeeKind::Simulated);
    // The nonce pinned: this one passes, another does not.
    let pinned = Policy {
        certificate_nonces: vec![HexBytes(NONCE.to_vec())],
        ..f.policy.clone()
    };
    verify_certificate_evidence(&cert, &pinned, NOW).unwrap();
    // Each refusal below on a certificate not checked before: a certificate checked once is
    // answered from memory (the next test), and the full check is the one tested here.
    let unchecked = || {
        let key = rcgen::KeyPair::generate().unwrap();
        certificate(&key, Some(extension(&f, &key, NONCE)))
    };
    let other = Policy {
        certificate_nonces: vec![HexBytes(b"another challenge".to_vec())],
        ..f.policy.clone()
    };
    assert!(matches!(
        verify_certificate_evidence(&unchecked(), &other, NOW),
        Err(AttestError::CertificateNonceNotAccepted(_))
    ));
    // The mode refused by default.
    let session_only = Policy {
        certificate_evidence: false,
        ..f.policy.clone()
    };
    assert!(matches!(
        verify_certificate_evidence(&unchecked(), &session_only, NOW),
        Err(AttestError::CertificateEvidenceNotAllowed)
    ));
    // The rest of the policy applies as to any evidence.
    let other_code = Policy {
        measurements: vec![HexBytes::from(measure("another program", b""))],
        ..f.policy.clone()
    };
    assert!(matches!(
        verify_certificate_evidence(&unchecked(), &other_code, NOW),
        Err(AttestError::MeasurementNotAllowed(_))
    ));
}

#[test]
fn evidence_for_another_key_or_altered_is_refused() {
    let f = fixture();
    let key = rcgen::KeyPair::generate().unwrap();
    let other_key = rcgen::KeyPair::generate().unwrap();
    // The extension of one key's certificate copied into another key's certificate.
    let copied = certificate(&other_key, Some(extension(&f, &key, NONCE)));
    let e = verify_certificate_evidence(&copied, &f.policy, NOW).unwrap_err();
    assert!(matches!(e, AttestError::ReportDataMismatch), "{e}");
    // The nonce in the extension changed after the evidence was made.
    let mut ce = CertificateEvidence::make(&f.attester, &spki(&key), NONCE).unwrap();
    ce.nonce = b"a later challenge".to_vec();
    let renonced = certificate(&key, Some(ce.encode().unwrap()));
    let e = verify_certificate_evidence(&renonced, &f.policy, NOW).unwrap_err();
    assert!(matches!(e, AttestError::ReportDataMismatch), "{e}");
    // A byte of the evidence flipped (its last: the signature).
    let mut ce = CertificateEvidence::make(&f.attester, &spki(&key), NONCE).unwrap();
    *ce.evidence.last_mut().unwrap() ^= 1;
    let flipped = certificate(&key, Some(ce.encode().unwrap()));
    let e = verify_certificate_evidence(&flipped, &f.policy, NOW).unwrap_err();
    assert!(matches!(e, AttestError::BadSignature), "{e}");
    // No extension at all.
    let plain = certificate(&key, None);
    assert!(matches!(
        verify_certificate_evidence(&plain, &f.policy, NOW),
        Err(AttestError::NoCertificateEvidence)
    ));
}

/// A certificate checked in full is remembered: the next check of it applies the caller's
/// policy to the remembered claims, so another policy can still refuse them (when a remembered
/// check answers, and how long, is tested in the module: `a_full_check_is_remembered_until_it_is_too_old`).
#[test]
fn a_remembered_certificate_check_is_held_to_each_policy() {
    let f = fixture();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = certificate(&key, Some(extension(&f, &key, NONCE)));
    let policy = Policy {
        resumed_evidence_max_age: 100,
        ..f.policy.clone()
    };
    verify_certificate_evidence(&cert, &policy, NOW).unwrap();
    // Remembered: answered with the time of the full check, so what follows is refused on
    // the remembered claims.
    let remembered = mbx_attest::cert_bound::check_certificate_evidence(&cert, &policy, NOW + 50);
    assert_eq!(remembered.unwrap().checked_at, NOW);
    let other_platform = Policy {
        sim_platform_keys: vec![HexBytes::from([9u8; 32])],
        ..policy.clone()
    };
    assert!(matches!(
        verify_certificate_evidence(&cert, &other_platform, NOW + 50),
        Err(AttestError::UntrustedPlatformKey(_))
    ));
    let pinned = Policy {
        certificate_nonces: vec![HexBytes(b"another".to_vec())],
        ..policy.clone()
    };
    assert!(matches!(
        verify_certificate_evidence(&cert, &pinned, NOW + 50),
        Err(AttestError::CertificateNonceNotAccepted(_))
    ));
    // (The mode off is refused before any memory is looked at.)
    let off = Policy {
        certificate_evidence: false,
        ..policy.clone()
    };
    assert!(matches!(
        verify_certificate_evidence(&cert, &off, NOW + 50),
        Err(AttestError::CertificateEvidenceNotAllowed)
    ));
}

/// What a CA checks before signing: a request's evidence, bound to the request's own key and
/// nonce, under the CA's policy; the evidence of another key's request, or an unpinned nonce,
/// is refused.
#[test]
fn a_requests_evidence_is_checked_before_signing() {
    use mbx_attest::cert_bound::check_request_evidence;
    let f = fixture();
    let request = |key: &rcgen::KeyPair, extension: Vec<u8>| {
        let request = params(Some(extension)).serialize_request(key).unwrap();
        request.der().to_vec()
    };
    let key = rcgen::KeyPair::generate().unwrap();
    let csr = request(&key, extension(&f, &key, NONCE));
    let check = check_request_evidence(&csr, &f.policy, NOW).unwrap();
    assert_eq!(check.nonce, NONCE);
    let other_key = rcgen::KeyPair::generate().unwrap();
    let copied = request(&other_key, extension(&f, &key, NONCE));
    assert!(matches!(
        check_request_evidence(&copied, &f.policy, NOW),
        Err(AttestError::ReportDataMismatch)
    ));
    let pinned = Policy {
        certificate_nonces: vec![HexBytes(b"another".to_vec())],
        ..f.policy.clone()
    };
    assert!(matches!(
        check_request_evidence(&csr, &pinned, NOW),
        Err(AttestError::CertificateNonceNotAccepted(_))
    ));
}
