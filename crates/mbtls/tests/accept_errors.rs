//! Out of file descriptors, a listener's `accept` fails until one is freed. The middlebox and
//! the mbTLS server then pause between tries (5 ms doubling to 1 s) instead of retrying at once,
//! and serve the waiting connection once a descriptor is free again.
//!
//! A test binary of its own: it lowers the whole process's `RLIMIT_NOFILE` for a moment.
//! Time is never asserted; `tokio::time::timeout` only bounds waits so a hang fails the test.

use std::sync::Arc;
use std::time::Duration;

use mbx_attest::Policy;
use mbx_engine::{Identity, OpenSslContext, TlsConfig};
use mbx_mbtls::driver::{
    Limits, MbtlsServer, MbtlsServerConfig, MiddleboxServer, MiddleboxServerConfig, Placement,
};
use mbx_mbtls::handshake::{MiddleboxHandshakeConfig, ServerHandshakeConfig, ServerMiddlebox};
use mbx_testbed::starve::{failures_while_starved, OutOfDescriptors, MOST_TRIES};
use mbx_testbed::{LeafSpec, TestPki};
use tokio::net::TcpSocket;
use tokio::time::timeout;

const BOUND: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_descriptors_the_listeners_pause_and_then_serve_again() {
    let pki = TestPki::new("accept errors CA").unwrap();
    let leaf = |spec: LeafSpec| {
        let l = pki.issue(&spec).unwrap();
        Identity::from_pem(l.chain_pem(), l.key_pem().as_bytes())
    };
    // A next hop nobody listens on: an accepted middlebox connection ends at once.
    let refusing = mbx_testbed::refusing_addr();
    let refused = refusing.addr();
    let mut mbox = MiddleboxServer::bind(
        "127.0.0.1:0",
        MiddleboxServerConfig {
            handshake: MiddleboxHandshakeConfig::new(
                &TlsConfig::server(leaf(LeafSpec::middlebox("mb.test"))),
                None,
            )
            .unwrap(),
            next_hop: refused.to_string().into(),
            app: Arc::new(|| Box::new(mbx_apps::PassThrough) as Box<_>),
            placement: Placement::ClientSide,
            limits: Limits::default(),
            forget_legacy_after: None,
        },
    )
    .await
    .unwrap();
    let mut primary = TlsConfig::server(leaf(LeafSpec::server("server.test")));
    primary.pause_after_handshake = true;
    let secondary = TlsConfig::client("mb.test", pki.root_pem().into_bytes());
    let mut server = MbtlsServer::bind(
        "127.0.0.1:0",
        MbtlsServerConfig {
            handshake: ServerHandshakeConfig {
                primary: Arc::new(OpenSslContext::new(&primary).unwrap()),
                secondary: Arc::new(OpenSslContext::new(&secondary).unwrap()),
                middlebox: ServerMiddlebox::Discover(Arc::new(|_: &[Vec<u8>]| false)),
                policy: Policy::default(),
                now_unix: 0,
                announcements_after_hello: false,
            },
            backend: refused.to_string(),
            limits: Limits::default(),
            backend_unavailable: None,
        },
    )
    .await
    .unwrap();

    // The client sockets exist before the limit drops; connecting needs no new descriptor here,
    // and the kernel queues the connections at the listeners, whose accept then fails.
    let sockets = [TcpSocket::new_v4().unwrap(), TcpSocket::new_v4().unwrap()];
    let starved = OutOfDescriptors::new().unwrap();
    let [a, b] = sockets;
    let to_mbox = a.connect(mbox.local_addr()).await;
    let to_server = b.connect(server.local_addr()).await;
    let counts = || [mbox.accept_errors(), server.accept_errors()];
    let tries = failures_while_starved(counts, BOUND).await;
    drop(starved);
    let tries = tries.expect("accept never failed with the descriptors used up");
    assert!(
        tries.iter().all(|&t| t <= MOST_TRIES),
        "failed accepts while starved (middlebox, server): {tries:?}"
    );

    // A descriptor is free again: both listeners take their waiting connection.
    let (to_mbox, to_server) = (to_mbox.unwrap(), to_server.unwrap());
    let report = timeout(BOUND, mbox.next_report()).await.unwrap().unwrap();
    assert!(
        report
            .outcome
            .as_ref()
            .is_err_and(|e| e.contains("next hop")),
        "{report:?}"
    );
    drop(to_server);
    let report = timeout(BOUND, server.next_report()).await.unwrap().unwrap();
    assert!(report.outcome.is_err(), "{report:?}");
    drop(to_mbox);
}
