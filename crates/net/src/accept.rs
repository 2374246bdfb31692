//! A listener that pauses after a failed `accept` instead of retrying at once.
//!
//! `accept` fails while the process is out of file descriptors (EMFILE, ENFILE) or memory, and
//! keeps failing until a descriptor is freed: the pending connection stays in the listen queue.
//! Retrying at once would spin on the same error, burn a core and write a warning per try while
//! nothing changes. So after an error the listener waits, 5 ms at first and twice as long after
//! each further error, up to 1 s (the schedule Go's `net/http` server uses), or until the owner
//! says one of its connections ended and so freed a descriptor, whichever comes first.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

/// The first pause after an accept error.
const FIRST_PAUSE: Duration = Duration::from_millis(5);
/// The longest pause between two tries.
const MAX_PAUSE: Duration = Duration::from_secs(1);

/// Pauses after consecutive accept errors: doubling from [`FIRST_PAUSE`] to [`MAX_PAUSE`].
#[derive(Debug)]
struct Backoff {
    next: Duration,
}

impl Backoff {
    fn new() -> Backoff {
        Backoff { next: FIRST_PAUSE }
    }

    /// The pause after one more error in a row.
    fn after_error(&mut self) -> Duration {
        let pause = self.next;
        self.next = (self.next * 2).min(MAX_PAUSE);
        pause
    }

    /// An accept worked: the next error starts the schedule again.
    fn reset(&mut self) {
        self.next = FIRST_PAUSE;
    }
}

/// A listener whose [`Acceptor::accept`] pauses after errors instead of retrying at once.
#[derive(Debug)]
pub struct Acceptor {
    listener: TcpListener,
    errors: Arc<AtomicU64>,
    backoff: Backoff,
    paused_until: Option<Instant>,
}

impl Acceptor {
    /// Accepts from `listener`, already bound and listening.
    pub fn new(listener: TcpListener) -> Acceptor {
        Acceptor::counting_errors_in(listener, Arc::default())
    }

    /// As [`new`](Self::new), counting failed accepts in `errors` (e.g. a service's metrics,
    /// shared by several listeners).
    pub fn counting_errors_in(listener: TcpListener, errors: Arc<AtomicU64>) -> Acceptor {
        Acceptor {
            listener,
            errors,
            backoff: Backoff::new(),
            paused_until: None,
        }
    }

    /// The address the listener is bound to.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// The count of failed accepts, shared with the listener's owner.
    pub fn error_count(&self) -> Arc<AtomicU64> {
        self.errors.clone()
    }

    /// The next connection; errors are logged, counted and followed by a pause. Cancel safe (a
    /// `select!` branch): a pause being waited out is kept for the next call. The peer's
    /// address is given as the client would say it: an IPv4 client of a dual-stack (`[::]`)
    /// listener as IPv4, not IPv4-mapped IPv6.
    pub async fn accept(&mut self) -> (TcpStream, SocketAddr) {
        loop {
            if let Some(until) = self.paused_until {
                tokio::time::sleep_until(until).await;
                self.paused_until = None;
            }
            match self.listener.accept().await {
                Ok((stream, peer)) => {
                    self.backoff.reset();
                    return (
                        stream,
                        SocketAddr::new(peer.ip().to_canonical(), peer.port()),
                    );
                }
                Err(e) => {
                    self.errors.fetch_add(1, Ordering::Relaxed);
                    let pause = self.backoff.after_error();
                    tracing::warn!(error = %e, ?pause, "accept failed; trying again after a pause");
                    self.paused_until = Some(Instant::now() + pause);
                }
            }
        }
    }

    /// One of the owner's connections ended, so a descriptor is free: stop pausing. (Owners that
    /// do not track their connections leave it; a pause lasts at most a second.)
    pub fn connection_ended(&mut self) {
        self.paused_until = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_double_up_to_a_second_and_start_again_after_a_success() {
        let mut b = Backoff::new();
        let ms: Vec<u128> = (0..10).map(|_| b.after_error().as_millis()).collect();
        assert_eq!(ms, [5, 10, 20, 40, 80, 160, 320, 640, 1000, 1000]);
        b.reset();
        assert_eq!(b.after_error(), FIRST_PAUSE);
    }

    #[tokio::test]
    async fn an_ipv4_client_of_a_dual_stack_listener_has_an_ipv4_address() {
        // Where IPv6 is off, there is no dual-stack listener to test.
        let Ok(listener) = TcpListener::bind("[::]:0").await else {
            eprintln!("SKIPPED: no IPv6 here, so no dual-stack listener");
            return;
        };
        let port = listener.local_addr().unwrap().port();
        let mut acceptor = Acceptor::new(listener);
        let client = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let (_stream, peer) = acceptor.accept().await;
        assert_eq!(peer, client.local_addr().unwrap());
    }
}
