//! The listening side shared by the middlebox, the server and the client proxy ([`Listening`]):
//! accepting without spinning when `accept` fails ([`mbx_net::Acceptor`]: pauses of 5 ms
//! doubling to 1 s, cut short when one of its connections ends and frees a descriptor), at most
//! so many connections at once (and so many per client address), the reports, and stopping
//! either at once or by draining.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream, ToSocketAddrs};
use tokio::sync::{oneshot, Notify};
use tokio::task::{JoinHandle, JoinSet};

use mbx_net::Acceptor;

use super::per_client::ClientLimits;
use super::reports::{report_queue, EndedConnections, ReportReceiver, ReportSender, Tally};
use super::{DriverError, Limits};

/// How a listener stops.
enum Stop {
    /// Every connection is cut at once.
    Now,
    /// No new connection; open ones may finish within this grace period, then are cut.
    Drain(Duration),
}

/// A driver's configuration as a listener uses it.
pub trait ServiceConfig: Send + Sync + 'static {
    fn limits(&self) -> &Limits;
    /// What would make every connection fail, checked when the service starts and at each
    /// reload rather than found connection by connection.
    fn check(&self) -> Result<(), DriverError> {
        Ok(())
    }
}

/// The configuration in force: each connection takes the one current at its accept and keeps it
/// (a [`reload`](Listening::reload) changes only later connections).
struct ConfigSlot<C> {
    config: RwLock<Arc<C>>,
    /// Wakes the accept loop, whose connection limit may have changed.
    changed: Notify,
}

impl<C> ConfigSlot<C> {
    fn new(config: C) -> ConfigSlot<C> {
        ConfigSlot {
            config: RwLock::new(Arc::new(config)),
            changed: Notify::new(),
        }
    }

    fn current(&self) -> Arc<C> {
        self.config
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn replace(&self, config: C) {
        *self.config.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(config);
        self.changed.notify_one();
    }
}

/// A listening middlebox, mbTLS server or client proxy
/// ([`MiddleboxServer`](super::MiddleboxServer), [`MbtlsServer`](super::MbtlsServer),
/// [`ClientProxy`](super::ClientProxy)): it serves every accepted connection in the background
/// with its configuration `C` and reports each one as it ends (`R`: the driver's report).
/// Dropping it stops the listener and cuts every connection, as a killed process would.
pub struct Listening<R, C> {
    local_addr: SocketAddr,
    task: JoinHandle<()>,
    stop: Option<oneshot::Sender<Stop>>,
    /// Ends a drain's grace period early ([`Listening::cut_now`]).
    cut_now: Arc<Notify>,
    reports: ReportReceiver<R>,
    stats: ListenerStats,
    config: Arc<ConfigSlot<C>>,
}

/// A listener's counters, readable from anywhere while it runs (e.g. by a metrics endpoint):
/// [`Listening::stats`].
#[derive(Clone, Debug)]
pub struct ListenerStats {
    accept_errors: Arc<AtomicU64>,
    accepted: Arc<AtomicU64>,
    cut: Arc<AtomicU64>,
    open: Arc<AtomicUsize>,
    dropped: Arc<AtomicU64>,
    refused_per_client: Arc<AtomicU64>,
    refused_rate_per_client: Arc<AtomicU64>,
    /// A middlebox's only: [`ListenerStats::legacy_servers_remembered`].
    legacy_servers: Option<Gauge>,
    ended: Arc<Tally>,
}

/// A count made when it is read (e.g. at each metrics scrape).
#[derive(Clone)]
struct Gauge(Arc<dyn Fn() -> usize + Send + Sync>);

impl core::fmt::Debug for Gauge {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{}", (self.0)())
    }
}

impl ListenerStats {
    /// How often accepting a connection failed (e.g. out of file descriptors). After each
    /// failure the listener pauses (5 ms doubling to 1 s, or until a connection ends) instead
    /// of retrying at once.
    pub fn accept_errors(&self) -> u64 {
        self.accept_errors.load(Ordering::Relaxed)
    }

