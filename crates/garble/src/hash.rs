//! Fixed-key AES primitives: the garbling hash and the seed PRG.
//!
//! Hash: `H(x, i) = π(σ(x) ⊕ i) ⊕ σ(x) ⊕ i`, the MMO construction over a linear orthomorphism σ,
//! which Guo, Katz, Wang and Yu ("Efficient and secure multiparty computation from fixed-key block
//! ciphers", IEEE S&P 2020, §7) prove tweakable circular correlation robust (TCCR) for an ideal
//! permutation π: exactly what half-gates with free-XOR needs. π is AES-128 under a fixed public key
//! (hardware AES through the `aes` crate, runtime-detected), σ(xL ‖ xR) = (xL ⊕ xR) ‖ xL on 64-bit
//! halves. Calls are batched ([`FixedKeyHash::hash_in_place`]) so the AES pipeline stays full.
//!
//! PRG: AES-128 keyed with the 128-bit garbling seed in counter mode. Deterministic: the same seed
//! gives the same Δ and input labels, so two honest garblers produce byte-identical circuits.

use aes::cipher::{generic_array::GenericArray, BlockEncrypt, KeyInit};
use aes::{Aes128, Block};
use zeroize::Zeroize;

/// The fixed public key of π (the first hexadecimal digits of π: nothing up our sleeve).
const FIXED_KEY: [u8; 16] = [
    0x24, 0x3f, 0x6a, 0x88, 0x85, 0xa3, 0x08, 0xd3, 0x13, 0x19, 0x8a, 0x2e, 0x03, 0x70, 0x73, 0x44,
];

#[inline]
pub(crate) fn sigma(x: u128) -> u128 {
    let hi = x >> 64;
    let lo = x & u128::from(u64::MAX);
    ((hi ^ lo) << 64) | hi
}

#[inline]
fn to_block(x: u128) -> Block {
    GenericArray::from(x.to_le_bytes())
}

#[inline]
fn from_block(b: &Block) -> u128 {
    let mut a = [0u8; 16];
    a.copy_from_slice(b.as_slice());
    u128::from_le_bytes(a)
}

/// The TCCR hash over fixed-key AES.
#[derive(Clone)]
pub(crate) struct FixedKeyHash {
    pi: Aes128,
    scratch: Vec<Block>,
}

impl FixedKeyHash {
    pub(crate) fn new() -> Self {
        Self {
            pi: Aes128::new(&GenericArray::from(FIXED_KEY)),
            scratch: Vec::new(),
        }
    }

    /// `y ← σ(x) ⊕ i`: the caller prepares the pre-images, then calls [`Self::hash_in_place`].
    #[inline]
    pub(crate) fn prepare(x: u128, tweak: u128) -> u128 {
        sigma(x) ^ tweak
    }

    /// `y ← π(y) ⊕ y` for every prepared `y`, in one batch.
    pub(crate) fn hash_in_place(&mut self, ys: &mut [u128]) {
        self.scratch.clear();
        self.scratch.extend(ys.iter().map(|&y| to_block(y)));
        self.pi.encrypt_blocks(&mut self.scratch);
        for (y, b) in ys.iter_mut().zip(&self.scratch) {
            *y ^= from_block(b);
        }
    }

    /// One hash (for the few output checks; gates use the batched form).
    pub(crate) fn hash(&mut self, x: u128, tweak: u128) -> u128 {
        let mut y = [Self::prepare(x, tweak)];
        self.hash_in_place(&mut y);
        y[0]
    }
}

impl Drop for FixedKeyHash {
    fn drop(&mut self) {
        // The scratch blocks held hash pre-images and outputs of labels.
        for b in self.scratch.iter_mut() {
            b.as_mut_slice().zeroize();
        }
    }
}

/// AES-CTR under the garbling seed. Its key schedule is wiped on drop (`aes/zeroize`).
pub(crate) struct Prg {
    cipher: Aes128,
}

impl Prg {
    pub(crate) fn new(seed: &[u8; 16]) -> Self {
        Self {
            cipher: Aes128::new(&GenericArray::from(*seed)),
        }
    }

    /// Fills `out[i]` with block number `start + i`.
    pub(crate) fn fill(&self, start: u128, out: &mut [u128]) {
        let mut blocks: Vec<Block> = (0..out.len() as u128)
            .map(|i| to_block(start + i))
            .collect();
        self.cipher.encrypt_blocks(&mut blocks);
        for (o, b) in out.iter_mut().zip(&blocks) {
            *o = from_block(b);
        }
        for b in blocks.iter_mut() {
            b.as_mut_slice().zeroize();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sigma_is_linear_orthomorphism() {
        let (a, b) = (
            0x0123_4567_89ab_cdef_1122_3344_5566_7788u128,
            0xdead_beef_u128 << 70,
        );
        assert_eq!(sigma(a ^ b), sigma(a) ^ sigma(b));
        // σ(x) ⊕ x is also a permutation: σ(x) ⊕ x = xR ‖ (xL ⊕ xR) is injective.
        assert_ne!(sigma(a) ^ a, sigma(b) ^ b);
    }

    #[test]
    fn batch_equals_single() {
        let mut h = FixedKeyHash::new();
        let xs: Vec<u128> = (0..37u128).map(|i| i * 0x1234_5678_9abc_def1).collect();
        let mut ys: Vec<u128> = xs.iter().map(|&x| FixedKeyHash::prepare(x, 5)).collect();
        h.hash_in_place(&mut ys);
        for (x, y) in xs.iter().zip(&ys) {
            assert_eq!(h.hash(*x, 5), *y);
        }
        assert_ne!(h.hash(1, 5), h.hash(1, 6));
    }
}
