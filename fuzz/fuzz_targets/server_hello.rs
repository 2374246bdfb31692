//! Parse arbitrary bytes as a ServerHello (body and full message) and run every accessor.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mbx_wire::ServerHello;

fuzz_target!(|data: &[u8]| {
    let parsed = [ServerHello::parse(data), ServerHello::parse_message(data)];
    for sh in parsed.into_iter().flatten() {
        let _ = sh.selected_version();
        let _ = sh.is_hello_retry_request();
        for e in &sh.extensions {
            assert_eq!(sh.extension(e.typ), Some(e.data));
        }
    }
});
