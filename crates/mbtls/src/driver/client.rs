//! The client driver: one TCP connection to the first hop (the first client-side middlebox,
//! or the server), the handshake core on it, then application data through it.

use mbx_attest::Claims;
use tokio::net::{TcpStream, ToSocketAddrs};

use super::connection::{Connection, HandshakeProgress};
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

impl MiddleboxVerdict {
    /// Verified on a resumed secondary session, with the claims of an earlier check.
    pub fn resumed(&self) -> bool {
        matches!(self, MiddleboxVerdict::Verified { resumed: true, .. })
    }

    /// The middlebox's name: configured, or from its certificate; `None` for one excluded
    /// before its certificate verified, and for [`Direct`](Self::Direct).
    pub fn middlebox(&self) -> Option<&str> {
        match self {
            MiddleboxVerdict::Verified { middlebox, .. } => Some(middlebox),
            MiddleboxVerdict::Excluded { middlebox, .. } => middlebox.as_deref(),
            MiddleboxVerdict::Direct => None,
        }
    }
}

/// `verdicts` (in the order the middleboxes were checked) in path order: those named in `path`
/// by their place there, the others (excluded ones) after them, as they came. An endpoint's
/// path is its [`SessionSummary::middleboxes`](crate::handshake::SessionSummary::middleboxes);
/// [`Connection::verdicts_in_path_order`](super::Connection::verdicts_in_path_order) does it for a session.
pub fn in_path_order<'a>(
    verdicts: &'a [MiddleboxVerdict],
    path: &[String],
) -> Vec<&'a MiddleboxVerdict> {
    // A name may stand at several places (one name, several middleboxes): each verified one
    // takes the first place of its name not taken yet, in the order checked (a server checks
    // its middleboxes in path order). Before, both took the first, and a path mb0, mb, mb0
    // read mb0, mb0, mb (found by an independent implementer).
    let mut taken = vec![false; path.len()];
    let mut placed: Vec<(usize, &MiddleboxVerdict)> = verdicts
        .iter()
        .map(|v| {
            let at = match v {
                MiddleboxVerdict::Verified { middlebox, .. } => {
                    (0..path.len()).find(|&i| !taken[i] && path[i] == *middlebox)
                }
                _ => None,
            };
            if let Some(i) = at {
                taken[i] = true;
            }
            (at.unwrap_or(usize::MAX), v)
        })
        .collect();
    // Stable: the excluded stay in the order they came.
    placed.sort_by_key(|&(at, _)| at);
    placed.into_iter().map(|(_, v)| v).collect()
}

/// [`in_path_order`] along the path `summary` names (none: as checked), for the reports and
/// the connection that keep both.
pub(crate) fn in_summary_order<'a>(
    verdicts: &'a [MiddleboxVerdict],
    summary: Option<&crate::handshake::SessionSummary>,
) -> Vec<&'a MiddleboxVerdict> {
    in_path_order(verdicts, summary.map_or(&[], |s| s.middleboxes.as_slice()))
}

