//! 0.5-RTT data from an OpenSSL server (RFC 8446 §4.4.4): written right after the server's
//! Finished, counted in the application epoch so exported sequence numbers stay exact.

mod common;

use common::{check_exact, ossl, pump, transfer, Pki, V12, V13};
use mbx_engine::{EngineError, RustlsEngine, TlsEngine};

const LABEL: &str = "EXPORTER-test-half-rtt";

#[test]
fn half_rtt_data_leaves_with_the_server_finished_and_counts_in_the_application_epoch() {
    let pki = Pki::new();
    for tickets in [false, true] {
        let cc = pki.client_config().only(V13);
        let mut sc = pki.server_config().only(V13);
        sc.session_tickets = tickets;
        let (mut c, mut s) = (ossl(&cc), ossl(&sc));
        s.enable_half_rtt().unwrap();
        assert!(!s.can_write_half_rtt());

        c.process().unwrap();
        s.feed(&c.take_outgoing());
        s.process().unwrap();
        // Our Finished is out, the client's is not in: the 0.5-RTT window.
        assert!(s.is_handshaking());
        assert!(s.can_write_half_rtt());
        let binder = s.export_keying_material(LABEL, None, 32).unwrap();
        assert_eq!(s.version(), Some(V13));
        s.write_half_rtt(b"evidence, right after Finished").unwrap();
        let flight = s.take_outgoing();
        // The server flight and the 0.5-RTT record arrive together.
        c.feed(&flight);
        c.process().unwrap();
        assert!(!c.is_handshaking());
        assert_eq!(c.take_plaintext(), b"evidence, right after Finished");
        // The client computes the same exporter value after its handshake.
        assert_eq!(*c.export_keying_material(LABEL, None, 32).unwrap(), *binder);

        s.feed(&c.take_outgoing());
        s.process().unwrap();
        assert!(!s.is_handshaking());
        assert!(!s.can_write_half_rtt());
        assert!(matches!(
            s.write_half_rtt(b"too late"),
            Err(EngineError::State(_))
        ));
        // Ordinary data afterwards, then export: the 0.5-RTT record is number 0 of the
        // application epoch, so the server has sent (tickets +) 2 records in it.
        transfer(&mut s, &mut c, b"normal data");
        let ch = c.export_session().unwrap();
        let sh = s.export_session().unwrap();
        let tickets_sent = if tickets { 2 } else { 0 };
        assert_eq!(
            sh.session.tx.next_seq,
            tickets_sent + 2,
            "tickets={tickets}"
        );
        assert_eq!(ch.session.tx.next_seq, 0);
        check_exact(&ch, &sh);
    }
}

#[test]
fn export_right_after_the_handshake_counts_the_half_rtt_record() {
    let pki = Pki::new();
    let cc = pki.client_config().only(V13);
    let mut sc = pki.server_config().only(V13);
    sc.session_tickets = false;
    sc.pause_after_handshake = true;
    let (mut c, mut s) = (ossl(&cc), ossl(&sc));
    s.enable_half_rtt().unwrap();
    c.process().unwrap();
    s.feed(&c.take_outgoing());
    s.process().unwrap();
    s.write_half_rtt(b"one").unwrap();
    s.write_half_rtt(b"two").unwrap();
    c.feed(&s.take_outgoing());
    c.process().unwrap();
    assert_eq!(c.take_plaintext(), b"onetwo");
    s.feed(&c.take_outgoing());
    s.process().unwrap();
    let sh = s.export_session().unwrap();
    let ch = c.export_session().unwrap();
    assert_eq!(sh.session.tx.next_seq, 2);
    check_exact(&ch, &sh);
}

#[test]
fn tls12_handshake_is_unchanged_and_refuses_half_rtt_data() {
    let pki = Pki::new();
    let (mut c, mut s) = (
        ossl(&pki.client_config().only(V12)),
        ossl(&pki.server_config().only(V12)),
    );
    s.enable_half_rtt().unwrap();
    c.process().unwrap();
    s.feed(&c.take_outgoing());
    s.process().unwrap();
    assert!(!s.can_write_half_rtt());
    assert!(matches!(s.write_half_rtt(b"x"), Err(EngineError::State(_))));
    // The exporter is not offered before the TLS 1.2 handshake completes.
    assert!(matches!(
        s.export_keying_material(LABEL, None, 32),
        Err(EngineError::HandshakeIncomplete)
    ));
    pump(&mut c, &mut s).unwrap();
    assert!(!s.can_write_half_rtt());
    assert!(matches!(s.write_half_rtt(b"x"), Err(EngineError::State(_))));
    transfer(&mut s, &mut c, b"data");
    let (ch, sh) = (c.export_session().unwrap(), s.export_session().unwrap());
    check_exact(&ch, &sh);
}

#[test]
fn half_rtt_refused_outside_its_window() {
    let pki = Pki::new();
    // Not enabled: no 0.5-RTT data even in the window (the ordinary path waits for the
    // client's Finished).
    let (mut c, mut s) = (
        ossl(&pki.client_config().only(V13)),
        ossl(&pki.server_config().only(V13)),
    );
    c.process().unwrap();
    s.feed(&c.take_outgoing());
    s.process().unwrap();
    assert!(!s.can_write_half_rtt());
    assert!(matches!(s.write_half_rtt(b"x"), Err(EngineError::State(_))));
    assert!(matches!(
        s.export_keying_material(LABEL, None, 32),
        Err(EngineError::HandshakeIncomplete)
    ));
    // Enabled too late (after the handshake started), or on a client.
    assert!(matches!(s.enable_half_rtt(), Err(EngineError::State(_))));
    assert!(matches!(c.enable_half_rtt(), Err(EngineError::State(_))));
    let mut fresh = ossl(&pki.client_config().only(V13));
    assert!(matches!(
        fresh.enable_half_rtt(),
        Err(EngineError::State(_))
    ));

    // Enabled, but before our Finished exists.
    let mut s = ossl(&pki.server_config().only(V13));
    s.enable_half_rtt().unwrap();
    s.process().unwrap();
    assert!(!s.can_write_half_rtt());
    assert!(matches!(s.write_half_rtt(b"x"), Err(EngineError::State(_))));

    // rustls: a typed "unsupported".
    let mut r = RustlsEngine::new(&pki.server_config().only(V13)).unwrap();
    assert!(!r.can_write_half_rtt());
    assert!(matches!(
        r.write_half_rtt(b"x"),
        Err(EngineError::Unsupported(_))
    ));
}

#[test]
fn client_certificate_failure_still_fails_after_half_rtt_data() {
    // 0.5-RTT data goes to an unauthenticated client: a client that then fails
    // authentication must still fail the server's handshake.
    let pki = Pki::new();
    let mut sc = pki.server_config().only(V13);
    sc.verify_peer = true;
    sc.trust_roots_pem = Some(pki.roots());
    let (mut c, mut s) = (ossl(&pki.client_config().only(V13)), ossl(&sc));
    s.enable_half_rtt().unwrap();
    c.process().unwrap();
    s.feed(&c.take_outgoing());
    s.process().unwrap();
    assert!(s.can_write_half_rtt());
    s.write_half_rtt(b"x").unwrap();
    c.feed(&s.take_outgoing());
    c.process().unwrap();
    s.feed(&c.take_outgoing());
    assert!(s.process().is_err());
    assert!(s.is_handshaking());
}
