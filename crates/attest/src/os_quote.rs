//! What the attesters that quote through the OS (Gramine's `/dev/attestation`, configfs-tsm)
//! share: writing the report_data to a pseudo-file, reading the quote back within its limit, and
//! the platform's DCAP collateral as the operator keeps it, a file read again for every quote (a
//! helper outside the TEE refreshes it from a PCCS), compressed once for as long as its bytes stay
//! the same.

use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use crate::binding::REPORT_DATA_LEN;
use crate::error::AttestError;
use crate::evidence::{Collateral, DcapEvidence, Evidence, MAX_COLLATERAL_LEN, MAX_QUOTE_LEN};

/// The collateral file of an attester.
#[derive(Clone, Debug)]
pub(crate) struct CollateralFile {
    path: PathBuf,
    compressed: Arc<Mutex<Option<Compressed>>>,
}

/// The file's bytes last read, and their compressed form.
type Compressed = (Vec<u8>, Collateral);

impl CollateralFile {
    pub(crate) fn new(path: impl Into<PathBuf>) -> Self {
        CollateralFile {
            path: path.into(),
            compressed: Arc::default(),
        }
    }

    /// The file, compressed (again only if its bytes changed).
    pub(crate) fn collateral(&self) -> Result<Collateral, AttestError> {
        let json = read_limited(&self.path, "collateral", MAX_COLLATERAL_LEN)?;
        let mut cached = self
            .compressed
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match &*cached {
            Some((raw, c)) if *raw == json => Ok(c.clone()),
            _ => {
                let c = Collateral::deflate(&json)?;
                *cached = Some((json, c.clone()));
                Ok(c)
            }
        }
    }

    /// `quote` as evidence, with the collateral.
    pub(crate) fn evidence(&self, quote: Vec<u8>) -> Result<Evidence, AttestError> {
        let collateral = self.collateral()?;
        Ok(Evidence::Dcap(DcapEvidence::with_collateral(
            quote, collateral,
        )?))
    }
}

/// Writes the report_data to the pseudo-file the OS provides for it; never creates a regular
/// file in its place.
pub(crate) fn write_report_data(
    path: &Path,
    report_data: &[u8; REPORT_DATA_LEN],
) -> Result<(), AttestError> {
    fs::OpenOptions::new()
        .write(true)
        .open(path)
        .and_then(|mut f| f.write_all(report_data))
        .map_err(|e| io_err(path, e))
}

/// The quote the OS made, within [`MAX_QUOTE_LEN`].
pub(crate) fn read_quote(path: &Path) -> Result<Vec<u8>, AttestError> {
    read_limited(path, "quote", MAX_QUOTE_LEN)
}

pub(crate) fn io_err(path: &Path, error: std::io::Error) -> AttestError {
    AttestError::Io {
        path: path.to_path_buf(),
        error,
    }
}

/// Read at most `max` bytes; a longer file is an error rather than a silent truncation.
fn read_limited(path: &Path, what: &'static str, max: usize) -> Result<Vec<u8>, AttestError> {
    let file = fs::File::open(path).map_err(|e| io_err(path, e))?;
    let mut buf = Vec::new();
    file.take(max as u64 + 1)
        .read_to_end(&mut buf)
        .map_err(|e| io_err(path, e))?;
    if buf.len() > max {
        return Err(AttestError::TooLarge {
            what,
            len: buf.len(),
            max,
        });
    }
    Ok(buf)
}
