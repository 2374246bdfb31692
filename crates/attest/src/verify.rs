//! The two roles: the attester (inside the TEE) and the verifier (the relying endpoint).

use crate::binding::REPORT_DATA_LEN;
use crate::claims::Claims;
use crate::dcap::verify_dcap;
use crate::error::AttestError;
use crate::evidence::Evidence;
use crate::policy::Policy;
use crate::sim::verify_simulated;

/// Produces evidence binding `report_data` to the TEE's identity.
pub trait Attester: Send + Sync {
    /// Evidence whose report_data field is exactly `report_data`.
    fn evidence(&self, report_data: &[u8; REPORT_DATA_LEN]) -> Result<Evidence, AttestError>;

    /// Whether [`Self::evidence`] waits on something outside this process (a quoting enclave
    /// takes milliseconds): an async driver then runs the handshake step that asks for evidence
    /// where blocking is allowed, so that its other connections go on meanwhile.
    fn blocks(&self) -> bool {
        false
    }
}

/// Checks evidence against the session binding and a policy.
pub trait Verifier: Send + Sync {
    /// `Ok(claims)` only if the evidence is authentic, bound to `expected_report_data`, and
    /// acceptable under `policy` at `now_unix` (seconds since the Unix epoch).
    fn verify(
        &self,
        evidence: &Evidence,
        expected_report_data: &[u8; REPORT_DATA_LEN],
        policy: &Policy,
        now_unix: u64,
    ) -> Result<Claims, AttestError>;
}

/// The verifier for every backend this crate knows; dispatches on the evidence kind.
#[derive(Clone, Copy, Debug, Default)]
pub struct DefaultVerifier;

impl Verifier for DefaultVerifier {
    fn verify(
        &self,
        evidence: &Evidence,
        expected_report_data: &[u8; REPORT_DATA_LEN],
        policy: &Policy,
        now_unix: u64,
    ) -> Result<Claims, AttestError> {
        verify(evidence, expected_report_data, policy, now_unix)
    }
}

/// Verify any evidence: dispatches to the simulated or DCAP backend by kind.
///
/// `now_unix` is passed in (not read from the clock) so the check is deterministic and testable;
/// drivers pass the current time.
pub fn verify(
    evidence: &Evidence,
    expected_report_data: &[u8; REPORT_DATA_LEN],
    policy: &Policy,
    now_unix: u64,
) -> Result<Claims, AttestError> {
    match evidence {
        Evidence::Simulated(ev) => verify_simulated(ev, expected_report_data, policy),
        Evidence::Dcap(ev) => verify_dcap(ev, expected_report_data, policy, now_unix),
    }
}

/// Applies `policy` again to claims that an earlier check accepted at `checked_at` (an mbTLS
/// secondary session resumed from a session whose evidence was verified), at `now` (seconds
/// since the Unix epoch): the check must be younger than the policy's
/// `resumed_evidence_max_age`; what the evidence rested on must still hold (a simulated
/// platform key the policy still trusts, DCAP collateral not yet expired); and the claims must
/// pass the policy's own checks and its gate on simulated evidence. The evidence's signature
/// and binding are not checked again: they belonged to the earlier session.
pub fn recheck_claims(
    claims: &Claims,
    checked_at: u64,
    now: u64,
    policy: &Policy,
) -> Result<(), AttestError> {
    policy.validate()?;
    check_resumed_age(checked_at, now, policy)?;
    if let Some(last) = claims.collateral_valid_until {
        if now > last {
            return Err(AttestError::CollateralExpired(last));
        }
    }
    policy.check_collateral_age(claims, now)?;
    if claims.tee == crate::claims::TeeKind::Simulated {
        if !policy.allow_simulated {
            return Err(AttestError::SimulatedNotAllowed);
        }
        let key = claims.platform_key.as_deref().unwrap_or_default();
        if !policy.trusts_platform_key(key) {
            return Err(AttestError::UntrustedPlatformKey(hex::encode(key)));
        }
        tracing::warn!(
            claims = %claims,
            "accepted SIMULATED attestation claims again (resumed session; allow_simulated = true)"
        );
    }
    policy.check_claims(claims)
}

/// A resumed session that relies on an earlier check, of evidence or of its absence, made at
/// `checked_at`: refused at `now` once the policy's `resumed_evidence_max_age` has passed.
fn check_resumed_age(checked_at: u64, now: u64, policy: &Policy) -> Result<(), AttestError> {
    if now >= policy.resumed_evidence_valid_until(checked_at) {
        return Err(AttestError::EvidenceTooOld {
            age: now.saturating_sub(checked_at),
            max: policy.resumed_evidence_max_age,
        });
    }
    Ok(())
}

/// Seconds since the Unix epoch of `t` (0 before the epoch), for the `now_unix` argument.
pub fn unix_seconds(t: std::time::SystemTime) -> u64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Decode untrusted evidence bytes and [`verify`] them.
pub fn verify_bytes(
    evidence: &[u8],
    expected_report_data: &[u8; REPORT_DATA_LEN],
    policy: &Policy,
    now_unix: u64,
) -> Result<Claims, AttestError> {
    verify(
        &Evidence::from_bytes(evidence)?,
        expected_report_data,
        policy,
        now_unix,
    )
}
