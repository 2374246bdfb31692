//! One endpoint's mbTLS session over one TCP connection, for either role: the handshake until
//! the data phase, then application data both ways. [`MbtlsClient`](super::MbtlsClient) is
//! this with a client core (it connects), [`MbtlsServerConnection`](super::MbtlsServerConnection)
//! with a server core (it takes an accepted connection), for applications that serve mbTLS
//! themselves instead of passing the plaintext to a TCP backend ([`super::MbtlsServer`]).

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::client::MiddleboxVerdict;
use super::splice::EndpointSession;
use super::{DriverError, READ_BUF, READ_RESET, WRITE_RESET};
use crate::endpoint::EndpointEvent;
use crate::handshake::{
    ClientHandshake, ClientHandshakeEvent, HandshakeError, ServerHandshake, SessionSummary,
};

/// What a connection needs of its handshake core: the core's methods of the same names.
/// [`ClientHandshake`] and [`ServerHandshake`] have it; sealed, since the drivers' error wording
/// depends on the role.
pub trait EndpointHandshake: sealed::Sealed + Send {
    /// The neighbour at the other end of the socket, in errors.
    const NEIGHBOUR: &'static str;
    /// "reading from" and "writing to" that neighbour, in errors.
    const READING: &'static str;
    const WRITING: &'static str;
    fn receive(&mut self, bytes: &[u8]) -> Result<(), HandshakeError>;
    fn write(&mut self, data: &[u8]) -> Result<(), HandshakeError>;
    fn close(&mut self) -> Result<(), HandshakeError>;
    fn abort(
        &mut self,
        description: mbx_engine::AlertDescription,
        what: &'static str,
    ) -> Result<(), HandshakeError>;
    fn update_keys(&mut self, request_peer: bool) -> Result<(), HandshakeError>;
    fn summary(&self) -> Option<&SessionSummary>;
    fn take_outgoing(&mut self) -> Vec<u8>;
    fn take_plaintext(&mut self) -> Vec<u8>;
    fn poll_event(&mut self) -> Option<ClientHandshakeEvent>;
    fn data_phase_started(&self) -> bool;
    fn release_idle_buffers(&mut self);
    fn has_partial_record(&self) -> bool;
    fn waiting_for(&self) -> Option<String>;
}

/// How far a client's handshake got, kept up to date after every read
/// ([`MbtlsClient::handshake_on`](super::MbtlsClient::handshake_on)): it stays with the caller
/// when the handshake fails, and when the caller's timeout drops the handshake.
#[derive(Debug, Default, Clone)]
pub struct HandshakeProgress {
    /// The verdicts on the middleboxes checked so far, in the order checked.
    pub verdicts: Vec<MiddleboxVerdict>,
    /// What the handshake was waiting for after the last read
    /// ([`ClientHandshake::waiting_for`]); `None` once its data phase started.
    pub waiting_for: Option<String>,
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for crate::handshake::ClientHandshake {}
    impl Sealed for crate::handshake::ServerHandshake {}
}

/// The same methods, by the same names, on both cores.
macro_rules! endpoint_handshake {
    ($core:ty, $neighbour:literal) => {
        impl EndpointHandshake for $core {
            const NEIGHBOUR: &'static str = $neighbour;
            const READING: &'static str = concat!("reading from the ", $neighbour);
            const WRITING: &'static str = concat!("writing to the ", $neighbour);
            fn receive(&mut self, bytes: &[u8]) -> Result<(), HandshakeError> {
                <$core>::receive(self, bytes)
            }
            fn write(&mut self, data: &[u8]) -> Result<(), HandshakeError> {
                <$core>::write(self, data)
            }
            fn close(&mut self) -> Result<(), HandshakeError> {
                <$core>::close(self)
            }
            fn abort(
                &mut self,
                description: mbx_engine::AlertDescription,
                what: &'static str,
            ) -> Result<(), HandshakeError> {
                <$core>::abort(self, description, what)
            }
            fn update_keys(&mut self, request_peer: bool) -> Result<(), HandshakeError> {
                <$core>::update_keys(self, request_peer)
            }
            fn summary(&self) -> Option<&SessionSummary> {
                <$core>::summary(self)
            }
            fn take_outgoing(&mut self) -> Vec<u8> {
                <$core>::take_outgoing(self)
            }
            fn take_plaintext(&mut self) -> Vec<u8> {
                <$core>::take_plaintext(self)
            }
            fn poll_event(&mut self) -> Option<ClientHandshakeEvent> {
                <$core>::poll_event(self)
            }
            fn data_phase_started(&self) -> bool {
                <$core>::data_phase_started(self)
            }
            fn release_idle_buffers(&mut self) {
                <$core>::release_idle_buffers(self)
            }
            fn has_partial_record(&self) -> bool {
                <$core>::has_partial_record(self)
            }
            fn waiting_for(&self) -> Option<String> {
                <$core>::waiting_for(self)
            }
        }
    };
}

