//! Arbitrary server→client bytes into a rustls client engine after its ClientHello, split
//! where the input says: whatever rustls makes of them, the engine's own look at the server's
//! flight (it reads the ServerHello random there, which rustls does not expose) never panics,
//! and an export then fails with a typed error.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use mbx_engine::{RustlsEngine, TlsConfig, TlsEngine};

fn config() -> &'static TlsConfig {
    static C: OnceLock<TlsConfig> = OnceLock::new();
    C.get_or_init(|| {
        let pki = mbx_testbed::pki::TestPki::new("rustls flight fuzz root").expect("CA");
        TlsConfig::client("server.fuzz.test", pki.root_pem().into_bytes())
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&split, flight)) = data.split_first() else {
        return;
    };
    let mut client = RustlsEngine::new(config()).expect("client");
    client.process().expect("ClientHello");
    let _ = client.take_outgoing();
    // Pieces of 1 to 256 bytes, each fed and processed on its own.
    for piece in flight.chunks(usize::from(split) + 1) {
        client.feed(piece);
        if client.process().is_err() {
            break;
        }
        let _ = client.take_outgoing();
    }
    assert!(client.export_session().is_err());
});
