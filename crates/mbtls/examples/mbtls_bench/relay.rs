//! Benchmark 2 (paper Figure 7): middlebox relay throughput with 16 KB records, TLS 1.3
//! TLS_AES_256_GCM_SHA384, as bytes relayed per CPU-second of the middlebox, next to the
//! single-core AES-256-GCM rate of `openssl speed` (and of aws-lc-rs, the AEAD our record layer uses),
//! measured right before each sample so both see the same machine load.
//!
//! - In process (one thread): [`MiddleboxRelay`] (decrypt + re-encrypt) over pre-encrypted
//!   records of several connections, and a copy of the same bytes (forward-only, the passive
//!   middlebox).
//! - Over TCP on loopback: the [`MiddleboxServer`] driver in a runtime of its own (one thread,
//!   whose CPU is the middlebox's), several mbTLS clients → it → a TLS sink; forward-only is a
//!   plain TCP relay in the same runtime between plain TLS clients and the sink. The endpoints
//!   run in another runtime and share the 2 cores with it.

use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mbx_apps::{HttpHeaderInsert, MiddleboxApp, PassThrough};
use mbx_engine::Role;
use mbx_mbtls::driver::{
    AppFactory, MbtlsClient, MiddleboxServer, MiddleboxServerConfig, Placement,
};
use mbx_mbtls::handshake::ClientMiddlebox;
use mbx_mbtls::{client_side_keys, EndpointDataPhase, HopKeys, MiddleboxRelay, Side};
use mbx_record::{CipherSuite, TlsVersion};
use mbx_testbed::bench::{cpu_delta_s, med, runtime as rt, stats, thread_cpu_ns};
use serde_json::{json, Value};
use tokio::runtime::Runtime;

use crate::setup::{Setup, CLIENT_SIDE};
use crate::tls_io::{tcp_relay, tls_server, wait_for, Serve, TlsClient};
use crate::Res;
use mbx_testbed::bench::calling_thread_cpu_ns as thread_ns;

const RECORD: usize = 16 * 1024;
/// Bytes handed to the middlebox per receive call (the driver reads 32 KiB at a time).
const CHUNK: usize = 32 * 1024;
const CONNS: usize = 4;
/// Plaintext per connection per sample, in process and over TCP.
const IN_PROCESS_BYTES: usize = 24 << 20;
const TCP_BYTES: usize = 16 << 20;

/// `openssl speed -evp aes-256-gcm -bytes 16384 -seconds 3`: bytes per (user) CPU-second.
fn openssl_speed() -> Res<f64> {
    let out = Command::new("openssl")
        .args([
            "speed",
            "-evp",
            "aes-256-gcm",
            "-bytes",
            "16384",
            "-seconds",
            "3",
            "-mr",
        ])
        .output()?;
    // Machine-readable result: "+F:<n>:AES-256-GCM:<bytes per second for 16384-byte blocks>".
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.strip_prefix("+F:"))
        .and_then(|l| l.rsplit(':').next())
        .and_then(|v| v.trim().parse::<f64>().ok())
        .ok_or_else(|| format!("cannot parse openssl speed output: {text}").into())
}

/// The record layer's AEAD (aws-lc-rs) AES-256-GCM sealing 16 KB buffers on this thread for ~0.3 s: bytes per CPU-second.
fn aead_speed() -> Res<f64> {
    use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};
    let key = LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &[7u8; 32]).map_err(|_| "key")?);
    let mut buf = vec![0x5au8; RECORD];
    let (c0, t0) = (thread_ns(), Instant::now());
    let mut n = 0u64;
    while t0.elapsed() < Duration::from_millis(300) {
        let mut nonce = [0u8; 12];
        nonce[4..].copy_from_slice(&n.to_be_bytes());
        let tag = key
            .seal_in_place_separate_tag(Nonce::assume_unique_for_key(nonce), Aad::empty(), &mut buf)
            .map_err(|_| "seal")?;
        let _ = std::hint::black_box(tag);
        n += 1;
    }
    Ok((n as usize * RECORD) as f64 / ((thread_ns() - c0) as f64 / 1e9))
}

type Relay = MiddleboxRelay<Box<dyn MiddleboxApp>>;

/// What the in-process relays carry: the app, the direction, and what the sender writes
/// before its 16 KB records.
struct Traffic {
    app: fn() -> Box<dyn MiddleboxApp>,
    from: Side,
    head: &'static [u8],
}

