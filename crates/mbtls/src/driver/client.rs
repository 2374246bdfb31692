//! The client driver: one TCP connection to the pre-configured middlebox, the handshake core
//! on it, then application data through the first hop.

use mbx_attest::Claims;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, ToSocketAddrs};
use tokio::time::timeout;

use super::outbox::Outbox;
use super::quiet::{Activity, Due};
use super::read_buf::{read_into, ReadBuf};
use super::{keep_alive, DriverError, CLOSE_GRACE, READ_BUF};
use crate::endpoint::EndpointEvent;
use crate::handshake::{
    ClientHandshake, ClientHandshakeConfig, ClientHandshakeEvent, SessionSummary,
};

/// What the client decided about the middlebox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MiddleboxVerdict {
    /// Certificate and evidence passed; `None` = no evidence, and the policy does not require it.
    Verified(Option<Claims>),
    /// A discovered middlebox failed a check and got no key material.
    Excluded(&'static str),
    /// No middlebox took part.
    Direct,
}

/// An mbTLS client session over TCP, after its handshake.
pub struct MbtlsClient {
    stream: TcpStream,
    session: Session,
    buf: Vec<u8>,
}

/// The core and what its events told so far (apart from the socket, so that the socket can be
/// split while events are handled).
struct Session {
    hs: ClientHandshake,
    verdict: MiddleboxVerdict,
    /// Every verdict, in the order the middleboxes' evidence was checked.
    verdicts: Vec<MiddleboxVerdict>,
    peer_closed: bool,
}

impl Session {
    fn events(&mut self) -> Result<(), DriverError> {
        while let Some(ev) = self.hs.poll_event() {
            match ev {
                ClientHandshakeEvent::MiddleboxVerified(claims) => {
                    self.verdict = MiddleboxVerdict::Verified(claims);
                    self.verdicts.push(self.verdict.clone());
                }
                ClientHandshakeEvent::MiddleboxExcluded(why) => {
                    self.verdict = MiddleboxVerdict::Excluded(why);
                    self.verdicts.push(self.verdict.clone());
                }
                ClientHandshakeEvent::Data(EndpointEvent::PeerClosed) => self.peer_closed = true,
                ClientHandshakeEvent::Data(EndpointEvent::PeerAlert(a)) => {
                    return Err(DriverError::alert(a, "received from the path"))
                }
                ClientHandshakeEvent::Data(EndpointEvent::Failed { alert, what }) => {
                    return Err(DriverError::alert(alert, what))
                }
                ClientHandshakeEvent::Data(ev) => tracing::debug!(?ev, "mbtls client"),
                ev => tracing::debug!(?ev, "mbtls client"),
            }
        }
        Ok(())
    }
}

impl MbtlsClient {
    /// Connects to the first middlebox and runs the handshake until the data phase starts
    /// (key material sent, or a direct session). Any failure closes the connection.
    pub async fn connect(
        first_hop: impl ToSocketAddrs,
        cfg: ClientHandshakeConfig,
    ) -> Result<MbtlsClient, DriverError> {
        Self::connect_with_data(first_hop, cfg, &[]).await
    }

    /// Like [`connect`](Self::connect), with application data (e.g. an HTTP request) that the
    /// core encrypts as soon as the data phase starts and sends in the same flight as the key
    /// material, so a request costs no round trip of its own. Nothing of it leaves before the
    /// middlebox passed every check.
    ///
    /// `cfg.now_unix` is replaced by the current time, as the server driver does for each
    /// connection: evidence is judged when it is checked, however long ago the configuration
    /// was built (a proxy reuses one for days).
    pub async fn connect_with_data(
        first_hop: impl ToSocketAddrs,
        mut cfg: ClientHandshakeConfig,
        data: &[u8],
    ) -> Result<MbtlsClient, DriverError> {
        let stream = TcpStream::connect(first_hop)
            .await
            .map_err(DriverError::io("cannot connect to the middlebox"))?;
        let _ = stream.set_nodelay(true);
        cfg.now_unix = mbx_attest::unix_seconds(std::time::SystemTime::now());
        let mut hs = ClientHandshake::new(cfg)?;
        if !data.is_empty() {
            hs.write(data)?;
        }
        let mut c = MbtlsClient {
            stream,
            session: Session {
                hs,
                verdict: MiddleboxVerdict::Direct,
                verdicts: Vec::new(),
                peer_closed: false,
            },
            buf: vec![0u8; READ_BUF],
        };
        c.flush().await?;
        while !c.session.hs.data_phase_started() {
            if !c.read_some().await? {
                return Err(DriverError::PeerGone {
                    peer: "middlebox",
                    when: "during the handshake",
                });
            }
        }
        Ok(c)
    }

