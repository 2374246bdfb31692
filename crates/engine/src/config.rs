//! Engine configuration shared by the OpenSSL and rustls engines.

use std::fmt;
use std::sync::Arc;

use mbx_record::TlsVersion;
use openssl::pkey::{PKey, Private};
use zeroize::Zeroizing;

use crate::AlertDescription;

/// Which side of the handshake an engine plays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Client,
    Server,
}

/// A certificate chain (leaf first) and its private key, both PEM.
#[derive(Clone)]
pub struct Identity {
    pub cert_chain_pem: Vec<u8>,
    pub key_pem: Zeroizing<Vec<u8>>,
}

impl Identity {
    /// From PEM text: the certificate chain (leaf first) and the private key, which is held
    /// in memory that is wiped on drop.
    pub fn from_pem(cert_chain_pem: impl Into<Vec<u8>>, key_pem: impl Into<Vec<u8>>) -> Identity {
        Identity {
            cert_chain_pem: cert_chain_pem.into(),
            key_pem: Zeroizing::new(key_pem.into()),
        }
    }

    /// The private key, parsed. An encrypted key is refused, never decrypted: OpenSSL's
    /// default would ask for its passphrase on the terminal, which blocks the thread (a
    /// service reloading its configuration stopped serving) or fails with a page of errors
    /// when there is no terminal (found in a user trial).
    pub fn private_key(&self) -> Result<PKey<Private>, crate::EngineError> {
        // OpenSSL asks for a passphrase only for an encrypted key, in any of its forms; the
        // answer is none, and the key is refused.
        let mut asked = false;
        let key = PKey::private_key_from_pem_callback(&self.key_pem, |_| {
            asked = true;
            Ok(0)
        });
        key.map_err(|e| match asked {
            true => crate::EngineError::EncryptedPrivateKey,
            false => crate::EngineError::Config(format!("private key: {e}")),
        })
    }
}

impl fmt::Debug for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Identity")
            .field("key_pem", &"<redacted>")
            .finish_non_exhaustive()
    }
}

/// What a handler decides about a received custom extension.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExtensionResponse {
    /// Keep the payload (readable through `received_extension`) and send nothing back.
    Accept,
    /// Keep the payload and, on a server, answer with this payload in the ServerHello (TLS 1.2)
    /// or EncryptedExtensions (TLS 1.3). Ignored on clients.
    Reply(Vec<u8>),
    /// Abort the handshake with this fatal alert.
    Reject(AlertDescription),
}

/// Called inside the handshake with a received extension payload. Must not block.
pub type ExtensionHandler = Arc<dyn Fn(&[u8]) -> ExtensionResponse + Send + Sync>;

/// A custom (private-use) TLS extension handled by the OpenSSL engine. The rustls engine rejects
/// any configuration containing one with [`crate::EngineError::Unsupported`]: rustls cannot add
/// extensions by design.
#[derive(Clone)]
pub struct CustomExtension {
    /// Codepoint; mbTLS uses one in the private-use range 0xFF00–0xFFFF.
    pub ext_type: u16,
    /// Clients: payload put in every ClientHello (a connection can override it with
    /// `OpenSslEngine::set_extension_payload`). `None`: sent only when set per connection.
    pub client_payload: Option<Vec<u8>>,
    /// Called with what the peer sent (server: the ClientHello's payload; client: the server's
    /// reply). Without a handler the payload is accepted and stored.
    pub handler: Option<ExtensionHandler>,
}

impl CustomExtension {
    /// An extension registered for receiving (server) or replies (client), with no handler.
    pub fn new(ext_type: u16) -> Self {
        Self {
            ext_type,
            client_payload: None,
            handler: None,
        }
    }
}

impl fmt::Debug for CustomExtension {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CustomExtension")
            .field("ext_type", &format_args!("{:#06x}", self.ext_type))
            .field(
                "client_payload",
                &self.client_payload.as_ref().map(Vec::len),
            )
            .field("handler", &self.handler.is_some())
            .finish()
    }
}

