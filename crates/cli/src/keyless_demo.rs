//! `mbx keyless demo`: Keyless SSL on loopback, in one process, and what each party did.
//!
//! The demo generates a test PKI with an ECDSA P-256 site and an RSA-2048 site, starts one key
//! server per site (each holds only its site's private key), a counting HTTP/1.1 origin and an
//! edge whose configuration names only the sites' certificates. A rustls client then fetches a
//! page of each site through the edge like curl would, over every requested TLS version, and the
//! demo checks from the key servers' per-opcode counters which key server signed each handshake.
//! Finally it shows a cached page served without an origin hit and a wrong Host refused with 421.
//! Every verdict is computed; any unexpected outcome fails the command.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, ensure, Context};
use mbx_keyless::edge::{Edge, EdgeConfig, RunningEdge};
use mbx_keyless::server::{KeyServer, RunningServer, ServerConfig};
use mbx_keyless::Opcode;
use mbx_testbed::pki::{KeyType, LeafSpec, TestPki};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const SITES_CA: &str = "mbx keyless demo sites CA";
const EDGE_NAME: &str = "edge.keyless.test";
const KEY_SERVER_NAME: &str = "keyserver.keyless.test";
/// The page every site serves with no caching headers: each fetch reaches the origin.
const PAGE: &str = "/";
/// A page the origin marks `public, max-age=60`: the edge may answer it from its cache.
const CACHED_PAGE: &str = "/static/logo.txt";
const IO_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(clap::Args, Debug, Default)]
pub struct KeylessDemoArgs {
    /// TLS versions to run, in order (`1.2`, `1.3`). Default: 1.3 then 1.2.
    #[arg(long = "tls", value_delimiter = ',')]
    versions: Vec<String>,
}

/// One site: its SNI name, key type and the key-server group that holds its key.
struct SiteSpec {
    host: &'static str,
    key_type: KeyType,
    key_label: &'static str,
    group: &'static str,
}

const SITES: [SiteSpec; 2] = [
    SiteSpec {
        host: "ec.keyless.test",
        key_type: KeyType::EcdsaP256,
        key_label: "ECDSA P-256",
        group: "ecdsa",
    },
    SiteSpec {
        host: "rsa.keyless.test",
        key_type: KeyType::Rsa2048,
        key_label: "RSA-2048",
        group: "rsa",
    },
];

#[derive(Clone, Copy, PartialEq, Eq)]
enum Version {
    Tls12,
    Tls13,
}

impl Version {
    fn parse(s: &str) -> anyhow::Result<Version> {
        match s.trim() {
            "1.2" => Ok(Version::Tls12),
            "1.3" => Ok(Version::Tls13),
            other => bail!("unknown TLS version {other:?} (use 1.2 or 1.3)"),
        }
    }

    fn rustls(self) -> &'static rustls::SupportedProtocolVersion {
        match self {
            Version::Tls12 => &rustls::version::TLS12,
            Version::Tls13 => &rustls::version::TLS13,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Version::Tls12 => "TLS 1.2",
            Version::Tls13 => "TLS 1.3",
        }
    }

    fn protocol(self) -> rustls::ProtocolVersion {
        match self {
            Version::Tls12 => rustls::ProtocolVersion::TLSv1_2,
            Version::Tls13 => rustls::ProtocolVersion::TLSv1_3,
        }
    }
}

