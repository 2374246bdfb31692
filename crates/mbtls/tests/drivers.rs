//! The tokio drivers over real TCP on loopback, in front of real legacy servers (nginx,
//! `openssl s_server`): client → one pre-configured middlebox → server, TLS 1.2 and 1.3.
//!
//! Time is never asserted; `tokio::time::timeout` only bounds waits so a hang fails the test.

use mbx_testbed::tcp_table::{self, established_timer, KEEPALIVE};

use std::sync::Arc;
use std::time::Duration;

use mbx_apps::{HttpHeaderInsert, MiddleboxApp, PassThrough};
use mbx_attest::sim::{measure, signer_id};
use mbx_attest::{
    AttestError, Attester, Evidence, HexBytes, Policy, SimulatedAttester, SimulatedPlatform,
};
use mbx_engine::{CustomExtension, Identity, OpenSslContext, OpenSslEngine, TlsConfig, TlsEngine};
use mbx_mbtls::driver::client::MiddleboxVerdict;
use mbx_mbtls::driver::{
    AppFactory, DriverError, ErrorKind, MbtlsClient, MiddleboxServer, MiddleboxServerConfig,
    Placement, REPORTS_KEPT,
};
use mbx_mbtls::handshake::{
    ClientHandshake, ClientHandshakeConfig, ClientMiddlebox, HandshakeError,
    MiddleboxHandshakeConfig, PAUSE_READING_AT,
};
use mbx_mbtls::MIDDLEBOX_SUPPORT_EXTENSION;
use mbx_record::TlsVersion;
use mbx_testbed::relay::{DelayRelay, Direction, FlightCounter, Tap};
use mbx_testbed::wait::printed;
use mbx_testbed::{LeafSpec, Nginx, OpensslServer, PkiFiles, ServerMode, TestPki};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::timeout;

const PROGRAM: &str = "mbx-test-middlebox";
/// Upper bound for any one network step; only there so that a hang fails instead of blocking.
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
    root_pem: Vec<u8>,
    server_files: PkiFiles,
    mbox_id: Identity,
    platform: Arc<SimulatedPlatform>,
}

impl World {
    /// An in-process legacy server's context for `version`, with the server's certificate.
    fn legacy_server_context(&self, version: TlsVersion) -> OpenSslContext {
        let leaf =
            Identity::from_pem_files(&self.server_files.chain, &self.server_files.key).unwrap();
        OpenSslContext::new(&TlsConfig::server(leaf).only(version)).unwrap()
    }

    fn new() -> World {
        let pki = TestPki::new("mbtls driver test root").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let server_files = pki
            .issue(&LeafSpec::server("server.test"))
            .unwrap()
            .write_to(dir.path())
            .unwrap();
        let mbox = pki.issue(&LeafSpec::middlebox("mb.test")).unwrap();
        World {
            _dir: dir,
            root_pem: pki.root_pem().into_bytes(),
            server_files,
            mbox_id: Identity::from_pem(mbox.chain_pem(), mbox.key_pem().as_bytes()),
            platform: Arc::new(SimulatedPlatform::generate().unwrap()),
        }
    }

    /// A client whose policy accepts `accepted` as the middlebox's measurement.
    fn client(&self, version: TlsVersion, accepted: [u8; 32]) -> ClientHandshakeConfig {
        self.client_resuming(version, accepted, 0)
    }

    /// [`client`](Self::client) whose primary context resumes sessions for up to `names`
    /// server names (`TlsConfig::resume_sessions`).
    fn client_resuming(
        &self,
        version: TlsVersion,
        accepted: [u8; 32],
        names: usize,
    ) -> ClientHandshakeConfig {
        let mut primary = TlsConfig::client("server.test", self.root_pem.clone()).only(version);
        primary.resume_sessions = names;
        primary.custom_extensions = vec![CustomExtension::new(MIDDLEBOX_SUPPORT_EXTENSION)];
        primary.pause_after_handshake = true;
        let secondary = TlsConfig::client("mb.test", self.root_pem.clone());
        ClientHandshakeConfig {
            primary: Arc::new(OpenSslContext::new(&primary).unwrap()),
            server_name: "server.test".into(),
            secondary: Arc::new(OpenSslContext::new(&secondary).unwrap()),
            middlebox: ClientMiddlebox::Preconfigured("mb.test".into()),
            policy: Policy {
                allow_simulated: true,
                measurements: vec![HexBytes(accepted.to_vec())],
                sim_platform_keys: vec![HexBytes(self.platform.public_key().to_vec())],
                ..Policy::default()
            },
            now_unix: mbx_attest::unix_seconds(std::time::SystemTime::now()),
        }
    }

    /// A client-side middlebox toward `next_hop`, running `app`, listening on loopback.
    async fn start_middlebox(
        &self,
        next_hop: std::net::SocketAddr,
        app: AppFactory,
    ) -> MiddleboxServer {
        MiddleboxServer::bind("127.0.0.1:0", self.middlebox(next_hop, app))
            .await
            .unwrap()
    }

    fn middlebox(&self, next_hop: std::net::SocketAddr, app: AppFactory) -> MiddleboxServerConfig {
        let attester = SimulatedAttester::new(
            self.platform.clone(),
            measure(PROGRAM, b""),
            signer_id("mbx tests"),
        );
        MiddleboxServerConfig {
            handshake: MiddleboxHandshakeConfig::new(
                &TlsConfig::server(self.mbox_id.clone()),
                Some(Arc::new(attester)),
            )
            .unwrap(),
            next_hop: next_hop.to_string().into(),
            app,
            placement: Placement::ClientSide,
            limits: mbx_mbtls::driver::Limits::default(),
            forget_legacy_after: None,
        }
    }
}

fn header_app() -> AppFactory {
    Arc::new(|| {
        Box::new(HttpHeaderInsert::new("X-Mbtls", "mb.test").unwrap())
            as Box<dyn MiddleboxApp + Send>
    })
}

fn passthrough() -> AppFactory {
    Arc::new(|| Box::new(PassThrough) as Box<dyn MiddleboxApp + Send>)
}

fn get(path: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nHost: server.test\r\nConnection: close\r\n\r\n").into_bytes()
}

/// An mbTLS session through `mbox` that must come up.
async fn connect(mbox: &MiddleboxServer, cfg: ClientHandshakeConfig) -> MbtlsClient {
    timeout(BOUND, MbtlsClient::connect(mbox.local_addr(), cfg))
        .await
        .unwrap()
        .unwrap()
}

/// Connects with the request in the key-material flight, reads the response until the
/// server's close_notify, then closes our direction.
async fn fetch(
    first_hop: std::net::SocketAddr,
    cfg: ClientHandshakeConfig,
    path: &str,
) -> (MbtlsClient, String) {
    let mut client = timeout(
        BOUND,
        MbtlsClient::connect_with_data(first_hop, cfg, &get(path)),
    )
    .await
    .unwrap()
    .unwrap();
    let body = timeout(BOUND, client.read_to_end()).await.unwrap().unwrap();
    client.close().await.unwrap();
    (client, String::from_utf8_lossy(&body).into_owned())
}

/// nginx (`version` only, logging the X-Mbtls header) behind a client-side middlebox that
/// inserts that header.
async fn nginx_behind_a_header_middlebox(
    w: &World,
    version: TlsVersion,
) -> (Nginx, MiddleboxServer) {
    let nginx = Nginx::from_files(&w.server_files)
        .protocols(&[tb(version)])
        .log_header("X-Mbtls")
        .start()
        .unwrap();
    let mbox = w.start_middlebox(nginx.addr(), header_app()).await;
    (nginx, mbox)
}

/// nginx serving `version` only, with the test bed's pages.
/// A TLS 1.3 session through a middlebox running `app` in front of nginx, `GET {path}` sent.
async fn request_through(
    app: AppFactory,
    path: &str,
) -> (World, Nginx, MiddleboxServer, MbtlsClient) {
    let (w, version) = (World::new(), TlsVersion::Tls13);
    let nginx = plain_nginx(&w, version);
    let mbox = w.start_middlebox(nginx.addr(), app).await;
    let mut client = connect(&mbox, w.client(version, measure(PROGRAM, b""))).await;
    let request = format!("GET {path} HTTP/1.1\r\nHost: server.test\r\n\r\n");
    client.write_all(request.as_bytes()).await.unwrap();
    (w, nginx, mbox, client)
}

