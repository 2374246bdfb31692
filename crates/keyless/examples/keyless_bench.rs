//! Keyless SSL measurements (paper §III) on loopback: handshake latency per topology with
//! emulated RTTs, key-server signs per CPU-second against in-process signing, and edge handshakes
//! per second against a server holding its key locally. Writes `docs/bench/keyless.json` and
//! `docs/bench/keyless.png`.
//!
//! `cargo run --release -p mbx-keyless --example keyless_bench`
//!
//! With `KEYLESS_BENCH_SIGNING=<prefix>` (e.g. `ECDSA`, or empty for all) only the key-server
//! signing part runs, for the algorithms whose label starts with the prefix; nothing is written.
//!
//! Every figure is repeated `REPS` times and reported as median and min–max. The machine's cores
//! are shared with the load generator (and with anything else running), so throughput figures are
//! indicative; the CPU-time ratios are the robust ones.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mbx_keyless::edge::{Edge, EdgeConfig, RunningEdge};
use mbx_keyless::keys::{HashAlg, KeyOperation, KeyStore};
use mbx_keyless::server::{Authorization, KeyServer, KeyServerCore, RunningServer};
use mbx_keyless::tls::{self, DenyList};
use mbx_keyless::{ClientOptions, KeyId, KeylessClient, Opcode};
use mbx_testbed::bench::{self, cpu_delta_s, med, own_cpu_s, runtime as rt, thread_cpu_ns};
use mbx_testbed::pki::{IssuedCert, KeyType, LeafSpec, TestPki};
use mbx_testbed::relay::DelayRelay;
use plotters::prelude::*;
use rustls::pki_types::ServerName;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Runtime;

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

const REPS: usize = 5;
/// Paper §III round-trip times (ms).
const AB: f64 = 11.0;
const BC: f64 = 159.0;
const AC: f64 = 163.0;
const SITE: &str = "ec.bench.test";

/// Median, min and max of a sample; unlike the other reports, the samples are recorded sorted.
fn stats(v: &[f64]) -> Value {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    bench::stats(&s)
}

