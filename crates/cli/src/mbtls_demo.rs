//! The mbTLS part of `mbx demo` (also `mbx mbtls demo`): on loopback, an mbTLS client fetches a
//! page through a client-side middlebox and a server-side middlebox from an mbTLS server in
//! front of a plain HTTP backend. Every link runs through a tapping relay. Prints the path, each
//! hop's key fingerprint as each party saw it, each attestation verdict, the headers the
//! middleboxes inserted and the TLS version, and checks every one of them: the endpoints agree on
//! the bridge and on nothing else, each middlebox holds exactly its two hops, the request crossed
//! every link encrypted and differently on each, and both middleboxes' apps ran.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{ensure, Context};
use mbx_apps::{HttpHeaderInsert, MiddleboxApp};
use mbx_attest::{sim, HexBytes, Policy, SimulatedAttester, SimulatedPlatform};
use mbx_engine::{CustomExtension, Identity, OpenSslContext, TlsConfig};
use mbx_mbtls::driver::{
    fingerprint_hex, ConnectionReport, MbtlsClient, MbtlsServer, MbtlsServerConfig,
    MiddleboxServer, MiddleboxServerConfig, MiddleboxVerdict, Placement, ServerConnectionReport,
};
use mbx_mbtls::handshake::{
    ClientHandshakeConfig, ClientMiddlebox, HopFingerprint, MiddleboxHandshakeConfig,
    ServerHandshakeConfig, ServerMiddlebox,
};
use mbx_mbtls::MIDDLEBOX_SUPPORT_EXTENSION;
use mbx_record::TlsVersion;
use mbx_testbed::pki::{KeyType, LeafSpec, TestPki};
use mbx_testbed::relay::{DelayRelay, Direction, Tap};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use zeroize::Zeroizing;

const SERVER: &str = "server.test";
const CLIENT_MB: &str = "mb1.test";
const SERVER_MB: &str = "mb2.test";
const PROGRAM: &str = "mbx-demo-middlebox";
/// Bound on one fetch; only there so a broken path fails instead of hanging.
const BOUND: Duration = Duration::from_secs(30);

/// Parties that outlive one TLS version's run.
struct World {
    pki: TestPki,
    platform: Arc<SimulatedPlatform>,
    policy: Policy,
}

fn identity(pki: &TestPki, spec: &LeafSpec) -> anyhow::Result<(Identity, Vec<u8>)> {
    let leaf = pki.issue(&spec.clone().key_type(KeyType::EcdsaP256))?;
    Ok((
        Identity {
            cert_chain_pem: leaf.chain_pem().into_bytes(),
            key_pem: Zeroizing::new(leaf.key_pem().as_bytes().to_vec()),
        },
        leaf.cert_der().to_vec(),
    ))
}

fn version_name(v: TlsVersion) -> &'static str {
    match v {
        TlsVersion::Tls12 => "TLS 1.2",
        TlsVersion::Tls13 => "TLS 1.3",
    }
}

fn fp(h: &HopFingerprint) -> String {
    format!(
        "c2s {} s2c {}",
        fingerprint_hex(&h.c2s),
        fingerprint_hex(&h.s2c)
    )
}

/// Runs the path for each version; fails on the first check that does not hold.
pub async fn run(versions: &[TlsVersion], latency: Duration) -> anyhow::Result<()> {
    let pki = TestPki::new("mbx mbtls demo CA")?;
    let platform = Arc::new(SimulatedPlatform::generate()?);
    let policy = Policy {
        allow_simulated: true,
        measurements: vec![HexBytes(sim::measure(PROGRAM, b"").to_vec())],
        sim_platform_keys: vec![HexBytes(platform.public_key().to_vec())],
        ..Policy::default()
    };
    let world = World {
        pki,
        platform,
        policy,
    };
    println!("\nmbTLS: client -> {CLIENT_MB} (client side) -> {SERVER_MB} (server side) -> {SERVER} -> HTTP backend");
    println!(
        "  PKI: test CA \"mbx mbtls demo CA\" (ECDSA P-256); middleboxes in a simulated TEE, measurement {} (policies opt in to simulated evidence explicitly)",
        hex::encode(sim::measure(PROGRAM, b""))
    );
    for v in versions {
        run_version(&world, *v, latency).await?;
    }
    Ok(())
}

fn middlebox(
    world: &World,
    name: &str,
    next_hop: SocketAddr,
    placement: Placement,
) -> anyhow::Result<MiddleboxServerConfig> {
    let (id, der) = identity(&world.pki, &LeafSpec::middlebox(name))?;
    let attester = SimulatedAttester::new(
        world.platform.clone(),
        sim::measure(PROGRAM, b""),
        sim::signer_id("mbx demo"),
    );
    let header = HttpHeaderInsert::new("X-Mbtls-Middlebox", name)
        .map_err(|e| anyhow::anyhow!("header app: {e}"))?;
    Ok(MiddleboxServerConfig {
        handshake: MiddleboxHandshakeConfig {
            tls: Arc::new(OpenSslContext::new(&TlsConfig::server(id))?),
            certificate_der: der,
            attester: Some(Arc::new(attester)),
        },
        next_hop: next_hop.to_string(),
        app: Arc::new(move || Box::new(header.clone()) as Box<dyn MiddleboxApp + Send>),
        placement,
    })
}

