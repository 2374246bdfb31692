//! Test bed shared by the integration tests and benchmarks of every system in `mbx`.
//!
//! * [`pki`]: throw-away certificate authorities and leaf certificates (servers, middleboxes,
//!   clients) in every key type the systems must support, as DER, PEM and files.
//! * [`relay`]: a userspace TCP relay that adds one-way latency (this kernel has no `tc netem`),
//!   with an optional tap that captures one hop's bytes and a flight counter for round trips.
//! * [`netns`]: network namespaces linked by veth pairs when running as root, and a [`netns::Topology`]
//!   that falls back to loopback when namespaces are unavailable.
//! * [`peers`]: find-or-install real peers (`openssl s_server`/`s_client`, `nginx`, `curl`,
//!   GnuTLS's `gnutls-serv`/`gnutls-cli`) and run them as child processes that are killed on
//!   drop.
//!
//! * [`wait`]: waiting in a test for a peer to close a socket or a process to print something.
//!
//! * [`starve`]: running the process out of file descriptors for a moment, to see what a
//!   listener does when `accept` fails.
//!
//! * [`c_heap`]: OpenSSL's and AWS-LC's allocations counted, for memory tests and benchmarks.
//!
//! * [`http_echo`]: a plain HTTP backend that answers each request with its head.
//!
//! * [`rustls_peer`]: rustls as a legacy TLS server (answering with the request's head) and
//!   client, in process.
//!
//! * [`bench`]: what the benchmark report programs share: CPU model and load average, per-thread
//!   CPU time from `/proc`, median/min/max statistics, named runtimes, the plot font.
//!
//! Nothing here is used in production code paths; it is a library so that every crate's tests and
//! the benchmarks share one implementation.

pub mod bench;
pub mod c_heap;
pub mod http_echo;
pub mod netns;
pub mod peers;
pub mod pki;
pub mod relay;
pub mod residue;
pub mod rustls_peer;
pub mod starve;
pub mod tcp_table;
pub mod wait;

pub use netns::{Host, Topology};
pub use peers::{
    ensure_tool, free_port, gnutls_cli, refusing_addr, Curl, GnutlsServer, InteractiveClient,
    Nginx, OpensslClient, OpensslServer, ServerMode, TlsVersion,
};
pub use pki::{IssuedCert, KeyType, LeafSpec, PkiFiles, Role, TestPki, Validity};
pub use relay::{DelayRelay, Direction, FlightCounter, Tap};
