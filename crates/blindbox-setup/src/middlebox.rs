//! The middlebox: evaluator of the garbled circuits and OT receiver from both endpoints.
//!
//! It announces the chunk count, runs one OT session with each endpoint (the same choice bits,
//! its chunks and tags, in both), and per batch of circuits checks, before it uses anything:
//!
//! 1. **labels**: the labels obtained from the two endpoints are identical (constant time,
//!    whole batch at once; the error does not say which OT differed);
//! 2. **transcript**: the full circuit received from one endpoint hashes to the digest the other
//!    endpoint sent;
//! 3. **evaluation**: every output label passes its decoding check.
//!
//! Then the outputs are `AES_k(t ‖ 0⁸)`, or zero where a tag did not verify (refused chunks).
//! With at least one honest endpoint, a cheating endpoint fails check 1 or 2 whatever it does.
//!
//! Memory: at most `window` batches of `batch` circuits are requested at once, so at most
//! `window × batch` full circuits (≈ 322 KB each) are buffered.

use std::collections::VecDeque;
use std::ops::Range;

use mbx_blindbox::detect::{DetectionPlan, EncryptedRules};
use mbx_blindbox::dpienc::KeywordKey;
use mbx_garble::{Circuit, Decoding, Evaluator, Label, LabelSeed, TranscriptHasher};
use mbx_ot::{Labels, OtReceiver, LABEL_LEN};
use rand::rngs::StdRng;
use rand::{CryptoRng, RngCore, SeedableRng};
use subtle::{Choice, ConstantTimeEq};
use zeroize::Zeroizing;

use crate::common::{
    batch_count, batch_range, choice_bits, default_workers, ot_session_id, par_map, setup_circuit,
    Progress, EVAL_BITS, OUTPUT_BITS,
};
use crate::error::SetupError;
use crate::tagged::SignedChunk;
use crate::wire::{
    Announce, CircuitMsg, Deframer, Message, Peer, Role, MAX_BATCH_CIRCUITS, MAX_WINDOW,
};

/// Middlebox settings.
#[derive(Clone, Debug)]
pub struct MiddleboxConfig {
    /// Circuits per OT batch (192 OTs each), at most [`MAX_BATCH_CIRCUITS`].
    pub batch: u16,
    /// Batches requested ahead of the one being evaluated, 1..=[`MAX_WINDOW`].
    pub window: u32,
    /// Threads for evaluation.
    pub workers: usize,
}

impl Default for MiddleboxConfig {
    fn default() -> Self {
        Self {
            batch: 32,
            window: 2,
            workers: default_workers(),
        }
    }
}

struct Conn {
    ot: OtReceiver,
    ready: bool,
    deframer: Deframer,
    out: VecDeque<Vec<u8>>,
}

struct Batch {
    index: u32,
    range: Range<u32>,
    full_labels: Option<Labels>,
    hash_labels: Option<Labels>,
    circuits: Vec<Option<CircuitMsg>>,
    digests: Vec<Option<[u8; 32]>>,
}

impl Batch {
    fn complete(&self) -> bool {
        self.full_labels.is_some()
            && self.hash_labels.is_some()
            && self.circuits.iter().all(Option::is_some)
            && self.digests.iter().all(Option::is_some)
    }
}

/// The middlebox's sans-I/O state machine for one setup with two endpoints.
pub struct Middlebox {
    chunks: Vec<SignedChunk>,
    circuit: std::sync::Arc<Circuit>,
    cfg: MiddleboxConfig,
    rng: StdRng,
    full: Conn,
    hash: Conn,
    total_batches: u32,
    extends_sent: u32,
    inflight: VecDeque<Batch>,
    outputs: Zeroizing<Vec<[u8; 16]>>,
    failed: Option<SetupError>,
    finished: bool,
    progress: Progress,
}