impl Traffic {
    const PASS_THROUGH: Traffic = Traffic {
        app: || Box::new(PassThrough),
        from: Side::Client,
        head: b"",
    };
    /// The paper's header-inserting proxy, one request whose body is the records.
    const HTTP_UPLOAD: Traffic = Traffic {
        app: http_app,
        from: Side::Client,
        head: b"PUT /upload HTTP/1.1\r\nHost: server.test\r\nContent-Length: 25165824\r\n\r\n",
    };
    /// The same proxy, a response whose body is the records.
    const HTTP_DOWNLOAD: Traffic = Traffic {
        app: http_app,
        from: Side::Server,
        head: b"HTTP/1.1 200 OK\r\nContent-Length: 25165824\r\n\r\n",
    };
}

// The Content-Length of the HTTP traffic above: its body is exactly the records.
const _: () = assert!(IN_PROCESS_BYTES == 25_165_824);

/// Bytes per CPU-second passed on as the driver does ([`Feed::PassedOn`]): pass-through, and
/// the header-inserting proxy uploading and downloading.
fn passed_on_rates() -> Res<[f64; 3]> {
    let plaintext = (CONNS * IN_PROCESS_BYTES) as f64;
    Ok([
        plaintext / relay_pass(&Traffic::PASS_THROUGH, Feed::PassedOn)?,
        plaintext / relay_pass(&Traffic::HTTP_UPLOAD, Feed::PassedOn)?,
        plaintext / relay_pass(&Traffic::HTTP_DOWNLOAD, Feed::PassedOn)?,
    ])
}

fn http_app() -> Box<dyn MiddleboxApp> {
    Box::new(HttpHeaderInsert::new("X-Mbtls", "mb.test").expect("valid header"))
}

/// Relays and the pre-encrypted byte stream each receives from `traffic.from`.
fn relays_with(traffic: &Traffic) -> Res<Vec<(Relay, Vec<u8>)>> {
    let (version, suite) = (TlsVersion::Tls13, CipherSuite::TLS13_AES_256_GCM_SHA384);
    let record = vec![0x5au8; RECORD];
    let mut out = Vec::new();
    for _ in 0..CONNS {
        let bridge = HopKeys::generate(version, &suite, 3, 5)?;
        let mut side = client_side_keys(version, suite, bridge.clone(), 1)?;
        let km = side.middleboxes.pop().ok_or("no key material")?;
        // With one client-side middlebox the server's hop runs on the bridge keys.
        let mut sender = match traffic.from {
            Side::Client => EndpointDataPhase::new(Role::Client, version, side.endpoint),
            Side::Server => EndpointDataPhase::new(Role::Server, version, bridge),
        };
        let mut stream = Vec::with_capacity(IN_PROCESS_BYTES + IN_PROCESS_BYTES / 500);
        if !traffic.head.is_empty() {
            sender.write(traffic.head)?;
            stream.extend(sender.take_outgoing());
        }
        for _ in 0..IN_PROCESS_BYTES / RECORD {
            sender.write(&record)?;
            stream.extend(sender.take_outgoing());
        }
        out.push((MiddleboxRelay::new(km, (traffic.app)())?, stream));
    }
    Ok(out)
}

/// Bytes per CPU-second through the relays (decrypt + re-encrypt): chunks lent mutably, as the
/// driver lends its read buffer (records opened in place), and chunks borrowed (copied into the
/// relay's buffer first); and through a copy (forward-only). The output goes to one reused
/// buffer per connection, as the driver's writers hand theirs back.
fn in_process() -> Res<(f64, f64, f64)> {
    let dec_enc = relay_pass(&Traffic::PASS_THROUGH, Feed::Lent)?;
    let dec_enc_copy = relay_pass(&Traffic::PASS_THROUGH, Feed::Copied)?;
    let rs = relays_with(&Traffic::PASS_THROUGH)?;
    let chunks = chunk_count(&rs);
    let t = thread_ns();
    let mut copied = 0usize;
    for k in 0..chunks {
        for (_, stream) in rs.iter() {
            if let Some(chunk) = stream.chunks(CHUNK).nth(k) {
                copied += std::hint::black_box(chunk.to_vec()).len();
            }
        }
    }
    let forward = (thread_ns() - t) as f64 / 1e9;
    let plaintext = (CONNS * IN_PROCESS_BYTES) as f64;
    let _ = copied;
    Ok((
        plaintext / dec_enc,
        plaintext / dec_enc_copy,
        plaintext / forward,
    ))
}

