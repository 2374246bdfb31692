//! `mbx demo`: every party on loopback, and what happened on the wire.
//!
//! For each case, a client and a server (our OpenSSL and rustls engines) run a real TLS handshake
//! through a tapping relay and exchange an HTTP request and response. The server then hands its
//! session to the toolkit's own record layer, which seals the close_notify the client's TLS library
//! accepts. An observer given the exported keys decrypts every captured record of the key epoch,
//! re-encrypts it and checks the bytes are identical to what the TLS library sent. Finally the
//! client checks the server's attestation evidence, bound to the session's exporter: refused by
//! the default policy, accepted by an explicit opt-in policy, and refused when replayed into
//! another session. Every verdict is computed; any unexpected outcome fails the demo.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, ensure, Context};
use mbx_attest::{
    report_data, sim, spki_from_certificate, verify, Attester, Evidence, HexBytes, Policy,
    SimulatedAttester, SimulatedPlatform, EXPORTER_LABEL, EXPORTER_LEN,
};
use mbx_engine::{
    CustomExtension, ExportedSession, ExtensionResponse, Identity, OpenSslContext, RustlsEngine,
    TlsConfig, TlsEngine,
};
use mbx_record::{CipherSuite, RecordOpener, RecordSealer, TlsVersion};
use mbx_testbed::pki::{IssuedCert, KeyType, LeafSpec, TestPki};
use mbx_testbed::relay::{DelayRelay, Direction, Tap};
use mbx_wire::record::{DeframerConfig, RecordReader};
use mbx_wire::ContentType;
use serde::Deserialize;
use tokio::net::{TcpListener, TcpStream};
use zeroize::Zeroizing;

use crate::driver;

/// A private-use ClientHello extension the demo client sends and the server answers, to show the
/// OpenSSL engine's custom-extension hooks (mbTLS's MiddleboxSupport uses the same mechanism).
const DEMO_EXTENSION: u16 = 0xFFA0;
const SERVER_NAME: &str = "localhost";
/// What the simulated TEE measures: the program and its configuration.
const PROGRAM: &str = "mbx-demo-server";
const PROGRAM_CONFIG: &[u8] = b"role=demo-server";

#[derive(clap::Args, Debug, Default)]
pub struct DemoArgs {
    /// TLS versions to run, in order (`1.2`, `1.3`). Default: both.
    #[arg(long = "tls", value_delimiter = ',')]
    versions: Vec<String>,
    /// One-way latency the relay adds in each direction, in milliseconds. Default: 0.
    #[arg(long)]
    latency_ms: Option<u64>,
}

/// `[demo]` in the config file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DemoConfig {
    /// As `--tls`.
    pub versions: Option<Vec<String>>,
    /// As `--latency-ms`.
    pub latency_ms: Option<u64>,
}

#[derive(Clone, Copy)]
enum ClientKind {
    OpenSsl,
    Rustls,
}

#[derive(Clone, Copy)]
struct Case {
    version: TlsVersion,
    suite: CipherSuite,
    client: ClientKind,
}

fn case_for(version: &str) -> anyhow::Result<Case> {
    Ok(match version {
        // OpenSSL on both ends: the custom extension travels in both directions.
        "1.3" => Case {
            version: TlsVersion::Tls13,
            suite: CipherSuite::TLS13_AES_128_GCM_SHA256,
            client: ClientKind::OpenSsl,
        },
        // rustls client against the OpenSSL server: two independent TLS stacks.
        "1.2" => Case {
            version: TlsVersion::Tls12,
            suite: CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
            client: ClientKind::Rustls,
        },
        other => bail!("unknown TLS version {other:?} (use 1.2 or 1.3)"),
    })
}

