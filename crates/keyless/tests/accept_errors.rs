//! Out of file descriptors, the key server's `accept` fails until one is freed. It then pauses
//! between tries (5 ms doubling to 1 s, `mbx_net::Acceptor`) instead of retrying at once,
//! counts the failures in its metrics, and serves the waiting edge once a descriptor is free.
//! The edge's listener does the same for its clients.
//!
//! A test binary of its own: it lowers the whole process's `RLIMIT_NOFILE` for a moment, so
//! its tests take turns (`STARVING`).
//! Time is never asserted; `tokio::time::timeout` only bounds waits so a hang fails the test.

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::Bed;
use mbx_testbed::starve::{failures_while_starved, OutOfDescriptors, MOST_TRIES};
use std::net::SocketAddr;
use tokio::net::{TcpSocket, TcpStream};
use tokio::time::timeout;

const BOUND: Duration = Duration::from_secs(60);

/// One test at a time runs the process out of descriptors.
static STARVING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Connects to `listener` while the process is out of descriptors and checks that its failed
/// accepts (`errors`) came with pauses; returns the connection, accepted or about to be now
/// that descriptors are free again.
async fn connect_while_starved(listener: SocketAddr, errors: impl Fn() -> u64) -> TcpStream {
    // The client socket exists before the limit drops; connecting needs no new descriptor here,
    // and the kernel queues the connection at the listener, whose accept then fails.
    let socket = TcpSocket::new_v4().unwrap();
    let starved = OutOfDescriptors::new().unwrap();
    let waiting = socket.connect(listener).await;
    let tries = failures_while_starved(|| [errors()], BOUND).await;
    drop(starved);
    let [tries] = tries.expect("accept never failed with the descriptors used up");
    assert!(tries <= MOST_TRIES, "failed accepts while starved: {tries}");
    waiting.unwrap()
}

/// Polls `done` until it holds (a hang fails the test after `BOUND`).
async fn wait_until(done: impl Fn() -> bool) {
    timeout(BOUND, async {
        while !done() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_descriptors_the_key_server_pauses_and_then_serves_again() {
    let _turn = STARVING.lock().await;
    let bed = Bed::new();
    let server = bed.start().await;
    let stats = server.stats();

    let errors = || stats.accept_errors.load(Ordering::Relaxed);
    let waiting = connect_while_starved(server.local_addr(), errors).await;
    assert!(
        stats
            .render()
            .contains(&format!("keyless_accept_errors_total {}", errors())),
        "{}",
        stats.render()
    );

    // A descriptor is free again: the waiting connection is accepted, and an edge is served.
    let _waiting = waiting;
    wait_until(|| stats.connections.load(Ordering::Relaxed) > 0).await;
    let edge = bed.edge(&server, "edge-a").await;
    let digest = openssl::sha::sha256(b"after the starvation");
    let site = common::key(&bed.p256);
    edge.sign(&site, mbx_keyless::wire::Opcode::EcdsaSignSha256, &digest)
        .await
        .unwrap();
}

/// An edge with one site (p256.example) whose key server group points at a closed port: the
/// listener is what is tested, not signing.
async fn edge_on_loopback(bed: &Bed, dir: &std::path::Path) -> mbx_keyless::edge::RunningEdge {
    let edge_files = bed.edge_cert("edge-a").write_to_named(dir, "edge").unwrap();
    std::fs::write(dir.join("keyserver-ca.pem"), bed.server_pki.root_pem()).unwrap();
    std::fs::write(dir.join("origin.ticket"), "11".repeat(32)).unwrap();
    let text = format!(
        "listen = \"127.0.0.1:0\"\n\
         [key_servers.a]\naddresses = [\"127.0.0.1:1\"]\nserver_name = \"keyserver.test\"\n\
         ca = {:?}\ncertificate = {:?}\nprivate_key = {:?}\n\
         [origins.o]\naddress = \"127.0.0.1:1\"\nticket_key_file = {:?}\n\
         [sites.\"p256.example\"]\ncertificate = {:?}\nkey_server = \"a\"\norigin = \"o\"\n",
        dir.join("keyserver-ca.pem"),
        edge_files.chain,
        edge_files.key,
        dir.join("origin.ticket"),
        bed.key_dir.path().join("p256.example.crt"),
    );
    let config = mbx_keyless::edge::EdgeConfig::from_toml(&text).unwrap();
    mbx_keyless::edge::Edge::from_config(&config)
        .unwrap()
        .bind(config.listen)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_descriptors_the_edge_pauses_and_then_serves_again() {
    let _turn = STARVING.lock().await;
    let bed = Bed::new();
    let dir = tempfile::tempdir().unwrap();
    let edge = edge_on_loopback(&bed, dir.path()).await;
    let stats = std::sync::Arc::clone(edge.edge().stats());

    let errors = || stats.accept_errors.load(Ordering::Relaxed);
    let mut waiting = connect_while_starved(edge.local_addr(), errors).await;

    // A descriptor is free again: the waiting client is accepted and its (not TLS) bytes fail
    // a handshake, which only an accepted connection can.
    use tokio::io::AsyncWriteExt;
    waiting.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
    wait_until(|| stats.handshake_failures.load(Ordering::Relaxed) > 0).await;
}
