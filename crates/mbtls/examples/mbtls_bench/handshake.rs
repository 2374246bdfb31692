//! Benchmark 1 (paper Figure 5): handshake CPU per role. Every node of a path is a sans-I/O
//! core (or a bare OpenSSL engine) in memory on this one thread; each call into a node —
//! construction included — is timed with the thread's CPU clock and charged to that node. One
//! handshake = from the client's first flight until a small request reached the server and its
//! answer reached the client (which also checks that every handshake worked).

use std::sync::Arc;

use mbx_apps::{MiddleboxApp, PassThrough};
use mbx_engine::{OpenSslContext, OpenSslEngine, TlsEngine};
use mbx_mbtls::handshake::{
    Approver, ClientHandshake, ClientMiddlebox, MiddleboxHandshake, ServerHandshake,
    ServerMiddlebox, ServerSideMiddlebox,
};
use mbx_mbtls::Side;
use mbx_record::TlsVersion;
use mbx_testbed::bench::stats;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde_json::{json, Value};

use crate::setup::{Setup, CLIENT_SIDE, SERVER_SIDE};
use crate::Res;
use mbx_testbed::bench::calling_thread_cpu_ns as thread_ns;

const REQUEST: &[u8] = b"GET / HTTP/1.1\r\nHost: server.test\r\n\r\n";
const RESPONSE: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";

type App = Box<dyn MiddleboxApp>;

/// What a node of a configuration is; built fresh for each handshake.
#[derive(Clone)]
enum Spec {
    TlsClient(Arc<OpenSslContext>),
    TlsServer(Arc<OpenSslContext>),
    /// Terminates the client's TLS (front) and opens its own to the server (back).
    Split(Arc<OpenSslContext>, Arc<OpenSslContext>),
    Client(mbx_mbtls::handshake::ClientHandshakeConfig),
    ClientMb(mbx_mbtls::handshake::MiddleboxHandshakeConfig),
    ServerMb(mbx_mbtls::handshake::MiddleboxHandshakeConfig),
    Server(mbx_mbtls::handshake::ServerHandshakeConfig),
}

enum Node {
    TlsClient(OpenSslEngine, bool),
    TlsServer(OpenSslEngine, Vec<u8>),
    Split {
        front: OpenSslEngine,
        back: OpenSslEngine,
        up: Vec<u8>,
        down: Vec<u8>,
    },
    Client(ClientHandshake),
    ClientMb(MiddleboxHandshake<App>),
    ServerMb(ServerSideMiddlebox<App>),
    Server(ServerHandshake, Vec<u8>),
}

fn build(spec: &Spec) -> Res<Node> {
    Ok(match spec {
        Spec::TlsClient(ctx) => {
            let mut e = ctx.engine()?;
            e.process()?;
            Node::TlsClient(e, false)
        }
        Spec::TlsServer(ctx) => Node::TlsServer(ctx.engine()?, Vec::new()),
        Spec::Split(front, back) => {
            let mut back = back.engine()?;
            back.process()?;
            Node::Split {
                front: front.engine()?,
                back,
                up: Vec::new(),
                down: Vec::new(),
            }
        }
        Spec::Client(cfg) => {
            // The request waits in the core until the data phase (as `connect_with_data`).
            let mut c = ClientHandshake::new(cfg.clone())?;
            c.write(REQUEST)?;
            Node::Client(c)
        }
        Spec::ClientMb(cfg) => Node::ClientMb(MiddleboxHandshake::new(
            cfg.clone(),
            Box::new(PassThrough) as App,
        )?),
        Spec::ServerMb(cfg) => Node::ServerMb(ServerSideMiddlebox::new(
            cfg.clone(),
            Box::new(PassThrough) as App,
            true,
        )?),
        Spec::Server(cfg) => Node::Server(ServerHandshake::new(cfg.clone())?, Vec::new()),
    })
}

