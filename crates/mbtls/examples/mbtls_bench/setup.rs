//! One test PKI (ECDSA P-256 everywhere) and the contexts every configuration is built from.
//! Session tickets are off on every server (plain, split and mbTLS alike), so no handshake
//! pays for issuing tickets nobody uses; except in [`Setup::resuming`]'s, for the rows that
//! measure resumed sessions.

use std::collections::HashMap;
use std::sync::Arc;

use mbx_attest::sim::{measure, signer_id};
use mbx_attest::{HexBytes, Policy, SimulatedAttester, SimulatedPlatform};
use mbx_engine::{ClientContext, Identity, OpenSslContext, RustlsClientContext, TlsConfig};
use mbx_mbtls::handshake::{
    primary_client_config, primary_server_config, secondary_client_config, ClientHandshakeConfig,
    ClientMiddlebox, MiddleboxHandshakeConfig, ServerHandshakeConfig, ServerMiddlebox,
    PRIMARY_CIPHER_SUITES,
};
use mbx_record::TlsVersion;
use mbx_testbed::pki::{KeyType, LeafSpec, TestPki};

use crate::Res;

const PROGRAM: &str = "mbx-bench-middlebox";
pub const SERVER: &str = "server.test";
/// Middlebox names: client side (path order from the client) and server side.
pub const CLIENT_SIDE: [&str; 2] = ["mb1.test", "mb0.test"];
pub const SERVER_SIDE: [&str; 2] = ["mb2.test", "mb3.test"];

#[derive(Clone)]
pub struct Setup {
    /// Endpoints resume: clients keep the server's sessions, servers issue tickets.
    resume: bool,
    root: Vec<u8>,
    server_id: Identity,
    platform: Arc<SimulatedPlatform>,
    /// Per middlebox name: identity and certificate DER.
    middleboxes: HashMap<&'static str, Identity>,
    /// The first server-side middlebox's identity with its evidence in its certificate (the
    /// spec's second binding mode, docs/mbtls.md §4.8).
    evidence_in_certificate: Identity,
}

/// The middleboxes' simulated attester.
fn attester(platform: &Arc<SimulatedPlatform>) -> SimulatedAttester {
    SimulatedAttester::new(
        platform.clone(),
        measure(PROGRAM, b""),
        signer_id("mbx bench"),
    )
}

fn identity(pki: &TestPki, spec: &LeafSpec) -> Res<Identity> {
    let leaf = pki.issue(spec)?;
    Ok(Identity::from_pem(
        leaf.chain_pem(),
        leaf.key_pem().as_bytes(),
    ))
}

impl Setup {
    /// `key_type` for the root and every leaf (server, middleboxes). For profiling,
    /// `MBTLS_BENCH_MIDDLEBOX_KEYS=ed25519` (or `ecdsa`, `rsa`) gives the middleboxes' leaves
    /// another key type: what the endpoints' secondary sessions check is the operator's choice.
    pub fn new(key_type: KeyType) -> Res<Setup> {
        let pki = TestPki::with_key_type("mbx bench root", key_type)?;
        let server_id = identity(&pki, &LeafSpec::server(SERVER).key_type(key_type))?;
        let middlebox_keys = match std::env::var("MBTLS_BENCH_MIDDLEBOX_KEYS").as_deref() {
            Ok("ed25519") => KeyType::Ed25519,
            Ok("ecdsa") => KeyType::EcdsaP256,
            Ok("rsa") => KeyType::Rsa2048,
            _ => key_type,
        };
        let mut middleboxes = HashMap::new();
        for name in CLIENT_SIDE.into_iter().chain(SERVER_SIDE) {
            let spec = LeafSpec::middlebox(name).key_type(middlebox_keys);
            middleboxes.insert(name, identity(&pki, &spec)?);
        }
        let platform = Arc::new(SimulatedPlatform::generate()?);
        let attester = attester(&platform);
        let evidence_for = |spki: &[u8]| {
            mbx_attest::CertificateEvidence::make(&attester, spki, b"bench nonce")
                .and_then(|e| e.encode())
                // An empty extension would only fail later, further from the cause.
                .expect("the benchmark middlebox's certificate evidence")
        };
        let oid = &mbx_attest::cert_bound::EVIDENCE_EXTENSION_OID;
        let spec = LeafSpec::middlebox(SERVER_SIDE[0]).key_type(middlebox_keys);
        let leaf = pki.issue_with_extension(&spec, Some((oid, &evidence_for)))?;
        let evidence_in_certificate =
            Identity::from_pem(leaf.chain_pem(), leaf.key_pem().as_bytes());
        Ok(Setup {
            resume: false,
            root: pki.root_pem().into_bytes(),
            server_id,
            platform,
            middleboxes,
            evidence_in_certificate,
        })
    }

