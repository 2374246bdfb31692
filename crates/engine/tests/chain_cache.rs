//! The rustls client's verified-chain cache (`TlsConfig::verified_chain_cache`) against live
//! handshakes: a remembered chain still has to come with the key it certifies.

mod common;

use std::sync::Arc;

use common::{Pki, HOST};
use mbx_engine::{EngineError, RustlsClientContext, TlsEngine};
use mbx_testbed::pki::LeafSpec;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

/// Presents one fixed chain and signs with one fixed key, matching or not (rustls checks
/// the match only in `with_single_cert`, so a resolver can play an impostor).
#[derive(Debug)]
struct Fixed(Arc<CertifiedKey>);

impl ResolvesServerCert for Fixed {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }
}

fn server(
    chain: Vec<rustls::pki_types::CertificateDer<'static>>,
    key: rustls::pki_types::PrivateKeyDer<'static>,
) -> rustls::ServerConnection {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let signer = provider.key_provider.load_private_key(key).unwrap();
    let cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(Fixed(Arc::new(CertifiedKey::new(chain, signer)))));
    rustls::ServerConnection::new(Arc::new(cfg)).unwrap()
}

/// Runs one handshake; the client's error, if any.
fn handshake(
    ctx: &RustlsClientContext,
    mut srv: rustls::ServerConnection,
) -> Result<(), EngineError> {
    let mut client = ctx.engine_for(Some(HOST))?;
    for _ in 0..16 {
        client.process()?;
        let out = client.take_outgoing();
        let mut rd = &out[..];
        while !rd.is_empty() {
            srv.read_tls(&mut rd).unwrap();
        }
        // The server's own verdict does not matter here: the client is under test.
        let _ = srv.process_new_packets();
        let mut back = Vec::new();
        while srv.wants_write() {
            srv.write_tls(&mut back).unwrap();
        }
        client.feed(&back);
        if out.is_empty() && back.is_empty() {
            break;
        }
    }
    client.process()?;
    if client.is_handshaking() {
        return Err(EngineError::Config("handshake did not finish".into()));
    }
    Ok(())
}

#[test]
fn a_remembered_chain_still_needs_its_key() {
    let pki = Pki::new();
    let other = pki.ca.issue(&LeafSpec::server(HOST)).unwrap();
    for cache in [0, 8] {
        let mut cfg = pki.client_config();
        cfg.verified_chain_cache = cache;
        let ctx = RustlsClientContext::new(&cfg).unwrap();
        // The honest server, twice: the second time its chain is remembered (with a cache).
        for _ in 0..2 {
            handshake(
                &ctx,
                server(pki.server.chain_der(), pki.server.private_key()),
            )
            .unwrap_or_else(|e| panic!("cache {cache}: honest server refused: {e}"));
        }
        // An impostor with the same chain and another key: the chain is remembered, the
        // handshake signature does not verify.
        let err = handshake(&ctx, server(pki.server.chain_der(), other.private_key()))
            .expect_err("an impostor with a remembered chain was accepted");
        assert!(
            err.to_string().to_lowercase().contains("signature")
                || err.to_string().contains("decrypt"),
            "cache {cache}: {err}"
        );
        // A chain from an untrusted CA is refused whatever was remembered before.
        let stranger = mbx_testbed::pki::TestPki::new("stranger CA").unwrap();
        let s = stranger.issue(&LeafSpec::server(HOST)).unwrap();
        assert!(handshake(&ctx, server(s.chain_der(), s.private_key())).is_err());
    }
}
