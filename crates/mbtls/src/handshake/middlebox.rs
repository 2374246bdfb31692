//! A client-side middlebox's handshake (sans-I/O), pre-configured or on the path.
//!
//! Forwards the primary handshake unchanged, answers one optimistic ClientHello from the
//! MiddleboxSupport extension with its own TLS server engine on a subchannel (injected before
//! the primary ServerHello, so no round trip is added), sends exporter-bound attestation
//! evidence over the secondary session right after its Finished (TLS 1.3: as 0.5-RTT data in
//! that same first flight, so P7 holds), and switches to the data phase
//! ([`MiddleboxRelay`]) when the client's key material arrives. Server records that must wait
//! for the keys are held, not dropped (`docs/mbtls.md` §4.1 step 7).

use std::collections::BTreeSet;
use std::sync::Arc;

use mbx_apps::MiddleboxApp;
use mbx_attest::cert_bound::IN_CERTIFICATE;
use mbx_attest::{
    report_data, spki_from_certificate, AttestError, Attester, CertificateEvidence, HexBytes,
    EXPORTER_LABEL, EXPORTER_LEN, REPORT_DATA_LEN,
};
use mbx_engine::{OpenSslContext, OpenSslEngine, TlsConfig, TlsEngine};
use mbx_record::{ContentType, RecordOpener, TlsVersion};
use mbx_wire::handshake::DEFAULT_MAX_HANDSHAKE_LEN;
use mbx_wire::{version, ClientHello, HandshakeDeframer, HandshakeType, Record, ServerHello};

use super::demux::{hello_records, Piece};
use super::kept::Kept;
use super::wires::{self, Core, Wires};
use super::HandshakeError;
use crate::hop::{Input, Side};
use crate::relay::{MiddleboxRelay, RelayEvent};
use crate::wire::{KeyMaterial, MiddleboxSupport, SecondaryMessage, MIDDLEBOX_SUPPORT_EXTENSION};

/// How long a middlebox's secondary sessions seal tickets under one key
/// (`TlsConfig::ticket_key_rotation`): a ticket opens for one to two hours, about an OpenSSL
/// ticket's lifetime (7,200 s) and the endpoints' default `resumed_evidence_max_age`.
pub const MIDDLEBOX_TICKET_KEY_PERIOD: std::time::Duration = std::time::Duration::from_secs(3600);

/// What a middlebox needs for its secondary sessions; built once, cloned per connection.
#[derive(Clone)]
pub struct MiddleboxHandshakeConfig {
    /// Server context with the middlebox's certificate and key, built by [`Self::new`].
    pub tls: Arc<OpenSslContext>,
    /// Produces evidence; `None` sends empty evidence.
    pub attester: Option<Arc<dyn Attester>>,
    /// SubjectPublicKeyInfo of the middlebox's certificate, bound into the evidence; parsed
    /// once here rather than per connection (≈ 8 µs each).
    pub(crate) spki: Arc<[u8]>,
    /// The configuration's `session_tickets`: a TLS 1.3 ticket is made for an endpoint that
    /// asks for one (docs/mbtls.md §4.7).
    pub(crate) session_tickets: bool,
    /// The evidence is in the certificate ([`Self::evidence_in_certificate`]): sessions get
    /// [`IN_CERTIFICATE`] instead of evidence of their own.
    in_certificate: Option<Arc<CertificateBinding>>,
    /// Cut a session this middlebox does not take part in ([`Self::fail_closed`]).
    pub(crate) fail_closed: bool,
}

/// What the evidence in a middlebox's certificate is bound to, as it claims (its signature is
/// the endpoints' to check): the CA's nonce, and the code measurement, for a banner.
#[derive(Debug)]
pub struct CertificateBinding {
    pub nonce: Vec<u8>,
    pub measurement: Vec<u8>,
}

impl MiddleboxHandshakeConfig {
    /// Whether making evidence blocks ([`Attester::blocks`]); never with the evidence in
    /// the certificate, when no session asks the attester for any.
    pub fn attester_blocks(&self) -> bool {
        self.in_certificate.is_none() && self.attester.as_ref().is_some_and(|a| a.blocks())
    }