/// What the setup produced: `AES_k(t ‖ 0⁸)` per chunk, zero for refused chunks.
pub struct SetupOutcome {
    chunks: Vec<SignedChunk>,
    keys: Zeroizing<Vec<[u8; 16]>>,
    refused: Vec<u32>,
}

impl SetupOutcome {
    /// Indices (into the setup's chunks) whose tag did not verify: their output was zero.
    pub fn refused(&self) -> &[u32] {
        &self.refused
    }

    pub fn chunks(&self) -> &[SignedChunk] {
        &self.chunks
    }

    /// The keyword keys in chunk order (zero-key placeholders for refused chunks).
    pub fn keyword_keys(&self) -> Vec<KeywordKey> {
        self.keys
            .iter()
            .map(|k| KeywordKey::from_bytes(*k))
            .collect()
    }

    /// The detection state for `plan`, which must be the plan the chunks were taken from.
    /// Fails if any chunk was refused.
    pub fn into_encrypted_rules(self, plan: DetectionPlan) -> Result<EncryptedRules, SetupError> {
        let same = plan.chunks().len() == self.chunks.len()
            && plan
                .chunks()
                .iter()
                .zip(&self.chunks)
                .all(|(a, b)| *a == b.chunk);
        if !same {
            return Err(SetupError::Usage(
                "the detection plan's chunks are not the ones the setup ran on",
            ));
        }
        if !self.refused.is_empty() {
            return Err(SetupError::Refused {
                count: self.refused.len(),
            });
        }
        EncryptedRules::new(plan, &self.keyword_keys())
            .map_err(|_| SetupError::Usage("key count differs from the plan"))
    }
}

impl std::fmt::Debug for SetupOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SetupOutcome")
            .field("chunks", &self.chunks.len())
            .field("refused", &self.refused.len())
            .finish_non_exhaustive()
    }
}

/// Why one circuit failed (before the batch's verdict is formed).
enum CircuitFault {
    Transcript,
    Decoding,
    Eval(mbx_garble::Error),
}

impl Middlebox {
    /// Starts a setup for `chunks` (from `TaggedRules::signed_chunks`, in plan order); the
    /// announcements for both endpoints are queued at once.
    pub fn new<R: RngCore + CryptoRng>(
        chunks: Vec<SignedChunk>,
        cfg: MiddleboxConfig,
        rng: &mut R,
    ) -> Result<Self, SetupError> {
        let total =
            u32::try_from(chunks.len()).map_err(|_| SetupError::Usage("too many chunks"))?;
        if cfg.batch == 0
            || cfg.batch > MAX_BATCH_CIRCUITS
            || cfg.window == 0
            || cfg.window > MAX_WINDOW
        {
            return Err(SetupError::Usage(
                "batch must be in 1..=MAX_BATCH_CIRCUITS and window in 1..=MAX_WINDOW",
            ));
        }
        let mut seed = Zeroizing::new([0u8; 32]);
        rng.fill_bytes(seed.as_mut());
        let mut rng = StdRng::from_seed(*seed);
        let mut nonce = [0u8; 32];
        rng.fill_bytes(&mut nonce);
        let mut conn = |role: Role| {
            let (ot, setup) = OtReceiver::new(&ot_session_id(&nonce, role), &mut rng);
            let announce = Message::Announce(Announce {
                role,
                chunks: total,
                batch: cfg.batch,
                nonce,
                ot_setup: setup,
            });
            Conn {
                ot,
                ready: false,
                deframer: Deframer::new(),
                out: VecDeque::from([announce.encode()]),
            }
        };
        let full = conn(Role::Full);
        let hash = conn(Role::Hash);
        Ok(Self {
            total_batches: batch_count(cfg.batch, total),
            outputs: Zeroizing::new(Vec::with_capacity(chunks.len())),
            chunks,
            circuit: setup_circuit()?,
            cfg,
            rng,
            full,
            hash,
            extends_sent: 0,
            inflight: VecDeque::new(),
            failed: None,
            finished: false,
            progress: Progress {
                circuits_total: total,
                ..Progress::default()
            },
        })
    }

