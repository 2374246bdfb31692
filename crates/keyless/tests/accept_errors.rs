//! Out of file descriptors, the key server's `accept` fails until one is freed. It then pauses
//! between tries (5 ms doubling to 1 s, `mbx_net::Acceptor`) instead of retrying at once,
//! counts the failures in its metrics, and serves the waiting edge once a descriptor is free.
//!
//! A test binary of its own: it lowers the whole process's `RLIMIT_NOFILE` for a moment.
//! Time is never asserted; `tokio::time::timeout` only bounds waits so a hang fails the test.

mod common;

use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::Bed;
use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
use tokio::net::TcpSocket;
use tokio::time::timeout;

const BOUND: Duration = Duration::from_secs(60);

/// Failed accepts counted while the process stays out of descriptors for this long.
const STARVED: Duration = Duration::from_millis(600);
/// With pauses of 5, 10, 20, … ms at most 8 tries fit in [`STARVED`] (plus the one seen before
/// it starts), on any machine. The key server used to retry at once: thousands of failures.
const MOST_TRIES: u64 = 12;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_descriptors_the_key_server_pauses_and_then_serves_again() {
    let bed = Bed::new();
    let server = bed.start().await;
    let stats = server.stats();

    // The client socket exists before the limit drops; connecting needs no new descriptor here,
    // and the kernel queues the connection at the listener, whose accept then fails.
    let socket = TcpSocket::new_v4().unwrap();
    let saved = getrlimit(Resource::Nofile);
    let lowest_free = std::fs::File::open("/dev/null").unwrap().as_raw_fd();
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(lowest_free as u64),
            maximum: saved.maximum,
        },
    )
    .unwrap();
    let waiting = socket.connect(server.local_addr()).await;
    let errors = || stats.accept_errors.load(Ordering::Relaxed);
    let first_errors = timeout(BOUND, async {
        while errors() == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        errors()
    })
    .await
    .ok();
    tokio::time::sleep(STARVED).await;
    let tries = errors() - first_errors.unwrap_or(0);
    setrlimit(Resource::Nofile, saved).unwrap();
    assert!(
        first_errors.is_some(),
        "accept never failed with the descriptors used up"
    );
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