/// The verdict in words, as the CLI's reports say it: `{}` for a report line, `{:#}` adding
/// the signer and the SVN of a verified middlebox's TEE. An exclusion says the reason the
/// check gave (an approver's refusal: [`NOT_APPROVED`](crate::handshake::NOT_APPROVED)).
impl std::fmt::Display for MiddleboxVerdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MiddleboxVerdict::Verified {
                middlebox,
                claims: Some(c),
                resumed,
                checked_at,
                evidence_in_certificate,
            } => {
                let measurement = hex::encode(&c.measurement);
                write!(
                    f,
                    "{middlebox} verified ({} TEE, measurement {measurement}",
                    c.tee
                )?;
                if *evidence_in_certificate {
                    // Weaker than evidence for each session: it stands for whoever holds the key.
                    f.write_str("; evidence from its certificate, made once for its key")?;
                }
                if f.alternate() {
                    write!(f, ", signer {}, svn {}", hex::encode(&c.signer), c.svn)?;
                }
                if *resumed {
                    let now = mbx_attest::unix_seconds(std::time::SystemTime::now());
                    let ago = now.saturating_sub(*checked_at);
                    write!(
                        f,
                        "; resumed: evidence checked {ago} s ago, on an earlier session"
                    )?;
                }
                f.write_str(")")
            }
            MiddleboxVerdict::Verified {
                middlebox,
                claims: None,
                resumed,
                ..
            } => {
                write!(
                    f,
                    "{middlebox} sent no evidence (the policy does not require it)"
                )?;
                if *resumed {
                    f.write_str(" (resumed)")?;
                }
                Ok(())
            }
            MiddleboxVerdict::Excluded {
                middlebox,
                why,
                detail,
            } => {
                let who = middlebox.as_deref().unwrap_or("a middlebox");
                write!(f, "{who} was excluded: {why}")?;
                if let Some(d) = detail {
                    write!(f, " ({d})")?;
                }
                Ok(())
            }
            MiddleboxVerdict::Direct => f.write_str("no client-side middlebox took part"),
        }
    }
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
    /// Connects to `first_hop` (the first middlebox, or the server) and runs the handshake
    /// until the data phase starts (key material sent, or a direct session). Any failure
    /// closes the connection.
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
        Self::connect_telling(first_hop, cfg, data, None).await
    }

    /// [`connect_with_data`](Self::connect_with_data), keeping `progress` up to date as
    /// [`handshake_on`](Self::handshake_on) does: a caller whose timeout drops this future can
    /// still say what the handshake waited for.
    pub async fn connect_with_progress(
        first_hop: impl ToSocketAddrs,
        cfg: ClientHandshakeConfig,
        data: &[u8],
        progress: &mut HandshakeProgress,
    ) -> Result<MbtlsClient, DriverError> {
        Self::connect_telling(first_hop, cfg, data, Some(progress)).await
    }

    async fn connect_telling(
        first_hop: impl ToSocketAddrs,
        cfg: ClientHandshakeConfig,
        data: &[u8],
        progress: Option<&mut HandshakeProgress>,
    ) -> Result<MbtlsClient, DriverError> {
        // The core first: a configuration that fails every session is told before anything
        // is connected (an embedder found its mistake reported by the first hop as a
        // connection that closed), and checked once (`ClientHandshake::new`).
        let hs = Self::core(cfg, data)?;
        let stream = TcpStream::connect(first_hop)
            .await
            .map_err(DriverError::io("cannot connect to the first hop"))?;
        Connection::handshake_telling(stream, hs, progress).await
    }

    /// Like [`connect_with_data`](Self::connect_with_data), over a connection to the first hop
    /// that the caller made (its own routing, a connection it times; `TCP_NODELAY` is set on
    /// it; the client proxy, to report its local address even when the handshake fails).
    /// `progress` is kept up to date after every read: the verdicts on the middleboxes
    /// checked so far and what the handshake waits for, there when the handshake fails, and
    /// when the caller's timeout drops this future (after a success the verdicts are also in
    /// [`verdicts`](Self::verdicts)).
    pub async fn handshake_on(
        stream: TcpStream,
        cfg: ClientHandshakeConfig,
        data: &[u8],
        progress: &mut HandshakeProgress,
    ) -> Result<MbtlsClient, DriverError> {
        let hs = Self::core(cfg, data)?;
        Connection::handshake_telling(stream, hs, Some(progress)).await
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
            failure,
        } = self;
        // A read that failed after delivering data (none is made before a proxy carries).
        if let Some(e) = failure {
            return Err(e);
        }
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

#[cfg(test)]
mod tests {
    use super::MiddleboxVerdict;
    use mbx_attest::{Claims, TeeKind};

