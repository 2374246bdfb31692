//! Engines against each other over memory buffers: OpenSSL↔OpenSSL, OpenSSL↔rustls.

mod common;

use std::sync::Arc;

use common::{open_and_reseal, ossl, pump, pump_err, split_records, Pki, HOST, SUITES, V12, V13};
use mbx_engine::{
    AlertDescription, CertificateProblem, CustomExtension, EngineError, ExtensionResponse, Handoff,
    OpenSslContext, OpenSslEngine, RustlsClientContext, RustlsEngine, TlsConfig, TlsEngine,
};
use mbx_record::{ContentType, RecordOpener, RecordSealer, TlsVersion};

fn pair(pki: &Pki, version: TlsVersion, suite: Option<u16>) -> (OpenSslEngine, OpenSslEngine) {
    let mut c = pki.client_config().only(version);
    let mut s = pki.server_config().only(version);
    if let Some(id) = suite {
        c.cipher_suites = vec![id];
        s.cipher_suites = vec![id];
    }
    (ossl(&c), ossl(&s))
}

/// Sends `msg` from `a` to `b` through the engines and checks it arrives.
fn transfer(a: &mut dyn TlsEngine, b: &mut dyn TlsEngine, msg: &[u8]) {
    a.write_plaintext(msg).unwrap();
    let bytes = a.take_outgoing();
    b.feed(&bytes);
    b.process().unwrap();
    assert_eq!(b.take_plaintext(), msg);
}

#[test]
fn openssl_pair_all_suites() {
    let pki = Pki::new();
    for (version, id) in SUITES {
        let (mut c, mut s) = pair(&pki, version, Some(id));
        pump(&mut c, &mut s).unwrap();
        for e in [&c as &dyn TlsEngine, &s] {
            assert_eq!(e.version(), Some(version));
            assert_eq!(e.cipher_suite(), Some(id));
        }
        transfer(&mut c, &mut s, b"client to server");
        transfer(&mut s, &mut c, b"server to client");
        // The client saw the server chain (leaf first); the server saw no client certificate.
        let chain = c.peer_certificates();
        assert_eq!(
            chain.first().map(Vec::as_slice),
            Some(pki.server.cert_der().as_ref())
        );
        assert!(s.peer_certificates().is_empty());
    }
}

#[test]
fn alpn_and_client_auth() {
    let pki = Pki::new();
    for version in [V12, V13] {
        let mut cc = pki.client_config().only(version);
        cc.alpn = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        cc.identity = Some(pki.client_identity());
        let mut sc = pki.server_config().only(version);
        sc.alpn = vec![b"http/1.1".to_vec()];
        sc.verify_peer = true;
        sc.trust_roots_pem = Some(pki.roots());
        let (mut c, mut s) = (ossl(&cc), ossl(&sc));
        pump(&mut c, &mut s).unwrap();
        assert_eq!(c.alpn().as_deref(), Some(&b"http/1.1"[..]));
        assert_eq!(s.alpn().as_deref(), Some(&b"http/1.1"[..]));
        let seen = s.peer_certificates();
        assert_eq!(
            seen.first().map(Vec::as_slice),
            Some(pki.client.cert_der().as_ref())
        );

        // Same server, client without a certificate: the server must refuse.
        let mut bare = pki.client_config().only(version);
        bare.alpn = cc.alpn.clone();
        let (mut c, mut s) = (ossl(&bare), ossl(&sc));
        let (ec, es) = pump_err(&mut c, &mut s);
        assert!(
            matches!(es, Some(EngineError::Fatal { alert: Some(_), .. })),
            "server: {es:?}"
        );
        if version == V12 {
            // In TLS 1.3 the client has finished before it hears the alert.
            assert!(
                matches!(ec, Some(EngineError::AlertReceived { .. })),
                "client: {ec:?}"
            );
        }
    }
}

#[test]
fn client_rejects_wrong_hostname() {
    let pki = Pki::new();
    let mut cc = pki.client_config();
    cc.server_name = Some("other.mbx.test".into());
    let (mut c, mut s) = (ossl(&cc), ossl(&pki.server_config()));
    let (ec, es) = pump_err(&mut c, &mut s);
    let Some(EngineError::Fatal {
        alert: Some(_),
        detail,
        certificate,
        ..
    }) = ec
    else {
        panic!("client accepted a certificate for another name: {ec:?}");
    };
    assert_eq!(certificate, Some(CertificateProblem::NameMismatch));
    // Why, from the verification's own result, and the names on both sides; not OpenSSL's
    // error stack (its source files and lines).
    assert_eq!(
        detail,
        "invalid peer certificate: hostname mismatch (it is not valid for other.mbx.test; \
         it is for server.mbx.test, 127.0.0.1, ::1)"
    );
    assert!(
        matches!(es, Some(EngineError::AlertReceived { .. })),
        "{es:?}"
    );
    // Positive control: the right name works.
    let (mut c, mut s) = (ossl(&pki.client_config()), ossl(&pki.server_config()));
    pump(&mut c, &mut s).unwrap();
}

const MBX_EXT: u16 = 0xFF42;

fn ext_configs(
    pki: &Pki,
    version: TlsVersion,
    handler: Option<mbx_engine::ExtensionHandler>,
) -> (TlsConfig, TlsConfig) {
    let mut cc = pki.client_config().only(version);
    cc.custom_extensions = vec![CustomExtension {
        ext_type: MBX_EXT,
        client_payload: Some(b"middlebox support v1".to_vec()),
        handler: None,
    }];
    let mut sc = pki.server_config().only(version);
    sc.custom_extensions = vec![CustomExtension {
        ext_type: MBX_EXT,
        client_payload: None,
        handler,
    }];
    (cc, sc)
}