pub fn run(args: DemoArgs, config: &DemoConfig) -> anyhow::Result<()> {
    crate::subcommand::exit_quietly_when_stdout_closes();
    let versions = if !args.versions.is_empty() {
        args.versions
    } else {
        config
            .versions
            .clone()
            .unwrap_or_else(|| vec!["1.3".into(), "1.2".into()])
    };
    let versions =
        crate::subcommand::each_once(versions.iter().map(|v| v.trim().to_owned()).collect());
    let cases = versions
        .iter()
        .map(|v| case_for(v))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let latency = Duration::from_millis(args.latency_ms.or(config.latency_ms).unwrap_or(0));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(run_cases(&cases, latency))?;
    // BlindBox's setup drivers need the multi-threaded runtime (they garble off the I/O threads).
    crate::subcommand::runtime()?.block_on(crate::blindbox_demo::run(true))?;
    println!("\nAll checks passed.");
    Ok(())
}

/// Long-lived parties shared by the cases: the PKI and the simulated TEE platform.
struct World {
    pki: TestPki,
    server_cert: IssuedCert,
    platform: Arc<SimulatedPlatform>,
    measurement: [u8; 32],
}

async fn run_cases(cases: &[Case], latency: Duration) -> anyhow::Result<()> {
    let pki = TestPki::new("mbx demo CA")?;
    let server_cert = pki.issue(&LeafSpec::server(SERVER_NAME).key_type(KeyType::EcdsaP256))?;
    let world = World {
        pki,
        server_cert,
        platform: Arc::new(SimulatedPlatform::generate()?),
        measurement: sim::measure(PROGRAM, PROGRAM_CONFIG),
    };
    println!("mbx demo: real TLS sessions on loopback, decrypted with exported keys");
    println!("  PKI: test CA \"mbx demo CA\", server certificate for {SERVER_NAME} (ECDSA P-256)");
    println!(
        "  relay: tapping TCP relay, {} ms one-way latency per direction",
        latency.as_millis()
    );

    let mut sessions = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        sessions.push(run_case(i + 1, *case, &world, latency).await?);
    }
    attestation(&world, &sessions)?;
    let versions: Vec<TlsVersion> = cases.iter().map(|c| c.version).collect();
    crate::mbtls_demo::run(&versions, latency).await?;
    Ok(())
}

/// What the client learned in one session, for the attestation checks at the end.
struct ClientView {
    label: String,
    evidence: Evidence,
    server_spki: Vec<u8>,
    exporter: Zeroizing<Vec<u8>>,
}

async fn run_case(
    n: usize,
    case: Case,
    world: &World,
    latency: Duration,
) -> anyhow::Result<ClientView> {
    let label = format!("{} / {}", version_name(case.version), case.suite.name());
    println!("\n[{n}] {label}");

    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let server_addr = listener.local_addr()?;
    let tap = Tap::new();
    let relay = DelayRelay::builder(server_addr)
        .latency(latency)
        .tap(tap.clone())
        .start()
        .await?;

    let server = tokio::spawn(serve_one(
        listener,
        case,
        server_tls_config(case, world)?,
        attester(world),
    ));
    let client = run_client(case, world, relay.local_addr()).await;
    let server = server.await.context("server task panicked")?;
    // When both fail, the server's error usually explains the client's.
    let (client, server) = match (client, server) {
        (Ok(c), Ok(s)) => (c, s),
        (Err(c), Ok(_)) => return Err(c.context("client failed")),
        (Ok(_), Err(s)) => return Err(s.context("server failed")),
        (Err(c), Err(s)) => return Err(s.context(format!("server failed (client: {c:#})"))),
    };

    println!("  client: {}", client.summary);
    println!(
        "  server: handed the session to the mbx record layer: tx keys {} (next seq {}), rx keys {} (next seq {})",
        hex::encode(server.session.tx.keys.fingerprint()),
        server.exported_seqs.0,
        hex::encode(server.session.rx.keys.fingerprint()),
        server.exported_seqs.1,
    );
    println!(
        "  server: close_notify sealed by mbx-record was accepted by the client's TLS library"
    );
    if let Some(ext) = &server.extension {
        println!(
            "  private ClientHello extension {DEMO_EXTENSION:#06x} (the kind of hook mbTLS's MiddleboxSupport rides on): server received {:?}, client received {:?}",
            String::from_utf8_lossy(ext),
            String::from_utf8_lossy(client.extension_reply.as_deref().unwrap_or_default()),
        );
    }

    // The observer: the captured ciphertext of both directions plus the exported keys.
    let c2s = tap.bytes(0, Direction::ClientToServer);
    let s2c = tap.bytes(0, Direction::ServerToClient);
    drop(relay);
    println!(
        "  observer: {} bytes client→server, {} bytes server→client captured",
        c2s.len(),
        s2c.len()
    );
    let session = &server.session;
    observe(case.version, "client→server", &c2s, session, Side::Rx)?;
    observe(case.version, "server→client", &s2c, session, Side::Tx)?;

    Ok(ClientView {
        label,
        evidence: client.evidence,
        server_spki: client.server_spki,
        exporter: client.exporter,
    })
}