/// Moves plaintext across a split middlebox once each side's handshake allows it.
fn split_relay(
    front: &mut OpenSslEngine,
    back: &mut OpenSslEngine,
    up: &mut Vec<u8>,
    down: &mut Vec<u8>,
) -> Res<()> {
    up.extend(front.take_plaintext());
    down.extend(back.take_plaintext());
    if !back.is_handshaking() && !up.is_empty() {
        back.write_plaintext(up)?;
        up.clear();
    }
    if !front.is_handshaking() && !down.is_empty() {
        front.write_plaintext(down)?;
        down.clear();
    }
    Ok(())
}

impl Node {
    fn receive(&mut self, from: Side, bytes: &[u8]) -> Res<()> {
        match self {
            Node::TlsClient(e, sent) => {
                e.feed(bytes);
                e.process()?;
                if !*sent && !e.is_handshaking() {
                    e.write_plaintext(REQUEST)?;
                    *sent = true;
                }
            }
            Node::TlsServer(e, got) => {
                e.feed(bytes);
                e.process()?;
                got.extend(e.take_plaintext());
                if got.as_slice() == REQUEST {
                    e.write_plaintext(RESPONSE)?;
                    got.clear();
                }
            }
            Node::Split {
                front,
                back,
                up,
                down,
            } => {
                let e = if from == Side::Client {
                    &mut *front
                } else {
                    &mut *back
                };
                e.feed(bytes);
                e.process()?;
                split_relay(front, back, up, down)?;
            }
            Node::Client(c) => c.receive(bytes)?,
            Node::ClientMb(m) => m.receive(from, bytes)?,
            Node::ServerMb(m) => m.receive(from, bytes)?,
            Node::Server(s, got) => {
                s.receive(bytes)?;
                got.extend(s.take_plaintext());
                if got.as_slice() == REQUEST {
                    s.write(RESPONSE)?;
                    got.clear();
                }
            }
        }
        Ok(())
    }

    fn take_outgoing(&mut self, to: Side) -> Vec<u8> {
        match (self, to) {
            (Node::TlsClient(e, _), Side::Server) | (Node::TlsServer(e, _), Side::Client) => {
                e.take_outgoing()
            }
            (Node::Split { front, .. }, Side::Client) => front.take_outgoing(),
            (Node::Split { back, .. }, Side::Server) => back.take_outgoing(),
            (Node::Client(c), Side::Server) => c.take_outgoing(),
            (Node::Server(s, _), Side::Client) => s.take_outgoing(),
            (Node::ClientMb(m), to) => m.take_outgoing(to),
            (Node::ServerMb(m), to) => m.take_outgoing(to),
            _ => Vec::new(),
        }
    }

    /// Client: whether its session was resumed.
    fn resumed(&self) -> bool {
        match self {
            Node::TlsClient(e, _) => e.session_reused(),
            Node::Client(c) => c.summary().is_some_and(|s| s.resumed),
            _ => false,
        }
    }

    /// Client: ends its direction with close_notify, so that OpenSSL may resume its session
    /// (it does not resume one whose connection it freed before sending one).
    fn close(&mut self) -> Res<()> {
        match self {
            Node::TlsClient(e, _) => e.close()?,
            Node::Client(c) => c.close()?,
            _ => {}
        }
        Ok(())
    }

    fn response(&mut self) -> Vec<u8> {
        match self {
            Node::TlsClient(e, _) => e.take_plaintext(),
            Node::Client(c) => c.take_plaintext(),
            _ => Vec::new(),
        }
    }
}