struct Bed {
    dir: tempfile::TempDir,
    edge_pki: TestPki,
    server_cert: IssuedCert,
    site: IssuedCert,
    /// (label, SKI, opcode, input length) of the keys measured in part 2.
    algs: Vec<(&'static str, [u8; 20], Opcode, KeyOperation, usize)>,
}

impl Bed {
    fn new() -> Res<Bed> {
        let dir = tempfile::tempdir()?;
        let sites = TestPki::new("sites")?;
        let server_pki = TestPki::new("keyservers")?;
        let edge_pki = TestPki::new("edges")?;
        let server_cert = server_pki.issue(&LeafSpec::server("keyserver.test"))?;
        let keys = dir.path().join("keys");
        std::fs::create_dir(&keys)?;
        let mut site = None;
        let mut algs = Vec::new();
        for (host, kt) in [
            (SITE, KeyType::EcdsaP256),
            ("rsa.bench.test", KeyType::Rsa2048),
            ("ed.bench.test", KeyType::Ed25519),
        ] {
            let cert = sites.issue(&LeafSpec::server(host).key_type(kt))?;
            std::fs::write(keys.join(format!("{host}.key")), cert.key_pem().as_bytes())?;
            std::fs::write(keys.join(format!("{host}.crt")), cert.cert_pem())?;
            std::fs::write(
                dir.path().join(format!("{host}.chain.pem")),
                cert.chain_pem(),
            )?;
            let pkey = openssl::pkey::PKey::private_key_from_pkcs8(cert.key_pkcs8_der())?;
            let ski = mbx_keyless::x509::ski_from_spki(&pkey.public_key_to_der()?)?;
            match kt {
                KeyType::EcdsaP256 => algs.push((
                    "ECDSA P-256",
                    ski,
                    Opcode::EcdsaSignSha256,
                    KeyOperation::EcdsaSign(HashAlg::Sha256),
                    32,
                )),
                KeyType::Rsa2048 => {
                    algs.push((
                        "RSA-2048 PKCS#1 SHA-256",
                        ski,
                        Opcode::RsaSignSha256,
                        KeyOperation::RsaPkcs1Sign(HashAlg::Sha256),
                        32,
                    ));
                    algs.push((
                        "RSA-2048 PSS SHA-256",
                        ski,
                        Opcode::RsaPssSignSha256,
                        KeyOperation::RsaPssSign(HashAlg::Sha256),
                        32,
                    ));
                }
                _ => algs.push((
                    "Ed25519",
                    ski,
                    Opcode::Ed25519Sign,
                    KeyOperation::Ed25519Sign,
                    // About a TLS 1.3 CertificateVerify input (64 spaces, context, hash).
                    130,
                )),
            }
            if host == SITE {
                site = Some(cert);
            }
        }
        std::fs::write(dir.path().join("sites-ca.pem"), sites.root_pem())?;
        std::fs::write(dir.path().join("keyserver-ca.pem"), server_pki.root_pem())?;
        edge_pki
            .issue(&LeafSpec::client("edge.cdn.test"))?
            .write_to_named(dir.path(), "edge")?;
        let site = site.ok_or("no site")?;
        Ok(Bed {
            dir,
            edge_pki,
            server_cert,
            site,
            algs,
        })
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn store(&self) -> Res<KeyStore> {
        Ok(KeyStore::load_dir(&self.path("keys"))?)
    }

    /// A key server with `workers` key-operation threads in `runtime`.
    fn key_server(&self, runtime: &Runtime, workers: usize) -> Res<RunningServer> {
        let authz = Authorization::from_toml(
            r#"[edges."edge.cdn.test"]
               hostnames = ["ec.bench.test", "rsa.bench.test", "ed.bench.test"]"#,
        )?;
        let tls = tls::server_config(
            self.server_cert.chain_der(),
            self.server_cert.private_key(),
            &[self.edge_pki.root_der().clone()],
            DenyList::new(),
        )?;
        let core = KeyServerCore::new(self.store()?, authz);
        let server = KeyServer::new(core, tls, workers, 256)?;
        Ok(runtime.block_on(server.bind("127.0.0.1:0".parse()?))?)
    }

    fn edge_config(&self, key_server: SocketAddr, origin: SocketAddr) -> Res<EdgeConfig> {
        let text = format!(
            "listen = \"127.0.0.1:0\"\nhandshake_workers = 64\n\
             [key_servers.main]\naddresses = [\"{key_server}\"]\nserver_name = \"keyserver.test\"\n\
             ca = {:?}\ncertificate = {:?}\nprivate_key = {:?}\nconnections = 2\n\
             timeout_ms = 5000\nhealth_interval_ms = 60000\n\
             [origins.o]\naddress = \"{origin}\"\n\
             [sites.\"{SITE}\"]\ncertificate = {:?}\nkey_server = \"main\"\norigin = \"o\"\n",
            self.path("keyserver-ca.pem"),
            self.path("edge.chain.crt"),
            self.path("edge.key"),
            self.path(&format!("{SITE}.chain.pem")),
        );
        Ok(EdgeConfig::from_toml(&text)?)
    }

    /// The client side towards the edge or a TLS server for the site: only `version`, no
    /// resumption (every handshake is full).
    fn site_client(
        &self,
        version: &'static rustls::SupportedProtocolVersion,
    ) -> Res<Arc<rustls::ClientConfig>> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.site.root_der().clone())?;
        let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_protocol_versions(&[version])?
        .with_root_certificates(roots)
        .with_no_client_auth();
        config.resumption = rustls::client::Resumption::disabled();
        Ok(Arc::new(config))
    }

    /// A plain rustls server holding the site key: the origin of topology (a) and the "key at
    /// the edge" of (b) and of part 3. Handshake, then close.
    async fn local_key_server(&self) -> Res<SocketAddr> {
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            mbx_keyless::edge::forward_secret_provider(),
        ))
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
        .with_no_client_auth()
        .with_single_cert(self.site.chain_der(), self.site.private_key())?;
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let _ = tcp.set_nodelay(true);
                    if let Ok(mut tls) = acceptor.accept(tcp).await {
                        let mut b = [0u8; 64];
                        let _ = tls.read(&mut b).await;
                    }
                });
            }
        });
        Ok(addr)
    }
}

/// A minimal HTTP origin (the edge needs one configured; the benchmarks never fetch).
async fn origin() -> Res<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut b = [0u8; 4096];
                let _ = tcp.read(&mut b).await;
                let _ = tcp
                    .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                    .await;
            });
        }
    });
    Ok(addr)
}

