//! Out of file descriptors, `accept` fails until one is freed. [`Acceptor`] then pauses between
//! tries (5 ms doubling to 1 s) instead of retrying at once, and returns the waiting connection
//! once a descriptor is free again.
//!
//! A test binary of its own: it lowers the whole process's `RLIMIT_NOFILE` for a moment.
//! Time is never asserted; `tokio::time::timeout` only bounds waits so a hang fails the test.

use std::sync::atomic::Ordering;
use std::time::Duration;

use mbx_net::Acceptor;
use mbx_testbed::starve::{failures_while_starved, OutOfDescriptors, MOST_TRIES};
use tokio::net::{TcpListener, TcpSocket};
use tokio::time::timeout;

const BOUND: Duration = Duration::from_secs(60);

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
    let starved = OutOfDescriptors::new().unwrap();
    let client = socket.connect(addr).await;
    let tries = failures_while_starved(|| [errors.load(Ordering::Relaxed)], BOUND).await;
    drop(starved);
    let [tries] = tries.expect("accept never failed with the descriptors used up");
    assert!(tries <= MOST_TRIES, "failed accepts while starved: {tries}");

    // A descriptor is free again: the waiting connection is accepted.
    let client = client.unwrap();
    let (_server_side, peer) = timeout(BOUND, accepting).await.unwrap().unwrap();
    assert_eq!(peer, client.local_addr().unwrap());
}
