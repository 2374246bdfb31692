//! A server-side middlebox's handshake (sans-I/O), pre-configured by the server or on its path.
//!
//! Forwards the primary handshake unchanged and, right before the ClientHello, sends a
//! `MiddleboxAnnouncement` toward the server on the lowest subchannel not used by a middlebox
//! nearer the client (their announcements precede the ClientHello in the stream, so the choice
//! is deterministic; the paper sends it after the ClientHello, which leaves the ids of several
//! server-side middleboxes to a race). An mbTLS server answers with a secondary ClientHello there; our TLS
//! server engine answers it, sends exporter-bound evidence as 0.5-RTT data in the same flight
//! (TLS 1.3; after the handshake in TLS 1.2) and waits for the server's key material.
//!
//! Switching without losing or skipping records (`docs/mbtls.md` §4.2): client records pass raw
//! while we have no keys, and we keep a copy of each application-data record. When the key
//! material arrives, the copies from the first one that opens under the bridge's client→server
//! keys on are replayed through the app; the server dropped their raw forms (after
//! authenticating them) up to our marker, the close_notify of our secondary session. Server
//! records after its key material are under the fresh hop's keys and go to the relay.

use std::collections::BTreeSet;

use mbx_apps::MiddleboxApp;
use mbx_engine::{OpenSslEngine, TlsEngine};
use mbx_record::{ContentType, TlsVersion};
use mbx_wire::handshake::DEFAULT_MAX_HANDSHAKE_LEN;
use mbx_wire::{version, HandshakeDeframer, HandshakeType, Record, ServerHello};

use super::demux::Piece;
use super::kept::Kept;
use super::middlebox::{first_application_record, write_evidence};
use super::wires::{self, Core, Wires};
use super::{HandshakeError, MiddleboxHandshakeConfig, MiddleboxHandshakeEvent};
use crate::hop::{Input, Side};
use crate::relay::MiddleboxRelay;
use crate::wire::{announcement_record, KeyMaterial};

/// Why a server-side middlebox goes passive when the server answers its announcement with a
/// (plaintext) alert as the first thing it sends: a legacy server refusing the unknown record
/// type. With [`ANNOUNCEMENT_REFUSED_NOT_TLS`] the only signs the driver takes for a legacy
/// server ([`legacy_refusal`]; docs/mbtls.md §4.2).
pub const ANNOUNCEMENT_REFUSED: &str = "the server did not answer the announcement";

/// Why a server-side middlebox goes passive when the first bytes the server sends after our
/// announcement are not a TLS record: a legacy server that takes a connection not starting
/// with a TLS handshake for plain HTTP (nginx answers it with a plaintext "400 Bad Request"
/// page, no alert). Remembered by the driver as [`ANNOUNCEMENT_REFUSED`] is.
pub const ANNOUNCEMENT_REFUSED_NOT_TLS: &str =
    "the server answered the announcement with bytes that are not TLS (nginx answers a connection that does not start with a TLS handshake with a plain-HTTP error page)";

/// How a legacy server refused the announcement, when `passive` (why the middlebox went
/// passive) says it did: for the report of the session it ended.
pub fn legacy_refusal(passive: &str) -> Option<&'static str> {
    match passive {
        ANNOUNCEMENT_REFUSED => Some("with an alert"),
        ANNOUNCEMENT_REFUSED_NOT_TLS => {
            Some("in plain text, not TLS (nginx sends an HTTP 400 page)")
        }
        _ => None,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Before the ClientHello went by.
    Hello,
    /// Announcement sent; no answer from the server yet.
    Announced,
    /// Our secondary session is running.
    Joined,
    /// Not taking part: forward everything raw.
    Passive,
}

