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

/// What a quiet period brought: the idle trim is due, or the session was idle for its whole
/// timeout.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Due {
    /// Nothing was read for [`IDLE_TRIM_AFTER`]: give memory back.
    Trim,
    /// Nothing was read or written for the session's idle timeout (given): close it.
    IdleTimeout(Duration),
}

/// A connection's two quiet-period timers: the idle trim, put off by reads, and the idle
/// timeout (if any), put off by reads and writes. A read notes the time once for both.
pub(crate) struct Activity {
    trim: QuietTimer,
    /// The trim ran and nothing was read since.
    trimmed: bool,
    timeout: Option<QuietTimer>,
}

impl Activity {
    pub(crate) fn new(idle_timeout: Option<Duration>) -> Activity {
        Activity {
            trim: QuietTimer::new(IDLE_TRIM_AFTER),
            trimmed: false,
            timeout: idle_timeout.map(QuietTimer::new),
        }
    }

    /// Bytes were read: both the trim and the idle timeout are put off.
    pub(crate) fn read_now(&mut self) {
        let now = Instant::now();
        self.trim.last = now;
        self.trimmed = false;
        if let Some(t) = &mut self.timeout {
            t.last = now;
        }
    }

    /// Bytes were written: the session is not idle (the trim waits for reads only).
    pub(crate) fn wrote_now(&mut self) {
        if let Some(t) = &mut self.timeout {
            t.note();
        }
    }

    /// No trim ran since the last read (or since the start): one is due after the next quiet
    /// period, whatever the buffers hold (the core's may have grown with the handshake).
    pub(crate) fn trim_pending(&self) -> bool {
        !self.trimmed
    }

    /// Whether there is an idle timeout to wait for.
    pub(crate) fn has_timeout(&self) -> bool {
        self.timeout.is_some()
    }

    /// The next of the two (the trim only when `trim` says the caller has memory to give
    /// back). After a trim, memory held again later (e.g. chunks back from writes) waits a
    /// full period. Cancel safe. With neither to wait for it never returns: guard the branch
    /// with `trim || has_timeout()`.
    pub(crate) async fn due(&mut self, trim: bool) -> Due {
        let Activity {
            trim: trim_timer,
            trimmed,
            timeout,
        } = self;
        let idle = async {
            match timeout {
                Some(t) => {
                    t.quiet().await;
                    t.period
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = trim_timer.quiet(), if trim => {
                *trimmed = true;
                Due::Trim
            }
            period = idle => Due::IdleTimeout(period),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The trim comes after a quiet period, not while reads keep arriving (paused clock).
    #[tokio::test(start_paused = true)]
    async fn the_idle_trim_waits_for_a_quiet_period() {
        let mut idle = Activity::new(None);
        let start = Instant::now();
        for _ in 0..5 {
            tokio::time::sleep(IDLE_TRIM_AFTER / 2).await;
            idle.read_now();
        }
        // The last read was 2.5 periods in; the trim comes one period after it, the next one a
        // period later (the paused clock moves only to timers, so the bounds are tight).
        let last_read = IDLE_TRIM_AFTER * 5 / 2;
        assert!(idle.trim_pending());
        for periods in [1, 2] {
            assert_eq!(idle.due(true).await, Due::Trim);
            assert!(!idle.trim_pending(), "trimmed, nothing read since");
            let at = Instant::now() - start;
            assert!(at >= last_read + IDLE_TRIM_AFTER * periods, "{at:?}");
            assert!(
                at < last_read + IDLE_TRIM_AFTER * periods + IDLE_TRIM_AFTER / 2,
                "{at:?}"
            );
        }
        idle.read_now();
        assert!(
            idle.trim_pending(),
            "a read makes the next quiet period trim again"
        );
    }

    /// The idle timeout counts from the last activity, either way; without one it never fires
    /// (paused clock: the bounds are exact).
    #[tokio::test(start_paused = true)]
    async fn the_idle_timeout_counts_from_the_last_activity() {
        let period = Duration::from_secs(10);
        let mut idle = Activity::new(Some(period));
        let start = Instant::now();
        for _ in 0..4 {
            tokio::time::sleep(period * 3 / 4).await;
            idle.wrote_now();
        }
        assert_eq!(idle.due(false).await, Due::IdleTimeout(period));
        assert_eq!(Instant::now() - start, period * 3 + period);
        let mut never = Activity::new(None);
        let waited = tokio::time::timeout(period * 100, never.due(false)).await;
        assert!(waited.is_err(), "no timeout, no expiry");
    }
}