#[test]
fn custom_extension_round_trip() {
    let pki = Pki::new();
    for version in [V12, V13] {
        let handler: mbx_engine::ExtensionHandler = Arc::new(|payload: &[u8]| {
            let mut reply = b"ack:".to_vec();
            reply.extend_from_slice(payload);
            ExtensionResponse::Reply(reply)
        });
        let (cc, sc) = ext_configs(&pki, version, Some(handler));
        let (mut c, mut s) = (ossl(&cc), ossl(&sc));
        pump(&mut c, &mut s).unwrap();
        assert_eq!(
            s.received_extension(MBX_EXT).unwrap().as_deref(),
            Some(&b"middlebox support v1"[..])
        );
        assert_eq!(
            c.received_extension(MBX_EXT).unwrap().as_deref(),
            Some(&b"ack:middlebox support v1"[..]),
            "{version:?}"
        );
        assert_eq!(s.received_extension(0xFF43).unwrap(), None);

        // Per-connection payload override (what mbTLS does with optimistic ClientHellos).
        let ctx = OpenSslContext::new(&cc).unwrap();
        let mut c = ctx.engine().unwrap();
        c.set_extension_payload(MBX_EXT, vec![7; 300]).unwrap();
        assert!(
            c.set_extension_payload(0xFF43, vec![1]).is_err(),
            "unregistered type accepted"
        );
        let mut s = ossl(&sc);
        pump(&mut c, &mut s).unwrap();
        assert_eq!(s.received_extension(MBX_EXT).unwrap(), Some(vec![7; 300]));
        assert!(
            c.set_extension_payload(MBX_EXT, vec![1]).is_err(),
            "payload changed after start"
        );
    }
}

#[test]
fn custom_extension_absent_and_accept_without_reply() {
    let pki = Pki::new();
    for version in [V12, V13] {
        // Client registers the type but sends nothing; server's handler must not run.
        let (mut cc, sc) = ext_configs(
            &pki,
            version,
            Some(Arc::new(|_: &[u8]| {
                ExtensionResponse::Reject(AlertDescription::ILLEGAL_PARAMETER)
            })),
        );
        cc.custom_extensions[0].client_payload = None;
        let (mut c, mut s) = (ossl(&cc), ossl(&sc));
        pump(&mut c, &mut s).unwrap();
        assert_eq!(s.received_extension(MBX_EXT).unwrap(), None);
        assert_eq!(c.received_extension(MBX_EXT).unwrap(), None);

        // Server without handler: accepted, stored, no reply.
        let (cc, sc) = ext_configs(&pki, version, None);
        let (mut c, mut s) = (ossl(&cc), ossl(&sc));
        pump(&mut c, &mut s).unwrap();
        assert!(s.received_extension(MBX_EXT).unwrap().is_some());
        assert_eq!(c.received_extension(MBX_EXT).unwrap(), None);

        // A server that does not know the extension ignores it.
        let cc = ext_configs(&pki, version, None).0;
        let (mut c, mut s) = (ossl(&cc), ossl(&pki.server_config().only(version)));
        pump(&mut c, &mut s).unwrap();
        assert_eq!(s.received_extension(MBX_EXT).unwrap(), None);
    }
}

#[test]
fn custom_extension_rejected_by_server_handler() {
    let pki = Pki::new();
    for version in [V12, V13] {
        let (cc, sc) = ext_configs(
            &pki,
            version,
            Some(Arc::new(|p: &[u8]| {
                if p == b"middlebox support v1" {
                    ExtensionResponse::Reject(AlertDescription::ILLEGAL_PARAMETER)
                } else {
                    ExtensionResponse::Accept
                }
            })),
        );
        let (mut c, mut s) = (ossl(&cc), ossl(&sc));
        let (ec, es) = pump_err(&mut c, &mut s);
        match es {
            Some(EngineError::Fatal { alert: Some(a), .. }) => {
                assert_eq!(a, AlertDescription::ILLEGAL_PARAMETER)
            }
            other => panic!("server did not fail with our alert: {other:?}"),
        }
        match ec {
            Some(EngineError::AlertReceived { alert }) => {
                assert_eq!(alert, AlertDescription::ILLEGAL_PARAMETER)
            }
            other => panic!("client did not see the alert: {other:?}"),
        }
        assert!(c.write_plaintext(b"x").is_err());
    }
}

#[test]
fn take_client_hello_contains_extension() {
    let pki = Pki::new();
    let (cc, _) = ext_configs(&pki, V13, None);
    let mut c = ossl(&cc);
    let hello = c.take_client_hello().unwrap();
    assert_eq!(hello[0], 1, "not a ClientHello");
    let len = (usize::from(hello[1]) << 16) | (usize::from(hello[2]) << 8) | usize::from(hello[3]);
    assert_eq!(hello.len(), 4 + len);
    let needle = [
        &MBX_EXT.to_be_bytes()[..],
        &[0, 20],
        b"middlebox support v1",
    ]
    .concat();
    assert!(
        hello.windows(needle.len()).any(|w| w == needle),
        "extension not in ClientHello"
    );
    assert!(c.take_outgoing().is_empty());
    assert!(c.take_client_hello().is_err(), "second ClientHello");

    let mut r = RustlsEngine::new(&pki.client_config()).unwrap();
    let hello = r.take_client_hello().unwrap();
    assert_eq!(hello[0], 1);
    let mut s = ossl(&pki.server_config());
    assert!(s.take_client_hello().is_err());
}

#[test]
fn rustls_rejects_custom_extensions() {
    let pki = Pki::new();
    let (cc, _) = ext_configs(&pki, V13, None);
    assert!(matches!(
        RustlsEngine::new(&cc),
        Err(EngineError::Unsupported(_))
    ));
    let r = RustlsEngine::new(&pki.client_config()).unwrap();
    assert!(matches!(
        r.received_extension(MBX_EXT),
        Err(EngineError::Unsupported(_))
    ));
}

fn rustls_cfg(cfg: TlsConfig) -> RustlsEngine {
    RustlsEngine::new(&cfg).expect("rustls engine")
}

