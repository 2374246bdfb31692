//! The evaluator: consumes garbled tables in chunks of any size and one active label per input.
//!
//! Tables are untrusted network bytes: the evaluator never indexes them unchecked, refuses more
//! bytes than the circuit has AND gates, and buffers at most one partial batch beyond what it has
//! consumed. Decoding checks every output label (see [`Decoding`]).

use subtle::ConstantTimeEq;

use zeroize::Zeroize;

use crate::circuit::{apply_free_xors, check_len, Circuit};
use crate::error::Error;
use crate::garble::{output_tags, Decoding, BATCH, TABLE_BYTES_PER_AND};
use crate::hash::{sigma, FixedKeyHash};
use crate::label::{lsb, mask, wipe, Label};

/// Evaluates one garbled circuit.
pub struct Evaluator<'c> {
    circuit: &'c Circuit,
    hash: FixedKeyHash,
    instance: u64,
    /// Label in every storage slot (see `Circuit::compiled`); a power-of-two length, so slot
    /// indices are masked instead of bounds-checked.
    labels: Vec<u128>,
    /// Per AND gate of the open segment: `A`, `B` (their slots may be reused by the segment's AND
    /// outputs).
    operands: Vec<[u128; 2]>,
    /// Next segment of the circuit's schedule, and its first free and AND gate.
    seg: usize,
    xor_pos: usize,
    and_pos: usize,
    /// The open segment's hash blocks, two per AND gate.
    blocks: Vec<u128>,
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
        // INV gates are XORs with slot `compiled().one`, which stays 0 here.
        let mut labels = vec![0u128; circuit.compiled().slots.next_power_of_two()];
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
            operands: vec![[0; 2]; BATCH],
            seg: 0,
            xor_pos: 0,
            and_pos: 0,
            blocks: vec![0; 2 * BATCH],
            buf: Vec::new(),
            buf_off: 0,
        })
    }

    /// Evaluates with the portable hash path even where VAES is available (tests compare both).
    #[cfg(test)]
    pub(crate) fn use_portable_hash(&mut self) {
        self.hash = FixedKeyHash::portable();
    }

    fn total_table_bytes(&self) -> u64 {
        (self.circuit.counts().and as u64) * TABLE_BYTES_PER_AND as u64
    }

    /// Feeds the next chunk of garbled tables (any split of the table stream) and evaluates as far
    /// as the tables received allow.
    pub fn feed(&mut self, tables: &[u8]) -> Result<(), Error> {
        let consumed = self.and_pos as u64 * TABLE_BYTES_PER_AND as u64;
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
        let compiled = self.circuit.compiled();
        let mut used = 0;
        while let Some(seg) = compiled.segments.get(self.seg) {
            let (xor_end, and_end) = (seg.xor_end as usize, seg.and_end as usize);
            let xors = compiled.xors.get(self.xor_pos..xor_end).unwrap_or_default();
            let ands = compiled.ands.get(self.and_pos..and_end).unwrap_or_default();
            let need = ands.len() * TABLE_BYTES_PER_AND;
            let Some(t) = tables.get(used..used + need) else {
                break;
            };
            self.eval_segment(xors, ands, t);
            used += need;
            self.xor_pos = xor_end;
            self.and_pos = and_end;
            self.seg += 1;
        }
        used
    }

    /// Evaluates one segment: its free gates, then its AND gates with one batch of hashes.
    fn eval_segment(&mut self, xors: &[[u32; 3]], ands: &[[u32; 3]], tables: &[u8]) {
        let Self {
            labels,
            blocks,
            hash,
            instance,
            and_pos,
            operands,
            ..
        } = self;
        let labels = labels.as_mut_slice();
        let m = apply_free_xors(labels, xors);
        if ands.is_empty() {
            return;
        }
        let n = ands.len().min(BATCH);
        let j0 = 2 * *and_pos as u64;
        #[cfg(target_arch = "x86_64")]
        if let Some(v) = hash.vaes() {
            let batch = crate::vaes::AndBatch {
                j0,
                instance: *instance,
                delta: 0,
            };
            v.eval_ands(labels, &ands[..n], &batch, tables);
            return;
        }
        let (blocks, operands) = (&mut blocks[..2 * n], &mut operands[..n]);
        let hi = u128::from(*instance) << 64;
        let per_gate = blocks.chunks_exact_mut(2).zip(operands.iter_mut());
        for ((&[a, b, _], (y, op)), j) in ands.iter().zip(per_gate).zip((j0..).step_by(2)) {
            let (la, lb) = (labels[a as usize & m], labels[b as usize & m]);
            y.copy_from_slice(&[
                sigma(la) ^ hi ^ u128::from(j),
                sigma(lb) ^ hi ^ u128::from(j + 1),
            ]);
            *op = [la, lb];
        }
        hash.permute(blocks);
        let per_gate = blocks.chunks_exact(2).zip(operands.iter());
        let per_table = tables.chunks_exact(TABLE_BYTES_PER_AND).zip(ands);
        for (((p, &[la, lb]), (t, &[_, _, o])), j) in per_gate.zip(per_table).zip((j0..).step_by(2))
        {
            let ha = p[0] ^ sigma(la) ^ hi ^ u128::from(j);
            let hb = p[1] ^ sigma(lb) ^ hi ^ u128::from(j + 1);
            let (t_g, t_e) = split_table(t);
            let w_g = ha ^ (t_g & mask(lsb(la)));
            let w_e = hb ^ ((t_e ^ la) & mask(lsb(lb)));
            labels[o as usize & m] = w_g ^ w_e;
        }
    }

    fn check_complete(&self) -> Result<(), Error> {
        if self.seg < self.circuit.segments().len() {
            return Err(Error::MissingTables {
                have: self.and_pos as u64 * TABLE_BYTES_PER_AND as u64
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
        let mut items: Vec<(usize, u128)> = outputs
            .iter()
            .enumerate()
            .map(|(i, &w)| (i, self.labels.get(w as usize).copied().unwrap_or_default()))
            .collect();
        let permute_bits: Vec<bool> = items.iter().map(|&(_, l)| lsb(l)).collect();
        let tags = output_tags(&self.hash, self.instance, &mut items);
        let mut bits = Vec::with_capacity(outputs.len());
        for (i, (&s, tag)) in permute_bits.iter().zip(&tags).enumerate() {
            let (d, expected) = decoding.entry(i).ok_or(Error::BadDecoding)?;
            let expected = if s { &expected[1] } else { &expected[0] };
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
        wipe(&mut self.blocks);
        self.operands.iter_mut().for_each(Zeroize::zeroize);
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
