//! Client ↔ pre-configured middlebox ↔ plain TLS server, all OpenSSL engines in memory.

mod common;
mod leaf;
use leaf::identity;

use std::sync::Arc;

use mbx_apps::{Direction, HttpHeaderInsert, MiddleboxApp, Verdict};
use mbx_attest::sim::{measure, signer_id};
use mbx_attest::{HexBytes, Policy, SimulatedAttester, SimulatedPlatform};
use mbx_engine::{
    AlertDescription, CustomExtension, Identity, OpenSslContext, OpenSslEngine,
    RustlsClientContext, TlsConfig, TlsEngine,
};
use mbx_mbtls::handshake::{
    secondary_client_config, ClientHandshake, ClientHandshakeConfig, ClientHandshakeEvent,
    ClientMiddlebox, HandshakeError, MiddleboxHandshake, MiddleboxHandshakeConfig,
    MiddleboxHandshakeEvent,
};
use mbx_mbtls::wire::SecondaryMessage;
use mbx_mbtls::{EndpointEvent, Side, CT_ENCAPSULATED, MIDDLEBOX_SUPPORT_EXTENSION};
use mbx_record::TlsVersion;
use mbx_testbed::pki::{KeyType, LeafSpec, TestPki};

const PROGRAM: &str = "mbx-test-middlebox";

struct Setup {
    client_cfg: ClientHandshakeConfig,
    /// What `client_cfg.primary` was built from.
    client_primary: TlsConfig,
    mbox_cfg: MiddleboxHandshakeConfig,
    server_ctx: OpenSslContext,
    /// What `server_ctx` was built from.
    server_tls: TlsConfig,
    /// The middlebox's secondary context limited to TLS 1.2 (no 0.5-RTT data possible).
    mbox_tls12: Arc<OpenSslContext>,
    /// The CA the client trusts for the server and the middlebox.
    pki: TestPki,
}

/// `mbox_name`: the name in the middlebox certificate; `accepted`: the measurement the client's
/// policy accepts.
fn setup(version: TlsVersion, mbox_name: &str, accepted: [u8; 32]) -> Setup {
    setup_with(version, mbox_name, accepted, false)
}

/// `rogue_ca`: the middlebox certificate comes from a CA the client does not trust.
fn setup_with(version: TlsVersion, mbox_name: &str, accepted: [u8; 32], rogue_ca: bool) -> Setup {
    let mbox = LeafSpec::middlebox(mbox_name);
    setup_full(version, mbox, accepted, rogue_ca, ClientSecondary::OpenSsl)
}

/// The engine of the client's secondary session.
#[derive(Clone, Copy, Debug)]
enum ClientSecondary {
    OpenSsl,
    /// What the CLI uses, configured as the CLI does.
    Rustls,
}

/// `mbox`: the middlebox's certificate.
fn setup_full(
    version: TlsVersion,
    mbox: LeafSpec,
    accepted: [u8; 32],
    rogue_ca: bool,
    client_secondary: ClientSecondary,
) -> Setup {
    let pki = TestPki::new("mbtls test root").unwrap();
    let root = pki.root_pem().into_bytes();
    let (server_id, _) = identity(&pki, &LeafSpec::server("server.test"));
    let rogue = TestPki::new("rogue root").unwrap();
    let mbox_ca = if rogue_ca { &rogue } else { &pki };
    let (mbox_id, _) = identity(mbox_ca, &mbox);

    let mut primary = TlsConfig::client("server.test", root.clone()).only(version);
    primary.custom_extensions = vec![CustomExtension::new(MIDDLEBOX_SUPPORT_EXTENSION)];
    primary.pause_after_handshake = true;
    let secondary = TlsConfig::client("mb.test", root);

    let platform = Arc::new(SimulatedPlatform::generate().unwrap());
    let attester = SimulatedAttester::new(
        platform.clone(),
        measure(PROGRAM, b""),
        signer_id("mbx tests"),
    );
    let policy = Policy {
        allow_simulated: true,
        measurements: vec![HexBytes(accepted.to_vec())],
        sim_platform_keys: vec![HexBytes(platform.public_key().to_vec())],
        ..Policy::default()
    };
    let server_tls = TlsConfig::server(server_id).only(version);
    Setup {
        client_primary: primary.clone(),
        client_cfg: ClientHandshakeConfig {
            primary: Arc::new(OpenSslContext::new(&primary).unwrap()),
            server_name: "server.test".into(),
            secondary: match client_secondary {
                ClientSecondary::OpenSsl => Arc::new(OpenSslContext::new(&secondary).unwrap()),
                ClientSecondary::Rustls => {
                    let cli = secondary_client_config(secondary.trust_roots_pem.clone().unwrap());
                    Arc::new(RustlsClientContext::new(&cli).unwrap())
                }
            },
            middlebox: ClientMiddlebox::Preconfigured("mb.test".into()),
            policy,
            now_unix: mbx_attest::unix_seconds(std::time::SystemTime::now()),
        },
        mbox_tls12: Arc::new(
            OpenSslContext::new(&TlsConfig::server(mbox_id.clone()).only(TlsVersion::Tls12))
                .unwrap(),
        ),
        mbox_cfg: MiddleboxHandshakeConfig::new(
            &TlsConfig::server(mbox_id),
            Some(Arc::new(attester)),
        )
        .unwrap(),
        // A legacy server: plain OpenSSL, knows nothing about mbTLS.
        server_ctx: OpenSslContext::new(&server_tls).unwrap(),
        server_tls,
        pki,
    }
}

/// Counts the evidence asked of the attester it wraps.
struct Counting(
    Arc<dyn mbx_attest::Attester>,
    std::sync::atomic::AtomicUsize,
);

impl mbx_attest::Attester for Counting {
    fn evidence(
        &self,
        report_data: &[u8; mbx_attest::REPORT_DATA_LEN],
    ) -> Result<mbx_attest::Evidence, mbx_attest::AttestError> {
        self.1.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.0.evidence(report_data)
    }
}

/// [`setup`] with the middlebox's evidence in its certificate (made once, at certification,
/// for its key and a nonce), the client's policy taking that mode if `accepted`; and the
/// attester the middlebox holds, which counts what it is asked for.
fn setup_cert_bound(version: TlsVersion, accepted: bool) -> (Setup, Arc<Counting>) {
    let mut s = setup(version, "mb.test", measure(PROGRAM, b""));
    let attester = s.mbox_cfg.attester.clone().unwrap();
    let id =
        leaf::identity_with_certificate_evidence(&s.pki, "mb.test", attester.as_ref(), b"nonce");
    let counting = Arc::new(Counting(attester, Default::default()));
    s.mbox_cfg = MiddleboxHandshakeConfig::new(&TlsConfig::server(id), Some(counting.clone()))
        .unwrap()
        .evidence_in_certificate()
        .unwrap();
    s.client_cfg.policy.certificate_evidence = accepted;
    // Its start-up check asked once, for the code it runs; the count starts at the sessions.
    assert_eq!(counting.1.swap(0, std::sync::atomic::Ordering::SeqCst), 1);
    (s, counting)
}

/// Counts the bytes each record of the server→client direction carried through the app.
struct Net<A: MiddleboxApp> {
    client: ClientHandshake,
    mbox: MiddleboxHandshake<A>,
    server: OpenSslEngine,
    client_err: Option<HandshakeError>,
    mbox_err: Option<HandshakeError>,
    /// Delivers each batch toward the client with its first primary record ahead of its
    /// encapsulated ones (a middlebox answering after the primary ServerHello).
    primary_first_to_client: bool,
}

impl<A: MiddleboxApp> Net<A> {
    fn new(s: &Setup, app: A) -> Self {
        Net {
            client: ClientHandshake::new(s.client_cfg.clone()).unwrap(),
            mbox: MiddleboxHandshake::new(s.mbox_cfg.clone(), app).unwrap(),
            server: s.server_ctx.engine().unwrap(),
            client_err: None,
            mbox_err: None,
            primary_first_to_client: false,
        }
    }

