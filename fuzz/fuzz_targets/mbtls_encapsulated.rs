//! Parse arbitrary bytes as an mbTLS encapsulated record (payload and whole outer record);
//! whatever parses must re-encode to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mbx_mbtls::wire::{Encapsulated, MAX_INNER_PAYLOAD_LEN};
use mbx_wire::Record;

fuzz_target!(|data: &[u8]| {
    if let Ok(e) = Encapsulated::parse(data) {
        assert!(e.inner.payload().len() <= MAX_INNER_PAYLOAD_LEN);
        let mut out = Vec::new();
        e.encode(0x0303, &mut out)
            .expect("a parsed record re-encodes");
        assert_eq!(&out[5..], data);
    }
    if let Ok(rec) = Record::from_bytes(data.to_vec()) {
        let _ = Encapsulated::from_record(&rec);
    }
});
