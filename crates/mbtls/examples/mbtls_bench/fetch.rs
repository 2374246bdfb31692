//! Benchmark 3 (paper Figure 6): time to fetch a small object through one middlebox with
//! emulated RTTs: client → DelayRelay (RTT `HOP_RTT`) → middlebox → DelayRelay (`HOP_RTT`) →
//! server. mbTLS: an mbTLS client, the client-side [`MiddleboxServer`] driver. Baseline: a
//! plain TLS client and a plain TCP relay as the middlebox. The server is the same plain TLS
//! server (OpenSSL engine) in both, answering a 1 KB object; the client's request leaves with
//! its handshake's last flight in both. Flights are counted on the client's link.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mbx_apps::{MiddleboxApp, PassThrough};
use mbx_mbtls::driver::{
    AppFactory, MbtlsClient, MiddleboxServer, MiddleboxServerConfig, Placement,
};
use mbx_mbtls::handshake::{ClientHandshakeConfig, ClientMiddlebox};
use mbx_record::TlsVersion;
use mbx_testbed::bench::{med, runtime as rt, stats};
use mbx_testbed::relay::{DelayRelay, Direction, FlightCounter, Tap};
use serde_json::{json, Value};

use crate::setup::{Setup, CLIENT_SIDE};
use crate::tls_io::{tcp_relay, tls_server, Serve, TlsClient};
use crate::Res;

/// Round-trip time of each of the two hops, ms.
pub const HOP_RTT_MS: u64 = 20;
const REQUEST: &[u8] = b"GET /object HTTP/1.1\r\nHost: server.test\r\n\r\n";
const BODY: usize = 1024;

fn response() -> Vec<u8> {
    let mut r = format!("HTTP/1.1 200 OK\r\nContent-Length: {BODY}\r\n\r\n").into_bytes();
    r.extend_from_slice(&[b'x'; BODY]);
    r
}

struct Path {
    entry: SocketAddr,
    flights: FlightCounter,
    first: DelayRelay,
    second: DelayRelay,
    /// Chunks seen on the client's link and on the server's link, with the instants (close to)
    /// each relay's start, to put both on one timeline (`MBTLS_BENCH_FETCH_ONLY`).
    taps: Option<[(Tap, tokio::time::Instant); 2]>,
    _mbox: Option<MiddleboxServer>,
}

/// Starts a relay on the `net` runtime: the emulated network keeps its own worker threads, so
/// a node busy with CPU work on the nodes' runtime cannot hold up the network's clocks (tokio
/// only polls for I/O when a worker is free).
/// Returns the relay and an instant just before it started (its tap's time origin).
async fn start_relay(
    net: &tokio::runtime::Handle,
    b: mbx_testbed::relay::DelayRelayBuilder,
) -> Res<(DelayRelay, tokio::time::Instant)> {
    let (relay, t) = net
        .spawn(async move {
            let t = tokio::time::Instant::now();
            (b.start().await, t)
        })
        .await?;
    Ok((relay?, t))
}

async fn path(
    net: &tokio::runtime::Handle,
    server: SocketAddr,
    setup: Option<&Setup>,
    timeline: bool,
) -> Res<Path> {
    let one_way = Duration::from_micros(HOP_RTT_MS * 500);
    let (tap1, tap2) = (Tap::new(), Tap::new());
    let mut b2 = DelayRelay::builder(server).latency(one_way);
    if timeline {
        b2 = b2.tap(tap2.clone());
    }
    let (second, t2) = start_relay(net, b2).await?;
    let (mid, mbox) = match setup {
        Some(setup) => {
            let app: AppFactory =
                Arc::new(|| Box::new(PassThrough) as Box<dyn MiddleboxApp + Send>);
            let m = MiddleboxServer::bind(
                "127.0.0.1:0",
                MiddleboxServerConfig {
                    handshake: setup.middlebox(CLIENT_SIDE[0], true)?,
                    next_hop: second.local_addr().to_string().into(),
                    app,
                    placement: Placement::ClientSide,
                    limits: mbx_mbtls::driver::Limits::default(),
                    forget_legacy_after: None,
                },
            )
            .await?;
            (m.local_addr(), Some(m))
        }
        None => (tcp_relay(second.local_addr()).await?, None),
    };
    let flights = FlightCounter::new();
    let mut b1 = DelayRelay::builder(mid)
        .latency(one_way)
        .flights(flights.clone());
    if timeline {
        b1 = b1.tap(tap1.clone());
    }
    let (first, t1) = start_relay(net, b1).await?;
    Ok(Path {
        entry: first.local_addr(),
        flights,
        first,
        second,
        taps: timeline.then_some([(tap1, t1), (tap2, t2)]),
        _mbox: mbox,
    })
}

