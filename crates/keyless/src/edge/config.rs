//! The edge server's TOML configuration.
//!
//! ```toml
//! listen = "0.0.0.0:443"
//! handshake_workers = 64          # bounded pool for handshake steps that may sign remotely
//! handshake_timeout_ms = 30000
//! origin_timeout_ms = 30000
//! idle_timeout_ms = 60000          # a connection waiting for (the rest of) a request
//! ticket_lifetime_secs = 43200
//! max_body_bytes = 16777216        # request and origin response bodies
//! cache_max_bytes = 67108864
//! cache_max_entry_bytes = 8388608
//!
//! [key_servers.main]               # a group of key servers holding the same keys
//! addresses = ["10.0.0.1:2407", "10.0.0.2:2407"]
//! server_name = "keyserver.example" # name in the key servers' certificates
//! ca = "keyserver-ca.pem"
//! certificate = "edge.chain.pem"    # this edge's client certificate (PEM chain) …
//! private_key = "edge.key"          # … and key
//! connections = 2                   # per key server
//! timeout_ms = 5000                 # per operation and key server
//! health_interval_ms = 2000
//!
//! [origins.shop]
//! address = "10.1.0.1:8080"
//! ticket_key_file = "tickets/shop.key"  # 64 hex digits, shared by the edges of this origin only
//! keepalive_connections = 4         # idle keep-alive connections kept (0: one per request)
//! keepalive_idle_ms = 4000          # an idle connection is not reused after this long
//!
//! [sites."www.shop.example"]        # the SNI name
//! certificate = "www.shop.example.chain.pem"
//! key_server = "main"
//! origin = "shop"
//! ```

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use serde::Deserialize;

fn default_listen() -> SocketAddr {
    SocketAddr::from(([0, 0, 0, 0], 443))
}
fn default_workers() -> usize {
    64
}
fn default_30s() -> u64 {
    30_000
}
fn default_idle() -> u64 {
    60_000
}
fn default_ticket_lifetime() -> u32 {
    12 * 60 * 60
}
fn default_max_body() -> usize {
    16 << 20
}
fn default_cache_bytes() -> usize {
    64 << 20
}
fn default_cache_entry() -> usize {
    8 << 20
}
fn default_connections() -> usize {
    2
}
fn default_op_timeout() -> u64 {
    5_000
}
fn default_health() -> u64 {
    2_000
}
fn default_keepalive_connections() -> usize {
    crate::edge::origin::DEFAULT_IDLE_CONNECTIONS
}
fn default_keepalive_idle() -> u64 {
    crate::edge::origin::DEFAULT_IDLE_TIMEOUT.as_millis() as u64
}

/// A group of interchangeable key servers.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct KeyServerGroupConfig {
    /// Key server addresses, tried in turn.
    pub addresses: Vec<SocketAddr>,
    /// The DNS name the key servers' certificates carry.
    pub server_name: String,
    /// CA certificates (PEM) that issue the key servers' certificates.
    pub ca: PathBuf,
    /// This edge's client certificate chain (PEM).
    pub certificate: PathBuf,
    /// This edge's client private key (PEM).
    pub private_key: PathBuf,
    /// Persistent connections per key server.
    #[serde(default = "default_connections")]
    pub connections: usize,
    /// Bound on one operation against one key server, milliseconds.
    #[serde(default = "default_op_timeout")]
    pub timeout_ms: u64,
    /// Pause between health-check pings, milliseconds.
    #[serde(default = "default_health")]
    pub health_interval_ms: u64,
}

/// An origin server.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct OriginConfig {
    /// Address of the origin's plain HTTP/1.1 listener.
    pub address: SocketAddr,
    /// Session-ticket key shared by the edges of this origin (none: a random key per process).
    #[serde(default)]
    pub ticket_key_file: Option<PathBuf>,
    /// Idle keep-alive connections kept for reuse; 0: a new connection per request, sent with
    /// `Connection: close`.
    #[serde(default = "default_keepalive_connections")]
    pub keepalive_connections: usize,
    /// An idle connection is not reused after this long, milliseconds (keep it below the
    /// origin's own keep-alive timeout).
    #[serde(default = "default_keepalive_idle")]
    pub keepalive_idle_ms: u64,
}

/// A site, selected by its SNI name (the table key).
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct SiteConfig {
    /// The site's certificate chain (PEM, leaf first); its key is found by the leaf's SKI.
    pub certificate: PathBuf,
    /// Name of the key-server group that holds the key.
    pub key_server: String,
    /// Name of the origin behind the site.
    pub origin: String,
}

/// Everything the edge needs to start.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct EdgeConfig {
    /// Address to listen on (default `0.0.0.0:443`).
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// Handshake steps run at once on the blocking pool.
    #[serde(default = "default_workers")]
    pub handshake_workers: usize,
    /// Bound on a whole TLS handshake, milliseconds.
    #[serde(default = "default_30s")]
    pub handshake_timeout_ms: u64,
    /// Bound on one origin exchange, milliseconds.
    #[serde(default = "default_30s")]
    pub origin_timeout_ms: u64,
    /// Bound on waiting for the next request bytes on a client connection, milliseconds.
    #[serde(default = "default_idle")]
    pub idle_timeout_ms: u64,
    /// Lifetime advertised in session tickets, seconds.
    #[serde(default = "default_ticket_lifetime")]
    pub ticket_lifetime_secs: u32,
    /// Largest request or origin-response body.
    #[serde(default = "default_max_body")]
    pub max_body_bytes: usize,
    /// Cache size bound in bytes.
    #[serde(default = "default_cache_bytes")]
    pub cache_max_bytes: usize,
    /// Largest cached response.
    #[serde(default = "default_cache_entry")]
    pub cache_max_entry_bytes: usize,
    /// Key-server groups by name.
    #[serde(default)]
    pub key_servers: BTreeMap<String, KeyServerGroupConfig>,
    /// Origins by name.
    #[serde(default)]
    pub origins: BTreeMap<String, OriginConfig>,
    /// Sites by SNI name.
    #[serde(default)]
    pub sites: BTreeMap<String, SiteConfig>,
}

impl EdgeConfig {
    /// Parses the TOML text.
    pub fn from_toml(text: &str) -> Result<EdgeConfig, toml::de::Error> {
        toml::from_str(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_documented_example_with_defaults() {
        let c = EdgeConfig::from_toml(
            r#"
            [key_servers.main]
            addresses = ["127.0.0.1:2407"]
            server_name = "ks"
            ca = "ca.pem"
            certificate = "e.pem"
            private_key = "e.key"
            [origins.shop]
            address = "127.0.0.1:8080"
            [sites."www.shop.example"]
            certificate = "w.pem"
            key_server = "main"
            origin = "shop"
            "#,
        )
        .unwrap();
        assert_eq!(c.listen.port(), 443);
        assert_eq!(c.key_servers["main"].timeout_ms, 5000);
        assert_eq!(c.origins["shop"].ticket_key_file, None);
        assert_eq!(c.origins["shop"].keepalive_connections, 4);
        assert_eq!(c.origins["shop"].keepalive_idle_ms, 4000);
        assert_eq!(c.sites["www.shop.example"].origin, "shop");
        assert!(EdgeConfig::from_toml("bogus = 1").is_err());
    }
}