/// A middlebox between the previous hop toward the client and the server.
pub struct ServerSideMiddlebox<A: MiddleboxApp> {
    cfg: MiddleboxHandshakeConfig,
    app: Option<A>,
    announce: bool,
    mode: Mode,
    client_hello: HandshakeDeframer,
    server_hello: HandshakeDeframer,
    version: Option<TlsVersion>,
    /// Subchannels announced by middleboxes nearer the client.
    used_ids: BTreeSet<u8>,
    subchannel: u8,
    engine: Option<OpenSslEngine>,
    /// The whole ClientHello went by.
    hello_done: bool,
    announced: bool,
    /// The server answered our announcement (a secondary record arrived).
    answered: bool,
    /// Something (any record) came from the server: an alert after that is not a legacy
    /// server's refusal of our announcement, which is the first thing such a server sends.
    heard_from_server: bool,
    /// The server answered our announcement in something other than TLS: what it sends is
    /// passed on as it comes, unframed.
    server_not_tls: bool,
    evidence_sent: bool,
    /// Client application-data records forwarded raw before our keys arrived.
    copies: Vec<Record>,
    kept: Kept,
    wires: Wires<A>,
}

impl<A: MiddleboxApp> ServerSideMiddlebox<A> {
    /// `announce = false` forwards everything unchanged (e.g. the server is known to be legacy).
    pub fn new(
        cfg: MiddleboxHandshakeConfig,
        app: A,
        announce: bool,
    ) -> Result<Self, HandshakeError> {
        Ok(ServerSideMiddlebox {
            cfg,
            app: Some(app),
            announce,
            mode: Mode::Hello,
            client_hello: HandshakeDeframer::new(DEFAULT_MAX_HANDSHAKE_LEN),
            server_hello: HandshakeDeframer::new(DEFAULT_MAX_HANDSHAKE_LEN),
            version: None,
            used_ids: BTreeSet::new(),
            subchannel: 0,
            engine: None,
            hello_done: false,
            announced: false,
            answered: false,
            heard_from_server: false,
            server_not_tls: false,
            evidence_sent: false,
            copies: Vec::new(),
            kept: Kept::default(),
            wires: Wires::new(Side::Client),
        })
    }

    /// Bytes from the neighbour on `from`. An error is fatal: the driver closes both
    /// connections.
    pub fn receive(&mut self, from: Side, bytes: &[u8]) -> Result<(), HandshakeError> {
        if self.passed_on_unframed(from, bytes) {
            return self.wires.check_fail_closed();
        }
        wires::receive(self, from, Input::Borrowed(bytes))
    }

    /// See [`MiddleboxHandshake::receive_lending`](super::MiddleboxHandshake::receive_lending).
    pub fn receive_lending(
        &mut self,
        from: Side,
        bytes: &mut [u8],
    ) -> Result<Option<std::ops::Range<usize>>, HandshakeError> {
        if self.passed_on_unframed(from, bytes) {
            return self.wires.check_fail_closed().map(|()| None);
        }
        wires::receive_lending(self, from, bytes)
    }

    /// Whether `bytes` from `from` went toward the other side as they are: the server's, once
    /// the first byte it sent after our announcement could not begin a TLS record (a legacy
    /// server's refusal, [`ANNOUNCEMENT_REFUSED_NOT_TLS`]). Its client fails on them as it
    /// would without us; framing them as records would only fail this middlebox with a
    /// misleading "bad record version".
    fn passed_on_unframed(&mut self, from: Side, bytes: &[u8]) -> bool {
        if from != Side::Server {
            return false;
        }
        if !self.server_not_tls {
            let refused_in_text = self.mode == Mode::Announced
                && !self.heard_from_server
                && self.wires.from_server.buffered() == 0
                // The types the demultiplexer takes (TLS's and mbTLS's).
                && bytes
                    .first()
                    .is_some_and(|&b| !crate::wire::deframer_config().accepts(ContentType(b)));
            if !refused_in_text {
                return false;
            }
            self.server_not_tls = true;
            self.heard_from_server = true;
            self.go_passive(ANNOUNCEMENT_REFUSED_NOT_TLS);
        }
        self.wires.out_client.extend_from_slice(bytes);
        true
    }

