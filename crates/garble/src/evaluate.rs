//! The evaluator: consumes garbled tables in chunks of any size and one active label per input.
//!
//! Tables are untrusted network bytes: the evaluator never indexes them unchecked, refuses more
//! bytes than the circuit has AND gates, and buffers at most one partial batch beyond what it has
//! consumed. Decoding checks every output label (see [`Decoding`]).

use subtle::ConstantTimeEq;

use crate::circuit::{check_len, Circuit, Op, SlotGate};
use crate::error::Error;
use crate::garble::{output_tag, tweak, Decoding, BATCH, TABLE_BYTES_PER_AND};
use crate::hash::FixedKeyHash;
use crate::label::{lsb, mask, wipe, Label};

/// Evaluates one garbled circuit.
pub struct Evaluator<'c> {
    circuit: &'c Circuit,
    hash: FixedKeyHash,
    instance: u64,
    /// Label in every storage slot (see `Circuit::compiled`).
    labels: Vec<u128>,
    /// Per AND gate of the open segment: `A`, `lsb(B)` as a mask, and the output slot.
    operands: Vec<u128>,
    /// Next segment of the circuit's schedule, and its first gate.
    seg: usize,
    pos: usize,
    ands_done: u64,
    ys: Vec<u128>,
    /// Received, not yet consumed table bytes (from `buf_off`).
    buf: Vec<u8>,
    buf_off: usize,
}

impl<'c> Evaluator<'c> {
    /// Starts an evaluation with the garbler's active labels and the evaluator's (from the OTs).
    pub fn new(
        circuit: &'c Circuit,
        instance: u64,
        garbler_labels: &[Label],
        evaluator_labels: &[Label],
    ) -> Result<Self, Error> {
        check_len("garbler", circuit.garbler_inputs(), garbler_labels.len())?;
        check_len(
            "evaluator",
            circuit.evaluator_inputs(),
            evaluator_labels.len(),
        )?;
        let mut labels = vec![0u128; circuit.compiled().slots];
        for (slot, l) in labels
            .iter_mut()
            .zip(garbler_labels.iter().chain(evaluator_labels))
        {
            *slot = l.0;
        }
        Ok(Self {
            circuit,
            hash: FixedKeyHash::new(),
            instance,
            labels,
            operands: Vec::with_capacity(3 * BATCH),
            seg: 0,
            pos: 0,
            ands_done: 0,
            ys: Vec::with_capacity(2 * BATCH),
            buf: Vec::new(),
            buf_off: 0,
        })
    }

    fn total_table_bytes(&self) -> u64 {
        (self.circuit.counts().and as u64) * TABLE_BYTES_PER_AND as u64
    }

    /// Feeds the next chunk of garbled tables (any split of the table stream) and evaluates as far
    /// as the tables received allow.
    pub fn feed(&mut self, tables: &[u8]) -> Result<(), Error> {
        let consumed = self.ands_done * TABLE_BYTES_PER_AND as u64;
        let buffered = (self.buf.len() - self.buf_off) as u64;
        if consumed + buffered + tables.len() as u64 > self.total_table_bytes() {
            return Err(Error::ExtraTables);
        }
        if self.buf_off == self.buf.len() {
            // Nothing buffered: evaluate straight from the caller's chunk, keep only the rest.
            self.buf.clear();
            self.buf_off = 0;
            let used = self.run(tables);
            self.buf
                .extend_from_slice(tables.get(used..).unwrap_or_default());
        } else {
            self.buf.extend_from_slice(tables);
            let buf = core::mem::take(&mut self.buf);
            let used = self.run(buf.get(self.buf_off..).unwrap_or_default());
            self.buf = buf;
            self.buf.drain(..self.buf_off + used);
            self.buf_off = 0;
        }
        Ok(())
    }

    /// Evaluates whole segments while `tables` holds their tables; returns the bytes consumed.
    fn run(&mut self, tables: &[u8]) -> usize {
        let circuit = self.circuit;
        let mut used = 0;
        while let Some(seg) = circuit.segments().get(self.seg) {
            let need = seg.ands as usize * TABLE_BYTES_PER_AND;
            let Some(t) = tables.get(used..used + need) else {
                break;
            };
            let end = seg.end as usize;
            if let Some(gates) = circuit.compiled().gates.get(self.pos..end) {
                self.eval_segment(gates, t);
            }
            used += need;
            self.pos = end;
            self.seg += 1;
        }
        used
    }