    /// `tls`: a server configuration with the middlebox's certificate and key; the context is
    /// built from it without export (a middlebox never exports its sessions: no OpenSSL key
    /// log) and without a session cache (it keeps nothing per session: its secondary
    /// sessions resume only by its stateless tickets, when `tls.session_tickets`, one per
    /// session, made when the endpoint asks for one), with ticket keys it replaces every
    /// `tls.ticket_key_rotation` ([`MIDDLEBOX_TICKET_KEY_PERIOD`] when unset: a resumed
    /// session carries no new evidence, so whoever read a ticket key could pose as this
    /// middlebox to an endpoint that resumes, for as long as the key opens tickets), and a
    /// certificate that does not parse is refused here. `attester`: produces
    /// evidence; `None` sends empty evidence (accepted only by policies that do not require
    /// attestation).
    pub fn new(
        tls: &TlsConfig,
        attester: Option<Arc<dyn Attester>>,
    ) -> Result<Self, HandshakeError> {
        let mut tls = tls.clone().without_export();
        tls.session_cache = false;
        tls.ticket_key_rotation
            .get_or_insert(MIDDLEBOX_TICKET_KEY_PERIOD);
        let session_tickets = tls.session_tickets;
        let tls = OpenSslContext::new(&tls)?;
        let leaf = tls
            .certificate_der()
            .ok_or(HandshakeError::Config("a middlebox needs a certificate"))?;
        let spki = spki_from_certificate(leaf)?.into();
        Ok(Self {
            tls: Arc::new(tls),
            attester,
            spki,
            session_tickets,
            in_certificate: None,
            fail_closed: false,
        })
    }

    /// Fail closed: a session this middlebox cannot take part in (a legacy client or server,
    /// a client that offers it no hello or refuses it, a server that does not answer its
    /// announcement) ends with [`HandshakeError::FailClosed`] instead of passing through it
    /// unread, and nothing of its data passes — for a middlebox that must see everything that
    /// goes by (an IDS, a DLP filter). By default such a session passes, as the paper's
    /// middleboxes let it (found in an embedder's trial: an IDS vendor could not refuse what
    /// it could not inspect).
    pub fn fail_closed(mut self) -> Self {
        self.fail_closed = true;
        self
    }

    /// Points every session at the evidence in the middlebox's certificate (the spec's
    /// second binding mode, [`mbx_attest::cert_bound`]) instead of making evidence bound to
    /// each session: no quote per session, and endpoints whose policy accepts the mode check
    /// the certificate's evidence. The certificate must carry it, bound to the certificate's
    /// own key (else every session would fail).
    pub fn evidence_in_certificate(mut self) -> Result<Self, HandshakeError> {
        let leaf = self
            .tls
            .certificate_der()
            .ok_or(HandshakeError::Config("a middlebox needs a certificate"))?;
        let found = CertificateEvidence::from_certificate(leaf)?.ok_or(
            HandshakeError::Attestation(mbx_attest::AttestError::NoCertificateEvidence),
        )?;
        let measurement = found.check_binding(&self.spki)?;
        // The evidence must be for the code this middlebox runs: its attester's own
        // evidence says what that is (a quote: milliseconds, once, at start-up). In a TEE
        // other code could not read the key; outside one (simulated), a changed program
        // would otherwise go on showing the old measurement.
        // Without an attester nothing here could say which code runs (found in review).
        let attester = self.attester.as_ref().ok_or(HandshakeError::Config(
            "evidence in the certificate needs the attester that made it: at start it checks \
             that this middlebox runs the code the evidence claims",
        ))?;
        let (_, running) = attester
            .evidence(&[0; REPORT_DATA_LEN])?
            .claimed_unverified()?;
        if running != measurement {
            return Err(AttestError::CertificateEvidenceForOtherCode {
                claimed: HexBytes::from(measurement.as_slice()).to_string(),
                running: HexBytes::from(running.as_slice()).to_string(),
            }
            .into());
        }
        self.in_certificate = Some(Arc::new(CertificateBinding {
            nonce: found.nonce,
            measurement,
        }));
        Ok(self)
    }

    /// What the evidence in the certificate is bound to, when sessions are pointed at it.
    pub fn certificate_evidence(&self) -> Option<&CertificateBinding> {
        self.in_certificate.as_deref()
    }

