//! TLS 1.3 KeyUpdate across hops, in memory: an endpoint's KeyUpdate crosses every middlebox,
//! each hop of its direction moves to its next keys, and data keeps flowing; a peer asked to
//! update answers; a KeyUpdate that breaks the rules ends the session on every hop.

mod common;

use common::{App, Chain, SUITES};
use mbx_apps::PassThrough;
use mbx_engine::AlertDescription;
use mbx_engine::Role;
use mbx_mbtls::relay::FailCause;
use mbx_mbtls::{Alert, EndpointDataPhase, EndpointEvent};
use mbx_mbtls::{MbtlsError, MiddleboxRelay, RelayEvent, Side};
use mbx_record::{ContentType, RecordSealer, TlsVersion};

fn pass(n: usize) -> Vec<App> {
    (0..n).map(|_| Box::new(PassThrough) as App).collect()
}

fn tls13_suites() -> impl Iterator<Item = (TlsVersion, mbx_record::CipherSuite)> {
    SUITES
        .iter()
        .copied()
        .filter(|(v, _)| *v == TlsVersion::Tls13)
}

fn relay_events(chain: &mut Chain, i: usize) -> Vec<RelayEvent> {
    std::iter::from_fn(|| chain.mbox(i).poll_event()).collect()
}

/// Data in both directions, a KeyUpdate from each endpoint (the server's asks the client to
/// update too, which it does), three generations in all, through 0 to 4 middleboxes and
/// whichever way records are delivered (copied, lent, passed on in place).
#[test]
fn key_updates_cross_every_hop_and_data_keeps_flowing() {
    for (v, s) in tls13_suites() {
        for (n_client, n_server) in [(0, 0), (1, 0), (0, 1), (2, 2)] {
            for mode in 0..3 {
                let mut chain = Chain::new(v, s, pass(n_client), pass(n_server));
                chain.chunking = vec![100, 7, 20_000];
                chain.in_place = mode > 0;
                chain.lending = mode == 2;
                let n = n_client + n_server;
                let before: Vec<_> = (0..n)
                    .map(|i| chain.mbox(i).key_fingerprints(Side::Client))
                    .collect();
                let mut sent_c2s = Vec::new();
                let mut sent_s2c = Vec::new();
                for round in 0..3u8 {
                    let c2s = vec![round; 20_000];
                    let s2c = vec![round + 100; 300];
                    chain.client().write(&c2s).unwrap();
                    chain.server().write(&s2c).unwrap();
                    match round {
                        0 => chain.client().update_keys(false).unwrap(),
                        1 => chain.server().update_keys(true).unwrap(),
                        _ => chain.client().update_keys(false).unwrap(),
                    }
                    // Data right behind the KeyUpdate, under the new keys.
                    chain.client().write(&c2s).unwrap();
                    chain.server().write(&s2c).unwrap();
                    chain.pump();
                    sent_c2s.extend([c2s.clone(), c2s].concat());
                    sent_s2c.extend([s2c.clone(), s2c].concat());
                }
                let what = format!("{s:?} {n_client}+{n_server} mode {mode}");
                assert_eq!(chain.server().take_plaintext(), sent_c2s, "{what}");
                assert_eq!(chain.client().take_plaintext(), sent_s2c, "{what}");
                let updates = |events: Vec<EndpointEvent>| -> Vec<bool> {
                    events
                        .into_iter()
                        .filter_map(|e| match e {
                            EndpointEvent::PeerUpdatedKeys { requested } => Some(requested),
                            EndpointEvent::Failed { what, .. } => panic!("{what}"),
                            _ => None,
                        })
                        .collect()
                };
                // The server saw the client's two and the client's answer to its request.
                let server_saw =
                    updates(std::iter::from_fn(|| chain.server().poll_event()).collect());
                assert_eq!(server_saw, vec![false, false, false], "{what}");
                let client_saw =
                    updates(std::iter::from_fn(|| chain.client().poll_event()).collect());
                assert_eq!(client_saw, vec![true], "{what}");
                for (i, was) in before.iter().enumerate() {
                    let followed = relay_events(&mut chain, i)
                        .into_iter()
                        .filter(|e| matches!(e, RelayEvent::KeysUpdated { .. }))
                        .count();
                    assert_eq!(followed, 4, "{what} middlebox {i}");
                    assert!(!chain.mbox(i).is_failed());
                    // Both directions of its client-side hop have new keys.
                    let now = chain.mbox(i).key_fingerprints(Side::Client);
                    assert!(now.0 != was.0 && now.1 != was.1, "{what}");
                }
                chain.client().close().unwrap();
                chain.server().close().unwrap();
                chain.pump();
                assert!(chain.server().peer_closed() && chain.client().peer_closed());
            }
        }
    }
}

