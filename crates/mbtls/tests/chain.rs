//! The data phase end to end in memory: client endpoint → N middleboxes → server endpoint.
//!
//! Properties from the spec: data survives byte for byte; P1C (each hop's ciphertext differs);
//! P2 (modified, dropped, reordered, replayed records are detected and nothing is forwarded);
//! P4 (a record from one hop is rejected on another); alerts re-protected per hop.

mod common;

use common::{records, App, Chain, SUITES};
use mbx_apps::{Direction, HttpHeaderInsert, MiddleboxApp, PassThrough, Verdict};
use mbx_engine::AlertDescription;
use mbx_mbtls::relay::FailCause;
use mbx_mbtls::{Alert, EndpointEvent, Leaving, RelayEvent, Side};
use mbx_record::{CipherSuite, TlsVersion};
use proptest::prelude::*;

fn pass(n: usize) -> Vec<App> {
    (0..n).map(|_| Box::new(PassThrough) as App).collect()
}

fn tls13() -> (TlsVersion, CipherSuite) {
    (TlsVersion::Tls13, CipherSuite::TLS13_AES_128_GCM_SHA256)
}

fn bad_mac() -> Alert {
    Alert::fatal(AlertDescription::BAD_RECORD_MAC)
}

fn events_of_server(chain: &mut Chain) -> Vec<EndpointEvent> {
    std::iter::from_fn(|| chain.server().poll_event()).collect()
}

fn events_of_client(chain: &mut Chain) -> Vec<EndpointEvent> {
    std::iter::from_fn(|| chain.client().poll_event()).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Random data in both directions through 0..4 pass-through middleboxes (split between the
    /// client side and the server side), delivered in random chunks (copied, lent, or lent and
    /// passed on where they lie), arrives byte for byte, also when the middleboxes give their
    /// idle buffers back after every delivery, and (TLS 1.3) when the endpoints update their
    /// keys in between, asking the peer to as well or not.
    #[test]
    fn data_survives_any_chain(
        suite_idx in 0..SUITES.len(),
        n_client in 0usize..=4,
        n_server_raw in 0usize..=4,
        c2s in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..3000), 0..5),
        s2c in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..3000), 0..5),
        chunking in proptest::collection::vec(1usize..700, 0..6),
        input_mode in 0u8..3,
        release_idle in any::<bool>(),
        // Per write: 0 nothing, 1/2 the client updates its keys (2: asking the server to),
        // 3/4 the server does.
        updates in proptest::collection::vec(0u8..5, 0..5),
    ) {
        let n_server = n_server_raw.min(4 - n_client);
        let (v, s) = SUITES[suite_idx];
        let mut chain = Chain::new(v, s, pass(n_client), pass(n_server));
        chain.chunking = chunking;
        chain.in_place = input_mode > 0;
        chain.lending = input_mode == 2;
        chain.release_idle = release_idle;
        for (i, w) in c2s.iter().enumerate() {
            chain.client().write(w).unwrap();
            if let Some(r) = s2c.get(i) {
                chain.server().write(r).unwrap();
            }
            if v == TlsVersion::Tls13 {
                match updates.get(i).copied().unwrap_or(0) {
                    1 | 2 => chain.client().update_keys(updates[i] == 2).unwrap(),
                    3 | 4 => chain.server().update_keys(updates[i] == 4).unwrap(),
                    _ => {}
                }
            }
            chain.pump();
        }
        for r in s2c.iter().skip(c2s.len()) {
            chain.server().write(r).unwrap();
        }
        chain.client().close().unwrap();
        chain.server().close().unwrap();
        chain.pump();
        prop_assert_eq!(chain.server().take_plaintext(), c2s.concat());
        prop_assert_eq!(chain.client().take_plaintext(), s2c.concat());
        prop_assert!(chain.server().peer_closed());
        prop_assert!(chain.client().peer_closed());
        for i in 0..n_client + n_server {
            prop_assert!(chain.mbox(i).is_closed());
            prop_assert!(!chain.mbox(i).is_failed());
        }
    }
}

/// P1C: the same plaintext crosses each hop as a different ciphertext.
#[test]
fn p1c_same_plaintext_differs_on_every_hop() {
    for &(v, s) in SUITES {
        let mut chain = Chain::new(v, s, pass(1), pass(1));
        let data = vec![0x42u8; 1000];
        chain.client().write(&data).unwrap();
        chain.server().write(&data).unwrap();
        chain.pump();
        assert_eq!(chain.server().take_plaintext(), data);
        for tap in [&chain.tap_c2s, &chain.tap_s2c] {
            let recs: Vec<Vec<u8>> = tap.iter().map(|t| records(t).remove(0)).collect();
            assert_eq!(recs.len(), 3);
            for a in 0..recs.len() {
                for b in a + 1..recs.len() {
                    // Same length (pass-through keeps sizes) but different bytes after the header.
                    assert_eq!(recs[a].len(), recs[b].len());
                    assert_ne!(recs[a][5..], recs[b][5..], "{v:?} hops {a} and {b}");
                }
            }
        }
        // Each middlebox reads with one key and writes with another, per direction.
        let (r, w) = chain.mbox(0).key_fingerprints(Side::Client);
        let (r2, w2) = chain.mbox(0).key_fingerprints(Side::Server);
        let all = [r.unwrap(), w.unwrap(), r2.unwrap(), w2.unwrap()];
        for a in 0..4 {
            for b in a + 1..4 {
                assert_ne!(all[a], all[b]);
            }
        }
    }
}

