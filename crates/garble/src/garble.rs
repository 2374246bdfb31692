//! The garbler: free-XOR + half-gates (Zahur, Rosulek, Evans, EUROCRYPT 2015).
//!
//! Each wire `w` has a zero-label `W⁰` and one-label `W⁰ ⊕ Δ` with `lsb(Δ) = 1` (point-and-permute).
//! XOR gates are `C⁰ = A⁰ ⊕ B⁰`, INV gates `C⁰ = A⁰ ⊕ Δ`, and every AND gate costs two 16-byte
//! ciphertexts `T_G ‖ T_E` (32 bytes), in AND-gate order: the *garbled tables*. The `j`-th AND gate
//! hashes with tweaks `instance ‖ 2j` and `instance ‖ 2j+1` (high and low 64 bits), so two circuits
//! garbled under one fixed-key π never share a tweak if the caller numbers its instances.
//!
//! Determinism: Δ, the evaluator inputs' zero-labels and the seed of the garbler's active labels
//! ([`LabelSeed`]) come from a PRG on the [`GarbleSeed`]; everything else is computed from them. The
//! same (circuit, seed, instance, garbler inputs) gives byte-identical tables, labels and decoding
//! information, so two honest endpoints produce the same garbled circuit.
//!
//! Streaming: [`Garbler::write_tables`] garbles up to a caller-chosen number of AND gates per call
//! and appends their tables to a buffer the caller can send or hash and then clear, so a circuit is
//! never held in memory as a whole. Gates are hashed in batches of up to [`BATCH`] independent
//! AND gates (the circuit's precomputed schedule closes a batch early when a gate needs an output
//! still in it), which keeps the AES pipeline full when the circuit lists independent ANDs together
//! (as [`crate::aes_circuit`] does).

use zeroize::Zeroize;

use crate::circuit::{check_len, Circuit, Op, SlotGate};
use crate::error::Error;
use crate::hash::{sigma, FixedKeyHash, Prg};
use crate::label::{lsb, mask, wipe, GarbleSeed, Label, LabelPair, LabelSeed};

/// Bytes of garbled table per AND gate with half-gates.
pub const TABLE_BYTES_PER_AND: usize = 32;
/// AND gates hashed per batch (4 AES blocks each when garbling, 2 when evaluating).
pub const BATCH: usize = 64;
/// Bytes of a truncated output-check tag.
pub const OUTPUT_TAG_BYTES: usize = 8;
/// Bytes of decoding information per output wire: decoding bit, then two tags.
pub const DECODE_ENTRY_BYTES: usize = 1 + 2 * OUTPUT_TAG_BYTES;

/// PRG block numbers: Δ, then the active-label seed, then one zero-label per input wire.
const PRG_DELTA: u128 = 0;
const PRG_INPUTS: u128 = 2;

/// Tweak of hash call `idx` of garbling `instance`.
#[inline]
pub(crate) fn tweak(instance: u64, idx: u64) -> u128 {
    (u128::from(instance) << 64) | u128::from(idx)
}

/// Tweak index space of the output checks (disjoint from the gates' `2j`, `2j+1`).
pub(crate) const OUTPUT_TWEAK: u64 = 1 << 63;

/// Output-check tag of output `i` with label `l`: first 8 bytes of `H(l, instance ‖ 2⁶³ + i)`.
pub(crate) fn output_tag(h: &mut FixedKeyHash, instance: u64, i: usize, l: u128) -> [u8; 8] {
    let t = h
        .hash(l, tweak(instance, OUTPUT_TWEAK | i as u64))
        .to_le_bytes();
    let mut out = [0u8; OUTPUT_TAG_BYTES];
    out.copy_from_slice(&t[..OUTPUT_TAG_BYTES]);
    out
}