/// A peer that asks for our KeyUpdate again and again while we write nothing gets one
/// answer, sent before our next data (RFC 8446 §4.6.3), instead of one queued per request
/// toward a peer that may never read them; once we wrote under our current keys, a request is
/// answered at once.
#[test]
fn requests_to_a_silent_endpoint_get_one_answer_before_its_next_data() {
    for (v, s) in tls13_suites() {
        for n_mbs in [0, 1] {
            let mut chain = Chain::new(v, s, pass(n_mbs), Vec::new());
            let answers = |chain: &mut Chain| -> usize {
                std::iter::from_fn(|| chain.client().poll_event())
                    .filter(|e| matches!(e, EndpointEvent::PeerUpdatedKeys { requested: false }))
                    .count()
            };
            for _ in 0..100 {
                chain.client().update_keys(true).unwrap();
            }
            chain.pump();
            assert_eq!(
                answers(&mut chain),
                0,
                "{s:?}: the server wrote nothing yet"
            );
            chain.server().write(b"first words").unwrap();
            chain.pump();
            assert_eq!(answers(&mut chain), 1, "{s:?}");
            assert_eq!(chain.client().take_plaintext(), b"first words");
            // "first words" went under the current keys: the next request is answered at once,
            // the one after it (nothing written since) again waits.
            chain.client().update_keys(true).unwrap();
            chain.pump();
            assert_eq!(answers(&mut chain), 1, "{s:?}");
            chain.client().update_keys(true).unwrap();
            chain.pump();
            assert_eq!(answers(&mut chain), 0, "{s:?}: nothing written since");
            chain.server().write(b"more").unwrap();
            chain.pump();
            assert_eq!(answers(&mut chain), 1, "{s:?}");
            assert_eq!(chain.client().take_plaintext(), b"more");
            assert!((0..n_mbs).all(|i| !chain.mbox(i).is_failed()));
        }
    }
}

/// TLS 1.2 has no KeyUpdate: asking for one is an error, and the session goes on.
#[test]
fn tls12_refuses_to_update_keys() {
    for &(v, s) in SUITES.iter().filter(|(v, _)| *v == TlsVersion::Tls12) {
        let mut chain = Chain::new(v, s, pass(1), pass(1));
        assert!(matches!(
            chain.client().update_keys(true),
            Err(MbtlsError::KeyMaterial(_))
        ));
        chain.client().write(b"still fine").unwrap();
        chain.pump();
        assert_eq!(chain.server().take_plaintext(), b"still fine");
    }
}

/// A relay under fresh key material (TLS 1.3) and a sealer for what its client sends.
fn relay_and_client() -> (MiddleboxRelay<App>, RecordSealer) {
    let (relay, keys, _) = common::lone_relay(Box::new(PassThrough));
    let c2s = &keys.endpoint.c2s;
    let client = RecordSealer::new(TlsVersion::Tls13, c2s.keys.clone(), c2s.next_seq);
    (relay, client)
}

/// A record from the client with the given handshake bytes, sealed for a relay under fresh key
/// material; returns the relay after it received the record.
fn relay_after_handshake_record(body: &[u8]) -> MiddleboxRelay<App> {
    let (mut relay, mut client) = relay_and_client();
    let mut wire = Vec::new();
    client
        .seal(ContentType::HANDSHAKE, body, &mut wire)
        .unwrap();
    relay.receive(Side::Client, &wire);
    relay
}

/// A KeyUpdate must end its record and carry 0 or 1: otherwise the middlebox ends the session
/// toward both sides and forwards nothing of it.
#[test]
fn a_key_update_that_breaks_the_rules_ends_the_session() {
    let ticket = [4u8, 0, 0, 1, 0];
    for (body, alert) in [
        (
            [&[24u8, 0, 0, 1, 0][..], &ticket].concat(),
            AlertDescription::UNEXPECTED_MESSAGE,
        ),
        (
            vec![24, 0, 0, 1, 0, 4, 0],
            AlertDescription::UNEXPECTED_MESSAGE,
        ),
        (vec![24, 0, 0, 1, 7], AlertDescription::ILLEGAL_PARAMETER),
    ] {
        let mut relay = relay_after_handshake_record(&body);
        assert!(relay.is_failed(), "{body:?}");
        let events: Vec<_> = std::iter::from_fn(|| relay.poll_event()).collect();
        assert!(
            matches!(
                events.as_slice(),
                [RelayEvent::Failed { cause: FailCause::Protocol { from: Side::Client, .. }, alert: a }]
                    if *a == Alert::fatal(alert)
            ),
            "{body:?}: {events:?}"
        );
        // Toward the server: the alert only (one short record), not the handshake record.
        assert_eq!(common::records(&relay.take_outgoing(Side::Server)).len(), 1);
    }
    // The same bytes split well are fine: a ticket, then a KeyUpdate ending its record.
    let relay = relay_after_handshake_record(&[&ticket[..], &[24, 0, 0, 1, 1]].concat());
    assert!(!relay.is_failed());
}