fn plain_nginx(w: &World, version: TlsVersion) -> Nginx {
    Nginx::from_files(&w.server_files)
        .protocols(&[tb(version)])
        .start()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inserted_header_reaches_nginx_both_versions() {
    let w = World::new();
    for version in VERSIONS {
        let (nginx, mut mbox) = nginx_behind_a_header_middlebox(&w, version).await;
        let (client, response) = fetch(
            mbox.local_addr(),
            w.client(version, measure(PROGRAM, b"")),
            "/headers",
        )
        .await;
        assert!(
            matches!(client.verdict(), MiddleboxVerdict::Verified { claims: Some(c), .. } if c.measurement == measure(PROGRAM, b"")),
            "{:?}",
            client.verdict()
        );
        let summary = client.summary().unwrap().clone();
        assert_eq!(summary.version, version);
        assert!(summary.middlebox_joined());
        assert_eq!(summary.hops.len(), 2);
        assert_ne!(summary.hops[0], summary.hops[1]);
        drop(client);
        assert!(
            response.starts_with("HTTP/1.1 200"),
            "{version:?}: {response}"
        );
        assert!(
            response.contains("x-mbtls: mb.test"),
            "{version:?}: {response}"
        );
        let log = nginx.wait_access_log(|l| l.contains("/headers")).unwrap();
        assert!(log.contains("x-mbtls=\"mb.test\""), "{log}");
        let proto = match version {
            TlsVersion::Tls12 => "TLSv1.2",
            TlsVersion::Tls13 => "TLSv1.3",
        };
        assert!(log.contains(proto), "{log}");

        let report = timeout(BOUND, mbox.next_report()).await.unwrap().unwrap();
        assert!(
            report.joined && report.evidence_sent && report.keys_installed,
            "{report:?}"
        );
        assert_eq!(report.version, Some(version));
        // The middlebox's two hops are the client's two hops, seen from the other end.
        assert_eq!(report.client_hop, Some(summary.hops[0]));
        assert_eq!(report.server_hop, Some(summary.hops[1]));
        assert_eq!(report.outcome, Ok(()), "{report:?}");
    }
}

/// A client asks nginx to switch protocols on its first request; nginx (no WebSocket location)
/// answers 200 and stays HTTP/1.1, so the client's next request on the same connection must
/// get the header too. Before the twenty-second round the app made everything after an
/// `Upgrade` opaque, whatever the answer: a client could send requests without the header.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_after_an_upgrade_nginx_refused_still_gets_the_header() {
    let w = World::new();
    let version = TlsVersion::Tls13;
    let (nginx, mbox) = nginx_behind_a_header_middlebox(&w, version).await;
    let upgrade = b"GET /headers HTTP/1.1\r\nHost: server.test\r\n\
        Upgrade: websocket\r\nConnection: Upgrade\r\n\
        Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n";
    let mut client = timeout(
        BOUND,
        MbtlsClient::connect_with_data(
            mbox.local_addr(),
            w.client(version, measure(PROGRAM, b"")),
            upgrade,
        ),
    )
    .await
    .unwrap()
    .unwrap();
    read_until(&mut client, "x-mbtls: mb.test").await;
    client
        .write_all(b"GET /second HTTP/1.1\r\nHost: server.test\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let rest = timeout(BOUND, client.read_to_end()).await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(&rest).contains("mbx nginx ok"));
    let log = nginx.wait_access_log(|l| l.contains("/second")).unwrap();
    let second = log.lines().find(|l| l.contains("/second")).unwrap();
    assert!(second.contains("x-mbtls=\"mb.test\""), "{log}");
}

/// A request the HTTP app refuses (here a CONNECT) ends the session with access_denied, and
/// the middlebox's report says why, for the operator.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_middleboxs_report_says_why_its_app_ended_the_session() {
    let w = World::new();
    let version = TlsVersion::Tls13;
    let (_nginx, mut mbox) = nginx_behind_a_header_middlebox(&w, version).await;
    let mut client = timeout(
        BOUND,
        MbtlsClient::connect_with_data(
            mbox.local_addr(),
            w.client(version, measure(PROGRAM, b"")),
            b"CONNECT example.test:443 HTTP/1.1\r\nHost: example.test:443\r\n\r\n",
        ),
    )
    .await
    .unwrap()
    .unwrap();
    let read = timeout(BOUND, client.read()).await.unwrap();
    assert!(read.is_err(), "{read:?}");
    let report = timeout(BOUND, mbox.next_report()).await.unwrap().unwrap();
    // Its own kind since the thirty-third round (before: "relay", a bad record's too).
    assert_eq!(report.error_kind(), Some(ErrorKind::App), "{report:?}");
    assert_eq!(report.app_ended.as_ref(), report.outcome.as_ref().err());
    let why = report.outcome.unwrap_err();
    assert!(
        why.starts_with("the app ended the session (CONNECT refused")
            && why.contains("alert access_denied(49)"),
        "{why}"
    );
}

/// An app that ends its session in an orderly way (`Verdict::Close(CLOSE_NOTIFY)`): each
/// endpoint reads a close_notify, as from its peer, so the middlebox's report is where it
/// shows — the session ended without an error, and the app ended it (found in an embedder's
/// trial: the report said nothing, and the client took an empty answer for a whole one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_app_that_closes_in_an_orderly_way_is_named_in_the_report() {
    struct Quiet;
    impl MiddleboxApp for Quiet {
        fn on_data(
            &mut self,
            _: mbx_apps::Direction,
            _: &[u8],
            _: &mut Vec<u8>,
        ) -> mbx_apps::Verdict {
            mbx_apps::Verdict::Close(mbx_apps::CloseAlert::CLOSE_NOTIFY)
        }
        fn close_reason(&self) -> Option<String> {
            Some("dropped quietly".into())
        }
    }
    let app: AppFactory = Arc::new(|| Box::new(Quiet) as Box<dyn MiddleboxApp + Send>);
    let (_w, _nginx, mut mbox, mut client) = request_through(app, "/").await;
    let body = timeout(BOUND, client.read_to_end()).await.unwrap();
    assert_eq!(body.ok(), Some(Vec::new()));
    let report = timeout(BOUND, mbox.next_report()).await.unwrap().unwrap();
    assert!(report.outcome.is_ok(), "{report:?}");
    assert_eq!(
        report.app_ended.as_deref(),
        Some("the app ended the session (dropped quietly), close_notify to both sides")
    );
}

/// An app that panics (a bug in an operator's plug-in) ends its session with internal_error
/// toward both sides: the client fails with that alert, not with a peer that vanished, and the
/// middlebox's report says the app panicked and with what, without blaming a stop. The
/// middlebox serves its next connection as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_app_ends_its_session_with_an_alert_and_a_report_that_says_so() {
    struct Fragile;
    impl MiddleboxApp for Fragile {
        fn on_data(
            &mut self,
            _: mbx_apps::Direction,
            data: &[u8],
            out: &mut Vec<u8>,
        ) -> mbx_apps::Verdict {
            assert!(
                !data.windows(5).any(|w| w == b"/boom"),
                "the app met a boom"
            );
            out.extend_from_slice(data);
            mbx_apps::Verdict::Continue
        }
    }
    let app: AppFactory = Arc::new(|| Box::new(Fragile) as Box<dyn MiddleboxApp + Send>);
    let (w, _nginx, mut mbox, mut client) = request_through(app, "/boom").await;
    let version = TlsVersion::Tls13;
    match timeout(BOUND, client.read()).await.expect("client hung") {
        Err(DriverError::Alert { description, .. }) => {
            assert_eq!(description, mbx_apps::APP_PANICKED.0)
        }
        other => panic!("expected internal_error, got {other:?}"),
    }
    let report = timeout(BOUND, mbox.next_report()).await.unwrap().unwrap();
    let why = report.outcome.as_ref().unwrap_err();
    assert!(
        why.contains("the middlebox app panicked: the app met a boom")
            && why.contains("internal_error(80)"),
        "{why}"
    );
    assert!(!report.cut_at_stop, "{report:?}");
    // The next session through the same middlebox is served.
    let (_client, body) = fetch(
        mbox.local_addr(),
        w.client(version, measure(PROGRAM, b"")),
        "/",
    )
    .await;
    assert!(body.contains("mbx nginx ok"), "{body}");
}

/// An app learns which connection it serves before any data (`on_connection`): the id and
/// client address its report gives, and the next hop, so that what it finds can be tied to
/// the report (an embedder's trial: an IDS alert could name nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_app_learns_the_connection_its_report_names() {
    type Seen = Arc<std::sync::Mutex<Vec<(mbx_apps::ConnectionInfo, usize)>>>;
    /// Passes everything on; keeps its connection and how many bytes it saw before learning it.
    struct Recorder {
        seen: Seen,
        bytes: usize,
    }
    impl MiddleboxApp for Recorder {
        fn on_data(
            &mut self,
            dir: mbx_apps::Direction,
            data: &[u8],
            out: &mut Vec<u8>,
        ) -> mbx_apps::Verdict {
            out.extend_from_slice(data);
            self.pass_unchanged(dir, data)
                .unwrap_or(mbx_apps::Verdict::Continue)
        }
        fn pass_unchanged(
            &mut self,
            _: mbx_apps::Direction,
            data: &[u8],
        ) -> Option<mbx_apps::Verdict> {
            self.bytes += data.len();
            Some(mbx_apps::Verdict::Continue)
        }
        fn on_connection(&mut self, connection: &mbx_apps::ConnectionInfo) {
            let mut seen = self.seen.lock().unwrap();
            seen.push((connection.clone(), self.bytes));
        }
    }
    let (w, version) = (World::new(), TlsVersion::Tls13);
    let nginx = plain_nginx(&w, version);
    let seen = Seen::default();
    let recorded = seen.clone();
    let app: AppFactory = Arc::new(move || {
        let seen = recorded.clone();
        Box::new(Recorder { seen, bytes: 0 }) as Box<dyn MiddleboxApp + Send>
    });
    let mut mbox = w.start_middlebox(nginx.addr(), app).await;
    for _ in 0..2 {
        let cfg = w.client(version, measure(PROGRAM, b""));
        let (_client, body) = fetch(mbox.local_addr(), cfg, "/").await;
        assert!(body.contains("mbx nginx ok"), "{body}");
    }
    for _ in 0..2 {
        let report = timeout(BOUND, mbox.next_report()).await.unwrap().unwrap();
        let seen = seen.lock().unwrap();
        let (info, bytes_before) = &seen[report.id as usize];
        assert_eq!(
            (
                info.id,
                info.client,
                info.next_hop.as_deref(),
                *bytes_before
            ),
            (
                report.id,
                report.client,
                Some(nginx.addr().to_string().as_str()),
                0
            ),
            "{report:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openssl_s_server_www_through_the_middlebox_both_versions() {
    let w = World::new();
    for version in VERSIONS {
        let server = OpensslServer::from_files(&w.server_files)
            .version(tb(version))
            .start()
            .unwrap();
        let response = through_the_header_middlebox(&w, server.addr(), version, "/").await;
        assert!(
            response.starts_with("HTTP/1.0 200 ok"),
            "{version:?}: {response}"
        );
        // s_server -www reports the protocol it negotiated with the (bridging) middlebox.
        let proto = match version {
            TlsVersion::Tls12 => "New, TLSv1.2, Cipher is",
            TlsVersion::Tls13 => "New, TLSv1.3, Cipher is",
        };
        assert!(response.contains(proto), "{version:?}: {response}");
    }
}

/// A legacy server on a TLS stack other than OpenSSL: GnuTLS's `gnutls-serv` behind the
/// header-inserting client-side middlebox, TLS 1.2 and 1.3. The page it answers with names
/// the protocol it negotiated (with the bridging middlebox's keys) and echoes the request's
/// header, the middlebox's included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gnutls_serv_through_the_middlebox_both_versions() {
    let w = World::new();
    for version in VERSIONS {
        let server = mbx_testbed::GnutlsServer::start(&w.server_files, Some(tb(version))).unwrap();
        let response = through_the_header_middlebox(&w, server.addr(), version, "/gnutls").await;
        assert!(
            response.starts_with("HTTP/1.0 200 OK"),
            "{version:?}: {response}"
        );
        let proto = match version {
            TlsVersion::Tls12 => "TLS1.2",
            TlsVersion::Tls13 => "TLS1.3",
        };
        assert!(response.contains(proto), "{version:?}: {response}");
        assert!(
            response.contains("X-Mbtls: mb.test"),
            "{version:?}: {response}"
        );
    }
}

