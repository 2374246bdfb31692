//! The mbTLS part of `mbx demo` (also `mbx mbtls demo`): on loopback, an mbTLS client fetches a
//! page through two client-side middleboxes and a server-side middlebox from an mbTLS server in
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
use mbx_engine::{Identity, TlsConfig};
use mbx_mbtls::driver::{
    fingerprint_hex, ConnectionReport, MbtlsClient, MbtlsServer, MbtlsServerConfig,
    MiddleboxServer, MiddleboxServerConfig, MiddleboxVerdict, Placement, ServerConnectionReport,
};
use mbx_mbtls::handshake::{
    ClientHandshakeConfig, ClientMiddlebox, HopFingerprint, MiddleboxHandshakeConfig,
    ServerHandshakeConfig, ServerMiddlebox,
};
use mbx_record::TlsVersion;
use mbx_testbed::pki::{KeyType, LeafSpec, TestPki};
use mbx_testbed::relay::{DelayRelay, Direction, Tap};

const SERVER: &str = "server.test";
/// The client-side middleboxes, in path order from the client.
const CLIENT_MBS: [&str; 2] = ["mb1.test", "mb2.test"];
const SERVER_MB: &str = "mb3.test";
const PROGRAM: &str = "mbx-demo-middlebox";
/// Bound on one fetch; only there so a broken path fails instead of hanging.
const BOUND: Duration = Duration::from_secs(30);

/// Parties that outlive one TLS version's run.
struct World {
    pki: TestPki,
    platform: Arc<SimulatedPlatform>,
    policy: Policy,
}

