//! One edge connection after its TLS handshake, driven by a single task that owns the socket and
//! the rustls connection.
//!
//! The per-request cost on the reactor is what limits a key server doing cheap operations
//! (ECDSA P-256, Ed25519: tens of µs each), so everything here is done per *wake-up*, not per
//! request:
//!
//! - **Reading**: one `read` takes what the socket holds (up to a full TLS record); every record in
//!   it is decrypted, every complete request cut, and all of them queued for the workers at once.
//! - **Working**: a connection's queue is served by up to one job per worker thread; each job
//!   takes the next request from the queue. A slow operation therefore holds up only the job
//!   running it; the requests behind it are taken by the other jobs (with more than one worker).
//! - **Answering**: a job appends its responses to one buffer and sends it to the connection task
//!   when the queue is empty, when the oldest response in it is [`HOLD`] old (or it holds
//!   [`FLUSH_BYTES`]), or before an operation whose mean duration so far (from the metrics) would
//!   keep the held responses waiting past [`HOLD`]. A response waits at most about [`HOLD`] for
//!   companions, and only while more requests of its connection are queued: a lone request is
//!   answered at once. After a [`HOLD`] flush the job ends and the connection task spawns a new
//!   one, which queues behind the other connections' jobs, so busy connections take turns.
//! - **Writing**: every buffer that is ready goes into one TLS write (full-size records) and one
//!   `writev`.
//!
//! Back-pressure is unchanged: at most `max_in_flight` requests per connection are between being
//! cut and having their response accepted by the socket; beyond that the connection stops
//! reading, so an edge that sends without reading stalls itself. Requests already read but held
//! back by the limit are cut as soon as written answers make room (not only when more bytes
//! arrive: the edge may have sent everything and be waiting for those answers).

use std::collections::VecDeque;
use std::io::{self, Read as _, Write};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rustls::ServerConnection;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::WriteHalf;
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use zeroize::Zeroize;

use crate::server::authz::EdgeIdentity;
use crate::server::core::KeyServerCore;
use crate::server::metrics::ServerStats;
use crate::wipe::wipe;
use crate::wire::{Deframer, Frame, HEADER_LEN, MIN_MESSAGE_LEN};

/// How long a finished response may wait in a job's buffer for others to share its TLS write.
pub(crate) const HOLD: Duration = Duration::from_millis(1);

/// A job hands its buffer back once it holds this many bytes (about 30 responses, what an ECDSA
/// worker produces in [`HOLD`]).
const FLUSH_BYTES: usize = 32 * 1024;

/// A response buffer's capacity: room for [`FLUSH_BYTES`] and one more response of ordinary size.
const BUFFER_CAPACITY: usize = FLUSH_BYTES + 2 * MIN_MESSAGE_LEN;

/// Largest read from the socket at once (a full TLS record with about 15 requests).
const READ_BYTES: usize = 16 * 1024 + 512;

/// Written response buffers a connection keeps for reuse while it is busy.
const SPARE_BUFFERS: usize = 2;

/// Responses encoded back to back, and how many. Only the written length is ever filled, so
/// only that is wiped on drop (a response may carry an RSA decryption).
pub(crate) struct Responses {
    bytes: Vec<u8>,
    count: usize,
    /// The job sending this ended with requests still queued.
    resubmit: bool,
}

impl Responses {
    /// The buffer, wiped and emptied, for reuse.
    fn recycle(mut self) -> Vec<u8> {
        wipe(&mut self.bytes);
        self.bytes.clear();
        std::mem::take(&mut self.bytes)
    }
}

impl Drop for Responses {
    fn drop(&mut self) {
        wipe(&mut self.bytes);
    }
}

/// A connection's requests waiting for a worker, and the jobs serving them.
struct Work {
    queue: Mutex<Queue>,
    core: Arc<KeyServerCore>,
    stats: Arc<ServerStats>,
    identity: Arc<EdgeIdentity>,
    pool: Arc<rayon::ThreadPool>,
    /// At most this many jobs serve the connection at once (one per worker thread).
    max_jobs: usize,
    tx: mpsc::UnboundedSender<Responses>,
    /// Written response buffers, for reuse.
    spare: Mutex<Vec<Vec<u8>>>,
}

