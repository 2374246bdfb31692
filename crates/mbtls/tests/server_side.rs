//! Paths with middleboxes on the server side and several on the client side, all OpenSSL
//! engines in memory: legacy client → server-side middlebox → mbTLS server; mbTLS client →
//! client-side middlebox(es) → server-side middlebox → mbTLS server; two client-side
//! middleboxes in front of a legacy server; exclusion, refused evidence, a legacy server behind
//! a server-side middlebox.

mod common;
mod leaf;
use leaf::identity;

use std::sync::Arc;

use mbx_apps::{Direction, HttpHeaderInsert, MiddleboxApp, PassThrough, Verdict};
use mbx_attest::sim::{measure, signer_id};
use mbx_attest::{HexBytes, Policy, SimulatedAttester, SimulatedPlatform};
use mbx_engine::{
    ClientContext, CustomExtension, Identity, OpenSslContext, OpenSslEngine, RustlsClientContext,
    TlsConfig, TlsEngine,
};
use mbx_mbtls::handshake::{
    Approver, ClientHandshake, ClientHandshakeConfig, ClientHandshakeEvent, ClientMiddlebox,
    HandshakeError, MiddleboxHandshake, MiddleboxHandshakeConfig, MiddleboxHandshakeEvent,
    ServerHandshake, ServerHandshakeConfig, ServerMiddlebox, ServerSideMiddlebox,
};
use mbx_mbtls::handshake::{ANNOUNCEMENT_REFUSED, ANNOUNCEMENT_REFUSED_NOT_TLS, PAUSE_READING_AT};
use mbx_mbtls::wire::{announcement_record, MAX_INNER_PAYLOAD_LEN};
use mbx_mbtls::{EndpointEvent, Side, MIDDLEBOX_SUPPORT_EXTENSION};
use mbx_record::TlsVersion;
use mbx_testbed::pki::{LeafSpec, TestPki, Validity};

const PROGRAM: &str = "mbx-test-middlebox";
const VERSIONS: [TlsVersion; 2] = [TlsVersion::Tls12, TlsVersion::Tls13];

struct Setup {
    root: Vec<u8>,
    platform: Arc<SimulatedPlatform>,
    server_id: Identity,
    policy: Policy,
    pki: TestPki,
    /// Key-exchange groups of every server (empty: OpenSSL's defaults).
    server_groups: Vec<String>,
    /// Which engine runs the endpoints' secondary sessions: "openssl" or "rustls".
    secondary_engine: &'static str,
}

impl Setup {
    fn new() -> Setup {
        let pki = TestPki::new("mbtls test root").unwrap();
        let root = pki.root_pem().into_bytes();
        let (server_id, _) = identity(&pki, &LeafSpec::server("server.test"));
        let platform = Arc::new(SimulatedPlatform::generate().unwrap());
        let policy = Policy {
            allow_simulated: true,
            measurements: vec![HexBytes(measure(PROGRAM, b"").to_vec())],
            sim_platform_keys: vec![HexBytes(platform.public_key().to_vec())],
            ..Policy::default()
        };
        Setup {
            root,
            platform,
            server_id,
            policy,
            pki,
            server_groups: Vec::new(),
            secondary_engine: "openssl",
        }
    }

    /// The same world twice: endpoints with OpenSSL, then with rustls secondary sessions.
    fn both() -> [Setup; 2] {
        let rustls = Setup {
            secondary_engine: "rustls",
            ..Setup::new()
        };
        [Setup::new(), rustls]
    }

    fn secondary(&self, cfg: &TlsConfig) -> Arc<dyn ClientContext> {
        match self.secondary_engine {
            "rustls" => Arc::new(RustlsClientContext::new(cfg).unwrap()),
            _ => Arc::new(OpenSslContext::new(cfg).unwrap()),
        }
    }

    fn middlebox(&self, name: &str, program: &str) -> MiddleboxHandshakeConfig {
        self.middlebox_with(&LeafSpec::middlebox(name), program)
    }

    fn middlebox_with(&self, spec: &LeafSpec, program: &str) -> MiddleboxHandshakeConfig {
        let (id, _) = identity(&self.pki, spec);
        let attester = SimulatedAttester::new(
            self.platform.clone(),
            measure(program, b""),
            signer_id("mbx tests"),
        );
        MiddleboxHandshakeConfig::new(&TlsConfig::server(id), Some(Arc::new(attester))).unwrap()
    }

    fn server(&self, version: TlsVersion, middlebox: ServerMiddlebox) -> ServerHandshake {
        self.server_with(version, middlebox, "mb2.test")
    }

    fn server_with(
        &self,
        version: TlsVersion,
        middlebox: ServerMiddlebox,
        default_name: &str,
    ) -> ServerHandshake {
        let mut primary = TlsConfig::server(self.server_id.clone()).only(version);
        primary.pause_after_handshake = true;
        primary.groups = self.server_groups.clone();
        ServerHandshake::new(self.server_config(primary, middlebox, default_name)).unwrap()
    }

    /// A server configuration on `primary`, whose context (and session cache) every server
    /// made from it shares.
    fn server_config(
        &self,
        primary: TlsConfig,
        middlebox: ServerMiddlebox,
        default_name: &str,
    ) -> ServerHandshakeConfig {
        let secondary = TlsConfig::client(default_name, self.root.clone());
        ServerHandshakeConfig {
            primary: Arc::new(OpenSslContext::new(&primary).unwrap()),
            secondary: self.secondary(&secondary),
            middlebox,
            policy: self.policy.clone(),
            now_unix: now_unix(),
            announcements_after_hello: false,
        }
    }

    fn legacy_client(&self, version: TlsVersion) -> OpenSslEngine {
        let cfg = TlsConfig::client("server.test", self.root.clone()).only(version);
        OpenSslContext::new(&cfg).unwrap().engine().unwrap()
    }

    fn legacy_server(&self, version: TlsVersion) -> OpenSslEngine {
        let mut cfg = TlsConfig::server(self.server_id.clone()).only(version);
        cfg.groups = self.server_groups.clone();
        OpenSslContext::new(&cfg).unwrap().engine().unwrap()
    }

    fn mbtls_client(&self, version: TlsVersion) -> ClientHandshake {
        self.mbtls_client_path(version, ClientMiddlebox::Preconfigured("mb1.test".into()))
    }

    fn mbtls_client_path(
        &self,
        version: TlsVersion,
        middlebox: ClientMiddlebox,
    ) -> ClientHandshake {
        self.mbtls_client_with(version, middlebox, true)
    }

    /// `export`: whether the primary context can be exported (without, only
    /// [`ClientMiddlebox::Disabled`] is accepted and the session stays in OpenSSL).
    fn mbtls_client_with(
        &self,
        version: TlsVersion,
        middlebox: ClientMiddlebox,
        export: bool,
    ) -> ClientHandshake {
        let mut primary =
            mbx_mbtls::handshake::primary_client_config("server.test", self.root.clone())
                .only(version);
        primary.exportable = export;
        let secondary = TlsConfig::client("mb1.test", self.root.clone());
        ClientHandshake::new(ClientHandshakeConfig {
            primary: Arc::new(OpenSslContext::new(&primary).unwrap()),
            server_name: "server.test".into(),
            secondary: self.secondary(&secondary),
            middlebox,
            policy: self.policy.clone(),
            now_unix: now_unix(),
        })
        .unwrap()
    }
}

/// One node of an in-memory path.
enum Node {
    LegacyClient(OpenSslEngine),
    Client(ClientHandshake),
    ClientSideMb(MiddleboxHandshake<Box<dyn MiddleboxApp>>),
    ServerSideMb(ServerSideMiddlebox<Box<dyn MiddleboxApp>>),
    Server(ServerHandshake),
    LegacyServer(OpenSslEngine),
}

impl Node {
    fn receive(&mut self, from: Side, bytes: &[u8]) -> Result<(), String> {
        let e = |e: HandshakeError| e.to_string();
        match self {
            Node::LegacyClient(c) | Node::LegacyServer(c) => {
                c.feed(bytes);
                c.process().map_err(|e| e.to_string())
            }
            Node::Client(c) => c.receive(bytes).map_err(e),
            Node::ClientSideMb(m) => m.receive(from, bytes).map_err(e),
            Node::ServerSideMb(m) => m.receive(from, bytes).map_err(e),
            Node::Server(s) => s.receive(bytes).map_err(e),
        }
    }

    fn take_outgoing(&mut self, to: Side) -> Vec<u8> {
        match (self, to) {
            (Node::LegacyClient(c), Side::Server) | (Node::LegacyServer(c), Side::Client) => {
                c.take_outgoing()
            }
            (Node::Client(c), Side::Server) => c.take_outgoing(),
            (Node::Server(s), Side::Client) => s.take_outgoing(),
            (Node::ClientSideMb(m), to) => m.take_outgoing(to),
            (Node::ServerSideMb(m), to) => m.take_outgoing(to),
            _ => Vec::new(),
        }
    }

    fn write(&mut self, data: &[u8]) {
        match self {
            Node::LegacyClient(c) | Node::LegacyServer(c) => c.write_plaintext(data).unwrap(),
            Node::Client(c) => c.write(data).unwrap(),
            Node::Server(s) => s.write(data).unwrap(),
            _ => panic!("not an endpoint"),
        }
    }

    fn read(&mut self) -> Vec<u8> {
        match self {
            Node::LegacyClient(c) | Node::LegacyServer(c) => c.take_plaintext(),
            Node::Client(c) => c.take_plaintext(),
            Node::Server(s) => s.take_plaintext(),
            _ => panic!("not an endpoint"),
        }
    }
}

struct Path {
    nodes: Vec<Node>,
    errors: Vec<Option<String>>,
    /// Per link: everything sent client→server.
    tap_c2s: Vec<Vec<u8>>,
    /// Per link: everything sent server→client.
    tap_s2c: Vec<Vec<u8>>,
}

impl Path {
    /// The server failed with an error that says each of `says`, and sent no key material.
    fn assert_server_refused(&mut self, says: &[&str], case: impl std::fmt::Debug) {
        let err = self.errors.last().cloned().flatten().unwrap_or_default();
        assert!(
            says.iter().all(|w| err.contains(w)),
            "{case:?}: {:?}",
            self.errors
        );
        assert!(!self.server().keys_sent(), "{case:?}");
    }

    fn new(nodes: Vec<Node>) -> Path {
        let n = nodes.len();
        Path {
            nodes,
            errors: vec![None; n],
            tap_c2s: vec![Vec::new(); n - 1],
            tap_s2c: vec![Vec::new(); n - 1],
        }
    }

    fn deliver(&mut self, node: usize, from: Side, bytes: &[u8]) {
        if bytes.is_empty() || self.errors[node].is_some() {
            return;
        }
        if let Err(e) = self.nodes[node].receive(from, bytes) {
            self.errors[node] = Some(e);
        }
    }

    fn pump(&mut self) {
        loop {
            let mut moved = false;
            for i in 0..self.nodes.len() - 1 {
                let fwd = self.nodes[i].take_outgoing(Side::Server);
                if !fwd.is_empty() {
                    moved = true;
                    self.tap_c2s[i].extend_from_slice(&fwd);
                    self.deliver(i + 1, Side::Client, &fwd);
                }
                let back = self.nodes[i + 1].take_outgoing(Side::Client);
                if !back.is_empty() {
                    moved = true;
                    self.tap_s2c[i].extend_from_slice(&back);
                    self.deliver(i, Side::Server, &back);
                }
            }
            if !moved {
                return;
            }
        }
    }

    fn first(&mut self) -> &mut Node {
        self.nodes.first_mut().unwrap()
    }

    fn last(&mut self) -> &mut Node {
        self.nodes.last_mut().unwrap()
    }

    fn server(&mut self) -> &mut ServerHandshake {
        match self.last() {
            Node::Server(s) => s,
            _ => panic!("not an mbTLS server"),
        }
    }

    fn server_side_mb(&mut self, i: usize) -> &mut ServerSideMiddlebox<Box<dyn MiddleboxApp>> {
        match &mut self.nodes[i] {
            Node::ServerSideMb(m) => m,
            _ => panic!("not a server-side middlebox"),
        }
    }

    fn assert_no_errors(&self) {
        assert!(self.errors.iter().all(Option::is_none), "{:?}", self.errors);
    }
}

/// Inserts a request header and upper-cases responses: shows both directions crossed the app.
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

fn tagger(value: &str) -> Box<dyn MiddleboxApp> {
    Box::new(Tagger(HttpHeaderInsert::new("X-Mbtls", value).unwrap()))
}

fn passthrough() -> Box<dyn MiddleboxApp> {
    Box::new(PassThrough)
}

fn server_side_mb(s: &Setup, app: Box<dyn MiddleboxApp>) -> Node {
    Node::ServerSideMb(
        ServerSideMiddlebox::new(s.middlebox("mb2.test", PROGRAM), app, true).unwrap(),
    )
}

fn mb_events(m: &mut ServerSideMiddlebox<Box<dyn MiddleboxApp>>) -> Vec<MiddleboxHandshakeEvent> {
    std::iter::from_fn(|| m.poll_event()).collect()
}

/// The system clock, as the drivers give it to the cores: the engines' stores of vouched
/// sessions read the same clock.
fn now_unix() -> u64 {
    mbx_attest::unix_seconds(std::time::SystemTime::now())
}

fn server_events(s: &mut ServerHandshake) -> Vec<ClientHandshakeEvent> {
    std::iter::from_fn(|| s.poll_event()).collect()
}

const REQUEST: &[u8] = b"GET / HTTP/1.1\r\nHost: server.test\r\n\r\n";

#[test]
fn legacy_client_through_a_preconfigured_server_side_middlebox_both_versions() {
    for s in Setup::both() {
        eprintln!("secondary sessions: {}", s.secondary_engine);
        for version in VERSIONS {
            let mut path = Path::new(vec![
                Node::LegacyClient(s.legacy_client(version)),
                server_side_mb(&s, tagger("mb2.test")),
                Node::Server(s.server(version, ServerMiddlebox::Preconfigured("mb2.test".into()))),
            ]);
            // The legacy client sends its request as soon as its handshake is done: in TLS 1.3 in
            // the flight of its Finished, before the middlebox has keys (copied, replayed).
            path.first().receive(Side::Server, &[]).unwrap();
            path.pump();
            path.first().write(REQUEST);
            path.pump();
            path.assert_no_errors();
            let mb = path.server_side_mb(1);
            assert!(mb.keys_installed(), "{version:?}");
            let me = mb_events(mb);
            assert!(
                me.contains(&MiddleboxHandshakeEvent::Announced { subchannel: 0 }),
                "{me:?}"
            );
            assert!(me.contains(&MiddleboxHandshakeEvent::EvidenceSent));
            let se = server_events(path.server());
            assert!(
                matches!(
                    se.first(),
                    Some(ClientHandshakeEvent::MiddleboxVerified {
                        claims: Some(_),
                        ..
                    })
                ),
                "{se:?}"
            );
            assert!(se.contains(&ClientHandshakeEvent::KeysSent));
            assert!(path.server().is_ready());
            // The request crossed the middlebox's app exactly once.
            request_and_answer_through_mb2(&mut path);
            // Two hops, and the fresh one is not the bridge.
            let summary = path.server().summary().unwrap().clone();
            assert_eq!(summary.version, version);
            assert_eq!(summary.hops.len(), 2);
            assert_ne!(summary.hops[0], summary.hops[1]);
            assert!(summary.middlebox_joined());
        }
    }
}

