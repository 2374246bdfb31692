//! Relying-party policy: which attested peers are acceptable.
//!
//! Configured as the `[attestation]` table of `attestation.md`:
//!
//! ```toml
//! [attestation]
//! required = true                 # refuse middleboxes that present no evidence
//! allow_simulated = false         # default; tests and the demo set it explicitly
//! measurements = ["<hex>"]        # accepted code measurements (MRENCLAVE / MRTD / simulated)
//! signers = ["<hex>"]             # accepted signers (optional; empty = any signer)
//! min_svn = 0
//! allow_debug = false
//! # Extensions of this crate (optional):
//! accepted_tcb_statuses = ["UpToDate"]   # DCAP platform TCB statuses accepted (default: UpToDate only)
//! sim_platform_keys = ["<hex>"]          # Ed25519 public keys of trusted simulated platforms
//! ```
//!
//! Everything fails closed: an empty `measurements` list accepts nothing, simulated evidence needs
//! `allow_simulated = true` *and* a trusted platform key, and `Revoked` can never be accepted.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use subtle::{Choice, ConstantTimeEq};

use crate::claims::{Claims, TcbStatus};
use crate::error::AttestError;

/// Bytes written as a hex string in configuration files.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct HexBytes(pub Vec<u8>);

impl HexBytes {
    /// Parse a hex string (upper or lower case, no prefix).
    pub fn from_hex(s: &str) -> Result<Self, AttestError> {
        decode_hex(s).map_err(AttestError::Policy)
    }

    /// The raw bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl From<&[u8]> for HexBytes {
    fn from(b: &[u8]) -> Self {
        HexBytes(b.to_vec())
    }
}

impl<const N: usize> From<[u8; N]> for HexBytes {
    fn from(b: [u8; N]) -> Self {
        HexBytes(b.to_vec())
    }
}

impl fmt::Debug for HexBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(&self.0))
    }
}

impl fmt::Display for HexBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(&self.0))
    }
}

impl Serialize for HexBytes {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&hex::encode(&self.0))
    }
}

impl<'de> Deserialize<'de> for HexBytes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        // Without the policy error's prefix: serde names the field after it.
        decode_hex(&s).map_err(serde::de::Error::custom)
    }
}

/// `s` as bytes, or why it is not hex.
fn decode_hex(s: &str) -> Result<HexBytes, String> {
    hex::decode(s.trim())
        .map(HexBytes)
        .map_err(|e| format!("invalid hex {s:?}: {e}{}", hex_hint(s)))
}

/// What a value that is not hex most likely is (found in a user trial: a value copied from
/// the docs' abbreviated examples, a key file's name where its public key in hex belongs).
fn hex_hint(s: &str) -> &'static str {
    if s.contains('…') || s.contains("...") {
        " (an abbreviated value: give all of its hex digits, as the middlebox prints them)"
    } else if s.contains('.') || s.contains('/') {
        " (hex digits, not a file name: for a simulated platform, the public key the \
         middlebox prints)"
    } else {
        ""
    }
}

/// Lengths a measurement or signer may have: 32 (SGX, simulated) or 48 (TDX).
const DIGEST_LENS: [usize; 2] = [32, 48];

/// Length of an Ed25519 public key.
const ED25519_PUBLIC_KEY_LEN: usize = 32;

/// Default [`Policy::resumed_evidence_max_age`]: 2 hours, OpenSSL's default ticket lifetime.
pub const DEFAULT_RESUMED_EVIDENCE_MAX_AGE: u64 = 7200;

