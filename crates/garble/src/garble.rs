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
//! (as [`crate::aes_circuit`] does). Within a segment the free gates run first (one branch-free
//! XOR loop: INV is an XOR with a slot holding Δ), then its AND gates; on CPUs with VAES the AND
//! gates go to `crate::vaes`, which hashes four gates (16 blocks) per step in 256-bit registers
//! and finishes the half-gates there, else to the portable loop below (same bytes either way).

use zeroize::Zeroize;

use crate::circuit::{apply_free_xors, check_len, Circuit};
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

/// Output-check tags: for each `(i, l)`, the first 8 bytes of `H(l, instance ‖ 2⁶³ + i)`, hashed
/// in one batch. `items` is wiped (it holds labels).
pub(crate) fn output_tags(
    h: &FixedKeyHash,
    instance: u64,
    items: &mut Vec<(usize, u128)>,
) -> Vec<[u8; OUTPUT_TAG_BYTES]> {
    let mut ys: Vec<u128> = items
        .iter()
        .map(|&(i, l)| FixedKeyHash::prepare(l, tweak(instance, OUTPUT_TWEAK | i as u64)))
        .collect();
    let mut ps = ys.clone();
    h.permute(&mut ps);
    let tags = ps
        .iter()
        .zip(&ys)
        .map(|(p, y)| {
            let t = (p ^ y).to_le_bytes();
            let mut out = [0u8; OUTPUT_TAG_BYTES];
            out.copy_from_slice(&t[..OUTPUT_TAG_BYTES]);
            out
        })
        .collect();
    wipe(&mut ys);
    wipe(&mut ps);
    items.iter_mut().for_each(|(_, l)| l.zeroize());
    items.clear();
    tags
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
    /// Zero-label in every storage slot (see `Circuit::compiled`); a power-of-two length, so
    /// slot indices are masked instead of bounds-checked.
    zero: Vec<u128>,
    /// Per AND gate of the open segment (`BATCH` entries): `A⁰`, `B⁰` (their slots may be reused
    /// by the segment's AND outputs).
    operands: Vec<[u128; 2]>,
    /// Next segment of the circuit's schedule, and its first free and AND gate.
    seg: usize,
    xor_pos: usize,
    and_pos: usize,
    /// The open segment's hash blocks, four per AND gate (`4 × BATCH` entries).
    blocks: Vec<u128>,
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
        // Garbler inputs: `Aᵢ ⊕ vᵢ·Δ`; evaluator inputs: PRG blocks `PRG_INPUTS + i` (the PRG blocks
        // of the garbler inputs' positions are not used).
        let g = garbler_inputs.len();
        let mut input_zero = vec![0u128; circuit.inputs()];
        let (gz, ez) = input_zero.split_at_mut(g);
        Prg::new(&label_seed.0).fill(0, gz);
        for (z, &v) in gz.iter_mut().zip(garbler_inputs) {
            *z ^= delta & mask(v);
        }
        prg.fill(PRG_INPUTS + g as u128, ez);
        // A power-of-two length lets the gate loop mask slot indices, which removes bounds checks.
        let compiled = circuit.compiled();
        let mut zero = vec![0u128; (compiled.slots).next_power_of_two()];
        for (z, i) in zero.iter_mut().zip(&input_zero) {
            *z = *i;
        }
        // INV gates are XORs with this slot.
        if let Some(one) = zero.get_mut(compiled.one as usize) {
            *one = delta;
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
            operands: vec![[0; 2]; BATCH],
            seg: 0,
            xor_pos: 0,
            and_pos: 0,
            blocks: vec![0; 4 * BATCH],
        })
    }

    /// Garbles with the portable hash path even where VAES is available (tests compare both).
    #[cfg(test)]
    pub(crate) fn use_portable_hash(&mut self) {
        self.hash = FixedKeyHash::portable();
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
        self.and_pos as u64
    }

    /// Garbles gates until at least `max_and` AND gates (at most one batch more) have been produced
    /// or the circuit ends, appending their tables to `out`. Returns the number of AND gates
    /// written; 0 means the circuit is finished.
    pub fn write_tables(&mut self, out: &mut Vec<u8>, max_and: usize) -> usize {
        let compiled = self.circuit.compiled();
        let limit = max_and.max(1);
        let mut written = 0;
        while written < limit {
            let Some(seg) = compiled.segments.get(self.seg) else {
                break;
            };
            let (xor_end, and_end) = (seg.xor_end as usize, seg.and_end as usize);
            let xors = compiled.xors.get(self.xor_pos..xor_end).unwrap_or_default();
            let ands = compiled.ands.get(self.and_pos..and_end).unwrap_or_default();
            self.garble_segment(xors, ands, out);
            written += ands.len();
            self.xor_pos = xor_end;
            self.and_pos = and_end;
            self.seg += 1;
        }
        written
    }

    /// Garbles one segment: its free gates, then its AND gates with one batch of hashes.
    fn garble_segment(&mut self, xors: &[[u32; 3]], ands: &[[u32; 3]], out: &mut Vec<u8>) {
        let Self {
            zero,
            blocks,
            hash,
            delta,
            instance,
            and_pos,
            operands,
            ..
        } = self;
        let delta = *delta;
        let sigma_delta = sigma(delta);
        let zero = zero.as_mut_slice();
        let m = apply_free_xors(zero, xors);
        if ands.is_empty() {
            return;
        }
        // The j-th AND gate hashes with tweaks `instance ‖ 2j` and `instance ‖ 2j+1`.
        let n = ands.len().min(BATCH);
        let j0 = 2 * *and_pos as u64;
        #[cfg(target_arch = "x86_64")]
        if let Some(v) = hash.vaes() {
            let start = out.len();
            out.resize(start + n * TABLE_BYTES_PER_AND, 0);
            let tables = out.get_mut(start..).unwrap_or_default();
            let batch = crate::vaes::AndBatch {
                j0,
                instance: *instance,
                delta,
            };
            v.garble_ands(zero, &ands[..n], &batch, tables);
            return;
        }
        let (blocks, operands) = (&mut blocks[..4 * n], &mut operands[..n]);
        let hi = u128::from(*instance) << 64;
        let per_gate = blocks.chunks_exact_mut(4).zip(operands.iter_mut());
        for ((&[a, b, _], (y, op)), j) in ands.iter().zip(per_gate).zip((j0..).step_by(2)) {
            let (a0, b0) = (zero[a as usize & m], zero[b as usize & m]);
            // σ is linear: σ(x ⊕ Δ) = σ(x) ⊕ σ(Δ).
            let (ya, yb) = (
                sigma(a0) ^ hi ^ u128::from(j),
                sigma(b0) ^ hi ^ u128::from(j + 1),
            );
            y.copy_from_slice(&[ya, ya ^ sigma_delta, yb, yb ^ sigma_delta]);
            *op = [a0, b0];
        }
        hash.permute(blocks);
        let start = out.len();
        out.resize(start + n * TABLE_BYTES_PER_AND, 0);
        let tables = out.get_mut(start..).unwrap_or_default();
        let per_gate = blocks.chunks_exact(4).zip(operands.iter());
        let per_out = tables.chunks_exact_mut(TABLE_BYTES_PER_AND).zip(ands);
        for (((p, &[a0, b0]), (t, &[_, _, o])), j) in per_gate.zip(per_out).zip((j0..).step_by(2)) {
            // H(x) = π(y) ⊕ y with y = σ(x) ⊕ tweak; the two hashes of a pair differ by σ(Δ).
            let (ya, yb) = (
                sigma(a0) ^ hi ^ u128::from(j),
                sigma(b0) ^ hi ^ u128::from(j + 1),
            );
            let (pa, pb) = (mask(lsb(a0)), mask(lsb(b0)));
            // Generator half-gate (the garbler knows b's permute bit): T_G = H(A⁰) ⊕ H(A¹) ⊕ pb·Δ.
            let t_g = p[0] ^ p[1] ^ sigma_delta ^ (delta & pb);
            let w_g = p[0] ^ ya ^ (t_g & pa);
            // Evaluator half-gate (the evaluator knows b's value): T_E = H(B⁰) ⊕ H(B¹) ⊕ A⁰.
            let hb = p[2] ^ p[3] ^ sigma_delta;
            let t_e = hb ^ a0;
            let w_e = p[2] ^ yb ^ (hb & pb);
            zero[o as usize & m] = w_g ^ w_e;
            let (tg_bytes, te_bytes) = t.split_at_mut(16);
            tg_bytes.copy_from_slice(&t_g.to_le_bytes());
            te_bytes.copy_from_slice(&t_e.to_le_bytes());
        }
    }

    /// The output decoding information; only once every gate is garbled.
    pub fn decoding(&mut self) -> Result<Decoding, Error> {
        if !self.is_done() {
            return Err(Error::NotFinished);
        }
        let outputs = &self.circuit.compiled().outputs;
        let mut items = Vec::with_capacity(2 * outputs.len());
        for (i, &w) in outputs.iter().enumerate() {
            let l0 = self.zero.get(w as usize).copied().unwrap_or_default();
            items.extend_from_slice(&[(i, l0), (i, l0 ^ self.delta)]);
        }
        let tags = output_tags(&self.hash, self.instance, &mut items);
        let mut entries = Vec::with_capacity(outputs.len());
        for (&w, t) in outputs.iter().zip(tags.chunks_exact(2)) {
            let d = lsb(self.zero.get(w as usize).copied().unwrap_or_default());
            let tags = if d { [t[1], t[0]] } else { [t[0], t[1]] };
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
        wipe(&mut self.blocks);
        self.operands.iter_mut().for_each(Zeroize::zeroize);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aes_circuit::{blindbox_circuit_for, blindbox_token_garbler_inputs, Layout};
    use crate::circuit::CircuitBuilder;
    use crate::evaluate::Evaluator;
    use rand::{Rng, SeedableRng};

    struct Run {
        tables: Vec<u8>,
        decoding: Decoding,
        pairs: Vec<LabelPair>,
        garbler_labels: Vec<Label>,
    }

    fn run(c: &Circuit, seed: &GarbleSeed, instance: u64, gb: &[bool], portable: bool) -> Run {
        let mut g = Garbler::new(c, seed, instance, gb).unwrap();
        if portable {
            g.use_portable_hash();
        }
        let mut tables = Vec::new();
        // Odd chunk sizes: segment boundaries land anywhere.
        while g.write_tables(&mut tables, 7) > 0 {}
        Run {
            tables,
            decoding: g.decoding().unwrap(),
            pairs: g.evaluator_input_pairs(),
            garbler_labels: g.garbler_input_labels(),
        }
    }

    fn eval(c: &Circuit, instance: u64, r: &Run, eb: &[bool], portable: bool) -> Vec<bool> {
        let el: Vec<Label> = r.pairs.iter().zip(eb).map(|(p, &b)| p.select(b)).collect();
        let mut e = Evaluator::new(c, instance, &r.garbler_labels, &el).unwrap();
        if portable {
            e.use_portable_hash();
        }
        for chunk in r.tables.chunks(1000) {
            e.feed(chunk).unwrap();
        }
        e.finish(&r.decoding).unwrap()
    }

    /// Both hash paths (VAES where the CPU has it, and the portable one) give byte-identical
    /// garblings and the same evaluations, on random circuits with long runs of independent AND
    /// gates (every group and tail size of the batched kernels) and on the BlindBox circuit.
    #[test]
    fn hash_paths_agree() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(42);
        let mut circuits = vec![blindbox_circuit_for(Layout::Token64).unwrap()];
        for round in 0..12 {
            let (gi, ei) = (rng.gen_range(1..20u32), rng.gen_range(1..20u32));
            let mut b = CircuitBuilder::new(gi, ei);
            let mut wires = b.garbler_wires();
            wires.extend(b.evaluator_wires());
            for _ in 0..rng.gen_range(50..600) {
                let x = wires[rng.gen_range(0..wires.len())];
                let y = wires[rng.gen_range(0..wires.len())];
                let w = match rng.gen_range(0..4) {
                    0 => b.xor(x, y),
                    1 => b.inv(x),
                    // Independent ANDs on older wires: long segments.
                    _ if round % 2 == 0 => {
                        let x = wires[rng.gen_range(0..wires.len().min(40))];
                        b.and(x, y)
                    }
                    _ => b.and(x, y),
                };
                wires.push(w);
            }
            let outs: Vec<_> = (0..rng.gen_range(1..30))
                .map(|_| wires[rng.gen_range(0..wires.len())])
                .collect();
            circuits.push(b.build(&outs).unwrap());
        }
        for (i, c) in circuits.iter().enumerate() {
            let gb: Vec<bool> = if i == 0 {
                blindbox_token_garbler_inputs(&[3; 16], &[4; 16]).to_vec()
            } else {
                (0..c.garbler_inputs()).map(|_| rng.gen()).collect()
            };
            let seed = GarbleSeed::new(rng.gen());
            let instance = rng.gen();
            let fast = run(c, &seed, instance, &gb, false);
            let slow = run(c, &seed, instance, &gb, true);
            assert_eq!(fast.tables, slow.tables, "circuit {i}");
            assert_eq!(fast.decoding, slow.decoding, "circuit {i}");
            for (p, q) in fast.pairs.iter().zip(&slow.pairs) {
                assert_eq!(p.zero.to_bytes(), q.zero.to_bytes());
            }
            for _ in 0..3 {
                let eb: Vec<bool> = (0..c.evaluator_inputs()).map(|_| rng.gen()).collect();
                let want = c.eval(&gb, &eb).unwrap();
                assert_eq!(eval(c, instance, &fast, &eb, false), want, "circuit {i}");
                assert_eq!(eval(c, instance, &fast, &eb, true), want, "circuit {i}");
            }
        }
    }
}
