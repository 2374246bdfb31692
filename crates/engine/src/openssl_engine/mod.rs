//! The OpenSSL 3 engine: `SslStream` over an in-memory transport, plus the hooks in [`ffi`].

#[allow(unsafe_code)]
mod ffi;
mod sessions;
mod ticket_keys;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, Read, Write};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use mbx_record::{wipe, ContentType, RecordSealer, TlsVersion};
use openssl::error::ErrorStack;
use openssl::ssl::{
    AlpnError, ErrorCode, Ssl, SslContext, SslContextBuilder, SslContextRef, SslMethod, SslOptions,
    SslRef, SslSession, SslSessionCacheMode, SslStream, SslVerifyMode, SslVersion,
};
use openssl::x509::store::X509StoreBuilder;
use openssl::x509::X509;
use zeroize::Zeroizing;

use crate::records::{self, CT_ALERT, CT_APPLICATION_DATA, CT_CHANGE_CIPHER_SPEC, CT_HANDSHAKE};
use crate::session::{derive_session, ExportInputs, KeyLogSecrets};
use crate::{
    AlertDescription, CertificateProblem, EngineError, ExtensionHandler, ExtensionResponse,
    Handoff, Role, TlsConfig, TlsEngine,
};
use sessions::ClientSessions;
use ticket_keys::TicketKeys;

const HS_FINISHED: u8 = 20;
const HS_KEY_UPDATE: u8 = 24;
const HS_NEW_SESSION_TICKET: u8 = 4;

/// Record counts of one direction, driven by the message callback.
///
/// OpenSSL reports a record's header before the messages it carries, and a handshake message
/// after the record(s) carrying it were written/read; and it switches keys right after the
/// record/message that ends an epoch (TLS 1.2: the ChangeCipherSpec record; TLS 1.3: the first
/// Finished of each side). So the records reported after it are exactly those of the new epoch.
/// (TLS 1.3 compatibility CCS records are unprotected and take no sequence number; they are not
/// counted as application_data records.)
#[derive(Default, Debug)]
struct EpochCounter {
    /// Records (any type) since the last ChangeCipherSpec: the TLS 1.2 sequence number.
    since_ccs: u64,
    ccs_seen: u32,
    /// Protected records (outer type application_data) since the first Finished: the TLS 1.3
    /// application-epoch sequence number.
    since_finished: u64,
    finished_seen: u32,
    key_updates: u32,
}

impl EpochCounter {
    /// A record header. A ChangeCipherSpec record is recognised by its header: OpenSSL 3.0
    /// reports the content of a CCS it sends but not of one it receives.
    fn on_header(&mut self, outer_type: u8) {
        match outer_type {
            CT_CHANGE_CIPHER_SPEC => {
                self.since_ccs = 0;
                self.ccs_seen = self.ccs_seen.saturating_add(1);
            }
            CT_APPLICATION_DATA => {
                self.since_ccs = self.since_ccs.saturating_add(1);
                self.since_finished = self.since_finished.saturating_add(1);
            }
            _ => self.since_ccs = self.since_ccs.saturating_add(1),
        }
    }

    fn on_handshake(&mut self, msg_type: u8) {
        match msg_type {
            // Only the first Finished ends the handshake epoch; a later one (TLS 1.3
            // post-handshake authentication) changes no keys.
            HS_FINISHED => {
                if self.finished_seen == 0 {
                    self.since_finished = 0;
                }
                self.finished_seen = self.finished_seen.saturating_add(1);
            }
            HS_KEY_UPDATE => self.key_updates = self.key_updates.saturating_add(1),
            _ => {}
        }
    }

    /// Next sequence number for `version`, or why it is not exact.
    fn next_seq(&self, version: TlsVersion) -> Result<u64, EngineError> {
        match version {
            TlsVersion::Tls12 => match self.ccs_seen {
                1 => Ok(self.since_ccs),
                0 => Err(EngineError::HandshakeIncomplete),
                _ => Err(EngineError::InexactExport("renegotiation happened")),
            },
            TlsVersion::Tls13 => {
                if self.key_updates > 0 {
                    return Err(EngineError::Unsupported("export after a TLS 1.3 KeyUpdate"));
                }
                if self.finished_seen == 0 {
                    return Err(EngineError::HandshakeIncomplete);
                }
                Ok(self.since_finished)
            }
        }
    }
}

/// Per-connection state shared with OpenSSL's callbacks through the SSL's ex_data.
#[derive(Default)]
struct ConnState {
    secrets: KeyLogSecrets,
    tx: EpochCounter,
    rx: EpochCounter,
    alert_sent: Option<(u8, AlertDescription)>,
    alert_received: Option<(u8, AlertDescription)>,
    /// Payloads we put in our hello (client) for each extension type.
    ext_send: BTreeMap<u16, Vec<u8>>,
    /// Replies a server handler chose, sent in ServerHello / EncryptedExtensions.
    ext_reply: BTreeMap<u16, Vec<u8>>,
    ext_received: BTreeMap<u16, Vec<u8>>,
    handlers: BTreeMap<u16, ExtensionHandler>,
    /// TLS 1.3 KeyUpdates received that asked for ours (all received: `rx.key_updates`).
    key_updates_requested: u32,
    /// Client with resumption: the server name the sessions it is given are kept under.
    resumption_name: Option<String>,
    /// Server with [`TlsConfig::ticket_key_rotation`]: its context's ticket keys.
    ticket_keys: Option<Arc<TicketKeys>>,
}

type SharedState = Arc<Mutex<ConnState>>;

fn lock(state: &SharedState) -> MutexGuard<'_, ConnState> {
    // A panic while holding the lock can only come from a user handler (caught in ffi); the
    // state itself stays consistent, so keep using it.
    state.lock().unwrap_or_else(|e| e.into_inner())
}

static STATE_INDEX: OnceLock<openssl::ex_data::Index<Ssl, SharedState>> = OnceLock::new();

fn state_index() -> Result<openssl::ex_data::Index<Ssl, SharedState>, ErrorStack> {
    if let Some(i) = STATE_INDEX.get() {
        return Ok(*i);
    }
    let fresh = Ssl::new_ex_index()?;
    Ok(*STATE_INDEX.get_or_init(|| fresh))
}

fn state_of(ssl: &SslRef) -> Option<&SharedState> {
    STATE_INDEX.get().and_then(|i| ssl.ex_data(*i))
}

/// Called by [`ffi`] when OpenSSL seals or opens a session ticket: the keys of the
/// connection's context.
fn ticket_keys_of(ssl: &SslRef) -> Option<Arc<TicketKeys>> {
    lock(state_of(ssl)?).ticket_keys.clone()
}

/// Called by [`ffi`] when OpenSSL builds a hello: the payload to put in it, if any.
fn extension_to_send(ssl: &SslRef, ty: u16, in_client_hello: bool) -> Option<Vec<u8>> {
    let st = lock(state_of(ssl)?);
    if in_client_hello {
        st.ext_send.get(&ty).cloned()
    } else {
        st.ext_reply.get(&ty).cloned()
    }
}

/// Called by [`ffi`] with a received extension; runs the handler without holding the lock.
fn extension_received(
    ssl: &SslRef,
    ty: u16,
    from_client_hello: bool,
    payload: &[u8],
) -> Result<(), AlertDescription> {
    let state = state_of(ssl).ok_or(AlertDescription::INTERNAL_ERROR)?;
    let handler = lock(state).handlers.get(&ty).cloned();
    let response = handler.map_or(ExtensionResponse::Accept, |h| h(payload));
    let mut st = lock(state);
    match response {
        ExtensionResponse::Reject(alert) => return Err(alert),
        ExtensionResponse::Reply(reply) if from_client_hello => {
            st.ext_reply.insert(ty, reply);
        }
        ExtensionResponse::Reply(_) | ExtensionResponse::Accept => {}
    }
    st.ext_received.insert(ty, payload.to_vec());
    Ok(())
}

