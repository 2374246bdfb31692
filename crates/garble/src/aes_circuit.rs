//! AES-128 as a circuit, and the BlindBox rule-encryption circuit built from it.
//!
//! The garbling endpoint knows the key, so it runs the key schedule in the clear and feeds the
//! eleven round keys in as *garbler input wires* (11 × 128 bits). AddRoundKey is then a free XOR
//! with an input wire and the circuit's topology does not depend on the key: it is the 10 rounds
//! only, 160 S-boxes × 32 AND = 5,120 AND gates ([`AES_AND_GATES`]).
//!
//! Bit convention everywhere: block byte `j` (FIPS-197 order), bit `b` (0 = least significant) is
//! input/output bit `8j + b` ([`crate::bytes_to_bits`]).
//!
//! The BlindBox circuit ([`blindbox_circuit`]) evaluates `AES_k(r)` and `AES_{k_RG}(r)` in lock step
//! (so each S-box layer offers the garbler 32 independent S-boxes to batch), compares the second with
//! the evaluator's `tag` (128 XNOR + a 127-AND tree) and ANDs every output bit of `AES_k(r)` with the
//! equality bit (128 AND): a wrong tag gives an all-zero block. Total 10,495 AND gates.
//!
//! [`Layout::Token64`] is the same function for BlindBox's 8-byte chunks (`r = t ‖ 0⁸`): the first
//! round's S-boxes on the zero bytes depend only on the key, so the garbler feeds their outputs in
//! as garbler inputs. 9,983 AND gates (−512), and the circuit itself enforces the zero padding.

use zeroize::Zeroizing;

use crate::circuit::{bits_to_bytes, bytes_to_bits, Circuit, CircuitBuilder, Wire};
use crate::error::Error;
use crate::sbox::{sbox, sbox_byte, BitOps};

/// Bits in one AES block.
pub const BLOCK_BITS: usize = 128;
/// Garbler input bits of one AES-128 instance: 11 round keys.
pub const ROUND_KEY_BITS: usize = 11 * BLOCK_BITS;
/// AND gates of one AES-128 encryption (160 S-boxes × 32).
pub const AES_AND_GATES: usize = 160 * 32;
/// AND gates of the BlindBox circuit: two AES, a 128-bit equality tree (127) and the mask (128).
pub const BLINDBOX_AND_GATES: usize = 2 * AES_AND_GATES + 127 + 128;

/// The eleven AES-128 round keys (176 bytes), expanded in the clear with the constant-time S-box.
pub fn round_keys(key: &[u8; 16]) -> Zeroizing<[u8; 176]> {
    let mut w = Zeroizing::new([0u8; 176]);
    w[..16].copy_from_slice(key);
    let mut rcon = 1u8;
    for i in 4..44 {
        let mut t = [w[4 * i - 4], w[4 * i - 3], w[4 * i - 2], w[4 * i - 1]];
        if i % 4 == 0 {
            t = [
                sbox_byte(t[1]) ^ rcon,
                sbox_byte(t[2]),
                sbox_byte(t[3]),
                sbox_byte(t[0]),
            ];
            rcon = (rcon << 1) ^ (0x1b * (rcon >> 7));
        }
        for j in 0..4 {
            w[4 * i + j] = w[4 * (i - 4) + j] ^ t[j];
        }
    }
    w
}

/// Garbler input bits of [`aes128_circuit`] for key `k`.
pub fn aes128_garbler_inputs(k: &[u8; 16]) -> Zeroizing<Vec<bool>> {
    Zeroizing::new(bytes_to_bits(round_keys(k).as_slice()))
}

/// Garbler input bits of [`blindbox_circuit`]: the round keys of `k`, then those of `k_rg`.
pub fn blindbox_garbler_inputs(k: &[u8; 16], k_rg: &[u8; 16]) -> Zeroizing<Vec<bool>> {
    let mut bits = aes128_garbler_inputs(k);
    bits.extend_from_slice(&aes128_garbler_inputs(k_rg));
    bits
}

/// Evaluator input bits of [`blindbox_circuit`]: the rule chunk block `r`, then its RG tag.
pub fn blindbox_evaluator_inputs(r: &[u8; 16], tag: &[u8; 16]) -> Zeroizing<Vec<bool>> {
    let mut bits = Zeroizing::new(bytes_to_bits(r));
    bits.extend_from_slice(&bytes_to_bits(tag));
    bits
}

