//! A garbling endpoint (client or server of the primary session).
//!
//! Both endpoints run this machine with the same `k`, `k_rand` and `k_RG`; the middlebox tells
//! each whether to send full circuits ([`Role::Full`]) or only transcript digests
//! ([`Role::Hash`]). Per batch the endpoint answers the middlebox's OT extension with the label
//! pairs of the batch's circuits, then garbles the circuits in groups across cores. Output is
//! pulled with [`Endpoint::poll_transmit`] one frame at a time, so a driver with a slow socket
//! never makes it hold more than one group of circuits.

use std::collections::VecDeque;
use std::ops::Range;

use mbx_garble::{hash_garbling, Circuit, Garbler};
use mbx_ot::OtSender;
use rand::rngs::StdRng;
use rand::{CryptoRng, RngCore, SeedableRng};
use zeroize::{Zeroize, ZeroizeOnDrop, Zeroizing};

use crate::common::{
    batch_count, batch_range, chunk_seed, default_workers, ot_session_id, par_map, setup_circuit,
    Progress, EVAL_BITS,
};
use crate::error::SetupError;
use crate::keyfile::RgKey;
use crate::wire::{
    finish_frame, put_circuit_head, Deframer, Message, Peer, Role, FRAME_HEADER, MAX_WINDOW,
    T_CIRCUIT,
};

/// The endpoint's secrets for the setup: `k` (the DPIEnc token key, what the circuit encrypts
/// under) and `k_rand` (the shared garbling randomness). Wiped on drop.
#[derive(Clone, Zeroize, ZeroizeOnDrop)]
pub struct EndpointKeys {
    k: [u8; 16],
    k_rand: [u8; 32],
}

impl EndpointKeys {
    pub fn from_parts(k: [u8; 16], k_rand: [u8; 32]) -> Self {
        Self { k, k_rand }
    }

    /// Runs the same exporters as `mbx_blindbox::SessionKeys::derive` (labels from
    /// `mbx_blindbox::keys`), which does not expose `k` itself.
    pub fn derive(engine: &dyn mbx_engine::TlsEngine) -> Result<Self, mbx_engine::EngineError> {
        use mbx_blindbox::keys::{LABEL_K, LABEL_K_RAND};
        let k = Zeroizing::new(engine.export_keying_material(LABEL_K, None, 16)?);
        let r = Zeroizing::new(engine.export_keying_material(LABEL_K_RAND, None, 32)?);
        let mut out = Self {
            k: [0; 16],
            k_rand: [0; 32],
        };
        if k.len() != 16 || r.len() != 32 {
            return Err(mbx_engine::EngineError::State(
                "exporter returned a wrong length",
            ));
        }
        out.k.copy_from_slice(&k);
        out.k_rand.copy_from_slice(&r);
        Ok(out)
    }
}

impl std::fmt::Debug for EndpointKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EndpointKeys(..)")
    }
}

/// Endpoint settings.
#[derive(Clone, Debug)]
pub struct EndpointConfig {
    /// Most chunks this endpoint garbles for (a middlebox announcing more is refused).
    pub max_chunks: u32,
    /// Threads for garbling.
    pub workers: usize,
    /// Circuits garbled per [`Endpoint::poll_transmit`] step (0: twice `workers`). A full
    /// endpoint holds at most this many circuits (≈ 322 KB each) of output at once.
    pub group: usize,
}

impl Default for EndpointConfig {
    fn default() -> Self {
        Self {
            max_chunks: 1 << 20,
            workers: default_workers(),
            group: 0,
        }
    }
}

struct Run {
    role: Role,
    total: u32,
    batch_size: u16,
    ot: OtSender,
    /// Extension messages received, not yet answered.
    extends: VecDeque<(u32, Vec<u8>)>,
    extends_received: u32,
    /// Circuits of the current batch still to garble.
    work: Option<Range<u32>>,
}

enum State {
    AwaitAnnounce,
    Running(Box<Run>),
    Done,
    Failed(SetupError),
}

/// The endpoint's sans-I/O state machine.
pub struct Endpoint {
    keys: EndpointKeys,
    garbler_inputs: Zeroizing<Vec<bool>>,
    circuit: std::sync::Arc<Circuit>,
    cfg: EndpointConfig,
    rng: StdRng,
    deframer: Deframer,
    state: State,
    out: VecDeque<Vec<u8>>,
    progress: Progress,
}

