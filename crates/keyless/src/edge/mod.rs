//! The Keyless SSL edge: terminates clients' TLS with the sites' certificates while every
//! private-key operation is done by key servers, then serves HTTP/1.1 from a cache or the origin.
//!
//! * [`config`]: the TOML configuration.
//! * [`pool`]: pooled, health-checked connections to groups of key servers, with failover.
//! * [`signer`]: the remote rustls `SigningKey` (scheme → opcode, digest on the edge).
//! * [`sites`]: sites by SNI name and the certificate resolver; Host-name matching.
//! * [`tickets`]: per-origin session-ticket keys.
//! * [`conn`]: the rustls driver that runs signing steps on a bounded blocking pool.
//! * [`http`], [`cache`], [`origin`]: the small caching reverse proxy.

pub mod cache;
pub mod config;
pub mod conn;
pub mod http;
pub mod origin;
pub mod pool;
pub mod signer;
pub mod sites;
pub mod tickets;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mbx_net::Acceptor;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::ServerName;
use rustls::server::NoServerSessionStorage;
use rustls::SupportedCipherSuite;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

pub use self::config::{EdgeConfig, KeyServerGroupConfig, OriginConfig, SiteConfig};
pub use self::pool::{KeyServerPool, PoolError, PoolOptions};
pub use self::signer::{RemoteSigningKey, SiteKeyKind};
pub use self::sites::{Site, SiteSet, SniResolver};
pub use self::tickets::{TicketKey, TicketKeyError};

use self::cache::{may_use_cache, storable_lifetime, Cache, CachedResponse};
use self::conn::TlsConn;
use self::http::{Framing, RequestHead};
use crate::client::KeyId;
use crate::tls::{self, TlsSetupError};
use crate::x509;

