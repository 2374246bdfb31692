//! Shared helpers for the integration tests (included with `mod`).
#![allow(dead_code)]

use std::path::PathBuf;

/// The Snort community rules, read in place from the shared data directory.
pub fn community_rules() -> String {
    let path = std::env::var_os("MBX_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared"))
        .join("data/snort-community/community.rules");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}
