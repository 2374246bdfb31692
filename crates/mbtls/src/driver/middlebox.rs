//! The middlebox driver: accept a connection, connect it to the next hop, and move bytes
//! between the two sockets and [`MiddleboxHandshake`] (handshake, then relay), both directions
//! at once. One report per connection says what happened.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mbx_apps::{CatchPanic, ConnectionInfo, MiddleboxApp};
use mbx_record::TlsVersion;
use tokio::net::{TcpStream, ToSocketAddrs};

use super::accept::{Listening, ServiceConfig};
use super::outbox::Outbox;
use super::quiet::{Activity, Due};
use super::read_buf::{read_into, ReadBuf, READ_BUF_MAX};
use super::reports::Pending;
use super::splice::discard_until_eof;
use super::{DriverError, Limits, CLOSE_GRACE, FAILED_HANDSHAKE_LINGER, WRITE_RESET};
use crate::handshake::{
    legacy_refusal, HandshakeError, HopFingerprint, MiddleboxHandshake, MiddleboxHandshakeConfig,
    MiddleboxHandshakeEvent, ServerSideMiddlebox,
};
use crate::hop::Side;
use crate::relay::{FailCause, Leaving, MiddleboxRelay, RelayEvent};

/// Makes a fresh app instance for each connection.
pub type AppFactory = Arc<dyn Fn() -> Box<dyn MiddleboxApp + Send> + Send + Sync>;

/// The connection's app, its panics caught (held inline: no allocation beside the app's own).
type App = CatchPanic<Box<dyn MiddleboxApp + Send>>;

/// Client side: how long after forwarding a ClientHello with optimistic hellos the middlebox
/// answers ours ahead of the ServerHello (`MiddleboxHandshake::prepare`: engine, key share,
/// signature, evidence, about 0.4–0.7 ms of CPU), instead of when the server's flight is here
/// and the client waits for it. Not at once: the ClientHello's delivery, and whatever shares
/// the machine (on loopback: the next hop, the network emulation), goes first. A ServerHello
/// that arrives before it is handled as without it.
const PREPARE_DELAY: Duration = Duration::from_millis(1);

/// Whether the connection holds memory an idle trim would give back.
fn holds_memory(buf_c: &ReadBuf, buf_s: &ReadBuf, conn: &Conn) -> bool {
    buf_c.is_allocated()
        || buf_s.is_allocated()
        || conn.to_client.holds_spares()
        || conn.to_server.holds_spares()
}

/// What a middlebox needs to serve connections.
#[derive(Clone)]
pub struct MiddleboxServerConfig {
    /// Certificate, key and attester for the secondary sessions.
    pub handshake: MiddleboxHandshakeConfig,
    /// Where each accepted connection is connected to: a fixed `host:port` toward the server,
    /// or (transparent) the destination the client's connection had before a firewall
    /// redirected it here.
    pub next_hop: NextHop,
    /// The middlebox function, one instance per connection.
    pub app: AppFactory,
    /// Which endpoint the middlebox works for.
    pub placement: Placement,
    /// When a stalled handshake or an idle session is closed (both sockets), and how many
    /// connections are served at once.
    pub limits: Limits,
    /// Server side: how long a next hop that refused our announcement is remembered as legacy
    /// (its sessions passed through unannounced). `None` (the default): until the listener
    /// stops. Each time a server is found legacy costs the session that found it, so a short
    /// time fails a session of each legacy server that often; a server that has become
    /// mbTLS-aware is announced to again once this has passed. A reload that sets it applies
    /// to the servers already remembered.
    pub forget_legacy_after: Option<Duration>,
}

/// Where a middlebox connects each accepted connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NextHop {
    /// Always this `host:port`: the next middlebox or the server, configured by name or
    /// address (an explicit middlebox, or one in front of one server).
    Address(String),
    /// Transparent, on the path: the connection's original destination, which Linux keeps
    /// when netfilter (nftables or iptables) redirects it to the middlebox with `redirect` or
    /// `dnat` (`SO_ORIGINAL_DST`). A connection made to the middlebox itself has no other
    /// destination and is refused ([`DriverError::NotRedirected`]), so the middlebox never
    /// connects to itself.
    OriginalDestination,
}

impl MiddleboxServerConfig {
    /// A middlebox with `handshake` (its certificate, key and attester) that connects each
    /// connection to `next_hop`, runs `app` (one instance per connection) for the endpoint of
    /// `placement`, and has the default [`Limits`] (change the field to set them).
    pub fn new(
        handshake: MiddleboxHandshakeConfig,
        next_hop: impl Into<NextHop>,
        app: AppFactory,
        placement: Placement,
    ) -> Self {
        MiddleboxServerConfig {
            handshake,
            next_hop: next_hop.into(),
            app,
            placement,
            limits: Limits::default(),
            forget_legacy_after: None,
        }
    }
}

impl From<String> for NextHop {
    fn from(addr: String) -> NextHop {
        NextHop::Address(addr)
    }
}

impl From<&str> for NextHop {
    fn from(addr: &str) -> NextHop {
        NextHop::Address(addr.to_owned())
    }
}

impl std::fmt::Display for NextHop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NextHop::Address(a) => f.write_str(a),
            NextHop::OriginalDestination => {
                f.write_str("transparent (each connection's original destination)")
            }
        }
    }
}

/// Where `client`'s connection goes next: the configured address (borrowed: nothing per
/// connection), or its original destination.
fn next_hop_of<'a>(client: &TcpStream, next_hop: &'a NextHop) -> Result<Cow<'a, str>, DriverError> {
    match next_hop {
        NextHop::Address(a) => Ok(Cow::Borrowed(a)),
        NextHop::OriginalDestination => {
            let local = client
                .local_addr()
                .map_err(DriverError::io("reading the connection's local address"))?;
            // A dual-stack listener ([::]) sees an IPv4 connection at an IPv4-mapped address;
            // its NAT entry, and so its original destination, is an IPv4 one.
            let local = SocketAddr::new(local.ip().to_canonical(), local.port());
            let sock = socket2::SockRef::from(client);
            let original = if local.is_ipv4() {
                sock.original_dst_v4()
            } else {
                sock.original_dst_v6()
            };
            // Without a NAT entry the kernel has no original destination (ENOENT), or gives the
            // connection's own one: the client connected to us directly.
            match original.ok().and_then(|a| a.as_socket()) {
                Some(dst) if dst != local => Ok(Cow::Owned(dst.to_string())),
                _ => Err(DriverError::NotRedirected(local)),
            }
        }
    }
}

