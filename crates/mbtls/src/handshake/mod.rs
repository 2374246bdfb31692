//! Handshake cores (sans-I/O), with any number of middleboxes per side.
//! - Client side: [`ClientHandshake`] with pre-configured or discovered (approved)
//!   [`MiddleboxHandshake`]s; the server may be legacy.
//! - Server side: [`ServerHandshake`] with pre-configured or discovered (approved)
//!   [`ServerSideMiddlebox`]es, which announce themselves; the client may be legacy.
//!
//! Both sides together give `client → M1 … → Mk → server` with the primary keys as the bridge
//! between the last client-side and the first server-side middlebox. The two middlebox cores
//! share their plumbing (`wires`). Design: `docs/mbtls.md` §4.

mod builder;
mod client;
mod demux;
mod endpoint_core;
mod kept;
mod middlebox;
mod pre_marker;
mod server;
mod server_side;
mod wires;

pub use builder::{ClientConfigBuilder, ServerConfigBuilder};
pub use client::{ClientHandshake, ClientHandshakeConfig, ClientMiddlebox};
pub use demux::{hello_records, Demux, Piece};
pub use endpoint_core::{
    Approver, ClientHandshakeEvent, HopFingerprint, ServerHandshakeEvent, SessionSummary,
    NOT_APPROVED,
};
pub use kept::{MAX_COPIED_BYTES, PAUSE_READING_AT};
pub use middlebox::{
    CertificateBinding, MiddleboxHandshake, MiddleboxHandshakeConfig, MiddleboxHandshakeEvent,
    MIDDLEBOX_TICKET_KEY_PERIOD,
};
pub use server::{ServerHandshake, ServerHandshakeConfig, ServerMiddlebox};
pub use server_side::{
    legacy_refusal, ServerSideMiddlebox, ANNOUNCEMENT_REFUSED, ANNOUNCEMENT_REFUSED_NOT_TLS,
};

use mbx_attest::AttestError;
use mbx_engine::{EngineError, TlsConfig};

/// Cipher suites for an endpoint's secondary sessions, in preference order: the SHA-256 suites
/// first. A secondary session only carries the middlebox's evidence and the hop keys, so its
/// handshake is most of its cost, and in that handshake the key schedule, the transcript hash
/// and the Finished MACs use the suite's hash: SHA-256 runs on the SHA extensions of current
/// x86 and ARM CPUs, SHA-384 does not (about 15 µs per secondary handshake at the middlebox and
/// 25 µs at the endpoint here, docs/mbtls.md §9). AES-128-GCM with an X25519 or P-256 key
/// exchange keeps the session at the 128-bit level its key exchange already sets. The
/// middlebox's OpenSSL follows the client's order.
pub const SECONDARY_CIPHER_SUITES: [u16; 9] = [
    0x1301, // TLS_AES_128_GCM_SHA256
    0x1303, // TLS_CHACHA20_POLY1305_SHA256
    0x1302, // TLS_AES_256_GCM_SHA384
    0xC02B, // ECDHE-ECDSA-AES128-GCM-SHA256
    0xC02F, // ECDHE-RSA-AES128-GCM-SHA256
    0xCCA9, // ECDHE-ECDSA-CHACHA20-POLY1305
    0xCCA8, // ECDHE-RSA-CHACHA20-POLY1305
    0xC02C, // ECDHE-ECDSA-AES256-GCM-SHA384
    0xC030, // ECDHE-RSA-AES256-GCM-SHA384
];

/// The configuration an mbTLS client's primary context starts from: a TLS client for
/// `server_name` under `roots_pem` that registers the MiddleboxSupport extension and pauses
/// after its handshake, as [`ClientHandshakeConfig::check`] requires (set `only`, resumption
/// and the rest on it as for any client). A session checks the server against
/// [`ClientHandshakeConfig::server_name`], whatever name the context was built with, so one
/// context serves several servers.
pub fn primary_client_config(server_name: &str, roots_pem: Vec<u8>) -> TlsConfig {
    let mut cfg = TlsConfig::client(server_name, roots_pem);
    cfg.cipher_suites = PRIMARY_CIPHER_SUITES.to_vec();
    cfg.custom_extensions = vec![mbx_engine::CustomExtension::new(
        crate::MIDDLEBOX_SUPPORT_EXTENSION,
    )];
    cfg.pause_after_handshake = true;
    cfg
}