/// Called by [`ffi`] for every record header, handshake message, CCS and alert.
fn on_message(ssl: &SslRef, write: bool, content_type: i32, data: &[u8]) {
    let Some(state) = state_of(ssl) else { return };
    let mut st = lock(state);
    let dir = if write { &mut st.tx } else { &mut st.rx };
    match (content_type, data.first()) {
        (ffi::RT_HEADER, Some(&outer)) => dir.on_header(outer),
        (ct, Some(&msg_type)) if ct == i32::from(CT_HANDSHAKE) => {
            dir.on_handshake(msg_type);
            // type(1) length(3) request_update(1): OpenSSL already checked the body.
            if msg_type == HS_KEY_UPDATE && !write && data.get(4) == Some(&1) {
                st.key_updates_requested = st.key_updates_requested.saturating_add(1);
            }
        }
        (ct, Some(&level)) if ct == i32::from(CT_ALERT) => {
            if let Some(&desc) = data.get(1) {
                let alert = Some((level, AlertDescription(desc)));
                if write {
                    st.alert_sent = alert;
                } else {
                    st.alert_received = alert;
                }
            }
        }
        _ => {}
    }
}

/// In-memory transport under `SslStream`. Reads only ever hand out bytes of complete records,
/// so OpenSSL (which without read-ahead reads exactly one record at a time) never holds a
/// partial record: whatever it has not processed stays here.
#[derive(Default)]
struct MemIo {
    incoming: Vec<u8>,
    /// Length of the prefix of `incoming` made of complete records.
    readable: usize,
    /// When set, OpenSSL gets no more input (pause / export).
    frozen: bool,
    outgoing: Vec<u8>,
    malformed: bool,
}

impl MemIo {
    fn feed(&mut self, data: &[u8]) {
        self.incoming.extend_from_slice(data);
        self.rescan();
    }

    fn rescan(&mut self) {
        match self
            .incoming
            .get(self.readable..)
            .map(records::complete_prefix_len)
        {
            Some(Ok(n)) => self.readable += n,
            // Let OpenSSL see the garbage: it will fail the connection with the right alert.
            Some(Err(_)) => {
                self.malformed = true;
                self.readable = self.incoming.len();
            }
            None => {}
        }
    }
}

impl Read for MemIo {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = buf.len().min(self.readable);
        if self.frozen || n == 0 {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        buf[..n].copy_from_slice(&self.incoming[..n]);
        self.incoming.drain(..n);
        self.readable -= n;
        Ok(n)
    }
}

impl Write for MemIo {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.outgoing.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Splits a wire-format ALPN list into its entries (a malformed tail is ignored).
fn alpn_entries(mut list: &[u8]) -> impl Iterator<Item = &[u8]> {
    std::iter::from_fn(move || {
        let (&len, rest) = list.split_first()?;
        let entry = rest.get(..usize::from(len))?;
        list = rest.get(usize::from(len)..)?;
        Some(entry)
    })
}

/// Server-preference ALPN choice, returning the client's copy (OpenSSL wants a slice of the
/// client's list).
fn pick_alpn<'c>(server: &[u8], client: &'c [u8]) -> Option<&'c [u8]> {
    alpn_entries(server).find_map(|s| alpn_entries(client).find(|c| *c == s))
}

fn ssl_version(v: TlsVersion) -> SslVersion {
    match v {
        TlsVersion::Tls12 => SslVersion::TLS1_2,
        TlsVersion::Tls13 => SslVersion::TLS1_3,
    }
}

fn config_err(what: &str, e: impl std::fmt::Display) -> EngineError {
    EngineError::Config(format!("{what}: {e}"))
}

/// An `SSL_CTX` built from a [`TlsConfig`]; cheap to create many engines from.
pub struct OpenSslContext {
    ctx: SslContext,
    /// The configuration, kept only when `ctx` has the key log: [`Self::quiet_context`] then
    /// builds `quiet`, the same context without it, on first use.
    quiet_config: Option<Box<TlsConfig>>,
    quiet: OnceLock<SslContext>,
    /// Client with [`TlsConfig::resume_sessions`]: the sessions to offer, shared with `quiet`.
    sessions: Option<Arc<ClientSessions>>,
    /// Server with [`TlsConfig::ticket_key_rotation`]: the keys its tickets are sealed under,
    /// shared with `quiet`.
    ticket_keys: Option<Arc<TicketKeys>>,
    role: Role,
    server_name: Option<String>,
    verify_peer: bool,
    pause_after_handshake: bool,
    exportable: bool,
    /// Our leaf certificate (DER), when we have an identity.
    certificate_der: Option<Vec<u8>>,
    registered: BTreeSet<u16>,
    ext_send: BTreeMap<u16, Vec<u8>>,
    handlers: BTreeMap<u16, ExtensionHandler>,
}

impl crate::ClientContext for OpenSslContext {
    fn client_engine(
        &self,
        server_name: Option<&str>,
        max_plaintext: Option<usize>,
    ) -> Result<Box<dyn TlsEngine + Send>, EngineError> {
        if self.role != Role::Client {
            return Err(EngineError::Config(
                "a server context makes no client".into(),
            ));
        }
        let mut engine = self.engine_for(server_name)?;
        if let Some(len) = max_plaintext {
            engine.set_max_send_fragment(len)?;
        }
        Ok(Box::new(engine))
    }

    fn resumes_unvouched(&self) -> bool {
        self.sessions.is_some()
    }
}

impl OpenSslContext {
    pub fn new(config: &TlsConfig) -> Result<Self, EngineError> {
        let sessions = (config.role == Role::Client && config.resume_sessions > 0)
            .then(|| Arc::new(ClientSessions::new(config.resume_sessions)));
        let ticket_keys = config
            .ticket_key_rotation
            .filter(|_| config.role == Role::Server && config.session_tickets)
            .map(|period| TicketKeys::new(period).map(Arc::new))
            .transpose()?;
        let mut context = Self::build(config, sessions, ticket_keys)?;
        if Self::has_key_log(config) {
            context.quiet_config = Some(Box::new(config.clone()));
        }
        Ok(context)
    }

