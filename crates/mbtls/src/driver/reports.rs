//! The reports of ended connections, waiting for the application to read them.
//!
//! A listening driver hands one report per ended connection to its owner. An owner that never
//! reads them must not make a long-running server grow without bound, so at most
//! [`REPORTS_KEPT`] wait; later ones are dropped and counted until the owner reads again.
//! Every report is logged as well (`tracing`), so a dropped one is not lost from the logs.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

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

/// How long a connection took, counted from when it was accepted (the service's clock; for
/// logs and latency figures, never for a decision).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Durations {
    /// Until this party's handshake was over: at a middlebox, its keys arrived; at a server or a
    /// client proxy, its data phase started. `None` if it never was (a failed handshake, a
    /// middlebox that stood aside).
    pub handshake: Option<Duration>,
    /// Until the connection ended and its report was made.
    pub total: Duration,
}

/// A connection's report: how it ended, and what the listener's counts take from it.
pub(crate) trait Report: core::fmt::Debug {
    /// What the connection is, in log events ("mbtls middlebox connection").
    const WHAT: &'static str;
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
    /// Where the connection's durations are kept.
    fn durations_mut(&mut self) -> &mut Durations;
    /// Marks the report of a connection its listener cut ([`CUT_AT_STOP`]).
    fn mark_cut_at_stop(&mut self);
}

impl<T: Report> ReportSender<T> {
    /// Counts, logs (a warning when its connection failed) and queues `report`.
    pub(crate) fn log_and_send(&self, report: T) {
        let what = T::WHAT;
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
    /// Reports taken so far.
    taken: u64,
    dropped: Arc<AtomicU64>,
    tally: Arc<Tally>,
}

impl<T> ReportReceiver<T> {
    pub(crate) async fn recv(&mut self) -> Option<T> {
        let report = self.rx.recv().await;
        self.taken += u64::from(report.is_some());
        report
    }

    /// A report already waiting, if any.
    pub(crate) fn try_recv(&mut self) -> Option<T> {
        let report = self.rx.try_recv().ok();
        self.taken += u64::from(report.is_some());
        report
    }

    /// Reports taken so far ([`recv`](Self::recv), [`try_recv`](Self::try_recv)).
    pub(crate) fn taken(&self) -> u64 {
        self.taken
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
        ReportReceiver {
            rx,
            taken: 0,
            dropped,
            tally,
        },
    )
}

/// The outcome of a connection its listener cut: open when the service stopped.
pub const CUT_AT_STOP: &str =
    "cut: the service stopped while the connection was open (at the end of the drain time, or at once)";

/// What the counts a connection keeps beside its report (`X`) add to it at the end.
pub(crate) trait Absorb<X> {
    fn absorb(&mut self, beside: &X);
}

impl<R> Absorb<()> for R {
    fn absorb(&mut self, _: &()) {}
}

/// A connection's report while the connection is served, with the counts kept beside it
/// (`X`). [`Pending::send`] sends it when the connection ends. A task aborted before that (its
/// listener stopping: at the end of a drain, or at once) drops it, and the report is sent from
/// here with what it held so far and the error
/// [`CUT_AT_STOP`]. Made before the task first runs,
/// so that a connection cut before that is reported too. It costs a connection only the
/// report sender and a flag while it runs.
pub(crate) struct Pending<R: Report + Absorb<X>, X> {
    state: Option<(R, X)>,
    sender: ReportSender<R>,
    /// When the connection was accepted (the report's [`Durations::total`]).
    accepted: tokio::time::Instant,
}

impl<R: Report + Absorb<X>, X> Pending<R, X> {
    pub(crate) fn new(report: R, beside: X, sender: ReportSender<R>) -> Self {
        Pending {
            state: Some((report, beside)),
            sender,
            accepted: tokio::time::Instant::now(),
        }
    }

