//! Parse arbitrary bytes as a ClientHello (body and full message) and run every accessor.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mbx_wire::ClientHello;

fuzz_target!(|data: &[u8]| {
    let parsed = [ClientHello::parse(data), ClientHello::parse_message(data)];
    for ch in parsed.into_iter().flatten() {
        let _ = ch.server_name();
        let _ = ch.supported_versions();
        let _ = ch.alpn_protocols();
        for e in &ch.extensions {
            assert_eq!(ch.extension(e.typ), Some(e.data));
        }
    }
});