    /// A server with [`TlsConfig::ticket_key_rotation`]: starts a new key epoch now (tickets
    /// sealed until now still open until the next one starts, older ones never again), as
    /// when an operator suspects its keys were read. False for a context without its own
    /// ticket keys.
    pub fn rotate_ticket_keys(&self) -> Result<bool, EngineError> {
        match &self.ticket_keys {
            Some(keys) => {
                keys.rotate()?;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// TLS 1.3 traffic secrets come only through the key log; a TLS 1.2 export reads the
    /// master secret from the session instead, so a TLS 1.2-only context needs no key log.
    fn has_key_log(config: &TlsConfig) -> bool {
        config.exportable && config.max_version == TlsVersion::Tls13
    }

    fn build(
        config: &TlsConfig,
        sessions: Option<Arc<ClientSessions>>,
        ticket_keys: Option<Arc<TicketKeys>>,
    ) -> Result<Self, EngineError> {
        let mut b = SslContextBuilder::new(SslMethod::tls())?;
        b.set_min_proto_version(Some(ssl_version(config.min_version)))?;
        b.set_max_proto_version(Some(ssl_version(config.max_version)))?;
        // Renegotiation would start a new epoch behind our counters' back.
        b.set_options(SslOptions::NO_RENEGOTIATION);
        // OpenSSL decrypts a record in place in its read buffer and keeps that plaintext
        // (e.g. an mbTLS middlebox's key material) until the buffer is reused or freed; with
        // this option it wipes it once handed over, and when the connection is freed.
        b.set_options(cleanse_plaintext());
        if !config.session_tickets {
            b.set_options(SslOptions::NO_TICKET);
            b.set_num_tickets(0)?;
        }
        if config.role == Role::Server && !config.session_cache {
            b.set_session_cache_mode(SslSessionCacheMode::OFF);
        }
        if ticket_keys.is_some() && !ffi::set_ticket_key_callback(&mut b) {
            return Err(EngineError::Config(
                "cannot install the session-ticket key callback".into(),
            ));
        }
        Self::apply_suites(&mut b, &config.cipher_suites)?;

        let mut certificate_der = None;
        if let Some(id) = &config.identity {
            let chain = X509::stack_from_pem(&id.cert_chain_pem)
                .map_err(|e| config_err("certificate chain", e))?;
            let mut certs = chain.into_iter();
            let leaf = certs
                .next()
                .ok_or_else(|| EngineError::Config("empty certificate chain".into()))?;
            b.set_certificate(&leaf)?;
            certificate_der = Some(leaf.to_der()?);
            for c in certs {
                b.add_extra_chain_cert(c)?;
            }
            let key = id.private_key()?;
            b.set_private_key(&key)?;
            b.check_private_key()
                .map_err(|e| config_err("key does not match certificate", e))?;
        } else if config.role == Role::Server {
            return Err(EngineError::Config("a server needs an identity".into()));
        }

        if let Some(pem) = &config.trust_roots_pem {
            let mut store = X509StoreBuilder::new()?;
            for c in crate::config::trust_roots(pem)? {
                store.add_cert(c)?;
            }
            b.set_verify_cert_store(store.build())?;
        }
        let mode = match (config.role, config.verify_peer) {
            (_, false) => SslVerifyMode::NONE,
            (Role::Client, true) => SslVerifyMode::PEER,
            (Role::Server, true) => SslVerifyMode::PEER | SslVerifyMode::FAIL_IF_NO_PEER_CERT,
        };
        if config.verify_peer && config.trust_roots_pem.is_none() {
            return Err(EngineError::Config("verify_peer needs trust roots".into()));
        }
        b.set_verify(mode);
        if config.role == Role::Server {
            // OpenSSL refuses (fatally, not as a miss) to resume a session on a server that
            // verifies clients unless sessions carry a context id; it also keeps a session
            // from being resumed under other client-verification settings. The twin without
            // the key log shares the configuration, hence the id.
            b.set_session_id_context(&session_id_context(config))?;
        }

        if !config.groups.is_empty() {
            b.set_groups_list(&config.groups.join(":"))
                .map_err(|_| EngineError::Config(format!("unknown groups {:?}", config.groups)))?;
        }

        let alpn = config.alpn_wire()?;
        if !alpn.is_empty() {
            match config.role {
                Role::Client => b.set_alpn_protos(&alpn)?,
                Role::Server => b.set_alpn_select_callback(move |_, client| {
                    pick_alpn(&alpn, client).ok_or(AlpnError::NOACK)
                }),
            }
        }

        if Self::has_key_log(config) {
            b.set_keylog_callback(|ssl, line| {
                if let Some(st) = state_of(ssl) {
                    lock(st).secrets.record_line(line);
                }
            });
        }

        if let Some(store) = &sessions {
            // OpenSSL calls back with every session a server gives (TLS 1.2: at the end of
            // the handshake; TLS 1.3: each ticket, after it); it keeps none itself.
            b.set_session_cache_mode(
                SslSessionCacheMode::CLIENT | SslSessionCacheMode::NO_INTERNAL_STORE,
            );
            let store = store.clone();
            b.set_new_session_callback(move |ssl, session| {
                let name = state_of(ssl).and_then(|st| lock(st).resumption_name.clone());
                if let Some(name) = name {
                    store.put(&name, session);
                }
            });
        }

        let mut registered = BTreeSet::new();
        let mut ext_send = BTreeMap::new();
        let mut handlers = BTreeMap::new();
        for ext in &config.custom_extensions {
            if !registered.insert(ext.ext_type)
                || !ffi::register_custom_extension(&mut b, ext.ext_type)
            {
                return Err(EngineError::Config(format!(
                    "cannot register extension {:#06x} (duplicate or built into OpenSSL)",
                    ext.ext_type
                )));
            }
            if let (Role::Client, Some(p)) = (config.role, &ext.client_payload) {
                ext_send.insert(ext.ext_type, p.clone());
            }
            if let Some(h) = &ext.handler {
                handlers.insert(ext.ext_type, h.clone());
            }
        }
        // Make sure the ex_data slot exists before any callback can look for it.
        state_index()?;
        Ok(Self {
            ctx: b.build(),
            quiet_config: None,
            quiet: OnceLock::new(),
            sessions,
            ticket_keys,
            role: config.role,
            server_name: config.server_name.clone(),
            verify_peer: config.verify_peer,
            pause_after_handshake: config.pause_after_handshake,
            exportable: config.exportable,
            certificate_der,
            registered,
            ext_send,
            handlers,
        })
    }

    fn apply_suites(b: &mut SslContextBuilder, ids: &[u16]) -> Result<(), EngineError> {
        let (mut v12, mut v13) = (Vec::new(), Vec::new());
        for id in ids {
            let (name, is13) = crate::suite_openssl_name(*id).ok_or_else(|| {
                EngineError::Config(format!("unsupported cipher suite {id:#06x}"))
            })?;
            if is13 {
                v13.push(name)
            } else {
                v12.push(name)
            }
        }
        if !v12.is_empty() {
            b.set_cipher_list(&v12.join(":"))?;
        }
        if !v13.is_empty() {
            b.set_ciphersuites(&v13.join(":"))?;
        }
        Ok(())
    }

    /// Our leaf certificate (DER), parsed once when the context was built; `None` without an
    /// identity.
    pub fn certificate_der(&self) -> Option<&[u8]> {
        self.certificate_der.as_deref()
    }

    /// Whether this client context resumes sessions ([`TlsConfig::resume_sessions`]).
    pub fn resumes_sessions(&self) -> bool {
        self.sessions.is_some()
    }

    /// Drops every session kept for `server_name`: for a connection that failed after its
    /// keys left OpenSSL, whose session must not be resumed (RFC 5246 §7.2.2; OpenSSL sees to
    /// this itself for the connections it keeps).
    pub fn forget_sessions(&self, server_name: &str) {
        if let Some(store) = &self.sessions {
            store.forget(server_name);
        }
    }

    /// Whether engines of this context can be exported ([`TlsConfig::exportable`]).
    pub fn exportable(&self) -> bool {
        self.exportable
    }

    /// Whether engines of this context stop at the end of the handshake
    /// ([`TlsConfig::pause_after_handshake`]).
    pub fn pauses_after_handshake(&self) -> bool {
        self.pause_after_handshake
    }

    /// Whether this context registers the custom extension `typ`
    /// ([`TlsConfig::custom_extensions`]).
    pub fn registers_extension(&self, typ: u16) -> bool {
        self.registered.contains(&typ)
    }

    /// A new connection using the configured server name.
    pub fn engine(&self) -> Result<OpenSslEngine, EngineError> {
        self.engine_for(self.server_name.as_deref())
    }

    /// A new connection; for clients, `server_name` is the SNI and the verified hostname.
    pub fn engine_for(&self, server_name: Option<&str>) -> Result<OpenSslEngine, EngineError> {
        self.engine_on(&self.ctx, server_name, true)
    }

    /// A new server connection that sends no TLS 1.3 session tickets, whatever the context
    /// says: for sessions that must not emit records after their handshake on their own (an
    /// mbTLS middlebox's secondary session, whose next record is its switch marker).
    pub fn engine_without_tickets(&self) -> Result<OpenSslEngine, EngineError> {
        self.engine_on(&self.ctx, None, false)
    }

    /// A new connection (configured server name) that will never be exported, so it needs
    /// no key log even when this context keeps one (17–37 µs per TLS 1.3 handshake, see
    /// [`TlsConfig::exportable`]): for an endpoint that learns before the handshake starts
    /// that nothing will take its session over (an mbTLS server to which no middlebox announced
    /// itself). The context is rebuilt once without the key log, on first use.
    /// [`TlsEngine::export_session`] on it fails with `Unsupported`.
    pub fn engine_without_export(&self) -> Result<OpenSslEngine, EngineError> {
        let ctx = self.quiet_context()?;
        let mut engine = self.engine_on(ctx, self.server_name.as_deref(), true)?;
        engine.exportable = false;
        Ok(engine)
    }

    /// Gives up the export of `engine`, a connection of this context, while its handshake
    /// runs: the connection moves to the context's twin without the key log and is never
    /// exported. For a client that learns before the ServerHello that nothing will take its
    /// session over (an mbTLS client whose discovered middleboxes stayed silent): called
    /// before the ServerHello is fed, OpenSSL formats none of the session's secrets. The twin
    /// is built from the same configuration (trust roots, suites, extensions), so the rest of
    /// the handshake is checked as before. [`TlsEngine::export_session`] then fails with
    /// `Unsupported`.
    pub fn forgo_export(&self, engine: &mut OpenSslEngine) -> Result<(), EngineError> {
        let own: &SslContextRef = &self.ctx;
        if !std::ptr::eq(engine.ssl().ssl_context(), own) {
            return Err(EngineError::State(
                "export is given up through the connection's own context",
            ));
        }
        if engine.handshake_done {
            return Err(EngineError::State(
                "export is given up during the handshake",
            ));
        }
        let ctx = self.quiet_context()?;
        if !std::ptr::eq(&**ctx, own) && !ffi::set_context(engine.ssl(), ctx) {
            return Err(EngineError::State("OpenSSL refused the context change"));
        }
        engine.exportable = false;
        // Nothing logged so far is needed any more.
        lock(&engine.state).secrets = KeyLogSecrets::default();
        Ok(())
    }

    /// This context without the key log: the twin, built on first use, or the context itself
    /// when it has no key log.
    fn quiet_context(&self) -> Result<&SslContext, EngineError> {
        let Some(config) = &self.quiet_config else {
            return Ok(&self.ctx);
        };
        if self.quiet.get().is_none() {
            let quiet = Self::build(
                &config.as_ref().clone().without_export(),
                self.sessions.clone(),
                self.ticket_keys.clone(),
            )?;
            // Another thread may have won the race: its context is the same.
            let _ = self.quiet.set(quiet.ctx);
        }
        self.quiet
            .get()
            .ok_or(EngineError::State("context without key log missing"))
    }

    /// A connection on `ctx`: this context's own, or its twin without the key log.
    fn engine_on(
        &self,
        ctx: &SslContext,
        server_name: Option<&str>,
        tickets: bool,
    ) -> Result<OpenSslEngine, EngineError> {
        let mut ssl = Ssl::new(ctx)?;
        if !tickets && self.role == Role::Server {
            ssl.set_num_tickets(0)?;
        }
        match self.role {
            Role::Client => {
                ssl.set_connect_state();
                if let Some(name) = server_name {
                    let ip = name.parse::<std::net::IpAddr>().ok();
                    if ip.is_none() {
                        ssl.set_hostname(name)?;
                    }
                    if self.verify_peer {
                        match ip {
                            Some(ip) => ssl.param_mut().set_ip(ip)?,
                            None => ssl.param_mut().set_host(name)?,
                        }
                    }
                }
            }
            Role::Server => ssl.set_accept_state(),
        }
        let resumption_name = match (&self.sessions, server_name) {
            (Some(store), Some(name)) => {
                if let Some(session) = store.offer(name) {
                    ffi::set_session(&mut ssl, &session)?;
                }
                Some(name.to_owned())
            }
            _ => None,
        };
        let renewals = self
            .sessions
            .clone()
            .zip(resumption_name.clone())
            .map(|(store, name)| {
                let forgets = store.forgets();
                (store, name, forgets)
            });
        let state = Arc::new(Mutex::new(ConnState {
            ext_send: self.ext_send.clone(),
            handlers: self.handlers.clone(),
            resumption_name,
            ticket_keys: self.ticket_keys.clone(),
            ..ConnState::default()
        }));
        ssl.set_ex_data(state_index()?, state.clone());
        ffi::install_msg_callback(&mut ssl);
        let stream = SslStream::new(ssl, MemIo::default())?;
        Ok(OpenSslEngine {
            stream,
            state,
            role: self.role,
            registered: self.registered.clone(),
            pause_after_handshake: self.pause_after_handshake,
            exportable: self.exportable,
            handshake_done: false,
            half_rtt: HalfRtt::Off,
            started: false,
            failed: false,
            peer_closed: false,
            plaintext: Vec::new(),
            renewals,
        })
    }
}

/// A server's session id context (at most 32 bytes): what sessions resumed on it must have
/// been made under, i.e. whether and against which roots clients are verified, and as whom
/// the server speaks.
fn session_id_context(config: &TlsConfig) -> [u8; 32] {
    let mut h = openssl::sha::Sha256::new();
    h.update(b"mbx session id context v1");
    h.update(&[u8::from(config.verify_peer)]);
    for part in [
        config.trust_roots_pem.as_deref().unwrap_or_default(),
        config
            .identity
            .as_ref()
            .map_or(&[][..], |id| id.cert_chain_pem.as_slice()),
    ] {
        h.update(&(part.len() as u64).to_be_bytes());
        h.update(part);
    }
    h.finish()
}

/// The ClientHello's and ServerHello's randoms of the connection.
fn hello_randoms(ssl: &SslRef) -> Result<([u8; 32], [u8; 32]), EngineError> {
    let (mut client_random, mut server_random) = ([0u8; 32], [0u8; 32]);
    if ssl.client_random(&mut client_random) != 32 || ssl.server_random(&mut server_random) != 32 {
        return Err(EngineError::InexactExport("hello randoms unavailable"));
    }
    Ok((client_random, server_random))
}

/// The TLS 1.2 (extended) master secret, from the session rather than the key log.
fn tls12_secrets(ssl: &SslRef, client_random: &[u8; 32]) -> Result<KeyLogSecrets, EngineError> {
    let session = ssl.session().ok_or(EngineError::MissingSecret(
        "TLS 1.2 session (master secret)",
    ))?;
    let mut master = Zeroizing::new(vec![0u8; session.master_key_len()]);
    let n = session.master_key(&mut master);
    if n == 0 {
        return Err(EngineError::MissingSecret("TLS 1.2 master secret"));
    }
    master.truncate(n);
    let mut secrets = KeyLogSecrets::default();
    secrets.record("CLIENT_RANDOM", client_random, &master);
    Ok(secrets)
}

/// Server-side 0.5-RTT progress (see [`OpenSslEngine::enable_half_rtt`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HalfRtt {
    /// Not enabled: the handshake is driven with `SSL_do_handshake`.
    Off,
    /// Enabled; our Finished is not written yet (driven with `SSL_read_early_data`, which stops
    /// right after the server's Finished in TLS 1.3).
    Pending,
    /// `SSL_read_early_data` finished: our Finished is out (TLS 1.3) or the whole handshake is
    /// done (TLS 1.2); the rest of the handshake runs with `SSL_do_handshake`.
    Open,
}

/// `SSL_OP_CLEANSE_PLAINTEXT` (OpenSSL 3.0 and later, bit 1), which the `openssl` crate does
/// not name.
fn cleanse_plaintext() -> SslOptions {
    SslOptions::from_bits_retain(1 << 1)
}

/// Appends plaintext OpenSSL handed over to `plaintext`; if the buffer must grow, its old
/// allocation is wiped before it is freed.
fn keep_plaintext(plaintext: &mut Vec<u8>, bytes: &[u8]) {
    wipe::reserve(plaintext, bytes.len());
    plaintext.extend_from_slice(bytes);
}

/// A TLS connection run by OpenSSL over memory buffers.
pub struct OpenSslEngine {
    stream: SslStream<MemIo>,
    state: SharedState,
    role: Role,
    registered: BTreeSet<u16>,
    pause_after_handshake: bool,
    exportable: bool,
    handshake_done: bool,
    half_rtt: HalfRtt,
    started: bool,
    failed: bool,
    peer_closed: bool,
    plaintext: Vec<u8>,
    /// Client that resumes: where a session renewed in a resumed TLS 1.2 handshake goes, and
    /// the server name it is kept under.
    /// With the store's count of forgets when the connection was made (a session forgotten
    /// since is not brought back).
    renewals: Option<(Arc<ClientSessions>, String, u64)>,
}

impl OpenSslEngine {
    /// Client, before the handshake starts: the payload of custom extension `ext_type` (which
    /// must be registered in the context) for this connection's ClientHello.
    pub fn set_extension_payload(
        &mut self,
        ext_type: u16,
        payload: Vec<u8>,
    ) -> Result<(), EngineError> {
        if self.role != Role::Client || self.started {
            return Err(EngineError::State(
                "extension payloads are set on a client before it starts",
            ));
        }
        if !self.registered.contains(&ext_type) {
            return Err(EngineError::Config(format!(
                "extension {ext_type:#06x} is not registered"
            )));
        }
        lock(&self.state).ext_send.insert(ext_type, payload);
        Ok(())
    }

    /// Server, before the handshake starts: lets this connection send 0.5-RTT application data
    /// ([`TlsEngine::write_half_rtt`]) in TLS 1.3, i.e. data right after our Finished and before
    /// the client's Finished arrives (RFC 8446 §4.4.4). The handshake is then driven through
    /// OpenSSL's server early-data path (`SSL_read_early_data`), which pauses right after the
    /// server's Finished; client early (0-RTT) data is still never accepted. TLS 1.2 handshakes
    /// run unchanged.
    pub fn enable_half_rtt(&mut self) -> Result<(), EngineError> {
        if self.role != Role::Server || self.started {
            return Err(EngineError::State(
                "0.5-RTT data is enabled on a server before it starts",
            ));
        }
        self.half_rtt = HalfRtt::Pending;
        Ok(())
    }

    /// Caps the plaintext of every record this connection sends at `len` bytes (OpenSSL accepts
    /// 512 to 16,384; the default is 16,384), handshake messages included, which are then split
    /// over more records. For records that must fit a container smaller than a TLS record, such
    /// as an mbTLS encapsulated record.
    pub fn set_max_send_fragment(&mut self, len: usize) -> Result<(), EngineError> {
        let len = crate::max_plaintext_cap(len)?;
        if ffi::set_max_send_fragment(self.stream.ssl(), len) {
            Ok(())
        } else {
            Err(EngineError::Config(format!(
                "OpenSSL refused the record fragment limit {len}"
            )))
        }
    }

    /// True while a TLS 1.3 server may write 0.5-RTT data: its Finished is out, the client's
    /// has not been processed yet.
    fn half_rtt_window(&self) -> bool {
        self.half_rtt == HalfRtt::Open
            && !self.handshake_done
            && self.stream.ssl().version2() == Some(SslVersion::TLS1_3)
    }

    /// Keys and the exporter are usable: handshake complete, or our TLS 1.3 Finished is out.
    fn keys_available(&self) -> bool {
        self.handshake_done || self.half_rtt_window()
    }

    /// Drives the handshake with `SSL_read_early_data` until our Finished is out. Returns true
    /// once that happened.
    fn advance_half_rtt(&mut self) -> Result<bool, EngineError> {
        let mut buf = [0u8; 1];
        match self.stream.read_early_data(&mut buf) {
            Ok(0) => {
                self.half_rtt = HalfRtt::Open;
                Ok(true)
            }
            // Early data is never enabled on our contexts (max_early_data stays 0), so OpenSSL
            // cannot have accepted any; refuse rather than deliver unauthenticated bytes.
            Ok(_) => {
                self.failed = true;
                Err(EngineError::State("client early data was accepted"))
            }
            Err(e) if matches!(e.code(), ErrorCode::WANT_READ | ErrorCode::WANT_WRITE) => Ok(false),
            Err(e) => Err(self.fail(e)),
        }
    }

    /// Whether [`TlsEngine::export_session`] can succeed ([`TlsConfig::exportable`]).
    pub fn exportable(&self) -> bool {
        self.exportable
    }

    /// An idle session gives back the memory its in-memory transport grew to under traffic
    /// (received records not yet processed are kept, shrunk to their size; both buffers hold
    /// ciphertext only), and OpenSSL's record buffers. Returns whether OpenSSL let its buffers
    /// go (it keeps them while they hold unprocessed bytes).
    pub fn release_idle_buffers(&mut self) -> bool {
        let io = self.stream.get_mut();
        io.incoming.shrink_to_fit();
        io.outgoing.shrink_to_fit();
        // OpenSSL's own record buffers (≈ 33 KB), allocated again by the next record. Not
        // `SSL_MODE_RELEASE_BUFFERS`, which frees them after every record: ≈ 10% of a bulk
        // transfer's CPU here. Refused (and harmless) while they hold unprocessed bytes.
        ffi::free_buffers(self.stream.ssl())
    }

    /// After a pause at the end of the handshake (`pause_after_handshake`): the session is not
    /// exported after all, so OpenSSL keeps running it. Records that arrived meanwhile are
    /// processed by the next [`process`](TlsEngine::process).
    pub fn resume_after_pause(&mut self) {
        self.pause_after_handshake = false;
        self.stream.get_mut().frozen = false;
    }

    /// TLS 1.3: sends a KeyUpdate now (OpenSSL then protects our records under the next
    /// generation of its keys); `request_peer`: asks the peer to update its keys too. Refused
    /// before the end of the handshake and for TLS 1.2, without failing the session.
    pub fn update_keys(&mut self, request_peer: bool) -> Result<(), EngineError> {
        self.established_tls13("KeyUpdate needs TLS 1.3")?;
        if !ffi::key_update(self.stream.ssl(), request_peer) {
            return Err(EngineError::State(
                "OpenSSL refused to schedule a KeyUpdate",
            ));
        }
        self.send_scheduled()
    }

    /// TLS 1.3 server: sends one session ticket now (`SSL_new_session_ticket`), whatever
    /// `num_tickets` says; the record appears in [`TlsEngine::take_outgoing`]. For a server
    /// that decides after its handshake whether the client gets a ticket (an mbTLS
    /// middlebox's secondary session, docs/mbtls.md §4.7): a ticket written unasked would take
    /// a sequence number the peer must then see. Only useful on a context with
    /// `session_tickets` (otherwise OpenSSL makes a stateful ticket for its session cache).
    pub fn send_session_ticket(&mut self) -> Result<(), EngineError> {
        self.established_tls13("a session ticket on demand needs TLS 1.3")?;
        if self.role != Role::Server || !ffi::new_session_ticket(self.stream.ssl()) {
            return Err(EngineError::State(
                "OpenSSL refused to make a session ticket (not a server?)",
            ));
        }
        self.send_scheduled()
    }

    /// A usable connection whose TLS 1.3 handshake is done (`unsupported`: the error otherwise).
    fn established_tls13(&self, unsupported: &'static str) -> Result<(), EngineError> {
        self.check_usable()?;
        if !self.handshake_done {
            return Err(EngineError::HandshakeIncomplete);
        }
        if self.stream.ssl().version2() != Some(SslVersion::TLS1_3) {
            return Err(EngineError::Unsupported(unsupported));
        }
        Ok(())
    }

    /// Writes what was scheduled (a KeyUpdate, a ticket): `SSL_do_handshake` on an established
    /// connection sends it.
    fn send_scheduled(&mut self) -> Result<(), EngineError> {
        match self.stream.do_handshake() {
            Ok(()) => Ok(()),
            Err(e) if matches!(e.code(), ErrorCode::WANT_READ | ErrorCode::WANT_WRITE) => Ok(()),
            Err(e) => Err(self.fail(e)),
        }
    }

    /// The connection ended cleanly (the peer's close_notify arrived): freeing it leaves its
    /// session resumable, whether or not we sent a close_notify of our own (OpenSSL would
    /// drop a session whose connection it freed before sending one). Sends nothing.
    pub fn keep_session(&self) {
        ffi::mark_closed(self.stream.ssl());
    }

    /// A fatal alert `description` as the peer reads it at this point, for a caller that ends
    /// the connection for a reason of its own (OpenSSL has no call that sends a chosen alert).
    /// In plaintext while our writes are (TLS 1.2 before our ChangeCipherSpec); otherwise
    /// sealed under our current write keys at OpenSSL's next sequence number (TLS 1.2 after
    /// our ChangeCipherSpec, TLS 1.3 after our Finished: the keys come from the session or
    /// the key log, so the engine must be `exportable`); TLS 1.3 before any protected record
    /// of ours (a server that has sent a HelloRetryRequest) in plaintext too. TLS 1.3 between
    /// our ServerHello and our Finished (a server's), after a renegotiation or a KeyUpdate: an
    /// error. (A TLS 1.3 client before its Finished has written nothing protected: plaintext,
    /// as OpenSSL's own alerts there.) Nothing may be written
    /// through the engine afterwards.
    pub fn fatal_alert(&self, description: AlertDescription) -> Result<Vec<u8>, EngineError> {
        self.check_usable()?;
        let payload = [2, description.0];
        let version = self.handshake_version();
        // What our records have been so far (the next sequence number, for a sealed alert).
        let (ccs_seen, protected_sent, next_seq) = {
            let st = lock(&self.state);
            let protected = st.tx.finished_seen > 0 || st.tx.since_finished > 0;
            (
                st.tx.ccs_seen,
                protected,
                version.map(|v| st.tx.next_seq(v)),
            )
        };
        let in_the_clear = match version {
            None => true,
            Some(TlsVersion::Tls12) => ccs_seen == 0,
            // Nothing protected written yet: at most a HelloRetryRequest (and a compatibility
            // ChangeCipherSpec), before any key.
            Some(TlsVersion::Tls13) => !protected_sent,
        };
        if in_the_clear {
            let mut record = Vec::with_capacity(7);
            // Two bytes always fit a record.
            mbx_wire::record::encode_record(ContentType::ALERT, 0x0303, &payload, &mut record)
                .map_err(|_| EngineError::State("alert record"))?;
            return Ok(record);
        }
        let version = version.ok_or(EngineError::HandshakeIncomplete)?;
        if !self.exportable {
            return Err(EngineError::Unsupported(
                "a sealed alert on an engine built without export",
            ));
        }
        let ssl = self.stream.ssl();
        let cipher = ssl
            .current_cipher()
            .ok_or(EngineError::HandshakeIncomplete)?;
        let (client_random, server_random) = hello_randoms(ssl)?;
        let suite_id = u16::from_be_bytes(cipher.protocol_id());
        let suite = mbx_record::CipherSuite::from_id(suite_id)
            .ok_or(EngineError::UnsupportedSuite(suite_id))?;
        let keys = match version {
            TlsVersion::Tls12 => tls12_secrets(ssl, &client_random)?.own_write_keys(
                self.role,
                (&suite, version),
                &client_random,
                &server_random,
            )?,
            TlsVersion::Tls13 => lock(&self.state).secrets.own_write_keys(
                self.role,
                (&suite, version),
                &client_random,
                &server_random,
            )?,
        };
        let mut record = Vec::new();
        // TLS 1.2 AES-GCM: the explicit nonce is the sequence number, while OpenSSL counts
        // from a random start, so the two meet with a chance of about 2^-64 per record.
        let next_seq = next_seq.ok_or(EngineError::HandshakeIncomplete)??;
        RecordSealer::new(version, keys, next_seq).seal(
            ContentType::ALERT,
            &payload,
            &mut record,
        )?;
        Ok(record)
    }

    /// Whether OpenSSL failed the connection (it then sent its own alert, when it had one).
    pub fn has_failed(&self) -> bool {
        self.failed
    }

    /// The version the handshake uses, known from the ServerHello on (a server's, once it
    /// has answered the ClientHello), before the keys are: [`TlsEngine::version`] waits for
    /// them.
    pub fn handshake_version(&self) -> Option<TlsVersion> {
        match self.stream.ssl().version2()? {
            SslVersion::TLS1_2 => Some(TlsVersion::Tls12),
            SslVersion::TLS1_3 => Some(TlsVersion::Tls13),
            _ => None,
        }
    }

    /// Whether this connection resumed a session (TLS 1.2 session ID or ticket, TLS 1.3
    /// ticket) instead of running a full handshake.
    pub fn session_reused(&self) -> bool {
        self.ssl().session_reused()
    }

    /// TLS 1.3 KeyUpdates received so far (each followed by OpenSSL), and how many of them
    /// asked for ours (OpenSSL answers those itself).
    pub fn peer_key_updates(&self) -> (u32, u32) {
        let st = lock(&self.state);
        (st.rx.key_updates, st.key_updates_requested)
    }

    /// The underlying OpenSSL connection, for read-only queries the trait does not cover.
    pub fn ssl(&self) -> &SslRef {
        self.stream.ssl()
    }

    /// Turns a library failure into a typed error, preferring alerts seen on the wire.
    fn fail(&mut self, e: openssl::ssl::Error) -> EngineError {
        self.failed = true;
        // A failed session is not resumed (RFC 5246 §7.2.2, RFC 8446 §6): OpenSSL marks the
        // connection's own session so, but the tickets it gave the store are copies it does
        // not reach.
        if let Some((store, name, _)) = &self.renewals {
            store.forget(name);
        }
        let st = lock(&self.state);
        if let Some((_, alert)) = st
            .alert_received
            .filter(|(_, a)| *a != AlertDescription::CLOSE_NOTIFY)
        {
            return EngineError::AlertReceived { alert };
        }
        // OpenSSL's stack without its source files and lines, which say nothing to an
        // operator (an interop trial's report read "…:../ssl/statem/statem_srvr.c:1664:").
        let mut detail = match e.ssl_error() {
            Some(stack) => crate::error::stack_words(stack),
            None => e.to_string(),
        };
        if self.stream.get_ref().malformed {
            detail = format!("{detail} (peer bytes are not TLS records)");
        }
        // OpenSSL's error stack only says "certificate verify failed"; the check's own result
        // says why (a name mismatch, an unknown issuer, an expired certificate).
        let ssl = self.stream.ssl();
        let verified = ssl.verify_result();
        let mut certificate = None;
        if verified != openssl::x509::X509VerifyResult::OK {
            // Without VERIFY_PEER OpenSSL records a failed check and goes on: a later failure
            // is not the certificate's (review of the twenty-ninth round).
            if ssl
                .verify_mode()
                .contains(openssl::ssl::SslVerifyMode::PEER)
            {
                let problem = certificate_problem(verified);
                certificate = Some(problem);
                // Said as the rustls engine says it, without OpenSSL's error stack (source
                // files and lines), and with the names when they do not match (an embedder's
                // trial: the message named neither). The name checked is the one sent as SNI
                // (an address is checked but not sent: then only the certificate's are said).
                let mut names = String::new();
                if problem == CertificateProblem::NameMismatch {
                    let expected = ssl
                        .servername(openssl::ssl::NameType::HOST_NAME)
                        .map(|name| format!("it is not valid for {name}; "))
                        .unwrap_or_default();
                    let leaf = ssl.peer_cert_chain().and_then(|c| c.get(0));
                    names = format!(" ({expected}it is for {})", presented_names(leaf));
                }
                detail = format!(
                    "invalid peer certificate: {}{names}",
                    verified.error_string()
                );
            } else {
                detail = format!("{detail} (certificate check: {})", verified.error_string());
            }
        }
        EngineError::Fatal {
            alert: st.alert_sent.map(|(_, a)| a),
            detail,
            certificate,
        }
    }

    fn check_usable(&self) -> Result<(), EngineError> {
        if self.failed {
            Err(EngineError::State("engine failed earlier"))
        } else {
            Ok(())
        }
    }

    fn read_available(&mut self) -> Result<(), EngineError> {
        let mut buf = vec![0u8; 16 * 1024];
        let mut used = 0;
        let result = loop {
            match self.stream.ssl_read(&mut buf) {
                Ok(n) => {
                    used = used.max(n);
                    keep_plaintext(&mut self.plaintext, &buf[..n]);
                }
                Err(e) if e.code() == ErrorCode::ZERO_RETURN => {
                    self.peer_closed = true;
                    break Ok(());
                }
                Err(e) if e.code() == ErrorCode::WANT_READ => break Ok(()),
                Err(e) => break Err(self.fail(e)),
            }
        };
        wipe::wipe(&mut buf[..used]);
        result
    }
}

impl Drop for OpenSslEngine {
    fn drop(&mut self) {
        // Plaintext the application never took (a session that failed or was dropped).
        wipe::wipe_vec(&mut self.plaintext);
    }
}

impl TlsEngine for OpenSslEngine {
    fn role(&self) -> Role {
        self.role
    }

    fn feed(&mut self, ciphertext: &[u8]) {
        self.stream.get_mut().feed(ciphertext);
    }

    fn process(&mut self) -> Result<(), EngineError> {
        self.check_usable()?;
        self.started = true;
        if self.half_rtt == HalfRtt::Pending && !self.advance_half_rtt()? {
            return Ok(());
        }
        if !self.handshake_done {
            match self.stream.do_handshake() {
                Ok(()) => {
                    self.handshake_done = true;
                    self.keep_renewed_session();
                }
                Err(e) if matches!(e.code(), ErrorCode::WANT_READ | ErrorCode::WANT_WRITE) => {
                    return Ok(())
                }
                Err(e) => return Err(self.fail(e)),
            }
        }
        if self.pause_after_handshake {
            self.stream.get_mut().frozen = true;
            return Ok(());
        }
        if !self.peer_closed {
            self.read_available()?;
        }
        Ok(())
    }

    fn take_outgoing(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.stream.get_mut().outgoing)
    }

    fn is_handshaking(&self) -> bool {
        !self.handshake_done
    }

    fn write_plaintext(&mut self, mut data: &[u8]) -> Result<(), EngineError> {
        self.check_usable()?;
        if !self.handshake_done {
            return Err(EngineError::HandshakeIncomplete);
        }
        while !data.is_empty() {
            match self.stream.ssl_write(data) {
                Ok(n) => data = data.get(n..).unwrap_or_default(),
                Err(e) => return Err(self.fail(e)),
            }
        }
        Ok(())
    }

    fn write_half_rtt(&mut self, mut data: &[u8]) -> Result<(), EngineError> {
        self.check_usable()?;
        if self.half_rtt == HalfRtt::Off {
            return Err(EngineError::State("0.5-RTT data was not enabled"));
        }
        if !self.half_rtt_window() {
            return Err(EngineError::State(
                "0.5-RTT data needs a TLS 1.3 server between its Finished and the client's",
            ));
        }
        while !data.is_empty() {
            match self.stream.write_early_data(data) {
                Ok(n) => data = data.get(n..).unwrap_or_default(),
                Err(e) => return Err(self.fail(e)),
            }
        }
        Ok(())
    }

    fn can_write_half_rtt(&self) -> bool {
        !self.failed && self.half_rtt_window()
    }

    fn take_plaintext(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.plaintext)
    }