/// A legacy client through a client-side middlebox on the path: the middlebox stands aside,
/// saying that the client does not speak mbTLS (before the thirty-third round "no optimistic
/// ClientHello left for us", which sent an operator trial to `--max-discovered`).
#[test]
fn a_client_side_middlebox_says_a_legacy_client_does_not_speak_mbtls() {
    let s = Setup::new();
    for version in VERSIONS {
        let mut path = Path::new(vec![
            Node::LegacyClient(s.legacy_client(version)),
            client_mb(&s, "mb1.test"),
            Node::Server(s.server(version, ServerMiddlebox::none())),
        ]);
        path.first().receive(Side::Server, &[]).unwrap();
        path.pump();
        path.assert_no_errors();
        let Node::ClientSideMb(m) = &mut path.nodes[1] else {
            unreachable!()
        };
        let me: Vec<_> = std::iter::from_fn(|| m.poll_event()).collect();
        assert!(
            me.iter()
                .any(|e| matches!(e, MiddleboxHandshakeEvent::Passive(why)
                if why.starts_with("the client does not speak mbTLS"))),
            "{version:?}: {me:?}"
        );
    }
}

/// A legacy client resumes its TLS 1.2 session by session ID (no tickets) through a
/// server-side middlebox: the server's session was exported, yet stays in its cache, and the
/// middlebox joins the resumed session with fresh keys. Once a resumed session fails at the
/// server (a forged record), the server drops it from its cache: the next session is a full
/// handshake.
#[test]
fn a_legacy_client_resumes_by_session_id_through_a_server_side_middlebox_until_a_failure() {
    let s = Setup::new();
    let version = TlsVersion::Tls12;
    let mut primary = TlsConfig::server(s.server_id.clone()).only(version);
    primary.pause_after_handshake = true;
    primary.session_tickets = false;
    let server = s.server_config(
        primary,
        ServerMiddlebox::Preconfigured("mb2.test".into()),
        "mb2.test",
    );
    let mut client = TlsConfig::client("server.test", s.root.clone()).only(version);
    client.resume_sessions = 4;
    let client = OpenSslContext::new(&client).unwrap();
    let session = |forge: bool| {
        let mut path = Path::new(vec![
            Node::LegacyClient(client.engine().unwrap()),
            server_side_mb(&s, tagger("mb2.test")),
            Node::Server(ServerHandshake::new(server.clone()).unwrap()),
        ]);
        path.first().receive(Side::Server, &[]).unwrap();
        path.pump();
        path.first().write(REQUEST);
        path.pump();
        path.assert_no_errors();
        assert!(path.server_side_mb(1).keys_installed());
        let summary = path.server().summary().unwrap().clone();
        assert!(summary.middlebox_joined() && summary.hops.len() == 2);
        if forge {
            let forged = [&[23u8, 3, 3, 0, 40][..], &[7u8; 40][..]].concat();
            assert!(path.server().receive(&forged).is_ok());
            let se = server_events(path.server());
            assert!(
                se.iter()
                    .any(|e| matches!(e, ClientHandshakeEvent::Data(EndpointEvent::Failed { .. }))),
                "{se:?}"
            );
        }
        // The client ends its side cleanly (it keeps its session only then): whether the next
        // session resumes is the server's decision.
        if let Node::LegacyClient(e) = path.first() {
            e.close().unwrap();
        }
        summary.resumed
    };
    assert!(!session(false));
    assert!(session(false));
    assert!(session(true));
    assert!(!session(false), "the failed session was resumed");
    assert!(session(false));
}

/// The request reached the server with mb2's header (its app ran once), and the server's
/// answer comes back upper-cased by it.
fn request_and_answer_through_mb2(path: &mut Path) {
    assert_eq!(
        path.last().read(),
        b"GET / HTTP/1.1\r\nHost: server.test\r\nX-Mbtls: mb2.test\r\n\r\n"
    );
    path.last().write(b"response");
    path.pump();
    assert_eq!(path.first().read(), b"RESPONSE");
}

/// An mbTLS client without client-side middleboxes whose session stays in OpenSSL (its
/// context is built without export): its hop to the server-side middlebox is the bridge, under
/// the primary keys the server hands the middlebox, and OpenSSL's records cross it.
#[test]
fn client_kept_in_openssl_through_a_server_side_middlebox_both_versions() {
    let s = Setup::new();
    for version in VERSIONS {
        let client = s.mbtls_client_with(version, ClientMiddlebox::Disabled, false);
        let mut path = Path::new(vec![
            Node::Client(client),
            server_side_mb(&s, tagger("mb2.test")),
            Node::Server(s.server(version, ServerMiddlebox::Preconfigured("mb2.test".into()))),
        ]);
        path.first().write(REQUEST);
        path.pump();
        path.assert_no_errors();
        assert!(path.server_side_mb(1).keys_installed(), "{version:?}");
        request_and_answer_through_mb2(&mut path);
        let Node::Client(c) = path.first() else {
            unreachable!()
        };
        let summary = c.summary().unwrap();
        assert!(summary.hops.is_empty() && !summary.middlebox_joined());
    }
}

/// A discovering server to which no middlebox announced itself before the ClientHello keeps
/// the session in OpenSSL (no export, no key log), with a legacy client or behind a client-side
/// middlebox, whose far hop is then this session.
#[test]
fn a_server_no_middlebox_announced_to_keeps_the_session_in_openssl_both_versions() {
    each_request_to_a_discovering_server(&Setup::new(), |what, behind_mb1, path| {
        let expected: &[u8] = if behind_mb1 {
            b"GET / HTTP/1.1\r\nHost: server.test\r\nX-Mbtls: mb1.test\r\n\r\n"
        } else {
            REQUEST
        };
        assert_eq!(path.last().read(), expected, "{what}");
        path.last().write(b"response");
        path.pump();
        path.assert_no_errors();
        let answer = path.first().read();
        assert!(answer.eq_ignore_ascii_case(b"response"), "{what}");
        assert!(server_events(path.server()).contains(&ClientHandshakeEvent::Direct));
        let summary = path.server().summary().unwrap();
        assert!(
            summary.hops.is_empty() && !summary.middlebox_joined(),
            "{what}"
        );
    });
}

/// For each version, from a legacy client and from an mbTLS client through the client-side
/// middlebox mb1 (`behind_mb1`), to a server that discovers middleboxes (approving any) and to
/// which none announced itself: `check(what, behind_mb1, path)` once the client's REQUEST is
/// through, without errors.
fn each_request_to_a_discovering_server(s: &Setup, mut check: impl FnMut(&str, bool, &mut Path)) {
    let approve: Approver = Arc::new(|_: &[Vec<u8>]| true);
    for version in VERSIONS {
        for behind_mb1 in [false, true] {
            let server =
                Node::Server(s.server(version, ServerMiddlebox::Discover(approve.clone())));
            let mut path = legacy_or_behind_mb1(s, version, behind_mb1, server);
            path.first().write(REQUEST);
            path.pump();
            path.assert_no_errors();
            let what = format!("{version:?}, client-side middlebox: {behind_mb1}");
            check(&what, behind_mb1, &mut path);
        }
    }
}

/// `server` reached by a legacy client, or by an mbTLS client through the client-side
/// middlebox mb1; handshake done.
fn legacy_or_behind_mb1(s: &Setup, version: TlsVersion, behind_mb1: bool, server: Node) -> Path {
    let mut path = Path::new(if behind_mb1 {
        vec![
            path_client(s, version, &["mb1.test"]),
            client_mb(s, "mb1.test"),
            server,
        ]
    } else {
        vec![Node::LegacyClient(s.legacy_client(version)), server]
    });
    path.first().receive(Side::Server, &[]).unwrap();
    path.pump();
    path
}

/// A middlebox that announces itself after the ClientHello, as the paper and the spec order
/// it (an independent implementation does; ours announce before it, docs/mbtls.md §6): a
/// discovering server takes it with `announcements_after_hello`, and the session runs
/// through it, its app included; without the option the server refuses the session at the
/// late announcement (thirty-fourth round: found by an independent implementer, whose
/// spec-order middlebox failed every session at a discovering server).
#[test]
fn a_discovering_server_takes_announcements_after_the_client_hello_when_told() {
    let s = Setup::new();
    for version in VERSIONS {
        for after_hello in [true, false] {
            let what = format!("{version:?}, announcements_after_hello: {after_hello}");
            let mut primary = TlsConfig::server(s.server_id.clone()).only(version);
            primary.pause_after_handshake = true;
            let approve: Approver = Arc::new(|_: &[Vec<u8>]| true);
            let mut cfg = s.server_config(primary, ServerMiddlebox::Discover(approve), "mb2.test");
            cfg.announcements_after_hello = after_hello;
            let mut path = Path::new(vec![
                Node::LegacyClient(s.legacy_client(version)),
                server_side_mb(&s, tagger("mb2.test")),
                Node::Server(ServerHandshake::new(cfg).unwrap()),
            ]);
            // The middlebox's first words toward the server, its announcement then the
            // ClientHello, put the other way round.
            path.first().receive(Side::Server, &[]).unwrap();
            let hello = path.nodes[0].take_outgoing(Side::Server);
            path.deliver(1, Side::Client, &hello);
            let out = path.nodes[1].take_outgoing(Side::Server);
            assert_eq!(out[0], mbx_mbtls::CT_ENCAPSULATED.0, "{what}");
            let announcement_len = 5 + usize::from(u16::from_be_bytes([out[3], out[4]]));
            let (announcement, rest) = out.split_at(announcement_len);
            path.deliver(2, Side::Client, &[rest, announcement].concat());
            path.pump();
            if !after_hello {
                path.assert_server_refused(
                    &["after the ClientHello", "--announcements-after-hello"],
                    &what,
                );
                continue;
            }
            path.first().write(REQUEST);
            path.pump();
            path.assert_no_errors();
            assert!(path.server_side_mb(1).keys_installed(), "{what}");
            request_and_answer_through_mb2(&mut path);
        }
    }
}

/// Our middleboxes announce before the ClientHello. One that announces after it is refused
/// by a discovering server that saw no announcement before (its session was made without
/// export), and still accepted by a server with a pre-configured middlebox.
#[test]
fn an_announcement_after_the_client_hello() {
    let s = Setup::new();
    let announcement = mbx_mbtls::wire::announcement_record(0, 0x0303).unwrap();
    for (middlebox, accepted) in [
        (
            ServerMiddlebox::Discover(Arc::new(|_: &[Vec<u8>]| true)),
            false,
        ),
        (ServerMiddlebox::Preconfigured("mb2.test".into()), true),
    ] {
        let mut client = s.legacy_client(TlsVersion::Tls13);
        client.process().unwrap();
        let mut server = s.server(TlsVersion::Tls13, middlebox);
        server.receive(&client.take_outgoing()).unwrap();
        match server.receive(&announcement) {
            Ok(()) => assert!(accepted),
            Err(HandshakeError::Protocol(m)) => {
                assert!(!accepted && m.contains("after the ClientHello"), "{m}")
            }
            Err(e) => panic!("{e}"),
        }
    }
}

/// A server that may get middleboxes must be able to export its session: an mbTLS server's
/// primary context must be exportable.
#[test]
fn a_server_needs_an_exportable_context() {
    let s = Setup::new();
    let mut primary = TlsConfig::server(s.server_id.clone()).without_export();
    primary.pause_after_handshake = true;
    let r = ServerHandshake::new(ServerHandshakeConfig {
        primary: Arc::new(OpenSslContext::new(&primary).unwrap()),
        secondary: s.secondary(&TlsConfig::client("mb2.test", s.root.clone())),
        middlebox: ServerMiddlebox::Preconfigured("mb2.test".into()),
        policy: s.policy.clone(),
        now_unix: now_unix(),
        announcements_after_hello: false,
    });
    assert!(matches!(r, Err(HandshakeError::Config(_))));
}

/// An endpoint's primary context must be set up as the protocol needs it: paused after its
/// handshake (both; else OpenSSL could read a record before the export), and the client's
/// registering the MiddleboxSupport extension. Each was documented and not checked (an
/// embedder's trial: a context without the pause passed). The `primary_*_config` helpers make
/// contexts that pass.
#[test]
fn primary_contexts_must_pause_and_the_clients_must_register_the_extension() {
    use mbx_mbtls::handshake::{primary_client_config, primary_server_config, ClientHandshake};
    let s = Setup::new();
    let server_with = |primary: TlsConfig| {
        ServerHandshake::new(ServerHandshakeConfig {
            primary: Arc::new(OpenSslContext::new(&primary).unwrap()),
            secondary: s.secondary(&TlsConfig::client("mb2.test", s.root.clone())),
            middlebox: ServerMiddlebox::none(),
            policy: s.policy.clone(),
            now_unix: now_unix(),
            announcements_after_hello: false,
        })
        .err()
        .map(|e| e.to_string())
    };
    let unpaused = server_with(TlsConfig::server(s.server_id.clone()));
    assert!(
        unpaused.is_some_and(|e| e.contains("must pause after its handshake")),
        "a server context without the pause was taken"
    );
    assert_eq!(
        server_with(primary_server_config(s.server_id.clone())),
        None
    );
    let client_with = |primary: TlsConfig| {
        ClientHandshake::new(ClientHandshakeConfig {
            primary: Arc::new(OpenSslContext::new(&primary).unwrap()),
            server_name: "server.test".into(),
            secondary: s.secondary(&TlsConfig::client("mb1.test", s.root.clone())),
            middlebox: ClientMiddlebox::Preconfigured("mb1.test".into()),
            policy: s.policy.clone(),
            now_unix: now_unix(),
        })
        .err()
        .map(|e| e.to_string())
    };
    let made = primary_client_config("server.test", s.root.clone());
    assert_eq!(client_with(made.clone()), None);
    let mut unpaused = made.clone();
    unpaused.pause_after_handshake = false;
    let said = client_with(unpaused).unwrap_or_default();
    assert!(said.contains("must pause after its handshake"), "{said}");
    let mut unregistered = made;
    unregistered.custom_extensions.clear();
    let said = client_with(unregistered).unwrap_or_default();
    assert!(
        said.contains("must register the MiddleboxSupport extension"),
        "{said}"
    );
    // Said once, not "configuration: configuration:".
    assert!(!said.contains("configuration: configuration"), "{said}");
}

/// client → client-side middlebox mb1 → server-side middlebox mb2 → mbTLS server, each
/// middlebox adding its header to the request and upper-casing the answer: one request and its
/// answer, checked.
fn both_sides_exchange(
    s: &Setup,
    version: TlsVersion,
    mb1: MiddleboxHandshakeConfig,
    mb2: MiddleboxHandshakeConfig,
) -> Path {
    let client = s.mbtls_client(version);
    let server = s.server(version, ServerMiddlebox::Preconfigured("mb2.test".into()));
    exchange_between(client, (mb1, mb2), server, version)
}

/// [`both_sides_exchange`] between the given endpoints.
fn exchange_between(
    client: ClientHandshake,
    (mb1, mb2): (MiddleboxHandshakeConfig, MiddleboxHandshakeConfig),
    server: ServerHandshake,
    version: TlsVersion,
) -> Path {
    let mut path = Path::new(vec![
        Node::Client(client),
        Node::ClientSideMb(MiddleboxHandshake::new(mb1, tagger("mb1.test")).unwrap()),
        Node::ServerSideMb(ServerSideMiddlebox::new(mb2, tagger("mb2.test"), true).unwrap()),
        Node::Server(server),
    ]);
    path.first().write(REQUEST);
    path.pump();
    path.assert_no_errors();
    assert_eq!(
        path.last().read(),
        b"GET / HTTP/1.1\r\nHost: server.test\r\nX-Mbtls: mb1.test\r\nX-Mbtls: mb2.test\r\n\r\n",
        "{version:?}"
    );
    path.last().write(b"response");
    path.pump();
    // Upper-cased twice is upper-cased.
    assert_eq!(path.first().read(), b"RESPONSE", "{version:?}");
    path
}

