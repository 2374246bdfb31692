//! What the client and the server do alike with the middlebox on their side (sans-I/O): run the
//! secondary TLS session on its subchannel, check the middlebox (certificate by the engine,
//! approval, exporter-bound evidence), export the primary session once its handshake is done,
//! send the middlebox its key material, drop the primary-key records it re-sends up to its
//! switch marker, and run the endpoint's data phase. Only the primary engine's role and the
//! side of the path the keys are made for differ ([`ClientHandshake`](super::ClientHandshake),
//! [`ServerHandshake`](super::ServerHandshake)).

use std::collections::VecDeque;
use std::sync::Arc;

use mbx_attest::cert_bound::{check_certificate_evidence, IN_CERTIFICATE};
use mbx_attest::{
    recheck_claims, report_data, spki_from_certificate, verify_bytes, Claims, Policy,
    EXPORTER_LABEL, EXPORTER_LEN,
};
use mbx_engine::{
    AlertDescription, Handoff, OpenSslContext, OpenSslEngine, Role, TicketSink, TlsEngine,
};
use mbx_wire::{version, Record};
use zeroize::Zeroizing;

use super::kept::Kept;
use super::pre_marker::PreMarker;
use super::HandshakeError;
use crate::direct::DirectDataPhase;
use crate::endpoint::{EndpointDataPhase, EndpointEvent};
use crate::error::MbtlsError;
use crate::keys::{client_side_keys, server_side_keys, HopKeys};
use crate::wire::{Encapsulated, SecondaryMessage, SecondaryReader};

/// Decides whether a discovered middlebox may join, from its verified certificate chain (DER,
/// leaf first). Called once, after its secondary handshake and before its evidence is checked.
pub type Approver = Arc<dyn Fn(&[Vec<u8>]) -> bool + Send + Sync>;

/// Progress reports of an endpoint (client or server).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientHandshakeEvent {
    /// A middlebox's certificate, approval and evidence passed (`claims`: `None` = no
    /// evidence, and the policy does not require it). `middlebox`: its name, the one it was
    /// configured under or, discovered, the first DNS name of its certificate.
    /// `resumed`: its secondary session resumed one whose evidence was checked (no new
    /// evidence; `claims` are that check's, accepted again by today's policy).
    /// `checked_at`: when the check the verdict rests on was made (seconds since the Unix
    /// epoch): this session's time, or for a resumed session the first check of its chain of
    /// resumptions, which the policy's `resumed_evidence_max_age` bounds.
    /// `evidence_in_certificate`: the evidence came from the middlebox's certificate, made
    /// once for its key, not for this session (docs/mbtls.md §4.8).
    MiddleboxVerified {
        middlebox: String,
        claims: Option<Claims>,
        resumed: bool,
        checked_at: u64,
        evidence_in_certificate: bool,
    },
    /// A discovered middlebox was excluded (not approved, bad certificate, evidence refused);
    /// it never receives key material. `middlebox`: its name as in `MiddleboxVerified`, when
    /// its certificate verified (`None`: its secondary handshake failed before that).
    /// `detail`: what the failed check said (the refused measurement, the certificate error),
    /// when a check failed.
    MiddleboxExcluded {
        middlebox: Option<String>,
        why: &'static str,
        detail: Option<String>,
    },
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
    /// without one, only the bridge. Empty when the session was never exported (no middlebox
    /// could join, docs/mbtls.md §6): its keys then never leave OpenSSL.
    pub hops: Vec<HopFingerprint>,
    /// The name of each middlebox on this endpoint's side that received key material, in path
    /// order from the client (as in [`ClientHandshakeEvent::MiddleboxVerified`]).
    pub middleboxes: Vec<String>,
    /// The primary session was resumed (TLS 1.2 session ID or ticket, TLS 1.3 ticket) rather
    /// than a full handshake: the server's certificate was checked when it was first made.
    /// Whether a middlebox's secondary session resumed is in its
    /// [`ClientHandshakeEvent::MiddleboxVerified`].
    pub resumed: bool,
}

impl SessionSummary {
    /// True when a middlebox of this endpoint's side received key material.
    pub fn middlebox_joined(&self) -> bool {
        !self.middleboxes.is_empty()
    }
}

/// Why a discovered middlebox the application's approver did not approve was excluded
/// ([`MiddleboxVerdict::Excluded`](crate::driver::MiddleboxVerdict)'s `why`, and what the
/// middlebox is told).
pub const NOT_APPROVED: &str = "not approved by the application";

/// How a discovered middlebox is named in reports: the first DNS subjectAltName of its
/// (verified) certificate, else its subject common name. Control characters become `?`, so
/// that a name printed to a terminal or a log line cannot steer either.
fn certificate_name(cert_der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(cert_der).ok()?;
    let dns = cert
        .subject_alternative_name()
        .ok()
        .flatten()
        .and_then(|san| {
            san.value.general_names.iter().find_map(|n| match n {
                x509_parser::extensions::GeneralName::DNSName(d) => Some(*d),
                _ => None,
            })
        });
    let name = match dns {
        Some(d) => d,
        None => cert.subject().iter_common_name().next()?.as_str().ok()?,
    };
    Some(mbx_wire::printable(name))
}

/// The check of a fresh secondary session's evidence, bound to this session, or to the
/// middlebox's certificate when it points there and the policy takes that mode. Its
/// `certificate_not_after` is left 0 (nothing to resume on): the caller reads it for a
/// session that can be resumed.
fn fresh_claims(
    engine: &(dyn TlsEngine + Send),
    evidence: &[u8],
    policy: &Policy,
    now: u64,
) -> Result<VouchedCheck, HandshakeError> {
    let bound_to_session = |claims| VouchedCheck {
        claims,
        checked_at: now,
        certificate_not_after: 0,
        certificate_nonce: None,
    };
    if evidence.is_empty() {
        policy.check_missing_evidence()?;
        return Ok(bound_to_session(None));
    }
    let certs = engine.peer_certificates();
    let leaf = certs
        .first()
        .ok_or(HandshakeError::Protocol("middlebox sent no certificate"))?;
    if evidence == IN_CERTIFICATE {
        // Bound to the certificate's key, which this session's CertificateVerify proved the
        // middlebox holds (the spec's second binding mode), if the policy takes it.
        let check = check_certificate_evidence(leaf, policy, now)?;
        return Ok(VouchedCheck {
            claims: Some(check.claims),
            checked_at: check.checked_at,
            certificate_not_after: 0,
            certificate_nonce: Some(check.nonce),
        });
    }
    let label = core::str::from_utf8(EXPORTER_LABEL)
        .map_err(|_| HandshakeError::Config("exporter label"))?;
    let binder = engine.export_keying_material(label, None, EXPORTER_LEN)?;
    let spki = spki_from_certificate(leaf)?;
    let expected = report_data(&spki, &binder);
    Ok(bound_to_session(Some(verify_bytes(
        evidence, &expected, policy, now,
    )?)))
}