/// Configuration of one side of a TLS connection.
#[derive(Clone, Debug)]
pub struct TlsConfig {
    pub role: Role,
    /// Our certificate and key (required for servers, optional client certificate).
    pub identity: Option<Identity>,
    /// PEM trust anchors for verifying the peer.
    pub trust_roots_pem: Option<Vec<u8>>,
    /// Client: verify the server chain (and hostname, when `server_name` is set).
    /// Server: require and verify a client certificate.
    pub verify_peer: bool,
    /// Client: SNI and the name checked against the server certificate.
    pub server_name: Option<String>,
    /// ALPN protocols in preference order (empty: no ALPN).
    pub alpn: Vec<Vec<u8>>,
    pub min_version: TlsVersion,
    pub max_version: TlsVersion,
    /// IANA ids of the AEAD suites to offer/accept (empty: library defaults). See
    /// [`suite_openssl_name`] for the supported ids.
    pub cipher_suites: Vec<u16>,
    /// Servers: issue session tickets (TLS 1.2 NewSessionTicket / TLS 1.3 tickets).
    pub session_tickets: bool,
    /// OpenSSL servers: keep the sessions of full handshakes in the context's cache, for TLS
    /// 1.2 session-ID resumption (default). Off: the server keeps nothing per session, and
    /// only its stateless tickets resume (with `session_tickets`), which only the holder of
    /// the context's ticket key can open: an mbTLS middlebox's secondary sessions.
    pub session_cache: bool,
    /// OpenSSL servers with `session_tickets`: seal tickets under keys the context makes and
    /// replaces every this long (at least 1 s), instead of OpenSSL's one key for the
    /// context's whole life. A ticket opens during its key's period and the next (1 to 2
    /// periods; OpenSSL renews it in the second), and a key is wiped when it leaves, so a
    /// stolen key opens only recent tickets. `None` (default): OpenSSL's key.
    /// `OpenSslContext::rotate_ticket_keys` starts a new period at once.
    pub ticket_key_rotation: Option<std::time::Duration>,
    /// Key-exchange groups in preference order, by OpenSSL name (`X25519`, `P-256`, `P-384`,
    /// …; empty: library defaults; rustls knows these three). A client sends its TLS 1.3 key
    /// share for the first. A server limited to a group the
    /// client did not send a key share for answers a TLS 1.3 ClientHello with a
    /// HelloRetryRequest.
    pub groups: Vec<String>,
    /// Private-use extensions (OpenSSL engine only).
    pub custom_extensions: Vec<CustomExtension>,
    /// Stop processing incoming records as soon as the handshake completes, so that everything
    /// after it is left for the caller's record layer (see `Handoff::unprocessed_incoming`).
    pub pause_after_handshake: bool,
    /// Keep what [`crate::TlsEngine::export_session`] needs (default). OpenSSL engine: it
    /// hands TLS 1.3 traffic secrets out only through its key-log callback, which formats every
    /// secret as hex with one `sprintf` per byte (≈ 17–37 µs per TLS 1.3 handshake on our
    /// machines; TLS 1.2 exports read the master secret from the session and need no key log);
    /// a session that is never exported (plain TLS, middleboxes' own sessions) turns this off
    /// and `export_session` then fails with `Unsupported`. rustls: ignored (its key log costs
    /// nothing measurable).
    pub exportable: bool,
    /// rustls client only: remember up to this many server chains that verified, and accept
    /// the same chain (same bytes, same name) again without checking its signatures while
    /// the time is inside the window in which all its certificates are valid. The handshake
    /// signature (CertificateVerify) is checked every time; a chain that failed is checked in
    /// full every time. 0 (default): off. For clients that meet the same few peers on every
    /// connection, such as an mbTLS endpoint's secondary sessions to its middleboxes.
    pub verified_chain_cache: usize,
    /// Client contexts: resume sessions. The context remembers what the servers of up to
    /// this many server names gave it (TLS 1.2 session IDs or tickets, TLS 1.3 tickets) and
    /// offers the newest for the same name on the next connection; a server that refuses it
    /// gets a full handshake. A TLS 1.3 ticket is offered once (RFC 8446 §C.4), a TLS 1.2
    /// session as long as the server takes it. 0 (default): off. OpenSSL keeps every session
    /// a server gives; a `RustlsClientContext` only those of connections its caller vouched
    /// for ([`crate::TlsEngine::vouch_for_session`]), and only for configured names; a
    /// `RustlsEngine` ignores it (it builds its configuration per session). See docs/mbtls.md
    /// §4.6 and §4.7 for what a resumed mbTLS session keeps.
    pub resume_sessions: usize,
}

impl TlsConfig {
    /// A client verifying `server_name` against `trust_roots_pem`, TLS 1.2–1.3.
    pub fn client(server_name: &str, trust_roots_pem: Vec<u8>) -> Self {
        Self {
            role: Role::Client,
            identity: None,
            trust_roots_pem: Some(trust_roots_pem),
            verify_peer: true,
            server_name: Some(server_name.to_owned()),
            alpn: Vec::new(),
            min_version: TlsVersion::Tls12,
            max_version: TlsVersion::Tls13,
            cipher_suites: Vec::new(),
            session_tickets: true,
            session_cache: true,
            ticket_key_rotation: None,
            groups: Vec::new(),
            custom_extensions: Vec::new(),
            pause_after_handshake: false,
            exportable: true,
            verified_chain_cache: 0,
            resume_sessions: 0,
        }
    }

