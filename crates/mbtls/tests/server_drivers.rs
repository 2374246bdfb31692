//! Server-side middleboxes over real TCP on loopback: legacy clients (**curl**, **openssl
//! s_client**) → server-side middlebox → mbTLS server → plain HTTP backend, TLS 1.2 and 1.3;
//! the full path mbTLS client → client-side middlebox → server-side middlebox → mbTLS server;
//! a legacy server behind a server-side middlebox is remembered and not announced to again.
//!
//! Time is never asserted; `tokio::time::timeout` only bounds waits so a hang fails the test.

mod leaf;
use leaf::identity;
use mbx_testbed::tcp_table::{self, established_timer, KEEPALIVE};

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use mbx_apps::{HttpHeaderInsert, MiddleboxApp};
use mbx_attest::sim::{measure, signer_id};
use mbx_attest::{HexBytes, Policy, SimulatedAttester, SimulatedPlatform};
use mbx_engine::{CustomExtension, Identity, OpenSslContext, TlsConfig};
use mbx_mbtls::driver::{
    answer_with_error, AppFactory, ClientProxy, ClientProxyConfig, ConnectionReport, DriverError,
    ErrorKind, HandshakeProgress, Limits, MbtlsClient, MbtlsServer, MbtlsServerConfig,
    MbtlsServerConnection, MiddleboxServer, MiddleboxServerConfig, MiddleboxVerdict, Placement,
    RECEIVED_FROM_THE_PATH,
};
use mbx_mbtls::handshake::{
    ClientHandshakeConfig, ClientMiddlebox, MiddleboxHandshakeConfig, ServerHandshakeConfig,
    ServerMiddlebox,
};
use mbx_mbtls::{Side, MIDDLEBOX_SUPPORT_EXTENSION};
use mbx_record::TlsVersion;
use mbx_testbed::{
    Curl, InteractiveClient, LeafSpec, Nginx, OpensslClient, OpensslServer, PkiFiles, TestPki,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::time::timeout;

const PROGRAM: &str = "mbx-test-middlebox";
const BOUND: Duration = Duration::from_secs(60);
const VERSIONS: [TlsVersion; 2] = [TlsVersion::Tls12, TlsVersion::Tls13];

fn tb(v: TlsVersion) -> mbx_testbed::TlsVersion {
    match v {
        TlsVersion::Tls12 => mbx_testbed::TlsVersion::Tls12,
        TlsVersion::Tls13 => mbx_testbed::TlsVersion::Tls13,
    }
}

struct World {
    _dir: tempfile::TempDir,
    pki: TestPki,
    root_pem: Vec<u8>,
    server_files: PkiFiles,
    server_id: Identity,
    platform: Arc<SimulatedPlatform>,
}

impl World {
    fn new() -> World {
        let pki = TestPki::new("mbtls server-side test root").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let server = pki.issue(&LeafSpec::server("server.test")).unwrap();
        let server_files = server.write_to(dir.path()).unwrap();
        World {
            _dir: dir,
            root_pem: pki.root_pem().into_bytes(),
            server_id: Identity::from_pem(server.chain_pem(), server.key_pem().as_bytes()),
            server_files,
            pki,
            platform: Arc::new(SimulatedPlatform::generate().unwrap()),
        }
    }

    fn policy(&self) -> Policy {
        Policy {
            allow_simulated: true,
            measurements: vec![HexBytes(measure(PROGRAM, b"").to_vec())],
            sim_platform_keys: vec![HexBytes(self.platform.public_key().to_vec())],
            ..Policy::default()
        }
    }

    fn middlebox(
        &self,
        name: &str,
        next_hop: SocketAddr,
        placement: Placement,
    ) -> MiddleboxServerConfig {
        let (id, _) = identity(&self.pki, &LeafSpec::middlebox(name));
        let attester = SimulatedAttester::new(
            self.platform.clone(),
            measure(PROGRAM, b""),
            signer_id("mbx tests"),
        );
        MiddleboxServerConfig {
            handshake: MiddleboxHandshakeConfig::new(
                &TlsConfig::server(id),
                Some(Arc::new(attester)),
            )
            .unwrap(),
            next_hop: next_hop.to_string().into(),
            app: header_app(name),
            placement,
            limits: mbx_mbtls::driver::Limits::default(),
            forget_legacy_after: None,
        }
    }

    fn server(&self, version: TlsVersion, backend: SocketAddr) -> MbtlsServerConfig {
        self.server_with_tickets(version, backend, true)
    }

    /// [`server`](Self::server); `tickets: false`: no session tickets (TLS 1.2 clients then
    /// resume by session ID, from OpenSSL's server cache).
    fn server_with_tickets(
        &self,
        version: TlsVersion,
        backend: SocketAddr,
        tickets: bool,
    ) -> MbtlsServerConfig {
        let mut primary = TlsConfig::server(self.server_id.clone()).only(version);
        primary.pause_after_handshake = true;
        primary.session_tickets = tickets;
        let secondary = TlsConfig::client("mb2.test", self.root_pem.clone());
        MbtlsServerConfig {
            handshake: ServerHandshakeConfig {
                primary: Arc::new(OpenSslContext::new(&primary).unwrap()),
                secondary: Arc::new(OpenSslContext::new(&secondary).unwrap()),
                middlebox: ServerMiddlebox::Preconfigured("mb2.test".into()),
                policy: self.policy(),
                now_unix: 0,
                announcements_after_hello: false,
            },
            backend: backend.to_string(),
            limits: mbx_mbtls::driver::Limits::default(),
            backend_unavailable: None,
        }
    }

    /// A listening mbTLS server in front of `backend` that takes no middlebox of its own side.
    async fn server_without_middleboxes(
        &self,
        version: TlsVersion,
        backend: SocketAddr,
    ) -> MbtlsServer {
        let mut cfg = self.server(version, backend);
        cfg.handshake.middlebox = ServerMiddlebox::none();
        MbtlsServer::bind("127.0.0.1:0", cfg).await.unwrap()
    }

    /// An mbTLS server in front of `backend` with the server-side middlebox mb2 in front of it.
    async fn server_behind_mb2(
        &self,
        version: TlsVersion,
        backend: SocketAddr,
    ) -> (MbtlsServer, MiddleboxServer) {
        self.server_behind_mb2_with(self.server(version, backend))
            .await
    }

    /// An mbTLS server of configuration `cfg` with the server-side middlebox mb2 in front of it.
    async fn server_behind_mb2_with(
        &self,
        cfg: MbtlsServerConfig,
    ) -> (MbtlsServer, MiddleboxServer) {
        let server = MbtlsServer::bind("127.0.0.1:0", cfg).await.unwrap();
        let mb2 = self.mb2_to(server.local_addr()).await;
        (server, mb2)
    }

    /// [`server_behind_mb2`](Self::server_behind_mb2) with a server whose policy refuses
    /// mb2's code.
    async fn server_refusing_mb2(
        &self,
        version: TlsVersion,
        backend: SocketAddr,
    ) -> (MbtlsServer, MiddleboxServer) {
        let mut cfg = self.server(version, backend);
        cfg.handshake.policy.measurements =
            vec![HexBytes(measure("another program", b"").to_vec())];
        self.server_behind_mb2_with(cfg).await
    }

    /// curl (a legacy client) fetching `https://server.test{path}` from 127.0.0.1:`port`,
    /// trusting the test CA; `version`: only that TLS version.
    async fn curl(
        &self,
        port: u16,
        path: &str,
        version: Option<TlsVersion>,
    ) -> mbx_testbed::peers::CurlOutput {
        let (ca, url) = (
            self.server_files.ca.clone(),
            format!("https://server.test:{port}{path}"),
        );
        tokio::task::spawn_blocking(move || {
            let curl = Curl::new(&url).cacert(ca).resolve(
                "server.test",
                port,
                "127.0.0.1".parse().unwrap(),
            );
            match version {
                Some(v) => curl.version(tb(v)),
                None => curl,
            }
            .run()
            .unwrap()
        })
        .await
        .unwrap()
    }

    /// The server-side middlebox mb2, in front of `next_hop`.
    async fn mb2_to(&self, next_hop: SocketAddr) -> MiddleboxServer {
        MiddleboxServer::bind(
            "127.0.0.1:0",
            self.middlebox("mb2.test", next_hop, Placement::ServerSide),
        )
        .await
        .unwrap()
    }

    /// A listener for an application serving mbTLS itself, behind the server-side middlebox
    /// mb2, with the client-side mb1 in front of that: (listener, mb1, mb2).
    async fn app_behind_mb1_and_mb2(&self) -> (TcpListener, MiddleboxServer, MiddleboxServer) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mb2 = self.mb2_to(listener.local_addr().unwrap()).await;
        let mb1 = self.mb1_to(mb2.local_addr()).await;
        (listener, mb1, mb2)
    }

    /// The client-side middlebox mb1, in front of `next_hop`.
    async fn mb1_to(&self, next_hop: SocketAddr) -> MiddleboxServer {
        MiddleboxServer::bind(
            "127.0.0.1:0",
            self.middlebox("mb1.test", next_hop, Placement::ClientSide),
        )
        .await
        .unwrap()
    }

    /// The mbTLS client's primary TLS configuration.
    fn client_primary(&self, version: TlsVersion) -> TlsConfig {
        let mut primary = TlsConfig::client("server.test", self.root_pem.clone()).only(version);
        primary.custom_extensions = vec![CustomExtension::new(MIDDLEBOX_SUPPORT_EXTENSION)];
        primary.pause_after_handshake = true;
        primary
    }

    /// An mbTLS client through the client-side middlebox mb1 at `mb1`, its request sent with
    /// the key material.
    async fn connect(&self, mb1: SocketAddr, version: TlsVersion, request: &[u8]) -> MbtlsClient {
        self.connect_with(mb1, self.client(version), request).await
    }

    /// An mbTLS session of a client of configuration `cfg` through `mb1`, its request sent with
    /// the key material.
    async fn connect_with(
        &self,
        mb1: SocketAddr,
        cfg: ClientHandshakeConfig,
        request: &[u8],
    ) -> MbtlsClient {
        let connecting = MbtlsClient::connect_with_data(mb1, cfg, request);
        timeout(BOUND, connecting).await.unwrap().unwrap()
    }

    /// An mbTLS session, `version`, of a client with no middlebox of its own (discovery, none
    /// approved) through `first_hop`, with `data` sent in its key-material flight.
    async fn client_alone(
        &self,
        first_hop: SocketAddr,
        version: TlsVersion,
        data: &[u8],
    ) -> MbtlsClient {
        let cfg = self.client_without_middleboxes(version);
        timeout(BOUND, MbtlsClient::connect_with_data(first_hop, cfg, data))
            .await
            .unwrap()
            .unwrap()
    }

    /// [`client`](Self::client) with no middlebox of its own (discovery, none approved).
    fn client_without_middleboxes(&self, version: TlsVersion) -> ClientHandshakeConfig {
        let mut cfg = self.client(version);
        cfg.middlebox = ClientMiddlebox::Discover(Arc::new(|_: &[Vec<u8>]| false));
        cfg
    }

    fn client(&self, version: TlsVersion) -> ClientHandshakeConfig {
        let primary = self.client_primary(version);
        let secondary = TlsConfig::client("mb1.test", self.root_pem.clone());
        ClientHandshakeConfig {
            primary: Arc::new(OpenSslContext::new(&primary).unwrap()),
            server_name: "server.test".into(),
            secondary: Arc::new(OpenSslContext::new(&secondary).unwrap()),
            middlebox: ClientMiddlebox::Preconfigured("mb1.test".into()),
            policy: self.policy(),
            now_unix: mbx_attest::unix_seconds(std::time::SystemTime::now()),
        }
    }
}

/// How a session that must fail fails: its handshake's error, or (TLS 1.3, whose client
/// handshake is over before the server's refusal comes) the first read's.
async fn session_error(
    connecting: impl std::future::Future<Output = Result<MbtlsClient, DriverError>>,
) -> String {
    match timeout(BOUND, connecting).await.unwrap() {
        Err(e) => e.to_string(),
        Ok(mut c) => timeout(BOUND, c.read_to_end())
            .await
            .unwrap()
            .unwrap_err()
            .to_string(),
    }
}

/// A session that must fail with the server's `handshake_failure` alert, as the client reads
/// it ([`session_error`]); `what`: the case, in the failure message.
async fn told_handshake_failure(
    connecting: impl std::future::Future<Output = Result<MbtlsClient, DriverError>>,
    what: impl std::fmt::Debug,
) {
    let err = session_error(connecting).await;
    assert!(err.contains("handshake_failure(40)"), "{what:?}: {err}");
}

/// A server's middlebox setting that takes sessions without one (it requires none and
/// approves none that announces itself).
fn no_server_middlebox() -> ServerMiddlebox {
    ServerMiddlebox::Discover(Arc::new(|_: &[Vec<u8>]| false))
}

fn header_app(name: &str) -> AppFactory {
    let name = name.to_string();
    Arc::new(move || {
        Box::new(HttpHeaderInsert::new("X-Mbtls", &name).unwrap()) as Box<dyn MiddleboxApp + Send>
    })
}

