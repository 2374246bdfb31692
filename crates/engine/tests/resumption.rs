//! Client session resumption in the OpenSSL engine (`TlsConfig::resume_sessions`): what is
//! kept, for which name, how often a TLS 1.3 ticket is offered, and that a resumed session
//! exports exact keys like a full one.

mod common;

use common::{check_exact, pump, split_records, transfer, Pki, HOST, V12, V13};
use mbx_engine::{OpenSslContext, OpenSslEngine, TlsConfig, TlsEngine};
use mbx_record::{ContentType, RecordOpener, TlsVersion};
use mbx_testbed::pki::LeafSpec;

const OTHER: &str = "other.mbx.test";

fn contexts(pki: &Pki, v: TlsVersion, names: usize) -> (OpenSslContext, OpenSslContext) {
    contexts_with(pki, v, names, true)
}

/// [`contexts`]; `tickets: false`: the server issues none (TLS 1.2 resumes by session ID).
fn contexts_with(
    pki: &Pki,
    v: TlsVersion,
    names: usize,
    tickets: bool,
) -> (OpenSslContext, OpenSslContext) {
    let mut c = pki.client_config().only(v);
    c.resume_sessions = names;
    let mut s = pki.server_config().only(v);
    s.session_tickets = tickets;
    (
        OpenSslContext::new(&c).expect("client context"),
        OpenSslContext::new(&s).expect("server context"),
    )
}

/// One connection with `name`, closed by both sides; returns (client resumed, server
/// resumed). The pump runs until both are quiet, so TLS 1.3 tickets sent after the handshake
/// have reached the client.
fn connect(client: &OpenSslContext, server: &OpenSslContext, name: &str) -> (bool, bool) {
    let (mut c, mut s) = engines(client, server, name);
    pump(&mut c, &mut s).expect("handshake");
    close(&mut c, &mut s);
    (c.session_reused(), s.session_reused())
}

/// close_notify both ways: OpenSSL does not resume a session whose connection it freed
/// without having sent one (RFC 5246 §7.2.2's rule, which it applies to every version).
fn close(c: &mut OpenSslEngine, s: &mut OpenSslEngine) {
    c.close().expect("client close");
    s.feed(&c.take_outgoing());
    s.process().expect("server reads close_notify");
    s.close().expect("server close");
    c.feed(&s.take_outgoing());
    c.process().expect("client reads close_notify");
}

fn engines(
    client: &OpenSslContext,
    server: &OpenSslContext,
    name: &str,
) -> (OpenSslEngine, OpenSslEngine) {
    (
        client.engine_for(Some(name)).expect("client engine"),
        server.engine().expect("server engine"),
    )
}

#[test]
fn a_client_resumes_with_the_same_server_both_versions() {
    let pki = Pki::new();
    for v in [V12, V13] {
        let (client, server) = contexts(&pki, v, 8);
        assert_eq!(connect(&client, &server, HOST), (false, false), "{v:?}");
        assert_eq!(connect(&client, &server, HOST), (true, true), "{v:?}");
        assert_eq!(connect(&client, &server, HOST), (true, true), "{v:?}");
    }
    // TLS 1.2 without tickets: the server's session ID.
    let (client, server) = contexts_with(&pki, V12, 8, false);
    assert_eq!(connect(&client, &server, HOST), (false, false));
    assert_eq!(connect(&client, &server, HOST), (true, true));
}

#[test]
fn without_resume_sessions_every_handshake_is_full() {
    let pki = Pki::new();
    for v in [V12, V13] {
        let (client, server) = contexts(&pki, v, 0);
        for _ in 0..2 {
            assert_eq!(connect(&client, &server, HOST), (false, false), "{v:?}");
        }
    }
}

#[test]
fn a_tls13_ticket_is_offered_once() {
    let pki = Pki::new();
    let (client, server) = contexts(&pki, V13, 8);
    // OpenSSL servers send two tickets after a full handshake.
    connect(&client, &server, HOST);
    // Three connections made before any of them runs: two tickets, two resumptions.
    let mut pairs: Vec<_> = (0..3).map(|_| engines(&client, &server, HOST)).collect();
    let reused: Vec<bool> = pairs
        .iter_mut()
        .map(|(c, s)| {
            pump(c, s).expect("handshake");
            close(c, s);
            c.session_reused()
        })
        .collect();
    assert_eq!(reused, [true, true, false]);
}