    fn client_piece(&mut self, piece: Piece) -> Result<(), HandshakeError> {
        match piece {
            Piece::Sub { enc, .. } if self.announced && enc.subchannel == self.subchannel => {
                // Our secondary session is between the server and us: a record on it from the
                // client's side is forged. Passed on it would break that session, and a server
                // that only allows us would go on without us.
                Err(HandshakeError::Protocol(
                    "a record on this middlebox's subchannel came from the client's side",
                ))
            }
            Piece::Sub { enc, raw } => {
                // Announcements (and secondary records) of middleboxes nearer the client.
                if !self.announced && !self.hello_done {
                    self.used_ids.insert(enc.subchannel);
                }
                self.wires.out_server.extend_from_slice(raw.as_bytes());
                Ok(())
            }
            Piece::Primary(rec) if !self.hello_done => {
                if self.announce && !self.announced {
                    // Nothing of the client's may reach the server before our announcement: a
                    // record the server fails on would have it alert first, which we would
                    // take for a legacy server's refusal and remember.
                    if rec.content_type() != ContentType::HANDSHAKE {
                        return Err(HandshakeError::Protocol(
                            "the client sent a record other than its ClientHello first",
                        ));
                    }
                    // Our announcement goes right before the ClientHello: the announcements of
                    // middleboxes nearer the client are then already in the stream ahead of
                    // it, so the lowest free subchannel id is known.
                    self.announce_now()?;
                }
                self.wires.out_server.extend_from_slice(rec.as_bytes());
                self.look_for_client_hello(&rec)
            }
            Piece::Primary(rec) => {
                self.wires.out_server.extend_from_slice(rec.as_bytes());
                match self.mode {
                    Mode::Announced | Mode::Joined => self.copy(rec),
                    Mode::Hello | Mode::Passive => Ok(()),
                }
            }
        }
    }

    /// Keeps a copy of a client application-data record forwarded raw: it may be application
    /// epoch, which the server drops and we replay through the app once we have keys.
    fn copy(&mut self, rec: Record) -> Result<(), HandshakeError> {
        if rec.content_type() != ContentType::APPLICATION_DATA {
            return Ok(());
        }
        self.kept.record(
            &rec,
            "too much client data before the server's key material",
        )?;
        self.copies.push(rec);
        Ok(())
    }

    fn look_for_client_hello(&mut self, rec: &Record) -> Result<(), HandshakeError> {
        if rec.content_type() != ContentType::HANDSHAKE {
            return Ok(());
        }
        self.client_hello.push(rec.payload());
        let Some(msg) = self.client_hello.next_message()? else {
            return Ok(());
        };
        if msg.typ() != HandshakeType::CLIENT_HELLO {
            return Err(HandshakeError::Protocol(
                "first client message is not a ClientHello",
            ));
        }
        self.hello_done = true;
        if !self.announce {
            // Says where the choice came from and how it ends (found in an operator trial: a
            // server upgraded to mbTLS failed every session with no pointer to why).
            self.go_passive(
                "not announcing to this server: an earlier session found it legacy, and this \
                 listener remembers that until the middlebox restarts, or for \
                 forget_legacy_after if set",
            );
        }
        Ok(())
    }

    /// Sends our MiddleboxAnnouncement toward the server on the lowest free subchannel.
    fn announce_now(&mut self) -> Result<(), HandshakeError> {
        let id = (0..=u8::MAX)
            .find(|id| !self.used_ids.contains(id))
            .ok_or(HandshakeError::Protocol("no free subchannel"))?;
        self.subchannel = id;
        self.wires
            .out_server
            .extend_from_slice(&announcement_record(id, version::TLS1_2)?);
        self.mode = Mode::Announced;
        self.announced = true;
        self.wires
            .events
            .push_back(MiddleboxHandshakeEvent::Announced { subchannel: id });
        Ok(())
    }

    fn server_piece(&mut self, piece: Piece) -> Result<(), HandshakeError> {
        let first_from_server = !std::mem::replace(&mut self.heard_from_server, true);
        match piece {
            Piece::Sub { enc, .. }
                if matches!(self.mode, Mode::Announced | Mode::Joined)
                    && enc.subchannel == self.subchannel =>
            {
                self.secondary_in(&enc.inner)
            }
            Piece::Sub { raw, .. } => {
                self.wires.out_client.extend_from_slice(raw.as_bytes());
                Ok(())
            }
            Piece::Primary(rec) => {
                if self.version.is_none() && rec.content_type() == ContentType::HANDSHAKE {
                    self.look_for_server_hello(&rec)?;
                }
                if self.mode == Mode::Announced
                    && first_from_server
                    && rec.content_type() == ContentType::ALERT
                {
                    // A legacy server refuses the unknown record type; the driver remembers it.
                    self.go_passive(ANNOUNCEMENT_REFUSED);
                } else {
                    // An mbTLS server's refusal (a version, evidence): the report says it.
                    self.wires.note_server_alert(&rec);
                }
                self.wires.out_client.extend_from_slice(rec.as_bytes());
                Ok(())
            }
        }
    }

