//! Arbitrary bytes as the BlindBox hop wire: the demultiplexer from any split, control
//! messages, and a middlebox fed from both sides must never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mbx_blindbox_net::control::Control;
use mbx_blindbox_net::middlebox::{Middlebox, Peer};
use mbx_blindbox_net::mux::Demux;

fuzz_target!(|data: &[u8]| {
    let split = data.first().map_or(1, |b| usize::from(*b).max(1));
    let mut d = Demux::new();
    for piece in data.chunks(split) {
        d.push(piece);
        while let Ok(Some(_)) = d.next_frame() {}
    }
    if let Ok(c) = Control::decode(data) {
        assert_eq!(Control::decode(&c.encode()).ok(), Some(c));
    }
    let mut mb = Middlebox::new();
    let (a, b) = data.split_at(data.len() / 2);
    let _ = mb.receive(Peer::Client, a);
    let _ = mb.receive(Peer::Server, b);
    let _ = mb.receive(Peer::Client, b);
});