fn chunk_count(rs: &[(Relay, Vec<u8>)]) -> usize {
    rs.iter()
        .map(|(_, s)| s.len().div_ceil(CHUNK))
        .max()
        .unwrap_or(0)
}

/// How the relays get their input.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Feed {
    /// Borrowed (`receive`): copied into the relay's buffer first.
    Copied,
    /// Lent mutably (`receive_in_place`): records opened where they lie.
    Lent,
    /// Lent as the middlebox driver lends its read buffer (`receive_lending`): records the app
    /// lets through unchanged are sealed again where they lie and sent from there.
    PassedOn,
}

/// CPU seconds for the relays to process their streams of `traffic`, fed as `feed` says.
fn relay_pass(traffic: &Traffic, feed: Feed) -> Res<f64> {
    let mut rs = relays_with(traffic)?;
    let total: usize = rs.iter().map(|(_, s)| s.len()).sum();
    // Connections interleaved chunk by chunk, as a middlebox serving them at once would.
    let chunks = chunk_count(&rs);
    let mut outs: Vec<Vec<u8>> = vec![Vec::new(); rs.len()];
    let (from, to) = (traffic.from, traffic.from.other());
    let t = thread_ns();
    let mut relayed = 0usize;
    for k in 0..chunks {
        for ((relay, stream), out) in rs.iter_mut().zip(outs.iter_mut()) {
            let Some(chunk) = stream.chunks_mut(CHUNK).nth(k) else {
                continue;
            };
            let range = match feed {
                Feed::Copied => {
                    relay.receive(from, chunk);
                    None
                }
                Feed::Lent => {
                    relay.receive_in_place(from, chunk);
                    None
                }
                Feed::PassedOn => relay.receive_lending(from, chunk),
            };
            relay.append_outgoing(to, out);
            relayed += std::hint::black_box(&out).len();
            out.clear();
            if let Some(r) = range {
                relayed += std::hint::black_box(chunk.get(r).unwrap_or_default()).len();
            }
        }
    }
    let secs = (thread_ns() - t) as f64 / 1e9;
    // Records keep their size, except that an upload's head gains the inserted header.
    let short = if traffic.head.is_empty() {
        relayed != total
    } else {
        relayed < total
    };
    if rs.iter().any(|(r, _)| r.is_failed()) || short {
        return Err(format!("relay failed: {relayed} of {total} bytes").into());
    }
    Ok(secs)
}

/// The in-process relay `n` times, printed (for profiling the relay under `perf`).
pub fn in_process_only(n: usize) -> Res<()> {
    for _ in 0..n {
        let (dec_enc, dec_enc_copy, fwd) = in_process()?;
        let [lent, up, down] = passed_on_rates()?;
        println!(
            "in-process dec+enc {:.0} MB/CPU-s (copied in: {:.0}; passed on: {:.0}, http-header upload {:.0}, download {:.0}), forward {:.0}, aws-lc-rs seal {:.0}",
            dec_enc / 1e6,
            dec_enc_copy / 1e6,
            lent / 1e6,
            up / 1e6,
            down / 1e6,
            fwd / 1e6,
            aead_speed()? / 1e6
        );
    }
    Ok(())
}

/// One middlebox and one TCP relay in front of one sink.
struct Path {
    _mbox: MiddleboxServer,
    mbox_addr: std::net::SocketAddr,
    relay_addr: std::net::SocketAddr,
    sink: Arc<AtomicU64>,
}

/// What the sink does with the records.
#[derive(Clone, Copy, PartialEq, Eq)]
enum SinkKind {
    /// Decrypts them (OpenSSL): the endpoints cost about what the middlebox does, so it often
    /// waits for data and pays a wake-up and two system calls for every record or two.
    Decrypt,
    /// Skips them by their headers: the middlebox is the bottleneck, as in paper Figure 7.
    Discard,
}

struct Tcp {
    load: Runtime,
    _mbox_rt: Runtime,
    decrypt: Path,
    discard: Path,
    /// The middlebox runs the header-inserting HTTP app; the sink decrypts.
    http: Path,
    setup_client: mbx_mbtls::handshake::ClientHandshakeConfig,
    tls_client: Arc<mbx_engine::OpenSslContext>,
}

