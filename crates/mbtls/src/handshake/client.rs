//! The client's handshake with one client-side middlebox (sans-I/O): pre-configured (must join)
//! or discovered on the path (joins only if the application approves it).
//!
//! The primary handshake runs in a real OpenSSL client engine (paused right after the
//! handshake); the secondary handshake with the middlebox runs in an independent OpenSSL client
//! engine whose ClientHello travels inside the MiddleboxSupport extension. Key material is sent
//! only after the middlebox's certificate (engine), the application's approval (discovered
//! middleboxes) and its exporter-bound evidence (policy) were all checked and the primary
//! handshake finished. A discovered middlebox that fails any check is excluded: the client
//! closes the secondary session without key material, the middlebox falls back to forwarding
//! ciphertext it cannot read, and the session continues on the primary keys.

use std::collections::VecDeque;
use std::sync::Arc;

use mbx_attest::{
    report_data, spki_from_certificate, verify_bytes, Claims, Policy, EXPORTER_LABEL, EXPORTER_LEN,
};
use mbx_engine::{Handoff, OpenSslContext, OpenSslEngine, Role, TlsEngine};
use mbx_wire::version;

use super::demux::{Demux, Piece};
use super::HandshakeError;
use crate::endpoint::{EndpointDataPhase, EndpointEvent};
use crate::keys::{client_side_keys, HopKeys};
use crate::wire::{
    Encapsulated, MiddleboxSupport, SecondaryMessage, SecondaryReader, MIDDLEBOX_SUPPORT_EXTENSION,
};

/// Decides whether a discovered middlebox may join, from its verified certificate chain (DER,
/// leaf first). Called once, after its secondary handshake and before its evidence is checked.
pub type Approver = Arc<dyn Fn(&[Vec<u8>]) -> bool + Send + Sync>;

/// Which middlebox the client expects.
#[derive(Clone)]
pub enum ClientMiddlebox {
    /// Configured a priori: must join, and its certificate must be valid for this name (sent in
    /// the extension's middlebox list).
    Preconfigured(String),
    /// Any on-path middlebox may offer to join; its chain must verify against the secondary
    /// context's roots and the approver must accept it.
    Discover(Approver),
}

/// The client's configuration for one client-side middlebox.
#[derive(Clone)]
pub struct ClientHandshakeConfig {
    /// Primary context: must register [`MIDDLEBOX_SUPPORT_EXTENSION`] as a custom extension and
    /// set `pause_after_handshake` (so no application record is consumed before the export).
    pub primary: Arc<OpenSslContext>,
    /// The server's name (SNI, certificate check).
    pub server_name: String,
    /// Context for the secondary session (trust roots for middlebox certificates).
    pub secondary: Arc<OpenSslContext>,
    pub middlebox: ClientMiddlebox,
    /// Attestation policy for the middlebox.
    pub policy: Policy,
    /// Current time for evidence verification (seconds since the Unix epoch).
    pub now_unix: u64,
}

/// Progress reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientHandshakeEvent {
    /// The middlebox's evidence passed the policy (`None`: no evidence, and none required).
    MiddleboxVerified(Option<Claims>),
    /// A discovered middlebox was excluded (not approved, bad certificate, evidence refused);
    /// it never receives key material.
    MiddleboxExcluded(&'static str),
    /// Key material was sent; data may be written.
    KeysSent,
    /// No middlebox takes part: the session runs on the primary keys.
    Direct,
    /// Received data is readable (the middlebox switched, or there is none).
    Ready,
    /// An event of the data phase.
    Data(EndpointEvent),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Secondary {
    /// Nothing from the middlebox yet.
    Waiting,
    Running,
    /// Certificate, approval and evidence passed.
    Verified,
    /// Excluded (discovered mode only): the secondary session is closed or failed.
    Excluded,
}

/// A client whose path has (at most) one client-side middlebox.
pub struct ClientHandshake {
    cfg: ClientHandshakeConfig,
    primary: Option<OpenSslEngine>,
    secondary: OpenSslEngine,
    secondary_state: Secondary,
    secondary_rx: SecondaryReader,
    demux: Demux,
    out: Vec<u8>,
    data: Option<EndpointDataPhase>,
    /// Waiting for the middlebox's marker; primary-key records meanwhile are dropped (the
    /// middlebox re-sends them through its app).
    marker_seen: bool,
    pending_writes: Vec<u8>,
    /// Primary-key records dropped while waiting for the marker.
    discarded: usize,
    /// Authenticates those records under the bridge keys before dropping them: the middlebox
    /// re-sends their content through its app, but a forged or altered record is still fatal
    /// (fail closed), never silently ignored.
    pre_marker: Option<mbx_record::RecordOpener>,
    failed: bool,
    summary: Option<SessionSummary>,
    events: VecDeque<ClientHandshakeEvent>,
}

/// Fingerprints (`TrafficKeys::fingerprint`) of one hop's keys: they identify the keys in logs
/// and user output without revealing them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HopFingerprint {
    pub c2s: [u8; 8],
    pub s2c: [u8; 8],
}

