//! What a TCP socket still holds for its peer. A driver that must end a connection with a
//! reset (a stream cut short must not pass for a whole one) waits for the bytes it already
//! handed to the kernel to reach the peer first: a reset drops them, and a proxy's local
//! application lost the last megabyte of a download it had been given (found in a user trial).

use std::os::fd::AsRawFd;
use std::time::Duration;

use tokio::net::TcpStream;

/// Bytes `socket` still holds toward its peer: not sent yet, or sent and not acknowledged
/// (Linux `SIOCOUTQ`, which is `TIOCOUTQ`; a TCP socket only, whose request the kernel knows,
/// hence the type). Elsewhere than on Linux the call fails, and [`until_sent`] does not wait.
pub fn unsent(socket: &TcpStream) -> std::io::Result<usize> {
    let mut n: libc::c_int = 0;
    // SAFETY: the descriptor is borrowed from a socket that lives for the call, and
    // SIOCOUTQ writes one `c_int` through the pointer, which points at `n`.
    #[allow(unsafe_code)]
    let r = unsafe { libc::ioctl(socket.as_raw_fd(), libc::TIOCOUTQ, &mut n) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(usize::try_from(n).unwrap_or(0))
}

/// Waits until `socket` holds nothing more for its peer, at most `within` (a peer that stopped
/// reading would hold it forever). Polls: this is for a connection that is ending.
pub async fn until_sent(socket: &TcpStream, within: Duration) {
    let _ = tokio::time::timeout(within, async {
        while unsent(socket).is_ok_and(|n| n > 0) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// What the peer has not read is counted until it reads it; then nothing is.
    #[tokio::test]
    async fn what_the_peer_has_not_read_is_unsent_until_it_reads() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut writer = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (mut reader, _) = listener.accept().await.unwrap();
        assert_eq!(unsent(&writer).unwrap(), 0);
        // Until the reader's buffer and ours are full: the rest of what was written stays
        // with the writer.
        let data = vec![7u8; 64 * 1024];
        let mut wrote = 0;
        while let Ok(n) = writer.try_write(&data) {
            wrote += n;
        }
        until_sent(&writer, Duration::from_millis(50)).await;
        assert!(
            unsent(&writer).unwrap() > 0,
            "a peer that does not read holds nothing"
        );
        let mut got = vec![0u8; wrote];
        let reading = tokio::spawn(async move {
            reader.read_exact(&mut got).await.unwrap();
            reader
        });
        until_sent(&writer, Duration::from_secs(60)).await;
        assert_eq!(unsent(&writer).unwrap(), 0);
        let _reader = reading.await.unwrap();
        writer.shutdown().await.unwrap();
    }
}