/// Output decoding information, one entry per output wire.
///
/// Entry `i` holds the decoding bit `d = lsb(Oᵢ⁰)` and the tags of both output labels, placed by
/// their point-and-permute bit: `tags[lsb(Oᵢᵇ)] = H(Oᵢᵇ)[..8]`. The evaluator with label `L` reads
/// `b = lsb(L) ⊕ d` and accepts only if `tags[lsb(L)]` equals `H(L)[..8]` — an output label that
/// is neither of the two (input labels, tables, instance or decoding from a different garbling) is
/// rejected with probability `1 − 2⁻⁶⁴` per output bit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decoding {
    entries: Vec<DecodeEntry>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct DecodeEntry {
    bit: bool,
    tags: [[u8; OUTPUT_TAG_BYTES]; 2],
}

impl Decoding {
    /// Number of outputs covered.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True if there are no outputs.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Wire form: per output, one byte (0/1) then the two tags.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.entries.len() * DECODE_ENTRY_BYTES);
        for e in &self.entries {
            out.push(u8::from(e.bit));
            out.extend_from_slice(&e.tags[0]);
            out.extend_from_slice(&e.tags[1]);
        }
        out
    }

    /// Parses the wire form for a circuit with `outputs` outputs. Never panics.
    pub fn from_bytes(bytes: &[u8], outputs: usize) -> Result<Self, Error> {
        if Some(bytes.len()) != outputs.checked_mul(DECODE_ENTRY_BYTES) {
            return Err(Error::BadDecoding);
        }
        let mut entries = Vec::with_capacity(outputs);
        for chunk in bytes.chunks_exact(DECODE_ENTRY_BYTES) {
            let (&b, tags) = chunk.split_first().ok_or(Error::BadDecoding)?;
            let bit = match b {
                0 => false,
                1 => true,
                _ => return Err(Error::BadDecoding),
            };
            let (t0, t1) = tags.split_at(OUTPUT_TAG_BYTES);
            let t0: [u8; OUTPUT_TAG_BYTES] = t0.try_into().map_err(|_| Error::BadDecoding)?;
            let t1: [u8; OUTPUT_TAG_BYTES] = t1.try_into().map_err(|_| Error::BadDecoding)?;
            entries.push(DecodeEntry {
                bit,
                tags: [t0, t1],
            });
        }
        Ok(Self { entries })
    }

    pub(crate) fn entry(&self, i: usize) -> Option<(bool, &[[u8; OUTPUT_TAG_BYTES]; 2])> {
        self.entries.get(i).map(|e| (e.bit, &e.tags))
    }
}

/// Garbles one circuit, streaming its tables.
pub struct Garbler<'c> {
    circuit: &'c Circuit,
    hash: FixedKeyHash,
    instance: u64,
    delta: u128,
    label_seed: LabelSeed,
    garbler_bits: Vec<bool>,
    /// Zero-labels of the inputs.
    input_zero: Vec<u128>,
    /// Zero-label in every storage slot (see `Circuit::compiled`).
    zero: Vec<u128>,
    /// Per AND gate of the open segment: `A⁰`, `lsb(B⁰)` as a mask, and the output slot.
    operands: Vec<u128>,
    /// Next segment of the circuit's schedule, and its first gate.
    seg: usize,
    pos: usize,
    ands_done: u64,
    ys: Vec<u128>,
}

impl<'c> Garbler<'c> {
    /// Draws Δ, the garbler's active-label seed and the evaluator inputs' zero-labels from `seed`,
    /// and fixes the garbler's input bits (its zero-labels are `Aᵢ ⊕ vᵢ·Δ`, see [`LabelSeed`]).
    /// `instance` numbers the circuits garbled under one fixed-key hash (e.g. the rule-chunk index);
    /// the evaluator must use the same value.
    pub fn new(
        circuit: &'c Circuit,
        seed: &GarbleSeed,
        instance: u64,
        garbler_inputs: &[bool],
    ) -> Result<Self, Error> {
        check_len("garbler", circuit.garbler_inputs(), garbler_inputs.len())?;
        let prg = Prg::new(seed.bytes());
        let mut d = [0u128; 2];
        prg.fill(PRG_DELTA, &mut d);
        let delta = d[0] | 1;
        let label_seed = LabelSeed(d[1].to_le_bytes());
        d.zeroize();
        let mut input_zero = vec![0u128; circuit.inputs()];
        prg.fill(PRG_INPUTS, &mut input_zero);
        for ((z, a), &v) in input_zero
            .iter_mut()
            .zip(label_seed.expand(garbler_inputs.len()))
            .zip(garbler_inputs)
        {
            *z = a.0 ^ (delta & mask(v));
        }
        // A power-of-two length lets the gate loop mask slot indices, which removes bounds checks.
        let mut zero = vec![0u128; circuit.compiled().slots.next_power_of_two()];
        for (z, i) in zero.iter_mut().zip(&input_zero) {
            *z = *i;
        }
        Ok(Self {
            circuit,
            hash: FixedKeyHash::new(),
            instance,
            delta,
            label_seed,
            garbler_bits: garbler_inputs.to_vec(),
            input_zero,
            zero,
            operands: Vec::with_capacity(3 * BATCH),
            seg: 0,
            pos: 0,
            ands_done: 0,
            ys: Vec::with_capacity(4 * BATCH),
        })
    }