#[test]
fn sessions_are_kept_per_name_and_the_oldest_name_goes_first() {
    let mut pki = Pki::new();
    pki.server = pki
        .ca
        .issue(&LeafSpec::server(HOST).dns(OTHER))
        .expect("server cert with two names");
    for v in [V12, V13] {
        let (client, server) = contexts(&pki, v, 1);
        connect(&client, &server, HOST);
        // A session is offered only to the name it was made with.
        assert!(!connect(&client, &server, OTHER).0, "{v:?}");
        // One name kept: OTHER's session pushed HOST's out.
        assert!(!connect(&client, &server, HOST).0, "{v:?}");
        assert!(connect(&client, &server, HOST).0, "{v:?}");
    }
}

#[test]
fn a_resumed_session_exports_exact_keys_both_versions() {
    let pki = Pki::new();
    for v in [V12, V13] {
        let (client, server) = contexts(&pki, v, 8);
        connect(&client, &server, HOST);
        let (mut c, mut s) = engines(&client, &server, HOST);
        pump(&mut c, &mut s).expect("resumed handshake");
        assert!(c.session_reused() && s.session_reused(), "{v:?}");
        transfer(&mut s, &mut c, b"resumed");
        let (ch, sh) = (c.export_session().unwrap(), s.export_session().unwrap());
        check_exact(&ch, &sh);
    }
}

#[test]
fn a_server_that_refuses_the_session_gets_a_full_handshake() {
    let pki = Pki::new();
    for v in [V12, V13] {
        let (client, server) = contexts(&pki, v, 8);
        connect(&client, &server, HOST);
        // Another server with the same certificate but its own ticket keys and cache.
        let other_server = OpenSslContext::new(&pki.server_config().only(v)).unwrap();
        assert_eq!(
            connect(&client, &other_server, HOST),
            (false, false),
            "{v:?}"
        );
        // Its session replaced the refused one.
        assert_eq!(connect(&client, &other_server, HOST), (true, true), "{v:?}");
    }
}

/// `resume_sessions` is a client setting: a server context given it keeps OpenSSL's server
/// cache (a client's cache mode would replace it), so TLS 1.2 clients still resume by session ID.
#[test]
fn server_contexts_ignore_resume_sessions() {
    let pki = Pki::new();
    let mut c = pki.client_config().only(V12);
    c.resume_sessions = 8;
    let mut s: TlsConfig = pki.server_config().only(V12);
    s.session_tickets = false;
    s.resume_sessions = 8;
    let (client, server) = (
        OpenSslContext::new(&c).unwrap(),
        OpenSslContext::new(&s).unwrap(),
    );
    assert_eq!(connect(&client, &server, HOST), (false, false));
    assert_eq!(connect(&client, &server, HOST), (true, true));
}

/// TLS 1.2: a connection OpenSSL frees before its close_notify leaves a session it will not
/// resume, but an exported one has not ended (its keys went on elsewhere): its session stays
/// until the owner of those keys forgets it.
#[test]
fn an_exported_tls12_session_is_resumed_until_forgotten() {
    let pki = Pki::new();
    let (client, server) = contexts(&pki, V12, 8);
    // Dropped without close_notify: not resumable.
    let (mut c, mut s) = engines(&client, &server, HOST);
    pump(&mut c, &mut s).unwrap();
    drop((c, s));
    assert!(!connect(&client, &server, HOST).0);
    // Exported, then dropped: resumable.
    let (mut c, mut s) = engines(&client, &server, HOST);
    pump(&mut c, &mut s).unwrap();
    assert!(c.session_reused(), "the closed connection's session");
    c.export_session().unwrap();
    assert_eq!(connect(&client, &server, HOST), (true, true));
    // Forgotten (the exported session failed): a full handshake.
    client.forget_sessions(HOST);
    assert!(!connect(&client, &server, HOST).0);
    assert!(connect(&client, &server, HOST).0);
}

