//! The mbTLS server's handshake with its server-side middleboxes (sans-I/O), which announce
//! themselves (pre-configured: each must, in path order; discovered: one may, if the
//! application approves).
//!
//! The primary handshake runs in a real OpenSSL server engine, paused right after it completes;
//! the client may be legacy (curl, `openssl s_client`) or mbTLS. When a
//! `MiddleboxAnnouncement` arrives on a subchannel the server opens the secondary session there
//! **as TLS client** with its own engine (paper §3.4), checks the middlebox's certificate,
//! approval and exporter-bound evidence, and once its primary handshake is done sends the
//! middlebox the keys of its two hops: the bridge (primary session keys, toward the client) and
//! a fresh hop toward the server. A middlebox that fails a check gets no key material.
//! Announcements precede the ClientHello; a discovering server that saw none keeps the session
//! in OpenSSL (no export, no key log; docs/mbtls.md §6).

use std::sync::Arc;

use mbx_attest::Policy;
use mbx_engine::{ClientContext, OpenSslContext, OpenSslEngine, Role};

use super::demux::{Demux, Piece};
use super::endpoint_core::{Approver, EndpointCore, ServerHandshakeEvent, SessionSummary, Slot};
use super::HandshakeError;

/// Which middlebox the server expects on its side.
#[derive(Clone)]
pub enum ServerMiddlebox {
    /// Configured by the server's operator: must announce itself, and its certificate must be
    /// valid for this name.
    Preconfigured(String),
    /// Several configured by the server's operator, in path order from the client: all must
    /// announce themselves, each with a certificate for its name.
    PreconfiguredPath(Vec<String>),
    /// A middlebox on the path may announce itself; its chain must verify against the secondary
    /// context's roots and the approver must accept it. Without one the session is direct.
    Discover(Approver),
    /// Like [`Discover`](Self::Discover) for up to `n` announcing middleboxes; more
    /// announcements fail the handshake. Each is checked and approved on its own; an excluded
    /// one forwards ciphertext while the others join (docs/mbtls.md §4.5).
    DiscoverUpTo(Approver, u8),
}

impl ServerMiddlebox {
    /// No server-side middlebox: every one that announces itself is excluded, and sessions
    /// run directly on the primary keys (client-side middleboxes are unaffected).
    pub fn none() -> ServerMiddlebox {
        ServerMiddlebox::Discover(std::sync::Arc::new(|_: &[Vec<u8>]| false))
    }
}

/// The server's configuration.
#[derive(Clone)]
pub struct ServerHandshakeConfig {
    /// Primary context: a server with `pause_after_handshake` (so no application record is
    /// consumed before the export), and exportable (the default; checked by
    /// [`ServerHandshake::new`]). Clients, legacy or mbTLS, resume with its tickets or
    /// session IDs, through server-side middleboxes too (they still get fresh keys; whether
    /// their secondary sessions resume is the `secondary` context's matter, docs/mbtls.md
    /// §4.6, §4.7).
    pub primary: Arc<OpenSslContext>,
    /// Context for the secondary sessions: a TLS *client* with the trust roots for middlebox
    /// certificates ([`RustlsClientContext`](mbx_engine::RustlsClientContext), the cheaper
    /// client and what the CLI uses, or an [`OpenSslContext`]).
    pub secondary: Arc<dyn ClientContext>,
    pub middlebox: ServerMiddlebox,
    /// Attestation policy for the middlebox.
    pub policy: Policy,
    /// Current time for evidence verification (seconds since the Unix epoch); the server
    /// driver ([`MbtlsServer`](crate::driver::MbtlsServer)) replaces it for each connection.
    pub now_unix: u64,
    /// Discovering, also take middleboxes that announce themselves after the ClientHello, in
    /// the order of the paper and the spec (ours announce before it, docs/mbtls.md §6). Off, a
    /// session with no announcement before its ClientHello is kept in OpenSSL, which skips the
    /// key log an export needs, and a later announcement fails it; on, every session's primary
    /// engine can export, at the cost of that key log whether or not a middlebox joins.
    /// Pre-configured middleboxes may announce after the ClientHello either way.
    pub announcements_after_hello: bool,
}