/// Middleboxes whose secondary flight does not fit one encapsulated record (a certificate of
/// about 19 KB: 900 extra names) still join on both sides: their engines split it over records
/// that each fit (`MAX_INNER_PLAINTEXT_LEN`). Without that limit OpenSSL sends 16,384-byte
/// records, whose ciphertext is larger than an inner record may be, and the handshake fails.
#[test]
fn middleboxes_with_a_flight_larger_than_an_encapsulated_record_join_both_versions() {
    let big = |name: &str| {
        (0..900).fold(LeafSpec::middlebox(name), |spec, i| {
            spec.dns(&format!("alias-{i:04}.{name}"))
        })
    };
    for s in Setup::both() {
        eprintln!("secondary sessions: {}", s.secondary_engine);
        let (mb1_cfg, mb2_cfg) = (
            s.middlebox_with(&big("mb1.test"), PROGRAM),
            s.middlebox_with(&big("mb2.test"), PROGRAM),
        );
        let mb1_cert = mb1_cfg.tls.certificate_der().unwrap();
        assert!(mb1_cert.len() > MAX_INNER_PAYLOAD_LEN);
        for version in VERSIONS {
            both_sides_exchange(&s, version, mb1_cfg.clone(), mb2_cfg.clone());
        }
    }
}

#[test]
fn middleboxes_on_both_sides_share_the_primary_keys_as_bridge() {
    for s in Setup::both() {
        eprintln!("secondary sessions: {}", s.secondary_engine);
        for version in VERSIONS {
            let mut path = both_sides_exchange(
                &s,
                version,
                s.middlebox("mb1.test", PROGRAM),
                s.middlebox("mb2.test", PROGRAM),
            );
            let client = match path.first() {
                Node::Client(c) => c.summary().unwrap().clone(),
                _ => unreachable!(),
            };
            let server = path.server().summary().unwrap().clone();
            // client↔mb1, mb1↔mb2 (bridge), mb2↔server: the endpoints agree on the bridge only.
            assert_eq!(client.hops[1], server.hops[0]);
            assert_ne!(client.hops[0], client.hops[1]);
            assert_ne!(server.hops[1], server.hops[0]);
            assert_ne!(client.hops[0], server.hops[1]);
            // P1C: the same request crosses the three hops as three different ciphertexts.
            let taps: Vec<Vec<u8>> = path.tap_c2s.clone();
            assert!(taps
                .iter()
                .all(|t| !t.windows(14).any(|w| w == b"GET / HTTP/1.1")));
        }
    }
}

/// The builders (`ClientHandshakeConfig::builder`, `ServerHandshakeConfig::builder`) make
/// endpoints that run a path with a middlebox on each side in the version asked for, each
/// middlebox checked against the policy given; and they refuse what cannot work before any
/// session: server-side middleboxes without roots for their certificates, an empty path.
#[test]
fn built_endpoints_run_a_path_with_middleboxes_on_both_sides_both_versions() {
    let s = Setup::new();
    for version in VERSIONS {
        let client = ClientHandshakeConfig::builder("server.test", s.root.clone())
            .middleboxes(ClientMiddlebox::Preconfigured("mb1.test".into()))
            .policy(s.policy.clone())
            .only(version)
            .build()
            .unwrap();
        assert!(client.primary.exportable());
        let server = ServerHandshakeConfig::builder(s.server_id.clone())
            .middleboxes(ServerMiddlebox::Preconfigured("mb2.test".into()))
            .middlebox_roots(s.root.clone())
            .policy(s.policy.clone())
            .only(version)
            .build()
            .unwrap();
        let mbs = (
            s.middlebox("mb1.test", PROGRAM),
            s.middlebox("mb2.test", PROGRAM),
        );
        let (client, server) = (
            ClientHandshake::new(ClientHandshakeConfig {
                now_unix: now_unix(),
                ..client
            })
            .unwrap(),
            ServerHandshake::new(ServerHandshakeConfig {
                now_unix: now_unix(),
                announcements_after_hello: false,
                ..server
            })
            .unwrap(),
        );
        let mut path = exchange_between(client, mbs, server, version);
        assert_eq!(path.server().summary().unwrap().version, version);
    }
    // Without middleboxes the client's session stays in OpenSSL (no export, no key log).
    let direct = ClientHandshakeConfig::builder("server.test", s.root.clone())
        .build()
        .unwrap();
    assert!(!direct.primary.exportable());
    let rootless = ServerHandshakeConfig::builder(s.server_id.clone())
        .middleboxes(ServerMiddlebox::Preconfigured("mb2.test".into()))
        .build()
        .err()
        .unwrap();
    assert!(
        rootless.to_string().contains("middlebox_roots"),
        "{rootless}"
    );
    let empty = ClientHandshakeConfig::builder("server.test", s.root.clone())
        .middleboxes(ClientMiddlebox::PreconfiguredPath(Vec::new()))
        .policy(s.policy.clone())
        .build()
        .err()
        .unwrap();
    assert!(empty.to_string().contains("1 to 255"), "{empty}");
    // Roots that hold no certificate are named, the client's middlebox roots too when they
    // default to its server roots, and a path given for the PEM is said to be one
    // (thirty-third round, from an embedder's trial: one message named neither).
    let wrong_roots = |e: Option<HandshakeError>| e.unwrap().to_string();
    let path = wrong_roots(
        ClientHandshakeConfig::builder("server.test", "/etc/ssl/ca.pem")
            .build()
            .err(),
    );
    assert!(
        path.contains("server roots: no certificate found")
            && path.contains("look like a file path"),
        "{path}"
    );
    let mb_roots = wrong_roots(
        ServerHandshakeConfig::builder(s.server_id.clone())
            .middleboxes(ServerMiddlebox::Preconfigured("mb2.test".into()))
            .middlebox_roots(b"not PEM\nat all".to_vec())
            .policy(s.policy.clone())
            .build()
            .err(),
    );
    assert!(
        mb_roots.contains("middlebox roots: no certificate found")
            && !mb_roots.contains("file path"),
        "{mb_roots}"
    );
    // The default policy, which no middlebox can pass, while middleboxes may join.
    let refusing = [
        ClientHandshakeConfig::builder("server.test", s.root.clone())
            .middleboxes(ClientMiddlebox::Preconfigured("mb1.test".into()))
            .build()
            .err(),
        ServerHandshakeConfig::builder(s.server_id.clone())
            .middleboxes(ServerMiddlebox::Preconfigured("mb2.test".into()))
            .middlebox_roots(s.root.clone())
            .build()
            .err(),
    ];
    for e in refusing {
        let said = e.unwrap().to_string();
        assert!(
            said.contains("the attestation policy accepts no middlebox"),
            "{said}"
        );
    }
}

#[test]
fn undiscovered_middlebox_not_approved_gets_no_keys_and_the_session_is_direct() {
    for s in Setup::both() {
        eprintln!("secondary sessions: {}", s.secondary_engine);
        for version in VERSIONS {
            let refuse: Approver = Arc::new(|_chain: &[Vec<u8>]| false);
            let mut path = Path::new(vec![
                Node::LegacyClient(s.legacy_client(version)),
                server_side_mb(&s, tagger("mb2.test")),
                Node::Server(s.server(version, ServerMiddlebox::Discover(refuse))),
            ]);
            path.first().receive(Side::Server, &[]).unwrap();
            path.pump();
            path.first().write(REQUEST);
            path.pump();
            path.assert_no_errors();
            let mb = path.server_side_mb(1);
            assert!(!mb.keys_installed());
            assert!(mb.is_passive());
            let se = server_events(path.server());
            assert!(
                se.iter().any(|e| matches!(
                    e,
                    ClientHandshakeEvent::MiddleboxExcluded {
                        middlebox: Some(_),
                        why: "not approved by the application",
                        detail: None,
                    }
                )),
                "{se:?}"
            );
            assert!(se.contains(&ClientHandshakeEvent::Direct));
            // Untouched by the app: no header.
            assert_eq!(path.last().read(), REQUEST, "{version:?}");
            path.last().write(b"response");
            path.pump();
            assert_eq!(path.first().read(), b"response");
        }
    }
}

/// A legacy client → mb2, whose code the server's policy refuses → a server requiring mb2,
/// its first flight pumped through.
fn legacy_client_to_a_refused_server_side_middlebox(s: &Setup, version: TlsVersion) -> Path {
    let mb = ServerSideMiddlebox::new(
        s.middlebox("mb2.test", "some other program"),
        tagger("mb2.test"),
        true,
    )
    .unwrap();
    let mut path = Path::new(vec![
        Node::LegacyClient(s.legacy_client(version)),
        Node::ServerSideMb(mb),
        Node::Server(s.server(version, ServerMiddlebox::Preconfigured("mb2.test".into()))),
    ]);
    path.first().receive(Side::Server, &[]).unwrap();
    path.pump();
    path
}

#[test]
fn server_side_middlebox_failing_policy_gets_no_key_material() {
    for s in Setup::both() {
        eprintln!("secondary sessions: {}", s.secondary_engine);
        for version in VERSIONS {
            let mut path = legacy_client_to_a_refused_server_side_middlebox(&s, version);
            if let Node::LegacyClient(c) = path.first() {
                // The server fails before finishing its handshake (TLS 1.2): nothing to write.
                let _ = c.write_plaintext(REQUEST);
            }
            path.pump();
            path.assert_server_refused(&["attestation"], version);
            assert!(!path.server_side_mb(1).keys_installed());
            // The middlebox was told why, in the server's words.
            let mb = path.server_side_mb(1);
            let told = std::iter::from_fn(|| mb.poll_event()).find_map(|e| match e {
                MiddleboxHandshakeEvent::RefusedByEndpoint(why) => Some(why),
                _ => None,
            });
            assert!(
                told.as_deref()
                    .is_some_and(|t| t.starts_with("evidence refused: attestation: ")
                        && t.contains("is not accepted by policy")),
                "{version:?}: {told:?}"
            );
            assert!(path.last().read().is_empty());
            // The legacy client is told, through the middlebox: TLS 1.2 in the clear, TLS
            // 1.3 under the server's application traffic keys.
            let client = path.errors[0].clone().unwrap_or_default();
            assert!(client.contains("handshake_failure"), "{:?}", path.errors);
        }
    }
}

/// A handshake the server's TLS engine refuses sends the peer the engine's alert (here
/// protocol_version: a TLS 1.2-only client, a TLS 1.3-only server), not a bare close.
#[test]
fn a_refused_primary_handshake_sends_the_engines_alert() {
    let s = Setup::new();
    let mut path = Path::new(vec![
        Node::LegacyClient(s.legacy_client(TlsVersion::Tls12)),
        Node::Server(s.server(
            TlsVersion::Tls13,
            ServerMiddlebox::Discover(Arc::new(|_: &[Vec<u8>]| false)),
        )),
    ]);
    path.first().receive(Side::Server, &[]).unwrap();
    path.pump();
    assert!(path.errors[1].is_some(), "{:?}", path.errors);
    let client = path.errors[0].clone().unwrap_or_default();
    assert!(client.contains("protocol_version"), "{:?}", path.errors);
}

#[test]
fn unknown_server_side_middlebox_with_wrong_name_is_refused_when_preconfigured() {
    for s in Setup::both() {
        eprintln!("secondary sessions: {}", s.secondary_engine);
        let mb = ServerSideMiddlebox::new(s.middlebox("impostor.test", PROGRAM), tagger("x"), true)
            .unwrap();
        let mut path = Path::new(vec![
            Node::LegacyClient(s.legacy_client(TlsVersion::Tls13)),
            Node::ServerSideMb(mb),
            Node::Server(s.server(
                TlsVersion::Tls13,
                ServerMiddlebox::Preconfigured("mb2.test".into()),
            )),
        ]);
        path.first().receive(Side::Server, &[]).unwrap();
        path.pump();
        assert!(path.errors[2].is_some(), "{:?}", path.errors);
        assert!(!path.server().keys_sent());
        assert!(!path.server_side_mb(1).keys_installed());
    }
}

/// A server-side middlebox that has forwarded a legacy client's TLS 1.3 ClientHello, and
/// announced itself on subchannel 0 before it (both still in its output toward the server).
fn announced_middlebox(s: &Setup) -> ServerSideMiddlebox<Box<dyn MiddleboxApp>> {
    let mut client = s.legacy_client(TlsVersion::Tls13);
    let mut mb =
        ServerSideMiddlebox::new(s.middlebox("mb2.test", PROGRAM), passthrough(), true).unwrap();
    client.process().unwrap();
    mb.receive(Side::Client, &client.take_outgoing()).unwrap();
    mb
}

/// `received` failed saying `says`, and nothing of it went on toward the server.
fn assert_refused_unforwarded(
    mb: &mut ServerSideMiddlebox<Box<dyn MiddleboxApp>>,
    received: Result<(), HandshakeError>,
    says: &str,
) {
    let err = received.unwrap_err();
    assert!(err.to_string().contains(says), "{err}");
    assert!(mb.take_outgoing(Side::Server).is_empty());
}

/// How often the middlebox took what the server sent for a legacy server's refusal of its
/// announcement.
fn refusals(mb: &mut ServerSideMiddlebox<Box<dyn MiddleboxApp>>) -> usize {
    std::iter::from_fn(|| mb.poll_event())
        .filter(
            |e| matches!(e, MiddleboxHandshakeEvent::Passive(why) if *why == ANNOUNCEMENT_REFUSED),
        )
        .count()
}

/// A legacy server's refusal is the first thing it sends: an alert after other records from
/// the server (here its answer to another middlebox's announcement) is no refusal of ours.
/// And nothing of the client's but its ClientHello may go first, or a server's alert on it
/// could pass for one.
#[test]
fn only_the_servers_first_answer_can_refuse_the_announcement() {
    let s = Setup::new();
    let alert = [21u8, 3, 3, 0, 2, 2, 10];
    let answer_to_another = announcement_record(7, 0x0303).unwrap();
    for (server_sends, refused) in [
        (vec![alert.to_vec()], 1),
        (vec![answer_to_another, alert.to_vec()], 0),
    ] {
        let mut mb = announced_middlebox(&s);
        for record in &server_sends {
            mb.receive(Side::Server, record).unwrap();
        }
        assert_eq!(refusals(&mut mb), refused, "{server_sends:?}");
    }
    let mut mb =
        ServerSideMiddlebox::new(s.middlebox("mb2.test", PROGRAM), passthrough(), true).unwrap();
    let received = mb.receive(Side::Client, &[23, 3, 3, 0, 2, 0, 0]);
    assert_refused_unforwarded(&mut mb, received, "other than its ClientHello");
}

/// A client that announces a middlebox itself and never plays it holds the server's
/// middlebox session open; what it sends after the primary handshake waits in the server's
/// paused engine, up to `MAX_COPIED_BYTES`: more fails the session instead of filling the
/// server until its handshake timeout.
#[test]
fn a_server_keeps_a_bounded_amount_of_data_while_a_middlebox_session_is_open() {
    let s = Setup::new();
    let mut client = s.legacy_client(TlsVersion::Tls13);
    let approve_all: Approver = Arc::new(|_: &[Vec<u8>]| true);
    let mut server = s.server(TlsVersion::Tls13, ServerMiddlebox::Discover(approve_all));
    client.process().unwrap();
    let mut first = announcement_record(0, 0x0303).unwrap();
    first.extend_from_slice(&client.take_outgoing());
    server.receive(&first).unwrap();
    // The server's secondary ClientHello goes unanswered; its primary flight reaches the client.
    client.feed(&common::primary_only(&server.take_outgoing()));
    client.process().unwrap();
    assert!(!client.is_handshaking());
    server.receive(&client.take_outgoing()).unwrap();
    let e = common::refused_past_the_bound(|mib| {
        client.write_plaintext(mib).unwrap();
        server.receive(&client.take_outgoing())
    });
    assert!(e.to_string().contains("too much data from the peer"), "{e}");
    assert!(!server.keys_sent());
}

