//! Small pieces every system's subcommands share: merging flags into a config table, reading
//! files with a clear error, the async runtime and TLS version names.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use mbx_record::TlsVersion;

/// Sets `key` in a config table when a flag gave it (flags win over the config file).
pub fn set(table: &mut toml::Table, key: &str, value: Option<String>) {
    if let Some(v) = value {
        table.insert(key.into(), toml::Value::String(v));
    }
}

pub fn path_str(p: Option<PathBuf>) -> Option<String> {
    p.map(|p| p.display().to_string())
}

/// The multi-threaded runtime the drivers need (some move CPU work off the I/O threads).
pub fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

pub fn read(path: &Path, what: &str) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("cannot read {what} {}", path.display()))
}

/// `1.2` or `1.3`, as flags and config files spell TLS versions.
pub fn parse_version(s: &str) -> anyhow::Result<TlsVersion> {
    match s {
        "1.2" => Ok(TlsVersion::Tls12),
        "1.3" => Ok(TlsVersion::Tls13),
        other => bail!("unknown TLS version {other:?} (use 1.2 or 1.3)"),
    }
}