    pub fn progress(&self) -> Progress {
        self.progress
    }

    /// True once every check passed and the Finished messages were handed out.
    pub fn is_done(&self) -> bool {
        self.finished && self.full.out.is_empty() && self.hash.out.is_empty()
    }

    /// The result, once [`Middlebox::is_done`].
    pub fn finish(self) -> Result<SetupOutcome, SetupError> {
        if let Some(e) = self.failed {
            return Err(e);
        }
        if !self.finished {
            return Err(SetupError::Usage("setup not finished"));
        }
        let refused = self
            .outputs
            .iter()
            .enumerate()
            .filter(|(_, o)| o.iter().all(|&b| b == 0))
            .map(|(i, _)| i as u32)
            .collect();
        Ok(SetupOutcome {
            chunks: self.chunks,
            keys: self.outputs,
            refused,
        })
    }

    fn fail(&mut self, e: SetupError) -> SetupError {
        self.failed = Some(e.clone());
        self.full.out.clear();
        self.hash.out.clear();
        self.inflight.clear();
        e
    }

    /// The endpoint closed its connection (EOF): fatal unless the setup is finished.
    pub fn peer_closed(&mut self, peer: Peer) -> Result<(), SetupError> {
        if self.finished {
            return Ok(());
        }
        Err(self.fail(SetupError::Aborted { peer }))
    }

