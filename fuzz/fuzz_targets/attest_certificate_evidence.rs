//! The evidence extension of a middlebox certificate from arbitrary bytes: reading it never
//! panics, and what reads encodes back to a record that reads the same. The same bytes as the
//! extension of a real certificate (signed with a fixed key), and as a whole certificate or
//! certificate signing request: their checks never panic and never accept, the policy as
//! lenient as a policy gets.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use mbx_attest::cert_bound::{check_request_evidence, CertificateEvidence, EVIDENCE_EXTENSION_OID};
use mbx_attest::{verify_certificate_evidence, HexBytes, Policy};

fn key() -> &'static rcgen::KeyPair {
    static KEY: OnceLock<rcgen::KeyPair> = OnceLock::new();
    KEY.get_or_init(|| rcgen::KeyPair::generate().expect("a key"))
}

fuzz_target!(|data: &[u8]| {
    if let Ok(ce) = CertificateEvidence::decode(data) {
        let again = CertificateEvidence::decode(&ce.encode().expect("what reads encodes"));
        assert_eq!(again.ok(), Some(ce), "a record reads back the same");
    }
    let Ok(mut params) = rcgen::CertificateParams::new(vec!["mb.test".to_string()]) else {
        return;
    };
    params
        .custom_extensions
        .push(rcgen::CustomExtension::from_oid_content(
            &EVIDENCE_EXTENSION_OID,
            data.to_vec(),
        ));
    let Ok(cert) = params.self_signed(key()) else {
        return;
    };
    let policy = Policy {
        allow_simulated: true,
        allow_debug: true,
        certificate_evidence: true,
        measurements: vec![HexBytes::from([0u8; 32]), HexBytes::from([0u8; 48])],
        sim_platform_keys: vec![HexBytes::from([1u8; 32])],
        ..Policy::default()
    };
    // Any bytes as the whole certificate, or as a certificate signing request, too.
    assert!(verify_certificate_evidence(data, &policy, 1_740_000_000).is_err());
    assert!(check_request_evidence(data, &policy, 1_740_000_000).is_err());
    assert!(verify_certificate_evidence(cert.der(), &policy, 1_740_000_000).is_err());
});