/// One handshake over the path; adds each node's CPU time (ns) to `cpu`. `resumed`: the
/// client must have resumed its session.
fn once(specs: &[Spec], cpu: &mut [u64], resumed: bool) -> Res<()> {
    let mut nodes = Vec::with_capacity(specs.len());
    for (i, s) in specs.iter().enumerate() {
        let t = thread_ns();
        nodes.push(build(s)?);
        cpu[i] += thread_ns() - t;
    }
    let timed = |cpu: &mut [u64], i: usize, f: &mut dyn FnMut() -> Res<Vec<u8>>| {
        let t = thread_ns();
        let r = f();
        cpu[i] += thread_ns() - t;
        r
    };
    loop {
        let mut moved = false;
        for i in 0..nodes.len() - 1 {
            let fwd = timed(cpu, i, &mut || Ok(nodes[i].take_outgoing(Side::Server)))?;
            if !fwd.is_empty() {
                moved = true;
                timed(cpu, i + 1, &mut || {
                    nodes[i + 1].receive(Side::Client, &fwd).map(|_| Vec::new())
                })
                .map_err(|e| format!("node {}: {e}", i + 1))?;
            }
            let back = timed(cpu, i + 1, &mut || {
                Ok(nodes[i + 1].take_outgoing(Side::Client))
            })?;
            if !back.is_empty() {
                moved = true;
                timed(cpu, i, &mut || {
                    nodes[i].receive(Side::Server, &back).map(|_| Vec::new())
                })
                .map_err(|e| format!("node {i}: {e}"))?;
            }
        }
        if !moved {
            break;
        }
    }
    let client = nodes.first_mut().ok_or("no node")?;
    let got = client.response();
    if got != RESPONSE {
        return Err(format!("handshake did not complete: client got {} bytes", got.len()).into());
    }
    if resumed && !client.resumed() {
        return Err("the session was not resumed".into());
    }
    // Not timed: the rows without resumption drop their sessions unclosed, as before.
    client.close()
}

struct Config {
    name: String,
    /// After the warm-up, every handshake resumes a session.
    resumed: bool,
    /// Role label per node.
    roles: Vec<String>,
    specs: Vec<Spec>,
}

