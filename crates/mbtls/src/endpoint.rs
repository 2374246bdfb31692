//! An endpoint's data phase: its record layer after the handshake, under the keys of its
//! adjacent hop (fresh keys from its side's key generation, or the primary session's keys when
//! it has no middlebox on its side).
//!
//! Same fail-closed rules as a middlebox: a record that fails framing or authentication is a
//! fatal `bad_record_mac` sent to the neighbour; nothing from it is delivered.

use std::collections::VecDeque;

use mbx_engine::{AlertDescription, Role, TicketSink};
use mbx_record::wipe::{self, wipe};
use mbx_record::{ContentType, TlsVersion};
use mbx_wire::HandshakeType;

use crate::error::MbtlsError;
use crate::hop::{for_each_record, Alert, Hop, Input};
use crate::key_update::{key_update_message, PostHandshake, Violation};
use crate::keys::HopKeys;

/// What happened on an endpoint's connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EndpointEvent {
    /// The peer ended its direction with close_notify.
    PeerClosed,
    /// A non-fatal warning alert arrived.
    PeerWarning(Alert),
    /// The peer (or a middlebox) ended the session with this alert.
    PeerAlert(Alert),
    /// A TLS 1.3 NewSessionTicket arrived and was ignored (the client's context does not
    /// resume sessions, or the message was refused; at a server, always).
    SessionTicketIgnored,
    /// A TLS 1.3 NewSessionTicket arrived and went to the primary context's session store
    /// through the export's ticket sink (docs/mbtls.md §4.6).
    SessionTicketKept,
    /// The peer updated its keys (TLS 1.3 KeyUpdate); `requested`: it asked us to update ours,
    /// which we did.
    PeerUpdatedKeys { requested: bool },
    /// We ended the session: `alert` was sent to the neighbour.
    Failed { alert: Alert, what: &'static str },
}

/// Why this end sent `bad_record_mac`, in words that say it was sent here, not received
/// (an independent implementer read "session ended with alert bad_record_mac(20) (bad record)"
/// for two bugs of his middlebox and could not tell who raised it).
const NOT_AUTHENTIC: &str = "sent by this end: a record from its neighbour on the path did not \
     authenticate under this hop's keys (keys or sequence numbers that differ, or tampering)";
const BAD_FRAMING: &str =
    "sent by this end: a record from its neighbour on the path was not a well-formed record";

/// Why a TLS 1.2 handshake message after the handshake ends the session (an interop trial's
/// Java peers renegotiated, and read only "record type not allowed in the data phase").
pub(crate) const RENEGOTIATION: &str = "a handshake message after the handshake: TLS 1.2 \
     renegotiation, which mbTLS does not support (docs/mbtls.md §7)";

/// The record layer of a client or server after an mbTLS handshake.
/// Plaintext not yet taken by the application is wiped when the data phase is dropped.
pub struct EndpointDataPhase {
    role: Role,
    hop: Hop,
    post_handshake: PostHandshake,
    outgoing: Vec<u8>,
    plaintext: Vec<u8>,
    peer_closed: bool,
    we_closed: bool,
    failed: Option<Alert>,
    events: VecDeque<EndpointEvent>,
    /// We asked the peer to update its keys and it has not yet.
    asked_peer: bool,
    /// We sealed application data under our current write keys (since the handshake or our
    /// last KeyUpdate).
    wrote_under_current_keys: bool,
    /// The peer asked for our KeyUpdate while we had written nothing under our current keys:
    /// it goes out before our next application data (RFC 8446 §4.6.3).
    key_update_owed: bool,
    /// Client that resumes sessions: where the server's tickets go, until its first data,
    /// a KeyUpdate or an idle trim.
    tickets: Option<TicketSink>,
}

impl Drop for EndpointDataPhase {
    fn drop(&mut self) {
        wipe::wipe_vec(&mut self.plaintext);
    }
}

impl EndpointDataPhase {
    /// An idle session gives back what its buffers grew to: the incomplete record kept is
    /// shrunk to its bytes, the (ciphertext) output buffer freed if empty.
    pub fn release_idle_buffers(&mut self) {
        self.hop.release_idle_buffer();
        self.post_handshake.release_idle_buffer();
        self.outgoing.shrink_to_fit();
        // A session that went idle without tickets gets none worth waiting for.
        self.tickets = None;
    }