pub fn run(args: KeylessDemoArgs) -> anyhow::Result<()> {
    crate::subcommand::exit_quietly_when_stdout_closes();
    let versions = if args.versions.is_empty() {
        vec![Version::Tls13, Version::Tls12]
    } else {
        args.versions
            .iter()
            .map(|v| Version::parse(v))
            .collect::<anyhow::Result<Vec<_>>>()?
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let world = World::start(&runtime)?;
    // The client is blocking, on this thread, while the runtime's workers run the other parties.
    let result = world.run(&versions);
    drop(world);
    runtime.shutdown_timeout(Duration::from_secs(1));
    result
}

/// A plain HTTP/1.1 origin counting requests per path.
struct Origin {
    addr: SocketAddr,
    hits: Arc<Mutex<HashMap<String, u64>>>,
}

impl Origin {
    async fn start() -> anyhow::Result<Origin> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let hits: Arc<Mutex<HashMap<String, u64>>> = Arc::default();
        let counted = Arc::clone(&hits);
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                tokio::spawn(serve_origin(tcp, Arc::clone(&counted)));
            }
        });
        Ok(Origin { addr, hits })
    }

    fn hits(&self, path: &str) -> u64 {
        let map = self.hits.lock().unwrap_or_else(|e| e.into_inner());
        map.get(path).copied().unwrap_or(0)
    }
}

async fn serve_origin(mut tcp: tokio::net::TcpStream, hits: Arc<Mutex<HashMap<String, u64>>>) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match tcp.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(chunk.get(..n).unwrap_or_default()),
        }
        if buf.len() > 64 * 1024 {
            return;
        }
    }
    let text = String::from_utf8_lossy(&buf).into_owned();
    let path = text.split(' ').nth(1).unwrap_or("").to_owned();
    let host = text
        .lines()
        .find_map(|l| {
            l.strip_prefix("Host: ")
                .or_else(|| l.strip_prefix("host: "))
        })
        .unwrap_or("")
        .to_owned();
    *hits
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry(path.clone())
        .or_default() += 1;
    let cache_control = if path == CACHED_PAGE {
        "Cache-Control: public, max-age=60\r\n"
    } else {
        ""
    };
    let body = format!("hello from the origin: {host}{path}\n");
    let response = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n{cache_control}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = tcp.write_all(response.as_bytes()).await;
    let _ = tcp.shutdown().await;
}

/// Every party, running on the caller's runtime.
struct World {
    _dir: tempfile::TempDir,
    sites_ca: rustls::pki_types::CertificateDer<'static>,
    /// The site private keys (PKCS#8 DER), only to check that no edge file contains them.
    site_keys: Vec<zeroize::Zeroizing<Vec<u8>>>,
    origin: Origin,
    key_servers: Vec<(&'static str, RunningServer)>,
    edge_config: EdgeConfig,
    edge: RunningEdge,
}

impl World {
    fn start(runtime: &tokio::runtime::Runtime) -> anyhow::Result<World> {
        let dir = tempfile::tempdir().context("cannot create a temporary directory")?;
        let d_buf = dir.path().to_path_buf();
        let d = d_buf.as_path();
        let sites = TestPki::new(SITES_CA)?;
        let key_server_pki = TestPki::new("mbx keyless demo key-server CA")?;
        let edge_pki = TestPki::new("mbx keyless demo edge CA")?;
        key_server_pki
            .issue(&LeafSpec::server(KEY_SERVER_NAME))?
            .write_to_named(d, "keyserver")?;
        edge_pki
            .issue(&LeafSpec::client(EDGE_NAME))?
            .write_to_named(d, "edge")?;
        std::fs::write(d.join("keyserver-ca.pem"), key_server_pki.root_pem())?;
        std::fs::write(d.join("edge-ca.pem"), edge_pki.root_pem())?;

        println!("mbx keyless demo: an edge terminates TLS, the private keys stay on key servers");
        let mut site_keys = Vec::new();
        for site in &SITES {
            let cert = sites.issue(&LeafSpec::server(site.host).key_type(site.key_type))?;
            let key_dir = d.join(format!("keys-{}", site.group));
            std::fs::create_dir(&key_dir)?;
            std::fs::write(
                key_dir.join(format!("{}.key", site.host)),
                cert.key_pem().as_bytes(),
            )?;
            std::fs::write(key_dir.join(format!("{}.crt", site.host)), cert.cert_pem())?;
            std::fs::write(d.join(format!("{}.chain.pem", site.host)), cert.chain_pem())?;
            site_keys.push(zeroize::Zeroizing::new(cert.key_pkcs8_der().to_vec()));
            println!(
                "  PKI: test CA {SITES_CA:?} issued {} ({}); its private key goes to key server {:?} only",
                site.host, site.key_label, site.group
            );
        }
        std::fs::write(d.join("tickets.key"), "5a".repeat(32))?;

        runtime.block_on(async {
            let origin = Origin::start().await.context("cannot start the origin")?;
            println!("  origin: plain HTTP/1.1 on {} (counts hits per path)", origin.addr);
            let mut key_servers = Vec::new();
            for site in &SITES {
                let cfg = ServerConfig::from_toml(&format!(
                    "listen = \"127.0.0.1:0\"\nkey_dir = {:?}\ncertificate = {:?}\n\
                     private_key = {:?}\nedge_ca = {:?}\nworkers = 1\n\
                     [edges.{EDGE_NAME:?}]\nhostnames = [{:?}]\n",
                    d.join(format!("keys-{}", site.group)),
                    d.join("keyserver.chain.crt"),
                    d.join("keyserver.key"),
                    d.join("edge-ca.pem"),
                    site.host,
                ))
                .context("key server configuration")?;
                let server = KeyServer::from_config(&cfg)
                    .context("cannot start a key server")?
                    .bind(cfg.listen)
                    .await
                    .context("key server cannot listen")?;
                println!(
                    "  key server {:?}: {} (mutual TLS; holds the {} key, grants it to {EDGE_NAME})",
                    site.group,
                    server.local_addr(),
                    site.host
                );
                key_servers.push((site.group, server));
            }
            let edge_config = edge_config(d, &origin, &key_servers)?;
            let edge = Edge::from_config(&edge_config)
                .context("cannot start the edge")?
                .bind(edge_config.listen)
                .await
                .context("edge cannot listen")?;
            println!("  edge: {} (TLS for the sites, client {EDGE_NAME} towards the key servers)", edge.local_addr());
            Ok::<_, anyhow::Error>(World {
                _dir: dir,
                sites_ca: sites.root_der().clone(),
                site_keys,
                origin,
                key_servers,
                edge_config,
                edge,
            })
        })
    }