    /// Connections accepted so far (their ids run from 0 to this, exclusive).
    pub fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }

    /// Connections being served now (at most the configured `max_connections`).
    pub fn open_connections(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// Connections that a stop cut ([`Listening::drain`] after its grace period, or
    /// [`Listening::shutdown`]); each is reported as cut (outcome [`CUT_AT_STOP`](super::CUT_AT_STOP)), and
    /// counted as failed in [`ListenerStats::ended`].
    pub fn connections_cut(&self) -> u64 {
        self.cut.load(Ordering::Relaxed)
    }

    /// Reports dropped because [`REPORTS_KEPT`](super::REPORTS_KEPT) waited unread.
    pub fn reports_dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Connections closed at their accept because their client had
    /// [`Limits::max_connections_per_client`] open; not counted as accepted, and without a
    /// report.
    pub fn refused_per_client(&self) -> u64 {
        self.refused_per_client.load(Ordering::Relaxed)
    }

    /// Connections closed at their accept because their client opened them faster than
    /// [`Limits::connection_rate_per_client`]; not counted as accepted, and without a report.
    pub fn refused_rate_per_client(&self) -> u64 {
        self.refused_rate_per_client.load(Ordering::Relaxed)
    }

    /// Next hops a middlebox remembers as legacy servers now (it passes their sessions
    /// through unannounced,
    /// [`MiddleboxServerConfig::forget_legacy_after`](super::MiddleboxServerConfig::forget_legacy_after));
    /// `None` for other listeners, which remember none.
    pub fn legacy_servers_remembered(&self) -> Option<usize> {
        self.legacy_servers.as_ref().map(|count| (count.0)())
    }

    /// Counts of the connections that ended so far, whether or not their reports were read:
    /// cleanly or not, with a middlebox taking part, and the bytes carried each way.
    pub fn ended(&self) -> EndedConnections {
        self.ended.snapshot()
    }
}

impl<R: Send + 'static, C: ServiceConfig> Listening<R, C> {
    /// Binds `listen` and runs `serve(id, stream, peer, config, reports)` for each accepted
    /// connection (ids from 0 in accept order) with the configuration current at its accept,
    /// at most its `max_connections` at once, until stopped; `serve` sends the connection's
    /// report when it ends. (It sends it itself rather than return it: a wrapper future
    /// awaiting the connection's future would hold that future twice, its size added to every
    /// connection.)
    pub(crate) async fn spawn<F, Fut>(
        listen: impl ToSocketAddrs,
        config: C,
        mut serve: F,
    ) -> Result<Listening<R, C>, DriverError>
    where
        F: FnMut(u64, TcpStream, SocketAddr, Arc<C>, ReportSender<R>) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        config.check()?;
        let listener = TcpListener::bind(listen)
            .await
            // The caller names the address ("cannot listen on …: bind: …").
            .map_err(DriverError::io("bind"))?;
        let local_addr = listener
            .local_addr()
            .map_err(DriverError::io("cannot read the listening address"))?;
        // Inherited by every accepted connection.
        super::keep_alive(&listener);
        let (tx, reports) = report_queue();
        let acceptor = Acceptor::new(listener);
        let accept_errors = acceptor.error_count();
        let accepted = Arc::new(AtomicU64::new(0));
        let cut = Arc::new(AtomicU64::new(0));
        let open = Arc::new(AtomicUsize::new(0));
        let clients = ClientLimits::default();
        let refused_per_client = clients.refused_open.clone();
        let refused_rate_per_client = clients.refused_rate.clone();
        let (stop, stopped) = oneshot::channel();
        let cut_now = Arc::new(Notify::new());
        let config = Arc::new(ConfigSlot::new(config));
        let serve_and_report =
            move |id, stream, peer, config| serve(id, stream, peer, config, tx.clone());
        let counts = Counts {
            accepted: accepted.clone(),
            cut: cut.clone(),
            open: open.clone(),
            clients,
        };
        let task = tokio::spawn(accept_loop(
            acceptor,
            (stopped, cut_now.clone()),
            config.clone(),
            counts,
            serve_and_report,
        ));
        let stats = ListenerStats {
            accept_errors,
            accepted,
            cut,
            open,
            dropped: reports.dropped_count(),
            refused_per_client,
            refused_rate_per_client,
            legacy_servers: None,
            ended: reports.tally(),
        };
        Ok(Listening {
            local_addr,
            task,
            stop: Some(stop),
            cut_now,
            reports,
            stats,
            config,
        })
    }
}