/// The configuration an mbTLS server's primary context starts from: a TLS server with
/// `identity` that pauses after its handshake, as [`ServerHandshakeConfig::check`] requires.
pub fn primary_server_config(identity: mbx_engine::Identity) -> TlsConfig {
    let mut cfg = TlsConfig::server(identity);
    cfg.cipher_suites = PRIMARY_CIPHER_SUITES.to_vec();
    cfg.pause_after_handshake = true;
    cfg
}

/// The suites a primary session offers (client) and accepts (server): every forward-secret
/// AEAD suite the record layer carries, in OpenSSL's default order. The primary session's keys
/// go to middleboxes, whose record layer must take them: with OpenSSL's defaults a TLS 1.2
/// session could settle on a CBC suite, which worked end to end but failed the moment a
/// middlebox joined, after the handshake ("cipher suite 0xc023 is not supported by the mbx
/// record layer", found in a GnuTLS trial). A peer that has only others now fails the
/// handshake itself, with `handshake_failure`. Left out: CBC suites, and the RSA key exchange,
/// which the record layer carries but which has no forward secrecy (whoever later holds the
/// server's private key opens every recorded session).
pub const PRIMARY_CIPHER_SUITES: [u16; 12] = [
    0x1302, // TLS_AES_256_GCM_SHA384
    0x1303, // TLS_CHACHA20_POLY1305_SHA256
    0x1301, // TLS_AES_128_GCM_SHA256
    0xC02C, // ECDHE-ECDSA-AES256-GCM-SHA384
    0xC030, // ECDHE-RSA-AES256-GCM-SHA384
    0x009F, // DHE-RSA-AES256-GCM-SHA384
    0xCCA9, // ECDHE-ECDSA-CHACHA20-POLY1305
    0xCCA8, // ECDHE-RSA-CHACHA20-POLY1305
    0xCCAA, // DHE-RSA-CHACHA20-POLY1305
    0xC02B, // ECDHE-ECDSA-AES128-GCM-SHA256
    0xC02F, // ECDHE-RSA-AES128-GCM-SHA256
    0x009E, // DHE-RSA-AES128-GCM-SHA256
];

/// The configuration an endpoint's secondary-session context starts from: a TLS client for
/// middlebox certificates issued under `roots_pem`, offering [`SECONDARY_CIPHER_SUITES`], and
/// remembering up to [`SECONDARY_VERIFIED_CHAINS`] middlebox chains that verified and resuming
/// the sessions of up to [`SECONDARY_RESUMED_NAMES`] middleboxes (rustls engine; an OpenSSL
/// context must be built with `resume_sessions = 0`, see `check_secondary_context`). It names
/// no server: each session checks its middlebox against the name it expects of it (the
/// pre-configured name, or for a discovered one what its approver accepts), which the
/// endpoint gives [`mbx_engine::ClientContext::client_engine`].
pub fn secondary_client_config(roots_pem: Vec<u8>) -> TlsConfig {
    // The configured name is never used: `client_engine` is always given the session's.
    let mut cfg = TlsConfig::client("middlebox", roots_pem);
    cfg.cipher_suites = SECONDARY_CIPHER_SUITES.to_vec();
    cfg.verified_chain_cache = SECONDARY_VERIFIED_CHAINS;
    cfg.resume_sessions = SECONDARY_RESUMED_NAMES;
    cfg
}

/// How many pre-configured middleboxes' sessions a secondary-session context keeps for
/// resumption (paper §3.5; docs/mbtls.md §4.6). A resumed secondary session skips the
/// middlebox's certificate, its CertificateVerify and its evidence: the endpoint keeps a
/// middlebox's ticket only after checking the evidence of the session it came in, with the
/// claims, and checks those claims against its policy again on each resumption. Discovered
/// middleboxes, whose names nobody configured, are never resumed.
pub const SECONDARY_RESUMED_NAMES: usize = 64;

/// Refuses a secondary-session context that would resume sessions the endpoint has not
/// vouched for (an OpenSSL client context with `resume_sessions`): a middlebox whose evidence
/// failed could otherwise skip the check next time.
pub(crate) fn check_secondary_context(
    ctx: &dyn mbx_engine::ClientContext,
) -> Result<(), HandshakeError> {
    if ctx.resumes_unvouched() {
        return Err(HandshakeError::Config(
            "the secondary context resumes sessions it was not told to keep (use a \
             RustlsClientContext, or an OpenSSL context with resume_sessions = 0)",
        ));
    }
    Ok(())
}