/// A legacy server on rustls (in process), behind the header-inserting client-side middlebox,
/// TLS 1.2 and 1.3: the request reaches it with the middlebox's header, its answer comes back,
/// and its close_notify ends the session cleanly. rustls sends its TLS 1.3 tickets right
/// after its handshake, which the middlebox passes on as post-handshake records.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rustls_server_through_the_middlebox_both_versions() {
    let w = World::new();
    for version in VERSIONS {
        let server =
            mbx_testbed::rustls_peer::rustls_echo_server(&w.server_files, Some(tb(version)))
                .await
                .unwrap();
        let response = through_the_header_middlebox(&w, server, version, "/rustls").await;
        assert!(
            response.starts_with("HTTP/1.1 200 OK") && response.contains("GET /rustls HTTP/1.1"),
            "{version:?}: {response}"
        );
        assert!(
            response.contains("X-Mbtls: mb.test"),
            "{version:?}: {response}"
        );
    }
}

/// A legacy TLS 1.2 server that takes only a CBC suite (`openssl s_server -cipher
/// ECDHE-ECDSA-AES128-SHA256`), behind a client-side middlebox, fails the client's handshake
/// with its `handshake_failure`: the primary session (`primary_client_config`) offers only
/// suites the record layer carries. With OpenSSL's defaults the session settled on the CBC
/// suite and failed after the handshake, when the middlebox was to get keys no record layer of
/// ours takes (found in a GnuTLS trial).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_legacy_server_with_only_cbc_suites_fails_the_handshake_itself() {
    let w = World::new();
    let server = OpensslServer::from_files(&w.server_files)
        .version(tb(TlsVersion::Tls12))
        .arg("-cipher")
        .arg("ECDHE-ECDSA-AES128-SHA256")
        .start()
        .unwrap();
    let mbox = w.start_middlebox(server.addr(), passthrough()).await;
    let mut cfg = w.client(TlsVersion::Tls12, measure(PROGRAM, b""));
    let mut primary =
        mbx_mbtls::handshake::primary_client_config("server.test", w.root_pem.clone())
            .only(TlsVersion::Tls12);
    primary.pause_after_handshake = true;
    cfg.primary = Arc::new(OpenSslContext::new(&primary).unwrap());
    let err = timeout(BOUND, MbtlsClient::connect(mbox.local_addr(), cfg))
        .await
        .unwrap()
        .expect_err("a session on a CBC suite");
    let said = err.to_string();
    assert!(
        said.contains("handshake_failure") && !said.contains("record layer"),
        "{said}"
    );
    assert!(
        server.log().contains("no shared cipher"),
        "{}",
        server.log()
    );
}

/// `GET path` from an mbTLS client of `version` through the header-inserting client-side
/// middlebox in front of the legacy server at `server`: the response, once the client's
/// session is checked to have `version`.
async fn through_the_header_middlebox(
    w: &World,
    server: std::net::SocketAddr,
    version: TlsVersion,
    path: &str,
) -> String {
    let mbox = w.start_middlebox(server, header_app()).await;
    let (client, response) = fetch(
        mbox.local_addr(),
        w.client(version, measure(PROGRAM, b"")),
        path,
    )
    .await;
    assert_eq!(client.summary().unwrap().version, version);
    response
}

/// Reads (bounded) from `client` until what arrived contains `text`; the peer must not close
/// before.
async fn read_until(client: &mut MbtlsClient, text: &str) {
    let mut got = Vec::new();
    while !String::from_utf8_lossy(&got).contains(text) {
        let piece = timeout(BOUND, client.read()).await.unwrap().unwrap();
        got.extend(piece.expect("the peer closed early"));
    }
}

/// Waits (bounded) until `server` printed `text` `times` times.
async fn wait_for_output(server: &OpensslServer, text: &str, times: usize) {
    printed(|| server.log(), text, times, BOUND).await.unwrap();
}

/// An interactive TLS 1.3 `s_server` (it sends the lines and KeyUpdates it is given) behind a
/// pass-through client-side middlebox.
async fn interactive_server_behind_a_middlebox(w: &World) -> (OpensslServer, MiddleboxServer) {
    let server = OpensslServer::from_files(&w.server_files)
        .version(tb(TlsVersion::Tls13))
        .mode(ServerMode::Interactive)
        .start()
        .unwrap();
    let mbox = w.start_middlebox(server.addr(), passthrough()).await;
    (server, mbox)
}

/// A legacy server's KeyUpdates (`openssl s_server`'s `k` and `K` commands, TLS 1.3) are
/// followed across the middlebox: the server's data after each arrives, and when asked (`K`)
/// the client updates its keys too, so what it sends next still reaches the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_legacy_servers_key_updates_are_followed_across_the_middlebox() {
    let w = World::new();
    let (mut server, mut mbox) = interactive_server_behind_a_middlebox(&w).await;
    let mut client = connect(&mbox, w.client(TlsVersion::Tls13, measure(PROGRAM, b""))).await;
    client.write_all(b"hello\n").await.unwrap();
    wait_for_output(&server, "hello", 1).await;
    for (n, command) in ["k", "K", "K"].into_iter().enumerate() {
        server.send_line(command).unwrap();
        // The command read on its own (s_server reads stdin in chunks), then the data.
        wait_for_output(&server, "SSL_do_handshake -> 1", n + 1).await;
        let line = format!("server data after {command}");
        server.send_line(&line).unwrap();
        read_until(&mut client, &line).await;
        let answer = format!("client data after {command}");
        let answer_line = format!("{answer}\n");
        client.write_all(answer_line.as_bytes()).await.unwrap();
        wait_for_output(&server, &answer, 1).await;
    }
    assert_eq!(client.peer_key_updates(), 3);
    drop(client);
    let report = timeout(BOUND, mbox.next_report()).await.unwrap().unwrap();
    // The server's three, and the client's answers to the two that asked.
    assert_eq!(report.key_updates, 5, "{report:?}");
    assert_eq!(mbox.stats().ended().key_updates, 5);
}

/// A TLS 1.2 legacy server that renegotiates (`openssl s_server`'s `r` command: a
/// HelloRequest after the handshake) ends the session at the middlebox, which says why in
/// words, and the client reads the middlebox's `unexpected_message`; the data the server sent
/// before still arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_legacy_server_that_renegotiates_is_refused_in_words() {
    let w = World::new();
    let mut server = OpensslServer::from_files(&w.server_files)
        .version(tb(TlsVersion::Tls12))
        .mode(ServerMode::Interactive)
        .start()
        .unwrap();
    let mut mbox = w.start_middlebox(server.addr(), passthrough()).await;
    let mut client = connect(&mbox, w.client(TlsVersion::Tls12, measure(PROGRAM, b""))).await;
    client.write_all(b"hello\n").await.unwrap();
    wait_for_output(&server, "hello", 1).await;
    server.send_line("server data").unwrap();
    read_until(&mut client, "server data").await;
    server.send_line("r").unwrap();
    let read = timeout(BOUND, client.read()).await.unwrap();
    assert!(
        matches!(
            read,
            Err(DriverError::Alert {
                description: 10,
                ..
            })
        ),
        "{read:?}"
    );
    let report = timeout(BOUND, mbox.next_report()).await.unwrap().unwrap();
    let why = report.outcome.unwrap_err();
    assert!(
        why.contains("the server's side broke the protocol (a handshake message after the handshake: TLS 1.2 renegotiation, which mbTLS does not support"),
        "{why}"
    );
}