impl Tcp {
    fn new(setup: &Setup) -> Res<Tcp> {
        let version = TlsVersion::Tls13;
        let load = rt("load", 1)?;
        let mbox_rt = rt("mbox-rt", 1)?;
        let path = |kind: SinkKind, http: bool| -> Res<Path> {
            let sink = Arc::new(AtomicU64::new(0));
            let serve = match kind {
                SinkKind::Decrypt => Serve::Sink(sink.clone()),
                SinkKind::Discard => Serve::Discard(sink.clone()),
            };
            let server = load.block_on(tls_server(setup.tls_server(version)?, serve))?;
            let app: AppFactory = if http {
                Arc::new(|| {
                    Box::new(HttpHeaderInsert::new("X-Mbtls", "mb.test").expect("valid header"))
                        as Box<dyn MiddleboxApp + Send>
                })
            } else {
                Arc::new(|| Box::new(PassThrough) as Box<dyn MiddleboxApp + Send>)
            };
            let cfg = MiddleboxServerConfig {
                handshake: setup.middlebox(CLIENT_SIDE[0], true)?,
                next_hop: server.to_string().into(),
                app,
                placement: Placement::ClientSide,
                limits: mbx_mbtls::driver::Limits::default(),
                forget_legacy_after: None,
            };
            let mbox = mbox_rt.block_on(MiddleboxServer::bind("127.0.0.1:0", cfg))?;
            let relay_addr = mbox_rt.block_on(tcp_relay(server))?;
            Ok(Path {
                mbox_addr: mbox.local_addr(),
                _mbox: mbox,
                relay_addr,
                sink,
            })
        };
        Ok(Tcp {
            decrypt: path(SinkKind::Decrypt, false)?,
            discard: path(SinkKind::Discard, false)?,
            http: path(SinkKind::Decrypt, true)?,
            setup_client: setup.mbtls_client(
                version,
                ClientMiddlebox::Preconfigured(CLIENT_SIDE[0].into()),
                true,
            )?,
            tls_client: setup.tls_client(version)?,
            load,
            _mbox_rt: mbox_rt,
        })
    }

    /// One sample: `CONNS` connections each send `TCP_BYTES` in 16 KB writes. Returns bytes per
    /// CPU-second of the middlebox runtime, with mbTLS (true) or through the TCP relay.
    fn sample(&self, mbtls: bool, kind: SinkKind) -> Res<Sample> {
        let path = match kind {
            SinkKind::Decrypt => &self.decrypt,
            SinkKind::Discard => &self.discard,
        };
        self.sample_on(path, mbtls, b"")
    }

    /// The same through the middlebox running the HTTP app: each connection is one PUT whose
    /// Content-Length body is its records (the app inserts its header into the head, which is
    /// sent before the CPU window, and lets the body through unchanged).
    fn sample_http(&self) -> Res<Sample> {
        self.sample_on(&self.http, true, HTTP_UPLOAD_HEAD)
    }

    fn sample_on(&self, path: &Path, mbtls: bool, head: &[u8]) -> Res<Sample> {
        let record = vec![0x5au8; RECORD];
        // What the sink receives before the window: the head (with the inserted header) and
        // one record per connection.
        let inserted = if head.is_empty() {
            0
        } else {
            HTTP_INSERTED.len()
        };
        let warm = (head.len() + inserted + RECORD) as u64;
        path.sink.store(0, Ordering::Relaxed);
        self.load.block_on(async {
            // Connect and push one record each, so every handshake (and key installation at
            // the middlebox) is over before the CPU window opens.
            let mut writers: Vec<Box<dyn Writer>> = Vec::new();
            for _ in 0..CONNS {
                if mbtls {
                    let mut c =
                        MbtlsClient::connect(path.mbox_addr, self.setup_client.clone()).await?;
                    if !head.is_empty() {
                        c.write_all(head).await?;
                    }
                    c.write_all(&record).await?;
                    writers.push(Box::new(c));
                } else {
                    let c = TlsClient::connect(path.relay_addr, &self.tls_client, &record).await?;
                    writers.push(Box::new(c));
                }
            }
            wait_for(&path.sink, warm * CONNS as u64).await?;
            let before = thread_cpu_ns(&["mbox-rt"]);
            let wall = Instant::now();
            let mut tasks = Vec::new();
            for mut w in writers {
                let record = record.clone();
                tasks.push(tokio::spawn(async move {
                    for _ in 0..TCP_BYTES / RECORD {
                        w.send(&record).await?;
                    }
                    Res::Ok(w)
                }));
            }
            let mut keep = Vec::new();
            for t in tasks {
                keep.push(t.await.map_err(|e| e.to_string())??);
            }
            wait_for(&path.sink, (warm + TCP_BYTES as u64) * CONNS as u64).await?;
            let cpu = cpu_delta_s(&before, &thread_cpu_ns(&["mbox-rt"]));
            let busy = cpu / wall.elapsed().as_secs_f64().max(1e-9);
            drop(keep);
            Ok(Sample {
                per_cpu_s: (CONNS * TCP_BYTES) as f64 / cpu.max(1e-9),
                busy,
            })
        })
    }
}

