//! Plain TLS over tokio sockets with the same OpenSSL engine the mbTLS cores use: the baseline
//! client, a sink/responder server, and a plain TCP relay (the "middlebox" of the baselines).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

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
    /// Decrypt until the first plaintext arrives, then count the plaintext of each further
    /// TLS 1.3 application-data record from its header alone, without decrypting it: a sink
    /// that costs next to nothing, so that the middlebox in front of it is the bottleneck.
    Discard(Arc<AtomicU64>),
    /// Answer `response` once a request (up to an empty line) has arrived.
    Respond(Arc<Vec<u8>>),
}

/// Waits until `count` (a [`Serve::Sink`] or [`Serve::Discard`] counter) reaches `target`.
pub async fn wait_for(count: &AtomicU64, target: u64) -> Res<()> {
    let t0 = Instant::now();
    while count.load(Ordering::Relaxed) < target {
        if t0.elapsed() > Duration::from_secs(60) {
            return Err("sink did not receive everything".into());
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    Ok(())
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
            Serve::Discard(count) if !pt.is_empty() => {
                count.fetch_add(pt.len() as u64, Ordering::Relaxed);
                return discard(tcp, count).await;
            }
            Serve::Discard(_) => {}
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

/// The rest of a [`Serve::Discard`] connection: TLS 1.3 records are skipped by their headers;
/// an application-data record (type 23) of length `n` carries `n - 17` bytes of plaintext
/// (inner content type and 16-byte tag, no padding).
async fn discard(mut tcp: TcpStream, count: &AtomicU64) -> Res<()> {
    let mut buf = vec![0u8; 128 * 1024];
    let mut header = [0u8; 5];
    let mut have = 0usize; // header bytes seen of the next record
    let mut body = 0usize; // body bytes of the current record still to skip
    let mut plaintext = 0u64; // counted once the current record's last byte is here
    loop {
        let n = tcp.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        let mut at = 0;
        while at < n {
            if body > 0 {
                let take = body.min(n - at);
                body -= take;
                at += take;
                if body == 0 {
                    count.fetch_add(plaintext, Ordering::Relaxed);
                }
                continue;
            }
            header[have] = buf[at];
            have += 1;
            at += 1;
            if have == header.len() {
                have = 0;
                body = usize::from(u16::from_be_bytes([header[3], header[4]]));
                plaintext = if header[0] == 23 {
                    body.saturating_sub(17) as u64
                } else {
                    0
                };
            }
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
