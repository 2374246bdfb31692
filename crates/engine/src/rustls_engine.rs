//! The rustls engine: `rustls::Connection` over memory buffers.
//!
//! rustls cannot add or read custom handshake extensions (by design, and forking it is not
//! allowed), so configurations with `custom_extensions` are rejected with
//! [`EngineError::Unsupported`] and [`TlsEngine::received_extension`] always returns it.
//! A rustls client also always verifies the server (`verify_peer = false` is unsupported).

use std::io::{Read, Write};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::Identity;
use mbx_record::{wipe, TlsVersion};
use openssl::x509::X509;
use rustls::client::danger::ServerCertVerifier;
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use rustls::{ClientConfig, ConnectionTrafficSecrets, RootCertStore, ServerConfig};
use subtle::ConstantTimeEq;
use zeroize::Zeroizing;

use crate::chain_cache::CachingVerifier;
use crate::records::{self, CT_ALERT};
use crate::session::{derive_session, ExportInputs, KeyLogSecrets};
use crate::vouched_sessions::{SessionCapture, SessionNote, VouchedSessions};
use crate::{
    AlertDescription, CertificateProblem, EngineError, Handoff, Role, TlsConfig, TlsEngine,
};

/// Per-connection key log sink (rustls's key log is per config; we build one config per
/// engine).
#[derive(Default)]
struct SecretSink(Mutex<KeyLogSecrets>);

impl SecretSink {
    fn lock(&self) -> MutexGuard<'_, KeyLogSecrets> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl std::fmt::Debug for SecretSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretSink")
    }
}

impl rustls::KeyLog for SecretSink {
    fn log(&self, label: &str, client_random: &[u8], secret: &[u8]) {
        self.lock().record(label, client_random, secret);
    }
}

/// `e` for an operator: the certificate errors an operator meets most in words and dates
/// (rustls says `DnsName("mb3.test")` and Unix seconds, found in a user trial), the rest as
/// rustls says them.
fn describe(e: &rustls::Error) -> String {
    use rustls::CertificateError as C;
    let date = |t: &rustls::pki_types::UnixTime| {
        let secs = i64::try_from(t.as_secs()).unwrap_or(i64::MAX);
        openssl::asn1::Asn1Time::from_unix(secs)
            .map(|t| t.to_string())
            .unwrap_or_else(|_| format!("{secs} s after 1970"))
    };
    match e {
        rustls::Error::InvalidCertificate(C::NotValidForNameContext {
            expected,
            presented,
        }) => format!(
            "invalid peer certificate: it is not valid for the name {} (it is for {})",
            expected.to_str(),
            if presented.is_empty() {
                "no name".to_string()
            } else {
                // rustls gives each in its Debug form: `DnsName("a.test")`, `IpAddress(…)`.
                let bare = |p: &str| {
                    p.strip_prefix("DnsName(\"")
                        .and_then(|r| r.strip_suffix("\")"))
                        .or_else(|| p.strip_prefix("IpAddress(")?.strip_suffix(')'))
                        .unwrap_or(p)
                        .to_owned()
                };
                presented.iter().map(|p| bare(p)).collect::<Vec<_>>().join(", ")
            }
        ),
        rustls::Error::InvalidCertificate(C::ExpiredContext { not_after, .. }) => format!(
            "invalid peer certificate: it expired at {} (its notAfter)",
            date(not_after)
        ),
        rustls::Error::InvalidCertificate(C::NotValidYetContext { not_before, .. }) => format!(
            "invalid peer certificate: it is not valid before {} (its notBefore; is a clock wrong?)",
            date(not_before)
        ),
        e => e.to_string(),
    }
}