    /// The SubjectPublicKeyInfo (DER) the evidence is bound to.
    pub fn spki(&self) -> &[u8] {
        &self.spki
    }
}

/// Progress reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MiddleboxHandshakeEvent {
    /// Server-side middlebox: our MiddleboxAnnouncement went out on this subchannel.
    Announced { subchannel: u8 },
    /// Our secondary ServerHello went out on this subchannel.
    Joined { subchannel: u8 },
    /// Not taking part (no MiddleboxSupport, no hello left, unsupported version): forwarding
    /// bytes unchanged.
    Passive(&'static str),
    /// The endpoint refused us (our evidence, its approval) and said why, in its words; it
    /// closes the secondary session next, or ends the whole session.
    RefusedByEndpoint(String),
    /// Evidence was sent, right after our secondary Finished (TLS 1.3: 0.5-RTT data, before
    /// the client's Finished; TLS 1.2: after it). Empty after [`Self::Resumed`].
    EvidenceSent,
    /// Our secondary session resumed one of our tickets: no new evidence is made (paper
    /// §3.5), the endpoint relies on the check it made when we issued the ticket.
    Resumed,
    /// Key material arrived; the data phase runs.
    KeysInstalled,
    /// An event of the data phase.
    Relay(RelayEvent),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Before the primary ServerHello.
    Hello,
    /// Our secondary session is running.
    Joined,
    /// Not taking part: forward everything raw.
    Passive,
}

/// A secondary engine prepared ahead of the primary ServerHello.
struct Early {
    engine: OpenSslEngine,
    /// TLS 1.3 secondary session: the evidence is already written behind our Finished.
    evidence_written: bool,
}

/// A middlebox between the client and the next hop toward the server.
pub struct MiddleboxHandshake<A: MiddleboxApp> {
    cfg: MiddleboxHandshakeConfig,
    app: Option<A>,
    mode: Mode,
    client_hello: HandshakeDeframer,
    hellos: Option<Vec<Vec<u8>>>,
    /// The ClientHello carried the MiddleboxSupport extension (a legacy client's has none).
    client_speaks_mbtls: bool,
    server_hello: HandshakeDeframer,
    /// Server records before (and including) the one completing the ServerHello.
    pending_sh: Vec<Record>,
    version: Option<TlsVersion>,
    /// Subchannels used by middleboxes nearer the server.
    used_ids: BTreeSet<u8>,
    subchannel: u8,
    /// We answered an optimistic hello (even if we later went passive).
    joined: bool,
    engine: Option<OpenSslEngine>,
    /// Prepared by [`prepare`](MiddleboxHandshake::prepare) while the primary ClientHello
    /// travels to the server: the secondary engine for subchannel 0 with the optimistic hello
    /// processed, its flight (TLS 1.3: evidence included) still inside it, nothing sent. Used
    /// at the ServerHello if subchannel 0 is ours, dropped otherwise.
    early: Option<Early>,
    /// `prepare` has work to do (a ClientHello with optimistic hellos arrived).
    prepare_pending: bool,
    evidence_sent: bool,
    /// TLS 1.2: the server's ChangeCipherSpec went by; the next record is its Finished.
    after_ccs: bool,
    /// Hold server records from now on (they need the keys).
    hold: bool,
    held: Vec<Record>,
    /// TLS 1.3: encrypted server records forwarded raw, to find 0.5-RTT records later.
    copies: Vec<Record>,
    /// What `held` and `copies` keep together, within its bound.
    kept: Kept,
    wires: Wires<A>,
}

/// Why the server's records we keep until our keys arrive passed their bound.
const TOO_MUCH_SERVER_DATA: &str = "too much server data before the client's key material";

/// The most records a primary ServerHello may come in (each is kept until it ends).
const MAX_SERVER_HELLO_RECORDS: usize = 256;