/// Which side of the path a middlebox is on, i.e. which endpoint gives it its keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Joins by answering an optimistic ClientHello of the client (pre-configured by the
    /// client, or discovered on the path).
    ClientSide,
    /// Announces itself to the server after the ClientHello. A server that fails a session
    /// without answering the announcement is remembered as legacy (per next hop) and not
    /// announced to again by this listener.
    ServerSide,
}

/// The outcome of one relayed connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionReport {
    /// Connection number, from 0 in accept order.
    pub id: u64,
    pub client: Option<SocketAddr>,
    /// Where the connection went: the configured next hop, or the original destination of a
    /// redirected one (`None` if it had none).
    pub next_hop: Option<String>,
    /// This middlebox's own address on its connection to the next hop, which the next hop
    /// reports as where the connection came from: a failed session, which has no key
    /// fingerprints, is matched between the two reports by it.
    pub next_hop_local: Option<SocketAddr>,
    /// Server-side: we sent a MiddleboxAnnouncement.
    pub announced: bool,
    /// Server-side: the session failed and the server never answered our announcement, so it
    /// is now remembered as legacy.
    pub legacy_server: bool,
    /// Our secondary session started (client side: we answered an optimistic ClientHello;
    /// server side: the server answered our announcement).
    pub joined: bool,
    pub evidence_sent: bool,
    /// Our secondary session resumed one of our tickets: the evidence sent was empty.
    pub resumed: bool,
    /// Key material arrived: this middlebox saw (and could change) the plaintext.
    pub keys_installed: bool,
    /// The app ended the session, how and why ("the app ended the session (why), alert
    /// access_denied(49)" or "…, close_notify to both sides"): with an alert it is also the
    /// error ([`ErrorKind::App`](super::ErrorKind::App)); with close_notify the session ended
    /// without one, and each endpoint read an orderly end from its peer.
    pub app_ended: Option<String>,
    /// Why the middlebox did not take part, if it did not.
    pub passive: Option<&'static str>,
    /// The endpoint refused this middlebox and said why (its evidence, its approval), in the
    /// endpoint's words.
    pub refused_by_endpoint: Option<String>,
    pub version: Option<TlsVersion>,
    /// Key fingerprints of the hop toward the client and the hop toward the server.
    pub client_hop: Option<HopFingerprint>,
    pub server_hop: Option<HopFingerprint>,
    /// Bytes read from the client's and from the server's connection (handshake included).
    pub bytes_from_client: u64,
    pub bytes_from_server: u64,
    /// How often the connection gave its grown buffers back after `IDLE_TRIM_AFTER` (2 s)
    /// without a read.
    pub idle_trims: u32,
    /// TLS 1.3 KeyUpdates passed on (from either side), each followed on both hops.
    pub key_updates: u32,
    /// The session ended without an error, but this side left without close_notify after the
    /// other side's had passed (and sent nothing after it): the other side's connection was
    /// closed without one too.
    pub left_without_close_notify: Option<Side>,
    /// From the accept: until the keys arrived, and until the connection ended.
    pub durations: super::Durations,
    /// Its listener cut the connection when it stopped ([`CUT_AT_STOP`](super::CUT_AT_STOP)).
    pub cut_at_stop: bool,
    /// The kind of the failure that ended the session ([`DriverError::kind`], or
    /// [`ErrorKind::LegacyServer`](super::ErrorKind::LegacyServer)), if one did.
    pub error_kind: Option<super::ErrorKind>,
    /// `Err` with the reason when the session did not end cleanly.
    pub outcome: Result<(), String>,
}

impl ConnectionReport {
    fn new(id: u64, client: Option<SocketAddr>) -> Self {
        ConnectionReport {
            id,
            client,
            next_hop: None,
            next_hop_local: None,
            announced: false,
            legacy_server: false,
            joined: false,
            evidence_sent: false,
            resumed: false,
            keys_installed: false,
            app_ended: None,
            passive: None,
            refused_by_endpoint: None,
            version: None,
            client_hop: None,
            server_hop: None,
            bytes_from_client: 0,
            bytes_from_server: 0,
            idle_trims: 0,
            key_updates: 0,
            left_without_close_notify: None,
            durations: super::Durations::default(),
            cut_at_stop: false,
            error_kind: None,
            outcome: Ok(()),
        }
    }

    fn failed(&mut self, e: &DriverError) {
        self.outcome = Err(e.to_string());
        self.error_kind = Some(e.kind());
    }

    /// The kind of the failure that ended the session, if one did: the field, under the name
    /// the server's and the proxy's reports give it.
    pub fn error_kind(&self) -> Option<super::ErrorKind> {
        self.error_kind
    }
}

impl super::reports::Report for ConnectionReport {
    const WHAT: &'static str = "mbtls middlebox connection";
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
        self.keys_installed
    }
    fn key_updates(&self) -> u64 {
        u64::from(self.key_updates)
    }
    fn bytes(&self) -> (u64, u64) {
        (self.bytes_from_client, self.bytes_from_server)
    }
    fn durations_mut(&mut self) -> &mut super::Durations {
        &mut self.durations
    }
    fn mark_cut_at_stop(&mut self) {
        self.cut_at_stop = true;
    }
}

impl ServiceConfig for MiddleboxServerConfig {
    fn limits(&self) -> &Limits {
        &self.limits
    }
}

/// A listening middlebox ([`Listening`] with a [`ConnectionReport`] per connection).
pub type MiddleboxServer = Listening<ConnectionReport, MiddleboxServerConfig>;

