//! Quote generation in an Intel TDX guest (a confidential VM) through Linux's configfs-tsm report
//! interface (`/sys/kernel/config/tsm/report`, Linux 6.7 and later).
//!
//! Protocol (Linux `Documentation/ABI/testing/configfs-tsm`): a report entry is a directory made
//! with `mkdir` (configfs fills it with its attribute files); `provider` names the TEE
//! (`tdx_guest`), the 64-byte report_data is written to `inblob`, and `outblob` reads back the
//! quote. `generation` counts the writes to the entry: read after our write and again after the
//! quote, a difference means someone else wrote in between, and that quote is not ours. Each
//! process uses its own entry (`mbx-<pid>` by default), made at start and removed at the end, and
//! its sessions quote one at a time (attesters on the same entry share it and its lock).
//!
//! The collateral comes from a file the operator keeps fresh, as with Gramine
//! ([`crate::gramine`]). This path needs TDX hardware; it **cannot be exercised on our machines**:
//! the tests use a stand-in directory.

use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use crate::binding::REPORT_DATA_LEN;
use crate::error::AttestError;
use crate::evidence::Evidence;
use crate::os_quote::{io_err, read_quote, write_report_data, CollateralFile};
use crate::verify::Attester;

/// Where configfs-tsm's report entries live.
pub const TSM_REPORT_DIR: &str = "/sys/kernel/config/tsm/report";

/// The only provider whose quotes our verifier checks (DCAP).
const TDX_PROVIDER: &str = "tdx_guest";

/// Attester for a middlebox running in an Intel TDX guest (configfs-tsm). Its evidence carries
/// the collateral compressed (evidence kind 3).
#[derive(Clone, Debug)]
pub struct TsmAttester {
    entry: Arc<Entry>,
    collateral: CollateralFile,
}

/// A report entry, used by one session at a time, removed on drop if we made it.
#[derive(Debug)]
struct Entry {
    dir: PathBuf,
    made: bool,
    quoting: Mutex<()>,
}

impl Drop for Entry {
    fn drop(&mut self) {
        if self.made {
            let _ = fs::remove_dir(&self.dir);
        }
    }
}

impl TsmAttester {
    /// This process's default report entry, `TSM_REPORT_DIR/mbx-<pid>`.
    pub fn default_entry() -> PathBuf {
        Path::new(TSM_REPORT_DIR).join(format!("mbx-{}", std::process::id()))
    }

    /// Uses the report entry `entry` (made if missing: its parent must be configfs-tsm's report
    /// directory) and the collateral JSON at `collateral_path`.
    ///
    /// Attesters of one process on the same entry share it, and its lock (a configuration
    /// reloaded makes a second attester while the first still serves): it is removed when the
    /// last of them goes, if one of them made it.
    pub fn new(
        entry: impl Into<PathBuf>,
        collateral_path: impl Into<PathBuf>,
    ) -> Result<Self, AttestError> {
        static ENTRIES: Mutex<Vec<Weak<Entry>>> = Mutex::new(Vec::new());
        let dir = entry.into();
        let mut entries = ENTRIES.lock().unwrap_or_else(PoisonError::into_inner);
        entries.retain(|e| e.strong_count() > 0);
        let shared = entries
            .iter()
            .filter_map(Weak::upgrade)
            .find(|e| e.dir == dir);
        let entry = match shared {
            Some(e) => e,
            None => {
                let made = match fs::create_dir(&dir) {
                    Ok(()) => true,
                    Err(e) if e.kind() == ErrorKind::AlreadyExists => false,
                    Err(e) if e.kind() == ErrorKind::NotFound => {
                        return Err(AttestError::NoTsmReports { path: dir })
                    }
                    Err(e) => return Err(io_err(&dir, e)),
                };
                let e = Arc::new(Entry {
                    dir,
                    made,
                    quoting: Mutex::new(()),
                });
                entries.push(Arc::downgrade(&e));
                e
            }
        };
        Ok(TsmAttester {
            entry,
            collateral: CollateralFile::new(collateral_path),
        })
    }

    fn generation(&self) -> Result<u64, AttestError> {
        let path = self.entry.dir.join("generation");
        let text = fs::read_to_string(&path).map_err(|e| io_err(&path, e))?;
        text.trim()
            .parse()
            .map_err(|_| AttestError::Malformed("configfs-tsm generation is not a number"))
    }
}

impl Attester for TsmAttester {
    /// The quote comes from the TDX module and its quoting enclave: milliseconds.
    fn blocks(&self) -> bool {
        true
    }

    fn evidence(&self, report_data: &[u8; REPORT_DATA_LEN]) -> Result<Evidence, AttestError> {
        let dir = &self.entry.dir;
        let provider_path = dir.join("provider");
        let provider = fs::read_to_string(&provider_path).map_err(|e| io_err(&provider_path, e))?;
        if provider.trim() != TDX_PROVIDER {
            return Err(AttestError::UnsupportedAttestationType(
                provider.trim().to_string(),
            ));
        }
        let quote = {
            let _one_at_a_time = self
                .entry
                .quoting
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            write_report_data(&dir.join("inblob"), report_data)?;
            let written = self.generation()?;
            let quote = read_quote(&dir.join("outblob"))?;
            if self.generation()? != written {
                return Err(AttestError::Malformed(
                    "the configfs-tsm report entry was written by someone else while quoting",
                ));
            }
            quote
        };
        self.collateral.evidence(quote)
    }
}