    fn run(&self, versions: &[Version]) -> anyhow::Result<()> {
        self.edge_holds_no_private_key()?;
        let mut n = 0;
        for &version in versions {
            for site in &SITES {
                n += 1;
                println!(
                    "\n[{n}] {} to {} ({})",
                    version.name(),
                    site.host,
                    site.key_label
                );
                self.fetch_page(version, site)?;
            }
        }
        let first = versions.first().copied().unwrap_or(Version::Tls13);
        n += 1;
        println!(
            "\n[{n}] the edge cache: {CACHED_PAGE} twice ({})",
            first.name()
        );
        self.cache(first)?;
        n += 1;
        println!("\n[{n}] a wrong Host header ({})", first.name());
        self.misdirected(first)?;
        println!("\nAll checks passed.");
        Ok(())
    }

    /// Every file the edge's configuration names is read back: none holds a site private key.
    fn edge_holds_no_private_key(&self) -> anyhow::Result<()> {
        let mut files: Vec<(String, &Path)> = Vec::new();
        for (sni, s) in &self.edge_config.sites {
            println!(
                "  edge site {sni}: certificate chain {:?}, key server group {:?}, origin {:?} (a site entry has no private-key field)",
                file_name(&s.certificate),
                s.key_server,
                s.origin
            );
            files.push((format!("site {sni} certificate"), &s.certificate));
        }
        for (name, g) in &self.edge_config.key_servers {
            files.push((format!("group {name} CA"), &g.ca));
            files.push((format!("group {name} client certificate"), &g.certificate));
            files.push((format!("group {name} client key"), &g.private_key));
        }
        for (name, o) in &self.edge_config.origins {
            if let Some(t) = &o.ticket_key_file {
                files.push((format!("origin {name} ticket key"), t));
            }
        }
        for (what, path) in &files {
            let bytes = std::fs::read(path).with_context(|| format!("cannot read {what}"))?;
            for key in &self.site_keys {
                ensure!(
                    !contains_key(&bytes, key),
                    "the edge's {what} contains a site private key"
                );
            }
        }
        println!(
            "  edge config: {} files named (site chains, key-server CA, the edge's own client identity, ticket key); none contains a site private key",
            files.len()
        );
        Ok(())
    }