/// One full handshake: TCP connect to handshake complete, in ms.
async fn handshake(addr: SocketAddr, config: Arc<rustls::ClientConfig>) -> Res<f64> {
    let start = Instant::now();
    let tcp = TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    let connector = tokio_rustls::TlsConnector::from(config);
    let tls = connector
        .connect(ServerName::try_from(SITE)?.to_owned(), tcp)
        .await?;
    let ms = start.elapsed().as_secs_f64() * 1e3;
    drop(tls);
    Ok(ms)
}

/// Part 1: latency per topology, TLS 1.2 and 1.3.
fn latency(bed: &Bed) -> Res<Value> {
    let runtime = rt("bench-lat", 2)?;
    let ks_rt = rt("ks-rt", 1)?;
    let ks = bed.key_server(&ks_rt, 0)?;
    let half = |rtt: f64| Duration::from_micros((rtt * 500.0) as u64);
    let (direct, at_edge, proxied, _relays, _edge) = runtime.block_on(async {
        let origin = origin().await?;
        let local = bed.local_key_server().await?;
        let ac = DelayRelay::start(local, half(AC)).await?;
        let ab_local = DelayRelay::start(local, half(AB)).await?;
        let bc = DelayRelay::start(ks.local_addr(), half(BC)).await?;
        let edge: RunningEdge = Edge::from_config(&bed.edge_config(bc.local_addr(), origin)?)?
            .bind("127.0.0.1:0".parse()?)
            .await?;
        let ab_edge = DelayRelay::start(edge.local_addr(), half(AB)).await?;
        Res::Ok((
            ac.local_addr(),
            ab_local.local_addr(),
            ab_edge.local_addr(),
            (ac, ab_local, bc, ab_edge),
            edge,
        ))
    })?;
    let mut out = serde_json::Map::new();
    for (vname, version, k) in [
        ("TLS 1.2", &rustls::version::TLS12, 3.0),
        ("TLS 1.3", &rustls::version::TLS13, 2.0),
    ] {
        let config = bed.site_client(version)?;
        let mut rows = Vec::new();
        // `k` counts TCP's round trip like the paper does; the userspace relay cannot delay the
        // kernel's SYN/SYN-ACK, so the measured time has one client-link RTT less, which is
        // added back analytically (`with_tcp_ms`). The edge's key-server connection is
        // persistent (opened before the handshake), so the BC link costs one RTT per signature.
        for (topo, addr, predicted, client_rtt) in [
            ("direct to origin", direct, k * AC, AC),
            ("key at the edge", at_edge, k * AB, AB),
            ("proxied (Keyless)", proxied, k * AB + BC, AB),
        ] {
            // Warm-up: the edge opens its pooled key-server connections (2) on first use, and
            // a connection's own set-up through BC would otherwise land in a sample.
            for _ in 0..3 {
                runtime.block_on(handshake(addr, config.clone()))?;
            }
            let mut v = Vec::new();
            for _ in 0..REPS {
                v.push(runtime.block_on(handshake(addr, config.clone()))?);
            }
            let s = stats(&v);
            let with_tcp = med(&s) + client_rtt;
            println!(
                "latency {vname} {topo:18}: TLS median {:6.1} ms (min {:.1}, max {:.1}) \
                 [predicted {:.0}]; + TCP RTT {with_tcp:6.1} ms [predicted {predicted:.0}]",
                med(&s),
                s["min"].as_f64().unwrap_or(0.0),
                s["max"].as_f64().unwrap_or(0.0),
                predicted - client_rtt,
            );
            rows.push(json!({
                "topology": topo,
                "measured_tls_ms": s,
                "predicted_tls_ms": predicted - client_rtt,
                "tcp_rtt_added_ms": client_rtt,
                "with_tcp_ms": with_tcp,
                "predicted_ms": predicted,
                "difference_ms": with_tcp - predicted,
            }));
        }
        out.insert(vname.into(), Value::Array(rows));
    }
    drop(ks);
    ks_rt.shutdown_background();
    runtime.shutdown_background();
    Ok(Value::Object(out))
}

