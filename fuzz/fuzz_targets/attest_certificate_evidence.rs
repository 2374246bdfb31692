//! The evidence extension of a middlebox certificate from arbitrary bytes: reading it never
//! panics, and what reads encodes back to a record that reads the same. The same bytes taken
//! for a whole certificate: its check never panics and never accepts, the policy as lenient
//! as a policy gets.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mbx_attest::cert_bound::CertificateEvidence;
use mbx_attest::{verify_certificate_evidence, HexBytes, Policy};

fuzz_target!(|data: &[u8]| {
    if let Ok(ce) = CertificateEvidence::decode(data) {
        let again = CertificateEvidence::decode(&ce.encode().expect("what reads encodes"));
        assert_eq!(again.ok(), Some(ce), "a record reads back the same");
    }
    // Any bytes as a certificate: an error, never a panic, never claims.
    let policy = Policy {
        allow_simulated: true,
        allow_debug: true,
        certificate_evidence: true,
        measurements: vec![HexBytes::from([0u8; 32]), HexBytes::from([0u8; 48])],
        sim_platform_keys: vec![HexBytes::from([1u8; 32])],
        ..Policy::default()
    };
    assert!(verify_certificate_evidence(data, &policy, 1_740_000_000).is_err());
});
