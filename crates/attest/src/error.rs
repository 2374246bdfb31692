//! One error type for every attestation failure.
//!
//! Each refusal has its own variant so that callers (and tests) can tell *which* check failed; the
//! mbTLS driver turns any of them into a fatal alert.

use std::path::PathBuf;

use crate::claims::TcbStatus;

/// Why evidence was refused or could not be produced.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AttestError {
    /// The evidence bytes do not follow the encoding (truncated, trailing bytes, bad field).
    #[error("malformed evidence: {0}")]
    Malformed(&'static str),
    /// A length field or the whole input exceeds its limit; checked before allocating.
    #[error("{what} is {len} bytes, limit is {max}")]
    TooLarge {
        /// Which part was too large.
        what: &'static str,
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The evidence encoding version is not one we understand.
    #[error("unsupported evidence version {0}")]
    UnsupportedVersion(u8),
    /// The evidence kind tag is unknown.
    #[error("unknown evidence kind {0}")]
    UnknownKind(u8),
    /// The policy itself is invalid (bad hex, wrong digest length, unknown field, ...).
    #[error("invalid attestation policy: {0}")]
    Policy(String),
    /// A resumed session relies on evidence checked longer ago than the policy allows.
    #[error("the evidence this resumed session relies on was checked {age} s ago; the policy allows {max} s (resumed_evidence_max_age)")]
    EvidenceTooOld {
        /// Seconds since the evidence was checked.
        age: u64,
        /// The policy's `resumed_evidence_max_age`.
        max: u64,
    },
    /// Claims checked earlier rest on DCAP collateral that has expired since.
    #[error("the collateral of the evidence these claims rest on expired at {0} (seconds since the Unix epoch)")]
    CollateralExpired(u64),
    /// The oldest part of the evidence's collateral is older than the policy allows.
    #[error("the oldest part of the evidence's collateral was issued at {issued} (seconds since the Unix epoch), more than {max} s ago (max_collateral_age)")]
    CollateralTooOld {
        /// When the oldest part was issued (seconds since the Unix epoch).
        issued: u64,
        /// The policy's `max_collateral_age`.
        max: u64,
    },
    /// The peer presented no evidence but the policy requires it.
    #[error("attestation evidence is required by policy but none was presented")]
    EvidenceRequired,
    /// Simulated evidence under a policy without `allow_simulated = true`.
    #[error("simulated attestation evidence is not allowed by policy (allow_simulated = false)")]
    SimulatedNotAllowed,
    /// The middlebox points at evidence in its certificate, and the policy takes only evidence
    /// bound to each session.
    #[error("the middlebox's evidence is in its certificate, which the policy does not accept (certificate_evidence = false)")]
    CertificateEvidenceNotAllowed,
    /// The middlebox points at evidence in its certificate, which has no such extension.
    #[error("the middlebox's certificate carries no evidence (extension 2.23.133.5.4.9)")]
    NoCertificateEvidence,
    /// The middlebox's certificate carries evidence for other code than its attester measures
    /// now (hex): the program changed since the certificate was requested.
    #[error("the evidence in the middlebox's certificate claims code measurement {claimed}, but this middlebox's attester measures {running}: it runs other code than its certificate says (make a new request with --certificate-request)")]
    CertificateEvidenceForOtherCode {
        /// The measurement the certificate's evidence claims.
        claimed: String,
        /// The measurement the attester gives now.
        running: String,
    },
    /// The nonce the certificate's evidence is bound to is not one the policy lists.
    #[error("the nonce {0} of the evidence in the middlebox's certificate is not in the policy's certificate_nonces")]
    CertificateNonceNotAccepted(String),
    /// Simulated evidence signed by a platform key the policy does not trust.
    #[error("simulated evidence is signed by an untrusted platform key {0} (not in the policy's sim_platform_keys)")]
    UntrustedPlatformKey(String),
    /// The platform signature over simulated evidence does not verify.
    #[error("simulated evidence signature is invalid")]
    BadSignature,
    /// The report_data in the evidence is not the binding of this session.
    #[error("report_data does not match this session's binding (stale or replayed evidence)")]
    ReportDataMismatch,
    /// The policy lists no accepted measurement, so nothing can be accepted.
    #[error("policy lists no accepted measurements")]
    NoMeasurementsConfigured,
    /// The code measurement is not in the policy's list.
    #[error("code measurement {0} is not accepted by policy")]
    MeasurementNotAllowed(String),
    /// The signer measurement is not in the policy's list.
    #[error("signer {0} is not accepted by policy")]
    SignerNotAllowed(String),
    /// The security version is below `min_svn`.
    #[error("security version {svn} is below the policy minimum {min}")]
    SvnTooLow {
        /// The evidence's SVN.
        svn: u16,
        /// The policy's `min_svn`.
        min: u16,
    },
    /// A debug-mode TEE (its memory is readable by the host) under `allow_debug = false`.
    #[error("debug-mode TEE is not allowed by policy (allow_debug = false)")]
    DebugNotAllowed,
    /// The platform's TCB status is not in the policy's accepted list.
    #[error("TCB status {0} is not accepted by policy")]
    TcbStatusNotAllowed(TcbStatus),
    /// The collateral's TCB evaluation is older than the policy's minimum.
    #[error("TCB evaluation data number {number} is below the policy's minimum {min}")]
    TcbEvaluationTooOld {
        /// The collateral's number.
        number: u32,
        /// The policy's minimum.
        min: u32,
    },
    /// DCAP quote or collateral verification failed (signature chain, expiry, revocation, parse).
    #[error("DCAP quote verification failed: {0}")]
    Dcap(String),
    /// The DCAP collateral JSON could not be parsed.
    #[error("DCAP collateral is invalid: {0}")]
    Collateral(String),
    /// Key generation or loading failed.
    #[error("platform key error: {0}")]
    Key(&'static str),
    /// `/dev/attestation` is missing: the process is not running inside a Gramine enclave.
    #[error("not inside Gramine: {} does not exist", path.display())]
    NotInsideGramine {
        /// The missing file.
        path: PathBuf,
    },
    /// configfs-tsm's report directory is missing: not a TDX guest, or a kernel without it.
    #[error("no configfs-tsm report directory for {} (not a TDX guest with Linux 6.7 or later?)", path.display())]
    NoTsmReports {
        /// The report entry that could not be made.
        path: PathBuf,
    },
    /// Gramine is configured with an attestation type we cannot use (e.g. `none`, `epid`), or
    /// configfs-tsm reports another TEE than TDX (e.g. `sev_guest`).
    #[error("attestation type {0:?} is not supported (need Gramine's \"dcap\" or configfs-tsm's \"tdx_guest\")")]
    UnsupportedAttestationType(String),
    /// Reading or writing an attestation file failed.
    #[error("I/O error on {}: {error}", path.display())]
    Io {
        /// The file involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        error: std::io::Error,
    },
}
