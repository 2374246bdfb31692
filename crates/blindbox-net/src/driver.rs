//! Thin tokio drivers: they own the sockets and move bytes between them and the sans-I/O
//! [`Endpoint`] and [`Middlebox`]; no protocol decision is taken here.
//!
//! The rule setup's heavy work (garbling at the endpoints, hashing and evaluating at the
//! middlebox) runs inside the state machines; the drivers call them under
//! `tokio::task::block_in_place` on the multi-threaded runtime (inline on a current-thread
//! runtime). An endpoint pulls one setup frame at a time and only when the previous one is
//! written, while it keeps reading, so memory stays bounded by the setup's group and window
//! sizes and neither side can deadlock on full socket buffers.

use std::sync::Arc;
use std::time::{Duration, Instant};

use mbx_blindbox::flow::FlowConfig;
use mbx_blindbox_setup::Progress;
use mbx_engine::TlsConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::{TcpStream, ToSocketAddrs};
use tokio::sync::mpsc;

use crate::control::Control;
use crate::endpoint::{Endpoint, EndpointEvent, SetupConfig};
use crate::middlebox::{Middlebox, MiddleboxEvent, Peer};
use crate::mux::{encode, Stream};
use crate::rules::RuleBook;
use crate::NetError;

const READ_BUF: usize = 64 * 1024;

/// How long the middlebox waits for the TLS handshake and the rule setup of one connection to
/// finish. Without it an endpoint that never sends `HandshakeDone` (or stalls the setup) would
/// hold the connection, its next-hop connection and the setup state forever. Generous: the
/// full community rule set takes about 10 s in a release build on two loaded cores.
pub const SETUP_DEADLINE: Duration = Duration::from_secs(120);

/// Called with every middlebox event as it happens (alerts, setup progress).
pub type EventSink = Arc<dyn Fn(&MiddleboxEvent) + Send + Sync>;

/// What the rule setup cost one party.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SetupStats {
    /// Circuits, and the setup protocol's bytes this party sent and received (its frames;
    /// the hop wire adds 4 bytes per 64 KiB).
    pub progress: Progress,
    /// From the end of the primary handshake (endpoint) or the start of the setup
    /// (middlebox) to `Ready`.
    pub elapsed: Duration,
}

/// Runs CPU-heavy protocol work (garbling, evaluation) off the async executor when the
/// runtime allows it.
fn compute<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}

