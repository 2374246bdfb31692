//! The live tests: our engines against real `openssl s_server` / `s_client` processes over TCP,
//! then the session exported to mbx-record, which must (1) open the peer's records and re-encrypt
//! them to the identical bytes and (2) seal records the real peer accepts.

mod common;

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use common::{
    app_data, open_and_reseal, split_records, Pki, HOST, SUITES as LIVE_SUITES, V12, V13,
};
use mbx_engine::{suite_openssl_name, Handoff, OpenSslContext, RustlsEngine, TlsConfig, TlsEngine};
use mbx_record::{ContentType, RecordOpener, RecordSealer, TlsVersion};
use mbx_testbed::peers::{self, OpensslClient, OpensslServer, ServerMode};

/// Guards against a hung peer only; no assertion depends on it.
const IO_GUARD: Duration = Duration::from_secs(60);

#[derive(Clone, Copy, Debug)]
enum Kind {
    OpenSsl,
    Rustls,
}

fn engine(kind: Kind, cfg: &TlsConfig) -> Box<dyn TlsEngine> {
    match kind {
        Kind::OpenSsl => Box::new(OpenSslContext::new(cfg).unwrap().engine().unwrap()),
        Kind::Rustls => Box::new(RustlsEngine::new(cfg).unwrap()),
    }
}

fn peer_version(v: TlsVersion) -> peers::TlsVersion {
    match v {
        V12 => peers::TlsVersion::Tls12,
        V13 => peers::TlsVersion::Tls13,
    }
}

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(IO_GUARD)).unwrap();
    s
}

/// Runs the handshake between `engine` and the socket.
fn handshake(engine: &mut dyn TlsEngine, sock: &mut TcpStream) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        engine.process().unwrap();
        let out = engine.take_outgoing();
        sock.write_all(&out).unwrap();
        if !engine.is_handshaking() {
            return;
        }
        let n = sock.read(&mut buf).unwrap();
        assert!(n > 0, "peer closed during the handshake");
        engine.feed(&buf[..n]);
    }
}

/// Reads whole records from the socket until `done(records so far)` or EOF.
fn read_records(
    sock: &mut TcpStream,
    mut stream: Vec<u8>,
    done: impl Fn(&[Vec<u8>]) -> bool,
) -> Vec<Vec<u8>> {
    let mut buf = [0u8; 16 * 1024];
    loop {
        let whole = whole_prefix(&stream);
        let recs = split_records(&stream[..whole]);
        if done(&recs) {
            return recs;
        }
        let n = match sock.read(&mut buf) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => 0,
            Err(e) => panic!("read: {e}"),
        };
        if n == 0 {
            return recs;
        }
        stream.extend_from_slice(&buf[..n]);
    }
}

fn whole_prefix(s: &[u8]) -> usize {
    let mut off = 0;
    while s.len() >= off + 5 {
        let len = 5 + usize::from(u16::from_be_bytes([s[off + 3], s[off + 4]]));
        if s.len() < off + len {
            break;
        }
        off += len;
    }
    off
}

/// Our engine as client against `s_server -www`, exported right after the handshake (TLS 1.3:
/// before the server's session tickets arrive, so our record layer opens the tickets first);
/// the HTTP GET is sealed by mbx-record and the page is opened by it.
#[test]
fn client_against_s_server_www_record_layer_takes_over() {
    let pki = Pki::new();
    let dir = tempfile::tempdir().unwrap();
    let files = pki.server.write_to(dir.path()).unwrap();
    for kind in [Kind::OpenSsl, Kind::Rustls] {
        for (version, id) in LIVE_SUITES {
            let server = OpensslServer::from_files(&files)
                .version(peer_version(version))
                .mode(ServerMode::Www)
                .start()
                .unwrap();
            let mut cfg = pki.client_config().only(version);
            cfg.cipher_suites = vec![id];
            cfg.pause_after_handshake = true;
            let mut e = engine(kind, &cfg);
            let mut sock = connect(server.addr());
            handshake(e.as_mut(), &mut sock);
            let Handoff {
                session,
                unprocessed_incoming,
                pending_outgoing,
                ..
            } = e.export_session_boxed().unwrap();
            assert_eq!(session.suite.id, id);

            let mut wire = pending_outgoing;
            let mut sealer =
                RecordSealer::new(version, session.tx.keys.clone(), session.tx.next_seq);
            sealer
                .seal(
                    ContentType::APPLICATION_DATA,
                    b"GET / HTTP/1.0\r\n\r\n",
                    &mut wire,
                )
                .unwrap();
            sock.write_all(&wire).unwrap();

            // s_server ends the page with close_notify.
            let records = read_records(&mut sock, unprocessed_incoming, |recs| {
                let mut o =
                    RecordOpener::new(version, session.rx.keys.clone(), session.rx.next_seq);
                recs.iter()
                    .filter_map(|r| o.open(r).ok())
                    .any(|op| op.content_type == ContentType::ALERT)
            });
            let mut opener =
                RecordOpener::new(version, session.rx.keys.clone(), session.rx.next_seq);
            let opened = open_and_reseal(version, &session.rx.keys, &mut opener, &records);
            let page = String::from_utf8_lossy(&app_data(&opened)).into_owned();
            let ctx = format!("{kind:?} {version:?} {id:#06x}");
            assert!(page.starts_with("HTTP/1.0 200 ok"), "{ctx}: {page}");
            // The real server reports the suite we negotiated and exported.
            let name = suite_openssl_name(id).unwrap().0;
            assert!(page.contains(name), "{ctx}: {name} not in page");
            if version == V13 {
                let tickets = opened
                    .iter()
                    .filter(|(ct, _)| *ct == ContentType::HANDSHAKE)
                    .count();
                assert!(
                    tickets >= 1,
                    "{ctx}: expected session tickets before the page"
                );
                assert_eq!(
                    opened[0].0,
                    ContentType::HANDSHAKE,
                    "{ctx}: tickets come first"
                );
            }
        }
    }
}

