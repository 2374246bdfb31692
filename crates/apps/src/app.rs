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
/// Implementations must not panic on any input: the bytes come from the network.
pub trait MiddleboxApp {
    /// Plaintext arrived in direction `dir`; append the bytes to forward to `out`.
    fn on_data(&mut self, dir: Direction, data: &[u8], out: &mut Vec<u8>) -> Verdict;

    /// The sender of `dir` closed it (close_notify): append anything still held back. No
    /// more data will arrive in `dir`. The default forwards nothing more.
    fn on_end(&mut self, dir: Direction, out: &mut Vec<u8>) -> Verdict {
        let _ = (dir, out);
        Verdict::Continue
    }

    /// True for an app that only looks at the stream (an IDS, a logger): its `on_data` appends
    /// exactly the bytes it was given and `on_end` nothing. A core may then call
    /// [`inspect`](MiddleboxApp::inspect) instead of `on_data` and pass the bytes on itself,
    /// without copying them (the mbTLS relay re-encrypts such records where they were
    /// decrypted). The default, false, is right for any app.
    fn read_only(&self) -> bool {
        false
    }

    /// A read-only app's look at plaintext of direction `dir`. `Continue`: the core passes
    /// `data` on unchanged. `Close`: the core does not pass `data` on and ends the session
    /// with that alert (close_notify: in an orderly way), so an app can stop what it
    /// detected. The default runs `on_data` into a scratch buffer.
    fn inspect(&mut self, dir: Direction, data: &[u8]) -> Verdict {
        let mut out = Vec::new();
        self.on_data(dir, data, &mut out)
    }
}

impl<A: MiddleboxApp + ?Sized> MiddleboxApp for Box<A> {
    fn on_data(&mut self, dir: Direction, data: &[u8], out: &mut Vec<u8>) -> Verdict {
        (**self).on_data(dir, data, out)
    }

    fn on_end(&mut self, dir: Direction, out: &mut Vec<u8>) -> Verdict {
        (**self).on_end(dir, out)
    }

    fn read_only(&self) -> bool {
        (**self).read_only()
    }

    fn inspect(&mut self, dir: Direction, data: &[u8]) -> Verdict {
        (**self).inspect(dir, data)
    }
}