fn configs(setup: &Setup, version: TlsVersion) -> Res<Vec<Config>> {
    let any: Approver = Arc::new(|_: &[Vec<u8>]| true);
    let refuse: Approver = Arc::new(|_: &[Vec<u8>]| false);
    let path = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
    let mut out = vec![
        Config {
            name: "plain TLS".into(),
            resumed: false,
            roles: vec!["client".into(), "server".into()],
            specs: vec![
                Spec::TlsClient(setup.tls_client(version)?),
                Spec::TlsServer(setup.tls_server(version)?),
            ],
        },
        Config {
            name: "split TLS".into(),
            resumed: false,
            roles: vec!["client".into(), "middlebox".into(), "server".into()],
            specs: vec![
                Spec::TlsClient(setup.tls_client(version)?),
                Spec::Split(setup.split_front(version)?, setup.tls_client(version)?),
                Spec::TlsServer(setup.tls_server(version)?),
            ],
        },
    ];
    // (client-side, server-side, attestation)
    for (c, s, attest) in [
        (0, 0, true),
        (1, 0, true),
        (0, 1, true),
        (1, 1, true),
        (1, 1, false),
        (2, 0, true),
        (0, 2, true),
        (2, 2, true),
    ] {
        let client_mb = match c {
            0 => ClientMiddlebox::Discover(any.clone()),
            1 => ClientMiddlebox::Preconfigured(CLIENT_SIDE[0].into()),
            _ => ClientMiddlebox::PreconfiguredPath(path(&CLIENT_SIDE[..c])),
        };
        let server_mb = match s {
            0 => ServerMiddlebox::Discover(refuse.clone()),
            1 => ServerMiddlebox::Preconfigured(SERVER_SIDE[0].into()),
            _ => ServerMiddlebox::PreconfiguredPath(path(&SERVER_SIDE[..s])),
        };
        let mut roles = vec!["client".to_string()];
        let mut specs = vec![Spec::Client(
            setup.mbtls_client(version, client_mb, attest)?,
        )];
        for (i, name) in CLIENT_SIDE[..c].iter().enumerate() {
            roles.push(format!("client-side middlebox {}", i + 1));
            specs.push(Spec::ClientMb(setup.middlebox(name, attest)?));
        }
        for (i, name) in SERVER_SIDE[..s].iter().enumerate() {
            roles.push(format!("server-side middlebox {}", i + 1));
            specs.push(Spec::ServerMb(setup.middlebox(name, attest)?));
        }
        roles.push("server".into());
        specs.push(Spec::Server(
            setup.mbtls_server(version, server_mb, attest)?,
        ));
        out.push(Config {
            name: format!(
                "mbTLS {c}+{s}{}",
                if attest { "" } else { " (no evidence)" }
            ),
            resumed: false,
            roles,
            specs,
        });
    }
    // A server-side middlebox whose evidence is in its certificate (docs/mbtls.md §4.8): the
    // server checks it once and answers later sessions from memory.
    let mut server = setup.mbtls_server(
        version,
        ServerMiddlebox::Preconfigured(SERVER_SIDE[0].into()),
        true,
    )?;
    server.policy.certificate_evidence = true;
    out.push(Config {
        name: "mbTLS 0+1 (evidence in certificate)".into(),
        resumed: false,
        roles: vec![
            "client".into(),
            "server-side middlebox 1".into(),
            "server".into(),
        ],
        specs: vec![
            Spec::Client(setup.mbtls_client(
                version,
                ClientMiddlebox::Discover(any.clone()),
                true,
            )?),
            Spec::ServerMb(setup.middlebox_with_evidence_in_certificate()?),
            Spec::Server(server),
        ],
    });
    // An mbTLS client with client-side middleboxes disabled (none configured, no discovery):
    // its MiddleboxSupport extension carries no optimistic ClientHello.
    out.push(Config {
        name: "mbTLS 0+0 (discovery off)".into(),
        resumed: false,
        roles: vec!["client".into(), "server".into()],
        specs: vec![
            Spec::Client(setup.mbtls_client(version, ClientMiddlebox::Disabled, true)?),
            Spec::Server(setup.mbtls_server(
                version,
                ServerMiddlebox::Discover(refuse.clone()),
                true,
            )?),
        ],
    });
    out.extend(resumed_configs(setup, version)?);
    Ok(out)
}

/// Resumed sessions (endpoints keep sessions and issue tickets): plain TLS; an mbTLS client
/// whose session stays in OpenSSL (discovering with nothing on the path, or no client-side
/// middleboxes), alone or with a server-side middlebox; and with a client-side middlebox
/// (TLS 1.3: the tickets reach the client through the middlebox, after its export, and go to
/// the export's ticket sink; docs/mbtls.md §4.6).
fn resumed_configs(setup: &Setup, version: TlsVersion) -> Res<Vec<Config>> {
    let r = setup.resuming();
    let any: Approver = Arc::new(|_: &[Vec<u8>]| true);
    let refuse = || ServerMiddlebox::Discover(Arc::new(|_: &[Vec<u8>]| false));
    let client = |mb: ClientMiddlebox| r.mbtls_client(version, mb, true).map(Spec::Client);
    let server = |mb: ServerMiddlebox| r.mbtls_server(version, mb, true).map(Spec::Server);
    let roles = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
    Ok(vec![
        Config {
            name: "plain TLS resumed".into(),
            resumed: true,
            roles: roles(&["client", "server"]),
            specs: vec![
                Spec::TlsClient(r.tls_client(version)?),
                Spec::TlsServer(r.tls_server(version)?),
            ],
        },
        Config {
            name: "mbTLS 0+0 resumed".into(),
            resumed: true,
            roles: roles(&["client", "server"]),
            specs: vec![
                client(ClientMiddlebox::Discover(any.clone()))?,
                server(refuse())?,
            ],
        },
        Config {
            name: "mbTLS 0+0 resumed (discovery off)".into(),
            resumed: true,
            roles: roles(&["client", "server"]),
            specs: vec![client(ClientMiddlebox::Disabled)?, server(refuse())?],
        },
        Config {
            name: "mbTLS 0+1 resumed".into(),
            resumed: true,
            roles: roles(&["client", "server-side middlebox 1", "server"]),
            specs: vec![
                client(ClientMiddlebox::Disabled)?,
                Spec::ServerMb(r.middlebox(SERVER_SIDE[0], true)?),
                server(ServerMiddlebox::Preconfigured(SERVER_SIDE[0].into()))?,
            ],
        },
        Config {
            name: "mbTLS 1+0 resumed".into(),
            resumed: true,
            roles: roles(&["client", "client-side middlebox 1", "server"]),
            specs: vec![
                client(ClientMiddlebox::Preconfigured(CLIENT_SIDE[0].into()))?,
                Spec::ClientMb(r.middlebox(CLIENT_SIDE[0], true)?),
                server(refuse())?,
            ],
        },
    ])
}

