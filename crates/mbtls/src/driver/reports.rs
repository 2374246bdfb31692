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

/// The accept loop's end: cloned into every connection task.
pub(crate) struct ReportSender<T> {
    tx: mpsc::Sender<T>,
    dropped: Arc<AtomicU64>,
}

impl<T> Clone for ReportSender<T> {
    fn clone(&self) -> Self {
        ReportSender {
            tx: self.tx.clone(),
            dropped: self.dropped.clone(),
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

/// A connection's report: how it ended.
pub(crate) trait Report: core::fmt::Debug {
    /// `Err` with the reason when the connection did not end cleanly.
    fn outcome(&self) -> &Result<(), String>;
}

impl<T: Report> ReportSender<T> {
    /// Logs `report` (a warning when its connection failed; `what` names the connection) and
    /// queues it.
    pub(crate) fn log_and_send(&self, report: T, what: &'static str) {
        match report.outcome() {
            Ok(()) => tracing::info!(?report, "{what} ended"),
            Err(e) => tracing::warn!(?report, error = %e, "{what} failed"),
        }
        self.send(report);
    }
}

/// The owner's end.
pub(crate) struct ReportReceiver<T> {
    rx: mpsc::Receiver<T>,
    dropped: Arc<AtomicU64>,
}

impl<T> ReportReceiver<T> {
    pub(crate) async fn recv(&mut self) -> Option<T> {
        self.rx.recv().await
    }

    /// Reports dropped so far because [`REPORTS_KEPT`] waited unread.
    pub(crate) fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

pub(crate) fn report_queue<T>() -> (ReportSender<T>, ReportReceiver<T>) {
    let (tx, rx) = mpsc::channel(REPORTS_KEPT);
    let dropped = Arc::new(AtomicU64::new(0));
    (
        ReportSender {
            tx,
            dropped: dropped.clone(),
        },
        ReportReceiver { rx, dropped },
    )
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
