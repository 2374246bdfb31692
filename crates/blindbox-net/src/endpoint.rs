//! A BlindBox endpoint (client or server) over the hop wire, sans-I/O.
//!
//! 1. The primary TLS handshake runs in a rustls engine on stream 0 (the middlebox forwards it).
//! 2. Both endpoints derive the BlindBox keys from the session's exporter (the token keys, and
//!    `k`, `k_rand` for the rule setup), export the session, and tell the middlebox
//!    (`HandshakeDone` with the token-channel parameters on the control stream). The middlebox
//!    runs the rule setup of `mbx-blindbox-setup` with both endpoints over the setup stream:
//!    this endpoint garbles the circuits that give the middlebox `AES_k(r)` for each rule chunk
//!    the rule generator tagged (checked inside the circuit with `k_RG`), and answers the
//!    middlebox's oblivious transfers. When the middlebox reports the setup finished, it
//!    answers `Ready`.
//! 3. Data phase: what the application writes is sealed on stream 0 and tokenized and encrypted
//!    on stream 1 ([`FlowSender`]); what arrives is decrypted and validated against its tokens
//!    ([`FlowReceiver`]): a sender that omits or forges tokens, or a path that alters them, is a
//!    fatal error naming the culprit. Nothing is written before `Ready`.

use mbx_blindbox::flow::{FlowConfig, FlowOutput, FlowReceiver, FlowSender, PrimaryKeys};
use mbx_blindbox::rules::Direction;
use mbx_blindbox::SessionKeys;
use mbx_blindbox_setup::{EndpointConfig, EndpointKeys, Progress, RgKey};
use mbx_engine::{Role, RustlsEngine, TlsConfig, TlsEngine};
use rand::{CryptoRng, RngCore};
use zeroize::Zeroizing;

use crate::control::{Control, Params};
use crate::mux::{encode, Demux, Stream};
use crate::NetError;

/// Bytes of the peer's data phase buffered while we still wait for `Ready`.
pub const MAX_EARLY: usize = 16 * 1024 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Handshake,
    AwaitReady,
    Data,
}

/// Progress reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EndpointEvent {
    /// The primary handshake is done and the BlindBox keys are derived.
    HandshakeDone,
    /// The middlebox has its detection state: data flows. `setup` counts the rule setup's
    /// circuits and this endpoint's bytes.
    Ready { setup: Progress },
}

/// An endpoint's side of the rule setup: the rule generator's key (to check the rule chunks'
/// tags inside the circuits) and the garbling limits.
#[derive(Clone, Debug)]
pub struct SetupConfig {
    pub rg_key: RgKey,
    pub endpoint: EndpointConfig,
}

impl SetupConfig {
    pub fn new(rg_key: RgKey) -> Self {
        SetupConfig {
            rg_key,
            endpoint: EndpointConfig::default(),
        }
    }
}

/// One endpoint of a BlindBox connection.
pub struct Endpoint {
    role: Role,
    flow: FlowConfig,
    setup_cfg: Option<SetupConfig>,
    seed: Zeroizing<[u8; 32]>,
    setup: Option<mbx_blindbox_setup::Endpoint>,
    setup_progress: Progress,
    engine: Option<RustlsEngine>,
    state: State,
    demux: Demux,
    out: Vec<u8>,
    /// Primary-stream bytes sent and received during the handshake (start offsets).
    sent: u64,
    received: u64,
    keys: Option<SessionKeys>,
    tx: Option<PrimaryKeys>,
    rx: Option<PrimaryKeys>,
    sender: Option<FlowSender>,
    receiver: Option<FlowReceiver>,
    /// Peer data that arrived before our `Ready`: (stream, bytes), in order.
    early: Vec<(Stream, Vec<u8>)>,
    early_bytes: usize,
    pending_writes: Vec<u8>,
    finish_requested: bool,
    plaintext: Vec<u8>,
    events: Vec<EndpointEvent>,
    failed: Option<NetError>,
}