/// What an endpoint vouches for a secondary session with ([`TlsEngine::vouch_for_session`]):
/// the claims of its middlebox's evidence (`None`: none, and the policy did not require any),
/// when they were checked, and the end of the middlebox certificate's validity (seconds since
/// the Unix epoch). A session that resumes it, and the sessions resumed from that one, carry
/// the same check (the same `Arc`): resumption skips the certificate and the evidence.
struct VouchedCheck {
    claims: Option<Claims>,
    checked_at: u64,
    certificate_not_after: u64,
    /// The evidence was the certificate's, bound to this nonce: a session resumed from this
    /// one must still find that mode, and that nonce, accepted (found in a review). Then
    /// `checked_at` is the full check's, earlier than now when a remembered check answered.
    certificate_nonce: Option<Vec<u8>>,
}

impl VouchedCheck {
    /// Until when (exclusive) later sessions may resume on this check: while it is young
    /// enough for the policy, the certificate it saw and the evidence's collateral (DCAP) are
    /// still valid, and that collateral young enough for the policy's `max_collateral_age`.
    fn valid_until(&self, policy: &Policy) -> u64 {
        let claims = self.claims.as_ref();
        let collateral = claims
            .and_then(|c| c.collateral_valid_until)
            .unwrap_or(u64::MAX);
        let young = claims.map_or(u64::MAX, |c| policy.collateral_young_until(c));
        policy
            .resumed_evidence_valid_until(self.checked_at)
            .min(self.certificate_not_after.saturating_add(1))
            .min(collateral.saturating_add(1))
            .min(young.saturating_add(1))
    }
}

/// The end of validity of the middlebox's certificate; 0 (nothing to resume on) without one,
/// or for one our parser does not read though the TLS library accepted it: resumption is
/// only a saving, and such a middlebox just makes full handshakes.
fn certificate_not_after(engine: &(dyn TlsEngine + Send)) -> u64 {
    engine
        .peer_certificates()
        .first()
        .and_then(|leaf| mbx_attest::certificate_not_after(leaf).ok())
        .unwrap_or(0)
}

/// A resumed secondary session without evidence (paper §3.5: no new attestation is needed,
/// because only the middlebox that made the ticket can open it, and its ticket key never
/// leaves it): the check of the session it resumes, which this endpoint vouched for, must
/// still hold at `now`: younger than the policy's `resumed_evidence_max_age`, its certificate
/// unexpired, its claims passing today's policy. (The engine offers no session past
/// [`VouchedCheck::valid_until`]; this holds if the clocks disagree or the policy changed.) A
/// resumption this endpoint never vouched for (no note: another engine, or a context shared
/// with something else) counts as no evidence, checked now.
fn resumed_check(
    engine: &(dyn TlsEngine + Send),
    policy: &Policy,
    now: u64,
) -> Result<Arc<VouchedCheck>, HandshakeError> {
    let note = engine
        .resumed_note()
        .and_then(|n| n.downcast::<VouchedCheck>().ok());
    let Some(check) = note else {
        policy.check_missing_evidence()?;
        return Ok(Arc::new(VouchedCheck {
            claims: None,
            checked_at: now,
            certificate_not_after: certificate_not_after(engine),
            certificate_nonce: None,
        }));
    };
    if now > check.certificate_not_after {
        return Err(HandshakeError::Resumed(
            "the middlebox's certificate expired after the session this one resumes",
        ));
    }
    // Today's policy must still take the mode and the nonce the check rested on.
    if let Some(nonce) = &check.certificate_nonce {
        policy.check_certificate_evidence(nonce)?;
    }
    match &check.claims {
        Some(claims) => recheck_claims(claims, check.checked_at, now, policy)?,
        None => policy.check_missing_evidence()?,
    }
    Ok(check)
}