    /// What the evaluator needs for the garbler's inputs: the seed of their active labels.
    pub fn garbler_label_seed(&self) -> LabelSeed {
        self.label_seed.clone()
    }

    /// The garbler's active input labels (`garbler_label_seed().expand(n)`).
    pub fn garbler_input_labels(&self) -> Vec<Label> {
        let mut out = Vec::with_capacity(self.garbler_bits.len());
        for (&z, &b) in self.input_zero.iter().zip(&self.garbler_bits) {
            out.push(Label(z ^ (self.delta & mask(b))));
        }
        out
    }

    /// Both labels of every evaluator input wire, in input order: the sender's side of the OTs.
    pub fn evaluator_input_pairs(&self) -> Vec<LabelPair> {
        let g = self.circuit.garbler_inputs();
        let e = self.circuit.evaluator_inputs();
        self.input_zero
            .iter()
            .skip(g)
            .take(e)
            .map(|&z| LabelPair {
                zero: Label(z),
                one: Label(z ^ self.delta),
            })
            .collect()
    }

    /// True once every gate is garbled.
    pub fn is_done(&self) -> bool {
        self.seg >= self.circuit.segments().len()
    }

    /// AND gates garbled so far (= table bytes produced / 32).
    pub fn ands_done(&self) -> u64 {
        self.ands_done
    }

    /// Garbles gates until at least `max_and` AND gates (at most one batch more) have been produced
    /// or the circuit ends, appending their tables to `out`. Returns the number of AND gates
    /// written; 0 means the circuit is finished.
    pub fn write_tables(&mut self, out: &mut Vec<u8>, max_and: usize) -> usize {
        let circuit = self.circuit;
        let limit = max_and.max(1);
        let mut written = 0;
        while written < limit {
            let Some(seg) = circuit.segments().get(self.seg) else {
                break;
            };
            let end = seg.end as usize;
            if let Some(gates) = circuit.compiled().gates.get(self.pos..end) {
                self.garble_segment(gates, out);
            }
            written += seg.ands as usize;
            self.pos = end;
            self.seg += 1;
        }
        written
    }