/// Mean CPU µs per handshake of each role, `reps` times (`n` handshakes of each
/// configuration, interleaved one by one so that every configuration sees the same machine
/// load and per-repetition ratios are paired), after a short warm-up round. Each round of
/// interleaving visits the configurations in a new (seeded, reproducible) order: in a fixed
/// order each configuration always followed the same one, whose footprint in the CPU caches
/// moved its cost by up to 10% (docs/mbtls.md §9, seventeenth round).
pub fn run(
    setup: &Setup,
    version: TlsVersion,
    n: usize,
    reps: usize,
    only: Option<&[&str]>,
) -> Res<Value> {
    let configs: Vec<Config> = configs(setup, version)?
        .into_iter()
        .filter(|c| only.is_none_or(|o| o.contains(&c.name.as_str())))
        .collect();
    // samples[config][role][rep]
    let mut samples: Vec<Vec<Vec<f64>>> = configs
        .iter()
        .map(|c| vec![Vec::new(); c.roles.len()])
        .collect();
    let mut order: Vec<usize> = (0..configs.len()).collect();
    // Seeded: a run's order can be repeated.
    let mut rng = StdRng::seed_from_u64(0x6d62_746c_735f_6273);
    for rep in 0..=reps {
        let mut cpu: Vec<Vec<u64>> = configs.iter().map(|c| vec![0u64; c.specs.len()]).collect();
        let count = if rep == 0 { n.div_ceil(4) } else { n };
        for _ in 0..count {
            order.shuffle(&mut rng);
            for &ci in &order {
                let (c, cpu) = (&configs[ci], &mut cpu[ci]);
                // The first handshake of the warm-up makes the session later ones resume.
                once(&c.specs, cpu, c.resumed && rep > 0)
                    .map_err(|e| format!("{}: {e}", c.name))?;
            }
        }
        if rep > 0 {
            for (ci, cpu) in cpu.iter().enumerate() {
                for (ri, ns) in cpu.iter().enumerate() {
                    samples[ci][ri].push(*ns as f64 / count as f64 / 1e3);
                }
            }
        }
    }
    let mut rows = Vec::new();
    for (c, s) in configs.iter().zip(samples) {
        let roles: Vec<Value> = c
            .roles
            .iter()
            .zip(s)
            .map(|(r, v)| json!({"role": r, "cpu_us": stats(&v)}))
            .collect();
        let line: Vec<String> = roles
            .iter()
            .map(|r| {
                format!(
                    "{} {:.0}",
                    r["role"].as_str().unwrap_or(""),
                    r["cpu_us"]["median"].as_f64().unwrap_or(0.0)
                )
            })
            .collect();
        println!(
            "handshake {version:?} {:24}: {} µs",
            c.name,
            line.join(", ")
        );
        rows.push(json!({"config": c.name, "roles": roles}));
    }
    Ok(Value::Array(rows))
}
