//! Thin tokio drivers: they own the sockets, feed the sans-I/O cores ([`crate::handshake`]) and
//! write what the cores produce, in order. No protocol decision is taken here.
//!
//! - [`client`]: connect to the pre-configured middlebox, run [`ClientHandshake`], then read and
//!   write application data through the first hop.
//! - [`middlebox`]: accept connections, connect each to the next hop, run
//!   [`MiddleboxHandshake`] (client side) or [`ServerSideMiddlebox`] (server side) and the relay,
//!   both directions at once.
//! - [`server`]: accept connections, run [`ServerHandshake`], pass the plaintext to a TCP
//!   backend and its answers back; or, for an application that serves mbTLS itself, one
//!   accepted connection as an [`MbtlsServerConnection`] ([`connection`]: the session type
//!   both endpoints share).
//! - [`proxy`]: the client as a local proxy: accept local plain-TCP connections and carry each
//!   over its own mbTLS session.
//!
//! Failure rule: any fatal error closes both TCP connections of a middlebox; a peer that
//! disappears (EOF or reset without close_notify) is an error for the other side, never a hang.
//!
//! [`ClientHandshake`]: crate::handshake::ClientHandshake
//! [`MiddleboxHandshake`]: crate::handshake::MiddleboxHandshake
//! [`ServerSideMiddlebox`]: crate::handshake::ServerSideMiddlebox
//! [`ServerHandshake`]: crate::handshake::ServerHandshake

mod accept;
pub mod client;
pub mod connection;
pub mod middlebox;
mod outbox;
mod per_client;
pub mod proxy;
mod quiet;
mod read_buf;
mod reports;
pub mod server;
mod splice;

pub use accept::{ListenerStats, Listening, ServiceConfig};
pub use client::{in_path_order, MbtlsClient, MiddleboxVerdict};
pub use connection::{Connection, EndpointHandshake, HandshakeProgress};
pub use middlebox::{
    AppFactory, ConnectionReport, MiddleboxServer, MiddleboxServerConfig, NextHop, Placement,
};
pub use proxy::{
    answer_with_error, printable_error, ClientProxy, ClientProxyConfig, ProxyReport,
    SessionFailedAnswer,
};
pub use reports::{Durations, EndedConnections, CUT_AT_STOP, REPORTS_KEPT};
pub use server::{MbtlsServer, MbtlsServerConfig, MbtlsServerConnection, ServerConnectionReport};

use crate::handshake::HandshakeError;
use crate::hop::Alert;

/// Bytes read from a socket at once.
pub(crate) const READ_BUF: usize = 32 * 1024;

/// After a fatal error or the end of the session: how long queued bytes (e.g. alerts) may take
/// to leave before the sockets are dropped anyway.
pub(crate) const CLOSE_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// After a handshake that failed with an alert to pass on: how long a middlebox or server keeps
/// reading (and dropping) what its peers still send before it closes, so that a peer still
/// sending (a TLS 1.3 client's Finished and first request follow the server's flight at once)
/// is not answered with a reset, which would discard the alert its kernel holds unread. Ends
/// sooner when the peers close; short, since the connection holds its slot meanwhile.
pub(crate) const FAILED_HANDSHAKE_LINGER: std::time::Duration = std::time::Duration::from_secs(1);

/// How long a middlebox or server gives a connection to finish the mbTLS handshake (from the
/// TCP accept to the data phase, or, at a middlebox, until it knows it stays out of the
/// session) before it closes it: a peer that connects and then sends nothing, or stalls
/// mid-handshake, must not hold a task, its sockets and (at a middlebox) a connection to the
/// next hop for ever. nginx's `ssl_handshake_timeout` has the same default.
pub const DEFAULT_HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// How long an established session may carry nothing, either way, before a middlebox or server
/// closes it: nginx's stream `proxy_timeout` default. Keepalive only notices peers that are
/// gone; this bounds what live but forgotten sessions hold.
pub const DEFAULT_IDLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