    /// Moves bytes until nothing moves. The server writes `server_first` as soon as its
    /// handshake is complete (data in the same flight as its last handshake messages).
    fn pump(&mut self, server_first: &mut Option<Vec<u8>>) {
        loop {
            let mut moved = false;
            let c = self.client.take_outgoing();
            if !c.is_empty() && self.mbox_err.is_none() {
                moved = true;
                if let Err(e) = self.mbox.receive(Side::Client, &c) {
                    self.mbox_err = Some(e);
                }
            }
            let to_s = self.mbox.take_outgoing(Side::Server);
            if !to_s.is_empty() {
                moved = true;
                self.server.feed(&to_s);
                let _ = self.server.process();
            }
            if !self.server.is_handshaking() {
                if let Some(d) = server_first.take() {
                    self.server.write_plaintext(&d).unwrap();
                }
            }
            let s = self.server.take_outgoing();
            if !s.is_empty() && self.mbox_err.is_none() {
                moved = true;
                if let Err(e) = self.mbox.receive(Side::Server, &s) {
                    self.mbox_err = Some(e);
                }
            }
            let mut to_c = self.mbox.take_outgoing(Side::Client);
            if self.primary_first_to_client {
                to_c = primary_record_first(&to_c);
            }
            if !to_c.is_empty() && self.client_err.is_none() {
                moved = true;
                if let Err(e) = self.client.receive(&to_c) {
                    self.client_err = Some(e);
                }
            }
            if !moved {
                return;
            }
        }
    }
}

/// The records of `bytes` (whole records) with the first primary record moved ahead of the
/// encapsulated ones, the rest in order.
fn primary_record_first(bytes: &[u8]) -> Vec<u8> {
    let mut records = common::records(bytes);
    if let Some(i) = records.iter().position(|r| r[0] != CT_ENCAPSULATED.0) {
        let first = records.remove(i);
        records.insert(0, first);
    }
    records.concat()
}

fn mbox_events<A: MiddleboxApp>(m: &mut MiddleboxHandshake<A>) -> Vec<MiddleboxHandshakeEvent> {
    std::iter::from_fn(|| m.poll_event()).collect()
}

fn client_events(c: &mut ClientHandshake) -> Vec<ClientHandshakeEvent> {
    std::iter::from_fn(|| c.poll_event()).collect()
}

/// Marks server→client data so we can see it crossed the middlebox's app.
struct Tagger(HttpHeaderInsert);
impl MiddleboxApp for Tagger {
    fn on_data(&mut self, dir: Direction, data: &[u8], out: &mut Vec<u8>) -> Verdict {
        match dir {
            Direction::ServerToClient => {
                out.extend(data.iter().map(|b| b.to_ascii_uppercase()));
                Verdict::Continue
            }
            Direction::ClientToServer => self.0.on_data(dir, data, out),
        }
    }
}

fn tagger() -> Tagger {
    Tagger(HttpHeaderInsert::new("X-Mbtls", "mb.test").unwrap())
}

/// A middlebox configuration refuses a certificate it cannot parse when it is built, not at
/// each connection; a good one gives the SubjectPublicKeyInfo the evidence is bound to.
#[test]
fn middlebox_config_checks_its_certificate_once() {
    let pki = TestPki::new("mbtls test root").unwrap();
    let (id, der) = identity(&pki, &LeafSpec::middlebox("mbox.test"));
    let with_chain = |pem: &[u8]| {
        TlsConfig::server(Identity {
            cert_chain_pem: pem.to_vec(),
            key_pem: id.key_pem.clone(),
        })
    };
    assert!(MiddleboxHandshakeConfig::new(&with_chain(b"not a certificate"), None).is_err());
    assert!(MiddleboxHandshakeConfig::new(&with_chain(&[]), None).is_err());
    let cfg = MiddleboxHandshakeConfig::new(&TlsConfig::server(id.clone()), None).unwrap();
    assert!(!cfg.spki().is_empty());
    assert_eq!(
        cfg.spki(),
        mbx_attest::spki_from_certificate(&der).unwrap().as_slice()
    );
}

#[test]
fn preconfigured_middlebox_joins_and_relays_both_versions() {
    for version in [TlsVersion::Tls12, TlsVersion::Tls13] {
        let s = setup(version, "mb.test", measure(PROGRAM, b""));
        let mut net = Net::new(&s, tagger());
        // The server talks first, in the flight of its last handshake messages: this data has
        // to wait at the middlebox for its keys, and must still go through its app.
        let mut first = Some(b"hello from the server".to_vec());
        net.client
            .write(b"GET / HTTP/1.1\r\nHost: server.test\r\n\r\n")
            .unwrap();
        net.pump(&mut first);
        assert!(
            net.client_err.is_none(),
            "{version:?}: {:?}",
            net.client_err
        );
        assert!(net.mbox_err.is_none(), "{version:?}: {:?}", net.mbox_err);

        let me = mbox_events(&mut net.mbox);
        assert!(
            me.contains(&MiddleboxHandshakeEvent::Joined { subchannel: 0 }),
            "{me:?}"
        );
        assert!(me.contains(&MiddleboxHandshakeEvent::EvidenceSent));
        assert!(me.contains(&MiddleboxHandshakeEvent::KeysInstalled));
        let ce = client_events(&mut net.client);
        assert!(
            matches!(
                ce.first(),
                Some(ClientHandshakeEvent::MiddleboxVerified {
                    claims: Some(_),
                    evidence_in_certificate: false,
                    ..
                })
            ),
            "{ce:?}"
        );
        assert!(ce.contains(&ClientHandshakeEvent::KeysSent));
        if version == TlsVersion::Tls13 {
            // OpenSSL's session tickets crossed the middlebox re-protected and were ignored.
            assert!(
                ce.contains(&ClientHandshakeEvent::Data(
                    EndpointEvent::SessionTicketIgnored
                )),
                "{ce:?}"
            );
        }
        assert!(ce.contains(&ClientHandshakeEvent::Ready));
        assert!(net.client.is_ready());
        // The middlebox held the server's application records instead of forwarding them raw.
        assert_eq!(net.client.discarded_records(), 0, "{version:?}");

        // The request reached the legacy server through the app (header inserted once).
        assert_eq!(
            net.server.take_plaintext(),
            b"GET / HTTP/1.1\r\nHost: server.test\r\nX-Mbtls: mb.test\r\n\r\n"
        );
        // The server's early data went through the app too (upper-cased), exactly once.
        assert_eq!(net.client.take_plaintext(), b"HELLO FROM THE SERVER");

        // More traffic both ways.
        net.server.write_plaintext(b"response body").unwrap();
        net.client.write(b"GET /2 HTTP/1.1\r\n\r\n").unwrap();
        net.pump(&mut None);
        assert_eq!(net.client.take_plaintext(), b"RESPONSE BODY");
        assert_eq!(
            net.server.take_plaintext(),
            b"GET /2 HTTP/1.1\r\nX-Mbtls: mb.test\r\n\r\n"
        );
        // Middlebox hop keys differ from the bridge (primary) keys on the server side.
        let relay = net.mbox.relay().unwrap();
        assert_ne!(
            relay.key_fingerprints(Side::Client).0,
            relay.key_fingerprints(Side::Server).1
        );
    }
}

/// The middlebox's certificate key is the operator's choice: with each key type a TLS server
/// may hold (ECDSA P-256 and P-384, RSA-2048, Ed25519), both versions and both engines of the
/// client's secondary session, the middlebox is verified, gets its keys and relays.
#[test]
fn middleboxes_with_every_certificate_key_type_join() {
    let key_types = [
        KeyType::EcdsaP256,
        KeyType::EcdsaP384,
        KeyType::Rsa2048,
        KeyType::Ed25519,
    ];
    for key_type in key_types {
        for engine in [ClientSecondary::OpenSsl, ClientSecondary::Rustls] {
            for version in [TlsVersion::Tls12, TlsVersion::Tls13] {
                let mbox = LeafSpec::middlebox("mb.test").key_type(key_type);
                let s = setup_full(version, mbox, measure(PROGRAM, b""), false, engine);
                let mut net = Net::new(&s, tagger());
                net.client.write(b"GET / HTTP/1.1\r\n\r\n").unwrap();
                net.pump(&mut None);
                let case = format!("{key_type:?} {engine:?} {version:?}");
                assert!(net.client_err.is_none(), "{case}: {:?}", net.client_err);
                assert!(net.mbox_err.is_none(), "{case}: {:?}", net.mbox_err);
                let ce = client_events(&mut net.client);
                let verified = ce.iter().any(|e| {
                    matches!(
                        e,
                        ClientHandshakeEvent::MiddleboxVerified {
                            claims: Some(_),
                            ..
                        }
                    )
                });
                assert!(verified, "{case}: {ce:?}");
                assert!(net.client.is_ready(), "{case}");
                assert_eq!(
                    net.server.take_plaintext(),
                    b"GET / HTTP/1.1\r\nX-Mbtls: mb.test\r\n\r\n",
                    "{case}"
                );
            }
        }
    }
}

