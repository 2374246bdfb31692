//! Boolean circuits: the description the garbler and the evaluator share.
//!
//! Wires are numbered densely: first the garbler's inputs, then the evaluator's inputs, then one
//! wire per gate in gate order. A gate only reads wires numbered below its own output, so the gate
//! list is always in topological order and can be garbled or evaluated in one streaming pass.
//!
//! # Serialized form (`MBXGC1`)
//! ```text
//! "MBXGC1" ‖ varint garbler_inputs ‖ varint evaluator_inputs ‖ varint gates ‖ varint outputs
//!          ‖ gates: op (0 XOR, 1 AND, 2 INV) ‖ varint (out − a) [‖ varint (out − b)]
//!          ‖ outputs: varint wire
//! ```
//! Varints are LEB128 (at most 10 bytes). Gate operands are encoded as backward distances from the
//! gate's own output wire, so most operands fit one or two bytes. The parser checks every count
//! against the bytes that remain before allocating, so it never allocates more than a small
//! multiple of its input and never panics.

use std::sync::OnceLock;

use sha2::{Digest, Sha256};

use crate::error::Error;

/// Magic prefix of a serialized circuit (format version 1).
pub const MAGIC: &[u8; 6] = b"MBXGC1";

/// Largest number of wires a circuit may have (keeps wire ids in `u32` with room to spare).
pub const MAX_WIRES: u64 = 1 << 26;

/// Largest number of input wires. Inputs cost no bytes in the serialized form, so without this
/// bound a 14-byte input could make the parser allocate gigabytes.
pub const MAX_INPUTS: u64 = 1 << 20;

/// A wire of a circuit under construction (its dense index).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Wire(pub(crate) u32);

impl Wire {
    /// The wire's dense index.
    pub fn index(self) -> u32 {
        self.0
    }
}

/// Gate operation. Under free-XOR only `And` costs ciphertexts; `Xor` and `Inv` are free.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Xor = 0,
    And = 1,
    Inv = 2,
}

/// One gate; its output wire is `inputs + position in the gate list`. `b` is unused (0) for `Inv`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gate {
    pub op: Op,
    pub a: u32,
    pub b: u32,
}

/// Gate counts of a circuit, for cost reports (32 bytes of garbled table per AND gate).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GateCounts {
    pub and: usize,
    pub xor: usize,
    pub inv: usize,
}

impl GateCounts {
    /// Bytes of garbled tables with half-gates (two 16-byte ciphertexts per AND gate).
    pub fn table_bytes(&self) -> usize {
        self.and * crate::garble::TABLE_BYTES_PER_AND
    }
}

/// A validated Boolean circuit.
#[derive(Debug, Clone)]
pub struct Circuit {
    garbler_inputs: u32,
    evaluator_inputs: u32,
    gates: Vec<Gate>,
    outputs: Vec<u32>,
    counts: GateCounts,
    /// The gates over reused storage slots (see [`Compiled`]).
    compiled: Compiled,
    /// Cached [`Circuit::digest`] (every transcript hash needs it).
    digest: OnceLock<[u8; 32]>,
}

/// The gates rewritten for the garbler and the evaluator: reordered within each [`Segment`] (its
/// free gates first, then its AND gates, which is still a topological order because no gate of a
/// segment reads an AND output of the same segment) and over reused storage slots (a slot is
/// reused once its wire is dead, so garbling touches a working set of the circuit's width — a few
/// thousand labels for AES — instead of one label per wire).
///
/// Slots: the inputs are in `0..inputs`, slot [`Compiled::one`] (= `inputs`) holds the constant
/// that INV adds (Δ when garbling, 0 when evaluating), so every free gate is an XOR of two slots
/// and the gate loops have no branches. Outputs keep their slots to the end. A gate's output slot
/// never equals one of its operand slots. Every slot index is below `slots`.
///
/// AND gates keep their relative order, so the `j`-th entry of `ands` is the circuit's `j`-th AND
/// gate (its tables and hash tweaks do not depend on this representation).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Compiled {
    /// Free gates `[a, b, out]` (`out ← a ⊕ b`), segment after segment.
    pub(crate) xors: Vec<[u32; 3]>,
    /// AND gates `[a, b, out]` in circuit order.
    pub(crate) ands: Vec<[u32; 3]>,
    /// The segments, as end positions in `xors` and `ands`.
    pub(crate) segments: Vec<Segment>,
    pub(crate) outputs: Vec<u32>,
    /// Slots in use.
    pub(crate) slots: usize,
    /// The constant slot INV gates read.
    pub(crate) one: u32,
}