/// A 128-bit output back to a block; `None` if `bits` is not 128 long.
pub fn block_from_bits(bits: &[bool]) -> Option<[u8; 16]> {
    if bits.len() != BLOCK_BITS {
        return None;
    }
    bits_to_bytes(bits).try_into().ok()
}

/// AES-128 encryption: garbler inputs are the 11 round keys, evaluator input the block, outputs the
/// ciphertext.
pub fn aes128_circuit() -> Result<Circuit, Error> {
    let mut b = CircuitBuilder::new(ROUND_KEY_BITS as u32, BLOCK_BITS as u32);
    let keys = b.garbler_wires();
    let input = b.evaluator_wires();
    let out = aes_lockstep(&mut b, &[input], &[keys]);
    let outputs: Vec<Wire> = out.into_iter().flatten().collect();
    b.build(&outputs)
}

/// How the BlindBox circuit takes the rule chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Evaluator input: a full 128-bit block `r` (then the 128-bit tag). 10,495 AND gates.
    Block128,
    /// Evaluator input: an 8-byte token `t`, encrypted as the block `t ‖ 0⁸` (what `mbx-blindbox`
    /// uses for keyword keys), then the tag `AES_{k_RG}(t ‖ 0⁸)`. The round-1 S-boxes of the eight
    /// zero bytes depend only on the key, so the garbler substitutes them in the clear: 8 S-boxes
    /// fewer per AES, 9,983 AND gates. The padding is enforced: the evaluator has no wires for it.
    Token64,
}

impl Layout {
    /// Evaluator bits of the rule chunk.
    pub fn chunk_bits(self) -> usize {
        match self {
            Layout::Block128 => 128,
            Layout::Token64 => 64,
        }
    }

    /// AND gates of the circuit.
    pub fn and_gates(self) -> usize {
        match self {
            Layout::Block128 => BLINDBOX_AND_GATES,
            Layout::Token64 => BLINDBOX_TOKEN_AND_GATES,
        }
    }
}

/// AND gates of the [`Layout::Token64`] circuit.
pub const BLINDBOX_TOKEN_AND_GATES: usize = BLINDBOX_AND_GATES - 2 * 8 * 32;

/// The BlindBox rule-preparation circuit `F(r, tag) = AES_k(r)` if `tag = AES_{k_RG}(r)`, else 0¹²⁸,
/// with a 128-bit `r` ([`Layout::Block128`]).
///
/// Garbler inputs: round keys of `k` then of `k_RG` ([`blindbox_garbler_inputs`]); evaluator inputs:
/// `r` then `tag` ([`blindbox_evaluator_inputs`]); 128 outputs.
pub fn blindbox_circuit() -> Result<Circuit, Error> {
    blindbox_circuit_for(Layout::Block128)
}

/// The BlindBox circuit for either [`Layout`].
pub fn blindbox_circuit_for(layout: Layout) -> Result<Circuit, Error> {
    let chunk = layout.chunk_bits();
    let mut b = CircuitBuilder::new(2 * ROUND_KEY_BITS as u32, (chunk + BLOCK_BITS) as u32);
    let g = b.garbler_wires();
    let e = b.evaluator_wires();
    let (k, k_rg) = g.split_at(ROUND_KEY_BITS);
    let (r, tag) = e.split_at(chunk);
    let out = aes_lockstep(
        &mut b,
        &[r.to_vec(), r.to_vec()],
        &[k.to_vec(), k_rg.to_vec()],
    );
    let (enc, check) = match out.as_slice() {
        [enc, check] => (enc.clone(), check.clone()),
        _ => return Err(Error::TooLarge("aes lanes")),
    };
    // Equality bit: AND over XNOR(tag_i, check_i), as a balanced tree (independent ANDs per level).
    let mut level: Vec<Wire> = tag
        .iter()
        .zip(&check)
        .map(|(&t, &c)| b.xnor(t, c))
        .collect();
    while level.len() > 1 {
        let mut next = Vec::with_capacity(level.len().div_ceil(2));
        for pair in level.chunks(2) {
            next.push(match *pair {
                [x, y] => b.and(x, y),
                [x] => x,
                _ => continue,
            });
        }
        level = next;
    }
    let eq = level.first().copied().ok_or(Error::TooLarge("empty tag"))?;
    let outputs: Vec<Wire> = enc.iter().map(|&w| b.and(w, eq)).collect();
    b.build(&outputs)
}

