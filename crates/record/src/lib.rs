//! TLS record protection and key schedules for mbx.
//!
//! mbTLS, maTLS, BlindBox and EndBox all need a record layer that runs under keys a TLS library
//! would not accept (per-hop keys, exported session keys). This crate is that record layer:
//! AEAD protection of TLS 1.2 (RFC 5288, RFC 7905) and TLS 1.3 (RFC 8446 §5) records, and the
//! TLS 1.2 PRF / TLS 1.3 HKDF-Expand-Label key derivations. It is sans-I/O: callers feed whole
//! records (see `mbx_wire::RecordReader`) and get plaintext back, or the reverse.
//!
//! The record AEAD, the key schedules and the hashes are `aws-lc-rs`'s (faster AES-GCM than
//! `ring`'s on VAES/AVX-512 CPUs). Key material and plaintext we hold are zeroized on drop
//! (plaintext word-wise, see [`wipe`]); AWS-LC clears its expanded AEAD key when the key is
//! dropped (`OPENSSL_free` cleanses), and its HKDF and HMAC state too: an HKDF key's bytes are
//! zeroized with it, an HMAC context (whose inner and outer hash states would let anyone go on
//! computing HMACs under the secret) is cleansed by `HMAC_CTX_cleanup`. `ring`'s, used before
//! the twenty-fourth round, left both where they were, an equivalent of each traffic secret
//! after the secret itself was wiped (found in a review).

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
