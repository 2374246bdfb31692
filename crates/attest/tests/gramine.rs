//! Gramine quote generation cannot run without SGX; only its behaviour outside Gramine is tested.

use mbx_attest::{AttestError, Attester, GramineAttester};

#[test]
fn outside_gramine_reports_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let attester = GramineAttester::new(dir.path().join("collateral.json"))
        .with_attestation_dir(dir.path().join("attestation"));
    let err = attester.evidence(&[0; 64]).unwrap_err();
    assert!(
        matches!(err, AttestError::NotInsideGramine { .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("not inside Gramine"), "{err}");
    // Nothing was created where the pseudo-files would be.
    assert!(!dir.path().join("attestation").exists());
}

#[test]
fn default_location_is_dev_attestation() {
    // This machine has no Gramine: the real path reports the same error.
    if std::path::Path::new("/dev/attestation").exists() {
        return; // Inside Gramine after all; nothing to check here.
    }
    let err = GramineAttester::new("/nonexistent/collateral.json")
        .evidence(&[0; 64])
        .unwrap_err();
    assert!(
        matches!(&err, AttestError::NotInsideGramine { path } if path.starts_with("/dev/attestation")),
        "{err:?}"
    );
}

#[test]
fn non_dcap_attestation_type_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("attestation_type"), "none\n").unwrap();
    let err = GramineAttester::new(dir.path().join("collateral.json"))
        .with_attestation_dir(dir.path())
        .evidence(&[0; 64])
        .unwrap_err();
    assert!(
        matches!(&err, AttestError::UnsupportedAttestationType(t) if t == "none"),
        "{err:?}"
    );
}