/// The same through the client proxy: the legacy server's KeyUpdate asking for one back is
/// followed and answered by the proxy's session, and counted in its report and its metrics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_proxy_follows_and_counts_a_legacy_servers_key_update() {
    use mbx_mbtls::driver::{ClientProxy, ClientProxyConfig, Limits};
    let w = World::new();
    let (mut server, mbox) = interactive_server_behind_a_middlebox(&w).await;
    let handshake = w.client(TlsVersion::Tls13, measure(PROGRAM, b""));
    let mut config = ClientProxyConfig::new(handshake, mbox.local_addr().to_string());
    // Ends the session after the test, whether or not s_server answers its close_notify.
    config.limits = Limits {
        idle_timeout: Some(Duration::from_secs(2)),
        ..Limits::default()
    };
    let mut proxy = ClientProxy::bind("127.0.0.1:0", config).await.unwrap();
    let mut local = TcpStream::connect(proxy.local_addr()).await.unwrap();
    local.write_all(b"hello\n").await.unwrap();
    wait_for_output(&server, "hello", 1).await;
    server.send_line("K").unwrap();
    wait_for_output(&server, "SSL_do_handshake -> 1", 1).await;
    server.send_line("server data after K").unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 256];
    while !String::from_utf8_lossy(&got).contains("server data after K") {
        let n = timeout(BOUND, local.read(&mut buf)).await.unwrap().unwrap();
        assert!(n > 0, "the proxy closed early");
        got.extend_from_slice(&buf[..n]);
    }
    // The proxy's answering KeyUpdate went first: what follows still reaches the server.
    local.write_all(b"client data after K\n").await.unwrap();
    wait_for_output(&server, "client data after K", 1).await;
    drop(local);
    let report = timeout(BOUND, proxy.next_report()).await.unwrap().unwrap();
    assert_eq!(report.key_updates, 1, "{report:?}");
    assert_eq!(proxy.stats().ended().key_updates, 1);
}

/// The client's own KeyUpdate (`MbtlsClient::update_keys`), asking for the server's: what the
/// client sends next reaches the legacy server, and the server's answer is followed and
/// counted. `server` has already printed `hello` from this client.
async fn update_keys_and_exchange(server: &mut OpensslServer, client: &mut MbtlsClient) {
    client.update_keys(true).await.unwrap();
    client
        .write_all(b"client data after update\n")
        .await
        .unwrap();
    wait_for_output(server, "client data after update", 1).await;
    server.send_line("server data after update").unwrap();
    read_until(client, "server data after update").await;
    // s_server answers a KeyUpdate that asks for one before its data.
    assert_eq!(client.peer_key_updates(), 1);
}

/// A client updates its keys when its application asks: through a middlebox (our record
/// layer; the middlebox follows both KeyUpdates) and on a session OpenSSL kept (no middlebox).
/// TLS 1.2 has no KeyUpdate: the call fails and the session carries on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_updates_its_keys_when_asked_with_and_without_a_middlebox() {
    let w = World::new();
    let accepted = measure(PROGRAM, b"");
    // Through the middlebox.
    let (mut server, mut mbox) = interactive_server_behind_a_middlebox(&w).await;
    let mut client = connect(&mbox, w.client(TlsVersion::Tls13, accepted)).await;
    client.write_all(b"hello\n").await.unwrap();
    wait_for_output(&server, "hello", 1).await;
    update_keys_and_exchange(&mut server, &mut client).await;
    drop(client);
    let report = timeout(BOUND, mbox.next_report()).await.unwrap().unwrap();
    // The client's, and the server's answer.
    assert_eq!(report.key_updates, 2, "{report:?}");

    // Directly to the server, each version, the session kept by OpenSSL.
    for version in [TlsVersion::Tls13, TlsVersion::Tls12] {
        let mut server = OpensslServer::from_files(&w.server_files)
            .version(tb(version))
            .mode(ServerMode::Interactive)
            .start()
            .unwrap();
        // Discovering, and no middlebox answered: the session stays in OpenSSL.
        let mut cfg = w.client(version, accepted);
        cfg.middlebox = ClientMiddlebox::Discover(Arc::new(|_: &[Vec<u8>]| true));
        let mut client = timeout(BOUND, MbtlsClient::connect(server.addr(), cfg))
            .await
            .unwrap()
            .unwrap();
        let summary = client.summary().unwrap();
        assert_eq!(summary.version, version);
        assert!(summary.hops.is_empty(), "not kept by OpenSSL: {summary:?}");
        client.write_all(b"hello\n").await.unwrap();
        wait_for_output(&server, "hello", 1).await;
        match version {
            TlsVersion::Tls13 => update_keys_and_exchange(&mut server, &mut client).await,
            TlsVersion::Tls12 => {
                assert!(client.update_keys(false).await.is_err());
                client.write_all(b"still carried\n").await.unwrap();
                wait_for_output(&server, "still carried", 1).await;
            }
        }
    }
}

/// An mbTLS client resumes its session with a legacy server (nginx, tickets), both versions:
/// directly, where OpenSSL keeps the session, then through a client-side middlebox, which
/// joins every resumed session (TLS 1.2: the server's Finished comes first) and inserts its
/// header. Six sessions in a row through the middlebox all resume: more than the four TLS 1.3
/// tickets a name keeps, so with TLS 1.3 the tickets that came through the middlebox after
/// each export must have been kept. Secondary sessions are never resumed: the middlebox is
/// checked every time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mbtls_client_resumes_with_nginx_directly_and_through_a_middlebox() {
    let w = World::new();
    let accepted = measure(PROGRAM, b"");
    for version in VERSIONS {
        let (nginx, mut mbox) = nginx_behind_a_header_middlebox(&w, version).await;
        let mut direct = w.client_resuming(version, accepted, 8);
        direct.middlebox = ClientMiddlebox::Discover(Arc::new(|_: &[Vec<u8>]| true));
        let mut resumed = Vec::new();
        for _ in 0..2 {
            let (client, response) = fetch(nginx.addr(), direct.clone(), "/headers").await;
            assert!(response.starts_with("HTTP/1.1 200"), "{response}");
            let summary = client.summary().unwrap();
            assert!(summary.hops.is_empty(), "kept by OpenSSL: {summary:?}");
            resumed.push(summary.resumed);
        }
        assert_eq!(resumed, [false, true], "{version:?}");

        let mut through = direct.clone();
        through.middlebox = ClientMiddlebox::Preconfigured("mb.test".into());
        for session in 0..6 {
            let (client, response) = fetch(mbox.local_addr(), through.clone(), "/headers").await;
            let summary = client.summary().unwrap().clone();
            assert!(
                summary.resumed && summary.middlebox_joined() && summary.version == version,
                "{version:?}, session {session} through the middlebox: {summary:?}"
            );
            assert!(
                matches!(
                    client.verdict(),
                    MiddleboxVerdict::Verified {
                        claims: Some(_),
                        ..
                    }
                ),
                "{:?}",
                client.verdict()
            );
            assert!(
                response.contains("x-mbtls: mb.test"),
                "{version:?}: {response}"
            );
            drop(client);
            let report = timeout(BOUND, mbox.next_report()).await.unwrap().unwrap();
            assert!(report.outcome.is_ok(), "{report:?}");
        }
    }
}

