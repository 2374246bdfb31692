//! The server driver: accept connections (from a client or a server-side middlebox), run the
//! [`ServerHandshake`] core, then pass the decrypted byte stream to a plain TCP backend (e.g. a
//! local HTTP server) and its answers back, both directions at once.

use std::net::SocketAddr;
use std::time::SystemTime;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, ToSocketAddrs};
use tokio::time::timeout;

use super::accept::{Listening, ServiceConfig};
use super::client::MiddleboxVerdict;
use super::connection::{Connection, Session};
use super::reports::{Absorb, Pending};
use super::splice::{
    close_reading_the_rest, reset_when_closed, splice, Carried, EndpointSession, Sides,
};
use super::{
    DriverError, Limits, CLOSE_GRACE, FAILED_HANDSHAKE_LINGER, READ_BUF, READ_RESET, WRITE_RESET,
};
use crate::handshake::{ServerHandshake, ServerHandshakeConfig, SessionSummary};

/// What an mbTLS server needs.
#[derive(Clone)]
pub struct MbtlsServerConfig {
    /// Certificates, policy and the expected server-side middlebox. `now_unix` is replaced by
    /// the current time for each connection.
    pub handshake: ServerHandshakeConfig,
    /// The plain-TCP backend (`host:port`) each session's plaintext is passed to.
    pub backend: String,
    /// When a stalled handshake or an idle session is closed (the session's sockets to the
    /// previous hop and to the backend), and how many sessions are served at once.
    pub limits: Limits,
    /// What the client is sent, then our close_notify, when the backend cannot be reached
    /// (`None`: a fatal `internal_error` alert instead, or, in a session that stayed in
    /// OpenSSL because no middlebox of the server's side joined, just the end of the
    /// connection). The CLI sends an HTTP `502 Bad Gateway`, as a reverse proxy does; the
    /// session is reported as failed either way.
    pub backend_unavailable: Option<Vec<u8>>,
}

impl MbtlsServerConfig {
    /// A server with `handshake` in front of the plain-TCP `backend` (`host:port`), with the
    /// default [`Limits`] and no answer when the backend cannot be reached (change the fields
    /// to set them).
    pub fn new(handshake: ServerHandshakeConfig, backend: impl Into<String>) -> Self {
        MbtlsServerConfig {
            handshake,
            backend: backend.into(),
            limits: Limits::default(),
            backend_unavailable: None,
        }
    }
}

/// The outcome of one session.
#[derive(Debug, Clone)]
pub struct ServerConnectionReport {
    pub id: u64,
    pub peer: Option<SocketAddr>,
    /// What the server decided about each middlebox that announced itself, in the order they
    /// were checked (empty: none did).
    pub verdicts: Vec<MiddleboxVerdict>,
    pub summary: Option<SessionSummary>,
    /// Plaintext bytes passed to the backend and back.
    pub bytes_to_backend: u64,
    pub bytes_from_backend: u64,
    /// How often the session's read buffers were freed after `IDLE_TRIM_AFTER` (2 s) without a
    /// read (they are allocated again when a socket becomes readable).
    pub idle_trims: u32,
    /// TLS 1.3 KeyUpdates the client sent, followed (and answered when it asked).
    pub key_updates: u32,
    /// The session ended without an error, but the client left after our close_notify without
    /// its own (as HTTP clients may): the backend's connection was reset all the same, since a
    /// cut there looks the same.
    pub peer_left_without_close_notify: bool,
    /// From the accept: until the data phase started, and until the session ended.
    pub durations: super::Durations,
    /// Its listener cut the session when it stopped ([`CUT_AT_STOP`](super::CUT_AT_STOP)).
    pub cut_at_stop: bool,
    /// `Err` with the reason when the session did not end cleanly.
    pub outcome: Result<(), String>,
    /// The error itself, when the session failed with one (the outcome's text comes from it),
    /// for a caller that says what would fix it (a policy that refused a middlebox, one that
    /// did not join).
    pub error: Option<std::sync::Arc<DriverError>>,
}

