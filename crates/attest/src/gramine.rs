//! Quote generation inside a Gramine SGX enclave, through its `/dev/attestation` pseudo-files.
//!
//! Protocol (Gramine "attestation" docs): read `attestation_type` (must be `dcap`), write the 64-byte
//! report_data to `user_report_data`, then read `quote`, which Gramine produces via the quoting
//! enclave. The collateral that makes the evidence verifiable offline cannot be produced inside the
//! enclave without network access, so it is read from a file that the operator keeps fresh (e.g. a
//! periodic PCCS fetch by a helper outside the middlebox).
//!
//! `user_report_data` is one value for the whole enclave, so the write and the read of `quote` are
//! done under one process-wide lock: two sessions quoting at once would otherwise each get a quote
//! for whichever report_data was written last, and one of them would be refused by its endpoint.
//!
//! This path needs SGX hardware and Gramine; it **cannot be exercised on our machines**. The
//! failures outside Gramine are tested, and the locking against a stand-in `/dev/attestation`
//! (FIFOs served by threads) that quotes the report_data written last.

use std::fs;
use std::io::ErrorKind;
use std::path::PathBuf;
use std::sync::{Mutex, PoisonError};

use crate::binding::REPORT_DATA_LEN;
use crate::error::AttestError;
use crate::evidence::Evidence;
use crate::os_quote::{io_err, read_quote, write_report_data, CollateralFile};
use crate::verify::Attester;

/// Held from writing `user_report_data` until `quote` is read (process-wide, as Gramine's state is).
static QUOTING: Mutex<()> = Mutex::new(());

/// Where Gramine mounts its attestation pseudo-files.
pub const GRAMINE_ATTESTATION_DIR: &str = "/dev/attestation";

/// Attester for a middlebox running in a Gramine SGX enclave with DCAP. Its evidence carries the
/// collateral compressed (evidence kind 3), compressed once for as long as the file's bytes stay
/// the same.
#[derive(Clone, Debug)]
pub struct GramineAttester {
    dir: PathBuf,
    collateral: CollateralFile,
}

impl GramineAttester {
    /// Use `/dev/attestation` and the collateral JSON at `collateral_path`.
    pub fn new(collateral_path: impl Into<PathBuf>) -> Self {
        GramineAttester {
            dir: PathBuf::from(GRAMINE_ATTESTATION_DIR),
            collateral: CollateralFile::new(collateral_path),
        }
    }

    /// Use another directory than `/dev/attestation` (for tests of the failure paths).
    pub fn with_attestation_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.dir = dir.into();
        self
    }
}

impl Attester for GramineAttester {
    /// Gramine's quote comes from Intel's quoting enclave, and sessions quote one at a time.
    fn blocks(&self) -> bool {
        true
    }

    fn evidence(&self, report_data: &[u8; REPORT_DATA_LEN]) -> Result<Evidence, AttestError> {
        let type_path = self.dir.join("attestation_type");
        let attestation_type = match fs::read_to_string(&type_path) {
            Ok(t) => t,
            Err(e) if e.kind() == ErrorKind::NotFound => {
                return Err(AttestError::NotInsideGramine { path: type_path })
            }
            Err(e) => return Err(io_err(&type_path, e)),
        };
        let attestation_type = attestation_type.trim();
        if attestation_type != "dcap" {
            return Err(AttestError::UnsupportedAttestationType(
                attestation_type.to_string(),
            ));
        }

        let quote = {
            // `user_report_data` is one value for the whole enclave: between our write and our
            // read of `quote`, no other session of this process may write its own.
            let _one_at_a_time = QUOTING.lock().unwrap_or_else(PoisonError::into_inner);
            write_report_data(&self.dir.join("user_report_data"), report_data)?;
            read_quote(&self.dir.join("quote"))?
        };
        self.collateral.evidence(quote)
    }
}