/// The test bed's HTTP backend, which answers every request with its head as the body.
async fn echo_backend() -> SocketAddr {
    mbx_testbed::http_echo::echo_backend().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_through_a_server_side_middlebox_to_an_mbtls_server_both_versions() {
    let w = World::new();
    let backend = echo_backend().await;
    for version in VERSIONS {
        let (mut server, mut mb2) = w.server_behind_mb2(version, backend).await;
        let port = mb2.local_addr().port();
        let out = w.curl(port, "/legacy-client", Some(version)).await;
        assert_eq!(out.exit_code, Some(0), "{version:?}: {}", out.verbose);
        assert_eq!(out.status, Some(200));
        let body = out.body_str();
        assert!(body.contains("GET /legacy-client HTTP/1.1"), "{body}");
        assert!(body.contains("X-Mbtls: mb2.test"), "{version:?}: {body}");
        let expected = match version {
            TlsVersion::Tls12 => "TLSv1.2",
            TlsVersion::Tls13 => "TLSv1.3",
        };
        assert_eq!(out.tls_version().as_deref(), Some(expected));

        let report = timeout(BOUND, mb2.next_report()).await.unwrap().unwrap();
        assert!(
            report.announced && report.joined && report.evidence_sent && report.keys_installed,
            "{report:?}"
        );
        let sreport = timeout(BOUND, server.next_report()).await.unwrap().unwrap();
        assert!(sreport.outcome.is_ok(), "{sreport:?}");
        assert!(
            matches!(
                sreport.verdicts.as_slice(),
                [MiddleboxVerdict::Verified {
                    claims: Some(_),
                    ..
                }]
            ),
            "{sreport:?}"
        );
        // The server's counts (its metrics) take the middlebox that received keys.
        let ended = server.stats().ended();
        assert_eq!((ended.ended_cleanly, ended.middlebox_took_part), (1, 1));
        let summary = sreport.summary.unwrap();
        assert_eq!(summary.version, version);
        // The server's hops are the middlebox's, seen from the other end.
        assert_eq!(Some(summary.hops[0]), report.client_hop);
        assert_eq!(Some(summary.hops[1]), report.server_hop);
    }
}

/// A server that refuses its own middlebox (here: a measurement its policy does not list), or
/// finds the middlebox it requires missing (a client that came straight to it), tells the
/// legacy client with a fatal `handshake_failure` alert, which a refused middlebox passes on:
/// curl reports the alert instead of an empty reply. TLS 1.2: in plaintext before the
/// server's ChangeCipherSpec, sealed under the session's keys after it; TLS 1.3: under the
/// server's application traffic keys (twenty-fifth round; before, a TLS 1.3 client and a TLS
/// 1.2 client whose server had sent its Finished saw only a close).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_legacy_client_is_told_when_the_server_refuses_or_misses_its_middlebox() {
    let w = World::new();
    let backend = echo_backend().await;
    for version in VERSIONS {
        let (mut server, mut mb2) = w.server_refusing_mb2(version, backend).await;
        let through_mb2 = mb2.local_addr().port();
        let straight = server.local_addr().port();
        for (port, case) in [(through_mb2, "refused"), (straight, "missing")] {
            let out = w.curl(port, &format!("/{case}"), Some(version)).await;
            let what = format!("{version:?} {case}");
            assert_ne!(out.exit_code, Some(0), "{what}: {}", out.verbose);
            assert!(
                out.verbose.contains("alert handshake failure"),
                "{what}: {}",
                out.verbose
            );
            let report = timeout(BOUND, server.next_report()).await.unwrap().unwrap();
            let why = report.outcome.clone().unwrap_err();
            let named = match case {
                "missing" => "middlebox mb2.test: a pre-configured middlebox did not join (0 of the 1 configured on this side did)",
                _ => "middlebox mb2.test: attestation: code measurement",
            };
            assert!(why.contains(named), "{what}: {why}");
            // TLS 1.2 refuses in the clear, during the handshake: mb2 passed the alert on and
            // says so (with TLS 1.3 the alert is under keys it never got).
            if (case, version) == ("refused", TlsVersion::Tls12) {
                let r2 = timeout(BOUND, mb2.next_report()).await.unwrap().unwrap();
                assert_servers_alert_passed_on(&r2, "handshake_failure(40)");
            }
        }
        // An mbTLS client with no middlebox of its own reads the alert, named.
        let cfg = w.client_without_middleboxes(version);
        told_handshake_failure(MbtlsClient::connect(mb2.local_addr(), cfg), version).await;
        timeout(BOUND, server.next_report()).await.unwrap().unwrap();
    }
}

/// `r`, a server-side middlebox's report, ends with the server's `alert`, sent in the clear
/// during the handshake and passed on; before the thirty-third round it read "the next hop
/// closed the connection during the handshake" (found in an operator trial), which is how a
/// client-side middlebox's report had said it since the twenty-sixth. The server answered the
/// announcement first, so it is not taken for a legacy one.
fn assert_servers_alert_passed_on(r: &ConnectionReport, alert: &str) {
    let why = r.outcome.clone().unwrap_err();
    assert_eq!(r.error_kind(), Some(ErrorKind::Alert), "{why}");
    assert!(
        why.contains(alert)
            && why.contains("sent by the server during the handshake and passed on"),
        "{why}"
    );
    assert!(!r.legacy_server, "{r:?}");
}

/// A legacy client and an mbTLS server that share no TLS version: the server's
/// protocol_version alert reaches curl through the server-side middlebox, whose report names
/// it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_side_middlebox_reports_the_servers_refusal_of_a_version() {
    let w = World::new();
    let backend = echo_backend().await;
    let (_server, mut mb2) = w.server_behind_mb2(TlsVersion::Tls13, backend).await;
    let port = mb2.local_addr().port();
    let out = w.curl(port, "/old", Some(TlsVersion::Tls12)).await;
    assert_ne!(out.exit_code, Some(0), "{}", out.verbose);
    assert!(
        out.verbose.contains("alert protocol version"),
        "{}",
        out.verbose
    );
    let r2 = timeout(BOUND, mb2.next_report()).await.unwrap().unwrap();
    assert_servers_alert_passed_on(&r2, "protocol_version(70)");
    // Still announcing to the server: a TLS 1.3 client's session takes mb2 in.
    let out = w.curl(port, "/new", Some(TlsVersion::Tls13)).await;
    assert_eq!(out.exit_code, Some(0), "{}", out.verbose);
    let r2 = timeout(BOUND, mb2.next_report()).await.unwrap().unwrap();
    assert!(r2.keys_installed, "{r2:?}");
}

/// A client proxy whose server refuses its own middlebox tells the local application, as when
/// a handshake fails, whatever the version: with TLS 1.3 the refusal comes after the
/// handshake, in the data phase, where the local connection was reset (found in a user
/// trial: curl read "connection reset", and a 502 with TLS 1.2). Without an answer
/// configured, it is still reset. Its report names its own address toward the first hop, the
/// one the first hop reports the connection from (twenty-ninth round).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_tells_the_local_application_of_a_refusal_after_the_handshake() {
    let w = World::new();
    let backend = echo_backend().await;
    for version in VERSIONS {
        let (mut server, mut mb2) = w.server_refusing_mb2(version, backend).await;
        for answer in [Some(answer_with_error(b"no session: ")), None] {
            let told = answer.is_some();
            let mut proxy = ClientProxy::bind(
                "127.0.0.1:0",
                ClientProxyConfig {
                    handshake: w.client_without_middleboxes(version),
                    first_hop: mb2.local_addr().to_string(),
                    session_failed_answer: answer,
                    limits: Limits::default(),
                },
            )
            .await
            .unwrap();
            // A reset can come before the connection is even reported as made, or before the
            // request is written.
            let mut got = Vec::new();
            let read = match tokio::net::TcpStream::connect(proxy.local_addr()).await {
                Ok(mut local) => match local.write_all(b"GET / HTTP/1.1\r\n\r\n").await {
                    Ok(()) => timeout(BOUND, local.read_to_end(&mut got)).await.unwrap(),
                    Err(e) => Err(e),
                },
                Err(e) => Err(e),
            };
            let got = String::from_utf8_lossy(&got).into_owned();
            if told {
                read.unwrap();
                assert!(
                    got.starts_with("no session: ") && got.contains("handshake_failure"),
                    "{version:?}: {got}"
                );
            } else {
                assert_eq!(
                    read.map_err(|e| e.kind()),
                    Err(std::io::ErrorKind::ConnectionReset),
                    "{version:?}: {got}"
                );
            }
            let report = timeout(BOUND, proxy.next_report()).await.unwrap().unwrap();
            assert_eq!(report.bytes_down, 0, "{report:?}");
            assert!(report.outcome.is_err(), "{report:?}");
            timeout(BOUND, server.next_report()).await.unwrap().unwrap();
            // The failed session is matched with the first hop's report by the address the
            // first hop saw it come from.
            let r2 = timeout(BOUND, mb2.next_report()).await.unwrap().unwrap();
            assert!(report.first_hop_local.is_some(), "{report:?}");
            assert_eq!(report.first_hop_local, r2.client, "{report:?} {r2:?}");
        }
    }
}

/// A client proxy whose session fails after it checked its own middlebox reports its verdict
/// on it, whatever the version: with TLS 1.2 the server refuses its own middlebox before the
/// client's handshake ends (found in a user trial: the proxy's report then had no verdict,
/// although the client had verified mb1); with TLS 1.3 after it. The server is behind a slow
/// link (0.3 s each way, as a far server is), so its refusal comes long after the client's
/// check of its near middlebox; on loopback either could come first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxys_failed_session_keeps_the_verdicts_it_reached() {
    let w = World::new();
    let backend = echo_backend().await;
    for version in VERSIONS {
        let mut refusing = w.server(version, backend);
        refusing.handshake.policy.measurements =
            vec![HexBytes(measure("another program", b"").to_vec())];
        let mut server = MbtlsServer::bind("127.0.0.1:0", refusing).await.unwrap();
        let slow_link =
            mbx_testbed::relay::DelayRelay::start(server.local_addr(), Duration::from_millis(300))
                .await
                .unwrap();
        let mb2 = w.mb2_to(slow_link.local_addr()).await;
        let mut mb1 = w.mb1_to(mb2.local_addr()).await;
        let report = one_failed_proxy_session(&w, version, &mb1, Limits::default()).await;
        assert!(report.outcome.is_err(), "{version:?}: {report:?}");
        timeout(BOUND, server.next_report()).await.unwrap().unwrap();
        timeout(BOUND, mb1.next_report()).await.unwrap().unwrap();
    }
}

/// A client proxy whose handshake runs out of time after it checked its own middlebox
/// reports its verdict on it: the server's records stop at its first ChangeCipherSpec (a
/// server that stalls mid-handshake), mb1's secondary session with the client is done by
/// then, and the proxy's handshake timeout (which drops the handshake) ends the session
/// (found in this round's review: the verdicts went with the dropped handshake).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxys_handshake_that_times_out_keeps_the_verdicts_it_reached() {
    let w = World::new();
    let backend = echo_backend().await;
    for version in VERSIONS {
        let server = w.server_without_middleboxes(version, backend).await;
        let stalling = stalling_at_the_servers_change_cipher_spec(server.local_addr()).await;
        let mut mb1 = w.mb1_to(stalling).await;
        let limits = Limits {
            handshake_timeout: Duration::from_secs(2),
            ..Limits::default()
        };
        let report = one_failed_proxy_session(&w, version, &mb1, limits).await;
        // Said with what the handshake waited for: the server, which stalled.
        assert!(
            matches!(
                report.error.as_deref(),
                Some(DriverError::HandshakeTimeout { waiting_for: Some(w), .. })
                    if w == "the server's handshake"
            ),
            "{version:?}: {report:?}"
        );
        timeout(BOUND, mb1.next_report()).await.unwrap().unwrap();
    }
}

/// A verdict the client reaches in the same read as the failure that ends its handshake is kept
/// in `handshake_on`'s list (the client proxy's report takes it from there): the test plays mb1
/// with its handshake core over TCP and puts a record of no known content type right behind
/// the bytes that carry mb1's evidence, in one write, so that one read of the client holds
/// both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_verdict_reached_in_the_read_that_fails_the_handshake_is_kept() {
    let w = World::new();
    let backend = echo_backend().await;
    for version in VERSIONS {
        let server = w.server_without_middleboxes(version, backend).await;
        let server_addr = server.local_addr();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mb1 = listener.local_addr().unwrap();
        let mb1_cfg = w
            .middlebox("mb1.test", server_addr, Placement::ClientSide)
            .handshake;
        let playing = tokio::spawn(async move {
            let (client, _) = listener.accept().await.unwrap();
            let server = tokio::net::TcpStream::connect(server_addr).await.unwrap();
            bad_record_behind_the_evidence(client, server, mb1_cfg).await
        });
        let stream = tokio::net::TcpStream::connect(mb1).await.unwrap();
        let mut progress = HandshakeProgress::default();
        let handshake = MbtlsClient::handshake_on(stream, w.client(version), b"", &mut progress);
        let err = timeout(BOUND, handshake).await.unwrap().unwrap_err();
        assert!(
            timeout(BOUND, playing).await.unwrap().unwrap(),
            "{version:?}: the evidence never went out: {err}"
        );
        assert!(
            err.to_string().contains("unknown content type"),
            "{version:?}: {err}"
        );
        assert!(
            matches!(
                progress.verdicts.as_slice(),
                [MiddleboxVerdict::Verified { middlebox, .. }] if middlebox == "mb1.test"
            ),
            "{version:?}: {err}; {progress:?}"
        );
    }
}

/// Plays a client-side middlebox between `client` and `server` with its handshake core (the
/// pass-through app) until its evidence is out, and writes a record of content type 99 right
/// behind the bytes that carry it, in the same write; then waits for the client to leave.
/// False if the evidence never went out.
async fn bad_record_behind_the_evidence(
    client: tokio::net::TcpStream,
    server: tokio::net::TcpStream,
    cfg: MiddleboxHandshakeConfig,
) -> bool {
    use mbx_mbtls::handshake::{MiddleboxHandshake, MiddleboxHandshakeEvent};
    let mut core = MiddleboxHandshake::new(cfg, mbx_apps::PassThrough).unwrap();
    let (mut client_r, mut client_w) = client.into_split();
    let (mut server_r, mut server_w) = server.into_split();
    let (mut from_client, mut from_server) = (vec![0u8; 1 << 16], vec![0u8; 1 << 16]);
    loop {
        let (from, read) = tokio::select! {
            r = client_r.read(&mut from_client) => (Side::Client, r),
            r = server_r.read(&mut from_server) => (Side::Server, r),
        };
        let n = match read {
            Ok(n) if n > 0 => n,
            _ => return false,
        };
        let bytes = match from {
            Side::Client => &from_client[..n],
            Side::Server => &from_server[..n],
        };
        if core.receive(from, bytes).is_err() {
            return false;
        }
        let mut evidence_sent = false;
        while let Some(event) = core.poll_event() {
            evidence_sent |= matches!(event, MiddleboxHandshakeEvent::EvidenceSent);
        }
        let to_server = core.take_outgoing(Side::Server);
        if server_w.write_all(&to_server).await.is_err() {
            return false;
        }
        let mut to_client = core.take_outgoing(Side::Client);
        if evidence_sent {
            to_client.extend_from_slice(&[99, 3, 3, 0, 1, 0]);
            // One write the client can take in one read (its buffer holds 32 KiB).
            assert!(to_client.len() <= 16 * 1024, "{} bytes", to_client.len());
        }
        if client_w.write_all(&to_client).await.is_err() {
            return false;
        }
        if evidence_sent {
            // Until the client, which failed on the record, leaves.
            let _ = client_r.read_to_end(&mut Vec::new()).await;
            return true;
        }
    }
}

