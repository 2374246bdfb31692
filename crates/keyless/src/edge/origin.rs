//! Forwarding one request to the origin over plain HTTP/1.1 (one connection per request,
//! `Connection: close`), and reading its whole response.

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::http::{
    decode_chunked, head_end, parse_response, response_framing, Framing, HttpError, RequestHead,
    ResponseHead,
};

/// Why the origin exchange failed (the client gets 502).
#[derive(Debug, thiserror::Error)]
pub enum OriginError {
    /// Socket error.
    #[error("origin socket: {0}")]
    Io(#[from] std::io::Error),
    /// The origin's answer is not HTTP we accept.
    #[error("origin response: {0}")]
    Http(#[from] HttpError),
    /// The origin closed before the response was complete.
    #[error("origin closed early")]
    Truncated,
}

/// The request as sent to the origin: the client's end-to-end fields, our Host, framing by
/// Content-Length, forwarding information.
pub fn origin_request(head: &RequestHead, host: &str, body: &[u8], client: SocketAddr) -> Vec<u8> {
    let mut out = format!(
        "{} {} HTTP/1.1\r\nHost: {host}\r\n",
        head.method, head.target
    )
    .into_bytes();
    for (n, v) in &head.headers.end_to_end().0 {
        if n.eq_ignore_ascii_case("host")
            || n.eq_ignore_ascii_case("content-length")
            || n.eq_ignore_ascii_case("x-forwarded-for")
            || n.eq_ignore_ascii_case("x-forwarded-proto")
            // The edge has already read the whole body.
            || n.eq_ignore_ascii_case("expect")
        {
            continue;
        }
        out.extend_from_slice(format!("{n}: {v}\r\n").as_bytes());
    }
    out.extend_from_slice(format!("X-Forwarded-For: {}\r\n", client.ip()).as_bytes());
    out.extend_from_slice(b"X-Forwarded-Proto: https\r\nConnection: close\r\n");
    if !body.is_empty() || matches!(head.method.as_str(), "POST" | "PUT" | "PATCH") {
        out.extend_from_slice(format!("Content-Length: {}\r\n", body.len()).as_bytes());
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body);
    out
}

async fn read_more(tcp: &mut TcpStream, buf: &mut Vec<u8>) -> Result<bool, OriginError> {
    let mut chunk = [0u8; 16 * 1024];
    let n = tcp.read(&mut chunk).await?;
    buf.extend_from_slice(chunk.get(..n).unwrap_or_default());
    Ok(n > 0)
}

/// Sends the request and returns the final (non-1xx) response head and its decoded body.
pub async fn fetch(
    addr: SocketAddr,
    request: &[u8],
    method: &str,
    max_body: usize,
) -> Result<(ResponseHead, Vec<u8>), OriginError> {
    let mut tcp = TcpStream::connect(addr).await?;
    let _ = tcp.set_nodelay(true);
    tcp.write_all(request).await?;
    let mut buf = Vec::new();
    let head = loop {
        let Some(end) = head_end(&buf)? else {
            if !read_more(&mut tcp, &mut buf).await? {
                return Err(OriginError::Truncated);
            }
            continue;
        };
        let head = parse_response(buf.get(..end).unwrap_or_default())?;
        buf.drain(..end);
        if head.status >= 200 {
            break head;
        }
        // 100 Continue and other interim responses: skip.
    };
    let body = match response_framing(method, &head)? {
        Framing::None => Vec::new(),
        Framing::Length(n) => {
            if n > max_body {
                return Err(HttpError::BodyTooLarge.into());
            }
            while buf.len() < n {
                if !read_more(&mut tcp, &mut buf).await? {
                    return Err(OriginError::Truncated);
                }
            }
            buf.truncate(n);
            buf
        }
        Framing::Chunked => loop {
            if let Some((body, _)) = decode_chunked(&buf, max_body)? {
                break body;
            }
            if !read_more(&mut tcp, &mut buf).await? {
                return Err(OriginError::Truncated);
            }
        },
        Framing::UntilClose => {
            while read_more(&mut tcp, &mut buf).await? {
                if buf.len() > max_body {
                    return Err(HttpError::BodyTooLarge.into());
                }
            }
            buf
        }
    };
    Ok((head, body))
}