    /// Bytes from endpoint `peer` (any chunking).
    pub fn receive(&mut self, peer: Peer, bytes: &[u8]) -> Result<(), SetupError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        self.progress.bytes_received += bytes.len() as u64;
        match peer {
            Peer::Full => self.full.deframer.push(bytes),
            Peer::Hash => self.hash.deframer.push(bytes),
            Peer::Middlebox => return Err(SetupError::Usage("receive from an endpoint")),
        }
        loop {
            let conn = if peer == Peer::Full {
                &mut self.full
            } else {
                &mut self.hash
            };
            let msg = match conn.deframer.next_frame() {
                Ok(None) => return Ok(()),
                Ok(Some((ty, body))) => Message::decode(ty, body),
                Err(e) => Err(e),
            };
            let res = match msg {
                Ok(m) => self.handle(peer, m),
                Err(e) => Err(SetupError::Frame { peer, what: e.0 }),
            };
            if let Err(e) = res {
                return Err(self.fail(e));
            }
        }
    }

    fn handle(&mut self, peer: Peer, msg: Message) -> Result<(), SetupError> {
        let proto = |what| SetupError::Protocol { peer, what };
        let ot_err = |err| SetupError::Ot { peer, err };
        let conn = if peer == Peer::Full {
            &mut self.full
        } else {
            &mut self.hash
        };
        match msg {
            Message::Ready { ot } => {
                if conn.ready {
                    return Err(proto("second Ready"));
                }
                conn.ot.handle_base_reply(&ot).map_err(ot_err)?;
                conn.ready = true;
            }
            Message::Transfer { batch, ot } => {
                let b = self
                    .inflight
                    .iter_mut()
                    .find(|b| b.index == batch)
                    .ok_or_else(|| proto("OT transfer for a batch not in flight"))?;
                let slot = if peer == Peer::Full {
                    &mut b.full_labels
                } else {
                    &mut b.hash_labels
                };
                if slot.is_some() {
                    return Err(proto("second OT transfer for a batch"));
                }
                let labels = conn.ot.handle_transfer(&ot).map_err(ot_err)?;
                if labels.len() != b.range.len() * EVAL_BITS {
                    return Err(proto("OT transfer of the wrong size"));
                }
                *slot = Some(labels);
            }
            Message::Circuit(c) if peer == Peer::Full => {
                let counts = self.circuit.counts();
                if c.tables.len() != counts.table_bytes()
                    || c.decoding.len() != OUTPUT_BITS * mbx_garble::garble::DECODE_ENTRY_BYTES
                {
                    return Err(proto("garbled circuit of the wrong size"));
                }
                let slot = self
                    .inflight
                    .iter_mut()
                    .find(|b| b.range.contains(&c.index))
                    .and_then(|b| b.circuits.get_mut((c.index - b.range.start) as usize))
                    .ok_or_else(|| proto("circuit not requested"))?;
                if slot.is_some() {
                    return Err(proto("circuit sent twice"));
                }
                *slot = Some(c);
            }
            Message::Digests { first, digests } if peer == Peer::Hash => {
                let b = self
                    .inflight
                    .iter_mut()
                    .find(|b| b.range.contains(&first))
                    .ok_or_else(|| proto("digests not requested"))?;
                let at = (first - b.range.start) as usize;
                let slots = b
                    .digests
                    .get_mut(at..at + digests.len())
                    .ok_or_else(|| proto("digests beyond their batch"))?;
                if slots.iter().any(Option::is_some) {
                    return Err(proto("digest sent twice"));
                }
                for (s, d) in slots.iter_mut().zip(digests) {
                    *s = Some(d);
                }
            }
            _ => return Err(proto("unexpected message")),
        }
        Ok(())
    }

    /// The next frame for endpoint `peer`, after evaluating every batch that is complete (the
    /// expensive call: drivers run it off their I/O thread).
    pub fn poll_transmit(&mut self, peer: Peer) -> Result<Option<Vec<u8>>, SetupError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        if let Err(e) = self.advance() {
            return Err(self.fail(e));
        }
        let q = match peer {
            Peer::Full => &mut self.full.out,
            Peer::Hash => &mut self.hash.out,
            Peer::Middlebox => return Err(SetupError::Usage("transmit to an endpoint")),
        };
        let next = q.pop_front();
        if let Some(m) = &next {
            self.progress.bytes_sent += m.len() as u64;
        }
        Ok(next)
    }

    fn advance(&mut self) -> Result<(), SetupError> {
        if !(self.full.ready && self.hash.ready) || self.finished {
            return Ok(());
        }
        loop {
            let evaluated = self.extends_sent - self.inflight.len() as u32;
            while self.extends_sent < self.total_batches
                && self.extends_sent < evaluated + self.cfg.window
            {
                self.request_batch()?;
            }
            match self.inflight.front() {
                Some(b) if b.complete() => {
                    if let Some(b) = self.inflight.pop_front() {
                        self.evaluate(b)?;
                    }
                }
                _ => break,
            }
        }
        if self.inflight.is_empty() && self.extends_sent == self.total_batches {
            self.finished = true;
            self.full.out.push_back(Message::Finished.encode());
            self.hash.out.push_back(Message::Finished.encode());
        }
        Ok(())
    }

    fn request_batch(&mut self) -> Result<(), SetupError> {
        let index = self.extends_sent;
        let total = self.chunks.len() as u32;
        let range = batch_range(index, self.cfg.batch, total);
        let mut choices = Zeroizing::new(Vec::with_capacity(range.len() * EVAL_BITS));
        for c in self
            .chunks
            .get(range.start as usize..range.end as usize)
            .unwrap_or_default()
        {
            choices.extend_from_slice(&choice_bits(c));
        }
        for (conn, peer) in [(&mut self.full, Peer::Full), (&mut self.hash, Peer::Hash)] {
            let ot = conn
                .ot
                .extend(&choices, &mut self.rng)
                .map_err(|err| SetupError::Ot { peer, err })?;
            conn.out
                .push_back(Message::Extend { batch: index, ot }.encode());
        }
        let n = range.len();
        self.inflight.push_back(Batch {
            index,
            range,
            full_labels: None,
            hash_labels: None,
            circuits: vec![None; n],
            digests: vec![None; n],
        });
        self.extends_sent += 1;
        Ok(())
    }

    /// Runs the three checks on a complete batch and records its outputs.
    fn evaluate(&mut self, b: Batch) -> Result<(), SetupError> {
        let (Some(full), Some(hash)) = (&b.full_labels, &b.hash_labels) else {
            return Err(SetupError::Usage("batch evaluated before it was complete"));
        };
        // Check 1: identical labels from both endpoints, over the whole batch, constant time.
        let mut same = Choice::from(u8::from(full.len() == hash.len()));
        for (a, c) in full.iter().zip(hash.iter()) {
            same &= a.ct_eq(c);
        }
        if !bool::from(same) {
            return Err(SetupError::LabelMismatch);
        }
        let circuit = &self.circuit;
        let first = b.range.start;
        let results = par_map(b.range.len(), self.cfg.workers, |j| {
            let (Some(Some(c)), Some(Some(digest))) = (b.circuits.get(j), b.digests.get(j)) else {
                return Err(CircuitFault::Decoding);
            };
            let labels = full
                .get(j * EVAL_BITS..(j + 1) * EVAL_BITS)
                .unwrap_or_default();
            check_and_evaluate(circuit, first + j as u32, c, digest, labels)
        });
        let mut outputs = Vec::with_capacity(results.len());
        let mut fault = None;
        for r in results {
            match r {
                Ok(o) => outputs.push(o),
                Err(f) => {
                    // A transcript mismatch outranks the others: it is the check that covers
                    // every byte the full endpoint sent.
                    if !matches!(fault, Some(CircuitFault::Transcript)) {
                        fault = Some(f);
                    }
                }
            }
        }
        match fault {
            Some(CircuitFault::Transcript) => return Err(SetupError::TranscriptMismatch),
            Some(CircuitFault::Decoding) => {
                return Err(SetupError::Protocol {
                    peer: Peer::Full,
                    what: "malformed decoding information",
                })
            }
            Some(CircuitFault::Eval(e)) => return Err(SetupError::Evaluation(e)),
            None => {}
        }
        self.outputs.extend(outputs.iter().map(|o| **o));
        self.progress.circuits_done += b.range.len() as u32;
        Ok(())
    }
}

