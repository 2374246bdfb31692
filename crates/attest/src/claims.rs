//! What a verified piece of evidence says about the peer.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Which TEE produced the evidence.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TeeKind {
    /// The software simulator: no hardware protection at all.
    Simulated,
    /// Intel SGX enclave (DCAP quote).
    Sgx,
    /// Intel TDX trust domain (DCAP quote).
    Tdx,
}

impl fmt::Display for TeeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TeeKind::Simulated => "sim",
            TeeKind::Sgx => "sgx",
            TeeKind::Tdx => "tdx",
        })
    }
}

/// Intel's TCB status of the platform that produced a DCAP quote, spelled as in Intel's TCB info.
///
/// Policy lists these by name (`accepted_tcb_statuses`). `Revoked` is never accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TcbStatus {
    /// Platform is patched.
    UpToDate,
    /// Patched, but software mitigations (e.g. for LVI) are expected in the enclave.
    SWHardeningNeeded,
    /// Patched, but a platform configuration (e.g. SMT off) is needed for full protection.
    ConfigurationNeeded,
    /// Both of the above.
    ConfigurationAndSWHardeningNeeded,
    /// Microcode or firmware is out of date.
    OutOfDate,
    /// Out of date and needs configuration.
    OutOfDateConfigurationNeeded,
    /// TDX: the TD should be relaunched after a TD-preserving module update.
    TDRelaunchAdvised,
    /// TDX: relaunch advised and configuration needed.
    TDRelaunchAdvisedConfigurationNeeded,
    /// The platform's keys are revoked.
    Revoked,
}

impl TcbStatus {
    /// Every status, in the order above.
    pub const ALL: [TcbStatus; 9] = [
        TcbStatus::UpToDate,
        TcbStatus::SWHardeningNeeded,
        TcbStatus::ConfigurationNeeded,
        TcbStatus::ConfigurationAndSWHardeningNeeded,
        TcbStatus::OutOfDate,
        TcbStatus::OutOfDateConfigurationNeeded,
        TcbStatus::TDRelaunchAdvised,
        TcbStatus::TDRelaunchAdvisedConfigurationNeeded,
        TcbStatus::Revoked,
    ];

    /// Intel's name of this status.
    pub fn as_str(self) -> &'static str {
        match self {
            TcbStatus::UpToDate => "UpToDate",
            TcbStatus::SWHardeningNeeded => "SWHardeningNeeded",
            TcbStatus::ConfigurationNeeded => "ConfigurationNeeded",
            TcbStatus::ConfigurationAndSWHardeningNeeded => "ConfigurationAndSWHardeningNeeded",
            TcbStatus::OutOfDate => "OutOfDate",
            TcbStatus::OutOfDateConfigurationNeeded => "OutOfDateConfigurationNeeded",
            TcbStatus::TDRelaunchAdvised => "TDRelaunchAdvised",
            TcbStatus::TDRelaunchAdvisedConfigurationNeeded => {
                "TDRelaunchAdvisedConfigurationNeeded"
            }
            TcbStatus::Revoked => "Revoked",
        }
    }
}

impl fmt::Display for TcbStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for TcbStatus {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "UpToDate" => TcbStatus::UpToDate,
            "SWHardeningNeeded" => TcbStatus::SWHardeningNeeded,
            "ConfigurationNeeded" => TcbStatus::ConfigurationNeeded,
            "ConfigurationAndSWHardeningNeeded" => TcbStatus::ConfigurationAndSWHardeningNeeded,
            "OutOfDate" => TcbStatus::OutOfDate,
            "OutOfDateConfigurationNeeded" => TcbStatus::OutOfDateConfigurationNeeded,
            "TDRelaunchAdvised" => TcbStatus::TDRelaunchAdvised,
            "TDRelaunchAdvisedConfigurationNeeded" => {
                TcbStatus::TDRelaunchAdvisedConfigurationNeeded
            }
            "Revoked" => TcbStatus::Revoked,
            other => return Err(format!("unknown TCB status {other:?}")),
        })
    }
}