/// A run of gates in which no gate reads the output of an AND gate of the same run, with at most
/// [`crate::garble::BATCH`] AND gates. The garbler and the evaluator compute its free gates, then
/// hash all its AND gates in one batch, which keeps the AES pipeline full when the circuit lists
/// independent ANDs together. `xor_end` and `and_end` are where it ends in [`Compiled::xors`] and
/// [`Compiled::ands`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Segment {
    pub(crate) xor_end: u32,
    pub(crate) and_end: u32,
}

/// Cuts the gate list into segments: the end (exclusive gate index) of each.
fn schedule(inputs: usize, gates: &[Gate]) -> Vec<usize> {
    let mut pending = vec![false; inputs + gates.len()];
    let mut ends = Vec::new();
    let mut open: Vec<usize> = Vec::with_capacity(crate::garble::BATCH);
    let mut close = |open: &mut Vec<usize>, pending: &mut Vec<bool>, end: usize| {
        for &w in open.iter() {
            pending[w] = false;
        }
        ends.push(end);
        open.clear();
    };
    for (i, g) in gates.iter().enumerate() {
        let reads_open = pending[g.a as usize] || (g.op != Op::Inv && pending[g.b as usize]);
        if reads_open {
            close(&mut open, &mut pending, i);
        }
        if g.op == Op::And {
            pending[inputs + i] = true;
            open.push(inputs + i);
            if open.len() == crate::garble::BATCH {
                close(&mut open, &mut pending, i + 1);
            }
        }
    }
    if !gates.is_empty() {
        close(&mut open, &mut pending, gates.len());
    }
    ends
}

/// Schedules the gates, reorders each segment (free gates, then AND gates) and assigns slots by
/// liveness (last reader in the new order), reusing freed slots last-in first-out for locality.
fn compile(inputs: usize, gates: &[Gate], outputs: &[u32]) -> Compiled {
    const NEVER: usize = usize::MAX;
    const FOREVER: usize = usize::MAX - 1;
    // The new order, as gate indices, and the segment boundaries in it.
    let mut order: Vec<usize> = Vec::with_capacity(gates.len());
    let mut seg_ends: Vec<usize> = Vec::new();
    let mut begin = 0;
    for end in schedule(inputs, gates) {
        let range = gates.get(begin..end).unwrap_or_default();
        let free = range.iter().enumerate().filter(|(_, g)| g.op != Op::And);
        order.extend(free.map(|(i, _)| begin + i));
        let ands = range.iter().enumerate().filter(|(_, g)| g.op == Op::And);
        order.extend(ands.map(|(i, _)| begin + i));
        seg_ends.push(order.len());
        begin = end;
    }
    let wires = inputs + gates.len();
    let mut last_use = vec![NEVER; wires];
    for (pos, &i) in order.iter().enumerate() {
        let g = gates[i];
        last_use[g.a as usize] = pos;
        if g.op != Op::Inv {
            last_use[g.b as usize] = pos;
        }
    }
    for &o in outputs {
        last_use[o as usize] = FOREVER;
    }
    let one = inputs as u32;
    let mut slot_of: Vec<u32> = (0..wires as u32).collect();
    let mut free: Vec<u32> = Vec::new();
    let mut next = one + 1;
    let mut trash: Option<u32> = None;
    let mut c = Compiled {
        one,
        ..Compiled::default()
    };
    let mut seg_ends = seg_ends.into_iter().peekable();
    for (pos, &i) in order.iter().enumerate() {
        let g = gates[i];
        let w = inputs + i;
        let mut alloc = || {
            free.pop().unwrap_or_else(|| {
                next += 1;
                next - 1
            })
        };
        // Dead outputs all go to one slot nobody reads. (Freeing them at once would be wrong: an
        // AND gate's output is written at the end of its segment, after later gates ran.)
        let s = if last_use[w] == NEVER {
            *trash.get_or_insert_with(&mut alloc)
        } else {
            alloc()
        };
        let a = slot_of[g.a as usize];
        let b = if g.op == Op::Inv {
            one
        } else {
            slot_of[g.b as usize]
        };
        match g.op {
            Op::And => c.ands.push([a, b, s]),
            Op::Xor | Op::Inv => c.xors.push([a, b, s]),
        }
        slot_of[w] = s;
        if last_use[g.a as usize] == pos {
            free.push(a);
        }
        if g.op != Op::Inv && g.b != g.a && last_use[g.b as usize] == pos {
            free.push(b);
        }
        if seg_ends.peek() == Some(&(pos + 1)) {
            seg_ends.next();
            c.segments.push(Segment {
                xor_end: c.xors.len() as u32,
                and_end: c.ands.len() as u32,
            });
        }
    }
    c.outputs = outputs.iter().map(|&o| slot_of[o as usize]).collect();
    c.slots = next as usize;
    c
}