/// The kind of a certificate refusal, from rustls's own error types.
fn certificate_problem(e: &rustls::Error) -> Option<CertificateProblem> {
    use rustls::CertificateError as C;
    let rustls::Error::InvalidCertificate(c) = e else {
        return None;
    };
    Some(match c {
        C::UnknownIssuer => CertificateProblem::UnknownIssuer,
        C::NotValidForName | C::NotValidForNameContext { .. } => CertificateProblem::NameMismatch,
        C::Expired | C::ExpiredContext { .. } => CertificateProblem::Expired,
        C::NotValidYet | C::NotValidYetContext { .. } => CertificateProblem::NotYetValid,
        _ => CertificateProblem::Other,
    })
}

fn rustls_err(e: rustls::Error) -> EngineError {
    EngineError::Config(format!("rustls: {e}"))
}

fn certs_from_pem(pem: &[u8], what: &str) -> Result<Vec<CertificateDer<'static>>, EngineError> {
    X509::stack_from_pem(pem)
        .map_err(|e| EngineError::Config(format!("{what}: {e}")))?
        .iter()
        .map(|c| Ok(CertificateDer::from(c.to_der()?)))
        .collect()
}

fn key_of(id: &Identity) -> Result<PrivateKeyDer<'static>, EngineError> {
    let key = id.private_key()?;
    Ok(PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(
        key.private_key_to_pkcs8()?,
    )))
}

/// The rustls engines run on aws-lc-rs: its X25519 key share costs about 8 µs here against
/// ring's 22–25 µs, and every mbTLS endpoint pays one per optimistic ClientHello
/// (docs/dependencies.md). Groups default to the classical three, in ring's order (no
/// post-quantum hybrid share, which the OpenSSL 3.0 peers could not use).
fn provider(config: &TlsConfig) -> Result<Arc<CryptoProvider>, EngineError> {
    use rustls::crypto::aws_lc_rs::kx_group;
    let mut p = rustls::crypto::aws_lc_rs::default_provider();
    if !config.cipher_suites.is_empty() {
        for id in &config.cipher_suites {
            if !p.cipher_suites.iter().any(|s| u16::from(s.suite()) == *id) {
                return Err(EngineError::Config(format!(
                    "unsupported cipher suite {id:#06x}"
                )));
            }
        }
        // In the configured order, which is the preference order (as with OpenSSL).
        let rank = |s: &rustls::SupportedCipherSuite| {
            let id = u16::from(s.suite());
            config.cipher_suites.iter().position(|c| *c == id)
        };
        p.cipher_suites.retain(|s| rank(s).is_some());
        p.cipher_suites.sort_by_key(rank);
    }
    p.kx_groups = if config.groups.is_empty() {
        vec![kx_group::X25519, kx_group::SECP256R1, kx_group::SECP384R1]
    } else {
        // The first group is the one a client sends its key share for.
        config
            .groups
            .iter()
            .map(|g| match g.as_str() {
                "X25519" | "x25519" => Ok(kx_group::X25519),
                "P-256" | "prime256v1" | "secp256r1" => Ok(kx_group::SECP256R1),
                "P-384" | "secp384r1" => Ok(kx_group::SECP384R1),
                other => Err(EngineError::Config(format!(
                    "unknown key-exchange group {other:?} (rustls: X25519, P-256, P-384)"
                ))),
            })
            .collect::<Result<_, _>>()?
    };
    Ok(Arc::new(p))
}

fn versions(config: &TlsConfig) -> Vec<&'static rustls::SupportedProtocolVersion> {
    let mut v = Vec::new();
    for (ver, proto) in [
        (TlsVersion::Tls12, &rustls::version::TLS12),
        (TlsVersion::Tls13, &rustls::version::TLS13),
    ] {
        let rank = |x: TlsVersion| matches!(x, TlsVersion::Tls13) as u8;
        if rank(config.min_version) <= rank(ver) && rank(ver) <= rank(config.max_version) {
            v.push(proto);
        }
    }
    v
}

fn roots(config: &TlsConfig) -> Result<RootCertStore, EngineError> {
    let pem = config
        .trust_roots_pem
        .as_deref()
        .ok_or_else(|| EngineError::Config("verify_peer needs trust roots".into()))?;
    let mut store = RootCertStore::empty();
    for c in crate::config::trust_roots(pem)? {
        store
            .add(CertificateDer::from(c.to_der()?))
            .map_err(rustls_err)?;
    }
    Ok(store)
}