fn version_name(v: TlsVersion) -> &'static str {
    match v {
        TlsVersion::Tls12 => "TLS 1.2",
        TlsVersion::Tls13 => "TLS 1.3",
    }
}

fn server_tls_config(case: Case, world: &World) -> anyhow::Result<TlsConfig> {
    let identity = Identity::from_pem(
        world.server_cert.chain_pem(),
        world.server_cert.key_pem().as_bytes(),
    );
    let mut cfg = TlsConfig::server(identity).only(case.version);
    cfg.cipher_suites = vec![case.suite.id];
    let mut ext = CustomExtension::new(DEMO_EXTENSION);
    ext.handler = Some(Arc::new(|_payload: &[u8]| {
        ExtensionResponse::Reply(b"ack from the mbx server".to_vec())
    }));
    cfg.custom_extensions = vec![ext];
    Ok(cfg)
}

fn attester(world: &World) -> SimulatedAttester {
    SimulatedAttester::new(
        world.platform.clone(),
        world.measurement,
        sim::signer_id("mbx demo signer"),
    )
}

struct ServerOutcome {
    session: ExportedSession,
    /// Next sequence numbers (tx, rx) at the moment of export.
    exported_seqs: (u64, u64),
    extension: Option<Vec<u8>>,
}

/// The server: one connection, one request, then the session moves to our record layer.
async fn serve_one(
    listener: TcpListener,
    case: Case,
    cfg: TlsConfig,
    attester: SimulatedAttester,
) -> anyhow::Result<ServerOutcome> {
    let (mut sock, _) = listener.accept().await?;
    let ctx = OpenSslContext::new(&cfg)?;
    let mut engine = ctx.engine()?;
    driver::handshake(&mut engine, &mut sock)
        .await
        .context("server handshake")?;
    let extension = engine.received_extension(DEMO_EXTENSION)?;

    // Evidence bound to this session: our certificate's key and the session's exporter.
    let exporter = engine.export_keying_material(as_str(EXPORTER_LABEL)?, None, EXPORTER_LEN)?;
    let spki = spki_from_certificate(ctx.certificate_der().context("server has no identity")?)?;
    let evidence = attester.evidence(&report_data(&spki, &exporter))?;

    driver::receive_until(&mut engine, &mut sock, |b| {
        b.windows(4).any(|w| w == b"\r\n\r\n")
    })
    .await?;
    let body = format!(
        "hello from the mbx demo server over {}\n",
        version_name(case.version)
    );
    let response = format!(
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nAttestation-Evidence: {}\r\n\r\n{body}",
        body.len(),
        hex::encode(evidence.to_bytes()),
    );
    driver::send(&mut engine, &mut sock, response.as_bytes()).await?;

    // Hand over to mbx-record and close the session with a record it sealed.
    let handoff = engine.export_session()?;
    ensure!(
        handoff.pending_outgoing.is_empty(),
        "engine still had ciphertext to send"
    );
    let session = handoff.session;
    let exported_seqs = (session.tx.next_seq, session.rx.next_seq);
    let mut sealer = RecordSealer::new(
        session.version,
        session.tx.keys.clone(),
        session.tx.next_seq,
    );
    let mut out = Vec::new();
    sealer.seal(ContentType::ALERT, &[1, 0], &mut out)?; // warning(1), close_notify(0)
    tokio::io::AsyncWriteExt::write_all(&mut sock, &out).await?;
    let mut session = session;
    session.tx.next_seq = sealer.next_seq();
    Ok(ServerOutcome {
        session,
        exported_seqs,
        extension,
    })
}

