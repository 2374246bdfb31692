//! TLS record protection and key schedules for mbx.
//!
//! mbTLS, maTLS, BlindBox and EndBox all need a record layer that runs under keys a TLS library
//! would not accept (per-hop keys, exported session keys). This crate is that record layer:
//! AEAD protection of TLS 1.2 (RFC 5288, RFC 7905) and TLS 1.3 (RFC 8446 §5) records, and the
//! TLS 1.2 PRF / TLS 1.3 HKDF-Expand-Label key derivations. It is sans-I/O: callers feed whole
//! records (see `mbx_wire::RecordReader`) and get plaintext back, or the reverse.
//!
//! The record AEAD is `aws-lc-rs`'s (faster AES-GCM than `ring`'s on VAES/AVX-512 CPUs); key
//! schedules and hashes are `ring`'s. Key material and plaintext we hold are zeroized on drop
//! (plaintext word-wise, see [`wipe`]); AWS-LC clears its expanded AEAD key when the key is
//! dropped (`OPENSSL_free` cleanses), while `ring`'s HKDF/HMAC state is outside our control.

// Network input must never panic the process: no unwrap/expect/panic outside tests.
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]
pub mod error;
pub mod keys;
pub mod protect;
pub mod suite;
pub mod tls12;
pub mod tls13;
pub mod wipe;

pub use error::RecordError;
pub use keys::TrafficKeys;
pub use mbx_wire::ContentType;
pub use protect::{Opened, OpenedInPlace, RecordOpener, RecordSealer};
pub use suite::{Aead, CipherSuite, HashAlg, TlsVersion};
pub use wipe::SecretBytes;
pub use zeroize::Zeroizing;