impl Listening<ConnectionReport, MiddleboxServerConfig> {
    /// Binds `listen` and serves connections in the background (needs a tokio runtime).
    pub async fn bind(
        listen: impl ToSocketAddrs,
        cfg: MiddleboxServerConfig,
    ) -> Result<MiddleboxServer, DriverError> {
        // Kept across reloads: a server found to be legacy stays so (for the
        // `forget_legacy_after` of the configuration in force).
        let memory = Arc::new(ListenerMemory::default());
        let counted = memory.clone();
        let mut listening = Listening::spawn(listen, cfg, move |id, stream, peer, cfg, reports| {
            let memory = memory.clone();
            let mut pending = Pending::new(ConnectionReport::new(id, Some(peer)), (), reports);
            let accepted = pending.accepted();
            async move {
                if let Some((report, ())) = pending.parts() {
                    serve(report, stream, &cfg, &memory, accepted).await;
                }
                pending.send();
            }
        })
        .await?;
        listening.count_legacy_servers(move |cfg: &MiddleboxServerConfig| {
            counted
                .legacy
                .remembered(Instant::now(), cfg.forget_legacy_after)
        });
        Ok(listening)
    }
}

/// What the connections of one listener share.
#[derive(Default)]
struct ListenerMemory {
    legacy: LegacyServers,
    own_ports: OwnPorts,
}

/// The local ports of a transparent middlebox's own open connections to their original
/// destinations, each taken before its connect. A redirect rule that catches those too (an
/// output-hook rule without `meta skuid != …`) brings each back to the listener, which would
/// connect it again, and again, without end: one curl made 24,000 connections in seconds in
/// an operator trial, and went on after curl had left. A connection from one of these ports
/// on an address of this host is refused ([`DriverError::RedirectedBack`]).
#[derive(Default)]
struct OwnPorts(Mutex<HashSet<u16>>);

/// A port in [`OwnPorts`] while its connection is open.
struct OwnPort<'a> {
    ports: &'a OwnPorts,
    port: u16,
}

impl OwnPorts {
    fn take(&self, port: u16) -> OwnPort<'_> {
        if let Ok(mut ports) = self.0.lock() {
            ports.insert(port);
        }
        OwnPort { ports: self, port }
    }

    /// Whether a connection from `peer` is one of ours come back: its port is one of our
    /// connections' and its address is one of this host's (binding it works).
    fn came_back(&self, peer: SocketAddr) -> bool {
        let ours = self
            .0
            .lock()
            .map(|ports| ports.contains(&peer.port()))
            .unwrap_or(false);
        let ip = peer.ip().to_canonical();
        ours && (ip.is_loopback() || std::net::UdpSocket::bind((ip, 0)).is_ok())
    }
}

impl Drop for OwnPort<'_> {
    fn drop(&mut self) {
        if let Ok(mut ports) = self.ports.0.lock() {
            ports.remove(&self.port);
        }
    }
}

/// How many legacy next hops a listener remembers. A transparent middlebox meets any number of
/// destinations; beyond this the oldest is forgotten (and costs one more refused session if
/// it comes back).
const REMEMBERED_LEGACY_SERVERS: usize = 4096;

/// Next hops that refused our announcement with an alert (server side), shared by every
/// connection of one listener: at most [`REMEMBERED_LEGACY_SERVERS`], the oldest forgotten
/// first, each for [`MiddleboxServerConfig::forget_legacy_after`] if set. Sans-I/O: the
/// caller gives the time.
#[derive(Default)]
pub(super) struct LegacyServers {
    /// Each next hop and when it was (last) found legacy.
    kept: Mutex<HashMap<String, Instant>>,
}

/// Whether a server found legacy at `since` is due to be forgotten at `now`.
fn forgotten(since: Instant, now: Instant, forget_after: Option<Duration>) -> bool {
    forget_after.is_some_and(|after| now.saturating_duration_since(since) >= after)
}

impl LegacyServers {
    /// Whether `next_hop` is remembered as legacy at `now`; one remembered longer than
    /// `forget_after` is forgotten here.
    fn is_legacy(&self, next_hop: &str, now: Instant, forget_after: Option<Duration>) -> bool {
        let Ok(mut kept) = self.kept.lock() else {
            return false;
        };
        let Some(&since) = kept.get(next_hop) else {
            return false;
        };
        if forgotten(since, now, forget_after) {
            kept.remove(next_hop);
            return false;
        }
        true
    }

    /// How many are remembered at `now` and not yet due to be forgotten after `forget_after`
    /// (one due is dropped only when its next session looks it up).
    fn remembered(&self, now: Instant, forget_after: Option<Duration>) -> usize {
        let Ok(kept) = self.kept.lock() else {
            return 0;
        };
        kept.values()
            .filter(|&&since| !forgotten(since, now, forget_after))
            .count()
    }

    /// Remembers `next_hop` as found legacy at `now`; past the limit the one found longest ago
    /// is forgotten (a scan of the table, on a failed session only).
    fn remember_legacy(&self, next_hop: &str, now: Instant) {
        let Ok(mut kept) = self.kept.lock() else {
            return;
        };
        kept.insert(next_hop.to_string(), now);
        if kept.len() > REMEMBERED_LEGACY_SERVERS {
            let oldest = kept
                .iter()
                .min_by_key(|&(_, &since)| since)
                .map(|(name, _)| name.clone());
            if let Some(oldest) = oldest {
                kept.remove(&oldest);
            }
        }
    }
}

/// Relays one accepted connection to its next hop until both directions ended or something
/// failed; both sockets are closed when this returns.
/// A connection served on its own has no memory of legacy servers.
pub async fn serve_connection(
    id: u64,
    client: TcpStream,
    peer: Option<SocketAddr>,
    cfg: &MiddleboxServerConfig,
) -> ConnectionReport {
    let accepted = tokio::time::Instant::now();
    let mut report = ConnectionReport::new(id, peer);
    serve(
        &mut report,
        client,
        cfg,
        &ListenerMemory::default(),
        accepted,
    )
    .await;
    report.durations.total = accepted.elapsed();
    report
}