impl ServerHandshakeConfig {
    /// What makes every session with this configuration fail, found before any is tried (a
    /// service checks it when it starts and at each reload; [`ServerHandshake::new`] checks it
    /// for each session).
    pub fn check(&self) -> Result<(), HandshakeError> {
        // A session a middlebox announces itself to must be exportable, which the engine has
        // to be from its start (sessions none announced to are made without export instead).
        if !self.primary.exportable() {
            return Err(HandshakeError::Config(
                "an mbTLS server needs an exportable primary context",
            ));
        }
        if !self.primary.pauses_after_handshake() {
            return Err(HandshakeError::Config(
                "the primary context must pause after its handshake (pause_after_handshake), \
                 so that no record is read before the session is exported; \
                 primary_server_config makes such a configuration",
            ));
        }
        super::check_secondary_context(self.secondary.as_ref())?;
        if matches!(self.middlebox, ServerMiddlebox::DiscoverUpTo(_, 0)) {
            return Err(HandshakeError::Config(
                "DiscoverUpTo needs at least 1 (a server that takes no middlebox uses \
                 ServerMiddlebox::none())",
            ));
        }
        Ok(())
    }
}

impl ServerMiddlebox {
    /// The configured name of the middlebox at place `k` on the server's side, counted from
    /// the client (none when the server discovers its middleboxes, or past the configured
    /// ones).
    fn configured_name(&self, k: usize) -> Option<&str> {
        match self {
            ServerMiddlebox::Preconfigured(name) if k == 0 => Some(name),
            ServerMiddlebox::PreconfiguredPath(names) => names.get(k).map(String::as_str),
            _ => None,
        }
    }
}

/// An mbTLS server.
pub struct ServerHandshake {
    cfg: ServerHandshakeConfig,
    core: EndpointCore,
    demux: Demux,
    /// More middleboxes announced themselves than may join: the session fails once our
    /// ServerHello is out, so that the legacy client gets an alert (before it, a middlebox
    /// would take our alert for a legacy server's refusal of its announcement).
    refuse_after_hello: Option<HandshakeError>,
}

impl ServerHandshake {
    pub fn new(cfg: ServerHandshakeConfig) -> Result<Self, HandshakeError> {
        cfg.check()?;
        let (approver, required) = match &cfg.middlebox {
            ServerMiddlebox::Preconfigured(_) => (None, 1),
            ServerMiddlebox::PreconfiguredPath(names) => (None, names.len()),
            ServerMiddlebox::Discover(a) | ServerMiddlebox::DiscoverUpTo(a, _) => {
                (Some(a.clone()), 0)
            }
        };
        let core = EndpointCore::new(
            Role::Server,
            cfg.policy.clone(),
            cfg.now_unix,
            approver,
            required,
            None,
        );
        Ok(ServerHandshake {
            cfg,
            core,
            demux: Demux::new(),
            refuse_after_hello: None,
        })
    }