    fn peer_closed(&self) -> bool {
        self.peer_closed
    }

    fn close(&mut self) -> Result<(), EngineError> {
        self.check_usable()?;
        match self.stream.shutdown() {
            Ok(_) => Ok(()),
            Err(e) if matches!(e.code(), ErrorCode::WANT_READ | ErrorCode::WANT_WRITE) => Ok(()),
            Err(e) => Err(self.fail(e)),
        }
    }

    fn export_keying_material(
        &self,
        label: &str,
        context: Option<&[u8]>,
        len: usize,
    ) -> Result<Zeroizing<Vec<u8>>, EngineError> {
        // A TLS 1.3 server has the exporter master secret once its Finished is out (RFC 8446
        // §7.1), which OpenSSL allows too.
        if !self.keys_available() {
            return Err(EngineError::HandshakeIncomplete);
        }
        let mut out = Zeroizing::new(vec![0u8; len]);
        self.stream
            .ssl()
            .export_keying_material(&mut out, label, context)?;
        Ok(out)
    }

    fn version(&self) -> Option<TlsVersion> {
        if !self.keys_available() {
            return None;
        }
        self.handshake_version()
    }

    fn cipher_suite(&self) -> Option<u16> {
        if !self.keys_available() {
            return None;
        }
        let c = self.stream.ssl().current_cipher()?;
        Some(u16::from_be_bytes(c.protocol_id()))
    }