/// Garbler input bits of the [`Layout::Token64`] circuit: like [`blindbox_garbler_inputs`], with
/// bytes 8..16 of each first round key replaced by their S-box values.
pub fn blindbox_token_garbler_inputs(k: &[u8; 16], k_rg: &[u8; 16]) -> Zeroizing<Vec<bool>> {
    let mut bits = Zeroizing::new(Vec::with_capacity(2 * ROUND_KEY_BITS));
    for key in [k, k_rg] {
        let mut rk = round_keys(key);
        for byte in rk[8..16].iter_mut() {
            *byte = sbox_byte(*byte);
        }
        bits.extend_from_slice(&bytes_to_bits(rk.as_slice()));
    }
    bits
}

/// Evaluator input bits of the [`Layout::Token64`] circuit: the token, then the tag on `t ‖ 0⁸`.
pub fn blindbox_token_evaluator_inputs(t: &[u8; 8], tag: &[u8; 16]) -> Zeroizing<Vec<bool>> {
    let mut bits = Zeroizing::new(bytes_to_bits(t));
    bits.extend_from_slice(&bytes_to_bits(tag));
    bits
}

/// Runs the S-box program on many bytes at once: every instruction is emitted for all lanes before
/// the next, so the garbler sees runs of independent AND gates (one batch of hashes per run).
struct Lanes<'a> {
    b: &'a mut CircuitBuilder,
    regs: Vec<Vec<Wire>>,
    lanes: usize,
}

impl Lanes<'_> {
    fn emit(
        &mut self,
        a: usize,
        c: usize,
        f: fn(&mut CircuitBuilder, Wire, Wire) -> Wire,
    ) -> usize {
        let mut out = Vec::with_capacity(self.lanes);
        if let (Some(ra), Some(rc)) = (self.regs.get(a), self.regs.get(c)) {
            for (&x, &y) in ra.iter().zip(rc) {
                out.push(f(self.b, x, y));
            }
        }
        self.regs.push(out);
        self.regs.len() - 1
    }
}

impl BitOps for Lanes<'_> {
    type W = usize;
    fn xor(&mut self, a: usize, b: usize) -> usize {
        self.emit(a, b, CircuitBuilder::xor)
    }
    fn xnor(&mut self, a: usize, b: usize) -> usize {
        self.emit(a, b, CircuitBuilder::xnor)
    }
    fn and(&mut self, a: usize, b: usize) -> usize {
        self.emit(a, b, CircuitBuilder::and)
    }
}

/// SubBytes on a list of bytes (each `[bit0 … bit7]`, least significant first).
fn sub_bytes(b: &mut CircuitBuilder, bytes: &[[Wire; 8]]) -> Vec<[Wire; 8]> {
    // Register i < 8 holds U_i = bit (7 − i) of every lane.
    let regs: Vec<Vec<Wire>> = (0..8)
        .map(|i| bytes.iter().map(|x| x[7 - i]).collect())
        .collect();
    let mut lanes = Lanes {
        b,
        regs,
        lanes: bytes.len(),
    };
    let s = sbox(&mut lanes, [0, 1, 2, 3, 4, 5, 6, 7]);
    let regs = lanes.regs;
    (0..bytes.len())
        .map(|l| core::array::from_fn(|bit| regs[s[7 - bit]][l]))
        .collect()
}

fn xtime(x: [Wire; 8], b: &mut CircuitBuilder) -> [Wire; 8] {
    [
        x[7],
        b.xor(x[0], x[7]),
        x[1],
        b.xor(x[2], x[7]),
        b.xor(x[3], x[7]),
        x[4],
        x[5],
        x[6],
    ]
}

fn xor_byte(b: &mut CircuitBuilder, x: [Wire; 8], y: [Wire; 8]) -> [Wire; 8] {
    core::array::from_fn(|i| b.xor(x[i], y[i]))
}