impl Endpoint {
    /// A new endpoint waiting for the middlebox's announcement.
    pub fn new<R: RngCore + CryptoRng>(
        keys: EndpointKeys,
        rg_key: &RgKey,
        cfg: EndpointConfig,
        rng: &mut R,
    ) -> Result<Self, SetupError> {
        let mut seed = Zeroizing::new([0u8; 32]);
        rng.fill_bytes(seed.as_mut());
        Ok(Self {
            garbler_inputs: mbx_garble::blindbox_token_garbler_inputs(&keys.k, rg_key.bytes()),
            keys,
            circuit: setup_circuit()?,
            cfg,
            rng: StdRng::from_seed(*seed),
            deframer: Deframer::new(),
            state: State::AwaitAnnounce,
            out: VecDeque::new(),
            progress: Progress::default(),
        })
    }

    /// The role the middlebox gave this endpoint (once announced).
    pub fn role(&self) -> Option<Role> {
        match &self.state {
            State::Running(r) => Some(r.role),
            _ => None,
        }
    }

    /// True once the middlebox said every check passed and nothing is left to send.
    pub fn is_done(&self) -> bool {
        matches!(self.state, State::Done) && self.out.is_empty()
    }

    pub fn progress(&self) -> Progress {
        self.progress
    }

    fn fail(&mut self, e: SetupError) -> SetupError {
        self.state = State::Failed(e.clone());
        self.out.clear();
        e
    }

    /// Bytes from the middlebox (any chunking).
    pub fn receive(&mut self, bytes: &[u8]) -> Result<(), SetupError> {
        if let State::Failed(e) = &self.state {
            return Err(e.clone());
        }
        self.progress.bytes_received += bytes.len() as u64;
        self.deframer.push(bytes);
        loop {
            let msg = match self.deframer.next_frame() {
                Ok(None) => return Ok(()),
                Ok(Some((ty, body))) => Message::decode(ty, body),
                Err(e) => Err(e),
            };
            let res = match msg {
                Ok(m) => self.handle(m),
                Err(e) => Err(SetupError::Frame {
                    peer: Peer::Middlebox,
                    what: e.0,
                }),
            };
            if let Err(e) = res {
                return Err(self.fail(e));
            }
        }
    }

    fn handle(&mut self, msg: Message) -> Result<(), SetupError> {
        let proto = |what| SetupError::Protocol {
            peer: Peer::Middlebox,
            what,
        };
        match (&mut self.state, msg) {
            (State::AwaitAnnounce, Message::Announce(a)) => {
                if a.chunks > self.cfg.max_chunks {
                    return Err(SetupError::TooManyChunks {
                        got: a.chunks,
                        max: self.cfg.max_chunks,
                    });
                }
                let sid = ot_session_id(&a.nonce, a.role);
                let (ot, reply) =
                    OtSender::new(&sid, &a.ot_setup, &mut self.rng).map_err(|err| {
                        SetupError::Ot {
                            peer: Peer::Middlebox,
                            err,
                        }
                    })?;
                self.out.push_back(Message::Ready { ot: reply }.encode());
                self.progress.circuits_total = a.chunks;
                self.state = State::Running(Box::new(Run {
                    role: a.role,
                    total: a.chunks,
                    batch_size: a.batch,
                    ot,
                    extends: VecDeque::new(),
                    extends_received: 0,
                    work: None,
                }));
                Ok(())
            }
            (State::Running(run), Message::Extend { batch, ot }) => {
                if batch != run.extends_received || batch >= batch_count(run.batch_size, run.total)
                {
                    return Err(proto("OT extension for an unexpected batch"));
                }
                if run.extends.len() >= MAX_WINDOW as usize {
                    return Err(proto("more OT batches outstanding than MAX_WINDOW"));
                }
                run.extends_received += 1;
                run.extends.push_back((batch, ot));
                Ok(())
            }
            (State::Running(run), Message::Finished) => {
                let all = run.extends_received == batch_count(run.batch_size, run.total);
                if !all || !run.extends.is_empty() || run.work.is_some() {
                    return Err(proto("finished before every circuit was sent"));
                }
                self.state = State::Done;
                Ok(())
            }
            _ => Err(proto("unexpected message")),
        }
    }