impl Endpoint {
    /// A client (the first flight is in [`take_outgoing`](Self::take_outgoing)) or a server,
    /// from the TLS configuration's role. `rng` seeds the setup's oblivious transfers.
    pub fn new<R: RngCore + CryptoRng>(
        tls: &TlsConfig,
        flow: FlowConfig,
        setup: SetupConfig,
        rng: &mut R,
    ) -> Result<Self, NetError> {
        let mut seed = Zeroizing::new([0u8; 32]);
        rng.fill_bytes(seed.as_mut());
        let mut engine = RustlsEngine::new(tls)?;
        let mut out = Vec::new();
        let mut sent = 0;
        if tls.role == Role::Client {
            engine.process()?;
            let hello = engine.take_outgoing();
            sent = hello.len() as u64;
            encode(Stream::Primary, &hello, &mut out);
        }
        Ok(Endpoint {
            role: tls.role,
            flow,
            setup_cfg: Some(setup),
            seed,
            setup: None,
            setup_progress: Progress::default(),
            engine: Some(engine),
            state: State::Handshake,
            demux: Demux::new(),
            out,
            sent,
            received: 0,
            keys: None,
            tx: None,
            rx: None,
            sender: None,
            receiver: None,
            early: Vec::new(),
            early_bytes: 0,
            pending_writes: Vec::new(),
            finish_requested: false,
            plaintext: Vec::new(),
            events: Vec::new(),
            failed: None,
        })
    }

    fn directions(&self) -> (Direction, Direction) {
        match self.role {
            Role::Client => (Direction::ToServer, Direction::ToClient),
            Role::Server => (Direction::ToClient, Direction::ToServer),
        }
    }