/// The middlebox's secondary session runs between it and the server: a record on its
/// subchannel from the client's side is forged (it would break that session, and a server that
/// only allows the middlebox would go on without it) and ends the connection unforwarded.
#[test]
fn a_record_on_the_middleboxs_subchannel_from_the_client_is_refused() {
    let mut mb = announced_middlebox(&Setup::new());
    let announced = mb.take_outgoing(Side::Server);
    assert_eq!(announced.first(), Some(&30), "announced on subchannel 0");
    // Another subchannel is a nearer middlebox's: passed on.
    let other = announcement_record(1, 0x0303).unwrap();
    mb.receive(Side::Client, &other).unwrap();
    assert_eq!(mb.take_outgoing(Side::Server), other);
    let received = mb.receive(Side::Client, &announcement_record(0, 0x0303).unwrap());
    assert_refused_unforwarded(&mut mb, received, "subchannel came from the client");
}

#[test]
fn legacy_server_refuses_the_announcement_and_the_middlebox_notices() {
    for s in Setup::both() {
        eprintln!("secondary sessions: {}", s.secondary_engine);
        for version in VERSIONS {
            let mut path = Path::new(vec![
                Node::LegacyClient(s.legacy_client(version)),
                server_side_mb(&s, passthrough()),
                Node::LegacyServer(s.legacy_server(version)),
            ]);
            path.first().receive(Side::Server, &[]).unwrap();
            path.pump();
            // OpenSSL refuses the unknown record type with an alert, the first thing it sends:
            // what the driver remembers the server by.
            assert!(path.errors[2].is_some(), "{:?}", path.errors);
            assert!(path.server_side_mb(1).announcement_unanswered());
            assert_eq!(refusals(path.server_side_mb(1)), 1, "{version:?}");
            // Not announcing (the server is remembered as legacy): the session works untouched.
            let unannounced = |mb: MiddleboxHandshakeConfig| {
                let mb = ServerSideMiddlebox::new(mb, passthrough(), false).unwrap();
                let mut path = Path::new(vec![
                    Node::LegacyClient(s.legacy_client(version)),
                    Node::ServerSideMb(mb),
                    Node::LegacyServer(s.legacy_server(version)),
                ]);
                path.first().receive(Side::Server, &[]).unwrap();
                path.pump();
                path
            };
            let mut path = unannounced(s.middlebox("mb2.test", PROGRAM));
            path.first().write(REQUEST);
            path.pump();
            path.assert_no_errors();
            assert_eq!(path.last().read(), REQUEST);
            // A middlebox that fails closed cuts that session instead, at the ClientHello
            // (thirty-third round).
            let mut path = unannounced(s.middlebox("mb2.test", PROGRAM).fail_closed());
            let cut = path.errors[1].clone().unwrap_or_default();
            assert!(
                cut.contains("not announcing to this server") && cut.contains("fails closed"),
                "{version:?}: {:?}",
                path.errors
            );
            // The client's handshake never finished: there was nothing to send it through.
            assert!(path.last().read().is_empty(), "{version:?}");
        }
    }
}

/// nginx takes a connection that does not start with a TLS handshake (ours starts with the
/// announcement) for plain HTTP and answers with an HTTP 400 page, no alert. The middlebox
/// takes that for a legacy server's refusal too, and passes the page and what follows on
/// unchanged, however it is split; it does not fail on it as a bad record, which left the
/// server unremembered (found in a user trial). Text after the server's first record is no
/// refusal: that still fails as a bad record.
#[test]
fn a_server_answering_the_announcement_in_plain_text_is_a_legacy_refusal() {
    let s = Setup::new();
    let page = b"HTTP/1.1 400 Bad Request\r\nServer: nginx\r\nContent-Length: 0\r\n\r\n";
    for split in [1, 2, 7, page.len()] {
        let mut mb = announced_middlebox(&s);
        assert!(!mb.take_outgoing(Side::Server).is_empty());
        let (head, tail) = page.split_at(split);
        mb.receive(Side::Server, head).unwrap();
        mb.receive(Side::Server, tail).unwrap();
        let refused: Vec<_> = std::iter::from_fn(|| mb.poll_event())
            .filter(|e| {
                matches!(e, MiddleboxHandshakeEvent::Passive(why) if *why == ANNOUNCEMENT_REFUSED_NOT_TLS)
            })
            .collect();
        assert_eq!(refused.len(), 1, "split at {split}");
        assert!(mb.is_passive() && mb.announcement_unanswered());
        assert_eq!(mb.take_outgoing(Side::Client), page, "split at {split}");
        // The server's close follows; anything else it sends goes on as it comes.
        mb.receive(Side::Server, b"\x00\xff").unwrap();
        assert_eq!(mb.take_outgoing(Side::Client), b"\x00\xff");
    }
    // Failing closed, the refusal ends the session, and nothing the client sends next goes on.
    let mut client = s.legacy_client(TlsVersion::Tls13);
    client.process().unwrap();
    let mut mb = ServerSideMiddlebox::new(
        s.middlebox("mb2.test", PROGRAM).fail_closed(),
        passthrough(),
        true,
    )
    .unwrap();
    mb.receive(Side::Client, &client.take_outgoing()).unwrap();
    mb.take_outgoing(Side::Server);
    let err = mb.receive(Side::Server, page).unwrap_err();
    assert!(err.to_string().contains("fails closed"), "{err}");
    let later = mb.receive(Side::Client, &[23, 3, 3, 0, 1, 0]);
    assert_refused_unforwarded(&mut mb, later, "fails closed");
    // After a record from the server, text is a broken stream, not a refusal.
    let mut mb = announced_middlebox(&s);
    // (The first byte of a handshake message: a ServerHello's beginning.)
    mb.receive(Side::Server, &[22, 3, 3, 0, 1, 2]).unwrap();
    let err = mb.receive(Side::Server, page).unwrap_err();
    assert!(err.to_string().contains("bad record version"), "{err}");
}

/// Runs a legacy client, a server-side middlebox and an mbTLS server up to the client's
/// Finished flight, which carries the request too (before the middlebox has keys). Returns the
/// three nodes and what the middlebox forwards to the server from that flight.
fn up_to_finished_with_request(
    s: &Setup,
    version: TlsVersion,
) -> (
    OpenSslEngine,
    ServerSideMiddlebox<Box<dyn MiddleboxApp>>,
    ServerHandshake,
    Vec<u8>,
) {
    up_to_finished_with(s, version, false)
}

/// [`up_to_finished_with_request`]; `key_update`: the client updates its keys (asking for the
/// server's) in that flight, before its request (TLS 1.3).
fn up_to_finished_with(
    s: &Setup,
    version: TlsVersion,
    key_update: bool,
) -> (
    OpenSslEngine,
    ServerSideMiddlebox<Box<dyn MiddleboxApp>>,
    ServerHandshake,
    Vec<u8>,
) {
    let mut client = s.legacy_client(version);
    let mut mb =
        ServerSideMiddlebox::new(s.middlebox("mb2.test", PROGRAM), tagger("mb2"), true).unwrap();
    let mut server = s.server(version, ServerMiddlebox::Preconfigured("mb2.test".into()));
    client.process().unwrap();
    mb.receive(Side::Client, &client.take_outgoing()).unwrap();
    server.receive(&mb.take_outgoing(Side::Server)).unwrap();
    mb.receive(Side::Server, &server.take_outgoing()).unwrap();
    server.receive(&mb.take_outgoing(Side::Server)).unwrap();
    client.feed(&mb.take_outgoing(Side::Client));
    client.process().unwrap();
    if version == TlsVersion::Tls12 {
        // TLS 1.2: the server's Finished comes after the client's; one more round trip.
        mb.receive(Side::Client, &client.take_outgoing()).unwrap();
        server.receive(&mb.take_outgoing(Side::Server)).unwrap();
        mb.receive(Side::Server, &server.take_outgoing()).unwrap();
        client.feed(&mb.take_outgoing(Side::Client));
        client.process().unwrap();
    }
    if key_update {
        client.update_keys(true).unwrap();
    }
    client.write_plaintext(REQUEST).unwrap();
    mb.receive(Side::Client, &client.take_outgoing()).unwrap();
    let to_server = mb.take_outgoing(Side::Server);
    (client, mb, server, to_server)
}

/// A server-side middlebox copies the client's records it forwards before its keys arrive up
/// to `MAX_COPIED_BYTES`; more fails the session.
#[test]
fn a_server_side_middlebox_copies_a_bounded_amount_of_client_data_before_its_keys() {
    // TLS 1.3: the client's data follows its Finished while the server's key material is still
    // on its way (with TLS 1.2 the server's Finished, which the client waits for, comes after).
    let (mut client, mut mb, _server, _) =
        up_to_finished_with_request(&Setup::new(), TlsVersion::Tls13);
    assert!(!mb.keys_installed());
    // A driver stops reading the client once PAUSE_READING_AT is kept (thirty-third round),
    // long before the bound; the server's side, where the keys come from, is read on.
    assert!(!mb.waits_before_reading(Side::Client));
    client
        .write_plaintext(&vec![b'x'; PAUSE_READING_AT])
        .unwrap();
    mb.receive(Side::Client, &client.take_outgoing()).unwrap();
    mb.take_outgoing(Side::Server);
    assert!(mb.waits_before_reading(Side::Client));
    assert!(!mb.waits_before_reading(Side::Server));
    let e = common::refused_past_the_bound(|mib| {
        client.write_plaintext(mib).unwrap();
        mb.receive(Side::Client, &client.take_outgoing())?;
        mb.take_outgoing(Side::Server);
        Ok::<_, HandshakeError>(())
    });
    assert!(e.to_string().contains("too much client data"), "{e}");
    assert!(!mb.keys_installed());
}

/// Each record kept counts more than its bytes: empty records, which cost the middlebox far
/// more memory than their five bytes, reach the bound long before 16 MiB of them.
#[test]
fn empty_records_count_against_the_bound_for_more_than_their_bytes() {
    let (_client, mut mb, _server, _) =
        up_to_finished_with_request(&Setup::new(), TlsVersion::Tls13);
    let empty = [23u8, 3, 3, 0, 0];
    let failed = common::first_failure(100_000, |_| mb.receive(Side::Client, &empty));
    let (sent, e) = failed.expect("100,000 empty records kept");
    assert!(sent > 50_000, "{sent}");
    assert!(e.to_string().contains("too much client data"), "{e}");
}

/// [`up_to_finished_with`], the flight delivered to the server, then the path run until quiet
/// without an error.
fn finished_flight_delivered(s: &Setup, version: TlsVersion, key_update: bool) -> Path {
    let (client, mb, mut server, to_server) = up_to_finished_with(s, version, key_update);
    server.receive(&to_server).unwrap();
    let mut path = Path::new(vec![
        Node::LegacyClient(client),
        Node::ServerSideMb(mb),
        Node::Server(server),
    ]);
    path.pump();
    path.assert_no_errors();
    path
}

#[test]
fn request_in_the_clients_finished_flight_is_replayed_through_the_app_exactly_once() {
    for s in Setup::both() {
        eprintln!("secondary sessions: {}", s.secondary_engine);
        for version in VERSIONS {
            let mut path = finished_flight_delivered(&s, version, false);
            // TLS 1.3: the raw request reached the server before the middlebox had keys and was
            // dropped there (after authentication); TLS 1.2: the keys came with the server's
            // Finished, before the client could send anything.
            let discarded = path.server().discarded_records();
            match version {
                TlsVersion::Tls13 => assert!(discarded >= 1),
                _ => assert_eq!(discarded, 0),
            }
            assert_eq!(
                path.last().read(),
                b"GET / HTTP/1.1\r\nHost: server.test\r\nX-Mbtls: mb2\r\n\r\n",
                "{version:?}"
            );
        }
    }
}

/// TLS 1.3: a client may update its keys right after its Finished (RFC 8446 §4.6.3), while
/// the server's key material is still on its way to the middlebox. The server checks those
/// raw records before the middlebox's marker under the bridge keys and follows the KeyUpdate
/// among them; the middlebox re-sends them through its app; the request arrives and the
/// client's request for the server's KeyUpdate is answered (the answer crosses the middlebox).
#[test]
fn a_key_update_in_the_clients_finished_flight_is_followed_before_the_marker() {
    for s in Setup::both() {
        eprintln!("secondary sessions: {}", s.secondary_engine);
        let mut path = finished_flight_delivered(&s, TlsVersion::Tls13, true);
        // The KeyUpdate and the request were dropped at the server once authenticated.
        assert!(path.server().discarded_records() >= 2);
        assert_eq!(
            path.last().read(),
            b"GET / HTTP/1.1\r\nHost: server.test\r\nX-Mbtls: mb2\r\n\r\n",
        );
        path.last().write(b"answer");
        path.pump();
        path.assert_no_errors();
        // Upper-cased by the middlebox's app on its way.
        assert_eq!(path.first().read(), b"ANSWER");
        let Node::LegacyClient(client) = path.first() else {
            unreachable!()
        };
        // The server's KeyUpdate, answering the client's request, reached the client.
        assert_eq!(client.peer_key_updates().0, 1);
    }
}

#[test]
fn tampered_client_record_before_the_marker_is_fatal_at_the_server() {
    for s in Setup::both() {
        eprintln!("secondary sessions: {}", s.secondary_engine);
        let (_client, _mb, mut server, mut to_server) =
            up_to_finished_with_request(&s, TlsVersion::Tls13);
        // Flip a byte of the last record (the request, forwarded raw before the keys).
        let last = to_server.len() - 1;
        to_server[last] ^= 1;
        let err = server.receive(&to_server).unwrap_err();
        assert!(err.to_string().contains("failed authentication"), "{err}");
    }
}

fn client_mb(s: &Setup, name: &str) -> Node {
    Node::ClientSideMb(MiddleboxHandshake::new(s.middlebox(name, PROGRAM), tagger(name)).unwrap())
}

fn path_client(s: &Setup, version: TlsVersion, names: &[&str]) -> Node {
    Node::Client(s.mbtls_client_path(
        version,
        ClientMiddlebox::PreconfiguredPath(names.iter().map(|n| n.to_string()).collect()),
    ))
}

#[test]
fn two_client_side_middleboxes_in_front_of_a_legacy_server_both_versions() {
    for s in Setup::both() {
        eprintln!("secondary sessions: {}", s.secondary_engine);
        for version in VERSIONS {
            let mut path = Path::new(vec![
                path_client(&s, version, &["mb1.test", "mb0.test"]),
                client_mb(&s, "mb1.test"),
                client_mb(&s, "mb0.test"),
                Node::LegacyServer(s.legacy_server(version)),
            ]);
            path.first().write(REQUEST);
            path.pump();
            // The legacy server answers as soon as it has the request.
            path.last().write(b"first answer");
            path.pump();
            path.assert_no_errors();
            assert_eq!(
            path.last().read(),
            b"GET / HTTP/1.1\r\nHost: server.test\r\nX-Mbtls: mb1.test\r\nX-Mbtls: mb0.test\r\n\r\n",
            "{version:?}"
        );
            assert_eq!(path.first().read(), b"FIRST ANSWER", "{version:?}");
            path.first().write(b"GET /2 HTTP/1.1\r\n\r\n");
            path.last().write(b"second");
            path.pump();
            assert_eq!(
                path.last().read(),
                b"GET /2 HTTP/1.1\r\nX-Mbtls: mb1.test\r\nX-Mbtls: mb0.test\r\n\r\n"
            );
            assert_eq!(path.first().read(), b"SECOND");
            let Node::Client(c) = path.first() else {
                unreachable!()
            };
            let sum = c.summary().unwrap().clone();
            // client↔mb1, mb1↔mb0, mb0↔server (bridge): three different hops.
            assert_eq!(sum.hops.len(), 3, "{version:?}");
            assert!(
                sum.hops[0] != sum.hops[1]
                    && sum.hops[1] != sum.hops[2]
                    && sum.hops[0] != sum.hops[2]
            );
            for i in [1, 2] {
                let Node::ClientSideMb(m) = &path.nodes[i] else {
                    unreachable!()
                };
                let relay = m.relay().unwrap();
                let (r, w) = relay.key_fingerprints(Side::Client);
                assert_eq!(
                    (r.unwrap(), w.unwrap()),
                    (sum.hops[i - 1].c2s, sum.hops[i - 1].s2c)
                );
            }
        }
    }
}

