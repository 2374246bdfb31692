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
use mbx_testbed::relay::{DelayRelay, FlightCounter};
use serde_json::{json, Value};

use crate::setup::{Setup, CLIENT_SIDE};
use crate::tls_io::{tcp_relay, tls_server, Serve, TlsClient};
use crate::{med, rt, stats, Res};

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
    _second: DelayRelay,
    _mbox: Option<MiddleboxServer>,
}

async fn path(server: SocketAddr, setup: Option<&Setup>) -> Res<Path> {
    let one_way = Duration::from_micros(HOP_RTT_MS * 500);
    let second = DelayRelay::start(server, one_way).await?;
    let (mid, mbox) = match setup {
        Some(setup) => {
            let app: AppFactory =
                Arc::new(|| Box::new(PassThrough) as Box<dyn MiddleboxApp + Send>);
            let m = MiddleboxServer::bind(
                "127.0.0.1:0",
                MiddleboxServerConfig {
                    handshake: setup.middlebox(CLIENT_SIDE[0], true)?,
                    next_hop: second.local_addr().to_string(),
                    app,
                    placement: Placement::ClientSide,
                },
            )
            .await?;
            (m.local_addr(), Some(m))
        }
        None => (tcp_relay(second.local_addr()).await?, None),
    };
    let flights = FlightCounter::new();
    let first = DelayRelay::builder(mid)
        .latency(one_way)
        .flights(flights.clone())
        .start()
        .await?;
    Ok(Path {
        entry: first.local_addr(),
        flights,
        first,
        _second: second,
        _mbox: mbox,
    })
}

/// One fetch; returns (ms, client round trips, flights) on the client's link.
async fn fetch(
    p: &Path,
    mbtls: Option<&ClientHandshakeConfig>,
    tls: &mbx_engine::OpenSslContext,
    expected: usize,
) -> Res<(f64, usize, usize)> {
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
    ))
}

pub fn run(setup: &Setup, reps: usize) -> Res<Value> {
    let runtime = rt("fetch", 2)?;
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
            Res::Ok((path(server, None).await?, path(server, Some(setup)).await?))
        })?;
        let (mut tb, mut tm, mut ratio) = (Vec::new(), Vec::new(), Vec::new());
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
            (rtt_b, fl_b, rtt_m, fl_m) = (b.1, b.2, m.1, m.2);
        }
        let (sb, sm, sr) = (stats(&tb), stats(&tm), stats(&ratio));
        let overhead = (med(&sm) / med(&sb) - 1.0) * 100.0;
        println!(
            "fetch {label}: TLS via TCP relay {:.1} ms, mbTLS {:.1} ms (+{overhead:.2}%); client round trips {rtt_b} vs {rtt_m}, flights {fl_b} vs {fl_m}",
            med(&sb),
            med(&sm)
        );
        out.insert(
            label.into(),
            json!({
                "tls_via_tcp_relay_ms": sb,
                "mbtls_ms": sm,
                "ratio_per_pair": sr,
                "overhead_percent_of_medians": overhead,
                "client_round_trips": {"tls": rtt_b, "mbtls": rtt_m},
                "client_link_flights": {"tls": fl_b, "mbtls": fl_m},
            }),
        );
    }
    out.insert(
        "setup".into(),
        json!({"hop_rtt_ms": HOP_RTT_MS, "hops": 2, "object_bytes": BODY,
               "middlebox": "client-side, PassThrough app, simulated attestation",
               "server": "plain TLS (OpenSSL engine), the same for both"}),
    );
    Ok(Value::Object(out))
}
