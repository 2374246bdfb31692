//! The reports of ended connections, waiting for the application to read them.
//!
//! A listening driver hands one report per ended connection to its owner. An owner that never
//! reads them must not make a long-running server grow without bound, so at most
//! [`REPORTS_KEPT`] wait; later ones are dropped and counted until the owner reads again.
//! Every report is logged as well (`tracing`), so a dropped one is not lost from the logs.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::mpsc;

/// Reports of ended connections kept unread before newer ones are dropped.
pub const REPORTS_KEPT: usize = 1024;

/// What a listener counts as its connections end: every connection, whether or not its report
/// is read (e.g. for a metrics endpoint).
#[derive(Debug, Default)]
pub(crate) struct Tally {
    ended_cleanly: AtomicU64,
    failed: AtomicU64,
    middlebox_took_part: AtomicU64,
    key_updates: AtomicU64,
    upstream_bytes: AtomicU64,
    downstream_bytes: AtomicU64,
}

/// A listener's counts of ended connections so far ([`Listening::stats`](super::Listening::stats)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EndedConnections {
    /// Connections that ended cleanly (close_notify both ways, or the relay's equivalent).
    pub ended_cleanly: u64,
    /// Connections that ended with an error (handshake failures, timeouts, alerts, peers gone).
    pub failed: u64,
    /// Connections in which a middlebox held keys: at a middlebox, this one; at a server or a
    /// client proxy, one of its side's that received key material.
    pub middlebox_took_part: u64,
    /// TLS 1.3 KeyUpdates followed: at a middlebox, those it passed on (from either side); at
    /// a server or a client proxy, those its peer sent.
    pub key_updates: u64,
    /// Bytes carried toward the server (read from the client's side) and back, as each
    /// driver's report counts them (a middlebox: ciphertext read; a server and a client proxy:
    /// plaintext exchanged with the backend or the local application).
    pub upstream_bytes: u64,
    pub downstream_bytes: u64,
}