/// TLS 1.2: a connection made before its session was forgotten (a session that failed
/// elsewhere) still resumes it, but does not bring it back when it ends: the next connection
/// makes a full handshake. (Before, the connection's end kept the session again, and a
/// client proxy with several connections to one server resumed a failed session.)
#[test]
fn a_forgotten_tls12_session_is_not_brought_back_by_a_connection_made_before() {
    let pki = Pki::new();
    for tickets in [true, false] {
        let (client, server) = contexts_with(&pki, V12, 8, tickets);
        assert_eq!(connect(&client, &server, HOST), (false, false));
        let (mut c, mut s) = engines(&client, &server, HOST);
        client.forget_sessions(HOST);
        pump(&mut c, &mut s).unwrap();
        close(&mut c, &mut s);
        assert!(c.session_reused(), "offered before the forget");
        assert_eq!(
            connect(&client, &server, HOST),
            (false, false),
            "tickets {tickets}"
        );
        assert!(connect(&client, &server, HOST).0);
    }
}

/// A connection that fails (here an altered record from the server) leaves nothing of its
/// server's to resume, TLS 1.3 tickets included: OpenSSL marks only the connection's own
/// session, and the tickets the store kept are copies of it.
#[test]
fn a_failed_connection_leaves_no_session_to_resume_both_versions() {
    let pki = Pki::new();
    for v in [V12, V13] {
        let (client, server) = contexts(&pki, v, 8);
        assert_eq!(connect(&client, &server, HOST), (false, false));
        let (mut c, mut s) = engines(&client, &server, HOST);
        pump(&mut c, &mut s).unwrap();
        assert!(c.session_reused(), "{v:?}");
        s.write_plaintext(b"hello").unwrap();
        let mut record = s.take_outgoing();
        *record.last_mut().unwrap() ^= 1;
        c.feed(&record);
        assert!(c.process().is_err(), "{v:?}");
        drop((c, s));
        // Connections made before any of them runs take whatever the store still offers.
        let mut pairs: Vec<_> = (0..3).map(|_| engines(&client, &server, HOST)).collect();
        for (c, s) in &mut pairs {
            pump(c, s).unwrap();
            assert!(!c.session_reused(), "{v:?}");
        }
    }
}

/// The handshake messages in `plaintext` (whole messages; 4-byte headers).
fn messages(mut plaintext: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    while plaintext.len() >= 4 {
        let len = 4
            + (usize::from(plaintext[1]) << 16 | usize::from(plaintext[2]) << 8)
            + usize::from(plaintext[3]);
        out.push(plaintext[..len].to_vec());
        plaintext = &plaintext[len..];
    }
    assert!(plaintext.is_empty());
    out
}

/// TLS 1.3: the server's tickets arrive after a client exported its session (an mbTLS client
/// whose keys went to its record layer). Opened by that record layer and given to the export's
/// ticket sink, they become sessions the next connection resumes; without the sink they are
/// lost. A message that is not a ticket is refused.
#[test]
fn tickets_that_arrive_after_the_export_become_sessions_through_the_sink() {
    let pki = Pki::new();
    let mut c = pki.client_config().only(V13);
    c.resume_sessions = 8;
    c.pause_after_handshake = true;
    let client = OpenSslContext::new(&c).unwrap();
    let server = OpenSslContext::new(&pki.server_config().only(V13)).unwrap();
    for keep in [false, true] {
        let (mut c, mut s) = engines(&client, &server, HOST);
        c.process().unwrap();
        s.feed(&c.take_outgoing());
        s.process().unwrap();
        c.feed(&s.take_outgoing());
        c.process().unwrap();
        assert!(!c.is_handshaking());
        // The client's Finished leaves with the export; the server answers it with tickets.
        let (handoff, after) = c.export_for_resumption().unwrap();
        let sink = after.tickets;
        assert!(handoff.unprocessed_incoming.is_empty());
        s.feed(&handoff.pending_outgoing);
        s.process().unwrap();
        let rx = &handoff.session.rx;
        let mut opener = RecordOpener::new(V13, rx.keys.clone(), rx.next_seq);
        let mut tickets = Vec::new();
        for rec in split_records(&s.take_outgoing()) {
            let opened = opener.open(&rec).unwrap();
            assert_eq!(opened.content_type, ContentType::HANDSHAKE);
            tickets.extend(messages(&opened.plaintext));
        }
        assert_eq!(tickets.len(), 2, "OpenSSL's two tickets");
        let mut sink = sink.expect("a sink for a resuming TLS 1.3 client");
        assert!(sink.take(b"\x18\x00\x00\x01\x00").is_err(), "a KeyUpdate");
        if keep {
            for t in &tickets {
                sink.take(t).unwrap();
            }
        }
        drop(sink);
        assert_eq!(connect(&client, &server, HOST).0, keep);
    }
}

