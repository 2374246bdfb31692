//! The tokio drivers over loopback TCP: an honest run and a refused one.

use mbx_blindbox_setup::driver::{run_endpoint, run_middlebox, DriverError};
use mbx_blindbox_setup::{
    Endpoint, EndpointConfig, EndpointKeys, Middlebox, MiddleboxConfig, Peer, RgKey, SetupError,
    SignedChunk,
};
use rand::rngs::StdRng;
use rand::SeedableRng;
use tokio::net::{TcpListener, TcpStream};

const K: [u8; 16] = [1; 16];
const K_RG: [u8; 16] = [2; 16];

fn chunks(n: u8) -> Vec<SignedChunk> {
    let rg = RgKey::from_bytes(K_RG);
    (0..n)
        .map(|i| {
            let chunk = [i, b'c', b'h', b'u', b'n', b'k', b'!', i];
            SignedChunk {
                chunk,
                tag: rg.tag(&chunk),
            }
        })
        .collect()
}

fn endpoint(k_rand: [u8; 32], seed: u64) -> Endpoint {
    Endpoint::new(
        EndpointKeys::from_parts(K, k_rand),
        &RgKey::from_bytes(K_RG),
        EndpointConfig {
            workers: 2,
            ..EndpointConfig::default()
        },
        &mut StdRng::seed_from_u64(seed),
    )
    .unwrap()
}

async fn three_parties(
    hash_k_rand: [u8; 32],
) -> (
    Result<
        (
            mbx_blindbox_setup::SetupOutcome,
            mbx_blindbox_setup::driver::PartyStats,
        ),
        DriverError,
    >,
    Result<mbx_blindbox_setup::driver::PartyStats, DriverError>,
    Result<mbx_blindbox_setup::driver::PartyStats, DriverError>,
) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let a = endpoint([7; 32], 1);
    let b = endpoint(hash_k_rand, 2);
    // Connect one after the other so the first accepted connection is endpoint `a`.
    let sa = TcpStream::connect(addr).await.unwrap();
    let (full, _) = listener.accept().await.unwrap();
    let sb = TcpStream::connect(addr).await.unwrap();
    let (hash, _) = listener.accept().await.unwrap();
    let ta = tokio::spawn(run_endpoint(sa, a, |_| {}));
    let tb = tokio::spawn(run_endpoint(sb, b, |_| {}));
    let mb = Middlebox::new(
        chunks(9),
        MiddleboxConfig {
            batch: 4,
            window: 2,
            workers: 2,
        },
        &mut StdRng::seed_from_u64(3),
    )
    .unwrap();
    let mut seen = Vec::new();
    let r = run_middlebox(full, hash, mb, |p| seen.push(p.circuits_done)).await;
    if r.is_ok() {
        // Progress was reported and ends at the total.
        assert_eq!(seen.last(), Some(&9));
        assert!(seen.windows(2).all(|w| w[0] <= w[1]));
    }
    (r, ta.await.unwrap(), tb.await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn honest_setup_over_tcp() {
    let (mb, a, b) = three_parties([7; 32]).await;
    let (outcome, stats) = mb.unwrap();
    let (a, b) = (a.unwrap(), b.unwrap());
    assert!(outcome.refused().is_empty());
    assert_eq!(outcome.keyword_keys().len(), 9);
    // Everything one side sent, the other received.
    assert_eq!(stats.bytes_received, a.bytes_sent + b.bytes_sent);
    assert_eq!(stats.bytes_sent, a.bytes_received + b.bytes_received);
    // The full endpoint sends the tables (≈ 320 KB per circuit), the other one a digest.
    assert!(a.bytes_sent > 9 * 319_000);
    assert!(b.bytes_sent < 200_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deviating_endpoint_makes_the_middlebox_refuse_over_tcp() {
    let (mb, a, b) = three_parties([8; 32]).await;
    assert!(matches!(
        mb,
        Err(DriverError::Setup(SetupError::LabelMismatch))
    ));
    for r in [a, b] {
        assert!(matches!(
            r,
            Err(DriverError::Setup(SetupError::Aborted {
                peer: Peer::Middlebox
            })) | Err(DriverError::Io(_))
        ));
    }
}