#[test]
fn evidence_failing_policy_gets_no_key_material() {
    for version in [TlsVersion::Tls12, TlsVersion::Tls13] {
        let s = setup(version, "mb.test", measure("some other program", b""));
        let mut net = Net::new(&s, tagger());
        net.client.write(b"secret request").unwrap();
        net.pump(&mut None);
        assert!(
            matches!(
                net.client_err.as_ref().map(HandshakeError::cause),
                Some(HandshakeError::Attestation(_))
            ),
            "{:?}",
            net.client_err
        );
        // The error names the middlebox that failed.
        let said = net.client_err.as_ref().unwrap().to_string();
        assert!(
            said.starts_with("middlebox mb.test: attestation: "),
            "{said}"
        );
        assert!(!net.client.keys_sent());
        assert!(!net.mbox.keys_installed());
        let me = mbox_events(&mut net.mbox);
        assert!(me.contains(&MiddleboxHandshakeEvent::EvidenceSent));
        assert!(!me.contains(&MiddleboxHandshakeEvent::KeysInstalled));
        assert!(net.server.take_plaintext().is_empty());
    }
}

/// The spec's second binding mode: the middlebox points each session at the evidence in its
/// certificate and makes none (no quote per session); a client whose policy takes the mode
/// checks it and the session runs, one whose policy does not sends no key material. A
/// middlebox whose certificate carries no evidence cannot be set to the mode.
#[test]
fn evidence_in_the_certificate_is_taken_only_where_the_policy_allows_it() {
    for version in [TlsVersion::Tls12, TlsVersion::Tls13] {
        let (s, counting) = setup_cert_bound(version, true);
        let mut net = Net::new(&s, tagger());
        net.client.write(b"GET / HTTP/1.1\r\n\r\n").unwrap();
        net.pump(&mut None);
        assert!(net.client_err.is_none(), "{:?}", net.client_err);
        assert!(net.client.keys_sent() && net.mbox.keys_installed());
        assert!(
            matches!(
                client_events(&mut net.client).first(),
                Some(ClientHandshakeEvent::MiddleboxVerified {
                    claims: Some(_),
                    evidence_in_certificate: true,
                    ..
                })
            ),
            "{version:?}"
        );
        assert_eq!(
            net.server.take_plaintext(),
            b"GET / HTTP/1.1\r\nX-Mbtls: mb.test\r\n\r\n"
        );
        assert_eq!(counting.1.load(std::sync::atomic::Ordering::SeqCst), 0);

        let (s, _) = setup_cert_bound(version, false);
        let mut net = Net::new(&s, tagger());
        net.client.write(b"secret request").unwrap();
        net.pump(&mut None);
        let said = net.client_err.as_ref().map(ToString::to_string);
        assert!(
            said.as_deref()
                .is_some_and(|e| e.contains("certificate_evidence = false")),
            "{said:?}"
        );
        assert!(!net.client.keys_sent() && !net.mbox.keys_installed());
        assert!(net.server.take_plaintext().is_empty());
    }
    let s = setup(TlsVersion::Tls13, "mb.test", measure(PROGRAM, b""));
    let plain = s.mbox_cfg.clone().evidence_in_certificate();
    let e = plain.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(e.contains("carries no evidence"), "{e}");
    // Nor one whose evidence is for another key: every session would fail.
    let attester = s.mbox_cfg.attester.clone().unwrap();
    let for_another_key = |_: &[u8]| {
        mbx_attest::CertificateEvidence::make(attester.as_ref(), b"another key", b"nonce")
            .unwrap()
            .encode()
            .unwrap()
    };
    let oid = &mbx_attest::cert_bound::EVIDENCE_EXTENSION_OID;
    let leaf = s
        .pki
        .issue_with_extension(
            &LeafSpec::middlebox("mb.test"),
            Some((oid, &for_another_key)),
        )
        .unwrap();
    let id = Identity::from_pem(leaf.chain_pem(), leaf.key_pem().as_bytes());
    let e = MiddleboxHandshakeConfig::new(&TlsConfig::server(id), Some(attester.clone()))
        .unwrap()
        .evidence_in_certificate()
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(e.contains("report_data"), "{e}");
    // Nor one whose evidence is for other code than this middlebox's attester measures (a
    // program changed since its certificate was requested): endpoints would trust the old
    // measurement (found in a user trial).
    let other = SimulatedAttester::new(
        Arc::new(SimulatedPlatform::generate().unwrap()),
        measure("other program", b""),
        signer_id("mbx tests"),
    );
    let id = leaf::identity_with_certificate_evidence(&s.pki, "mb.test", &other, b"nonce");
    let e = MiddleboxHandshakeConfig::new(&TlsConfig::server(id), Some(attester))
        .unwrap()
        .evidence_in_certificate()
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        e.contains("claims code measurement") && e.contains("runs other code"),
        "{e}"
    );
}

#[test]
fn middlebox_with_wrong_certificate_gets_no_key_material() {
    for version in [TlsVersion::Tls12, TlsVersion::Tls13] {
        let s = setup(version, "impostor.test", measure(PROGRAM, b""));
        let mut net = Net::new(&s, tagger());
        net.client.write(b"secret request").unwrap();
        net.pump(&mut None);
        assert!(
            matches!(
                net.client_err.as_ref().map(HandshakeError::cause),
                Some(HandshakeError::Engine(_))
            ),
            "{:?}",
            net.client_err
        );
        assert!(!net.client.keys_sent());
        assert!(!net.mbox.keys_installed());
        assert!(net.server.take_plaintext().is_empty());
        // The middlebox learns why it is out: the client's alert named its certificate.
        let me = mbox_events(&mut net.mbox);
        assert!(
            me.iter().any(|e| matches!(e, MiddleboxHandshakeEvent::Passive(why) if why.starts_with("the client refused our certificate"))),
            "{version:?}: {me:?}"
        );
    }
}

#[test]
fn evidence_from_another_session_is_rejected() {
    // The middlebox replays evidence bound to a different exporter value.
    struct Replayer(SimulatedAttester);
    impl mbx_attest::Attester for Replayer {
        fn evidence(
            &self,
            _report_data: &[u8; 64],
        ) -> Result<mbx_attest::Evidence, mbx_attest::AttestError> {
            self.0.evidence(&[7u8; 64])
        }
    }
    let mut s = setup(TlsVersion::Tls13, "mb.test", measure(PROGRAM, b""));
    let platform = Arc::new(SimulatedPlatform::generate().unwrap());
    s.client_cfg.policy.sim_platform_keys = vec![HexBytes(platform.public_key().to_vec())];
    s.mbox_cfg.attester = Some(Arc::new(Replayer(SimulatedAttester::new(
        platform,
        measure(PROGRAM, b""),
        signer_id("mbx tests"),
    ))));
    let mut net = Net::new(&s, tagger());
    net.pump(&mut None);
    assert!(matches!(
        net.client_err.as_ref().map(HandshakeError::cause),
        Some(HandshakeError::Attestation(_))
    ));
    assert!(!net.mbox.keys_installed());
}

