//! The client as a local proxy ([`ClientProxy`]): every plain-TCP connection accepted from a
//! local application gets its own mbTLS session through the first hop, and the two are
//! spliced ([`MbtlsClient::proxy_until_idle`]). It is a long-running service like the
//! middlebox and the server, so it shares their listener ([`Listening`]: accept backoff,
//! connection limit, drain) and their [`Limits`].

use std::net::SocketAddr;

use tokio::net::{TcpStream, ToSocketAddrs};

use super::accept::{Listening, ServiceConfig};
use super::client::{MbtlsClient, MiddleboxVerdict};
use super::connection::HandshakeProgress;
use super::reports::{Absorb, Pending};
use super::splice::{answer_and_close, reset_when_closed, Carried};
use super::{DriverError, Limits};
use crate::handshake::{ClientHandshakeConfig, SessionSummary};

/// What a client proxy needs.
#[derive(Clone)]
pub struct ClientProxyConfig {
    /// The sessions' configuration (`now_unix` is replaced by the current time for each session,
    /// by [`MbtlsClient::connect`]).
    pub handshake: ClientHandshakeConfig,
    /// The first hop (`host:port`): the first middlebox, or the server itself.
    pub first_hop: String,
    /// The session's handshake (connect included) must finish within `handshake_timeout`; a
    /// session idle for `idle_timeout` is closed; at most `max_connections` at once.
    pub limits: Limits,
    /// When set, a local connection whose session fails before the server sent anything
    /// (first hop unreachable, handshake refused or timed out, the server's refusal right
    /// after its handshake) is sent what this makes of the error, and closed (e.g. an HTTP
    /// 502 with `Connection: close` and the reason); otherwise it is reset. The error's text
    /// may quote what a peer sent: escape what of it goes in (as [`printable_error`] does).
    pub session_failed_answer: Option<SessionFailedAnswer>,
}

impl ClientProxyConfig {
    /// A proxy whose sessions are made with `handshake` through `first_hop` (`host:port`),
    /// with the default [`Limits`] and a reset for a local connection whose session fails
    /// (change the fields to set them).
    pub fn new(handshake: ClientHandshakeConfig, first_hop: impl Into<String>) -> Self {
        ClientProxyConfig {
            handshake,
            first_hop: first_hop.into(),
            limits: Limits::default(),
            session_failed_answer: None,
        }
    }
}

/// What a failed session's error becomes for the local application (see
/// [`ClientProxyConfig::session_failed_answer`]).
pub type AnswerFn = dyn Fn(&DriverError) -> Vec<u8> + Send + Sync;

/// See [`ClientProxyConfig::session_failed_answer`].
pub type SessionFailedAnswer = std::sync::Arc<AnswerFn>;

/// An answer of `head` (e.g. an HTTP 502 head and the start of its body), then the error's
/// text with control characters replaced and a line break.
pub fn answer_with_error(head: &[u8]) -> SessionFailedAnswer {
    let head = head.to_vec();
    std::sync::Arc::new(move |e| {
        let mut out = head.clone();
        out.extend_from_slice(printable_error(e).as_bytes());
        out.push(b'\n');
        out
    })
}

/// `e`'s text with its control characters replaced (it may quote what a peer sent).
pub fn printable_error(e: &DriverError) -> String {
    mbx_wire::printable(&e.to_string())
}

/// The outcome of one proxied connection.
#[derive(Debug, Clone)]
pub struct ProxyReport {
    /// Connection number, from 0 in accept order.
    pub id: u64,
    /// The local application's address.
    pub local_peer: Option<SocketAddr>,
    /// This proxy's own address on its connection to the first hop, which the first hop
    /// reports the connection from: a failed session, which has no key fingerprints, is
    /// matched between the two reports by it.
    pub first_hop_local: Option<SocketAddr>,
    /// The mbTLS session came up (its handshake finished).
    pub connected: bool,
    /// What the client decided about each middlebox that spoke, in the order they were
    /// checked (empty: none did), and the session's hops.
    pub verdicts: Vec<MiddleboxVerdict>,
    pub summary: Option<SessionSummary>,
    /// Bytes carried from the local application to the server and back, however the session
    /// ended.
    pub bytes_up: u64,
    pub bytes_down: u64,
    /// TLS 1.3 KeyUpdates the server sent, followed (and answered when it asked).
    pub key_updates: u32,
    /// The session ended without an error, but the server left after our close_notify without
    /// its own: the local connection was reset all the same, since a cut there looks the same.
    pub peer_left_without_close_notify: bool,
    /// From the accept of the local connection: until the mbTLS session's data phase started
    /// (the first hop's connection included), and until both ended.
    pub durations: super::Durations,
    /// Its listener cut the session when it stopped ([`CUT_AT_STOP`](super::CUT_AT_STOP)).
    pub cut_at_stop: bool,
    /// `Err` with the reason when the session failed or did not end cleanly.
    pub outcome: Result<(), String>,
    /// The error itself, when the session failed with one (the outcome's text comes from it),
    /// for a caller that says what would fix it (as the one-shot client does).
    pub error: Option<std::sync::Arc<DriverError>>,
}

impl super::reports::Report for ProxyReport {
    const WHAT: &'static str = "mbtls proxied connection";
    fn outcome_mut(&mut self) -> &mut Result<(), String> {
        &mut self.outcome
    }
    fn id(&self) -> u64 {
        self.id
    }
    fn outcome(&self) -> &Result<(), String> {
        &self.outcome
    }
    fn middlebox_took_part(&self) -> bool {
        self.summary
            .as_ref()
            .is_some_and(SessionSummary::middlebox_joined)
    }
    fn bytes(&self) -> (u64, u64) {
        (self.bytes_up, self.bytes_down)
    }
    fn key_updates(&self) -> u64 {
        u64::from(self.key_updates)
    }
    fn durations_mut(&mut self) -> &mut super::Durations {
        &mut self.durations
    }
    fn mark_cut_at_stop(&mut self) {
        self.cut_at_stop = true;
    }
}