/// Why a driver stopped.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    #[error("{context}: {error}")]
    Io {
        context: &'static str,
        error: std::io::Error,
    },
    #[error(transparent)]
    Net(#[from] NetError),
    #[error("the {0} closed the connection during the handshake or the rule setup")]
    Closed(&'static str),
}

fn io(context: &'static str) -> impl FnOnce(std::io::Error) -> DriverError {
    move |error| DriverError::Io { context, error }
}

/// A BlindBox endpoint on a TCP connection to the middlebox.
pub struct BlindBoxStream {
    stream: TcpStream,
    ep: Endpoint,
    buf: Vec<u8>,
    peer_eof: bool,
    setup: Option<SetupStats>,
}

impl BlindBoxStream {
    /// Connects to the middlebox as the client and runs the handshake and the rule setup,
    /// until data may flow.
    pub async fn connect(
        middlebox: impl ToSocketAddrs,
        tls: &TlsConfig,
        flow: FlowConfig,
        setup: SetupConfig,
    ) -> Result<Self, DriverError> {
        let stream = TcpStream::connect(middlebox)
            .await
            .map_err(io("cannot connect to the middlebox"))?;
        Self::start(stream, tls, flow, setup).await
    }

    /// Serves an accepted connection from the middlebox as the server: handshake and rule
    /// setup, until data may flow.
    pub async fn accept(
        stream: TcpStream,
        tls: &TlsConfig,
        flow: FlowConfig,
        setup: SetupConfig,
    ) -> Result<Self, DriverError> {
        Self::start(stream, tls, flow, setup).await
    }

    async fn start(
        mut stream: TcpStream,
        tls: &TlsConfig,
        flow: FlowConfig,
        setup: SetupConfig,
    ) -> Result<Self, DriverError> {
        let _ = stream.set_nodelay(true);
        let mut ep = Endpoint::new(tls, flow, setup, &mut rand::rngs::OsRng)?;
        let mut buf = vec![0u8; READ_BUF];
        let mut out: Vec<u8> = Vec::new();
        let mut pos = 0;
        let mut handshake_done = None;
        let mut stats = None;
        let r: Result<(), DriverError> = async {
            let (mut rd, mut wr) = stream.split();
            loop {
                if pos >= out.len() {
                    out = compute(|| ep.poll_transmit())?.unwrap_or_default();
                    pos = 0;
                }
                if ep.is_ready() {
                    // Data may flow. What is queued (the first token-channel frames) is
                    // written now; the peer's data and end are read by the data phase (its
                    // end may already be on the way: it is not an error here).
                    let rest = out.get(pos..).unwrap_or_default();
                    wr.write_all(rest)
                        .await
                        .map_err(io("writing to the middlebox"))?;
                    return Ok(());
                }
                tokio::select! {
                    r = rd.read(&mut buf) => {
                        let n = r.map_err(io("reading from the middlebox"))?;
                        if n == 0 {
                            return Err(DriverError::Closed("middlebox"));
                        }
                        let data = buf.get(..n).unwrap_or_default();
                        compute(|| ep.receive(data))?;
                        while let Some(ev) = ep.poll_event() {
                            match ev {
                                EndpointEvent::HandshakeDone => handshake_done = Some(Instant::now()),
                                EndpointEvent::Ready { setup } => {
                                    stats = Some(SetupStats {
                                        progress: setup,
                                        elapsed: handshake_done.map(|t| t.elapsed()).unwrap_or_default(),
                                    });
                                }
                            }
                        }
                    }
                    w = wr.write(out.get(pos..).unwrap_or_default()), if pos < out.len() => {
                        pos += w.map_err(io("writing to the middlebox"))?;
                    }
                }
            }
        }
        .await;
        if let Err(e) = r {
            // Tell the middlebox why, if our side of the setup failed (best effort), and close
            // without resetting the connection, so it reads that before our close.
            let rest = ep.take_outgoing();
            if !rest.is_empty() {
                let _ = stream.write_all(&rest).await;
            }
            let (rd, mut wr) = stream.into_split();
            let _ = wr.shutdown().await;
            linger(rd).await;
            return Err(e);
        }
        let mut s = BlindBoxStream {
            stream,
            ep,
            buf,
            peer_eof: false,
            setup: stats,
        };
        s.flush().await?;
        Ok(s)
    }

    /// What the rule setup cost this endpoint.
    pub fn setup_stats(&self) -> Option<SetupStats> {
        self.setup
    }

    async fn flush(&mut self) -> Result<(), DriverError> {
        let out = self.ep.take_outgoing();
        if !out.is_empty() {
            self.stream
                .write_all(&out)
                .await
                .map_err(io("writing to the middlebox"))?;
        }
        Ok(())
    }

    /// One socket read fed to the endpoint; `false` on EOF.
    async fn read_some(&mut self) -> Result<bool, DriverError> {
        let n = self
            .stream
            .read(&mut self.buf)
            .await
            .map_err(io("reading from the middlebox"))?;
        if n == 0 {
            self.peer_eof = true;
            return Ok(false);
        }
        let r = self.ep.receive(self.buf.get(..n).unwrap_or_default());
        while self.ep.poll_event().is_some() {}
        let flushed = self.flush().await;
        r?;
        flushed?;
        Ok(true)
    }

    /// Sends application data (sealed on the primary stream, tokenized on the token channel).
    pub async fn write_all(&mut self, data: &[u8]) -> Result<(), DriverError> {
        self.ep.write(data)?;
        self.flush().await
    }

    /// Ends our direction (End frame, close_notify) and half-closes the connection.
    pub async fn finish(&mut self) -> Result<(), DriverError> {
        self.ep.finish()?;
        self.flush().await?;
        self.stream
            .shutdown()
            .await
            .map_err(io("closing our direction"))
    }

    /// Reads until the peer's direction ended and returns its data, validated against its
    /// tokens: a sender that omitted or forged tokens, or a path that altered them, is an error
    /// naming the culprit.
    pub async fn read_to_end(&mut self) -> Result<Vec<u8>, DriverError> {
        let mut all = self.ep.take_plaintext();
        while !self.peer_eof {
            self.read_some().await?;
            all.extend_from_slice(&self.ep.take_plaintext());
        }
        self.ep.peer_ended()?;
        Ok(all)
    }
}

/// Most bytes read and dropped after a failure while waiting for the peer to close.
const LINGER_BYTES: usize = 64 << 20;
/// Longest wait for the peer to close after a failure.
const LINGER_TIME: Duration = Duration::from_secs(10);

/// After a failure and our half-close: reads (and drops) what the peer still sends until it
/// closes too, so the kernel does not answer its data with a reset that could destroy our last
/// message (`Refused`, `Abort`) before the peer read it. Bounded in bytes and time.
async fn linger(mut rd: tokio::net::tcp::OwnedReadHalf) {
    let drain = async {
        let mut buf = vec![0u8; READ_BUF];
        let mut total = 0;
        while total < LINGER_BYTES {
            match rd.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => total += n,
            }
        }
    };
    let _ = tokio::time::timeout(LINGER_TIME, drain).await;
}