/// TLS 1.3: the server's application records reach the middlebox *before* the client's
/// Finished does (0.5-RTT data). The middlebox has forwarded them raw; they must still go
/// through its app, exactly once, after its keys arrive (found by trial opening).
#[test]
fn tls13_server_data_ahead_of_client_finished_goes_through_the_app() {
    let s = setup(TlsVersion::Tls13, "mb.test", measure(PROGRAM, b""));
    let mut net = Net::new(&s, tagger());
    // Flight 1: ClientHello through the middlebox to the server, server flight back.
    let ch = net.client.take_outgoing();
    net.mbox.receive(Side::Client, &ch).unwrap();
    net.server.feed(&net.mbox.take_outgoing(Side::Server));
    net.server.process().unwrap();
    net.mbox
        .receive(Side::Server, &net.server.take_outgoing())
        .unwrap();
    net.client
        .receive(&net.mbox.take_outgoing(Side::Client))
        .unwrap();
    // Flight 2 from the client: secondary Finished (encapsulated) + primary Finished.
    let flight2 = net.client.take_outgoing();
    // The server gets the primary part first (as if the middlebox were slow), completes and
    // sends data at once.
    net.server.feed(&common::primary_only(&flight2));
    net.server.process().unwrap();
    assert!(!net.server.is_handshaking());
    net.server.write_plaintext(b"early words").unwrap();
    let early = net.server.take_outgoing();
    // The middlebox sees the server's data before the client's Finished.
    net.mbox.receive(Side::Server, &early).unwrap();
    net.mbox.receive(Side::Client, &flight2).unwrap();
    // What it forwards to the server now is the client's Finished again: already delivered.
    let _ = net.mbox.take_outgoing(Side::Server);
    net.pump(&mut None);
    assert!(net.client_err.is_none(), "{:?}", net.client_err);
    assert!(net.mbox_err.is_none(), "{:?}", net.mbox_err);
    assert!(net.mbox.keys_installed());
    assert!(net.client.is_ready());
    // Forwarded raw before the client's Finished passed (so dropped by the client), then
    // through the app (upper-cased), exactly once.
    assert!(net.client.discarded_records() >= 1);
    assert_eq!(net.client.take_plaintext(), b"EARLY WORDS");
    net.client.write(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    net.pump(&mut None);
    assert_eq!(
        net.server.take_plaintext(),
        b"GET / HTTP/1.1\r\nX-Mbtls: mb.test\r\n\r\n"
    );
}

/// A client-side middlebox keeps the server's records it cannot read yet, copied while it
/// forwards them raw or held, up to `MAX_COPIED_BYTES`: more fails the session, instead of
/// growing until the handshake timeout while a client (colluding with its server) never sends
/// the key material.
#[test]
fn a_middlebox_keeps_a_bounded_amount_of_server_data_before_its_keys() {
    let s = setup(TlsVersion::Tls13, "mb.test", measure(PROGRAM, b""));
    for client_finished_seen in [false, true] {
        let mut net = Net::new(&s, tagger());
        first_round_trip(&mut net);
        // The client's second flight reaches the server (not its key material, which stays
        // away from the middlebox): the server is done and sends.
        let finished = common::primary_only(&net.client.take_outgoing());
        net.server.feed(&finished);
        net.server.process().unwrap();
        if client_finished_seen {
            // From the client's Finished on, the middlebox holds the server's records.
            net.mbox.receive(Side::Client, &finished).unwrap();
            let _ = net.mbox.take_outgoing(Side::Server);
        }
        let e = common::refused_past_the_bound(|mib| {
            net.server.write_plaintext(mib).unwrap();
            net.mbox
                .receive(Side::Server, &net.server.take_outgoing())?;
            net.mbox.take_outgoing(Side::Client);
            Ok::<_, HandshakeError>(())
        });
        assert!(
            e.to_string().contains("too much server data"),
            "{client_finished_seen}: {e}"
        );
        assert!(!net.mbox.keys_installed());
    }
}

/// Each server record kept counts more than its bytes: empty records reach the bound long
/// before 16 MiB of them.
#[test]
fn empty_server_records_count_against_the_bound_for_more_than_their_bytes() {
    let s = setup(TlsVersion::Tls13, "mb.test", measure(PROGRAM, b""));
    let mut net = Net::new(&s, tagger());
    first_round_trip(&mut net);
    let finished = common::primary_only(&net.client.take_outgoing());
    net.mbox.receive(Side::Client, &finished).unwrap();
    let empty = [23u8, 3, 3, 0, 0];
    let failed = common::first_failure(100_000, |_| net.mbox.receive(Side::Server, &empty));
    let (sent, e) = failed.expect("100,000 empty records kept");
    assert!(sent > 50_000, "{sent}");
    assert!(e.to_string().contains("too much server data"), "{e}");
}

/// The primary ServerHello is kept, record by record, until it ends: a server that splits it
/// over hundreds of one-byte records is refused instead of having each kept.
#[test]
fn a_server_hello_in_too_many_records_is_refused() {
    let s = setup(TlsVersion::Tls13, "mb.test", measure(PROGRAM, b""));
    let mut net = Net::new(&s, tagger());
    let ch = net.client.take_outgoing();
    net.mbox.receive(Side::Client, &ch).unwrap();
    // A ServerHello of 4,096 bytes announced, then sent one byte per record.
    let header = [2u8, 0, 0x10, 0];
    let body = std::iter::repeat_n(0u8, 4096);
    let failed = header
        .into_iter()
        .chain(body)
        .enumerate()
        .find_map(|(i, b)| {
            net.mbox
                .receive(Side::Server, &[22, 3, 3, 0, 1, b])
                .err()
                .map(|e| (i, e))
        });
    let (i, e) = failed.expect("every record kept");
    assert_eq!(i, 256, "{e}");
    assert!(e.to_string().contains("too many records"), "{e}");
}

/// The middlebox's secondary session runs between the client and it: a record on its
/// subchannel from the server's side is forged (it would break that session, and a client
/// that only approved the middlebox would go on without it) and ends the connection
/// unforwarded.
#[test]
fn a_record_on_the_middleboxs_subchannel_from_the_server_is_refused() {
    let s = setup(TlsVersion::Tls13, "mb.test", measure(PROGRAM, b""));
    let mut net = Net::new(&s, tagger());
    first_round_trip(&mut net);
    assert!(mbox_events(&mut net.mbox)
        .iter()
        .any(|e| matches!(e, MiddleboxHandshakeEvent::Joined { subchannel: 0 })));
    let other = mbx_mbtls::wire::announcement_record(1, 0x0303).unwrap();
    net.mbox.receive(Side::Server, &other).unwrap();
    assert_eq!(net.mbox.take_outgoing(Side::Client), other);
    let forged = mbx_mbtls::wire::announcement_record(0, 0x0303).unwrap();
    let err = net.mbox.receive(Side::Server, &forged).unwrap_err();
    assert!(
        err.to_string().contains("subchannel came from the server"),
        "{err}"
    );
    assert!(net.mbox.take_outgoing(Side::Client).is_empty());
}

/// Client's first flight to the server, then the server's first flight back to the client,
/// both through the middlebox.
fn first_round_trip<A: MiddleboxApp>(net: &mut Net<A>) {
    let ch = net.client.take_outgoing();
    net.mbox.receive(Side::Client, &ch).unwrap();
    net.server.feed(&net.mbox.take_outgoing(Side::Server));
    net.server.process().unwrap();
    net.mbox
        .receive(Side::Server, &net.server.take_outgoing())
        .unwrap();
    net.client
        .receive(&net.mbox.take_outgoing(Side::Client))
        .unwrap();
}

/// P7 under TLS 1.3: the evidence is 0.5-RTT data of the secondary session, in the
/// middlebox's first flight, so the client verifies it and sends key material and its first
/// request in its second flight, as a plain TLS 1.3 client would send its request.
#[test]
fn tls13_evidence_rides_the_middleboxs_first_flight() {
    let s = setup(TlsVersion::Tls13, "mb.test", measure(PROGRAM, b""));
    let mut net = Net::new(&s, tagger());
    net.client.write(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    first_round_trip(&mut net);
    let me = mbox_events(&mut net.mbox);
    assert!(
        me.contains(&MiddleboxHandshakeEvent::EvidenceSent),
        "{me:?}"
    );
    let ce = client_events(&mut net.client);
    assert!(
        matches!(
            ce.first(),
            Some(ClientHandshakeEvent::MiddleboxVerified {
                claims: Some(_),
                ..
            })
        ),
        "{ce:?}"
    );
    assert!(ce.contains(&ClientHandshakeEvent::KeysSent), "{ce:?}");
    // The second flight: primary Finished, secondary Finished, key material, request.
    let flight2 = net.client.take_outgoing();
    net.mbox.receive(Side::Client, &flight2).unwrap();
    assert!(mbox_events(&mut net.mbox).contains(&MiddleboxHandshakeEvent::KeysInstalled));
    net.server.feed(&net.mbox.take_outgoing(Side::Server));
    net.server.process().unwrap();
    assert!(!net.server.is_handshaking());
    assert_eq!(
        net.server.take_plaintext(),
        b"GET / HTTP/1.1\r\nX-Mbtls: mb.test\r\n\r\n"
    );
}

/// A TLS 1.2 secondary session cannot carry 0.5-RTT data: the evidence follows the
/// middlebox's Finished, after the client's secondary Finished, and the handshake still works.
#[test]
fn tls12_secondary_session_sends_evidence_after_its_handshake() {
    for version in [TlsVersion::Tls12, TlsVersion::Tls13] {
        let mut s = setup(version, "mb.test", measure(PROGRAM, b""));
        s.mbox_cfg.tls = s.mbox_tls12.clone();
        let mut net = Net::new(&s, tagger());
        net.client.write(b"GET / HTTP/1.1\r\n\r\n").unwrap();
        first_round_trip(&mut net);
        let me = mbox_events(&mut net.mbox);
        assert!(
            me.contains(&MiddleboxHandshakeEvent::Joined { subchannel: 0 }),
            "{me:?}"
        );
        assert!(
            !me.contains(&MiddleboxHandshakeEvent::EvidenceSent),
            "{me:?}"
        );
        assert!(!net.client.keys_sent());
        net.pump(&mut None);
        assert!(net.client_err.is_none(), "{:?}", net.client_err);
        assert!(net.mbox_err.is_none(), "{:?}", net.mbox_err);
        assert!(mbox_events(&mut net.mbox).contains(&MiddleboxHandshakeEvent::EvidenceSent));
        assert!(net.client.is_ready());
        assert_eq!(
            net.server.take_plaintext(),
            b"GET / HTTP/1.1\r\nX-Mbtls: mb.test\r\n\r\n"
        );
    }
}

/// What a rogue middlebox (a plain server engine speaking the mbTLS wire format) and the
/// server send the client for its ClientHello: the rogue's first flight on subchannel 0, with
/// the 0.5-RTT messages `half_rtt` gives it the evidence for (its exporter-bound evidence),
/// then the server's first flight.
fn rogue_and_server_flights(
    s: &Setup,
    client: &mut ClientHandshake,
    half_rtt: impl FnOnce(Vec<u8>) -> Vec<SecondaryMessage>,
) -> Vec<u8> {
    use mbx_attest::{report_data, EXPORTER_LABEL, EXPORTER_LEN};
    use mbx_mbtls::handshake::{hello_records, Demux, Piece};
    use mbx_mbtls::wire::{Encapsulated, MiddleboxSupport};
    use mbx_wire::ClientHello;

    let mut server = s.server_ctx.engine().unwrap();
    let ch = client.take_outgoing();
    // The optimistic hello from the client's MiddleboxSupport extension.
    let mut demux = Demux::new();
    demux.push(&ch);
    let Some(Piece::Primary(rec)) = demux.next_piece().unwrap() else {
        panic!("no primary ClientHello record");
    };
    let hello = ClientHello::parse_message(rec.payload()).unwrap();
    let support =
        MiddleboxSupport::parse(hello.extension(MIDDLEBOX_SUPPORT_EXTENSION).unwrap()).unwrap();
    let mut rogue = s.mbox_cfg.tls.engine().unwrap();
    rogue.enable_half_rtt().unwrap();
    rogue.feed(&hello_records(&support.client_hellos[0]).unwrap());
    rogue.process().unwrap();
    let label = std::str::from_utf8(EXPORTER_LABEL).unwrap();
    let binder = rogue
        .export_keying_material(label, None, EXPORTER_LEN)
        .unwrap();
    let spki = s.mbox_cfg.spki().to_vec();
    let attester = s.mbox_cfg.attester.as_ref().unwrap();
    let evidence = attester
        .evidence(&report_data(&spki, &binder))
        .unwrap()
        .to_bytes();
    for message in half_rtt(evidence) {
        rogue.write_half_rtt(&message.encode().unwrap()).unwrap();
    }
    let mut to_client = Vec::new();
    Encapsulated::wrap_stream(
        0,
        &rogue.take_outgoing(),
        mbx_wire::version::TLS1_2,
        &mut to_client,
    )
    .unwrap();
    server.feed(&ch);
    server.process().unwrap();
    to_client.extend(server.take_outgoing());
    to_client
}

/// A rogue middlebox that sends its valid evidence as 0.5-RTT data followed by `extra`: the
/// client accepts nothing but the one evidence message, fails, and never sends key material.
#[test]
fn client_accepts_only_the_evidence_as_half_rtt_data() {
    use mbx_mbtls::{client_side_keys, HopKeys};
    use mbx_record::CipherSuite;

    let suite = CipherSuite::TLS13_AES_128_GCM_SHA256;
    let bridge = HopKeys::generate(TlsVersion::Tls13, &suite, 0, 0).unwrap();
    let km = client_side_keys(TlsVersion::Tls13, suite, bridge, 1)
        .unwrap()
        .middleboxes
        .remove(0);
    let s = setup(TlsVersion::Tls13, "mb.test", measure(PROGRAM, b""));
    let extras = [
        SecondaryMessage::KeyMaterial(Box::new(km)),
        SecondaryMessage::Evidence(Vec::new()),
    ];
    for extra in extras {
        let mut client = ClientHandshake::new(s.client_cfg.clone()).unwrap();
        let to_client = rogue_and_server_flights(&s, &mut client, |evidence| {
            vec![SecondaryMessage::Evidence(evidence), extra]
        });
        let err = client.receive(&to_client).unwrap_err();
        assert!(
            matches!(err.cause(), HandshakeError::Protocol(m) if m.contains("unexpected secondary message")),
            "{err:?}"
        );
        // Named: which middlebox sent it.
        assert!(err.to_string().starts_with("middlebox "), "{err}");
        // The evidence itself was good: only the extra message failed the handshake.
        let ce = client_events(&mut client);
        assert!(
            matches!(
                ce.first(),
                Some(ClientHandshakeEvent::MiddleboxVerified {
                    claims: Some(_),
                    ..
                })
            ),
            "{ce:?}"
        );
        assert!(!ce.contains(&ClientHandshakeEvent::KeysSent), "{ce:?}");
        assert!(!client.keys_sent());
    }
}

/// A client's handshake says what it waits for (the error of a handshake that timed out
/// names it; thirty-fourth round, from an independent implementer whose middlebox sent no
/// evidence message and whose client said only that the session was not set up in time):
/// the server's handshake at first; a middlebox whose secondary handshake is done but whose
/// evidence message has not come, by name, and no longer the server, whose flight is in; then
/// nothing, once the evidence came and the data phase started.
#[test]
fn a_clients_handshake_says_what_it_waits_for() {
    let s = setup(TlsVersion::Tls13, "mb.test", measure(PROGRAM, b""));
    let mut client = ClientHandshake::new(s.client_cfg.clone()).unwrap();
    assert_eq!(
        client.waiting_for().as_deref(),
        Some("the server's handshake")
    );
    let to_client = rogue_and_server_flights(&s, &mut client, |_| Vec::new());
    client.receive(&to_client).unwrap();
    let waiting = client.waiting_for().unwrap_or_default();
    assert!(
        waiting.starts_with("middlebox mb.test's evidence message")
            && !waiting.contains("the server"),
        "{waiting}"
    );
    assert!(!client.keys_sent());

    let mut client = ClientHandshake::new(s.client_cfg.clone()).unwrap();
    let to_client = rogue_and_server_flights(&s, &mut client, |evidence| {
        vec![SecondaryMessage::Evidence(evidence)]
    });
    client.receive(&to_client).unwrap();
    assert!(client.keys_sent());
    assert_eq!(client.waiting_for(), None);
}

/// The raw server records the client drops before the middlebox's switch marker must still
/// authenticate under the bridge keys: a tampered one is fatal, not silently ignored.
#[test]
fn tampered_record_before_the_switch_marker_is_fatal() {
    let s = setup(TlsVersion::Tls13, "mb.test", measure(PROGRAM, b""));
    let mut net = Net::new(&s, tagger());
    let ch = net.client.take_outgoing();
    net.mbox.receive(Side::Client, &ch).unwrap();
    net.server.feed(&net.mbox.take_outgoing(Side::Server));
    net.server.process().unwrap();
    net.mbox
        .receive(Side::Server, &net.server.take_outgoing())
        .unwrap();
    net.client
        .receive(&net.mbox.take_outgoing(Side::Client))
        .unwrap();
    let flight2 = net.client.take_outgoing();
    net.server.feed(&common::primary_only(&flight2));
    net.server.process().unwrap();
    net.server.write_plaintext(b"early words").unwrap();
    let early = net.server.take_outgoing();
    // The middlebox forwards the server's early record raw; an attacker flips its last byte.
    net.mbox.receive(Side::Server, &early).unwrap();
    let mut raw = net.mbox.take_outgoing(Side::Client);
    assert!(!raw.is_empty());
    *raw.last_mut().unwrap() ^= 1;
    // The client already exported (the evidence came with the middlebox's first flight, so
    // its second flight carried the key material): the record arrives before the switch marker,
    // is authenticated under the bridge keys and refused, although the middlebox would re-send
    // a good copy through its app afterwards.
    assert!(net.client.keys_sent());
    let err = net.client.receive(&raw).unwrap_err();
    assert!(
        matches!(&err, HandshakeError::Protocol(m) if m.contains("failed authentication")),
        "{err:?}"
    );
    net.mbox.receive(Side::Client, &flight2).unwrap();
    let _ = net.mbox.take_outgoing(Side::Server);
    net.pump(&mut None);
    assert!(!net.client.is_ready());
    assert!(net.client.take_plaintext().is_empty());
}

/// A pre-configured middlebox that is not on the path (the client reaches the server
/// directly): the handshake fails and no key material is ever sent.
#[test]
fn missing_preconfigured_middlebox_fails_the_handshake() {
    for version in [TlsVersion::Tls12, TlsVersion::Tls13] {
        let s = setup(version, "mb.test", measure(PROGRAM, b""));
        let mut client = ClientHandshake::new(s.client_cfg.clone()).unwrap();
        let mut server = s.server_ctx.engine().unwrap();
        let mut err = None;
        for _ in 0..10 {
            server.feed(&client.take_outgoing());
            let _ = server.process();
            let out = server.take_outgoing();
            if out.is_empty() {
                break;
            }
            if let Err(e) = client.receive(&out) {
                err = Some(e);
                break;
            }
        }
        assert!(
            matches!(
                &err,
                Some(HandshakeError::Middlebox { name, inner })
                    if name == "mb.test" && matches!(**inner, HandshakeError::NotJoined { .. })
            ),
            "{version:?}: {err:?}"
        );
        assert!(!client.data_phase_started());
        // Failure is sticky.
        assert!(client.receive(&[]).is_err());
    }
}

mod garbage {
    use super::*;
    use mbx_apps::PassThrough;
    use proptest::prelude::*;
    use std::sync::OnceLock;

    fn shared() -> &'static Setup {
        static S: OnceLock<Setup> = OnceLock::new();
        S.get_or_init(|| setup(TlsVersion::Tls13, "mb.test", measure(PROGRAM, b"")))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Arbitrary bytes from either side, after a real ClientHello or instead of one, never
        /// panic a middlebox or a client; errors are typed.
        #[test]
        fn never_panics(
            from_client in proptest::collection::vec(any::<u8>(), 0..400),
            from_server in proptest::collection::vec(any::<u8>(), 0..400),
            real_hello in any::<bool>(),
            flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..3),
        ) {
            let s = shared();
            let mut client = ClientHandshake::new(s.client_cfg.clone()).unwrap();
            let mut mbox = MiddleboxHandshake::new(s.mbox_cfg.clone(), PassThrough).unwrap();
            let mut ch = client.take_outgoing();
            if real_hello {
                let _ = mbox.receive(Side::Client, &ch);
            }
            let _ = mbox.receive(Side::Client, &from_client);
            let _ = mbox.receive(Side::Server, &from_server);
            // A flipped ClientHello (maybe in the MiddleboxSupport extension).
            for (i, x) in flips {
                let n = ch.len();
                ch[i % n] ^= x;
            }
            let mut m2 = MiddleboxHandshake::new(s.mbox_cfg.clone(), PassThrough).unwrap();
            let _ = m2.receive(Side::Client, &ch);
            let _ = client.receive(&from_server);
        }
    }
}