    /// The same PKI with endpoints that resume sessions: every client context keeps the
    /// server's sessions (`resume_sessions`), every endpoint server issues tickets, and so do
    /// middleboxes, whose secondary sessions the endpoints resume (docs/mbtls.md §4.6).
    pub fn resuming(&self) -> Setup {
        Setup {
            resume: true,
            ..self.clone()
        }
    }

    /// Servers' tickets: off, unless this setup resumes.
    fn tickets(&self, mut cfg: TlsConfig) -> TlsConfig {
        cfg.session_tickets = self.resume;
        cfg
    }

    /// Clients' sessions: kept for the one server, if this setup resumes.
    fn sessions(&self, mut cfg: TlsConfig) -> TlsConfig {
        cfg.resume_sessions = usize::from(self.resume);
        cfg
    }

    /// The suites an mbTLS primary session offers and accepts (`PRIMARY_CIPHER_SUITES`, as
    /// `primary_client_config` and `primary_server_config` set them), for plain and split TLS:
    /// every configuration sends and reads the same ClientHello list, so the ratios hold only
    /// what mbTLS adds.
    fn primary_suites(cfg: TlsConfig) -> TlsConfig {
        TlsConfig {
            cipher_suites: PRIMARY_CIPHER_SUITES.to_vec(),
            ..cfg
        }
    }

    /// The endpoints' attestation policy: evidence from the simulated platform required, or
    /// not asked for at all (`attest = false`).
    pub fn policy(&self, attest: bool) -> Policy {
        Policy {
            required: attest,
            allow_simulated: true,
            measurements: vec![HexBytes(measure(PROGRAM, b"").to_vec())],
            sim_platform_keys: vec![HexBytes(self.platform.public_key().to_vec())],
            ..Policy::default()
        }
    }

    /// A middlebox's certificate and attester (simulated, or none).
    pub fn middlebox(&self, name: &str, attest: bool) -> Res<MiddleboxHandshakeConfig> {
        let id = self.middleboxes.get(name).ok_or("unknown middlebox")?;
        let attester: Option<Arc<dyn mbx_attest::Attester>> = if attest {
            Some(Arc::new(attester(&self.platform)))
        } else {
            None
        };
        Ok(MiddleboxHandshakeConfig::new(
            &self.tickets(TlsConfig::server(id.clone())),
            attester,
        )?)
    }

    /// The first server-side middlebox with its evidence in its certificate: it points each
    /// session at that evidence and makes none.
    pub fn middlebox_with_evidence_in_certificate(&self) -> Res<MiddleboxHandshakeConfig> {
        let tls = self.tickets(TlsConfig::server(self.evidence_in_certificate.clone()));
        let attester: Arc<dyn mbx_attest::Attester> = Arc::new(attester(&self.platform));
        Ok(MiddleboxHandshakeConfig::new(&tls, Some(attester))?.evidence_in_certificate()?)
    }