/// A TLS connection run by rustls over memory buffers.
pub struct RustlsEngine {
    conn: rustls::Connection,
    role: Role,
    secrets: Arc<SecretSink>,
    incoming: Vec<u8>,
    outgoing: Vec<u8>,
    /// Wiped when dropped: plaintext the application never took (a session that failed or
    /// was dropped).
    plaintext: Zeroizing<Vec<u8>>,
    /// The ServerHello random, looked for in the server→client bytes (rustls does not expose
    /// it; TLS 1.2 key expansion needs it).
    server_random: records::ServerRandomWatch,
    pause_after_handshake: bool,
    failed: bool,
    peer_closed: bool,
    /// Client of a context that resumes vouched sessions: this connection's store.
    capture: Option<Arc<SessionCapture>>,
}

impl RustlsEngine {
    pub fn new(config: &TlsConfig) -> Result<Self, EngineError> {
        if !config.custom_extensions.is_empty() {
            return Err(EngineError::Unsupported(
                "custom extensions (rustls cannot add them)",
            ));
        }
        let provider = provider(config)?;
        let versions = versions(config);
        let secrets = Arc::new(SecretSink::default());
        let alpn = config.alpn.clone();
        config.alpn_wire()?;
        let identity = match &config.identity {
            Some(id) => Some((
                certs_from_pem(&id.cert_chain_pem, "certificate chain")?,
                key_of(id)?,
            )),
            None => None,
        };
        let conn = match config.role {
            Role::Client => {
                if !config.verify_peer {
                    return Err(EngineError::Unsupported(
                        "rustls client without server verification",
                    ));
                }
                let name = config.server_name.clone().ok_or_else(|| {
                    EngineError::Config("a rustls client needs a server name".into())
                })?;
                let b = ClientConfig::builder_with_provider(provider)
                    .with_protocol_versions(&versions)
                    .map_err(rustls_err)?
                    .with_root_certificates(roots(config)?);
                let mut cfg = match identity {
                    Some((chain, key)) => {
                        b.with_client_auth_cert(chain, key).map_err(rustls_err)?
                    }
                    None => b.with_no_client_auth(),
                };
                cfg.alpn_protocols = alpn;
                cfg.enable_secret_extraction = true;
                cfg.key_log = secrets.clone();
                if !config.session_tickets {
                    cfg.resumption = rustls::client::Resumption::disabled();
                }
                let name = ServerName::try_from(name)
                    .map_err(|e| EngineError::Config(format!("server name: {e}")))?;
                rustls::Connection::Client(
                    rustls::ClientConnection::new(Arc::new(cfg), name).map_err(rustls_err)?,
                )
            }
            Role::Server => {
                let b = ServerConfig::builder_with_provider(provider.clone())
                    .with_protocol_versions(&versions)
                    .map_err(rustls_err)?;
                let b = if config.verify_peer {
                    let v = rustls::server::WebPkiClientVerifier::builder_with_provider(
                        Arc::new(roots(config)?),
                        provider,
                    )
                    .build()
                    .map_err(|e| EngineError::Config(format!("client verifier: {e}")))?;
                    b.with_client_cert_verifier(v)
                } else {
                    b.with_no_client_auth()
                };
                let (chain, key) = identity
                    .ok_or_else(|| EngineError::Config("a server needs an identity".into()))?;
                let mut cfg = b.with_single_cert(chain, key).map_err(rustls_err)?;
                cfg.alpn_protocols = alpn;
                cfg.enable_secret_extraction = true;
                cfg.key_log = secrets.clone();
                if config.session_tickets {
                    cfg.ticketer =
                        rustls::crypto::aws_lc_rs::Ticketer::new().map_err(rustls_err)?;
                } else {
                    cfg.send_tls13_tickets = 0;
                }
                rustls::Connection::Server(
                    rustls::ServerConnection::new(Arc::new(cfg)).map_err(rustls_err)?,
                )
            }
        };
        let mut engine = Self {
            conn,
            role: config.role,
            secrets,
            incoming: Vec::new(),
            outgoing: Vec::new(),
            plaintext: Zeroizing::new(Vec::new()),
            server_random: records::ServerRandomWatch::new(),
            pause_after_handshake: config.pause_after_handshake,
            failed: false,
            peer_closed: false,
            capture: None,
        };
        engine.conn.set_buffer_limit(None);
        Ok(engine)
    }