/// How many middlebox chains a secondary-session context remembers once they verified
/// (`TlsConfig::verified_chain_cache`). An endpoint meets the same few middleboxes on every
/// connection; checking the chain's signatures again each time is one signature check per
/// certificate (≈ 55 µs with ECDSA P-256 here) for an answer that cannot change inside the
/// chain's validity window. The middlebox's CertificateVerify and its evidence, which bind
/// this session, are checked every time.
pub const SECONDARY_VERIFIED_CHAINS: usize = 64;

/// Why a handshake core stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HandshakeError {
    #[error(transparent)]
    Mbtls(#[from] crate::MbtlsError),
    #[error("TLS engine: {0}")]
    Engine(#[from] EngineError),
    #[error("attestation: {0}")]
    Attestation(#[from] AttestError),
    #[error("protocol violation: {0}")]
    Protocol(&'static str),
    #[error("configuration: {0}")]
    Config(&'static str),
    /// A pre-configured middlebox had not spoken when the primary handshake ended: it is not
    /// on the path, or it serves the other side (named in a [`Middlebox`](Self::Middlebox)
    /// error when its name is known). `joined` of the `configured` middleboxes spoke (a name
    /// may be configured twice, for two middleboxes with certificates for it).
    #[error(
        "a pre-configured middlebox did not join ({joined} of the {configured} configured on \
         this side did): it is not on the path, or it serves the other side (a client-side \
         middlebox answers the client's hello, a server-side one announces itself to the \
         server)"
    )]
    NotJoined { joined: usize, configured: usize },
    /// More middleboxes announced themselves to a server than it lets join (`allowed`: its
    /// configured names, or `max_discovered`); the others got no secondary session.
    #[error(
        "more middleboxes announced themselves than this server lets join ({allowed}: its \
         configured middlebox names, or max_discovered / --max-discovered when it discovers \
         them; set it to the number of middleboxes on the server's side of the path)"
    )]
    TooManyMiddleboxes { allowed: usize },
    /// A resumed secondary session relies on an earlier check that no longer holds.
    #[error("resumed secondary session: {0}")]
    Resumed(&'static str),
    /// An error about one middlebox, named (configured, or read from its verified
    /// certificate): a failed check of a pre-configured one, or a malformed or unexpected
    /// secondary message from any ([`cause`](Self::cause) says what failed). (The cause is part of the message, not a `source()`, which error
    /// chains printed whole would repeat.)
    #[error("middlebox {name}: {inner}")]
    Middlebox {
        name: String,
        inner: Box<HandshakeError>,
    },
    /// A pre-configured middlebox presented a certificate for another name: most often the
    /// configured path is wrong, since each middlebox is checked against the name at its
    /// place (found in an embedder's trial: a path missing a middlebox read as a bad
    /// certificate of one that was fine).
    #[error(
        "{0}; each pre-configured middlebox is checked against the name at its place in the \
         path (in order from the client): check its certificate, and that the path names every \
         middlebox on this side, in order"
    )]
    NotTheNameAtItsPlace(Box<HandshakeError>),
    /// A middlebox's chain reaches none of this endpoint's middlebox roots (the builders'
    /// `middlebox_roots`; a client's default is its server roots): which roots is said with the
    /// engine's error (an embedder's trial read only rustls's "UnknownIssuer").
    #[error(
        "{0}; a middlebox's chain is checked against this endpoint's middlebox roots, and none \
         of them issued it"
    )]
    UntrustedMiddleboxIssuer(Box<HandshakeError>),
    /// A middlebox that fails closed ([`MiddleboxHandshakeConfig::fail_closed`]) could not
    /// take part in the session, and why: the session ends, nothing of it passed.
    #[error("this middlebox does not take part ({0}) and fails closed: the session is cut")]
    FailClosed(&'static str),
}

impl HandshakeError {
    /// `err` about one middlebox, named when its name is known.
    pub(crate) fn named(name: Option<String>, err: HandshakeError) -> HandshakeError {
        match name {
            Some(name) => HandshakeError::Middlebox {
                name,
                inner: Box::new(err),
            },
            None => err,
        }
    }

