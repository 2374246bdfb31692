//! The plug-in interface between a protocol core and a middlebox function.

/// Which way the bytes travel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    ClientToServer,
    ServerToClient,
}

impl Direction {
    /// The opposite direction.
    pub const fn reverse(self) -> Direction {
        match self {
            Direction::ClientToServer => Direction::ServerToClient,
            Direction::ServerToClient => Direction::ClientToServer,
        }
    }
}

/// The TLS alert a core sends to both sides when an app ends the session. Kept as a plain
/// alert description number so this crate stays independent of any TLS library.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CloseAlert(pub u8);

impl CloseAlert {
    /// Orderly end of the session (close_notify, 0).
    pub const CLOSE_NOTIFY: CloseAlert = CloseAlert(0);
    /// The app refuses the traffic, e.g. a firewall or a malformed request (access_denied, 49).
    pub const ACCESS_DENIED: CloseAlert = CloseAlert(49);
}

/// What the core should do after an app call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Forward what the app appended to `out` and carry on.
    Continue,
    /// Forward what the app appended to `out`, then end the whole session (both directions)
    /// with this alert.
    Close(CloseAlert),
}

/// A middlebox function over the decrypted byte stream of each direction.
///
/// The core calls [`on_data`](MiddleboxApp::on_data) with plaintext in the order it was sent,
/// split at arbitrary points (record boundaries are not message boundaries), and forwards
/// exactly the bytes the app appended to `out`. Holding bytes back (appending nothing yet) is
/// allowed; the app must release them later or at [`on_end`](MiddleboxApp::on_end).
///
/// Implementations must not panic on any input: the bytes come from the network. The mbTLS
/// middlebox driver runs each app inside [`CatchPanic`](crate::CatchPanic) all the same, so
/// that a bug ends one session with an `internal_error` alert and a report saying why.
pub trait MiddleboxApp {
    /// Plaintext arrived in direction `dir`; append the bytes to forward to `out`.
    fn on_data(&mut self, dir: Direction, data: &[u8], out: &mut Vec<u8>) -> Verdict;

    /// The sender of `dir` closed it (close_notify): append anything still held back. No
    /// more data will arrive in `dir`. The default forwards nothing more.
    fn on_end(&mut self, dir: Direction, out: &mut Vec<u8>) -> Verdict {
        let _ = (dir, out);
        Verdict::Continue
    }

    /// Offers `data` to be passed on unchanged, before [`on_data`](MiddleboxApp::on_data)
    /// would see it. An app that would forward exactly these bytes now, with nothing of `dir`
    /// held back from earlier calls, may take them here: it updates its state as `on_data`
    /// would and returns `Some`. The core then passes `data` on itself without copying it (the
    /// mbTLS relay re-encrypts such a record where it was decrypted). `Some(Continue)`: pass
    /// `data` on. `Some(Close)`: do not pass `data` on, and end the session with that alert
    /// (close_notify: in an orderly way), so an app can stop what it detected. `None`: the
    /// app did not take the bytes; the core gives them to `on_data`.
    ///
    /// An app that only looks at the stream (an IDS, a logger) answers `Some` always; one that
    /// rewrites parts of it answers `Some` where it knows no rewrite can fall (a body it only
    /// counts, a direction it never changes). The default, `None`, is right for any app.
    fn pass_unchanged(&mut self, dir: Direction, data: &[u8]) -> Option<Verdict> {
        let _ = (dir, data);
        None
    }

    /// Why the app ended the session with a fatal alert, for the operator's report. The
    /// default says nothing.
    fn close_reason(&self) -> Option<String> {
        None
    }

    /// Which connection this app serves, given once before any data: what an app keeps to
    /// tie what it finds (an IDS alert, a log line) to the connection's report. The default
    /// ignores it.
    fn on_connection(&mut self, connection: &ConnectionInfo) {
        let _ = connection;
    }
}

/// The connection an app serves ([`MiddleboxApp::on_connection`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConnectionInfo {
    /// The connection's number, as its report gives it (from 0 per listener, in accept order).
    pub id: u64,
    /// Where the connection came from (the client, or the middlebox before this one).
    pub client: Option<std::net::SocketAddr>,
    /// Where it goes on to (the server, or the next middlebox), as configured or found.
    pub next_hop: Option<String>,
}

impl ConnectionInfo {
    pub fn new(
        id: u64,
        client: Option<std::net::SocketAddr>,
        next_hop: Option<String>,
    ) -> ConnectionInfo {
        ConnectionInfo {
            id,
            client,
            next_hop,
        }
    }
}

impl<A: MiddleboxApp + ?Sized> MiddleboxApp for Box<A> {
    fn on_data(&mut self, dir: Direction, data: &[u8], out: &mut Vec<u8>) -> Verdict {
        (**self).on_data(dir, data, out)
    }

    fn on_end(&mut self, dir: Direction, out: &mut Vec<u8>) -> Verdict {
        (**self).on_end(dir, out)
    }

    fn pass_unchanged(&mut self, dir: Direction, data: &[u8]) -> Option<Verdict> {
        (**self).pass_unchanged(dir, data)
    }

    fn close_reason(&self) -> Option<String> {
        (**self).close_reason()
    }

    fn on_connection(&mut self, connection: &ConnectionInfo) {
        (**self).on_connection(connection)
    }
}
