//! Arbitrary bytes into the mbTLS handshake cores (a server-side middlebox from either side, a
//! client-side middlebox from either side, an mbTLS server with a pre-configured middlebox or
//! discovering up to three), after a real ClientHello or instead of one: nothing may panic;
//! every error is typed.
#![no_main]

use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use mbx_apps::PassThrough;
use mbx_attest::Policy;
use mbx_engine::{Identity, OpenSslContext, TlsConfig, TlsEngine};
use mbx_mbtls::handshake::{
    MiddleboxHandshake, MiddleboxHandshakeConfig, ServerHandshake, ServerHandshakeConfig,
    ServerMiddlebox, ServerSideMiddlebox,
};
use mbx_mbtls::Side;
use mbx_testbed::pki::{LeafSpec, TestPki};

struct Setup {
    mbox: MiddleboxHandshakeConfig,
    server: ServerHandshakeConfig,
    hello: Vec<u8>,
}

fn setup() -> &'static Setup {
    static S: OnceLock<Setup> = OnceLock::new();
    S.get_or_init(|| {
        let pki = TestPki::new("fuzz root").expect("pki");
        let id = |spec: &LeafSpec| {
            let leaf = pki.issue(spec).expect("leaf");
            (
                Identity {
                    cert_chain_pem: leaf.chain_pem().into_bytes(),
                    key_pem: leaf.key_pem().as_bytes().to_vec().into(),
                },
                leaf.cert_der().to_vec(),
            )
        };
        let (mb_id, mb_der) = id(&LeafSpec::middlebox("mb.test"));
        let (server_id, _) = id(&LeafSpec::server("server.test"));
        let root = pki.root_pem().into_bytes();
        let mut primary = TlsConfig::server(server_id);
        primary.pause_after_handshake = true;
        let mut client = OpenSslContext::new(&TlsConfig::client("server.test", root.clone()))
            .expect("client ctx")
            .engine()
            .expect("client");
        client.process().expect("hello");
        Setup {
            mbox: MiddleboxHandshakeConfig {
                tls: Arc::new(OpenSslContext::new(&TlsConfig::server(mb_id)).expect("mb ctx")),
                certificate_der: mb_der,
                attester: None,
            },
            server: ServerHandshakeConfig {
                primary: Arc::new(OpenSslContext::new(&primary).expect("server ctx")),
                secondary: Arc::new(
                    OpenSslContext::new(&TlsConfig::client("mb.test", root)).expect("sec ctx"),
                ),
                middlebox: ServerMiddlebox::Preconfigured("mb.test".into()),
                policy: Policy::default(),
                now_unix: 1_800_000_000,
            },
            hello: client.take_outgoing(),
        }
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let s = setup();
    let side = if selector & 1 == 0 { Side::Client } else { Side::Server };
    let with_hello = selector & 2 != 0;
    match (selector >> 2) % 4 {
        0 => {
            let mut m = ServerSideMiddlebox::new(s.mbox.clone(), PassThrough, true).expect("mb");
            if with_hello {
                let _ = m.receive(Side::Client, &s.hello);
            }
            for chunk in rest.chunks(97) {
                let _ = m.receive(side, chunk);
            }
        }
        1 => {
            let mut m = MiddleboxHandshake::new(s.mbox.clone(), PassThrough).expect("mb");
            if with_hello {
                let _ = m.receive(Side::Client, &s.hello);
            }
            for chunk in rest.chunks(97) {
                let _ = m.receive(side, chunk);
            }
        }
        n => {
            let mut cfg = s.server.clone();
            if n == 3 {
                cfg.middlebox = ServerMiddlebox::DiscoverUpTo(Arc::new(|_: &[Vec<u8>]| true), 3);
            }
            let mut srv = ServerHandshake::new(cfg).expect("server");
            if with_hello {
                let _ = srv.receive(&s.hello);
            }
            for chunk in rest.chunks(97) {
                let _ = srv.receive(chunk);
            }
        }
    }
});
