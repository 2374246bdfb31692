//! What the client and the server do alike with the middlebox on their side (sans-I/O): run the
//! secondary TLS session on its subchannel, check the middlebox (certificate by the engine,
//! approval, exporter-bound evidence), export the primary session once its handshake is done,
//! send the middlebox its key material, drop the primary-key records it re-sends up to its
//! switch marker, and run the endpoint's data phase. Only the primary engine's role and the
//! side of the path the keys are made for differ ([`ClientHandshake`](super::ClientHandshake),
//! [`ServerHandshake`](super::ServerHandshake)).

use std::collections::VecDeque;

use mbx_attest::{
    report_data, spki_from_certificate, verify_bytes, Claims, Policy, EXPORTER_LABEL, EXPORTER_LEN,
};
use mbx_engine::{Handoff, OpenSslEngine, Role, TlsEngine};
use mbx_wire::{version, Record};

use super::HandshakeError;
use crate::endpoint::{EndpointDataPhase, EndpointEvent};
use crate::keys::{client_side_keys, server_side_keys, HopKeys};
use crate::wire::{Encapsulated, SecondaryMessage, SecondaryReader};

/// Decides whether a discovered middlebox may join, from its verified certificate chain (DER,
/// leaf first). Called once, after its secondary handshake and before its evidence is checked.
pub type Approver = std::sync::Arc<dyn Fn(&[Vec<u8>]) -> bool + Send + Sync>;

/// Progress reports of an endpoint (client or server).
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

/// The server's events are the client's.
pub type ServerHandshakeEvent = ClientHandshakeEvent;

/// Fingerprints (`TrafficKeys::fingerprint`) of one hop's keys: they identify the keys in logs
/// and user output without revealing them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HopFingerprint {
    pub c2s: [u8; 8],
    pub s2c: [u8; 8],
}

impl HopFingerprint {
    pub(super) fn of(hop: &HopKeys) -> Self {
        HopFingerprint {
            c2s: hop.c2s.keys.fingerprint(),
            s2c: hop.s2c.keys.fingerprint(),
        }
    }
}

/// What an endpoint knows once its data phase started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionSummary {
    /// The primary session's version and suite (every hop uses them).
    pub version: mbx_record::TlsVersion,
    pub suite: mbx_record::CipherSuite,
    /// Every hop the endpoint knows keys for, in path order from the client. Client with a
    /// middlebox: client↔middlebox (fresh), middlebox↔next (the bridge = primary session keys);
    /// server with a middlebox: previous↔middlebox (the bridge), middlebox↔server (fresh);
    /// without one, only the bridge.
    pub hops: Vec<HopFingerprint>,
    /// True when a middlebox received key material.
    pub middlebox_joined: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Secondary {
    /// Nothing from (or to) the middlebox yet.
    Waiting,
    Running,
    /// Certificate, approval and evidence passed.
    Verified,
    /// Excluded (discovered mode only): the secondary session is closed or failed.
    Excluded,
}

/// The state both endpoints share.
pub(super) struct EndpointCore {
    role: Role,
    policy: Policy,
    now_unix: u64,
    /// `None`: pre-configured (must join; the engine checks its name).
    approver: Option<Approver>,
    pub(super) primary: Option<OpenSslEngine>,
    pub(super) secondary: Option<OpenSslEngine>,
    pub(super) subchannel: u8,
    pub(super) state: Secondary,
    secondary_rx: SecondaryReader,
    pub(super) out: Vec<u8>,
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
    pub(super) events: VecDeque<ClientHandshakeEvent>,
}

impl EndpointCore {
    pub(super) fn new(
        role: Role,
        policy: Policy,
        now_unix: u64,
        approver: Option<Approver>,
        primary: OpenSslEngine,
        secondary: Option<OpenSslEngine>,
    ) -> Self {
        EndpointCore {
            role,
            policy,
            now_unix,
            approver,
            primary: Some(primary),
            secondary,
            subchannel: 0,
            state: Secondary::Waiting,
            secondary_rx: SecondaryReader::new(),
            out: Vec::new(),
            data: None,
            marker_seen: false,
            pending_writes: Vec::new(),
            discarded: 0,
            pre_marker: None,
            failed: false,
            summary: None,
            events: VecDeque::new(),
        }
    }

    fn preconfigured(&self) -> bool {
        self.approver.is_none()
    }