/// TLS 1.2 hops cannot update their keys, so a key that reaches its AEAD's confidentiality
/// limit (AES-GCM: 2^24.5 records, RFC 8446 §5.5) seals nothing more but the alert that ends
/// the session. The client's own first hop continues the bridge's sequence numbers, so a client
/// writing at the limit gets an error and the server the client's internal_error alert through
/// the middlebox; a middlebox whose app turns one record into two reaches the limit first and
/// fails the session at both endpoints without forwarding the record over the limit.
/// ChaCha20-Poly1305 hops at the same count carry on. (TLS 1.3 endpoints update their keys
/// before the limit: `tls13_endpoints_update_worn_keys_before_the_limit`.)
#[test]
fn a_tls12_hop_at_its_keys_confidentiality_limit_ends_the_session_at_both_endpoints() {
    let internal = Alert::fatal(AlertDescription::INTERNAL_ERROR);
    for &(v, suite) in SUITES.iter().filter(|(v, _)| *v == TlsVersion::Tls12) {
        let limit = suite.aead.confidentiality_limit();
        let start = limit.min(1 << 30) - 1;
        // The client at its limit.
        let mut chain = Chain::with_bridge_at(v, suite, pass(1), vec![], start, 5);
        chain.client().write(b"last").unwrap();
        let over = chain.client().write(b"one more");
        chain.pump();
        if limit == u64::MAX {
            over.unwrap();
            assert_eq!(
                chain.server().take_plaintext(),
                b"lastone more",
                "{suite:?}"
            );
            continue;
        }
        assert!(over.is_err(), "{suite:?}");
        assert_eq!(chain.server().take_plaintext(), b"last", "{suite:?}");
        assert!(events_of_server(&mut chain).contains(&EndpointEvent::PeerAlert(internal)));
        // A middlebox at its limit: one record in, two out, of which only the first fits.
        let mut chain = Chain::with_bridge_at(v, suite, vec![Box::new(Doubler)], vec![], start, 5);
        chain.client().write(&[7u8; 10_000]).unwrap();
        chain.pump();
        assert_eq!(
            chain.server().take_plaintext(),
            vec![7u8; 1 << 14],
            "{suite:?}"
        );
        let evs: Vec<RelayEvent> = std::iter::from_fn(|| chain.mbox(0).poll_event()).collect();
        assert!(
            evs.contains(&RelayEvent::Failed {
                cause: FailCause::Local,
                alert: internal,
            }),
            "{evs:?}"
        );
        assert!(events_of_server(&mut chain).contains(&EndpointEvent::PeerAlert(internal)));
        assert!(events_of_client(&mut chain).contains(&EndpointEvent::PeerAlert(internal)));
    }
}

/// TLS 1.3 AES-GCM: an endpoint whose keys carried three quarters of their confidentiality
/// limit updates them before its next record, and every hop of that direction follows, so a
/// session started just below the limit goes on past it. ChaCha20-Poly1305 never needs to.
#[test]
fn tls13_endpoints_update_worn_keys_before_the_limit() {
    for &(v, suite) in SUITES.iter().filter(|(v, _)| *v == TlsVersion::Tls13) {
        let limit = suite.aead.confidentiality_limit();
        let start = limit.min(1 << 30) - 1;
        let mut chain = Chain::with_bridge_at(v, suite, pass(1), pass(1), start, start);
        chain.client().write(b"last").unwrap();
        chain.client().write(b"one more").unwrap();
        chain.server().write(b"and back").unwrap();
        chain.pump();
        assert_eq!(
            chain.server().take_plaintext(),
            b"lastone more",
            "{suite:?}"
        );
        assert_eq!(chain.client().take_plaintext(), b"and back", "{suite:?}");
        let updated = |events: Vec<EndpointEvent>| {
            events
                .iter()
                .any(|e| matches!(e, EndpointEvent::PeerUpdatedKeys { .. }))
        };
        let (at_server, at_client) = (
            updated(events_of_server(&mut chain)),
            updated(events_of_client(&mut chain)),
        );
        // Each endpoint updated its own keys (and, reading worn keys, asked the other to).
        assert_eq!(
            (at_server, at_client),
            (limit != u64::MAX, limit != u64::MAX)
        );
        for i in 0..2 {
            assert!(!chain.mbox(i).is_failed(), "{suite:?}");
        }
    }
}

