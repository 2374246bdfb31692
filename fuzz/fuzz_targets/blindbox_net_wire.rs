//! Arbitrary bytes as the BlindBox hop wire: the demultiplexer from any split, control
//! messages, a middlebox fed from both sides, and a middlebox whose rule setup has started
//! (both endpoints' `HandshakeDone` received) fed arbitrary setup-stream frames: none may
//! panic.
#![no_main]

use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use mbx_blindbox::channel::Privacy;
use mbx_blindbox::rules::BufferPolicy;
use mbx_blindbox::tokenize::{CaseMode, Tokenization};
use mbx_blindbox_net::control::{Control, Params};
use mbx_blindbox_net::middlebox::{Middlebox, Peer};
use mbx_blindbox_net::mux::{encode, Demux, Stream};
use mbx_blindbox_net::{Policy, RuleBook};
use mbx_blindbox_setup::{MiddleboxConfig, RgKey, TaggedRules};
use rand::rngs::StdRng;
use rand::SeedableRng;

const RULES: &str = "alert tcp any any -> any any (msg:\"m\"; content:\"fuzz-keyword\"; sid:1;)\n";

fn book() -> Arc<RuleBook> {
    static BOOK: OnceLock<Arc<RuleBook>> = OnceLock::new();
    BOOK.get_or_init(|| {
        let tagged = TaggedRules::sign(RULES, false, &RgKey::from_bytes([7; 16]));
        let cfg = MiddleboxConfig {
            batch: 2,
            window: 1,
            workers: 1,
        };
        Arc::new(RuleBook::new(&tagged, BufferPolicy::Approximate, Policy::Block, cfg).unwrap())
    })
    .clone()
}

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
    let mut rng = StdRng::seed_from_u64(0);
    let mut mb = Middlebox::new(book(), &mut rng);
    let (a, b) = data.split_at(data.len() / 2);
    let _ = mb.receive(Peer::Client, a);
    let _ = mb.receive(Peer::Server, b);
    let _ = mb.receive(Peer::Client, b);

    // A middlebox in its rule setup, fed arbitrary setup frames from both endpoints.
    let mut mb = Middlebox::new(book(), &mut rng);
    let done = Control::HandshakeDone(Params {
        tokenization: Tokenization::Window,
        case: CaseMode::Exact,
        privacy: Privacy::ExactMatch,
    })
    .encode();
    let mut hello = Vec::new();
    encode(Stream::Control, &done, &mut hello);
    let _ = mb.receive(Peer::Client, &hello);
    let _ = mb.receive(Peer::Server, &hello);
    let (mut fa, mut fb) = (Vec::new(), Vec::new());
    encode(Stream::Setup, a, &mut fa);
    encode(Stream::Setup, b, &mut fb);
    for piece in fa.chunks(split) {
        let _ = mb.receive(Peer::Client, piece);
    }
    let _ = mb.receive(Peer::Server, &fb);
    let _ = mb.peer_ended(Peer::Server);
    let _ = mb.take_outgoing(Peer::Client);
});