/// A session served on its own (`server::serve_session`, for an embedder with its own accept
/// loop) reports its durations too: its handshake within its whole session; one that never
/// finished its handshake has none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_served_on_its_own_reports_its_durations() {
    use mbx_mbtls::driver::server::serve_session;
    let w = World::new();
    let backend = echo_backend().await;
    let mut cfg = w.server(TlsVersion::Tls13, backend);
    cfg.handshake.middlebox = ServerMiddlebox::none();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let serving = tokio::spawn(async move {
        let mut reports = Vec::new();
        for id in 0..2 {
            let (stream, peer) = listener.accept().await.unwrap();
            reports.push(serve_session(id, stream, Some(peer), &cfg).await);
        }
        reports
    });
    let mut client = w
        .client_alone(addr, TlsVersion::Tls13, b"GET / HTTP/1.0\r\n\r\n")
        .await;
    let answer = timeout(BOUND, client.read_to_end()).await.unwrap().unwrap();
    assert!(answer.ends_with(b"GET / HTTP/1.0\r\n\r\n"), "{answer:?}");
    timeout(BOUND, client.close()).await.unwrap().unwrap();
    drop(client);
    // A client that leaves before its handshake.
    drop(tokio::net::TcpStream::connect(addr).await.unwrap());
    let reports = timeout(BOUND, serving).await.unwrap().unwrap();
    let took = reports[0].durations;
    assert!(
        took.handshake.is_some_and(|h| h <= took.total) && reports[0].outcome.is_ok(),
        "{:?}",
        reports[0]
    );
    assert!(reports[1].durations.handshake.is_none() && reports[1].outcome.is_err());
}

/// One request through a client proxy (`w`'s client, `limits`) whose first hop is `mb1`, a
/// session that fails: its report, which must hold the verdict on mb1 that the client reached.
async fn one_failed_proxy_session(
    w: &World,
    version: TlsVersion,
    mb1: &MiddleboxServer,
    limits: Limits,
) -> mbx_mbtls::driver::ProxyReport {
    let mut proxy = ClientProxy::bind(
        "127.0.0.1:0",
        ClientProxyConfig {
            handshake: w.client(version),
            first_hop: mb1.local_addr().to_string(),
            session_failed_answer: None,
            limits,
        },
    )
    .await
    .unwrap();
    let mut local = tokio::net::TcpStream::connect(proxy.local_addr())
        .await
        .unwrap();
    let _ = local.write_all(b"GET / HTTP/1.1\r\n\r\n").await;
    let _ = timeout(BOUND, local.read_to_end(&mut Vec::new()))
        .await
        .unwrap();
    let report = timeout(BOUND, proxy.next_report()).await.unwrap().unwrap();
    assert!(
        matches!(
            report.verdicts.as_slice(),
            [MiddleboxVerdict::Verified { middlebox, .. }] if middlebox == "mb1.test"
        ),
        "{version:?}: {report:?}"
    );
    report
}

/// A TCP forwarder for one connection toward `to`: the client's bytes pass as they come, the
/// server's records up to its first ChangeCipherSpec; from there on the server's bytes are
/// held and both connections stay open.
async fn stalling_at_the_servers_change_cipher_spec(to: SocketAddr) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (inbound, _) = listener.accept().await.unwrap();
        let outbound = tokio::net::TcpStream::connect(to).await.unwrap();
        let (mut in_r, mut in_w) = inbound.into_split();
        let (mut out_r, mut out_w) = outbound.into_split();
        tokio::spawn(async move { tokio::io::copy(&mut in_r, &mut out_w).await });
        let mut header = [0u8; 5];
        while out_r.read_exact(&mut header).await.is_ok() && header[0] != 20 {
            let mut body = vec![0u8; usize::from(u16::from_be_bytes([header[3], header[4]]))];
            if out_r.read_exact(&mut body).await.is_err() {
                break;
            }
            if in_w.write_all(&header).await.is_err() || in_w.write_all(&body).await.is_err() {
                break;
            }
        }
        // Held: the connections stay open until the test ends.
        std::future::pending::<()>().await;
        drop((out_r, in_w));
    });
    addr
}

/// The server's alert also reaches an mbTLS client through its own middlebox. TLS 1.3: the
/// alert is under the server's application traffic keys, which the middlebox holds until its
/// keys come, and the server closes right after it; a middlebox that took that close for the
/// end lost the alert (before the twenty-sixth round the client read only a close). TLS 1.2:
/// the server refuses before its ChangeCipherSpec, so the alert is in plaintext and passes at
/// once; the middlebox reports it (before: "the server closed the connection").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_servers_alert_reaches_the_client_through_a_middlebox_waiting_for_its_keys() {
    let w = World::new();
    let backend = echo_backend().await;
    for version in VERSIONS {
        let (mut server, mb2) = w.server_refusing_mb2(version, backend).await;
        let mut mb1 = w.mb1_to(mb2.local_addr()).await;
        let connecting = MbtlsClient::connect_with_data(mb1.local_addr(), w.client(version), b"x");
        told_handshake_failure(connecting, version).await;
        let r1 = timeout(BOUND, mb1.next_report()).await.unwrap().unwrap();
        let why = r1.outcome.unwrap_err();
        assert!(why.contains("handshake_failure"), "{version:?}: {why}");
        timeout(BOUND, server.next_report()).await.unwrap().unwrap();
    }
}

/// A client-side middlebox that waits for its keys to pass on what its server sent before it
/// closed (TLS 1.3: the refusing server's alert, under its application keys) gives up when
/// the wait runs out, and reports the server's close rather than waiting for the handshake
/// timeout; a client that leaves during that wait changes nothing: the server's close, which
/// came first, stands. Here the client's keys never come: a forwarder passes on its
/// ClientHello and holds the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_middlebox_whose_keys_never_come_reports_the_servers_close() {
    let w = World::new();
    let backend = echo_backend().await;
    let version = TlsVersion::Tls13;
    let (mut server, mut mb2) = w.server_refusing_mb2(version, backend).await;
    let mut cfg = w.middlebox("mb1.test", mb2.local_addr(), Placement::ClientSide);
    // Far beyond the wait: a middlebox that waited for it instead would report a timeout.
    cfg.limits.handshake_timeout = Duration::from_secs(20);
    let mut mb1 = MiddleboxServer::bind("127.0.0.1:0", cfg).await.unwrap();
    for client_leaves in [false, true] {
        let (first_hop, leave) = hello_only_forwarder(mb1.local_addr()).await;
        let connecting = tokio::spawn(MbtlsClient::connect_with_data(
            first_hop,
            w.client(version),
            b"x",
        ));
        timeout(BOUND, server.next_report()).await.unwrap().unwrap();
        // mb2 has passed the server's close on to mb1.
        timeout(BOUND, mb2.next_report()).await.unwrap().unwrap();
        if client_leaves {
            // Well inside the 2 s wait, once mb1 has read that close.
            tokio::time::sleep(Duration::from_millis(300)).await;
            leave.send(()).unwrap();
        }
        let r1 = timeout(BOUND, mb1.next_report()).await.unwrap().unwrap();
        let why = r1.outcome.as_ref().unwrap_err();
        assert!(
            why.contains("next hop (toward the server)")
                && why.contains("before this middlebox received its keys"),
            "client leaves: {client_leaves}: {r1:?}"
        );
        assert!(!r1.keys_installed, "{r1:?}");
        // Its own handshakes may be over (the alert never reached it): its first read fails.
        let failed = match timeout(BOUND, connecting).await.unwrap().unwrap() {
            Ok(mut client) => timeout(BOUND, client.read()).await.unwrap().err(),
            Err(e) => Some(e),
        };
        assert!(failed.is_some(), "client leaves: {client_leaves}");
    }
}

/// A TCP forwarder for one connection toward `to` that passes on the client's first TLS
/// record (its ClientHello) and holds everything the client sends after it; what `to` sends
/// goes back as it comes. `leave`: both connections are closed (the client leaving).
async fn hello_only_forwarder(to: SocketAddr) -> (SocketAddr, tokio::sync::oneshot::Sender<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (leave, left) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let (inbound, _) = listener.accept().await.unwrap();
        let outbound = tokio::net::TcpStream::connect(to).await.unwrap();
        let (mut in_r, mut in_w) = inbound.into_split();
        let (mut out_r, mut out_w) = outbound.into_split();
        let mut header = [0u8; 5];
        in_r.read_exact(&mut header).await.unwrap();
        let mut record = vec![0u8; usize::from(u16::from_be_bytes([header[3], header[4]]))];
        in_r.read_exact(&mut record).await.unwrap();
        out_w.write_all(&header).await.unwrap();
        out_w.write_all(&record).await.unwrap();
        let mut back = tokio::spawn(async move {
            let _ = tokio::io::copy(&mut out_r, &mut in_w).await;
            let _ = in_w.shutdown().await;
        });
        tokio::select! {
            // The way back is ended too: both connections close.
            _ = left => back.abort(),
            _ = &mut back => {}
        }
        // Dropping the halves still held closes both connections.
        drop((in_r, out_w));
    });
    (addr, leave)
}

/// The same with TLS 1.2 on a resumed session, whose server flight is ServerHello,
/// ChangeCipherSpec and Finished: a server that refuses its middlebox then (mb2's claims no
/// longer pass the policy it was reloaded with) seals its alert after its Finished, which the
/// client-side middlebox holds until its keys come, and closes. The middlebox waits for them,
/// and the client reads the alert (twenty-sixth round; without the wait it read a close).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_tls12_servers_alert_after_its_finished_reaches_the_client() {
    let w = World::new();
    let backend = echo_backend().await;
    let version = TlsVersion::Tls12;
    let accepting = w.server(version, backend);
    let (mut server, mb2) = w.server_behind_mb2_with(accepting.clone()).await;
    let mut mb1 = w.mb1_to(mb2.local_addr()).await;
    let mut cfg = w.client(version);
    let mut primary = w.client_primary(version);
    primary.resume_sessions = 4;
    cfg.primary = Arc::new(OpenSslContext::new(&primary).unwrap());
    let request = b"GET / HTTP/1.1\r\nHost: server.test\r\nConnection: close\r\n\r\n";
    let mut first = w.connect_with(mb1.local_addr(), cfg.clone(), request).await;
    timeout(BOUND, first.read_to_end()).await.unwrap().unwrap();
    let _ = first.close().await;
    timeout(BOUND, mb1.next_report()).await.unwrap().unwrap();
    timeout(BOUND, server.next_report()).await.unwrap().unwrap();
    // The same contexts (so the client's session resumes), another policy.
    let mut refusing = accepting;
    refusing.handshake.policy.measurements =
        vec![HexBytes(measure("another program", b"").to_vec())];
    server.reload(refusing).unwrap();
    told_handshake_failure(
        MbtlsClient::connect_with_data(mb1.local_addr(), cfg, b"x"),
        version,
    )
    .await;
    let report = timeout(BOUND, server.next_report()).await.unwrap().unwrap();
    let refused = report.outcome.as_ref().unwrap_err();
    assert!(refused.contains("middlebox mb2.test"), "{report:?}");
    let r1 = timeout(BOUND, mb1.next_report()).await.unwrap().unwrap();
    // Its keys came, so the alert was the held one, sealed after the server's Finished (on a
    // full handshake the alert would be in plaintext and the client would send no keys).
    assert!(r1.keys_installed, "{r1:?}");
    let why = r1.outcome.unwrap_err();
    assert!(why.contains("handshake_failure"), "{why}");
}

/// Runs a legacy client through the server-side middlebox mb2 to an mbTLS server, TLS 1.2 and
/// 1.3: `fetch(mb2's address, version, the root CA's file)` sends a request and returns what
/// came back, which must be the backend's answer with mb2's header; mb2 must have had its keys.
async fn legacy_client_through_mb2<F, Fut>(fetch: F)
where
    F: Fn(SocketAddr, TlsVersion, std::path::PathBuf) -> Fut,
    Fut: std::future::Future<Output = String>,
{
    let w = World::new();
    let backend = echo_backend().await;
    for version in VERSIONS {
        let (_server, mut mb2) = w.server_behind_mb2(version, backend).await;
        let answer = fetch(mb2.local_addr(), version, w.server_files.ca.clone()).await;
        assert!(answer.contains("HTTP/1.1 200 OK"), "{version:?}: {answer}");
        assert!(
            answer.contains("X-Mbtls: mb2.test"),
            "{version:?}: {answer}"
        );
        let report = timeout(BOUND, mb2.next_report()).await.unwrap().unwrap();
        assert!(report.keys_installed, "{report:?}");
    }
}

/// The request the legacy clients send.
const LEGACY_REQUEST: &[u8] =
    b"GET /legacy HTTP/1.1\r\nHost: server.test\r\nConnection: close\r\n\r\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openssl_s_client_through_a_server_side_middlebox_both_versions() {
    legacy_client_through_mb2(|addr, version, ca| async move {
        let out = tokio::task::spawn_blocking(move || {
            OpensslClient::new(addr)
                .servername("server.test")
                .cafile(ca)
                .version(tb(version))
                .input(LEGACY_REQUEST)
                .run()
                .unwrap()
        })
        .await
        .unwrap();
        format!("{}\n{}", out.stdout_str(), out.stderr_str())
    })
    .await;
}

/// A legacy client on a TLS stack other than OpenSSL: GnuTLS's `gnutls-cli`, which names the
/// version it negotiated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gnutls_cli_through_a_server_side_middlebox_both_versions() {
    legacy_client_through_mb2(|addr, version, ca| async move {
        let out = tokio::task::spawn_blocking(move || {
            mbx_testbed::gnutls_cli(addr, "server.test", &ca, Some(tb(version)), LEGACY_REQUEST)
                .unwrap()
        })
        .await
        .unwrap();
        let said = format!("{}\n{}", out.stdout_str(), out.stderr_str());
        let proto = match version {
            TlsVersion::Tls12 => "(TLS1.2-",
            TlsVersion::Tls13 => "(TLS1.3-",
        };
        assert!(said.contains(proto), "{version:?}: {said}");
        said
    })
    .await;
}