impl Tally {
    fn add<T: Report>(&self, report: &T) {
        let ended = if report.outcome().is_ok() {
            &self.ended_cleanly
        } else {
            &self.failed
        };
        ended.fetch_add(1, Ordering::Relaxed);
        if report.middlebox_took_part() {
            self.middlebox_took_part.fetch_add(1, Ordering::Relaxed);
        }
        self.key_updates
            .fetch_add(report.key_updates(), Ordering::Relaxed);
        let (up, down) = report.bytes();
        self.upstream_bytes.fetch_add(up, Ordering::Relaxed);
        self.downstream_bytes.fetch_add(down, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> EndedConnections {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        EndedConnections {
            ended_cleanly: get(&self.ended_cleanly),
            failed: get(&self.failed),
            middlebox_took_part: get(&self.middlebox_took_part),
            key_updates: get(&self.key_updates),
            upstream_bytes: get(&self.upstream_bytes),
            downstream_bytes: get(&self.downstream_bytes),
        }
    }
}

/// The accept loop's end: cloned into every connection task.
pub(crate) struct ReportSender<T> {
    tx: mpsc::Sender<T>,
    dropped: Arc<AtomicU64>,
    tally: Arc<Tally>,
}

impl<T> Clone for ReportSender<T> {
    fn clone(&self) -> Self {
        ReportSender {
            tx: self.tx.clone(),
            dropped: self.dropped.clone(),
            tally: self.tally.clone(),
        }
    }
}

impl<T> ReportSender<T> {
    /// Queues `report`, or counts it as dropped when [`REPORTS_KEPT`] wait unread.
    pub(crate) fn send(&self, report: T) {
        if self.tx.try_send(report).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A connection's report: how it ended, and what the listener's counts take from it.
pub(crate) trait Report: core::fmt::Debug {
    /// The connection's number, from 0 in accept order.
    fn id(&self) -> u64;
    /// `Err` with the reason when the connection did not end cleanly.
    fn outcome(&self) -> &Result<(), String>;
    fn outcome_mut(&mut self) -> &mut Result<(), String>;
    /// Whether a middlebox held keys in the session (see [`EndedConnections`]).
    fn middlebox_took_part(&self) -> bool;
    /// Bytes carried toward the server and back (see [`EndedConnections`]).
    fn bytes(&self) -> (u64, u64);
    /// TLS 1.3 KeyUpdates followed (see [`EndedConnections`]).
    fn key_updates(&self) -> u64;
}

impl<T: Report> ReportSender<T> {
    /// Counts, logs (a warning when its connection failed; `what` names the connection) and
    /// queues `report`.
    pub(crate) fn log_and_send(&self, report: T, what: &'static str) {
        self.tally.add(&report);
        // One short line per connection; the whole report (hashes, verdicts) at debug level.
        let (id, (up, down)) = (report.id(), report.bytes());
        match report.outcome() {
            Ok(()) => tracing::info!(id, up, down, "{what} ended"),
            Err(e) => tracing::warn!(id, up, down, error = %e, "{what} failed"),
        }
        tracing::debug!(?report, "{what} report");
        self.send(report);
    }
}

/// The owner's end.
pub(crate) struct ReportReceiver<T> {
    rx: mpsc::Receiver<T>,
    dropped: Arc<AtomicU64>,
    tally: Arc<Tally>,
}

impl<T> ReportReceiver<T> {
    pub(crate) async fn recv(&mut self) -> Option<T> {
        self.rx.recv().await
    }

    /// Reports dropped so far because [`REPORTS_KEPT`] waited unread.
    #[cfg(test)]
    pub(crate) fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// The count of reports dropped, shared.
    pub(crate) fn dropped_count(&self) -> Arc<AtomicU64> {
        self.dropped.clone()
    }

    /// The counts of every connection that ended, read or not, shared.
    pub(crate) fn tally(&self) -> Arc<Tally> {
        self.tally.clone()
    }
}

pub(crate) fn report_queue<T>() -> (ReportSender<T>, ReportReceiver<T>) {
    let (tx, rx) = mpsc::channel(REPORTS_KEPT);
    let dropped = Arc::new(AtomicU64::new(0));
    let tally = Arc::new(Tally::default());
    (
        ReportSender {
            tx,
            dropped: dropped.clone(),
            tally: tally.clone(),
        },
        ReportReceiver { rx, dropped, tally },
    )
}

/// A connection's report while the connection is served, with the counts kept beside it (`X`,
/// folded into the report by `fold` at the end). [`Pending::send`] sends it when the
/// connection ends. A task aborted before that (its listener stopping: at the end of a drain,
/// or at once) drops it, and the report is sent from here with the error
/// [`DriverError::CutAtStop`](super::DriverError::CutAtStop) and what it held so far: a cut
/// connection is reported like any other, at no cost to the connection while it runs.
pub(crate) struct Pending<R: Report, X> {
    state: Option<(R, X)>,
    fold: fn(&mut R, &X),
    sender: ReportSender<R>,
    what: &'static str,
}

impl<R: Report, X> Pending<R, X> {
    pub(crate) fn new(
        report: R,
        beside: X,
        fold: fn(&mut R, &X),
        sender: ReportSender<R>,
        what: &'static str,
    ) -> Self {
        Pending {
            state: Some((report, beside)),
            fold,
            sender,
            what,
        }
    }

    /// The report and the counts beside it, to fill while the connection is served (`None`
    /// only after [`send`](Self::send), which takes them).
    pub(crate) fn parts(&mut self) -> Option<(&mut R, &mut X)> {
        self.state.as_mut().map(|(r, x)| (r, x))
    }

    /// The connection ended: fold the counts in, count, log and queue the report.
    pub(crate) fn send(mut self) {
        self.finish(false);
    }

    fn finish(&mut self, cut: bool) {
        let Some((mut report, beside)) = self.state.take() else {
            return;
        };
        (self.fold)(&mut report, &beside);
        if cut {
            *report.outcome_mut() = Err(super::DriverError::CutAtStop.to_string());
        }
        self.sender.log_and_send(report, self.what);
    }
}

impl<R: Report, X> Drop for Pending<R, X> {
    fn drop(&mut self) {
        // Still here: the task was aborted mid-connection.
        self.finish(true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn at_most_reports_kept_wait_and_the_rest_are_counted() {
        let (tx, mut rx) = report_queue::<usize>();
        for i in 0..REPORTS_KEPT + 5 {
            tx.send(i);
        }
        assert_eq!(rx.dropped(), 5);
        for i in 0..REPORTS_KEPT {
            assert_eq!(rx.recv().await, Some(i));
        }
        // Room again once read.
        tx.send(7);
        assert_eq!(rx.recv().await, Some(7));
        assert_eq!(rx.dropped(), 5);
    }
}
