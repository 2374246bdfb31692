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

impl Config {
    pub fn load(path: &Path) -> anyhow::Result<Config> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read config file {}", path.display()))?;
        toml::from_str(&text).map_err(|e| {
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
        })
    }
}
