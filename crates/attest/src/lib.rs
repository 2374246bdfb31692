//! Attestation for mbx: evidence that a middlebox runs the expected code in a TEE, bound to one TLS
//! session, checked against a policy before any session key is released to it.
//!
//! - [`binding`]: `report_data = SHA-512("mbtls attestation v1" ‖ SHA-256(SPKI) ‖ binder)`, the binder
//!   being the secondary session's exporter ([`EXPORTER_LABEL`], 32 bytes).
//! - [`evidence`]: the versioned, kind-tagged wire encoding; decoding untrusted bytes never panics.
//! - [`sim`]: a software platform key standing in for hardware; refused unless the policy sets
//!   `allow_simulated = true`, and every acceptance logs a warning.
//! - [`dcap`]: offline Intel SGX/TDX quote verification with `dcap-qvl` (quote + collateral);
//!   [`dcap_cache`]: a platform verified in full has its later quotes checked by their signature.
//! - [`gramine`]: quote generation inside a Gramine enclave (needs hardware; not testable here).
//! - [`tsm`]: quote generation in an Intel TDX guest through Linux's configfs-tsm (likewise).
//! - [`cert_bound`]: evidence carried in the middlebox's certificate (the spec's second
//!   binding mode: a nonce as binder), accepted only where the policy says so.
//! - [`policy`]: the `[attestation]` table of the configuration.
//!
//! The spec is `attestation.md`.

// Network input must never panic the process: no unwrap/expect/panic outside tests.
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod binding;
pub mod cert_bound;
pub mod claims;
pub mod dcap;
pub mod dcap_cache;
pub mod error;
pub mod evidence;
pub mod gramine;
mod os_quote;
pub mod policy;
pub mod sim;
pub mod tsm;
pub mod verify;

pub use binding::{
    certificate_not_after, report_data, report_data_eq, spki_from_certificate, BINDING_CONTEXT,
    EXPORTER_LABEL, EXPORTER_LEN, REPORT_DATA_LEN,
};
pub use cert_bound::{verify_certificate_evidence, CertificateEvidence};
pub use claims::{Claims, TcbStatus, TeeKind};
pub use dcap::{
    quote_measurement_unverified, quote_report_data_unverified, verify_dcap, verify_dcap_quote,
};
pub use dcap_cache::{DcapCounts, DcapVerifier};
pub use error::AttestError;
pub use evidence::{Collateral, DcapEvidence, Evidence, EvidenceKind, SimEvidence};
pub use gramine::GramineAttester;
pub use policy::{HexBytes, Policy, DEFAULT_RESUMED_EVIDENCE_MAX_AGE};
pub use sim::{verify_simulated, SimulatedAttester, SimulatedPlatform};
pub use tsm::TsmAttester;
pub use verify::{
    recheck_claims, unix_seconds, verify, verify_bytes, Attester, DefaultVerifier, Verifier,
};