    /// A server presenting `identity`, no client authentication, TLS 1.2–1.3.
    pub fn server(identity: Identity) -> Self {
        Self {
            role: Role::Server,
            identity: Some(identity),
            trust_roots_pem: None,
            verify_peer: false,
            server_name: None,
            alpn: Vec::new(),
            min_version: TlsVersion::Tls12,
            max_version: TlsVersion::Tls13,
            cipher_suites: Vec::new(),
            session_tickets: true,
            session_cache: true,
            ticket_key_rotation: None,
            groups: Vec::new(),
            custom_extensions: Vec::new(),
            pause_after_handshake: false,
            exportable: true,
            verified_chain_cache: 0,
            resume_sessions: 0,
        }
    }

    /// Restricts the connection to exactly one version.
    pub fn only(mut self, version: TlsVersion) -> Self {
        self.min_version = version;
        self.max_version = version;
        self
    }

    /// A session that is never exported (see [`TlsConfig::exportable`]).
    pub fn without_export(mut self) -> Self {
        self.exportable = false;
        self
    }

    /// Whether a context built from `other` would act as one built from `self`: every setting
    /// equal (the private key compared in constant time). A custom extension with a handler
    /// never compares equal (closures cannot be compared). A reload that changed nothing can
    /// then keep its running context, and with it the sessions that context would resume.
    pub fn same_settings(&self, other: &TlsConfig) -> bool {
        // Destructured, so that a new field cannot be left out of the comparison.
        let TlsConfig {
            role,
            identity,
            trust_roots_pem,
            verify_peer,
            server_name,
            alpn,
            min_version,
            max_version,
            cipher_suites,
            session_tickets,
            session_cache,
            ticket_key_rotation,
            groups,
            custom_extensions,
            pause_after_handshake,
            exportable,
            verified_chain_cache,
            resume_sessions,
        } = self;
        let same_identity = match (identity, &other.identity) {
            (None, None) => true,
            (Some(a), Some(b)) => {
                a.cert_chain_pem == b.cert_chain_pem
                    && bool::from(subtle::ConstantTimeEq::ct_eq(
                        a.key_pem.as_slice(),
                        b.key_pem.as_slice(),
                    ))
            }
            _ => false,
        };
        let same_extension = |a: &CustomExtension, b: &CustomExtension| {
            a.ext_type == b.ext_type
                && a.client_payload == b.client_payload
                && a.handler.is_none()
                && b.handler.is_none()
        };
        same_identity
            && *role == other.role
            && *trust_roots_pem == other.trust_roots_pem
            && *verify_peer == other.verify_peer
            && *server_name == other.server_name
            && *alpn == other.alpn
            && *min_version == other.min_version
            && *max_version == other.max_version
            && *cipher_suites == other.cipher_suites
            && *session_tickets == other.session_tickets
            && *session_cache == other.session_cache
            && *ticket_key_rotation == other.ticket_key_rotation
            && *groups == other.groups
            && custom_extensions.len() == other.custom_extensions.len()
            && custom_extensions
                .iter()
                .zip(&other.custom_extensions)
                .all(|(a, b)| same_extension(a, b))
            && *pause_after_handshake == other.pause_after_handshake
            && *exportable == other.exportable
            && *verified_chain_cache == other.verified_chain_cache
            && *resume_sessions == other.resume_sessions
    }

    /// ALPN protocols in the wire format (length-prefixed list).
    pub(crate) fn alpn_wire(&self) -> Result<Vec<u8>, crate::EngineError> {
        let mut out = Vec::new();
        for p in &self.alpn {
            let len = u8::try_from(p.len())
                .ok()
                .filter(|l| *l > 0)
                .ok_or_else(|| {
                    crate::EngineError::Config("ALPN protocol must be 1..=255 bytes".into())
                })?;
            out.push(len);
            out.extend_from_slice(p);
        }
        Ok(out)
    }
}

