//! An app's panic ends its session, not the task serving the connection.
//!
//! Apps are plug-ins, often written by the operator. A panic in one would otherwise unwind
//! through the core and the driver's task: the connection's sockets would just close, each
//! endpoint would see its peer vanish without an alert, and the report would not say why.
//! [`CatchPanic`] turns it into an ordinary verdict instead: the core ends the session with a
//! fatal `internal_error` alert toward both sides, and [`close_reason`](MiddleboxApp::close_reason)
//! gives the panic's message for the report.

use std::panic::{catch_unwind, AssertUnwindSafe};

use zeroize::Zeroize;

use crate::app::{CloseAlert, ConnectionInfo, Direction, MiddleboxApp, Verdict};

/// The alert a session ends with when its app panicked (internal_error, 80).
pub const APP_PANICKED: CloseAlert = CloseAlert(80);

/// Runs `A`, catching its panics: the call that panicked, and every call after it, answer
/// `Close(`[`APP_PANICKED`]`)`, and the output of the call that panicked is dropped (wiped:
/// it may be plaintext). The app is not called again after a panic, since its state may be
/// broken.
#[derive(Debug)]
pub struct CatchPanic<A> {
    app: A,
    /// The panic's message, once the app panicked.
    panicked: Option<Box<str>>,
}

impl<A: MiddleboxApp> CatchPanic<A> {
    pub fn new(app: A) -> CatchPanic<A> {
        CatchPanic {
            app,
            panicked: None,
        }
    }

    /// The message of the app's panic, if it panicked.
    pub fn panicked(&self) -> Option<&str> {
        self.panicked.as_deref()
    }

    /// Runs `call` on the app unless it panicked before; a panic now is kept and `stopped` is
    /// returned instead.
    fn guarded<T>(&mut self, stopped: T, call: impl FnOnce(&mut A) -> T) -> T {
        if self.panicked.is_some() {
            return stopped;
        }
        let app = &mut self.app;
        match catch_unwind(AssertUnwindSafe(|| call(app))) {
            Ok(answer) => answer,
            Err(payload) => {
                self.panicked = Some(panic_message(payload.as_ref()).into_boxed_str());
                stopped
            }
        }
    }

    /// [`guarded`](Self::guarded) for a call with output: what the call appended to `out` is
    /// wiped and cut off if it panicked.
    fn guarded_out(
        &mut self,
        out: &mut Vec<u8>,
        call: impl FnOnce(&mut A, &mut Vec<u8>) -> Verdict,
    ) -> Verdict {
        let before = out.len();
        let verdict = self.guarded(Verdict::Close(APP_PANICKED), |app| call(app, &mut *out));
        if self.panicked.is_some() {
            if let Some(tail) = out.get_mut(before..) {
                tail.zeroize();
            }
            out.truncate(before);
        }
        verdict
    }
}

impl<A: MiddleboxApp> MiddleboxApp for CatchPanic<A> {
    fn on_data(&mut self, dir: Direction, data: &[u8], out: &mut Vec<u8>) -> Verdict {
        self.guarded_out(out, |app, out| app.on_data(dir, data, out))
    }

    fn on_end(&mut self, dir: Direction, out: &mut Vec<u8>) -> Verdict {
        self.guarded_out(out, |app, out| app.on_end(dir, out))
    }

    fn pass_unchanged(&mut self, dir: Direction, data: &[u8]) -> Option<Verdict> {
        let stopped = Some(Verdict::Close(APP_PANICKED));
        self.guarded(stopped, |app| app.pass_unchanged(dir, data))
    }

    fn on_connection(&mut self, connection: &ConnectionInfo) {
        // A panic here is kept: the first data call then ends the session.
        self.guarded((), |app| app.on_connection(connection));
    }

    fn close_reason(&self) -> Option<String> {
        match &self.panicked {
            Some(message) => Some(format!("the middlebox app panicked: {message}")),
            // Its own reason; a panic here only loses the reason.
            None => catch_unwind(AssertUnwindSafe(|| self.app.close_reason()))
                .unwrap_or_else(|_| Some("the middlebox app panicked saying why".into())),
        }
    }
}

/// What a panic said: its `&str` or `String` payload, as `panic!` makes them.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "(no message)".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Passes bytes on until it sees `boom`, then panics (after writing part of its output).
    struct Fragile {
        calls: u32,
    }

    impl MiddleboxApp for Fragile {
        fn on_data(&mut self, _: Direction, data: &[u8], out: &mut Vec<u8>) -> Verdict {
            self.calls += 1;
            out.extend_from_slice(data);
            assert!(!data.starts_with(b"boom"), "found {} bytes", data.len());
            Verdict::Continue
        }

        fn pass_unchanged(&mut self, _: Direction, data: &[u8]) -> Option<Verdict> {
            self.calls += 1;
            assert!(!data.starts_with(b"bang"));
            None
        }
    }

    #[test]
    fn a_panicking_app_ends_its_session_with_internal_error_and_says_why() {
        let c2s = Direction::ClientToServer;
        let mut app = CatchPanic::new(Fragile { calls: 0 });
        let mut out = b"head".to_vec();
        assert_eq!(app.on_data(c2s, b"fine", &mut out), Verdict::Continue);
        assert_eq!(out, b"headfine");
        assert_eq!(app.close_reason(), None);
        // The panicking call's output is dropped; what came before stays.
        let v = app.on_data(c2s, b"boom!", &mut out);
        assert_eq!(v, Verdict::Close(APP_PANICKED));
        assert_eq!(out, b"headfine");
        assert_eq!(app.panicked(), Some("found 5 bytes"));
        assert_eq!(
            app.close_reason().as_deref(),
            Some("the middlebox app panicked: found 5 bytes")
        );
        // Never called again: every later call is refused the same way.
        let calls = app.app.calls;
        assert_eq!(
            app.on_data(c2s, b"fine", &mut out),
            Verdict::Close(APP_PANICKED)
        );
        assert_eq!(app.on_end(c2s, &mut out), Verdict::Close(APP_PANICKED));
        assert_eq!(
            app.pass_unchanged(c2s, b"fine"),
            Some(Verdict::Close(APP_PANICKED))
        );
        assert_eq!((app.app.calls, out.as_slice()), (calls, &b"headfine"[..]));
    }

    #[test]
    fn a_panic_where_bytes_are_offered_unchanged_is_caught_too() {
        let mut app = CatchPanic::new(Fragile { calls: 0 });
        let s2c = Direction::ServerToClient;
        assert_eq!(app.pass_unchanged(s2c, b"fine"), None);
        assert_eq!(
            app.pass_unchanged(s2c, b"bang"),
            Some(Verdict::Close(APP_PANICKED))
        );
        assert!(app
            .panicked()
            .is_some_and(|m| m.contains("assertion failed")));
    }
}