/// What happened at the middlebox during one connection.
#[derive(Debug, Clone)]
pub struct MiddleboxReport {
    pub events: Vec<MiddleboxEvent>,
    /// What the rule setup cost the middlebox, once it finished.
    pub setup: Option<SetupStats>,
    /// `Err` with the reason when the connection did not end cleanly.
    pub outcome: Result<(), String>,
}

enum Out {
    Data(Vec<u8>),
    Fin,
}

async fn writer(mut half: OwnedWriteHalf, mut rx: mpsc::Receiver<Out>) {
    while let Some(o) = rx.recv().await {
        let r = match o {
            Out::Data(d) => half.write_all(&d).await,
            Out::Fin => half.shutdown().await,
        };
        if r.is_err() {
            return;
        }
    }
}

/// Serves one connection: connects to `next_hop`, forwards the handshake, runs the rule setup
/// with both endpoints for `book`'s rules, then forwards both streams while detecting. A
/// failed setup refuses the connection; a blocking rule closes both connections. `on_event`
/// sees every event as it happens.
pub async fn serve_middlebox(
    client: TcpStream,
    next_hop: &str,
    book: Arc<RuleBook>,
    on_event: Option<EventSink>,
) -> MiddleboxReport {
    let mut events = Vec::new();
    let mut setup = None;
    let outcome = relay(client, next_hop, book, on_event, &mut events, &mut setup)
        .await
        .map_err(|e| match e {
            DriverError::Net(NetError::Refused(why)) => format!("refused: {why}"),
            other => other.to_string(),
        });
    MiddleboxReport {
        events,
        setup,
        outcome,
    }
}

