//! A userspace TCP relay that delays each direction by a fixed one-way latency.
//!
//! This kernel has no `tc netem`, so WAN round-trip times are emulated here: every chunk read from
//! one side is stamped on arrival and written to the other side at `arrival + latency`. Deadlines
//! come from arrival stamps, not from the previous write, so delays do not accumulate, and a
//! channel per direction keeps the order. A zero latency is a plain relay.
//!
//! Two optional observers share state with the test:
//! * [`Tap`] records every chunk per direction (e.g. the ciphertext of one hop).
//! * [`FlightCounter`] counts flights: bursts in one direction after the other direction spoke,
//!   so a test can count round trips without looking at clocks.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

/// Chunks buffered per direction before the reader waits (bounds memory at ~64 MiB per direction).
const QUEUE_CHUNKS: usize = 1024;
const READ_BUF: usize = 64 * 1024;

/// Direction of a chunk through the relay.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// From the accepted (downstream) connection to the upstream server.
    ClientToServer,
    /// From the upstream server back to the accepted connection.
    ServerToClient,
}

impl Direction {
    fn index(self) -> usize {
        match self {
            Direction::ClientToServer => 0,
            Direction::ServerToClient => 1,
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panicking test thread must not hide the data from the assertions that follow.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One chunk seen by the tap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TapRecord {
    /// Connection number, in accept order from 0.
    pub conn: u64,
    /// Direction of travel.
    pub direction: Direction,
    /// Arrival time relative to the relay's start (for plots; never assert on it).
    pub offset: Duration,
    /// The bytes as read from the socket.
    pub data: Vec<u8>,
}

/// Shared record of every chunk passing the relay.
#[derive(Debug, Clone, Default)]
pub struct Tap {
    records: Arc<Mutex<Vec<TapRecord>>>,
}

impl Tap {
    /// An empty tap.
    pub fn new() -> Self {
        Self::default()
    }

    /// A copy of all records so far, in arrival order.
    pub fn records(&self) -> Vec<TapRecord> {
        lock(&self.records).clone()
    }

    /// All bytes of one connection in one direction, concatenated.
    pub fn bytes(&self, conn: u64, direction: Direction) -> Vec<u8> {
        lock(&self.records)
            .iter()
            .filter(|r| r.conn == conn && r.direction == direction)
            .flat_map(|r| r.data.iter().copied())
            .collect()
    }

    /// Forgets everything recorded so far.
    pub fn clear(&self) {
        lock(&self.records).clear();
    }

    fn push(&self, record: TapRecord) {
        lock(&self.records).push(record);
    }
}

#[derive(Debug, Default)]
struct FlightState {
    /// Per connection: direction of the last chunk, and the flight sequence.
    conns: std::collections::HashMap<u64, (Option<Direction>, Vec<Direction>)>,
}

/// Counts flights: a flight starts when bytes arrive in one direction and the previous bytes on
/// that connection went the other way (or nothing went yet). A ping-pong of `n` exchanges is `2n`
/// flights.
///
/// Flights are cut on arrival at the relay, so two writes by one peer without waiting for the
/// other are one flight, which is what a round-trip count needs.
#[derive(Debug, Clone, Default)]
pub struct FlightCounter {
    state: Arc<Mutex<FlightState>>,
}

impl FlightCounter {
    /// A counter at zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Total flights over all connections.
    pub fn total(&self) -> usize {
        lock(&self.state)
            .conns
            .values()
            .map(|(_, seq)| seq.len())
            .sum()
    }

    /// Flights on one connection, in order.
    pub fn sequence(&self, conn: u64) -> Vec<Direction> {
        lock(&self.state)
            .conns
            .get(&conn)
            .map(|(_, seq)| seq.clone())
            .unwrap_or_default()
    }

    /// Flights on one connection in one direction.
    pub fn count(&self, conn: u64, direction: Direction) -> usize {
        self.sequence(conn)
            .iter()
            .filter(|d| **d == direction)
            .count()
    }

    /// Client-initiated round trips on one connection: the number of client flights that were
    /// answered by a server flight.
    pub fn round_trips(&self, conn: u64) -> usize {
        self.sequence(conn)
            .windows(2)
            .filter(|w| w == &[Direction::ClientToServer, Direction::ServerToClient])
            .count()
    }

    fn observe(&self, conn: u64, direction: Direction) {
        let mut state = lock(&self.state);
        let (last, seq) = state.conns.entry(conn).or_default();
        if *last != Some(direction) {
            seq.push(direction);
            *last = Some(direction);
        }
    }
}

/// Errors from starting the relay.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// Binding the listener failed.
    #[error("binding relay listener on {addr}: {error}")]
    Bind {
        /// Requested address.
        addr: SocketAddr,
        /// Underlying error.
        error: std::io::Error,
    },
}

/// Builder for [`DelayRelay`].
#[derive(Debug, Clone)]
pub struct DelayRelayBuilder {
    upstream: SocketAddr,
    listen: SocketAddr,
    latency: [Duration; 2],
    tap: Option<Tap>,
    flights: Option<FlightCounter>,
}

impl DelayRelayBuilder {
    /// Address to listen on (default `127.0.0.1:0`).
    pub fn listen(mut self, addr: SocketAddr) -> Self {
        self.listen = addr;
        self
    }

    /// One-way latency applied to both directions.
    pub fn latency(mut self, latency: Duration) -> Self {
        self.latency = [latency, latency];
        self
    }

    /// One-way latency for a single direction.
    pub fn latency_for(mut self, direction: Direction, latency: Duration) -> Self {
        if let Some(slot) = self.latency.get_mut(direction.index()) {
            *slot = latency;
        }
        self
    }

    /// Records every chunk into `tap`.
    pub fn tap(mut self, tap: Tap) -> Self {
        self.tap = Some(tap);
        self
    }

    /// Counts flights into `counter`.
    pub fn flights(mut self, counter: FlightCounter) -> Self {
        self.flights = Some(counter);
        self
    }

    /// Binds the listener and starts relaying. Must be called inside a tokio runtime.
    pub async fn start(self) -> Result<DelayRelay, RelayError> {
        let listener = TcpListener::bind(self.listen)
            .await
            .map_err(|error| RelayError::Bind {
                addr: self.listen,
                error,
            })?;
        let local_addr = listener.local_addr().map_err(|error| RelayError::Bind {
            addr: self.listen,
            error,
        })?;
        let shared = Arc::new(Shared {
            upstream: self.upstream,
            latency: self.latency,
            tap: self.tap,
            flights: self.flights,
            start: Instant::now(),
            accepted: AtomicU64::new(0),
        });
        let task = tokio::spawn(accept_loop(listener, shared.clone()));
        Ok(DelayRelay {
            local_addr,
            shared,
            task,
        })
    }
}

struct Shared {
    upstream: SocketAddr,
    latency: [Duration; 2],
    tap: Option<Tap>,
    flights: Option<FlightCounter>,
    start: Instant,
    accepted: AtomicU64,
}

/// A running delay relay. Dropping it stops the listener and every relayed connection.
#[derive(Debug)]
pub struct DelayRelay {
    local_addr: SocketAddr,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("upstream", &self.upstream)
            .field("latency", &self.latency)
            .finish_non_exhaustive()
    }
}

impl DelayRelay {
    /// Starts building a relay towards `upstream`.
    pub fn builder(upstream: SocketAddr) -> DelayRelayBuilder {
        DelayRelayBuilder {
            upstream,
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            latency: [Duration::ZERO; 2],
            tap: None,
            flights: None,
        }
    }

