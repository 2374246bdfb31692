//! A platform's DCAP collateral as the operator keeps it: a file, read again for every quote (a
//! helper outside the TEE refreshes it from a PCCS), compressed once for as long as its bytes stay
//! the same. Shared by the attesters that quote through the OS (Gramine, configfs-tsm).

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use crate::error::AttestError;
use crate::evidence::{Collateral, MAX_COLLATERAL_LEN};

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
}

pub(crate) fn io_err(path: &Path, source: std::io::Error) -> AttestError {
    AttestError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Read at most `max` bytes; a longer file is an error rather than a silent truncation.
pub(crate) fn read_limited(
    path: &Path,
    what: &'static str,
    max: usize,
) -> Result<Vec<u8>, AttestError> {
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
