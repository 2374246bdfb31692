//! The BlindBox middlebox between two hops, sans-I/O.
//!
//! Forwards the primary handshake unchanged (keeping a copy: detection state is per flow and
//! counts stream offsets from the first byte), waits for both endpoints' `HandshakeDone`, asks
//! for its encrypted rules ([`MiddleboxEvent::NeedRules`]), then builds one
//! [`MiddleboxFlow`] per direction, replays the handshake bytes into them and answers `Ready`
//! to both endpoints. From then on every primary record and token frame passes through
//! detection before it is forwarded; a blocking rule stops the flow (nothing more is
//! forwarded in that direction and the driver closes the connection).

use std::sync::Arc;

use mbx_blindbox::detect::EncryptedRules;
use mbx_blindbox::flow::{MbEvent, MiddleboxFlow};
use mbx_blindbox::fullrule::FullRuleSet;

use crate::control::Control;
use crate::mux::{encode, Demux, Stream};
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
    /// Both endpoints finished their handshake: install the encrypted rules now.
    NeedRules,
    /// Rules installed, `Ready` sent.
    Ready,
    /// A detection report of one direction.
    Detection(Flow, MbEvent),
}

/// Which neighbour bytes come from or go to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    Client,
    Server,
}

/// The middlebox of one BlindBox connection.
pub struct Middlebox {
    from_client: Demux,
    from_server: Demux,
    out_client: Vec<u8>,
    out_server: Vec<u8>,
    /// Primary bytes forwarded before the rules: to server, to client.
    handshake: [Vec<u8>; 2],
    done: [bool; 2],
    asked: bool,
    flows: Option<[MiddleboxFlow; 2]>,
    events: Vec<MiddleboxEvent>,
    failed: Option<NetError>,
}

impl Default for Middlebox {
    fn default() -> Self {
        Self::new()
    }
}

impl Middlebox {
    pub fn new() -> Self {
        Middlebox {
            from_client: Demux::new(),
            from_server: Demux::new(),
            out_client: Vec::new(),
            out_server: Vec::new(),
            handshake: [Vec::new(), Vec::new()],
            done: [false, false],
            asked: false,
            flows: None,
            events: Vec::new(),
            failed: None,
        }
    }

    /// Bytes from one neighbour. An error is fatal for the connection.
    pub fn receive(&mut self, from: Peer, bytes: &[u8]) -> Result<(), NetError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        match from {
            Peer::Client => self.from_client.push(bytes),
            Peer::Server => self.from_server.push(bytes),
        }
        let r = self.drain(from);
        if let Err(e) = &r {
            self.failed = Some(e.clone());
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
            let (idx, flow, out) = match from {
                Peer::Client => (0, Flow::ToServer, &mut self.out_server),
                Peer::Server => (1, Flow::ToClient, &mut self.out_client),
            };
            match stream {
                Stream::Control => match Control::decode(&data)? {
                    Control::HandshakeDone => {
                        if let Some(d) = self.done.get_mut(idx) {
                            *d = true;
                        }
                        if self.done == [true, true] && !self.asked {
                            self.asked = true;
                            self.events.push(MiddleboxEvent::NeedRules);
                        }
                    }
                    _ => return Err(NetError::Protocol("unexpected control message")),
                },
                Stream::Primary | Stream::Tokens => match self.flows.as_mut() {
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
                        self.events
                            .extend(evs.into_iter().map(|e| MiddleboxEvent::Detection(flow, e)));
                    }
                    None if stream == Stream::Primary => {
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
                            "token channel before the middlebox was ready",
                        ))
                    }
                },
            }
        }
    }

    /// The encrypted rules for this connection (from the rule setup): detection starts, both
    /// endpoints are told `Ready`.
    pub fn install_rules(
        &mut self,
        rules: Arc<EncryptedRules>,
        full: Arc<FullRuleSet>,
    ) -> Result<(), NetError> {
        if self.flows.is_some() || !self.asked {
            return Err(NetError::Protocol("rules installed at the wrong time"));
        }
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

    /// Refuses the connection (e.g. the rule setup failed): both endpoints are told why.
    pub fn refuse(&mut self, why: &str) {
        let msg = Control::Refused(why.to_string()).encode();
        encode(Stream::Control, &msg, &mut self.out_client);
        encode(Stream::Control, &msg, &mut self.out_server);
        self.failed = Some(NetError::Refused(why.to_string()));
    }

    /// One side's connection ended: flush that direction's detection.
    pub fn peer_ended(&mut self, from: Peer) {
        let (idx, flow) = match from {
            Peer::Client => (0, Flow::ToServer),
            Peer::Server => (1, Flow::ToClient),
        };
        if let Some(f) = self.flows.as_mut().and_then(|f| f.get_mut(idx)) {
            let mut evs = Vec::new();
            f.finish(&mut evs);
            self.events
                .extend(evs.into_iter().map(|e| MiddleboxEvent::Detection(flow, e)));
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
