//! An in-memory chain: client endpoint → middleboxes → server endpoint, keys generated per hop
//! as the endpoints would (client side, bridge, server side), with a tap on every link.

#![allow(dead_code, clippy::large_enum_variant)]

use mbx_apps::MiddleboxApp;
use mbx_engine::Role;
use mbx_mbtls::{
    client_side_keys, server_side_keys, EndpointDataPhase, HopKeys, MiddleboxRelay, Side,
};
use mbx_record::{CipherSuite, TlsVersion};

pub type App = Box<dyn MiddleboxApp>;

pub enum Node {
    End(EndpointDataPhase),
    Mbox(MiddleboxRelay<App>),
}

impl Node {
    pub fn take_out(&mut self, to: Side) -> Vec<u8> {
        match self {
            Node::End(e) => match (e.role(), to) {
                (Role::Client, Side::Server) | (Role::Server, Side::Client) => e.take_outgoing(),
                _ => Vec::new(),
            },
            Node::Mbox(m) => m.take_outgoing(to),
        }
    }

    pub fn receive(&mut self, from: Side, bytes: &[u8]) {
        match self {
            Node::End(e) => e.receive(bytes),
            Node::Mbox(m) => m.receive(from, bytes),
        }
    }

    /// The copy-free form: records are opened inside `bytes`.
    pub fn receive_in_place(&mut self, from: Side, bytes: &mut [u8]) {
        match self {
            Node::End(e) => e.receive_in_place(bytes),
            Node::Mbox(m) => m.receive_in_place(from, bytes),
        }
    }

    pub fn mbox(&mut self) -> &mut MiddleboxRelay<App> {
        match self {
            Node::Mbox(m) => m,
            Node::End(_) => panic!("not a middlebox"),
        }
    }

    pub fn end(&mut self) -> &mut EndpointDataPhase {
        match self {
            Node::End(e) => e,
            Node::Mbox(_) => panic!("not an endpoint"),
        }
    }
}

pub struct Chain {
    /// Path order: client, middleboxes, server.
    pub nodes: Vec<Node>,
    /// Per link i (between node i and i+1): ciphertext seen client→server and server→client.
    pub tap_c2s: Vec<Vec<u8>>,
    pub tap_s2c: Vec<Vec<u8>>,
    /// Sizes to split deliveries into (cycled); empty = deliver whole.
    pub chunking: Vec<usize>,
    /// Deliver with `receive_in_place` (lending the buffer) instead of `receive`.
    pub in_place: bool,
    /// With `in_place`: deliver to middleboxes with `receive_lending`, and send the range it
    /// returns after the middlebox's queued output, as a driver does.
    pub lending: bool,
    /// Per node, output a lent buffer put behind what was queued, per side (client, server).
    held: Vec<[Vec<u8>; 2]>,
    /// With `in_place`: bytes that must not be found in a lent buffer after it was used (a
    /// plaintext marker: no plaintext may be left behind).
    pub marker: Option<Vec<u8>>,
    /// After every delivery to a middlebox, let it give its idle buffers back (as a driver's
    /// idle trim may at any point between reads).
    pub release_idle: bool,
}

impl Chain {
    /// `client_apps` / `server_apps`: the middleboxes on each side, in path order.
    pub fn new(
        version: TlsVersion,
        suite: CipherSuite,
        client_apps: Vec<App>,
        server_apps: Vec<App>,
    ) -> Chain {
        // The bridge stands in for the primary session's exported keys, at arbitrary positions.
        Chain::with_bridge_at(version, suite, client_apps, server_apps, 3, 5)
    }

    /// Like [`new`](Self::new), with the bridge's next sequence numbers client→server and
    /// server→client given.
    pub fn with_bridge_at(
        version: TlsVersion,
        suite: CipherSuite,
        client_apps: Vec<App>,
        server_apps: Vec<App>,
        c2s_seq: u64,
        s2c_seq: u64,
    ) -> Chain {
        let bridge = HopKeys::generate(version, &suite, c2s_seq, s2c_seq).unwrap();
        let cs = client_side_keys(version, suite, bridge.clone(), client_apps.len()).unwrap();
        let ss = server_side_keys(version, suite, bridge, server_apps.len()).unwrap();
        let mut nodes = vec![Node::End(EndpointDataPhase::new(
            Role::Client,
            version,
            cs.endpoint,
        ))];
        for (km, app) in cs
            .middleboxes
            .into_iter()
            .chain(ss.middleboxes)
            .zip(client_apps.into_iter().chain(server_apps))
        {
            // Every middlebox gets its keys through the wire encoding, as it would on the net.
            let wire = km.encode().unwrap();
            let km = mbx_mbtls::KeyMaterial::decode(&wire).unwrap();
            nodes.push(Node::Mbox(MiddleboxRelay::new(km, app).unwrap()));
        }
        nodes.push(Node::End(EndpointDataPhase::new(
            Role::Server,
            version,
            ss.endpoint,
        )));
        let links = nodes.len() - 1;
        Chain {
            nodes,
            tap_c2s: vec![Vec::new(); links],
            tap_s2c: vec![Vec::new(); links],
            chunking: Vec::new(),
            in_place: false,
            lending: false,
            held: vec![[Vec::new(), Vec::new()]; links + 1],
            marker: None,
            release_idle: false,
        }
    }

    pub fn client(&mut self) -> &mut EndpointDataPhase {
        self.nodes.first_mut().unwrap().end()
    }

    pub fn server(&mut self) -> &mut EndpointDataPhase {
        self.nodes.last_mut().unwrap().end()
    }

    pub fn mbox(&mut self, i: usize) -> &mut MiddleboxRelay<App> {
        self.nodes[i + 1].mbox()
    }