mod discovered {
    use super::*;

    fn discover(s: &mut Setup, approve_name: &'static str) {
        s.client_cfg.middlebox = ClientMiddlebox::Discover(Arc::new(move |chain: &[Vec<u8>]| {
            // The application's policy: approve by the name in the leaf certificate.
            chain
                .first()
                .map(|der| {
                    der.windows(approve_name.len())
                        .any(|w| w == approve_name.as_bytes())
                })
                .unwrap_or(false)
        }));
    }

    fn run(s: &Setup) -> Net<Tagger> {
        let mut net = Net::new(s, tagger());
        let mut first = Some(b"server first".to_vec());
        net.client.write(b"GET / HTTP/1.1\r\n\r\n").unwrap();
        net.pump(&mut first);
        net
    }

    #[test]
    fn approved_discovered_middlebox_joins() {
        for version in [TlsVersion::Tls12, TlsVersion::Tls13] {
            let mut s = setup(version, "mb.test", measure(PROGRAM, b""));
            discover(&mut s, "mb.test");
            let mut net = run(&s);
            assert!(net.client_err.is_none() && net.mbox_err.is_none());
            assert!(net.client.keys_sent() && net.mbox.keys_installed());
            assert_eq!(net.client.take_plaintext(), b"SERVER FIRST");
            assert_eq!(
                net.server.take_plaintext(),
                b"GET / HTTP/1.1\r\nX-Mbtls: mb.test\r\n\r\n"
            );
        }
    }