/// Fills `report` as it goes (a connection cut mid-way still reports what it did); its
/// handshake's duration counts from `accepted`.
async fn serve(
    report: &mut ConnectionReport,
    client: TcpStream,
    cfg: &MiddleboxServerConfig,
    memory: &ListenerMemory,
    accepted: tokio::time::Instant,
) {
    let next_hop = match next_hop_of(&client, &cfg.next_hop) {
        Ok(next_hop) => next_hop,
        Err(e) => {
            report.failed(&e);
            return;
        }
    };
    report.next_hop = Some(next_hop.to_string());
    let transparent = cfg.next_hop == NextHop::OriginalDestination;
    if let Some(peer) = report
        .client
        .filter(|&p| transparent && memory.own_ports.came_back(p))
    {
        report.failed(&DriverError::RedirectedBack(peer));
        return;
    }
    let legacy = &memory.legacy;
    let announce = !legacy.is_legacy(&next_hop, Instant::now(), cfg.forget_legacy_after);
    let own_ports = transparent.then_some(&memory.own_ports);
    if let Err(e) = relay(
        client, &next_hop, cfg, announce, own_ports, report, accepted,
    )
    .await
    {
        report.failed(&e);
    }
    // A server that refused our announcement with an alert, the first thing it sent, is
    // legacy: later sessions are not announced to it. So is one whose first bytes were not
    // TLS at all (nginx's plain-HTTP error page). A session that failed otherwise before
    // the server answered proves nothing about the server: its client may have left (a
    // ClientHello, then a reset), and taking that for a legacy server would let any client
    // turn this middlebox away from the server's sessions for good.
    let how = report.passive.and_then(legacy_refusal);
    if let Some(how) = how.filter(|_| report.announced && !report.joined) {
        report.legacy_server = true;
        legacy.remember_legacy(&next_hop, Instant::now());
        // The server's refusal went on to the client: this session failed, whatever the
        // sockets' ends looked like, and whatever the client made of it.
        let then = match cfg.forget_legacy_after.map(|d| d.as_secs()) {
            None => ": later sessions to it are passed through unannounced until the middlebox restarts".to_string(),
            Some(0) => ", not remembered (forget_legacy_after is 0): later sessions are announced to it again".to_string(),
            Some(secs) => format!(": later sessions to it are passed through unannounced for {secs}s"),
        };
        let why = format!(
            "the server answered our announcement {how}, which ended the session (a legacy server{then})"
        );
        report.outcome = match std::mem::replace(&mut report.outcome, Ok(())) {
            Ok(()) => Err(why),
            Err(e) => Err(format!("{why}; then: {e}")),
        };
        report.error_kind = Some(super::ErrorKind::LegacyServer);
    }
}

/// Runs `f`, which may block, where that is allowed: on a multi-thread runtime the worker
/// hands its other tasks over first (`block_in_place`); a current-thread runtime has no
/// other worker to hand them to, so `f` just runs.
fn blocking_allowed<R>(f: impl FnOnce() -> R) -> R {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// The handshake core of either placement.
enum Core {
    ClientSide(MiddleboxHandshake<App>),
    ServerSide(ServerSideMiddlebox<App>),
}

impl Core {
    /// `bytes` is the read buffer: in the data phase records are opened in it, and those the
    /// app lets through unchanged may be passed on in it (the range returned, to be sent
    /// toward `from.other()` after that side's queued output).
    fn receive(
        &mut self,
        from: Side,
        bytes: &mut [u8],
    ) -> Result<Option<std::ops::Range<usize>>, HandshakeError> {
        match self {
            Core::ClientSide(c) => c.receive_lending(from, bytes),
            Core::ServerSide(c) => c.receive_lending(from, bytes),
        }
    }

    fn append_outgoing(&mut self, to: Side, dst: &mut Vec<u8>) {
        match self {
            Core::ClientSide(c) => c.append_outgoing(to, dst),
            Core::ServerSide(c) => c.append_outgoing(to, dst),
        }
    }

    fn poll_event(&mut self) -> Option<MiddleboxHandshakeEvent> {
        match self {
            Core::ClientSide(c) => c.poll_event(),
            Core::ServerSide(c) => c.poll_event(),
        }
    }

    fn relay(&self) -> Option<&MiddleboxRelay<App>> {
        match self {
            Core::ClientSide(c) => c.relay(),
            Core::ServerSide(c) => c.relay(),
        }
    }

    fn is_passive(&self) -> bool {
        match self {
            Core::ClientSide(c) => c.is_passive(),
            Core::ServerSide(c) => c.is_passive(),
        }
    }

    fn keys_installed(&self) -> bool {
        self.relay().is_some()
    }

    /// See [`MiddleboxHandshake::waiting_for`].
    fn waiting_for(&self) -> Option<&'static str> {
        match self {
            Core::ClientSide(c) => c.waiting_for(),
            Core::ServerSide(c) => c.waiting_for(),
        }
    }

    /// See [`MiddleboxHandshake::waits_before_reading`].
    fn waits_before_reading(&self, from: Side) -> bool {
        match self {
            Core::ClientSide(c) => c.waits_before_reading(from),
            Core::ServerSide(c) => c.waits_before_reading(from),
        }
    }

    /// See [`MiddleboxHandshake::server_alert_passed_on`].
    fn server_alert_passed_on(&self) -> Option<u8> {
        match self {
            Core::ClientSide(c) => c.server_alert_passed_on(),
            Core::ServerSide(c) => c.server_alert_passed_on(),
        }
    }

    /// See [`MiddleboxHandshake::keeps_server_records_for_its_keys`]; a server-side
    /// middlebox's keys come from the server, so its close means none will.
    fn keeps_server_records_for_its_keys(&self) -> bool {
        match self {
            Core::ClientSide(c) => c.keeps_server_records_for_its_keys(),
            Core::ServerSide(_) => false,
        }
    }

    fn release_idle_buffers(&mut self) {
        match self {
            Core::ClientSide(c) => c.release_idle_buffers(),
            Core::ServerSide(c) => c.release_idle_buffers(),
        }
    }

    fn wants_prepare(&self) -> bool {
        match self {
            Core::ClientSide(c) => c.wants_prepare(),
            Core::ServerSide(_) => false,
        }
    }

    fn prepare(&mut self) {
        if let Core::ClientSide(c) = self {
            c.prepare();
        }
    }
}

struct Conn {
    hs: Core,
    to_client: Outbox,
    to_server: Outbox,
    failure: Option<DriverError>,
    /// Before the keys: the side the last bytes came from. A side that closes right after
    /// the other side spoke most likely answered it (an endpoint's alert, which TLS 1.3
    /// encrypts, then its close; the other endpoint closes on the alert, and which close is
    /// read first is chance).
    last_from: Option<Side>,
}