/// One departure seen by a relay: ms since the fetch started, which link and way, bytes.
type Departure = (f64, &'static str, usize);

/// One fetch's chunks on both links, as departures from their sender (arrival at the relay),
/// consecutive chunks of one link and way within 1 ms merged into one flight.
fn timeline(p: &Path, t0: tokio::time::Instant) -> Vec<Departure> {
    let Some(taps) = &p.taps else {
        return Vec::new();
    };
    let mut ev = Vec::new();
    for ((tap, start), relay, names) in [
        (&taps[0], &p.first, ["client>mbox", "mbox>client"]),
        (&taps[1], &p.second, ["mbox>server", "server>mbox"]),
    ] {
        let conn = relay.accepted().saturating_sub(1);
        for r in tap.records().iter().filter(|r| r.conn == conn) {
            let at = (*start + r.offset).saturating_duration_since(t0);
            let name = match r.direction {
                Direction::ClientToServer => names[0],
                Direction::ServerToClient => names[1],
            };
            ev.push((at.as_secs_f64() * 1e3, name, r.data.len()));
        }
        tap.clear();
    }
    ev.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut flights: Vec<Departure> = Vec::new();
    for e in ev {
        match flights.iter_mut().rev().find(|f| f.1 == e.1) {
            Some(f) if e.0 - f.0 < 1.0 => f.2 += e.2,
            _ => flights.push(e),
        }
    }
    flights
}

/// One fetch; returns (ms, client round trips, flights) on the client's link, and the
/// departures of its flights when the path records them.
async fn fetch(
    p: &Path,
    mbtls: Option<&ClientHandshakeConfig>,
    tls: &mbx_engine::OpenSslContext,
    expected: usize,
) -> Res<(f64, usize, usize, Vec<Departure>)> {
    let t0i = tokio::time::Instant::now();
    let t0 = Instant::now();
    let got = match mbtls {
        Some(cfg) => {
            let mut c = MbtlsClient::connect_with_data(p.entry, cfg.clone(), REQUEST).await?;
            let mut got = Vec::new();
            while got.len() < expected {
                match c.read().await? {
                    Some(d) => got.extend(d),
                    None => break,
                }
            }
            got.len()
        }
        None => {
            let mut c = TlsClient::connect(p.entry, tls, REQUEST).await?;
            c.read_exact(expected).await?.len()
        }
    };
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    if got < expected {
        return Err(format!("short response: {got} of {expected}").into());
    }
    let conn = p.first.accepted().saturating_sub(1);
    Ok((
        ms,
        p.flights.round_trips(conn),
        p.flights.sequence(conn).len(),
        timeline(p, t0i),
    ))
}

/// Median departure time of each flight, over fetches with the same flight sequence as the
/// first one.
fn median_timeline(all: &[Vec<Departure>]) -> Vec<(f64, &'static str, usize)> {
    let Some(first) = all.first() else {
        return Vec::new();
    };
    let same: Vec<&Vec<Departure>> = all
        .iter()
        .filter(|t| t.len() == first.len() && t.iter().zip(first).all(|(a, b)| a.1 == b.1))
        .collect();
    (0..first.len())
        .map(|i| {
            let mut v: Vec<f64> = same.iter().map(|t| t[i].0).collect();
            v.sort_by(f64::total_cmp);
            (v[v.len() / 2], first[i].1, first[i].2)
        })
        .collect()
}

/// Runs `reps` pairs per version (after 2 warm-up pairs, alternating which goes first).
/// `timeline`: record and print when each flight left its sender (both links), per path.
pub fn run(setup: &Setup, reps: usize, timeline: bool) -> Res<Value> {
    let runtime = rt("fetch", 2)?;
    let net = rt("net", 1)?;
    let mut out = serde_json::Map::new();
    let resp = Arc::new(response());
    for (label, version) in [
        ("TLS 1.3", TlsVersion::Tls13),
        ("TLS 1.2", TlsVersion::Tls12),
    ] {
        let tls = setup.tls_client(version)?;
        let mb_cfg = setup.mbtls_client(
            version,
            ClientMiddlebox::Preconfigured(CLIENT_SIDE[0].into()),
            true,
        )?;
        let (base, mb) = runtime.block_on(async {
            let server =
                tls_server(setup.tls_server(version)?, Serve::Respond(resp.clone())).await?;
            Res::Ok((
                path(net.handle(), server, None, timeline).await?,
                path(net.handle(), server, Some(setup), timeline).await?,
            ))
        })?;
        let (mut tb, mut tm, mut ratio) = (Vec::new(), Vec::new(), Vec::new());
        let (mut tl_b, mut tl_m) = (Vec::new(), Vec::new());
        let (mut rtt_b, mut rtt_m, mut fl_b, mut fl_m) = (0, 0, 0, 0);
        for i in 0..reps + 2 {
            // Alternate which goes first so drifting load hits both alike.
            let (b, m) = runtime.block_on(async {
                if i % 2 == 0 {
                    let b = fetch(&base, None, &tls, resp.len()).await?;
                    let m = fetch(&mb, Some(&mb_cfg), &tls, resp.len()).await?;
                    Res::Ok((b, m))
                } else {
                    let m = fetch(&mb, Some(&mb_cfg), &tls, resp.len()).await?;
                    let b = fetch(&base, None, &tls, resp.len()).await?;
                    Res::Ok((b, m))
                }
            })?;
            if i < 2 {
                continue; // warm-up
            }
            tb.push(b.0);
            tm.push(m.0);
            ratio.push(m.0 / b.0);
            tl_b.push(b.3);
            tl_m.push(m.3);
            (rtt_b, fl_b, rtt_m, fl_m) = (b.1, b.2, m.1, m.2);
        }
        let (sb, sm, sr) = (stats(&tb), stats(&tm), stats(&ratio));
        let overhead = (med(&sm) / med(&sb) - 1.0) * 100.0;
        let overhead_pairs = (med(&sr) - 1.0) * 100.0;
        println!(
            "fetch {label}: TLS via TCP relay {:.1} ms, mbTLS {:.1} ms (ratio of medians +{overhead:.2}%, median per-pair ratio +{overhead_pairs:.2}%); client round trips {rtt_b} vs {rtt_m}, flights {fl_b} vs {fl_m}",
            med(&sb),
            med(&sm)
        );
        if timeline {
            for (name, tl) in [("TLS", &tl_b), ("mbTLS", &tl_m)] {
                let flights: Vec<String> = median_timeline(tl)
                    .iter()
                    .map(|(ms, link, bytes)| format!("{ms:.2} {link} {bytes}B"))
                    .collect();
                println!(
                    "  {name} flights (median departure, ms): {}",
                    flights.join(" | ")
                );
            }
        }
        out.insert(
            label.into(),
            json!({
                "tls_via_tcp_relay_ms": sb,
                "mbtls_ms": sm,
                "ratio_per_pair": sr,
                "overhead_percent_of_medians": overhead,
                "overhead_percent_median_per_pair": overhead_pairs,
                "client_round_trips": {"tls": rtt_b, "mbtls": rtt_m},
                "client_link_flights": {"tls": fl_b, "mbtls": fl_m},
            }),
        );
    }
    out.insert(
        "setup".into(),
        json!({"hop_rtt_ms": HOP_RTT_MS, "hops": 2, "object_bytes": BODY, "pairs": reps,
               "middlebox": "client-side, PassThrough app, simulated attestation",
               "server": "plain TLS (OpenSSL engine), the same for both"}),
    );
    Ok(Value::Object(out))
}
