//! Connections from the edge to a group of key servers that hold the same keys: a few persistent
//! pipelined connections per key server, ping health checks, and failover.
//!
//! A signing request goes to the healthy key servers first (round robin), then to the ones marked
//! down, so a key server that comes back is used again by the very next handshake even before the
//! health checker notices. A transport failure (connect refused, connection closed, timeout) marks
//! the key server down and moves on to the next; an answer from a key server (a signature, or an
//! error byte such as "key not found") is final.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustls::pki_types::ServerName;
use tokio::task::JoinHandle;

use crate::client::{ClientError, ClientOptions, KeyId, KeylessClient};
use crate::wire::Opcode;

/// Settings of one key-server group.
#[derive(Debug, Clone)]
pub struct PoolOptions {
    /// Persistent connections per key server (requests are pipelined on each).
    pub connections_per_server: usize,
    /// Bound on one operation (connect, or request and answer) against one key server.
    pub operation_timeout: Duration,
    /// Pause between health-check rounds.
    pub health_interval: Duration,
}

impl Default for PoolOptions {
    fn default() -> Self {
        PoolOptions {
            connections_per_server: 2,
            operation_timeout: Duration::from_secs(5),
            health_interval: Duration::from_secs(2),
        }
    }
}

/// Why a pooled operation failed.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// Every key server of the group failed at the transport level.
    #[error("no key server of {pool:?} answered ({tried} tried; last error: {last})")]
    NoKeyServer {
        /// The group's name.
        pool: String,
        /// How many key servers were tried.
        tried: usize,
        /// The last transport error.
        last: String,
    },
    /// A key server answered with an error (final: all servers of a group hold the same keys).
    #[error("key server {addr} refused: {error}")]
    Refused {
        /// The key server.
        addr: SocketAddr,
        /// Its answer.
        error: ClientError,
    },
}

/// One key server: its address, health flag and connection slots.
#[derive(Debug)]
struct Backend {
    addr: SocketAddr,
    healthy: AtomicBool,
    slots: Vec<Mutex<Option<Arc<KeylessClient>>>>,
    next_slot: AtomicUsize,
}

impl Backend {
    fn slot(&self) -> Option<&Mutex<Option<Arc<KeylessClient>>>> {
        let n = self.slots.len();
        if n == 0 {
            return None;
        }
        self.slots
            .get(self.next_slot.fetch_add(1, Ordering::Relaxed) % n)
    }

    fn drop_connection(&self, dead: &Arc<KeylessClient>) {
        for slot in &self.slots {
            let mut guard = slot.lock().unwrap_or_else(|p| p.into_inner());
            if guard.as_ref().is_some_and(|c| Arc::ptr_eq(c, dead)) {
                *guard = None;
            }
        }
    }

    fn drop_all(&self) {
        for slot in &self.slots {
            *slot.lock().unwrap_or_else(|p| p.into_inner()) = None;
        }
    }
}

/// Whether an error means "this key server is unreachable" (try another) rather than an answer.
fn is_transport(e: &ClientError) -> bool {
    matches!(
        e,
        ClientError::Connect(_) | ClientError::ConnectionClosed | ClientError::Timeout(_)
    )
}

/// A group of interchangeable key servers.
#[derive(Debug)]
pub struct KeyServerPool {
    name: String,
    backends: Vec<Backend>,
    server_name: ServerName<'static>,
    tls: Arc<rustls::ClientConfig>,
    options: PoolOptions,
    next_backend: AtomicUsize,
    health_task: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for KeyServerPool {
    fn drop(&mut self) {
        if let Some(t) = self
            .health_task
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            t.abort();
        }
    }
}

impl KeyServerPool {
    /// A group named `name` of key servers at `addrs`, verified as `server_name` with `tls` (from
    /// [`crate::tls::client_config`], presenting the edge's certificate). Connections are opened
    /// on first use; every key server starts as healthy.
    pub fn new(
        name: &str,
        addrs: &[SocketAddr],
        server_name: ServerName<'static>,
        tls: Arc<rustls::ClientConfig>,
        options: PoolOptions,
    ) -> KeyServerPool {
        let per = options.connections_per_server.max(1);
        KeyServerPool {
            name: name.to_owned(),
            backends: addrs
                .iter()
                .map(|&addr| Backend {
                    addr,
                    healthy: AtomicBool::new(true),
                    slots: (0..per).map(|_| Mutex::new(None)).collect(),
                    next_slot: AtomicUsize::new(0),
                })
                .collect(),
            server_name,
            tls,
            options,
            next_backend: AtomicUsize::new(0),
            health_task: Mutex::new(None),
        }
    }

    /// The group's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The per-operation timeout.
    pub fn operation_timeout(&self) -> Duration {
        self.options.operation_timeout
    }

    /// How many key servers the group has.
    pub fn len(&self) -> usize {
        self.backends.len()
    }

    /// Whether the group has no key server.
    pub fn is_empty(&self) -> bool {
        self.backends.is_empty()
    }