/// The HTTP path's request head: its body is the warm-up record and the sample's records.
const HTTP_UPLOAD_HEAD: &[u8] =
    b"PUT /upload HTTP/1.1\r\nHost: server.test\r\nContent-Length: 16793600\r\n\r\n";
/// What the HTTP app inserts into it.
const HTTP_INSERTED: &[u8] = b"X-Mbtls: mb.test\r\n";
const _: () = assert!(RECORD + TCP_BYTES == 16_793_600);

/// One TCP sample.
struct Sample {
    /// Plaintext bytes relayed per CPU-second of the middlebox runtime.
    per_cpu_s: f64,
    /// The middlebox runtime's CPU time over the wall time of the sample (1.0 = saturated).
    busy: f64,
}

/// Either client, for the throughput loop.
trait Writer: Send {
    fn send<'a>(
        &'a mut self,
        data: &'a [u8],
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Res<()>> + Send + 'a>>;
}

impl Writer for MbtlsClient {
    fn send<'a>(
        &'a mut self,
        data: &'a [u8],
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Res<()>> + Send + 'a>> {
        Box::pin(async move { Ok(self.write_all(data).await?) })
    }
}

impl Writer for TlsClient {
    fn send<'a>(
        &'a mut self,
        data: &'a [u8],
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Res<()>> + Send + 'a>> {
        Box::pin(self.write_all(data))
    }
}

/// For profiling: only the middlebox-bound mbTLS relay over TCP, `n` samples, printed.
pub fn tcp_bound_only(setup: &Setup, n: usize) -> Res<()> {
    let tcp = Tcp::new(setup)?;
    for i in 0..n {
        let x = tcp.sample(true, SinkKind::Discard)?;
        println!(
            "middlebox-bound TCP dec+enc sample {i}: {:.0} MB/CPU-s, middlebox busy {:.0}%",
            x.per_cpu_s / 1e6,
            x.busy * 100.0
        );
    }
    Ok(())
}