    /// Bytes from the previous hop (the client or the nearest middlebox). Errors are fatal and
    /// no key material is sent afterwards.
    pub fn receive(&mut self, bytes: &[u8]) -> Result<(), HandshakeError> {
        self.demux.push(bytes);
        let demux = &mut self.demux;
        let cfg = &self.cfg;
        let refuse_after_hello = &mut self.refuse_after_hello;
        let r = self.core.guarded(|core| {
            while let Some(piece) = demux.next_piece()? {
                match piece {
                    Piece::Primary(rec) => {
                        // The ClientHello's first record: every middlebox of ours that
                        // announces itself has done so (announcements precede it, docs/mbtls.md §6).
                        if core.primary.is_none() && !core.data_phase_started() {
                            core.primary = Some(primary_engine(cfg, core)?);
                        }
                        core.primary_record(&rec)?
                    }
                    Piece::Sub { enc, .. } if enc.is_announcement() => {
                        // Ours announce before the ClientHello; a later one can still join
                        // unless this session was already made without export.
                        if core.kept_in_openssl() {
                            return Err(HandshakeError::Protocol(
                                "middlebox announcement after the ClientHello, which this \
                                 discovering server took as ruling middleboxes out (announce \
                                 before it, or let the server take late announcements: \
                                 announcements_after_hello, --announcements-after-hello)",
                            ));
                        }
                        if let Some(refusal) = announced(cfg, core, enc.subchannel)? {
                            refuse_after_hello.get_or_insert(refusal);
                        }
                    }
                    Piece::Sub { enc, .. } if core.has_slot(enc.subchannel) => {
                        core.secondary_in(&enc)?
                    }
                    Piece::Sub { .. } => {
                        return Err(HandshakeError::Protocol("record on an unknown subchannel"))
                    }
                }
                // At once, before any later record of the batch: nothing (no key material)
                // may follow a refusal.
                if core.primary_spoke() {
                    if let Some(refusal) = refuse_after_hello.take() {
                        return Err(refusal);
                    }
                }
            }
            Ok(())
        });
        if r.is_err() {
            self.core.alert_on_own_failure();
        }
        r.map_err(|e| match e {
            // Our slots are made as middleboxes announce themselves: the first missing one
            // is next in the configured list.
            e @ HandshakeError::NotJoined { .. } => {
                let name = self.cfg.middlebox.configured_name(self.core.slots.len());
                HandshakeError::named(name.map(str::to_owned), e)
            }
            e => e,
        })
    }

    /// Application data for the client; held until the data phase starts.
    pub fn write(&mut self, data: &[u8]) -> Result<(), HandshakeError> {
        self.core.write(data)
    }

    /// Ends our direction with close_notify (data phase only).
    pub fn close(&mut self) -> Result<(), HandshakeError> {
        self.core.close()
    }

    /// Data phase: ends the session with a fatal alert of ours (e.g. `internal_error` when
    /// what the session serves failed), which every middlebox passes on to the client. An error
    /// that leaves the session as it was when the session stayed in OpenSSL (no middlebox
    /// joined on our side and none could: OpenSSL sends only its own alerts).
    pub fn abort(
        &mut self,
        description: mbx_engine::AlertDescription,
        what: &'static str,
    ) -> Result<(), HandshakeError> {
        self.core.abort(description, what)
    }

    /// TLS 1.3, data phase: sends a KeyUpdate, after which our records travel under the next
    /// generation of our keys on every hop (each middlebox follows); `request_peer`: the
    /// client is asked to update its keys too. TLS 1.2 has no KeyUpdate: an error that leaves
    /// the session as it was.
    pub fn update_keys(&mut self, request_peer: bool) -> Result<(), HandshakeError> {
        self.core.update_keys(request_peer)
    }

    /// Version, suite and hop key fingerprints, once the data phase started.
    pub fn summary(&self) -> Option<&SessionSummary> {
        self.core.summary()
    }

    /// Ciphertext for the previous hop, in order.
    pub fn take_outgoing(&mut self) -> Vec<u8> {
        self.core.take_outgoing()
    }

    /// Application data received (once ready).
    pub fn take_plaintext(&mut self) -> Vec<u8> {
        self.core.take_plaintext()
    }

    pub fn poll_event(&mut self) -> Option<ServerHandshakeEvent> {
        self.core.poll_event()
    }

    /// True once key material was sent to the middlebox.
    pub fn keys_sent(&self) -> bool {
        self.core.keys_sent()
    }

    /// True once the data phase started (with or without a middlebox).
    pub fn data_phase_started(&self) -> bool {
        self.core.data_phase_started()
    }

    /// Primary-key records dropped because the middlebox re-sends them through its app.
    pub fn discarded_records(&self) -> usize {
        self.core.discarded_records()
    }

    /// True once received data is readable.
    pub fn is_ready(&self) -> bool {
        self.core.is_ready()
    }