    /// Each key server's address and whether it is currently considered healthy.
    pub fn health(&self) -> Vec<(SocketAddr, bool)> {
        self.backends
            .iter()
            .map(|b| (b.addr, b.healthy.load(Ordering::Relaxed)))
            .collect()
    }

    fn client_options(&self) -> ClientOptions {
        ClientOptions {
            timeout: self.options.operation_timeout,
            ..ClientOptions::default()
        }
    }

    /// A connection to `backend`: an open one from the next slot, or a new one in that slot.
    async fn connection(&self, backend: &Backend) -> Result<Arc<KeylessClient>, ClientError> {
        let slot = backend.slot().ok_or(ClientError::ConnectionClosed)?;
        if let Some(c) = slot.lock().unwrap_or_else(|p| p.into_inner()).clone() {
            return Ok(c);
        }
        let client = Arc::new(
            KeylessClient::connect(
                backend.addr,
                self.server_name.clone(),
                Arc::clone(&self.tls),
                self.client_options(),
            )
            .await?,
        );
        let mut guard = slot.lock().unwrap_or_else(|p| p.into_inner());
        // Another request may have filled the slot meanwhile: keep one, use it.
        Ok(Arc::clone(guard.get_or_insert(client)))
    }

    /// Backends in the order to try: healthy ones round robin, then the ones marked down.
    fn order(&self) -> Vec<&Backend> {
        let n = self.backends.len();
        let start = if n == 0 {
            0
        } else {
            self.next_backend.fetch_add(1, Ordering::Relaxed) % n
        };
        let rotated = self.backends.iter().cycle().skip(start).take(n);
        let (mut up, down): (Vec<&Backend>, Vec<&Backend>) =
            rotated.partition(|b| b.healthy.load(Ordering::Relaxed));
        up.extend(down);
        up
    }

    /// Signs with the first key server that answers; see the module docs for the failover rule.
    pub async fn sign(
        &self,
        key: &KeyId,
        opcode: Opcode,
        input: &[u8],
    ) -> Result<Vec<u8>, PoolError> {
        let mut last = String::from("no key server configured");
        let mut tried = 0;
        for backend in self.order() {
            tried += 1;
            let client = match self.connection(backend).await {
                Ok(c) => c,
                Err(e) => {
                    self.mark_down(backend, &e);
                    last = format!("{}: {e}", backend.addr);
                    continue;
                }
            };
            match client.sign(key, opcode, input).await {
                Ok(sig) => {
                    backend.healthy.store(true, Ordering::Relaxed);
                    return Ok(sig);
                }
                Err(e) if is_transport(&e) => {
                    backend.drop_connection(&client);
                    self.mark_down(backend, &e);
                    last = format!("{}: {e}", backend.addr);
                }
                Err(error) => {
                    return Err(PoolError::Refused {
                        addr: backend.addr,
                        error,
                    })
                }
            }
        }
        Err(PoolError::NoKeyServer {
            pool: self.name.clone(),
            tried,
            last,
        })
    }

    fn mark_down(&self, backend: &Backend, e: &ClientError) {
        if backend.healthy.swap(false, Ordering::Relaxed) {
            tracing::warn!(pool = %self.name, addr = %backend.addr, error = %e, "key server marked down");
        }
    }

    /// One health-check round: every connection slot of every key server is pinged (a missing
    /// connection is opened first); a failure drops the connection and marks the server down, a
    /// success marks it up.
    pub async fn check_health(&self) {
        for backend in &self.backends {
            let mut ok = true;
            for slot in &backend.slots {
                let existing = slot.lock().unwrap_or_else(|p| p.into_inner()).clone();
                let client = match existing {
                    Some(c) => c,
                    None => match KeylessClient::connect(
                        backend.addr,
                        self.server_name.clone(),
                        Arc::clone(&self.tls),
                        self.client_options(),
                    )
                    .await
                    {
                        Ok(c) => {
                            let c = Arc::new(c);
                            let mut guard = slot.lock().unwrap_or_else(|p| p.into_inner());
                            Arc::clone(guard.get_or_insert(c))
                        }
                        Err(e) => {
                            self.mark_down(backend, &e);
                            ok = false;
                            break;
                        }
                    },
                };
                if let Err(e) = client.ping(b"mbx-edge health").await {
                    backend.drop_connection(&client);
                    self.mark_down(backend, &e);
                    ok = false;
                    break;
                }
            }
            if !ok {
                backend.drop_all();
            } else if !backend.healthy.swap(true, Ordering::Relaxed) {
                tracing::info!(pool = %self.name, addr = %backend.addr, "key server back up");
            }
        }
    }

    /// Starts the periodic health checker (stopped when the pool is dropped).
    pub fn start_health_checks(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        // A zero interval would spin; 50 ms is far below any useful setting.
        let interval = self.options.health_interval.max(Duration::from_millis(50));
        let task = tokio::spawn(async move {
            loop {
                tokio::time::sleep(interval).await;
                let Some(pool) = weak.upgrade() else { return };
                pool.check_health().await;
            }
        });
        let mut guard = self.health_task.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(old) = guard.replace(task) {
            old.abort();
        }
    }
}