/// A TLS 1.3 endpoint reading records under worn keys asks the peer to update them (once):
/// a peer that does not update on its own, as a legacy one may not, still moves before the
/// limit.
#[test]
fn a_tls13_endpoint_reading_worn_keys_asks_its_peer_to_update() {
    use mbx_mbtls::{DirectionKeys, EndpointDataPhase, HopKeys};
    use mbx_record::{ContentType, RecordOpener, RecordSealer};
    let suite = CipherSuite::TLS13_AES_128_GCM_SHA256;
    let v = TlsVersion::Tls13;
    let worn = suite.aead.confidentiality_limit() / 4 * 3 + 1;
    let hop = HopKeys::generate(v, &suite, 0, worn).unwrap();
    // The peer: a bare sealer that never updates by itself, and an opener for what we send.
    let mut peer = RecordSealer::new(v, hop.s2c.keys.clone(), worn);
    let mut at_peer = RecordOpener::new(v, hop.c2s.keys.clone(), 0);
    let next_s2c = {
        let secret = hop.s2c.secret.as_ref().unwrap().next().unwrap();
        DirectionKeys::from_secret(secret, 0).unwrap()
    };
    let mut client = EndpointDataPhase::new(mbx_engine::Role::Client, v, hop);
    let mut sent_by_client = |client: &mut EndpointDataPhase| -> Vec<(ContentType, Vec<u8>)> {
        records(&client.take_outgoing())
            .iter()
            .map(|r| {
                let o = at_peer.open(r).unwrap();
                (o.content_type, o.plaintext.to_vec())
            })
            .collect()
    };
    let ask = (ContentType::HANDSHAKE, vec![24, 0, 0, 1, 1]);
    for round in 0..2 {
        let mut wire = Vec::new();
        peer.seal(ContentType::APPLICATION_DATA, b"x", &mut wire)
            .unwrap();
        client.receive(&wire);
        assert_eq!(client.take_plaintext(), b"x");
        // Asked once, not again while the peer has not updated.
        let want = if round == 0 {
            vec![ask.clone()]
        } else {
            vec![]
        };
        assert_eq!(sent_by_client(&mut client), want, "round {round}");
    }
    // The peer updates: the client follows, and reads the next generation.
    let mut wire = Vec::new();
    peer.seal(ContentType::HANDSHAKE, &[24, 0, 0, 1, 0], &mut wire)
        .unwrap();
    peer = RecordSealer::new(v, next_s2c.keys, 0);
    peer.seal(ContentType::APPLICATION_DATA, b"fresh", &mut wire)
        .unwrap();
    client.receive(&wire);
    assert_eq!(client.take_plaintext(), b"fresh");
    assert!(sent_by_client(&mut client).is_empty());
    assert_eq!(client.failure(), None);
}

/// Sets up client → M0 → M1 → server with one record of "first" and one of "second" written
/// by the client but not yet delivered; returns the chain and the two records as captured.
fn two_undelivered_records(v: TlsVersion, s: CipherSuite) -> (Chain, Vec<u8>, Vec<u8>) {
    let mut chain = Chain::new(v, s, pass(2), vec![]);
    chain.client().write(b"first").unwrap();
    let a = chain.client().take_outgoing();
    chain.client().write(b"second").unwrap();
    let b = chain.client().take_outgoing();
    (chain, a, b)
}

/// After M0 saw a bad record: it failed with bad_record_mac, nothing reached the server except
/// what `delivered` says, and both endpoints got a bad_record_mac alert under their own hop keys.
fn assert_fail_closed(chain: &mut Chain, delivered: &[u8]) {
    assert!(chain.mbox(0).is_failed());
    let evs: Vec<RelayEvent> = std::iter::from_fn(|| chain.mbox(0).poll_event()).collect();
    assert!(
        evs.contains(&RelayEvent::Failed {
            cause: FailCause::BadRecord { from: Side::Client },
            alert: bad_mac(),
        }),
        "{evs:?}"
    );
    chain.pump();
    assert_eq!(chain.server().take_plaintext(), delivered);
    assert!(events_of_server(chain).contains(&EndpointEvent::PeerAlert(bad_mac())));
    assert!(events_of_client(chain).contains(&EndpointEvent::PeerAlert(bad_mac())));
    assert_eq!(chain.client().failure(), Some(bad_mac()));
    assert_eq!(chain.server().failure(), Some(bad_mac()));
    // M1 forwarded the fatal alert; it did not see a bad record itself.
    let m1: Vec<RelayEvent> = std::iter::from_fn(|| chain.mbox(1).poll_event()).collect();
    assert_eq!(
        m1,
        vec![RelayEvent::Failed {
            cause: FailCause::PeerAlert { from: Side::Client },
            alert: bad_mac()
        }]
    );
    // And nothing passes any more.
    assert!(chain.client().write(b"more").is_err());
}

#[test]
fn p2_modified_record_is_fatal_and_not_forwarded() {
    for &(v, s) in SUITES {
        let len = two_undelivered_records(v, s).1.len();
        for i in 0..len {
            let (mut chain, mut a, b) = two_undelivered_records(v, s);
            a[i] ^= 0x01;
            chain.nodes[1].receive(Side::Client, &a);
            // A changed length field makes the deframer wait for more bytes: give it some.
            chain.nodes[1].receive(Side::Client, &b);
            chain.nodes[1].receive(Side::Client, &[0u8; 300]);
            assert_fail_closed(&mut chain, b"");
        }
    }
}

