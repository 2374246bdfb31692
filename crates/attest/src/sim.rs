//! The simulated TEE backend, for machines without SGX/TDX.
//!
//! A software Ed25519 "platform key" plays the role of the CPU's attestation key. It proves nothing
//! about isolation — anyone holding the key can sign any measurement — so its evidence is refused
//! unless the policy says `allow_simulated = true` and lists the platform's public key, and every
//! acceptance logs a warning.

use std::sync::Arc;

use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::signature::{Ed25519KeyPair, KeyPair, UnparsedPublicKey, ED25519};
use sha2::{Digest, Sha256};
use zeroize::Zeroizing;

use crate::binding::{report_data_eq, REPORT_DATA_LEN};
use crate::claims::{Claims, TeeKind};
use crate::error::AttestError;
use crate::evidence::{Evidence, SimEvidence};
use crate::policy::Policy;
use crate::verify::Attester;

/// Domain-separation prefix of simulated code measurements.
const MEASUREMENT_CONTEXT: &[u8] = b"mbx simulated measurement v1";
/// Domain-separation prefix of simulated signer ids.
const SIGNER_CONTEXT: &[u8] = b"mbx simulated signer v1";

/// Simulated code measurement: `SHA-256(ctx ‖ u64be(len(program)) ‖ program ‖ config)`.
///
/// `program` names the middlebox program and its version (e.g. `"mbx-mbox/header-insert@0.1.0"`);
/// `config` is its configuration as bytes, so the same program with another configuration has
/// another measurement (mbTLS property P3B: expected software *in the expected configuration*).
pub fn measure(program: &str, config: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(MEASUREMENT_CONTEXT);
    h.update((program.len() as u64).to_be_bytes());
    h.update(program.as_bytes());
    h.update(config);
    h.finalize().into()
}

/// Simulated signer measurement (MRSIGNER-like): `SHA-256(ctx ‖ identity)`.
pub fn signer_id(identity: &str) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(SIGNER_CONTEXT);
    h.update(identity.as_bytes());
    h.finalize().into()
}

/// A software platform key standing in for attestation hardware.
pub struct SimulatedPlatform {
    key: Ed25519KeyPair,
}

impl std::fmt::Debug for SimulatedPlatform {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimulatedPlatform")
            .field("public_key", &hex::encode(self.public_key()))
            .finish_non_exhaustive()
    }
}

impl SimulatedPlatform {
    /// A fresh random platform key.
    pub fn generate() -> Result<Self, AttestError> {
        Self::from_pkcs8(&Self::generate_pkcs8()?)
    }

    /// A fresh random platform key as PKCS#8, to store in a key file (see [`Self::from_pkcs8`]).
    pub fn generate_pkcs8() -> Result<Zeroizing<Vec<u8>>, AttestError> {
        let doc = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new())
            .map_err(|_| AttestError::Key("Ed25519 key generation failed"))?;
        Ok(Zeroizing::new(doc.as_ref().to_vec()))
    }

    /// Load a platform key from PKCS#8 (as [`Self::generate_pkcs8`] or `ring` writes it).
    pub fn from_pkcs8(pkcs8: &[u8]) -> Result<Self, AttestError> {
        Ed25519KeyPair::from_pkcs8(pkcs8)
            .map(|key| SimulatedPlatform { key })
            .map_err(|_| AttestError::Key("invalid Ed25519 PKCS#8 key"))
    }

    /// Deterministic platform key from a 32-byte seed, for reproducible demos and tests.
    pub fn from_seed(seed: &[u8; 32]) -> Result<Self, AttestError> {
        Ed25519KeyPair::from_seed_unchecked(seed)
            .map(|key| SimulatedPlatform { key })
            .map_err(|_| AttestError::Key("invalid Ed25519 seed"))
    }

    /// The public key verifiers must list in `sim_platform_keys`.
    pub fn public_key(&self) -> [u8; 32] {
        let mut out = [0u8; 32];
        out.copy_from_slice(self.key.public_key().as_ref());
        out
    }

    /// Sign a report: what the hardware would do for an enclave's `EREPORT`.
    fn sign(&self, mut ev: SimEvidence) -> SimEvidence {
        ev.platform_key = self.public_key();
        let sig = self.key.sign(&ev.signed_bytes());
        ev.signature.copy_from_slice(sig.as_ref());
        ev
    }
}