    /// TLS 1.3: sends a KeyUpdate (rustls's `refresh_traffic_keys`). After it, this engine's
    /// session can no longer be exported exactly (the key log only has the first secrets), and
    /// `export_session` says so.
    pub fn refresh_traffic_keys(&mut self) -> Result<(), EngineError> {
        self.conn
            .refresh_traffic_keys()
            .map_err(|e| EngineError::fatal(None, format!("key update: {e}")))?;
        self.flush()
    }

    fn watch_server_flight(&mut self, bytes: &[u8]) {
        self.server_random.feed(bytes);
    }

    fn flush(&mut self) -> Result<(), EngineError> {
        let start = self.outgoing.len();
        while self.conn.wants_write() {
            self.conn
                .write_tls(&mut self.outgoing)
                .map_err(|e| EngineError::fatal(None, format!("rustls write_tls: {e}")))?;
        }
        if self.role == Role::Server {
            let new = self.outgoing.get(start..).unwrap_or_default().to_vec();
            self.watch_server_flight(&new);
        }
        Ok(())
    }

    fn fail(&mut self, e: rustls::Error) -> EngineError {
        self.failed = true;
        if let rustls::Error::AlertReceived(a) = e {
            return EngineError::AlertReceived {
                alert: AlertDescription(u8::from(a)),
            };
        }
        // rustls queues its alert; send it, and name it when it is still in plaintext.
        let start = self.outgoing.len();
        let _ = self.flush();
        let out = self.outgoing.get(start..).unwrap_or_default();
        let said = describe(&e);
        let certificate = certificate_problem(&e);
        let (alert, detail) = match out {
            [CT_ALERT, 3, _, 0, 2, _level, desc, ..] => (Some(AlertDescription(*desc)), said),
            [] => (None, said),
            _ => (
                None,
                format!("{said} (an encrypted alert went to the peer)"),
            ),
        };
        EngineError::Fatal {
            alert,
            detail,
            certificate,
        }
    }

    /// Moves what rustls decrypted into `plaintext`, leaving no copy behind: the bounce
    /// buffer is wiped, and a buffer that must grow has its old allocation wiped (as the
    /// OpenSSL engine's `keep_plaintext`).
    fn drain_plaintext(&mut self) -> Result<(), EngineError> {
        let mut buf = [0u8; 4096];
        loop {
            match self.conn.reader().read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    let read = buf.get(..n).unwrap_or_default();
                    wipe::reserve(&mut self.plaintext, read.len());
                    self.plaintext.extend_from_slice(read);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                // UnexpectedEof: the peer closed without close_notify; surfaced by peer_closed().
                Err(_) => break,
            }
        }
        wipe::wipe(&mut buf);
        Ok(())
    }
}

impl TlsEngine for RustlsEngine {
    fn role(&self) -> Role {
        self.role
    }

    fn feed(&mut self, ciphertext: &[u8]) {
        self.incoming.extend_from_slice(ciphertext);
    }

