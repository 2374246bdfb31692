//! Pieces shared by the tokio drivers of every system (mbTLS, Keyless SSL, BlindBox). The
//! protocol cores stay sans-I/O in their own crates; this crate holds socket handling that each
//! listener would otherwise write again, and get wrong again: accepting without spinning on
//! errors ([`accept`]) and a Prometheus scrape endpoint ([`metrics`]).

pub mod accept;
pub mod metrics;

pub use accept::Acceptor;
