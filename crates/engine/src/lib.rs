//! TLS handshake engines over memory buffers.
//!
//! mbx never implements a TLS handshake itself (architecture principle 2): it drives a real
//! library — OpenSSL 3 where the handshake must carry our own extensions (mbTLS, maTLS), rustls
//! elsewhere — and then, when a protocol needs it, takes the session over with its own record
//! layer (`mbx-record`). Both engines have the same sans-I/O shape, [`TlsEngine`]:
//!
//! 1. [`TlsEngine::feed`] ciphertext from the peer, [`TlsEngine::process`] it, send what
//!    [`TlsEngine::take_outgoing`] returns; repeat until `!is_handshaking()`.
//! 2. Exchange application data with [`TlsEngine::write_plaintext`] /
//!    [`TlsEngine::take_plaintext`], or
//! 3. [`TlsEngine::export_session`]: consume the engine and get exact keys and sequence numbers
//!    for both directions plus the bytes that were still in flight ([`Handoff`]).
//!
//! A TLS 1.3 OpenSSL server can also send 0.5-RTT data right after its Finished
//! ([`OpenSslEngine::enable_half_rtt`], [`TlsEngine::write_half_rtt`]); the exporter is available
//! from that point on, and those records count in the application epoch like any other.
//!
//! Engines only ever pass whole records to the library, so nothing is stranded inside it at
//! export time, and they count records per key epoch (OpenSSL: message callback; rustls: its
//! own extracted sequence numbers), so the sequence numbers are exact.
//!
//! All `unsafe` code lives in `openssl_engine::ffi` (custom extensions, message callback); the
//! rest of the crate is checked by `#![deny(unsafe_code)]`.

// Network input must never panic the process: no unwrap/expect/panic outside tests.
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]
#![deny(unsafe_code)]

mod chain_cache;
mod config;
mod error;
mod openssl_engine;
pub mod pem_file;
mod records;
mod rustls_engine;
mod session;
mod vouched_sessions;

pub use config::{
    suite_openssl_name, CustomExtension, ExtensionHandler, ExtensionResponse, Identity, Role,
    TlsConfig,
};
pub use error::{AlertDescription, CertificateProblem, EngineError};
pub use openssl_engine::{AfterExport, CachedSession, OpenSslContext, OpenSslEngine, TicketSink};
pub use rustls_engine::{RustlsClientContext, RustlsEngine};
pub use session::{DirectionState, ExportedSession, Handoff};
pub use vouched_sessions::SessionNote;

use mbx_record::TlsVersion;
use zeroize::Zeroizing;

/// The record plaintext cap both engines accept (512 to 16,384 bytes, OpenSSL's range), for
/// [`ClientContext::client_engine`] and `OpenSslEngine::set_max_send_fragment`.
pub(crate) fn max_plaintext_cap(len: usize) -> Result<u16, EngineError> {
    u16::try_from(len)
        .ok()
        .filter(|l| (512..=16384).contains(l))
        .ok_or_else(|| EngineError::Config(format!("record fragment limit {len} (512 to 16384)")))
}

/// Client configuration shared by many sessions, whichever engine runs them: where the engine
/// is a choice (an mbTLS endpoint's secondary sessions with its middleboxes), the caller holds
/// an `Arc<dyn ClientContext>`.
pub trait ClientContext: Send + Sync {
    /// A new client session. `server_name`: SNI and the name the certificate must be valid
    /// for; `None`: no SNI, and only the chain is verified (a middlebox found on the path,
    /// whose name nobody configured). `max_plaintext`: the most plaintext any record this
    /// session sends may carry, handshake messages included, which are then split over more
    /// records (`None`: TLS's 16,384; for records that must fit a smaller container, such as
    /// an mbTLS encapsulated record). Engines accept 512 to 16,384.
    fn client_engine(
        &self,
        server_name: Option<&str>,
        max_plaintext: Option<usize>,
    ) -> Result<Box<dyn TlsEngine + Send>, EngineError>;

    /// True when this context resumes sessions without waiting for
    /// [`TlsEngine::vouch_for_session`] (an OpenSSL client with
    /// [`TlsConfig::resume_sessions`]): unfit where the caller checks more than TLS before it
    /// trusts a server, such as an mbTLS endpoint's secondary sessions.
    fn resumes_unvouched(&self) -> bool {
        false
    }

    /// True when this context resumes the sessions its caller vouches for
    /// ([`TlsEngine::vouch_for_session`]) of connections made with a server name: a
    /// [`RustlsClientContext`] with [`TlsConfig::resume_sessions`].
    fn keeps_vouched_sessions(&self) -> bool {
        false
    }
}

/// A TLS endpoint driven over memory buffers. No I/O or threads inside; the clock is read
/// where the TLS library reads it (certificate validity, ticket ages) and to drop vouched
/// sessions past their time ([`TlsEngine::vouch_for_session`]).
pub trait TlsEngine {
    /// Our role.
    fn role(&self) -> Role;

    /// Appends ciphertext received from the peer. Nothing is processed until
    /// [`TlsEngine::process`].
    fn feed(&mut self, ciphertext: &[u8]);

