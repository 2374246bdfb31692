//! Thin tokio drivers: move bytes between the state machines and TCP streams.
//!
//! The state machines do the work (garbling, OT, evaluation) inside `poll_transmit`; the drivers
//! call it under [`tokio::task::block_in_place`], so they need the multi-threaded runtime. Output
//! is pulled one frame at a time and only when the previous frame is written, so a slow peer
//! bounds memory instead of letting frames pile up; reading continues meanwhile, so neither side
//! can deadlock on full socket buffers.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::Progress;
use crate::endpoint::Endpoint;
use crate::error::SetupError;
use crate::middlebox::{Middlebox, SetupOutcome};
use crate::wire::Peer;

/// What one party sent, received and how long it took.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PartyStats {
    pub bytes_sent: u64,
    pub bytes_received: u64,
    pub elapsed: Duration,
    /// Time spent inside the state machine (garbling, OT, hashing, evaluation), the rest being
    /// waiting for and moving bytes.
    pub busy: Duration,
}

/// Runs `f` off the async executor and adds its duration to `busy`.
fn compute<T>(busy: &mut Duration, f: impl FnOnce() -> T) -> T {
    let t = Instant::now();
    let r = tokio::task::block_in_place(f);
    *busy += t.elapsed();
    r
}

/// Errors of the drivers.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Setup(#[from] SetupError),
}

const READ_BUF: usize = 256 * 1024;

/// One outgoing frame being written.
#[derive(Default)]
struct Pending {
    buf: Vec<u8>,
    pos: usize,
}

impl Pending {
    fn is_empty(&self) -> bool {
        self.pos >= self.buf.len()
    }
    fn rest(&self) -> &[u8] {
        self.buf.get(self.pos..).unwrap_or_default()
    }
}

/// Runs an endpoint over `stream` until the middlebox reports success. `progress` is called
/// whenever the endpoint's progress changes.
pub async fn run_endpoint(
    stream: TcpStream,
    mut ep: Endpoint,
    mut progress: impl FnMut(&Progress),
) -> Result<PartyStats, DriverError> {
    let start = Instant::now();
    let mut busy = Duration::ZERO;
    let _ = stream.set_nodelay(true);
    let (mut rd, mut wr) = stream.into_split();
    let mut buf = vec![0u8; READ_BUF];
    let mut out = Pending::default();
    let mut last = ep.progress();
    loop {
        if out.is_empty() {
            if let Some(f) = compute(&mut busy, || ep.poll_transmit())? {
                out = Pending { buf: f, pos: 0 };
            }
        }
        if ep.progress() != last {
            last = ep.progress();
            progress(&last);
        }
        if out.is_empty() && ep.is_done() {
            break;
        }
        tokio::select! {
            r = rd.read(&mut buf) => {
                let n = r?;
                if n == 0 {
                    return Err(SetupError::Aborted { peer: Peer::Middlebox }.into());
                }
                let data = buf.get(..n).unwrap_or_default();
                compute(&mut busy, || ep.receive(data))?;
            }
            w = wr.write(out.rest()), if !out.is_empty() => {
                out.pos += w?;
            }
        }
    }
    let _ = wr.shutdown().await;
    let p = ep.progress();
    progress(&p);
    Ok(PartyStats {
        bytes_sent: p.bytes_sent,
        bytes_received: p.bytes_received,
        elapsed: start.elapsed(),
        busy,
    })
}

/// Runs the middlebox with the full-circuit endpoint on `full` and the hash endpoint on `hash`.
/// On any failed check it returns the error and drops both connections (the endpoints see the
/// setup aborted; the primary connection must then be refused).
pub async fn run_middlebox(
    full: TcpStream,
    hash: TcpStream,
    mut mb: Middlebox,
    mut progress: impl FnMut(&Progress),
) -> Result<(SetupOutcome, PartyStats), DriverError> {
    let start = Instant::now();
    let mut busy = Duration::ZERO;
    let _ = full.set_nodelay(true);
    let _ = hash.set_nodelay(true);
    let (mut rf, mut wf) = full.into_split();
    let (mut rh, mut wh) = hash.into_split();
    let mut bf = vec![0u8; READ_BUF];
    let mut bh = vec![0u8; READ_BUF];
    let (mut of, mut oh) = (Pending::default(), Pending::default());
    let mut last = mb.progress();
    // A closed read half reads 0 at once: stop polling it (a peer may close once it has
    // everything while our last frames are still being written).
    let (mut open_f, mut open_h) = (true, true);
    loop {
        if of.is_empty() {
            if let Some(f) = compute(&mut busy, || mb.poll_transmit(Peer::Full))? {
                of = Pending { buf: f, pos: 0 };
            }
        }
        if oh.is_empty() {
            if let Some(f) = compute(&mut busy, || mb.poll_transmit(Peer::Hash))? {
                oh = Pending { buf: f, pos: 0 };
            }
        }
        if mb.progress() != last {
            last = mb.progress();
            progress(&last);
        }
        if of.is_empty() && oh.is_empty() && mb.is_done() {
            break;
        }
        tokio::select! {
            r = rf.read(&mut bf), if open_f => {
                let n = r?;
                if n == 0 {
                    open_f = false;
                    mb.peer_closed(Peer::Full)?;
                } else {
                    let data = bf.get(..n).unwrap_or_default();
                    compute(&mut busy, || mb.receive(Peer::Full, data))?;
                }
            }
            r = rh.read(&mut bh), if open_h => {
                let n = r?;
                if n == 0 {
                    open_h = false;
                    mb.peer_closed(Peer::Hash)?;
                } else {
                    let data = bh.get(..n).unwrap_or_default();
                    compute(&mut busy, || mb.receive(Peer::Hash, data))?;
                }
            }
            w = wf.write(of.rest()), if !of.is_empty() => { of.pos += w?; }
            w = wh.write(oh.rest()), if !oh.is_empty() => { oh.pos += w?; }
            // Both peers gone and nothing left to send: `finish` below says whether the
            // setup completed.
            else => break,
        }
    }
    let _ = wf.shutdown().await;
    let _ = wh.shutdown().await;
    let p = mb.progress();
    progress(&p);
    let outcome = mb.finish()?;
    Ok((
        outcome,
        PartyStats {
            bytes_sent: p.bytes_sent,
            bytes_received: p.bytes_received,
            elapsed: start.elapsed(),
            busy,
        },
    ))
}