    /// The primary engine's ticket sink (a client whose context resumes sessions): TLS 1.3
    /// tickets that arrive from now on become sessions of that context.
    pub fn keep_tickets(&mut self, sink: TicketSink) {
        self.tickets = Some(sink);
    }

    /// `keys` are the hop to the endpoint's neighbour; a client writes `c2s`, a server `s2c`.
    pub fn new(role: Role, version: TlsVersion, keys: HopKeys) -> Self {
        let HopKeys { c2s, s2c } = keys;
        let hop = match role {
            Role::Client => Hop::new(version, s2c, c2s),
            Role::Server => Hop::new(version, c2s, s2c),
        };
        EndpointDataPhase {
            role,
            hop,
            post_handshake: PostHandshake::new(),
            outgoing: Vec::new(),
            plaintext: Vec::new(),
            peer_closed: false,
            we_closed: false,
            failed: None,
            events: VecDeque::new(),
            asked_peer: false,
            wrote_under_current_keys: false,
            key_update_owed: false,
            tickets: None,
        }
    }

    pub fn role(&self) -> Role {
        self.role
    }

    /// Encrypt application data for the neighbour (records of at most 2^14 bytes).
    pub fn write(&mut self, data: &[u8]) -> Result<(), MbtlsError> {
        if let Some(a) = self.failed {
            return Err(MbtlsError::Failed(a));
        }
        if self.we_closed {
            return Err(MbtlsError::Closed);
        }
        self.update_worn_keys();
        if self.key_update_owed {
            self.send_key_update(false);
            if let Some(a) = self.failed {
                return Err(MbtlsError::Failed(a));
            }
        }
        let r = self
            .hop
            .seal_data(ContentType::APPLICATION_DATA, data, &mut self.outgoing);
        if let Err(e) = r {
            self.fail(AlertDescription::INTERNAL_ERROR, "sealing failed");
            return Err(e.into());
        }
        self.wrote_under_current_keys |= !data.is_empty();
        Ok(())
    }

    /// TLS 1.3: sends a KeyUpdate, after which our records are under the next generation of
    /// our keys on every hop to the peer; `request_peer`: the peer is asked to update its keys
    /// too (it answers with a KeyUpdate of its own). TLS 1.2 has no KeyUpdate: an error.
    pub fn update_keys(&mut self, request_peer: bool) -> Result<(), MbtlsError> {
        if let Some(a) = self.failed {
            return Err(MbtlsError::Failed(a));
        }
        if self.we_closed {
            return Err(MbtlsError::Closed);
        }
        if self.hop.version() != TlsVersion::Tls13 {
            return Err(MbtlsError::KeyMaterial("KeyUpdate needs TLS 1.3"));
        }
        self.asked_peer |= request_peer;
        self.send_key_update(request_peer);
        match self.failed {
            Some(a) => Err(MbtlsError::Failed(a)),
            None => Ok(()),
        }
    }

    /// TLS 1.3: worn keys ([`Hop::worn`]) are updated before they reach their limit, ours
    /// directly, the peer's by asking it (once, until it did). TLS 1.2 cannot: its hops end the
    /// session at the limit.
    fn update_worn_keys(&mut self) {
        if self.we_closed || self.failed.is_some() {
            return;
        }
        let (read, write) = self.hop.worn();
        let ask = read && !self.asked_peer && !self.peer_closed;
        if write || ask {
            self.asked_peer |= ask;
            self.send_key_update(ask);
        }
    }

    /// Seals a KeyUpdate under the current keys, then moves to the next ones.
    fn send_key_update(&mut self, request_peer: bool) {
        if self.try_send_key_update(request_peer).is_err() {
            self.fail(
                AlertDescription::INTERNAL_ERROR,
                "KeyUpdate could not be sent",
            );
        }
    }

    fn try_send_key_update(&mut self, request_peer: bool) -> Result<(), MbtlsError> {
        let msg = key_update_message(request_peer)?;
        self.hop
            .seal_data(ContentType::HANDSHAKE, &msg, &mut self.outgoing)?;
        // Any KeyUpdate of ours answers a request the peer made before it.
        self.key_update_owed = false;
        self.wrote_under_current_keys = false;
        self.hop.update_write_keys()
    }