/// A connection whose peer closed it with close_notify keeps its session when we only mark it
/// (`keep_session`), without a close_notify of ours; dropped unmarked, OpenSSL drops it.
#[test]
fn a_session_the_peer_closed_is_kept_when_marked() {
    let pki = Pki::new();
    let (client, server) = contexts_with(&pki, V12, 8, false);
    for keep in [false, true] {
        let (mut c, mut s) = engines(&client, &server, HOST);
        pump(&mut c, &mut s).unwrap();
        s.close().unwrap();
        c.feed(&s.take_outgoing());
        c.process().unwrap();
        assert!(c.peer_closed());
        if keep {
            c.keep_session();
        }
        drop((c, s));
        assert_eq!(connect(&client, &server, HOST).0, keep, "keep {keep}");
        client.forget_sessions(HOST);
    }
}

/// The rustls client resumes only what its caller vouched for
/// (`TlsEngine::vouch_for_session`), and a resumed connection gets back the note of the
/// connection whose session it resumed. Against an OpenSSL server that keeps no session cache
/// and sends one TLS 1.3 ticket on demand (an mbTLS middlebox's secondary context).
mod vouched {
    use super::*;
    use mbx_engine::{ClientContext, RustlsClientContext, SessionNote};
    use std::sync::Arc;

    fn contexts(pki: &Pki, v: TlsVersion) -> (RustlsClientContext, OpenSslContext) {
        let mut c = pki.client_config();
        c.resume_sessions = 4;
        let mut s = pki.server_config().only(v);
        s.session_cache = false;
        (
            RustlsClientContext::new(&c).expect("rustls client context"),
            OpenSslContext::new(&s).expect("server context"),
        )
    }

    /// One connection; `note`: vouch for it with this note, for good, after the handshake (and
    /// the server's ticket) went through. Returns (resumed, the resumed connection's note).
    fn connect(
        client: &RustlsClientContext,
        server: &OpenSslContext,
        name: Option<&str>,
        note: Option<u32>,
    ) -> (bool, Option<u32>) {
        connect_until(client, server, name, note.map(|n| (n, u64::MAX)), 1)
    }

    /// [`connect`] with the note's end of validity and the number of TLS 1.3 tickets the
    /// server sends.
    fn connect_until(
        client: &RustlsClientContext,
        server: &OpenSslContext,
        name: Option<&str>,
        note: Option<(u32, u64)>,
        tickets: usize,
    ) -> (bool, Option<u32>) {
        let mut c = client.client_engine(name, None).expect("client engine");
        // As an mbTLS middlebox: no TLS 1.3 ticket of its own accord, one on demand.
        let mut s = server.engine_without_tickets().expect("server engine");
        pump(c.as_mut(), &mut s).expect("handshake");
        if s.version() == Some(V13) {
            for _ in 0..tickets {
                s.send_session_ticket().expect("a ticket on demand");
            }
            pump(c.as_mut(), &mut s).expect("the ticket");
        }
        let got = c
            .resumed_note()
            .map(|n| *n.downcast::<u32>().expect("a u32 note"));
        if let Some((n, until)) = note {
            c.vouch_for_session(Arc::new(n) as SessionNote, until);
        }
        (c.session_resumed(), got)
    }