fn as_str(label: &[u8]) -> anyhow::Result<&str> {
    std::str::from_utf8(label).context("exporter label is not UTF-8")
}

struct ClientOutcome {
    summary: String,
    extension_reply: Option<Vec<u8>>,
    evidence: Evidence,
    server_spki: Vec<u8>,
    exporter: Zeroizing<Vec<u8>>,
}

async fn run_client(case: Case, world: &World, addr: SocketAddr) -> anyhow::Result<ClientOutcome> {
    let mut cfg =
        TlsConfig::client(SERVER_NAME, world.pki.root_pem().into_bytes()).only(case.version);
    cfg.cipher_suites = vec![case.suite.id];
    let mut engine: Box<dyn TlsEngine + Send> = match case.client {
        ClientKind::OpenSsl => {
            let mut ext = CustomExtension::new(DEMO_EXTENSION);
            ext.client_payload = Some(b"hello from the mbx client".to_vec());
            cfg.custom_extensions = vec![ext];
            Box::new(OpenSslContext::new(&cfg)?.engine()?)
        }
        ClientKind::Rustls => Box::new(RustlsEngine::new(&cfg)?),
    };
    let mut sock = TcpStream::connect(addr).await?;
    driver::handshake(engine.as_mut(), &mut sock)
        .await
        .context("client handshake")?;
    let stack = match case.client {
        ClientKind::OpenSsl => "OpenSSL",
        ClientKind::Rustls => "rustls",
    };
    let negotiated = engine.version().map(version_name).unwrap_or("?");
    let suite = engine
        .cipher_suite()
        .and_then(CipherSuite::from_id)
        .map(|s| s.name())
        .unwrap_or("?");
    let extension_reply = match case.client {
        ClientKind::OpenSsl => engine.received_extension(DEMO_EXTENSION)?,
        ClientKind::Rustls => None,
    };
    let exporter = engine.export_keying_material(as_str(EXPORTER_LABEL)?, None, EXPORTER_LEN)?;
    let server_leaf = engine
        .peer_certificates()
        .into_iter()
        .next()
        .context("server sent no certificate")?;

    driver::send(
        engine.as_mut(),
        &mut sock,
        b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n",
    )
    .await?;
    let response = driver::receive_until(engine.as_mut(), &mut sock, response_complete).await?;
    driver::until_peer_closed(engine.as_mut(), &mut sock).await?;

    let text = String::from_utf8_lossy(&response);
    let evidence_hex = text
        .lines()
        .find_map(|l| l.strip_prefix("Attestation-Evidence: "))
        .context("response carries no attestation evidence")?;
    let evidence = Evidence::from_bytes(&hex::decode(evidence_hex.trim())?)?;
    let status = text.lines().next().unwrap_or_default().to_owned();
    Ok(ClientOutcome {
        summary: format!("{stack} engine, verified {SERVER_NAME}, negotiated {negotiated} {suite}, got \"{status}\""),
        extension_reply,
        evidence,
        server_spki: spki_from_certificate(&server_leaf)?,
        exporter,
    })
}

/// True once a complete HTTP/1.1 response with a Content-Length body has arrived.
fn response_complete(buf: &[u8]) -> bool {
    let Some(head_end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        return false;
    };
    let head = String::from_utf8_lossy(&buf[..head_end]);
    let len = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .and_then(|v| v.trim().parse::<usize>().ok())
        .unwrap_or(0);
    buf.len() >= head_end + 4 + len
}

#[derive(Clone, Copy)]
enum Side {
    Tx,
    Rx,
}