/// What a middlebox or server allows its connections: how long it waits on one, and how many it
/// serves at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// From the accept until the handshake is over (keys installed, or a middlebox knows it
    /// stays out; a server reaches its data phase and, within the same bound, connects its
    /// backend).
    pub handshake_timeout: std::time::Duration,
    /// How long a session may carry nothing either way (no byte read or written on any of its
    /// sockets); `None`: for ever. The session is then closed without close_notify, so its
    /// endpoints see it end abnormally rather than as a complete stream.
    pub idle_timeout: Option<std::time::Duration>,
    /// At most this many connections are served at once; while that many are open, new ones
    /// wait in the kernel's listen queue (as with HAProxy's `maxconn`) instead of being
    /// accepted and then failing for want of descriptors or memory. `None`: no limit.
    pub max_connections: Option<usize>,
    /// At most this many connections open at once from one client (an IPv4 address, IPv4-mapped
    /// IPv6 counting as IPv4, or an IPv6 /64), as nginx's `limit_conn`: one client cannot take
    /// every slot of `max_connections`, nor make the service run that many handshakes at once.
    /// One more is accepted and closed at once, without a report (the listener counts it,
    /// [`ListenerStats::refused_per_client`](super::ListenerStats::refused_per_client), and logs
    /// the first of each run at that address). Leave it `None` (no limit) where the clients
    /// arrive through one address: a server behind server-side middleboxes or a load balancer,
    /// or clients behind one NAT. `Some(0)` closes every connection (counted, not logged). A
    /// reload that sets it counts the connections accepted from then on.
    pub max_connections_per_client: Option<usize>,
    /// At most this many new connections per second from one client (counted as for
    /// `max_connections_per_client`), `burst` of them at once: each connection makes the
    /// service run a handshake, a middlebox's evidence and its own connection to the next hop,
    /// which cost it far more than the client's ClientHello costs the client. One more is
    /// accepted and closed at once, without a report (counted,
    /// [`ListenerStats::refused_rate_per_client`](super::ListenerStats::refused_rate_per_client),
    /// and the first of each run logged; a run ends when the client's budget is whole again).
    /// A connection refused for `max_connections_per_client` does not use the rate up. The
    /// same caveat: leave it `None` where the clients arrive through one address.
    pub connection_rate_per_client: Option<ConnectionRate>,
}

/// A rate of new connections: `per_second` on average, `burst` at once after a pause of
/// `burst / per_second` seconds or more (a token bucket of `burst` refilled `per_second` times
/// a second, as nginx's `limit_req` with `burst` and `nodelay`). `per_second` 0 refuses every
/// connection; `burst` 0 counts as 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionRate {
    pub per_second: u32,
    pub burst: u32,
}

impl Default for Limits {
    /// [`DEFAULT_HANDSHAKE_TIMEOUT`], [`DEFAULT_IDLE_TIMEOUT`] and no connection limits.
    fn default() -> Limits {
        Limits {
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            idle_timeout: Some(DEFAULT_IDLE_TIMEOUT),
            max_connections: None,
            max_connections_per_client: None,
            connection_rate_per_client: None,
        }
    }
}

/// TCP keepalive on the sockets of middleboxes and servers: after this long without traffic the
/// kernel probes the peer ...
pub const KEEPALIVE_IDLE: std::time::Duration = std::time::Duration::from_secs(60);
/// ... every this long ...
const KEEPALIVE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);
/// ... and gives the connection up after this many unanswered probes. A peer that vanished
/// without FIN or RST (host down, NAT state lost) is then noticed within about two minutes of
/// silence, and its connection, with the one on the other side, is closed instead of being
/// held for good; a live but idle peer answers the probes (its session is bounded by the
/// idle timeout instead, [`Limits::idle_timeout`]).
const KEEPALIVE_PROBES: u32 = 6;

/// Turns TCP keepalive on for `socket` (best effort: a socket that refuses keeps working). On a
/// listening socket it covers every connection accepted from it: Linux copies the options to
/// each accepted socket, so they cost nothing per connection.
pub(crate) fn keep_alive(socket: &impl std::os::fd::AsFd) {
    let params = socket2::TcpKeepalive::new()
        .with_time(KEEPALIVE_IDLE)
        .with_interval(KEEPALIVE_INTERVAL)
        .with_retries(KEEPALIVE_PROBES);
    if let Err(e) = socket2::SockRef::from(socket).set_tcp_keepalive(&params) {
        tracing::debug!(error = %e, "cannot turn TCP keepalive on");
    }
}