    fn now_unix() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock after 1970")
            .as_secs()
    }

    /// A session vouched for until a time already past is never offered (a full handshake
    /// follows) and leaves the store; among TLS 1.3 tickets, an older one still valid is
    /// offered though the newest is past its time.
    #[test]
    fn a_session_past_its_time_is_not_offered_both_versions() {
        let pki = Pki::new();
        let (past, future) = (now_unix() - 1, now_unix() + 3600);
        for v in [V12, V13] {
            let (client, server) = contexts(&pki, v);
            assert_eq!(
                connect_until(&client, &server, Some(HOST), Some((1, past)), 1),
                (false, None),
                "{v:?}"
            );
            assert_eq!(client.kept_sessions(HOST), 1, "{v:?}");
            assert_eq!(
                connect_until(&client, &server, Some(HOST), Some((2, future)), 1),
                (false, None),
                "{v:?}: the session past its time must not be offered"
            );
            assert_eq!(
                connect_until(&client, &server, Some(HOST), None, 1),
                (true, Some(2)),
                "{v:?}"
            );
        }
        let (client, server) = contexts(&pki, V13);
        // Two tickets valid for an hour; the connection that resumes one leaves a newer
        // ticket, vouched for until a time already past.
        connect_until(&client, &server, Some(HOST), Some((1, future)), 2);
        assert_eq!(
            connect_until(&client, &server, Some(HOST), Some((2, past)), 1),
            (true, Some(1))
        );
        assert_eq!(client.kept_sessions(HOST), 2);
        assert_eq!(
            connect_until(&client, &server, Some(HOST), None, 1),
            (true, Some(1)),
            "the older ticket, still valid, must be offered"
        );
        assert_eq!(client.kept_sessions(HOST), 0);
    }

    #[test]
    fn only_vouched_sessions_resume_and_carry_their_note_both_versions() {
        let pki = Pki::new();
        for v in [V12, V13] {
            let (client, server) = contexts(&pki, v);
            assert!(client.keeps_vouched_sessions() && !client.resumes_unvouched());
            // Not vouched for: nothing kept, the next connection is a full handshake.
            assert_eq!(
                connect(&client, &server, Some(HOST), None),
                (false, None),
                "{v:?}"
            );
            assert_eq!(client.kept_sessions(HOST), 0, "{v:?}");
            assert_eq!(
                connect(&client, &server, Some(HOST), Some(7)),
                (false, None),
                "{v:?}"
            );
            assert_eq!(client.kept_sessions(HOST), 1, "{v:?}");
            // Resumed with the note of the connection it came from; vouched again with it.
            assert_eq!(
                connect(&client, &server, Some(HOST), Some(7)),
                (true, Some(7)),
                "{v:?}"
            );
            assert_eq!(
                connect(&client, &server, Some(HOST), Some(9)),
                (true, Some(7)),
                "{v:?}"
            );
            assert_eq!(
                connect(&client, &server, Some(HOST), None),
                (true, Some(9)),
                "{v:?}"
            );
            // TLS 1.3: that one's ticket was not vouched for and each is offered once; TLS
            // 1.2: the session stays as long as the server takes it.
            let expect_next = match v {
                V12 => (true, Some(9)),
                _ => (false, None),
            };
            assert_eq!(
                connect(&client, &server, Some(HOST), None),
                expect_next,
                "{v:?}"
            );
        }
    }

    #[test]
    fn a_session_without_a_configured_name_never_resumes() {
        let pki = Pki::new();
        let (client, server) = contexts(&pki, V13);
        for _ in 0..3 {
            assert_eq!(connect(&client, &server, None, Some(1)), (false, None));
        }
        assert_eq!(client.kept_sessions(HOST), 0);
    }

    #[test]
    fn a_context_without_resume_sessions_keeps_nothing() {
        let pki = Pki::new();
        let (_, server) = contexts(&pki, V13);
        let client = RustlsClientContext::new(&pki.client_config()).expect("context");
        assert!(!client.keeps_vouched_sessions());
        for _ in 0..3 {
            assert_eq!(
                connect(&client, &server, Some(HOST), Some(1)),
                (false, None)
            );
        }
    }
}

