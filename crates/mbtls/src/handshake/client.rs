//! The client's handshake with one client-side middlebox (sans-I/O): pre-configured (must join)
//! or discovered on the path (joins only if the application approves it).
//!
//! The primary handshake runs in a real OpenSSL client engine (paused right after the
//! handshake); the secondary handshake with the middlebox runs in an independent client engine
//! (rustls or OpenSSL) whose ClientHello travels inside the MiddleboxSupport extension. Key material is sent
//! only after the middlebox's certificate (engine), the application's approval (discovered
//! middleboxes) and its exporter-bound evidence (policy) were all checked and the primary
//! handshake finished. A discovered middlebox that fails any check is excluded: the client
//! closes the secondary session without key material, the middlebox falls back to forwarding
//! ciphertext it cannot read, and the session continues on the primary keys.

use std::sync::Arc;

use mbx_attest::Policy;
use mbx_engine::{ClientContext, OpenSslContext, Role, TlsEngine};
use mbx_record::ContentType;
use mbx_wire::{HandshakeDeframer, HandshakeType, Record, ServerHello};

use super::demux::{Demux, Piece};
use super::endpoint_core::{Approver, ClientHandshakeEvent, EndpointCore, SessionSummary, Slot};
use super::HandshakeError;
use crate::wire::{MiddleboxSupport, MAX_INNER_PLAINTEXT_LEN, MIDDLEBOX_SUPPORT_EXTENSION};

/// Which middleboxes the client expects.
#[derive(Clone)]
pub enum ClientMiddlebox {
    /// Configured a priori: must join, and its certificate must be valid for this name (sent in
    /// the extension's middlebox list).
    Preconfigured(String),
    /// Several configured a priori, in path order from the client (the client connects to the
    /// first): all must join, each with a certificate for its name.
    PreconfiguredPath(Vec<String>),
    /// Any on-path middlebox may offer to join; its chain must verify against the secondary
    /// context's roots and the approver must accept it. With none on the path the session is
    /// direct: if none answered by the primary ServerHello, the session gives up its export
    /// there and stays in OpenSSL (no key log; docs/mbtls.md §6).
    Discover(Approver),
    /// Like [`Discover`](Self::Discover) for up to `n` middleboxes on the path (`n` ≥ 1): the
    /// extension carries `n` optimistic ClientHellos (each costs a key share). Each middlebox is
    /// checked and approved on its own; an excluded one forwards ciphertext while the others
    /// join (docs/mbtls.md §4.5).
    DiscoverUpTo(Approver, u8),
    /// No client-side middlebox: none configured and discovery off (an mbTLS client that
    /// allows server-side middleboxes only). The MiddleboxSupport extension carries no
    /// optimistic ClientHello, so no secondary engine or key share is made; a middlebox on the
    /// path has no hello to answer and stays passive. Server-side middleboxes are unaffected.
    Disabled,
}

/// The client's configuration for its client-side middleboxes.
#[derive(Clone)]
pub struct ClientHandshakeConfig {
    /// Primary context: must register [`MIDDLEBOX_SUPPORT_EXTENSION`] as a custom extension and
    /// set `pause_after_handshake` (so no application record is consumed before the export).
    /// With [`ClientMiddlebox::Disabled`] it may be built `without_export()`: the session then
    /// stays in OpenSSL, which spares the client OpenSSL's key log (docs/mbtls.md §6); every
    /// other mode needs export (checked by [`ClientHandshake::new`]), though a discovering
    /// client whose middleboxes all stayed silent gives it up at the primary ServerHello.
    pub primary: Arc<OpenSslContext>,
    /// The server's name (SNI, certificate check). It is the one checked: the name `primary`
    /// was built with ([`primary_client_config`](super::primary_client_config)) is not.
    pub server_name: String,
    /// Context for the secondary sessions (trust roots for middlebox certificates): a
    /// [`RustlsClientContext`](mbx_engine::RustlsClientContext) (the cheaper client, what the
    /// CLI uses) or an [`OpenSslContext`].
    pub secondary: Arc<dyn ClientContext>,
    pub middlebox: ClientMiddlebox,
    /// Attestation policy for the middlebox.
    pub policy: Policy,
    /// Current time for evidence verification (seconds since the Unix epoch); the client
    /// driver ([`MbtlsClient::connect`](crate::driver::MbtlsClient::connect)) replaces it for
    /// each session.
    pub now_unix: u64,
}