/// Why a driver stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DriverError {
    /// A socket operation failed. The message carries the I/O error's, which is therefore not
    /// also this error's `source()`: a chain printer (anyhow's `{:#}`) says it once.
    #[error("{context}: {error}")]
    Io {
        context: &'static str,
        error: std::io::Error,
    },
    /// The handshake core refused the session (a configuration it refused is
    /// [`Config`](Self::Config)).
    #[error("mbTLS handshake failed: {0}")]
    Handshake(HandshakeError),
    /// The neighbour closed the TCP connection when it should not have.
    #[error("the {peer} closed the connection {when}")]
    PeerGone {
        peer: &'static str,
        when: &'static str,
    },
    /// The session ended with a fatal alert (received, or sent by us).
    #[error(
        "session ended with alert {} ({what})",
        mbx_engine::AlertDescription(*.description)
    )]
    Alert { description: u8, what: &'static str },
    /// The data phase ended abnormally (bad record, alert).
    #[error("relay: {0}")]
    Relay(String),
    /// A middlebox's app ended the session with a fatal alert (its verdict, and the reason it
    /// gave).
    #[error("{0}")]
    App(String),
    /// The handshake did not finish in time (`handshake_timeout` of the middlebox, the server
    /// or the client proxy); `waiting_for`: what an endpoint's handshake was waiting for then
    /// ([`ClientHandshake::waiting_for`](crate::handshake::ClientHandshake::waiting_for)), so
    /// that a stalled middlebox is named (found by an independent implementer, whose
    /// middlebox sent no evidence message and read only "not set up within 8 s").
    #[error("the handshake did not finish within {after:?}{}", waiting_text(waiting_for.as_deref()))]
    HandshakeTimeout {
        after: std::time::Duration,
        waiting_for: Option<String>,
    },
    /// The session carried nothing for its idle timeout (`Limits::idle_timeout`) and was closed.
    #[error("the session was idle for {0:?} and was closed")]
    IdleTimeout(std::time::Duration),
    /// A transparent middlebox (`NextHop::OriginalDestination`) got a connection no firewall
    /// redirected: it was made to the middlebox's own address, so there is nowhere to take it.
    #[error("the connection to {0} was not redirected to this transparent middlebox, so it has no other destination (redirect traffic here with nftables or iptables)")]
    NotRedirected(std::net::SocketAddr),
    /// A transparent middlebox got back one of its own connections to a next hop: the
    /// redirect rule catches the middlebox's own traffic too, which would loop.
    #[error("the connection from {0} is this middlebox's own connection to a next hop, redirected back to it: the redirect rule must leave the middlebox's own traffic alone (nftables: `meta skuid != <its user>` in the output hook; iptables: `-m owner ! --uid-owner <its user>`)")]
    RedirectedBack(std::net::SocketAddr),
    /// Configuration the driver cannot use.
    #[error("configuration: {0}")]
    Config(String),
}

/// What kind of failure ended a session: [`DriverError::kind`], and at a middlebox
/// [`ErrorKind::LegacyServer`]. A byte in each report (an idle middlebox connection keeps its
/// report).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    Io,
    Handshake,
    PeerGone,
    Alert,
    Relay,
    /// A middlebox's app ended the session ([`DriverError::App`]).
    App,
    HandshakeTimeout,
    IdleTimeout,
    NotRedirected,
    RedirectedBack,
    Config,
    /// A middlebox's server refused its announcement: a legacy server.
    LegacyServer,
}

impl ErrorKind {
    /// A stable name for logs and reports: the variant in snake case (`"peer_gone"`).
    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::Io => "io",
            ErrorKind::Handshake => "handshake",
            ErrorKind::PeerGone => "peer_gone",
            ErrorKind::Alert => "alert",
            ErrorKind::Relay => "relay",
            ErrorKind::App => "app",
            ErrorKind::HandshakeTimeout => "handshake_timeout",
            ErrorKind::IdleTimeout => "idle_timeout",
            ErrorKind::NotRedirected => "not_redirected",
            ErrorKind::RedirectedBack => "redirected_back",
            ErrorKind::Config => "config",
            ErrorKind::LegacyServer => "legacy_server",
        }
    }
}

/// "; it was waiting for …" when something is named.
fn waiting_text(waiting_for: Option<&str>) -> String {
    waiting_for.map_or_else(String::new, |w| format!("; it was waiting for {w}"))
}

impl DriverError {
    /// What kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        match self {
            DriverError::Io { .. } => ErrorKind::Io,
            DriverError::Handshake(_) => ErrorKind::Handshake,
            DriverError::PeerGone { .. } => ErrorKind::PeerGone,
            DriverError::Alert { .. } => ErrorKind::Alert,
            DriverError::Relay(_) => ErrorKind::Relay,
            DriverError::App(_) => ErrorKind::App,
            DriverError::HandshakeTimeout { .. } => ErrorKind::HandshakeTimeout,
            DriverError::IdleTimeout(_) => ErrorKind::IdleTimeout,
            DriverError::NotRedirected(_) => ErrorKind::NotRedirected,
            DriverError::RedirectedBack(_) => ErrorKind::RedirectedBack,
            DriverError::Config(_) => ErrorKind::Config,
        }
    }

    /// The session was ended beyond this endpoint's neighbour: the neighbour closed or reset
    /// the connection, or a fatal alert came from the path. Who ended it, and why, is then in
    /// the reports of the middleboxes and of the peer (a `handshake_failure` alert from an
    /// mbTLS server after a TLS 1.3 handshake that looked done is most often its refusal of
    /// one of its own middleboxes, docs/mbtls.md §4.2).
    pub fn ended_on_the_path(&self) -> bool {
        match self {
            DriverError::PeerGone { .. } => true,
            DriverError::Alert { what, .. } => *what == RECEIVED_FROM_THE_PATH,
            DriverError::Io { error, .. } => error.kind() == std::io::ErrorKind::ConnectionReset,
            _ => false,
        }
    }
}