    fn look_for_server_hello(&mut self, rec: &Record) -> Result<(), HandshakeError> {
        self.server_hello.push(rec.payload());
        let Some(msg) = self.server_hello.next_message()? else {
            return Ok(());
        };
        if msg.typ() != HandshakeType::SERVER_HELLO {
            return Err(HandshakeError::Protocol(
                "first server message is not a ServerHello",
            ));
        }
        let sh = ServerHello::parse_message(msg.as_bytes())?;
        self.version = match sh.selected_version() {
            Ok(version::TLS1_3) => Some(TlsVersion::Tls13),
            Ok(version::TLS1_2) => Some(TlsVersion::Tls12),
            _ => {
                self.go_passive("primary version is neither TLS 1.2 nor TLS 1.3");
                return Ok(());
            }
        };
        if sh.is_hello_retry_request() {
            // The version is right, but a real ServerHello follows: read it too.
            self.version = None;
            self.server_hello = HandshakeDeframer::new(DEFAULT_MAX_HANDSHAKE_LEN);
        }
        Ok(())
    }

    /// A record of our secondary session from the server (TLS client toward us).
    fn secondary_in(&mut self, inner: &Record) -> Result<(), HandshakeError> {
        if self.engine.is_none() {
            let engine =
                wires::secondary_server_engine(&self.cfg).map_err(HandshakeError::Config)?;
            self.engine = Some(engine);
            self.answered = true;
            self.mode = Mode::Joined;
            self.wires
                .events
                .push_back(MiddleboxHandshakeEvent::Joined {
                    subchannel: self.subchannel,
                });
        }
        let Some(engine) = self.engine.as_mut() else {
            return Err(HandshakeError::Protocol("no secondary session"));
        };
        engine.feed(inner.as_bytes());
        let processed = engine.process();
        if processed.is_ok() && !self.evidence_sent {
            // TLS 1.3: our Finished is out with our first flight, the evidence rides it as
            // 0.5-RTT data; TLS 1.2: it follows our Finished once the handshake is done.
            let ready = engine.can_write_half_rtt() || !engine.is_handshaking();
            if ready {
                write_evidence(&self.cfg, engine)?;
                self.evidence_sent = true;
                wires::evidence_sent(&mut self.wires.events, engine.session_reused());
            }
        }
        self.wires.send_to_endpoint(self.subchannel, engine)?;
        if let Err(e) = processed {
            // The server refused us (certificate, approval): no keys, ciphertext only.
            self.go_passive(wires::why_secondary_failed(&e, Side::Server));
            return Ok(());
        }
        if engine.is_handshaking() {
            return Ok(());
        }
        match wires::endpoint_turn(&mut self.wires, engine, Side::Server)? {
            wires::EndpointTurn::Keys(km, path) => self.install(*km, path),
            wires::EndpointTurn::Closed(why) => {
                self.go_passive(why);
                Ok(())
            }
            wires::EndpointTurn::Waiting => Ok(()),
        }
    }

    /// Stop taking part and forward everything unchanged from now on (nothing is held).
    /// Failing closed ([`MiddleboxHandshakeConfig::fail_closed`]), the session ends once this
    /// piece is done.
    fn go_passive(&mut self, why: &'static str) {
        self.mode = Mode::Passive;
        self.engine = None;
        self.copies.clear();
        if self.cfg.fail_closed {
            self.wires.fail_closed = Some(why);
        }
        self.wires
            .events
            .push_back(MiddleboxHandshakeEvent::Passive(why));
    }

