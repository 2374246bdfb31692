//! Out of file descriptors, the key server's `accept` fails until one is freed. It then pauses
//! between tries (5 ms doubling to 1 s, `mbx_net::Acceptor`) instead of retrying at once,
//! counts the failures in its metrics, and serves the waiting edge once a descriptor is free.
//!
//! A test binary of its own: it lowers the whole process's `RLIMIT_NOFILE` for a moment.
//! Time is never asserted; `tokio::time::timeout` only bounds waits so a hang fails the test.

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::Bed;
use mbx_testbed::starve::{failures_while_starved, OutOfDescriptors, MOST_TRIES};
use tokio::net::TcpSocket;
use tokio::time::timeout;

const BOUND: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_descriptors_the_key_server_pauses_and_then_serves_again() {
    let bed = Bed::new();
    let server = bed.start().await;
    let stats = server.stats();

    // The client socket exists before the limit drops; connecting needs no new descriptor here,
    // and the kernel queues the connection at the listener, whose accept then fails.
    let socket = TcpSocket::new_v4().unwrap();
    let starved = OutOfDescriptors::new().unwrap();
    let waiting = socket.connect(server.local_addr()).await;
    let errors = || stats.accept_errors.load(Ordering::Relaxed);
    let tries = failures_while_starved(|| [errors()], BOUND).await;
    drop(starved);
    let [tries] = tries.expect("accept never failed with the descriptors used up");
    assert!(tries <= MOST_TRIES, "failed accepts while starved: {tries}");
    assert!(
        stats
            .render()
            .contains(&format!("keyless_accept_errors_total {}", errors())),
        "{}",
        stats.render()
    );

    // A descriptor is free again: the waiting connection is accepted, and an edge is served.
    let _waiting = waiting.unwrap();
    timeout(BOUND, async {
        while stats.connections.load(Ordering::Relaxed) == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .unwrap();
    let edge = bed.edge(&server, "edge-a").await;
    let digest = openssl::sha::sha256(b"after the starvation");
    let site = common::key(&bed.p256);
    edge.sign(&site, mbx_keyless::wire::Opcode::EcdsaSignSha256, &digest)
        .await
        .unwrap();
}
