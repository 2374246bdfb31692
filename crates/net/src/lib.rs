//! Pieces shared by the tokio drivers of every system (mbTLS, Keyless SSL, BlindBox). The
//! protocol cores stay sans-I/O in their own crates; this crate holds socket handling that each
//! listener would otherwise write again, and get wrong again: accepting without spinning on
//! errors ([`accept`]), a Prometheus scrape endpoint ([`metrics`]) and what a socket still holds
//! for its peer before a reset drops it ([`send_queue`]).

pub mod accept;
pub mod metrics;
pub mod send_queue;

pub use accept::Acceptor;