#[test]
fn openssl_and_rustls_interoperate_both_directions() {
    let pki = Pki::new();
    for (version, id) in SUITES {
        let mut cc = pki.client_config().only(version);
        let mut sc = pki.server_config().only(version);
        cc.cipher_suites = vec![id];
        sc.cipher_suites = vec![id];
        cc.alpn = vec![b"mbx".to_vec()];
        sc.alpn = vec![b"mbx".to_vec()];

        // rustls client -> OpenSSL server
        let (mut c, mut s) = (rustls_cfg(cc.clone()), ossl(&sc));
        pump(&mut c, &mut s).unwrap();
        assert_eq!((c.version(), c.cipher_suite()), (Some(version), Some(id)));
        assert_eq!(c.alpn().as_deref(), Some(&b"mbx"[..]));
        assert_eq!(
            c.peer_certificates().first().map(Vec::as_slice),
            Some(pki.server.cert_der().as_ref())
        );
        transfer(&mut c, &mut s, b"rustls -> openssl");
        transfer(&mut s, &mut c, b"openssl -> rustls");
        check_exporters(&c, &s);
        check_export_pair(c.export_session().unwrap(), s.export_session().unwrap());

        // OpenSSL client -> rustls server
        let (mut c, mut s) = (ossl(&cc), rustls_cfg(sc.clone()));
        pump(&mut c, &mut s).unwrap();
        assert_eq!((s.version(), s.cipher_suite()), (Some(version), Some(id)));
        transfer(&mut c, &mut s, b"openssl -> rustls");
        transfer(&mut s, &mut c, b"rustls -> openssl");
        check_exporters(&c, &s);
        check_export_pair(c.export_session().unwrap(), s.export_session().unwrap());
    }
}

/// Exporter values agree between the two ends and depend on label, context and session.
fn check_exporters(a: &dyn TlsEngine, b: &dyn TlsEngine) {
    let ka = a
        .export_keying_material("EXPORTER-mbx test", Some(b"ctx"), 32)
        .unwrap();
    let kb = b
        .export_keying_material("EXPORTER-mbx test", Some(b"ctx"), 32)
        .unwrap();
    assert_eq!(*ka, *kb);
    let other_label = a
        .export_keying_material("EXPORTER-mbx other", Some(b"ctx"), 32)
        .unwrap();
    let other_ctx = a
        .export_keying_material("EXPORTER-mbx test", Some(b"ctx2"), 32)
        .unwrap();
    assert_ne!(*ka, *other_label);
    assert_ne!(*ka, *other_ctx);
    let none_a = a
        .export_keying_material("EXPORTER-mbx test", None, 32)
        .unwrap();
    let none_b = b
        .export_keying_material("EXPORTER-mbx test", None, 32)
        .unwrap();
    assert_eq!(*none_a, *none_b);
    let long = a
        .export_keying_material("EXPORTER-mbx test", Some(b"ctx"), 100)
        .unwrap();
    assert_eq!(long.len(), 100);
}

#[test]
fn exporters_openssl_pair_and_per_session() {
    let pki = Pki::new();
    for version in [V12, V13] {
        let (mut c1, mut s1) = pair(&pki, version, None);
        pump(&mut c1, &mut s1).unwrap();
        check_exporters(&c1, &s1);
        let (mut c2, mut s2) = pair(&pki, version, None);
        pump(&mut c2, &mut s2).unwrap();
        let k1 = c1
            .export_keying_material("EXPORTER-mbx test", None, 32)
            .unwrap();
        let k2 = c2
            .export_keying_material("EXPORTER-mbx test", None, 32)
            .unwrap();
        assert_ne!(*k1, *k2, "two sessions exported the same keying material");
        if version == V12 {
            // RFC 5705: "no context" and "empty context" differ in TLS 1.2.
            let empty = c1
                .export_keying_material("EXPORTER-mbx test", Some(b""), 32)
                .unwrap();
            assert_ne!(*k1, *empty);
        }
        let (c3, _) = pair(&pki, version, None);
        assert!(matches!(
            c3.export_keying_material("EXPORTER-mbx test", None, 32),
            Err(EngineError::HandshakeIncomplete)
        ));
    }
}

/// Client and server handoffs describe the same session; our record layer carries data
/// both ways after the export, including records that were in flight.
fn check_export_pair(c: Handoff, s: Handoff) {
    let (cs, ss) = (&c.session, &s.session);
    assert_eq!(cs.version, ss.version);
    assert_eq!(cs.suite, ss.suite);
    assert_eq!(cs.client_random, ss.client_random);
    assert_eq!(cs.server_random, ss.server_random);
    assert_ne!(cs.client_random, [0; 32]);
    for (tx, rx) in [(&cs.tx, &ss.rx), (&ss.tx, &cs.rx)] {
        assert_eq!(tx.keys.key(), rx.keys.key());
        assert_eq!(tx.keys.iv(), rx.keys.iv());
        assert_eq!(tx.traffic_secret.as_deref(), rx.traffic_secret.as_deref());
        assert_eq!(tx.traffic_secret.is_some(), cs.version == V13);
    }
    // Records in flight (not taken from the sender, or not processed by the receiver): the
    // receiver's next_seq is behind by exactly that many.
    let c_in_flight = (split_records(&c.pending_outgoing).len()
        + split_records(&s.unprocessed_incoming).len()) as u64;
    let s_in_flight = (split_records(&s.pending_outgoing).len()
        + split_records(&c.unprocessed_incoming).len()) as u64;
    assert_eq!(cs.tx.next_seq, ss.rx.next_seq + c_in_flight);
    assert_eq!(ss.tx.next_seq, cs.rx.next_seq + s_in_flight);

    let v = cs.version;
    // Server -> client: in-flight engine records first, then ours.
    let mut s_sealer = RecordSealer::new(v, ss.tx.keys.clone(), ss.tx.next_seq);
    let mut wire = s.pending_outgoing.clone();
    s_sealer
        .seal(
            ContentType::APPLICATION_DATA,
            b"sealed by mbx-record (s->c)",
            &mut wire,
        )
        .unwrap();
    let mut c_opener = RecordOpener::new(v, cs.rx.keys.clone(), cs.rx.next_seq);
    let mut stream = c.unprocessed_incoming.clone();
    stream.extend_from_slice(&wire);
    let opened = open_and_reseal(v, &cs.rx.keys, &mut c_opener, &split_records(&stream));
    assert!(common::app_data(&opened).ends_with(b"sealed by mbx-record (s->c)"));

    // Client -> server.
    let mut c_sealer = RecordSealer::new(v, cs.tx.keys.clone(), cs.tx.next_seq);
    let mut wire = c.pending_outgoing.clone();
    c_sealer
        .seal(
            ContentType::APPLICATION_DATA,
            b"sealed by mbx-record (c->s)",
            &mut wire,
        )
        .unwrap();
    let mut s_opener = RecordOpener::new(v, ss.rx.keys.clone(), ss.rx.next_seq);
    let mut stream = s.unprocessed_incoming.clone();
    stream.extend_from_slice(&wire);
    let opened = open_and_reseal(v, &ss.rx.keys, &mut s_opener, &split_records(&stream));
    assert!(common::app_data(&opened).ends_with(b"sealed by mbx-record (c->s)"));

    // A wrong sequence number must not open (proves the numbers above are load-bearing).
    let mut off_by_one = RecordOpener::new(v, ss.rx.keys.clone(), ss.rx.next_seq + 1);
    let mut rec = Vec::new();
    RecordSealer::new(v, cs.tx.keys.clone(), cs.tx.next_seq)
        .seal(ContentType::APPLICATION_DATA, b"x", &mut rec)
        .unwrap();
    if c.pending_outgoing.is_empty() && s.unprocessed_incoming.is_empty() {
        assert!(off_by_one.open(&rec).is_err());
    }
}

