//! The data phase of an endpoint whose session was never exported: no middlebox could join on
//! its side (a client with `ClientMiddlebox::Disabled` whose primary context was built without
//! export, or a discovering server to which no middlebox announced itself before the
//! ClientHello), so the primary session's keys stay inside OpenSSL and OpenSSL keeps running
//! the records. This spares the endpoint OpenSSL's key log
//! (17–37 µs per TLS 1.3 handshake, docs/mbtls.md §6) and the export.
//!
//! It reports what [`EndpointDataPhase`](crate::EndpointDataPhase) reports, with OpenSSL's
//! checks: a record that fails framing or authentication ends the session with the alert
//! OpenSSL sends; nothing from it is delivered.

use std::collections::VecDeque;

use mbx_engine::{AlertDescription, EngineError, OpenSslEngine, TlsEngine};
use mbx_record::wipe;

use crate::endpoint::EndpointEvent;
use crate::error::MbtlsError;
use crate::hop::Alert;

/// An endpoint's data phase run by its paused primary OpenSSL engine.
pub(crate) struct DirectDataPhase {
    engine: OpenSslEngine,
    we_closed: bool,
    failed: Option<Alert>,
    events: VecDeque<EndpointEvent>,
    /// The engine's KeyUpdate counts (received, of which asking) already reported as events.
    reported: (u32, u32),
}

impl DirectDataPhase {
    /// See [`OpenSslEngine::release_idle_buffers`].
    pub(crate) fn release_idle_buffers(&mut self) {
        self.engine.release_idle_buffers();
    }

    /// Takes over `engine`, paused at the end of its handshake; records it holds unprocessed
    /// are read now.
    pub(crate) fn new(mut engine: OpenSslEngine) -> Self {
        engine.resume_after_pause();
        let mut phase = DirectDataPhase {
            engine,
            we_closed: false,
            failed: None,
            events: VecDeque::new(),
            reported: (0, 0),
        };
        phase.pump();
        phase
    }

    pub(crate) fn write(&mut self, data: &[u8]) -> Result<(), MbtlsError> {
        self.usable()?;
        if self.we_closed {
            return Err(MbtlsError::Closed);
        }
        if let Err(e) = self.engine.write_plaintext(data) {
            return Err(self.fail(e));
        }
        Ok(())
    }

    pub(crate) fn close(&mut self) -> Result<(), MbtlsError> {
        self.usable()?;
        if !self.we_closed {
            if let Err(e) = self.engine.close() {
                return Err(self.fail(e));
            }
            self.we_closed = true;
        }
        Ok(())
    }

    /// OpenSSL sends only the alerts of its own failures: an application's fatal alert has no
    /// way out of a session whose keys stayed inside it.
    pub(crate) fn abort(&mut self) -> Result<(), MbtlsError> {
        self.usable()?;
        Err(MbtlsError::Unsupported(
            "a fatal alert of the application's where OpenSSL keeps the session (it sends only \
             its own)",
        ))
    }

    /// TLS 1.3: sends a KeyUpdate through OpenSSL (`request_peer`: asking for the peer's).
    /// TLS 1.2 (or closed): an error that leaves the session as it was.
    pub(crate) fn update_keys(&mut self, request_peer: bool) -> Result<(), MbtlsError> {
        self.usable()?;
        if self.we_closed {
            return Err(MbtlsError::Closed);
        }
        match self.engine.update_keys(request_peer) {
            Ok(()) => Ok(()),
            Err(EngineError::Unsupported(_)) => {
                Err(MbtlsError::KeyMaterial("KeyUpdate needs TLS 1.3"))
            }
            Err(e) => Err(self.fail(e)),
        }
    }

    /// Ciphertext from the neighbour, split anywhere.
    pub(crate) fn receive(&mut self, bytes: &[u8]) {
        if self.failed.is_some() || self.engine.peer_closed() {
            return;
        }
        self.engine.feed(bytes);
        self.pump();
    }

    fn pump(&mut self) {
        let was_closed = self.engine.peer_closed();
        if let Err(e) = self.engine.process() {
            self.fail(e);
            return;
        }
        // OpenSSL followed (and answered) them already; which of several since the last pump
        // asked is not kept, only how many.
        let (all, asked) = self.engine.peer_key_updates();
        let (new, new_asked) = (all - self.reported.0, asked - self.reported.1);
        self.reported = (all, asked);
        for n in 0..new {
            let requested = n < new_asked;
            self.events
                .push_back(EndpointEvent::PeerUpdatedKeys { requested });
        }
        if self.engine.peer_closed() && !was_closed {
            self.events.push_back(EndpointEvent::PeerClosed);
        }
    }

    fn usable(&self) -> Result<(), MbtlsError> {
        match self.failed {
            Some(a) => Err(MbtlsError::Failed(a)),
            None => Ok(()),
        }
    }

    /// OpenSSL failed the session: a received fatal alert, or one it sent (its alert record is
    /// in the outgoing bytes). A failure without an alert is reported as `internal_error`,
    /// although none left.
    fn fail(&mut self, e: EngineError) -> MbtlsError {
        let (alert, event) = match e {
            EngineError::AlertReceived { alert } => {
                let a = Alert::fatal(alert);
                (a, EndpointEvent::PeerAlert(a))
            }
            EngineError::Fatal {
                alert: Some(sent), ..
            } => {
                let a = Alert::fatal(sent);
                let what = "OpenSSL refused the peer's records";
                (a, EndpointEvent::Failed { alert: a, what })
            }
            _ => {
                let a = Alert::fatal(AlertDescription::INTERNAL_ERROR);
                let what = "OpenSSL failed without sending an alert";
                (a, EndpointEvent::Failed { alert: a, what })
            }
        };
        self.failed = Some(alert);
        self.events.push_back(event);
        MbtlsError::Failed(alert)
    }

    pub(crate) fn take_outgoing(&mut self) -> Vec<u8> {
        self.engine.take_outgoing()
    }

    pub(crate) fn take_plaintext(&mut self) -> Vec<u8> {
        self.engine.take_plaintext()
    }

    pub(crate) fn poll_event(&mut self) -> Option<EndpointEvent> {
        self.events.pop_front()
    }
}

impl Drop for DirectDataPhase {
    fn drop(&mut self) {
        wipe::wipe_vec(&mut self.engine.take_plaintext());
        // The peer ended the session with close_notify: it stays resumable even if ours was
        // never sent (the peer may have closed its socket right after, as `s_client
        // -reconnect` does). After a failure OpenSSL has already made it unresumable.
        if self.failed.is_none() && self.engine.peer_closed() {
            self.engine.keep_session();
        }
    }
}