impl Conn {
    fn outbox(&mut self, to: Side) -> &mut Outbox {
        match to {
            Side::Client => &mut self.to_client,
            Side::Server => &mut self.to_server,
        }
    }

    /// Queues what the core produced for both neighbours, in order.
    fn push(&mut self) {
        for to in [Side::Client, Side::Server] {
            let mut out = self.outbox(to).take_buffer();
            self.hs.append_outgoing(to, &mut out);
            self.outbox(to).push(out);
        }
    }

    /// Takes the core's events into `report` (the handshake's duration counted from
    /// `accepted`).
    fn events(&mut self, report: &mut ConnectionReport, accepted: tokio::time::Instant) {
        while let Some(ev) = self.hs.poll_event() {
            match ev {
                MiddleboxHandshakeEvent::Announced { .. } => report.announced = true,
                MiddleboxHandshakeEvent::Joined { .. } => report.joined = true,
                MiddleboxHandshakeEvent::Passive(why) => report.passive = Some(why),
                MiddleboxHandshakeEvent::RefusedByEndpoint(why) => {
                    report.refused_by_endpoint = Some(why)
                }
                MiddleboxHandshakeEvent::EvidenceSent => report.evidence_sent = true,
                MiddleboxHandshakeEvent::Resumed => report.resumed = true,
                MiddleboxHandshakeEvent::KeysInstalled => {
                    report.keys_installed = true;
                    report.durations.handshake = Some(accepted.elapsed());
                    if let Some(relay) = self.hs.relay() {
                        report.version = Some(relay.version());
                        // Per side: (read, write). Toward the client we read c2s.
                        let fp = |side, read_is_c2s: bool| {
                            let (r, w) = relay.key_fingerprints(side);
                            let (r, w) = (r?, w?);
                            Some(if read_is_c2s {
                                HopFingerprint { c2s: r, s2c: w }
                            } else {
                                HopFingerprint { c2s: w, s2c: r }
                            })
                        };
                        report.client_hop = fp(Side::Client, true);
                        report.server_hop = fp(Side::Server, false);
                    }
                }
                MiddleboxHandshakeEvent::Relay(RelayEvent::Failed { cause, alert }) => {
                    let why = relay_failure(&cause, alert.description);
                    let failure = match cause {
                        FailCause::App { .. } => {
                            report.app_ended = Some(why.clone());
                            DriverError::App(why)
                        }
                        _ => DriverError::Relay(why),
                    };
                    self.failure.get_or_insert(failure);
                }
                MiddleboxHandshakeEvent::Relay(RelayEvent::AppClosed { why }) => {
                    // An orderly end the app chose: each endpoint reads it as its peer's, so
                    // the report is where it shows (found in an embedder's trial).
                    let both = "close_notify to both sides";
                    report.app_ended = Some(app_ended(why.as_deref(), both));
                }
                MiddleboxHandshakeEvent::Relay(RelayEvent::KeysUpdated { from }) => {
                    report.key_updates = report.key_updates.saturating_add(1);
                    tracing::debug!(?from, "mbtls relay: keys updated");
                }
                MiddleboxHandshakeEvent::Relay(ev) => tracing::debug!(?ev, "mbtls relay"),
            }
        }
    }

    fn direction_ended(&self, from: Side) -> bool {
        match self.hs.relay() {
            Some(r) => r.direction_ended(from),
            // Forwarding ciphertext it cannot read: TCP half-closes pass through.
            None => self.hs.is_passive(),
        }
    }

    fn finished(&self) -> bool {
        self.hs.relay().is_some_and(|r| r.is_closed())
    }

    /// What a read of nothing from `from` (EOF, or a reset: `reset`) does to the session:
    /// `None` while it goes on (that direction had ended with close_notify: the other side is
    /// sent a FIN), else how it ends.
    fn on_close(
        &mut self,
        open: &mut [bool; 2],
        from: Side,
        reset: bool,
        report: &mut ConnectionReport,
    ) -> Option<Result<(), DriverError>> {
        if self.direction_ended(from) {
            if let Some(slot) = open.get_mut(usize::from(from == Side::Server)) {
                *slot = false;
            }
            self.outbox(from.other()).finish();
            return None;
        }
        // A clean leave ends the session: the other side's connection is closed without a
        // close_notify of ours, so an endpoint there tells this apart from a clean end too.
        // A reset is a cut whatever came before.
        let leaving = self.hs.relay().map(|r| r.leaving(from));
        if let (None, Some(description)) = (leaving, self.hs.server_alert_passed_on()) {
            // The server ended the handshake with an alert, which went on to the client:
            // whichever of them closes first, that is why the session ended.
            return Some(Err(DriverError::Alert {
                description,
                what: "sent by the server during the handshake and passed on",
            }));
        }
        if leaving == Some(Leaving::Clean) && !reset {
            report.left_without_close_notify = Some(from);
            return Some(Ok(()));
        }
        Some(Err(DriverError::PeerGone {
            peer: neighbour_name(from),
            when: if matches!(leaving, Some(Leaving::Clean | Leaving::MayCut)) {
                "without close_notify after the other side's, having sent data since or been cut (the session may be truncated)"
            } else if self.hs.keys_installed() {
                "mid-session, without close_notify"
            } else if from == Side::Server && report.bytes_from_server == 0 {
                // Nothing at all came, which is also how a hop that refuses this middlebox's
                // address closes (an operator trial read only the record's cause for one).
                if self.last_from == Some(Side::Client) {
                    "during the handshake (before this middlebox received its keys), having sent nothing at all, right after a record from the client's side: it may have been answering that record (as a close answers an alert that ends the handshake), or refusing connections from this middlebox's address (its max_connections_per_client or connection_rate_per_client, which it says only in its log)"
                } else {
                    "during the handshake (before this middlebox received its keys), having sent nothing at all: it may be refusing connections from this middlebox's address (its max_connections_per_client or connection_rate_per_client, which it says only in its log)"
                }
            } else if self.last_from == Some(from.other()) {
                match from {
                    Side::Server => "during the handshake (before this middlebox received its keys), right after a record from the client's side, which it may have been answering (as a close answers an alert that ends the handshake)",
                    Side::Client => "during the handshake (before this middlebox received its keys), right after a record from the server's side, which it may have been answering (as a close answers an alert that ends the handshake)",
                }
            } else {
                // Its own TLS handshake may be over (a legacy client that leaves at once):
                // what this middlebox knows is that its keys had not come yet.
                "during the handshake (before this middlebox received its keys)"
            },
        }))
    }
}