/// Decrypts the records of one direction that belong to the exported key epoch, and re-encrypts
/// each to check our record layer reproduces the TLS library's bytes exactly.
///
/// The exported sequence number counts the records of the epoch, so they are the last
/// `next_seq` records of the direction (there is no KeyUpdate in the demo).
fn observe(
    version: TlsVersion,
    what: &str,
    captured: &[u8],
    session: &ExportedSession,
    side: Side,
) -> anyhow::Result<()> {
    let dir = match side {
        Side::Tx => &session.tx,
        Side::Rx => &session.rx,
    };
    let mut reader = RecordReader::new(DeframerConfig::tls12());
    reader.push(captured);
    let mut records = Vec::new();
    while let Some(r) = reader.next_record()? {
        records.push(r);
    }
    ensure!(
        reader.buffered() == 0,
        "{what}: capture ends inside a record"
    );
    let in_epoch = usize::try_from(dir.next_seq)?;
    ensure!(
        in_epoch <= records.len(),
        "{what}: fewer records than the exported sequence number"
    );
    let first = records.len() - in_epoch;
    println!(
        "  observer {what}: {} records, the last {in_epoch} under keys {}:",
        records.len(),
        hex::encode(dir.keys.fingerprint())
    );
    let mut opener = RecordOpener::new(version, dir.keys.clone(), 0);
    let mut sealer = RecordSealer::new(version, dir.keys.clone(), 0);
    for (seq, record) in records[first..].iter().enumerate() {
        let opened = opener
            .open(record.as_bytes())
            .with_context(|| format!("{what}: record seq {seq} does not decrypt"))?;
        let mut resealed = Vec::new();
        sealer.seal(opened.content_type, &opened.plaintext, &mut resealed)?;
        let identical = resealed == record.as_bytes();
        ensure!(
            identical,
            "{what}: re-encrypting record seq {seq} gave different bytes"
        );
        println!(
            "    seq {seq}: {:<16} {:>5} bytes  {}  re-encrypted: identical",
            opened.content_type.name().unwrap_or("unknown"),
            opened.plaintext.len(),
            preview(opened.content_type, &opened.plaintext),
        );
    }
    Ok(())
}

/// A short, printable description of a decrypted record.
fn preview(ct: ContentType, plaintext: &[u8]) -> String {
    match ct {
        ContentType::APPLICATION_DATA => {
            let line = plaintext.split(|b| *b == b'\n').next().unwrap_or_default();
            format!("{:?}", String::from_utf8_lossy(line).trim_end())
        }
        ContentType::ALERT => match plaintext {
            [level, desc] => format!(
                "alert level {level}, description {desc}{}",
                if *desc == 0 { " (close_notify)" } else { "" }
            ),
            _ => "malformed alert".into(),
        },
        ContentType::HANDSHAKE => match plaintext.first() {
            Some(4) => "NewSessionTicket".into(),
            Some(20) => "Finished".into(),
            Some(t) => format!("handshake message type {t}"),
            None => String::new(),
        },
        _ => String::new(),
    }
}

/// The client's verdicts on the server's evidence, bound to each session's exporter.
fn attestation(world: &World, sessions: &[ClientView]) -> anyhow::Result<()> {
    println!("\nAttestation (simulated TEE: no SGX/TDX on this machine)");
    let opt_in = Policy {
        allow_simulated: true,
        measurements: vec![HexBytes(world.measurement.to_vec())],
        sim_platform_keys: vec![HexBytes(world.platform.public_key().to_vec())],
        ..Policy::default()
    };
    let now = mbx_attest::unix_seconds(std::time::SystemTime::now());
    for s in sessions {
        let expected = report_data(&s.server_spki, &s.exporter);
        match verify(&s.evidence, &expected, &Policy::default(), now) {
            Ok(_) => bail!(
                "[{}] the default policy accepted simulated evidence",
                s.label
            ),
            Err(e) => println!("  [{}] default policy: refused ({e})", s.label),
        }
        let claims = verify(&s.evidence, &expected, &opt_in, now)
            .with_context(|| format!("[{}] opt-in policy refused the evidence", s.label))?;
        println!(
            "  [{}] policy with allow_simulated = true: accepted: {claims}",
            s.label
        );
    }
    if let [a, b, ..] = sessions {
        let b_expected = report_data(&b.server_spki, &b.exporter);
        match verify(&a.evidence, &b_expected, &opt_in, now) {
            Ok(_) => bail!("evidence of [{}] was accepted in [{}]", a.label, b.label),
            Err(e) => println!(
                "  evidence of [{}] replayed into [{}]: refused ({e})",
                a.label, b.label
            ),
        }
    }
    Ok(())
}