impl HopFingerprint {
    fn of(hop: &HopKeys) -> Self {
        HopFingerprint {
            c2s: hop.c2s.keys.fingerprint(),
            s2c: hop.s2c.keys.fingerprint(),
        }
    }
}

/// What the client knows once its data phase started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionSummary {
    /// The primary session's version and suite (every hop uses them).
    pub version: mbx_record::TlsVersion,
    pub suite: mbx_record::CipherSuite,
    /// Every hop the client knows keys for, in path order from the client: with a middlebox,
    /// client↔middlebox (fresh) then middlebox↔server (the bridge = primary session keys);
    /// without, only the bridge.
    pub hops: Vec<HopFingerprint>,
    /// True when a middlebox received key material.
    pub middlebox_joined: bool,
}

/// The only subchannel used with one client-side middlebox.
const SUBCHANNEL: u8 = 0;

impl ClientHandshake {
    /// Starts the handshake; the first flight is in [`take_outgoing`](Self::take_outgoing).
    pub fn new(cfg: ClientHandshakeConfig) -> Result<Self, HandshakeError> {
        let (mut secondary, listed) = match &cfg.middlebox {
            ClientMiddlebox::Preconfigured(name) => {
                (cfg.secondary.engine_for(Some(name))?, vec![name.clone()])
            }
            ClientMiddlebox::Discover(_) => (cfg.secondary.engine_for(None)?, Vec::new()),
        };
        let hello = secondary.take_client_hello()?;
        let ext = MiddleboxSupport {
            client_hellos: vec![hello],
            middleboxes: listed,
        }
        .encode()?;
        let mut primary = cfg.primary.engine_for(Some(&cfg.server_name))?;
        primary.set_extension_payload(MIDDLEBOX_SUPPORT_EXTENSION, ext)?;
        primary.process()?;
        let out = primary.take_outgoing();
        Ok(ClientHandshake {
            cfg,
            primary: Some(primary),
            secondary,
            secondary_state: Secondary::Waiting,
            secondary_rx: SecondaryReader::new(),
            demux: Demux::new(),
            out,
            data: None,
            marker_seen: false,
            pending_writes: Vec::new(),
            discarded: 0,
            pre_marker: None,
            failed: false,
            summary: None,
            events: VecDeque::new(),
        })
    }

    /// Drops one raw primary-key record that arrived before the middlebox's switch marker, after
    /// checking it authenticates under the bridge keys at the next sequence number.
    fn drop_authenticated(&mut self, record: &[u8]) -> Result<(), HandshakeError> {
        let opener = self
            .pre_marker
            .as_mut()
            .ok_or(HandshakeError::Protocol("record before the export"))?;
        opener.open(record).map_err(|_| {
            HandshakeError::Protocol("a record before the middlebox's switch failed authentication")
        })?;
        self.discarded += 1;
        Ok(())
    }

    fn preconfigured(&self) -> bool {
        matches!(self.cfg.middlebox, ClientMiddlebox::Preconfigured(_))
    }