#[test]
fn export_session_openssl_pair_with_data_and_in_flight_records() {
    let pki = Pki::new();
    for (version, id) in SUITES {
        for tickets in [true, false] {
            let mut cc = pki.client_config().only(version);
            let mut sc = pki.server_config().only(version);
            cc.cipher_suites = vec![id];
            sc.cipher_suites = vec![id];
            sc.session_tickets = tickets;
            let (mut c, mut s) = (ossl(&cc), ossl(&sc));
            pump(&mut c, &mut s).unwrap();
            // Application data through the engines before export.
            for i in 0..3 {
                transfer(&mut c, &mut s, format!("c{i}").as_bytes());
                transfer(&mut s, &mut c, format!("s{i}").as_bytes());
            }
            // Exact numbers at the export point, in both directions.
            let c_h = c.export_session().unwrap();
            let s_h = s.export_session().unwrap();
            assert_eq!(c_h.session.tx.next_seq, s_h.session.rx.next_seq);
            let expected_c_tx = if version == V12 { 1 + 3 } else { 3 };
            assert_eq!(
                c_h.session.tx.next_seq, expected_c_tx,
                "{version:?} {id:#x}"
            );
            // TLS 1.3 servers send 2 tickets by default before any data.
            let expected_s_tx = match (version, tickets) {
                (V12, _) => 1 + 3,
                (V13, true) => 2 + 3,
                (V13, false) => 3,
            };
            assert_eq!(
                s_h.session.tx.next_seq, expected_s_tx,
                "{version:?} {id:#x} tickets={tickets}"
            );
            check_export_pair(c_h, s_h);
        }
    }
}

#[test]
fn export_with_records_in_flight_and_undelivered_plaintext() {
    let pki = Pki::new();
    for version in [V12, V13] {
        let (mut c, mut s) = pair(&pki, version, None);
        pump(&mut c, &mut s).unwrap();
        // "A": decrypted by the client engine but not taken by the application.
        s.write_plaintext(b"A: decrypted, not taken").unwrap();
        let a = s.take_outgoing();
        c.feed(&a);
        c.process().unwrap();
        // "B": fed to the client engine but never processed.
        s.write_plaintext(b"B: fed, not processed").unwrap();
        let b = s.take_outgoing();
        c.feed(&b);
        // "C": produced by the client engine but never taken off it.
        c.write_plaintext(b"C: not sent").unwrap();
        let ch = c.export_session().unwrap();
        let sh = s.export_session().unwrap();
        assert_eq!(ch.pending_plaintext.as_slice(), b"A: decrypted, not taken");
        assert_eq!(ch.unprocessed_incoming, b);
        assert_eq!(split_records(&ch.pending_outgoing).len(), 1);
        check_export_pair(ch, sh);
    }
}

#[test]
fn pause_after_handshake_leaves_records_to_caller() {
    let pki = Pki::new();
    for version in [V12, V13] {
        let mut cc = pki.client_config().only(version);
        cc.pause_after_handshake = true;
        let (mut c, mut s) = (ossl(&cc), ossl(&pki.server_config().only(version)));
        pump(&mut c, &mut s).unwrap();
        s.write_plaintext(b"after handshake").unwrap();
        let bytes = s.take_outgoing();
        c.feed(&bytes);
        c.process().unwrap();
        assert!(
            c.take_plaintext().is_empty(),
            "paused engine decrypted data"
        );
        let ch = c.export_session().unwrap();
        // TLS 1.2: the server Finished was record 0 of the new epoch.
        assert_eq!(ch.session.rx.next_seq, if version == V12 { 1 } else { 0 });
        // TLS 1.3: the two tickets plus the data are ours to open.
        let n = split_records(&ch.unprocessed_incoming).len();
        assert_eq!(
            n,
            if version == V13 { 3 } else { 1 },
            "{version:?}: {:?}",
            ch.session
        );
        check_export_pair(ch, s.export_session().unwrap());
    }
}

#[test]
fn a_paused_session_resumed_delivers_what_arrived_meanwhile() {
    let pki = Pki::new();
    for version in [V12, V13] {
        let mut cc = pki.client_config().only(version).without_export();
        cc.pause_after_handshake = true;
        let (mut c, mut s) = (ossl(&cc), ossl(&pki.server_config().only(version)));
        pump(&mut c, &mut s).unwrap();
        s.write_plaintext(b"while paused").unwrap();
        c.feed(&s.take_outgoing());
        c.process().unwrap();
        assert!(
            c.take_plaintext().is_empty(),
            "{version:?}: paused, yet read"
        );
        c.resume_after_pause();
        c.process().unwrap();
        assert_eq!(c.take_plaintext(), b"while paused", "{version:?}");
        transfer(&mut s, &mut c, b"and afterwards");
        transfer(&mut c, &mut s, b"both ways");
    }
}