/// A legacy client on rustls (in process); it reads a stream that ends without the server's
/// close_notify as an error, so the answer arriving also means the close_notify came.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rustls_client_through_a_server_side_middlebox_both_versions() {
    legacy_client_through_mb2(|addr, version, ca| async move {
        let fetched = mbx_testbed::rustls_peer::rustls_fetch(
            addr,
            "server.test",
            &ca,
            Some(tb(version)),
            LEGACY_REQUEST,
        )
        .await
        .unwrap();
        let expected = match version {
            TlsVersion::Tls12 => rustls::ProtocolVersion::TLSv1_2,
            TlsVersion::Tls13 => rustls::ProtocolVersion::TLSv1_3,
        };
        assert_eq!(fetched.version, Some(expected));
        String::from_utf8_lossy(&fetched.response).into_owned()
    })
    .await;
}

/// A legacy client that offers only a CBC suite (`openssl s_client -cipher
/// ECDHE-ECDSA-AES128-SHA256`), through a server-side middlebox, is refused by the mbTLS
/// server's handshake with `handshake_failure`: its primary session (`primary_server_config`)
/// accepts only suites the record layer carries. With OpenSSL's defaults the server took the
/// CBC suite and then failed for want of a record layer for it, closing without an alert
/// (found in a GnuTLS trial).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_legacy_client_with_only_cbc_suites_is_refused_in_the_handshake() {
    let w = World::new();
    let backend = echo_backend().await;
    let mut cfg = w.server(TlsVersion::Tls12, backend);
    let mut primary =
        mbx_mbtls::handshake::primary_server_config(w.server_id.clone()).only(TlsVersion::Tls12);
    primary.session_tickets = true;
    cfg.handshake.primary = Arc::new(OpenSslContext::new(&primary).unwrap());
    let (mut server, mb2) = w.server_behind_mb2_with(cfg).await;
    let addr = mb2.local_addr();
    let ca = w.server_files.ca.clone();
    let out = tokio::task::spawn_blocking(move || {
        OpensslClient::new(addr)
            .servername("server.test")
            .cafile(ca)
            .version(tb(TlsVersion::Tls12))
            .arg("-cipher")
            .arg("ECDHE-ECDSA-AES128-SHA256")
            .input(&b"GET / HTTP/1.1\r\nHost: server.test\r\n\r\n"[..])
            .run()
            .unwrap()
    })
    .await
    .unwrap();
    let said = format!("{}{}", out.stdout_str(), out.stderr_str());
    assert!(said.contains("alert handshake failure"), "{said}");
    let report = timeout(BOUND, server.next_report()).await.unwrap().unwrap();
    let why = report.outcome.as_ref().unwrap_err();
    assert!(why.contains("no shared cipher"), "{why}");
}

/// Waits (bounded) until `s_client` printed `text` `times` times.
async fn wait_for_client_output(client: &InteractiveClient, text: &str, times: usize) {
    mbx_testbed::wait::printed(|| client.log(), text, times, BOUND)
        .await
        .unwrap();
}

/// A legacy client's KeyUpdates (`openssl s_client`'s `k` and `K` commands, TLS 1.3) are
/// followed across the server-side middlebox by the middlebox and the mbTLS server, which
/// answers the one that asks (`K`): the echo of what the client sends after each still comes
/// back. The HTTP app lets the lines through once the backend switched protocols.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_legacy_clients_key_updates_are_followed_across_the_server_side_middlebox() {
    let w = World::new();
    let backend = echo_backend_after(
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\
            Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n",
    )
    .await;
    let (mut server, mut mb2) = w.server_behind_mb2(TlsVersion::Tls13, backend).await;
    let mut client = OpensslClient::new(mb2.local_addr())
        .servername("server.test")
        .cafile(&w.server_files.ca)
        .version(tb(TlsVersion::Tls13))
        // s_client takes commands only without -ign_eof.
        .ign_eof(false)
        .start_interactive()
        .unwrap();
    for line in [
        "GET /chat HTTP/1.1",
        "Host: server.test",
        "Upgrade: websocket",
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
        "",
    ] {
        client.send_line(line).unwrap();
    }
    wait_for_client_output(&client, "X-Mbtls: mb2.test", 1).await;
    for (n, command) in ["k", "K"].into_iter().enumerate() {
        client.send_line(command).unwrap();
        // The command read on its own (s_client reads stdin in chunks), then the data.
        wait_for_client_output(&client, "KEYUPDATE", n + 1).await;
        let line = format!("echoed after {command}");
        client.send_line(&line).unwrap();
        wait_for_client_output(&client, &line, 1).await;
    }
    drop(client);
    let report = timeout(BOUND, mb2.next_report()).await.unwrap().unwrap();
    // The client's two, and the server's answer to the one that asked.
    assert_eq!(report.key_updates, 3, "{report:?}");
    assert_eq!(mb2.stats().ended().key_updates, 3);
    let served = timeout(BOUND, server.next_report()).await.unwrap().unwrap();
    assert_eq!(served.key_updates, 2, "{served:?}");
    assert_eq!(server.stats().ended().key_updates, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn middleboxes_on_both_sides_over_tcp_both_versions() {
    let w = World::new();
    let backend = echo_backend().await;
    for version in VERSIONS {
        let (mut server, mut mb2) = w.server_behind_mb2(version, backend).await;
        let mut mb1 = w.mb1_to(mb2.local_addr()).await;
        let request = b"GET /both HTTP/1.1\r\nHost: server.test\r\nConnection: close\r\n\r\n";
        let mut client = w.connect(mb1.local_addr(), version, request).await;
        let body = timeout(BOUND, client.read_to_end()).await.unwrap().unwrap();
        let body = String::from_utf8_lossy(&body).into_owned();
        assert!(
            body.contains("X-Mbtls: mb1.test\r\nX-Mbtls: mb2.test\r\n"),
            "{version:?}: {body}"
        );
        let csum = client.summary().unwrap().clone();
        let _ = client.close().await;
        let r1 = timeout(BOUND, mb1.next_report()).await.unwrap().unwrap();
        let r2 = timeout(BOUND, mb2.next_report()).await.unwrap().unwrap();
        let rs = timeout(BOUND, server.next_report()).await.unwrap().unwrap();
        assert!(!rs.peer_left_without_close_notify, "{rs:?}");
        let ssum = rs.summary.unwrap();
        // Three hops: client↔mb1 (client's fresh keys), mb1↔mb2 (the primary session's keys,
        // known to both endpoints), mb2↔server (server's fresh keys).
        assert_eq!(r1.client_hop, Some(csum.hops[0]));
        assert_eq!(r1.server_hop, Some(csum.hops[1]));
        assert_eq!(r2.client_hop, Some(ssum.hops[0]));
        assert_eq!(csum.hops[1], ssum.hops[0]);
        assert_eq!(r2.server_hop, Some(ssum.hops[1]));
        assert_ne!(csum.hops[0], ssum.hops[1]);
    }
}

/// An application serving mbTLS itself ends a session with a fatal alert of its own
/// (`Connection::abort`): the client reads it through both middleboxes, both versions, and a
/// second abort is refused (the session has failed already).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_application_ends_its_session_with_an_alert() {
    let w = World::new();
    for version in VERSIONS {
        let (listener, mb1, _mb2) = w.app_behind_mb1_and_mb2().await;
        let cfg = w.server(version, "127.0.0.1:9".parse().unwrap()).handshake;
        let app = tokio::spawn(async move {
            let (stream, _) = listener.accept().await.unwrap();
            let mut s = MbtlsServerConnection::accept(stream, cfg).await.unwrap();
            s.read().await.unwrap().unwrap();
            let first = s.abort(mbx_engine::AlertDescription::INTERNAL_ERROR).await;
            let second = s.abort(mbx_engine::AlertDescription::INTERNAL_ERROR).await;
            (first.is_ok(), second.is_err())
        });
        let mut client = w
            .connect(mb1.local_addr(), version, b"GET / HTTP/1.1\r\n\r\n")
            .await;
        let read = timeout(BOUND, client.read()).await.unwrap();
        assert!(
            matches!(read, Err(DriverError::Alert { description: 80, what }) if what == RECEIVED_FROM_THE_PATH),
            "{version:?}: {read:?}"
        );
        assert_eq!(
            timeout(BOUND, app).await.unwrap().unwrap(),
            (true, true),
            "{version:?}"
        );
    }
}

/// Data that arrives in the same read as the alert that ends the session is read before the
/// error, as a TLS library delivers it: the server's application writes part of an answer and
/// aborts; once the client-side middlebox has passed both on and closed, the client's one
/// socket read holds both. Before, the read returned only the error and the data was lost
/// (found in an interop trial: a Java server's last chunk before its HelloRequest).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_before_the_alert_that_ends_a_session_is_read_first() {
    let w = World::new();
    for version in VERSIONS {
        let (listener, mut mb1, _mb2) = w.app_behind_mb1_and_mb2().await;
        let cfg = w.server(version, "127.0.0.1:9".parse().unwrap()).handshake;
        let app = tokio::spawn(async move {
            let (stream, _) = listener.accept().await.unwrap();
            let mut s = MbtlsServerConnection::accept(stream, cfg).await.unwrap();
            s.read().await.unwrap().unwrap();
            s.write_all(b"part of an answer").await.unwrap();
            s.abort(mbx_engine::AlertDescription::INTERNAL_ERROR)
                .await
                .unwrap();
        });
        let mut client = w
            .connect(mb1.local_addr(), version, b"GET / HTTP/1.1\r\n\r\n")
            .await;
        timeout(BOUND, app).await.unwrap().unwrap();
        // mb1 passed on the data and the alert, and closed: both wait in the client's socket.
        let report = timeout(BOUND, mb1.next_report()).await.unwrap().unwrap();
        assert!(report.outcome.is_err(), "{version:?}: {report:?}");
        let first = timeout(BOUND, client.read()).await.unwrap();
        assert_eq!(
            first.unwrap(),
            Some(b"part of an answer".to_vec()),
            "{version:?}"
        );
        let then = timeout(BOUND, client.read()).await.unwrap();
        assert!(
            matches!(
                then,
                Err(DriverError::Alert {
                    description: 80,
                    ..
                })
            ),
            "{version:?}: {then:?}"
        );
    }
}

/// An application serving mbTLS itself (no backend): it accepts a connection as an
/// `MbtlsServerConnection` behind a server-side middlebox, with an mbTLS client on the other
/// side of a client-side one, both versions. Data goes both ways through both middleboxes'
/// apps; with TLS 1.3 the server updates its keys and asks the client to, and each side
/// follows the other's KeyUpdate; with TLS 1.2 asking is an error that leaves the session
/// usable. Both ends close cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_application_serves_mbtls_itself_and_updates_its_keys() {
    let w = World::new();
    for version in VERSIONS {
        let (listener, mut mb1, mut mb2) = w.app_behind_mb1_and_mb2().await;
        // The server's handshake configuration, as the service's.
        let cfg = w.server(version, "127.0.0.1:9".parse().unwrap()).handshake;
        let app = tokio::spawn(async move {
            let (stream, _) = listener.accept().await.unwrap();
            let mut s = MbtlsServerConnection::accept(stream, cfg).await.unwrap();
            let verified = matches!(s.verdict(), MiddleboxVerdict::Verified { middlebox, .. } if middlebox == "mb2.test");
            let request = s.read().await.unwrap().unwrap();
            let updated = s.update_keys(true).await;
            s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                .await
                .unwrap();
            // The client's answer to our KeyUpdate, then its close_notify.
            let rest = s.read_to_end().await.unwrap();
            s.close().await.unwrap();
            (
                verified,
                request,
                updated.is_ok(),
                rest,
                s.peer_key_updates(),
            )
        });
        let request = b"GET / HTTP/1.1\r\nHost: server.test\r\n\r\n";
        let mut client = w.connect(mb1.local_addr(), version, request).await;
        let response = timeout(BOUND, client.read())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert!(response.ends_with(b"ok"), "{version:?}");
        client.close().await.unwrap();
        let tail = timeout(BOUND, client.read_to_end()).await.unwrap().unwrap();
        assert!(tail.is_empty(), "{version:?}");
        let (verified, got, updated, rest, server_saw) =
            timeout(BOUND, app).await.unwrap().unwrap();
        assert!(verified, "{version:?}");
        // Both middleboxes' apps handled the request on its way.
        let got = String::from_utf8_lossy(&got).into_owned();
        assert!(
            got.contains("X-Mbtls: mb1.test\r\nX-Mbtls: mb2.test\r\n"),
            "{version:?}: {got}"
        );
        assert!(rest.is_empty(), "{version:?}");
        let tls13 = version == TlsVersion::Tls13;
        assert_eq!(updated, tls13, "{version:?}");
        // The client followed the server's KeyUpdate and answered it, which the server followed.
        assert_eq!(client.peer_key_updates(), u32::from(tls13), "{version:?}");
        assert_eq!(server_saw, u32::from(tls13), "{version:?}");
        for report in [
            timeout(BOUND, mb1.next_report()).await.unwrap().unwrap(),
            timeout(BOUND, mb2.next_report()).await.unwrap().unwrap(),
        ] {
            assert!(report.outcome.is_ok(), "{version:?}: {:?}", report.outcome);
        }
    }
}