    /// The next frame to send, garbling the next group of circuits if needed (the expensive
    /// call: drivers run it off their I/O thread). `None`: nothing to send until more input.
    pub fn poll_transmit(&mut self) -> Result<Option<Vec<u8>>, SetupError> {
        if let State::Failed(e) = &self.state {
            return Err(e.clone());
        }
        if self.out.is_empty() {
            if let Err(e) = self.step() {
                return Err(self.fail(e));
            }
        }
        let next = self.out.pop_front();
        if let Some(m) = &next {
            self.progress.bytes_sent += m.len() as u64;
        }
        Ok(next)
    }

    fn step(&mut self) -> Result<(), SetupError> {
        let State::Running(run) = &mut self.state else {
            return Ok(());
        };
        let (circuit, inputs, k_rand) = (&self.circuit, &self.garbler_inputs, &self.keys.k_rand);
        let workers = self.cfg.workers.max(1);
        if run.work.is_none() {
            let Some((batch, ext)) = run.extends.pop_front() else {
                return Ok(());
            };
            let range = batch_range(batch, run.batch_size, run.total);
            let (_, n) = mbx_ot::peek_extend(&ext).map_err(|err| SetupError::Ot {
                peer: Peer::Middlebox,
                err,
            })?;
            if n != range.len() * EVAL_BITS {
                return Err(SetupError::Protocol {
                    peer: Peer::Middlebox,
                    what: "OT batch size does not match the circuits of the batch",
                });
            }
            let first = range.start;
            let per_circuit = par_map(range.len(), workers, |j| {
                let i = first + j as u32;
                let g = Garbler::new(circuit, &chunk_seed(k_rand, i), u64::from(i), inputs)?;
                Ok(g.evaluator_input_pairs()
                    .iter()
                    .map(|p| (p.zero.to_bytes(), p.one.to_bytes()))
                    .collect::<Vec<_>>())
            });
            let mut pairs = Zeroizing::new(Vec::with_capacity(n));
            for p in per_circuit {
                let mut p: Vec<_> = p.map_err(SetupError::Garble)?;
                pairs.extend_from_slice(&p);
                p.zeroize();
            }
            let transfer = run
                .ot
                .handle_extend(&ext, &pairs)
                .map_err(|err| SetupError::Ot {
                    peer: Peer::Middlebox,
                    err,
                })?;
            self.out.push_back(
                Message::Transfer {
                    batch,
                    ot: transfer,
                }
                .encode(),
            );
            run.work = Some(range);
            return Ok(());
        }
        let Some(range) = run.work.clone() else {
            return Ok(());
        };
        let group = if self.cfg.group == 0 {
            2 * workers
        } else {
            self.cfg.group
        };
        let count = range.len().min(group);
        let first = range.start;
        match run.role {
            Role::Full => {
                let frames = par_map(count, workers, |j| {
                    full_frame(circuit, k_rand, inputs, first + j as u32)
                });
                for f in frames {
                    self.out.push_back(f.map_err(SetupError::Garble)?);
                }
            }
            Role::Hash => {
                let digests = par_map(count, workers, |j| {
                    let i = first + j as u32;
                    hash_garbling(circuit, &chunk_seed(k_rand, i), u64::from(i), inputs)
                });
                let digests = digests
                    .into_iter()
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(SetupError::Garble)?;
                self.out
                    .push_back(Message::Digests { first, digests }.encode());
            }
        }
        self.progress.circuits_done += count as u32;
        let rest = first + count as u32..range.end;
        run.work = (!rest.is_empty()).then_some(rest);
        Ok(())
    }
}

/// Garbles circuit `i` straight into its Circuit frame (no second copy of the tables).
fn full_frame(
    circuit: &Circuit,
    k_rand: &[u8; 32],
    inputs: &[bool],
    i: u32,
) -> Result<Vec<u8>, mbx_garble::Error> {
    let mut g = Garbler::new(circuit, &chunk_seed(k_rand, i), u64::from(i), inputs)?;
    let tables = circuit.counts().table_bytes();
    let outputs = circuit.outputs().len();
    let mut out = Vec::with_capacity(FRAME_HEADER + 24 + tables + outputs * 17);
    out.extend_from_slice(&[0; FRAME_HEADER]);
    put_circuit_head(&mut out, i, &g.garbler_label_seed().to_bytes(), tables);
    while g.write_tables(&mut out, usize::MAX) > 0 {}
    out.extend_from_slice(&g.decoding()?.to_bytes());
    finish_frame(&mut out, 0, T_CIRCUIT);
    Ok(out)
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("role", &self.role())
            .field("progress", &self.progress)
            .finish_non_exhaustive()
    }
}
