//! Many connections with custom extensions, exports and engines dropped mid-handshake. Run
//! under valgrind to check the FFI module frees everything:
//! `valgrind --leak-check=full --errors-for-leak-kinds=definite --error-exitcode=1 \
//!   target/debug/deps/leaks-* --test-threads=1`
//! (the normal test run just exercises the paths).

mod common;

use std::sync::Arc;

use common::{pump, pump_err, Pki};
use mbx_engine::{CustomExtension, ExtensionResponse, OpenSslContext, TlsEngine};
use mbx_record::TlsVersion;

#[test]
fn repeated_extension_handshakes() {
    let pki = Pki::new();
    for version in [TlsVersion::Tls12, TlsVersion::Tls13] {
        let mut cc = pki.client_config().only(version);
        cc.custom_extensions = vec![CustomExtension {
            ext_type: 0xFF5A,
            client_payload: Some(vec![0xAB; 1000]),
            handler: None,
        }];
        let mut sc = pki.server_config().only(version);
        let reply: mbx_engine::ExtensionHandler = Arc::new(|p: &[u8]| {
            if p.len() == 1 {
                ExtensionResponse::Reject(mbx_engine::AlertDescription::DECODE_ERROR)
            } else {
                ExtensionResponse::Reply(vec![0xCD; 500])
            }
        });
        sc.custom_extensions = vec![CustomExtension {
            ext_type: 0xFF5A,
            client_payload: None,
            handler: Some(reply),
        }];
        let cctx = OpenSslContext::new(&cc).unwrap();
        let sctx = OpenSslContext::new(&sc).unwrap();
        for i in 0..20 {
            let mut c = cctx.engine().unwrap();
            let mut s = sctx.engine().unwrap();
            match i % 4 {
                // Full handshake and export.
                0 => {
                    pump(&mut c, &mut s).unwrap();
                    assert_eq!(c.received_extension(0xFF5A).unwrap(), Some(vec![0xCD; 500]));
                    c.export_session().unwrap();
                    s.export_session().unwrap();
                }
                // Dropped after the first flight.
                1 => {
                    c.process().unwrap();
                    let hello = c.take_outgoing();
                    s.feed(&hello);
                    s.process().unwrap();
                }
                // Rejected by the handler.
                2 => {
                    c.set_extension_payload(0xFF5A, vec![1]).unwrap();
                    let (_, es) = pump_err(&mut c, &mut s);
                    assert!(es.is_some());
                }
                // Full handshake, engines dropped without export.
                _ => pump(&mut c, &mut s).unwrap(),
            }
        }
    }
}