#[derive(Default)]
struct Queue {
    frames: VecDeque<Frame>,
    /// Jobs spawned and not yet finished.
    jobs: usize,
}

impl Work {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `frames` and spawns jobs for them, up to one per worker thread. Called by the
    /// connection task only (so jobs enter the pool's global FIFO queue, and every connection
    /// gets its turn).
    fn add(self: &Arc<Self>, frames: impl IntoIterator<Item = Frame>) {
        let spawn = {
            let mut q = self.lock();
            q.frames.extend(frames);
            let n = self.max_jobs.saturating_sub(q.jobs).min(q.frames.len());
            q.jobs += n;
            n
        };
        for _ in 0..spawn {
            let work = Arc::clone(self);
            self.pool.spawn(move || work.run());
        }
    }

    /// The next request, or `None` and this job is finished.
    fn next(&self) -> Option<Frame> {
        let mut q = self.lock();
        let frame = q.frames.pop_front();
        if frame.is_none() {
            q.jobs = q.jobs.saturating_sub(1);
        }
        frame
    }

    /// One job: serves queued requests, appending their responses to one buffer, until the
    /// queue is empty or the buffer is due ([`HOLD`] old or [`FLUSH_BYTES`] long). Then it sends
    /// the buffer and ends; if requests are still queued, the connection task spawns a new job
    /// for them behind the other connections' jobs.
    fn run(&self) {
        let mut out = Responses {
            bytes: Vec::new(),
            count: 0,
            resubmit: false,
        };
        // When the oldest response in `out` was finished.
        let mut held_since: Option<Instant> = None;
        let mut start = Instant::now();
        while let Some(mut frame) = self.next() {
            // A response is never longer than the minimum message or its request plus a few
            // bytes; room is made without leaving copies of earlier responses in freed memory.
            if out.bytes.capacity() == 0 {
                out.bytes = self.buffer();
            }
            crate::wipe::reserve(
                &mut out.bytes,
                MIN_MESSAGE_LEN + HEADER_LEN + frame.body.len() + 64,
            );
            let outcome =
                self.core
                    .handle_frame_into(&frame, &self.identity, &mut out.bytes, |op, bytes| {
                        let Some(since) = held_since else { return };
                        let expected = self.stats.mean_duration(op).unwrap_or(Duration::MAX);
                        // `start` (the end of the previous request) stands in for now.
                        let held = start.saturating_duration_since(since);
                        if held.saturating_add(expected) > HOLD {
                            // Don't keep finished responses waiting behind a slow operation.
                            self.send(bytes, &mut out.count, false);
                            // Room for this response, allocated before any of it is written.
                            *bytes = self.buffer();
                            held_since = None;
                        }
                    });
            // The request may hold an RSA block: wipe it (word-wise, see `wipe`) before the
            // frame's own byte-wise wipe, which then has nothing left to do.
            let mut body = std::mem::take(&mut *frame.body);
            wipe(&mut body);
            drop(body);
            drop(frame);
            out.count += 1;
            let now = Instant::now();
            self.stats
                .record(&outcome, now.saturating_duration_since(start));
            start = now;
            let since = *held_since.get_or_insert(now);
            if out.bytes.len() >= FLUSH_BYTES || now.saturating_duration_since(since) >= HOLD {
                let more = {
                    let mut q = self.lock();
                    q.jobs = q.jobs.saturating_sub(1);
                    !q.frames.is_empty()
                };
                self.send(&mut out.bytes, &mut out.count, more);
                return;
            }
        }
        if out.count > 0 {
            self.send(&mut out.bytes, &mut out.count, false);
        }
    }

    /// An empty response buffer: one the connection task has written and wiped, or a new one.
    fn buffer(&self) -> Vec<u8> {
        let spare = self.spare.lock().unwrap_or_else(|p| p.into_inner()).pop();
        spare.unwrap_or_else(|| Vec::with_capacity(BUFFER_CAPACITY))
    }