impl super::reports::Report for ServerConnectionReport {
    const WHAT: &'static str = "mbtls server session";
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
        (self.bytes_to_backend, self.bytes_from_backend)
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

impl ServiceConfig for MbtlsServerConfig {
    fn limits(&self) -> &Limits {
        &self.limits
    }
    fn check(&self) -> Result<(), DriverError> {
        self.handshake.check().map_err(DriverError::config)
    }
}

/// A listening mbTLS server ([`Listening`] with a [`ServerConnectionReport`] per session).
pub type MbtlsServer = Listening<ServerConnectionReport, MbtlsServerConfig>;

impl Listening<ServerConnectionReport, MbtlsServerConfig> {
    /// Binds `listen` and serves sessions in the background (needs a tokio runtime).
    pub async fn bind(
        listen: impl ToSocketAddrs,
        cfg: MbtlsServerConfig,
    ) -> Result<MbtlsServer, DriverError> {
        Listening::spawn(listen, cfg, move |id, stream, peer, cfg, reports| {
            let report = ServerConnectionReport::new(id, Some(peer));
            let mut pending = Pending::new(report, Carried::default(), reports);
            let accepted = pending.accepted();
            async move {
                if let Some((report, carried)) = pending.parts() {
                    serve(report, carried, stream, &cfg, accepted).await;
                }
                pending.send();
            }
        })
        .await
    }
}

/// An mbTLS server session over one accepted TCP connection, after its handshake, for an
/// application that serves mbTLS itself instead of passing the plaintext to a TCP backend
/// ([`MbtlsServer`]): it reads and writes application data, closes, and updates its keys
/// ([`Connection`]'s methods).
pub type MbtlsServerConnection = Connection<ServerHandshake>;

impl Connection<ServerHandshake> {
    /// Runs the server's handshake on an accepted connection until the data phase starts (the
    /// server-side middleboxes verified and given their keys, or a session without them).
    /// `cfg.now_unix` is replaced by the current time. There is no timeout here: bound it as
    /// the service does ([`Limits::handshake_timeout`](super::Limits::handshake_timeout)).
    pub async fn accept(
        stream: TcpStream,
        mut cfg: ServerHandshakeConfig,
    ) -> Result<MbtlsServerConnection, DriverError> {
        cfg.now_unix = mbx_attest::unix_seconds(SystemTime::now());
        let hs = ServerHandshake::new(cfg)?;
        Connection::handshake(stream, hs).await
    }
}

/// Serves one accepted connection until both directions ended or something failed.
pub async fn serve_session(
    id: u64,
    stream: TcpStream,
    peer: Option<SocketAddr>,
    cfg: &MbtlsServerConfig,
) -> ServerConnectionReport {
    let accepted = tokio::time::Instant::now();
    let mut report = ServerConnectionReport::new(id, peer);
    let mut carried = Carried::default();
    serve(&mut report, &mut carried, stream, cfg, accepted).await;
    report.absorb(&carried);
    report.durations.total = accepted.elapsed();
    report
}

impl ServerConnectionReport {
    fn new(id: u64, peer: Option<SocketAddr>) -> Self {
        ServerConnectionReport {
            id,
            peer,
            verdicts: Vec::new(),
            summary: None,
            bytes_to_backend: 0,
            bytes_from_backend: 0,
            idle_trims: 0,
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

/// What the splice counted, into the report (also for a session cut mid-way).
impl Absorb<Carried> for ServerConnectionReport {
    fn absorb(&mut self, carried: &Carried) {
        self.bytes_to_backend = carried.to_plain;
        self.bytes_from_backend = carried.from_plain;
        self.idle_trims = carried.idle_trims;
        self.peer_left_without_close_notify = carried.peer_left_without_close_notify;
        self.key_updates = carried.peer_key_updates;
    }
}

/// Fills `report` and `carried` as it goes (a session cut mid-way still reports what it did);
/// its handshake's duration counts from `accepted`.
async fn serve(
    report: &mut ServerConnectionReport,
    carried: &mut Carried,
    stream: TcpStream,
    cfg: &MbtlsServerConfig,
    accepted: tokio::time::Instant,
) {
    let mut hs_cfg = cfg.handshake.clone();
    hs_cfg.now_unix = mbx_attest::unix_seconds(SystemTime::now());
    // Bound before the session is made, not matched around the awaits below: a matched
    // result would stay in this future beside the session, and an idle session holds the
    // future (measured: 1.4 KB more per idle session).
    let hs = match ServerHandshake::new(hs_cfg) {
        Ok(hs) => hs,
        Err(e) => {
            let e = DriverError::from(e);
            report.outcome = Err(e.to_string());
            report.error = Some(std::sync::Arc::new(e));
            return;
        }
    };
    // Borrowed by `run`, not moved into it: a core moved into that future would take its
    // size twice (measured: 2.9 KB more per idle session).
    let mut session = Session::new(hs);
    let r = run(&mut session, stream, cfg, (report, carried), accepted).await;
    // What the session's events told, whether it ended well or not.
    report.verdicts.extend(session.take_verdicts());
    if let Err(e) = r {
        report.outcome = Err(e.to_string());
        report.error = Some(std::sync::Arc::new(e));
    }
}

/// The handshake within its timeout, the backend's connection, then both directions spliced.
async fn run(
    session: &mut Session<ServerHandshake>,
    mut stream: TcpStream,
    cfg: &MbtlsServerConfig,
    (report, carried): (&mut ServerConnectionReport, &mut Carried),
    accepted: tokio::time::Instant,
) -> Result<(), DriverError> {
    let _ = stream.set_nodelay(true);
    let mut buf = vec![0u8; READ_BUF];
    // Handshake: until the data phase starts, within the handshake timeout.
    let deadline = tokio::time::Instant::now() + cfg.limits.handshake_timeout;
    let timed_out = |hs: &ServerHandshake| DriverError::HandshakeTimeout {
        after: cfg.limits.handshake_timeout,
        waiting_for: hs.waiting_for(),
    };
    while !session.hs.data_phase_started() {
        let n = tokio::time::timeout_at(deadline, stream.read(&mut buf))
            .await
            .map_err(|_| timed_out(&session.hs))?
            .map_err(DriverError::on_path(
                SIDES.path,
                SIDES.reading_path,
                READ_RESET,
            ))?;
        if n == 0 {
            return Err(DriverError::PeerGone {
                peer: SIDES.path,
                when: "during the handshake",
            });
        }
        let r = session.hs.receive(buf.get(..n).unwrap_or_default());
        let flushed = tokio::time::timeout_at(deadline, flush(&mut session.hs, &mut stream))
            .await
            .map_err(|_| timed_out(&session.hs))
            .and_then(|f| f);
        if r.is_err() && flushed.is_ok() {
            // The alert just written must reach the client before the connection ends.
            close_reading_the_rest(&mut stream, &[], FAILED_HANDSHAKE_LINGER).await;
        }
        // What the core told before failing (a verdict reached in the same read) is kept too.
        let told = session.events();
        r?;
        told?;
        flushed?;
    }
    report.durations.handshake = Some(accepted.elapsed());
    report.summary = session.hs.summary().cloned();
    // Now, not only at the end: a session cut later (a stop) still reports its middleboxes.
    report.verdicts = session.take_verdicts();
    // Bounded like the handshake: a backend that drops our SYNs must not hold the session
    // for the kernel's two minutes of retries.
    let connected = timeout(
        cfg.limits.handshake_timeout,
        TcpStream::connect(cfg.backend.as_str()),
    )
    .await
    .map_err(|_| DriverError::Io {
        context: "cannot connect to the backend",
        error: std::io::ErrorKind::TimedOut.into(),
    })
    .and_then(|c| c.map_err(DriverError::io("cannot connect to the backend")));
    let backend = match connected {
        Ok(backend) => backend,
        Err(e) => {
            answer_and_close(session, &mut stream, cfg.backend_unavailable.as_deref()).await;
            return Err(e);
        }
    };
    let _ = backend.set_nodelay(true);
    super::keep_alive(&backend);
    // Until the session ends in order, a cut resets the backend's connection (`splice`).
    reset_when_closed(&backend, true).map_err(DriverError::io(
        "cannot set the backend connection to reset when cut",
    ))?;
    // The data phase reads into buffers sized by the traffic, which an idle session frees.
    drop(buf);
    let idle = cfg.limits.idle_timeout;
    splice(session, stream, backend, idle, None, &SIDES, carried).await
}

/// The server's sockets in errors.
const SIDES: Sides = Sides {
    path: "previous hop",
    reading_path: "reading from the previous hop",
    writing_path: "writing to the previous hop",
    plain: "backend",
    reading_plain: "reading from the backend",
    writing_plain: "writing to the backend",
};

/// Best effort, for a session whose backend cannot be reached: `answer` and our
/// close_notify, or without an answer a fatal `internal_error` (so that the client reads the
/// server's failure, not a connection that ended without close_notify, as a cut would look);
/// then [`close_reading_the_rest`]. A session that stayed in OpenSSL has no alert of ours to
/// send: without an answer it just ends.
async fn answer_and_close(
    session: &mut Session<ServerHandshake>,
    stream: &mut TcpStream,
    answer: Option<&[u8]>,
) {
    let sent = match answer {
        Some(answer) => session.write(answer).and_then(|()| session.close()),
        None => session
            .hs
            .abort(
                mbx_engine::AlertDescription::INTERNAL_ERROR,
                "the backend cannot be reached",
            )
            .map_err(DriverError::from),
    };
    if sent.is_err() {
        return;
    }
    let out = session.take_outgoing();
    close_reading_the_rest(stream, &out, CLOSE_GRACE).await;
}

async fn flush(hs: &mut ServerHandshake, stream: &mut TcpStream) -> Result<(), DriverError> {
    let out = hs.take_outgoing();
    if !out.is_empty() {
        stream.write_all(&out).await.map_err(DriverError::on_path(
            SIDES.path,
            SIDES.writing_path,
            WRITE_RESET,
        ))?;
    }
    Ok(())
}