/// The same with the copy-free input path (`receive_in_place`), a record and the next one in
/// one lent buffer.
#[test]
fn p2_modified_record_is_fatal_in_place_too() {
    for &(v, s) in SUITES {
        let len = two_undelivered_records(v, s).1.len();
        for i in 0..len {
            let (mut chain, mut a, b) = two_undelivered_records(v, s);
            a[i] ^= 0x01;
            let mut lent = [a, b, vec![0u8; 300]].concat();
            chain.nodes[1].receive_in_place(Side::Client, &mut lent);
            assert_fail_closed(&mut chain, b"");
        }
        // Dropped, reordered, replayed, skipping a hop (P4).
        let (mut chain, a, b) = two_undelivered_records(v, s);
        chain.nodes[1].receive_in_place(Side::Client, &mut [b.clone(), a.clone()].concat());
        assert_fail_closed(&mut chain, b"");
        let (mut chain, a, _b) = two_undelivered_records(v, s);
        chain.nodes[1].receive_in_place(Side::Client, &mut [a.clone(), a.clone()].concat());
        assert_fail_closed(&mut chain, b"first");
        let (mut chain, a, _b) = two_undelivered_records(v, s);
        chain.nodes[2].receive_in_place(Side::Client, &mut a.clone());
        assert!(chain.mbox(1).is_failed());
    }
}

#[test]
fn p2_dropped_record_is_detected() {
    for &(v, s) in SUITES {
        let (mut chain, _a, b) = two_undelivered_records(v, s);
        chain.nodes[1].receive(Side::Client, &b);
        assert_fail_closed(&mut chain, b"");
    }
}

#[test]
fn p2_reordered_records_are_detected() {
    for &(v, s) in SUITES {
        let (mut chain, a, b) = two_undelivered_records(v, s);
        chain.nodes[1].receive(Side::Client, &b);
        chain.nodes[1].receive(Side::Client, &a);
        assert_fail_closed(&mut chain, b"");
    }
}

#[test]
fn p2_replayed_record_is_detected() {
    for &(v, s) in SUITES {
        let (mut chain, a, _b) = two_undelivered_records(v, s);
        chain.nodes[1].receive(Side::Client, &a);
        chain.nodes[1].receive(Side::Client, &a);
        assert_fail_closed(&mut chain, b"first");
    }
}

#[test]
fn p2_truncated_stream_and_garbage_are_fatal() {
    let (v, s) = tls13();
    let (mut chain, a, _b) = two_undelivered_records(v, s);
    // A header announcing an oversized record: framing error, same outcome.
    chain.nodes[1].receive(Side::Client, &[23, 3, 3, 0xff, 0xff]);
    assert_fail_closed(&mut chain, b"");
    // Input after the failure is ignored.
    chain.nodes[1].receive(Side::Client, &a);
    chain.pump();
    assert_eq!(chain.server().take_plaintext(), b"");
}

/// P4: a record captured on one hop and injected on another is rejected.
#[test]
fn p4_record_from_another_hop_is_rejected() {
    for &(v, s) in SUITES {
        // Injected into M1 (skipping M0): the client→M0 record, at the sequence number M1
        // expects next.
        let (mut chain, a, _b) = two_undelivered_records(v, s);
        chain.nodes[2].receive(Side::Client, &a);
        assert!(chain.mbox(1).is_failed());
        chain.pump();
        assert_eq!(chain.server().take_plaintext(), b"");
        assert!(events_of_server(&mut chain).contains(&EndpointEvent::PeerAlert(bad_mac())));

        // Injected into the server (skipping every middlebox).
        let (mut chain, a, _b) = two_undelivered_records(v, s);
        chain.server().receive(&a);
        assert_eq!(chain.server().take_plaintext(), b"");
        assert_eq!(chain.server().failure(), Some(bad_mac()));

        // A server→client record of hop M1–server replayed toward the server on the same hop
        // (reflection) is rejected too: each direction has its own key.
        let mut chain = Chain::new(v, s, pass(2), vec![]);
        chain.server().write(b"reflect me").unwrap();
        let r = chain.server().take_outgoing();
        chain.nodes[2].receive(Side::Client, &r);
        assert!(chain.mbox(1).is_failed());
    }
}

/// A control: the same records delivered in order on the right hop pass (so the rejections
/// above are due to the hop/order, not to the harness).
#[test]
fn control_records_pass_when_delivered_correctly() {
    for &(v, s) in SUITES {
        let (mut chain, a, b) = two_undelivered_records(v, s);
        chain.nodes[1].receive(Side::Client, &a);
        chain.nodes[1].receive(Side::Client, &b);
        chain.pump();
        assert_eq!(chain.server().take_plaintext(), b"firstsecond");
        assert!(!chain.mbox(0).is_failed());
    }
}

