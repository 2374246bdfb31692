//! Arbitrary bytes as setup frames: the deframer and message parser never panic, accepted
//! frames re-encode to the same bytes, and both state machines (an endpoint and the middlebox
//! on either connection) reject hostile input with typed errors, split anywhere.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mbx_blindbox_setup::wire::{Deframer, Message, FRAME_HEADER};
use mbx_blindbox_setup::{
    Endpoint, EndpointConfig, EndpointKeys, Middlebox, MiddleboxConfig, Peer, RgKey, SignedChunk,
};
use rand::rngs::StdRng;
use rand::SeedableRng;

fuzz_target!(|data: &[u8]| {
    let mut d = Deframer::new();
    d.push(data);
    while let Ok(Some((ty, body))) = d.next_frame() {
        let frame_len = FRAME_HEADER + body.len();
        if let Ok(m) = Message::decode(ty, body) {
            let again = m.encode();
            assert_eq!(again.len(), frame_len);
            assert_eq!(again.get(FRAME_HEADER..), Some(body));
        }
    }
    let split = data.first().map_or(0, |&b| usize::from(b)).min(data.len());
    let (a, b) = data.split_at(split);
    let mut rng = StdRng::seed_from_u64(1);
    let cfg = EndpointConfig {
        max_chunks: 64,
        workers: 1,
        group: 1,
    };
    let mut ep = Endpoint::new(
        EndpointKeys::from_parts([1; 16], [2; 32]),
        &RgKey::from_bytes([3; 16]),
        cfg,
        &mut rng,
    )
    .expect("endpoint");
    if ep.receive(a).is_ok() && ep.receive(b).is_ok() {
        while let Ok(Some(_)) = ep.poll_transmit() {}
    }
    let chunks = vec![SignedChunk {
        chunk: *b"abcdefgh",
        tag: [0; 16],
    }];
    let mcfg = MiddleboxConfig {
        batch: 1,
        window: 1,
        workers: 1,
    };
    let mut mb = Middlebox::new(chunks, mcfg, &mut rng).expect("middlebox");
    for peer in [Peer::Full, Peer::Hash] {
        if mb.receive(peer, a).is_ok() && mb.receive(peer, b).is_ok() {
            let _ = mb.poll_transmit(peer);
        }
    }
});
