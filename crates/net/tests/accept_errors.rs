//! Out of file descriptors, `accept` fails until one is freed. [`Acceptor`] then pauses between
//! tries (5 ms doubling to 1 s) instead of retrying at once, and returns the waiting connection
//! once a descriptor is free again.
//!
//! A test binary of its own: it lowers the whole process's `RLIMIT_NOFILE` for a moment.
//! Time is never asserted; `tokio::time::timeout` only bounds waits so a hang fails the test.

use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::time::Duration;

use mbx_net::Acceptor;
use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
use tokio::net::{TcpListener, TcpSocket};
use tokio::time::timeout;

const BOUND: Duration = Duration::from_secs(60);

/// Failed accepts counted while the process stays out of descriptors for this long.
const STARVED: Duration = Duration::from_millis(600);
/// With pauses of 5, 10, 20, … ms at most 8 tries fit in [`STARVED`] (plus the one seen before
/// it starts), on any machine: a slower one only tries less often. An acceptor that retried at
/// once fails thousands of times in that window.
const MOST_TRIES: u64 = 12;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_descriptors_the_acceptor_pauses_and_then_accepts() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut acceptor = Acceptor::new(listener);
    let addr = acceptor.local_addr().unwrap();
    let errors = acceptor.error_count();
    let accepting = tokio::spawn(async move { acceptor.accept().await });

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
    let client = socket.connect(addr).await;
    let first_errors = timeout(BOUND, async {
        while errors.load(Ordering::Relaxed) == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        errors.load(Ordering::Relaxed)
    })
    .await
    .ok();
    tokio::time::sleep(STARVED).await;
    let tries = errors.load(Ordering::Relaxed) - first_errors.unwrap_or(0);
    setrlimit(Resource::Nofile, saved).unwrap();
    assert!(
        first_errors.is_some(),
        "accept never failed with the descriptors used up"
    );
    assert!(tries <= MOST_TRIES, "failed accepts while starved: {tries}");

    // A descriptor is free again: the waiting connection is accepted.
    let client = client.unwrap();
    let (_server_side, peer) = timeout(BOUND, accepting).await.unwrap().unwrap();
    assert_eq!(peer, client.local_addr().unwrap());
}