/// Application data and TLS 1.3 tickets go through the engine first (`s_server -rev`), then
/// the record layer continues the same connection with exact sequence numbers.
#[test]
fn client_against_s_server_rev_after_engine_traffic() {
    let pki = Pki::new();
    let dir = tempfile::tempdir().unwrap();
    let files = pki.server.write_to(dir.path()).unwrap();
    for (version, id) in LIVE_SUITES {
        let server = OpensslServer::from_files(&files)
            .version(peer_version(version))
            .mode(ServerMode::Reverse)
            .start()
            .unwrap();
        let mut cfg = pki.client_config().only(version);
        cfg.cipher_suites = vec![id];
        let mut e = OpenSslContext::new(&cfg).unwrap().engine().unwrap();
        let mut sock = connect(server.addr());
        handshake(&mut e, &mut sock);

        // One line through the engine.
        e.write_plaintext(b"first line\n").unwrap();
        sock.write_all(&e.take_outgoing()).unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 16 * 1024];
        while !got.contains(&b'\n') {
            let n = sock.read(&mut buf).unwrap();
            assert!(n > 0, "s_server closed");
            e.feed(&buf[..n]);
            e.process().unwrap();
            got.extend(e.take_plaintext());
        }
        assert_eq!(got, b"enil tsrif\n");
        let h = e.export_session().unwrap();
        let (s, ctx) = (&h.session, format!("{version:?} {id:#06x}"));
        // TLS 1.2: Finished + 1 data record each way. TLS 1.3: s_server's 2 tickets + 1 record.
        assert_eq!(s.tx.next_seq, if version == V12 { 2 } else { 1 }, "{ctx}");
        assert_eq!(s.rx.next_seq, if version == V12 { 2 } else { 3 }, "{ctx}");

        let mut wire = h.pending_outgoing.clone();
        let mut sealer = RecordSealer::new(version, s.tx.keys.clone(), s.tx.next_seq);
        sealer
            .seal(ContentType::APPLICATION_DATA, b"second line\n", &mut wire)
            .unwrap();
        sock.write_all(&wire).unwrap();
        let records = read_records(&mut sock, h.unprocessed_incoming.clone(), |recs| {
            !recs.is_empty()
        });
        // Off by one in either direction does not open: the numbers are load-bearing.
        for wrong in [s.rx.next_seq + 1, s.rx.next_seq.wrapping_sub(1)] {
            assert!(
                RecordOpener::new(version, s.rx.keys.clone(), wrong)
                    .open(&records[0])
                    .is_err(),
                "{ctx}"
            );
        }
        let mut opener = RecordOpener::new(version, s.rx.keys.clone(), s.rx.next_seq);
        let opened = open_and_reseal(version, &s.rx.keys, &mut opener, &records);
        assert_eq!(app_data(&opened), b"enil dnoces\n", "{ctx}");
    }
}

