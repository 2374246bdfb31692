//! What the OpenSSL engine hands a caller's record layer: no export it could not take up
//! exactly, and a sealed alert at OpenSSL's next sequence number.

mod common;

use common::{pump, Pki, HOST, SUITES, V12, V13};
use mbx_engine::{AlertDescription, EngineError, OpenSslContext, OpenSslEngine, TlsEngine};
use mbx_record::{ContentType, RecordSealer};

/// A TLS 1.3 NewSessionTicket (RFC 8446 §4.6.1): lifetime, age add, a one-byte nonce, a
/// 32-byte ticket, no extensions.
fn new_session_ticket() -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&7200u32.to_be_bytes());
    body.extend_from_slice(&0x0102_0304u32.to_be_bytes());
    body.extend_from_slice(&[1, 0]);
    body.extend_from_slice(&32u16.to_be_bytes());
    body.extend_from_slice(&[0x5a; 32]);
    body.extend_from_slice(&0u16.to_be_bytes());
    let len = u32::try_from(body.len()).unwrap().to_be_bytes();
    let mut msg = vec![4, len[1], len[2], len[3]];
    msg.extend_from_slice(&body);
    msg
}

/// An engine that reads on after its handshake (not paused, as BlindBox's and the first
/// demo's are) and has taken the first of two records that carry one post-handshake message
/// holds that part inside OpenSSL: its export is refused (the record layer would take the
/// second part for the start of a message). With both parts read, the export goes ahead.
#[test]
fn an_export_while_openssl_holds_part_of_a_post_handshake_message_is_refused() {
    let pki = Pki::new();
    let client = OpenSslContext::new(&pki.client_config().only(V13)).unwrap();
    let mut server_cfg = pki.server_config().only(V13);
    server_cfg.session_tickets = false;
    let server = OpenSslContext::new(&server_cfg).unwrap();
    let ticket = new_session_ticket();
    for whole in [false, true] {
        let mut c = client.engine().unwrap();
        let mut s = server.engine().unwrap();
        pump(&mut c, &mut s).unwrap();
        assert!(!c.is_handshaking() && !s.is_handshaking());
        let tx = s.export_session().unwrap().session.tx;
        let mut sealer = RecordSealer::new(V13, tx.keys, tx.next_seq);
        let mut records = Vec::new();
        for part in [&ticket[..10], &ticket[10..]] {
            sealer
                .seal(ContentType::HANDSHAKE, part, &mut records)
                .unwrap();
        }
        let first_len = 5 + usize::from(u16::from_be_bytes([records[3], records[4]]));
        let fed = if whole {
            &records[..]
        } else {
            &records[..first_len]
        };
        c.feed(fed);
        c.process().unwrap();
        match (whole, c.export_session()) {
            (true, Ok(h)) => assert_eq!(h.session.rx.next_seq, 2),
            (false, Err(EngineError::InexactExport(why))) => {
                assert!(why.contains("post-handshake message"), "{why}")
            }
            (_, r) => panic!("whole={whole}: {:?}", r.map(|h| h.session.rx.next_seq)),
        }
    }
}

/// After the handshake an engine seals a fatal alert under its write keys at OpenSSL's next
/// sequence number (after the tickets its server sent), which the peer's OpenSSL reads as that
/// alert, with each version and AEAD; without the key log a TLS 1.3 engine refuses.
#[test]
fn a_sealed_alert_is_read_by_the_peer_as_that_alert() {
    let pki = Pki::new();
    for (version, suite) in SUITES {
        let client = OpenSslContext::new(&pki.client_config().only(version)).unwrap();
        let mut server_cfg = pki.server_config().only(version);
        server_cfg.cipher_suites = vec![suite];
        let server = OpenSslContext::new(&server_cfg).unwrap();
        let (mut c, mut s) = (client.engine().unwrap(), server.engine().unwrap());
        pump(&mut c, &mut s).unwrap();
        // One record more under the same keys, so that the sequence number is not 0.
        s.write_plaintext(b"first").unwrap();
        let alert = s.fatal_alert(AlertDescription::HANDSHAKE_FAILURE).unwrap();
        let mut records = s.take_outgoing();
        records.extend_from_slice(&alert);
        c.feed(&records);
        let err = c.process().unwrap_err().to_string();
        assert!(
            err.contains("handshake_failure"),
            "{version:?} {suite:#x}: {err}"
        );
        assert_eq!(c.take_plaintext(), b"first");
    }
    let client = OpenSslContext::new(&pki.client_config().only(V13)).unwrap();
    let plain = OpenSslContext::new(&pki.server_config().only(V13).without_export()).unwrap();
    let (mut c, mut s) = (client.engine().unwrap(), plain.engine().unwrap());
    pump(&mut c, &mut s).unwrap();
    assert!(matches!(
        s.fatal_alert(AlertDescription::HANDSHAKE_FAILURE),
        Err(EngineError::Unsupported(_))
    ));
}