/// A NewSessionTicket comes from servers only (RFC 8446 §4.6.1): a server endpoint that gets
/// one ends the session with `unexpected_message`; a client takes it.
#[test]
fn a_session_ticket_from_the_client_ends_the_session() {
    let ticket = [4u8, 0, 0, 1, 0];
    for role in [Role::Server, Role::Client] {
        let (_, keys, _) = common::lone_relay(Box::new(PassThrough));
        let hop = keys.endpoint;
        // What the endpoint's peer sends, sealed under the peer's write keys.
        let from = match role {
            Role::Server => &hop.c2s,
            Role::Client => &hop.s2c,
        };
        let mut peer = RecordSealer::new(TlsVersion::Tls13, from.keys.clone(), from.next_seq);
        let mut end = EndpointDataPhase::new(role, TlsVersion::Tls13, hop.clone());
        let mut wire = Vec::new();
        peer.seal(ContentType::HANDSHAKE, &ticket, &mut wire)
            .unwrap();
        end.receive(&wire);
        let events: Vec<_> = std::iter::from_fn(|| end.poll_event()).collect();
        match role {
            Role::Server => assert_eq!(
                end.failure(),
                Some(Alert::fatal(AlertDescription::UNEXPECTED_MESSAGE)),
                "{events:?}"
            ),
            Role::Client => {
                assert_eq!(end.failure(), None);
                assert_eq!(events, [EndpointEvent::SessionTicketIgnored]);
            }
        }
    }
}

/// An idle relay gives back the buffer in which it reassembled post-handshake messages, once it
/// holds no partial one; a partial one is kept.
#[test]
fn an_idle_relay_gives_back_its_post_handshake_buffer() {
    let ticket = [4u8, 0, 0, 3, 7, 7, 7];
    let (mut relay, mut client) = relay_and_client();
    for (piece, partial) in [(&ticket[..3], true), (&ticket[3..], false)] {
        let mut wire = Vec::new();
        client
            .seal(ContentType::HANDSHAKE, piece, &mut wire)
            .unwrap();
        relay.receive(Side::Client, &wire);
        relay.take_outgoing(Side::Server);
        assert!(relay.held_capacity() > 0);
        relay.release_idle_buffers();
        assert_eq!(relay.held_capacity() > 0, partial, "{piece:?}");
    }
    assert!(!relay.is_failed());
}

/// A handshake message split over records must not have a record of another type inside it
/// (RFC 8446 §5.1): a data record or a close_notify there ends the session with
/// `unexpected_message`, at a middlebox and at an endpoint; the same message whole, or split
/// with nothing between its pieces, passes (thirty-third round: an adversarial trial split a
/// KeyUpdate around a data record, and a message around a close_notify, and both went through).
/// The record refused so was opened first: its plaintext is wiped from a buffer received in
/// place, as any record's (thirty-fourth round, from a code audit: it stayed).
#[test]
fn a_record_inside_a_split_handshake_message_ends_the_session() {
    let ku = [24u8, 0, 0, 1, 0];
    let data = &b"GET /a-request-line-that-must-not-stay-in-the-buffer"[..];
    let left_in = |buffer: &[u8]| buffer.windows(data.len()).any(|w| w == data);
    for (between, fails) in [
        (Some((ContentType::APPLICATION_DATA, data)), true),
        (Some((ContentType::ALERT, &[1u8, 0][..])), true),
        (None, false),
    ] {
        // The records a peer sends: the message's first two bytes, what comes between, the rest.
        let wire = |sealer: &mut RecordSealer| {
            let mut wire = Vec::new();
            sealer
                .seal(ContentType::HANDSHAKE, &ku[..2], &mut wire)
                .unwrap();
            if let Some((ct, body)) = between {
                sealer.seal(ct, body, &mut wire).unwrap();
            }
            sealer
                .seal(ContentType::HANDSHAKE, &ku[2..], &mut wire)
                .unwrap();
            wire
        };
        let what = format!("{between:?}");
        let (mut relay, mut client) = relay_and_client();
        let mut bytes = wire(&mut client);
        relay.receive_in_place(Side::Client, &mut bytes);
        assert!(!left_in(&bytes), "{what}");
        assert_eq!(relay.is_failed(), fails, "{what}");
        if fails {
            let events: Vec<_> = std::iter::from_fn(|| relay.poll_event()).collect();
            assert!(
                events.iter().any(|e| matches!(e,
                    RelayEvent::Failed { alert, .. }
                        if *alert == Alert::fatal(AlertDescription::UNEXPECTED_MESSAGE))),
                "{what}: {events:?}"
            );
        }
        let (_, keys, _) = common::lone_relay(Box::new(PassThrough));
        let hop = keys.endpoint;
        let mut peer = RecordSealer::new(TlsVersion::Tls13, hop.c2s.keys.clone(), hop.c2s.next_seq);
        let mut end = EndpointDataPhase::new(Role::Server, TlsVersion::Tls13, hop.clone());
        let mut bytes = wire(&mut peer);
        end.receive_in_place(&mut bytes);
        assert!(!left_in(&bytes), "{what}");
        let failed = Some(Alert::fatal(AlertDescription::UNEXPECTED_MESSAGE));
        assert_eq!(end.failure(), if fails { failed } else { None }, "{what}");
    }
}