impl<R, C> Listening<R, C> {
    /// Replaces the configuration for the connections accepted from now on (certificates,
    /// policies, next hop or backend, limits); open ones keep theirs, as with nginx's reload.
    /// A configuration that would fail every connection is refused, and the running one stays.
    pub fn reload(&self, config: C) -> Result<(), DriverError>
    where
        C: ServiceConfig,
    {
        config.check()?;
        self.config.replace(config);
        Ok(())
    }

    /// How [`ListenerStats::legacy_servers_remembered`] counts, given the configuration in
    /// force when it is read.
    pub(super) fn count_legacy_servers(
        &mut self,
        count: impl Fn(&C) -> usize + Send + Sync + 'static,
    ) where
        C: Send + Sync + 'static,
    {
        let slot = self.config.clone();
        self.stats.legacy_servers = Some(Gauge(Arc::new(move || count(&slot.current()))));
    }

    /// The configuration new connections get.
    pub fn config(&self) -> Arc<C> {
        self.config.current()
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The report of the next connection that ends (`None` once the listener stopped and every
    /// connection is gone). At most [`REPORTS_KEPT`](super::REPORTS_KEPT) wait unread; later
    /// ones are dropped (and logged).
    pub async fn next_report(&mut self) -> Option<R> {
        self.reports.recv().await
    }

    /// The report of a connection that has ended, if one is waiting; never waits.
    pub fn try_next_report(&mut self) -> Option<R> {
        self.reports.try_recv()
    }

    /// Reports dropped because [`REPORTS_KEPT`](super::REPORTS_KEPT) waited unread.
    pub fn reports_dropped(&self) -> u64 {
        self.stats.reports_dropped()
    }

    /// Reports still to come: every accepted connection has one, taken here
    /// ([`next_report`](Self::next_report), [`try_next_report`](Self::try_next_report)),
    /// dropped unread, or not yet made because the connection is still ending.
    pub fn reports_to_come(&self) -> u64 {
        let given = self.reports.taken() + self.reports_dropped();
        self.stats.accepted().saturating_sub(given)
    }

    /// The listener's counters ([`ListenerStats`]), to read from elsewhere while it runs.
    pub fn stats(&self) -> ListenerStats {
        self.stats.clone()
    }

    /// How often accepting a connection failed ([`ListenerStats::accept_errors`]).
    pub fn accept_errors(&self) -> u64 {
        self.stats.accept_errors()
    }

    /// Graceful stop: stops listening at once (new connections are refused) and gives the
    /// open connections up to `grace` to end by themselves; those still open then are cut.
    /// Returns at once; the reports of the connections that end keep coming from
    /// [`next_report`](Self::next_report), which returns `None` once all are gone.
    pub fn drain(&mut self, grace: Duration) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(Stop::Drain(grace));
        }
    }

    /// Ends a [`drain`](Self::drain)'s grace period now: the connections still open are cut
    /// at once, and reported as cut, as at the end of the grace period (an operator's second
    /// stop signal). Called before the drain, that drain cuts at once.
    pub fn cut_now(&self) {
        self.cut_now.notify_one();
    }

    /// Connections being served now ([`ListenerStats::open_connections`]).
    pub fn open_connections(&self) -> usize {
        self.stats.open_connections()
    }

    /// Connections that a stop cut ([`ListenerStats::connections_cut`]).
    pub fn connections_cut(&self) -> u64 {
        self.stats.connections_cut()
    }

    /// Stops listening and cuts every connection (as if the process were killed); returns once
    /// every connection task is gone, so nothing is relayed after this.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(Stop::Now);
        }
        let _ = (&mut self.task).await;
    }
}

impl<R, C> Drop for Listening<R, C> {
    fn drop(&mut self) {
        // Aborting the accept task drops its JoinSet, which aborts every connection task and
        // with it its sockets.
        self.task.abort();
    }
}