    /// Ends the session with a fatal alert of ours, `description` (e.g. `internal_error` when
    /// what the session serves failed): nothing more is sent or read, and the failure is an
    /// event (`what`) as when a check fails. After our close_notify there is nothing to end.
    pub fn abort(
        &mut self,
        description: AlertDescription,
        what: &'static str,
    ) -> Result<(), MbtlsError> {
        if let Some(a) = self.failed {
            return Err(MbtlsError::Failed(a));
        }
        if self.we_closed {
            return Err(MbtlsError::Closed);
        }
        self.fail(description, what);
        Ok(())
    }

    /// Send close_notify: no more data from us.
    pub fn close(&mut self) -> Result<(), MbtlsError> {
        if let Some(a) = self.failed {
            return Err(MbtlsError::Failed(a));
        }
        if !self.we_closed {
            self.hop
                .seal_alert(Alert::close_notify(), &mut self.outgoing)?;
            self.we_closed = true;
        }
        Ok(())
    }

    /// Ciphertext from the neighbour, split anywhere.
    pub fn receive(&mut self, bytes: &[u8]) {
        self.receive_input(Input::Borrowed(bytes));
    }

    /// Like [`receive`](Self::receive), but records are decrypted where they lie in `bytes`
    /// (no copy); afterwards `bytes` holds no plaintext and its contents are unspecified.
    pub fn receive_in_place(&mut self, bytes: &mut [u8]) {
        self.receive_input(Input::Lent(bytes));
    }

    fn receive_input(&mut self, input: Input<'_>) {
        if self.failed.is_some() || self.peer_closed {
            return;
        }
        let version = self.hop.version();
        let mut pending = self.hop.take_pending();
        for_each_record(version, &mut pending, input, |record| {
            let Ok(record) = record else {
                self.fail(AlertDescription::BAD_RECORD_MAC, BAD_FRAMING);
                return false;
            };
            let opened = match self.hop.open_in_place(record) {
                Ok(o) => o,
                Err(_) => {
                    self.fail(AlertDescription::BAD_RECORD_MAC, NOT_AUTHENTIC);
                    return false;
                }
            };
            if opened.content_type != ContentType::HANDSHAKE && self.post_handshake.mid_message() {
                let v = crate::key_update::INTERLEAVED;
                self.fail(v.alert, v.what);
                // Opened, so wiped as any record's plaintext.
                wipe(record.get_mut(opened.range).unwrap_or_default());
                return false;
            }
            if let Some(pt) = record.get_mut(opened.range) {
                self.handle(opened.content_type, pt);
                wipe(pt);
            }
            self.failed.is_none() && !self.peer_closed
        });
        if self.failed.is_some() || self.peer_closed {
            pending.clear();
        }
        self.hop.restore_pending(pending);
        self.update_worn_keys();
    }

    fn handle(&mut self, ct: ContentType, pt: &[u8]) {
        match ct {
            ContentType::APPLICATION_DATA => {
                // Servers send their tickets before any data.
                self.tickets = None;
                // Grow without leaving a copy of earlier plaintext in freed memory.
                wipe::reserve(&mut self.plaintext, pt.len());
                self.plaintext.extend_from_slice(pt)
            }
            ContentType::ALERT => match Alert::parse(pt) {
                None => self.fail(AlertDescription::DECODE_ERROR, "malformed alert"),
                Some(a) if a.is_close_notify() => {
                    self.peer_closed = true;
                    self.events.push_back(EndpointEvent::PeerClosed);
                }
                Some(a) if a.ends_session(self.hop.version()) => {
                    self.failed = Some(a);
                    self.events.push_back(EndpointEvent::PeerAlert(a));
                }
                Some(a) => self.events.push_back(EndpointEvent::PeerWarning(a)),
            },
            ContentType::HANDSHAKE if self.hop.version() == TlsVersion::Tls13 => {
                self.post_handshake_record(pt)
            }
            ContentType::HANDSHAKE => {
                self.fail(AlertDescription::UNEXPECTED_MESSAGE, RENEGOTIATION)
            }
            _ => self.fail(
                AlertDescription::UNEXPECTED_MESSAGE,
                "record type not allowed in the data phase",
            ),
        }
    }

