//! The TLS side of one client connection: a rustls `ServerConnection` over a tokio socket.
//!
//! The ClientHello is read asynchronously with rustls' [`Acceptor`], which lets us choose the
//! origin's configuration (and so its session-ticket key) from the SNI name. Every rustls step
//! that can sign — turning the ClientHello into a connection, and any packet processing while
//! the handshake is still running (a second ClientHello after HelloRetryRequest) — runs on
//! tokio's blocking pool behind a semaphore of `handshake_workers` permits. The remote signer may
//! then wait for the key server without stalling the reactor, and a slow key server can occupy
//! at most that many threads; further handshakes wait asynchronously for a permit. After the
//! handshake, packet processing is symmetric crypto only and runs inline.

use std::io::{Read, Write};
use std::sync::Arc;

use rustls::server::{Acceptor, ClientHello};
use rustls::ServerConnection;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;

/// Why a connection ended early.
#[derive(Debug, thiserror::Error)]
pub enum ConnError {
    /// Socket error.
    #[error("socket: {0}")]
    Io(#[from] std::io::Error),
    /// TLS error (an alert was sent when rustls produced one).
    #[error("TLS: {0}")]
    Tls(#[from] rustls::Error),
    /// The peer closed before the handshake finished.
    #[error("peer closed during the handshake")]
    Eof,
    /// A pool task failed earlier and took the connection with it.
    #[error("connection state lost")]
    Lost,
    /// A blocking-pool task failed.
    #[error("handshake worker: {0}")]
    Worker(String),
}

/// A fatal `internal_error` alert record (TLS 1.2 record version, accepted by 1.3 clients).
const INTERNAL_ERROR_ALERT: [u8; 7] = [0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 80];

/// Whether TLS records in `bytes` include a plaintext alert.
fn has_plaintext_alert(bytes: &[u8]) -> bool {
    let mut rest = bytes;
    while let (Some(&kind), Some(&[hi, lo])) = (rest.first(), rest.get(3..5)) {
        if kind == 0x15 {
            return true;
        }
        let len = usize::from(u16::from_be_bytes([hi, lo]));
        rest = rest.get(5 + len..).unwrap_or_default();
    }
    false
}

/// An established (or establishing) TLS connection.
pub struct TlsConn {
    tcp: TcpStream,
    /// `None` only while the connection is on a pool thread.
    tls: Option<ServerConnection>,
    slots: Arc<Semaphore>,
    buf: Box<[u8]>,
    eof: bool,
}

impl std::fmt::Debug for TlsConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsConn")
            .field(
                "handshaking",
                &self.tls.as_ref().map(|t| t.is_handshaking()),
            )
            .finish_non_exhaustive()
    }
}