    /// Bytes from the next hop. Errors are fatal and no key material is sent afterwards.
    pub fn receive(&mut self, bytes: &[u8]) -> Result<(), HandshakeError> {
        if self.failed {
            return Err(HandshakeError::Protocol("client handshake already failed"));
        }
        let r = self.receive_inner(bytes);
        if r.is_err() {
            self.failed = true;
        }
        r
    }

    fn receive_inner(&mut self, bytes: &[u8]) -> Result<(), HandshakeError> {
        self.demux.push(bytes);
        while let Some(piece) = self.demux.next_piece()? {
            match piece {
                Piece::Sub { enc, .. } if enc.subchannel == SUBCHANNEL => {
                    if self.secondary_state != Secondary::Excluded {
                        self.secondary_in(&enc)?
                    }
                }
                Piece::Sub { .. } => {
                    return Err(HandshakeError::Protocol("record on an unknown subchannel"))
                }
                Piece::Primary(rec) => match (&mut self.data, self.marker_seen) {
                    (Some(data), true) => {
                        data.receive(rec.as_bytes());
                        self.data_events();
                    }
                    // Exported, before the marker: raw primary-key records the middlebox re-sends.
                    (Some(_), false) => self.drop_authenticated(rec.as_bytes())?,
                    (None, _) => {
                        let primary = self
                            .primary
                            .as_mut()
                            .ok_or(HandshakeError::Protocol("primary engine gone"))?;
                        primary.feed(rec.as_bytes());
                        primary.process()?;
                        self.out.extend_from_slice(&primary.take_outgoing());
                        // A middlebox's secondary ServerHello comes before the primary one, so
                        // by the end of the primary handshake one that has not spoken is absent.
                        if !primary.is_handshaking() && self.secondary_state == Secondary::Waiting {
                            if self.preconfigured() {
                                return Err(HandshakeError::Protocol(
                                    "the pre-configured middlebox did not join",
                                ));
                            }
                            self.secondary_state = Secondary::Excluded;
                        }
                    }
                },
            }
            self.maybe_finish()?;
        }
        Ok(())
    }

    fn data_events(&mut self) {
        if let Some(data) = self.data.as_mut() {
            while let Some(ev) = data.poll_event() {
                self.events.push_back(ClientHandshakeEvent::Data(ev));
            }
        }
    }

    /// A discovered middlebox failed a check: close the secondary session without key material
    /// (the middlebox then forwards ciphertext only). A pre-configured one fails the handshake.
    fn exclude(&mut self, why: &'static str, err: HandshakeError) -> Result<(), HandshakeError> {
        if self.preconfigured() {
            return Err(err);
        }
        // Best effort: a failed engine may have queued an alert instead of a close_notify.
        let _ = self.secondary.close();
        let out = self.secondary.take_outgoing();
        Encapsulated::wrap_stream(SUBCHANNEL, &out, version::TLS1_2, &mut self.out)?;
        self.secondary_state = Secondary::Excluded;
        self.events
            .push_back(ClientHandshakeEvent::MiddleboxExcluded(why));
        Ok(())
    }

    fn secondary_in(&mut self, enc: &Encapsulated) -> Result<(), HandshakeError> {
        if self.secondary_state == Secondary::Waiting {
            self.secondary_state = Secondary::Running;
        }
        self.secondary.feed(enc.inner.as_bytes());
        let processed = self.secondary.process();
        let out = self.secondary.take_outgoing();
        if self.data.is_none() {
            Encapsulated::wrap_stream(SUBCHANNEL, &out, version::TLS1_2, &mut self.out)?;
        }
        if let Err(e) = processed {
            return self.exclude("secondary handshake failed", e.into());
        }
        if self.secondary.is_handshaking() {
            return Ok(());
        }
        if self.secondary_state == Secondary::Running {
            if let ClientMiddlebox::Discover(approve) = &self.cfg.middlebox {
                if !approve(&self.secondary.peer_certificates()) {
                    return self.exclude(
                        "not approved by the application",
                        HandshakeError::Protocol("middlebox not approved"),
                    );
                }
            }
        }
        let plain = self.secondary.take_plaintext();
        self.secondary_rx.push(&plain);
        while let Some(msg) = self.secondary_rx.next_message()? {
            match msg {
                SecondaryMessage::Evidence(e) if self.secondary_state == Secondary::Running => {
                    if let Err(err) = self.verify(&e) {
                        return self.exclude("evidence refused", err);
                    }
                }
                _ => return Err(HandshakeError::Protocol("unexpected secondary message")),
            }
        }
        if self.data.is_some() && self.secondary.peer_closed() && !self.marker_seen {
            self.marker_seen = true;
            self.events.push_back(ClientHandshakeEvent::Ready);
        }
        Ok(())
    }