#[test]
fn server_data_in_the_last_handshake_flight_crosses_two_client_side_middleboxes_once() {
    // TLS 1.3: the server writes right after its handshake, before any middlebox has keys.
    for s in Setup::both() {
        eprintln!("secondary sessions: {}", s.secondary_engine);
        for version in VERSIONS {
            let mut server = s.legacy_server(version);
            let mut client = path_client(&s, version, &["mb1.test", "mb0.test"]);
            let mut mb1 = client_mb(&s, "mb1.test");
            let mut mb0 = client_mb(&s, "mb0.test");
            client.write(REQUEST);
            let mut written = false;
            // Pump by hand so the server writes in the flight of its last handshake messages.
            for _ in 0..50 {
                let a = client.take_outgoing(Side::Server);
                mb1.receive(Side::Client, &a).unwrap();
                let b = mb1.take_outgoing(Side::Server);
                mb0.receive(Side::Client, &b).unwrap();
                let c = mb0.take_outgoing(Side::Server);
                server.feed(&c);
                server.process().unwrap();
                if !written && !server.is_handshaking() {
                    server.write_plaintext(b"early").unwrap();
                    written = true;
                }
                let d = server.take_outgoing();
                mb0.receive(Side::Server, &d).unwrap();
                let e = mb0.take_outgoing(Side::Client);
                mb1.receive(Side::Server, &e).unwrap();
                let f = mb1.take_outgoing(Side::Client);
                client.receive(Side::Server, &f).unwrap();
                if a.is_empty()
                    && b.is_empty()
                    && c.is_empty()
                    && d.is_empty()
                    && e.is_empty()
                    && f.is_empty()
                {
                    break;
                }
            }
            assert!(written);
            // Upper-cased by both apps, delivered exactly once.
            assert_eq!(client.read(), b"EARLY", "{version:?}");
            assert_eq!(
            server.take_plaintext(),
            b"GET / HTTP/1.1\r\nHost: server.test\r\nX-Mbtls: mb1.test\r\nX-Mbtls: mb0.test\r\n\r\n"
        );
        }
    }
}

/// Calls `prepare` if `mb` wants it; true if it did. Only the ClientHello went by: preparing
/// sends nothing.
fn prepare_if_wanted(mb: &mut MiddleboxHandshake<Box<dyn MiddleboxApp>>) -> bool {
    if !mb.wants_prepare() {
        return false;
    }
    mb.prepare();
    assert!(mb.take_outgoing(Side::Client).is_empty());
    assert!(mb.take_outgoing(Side::Server).is_empty());
    true
}

/// `MiddleboxHandshake::prepare` (what the driver calls while the ClientHello travels): both
/// middleboxes prepare an answer for subchannel 0; the one nearest the server uses it, the
/// other finds subchannel 0 taken at the ServerHello, drops it unsent and answers on 1. The
/// session is the same as without preparing. Also after a HelloRetryRequest (TLS 1.3 server
/// limited to P-384): the prepared answers stay valid for the real ServerHello.
#[test]
fn prepared_answers_two_client_side_middleboxes_both_versions() {
    for mut s in Setup::both() {
        eprintln!("secondary sessions: {}", s.secondary_engine);
        let runs = [
            (TlsVersion::Tls12, None),
            (TlsVersion::Tls13, None),
            (TlsVersion::Tls13, Some("P-384")),
        ];
        for (version, group) in runs {
            s.server_groups = group.into_iter().map(String::from).collect();
            let mut server = s.legacy_server(version);
            let mut client = path_client(&s, version, &["mb1.test", "mb0.test"]);
            let (Node::ClientSideMb(mut mb1), Node::ClientSideMb(mut mb0)) =
                (client_mb(&s, "mb1.test"), client_mb(&s, "mb0.test"))
            else {
                unreachable!()
            };
            client.write(REQUEST);
            let mut prepared = [false, false];
            for _ in 0..50 {
                let a = client.take_outgoing(Side::Server);
                mb1.receive(Side::Client, &a).unwrap();
                let b = mb1.take_outgoing(Side::Server);
                prepared[1] |= prepare_if_wanted(&mut mb1);
                mb0.receive(Side::Client, &b).unwrap();
                let c = mb0.take_outgoing(Side::Server);
                prepared[0] |= prepare_if_wanted(&mut mb0);
                server.feed(&c);
                server.process().unwrap();
                let d = server.take_outgoing();
                mb0.receive(Side::Server, &d).unwrap();
                let e = mb0.take_outgoing(Side::Client);
                mb1.receive(Side::Server, &e).unwrap();
                let f = mb1.take_outgoing(Side::Client);
                client.receive(Side::Server, &f).unwrap();
                if [&a, &b, &c, &d, &e, &f].iter().all(|x| x.is_empty()) {
                    break;
                }
            }
            assert_eq!(prepared, [true, true], "{version:?}");
            let ev = |m: &mut MiddleboxHandshake<Box<dyn MiddleboxApp>>| {
                std::iter::from_fn(|| m.poll_event()).collect::<Vec<_>>()
            };
            let (e0, e1) = (ev(&mut mb0), ev(&mut mb1));
            assert!(
                e0.contains(&MiddleboxHandshakeEvent::Joined { subchannel: 0 }),
                "{e0:?}"
            );
            assert!(
                e1.contains(&MiddleboxHandshakeEvent::Joined { subchannel: 1 }),
                "{e1:?}"
            );
            assert!(mb0.keys_installed() && mb1.keys_installed(), "{version:?}");
            assert_eq!(
            server.take_plaintext(),
            b"GET / HTTP/1.1\r\nHost: server.test\r\nX-Mbtls: mb1.test\r\nX-Mbtls: mb0.test\r\n\r\n",
            "{version:?}"
        );
            server.write_plaintext(b"answer").unwrap();
            let d = server.take_outgoing();
            mb0.receive(Side::Server, &d).unwrap();
            mb1.receive(Side::Server, &mb0.take_outgoing(Side::Client))
                .unwrap();
            client
                .receive(Side::Server, &mb1.take_outgoing(Side::Client))
                .unwrap();
            assert_eq!(client.read(), b"ANSWER", "{version:?}");
        }
    }
}

#[test]
fn two_client_side_and_one_server_side_middlebox_both_versions() {
    for s in Setup::both() {
        eprintln!("secondary sessions: {}", s.secondary_engine);
        for version in VERSIONS {
            let mut path = Path::new(vec![
                path_client(&s, version, &["mb1.test", "mb0.test"]),
                client_mb(&s, "mb1.test"),
                client_mb(&s, "mb0.test"),
                server_side_mb(&s, tagger("mb2.test")),
                Node::Server(s.server(version, ServerMiddlebox::Preconfigured("mb2.test".into()))),
            ]);
            path.first().write(REQUEST);
            path.pump();
            path.last().write(b"response");
            path.pump();
            path.assert_no_errors();
            assert_eq!(
            path.last().read(),
            b"GET / HTTP/1.1\r\nHost: server.test\r\nX-Mbtls: mb1.test\r\nX-Mbtls: mb0.test\r\nX-Mbtls: mb2.test\r\n\r\n",
            "{version:?}"
        );
            assert_eq!(path.first().read(), b"RESPONSE");
            let Node::Client(c) = path.first() else {
                unreachable!()
            };
            let cs = c.summary().unwrap().clone();
            let ss = path.server().summary().unwrap().clone();
            // Four hops; the endpoints share exactly the bridge (mb0↔mb2).
            assert_eq!(cs.hops.len() + ss.hops.len() - 1, 4);
            assert_eq!(cs.hops[2], ss.hops[0]);
            // P1C: the request is encrypted differently on each of the four links.
            for t in &path.tap_c2s {
                assert!(!t.windows(14).any(|w| w == b"GET / HTTP/1.1"));
            }
        }
    }
}

#[test]
fn one_of_two_preconfigured_middleboxes_failing_policy_stops_all_key_material() {
    for s in Setup::both() {
        eprintln!("secondary sessions: {}", s.secondary_engine);
        let version = TlsVersion::Tls13;
        let bad = MiddleboxHandshake::new(s.middlebox("mb0.test", "other program"), tagger("mb0"))
            .unwrap();
        let mut path = Path::new(vec![
            path_client(&s, version, &["mb1.test", "mb0.test"]),
            client_mb(&s, "mb1.test"),
            Node::ClientSideMb(bad),
            Node::LegacyServer(s.legacy_server(version)),
        ]);
        path.first().write(REQUEST);
        path.pump();
        assert!(
            path.errors[0]
                .as_deref()
                .unwrap_or("")
                .contains("attestation"),
            "{:?}",
            path.errors
        );
        for i in [1, 2] {
            let Node::ClientSideMb(m) = &path.nodes[i] else {
                unreachable!()
            };
            assert!(!m.keys_installed());
        }
        assert!(path.last().read().is_empty());
    }
}

fn server_mb(s: &Setup, name: &str) -> Node {
    Node::ServerSideMb(
        ServerSideMiddlebox::new(s.middlebox(name, PROGRAM), tagger(name), true).unwrap(),
    )
}

fn server_path(s: &Setup, version: TlsVersion, names: &[&str]) -> Node {
    Node::Server(s.server_with(
        version,
        ServerMiddlebox::PreconfiguredPath(names.iter().map(|n| n.to_string()).collect()),
        names[0],
    ))
}

/// P4 on the server side: announcements are not authenticated, so someone on the path who
/// reroutes the connections (client → mb3 → mb2 → server, configured mb2 then mb3) and swaps
/// the two announcements on the last link would have the server pair each configured name
/// with the other position; every check would pass and the middleboxes would run in the
/// order the attacker chose. Ids must rise in arrival order, so the server refuses.
#[test]
fn swapped_announcements_cannot_reorder_the_servers_middleboxes() {
    let s = Setup::new();
    for version in VERSIONS {
        let mut path = Path::new(vec![
            Node::LegacyClient(s.legacy_client(version)),
            server_mb(&s, "mb3.test"),
            server_mb(&s, "mb2.test"),
            server_path(&s, version, &["mb2.test", "mb3.test"]),
        ]);
        path.first().receive(Side::Server, &[]).unwrap();
        // mb3 announces on 0, mb2 on 1; on the last link the two records change places.
        for i in 0..2 {
            let fwd = path.nodes[i].take_outgoing(Side::Server);
            path.deliver(i + 1, Side::Client, &fwd);
        }
        let mut last_link = path.nodes[2].take_outgoing(Side::Server);
        let (first, second) = (last_link[..11].to_vec(), last_link[11..22].to_vec());
        assert_eq!((first[0], first[5], second[0], second[5]), (30, 0, 30, 1));
        last_link[..11].copy_from_slice(&second);
        last_link[11..22].copy_from_slice(&first);
        path.deliver(3, Side::Client, &last_link);
        path.pump();
        path.assert_server_refused(&["out of path order"], version);
    }
}

/// A repeated announcement id is refused too (its slot would be shadowed by the first).
#[test]
fn a_repeated_announcement_id_is_refused() {
    let s = Setup::new();
    let server = || {
        let path = vec!["mb2.test".into(), "mb3.test".into()];
        s.server(TlsVersion::Tls13, ServerMiddlebox::PreconfiguredPath(path))
    };
    let mut twice = announcement_record(0, 0x0303).unwrap();
    twice.extend(announcement_record(0, 0x0303).unwrap());
    let err = server().receive(&twice).unwrap_err();
    assert!(err.to_string().contains("out of path order"), "{err}");
    let mut in_order = server();
    let mut rising = announcement_record(0, 0x0303).unwrap();
    rising.extend(announcement_record(1, 0x0303).unwrap());
    in_order.receive(&rising).unwrap();
}

#[test]
fn two_server_side_middleboxes_behind_a_legacy_client_both_versions() {
    for s in Setup::both() {
        eprintln!("secondary sessions: {}", s.secondary_engine);
        for version in VERSIONS {
            let mut path = Path::new(vec![
                Node::LegacyClient(s.legacy_client(version)),
                server_mb(&s, "mb2.test"),
                server_mb(&s, "mb3.test"),
                server_path(&s, version, &["mb2.test", "mb3.test"]),
            ]);
            path.first().receive(Side::Server, &[]).unwrap();
            path.pump();
            path.first().write(REQUEST);
            path.pump();
            path.last().write(b"response");
            path.pump();
            path.assert_no_errors();
            assert_eq!(
            path.last().read(),
            b"GET / HTTP/1.1\r\nHost: server.test\r\nX-Mbtls: mb2.test\r\nX-Mbtls: mb3.test\r\n\r\n",
            "{version:?}"
        );
            assert_eq!(path.first().read(), b"RESPONSE");
            let ss = path.server().summary().unwrap().clone();
            // bridge (client↔mb2), mb2↔mb3, mb3↔server.
            assert_eq!(ss.hops.len(), 3);
            assert!(ss.hops[0] != ss.hops[1] && ss.hops[1] != ss.hops[2]);
            for (i, node) in [(0usize, 1usize), (1, 2)] {
                let Node::ServerSideMb(m) = &path.nodes[node] else {
                    unreachable!()
                };
                let (r, w) = m.relay().unwrap().key_fingerprints(Side::Server);
                assert_eq!(
                    (w.unwrap(), r.unwrap()),
                    (ss.hops[i + 1].c2s, ss.hops[i + 1].s2c)
                );
            }
        }
    }
}

#[test]
fn request_in_the_finished_flight_crosses_two_server_side_middleboxes_once() {
    for s in Setup::both() {
        eprintln!("secondary sessions: {}", s.secondary_engine);
        for version in VERSIONS {
            let mut client = s.legacy_client(version);
            let mut m2 = server_mb(&s, "mb2.test");
            let mut m3 = server_mb(&s, "mb3.test");
            let mut server = server_path(&s, version, &["mb2.test", "mb3.test"]);
            client.process().unwrap();
            let mut written = false;
            for _ in 0..50 {
                if !written && !client.is_handshaking() {
                    // In the flight of the client's Finished (TLS 1.3) or right after (TLS 1.2).
                    client.write_plaintext(REQUEST).unwrap();
                    written = true;
                }
                let a = client.take_outgoing();
                m2.receive(Side::Client, &a).unwrap();
                let b = m2.take_outgoing(Side::Server);
                m3.receive(Side::Client, &b).unwrap();
                let c = m3.take_outgoing(Side::Server);
                server.receive(Side::Client, &c).unwrap();
                let d = server.take_outgoing(Side::Client);
                m3.receive(Side::Server, &d).unwrap();
                let e = m3.take_outgoing(Side::Client);
                m2.receive(Side::Server, &e).unwrap();
                let f = m2.take_outgoing(Side::Client);
                client.feed(&f);
                client.process().unwrap();
                if [&a, &b, &c, &d, &e, &f].iter().all(|x| x.is_empty()) {
                    break;
                }
            }
            assert!(written);
            assert_eq!(
            server.read(),
            b"GET / HTTP/1.1\r\nHost: server.test\r\nX-Mbtls: mb2.test\r\nX-Mbtls: mb3.test\r\n\r\n",
            "{version:?}"
        );
        }
    }
}

