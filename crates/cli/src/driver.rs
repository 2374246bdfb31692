//! A thin tokio driver for the sans-I/O TLS engines: it only moves bytes between a socket and an
//! engine. All protocol decisions stay in the engine.

use anyhow::{bail, Context};
use mbx_engine::TlsEngine;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const READ_BUF: usize = 16 * 1024;

/// Sends whatever the engine has queued for the peer.
pub async fn flush<E: TlsEngine + ?Sized>(
    engine: &mut E,
    sock: &mut TcpStream,
) -> anyhow::Result<()> {
    let out = engine.take_outgoing();
    if !out.is_empty() {
        sock.write_all(&out).await.context("socket write failed")?;
    }
    Ok(())
}

/// Reads one chunk from the socket into the engine and processes it. Errors on EOF.
async fn receive<E: TlsEngine + ?Sized>(
    engine: &mut E,
    sock: &mut TcpStream,
) -> anyhow::Result<()> {
    let mut buf = vec![0u8; READ_BUF];
    let n = sock.read(&mut buf).await.context("socket read failed")?;
    if n == 0 {
        bail!("peer closed the connection");
    }
    engine.feed(&buf[..n]);
    engine.process()?;
    Ok(())
}

/// Runs the handshake to completion.
pub async fn handshake<E: TlsEngine + ?Sized>(
    engine: &mut E,
    sock: &mut TcpStream,
) -> anyhow::Result<()> {
    engine.process()?;
    loop {
        flush(engine, sock).await?;
        if !engine.is_handshaking() {
            return Ok(());
        }
        receive(engine, sock).await?;
    }
}

/// Encrypts `data` and sends it.
pub async fn send<E: TlsEngine + ?Sized>(
    engine: &mut E,
    sock: &mut TcpStream,
    data: &[u8],
) -> anyhow::Result<()> {
    engine.write_plaintext(data)?;
    flush(engine, sock).await
}

/// Receives application data until `complete(received so far)` holds.
pub async fn receive_until<E: TlsEngine + ?Sized>(
    engine: &mut E,
    sock: &mut TcpStream,
    complete: impl Fn(&[u8]) -> bool,
) -> anyhow::Result<Vec<u8>> {
    let mut got = engine.take_plaintext();
    while !complete(&got) {
        if engine.peer_closed() {
            bail!("peer sent close_notify before the message was complete");
        }
        receive(engine, sock).await?;
        flush(engine, sock).await?;
        got.extend(engine.take_plaintext());
    }
    Ok(got)
}

/// Waits until the peer's close_notify has been processed.
pub async fn until_peer_closed<E: TlsEngine + ?Sized>(
    engine: &mut E,
    sock: &mut TcpStream,
) -> anyhow::Result<()> {
    while !engine.peer_closed() {
        receive(engine, sock).await?;
    }
    Ok(())
}