impl<A: MiddleboxApp> MiddleboxHandshake<A> {
    pub fn new(cfg: MiddleboxHandshakeConfig, app: A) -> Result<Self, HandshakeError> {
        Ok(MiddleboxHandshake {
            cfg,
            app: Some(app),
            mode: Mode::Hello,
            client_hello: HandshakeDeframer::new(DEFAULT_MAX_HANDSHAKE_LEN),
            hellos: None,
            client_speaks_mbtls: false,
            server_hello: HandshakeDeframer::new(DEFAULT_MAX_HANDSHAKE_LEN),
            pending_sh: Vec::new(),
            version: None,
            used_ids: BTreeSet::new(),
            subchannel: 0,
            joined: false,
            engine: None,
            early: None,
            prepare_pending: false,
            evidence_sent: false,
            after_ccs: false,
            hold: false,
            held: Vec::new(),
            copies: Vec::new(),
            kept: Kept::default(),
            wires: Wires::new(Side::Server),
        })
    }

    /// Bytes from the neighbour on `from`. An error is fatal: the driver closes both
    /// connections (no key material was or will be used).
    pub fn receive(&mut self, from: Side, bytes: &[u8]) -> Result<(), HandshakeError> {
        wires::receive(self, from, Input::Borrowed(bytes))
    }

    /// Like [`receive`](Self::receive), but in the data phase the records are decrypted where
    /// they lie in `bytes` (no copy; afterwards `bytes` holds no plaintext and its contents are
    /// unspecified), and those the app lets through unchanged may be passed on where they lie
    /// ([`MiddleboxRelay::receive_lending`](crate::MiddleboxRelay::receive_lending)): the
    /// returned range of `bytes` is to be sent toward `from.other()` right after what
    /// [`append_outgoing`](Self::append_outgoing) gives for that side now.
    pub fn receive_lending(
        &mut self,
        from: Side,
        bytes: &mut [u8],
    ) -> Result<Option<std::ops::Range<usize>>, HandshakeError> {
        wires::receive_lending(self, from, bytes)
    }

    fn client_piece(&mut self, piece: Piece) -> Result<(), HandshakeError> {
        match piece {
            Piece::Sub { enc, .. }
                if self.mode == Mode::Joined && enc.subchannel == self.subchannel =>
            {
                self.secondary_in(&enc.inner)
            }
            // Our own subchannel after we left the session (the client's closing records).
            Piece::Sub { enc, .. } if self.joined && enc.subchannel == self.subchannel => Ok(()),
            Piece::Sub { raw, .. } => {
                self.wires.out_server.extend_from_slice(raw.as_bytes());
                Ok(())
            }
            Piece::Primary(rec) => {
                if self.hellos.is_none() && self.mode == Mode::Hello {
                    self.look_for_client_hello(&rec)?;
                }
                // TLS 1.3: the client's first encrypted record is its Finished, sent after it
                // processed the server's whole flight: what the server sends from now on is
                // application epoch and must wait for our keys.
                if self.mode == Mode::Joined
                    && self.version == Some(TlsVersion::Tls13)
                    && rec.content_type() == ContentType::APPLICATION_DATA
                {
                    self.hold = true;
                }
                self.wires.out_server.extend_from_slice(rec.as_bytes());
                Ok(())
            }
        }
    }

    fn look_for_client_hello(&mut self, rec: &Record) -> Result<(), HandshakeError> {
        if rec.content_type() != ContentType::HANDSHAKE {
            return Ok(());
        }
        self.client_hello.push(rec.payload());
        if let Some(msg) = self.client_hello.next_message()? {
            let ch = ClientHello::parse_message(msg.as_bytes())?;
            let support = ch.extension(MIDDLEBOX_SUPPORT_EXTENSION);
            self.client_speaks_mbtls = support.is_some();
            let hellos = match support {
                Some(data) => MiddleboxSupport::parse(data)?.client_hellos,
                None => Vec::new(),
            };
            self.prepare_pending = !hellos.is_empty();
            self.hellos = Some(hellos);
        }
        Ok(())
    }

    /// True when [`prepare`](Self::prepare) has work to do.
    pub fn wants_prepare(&self) -> bool {
        self.prepare_pending
    }