    /// The error itself, without the middlebox it concerned.
    pub fn cause(&self) -> &HandshakeError {
        match self {
            HandshakeError::Middlebox { inner, .. } => inner.cause(),
            HandshakeError::NotTheNameAtItsPlace(inner)
            | HandshakeError::UntrustedMiddleboxIssuer(inner) => inner.cause(),
            other => other,
        }
    }

    /// What the TLS engine found wrong with a peer's certificate, when that is the
    /// [`cause`](Self::cause).
    pub fn certificate_problem(&self) -> Option<mbx_engine::CertificateProblem> {
        match self.cause() {
            HandshakeError::Engine(e) => e.certificate_problem(),
            _ => None,
        }
    }
}

impl From<mbx_wire::WireError> for HandshakeError {
    fn from(e: mbx_wire::WireError) -> Self {
        HandshakeError::Mbtls(e.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mbx_engine::{ClientContext, Identity, OpenSslContext, RustlsClientContext, TlsEngine};
    use mbx_record::TlsVersion;
    use mbx_testbed::pki::{LeafSpec, TestPki};

    /// A primary ClientHello offers only suites the record layer carries (and OpenSSL's
    /// renegotiation SCSV), every one of [`PRIMARY_CIPHER_SUITES`], TLS 1.2 and 1.3 alike.
    #[test]
    fn the_primary_session_offers_only_suites_the_record_layer_carries() {
        let pki = TestPki::new("primary suites CA").unwrap();
        for &id in &PRIMARY_CIPHER_SUITES {
            assert!(mbx_record::CipherSuite::from_id(id).is_some(), "{id:#06x}");
        }
        for version in [None, Some(TlsVersion::Tls12), Some(TlsVersion::Tls13)] {
            let mut cfg = primary_client_config("server.test", pki.root_pem().into_bytes());
            cfg.custom_extensions.clear();
            if let Some(v) = version {
                cfg = cfg.only(v);
            }
            let mut c = OpenSslContext::new(&cfg).unwrap().engine().unwrap();
            c.process().unwrap();
            let out = c.take_outgoing();
            // One handshake record: 5 bytes of record header, then the ClientHello.
            let hello = mbx_wire::hello::ClientHello::parse_message(&out[5..]).unwrap();
            let offered: Vec<u16> = hello
                .cipher_suites
                .iter()
                .copied()
                .filter(|&id| id != 0x00FF)
                .collect();
            let expected: Vec<u16> = PRIMARY_CIPHER_SUITES
                .iter()
                .copied()
                .filter(|&id| match version {
                    Some(TlsVersion::Tls12) => id >> 8 != 0x13,
                    Some(TlsVersion::Tls13) => id >> 8 == 0x13,
                    None => true,
                })
                .collect();
            assert_eq!(offered, expected, "{version:?}");
        }
    }

    /// Both engines accept the secondary suites, and a middlebox's OpenSSL server with its
    /// default suites negotiates the first one of the version (the SHA-256 suite).
    #[test]
    fn secondary_sessions_negotiate_the_sha256_suite() {
        let pki = TestPki::new("secondary suites CA").unwrap();
        let mb = pki.issue(&LeafSpec::middlebox("mb.test")).unwrap();
        let identity = Identity::from_pem(mb.chain_pem(), mb.key_pem().as_bytes());
        for (version, expected) in [(TlsVersion::Tls13, 0x1301), (TlsVersion::Tls12, 0xC02B)] {
            let cfg = secondary_client_config(pki.root_pem().into_bytes()).only(version);
            let contexts: [Box<dyn ClientContext>; 2] = [
                Box::new(RustlsClientContext::new(&cfg).unwrap()),
                Box::new(OpenSslContext::new(&cfg).unwrap()),
            ];
            for ctx in contexts {
                let mut c = ctx.client_engine(Some("mb.test"), None).unwrap();
                let server = TlsConfig::server(identity.clone()).only(version);
                let mut s = OpenSslContext::new(&server).unwrap().engine().unwrap();
                for _ in 0..8 {
                    c.process().unwrap();
                    s.feed(&c.take_outgoing());
                    s.process().unwrap();
                    c.feed(&s.take_outgoing());
                }
                assert!(!c.is_handshaking() && !s.is_handshaking(), "{version:?}");
                assert_eq!(s.cipher_suite(), Some(expected), "{version:?}");
            }
        }
    }
}