/// Our engine as server against `s_client`: export right after the handshake, open what
/// s_client sends with our record layer, and send sealed data plus close_notify that s_client
/// prints and accepts.
#[test]
fn server_against_s_client_record_layer_takes_over() {
    let pki = Pki::new();
    let dir = tempfile::tempdir().unwrap();
    let files = pki.server.write_to(dir.path()).unwrap();
    for kind in [Kind::OpenSsl, Kind::Rustls] {
        for (version, id) in LIVE_SUITES {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            let client = OpensslClient::new(addr)
                .servername(HOST)
                .cafile(&files.ca)
                .version(peer_version(version))
                .input(b"hello from s_client\n".to_vec());
            let runner = std::thread::spawn(move || client.run());

            let (mut sock, _) = listener.accept().unwrap();
            sock.set_read_timeout(Some(IO_GUARD)).unwrap();
            let mut cfg = pki.server_config().only(version);
            cfg.cipher_suites = vec![id];
            cfg.pause_after_handshake = true;
            let mut e = engine(kind, &cfg);
            handshake(e.as_mut(), &mut sock);
            let h = e.export_session_boxed().unwrap();
            let (s, ctx) = (&h.session, format!("{kind:?} {version:?} {id:#06x}"));
            sock.write_all(&h.pending_outgoing).unwrap();

            let wanted = b"hello from s_client\n";
            let records = read_records(&mut sock, h.unprocessed_incoming.clone(), |recs| {
                let mut o = RecordOpener::new(version, s.rx.keys.clone(), s.rx.next_seq);
                let data: Vec<u8> = recs
                    .iter()
                    .filter_map(|r| o.open(r).ok())
                    .filter(|op| op.content_type == ContentType::APPLICATION_DATA)
                    .flat_map(|op| op.plaintext.to_vec())
                    .collect();
                data.ends_with(wanted)
            });
            let mut opener = RecordOpener::new(version, s.rx.keys.clone(), s.rx.next_seq);
            let opened = open_and_reseal(version, &s.rx.keys, &mut opener, &records);
            assert_eq!(app_data(&opened), wanted, "{ctx}");

            let mut wire = Vec::new();
            let mut sealer = RecordSealer::new(version, s.tx.keys.clone(), s.tx.next_seq);
            sealer
                .seal(
                    ContentType::APPLICATION_DATA,
                    b"hello from mbx record layer\n",
                    &mut wire,
                )
                .unwrap();
            sealer.seal(ContentType::ALERT, &[1, 0], &mut wire).unwrap();
            sock.write_all(&wire).unwrap();
            let _ = sock.shutdown(Shutdown::Write);
            let _ = read_records(&mut sock, Vec::new(), |_| false);

            let out = runner.join().unwrap().unwrap();
            let stdout = out.stdout_str();
            assert!(
                stdout.contains("hello from mbx record layer"),
                "{ctx}: s_client printed:\n{stdout}\n{}",
                out.stderr_str()
            );
            let proto = if version == V12 { "TLSv1.2" } else { "TLSv1.3" };
            assert!(stdout.contains(proto), "{ctx}");
            // s_client saw our close_notify as a clean close, not a decryption failure.
            assert!(
                !out.stderr_str().contains("bad record mac"),
                "{ctx}: {}",
                out.stderr_str()
            );
        }
    }
}

/// Our OpenSSL server sends 0.5-RTT data to a real `s_client` right after its Finished (TLS
/// 1.3), then hands over to mbx-record: s_client prints both the 0.5-RTT data and the record we
/// seal at the exported sequence number, which proves the 0.5-RTT record was counted.
#[test]
fn server_half_rtt_data_to_s_client_then_record_layer_takes_over() {
    let pki = Pki::new();
    let dir = tempfile::tempdir().unwrap();
    let files = pki.server.write_to(dir.path()).unwrap();
    for (version, id) in LIVE_SUITES.into_iter().filter(|(v, _)| *v == V13) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let client = OpensslClient::new(addr)
            .servername(HOST)
            .cafile(&files.ca)
            .version(peer_version(version))
            .input(b"hello from s_client\n".to_vec());
        let runner = std::thread::spawn(move || client.run());

        let (mut sock, _) = listener.accept().unwrap();
        sock.set_read_timeout(Some(IO_GUARD)).unwrap();
        let mut cfg = pki.server_config().only(version);
        cfg.cipher_suites = vec![id];
        cfg.pause_after_handshake = true;
        let mut e = OpenSslContext::new(&cfg).unwrap().engine().unwrap();
        e.enable_half_rtt().unwrap();
        let mut buf = [0u8; 16 * 1024];
        let mut sent_half_rtt = false;
        loop {
            e.process().unwrap();
            if e.can_write_half_rtt() && !sent_half_rtt {
                e.write_half_rtt(b"half-rtt hello from mbx\n").unwrap();
                sent_half_rtt = true;
            }
            sock.write_all(&e.take_outgoing()).unwrap();
            if !e.is_handshaking() {
                break;
            }
            let n = sock.read(&mut buf).unwrap();
            assert!(n > 0, "peer closed during the handshake");
            e.feed(&buf[..n]);
        }
        assert!(sent_half_rtt);
        let h = e.export_session().unwrap();
        let s = &h.session;
        let ctx = format!("{version:?} {id:#06x}");
        sock.write_all(&h.pending_outgoing).unwrap();

        let mut wire = Vec::new();
        let mut sealer = RecordSealer::new(version, s.tx.keys.clone(), s.tx.next_seq);
        sealer
            .seal(
                ContentType::APPLICATION_DATA,
                b"hello from mbx record layer\n",
                &mut wire,
            )
            .unwrap();
        sealer.seal(ContentType::ALERT, &[1, 0], &mut wire).unwrap();
        sock.write_all(&wire).unwrap();
        let _ = sock.shutdown(Shutdown::Write);
        let _ = read_records(&mut sock, h.unprocessed_incoming.clone(), |_| false);

        let out = runner.join().unwrap().unwrap();
        let stdout = out.stdout_str();
        let half = stdout.find("half-rtt hello from mbx");
        let after = stdout.find("hello from mbx record layer");
        assert!(
            half.is_some() && after.is_some() && half < after,
            "{ctx}: s_client printed:\n{stdout}\n{}",
            out.stderr_str()
        );
        assert!(
            !out.stderr_str().contains("bad record mac"),
            "{ctx}: {}",
            out.stderr_str()
        );
    }
}