    fn alpn(&self) -> Option<Vec<u8>> {
        self.stream
            .ssl()
            .selected_alpn_protocol()
            .map(<[u8]>::to_vec)
    }

    fn peer_certificates(&self) -> Vec<Vec<u8>> {
        let ssl = self.stream.ssl();
        let mut out = Vec::new();
        // A server's SSL_get_peer_cert_chain omits the client's leaf; a client's includes it.
        if self.role == Role::Server {
            if let Some(leaf) = ssl.peer_certificate().and_then(|c| c.to_der().ok()) {
                out.push(leaf);
            }
        }
        if let Some(chain) = ssl.peer_cert_chain() {
            out.extend(chain.iter().filter_map(|c| c.to_der().ok()));
        }
        out
    }

    fn received_extension(&self, ext_type: u16) -> Result<Option<Vec<u8>>, EngineError> {
        Ok(lock(&self.state).ext_received.get(&ext_type).cloned())
    }

    fn session_resumed(&self) -> bool {
        self.session_reused()
    }

    fn export_session(mut self) -> Result<Handoff, EngineError> {
        let handoff = self.export_in_place()?;
        self.mark_closed_if_resuming();
        Ok(handoff)
    }

    fn export_session_boxed(self: Box<Self>) -> Result<Handoff, EngineError> {
        (*self).export_session()
    }
}