/// Acceptance policy for attestation evidence (the `[attestation]` table).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Policy {
    /// Refuse peers that present no evidence. Default `true`.
    pub required: bool,
    /// Accept evidence from the software simulator. Default `false`; never set it in production.
    pub allow_simulated: bool,
    /// Accepted code measurements. Empty accepts nothing.
    pub measurements: Vec<HexBytes>,
    /// Accepted signer measurements. Empty accepts any signer.
    pub signers: Vec<HexBytes>,
    /// Minimum security version (ISV SVN for SGX; TDX quotes carry none and report 0).
    pub min_svn: u16,
    /// Accept TEEs running in debug mode. Default `false`.
    pub allow_debug: bool,
    /// DCAP platform TCB statuses to accept. Default `["UpToDate"]`. Typical additions are
    /// `SWHardeningNeeded` (the enclave is built with the mitigations) and `ConfigurationNeeded`
    /// (e.g. SMT enabled, accepted knowingly). `Revoked` is refused even if listed.
    pub accepted_tcb_statuses: Vec<TcbStatus>,
    /// Ed25519 public keys (32 bytes, hex) of the simulated platforms whose evidence is trusted.
    pub sim_platform_keys: Vec<HexBytes>,
    /// DCAP: the lowest `tcbEvaluationDataNumber` accepted (default 0, any). Collateral stays
    /// valid for weeks, so without it a platform left unpatched after a TCB recovery can still
    /// present the collateral from before it, which calls its TCB `UpToDate`; Intel publishes
    /// the current numbers (PCS `tcbevaluationdatanumbers`).
    pub min_tcb_evaluation_data_number: u32,
    /// Seconds for which evidence checked once may stand for sessions that resume the session
    /// it was checked on (an mbTLS secondary session resumed without new evidence), counted
    /// from the check: a chain of resumptions, each with a new ticket, never stretches it.
    /// Default 7200, the lifetime of one OpenSSL session ticket; 0 resumes nothing.
    pub resumed_evidence_max_age: u64,
    /// DCAP: the most seconds since the oldest part of the evidence's collateral was issued
    /// (default 0: any age within the collateral's validity). The collateral, revocation lists
    /// included, is the attester's to send and stays valid for weeks: without a bound, a
    /// middlebox whose PCK key Intel revoked can go on sending the lists from before. Intel
    /// reissues its CRLs and TCB info daily, so a day or two is a typical bound (the attester
    /// must then refresh its collateral as often).
    pub max_collateral_age: u64,
    /// Accept evidence carried in the middlebox's certificate (bound to its key and a nonce
    /// chosen at certification, [`crate::cert_bound`]) in place of evidence bound to each
    /// session. Default `false`: such evidence shows that the TEE made and holds the key, not
    /// that it runs now, and a key taken out of it would pass until the certificate expires.
    pub certificate_evidence: bool,
    /// With `certificate_evidence`: the nonces (hex) the certificate's evidence may be bound
    /// to, those the verifier issued. Empty accepts any.
    pub certificate_nonces: Vec<HexBytes>,
}

impl Default for Policy {
    /// Strict: evidence required, no simulator, no debug, UpToDate TCB only, no measurement yet.
    fn default() -> Self {
        Policy {
            required: true,
            allow_simulated: false,
            measurements: Vec::new(),
            signers: Vec::new(),
            min_svn: 0,
            allow_debug: false,
            accepted_tcb_statuses: vec![TcbStatus::UpToDate],
            sim_platform_keys: Vec::new(),
            min_tcb_evaluation_data_number: 0,
            resumed_evidence_max_age: DEFAULT_RESUMED_EVIDENCE_MAX_AGE,
            max_collateral_age: 0,
            certificate_evidence: false,
            certificate_nonces: Vec::new(),
        }
    }
}

/// "1 byte", "N bytes".
fn byte_count(n: usize) -> String {
    match n {
        1 => "1 byte".into(),
        n => format!("{n} bytes"),
    }
}

/// Constant-time "is `value` one of `list`": every entry is compared in full, whatever matches.
fn ct_contains(list: &[HexBytes], value: &[u8]) -> bool {
    let mut found = Choice::from(0);
    for item in list {
        found |= item.0.as_slice().ct_eq(value);
    }
    bool::from(found)
}

impl Policy {
    /// Whether the evidence in a certificate may be bound to `nonce`: any, unless the policy
    /// lists nonces (compared in constant time).
    fn accepts_certificate_nonce(&self, nonce: &[u8]) -> bool {
        self.certificate_nonces.is_empty() || ct_contains(&self.certificate_nonces, nonce)
    }

