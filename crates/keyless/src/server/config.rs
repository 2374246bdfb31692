//! The key server's TOML configuration.
//!
//! ```toml
//! listen = "0.0.0.0:2407"
//! key_dir = "/etc/mbx/keyless/keys"
//! certificate = "/etc/mbx/keyless/server.chain.pem"
//! private_key = "/etc/mbx/keyless/server.key"
//! edge_ca = "/etc/mbx/keyless/edge-ca.pem"
//! max_body_length = 16384
//! workers = 0                       # 0: one per core
//! max_in_flight_per_connection = 256
//! metrics_listen = "127.0.0.1:9407"  # optional: Prometheus text on plain HTTP
//!
//! [[pkcs11]]                       # optional, repeatable: keys on a PKCS#11 token
//! module = "/usr/lib/softhsm/libsofthsm2.so"
//! token_label = "keyless"
//! pin_file = "/etc/mbx/keyless/token.pin"
//!
//! [deny]
//! sha256 = ["3f1c…"]                # SHA-256 of the DER certificate
//! serials = ["01:23:…"]
//!
//! [edges."edge-1.cdn.example"]
//! skis = ["a1b2…"]                  # 40 hex digits
//! hostnames = ["www.example.com"]
//! ```

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use serde::Deserialize;

use crate::pkcs11::Pkcs11Config;
use crate::server::authz::EdgeGrant;
use crate::wire::DEFAULT_MAX_BODY_LEN;

/// Default TCP port of the key-server protocol.
pub const DEFAULT_PORT: u16 = 2407;

fn default_listen() -> SocketAddr {
    SocketAddr::from(([0, 0, 0, 0], DEFAULT_PORT))
}

fn default_max_body() -> usize {
    DEFAULT_MAX_BODY_LEN
}

fn default_in_flight() -> usize {
    256
}

/// Certificates refused at the handshake even though they chain to the edge CA.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct DenyConfig {
    /// SHA-256 fingerprints of DER certificates, hex (colons allowed).
    #[serde(default)]
    pub sha256: Vec<String>,
    /// Serial numbers, hex (colons allowed).
    #[serde(default)]
    pub serials: Vec<String>,
}

/// Everything the key server needs to start.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    /// Address to listen on (default `0.0.0.0:2407`).
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// Directory of private keys and certificates (see [`crate::keys::KeyStore::load_dir`]).
    pub key_dir: PathBuf,
    /// The key server's own certificate chain (PEM).
    pub certificate: PathBuf,
    /// The key server's own private key (PEM).
    pub private_key: PathBuf,
    /// CA certificates (PEM) that issue edge client certificates.
    pub edge_ca: PathBuf,
    /// Largest request body; a longer header closes the connection.
    #[serde(default = "default_max_body")]
    pub max_body_length: usize,
    /// Worker threads for key operations; 0 means one per core.
    #[serde(default)]
    pub workers: usize,
    /// Requests one connection may have in progress before we stop reading from it.
    #[serde(default = "default_in_flight")]
    pub max_in_flight_per_connection: usize,
    /// Plain-HTTP address serving `GET /metrics` (Prometheus text); none by default.
    #[serde(default)]
    pub metrics_listen: Option<SocketAddr>,
    /// PKCS#11 tokens whose private keys are served next to those of `key_dir`.
    #[serde(default)]
    pub pkcs11: Vec<Pkcs11Config>,
    /// Deny list.
    #[serde(default)]
    pub deny: DenyConfig,
    /// Edge identity → keys it may use.
    #[serde(default)]
    pub edges: BTreeMap<String, EdgeGrant>,
}

impl ServerConfig {
    /// Parses the TOML text.
    pub fn from_toml(text: &str) -> Result<ServerConfig, toml::de::Error> {
        toml::from_str(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_documented_example_and_applies_defaults() {
        let c = ServerConfig::from_toml(
            r#"
            key_dir = "/k"
            certificate = "/c.pem"
            private_key = "/k.pem"
            edge_ca = "/ca.pem"
            [deny]
            serials = ["01:02"]
            [edges."edge-1"]
            skis = ["00"]
            hostnames = ["a.example"]
            "#,
        )
        .unwrap();
        assert_eq!(c.listen.port(), DEFAULT_PORT);
        assert_eq!(c.max_body_length, DEFAULT_MAX_BODY_LEN);
        assert_eq!(c.workers, 0);
        assert_eq!(c.deny.serials, ["01:02"]);
        assert_eq!(c.edges["edge-1"].hostnames, ["a.example"]);
        assert!(ServerConfig::from_toml("key_dir = 1").is_err());
        assert!(ServerConfig::from_toml(
            "key_dir='a'\ncertificate='b'\nprivate_key='c'\nedge_ca='d'\nbogus=1"
        )
        .is_err());
    }
}