    fn process(&mut self) -> Result<(), EngineError> {
        if self.failed {
            return Err(EngineError::State("engine failed earlier"));
        }
        self.flush()?;
        // One whole record at a time: nothing is left half-read inside rustls, and a pause
        // right after the handshake is exact.
        loop {
            if self.pause_after_handshake && !self.conn.is_handshaking() {
                break;
            }
            let n = match records::complete_record_len(&self.incoming) {
                Ok(Some(n)) => n,
                Ok(None) => break,
                Err(e) => {
                    self.failed = true;
                    return Err(e);
                }
            };
            let record: Vec<u8> = self.incoming.drain(..n).collect();
            if self.role == Role::Client {
                self.watch_server_flight(&record);
            }
            let mut rd = record.as_slice();
            while !rd.is_empty() {
                if let Err(e) = self.conn.read_tls(&mut rd) {
                    self.failed = true;
                    return Err(EngineError::fatal(None, format!("rustls read_tls: {e}")));
                }
            }
            match self.conn.process_new_packets() {
                Ok(state) => self.peer_closed |= state.peer_has_closed(),
                Err(e) => return Err(self.fail(e)),
            }
            self.drain_plaintext()?;
            self.flush()?;
        }
        Ok(())
    }

    fn take_outgoing(&mut self) -> Vec<u8> {
        let _ = self.flush();
        std::mem::take(&mut self.outgoing)
    }

    fn is_handshaking(&self) -> bool {
        self.conn.is_handshaking()
    }

    fn write_plaintext(&mut self, data: &[u8]) -> Result<(), EngineError> {
        if self.failed {
            return Err(EngineError::State("engine failed earlier"));
        }
        if self.conn.is_handshaking() {
            return Err(EngineError::HandshakeIncomplete);
        }
        self.conn
            .writer()
            .write_all(data)
            .map_err(|e| EngineError::fatal(None, format!("rustls write: {e}")))?;
        self.flush()
    }

    fn take_plaintext(&mut self) -> Vec<u8> {
        std::mem::take(&mut *self.plaintext)
    }

    fn peer_closed(&self) -> bool {
        self.peer_closed
    }

    fn close(&mut self) -> Result<(), EngineError> {
        self.conn.send_close_notify();
        self.flush()
    }

    fn export_keying_material(
        &self,
        label: &str,
        context: Option<&[u8]>,
        len: usize,
    ) -> Result<Zeroizing<Vec<u8>>, EngineError> {
        if self.conn.is_handshaking() {
            return Err(EngineError::HandshakeIncomplete);
        }
        self.conn
            .export_keying_material(Zeroizing::new(vec![0u8; len]), label.as_bytes(), context)
            .map_err(|e| EngineError::fatal(None, format!("exporter: {e}")))
    }

    fn version(&self) -> Option<TlsVersion> {
        match self.conn.protocol_version()? {
            rustls::ProtocolVersion::TLSv1_2 => Some(TlsVersion::Tls12),
            rustls::ProtocolVersion::TLSv1_3 => Some(TlsVersion::Tls13),
            _ => None,
        }
    }

    fn cipher_suite(&self) -> Option<u16> {
        self.conn
            .negotiated_cipher_suite()
            .map(|s| u16::from(s.suite()))
    }

    fn alpn(&self) -> Option<Vec<u8>> {
        self.conn.alpn_protocol().map(<[u8]>::to_vec)
    }

    fn peer_certificates(&self) -> Vec<Vec<u8>> {
        self.conn
            .peer_certificates()
            .map(|c| c.iter().map(|d| d.to_vec()).collect())
            .unwrap_or_default()
    }

    fn received_extension(&self, _ext_type: u16) -> Result<Option<Vec<u8>>, EngineError> {
        Err(EngineError::Unsupported(
            "custom extensions (rustls cannot see them)",
        ))
    }

    fn session_resumed(&self) -> bool {
        self.conn.handshake_kind() == Some(rustls::HandshakeKind::Resumed)
    }

    fn vouch_for_session(&mut self, note: SessionNote, valid_until: u64) {
        if let Some(capture) = &self.capture {
            capture.vouch(note, valid_until);
        }
    }

    fn resumed_note(&self) -> Option<SessionNote> {
        if !self.session_resumed() {
            return None;
        }
        let tls13 = self.version()? == TlsVersion::Tls13;
        self.capture.as_ref()?.offered_note(tls13)
    }