/// Check 2 (transcript) and check 3 (evaluation) for one circuit.
fn check_and_evaluate(
    circuit: &Circuit,
    index: u32,
    c: &CircuitMsg,
    digest: &[u8; 32],
    labels: &[[u8; LABEL_LEN]],
) -> Result<Zeroizing<[u8; 16]>, CircuitFault> {
    let seed = LabelSeed::from_bytes(c.label_seed);
    let decoding = Decoding::from_bytes(&c.decoding, circuit.outputs().len())
        .map_err(|_| CircuitFault::Decoding)?;
    let mut h = TranscriptHasher::new(circuit, u64::from(index));
    h.update_tables(&c.tables);
    if !bool::from(h.finish(&seed, &decoding).ct_eq(digest)) {
        return Err(CircuitFault::Transcript);
    }
    let garbler = seed.expand(circuit.garbler_inputs());
    let evaluator: Vec<Label> = labels.iter().map(|l| Label::from_bytes(*l)).collect();
    let mut e = Evaluator::new(circuit, u64::from(index), &garbler, &evaluator)
        .map_err(CircuitFault::Eval)?;
    e.feed(&c.tables).map_err(CircuitFault::Eval)?;
    let bits = Zeroizing::new(e.finish(&decoding).map_err(CircuitFault::Eval)?);
    mbx_garble::block_from_bits(&bits)
        .map(Zeroizing::new)
        .ok_or(CircuitFault::Eval(mbx_garble::Error::BadDecoding))
}

impl std::fmt::Debug for Middlebox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Middlebox")
            .field("progress", &self.progress)
            .field("failed", &self.failed)
            .finish_non_exhaustive()
    }
}