/// A client that can have no middlebox on its side, its context built without export: its
/// session stays in OpenSSL, whose records the server-side middlebox opens with the bridge keys
/// the server gave it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_kept_in_openssl_over_tcp_through_a_server_side_middlebox_both_versions() {
    let w = World::new();
    let backend = echo_backend().await;
    for version in VERSIONS {
        let (mut server, mut mb2) = w.server_behind_mb2(version, backend).await;
        let mut cfg = w.client(version);
        let primary = w.client_primary(version).without_export();
        cfg.primary = Arc::new(OpenSslContext::new(&primary).unwrap());
        cfg.middlebox = ClientMiddlebox::Disabled;
        let request = b"GET /direct HTTP/1.1\r\nHost: server.test\r\nConnection: close\r\n\r\n";
        let mut client = timeout(
            BOUND,
            MbtlsClient::connect_with_data(mb2.local_addr(), cfg, request),
        )
        .await
        .unwrap()
        .unwrap();
        let body = timeout(BOUND, client.read_to_end()).await.unwrap().unwrap();
        let body = String::from_utf8_lossy(&body).into_owned();
        assert!(body.contains("GET /direct HTTP/1.1"), "{version:?}: {body}");
        assert!(
            body.contains("X-Mbtls: mb2.test\r\n"),
            "{version:?}: {body}"
        );
        let csum = client.summary().unwrap().clone();
        assert!(csum.hops.is_empty() && !csum.middlebox_joined());
        let _ = client.close().await;
        let r2 = timeout(BOUND, mb2.next_report()).await.unwrap().unwrap();
        assert!(r2.keys_installed, "{r2:?}");
        let rs = timeout(BOUND, server.next_report()).await.unwrap().unwrap();
        assert!(rs.outcome.is_ok(), "{rs:?}");
    }
}

/// A legacy server fails the first session the middlebox announces itself in, and is then
/// remembered and passed through. `openssl s_server` refuses the announcement with an alert;
/// nginx takes a connection that does not start with a TLS handshake for plain HTTP and
/// answers with an HTTP 400 page (found in a user trial: the middlebox failed on that page as
/// a bad record and never remembered nginx, so every session through it failed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn legacy_server_behind_a_server_side_middlebox_is_remembered() {
    let w = World::new();
    let s_server = OpensslServer::from_files(&w.server_files)
        .version(tb(TlsVersion::Tls13))
        .start()
        .unwrap();
    let nginx = Nginx::from_files(&w.server_files).start().unwrap();
    for (legacy, addr, how) in [
        ("s_server", s_server.addr(), "with an alert"),
        ("nginx", nginx.addr(), "in plain text, not TLS"),
    ] {
        let mut mb2 = w.mb2_to(addr).await;
        let port = mb2.local_addr().port();
        let run = |path: &'static str| w.curl(port, path, None);
        // First session: the announcement makes the legacy server fail.
        let report = found_legacy(&w, &mut mb2, "/first", legacy).await;
        assert_eq!(
            report.error_kind,
            Some(mbx_mbtls::driver::ErrorKind::LegacyServer),
            "{report:?}"
        );
        // A failed session, not a clean one: the server's refusal reached the client.
        let why = report.outcome.as_ref().unwrap_err();
        assert!(
            why.contains(&format!("answered our announcement {how}")),
            "{legacy}: {why}"
        );
        // Second session: not announced, forwarded unchanged, works.
        let second = run("/second").await;
        assert_eq!(second.exit_code, Some(0), "{legacy}: {}", second.verbose);
        let report = timeout(BOUND, mb2.next_report()).await.unwrap().unwrap();
        assert!(
            !report.announced && !report.keys_installed,
            "{legacy}: {report:?}"
        );
        assert!(
            report.outcome.is_ok() || report.passive.is_some(),
            "{legacy}: {report:?}"
        );
        assert_eq!(mb2.stats().legacy_servers_remembered(), Some(1), "{legacy}");
        // A reload that forgets at once: the next session is announced again, and fails
        // again (a server that had become mbTLS-aware would now be joined).
        let mut forgetful = (*mb2.config()).clone();
        forgetful.forget_legacy_after = Some(Duration::ZERO);
        mb2.reload(forgetful).unwrap();
        // Due to be forgotten: no longer counted, before any session looks it up.
        assert_eq!(mb2.stats().legacy_servers_remembered(), Some(0), "{legacy}");
        found_legacy(&w, &mut mb2, "/third", legacy).await;
    }
}

/// A session through `mb2` (curl to its port) that its announcement makes the `legacy`
/// server fail: mb2's report of it, announced and marking the server legacy.
async fn found_legacy(
    w: &World,
    mb2: &mut MiddleboxServer,
    path: &'static str,
    legacy: &str,
) -> mbx_mbtls::driver::ConnectionReport {
    let out = w.curl(mb2.local_addr().port(), path, None).await;
    assert_ne!(out.exit_code, Some(0), "{legacy}: {}", out.verbose);
    let report = timeout(BOUND, mb2.next_report()).await.unwrap().unwrap();
    assert!(
        report.announced && report.legacy_server,
        "{legacy}: {report:?}"
    );
    report
}

/// A ClientHello for server.test, as any TLS client sends it.
fn client_hello(w: &World) -> Vec<u8> {
    use mbx_engine::TlsEngine;
    let config = TlsConfig::client("server.test", w.root_pem.clone());
    let mut engine = OpenSslContext::new(&config).unwrap().engine().unwrap();
    engine.process().unwrap();
    engine.take_outgoing()
}

/// A client that leaves right after its ClientHello (a reset or a close), or that sends
/// another record first, does not make the server-side middlebox take the mbTLS server behind
/// it for a legacy one: the next session is announced and joined. Before, any session that
/// failed before the server answered had the server remembered as legacy, so one such client
/// turned the middlebox away from every later session (which this server, requiring it,
/// then refused).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_leaving_early_does_not_make_the_middlebox_forget_an_mbtls_server() {
    let w = World::new();
    let backend = echo_backend().await;
    let server = MbtlsServer::bind("127.0.0.1:0", w.server(TlsVersion::Tls13, backend))
        .await
        .unwrap();
    // The server's answers take 0.6 s to come back, so each client below is gone before its
    // announcement is answered (as a client that leaves at once is on a real network).
    let slow_link =
        mbx_testbed::relay::DelayRelay::start(server.local_addr(), Duration::from_millis(300))
            .await
            .unwrap();
    let mut mb2 = w.mb2_to(slow_link.local_addr()).await;
    let hello = client_hello(&w);
    // An application-data record before the ClientHello: the server would alert on it.
    let mut data_first = vec![23u8, 3, 3, 0, 5, 1, 2, 3, 4, 5];
    data_first.extend_from_slice(&hello);
    for (what, bytes) in [
        ("reset", &hello),
        ("close", &hello),
        ("data first", &data_first),
    ] {
        let mut tcp = tokio::net::TcpStream::connect(mb2.local_addr())
            .await
            .unwrap();
        tcp.write_all(bytes).await.unwrap();
        match what {
            "reset" => tcp.set_zero_linger().unwrap(),
            "close" => {}
            // Stays until the middlebox ends the connection.
            _ => {
                while timeout(BOUND, tcp.read(&mut [0u8; 512]))
                    .await
                    .unwrap()
                    .unwrap_or(0)
                    > 0
                {}
            }
        }
        drop(tcp);
        let report = timeout(BOUND, mb2.next_report()).await.unwrap().unwrap();
        assert!(
            report.outcome.is_err() && !report.joined && !report.legacy_server,
            "{what}: {report:?}"
        );
        if bytes == &data_first {
            let error = report.outcome.as_ref().unwrap_err();
            assert!(error.contains("other than its ClientHello"), "{error}");
            assert!(!report.announced, "{report:?}");
        } else {
            assert!(report.announced, "{what}: {report:?}");
        }
    }
    let port = mb2.local_addr().port();
    let out = w.curl(port, "/after", None).await;
    assert_eq!(out.exit_code, Some(0), "{}", out.verbose);
    assert!(
        out.body_str().contains("X-Mbtls: mb2.test"),
        "{}",
        out.body_str()
    );
    let report = timeout(BOUND, mb2.next_report()).await.unwrap().unwrap();
    assert!(
        report.announced && report.joined && report.keys_installed,
        "{report:?}"
    );
}

/// A backend that reads the request and never answers (the session stays open).
/// A backend that greets every connection with one line and then holds it open, silent.
async fn greeting_backend() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((mut s, _)) = listener.accept().await {
            let _ = s.write_all(GREETING).await;
            held.push(s);
        }
    });
    addr
}

const GREETING: &[u8] = b"hello from the backend\n";

/// An upload cut short: a body of 1,000 bytes announced, the first of them sent.
const UPLOAD: &[u8] =
    b"POST /upload HTTP/1.1\r\nHost: server.test\r\nContent-Length: 1000\r\n\r\npart of it";

/// Accepts one backend connection and reads it until the part of [`UPLOAD`] sent arrived: the
/// connection and what came.
async fn accept_upload(listener: TcpListener) -> (tokio::net::TcpStream, Vec<u8>) {
    let (mut s, _) = listener.accept().await.unwrap();
    let (mut got, mut buf) = (Vec::new(), [0u8; 1024]);
    while !got.ends_with(b"part of it") {
        let n = s.read(&mut buf).await.unwrap();
        assert!(n > 0, "{got:?}");
        got.extend_from_slice(&buf[..n]);
    }
    (s, got)
}

/// A session cut on the path (its client gone without close_notify, as when someone on the
/// path ends the TCP connection) must not look complete to the backend: the server resets
/// its connection to the backend instead of closing it, so a body delimited by the close
/// cannot pass for whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_cut_on_the_path_resets_the_backend_connection() {
    let w = World::new();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let backend = listener.local_addr().unwrap();
    let (got_data, data_arrived) = tokio::sync::oneshot::channel();
    let (end_seen, end) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (mut s, got) = accept_upload(listener).await;
        let _ = got_data.send(got);
        let _ = end_seen.send(s.read(&mut [0u8; 1024]).await.map_err(|e| e.kind()));
    });
    let version = TlsVersion::Tls13;
    let (_server, mb2) = w.server_behind_mb2(version, backend).await;
    let client = w.client_alone(mb2.local_addr(), version, UPLOAD).await;
    let data = timeout(BOUND, data_arrived).await.unwrap().unwrap();
    assert!(data.starts_with(b"POST /upload"), "{data:?}");
    // The client's connection ends without close_notify, the upload unfinished.
    drop(client);
    let end = timeout(BOUND, end).await.unwrap().unwrap();
    assert_eq!(end, Err(std::io::ErrorKind::ConnectionReset));
}

/// After the server's close_notify (its backend ended its side first), a client connection
/// that ends without the client's close_notify resets the backend's connection, which still
/// reads: the client may have been cut mid-stream, and a cut that drops everything after the
/// server's close_notify looks the same as a client that had finished. The server reports an
/// error if data came after its close_notify, and a normal end if none did (as HTTP clients
/// that just close).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_after_the_servers_close_notify_resets_the_backend() {
    let w = World::new();
    for more_after_close in [true, false] {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let backend = listener.local_addr().unwrap();
        let (end_seen, end) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let (mut s, _) = accept_upload(listener).await;
            // The backend ends its side: the server sends close_notify.
            s.shutdown().await.unwrap();
            let (mut rest, mut buf) = (Vec::new(), [0u8; 1024]);
            let end = loop {
                match s.read(&mut buf).await {
                    Ok(0) => break Ok(rest),
                    Ok(n) => rest.extend_from_slice(&buf[..n]),
                    Err(e) => break Err(e.kind()),
                }
            };
            let _ = end_seen.send(end);
        });
        let version = TlsVersion::Tls13;
        let (mut server, mut mb2) = w.server_behind_mb2(version, backend).await;
        let mut client = w.client_alone(mb2.local_addr(), version, UPLOAD).await;
        // The server's close_notify.
        let closed = timeout(BOUND, client.read()).await.unwrap().unwrap();
        assert_eq!(closed, None);
        if more_after_close {
            client.write_all(b" and more").await.unwrap();
        }
        // Cut: the client's connection ends without close_notify.
        drop(client);
        let end = timeout(BOUND, end).await.unwrap().unwrap();
        assert_eq!(end, Err(std::io::ErrorKind::ConnectionReset));
        let report = timeout(BOUND, server.next_report()).await.unwrap().unwrap();
        assert_eq!(report.outcome.is_err(), more_after_close, "{report:?}");
        // Without an error the report still says the client never sent its close_notify.
        assert_eq!(
            report.peer_left_without_close_notify, !more_after_close,
            "{report:?}"
        );
        if more_after_close {
            let why = report.outcome.unwrap_err();
            assert!(why.contains("after sending data past ours"), "{why}");
        }
        // The middlebox in between tells the two apart the same way.
        let report = timeout(BOUND, mb2.next_report()).await.unwrap().unwrap();
        assert!(report.keys_installed, "{report:?}");
        assert_eq!(report.outcome.is_err(), more_after_close, "{report:?}");
        let left = (!more_after_close).then_some(Side::Client);
        assert_eq!(report.left_without_close_notify, left, "{report:?}");
        if more_after_close {
            let why = report.outcome.unwrap_err();
            assert!(why.contains("having sent data since"), "{why}");
        }
    }
}

/// A TCP forwarder toward `to` for one connection: copies both ways until `cut` brings the
/// bytes to end with, which it writes toward `to` (`toward_to`) or back toward the one that
/// connected; then it ends both connections, without close_notify.
async fn cutting_forwarder(
    to: SocketAddr,
    toward_to: bool,
) -> (SocketAddr, tokio::sync::oneshot::Sender<Vec<u8>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (cut, mut cut_rx) = tokio::sync::oneshot::channel::<Vec<u8>>();
    tokio::spawn(async move {
        let (mut inbound, _) = listener.accept().await.unwrap();
        let mut outbound = tokio::net::TcpStream::connect(to).await.unwrap();
        let (mut in_buf, mut out_buf) = (vec![0u8; 16 * 1024], vec![0u8; 16 * 1024]);
        // A side that ended its stream (FIN) is passed on as such; the other still flows.
        let (mut in_open, mut out_open) = (true, true);
        loop {
            tokio::select! {
                tail = &mut cut_rx => {
                    let toward = if toward_to { &mut outbound } else { &mut inbound };
                    let _ = toward.write_all(&tail.unwrap()).await;
                    break;
                }
                n = inbound.read(&mut in_buf), if in_open => match n {
                    Ok(0) | Err(_) => {
                        in_open = false;
                        let _ = outbound.shutdown().await;
                    }
                    Ok(n) => outbound.write_all(&in_buf[..n]).await.unwrap(),
                },
                n = outbound.read(&mut out_buf), if out_open => match n {
                    Ok(0) | Err(_) => {
                        out_open = false;
                        let _ = inbound.shutdown().await;
                    }
                    Ok(n) => inbound.write_all(&out_buf[..n]).await.unwrap(),
                },
            }
        }
    });
    (addr, cut)
}