    /// Runs `f` unless the core already failed; a failure is sticky.
    pub(super) fn guarded(
        &mut self,
        f: impl FnOnce(&mut Self) -> Result<(), HandshakeError>,
    ) -> Result<(), HandshakeError> {
        if self.failed {
            return Err(HandshakeError::Protocol("handshake already failed"));
        }
        let r = f(self);
        if r.is_err() {
            self.failed = true;
        }
        r
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

    /// A record of the primary stream: handshake, dropped re-sent record, or data.
    pub(super) fn primary_record(&mut self, rec: &Record) -> Result<(), HandshakeError> {
        match (&mut self.data, self.marker_seen) {
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
                // A middlebox speaks before the primary handshake can end (client side: its
                // ServerHello precedes the primary one; server side: its announcement follows
                // the ClientHello), so one that has not spoken by then is absent.
                if !primary.is_handshaking() && self.state == Secondary::Waiting {
                    if self.preconfigured() {
                        return Err(HandshakeError::Protocol(
                            "the pre-configured middlebox did not join",
                        ));
                    }
                    self.state = Secondary::Excluded;
                }
            }
        }
        self.maybe_finish()
    }

    fn data_events(&mut self) {
        if let Some(data) = self.data.as_mut() {
            while let Some(ev) = data.poll_event() {
                self.events.push_back(ClientHandshakeEvent::Data(ev));
            }
        }
    }

    /// Wraps what the secondary engine produced for our subchannel (nothing once the data phase
    /// runs: the middlebox would take any later encapsulated record as an attack).
    pub(super) fn flush_secondary(&mut self) -> Result<(), HandshakeError> {
        let Some(engine) = self.secondary.as_mut() else {
            return Ok(());
        };
        let out = engine.take_outgoing();
        if self.data.is_none() {
            Encapsulated::wrap_stream(self.subchannel, &out, version::TLS1_2, &mut self.out)?;
        }
        Ok(())
    }

    /// A discovered middlebox failed a check: close the secondary session without key material
    /// (the middlebox then forwards ciphertext only). A pre-configured one fails the handshake.
    fn exclude(&mut self, why: &'static str, err: HandshakeError) -> Result<(), HandshakeError> {
        if self.preconfigured() {
            return Err(err);
        }
        if let Some(engine) = self.secondary.as_mut() {
            // Best effort: a failed engine may have queued an alert instead of a close_notify.
            let _ = engine.close();
        }
        self.flush_secondary()?;
        self.state = Secondary::Excluded;
        self.events
            .push_back(ClientHandshakeEvent::MiddleboxExcluded(why));
        self.maybe_finish()
    }

    /// An inner record of our subchannel for the secondary engine.
    pub(super) fn secondary_in(&mut self, enc: &Encapsulated) -> Result<(), HandshakeError> {
        if self.state == Secondary::Excluded {
            return Ok(());
        }
        if self.state == Secondary::Waiting {
            self.state = Secondary::Running;
        }
        let engine = self.secondary.as_mut().ok_or(HandshakeError::Protocol(
            "subchannel record before the secondary session",
        ))?;
        engine.feed(enc.inner.as_bytes());
        let processed = engine.process();
        let handshaking = engine.is_handshaking();
        self.flush_secondary()?;
        if let Err(e) = processed {
            return self.exclude("secondary handshake failed", e.into());
        }
        if handshaking {
            return Ok(());
        }
        if self.state == Secondary::Running {
            if let Some(approve) = &self.approver {
                let chain = self
                    .secondary
                    .as_ref()
                    .map(TlsEngine::peer_certificates)
                    .unwrap_or_default();
                if !approve(&chain) {
                    return self.exclude(
                        "not approved by the application",
                        HandshakeError::Protocol("middlebox not approved"),
                    );
                }
            }
        }
        let plain = self
            .secondary
            .as_mut()
            .map(TlsEngine::take_plaintext)
            .unwrap_or_default();
        self.secondary_rx.push(&plain);
        while let Some(msg) = self.secondary_rx.next_message()? {
            match msg {
                SecondaryMessage::Evidence(e) if self.state == Secondary::Running => {
                    if let Err(err) = self.verify(&e) {
                        return self.exclude("evidence refused", err);
                    }
                }
                _ => return Err(HandshakeError::Protocol("unexpected secondary message")),
            }
        }
        let peer_closed = self.secondary.as_ref().is_some_and(TlsEngine::peer_closed);
        if self.data.is_some() && peer_closed && !self.marker_seen {
            self.marker_seen = true;
            self.events.push_back(ClientHandshakeEvent::Ready);
        }
        self.maybe_finish()
    }