    /// Optional, for drivers: answers the optimistic ClientHello of subchannel 0 ahead of the
    /// primary ServerHello (TLS engine, key share, signature and, TLS 1.3, evidence), so that
    /// this work is done while the primary ClientHello travels to the server instead of when
    /// the server's flight is here. Call it after sending what [`receive`](Self::receive)
    /// produced (the ClientHello must not wait for it). Nothing is sent before the ServerHello:
    /// what goes on the wire, and when, is the same as without it; a prepared answer that turns
    /// out not to be ours (another middlebox nearer the server took subchannel 0, the primary
    /// session is not one we join) is dropped unsent. Failures here are not reported: the work
    /// is then redone, and fails, at the ServerHello.
    pub fn prepare(&mut self) {
        if !core::mem::take(&mut self.prepare_pending) || self.mode != Mode::Hello {
            return;
        }
        let Some(hello) = self.hellos.as_ref().and_then(|h| h.first()) else {
            return;
        };
        let Ok(mut engine) = secondary_engine_for(&self.cfg, hello) else {
            return;
        };
        let evidence_written = engine.can_write_half_rtt();
        if evidence_written && write_evidence(&self.cfg, &mut engine).is_err() {
            return;
        }
        self.early = Some(Early {
            engine,
            evidence_written,
        });
    }

    fn server_piece(&mut self, piece: Piece) -> Result<(), HandshakeError> {
        match piece {
            Piece::Sub { enc, .. } if self.joined && enc.subchannel == self.subchannel => {
                // Our secondary session is between the client and us: a record on it from the
                // server's side is forged. Passed on it would break that session, and a client
                // that only approved us would go on without us.
                Err(HandshakeError::Protocol(
                    "a record on this middlebox's subchannel came from the server's side",
                ))
            }
            Piece::Sub { enc, raw } => {
                if self.mode == Mode::Hello {
                    self.used_ids.insert(enc.subchannel);
                }
                self.wires.out_client.extend_from_slice(raw.as_bytes());
                Ok(())
            }
            Piece::Primary(rec) => match self.mode {
                Mode::Passive => {
                    self.wires.out_client.extend_from_slice(rec.as_bytes());
                    Ok(())
                }
                Mode::Hello => self.before_server_hello(rec),
                Mode::Joined => self.server_record(rec),
            },
        }
    }

    fn before_server_hello(&mut self, rec: Record) -> Result<(), HandshakeError> {
        if rec.content_type() != ContentType::HANDSHAKE {
            // An alert before the ServerHello: the handshake is failing; pass it on.
            self.wires.note_server_alert(&rec);
            self.wires.out_client.extend_from_slice(rec.as_bytes());
            return Ok(());
        }
        self.server_hello.push(rec.payload());
        // A ServerHello takes a record or two; a server that splits it over more only makes
        // us keep more records until it ends.
        if self.pending_sh.len() == MAX_SERVER_HELLO_RECORDS {
            return Err(HandshakeError::Protocol(
                "the server's ServerHello came in too many records",
            ));
        }
        self.pending_sh.push(rec);
        let Some(msg) = self.server_hello.next_message()? else {
            return Ok(());
        };
        if msg.typ() != HandshakeType::SERVER_HELLO {
            return Err(HandshakeError::Protocol(
                "first server message is not a ServerHello",
            ));
        }
        let sh = ServerHello::parse_message(msg.as_bytes())?;
        let pending = core::mem::take(&mut self.pending_sh);
        if sh.is_hello_retry_request() {
            // TLS 1.3 HelloRetryRequest: the client answers with a second ClientHello and the
            // real ServerHello follows; we join on that one. The optimistic hellos of the first
            // ClientHello stay valid (they open the secondary sessions, which the retry of the
            // primary one does not touch), and so does a prepared answer.
            for rec in pending {
                self.wires.out_client.extend_from_slice(rec.as_bytes());
            }
            self.server_hello = HandshakeDeframer::new(DEFAULT_MAX_HANDSHAKE_LEN);
            return Ok(());
        }
        let joined = self.join(&sh);
        self.early = None;
        self.prepare_pending = false;
        if let Err(why) = joined? {
            self.go_passive(why);
        }
        for rec in pending {
            match self.mode {
                Mode::Joined => self.server_record(rec)?,
                _ => self.wires.out_client.extend_from_slice(rec.as_bytes()),
            }
        }
        Ok(())
    }

