//! The delay relay forwards bytes intact and in order, the tap sees exactly those bytes, the
//! flight counter counts a known ping-pong, and dropping the relay stops everything.
//! No assertion looks at time.

use std::net::SocketAddr;
use std::time::Duration;

use mbx_testbed::relay::{DelayRelay, Direction, FlightCounter, Tap};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Deterministic xorshift so failures reproduce.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Echo server that reads and writes in random chunk sizes.
async fn echo_server(seed: u64) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut conn_seed = seed;
        while let Ok((mut s, _)) = listener.accept().await {
            conn_seed += 1;
            tokio::spawn(async move {
                let mut rng = Rng(conn_seed);
                let mut buf = vec![0u8; 8192];
                loop {
                    let want = 1 + rng.below(buf.len());
                    let n = match s.read(&mut buf[..want]).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => n,
                    };
                    // Write back in up to three pieces.
                    let mut off = 0;
                    while off < n {
                        let piece = 1 + rng.below(n - off);
                        if s.write_all(&buf[off..off + piece]).await.is_err() {
                            return;
                        }
                        off += piece;
                    }
                }
                let _ = s.shutdown().await;
            });
        }
    });
    addr
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut rng = Rng(seed);
    (0..len).map(|_| rng.next() as u8).collect()
}