/// Reads the ClientHello, lets `choose` pick a configuration from it, and completes the handshake.
pub async fn accept(
    mut tcp: TcpStream,
    slots: Arc<Semaphore>,
    choose: impl FnOnce(&ClientHello<'_>) -> Arc<rustls::ServerConfig>,
) -> Result<TlsConn, ConnError> {
    let mut acceptor = Acceptor::default();
    let mut buf = vec![0u8; 16 * 1024].into_boxed_slice();
    let accepted = loop {
        let n = tcp.read(&mut buf).await?;
        if n == 0 {
            return Err(ConnError::Eof);
        }
        let mut input = buf.get(..n).unwrap_or_default();
        while !input.is_empty() {
            acceptor.read_tls(&mut input)?;
        }
        match acceptor.accept() {
            Ok(Some(accepted)) => break accepted,
            Ok(None) => continue,
            Err((e, mut alert)) => {
                let mut out = Vec::new();
                let _ = alert.write_all(&mut out);
                let _ = tcp.write_all(&out).await;
                return Err(e.into());
            }
        }
    };
    let config = choose(&accepted.client_hello());
    let permit = Arc::clone(&slots)
        .acquire_owned()
        .await
        .map_err(|e| ConnError::Worker(e.to_string()))?;
    let started = tokio::task::spawn_blocking(move || {
        let _permit = permit;
        accepted.into_connection(config).map_err(|(e, mut alert)| {
            let mut out = Vec::new();
            let _ = alert.write_all(&mut out);
            (e, out)
        })
    })
    .await
    .map_err(|e| ConnError::Worker(e.to_string()))?;
    let tls = match started {
        Ok(tls) => tls,
        Err((e, pending)) => {
            // rustls queues an alert for the errors it detects itself; when our remote signer
            // fails it queues none, only the unsent start of its flight. Then that flight is
            // dropped (the client has seen nothing yet) and a plaintext fatal alert goes instead.
            if has_plaintext_alert(&pending) {
                let _ = tcp.write_all(&pending).await;
            } else {
                let _ = tcp.write_all(&INTERNAL_ERROR_ALERT).await;
            }
            return Err(e.into());
        }
    };
    let mut conn = TlsConn {
        tcp,
        tls: Some(tls),
        slots,
        buf,
        eof: false,
    };
    while conn.tls()?.is_handshaking() {
        conn.flush().await?;
        if !conn.read_more().await? {
            return Err(ConnError::Eof);
        }
    }
    conn.flush().await?;
    Ok(conn)
}

impl TlsConn {
    /// The rustls connection (negotiated version, SNI, …).
    pub fn tls(&self) -> Result<&ServerConnection, ConnError> {
        self.tls.as_ref().ok_or(ConnError::Lost)
    }

    fn tls_mut(&mut self) -> Result<&mut ServerConnection, ConnError> {
        self.tls.as_mut().ok_or(ConnError::Lost)
    }

    /// Sends every queued TLS record.
    pub async fn flush(&mut self) -> Result<(), ConnError> {
        let mut out = Vec::new();
        let tls = self.tls_mut()?;
        while tls.wants_write() {
            tls.write_tls(&mut out)?;
        }
        if !out.is_empty() {
            self.tcp.write_all(&out).await?;
        }
        Ok(())
    }

    /// Runs rustls on what it has buffered: on the blocking pool while handshaking.
    async fn process(&mut self) -> Result<(), ConnError> {
        let result = if self.tls()?.is_handshaking() {
            let permit = Arc::clone(&self.slots)
                .acquire_owned()
                .await
                .map_err(|e| ConnError::Worker(e.to_string()))?;
            // The connection moves to the pool thread and back.
            let mut tls = self.tls.take().ok_or(ConnError::Lost)?;
            let (tls, result) = tokio::task::spawn_blocking(move || {
                let _permit = permit;
                let r = tls.process_new_packets().map(|_| ());
                (tls, r)
            })
            .await
            .map_err(|e| ConnError::Worker(e.to_string()))?;
            self.tls = Some(tls);
            result
        } else {
            self.tls_mut()?.process_new_packets().map(|_| ())
        };
        if let Err(e) = result {
            // rustls queued an alert: send it before giving up.
            let _ = self.flush().await;
            return Err(e.into());
        }
        Ok(())
    }

    /// Reads from the socket and processes it; `false` at end of stream.
    async fn read_more(&mut self) -> Result<bool, ConnError> {
        if self.eof {
            return Ok(false);
        }
        let n = self.tcp.read(&mut self.buf).await?;
        if n == 0 {
            self.eof = true;
            return Ok(false);
        }
        let mut pos = 0;
        while pos < n {
            let tls = self.tls.as_mut().ok_or(ConnError::Lost)?;
            let mut input = self.buf.get(pos..n).unwrap_or_default();
            let used = tls.read_tls(&mut input)?;
            pos += used;
            self.process().await?;
        }
        Ok(true)
    }

    /// Appends decrypted bytes to `out`; `Ok(0)` when the client has closed.
    pub async fn read_plain(&mut self, out: &mut Vec<u8>) -> Result<usize, ConnError> {
        let mut chunk = [0u8; 8192];
        loop {
            match self.tls_mut()?.reader().read(&mut chunk) {
                Ok(0) => return Ok(0),
                Ok(n) => {
                    out.extend_from_slice(chunk.get(..n).unwrap_or_default());
                    return Ok(n);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                // Closed without close_notify.
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(0),
                Err(e) => return Err(e.into()),
            }
            self.flush().await?;
            if !self.read_more().await? {
                // Whatever rustls still holds is read above on the next turn; then end.
                return match self.tls_mut()?.reader().read(&mut chunk) {
                    Ok(n) if n > 0 => {
                        out.extend_from_slice(chunk.get(..n).unwrap_or_default());
                        Ok(n)
                    }
                    _ => Ok(0),
                };
            }
        }
    }

    /// Encrypts and sends `data`.
    pub async fn write_plain(&mut self, mut data: &[u8]) -> Result<(), ConnError> {
        while !data.is_empty() {
            let n = self.tls_mut()?.writer().write(data)?;
            self.flush().await?;
            if n == 0 {
                return Err(ConnError::Io(std::io::ErrorKind::WriteZero.into()));
            }
            data = data.get(n..).unwrap_or_default();
        }
        Ok(())
    }

    /// Sends close_notify and closes the socket.
    pub async fn close(mut self) {
        if let Ok(tls) = self.tls_mut() {
            tls.send_close_notify();
        }
        let _ = self.flush().await;
        let _ = self.tcp.shutdown().await;
    }
}