/// A tapping relay in front of `upstream` (the link's ciphertext is recorded).
async fn tapped(upstream: SocketAddr, latency: Duration, tap: &Tap) -> anyhow::Result<DelayRelay> {
    Ok(DelayRelay::builder(upstream)
        .latency(latency)
        .tap(tap.clone())
        .start()
        .await?)
}

/// Plain HTTP backend: answers with the request head it received as the body.
async fn backend() -> anyhow::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(buf.get(..n).unwrap_or_default()),
                    }
                }
                let resp = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    head.len()
                );
                let _ = s.write_all(resp.as_bytes()).await;
                let _ = s.write_all(&head).await;
                let _ = s.shutdown().await;
            });
        }
    });
    Ok(addr)
}

async fn run_version(world: &World, version: TlsVersion, latency: Duration) -> anyhow::Result<()> {
    let root = world.pki.root_pem().into_bytes();
    let (server_id, _) = identity(&world.pki, &LeafSpec::server(SERVER))?;
    let backend = backend().await?;

    let mut primary = TlsConfig::server(server_id).only(version);
    primary.pause_after_handshake = true;
    primary.session_tickets = false;
    let mut server = MbtlsServer::bind(
        "127.0.0.1:0",
        MbtlsServerConfig {
            handshake: ServerHandshakeConfig {
                primary: Arc::new(OpenSslContext::new(&primary)?),
                secondary: Arc::new(OpenSslContext::new(&TlsConfig::client(
                    SERVER_MB,
                    root.clone(),
                ))?),
                middlebox: ServerMiddlebox::Preconfigured(SERVER_MB.into()),
                policy: world.policy.clone(),
                now_unix: 0,
            },
            backend: backend.to_string(),
        },
    )
    .await?;
    // Links, from the server back to the client: each behind a tapping relay.
    let taps = [Tap::new(), Tap::new(), Tap::new()];
    let link3 = tapped(server.local_addr(), latency, &taps[2]).await?;
    let mut mb2 = MiddleboxServer::bind(
        "127.0.0.1:0",
        middlebox(world, SERVER_MB, link3.local_addr(), Placement::ServerSide)?,
    )
    .await?;
    let link2 = tapped(mb2.local_addr(), latency, &taps[1]).await?;
    let mut mb1 = MiddleboxServer::bind(
        "127.0.0.1:0",
        middlebox(world, CLIENT_MB, link2.local_addr(), Placement::ClientSide)?,
    )
    .await?;
    let link1 = tapped(mb1.local_addr(), latency, &taps[0]).await?;

    let mut client_primary = TlsConfig::client(SERVER, root.clone()).only(version);
    client_primary.custom_extensions = vec![CustomExtension::new(MIDDLEBOX_SUPPORT_EXTENSION)];
    client_primary.pause_after_handshake = true;
    let client_cfg = ClientHandshakeConfig {
        primary: Arc::new(OpenSslContext::new(&client_primary)?),
        server_name: SERVER.into(),
        secondary: Arc::new(OpenSslContext::new(&TlsConfig::client(CLIENT_MB, root))?),
        middlebox: ClientMiddlebox::Preconfigured(CLIENT_MB.into()),
        policy: world.policy.clone(),
        now_unix: mbx_attest::unix_seconds(std::time::SystemTime::now()),
    };
    let request = format!(
        "GET /demo HTTP/1.1\r\nHost: {SERVER}\r\nUser-Agent: mbx-demo\r\nConnection: close\r\n\r\n"
    );
    let fetch = async {
        let mut c =
            MbtlsClient::connect_with_data(link1.local_addr(), client_cfg, request.as_bytes())
                .await?;
        let body = c.read_to_end().await?;
        let _ = c.close().await;
        anyhow::Ok((c, body))
    };
    let (client, response) = tokio::time::timeout(BOUND, fetch)
        .await
        .context("the mbTLS fetch did not complete")??;
    let r1 = tokio::time::timeout(BOUND, mb1.next_report())
        .await?
        .context("client-side middlebox report")?;
    let r2 = tokio::time::timeout(BOUND, mb2.next_report())
        .await?
        .context("server-side middlebox report")?;
    let rs = tokio::time::timeout(BOUND, server.next_report())
        .await?
        .context("server report")?;
    report(version, &client, &response, &r1, &r2, &rs, &taps)
}

