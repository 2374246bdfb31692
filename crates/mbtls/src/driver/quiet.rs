//! Timers that fire after a quiet period on a connection: the idle trim, which gives memory
//! back after [`IDLE_TRIM_AFTER`] without a read, and the idle timeout, which closes a session
//! that carried nothing either way for its idle timeout ([`Limits`](super::Limits)).
//!
//! Both keep one timer per connection and move it only when it fires: activity merely notes
//! its time, so the bulk path does no timer work per read or write.

use std::pin::Pin;
use std::time::Duration;

use tokio::time::{Instant, Sleep};

/// A connection that has read nothing for this long gives back its read buffers and the chunks
/// its outboxes keep: a bulk transfer followed by silence on a connection left open would
/// otherwise hold up to about 1.5 MiB until the connection ends (short reads never come to
/// shrink them), and an idle keep-alive connection 32 KiB of empty read buffers.
pub(crate) const IDLE_TRIM_AFTER: Duration = Duration::from_secs(2);

/// Fires once nothing was noted for `period`.
struct QuietTimer {
    timer: Pin<Box<Sleep>>,
    last: Instant,
    period: Duration,
}

impl QuietTimer {
    fn new(period: Duration) -> QuietTimer {
        let now = Instant::now();
        QuietTimer {
            timer: Box::pin(tokio::time::sleep_until(now + period)),
            last: now,
            period,
        }
    }

    fn note(&mut self) {
        self.last = Instant::now();
    }

    /// Returns once nothing was noted for the period, and starts the next period then. Cancel
    /// safe.
    async fn quiet(&mut self) {
        loop {
            self.timer.as_mut().await;
            let (due, now) = (self.last + self.period, Instant::now());
            if now >= due {
                self.last = now;
                self.timer.as_mut().reset(now + self.period);
                return;
            }
            self.timer.as_mut().reset(due);
        }
    }
}

/// When a connection has read nothing for [`IDLE_TRIM_AFTER`].
pub(crate) struct IdleTrim {
    quiet: QuietTimer,
    /// The trim ran and nothing was read since.
    trimmed: bool,
}

impl IdleTrim {
    pub(crate) fn new() -> IdleTrim {
        IdleTrim {
            quiet: QuietTimer::new(IDLE_TRIM_AFTER),
            trimmed: false,
        }
    }

    /// Something was read: the trim is put off.
    pub(crate) fn read_now(&mut self) {
        self.quiet.note();
        self.trimmed = false;
    }

    /// No trim ran since the last read (or since the start): one is due after the next quiet
    /// period, whatever the buffers hold (the core's may have grown with the handshake).
    pub(crate) fn pending(&self) -> bool {
        !self.trimmed
    }

    /// Returns once nothing was read for [`IDLE_TRIM_AFTER`]; the caller then trims, and memory
    /// held again later (e.g. chunks back from writes) waits a full period. Cancel safe.
    pub(crate) async fn due(&mut self) {
        self.quiet.quiet().await;
        self.trimmed = true;
    }
}

/// Closes a session that carried nothing, either way, for its idle timeout (never without one).
pub(crate) struct IdleTimeout {
    quiet: Option<QuietTimer>,
}

impl IdleTimeout {
    pub(crate) fn new(idle: Option<Duration>) -> IdleTimeout {
        IdleTimeout {
            quiet: idle.map(QuietTimer::new),
        }
    }

    /// Bytes were read or written: the session is not idle.
    pub(crate) fn active_now(&mut self) {
        if let Some(q) = &mut self.quiet {
            q.note();
        }
    }

    /// Returns once the session was idle for the whole timeout; never without a timeout.
    /// Cancel safe.
    pub(crate) async fn expired(&mut self) {
        match &mut self.quiet {
            Some(q) => q.quiet().await,
            None => std::future::pending().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The trim comes after a quiet period, not while reads keep arriving (paused clock).
    #[tokio::test(start_paused = true)]
    async fn the_idle_trim_waits_for_a_quiet_period() {
        let mut idle = IdleTrim::new();
        let start = Instant::now();
        for _ in 0..5 {
            tokio::time::sleep(IDLE_TRIM_AFTER / 2).await;
            idle.read_now();
        }
        // The last read was 2.5 periods in; the trim comes one period after it, the next one a
        // period later (the paused clock moves only to timers, so the bounds are tight).
        let last_read = IDLE_TRIM_AFTER * 5 / 2;
        assert!(idle.pending());
        for periods in [1, 2] {
            idle.due().await;
            assert!(!idle.pending(), "trimmed, nothing read since");
            let at = Instant::now() - start;
            assert!(at >= last_read + IDLE_TRIM_AFTER * periods, "{at:?}");
            assert!(
                at < last_read + IDLE_TRIM_AFTER * periods + IDLE_TRIM_AFTER / 2,
                "{at:?}"
            );
        }
        idle.read_now();
        assert!(
            idle.pending(),
            "a read makes the next quiet period trim again"
        );
    }

    /// The idle timeout counts from the last activity, either way; without one it never fires
    /// (paused clock: the bounds are exact).
    #[tokio::test(start_paused = true)]
    async fn the_idle_timeout_counts_from_the_last_activity() {
        let period = Duration::from_secs(10);
        let mut idle = IdleTimeout::new(Some(period));
        let start = Instant::now();
        for _ in 0..4 {
            tokio::time::sleep(period * 3 / 4).await;
            idle.active_now();
        }
        idle.expired().await;
        assert_eq!(Instant::now() - start, period * 3 + period);
        let mut never = IdleTimeout::new(None);
        let waited = tokio::time::timeout(period * 100, never.expired()).await;
        assert!(waited.is_err(), "no timeout, no expiry");
    }
}