    /// Evidence in a certificate, bound to `nonce`, is taken: the policy accepts the mode
    /// and that nonce (a fresh check, and a session resumed from one, both ask).
    pub fn check_certificate_evidence(&self, nonce: &[u8]) -> Result<(), AttestError> {
        if !self.certificate_evidence {
            return Err(AttestError::CertificateEvidenceNotAllowed);
        }
        if !self.accepts_certificate_nonce(nonce) {
            return Err(AttestError::CertificateNonceNotAccepted(hex::encode(nonce)));
        }
        Ok(())
    }

    /// Parse a policy from TOML: either a document with an `[attestation]` table, or the table's
    /// contents on their own. The result is validated.
    pub fn from_toml_str(s: &str) -> Result<Self, AttestError> {
        let value: toml::Table = s
            .parse()
            .map_err(|e: toml::de::Error| AttestError::Policy(e.to_string()))?;
        let table = match value.get("attestation") {
            Some(toml::Value::Table(t)) => t.clone(),
            Some(_) => return Err(AttestError::Policy("`attestation` must be a table".into())),
            None => value,
        };
        let policy: Policy = table
            .try_into()
            .map_err(|e: toml::de::Error| AttestError::Policy(e.to_string()))?;
        policy.validate()?;
        Ok(policy)
    }

    /// Reject configuration mistakes that would otherwise silently never match.
    pub fn validate(&self) -> Result<(), AttestError> {
        for (what, list) in [
            ("measurement", &self.measurements),
            ("signer", &self.signers),
        ] {
            for m in list {
                if !DIGEST_LENS.contains(&m.0.len()) {
                    return Err(AttestError::Policy(format!(
                        "{what} {m} is {}; expected 32 bytes (SGX/simulated) or 48 (TDX)",
                        byte_count(m.0.len())
                    )));
                }
            }
        }
        self.svn_needs_a_signer()?;
        for k in &self.sim_platform_keys {
            if k.0.len() != ED25519_PUBLIC_KEY_LEN {
                return Err(AttestError::Policy(format!(
                    "simulated platform key {k} is {}; expected a 32-byte Ed25519 key",
                    byte_count(k.0.len())
                )));
            }
        }
        Ok(())
    }

    /// A security version means something only under a pinned signer: an SGX enclave's SVN
    /// comes from its SIGSTRUCT, outside MRENCLAVE, so anyone can sign an old enclave again
    /// with any SVN under a key of their own, and `min_svn` without `signers` would not keep
    /// the old build out.
    fn svn_needs_a_signer(&self) -> Result<(), AttestError> {
        if self.min_svn > 0 && self.signers.is_empty() {
            return Err(AttestError::Policy(
                "min_svn needs signers: a security version is only as good as the signer it \
                 is bound to (anyone can sign an enclave again with any SVN)"
                    .into(),
            ));
        }
        Ok(())
    }

    /// Until when (seconds since the Unix epoch, exclusive) evidence checked at `checked_at`
    /// may stand for resumed sessions ([`Policy::resumed_evidence_max_age`]).
    pub fn resumed_evidence_valid_until(&self, checked_at: u64) -> u64 {
        checked_at.saturating_add(self.resumed_evidence_max_age)
    }

    /// Decide what to do when the peer presented no evidence at all.
    pub fn check_missing_evidence(&self) -> Result<(), AttestError> {
        if self.required {
            Err(AttestError::EvidenceRequired)
        } else {
            Ok(())
        }
    }

    /// Is this Ed25519 public key a trusted simulated platform?
    pub(crate) fn trusts_platform_key(&self, key: &[u8]) -> bool {
        self.sim_platform_keys.iter().any(|k| k.0 == key)
    }

    /// The last second (since the Unix epoch) at which `claims`' collateral is young enough for
    /// `max_collateral_age` (`u64::MAX`: no bound, or no collateral, as for simulated claims).
    pub fn collateral_young_until(&self, claims: &Claims) -> u64 {
        match (self.max_collateral_age, claims.collateral_issued_at) {
            (max, Some(issued)) if max > 0 => issued.saturating_add(max),
            _ => u64::MAX,
        }
    }