    /// Evaluates one segment: free gates as they come, then its AND gates in one hash batch.
    fn eval_segment(&mut self, gates: &[SlotGate], tables: &[u8]) {
        let Self {
            labels,
            ys,
            hash,
            instance,
            ands_done,
            operands,
            ..
        } = self;
        ys.clear();
        operands.clear();
        let mut j = *ands_done;
        // Slots were assigned by `Circuit::from_parts` within `labels`' length; a segment never
        // reads its own AND outputs, and AND operands are saved because their slots may be reused.
        for g in gates {
            match g.op {
                Op::Xor => labels[g.out as usize] = labels[g.a as usize] ^ labels[g.b as usize],
                Op::Inv => labels[g.out as usize] = labels[g.a as usize],
                Op::And => {
                    let (a, b) = (labels[g.a as usize], labels[g.b as usize]);
                    ys.push(FixedKeyHash::prepare(a, tweak(*instance, 2 * j)));
                    ys.push(FixedKeyHash::prepare(b, tweak(*instance, 2 * j + 1)));
                    operands.extend_from_slice(&[a, mask(lsb(b)), u128::from(g.out)]);
                    j += 1;
                }
            }
        }
        if ys.is_empty() {
            return;
        }
        hash.hash_in_place(ys);
        let per_gate = ys.chunks_exact(2).zip(operands.chunks_exact(3));
        for ((h, o), t) in per_gate.zip(tables.chunks_exact(TABLE_BYTES_PER_AND)) {
            let (t_g, t_e) = split_table(t);
            let (a, sb, slot) = (o[0], o[1], o[2] as usize);
            let w_g = h[0] ^ (t_g & mask(lsb(a)));
            let w_e = h[1] ^ ((t_e ^ a) & sb);
            labels[slot] = w_g ^ w_e;
        }
        *ands_done += (ys.len() / 2) as u64;
    }

    fn check_complete(&self) -> Result<(), Error> {
        if self.seg < self.circuit.segments().len() {
            return Err(Error::MissingTables {
                have: self.ands_done * TABLE_BYTES_PER_AND as u64
                    + (self.buf.len() - self.buf_off) as u64,
                need: self.total_table_bytes(),
            });
        }
        Ok(())
    }

    /// The output labels once all tables are in (for callers that decode elsewhere).
    pub fn output_labels(&mut self) -> Result<Vec<Label>, Error> {
        self.feed(&[])?;
        self.check_complete()?;
        Ok(self
            .circuit
            .compiled()
            .outputs
            .iter()
            .map(|&w| Label(self.labels[w as usize]))
            .collect())
    }

    /// Decodes and checks the outputs. Fails if tables are missing or any output label is neither
    /// of its wire's two labels ([`Error::OutputCheck`]).
    pub fn finish(mut self, decoding: &Decoding) -> Result<Vec<bool>, Error> {
        // Gates after the last AND gate (or a circuit without AND gates) need no tables.
        self.feed(&[])?;
        self.check_complete()?;
        let outputs = &self.circuit.compiled().outputs;
        if decoding.len() != outputs.len() {
            return Err(Error::BadDecoding);
        }
        let mut bits = Vec::with_capacity(outputs.len());
        for (i, &w) in outputs.iter().enumerate() {
            let l = self.labels[w as usize];
            let (d, tags) = decoding.entry(i).ok_or(Error::BadDecoding)?;
            let s = lsb(l);
            let expected = if s { &tags[1] } else { &tags[0] };
            let tag = output_tag(&mut self.hash, self.instance, i, l);
            if !bool::from(tag.ct_eq(expected)) {
                return Err(Error::OutputCheck(i));
            }
            bits.push(s ^ d);
        }
        Ok(bits)
    }
}

fn split_table(t: &[u8]) -> (u128, u128) {
    let mut g = [0u8; 16];
    let mut e = [0u8; 16];
    if let (Some(a), Some(b)) = (t.get(..16), t.get(16..32)) {
        g.copy_from_slice(a);
        e.copy_from_slice(b);
    }
    (u128::from_le_bytes(g), u128::from_le_bytes(e))
}

impl Drop for Evaluator<'_> {
    fn drop(&mut self) {
        wipe(&mut self.labels);
        wipe(&mut self.operands);
        wipe(&mut self.ys);
    }
}

/// Evaluates a whole garbled circuit held in memory.
pub fn evaluate(
    circuit: &Circuit,
    instance: u64,
    tables: &[u8],
    garbler_labels: &[Label],
    evaluator_labels: &[Label],
    decoding: &Decoding,
) -> Result<Vec<bool>, Error> {
    let mut e = Evaluator::new(circuit, instance, garbler_labels, evaluator_labels)?;
    e.feed(tables)?;
    e.finish(decoding)
}