impl OpenSslEngine {
    /// The export itself; the connection is left frozen, for the caller to drop or keep.
    fn export_in_place(&mut self) -> Result<Handoff, EngineError> {
        self.check_usable()?;
        if !self.exportable {
            return Err(EngineError::Unsupported(
                "export_session on an engine built with TlsConfig::exportable = false",
            ));
        }
        if !self.handshake_done {
            return Err(EngineError::HandshakeIncomplete);
        }
        // No further records go into OpenSSL; drain plaintext it already decrypted.
        self.stream.get_mut().frozen = true;
        // Usually nothing is pending: no buffer then.
        let mut buf = Vec::new();
        while self.stream.ssl().pending() > 0 {
            if buf.is_empty() {
                buf = vec![0u8; 16 * 1024];
            }
            match self.stream.ssl_read(&mut buf) {
                Ok(n) if n > 0 => keep_plaintext(&mut self.plaintext, &buf[..n]),
                _ => {
                    wipe::wipe(&mut buf);
                    return Err(EngineError::InexactExport(
                        "OpenSSL holds undeliverable plaintext",
                    ));
                }
            }
        }
        wipe::wipe(&mut buf);
        // An engine that read on after its handshake may have taken the first records of a
        // post-handshake message (a ticket, a KeyUpdate) split over several: OpenSSL is then
        // back in its handshake state machine, holding that part. The caller's record layer
        // would take the rest for the start of a message.
        if !self.stream.ssl().is_init_finished() {
            return Err(EngineError::InexactExport(
                "OpenSSL holds part of a post-handshake message",
            ));
        }
        let version = self.version().ok_or(EngineError::Unsupported(
            "protocol version other than TLS 1.2/1.3",
        ))?;
        let suite_id = self
            .cipher_suite()
            .ok_or(EngineError::HandshakeIncomplete)?;
        let ssl = self.stream.ssl();
        let (client_random, server_random) = hello_randoms(ssl)?;
        let tls12 = match version {
            TlsVersion::Tls12 => Some(tls12_secrets(ssl, &client_random)?),
            TlsVersion::Tls13 => None,
        };
        let session = {
            let st = lock(&self.state);
            derive_session(ExportInputs {
                role: self.role,
                version,
                suite_id,
                client_random,
                server_random,
                secrets: tls12.as_ref().unwrap_or(&st.secrets),
                tx_seq: st.tx.next_seq(version)?,
                rx_seq: st.rx.next_seq(version)?,
            })?
        };
        let io = self.stream.get_mut();
        io.readable = 0;
        Ok(Handoff {
            session,
            unprocessed_incoming: std::mem::take(&mut io.incoming),
            pending_outgoing: std::mem::take(&mut io.outgoing),
            pending_plaintext: Zeroizing::new(std::mem::take(&mut self.plaintext)),
        })
    }