#[test]
fn close_notify_is_reprotected_per_hop_and_half_closes() {
    let (v, s) = tls13();
    let mut chain = Chain::new(v, s, pass(1), pass(1));
    chain.client().write(b"req").unwrap();
    chain.client().close().unwrap();
    chain.pump();
    assert!(chain.server().peer_closed());
    assert_eq!(chain.server().take_plaintext(), b"req");
    // Every hop carried its own close_notify record (two records per link: data + alert).
    for t in &chain.tap_c2s {
        assert_eq!(records(t).len(), 2);
    }
    // Nothing came from the server since: its leaving without close_notify would cut nothing.
    assert!(!chain.mbox(0).sent_data_after_the_others_close(Side::Server));
    assert_eq!(chain.mbox(0).leaving(Side::Server), Leaving::Clean);
    // The server's direction is open: the client leaving now would be a cut.
    assert_eq!(chain.mbox(0).leaving(Side::Client), Leaving::MidSession);
    // The other direction still works (half-close). Half a record is not yet data, but it is
    // something a cut would lose.
    chain.server().write(b"resp").unwrap();
    let record = chain.server().take_outgoing();
    let (first, rest) = record.split_at(7);
    chain.nodes[2].receive(Side::Server, first);
    assert!(chain.mbox(1).has_partial_record(Side::Server));
    assert!(!chain.mbox(1).sent_data_after_the_others_close(Side::Server));
    assert_eq!(chain.mbox(1).leaving(Side::Server), Leaving::MayCut);
    chain.nodes[2].receive(Side::Server, rest);
    assert!(!chain.mbox(1).has_partial_record(Side::Server));
    chain.server().close().unwrap();
    chain.pump();
    assert_eq!(chain.client().take_plaintext(), b"resp");
    for i in 0..2 {
        assert!(chain.mbox(i).sent_data_after_the_others_close(Side::Server));
        // The client's data came before its own close_notify, with the server's direction open.
        assert!(!chain.mbox(i).sent_data_after_the_others_close(Side::Client));
    }
    assert!(chain.client().peer_closed());
    assert!(chain.mbox(0).is_closed() && chain.mbox(1).is_closed());
}

#[test]
fn fatal_alert_from_the_server_side_is_forwarded_to_the_client() {
    let (v, s) = (
        TlsVersion::Tls12,
        CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
    );
    let mut chain = Chain::new(v, s, pass(1), vec![]);
    chain.server().write(b"x").unwrap();
    chain.pump();
    assert_eq!(chain.client().take_plaintext(), b"x");
    // Server-side corruption: the server gets garbage, sends bad_record_mac toward M0, which
    // forwards it to the client as a fatal alert under the client hop's keys.
    chain.server().receive(&[
        23, 3, 3, 0, 20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    ]);
    chain.pump();
    assert_eq!(chain.client().failure(), Some(bad_mac()));
    let evs: Vec<RelayEvent> = std::iter::from_fn(|| chain.mbox(0).poll_event()).collect();
    assert!(evs.contains(&RelayEvent::Failed {
        cause: FailCause::PeerAlert { from: Side::Server },
        alert: bad_mac()
    }));
}

/// An app that doubles every byte: records change size, output is split into ≤ 2^14 records.
struct Doubler;
impl MiddleboxApp for Doubler {
    fn on_data(&mut self, _dir: Direction, data: &[u8], out: &mut Vec<u8>) -> Verdict {
        for b in data {
            out.extend_from_slice(&[*b, *b]);
        }
        Verdict::Continue
    }
}

#[test]
fn app_may_grow_data_and_records_stay_within_limits() {
    for &(v, s) in SUITES {
        let mut chain = Chain::new(v, s, vec![Box::new(Doubler)], pass(1));
        let data: Vec<u8> = (0..40_000u32).map(|i| i as u8).collect();
        chain.client().write(&data).unwrap();
        chain.pump();
        let doubled: Vec<u8> = data.iter().flat_map(|b| [*b, *b]).collect();
        assert_eq!(chain.server().take_plaintext(), doubled);
        for tap in &chain.tap_c2s {
            for r in records(tap) {
                assert!(r.len() - 5 <= (1 << 14) + 256, "{}", r.len());
            }
        }
    }
}

/// An app that ends the session when it sees "BLOCK".
struct Blocker;
impl MiddleboxApp for Blocker {
    fn on_data(&mut self, _dir: Direction, data: &[u8], out: &mut Vec<u8>) -> Verdict {
        if data.windows(5).any(|w| w == b"BLOCK") {
            return Verdict::Close(mbx_apps::CloseAlert::ACCESS_DENIED);
        }
        out.extend_from_slice(data);
        Verdict::Continue
    }
}

#[test]
fn app_can_close_the_session() {
    let (v, s) = tls13();
    let mut chain = Chain::new(v, s, vec![Box::new(Blocker)], vec![]);
    chain.client().write(b"fine").unwrap();
    chain.pump();
    chain.client().write(b"BLOCK this").unwrap();
    chain.pump();
    assert_eq!(chain.server().take_plaintext(), b"fine");
    let denied = Alert::fatal(AlertDescription(49));
    assert_eq!(chain.server().failure(), Some(denied));
    assert_eq!(chain.client().failure(), Some(denied));
}