impl ServiceConfig for ClientProxyConfig {
    fn limits(&self) -> &Limits {
        &self.limits
    }
    fn check(&self) -> Result<(), DriverError> {
        self.handshake.check().map_err(DriverError::config)
    }
}

/// A listening client proxy ([`Listening`] with a [`ProxyReport`] per local connection).
pub type ClientProxy = Listening<ProxyReport, ClientProxyConfig>;

impl Listening<ProxyReport, ClientProxyConfig> {
    /// Binds `listen` (a local address) and proxies connections in the background (needs a
    /// tokio runtime).
    pub async fn bind(
        listen: impl ToSocketAddrs,
        cfg: ClientProxyConfig,
    ) -> Result<ClientProxy, DriverError> {
        Listening::spawn(listen, cfg, move |id, local, peer, cfg, reports| {
            let report = ProxyReport::new(id, Some(peer));
            let mut pending = Pending::new(report, Carried::default(), reports);
            let accepted = pending.accepted();
            async move {
                if let Some((report, carried)) = pending.parts() {
                    serve(report, carried, local, &cfg, accepted).await;
                }
                pending.send();
            }
        })
        .await
    }
}

impl ProxyReport {
    fn new(id: u64, local_peer: Option<SocketAddr>) -> Self {
        ProxyReport {
            id,
            local_peer,
            first_hop_local: None,
            connected: false,
            verdicts: Vec::new(),
            summary: None,
            bytes_up: 0,
            bytes_down: 0,
            key_updates: 0,
            peer_left_without_close_notify: false,
            durations: super::Durations::default(),
            cut_at_stop: false,
            outcome: Ok(()),
            error: None,
        }
    }

    /// [`verdicts`](Self::verdicts) in path order (as the summary names the middleboxes that
    /// joined), the excluded ones after them.
    pub fn verdicts_in_path_order(&self) -> Vec<&MiddleboxVerdict> {
        super::client::in_summary_order(&self.verdicts, self.summary.as_ref())
    }

    /// The kind of the failure that ended the session, if one did (as a middlebox's report
    /// has it).
    pub fn error_kind(&self) -> Option<super::ErrorKind> {
        self.error.as_ref().map(|e| e.kind())
    }
}

/// What the splice counted, into the report (also for a connection cut mid-way).
impl Absorb<Carried> for ProxyReport {
    fn absorb(&mut self, carried: &Carried) {
        (self.bytes_up, self.bytes_down) = (carried.from_plain, carried.to_plain);
        self.key_updates = carried.peer_key_updates;
        self.peer_left_without_close_notify = carried.peer_left_without_close_notify;
    }
}

/// Fills `report` and `carried` as it goes (a connection cut mid-way still reports what it
/// did); its handshake's duration counts from `accepted`.
async fn serve(
    report: &mut ProxyReport,
    carried: &mut Carried,
    local: TcpStream,
    cfg: &ClientProxyConfig,
    accepted: tokio::time::Instant,
) {
    let _ = local.set_nodelay(true);
    // A local connection whose session never carried it in order is reset, not closed: from
    // its handshake on (failed, timed out, or cut by a stop) to the splice's end.
    let ready = reset_when_closed(&local, true).map_err(DriverError::io(
        "cannot set the local connection to reset when cut",
    ));
    let r = match ready {
        Ok(()) => proxy_one(local, cfg, (report, carried), accepted).await,
        Err(e) => Err(e),
    };
    if let Err(e) = r {
        report.outcome = Err(e.to_string());
        report.error = Some(std::sync::Arc::new(e));
    }
}

/// The session for one local connection: its handshake within the limit, then the splice.
async fn proxy_one(
    local: TcpStream,
    cfg: &ClientProxyConfig,
    (report, carried): (&mut ProxyReport, &mut Carried),
    accepted: tokio::time::Instant,
) -> Result<(), DriverError> {
    let limits = cfg.limits;
    let mut progress = HandshakeProgress::default();
    let connecting = async {
        let stream = TcpStream::connect(cfg.first_hop.as_str())
            .await
            .map_err(DriverError::io("cannot connect to the first hop"))?;
        report.first_hop_local = stream.local_addr().ok();
        // The configuration was checked when it was bound or reloaded: the core takes it.
        MbtlsClient::handshake_on(stream, cfg.handshake.clone(), &[], &mut progress).await
    };
    let connected = tokio::time::timeout(limits.handshake_timeout, connecting).await;
    // Kept by the handshake as it went, when it failed or timed out too.
    report.verdicts = std::mem::take(&mut progress.verdicts);
    let connected = connected
        .map_err(|_| DriverError::HandshakeTimeout {
            after: limits.handshake_timeout,
            waiting_for: progress.waiting_for.take(),
        })
        .and_then(|c| c);
    let session = match connected {
        Ok(session) => session,
        Err(e) => {
            if let Some(answer) = &cfg.session_failed_answer {
                let mut local = local;
                answer_and_close(&mut local, &answer(&e)).await;
            }
            return Err(e);
        }
    };
    // `report.verdicts` has them all: kept up to date by the handshake.
    report.connected = true;
    report.durations.handshake = Some(accepted.elapsed());
    report.summary = session.summary().cloned();
    let answer = cfg.session_failed_answer.as_deref();
    session
        .carry(local, limits.idle_timeout, answer, carried)
        .await
}