endpoint_handshake!(ClientHandshake, "first hop");
endpoint_handshake!(ServerHandshake, "previous hop");

/// An mbTLS endpoint's session over TCP, after its handshake.
pub struct Connection<H> {
    pub(super) stream: TcpStream,
    pub(super) session: Session<H>,
    pub(super) buf: Vec<u8>,
    /// The error of a read that also brought plaintext (records before the one that failed,
    /// or an alert behind data): given once that plaintext has been read, as a TLS library
    /// delivers the data before the error.
    pub(super) failure: Option<DriverError>,
}

/// The core and what its events told so far (apart from the socket, so that the socket can be
/// split while events are handled).
pub(super) struct Session<H> {
    pub(super) hs: H,
    /// Every verdict, in the order the middleboxes' evidence was checked.
    verdicts: Vec<MiddleboxVerdict>,
    peer_closed: bool,
    /// TLS 1.3 KeyUpdates the peer sent, followed.
    peer_key_updates: u32,
}

impl<H: EndpointHandshake> Session<H> {
    pub(super) fn new(hs: H) -> Self {
        Session {
            hs,
            verdicts: Vec::new(),
            peer_closed: false,
            peer_key_updates: 0,
        }
    }

    /// The verdicts so far, in the order the middleboxes were checked.
    pub(super) fn take_verdicts(&mut self) -> Vec<MiddleboxVerdict> {
        core::mem::take(&mut self.verdicts)
    }

    /// Moves the core's events into what the session tells: verdicts, the peer's close and
    /// KeyUpdates; a failure or an alert is the session's error.
    pub(super) fn events(&mut self) -> Result<(), DriverError> {
        while let Some(ev) = self.hs.poll_event() {
            match ev {
                ClientHandshakeEvent::MiddleboxVerified {
                    middlebox,
                    claims,
                    resumed,
                    checked_at,
                    evidence_in_certificate,
                } => {
                    self.verdicts.push(MiddleboxVerdict::Verified {
                        middlebox,
                        claims,
                        resumed,
                        checked_at,
                        evidence_in_certificate,
                    });
                }
                ClientHandshakeEvent::MiddleboxExcluded {
                    middlebox,
                    why,
                    detail,
                } => {
                    self.verdicts.push(MiddleboxVerdict::Excluded {
                        middlebox,
                        why,
                        detail,
                    });
                }
                ClientHandshakeEvent::Data(EndpointEvent::PeerClosed) => self.peer_closed = true,
                ClientHandshakeEvent::Data(EndpointEvent::PeerUpdatedKeys { .. }) => {
                    self.peer_key_updates = self.peer_key_updates.saturating_add(1)
                }
                ClientHandshakeEvent::Data(EndpointEvent::PeerAlert(a)) => {
                    return Err(DriverError::alert(a, super::RECEIVED_FROM_THE_PATH))
                }
                ClientHandshakeEvent::Data(EndpointEvent::Failed { alert, what }) => {
                    return Err(DriverError::alert(alert, what))
                }
                ev => tracing::debug!(?ev, "mbtls endpoint"),
            }
        }
        Ok(())
    }
}

impl<H: EndpointHandshake> EndpointSession for Session<H> {
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
    fn has_partial_record(&self) -> bool {
        self.hs.has_partial_record()
    }
}

impl<H: EndpointHandshake> Connection<H> {
    /// Sends the core's first flight (a client's ClientHello; nothing for a server) and runs
    /// the handshake until the data phase starts. Any failure drops the connection.
    pub(super) async fn handshake(stream: TcpStream, hs: H) -> Result<Self, DriverError> {
        Self::handshake_telling(stream, hs, None).await
    }

    /// [`handshake`](Self::handshake), with `progress` kept up to date after every read: the
    /// verdicts reached and what the handshake waits for stay there when the handshake fails,
    /// and when a caller's timeout drops this future (a proxy reports the middleboxes it had
    /// checked, and what it waited for, when the server refused the session or stalled).
    pub(super) async fn handshake_telling(
        stream: TcpStream,
        hs: H,
        mut progress: Option<&mut HandshakeProgress>,
    ) -> Result<Self, DriverError> {
        let _ = stream.set_nodelay(true);
        let mut c = Connection {
            stream,
            session: Session::new(hs),
            buf: vec![0u8; READ_BUF],
            failure: None,
        };
        let tell = |c: &Self, progress: &mut Option<&mut HandshakeProgress>| {
            if let Some(p) = progress.as_deref_mut() {
                // Verdicts are only ever added: the new ones.
                let new = c
                    .session
                    .verdicts
                    .get(p.verdicts.len()..)
                    .unwrap_or_default();
                p.verdicts.extend_from_slice(new);
                p.waiting_for = c.session.hs.waiting_for();
            }
        };
        tell(&c, &mut progress);
        c.flush().await?;
        while !c.session.hs.data_phase_started() {
            let read = c.read_some().await;
            tell(&c, &mut progress);
            if !read? {
                return Err(DriverError::PeerGone {
                    peer: H::NEIGHBOUR,
                    when: "during the handshake",
                });
            }
        }
        Ok(c)
    }