    /// Garbles one segment: free gates as they come, then its AND gates in one hash batch.
    fn garble_segment(&mut self, gates: &[SlotGate], out: &mut Vec<u8>) {
        let Self {
            zero,
            ys,
            hash,
            delta,
            instance,
            ands_done,
            operands,
            ..
        } = self;
        let delta = *delta;
        let sigma_delta = sigma(delta);
        ys.clear();
        operands.clear();
        let mut j = *ands_done;
        // Slots were assigned by `Circuit::from_parts` within `zero`'s length; a segment never
        // reads its own AND outputs, and AND operands are saved here because their slots may be
        // reused by later gates of the segment.
        let zero = zero.as_mut_slice();
        if zero.is_empty() {
            return;
        }
        let m = zero.len() - 1;
        for g in gates {
            let (a, b, o) = (g.a as usize & m, g.b as usize & m, g.out as usize & m);
            match g.op {
                Op::Xor => zero[o] = zero[a] ^ zero[b],
                Op::Inv => zero[o] = zero[a] ^ delta,
                Op::And => {
                    let (a0, b0) = (zero[a], zero[b]);
                    let (tg, te) = (tweak(*instance, 2 * j), tweak(*instance, 2 * j + 1));
                    // σ is linear: σ(x ⊕ Δ) = σ(x) ⊕ σ(Δ).
                    let (ya, yb) = (FixedKeyHash::prepare(a0, tg), FixedKeyHash::prepare(b0, te));
                    ys.extend_from_slice(&[ya, ya ^ sigma_delta, yb, yb ^ sigma_delta]);
                    operands.extend_from_slice(&[a0, mask(lsb(b0)), o as u128]);
                    j += 1;
                }
            }
        }
        if ys.is_empty() {
            return;
        }
        hash.hash_in_place(ys);
        let n = operands.len() / 3;
        out.reserve(n * TABLE_BYTES_PER_AND);
        for (h, o) in ys.chunks_exact(4).zip(operands.chunks_exact(3)) {
            let (a0, pb, slot) = (o[0], o[1], o[2] as usize & m);
            let pa = mask(lsb(a0));
            let (ha0, ha1, hb0, hb1) = (h[0], h[1], h[2], h[3]);
            // Generator half-gate: the garbler knows b's permute bit.
            let t_g = ha0 ^ ha1 ^ (delta & pb);
            let w_g = ha0 ^ (t_g & pa);
            // Evaluator half-gate: the evaluator knows b's value.
            let t_e = hb0 ^ hb1 ^ a0;
            let w_e = hb0 ^ ((t_e ^ a0) & pb);
            zero[slot] = w_g ^ w_e;
            out.extend_from_slice(&t_g.to_le_bytes());
            out.extend_from_slice(&t_e.to_le_bytes());
        }
        *ands_done += n as u64;
    }

    /// The output decoding information; only once every gate is garbled.
    pub fn decoding(&mut self) -> Result<Decoding, Error> {
        if !self.is_done() {
            return Err(Error::NotFinished);
        }
        let mut entries = Vec::with_capacity(self.circuit.outputs().len());
        for (i, &w) in self.circuit.compiled().outputs.iter().enumerate() {
            let l0 = self.zero[w as usize];
            let d = lsb(l0);
            let t0 = output_tag(&mut self.hash, self.instance, i, l0);
            let t1 = output_tag(&mut self.hash, self.instance, i, l0 ^ self.delta);
            let tags = if d { [t1, t0] } else { [t0, t1] };
            entries.push(DecodeEntry { bit: d, tags });
        }
        Ok(Decoding { entries })
    }
}

impl Drop for Garbler<'_> {
    fn drop(&mut self) {
        self.delta.zeroize();
        wipe(&mut self.zero);
        wipe(&mut self.input_zero);
        self.garbler_bits.zeroize();
        wipe(&mut self.ys);
        wipe(&mut self.operands);
    }
}

/// A whole garbled circuit in memory (convenience for tests and small circuits; the protocol
/// streams with [`Garbler`] instead).
pub struct GarbledCircuit {
    /// Garbled tables, 32 bytes per AND gate in gate order.
    pub tables: Vec<u8>,
    /// Seed of the garbler's active input labels (what is sent).
    pub garbler_label_seed: LabelSeed,
    /// The garbler's active input labels (`garbler_label_seed` expanded).
    pub garbler_labels: Vec<Label>,
    /// Label pairs of the evaluator's inputs (for the OTs).
    pub evaluator_pairs: Vec<LabelPair>,
    /// Output decoding information.
    pub decoding: Decoding,
}

/// Garbles `circuit` in one go.
pub fn garble(
    circuit: &Circuit,
    seed: &GarbleSeed,
    instance: u64,
    garbler_inputs: &[bool],
) -> Result<GarbledCircuit, Error> {
    let mut g = Garbler::new(circuit, seed, instance, garbler_inputs)?;
    let garbler_labels = g.garbler_input_labels();
    let mut tables = Vec::with_capacity(circuit.counts().table_bytes());
    while g.write_tables(&mut tables, usize::MAX) > 0 {}
    Ok(GarbledCircuit {
        tables,
        garbler_label_seed: g.garbler_label_seed(),
        garbler_labels,
        evaluator_pairs: g.evaluator_input_pairs(),
        decoding: g.decoding()?,
    })
}