/// One connection of an exportable context made without export: it works, refuses export,
/// and the context's other connections still export.
#[test]
fn a_connection_made_without_export_from_an_exportable_context() {
    let pki = Pki::new();
    for version in [V12, V13] {
        let ctx = OpenSslContext::new(&pki.server_config().only(version)).unwrap();
        assert!(ctx.exportable());
        let client = || ossl(&pki.client_config().only(version));
        let mut quiet = ctx.engine_without_export().unwrap();
        assert!(!quiet.exportable());
        let mut c = client();
        pump(&mut c, &mut quiet).unwrap();
        transfer(&mut c, &mut quiet, b"no key log");
        transfer(&mut quiet, &mut c, b"still TLS");
        assert!(
            matches!(quiet.export_session(), Err(EngineError::Unsupported(_))),
            "{version:?}"
        );
        let (mut c, mut s) = (client(), ctx.engine().unwrap());
        pump(&mut c, &mut s).unwrap();
        check_export_pair(c.export_session().unwrap(), s.export_session().unwrap());
    }
}

/// A client that gives up its export before the ServerHello moves to the key-log-free twin
/// (TLS 1.3 contexts; a TLS 1.2-only context has no key log and stays) and finishes the
/// handshake with the same checks: the server's name is still verified.
#[test]
fn a_client_gives_up_export_before_the_server_hello() {
    let pki = Pki::new();
    for version in [V12, V13] {
        for wrong_name in [false, true] {
            let mut cfg = pki.client_config().only(version);
            if wrong_name {
                cfg.server_name = Some("someone-else.test".into());
            }
            let ctx = OpenSslContext::new(&cfg).unwrap();
            let mut c = ctx.engine().unwrap();
            let mut s = ossl(&pki.server_config().only(version));
            c.process().unwrap();
            s.feed(&c.take_outgoing());
            s.process().unwrap();
            let before: *const _ = c.ssl().ssl_context();
            ctx.forgo_export(&mut c).unwrap();
            let after: *const _ = c.ssl().ssl_context();
            assert_eq!(before == after, version == V12, "{version:?}");
            assert!(!c.exportable());
            c.feed(&s.take_outgoing());
            if wrong_name {
                assert!(c.process().is_err(), "{version:?}");
                continue;
            }
            pump(&mut c, &mut s).unwrap();
            transfer(&mut c, &mut s, b"kept in OpenSSL");
            transfer(&mut s, &mut c, b"both ways");
            // Too late now (and never through another context, below).
            assert!(matches!(
                ctx.forgo_export(&mut c),
                Err(EngineError::State(_))
            ));
            assert!(matches!(
                c.export_session(),
                Err(EngineError::Unsupported(_))
            ));
        }
        let other = OpenSslContext::new(&pki.client_config().only(version)).unwrap();
        let ctx = OpenSslContext::new(&pki.client_config().only(version)).unwrap();
        let mut c = ctx.engine().unwrap();
        assert!(matches!(
            other.forgo_export(&mut c),
            Err(EngineError::State(_))
        ));
        assert!(c.exportable());
    }
}

#[test]
fn a_session_built_without_export_works_and_refuses_export() {
    let pki = Pki::new();
    for version in [V12, V13] {
        let mut c = ossl(&pki.client_config().only(version).without_export());
        let mut s = ossl(&pki.server_config().only(version).without_export());
        pump(&mut c, &mut s).unwrap();
        transfer(&mut c, &mut s, b"no key log needed");
        transfer(&mut s, &mut c, b"either way");
        for e in [c, s] {
            assert!(
                matches!(e.export_session(), Err(EngineError::Unsupported(_))),
                "{version:?}"
            );
        }
    }
}

#[test]
fn export_refused_before_handshake_and_for_rustls_too() {
    let pki = Pki::new();
    let (c, _) = pair(&pki, V13, None);
    assert!(matches!(
        c.export_session(),
        Err(EngineError::HandshakeIncomplete)
    ));
    let r = rustls_cfg(pki.client_config());
    assert!(matches!(
        r.export_session(),
        Err(EngineError::HandshakeIncomplete) | Err(EngineError::InexactExport(_))
    ));
}

#[test]
fn cipher_suites_outside_the_record_layer_are_config_errors() {
    let pki = Pki::new();
    // 0xC009 (ECDHE-ECDSA-AES128-SHA, CBC) is not an AEAD suite mbx-record can take over.
    let cfg = TlsConfig {
        cipher_suites: vec![0xC009],
        ..pki.client_config()
    };
    assert!(matches!(
        OpenSslContext::new(&cfg),
        Err(EngineError::Config(_))
    ));
    assert!(matches!(
        RustlsEngine::new(&cfg),
        Err(EngineError::Config(_))
    ));
    let ok = TlsConfig {
        cipher_suites: vec![0xC02B],
        ..pki.client_config()
    };
    assert!(OpenSslContext::new(&ok).is_ok());
    assert!(RustlsEngine::new(&ok).is_ok());
}

#[test]
fn groups_are_checked_and_the_client_offers_the_first() {
    let pki = Pki::new();
    let unknown = TlsConfig {
        groups: vec!["no-such-group".into()],
        ..pki.client_config()
    };
    assert!(matches!(
        OpenSslContext::new(&unknown),
        Err(EngineError::Config(_))
    ));
    assert!(matches!(
        RustlsEngine::new(&unknown),
        Err(EngineError::Config(_))
    ));
    assert!(matches!(
        RustlsClientContext::new(&unknown),
        Err(EngineError::Config(_))
    ));
    // A server that only knows P-384: a rustls client limited to X25519 has no group in
    // common with it, one limited to P-384 completes, whichever way it is built.
    let server = TlsConfig {
        groups: vec!["P-384".into()],
        ..pki.server_config()
    };
    for (groups, ok) in [(vec!["X25519"], false), (vec!["P-384", "X25519"], true)] {
        let client = TlsConfig {
            groups: groups.iter().map(|g| g.to_string()).collect(),
            ..pki.client_config()
        };
        let mut a = rustls_cfg(client.clone());
        let mut s = ossl(&server);
        let (ea, es) = pump_err(&mut a, &mut s);
        assert_eq!(
            ea.is_none() && es.is_none(),
            ok,
            "{groups:?}: {ea:?} {es:?}"
        );
        let mut b = RustlsClientContext::new(&client)
            .unwrap()
            .engine_for(Some(HOST))
            .unwrap();
        let mut s = ossl(&server);
        let (eb, es) = pump_err(&mut b, &mut s);
        assert_eq!(
            eb.is_none() && es.is_none(),
            ok,
            "{groups:?}: {eb:?} {es:?}"
        );
    }
}

