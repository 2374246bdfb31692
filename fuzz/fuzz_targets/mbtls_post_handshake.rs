//! A middlebox relay fed records of arbitrary plaintext (data, post-handshake messages such as
//! KeyUpdates, alerts) from an authentic client-side neighbour: it never panics, and every
//! record it passes toward the server opens under that hop's keys, which move to their next
//! generation exactly when the relay reports that it followed a KeyUpdate.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mbx_apps::PassThrough;
use mbx_mbtls::{client_side_keys, DirectionKeys, HopKeys, MiddleboxRelay, RelayEvent, Side};
use mbx_record::{CipherSuite, ContentType, RecordOpener, RecordSealer, TlsVersion};

const V: TlsVersion = TlsVersion::Tls13;

fn next(d: &DirectionKeys) -> DirectionKeys {
    let secret = d
        .secret
        .as_ref()
        .expect("TLS 1.3 hops carry secrets")
        .next();
    DirectionKeys::from_secret(secret.expect("next secret"), 0).expect("next keys")
}

fn split_records(mut stream: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    while stream.len() >= 5 {
        let len = 5 + usize::from(u16::from_be_bytes([stream[3], stream[4]]));
        let (rec, rest) = stream.split_at(len.min(stream.len()));
        out.push(rec);
        stream = rest;
    }
    assert!(stream.is_empty(), "relay output ends in a partial record");
    out
}

fuzz_target!(|data: &[u8]| {
    let suite = CipherSuite::TLS13_AES_128_GCM_SHA256;
    let bridge = HopKeys::generate(V, &suite, 0, 0).expect("keys");
    let mut side = client_side_keys(V, suite, bridge, 1).expect("side keys");
    let km = side.middleboxes.pop().expect("key material");
    let (mut sent, mut passed) = (side.endpoint.c2s, km.toward_server.c2s.clone());
    let mut relay = MiddleboxRelay::new(km, PassThrough).expect("relay");
    let mut sealer = RecordSealer::new(V, sent.keys.clone(), sent.next_seq);
    let mut opener = RecordOpener::new(V, passed.keys.clone(), passed.next_seq);
    // Pieces separated by 0xff: the first byte picks the content type, the rest is the
    // plaintext of one record.
    for piece in data.split(|b| *b == 0xff).take(64) {
        let Some((&t, body)) = piece.split_first() else {
            continue;
        };
        let ct = match t % 3 {
            0 => ContentType::APPLICATION_DATA,
            1 => ContentType::HANDSHAKE,
            _ => ContentType::ALERT,
        };
        let mut wire = Vec::new();
        if sealer.seal(ct, body, &mut wire).is_err() {
            return;
        }
        relay.receive(Side::Client, &wire);
        let out = relay.take_outgoing(Side::Server);
        for rec in split_records(&out) {
            opener
                .open(rec)
                .expect("the relay's output opens under the hop's keys");
        }
        while let Some(ev) = relay.poll_event() {
            if ev == (RelayEvent::KeysUpdated { from: Side::Client }) {
                (sent, passed) = (next(&sent), next(&passed));
                sealer = RecordSealer::new(V, sent.keys.clone(), 0);
                opener = RecordOpener::new(V, passed.keys.clone(), 0);
            }
        }
        if relay.is_closed() {
            return;
        }
    }
});