/// Equal when the descriptions are equal (everything else is derived from them).
impl PartialEq for Circuit {
    fn eq(&self, other: &Self) -> bool {
        self.garbler_inputs == other.garbler_inputs
            && self.evaluator_inputs == other.evaluator_inputs
            && self.gates == other.gates
            && self.outputs == other.outputs
    }
}

impl Eq for Circuit {}

impl Circuit {
    /// Validates the parts and builds a circuit (the single constructor: builder and parser use it).
    pub fn from_parts(
        garbler_inputs: u32,
        evaluator_inputs: u32,
        gates: Vec<Gate>,
        outputs: Vec<u32>,
    ) -> Result<Self, Error> {
        let inputs = u64::from(garbler_inputs) + u64::from(evaluator_inputs);
        if inputs > MAX_INPUTS {
            return Err(Error::TooLarge("inputs"));
        }
        let total = inputs + gates.len() as u64;
        if total > MAX_WIRES {
            return Err(Error::TooLarge("wires"));
        }
        let mut counts = GateCounts::default();
        for (i, g) in gates.iter().enumerate() {
            let out = inputs + i as u64;
            let check = |w: u32| {
                if u64::from(w) < out {
                    Ok(())
                } else {
                    Err(Error::UndefinedWire {
                        gate: i as u64,
                        wire: u64::from(w),
                    })
                }
            };
            check(g.a)?;
            match g.op {
                Op::Xor => {
                    check(g.b)?;
                    counts.xor += 1;
                }
                Op::And => {
                    check(g.b)?;
                    counts.and += 1;
                }
                Op::Inv => counts.inv += 1,
            }
        }
        for (i, &w) in outputs.iter().enumerate() {
            if u64::from(w) >= total {
                return Err(Error::UndefinedOutput {
                    index: i as u64,
                    wire: u64::from(w),
                });
            }
        }
        let compiled = compile(inputs as usize, &gates, &outputs);
        Ok(Self {
            garbler_inputs,
            evaluator_inputs,
            gates,
            outputs,
            counts,
            compiled,
            digest: OnceLock::new(),
        })
    }

    /// Number of garbler input wires (wires `0..garbler_inputs`).
    pub fn garbler_inputs(&self) -> usize {
        self.garbler_inputs as usize
    }

    /// Number of evaluator input wires (they follow the garbler's).
    pub fn evaluator_inputs(&self) -> usize {
        self.evaluator_inputs as usize
    }

    /// Total input wires.
    pub fn inputs(&self) -> usize {
        self.garbler_inputs() + self.evaluator_inputs()
    }

    /// Total wires (inputs plus one per gate).
    pub fn wires(&self) -> usize {
        self.inputs() + self.gates.len()
    }

    /// The gates in topological order.
    pub fn gates(&self) -> &[Gate] {
        &self.gates
    }

    /// Output wires, in output order.
    pub fn outputs(&self) -> &[u32] {
        &self.outputs
    }

    pub(crate) fn compiled(&self) -> &Compiled {
        &self.compiled
    }

    pub(crate) fn segments(&self) -> &[Segment] {
        &self.compiled.segments
    }

    /// Labels the garbler and evaluator keep in memory at once (wires are stored in reused slots).
    pub fn label_slots(&self) -> usize {
        self.compiled.slots
    }

    /// Gate counts by kind.
    pub fn counts(&self) -> GateCounts {
        self.counts
    }

