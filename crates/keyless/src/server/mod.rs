//! The key server: a sans-I/O request handler ([`KeyServerCore`]) and a thin tokio driver
//! ([`KeyServer`]) that accepts mutually authenticated TLS connections.
//!
//! Each connection is one task that cuts frames and hands them, all of a read at once, to a fixed
//! pool of worker threads (one per core, so RSA signing never blocks the async reactor), and sends
//! responses in the order they finish, all that are ready in one TLS write: a slow RSA-4096
//! decrypt does not hold back the ECDSA signatures pipelined behind it (see `conn` for how the
//! per-request cost is kept off the reactor). A body longer than the maximum closes the
//! connection; every other problem is answered and the connection stays open.

pub mod authz;
pub mod config;
mod conn;
pub mod core;
pub mod metrics;

use std::net::SocketAddr;
use std::sync::{Arc, RwLock};

use mbx_net::Acceptor;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;

pub use self::authz::{Authorization, AuthzError, EdgeGrant, EdgeIdentity};
pub use self::config::{DenyConfig, ServerConfig, DEFAULT_PORT};
pub use self::core::{KeyServerCore, RequestOutcome};
pub use self::metrics::ServerStats;

use crate::keys::{KeyStore, KeyStoreError};
use crate::tls::{self, DenyList, TlsSetupError};