fn mix_columns(b: &mut CircuitBuilder, s: &mut [[Wire; 8]; 16]) {
    for c in 0..4 {
        let a = [s[4 * c], s[4 * c + 1], s[4 * c + 2], s[4 * c + 3]];
        let t01 = xor_byte(b, a[0], a[1]);
        let t23 = xor_byte(b, a[2], a[3]);
        let t = xor_byte(b, t01, t23);
        for i in 0..4 {
            // b_i = a_i ⊕ (a0 ⊕ a1 ⊕ a2 ⊕ a3) ⊕ xtime(a_i ⊕ a_{i+1})
            let pair = xor_byte(b, a[i], a[(i + 1) % 4]);
            let x = xtime(pair, b);
            let u = xor_byte(b, a[i], t);
            s[4 * c + i] = xor_byte(b, u, x);
        }
    }
}

fn add_round_key(b: &mut CircuitBuilder, s: &mut [[Wire; 8]; 16], key: &[Wire]) {
    for (j, byte) in s.iter_mut().enumerate() {
        for (bit, w) in byte.iter_mut().enumerate() {
            if let Some(&k) = key.get(8 * j + bit) {
                *w = b.xor(*w, k);
            }
        }
    }
}

/// The first 16 bytes of `bits` (missing bytes repeat wire 0; callers only read the ones present).
fn to_bytes(bits: &[Wire]) -> [[Wire; 8]; 16] {
    core::array::from_fn(|j| {
        core::array::from_fn(|bit| bits.get(8 * j + bit).copied().unwrap_or(Wire(0)))
    })
}