    /// A relay on `127.0.0.1:0` towards `upstream` with the same `latency` both ways.
    pub async fn start(upstream: SocketAddr, latency: Duration) -> Result<DelayRelay, RelayError> {
        Self::builder(upstream).latency(latency).start().await
    }

    /// The bound address clients connect to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Upstream address.
    pub fn upstream(&self) -> SocketAddr {
        self.shared.upstream
    }

    /// Connections accepted so far (the next connection's number in tap/flight records).
    pub fn accepted(&self) -> u64 {
        self.shared.accepted.load(Ordering::Relaxed)
    }

    /// Stops the listener and all connections (same as dropping).
    pub fn shutdown(self) {}
}

impl Drop for DelayRelay {
    fn drop(&mut self) {
        // Aborting the accept task drops its JoinSet, which aborts every connection task.
        self.task.abort();
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                match accepted {
                    Ok((stream, _peer)) => {
                        let id = shared.accepted.fetch_add(1, Ordering::Relaxed);
                        conns.spawn(relay_connection(id, stream, shared.clone()));
                    }
                    Err(e) => {
                        // Transient accept errors (e.g. EMFILE) must not end the relay.
                        tracing::warn!(error = %e, "relay accept failed");
                        tokio::task::yield_now().await;
                    }
                }
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

async fn relay_connection(id: u64, downstream: TcpStream, shared: Arc<Shared>) {
    let upstream = match TcpStream::connect(shared.upstream).await {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(conn = id, error = %e, upstream = %shared.upstream, "relay upstream connect failed");
            return;
        }
    };
    let _ = downstream.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let (down_r, down_w) = downstream.into_split();
    let (up_r, up_w) = upstream.into_split();
    let mut tasks = JoinSet::new();
    for (reader, writer, dir) in [
        (down_r, up_w, Direction::ClientToServer),
        (up_r, down_w, Direction::ServerToClient),
    ] {
        let (tx, rx) = mpsc::channel(QUEUE_CHUNKS);
        tasks.spawn(read_side(id, reader, tx, dir, shared.clone()));
        let latency = shared.latency.get(dir.index()).copied().unwrap_or_default();
        tasks.spawn(write_side(writer, rx, latency));
    }
    while tasks.join_next().await.is_some() {}
}

enum Item {
    Data(Instant, Vec<u8>),
    Eof(Instant),
}

async fn read_side(
    id: u64,
    mut reader: OwnedReadHalf,
    tx: mpsc::Sender<Item>,
    dir: Direction,
    shared: Arc<Shared>,
) {
    let mut buf = vec![0u8; READ_BUF];
    loop {
        // A read error (e.g. reset) ends this direction like EOF: the other side sees a FIN.
        let n: usize = reader.read(&mut buf).await.unwrap_or_default();
        let now = Instant::now();
        if n == 0 {
            let _ = tx.send(Item::Eof(now)).await;
            return;
        }
        let data = buf.get(..n).map(<[u8]>::to_vec).unwrap_or_default();
        if let Some(flights) = &shared.flights {
            flights.observe(id, dir);
        }
        if let Some(tap) = &shared.tap {
            tap.push(TapRecord {
                conn: id,
                direction: dir,
                offset: now.duration_since(shared.start),
                data: data.clone(),
            });
        }
        if tx.send(Item::Data(now, data)).await.is_err() {
            return;
        }
    }
}

async fn write_side(mut writer: OwnedWriteHalf, mut rx: mpsc::Receiver<Item>, latency: Duration) {
    while let Some(item) = rx.recv().await {
        match item {
            Item::Data(arrived, data) => {
                if !latency.is_zero() {
                    sleep_until_precisely(arrived + latency).await;
                }
                if writer.write_all(&data).await.is_err() {
                    return;
                }
            }
            Item::Eof(arrived) => {
                if !latency.is_zero() {
                    sleep_until_precisely(arrived + latency).await;
                }
                let _ = writer.shutdown().await;
                return;
            }
        }
    }
}

/// Sleeps until `deadline` with sub-millisecond precision.
///
/// tokio's timer wheel has 1 ms granularity and rounds deadlines up, so every emulated traversal
/// would arrive up to 1 ms late, and a handshake crosses a relay 4-6 times. The coarse part of the
/// wait stays on the timer wheel; the last stretch is a real `nanosleep` on the blocking pool.
async fn sleep_until_precisely(deadline: Instant) {
    let coarse_margin = Duration::from_millis(2);
    if let Some(coarse) = deadline.checked_sub(coarse_margin) {
        if coarse > Instant::now() {
            tokio::time::sleep_until(coarse).await;
        }
    }
    let remaining = deadline.saturating_duration_since(Instant::now());
    if !remaining.is_zero() {
        let _ = tokio::task::spawn_blocking(move || std::thread::sleep(remaining)).await;
    }
    // Under a paused (virtual) clock the real sleep did not move time: finish on the timer wheel.
    if Instant::now() < deadline {
        tokio::time::sleep_until(deadline).await;
    }
}