/// The slot on `subchannel`.
fn slot_in(slots: &mut [Slot], subchannel: u8) -> Result<&mut Slot, HandshakeError> {
    slots
        .iter_mut()
        .find(|s| s.subchannel == subchannel)
        .ok_or(HandshakeError::Protocol("record on an unknown subchannel"))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Secondary {
    /// Nothing from the middlebox yet.
    Waiting,
    Running,
    /// Certificate, approval and evidence passed.
    Verified,
    /// Excluded (discovered mode only): the secondary session is closed or failed.
    Excluded,
}

/// The endpoint's record layer after the handshake.
// One per session, made once and never moved afterwards: the size difference costs nothing.
#[allow(clippy::large_enum_variant)]
enum DataPhase {
    /// Ours, under exported or freshly generated keys.
    Exported(EndpointDataPhase),
    /// OpenSSL's: no middlebox joined and the primary session was never exported.
    Direct(DirectDataPhase),
}

impl DataPhase {
    fn receive(&mut self, bytes: &[u8]) {
        match self {
            DataPhase::Exported(d) => d.receive(bytes),
            DataPhase::Direct(d) => d.receive(bytes),
        }
    }

    fn write(&mut self, data: &[u8]) -> Result<(), MbtlsError> {
        match self {
            DataPhase::Exported(d) => d.write(data),
            DataPhase::Direct(d) => d.write(data),
        }
    }

    fn close(&mut self) -> Result<(), MbtlsError> {
        match self {
            DataPhase::Exported(d) => d.close(),
            DataPhase::Direct(d) => d.close(),
        }
    }

    fn abort(
        &mut self,
        description: AlertDescription,
        what: &'static str,
    ) -> Result<(), MbtlsError> {
        match self {
            DataPhase::Exported(d) => d.abort(description, what),
            DataPhase::Direct(d) => d.abort(),
        }
    }

    fn update_keys(&mut self, request_peer: bool) -> Result<(), MbtlsError> {
        match self {
            DataPhase::Exported(d) => d.update_keys(request_peer),
            DataPhase::Direct(d) => d.update_keys(request_peer),
        }
    }

    fn take_outgoing(&mut self) -> Vec<u8> {
        match self {
            DataPhase::Exported(d) => d.take_outgoing(),
            DataPhase::Direct(d) => d.take_outgoing(),
        }
    }

    fn take_plaintext(&mut self) -> Vec<u8> {
        match self {
            DataPhase::Exported(d) => d.take_plaintext(),
            DataPhase::Direct(d) => d.take_plaintext(),
        }
    }

    fn poll_event(&mut self) -> Option<EndpointEvent> {
        match self {
            DataPhase::Exported(d) => d.poll_event(),
            DataPhase::Direct(d) => d.poll_event(),
        }
    }

    fn release_idle_buffers(&mut self) {
        match self {
            DataPhase::Exported(d) => d.release_idle_buffers(),
            DataPhase::Direct(d) => d.release_idle_buffers(),
        }
    }
}

/// One middlebox on our side: its secondary session on its subchannel.
pub(super) struct Slot {
    pub(super) subchannel: u8,
    engine: Box<dyn TlsEngine + Send>,
    pub(super) state: Secondary,
    rx: SecondaryReader,
    /// Client: discovery settled without it (at the primary ServerHello); if it speaks after
    /// all, it is shut out at the end of its handshake.
    late: bool,
    /// The name it was configured under, or (discovered) its certificate's once that verified.
    name: Option<String>,
    /// Configured by name, on a context that keeps vouched sessions: its sessions resume.
    resumable: bool,
}

impl Slot {
    /// `name`: the pre-configured middlebox's name (its certificate is checked for it).
    /// `ctx`: the context `engine` came from.
    pub(super) fn new(
        subchannel: u8,
        engine: Box<dyn TlsEngine + Send>,
        name: Option<&str>,
        ctx: &dyn mbx_engine::ClientContext,
    ) -> Self {
        Slot {
            subchannel,
            engine,
            state: Secondary::Waiting,
            rx: SecondaryReader::new(),
            late: false,
            name: name.map(str::to_string),
            resumable: name.is_some() && ctx.keeps_vouched_sessions(),
        }
    }

    /// The middlebox spoke on this subchannel: its secondary session runs.
    pub(super) fn start(&mut self) {
        if self.state == Secondary::Waiting {
            self.state = Secondary::Running;
        }
    }
}

/// The state both endpoints share.
pub(super) struct EndpointCore {
    role: Role,
    policy: Policy,
    now_unix: u64,
    /// `None`: pre-configured (each must join; the engine checks its name).
    approver: Option<Approver>,
    /// How many middleboxes must join (pre-configured); 0 when discovered.
    required: usize,
    pub(super) primary: Option<OpenSslEngine>,
    /// Our middleboxes' secondary sessions, by subchannel.
    pub(super) slots: Vec<Slot>,
    pub(super) out: Vec<u8>,
    data: Option<DataPhase>,
    /// The subchannel whose close_notify marks the switch of our nearest middlebox.
    marker_subchannel: Option<u8>,
    /// Waiting for that marker; primary-key records meanwhile are dropped (the middlebox
    /// re-sends them through its app).
    marker_seen: bool,
    /// Application data written before the data phase (wiped when dropped, grown without
    /// leaving a copy behind).
    pending_writes: Zeroizing<Vec<u8>>,
    /// Primary-key records dropped while waiting for the marker.
    discarded: usize,
    /// What the peer sent after the primary handshake ended and before the data phase: the
    /// paused engine keeps it until the export, within its bound.
    kept_after_handshake: Kept,
    /// The primary engine has answered the peer (a server: its ServerHello is out). Only then
    /// may a failure add an alert of ours: a server-side middlebox takes an alert that is a
    /// server's first answer for a legacy server's refusal of its announcement.
    primary_spoke: bool,
    /// Authenticates those records under the bridge keys before dropping them: the middlebox
    /// re-sends their content through its app, but a forged or altered record is still fatal
    /// (fail closed), never silently ignored.
    /// Boxed: only sessions with a middlebox have one, until its marker.
    pre_marker: Option<Box<PreMarker>>,
    failed: bool,
    summary: Option<SessionSummary>,
    pub(super) events: VecDeque<ClientHandshakeEvent>,
    /// Run once if the session fails ([`Self::forget_on_failure`]).
    forget: Option<Box<dyn FnOnce() + Send>>,
}

impl EndpointCore {
    pub(super) fn new(
        role: Role,
        policy: Policy,
        now_unix: u64,
        approver: Option<Approver>,
        required: usize,
        primary: Option<OpenSslEngine>,
    ) -> Self {
        EndpointCore {
            role,
            policy,
            now_unix,
            approver,
            required,
            primary,
            slots: Vec::new(),
            out: Vec::new(),
            data: None,
            marker_subchannel: None,
            marker_seen: false,
            pending_writes: Zeroizing::new(Vec::new()),
            discarded: 0,
            kept_after_handshake: Kept::default(),
            primary_spoke: false,
            pre_marker: None,
            failed: false,
            summary: None,
            events: VecDeque::new(),
            forget: None,
        }
    }

    pub(super) fn preconfigured(&self) -> bool {
        self.approver.is_none()
    }

    /// Client, discovering, just before the primary ServerHello is processed: every middlebox
    /// on the path has answered by now, so if none spoke, none joins. The session then gives
    /// up its export and stays in OpenSSL, which spares the key log (docs/mbtls.md §6).
    pub(super) fn forgo_export_if_alone(
        &mut self,
        ctx: &OpenSslContext,
    ) -> Result<(), HandshakeError> {
        if self.slots.iter().any(|s| s.state != Secondary::Waiting) {
            return Ok(());
        }
        let primary = self
            .primary
            .as_mut()
            .ok_or(HandshakeError::Protocol("primary engine gone"))?;
        ctx.forgo_export(primary)?;
        // Any that answers now is out of order: its handshake still runs, so that it can be
        // closed properly and go passive, but it is shut out.
        for slot in &mut self.slots {
            slot.late = true;
        }
        Ok(())
    }

    /// The primary handshake runs without export, so no middlebox can join any more (client:
    /// discovery settled at the ServerHello with none; server: made without export at the
    /// ClientHello, none having announced itself).
    pub(super) fn kept_in_openssl(&self) -> bool {
        self.primary.as_ref().is_some_and(|p| !p.exportable())
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
            self.forget_session();
        }
        r
    }

    /// Whether the primary engine has answered (our first flight is out).
    pub(super) fn primary_spoke(&self) -> bool {
        self.primary_spoke
    }

    /// A server whose handshake failed on its side (a middlebox refused or missing, a record it
    /// cannot take) after its ServerHello went out, before the data phase: a fatal
    /// `handshake_failure` alert, so that a legacy client learns the session was refused
    /// instead of seeing a close; as the client reads it then (TLS 1.2: in plaintext before
    /// our ChangeCipherSpec, sealed after it; TLS 1.3: sealed under the server's application
    /// traffic keys, which follow its Finished in the same flight, or in plaintext while only
    /// a HelloRetryRequest is out). An engine that failed sent its own alert.
    pub(super) fn alert_on_own_failure(&mut self) {
        let Some(primary) = self.primary.as_ref() else {
            return;
        };
        if !self.primary_spoke || primary.has_failed() || self.data.is_some() {
            return;
        }
        // Without the key log (a session made without export) there is no key to seal with:
        // the peer then sees the close alone.
        if let Ok(record) = primary.fatal_alert(mbx_engine::AlertDescription::HANDSHAKE_FAILURE) {
            self.out.extend_from_slice(&record);
        }
    }

    /// What makes the primary session unresumable if this session fails: a client's stored
    /// sessions for the server, a server's cached session (RFC 5246 §7.2.2; OpenSSL sees to
    /// it for the sessions it keeps).
    pub(super) fn forget_on_failure(&mut self, forget: Box<dyn FnOnce() + Send>) {
        self.forget = Some(forget);
    }

    fn forget_session(&mut self) {
        if let Some(forget) = self.forget.take() {
            forget();
        }
    }

    /// Drops one raw primary-key record that arrived before the middlebox's switch marker, after
    /// checking it authenticates under the bridge keys at the next sequence number.
    fn drop_authenticated(&mut self, record: &[u8]) -> Result<(), HandshakeError> {
        let check = self
            .pre_marker
            .as_mut()
            .ok_or(HandshakeError::Protocol("record before the export"))?;
        check.check(record)?;
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
                if !primary.is_handshaking() {
                    // The handshake is over, our middleboxes' sessions are not: the paused
                    // engine keeps this until the export. A peer that also plays a middlebox
                    // which never finishes could otherwise fill it until the timeout.
                    self.kept_after_handshake.bytes(
                        rec.as_bytes().len(),
                        "too much data from the peer before the middleboxes' sessions ended",
                    )?;
                }
                primary.feed(rec.as_bytes());
                let processed = primary.process();
                // Even when it failed: the alert the engine sent then goes out, so the peer
                // learns why (`protocol_version`, `bad_certificate`) instead of seeing a close.
                let answer = primary.take_outgoing();
                self.primary_spoke |= !answer.is_empty();
                self.out.extend_from_slice(&answer);
                processed?;
                // A middlebox speaks before the primary handshake can end (client side: its
                // ServerHello precedes the primary one; server side: its announcement precedes
                // the ClientHello), so one that has not spoken by then is absent.
                if !primary.is_handshaking() {
                    self.absent_middleboxes()?;
                }
            }
        }
        self.maybe_finish()
    }

    /// At the end of the primary handshake: silent middleboxes are absent.
    fn absent_middleboxes(&mut self) -> Result<(), HandshakeError> {
        let spoke = self
            .slots
            .iter()
            .filter(|s| s.state != Secondary::Waiting)
            .count();
        if self.preconfigured() && spoke < self.required {
            // A client's slots carry their names from the start (a server names the missing
            // one itself: its slots are made as its middleboxes announce themselves).
            let missing = self
                .slots
                .iter()
                .find(|s| s.state == Secondary::Waiting)
                .and_then(|s| s.name.clone());
            let not_joined = HandshakeError::NotJoined {
                joined: spoke,
                configured: self.required,
            };
            return Err(HandshakeError::named(missing, not_joined));
        }
        for slot in &mut self.slots {
            if slot.state == Secondary::Waiting {
                slot.state = Secondary::Excluded;
            }
        }
        Ok(())
    }

    /// Moves the data phase's events to ours; a failure among them makes the session
    /// unresumable, whether or not the caller ever reads the events.
    fn data_events(&mut self) {
        let Some(data) = self.data.as_mut() else {
            return;
        };
        let mut failed = false;
        while let Some(ev) = data.poll_event() {
            failed |= matches!(
                ev,
                EndpointEvent::Failed { .. } | EndpointEvent::PeerAlert(_)
            );
            self.events.push_back(ClientHandshakeEvent::Data(ev));
        }
        if failed {
            self.forget_session();
        }
    }

    fn slot_mut(&mut self, subchannel: u8) -> Result<&mut Slot, HandshakeError> {
        slot_in(&mut self.slots, subchannel)
    }

    /// True if `subchannel` belongs to one of our middleboxes.
    pub(super) fn has_slot(&self, subchannel: u8) -> bool {
        self.slots.iter().any(|s| s.subchannel == subchannel)
    }

    /// Wraps what a secondary engine produced for its subchannel (nothing once the data phase
    /// runs: a middlebox would take any later encapsulated record as an attack).
    pub(super) fn flush_secondary(&mut self, subchannel: u8) -> Result<(), HandshakeError> {
        let data_started = self.data.is_some();
        let slot = self.slot_mut(subchannel)?;
        let out = slot.engine.take_outgoing();
        if !data_started {
            Encapsulated::wrap_stream(subchannel, &out, version::TLS1_2, &mut self.out)?;
        }
        Ok(())
    }

    /// A discovered middlebox failed a check: close its secondary session without key material
    /// (it then forwards ciphertext only). A pre-configured one fails the handshake.
    fn exclude(
        &mut self,
        subchannel: u8,
        why: &'static str,
        err: HandshakeError,
    ) -> Result<(), HandshakeError> {
        let unknown_issuer =
            err.certificate_problem() == Some(mbx_engine::CertificateProblem::UnknownIssuer);
        let err = match unknown_issuer {
            true => HandshakeError::UntrustedMiddleboxIssuer(Box::new(err)),
            false => err,
        };
        // Our own protocol reasons are `why` already; a check's error says more.
        let detail = match &err {
            HandshakeError::Protocol(_) => None,
            err => Some(err.to_string()),
        };
        self.tell_refused(subchannel, why, detail.as_deref());
        if self.preconfigured() {
            // The session fails, with what we told the middlebox on its way. (A close_notify
            // on its secondary session first would make the middlebox go passive and report
            // the session's end as clean; without one it reports that it got no key material.)
            let _ = self.flush_secondary(subchannel);
            return Err(self.about(subchannel, err));
        }
        self.shut_out(subchannel, why, detail)?;
        self.maybe_finish()
    }

    /// Best effort: tells the middlebox on `subchannel` why it gets no key material, over its
    /// secondary session when that is up (its operator then reads more than a close). What a
    /// check said is its own business: its evidence, its certificate, our approval of it.
    fn tell_refused(&mut self, subchannel: u8, why: &'static str, detail: Option<&str>) {
        let text = detail.map_or_else(|| why.to_string(), |d| format!("{why}: {d}"));
        let Ok(slot) = self.slot_mut(subchannel) else {
            return;
        };
        if slot.engine.is_handshaking() {
            return;
        }
        if let Ok(message) = SecondaryMessage::Refused(text).encode() {
            let _ = slot.engine.write_plaintext(&message);
        }
    }

    /// `err` about the middlebox on `subchannel`, named when its name is known (configured, or
    /// read from its verified certificate), so that an error among several says which one.
    fn about(&self, subchannel: u8, err: HandshakeError) -> HandshakeError {
        let name = self
            .slots
            .iter()
            .find(|s| s.subchannel == subchannel)
            .and_then(|s| s.name.clone());
        let elsewhere =
            err.certificate_problem() == Some(mbx_engine::CertificateProblem::NameMismatch);
        let err = if elsewhere && self.preconfigured() {
            HandshakeError::NotTheNameAtItsPlace(Box::new(err))
        } else {
            err
        };
        HandshakeError::named(name, err)
    }

    /// Closes a middlebox's secondary session without key material (it then forwards
    /// ciphertext only).
    fn shut_out(
        &mut self,
        subchannel: u8,
        why: &'static str,
        detail: Option<String>,
    ) -> Result<(), HandshakeError> {
        let slot = self.slot_mut(subchannel)?;
        // Best effort: a failed engine may have queued an alert instead of a close_notify.
        let _ = slot.engine.close();
        slot.state = Secondary::Excluded;
        let middlebox = slot.name.clone();
        self.flush_secondary(subchannel)?;
        self.events
            .push_back(ClientHandshakeEvent::MiddleboxExcluded {
                middlebox,
                why,
                detail,
            });
        Ok(())
    }

    /// An inner record of one of our subchannels for its secondary engine.
    pub(super) fn secondary_in(&mut self, enc: &Encapsulated) -> Result<(), HandshakeError> {
        let id = enc.subchannel;
        let slot = self.slot_mut(id)?;
        if slot.state == Secondary::Excluded {
            return Ok(());
        }
        slot.start();
        slot.engine.feed(enc.inner.as_bytes());
        let processed = slot.engine.process();
        let handshaking = slot.engine.is_handshaking();
        self.flush_secondary(id)?;
        if let Err(e) = processed {
            // Once key material went out, every middlebox still in is part of the session: a
            // failure on its subchannel is an attack or a fault, and leaving it out would leave
            // it with the keys of two hops while the session went on.
            if self.data.is_some() {
                return Err(self.about(id, e.into()));
            }
            return self.exclude(id, "secondary handshake failed", e.into());
        }
        if handshaking {
            return Ok(());
        }
        let slot = self.slot_mut(id)?;
        let (running, late) = (slot.state == Secondary::Running, slot.late);
        // A discovered middlebox has no name until its handshake ends: its certificate is
        // looked at once, on the record that ended it (the approver too is asked once, not
        // again for each record until the evidence is whole).
        let chain = if slot.name.is_none() {
            let chain = slot.engine.peer_certificates();
            // The engine verified the chain: its leaf names the middlebox.
            slot.name = Some(
                chain
                    .first()
                    .and_then(|c| certificate_name(c))
                    .unwrap_or_else(|| "(certificate without a name)".to_string()),
            );
            Some(chain)
        } else {
            None
        };
        if running && late {
            return self.exclude(
                id,
                "answered after the primary ServerHello",
                HandshakeError::Protocol("a middlebox answered after the primary ServerHello"),
            );
        }
        if let (true, Some(chain), Some(approve)) = (running, &chain, &self.approver) {
            if !approve(chain) {
                return self.exclude(
                    id,
                    NOT_APPROVED,
                    HandshakeError::Protocol("middlebox not approved"),
                );
            }
        }
        let slot = self.slot_mut(id)?;
        let plain = slot.engine.take_plaintext();
        slot.rx.push(&plain);
        loop {
            let msg = match self.slot_mut(id)?.rx.next_message() {
                Ok(Some(msg)) => msg,
                Ok(None) => break,
                Err(e) => return Err(self.about(id, e.into())),
            };
            match msg {
                SecondaryMessage::Evidence(e) if self.slot_mut(id)?.state == Secondary::Running => {
                    if let Err(err) = self.verify(id, &e) {
                        return self.exclude(id, "evidence refused", err);
                    }
                }
                _ => {
                    let what = HandshakeError::Protocol("unexpected secondary message");
                    return Err(self.about(id, what));
                }
            }
        }
        let peer_closed = self.slot_mut(id)?.engine.peer_closed();
        if self.data.is_some()
            && peer_closed
            && !self.marker_seen
            && self.marker_subchannel == Some(id)
        {
            self.marker_seen = true;
            // The bridge's read keys were kept only to check records before the marker.
            self.pre_marker = None;
            self.events.push_back(ClientHandshakeEvent::Ready);
        }
        self.maybe_finish()
    }

    /// Exporter-bound evidence of one secondary session, checked against the policy; then the
    /// session may be resumed later, carrying the claims.
    fn verify(&mut self, subchannel: u8, evidence: &[u8]) -> Result<(), HandshakeError> {
        // The slot and the policy are borrowed apart: no copy of the policy per middlebox.
        let (policy, now) = (&self.policy, self.now_unix);
        let slot = slot_in(&mut self.slots, subchannel)?;
        let resumed = slot.engine.session_resumed();
        let check = if resumed && evidence.is_empty() {
            resumed_check(slot.engine.as_ref(), policy, now)?
        } else {
            let mut fresh = fresh_claims(slot.engine.as_ref(), evidence, policy, now)?;
            // Only a session that can be resumed needs its certificate read again.
            if slot.resumable {
                fresh.certificate_not_after = certificate_not_after(slot.engine.as_ref());
            }
            Arc::new(fresh)
        };
        let checked_at = check.checked_at;
        let evidence_in_certificate = check.certificate_nonce.is_some();
        let claims = if slot.resumable {
            // Its tickets are offered while the check can be relied on.
            let (claims, valid_until) = (check.claims.clone(), check.valid_until(policy));
            slot.engine.vouch_for_session(check, valid_until);
            claims
        } else {
            // Not kept: the claims move out of the only reference.
            Arc::try_unwrap(check).map_or_else(|shared| shared.claims.clone(), |c| c.claims)
        };
        slot.state = Secondary::Verified;
        let middlebox = slot.name.clone().unwrap_or_default();
        self.events
            .push_back(ClientHandshakeEvent::MiddleboxVerified {
                middlebox,
                claims,
                resumed,
                checked_at,
                evidence_in_certificate,
            });
        Ok(())
    }

    /// The middleboxes that take part, in path order from the client. Client side: subchannel
    /// 0 went to the middlebox nearest the server (ids are taken as the primary ServerHello
    /// passes them), so path order is descending id. Server side: the middlebox nearest the
    /// client announces first and takes the lowest id, so path order is ascending id.
    fn joined_in_path_order(&self) -> Vec<u8> {
        let mut ids: Vec<u8> = self
            .slots
            .iter()
            .filter(|s| s.state == Secondary::Verified)
            .map(|s| s.subchannel)
            .collect();
        ids.sort_unstable();
        if self.role == Role::Client {
            ids.reverse();
        }
        ids
    }

    /// Once the primary handshake is done and every middlebox is verified (or excluded, or
    /// absent): export the primary session and start the data phase.
    fn maybe_finish(&mut self) -> Result<(), HandshakeError> {
        let primary_done = self.primary.as_ref().is_some_and(|p| !p.is_handshaking());
        let settled = self.slots.iter().all(|s| match s.state {
            Secondary::Verified => !s.engine.is_handshaking(),
            Secondary::Excluded => true,
            Secondary::Waiting | Secondary::Running => false,
        });
        if self.data.is_some() || !primary_done || !settled {
            return Ok(());
        }
        let primary = self
            .primary
            .take()
            .ok_or(HandshakeError::Protocol("primary engine gone"))?;
        let joined = self.joined_in_path_order();
        let resumed = primary.session_reused();
        if !primary.exportable() {
            if !joined.is_empty() {
                return Err(HandshakeError::Protocol(
                    "a middlebox joined but the primary session cannot be exported",
                ));
            }
            return self.direct_in_openssl(primary);
        }
        // A client that resumes sessions keeps, with TLS 1.3, what turns the tickets the server
        // sends after this point into sessions; a server, its session in its cache, forgotten
        // if the session fails (docs/mbtls.md §4.6).
        let (handoff, after) = primary.export_for_resumption()?;
        let tickets = after.tickets;
        if let Some(cached) = after.cached {
            self.forget_on_failure(Box::new(move || cached.forget()));
        }
        self.out.extend_from_slice(&handoff.pending_outgoing);
        if joined.is_empty() {
            return self.direct(handoff, resumed, tickets);
        }
        // Records the engine did not process are application epoch under the primary keys: the
        // middlebox re-sends them through its app after the marker, so they are dropped here,
        // once authenticated.
        // The engine pauses after its handshake, so it has opened no application record: one
        // it had would come again neither from the middlebox (which starts at the exported
        // sequence number) nor from here. Fail closed should that ever change (found in a
        // security review: it was dropped unread).
        if !handoff.pending_plaintext.is_empty() {
            return Err(HandshakeError::Protocol(
                "the primary engine opened application data before its export",
            ));
        }
        let session = handoff.session;
        let bridge = HopKeys::from_export(self.role, &session)?;
        let read = match self.role {
            Role::Client => bridge.s2c.clone(),
            Role::Server => bridge.c2s.clone(),
        };
        self.pre_marker = Some(Box::new(PreMarker::new(session.version, read)));
        for rec in split_records(&handoff.unprocessed_incoming) {
            self.drop_authenticated(rec)?;
        }
        let n = joined.len();
        let side = match self.role {
            Role::Client => client_side_keys(session.version, session.suite, bridge, n)?,
            Role::Server => server_side_keys(session.version, session.suite, bridge, n)?,
        };
        // Every hop in path order: the first middlebox's hop toward the client, then each
        // middlebox's hop toward the server.
        let mut hops: Vec<HopFingerprint> = side
            .middleboxes
            .first()
            .map(|km| HopFingerprint::of(&km.toward_client))
            .into_iter()
            .collect();
        hops.extend(
            side.middleboxes
                .iter()
                .map(|km| HopFingerprint::of(&km.toward_server)),
        );
        self.summary = Some(SessionSummary {
            version: session.version,
            suite: session.suite,
            hops,
            middleboxes: joined
                .iter()
                .map(|id| {
                    let slot = self.slots.iter().find(|s| s.subchannel == *id);
                    slot.and_then(|s| s.name.clone()).unwrap_or_default()
                })
                .collect(),
            resumed,
        });
        // Farthest first: a middlebox switches at its own key material, after which it takes
        // every record from our side as data; the others' key material must be past it by then.
        let mut order: Vec<usize> = (0..n).collect();
        if self.role == Role::Client {
            order.reverse();
        }
        self.marker_subchannel = match self.role {
            Role::Client => joined.first().copied(),
            Role::Server => joined.last().copied(),
        };
        for j in order {
            let (Some(&id), Some(km)) = (joined.get(j), side.middleboxes.get(j)) else {
                return Err(HandshakeError::Protocol(
                    "key material for a missing middlebox",
                ));
            };
            // Whether a middlebox farther from us joined too (client side: later in path
            // order; server side: earlier): only then does this one wait for its marker.
            let far_neighbour_joined = match self.role {
                Role::Client => j + 1 < n,
                Role::Server => j > 0,
            };
            // Its TLS 1.3 session ticket, if we resume its sessions, its secondary session is
            // TLS 1.3 (a TLS 1.2 one sent its ticket in its handshake) and no middlebox nearer
            // us (client side: earlier; server side: later) joined: that one would take the
            // ticket for this one's marker (docs/mbtls.md §4.7).
            let near_neighbour_joined = match self.role {
                Role::Client => j > 0,
                Role::Server => j + 1 < n,
            };
            let slot = self.slot_mut(id)?;
            let ticket_wanted = !near_neighbour_joined
                && slot.resumable
                && slot.engine.version() == Some(mbx_record::TlsVersion::Tls13);
            // Path message and key material in one write (one secondary record), in a
            // buffer that never grows (so no unwiped copy of the keys is left behind).
            let path = SecondaryMessage::Path {
                far_neighbour_joined,
                ticket_wanted,
            };
            let keys = SecondaryMessage::KeyMaterial(Box::new(km.clone()));
            let mut msg = Zeroizing::new(Vec::with_capacity(
                path.max_encoded_len() + keys.max_encoded_len(),
            ));
            path.encode_into(&mut msg)?;
            keys.encode_into(&mut msg)?;
            self.slot_mut(id)?.engine.write_plaintext(&msg)?;
            self.flush_secondary(id)?;
        }
        let data = data_phase(self.role, session.version, side.endpoint, tickets);
        self.start_data(DataPhase::Exported(data))?;
        self.events.push_back(ClientHandshakeEvent::KeysSent);
        Ok(())
    }

    /// No middlebox: the primary session's keys protect the endpoint's hop; records the engine
    /// left unprocessed are the first data.
    fn direct(
        &mut self,
        handoff: Handoff,
        resumed: bool,
        tickets: Option<TicketSink>,
    ) -> Result<(), HandshakeError> {
        let Handoff {
            session,
            unprocessed_incoming,
            pending_plaintext,
            ..
        } = handoff;
        let bridge = HopKeys::from_export(self.role, &session)?;
        self.summary = Some(SessionSummary {
            version: session.version,
            suite: session.suite,
            hops: vec![HopFingerprint::of(&bridge)],
            middleboxes: Vec::new(),
            resumed,
        });
        let mut data = data_phase(self.role, session.version, bridge, tickets);
        data.receive(&unprocessed_incoming);
        data.inject_plaintext(&pending_plaintext);
        self.start_direct(DataPhase::Exported(data))
    }

    /// No middlebox, and the primary context was built without export: OpenSSL keeps the
    /// session (and its keys).
    fn direct_in_openssl(&mut self, primary: OpenSslEngine) -> Result<(), HandshakeError> {
        let (Some(version), Some(suite)) = (
            primary.version(),
            primary
                .cipher_suite()
                .and_then(mbx_record::CipherSuite::from_id),
        ) else {
            return Err(HandshakeError::Protocol("primary version or suite unknown"));
        };
        self.summary = Some(SessionSummary {
            version,
            suite,
            hops: Vec::new(),
            middleboxes: Vec::new(),
            resumed: primary.session_reused(),
        });
        self.start_direct(DataPhase::Direct(DirectDataPhase::new(primary)))
    }

    fn start_direct(&mut self, data: DataPhase) -> Result<(), HandshakeError> {
        self.start_data(data)?;
        self.marker_seen = true;
        self.events.push_back(ClientHandshakeEvent::Direct);
        self.events.push_back(ClientHandshakeEvent::Ready);
        self.data_events();
        Ok(())
    }

    fn start_data(&mut self, mut data: DataPhase) -> Result<(), HandshakeError> {
        let pending = core::mem::take(&mut self.pending_writes);
        if !pending.is_empty() {
            data.write(&pending)?;
        }
        self.data = Some(data);
        Ok(())
    }

    pub(super) fn write(&mut self, data: &[u8]) -> Result<(), HandshakeError> {
        if self.data.is_none() {
            mbx_record::wipe::reserve(&mut self.pending_writes, data.len());
            self.pending_writes.extend_from_slice(data);
            return Ok(());
        }
        self.sending("write before the data phase", |d| d.write(data))
    }

    pub(super) fn close(&mut self) -> Result<(), HandshakeError> {
        self.sending("close before the data phase", DataPhase::close)
    }

    pub(super) fn abort(
        &mut self,
        description: AlertDescription,
        what: &'static str,
    ) -> Result<(), HandshakeError> {
        self.sending("alert of ours before the data phase", |d| {
            d.abort(description, what)
        })
    }

    pub(super) fn update_keys(&mut self, request_peer: bool) -> Result<(), HandshakeError> {
        self.sending("KeyUpdate before the data phase", |d| {
            d.update_keys(request_peer)
        })
    }

    /// Something we send in the data phase. A failure on our side (a key at its limit, OpenSSL
    /// refusing to seal) makes the session unresumable now, not at the next receive.
    fn sending(
        &mut self,
        too_early: &'static str,
        f: impl FnOnce(&mut DataPhase) -> Result<(), MbtlsError>,
    ) -> Result<(), HandshakeError> {
        let r = match self.data.as_mut() {
            Some(d) => f(d),
            None => return Err(HandshakeError::Protocol(too_early)),
        };
        self.data_events();
        Ok(r?)
    }

    pub(super) fn summary(&self) -> Option<&SessionSummary> {
        self.summary.as_ref()
    }

    /// Gives back buffer memory an idle session does not need (ciphertext buffers only).
    pub(super) fn release_idle_buffers(&mut self) {
        self.out.shrink_to_fit();
        if let Some(d) = self.data.as_mut() {
            d.release_idle_buffers();
        }
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
            .map(DataPhase::take_plaintext)
            .unwrap_or_default()
    }

    pub(super) fn poll_event(&mut self) -> Option<ClientHandshakeEvent> {
        self.events.pop_front()
    }

    pub(super) fn keys_sent(&self) -> bool {
        self.data.is_some() && self.marker_subchannel.is_some()
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

    /// What the handshake waits for, in words, before its data phase (for the error of a
    /// handshake that timed out): each middlebox that spoke and has not been judged, its
    /// secondary handshake or its evidence message, then the peer's primary handshake
    /// (`peer`: "the server" or "the client"; before a server's ClientHello the primary
    /// engine does not exist yet).
    pub(super) fn waiting_for(&self, peer: &str) -> Option<String> {
        if self.data.is_some() {
            return None;
        }
        let mut waiting: Vec<String> = self
            .slots
            .iter()
            .filter_map(|s| {
                let what = match s.state {
                    Secondary::Running | Secondary::Verified if s.engine.is_handshaking() => {
                        " to finish its secondary handshake"
                    }
                    Secondary::Running => {
                        "'s evidence message (its secondary handshake is done; one without \
                         evidence sends it empty)"
                    }
                    _ => return None,
                };
                Some(match &s.name {
                    Some(name) => format!("middlebox {name}{what}"),
                    None => format!("the middlebox on subchannel {}{what}", s.subchannel),
                })
            })
            .collect();
        if self.primary.as_ref().is_none_or(|p| p.is_handshaking()) {
            waiting.push(format!("{peer}'s handshake"));
        }
        (!waiting.is_empty()).then(|| waiting.join("; "))
    }
}

