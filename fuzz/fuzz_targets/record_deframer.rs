//! Deframe arbitrary bytes: must never panic, and splitting the input must not change the
//! records produced (the first byte chooses the split point).
#![no_main]

use libfuzzer_sys::fuzz_target;
use mbx_wire::{DeframerConfig, HandshakeDeframer, RecordReader};

fn drain(rr: &mut RecordReader, out: &mut Vec<Vec<u8>>) -> bool {
    loop {
        match rr.next_record() {
            Ok(Some(r)) => out.push(r.into_bytes()),
            Ok(None) => return true,
            Err(_) => return false,
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&split, rest)) = data.split_first() else {
        return;
    };
    let cfg = DeframerConfig::tls13().with_extra_type(mbx_wire::ContentType(30));

    let mut whole = RecordReader::new(cfg.clone());
    whole.push(rest);
    let mut a = Vec::new();
    let ok_a = drain(&mut whole, &mut a);

    let cut = usize::from(split) % (rest.len() + 1);
    let mut parts = RecordReader::new(cfg);
    let mut b = Vec::new();
    parts.push(&rest[..cut]);
    let mut ok_b = drain(&mut parts, &mut b);
    if ok_b {
        parts.push(&rest[cut..]);
        ok_b = drain(&mut parts, &mut b);
    }
    assert_eq!(ok_a, ok_b);
    assert_eq!(a, b);

    let mut hs = HandshakeDeframer::new(1 << 14);
    for rec in &a {
        hs.push(rec.get(5..).unwrap_or(&[]));
        while let Ok(Some(_)) = hs.next_message() {}
    }
});