/// An application-data record header announcing 100 bytes, and 10 of them.
fn partial_record() -> Vec<u8> {
    let mut partial = vec![23, 3, 3, 0, 100];
    partial.extend_from_slice(&[0x5a; 10]);
    partial
}

/// After the server's close_notify, a peer that leaves part-way through a record cut that
/// record: the server reports a possible truncation, not a clean end, whether its session
/// stayed in OpenSSL (no middlebox) or runs on exported keys (a server-side middlebox); a
/// peer that leaves between records ends the session cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_leaving_mid_record_after_the_servers_close_notify_is_a_cut() {
    let w = World::new();
    let version = TlsVersion::Tls13;
    for with_middlebox in [false, true] {
        for tail in [Vec::new(), partial_record()] {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let backend = listener.local_addr().unwrap();
            tokio::spawn(async move {
                let (mut s, _) = accept_upload(listener).await;
                // The backend ends its side: the server sends close_notify.
                s.shutdown().await.unwrap();
                let _ = s.read_to_end(&mut Vec::new()).await;
            });
            let mut cfg = w.server(version, backend);
            if !with_middlebox {
                cfg.handshake.middlebox = no_server_middlebox();
            }
            let mut server = MbtlsServer::bind("127.0.0.1:0", cfg).await.unwrap();
            let (forwarder, cut) = cutting_forwarder(server.local_addr(), true).await;
            let _mb2;
            let first_hop = if with_middlebox {
                _mb2 = w.mb2_to(forwarder).await;
                _mb2.local_addr()
            } else {
                forwarder
            };
            let mut client = w.client_alone(first_hop, version, UPLOAD).await;
            // The server's close_notify.
            let closed = timeout(BOUND, client.read()).await.unwrap().unwrap();
            assert_eq!(closed, None);
            let cut_a_record = !tail.is_empty();
            cut.send(tail).unwrap();
            let report = timeout(BOUND, server.next_report()).await.unwrap().unwrap();
            let summary = report.summary.as_ref().unwrap();
            assert_eq!(summary.middlebox_joined(), with_middlebox, "{report:?}");
            assert_left_after_our_close(
                &report.outcome,
                report.peer_left_without_close_notify,
                cut_a_record,
                &report,
            );
        }
    }
}

/// The client's twin: after the client proxy's close_notify (its local application ended its
/// side), a server that leaves part-way through a record cut it, and the proxy reports a
/// possible truncation; one that leaves between records ends the session cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_leaving_mid_record_after_the_proxys_close_notify_is_a_cut() {
    let w = World::new();
    let version = TlsVersion::Tls13;
    for tail in [Vec::new(), partial_record()] {
        // A backend that reads to the end and keeps its side open: the server sends no
        // close_notify of its own.
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let backend = listener.local_addr().unwrap();
        let (got_end, client_ended) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut got = Vec::new();
            let _ = s.read_to_end(&mut got).await;
            let _ = got_end.send(got);
            // Held open until the test ends.
            std::future::pending::<()>().await;
            drop(s);
        });
        let mut cfg = w.server(version, backend);
        cfg.handshake.middlebox = no_server_middlebox();
        let _server = MbtlsServer::bind("127.0.0.1:0", cfg).await.unwrap();
        let (forwarder, cut) = cutting_forwarder(_server.local_addr(), false).await;
        let handshake = w.client_without_middleboxes(version);
        let mut proxy = ClientProxy::bind(
            "127.0.0.1:0",
            ClientProxyConfig::new(handshake, forwarder.to_string()),
        )
        .await
        .unwrap();
        let mut local = tokio::net::TcpStream::connect(proxy.local_addr())
            .await
            .unwrap();
        local.write_all(b"hello").await.unwrap();
        local.shutdown().await.unwrap();
        // The proxy's close_notify reached the server: its backend read to the end.
        let got = timeout(BOUND, client_ended).await.unwrap().unwrap();
        assert_eq!(got, b"hello");
        let cut_a_record = !tail.is_empty();
        cut.send(tail).unwrap();
        let report = timeout(BOUND, proxy.next_report()).await.unwrap().unwrap();
        assert!(report.connected, "{report:?}");
        assert_left_after_our_close(
            &report.outcome,
            report.peer_left_without_close_notify,
            cut_a_record,
            &report,
        );
    }
}

/// A session whose peer left after our close_notify without its own: an error that names
/// the record it cut if it left part-way through one, otherwise a clean end that says how
/// the peer left.
fn assert_left_after_our_close(
    outcome: &Result<(), String>,
    left_without_close_notify: bool,
    cut_a_record: bool,
    report: &dyn std::fmt::Debug,
) {
    assert_eq!(outcome.is_err(), cut_a_record, "{report:?}");
    assert_eq!(left_without_close_notify, !cut_a_record, "{report:?}");
    if let Err(why) = outcome {
        assert!(why.contains("part-way through a record"), "{why}");
    }
}

/// A session still open at the end of a drain is cut and reported as cut, with what it
/// carried so far; then the report stream ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_cut_at_the_end_of_a_drain_is_reported() {
    a_session_cut_in_a_drain_is_reported(Duration::from_millis(200), false).await;
}

/// The same when the drain is cut short ([`MbtlsServer::cut_now`], the CLI's second stop
/// signal): the session is cut at once, long before its grace period (an hour) ends, and
/// reported (twenty-sixth round; before, the CLI returned at the second signal, without the
/// reports of what it cut).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_cut_by_ending_the_drain_early_is_reported() {
    a_session_cut_in_a_drain_is_reported(Duration::from_secs(3600), true).await;
}

async fn a_session_cut_in_a_drain_is_reported(grace: Duration, cut_now: bool) {
    let w = World::new();
    let backend = stream_echo_backend().await;
    let version = TlsVersion::Tls13;
    let (mut server, mb2) = w.server_behind_mb2(version, backend).await;
    // A request (mb2's app inserts its header into it), echoed whole.
    let request = b"GET / HTTP/1.1\r\n\r\n";
    let mut client = w.client_alone(mb2.local_addr(), version, request).await;
    let mut echoed = Vec::new();
    while !echoed.ends_with(b"\r\n\r\n") {
        let more = timeout(BOUND, client.read()).await.unwrap().unwrap();
        echoed.extend_from_slice(&more.unwrap());
    }
    server.drain(grace);
    if cut_now {
        server.cut_now();
    }
    let report = timeout(BOUND, server.next_report()).await.unwrap().unwrap();
    let why = report.outcome.as_ref().unwrap_err();
    assert!(why.contains("end of the drain time"), "{report:?}");
    // It still names its middlebox, verified at the handshake.
    assert!(
        matches!(
            report.verdicts.as_slice(),
            [MiddleboxVerdict::Verified { .. }]
        ),
        "{report:?}"
    );
    let n = echoed.len() as u64;
    assert_eq!(
        (report.bytes_to_backend, report.bytes_from_backend),
        (n, n),
        "{report:?}"
    );
    assert!(timeout(BOUND, server.next_report())
        .await
        .unwrap()
        .is_none());
    assert_eq!(server.connections_cut(), 1);
}

/// A session cut while a client proxy's local application is still reading what came before
/// the cut: the proxy resets the local connection (the stream is truncated), but only once
/// what it passed on has reached the application, every byte it counted (found in a user
/// trial: a download cut by a server's drain lost its last megabyte at the local application,
/// which the reset dropped from the proxy's socket).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_passes_on_what_came_before_a_cut_then_resets() {
    let w = World::new();
    let (mut server, mut proxy) = proxy_to_a_bulk_server(&w).await;
    let mut local = tokio::net::TcpStream::connect(proxy.local_addr())
        .await
        .unwrap();
    local.write_all(b"GET /big HTTP/1.1\r\n\r\n").await.unwrap();
    // A slow reader: the proxy's socket toward it fills up, and holds what it was given.
    let (mut read, mut cut) = (0u64, false);
    let mut buf = vec![0u8; 16 * 1024];
    let end = loop {
        match timeout(BOUND, local.read(&mut buf)).await.unwrap() {
            Ok(0) => break Ok(()),
            Ok(n) => read += n as u64,
            Err(e) => break Err(e.kind()),
        }
        if !cut && read >= 1 << 20 {
            server.drain(Duration::ZERO);
            server.cut_now();
            cut = true;
        }
        // Slow throughout, so that the proxy's socket toward it is full when the cut comes
        // (and the reset, without the wait, drops what it holds).
        tokio::time::sleep(Duration::from_millis(1)).await;
    };
    assert_eq!(
        end,
        Err(std::io::ErrorKind::ConnectionReset),
        "after {read} bytes"
    );
    let report = timeout(BOUND, proxy.next_report()).await.unwrap().unwrap();
    assert!(report.outcome.is_err(), "{report:?}");
    assert!(report.bytes_down < 16 << 20, "not cut: {report:?}");
    assert_eq!(read, report.bytes_down, "{report:?}");
}

/// A client proxy toward an mbTLS server (no middlebox) whose backend sends 16 MiB to each
/// request and then holds its connection open.
async fn proxy_to_a_bulk_server(w: &World) -> (MbtlsServer, ClientProxy) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let backend = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = [0u8; 1024];
                let _ = s.read(&mut head).await;
                let _ = s.write_all(&vec![b'x'; 16 << 20]).await;
                let _ = s.read(&mut head).await;
            });
        }
    });
    let server = w
        .server_without_middleboxes(TlsVersion::Tls13, backend)
        .await;
    let proxy = ClientProxy::bind(
        "127.0.0.1:0",
        ClientProxyConfig {
            handshake: w.client_without_middleboxes(TlsVersion::Tls13),
            first_hop: server.local_addr().to_string(),
            session_failed_answer: Some(answer_with_error(b"no session: ")),
            limits: Limits::default(),
        },
    )
    .await
    .unwrap();
    (server, proxy)
}

/// A local application that leaves part-way through a download (a reset) is said to have
/// left, as a neighbour is, not with the OS's words (found in a user trial: "writing to the
/// local connection: Broken pipe (os error 32)").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_application_that_leaves_is_named() {
    let w = World::new();
    let (_server, mut proxy) = proxy_to_a_bulk_server(&w).await;
    let mut local = tokio::net::TcpStream::connect(proxy.local_addr())
        .await
        .unwrap();
    local.write_all(b"GET /big HTTP/1.1\r\n\r\n").await.unwrap();
    let mut buf = vec![0u8; 64 * 1024];
    let mut read = 0;
    while read < 1 << 20 {
        read += timeout(BOUND, local.read(&mut buf)).await.unwrap().unwrap();
    }
    local.set_zero_linger().unwrap();
    drop(local);
    let report = timeout(BOUND, proxy.next_report()).await.unwrap().unwrap();
    let why = report.outcome.unwrap_err();
    assert!(
        why.starts_with("the local application closed the connection ")
            && !why.contains("os error"),
        "{why}"
    );
}

/// A TCP forwarder toward `to` for one connection that stops reading from `to` while `paused`
/// holds (its socket toward `to` has a small receive buffer, so `to` soon cannot write).
async fn pausing_forwarder(to: SocketAddr) -> (SocketAddr, tokio::sync::watch::Sender<bool>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (pause, mut paused) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        let (inbound, _) = listener.accept().await.unwrap();
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(4096).unwrap();
        let outbound = socket.connect(to).await.unwrap();
        let (mut in_r, mut in_w) = inbound.into_split();
        let (mut out_r, mut out_w) = outbound.into_split();
        tokio::spawn(async move {
            let _ = tokio::io::copy(&mut in_r, &mut out_w).await;
            let _ = out_w.shutdown().await;
        });
        let mut buf = vec![0u8; 4096];
        loop {
            while *paused.borrow() {
                if paused.changed().await.is_err() {
                    return;
                }
            }
            match out_r.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if in_w.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            }
        }
        let _ = in_w.shutdown().await;
    });
    (addr, pause)
}

/// How many bytes a loopback connection takes from its writer while its reader (with the
/// pausing forwarder's receive buffer) reads nothing.
async fn bytes_the_kernel_takes() -> usize {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let _reader = socket
        .connect(listener.local_addr().unwrap())
        .await
        .unwrap();
    let (writer, _) = listener.accept().await.unwrap();
    let (mut taken, chunk) = (0, vec![0u8; 16 * 1024]);
    loop {
        writer.writable().await.unwrap();
        match writer.try_write(&chunk) {
            Ok(n) => taken += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                // Full once a short wait brings no more room.
                let more = timeout(Duration::from_millis(50), writer.writable()).await;
                if more.is_err() {
                    return taken;
                }
            }
            Err(e) => panic!("{e}"),
        }
    }
}

/// After both close_notifys the middlebox still delivers what it had queued, at its reader's
/// pace, and only then reports a clean end: a client that reads slowly (here: not at all for
/// longer than the middlebox's 5 s close grace) gets the whole answer and the server's
/// close_notify. (Before, the middlebox gave up after the grace and reported a clean end while
/// the client saw a truncated session.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_reader_gets_everything_queued_after_both_close_notifys() {
    // What the kernel takes of a connection whose reader stopped, then a little more, which
    // the middlebox holds in its outbox with the close_notify (more would stop its reads
    // before the close_notify).
    let answer_len = bytes_the_kernel_takes().await + 192 * 1024;
    let w = World::new();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let backend = listener.local_addr().unwrap();
    let (answered, answer_sent) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        // The client's close_notify ends the request; then the whole answer, and the end.
        let _ = s.read_to_end(&mut Vec::new()).await;
        s.write_all(&vec![b'a'; answer_len]).await.unwrap();
        s.shutdown().await.unwrap();
        let _ = answered.send(());
    });
    let version = TlsVersion::Tls13;
    let (_server, mut mb2) = w.server_behind_mb2(version, backend).await;
    let (forwarder, pause) = pausing_forwarder(mb2.local_addr()).await;
    let mut client = w.client_alone(forwarder, version, b"request").await;
    pause.send(true).unwrap();
    client.close().await.unwrap();
    // From the backend's end on (the server's close_notify follows it to the middlebox),
    // longer than the middlebox's close grace (5 s), which it once gave queued bytes.
    timeout(BOUND, answer_sent).await.unwrap().unwrap();
    tokio::time::sleep(Duration::from_secs(6)).await;
    // The middlebox still holds part of the answer (else this test would show nothing).
    assert!(
        timeout(Duration::from_millis(200), mb2.next_report())
            .await
            .is_err(),
        "the middlebox ended before the reader went on: nothing was left queued"
    );
    pause.send(false).unwrap();
    let answer = timeout(BOUND, client.read_to_end()).await.unwrap().unwrap();
    assert_eq!(answer.len(), answer_len);
    let report = timeout(BOUND, mb2.next_report()).await.unwrap().unwrap();
    assert!(report.outcome.is_ok(), "{report:?}");
}

