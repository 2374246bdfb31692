//! The BlindBox middlebox between two hops, sans-I/O.
//!
//! 1. Forwards the primary handshake unchanged, keeping a copy (detection state is per flow and
//!    counts stream offsets from the first byte).
//! 2. With both endpoints' `HandshakeDone` (and their token-channel parameters, which must
//!    agree), runs the rule setup of `mbx-blindbox-setup` with them over the setup streams: the
//!    client garbles full circuits, the server sends transcript digests. The middlebox obtains
//!    `AES_k(r)` for each signed rule chunk only as the output of the garbled circuits, after
//!    the label, transcript and evaluation checks.
//! 3. Builds one [`MiddleboxFlow`] per direction, replays the handshake bytes into them and
//!    answers `Ready` to both endpoints. From then on every primary record and token frame
//!    passes through detection before it is forwarded; a blocking rule stops the flow (nothing
//!    more is forwarded in that direction and the driver closes the connection).
//!
//! Any failure (a check of the setup, an endpoint that aborts or closes, endpoints that
//! disagree on the parameters, a chunk whose RG tag does not verify) refuses the connection:
//! both endpoints get `Refused` with the reason.
//!
//! The expensive part of the setup (transcript hashing and evaluation of the garbled
//! circuits) runs inside [`Middlebox::receive`]; drivers call it off their I/O threads.

use std::sync::Arc;

use mbx_blindbox::flow::{MbEvent, MiddleboxFlow};
use mbx_blindbox_setup::{Peer as SetupPeer, Progress};
use rand::rngs::StdRng;
use rand::{CryptoRng, RngCore, SeedableRng};
use zeroize::Zeroizing;

use crate::control::{Control, Params};
use crate::mux::{encode, Demux, Stream};
use crate::rules::RuleBook;
use crate::NetError;

/// Handshake bytes kept per direction before the rules arrive.
pub const MAX_HANDSHAKE: usize = 256 * 1024;

/// Which way data travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    ToServer,
    ToClient,
}

/// Progress and detection reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MiddleboxEvent {
    /// Both endpoints finished their handshake and agree on `params`: the rule setup for
    /// `chunks` rule chunks starts.
    SetupStarted { params: Params, chunks: usize },
    /// Every check of the setup passed; `progress` counts its circuits and bytes.
    SetupDone { progress: Progress },
    /// Rules installed, `Ready` sent.
    Ready,
    /// The connection was refused (both endpoints were told why).
    Refused(String),
    /// A detection report of one direction.
    Detection(Flow, MbEvent),
}

/// Which neighbour bytes come from or go to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    Client,
    Server,
}

impl Peer {
    fn name(self) -> &'static str {
        match self {
            Peer::Client => "client",
            Peer::Server => "server",
        }
    }

    /// The client garbles full circuits, the server sends digests.
    fn setup_peer(self) -> SetupPeer {
        match self {
            Peer::Client => SetupPeer::Full,
            Peer::Server => SetupPeer::Hash,
        }
    }
}

/// The running setup and what it produces the rules for.
struct Setup {
    machine: mbx_blindbox_setup::Middlebox,
    params: Params,
}

/// The middlebox of one BlindBox connection.
pub struct Middlebox {
    book: Arc<RuleBook>,
    seed: Zeroizing<[u8; 32]>,
    from_client: Demux,
    from_server: Demux,
    out_client: Vec<u8>,
    out_server: Vec<u8>,
    /// Primary bytes forwarded before the rules: to server, to client.
    handshake: [Vec<u8>; 2],
    done: [Option<Params>; 2],
    setup: Option<Setup>,
    started: bool,
    flows: Option<[MiddleboxFlow; 2]>,
    events: Vec<MiddleboxEvent>,
    failed: Option<NetError>,
}

impl Middlebox {
    /// A middlebox for one connection with `book`'s rules; `rng` seeds the setup's OT.
    pub fn new<R: RngCore + CryptoRng>(book: Arc<RuleBook>, rng: &mut R) -> Self {
        let mut seed = Zeroizing::new([0u8; 32]);
        rng.fill_bytes(seed.as_mut());
        Middlebox {
            book,
            seed,
            from_client: Demux::new(),
            from_server: Demux::new(),
            out_client: Vec::new(),
            out_server: Vec::new(),
            handshake: [Vec::new(), Vec::new()],
            done: [None, None],
            setup: None,
            started: false,
            flows: None,
            events: Vec::new(),
            failed: None,
        }
    }

