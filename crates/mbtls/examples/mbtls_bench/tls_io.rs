//! Plain TLS over tokio sockets with the same OpenSSL engine the mbTLS cores use: the baseline
//! client, a sink/responder server, and a plain TCP relay (the "middlebox" of the baselines).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use mbx_engine::{OpenSslContext, OpenSslEngine, TlsEngine};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::Res;

const READ_BUF: usize = 32 * 1024;

/// A plain TLS client session.
pub struct TlsClient {
    tcp: TcpStream,
    engine: OpenSslEngine,
    buf: Vec<u8>,
}

impl TlsClient {
    /// Connects and handshakes; `data` is written as soon as the handshake allows, in the
    /// flight of the client's Finished when the version permits (TLS 1.3).
    pub async fn connect(addr: SocketAddr, ctx: &OpenSslContext, data: &[u8]) -> Res<TlsClient> {
        let tcp = TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        let mut c = TlsClient {
            tcp,
            engine: ctx.engine()?,
            buf: vec![0u8; READ_BUF],
        };
        c.engine.process()?;
        loop {
            if !c.engine.is_handshaking() {
                if !data.is_empty() {
                    c.engine.write_plaintext(data)?;
                }
                c.flush().await?;
                return Ok(c);
            }
            c.flush().await?;
            c.read_some().await?;
        }
    }

    async fn flush(&mut self) -> Res<()> {
        let out = self.engine.take_outgoing();
        if !out.is_empty() {
            self.tcp.write_all(&out).await?;
        }
        Ok(())
    }

    async fn read_some(&mut self) -> Res<()> {
        let n = self.tcp.read(&mut self.buf).await?;
        if n == 0 {
            return Err("server closed the connection".into());
        }
        self.engine.feed(&self.buf[..n]);
        self.engine.process()?;
        Ok(())
    }

    pub async fn write_all(&mut self, data: &[u8]) -> Res<()> {
        self.engine.write_plaintext(data)?;
        self.flush().await
    }

    /// Reads until `len` bytes of plaintext arrived.
    pub async fn read_exact(&mut self, len: usize) -> Res<Vec<u8>> {
        let mut got = Vec::new();
        loop {
            got.extend(self.engine.take_plaintext());
            if got.len() >= len {
                return Ok(got);
            }
            self.flush().await?;
            self.read_some().await?;
        }
    }
}

/// What a plain TLS server does with each connection's plaintext.
#[derive(Clone)]
pub enum Serve {
    /// Count the bytes received.
    Sink(Arc<AtomicU64>),
    /// Answer `response` once a request (up to an empty line) has arrived.
    Respond(Arc<Vec<u8>>),
}

/// A plain TLS server (OpenSSL engine) on loopback.
pub async fn tls_server(ctx: Arc<OpenSslContext>, serve: Serve) -> Res<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (ctx, serve) = (ctx.clone(), serve.clone());
            tokio::spawn(async move {
                let _ = tcp.set_nodelay(true);
                if let Err(e) = serve_one(tcp, &ctx, serve).await {
                    eprintln!("bench TLS server: {e}");
                }
            });
        }
    });
    Ok(addr)
}

async fn serve_one(mut tcp: TcpStream, ctx: &OpenSslContext, serve: Serve) -> Res<()> {
    let mut engine = ctx.engine()?;
    let mut buf = vec![0u8; READ_BUF];
    let mut request = Vec::new();
    loop {
        let n = tcp.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        engine.feed(&buf[..n]);
        if engine.process().is_err() {
            return Ok(()); // peer went away mid-session (end of a benchmark round)
        }
        let pt = engine.take_plaintext();
        match &serve {
            Serve::Sink(count) => {
                count.fetch_add(pt.len() as u64, Ordering::Relaxed);
            }
            Serve::Respond(response) => {
                request.extend_from_slice(&pt);
                if request.windows(4).any(|w| w == b"\r\n\r\n") {
                    request.clear();
                    engine.write_plaintext(response)?;
                }
            }
        }
        let out = engine.take_outgoing();
        if !out.is_empty() {
            tcp.write_all(&out).await?;
        }
    }
}

/// A plain TCP relay to `upstream` (the forward-only / baseline middlebox).
pub async fn tcp_relay(upstream: SocketAddr) -> Res<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((mut down, _)) = listener.accept().await {
            tokio::spawn(async move {
                let _ = down.set_nodelay(true);
                if let Ok(mut up) = TcpStream::connect(upstream).await {
                    let _ = up.set_nodelay(true);
                    let _ = tokio::io::copy_bidirectional_with_sizes(
                        &mut down, &mut up, READ_BUF, READ_BUF,
                    )
                    .await;
                }
            });
        }
    });
    Ok(addr)
}