/// Application-data records (type 23) in one direction of a captured hop.
fn app_records(stream: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut rest = stream;
    while rest.len() >= 5 {
        let len = 5 + usize::from(u16::from_be_bytes([rest[3], rest[4]]));
        if rest[0] == 23 {
            out.push(rest[..len].to_vec());
        }
        rest = &rest[len..];
    }
    assert!(rest.is_empty(), "partial record in capture");
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p1c_same_request_crosses_the_two_hops_as_different_ciphertexts() {
    let w = World::new();
    for version in VERSIONS {
        let server = Nginx::from_files(&w.server_files)
            .protocols(&[tb(version)])
            .start()
            .unwrap();
        let (tap1, tap2) = (Tap::new(), Tap::new());
        let hop2 = DelayRelay::builder(server.addr())
            .tap(tap2.clone())
            .start()
            .await
            .unwrap();
        let mbox = w.start_middlebox(hop2.local_addr(), passthrough()).await;
        let hop1 = DelayRelay::builder(mbox.local_addr())
            .tap(tap1.clone())
            .start()
            .await
            .unwrap();
        let marker = "p1c-marker-".repeat(100);
        let (client, response) = fetch(
            hop1.local_addr(),
            w.client(version, measure(PROGRAM, b"")),
            &format!("/{marker}"),
        )
        .await;
        assert!(response.contains("mbx nginx ok"), "{response}");
        let log = server.wait_access_log(|l| l.contains(&marker)).unwrap();
        assert!(log.contains(&marker), "the server saw the request");
        drop(client);
        drop(mbox);
        drop((hop1, hop2));

        let c1 = tap1.bytes(0, Direction::ClientToServer);
        let c2 = tap2.bytes(0, Direction::ClientToServer);
        for capture in [&c1, &c2] {
            assert!(
                !capture
                    .windows(marker.len())
                    .any(|x| x == marker.as_bytes()),
                "plaintext visible on a hop"
            );
        }
        // The request is the largest client record; with the pass-through app it has the same
        // plaintext (hence the same length) on both hops, under different keys.
        let largest = |c: &[u8]| app_records(c).into_iter().max_by_key(Vec::len).unwrap();
        let (r1, r2) = (largest(&c1), largest(&c2));
        assert!(r1.len() > marker.len(), "{version:?}");
        assert_eq!(r1.len(), r2.len(), "{version:?}: same plaintext");
        assert_ne!(r1[5..], r2[5..], "{version:?}: same ciphertext on two hops");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_middlebox_makes_the_client_fail_with_an_error() {
    let w = World::new();
    for version in VERSIONS {
        let nginx = Nginx::from_files(&w.server_files)
            .protocols(&[tb(version)])
            .start()
            .unwrap();
        let mbox = w.start_middlebox(nginx.addr(), passthrough()).await;
        let mut client = connect(&mbox, w.client(version, measure(PROGRAM, b""))).await;
        // Mid-session: one request answered (keep-alive), then the middlebox dies.
        client
            .write_all(b"GET / HTTP/1.1\r\nHost: server.test\r\n\r\n")
            .await
            .unwrap();
        read_until(&mut client, "mbx nginx ok").await;
        mbox.shutdown().await;
        // Writing may still succeed (the kernel buffers it); reading must fail, not hang.
        let _ = client
            .write_all(b"GET / HTTP/1.1\r\nHost: server.test\r\n\r\n")
            .await;
        let r = timeout(BOUND, client.read()).await.expect("client hung");
        match r {
            Err(DriverError::PeerGone { .. } | DriverError::Io { .. }) => {}
            other => panic!("{version:?}: expected an error, got {other:?}"),
        }
    }
}

/// A client that has a middlebox join and finishes the primary handshake, but never sends the
/// rest of its secondary session (so no key material), while its server streams: the
/// middlebox keeps at most `PAUSE_READING_AT` of what the server sends (and one read more),
/// then stops reading it, and TCP holds the server back until the middlebox's handshake
/// timeout ends the connection. Before the thirty-third round it read on up to its 16 MiB
/// bound, per connection (an adversarial trial: 3 GB with 200 such clients); the test fails so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_middlebox_stops_reading_what_it_keeps_for_keys_that_do_not_come() {
    let (w, version) = (World::new(), TlsVersion::Tls13);
    let ctx = w.legacy_server_context(version);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server_addr = listener.local_addr().unwrap();
    // Its handshake, then up to 64 MiB, until the connection goes.
    let server = tokio::spawn(async move {
        let (mut sock, _) = listener.accept().await.unwrap();
        let mut engine = ctx.engine().unwrap();
        let mut buf = vec![0u8; 16384];
        while engine.is_handshaking() {
            let n = sock.read(&mut buf).await.unwrap_or(0);
            if n == 0 {
                return;
            }
            engine.feed(&buf[..n]);
            engine.process().unwrap();
            sock.write_all(&engine.take_outgoing()).await.unwrap();
        }
        for _ in 0..4096 {
            engine.write_plaintext(&[b'x'; 16384]).unwrap();
            if sock.write_all(&engine.take_outgoing()).await.is_err() {
                return;
            }
        }
    });
    let mut cfg = w.middlebox(server_addr, passthrough());
    cfg.limits.handshake_timeout = Duration::from_secs(2);
    let mut mbox = MiddleboxServer::bind("127.0.0.1:0", cfg).await.unwrap();
    let mut client = ClientHandshake::new(w.client(version, measure(PROGRAM, b""))).unwrap();
    let mut sock = TcpStream::connect(mbox.local_addr()).await.unwrap();
    sock.write_all(&client.take_outgoing()).await.unwrap();
    // Only its primary records go out from then on: its Finished, nothing on its subchannel.
    let primary_only = |stream: Vec<u8>| -> Vec<u8> {
        let mut rest = stream.as_slice();
        let mut out = Vec::new();
        while rest.len() >= 5 {
            let len = 5 + usize::from(u16::from_be_bytes([rest[3], rest[4]]));
            let (rec, tail) = rest.split_at(len.min(rest.len()));
            if rec[0] != 30 {
                out.extend_from_slice(rec);
            }
            rest = tail;
        }
        out
    };
    let mut buf = vec![0u8; 65536];
    loop {
        let n = timeout(BOUND, sock.read(&mut buf)).await.unwrap().unwrap();
        assert!(n > 0, "the middlebox closed during the handshake");
        client.receive(&buf[..n]).unwrap();
        let finished = primary_only(client.take_outgoing());
        if !finished.is_empty() {
            sock.write_all(&finished).await.unwrap();
            break;
        }
    }
    // Nothing more from the client: the middlebox waits for keys until its timeout.
    let report = timeout(BOUND, mbox.next_report()).await.unwrap().unwrap();
    assert!(report.joined && !report.keys_installed, "{report:?}");
    assert_eq!(
        report.error_kind(),
        Some(ErrorKind::HandshakeTimeout),
        "{report:?}"
    );
    let why = report.outcome.clone().unwrap_err();
    // Its subchannel stayed silent: not even its secondary Finished came.
    assert!(
        why.ends_with("; it was waiting for the client to finish our secondary handshake"),
        "{why}"
    );
    let read = report.bytes_from_server as usize;
    assert!((PAUSE_READING_AT..1 << 20).contains(&read), "{read}");
    timeout(BOUND, server).await.unwrap().unwrap();
}

/// A legacy TLS server in process (OpenSSL engine over a socket) that records every byte of
/// application data it receives, for one connection; with `echo`, it also sends each back and
/// answers the client's close_notify with its own. Returns whether its handshake completed,
/// and what it received.
async fn in_process_server(
    listener: TcpListener,
    ctx: OpenSslContext,
    echo: bool,
) -> (bool, Vec<u8>) {
    let (sock, _) = listener.accept().await.unwrap();
    serve_socket(sock, &ctx, echo).await
}

/// [`in_process_server`] on one accepted connection.
async fn serve_socket(mut sock: TcpStream, ctx: &OpenSslContext, echo: bool) -> (bool, Vec<u8>) {
    let mut engine = ctx.engine().unwrap();
    let mut plaintext = Vec::new();
    let mut buf = vec![0u8; 65536];
    loop {
        let n = sock.read(&mut buf).await.unwrap_or(0);
        if n == 0 {
            break;
        }
        engine.feed(&buf[..n]);
        let failed = engine.process().is_err();
        let data = engine.take_plaintext();
        if echo && !failed {
            if !data.is_empty() {
                engine.write_plaintext(&data).unwrap();
            }
            if engine.peer_closed() {
                let _ = engine.close();
            }
        }
        plaintext.extend(data);
        let out = engine.take_outgoing();
        if !out.is_empty() && sock.write_all(&out).await.is_err() || failed {
            break;
        }
    }
    (!engine.is_handshaking(), plaintext)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn middlebox_failing_policy_gets_no_keys_and_server_gets_no_data() {
    let w = World::new();
    for version in VERSIONS {
        let ctx = w.legacy_server_context(version);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let server_addr = listener.local_addr().unwrap();
        let server = tokio::spawn(in_process_server(listener, ctx, false));
        let mut mbox = w.start_middlebox(server_addr, passthrough()).await;
        // The client accepts another measurement than the one the middlebox runs.
        let cfg = w.client(version, measure("some-other-program", b""));
        let r = timeout(BOUND, MbtlsClient::connect(mbox.local_addr(), cfg))
            .await
            .unwrap();
        match r {
            Err(DriverError::Handshake(e))
                if matches!(e.cause(), HandshakeError::Attestation(_)) => {}
            other => panic!("{version:?}: expected an attestation error, got {other:?}"),
        }
        let report = timeout(BOUND, mbox.next_report()).await.unwrap().unwrap();
        assert!(report.evidence_sent, "{report:?}");
        assert!(!report.keys_installed, "{report:?}");
        assert!(report.outcome.is_err(), "{report:?}");
        let (handshake_done, data) = timeout(BOUND, server).await.unwrap().unwrap();
        // The evidence arrives with the middlebox's first flight (before the primary
        // ServerHello), so the client refuses it before it sends its primary Finished: the
        // server never completes the handshake and no application byte reaches it.
        assert!(!handshake_done, "{version:?}");
        assert!(data.is_empty(), "{version:?}: server received {data:?}");
    }
}

/// A plain TLS client (no MiddleboxSupport): handshake, one request, read until the server
/// closes. Returns the response.
async fn plain_fetch(addr: std::net::SocketAddr, root: &[u8], version: TlsVersion) -> Vec<u8> {
    let ctx = OpenSslContext::new(&TlsConfig::client("server.test", root.to_vec()).only(version))
        .unwrap();
    let mut engine = ctx.engine().unwrap();
    let mut sock = TcpStream::connect(addr).await.unwrap();
    sock.set_nodelay(true).unwrap();
    engine.process().unwrap();
    let mut sent = false;
    let mut got = Vec::new();
    let mut buf = vec![0u8; 16384];
    loop {
        if !engine.is_handshaking() && !sent {
            engine
                .write_plaintext(
                    b"GET / HTTP/1.1\r\nHost: server.test\r\nConnection: close\r\n\r\n",
                )
                .unwrap();
            sent = true;
        }
        let out = engine.take_outgoing();
        if !out.is_empty() {
            sock.write_all(&out).await.unwrap();
        }
        if engine.peer_closed() {
            // As the mbTLS client does: answer the server's close_notify with ours.
            engine.close().unwrap();
            sock.write_all(&engine.take_outgoing()).await.unwrap();
            return got;
        }
        let n = sock.read(&mut buf).await.unwrap();
        if n == 0 {
            return got;
        }
        engine.feed(&buf[..n]);
        engine.process().unwrap();
        got.extend(engine.take_plaintext());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p7_round_trips_mbtls_vs_plain_tls_through_the_same_path() {
    let w = World::new();
    for version in VERSIONS {
        let server = OpensslServer::from_files(&w.server_files)
            .version(tb(version))
            .start()
            .unwrap();
        let mbox = w.start_middlebox(server.addr(), passthrough()).await;
        let flights = FlightCounter::new();
        let hop1 = DelayRelay::builder(mbox.local_addr())
            .flights(flights.clone())
            .start()
            .await
            .unwrap();
        // Connection 0: mbTLS, the middlebox joins.
        let (client, mbtls) = fetch(
            hop1.local_addr(),
            w.client(version, measure(PROGRAM, b"")),
            "/",
        )
        .await;
        assert!(client.summary().unwrap().middlebox_joined());
        drop(client);
        // Connection 1: plain TLS through the same relay and middlebox (which stays passive).
        let plain = timeout(BOUND, plain_fetch(hop1.local_addr(), &w.root_pem, version))
            .await
            .unwrap();
        assert!(mbtls.starts_with("HTTP/1.0 200 ok"));
        assert!(String::from_utf8_lossy(&plain).starts_with("HTTP/1.0 200 ok"));
        let (m, p) = (flights.round_trips(0), flights.round_trips(1));
        println!(
            "{version:?}: mbTLS {m} round trips {:?}; plain TLS {p} round trips {:?}",
            flights.sequence(0),
            flights.sequence(1)
        );
        // P7 in both versions: TLS 1.2 evidence follows the middlebox's Finished; TLS 1.3
        // evidence is 0.5-RTT data in the middlebox's first flight (docs/mbtls.md §4.1 step 4),
        // so the client sends key material and its request in its second flight, as plain TLS.
        assert_eq!(m, p, "{version:?}: round trips mbTLS vs plain TLS");
    }
}

/// What the in-process server does once the client's request arrived.
#[derive(Clone, Copy, Debug)]
enum Misbehave {
    /// Sends a record that cannot authenticate (forged on the bridge hop).
    Forge,
    /// Closes the TCP connection without close_notify.
    Vanish,
}

/// A legacy server's handshake on `sock` and the client's first request (up to its blank line).
async fn handshake_and_request(sock: &mut TcpStream, engine: &mut OpenSslEngine, buf: &mut [u8]) {
    let mut got = Vec::new();
    while !got.ends_with(b"\r\n\r\n") {
        let n = sock.read(buf).await.unwrap();
        assert!(n > 0, "connection closed before the request");
        engine.feed(&buf[..n]);
        engine.process().unwrap();
        got.extend(engine.take_plaintext());
        sock.write_all(&engine.take_outgoing()).await.unwrap();
    }
}

/// An in-process legacy server for `version`, run by `serve` on its listener, behind a
/// pass-through middlebox, and an mbTLS client through them that sent `GET /`.
async fn client_through_a_middlebox_to<T: Send + 'static>(
    w: &World,
    version: TlsVersion,
    serve: impl FnOnce(TcpListener, OpenSslContext) -> tokio::task::JoinHandle<T>,
) -> (tokio::task::JoinHandle<T>, MiddleboxServer, MbtlsClient) {
    let ctx = w.legacy_server_context(version);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server_addr = listener.local_addr().unwrap();
    let server = serve(listener, ctx);
    let mbox = w.start_middlebox(server_addr, passthrough()).await;
    let client = timeout(
        BOUND,
        MbtlsClient::connect_with_data(
            mbox.local_addr(),
            w.client(version, measure(PROGRAM, b"")),
            &get("/"),
        ),
    )
    .await
    .unwrap()
    .unwrap();
    (server, mbox, client)
}

/// A legacy server that misbehaves after the first request; returns once its connection is
/// closed by the other side (Forge) or right after closing it (Vanish).
async fn misbehaving_server(listener: TcpListener, ctx: OpenSslContext, how: Misbehave) {
    let (mut sock, _) = listener.accept().await.unwrap();
    let mut engine = ctx.engine().unwrap();
    let mut buf = vec![0u8; 16384];
    handshake_and_request(&mut sock, &mut engine, &mut buf).await;
    match how {
        Misbehave::Vanish => drop(sock),
        Misbehave::Forge => {
            let mut forged = vec![23, 3, 3, 0, 40];
            forged.extend([0u8; 40]);
            sock.write_all(&forged).await.unwrap();
            // The middlebox must close this connection (after its alert): read until EOF.
            while sock.read(&mut buf).await.unwrap_or(0) > 0 {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_side_failures_close_both_connections_and_fail_the_client() {
    let w = World::new();
    for version in VERSIONS {
        for how in [Misbehave::Forge, Misbehave::Vanish] {
            let (server, mut mbox, mut client) =
                client_through_a_middlebox_to(&w, version, |listener, ctx| {
                    tokio::spawn(misbehaving_server(listener, ctx, how))
                })
                .await;
            let r = timeout(BOUND, client.read()).await.expect("client hung");
            match (how, r) {
                // bad_record_mac from the middlebox, sealed under the client's hop keys.
                (
                    Misbehave::Forge,
                    Err(DriverError::Alert {
                        description: 20, ..
                    }),
                ) => {}
                (Misbehave::Vanish, Err(DriverError::PeerGone { .. })) => {}
                (how, other) => panic!("{version:?} {how:?}: got {other:?}"),
            }
            // The server's connection was closed by the middlebox (Forge waits for that).
            timeout(BOUND, server).await.unwrap().unwrap();
            let report = timeout(BOUND, mbox.next_report()).await.unwrap().unwrap();
            assert!(report.keys_installed, "{report:?}");
            let err = report.outcome.unwrap_err();
            match how {
                Misbehave::Forge => assert!(err.contains("bad record"), "{err}"),
                Misbehave::Vanish => assert!(
                    err.contains("the next hop (toward the server) closed"),
                    "{err}"
                ),
            }
        }
    }
}

/// A next hop that closes as soon as the client's hello reaches it (as a server does on a
/// client's alert, which TLS 1.3 encrypts): the middlebox's report says that the close came
/// right after a record from the client's side, which it may have been answering, instead of
/// blaming the next hop alone (found in an adversarial trial: a client that refused the
/// server's certificate left the middlebox blaming either side, by chance).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_close_right_after_the_other_sides_record_is_said_to_follow_it() {
    let w = World::new();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let next_hop = listener.local_addr().unwrap();
    let closing = tokio::spawn(async move {
        let (mut sock, _) = listener.accept().await.unwrap();
        let mut buf = [0u8; 16384];
        let n = sock.read(&mut buf).await.unwrap();
        assert!(n > 0);
    });
    let mut mbox = w.start_middlebox(next_hop, passthrough()).await;
    let cfg = w.client(TlsVersion::Tls13, measure(PROGRAM, b""));
    let r = timeout(BOUND, MbtlsClient::connect(mbox.local_addr(), cfg)).await;
    assert!(matches!(r, Ok(Err(_))), "{:?}", r.map(|c| c.is_ok()));
    timeout(BOUND, closing).await.unwrap().unwrap();
    let report = timeout(BOUND, mbox.next_report()).await.unwrap().unwrap();
    let err = report.outcome.unwrap_err();
    assert!(
        err.contains("the next hop (toward the server) closed")
            && err.contains("right after a record from the client's side"),
        "{err}"
    );
    // Having sent nothing, it may also be a hop refusing this middlebox's address.
    assert!(
        err.contains("having sent nothing at all")
            && err.contains("or refusing connections from this middlebox's address"),
        "{err}"
    );
}

/// A legacy server in the middle of a download that sends a forged record and goes on
/// streaming (its socket's kernel keeps taking what the middlebox sends): the middlebox's
/// `bad_record_mac` must reach it, not a reset that overtakes the alert (asked by an
/// adversarial trial, where the far side of a tampered hop read a close, never the alert:
/// the trial's tampering relay dropped it; a neighbour gets it). Returns what the server's
/// engine made of what came back after the forged record.
async fn forging_streamer(listener: TcpListener, ctx: OpenSslContext) -> Option<String> {
    let (mut sock, _) = listener.accept().await.unwrap();
    let mut engine = ctx.engine().unwrap();
    let mut buf = vec![0u8; 16384];
    handshake_and_request(&mut sock, &mut engine, &mut buf).await;
    // Some good data, then the forgery, then more data as fast as it is taken.
    engine.write_plaintext(&[b'a'; 100_000]).unwrap();
    let mut out = engine.take_outgoing();
    out.extend([23, 3, 3, 0, 40]);
    out.extend([0u8; 40]);
    let (mut r, mut w) = sock.into_split();
    let streaming = tokio::spawn(async move {
        let _ = w.write_all(&out).await;
        let chunk = vec![23u8, 3, 3, 0x3f, 0xff]
            .into_iter()
            .chain(std::iter::repeat_n(0u8, 0x3fff))
            .collect::<Vec<u8>>();
        // Garbage after the forgery: never read by a middlebox that failed on it.
        while w.write_all(&chunk).await.is_ok() {}
    });
    let mut what = None;
    loop {
        match r.read(&mut buf).await {
            Ok(0) => break,
            Ok(n) => {
                engine.feed(&buf[..n]);
                if let Err(e) = engine.process() {
                    what = Some(e.to_string());
                    break;
                }
            }
            Err(e) => {
                what.get_or_insert(format!("read error: {e}"));
                break;
            }
        }
    }
    streaming.abort();
    what
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streaming_peer_gets_the_alert_of_a_record_that_failed() {
    let w = World::new();
    for version in VERSIONS {
        let (server, mut mbox, mut client) =
            client_through_a_middlebox_to(&w, version, |listener, ctx| {
                tokio::spawn(forging_streamer(listener, ctx))
            })
            .await;
        let r = timeout(BOUND, async {
            loop {
                match client.read().await {
                    Ok(Some(_)) => continue,
                    other => break other,
                }
            }
        })
        .await
        .expect("client hung");
        assert!(
            matches!(
                r,
                Err(DriverError::Alert {
                    description: 20,
                    ..
                })
            ),
            "{version:?}: {r:?}"
        );
        let at_server = timeout(BOUND, server).await.unwrap().unwrap();
        let said = at_server.unwrap_or_default();
        assert!(said.contains("bad_record_mac"), "{version:?}: {said}");
        let report = timeout(BOUND, mbox.next_report()).await.unwrap().unwrap();
        assert!(report.outcome.unwrap_err().contains("bad record"));
    }
}

/// Sends `data` through the session in 64 KiB pieces and reads each echo back.
async fn echo_through(client: &mut MbtlsClient, data: &[u8]) {
    for piece in data.chunks(65536) {
        client.write_all(piece).await.unwrap();
        let mut got = Vec::new();
        while got.len() < piece.len() {
            let chunk = timeout(BOUND, client.read()).await.unwrap().unwrap();
            got.extend_from_slice(&chunk.expect("the server closed early"));
        }
        assert_eq!(got, piece);
    }
}

/// A TLS 1.3 session through a fresh middlebox (its configuration `tweak`ed) to an in-process
/// echo server: the middlebox, the client, and the server's task.
async fn echo_session(
    w: &World,
    tweak: impl FnOnce(&mut MiddleboxServerConfig),
) -> (
    MiddleboxServer,
    MbtlsClient,
    tokio::task::JoinHandle<(bool, Vec<u8>)>,
) {
    let version = TlsVersion::Tls13;
    let ctx = w.legacy_server_context(version);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server_addr = listener.local_addr().unwrap();
    let server = tokio::spawn(in_process_server(listener, ctx, true));
    let mut cfg = w.middlebox(server_addr, passthrough());
    tweak(&mut cfg);
    let mbox = MiddleboxServer::bind("127.0.0.1:0", cfg).await.unwrap();
    let client = connect(&mbox, w.client(version, measure(PROGRAM, b""))).await;
    (mbox, client, server)
}

/// The simulator's evidence, but its call number `hold` (from 0) first waits for `go`, as a
/// quoting enclave keeps a middlebox waiting; it says it blocks ([`Attester::blocks`]).
struct HeldAttester {
    inner: SimulatedAttester,
    calls: std::sync::atomic::AtomicUsize,
    hold: usize,
    go: std::sync::Mutex<std::sync::mpsc::Receiver<()>>,
}

impl Attester for HeldAttester {
    fn evidence(&self, report_data: &[u8; 64]) -> Result<Evidence, AttestError> {
        use std::sync::atomic::Ordering;
        if self.calls.fetch_add(1, Ordering::SeqCst) == self.hold {
            // `go` comes only once the middlebox relayed another connection meanwhile; if it
            // could not (its runtime stalled here), this evidence fails, and so does the test.
            if self.go.lock().unwrap().recv_timeout(BOUND).is_err() {
                return Err(AttestError::Malformed(
                    "no other connection was relayed meanwhile",
                ));
            }
        }
        self.inner.evidence(report_data)
    }

    fn blocks(&self) -> bool {
        true
    }
}

/// A middlebox whose attester blocks (a quoting enclave) keeps relaying its other connections
/// while one connection waits for its evidence, even on a runtime with one worker: the
/// handshake step that makes evidence, here the answer prepared ahead of the ServerHello, runs
/// where blocking is allowed (`block_in_place`).
#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_middlebox_waiting_for_a_quote_keeps_relaying_its_other_connections() {
    use std::sync::atomic::Ordering;
    let w = World::new();
    let version = TlsVersion::Tls13;
    let ctx = Arc::new(w.legacy_server_context(version));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server_addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (sock, _) = listener.accept().await.unwrap();
            let ctx = ctx.clone();
            tokio::spawn(async move { serve_socket(sock, &ctx, true).await });
        }
    });
    // The server's answers take a while, so the middlebox makes each connection's TLS 1.3
    // evidence ahead of the ServerHello (`prepare`), as it does on a real network.
    let slow_link = DelayRelay::start(server_addr, Duration::from_millis(20))
        .await
        .unwrap();
    let server_addr = slow_link.local_addr();
    let (go, wait) = std::sync::mpsc::channel();
    let attester = Arc::new(HeldAttester {
        inner: SimulatedAttester::new(
            w.platform.clone(),
            measure(PROGRAM, b""),
            signer_id("mbx tests"),
        ),
        calls: Default::default(),
        hold: 1,
        go: std::sync::Mutex::new(wait),
    });
    let mut cfg = w.middlebox(server_addr, passthrough());
    cfg.handshake.attester = Some(attester.clone());
    let mbox = MiddleboxServer::bind("127.0.0.1:0", cfg).await.unwrap();
    let accepted = measure(PROGRAM, b"");
    let mut first = connect(&mbox, w.client(version, accepted)).await;
    echo_through(&mut first, b"before").await;

    // The second connection's evidence is held.
    let addr = mbox.local_addr();
    let cfg = w.client(version, accepted);
    let second = tokio::spawn(async move { MbtlsClient::connect(addr, cfg).await });
    let entered = async {
        while attester.calls.load(Ordering::SeqCst) < 2 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    timeout(BOUND, entered).await.unwrap();
    // Meanwhile the first connection is relayed both ways.
    echo_through(&mut first, b"while the middlebox waits for a quote").await;
    go.send(()).unwrap();
    let mut second = timeout(BOUND, second).await.unwrap().unwrap().unwrap();
    echo_through(&mut second, b"after").await;
    close_and_read_to_end(&mut first).await;
    close_and_read_to_end(&mut second).await;
}

/// Ends the session from the client (close_notify) and reads until the server's close.
async fn close_and_read_to_end(client: &mut MbtlsClient) {
    client.close().await.unwrap();
    while timeout(BOUND, client.read())
        .await
        .unwrap()
        .unwrap()
        .is_some()
    {}
}

/// The middlebox's idle trim on a live connection: after bulk traffic and more than
/// `IDLE_TRIM_AFTER` (2 s) without a read, it gives its grown buffers and kept chunks back, and
/// the session goes on unharmed, small messages and bulk alike. (The wait is real time; only
/// the report's trim count and the echoed bytes are checked.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_middlebox_connection_gives_its_buffers_back_and_carries_on() {
    let w = World::new();
    let (mut mbox, mut client, server) = echo_session(&w, |_| {}).await;
    let bulk: Vec<u8> = (0..1u32 << 20).map(|i| (i % 251) as u8).collect();
    echo_through(&mut client, &bulk).await;
    // 1.5 s past the trim's due time: the middlebox's timer must have fired before the next
    // bytes arrive, even if a loaded machine stalls the runtime for a moment (with 0.6 s of
    // margin a long stall could let both be ready at once, and select! picks either).
    tokio::time::sleep(Duration::from_millis(3500)).await;
    echo_through(&mut client, b"after the pause").await;
    echo_through(&mut client, &bulk[..1 << 18]).await;
    close_and_read_to_end(&mut client).await;
    let report = timeout(BOUND, mbox.next_report()).await.unwrap().unwrap();
    assert!(
        report.keys_installed && report.outcome.is_ok(),
        "{report:?}"
    );
    assert!(report.idle_trims >= 1, "{report:?}");
    // Every echoed byte crossed the middlebox both ways, as ciphertext: a little more on the
    // wire (record overhead, the handshake), never less.
    let carried = (bulk.len() + 15 + (1 << 18)) as u64;
    for bytes in [report.bytes_from_client, report.bytes_from_server] {
        assert!(
            (carried..carried + carried / 50 + 16_384).contains(&bytes),
            "{report:?}"
        );
    }
    // The listener's counts (its metrics) agree with the report.
    let ended = mbox.stats().ended();
    assert_eq!(
        ended,
        mbx_mbtls::driver::EndedConnections {
            ended_cleanly: 1,
            failed: 0,
            middlebox_took_part: 1,
            key_updates: 0,
            upstream_bytes: report.bytes_from_client,
            downstream_bytes: report.bytes_from_server,
        }
    );
    timeout(BOUND, server).await.unwrap().unwrap();
}

/// A middlebox whose owner never reads the reports keeps at most `REPORTS_KEPT` of them and
/// counts the rest, instead of growing by one report per connection forever.
#[tokio::test]
async fn unread_reports_are_bounded_and_counted() {
    let w = World::new();
    // A next hop nobody listens on: every connection ends at once, with a report.
    let refusing = mbx_testbed::refusing_addr();
    let refused = refusing.addr();
    let mut mbox = w.start_middlebox(refused, passthrough()).await;
    let extra = 3u64;
    for _ in 0..REPORTS_KEPT as u64 + extra {
        let c = TcpStream::connect(mbox.local_addr()).await.unwrap();
        drop(c);
    }
    timeout(BOUND, async {
        while mbox.reports_dropped() < extra {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap();
    for _ in 0..REPORTS_KEPT {
        let r = timeout(BOUND, mbox.next_report()).await.unwrap().unwrap();
        assert!(r.outcome.is_err(), "{r:?}");
    }
    assert_eq!(mbox.reports_dropped(), extra);
    // The counts take every connection, dropped reports included.
    let all = REPORTS_KEPT as u64 + extra;
    assert_eq!(mbox.stats().accepted(), all);
    let ended = mbox.stats().ended();
    assert_eq!((ended.ended_cleanly, ended.failed), (0, all), "{ended:?}");
    assert_eq!(ended.middlebox_took_part, 0, "{ended:?}");
}

/// Reads until the peer closes (EOF or reset); fails the test if it never does.
async fn until_closed(sock: &mut TcpStream) {
    assert!(
        mbx_testbed::wait::closed_by_peer(sock, BOUND).await,
        "the middlebox never closed the connection"
    );
}

/// A peer that connects and then sends nothing, or stops in the middle of its ClientHello,
/// does not hold the middlebox's task and sockets for ever: after `handshake_timeout` the
/// middlebox closes both connections (the one to the next hop too) and reports why. A session
/// whose handshake finished is not cut, however long it then stays idle. (The waits are real
/// time; only what is closed and what still works are checked.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_handshake_is_closed_and_an_idle_session_is_not() {
    let w = World::new();
    let patience = Duration::from_secs(2);
    // Stalled peers: the next hop only accepts, so nothing but the timeout can end them.
    let next_hop = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut cfg = w.middlebox(next_hop.local_addr().unwrap(), passthrough());
    cfg.limits.handshake_timeout = patience;
    let mut mbox = MiddleboxServer::bind("127.0.0.1:0", cfg).await.unwrap();
    // A ClientHello record header and the start of its body, then nothing.
    let partial: &[u8] = &[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00];
    for sent in [&[][..], partial] {
        let mut peer = TcpStream::connect(mbox.local_addr()).await.unwrap();
        peer.write_all(sent).await.unwrap();
        let (mut upstream, _) = timeout(BOUND, next_hop.accept()).await.unwrap().unwrap();
        until_closed(&mut peer).await;
        until_closed(&mut upstream).await;
        let report = timeout(BOUND, mbox.next_report()).await.unwrap().unwrap();
        let why = report.outcome.clone().unwrap_err();
        assert!(
            why.contains("did not finish within 2s; it was waiting for the client's ClientHello"),
            "{report:?}"
        );
        assert!(!report.keys_installed, "{report:?}");
        assert_eq!(
            report.error_kind.map(ErrorKind::name),
            Some("handshake_timeout"),
            "{report:?}"
        );
    }

    // A session that got its keys stays up past the handshake timeout.
    let (mut mbox, mut client, server) =
        echo_session(&w, |cfg| cfg.limits.handshake_timeout = patience).await;
    echo_through(&mut client, b"before the pause").await;
    tokio::time::sleep(patience + Duration::from_millis(1500)).await;
    echo_through(&mut client, b"after the pause").await;
    close_and_read_to_end(&mut client).await;
    let report = timeout(BOUND, mbox.next_report()).await.unwrap().unwrap();
    assert!(
        report.keys_installed && report.outcome.is_ok(),
        "{report:?}"
    );
    timeout(BOUND, server).await.unwrap().unwrap();
}

/// An established session that carries nothing for the middlebox's idle timeout is closed,
/// both hops, and reported as idle; one whose traffic keeps coming, with gaps shorter than the
/// timeout, outlives the timeout many times over. The endpoints see the close as abnormal (no
/// close_notify), not as the end of the stream. (Real time, with gaps of a fifth of the
/// timeout; only what is closed and what still works are checked.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_session_is_closed_after_the_idle_timeout_and_an_active_one_is_not() {
    let w = World::new();
    let idle = Duration::from_secs(1);
    let (mut mbox, mut client, server) =
        echo_session(&w, |cfg| cfg.limits.idle_timeout = Some(idle)).await;
    for i in 0..15 {
        tokio::time::sleep(idle / 5).await;
        echo_through(&mut client, format!("message {i}").as_bytes()).await;
    }
    // Now silence: the middlebox closes both hops.
    let read = timeout(BOUND, client.read()).await.unwrap();
    assert!(read.is_err(), "{read:?}");
    let (server_done, echoed) = timeout(BOUND, server).await.unwrap().unwrap();
    assert!(server_done);
    assert!(echoed.ends_with(b"message 14"));
    let report = timeout(BOUND, mbox.next_report()).await.unwrap().unwrap();
    let why = report.outcome.clone().unwrap_err();
    assert!(why.contains("idle for 1s"), "{report:?}");
    assert!(report.keys_installed, "{report:?}");
}

/// Waits until the middlebox counts `n` open connections (its accept loop counts them).
async fn until_open(mbox: &MiddleboxServer, n: usize) {
    timeout(BOUND, async {
        while mbox.open_connections() != n {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{} open, not {n}", mbox.open_connections()))
}

/// At its connection limit the middlebox accepts no more: the next connection waits in the
/// listen queue (it never reaches the next hop) until an open one ends, and is then served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_its_connection_limit_the_middlebox_serves_the_next_one_when_one_ends() {
    let w = World::new();
    let next_hop = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut cfg = w.middlebox(next_hop.local_addr().unwrap(), passthrough());
    cfg.limits.max_connections = Some(2);
    let mut mbox = MiddleboxServer::bind("127.0.0.1:0", cfg).await.unwrap();
    let mut peers = Vec::new();
    let mut upstreams = Vec::new();
    for _ in 0..2 {
        peers.push(TcpStream::connect(mbox.local_addr()).await.unwrap());
        upstreams.push(timeout(BOUND, next_hop.accept()).await.unwrap().unwrap().0);
    }
    until_open(&mbox, 2).await;
    // The third: its TCP handshake completes in the kernel, but nobody accepts it.
    let third = TcpStream::connect(mbox.local_addr()).await.unwrap();
    assert!(
        timeout(Duration::from_millis(500), next_hop.accept())
            .await
            .is_err(),
        "a connection over the limit was served"
    );
    // One ends: the third is accepted and reaches the next hop.
    drop(peers.remove(0));
    let report = timeout(BOUND, mbox.next_report()).await.unwrap().unwrap();
    assert_eq!(report.id, 0, "{report:?}");
    let (_upstream, _) = timeout(BOUND, next_hop.accept()).await.unwrap().unwrap();
    until_open(&mbox, 2).await;
    drop((third, peers, upstreams));
}

/// A reload changes what the connections accepted after it get: here the next hop and the
/// connection limit, which a reload that raises it lifts at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_applies_to_the_connections_accepted_after_it() {
    let w = World::new();
    let first = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let second = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let second_addr = second.local_addr().unwrap();
    let mbox = MiddleboxServer::bind(
        "127.0.0.1:0",
        w.middlebox(first.local_addr().unwrap(), passthrough()),
    )
    .await
    .unwrap();
    let _a = TcpStream::connect(mbox.local_addr()).await.unwrap();
    let (_up_a, _) = timeout(BOUND, first.accept()).await.unwrap().unwrap();
    let mut cfg = w.middlebox(second_addr, passthrough());
    cfg.limits.max_connections = Some(2);
    mbox.reload(cfg).unwrap();
    assert_eq!(mbox.config().next_hop, second_addr.to_string().into());
    // The next connection goes to the new next hop.
    let _b = TcpStream::connect(mbox.local_addr()).await.unwrap();
    let (_up_b, _) = timeout(BOUND, second.accept()).await.unwrap().unwrap();
    until_open(&mbox, 2).await;
    // The new limit (2) holds a third back, and nothing new went to the old next hop.
    let _c = TcpStream::connect(mbox.local_addr()).await.unwrap();
    let waited = Duration::from_millis(500);
    assert!(timeout(waited, second.accept()).await.is_err());
    assert!(timeout(waited, first.accept()).await.is_err());
    // A reload that raises the limit lets the waiting one in at once, none having ended.
    let mut cfg = w.middlebox(second_addr, passthrough());
    cfg.limits.max_connections = Some(3);
    mbox.reload(cfg).unwrap();
    let (_up_c, _) = timeout(BOUND, second.accept()).await.unwrap().unwrap();
    until_open(&mbox, 3).await;
}

/// A graceful stop: once `drain` is called the middlebox refuses new connections, the open
/// session carries on until its endpoints end it (and is reported), and then the report stream
/// ends. A session still open when the grace period is over is cut, counted, closed and
/// reported as cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draining_middlebox_refuses_new_connections_and_lets_open_ones_finish() {
    let w = World::new();
    for cut in [false, true] {
        let (mut mbox, mut client, server) = echo_session(&w, |_| {}).await;
        let addr = mbox.local_addr();
        echo_through(&mut client, b"before the drain").await;
        mbox.drain(if cut {
            Duration::from_millis(300)
        } else {
            BOUND
        });
        // The listener closes as soon as the accept loop sees the drain.
        timeout(BOUND, async {
            while TcpStream::connect(addr).await.is_ok() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("a draining middlebox still accepts connections");
        if cut {
            // Left open past the grace period: cut, and the client sees it.
            let read = timeout(BOUND, client.read()).await.unwrap();
            assert!(!matches!(read, Ok(Some(_))), "{read:?}");
        } else {
            echo_through(&mut client, b"while draining").await;
            close_and_read_to_end(&mut client).await;
        }
        // The report stream ends once every connection is gone. Besides the session's, only
        // probes the middlebox accepted before it saw the drain can be reported.
        let mut session = Vec::new();
        while let Some(r) = timeout(BOUND, mbox.next_report()).await.unwrap() {
            if r.keys_installed {
                session.push(r);
            }
        }
        if cut {
            // The cut session is reported all the same, as cut.
            assert_eq!(session.len(), 1, "{session:?}");
            let why = session[0].outcome.as_ref().unwrap_err();
            assert!(why.contains("end of the drain time"), "{why}");
            assert!(session[0].bytes_from_client > 0, "{session:?}");
            assert!(mbox.connections_cut() >= 1);
        } else {
            assert!(
                session.len() == 1 && session[0].outcome.is_ok(),
                "{session:?}"
            );
            assert_eq!(mbox.connections_cut(), 0);
        }
        let _ = timeout(BOUND, server).await.unwrap();
    }
}

/// The middlebox turns TCP keepalive on for both of its sockets, so that a peer that vanished
/// without FIN or RST is noticed and both connections closed instead of kept for good: once
/// the session is idle the kernel shows a keepalive timer on the middlebox's accepted socket
/// and on its socket to the next hop, and none on the client's own socket (which is not the
/// middlebox's to set: the control that shows the check can tell the difference).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_middlebox_keeps_both_of_its_sockets_alive() {
    let w = World::new();
    let mut next_hop = String::new();
    let (mbox, mut client, server) =
        echo_session(&w, |cfg| next_hop = cfg.next_hop.to_string()).await;
    echo_through(&mut client, b"then idle").await;
    let mbox_port = mbox.local_addr().port();
    let server_port: u16 = next_hop.rsplit(':').next().unwrap().parse().unwrap();
    let client_timer = timeout(BOUND, async {
        loop {
            let all = tcp_table::read().unwrap();
            let accepted = established_timer(&all, |s| s.local_port == mbox_port);
            let upstream = established_timer(&all, |s| s.remote_port == server_port);
            let client_side = established_timer(&all, |s| s.remote_port == mbox_port);
            if let (Some(KEEPALIVE), Some(KEEPALIVE), Some(c)) = (accepted, upstream, client_side) {
                return c;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("no keepalive timer on the middlebox's two sockets");
    assert_eq!(client_timer, 0, "the client's own socket has no keepalive");
    close_and_read_to_end(&mut client).await;
    timeout(BOUND, server).await.unwrap().unwrap();
}