    /// Answer an optimistic ClientHello; the inner `Err` says why we stay passive, the outer
    /// one is fatal (the attester failed).
    fn join(&mut self, sh: &ServerHello<'_>) -> Result<Result<(), &'static str>, HandshakeError> {
        self.version = match sh.selected_version() {
            Ok(version::TLS1_3) => Some(TlsVersion::Tls13),
            Ok(version::TLS1_2) => Some(TlsVersion::Tls12),
            _ => return Ok(Err("primary version is neither TLS 1.2 nor TLS 1.3")),
        };
        let early = self.early.take();
        let (mut engine, half_rtt) = match early {
            // Prepared for subchannel 0, and subchannel 0 is ours.
            Some(e) if self.used_ids.is_empty() => {
                self.hellos = None;
                self.subchannel = 0;
                (e.engine, e.evidence_written)
            }
            _ => {
                let Some(mut engine) = (match self.secondary_engine() {
                    Ok(e) => e,
                    Err(why) => return Ok(Err(why)),
                }) else {
                    // Which it is tells the operator where to look (found in an operator
                    // trial: curl's sessions read "no optimistic ClientHello left for us").
                    return Ok(Err(match self.client_speaks_mbtls {
                        false => "the client does not speak mbTLS (a legacy client: no MiddleboxSupport extension)",
                        true => "no optimistic ClientHello left for us (the client offered none, or fewer than the middleboxes nearer it took)",
                    }));
                };
                // TLS 1.3 secondary session: our Finished is out, so the evidence can leave in
                // the same flight as 0.5-RTT data (docs/mbtls.md §4.1 step 4); the client gets
                // it together with our Finished and can release its key material in its second
                // flight (P7).
                let half_rtt = engine.can_write_half_rtt();
                if half_rtt {
                    write_evidence(&self.cfg, &mut engine)?;
                }
                (engine, half_rtt)
            }
        };
        if self
            .wires
            .send_to_endpoint(self.subchannel, &mut engine)
            .is_err()
        {
            return Ok(Err("secondary record too large for a subchannel"));
        }
        self.engine = Some(engine);
        self.joined = true;
        self.mode = Mode::Joined;
        self.wires
            .events
            .push_back(MiddleboxHandshakeEvent::Joined {
                subchannel: self.subchannel,
            });
        if half_rtt {
            self.evidence_sent = true;
            let resumed = self.engine.as_ref().is_some_and(|e| e.session_reused());
            wires::evidence_sent(&mut self.wires.events, resumed);
        }
        Ok(Ok(()))
    }

    /// Our secondary server engine with the optimistic hello for our subchannel processed;
    /// `Ok(None)` if no hello is left for us.
    fn secondary_engine(&mut self) -> Result<Option<OpenSslEngine>, &'static str> {
        let hellos = self.hellos.take().unwrap_or_default();
        let id = (0..=u8::MAX)
            .find(|id| !self.used_ids.contains(id))
            .ok_or("no free subchannel")?;
        let Some(hello) = hellos.get(usize::from(id)) else {
            return Ok(None);
        };
        let engine = secondary_engine_for(&self.cfg, hello)?;
        self.subchannel = id;
        Ok(Some(engine))
    }

    /// A primary server record while joined and without keys: forward or hold.
    fn server_record(&mut self, rec: Record) -> Result<(), HandshakeError> {
        if self.hold {
            self.kept.record(&rec, TOO_MUCH_SERVER_DATA)?;
            self.held.push(rec);
            return Ok(());
        }
        match self.version {
            Some(TlsVersion::Tls12) => {
                if self.after_ccs {
                    // This is the server's Finished; everything after it is application data.
                    self.hold = true;
                } else {
                    self.wires.note_server_alert(&rec);
                }
                if rec.content_type() == ContentType::CHANGE_CIPHER_SPEC {
                    self.after_ccs = true;
                }
            }
            _ => {
                if rec.content_type() == ContentType::APPLICATION_DATA {
                    self.kept.record(&rec, TOO_MUCH_SERVER_DATA)?;
                    self.copies.push(rec.clone());
                }
            }
        }
        self.wires.out_client.extend_from_slice(rec.as_bytes());
        Ok(())
    }