    pub fn mbtls_client(
        &self,
        version: TlsVersion,
        middlebox: ClientMiddlebox,
        attest: bool,
    ) -> Res<ClientHandshakeConfig> {
        // As the builders and the CLI make it (suites, extension, pause).
        let mut primary =
            self.sessions(primary_client_config(SERVER, self.root.clone()).only(version));
        // A client that can have no middlebox on its side keeps its session in OpenSSL.
        primary.exportable = !matches!(middlebox, ClientMiddlebox::Disabled);
        let secondary = secondary_client_config(self.root.clone());
        Ok(ClientHandshakeConfig {
            primary: Arc::new(OpenSslContext::new(&primary)?),
            server_name: SERVER.into(),
            secondary: secondary_context(&secondary)?,
            middlebox,
            policy: self.policy(attest),
            now_unix: now_unix(),
        })
    }

    pub fn mbtls_server(
        &self,
        version: TlsVersion,
        middlebox: ServerMiddlebox,
        attest: bool,
    ) -> Res<ServerHandshakeConfig> {
        let primary = self.tickets(primary_server_config(self.server_id.clone()).only(version));
        let secondary = secondary_client_config(self.root.clone());
        Ok(ServerHandshakeConfig {
            primary: Arc::new(OpenSslContext::new(&primary)?),
            secondary: secondary_context(&secondary)?,
            middlebox,
            policy: self.policy(attest),
            now_unix: now_unix(),
            announcements_after_hello: false,
        })
    }

    /// A plain TLS client of the server (OpenSSL engine).
    pub fn tls_client(&self, version: TlsVersion) -> Res<Arc<OpenSslContext>> {
        let cfg = Self::primary_suites(
            self.sessions(
                TlsConfig::client(SERVER, self.root.clone())
                    .only(version)
                    .without_export(),
            ),
        );
        Ok(Arc::new(OpenSslContext::new(&cfg)?))
    }

    /// A plain TLS server (OpenSSL engine) with the server's certificate.
    pub fn tls_server(&self, version: TlsVersion) -> Res<Arc<OpenSslContext>> {
        let cfg = Self::primary_suites(
            self.tickets(
                TlsConfig::server(self.server_id.clone())
                    .only(version)
                    .without_export(),
            ),
        );
        Ok(Arc::new(OpenSslContext::new(&cfg)?))
    }

    /// The TLS-terminating side of a split-TLS middlebox: it must present a certificate for
    /// the server's name, so it gets the server's identity (an interception CA in practice;
    /// same key type and chain length, so the same cost).
    pub fn split_front(&self, version: TlsVersion) -> Res<Arc<OpenSslContext>> {
        self.tls_server(version)
    }
}

fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The endpoints' context for their secondary sessions: rustls (what the CLI uses), or
/// OpenSSL with `MBTLS_BENCH_SECONDARY=openssl` (to compare the two clients).
/// `MBTLS_BENCH_CHAIN_CACHE=0` turns the verified-chain cache off (every secondary session
/// checks the middlebox's chain, as on an endpoint's first connection to it);
/// `MBTLS_BENCH_SECONDARY_RESUME=0` makes the secondary context keep no sessions (an OpenSSL
/// secondary context never does: `check_secondary_context`).
fn secondary_context(cfg: &TlsConfig) -> Res<Arc<dyn ClientContext>> {
    let mut cfg = cfg.clone();
    if let Ok(n) = std::env::var("MBTLS_BENCH_CHAIN_CACHE") {
        cfg.verified_chain_cache = n.parse()?;
    }
    if let Ok(n) = std::env::var("MBTLS_BENCH_SECONDARY_RESUME") {
        cfg.resume_sessions = n.parse()?;
    }
    let cfg = &cfg;
    Ok(match std::env::var("MBTLS_BENCH_SECONDARY").as_deref() {
        // OpenSSL would keep sessions before the evidence is checked: no resumption.
        Ok("openssl") => Arc::new(OpenSslContext::new(&TlsConfig {
            resume_sessions: 0,
            ..cfg.clone()
        })?),
        _ => Arc::new(RustlsClientContext::new(cfg)?),
    })
}