#[test]
fn two_middleboxes_on_each_side_both_versions() {
    for s in Setup::both() {
        eprintln!("secondary sessions: {}", s.secondary_engine);
        for version in VERSIONS {
            let mut path = Path::new(vec![
                path_client(&s, version, &["mb1.test", "mb0.test"]),
                client_mb(&s, "mb1.test"),
                client_mb(&s, "mb0.test"),
                server_mb(&s, "mb2.test"),
                server_mb(&s, "mb3.test"),
                server_path(&s, version, &["mb2.test", "mb3.test"]),
            ]);
            path.first().write(REQUEST);
            path.pump();
            path.last().write(b"response");
            path.pump();
            path.assert_no_errors();
            assert_eq!(
            path.last().read(),
            b"GET / HTTP/1.1\r\nHost: server.test\r\nX-Mbtls: mb1.test\r\nX-Mbtls: mb0.test\r\nX-Mbtls: mb2.test\r\nX-Mbtls: mb3.test\r\n\r\n",
            "{version:?}"
        );
            assert_eq!(path.first().read(), b"RESPONSE");
            let Node::Client(c) = path.first() else {
                unreachable!()
            };
            let cs = c.summary().unwrap().clone();
            let ss = path.server().summary().unwrap().clone();
            assert_eq!(cs.hops.last(), ss.hops.first());
            assert_eq!(cs.hops.len() + ss.hops.len() - 1, 5);
        }
    }
}

#[test]
fn a_third_announcing_middlebox_is_refused() {
    for s in Setup::both() {
        eprintln!("secondary sessions: {}", s.secondary_engine);
        for version in VERSIONS {
            let path = Path::new(vec![
                Node::LegacyClient(s.legacy_client(version)),
                server_mb(&s, "mb2.test"),
                server_mb(&s, "mb3.test"),
                Node::Server(s.server(version, ServerMiddlebox::Preconfigured("mb2.test".into()))),
            ]);
            assert_too_many_refused(path, version);
        }
    }
}

/// A legacy client's handshake through `path`, whose server (last) gets more announcements than
/// it lets join: the server refuses them, and the client reads `handshake_failure`, sent once
/// the server's ServerHello was out (twenty-sixth round, found in a user trial: the server
/// failed at the announcement, before its ServerHello, where it sends no alert, and the client
/// read only a close).
fn assert_too_many_refused(mut path: Path, case: impl std::fmt::Debug) {
    path.first().receive(Side::Server, &[]).unwrap();
    path.pump();
    let server = path.errors.last().cloned().flatten().unwrap_or_default();
    assert!(
        server.contains("more middleboxes announced themselves"),
        "{case:?}: {:?}",
        path.errors
    );
    let client = path.errors[0].clone().unwrap_or_default();
    assert!(client.contains("handshake_failure"), "{:?}", path.errors);
}

/// A HelloRetryRequest is a ServerHello whose random is SHA-256("HelloRetryRequest") (RFC 8446
/// §4.1.3).
const HRR_RANDOM: [u8; 32] = [
    0xCF, 0x21, 0xAD, 0x74, 0xE5, 0x9A, 0x61, 0x11, 0xBE, 0x1D, 0x8C, 0x02, 0x1E, 0x65, 0xB8, 0x91,
    0xC2, 0xA2, 0x11, 0x16, 0x7A, 0xBB, 0x8C, 0x5E, 0x07, 0x9E, 0x09, 0xE2, 0xC8, 0xA8, 0x33, 0x9C,
];

/// A TLS 1.3 server that only takes P-384 answers the clients' X25519 key share with a
/// HelloRetryRequest: the client-side middleboxes join on the real ServerHello that follows
/// (they would stay passive if they took the retry request for it), server-side ones as usual.
#[test]
fn hello_retry_request_on_the_primary_handshake() {
    for mut s in Setup::both() {
        eprintln!("secondary sessions: {}", s.secondary_engine);
        s.server_groups = vec!["P-384".into()];
        let v = TlsVersion::Tls13;
        let paths: Vec<(&str, Vec<Node>, &[u8])> = vec![
            (
                "one client-side middlebox, legacy server",
                vec![
                    Node::Client(s.mbtls_client(v)),
                    client_mb(&s, "mb1.test"),
                    Node::LegacyServer(s.legacy_server(v)),
                ],
                b"X-Mbtls: mb1.test\r\n",
            ),
            (
                // Its middlebox answers before the real ServerHello, after the retry request:
                // the client must not settle discovery at the retry request.
                "one discovered client-side middlebox, legacy server",
                vec![
                    Node::Client(
                        s.mbtls_client_path(v, ClientMiddlebox::Discover(Arc::new(|_| true))),
                    ),
                    client_mb(&s, "mb1.test"),
                    Node::LegacyServer(s.legacy_server(v)),
                ],
                b"X-Mbtls: mb1.test\r\n",
            ),
            (
                "two client-side middleboxes, legacy server",
                vec![
                    path_client(&s, v, &["mb1.test", "mb0.test"]),
                    client_mb(&s, "mb1.test"),
                    client_mb(&s, "mb0.test"),
                    Node::LegacyServer(s.legacy_server(v)),
                ],
                b"X-Mbtls: mb1.test\r\nX-Mbtls: mb0.test\r\n",
            ),
            (
                "client-side and server-side middlebox, mbTLS server",
                vec![
                    Node::Client(s.mbtls_client(v)),
                    client_mb(&s, "mb1.test"),
                    server_mb(&s, "mb2.test"),
                    Node::Server(s.server(v, ServerMiddlebox::Preconfigured("mb2.test".into()))),
                ],
                b"X-Mbtls: mb1.test\r\nX-Mbtls: mb2.test\r\n",
            ),
        ];
        for (what, nodes, headers) in paths {
            let mut path = Path::new(nodes);
            path.first().write(REQUEST);
            path.pump();
            path.last().write(b"answer");
            path.pump();
            path.assert_no_errors();
            let mut want = b"GET / HTTP/1.1\r\nHost: server.test\r\n".to_vec();
            want.extend_from_slice(headers);
            want.extend_from_slice(b"\r\n");
            assert_eq!(path.last().read(), want, "{what}");
            assert_eq!(path.first().read(), b"ANSWER", "{what}");
            // The server sent a HelloRetryRequest (else this test proves nothing).
            let from_server = path.tap_s2c.last().unwrap();
            assert!(from_server.windows(32).any(|w| w == HRR_RANDOM), "{what}");
        }
    }
}

/// A server that refuses its middlebox while its HelloRetryRequest is out (the middlebox's
/// evidence comes back before the client's second ClientHello) has no keys yet: the legacy
/// client still reads `handshake_failure`, in plaintext (twenty-sixth round; before, the
/// server had no alert to send there and the client saw a close).
#[test]
fn a_server_refusing_its_middlebox_after_a_hello_retry_request_sends_an_alert() {
    for mut s in Setup::both() {
        eprintln!("secondary sessions: {}", s.secondary_engine);
        s.server_groups = vec!["P-384".into()];
        let v = TlsVersion::Tls13;
        let mut path = legacy_client_to_a_refused_server_side_middlebox(&s, v);
        path.assert_server_refused(&["attestation"], v);
        // The retry request went out, and nothing protected after it: the refusal came in
        // the window this test is about.
        let from_server = path.tap_s2c.last().unwrap().clone();
        assert!(from_server.windows(32).any(|w| w == HRR_RANDOM));
        assert!(
            !common::records(&from_server)
                .iter()
                .any(|r| r.first() == Some(&23)),
            "a protected record left the server"
        );
        let client = path.errors[0].clone().unwrap_or_default();
        assert!(client.contains("handshake_failure"), "{:?}", path.errors);
    }
}

/// Several discovered middleboxes per side (`DiscoverUpTo`): all join when approved; when one
/// is excluded the others still join, and the endpoint's path message tells each whether a
/// middlebox beyond it joined (so none waits for the excluded one's switch).
mod several_discovered {
    use super::*;

    /// Approves every middlebox whose leaf certificate does not carry `refused`.
    fn approve_all_but(refused: &'static str) -> Approver {
        Arc::new(move |chain: &[Vec<u8>]| {
            chain
                .first()
                .is_some_and(|der| !der.windows(refused.len()).any(|w| w == refused.as_bytes()))
        })
    }

    /// The middleboxes (nodes 1 to 3) at `passive` forward ciphertext only and hold no keys;
    /// the others joined with keys.
    fn assert_passive_exactly(path: &Path, passive: &[usize], what: &str) {
        for i in 1..=3 {
            let (is_passive, has_keys) = match &path.nodes[i] {
                Node::ClientSideMb(m) => (m.is_passive(), m.keys_installed()),
                Node::ServerSideMb(m) => (m.is_passive(), m.keys_installed()),
                _ => panic!("not a middlebox"),
            };
            let want = passive.contains(&i);
            assert_eq!((is_passive, has_keys), (want, !want), "{what}: node {i}");
        }
    }

    /// `head` (request line and headers, each ending in CRLF) with each name's header added.
    fn request_with(head: &[u8], names: &[&str]) -> Vec<u8> {
        let mut r = head.to_vec();
        for n in names {
            r.extend_from_slice(format!("X-Mbtls: {n}\r\n").as_bytes());
        }
        r.extend_from_slice(b"\r\n");
        r
    }

    /// Two requests and answers; checks what arrived (answers are upper-cased when a middlebox
    /// took part).
    fn exchange(path: &mut Path, headers: &[&str], what: &str) {
        let upper = !headers.is_empty();
        for (head, answer) in [
            (&b"GET / HTTP/1.1\r\nHost: server.test\r\n"[..], "answer"),
            (&b"GET /2 HTTP/1.1\r\n"[..], "more"),
        ] {
            let mut request = head.to_vec();
            request.extend_from_slice(b"\r\n");
            path.first().write(&request);
            path.pump();
            path.last().write(answer.as_bytes());
            path.pump();
            path.assert_no_errors();
            assert_eq!(path.last().read(), request_with(head, headers), "{what}");
            let want = if upper {
                answer.to_ascii_uppercase()
            } else {
                answer.to_string()
            };
            assert_eq!(path.first().read(), want.as_bytes(), "{what}");
        }
    }

    /// An endpoint's events name each middlebox it checked: every joined one verified, the
    /// refused one (if it was on the path) excluded by its certificate's name.
    fn assert_named_verdicts(
        events: &[ClientHandshakeEvent],
        refused: &str,
        joined: &[&str],
        what: &str,
    ) {
        let mut verified: Vec<&str> = events
            .iter()
            .filter_map(|e| match e {
                ClientHandshakeEvent::MiddleboxVerified { middlebox, .. } => {
                    Some(middlebox.as_str())
                }
                _ => None,
            })
            .collect();
        verified.sort_unstable();
        assert_eq!(verified, joined, "{what}: {events:?}");
        let excluded: Vec<_> = events
            .iter()
            .filter_map(|e| match e {
                ClientHandshakeEvent::MiddleboxExcluded { middlebox, why, .. } => {
                    Some((middlebox.as_deref(), *why))
                }
                _ => None,
            })
            .collect();
        let expected: Vec<_> = if joined.len() == 3 {
            Vec::new()
        } else {
            vec![(Some(refused), "not approved by the application")]
        };
        assert_eq!(excluded, expected, "{what}");
    }

    /// (refused name, middleboxes that join in path order, nodes that must stay passive), on
    /// a path of three middleboxes mba, mbb, mbc (nodes 1 to 3) between client and server. The
    /// same cases hold for either side: whichever end gives the keys, a middlebox whose only
    /// farther neighbour was refused must not wait for it, and one with a refused neighbour in
    /// between waits for the next one that joined.
    const CASES: [(&str, &[&str], &[usize]); 4] = [
        ("nobody.test", &["mba.test", "mbb.test", "mbc.test"], &[]),
        ("mba.test", &["mbb.test", "mbc.test"], &[1]),
        ("mbb.test", &["mba.test", "mbc.test"], &[2]),
        ("mbc.test", &["mba.test", "mbb.test"], &[3]),
    ];

    #[test]
    fn client_side_several_join_and_an_excluded_one_leaves_the_others_both_versions() {
        for s in Setup::both() {
            eprintln!("secondary sessions: {}", s.secondary_engine);
            for version in VERSIONS {
                for (refused, joined, passive) in CASES {
                    let what = format!("{version:?}, {refused} refused");
                    // Four hellos for three middleboxes: one stays unanswered.
                    let client = s.mbtls_client_path(
                        version,
                        ClientMiddlebox::DiscoverUpTo(approve_all_but(refused), 4),
                    );
                    let mut path = Path::new(vec![
                        Node::Client(client),
                        client_mb(&s, "mba.test"),
                        client_mb(&s, "mbb.test"),
                        client_mb(&s, "mbc.test"),
                        Node::LegacyServer(s.legacy_server(version)),
                    ]);
                    exchange(&mut path, joined, &what);
                    assert_passive_exactly(&path, passive, &what);
                    let Node::Client(c) = path.first() else {
                        unreachable!()
                    };
                    let ce: Vec<ClientHandshakeEvent> =
                        std::iter::from_fn(|| c.poll_event()).collect();
                    assert_named_verdicts(&ce, refused, joined, &what);
                    let summary = c.summary().unwrap();
                    assert_eq!(summary.middleboxes, joined, "{what}");
                    let hops = summary.hops.clone();
                    assert_eq!(hops.len(), joined.len() + 1, "{what}");
                    for (i, a) in hops.iter().enumerate() {
                        assert!(hops.iter().skip(i + 1).all(|b| a != b), "{what}");
                    }
                }
            }
        }
    }

    #[test]
    fn server_side_several_join_and_an_excluded_one_leaves_the_others_both_versions() {
        for s in Setup::both() {
            eprintln!("secondary sessions: {}", s.secondary_engine);
            for version in VERSIONS {
                for (refused, joined, passive) in CASES {
                    let what = format!("{version:?}, {refused} refused");
                    let mut path = Path::new(vec![
                        Node::LegacyClient(s.legacy_client(version)),
                        server_mb(&s, "mba.test"),
                        server_mb(&s, "mbb.test"),
                        server_mb(&s, "mbc.test"),
                        Node::Server(s.server(
                            version,
                            ServerMiddlebox::DiscoverUpTo(approve_all_but(refused), 3),
                        )),
                    ]);
                    path.first().receive(Side::Server, &[]).unwrap();
                    path.pump();
                    exchange(&mut path, joined, &what);
                    assert_passive_exactly(&path, passive, &what);
                    let se = server_events(path.server());
                    assert_named_verdicts(&se, refused, joined, &what);
                    let summary = path.server().summary().unwrap();
                    assert_eq!(summary.middleboxes, joined, "{what}");
                    assert_eq!(summary.hops.len(), joined.len() + 1, "{what}");
                }
            }
        }
    }

    #[test]
    fn more_announcements_than_allowed_fail_the_handshake() {
        for s in Setup::both() {
            eprintln!("secondary sessions: {}", s.secondary_engine);
            let path = Path::new(vec![
                Node::LegacyClient(s.legacy_client(TlsVersion::Tls13)),
                server_mb(&s, "mba.test"),
                server_mb(&s, "mbb.test"),
                server_mb(&s, "mbc.test"),
                Node::Server(s.server(
                    TlsVersion::Tls13,
                    ServerMiddlebox::DiscoverUpTo(approve_all_but("nobody.test"), 2),
                )),
            ]);
            assert_too_many_refused(path, s.secondary_engine);
        }
    }
}

