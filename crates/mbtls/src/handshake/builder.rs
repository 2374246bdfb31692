//! Builders for the endpoints' configurations: the four contexts made the way the CLI makes
//! them (OpenSSL for the primary session, rustls for the secondary sessions toward the
//! middleboxes), so that an embedder says only what differs (which middleboxes, which roots,
//! the policy, a TLS version) instead of assembling contexts by hand. Found by an embedder's
//! trial (docs/mbtls.md §4.3): the hand-built version took ≈ 60 lines to copy.

use std::sync::Arc;

use mbx_attest::Policy;
use mbx_engine::{EngineError, Identity, OpenSslContext, RustlsClientContext, TlsConfig};
use mbx_record::TlsVersion;

use super::{
    primary_client_config, primary_server_config, secondary_client_config, ClientHandshakeConfig,
    ClientMiddlebox, HandshakeError, ServerHandshakeConfig, ServerMiddlebox,
};

/// What the primary and secondary contexts share in both builders.
#[derive(Clone, Default)]
struct Common {
    middlebox_roots_pem: Option<Vec<u8>>,
    policy: Policy,
    version: Option<TlsVersion>,
    fresh_evidence: bool,
}

impl Common {
    /// Refuses a policy no middlebox can pass, for an endpoint whose middleboxes may join.
    fn check_policy(&self) -> Result<(), HandshakeError> {
        if self.policy.refuses_every_middlebox() {
            return Err(HandshakeError::Config(
                "the attestation policy accepts no middlebox: it requires evidence and lists \
                 no measurement (give its measurements, or set required = false for \
                 middleboxes without evidence)",
            ));
        }
        Ok(())
    }

    /// The secondary-session context: a rustls client for middlebox certificates under
    /// `roots_pem`, keeping vouched-for middlebox sessions unless fresh evidence is wanted.
    fn secondary(&self, roots_pem: Vec<u8>) -> Result<RustlsClientContext, HandshakeError> {
        let mut tls = secondary_client_config(roots_pem);
        if self.fresh_evidence {
            tls.resume_sessions = 0;
        }
        Ok(RustlsClientContext::new(&tls)?)
    }

    fn primary(&self, tls: TlsConfig) -> Result<Arc<OpenSslContext>, HandshakeError> {
        let tls = match self.version {
            Some(v) => tls.only(v),
            None => tls,
        };
        Ok(Arc::new(OpenSslContext::new(&tls)?))
    }
}

/// The options both builders take, by the same names.
macro_rules! common_options {
    () => {
        /// Trust roots (PEM) for the middleboxes' certificates. The client's default is the
        /// server's roots; a server must give them when a middlebox may join.
        pub fn middlebox_roots(mut self, pem: impl Into<Vec<u8>>) -> Self {
            self.common.middlebox_roots_pem = Some(pem.into());
            self
        }

        /// The attestation policy each middlebox's evidence is checked against (default:
        /// [`Policy::default`], which requires evidence and accepts no measurement yet:
        /// `build` refuses it while middleboxes may join, since none could).
        pub fn policy(mut self, policy: Policy) -> Self {
            self.common.policy = policy;
            self
        }

        /// The primary session in exactly this TLS version (default: TLS 1.2 or 1.3). The
        /// secondary sessions with the middleboxes keep theirs (TLS 1.3 where both sides have
        /// it; which of them resume depends on it, docs/mbtls.md §4.7).
        pub fn only(mut self, version: TlsVersion) -> Self {
            self.common.version = Some(version);
            self
        }

        /// Fresh evidence from each of this endpoint's middleboxes on every session: their
        /// secondary sessions are never resumed. By default a pre-configured middlebox's
        /// session may be: with TLS 1.3 secondary sessions only the one nearest this endpoint
        /// resumes (docs/mbtls.md §4.7). The other endpoint's middleboxes follow its own
        /// configuration.
        pub fn fresh_evidence(mut self) -> Self {
            self.common.fresh_evidence = true;
            self
        }
    };
}

