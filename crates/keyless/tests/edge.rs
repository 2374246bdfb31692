//! The edge server on loopback with real clients (curl, openssl s_client) and real key servers:
//! every key type over TLS 1.2 and 1.3, key-server outage and recovery, failover under load, the
//! Host check, the cache and per-origin session tickets.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mbx_keyless::edge::{Edge, EdgeConfig, RunningEdge};
use mbx_keyless::keys::KeyStore;
use mbx_keyless::server::{Authorization, KeyServer, KeyServerCore, RunningServer};
use mbx_keyless::tls::{self, DenyList};
use mbx_testbed::peers::{Curl, CurlOutput, OpensslClient, TlsVersion};
use mbx_testbed::pki::{IssuedCert, KeyType, LeafSpec, TestPki};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const LOCAL: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// A plain HTTP/1.1 origin that counts requests per path and accepted connections. `/cached`
/// says max-age=60, `/nostore` no-store, `/private` private; everything else has no caching
/// headers. Paths under `/keepalive/` are answered keep-alive (the connection stays open for
/// the next request), all others with `Connection: close`.
struct Origin {
    addr: SocketAddr,
    hits: Arc<Mutex<HashMap<String, usize>>>,
    connections: Arc<AtomicUsize>,
}

impl Origin {
    async fn start() -> Origin {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let hits: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
        let connections = Arc::new(AtomicUsize::new(0));
        let (h, c) = (Arc::clone(&hits), Arc::clone(&connections));
        tokio::spawn(async move {
            loop {
                let (mut tcp, _) = listener.accept().await.unwrap();
                c.fetch_add(1, Ordering::SeqCst);
                let h = Arc::clone(&h);
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    loop {
                        let end = loop {
                            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                                break i + 4;
                            }
                            let n = tcp.read(&mut chunk).await.unwrap_or(0);
                            if n == 0 {
                                return;
                            }
                            buf.extend_from_slice(&chunk[..n]);
                        };
                        let text = String::from_utf8_lossy(&buf[..end]).into_owned();
                        buf.drain(..end);
                        let path = text.split(' ').nth(1).unwrap_or("").to_owned();
                        let host = text
                            .lines()
                            .find_map(|l| l.strip_prefix("Host: "))
                            .unwrap_or("")
                            .split(':')
                            .next()
                            .unwrap_or("")
                            .to_owned();
                        *h.lock().unwrap().entry(path.clone()).or_default() += 1;
                        let cc = match path.as_str() {
                            "/cached" => "Cache-Control: public, max-age=60\r\n",
                            "/nostore" => "Cache-Control: no-store\r\n",
                            "/private" => "Cache-Control: private, max-age=60\r\n",
                            _ => "",
                        };
                        let keep_alive = path.starts_with("/keepalive/");
                        let connection = if keep_alive {
                            ""
                        } else {
                            "Connection: close\r\n"
                        };
                        let body = format!("hello from origin: {host}{path}\n");
                        let resp = format!(
                            "HTTP/1.1 200 OK\r\n{cc}Content-Length: {}\r\n{connection}\r\n{body}",
                            body.len()
                        );
                        if tcp.write_all(resp.as_bytes()).await.is_err() || !keep_alive {
                            let _ = tcp.shutdown().await;
                            return;
                        }
                    }
                });
            }
        });
        Origin {
            addr,
            hits,
            connections,
        }
    }

    fn hits(&self, path: &str) -> usize {
        self.hits.lock().unwrap().get(path).copied().unwrap_or(0)
    }

    fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

/// A key server in its own runtime, so that killing it closes every connection at once.
struct KeyServerProc {
    addr: SocketAddr,
    runtime: Option<tokio::runtime::Runtime>,
    server: Option<RunningServer>,
}

impl KeyServerProc {
    fn kill(&mut self) {
        let server = self.server.take();
        if let Some(rt) = self.runtime.take() {
            let _guard = rt.enter();
            drop(server);
            drop(_guard);
            rt.shutdown_background();
        }
    }

    fn requests(&self) -> u64 {
        self.server
            .as_ref()
            .map(|s| mbx_keyless::server::ServerStats::get(&s.stats().requests))
            .unwrap_or(0)
    }
}

impl Drop for KeyServerProc {
    fn drop(&mut self) {
        self.kill();
    }
}