    fn deliver(&mut self, node: usize, from: Side, bytes: &[u8]) {
        if self.chunking.is_empty() {
            self.deliver_one(node, from, bytes);
            return;
        }
        let mut rest = bytes;
        let mut sizes = self.chunking.clone().into_iter().cycle();
        while !rest.is_empty() {
            let n = sizes.next().unwrap().max(1).min(rest.len());
            self.deliver_one(node, from, &rest[..n]);
            rest = &rest[n..];
        }
    }

    fn deliver_one(&mut self, node: usize, from: Side, bytes: &[u8]) {
        self.deliver_bytes(node, from, bytes);
        if self.release_idle {
            if let Node::Mbox(m) = &mut self.nodes[node] {
                m.release_idle_buffers();
            }
        }
    }

    fn deliver_bytes(&mut self, node: usize, from: Side, bytes: &[u8]) {
        if !self.in_place {
            self.nodes[node].receive(from, bytes);
            return;
        }
        let mut lent = bytes.to_vec();
        match &mut self.nodes[node] {
            Node::Mbox(m) if self.lending => {
                if let Some(range) = m.receive_lending(from, &mut lent) {
                    let to = from.other();
                    let held = &mut self.held[node][usize::from(to == Side::Server)];
                    held.extend_from_slice(&m.take_outgoing(to));
                    held.extend_from_slice(&lent[range]);
                }
            }
            n => n.receive_in_place(from, &mut lent),
        }
        if let Some(m) = &self.marker {
            assert!(
                !lent.windows(m.len()).any(|w| w == &m[..]),
                "plaintext left in a lent buffer"
            );
        }
    }

    /// What node `i` sends toward `to`: output held behind a lent buffer first.
    fn take_out(&mut self, i: usize, to: Side) -> Vec<u8> {
        let mut out = std::mem::take(&mut self.held[i][usize::from(to == Side::Server)]);
        out.extend_from_slice(&self.nodes[i].take_out(to));
        out
    }

    /// Move bytes along every link until nothing moves.
    pub fn pump(&mut self) {
        loop {
            let mut moved = false;
            for i in 0..self.nodes.len() - 1 {
                let fwd = self.take_out(i, Side::Server);
                if !fwd.is_empty() {
                    moved = true;
                    self.tap_c2s[i].extend_from_slice(&fwd);
                    self.deliver(i + 1, Side::Client, &fwd);
                }
                let back = self.take_out(i + 1, Side::Client);
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
}

/// One middlebox's relay running `app` under fresh TLS 1.3 key material (AES-128-GCM), decoded
/// from its wire encoding as a middlebox receives it; with the client side's keys (the client's
/// hop is `.endpoint`) and the key material.
pub fn lone_relay(
    app: App,
) -> (
    MiddleboxRelay<App>,
    mbx_mbtls::SideKeys,
    mbx_mbtls::KeyMaterial,
) {
    let (v, s) = (TlsVersion::Tls13, CipherSuite::TLS13_AES_128_GCM_SHA256);
    let bridge = HopKeys::generate(v, &s, 0, 0).unwrap();
    let keys = client_side_keys(v, s, bridge, 1).unwrap();
    let km = mbx_mbtls::KeyMaterial::decode(&keys.middleboxes[0].encode().unwrap()).unwrap();
    (MiddleboxRelay::new(km.clone(), app).unwrap(), keys, km)
}

/// Runs `step` for 1, 2, … `limit` until one fails: which one, and its error.
pub fn first_failure<E>(
    limit: usize,
    mut step: impl FnMut(usize) -> Result<(), E>,
) -> Option<(usize, E)> {
    (1..=limit).find_map(|i| step(i).err().map(|e| (i, e)))
}

/// Sends one MiB after another through `send_mib` until it fails, which must happen once
/// `MAX_COPIED_BYTES` (what is kept before keys) is passed and not before (records add a
/// little): the error it failed with.
pub fn refused_past_the_bound<E: std::fmt::Debug>(
    mut send_mib: impl FnMut(&[u8]) -> Result<(), E>,
) -> E {
    let chunk = vec![b'x'; 1 << 20];
    let bound = mbx_mbtls::handshake::MAX_COPIED_BYTES / chunk.len();
    let (sent, e) = first_failure(bound + 2, |_| send_mib(&chunk)).expect("everything kept");
    assert!(
        (bound..=bound + 1).contains(&sent),
        "refused after {sent} MiB: {e:?}"
    );
    e
}

/// The records of `stream` (whole records) that are not mbTLS-encapsulated (type 30).
pub fn primary_only(stream: &[u8]) -> Vec<u8> {
    records(stream)
        .into_iter()
        .filter(|r| r[0] != 30)
        .flatten()
        .collect()
}

/// Split a captured link stream into whole records.
pub fn records(stream: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut rest = stream;
    while rest.len() >= 5 {
        let len = 5 + usize::from(u16::from_be_bytes([rest[3], rest[4]]));
        out.push(rest[..len].to_vec());
        rest = &rest[len..];
    }
    assert!(rest.is_empty(), "partial record in capture");
    out
}

pub const SUITES: &[(TlsVersion, CipherSuite)] = &[
    (TlsVersion::Tls13, CipherSuite::TLS13_AES_128_GCM_SHA256),
    (TlsVersion::Tls13, CipherSuite::TLS13_AES_256_GCM_SHA384),
    (
        TlsVersion::Tls13,
        CipherSuite::TLS13_CHACHA20_POLY1305_SHA256,
    ),
    (
        TlsVersion::Tls12,
        CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
    ),
    (
        TlsVersion::Tls12,
        CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
    ),
    (
        TlsVersion::Tls12,
        CipherSuite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
    ),
];