    /// Keeps a written response buffer (wiped and emptied by [`Responses::recycle`]) for reuse,
    /// at most [`SPARE_BUFFERS`] per connection: allocating and freeing a 34 KiB buffer per run
    /// costs the allocator more than a short lock.
    fn give_back(&self, buffer: Vec<u8>) {
        let mut spare = self.spare.lock().unwrap_or_else(|p| p.into_inner());
        if spare.len() < SPARE_BUFFERS && buffer.capacity() == BUFFER_CAPACITY {
            spare.push(buffer);
        }
    }

    /// Frees the spare buffers (an idle connection holds none).
    fn release_spares(&self) {
        self.spare.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }

    /// Hands the responses in `bytes` to the connection task, leaving `bytes` empty.
    /// `resubmit`: requests are queued that no job may be serving.
    fn send(&self, bytes: &mut Vec<u8>, count: &mut usize, resubmit: bool) {
        let run = Responses {
            bytes: std::mem::take(bytes),
            count: std::mem::take(count),
            resubmit,
        };
        // Fails only once the connection is gone; its responses are then dropped (and wiped).
        let _ = self.tx.send(run);
    }
}

/// Everything the connection task needs from the server.
pub(crate) struct Server {
    pub(crate) core: Arc<KeyServerCore>,
    pub(crate) stats: Arc<ServerStats>,
    pub(crate) pool: Arc<rayon::ThreadPool>,
    pub(crate) max_in_flight: usize,
}

/// Serves one connection whose handshake is complete until the edge closes it (answering what
/// is still in progress first), a frame is oversized or the socket fails.
pub(crate) async fn serve(
    server: Server,
    mut tcp: TcpStream,
    mut tls: ServerConnection,
    identity: Arc<EdgeIdentity>,
    peer: SocketAddr,
) {
    let (tx, mut rx) = mpsc::unbounded_channel::<Responses>();
    let work = Arc::new(Work {
        queue: Mutex::new(Queue::default()),
        core: Arc::clone(&server.core),
        stats: Arc::clone(&server.stats),
        identity,
        max_jobs: server.pool.current_num_threads().max(1),
        pool: Arc::clone(&server.pool),
        tx,
        spare: Mutex::new(Vec::new()),
    });
    let (mut reader, writer) = tcp.split();
    let mut deframer = Deframer::new(server.core.max_body_len());
    let mut input = vec![0u8; READ_BYTES];
    let mut plain = Plain(vec![0u8; 8 * 1024]);
    // Requests cut and not yet answered on the socket; of those, responses given to rustls
    // but not yet fully written.
    let (mut in_flight, mut unwritten) = (0usize, 0usize);
    let mut reading = true;

    // The handshake may have left requests (sent with the client's Finished) decrypted.
    if drain_plaintext(&mut tls, &mut plain, &mut deframer) {
        reading = false;
    }
    loop {
        match write_tls(&writer, &mut tls) {
            Ok(true) => {
                in_flight = in_flight.saturating_sub(unwritten);
                unwritten = 0;
                if in_flight == 0 {
                    work.release_spares();
                }
            }
            Ok(false) => {}
            Err(_) => return,
        }
        // After the write: requests already buffered that the limit held back are cut as soon
        // as answers make room, not only when more bytes arrive (the edge may have sent all it
        // has and be waiting for these answers).
        match dispatch(&server, &work, &mut deframer, &mut in_flight) {
            Ok(()) => {}
            Err(e) => {
                ServerStats::bump(&server.stats.oversized_closes);
                tracing::warn!(%peer, error = %e, "closing connection");
                return;
            }
        }
        if !reading && in_flight == 0 {
            break;
        }
        let wants_write = tls.wants_write();
        let can_read = reading && in_flight < server.max_in_flight;
        tokio::select! {
            read = reader.read(&mut input), if can_read => match read {
                Ok(0) | Err(_) => reading = false,
                Ok(n) => match receive(&mut tls, input.get(..n).unwrap_or_default(), &mut plain, &mut deframer) {
                    Ok(closed) => reading = !closed,
                    Err(_) => {
                        // A TLS error: rustls has queued an alert; send it and stop.
                        let _ = write_tls(&writer, &mut tls);
                        return;
                    }
                },
            },
            ready = writer.writable(), if wants_write => {
                if ready.is_err() {
                    return;
                }
            }
            Some(first) = rx.recv() => {
                let (mut run, mut resubmit) = (Some(first), false);
                while let Some(r) = run {
                    if tls.writer().write_all(&r.bytes).is_err() {
                        return;
                    }
                    unwritten += r.count;
                    resubmit |= r.resubmit;
                    work.give_back(r.recycle());
                    run = rx.try_recv().ok();
                }
                if resubmit {
                    work.add([]);
                }
            }
        }
    }
    // The edge stopped sending and everything is answered: close_notify, then FIN.
    tls.send_close_notify();
    let mut writer = writer;
    loop {
        match write_tls(&writer, &mut tls) {
            Ok(true) => break,
            Ok(false) => {
                if writer.writable().await.is_err() {
                    return;
                }
            }
            Err(_) => return,
        }
    }
    let _ = writer.shutdown().await;
}