/// Verified facts about the attested peer, returned only after every check passed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    /// Which TEE produced the evidence.
    pub tee: TeeKind,
    /// Code measurement: MRENCLAVE (SGX, 32 bytes), the hash of MRTD, MRCONFIGID, MROWNER,
    /// MROWNERCONFIG and RTMR0–3 (TDX, 48 bytes; docs/foundation.md) or the simulated hash.
    pub measurement: Vec<u8>,
    /// Signer measurement: MRSIGNER (SGX) or the simulated signer; empty for TDX, which has none.
    pub signer: Vec<u8>,
    /// ISV product id (SGX) or the simulated one; 0 for TDX.
    pub product_id: u16,
    /// ISV security version (SGX) or the simulated one; 0 for TDX.
    pub svn: u16,
    /// The TEE runs in debug mode: the host can read its memory.
    pub debug: bool,
    /// Platform TCB status; `None` for simulated evidence, which has no platform to appraise.
    pub tcb_status: Option<TcbStatus>,
    /// Intel security advisories that apply to the platform's TCB level (DCAP only).
    pub advisory_ids: Vec<String>,
    /// The lower of the collateral's TCB info and QE identity `tcbEvaluationDataNumber` (DCAP
    /// only): which of Intel's TCB appraisals `tcb_status` comes from; it grows with every TCB
    /// recovery, so a minimum refuses collateral from before one.
    pub tcb_evaluation_data_number: Option<u32>,
    /// The simulated platform's Ed25519 key that signed the evidence (simulated only): a
    /// later use of these claims ([`crate::recheck_claims`]) requires the policy to trust it
    /// still.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform_key: Option<Vec<u8>>,
    /// The last second (since the Unix epoch) at which the evidence's collateral is valid, the
    /// earliest `nextUpdate`/`notAfter` of its TCB info, QE identity, CRLs and certificates
    /// (DCAP only): the evidence would not verify after it, so neither do these claims
    /// ([`crate::recheck_claims`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collateral_valid_until: Option<u64>,
    /// When (seconds since the Unix epoch) the oldest part of the evidence's collateral was
    /// issued (DCAP only): what a policy's `max_collateral_age` bounds, since the collateral,
    /// revocation lists included, is the attester's to send and stays valid for weeks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collateral_issued_at: Option<u64>,
}

impl fmt::Display for Claims {
    /// One line, e.g. `tee=sgx measurement=ab.. signer=cd.. product_id=0 svn=1 debug=false tcb=UpToDate`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "tee={} measurement={}",
            self.tee,
            hex::encode(&self.measurement)
        )?;
        if self.signer.is_empty() {
            f.write_str(" signer=-")?;
        } else {
            write!(f, " signer={}", hex::encode(&self.signer))?;
        }
        write!(
            f,
            " product_id={} svn={} debug={} tcb=",
            self.product_id, self.svn, self.debug
        )?;
        match self.tcb_status {
            Some(s) => write!(f, "{s}")?,
            None => f.write_str("n/a")?,
        }
        if let Some(n) = self.tcb_evaluation_data_number {
            write!(f, " tcb_evaluation={n}")?;
        }
        if !self.advisory_ids.is_empty() {
            write!(f, " advisories={}", self.advisory_ids.join(","))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tcb_status_names_round_trip() {
        for s in TcbStatus::ALL {
            assert_eq!(s.as_str().parse::<TcbStatus>(), Ok(s));
        }
        assert!("uptodate".parse::<TcbStatus>().is_err());
    }

    #[test]
    fn display_is_one_line() {
        let c = Claims {
            tee: TeeKind::Tdx,
            measurement: vec![0xab; 2],
            signer: vec![],
            product_id: 0,
            svn: 0,
            debug: false,
            tcb_status: Some(TcbStatus::UpToDate),
            advisory_ids: vec!["INTEL-SA-1".into()],
            tcb_evaluation_data_number: Some(17),
            platform_key: None,
            collateral_valid_until: Some(1_900_000_000),
            collateral_issued_at: None,
        };
        assert_eq!(
            c.to_string(),
            "tee=tdx measurement=abab signer=- product_id=0 svn=0 debug=false tcb=UpToDate tcb_evaluation=17 advisories=INTEL-SA-1"
        );
    }
}
