//! Waiting in a test: for a peer to close a socket, for a process to print something.

use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

/// Reads from `sock`, discarding what arrives, until the peer closes it (EOF or reset); `false`
/// if it is still open after `bound`.
pub async fn closed_by_peer(sock: &mut TcpStream, bound: Duration) -> bool {
    let mut buf = [0u8; 256];
    tokio::time::timeout(bound, async {
        while let Ok(n) = sock.read(&mut buf).await {
            if n == 0 {
                break;
            }
        }
    })
    .await
    .is_ok()
}

/// Polls `log` (e.g. [`OpensslServer::log`](crate::OpensslServer::log)) every 20 ms until it
/// holds `text` at least `times` times; `Err` with the last log if it does not within `bound`.
pub async fn printed(
    log: impl Fn() -> String,
    text: &str,
    times: usize,
    bound: Duration,
) -> Result<(), String> {
    let seen = tokio::time::timeout(bound, async {
        while log().matches(text).count() < times {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    seen.map_err(|_| format!("never printed {text:?} {times}×: {}", log()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    #[tokio::test]
    async fn a_close_is_seen_and_an_open_socket_is_not() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut ours = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (peer, _) = listener.accept().await.unwrap();
        let bound = Duration::from_millis(100);
        assert!(!closed_by_peer(&mut ours, bound).await, "the peer is open");
        drop(peer);
        assert!(closed_by_peer(&mut ours, Duration::from_secs(10)).await);
    }

    #[tokio::test]
    async fn printed_counts_occurrences() {
        let log = || "a b a".to_string();
        let bound = Duration::from_millis(100);
        assert_eq!(printed(log, "a", 2, bound).await, Ok(()));
        assert!(printed(log, "a", 3, bound).await.is_err());
    }
}