/// A middlebox "running" on a simulated platform.
#[derive(Clone, Debug)]
pub struct SimulatedAttester {
    /// The platform whose key signs the evidence.
    pub platform: Arc<SimulatedPlatform>,
    /// Code measurement, usually from [`measure`].
    pub measurement: [u8; 32],
    /// Signer measurement, usually from [`signer_id`].
    pub signer: [u8; 32],
    /// Product id.
    pub product_id: u16,
    /// Security version.
    pub svn: u16,
    /// Claim debug mode.
    pub debug: bool,
}

impl SimulatedAttester {
    /// An attester with product id 0, SVN 0 and debug off.
    pub fn new(platform: Arc<SimulatedPlatform>, measurement: [u8; 32], signer: [u8; 32]) -> Self {
        SimulatedAttester {
            platform,
            measurement,
            signer,
            product_id: 0,
            svn: 0,
            debug: false,
        }
    }
}

impl Attester for SimulatedAttester {
    fn evidence(&self, report_data: &[u8; REPORT_DATA_LEN]) -> Result<Evidence, AttestError> {
        let unsigned = SimEvidence {
            measurement: self.measurement,
            signer: self.signer,
            product_id: self.product_id,
            svn: self.svn,
            debug: self.debug,
            report_data: *report_data,
            platform_key: [0; 32],
            signature: [0; 64],
        };
        Ok(Evidence::Simulated(self.platform.sign(unsigned)))
    }
}

/// Verify simulated evidence: policy gate, trusted platform key, signature, binding, then claims.
///
/// Simulated evidence does not expire (its freshness comes from the binding), so there is no `now`.
pub fn verify_simulated(
    ev: &SimEvidence,
    expected_report_data: &[u8; REPORT_DATA_LEN],
    policy: &Policy,
) -> Result<Claims, AttestError> {
    policy.validate()?;
    if !policy.allow_simulated {
        return Err(AttestError::SimulatedNotAllowed);
    }
    if !policy.trusts_platform_key(&ev.platform_key) {
        return Err(AttestError::UntrustedPlatformKey(hex::encode(
            ev.platform_key,
        )));
    }
    UnparsedPublicKey::new(&ED25519, &ev.platform_key)
        .verify(&ev.signed_bytes(), &ev.signature)
        .map_err(|_| AttestError::BadSignature)?;
    if !report_data_eq(&ev.report_data, expected_report_data) {
        return Err(AttestError::ReportDataMismatch);
    }
    let claims = Claims {
        tee: TeeKind::Simulated,
        measurement: ev.measurement.to_vec(),
        signer: ev.signer.to_vec(),
        product_id: ev.product_id,
        svn: ev.svn,
        debug: ev.debug,
        tcb_status: None,
        advisory_ids: Vec::new(),
        tcb_evaluation_data_number: None,
        platform_key: Some(ev.platform_key.to_vec()),
        collateral_valid_until: None,
        collateral_issued_at: None,
    };
    policy.check_claims(&claims)?;
    tracing::warn!(
        claims = %claims,
        "accepted SIMULATED attestation evidence: no hardware protection (allow_simulated = true)"
    );
    Ok(claims)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measurement_depends_on_program_and_config() {
        let m = measure("prog", b"cfg");
        assert_ne!(m, measure("prog", b"cfh"));
        assert_ne!(m, measure("prof", b"cfg"));
        // The length prefix keeps the program/config boundary unambiguous.
        assert_ne!(measure("ab", b"c"), measure("a", b"bc"));
        assert_ne!(signer_id("a"), signer_id("b"));
    }

    #[test]
    fn seeded_platform_is_deterministic() {
        let a = SimulatedPlatform::from_seed(&[5; 32]).unwrap();
        let b = SimulatedPlatform::from_seed(&[5; 32]).unwrap();
        assert_eq!(a.public_key(), b.public_key());
        let c = SimulatedPlatform::generate().unwrap();
        assert_ne!(a.public_key(), c.public_key());
        let pkcs8 = SimulatedPlatform::generate_pkcs8().unwrap();
        let d = SimulatedPlatform::from_pkcs8(&pkcs8).unwrap();
        assert_eq!(
            d.public_key(),
            SimulatedPlatform::from_pkcs8(&pkcs8).unwrap().public_key()
        );
        assert!(SimulatedPlatform::from_pkcs8(b"not a key").is_err());
    }
}