/// Builds a [`ClientHandshakeConfig`]; start with [`ClientHandshakeConfig::builder`].
#[derive(Clone)]
pub struct ClientConfigBuilder {
    server_name: String,
    server_roots_pem: Vec<u8>,
    middlebox: ClientMiddlebox,
    resume_server: bool,
    common: Common,
}

impl ClientHandshakeConfig {
    /// A client of `server_name`, whose certificate must chain to `server_roots_pem` (PEM), with
    /// no middlebox of its own until [`middleboxes`](ClientConfigBuilder::middleboxes) says
    /// which. The contexts are built by [`build`](ClientConfigBuilder::build): the primary on
    /// OpenSSL ([`primary_client_config`]; exportable unless middleboxes are disabled, so
    /// that a client without middleboxes skips OpenSSL's key log), the secondary on rustls
    /// ([`secondary_client_config`]).
    pub fn builder(server_name: &str, server_roots_pem: impl Into<Vec<u8>>) -> ClientConfigBuilder {
        ClientConfigBuilder {
            server_name: server_name.to_owned(),
            server_roots_pem: server_roots_pem.into(),
            middlebox: ClientMiddlebox::Disabled,
            resume_server: false,
            common: Common::default(),
        }
    }
}

impl ClientConfigBuilder {
    /// The client-side middleboxes: pre-configured by name, or discovered on the path and
    /// approved (default: [`ClientMiddlebox::Disabled`]).
    pub fn middleboxes(mut self, middlebox: ClientMiddlebox) -> Self {
        self.middlebox = middlebox;
        self
    }

    /// Resume the primary session with the server on the next connection of a client that
    /// makes many (one session kept, docs/mbtls.md §4.6; off by default).
    pub fn resume_server_sessions(mut self) -> Self {
        self.resume_server = true;
        self
    }

    common_options!();

    /// Builds the contexts and checks the result as [`ClientHandshakeConfig::check`] does.
    pub fn build(self) -> Result<ClientHandshakeConfig, HandshakeError> {
        let disabled = matches!(self.middlebox, ClientMiddlebox::Disabled);
        if !disabled {
            self.common.check_policy()?;
        }
        let mut primary = primary_client_config(&self.server_name, self.server_roots_pem.clone());
        primary.exportable = !disabled;
        primary.resume_sessions = usize::from(self.resume_server);
        let roots = self
            .common
            .middlebox_roots_pem
            .clone()
            .unwrap_or_else(|| self.server_roots_pem.clone());
        let middlebox_roots = match self.common.middlebox_roots_pem {
            Some(_) => "middlebox roots",
            None => "middlebox roots (the server roots, none given)",
        };
        let cfg = ClientHandshakeConfig {
            primary: self
                .common
                .primary(primary)
                .map_err(roots_named("server roots", &self.server_roots_pem))?,
            secondary: Arc::new(
                self.common
                    .secondary(roots.clone())
                    .map_err(roots_named(middlebox_roots, &roots))?,
            ),
            server_name: self.server_name,
            middlebox: self.middlebox,
            policy: self.common.policy,
            // The drivers put the time of each session here.
            now_unix: 0,
        };
        cfg.check()?;
        Ok(cfg)
    }
}

/// Builds a [`ServerHandshakeConfig`]; start with [`ServerHandshakeConfig::builder`].
#[derive(Clone)]
pub struct ServerConfigBuilder {
    identity: Identity,
    middlebox: Option<ServerMiddlebox>,
    session_tickets: bool,
    announcements_after_hello: bool,
    common: Common,
}

