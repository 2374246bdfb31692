//! Arbitrary bytes into the mbTLS handshake cores (a server-side middlebox from either side, a
//! client-side middlebox from either side, an mbTLS server with a pre-configured middlebox or
//! discovering up to three, before or also after the ClientHello, an mbTLS client discovering
//! up to two after its first flight, each asked what it waits for after every read; the
//! endpoints' secondary sessions on OpenSSL or rustls), after a real ClientHello or instead of
//! one: nothing may panic; every error is typed.
#![no_main]

use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use mbx_apps::PassThrough;
use mbx_attest::Policy;
use mbx_engine::CustomExtension;
use mbx_engine::{Identity, OpenSslContext, RustlsClientContext, TlsConfig, TlsEngine};
use mbx_mbtls::handshake::{
    secondary_client_config, ClientHandshake, ClientHandshakeConfig, ClientMiddlebox,
    MiddleboxHandshake, MiddleboxHandshakeConfig, ServerHandshake, ServerHandshakeConfig,
    ServerMiddlebox, ServerSideMiddlebox,
};
use mbx_mbtls::Side;
use mbx_mbtls::MIDDLEBOX_SUPPORT_EXTENSION;
use mbx_testbed::pki::{LeafSpec, TestPki};

struct Setup {
    mbox: MiddleboxHandshakeConfig,
    server: ServerHandshakeConfig,
    /// The same server with rustls secondary sessions.
    server_rustls: ServerHandshakeConfig,
    /// A discovering client, with OpenSSL and with rustls secondary sessions.
    client: [ClientHandshakeConfig; 2],
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
        let (mb_id, _) = id(&LeafSpec::middlebox("mb.test"));
        let (server_id, _) = id(&LeafSpec::server("server.test"));
        let root = pki.root_pem().into_bytes();
        let mut primary = TlsConfig::server(server_id);
        primary.pause_after_handshake = true;
        let mut client = OpenSslContext::new(&TlsConfig::client("server.test", root.clone()))
            .expect("client ctx")
            .engine()
            .expect("client");
        client.process().expect("hello");
        // As deployed: the SHA-256 suites first and the verified-chain cache on.
        let mut secondary = secondary_client_config(root.clone());
        // The OpenSSL secondary client must not resume (check_secondary_context); the rustls
        // one below keeps the default.
        let rustls_secondary = secondary.clone();
        secondary.resume_sessions = 0;
        let server = ServerHandshakeConfig {
            primary: Arc::new(OpenSslContext::new(&primary).expect("server ctx")),
            secondary: Arc::new(OpenSslContext::new(&secondary).expect("sec ctx")),
            middlebox: ServerMiddlebox::Preconfigured("mb.test".into()),
            policy: Policy::default(),
            now_unix: 1_800_000_000,
            announcements_after_hello: false,
        };
        let mut client_primary = TlsConfig::client("server.test", root.clone());
        client_primary.custom_extensions = vec![CustomExtension::new(MIDDLEBOX_SUPPORT_EXTENSION)];
        client_primary.pause_after_handshake = true;
        let client_cfg = |secondary: Arc<dyn mbx_engine::ClientContext>| ClientHandshakeConfig {
            primary: Arc::new(OpenSslContext::new(&client_primary).expect("client primary")),
            server_name: "server.test".into(),
            secondary,
            middlebox: ClientMiddlebox::DiscoverUpTo(Arc::new(|_: &[Vec<u8>]| true), 2),
            policy: Policy::default(),
            now_unix: 1_800_000_000,
        };
        let clients = [
            client_cfg(Arc::new(OpenSslContext::new(&secondary).expect("sec ctx"))),
            client_cfg(Arc::new(
                RustlsClientContext::new(&rustls_secondary).expect("rustls ctx"),
            )),
        ];
        let server_rustls = ServerHandshakeConfig {
            secondary: Arc::new(RustlsClientContext::new(&rustls_secondary).expect("rustls ctx")),
            ..server.clone()
        };
        Setup {
            mbox: MiddleboxHandshakeConfig::new(&TlsConfig::server(mb_id), None)
                .expect("mb config"),
            server,
            server_rustls,
            client: clients,
            hello: client.take_outgoing(),
        }
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let s = setup();
    let side = if selector & 1 == 0 {
        Side::Client
    } else {
        Side::Server
    };
    let with_hello = selector & 2 != 0;
    if selector & 32 != 0 {
        let mut c = ClientHandshake::new(s.client[usize::from(selector & 16 != 0)].clone())
            .expect("client");
        let _ = c.take_outgoing();
        for chunk in rest.chunks(97) {
            let _ = c.receive(chunk);
            let _ = c.take_outgoing();
            let _ = c.waiting_for();
            // The client proxy's idle trim, likewise.
            if selector & 64 != 0 {
                c.release_idle_buffers();
            }
        }
        return;
    }
    match (selector >> 2) % 4 {
        0 => {
            let mut m = ServerSideMiddlebox::new(s.mbox.clone(), PassThrough, true).expect("mb");
            if with_hello {
                let _ = m.receive(Side::Client, &s.hello);
            }
            for chunk in rest.chunks(97) {
                // Lent, as the driver lends its read buffer, or copied.
                if selector & 128 != 0 {
                    let _ = m.receive_lending(side, &mut chunk.to_vec());
                } else {
                    let _ = m.receive(side, chunk);
                }
                let _ = m.waiting_for();
                // An idle trim between any two reads must lose nothing and never panic.
                if selector & 64 != 0 {
                    m.release_idle_buffers();
                }
            }
        }
        1 => {
            let mut m = MiddleboxHandshake::new(s.mbox.clone(), PassThrough).expect("mb");
            if with_hello {
                let _ = m.receive(Side::Client, &s.hello);
            }
            for chunk in rest.chunks(97) {
                if selector & 128 != 0 {
                    let _ = m.receive_lending(side, &mut chunk.to_vec());
                } else {
                    let _ = m.receive(side, chunk);
                }
                let _ = m.waiting_for();
                // An idle trim between any two reads must lose nothing and never panic.
                if selector & 64 != 0 {
                    m.release_idle_buffers();
                }
            }
        }
        n => {
            let mut cfg = if selector & 16 == 0 {
                s.server.clone()
            } else {
                s.server_rustls.clone()
            };
            if n == 3 {
                cfg.middlebox = ServerMiddlebox::DiscoverUpTo(Arc::new(|_: &[Vec<u8>]| true), 3);
                // Announcements after the ClientHello taken too (every engine exportable).
                cfg.announcements_after_hello = selector & 128 != 0;
            }
            let mut srv = ServerHandshake::new(cfg).expect("server");
            if with_hello {
                let _ = srv.receive(&s.hello);
            }
            for chunk in rest.chunks(97) {
                let _ = srv.receive(chunk);
                let _ = srv.waiting_for();
                // The server's idle trim, likewise.
                if selector & 64 != 0 {
                    srv.release_idle_buffers();
                }
            }
        }
    }
});