    /// Cleartext evaluation: the reference the garbled evaluation must agree with.
    pub fn eval(&self, garbler: &[bool], evaluator: &[bool]) -> Result<Vec<bool>, Error> {
        check_len("garbler", self.garbler_inputs(), garbler.len())?;
        check_len("evaluator", self.evaluator_inputs(), evaluator.len())?;
        let mut v = Vec::with_capacity(self.wires());
        v.extend_from_slice(garbler);
        v.extend_from_slice(evaluator);
        for g in &self.gates {
            // Validated in `from_parts`: operands index already-computed wires.
            let a = v[g.a as usize];
            let out = match g.op {
                Op::Xor => a ^ v[g.b as usize],
                Op::And => a & v[g.b as usize],
                Op::Inv => !a,
            };
            v.push(out);
        }
        Ok(self.outputs.iter().map(|&w| v[w as usize]).collect())
    }

    /// The compact serialized form (see the module docs).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(16 + self.gates.len() * 3 + self.outputs.len() * 3);
        out.extend_from_slice(MAGIC);
        put_varint(&mut out, u64::from(self.garbler_inputs));
        put_varint(&mut out, u64::from(self.evaluator_inputs));
        put_varint(&mut out, self.gates.len() as u64);
        put_varint(&mut out, self.outputs.len() as u64);
        let inputs = self.inputs() as u64;
        for (i, g) in self.gates.iter().enumerate() {
            let me = inputs + i as u64;
            out.push(g.op as u8);
            put_varint(&mut out, me - u64::from(g.a));
            if g.op != Op::Inv {
                put_varint(&mut out, me - u64::from(g.b));
            }
        }
        for &w in &self.outputs {
            put_varint(&mut out, u64::from(w));
        }
        out
    }

    /// Parses the serialized form. Never panics; rejects anything [`Circuit::from_parts`] would.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, Error> {
        let rest = bytes
            .strip_prefix(MAGIC.as_slice())
            .ok_or(Error::BadMagic)?;
        let mut r = Reader { buf: rest };
        let g_in = r.varint()?;
        let e_in = r.varint()?;
        let n_gates = r.varint()?;
        let n_out = r.varint()?;
        if g_in.saturating_add(e_in) > MAX_INPUTS {
            return Err(Error::TooLarge("inputs"));
        }
        if g_in.saturating_add(e_in).saturating_add(n_gates) > MAX_WIRES {
            return Err(Error::TooLarge("wires"));
        }
        // Every gate takes at least 2 bytes and every output at least 1: bound allocations by input.
        if n_gates.saturating_mul(2).saturating_add(n_out) > r.buf.len() as u64 {
            return Err(Error::Truncated);
        }
        let inputs = g_in + e_in;
        let mut gates = Vec::with_capacity(n_gates as usize);
        for i in 0..n_gates {
            let me = inputs + i;
            let op = match r.byte()? {
                0 => Op::Xor,
                1 => Op::And,
                2 => Op::Inv,
                x => return Err(Error::BadOpcode(x)),
            };
            let operand = |r: &mut Reader<'_>| -> Result<u32, Error> {
                let d = r.varint()?;
                if d == 0 || d > me {
                    return Err(Error::UndefinedWire {
                        gate: i,
                        wire: me.wrapping_sub(d),
                    });
                }
                u32::try_from(me - d).map_err(|_| Error::TooLarge("wire id"))
            };
            let a = operand(&mut r)?;
            let b = if op == Op::Inv { 0 } else { operand(&mut r)? };
            gates.push(Gate { op, a, b });
        }
        let mut outputs = Vec::with_capacity(n_out as usize);
        for _ in 0..n_out {
            let w = r.varint()?;
            outputs.push(u32::try_from(w).map_err(|_| Error::TooLarge("output wire"))?);
        }
        if !r.buf.is_empty() {
            return Err(Error::TrailingBytes);
        }
        let g_in = u32::try_from(g_in).map_err(|_| Error::TooLarge("inputs"))?;
        let e_in = u32::try_from(e_in).map_err(|_| Error::TooLarge("inputs"))?;
        Self::from_parts(g_in, e_in, gates, outputs)
    }

    /// SHA-256 of the serialized form: binds a garbling transcript to its circuit.
    pub fn digest(&self) -> [u8; 32] {
        *self
            .digest
            .get_or_init(|| Sha256::digest(self.to_bytes()).into())
    }
}