    fn claims() -> Claims {
        Claims {
            tee: TeeKind::Simulated,
            measurement: vec![0xab; 2],
            signer: vec![0xcd; 2],
            product_id: 0,
            svn: 7,
            debug: false,
            tcb_status: None,
            advisory_ids: Vec::new(),
            tcb_evaluation_data_number: None,
            platform_key: None,
            collateral_valid_until: None,
            collateral_issued_at: None,
        }
    }

    #[test]
    fn verdicts_are_shown_in_path_order_the_excluded_after() {
        let verified = |m: &str| MiddleboxVerdict::Verified {
            middlebox: m.into(),
            claims: None,
            resumed: false,
            checked_at: 0,
            evidence_in_certificate: false,
        };
        let excluded = |name: &str| MiddleboxVerdict::Excluded {
            middlebox: Some(name.into()),
            why: "not approved by the application",
            detail: None,
        };
        let shown = |checked: &[MiddleboxVerdict], path: &[&str]| -> Vec<MiddleboxVerdict> {
            let path: Vec<String> = path.iter().map(|p| p.to_string()).collect();
            super::in_path_order(checked, &path)
                .into_iter()
                .cloned()
                .collect()
        };
        let checked = [
            verified("mb2.test"),
            excluded("x.test"),
            verified("mb1.test"),
        ];
        assert_eq!(
            shown(&checked, &["mb1.test", "mb2.test"]),
            [
                verified("mb1.test"),
                verified("mb2.test"),
                excluded("x.test")
            ]
        );
        // One name at two places: each verdict at its own place, not both at the first; an
        // excluded middlebox of the same name takes none.
        let checked = [
            excluded("mb0.test"),
            verified("mb0.test"),
            verified("mb.test"),
            verified("mb0.test"),
        ];
        assert_eq!(
            shown(&checked, &["mb0.test", "mb.test", "mb0.test"]),
            [
                verified("mb0.test"),
                verified("mb.test"),
                verified("mb0.test"),
                excluded("mb0.test")
            ]
        );
    }

    /// A verdict's words: short and (`{:#}`) with the signer and the SVN; a resumed verdict
    /// says how long ago its evidence was checked; an exclusion its reason and detail.
    #[test]
    fn a_verdict_says_what_was_decided() {
        let now = mbx_attest::unix_seconds(std::time::SystemTime::now());
        let verified = |resumed, in_cert| MiddleboxVerdict::Verified {
            middlebox: "mb.test".into(),
            claims: Some(claims()),
            resumed,
            checked_at: now.saturating_sub(3600),
            evidence_in_certificate: in_cert,
        };
        let v = verified(false, false);
        assert_eq!(
            v.to_string(),
            "mb.test verified (sim TEE, measurement abab)"
        );
        assert_eq!(
            format!("{v:#}"),
            "mb.test verified (sim TEE, measurement abab, signer cdcd, svn 7)"
        );
        let cert = verified(false, true).to_string();
        assert!(
            cert.ends_with("; evidence from its certificate, made once for its key)"),
            "{cert}"
        );
        // The clock may tick between `now` and the verdict's own reading of it.
        let resumed = verified(true, false).to_string();
        assert!(
            resumed.starts_with(
                "mb.test verified (sim TEE, measurement abab; resumed: evidence checked 36"
            ) && resumed.ends_with(" s ago, on an earlier session)"),
            "{resumed}"
        );
        let bare = MiddleboxVerdict::Verified {
            middlebox: "mb.test".into(),
            claims: None,
            resumed: true,
            checked_at: now,
            evidence_in_certificate: false,
        };
        assert_eq!(
            bare.to_string(),
            "mb.test sent no evidence (the policy does not require it) (resumed)"
        );
        let excluded = MiddleboxVerdict::Excluded {
            middlebox: None,
            why: "bad certificate",
            detail: Some("expired".into()),
        };
        assert_eq!(
            excluded.to_string(),
            "a middlebox was excluded: bad certificate (expired)"
        );
        assert_eq!(
            MiddleboxVerdict::Direct.to_string(),
            "no client-side middlebox took part"
        );
    }
}