    /// Not approved, untrusted certificate, evidence refused: the middlebox never gets key
    /// material, goes passive, and the session runs end to end on the primary keys (the app
    /// sees nothing: no header inserted, nothing upper-cased).
    #[test]
    fn excluded_middleboxes_get_no_keys_and_the_session_continues() {
        for version in [TlsVersion::Tls12, TlsVersion::Tls13] {
            let cases: Vec<(&str, Setup)> = vec![
                ("not approved", {
                    let mut s = setup(version, "mb.test", measure(PROGRAM, b""));
                    discover(&mut s, "someone-else.test");
                    s
                }),
                ("untrusted certificate", {
                    let mut s = setup_with(version, "mb.test", measure(PROGRAM, b""), true);
                    discover(&mut s, "mb.test");
                    s
                }),
                ("evidence refused", {
                    let mut s = setup(version, "mb.test", measure("other program", b""));
                    discover(&mut s, "mb.test");
                    s
                }),
            ];
            for (what, s) in cases {
                let mut net = run(&s);
                assert!(
                    net.client_err.is_none(),
                    "{version:?} {what}: {:?}",
                    net.client_err
                );
                assert!(
                    net.mbox_err.is_none(),
                    "{version:?} {what}: {:?}",
                    net.mbox_err
                );
                assert!(!net.client.keys_sent(), "{what}");
                assert!(!net.mbox.keys_installed(), "{what}");
                let ce = client_events(&mut net.client);
                // What the failed check said comes with it; an approval refused says no more.
                let expected_detail = match what {
                    "not approved" => None,
                    // Which roots refused it (thirty-third round, from an embedder's trial).
                    "untrusted certificate" => {
                        Some("checked against this endpoint's middlebox roots, and none")
                    }
                    _ => Some("is not accepted by policy"),
                };
                let said = |e: &ClientHandshakeEvent| match e {
                    ClientHandshakeEvent::MiddleboxExcluded { detail, .. } => {
                        match (detail.as_deref(), expected_detail) {
                            (Some(d), Some(x)) => d.contains(x),
                            (None, None) => true,
                            _ => false,
                        }
                    }
                    _ => false,
                };
                assert!(ce.iter().any(said), "{what}: {ce:?}");
                assert!(ce.contains(&ClientHandshakeEvent::Direct), "{what}: {ce:?}");
                let me = mbox_events(&mut net.mbox);
                assert!(
                    me.iter()
                        .any(|e| matches!(e, MiddleboxHandshakeEvent::Passive(_))),
                    "{what}: {me:?}"
                );
                // Told why, when its session was up to carry it (a certificate the client
                // refused ends that session in the handshake, with the client's alert).
                let told = me.iter().find_map(|e| match e {
                    MiddleboxHandshakeEvent::RefusedByEndpoint(why) => Some(why.as_str()),
                    _ => None,
                });
                match what {
                    "not approved" => assert_eq!(told, Some("not approved by the application")),
                    // Told by the client's alert instead, which its passive reason reads.
                    "untrusted certificate" => {
                        assert_eq!(told, None);
                        assert!(
                            me.iter().any(|e| matches!(e,
                                MiddleboxHandshakeEvent::Passive(why)
                                    if why.starts_with("the client refused our certificate"))),
                            "{me:?}"
                        );
                    }
                    _ => assert!(
                        told.is_some_and(|t| t.starts_with("evidence refused: attestation: ")
                            && t.ends_with("is not accepted by policy")),
                        "{me:?}"
                    ),
                }
                assert_eq!(
                    net.server.take_plaintext(),
                    b"GET / HTTP/1.1\r\n\r\n",
                    "{what}"
                );
                assert_eq!(net.client.take_plaintext(), b"server first", "{what}");
                net.server.write_plaintext(b"more").unwrap();
                net.client.write(b"again").unwrap();
                net.pump(&mut None);
                assert_eq!(net.client.take_plaintext(), b"more");
                assert_eq!(net.server.take_plaintext(), b"again");
            }
        }
    }

    /// The application's approver is asked once per middlebox, however many records its
    /// evidence and the end of its handshake take.
    #[test]
    fn the_approver_is_asked_once() {
        for version in [TlsVersion::Tls12, TlsVersion::Tls13] {
            let mut s = setup(version, "mb.test", measure(PROGRAM, b""));
            let asked = Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let counter = asked.clone();
            s.client_cfg.middlebox = ClientMiddlebox::Discover(Arc::new(move |_: &[Vec<u8>]| {
                counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                true
            }));
            let net = run(&s);
            assert!(
                net.client_err.is_none() && net.client.keys_sent(),
                "{version:?}"
            );
            assert_eq!(
                asked.load(std::sync::atomic::Ordering::SeqCst),
                1,
                "{version:?}"
            );
        }
    }

