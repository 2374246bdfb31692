//! An mbTLS endpoint's data phase spliced with a plain TCP connection: the server with its
//! backend, the client proxy with its local connection. Records from the path become plaintext
//! for the plain side; what the plain side sends is sealed toward the path; both directions at
//! once, each with its own back-pressure ([`Outbox`]), read buffers an idle session frees, and
//! the idle timeout.
//!
//! End of stream: the plain side's EOF sends close_notify; the peer's close_notify half-closes
//! the plain side; the session ends once both happened and everything queued is out. An EOF
//! from the path before the peer's close_notify is truncation (an error), unless we sent our
//! close_notify already and the peer sent nothing after it: HTTP peers then often just close,
//! having said all they had to say, and the session ends without an error. A peer that went on
//! sending after our close_notify and then ends without its own may have been cut mid-stream:
//! an error. Either way the plain side is reset, not closed, whenever the peer's close_notify
//! never came (as after any error but an idle timeout): a cut that drops everything after our
//! close_notify looks the same as a peer that had finished, so only a reset keeps a backend
//! or local application that still reads from taking it for a complete stream.

use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::time::timeout;

use super::outbox::Outbox;
use super::proxy::AnswerFn;
use super::quiet::{Activity, Due};
use super::read_buf::{read_into, ReadBuf};
use super::{DriverError, CLOSE_GRACE, READ_BUF, READ_RESET, WRITE_RESET};

/// The endpoint core of a session in its data phase, with the handling of its events.
pub(crate) trait EndpointSession {
    /// Feeds records from the path, then handles the events they caused: an alert, a failed
    /// check or the like is the error that ends the session.
    fn receive(&mut self, records: &[u8]) -> Result<(), DriverError>;
    /// Seals plaintext toward the peer.
    fn write(&mut self, plain: &[u8]) -> Result<(), DriverError>;
    /// Queues close_notify: nothing more from us.
    fn close(&mut self) -> Result<(), DriverError>;
    /// Plaintext received from the peer so far.
    fn take_plaintext(&mut self) -> Vec<u8>;
    /// Records queued toward the path.
    fn take_outgoing(&mut self) -> Vec<u8>;
    /// Whether the peer's close_notify arrived.
    fn peer_closed(&self) -> bool;
    /// Frees buffers an idle session does not need.
    fn release_idle_buffers(&mut self);
    /// TLS 1.3 KeyUpdates the peer sent, followed so far.
    fn peer_key_updates(&self) -> u32;
    /// Whether part of a record from the peer waits for the rest.
    fn has_partial_record(&self) -> bool;
}

/// The two sockets' names in errors.
pub(crate) struct Sides {
    /// The path's neighbour: "previous hop" at the server, "middlebox" at the client.
    pub path: &'static str,
    pub reading_path: &'static str,
    pub writing_path: &'static str,
    /// The plain side's end: "backend" at the server, "local application" at the proxy.
    pub plain: &'static str,
    pub reading_plain: &'static str,
    pub writing_plain: &'static str,
}

/// What a session carried, kept up to date so that it is known however the session ends.
#[derive(Debug, Default)]
pub(crate) struct Carried {
    /// Plaintext bytes from the peer given to the plain side: as they are queued for it, less,
    /// when the session fails, what never reached it (left queued, or dropped by the reset
    /// after `CLOSE_GRACE` from a reader that fell behind).
    pub to_plain: u64,
    /// Plaintext bytes read from the plain side and sealed toward the peer.
    pub from_plain: u64,
    /// How often the read buffers were freed after two seconds without a read.
    pub idle_trims: u32,
    /// TLS 1.3 KeyUpdates the peer sent, followed.
    pub peer_key_updates: u32,
    /// The session ended without an error, but the peer's close_notify never came (it left
    /// after ours, having sent nothing more): the plain side was reset all the same.
    pub peer_left_without_close_notify: bool,
    /// The plain side itself failed (it reset, or left while we wrote): nothing more can
    /// reach it.
    pub plain_side_failed: bool,
}