async fn pump(addr: SocketAddr, data: Vec<u8>, seed: u64) -> Vec<u8> {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut r, mut w) = stream.into_split();
    let len = data.len();
    let writer = tokio::spawn(async move {
        let mut rng = Rng(seed);
        let mut off = 0;
        while off < data.len() {
            let n = (1 + rng.below(20_000)).min(data.len() - off);
            w.write_all(&data[off..off + n]).await.unwrap();
            off += n;
            if rng.below(4) == 0 {
                tokio::task::yield_now().await;
            }
        }
        w.shutdown().await.unwrap();
    });
    let mut got = Vec::with_capacity(len);
    r.read_to_end(&mut got).await.unwrap();
    writer.await.unwrap();
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relays_random_chunks_intact_in_order_and_tap_sees_exactly_them() {
    let upstream = echo_server(7).await;
    for (latency, seed) in [(Duration::ZERO, 1u64), (Duration::from_millis(3), 2)] {
        let tap = Tap::new();
        let relay = DelayRelay::builder(upstream)
            .latency(latency)
            .tap(tap.clone())
            .start()
            .await
            .unwrap();
        assert_ne!(relay.local_addr().port(), 0);
        let data = pattern(300_000, seed);
        let got = pump(relay.local_addr(), data.clone(), seed + 100).await;
        assert_eq!(got.len(), data.len());
        assert!(
            got == data,
            "echo through relay differs (latency {latency:?})"
        );
        assert_eq!(relay.accepted(), 1);
        // The tap recorded exactly the bytes of each direction, in order.
        assert!(tap.bytes(0, Direction::ClientToServer) == data);
        assert!(tap.bytes(0, Direction::ServerToClient) == data);
        let records = tap.records();
        assert!(records.iter().all(|r| r.conn == 0 && !r.data.is_empty()));
        let total: usize = records.iter().map(|r| r.data.len()).sum();
        assert_eq!(total, 2 * data.len());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_parallel_connections_keep_their_streams_apart() {
    let upstream = echo_server(11).await;
    let tap = Tap::new();
    let relay = DelayRelay::builder(upstream)
        .latency_for(Direction::ClientToServer, Duration::from_millis(2))
        .latency_for(Direction::ServerToClient, Duration::from_millis(1))
        .tap(tap.clone())
        .start()
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for i in 0..8u64 {
        let addr = relay.local_addr();
        tasks.push(tokio::spawn(async move {
            let data = pattern(50_000 + i as usize * 997, 1000 + i);
            let got = pump(addr, data.clone(), 2000 + i).await;
            (data, got)
        }));
    }
    let mut sent = Vec::new();
    for t in tasks {
        let (data, got) = t.await.unwrap();
        assert!(got == data);
        sent.push(data);
    }
    assert_eq!(relay.accepted(), 8);
    // Every connection's tapped stream is one of the sent streams (accept order is not spawn order).
    for conn in 0..8 {
        let c2s = tap.bytes(conn, Direction::ClientToServer);
        assert!(sent.contains(&c2s), "conn {conn} tap is not a sent stream");
        assert!(tap.bytes(conn, Direction::ServerToClient) == c2s);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_close_is_forwarded_after_data() {
    // Upstream reads to EOF, then answers and closes: only works if the relay forwards FIN
    // after the data, in both directions.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut req = Vec::new();
        s.read_to_end(&mut req).await.unwrap();
        s.write_all(format!("got {} bytes", req.len()).as_bytes())
            .await
            .unwrap();
        s.shutdown().await.unwrap();
        req
    });
    let relay = DelayRelay::start(upstream, Duration::from_millis(2))
        .await
        .unwrap();
    let mut c = TcpStream::connect(relay.local_addr()).await.unwrap();
    c.write_all(b"request body").await.unwrap();
    c.shutdown().await.unwrap();
    let mut resp = String::new();
    c.read_to_string(&mut resp).await.unwrap();
    assert_eq!(resp, "got 12 bytes");
    assert_eq!(server.await.unwrap(), b"request body");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flight_counter_counts_ping_pong() {
    // A server that answers only after the whole request arrived, in two writes.
    const MSG: usize = 400;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut req = vec![0u8; MSG];
        while s.read_exact(&mut req).await.is_ok() {
            let (a, b) = req.split_at(MSG / 3);
            s.write_all(a).await.unwrap();
            s.write_all(b).await.unwrap();
        }
    });
    let flights = FlightCounter::new();
    let relay = DelayRelay::builder(upstream)
        .latency(Duration::from_millis(1))
        .flights(flights.clone())
        .start()
        .await
        .unwrap();
    let mut c = TcpStream::connect(relay.local_addr()).await.unwrap();
    const ROUNDS: usize = 5;
    for i in 0..ROUNDS {
        // Two writes without waiting are still one flight.
        let msg = format!("ping {i} ").repeat(100)[..MSG].to_owned();
        let (a, b) = msg.as_bytes().split_at(msg.len() / 2);
        c.write_all(a).await.unwrap();
        c.write_all(b).await.unwrap();
        let mut back = vec![0u8; msg.len()];
        c.read_exact(&mut back).await.unwrap();
        assert_eq!(back, msg.as_bytes());
    }
    let seq = flights.sequence(0);
    let expected: Vec<Direction> = (0..ROUNDS)
        .flat_map(|_| [Direction::ClientToServer, Direction::ServerToClient])
        .collect();
    assert_eq!(seq, expected);
    assert_eq!(flights.total(), 2 * ROUNDS);
    assert_eq!(flights.round_trips(0), ROUNDS);
    assert_eq!(flights.count(0, Direction::ServerToClient), ROUNDS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_stops_listener_and_connections() {
    let upstream = echo_server(5).await;
    let relay = DelayRelay::start(upstream, Duration::ZERO).await.unwrap();
    let addr = relay.local_addr();
    let mut c = TcpStream::connect(addr).await.unwrap();
    c.write_all(b"x").await.unwrap();
    let mut one = [0u8; 1];
    c.read_exact(&mut one).await.unwrap();
    drop(relay);
    // The open connection ends: EOF or reset, never more data.
    let mut rest = Vec::new();
    let res = c.read_to_end(&mut rest).await;
    assert!(res.is_err() || rest.is_empty());
    // The listener is gone: new connections are refused (polled: abort is asynchronous).
    let mut refused = false;
    for _ in 0..500 {
        match TcpStream::connect(addr).await {
            Err(_) => {
                refused = true;
                break;
            }
            Ok(s) => {
                drop(s);
                tokio::task::yield_now().await;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }
    assert!(refused, "relay still accepts after drop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_upstream_closes_client() {
    let down = mbx_testbed::refusing_addr();
    let relay = DelayRelay::start(down.addr(), Duration::ZERO)
        .await
        .unwrap();
    let mut c = TcpStream::connect(relay.local_addr()).await.unwrap();
    let mut buf = Vec::new();
    let res = c.read_to_end(&mut buf).await;
    assert!(res.is_err() || buf.is_empty());
}

/// With tokio's paused clock, time is virtual and advances only to pending timers, so a lower
/// bound on elapsed virtual time is deterministic: it proves the delay is applied (and per
/// direction) without measuring wall time. Upper bounds are never checked.
#[tokio::test(start_paused = true)]
async fn latency_is_applied_per_direction_on_a_virtual_clock() {
    const ROUNDS: u32 = 3;
    for (c2s, s2c) in [(50u64, 50u64), (80, 0), (0, 30)] {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let upstream = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut b = [0u8; 4];
            while s.read_exact(&mut b).await.is_ok() {
                s.write_all(&b).await.unwrap();
            }
        });
        let relay = DelayRelay::builder(upstream)
            .latency_for(Direction::ClientToServer, Duration::from_millis(c2s))
            .latency_for(Direction::ServerToClient, Duration::from_millis(s2c))
            .start()
            .await
            .unwrap();
        let mut c = TcpStream::connect(relay.local_addr()).await.unwrap();
        let start = tokio::time::Instant::now();
        for i in 0..ROUNDS {
            c.write_all(&i.to_be_bytes()).await.unwrap();
            let mut b = [0u8; 4];
            c.read_exact(&mut b).await.unwrap();
            assert_eq!(u32::from_be_bytes(b), i);
        }
        let elapsed = start.elapsed();
        let one_rtt = Duration::from_millis(c2s + s2c);
        assert!(
            elapsed >= one_rtt * ROUNDS,
            "{c2s}/{s2c}: {elapsed:?} < {ROUNDS} x {one_rtt:?}"
        );
    }
}
