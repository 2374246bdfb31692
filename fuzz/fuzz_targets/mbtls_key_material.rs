//! Decode arbitrary bytes as mbTLS key material (TLS 1.2 paper layout and our TLS 1.3 layout);
//! whatever decodes must re-encode to exactly the input.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mbx_mbtls::wire::KeyMaterial;

fuzz_target!(|data: &[u8]| {
    if let Ok(km) = KeyMaterial::decode(data) {
        let enc = km.encode().expect("decoded key material re-encodes");
        assert_eq!(&enc[..], data);
    }
});