/// A session cut by a stop (the end of a drain aborts it) resets the backend's connection:
/// dropped mid-way, the server's splice must not leave the backend a clean end of stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_cut_by_a_stop_resets_the_backend_connection() {
    let w = World::new();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let backend = listener.local_addr().unwrap();
    let (got_data, data_arrived) = tokio::sync::oneshot::channel();
    let (end_seen, end) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (mut s, _) = accept_upload(listener).await;
        let _ = got_data.send(());
        let _ = end_seen.send(s.read(&mut [0u8; 1024]).await.map_err(|e| e.kind()));
    });
    let version = TlsVersion::Tls13;
    let (mut server, mb2) = w.server_behind_mb2(version, backend).await;
    let _client = w.client_alone(mb2.local_addr(), version, UPLOAD).await;
    // The upload reached the backend, which waits for more; the stop cuts the session.
    timeout(BOUND, data_arrived).await.unwrap().unwrap();
    server.drain(Duration::from_millis(100));
    let report = timeout(BOUND, server.next_report()).await.unwrap().unwrap();
    assert!(report
        .outcome
        .unwrap_err()
        .contains("end of the drain time"));
    let end = timeout(BOUND, end).await.unwrap().unwrap();
    assert_eq!(end, Err(std::io::ErrorKind::ConnectionReset));
}

/// A configuration that would fail every session (here a server that may take up to no
/// discovered middlebox, and a proxy for a client with none) is refused when the service
/// starts and at a reload, which leaves the running configuration in force (before the
/// twenty-seventh round: the service started, or took the reload, and refused every session).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configuration_that_fails_every_session_is_refused_at_start_and_at_reload() {
    let w = World::new();
    let backend = echo_backend().await;
    let approve: mbx_mbtls::handshake::Approver = Arc::new(|_: &[Vec<u8>]| true);
    let mut none = w.server(TlsVersion::Tls13, backend);
    none.handshake.middlebox = ServerMiddlebox::DiscoverUpTo(approve.clone(), 0);
    let wanted = "DiscoverUpTo needs at least 1";
    let err = MbtlsServer::bind("127.0.0.1:0", none.clone())
        .await
        .unwrap_err();
    assert!(err.to_string().contains(wanted), "{err}");
    let server = MbtlsServer::bind("127.0.0.1:0", w.server(TlsVersion::Tls13, backend))
        .await
        .unwrap();
    let err = server.reload(none).unwrap_err();
    assert!(err.to_string().contains(wanted), "{err}");
    let running = server.config();
    assert!(matches!(
        running.handshake.middlebox,
        ServerMiddlebox::Preconfigured(_)
    ));

    let mut client = w.client(TlsVersion::Tls13);
    client.middlebox = ClientMiddlebox::DiscoverUpTo(approve, 0);
    let config = |handshake| ClientProxyConfig {
        handshake,
        first_hop: server.local_addr().to_string(),
        session_failed_answer: None,
        limits: Limits::default(),
    };
    let wanted = "1 to 255 client-side middleboxes";
    let err = ClientProxy::bind("127.0.0.1:0", config(client.clone()))
        .await
        .unwrap_err();
    assert!(err.to_string().contains(wanted), "{err}");
    let proxy = ClientProxy::bind("127.0.0.1:0", config(w.client(TlsVersion::Tls13)))
        .await
        .unwrap();
    let err = proxy.reload(config(client)).unwrap_err();
    assert!(err.to_string().contains(wanted), "{err}");
    assert!(matches!(
        proxy.config().handshake.middlebox,
        ClientMiddlebox::Preconfigured(_)
    ));
}

/// A client proxy whose session cannot start (its first hop refuses the connection) resets
/// the local connection instead of closing it: an application that waits for a server's
/// first words must not read an empty, complete stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_session_that_cannot_start_resets_or_answers_the_local_connection() {
    let w = World::new();
    let refusing_guard = mbx_testbed::refusing_addr();
    let refusing = refusing_guard.addr();
    let mut proxy = ClientProxy::bind(
        "127.0.0.1:0",
        ClientProxyConfig {
            handshake: w.client(TlsVersion::Tls13),
            first_hop: refusing.to_string(),
            session_failed_answer: None,
            limits: Limits::default(),
        },
    )
    .await
    .unwrap();
    // The reset can come before the connection is even reported as made.
    let seen = match tokio::net::TcpStream::connect(proxy.local_addr()).await {
        Ok(mut local) => timeout(BOUND, local.read(&mut [0u8; 16]))
            .await
            .unwrap()
            .map_err(|e| e.kind()),
        Err(e) => Err(e.kind()),
    };
    assert_eq!(seen, Err(std::io::ErrorKind::ConnectionReset));
    let report = timeout(BOUND, proxy.next_report()).await.unwrap().unwrap();
    assert!(!report.connected && report.outcome.is_err(), "{report:?}");

    // With an answer configured, the local connection gets it and the error's text, then an
    // orderly end, even with its request unread.
    let mut proxy = ClientProxy::bind(
        "127.0.0.1:0",
        ClientProxyConfig {
            handshake: w.client(TlsVersion::Tls13),
            first_hop: refusing.to_string(),
            limits: Limits::default(),
            session_failed_answer: Some(answer_with_error(b"no session: ")),
        },
    )
    .await
    .unwrap();
    let mut local = tokio::net::TcpStream::connect(proxy.local_addr())
        .await
        .unwrap();
    local.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
    let mut told = Vec::new();
    timeout(BOUND, local.read_to_end(&mut told))
        .await
        .unwrap()
        .unwrap();
    let told = String::from_utf8(told).unwrap();
    assert!(
        told.starts_with("no session: cannot connect to the first hop") && told.ends_with('\n'),
        "{told}"
    );
    // The proxy reads until the local application closes.
    drop(local);
    let report = timeout(BOUND, proxy.next_report()).await.unwrap().unwrap();
    assert!(!report.connected && report.outcome.is_err(), "{report:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_server_side_middlebox_makes_both_endpoints_fail_with_an_error() {
    let w = World::new();
    let backend = greeting_backend().await;
    let version = TlsVersion::Tls13;
    let (mut server, mb2) = w.server_behind_mb2(version, backend).await;
    // An mbTLS client with no middlebox of its own (discovery, none on its side).
    let request = b"GET / HTTP/1.1\r\n\r\n";
    let mut client = w.client_alone(mb2.local_addr(), version, request).await;
    // The greeting came through the middlebox: the server verified it and sent its keys (the
    // client's handshake can end before the server's secondary session does).
    let greeting = timeout(BOUND, client.read()).await.unwrap().unwrap();
    assert_eq!(greeting.as_deref(), Some(GREETING));
    // The middlebox process dies mid-session.
    drop(mb2);
    let read = timeout(BOUND, client.read()).await.unwrap();
    assert!(read.is_err(), "{read:?}");
    let report = timeout(BOUND, server.next_report()).await.unwrap().unwrap();
    assert!(report.outcome.is_err(), "{report:?}");
    assert!(
        matches!(
            report.verdicts.as_slice(),
            [MiddleboxVerdict::Verified { .. }]
        ),
        "{report:?}"
    );
}

/// A TCP echo backend written the plain way: read a chunk, write it back, read the next. While
/// a write waits for room, it reads nothing.
async fn stream_echo_backend() -> SocketAddr {
    echo_backend_after(b"").await
}

/// A stream echo backend that first answers a request's head with `answer` (the head itself is
/// echoed after it).
async fn echo_backend_after(answer: &'static [u8]) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                if !answer.is_empty() {
                    let mut head = Vec::new();
                    while !head.ends_with(b"\r\n\r\n") && !head.ends_with(b"\n\n") {
                        match s.read_u8().await {
                            Ok(b) => head.push(b),
                            Err(_) => return,
                        }
                    }
                    if s.write_all(&[answer, &head].concat()).await.is_err() {
                        return;
                    }
                }
                loop {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            if s.write_all(&buf[..n]).await.is_err() {
                                return;
                            }
                        }
                    }
                }
                let _ = s.shutdown().await;
            });
        }
    });
    addr
}

/// Bytes echoed in the no-deadlock test: more than every socket buffer and queue on the
/// path can hold, so a node that stops reading one side while it waits to write the other
/// side closes a cycle of full buffers.
const ECHOED: usize = 96 << 20;

/// Client as a local proxy → client-side middlebox → server-side middlebox → mbTLS server →
/// an echo backend, with a local application that writes a large stream while it reads the
/// echo. Every node must keep reading the side whose output has room while the other side's
/// output is full; one that blocks on a write with both sides unread deadlocks the path.
/// client -> mb1 (client side) -> mb2 (server side) -> mbTLS server -> stream echo backend,
/// pass-through apps, TLS 1.3: the server, both middleboxes and the client's session.
async fn echo_path(w: &World) -> (MbtlsServer, [MiddleboxServer; 2], MbtlsClient, SocketAddr) {
    let backend = stream_echo_backend().await;
    let (server, mbs, client) = path_to(w, backend, |_| {}).await;
    (server, mbs, client, backend)
}

/// client -> mb1 -> mb2 -> mbTLS server (its configuration `tweak`ed) -> `backend`, TLS 1.3,
/// pass-through apps.
async fn path_to(
    w: &World,
    backend: SocketAddr,
    tweak: impl FnOnce(&mut MbtlsServerConfig),
) -> (MbtlsServer, [MiddleboxServer; 2], MbtlsClient) {
    let version = TlsVersion::Tls13;
    let pass = || -> AppFactory {
        Arc::new(|| Box::new(mbx_apps::PassThrough) as Box<dyn MiddleboxApp + Send>)
    };
    let mut cfg = w.server(version, backend);
    tweak(&mut cfg);
    let server = MbtlsServer::bind("127.0.0.1:0", cfg).await.unwrap();
    let mut mb2_cfg = w.middlebox("mb2.test", server.local_addr(), Placement::ServerSide);
    mb2_cfg.app = pass();
    let mb2 = MiddleboxServer::bind("127.0.0.1:0", mb2_cfg).await.unwrap();
    let mut mb1_cfg = w.middlebox("mb1.test", mb2.local_addr(), Placement::ClientSide);
    mb1_cfg.app = pass();
    let mb1 = MiddleboxServer::bind("127.0.0.1:0", mb1_cfg).await.unwrap();
    let client = timeout(
        BOUND,
        MbtlsClient::connect(mb1.local_addr(), w.client(version)),
    )
    .await
    .unwrap()
    .unwrap();
    (server, [mb1, mb2], client)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_echoed_stream_crosses_every_driver_without_deadlock() {
    let w = World::new();
    let (_server, _mbs, client, _) = echo_path(&w).await;
    // The local application's connection to the client proxy.
    let local = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let app = tokio::net::TcpStream::connect(local.local_addr().unwrap())
        .await
        .unwrap();
    let (proxied, _) = local.accept().await.unwrap();
    let proxy = tokio::spawn(client.proxy(proxied));
    let pattern = |i: usize| (i.wrapping_mul(31) ^ (i >> 13)) as u8;
    let (mut app_r, mut app_w) = app.into_split();
    let writer = tokio::spawn(async move {
        let data: Vec<u8> = (0..ECHOED).map(pattern).collect();
        for chunk in data.chunks(256 * 1024) {
            app_w.write_all(chunk).await.unwrap();
        }
        app_w.shutdown().await.unwrap();
    });
    let echoed = timeout(BOUND, async move {
        let mut got = Vec::with_capacity(ECHOED);
        app_r.read_to_end(&mut got).await.unwrap();
        got
    })
    .await
    .expect("the echoed stream stalled: a node on the path deadlocked");
    timeout(BOUND, writer).await.unwrap().unwrap();
    assert_eq!(echoed.len(), ECHOED);
    assert!(echoed.iter().enumerate().all(|(i, b)| *b == pattern(i)));
    let (up, down) = timeout(BOUND, proxy).await.unwrap().unwrap().unwrap();
    assert_eq!((up, down), (ECHOED as u64, ECHOED as u64));
}

/// A client that connects and sends nothing, or stops in the middle of its ClientHello, is
/// closed by the mbTLS server after `handshake_timeout`, with a report that says so; the
/// backend is never contacted. (Real time passes; only the close and the report are checked.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mbtls_server_closes_a_stalled_handshake() {
    let w = World::new();
    let backend = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut cfg = w.server(TlsVersion::Tls13, backend.local_addr().unwrap());
    cfg.limits.handshake_timeout = Duration::from_secs(2);
    let mut server = MbtlsServer::bind("127.0.0.1:0", cfg).await.unwrap();
    let partial: &[u8] = &[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00];
    for sent in [&[][..], partial] {
        let mut peer = tokio::net::TcpStream::connect(server.local_addr())
            .await
            .unwrap();
        peer.write_all(sent).await.unwrap();
        assert!(
            mbx_testbed::wait::closed_by_peer(&mut peer, BOUND).await,
            "the server never closed the connection"
        );
        let report = timeout(BOUND, server.next_report()).await.unwrap().unwrap();
        let why = report.outcome.clone().unwrap_err();
        assert!(why.contains("did not finish within"), "{report:?}");
    }
    // Nobody reached the backend.
    assert!(
        timeout(Duration::from_millis(100), backend.accept())
            .await
            .is_err(),
        "the backend was contacted"
    );
}

/// Echoes `data` through the local application's connection to a client proxy.
async fn echo_local(app: &mut tokio::net::TcpStream, data: &[u8]) {
    for piece in data.chunks(65536) {
        app.write_all(piece).await.unwrap();
        let mut got = vec![0u8; piece.len()];
        timeout(BOUND, app.read_exact(&mut got))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(got, piece);
    }
}