    /// Version, suite and the key fingerprint of every hop the client generated or bridged.
    pub fn summary(&self) -> Option<&SessionSummary> {
        self.session.hs.summary()
    }

    /// The attestation/approval verdict on the middlebox (the last one checked, when there
    /// are several).
    pub fn verdict(&self) -> &MiddleboxVerdict {
        &self.session.verdict
    }

    /// The verdict on each middlebox that spoke, in the order they were checked (empty for a
    /// direct session).
    pub fn verdicts(&self) -> &[MiddleboxVerdict] {
        &self.session.verdicts
    }

    /// Encrypts and sends `data` to the server (through the middlebox).
    pub async fn write_all(&mut self, data: &[u8]) -> Result<(), DriverError> {
        self.session.hs.write(data)?;
        self.flush().await
    }

    /// Sends close_notify: no more data from us. Reading stays possible.
    pub async fn close(&mut self) -> Result<(), DriverError> {
        self.session.hs.close()?;
        self.flush().await
    }

    /// The next piece of application data; `None` once the peer sent close_notify. A connection
    /// that ends without close_notify is an error (truncation), as is any alert.
    pub async fn read(&mut self) -> Result<Option<Vec<u8>>, DriverError> {
        loop {
            let data = self.session.hs.take_plaintext();
            if !data.is_empty() {
                return Ok(Some(data));
            }
            if self.session.peer_closed {
                return Ok(None);
            }
            if !self.read_some().await? {
                return Err(DriverError::PeerGone {
                    peer: "middlebox",
                    when: "without close_notify (the session may be truncated)",
                });
            }
        }
    }

    /// Reads until the peer's close_notify.
    pub async fn read_to_end(&mut self) -> Result<Vec<u8>, DriverError> {
        let mut all = Vec::new();
        while let Some(d) = self.read().await? {
            all.extend_from_slice(&d);
        }
        Ok(all)
    }

    /// Carries a local plain-TCP connection over this session (the client as a local proxy):
    /// bytes from `local` are encrypted toward the server, the server's data is written to
    /// `local`. Local EOF sends close_notify; the server's close_notify half-closes `local`.
    /// Returns the bytes carried each way once both directions ended.
    pub async fn proxy(self, local: TcpStream) -> Result<(u64, u64), DriverError> {
        self.proxy_until_idle(local, None).await
    }