async fn relay(
    mut client: TcpStream,
    next_hop: &str,
    book: Arc<RuleBook>,
    on_event: Option<EventSink>,
    events: &mut Vec<MiddleboxEvent>,
    setup: &mut Option<SetupStats>,
) -> Result<(), DriverError> {
    let server = match TcpStream::connect(next_hop).await {
        Ok(s) => s,
        Err(e) => {
            // Tell the client rather than just closing.
            let mut msg = Vec::new();
            let why = format!("cannot connect to the next hop {next_hop}: {e}");
            encode(Stream::Control, &Control::Refused(why).encode(), &mut msg);
            let _ = client.write_all(&msg).await;
            let _ = client.shutdown().await;
            return Err(io("cannot connect to the next hop")(e));
        }
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut client_r, client_w) = client.into_split();
    let (mut server_r, server_w) = server.into_split();
    let (to_client, rx_c) = mpsc::channel(64);
    let (to_server, rx_s) = mpsc::channel(64);
    let writers = [
        tokio::spawn(writer(client_w, rx_c)),
        tokio::spawn(writer(server_w, rx_s)),
    ];
    let mut mb = Middlebox::new(book, &mut rand::rngs::OsRng);
    let mut open = [true, true];
    let mut setup_start = None;
    let deadline = tokio::time::Instant::now() + SETUP_DEADLINE;
    let (mut buf_c, mut buf_s) = (vec![0u8; READ_BUF], vec![0u8; READ_BUF]);
    let result = loop {
        if !open[0] && !open[1] {
            break Ok(());
        }
        let step: Result<(), DriverError> = tokio::select! {
            _ = tokio::time::sleep_until(deadline), if !mb.is_ready() => {
                let why = format!(
                    "the handshake and rule setup did not finish within {} s",
                    SETUP_DEADLINE.as_secs()
                );
                mb.refuse(&why);
                Err(NetError::Refused(why).into())
            }
            r = client_r.read(&mut buf_c), if open[0] => match r {
                Err(e) => {
                    // Tell both endpoints before giving up.
                    mb.refuse(&format!("reading from the client failed: {e}"));
                    Err(io("reading from the client")(e))
                }
                Ok(0) => {
                    open[0] = false;
                    let r = mb.peer_ended(Peer::Client);
                    let _ = to_server.send(Out::Fin).await;
                    r.map_err(Into::into)
                }
                Ok(n) => {
                    let data = buf_c.get(..n).unwrap_or_default();
                    compute(|| mb.receive(Peer::Client, data)).map_err(Into::into)
                }
            },
            r = server_r.read(&mut buf_s), if open[1] => match r {
                Err(e) => {
                    // Tell both endpoints before giving up.
                    mb.refuse(&format!("reading from the server failed: {e}"));
                    Err(io("reading from the server")(e))
                }
                Ok(0) => {
                    open[1] = false;
                    let r = mb.peer_ended(Peer::Server);
                    let _ = to_client.send(Out::Fin).await;
                    r.map_err(Into::into)
                }
                Ok(n) => {
                    let data = buf_s.get(..n).unwrap_or_default();
                    compute(|| mb.receive(Peer::Server, data)).map_err(Into::into)
                }
            },
        };
        // What the core queued (forwarded bytes, setup frames, Ready, a refusal) leaves even
        // after an error.
        for (peer, tx) in [(Peer::Client, &to_client), (Peer::Server, &to_server)] {
            let out = mb.take_outgoing(peer);
            if !out.is_empty() {
                let _ = tx.send(Out::Data(out)).await;
            }
        }
        let mut blocked = false;
        while let Some(ev) = mb.poll_event() {
            match &ev {
                MiddleboxEvent::SetupStarted { .. } => setup_start = Some(Instant::now()),
                MiddleboxEvent::SetupDone { progress } => {
                    *setup = Some(SetupStats {
                        progress: *progress,
                        elapsed: setup_start.map(|t| t.elapsed()).unwrap_or_default(),
                    })
                }
                MiddleboxEvent::Detection(_, mbx_blindbox::flow::MbEvent::Blocked { .. }) => {
                    blocked = true
                }
                _ => {}
            }
            tracing::debug!(?ev, "blindbox middlebox");
            if let Some(sink) = &on_event {
                sink(&ev);
            }
            events.push(ev);
        }
        if let Err(e) = step {
            break Err(e);
        }
        if blocked {
            // Policy: a blocked connection is closed on both sides.
            break Ok(());
        }
    };
    drop(to_client);
    drop(to_server);
    for w in writers {
        let _ = w.await;
    }
    if result.is_err() {
        // Both endpoints were told (Refused) and our directions are closed: let them read
        // that before the sockets close.
        tokio::join!(linger(client_r), linger(server_r));
    }
    result
}
