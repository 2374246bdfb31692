//! The TOML configuration file. Every option here is also a flag; flags win.

use std::path::Path;

use anyhow::Context;
use serde::Deserialize;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Log filter, as `--log`.
    pub log: Option<String>,
    #[serde(default)]
    pub demo: crate::demo::DemoConfig,
    #[serde(default)]
    pub keyless: crate::keyless::KeylessConfig,
    #[serde(default)]
    pub mbtls: crate::mbtls::MbtlsConfig,
    #[serde(default)]
    pub blindbox: crate::blindbox::BlindboxConfig,
}

/// The config file's `log` at start, when it is the filter in force (no `--log`, no
/// `MBX_LOG`): the filter is set up once, so a reload that would change it is refused rather
/// than taken and ignored.
static LOG_AT_START: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();

impl Config {
    /// Remembers the loaded file's `log`, which a reload must leave as it is.
    pub fn remember_log_at_start(&self) {
        let _ = LOG_AT_START.set(self.log.clone());
    }

    /// The file loaded again for a reload: as [`load`](Self::load), and refused if its `log`
    /// changed.
    pub fn reload(path: &Path) -> anyhow::Result<Config> {
        let config = Config::load(path)?;
        if let Some(at_start) = LOG_AT_START.get() {
            let filter = |log: &Option<String>| log.as_deref().map(str::trim).map(str::to_owned);
            let shown = |log: &Option<String>| {
                filter(log).map_or_else(|| "the default".into(), |l| format!("{l:?}"))
            };
            anyhow::ensure!(
                filter(&config.log) == filter(at_start),
                "a reload cannot change log from {} to {} (the log filter is set up at start); \
                 restart to change it",
                shown(at_start),
                shown(&config.log)
            );
        }
        Ok(config)
    }

    pub fn load(path: &Path) -> anyhow::Result<Config> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read config file {}", path.display()))?;
        let mut config: Config = toml::from_str(&text).map_err(|e| {
            // A policy table at the top, where the spec's example shows it, belongs to a role.
            let hint = match e.message().contains("unknown field `attestation`") {
                true => {
                    " (an attestation policy belongs to the endpoint that checks it: \
                         [mbtls.client.attestation] or [mbtls.server.attestation], or --policy \
                         FILE)"
                }
                false => "",
            };
            anyhow::anyhow!("invalid config file {}{hint}: {e}", path.display())
        })?;
        config.mbtls.source = Some(path.to_path_buf());
        Ok(config)
    }
}