/// AES-128 on several (input, round keys) lanes in lock step; returns each lane's 128 output wires.
///
/// If an input has only 64 wires (an 8-byte token `t`, block `t ‖ 0⁸`), key wires 64..128 carry
/// `S(K0[8..16])` instead of `K0[8..16]`: the round-1 S-boxes of the zero bytes depend on the key
/// only, so the garbler computes them in the clear ([`Layout::Token64`]).
fn aes_lockstep(
    b: &mut CircuitBuilder,
    inputs: &[Vec<Wire>],
    keys: &[Vec<Wire>],
) -> Vec<Vec<Wire>> {
    let mut subbed_first = 16;
    let mut states: Vec<[[Wire; 8]; 16]> = Vec::with_capacity(inputs.len());
    for (input, k) in inputs.iter().zip(keys) {
        let live = (input.len() / 8).min(16);
        subbed_first = live;
        let key = to_bytes(k);
        let input = to_bytes(input);
        states.push(core::array::from_fn(|j| {
            if j < live {
                xor_byte(b, input[j], key[j])
            } else {
                key[j]
            }
        }));
    }
    for round in 1..=10 {
        // Round 1 skips the bytes the garbler substituted already.
        let n = if round == 1 { subbed_first } else { 16 };
        let all: Vec<[Wire; 8]> = states.iter().flat_map(|s| s[..n].iter().copied()).collect();
        let subbed = sub_bytes(b, &all);
        for (l, (s, k)) in states.iter_mut().zip(keys).enumerate() {
            let mut sb = *s;
            sb[..n].copy_from_slice(&subbed[n * l..n * l + n]);
            // ShiftRows: row r of column c comes from column c + r.
            *s = core::array::from_fn(|j| {
                let (c, r) = (j / 4, j % 4);
                sb[4 * ((c + r) % 4) + r]
            });
            if round < 10 {
                mix_columns(b, s);
            }
            add_round_key(b, s, &k[BLOCK_BITS * round..BLOCK_BITS * (round + 1)]);
        }
    }
    states
        .iter()
        .map(|s| s.iter().flatten().copied().collect())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use aes::cipher::{BlockEncrypt, KeyInit};
    use rand::{Rng, SeedableRng};

    fn aes_ref(k: &[u8; 16], r: &[u8; 16]) -> [u8; 16] {
        let c = aes::Aes128::new(k.into());
        let mut b = (*r).into();
        c.encrypt_block(&mut b);
        b.into()
    }

    #[test]
    fn key_schedule_fips197_a1() {
        let k = hex_16("2b7e151628aed2a6abf7158809cf4f3c");
        let rk = round_keys(&k);
        assert_eq!(rk[160..176], hex_16("d014f9a8c9ee2589e13f0cc8b6630ca6"));
    }

    fn hex_16(s: &str) -> [u8; 16] {
        core::array::from_fn(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap())
    }

    #[test]
    fn aes_circuit_matches_aes_crate() {
        let c = aes128_circuit().unwrap();
        assert_eq!(c.counts().and, AES_AND_GATES);
        assert_eq!(c.garbler_inputs(), ROUND_KEY_BITS);
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for _ in 0..8 {
            let k: [u8; 16] = rng.gen();
            let r: [u8; 16] = rng.gen();
            let out = c
                .eval(&aes128_garbler_inputs(&k), &bytes_to_bits(&r))
                .unwrap();
            assert_eq!(block_from_bits(&out).unwrap(), aes_ref(&k, &r));
        }
    }

    #[test]
    fn token_layout_matches_padded_block() {
        let c = blindbox_circuit_for(Layout::Token64).unwrap();
        assert_eq!(c.counts().and, BLINDBOX_TOKEN_AND_GATES);
        assert_eq!(c.counts().and, 9_983);
        assert_eq!(c.evaluator_inputs(), 64 + 128);
        let mut rng = rand::rngs::StdRng::seed_from_u64(9);
        for _ in 0..4 {
            let (k, k_rg, t): ([u8; 16], [u8; 16], [u8; 8]) = (rng.gen(), rng.gen(), rng.gen());
            let mut r = [0u8; 16];
            r[..8].copy_from_slice(&t);
            let g = blindbox_token_garbler_inputs(&k, &k_rg);
            let tag = aes_ref(&k_rg, &r);
            let out = c
                .eval(&g, &blindbox_token_evaluator_inputs(&t, &tag))
                .unwrap();
            assert_eq!(block_from_bits(&out).unwrap(), aes_ref(&k, &r));
            // A tag on a block with non-zero padding (valid for the 128-bit layout) is refused.
            let mut r2 = r;
            r2[15] = 1;
            let out = c
                .eval(
                    &g,
                    &blindbox_token_evaluator_inputs(&t, &aes_ref(&k_rg, &r2)),
                )
                .unwrap();
            assert_eq!(block_from_bits(&out).unwrap(), [0u8; 16]);
            // Garbler inputs of the 128-bit layout do not fit this circuit's first round.
            let plain = blindbox_garbler_inputs(&k, &k_rg);
            let out = c
                .eval(&plain, &blindbox_token_evaluator_inputs(&t, &tag))
                .unwrap();
            assert_ne!(block_from_bits(&out).unwrap(), aes_ref(&k, &r));
        }
    }

    #[test]
    fn blindbox_circuit_checks_tag() {
        let c = blindbox_circuit().unwrap();
        assert_eq!(c.counts().and, BLINDBOX_AND_GATES);
        assert_eq!(c.counts().and, 10_495);
        let mut rng = rand::rngs::StdRng::seed_from_u64(8);
        for _ in 0..4 {
            let (k, k_rg, r): ([u8; 16], [u8; 16], [u8; 16]) = (rng.gen(), rng.gen(), rng.gen());
            let g = blindbox_garbler_inputs(&k, &k_rg);
            let good = aes_ref(&k_rg, &r);
            let out = c.eval(&g, &blindbox_evaluator_inputs(&r, &good)).unwrap();
            assert_eq!(block_from_bits(&out).unwrap(), aes_ref(&k, &r));
            // One flipped tag bit (any position) gives all zero.
            let mut bad = good;
            bad[rng.gen_range(0..16)] ^= 1 << rng.gen_range(0..8);
            let out = c.eval(&g, &blindbox_evaluator_inputs(&r, &bad)).unwrap();
            assert_eq!(block_from_bits(&out).unwrap(), [0u8; 16]);
            // A tag under the wrong key (k instead of k_RG) is refused too.
            let out = c
                .eval(&g, &blindbox_evaluator_inputs(&r, &aes_ref(&k, &r)))
                .unwrap();
            assert_eq!(block_from_bits(&out).unwrap(), [0u8; 16]);
        }
    }
}