    /// What the handshake waits for before its data phase, in words ("middlebox mb.test's
    /// evidence message …", "the client's handshake"), for the error of a handshake that
    /// timed out; `None` once the data phase started.
    pub fn waiting_for(&self) -> Option<String> {
        self.core.waiting_for("the client")
    }

    /// For an idle session (the driver calls it after 2 s without a read): frees the buffers
    /// traffic made grow (the demultiplexer's, the record layer's; OpenSSL's transport when
    /// the session stayed in OpenSSL), keeping any incomplete record. Only ciphertext buffers
    /// are shrunk, so no plaintext is left behind in freed memory.
    pub fn release_idle_buffers(&mut self) {
        self.demux.release_if_empty();
        self.core.release_idle_buffers();
    }

    /// Whether part of a record from the neighbour waits for the rest (in the data phase: a
    /// neighbour that leaves now, even after close_notify from us, cut that record). The
    /// demultiplexer keeps it: the record layer behind it gets whole records only.
    pub fn has_partial_record(&self) -> bool {
        self.demux.buffered() > 0
    }
}

/// The primary engine, made when the ClientHello arrives. Without pre-configured middleboxes,
/// without an announcement before it and unless announcements may follow it
/// ([`ServerHandshakeConfig::announcements_after_hello`]), no middlebox can join this session:
/// the engine is made without export, so OpenSSL keeps the session and skips its key log.
fn primary_engine(
    cfg: &ServerHandshakeConfig,
    core: &EndpointCore,
) -> Result<OpenSslEngine, HandshakeError> {
    Ok(
        if !core.preconfigured() && core.slots.is_empty() && !cfg.announcements_after_hello {
            cfg.primary.engine_without_export()?
        } else {
            cfg.primary.engine()?
        },
    )
}

/// A middlebox announced itself on `subchannel`: open the secondary session there as TLS client.
/// `Ok(Some(refusal))`: one more than may join announced itself; it gets no secondary session,
/// and the session fails with `refusal` once our ServerHello is out.
fn announced(
    cfg: &ServerHandshakeConfig,
    core: &mut EndpointCore,
    subchannel: u8,
) -> Result<Option<HandshakeError>, HandshakeError> {
    // Announcements arrive in path order (the nearest the client first); each is answered by
    // the engine for the next configured name. Each middlebox takes the lowest id not used
    // nearer the client, so ids rise in arrival order; hop keys go by id. An announcement whose
    // id does not rise (announcements are not authenticated: someone on the path swapped or
    // repeated them) would pair a configured name with another position on the path, and the
    // middleboxes would run in an order the server did not set (P4).
    if core.slots.iter().any(|s| s.subchannel >= subchannel) {
        return Err(HandshakeError::Protocol(
            "middlebox announcements out of path order (subchannel ids must rise)",
        ));
    }
    if core.data_phase_started() {
        return Err(HandshakeError::Protocol(
            "middlebox announcement after the handshake",
        ));
    }
    let k = core.slots.len();
    let too_many = Ok(Some(HandshakeError::TooManyMiddleboxes { allowed: k }));
    let name = match &cfg.middlebox {
        ServerMiddlebox::Preconfigured(_) | ServerMiddlebox::PreconfiguredPath(_) => {
            match cfg.middlebox.configured_name(k) {
                Some(name) => Some(name),
                None => return too_many,
            }
        }
        // Discovered: as many as the server allows (the secondary session costs it a client
        // handshake each).
        ServerMiddlebox::Discover(_) if k == 0 => None,
        ServerMiddlebox::DiscoverUpTo(_, n) if k < usize::from(*n) => None,
        ServerMiddlebox::Discover(_) | ServerMiddlebox::DiscoverUpTo(..) => return too_many,
    };
    // Every record of its session travels encapsulated, the ClientHello included.
    let mut engine = cfg
        .secondary
        .client_engine(name, Some(crate::wire::MAX_INNER_PLAINTEXT_LEN))?;
    engine.process()?;
    let mut slot = Slot::new(subchannel, engine, name, cfg.secondary.as_ref());
    slot.start();
    core.slots.push(slot);
    core.flush_secondary(subchannel).map(|()| None)
}