    fn secondary_in(&mut self, inner: &Record) -> Result<(), HandshakeError> {
        let Some(engine) = self.engine.as_mut() else {
            return Err(HandshakeError::Protocol("subchannel record before joining"));
        };
        engine.feed(inner.as_bytes());
        let processed = engine.process();
        self.wires.send_to_endpoint(self.subchannel, engine)?;
        if let Err(e) = processed {
            // The client refused us (certificate, approval) or the session broke: we get no
            // keys, so we can only pass ciphertext on.
            self.go_passive(wires::why_secondary_failed(&e, Side::Client));
            return Ok(());
        }
        if engine.is_handshaking() {
            return Ok(());
        }
        if !self.evidence_sent && !engine.peer_closed() {
            // TLS 1.2 secondary session: the evidence follows our Finished in its flight.
            write_evidence(&self.cfg, engine)?;
            self.wires.send_to_endpoint(self.subchannel, engine)?;
            self.evidence_sent = true;
            wires::evidence_sent(&mut self.wires.events, engine.session_reused());
        }
        match wires::endpoint_turn(&mut self.wires, engine, Side::Client)? {
            wires::EndpointTurn::Keys(km, path) => self.install(*km, path),
            wires::EndpointTurn::Closed(why) => {
                self.go_passive(why);
                Ok(())
            }
            wires::EndpointTurn::Waiting => Ok(()),
        }
    }

    /// Stop taking part: release what was held and forward everything unchanged from now on.
    /// Failing closed, nothing held passes, and the session ends once this piece is done.
    fn go_passive(&mut self, why: &'static str) {
        self.mode = Mode::Passive;
        self.engine = None;
        self.copies.clear();
        if self.cfg.fail_closed {
            self.held.clear();
            self.wires.fail_closed = Some(why);
        }
        for rec in self.held.drain(..) {
            self.wires.out_client.extend_from_slice(rec.as_bytes());
        }
        self.wires
            .events
            .push_back(MiddleboxHandshakeEvent::Passive(why));
    }

    /// `path`: the endpoint's path message (a farther middlebox joined too; a ticket is
    /// wanted).
    fn install(&mut self, km: KeyMaterial, path: wires::PathNews) -> Result<(), HandshakeError> {
        let far_joined = path.far;
        let version = self.version.ok_or(HandshakeError::Protocol("no version"))?;
        if km.version != version {
            return Err(HandshakeError::Protocol(
                "key material for another TLS version",
            ));
        }
        let app = self
            .app
            .take()
            .ok_or(HandshakeError::Protocol("key material twice"))?;
        // TLS 1.3: raw-forwarded server records from the first one that opens under the bridge
        // keys on were application epoch (sent with the server's Finished): the client dropped
        // them and they go through the app now. Handshake-key records fail to open.
        let first_app = match version {
            TlsVersion::Tls13 => {
                first_application_record(version, &km.toward_server.s2c, &self.copies)
            }
            TlsVersion::Tls12 => self.copies.len(),
        };
        let mut replay: Vec<Record> = self.copies.drain(..).skip(first_app).collect();
        if far_joined {
            // Everything from the server side so far is under the bridge keys and will come
            // again, through the neighbour's app, after its marker.
            replay.clear();
            self.held.clear();
            self.wires.awaiting_neighbour_marker = true;
        }
        let relay = MiddleboxRelay::new(km, app)?;
        // The marker: our secondary session's close_notify. Everything we send the client after
        // it is under the client-side hop's keys.
        if let Some(engine) = self.engine.as_mut() {
            let ticket = path.ticket && self.cfg.session_tickets;
            self.wires.send_marker(self.subchannel, engine, ticket)?;
        }
        self.engine = None;
        replay.append(&mut self.held);
        self.wires.start_relay(relay, Side::Server, &replay);
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

    /// True while the driver should not read from `from`: the server's records kept for the
    /// keys reached [`PAUSE_READING_AT`](super::PAUSE_READING_AT) and the keys (from the
    /// client's side) have not come. Reading resumes with them.
    pub fn waits_before_reading(&self, from: Side) -> bool {
        from == Side::Server && !self.keys_installed() && self.kept.asks_for_a_pause()
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
            Mode::Hello if self.hellos.is_none() => Some("the client's ClientHello"),
            Mode::Hello => Some("the server's ServerHello"),
            Mode::Joined if self.engine.as_ref().is_some_and(|e| e.is_handshaking()) => {
                Some("the client to finish our secondary handshake")
            }
            Mode::Joined => Some("the client's key material"),
        }
    }