/// Plaintext scratch space, wiped on drop.
struct Plain(Vec<u8>);

impl Drop for Plain {
    fn drop(&mut self) {
        self.0.zeroize();
    }
}

/// Cuts every complete request the in-flight limit allows and queues them for the workers.
fn dispatch(
    server: &Server,
    work: &Arc<Work>,
    deframer: &mut Deframer,
    in_flight: &mut usize,
) -> Result<(), crate::wire::FrameError> {
    // Requests are at least MIN_MESSAGE_LEN long when padded as usual: size the batch once.
    let mut frames = Vec::with_capacity(deframer.buffered() / MIN_MESSAGE_LEN + 1);
    while *in_flight < server.max_in_flight {
        match deframer.next_frame()? {
            Some(frame) => {
                frames.push(frame);
                *in_flight += 1;
            }
            None => break,
        }
    }
    if !frames.is_empty() {
        work.add(frames);
    }
    Ok(())
}

/// Feeds bytes read from the socket to rustls and moves the decrypted requests to `deframer`.
/// `Ok(true)` once the edge has closed its side.
fn receive(
    tls: &mut ServerConnection,
    mut bytes: &[u8],
    plain: &mut Plain,
    deframer: &mut Deframer,
) -> Result<bool, rustls::Error> {
    while !bytes.is_empty() {
        if tls.read_tls(&mut bytes).is_err() {
            return Err(rustls::Error::General("TLS input buffer full".into()));
        }
        let state = tls.process_new_packets()?;
        if drain_plaintext(tls, plain, deframer) || state.peer_has_closed() {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Moves all decrypted plaintext from rustls to the deframer; `true` once the edge has closed
/// its side (close_notify, or an unclean close).
fn drain_plaintext(tls: &mut ServerConnection, plain: &mut Plain, deframer: &mut Deframer) -> bool {
    loop {
        match tls.reader().read(&mut plain.0) {
            Ok(0) => return true,
            Ok(n) => deframer.push(plain.0.get(..n).unwrap_or_default()),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return false,
            Err(_) => return true,
        }
    }
}

/// Writes pending TLS records without waiting: `Ok(true)` once none is left, `Ok(false)` if the
/// socket is full.
fn write_tls(writer: &WriteHalf<'_>, tls: &mut ServerConnection) -> io::Result<bool> {
    while tls.wants_write() {
        match tls.write_tls(&mut TryWriter(writer)) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// `std::io::Write` over a non-blocking tokio socket (WouldBlock when full).
struct TryWriter<'a, 'b>(&'a WriteHalf<'b>);

impl Write for TryWriter<'_, '_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.try_write(buf)
    }

    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        self.0.try_write_vectored(bufs)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
