//! Parse arbitrary bytes as the MiddleboxSupport extension and as a secondary-session message
//! stream; a parsed extension must re-encode to exactly the input.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mbx_mbtls::wire::{MiddleboxSupport, SecondaryReader};

fuzz_target!(|data: &[u8]| {
    if let Ok(ext) = MiddleboxSupport::parse(data) {
        assert_eq!(ext.encode().expect("parsed extension re-encodes"), data);
    }
    let mut r = SecondaryReader::new();
    for piece in data.chunks(7) {
        r.push(piece);
        while let Ok(Some(_)) = r.next_message() {}
    }
});