impl ServerHandshakeConfig {
    /// A server with `identity` (its certificate chain and key) and no server-side middlebox
    /// until [`middleboxes`](ServerConfigBuilder::middleboxes) says which (client-side
    /// middleboxes need nothing of the server). The contexts are built by
    /// [`build`](ServerConfigBuilder::build): the primary on OpenSSL
    /// ([`primary_server_config`]), the secondary, a TLS client toward the server's
    /// middleboxes, on rustls ([`secondary_client_config`]).
    pub fn builder(identity: Identity) -> ServerConfigBuilder {
        ServerConfigBuilder {
            identity,
            middlebox: None,
            session_tickets: true,
            announcements_after_hello: false,
            common: Common::default(),
        }
    }
}

impl ServerConfigBuilder {
    /// The server-side middleboxes: pre-configured by name (each must announce itself), or
    /// discovered and approved. Their certificates are checked under
    /// [`middlebox_roots`](Self::middlebox_roots), which `build` then requires.
    pub fn middleboxes(mut self, middlebox: ServerMiddlebox) -> Self {
        self.middlebox = Some(middlebox);
        self
    }

    /// Whether the server issues session tickets (on by default, as in
    /// [`TlsConfig`]; TLS 1.2 clients also resume by session ID from OpenSSL's cache).
    pub fn session_tickets(mut self, on: bool) -> Self {
        self.session_tickets = on;
        self
    }

    /// Discovering, also take middleboxes that announce themselves after the ClientHello
    /// (the paper's and the spec's order), at the cost of the key log on every session
    /// ([`ServerHandshakeConfig::announcements_after_hello`]; off by default).
    pub fn announcements_after_hello(mut self, on: bool) -> Self {
        self.announcements_after_hello = on;
        self
    }

    common_options!();

    /// Builds the contexts and checks the result as [`ServerHandshakeConfig::check`] does.
    pub fn build(self) -> Result<ServerHandshakeConfig, HandshakeError> {
        let (middlebox, roots) = match (self.middlebox, self.common.middlebox_roots_pem.clone()) {
            (Some(mb), Some(roots)) => {
                self.common.check_policy()?;
                (mb, roots)
            }
            (Some(_), None) => {
                return Err(HandshakeError::Config(
                    "server-side middleboxes need middlebox_roots to check their certificates",
                ))
            }
            // No middlebox joins: the server's own chain stands in as the (unused) trust store.
            (None, roots) => (
                ServerMiddlebox::none(),
                roots.unwrap_or_else(|| self.identity.cert_chain_pem.clone()),
            ),
        };
        let mut primary = primary_server_config(self.identity);
        primary.session_tickets = self.session_tickets;
        let cfg = ServerHandshakeConfig {
            primary: self.common.primary(primary)?,
            secondary: Arc::new(
                self.common
                    .secondary(roots.clone())
                    .map_err(roots_named("middlebox roots", &roots))?,
            ),
            middlebox,
            policy: self.common.policy,
            // The drivers put the time of each session here.
            now_unix: 0,
            announcements_after_hello: self.announcements_after_hello,
        };
        cfg.check()?;
        Ok(cfg)
    }
}

/// An error from building a context on trust roots `pem`, named as `which` roots (both
/// builders take two sets, and the engine's message named neither), and said to look like a
/// file path when the bytes are one: a path compiles where the PEM goes (`impl Into<Vec<u8>>`;
/// both found in an embedder's trial).
fn roots_named<'a>(
    which: &'a str,
    pem: &'a [u8],
) -> impl FnOnce(HandshakeError) -> HandshakeError + 'a {
    move |e| match e {
        HandshakeError::Engine(EngineError::Config(why)) if why.starts_with("trust roots") => {
            let looks_like_a_path = !pem.is_empty()
                && pem.len() < 4096
                && !pem.windows(10).any(|w| w == b"-----BEGIN")
                && std::str::from_utf8(pem).is_ok_and(|p| !p.contains('\n'));
            let path = match looks_like_a_path {
                true => " (these bytes look like a file path: give the file's contents, e.g. std::fs::read(path)?)",
                false => "",
            };
            let why = why.replacen("trust roots", which, 1);
            HandshakeError::Engine(EngineError::Config(format!("{why}{path}")))
        }
        e => e,
    }
}
