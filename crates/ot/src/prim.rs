//! Symmetric primitives: AES-CTR column PRGs, the fixed-key-AES correlation-robust hash, the
//! 128×128 bit-matrix transpose and the GF(2^128) inner product of the consistency check.

use aes::cipher::{BlockEncrypt, KeyInit};
use aes::{Aes128, Block};
use polyval::universal_hash::UniversalHash;
use polyval::Polyval;

/// Blocks processed per call into AES or POLYVAL (keeps buffers small and AES-NI pipelined).
const CHUNK: usize = 512;

/// Expands one base-OT seed into an unbounded bit column: AES-128-CTR keyed by the seed. The
/// counter carries over between batches, so every batch uses fresh pseudorandom bits.
pub(crate) struct ColumnPrg {
    cipher: Aes128,
    counter: u64,
}

impl ColumnPrg {
    pub(crate) fn new(seed: &[u8; 16]) -> Self {
        Self {
            cipher: Aes128::new(seed.into()),
            counter: 0,
        }
    }

    /// Fills `out` with the next `out.len()` pseudorandom 128-bit words.
    pub(crate) fn fill(&mut self, out: &mut [u128]) {
        let mut buf = [Block::default(); CHUNK];
        for words in out.chunks_mut(CHUNK) {
            let blocks = &mut buf[..words.len()];
            for b in blocks.iter_mut() {
                *b = Block::from(u128::from(self.counter).to_le_bytes());
                self.counter = self.counter.wrapping_add(1);
            }
            self.cipher.encrypt_blocks(blocks);
            for (w, b) in words.iter_mut().zip(blocks.iter()) {
                *w = u128::from_le_bytes((*b).into());
            }
        }
    }
}

/// Public fixed AES key of the hash (an ideal permutation once fixed; any public constant works).
const TCCR_KEY: [u8; 16] = *b"mbx-ot/tccr/key1";

/// Tweakable circular correlation-robust hash `H(i, x) = π(π(x) ⊕ i) ⊕ π(x)` with `π` fixed-key
/// AES (Guo–Katz–Wang–Yu 2020). IKNP/KOS outputs are `H(i, q_i)` and `H(i, q_i ⊕ Δ)`: the hash must
/// hide `Δ` although its inputs are correlated by it.
pub(crate) struct Tccr {
    pi: Aes128,
}

impl Tccr {
    pub(crate) fn new() -> Self {
        Self {
            pi: Aes128::new(&TCCR_KEY.into()),
        }
    }

    /// `out[j] = H(tweak(j), input(j))` for `j < out.len()`.
    pub(crate) fn hash_with(
        &self,
        out: &mut [u128],
        input: impl Fn(usize) -> u128,
        tweak: impl Fn(usize) -> u128,
    ) {
        let mut first = [Block::default(); CHUNK];
        let mut second = [Block::default(); CHUNK];
        for (c, words) in out.chunks_mut(CHUNK).enumerate() {
            let base = c * CHUNK;
            let n = words.len();
            for (k, b) in first[..n].iter_mut().enumerate() {
                *b = Block::from(input(base + k).to_le_bytes());
            }
            self.pi.encrypt_blocks(&mut first[..n]);
            for (k, (s, f)) in second[..n].iter_mut().zip(first[..n].iter()).enumerate() {
                let y = u128::from_le_bytes((*f).into());
                *s = Block::from((y ^ tweak(base + k)).to_le_bytes());
            }
            self.pi.encrypt_blocks(&mut second[..n]);
            for ((w, f), s) in words.iter_mut().zip(first.iter()).zip(second.iter()) {
                *w = u128::from_le_bytes((*f).into()) ^ u128::from_le_bytes((*s).into());
            }
        }
    }
}

/// In-place transpose of a 128×128 bit matrix (`a[i]` bit `j` ↔ `a[j]` bit `i`): Eklundh's
/// recursive quadrant swap, 7 rounds of masked shifts, no data-dependent branches.
pub(crate) fn transpose128(a: &mut [u128; 128]) {
    let mut width = 64usize;
    let mut mask: u128 = u128::from(u64::MAX);
    while width != 0 {
        let mut k = 0usize;
        while k < 128 {
            for r in k..k + width {
                let t = ((a[r] >> width) ^ a[r + width]) & mask;
                a[r] ^= t << width;
                a[r + width] ^= t;
            }
            k += 2 * width;
        }
        width >>= 1;
        mask ^= mask << width;
    }
}