    /// Exporter-bound evidence of this secondary session, checked against the policy.
    fn verify(&mut self, evidence: &[u8]) -> Result<(), HandshakeError> {
        let engine = self
            .secondary
            .as_ref()
            .ok_or(HandshakeError::Protocol("no secondary session"))?;
        let label = core::str::from_utf8(EXPORTER_LABEL)
            .map_err(|_| HandshakeError::Config("exporter label"))?;
        let binder = engine.export_keying_material(label, None, EXPORTER_LEN)?;
        let certs = engine.peer_certificates();
        let leaf = certs
            .first()
            .ok_or(HandshakeError::Protocol("middlebox sent no certificate"))?;
        let spki = spki_from_certificate(leaf)?;
        let expected = report_data(&spki, &binder);
        let claims = if evidence.is_empty() {
            self.policy.check_missing_evidence()?;
            None
        } else {
            Some(verify_bytes(
                evidence,
                &expected,
                &self.policy,
                self.now_unix,
            )?)
        };
        self.state = Secondary::Verified;
        self.events
            .push_back(ClientHandshakeEvent::MiddleboxVerified(claims));
        Ok(())
    }

    /// Once the primary handshake is done and the middlebox is verified (or excluded, or
    /// absent): export the primary session and start the data phase.
    fn maybe_finish(&mut self) -> Result<(), HandshakeError> {
        let primary_done = self.primary.as_ref().is_some_and(|p| !p.is_handshaking());
        let middlebox_settled = match self.state {
            Secondary::Verified => self.secondary.as_ref().is_some_and(|s| !s.is_handshaking()),
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
        if self.state == Secondary::Excluded {
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
        let bridge = HopKeys::from_export(self.role, &session);
        let bridge_fp = HopFingerprint::of(&bridge);
        let (side, hops) = match self.role {
            Role::Client => {
                let side = client_side_keys(session.version, session.suite, bridge, 1)?;
                let hops = vec![HopFingerprint::of(&side.endpoint), bridge_fp];
                (side, hops)
            }
            Role::Server => {
                let side = server_side_keys(session.version, session.suite, bridge, 1)?;
                let hops = vec![bridge_fp, HopFingerprint::of(&side.endpoint)];
                (side, hops)
            }
        };
        self.summary = Some(SessionSummary {
            version: session.version,
            suite: session.suite,
            hops,
            middlebox_joined: true,
        });
        let [km] = <[_; 1]>::try_from(side.middleboxes)
            .map_err(|_| HandshakeError::Protocol("one middlebox expected"))?;
        let msg = SecondaryMessage::KeyMaterial(Box::new(km)).encode()?;
        self.secondary
            .as_mut()
            .ok_or(HandshakeError::Protocol("no secondary session"))?
            .write_plaintext(&msg)?;
        self.flush_secondary()?;
        self.start_data(EndpointDataPhase::new(
            self.role,
            session.version,
            side.endpoint,
        ))?;
        self.events.push_back(ClientHandshakeEvent::KeysSent);
        Ok(())
    }

    /// No middlebox: the primary session's keys protect the endpoint's hop; records the engine
    /// left unprocessed are the first data.
    fn direct(&mut self, handoff: Handoff) -> Result<(), HandshakeError> {
        let Handoff {
            session,
            unprocessed_incoming,
            pending_plaintext,
            ..
        } = handoff;
        let bridge = HopKeys::from_export(self.role, &session);
        self.summary = Some(SessionSummary {
            version: session.version,
            suite: session.suite,
            hops: vec![HopFingerprint::of(&bridge)],
            middlebox_joined: false,
        });
        let mut data = EndpointDataPhase::new(self.role, session.version, bridge);
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

    pub(super) fn write(&mut self, data: &[u8]) -> Result<(), HandshakeError> {
        match self.data.as_mut() {
            Some(d) => Ok(d.write(data)?),
            None => {
                self.pending_writes.extend_from_slice(data);
                Ok(())
            }
        }
    }

    pub(super) fn close(&mut self) -> Result<(), HandshakeError> {
        match self.data.as_mut() {
            Some(d) => Ok(d.close()?),
            None => Err(HandshakeError::Protocol("close before the data phase")),
        }
    }

    pub(super) fn summary(&self) -> Option<&SessionSummary> {
        self.summary.as_ref()
    }

    pub(super) fn take_outgoing(&mut self) -> Vec<u8> {
        let mut out = core::mem::take(&mut self.out);
        if let Some(d) = self.data.as_mut() {
            out.extend_from_slice(&d.take_outgoing());
        }
        out
    }

    pub(super) fn take_plaintext(&mut self) -> Vec<u8> {
        self.data
            .as_mut()
            .map(EndpointDataPhase::take_plaintext)
            .unwrap_or_default()
    }

    pub(super) fn poll_event(&mut self) -> Option<ClientHandshakeEvent> {
        self.events.pop_front()
    }

    pub(super) fn keys_sent(&self) -> bool {
        self.data.is_some() && self.state == Secondary::Verified
    }

    pub(super) fn data_phase_started(&self) -> bool {
        self.data.is_some()
    }

    pub(super) fn discarded_records(&self) -> usize {
        self.discarded
    }

    pub(super) fn is_ready(&self) -> bool {
        self.marker_seen
    }
}

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
