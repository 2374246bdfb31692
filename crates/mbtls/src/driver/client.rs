//! The client driver: one TCP connection to the pre-configured middlebox, the handshake core
//! on it, then application data through the first hop.

use mbx_attest::Claims;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, ToSocketAddrs};

use super::splice::{splice, Carried, EndpointSession, Sides};
use super::{keep_alive, DriverError, READ_BUF};
use crate::endpoint::EndpointEvent;
use crate::handshake::{
    ClientHandshake, ClientHandshakeConfig, ClientHandshakeEvent, SessionSummary,
};

/// What the client decided about the middlebox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MiddleboxVerdict {
    /// Certificate, approval and evidence passed (`claims`: `None` = no evidence, and the
    /// policy does not require it). `middlebox`: the name it was configured under or,
    /// discovered, the first DNS name of its certificate.
    Verified {
        middlebox: String,
        claims: Option<Claims>,
    },
    /// A discovered middlebox failed a check and got no key material (`middlebox`: its name
    /// when its certificate verified; `None` when its secondary handshake failed first).
    Excluded {
        middlebox: Option<String>,
        why: &'static str,
    },
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
    /// Every verdict, in the order the middleboxes' evidence was checked.
    verdicts: Vec<MiddleboxVerdict>,
    peer_closed: bool,
    /// TLS 1.3 KeyUpdates the server sent, followed.
    peer_key_updates: u32,
}

impl Session {
    fn events(&mut self) -> Result<(), DriverError> {
        while let Some(ev) = self.hs.poll_event() {
            match ev {
                ClientHandshakeEvent::MiddleboxVerified { middlebox, claims } => {
                    self.verdicts
                        .push(MiddleboxVerdict::Verified { middlebox, claims });
                }
                ClientHandshakeEvent::MiddleboxExcluded { middlebox, why } => {
                    self.verdicts
                        .push(MiddleboxVerdict::Excluded { middlebox, why });
                }
                ClientHandshakeEvent::Data(EndpointEvent::PeerClosed) => self.peer_closed = true,
                ClientHandshakeEvent::Data(EndpointEvent::PeerUpdatedKeys { .. }) => {
                    self.peer_key_updates += 1
                }
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

/// The client proxy's sockets in errors.
const SIDES: Sides = Sides {
    path: "middlebox",
    reading_path: "reading from the middlebox",
    writing_path: "writing to the middlebox",
    reading_plain: "reading from the local connection",
    writing_plain: "writing to the local connection",
};

impl EndpointSession for Session {
    fn receive(&mut self, records: &[u8]) -> Result<(), DriverError> {
        self.hs.receive(records)?;
        self.events()
    }
    fn write(&mut self, plain: &[u8]) -> Result<(), DriverError> {
        Ok(self.hs.write(plain)?)
    }
    fn close(&mut self) -> Result<(), DriverError> {
        Ok(self.hs.close()?)
    }
    fn take_plaintext(&mut self) -> Vec<u8> {
        self.hs.take_plaintext()
    }
    fn take_outgoing(&mut self) -> Vec<u8> {
        self.hs.take_outgoing()
    }
    fn peer_closed(&self) -> bool {
        self.peer_closed
    }
    fn release_idle_buffers(&mut self) {
        self.hs.release_idle_buffers();
    }
    fn peer_key_updates(&self) -> u32 {
        self.peer_key_updates
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
                verdicts: Vec::new(),
                peer_closed: false,
                peer_key_updates: 0,
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
        static DIRECT: MiddleboxVerdict = MiddleboxVerdict::Direct;
        self.session.verdicts.last().unwrap_or(&DIRECT)
    }

    /// The verdict on each middlebox that spoke, in the order they were checked (empty for a
    /// direct session).
    pub fn verdicts(&self) -> &[MiddleboxVerdict] {
        &self.session.verdicts
    }

    /// TLS 1.3 KeyUpdates the server sent so far, each followed (and answered when it asked).
    pub fn peer_key_updates(&self) -> u32 {
        self.session.peer_key_updates
    }

    /// Encrypts and sends `data` to the server (through the middlebox).
    pub async fn write_all(&mut self, data: &[u8]) -> Result<(), DriverError> {
        self.session.hs.write(data)?;
        self.flush().await
    }

    /// TLS 1.3: sends a KeyUpdate now; our later records travel under the next generation of
    /// our keys on every hop, each middlebox following. `request_peer`: the server is asked to
    /// update its keys too (its answer shows in [`peer_key_updates`](Self::peer_key_updates)
    /// once read). Keys near their AEAD limit are updated without this call. TLS 1.2 has no
    /// KeyUpdate: an error that leaves the session usable.
    pub async fn update_keys(&mut self, request_peer: bool) -> Result<(), DriverError> {
        self.session.hs.update_keys(request_peer)?;
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
        let mut carried = Carried::default();
        self.carry(local, idle_timeout, &mut carried).await?;
        Ok((carried.from_plain, carried.to_plain))
    }

    /// [`proxy_until_idle`](Self::proxy_until_idle), counting into `carried` as it goes, so
    /// that a session that fails still says what it carried (the client proxy's report).
    pub(crate) async fn carry(
        self,
        local: TcpStream,
        idle_timeout: Option<std::time::Duration>,
        carried: &mut Carried,
    ) -> Result<(), DriverError> {
        let MbtlsClient {
            stream,
            mut session,
            buf,
        } = self;
        keep_alive(&stream);
        // The data phase reads into buffers sized by the traffic, which an idle session frees.
        drop(buf);
        splice(&mut session, stream, local, idle_timeout, &SIDES, carried).await
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
            .field("verdicts", &self.session.verdicts)
            .field("summary", &self.session.hs.summary())
            .finish_non_exhaustive()
    }
}