#[test]
fn header_insertion_in_the_chain_inserts_once_per_request() {
    let big: Vec<u8> = (0..40_000u32).map(|i| (i % 251) as u8).collect();
    for &(v, s) in SUITES {
        // Copied, lent, and lent with records passed on where they lie.
        for mode in 0..3 {
            let http: App = Box::new(HttpHeaderInsert::new("X-Mbtls", "mb1").unwrap());
            let mut chain = Chain::new(v, s, vec![Box::new(PassThrough), http], pass(1));
            chain.chunking = vec![7, 1, 300, 20_000];
            chain.in_place = mode > 0;
            chain.lending = mode == 2;
            let reqs = b"GET /a HTTP/1.1\r\nHost: h\r\n\r\n\
                POST /b HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhello\
                POST /c HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n";
            // Written in awkward pieces, so requests straddle records.
            for piece in reqs.chunks(11) {
                chain.client().write(piece).unwrap();
            }
            // A body of several records, passed on unchanged, then one more request.
            chain
                .client()
                .write(b"PUT /d HTTP/1.1\r\nContent-Length: 40000\r\n\r\n")
                .unwrap();
            chain.client().write(&big).unwrap();
            chain.client().write(b"GET /e HTTP/1.1\r\n\r\n").unwrap();
            chain.pump();
            let got = chain.server().take_plaintext();
            let want = [
                &b"GET /a HTTP/1.1\r\nHost: h\r\nX-Mbtls: mb1\r\n\r\n\
                   POST /b HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nX-Mbtls: mb1\r\n\r\nhello\
                   POST /c HTTP/1.1\r\nTransfer-Encoding: chunked\r\nX-Mbtls: mb1\r\n\r\n3\r\nabc\r\n0\r\n\r\n\
                   PUT /d HTTP/1.1\r\nContent-Length: 40000\r\nX-Mbtls: mb1\r\n\r\n"[..],
                &big,
                b"GET /e HTTP/1.1\r\nX-Mbtls: mb1\r\n\r\n",
            ]
            .concat();
            assert!(got == want, "{v:?} mode {mode}");
            // Responses pass unchanged.
            chain.server().write(b"HTTP/1.1 200 OK\r\n\r\n").unwrap();
            chain.server().write(&big).unwrap();
            chain.pump();
            let want = [&b"HTTP/1.1 200 OK\r\n\r\n"[..], &big].concat();
            assert!(chain.client().take_plaintext() == want, "{v:?} mode {mode}");
        }
    }
}

/// The header-inserting proxy's records that it lets through unchanged (a request body, a
/// response) are passed on where they lie; a record with a request head is not (the header
/// goes into it), and what it returns is queued ahead of the run that follows it.
#[test]
fn header_insertion_passes_bodies_and_responses_on_in_place() {
    use mbx_record::{ContentType, RecordOpener, RecordSealer};
    let v = TlsVersion::Tls13;
    let app: App = Box::new(HttpHeaderInsert::new("X-Mbtls", "mb1").unwrap());
    let (mut relay, keys, km) = common::lone_relay(app);
    let data = ContentType::APPLICATION_DATA;
    let (c2s, s2c) = (&keys.endpoint.c2s, &km.toward_server.s2c);
    let mut client = RecordSealer::new(v, c2s.keys.clone(), c2s.next_seq);
    let mut server = RecordSealer::new(v, s2c.keys.clone(), s2c.next_seq);
    let mut at_server = RecordOpener::new(
        v,
        km.toward_server.c2s.keys.clone(),
        km.toward_server.c2s.next_seq,
    );
    let mut at_client = RecordOpener::new(
        v,
        keys.endpoint.s2c.keys.clone(),
        keys.endpoint.s2c.next_seq,
    );
    let opened = |opener: &mut RecordOpener, wire: &[u8]| -> Vec<u8> {
        records(wire)
            .iter()
            .flat_map(|r| opener.open(r).unwrap().plaintext.to_vec())
            .collect()
    };
    // A head, then two body records: the head's record is queued with the header, the body's
    // are passed on in place behind it.
    let mut lent = Vec::new();
    client
        .seal_padded(
            data,
            b"POST / HTTP/1.1\r\nContent-Length: 9\r\n\r\n",
            0,
            &mut lent,
        )
        .unwrap();
    let head_len = lent.len();
    client.seal_padded(data, b"body ", 0, &mut lent).unwrap();
    client.seal_padded(data, b"body", 0, &mut lent).unwrap();
    let range = relay.receive_lending(Side::Client, &mut lent);
    assert_eq!(range, Some(head_len..lent.len()));
    let mut wire = relay.take_outgoing(Side::Server);
    wire.extend_from_slice(&lent[range.unwrap()]);
    assert_eq!(
        opened(&mut at_server, &wire),
        b"POST / HTTP/1.1\r\nContent-Length: 9\r\nX-Mbtls: mb1\r\n\r\nbody body"
    );
    // A response record is passed on in place.
    let mut lent = Vec::new();
    server
        .seal_padded(data, b"HTTP/1.1 200 OK\r\n\r\n", 0, &mut lent)
        .unwrap();
    let range = relay.receive_lending(Side::Server, &mut lent);
    assert_eq!(range, Some(0..lent.len()));
    assert!(relay.take_outgoing(Side::Client).is_empty());
    assert_eq!(opened(&mut at_client, &lent), b"HTTP/1.1 200 OK\r\n\r\n");
    assert!(!relay.is_failed());
}