/// Part 2: key-server signs per CPU-second against in-process signing.
fn signing(bed: &Bed) -> Res<Value> {
    let store = bed.store()?;
    let load = rt("load", 1)?;
    let mut rows = Vec::new();
    for (name, ski, opcode, op, len) in bed.algs.clone() {
        if let Ok(only) = std::env::var("KEYLESS_BENCH_SIGNING") {
            if !name.starts_with(&only) {
                continue;
            }
        }
        let key = store.by_ski(&ski).ok_or("key missing")?.clone();
        let input = vec![0x5a; len];
        // Ceiling: the same KeyHandle::perform on this one thread, per thread-CPU-second. One
        // ceiling sample is taken right before each network sample, so that both see the same
        // machine load (the cores are shared).
        let ceiling_sample = || -> Res<f64> {
            let (c0, t0) = (own_cpu_s(), Instant::now());
            let mut n = 0u64;
            while t0.elapsed() < Duration::from_millis(400) {
                key.perform(op, &input)?;
                n += 1;
            }
            Ok(n as f64 / (own_cpu_s() - c0).max(1e-9))
        };
        let mut ceiling = Vec::new();
        // Network: one key server with one worker thread and one reactor thread.
        let ks_rt = rt("ks-rt", 1)?;
        let ks = bed.key_server(&ks_rt, 1)?;
        let addr = ks.local_addr();
        let client_tls = tls::client_config(
            &[bed.server_cert.root_der().clone()],
            Some((
                tls::load_certificates(&bed.path("edge.chain.crt"))?,
                tls::load_private_key(&bed.path("edge.key"))?,
            )),
            &[],
        )?;
        let clients: Vec<Arc<KeylessClient>> = load.block_on(async {
            let mut v = Vec::new();
            for _ in 0..4 {
                v.push(Arc::new(
                    KeylessClient::connect(
                        addr,
                        ServerName::try_from("keyserver.test")?.to_owned(),
                        client_tls.clone(),
                        ClientOptions::default(),
                    )
                    .await?,
                ));
            }
            Res::Ok(v)
        })?;
        let (mut wall, mut per_cpu, mut per_worker_cpu) = (Vec::new(), Vec::new(), Vec::new());
        let (mut pair_ratio, mut pair_ratio_worker) = (Vec::new(), Vec::new());
        for rep in 0..=REPS {
            let c = ceiling_sample()?;
            let done = Arc::new(AtomicU64::new(0));
            let stop = Arc::new(AtomicBool::new(false));
            let before = thread_cpu_ns(&["ks-rt", "keyless-worker"]);
            let wb = thread_cpu_ns(&["keyless-worker"]);
            let t0 = Instant::now();
            load.block_on(async {
                let mut tasks = Vec::new();
                // 4 connections × 32 requests in flight each.
                for c in &clients {
                    for _ in 0..32 {
                        let (c, done, stop, input) =
                            (c.clone(), done.clone(), stop.clone(), input.clone());
                        let id = KeyId::ski(ski);
                        tasks.push(tokio::spawn(async move {
                            while !stop.load(Ordering::Relaxed) {
                                if c.sign(&id, opcode, &input).await.is_ok() {
                                    done.fetch_add(1, Ordering::Relaxed);
                                }
                            }
                        }));
                    }
                }
                tokio::time::sleep(Duration::from_millis(1500)).await;
                stop.store(true, Ordering::Relaxed);
                for t in tasks {
                    let _ = t.await;
                }
            });
            let secs = t0.elapsed().as_secs_f64();
            let n = done.load(Ordering::Relaxed) as f64;
            let cpu = cpu_delta_s(&before, &thread_cpu_ns(&["ks-rt", "keyless-worker"]));
            let wcpu = cpu_delta_s(&wb, &thread_cpu_ns(&["keyless-worker"]));
            if rep == 0 {
                continue; // warm-up
            }
            ceiling.push(c);
            wall.push(n / secs);
            per_cpu.push(n / cpu.max(1e-9));
            per_worker_cpu.push(n / wcpu.max(1e-9));
            pair_ratio.push(n / cpu.max(1e-9) / c);
            pair_ratio_worker.push(n / wcpu.max(1e-9) / c);
        }
        drop(clients);
        drop(ks);
        ks_rt.shutdown_background();
        let (c, w, pc, pw) = (
            stats(&ceiling),
            stats(&wall),
            stats(&per_cpu),
            stats(&per_worker_cpu),
        );
        let ratio = med(&pc) / med(&c);
        let ratio_worker = med(&pw) / med(&c);
        let (pr, prw) = (stats(&pair_ratio), stats(&pair_ratio_worker));
        let range = |v: &Value| {
            format!(
                "{:.2}-{:.2}",
                v["min"].as_f64().unwrap_or(0.0),
                v["max"].as_f64().unwrap_or(0.0)
            )
        };
        println!(
            "signing {name:24}: in-process {:8.0}/CPU-s | network {:8.0}/s wall, {:8.0}/server-CPU-s (ratio {ratio:.2}; per rep {:.2}, {}), {:8.0}/worker-CPU-s (ratio {ratio_worker:.2}; per rep {:.2}, {})",
            med(&c),
            med(&w),
            med(&pc),
            med(&pr),
            range(&pr),
            med(&pw),
            med(&prw),
            range(&prw),
        );
        rows.push(json!({
            "algorithm": name,
            "in_process_per_cpu_s": c,
            "network_per_wall_s": w,
            "network_per_server_cpu_s": pc,
            "network_per_worker_cpu_s": pw,
            "ratio_server_cpu": ratio,
            "ratio_worker_cpu": ratio_worker,
            "ratio_server_cpu_per_rep": pr,
            "ratio_worker_cpu_per_rep": prw,
        }));
    }
    load.shutdown_background();
    Ok(Value::Array(rows))
}