    /// OpenSSL reports a TLS 1.2 client's session only after a full handshake. A server that
    /// renews the ticket in a resumed one (ours do when the ticket's key is the previous one)
    /// leaves the new ticket in a copy of the session that no callback reports; kept here, or
    /// the old ticket would be offered until its key is gone. A session resumed by ID or with
    /// its ticket unchanged replaces itself.
    fn keep_renewed_session(&self) {
        let Some((store, name, forgets)) = &self.renewals else {
            return;
        };
        if self.version() != Some(TlsVersion::Tls12) || !self.session_reused() {
            return;
        }
        if let Some(session) = self.stream.ssl().session() {
            store.put_renewed(name, session.to_owned(), *forgets);
        }
    }

    /// OpenSSL takes a connection freed before its close_notify for one that ended badly and
    /// never resumes its session. An exported one has not ended: it goes on in the caller's
    /// record layer, whose owner forgets the session if it fails
    /// (`OpenSslContext::forget_sessions`).
    fn mark_closed_if_resuming(&self) {
        if lock(&self.state).resumption_name.is_some() {
            ffi::mark_closed(self.stream.ssl());
        }
    }

    /// [`TlsEngine::export_session`], plus what resumption needs of the connection once its
    /// records are the caller's ([`AfterExport`]).
    pub fn export_for_resumption(mut self) -> Result<(Handoff, AfterExport), EngineError> {
        let handoff = self.export_in_place()?;
        if self.role == Role::Server {
            // The session stays in the server's cache (OpenSSL would drop it when the
            // connection is freed); the caller forgets it if the exported connection fails.
            ffi::mark_closed(self.stream.ssl());
            let ssl = self.stream.ssl();
            let cached = ssl.session().map(|session| CachedSession {
                ctx: ssl.ssl_context().to_owned(),
                session: session.to_owned(),
            });
            return Ok((
                handoff,
                AfterExport {
                    tickets: None,
                    cached,
                },
            ));
        }
        let wants_tickets = handoff.session.version == TlsVersion::Tls13
            && lock(&self.state).resumption_name.is_some();
        if !wants_tickets {
            self.mark_closed_if_resuming();
            return Ok((handoff, AfterExport::default()));
        }
        let rx = &handoff.session.rx;
        let sealer = RecordSealer::new(TlsVersion::Tls13, rx.keys.clone(), rx.next_seq);
        // The traffic secrets went out with the export; the sink needs none of them.
        lock(&self.state).secrets = KeyLogSecrets::default();
        self.pause_after_handshake = false;
        self.stream.get_mut().frozen = false;
        self.release_idle_buffers();
        let tickets = Some(TicketSink {
            engine: self,
            sealer,
        });
        Ok((
            handoff,
            AfterExport {
                tickets,
                cached: None,
            },
        ))
    }
}