mod arbitrary_input {
    use super::*;
    use proptest::prelude::*;
    use std::sync::OnceLock;

    fn shared() -> &'static Setup {
        static S: OnceLock<Setup> = OnceLock::new();
        S.get_or_init(Setup::new)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Arbitrary bytes from either side, after a real ClientHello or instead of one, never
        /// panic a server-side middlebox or an mbTLS server; errors are typed.
        #[test]
        fn never_panics(
            from_client in proptest::collection::vec(any::<u8>(), 0..400),
            from_server in proptest::collection::vec(any::<u8>(), 0..400),
            real_hello in any::<bool>(),
            flip in (any::<usize>(), any::<u8>()),
        ) {
            let s = shared();
            let mut client = s.legacy_client(TlsVersion::Tls13);
            client.process().unwrap();
            let mut ch = client.take_outgoing();
            let mut mb = ServerSideMiddlebox::new(s.middlebox("mb2.test", PROGRAM), passthrough(), true).unwrap();
            let mut server = s.server(TlsVersion::Tls13, ServerMiddlebox::Preconfigured("mb2.test".into()));
            if real_hello {
                let _ = mb.receive(Side::Client, &ch);
                let _ = server.receive(&mb.take_outgoing(Side::Server));
                let _ = mb.receive(Side::Server, &server.take_outgoing());
            }
            let _ = mb.receive(Side::Client, &from_client);
            let _ = mb.receive(Side::Server, &from_server);
            let _ = server.receive(&from_client);
            // A flipped ClientHello, then garbage.
            let n = ch.len();
            ch[flip.0 % n] ^= flip.1;
            let mut server2 = s.server(TlsVersion::Tls13, ServerMiddlebox::Preconfigured("mb2.test".into()));
            let _ = server2.receive(&ch);
            let _ = server2.receive(&from_server);
        }
    }
}

/// An idle server gives back its buffers (`release_idle_buffers`, what the driver calls after
/// 2 s without a read) without losing a record that had only partly arrived: with the session
/// kept in OpenSSL and with exported keys behind a client-side middlebox, a request record cut
/// in two with a release between the halves still arrives whole, and the session goes on.
#[test]
fn an_idle_release_at_the_server_keeps_an_incomplete_record_both_versions() {
    each_request_to_a_discovering_server(&Setup::new(), |what, _, path| {
        assert!(!path.last().read().is_empty(), "{what}");
        path.server().release_idle_buffers();
        // The request crosses every link but the last as usual; the last gets it in two.
        path.first().write(REQUEST);
        let last = path.nodes.len() - 1;
        let mut bytes = Vec::new();
        for _ in 0..4 {
            for i in 0..last {
                let fwd = path.nodes[i].take_outgoing(Side::Server);
                if i + 1 == last {
                    bytes.extend(fwd);
                } else {
                    path.deliver(i + 1, Side::Client, &fwd);
                }
            }
        }
        assert!(bytes.len() > 10, "{what}: {} bytes", bytes.len());
        let (head, tail) = bytes.split_at(bytes.len() / 2);
        path.deliver(last, Side::Client, head);
        path.server().release_idle_buffers();
        path.deliver(last, Side::Client, tail);
        path.pump();
        path.assert_no_errors();
        let got = path.last().read();
        assert!(
            got.ends_with(b"\r\n\r\n") && got.starts_with(b"GET / "),
            "{what}"
        );
        path.last().write(b"response");
        path.pump();
        path.assert_no_errors();
        assert!(
            path.first().read().eq_ignore_ascii_case(b"response"),
            "{what}"
        );
    });
}

/// Secondary-session resumption (paper §3.5, docs/mbtls.md §4.6): servers that share one
/// secondary context as deployed (`secondary_client_config`: rustls, resuming), each with its
/// own policy, and middleboxes that keep their configuration (and so their ticket key) across
/// sessions unless restarted.
mod secondary_resumption {
    use super::*;
    use mbx_attest::{AttestError, Attester, Evidence};
    use mbx_mbtls::handshake::{secondary_client_config, SECONDARY_RESUMED_NAMES};
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// The simulated attester, counting the evidence it makes.
    struct Counting(SimulatedAttester, Arc<AtomicUsize>);

    impl Attester for Counting {
        fn evidence(&self, report_data: &[u8; 64]) -> Result<Evidence, AttestError> {
            self.1.fetch_add(1, Ordering::SeqCst);
            self.0.evidence(report_data)
        }
    }

    fn counting_middlebox(s: &Setup, name: &str) -> (MiddleboxHandshakeConfig, Arc<AtomicUsize>) {
        counting_middlebox_with(s, name, None)
    }

    /// `secondary_version`: the only version the middlebox's secondary sessions speak (`None`:
    /// both, and TLS 1.3 is chosen, whatever the primary session's version).
    fn counting_middlebox_with(
        s: &Setup,
        name: &str,
        secondary_version: Option<TlsVersion>,
    ) -> (MiddleboxHandshakeConfig, Arc<AtomicUsize>) {
        counting_middlebox_certified(s, &LeafSpec::middlebox(name), secondary_version)
    }

    /// [`counting_middlebox_with`] with a certificate for `leaf`.
    fn counting_middlebox_certified(
        s: &Setup,
        leaf: &LeafSpec,
        secondary_version: Option<TlsVersion>,
    ) -> (MiddleboxHandshakeConfig, Arc<AtomicUsize>) {
        let (id, _) = identity(&s.pki, leaf);
        let made = Arc::new(AtomicUsize::new(0));
        let attester = Counting(
            SimulatedAttester::new(s.platform.clone(), measure(PROGRAM, b""), signer_id("t")),
            made.clone(),
        );
        let mut tls = TlsConfig::server(id);
        if let Some(v) = secondary_version {
            tls = tls.only(v);
        }
        let cfg = MiddleboxHandshakeConfig::new(&tls, Some(Arc::new(attester))).unwrap();
        (cfg, made)
    }

    fn shared_secondary(s: &Setup) -> Arc<dyn ClientContext> {
        rustls_secondary(s)
    }

    fn rustls_secondary(s: &Setup) -> Arc<RustlsClientContext> {
        Arc::new(RustlsClientContext::new(&secondary_client_config(s.root.clone())).unwrap())
    }

    /// One session: legacy client → the middleboxes (in path order) → a server with
    /// `secondary` and `policy`. Returns the path after the request went through.
    fn session(
        s: &Setup,
        version: TlsVersion,
        mbs: &[(&str, &MiddleboxHandshakeConfig)],
        secondary: &Arc<dyn ClientContext>,
        policy: &Policy,
    ) -> Path {
        session_at(s, version, mbs, secondary, policy, now_unix())
    }

    /// [`session`] with the server's core told that the time is `now`.
    fn session_at(
        s: &Setup,
        version: TlsVersion,
        mbs: &[(&str, &MiddleboxHandshakeConfig)],
        secondary: &Arc<dyn ClientContext>,
        policy: &Policy,
        now: u64,
    ) -> Path {
        let mut primary = TlsConfig::server(s.server_id.clone()).only(version);
        primary.pause_after_handshake = true;
        let names = mbs.iter().map(|(n, _)| n.to_string()).collect();
        let server = ServerHandshake::new(ServerHandshakeConfig {
            primary: Arc::new(OpenSslContext::new(&primary).unwrap()),
            secondary: secondary.clone(),
            middlebox: ServerMiddlebox::PreconfiguredPath(names),
            policy: policy.clone(),
            now_unix: now,
            announcements_after_hello: false,
        })
        .unwrap();
        let mut nodes = vec![Node::LegacyClient(s.legacy_client(version))];
        for (name, cfg) in mbs {
            let mb = ServerSideMiddlebox::new((*cfg).clone(), tagger(name), true).unwrap();
            nodes.push(Node::ServerSideMb(mb));
        }
        nodes.push(Node::Server(server));
        let mut path = Path::new(nodes);
        path.first().receive(Side::Server, &[]).unwrap();
        path.pump();
        if let Node::LegacyClient(c) = path.first() {
            // A session that fails before the client's handshake ends has nothing to write.
            let _ = c.write_plaintext(REQUEST);
        }
        path.pump();
        path
    }

    /// The setup's policy, accepting another program's measurement instead of ours.
    fn another_programs_policy(s: &Setup) -> Policy {
        Policy {
            measurements: vec![HexBytes(measure("some other program", b"").to_vec())],
            ..s.policy.clone()
        }
    }

    /// The session had one verdict, with claims, resumed or not as `resumed` says.
    fn assert_one_check(path: &mut Path, resumed: bool, case: impl std::fmt::Debug) {
        let v = verdicts(path);
        assert!(
            matches!(v.as_slice(), [(r, Some(_))] if *r == resumed),
            "{case:?}: resumed should be {resumed}: {v:?}"
        );
    }

    /// (resumed, claims) of each verdict, in the order checked.
    fn verdicts(path: &mut Path) -> Vec<(bool, Option<mbx_attest::Claims>)> {
        checks(path).into_iter().map(|(r, c, _)| (r, c)).collect()
    }

    /// (resumed, claims, checked_at) of each verdict, in the order checked.
    fn checks(path: &mut Path) -> Vec<(bool, Option<mbx_attest::Claims>, u64)> {
        server_events(path.server())
            .into_iter()
            .filter_map(|e| match e {
                ClientHandshakeEvent::MiddleboxVerified {
                    claims,
                    resumed,
                    checked_at,
                    ..
                } => Some((resumed, claims, checked_at)),
                _ => None,
            })
            .collect()
    }

    /// A chain of resumptions rests on its first check: each resumed session reports that
    /// check's time, the tickets it gets keep it, and once the policy's
    /// `resumed_evidence_max_age` has passed since then the endpoint refuses the resumed
    /// session (here its clock runs ahead of the store's, which would not have offered the
    /// ticket otherwise), sending no key material.
    #[test]
    fn a_chain_of_resumptions_rests_on_its_first_check_and_ends_with_its_max_age_both_versions() {
        let s = Setup::new();
        let policy = Policy {
            resumed_evidence_max_age: 1000,
            ..s.policy.clone()
        };
        for version in VERSIONS {
            let secondary = shared_secondary(&s);
            let (mb, made) = counting_middlebox_with(&s, "mb2.test", Some(version));
            let mbs = [("mb2.test", &mb)];
            let t = now_unix();
            let mut first = session_at(&s, version, &mbs, &secondary, &policy, t - 990);
            first.assert_no_errors();
            assert!(
                matches!(checks(&mut first).as_slice(), [(false, Some(_), c)] if *c == t - 990),
                "{version:?}"
            );
            for later in [t - 500, t] {
                let mut resumed = session_at(&s, version, &mbs, &secondary, &policy, later);
                resumed.assert_no_errors();
                assert!(
                    matches!(checks(&mut resumed).as_slice(), [(true, Some(_), c)] if *c == t - 990),
                    "{version:?} at {later}"
                );
            }
            assert_eq!(made.load(Ordering::SeqCst), 1, "{version:?}");
            let mut too_late = session_at(&s, version, &mbs, &secondary, &policy, t + 10);
            too_late.assert_server_refused(
                &["checked 1000 s ago", "resumed_evidence_max_age"],
                version,
            );
            assert!(!too_late.server_side_mb(1).keys_installed());
        }
    }

    /// A resumed session rests on the simulated platform that signed the first evidence: a
    /// policy that no longer trusts that platform refuses it.
    #[test]
    fn a_resumed_middlebox_needs_its_platform_trusted_still_both_versions() {
        let s = Setup::new();
        let other = SimulatedPlatform::generate().unwrap();
        let distrusting = Policy {
            sim_platform_keys: vec![HexBytes(other.public_key().to_vec())],
            ..s.policy.clone()
        };
        for version in VERSIONS {
            let secondary = shared_secondary(&s);
            let (mb, _) = counting_middlebox(&s, "mb2.test");
            let mbs = [("mb2.test", &mb)];
            session(&s, version, &mbs, &secondary, &s.policy).assert_no_errors();
            let mut later = session(&s, version, &mbs, &secondary, &distrusting);
            later.assert_server_refused(&["untrusted platform key"], version);
        }
    }

    /// A middlebox seals its tickets under keys it replaces: a ticket opens after one
    /// rotation, not after two, and the endpoint then gets fresh evidence in a full
    /// handshake.
    #[test]
    fn a_middleboxs_ticket_dies_with_its_key_both_versions() {
        let s = Setup::new();
        for version in VERSIONS {
            let secondary = shared_secondary(&s);
            let (mb, made) = counting_middlebox_with(&s, "mb2.test", Some(version));
            let mbs = [("mb2.test", &mb)];
            let resumed = |expected: bool| {
                let mut path = session(&s, version, &mbs, &secondary, &s.policy);
                path.assert_no_errors();
                assert_one_check(&mut path, expected, version);
            };
            resumed(false);
            assert!(mb.tls.rotate_ticket_keys().unwrap());
            resumed(true);
            assert_eq!(made.load(Ordering::SeqCst), 1, "{version:?}");
            // Two rotations since the newest ticket's key began.
            mb.tls.rotate_ticket_keys().unwrap();
            mb.tls.rotate_ticket_keys().unwrap();
            resumed(false);
            assert_eq!(made.load(Ordering::SeqCst), 2, "{version:?}");
        }
    }

    /// A middlebox certificate valid for `secs` more seconds.
    fn expiring_leaf(name: &str, secs: u64) -> LeafSpec {
        LeafSpec {
            validity: Validity::ExpiresIn(std::time::Duration::from_secs(secs)),
            ..LeafSpec::middlebox(name)
        }
    }

    /// A resumed session skips the middlebox's certificate, so the endpoint keeps its end of
    /// validity with the check: past it, the endpoint refuses a resumed session (here its clock
    /// runs ahead of the store's, which would not have offered the ticket otherwise).
    #[test]
    fn a_resumed_session_is_refused_once_the_certificate_it_saw_expired_both_versions() {
        let s = Setup::new();
        for version in VERSIONS {
            let secondary = shared_secondary(&s);
            let leaf = expiring_leaf("mb2.test", 100);
            let (mb, _) = counting_middlebox_certified(&s, &leaf, Some(version));
            let mbs = [("mb2.test", &mb)];
            let t = now_unix();
            session_at(&s, version, &mbs, &secondary, &s.policy, t).assert_no_errors();
            let mut resumed = session_at(&s, version, &mbs, &secondary, &s.policy, t + 50);
            resumed.assert_no_errors();
            assert_one_check(&mut resumed, true, version);
            let mut expired = session_at(&s, version, &mbs, &secondary, &s.policy, t + 200);
            expired.assert_server_refused(
                &["certificate expired after the session this one resumes"],
                version,
            );
        }
    }

    /// Once the certificate a check saw has expired, its sessions are no longer offered: the
    /// next session is a full handshake, whose certificate check fails (resumed, it would
    /// have skipped it).
    #[test]
    fn a_certificate_that_expired_is_checked_again_in_a_full_handshake() {
        let s = Setup::new();
        let secondary = shared_secondary(&s);
        let (mb, made) = counting_middlebox_certified(&s, &expiring_leaf("mb2.test", 2), None);
        let mbs = [("mb2.test", &mb)];
        session(&s, TlsVersion::Tls13, &mbs, &secondary, &s.policy).assert_no_errors();
        // Not a timing assertion: the wait only has to outlast the certificate.
        std::thread::sleep(std::time::Duration::from_millis(3_500));
        let mut late = session(&s, TlsVersion::Tls13, &mbs, &secondary, &s.policy);
        late.assert_server_refused(&["TLS engine"], "expired certificate");
        let err = late.errors[2].clone().unwrap_or_default();
        assert!(err.to_lowercase().contains("expired"), "{err}");
        // The middlebox's first flight carries its evidence (TLS 1.3), before the endpoint
        // reads its certificate: the session was a full one.
        assert_eq!(made.load(Ordering::SeqCst), 2);
    }

