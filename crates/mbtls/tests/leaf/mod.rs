//! Test certificates as the engine's `Identity`.

use mbx_engine::Identity;
use mbx_testbed::pki::{LeafSpec, TestPki};

/// A leaf issued by `pki` for `spec`, as an engine identity, and its certificate (DER).
pub fn identity(pki: &TestPki, spec: &LeafSpec) -> (Identity, Vec<u8>) {
    let leaf = pki.issue(spec).unwrap();
    (
        Identity::from_pem(leaf.chain_pem(), leaf.key_pem().as_bytes()),
        leaf.cert_der().to_vec(),
    )
}