    /// True once key material arrived and the data phase runs.
    pub fn keys_installed(&self) -> bool {
        self.wires.relay.is_some()
    }

    /// The fatal alert the server sent in the clear before this middlebox's keys (and that
    /// it passed on), if any: why a handshake the server then closed ended.
    pub fn server_alert_passed_on(&self) -> Option<u8> {
        self.wires.server_alert
    }

    /// True while this middlebox, in the session and without its keys, keeps server records
    /// that its keys may have to pass on (TLS 1.2: those after the server's Finished; TLS 1.3:
    /// any encrypted one, handshake-epoch ones included, which went on raw: which of them are
    /// application epoch only the keys tell). A server that fails after its Finished sends its
    /// fatal alert so and closes at once: its close must wait for the keys, or the alert is
    /// lost. A TLS 1.3 handshake that fails for good (no keys will come) thus has its close
    /// passed on up to the driver's wait later.
    pub fn keeps_server_records_for_its_keys(&self) -> bool {
        self.mode == Mode::Joined
            && !self.keys_installed()
            && !(self.held.is_empty() && self.copies.is_empty())
    }

    /// The data phase, once keys are installed.
    pub fn relay(&self) -> Option<&MiddleboxRelay<A>> {
        self.wires.relay.as_ref()
    }
}

impl<A: MiddleboxApp> Core<A> for MiddleboxHandshake<A> {
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

/// A secondary server engine (no tickets, 0.5-RTT enabled) that processed `hello`.
fn secondary_engine_for(
    cfg: &MiddleboxHandshakeConfig,
    hello: &[u8],
) -> Result<OpenSslEngine, &'static str> {
    let mut engine = wires::secondary_server_engine(cfg)?;
    let records = hello_records(hello).map_err(|_| "optimistic ClientHello too large")?;
    engine.feed(&records);
    engine
        .process()
        .map_err(|_| "optimistic ClientHello refused by our TLS engine")?;
    Ok(engine)
}

/// Sends our evidence message as secondary application data: exporter-bound evidence, the
/// `IN_CERTIFICATE` marker when the evidence is in our certificate, or an empty message on a
/// resumed session; 0.5-RTT data right after our Finished (TLS 1.3) or ordinary data after
/// the handshake (TLS 1.2). The records stay
/// in the engine's outgoing buffer for the caller to wrap.
pub(super) fn write_evidence(
    cfg: &MiddleboxHandshakeConfig,
    engine: &mut OpenSslEngine,
) -> Result<(), HandshakeError> {
    let label = core::str::from_utf8(EXPORTER_LABEL)
        .map_err(|_| HandshakeError::Config("exporter label"))?;
    let evidence = match &cfg.attester {
        // Resumed: none (paper §3.5). Only we can open our tickets (the key never leaves this
        // process), and the endpoint keeps a ticket only after checking the evidence of the
        // session we issued it in.
        _ if engine.session_reused() => Vec::new(),
        // The session proves we hold the key; the certificate says the TEE made it.
        _ if cfg.in_certificate.is_some() => IN_CERTIFICATE.to_vec(),
        Some(a) => {
            let binder = engine.export_keying_material(label, None, EXPORTER_LEN)?;
            a.evidence(&report_data(&cfg.spki, &binder))?.to_bytes()
        }
        None => Vec::new(),
    };
    let msg = SecondaryMessage::Evidence(evidence).encode()?;
    if engine.can_write_half_rtt() {
        engine.write_half_rtt(&msg)?;
    } else {
        engine.write_plaintext(&msg)?;
    }
    Ok(())
}

/// Index of the first record in `copies` that opens under `keys` (one direction of the bridge)
/// at its next sequence number: records still under handshake keys fail to open. `copies.len()`
/// when none does.
pub(super) fn first_application_record(
    version: TlsVersion,
    keys: &crate::keys::DirectionKeys,
    copies: &[Record],
) -> usize {
    copies
        .iter()
        .position(|c| {
            RecordOpener::new(version, keys.keys.clone(), keys.next_seq)
                .open(c.as_bytes())
                .is_ok()
        })
        .unwrap_or(copies.len())
}
