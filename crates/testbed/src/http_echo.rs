//! A plain HTTP/1.1 backend on loopback that answers every request with its own head as the
//! body (`Content-Type: text/plain`, then it closes): what a middlebox changed in a request can
//! be read from the response. Used by the demos, the examples and the driver tests.

use std::net::SocketAddr;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;

/// Starts the backend on `127.0.0.1` (an ephemeral port), serving every connection on its own
/// task until the runtime ends.
pub async fn echo_backend() -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            tokio::spawn(answer_with_head(s));
        }
    });
    Ok(addr)
}

/// Reads one request head from `s`, answers with it as the body, and ends the stream (over
/// TLS: with close_notify).
pub async fn answer_with_head<S: AsyncRead + AsyncWrite + Unpin>(mut s: S) {
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(buf.get(..n).unwrap_or_default()),
        }
    }
    let answer = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        head.len()
    );
    let _ = s.write_all(answer.as_bytes()).await;
    let _ = s.write_all(&head).await;
    let _ = s.shutdown().await;
}
