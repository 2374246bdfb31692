//! Pieces shared by the tokio drivers of every system (mbTLS, Keyless SSL, BlindBox). The
//! protocol cores stay sans-I/O in their own crates; this crate holds socket handling that each
//! listener would otherwise write again, and get wrong again: accepting without spinning on
//! errors ([`accept`]), a Prometheus scrape endpoint ([`metrics`]), what a socket still holds
//! for its peer before a reset drops it ([`send_queue`]) and a deadline that may not be set
//! ([`sleep_until_some`]).

pub mod accept;
pub mod metrics;
pub mod send_queue;

pub use accept::Acceptor;

/// Ready at `at`; never if `None`: a `select!` branch for a deadline that is not always set.
pub async fn sleep_until_some(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