    /// A check older than the policy's `resumed_evidence_max_age` is not offered for
    /// resumption: the next session is a full handshake with new evidence, and resumes again
    /// after it.
    #[test]
    fn a_check_past_its_max_age_means_a_full_handshake_both_versions() {
        let s = Setup::new();
        for version in VERSIONS {
            let secondary = shared_secondary(&s);
            let (mb, made) = counting_middlebox_with(&s, "mb2.test", Some(version));
            let mbs = [("mb2.test", &mb)];
            let max_age = s.policy.resumed_evidence_max_age;
            let long_ago = now_unix() - max_age - 5;
            session_at(&s, version, &mbs, &secondary, &s.policy, long_ago).assert_no_errors();
            for resumed in [false, true] {
                let mut next = session(&s, version, &mbs, &secondary, &s.policy);
                next.assert_no_errors();
                assert_one_check(&mut next, resumed, version);
            }
            assert_eq!(made.load(Ordering::SeqCst), 2, "{version:?}");
        }
    }

    #[test]
    fn a_server_resumes_its_middleboxs_session_without_new_evidence_both_versions() {
        let s = Setup::new();
        for version in VERSIONS {
            let secondary = shared_secondary(&s);
            let (mb, made) = counting_middlebox(&s, "mb2.test");
            let mut first = session(&s, version, &[("mb2.test", &mb)], &secondary, &s.policy);
            first.assert_no_errors();
            let v1 = verdicts(&mut first);
            assert!(
                matches!(v1.as_slice(), [(false, Some(_))]),
                "{version:?} {v1:?}"
            );
            assert!(!mb_events(first.server_side_mb(1)).contains(&MiddleboxHandshakeEvent::Resumed));
            let hops1 = first.server().summary().unwrap().hops.clone();
            assert_eq!(made.load(Ordering::SeqCst), 1);

            let mut second = session(&s, version, &[("mb2.test", &mb)], &secondary, &s.policy);
            second.assert_no_errors();
            let v2 = verdicts(&mut second);
            // The claims are the first session's; no evidence was made for this one.
            assert_eq!(v2, vec![(true, v1[0].1.clone())], "{version:?}");
            assert_eq!(made.load(Ordering::SeqCst), 1, "{version:?}");
            assert!(mb_events(second.server_side_mb(1)).contains(&MiddleboxHandshakeEvent::Resumed));
            // Fresh hop keys all the same, and the request crosses the middlebox's app once.
            let hops2 = second.server().summary().unwrap().hops.clone();
            assert!(hops2.iter().all(|h| !hops1.contains(h)), "{version:?}");
            request_and_answer_through_mb2(&mut second);

            // A restarted middlebox (new ticket key) cannot open the ticket: full handshake and
            // fresh evidence.
            let (restarted, made_again) = counting_middlebox(&s, "mb2.test");
            let mut third = session(
                &s,
                version,
                &[("mb2.test", &restarted)],
                &secondary,
                &s.policy,
            );
            third.assert_no_errors();
            assert_one_check(&mut third, false, version);
            assert_eq!(made_again.load(Ordering::SeqCst), 1, "{version:?}");
        }
    }

    #[test]
    fn a_middlebox_whose_evidence_was_refused_is_never_resumed_both_versions() {
        let s = Setup::new();
        let strict = another_programs_policy(&s);
        for version in VERSIONS {
            // Secondary sessions of this version too: a TLS 1.2 ticket comes before the
            // evidence, in the middlebox's handshake.
            let secondary = shared_secondary(&s);
            let (mb, made) = counting_middlebox_with(&s, "mb2.test", Some(version));
            let refused = session(&s, version, &[("mb2.test", &mb)], &secondary, &strict);
            let err = refused.errors[2].clone().unwrap_or_default();
            assert!(
                err.contains("attestation"),
                "{version:?}: {:?}",
                refused.errors
            );
            // Whatever the middlebox's session gave, the next one must check it again.
            let mut next = session(&s, version, &[("mb2.test", &mb)], &secondary, &s.policy);
            next.assert_no_errors();
            assert_one_check(&mut next, false, version);
            assert_eq!(made.load(Ordering::SeqCst), 2, "{version:?}");
        }
    }

    /// A check that rested on evidence in the middlebox's certificate is resumed only while
    /// today's policy still takes that mode and that nonce (found in a review: the resumed
    /// session skipped both, and a policy that turned the mode off still gave keys).
    #[test]
    fn a_resumed_certificate_evidence_check_must_pass_todays_policy_both_versions() {
        let s = Setup::new();
        for version in VERSIONS {
            let attester =
                SimulatedAttester::new(s.platform.clone(), measure(PROGRAM, b""), signer_id("t"));
            let id = super::leaf::identity_with_certificate_evidence(
                &s.pki, "mb2.test", &attester, b"nonce",
            );
            let mb =
                MiddleboxHandshakeConfig::new(&TlsConfig::server(id), Some(Arc::new(attester)))
                    .unwrap()
                    .evidence_in_certificate()
                    .unwrap();
            let mbs = [("mb2.test", &mb)];
            let on = Policy {
                certificate_evidence: true,
                ..s.policy.clone()
            };
            let pinned_other = Policy {
                certificate_nonces: vec![HexBytes(b"other".to_vec())],
                ..on.clone()
            };
            for (later_policy, refusal) in [
                (s.policy.clone(), "certificate_evidence = false"),
                (pinned_other, "certificate_nonces"),
            ] {
                let secondary = shared_secondary(&s);
                session(&s, version, &mbs, &secondary, &on).assert_no_errors();
                let mut later = session(&s, version, &mbs, &secondary, &later_policy);
                later.assert_server_refused(&[refusal], version);
                // Refused on the resumed check, not on a fresh one.
                let events = mb_events(later.server_side_mb(1));
                assert!(
                    events.contains(&MiddleboxHandshakeEvent::Resumed),
                    "{events:?}"
                );
                assert!(!later.server_side_mb(1).keys_installed());
            }
            // Under the same policy it resumes.
            let secondary = shared_secondary(&s);
            session(&s, version, &mbs, &secondary, &on).assert_no_errors();
            let mut later = session(&s, version, &mbs, &secondary, &on);
            later.assert_no_errors();
            assert_one_check(&mut later, true, version);
        }
    }

    #[test]
    fn a_resumed_middlebox_must_pass_todays_policy_both_versions() {
        let s = Setup::new();
        let stricter = another_programs_policy(&s);
        for version in VERSIONS {
            let secondary = shared_secondary(&s);
            let (mb, _) = counting_middlebox(&s, "mb2.test");
            session(&s, version, &[("mb2.test", &mb)], &secondary, &s.policy).assert_no_errors();
            let mut later = session(&s, version, &[("mb2.test", &mb)], &secondary, &stricter);
            later.assert_server_refused(&["measurement"], version);
            assert!(!later.server_side_mb(1).keys_installed());
        }
    }

    /// An OpenSSL secondary context that resumes would keep a middlebox's session before its
    /// evidence is checked: both endpoints refuse it, and take it with `resume_sessions = 0`.
    #[test]
    fn an_openssl_secondary_context_that_resumes_is_refused() {
        let s = Setup::new();
        let refused =
            |e: &HandshakeError| matches!(e, HandshakeError::Config(m) if m.contains("resumes"));
        for resume_sessions in [SECONDARY_RESUMED_NAMES, 0] {
            let cfg = TlsConfig {
                resume_sessions,
                ..secondary_client_config(s.root.clone())
            };
            let secondary: Arc<dyn ClientContext> = Arc::new(OpenSslContext::new(&cfg).unwrap());
            let mut primary = TlsConfig::server(s.server_id.clone());
            primary.pause_after_handshake = true;
            let server = ServerHandshake::new(ServerHandshakeConfig {
                primary: Arc::new(OpenSslContext::new(&primary).unwrap()),
                secondary: secondary.clone(),
                middlebox: ServerMiddlebox::Preconfigured("mb2.test".into()),
                policy: s.policy.clone(),
                now_unix: now_unix(),
                announcements_after_hello: false,
            });
            let mut primary = TlsConfig::client("server.test", s.root.clone());
            primary.custom_extensions = vec![CustomExtension::new(MIDDLEBOX_SUPPORT_EXTENSION)];
            primary.pause_after_handshake = true;
            let client = ClientHandshake::new(ClientHandshakeConfig {
                primary: Arc::new(OpenSslContext::new(&primary).unwrap()),
                server_name: "server.test".into(),
                secondary,
                middlebox: ClientMiddlebox::Preconfigured("mb1.test".into()),
                policy: s.policy.clone(),
                now_unix: now_unix(),
            });
            let resumes = resume_sessions > 0;
            assert_eq!(server.as_ref().err().is_some_and(refused), resumes);
            assert_eq!(client.as_ref().err().is_some_and(refused), resumes);
            assert_eq!(server.is_ok() && client.is_ok(), !resumes);
        }
    }

    /// Encapsulated records (type 30) in `bytes`, a stream of whole TLS records.
    fn encapsulated_records(bytes: &[u8]) -> usize {
        let (mut n, mut i) = (0, 0);
        while let Some(h) = bytes.get(i..i + 5) {
            n += usize::from(h[0] == 30);
            i += 5 + usize::from(u16::from_be_bytes([h[3], h[4]]));
        }
        n
    }

    /// A TLS 1.3 ticket is made only when the endpoint asks for it in its path message: an
    /// endpoint that does not resume gets one record less from its middlebox (OpenSSL would
    /// otherwise send tickets by itself, and one the endpoint cannot use still takes a
    /// sequence number before the marker).
    #[test]
    fn a_middlebox_makes_a_ticket_only_for_an_endpoint_that_keeps_it() {
        let s = Setup::new();
        let (mb, _) = counting_middlebox(&s, "mb2.test");
        let mut no_resume = secondary_client_config(s.root.clone());
        no_resume.resume_sessions = 0;
        let contexts: [Arc<dyn ClientContext>; 2] = [
            shared_secondary(&s),
            Arc::new(RustlsClientContext::new(&no_resume).unwrap()),
        ];
        let records: Vec<usize> = contexts
            .iter()
            .map(|secondary| {
                let path = session(
                    &s,
                    TlsVersion::Tls13,
                    &[("mb2.test", &mb)],
                    secondary,
                    &s.policy,
                );
                path.assert_no_errors();
                // From the middlebox to the server.
                encapsulated_records(&path.tap_c2s[1])
            })
            .collect();
        assert_eq!(records[0], records[1] + 1, "{records:?}");
    }

    /// Two server-side middleboxes: with TLS 1.2 secondary sessions both resume (their
    /// tickets travel in their handshakes); with TLS 1.3 (what middleboxes choose unless
    /// limited) only the one nearest the server does, because the other's ticket would come
    /// after its neighbour's switch, where the neighbour takes the first encapsulated record
    /// from it for its marker: it sends none, and is checked in full each time.
    #[test]
    fn with_two_middleboxes_tls13_resumes_the_nearest_only() {
        let s = Setup::new();
        for version in VERSIONS {
            let ctx = rustls_secondary(&s);
            let secondary: Arc<dyn ClientContext> = ctx.clone();
            let (mb2, made2) = counting_middlebox_with(&s, "mb2.test", Some(version));
            let (mb3, made3) = counting_middlebox_with(&s, "mb3.test", Some(version));
            let mbs = [("mb2.test", &mb2), ("mb3.test", &mb3)];
            for _ in 0..3 {
                let mut path = session(&s, version, &mbs, &secondary, &s.policy);
                path.last().write(b"response");
                path.pump();
                path.assert_no_errors();
                assert_eq!(path.first().read(), b"RESPONSE");
                // Checked in the order they finished; both joined.
                assert_eq!(verdicts(&mut path).len(), 2);
            }
            let (far, near) = (made2.load(Ordering::SeqCst), made3.load(Ordering::SeqCst));
            let expected = match version {
                TlsVersion::Tls12 => (1, 1),
                TlsVersion::Tls13 => (3, 1),
            };
            assert_eq!(
                (far, near),
                expected,
                "{version:?}: evidence made (far, near)"
            );
            assert_eq!(
                ctx.kept_sessions("mb2.test"),
                usize::from(version == TlsVersion::Tls12)
            );
            assert_eq!(ctx.kept_sessions("mb3.test"), 1, "{version:?}");
        }
    }
}

/// Two instances of one service, with certificates for the same name, can both be on a
/// client's path: the path names it twice and each joins with keys of its own. Named twice
/// with one of them on the path, the session fails: the second is missing.
#[test]
fn a_name_twice_in_the_path_is_two_middleboxes() {
    let s = Setup::new();
    for version in VERSIONS {
        let mut path = Path::new(vec![
            path_client(&s, version, &["mb1.test", "mb1.test"]),
            client_mb(&s, "mb1.test"),
            client_mb(&s, "mb1.test"),
            Node::LegacyServer(s.legacy_server(version)),
        ]);
        path.first().write(REQUEST);
        path.pump();
        path.assert_no_errors();
        assert_eq!(
            path.last().read(),
            b"GET / HTTP/1.1\r\nHost: server.test\r\nX-Mbtls: mb1.test\r\nX-Mbtls: mb1.test\r\n\r\n",
            "{version:?}"
        );
        let Node::Client(c) = path.first() else {
            unreachable!()
        };
        let sum = c.summary().unwrap().clone();
        assert_eq!(sum.middleboxes, ["mb1.test", "mb1.test"], "{version:?}");
        assert!(sum.hops[0] != sum.hops[1] && sum.hops[1] != sum.hops[2]);

        let mut path = Path::new(vec![
            path_client(&s, version, &["mb1.test", "mb1.test"]),
            client_mb(&s, "mb1.test"),
            Node::LegacyServer(s.legacy_server(version)),
        ]);
        path.first().write(REQUEST);
        path.pump();
        let said = path.errors[0].clone().unwrap_or_default();
        assert!(
            said.contains("middlebox mb1.test: a pre-configured middlebox did not join (1 of the 2 configured on this side did)"),
            "{version:?}: {said}"
        );
    }
}

/// A path in the wrong order, or missing a middlebox, shows as a certificate for another name:
/// the error says to check the path as well as the certificate (found in an embedder's trial,
/// where "not valid for the name mb1.test (it is for mb2.test)" blamed a middlebox that was
/// fine).
#[test]
fn a_wrong_path_is_said_to_be_a_possible_cause() {
    // The path is mb1 then mb0: swapped, and missing mb0.
    let cases = [&["mb0.test", "mb1.test"][..], &["mb1.test"][..]];
    for (s, names) in Setup::both().iter().flat_map(|s| cases.map(|c| (s, c))) {
        let mut path = Path::new(vec![
            path_client(s, TlsVersion::Tls13, names),
            client_mb(s, "mb1.test"),
            client_mb(s, "mb0.test"),
            Node::LegacyServer(s.legacy_server(TlsVersion::Tls13)),
        ]);
        path.first().write(REQUEST);
        path.pump();
        let said = path.errors[0].clone().unwrap_or_default();
        assert!(
            said.contains("not valid for")
                && said.contains("check its certificate, and that the path names every middlebox on this side, in order"),
            "{} {names:?}: {said}",
            s.secondary_engine
        );
    }
}