/// A configuration the core refused is said once ("configuration: …", not "mbTLS handshake
/// failed: configuration: …"), wherever the driver meets it.
impl From<HandshakeError> for DriverError {
    fn from(e: HandshakeError) -> DriverError {
        match e {
            HandshakeError::Config(why) => DriverError::Config(why.into()),
            e => DriverError::Handshake(e),
        }
    }
}

impl DriverError {
    /// Whatever a configuration check refused is the configuration's.
    pub(crate) fn config(e: HandshakeError) -> DriverError {
        match e {
            HandshakeError::Config(why) => DriverError::Config(why.into()),
            e => DriverError::Config(e.to_string()),
        }
    }

    pub(crate) fn io(context: &'static str) -> impl FnOnce(std::io::Error) -> DriverError {
        move |error| DriverError::Io { context, error }
    }

    /// For a socket error on the connection to `peer` (a neighbour on the path, or the plain
    /// side's backend or local application): the peer resetting the connection (or gone
    /// while we wrote) is said as the other ends of a session are, "the previous hop
    /// closed the connection …" (`when`), not as an OS error (found in a user trial: "writing
    /// to the previous hop: Connection reset by peer (os error 104)"); any other error is one,
    /// under `context`.
    pub(crate) fn on_path(
        peer: &'static str,
        context: &'static str,
        when: &'static str,
    ) -> impl FnOnce(std::io::Error) -> DriverError {
        move |error| {
            use std::io::ErrorKind::{BrokenPipe, ConnectionAborted, ConnectionReset};
            match error.kind() {
                ConnectionReset | BrokenPipe | ConnectionAborted => {
                    DriverError::PeerGone { peer, when }
                }
                _ => DriverError::Io { context, error },
            }
        }
    }

    pub(crate) fn alert(alert: Alert, what: &'static str) -> DriverError {
        DriverError::Alert {
            description: alert.description.0,
            what,
        }
    }
}

/// [`DriverError::PeerGone`]'s `when` for a reset read from a neighbour.
pub(crate) const READ_RESET: &str = "with a reset";
/// [`DriverError::PeerGone`]'s `when` for a neighbour gone while we wrote to it.
pub(crate) const WRITE_RESET: &str = "while we were writing to it";

/// [`DriverError::Alert`]'s `what` for a fatal alert that came from the path (the peer, or a
/// middlebox on the way), not one we sent.
pub const RECEIVED_FROM_THE_PATH: &str = "received from the path";

/// Hex of a key fingerprint, as printed by the CLI and logs.
pub fn fingerprint_hex(fp: &[u8; 8]) -> String {
    fp.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A neighbour's reset is said as its leaving; other socket errors stay OS errors.
    #[test]
    fn a_reset_on_the_path_is_the_neighbour_leaving() {
        let on_path =
            || DriverError::on_path("previous hop", "reading from the previous hop", READ_RESET);
        let reset = on_path()(std::io::ErrorKind::ConnectionReset.into());
        assert_eq!(
            reset.to_string(),
            "the previous hop closed the connection with a reset"
        );
        let other = on_path()(std::io::ErrorKind::OutOfMemory.into());
        assert!(matches!(
            other,
            DriverError::Io {
                context: "reading from the previous hop",
                ..
            }
        ));
    }

    /// An I/O error is said once in a chain: in the message, not again as its source (found
    /// in an embedder's trial: anyhow's `{:#}` printed "Connection refused" twice).
    #[test]
    fn an_io_errors_cause_is_said_once() {
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let said = refused.to_string();
        let e = DriverError::io("cannot connect to the next hop")(refused);
        // The whole chain, as a chain printer walks it.
        let mut chain = e.to_string();
        let mut cause = std::error::Error::source(&e);
        while let Some(c) = cause {
            chain = format!("{chain}: {c}");
            cause = c.source();
        }
        assert_eq!(chain.matches(said.as_str()).count(), 1, "{chain}");
    }
}