/// The mbTLS server and the client as a local proxy keep their sockets alive (TCP keepalive)
/// and free their read buffers after `IDLE_TRIM_AFTER` (2 s) without a read, and the session
/// goes on unharmed, small messages and bulk alike, on the full path local application ->
/// client proxy -> mb1 -> mb2 -> server -> echo backend. (The wait is real time; only the
/// kernel's timers, the server's trim count and the echoed bytes are checked.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_session_frees_read_buffers_at_both_endpoints_and_carries_on() {
    let w = World::new();
    let (mut server, mbs, client, backend) = echo_path(&w).await;
    let local = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut app = tokio::net::TcpStream::connect(local.local_addr().unwrap())
        .await
        .unwrap();
    let (proxied, _) = local.accept().await.unwrap();
    let proxy = tokio::spawn(client.proxy(proxied));
    let bulk: Vec<u8> = (0..1u32 << 20).map(|i| (i % 253) as u8).collect();
    echo_local(&mut app, &bulk).await;
    // TCP keepalive on the server's two sockets and on the client's socket to mb1 (the
    // kernel shows the timer once the session is idle): a vanished peer does not hold them.
    let (server_port, mb1_port) = (server.local_addr().port(), mbs[0].local_addr().port());
    timeout(BOUND, async {
        loop {
            let all = tcp_table::read().unwrap();
            let timers = [
                established_timer(&all, |s| s.local_port == server_port),
                established_timer(&all, |s| s.remote_port == backend.port()),
                established_timer(&all, |s| s.remote_port == mb1_port),
            ];
            if timers == [Some(KEEPALIVE); 3] {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("no keepalive timer on the endpoints' sockets");
    // 1.5 s past the trim's due time, so that the timer fires before the next bytes arrive
    // even if a loaded machine stalls the runtime for a moment.
    tokio::time::sleep(Duration::from_millis(3500)).await;
    echo_local(&mut app, b"after the pause").await;
    echo_local(&mut app, &bulk[..1 << 18]).await;
    app.shutdown().await.unwrap();
    let mut rest = Vec::new();
    timeout(BOUND, app.read_to_end(&mut rest))
        .await
        .unwrap()
        .unwrap();
    assert!(rest.is_empty());
    let carried = (bulk.len() + 15 + (1 << 18)) as u64;
    let (up, down) = timeout(BOUND, proxy).await.unwrap().unwrap().unwrap();
    assert_eq!((up, down), (carried, carried));
    let report = timeout(BOUND, server.next_report()).await.unwrap().unwrap();
    assert!(report.idle_trims >= 1, "{report:?}");
    assert_eq!(report.bytes_to_backend, carried, "{report:?}");
}

/// A backend that never answers (its listen queue is full, so the kernel drops our SYNs) does
/// not hold a session for the kernel's two minutes of connect retries: the server gives up
/// after its handshake timeout, reports why and closes the session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unanswering_backend_fails_the_session_after_the_handshake_timeout() {
    let w = World::new();
    let full = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    full.bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into())
        .unwrap();
    full.listen(0).unwrap();
    let backend = full.local_addr().unwrap().as_socket().unwrap();
    // The one connection a backlog of 0 holds; later SYNs are dropped.
    let _queued = tokio::net::TcpStream::connect(backend).await.unwrap();
    let (mut server, _mbs, mut client) = path_to(&w, backend, |cfg| {
        cfg.limits.handshake_timeout = Duration::from_secs(2)
    })
    .await;
    let read = timeout(BOUND, client.read()).await.unwrap();
    assert!(!matches!(read, Ok(Some(_))), "{read:?}");
    let report = timeout(BOUND, server.next_report()).await.unwrap().unwrap();
    let why = report.outcome.clone().unwrap_err();
    assert!(why.contains("cannot connect to the backend"), "{report:?}");
}

/// A backend that refuses the connection: with `backend_unavailable` the client gets that
/// answer and a clean close_notify (a request it sent meanwhile does not reset the answer away),
/// through both middleboxes, and the server still reports the session as failed; without it the
/// client reads the server's fatal `internal_error`, passed on by both middleboxes (thirty-second
/// round; before, a close without close_notify, as a cut looks). A session that stayed in
/// OpenSSL (no server-side middlebox) has no alert of the server's to send: it just ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_that_cannot_be_reached_gets_the_configured_answer() {
    let w = World::new();
    let refusing = mbx_testbed::refusing_addr();
    let down = refusing.addr();
    for answer in [Some(b"502, sorry".to_vec()), None] {
        let wanted = answer.clone();
        let (mut server, _mbs, mut client) =
            path_to(&w, down, |cfg| cfg.backend_unavailable = wanted).await;
        client.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        let read = timeout(BOUND, client.read_to_end()).await.unwrap();
        match &answer {
            Some(a) => assert_eq!(read.as_deref().ok(), Some(a.as_slice()), "{read:?}"),
            None => assert!(
                matches!(
                    read,
                    Err(DriverError::Alert { description: 80, what }) if what == RECEIVED_FROM_THE_PATH
                ),
                "{read:?}"
            ),
        }
        // The server reads until the client leaves (within its close grace).
        drop(client);
        let report = timeout(BOUND, server.next_report()).await.unwrap().unwrap();
        let why = report.outcome.clone().unwrap_err();
        assert!(why.contains("cannot connect to the backend"), "{report:?}");
    }
    // Straight to the server, no middlebox: the session stays in OpenSSL, and just ends.
    let version = TlsVersion::Tls13;
    let server = w.server_without_middleboxes(version, down).await;
    let cfg = w.client_without_middleboxes(version);
    let mut client = timeout(BOUND, MbtlsClient::connect(server.local_addr(), cfg))
        .await
        .unwrap()
        .unwrap();
    let read = timeout(BOUND, client.read_to_end()).await.unwrap();
    assert!(
        matches!(read, Err(DriverError::PeerGone { .. })),
        "{read:?}"
    );
}

/// An established session that carries nothing for the mbTLS server's idle timeout is closed by
/// the server, toward the path and toward the backend, without close_notify (so the client sees
/// it end abnormally), and reported as idle; traffic with shorter gaps keeps it up well past the
/// timeout. The middleboxes, whose own timeouts are the default ten minutes, follow the
/// server's close. (Real time, gaps of a fifth of the timeout.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mbtls_server_closes_an_idle_session() {
    let w = World::new();
    let idle = Duration::from_secs(1);
    let backend = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let backend_addr = backend.local_addr().unwrap();
    let (mut server, mut mbs, mut client) =
        path_to(&w, backend_addr, |cfg| cfg.limits.idle_timeout = Some(idle)).await;
    let (mut at_backend, _) = timeout(BOUND, backend.accept()).await.unwrap().unwrap();
    let mut got = [0u8; 4];
    for i in 0..15u32 {
        tokio::time::sleep(idle / 5).await;
        client.write_all(&i.to_be_bytes()).await.unwrap();
        timeout(BOUND, at_backend.read_exact(&mut got))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(got, i.to_be_bytes());
        at_backend.write_all(&got).await.unwrap();
        let echoed = timeout(BOUND, client.read()).await.unwrap().unwrap();
        assert_eq!(echoed.as_deref(), Some(&got[..]));
    }
    // Silence: the server closes the backend connection and the session.
    let mut rest = Vec::new();
    let n = timeout(BOUND, at_backend.read_to_end(&mut rest))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(n, 0);
    let read = timeout(BOUND, client.read()).await.unwrap();
    assert!(read.is_err(), "{read:?}");
    let report = timeout(BOUND, server.next_report()).await.unwrap().unwrap();
    let why = report.outcome.clone().unwrap_err();
    assert!(why.contains("idle for 1s"), "{report:?}");
    assert_eq!(report.bytes_to_backend, 60, "{report:?}");
    for mb in &mut mbs {
        let r = timeout(BOUND, mb.next_report()).await.unwrap().unwrap();
        assert!(r.keys_installed && r.outcome.is_err(), "{r:?}");
    }
}

/// The client as a local proxy service (`ClientProxy`): each local connection gets its own
/// session through mb1 -> mb2 -> server -> echo backend and is reported with its bytes; at its
/// connection limit a second local connection waits unserved until the first ends; a session
/// left idle is closed after the proxy's idle timeout and reported as such.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_proxy_serves_local_connections_within_its_limits() {
    let w = World::new();
    let (_server, mbs, first_client, _) = echo_path(&w).await;
    drop(first_client);
    let mut proxy = ClientProxy::bind(
        "127.0.0.1:0",
        ClientProxyConfig {
            handshake: w.client(TlsVersion::Tls13),
            first_hop: mbs[0].local_addr().to_string(),
            session_failed_answer: None,
            limits: Limits {
                idle_timeout: Some(Duration::from_secs(1)),
                max_connections: Some(1),
                ..Limits::default()
            },
        },
    )
    .await
    .unwrap();
    let mut first = tokio::net::TcpStream::connect(proxy.local_addr())
        .await
        .unwrap();
    echo_local(&mut first, b"first").await;
    // The limit is reached: the second is not served while the first is open.
    let mut second = tokio::net::TcpStream::connect(proxy.local_addr())
        .await
        .unwrap();
    second.write_all(b"second").await.unwrap();
    let mut got = [0u8; 6];
    assert!(
        timeout(Duration::from_millis(500), second.read_exact(&mut got))
            .await
            .is_err(),
        "a connection over the limit was served"
    );
    // The first ends cleanly; then the second is served.
    first.shutdown().await.unwrap();
    let mut rest = Vec::new();
    timeout(BOUND, first.read_to_end(&mut rest))
        .await
        .unwrap()
        .unwrap();
    let report = timeout(BOUND, proxy.next_report()).await.unwrap().unwrap();
    assert!(report.connected && report.outcome.is_ok(), "{report:?}");
    assert_eq!((report.bytes_up, report.bytes_down), (5, 5), "{report:?}");
    assert!(report.summary.is_some_and(|s| s.hops.len() == 2));
    // The proxy's counts (its metrics) take the middlebox that received keys.
    assert_eq!(proxy.stats().ended().middlebox_took_part, 1);
    timeout(BOUND, second.read_exact(&mut got))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&got, b"second");
    // Then silence: closed after the idle timeout.
    let n = timeout(BOUND, second.read(&mut got)).await.unwrap();
    assert!(matches!(n, Ok(0) | Err(_)), "{n:?}");
    let report = timeout(BOUND, proxy.next_report()).await.unwrap().unwrap();
    assert!(report.connected, "{report:?}");
    let why = report.outcome.clone().unwrap_err();
    assert!(why.contains("idle for 1s"), "{report:?}");
    // What it carried before, counted although it failed.
    assert_eq!((report.bytes_up, report.bytes_down), (6, 6), "{report:?}");
}

/// `openssl s_client` to `addr` sending one request, with `args`; its stdout.
async fn s_client_request(
    w: &World,
    addr: SocketAddr,
    version: TlsVersion,
    args: Vec<String>,
) -> String {
    let ca = w.server_files.ca.clone();
    let out = tokio::task::spawn_blocking(move || {
        let mut c = OpensslClient::new(addr)
            .servername("server.test")
            .cafile(ca)
            .version(tb(version))
            .input(&b"GET /resumed HTTP/1.1\r\nHost: server.test\r\nConnection: close\r\n\r\n"[..]);
        for a in args {
            c = c.arg(a);
        }
        c.run().unwrap()
    })
    .await
    .unwrap();
    out.stdout_str().to_string()
}

/// Legacy clients resume their sessions with the mbTLS server (its tickets, TLS 1.2 and 1.3;
/// and TLS 1.2 session IDs from its cache, tickets off), directly and through a server-side
/// middlebox, which on a resumed session still gets its keys (a fresh secondary session and
/// evidence) and sees the request. TLS 1.2: `s_client -reconnect` makes one full handshake and
/// five abbreviated ones and sends its request on the last; it closes each connection right
/// after its close_notify, before the server's, so the session IDs are resumed only because a
/// session the client closed cleanly stays in the cache, whether it stayed in OpenSSL
/// (directly) or was exported (through the middlebox). TLS 1.3: one `s_client` keeps its
/// session (`-sess_out`), a second resumes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn legacy_clients_resume_directly_and_through_a_server_side_middlebox() {
    let w = World::new();
    let backend = echo_backend().await;
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (TlsVersion::Tls12, true),
        (TlsVersion::Tls12, false),
        (TlsVersion::Tls13, true),
    ];
    for (version, tickets) in cases {
        let cfg = w.server_with_tickets(version, backend, tickets);
        let (_server, mb2) = w.server_behind_mb2_with(cfg).await;
        // A second server that takes sessions without a middlebox (it requires none).
        let mut alone = w.server_with_tickets(version, backend, tickets);
        alone.handshake.middlebox = no_server_middlebox();
        let alone = MbtlsServer::bind("127.0.0.1:0", alone).await.unwrap();
        for (addr, through_mb2) in [(alone.local_addr(), false), (mb2.local_addr(), true)] {
            let count = |out: &str, what: &str| out.lines().filter(|l| l.starts_with(what)).count();
            let outputs = match version {
                TlsVersion::Tls12 => {
                    let out = s_client_request(&w, addr, version, vec!["-reconnect".into()]).await;
                    let what = format!("tickets {tickets}, through mb2 {through_mb2}: {out}");
                    assert_eq!(count(&out, "New, TLSv1.2"), 1, "{what}");
                    assert_eq!(count(&out, "Reused, TLSv1.2"), 5, "{what}");
                    vec![out]
                }
                TlsVersion::Tls13 => {
                    let sess = dir.path().join(format!("{through_mb2}.pem"));
                    let sess = sess.to_str().unwrap().to_string();
                    let first =
                        s_client_request(&w, addr, version, vec!["-sess_out".into(), sess.clone()])
                            .await;
                    let second =
                        s_client_request(&w, addr, version, vec!["-sess_in".into(), sess]).await;
                    assert_eq!(count(&first, "New, TLSv1.3"), 1, "{first}");
                    assert_eq!(count(&second, "Reused, TLSv1.3"), 1, "{second}");
                    vec![first, second]
                }
            };
            for out in outputs {
                assert!(out.contains("HTTP/1.1 200 OK"), "{version:?}: {out}");
                assert!(out.contains("GET /resumed"), "{out}");
                assert_eq!(out.contains("X-Mbtls: mb2.test"), through_mb2, "{out}");
            }
        }
    }
}