/// Applies a segment's free XOR gates `[a, b, o]` to `slots` (zero labels for the garbler,
/// active labels for the evaluator) and returns the index mask `slots.len() - 1`.
///
/// Slots were assigned by `Circuit::from_parts` below `slots`' (power-of-two) length, so the
/// mask never changes an index; it only spares the bounds checks.
#[inline]
pub(crate) fn apply_free_xors(slots: &mut [u128], xors: &[[u32; 3]]) -> usize {
    let m = slots.len().wrapping_sub(1);
    for &[a, b, o] in xors {
        slots[o as usize & m] = slots[a as usize & m] ^ slots[b as usize & m];
    }
    m
}

pub(crate) fn check_len(what: &'static str, expected: usize, got: usize) -> Result<(), Error> {
    if expected == got {
        Ok(())
    } else {
        Err(Error::InputLength {
            what,
            expected,
            got,
        })
    }
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

struct Reader<'a> {
    buf: &'a [u8],
}

impl Reader<'_> {
    fn byte(&mut self) -> Result<u8, Error> {
        let (&b, rest) = self.buf.split_first().ok_or(Error::Truncated)?;
        self.buf = rest;
        Ok(b)
    }

    fn varint(&mut self) -> Result<u64, Error> {
        let mut v: u64 = 0;
        for shift in (0..70).step_by(7) {
            let b = self.byte()?;
            let bits = u64::from(b & 0x7f);
            if shift == 63 && bits > 1 {
                return Err(Error::BadVarint);
            }
            v |= bits << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(Error::BadVarint)
    }
}

/// Builds a circuit gate by gate. Inputs are declared up front so wire numbers never change.
#[derive(Debug, Clone)]
pub struct CircuitBuilder {
    garbler_inputs: u32,
    evaluator_inputs: u32,
    gates: Vec<Gate>,
}

impl CircuitBuilder {
    /// A builder with the given numbers of garbler and evaluator input wires.
    pub fn new(garbler_inputs: u32, evaluator_inputs: u32) -> Self {
        Self {
            garbler_inputs,
            evaluator_inputs,
            gates: Vec::new(),
        }
    }

    /// The garbler's `i`-th input wire (not checked here; [`CircuitBuilder::build`] validates).
    pub fn garbler_input(&self, i: u32) -> Wire {
        Wire(i)
    }

    /// The evaluator's `i`-th input wire.
    pub fn evaluator_input(&self, i: u32) -> Wire {
        Wire(self.garbler_inputs.wrapping_add(i))
    }

    /// All garbler input wires.
    pub fn garbler_wires(&self) -> Vec<Wire> {
        (0..self.garbler_inputs).map(Wire).collect()
    }

    /// All evaluator input wires.
    pub fn evaluator_wires(&self) -> Vec<Wire> {
        (0..self.evaluator_inputs)
            .map(|i| self.evaluator_input(i))
            .collect()
    }

    fn push(&mut self, op: Op, a: Wire, b: Wire) -> Wire {
        let id = self.garbler_inputs as usize + self.evaluator_inputs as usize + self.gates.len();
        self.gates.push(Gate { op, a: a.0, b: b.0 });
        // Oversized circuits are rejected by `build`; the id saturates instead of wrapping.
        Wire(u32::try_from(id).unwrap_or(u32::MAX))
    }

    /// `a ⊕ b` (free under free-XOR).
    pub fn xor(&mut self, a: Wire, b: Wire) -> Wire {
        self.push(Op::Xor, a, b)
    }

    /// `a ∧ b` (one half-gates AND: 32 bytes of table).
    pub fn and(&mut self, a: Wire, b: Wire) -> Wire {
        self.push(Op::And, a, b)
    }

    /// `¬a` (free).
    pub fn inv(&mut self, a: Wire) -> Wire {
        self.push(Op::Inv, a, Wire(0))
    }

    /// `¬(a ⊕ b)` (free).
    pub fn xnor(&mut self, a: Wire, b: Wire) -> Wire {
        let x = self.xor(a, b);
        self.inv(x)
    }

    /// Counts of the gates added so far.
    pub fn counts(&self) -> GateCounts {
        let mut c = GateCounts::default();
        for g in &self.gates {
            match g.op {
                Op::Xor => c.xor += 1,
                Op::And => c.and += 1,
                Op::Inv => c.inv += 1,
            }
        }
        c
    }

    /// Finishes the circuit with the given outputs, validating every wire reference.
    pub fn build(self, outputs: &[Wire]) -> Result<Circuit, Error> {
        Circuit::from_parts(
            self.garbler_inputs,
            self.evaluator_inputs,
            self.gates,
            outputs.iter().map(|w| w.0).collect(),
        )
    }
}