    /// `path`: the endpoint's path message (a farther middlebox joined too; a ticket is
    /// wanted).
    fn install(&mut self, km: KeyMaterial, path: wires::PathNews) -> Result<(), HandshakeError> {
        let far_joined = path.far;
        let version = self.version.ok_or(HandshakeError::Protocol(
            "key material before the ServerHello",
        ))?;
        if km.version != version {
            return Err(HandshakeError::Protocol(
                "key material for another TLS version",
            ));
        }
        let app = self
            .app
            .take()
            .ok_or(HandshakeError::Protocol("key material twice"))?;
        // Raw-forwarded client records from the first that opens under the bridge keys on are
        // application epoch: the server dropped them, they go through the app now.
        let first = first_application_record(version, &km.toward_client.c2s, &self.copies);
        let mut replay: Vec<Record> = self.copies.drain(..).skip(first).collect();
        if far_joined {
            replay.clear();
            self.wires.awaiting_neighbour_marker = true;
        }
        let relay = MiddleboxRelay::new(km, app)?;
        // The marker: everything we send the server after it is under the fresh hop's keys.
        if let Some(engine) = self.engine.as_mut() {
            let ticket = path.ticket && self.cfg.session_tickets;
            self.wires.send_marker(self.subchannel, engine, ticket)?;
        }
        self.engine = None;
        self.wires.start_relay(relay, Side::Client, &replay);
        Ok(())
    }

    pub fn take_outgoing(&mut self, to: Side) -> Vec<u8> {
        self.wires.take_outgoing(to)
    }

    /// Appends what is to be sent to the neighbour on `to` to `dst` (swapping buffers when
    /// `dst` is empty).
    pub fn append_outgoing(&mut self, to: Side, dst: &mut Vec<u8>) {
        self.wires.append_outgoing(to, dst);
    }

    pub fn poll_event(&mut self) -> Option<MiddleboxHandshakeEvent> {
        self.wires.events.pop_front()
    }

    /// True when the middlebox does not take part and forwards bytes unchanged.
    pub fn is_passive(&self) -> bool {
        self.mode == Mode::Passive
    }

    /// True while the driver should not read from `from`: the client's records copied for the
    /// keys reached [`PAUSE_READING_AT`](super::PAUSE_READING_AT) and the keys (from the
    /// server's side) have not come. Reading resumes with them.
    pub fn waits_before_reading(&self, from: Side) -> bool {
        from == Side::Client && !self.keys_installed() && self.kept.asks_for_a_pause()
    }

    /// Gives back memory kept for traffic that is over, for a driver to call on an idle
    /// connection; nothing queued or buffered is lost.
    pub fn release_idle_buffers(&mut self) {
        self.wires.release_idle_buffers();
    }

    /// What the handshake waits for, in words, for the error of a handshake that timed out;
    /// `None` once the keys are in or the middlebox stands aside.
    pub fn waiting_for(&self) -> Option<&'static str> {
        match self.mode {
            Mode::Passive => None,
            _ if self.keys_installed() => None,
            Mode::Hello => Some("the client's ClientHello"),
            Mode::Announced => Some("the server's answer to our announcement"),
            Mode::Joined if self.engine.as_ref().is_some_and(|e| e.is_handshaking()) => {
                Some("the server to finish our secondary handshake")
            }
            Mode::Joined => Some("the server's key material"),
        }
    }

    /// True once key material arrived and the data phase runs.
    pub fn keys_installed(&self) -> bool {
        self.wires.relay.is_some()
    }

    /// The data phase, once keys are installed.
    pub fn relay(&self) -> Option<&MiddleboxRelay<A>> {
        self.wires.relay.as_ref()
    }

    /// The fatal alert the server sent in the clear before this middlebox's keys (and that
    /// it passed on), if any: why a handshake the server then closed ended.
    pub fn server_alert_passed_on(&self) -> Option<u8> {
        self.wires.server_alert
    }

    /// We announced ourselves and the server never answered on our subchannel (a legacy
    /// server, if the session then failed).
    pub fn announcement_unanswered(&self) -> bool {
        self.announced && !self.answered
    }
}

impl<A: MiddleboxApp> Core<A> for ServerSideMiddlebox<A> {
    fn wires(&mut self) -> &mut Wires<A> {
        &mut self.wires
    }

    fn piece(&mut self, from: Side, piece: Piece) -> Result<(), HandshakeError> {
        match from {
            Side::Client => self.client_piece(piece),
            Side::Server => self.server_piece(piece),
        }
    }
}