    /// `max_collateral_age` at `now` (seconds since the Unix epoch): claims whose collateral's
    /// oldest part is older are refused.
    pub fn check_collateral_age(&self, claims: &Claims, now: u64) -> Result<(), AttestError> {
        if now > self.collateral_young_until(claims) {
            return Err(AttestError::CollateralTooOld {
                issued: claims.collateral_issued_at.unwrap_or_default(),
                max: self.max_collateral_age,
            });
        }
        Ok(())
    }

    /// No middlebox can pass: evidence is required and no measurement is accepted (the
    /// default policy, until its measurements are given).
    pub fn refuses_every_middlebox(&self) -> bool {
        self.required && self.measurements.is_empty()
    }

    /// Apply the policy to claims whose signature and binding were already verified.
    ///
    /// Measurement and signer comparisons are constant-time over the whole list.
    pub fn check_claims(&self, claims: &Claims) -> Result<(), AttestError> {
        if self.measurements.is_empty() {
            return Err(AttestError::NoMeasurementsConfigured);
        }
        // Also for a policy built in code, which `validate` never saw.
        self.svn_needs_a_signer()?;
        if !ct_contains(&self.measurements, &claims.measurement) {
            return Err(AttestError::MeasurementNotAllowed(hex::encode(
                &claims.measurement,
            )));
        }
        if !self.signers.is_empty() && !ct_contains(&self.signers, &claims.signer) {
            return Err(AttestError::SignerNotAllowed(hex::encode(&claims.signer)));
        }
        if claims.svn < self.min_svn {
            return Err(AttestError::SvnTooLow {
                svn: claims.svn,
                min: self.min_svn,
            });
        }
        if claims.debug && !self.allow_debug {
            return Err(AttestError::DebugNotAllowed);
        }
        if let Some(status) = claims.tcb_status {
            if status == TcbStatus::Revoked || !self.accepted_tcb_statuses.contains(&status) {
                return Err(AttestError::TcbStatusNotAllowed(status));
            }
        }
        if let Some(number) = claims.tcb_evaluation_data_number {
            if number < self.min_tcb_evaluation_data_number {
                return Err(AttestError::TcbEvaluationTooOld {
                    number,
                    min: self.min_tcb_evaluation_data_number,
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::claims::TeeKind;

    /// A value that is not hex says what it most likely is instead: an abbreviated copy, or
    /// a file name; in a policy file as for a flag.
    #[test]
    fn a_value_that_is_not_hex_says_what_it_looks_like() {
        let abbreviated = HexBytes::from_hex("97f7…1c44").unwrap_err().to_string();
        assert!(
            abbreviated.contains("an abbreviated value"),
            "{abbreviated}"
        );
        let file: Result<Policy, _> = toml::from_str("sim_platform_keys = [\"platform2.key\"]");
        let file = file.unwrap_err().to_string();
        assert!(
            file.contains("invalid hex \"platform2.key\"") && file.contains("not a file name"),
            "{file}"
        );
        assert!(!HexBytes::from_hex("0x12")
            .unwrap_err()
            .to_string()
            .contains(" ("));
    }

    fn claims() -> Claims {
        Claims {
            tee: TeeKind::Sgx,
            measurement: vec![1; 32],
            signer: vec![2; 32],
            product_id: 0,
            svn: 3,
            debug: false,
            tcb_status: Some(TcbStatus::UpToDate),
            advisory_ids: vec![],
            tcb_evaluation_data_number: Some(17),
            platform_key: None,
            collateral_valid_until: Some(5_000),
            collateral_issued_at: Some(500),
        }
    }

    fn accepting() -> Policy {
        Policy {
            measurements: vec![HexBytes(vec![1; 32])],
            signers: vec![HexBytes(vec![2; 32])],
            min_svn: 3,
            ..Policy::default()
        }
    }

    /// A value of the wrong length says how long it is, in words (found in a user trial:
    /// "is 1 bytes").
    #[test]
    fn a_wrong_length_is_said_in_words() {
        let one = Policy {
            measurements: vec![HexBytes(vec![0])],
            ..Policy::default()
        };
        let e = one.validate().unwrap_err().to_string();
        assert!(e.contains(" is 1 byte; expected 32 bytes"), "{e}");
        let key = Policy {
            sim_platform_keys: vec![HexBytes(vec![0; 3])],
            ..Policy::default()
        };
        let e = key.validate().unwrap_err().to_string();
        assert!(e.contains(" is 3 bytes; expected a 32-byte"), "{e}");
    }

    #[test]
    fn parses_the_spec_table() {
        let m = "11".repeat(32);
        let s = "22".repeat(32);
        let doc = format!(
            "[attestation]\nrequired = true\nallow_simulated = false\nmeasurements = [\"{m}\"]\n\
             signers = [\"{s}\"]\nmin_svn = 2\nallow_debug = false\n"
        );
        let p = Policy::from_toml_str(&doc).unwrap();
        assert_eq!(
            p,
            Policy {
                measurements: vec![HexBytes(vec![0x11; 32])],
                signers: vec![HexBytes(vec![0x22; 32])],
                min_svn: 2,
                ..Policy::default()
            }
        );
        // The bare table works too, and extensions parse.
        let p = Policy::from_toml_str(&format!(
            "measurements = [\"{m}\"]\naccepted_tcb_statuses = [\"UpToDate\", \"SWHardeningNeeded\"]\n\
             allow_simulated = true\nsim_platform_keys = [\"{s}\"]\nmin_tcb_evaluation_data_number = 17\n\
             resumed_evidence_max_age = 600"
        ))
        .unwrap();
        assert!(p.allow_simulated);
        assert_eq!(p.min_tcb_evaluation_data_number, 17);
        assert_eq!(p.resumed_evidence_max_age, 600);
        assert_eq!(
            p.accepted_tcb_statuses,
            [TcbStatus::UpToDate, TcbStatus::SWHardeningNeeded]
        );
    }

    /// Claims checked once stand for resumed sessions for `resumed_evidence_max_age` seconds
    /// from the check, and no longer; the claims must pass the policy of the day as well.
    #[test]
    fn a_recheck_refuses_a_check_past_its_max_age() {
        let p = Policy {
            resumed_evidence_max_age: 100,
            ..accepting()
        };
        assert_eq!(p.resumed_evidence_valid_until(1_000), 1_100);
        assert!(crate::recheck_claims(&claims(), 1_000, 1_099, &p).is_ok());
        assert!(crate::recheck_claims(&claims(), 1_000, 900, &p).is_ok());
        assert!(matches!(
            crate::recheck_claims(&claims(), 1_000, 1_100, &p),
            Err(AttestError::EvidenceTooOld { age: 100, max: 100 })
        ));
        let none = Policy {
            resumed_evidence_max_age: 0,
            ..accepting()
        };
        assert!(crate::recheck_claims(&claims(), 1_000, 1_000, &none).is_err());
        assert_eq!(
            Policy::default().resumed_evidence_max_age,
            crate::DEFAULT_RESUMED_EVIDENCE_MAX_AGE
        );
        let stricter = Policy { min_svn: 4, ..p };
        assert!(crate::recheck_claims(&claims(), 1_000, 1_050, &stricter).is_err());
    }

    /// What the evidence rested on must still hold when its claims are used again: DCAP
    /// collateral unexpired (to its last second), a simulated platform key still trusted.
    #[test]
    fn a_recheck_refuses_expired_collateral_and_an_untrusted_platform() {
        let p = Policy {
            resumed_evidence_max_age: 100_000,
            ..accepting()
        };
        assert!(crate::recheck_claims(&claims(), 1_000, 5_000, &p).is_ok());
        assert!(matches!(
            crate::recheck_claims(&claims(), 1_000, 5_001, &p),
            Err(AttestError::CollateralExpired(5_000))
        ));
        let sim = Claims {
            tee: TeeKind::Simulated,
            tcb_status: None,
            tcb_evaluation_data_number: None,
            collateral_valid_until: None,
            collateral_issued_at: None,
            platform_key: Some(vec![9; 32]),
            ..claims()
        };
        let trusting = Policy {
            allow_simulated: true,
            sim_platform_keys: vec![HexBytes(vec![9; 32])],
            ..p
        };
        assert!(crate::recheck_claims(&sim, 1_000, 1_001, &trusting).is_ok());
        let other_platform = Policy {
            sim_platform_keys: vec![HexBytes(vec![8; 32])],
            ..trusting
        };
        assert!(matches!(
            crate::recheck_claims(&sim, 1_000, 1_001, &other_platform),
            Err(AttestError::UntrustedPlatformKey(_))
        ));
    }

    #[test]
    fn defaults_are_strict() {
        let p = Policy::from_toml_str("").unwrap();
        assert_eq!(p, Policy::default());
        assert!(p.required && !p.allow_simulated && !p.allow_debug);
        assert!(matches!(
            p.check_missing_evidence(),
            Err(AttestError::EvidenceRequired)
        ));
        assert!(Policy {
            required: false,
            ..Policy::default()
        }
        .check_missing_evidence()
        .is_ok());
    }

    #[test]
    fn rejects_bad_config() {
        for bad in [
            "measurements = [\"zz\"]",
            "measurements = [\"1234\"]",
            "sim_platform_keys = [\"1234\"]",
            "allow_simulate = true",
            "accepted_tcb_statuses = [\"Fine\"]",
            "attestation = 3",
            "min_svn = 2",
        ] {
            assert!(
                matches!(Policy::from_toml_str(bad), Err(AttestError::Policy(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn check_claims_each_rule() {
        assert!(accepting().check_claims(&claims()).is_ok());
        assert!(matches!(
            Policy::default().check_claims(&claims()),
            Err(AttestError::NoMeasurementsConfigured)
        ));
        let mut c = claims();
        c.measurement[31] ^= 1;
        assert!(matches!(
            accepting().check_claims(&c),
            Err(AttestError::MeasurementNotAllowed(_))
        ));
        let mut c = claims();
        c.signer[0] ^= 1;
        assert!(matches!(
            accepting().check_claims(&c),
            Err(AttestError::SignerNotAllowed(_))
        ));
        let mut c = claims();
        c.svn = 2;
        assert!(matches!(
            accepting().check_claims(&c),
            Err(AttestError::SvnTooLow { svn: 2, min: 3 })
        ));
        // A version floor without a signer is refused, even built in code: a high SVN under
        // any signer would pass it.
        let mut unsigned = accepting();
        unsigned.signers.clear();
        assert!(matches!(
            unsigned.check_claims(&claims()),
            Err(AttestError::Policy(why)) if why.contains("min_svn needs signers")
        ));
        let mut c = claims();
        c.debug = true;
        assert!(matches!(
            accepting().check_claims(&c),
            Err(AttestError::DebugNotAllowed)
        ));
        let mut c = claims();
        c.tcb_status = Some(TcbStatus::OutOfDate);
        assert!(matches!(
            accepting().check_claims(&c),
            Err(AttestError::TcbStatusNotAllowed(TcbStatus::OutOfDate))
        ));
        let mut c = claims();
        c.tcb_status = Some(TcbStatus::Revoked);
        let p = Policy {
            accepted_tcb_statuses: vec![TcbStatus::Revoked],
            ..accepting()
        };
        assert!(matches!(
            p.check_claims(&c),
            Err(AttestError::TcbStatusNotAllowed(TcbStatus::Revoked))
        ));
        // TCB evaluation: at the minimum passes, below it does not; simulated claims (none)
        // are not held to it.
        let p = Policy {
            min_tcb_evaluation_data_number: 17,
            ..accepting()
        };
        assert!(p.check_claims(&claims()).is_ok());
        let p = Policy {
            min_tcb_evaluation_data_number: 18,
            ..accepting()
        };
        assert!(matches!(
            p.check_claims(&claims()),
            Err(AttestError::TcbEvaluationTooOld {
                number: 17,
                min: 18
            })
        ));
        let mut c = claims();
        c.tcb_evaluation_data_number = None;
        assert!(p.check_claims(&c).is_ok());
    }

    #[test]
    fn ct_contains_requires_equal_length() {
        let list = [HexBytes(vec![1; 32])];
        assert!(ct_contains(&list, &[1; 32]));
        assert!(!ct_contains(&list, &[1; 31]));
        assert!(!ct_contains(&[], &[1; 32]));
    }
}