    fn key_server(&self, group: &str) -> anyhow::Result<&RunningServer> {
        self.key_servers
            .iter()
            .find(|(g, _)| *g == group)
            .map(|(_, s)| s)
            .with_context(|| format!("no key server {group:?}"))
    }

    /// Signing requests per opcode of every key server (pings left out).
    fn signing_counters(&self) -> Vec<(&'static str, Vec<(Opcode, u64)>)> {
        self.key_servers
            .iter()
            .map(|(g, s)| {
                let ops = Opcode::ALL
                    .iter()
                    .filter(|op| !matches!(op, Opcode::Ping | Opcode::Pong))
                    .map(|&op| (op, s.stats().requests_for(Some(op))))
                    .collect();
                (*g, ops)
            })
            .collect()
    }

    fn fetch_page(&self, version: Version, site: &SiteSpec) -> anyhow::Result<()> {
        let before = self.signing_counters();
        let hits_before = self.origin.hits(PAGE);
        let response = self.fetch(version, site.host, site.host, PAGE)?;
        ensure!(
            response.status == 200,
            "{}: expected 200, got {}",
            site.host,
            response.status_line
        );
        let expected = format!("hello from the origin: {}{PAGE}\n", site.host);
        ensure!(
            response.body == expected.as_bytes(),
            "{}: unexpected body {:?}",
            site.host,
            String::from_utf8_lossy(&response.body)
        );
        let after = self.signing_counters();
        // Which key server signed: only the site's group may have moved, by signing opcodes.
        let mut signed_by_group = 0;
        for ((group, ops_before), (_, ops_after)) in before.iter().zip(&after) {
            let moved: Vec<(Opcode, u64, u64)> = ops_before
                .iter()
                .zip(ops_after)
                .filter(|((_, b), (_, a))| a != b)
                .map(|((op, b), (_, a))| (*op, *b, *a))
                .collect();
            let deltas: Vec<String> = moved
                .iter()
                .map(|(op, b, a)| format!("{op:?} {b} → {a}"))
                .collect();
            let operations: u64 = moved.iter().map(|(_, b, a)| a.saturating_sub(*b)).sum();
            let addr = self.key_server(group)?.local_addr();
            if *group == site.group {
                // Resumption is off: one full handshake, exactly one remote signature.
                ensure!(
                    operations == 1,
                    "key server {group:?} made {operations} signatures for one handshake of {} ({})",
                    site.host,
                    deltas.join(", ")
                );
                signed_by_group += 1;
                println!(
                    "  key server {group:?} ({addr}) signed: {}",
                    deltas.join(", ")
                );
            } else {
                ensure!(
                    deltas.is_empty(),
                    "key server {group:?} answered for {}, which it does not hold: {}",
                    site.host,
                    deltas.join(", ")
                );
                println!("  key server {group:?} ({addr}): no request");
            }
        }
        ensure!(signed_by_group == 1, "no key server group {:?}", site.group);
        let pool = self
            .edge
            .edge()
            .pools()
            .iter()
            .find(|p| p.name() == site.group)
            .with_context(|| format!("the edge has no key-server pool {:?}", site.group))?;
        let health: Vec<String> = pool
            .health()
            .iter()
            .map(|(a, up)| format!("{a} {}", if *up { "up" } else { "down" }))
            .collect();
        println!(
            "  edge: site {} uses key-server pool {:?} [{}]",
            site.host,
            pool.name(),
            health.join(", ")
        );
        let hits_after = self.origin.hits(PAGE);
        ensure!(
            hits_after == hits_before + 1,
            "origin hits for {PAGE}: {hits_before} → {hits_after}, expected one more"
        );
        println!("  origin: hits for {PAGE} {hits_before} → {hits_after}");
        Ok(())
    }