    /// Exporter-bound evidence of this secondary session, checked against the policy.
    fn verify(&mut self, evidence: &[u8]) -> Result<(), HandshakeError> {
        let label = core::str::from_utf8(EXPORTER_LABEL)
            .map_err(|_| HandshakeError::Config("exporter label"))?;
        let binder = self
            .secondary
            .export_keying_material(label, None, EXPORTER_LEN)?;
        let certs = self.secondary.peer_certificates();
        let leaf = certs
            .first()
            .ok_or(HandshakeError::Protocol("middlebox sent no certificate"))?;
        let spki = spki_from_certificate(leaf)?;
        let expected = report_data(&spki, &binder);
        let claims = if evidence.is_empty() {
            self.cfg.policy.check_missing_evidence()?;
            None
        } else {
            Some(verify_bytes(
                evidence,
                &expected,
                &self.cfg.policy,
                self.cfg.now_unix,
            )?)
        };
        self.secondary_state = Secondary::Verified;
        self.events
            .push_back(ClientHandshakeEvent::MiddleboxVerified(claims));
        Ok(())
    }

    /// Once the primary handshake is done and the middlebox is verified (or excluded): export
    /// the primary session and start the data phase.
    fn maybe_finish(&mut self) -> Result<(), HandshakeError> {
        let primary_done = self.primary.as_ref().is_some_and(|p| !p.is_handshaking());
        let middlebox_settled = match self.secondary_state {
            Secondary::Verified => !self.secondary.is_handshaking(),
            Secondary::Excluded => true,
            Secondary::Waiting | Secondary::Running => false,
        };
        if self.data.is_some() || !primary_done || !middlebox_settled {
            return Ok(());
        }
        let primary = self
            .primary
            .take()
            .ok_or(HandshakeError::Protocol("primary engine gone"))?;
        let handoff = primary.export_session()?;
        self.out.extend_from_slice(&handoff.pending_outgoing);
        if self.secondary_state == Secondary::Excluded {
            return self.direct(handoff);
        }
        // Records the engine did not process are application epoch under the primary keys: the
        // middlebox re-sends them through its app after the marker, so they are dropped here,
        // once authenticated.
        let session = handoff.session;
        self.pre_marker = Some(mbx_record::RecordOpener::new(
            session.version,
            session.rx.keys.clone(),
            session.rx.next_seq,
        ));
        for rec in split_records(&handoff.unprocessed_incoming) {
            self.drop_authenticated(rec)?;
        }
        let bridge = HopKeys::from_export(Role::Client, &session);
        let bridge_fp = HopFingerprint::of(&bridge);
        let side = client_side_keys(session.version, session.suite, bridge, 1)?;
        self.summary = Some(SessionSummary {
            version: session.version,
            suite: session.suite,
            hops: vec![HopFingerprint::of(&side.endpoint), bridge_fp],
            middlebox_joined: true,
        });
        let [km] = <[_; 1]>::try_from(side.middleboxes)
            .map_err(|_| HandshakeError::Protocol("one middlebox expected"))?;
        let msg = SecondaryMessage::KeyMaterial(Box::new(km)).encode()?;
        self.secondary.write_plaintext(&msg)?;
        let out = self.secondary.take_outgoing();
        Encapsulated::wrap_stream(SUBCHANNEL, &out, version::TLS1_2, &mut self.out)?;
        self.start_data(EndpointDataPhase::new(
            Role::Client,
            session.version,
            side.endpoint,
        ))?;
        self.events.push_back(ClientHandshakeEvent::KeysSent);
        Ok(())
    }