/// The DNS names and addresses a certificate is for (its subjectAltName), or "no name".
fn presented_names(cert: Option<&openssl::x509::X509Ref>) -> String {
    let names: Vec<String> = cert
        .and_then(|c| c.subject_alt_names())
        .map(|sans| {
            sans.iter()
                .filter_map(|n| {
                    n.dnsname().map(str::to_owned).or_else(|| {
                        let ip = n.ipaddress()?;
                        let ip: std::net::IpAddr = match ip.len() {
                            4 => <[u8; 4]>::try_from(ip).ok()?.into(),
                            16 => <[u8; 16]>::try_from(ip).ok()?.into(),
                            _ => return None,
                        };
                        Some(ip.to_string())
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    match names.is_empty() {
        true => "no name".to_owned(),
        false => names.join(", "),
    }
}

/// The kind of a certificate refusal, from OpenSSL's verification result.
fn certificate_problem(verified: openssl::x509::X509VerifyResult) -> CertificateProblem {
    use openssl_sys as sys;
    match verified.as_raw() {
        sys::X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT
        | sys::X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY
        | sys::X509_V_ERR_UNABLE_TO_VERIFY_LEAF_SIGNATURE
        | sys::X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT
        | sys::X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN
        | sys::X509_V_ERR_CERT_UNTRUSTED => CertificateProblem::UnknownIssuer,
        sys::X509_V_ERR_HOSTNAME_MISMATCH | sys::X509_V_ERR_IP_ADDRESS_MISMATCH => {
            CertificateProblem::NameMismatch
        }
        sys::X509_V_ERR_CERT_HAS_EXPIRED => CertificateProblem::Expired,
        sys::X509_V_ERR_CERT_NOT_YET_VALID => CertificateProblem::NotYetValid,
        _ => CertificateProblem::Other,
    }
}

/// What an exported connection leaves for session resumption
/// ([`OpenSslEngine::export_for_resumption`]).
#[derive(Default)]
pub struct AfterExport {
    /// A TLS 1.3 client whose context resumes sessions: where the server's tickets go.
    pub tickets: Option<TicketSink>,
    /// A server: its session, kept in its context's cache although OpenSSL let the connection
    /// go; to be forgotten if the exported connection fails.
    pub cached: Option<CachedSession>,
}

/// A server session in its context's cache whose connection was exported.
pub struct CachedSession {
    ctx: SslContext,
    session: SslSession,
}

impl CachedSession {
    /// The exported connection failed: the session leaves the cache and is never resumed
    /// (RFC 5246 §7.2.2), as OpenSSL does for the connections it keeps.
    pub fn forget(self) {
        ffi::remove_session(&self.ctx, &self.session);
    }
}

/// What is left of an exported TLS 1.3 client connection whose context resumes sessions
/// ([`OpenSslEngine::export_for_resumption`]). The server's NewSessionTicket messages reach
/// the caller's record layer after the export; given to [`take`](Self::take), each is sealed
/// again under the keys OpenSSL reads with, at the sequence number it expects, and fed to it,
/// so that OpenSSL makes a session of it for the context's store as if it had come before.
/// Nothing it writes leaves it. Dropped, it lets its connection go without making the last
/// session unresumable.
pub struct TicketSink {
    engine: OpenSslEngine,
    sealer: RecordSealer,
}

impl TicketSink {
    /// One NewSessionTicket message, handshake header included, as the server sent it. An
    /// error keeps nothing: a message that is not a ticket or does not fit one record is
    /// refused before OpenSSL sees it; after a ticket OpenSSL refused, the sink is of no
    /// further use.
    pub fn take(&mut self, message: &[u8]) -> Result<(), EngineError> {
        if message.first() != Some(&HS_NEW_SESSION_TICKET) {
            return Err(EngineError::State(
                "a ticket sink takes NewSessionTicket only",
            ));
        }
        let mut record = Vec::new();
        self.sealer
            .seal(ContentType::HANDSHAKE, message, &mut record)?;
        self.engine.feed(&record);
        let processed = self.engine.process();
        // Under the primary session's keys, which our record layer now uses: an alert
        // OpenSSL wrote after a bad ticket must not leave.
        drop(self.engine.take_outgoing());
        wipe::wipe_vec(&mut self.engine.plaintext);
        self.engine.release_idle_buffers();
        processed
    }
}

impl Drop for TicketSink {
    fn drop(&mut self) {
        ffi::mark_closed(self.engine.stream.ssl());
    }
}