impl ClientHandshakeConfig {
    /// What makes every session with this configuration fail, found before any is tried (a
    /// service checks it when it starts and at each reload; [`ClientHandshake::new`] checks it
    /// for each session).
    pub fn check(&self) -> Result<(), HandshakeError> {
        let slots = match &self.middlebox {
            ClientMiddlebox::Preconfigured(_) | ClientMiddlebox::Discover(_) => 1,
            ClientMiddlebox::PreconfiguredPath(path) => path.len(),
            ClientMiddlebox::DiscoverUpTo(_, n) => usize::from(*n),
            ClientMiddlebox::Disabled => 0,
        };
        let disabled = matches!(self.middlebox, ClientMiddlebox::Disabled);
        if (slots == 0 && !disabled) || slots > usize::from(u8::MAX) {
            return Err(HandshakeError::Config("1 to 255 client-side middleboxes"));
        }
        super::check_secondary_context(self.secondary.as_ref())?;
        // Found by an embedder: both were documented, neither checked, and a context without
        // the pause worked until a record came in the handshake's last read.
        if !self
            .primary
            .registers_extension(crate::MIDDLEBOX_SUPPORT_EXTENSION)
        {
            return Err(HandshakeError::Config(
                "the primary context must register the MiddleboxSupport extension \
                 (custom_extensions: CustomExtension::new(MIDDLEBOX_SUPPORT_EXTENSION)); \
                 primary_client_config makes such a configuration",
            ));
        }
        if !self.primary.pauses_after_handshake() {
            return Err(HandshakeError::Config(
                "the primary context must pause after its handshake (pause_after_handshake), \
                 so that no record is read before the session is exported; \
                 primary_client_config makes such a configuration",
            ));
        }
        if !disabled && !self.primary.exportable() {
            return Err(HandshakeError::Config(
                "a client with client-side middleboxes needs an exportable primary context",
            ));
        }
        Ok(())
    }
}

/// A client with its client-side middleboxes (pre-configured path, or discovered ones).
pub struct ClientHandshake {
    core: EndpointCore,
    demux: Demux,
    /// Discovery: the primary context, kept until the primary ServerHello shows whether a
    /// middlebox answered; if none did, the session gives up its export there.
    discovering: Option<Arc<OpenSslContext>>,
}

impl ClientHandshake {
    /// Starts the handshake; the first flight is in [`take_outgoing`](Self::take_outgoing).
    pub fn new(cfg: ClientHandshakeConfig) -> Result<Self, HandshakeError> {
        cfg.check()?;
        let (names, approver) = match &cfg.middlebox {
            ClientMiddlebox::Preconfigured(name) => (vec![Some(name.clone())], None),
            ClientMiddlebox::PreconfiguredPath(path) => {
                (path.iter().cloned().map(Some).collect(), None)
            }
            ClientMiddlebox::Discover(a) => (vec![None], Some(a.clone())),
            ClientMiddlebox::DiscoverUpTo(a, n) => (vec![None; usize::from(*n)], Some(a.clone())),
            ClientMiddlebox::Disabled => (Vec::new(), None),
        };
        // Subchannel i is answered by the i-th middlebox counted from the server (ids are taken
        // as the primary ServerHello passes them), so hello i is made for that middlebox's name.
        let mut slots = Vec::with_capacity(names.len());
        let mut hellos = Vec::with_capacity(names.len());
        for (id, name) in names.iter().rev().enumerate() {
            // Its records after the ClientHello travel encapsulated.
            let mut engine = cfg
                .secondary
                .client_engine(name.as_deref(), Some(MAX_INNER_PLAINTEXT_LEN))?;
            hellos.push(engine.take_client_hello()?);
            let id = u8::try_from(id).map_err(|_| HandshakeError::Config("subchannel id"))?;
            slots.push(Slot::new(
                id,
                engine,
                name.as_deref(),
                cfg.secondary.as_ref(),
            ));
        }
        let ext = MiddleboxSupport {
            client_hellos: hellos,
            middleboxes: names.iter().flatten().cloned().collect(),
        }
        .encode()?;
        let mut primary = cfg.primary.engine_for(Some(&cfg.server_name))?;
        primary.set_extension_payload(MIDDLEBOX_SUPPORT_EXTENSION, ext)?;
        primary.process()?;
        let out = primary.take_outgoing();
        let required = if approver.is_none() { names.len() } else { 0 };
        let discovering = approver.is_some().then(|| cfg.primary.clone());
        let mut core = EndpointCore::new(
            Role::Client,
            cfg.policy,
            cfg.now_unix,
            approver,
            required,
            Some(primary),
        );
        core.slots = slots;
        core.out = out;
        if cfg.primary.resumes_sessions() {
            let (ctx, name) = (cfg.primary.clone(), cfg.server_name.clone());
            core.forget_on_failure(Box::new(move || ctx.forget_sessions(&name)));
        }
        Ok(ClientHandshake {
            discovering,
            core,
            demux: Demux::new(),
        })
    }

