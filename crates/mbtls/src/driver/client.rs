//! The client driver: one TCP connection to the first hop (the first client-side middlebox,
//! or the server), the handshake core on it, then application data through it.

use mbx_attest::Claims;
use tokio::net::{TcpStream, ToSocketAddrs};

use super::connection::Connection;
use super::proxy::AnswerFn;
use super::splice::{reset_when_closed, splice, Carried, Sides};
use super::{keep_alive, DriverError};
use crate::handshake::{ClientHandshake, ClientHandshakeConfig};

/// What the client decided about the middlebox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MiddleboxVerdict {
    /// Certificate, approval and evidence passed (`claims`: `None` = no evidence, and the
    /// policy does not require it). `middlebox`: the name it was configured under or,
    /// discovered, the first DNS name of its certificate. `resumed`: its secondary session
    /// resumed an earlier one and sent no new evidence; `claims` are the earlier check's,
    /// accepted again by today's policy. `checked_at`: when that check was made (seconds since
    /// the Unix epoch; the first of a chain of resumptions, bounded by the policy's
    /// `resumed_evidence_max_age`). `evidence_in_certificate`: the evidence came from its
    /// certificate, made once for its key, not for this session.
    Verified {
        middlebox: String,
        claims: Option<Claims>,
        resumed: bool,
        checked_at: u64,
        evidence_in_certificate: bool,
    },
    /// A discovered middlebox failed a check and got no key material (`middlebox`: its name
    /// when its certificate verified; `None` when its secondary handshake failed first;
    /// `detail`: what the failed check said, when a check failed).
    Excluded {
        middlebox: Option<String>,
        why: &'static str,
        detail: Option<String>,
    },
    /// No middlebox of the client's side took part (server-side middleboxes, which the client
    /// does not see, may have: the server's report names them).
    Direct,
}

/// An mbTLS client session over TCP, after its handshake (the methods common to both roles
/// are [`Connection`]'s).
pub type MbtlsClient = Connection<ClientHandshake>;

/// The client proxy's sockets in errors.
/// The path side is the first hop: a middlebox, or the server itself without client-side
/// middleboxes; when it closes, the cause may lie behind it.
const SIDES: Sides = Sides {
    path: "first hop",
    reading_path: "reading from the first hop",
    writing_path: "writing to the first hop",
    plain: "local application",
    reading_plain: "reading from the local connection",
    writing_plain: "writing to the local connection",
};

impl Connection<ClientHandshake> {
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
        cfg: ClientHandshakeConfig,
        data: &[u8],
    ) -> Result<MbtlsClient, DriverError> {
        // The core first: a configuration that fails every session is told before anything
        // is connected (an embedder found its mistake reported by the first hop as a
        // connection that closed), and checked once (`ClientHandshake::new`).
        let hs = Self::core(cfg, data)?;
        let stream = TcpStream::connect(first_hop)
            .await
            .map_err(DriverError::io("cannot connect to the first hop"))?;
        Connection::handshake(stream, hs).await
    }

    /// Like [`connect_with_data`](Self::connect_with_data), over a connection to the first hop
    /// that the caller made (its own routing, a connection it times; `TCP_NODELAY` is set on
    /// it; the client proxy, to report its local address even when the handshake fails).
    /// `verdicts_so_far` is kept equal to the verdicts on the middleboxes checked so far,
    /// after every read: they are there when the handshake fails, and when the caller's
    /// timeout drops this future (after a success they are also in
    /// [`verdicts`](Self::verdicts)).
    pub async fn handshake_on(
        stream: TcpStream,
        cfg: ClientHandshakeConfig,
        data: &[u8],
        verdicts_so_far: &mut Vec<MiddleboxVerdict>,
    ) -> Result<MbtlsClient, DriverError> {
        let hs = Self::core(cfg, data)?;
        Connection::handshake_telling(stream, hs, Some(verdicts_so_far)).await
    }

    /// The client core for a session starting now, with `data` queued.
    fn core(mut cfg: ClientHandshakeConfig, data: &[u8]) -> Result<ClientHandshake, DriverError> {
        cfg.now_unix = mbx_attest::unix_seconds(std::time::SystemTime::now());
        let mut hs = ClientHandshake::new(cfg).map_err(DriverError::config)?;
        if !data.is_empty() {
            hs.write(data)?;
        }
        Ok(hs)
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
        // A cut session resets `local` (`splice`).
        reset_when_closed(&local, true).map_err(DriverError::io(
            "cannot set the local connection to reset when cut",
        ))?;
        let mut carried = Carried::default();
        self.carry(local, idle_timeout, None, &mut carried).await?;
        Ok((carried.from_plain, carried.to_plain))
    }

    /// [`proxy_until_idle`](Self::proxy_until_idle), counting into `carried` as it goes, so
    /// that a session that fails still says what it carried (the client proxy's report).
    /// `local` is already set to reset when closed; `early_answer`: what it is told instead
    /// when the session fails before the server sent anything.
    pub(crate) async fn carry(
        self,
        local: TcpStream,
        idle_timeout: Option<std::time::Duration>,
        early_answer: Option<&AnswerFn>,
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
        splice(
            &mut session,
            stream,
            local,
            idle_timeout,
            early_answer,
            &SIDES,
            carried,
        )
        .await
    }
}