    /// Bytes from the middlebox. An error is fatal for the connection.
    pub fn receive(&mut self, bytes: &[u8]) -> Result<(), NetError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        self.demux.push(bytes);
        let r = self.drain();
        self.check(r)
    }

    /// Records a fatal error; a failure of our side of the setup is reported to the middlebox
    /// (`Abort`), so the other endpoint learns why the connection was refused.
    fn check<T>(&mut self, r: Result<T, NetError>) -> Result<T, NetError> {
        if let Err(e) = &r {
            if self.failed.is_none() {
                if let NetError::Setup(why) = e {
                    self.out.clear();
                    encode(
                        Stream::Control,
                        &Control::Abort(why.clone()).encode(),
                        &mut self.out,
                    );
                }
                self.failed = Some(e.clone());
                self.setup = None;
            }
        }
        r
    }

    fn drain(&mut self) -> Result<(), NetError> {
        while let Some((stream, data)) = self.demux.next_frame()? {
            match (self.state, stream) {
                (_, Stream::Control) => self.control(&data)?,
                (State::AwaitReady, Stream::Setup) => {
                    let setup = self
                        .setup
                        .as_mut()
                        .ok_or(NetError::Protocol("setup stream after the rule setup"))?;
                    setup
                        .receive(&data)
                        .map_err(|e| NetError::Setup(e.to_string()))?;
                }
                (_, Stream::Setup) => {
                    return Err(NetError::Protocol("setup stream outside the rule setup"))
                }
                (State::Handshake, Stream::Primary) => self.handshake(&data)?,
                (State::Handshake, Stream::Tokens) => {
                    return Err(NetError::Protocol(
                        "token channel before the handshake ended",
                    ))
                }
                (State::AwaitReady, s) => {
                    self.early_bytes += data.len();
                    if self.early_bytes > MAX_EARLY {
                        return Err(NetError::Protocol(
                            "too much data before the middlebox was ready",
                        ));
                    }
                    self.early.push((s, data));
                }
                (State::Data, s) => self.data_in(s, &data)?,
            }
        }
        Ok(())
    }

    fn handshake(&mut self, data: &[u8]) -> Result<(), NetError> {
        let engine = self
            .engine
            .as_mut()
            .ok_or(NetError::Protocol("no TLS engine"))?;
        self.received += data.len() as u64;
        engine.feed(data);
        engine.process()?;
        let flight = engine.take_outgoing();
        self.sent += flight.len() as u64;
        encode(Stream::Primary, &flight, &mut self.out);
        if engine.is_handshaking() {
            return Ok(());
        }
        let keys = SessionKeys::derive(&*engine)?;
        let setup_keys = EndpointKeys::derive(&*engine)?;
        let cfg = self
            .setup_cfg
            .take()
            .ok_or(NetError::Protocol("no setup configuration"))?;
        let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::from_seed(*self.seed);
        self.setup = Some(
            mbx_blindbox_setup::Endpoint::new(setup_keys, &cfg.rg_key, cfg.endpoint, &mut rng)
                .map_err(|e| NetError::Setup(e.to_string()))?,
        );
        let engine = self
            .engine
            .take()
            .ok_or(NetError::Protocol("no TLS engine"))?;
        let handoff = engine.export_session()?;
        self.sent += handoff.pending_outgoing.len() as u64;
        encode(Stream::Primary, &handoff.pending_outgoing, &mut self.out);
        if !handoff.pending_plaintext.is_empty() {
            return Err(NetError::Protocol("application data inside the handshake"));
        }
        let unprocessed = handoff.unprocessed_incoming;
        let rx_start = self.received - unprocessed.len() as u64;
        self.tx = Some(PrimaryKeys::from_session(&handoff.session, true, self.sent));
        self.rx = Some(PrimaryKeys::from_session(&handoff.session, false, rx_start));
        self.keys = Some(keys);
        if !unprocessed.is_empty() {
            self.early_bytes += unprocessed.len();
            self.early.push((Stream::Primary, unprocessed));
        }
        self.state = State::AwaitReady;
        encode(
            Stream::Control,
            &Control::HandshakeDone(Params::from(&self.flow)).encode(),
            &mut self.out,
        );
        self.events.push(EndpointEvent::HandshakeDone);
        Ok(())
    }

    fn control(&mut self, data: &[u8]) -> Result<(), NetError> {
        match Control::decode(data)? {
            Control::Ready if self.state == State::AwaitReady => {
                let setup = self
                    .setup
                    .take()
                    .ok_or(NetError::Protocol("ready without a rule setup"))?;
                if !setup.is_done() {
                    return Err(NetError::Protocol("ready before the rule setup finished"));
                }
                self.setup_progress = setup.progress();
                self.start_data()
            }
            Control::Refused(why) => Err(NetError::Refused(why)),
            _ => Err(NetError::Protocol("unexpected control message")),
        }
    }

    fn start_data(&mut self) -> Result<(), NetError> {
        let (keys, tx, rx) = match (&self.keys, self.tx.take(), self.rx.take()) {
            (Some(k), Some(t), Some(r)) => (k, t, r),
            _ => return Err(NetError::Protocol("ready before the handshake")),
        };
        let (tx_dir, rx_dir) = self.directions();
        let mut first = FlowOutput::default();
        self.sender = Some(FlowSender::new(&self.flow, keys, tx_dir, tx, &mut first)?);
        self.receiver = Some(FlowReceiver::new(&self.flow, keys, rx_dir, rx));
        self.emit(first);
        self.state = State::Data;
        self.events.push(EndpointEvent::Ready {
            setup: self.setup_progress,
        });
        for (s, data) in core::mem::take(&mut self.early) {
            self.data_in(s, &data)?;
        }
        let pending = core::mem::take(&mut self.pending_writes);
        if !pending.is_empty() {
            self.write(&pending)?;
        }
        if self.finish_requested {
            self.finish()?;
        }
        Ok(())
    }

    fn data_in(&mut self, stream: Stream, data: &[u8]) -> Result<(), NetError> {
        let rx = self
            .receiver
            .as_mut()
            .ok_or(NetError::Protocol("no receiver"))?;
        match stream {
            Stream::Primary => {
                let plain = rx.primary_in(data)?;
                self.plaintext.extend_from_slice(&plain);
            }
            Stream::Tokens => rx.tokens_in(data)?,
            Stream::Control | Stream::Setup => {
                return Err(NetError::Protocol("control in the data path"))
            }
        }
        Ok(())
    }

    fn emit(&mut self, o: FlowOutput) {
        // Tokens first: the middlebox inspects them, and a blocking verdict then stops the
        // primary records that carry the same bytes.
        encode(Stream::Tokens, &o.tokens, &mut self.out);
        encode(Stream::Primary, &o.primary, &mut self.out);
    }

    /// Application data for the peer (held until the middlebox is ready).
    pub fn write(&mut self, data: &[u8]) -> Result<(), NetError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        match self.sender.as_mut() {
            Some(s) => {
                let mut o = FlowOutput::default();
                s.send(data, &mut o)?;
                self.emit(o);
            }
            None => self.pending_writes.extend_from_slice(data),
        }
        Ok(())
    }

    /// Ends our direction: last tokens, End, close_notify (held until ready).
    pub fn finish(&mut self) -> Result<(), NetError> {
        match self.sender.as_mut() {
            Some(s) => {
                let mut o = FlowOutput::default();
                s.finish(&mut o)?;
                self.emit(o);
            }
            None => self.finish_requested = true,
        }
        Ok(())
    }

    /// The peer's connection ended: every byte must have been validated against its tokens.
    pub fn peer_ended(&mut self) -> Result<(), NetError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        match self.receiver.as_mut() {
            Some(rx) => Ok(rx.finish()?),
            None => Err(NetError::Protocol("connection ended before the data phase")),
        }
    }

    /// What is queued for the middlebox (handshake, control, data); cheap: the setup's frames
    /// come from [`poll_transmit`](Self::poll_transmit).
    pub fn take_outgoing(&mut self) -> Vec<u8> {
        core::mem::take(&mut self.out)
    }

    /// What is queued, or else the next frame of the rule setup, garbling the next group of
    /// circuits if needed (the expensive call: drivers run it off their I/O thread and pull one
    /// frame at a time, when the previous one is written, so memory stays bounded by the
    /// setup's group size). `None`: nothing to send until more input.
    pub fn poll_transmit(&mut self) -> Result<Option<Vec<u8>>, NetError> {
        if !self.out.is_empty() {
            return Ok(Some(core::mem::take(&mut self.out)));
        }
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let Some(setup) = self.setup.as_mut() else {
            return Ok(None);
        };
        let r = setup
            .poll_transmit()
            .map_err(|e| NetError::Setup(e.to_string()));
        match self.check(r)? {
            Some(frame) => {
                let mut out = Vec::with_capacity(frame.len() + frame.len() / 16 + 8);
                encode(Stream::Setup, &frame, &mut out);
                Ok(Some(out))
            }
            None => Ok(None),
        }
    }

    /// The rule setup's progress (circuits garbled, bytes), while it runs and after.
    pub fn setup_progress(&self) -> Progress {
        self.setup
            .as_ref()
            .map_or(self.setup_progress, mbx_blindbox_setup::Endpoint::progress)
    }

    /// The error the endpoint failed with, if any.
    pub fn error(&self) -> Option<&NetError> {
        self.failed.as_ref()
    }

    /// Validated application data received so far.
    pub fn take_plaintext(&mut self) -> Vec<u8> {
        core::mem::take(&mut self.plaintext)
    }

    pub fn poll_event(&mut self) -> Option<EndpointEvent> {
        (!self.events.is_empty()).then(|| self.events.remove(0))
    }

    /// True once data flows.
    pub fn is_ready(&self) -> bool {
        self.state == State::Data
    }

    /// The BlindBox token keys of the session, once the handshake is done.
    pub fn session_keys(&self) -> Option<&SessionKeys> {
        self.keys.as_ref()
    }
}