    /// [`proxy`](Self::proxy) that gives up once neither connection carried a byte for
    /// `idle_timeout` (`None`: never): both are then closed, the session without close_notify
    /// ([`DriverError::IdleTimeout`]).
    pub async fn proxy_until_idle(
        self,
        local: TcpStream,
        idle_timeout: Option<std::time::Duration>,
    ) -> Result<(u64, u64), DriverError> {
        let MbtlsClient {
            stream,
            mut session,
            buf,
        } = self;
        keep_alive(&stream);
        let (mut local_r, mut local_w) = local.into_split();
        let (mut stream_r, mut stream_w) = stream.into_split();
        // Read buffers sized by the traffic, freed (with the core's) when the session idles.
        drop(buf);
        let (mut buf, mut local_buf) = (ReadBuf::new(READ_BUF), ReadBuf::new(READ_BUF));
        let mut activity = Activity::new(idle_timeout);
        let (mut up, mut down) = (0u64, 0u64);
        let mut local_open = true;
        let (mut to_path, mut to_local) = (Outbox::new(), Outbox::new());
        loop {
            let data = session.hs.take_plaintext();
            down += data.len() as u64;
            to_local.push(data);
            to_path.push(session.hs.take_outgoing());
            if session.peer_closed {
                to_local.finish();
                if !local_open && !to_local.wants_write() && !to_path.wants_write() {
                    return Ok((up, down));
                }
            }
            let (want_p, want_l) = (to_path.wants_write(), to_local.wants_write());
            // Reads, and writes from the outboxes: all cancel-safe; the core runs outside.
            tokio::select! {
                r = read_into(&mut stream_r, &mut buf), if !session.peer_closed && to_local.has_room() => {
                    let n = r.map_err(DriverError::io("reading from the middlebox"))?;
                    if n == 0 {
                        // After our close_notify a server may just close (nginx does); before
                        // it this is truncation.
                        if !local_open {
                            to_local.finish();
                            let _ = timeout(CLOSE_GRACE, to_local.flush(&mut local_w)).await;
                            return Ok((up, down));
                        }
                        return Err(DriverError::PeerGone {
                            peer: "middlebox",
                            when: "without close_notify (the session may be truncated)",
                        });
                    }
                    let r = session.hs.receive(buf.bytes.get(..n).unwrap_or_default());
                    buf.after_read(n);
                    activity.read_now();
                    // Whatever the core queued (e.g. an alert) goes out before the error.
                    to_path.push(session.hs.take_outgoing());
                    if let Err(e) = r.map_err(DriverError::from).and_then(|()| session.events()) {
                        let _ = timeout(CLOSE_GRACE, to_path.flush(&mut stream_w)).await;
                        return Err(e);
                    }
                }
                r = read_into(&mut local_r, &mut local_buf), if local_open && to_path.has_room() => {
                    let n = r.map_err(DriverError::io("reading from the local connection"))?;
                    if n == 0 {
                        local_open = false;
                        session.hs.close()?;
                    } else {
                        up += n as u64;
                        local_buf.seal_read(n, |plain| session.hs.write(plain))?;
                        activity.read_now();
                    }
                }
                due = activity.due(activity.trim_pending()), if activity.trim_pending() || activity.has_timeout() => match due {
                    Due::Trim => {
                        buf.release();
                        local_buf.release();
                        session.hs.release_idle_buffers();
                    }
                    Due::IdleTimeout(after) => return Err(DriverError::IdleTimeout(after)),
                },
                w = to_path.write_some(&mut stream_w), if want_p => {
                    w.map_err(DriverError::io("writing to the middlebox"))?;
                    activity.wrote_now();
                }
                w = to_local.write_some(&mut local_w), if want_l => {
                    w.map_err(DriverError::io("writing to the local connection"))?;
                    activity.wrote_now();
                }
                else => return Err(DriverError::Relay("the proxy has nothing left to wait for".into())),
            }
        }
    }

    /// One socket read fed to the core; `false` on EOF.
    async fn read_some(&mut self) -> Result<bool, DriverError> {
        let n = self
            .stream
            .read(&mut self.buf)
            .await
            .map_err(DriverError::io("reading from the middlebox"))?;
        if n == 0 {
            return Ok(false);
        }
        let r = self
            .session
            .hs
            .receive(self.buf.get(..n).unwrap_or_default());
        // Whatever the core queued (e.g. an alert) goes out before we report the error.
        let flushed = self.flush().await;
        r?;
        self.session.events()?;
        flushed?;
        Ok(true)
    }

    async fn flush(&mut self) -> Result<(), DriverError> {
        let out = self.session.hs.take_outgoing();
        if !out.is_empty() {
            self.stream
                .write_all(&out)
                .await
                .map_err(DriverError::io("writing to the middlebox"))?;
        }
        Ok(())
    }
}

impl core::fmt::Debug for MbtlsClient {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("MbtlsClient")
            .field("verdict", &self.session.verdict)
            .field("summary", &self.session.hs.summary())
            .finish_non_exhaustive()
    }
}