    fn cache(&self, version: Version) -> anyhow::Result<()> {
        let site = &SITES[0];
        let stats = self.edge.edge().stats();
        let cache_hits = stats.cache_hits.load(Ordering::Relaxed);
        let h0 = self.origin.hits(CACHED_PAGE);
        let first = self.fetch(version, site.host, site.host, CACHED_PAGE)?;
        let h1 = self.origin.hits(CACHED_PAGE);
        ensure!(first.status == 200, "first fetch: {}", first.status_line);
        ensure!(
            first.header("x-cache") == Some("MISS") && h1 == h0 + 1,
            "first fetch of {CACHED_PAGE} should reach the origin (X-Cache {:?}, hits {h0} → {h1})",
            first.header("x-cache")
        );
        println!("  first fetch: X-Cache: MISS, origin hits {h0} → {h1}");
        let second = self.fetch(version, site.host, site.host, CACHED_PAGE)?;
        let h2 = self.origin.hits(CACHED_PAGE);
        ensure!(second.status == 200, "second fetch: {}", second.status_line);
        ensure!(
            second.header("x-cache") == Some("HIT") && h2 == h1,
            "second fetch of {CACHED_PAGE} should come from the edge cache (X-Cache {:?}, hits {h1} → {h2})",
            second.header("x-cache")
        );
        ensure!(second.body == first.body, "the cached body differs");
        let cache_hits_after = stats.cache_hits.load(Ordering::Relaxed);
        ensure!(
            cache_hits_after == cache_hits + 1,
            "edge cache-hit counter {cache_hits} → {cache_hits_after}"
        );
        println!(
            "  second fetch: X-Cache: HIT, same body, origin hits unchanged ({h2}), edge cache hits {cache_hits} → {cache_hits_after}"
        );
        Ok(())
    }

    fn misdirected(&self, version: Version) -> anyhow::Result<()> {
        let (sni, host) = (SITES[0].host, SITES[1].host);
        let path = "/account";
        let stats = self.edge.edge().stats();
        let before = stats.misdirected.load(Ordering::Relaxed);
        let response = self.fetch(version, sni, host, path)?;
        ensure!(
            response.status == 421,
            "Host {host} on a connection for {sni}: expected 421, got {}",
            response.status_line
        );
        let hits = self.origin.hits(path);
        ensure!(
            hits == 0,
            "a refused request reached the origin ({hits} hits)"
        );
        let after = stats.misdirected.load(Ordering::Relaxed);
        ensure!(
            after == before + 1,
            "edge misdirected counter {before} → {after}"
        );
        println!(
            "  Host {host} on a connection authenticated as {sni}: 421, origin hits for {path}: 0, edge misdirected {before} → {after}"
        );
        Ok(())
    }