/// The extension types of a ClientHello handshake message (header included).
fn client_hello_extensions(msg: &[u8]) -> Vec<u16> {
    let mut at = 4 + 2 + 32; // header, legacy_version, random
    at += 1 + usize::from(msg[at]); // session id
    at += 2 + usize::from(u16::from_be_bytes([msg[at], msg[at + 1]])); // cipher suites
    at += 1 + usize::from(msg[at]); // compression methods
    let end = at + 2 + usize::from(u16::from_be_bytes([msg[at], msg[at + 1]]));
    at += 2;
    let mut types = Vec::new();
    while at < end {
        types.push(u16::from_be_bytes([msg[at], msg[at + 1]]));
        at += 4 + usize::from(u16::from_be_bytes([msg[at + 2], msg[at + 3]]));
    }
    types
}

/// One handshake message as plaintext records of at most 2^14 bytes.
fn records_of(msg: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    for chunk in msg.chunks(1 << 14) {
        out.extend_from_slice(&[22, 3, 1]);
        out.extend_from_slice(&(chunk.len() as u16).to_be_bytes());
        out.extend_from_slice(chunk);
    }
    out
}

#[test]
fn rustls_client_context_checks_name_or_chain_and_never_resumes() {
    let pki = Pki::new();
    let other = Pki::new(); // another CA
    for version in [V12, V13] {
        let ctx = RustlsClientContext::new(&pki.client_config().only(version)).unwrap();
        // A server that issues tickets, so that a resuming client would resume.
        let server = OpenSslContext::new(&pki.server_config().only(version)).unwrap();
        for _ in 0..2 {
            let mut c = ctx.engine_for(Some(HOST)).unwrap();
            let hello = c.take_client_hello().unwrap();
            assert!(
                !client_hello_extensions(&hello).contains(&41),
                "{version:?}: a pre_shared_key was offered"
            );
            let mut s = server.engine().unwrap();
            s.feed(&records_of(&hello));
            pump(&mut c, &mut s).unwrap();
            assert_eq!(c.version(), Some(version));
            transfer(&mut c, &mut s, b"through a shared rustls configuration");
            // A full handshake each time: the certificate is there to check.
            assert_eq!(
                c.peer_certificates().first().map(Vec::as_slice),
                Some(pki.server.cert_der().as_ref()),
                "{version:?}"
            );
        }
        // The name is checked when one is given, not otherwise.
        let mut wrong = ctx.engine_for(Some("other.mbx.test")).unwrap();
        let (e, _) = pump_err(&mut wrong, &mut server.engine().unwrap());
        // Said in words, not as rustls's `DnsName("…")` (found in a user trial).
        let said = e.map(|e| e.to_string()).unwrap_or_default();
        assert!(
            said.contains(&format!(
                "it is not valid for the name other.mbx.test (it is for {HOST}, 127.0.0.1"
            )),
            "{version:?}: {said}"
        );
        let mut unnamed = ctx.engine_for(None).unwrap();
        pump(&mut unnamed, &mut server.engine().unwrap()).unwrap();
        // Without a name, the chain still has to lead to our roots.
        let foreign = OpenSslContext::new(&other.server_config().only(version)).unwrap();
        for name in [None, Some(HOST)] {
            let mut c = ctx.engine_for(name).unwrap();
            let (e, _) = pump_err(&mut c, &mut foreign.engine().unwrap());
            assert!(e.is_some(), "{version:?} {name:?}: foreign chain accepted");
        }
    }
    // Only clients.
    assert!(RustlsClientContext::new(&pki.server_config()).is_err());
}

/// A client engine made with a record plaintext cap, from either kind of context, sends no
/// record with more plaintext than the cap (checked on the wire against each version's AEAD
/// expansion), delivers everything, and the cap's range is enforced.
#[test]
fn client_engines_with_a_record_cap() {
    let pki = Pki::new();
    const CAP: usize = 600;
    for version in [V12, V13] {
        let contexts = both_client_contexts(&pki.client_config().only(version));
        // TLS 1.2 AES-GCM: explicit nonce and tag; TLS 1.3: content type and tag.
        let expansion = if version == V12 { 24 } else { 17 };
        for (what, ctx) in contexts {
            for name in [Some(HOST), None] {
                let mut c = ctx.client_engine(name, Some(CAP)).unwrap();
                let mut s = ossl(&pki.server_config().only(version));
                pump(c.as_mut(), &mut s).unwrap();
                let data: Vec<u8> = (0..5000u32).map(|i| i as u8).collect();
                c.write_plaintext(&data).unwrap();
                let wire = c.take_outgoing();
                let records = split_records(&wire);
                assert!(records.len() >= data.len() / CAP, "{what} {version:?}");
                for r in &records {
                    assert!(
                        r.len() <= 5 + CAP + expansion,
                        "{what} {version:?}: {}",
                        r.len()
                    );
                }
                s.feed(&wire);
                s.process().unwrap();
                assert_eq!(s.take_plaintext(), data, "{what} {version:?}");
            }
            for bad in [100, 16385] {
                assert!(
                    matches!(
                        ctx.client_engine(Some(HOST), Some(bad)),
                        Err(EngineError::Config(_))
                    ),
                    "{what} {bad}"
                );
            }
        }
    }
}