    fn export_session(mut self) -> Result<Handoff, EngineError> {
        if self.failed {
            return Err(EngineError::State("engine failed earlier"));
        }
        if self.conn.is_handshaking() {
            return Err(EngineError::HandshakeIncomplete);
        }
        self.flush()?;
        self.drain_plaintext()?;
        let version = self.version().ok_or(EngineError::Unsupported(
            "protocol version other than TLS 1.2/1.3",
        ))?;
        let suite_id = self
            .cipher_suite()
            .ok_or(EngineError::HandshakeIncomplete)?;
        let server_random = self
            .server_random
            .random()
            .ok_or(EngineError::InexactExport("ServerHello random not seen"))?;
        let client_random = self
            .secrets
            .lock()
            .client_random()
            .ok_or(EngineError::MissingSecret("client random"))?;
        // Consumes the connection; gives rustls's own sequence numbers and keys.
        let extracted = self.conn.dangerous_extract_secrets().map_err(|e| {
            EngineError::InexactExport(if matches!(e, rustls::Error::HandshakeNotComplete) {
                "handshake not complete"
            } else {
                "rustls refused secret extraction"
            })
        })?;
        let session = derive_session(ExportInputs {
            role: self.role,
            version,
            suite_id,
            client_random,
            server_random,
            secrets: &self.secrets.lock(),
            tx_seq: extracted.tx.0,
            rx_seq: extracted.rx.0,
        })?;
        // Our key schedule must agree with rustls's current keys (it would not after a KeyUpdate).
        for (ours, theirs) in [
            (&session.tx.keys, &extracted.tx.1),
            (&session.rx.keys, &extracted.rx.1),
        ] {
            let key = match theirs {
                ConnectionTrafficSecrets::Aes128Gcm { key, .. }
                | ConnectionTrafficSecrets::Aes256Gcm { key, .. }
                | ConnectionTrafficSecrets::Chacha20Poly1305 { key, .. } => key.as_ref(),
                _ => return Err(EngineError::UnsupportedSuite(suite_id)),
            };
            if !bool::from(ours.key().ct_eq(key)) {
                return Err(EngineError::InexactExport(
                    "derived keys differ from rustls's current keys (KeyUpdate?)",
                ));
            }
        }
        Ok(Handoff {
            session,
            unprocessed_incoming: self.incoming,
            pending_outgoing: self.outgoing,
            pending_plaintext: self.plaintext,
        })
    }

    fn export_session_boxed(self: Box<Self>) -> Result<Handoff, EngineError> {
        (*self).export_session()
    }
}

/// A rustls client configuration built once for many sessions ([`RustlsEngine::new`] builds one
/// per session, to own that session's key log). Its sessions therefore cannot be exported to
/// our record layer: they are for sessions that stay inside the engine, such as an mbTLS
/// endpoint's secondary sessions with its middleboxes, where it is the cheaper client (about
/// 2.6× less CPU per TLS 1.3 ECDSA handshake than an OpenSSL 3.0 client on our machine, most
/// of the difference being OpenSSL's per-certificate decoder lookups). Sessions resume only
/// with [`TlsConfig::resume_sessions`], for a configured server name, and only those the
/// caller vouched for ([`TlsEngine::vouch_for_session`], module `vouched_sessions`).
pub struct RustlsClientContext {
    /// Verifies the chain and the server name.
    named: Arc<ClientConfig>,
    /// Verifies the chain only (no name was configured).
    chain_only: Arc<ClientConfig>,
    /// `named` and `chain_only` with the record plaintext cap last asked for (rustls takes the
    /// cap from the configuration; callers ask for one value, so it is built once).
    capped: Mutex<Option<CappedConfigs>>,
    pause_after_handshake: bool,
    /// With `resume_sessions`: the vouched sessions of up to that many names.
    sessions: Option<Arc<VouchedSessions>>,
}