/// Bits of `bytes`, least significant bit of each byte first (the circuits' input convention).
pub fn bytes_to_bits(bytes: &[u8]) -> Vec<bool> {
    bytes
        .iter()
        .flat_map(|&b| (0..8).map(move |i| (b >> i) & 1 == 1))
        .collect()
}

/// Inverse of [`bytes_to_bits`]; a trailing partial byte is zero-padded.
pub fn bits_to_bytes(bits: &[bool]) -> Vec<u8> {
    bits.chunks(8)
        .map(|c| {
            c.iter()
                .enumerate()
                .fold(0u8, |acc, (i, &b)| acc | (u8::from(b) << i))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> Circuit {
        let mut b = CircuitBuilder::new(2, 1);
        let (x, y, z) = (b.garbler_input(0), b.garbler_input(1), b.evaluator_input(0));
        let t = b.and(x, z);
        let u = b.xor(t, y);
        let v = b.inv(u);
        b.build(&[v, t, z]).unwrap()
    }

    #[test]
    fn eval_and_roundtrip() {
        let c = small();
        assert_eq!(
            c.eval(&[true, false], &[true]).unwrap(),
            vec![false, true, true]
        );
        assert_eq!(
            c.eval(&[true, true], &[false]).unwrap(),
            vec![false, false, false]
        );
        let parsed = Circuit::from_bytes(&c.to_bytes()).unwrap();
        assert_eq!(parsed, c);
        assert_eq!(
            c.counts(),
            GateCounts {
                and: 1,
                xor: 1,
                inv: 1
            }
        );
    }

    #[test]
    fn rejects_forward_reference() {
        let mut b = CircuitBuilder::new(1, 0);
        b.gates.push(Gate {
            op: Op::Xor,
            a: 0,
            b: 1,
        });
        assert_eq!(b.build(&[]), Err(Error::UndefinedWire { gate: 0, wire: 1 }));
        let bad = Circuit::from_parts(1, 0, vec![], vec![1]);
        assert_eq!(bad, Err(Error::UndefinedOutput { index: 0, wire: 1 }));
    }

    #[test]
    fn parser_rejects_malformed() {
        let good = small().to_bytes();
        assert_eq!(Circuit::from_bytes(b"MBXGC0"), Err(Error::BadMagic));
        for cut in 0..good.len() {
            assert!(
                Circuit::from_bytes(&good[..cut]).is_err(),
                "prefix {cut} accepted"
            );
        }
        let mut extra = good.clone();
        extra.push(0);
        assert_eq!(Circuit::from_bytes(&extra), Err(Error::TrailingBytes));
        // Gate 0 (first byte after the four header varints) with opcode 7.
        let mut op = good.clone();
        op[MAGIC.len() + 4] = 7;
        assert_eq!(Circuit::from_bytes(&op), Err(Error::BadOpcode(7)));
        // Backward distance 0 (a gate reading its own output).
        let mut selfref = good.clone();
        selfref[MAGIC.len() + 5] = 0;
        assert!(matches!(
            Circuit::from_bytes(&selfref),
            Err(Error::UndefinedWire { .. })
        ));
        // A huge gate count is refused before any allocation.
        let mut huge = MAGIC.to_vec();
        huge.extend_from_slice(&[0, 0, 0xff, 0xff, 0xff, 0x03, 0]);
        assert_eq!(Circuit::from_bytes(&huge), Err(Error::Truncated));
        // Inputs cost no bytes: their number is bounded on its own (the fuzzer found this).
        let oom = [&MAGIC[..], &[0x81, 0xff, 0xff, 0xff, 0x00, 0, 0, 0]].concat();
        assert_eq!(Circuit::from_bytes(&oom), Err(Error::TooLarge("inputs")));
        let mut long = MAGIC.to_vec();
        long.extend_from_slice(&[0xff; 11]);
        assert_eq!(Circuit::from_bytes(&long), Err(Error::BadVarint));
    }

    #[test]
    fn bits_roundtrip() {
        let bytes = [0x01u8, 0x80, 0x5a];
        let bits = bytes_to_bits(&bytes);
        assert!(bits[0] && !bits[1] && bits[15]);
        assert_eq!(bits_to_bytes(&bits), bytes);
    }
}