    /// When the connection was accepted, which its durations count from.
    pub(crate) fn accepted(&self) -> tokio::time::Instant {
        self.accepted
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
        report.absorb(&beside);
        report.durations_mut().total = self.accepted.elapsed();
        if cut {
            // Unwinding from a panic drops it too: say so rather than blame a stop.
            let why = if std::thread::panicking() {
                "the connection's task panicked".to_string()
            } else {
                report.mark_cut_at_stop();
                CUT_AT_STOP.to_string()
            };
            // An error the connection had already met stays first.
            let outcome = report.outcome_mut();
            match outcome {
                Ok(()) => *outcome = Err(why),
                Err(e) => {
                    e.push_str("; then ");
                    e.push_str(&why);
                }
            }
        }
        self.sender.log_and_send(report);
    }
}

impl<R: Report + Absorb<X>, X> Drop for Pending<R, X> {
    fn drop(&mut self) {
        // Still here: the task was aborted mid-connection.
        self.finish(true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Seen {
        outcome: Result<(), String>,
        bytes: u64,
        durations: Durations,
        cut: bool,
    }

    impl Report for Seen {
        const WHAT: &'static str = "test connection";
        fn id(&self) -> u64 {
            0
        }
        fn outcome(&self) -> &Result<(), String> {
            &self.outcome
        }
        fn outcome_mut(&mut self) -> &mut Result<(), String> {
            &mut self.outcome
        }
        fn middlebox_took_part(&self) -> bool {
            false
        }
        fn bytes(&self) -> (u64, u64) {
            (self.bytes, 0)
        }
        fn key_updates(&self) -> u64 {
            0
        }
        fn durations_mut(&mut self) -> &mut Durations {
            &mut self.durations
        }
        fn mark_cut_at_stop(&mut self) {
            self.cut = true;
        }
    }

    impl Absorb<u64> for Seen {
        fn absorb(&mut self, counted: &u64) {
            self.bytes = *counted;
        }
    }

    fn seen(outcome: Result<(), String>) -> Seen {
        Seen {
            outcome,
            bytes: 0,
            durations: Durations::default(),
            cut: false,
        }
    }

    /// A report's total duration runs from when its connection was accepted (the pending
    /// report's making) to when it is sent, or cut; on the service's clock (paused here).
    #[tokio::test(start_paused = true)]
    async fn a_report_lasts_from_the_accept_to_its_sending() {
        let (tx, mut rx) = report_queue::<Seen>();
        let ended = Pending::new(seen(Ok(())), 0u64, tx.clone());
        tokio::time::advance(Duration::from_millis(1500)).await;
        ended.send();
        let r = rx.recv().await.unwrap();
        assert_eq!(r.durations.total, Duration::from_millis(1500));
        let cut = Pending::new(seen(Ok(())), 0u64, tx);
        tokio::time::advance(Duration::from_secs(7)).await;
        drop(cut);
        let r = rx.recv().await.unwrap();
        assert_eq!(r.durations.total, Duration::from_secs(7));
    }

    /// Sent once, as it is when the connection ends; dropped unsent (an aborted task), sent as
    /// cut, with the counts kept beside it and an earlier error kept first.
    #[tokio::test]
    async fn a_pending_report_is_sent_once_and_a_dropped_one_as_cut() {
        let (tx, mut rx) = report_queue::<Seen>();
        let mut ended = Pending::new(seen(Ok(())), 0u64, tx.clone());
        if let Some((_, counted)) = ended.parts() {
            *counted = 7;
        }
        ended.send();
        let r = rx.recv().await.unwrap();
        assert_eq!((r.outcome, r.bytes, r.cut), (Ok(()), 7, false));

        let mut cut = Pending::new(seen(Ok(())), 0u64, tx.clone());
        if let Some((_, counted)) = cut.parts() {
            *counted = 3;
        }
        drop(cut);
        let r = rx.recv().await.unwrap();
        assert_eq!((r.bytes, r.cut), (3, true));
        assert!(r.outcome.unwrap_err().starts_with("cut: "));

        drop(Pending::new(seen(Err("alert".into())), 0u64, tx.clone()));
        let r = rx.recv().await.unwrap();
        assert!(r.outcome.unwrap_err().starts_with("alert; then cut: "));

        // Dropped by a panic's unwinding: said so, and not marked as cut by a stop (a user
        // trial's panicking app read "cut_at_stop": true).
        let panicking = Pending::new(seen(Ok(())), 0u64, tx);
        let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
            let _held = panicking;
            panic!("a bug");
        }));
        assert!(unwound.is_err());
        let r = rx.recv().await.unwrap();
        assert_eq!(
            (r.outcome, r.cut),
            (Err("the connection's task panicked".into()), false)
        );
        // Nothing else was sent: each was sent once.
        assert!(rx.recv().await.is_none());
    }

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