    /// A discovered middlebox that passed its checks and was sent its keys is no longer one
    /// that may be left out: a record on its subchannel that fails (here its switch marker,
    /// altered on the way) ends the session, as a failed record does anywhere, instead of
    /// excluding it while it holds the keys of two hops.
    #[test]
    fn a_failed_record_from_a_discovered_middlebox_after_its_keys_is_fatal() {
        for version in [TlsVersion::Tls12, TlsVersion::Tls13] {
            let mut s = setup(version, "mb.test", measure(PROGRAM, b""));
            discover(&mut s, "mb.test");
            let mut net = Net::new(&s, tagger());
            // Every flight delivered but the middlebox's last one toward the client.
            let mut to_client = Vec::new();
            for _ in 0..8 {
                let c = net.client.take_outgoing();
                net.mbox.receive(Side::Client, &c).unwrap();
                net.server.feed(&net.mbox.take_outgoing(Side::Server));
                let _ = net.server.process();
                net.mbox
                    .receive(Side::Server, &net.server.take_outgoing())
                    .unwrap();
                to_client = net.mbox.take_outgoing(Side::Client);
                if net.mbox.keys_installed() {
                    break;
                }
                net.client.receive(&to_client).unwrap();
            }
            assert!(
                net.client.keys_sent() && net.mbox.keys_installed(),
                "{version:?}"
            );
            let _ = client_events(&mut net.client);
            // Its marker, the close_notify of its secondary session, has its last byte flipped.
            let mut records = common::records(&to_client);
            let marker = records.iter_mut().find(|r| r[0] == 30).expect("the marker");
            *marker.last_mut().unwrap() ^= 1;
            let err = net.client.receive(&records.concat()).unwrap_err();
            // About that middlebox, and the failure is its record's (the TLS engine's check).
            assert!(
                matches!(&err, HandshakeError::Middlebox { name, .. } if name == "mb.test")
                    && matches!(err.cause(), HandshakeError::Engine(_)),
                "{version:?}: {err:?}"
            );
            let ce = client_events(&mut net.client);
            assert!(
                !ce.iter()
                    .any(|e| matches!(e, ClientHandshakeEvent::MiddleboxExcluded { .. })),
                "{version:?}: {ce:?}"
            );
            assert!(!net.client.is_ready());
        }
    }

    /// Runs a direct session between `client` and a legacy `server`: "hello server" from the
    /// client, "hello client" from the server once its handshake is done.
    fn exchange_with_legacy_server(client: &mut ClientHandshake, server: &mut OpenSslEngine) {
        client.write(b"hello server").unwrap();
        let mut first = Some(b"hello client".to_vec());
        for _ in 0..10 {
            server.feed(&client.take_outgoing());
            server.process().unwrap();
            if !server.is_handshaking() {
                if let Some(d) = first.take() {
                    server.write_plaintext(&d).unwrap();
                }
            }
            client.receive(&server.take_outgoing()).unwrap();
        }
    }

    /// More data both ways after the handshake, then the server's close_notify.
    fn both_ways_then_close(client: &mut ClientHandshake, server: &mut OpenSslEngine, what: &str) {
        client.write(b"more").unwrap();
        server.feed(&client.take_outgoing());
        server.process().unwrap();
        assert_eq!(server.take_plaintext(), b"more", "{what}");
        server.write_plaintext(b"reply").unwrap();
        server.close().unwrap();
        client.receive(&server.take_outgoing()).unwrap();
        assert_eq!(client.take_plaintext(), b"reply", "{what}");
        let events = client_events(client);
        assert!(
            events.contains(&ClientHandshakeEvent::Data(EndpointEvent::PeerClosed)),
            "{what}: {events:?}"
        );
    }

    /// No middlebox on the path at all: an mbTLS client with a legacy server (P5). None
    /// answered by the primary ServerHello, so the session gave up its export there and stays
    /// in OpenSSL: no hop fingerprint (the keys never left it), and data and close_notify
    /// still cross.
    #[test]
    fn no_middlebox_on_the_path() {
        for version in [TlsVersion::Tls12, TlsVersion::Tls13] {
            let mut s = setup(version, "mb.test", measure(PROGRAM, b""));
            discover(&mut s, "mb.test");
            let mut client = ClientHandshake::new(s.client_cfg.clone()).unwrap();
            let mut server = s.server_ctx.engine().unwrap();
            exchange_with_legacy_server(&mut client, &mut server);
            assert!(client.is_ready() && !client.keys_sent());
            assert!(client_events(&mut client).contains(&ClientHandshakeEvent::Direct));
            assert_eq!(server.take_plaintext(), b"hello server");
            assert_eq!(client.take_plaintext(), b"hello client");
            assert!(client.summary().unwrap().hops.is_empty(), "{version:?}");
            both_ways_then_close(&mut client, &mut server, &format!("{version:?}"));
        }
    }

    /// A discovered middlebox whose answer reaches the client only after the primary
    /// ServerHello (out of the protocol's order; the client gave up its export at that
    /// ServerHello) is shut out like an excluded one: no key material, it goes passive, and
    /// the session runs end to end in OpenSSL.
    #[test]
    fn a_middlebox_answering_after_the_primary_server_hello_is_shut_out() {
        for version in [TlsVersion::Tls12, TlsVersion::Tls13] {
            let mut s = setup(version, "mb.test", measure(PROGRAM, b""));
            discover(&mut s, "mb.test");
            let mut net = Net::new(&s, tagger());
            net.primary_first_to_client = true;
            net.client.write(b"GET / HTTP/1.1\r\n\r\n").unwrap();
            net.pump(&mut Some(b"server first".to_vec()));
            assert!(
                net.client_err.is_none(),
                "{version:?}: {:?}",
                net.client_err
            );
            assert!(net.mbox_err.is_none(), "{version:?}: {:?}", net.mbox_err);
            assert!(!net.client.keys_sent() && !net.mbox.keys_installed());
            let ce = client_events(&mut net.client);
            assert!(
                ce.contains(&ClientHandshakeEvent::MiddleboxExcluded {
                    middlebox: Some("mb.test".to_string()),
                    why: "answered after the primary ServerHello",
                    detail: None,
                }),
                "{version:?}: {ce:?}"
            );
            let me = mbox_events(&mut net.mbox);
            assert!(
                me.iter()
                    .any(|e| matches!(e, MiddleboxHandshakeEvent::Passive(_))),
                "{version:?}: {me:?}"
            );
            assert_eq!(net.server.take_plaintext(), b"GET / HTTP/1.1\r\n\r\n");
            assert_eq!(net.client.take_plaintext(), b"server first");
            assert!(net.client.summary().unwrap().hops.is_empty());
        }
    }

    /// Client-side middleboxes disabled; `export`: whether the primary context keeps what an
    /// export needs (without, the session stays in OpenSSL).
    fn disabled(s: &mut Setup, export: bool) {
        s.client_cfg.middlebox = ClientMiddlebox::Disabled;
        let mut primary = s.client_primary.clone();
        primary.exportable = export;
        s.client_cfg.primary = Arc::new(OpenSslContext::new(&primary).unwrap());
    }

    /// Client-side middleboxes disabled (none configured, no discovery): the ClientHello
    /// carries a MiddleboxSupport extension without optimistic hellos; with no middlebox on
    /// the path the session is direct, with a legacy server. Data written before the handshake
    /// ended, and data that arrived with its last flight, cross both ways, with the session
    /// exported or kept in OpenSSL.
    #[test]
    fn disabled_client_without_middlebox_is_direct() {
        for (version, export) in versions_and_export() {
            let (mut client, mut server) = disabled_with_legacy_server(version, export);
            assert!(client.is_ready() && !client.keys_sent());
            assert!(client_events(&mut client).contains(&ClientHandshakeEvent::Direct));
            assert_eq!(server.take_plaintext(), b"hello server");
            assert_eq!(client.take_plaintext(), b"hello client");
            let summary = client.summary().unwrap();
            assert_eq!(summary.version, version);
            // Fingerprints need the keys, which stay in OpenSSL without export.
            assert_eq!(summary.hops.len(), usize::from(export), "{version:?}");
            both_ways_then_close(
                &mut client,
                &mut server,
                &format!("{version:?} export={export}"),
            );
        }
    }

    /// A client with client-side middleboxes disabled after its handshake with a legacy server
    /// (see [`exchange_with_legacy_server`]).
    fn disabled_with_legacy_server(
        version: TlsVersion,
        export: bool,
    ) -> (ClientHandshake, OpenSslEngine) {
        let mut s = setup(version, "mb.test", measure(PROGRAM, b""));
        disabled(&mut s, export);
        let mut client = ClientHandshake::new(s.client_cfg.clone()).unwrap();
        let mut server = s.server_ctx.engine().unwrap();
        exchange_with_legacy_server(&mut client, &mut server);
        (client, server)
    }

    fn versions_and_export() -> [(TlsVersion, bool); 4] {
        [
            (TlsVersion::Tls12, true),
            (TlsVersion::Tls12, false),
            (TlsVersion::Tls13, true),
            (TlsVersion::Tls13, false),
        ]
    }