    /// One TLS 1.3 post-handshake record: a server's tickets go to the ticket sink if there is
    /// one and are ignored otherwise, a KeyUpdate is followed (and answered when the peer
    /// asks), anything else (a client's ticket too, RFC 8446 §4.6.1) ends the session.
    fn post_handshake_record(&mut self, pt: &[u8]) {
        let (events, tickets) = (&mut self.events, &mut self.tickets);
        let from_server = self.role == Role::Client;
        let update = self.post_handshake.record(pt, |msg| {
            if msg.typ() == HandshakeType::NEW_SESSION_TICKET && from_server {
                let kept = match tickets.as_mut().map(|sink| sink.take(msg.as_bytes())) {
                    Some(Ok(())) => true,
                    Some(Err(e)) => {
                        tracing::debug!(%e, "session ticket refused");
                        *tickets = None;
                        false
                    }
                    None => false,
                };
                events.push_back(if kept {
                    EndpointEvent::SessionTicketKept
                } else {
                    EndpointEvent::SessionTicketIgnored
                });
                Ok(())
            } else {
                Err(Violation {
                    alert: AlertDescription::UNEXPECTED_MESSAGE,
                    what: "post-handshake message not supported through mbTLS",
                })
            }
        });
        let requested = match update {
            Ok(None) => return,
            Ok(Some(requested)) => requested,
            Err(v) => return self.fail(v.alert, v.what),
        };
        // The sink seals under the keys the peer just left.
        self.tickets = None;
        if self.hop.update_read_keys().is_err() {
            return self.fail(
                AlertDescription::INTERNAL_ERROR,
                "cannot follow a KeyUpdate",
            );
        }
        self.asked_peer = false;
        self.events
            .push_back(EndpointEvent::PeerUpdatedKeys { requested });
        // Answered before any more data of ours (RFC 8446 §4.6.3); after our close_notify
        // nothing more is sent, so nothing is answered. Keys we have written nothing under
        // yet are as fresh as an update would make them: the answer waits for our next data,
        // so a peer asking again and again while we are silent gets one answer (as the RFC
        // has it), not one queued per request toward a peer that may never read them.
        if requested && !self.we_closed {
            if self.wrote_under_current_keys {
                self.send_key_update(false);
            } else {
                self.key_update_owed = true;
            }
        }
    }

    fn fail(&mut self, desc: AlertDescription, what: &'static str) {
        let alert = Alert::fatal(desc);
        self.failed = Some(alert);
        // Best effort: the session is failed whether or not the alert could be sealed.
        let _ = self.hop.seal_alert(alert, &mut self.outgoing);
        self.events.push_back(EndpointEvent::Failed { alert, what });
    }

    /// Application data that was already decrypted before this data phase took over (e.g. an
    /// engine's pending plaintext at export); it is returned first by `take_plaintext`.
    pub(crate) fn inject_plaintext(&mut self, data: &[u8]) {
        if !data.is_empty() {
            let mut all = Vec::with_capacity(data.len() + self.plaintext.len());
            all.extend_from_slice(data);
            all.extend_from_slice(&self.plaintext);
            wipe::wipe_vec(&mut self.plaintext);
            self.plaintext = all;
        }
    }

    pub fn take_outgoing(&mut self) -> Vec<u8> {
        core::mem::take(&mut self.outgoing)
    }

    /// Application data received so far.
    pub fn take_plaintext(&mut self) -> Vec<u8> {
        core::mem::take(&mut self.plaintext)
    }

    pub fn poll_event(&mut self) -> Option<EndpointEvent> {
        self.events.pop_front()
    }

    pub fn peer_closed(&self) -> bool {
        self.peer_closed
    }

    /// The alert that ended the session, sent or received.
    pub fn failure(&self) -> Option<Alert> {
        self.failed
    }
}

impl core::fmt::Debug for EndpointDataPhase {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("EndpointDataPhase")
            .field("role", &self.role)
            .field("hop", &self.hop)
            .field("failed", &self.failed)
            .finish_non_exhaustive()
    }
}