/// `c` sends its hello, `s` answers with its first flight and then a fatal
/// `handshake_failure`, which `c` reads as that alert after the flight; the alert's record.
fn alert_after_first_flight(c: &mut OpenSslEngine, s: &mut OpenSslEngine) -> Vec<u8> {
    c.process().unwrap();
    s.feed(&c.take_outgoing());
    s.process().unwrap();
    let flight = s.take_outgoing();
    let alert = s.fatal_alert(AlertDescription::HANDSHAKE_FAILURE).unwrap();
    c.feed(&flight);
    c.feed(&alert);
    let err = c.process().unwrap_err().to_string();
    assert!(err.contains("handshake_failure"), "{err}");
    alert
}

/// TLS 1.3, a server whose first flight is a HelloRetryRequest (it takes only P-384, the
/// client sent an X25519 key share) has no keys yet: its alert is in plaintext, which the
/// client reads as `handshake_failure` (before the twenty-sixth round: an error, no alert).
#[test]
fn a_tls13_alert_after_a_hello_retry_request_is_in_plaintext() {
    let pki = Pki::new();
    let client = OpenSslContext::new(&pki.client_config().only(V13)).unwrap();
    let mut server_cfg = pki.server_config().only(V13);
    server_cfg.groups = vec!["P-384".into()];
    let server = OpenSslContext::new(&server_cfg).unwrap();
    let (mut c, mut s) = (
        client.engine_for(Some(HOST)).unwrap(),
        server.engine().unwrap(),
    );
    let plain = alert_after_first_flight(&mut c, &mut s);
    assert_eq!(plain, [0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 40]);
}

/// TLS 1.2, the other two states: a server that has sent its first flight and not yet its
/// ChangeCipherSpec answers in plaintext (the exact record); a resumed one, whose
/// ChangeCipherSpec goes first, seals under the resumed session's keys. The client reads
/// `handshake_failure` either way.
#[test]
fn a_tls12_alert_is_in_plaintext_before_our_change_cipher_spec_and_sealed_after() {
    let pki = Pki::new();
    let mut client_cfg = pki.client_config().only(V12);
    client_cfg.resume_sessions = 4;
    let client = OpenSslContext::new(&client_cfg).unwrap();
    let server = OpenSslContext::new(&pki.server_config().only(V12)).unwrap();
    let engines = || {
        (
            client.engine_for(Some(HOST)).unwrap(),
            server.engine().unwrap(),
        )
    };

    // A full handshake, the server's first flight out.
    let (mut c, mut s) = engines();
    let plain = alert_after_first_flight(&mut c, &mut s);
    assert_eq!(plain, [0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 40]);

    // A session to resume, then a resumed handshake: the server's CCS and Finished come first.
    let (mut c, mut s) = engines();
    pump(&mut c, &mut s).unwrap();
    c.close().unwrap();
    s.feed(&c.take_outgoing());
    s.process().unwrap();
    let (mut c, mut s) = engines();
    let sealed = alert_after_first_flight(&mut c, &mut s);
    assert!(s.session_reused() && s.is_handshaking());
    assert_eq!(sealed.first(), Some(&0x15));
    assert_ne!(sealed.len(), 7, "sealed, not in plaintext");
}

/// A failure's words carry OpenSSL's error stack without its source files and lines: a
/// server that takes only TLS 1.3 from a client that offers only TLS 1.2 says "unsupported
/// protocol", not "…:../ssl/statem/statem_srvr.c:1664:" (found in an interop trial).
#[test]
fn a_failure_names_openssls_reason_without_its_source_lines() {
    let pki = Pki::new();
    let client = OpenSslContext::new(&pki.client_config().only(V12)).unwrap();
    let server = OpenSslContext::new(&pki.server_config().only(V13)).unwrap();
    let (mut c, mut s) = (
        client.engine_for(Some(HOST)).unwrap(),
        server.engine().unwrap(),
    );
    let (_, from_server) = common::pump_err(&mut c, &mut s);
    let said = from_server
        .expect("the server refuses the version")
        .to_string();
    assert!(
        said.contains(":SSL routines:") && said.contains("unsupported protocol"),
        "{said}"
    );
    assert!(!said.contains(".c:"), "{said}");
}