/// Errors starting the key server.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// Keys could not be loaded.
    #[error(transparent)]
    Keys(#[from] KeyStoreError),
    /// The authorization rules are invalid.
    #[error(transparent)]
    Authz(#[from] AuthzError),
    /// The TLS configuration is invalid.
    #[error(transparent)]
    Tls(#[from] TlsSetupError),
    /// The worker pool could not start.
    #[error("worker pool: {0}")]
    Pool(#[from] rayon::ThreadPoolBuildError),
    /// Binding or accepting failed.
    #[error("socket: {0}")]
    Io(#[from] std::io::Error),
}

/// A configured key server, ready to listen.
pub struct KeyServer {
    core: Arc<KeyServerCore>,
    /// Swapped by [`KeyServer::reload`]; each connection clones it once, at accept.
    acceptor: RwLock<TlsAcceptor>,
    pool: Arc<rayon::ThreadPool>,
    max_in_flight: usize,
    stats: Arc<ServerStats>,
    metrics_listen: Option<SocketAddr>,
}

impl std::fmt::Debug for KeyServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyServer")
            .field("workers", &self.pool.current_num_threads())
            .field("max_in_flight", &self.max_in_flight)
            .finish_non_exhaustive()
    }
}

impl KeyServer {
    /// A server from a handler and a TLS configuration (see [`crate::tls::server_config`]).
    /// `workers == 0` means one worker per core.
    pub fn new(
        core: KeyServerCore,
        tls: Arc<rustls::ServerConfig>,
        workers: usize,
        max_in_flight: usize,
    ) -> Result<KeyServer, ServerError> {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(workers)
            .thread_name(|i| format!("keyless-worker-{i}"))
            .build()?;
        Ok(KeyServer {
            core: Arc::new(core),
            acceptor: RwLock::new(TlsAcceptor::from(tls)),
            pool: Arc::new(pool),
            max_in_flight: max_in_flight.max(1),
            stats: Arc::new(ServerStats::default()),
            metrics_listen: None,
        })
    }

    /// Also serves the counters in Prometheus text format on plain HTTP at `addr`
    /// (`GET /metrics`) once bound.
    pub fn with_metrics(mut self, addr: SocketAddr) -> KeyServer {
        self.metrics_listen = Some(addr);
        self
    }

    /// Everything [`KeyServer::reload`] swaps, loaded from `config` without touching the
    /// running server.
    fn load(config: &ServerConfig) -> Result<Loaded, ServerError> {
        let mut token_keys = Vec::new();
        for token in &config.pkcs11 {
            token_keys.extend(crate::pkcs11::Pkcs11Token::open(token)?);
        }
        let keys = KeyStore::load_dir_with(&config.key_dir, token_keys)?;
        let authz = Authorization::from_grants(&config.edges)?;
        let deny = DenyList::from_hex(&config.deny.sha256, &config.deny.serials)?;
        let tls = tls::server_config(
            tls::load_certificates(&config.certificate)?,
            tls::load_private_key(&config.private_key)?,
            &tls::load_certificates(&config.edge_ca)?,
            deny,
        )?;
        Ok(Loaded { keys, authz, tls })
    }

    /// Re-reads keys, authorization, the server's certificate and key, the edge CA and the deny
    /// list from `config` and swaps them in at once. Connections already open keep their TLS
    /// session and are served with the new keys and rules from their next request; new
    /// connections are accepted with the new certificate, CA and deny list. If anything fails to
    /// load, nothing changes and the error is returned (and logged). `listen`, `workers`,
    /// `max_in_flight_per_connection`, `max_body_length` and `metrics_listen` only take effect
    /// on restart.
    pub fn reload(&self, config: &ServerConfig) -> Result<(), ServerError> {
        match KeyServer::load(config) {
            Ok(Loaded { keys, authz, tls }) => {
                let n = keys.len();
                self.core.replace_keys(keys);
                self.core.replace_authorization(authz);
                match self.acceptor.write() {
                    Ok(mut a) => *a = TlsAcceptor::from(tls),
                    Err(poisoned) => *poisoned.into_inner() = TlsAcceptor::from(tls),
                }
                ServerStats::bump(&self.stats.reloads);
                tracing::info!(keys = n, edges = config.edges.len(), "key server reloaded");
                Ok(())
            }
            Err(e) => {
                ServerStats::bump(&self.stats.reload_failures);
                tracing::error!(error = %e, "reload failed; keeping the previous configuration");
                Err(e)
            }
        }
    }

    fn acceptor(&self) -> TlsAcceptor {
        match self.acceptor.read() {
            Ok(a) => a.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Loads keys, authorization, certificates and deny list from a [`ServerConfig`].
    pub fn from_config(config: &ServerConfig) -> Result<KeyServer, ServerError> {
        let Loaded { keys, authz, tls } = KeyServer::load(config)?;
        tracing::info!(
            keys = keys.len(),
            edges = config.edges.len(),
            "key server configured"
        );
        let core = KeyServerCore::new(keys, authz).with_max_body_len(config.max_body_length);
        let server = KeyServer::new(
            core,
            tls,
            config.workers,
            config.max_in_flight_per_connection,
        )?;
        Ok(match config.metrics_listen {
            Some(addr) => server.with_metrics(addr),
            None => server,
        })
    }

    /// The request handler (for reloading keys or rules while running).
    pub fn core(&self) -> &Arc<KeyServerCore> {
        &self.core
    }

    /// The server's counters.
    pub fn stats(&self) -> &Arc<ServerStats> {
        &self.stats
    }

    /// Binds `addr` (and the metrics address, if set) and serves in background tasks until the
    /// returned handle is dropped.
    pub async fn bind(self, addr: SocketAddr) -> Result<RunningServer, ServerError> {
        let listener = TcpListener::bind(addr).await?;
        let local_addr = listener.local_addr()?;
        let metrics = match self.metrics_listen {
            Some(maddr) => {
                let l = TcpListener::bind(maddr).await?;
                let maddr = l.local_addr()?;
                let stats = Arc::clone(&self.stats);
                tracing::info!(%maddr, "metrics listening");
                Some((maddr, tokio::spawn(metrics::serve_metrics(l, stats))))
            }
            None => None,
        };
        let server = Arc::new(self);
        let task = tokio::spawn(Arc::clone(&server).serve_shared(listener));
        tracing::info!(%local_addr, "key server listening");
        Ok(RunningServer {
            local_addr,
            server,
            task,
            metrics,
        })
    }

    /// Accepts connections on `listener` forever.
    pub async fn serve(self, listener: TcpListener) -> Result<(), ServerError> {
        Arc::new(self).serve_shared(listener).await
    }

    async fn serve_shared(self: Arc<Self>, listener: TcpListener) -> Result<(), ServerError> {
        let this = self;
        // Out of file descriptors and the like: log, pause, keep serving.
        let mut acceptor =
            Acceptor::counting_errors_in(listener, Arc::clone(&this.stats.accept_errors));
        loop {
            let (tcp, peer) = acceptor.accept().await;
            ServerStats::bump(&this.stats.connections);
            let this = Arc::clone(&this);
            tokio::spawn(async move { this.connection(tcp, peer).await });
        }
    }

    async fn connection(self: Arc<Self>, tcp: TcpStream, peer: SocketAddr) {
        let _open = metrics::OpenConnection::new(&self.stats);
        let _ = tcp.set_nodelay(true);
        let tls = match self.acceptor().accept(tcp).await {
            Ok(tls) => tls,
            Err(e) => {
                ServerStats::bump(&self.stats.handshake_failures);
                tracing::info!(%peer, error = %e, "edge handshake refused");
                return;
            }
        };
        let identity = match tls
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|c| c.first())
            .map(|c| EdgeIdentity::from_certificate(c))
        {
            Some(Ok(id)) => id,
            _ => {
                // The verifier requires a certificate, so this only happens on a parse failure.
                tracing::warn!(%peer, "edge certificate has no usable identity");
                return;
            }
        };
        tracing::debug!(%peer, names = ?identity.names(), "edge connected");
        let (tcp, mut tls) = tls.into_inner();
        // Back-pressure is the in-flight limit (see `conn`), not rustls' plaintext buffer limit.
        tls.set_buffer_limit(None);
        let server = conn::Server {
            core: Arc::clone(&self.core),
            stats: Arc::clone(&self.stats),
            pool: Arc::clone(&self.pool),
            max_in_flight: self.max_in_flight,
        };
        conn::serve(server, tcp, tls, Arc::new(identity), peer).await;
    }
}

/// What [`KeyServer::reload`] swaps in.
struct Loaded {
    keys: KeyStore,
    authz: Authorization,
    tls: Arc<rustls::ServerConfig>,
}

/// A server running in a background task; dropping it stops accepting connections (and the
/// metrics listener).
#[derive(Debug)]
pub struct RunningServer {
    local_addr: SocketAddr,
    server: Arc<KeyServer>,
    task: JoinHandle<Result<(), ServerError>>,
    metrics: Option<(SocketAddr, JoinHandle<()>)>,
}

impl RunningServer {
    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The bound metrics address, if a metrics listener was configured.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics.as_ref().map(|(a, _)| *a)
    }

    /// The server's counters.
    pub fn stats(&self) -> &ServerStats {
        &self.server.stats
    }

    /// The request handler.
    pub fn core(&self) -> &Arc<KeyServerCore> {
        &self.server.core
    }

    /// See [`KeyServer::reload`].
    pub fn reload(&self, config: &ServerConfig) -> Result<(), ServerError> {
        self.server.reload(config)
    }
}

impl Drop for RunningServer {
    fn drop(&mut self) {
        self.task.abort();
        if let Some((_, t)) = &self.metrics {
            t.abort();
        }
    }
}