/// Buffers lent to `receive_in_place` (middleboxes and endpoints) hold no plaintext afterwards,
/// however the stream is split, and the data arrives as with `receive`.
#[test]
fn lent_buffers_keep_no_plaintext() {
    let marker = b"PLAINTEXT-MARKER".to_vec();
    let data: Vec<u8> = marker.iter().copied().cycle().take(40_000).collect();
    for &(v, s) in SUITES {
        for (chunking, lending) in [vec![], vec![1], vec![7, 300], vec![16_000, 5]]
            .into_iter()
            .flat_map(|c| [(c.clone(), false), (c, true)])
        {
            let mut chain = Chain::new(v, s, pass(2), pass(1));
            chain.chunking = chunking.clone();
            chain.in_place = true;
            chain.lending = lending;
            chain.marker = Some(marker.clone());
            chain.client().write(&data).unwrap();
            chain.server().write(&data[..1000]).unwrap();
            chain.client().close().unwrap();
            chain.server().close().unwrap();
            chain.pump();
            assert_eq!(chain.server().take_plaintext(), data, "{v:?} {chunking:?}");
            assert_eq!(chain.client().take_plaintext(), &data[..1000]);
            for i in 0..3 {
                assert!(chain.mbox(i).is_closed() && !chain.mbox(i).is_failed());
            }
        }
    }
}

/// A read-only app's records passed on where they lie: those before a modified record go out
/// first, then the alert; the record and everything after it do not.
#[test]
fn p2_modified_record_is_fatal_when_records_are_passed_on_in_place() {
    for &(v, s) in SUITES {
        let (_, a, b) = two_undelivered_records(v, s);
        for i in [0, 3, 5, b.len() - 1] {
            let (mut chain, a2, mut b2) = two_undelivered_records(v, s);
            assert_eq!((a2.len(), b2.len()), (a.len(), b.len()));
            b2[i] ^= 0x01;
            let mut lent = [a2, b2, vec![0u8; 300]].concat();
            // The alert came after the good record: that one is queued, nothing is lent.
            assert_eq!(chain.mbox(0).receive_lending(Side::Client, &mut lent), None);
            assert_fail_closed(&mut chain, b"first");
        }
    }
}

/// An app whose output differs in size from its input: doubled (more than one record per
/// record in), or swallowed (nothing). Both arrive intact, in place or not.
struct DoubleOrSwallow;

impl MiddleboxApp for DoubleOrSwallow {
    fn on_data(&mut self, dir: Direction, data: &[u8], out: &mut Vec<u8>) -> Verdict {
        if dir == Direction::ClientToServer {
            out.extend_from_slice(data);
            out.extend_from_slice(data);
        }
        Verdict::Continue
    }
}

#[test]
fn app_output_larger_than_a_record_or_empty() {
    for &(v, s) in SUITES {
        for in_place in [false, true] {
            let mut chain = Chain::new(v, s, vec![Box::new(DoubleOrSwallow) as App], pass(1));
            chain.in_place = in_place;
            let data: Vec<u8> = (0..40_000u32).map(|i| (i % 251) as u8).collect();
            chain.client().write(&data).unwrap();
            chain.server().write(b"swallowed").unwrap();
            chain.pump();
            let got = chain.server().take_plaintext();
            let want: Vec<u8> = data
                .chunks(16 * 1024)
                .flat_map(|c| [c, c].concat())
                .collect();
            assert_eq!(got, want, "{v:?} in place {in_place}");
            assert!(chain.client().take_plaintext().is_empty());
            assert!(!chain.mbox(0).is_failed());
        }
    }
}

/// An idle relay gives back what bulk traffic left in it (a driver swaps its own large, empty
/// buffers in for the relay's output) and goes on relaying; an incomplete record it holds
/// stays.
#[test]
fn an_idle_relay_gives_its_buffers_back_and_keeps_an_incomplete_record() {
    let (v, s) = tls13();
    let mut chain = Chain::new(v, s, pass(1), vec![]);
    let data = vec![0x42u8; 100_000];
    chain.client().write(&data).unwrap();
    let wire = chain.client().take_outgoing();
    let cut = wire.len() - 100;
    let mut sent = Vec::new();
    {
        let relay = chain.mbox(0);
        relay.receive(Side::Client, &wire[..cut]);
        // Twice, as a driver does: the second swap leaves its empty 256 KiB buffer inside.
        for _ in 0..2 {
            let mut dst = Vec::with_capacity(256 * 1024);
            relay.append_outgoing(Side::Server, &mut dst);
            sent.extend_from_slice(&dst);
        }
        assert!(
            relay.held_capacity() >= 256 * 1024,
            "{}",
            relay.held_capacity()
        );
        relay.release_idle_buffers();
        // Only the incomplete record is kept.
        assert!(
            relay.held_capacity() < 17 * 1024,
            "{}",
            relay.held_capacity()
        );
        relay.receive(Side::Client, &wire[cut..]);
        sent.extend(relay.take_outgoing(Side::Server));
        relay.release_idle_buffers();
        assert_eq!(relay.held_capacity(), 0);
    }
    chain.server().receive(&sent);
    assert_eq!(chain.server().take_plaintext(), data);
}