    /// One GET through the edge with SNI `sni` and Host `host`, printed like `curl -v`.
    fn fetch(
        &self,
        version: Version,
        sni: &str,
        host: &str,
        path: &str,
    ) -> anyhow::Result<Response> {
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(self.sites_ca.clone())
            .context("bad sites CA certificate")?;
        let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_protocol_versions(&[version.rustls()])
        .context("client protocol versions")?
        .with_root_certificates(roots)
        .with_no_client_auth();
        // Every fetch is a full handshake, so every fetch needs a key server's signature.
        config.resumption = rustls::client::Resumption::disabled();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let name = rustls::pki_types::ServerName::try_from(sni.to_owned())
            .with_context(|| format!("bad server name {sni:?}"))?;
        let conn = rustls::ClientConnection::new(Arc::new(config), name)
            .context("cannot create the TLS client")?;
        let addr = self.edge.local_addr();
        let tcp = TcpStream::connect(addr).with_context(|| format!("cannot connect to {addr}"))?;
        tcp.set_read_timeout(Some(IO_TIMEOUT))?;
        tcp.set_write_timeout(Some(IO_TIMEOUT))?;
        println!("* Connected to {sni} ({}) port {}", addr.ip(), addr.port());
        let mut tls = rustls::StreamOwned::new(conn, tcp);
        while tls.conn.is_handshaking() {
            tls.conn
                .complete_io(&mut tls.sock)
                .with_context(|| format!("TLS handshake with the edge for {sni} failed"))?;
        }
        let negotiated = tls.conn.protocol_version();
        ensure!(
            negotiated == Some(version.protocol()),
            "negotiated {negotiated:?}, asked for {}",
            version.name()
        );
        let suite = tls
            .conn
            .negotiated_cipher_suite()
            .context("no cipher suite negotiated")?;
        println!(
            "* SSL connection using {} / {}",
            match version {
                Version::Tls12 => "TLSv1.2",
                Version::Tls13 => "TLSv1.3",
            },
            curl_suite_name(suite.suite())
        );
        let alpn = tls
            .conn
            .alpn_protocol()
            .map(|p| String::from_utf8_lossy(p).into_owned());
        ensure!(
            alpn.as_deref() == Some("http/1.1"),
            "ALPN: the edge chose {alpn:?}"
        );
        println!("* ALPN: server accepted http/1.1");
        let leaf = tls
            .conn
            .peer_certificates()
            .and_then(|c| c.first())
            .context("the edge sent no certificate")?;
        let x509 = openssl::x509::X509::from_der(leaf).context("unparsable certificate")?;
        let subject = crate::subcommand::name_text(x509.subject_name());
        let issuer = crate::subcommand::name_text(x509.issuer_name());
        let cn = x509
            .subject_name()
            .entries_by_nid(openssl::nid::Nid::COMMONNAME)
            .next()
            .and_then(|e| e.data().to_string().ok());
        ensure!(
            cn.as_deref() == Some(sni),
            "certificate subject {subject:?} does not name {sni}"
        );
        println!("* Server certificate:");
        println!("*  subject: {subject}");
        println!("*  issuer: {issuer}");
        println!("*  SSL certificate verify ok (chain to {SITES_CA:?}, name {sni})");
        let request = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: mbx-keyless-demo\r\nAccept: */*\r\nConnection: close\r\n\r\n");
        for line in request.trim_end().lines() {
            println!("> {line}");
        }
        tls.write_all(request.as_bytes())
            .context("cannot send the request")?;
        tls.flush()?;
        let mut raw = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            match tls.read(&mut chunk) {
                Ok(0) => break,
                Ok(n) => raw.extend_from_slice(chunk.get(..n).unwrap_or_default()),
                // A peer closing without close_notify: the response framing decides below.
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
                Err(e) => return Err(e).context("cannot read the response"),
            }
        }
        let response = Response::parse(&raw)?;
        println!("< {}", response.status_line);
        for (name, value) in &response.headers {
            println!("< {name}: {value}");
        }
        print!("{}", String::from_utf8_lossy(&response.body));
        if !response.body.ends_with(b"\n") {
            println!();
        }
        Ok(response)
    }
}

/// The edge configuration the demo builds: one group per key server, one origin, the sites.
fn edge_config(
    d: &Path,
    origin: &Origin,
    key_servers: &[(&'static str, RunningServer)],
) -> anyhow::Result<EdgeConfig> {
    let mut text = String::from("listen = \"127.0.0.1:0\"\nhandshake_workers = 4\n");
    for (group, server) in key_servers {
        text.push_str(&format!(
            "[key_servers.{group}]\naddresses = [\"{}\"]\nserver_name = \"{KEY_SERVER_NAME}\"\n\
             ca = {:?}\ncertificate = {:?}\nprivate_key = {:?}\ntimeout_ms = 20000\n\
             health_interval_ms = 60000\n",
            server.local_addr(),
            d.join("keyserver-ca.pem"),
            d.join("edge.chain.crt"),
            d.join("edge.key"),
        ));
    }
    text.push_str(&format!(
        "[origins.web]\naddress = \"{}\"\nticket_key_file = {:?}\n",
        origin.addr,
        d.join("tickets.key")
    ));
    for site in &SITES {
        text.push_str(&format!(
            "[sites.{:?}]\ncertificate = {:?}\nkey_server = \"{}\"\norigin = \"web\"\n",
            site.host,
            d.join(format!("{}.chain.pem", site.host)),
            site.group
        ));
    }
    EdgeConfig::from_toml(&text).context("the demo's edge configuration")
}

/// The IANA name as curl prints it (rustls prefixes TLS 1.3 suites with `TLS13_`).
fn curl_suite_name(suite: rustls::CipherSuite) -> String {
    let name = suite.as_str().unwrap_or("unknown suite");
    match name.strip_prefix("TLS13_") {
        Some(rest) => format!("TLS_{rest}"),
        None => name.to_owned(),
    }
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| p.display().to_string())
}

/// True if `file` holds the PKCS#8 DER `key`, raw or in a PEM block.
fn contains_key(file: &[u8], key: &[u8]) -> bool {
    pem_blocks(file).iter().any(|b| b.as_slice() == key)
        || (!key.is_empty() && file.windows(key.len()).any(|w| w == key))
}

/// The DER contents of every PEM block in `bytes`.
fn pem_blocks(bytes: &[u8]) -> Vec<Vec<u8>> {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        if line.starts_with("-----BEGIN ") {
            current = Some(String::new());
        } else if line.starts_with("-----END ") {
            if let Some(b64) = current.take() {
                if let Ok(der) = openssl::base64::decode_block(&b64) {
                    out.push(der);
                }
            }
        } else if let Some(b64) = current.as_mut() {
            b64.push_str(line.trim());
        }
    }
    out
}

/// An HTTP/1.1 response as the edge sent it (always with Content-Length).
struct Response {
    status_line: String,
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Response {
    fn parse(raw: &[u8]) -> anyhow::Result<Response> {
        let end = raw
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .context("the edge's response has no complete head")?;
        let head = std::str::from_utf8(raw.get(..end).unwrap_or_default())
            .context("response head is not UTF-8")?;
        let body = raw.get(end + 4..).unwrap_or_default().to_vec();
        let mut lines = head.split("\r\n");
        let status_line = lines.next().unwrap_or_default().to_owned();
        let status = status_line
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .with_context(|| format!("bad status line {status_line:?}"))?;
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(n, v)| (n.trim().to_owned(), v.trim().to_owned()))
            .collect();
        let response = Response {
            status_line,
            status,
            headers,
            body,
        };
        let length: usize = response
            .header("content-length")
            .and_then(|v| v.parse().ok())
            .context("response without a valid Content-Length")?;
        ensure!(
            response.body.len() == length,
            "response body has {} bytes, Content-Length says {length}",
            response.body.len()
        );
        Ok(response)
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_response_whose_body_is_shorter_than_content_length_is_refused() {
        let ok = Response::parse(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc").unwrap();
        assert_eq!(ok.status, 200);
        assert_eq!(ok.header("CONTENT-LENGTH"), Some("3"));
        assert!(Response::parse(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nabc").is_err());
        assert!(Response::parse(b"HTTP/1.1 200 OK\r\n\r\nabc").is_err());
    }

    #[test]
    fn a_file_holding_a_site_key_is_detected_and_a_certificate_is_not() {
        let pki = TestPki::new("t").unwrap();
        let cert = pki.issue(&LeafSpec::server("a.test")).unwrap();
        let key = cert.key_pkcs8_der();
        assert!(contains_key(cert.key_pem().as_bytes(), key));
        assert!(contains_key(key, key));
        let mixed = format!("{}{}", cert.chain_pem(), cert.key_pem().as_str());
        assert!(contains_key(mixed.as_bytes(), key));
        assert!(!contains_key(cert.chain_pem().as_bytes(), key));
    }

    #[test]
    fn pem_blocks_are_decoded() {
        let der = vec![1u8, 2, 3, 250];
        let b64 = openssl::base64::encode_block(&der);
        let pem = format!("-----BEGIN X-----\n{b64}\n-----END X-----\n");
        assert_eq!(pem_blocks(pem.as_bytes()), vec![der]);
    }
}