/// Full TLS 1.3 handshakes per second against `addr` with `conc` concurrent clients.
fn handshake_rate(
    load: &Runtime,
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
    conc: usize,
) -> f64 {
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let t0 = Instant::now();
    load.block_on(async {
        let mut tasks = Vec::new();
        for _ in 0..conc {
            let (done, stop, config) = (done.clone(), stop.clone(), config.clone());
            tasks.push(tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    if handshake(addr, config.clone()).await.is_ok() {
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }));
        }
        tokio::time::sleep(Duration::from_millis(1500)).await;
        stop.store(true, Ordering::Relaxed);
        for t in tasks {
            let _ = t.await;
        }
    });
    done.load(Ordering::Relaxed) as f64 / t0.elapsed().as_secs_f64()
}

/// Part 3: edge handshakes per second, local key server vs key held locally.
fn edge_rate(bed: &Bed) -> Res<Value> {
    let ks_rt = rt("ks-rt", 1)?;
    let ks = bed.key_server(&ks_rt, 1)?;
    let server_rt = rt("srv", 1)?;
    let load = rt("load", 1)?;
    let (edge, local) = server_rt.block_on(async {
        let origin = origin().await?;
        let edge = Edge::from_config(&bed.edge_config(ks.local_addr(), origin)?)?
            .bind("127.0.0.1:0".parse()?)
            .await?;
        Res::Ok((edge, bed.local_key_server().await?))
    })?;
    let config = bed.site_client(&rustls::version::TLS13)?;
    let (mut e, mut l) = (Vec::new(), Vec::new());
    handshake_rate(&load, edge.local_addr(), config.clone(), 16);
    handshake_rate(&load, local, config.clone(), 16);
    for _ in 0..REPS {
        e.push(handshake_rate(&load, edge.local_addr(), config.clone(), 16));
        l.push(handshake_rate(&load, local, config.clone(), 16));
    }
    drop(edge);
    drop(ks);
    ks_rt.shutdown_background();
    server_rt.shutdown_background();
    load.shutdown_background();
    let (e, l) = (stats(&e), stats(&l));
    let ratio = med(&e) / med(&l);
    println!(
        "edge TLS 1.3 ECDSA P-256: keyless {:.0}/s, key held locally {:.0}/s, ratio {ratio:.2}",
        med(&e),
        med(&l)
    );
    Ok(json!({
        "protocol": "TLS 1.3, ECDSA P-256, 16 concurrent clients",
        "keyless_edge_per_s": e,
        "local_key_per_s": l,
        "ratio": ratio,
    }))
}