/// [`RustlsClientContext`]'s two configurations with a record plaintext cap.
struct CappedConfigs {
    len: usize,
    named: Arc<ClientConfig>,
    chain_only: Arc<ClientConfig>,
}

impl RustlsClientContext {
    pub fn new(config: &TlsConfig) -> Result<Self, EngineError> {
        if config.role != Role::Client {
            return Err(EngineError::Config(
                "a rustls client context needs a client configuration".into(),
            ));
        }
        if !config.custom_extensions.is_empty() {
            return Err(EngineError::Unsupported(
                "custom extensions (rustls cannot add them)",
            ));
        }
        if !config.verify_peer {
            return Err(EngineError::Unsupported(
                "rustls client without server verification",
            ));
        }
        config.alpn_wire()?;
        let provider = provider(config)?;
        let versions = versions(config);
        let roots = Arc::new(roots(config)?);
        let build = |chain_only: bool| -> Result<Arc<ClientConfig>, EngineError> {
            let b = ClientConfig::builder_with_provider(provider.clone())
                .with_protocol_versions(&versions)
                .map_err(rustls_err)?;
            let verifier: Arc<dyn ServerCertVerifier> = if chain_only {
                Arc::new(ChainOnly {
                    roots: roots.clone(),
                    provider: provider.clone(),
                })
            } else {
                WebPkiServerVerifier::builder_with_provider(roots.clone(), provider.clone())
                    .build()
                    .map_err(|e| EngineError::Config(format!("server verifier: {e}")))?
            };
            let verifier = match config.verified_chain_cache {
                0 => verifier,
                n => Arc::new(CachingVerifier::new(verifier, n)),
            };
            let b = b.dangerous().with_custom_certificate_verifier(verifier);
            let mut cfg = match &config.identity {
                Some(id) => b
                    .with_client_auth_cert(
                        certs_from_pem(&id.cert_chain_pem, "certificate chain")?,
                        key_of(id)?,
                    )
                    .map_err(rustls_err)?,
                None => b.with_no_client_auth(),
            };
            cfg.alpn_protocols = config.alpn.clone();
            // Resumption, when asked for, is set per connection (its own store in front of
            // the shared one, `engine_capped`); never for a chain-only session, whose name
            // nobody configured.
            cfg.resumption = rustls::client::Resumption::disabled();
            Ok(Arc::new(cfg))
        };
        Ok(RustlsClientContext {
            named: build(false)?,
            chain_only: build(true)?,
            capped: Mutex::new(None),
            pause_after_handshake: config.pause_after_handshake,
            sessions: (config.resume_sessions > 0)
                .then(|| Arc::new(VouchedSessions::new(config.resume_sessions))),
        })
    }

    /// How many vouched sessions (TLS 1.2 session, TLS 1.3 tickets) are kept for `server_name`.
    pub fn kept_sessions(&self, server_name: &str) -> usize {
        self.sessions.as_ref().map_or(0, |s| s.count(server_name))
    }

    /// A new session. `server_name`: SNI and verified name; `None`: no SNI, chain only.
    pub fn engine_for(&self, server_name: Option<&str>) -> Result<RustlsEngine, EngineError> {
        self.engine_capped(server_name, None)
    }

