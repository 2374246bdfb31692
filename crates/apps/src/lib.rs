//! Middlebox functions for mbx: plug-ins over the decrypted byte stream of each direction.
//!
//! Architecture principle 7: a middlebox application sees the plaintext of one direction at a
//! time, in whatever pieces the record layer happened to deliver, and returns the bytes to
//! forward — unchanged, changed, fewer or more. It can also ask to close the session. The same
//! functions serve mbTLS, maTLS and EndBox, so nothing here knows about TLS: the protocol core
//! decrypts, calls [`MiddleboxApp`], and re-encrypts whatever the app produced for the next hop.
//!
//! - [`PassThrough`]: forwards everything unchanged (the baseline, and the relay benchmark).
//! - [`HttpHeaderInsert`]: the mbTLS paper's HTTP proxy, which adds one header to every
//!   HTTP/1.1 request, parsing requests incrementally across arbitrary chunk boundaries.
//! - [`Inspect`]: runs an [`Inspector`], an app that only looks (an IDS, a logger), written
//!   once for both of the relay's paths.
//! - [`CatchPanic`]: an app's panic ends its session with `internal_error` instead of
//!   unwinding through the connection's task.

// Network input must never panic the process: no unwrap/expect/panic outside tests.
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]
#![forbid(unsafe_code)]

pub mod app;
pub mod catch_panic;
pub mod http;
pub mod inspect;
pub mod passthrough;

pub use app::{CloseAlert, ConnectionInfo, Direction, MiddleboxApp, Verdict};
pub use catch_panic::{CatchPanic, APP_PANICKED};
pub use http::{HttpError, HttpHeaderInsert, HttpLimits, ResponseBody};
pub use inspect::{Inspect, Inspector};
pub use passthrough::PassThrough;