/// With records passed on where they lie, output for the other side keeps the stream's order:
/// a TLS 1.3 handshake record (a NewSessionTicket, forwarded re-protected) between two data
/// records in one lent buffer goes out between them, not before the first; a padded data
/// record (re-sealed shorter, so the run ends with it) keeps its place too.
#[test]
fn records_passed_on_in_place_keep_their_order_around_other_records() {
    use mbx_record::{ContentType, RecordOpener, RecordSealer};
    let v = TlsVersion::Tls13;
    let (mut relay, keys, km) = common::lone_relay(Box::new(PassThrough));
    let c2s = &keys.endpoint.c2s;
    let mut client = RecordSealer::new(v, c2s.keys.clone(), c2s.next_seq);
    let mut lent = Vec::new();
    let ticket = ContentType::HANDSHAKE;
    for (ct, body, padding) in [
        (ContentType::APPLICATION_DATA, &b"one"[..], 0),
        (ContentType::APPLICATION_DATA, b"padded", 40),
        (ContentType::APPLICATION_DATA, b"two", 0),
        (ticket, b"\x04\x00\x00\x01\x00", 0),
        (ContentType::APPLICATION_DATA, b"three", 0),
        (ContentType::APPLICATION_DATA, b"four", 0),
    ] {
        client.seal_padded(ct, body, padding, &mut lent).unwrap();
    }
    let range = relay.receive_lending(Side::Client, &mut lent);
    let mut wire = relay.take_outgoing(Side::Server);
    if let Some(r) = range {
        wire.extend_from_slice(&lent[r]);
    }
    let toward_server = &km.toward_server.c2s;
    let mut server = RecordOpener::new(v, toward_server.keys.clone(), toward_server.next_seq);
    let got: Vec<(ContentType, Vec<u8>)> = records(&wire)
        .iter()
        .map(|r| {
            let o = server.open(r).unwrap();
            (o.content_type, o.plaintext.to_vec())
        })
        .collect();
    assert_eq!(
        got,
        vec![
            (ContentType::APPLICATION_DATA, b"one".to_vec()),
            (ContentType::APPLICATION_DATA, b"padded".to_vec()),
            (ContentType::APPLICATION_DATA, b"two".to_vec()),
            (ticket, b"\x04\x00\x00\x01\x00".to_vec()),
            (ContentType::APPLICATION_DATA, b"three".to_vec()),
            (ContentType::APPLICATION_DATA, b"four".to_vec()),
        ]
    );
    assert!(!relay.is_failed());
}

/// A TLS 1.2 handshake message in the data phase (a renegotiation's HelloRequest or
/// ClientHello) that reaches an endpoint, as behind a middlebox of another implementation that
/// passed it on, ends the session with `unexpected_message` in words that name renegotiation
/// (ours refuses it first, in the same words: `a_legacy_server_that_renegotiates_is_refused_in_words`).
#[test]
fn an_endpoint_refuses_tls12_renegotiation_in_words() {
    let suite = CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384;
    let keys = mbx_mbtls::HopKeys::generate(TlsVersion::Tls12, &suite, 0, 0).unwrap();
    let mut sealer = mbx_record::RecordSealer::new(TlsVersion::Tls12, keys.c2s.keys.clone(), 0);
    let mut server =
        mbx_mbtls::EndpointDataPhase::new(mbx_engine::Role::Server, TlsVersion::Tls12, keys);
    let mut records = Vec::new();
    sealer
        .seal(
            mbx_record::ContentType::APPLICATION_DATA,
            b"before",
            &mut records,
        )
        .unwrap();
    // A ClientHello's first bytes: what matters is the record's type.
    sealer
        .seal(
            mbx_record::ContentType::HANDSHAKE,
            &[1, 0, 0, 0],
            &mut records,
        )
        .unwrap();
    server.receive(&records);
    assert_eq!(server.take_plaintext(), b"before");
    assert_eq!(
        server.failure(),
        Some(Alert::fatal(AlertDescription::UNEXPECTED_MESSAGE))
    );
    let events: Vec<EndpointEvent> = std::iter::from_fn(|| server.poll_event()).collect();
    assert!(
        events
            .iter()
            .any(|e| matches!(e, EndpointEvent::Failed { what, .. }
            if what.contains("TLS 1.2 renegotiation, which mbTLS does not support"))),
        "{events:?}"
    );
}