fn identity(pki: &TestPki, spec: &LeafSpec) -> anyhow::Result<Identity> {
    let leaf = pki.issue(&spec.clone().key_type(KeyType::EcdsaP256))?;
    Ok(Identity::from_pem(
        leaf.chain_pem(),
        leaf.key_pem().as_bytes(),
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
    println!(
        "\nmbTLS: client -> {} (client side) -> {} (client side) -> {SERVER_MB} (server side) -> {SERVER} -> HTTP backend",
        CLIENT_MBS[0], CLIENT_MBS[1]
    );
    println!(
        "  PKI: test CA \"mbx mbtls demo CA\" (ECDSA P-256); middleboxes in a simulated TEE, measurement {} (policies opt in to simulated evidence explicitly; run with --log warn to see the warning logged at each acceptance)",
        hex::encode(sim::measure(PROGRAM, b""))
    );
    // The words below, once, for a reader new to mbTLS.
    println!(
        "  terms: a link is one TCP connection of the path (each watched by a tapping relay);"
    );
    println!("    a hop is the keys of one link: a middlebox decrypts with one hop's keys and");
    println!("    encrypts with the next's; the bridge is the hop that keeps the end-to-end TLS");
    println!("    session's own keys, joining the client's side to the server's; a secondary");
    println!("    session is the TLS session between an endpoint and one of its middleboxes, over");
    println!("    which the middlebox shows its attestation and receives its two hops' keys");
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
    let id = identity(&world.pki, &LeafSpec::middlebox(name))?;
    let attester = SimulatedAttester::new(
        world.platform.clone(),
        sim::measure(PROGRAM, b""),
        sim::signer_id("mbx demo"),
    );
    let header = HttpHeaderInsert::new("X-Mbtls-Middlebox", name)
        .map_err(|e| anyhow::anyhow!("header app: {e}"))?;
    Ok(MiddleboxServerConfig::new(
        MiddleboxHandshakeConfig::new(&TlsConfig::server(id), Some(Arc::new(attester)))?,
        next_hop.to_string(),
        Arc::new(move || Box::new(header.clone()) as Box<dyn MiddleboxApp + Send>),
        placement,
    ))
}

/// A tapping relay in front of `upstream` (the link's ciphertext is recorded).
async fn tapped(upstream: SocketAddr, latency: Duration, tap: &Tap) -> anyhow::Result<DelayRelay> {
    Ok(DelayRelay::builder(upstream)
        .latency(latency)
        .tap(tap.clone())
        .start()
        .await?)
}

async fn run_version(world: &World, version: TlsVersion, latency: Duration) -> anyhow::Result<()> {
    let root = world.pki.root_pem().into_bytes();
    let server_id = identity(&world.pki, &LeafSpec::server(SERVER))?;
    let backend = mbx_testbed::http_echo::echo_backend().await?;

    let server_handshake = ServerHandshakeConfig::builder(server_id)
        .middleboxes(ServerMiddlebox::Preconfigured(SERVER_MB.into()))
        .middlebox_roots(root.clone())
        .policy(world.policy.clone())
        .only(version)
        .session_tickets(false)
        .build()?;
    let mut server = MbtlsServer::bind(
        "127.0.0.1:0",
        MbtlsServerConfig::new(server_handshake, backend.to_string()),
    )
    .await?;
    // Links, from the server back to the client: each behind a tapping relay.
    let taps = [Tap::new(), Tap::new(), Tap::new(), Tap::new()];
    let link4 = tapped(server.local_addr(), latency, &taps[3]).await?;
    let mut mb3 = MiddleboxServer::bind(
        "127.0.0.1:0",
        middlebox(world, SERVER_MB, link4.local_addr(), Placement::ServerSide)?,
    )
    .await?;
    let link3 = tapped(mb3.local_addr(), latency, &taps[2]).await?;
    let mut mb2 = MiddleboxServer::bind(
        "127.0.0.1:0",
        middlebox(
            world,
            CLIENT_MBS[1],
            link3.local_addr(),
            Placement::ClientSide,
        )?,
    )
    .await?;
    let link2 = tapped(mb2.local_addr(), latency, &taps[1]).await?;
    let mut mb1 = MiddleboxServer::bind(
        "127.0.0.1:0",
        middlebox(
            world,
            CLIENT_MBS[0],
            link2.local_addr(),
            Placement::ClientSide,
        )?,
    )
    .await?;
    let link1 = tapped(mb1.local_addr(), latency, &taps[0]).await?;

    let client_cfg = ClientHandshakeConfig::builder(SERVER, root)
        .middleboxes(ClientMiddlebox::PreconfiguredPath(
            CLIENT_MBS.map(String::from).to_vec(),
        ))
        .policy(world.policy.clone())
        .only(version)
        .build()?;
    let request = format!(
        "GET /demo HTTP/1.1\r\nHost: {SERVER}\r\nUser-Agent: mbx-demo\r\nConnection: close\r\n\r\n"
    );
    let (first_hop, request) = (link1.local_addr(), request.as_bytes());
    let fetch = move |cfg: ClientHandshakeConfig| async move {
        let mut c = MbtlsClient::connect_with_data(first_hop, cfg, request).await?;
        let body = c.read_to_end().await?;
        let _ = c.close().await;
        anyhow::Ok((c, body))
    };
    let mut mbs = [&mut mb1, &mut mb2, &mut mb3];
    let (client, response) = tokio::time::timeout(BOUND, fetch(client_cfg.clone()))
        .await
        .context("the mbTLS fetch did not complete")??;
    let (reports, rs) = next_reports(&mut mbs, &mut server).await?;
    report(version, &client, &response, &reports, &rs, &taps)?;

    // The same fetch again, with the same contexts: the endpoints resume their secondary
    // sessions (docs/mbtls.md §4.7).
    let (client, response) = tokio::time::timeout(BOUND, fetch(client_cfg))
        .await
        .context("the second mbTLS fetch did not complete")??;
    let (reports, rs) = next_reports(&mut mbs, &mut server).await?;
    resumption_report(&client, &response, &reports, &rs)
}

/// Each middlebox's and the server's report of the session that just ended.
async fn next_reports(
    mbs: &mut [&mut MiddleboxServer; 3],
    server: &mut MbtlsServer,
) -> anyhow::Result<(Vec<ConnectionReport>, ServerConnectionReport)> {
    let mut reports = Vec::new();
    for mb in mbs.iter_mut() {
        reports.push(
            tokio::time::timeout(BOUND, mb.next_report())
                .await?
                .context("middlebox report")?,
        );
    }
    let rs = tokio::time::timeout(BOUND, server.next_report())
        .await?
        .context("server report")?;
    Ok((reports, rs))
}

/// The second fetch: which secondary sessions resumed. With TLS 1.3 secondary sessions only
/// the middlebox nearest each endpoint resumes (a farther one's ticket would reach its
/// neighbour after that one's switch, docs/mbtls.md §4.7).
fn resumption_report(
    client: &MbtlsClient,
    response: &[u8],
    mbs: &[ConnectionReport],
    rs: &ServerConnectionReport,
) -> anyhow::Result<()> {
    ensure!(
        String::from_utf8_lossy(response).starts_with("HTTP/1.1 200 OK"),
        "second response"
    );
    println!(
        "  a second fetch with the same contexts resumes secondary sessions (the mbTLS paper, §3.5):"
    );
    let names = [CLIENT_MBS[0], CLIENT_MBS[1], SERVER_MB];
    let verdicts: Vec<(&str, &MiddleboxVerdict)> = client
        .verdicts()
        .iter()
        .chain(rs.verdicts.iter())
        .filter_map(|v| match v {
            MiddleboxVerdict::Verified { middlebox, .. } => Some((middlebox.as_str(), v)),
            _ => None,
        })
        .collect();
    for (name, mb) in names.iter().zip(mbs) {
        let resumed = verdicts.iter().any(|(n, v)| n == name && v.resumed());
        ensure!(
            resumed == mb.resumed,
            "{name}: the endpoint and the middlebox disagree on resumption"
        );
        let expected = *name != CLIENT_MBS[1];
        ensure!(resumed == expected, "{name}: resumed = {resumed}");
        println!(
            "    {name}: {}",
            if resumed {
                "resumed, no new evidence (the claims checked on the first fetch, checked against the policy again)"
            } else {
                "full handshake with fresh evidence (secondary sessions are TLS 1.3 whatever the primary session's version, and there a middlebox with a nearer neighbour sends no ticket)"
            }
        );
    }
    Ok(())
}

fn report(
    version: TlsVersion,
    client: &MbtlsClient,
    response: &[u8],
    mbs: &[ConnectionReport],
    rs: &ServerConnectionReport,
    taps: &[Tap; 4],
) -> anyhow::Result<()> {
    let cs = client.summary().context("client summary")?;
    let ss = rs.summary.as_ref().context("server summary")?;
    println!("\n[{}] {}", version_name(version), cs.suite.name());
    ensure!(
        cs.version == version && ss.version == version,
        "negotiated version"
    );
    ensure!(
        cs.hops.len() == 3 && ss.hops.len() == 2,
        "two client-side and one server-side middlebox"
    );
    let names = [CLIENT_MBS[0], CLIENT_MBS[1], SERVER_MB];
    // Path order: client's two fresh hops, the bridge (both endpoints know it), server's hop.
    let hops = [
        ("client", names[0], "client's fresh keys", cs.hops[0]),
        (names[0], names[1], "client's fresh keys", cs.hops[1]),
        (
            names[1],
            names[2],
            "primary session keys (bridge)",
            cs.hops[2],
        ),
        (names[2], SERVER, "server's fresh keys", ss.hops[1]),
    ];
    for (i, (a, b, what, h)) in hops.iter().enumerate() {
        println!(
            "  hop {}: {:<24} {what:<30} {}",
            i + 1,
            format!("{a} <-> {b}"),
            fp(h)
        );
    }
    // Every middlebox holds exactly its two hops, as the endpoints computed them.
    ensure!(
        cs.hops[2] == ss.hops[0],
        "the endpoints disagree on the bridge"
    );
    for (i, r) in mbs.iter().enumerate() {
        let (Some(toward_client), Some(toward_server)) = (r.client_hop, r.server_hop) else {
            anyhow::bail!("{} did not install keys: {r:?}", names[i]);
        };
        ensure!(
            toward_client == hops[i].3 && toward_server == hops[i + 1].3,
            "{} holds other keys than its endpoint gave it",
            names[i]
        );
    }
    for i in 0..hops.len() {
        for j in i + 1..hops.len() {
            ensure!(
                hops[i].3 != hops[j].3,
                "hops {} and {} share keys",
                i + 1,
                j + 1
            );
        }
    }
    println!("    each middlebox holds exactly its two hops; the endpoints share only the bridge");

    let verdicts = client.verdicts();
    ensure!(verdicts.len() == 2, "client verdicts: {verdicts:?}");
    let mut verified = Vec::new();
    let path: Vec<String> = CLIENT_MBS.iter().map(|m| m.to_string()).collect();
    for v in mbx_mbtls::driver::in_path_order(verdicts, &path) {
        match v {
            MiddleboxVerdict::Verified {
                middlebox,
                claims: Some(c),
                ..
            } => {
                println!(
                    "  client verified {middlebox}: {} TEE, measurement {}…, before sending key material",
                    c.tee,
                    &hex::encode(&c.measurement)[..16]
                );
                verified.push(middlebox.as_str());
            }
            other => anyhow::bail!("client's verdict on a middlebox: {other:?}"),
        }
    }
    verified.sort_unstable();
    ensure!(
        verified == names[..2] && cs.middleboxes == names[..2],
        "the client verified {verified:?} and sent keys to {:?}, not {:?}",
        cs.middleboxes,
        &names[..2]
    );
    match rs.verdicts.as_slice() {
        [MiddleboxVerdict::Verified {
            middlebox,
            claims: Some(c),
            ..
        }] if middlebox == SERVER_MB => println!(
            "  server verified {middlebox}: {} TEE, measurement {}…, before sending key material",
            c.tee,
            &hex::encode(&c.measurement)[..16]
        ),
        other => anyhow::bail!("server's verdicts: {other:?}"),
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
    let expected: Vec<String> = names
        .iter()
        .map(|n| format!("X-Mbtls-Middlebox: {n}"))
        .collect();
    ensure!(
        inserted == expected,
        "headers inserted by the middleboxes: {inserted:?}"
    );

    // On the wire: the request never in clear, and different ciphertext on every link.
    let mut ups = Vec::new();
    for (i, tap) in taps.iter().enumerate() {
        let up = tap.bytes(0, Direction::ClientToServer);
        let down = tap.bytes(0, Direction::ServerToClient);
        ensure!(
            !contains(&up, b"GET /demo") && !contains(&down, b"X-Mbtls-Middlebox"),
            "plaintext on link {}",
            i + 1
        );
        println!(
            "  link {}: {} bytes toward the server, {} back, no plaintext",
            i + 1,
            up.len(),
            down.len()
        );
        ups.push(up);
    }
    ensure!(
        ups.windows(2).all(|w| w[0] != w[1]),
        "identical link captures"
    );
    let outcomes: Vec<String> = names
        .iter()
        .zip(mbs)
        .map(|(n, r)| format!("{n}: {}", outcome(&r.outcome)))
        .collect();
    println!(
        "  {}; server: {} request bytes to the backend",
        outcomes.join("; "),
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