/// Runs the data phase of `session` between `path` and `plain` until both directions ended
/// (`Ok`) or something failed; `idle_timeout`: give up once neither side carried a byte for
/// that long (`None`: never). `early_answer`: what the plain side is told, instead of a
/// reset, when the session fails before anything came from the peer (e.g. an HTTP 502 and the
/// reason), after which its connection ends in order.
pub(crate) async fn splice<S: EndpointSession>(
    session: &mut S,
    path: TcpStream,
    plain: TcpStream,
    idle_timeout: Option<Duration>,
    early_answer: Option<&AnswerFn>,
    sides: &Sides,
    carried: &mut Carried,
) -> Result<(), DriverError> {
    let mut plain = plain;
    // The caller set `plain` to reset when closed (`reset_when_closed`) as soon as it had it, so
    // that a session that fails or is cut, here or before (an error, this future dropped by a
    // stop at the end of a drain or by a panic), never looks to the plain side like one that
    // ended (an HTTP body delimited by the close would pass for whole); only an orderly end
    // below sets it back. (Borrowed halves: tokio's owned write half would send a FIN when
    // dropped, before the reset.)
    let (plain_r, mut plain_w) = plain.split();
    let mut to_plain = Outbox::new();
    let ended = splice_halves(
        session,
        path,
        plain_r,
        &mut plain_w,
        &mut to_plain,
        idle_timeout,
        sides,
        carried,
    )
    .await;
    // The plain side's own end (it reset or left): nothing more reaches it.
    let plain_failed = carried.plain_side_failed;
    if let (Err(e), Some(answer)) = (&ended, early_answer) {
        // Nothing came from the peer, which refused the session after its handshake (a TLS
        // 1.3 server that refused its own middlebox alerts after its Finished): the plain
        // side is told why, as when the handshake fails (found in a user trial: the proxy's
        // local application got a bare reset there, and a 502 with TLS 1.2). Not after the
        // peer's close_notify, which ended the plain side's stream already.
        if carried.to_plain == 0
            && !plain_failed
            && !session.peer_closed()
            && !matches!(e, DriverError::IdleTimeout(_))
        {
            answer_and_close(&mut plain, &answer(e)).await;
            return ended;
        }
    }
    // An idle timeout is the service's own orderly end (as nginx's proxy_timeout): closed.
    let in_order = match &ended {
        Ok(()) => !carried.peer_left_without_close_notify,
        Err(e) => matches!(e, DriverError::IdleTimeout(_)),
    };
    let mut ended = ended;
    if in_order {
        // A FIN (the outbox sent it already when the peer's close_notify came), then a
        // normal close; a socket that cannot be set back would drop what it still queues.
        match reset_when_closed(&plain, false) {
            Ok(()) => {
                let _ = plain.shutdown().await;
            }
            Err(e) => {
                let cannot = DriverError::io("cannot end the plain side's stream in order");
                ended = ended.and(Err(cannot(e)));
            }
        }
    } else if !plain_failed {
        // What was authenticated and queued goes out first, without an end of stream (a path
        // that failed or left, a record that failed after good ones), and the reset, which
        // drops what the kernel still holds for the plain side, waits until it is there
        // (found in a user trial: a download cut at the server lost its last megabyte at the
        // proxy's local application, which the proxy had counted as carried). Not when the
        // plain side itself reset: nothing reaches it, and its socket's counters stay as they
        // were, so the wait would only run out.
        let (_, mut plain_w) = plain.split();
        let _ = timeout(CLOSE_GRACE, to_plain.flush(&mut plain_w)).await;
        mbx_net::send_queue::until_sent(&plain, CLOSE_GRACE).await;
        // A reader too slow for the wait loses what is left (at most this much: some may
        // have arrived unacknowledged), which is not counted as carried (found in a trial: a
        // proxy counted megabytes the reset dropped).
        let dropped = mbx_net::send_queue::unsent(&plain).unwrap_or(0) as u64;
        carried.to_plain = carried.to_plain.saturating_sub(dropped);
    }
    // Nor is what never left the outbox.
    carried.to_plain = carried.to_plain.saturating_sub(to_plain.pending() as u64);
    ended
}