struct Bed {
    dir: tempfile::TempDir,
    sites: TestPki,
    edge_pki: TestPki,
    server_cert: IssuedCert,
    runtime: tokio::runtime::Runtime,
    origin: Origin,
}

/// Sites: key server group "a" holds rsa/ec/ed.a.test and c.test; group "b" holds b.test.
const A_SITES: [(&str, KeyType); 3] = [
    ("rsa.a.test", KeyType::Rsa2048),
    ("ec.a.test", KeyType::EcdsaP256),
    ("ed.a.test", KeyType::Ed25519),
];

impl Bed {
    fn new() -> Bed {
        let dir = tempfile::tempdir().unwrap();
        let sites = TestPki::new("sites").unwrap();
        let server_pki = TestPki::new("keyservers").unwrap();
        let edge_pki = TestPki::new("edges").unwrap();
        let server_cert = server_pki
            .issue(&LeafSpec::server("keyserver.test"))
            .unwrap();
        for dir_name in ["keys-a", "keys-b"] {
            std::fs::create_dir(dir.path().join(dir_name)).unwrap();
        }
        let all = A_SITES.iter().map(|&(h, k)| (h, k, "keys-a")).chain([
            ("b.test", KeyType::EcdsaP384, "keys-b"),
            ("c.test", KeyType::EcdsaP256, "keys-a"),
        ]);
        for (host, kt, key_dir) in all {
            let cert = sites
                .issue(
                    &LeafSpec::server(host)
                        .key_type(kt)
                        .dns(&format!("www.{host}")),
                )
                .unwrap();
            let d = dir.path().join(key_dir);
            std::fs::write(d.join(format!("{host}.key")), cert.key_pem().as_bytes()).unwrap();
            std::fs::write(d.join(format!("{host}.crt")), cert.cert_pem()).unwrap();
            std::fs::write(
                dir.path().join(format!("{host}.chain.pem")),
                cert.chain_pem(),
            )
            .unwrap();
        }
        std::fs::write(dir.path().join("sites-ca.pem"), sites.root_pem()).unwrap();
        std::fs::write(dir.path().join("keyserver-ca.pem"), server_pki.root_pem()).unwrap();
        let edge_cert = edge_pki.issue(&LeafSpec::client("edge.cdn.test")).unwrap();
        edge_cert.write_to_named(dir.path(), "edge").unwrap();
        for (name, byte) in [("shop", "11"), ("other", "22")] {
            std::fs::write(dir.path().join(format!("{name}.ticket")), byte.repeat(32)).unwrap();
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let origin = runtime.block_on(Origin::start());
        Bed {
            dir,
            sites,
            edge_pki,
            server_cert,
            runtime,
            origin,
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Starts a key server with the keys of `key_dir` on `addr` (port 0: any).
    fn key_server(&self, key_dir: &str, addr: SocketAddr) -> KeyServerProc {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let keys = KeyStore::load_dir(&self.path(key_dir)).unwrap();
        let authz = Authorization::from_toml(
            r#"[edges."edge.cdn.test"]
               hostnames = ["rsa.a.test", "ec.a.test", "ed.a.test", "b.test", "c.test"]"#,
        )
        .unwrap();
        let tls = tls::server_config(
            self.server_cert.chain_der(),
            self.server_cert.private_key(),
            &[self.edge_pki.root_der().clone()],
            DenyList::new(),
        )
        .unwrap();
        let server = runtime.block_on(async {
            KeyServer::new(KeyServerCore::new(keys, authz), tls, 1, 256)
                .unwrap()
                .bind(addr)
                .await
                .unwrap()
        });
        KeyServerProc {
            addr: server.local_addr(),
            runtime: Some(runtime),
            server: Some(server),
        }
    }

    /// The edge configuration: groups "a" and "b" at the given addresses, origin `origin_name`
    /// with its ticket file, every site.
    fn edge_config(&self, a: &[SocketAddr], b: &[SocketAddr], origin_name: &str) -> EdgeConfig {
        let list = |v: &[SocketAddr]| {
            v.iter()
                .map(|a| format!("\"{a}\""))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let group = |name: &str, addrs: &[SocketAddr]| {
            format!(
                "[key_servers.{name}]\naddresses = [{}]\nserver_name = \"keyserver.test\"\n\
                 ca = {:?}\ncertificate = {:?}\nprivate_key = {:?}\n\
                 timeout_ms = 20000\nhealth_interval_ms = 200\n",
                list(addrs),
                self.path("keyserver-ca.pem"),
                self.path("edge.chain.crt"),
                self.path("edge.key"),
            )
        };
        let mut text = format!(
            "listen = \"127.0.0.1:0\"\nhandshake_workers = 8\n{}{}\
             [origins.{origin_name}]\naddress = \"{}\"\nticket_key_file = {:?}\n",
            group("a", a),
            group("b", b),
            self.origin.addr,
            self.path(&format!("{origin_name}.ticket")),
        );
        for (host, _) in A_SITES {
            text.push_str(&self.site_entry(host, "a", origin_name));
        }
        text.push_str(&self.site_entry("b.test", "b", origin_name));
        text.push_str(&self.site_entry("c.test", "a", origin_name));
        EdgeConfig::from_toml(&text).unwrap()
    }

    fn site_entry(&self, host: &str, group: &str, origin: &str) -> String {
        format!(
            "[sites.\"{host}\"]\ncertificate = {:?}\nkey_server = \"{group}\"\norigin = \"{origin}\"\n",
            self.path(&format!("{host}.chain.pem"))
        )
    }

    fn edge(&self, config: &EdgeConfig) -> RunningEdge {
        self.runtime.block_on(async {
            Edge::from_config(config)
                .unwrap()
                .bind(config.listen)
                .await
                .unwrap()
        })
    }

    fn curl(&self, edge: &RunningEdge, host: &str, path: &str) -> Curl {
        let port = edge.local_addr().port();
        Curl::new(&format!("https://{host}:{port}{path}"))
            .cacert(self.path("sites-ca.pem"))
            .resolve(host, port, LOCAL)
            .timeout(Duration::from_secs(60))
    }

    fn s_client(&self, edge: &RunningEdge, host: &str, version: TlsVersion) -> OpensslClient {
        OpensslClient::new(edge.local_addr())
            .servername(host)
            .cafile(self.path("sites-ca.pem"))
            .version(version)
            .input(format!(
                "GET /page HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
            ))
    }
}

fn ok_page(out: &CurlOutput, host: &str, path: &str) {
    assert_eq!(out.exit_code, Some(0), "curl failed: {}", out.verbose);
    assert_eq!(out.status, Some(200), "{}", out.verbose);
    assert_eq!(out.body_str(), format!("hello from origin: {host}{path}\n"));
}

#[test]
fn curl_and_openssl_handshake_with_every_key_type_over_tls12_and_tls13() {
    let bed = Bed::new();
    let ks_a = bed.key_server("keys-a", "127.0.0.1:0".parse().unwrap());
    let ks_b = bed.key_server("keys-b", "127.0.0.1:0".parse().unwrap());
    let edge = bed.edge(&bed.edge_config(&[ks_a.addr], &[ks_b.addr], "shop"));
    for (host, _) in A_SITES.iter().chain(&[("b.test", KeyType::EcdsaP384)]) {
        for (version, name) in [
            (TlsVersion::Tls12, "TLSv1.2"),
            (TlsVersion::Tls13, "TLSv1.3"),
        ] {
            let out = bed
                .curl(&edge, host, "/page")
                .version(version)
                .run()
                .unwrap();
            ok_page(&out, host, "/page");
            assert_eq!(out.tls_version().as_deref(), Some(name), "{host}");

            let out = bed.s_client(&edge, host, version).run().unwrap();
            let stdout = out.stdout_str();
            assert!(out.status.success(), "{host} {name}: {}", out.stderr_str());
            assert!(stdout.contains("Verify return code: 0 (ok)"), "{stdout}");
            assert!(
                stdout.contains(&format!("hello from origin: {host}/page")),
                "{stdout}"
            );
            assert!(
                stdout.contains(&format!("Protocol  : {name}"))
                    || stdout.contains(&format!(", {name},")),
                "{stdout}"
            );
        }
    }
    // Every full handshake's signature came from a key server.
    assert!(ks_a.requests() >= 12 && ks_b.requests() >= 4);
}

#[test]
fn a_dead_key_server_fails_its_sites_with_an_alert_others_keep_working_and_it_recovers() {
    let bed = Bed::new();
    let mut ks_a = bed.key_server("keys-a", "127.0.0.1:0".parse().unwrap());
    let ks_b = bed.key_server("keys-b", "127.0.0.1:0".parse().unwrap());
    let a_addr = ks_a.addr;
    let edge = bed.edge(&bed.edge_config(&[a_addr], &[ks_b.addr], "shop"));
    ok_page(
        &bed.curl(&edge, "ec.a.test", "/page").run().unwrap(),
        "ec.a.test",
        "/page",
    );

    ks_a.kill();
    for version in [TlsVersion::Tls12, TlsVersion::Tls13] {
        let out = bed
            .curl(&edge, "ec.a.test", "/page")
            .version(version)
            .run()
            .unwrap();
        assert_ne!(
            out.exit_code,
            Some(0),
            "handshake must fail without the key server"
        );
        assert_eq!(out.status, None);
        assert!(
            out.verbose.contains("alert internal error"),
            "no TLS alert: {}",
            out.verbose
        );
        ok_page(
            &bed.curl(&edge, "b.test", "/page")
                .version(version)
                .run()
                .unwrap(),
            "b.test",
            "/page",
        );
    }
    let failures = edge
        .edge()
        .stats()
        .handshake_failures
        .load(Ordering::Relaxed);
    assert!(failures >= 2);

    // Back on the same address: the very next handshake uses it, no edge restart.
    let ks_a2 = bed.key_server("keys-a", a_addr);
    ok_page(
        &bed.curl(&edge, "ec.a.test", "/page").run().unwrap(),
        "ec.a.test",
        "/page",
    );
    assert!(ks_a2.requests() >= 1);
}

#[test]
fn with_two_key_servers_killing_one_under_load_fails_no_handshake() {
    let bed = Bed::new();
    let mut ks1 = bed.key_server("keys-a", "127.0.0.1:0".parse().unwrap());
    let ks2 = bed.key_server("keys-a", "127.0.0.1:0".parse().unwrap());
    let ks_b = bed.key_server("keys-b", "127.0.0.1:0".parse().unwrap());
    let edge = bed.edge(&bed.edge_config(&[ks1.addr, ks2.addr], &[ks_b.addr], "shop"));

    // A bounded loop of full handshakes from 4 concurrent clients (rustls, no resumption).
    let roots = {
        let mut r = rustls::RootCertStore::empty();
        r.add(bed.sites.root_der().clone()).unwrap();
        Arc::new(r)
    };
    let client_config = Arc::new(
        rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth(),
    );
    let mut client_config = (*client_config).clone();
    client_config.resumption = rustls::client::Resumption::disabled();
    let client_config = Arc::new(client_config);
    let done = Arc::new(AtomicUsize::new(0));
    let addr = edge.local_addr();
    const PER_CLIENT: usize = 15;
    let clients: Vec<_> = (0..4)
        .map(|_| {
            let cfg = Arc::clone(&client_config);
            let done = Arc::clone(&done);
            bed.runtime.spawn(async move {
                let mut failures = Vec::new();
                for _ in 0..PER_CLIENT {
                    match get(addr, &cfg, "c.test").await {
                        Ok(body) if body.contains("hello from origin: c.test/page") => {}
                        other => failures.push(format!("{other:?}")),
                    }
                    done.fetch_add(1, Ordering::SeqCst);
                }
                failures
            })
        })
        .collect();
    // Kill the first key server once a third of the handshakes are done.
    while done.load(Ordering::SeqCst) < 20 {
        std::thread::sleep(Duration::from_millis(5));
    }
    let before = ks1.requests();
    ks1.kill();
    let failures: Vec<String> = bed.runtime.block_on(async {
        let mut all = Vec::new();
        for c in clients {
            all.extend(c.await.unwrap());
        }
        all
    });
    assert!(failures.is_empty(), "handshakes failed: {failures:?}");
    assert!(before >= 1, "the first key server took part before it died");
    assert!(ks2.requests() >= 1);
    let health = edge
        .edge()
        .pools()
        .iter()
        .find(|p| p.name() == "a")
        .unwrap()
        .health();
    assert!(health.contains(&(ks2.addr, true)));
}

/// One HTTPS GET of /page with a rustls client.
async fn get(
    addr: SocketAddr,
    config: &Arc<rustls::ClientConfig>,
    host: &str,
) -> Result<String, String> {
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let connector = tokio_rustls::TlsConnector::from(Arc::clone(config));
    let name = rustls::pki_types::ServerName::try_from(host.to_owned()).unwrap();
    let mut tls = connector
        .connect(name, tcp)
        .await
        .map_err(|e| e.to_string())?;
    tls.write_all(
        format!("GET /page HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    let _ = tls.read_to_end(&mut out).await;
    Ok(String::from_utf8_lossy(&out).into_owned())
}

#[test]
fn a_host_header_not_covered_by_the_certificate_gets_421() {
    let bed = Bed::new();
    let ks_a = bed.key_server("keys-a", "127.0.0.1:0".parse().unwrap());
    let ks_b = bed.key_server("keys-b", "127.0.0.1:0".parse().unwrap());
    let edge = bed.edge(&bed.edge_config(&[ks_a.addr], &[ks_b.addr], "shop"));
    let out = bed
        .curl(&edge, "ec.a.test", "/secret")
        .header("Host: b.test")
        .run()
        .unwrap();
    assert_eq!(out.status, Some(421), "{}", out.verbose);
    assert_eq!(
        bed.origin.hits("/secret"),
        0,
        "a refused request must not reach the origin"
    );
    // A name of the same certificate (SAN) is fine, with or without a port.
    let out = bed
        .curl(&edge, "ec.a.test", "/secret")
        .header("Host: www.ec.a.test:443")
        .run()
        .unwrap();
    assert_eq!(out.status, Some(200), "{}", out.verbose);
    assert_eq!(bed.origin.hits("/secret"), 1);
    assert_eq!(edge.edge().stats().misdirected.load(Ordering::Relaxed), 1);
}

#[test]
fn the_cache_answers_max_age_resources_and_forwards_no_store_and_private_ones() {
    let bed = Bed::new();
    let ks_a = bed.key_server("keys-a", "127.0.0.1:0".parse().unwrap());
    let ks_b = bed.key_server("keys-b", "127.0.0.1:0".parse().unwrap());
    let edge = bed.edge(&bed.edge_config(&[ks_a.addr], &[ks_b.addr], "shop"));
    for path in ["/cached", "/nostore", "/private", "/plain"] {
        for _ in 0..2 {
            ok_page(
                &bed.curl(&edge, "ec.a.test", path).run().unwrap(),
                "ec.a.test",
                path,
            );
        }
    }
    assert_eq!(
        bed.origin.hits("/cached"),
        1,
        "second GET of a max-age resource hit the origin"
    );
    assert_eq!(bed.origin.hits("/nostore"), 2);
    assert_eq!(bed.origin.hits("/private"), 2);
    assert_eq!(bed.origin.hits("/plain"), 2);
    // The cache is per site: the same path on another site is fetched again.
    ok_page(
        &bed.curl(&edge, "rsa.a.test", "/cached").run().unwrap(),
        "rsa.a.test",
        "/cached",
    );
    assert_eq!(bed.origin.hits("/cached"), 2);
}

#[test]
fn cache_misses_reuse_a_keep_alive_origin_connection() {
    let bed = Bed::new();
    let ks_a = bed.key_server("keys-a", "127.0.0.1:0".parse().unwrap());
    let ks_b = bed.key_server("keys-b", "127.0.0.1:0".parse().unwrap());
    let edge = bed.edge(&bed.edge_config(&[ks_a.addr], &[ks_b.addr], "shop"));
    // Two misses (separate client connections) answered keep-alive: one origin connection.
    for _ in 0..2 {
        ok_page(
            &bed.curl(&edge, "ec.a.test", "/keepalive/page")
                .run()
                .unwrap(),
            "ec.a.test",
            "/keepalive/page",
        );
    }
    assert_eq!(bed.origin.hits("/keepalive/page"), 2);
    assert_eq!(
        bed.origin.connections(),
        1,
        "the second miss opened a new connection"
    );
    // An answer with `Connection: close` ends its connection: the first `/plain` takes the
    // pooled connection, which is then closed, and the second needs a new one; so does the
    // next keep-alive miss, whose connection is then reused again.
    for _ in 0..2 {
        ok_page(
            &bed.curl(&edge, "ec.a.test", "/plain").run().unwrap(),
            "ec.a.test",
            "/plain",
        );
    }
    assert_eq!(bed.origin.connections(), 2);
    for _ in 0..2 {
        ok_page(
            &bed.curl(&edge, "ec.a.test", "/keepalive/again")
                .run()
                .unwrap(),
            "ec.a.test",
            "/keepalive/again",
        );
    }
    assert_eq!(bed.origin.connections(), 3);
}

/// Runs s_client with a session file; true if the session was resumed.
fn resumed(bed: &Bed, edge: &RunningEdge, version: TlsVersion, sess: &Path, out: bool) -> bool {
    let flag = if out { "-sess_out" } else { "-sess_in" };
    let run = bed
        .s_client(edge, "ec.a.test", version)
        .arg(flag)
        .arg(sess.display().to_string())
        .run()
        .unwrap();
    let stdout = run.stdout_str();
    assert!(
        stdout.contains("hello from origin: ec.a.test/page"),
        "{stdout}\n{}",
        run.stderr_str()
    );
    stdout.contains("Reused, TLSv1.")
}

#[test]
fn session_tickets_resume_on_edges_of_the_same_origin_only() {
    let bed = Bed::new();
    let ks_a = bed.key_server("keys-a", "127.0.0.1:0".parse().unwrap());
    let ks_b = bed.key_server("keys-b", "127.0.0.1:0".parse().unwrap());
    let shop = bed.edge_config(&[ks_a.addr], &[ks_b.addr], "shop");
    let edge1 = bed.edge(&shop);
    let edge2 = bed.edge(&shop);
    // Same sites and key servers, but another origin: another ticket key.
    let other = bed.edge(&bed.edge_config(&[ks_a.addr], &[ks_b.addr], "other"));
    for (i, version) in [TlsVersion::Tls12, TlsVersion::Tls13]
        .into_iter()
        .enumerate()
    {
        let sess = bed.path(&format!("session-{i}.pem"));
        assert!(
            !resumed(&bed, &edge1, version, &sess, true),
            "first connection is full"
        );
        assert!(
            resumed(&bed, &edge2, version, &sess, false),
            "{version:?}: not resumed on the second edge of the same origin"
        );
        assert!(
            !resumed(&bed, &other, version, &sess, false),
            "{version:?}: resumed across origins"
        );
    }
}

#[test]
fn two_origins_may_not_share_a_ticket_key() {
    let bed = Bed::new();
    let mut config = bed.edge_config(
        &["127.0.0.1:1".parse().unwrap()],
        &["127.0.0.1:1".parse().unwrap()],
        "shop",
    );
    let mut second = config.origins["shop"].clone();
    second.ticket_key_file = Some(bed.path("shop.ticket"));
    config.origins.insert("copy".into(), second.clone());
    let err = bed
        .runtime
        .block_on(async { Edge::from_config(&config).unwrap_err() });
    assert!(err.to_string().contains("must not cross origins"), "{err}");
    // Same key bytes in another file: refused too.
    std::fs::copy(bed.path("shop.ticket"), bed.path("copy.ticket")).unwrap();
    second.ticket_key_file = Some(bed.path("copy.ticket"));
    config.origins.insert("copy".into(), second);
    let err = bed
        .runtime
        .block_on(async { Edge::from_config(&config).unwrap_err() });
    assert!(err.to_string().contains("must not cross origins"), "{err}");
}

#[test]
fn a_key_server_that_never_answers_fails_the_handshake_within_the_timeout() {
    let bed = Bed::new();
    // Accepts TCP and then says nothing: the TLS connect to it times out.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_addr = silent.local_addr().unwrap();
    let ks_b = bed.key_server("keys-b", "127.0.0.1:0".parse().unwrap());
    let mut config = bed.edge_config(&[silent_addr], &[ks_b.addr], "shop");
    config.key_servers.get_mut("a").unwrap().timeout_ms = 500;
    let edge = bed.edge(&config);
    let out = bed.curl(&edge, "ec.a.test", "/page").run().unwrap();
    assert_ne!(out.exit_code, Some(0));
    assert!(
        out.verbose.contains("alert internal error"),
        "{}",
        out.verbose
    );
    ok_page(
        &bed.curl(&edge, "b.test", "/page").run().unwrap(),
        "b.test",
        "/page",
    );
    drop(silent);
}