/// The endpoint's data phase on our record layer, with the primary engine's ticket sink if
/// there is one (a TLS 1.3 client that resumes sessions).
fn data_phase(
    role: Role,
    version: mbx_record::TlsVersion,
    keys: HopKeys,
    tickets: Option<TicketSink>,
) -> EndpointDataPhase {
    let mut data = EndpointDataPhase::new(role, version, keys);
    if let Some(sink) = tickets {
        data.keep_tickets(sink);
    }
    data
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    use super::{
        certificate_name, Claims, DataPhase, EndpointCore, EndpointDataPhase, HopKeys, VouchedCheck,
    };
    use mbx_attest::Policy;
    use mbx_engine::Role;
    use mbx_record::{CipherSuite, TlsVersion};
    use mbx_testbed::pki::{LeafSpec, TestPki};

    /// A client core in its data phase on a TLS 1.2 hop whose key has room for one more
    /// record, and whether its session was forgotten.
    fn client_at_its_key_limit() -> (EndpointCore, Arc<AtomicBool>) {
        let (v, suite) = (
            TlsVersion::Tls12,
            CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
        );
        let last = suite.aead.confidentiality_limit() - 1;
        let keys = HopKeys::generate(v, &suite, last, 0).unwrap();
        let mut core = EndpointCore::new(Role::Client, Policy::default(), 0, None, 0, None);
        core.data = Some(DataPhase::Exported(EndpointDataPhase::new(
            Role::Client,
            v,
            keys,
        )));
        let forgotten = Arc::new(AtomicBool::new(false));
        let flag = forgotten.clone();
        core.forget_on_failure(Box::new(move || flag.store(true, Ordering::SeqCst)));
        (core, forgotten)
    }

    /// A session that fails while we send (here: the key reached its limit, which a TLS 1.2 hop
    /// cannot update) is forgotten at once, before anything more is received.
    #[test]
    fn a_failure_on_our_side_forgets_the_session_at_once() {
        let (mut core, forgotten) = client_at_its_key_limit();
        core.write(b"last").unwrap();
        assert!(!forgotten.load(Ordering::SeqCst));
        assert!(core.write(b"one more").is_err());
        assert!(forgotten.load(Ordering::SeqCst));
        // The failure is among the core's events too.
        let failed = std::iter::from_fn(|| core.poll_event()).any(|e| {
            matches!(
                e,
                super::ClientHandshakeEvent::Data(super::EndpointEvent::Failed { .. })
            )
        });
        assert!(failed);
    }

    /// An error that does not fail the session (a KeyUpdate asked of a TLS 1.2 session) leaves
    /// it resumable.
    #[test]
    fn an_error_that_leaves_the_session_usable_forgets_nothing() {
        let (mut core, forgotten) = client_at_its_key_limit();
        assert!(core.update_keys(false).is_err());
        core.write(b"last").unwrap();
        assert!(!forgotten.load(Ordering::SeqCst));
    }

    fn der(spec: &LeafSpec) -> Vec<u8> {
        let pki = TestPki::new("names").unwrap();
        pki.issue(spec).unwrap().cert_der().to_vec()
    }

    #[test]
    fn a_middlebox_is_named_by_its_first_dns_name_else_its_common_name() {
        let spec = LeafSpec::middlebox("mb.test").dns("other.test");
        assert_eq!(certificate_name(&der(&spec)).as_deref(), Some("mb.test"));
        let mut cn_only = LeafSpec::middlebox("cn.test");
        cn_only.dns_names.clear();
        assert_eq!(certificate_name(&der(&cn_only)).as_deref(), Some("cn.test"));
        assert_eq!(certificate_name(b"not a certificate"), None);
    }

    #[test]
    fn control_characters_in_a_name_are_not_printed() {
        let mut spec = LeafSpec::middlebox("mb.test");
        spec.dns_names = vec!["mb\u{1b}[2J.test\n".to_string()];
        assert_eq!(
            certificate_name(&der(&spec)).as_deref(),
            Some("mb?[2J.test?")
        );
    }

    /// A check is relied on until the first of: the policy's age limit, the end of the
    /// certificate it saw, the end of its evidence's collateral (each end is the last valid
    /// second, so the bound is one past it).
    #[test]
    fn a_check_stands_until_the_first_of_its_ends() {
        let policy = Policy {
            resumed_evidence_max_age: 1_000,
            ..Policy::default()
        };
        let claims = |collateral| Claims {
            tee: mbx_attest::TeeKind::Sgx,
            measurement: vec![1; 32],
            signer: vec![2; 32],
            product_id: 0,
            svn: 0,
            debug: false,
            tcb_status: None,
            advisory_ids: Vec::new(),
            tcb_evaluation_data_number: None,
            platform_key: None,
            collateral_valid_until: collateral,
            collateral_issued_at: None,
        };
        let check = |claims, certificate_not_after| VouchedCheck {
            claims,
            checked_at: 10_000,
            certificate_not_after,
            certificate_nonce: None,
        };
        assert_eq!(check(None, u64::MAX).valid_until(&policy), 11_000);
        assert_eq!(check(None, 10_500).valid_until(&policy), 10_501);
        assert_eq!(
            check(Some(claims(None)), 10_500).valid_until(&policy),
            10_501
        );
        assert_eq!(
            check(Some(claims(Some(10_200))), 10_500).valid_until(&policy),
            10_201
        );
        assert_eq!(
            check(Some(claims(Some(u64::MAX))), u64::MAX).valid_until(&policy),
            11_000
        );
        // With a bound on the collateral's age: until the collateral grows too old.
        let bounded = Policy {
            max_collateral_age: 600,
            ..policy.clone()
        };
        let issued = Claims {
            collateral_issued_at: Some(9_900),
            ..claims(None)
        };
        assert_eq!(
            check(Some(issued.clone()), u64::MAX).valid_until(&bounded),
            10_501
        );
        assert_eq!(check(Some(issued), u64::MAX).valid_until(&policy), 11_000);
    }
}