    /// Bytes from the next hop. Errors are fatal and no key material is sent afterwards.
    pub fn receive(&mut self, bytes: &[u8]) -> Result<(), HandshakeError> {
        self.demux.push(bytes);
        let (demux, discovering) = (&mut self.demux, &mut self.discovering);
        self.core.guarded(|core| {
            while let Some(piece) = demux.next_piece()? {
                match piece {
                    Piece::Sub { enc, .. } => core.secondary_in(&enc)?,
                    Piece::Primary(rec) => {
                        if discovering.is_some() && starts_with_server_hello(&rec) {
                            if let Some(ctx) = discovering.take() {
                                core.forgo_export_if_alone(&ctx)?;
                            }
                        }
                        core.primary_record(&rec)?
                    }
                }
            }
            Ok(())
        })
    }

    /// Application data for the server; held until the data phase starts.
    pub fn write(&mut self, data: &[u8]) -> Result<(), HandshakeError> {
        self.core.write(data)
    }

    /// Ends our direction with close_notify (data phase only).
    pub fn close(&mut self) -> Result<(), HandshakeError> {
        self.core.close()
    }

    /// Data phase: ends the session with a fatal alert of ours (e.g. `internal_error` when
    /// what the session serves failed), which every middlebox passes on to the server. An error
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
    /// server is asked to update its keys too. TLS 1.2 has no KeyUpdate: an error that leaves
    /// the session as it was.
    pub fn update_keys(&mut self, request_peer: bool) -> Result<(), HandshakeError> {
        self.core.update_keys(request_peer)
    }

    /// Version, suite and hop key fingerprints, once the data phase started.
    pub fn summary(&self) -> Option<&SessionSummary> {
        self.core.summary()
    }

    /// Ciphertext for the next hop, in order.
    pub fn take_outgoing(&mut self) -> Vec<u8> {
        self.core.take_outgoing()
    }

    /// Application data received (once ready).
    pub fn take_plaintext(&mut self) -> Vec<u8> {
        self.core.take_plaintext()
    }

    pub fn poll_event(&mut self) -> Option<ClientHandshakeEvent> {
        self.core.poll_event()
    }

    /// True once key material was sent to the middleboxes.
    pub fn keys_sent(&self) -> bool {
        self.core.keys_sent()
    }

    /// True once the data phase started (with or without a middlebox).
    pub fn data_phase_started(&self) -> bool {
        self.core.data_phase_started()
    }

    /// Primary-key records dropped because the middlebox re-sends them (0 when it held them).
    pub fn discarded_records(&self) -> usize {
        self.core.discarded_records()
    }

    pub fn is_ready(&self) -> bool {
        self.core.is_ready()
    }

    /// What the handshake waits for before its data phase, in words ("middlebox mb.test's
    /// evidence message …", "the server's handshake"), for the error of a handshake that
    /// timed out; `None` once the data phase started.
    pub fn waiting_for(&self) -> Option<String> {
        self.core.waiting_for("the server")
    }

    /// For an idle session: frees the buffers traffic made grow, keeping any incomplete
    /// record (see [`ServerHandshake::release_idle_buffers`](super::ServerHandshake::release_idle_buffers)).
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

/// True when `rec` begins with a complete ServerHello that is not a HelloRetryRequest: the
/// point by which every discovered middlebox has answered (each injects its secondary
/// ServerHello before forwarding the primary one, and joins on the real ServerHello after a
/// retry). A ServerHello split over records is never recognised; the session then keeps its
/// export, as before discovery settled early.
fn starts_with_server_hello(rec: &Record) -> bool {
    if rec.content_type() != ContentType::HANDSHAKE {
        return false;
    }
    let mut messages = HandshakeDeframer::default();
    messages.push(rec.payload());
    let Ok(Some(msg)) = messages.next_message() else {
        return false;
    };
    msg.typ() == HandshakeType::SERVER_HELLO
        && ServerHello::parse_message(msg.as_bytes()).is_ok_and(|sh| !sh.is_hello_retry_request())
}
