//! The edge's HTTP/1.1 parsing from arbitrary bytes (request heads, response heads, chunked
//! bodies, cache rules): never panics; a chunked body decoded from a prefix is the body decoded
//! from the whole input.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mbx_keyless::edge::cache::{may_use_cache, storable_lifetime};
use mbx_keyless::edge::http::{
    decode_chunked, head_end, parse_request, parse_response, request_framing, response_framing,
};
use mbx_keyless::edge::sites::name_matches;

fuzz_target!(|data: &[u8]| {
    if let Ok(Some(end)) = head_end(data) {
        let head = &data[..end];
        let request = parse_request(head);
        let response = parse_response(head);
        if let Ok(r) = &request {
            let _ = request_framing(r);
            let _ = may_use_cache(r);
            if let Ok(s) = &response {
                let _ = storable_lifetime(r, s);
            }
        }
        if let Ok(s) = &response {
            let _ = response_framing("GET", s);
        }
    }
    if let Ok(Some((body, used))) = decode_chunked(data, 1 << 16) {
        assert!(used <= data.len());
        let again = decode_chunked(&data[..used], 1 << 16).unwrap().unwrap();
        assert_eq!(again, (body, used));
    }
    if let Ok(text) = std::str::from_utf8(data) {
        if let Some((a, b)) = text.split_once('\n') {
            let _ = name_matches(a, b);
        }
    }
});