fn report(
    version: TlsVersion,
    client: &MbtlsClient,
    response: &[u8],
    r1: &ConnectionReport,
    r2: &ConnectionReport,
    rs: &ServerConnectionReport,
    taps: &[Tap; 3],
) -> anyhow::Result<()> {
    let cs = client.summary().context("client summary")?;
    let ss = rs.summary.as_ref().context("server summary")?;
    println!("\n[{}] {}", version_name(version), cs.suite.name());
    ensure!(
        cs.version == version && ss.version == version,
        "negotiated version"
    );
    let (Some(c1), Some(b1), Some(b2), Some(s2)) =
        (r1.client_hop, r1.server_hop, r2.client_hop, r2.server_hop)
    else {
        anyhow::bail!("a middlebox did not install keys: {r1:?} {r2:?}");
    };
    let hops = [
        (
            format!("client <-> {CLIENT_MB}"),
            "client's fresh keys",
            cs.hops[0],
        ),
        (
            format!("{CLIENT_MB} <-> {SERVER_MB}"),
            "primary session keys (bridge)",
            cs.hops[1],
        ),
        (
            format!("{SERVER_MB} <-> {SERVER}"),
            "server's fresh keys",
            ss.hops[1],
        ),
    ];
    for (i, (name, what, h)) in hops.iter().enumerate() {
        println!("  hop {}: {name:<24} {what:<30} {}", i + 1, fp(h));
    }
    // Each party's view of each hop agrees; the endpoints share only the bridge.
    ensure!(
        cs.hops.len() == 2 && ss.hops.len() == 2,
        "one middlebox per side"
    );
    ensure!(
        c1 == cs.hops[0],
        "{CLIENT_MB} and the client disagree on hop 1"
    );
    ensure!(
        b1 == cs.hops[1] && b2 == ss.hops[0] && cs.hops[1] == ss.hops[0],
        "the bridge differs between parties"
    );
    ensure!(
        s2 == ss.hops[1],
        "{SERVER_MB} and the server disagree on hop 3"
    );
    ensure!(
        cs.hops[0] != ss.hops[1] && cs.hops[0] != cs.hops[1] && ss.hops[1] != ss.hops[0],
        "hop keys repeat"
    );
    println!("    each hop's fingerprint as the two parties on it computed it: equal; the endpoints share only hop 2");

    match client.verdict() {
        MiddleboxVerdict::Verified(Some(c)) => println!(
            "  client verified {CLIENT_MB}: {} TEE, measurement {}…, before sending its key material",
            c.tee,
            &hex::encode(&c.measurement)[..16]
        ),
        other => anyhow::bail!("client's verdict on {CLIENT_MB}: {other:?}"),
    }
    match &rs.verdict {
        MiddleboxVerdict::Verified(Some(c)) => println!(
            "  server verified {SERVER_MB}: {} TEE, measurement {}…, before sending its key material",
            c.tee,
            &hex::encode(&c.measurement)[..16]
        ),
        other => anyhow::bail!("server's verdict on {SERVER_MB}: {other:?}"),
    }

    let text = String::from_utf8_lossy(response);
    ensure!(text.starts_with("HTTP/1.1 200 OK"), "response: {text}");
    let inserted: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("X-Mbtls-Middlebox:"))
        .collect();
    println!(
        "  the backend received the request with: {}",
        inserted.join(" / ")
    );
    ensure!(
        inserted
            == [
                format!("X-Mbtls-Middlebox: {CLIENT_MB}"),
                format!("X-Mbtls-Middlebox: {SERVER_MB}")
            ],
        "headers inserted by the middleboxes: {inserted:?}"
    );

    // On the wire: the request never in clear, and different ciphertext on every link.
    let mut firsts = Vec::new();
    for (i, tap) in taps.iter().enumerate() {
        let up = tap.bytes(0, Direction::ClientToServer);
        let down = tap.bytes(0, Direction::ServerToClient);
        ensure!(
            !contains(&up, b"GET /demo") && !contains(&down, b"X-Mbtls-Middlebox"),
            "plaintext on link {}",
            i + 1
        );
        firsts.push(up);
        println!(
            "  link {}: {} bytes toward the server, {} back, no plaintext",
            i + 1,
            firsts[i].len(),
            down.len()
        );
    }
    ensure!(
        firsts[0] != firsts[1] && firsts[1] != firsts[2],
        "identical link captures"
    );
    println!(
        "  {CLIENT_MB}: {}; {SERVER_MB}: {}; server: {} request bytes to the backend",
        outcome(&r1.outcome),
        outcome(&r2.outcome),
        rs.bytes_to_backend
    );
    Ok(())
}

fn outcome(o: &Result<(), String>) -> String {
    match o {
        Ok(()) => "closed cleanly".into(),
        Err(e) => format!("ended: {e}"),
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}
