//! Thin tokio drivers: they own the sockets and move bytes between them and the sans-I/O
//! [`Endpoint`] and [`Middlebox`]; no protocol decision is taken here.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use mbx_blindbox::detect::EncryptedRules;
use mbx_blindbox::flow::FlowConfig;
use mbx_blindbox::fullrule::FullRuleSet;
use mbx_blindbox::SessionKeys;
use mbx_engine::TlsConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::{TcpStream, ToSocketAddrs};
use tokio::sync::mpsc;

use crate::endpoint::{Endpoint, EndpointEvent};
use crate::middlebox::{Middlebox, MiddleboxEvent, Peer};
use crate::NetError;

const READ_BUF: usize = 64 * 1024;

/// The middlebox's detection state for one connection.
pub type Rules = (Arc<EncryptedRules>, Arc<FullRuleSet>);
/// A pending rule setup; `Err` refuses the connection with that reason.
pub type RuleFuture = Pin<Box<dyn Future<Output = Result<Rules, String>> + Send>>;
/// Starts the rule setup of a connection once both endpoints finished their handshake.
pub type RuleSource = Arc<dyn Fn() -> RuleFuture + Send + Sync>;
/// Called with the endpoint's BlindBox keys right after its handshake: the endpoint side of
/// the rule setup starts here (tests use it to compute the rules directly).
pub type KeysHook = Arc<dyn Fn(&SessionKeys) + Send + Sync>;

/// Why a driver stopped.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    #[error("{context}: {source}")]
    Io {
        context: &'static str,
        source: std::io::Error,
    },
    #[error(transparent)]
    Net(#[from] NetError),
    #[error("the {0} closed the connection during the handshake")]
    Closed(&'static str),
}

fn io(context: &'static str) -> impl FnOnce(std::io::Error) -> DriverError {
    move |source| DriverError::Io { context, source }
}

/// A BlindBox endpoint on a TCP connection to the middlebox.
pub struct BlindBoxStream {
    stream: TcpStream,
    ep: Endpoint,
    buf: Vec<u8>,
    hook: Option<KeysHook>,
    peer_eof: bool,
}

impl BlindBoxStream {
    /// Connects to the middlebox as the client and runs until data may flow.
    pub async fn connect(
        middlebox: impl ToSocketAddrs,
        tls: &TlsConfig,
        flow: FlowConfig,
        hook: Option<KeysHook>,
    ) -> Result<Self, DriverError> {
        let stream = TcpStream::connect(middlebox)
            .await
            .map_err(io("cannot connect to the middlebox"))?;
        Self::start(stream, tls, flow, hook).await
    }

    /// Serves an accepted connection from the middlebox as the server, until data may flow.
    pub async fn accept(
        stream: TcpStream,
        tls: &TlsConfig,
        flow: FlowConfig,
        hook: Option<KeysHook>,
    ) -> Result<Self, DriverError> {
        Self::start(stream, tls, flow, hook).await
    }

    async fn start(
        stream: TcpStream,
        tls: &TlsConfig,
        flow: FlowConfig,
        hook: Option<KeysHook>,
    ) -> Result<Self, DriverError> {
        let _ = stream.set_nodelay(true);
        let mut s = BlindBoxStream {
            stream,
            ep: Endpoint::new(tls, flow)?,
            buf: vec![0u8; READ_BUF],
            hook,
            peer_eof: false,
        };
        s.flush().await?;
        while !s.ep.is_ready() {
            if !s.read_some().await? {
                return Err(DriverError::Closed("middlebox"));
            }
        }
        Ok(s)
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
        while let Some(ev) = self.ep.poll_event() {
            if ev == EndpointEvent::HandshakeDone {
                if let (Some(hook), Some(keys)) = (&self.hook, self.ep.session_keys()) {
                    hook(keys);
                }
            }
        }
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

/// What happened at the middlebox during one connection.
#[derive(Debug, Clone)]
pub struct MiddleboxReport {
    pub events: Vec<MiddleboxEvent>,
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

/// Serves one connection: connects to `next_hop`, forwards both streams while detecting, and
/// installs the rules `rules` produces once both endpoints finished their handshake. A blocking
/// rule closes both connections.
pub async fn serve_middlebox(
    client: TcpStream,
    next_hop: &str,
    rules: RuleSource,
) -> MiddleboxReport {
    let mut events = Vec::new();
    let outcome = relay(client, next_hop, rules, &mut events)
        .await
        .map_err(|e| e.to_string());
    MiddleboxReport { events, outcome }
}

async fn relay(
    client: TcpStream,
    next_hop: &str,
    rules: RuleSource,
    events: &mut Vec<MiddleboxEvent>,
) -> Result<(), DriverError> {
    let server = TcpStream::connect(next_hop)
        .await
        .map_err(io("cannot connect to the next hop"))?;
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
    let mut mb = Middlebox::new();
    let mut pending: Option<RuleFuture> = None;
    let mut open = [true, true];
    let (mut buf_c, mut buf_s) = (vec![0u8; READ_BUF], vec![0u8; READ_BUF]);
    let result = loop {
        if !open[0] && !open[1] {
            break Ok(());
        }
        let step: Result<(), DriverError> = tokio::select! {
            r = client_r.read(&mut buf_c), if open[0] => match r.map_err(io("reading from the client"))? {
                0 => { open[0] = false; mb.peer_ended(Peer::Client); let _ = to_server.send(Out::Fin).await; Ok(()) }
                n => mb.receive(Peer::Client, buf_c.get(..n).unwrap_or_default()).map_err(Into::into),
            },
            r = server_r.read(&mut buf_s), if open[1] => match r.map_err(io("reading from the server"))? {
                0 => { open[1] = false; mb.peer_ended(Peer::Server); let _ = to_client.send(Out::Fin).await; Ok(()) }
                n => mb.receive(Peer::Server, buf_s.get(..n).unwrap_or_default()).map_err(Into::into),
            },
            r = async { match pending.as_mut() { Some(f) => f.await, None => std::future::pending().await } } => {
                pending = None;
                match r {
                    Ok((enc, full)) => mb.install_rules(enc, full).map_err(Into::into),
                    Err(why) => { mb.refuse(&why); Err(NetError::Refused(why).into()) }
                }
            }
        };
        // What the core queued (forwarded bytes, Ready, a refusal) leaves even after an error.
        for (peer, tx) in [(Peer::Client, &to_client), (Peer::Server, &to_server)] {
            let out = mb.take_outgoing(peer);
            if !out.is_empty() {
                let _ = tx.send(Out::Data(out)).await;
            }
        }
        let mut blocked = false;
        while let Some(ev) = mb.poll_event() {
            match &ev {
                MiddleboxEvent::NeedRules => pending = Some(rules()),
                MiddleboxEvent::Detection(_, mbx_blindbox::flow::MbEvent::Blocked { .. }) => {
                    blocked = true
                }
                _ => {}
            }
            tracing::debug!(?ev, "blindbox middlebox");
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
    result
}
