//! Test certificates as the engine's `Identity`.

use mbx_engine::Identity;
use mbx_testbed::pki::{LeafSpec, TestPki};

/// A middlebox leaf issued by `pki` for `name` that carries `attester`'s evidence for its key
/// and `nonce` (the spec's second binding mode), as an engine identity.
#[allow(dead_code)] // Not every test file that includes this module uses it.
pub fn identity_with_certificate_evidence(
    pki: &TestPki,
    name: &str,
    attester: &dyn mbx_attest::Attester,
    nonce: &[u8],
) -> Identity {
    let evidence_for = |spki: &[u8]| {
        mbx_attest::CertificateEvidence::make(attester, spki, nonce)
            .unwrap()
            .encode()
            .unwrap()
    };
    let oid = &mbx_attest::cert_bound::EVIDENCE_EXTENSION_OID;
    let leaf = pki
        .issue_with_extension(&LeafSpec::middlebox(name), Some((oid, &evidence_for)))
        .unwrap();
    Identity::from_pem(leaf.chain_pem(), leaf.key_pem().as_bytes())
}

/// A leaf issued by `pki` for `spec`, as an engine identity, and its certificate (DER).
pub fn identity(pki: &TestPki, spec: &LeafSpec) -> (Identity, Vec<u8>) {
    let leaf = pki.issue(spec).unwrap();
    (
        Identity::from_pem(leaf.chain_pem(), leaf.key_pem().as_bytes()),
        leaf.cert_der().to_vec(),
    )
}