    /// Bytes from one neighbour. An error is fatal for the connection; when it comes from the
    /// setup or the endpoints, `Refused` is already queued for both endpoints.
    pub fn receive(&mut self, from: Peer, bytes: &[u8]) -> Result<(), NetError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        match from {
            Peer::Client => self.from_client.push(bytes),
            Peer::Server => self.from_server.push(bytes),
        }
        let r = self.drain(from).and_then(|()| self.pump());
        self.check(r)
    }

    fn check(&mut self, r: Result<(), NetError>) -> Result<(), NetError> {
        if let Err(e) = &r {
            if self.failed.is_none() {
                // Tell both endpoints unless the refusal was already sent.
                let why = match e {
                    NetError::Refused(w) => w.clone(),
                    other => other.to_string(),
                };
                self.refuse(&why);
            }
        }
        r
    }

    fn drain(&mut self, from: Peer) -> Result<(), NetError> {
        loop {
            let next = match from {
                Peer::Client => self.from_client.next_frame()?,
                Peer::Server => self.from_server.next_frame()?,
            };
            let Some((stream, data)) = next else {
                return Ok(());
            };
            let (idx, flow) = match from {
                Peer::Client => (0, Flow::ToServer),
                Peer::Server => (1, Flow::ToClient),
            };
            match stream {
                Stream::Control => match Control::decode(&data)? {
                    Control::HandshakeDone(p) => {
                        let slot = self
                            .done
                            .get_mut(idx)
                            .ok_or(NetError::Protocol("no direction"))?;
                        if slot.is_some() {
                            return Err(NetError::Protocol("second HandshakeDone"));
                        }
                        *slot = Some(p);
                        if let [Some(a), Some(b)] = self.done {
                            self.start_setup(a, b)?;
                        }
                    }
                    Control::Abort(why) => {
                        return Err(NetError::Refused(format!(
                            "rule setup failed: the {} aborted: {why}",
                            from.name()
                        )))
                    }
                    _ => return Err(NetError::Protocol("unexpected control message")),
                },
                Stream::Setup => {
                    let setup = self
                        .setup
                        .as_mut()
                        .ok_or(NetError::Protocol("setup stream outside the rule setup"))?;
                    setup
                        .machine
                        .receive(from.setup_peer(), &data)
                        .map_err(|e| NetError::Refused(format!("rule setup failed: {e}")))?;
                }
                Stream::Primary | Stream::Tokens => {
                    let out = match from {
                        Peer::Client => &mut self.out_server,
                        Peer::Server => &mut self.out_client,
                    };
                    match self.flows.as_mut() {
                        Some(flows) => {
                            let f = flows.get_mut(idx).ok_or(NetError::Protocol("no flow"))?;
                            let mut fwd = Vec::new();
                            let mut evs = Vec::new();
                            if stream == Stream::Primary {
                                f.primary_in(&data, &mut fwd, &mut evs)?;
                            } else {
                                f.token_in(&data, &mut fwd, &mut evs)?;
                            }
                            encode(stream, &fwd, out);
                            self.events.extend(
                                evs.into_iter().map(|e| MiddleboxEvent::Detection(flow, e)),
                            );
                        }
                        None if stream == Stream::Primary && !self.started => {
                            let kept = self
                                .handshake
                                .get_mut(idx)
                                .ok_or(NetError::Protocol("no direction"))?;
                            kept.extend_from_slice(&data);
                            if kept.len() > MAX_HANDSHAKE {
                                return Err(NetError::Protocol("handshake too long"));
                            }
                            encode(stream, &data, out);
                        }
                        None => {
                            return Err(NetError::Protocol(
                                "primary or token data before the middlebox was ready",
                            ))
                        }
                    }
                }
            }
        }
    }

    fn start_setup(&mut self, a: Params, b: Params) -> Result<(), NetError> {
        if a != b {
            return Err(NetError::Refused(format!(
                "the endpoints disagree on the token channel (client: {a}; server: {b})"
            )));
        }
        let prepared = self.book.prepared(a.tokenization);
        let mut rng = StdRng::from_seed(*self.seed);
        let machine = mbx_blindbox_setup::Middlebox::new(
            prepared.chunks.clone(),
            self.book.setup.clone(),
            &mut rng,
        )
        .map_err(|e| NetError::Refused(format!("rule setup failed: {e}")))?;
        self.events.push(MiddleboxEvent::SetupStarted {
            params: a,
            chunks: prepared.chunks.len(),
        });
        self.setup = Some(Setup { machine, params: a });
        self.started = true;
        Ok(())
    }

    /// Moves the setup forward (evaluating complete batches), queues its frames, and installs
    /// the rules once it finished.
    fn pump(&mut self) -> Result<(), NetError> {
        let Some(setup) = self.setup.as_mut() else {
            return Ok(());
        };
        let fail = |e: mbx_blindbox_setup::SetupError| {
            NetError::Refused(format!("rule setup failed: {e}"))
        };
        for (peer, out) in [
            (Peer::Client, &mut self.out_client),
            (Peer::Server, &mut self.out_server),
        ] {
            while let Some(frame) = setup
                .machine
                .poll_transmit(peer.setup_peer())
                .map_err(fail)?
            {
                encode(Stream::Setup, &frame, out);
            }
        }
        if !setup.machine.is_done() {
            return Ok(());
        }
        let Some(setup) = self.setup.take() else {
            return Ok(());
        };
        let progress = setup.machine.progress();
        let outcome = setup.machine.finish().map_err(fail)?;
        let plan = self.book.prepared(setup.params.tokenization).plan.clone();
        let rules = Arc::new(outcome.into_encrypted_rules(plan).map_err(fail)?);
        self.events.push(MiddleboxEvent::SetupDone { progress });
        let full = self.book.full();
        let mut flows = [
            MiddleboxFlow::new(rules.clone(), full.clone()),
            MiddleboxFlow::new(rules, full),
        ];
        for (f, kept) in flows.iter_mut().zip(&mut self.handshake) {
            // Already forwarded: only the offsets and any state of the handshake matter here.
            let mut sink = Vec::new();
            let mut evs = Vec::new();
            f.primary_in(kept, &mut sink, &mut evs)?;
            kept.clear();
        }
        self.flows = Some(flows);
        let ready = Control::Ready.encode();
        encode(Stream::Control, &ready, &mut self.out_client);
        encode(Stream::Control, &ready, &mut self.out_server);
        self.events.push(MiddleboxEvent::Ready);
        Ok(())
    }

    /// Refuses the connection: both endpoints are told why.
    pub fn refuse(&mut self, why: &str) {
        if self.failed.is_some() {
            return;
        }
        self.setup = None;
        let msg = Control::Refused(why.to_string()).encode();
        encode(Stream::Control, &msg, &mut self.out_client);
        encode(Stream::Control, &msg, &mut self.out_server);
        self.events.push(MiddleboxEvent::Refused(why.to_string()));
        self.failed = Some(NetError::Refused(why.to_string()));
    }

    /// One side's connection ended: flush that direction's detection. Before the data phase
    /// this refuses the connection.
    pub fn peer_ended(&mut self, from: Peer) -> Result<(), NetError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let (idx, flow) = match from {
            Peer::Client => (0, Flow::ToServer),
            Peer::Server => (1, Flow::ToClient),
        };
        match self.flows.as_mut().and_then(|f| f.get_mut(idx)) {
            Some(f) => {
                let mut evs = Vec::new();
                f.finish(&mut evs);
                self.events
                    .extend(evs.into_iter().map(|e| MiddleboxEvent::Detection(flow, e)));
                Ok(())
            }
            None => {
                let r = Err(NetError::Refused(format!(
                    "the {} closed the connection before the rule setup finished",
                    from.name()
                )));
                self.check(r)
            }
        }
    }

    /// True once a blocking rule stopped the direction.
    pub fn blocked(&self, flow: Flow) -> bool {
        let idx = usize::from(flow == Flow::ToClient);
        self.flows
            .as_ref()
            .and_then(|f| f.get(idx))
            .is_some_and(MiddleboxFlow::blocked)
    }

    /// True once data flows.
    pub fn is_ready(&self) -> bool {
        self.flows.is_some()
    }

    /// The setup's progress while it runs.
    pub fn setup_progress(&self) -> Option<Progress> {
        self.setup.as_ref().map(|s| s.machine.progress())
    }

    pub fn take_outgoing(&mut self, to: Peer) -> Vec<u8> {
        match to {
            Peer::Client => core::mem::take(&mut self.out_client),
            Peer::Server => core::mem::take(&mut self.out_server),
        }
    }

    pub fn poll_event(&mut self) -> Option<MiddleboxEvent> {
        (!self.events.is_empty()).then(|| self.events.remove(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::Policy;
    use mbx_blindbox::channel::Privacy;
    use mbx_blindbox::rules::BufferPolicy;
    use mbx_blindbox::tokenize::{CaseMode, Tokenization};
    use mbx_blindbox_setup::{MiddleboxConfig, RgKey, TaggedRules};

    fn book() -> Arc<RuleBook> {
        let rules = "alert tcp any any -> any any (msg:\"m\"; content:\"unit-keyword\"; sid:1;)\n";
        let tagged = TaggedRules::sign(rules, false, &RgKey::from_bytes([1; 16]));
        let cfg = MiddleboxConfig {
            batch: 2,
            window: 1,
            workers: 1,
        };
        Arc::new(RuleBook::new(&tagged, BufferPolicy::Approximate, Policy::Block, cfg).unwrap())
    }

    fn hello(p: Params) -> Vec<u8> {
        let mut v = Vec::new();
        encode(Stream::Control, &Control::HandshakeDone(p).encode(), &mut v);
        v
    }

    const PARAMS: Params = Params {
        tokenization: Tokenization::Window,
        case: CaseMode::Exact,
        privacy: Privacy::ExactMatch,
    };

    #[test]
    fn setup_starts_with_both_handshakes_and_garbage_refuses_without_panicking() {
        let mut rng = StdRng::seed_from_u64(1);
        let mut state = 0x1234_5678_u64;
        for round in 0..200 {
            let mut mb = Middlebox::new(book(), &mut rng);
            mb.receive(Peer::Client, &hello(PARAMS)).unwrap();
            mb.receive(Peer::Server, &hello(PARAMS)).unwrap();
            assert!(matches!(
                mb.poll_event(),
                Some(MiddleboxEvent::SetupStarted { chunks, .. }) if chunks > 0
            ));
            // The announcements went out on the setup stream to both endpoints.
            for peer in [Peer::Client, Peer::Server] {
                let mut d = Demux::new();
                d.push(&mb.take_outgoing(peer));
                assert!(matches!(d.next_frame(), Ok(Some((Stream::Setup, _)))));
            }
            // Arbitrary setup bytes (framed or not) from one side.
            let len = 1 + round % 300;
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    state = state.wrapping_mul(6364136223846793005).wrapping_add(1);
                    (state >> 56) as u8
                })
                .collect();
            let mut framed = Vec::new();
            encode(Stream::Setup, &bytes, &mut framed);
            let input = if round % 2 == 0 { &framed } else { &bytes };
            let from = if round % 3 == 0 {
                Peer::Server
            } else {
                Peer::Client
            };
            if mb.receive(from, input).is_err() {
                // A refusal goes to both endpoints.
                for peer in [Peer::Client, Peer::Server] {
                    let out = mb.take_outgoing(peer);
                    let mut d = Demux::new();
                    d.push(&out);
                    let mut refused = false;
                    while let Ok(Some((s, body))) = d.next_frame() {
                        refused |= s == Stream::Control
                            && matches!(Control::decode(&body), Ok(Control::Refused(_)));
                    }
                    assert!(refused, "round {round}");
                }
                assert!(mb.receive(from, b"x").is_err(), "errors are sticky");
            }
        }
    }

    #[test]
    fn disagreeing_endpoints_and_early_data_are_refused() {
        let mut rng = StdRng::seed_from_u64(2);
        let mut mb = Middlebox::new(book(), &mut rng);
        mb.receive(Peer::Client, &hello(PARAMS)).unwrap();
        let other = Params {
            tokenization: Tokenization::Delimiter,
            ..PARAMS
        };
        assert!(matches!(
            mb.receive(Peer::Server, &hello(other)),
            Err(NetError::Refused(why)) if why.contains("disagree")
        ));
        let mut mb = Middlebox::new(book(), &mut rng);
        mb.receive(Peer::Client, &hello(PARAMS)).unwrap();
        mb.receive(Peer::Server, &hello(PARAMS)).unwrap();
        let mut tokens = Vec::new();
        encode(Stream::Tokens, b"early", &mut tokens);
        assert!(mb.receive(Peer::Client, &tokens).is_err());
        // An endpoint that ends during the setup refuses the connection.
        let mut mb = Middlebox::new(book(), &mut rng);
        mb.receive(Peer::Client, &hello(PARAMS)).unwrap();
        assert!(matches!(
            mb.peer_ended(Peer::Server),
            Err(NetError::Refused(why)) if why.contains("server closed")
        ));
    }
}
