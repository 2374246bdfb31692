//! Apps that only look at the stream: an IDS, a logger, a byte counter.
//!
//! Such an app decides once per piece of data whether the session goes on, and never changes
//! a byte. Written as a [`MiddleboxApp`] it would have to say so twice, in `pass_unchanged`
//! (so that the relay passes records on in place) and in `on_data`; an [`Inspector`] says it
//! once, and [`Inspect`] runs it as an app.

use crate::app::{ConnectionInfo, Direction, MiddleboxApp, Verdict};

/// Looks at each direction's plaintext, in order, cut anywhere, and never changes it.
pub trait Inspector {
    /// `data` passes in `dir`. [`Verdict::Continue`] lets it through; [`Verdict::Close`]
    /// stops it (it is not forwarded) and ends the session with that alert.
    fn inspect(&mut self, dir: Direction, data: &[u8]) -> Verdict;

    /// The sender of `dir` closed it. The default lets the session go on.
    fn on_end(&mut self, dir: Direction) -> Verdict {
        let _ = dir;
        Verdict::Continue
    }

    /// Why the inspector ended the session, for the operator's report.
    fn close_reason(&self) -> Option<String> {
        None
    }

    /// Which connection it inspects ([`MiddleboxApp::on_connection`]).
    fn on_connection(&mut self, connection: &ConnectionInfo) {
        let _ = connection;
    }
}

/// Runs an [`Inspector`] as a [`MiddleboxApp`] that takes every byte unchanged.
#[derive(Debug, Clone, Default)]
pub struct Inspect<I>(pub I);

impl<I: Inspector> MiddleboxApp for Inspect<I> {
    fn on_data(&mut self, dir: Direction, data: &[u8], out: &mut Vec<u8>) -> Verdict {
        let verdict = self.0.inspect(dir, data);
        if verdict == Verdict::Continue {
            out.extend_from_slice(data);
        }
        verdict
    }

    fn on_end(&mut self, dir: Direction, _out: &mut Vec<u8>) -> Verdict {
        self.0.on_end(dir)
    }

    fn pass_unchanged(&mut self, dir: Direction, data: &[u8]) -> Option<Verdict> {
        Some(self.0.inspect(dir, data))
    }

    fn close_reason(&self) -> Option<String> {
        self.0.close_reason()
    }

    fn on_connection(&mut self, connection: &ConnectionInfo) {
        self.0.on_connection(connection)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::app::CloseAlert;

    /// Counts bytes and stops a direction at the word "attack" (within one piece, for the test).
    #[derive(Default)]
    struct Ids {
        bytes: usize,
    }

    impl Inspector for Ids {
        fn inspect(&mut self, _: Direction, data: &[u8]) -> Verdict {
            self.bytes += data.len();
            match data.windows(6).any(|w| w == b"attack") {
                true => Verdict::Close(CloseAlert::ACCESS_DENIED),
                false => Verdict::Continue,
            }
        }
    }

    /// Both of the app's entries give the inspector's verdict; `on_data` forwards the bytes it
    /// let through unchanged and nothing it stopped.
    #[test]
    fn an_inspector_is_asked_once_per_piece_whichever_way_it_comes() {
        let c2s = Direction::ClientToServer;
        let mut app = Inspect(Ids::default());
        assert_eq!(app.pass_unchanged(c2s, b"GET /"), Some(Verdict::Continue));
        let mut out = Vec::new();
        assert_eq!(app.on_data(c2s, b" HTTP/1.1", &mut out), Verdict::Continue);
        assert_eq!(out, b" HTTP/1.1");
        let stop = Verdict::Close(CloseAlert::ACCESS_DENIED);
        assert_eq!(app.on_data(c2s, b"an attack", &mut out), stop);
        assert_eq!(out, b" HTTP/1.1");
        assert_eq!(app.pass_unchanged(c2s, b"attack!"), Some(stop));
        assert_eq!(app.0.bytes, 5 + 9 + 9 + 7);
    }
}
