//! An exported TLS 1.3 client's ticket sink fed arbitrary post-handshake messages, as a
//! server (or a middlebox on the client's side) could send them after the export: it never
//! panics, and whatever OpenSSL makes of them, a later connection still completes (resumed or
//! not).
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use mbx_engine::{Identity, OpenSslContext, OpenSslEngine, TlsConfig, TlsEngine};
use mbx_record::TlsVersion;
use mbx_testbed::pki::{LeafSpec, TestPki};

const HOST: &str = "server.fuzz.test";

struct Contexts {
    client: OpenSslContext,
    server: OpenSslContext,
}

fn contexts() -> &'static Contexts {
    static C: OnceLock<Contexts> = OnceLock::new();
    C.get_or_init(|| {
        let pki = TestPki::new("ticket sink fuzz root").expect("CA");
        let leaf = pki.issue(&LeafSpec::server(HOST)).expect("server cert");
        let id = Identity::from_pem(leaf.chain_pem(), leaf.key_pem().as_bytes());
        let mut client =
            TlsConfig::client(HOST, pki.root_pem().into_bytes()).only(TlsVersion::Tls13);
        client.resume_sessions = 1;
        client.pause_after_handshake = true;
        let server = TlsConfig::server(id).only(TlsVersion::Tls13);
        Contexts {
            client: OpenSslContext::new(&client).expect("client context"),
            server: OpenSslContext::new(&server).expect("server context"),
        }
    })
}

/// Runs a handshake until the client completed it (paused, not yet exported).
fn handshake(c: &Contexts) -> (OpenSslEngine, OpenSslEngine) {
    let mut client = c.client.engine().expect("client");
    let mut server = c.server.engine().expect("server");
    for _ in 0..8 {
        client.process().expect("client handshake");
        server.feed(&client.take_outgoing());
        server.process().expect("server handshake");
        client.feed(&server.take_outgoing());
        if !client.is_handshaking() {
            break;
        }
    }
    client.process().expect("client handshake");
    assert!(!client.is_handshaking());
    (client, server)
}

fuzz_target!(|data: &[u8]| {
    let c = contexts();
    let (client, _server) = handshake(c);
    let (_handoff, after) = client.export_for_resumption().expect("export");
    let mut sink = after.tickets.expect("a resuming TLS 1.3 client has a sink");
    // Pieces separated by 0xff: a first byte 0 makes the rest a NewSessionTicket body (header
    // added), any other first byte passes the rest as it is.
    for piece in data.split(|b| *b == 0xff).take(16) {
        let Some((&how, body)) = piece.split_first() else {
            continue;
        };
        let message = if how == 0 {
            let len = u32::try_from(body.len()).unwrap_or(u32::MAX).to_be_bytes();
            [&[4u8, len[1], len[2], len[3]][..], body].concat()
        } else {
            body.to_vec()
        };
        if sink.take(&message).is_err() {
            break;
        }
    }
    drop(sink);
    // Whatever was stored, the next connection completes.
    let (mut client, mut server) = handshake(c);
    client.resume_after_pause();
    server.feed(&client.take_outgoing());
    server.process().expect("server finishes");
});