    /// Version, suite and the key fingerprint of every hop this endpoint generated or bridged.
    pub fn summary(&self) -> Option<&SessionSummary> {
        self.session.hs.summary()
    }

    /// The attestation/approval verdict on our middlebox (the last one checked, when there
    /// are several).
    pub fn verdict(&self) -> &MiddleboxVerdict {
        static DIRECT: MiddleboxVerdict = MiddleboxVerdict::Direct;
        self.session.verdicts.last().unwrap_or(&DIRECT)
    }

    /// The verdict on each of our middleboxes that spoke, in the order they were checked
    /// (empty when none of our side took part).
    pub fn verdicts(&self) -> &[MiddleboxVerdict] {
        &self.session.verdicts
    }

    /// [`verdicts`](Self::verdicts) in path order (as [`summary`](Self::summary) names the
    /// middleboxes that joined), the excluded ones after them.
    pub fn verdicts_in_path_order(&self) -> Vec<&MiddleboxVerdict> {
        super::client::in_summary_order(&self.session.verdicts, self.summary())
    }

    /// TLS 1.3 KeyUpdates the peer sent so far, each followed (and answered when it asked).
    pub fn peer_key_updates(&self) -> u32 {
        self.session.peer_key_updates
    }

    /// Encrypts and sends `data` to the peer (through the middleboxes).
    pub async fn write_all(&mut self, data: &[u8]) -> Result<(), DriverError> {
        self.session.hs.write(data)?;
        self.flush().await
    }

    /// TLS 1.3: sends a KeyUpdate now; our later records travel under the next generation of
    /// our keys on every hop, each middlebox following. `request_peer`: the peer is asked to
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

    /// Ends the session with a fatal alert of ours (`description`, e.g. `internal_error` when
    /// what the session serves failed), which the middleboxes pass on to the peer; nothing
    /// more is sent or read. A session that stayed in OpenSSL (no middlebox on this side)
    /// cannot send one: an error that leaves the session as it was, to be closed instead.
    pub async fn abort(
        &mut self,
        description: mbx_engine::AlertDescription,
    ) -> Result<(), DriverError> {
        self.session
            .hs
            .abort(description, "ended by this endpoint's application")?;
        self.flush().await
    }

    /// The next piece of application data; `None` once the peer sent close_notify. A connection
    /// that ends without close_notify is an error (truncation), as is any alert; the data that
    /// came before either is read first.
    pub async fn read(&mut self) -> Result<Option<Vec<u8>>, DriverError> {
        loop {
            let data = self.session.hs.take_plaintext();
            if !data.is_empty() {
                return Ok(Some(data));
            }
            if let Some(e) = self.failure.take() {
                // Said once; a read after it finds the core failed, or the socket closed.
                return Err(e);
            }
            if self.session.peer_closed {
                return Ok(None);
            }
            let read = match self.read_some().await {
                Err(e) => {
                    let data = self.session.hs.take_plaintext();
                    if data.is_empty() {
                        return Err(e);
                    }
                    self.failure = Some(e);
                    return Ok(Some(data));
                }
                Ok(read) => read,
            };
            if !read {
                return Err(DriverError::PeerGone {
                    peer: H::NEIGHBOUR,
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

    /// One socket read fed to the core; `false` on EOF.
    async fn read_some(&mut self) -> Result<bool, DriverError> {
        let n = self
            .stream
            .read(&mut self.buf)
            .await
            .map_err(DriverError::on_path(H::NEIGHBOUR, H::READING, READ_RESET))?;
        if n == 0 {
            return Ok(false);
        }
        let r = self
            .session
            .hs
            .receive(self.buf.get(..n).unwrap_or_default());
        // What it told before failing (a verdict reached in the same read) is kept too, before
        // the write below, which a caller's timeout may cut.
        let told = self.session.events();
        // Whatever the core queued (e.g. an alert) goes out before we report the error.
        let flushed = self.flush().await;
        r?;
        told?;
        flushed?;
        Ok(true)
    }

    async fn flush(&mut self) -> Result<(), DriverError> {
        let out = self.session.hs.take_outgoing();
        if !out.is_empty() {
            self.stream
                .write_all(&out)
                .await
                .map_err(DriverError::on_path(H::NEIGHBOUR, H::WRITING, WRITE_RESET))?;
        }
        Ok(())
    }
}

impl<H: EndpointHandshake> core::fmt::Debug for Connection<H> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Connection")
            .field("peer", &H::NEIGHBOUR)
            .field("verdicts", &self.session.verdicts)
            .field("summary", &self.session.hs.summary())
            .finish_non_exhaustive()
    }
}