    /// A session kept in OpenSSL fails closed like an exported one: an altered record from
    /// the server ends it with a fatal alert to the server, and nothing more is accepted.
    #[test]
    fn a_session_kept_in_openssl_refuses_an_altered_record() {
        for (version, export) in versions_and_export() {
            let (mut client, mut server) = disabled_with_legacy_server(version, export);
            client_events(&mut client);
            assert_eq!(client.take_plaintext(), b"hello client");
            server.write_plaintext(b"secret").unwrap();
            let mut rec = server.take_outgoing();
            let last = rec.len() - 1;
            rec[last] ^= 1;
            client.receive(&rec).unwrap();
            assert!(client.take_plaintext().is_empty());
            let events = client_events(&mut client);
            assert!(
                events.iter().any(|e| matches!(
                    e,
                    // Ours says it raised the alert itself (OpenSSL's words are its own).
                    ClientHandshakeEvent::Data(EndpointEvent::Failed { alert, what })
                        if alert.description == AlertDescription::BAD_RECORD_MAC
                            && (!export || what.starts_with("sent by this end: a record"))
                )),
                "{version:?} export={export}: {events:?}"
            );
            // The alert reaches the server.
            server.feed(&client.take_outgoing());
            assert!(server.process().is_err(), "{version:?} export={export}");
            assert!(client.write(b"more").is_err());
        }
    }

    /// Only a client that can have no middlebox on its side may keep its session in OpenSSL.
    #[test]
    fn a_client_with_middleboxes_needs_an_exportable_context() {
        let mut s = setup(TlsVersion::Tls13, "mb.test", measure(PROGRAM, b""));
        disabled(&mut s, false);
        for middlebox in [
            ClientMiddlebox::Preconfigured("mb.test".into()),
            ClientMiddlebox::Discover(Arc::new(|_: &[Vec<u8>]| true)),
        ] {
            s.client_cfg.middlebox = middlebox;
            assert!(matches!(
                ClientHandshake::new(s.client_cfg.clone()),
                Err(HandshakeError::Config(_))
            ));
        }
    }

    /// The same with a middlebox that fails closed: the session ends at it, and the client's
    /// request never reaches the server (thirty-third round, from an embedder's trial: an IDS
    /// could not refuse what it could not read).
    #[test]
    fn a_middlebox_that_fails_closed_cuts_a_session_it_cannot_join() {
        for (version, export) in versions_and_export() {
            let mut s = setup(version, "mb.test", measure(PROGRAM, b""));
            disabled(&mut s, export);
            s.mbox_cfg = s.mbox_cfg.clone().fail_closed();
            let mut net = run(&s);
            let e = net
                .mbox_err
                .as_ref()
                .map(ToString::to_string)
                .unwrap_or_default();
            assert!(
                e.contains("does not take part (no optimistic ClientHello left for us")
                    && e.contains("fails closed"),
                "{version:?}: {e}"
            );
            assert!(!net.client.keys_sent() && !net.mbox.keys_installed());
            assert!(net.server.take_plaintext().is_empty(), "{version:?}");
        }
    }

    /// Client-side middleboxes disabled, but a middlebox on the path: it finds no optimistic
    /// hello to answer, stays passive and never sees plaintext; the session runs end to end.
    #[test]
    fn disabled_client_leaves_an_on_path_middlebox_passive() {
        for (version, export) in versions_and_export() {
            let mut s = setup(version, "mb.test", measure(PROGRAM, b""));
            disabled(&mut s, export);
            let mut net = run(&s);
            assert!(net.client_err.is_none(), "{:?}", net.client_err);
            assert!(net.mbox_err.is_none(), "{:?}", net.mbox_err);
            assert!(!net.client.keys_sent() && !net.mbox.keys_installed());
            let me = mbox_events(&mut net.mbox);
            // It speaks mbTLS (for middleboxes of the server's side) and offers no hello.
            assert!(
                me.iter()
                    .any(|e| matches!(e, MiddleboxHandshakeEvent::Passive(why)
                    if why.starts_with("no optimistic ClientHello left for us"))),
                "{me:?}"
            );
            assert!(!me
                .iter()
                .any(|e| matches!(e, MiddleboxHandshakeEvent::Joined { .. })));
            assert_eq!(net.server.take_plaintext(), b"GET / HTTP/1.1\r\n\r\n");
            assert_eq!(net.client.take_plaintext(), b"server first");
        }
    }
}

/// Through a middlebox with a primary context that resumes sessions, both versions: the second
/// session resumes the first (TLS 1.2: its keys left OpenSSL, which does not end it; TLS 1.3:
/// the server's tickets came through the middlebox after the export and went to the export's
/// ticket sink), and the middlebox joins it as any other; once a resumed session fails (a
/// record tampered with between server and middlebox), the client forgets it and the next
/// session is a full handshake.
#[test]
fn sessions_through_a_middlebox_resume_until_one_fails() {
    for version in [TlsVersion::Tls12, TlsVersion::Tls13] {
        sessions_through_a_middlebox_resume_until_one_fails_with(version);
    }
}

fn sessions_through_a_middlebox_resume_until_one_fails_with(version: TlsVersion) {
    let mut s = setup(version, "mb.test", measure(PROGRAM, b""));
    let mut primary = s.client_primary.clone();
    primary.resume_sessions = 4;
    s.client_cfg.primary = Arc::new(OpenSslContext::new(&primary).unwrap());
    let session = |s: &Setup| {
        let mut net = Net::new(s, tagger());
        net.client.write(b"GET / HTTP/1.1\r\n\r\n").unwrap();
        net.pump(&mut None);
        assert!(net.client.is_ready(), "{:?}", net.client_err);
        assert!(net.client.keys_sent());
        net
    };
    let resumed = |net: &Net<Tagger>| net.client.summary().unwrap().resumed;
    let mut first = session(&s);
    assert!(!resumed(&first), "{version:?}");
    if version == TlsVersion::Tls13 {
        let ce = client_events(&mut first.client);
        let kept = ClientHandshakeEvent::Data(EndpointEvent::SessionTicketKept);
        assert_eq!(ce.iter().filter(|e| **e == kept).count(), 2, "{ce:?}");
    }
    let mut net = session(&s);
    assert!(resumed(&net), "{version:?}");
    assert!(net.server.session_reused());

    net.server.write_plaintext(b"response").unwrap();
    let mut rec = net.server.take_outgoing();
    *rec.last_mut().unwrap() ^= 1;
    // The middlebox refuses it and sends bad_record_mac both ways.
    let _ = net.mbox.receive(Side::Server, &rec);
    net.client
        .receive(&net.mbox.take_outgoing(Side::Client))
        .unwrap();
    let ce = client_events(&mut net.client);
    assert!(
        ce.iter()
            .any(|e| matches!(e, ClientHandshakeEvent::Data(EndpointEvent::PeerAlert(_)))),
        "{ce:?}"
    );
    assert!(!resumed(&session(&s)), "{version:?}");
    assert!(resumed(&session(&s)), "{version:?}");
}

/// A session OpenSSL keeps (no client-side middlebox) that the server ended with close_notify
/// stays resumable when the client drops it without closing its own direction; one the server
/// did not close does not (OpenSSL's rule). TLS 1.2, session IDs.
#[test]
fn a_direct_session_the_server_closed_stays_resumable() {
    let s = setup(TlsVersion::Tls12, "mb.test", measure(PROGRAM, b""));
    let mut primary = s.client_primary.clone().without_export();
    primary.resume_sessions = 4;
    let mut cfg = s.client_cfg.clone();
    cfg.primary = Arc::new(OpenSslContext::new(&primary).unwrap());
    cfg.middlebox = ClientMiddlebox::Disabled;
    let mut server_tls = s.server_tls.clone();
    server_tls.session_tickets = false;
    let server_ctx = OpenSslContext::new(&server_tls).unwrap();
    let session = |server_closes: bool| {
        let mut client = ClientHandshake::new(cfg.clone()).unwrap();
        let mut server = server_ctx.engine().unwrap();
        for _ in 0..8 {
            server.feed(&client.take_outgoing());
            server.process().unwrap();
            client.receive(&server.take_outgoing()).unwrap();
        }
        assert!(client.data_phase_started());
        assert!(client.summary().unwrap().hops.is_empty(), "kept by OpenSSL");
        let resumed = client.summary().unwrap().resumed;
        if server_closes {
            server.close().unwrap();
            client.receive(&server.take_outgoing()).unwrap();
            assert!(client_events(&mut client)
                .contains(&ClientHandshakeEvent::Data(EndpointEvent::PeerClosed)));
        }
        resumed
    };
    assert!(!session(false));
    assert!(!session(true), "the unclosed session was dropped");
    assert!(session(true));
    assert!(session(false));
    assert!(!session(false), "the unclosed resumed session was dropped");
}
