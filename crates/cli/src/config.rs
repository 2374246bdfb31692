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
        toml::from_str(&text).with_context(|| format!("invalid config file {}", path.display()))
    }
}