    /// [`Self::engine_for`] whose records carry at most `max_plaintext` bytes of plaintext
    /// (512 to 16,384; `None`: 16,384).
    pub fn engine_capped(
        &self,
        server_name: Option<&str>,
        max_plaintext: Option<usize>,
    ) -> Result<RustlsEngine, EngineError> {
        let (named, chain_only) = match max_plaintext {
            None => (self.named.clone(), self.chain_only.clone()),
            Some(len) => self.capped_configs(len)?,
        };
        let mut capture = None;
        let (cfg, name) = match server_name {
            Some(n) => {
                let named = match &self.sessions {
                    Some(shared) => {
                        let c = Arc::new(SessionCapture::new(shared.clone()));
                        let mut cfg = ClientConfig::clone(&named);
                        cfg.resumption = rustls::client::Resumption::store(c.clone());
                        capture = Some(c);
                        Arc::new(cfg)
                    }
                    None => named,
                };
                (
                    named,
                    ServerName::try_from(n.to_string())
                        .map_err(|e| EngineError::Config(format!("server name: {e}")))?,
                )
            }
            // An IP address as the name: rustls then sends no SNI.
            None => (
                chain_only,
                ServerName::IpAddress(std::net::IpAddr::from([0u8, 0, 0, 0]).into()),
            ),
        };
        let conn = rustls::ClientConnection::new(cfg, name).map_err(rustls_err)?;
        let mut engine = RustlsEngine {
            conn: rustls::Connection::Client(conn),
            role: Role::Client,
            secrets: Arc::new(SecretSink::default()),
            incoming: Vec::new(),
            outgoing: Vec::new(),
            plaintext: Zeroizing::new(Vec::new()),
            server_random: records::ServerRandomWatch::new(),
            pause_after_handshake: self.pause_after_handshake,
            failed: false,
            peer_closed: false,
            capture,
        };
        engine.conn.set_buffer_limit(None);
        Ok(engine)
    }

    /// Both configurations with records capped at `len` bytes of plaintext.
    fn capped_configs(
        &self,
        len: usize,
    ) -> Result<(Arc<ClientConfig>, Arc<ClientConfig>), EngineError> {
        let len = usize::from(crate::max_plaintext_cap(len)?);
        let mut cached = self.capped.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = cached.as_ref().filter(|c| c.len == len) {
            return Ok((c.named.clone(), c.chain_only.clone()));
        }
        let cap = |cfg: &Arc<ClientConfig>| {
            let mut c = ClientConfig::clone(cfg);
            // rustls counts the 5-byte record header in its limit.
            c.max_fragment_size = Some(len + 5);
            Arc::new(c)
        };
        let c = CappedConfigs {
            len,
            named: cap(&self.named),
            chain_only: cap(&self.chain_only),
        };
        let pair = (c.named.clone(), c.chain_only.clone());
        *cached = Some(c);
        Ok(pair)
    }
}

impl crate::ClientContext for RustlsClientContext {
    fn client_engine(
        &self,
        server_name: Option<&str>,
        max_plaintext: Option<usize>,
    ) -> Result<Box<dyn TlsEngine + Send>, EngineError> {
        Ok(Box::new(self.engine_capped(server_name, max_plaintext)?))
    }

    fn keeps_vouched_sessions(&self) -> bool {
        self.sessions.is_some()
    }
}

/// Verifies a server's chain up to the roots (validity, key usage, signatures), not its name:
/// what an OpenSSL client with no host name set checks.
#[derive(Debug)]
struct ChainOnly {
    roots: Arc<RootCertStore>,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        let cert = rustls::server::ParsedCertificate::try_from(end_entity)?;
        rustls::client::verify_server_cert_signed_by_trust_anchor(
            &cert,
            &self.roots,
            intermediates,
            now,
            self.provider.signature_verification_algorithms.all,
        )?;
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::describe;
    use rustls::pki_types::UnixTime;
    use rustls::CertificateError;
    use std::time::Duration;

    /// A certificate's validity is said with dates, not Unix seconds.
    #[test]
    fn certificate_times_are_dates() {
        let at = |secs| UnixTime::since_unix_epoch(Duration::from_secs(secs));
        let expired = rustls::Error::InvalidCertificate(CertificateError::ExpiredContext {
            time: at(1_795_797_137),
            not_after: at(1_580_515_200),
        });
        assert_eq!(
            describe(&expired),
            "invalid peer certificate: it expired at Feb  1 00:00:00 2020 GMT (its notAfter)"
        );
        let early = rustls::Error::InvalidCertificate(CertificateError::NotValidYetContext {
            time: at(1_580_515_200),
            not_before: at(1_795_797_137),
        });
        assert!(
            describe(&early).contains("it is not valid before Nov 27 "),
            "{}",
            describe(&early)
        );
    }
}
