//! Key-server messages from arbitrary bytes: the decoder, the stream deframer and the request
//! handler must never panic; a decoded message must re-encode to a message that decodes to the
//! same value; splitting the stream must not change the frames (the first byte picks the split).
#![no_main]

use libfuzzer_sys::fuzz_target;
use mbx_keyless::server::{Authorization, EdgeIdentity, KeyServerCore};
use mbx_keyless::wire::{decode, decode_body, encode, Deframer, Frame};
use mbx_keyless::KeyStore;

fn frames(chunks: &[&[u8]]) -> (Vec<Frame>, bool) {
    let mut d = Deframer::new(4096);
    let mut out = Vec::new();
    for c in chunks {
        d.push(c);
        loop {
            match d.next_frame() {
                Ok(Some(f)) => out.push(f),
                Ok(None) => break,
                Err(_) => return (out, false),
            }
        }
    }
    (out, true)
}

fuzz_target!(|data: &[u8]| {
    let Some((&split, rest)) = data.split_first() else {
        return;
    };
    if let Ok(body) = decode_body(rest) {
        let msg = mbx_keyless::Message {
            request_id: 1,
            body,
        };
        if let Ok(bytes) = encode(&msg) {
            assert_eq!(decode(&bytes, usize::from(u16::MAX)).ok(), Some(msg));
        }
    }
    let cut = usize::from(split) % (rest.len() + 1);
    let whole = frames(&[rest]);
    let parts = frames(&[&rest[..cut], &rest[cut..]]);
    assert_eq!(whole, parts);

    // No keys: exercises version, format, opcode and lookup paths without private-key work.
    let core = KeyServerCore::new(KeyStore::new(), Authorization::new()).with_max_body_len(4096);
    let edge = EdgeIdentity::new(["fuzz".to_string()]);
    let _ = core.handle(rest, &edge);
    for f in &whole.0 {
        let _ = core.handle_frame(f, &edge);
    }
});