/// How long a client-side middlebox whose server closed before its keys came still waits for
/// them, when it keeps server records that need them: the server's last words (a fatal alert
/// after its Finished) are then passed on. The client sends the keys as soon as its own
/// handshakes end, a round trip at most; the handshake timeout bounds it too.
const SERVER_LAST_WORDS_WAIT: Duration = Duration::from_secs(2);

/// The connection toward `side`, in errors about that connection: the neighbour at its other
/// end may be a middlebox rather than the endpoint (found in a user trial: a middlebox whose
/// next middlebox was killed said "the server closed the connection").
fn neighbour_name(side: Side) -> &'static str {
    match side {
        Side::Client => "previous hop (toward the client)",
        Side::Server => "next hop (toward the server)",
    }
}

/// Why the relay ended a session with `alert`, in the report's words.
fn relay_failure(cause: &FailCause, alert: mbx_engine::AlertDescription) -> String {
    match *cause {
        FailCause::App { ref why } => app_ended(why.as_deref(), &format!("alert {alert}")),
        FailCause::PeerAlert { from } => format!(
            "alert {alert} came from the {}, passed on to the {}",
            side_name(from),
            side_name(from.other())
        ),
        FailCause::BadRecord { from } => format!(
            "a record from the {} failed authentication or framing (bad record), alert {alert} to both sides",
            side_name(from)
        ),
        FailCause::Protocol { from, what } => format!(
            "the {} broke the protocol ({what}), alert {alert} to both sides",
            side_name(from)
        ),
        FailCause::Local => format!("sealing failed here, alert {alert} to both sides"),
    }
}

/// How the app ended a session, for the report and the error: "the app ended the session
/// (why), `how`".
fn app_ended(why: Option<&str>, how: &str) -> String {
    match why {
        Some(why) => format!("the app ended the session ({why}), {how}"),
        None => format!("the app ended the session, {how}"),
    }
}

/// Where something came from or went to beyond the neighbour: a record or an alert from the
/// server's side may be the server's own or a middlebox's on the way.
fn side_name(side: Side) -> &'static str {
    match side {
        Side::Client => "client's side",
        Side::Server => "server's side",
    }
}

/// The connection to `next_hop`, made before `deadline`; with `own_ports` (a transparent
/// middlebox), its local port is taken there before the connect and held while the
/// connection is open.
async fn connect_next_hop<'a>(
    next_hop: &str,
    own_ports: Option<&'a OwnPorts>,
    deadline: tokio::time::Instant,
) -> Result<(TcpStream, Option<OwnPort<'a>>), DriverError> {
    const CANNOT: &str = "cannot connect to the next hop";
    let connecting = async {
        // An original destination is an address: no name to resolve.
        let Some((ports, dst)) = own_ports.zip(next_hop.parse::<SocketAddr>().ok()) else {
            return Ok((TcpStream::connect(next_hop).await?, None));
        };
        let (socket, any) = match dst {
            SocketAddr::V4(_) => (
                tokio::net::TcpSocket::new_v4()?,
                SocketAddr::from(([0; 4], 0)),
            ),
            SocketAddr::V6(_) => (
                tokio::net::TcpSocket::new_v6()?,
                SocketAddr::from(([0u16; 8], 0)),
            ),
        };
        socket.bind(any)?;
        let own = ports.take(socket.local_addr()?.port());
        Ok((socket.connect(dst).await?, Some(own)))
    };
    match tokio::time::timeout_at(deadline, connecting).await {
        Ok(connected) => connected.map_err(DriverError::io(CANNOT)),
        // A next hop that never answers (its SYNs dropped) is said as such, not as a TLS
        // peer that was slow (found in an operator trial: "the handshake did not finish").
        Err(_) => Err(DriverError::io(
            "cannot connect to the next hop: no answer within the handshake timeout",
        )(std::io::ErrorKind::TimedOut.into())),
    }
}