/// OpenSSL's name for an AEAD suite and whether it is a TLS 1.3 suite. These nine are the AEAD
/// suites both OpenSSL and rustls implement and `mbx-record` can take over.
pub fn suite_openssl_name(id: u16) -> Option<(&'static str, bool)> {
    Some(match id {
        0x1301 => ("TLS_AES_128_GCM_SHA256", true),
        0x1302 => ("TLS_AES_256_GCM_SHA384", true),
        0x1303 => ("TLS_CHACHA20_POLY1305_SHA256", true),
        0xC02B => ("ECDHE-ECDSA-AES128-GCM-SHA256", false),
        0xC02C => ("ECDHE-ECDSA-AES256-GCM-SHA384", false),
        0xC02F => ("ECDHE-RSA-AES128-GCM-SHA256", false),
        0xC030 => ("ECDHE-RSA-AES256-GCM-SHA384", false),
        0xCCA8 => ("ECDHE-RSA-CHACHA20-POLY1305", false),
        0xCCA9 => ("ECDHE-ECDSA-CHACHA20-POLY1305", false),
        0x009E => ("DHE-RSA-AES128-GCM-SHA256", false),
        0x009F => ("DHE-RSA-AES256-GCM-SHA384", false),
        0xCCAA => ("DHE-RSA-CHACHA20-POLY1305", false),
        _ => return None,
    })
}

/// The certificates of a trust-roots PEM, for both engines. Roots that hold no certificate
/// (e.g. the wrong file) are refused when the context is built, instead of every handshake
/// failing later with an unknown CA.
pub(crate) fn trust_roots(pem: &[u8]) -> Result<Vec<openssl::x509::X509>, crate::EngineError> {
    let roots = openssl::x509::X509::stack_from_pem(pem)
        .map_err(|e| crate::EngineError::Config(format!("trust roots: {e}")))?;
    if roots.is_empty() {
        return Err(crate::EngineError::Config(
            "trust roots: no certificate found (expected PEM \"BEGIN CERTIFICATE\" blocks)".into(),
        ));
    }
    Ok(roots)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server() -> TlsConfig {
        TlsConfig::server(Identity::from_pem(b"chain".to_vec(), b"key".to_vec()))
    }

    #[test]
    fn equal_settings_are_the_same_and_any_change_is_not() {
        let client = TlsConfig::client("server.test", b"roots".to_vec());
        assert!(client.same_settings(&client.clone()));
        assert!(server().same_settings(&server()));
        let changes: [fn(&mut TlsConfig); 9] = [
            |c| c.session_cache = false,
            |c| c.trust_roots_pem = Some(b"other roots".to_vec()),
            |c| c.server_name = Some("other.test".into()),
            |c| c.min_version = TlsVersion::Tls13,
            |c| c.resume_sessions = 1,
            |c| c.exportable = false,
            |c| c.groups = vec!["P-256".into()],
            |c| c.identity = Some(Identity::from_pem(b"chain".to_vec(), b"other".to_vec())),
            |c| c.custom_extensions = vec![CustomExtension::new(0xff00)],
        ];
        for (i, change) in changes.iter().enumerate() {
            let mut other = server();
            change(&mut other);
            assert!(!server().same_settings(&other), "change {i}");
            assert!(!other.same_settings(&server()), "change {i}");
        }
        let mut with_ext = client.clone();
        with_ext.custom_extensions = vec![CustomExtension::new(0xff00)];
        assert!(with_ext.same_settings(&with_ext.clone()));
        // A handler is a closure: never the same as anything.
        with_ext.custom_extensions[0].handler = Some(Arc::new(|_| ExtensionResponse::Accept));
        assert!(!with_ext.same_settings(&with_ext.clone()));
    }

    /// An encrypted key is refused, in either PEM form, without asking for a passphrase (the
    /// test has no terminal: a prompt would fail with OpenSSL's errors instead); the same key
    /// unencrypted parses.
    #[test]
    fn an_encrypted_private_key_is_refused_without_a_prompt() {
        use openssl::ec::{EcGroup, EcKey};
        use openssl::nid::Nid;
        use openssl::symm::Cipher;
        let group = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1).unwrap();
        let ec = EcKey::generate(&group).unwrap();
        let key = PKey::from_ec_key(ec.clone()).unwrap();
        let pkcs8 = key
            .private_key_to_pem_pkcs8_passphrase(Cipher::aes_256_cbc(), b"secret")
            .unwrap();
        let traditional = ec
            .private_key_to_pem_passphrase(Cipher::aes_256_cbc(), b"secret")
            .unwrap();
        for pem in [pkcs8, traditional] {
            let e = Identity::from_pem(Vec::new(), pem)
                .private_key()
                .unwrap_err();
            assert!(e.to_string().contains("it is encrypted"), "{e}");
        }
        let plain = Identity::from_pem(Vec::new(), key.private_key_to_pem_pkcs8().unwrap());
        assert!(plain.private_key().unwrap().public_eq(&key));
    }
}