/// Errors starting the edge.
#[derive(Debug, thiserror::Error)]
pub enum EdgeError {
    /// A certificate or key file is unusable, or rustls refused a configuration.
    #[error(transparent)]
    Tls(#[from] TlsSetupError),
    /// rustls refused a configuration.
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
    /// A ticket key is unusable.
    #[error(transparent)]
    Ticket(#[from] TicketKeyError),
    /// The configuration is inconsistent.
    #[error("edge configuration: {0}")]
    Config(String),
    /// Binding failed.
    #[error("socket: {0}")]
    Io(#[from] std::io::Error),
}

/// Counters of a running edge.
#[derive(Debug, Default)]
pub struct EdgeStats {
    /// Completed TLS handshakes.
    pub handshakes: AtomicU64,
    /// Failed TLS handshakes.
    pub handshake_failures: AtomicU64,
    /// Failed `accept` calls (out of descriptors and the like; each is followed by a pause,
    /// `mbx_net::Acceptor`).
    pub accept_errors: Arc<AtomicU64>,
    /// Requests refused because the Host is not a name of the connection's certificate.
    pub misdirected: AtomicU64,
    /// Responses served from the cache.
    pub cache_hits: AtomicU64,
    /// Requests forwarded to an origin.
    pub origin_requests: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// An origin: where requests go, and the TLS configuration carrying its ticket key.
#[derive(Debug)]
struct Origin {
    name: String,
    /// The origin's address and its idle keep-alive connections.
    pool: origin::OriginPool,
    tls: Arc<rustls::ServerConfig>,
}

/// Limits and timeouts.
#[derive(Debug, Clone)]
pub struct EdgeOptions {
    /// Handshake steps on the blocking pool at once.
    pub handshake_workers: usize,
    /// Bound on a whole handshake.
    pub handshake_timeout: Duration,
    /// Bound on one origin exchange.
    pub origin_timeout: Duration,
    /// Bound on waiting for request bytes from a client.
    pub idle_timeout: Duration,
    /// Largest request or origin-response body.
    pub max_body: usize,
    /// Cache bound in bytes.
    pub cache_max_bytes: usize,
    /// Largest cached entry.
    pub cache_max_entry: usize,
    /// Advertised ticket lifetime, seconds.
    pub ticket_lifetime: u32,
}

impl EdgeOptions {
    fn from_config(c: &EdgeConfig) -> EdgeOptions {
        EdgeOptions {
            handshake_workers: c.handshake_workers.max(1),
            handshake_timeout: Duration::from_millis(c.handshake_timeout_ms),
            origin_timeout: Duration::from_millis(c.origin_timeout_ms),
            idle_timeout: Duration::from_millis(c.idle_timeout_ms),
            max_body: c.max_body_bytes,
            cache_max_bytes: c.cache_max_bytes,
            cache_max_entry: c.cache_max_entry_bytes,
            ticket_lifetime: c.ticket_lifetime_secs,
        }
    }
}

/// The ring provider restricted to forward-secret suites (TLS 1.3, and ECDHE for TLS 1.2).
pub fn forward_secret_provider() -> CryptoProvider {
    let mut provider = rustls::crypto::ring::default_provider();
    provider.cipher_suites.retain(|s| match s {
        SupportedCipherSuite::Tls13(_) => true,
        SupportedCipherSuite::Tls12(s) => s.kx == rustls::crypto::KeyExchangeAlgorithm::ECDHE,
    });
    provider
}

/// The client-facing TLS configuration of one origin: TLS 1.3 and 1.2, forward-secret suites,
/// certificate by SNI over `sites`, tickets sealed with `tickets` and no server-side session
/// cache (so resumption works exactly where the ticket key is shared).
pub fn origin_tls_config(
    sites: Arc<SiteSet>,
    tickets: Arc<TicketKey>,
) -> Result<Arc<rustls::ServerConfig>, EdgeError> {
    let mut config =
        rustls::ServerConfig::builder_with_provider(Arc::new(forward_secret_provider()))
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(SniResolver::new(sites)));
    config.ticketer = tickets;
    config.session_storage = Arc::new(NoServerSessionStorage {});
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// A configured edge, ready to listen.
#[derive(Debug)]
pub struct Edge {
    sites: Arc<SiteSet>,
    origins: Vec<Origin>,
    pools: Vec<Arc<KeyServerPool>>,
    cache: Mutex<Cache>,
    slots: Arc<Semaphore>,
    options: EdgeOptions,
    stats: Arc<EdgeStats>,
}

impl Edge {
    /// Builds the edge from its configuration: loads certificates, computes each site's SKI and
    /// key kind, sets up the key-server pools (with health checks) and the origins' ticket keys.
    /// Must be called within a tokio runtime, which the remote signers use.
    pub fn from_config(config: &EdgeConfig) -> Result<Edge, EdgeError> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
            EdgeError::Config("the edge must be built inside a tokio runtime".into())
        })?;
        let options = EdgeOptions::from_config(config);
        if config.sites.is_empty() {
            return Err(EdgeError::Config("no site configured".into()));
        }
        // Key-server groups.
        let mut pools = HashMap::new();
        for (name, g) in &config.key_servers {
            if g.addresses.is_empty() {
                return Err(EdgeError::Config(format!(
                    "key server group {name:?} has no address"
                )));
            }
            let server_name = ServerName::try_from(g.server_name.clone()).map_err(|_| {
                EdgeError::Config(format!("key server group {name:?}: bad server_name"))
            })?;
            let tls = tls::client_config(
                &tls::load_certificates(&g.ca)?,
                Some((
                    tls::load_certificates(&g.certificate)?,
                    tls::load_private_key(&g.private_key)?,
                )),
                &[],
            )?;
            let pool = Arc::new(KeyServerPool::new(
                name,
                &g.addresses,
                server_name,
                tls,
                PoolOptions {
                    connections_per_server: g.connections,
                    operation_timeout: Duration::from_millis(g.timeout_ms),
                    health_interval: Duration::from_millis(g.health_interval_ms),
                },
            ));
            pool.start_health_checks();
            pools.insert(name.clone(), pool);
        }
        // Origins; ticket keys are never shared between origins.
        let mut origin_index = HashMap::new();
        let mut ticket_keys: Vec<(String, Arc<TicketKey>)> = Vec::new();
        let mut seen_files: HashMap<PathBuf, String> = HashMap::new();
        for (name, o) in &config.origins {
            let key = match &o.ticket_key_file {
                Some(path) => {
                    let canonical = std::fs::canonicalize(path).unwrap_or_else(|_| path.clone());
                    if let Some(other) = seen_files.insert(canonical, name.clone()) {
                        return Err(EdgeError::Config(format!(
                            "origins {other:?} and {name:?} share a ticket key file; ticket keys must not cross origins"
                        )));
                    }
                    TicketKey::load(path, options.ticket_lifetime)?
                }
                None => TicketKey::random(options.ticket_lifetime)?,
            };
            if let Some((other, _)) = ticket_keys.iter().find(|(_, k)| k.name() == key.name()) {
                return Err(EdgeError::Config(format!(
                    "origins {other:?} and {name:?} have the same ticket key; ticket keys must not cross origins"
                )));
            }
            origin_index.insert(name.clone(), ticket_keys.len());
            ticket_keys.push((name.clone(), Arc::new(key)));
        }
        // Sites.
        let mut sites = SiteSet::new();
        for (sni, s) in &config.sites {
            let chain = tls::load_certificates(&s.certificate)?;
            let leaf = chain
                .first()
                .ok_or_else(|| EdgeError::Config(format!("site {sni:?}: empty chain")))?;
            let bad = |e: x509::ParseError| EdgeError::Config(format!("site {sni:?}: {e}"));
            let ski = x509::ski_from_certificate(leaf).map_err(bad)?;
            let kind = sites::key_kind(leaf).map_err(bad)?;
            let names = x509::certificate_names(leaf).map_err(bad)?;
            let lower = sni.trim_end_matches('.').to_ascii_lowercase();
            if !names.iter().any(|n| sites::name_matches(n, &lower)) {
                return Err(EdgeError::Config(format!(
                    "site {sni:?}: the certificate does not cover this name ({names:?})"
                )));
            }
            let pool = pools.get(&s.key_server).ok_or_else(|| {
                EdgeError::Config(format!(
                    "site {sni:?}: unknown key server group {:?}",
                    s.key_server
                ))
            })?;
            let origin = *origin_index.get(&s.origin).ok_or_else(|| {
                EdgeError::Config(format!("site {sni:?}: unknown origin {:?}", s.origin))
            })?;
            let key = RemoteSigningKey::new(
                &lower,
                KeyId::ski(ski),
                kind,
                Arc::clone(pool),
                runtime.clone(),
            );
            sites.insert(Site {
                sni: lower,
                certified: Arc::new(rustls::sign::CertifiedKey::new(chain, Arc::new(key))),
                names,
                origin,
            });
            tracing::info!(site = %sni, ski = %hex::encode(ski), ?kind, "site configured");
        }
        let sites = Arc::new(sites);
        let mut origins = Vec::new();
        for (name, key) in ticket_keys {
            let o = config
                .origins
                .get(&name)
                .ok_or_else(|| EdgeError::Config(format!("origin {name:?} vanished")))?;
            let pool = origin::OriginPool::new(
                o.address,
                origin::OriginPoolOptions {
                    max_idle: o.keepalive_connections,
                    idle_timeout: Duration::from_millis(o.keepalive_idle_ms),
                },
            );
            origins.push(Origin {
                tls: origin_tls_config(Arc::clone(&sites), key)?,
                name,
                pool,
            });
        }
        Ok(Edge {
            sites,
            origins,
            pools: pools.into_values().collect(),
            cache: Mutex::new(Cache::new(options.cache_max_bytes, options.cache_max_entry)),
            slots: Arc::new(Semaphore::new(options.handshake_workers)),
            options,
            stats: Arc::new(EdgeStats::default()),
        })
    }

    /// The key-server groups.
    pub fn pools(&self) -> &[Arc<KeyServerPool>] {
        &self.pools
    }

    /// The edge's counters.
    pub fn stats(&self) -> &Arc<EdgeStats> {
        &self.stats
    }

    /// Binds `addr` and serves in a background task until the returned handle is dropped.
    pub async fn bind(self, addr: SocketAddr) -> Result<RunningEdge, EdgeError> {
        let listener = TcpListener::bind(addr).await?;
        let local_addr = listener.local_addr()?;
        let edge = Arc::new(self);
        let serving = Arc::clone(&edge);
        let task = tokio::spawn(async move { serving.serve(listener).await });
        tracing::info!(%local_addr, sites = edge.sites.len(), "edge listening");
        Ok(RunningEdge {
            local_addr,
            edge,
            task,
        })
    }

    /// Accepts connections on `listener` forever.
    pub async fn serve(self: Arc<Self>, listener: TcpListener) {
        let mut acceptor =
            Acceptor::counting_errors_in(listener, Arc::clone(&self.stats.accept_errors));
        loop {
            let (tcp, peer) = acceptor.accept().await;
            let this = Arc::clone(&self);
            tokio::spawn(async move { this.connection(tcp, peer).await });
        }
    }

    fn choose_config(&self, sni: Option<&str>) -> Option<Arc<rustls::ServerConfig>> {
        let origin = sni.and_then(|n| self.sites.get(n)).map(|s| s.origin);
        // Unknown or missing SNI: any configuration; its resolver refuses with an alert.
        let o = self.origins.get(origin.unwrap_or(0))?;
        Some(Arc::clone(&o.tls))
    }

    async fn connection(self: Arc<Self>, tcp: TcpStream, peer: SocketAddr) {
        let _ = tcp.set_nodelay(true);
        let Some(fallback) = self.choose_config(None) else {
            return;
        };
        let accepting = conn::accept(tcp, Arc::clone(&self.slots), |hello| {
            self.choose_config(hello.server_name()).unwrap_or(fallback)
        });
        let conn = match tokio::time::timeout(self.options.handshake_timeout, accepting).await {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => {
                bump(&self.stats.handshake_failures);
                tracing::warn!(%peer, error = %e, "client handshake failed");
                return;
            }
            Err(_) => {
                bump(&self.stats.handshake_failures);
                tracing::warn!(%peer, "client handshake timed out");
                return;
            }
        };
        bump(&self.stats.handshakes);
        let site = match conn
            .tls()
            .ok()
            .and_then(|t| t.server_name())
            .and_then(|n| self.sites.get(n))
        {
            Some(s) => Arc::clone(s),
            None => return,
        };
        if let Err(e) = self.serve_http(conn, &site, peer).await {
            tracing::debug!(%peer, error = %e, "connection ended");
        }
    }

    /// HTTP/1.1 requests on one TLS connection, one at a time (keep-alive).
    async fn serve_http(
        &self,
        mut conn: TlsConn,
        site: &Site,
        peer: SocketAddr,
    ) -> Result<(), conn::ConnError> {
        let mut buf = Vec::new();
        loop {
            let end = loop {
                match http::head_end(&buf) {
                    Ok(Some(end)) => break end,
                    Ok(None) => {
                        if self.read_more(&mut conn, &mut buf).await? == 0 {
                            return Ok(());
                        }
                    }
                    Err(_) => {
                        return refuse(
                            conn,
                            431,
                            "Request Header Fields Too Large",
                            "head too large",
                        )
                        .await;
                    }
                }
            };
            let head = match http::parse_request(buf.get(..end).unwrap_or_default()) {
                Ok(h) => h,
                Err(e) => return refuse(conn, 400, "Bad Request", &e.to_string()).await,
            };
            buf.drain(..end);
            let body = match http::request_framing(&head) {
                Err(e) => return refuse(conn, 400, "Bad Request", &e.to_string()).await,
                Ok(Framing::None) | Ok(Framing::UntilClose) => Vec::new(),
                Ok(Framing::Length(n)) if n > self.options.max_body => {
                    return refuse(conn, 413, "Content Too Large", "body too large").await;
                }
                Ok(Framing::Length(n)) => {
                    while buf.len() < n {
                        if self.read_more(&mut conn, &mut buf).await? == 0 {
                            return Ok(());
                        }
                    }
                    buf.drain(..n).collect()
                }
                Ok(Framing::Chunked) => loop {
                    match http::decode_chunked(&buf, self.options.max_body) {
                        Ok(Some((body, used))) => {
                            buf.drain(..used);
                            break body;
                        }
                        Ok(None) => {
                            if self.read_more(&mut conn, &mut buf).await? == 0 {
                                return Ok(());
                            }
                        }
                        Err(e) => return refuse(conn, 400, "Bad Request", &e.to_string()).await,
                    }
                },
            };
            // The Host must be a name of the certificate this connection was set up with
            // (paper §II-C): otherwise a client could reach another site's content through a
            // connection authenticated for this one.
            let host = match head.headers.get("host") {
                Some(h) => h.to_owned(),
                None if head.minor == 0 => site.sni.clone(),
                None => return refuse(conn, 400, "Bad Request", "missing Host").await,
            };
            if !site.covers_host(&host) {
                bump(&self.stats.misdirected);
                tracing::info!(%peer, sni = %site.sni, %host, "Host not covered by the certificate: 421");
                return refuse(
                    conn,
                    421,
                    "Misdirected Request",
                    "this connection is not for that host",
                )
                .await;
            }
            let close = head.headers.has_token("connection", "close")
                || (head.minor == 0 && !head.headers.has_token("connection", "keep-alive"));
            let response = self.respond(site, &head, &host, &body, peer, close).await;
            conn.write_plain(&response).await?;
            if close {
                conn.close().await;
                return Ok(());
            }
        }
    }

    /// More request bytes; an idle client counts as closed.
    async fn read_more(
        &self,
        conn: &mut TlsConn,
        buf: &mut Vec<u8>,
    ) -> Result<usize, conn::ConnError> {
        match tokio::time::timeout(self.options.idle_timeout, conn.read_plain(buf)).await {
            Ok(r) => r,
            Err(_) => Ok(0),
        }
    }

    /// A response from the cache, or from the origin (storing it when allowed).
    async fn respond(
        &self,
        site: &Site,
        head: &RequestHead,
        host: &str,
        body: &[u8],
        peer: SocketAddr,
        close: bool,
    ) -> Vec<u8> {
        let Some(origin) = self.origins.get(site.origin) else {
            return http::simple_response(502, "Bad Gateway", "no origin", close);
        };
        let host_only = sites::host_without_port(host)
            .trim_end_matches('.')
            .to_ascii_lowercase();
        let key = (
            format!("{}|{}", origin.name, host_only),
            head.target.clone(),
        );
        if may_use_cache(head) {
            let hit = self
                .cache
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&key, Instant::now());
            if let Some((cached, age)) = hit {
                bump(&self.stats.cache_hits);
                let mut headers = cached.headers;
                headers.0.retain(|(n, _)| !n.eq_ignore_ascii_case("age"));
                headers.0.push(("Age".into(), age.to_string()));
                headers.0.push(("X-Cache".into(), "HIT".into()));
                return http::write_response(
                    cached.status,
                    &cached.reason,
                    &headers,
                    &cached.body,
                    close,
                );
            }
        }
        bump(&self.stats.origin_requests);
        let request = origin::origin_request(head, host, body, peer, origin.pool.keeps_alive());
        let fetched = tokio::time::timeout(
            self.options.origin_timeout,
            origin
                .pool
                .fetch(&request, &head.method, self.options.max_body),
        )
        .await;
        let (rhead, rbody) = match fetched {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => {
                tracing::warn!(origin = %origin.name, error = %e, "origin request failed");
                return http::simple_response(502, "Bad Gateway", "origin unavailable", close);
            }
            Err(_) => {
                tracing::warn!(origin = %origin.name, "origin request timed out");
                return http::simple_response(504, "Gateway Timeout", "origin timed out", close);
            }
        };
        let headers = rhead.headers.end_to_end();
        if let Some(lifetime) = storable_lifetime(head, &rhead) {
            self.cache.lock().unwrap_or_else(|p| p.into_inner()).put(
                key,
                CachedResponse {
                    status: rhead.status,
                    reason: rhead.reason.clone(),
                    headers: headers.clone(),
                    body: rbody.clone(),
                },
                lifetime,
                Instant::now(),
            );
        }
        let mut headers = headers;
        headers.0.push(("X-Cache".into(), "MISS".into()));
        http::write_response(rhead.status, &rhead.reason, &headers, &rbody, close)
    }
}

async fn refuse(
    mut conn: TlsConn,
    status: u16,
    reason: &str,
    text: &str,
) -> Result<(), conn::ConnError> {
    conn.write_plain(&http::simple_response(status, reason, text, true))
        .await?;
    conn.close().await;
    Ok(())
}

/// An edge running in a background task; dropping it stops accepting connections.
#[derive(Debug)]
pub struct RunningEdge {
    local_addr: SocketAddr,
    edge: Arc<Edge>,
    task: JoinHandle<()>,
}

impl RunningEdge {
    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The edge (pools, counters).
    pub fn edge(&self) -> &Arc<Edge> {
        &self.edge
    }
}

impl Drop for RunningEdge {
    fn drop(&mut self) {
        self.task.abort();
    }
}