async fn relay(
    client: TcpStream,
    next_hop: &str,
    cfg: &MiddleboxServerConfig,
    announce: bool,
    own_ports: Option<&OwnPorts>,
    report: &mut ConnectionReport,
    accepted: tokio::time::Instant,
) -> Result<(), DriverError> {
    let deadline = tokio::time::Instant::now() + cfg.limits.handshake_timeout;
    // Held while the connection is open (see `OwnPorts`).
    let (server, _own_port) = connect_next_hop(next_hop, own_ports, deadline).await?;
    report.next_hop_local = server.local_addr().ok();
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    // The accepted socket has keepalive from the listener (`Listening`).
    super::keep_alive(&server);
    // An app's panic ends this session with internal_error toward both sides, and the report
    // says why, instead of unwinding through this task (mbx_apps::CatchPanic).
    let mut app: App = CatchPanic::new((cfg.app)());
    app.on_connection(&ConnectionInfo::new(
        report.id,
        report.client,
        Some(next_hop.to_owned()),
    ));
    let hs = match cfg.placement {
        Placement::ClientSide => {
            Core::ClientSide(MiddleboxHandshake::new(cfg.handshake.clone(), app)?)
        }
        Placement::ServerSide => Core::ServerSide(ServerSideMiddlebox::new(
            cfg.handshake.clone(),
            app,
            announce,
        )?),
    };
    let attester_blocks = cfg.handshake.attester_blocks();
    let (mut client_r, mut client_w) = client.into_split();
    let (mut server_r, mut server_w) = server.into_split();
    let mut conn = Conn {
        hs,
        to_client: Outbox::recycling(),
        to_server: Outbox::recycling(),
        failure: None,
        last_from: None,
    };
    let mut open = [true, true]; // reading from client, from server
                                 // Both directions ended; what is queued is leaving.
    let mut draining = false;
    let (mut buf_c, mut buf_s) = (ReadBuf::new(READ_BUF_MAX), ReadBuf::new(READ_BUF_MAX));
    // When to answer the optimistic hello ahead of the ServerHello (see PREPARE_DELAY).
    let mut prepare_at: Option<tokio::time::Instant> = None;
    // The server closed before our keys came while we kept records that need them: until
    // when we wait for the keys, and whether it was a reset.
    let mut server_left: Option<(tokio::time::Instant, bool)> = None;
    // Gives memory back once nothing was read for IDLE_TRIM_AFTER, and closes a session that
    // carries nothing for the idle timeout.
    let mut activity = Activity::new(cfg.limits.idle_timeout);
    // Closes a connection whose handshake stalls; disarmed once it is over.
    let handshake_deadline = tokio::time::sleep_until(deadline);
    tokio::pin!(handshake_deadline);
    let result: Result<(), DriverError> = loop {
        if let Some(f) = conn.failure.take() {
            break Err(f);
        }
        if !draining && (conn.finished() || (!open[0] && !open[1])) {
            // Both directions ended. What is queued (the last data, the close_notifys, each
            // side's FIN) leaves at its reader's pace before the end is told; the idle timeout
            // bounds a reader that stopped. Nothing more is read.
            draining = true;
            open = [false, false];
            conn.to_client.finish();
            conn.to_server.finish();
        }
        if draining && !conn.to_client.wants_write() && !conn.to_server.wants_write() {
            break Ok(());
        }
        let holding = activity.trim_pending() || holds_memory(&buf_c, &buf_s, &conn);
        let in_handshake = !conn.hs.keys_installed() && !conn.hs.is_passive();
        // What the client sends goes to the server, and the other way round.
        // Not read from either while it keeps that side's data, up to its bound, for keys that
        // have not come: TCP holds the rest back.
        let room_c = conn.to_server.has_room() && !conn.hs.waits_before_reading(Side::Client);
        let room_s = conn.to_client.has_room() && !conn.hs.waits_before_reading(Side::Server);
        let (want_c, want_s) = (conn.to_client.wants_write(), conn.to_server.wants_write());
        let (from, read) = tokio::select! {
            r = read_into(&mut client_r, &mut buf_c), if open[0] && room_c => (Side::Client, r.map(|n| buf_c.bytes.get_mut(..n).unwrap_or_default())),
            r = read_into(&mut server_r, &mut buf_s), if open[1] && room_s => (Side::Server, r.map(|n| buf_s.bytes.get_mut(..n).unwrap_or_default())),
            w = conn.to_client.write_some(&mut client_w), if want_c => match w {
                Ok(()) => {
                    activity.wrote_now();
                    continue;
                }
                // After both close_notifys a side that left takes nothing more: its own
                // choice, not a cut.
                Err(_) if draining => {
                    conn.to_client = Outbox::new();
                    continue;
                }
                Err(_) => break Err(DriverError::PeerGone { peer: neighbour_name(Side::Client), when: WRITE_RESET }),
            },
            w = conn.to_server.write_some(&mut server_w), if want_s => match w {
                Ok(()) => {
                    activity.wrote_now();
                    continue;
                }
                // After both close_notifys, or once the server left while we wait to pass on
                // its last words: what it no longer takes is not the error.
                Err(_) if draining || server_left.is_some() => {
                    conn.to_server = Outbox::new();
                    continue;
                }
                Err(_) => break Err(DriverError::PeerGone { peer: neighbour_name(Side::Server), when: WRITE_RESET }),
            },
            // One timer for both (each branch's timer would take room in every connection's
            // state, idle or not): preparing the answer ahead of the ServerHello, and the
            // end of the wait for the server's last words.
            _ = mbx_net::sleep_until_some(prepare_at.or(server_left.map(|(at, _)| at))) => {
                if prepare_at.take().is_some() {
                    // Makes the TLS 1.3 evidence too (a quote: milliseconds, one at a time).
                    if attester_blocks {
                        blocking_allowed(|| conn.hs.prepare());
                    } else {
                        conn.hs.prepare();
                    }
                    continue;
                }
                // No keys: the server's close stands as it came.
                let reset = server_left.take().is_some_and(|(_, reset)| reset);
                match conn.on_close(&mut open, Side::Server, reset, report) {
                    Some(end) => break end,
                    None => continue,
                }
            }
            _ = &mut handshake_deadline, if in_handshake => {
                break Err(DriverError::HandshakeTimeout {
                    after: cfg.limits.handshake_timeout,
                    waiting_for: conn.hs.waiting_for().map(str::to_string),
                });
            }
            due = activity.due(holding), if holding || activity.has_timeout() => match due {
                Due::Trim => {
                    buf_c.release();
                    buf_s.release();
                    conn.to_client.trim_spares();
                    conn.to_server.trim_spares();
                    conn.hs.release_idle_buffers();
                    report.idle_trims += 1;
                    continue;
                }
                Due::IdleTimeout(after) => break Err(DriverError::IdleTimeout(after)),
            },
            else => break Err(DriverError::Relay("the connection has nothing left to wait for".into())),
        };
        // A reset counts as the peer disappearing, like EOF without close_notify.
        let reset = read.is_err();
        let bytes = read.unwrap_or_default();
        if bytes.is_empty() {
            if from == Side::Server && conn.hs.keeps_server_records_for_its_keys() {
                // Its close is taken once the keys have passed on what it sent before.
                open[1] = false;
                server_left = Some((tokio::time::Instant::now() + SERVER_LAST_WORDS_WAIT, reset));
                continue;
            }
            // The client leaving while we wait: the server's close, which came first, stands.
            let (from, reset) = match server_left {
                Some((_, server_reset)) => (Side::Server, server_reset),
                None => (from, reset),
            };
            match conn.on_close(&mut open, from, reset, report) {
                Some(end) => break end,
                None => continue,
            }
        }
        let n = bytes.len();
        if !conn.hs.keys_installed() {
            conn.last_from = Some(from);
        }
        *match from {
            Side::Client => &mut report.bytes_from_client,
            Side::Server => &mut report.bytes_from_server,
        } += n as u64;
        let received = if attester_blocks && !conn.hs.keys_installed() {
            // This step may make evidence (a quote, milliseconds): the runtime's other
            // connections go on while it waits.
            blocking_allowed(|| conn.hs.receive(from, bytes))
        } else {
            conn.hs.receive(from, bytes)
        };
        let buf = if from == Side::Client {
            &mut buf_c
        } else {
            &mut buf_s
        };
        // Alerts the core queued go out even when it failed, and before records it passed
        // on in the read buffer, which then goes out itself (no copy) and is replaced.
        conn.events(report, accepted);
        conn.push();
        if let Ok(Some(range)) = &received {
            let to = conn.outbox(from.other());
            let spare = to.take_read_buffer();
            to.push_lent(buf.lend(spare), range.clone());
        }
        if buf.after_read(n) {
            // The direction that grew it is quiet again: so are the chunks it kept.
            conn.outbox(from.other()).trim_spares();
        }
        // Each read puts the idle trim and the idle timeout off.
        activity.read_now();
        if let Err(e) = received {
            break Err(e.into());
        }
        if let Some((_, reset)) = server_left {
            if !conn.hs.keeps_server_records_for_its_keys() && conn.failure.is_none() {
                // The keys came and what the server had sent went on (or the middlebox went
                // passive and passed it on raw): now its close.
                server_left = None;
                if let Some(end) = conn.on_close(&mut open, Side::Server, reset, report) {
                    break end;
                }
            }
        }
        if prepare_at.is_none() && conn.hs.wants_prepare() {
            prepare_at = Some(tokio::time::Instant::now() + PREPARE_DELAY);
        }
    };
    // A failure is known now: a stop that cuts the connection while its alerts leave must
    // not report only the cut.
    if let Err(e) = &result {
        report.failed(e);
    }
    // Orderly or not, let queued bytes (close_notify, alerts) leave, then close both sockets.
    conn.to_client.finish();
    conn.to_server.finish();
    let _ = tokio::time::timeout(CLOSE_GRACE, async {
        tokio::join!(
            conn.to_client.flush(&mut client_w),
            conn.to_server.flush(&mut server_w)
        )
    })
    .await;
    let timed_out = matches!(
        result,
        Err(DriverError::HandshakeTimeout { .. } | DriverError::IdleTimeout(_))
    );
    if result.is_err() && !timed_out && !conn.hs.keys_installed() {
        // A handshake that failed (not one that stalled): see FAILED_HANDSHAKE_LINGER.
        let _ = tokio::time::timeout(FAILED_HANDSHAKE_LINGER, async {
            use tokio::io::AsyncWriteExt as _;
            let _ = tokio::join!(client_w.shutdown(), server_w.shutdown());
            tokio::join!(
                discard_until_eof(&mut client_r),
                discard_until_eof(&mut server_r)
            );
        })
        .await;
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn legacy_servers_are_remembered_up_to_the_limit_oldest_forgotten_first() {
        let legacy = LegacyServers::default();
        let t0 = Instant::now();
        // Each found a little later than the one before.
        let at = |i: usize| t0 + Duration::from_nanos(i as u64);
        for i in 0..=REMEMBERED_LEGACY_SERVERS {
            legacy.remember_legacy(&format!("10.0.0.1:{i}"), at(i));
        }
        // Once more: no second entry, nothing else forgotten.
        let now = at(REMEMBERED_LEGACY_SERVERS + 1);
        legacy.remember_legacy("10.0.0.1:5", now);
        assert!(!legacy.is_legacy("10.0.0.1:0", now, None));
        for i in 1..=REMEMBERED_LEGACY_SERVERS {
            assert!(legacy.is_legacy(&format!("10.0.0.1:{i}"), now, None), "{i}");
        }
        assert_eq!(legacy.remembered(now, None), REMEMBERED_LEGACY_SERVERS);
        assert_eq!(legacy.kept.lock().unwrap().len(), REMEMBERED_LEGACY_SERVERS);
    }

    /// With `forget_legacy_after`, a server is announced to again once that long has passed
    /// since it was found legacy (found again, it is remembered afresh); without, it stays.
    /// The count follows.
    #[test]
    fn legacy_servers_are_forgotten_after_the_time_set() {
        let legacy = LegacyServers::default();
        let t0 = Instant::now();
        let secs = |n| t0 + Duration::from_secs(n);
        let hour = Some(Duration::from_secs(3600));
        legacy.remember_legacy("a:443", t0);
        legacy.remember_legacy("b:443", secs(1000));
        assert_eq!(legacy.remembered(secs(1000), hour), 2);
        // Due to be forgotten counts as forgotten, before any session looks it up.
        assert_eq!(legacy.remembered(secs(3600), hour), 1);
        assert_eq!(legacy.remembered(secs(3600), Some(Duration::ZERO)), 0);
        assert!(legacy.is_legacy("a:443", secs(3599), hour));
        assert!(legacy.is_legacy("a:443", secs(100_000), None));
        assert!(!legacy.is_legacy("a:443", secs(3600), hour));
        assert_eq!(legacy.remembered(secs(3600), None), 1);
        // Forgotten for good: a longer time later does not bring it back.
        assert!(!legacy.is_legacy("a:443", secs(3600), None));
        assert!(legacy.is_legacy("b:443", secs(4599), hour));
        legacy.remember_legacy("a:443", secs(4000));
        assert!(legacy.is_legacy("a:443", secs(7599), hour));
        assert!(!legacy.is_legacy("a:443", secs(7600), hour));
        assert!(!legacy.is_legacy("b:443", secs(7600), hour));
        assert_eq!(legacy.remembered(secs(7600), None), 0);
        assert!(!legacy.is_legacy("c:443", t0, None));
    }

    /// A server found legacy over and over (a short `forget_legacy_after`) keeps one entry,
    /// and does not cost one found before it, and never looked up again, its place.
    #[test]
    fn finding_one_server_legacy_again_and_again_keeps_the_memory_bounded() {
        let legacy = LegacyServers::default();
        let t0 = Instant::now();
        legacy.remember_legacy("old:443", t0);
        for n in 1..=(5 * REMEMBERED_LEGACY_SERVERS as u64) {
            let now = t0 + Duration::from_secs(n);
            assert!(!legacy.is_legacy("again:443", now, Some(Duration::ZERO)));
            legacy.remember_legacy("again:443", now);
        }
        assert_eq!(legacy.kept.lock().unwrap().len(), 2);
        assert!(legacy.is_legacy("old:443", t0, None));
    }
}