#[test]
fn malformed_input_is_a_typed_error() {
    let pki = Pki::new();
    for mut e in [
        Box::new(ossl(&pki.server_config())) as Box<dyn TlsEngine>,
        Box::new(rustls_cfg(pki.server_config())),
    ] {
        e.feed(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(e.process().is_err());
        assert!(e.process().is_err(), "failed engine became usable again");
    }
}

#[test]
fn close_notify_is_seen() {
    let pki = Pki::new();
    for version in [V12, V13] {
        let (mut c, mut s) = pair(&pki, version, None);
        pump(&mut c, &mut s).unwrap();
        c.close().unwrap();
        let bytes = c.take_outgoing();
        s.feed(&bytes);
        s.process().unwrap();
        assert!(s.peer_closed());
        let (mut c, mut s) = (
            rustls_cfg(pki.client_config().only(version)),
            ossl(&pki.server_config().only(version)),
        );
        pump(&mut c, &mut s).unwrap();
        s.close().unwrap();
        let bytes = s.take_outgoing();
        c.feed(&bytes);
        c.process().unwrap();
        assert!(c.peer_closed());
    }
}

#[test]
fn extension_codepoints_openssl_handles_itself_are_refused() {
    let pki = Pki::new();
    // 0xFF01 is renegotiation_info, inside the private-use range but built into OpenSSL.
    for ty in [0xFF01, 0x0000] {
        let mut cfg = pki.client_config();
        cfg.custom_extensions = vec![CustomExtension::new(ty)];
        assert!(
            matches!(OpenSslContext::new(&cfg), Err(EngineError::Config(_))),
            "{ty:#x}"
        );
    }
    let mut cfg = pki.client_config();
    cfg.custom_extensions = vec![CustomExtension::new(MBX_EXT), CustomExtension::new(MBX_EXT)];
    assert!(
        matches!(OpenSslContext::new(&cfg), Err(EngineError::Config(_))),
        "duplicate accepted"
    );
}

#[test]
fn key_update_before_export_is_refused_not_guessed() {
    let pki = Pki::new();
    let (cc, sc) = (pki.client_config().only(V13), pki.server_config().only(V13));
    let (mut c, mut s) = (rustls_cfg(cc), ossl(&sc));
    pump(&mut c, &mut s).unwrap();
    c.refresh_traffic_keys().unwrap();
    transfer(&mut c, &mut s, b"under the updated keys");
    // OpenSSL side saw a KeyUpdate from the peer: typed refusal.
    assert!(matches!(
        s.export_session(),
        Err(EngineError::Unsupported(_))
    ));
    // rustls side: its current keys no longer match the key-log secrets: typed refusal.
    assert!(matches!(
        c.export_session(),
        Err(EngineError::InexactExport(_))
    ));
}

#[test]
fn partial_records_stay_with_the_caller() {
    let pki = Pki::new();
    for version in [V12, V13] {
        for kind in 0..2 {
            let cc = pki.client_config().only(version);
            let mut c: Box<dyn TlsEngine> = if kind == 0 {
                Box::new(ossl(&cc))
            } else {
                Box::new(rustls_cfg(cc))
            };
            let mut s = ossl(&pki.server_config().only(version));
            pump(c.as_mut(), &mut s).unwrap();
            s.write_plaintext(b"split across two reads").unwrap();
            let bytes = s.take_outgoing();
            c.feed(&bytes[..10]);
            c.process().unwrap();
            assert!(c.take_plaintext().is_empty());
            let ch = c.export_session_boxed().unwrap();
            // The library never saw half a record: all ten bytes come back.
            assert_eq!(
                ch.unprocessed_incoming,
                &bytes[..10],
                "kind {kind} {version:?}"
            );
            let mut whole = ch.unprocessed_incoming.clone();
            whole.extend_from_slice(&bytes[10..]);
            let mut o =
                RecordOpener::new(version, ch.session.rx.keys.clone(), ch.session.rx.next_seq);
            assert_eq!(
                &o.open(&whole).unwrap().plaintext[..],
                b"split across two reads"
            );
        }
    }
}

#[test]
fn openssl_send_fragment_limit_splits_every_record_and_checks_its_range() {
    let pki = Pki::new();
    for version in [V12, V13] {
        let server_ctx = OpenSslContext::new(&pki.server_config().only(version)).unwrap();
        let mut s = server_ctx.engine().unwrap();
        for bad in [0, 511, 16385, usize::MAX] {
            assert!(s.set_max_send_fragment(bad).is_err(), "{bad}");
        }
        s.set_max_send_fragment(512).unwrap();
        let mut c = ossl(&pki.client_config().only(version));
        pump(&mut c, &mut s).unwrap();
        s.write_plaintext(&[7u8; 5000]).unwrap();
        let out = s.take_outgoing();
        let records = split_records(&out);
        // 5000 bytes in records of at most 512 plaintext bytes (plus at most 24 of AEAD).
        assert!(
            records.len() >= 10,
            "{version:?}: {} records",
            records.len()
        );
        assert!(
            records.iter().all(|r| r.len() - 5 <= 512 + 24),
            "{version:?}"
        );
        c.feed(&out);
        c.process().unwrap();
        assert_eq!(c.take_plaintext(), vec![7u8; 5000]);
    }
}

/// The record cap holds for handshake messages too: a client certificate of about 19 KB (900
/// extra names) sent to a server that asks for one leaves a capped client engine in records
/// that each respect the cap, from either kind of context, in both versions, and the server
/// accepts it. (An mbTLS endpoint's secondary session with a client certificate relies on this:
/// an encapsulated record cannot carry a full 16 KB TLS record.)
#[test]
fn client_certificate_larger_than_the_cap_is_split() {
    use mbx_engine::ClientContext;
    use mbx_testbed::pki::LeafSpec;
    let pki = Pki::new();
    let big = (0..900).fold(LeafSpec::client("client.mbx.test"), |spec, i| {
        spec.dns(&format!("alias-{i:04}.client.mbx.test"))
    });
    let client = pki.ca.issue(&big).unwrap();
    assert!(client.cert_der().len() > 16_384);
    const CAP: usize = 4096;
    for version in [V12, V13] {
        let mut cc = pki.client_config().only(version);
        cc.identity = Some(common::identity(&client));
        let mut sc = pki.server_config().only(version);
        sc.verify_peer = true;
        sc.trust_roots_pem = Some(pki.roots());
        let contexts: [(&str, Arc<dyn ClientContext>); 2] = [
            ("openssl", Arc::new(OpenSslContext::new(&cc).unwrap())),
            ("rustls", Arc::new(RustlsClientContext::new(&cc).unwrap())),
        ];
        let expansion = if version == V12 { 24 } else { 17 };
        for (what, ctx) in contexts {
            let mut c = ctx.client_engine(Some(HOST), Some(CAP)).unwrap();
            let mut s = ossl(&sc);
            let mut sent = 0;
            for _ in 0..16 {
                c.process().unwrap();
                let wire = c.take_outgoing();
                for r in split_records(&wire) {
                    assert!(
                        r.len() <= 5 + CAP + expansion,
                        "{what} {version:?}: {}",
                        r.len()
                    );
                }
                sent += wire.len();
                s.feed(&wire);
                s.process().unwrap();
                c.feed(&s.take_outgoing());
                if !c.is_handshaking() && !s.is_handshaking() {
                    break;
                }
            }
            assert!(!s.is_handshaking(), "{what} {version:?}");
            assert!(
                sent > 16_384,
                "{what} {version:?}: the certificate went out"
            );
            assert_eq!(
                s.peer_certificates().first().map(Vec::as_slice),
                Some(client.cert_der().as_ref()),
                "{what} {version:?}"
            );
        }
    }
}

/// The configured cipher suites are a preference order for the rustls client too (as for
/// OpenSSL): against an OpenSSL server, which follows the client's order, the first one
/// configured is negotiated, in either order, in both versions.
#[test]
fn rustls_client_offers_suites_in_the_configured_order() {
    use mbx_engine::ClientContext;
    let pki = Pki::new();
    for (version, order) in [
        (V13, [0x1301u16, 0x1302]),
        (V13, [0x1302, 0x1301]),
        (V12, [0xC02B, 0xC02C]),
        (V12, [0xC02C, 0xC02B]),
    ] {
        let mut cc = pki.client_config().only(version);
        cc.cipher_suites = order.to_vec();
        let ctx = RustlsClientContext::new(&cc).unwrap();
        let mut c = ctx.client_engine(Some(HOST), None).unwrap();
        let mut s = ossl(&pki.server_config().only(version));
        pump(c.as_mut(), &mut s).unwrap();
        assert_eq!(c.cipher_suite(), Some(order[0]), "{version:?} {order:x?}");
        assert_eq!(s.cipher_suite(), Some(order[0]), "{version:?} {order:x?}");
    }
}

/// Trust roots that hold no certificate (a wrong file) are refused when the context is built,
/// by both engines, instead of every handshake failing later.
#[test]
fn trust_roots_without_a_certificate_are_refused() {
    for pem in [&b"not a certificate\n"[..], b""] {
        let cfg = TlsConfig::client(HOST, pem.to_vec());
        for e in [
            OpenSslContext::new(&cfg).err(),
            RustlsClientContext::new(&cfg).err(),
        ] {
            let e = e.expect("refused");
            assert!(e.to_string().contains("no certificate found"), "{e}");
        }
    }
}

/// Both engines say which kind of certificate problem failed a handshake, typed
/// (`EngineError::certificate_problem`), so that callers need not read the libraries' words:
/// a name the certificate is not for, a chain to another CA, an expired and a not yet valid
/// certificate; and nothing for a failure that is not about the certificate.
#[test]
fn both_engines_type_the_certificate_problem_that_failed_a_handshake() {
    use mbx_testbed::pki::{LeafSpec, Validity};
    let pki = Pki::new();
    // Another CA, under another name (one under the same name is a bad signature to both).
    let other = mbx_testbed::pki::TestPki::new("another test CA").unwrap();
    let foreign = TlsConfig::server(common::identity(
        &other.issue(&LeafSpec::server(HOST)).unwrap(),
    ));
    let server_with = |validity| {
        let cert = pki
            .ca
            .issue(&LeafSpec::server(HOST).validity(validity))
            .unwrap();
        TlsConfig::server(common::identity(&cert))
    };
    for version in [V12, V13] {
        let contexts = both_client_contexts(&pki.client_config().only(version));
        let other_version = if version == V12 { V13 } else { V12 };
        let cases = [
            (
                "other.mbx.test",
                pki.server_config(),
                Some(CertificateProblem::NameMismatch),
            ),
            (
                HOST,
                foreign.clone(),
                Some(CertificateProblem::UnknownIssuer),
            ),
            (
                HOST,
                server_with(Validity::Expired),
                Some(CertificateProblem::Expired),
            ),
            (
                HOST,
                server_with(Validity::NotYetValid),
                Some(CertificateProblem::NotYetValid),
            ),
            (HOST, pki.server_config().only(other_version), None),
        ];
        for (engine, ctx) in &contexts {
            for (name, server, problem) in &cases {
                let mut c = ctx.client_engine(Some(name), None).unwrap();
                let mut s = ossl(server);
                let (e, _) = pump_err(c.as_mut(), &mut s);
                let e = e.unwrap_or_else(|| panic!("{engine} {version:?}: {problem:?} accepted"));
                assert_eq!(
                    e.certificate_problem(),
                    *problem,
                    "{engine} {version:?}: {e}"
                );
            }
            // A client that does not verify: OpenSSL notes the failed check and goes on, and a
            // later failure (a forged record) is not typed as the certificate's.
            if *engine == "openssl" {
                let mut lax = pki.client_config().only(version);
                lax.verify_peer = false;
                let mut c = ossl(&lax);
                let mut s = ossl(&foreign);
                pump(&mut c, &mut s).unwrap();
                c.feed(&[
                    23, 3, 3, 0, 20, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18,
                    19, 20,
                ]);
                let e = c.process().unwrap_err();
                assert_eq!(e.certificate_problem(), None, "{version:?}: {e}");
                assert!(
                    e.to_string().contains("certificate check"),
                    "{version:?}: {e}"
                );
            }
            // Positive control: the right name, CA and dates.
            let mut c = ctx.client_engine(Some(HOST), None).unwrap();
            pump(c.as_mut(), &mut ossl(&pki.server_config())).unwrap();
        }
    }
}

/// A client context of each engine, named, for `config`.
fn both_client_contexts(
    config: &TlsConfig,
) -> [(&'static str, Arc<dyn mbx_engine::ClientContext>); 2] {
    [
        ("openssl", Arc::new(OpenSslContext::new(config).unwrap())),
        (
            "rustls",
            Arc::new(RustlsClientContext::new(config).unwrap()),
        ),
    ]
}