/// Turns 128 bit columns of `words` words each into `128 * words` rows of 128 bits.
pub(crate) fn columns_to_rows<C: AsRef<[u128]>>(cols: &[C], words: usize) -> Vec<u128> {
    let mut rows = vec![0u128; words * 128];
    let mut block = [0u128; 128];
    for (w, out) in rows.chunks_exact_mut(128).enumerate() {
        for (dst, col) in block.iter_mut().zip(cols.iter()) {
            *dst = col.as_ref().get(w).copied().unwrap_or(0);
        }
        transpose128(&mut block);
        out.copy_from_slice(&block);
    }
    rows
}

/// `x^128 mod p(x)` in POLYVAL's bit order: POLYVAL's product is `a·b·x^-128`, so multiplying
/// by this constant undoes the Montgomery factor (`dot(a, X128) = a`).
pub(crate) const X128: u128 = 1 | (1 << 121) | (1 << 126) | (1 << 127);

/// POLYVAL's `dot(a, b) = a·b·x^-128` in GF(2^128).
pub(crate) fn dot(a: u128, b: u128) -> u128 {
    let mut p = Polyval::new(&a.to_le_bytes().into());
    p.update(&[b.to_le_bytes().into()]);
    u128::from_le_bytes(p.finalize().into())
}

/// The linear universal hash of the consistency check: POLYVAL with key `h` over `rows`, i.e.
/// `Σ_j rows[j]·χ_j` with `χ_j` distinct powers of `h` (times a fixed non-zero constant).
pub(crate) fn poly_hash(h: u128, rows: impl Iterator<Item = u128>) -> u128 {
    let mut p = Polyval::new(&h.to_le_bytes().into());
    let mut buf = [polyval::Block::default(); CHUNK];
    let mut n = 0usize;
    for r in rows {
        if let Some(slot) = buf.get_mut(n) {
            *slot = r.to_le_bytes().into();
            n += 1;
        }
        if n == CHUNK {
            p.update(&buf);
            n = 0;
        }
    }
    p.update(&buf[..n]);
    u128::from_le_bytes(p.finalize().into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bit(x: u128, i: usize) -> bool {
        (x >> i) & 1 == 1
    }

    #[test]
    fn transpose_matches_naive() {
        let mut a = [0u128; 128];
        let mut s: u128 = 0x0123_4567_89ab_cdef_fedc_ba98_7654_3210;
        for x in a.iter_mut() {
            s = s
                .wrapping_mul(0x2545_f491_4f6c_dd1d_9e37_79b9_7f4a_7c15)
                .wrapping_add(7);
            *x = s;
        }
        let orig = a;
        transpose128(&mut a);
        for (i, row) in a.iter().enumerate() {
            for (j, col) in orig.iter().enumerate() {
                assert_eq!(bit(*row, j), bit(*col, i), "({i},{j})");
            }
        }
    }

    #[test]
    fn x128_undoes_montgomery_factor() {
        for a in [1u128, 2, 0xdead_beef, u128::MAX, 1 << 127] {
            assert_eq!(dot(a, X128), a);
            assert_eq!(dot(X128, a), a);
        }
    }

    #[test]
    fn poly_hash_is_linear() {
        let h = 0x1234_5678_9abc_def0_0fed_cba9_8765_4321u128;
        let a: Vec<u128> = (0..1000u128)
            .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
            .collect();
        let b: Vec<u128> = (0..1000u128).map(|i| i ^ (i << 64) ^ 77).collect();
        let lhs = poly_hash(h, a.iter().zip(&b).map(|(x, y)| x ^ y));
        let rhs = poly_hash(h, a.iter().copied()) ^ poly_hash(h, b.iter().copied());
        assert_eq!(lhs, rhs);
        assert_ne!(
            poly_hash(h, a.iter().copied()),
            poly_hash(h, b.iter().copied())
        );
    }

    #[test]
    fn tccr_depends_on_tweak_and_input() {
        let h = Tccr::new();
        let mut out = [0u128; 3];
        h.hash_with(
            &mut out,
            |j| if j == 2 { 1 } else { 0 },
            |j| if j == 1 { 1 } else { 0 },
        );
        assert_ne!(out[0], out[1]);
        assert_ne!(out[0], out[2]);
    }
}