/// Best effort: `answer` to a plain side whose session failed, then an orderly close (what
/// it still sends read and dropped, so that the close is not a reset that could overtake the
/// answer).
pub(crate) async fn answer_and_close(plain: &mut TcpStream, answer: &[u8]) {
    if reset_when_closed(plain, false).is_ok() {
        close_reading_the_rest(plain, answer, CLOSE_GRACE).await;
    }
}

/// Whether closing `socket` resets the connection (`SO_LINGER` 0: an RST, queued bytes
/// dropped) or ends it normally (a FIN after what is queued).
pub(crate) fn reset_when_closed(socket: &TcpStream, reset: bool) -> std::io::Result<()> {
    socket2::SockRef::from(socket).set_linger(reset.then_some(Duration::ZERO))
}

/// `to_plain`: what waits for the plain side (the caller's, which passes on what is left in it
/// when the session fails).
#[allow(clippy::too_many_arguments)] // One call site; each is a different piece of the session.
async fn splice_halves<S: EndpointSession>(
    session: &mut S,
    path: TcpStream,
    mut plain_r: tokio::net::tcp::ReadHalf<'_>,
    plain_w: &mut tokio::net::tcp::WriteHalf<'_>,
    to_plain: &mut Outbox,
    idle_timeout: Option<Duration>,
    sides: &Sides,
    carried: &mut Carried,
) -> Result<(), DriverError> {
    let (mut path_r, mut path_w) = path.into_split();
    // Read buffers sized by the traffic, freed (with the core's) when the session idles.
    let (mut path_buf, mut plain_buf) = (ReadBuf::new(READ_BUF), ReadBuf::new(READ_BUF));
    let mut activity = Activity::new(idle_timeout);
    let mut plain_open = true;
    // Plaintext from the peer counted when the plain side ended (and our close_notify left).
    let mut to_plain_at_our_close = 0;
    let mut to_path = Outbox::new();
    loop {
        // Plaintext that arrived (possibly with the handshake) goes to the plain side first.
        let data = session.take_plaintext();
        carried.to_plain += data.len() as u64;
        // Those the handshake's last read brought too.
        carried.peer_key_updates = session.peer_key_updates();
        to_plain.push(data);
        to_path.push(session.take_outgoing());
        let peer_closed = session.peer_closed();
        if peer_closed {
            to_plain.finish();
            if !plain_open && !to_path.wants_write() && !to_plain.wants_write() {
                return Ok(());
            }
        }
        let (want_path, want_plain) = (to_path.wants_write(), to_plain.wants_write());
        // Reads, and writes from the outboxes: all cancel-safe; the core runs outside.
        tokio::select! {
            r = read_into(&mut path_r, &mut path_buf), if !peer_closed && to_plain.has_room() => {
                let n = r.map_err(DriverError::on_path(sides.path, sides.reading_path, READ_RESET))?;
                if n == 0 {
                    // What we queued toward the path goes out first (what the plain side
                    // waits for follows in `splice`).
                    let _ = timeout(CLOSE_GRACE, to_path.flush(&mut path_w)).await;
                    // After our close_notify, a peer that leaves having sent nothing more
                    // (no data, no part of a record) cut nothing.
                    let cut_record = session.has_partial_record();
                    if !plain_open && carried.to_plain == to_plain_at_our_close && !cut_record {
                        carried.peer_left_without_close_notify = true;
                        return Ok(());
                    }
                    return Err(DriverError::PeerGone {
                        peer: sides.path,
                        when: if plain_open {
                            "without close_notify (the session may be truncated)"
                        } else if cut_record {
                            "part-way through a record, after our close_notify (the session may be truncated)"
                        } else {
                            "without close_notify after sending data past ours (the session may be truncated)"
                        },
                    });
                }
                let r = session.receive(path_buf.bytes.get(..n).unwrap_or_default());
                carried.peer_key_updates = session.peer_key_updates();
                path_buf.after_read(n);
                activity.read_now();
                // Whatever the core queued (e.g. an alert) goes out before the error, and the
                // plaintext of the records before the one that failed is queued for the plain
                // side (counted: the proxy's early answer is for a peer that sent nothing).
                to_path.push(session.take_outgoing());
                if let Err(e) = r {
                    let data = session.take_plaintext();
                    carried.to_plain += data.len() as u64;
                    to_plain.push(data);
                    let _ = timeout(CLOSE_GRACE, to_path.flush(&mut path_w)).await;
                    return Err(e);
                }
            }
            r = read_into(&mut plain_r, &mut plain_buf), if plain_open && to_path.has_room() => {
                let n = r.map_err(|e| {
                    carried.plain_side_failed = true;
                    DriverError::on_path(sides.plain, sides.reading_plain, READ_RESET)(e)
                })?;
                let sealed = if n == 0 {
                    plain_open = false;
                    to_plain_at_our_close = carried.to_plain;
                    session.close()
                } else {
                    carried.from_plain += n as u64;
                    activity.read_now();
                    plain_buf.seal_read(n, |plain| session.write(plain))
                };
                if let Err(e) = sealed {
                    // The alert the core sealed when it failed (e.g. keys at their limit)
                    // goes out before the error.
                    to_path.push(session.take_outgoing());
                    let _ = timeout(CLOSE_GRACE, to_path.flush(&mut path_w)).await;
                    return Err(e);
                }
            }
            due = activity.due(activity.trim_pending()), if activity.trim_pending() || activity.has_timeout() => match due {
                Due::Trim => {
                    path_buf.release();
                    plain_buf.release();
                    session.release_idle_buffers();
                    carried.idle_trims += 1;
                }
                // Closed without close_notify: the plain side did not end its stream.
                Due::IdleTimeout(after) => return Err(DriverError::IdleTimeout(after)),
            },
            w = to_path.write_some(&mut path_w), if want_path => {
                w.map_err(DriverError::on_path(sides.path, sides.writing_path, WRITE_RESET))?;
                activity.wrote_now();
            }
            w = to_plain.write_some(&mut *plain_w), if want_plain => {
                // The plain side leaving is said as a neighbour's is (found in a user trial:
                // "Broken pipe (os error 32)").
                w.map_err(|e| {
                    carried.plain_side_failed = true;
                    DriverError::on_path(sides.plain, sides.writing_plain, WRITE_RESET)(e)
                })?;
                activity.wrote_now();
            }
            else => return Err(DriverError::Relay("the session has nothing left to wait for".into())),
        }
    }
}

/// Best effort, for a session that fails anyway: `out`, then the end of our stream, then what
/// the peer still sends is read and dropped until it closes (within `grace`). Closing with
/// bytes unread (a TLS 1.3 client's request follows its Finished at once) would reset the
/// connection, and the reset could overtake what we sent last (an answer, an alert).
pub(crate) async fn close_reading_the_rest(
    stream: &mut TcpStream,
    out: &[u8],
    grace: std::time::Duration,
) {
    use tokio::io::AsyncWriteExt as _;
    let _ = tokio::time::timeout(grace, async {
        stream.write_all(out).await?;
        stream.shutdown().await?;
        discard_until_eof(stream).await;
        std::io::Result::Ok(())
    })
    .await;
}

/// Reads and drops what `r` still delivers until its end or an error.
pub(crate) async fn discard_until_eof(r: &mut (impl tokio::io::AsyncRead + Unpin)) {
    use tokio::io::AsyncReadExt as _;
    // On the heap: an array here would sit in every session's future, which an idle session
    // holds (measured: 2.8 KB more per idle session).
    let mut sink = vec![0u8; 4096];
    while matches!(r.read(&mut sink).await, Ok(n) if n > 0) {}
}