    /// Advances the handshake and decrypts every complete record fed so far (unless paused after
    /// the handshake, see [`TlsConfig::pause_after_handshake`]). A fatal problem is returned as
    /// a typed error (peer alert, our alert plus library detail) and the engine stays failed.
    fn process(&mut self) -> Result<(), EngineError>;

    /// Takes the ciphertext to send to the peer (may be empty).
    fn take_outgoing(&mut self) -> Vec<u8>;

    /// True until the handshake completed.
    fn is_handshaking(&self) -> bool;

    /// Encrypts application data (handshake must be complete); the records appear in
    /// [`TlsEngine::take_outgoing`].
    fn write_plaintext(&mut self, data: &[u8]) -> Result<(), EngineError>;

    /// TLS 1.3 server only: encrypts 0.5-RTT application data, sent right after our Finished
    /// and before the client's Finished was received (RFC 8446 §4.4.4); the peer is not
    /// authenticated yet and has not confirmed the handshake. The records use the application
    /// epoch and count in the exported sequence numbers. Only possible while
    /// [`TlsEngine::can_write_half_rtt`]; `Unsupported` on engines that cannot do it (rustls
    /// here), `State` otherwise.
    fn write_half_rtt(&mut self, data: &[u8]) -> Result<(), EngineError> {
        let _ = data;
        Err(EngineError::Unsupported("0.5-RTT application data"))
    }

    /// True while [`TlsEngine::write_half_rtt`] can be used (OpenSSL server with
    /// `enable_half_rtt`, TLS 1.3, our Finished sent, the client's not yet processed). The
    /// exporter, version and suite are available then too.
    fn can_write_half_rtt(&self) -> bool {
        false
    }

    /// Takes the application data decrypted so far.
    fn take_plaintext(&mut self) -> Vec<u8>;

    /// True once the peer sent close_notify.
    fn peer_closed(&self) -> bool;

    /// Queues a close_notify alert.
    fn close(&mut self) -> Result<(), EngineError>;

    /// RFC 5705 / RFC 8446 §7.5 exporter. `context: None` and `Some(&[])` differ in TLS 1.2.
    fn export_keying_material(
        &self,
        label: &str,
        context: Option<&[u8]>,
        len: usize,
    ) -> Result<Zeroizing<Vec<u8>>, EngineError>;

    /// Negotiated version (after the handshake).
    fn version(&self) -> Option<TlsVersion>;

    /// Negotiated IANA cipher suite id (after the handshake).
    fn cipher_suite(&self) -> Option<u16>;

    /// Negotiated ALPN protocol.
    fn alpn(&self) -> Option<Vec<u8>>;

    /// The peer's certificate chain, leaf first, DER.
    fn peer_certificates(&self) -> Vec<Vec<u8>>;

    /// The payload of custom extension `ext_type` the peer sent, if it sent one. Errors with
    /// `Unsupported` on engines that cannot see extensions (rustls).
    fn received_extension(&self, ext_type: u16) -> Result<Option<Vec<u8>>, EngineError>;

    /// True once the handshake completed as a resumption (TLS 1.2 session ID or ticket,
    /// TLS 1.3 ticket) rather than a full handshake.
    fn session_resumed(&self) -> bool {
        false
    }

    /// Client whose context resumes only vouched sessions ([`RustlsClientContext`] with
    /// [`TlsConfig::resume_sessions`]): what this connection's server gave (TLS 1.2 session,
    /// TLS 1.3 tickets), and gives from now on, becomes resumable by later connections to the
    /// same name, carrying `note`, until `valid_until` (seconds since the Unix epoch,
    /// exclusive; later connections then make a full handshake). Without this call it is
    /// dropped with the engine. Other engines: nothing happens.
    fn vouch_for_session(&mut self, note: SessionNote, valid_until: u64) {
        let _ = (note, valid_until);
    }

    /// In a resumed session: the note the connection it resumed was vouched for with. `None`
    /// otherwise, and on engines that do not keep notes.
    fn resumed_note(&self) -> Option<SessionNote> {
        None
    }

    /// Consumes the engine and hands the session to our record layer. Only after the handshake;
    /// errors (never guesses) if keys or sequence numbers cannot be determined exactly.
    fn export_session(self) -> Result<Handoff, EngineError>
    where
        Self: Sized;

    /// Boxed form of [`TlsEngine::export_session`] for `dyn TlsEngine` users.
    fn export_session_boxed(self: Box<Self>) -> Result<Handoff, EngineError>;

    /// Client only, before anything was sent: starts the handshake and returns its first flight
    /// as the complete ClientHello handshake message (4-byte header included), removing the
    /// records that carried it from the outgoing buffer. Used for mbTLS's optimistic
    /// ClientHellos, which travel inside an extension of another hello; the peer's answer is then
    /// fed as ordinary records.
    fn take_client_hello(&mut self) -> Result<Vec<u8>, EngineError> {
        if self.role() != Role::Client {
            return Err(EngineError::State("only a client has a ClientHello"));
        }
        self.process()?;
        let out = self.take_outgoing();
        match records::first_handshake_message(&out, 1)? {
            Some((msg, used)) if used == out.len() => Ok(msg),
            Some(_) => Err(EngineError::State(
                "first flight holds more than the ClientHello",
            )),
            None => Err(EngineError::State(
                "no ClientHello produced (handshake already started?)",
            )),
        }
    }
}