/// Three panels: latency measured vs predicted (ms), signing ratios, edge handshake ratio.
fn plot(report: &Value, path: &Path) -> Res<()> {
    let root = BitMapBackend::new(path, (1100, 900)).into_drawing_area();
    root.fill(&WHITE)?;
    if let Some(font) = bench::sans_font() {
        plotters::style::register_font("sans-serif", FontStyle::Normal, font)
            .map_err(|_| "font")?;
    }
    let (top, bottom) = root.split_vertically(520);
    // Rows: (label, value, predicted or reference, lo, hi).
    let mut lat = Vec::new();
    for v in ["TLS 1.2", "TLS 1.3"] {
        for r in report["latency"][v].as_array().cloned().unwrap_or_default() {
            let m = &r["measured_tls_ms"];
            let tcp = r["tcp_rtt_added_ms"].as_f64().unwrap_or(0.0);
            lat.push((
                format!("{v} {}", r["topology"].as_str().unwrap_or("")),
                med(m) + tcp,
                r["predicted_ms"].as_f64().unwrap_or(0.0),
                m["min"].as_f64().unwrap_or(0.0) + tcp,
                m["max"].as_f64().unwrap_or(0.0) + tcp,
            ));
        }
    }
    let mut ratios = Vec::new();
    for r in report["signing"].as_array().cloned().unwrap_or_default() {
        let a = r["algorithm"].as_str().unwrap_or("");
        ratios.push((
            format!("{a} / server CPU"),
            r["ratio_server_cpu"].as_f64().unwrap_or(0.0),
        ));
        ratios.push((
            format!("{a} / worker CPU"),
            r["ratio_worker_cpu"].as_f64().unwrap_or(0.0),
        ));
    }
    ratios.push((
        "edge handshakes/s keyless / local key".into(),
        report["edge"]["ratio"].as_f64().unwrap_or(0.0),
    ));
    let label_style = ("sans-serif", 15).into_font();
    bars(&top, "handshake latency incl. 1 TCP RTT, ms (red: measured median, whisker min-max; blue: predicted)", &lat, 600.0, &label_style)?;
    let rows: Vec<_> = ratios
        .iter()
        .map(|(l, v)| (l.clone(), *v, 0.0, *v, *v))
        .collect();
    bars(
        &bottom,
        "ratio to in-process / local key (1.0 = ceiling)",
        &rows,
        1.2,
        &label_style,
    )?;
    root.present()?;
    Ok(())
}

fn bars<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
    rows: &[(String, f64, f64, f64, f64)],
    max: f64,
    label_style: &FontDesc,
) -> Res<()>
where
    DB::ErrorType: 'static,
{
    let (left, right) = area.split_horizontally(380);
    let n = rows.len() as i32;
    let h = area.dim_in_pixel().1 as i32 - 70;
    for (i, r) in rows.iter().enumerate() {
        let y = 30 + (h * i as i32) / n.max(1) + h / (2 * n.max(1));
        let _ = left.draw(&Text::new(r.0.clone(), (6, y), label_style.clone()));
    }
    let mut chart = ChartBuilder::on(&right)
        .caption(title, ("sans-serif", 15))
        .margin(10)
        .x_label_area_size(30)
        .build_cartesian_2d(0.0..max, 0.0..n as f64)
        .map_err(|e| e.to_string())?;
    let _ = chart.configure_mesh().disable_y_mesh().draw();
    for (i, r) in rows.iter().enumerate() {
        let y = (n - 1 - i as i32) as f64;
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(0.0, y + 0.2), (r.1.min(max), y + 0.8)],
                RED.mix(0.6).filled(),
            )))
            .map_err(|e| e.to_string())?;
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(r.3.min(max), y + 0.5), (r.4.min(max), y + 0.5)],
                BLACK.stroke_width(3),
            )))
            .map_err(|e| e.to_string())?;
        if r.2 > 0.0 {
            chart
                .draw_series(std::iter::once(PathElement::new(
                    vec![(r.2.min(max), y + 0.1), (r.2.min(max), y + 0.9)],
                    BLUE.stroke_width(4),
                )))
                .map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}

fn main() -> Res<()> {
    let started = Instant::now();
    let bed = Bed::new()?;
    if std::env::var_os("KEYLESS_BENCH_SIGNING").is_some() {
        // Part 2 only, for the algorithms named, printed and not written.
        signing(&bed)?;
        return Ok(());
    }
    let latency = latency(&bed)?;
    let signing = signing(&bed)?;
    let edge = edge_rate(&bed)?;
    let report = json!({
        "machine": {
            "cpu": bench::cpu_name(),
            "cores": bench::cores(),
        },
        "repetitions": REPS,
        "rtt_ms": {"AB": AB, "BC": BC, "AC": AC},
        "paper_ms": {"direct": 496, "key at the edge": 64, "proxied": 395},
        "latency": latency,
        "signing": signing,
        "edge": edge,
        "runtime_s": started.elapsed().as_secs_f64(),
    });
    let out = mbx_testbed::bench::write_report("keyless", &report)?;
    plot(&report, &out.join("keyless.png"))?;
    println!(
        "wrote docs/bench/keyless.json and keyless.png in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