/// Servers whose tickets are sealed under keys the context replaces
/// (`TlsConfig::ticket_key_rotation`), with no session cache, so that only tickets resume.
/// A server that verifies clients' certificates resumes their sessions like any other (OpenSSL
/// refuses fatally, not as a miss, to resume on such a server unless its sessions carry a
/// context id).
#[test]
fn a_server_verifying_clients_resumes_their_sessions_both_versions() {
    let pki = Pki::new();
    for v in [V12, V13] {
        let mut c = pki.client_config().only(v);
        c.resume_sessions = 8;
        c.identity = Some(pki.client_identity());
        let client = OpenSslContext::new(&c).expect("client context");
        let mut s = pki.server_config().only(v);
        s.verify_peer = true;
        s.trust_roots_pem = Some(pki.roots());
        let verifying = OpenSslContext::new(&s).expect("server context");
        assert_eq!(connect(&client, &verifying, HOST), (false, false), "{v:?}");
        assert_eq!(connect(&client, &verifying, HOST), (true, true), "{v:?}");
        assert_eq!(connect(&client, &verifying, HOST), (true, true), "{v:?}");
    }
}

mod ticket_key_rotation {
    use super::*;
    use std::time::Duration;

    fn rotating_server(pki: &Pki, v: TlsVersion) -> OpenSslContext {
        let mut s = pki.server_config().only(v);
        s.session_cache = false;
        s.ticket_key_rotation = Some(Duration::from_secs(3600));
        OpenSslContext::new(&s).expect("server context")
    }

    /// A client that resumes, as the other tests make it.
    fn client(pki: &Pki, v: TlsVersion) -> OpenSslContext {
        contexts(pki, v, 8).0
    }

    /// A ticket opens under its own key and, after one rotation, under the previous one; two
    /// rotations after its key's period began it does not, and the handshake is a full one.
    /// A resumed session leaves a ticket under the current key, which survives one more
    /// rotation: TLS 1.3 tickets come after every handshake; a TLS 1.2 ticket opened under the
    /// previous key is renewed in the resumed handshake, and the client must keep the renewed
    /// one (OpenSSL reports no session from a resumed TLS 1.2 handshake), or its old ticket
    /// dies with the second rotation.
    #[test]
    fn a_ticket_opens_for_its_period_and_the_next_both_versions() {
        let pki = Pki::new();
        for v in [V12, V13] {
            let (client, server) = (client(&pki, v), rotating_server(&pki, v));
            assert_eq!(connect(&client, &server, HOST), (false, false), "{v:?}");
            assert_eq!(connect(&client, &server, HOST), (true, true), "{v:?}");
            assert!(server.rotate_ticket_keys().expect("rotate"));
            assert_eq!(
                connect(&client, &server, HOST),
                (true, true),
                "{v:?}: the previous key must still open"
            );
            server.rotate_ticket_keys().expect("rotate");
            assert_eq!(
                connect(&client, &server, HOST),
                (true, true),
                "{v:?}: the ticket given on the last resumption must open"
            );
            server.rotate_ticket_keys().expect("rotate");
            server.rotate_ticket_keys().expect("rotate");
            assert_eq!(
                connect(&client, &server, HOST),
                (false, false),
                "{v:?}: a key two periods old must be gone"
            );
            assert_eq!(connect(&client, &server, HOST), (true, true), "{v:?}");
        }
    }

    /// Each context has keys of its own: another server with the same certificate cannot open
    /// the first one's tickets, and a context with OpenSSL's own key has nothing to rotate.
    #[test]
    fn keys_belong_to_their_context() {
        let pki = Pki::new();
        let client = client(&pki, V13);
        let (first, second) = (rotating_server(&pki, V13), rotating_server(&pki, V13));
        connect(&client, &first, HOST);
        assert_eq!(connect(&client, &second, HOST), (false, false));
        let plain = OpenSslContext::new(&pki.server_config()).expect("server context");
        assert!(!plain.rotate_ticket_keys().expect("no keys to rotate"));
    }
}