    /// No middlebox: the primary session's keys protect the client's hop; records the engine
    /// left unprocessed are the first data.
    fn direct(&mut self, handoff: Handoff) -> Result<(), HandshakeError> {
        let Handoff {
            session,
            unprocessed_incoming,
            pending_plaintext,
            ..
        } = handoff;
        let bridge = HopKeys::from_export(Role::Client, &session);
        self.summary = Some(SessionSummary {
            version: session.version,
            suite: session.suite,
            hops: vec![HopFingerprint::of(&bridge)],
            middlebox_joined: false,
        });
        let mut data = EndpointDataPhase::new(Role::Client, session.version, bridge);
        data.receive(&unprocessed_incoming);
        self.start_data(data)?;
        if let Some(d) = self.data.as_mut() {
            d.inject_plaintext(&pending_plaintext);
        }
        self.marker_seen = true;
        self.events.push_back(ClientHandshakeEvent::Direct);
        self.events.push_back(ClientHandshakeEvent::Ready);
        self.data_events();
        Ok(())
    }

    fn start_data(&mut self, mut data: EndpointDataPhase) -> Result<(), HandshakeError> {
        let pending = core::mem::take(&mut self.pending_writes);
        if !pending.is_empty() {
            data.write(&pending)?;
        }
        self.data = Some(data);
        Ok(())
    }

    /// Application data for the server; held until the data phase starts.
    pub fn write(&mut self, data: &[u8]) -> Result<(), HandshakeError> {
        match self.data.as_mut() {
            Some(d) => Ok(d.write(data)?),
            None => {
                self.pending_writes.extend_from_slice(data);
                Ok(())
            }
        }
    }

    /// Ends our direction with close_notify (data phase only).
    pub fn close(&mut self) -> Result<(), HandshakeError> {
        match self.data.as_mut() {
            Some(d) => Ok(d.close()?),
            None => Err(HandshakeError::Protocol("close before the data phase")),
        }
    }

    /// Version, suite and hop key fingerprints, once the data phase started.
    pub fn summary(&self) -> Option<&SessionSummary> {
        self.summary.as_ref()
    }

    /// Ciphertext for the next hop, in order.
    pub fn take_outgoing(&mut self) -> Vec<u8> {
        let mut out = core::mem::take(&mut self.out);
        if let Some(d) = self.data.as_mut() {
            out.extend_from_slice(&d.take_outgoing());
        }
        out
    }

    /// Application data received (once ready).
    pub fn take_plaintext(&mut self) -> Vec<u8> {
        self.data
            .as_mut()
            .map(EndpointDataPhase::take_plaintext)
            .unwrap_or_default()
    }

    pub fn poll_event(&mut self) -> Option<ClientHandshakeEvent> {
        self.events.pop_front()
    }

    /// True once key material was sent to the middlebox.
    pub fn keys_sent(&self) -> bool {
        self.data.is_some() && self.secondary_state == Secondary::Verified
    }

    /// True once the data phase started (with or without a middlebox).
    pub fn data_phase_started(&self) -> bool {
        self.data.is_some()
    }

    /// Primary-key records dropped because the middlebox re-sends them (0 when it held them).
    pub fn discarded_records(&self) -> usize {
        self.discarded
    }

    pub fn is_ready(&self) -> bool {
        self.marker_seen
    }
}

/// Whole records at the start of `stream` (a partial one at the end is not counted).
/// The whole records at the start of `stream` (the engine hands back whole records only).
fn split_records(stream: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut rest = stream;
    while let Ok(h) = mbx_wire::RecordHeader::parse(rest) {
        let total = mbx_wire::record::HEADER_LEN + usize::from(h.length);
        match (rest.get(..total), rest.get(total..)) {
            (Some(rec), Some(r)) => {
                out.push(rec);
                rest = r;
            }
            _ => break,
        }
    }
    out
}