pub fn run(setup: &Setup, reps: usize) -> Res<Value> {
    let tcp = Tcp::new(setup)?;
    let names = [
        "openssl_speed",
        "aead_seal",
        "in_process_dec_enc",
        "in_process_dec_enc_copied_in",
        "in_process_forward",
        "in_process_passed_on",
        "in_process_http_upload_passed_on",
        "in_process_http_download_passed_on",
        "tcp_dec_enc",
        "tcp_http_upload_dec_enc",
        "tcp_forward",
        "tcp_dec_enc_mbox_bound",
        "tcp_forward_mbox_bound",
    ];
    let mut v: Vec<Vec<f64>> = vec![Vec::new(); names.len()];
    let mut ratio_dec_enc = Vec::new();
    let mut ratio_tcp = Vec::new();
    let mut ratio_tcp_bound = Vec::new();
    let mut busy_bound = Vec::new();
    for rep in 0..=reps {
        let speed = openssl_speed()?;
        let aead = aead_speed()?;
        let (dec_enc, dec_enc_copy, fwd) = in_process()?;
        let [lent, up, down] = passed_on_rates()?;
        let tcp_dec_enc = tcp.sample(true, SinkKind::Decrypt)?.per_cpu_s;
        let tcp_http = tcp.sample_http()?.per_cpu_s;
        let tcp_fwd = tcp.sample(false, SinkKind::Decrypt)?.per_cpu_s;
        let bound = tcp.sample(true, SinkKind::Discard)?;
        let tcp_dec_enc_bound = bound.per_cpu_s;
        let tcp_fwd_bound = tcp.sample(false, SinkKind::Discard)?.per_cpu_s;
        if rep == 0 {
            continue; // warm-up
        }
        busy_bound.push(bound.busy);
        for (slot, x) in v.iter_mut().zip([
            speed,
            aead,
            dec_enc,
            dec_enc_copy,
            fwd,
            lent,
            up,
            down,
            tcp_dec_enc,
            tcp_http,
            tcp_fwd,
            tcp_dec_enc_bound,
            tcp_fwd_bound,
        ]) {
            slot.push(x / 1e6);
        }
        ratio_dec_enc.push(dec_enc / speed);
        ratio_tcp.push(tcp_dec_enc / speed);
        ratio_tcp_bound.push(tcp_dec_enc_bound / speed);
        println!(
            "relay rep {rep}: openssl {:.0} MB/s, aws-lc-rs {:.0} MB/s | in-process dec+enc {:.0} MB/CPU-s ({:.2} of openssl; copied in {:.0}; passed on {:.0}, http-header upload {:.0}, download {:.0}), forward {:.0} | TCP dec+enc {:.0} ({:.2}), http-header upload {:.0}, forward {:.0} | middlebox-bound: dec+enc {:.0} ({:.2}), forward {:.0}",
            speed / 1e6,
            aead / 1e6,
            dec_enc / 1e6,
            dec_enc / speed,
            dec_enc_copy / 1e6,
            lent / 1e6,
            up / 1e6,
            down / 1e6,
            fwd / 1e6,
            tcp_dec_enc / 1e6,
            tcp_dec_enc / speed,
            tcp_http / 1e6,
            tcp_fwd / 1e6,
            tcp_dec_enc_bound / 1e6,
            tcp_dec_enc_bound / speed,
            tcp_fwd_bound / 1e6
        );
    }
    let mut out = serde_json::Map::new();
    for (n, s) in names.iter().zip(&v) {
        out.insert(format!("{n}_mb_per_cpu_s"), stats(s));
    }
    let r = stats(&ratio_dec_enc);
    let rt_ = stats(&ratio_tcp);
    out.insert(
        "in_process_dec_enc_over_openssl".into(),
        json!({"per_rep": r, "of_two_pass_ceiling": med(&r) * 2.0}),
    );
    out.insert(
        "tcp_dec_enc_over_openssl".into(),
        json!({"per_rep": rt_, "of_two_pass_ceiling": med(&rt_) * 2.0}),
    );
    let rb = stats(&ratio_tcp_bound);
    out.insert(
        "tcp_dec_enc_mbox_bound_over_openssl".into(),
        json!({"per_rep": rb, "of_two_pass_ceiling": med(&rb) * 2.0}),
    );
    out.insert(
        "tcp_dec_enc_mbox_bound_busy".into(),
        json!({"what": "middlebox CPU time / wall time", "per_rep": stats(&busy_bound)}),
    );
    out.insert(
        "setup".into(),
        json!({
            "version": "TLS 1.3", "suite": "TLS_AES_256_GCM_SHA384", "record_bytes": RECORD,
            "connections": CONNS, "in_process_bytes_per_conn": IN_PROCESS_BYTES,
            "tcp_bytes_per_conn": TCP_BYTES, "chunk_bytes": CHUNK, "app": "PassThrough",
            "in_process_input": "chunks lent mutably (receive_in_place); copied_in: borrowed (receive); passed_on: lent with receive_lending, records the app lets through unchanged sealed again where they lie (what the driver does)",
            "in_process_http": "HttpHeaderInsert (X-Mbtls: mb.test): upload = one PUT whose Content-Length body is the records (client to server), download = one response whose body is the records (server to client)",
            "tcp_http_upload": "the TCP sample through a middlebox running HttpHeaderInsert: each connection is one PUT whose Content-Length body is its records (the head is sent before the CPU window); the sink decrypts",
            "direction": "client to server",
            "sinks": "tcp_*: the sink decrypts (OpenSSL); *_mbox_bound: the sink skips records by their headers, so the middlebox is the bottleneck",
        }),
    );
    drop(tcp);
    Ok(Value::Object(out))
}