impl<R, C> core::fmt::Debug for Listening<R, C> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Listening")
            .field("local_addr", &self.local_addr)
            .finish_non_exhaustive()
    }
}

/// What the accept loop counts for its [`Listening`].
struct Counts {
    accepted: Arc<AtomicU64>,
    cut: Arc<AtomicU64>,
    open: Arc<AtomicUsize>,
    /// What each client may open, and the refusals of those over it.
    clients: ClientLimits,
}

/// Waits until every connection in `conns` has ended, `open` following them as they end (a
/// metrics scrape, a second stop signal's count read it meanwhile).
async fn join_all(conns: &mut JoinSet<()>, open: &AtomicUsize) {
    while conns.join_next().await.is_some() {
        open.store(conns.len(), Ordering::Relaxed);
    }
}

/// The connection limit is read again on every turn, and a reload wakes the loop: it may have
/// changed.
async fn accept_loop<C: ServiceConfig, F, Fut>(
    mut acceptor: Acceptor,
    (mut stopped, cut_now): (oneshot::Receiver<Stop>, Arc<Notify>),
    config: Arc<ConfigSlot<C>>,
    counts: Counts,
    mut serve: F,
) where
    F: FnMut(u64, TcpStream, SocketAddr, Arc<C>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let mut next_id = 0u64;
    let mut conns = JoinSet::new();
    loop {
        counts.open.store(conns.len(), Ordering::Relaxed);
        let current = config.current();
        let max = current.limits().max_connections.unwrap_or(usize::MAX);
        let room = conns.len() < max;
        tokio::select! {
            stop = &mut stopped => {
                // The listening socket closes here: new connections are refused from now on.
                drop(acceptor);
                if let Ok(Stop::Drain(grace)) = stop {
                    let _ = tokio::time::timeout(grace, async {
                        tokio::select! {
                            () = join_all(&mut conns, &counts.open) => {}
                            () = cut_now.notified() => {}
                        }
                    })
                    .await;
                    while conns.try_join_next().is_some() {}
                }
                counts.cut.fetch_add(conns.len() as u64, Ordering::Relaxed);
                if !conns.is_empty() {
                    tracing::warn!(connections = conns.len(), "stopping: open connections cut");
                }
                // Wait for every aborted connection so that none relays another byte.
                conns.abort_all();
                join_all(&mut conns, &counts.open).await;
                counts.open.store(0, Ordering::Relaxed);
                return;
            }
            // At the limit, new connections wait in the listen queue until one ends.
            (stream, peer) = acceptor.accept(), if room => {
                // The configuration as of now: a reload may have come while we waited.
                let current = config.current();
                let now = std::time::Instant::now();
                // Refused: the stream is dropped, which closes it.
                let Ok(slot) = counts.clients.admit(peer, current.limits(), now) else {
                    continue;
                };
                let connection = serve(next_id, stream, peer, current);
                match slot {
                    // Given back when the task ends, or when a stop aborts it.
                    Some(slot) => conns.spawn(async move {
                        let _slot = slot;
                        connection.await
                    }),
                    None => conns.spawn(connection),
                };
                next_id += 1;
                counts.accepted.store(next_id, Ordering::Relaxed);
            }
            () = config.changed.notified() => {}
            Some(_) = conns.join_next(), if !conns.is_empty() => acceptor.connection_ended(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    struct Unlimited(Limits);

    impl ServiceConfig for Unlimited {
        fn limits(&self) -> &Limits {
            &self.0
        }
    }

    /// Waits (bounded, so that a stale count fails instead of hanging) until `done`.
    async fn until(done: impl Fn() -> bool) {
        tokio::time::timeout(Duration::from_secs(60), async {
            while !done() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("the count never came");
    }

    /// While a drain waits for the open connections, the open count drops as each ends (it
    /// stayed at its value from the drain's start, so a second stop signal said connections
    /// were cut that had ended).
    #[tokio::test]
    async fn the_open_count_follows_connections_that_end_while_draining() {
        let serve = |_, mut stream: TcpStream, _, _, _| async move {
            let _ = stream.read_to_end(&mut Vec::new()).await;
        };
        let mut l: Listening<(), Unlimited> =
            Listening::spawn("127.0.0.1:0", Unlimited(Limits::default()), serve)
                .await
                .unwrap();
        let a = TcpStream::connect(l.local_addr()).await.unwrap();
        let b = TcpStream::connect(l.local_addr()).await.unwrap();
        until(|| l.open_connections() == 2).await;
        l.drain(Duration::from_secs(600));
        drop(a);
        until(|| l.open_connections() == 1).await;
        drop(b);
        assert!(l.next_report().await.is_none());
        assert_eq!((l.open_connections(), l.connections_cut()), (0, 0));
    }

    /// A connection from `from` (a loopback address) to `to`.
    async fn connect_from(from: [u8; 4], to: SocketAddr) -> TcpStream {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(SocketAddr::from((from, 0))).unwrap();
        socket.connect(to).await.unwrap()
    }

    /// One client address gets at most `max_connections_per_client` at once: one more is
    /// closed at its accept, other addresses are served, and the address gets its slot back
    /// when its connection ends.
    #[tokio::test]
    async fn a_client_address_gets_at_most_its_connections() {
        let serve = |_, mut stream: TcpStream, _, _, _| async move {
            let _ = stream.read_to_end(&mut Vec::new()).await;
        };
        let limits = Limits {
            max_connections_per_client: Some(1),
            ..Limits::default()
        };
        let l: Listening<(), Unlimited> = Listening::spawn("127.0.0.1:0", Unlimited(limits), serve)
            .await
            .unwrap();
        let to = l.local_addr();
        let first = connect_from([127, 0, 0, 1], to).await;
        until(|| l.open_connections() == 1).await;
        let mut second = connect_from([127, 0, 0, 1], to).await;
        // Closed by the listener: end of stream (or a reset), not a connection left waiting.
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(60), second.read(&mut byte))
            .await
            .expect("the refused connection was left open");
        assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
        assert_eq!(l.stats().refused_per_client(), 1);
        // Another address is not limited by this one's connection.
        let _other = connect_from([127, 0, 0, 2], to).await;
        until(|| l.open_connections() == 2).await;
        drop(first);
        until(|| l.open_connections() == 1).await;
        let _again = connect_from([127, 0, 0, 1], to).await;
        until(|| l.open_connections() == 2).await;
        assert_eq!(
            (l.stats().accepted(), l.stats().refused_per_client()),
            (3, 1)
        );
        drop(l);
    }

    /// A client that opens connections faster than `connection_rate_per_client` has the ones
    /// over it closed at their accept, counted; another address is served meanwhile. (What
    /// the rate admits when is the sans-I/O table's test, `per_client.rs`: here twenty
    /// connections opened at once meet a budget of two, and one a second.)
    #[tokio::test]
    async fn a_client_address_opens_connections_at_most_at_its_rate() {
        let serve = |_, mut stream: TcpStream, _, _, _| async move {
            let _ = stream.read_to_end(&mut Vec::new()).await;
        };
        let limits = Limits {
            connection_rate_per_client: Some(super::super::ConnectionRate {
                per_second: 1,
                burst: 2,
            }),
            ..Limits::default()
        };
        let l: Listening<(), Unlimited> = Listening::spawn("127.0.0.1:0", Unlimited(limits), serve)
            .await
            .unwrap();
        let to = l.local_addr();
        let mut kept = Vec::new();
        for _ in 0..20 {
            kept.push(connect_from([127, 0, 0, 1], to).await);
        }
        until(|| l.stats().accepted() + l.stats().refused_rate_per_client() == 20).await;
        assert!(l.stats().refused_rate_per_client() >= 1);
        assert_eq!(l.stats().refused_per_client(), 0);
        // The last one came long before the budget could have grown by eighteen: closed.
        let mut byte = [0u8; 1];
        let last = kept.last_mut().unwrap();
        let read = tokio::time::timeout(Duration::from_secs(60), last.read(&mut byte))
            .await
            .expect("the refused connection was left open");
        assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
        let before = l.stats().accepted();
        let _other = connect_from([127, 0, 0, 2], to).await;
        until(|| l.stats().accepted() == before + 1).await;
        drop(l);
    }
}
