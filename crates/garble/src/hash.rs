//! Fixed-key AES primitives: the garbling hash and the seed PRG.
//!
//! Hash: `H(x, i) = π(σ(x) ⊕ i) ⊕ σ(x) ⊕ i`, the MMO construction over a linear orthomorphism σ,
//! which Guo, Katz, Wang and Yu ("Efficient and secure multiparty computation from fixed-key block
//! ciphers", IEEE S&P 2020, §7) prove tweakable circular correlation robust (TCCR) for an ideal
//! permutation π: exactly what half-gates with free-XOR needs. π is AES-128 under a fixed public key
//! (hardware AES through the `aes` crate, runtime-detected), σ(xL ‖ xR) = (xL ⊕ xR) ‖ xL on 64-bit
//! halves. Calls are batched ([`FixedKeyHash::permute`]) so the AES pipeline stays full.
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
///
/// The gate loops write the pre-images `y = σ(x) ⊕ i` straight into a `u128` buffer, permute the
/// whole batch in place ([`FixedKeyHash::permute`]) and finish each hash as `π(y) ⊕ y` with `y`
/// recomputed from the operands (three XORs, cheaper than keeping a copy of the batch).
///
/// π runs on VAES (two blocks per instruction, `crate::vaes`) when the CPU has it, else on the
/// `aes` crate (AES-NI one block per instruction, or its constant-time software fallback).
#[derive(Clone)]
pub(crate) struct FixedKeyHash {
    pi: Aes128,
    #[cfg(target_arch = "x86_64")]
    vaes: Option<crate::vaes::Vaes>,
}

impl FixedKeyHash {
    pub(crate) fn new() -> Self {
        Self {
            pi: Aes128::new(&GenericArray::from(FIXED_KEY)),
            #[cfg(target_arch = "x86_64")]
            vaes: crate::vaes::Vaes::new(fixed_schedule()),
        }
    }

    /// The portable path only (tests compare both).
    #[cfg(test)]
    pub(crate) fn portable() -> Self {
        Self {
            pi: Aes128::new(&GenericArray::from(FIXED_KEY)),
            #[cfg(target_arch = "x86_64")]
            vaes: None,
        }
    }

    /// The VAES path, if this CPU has it (the gate loops then hand it whole AND batches).
    #[cfg(target_arch = "x86_64")]
    #[inline]
    pub(crate) fn vaes(&self) -> Option<&crate::vaes::Vaes> {
        self.vaes.as_ref()
    }

    /// `y ← σ(x) ⊕ i`: the pre-image of `H(x, i)`.
    #[inline]
    pub(crate) fn prepare(x: u128, tweak: u128) -> u128 {
        sigma(x) ^ tweak
    }

    /// `b ← π(b)` for every block (its bytes are the little-endian `u128`), in one batch so the
    /// AES pipeline stays full.
    #[inline]
    pub(crate) fn permute(&self, blocks: &mut [u128]) {
        #[cfg(target_arch = "x86_64")]
        if let Some(v) = &self.vaes {
            v.permute(blocks);
            return;
        }
        self.permute_portable(blocks);
    }

    fn permute_portable(&self, blocks: &mut [u128]) {
        let mut tmp = [Block::default(); 32];
        for chunk in blocks.chunks_mut(tmp.len()) {
            let t = &mut tmp[..chunk.len()];
            for (b, &x) in t.iter_mut().zip(chunk.iter()) {
                *b = to_block(x);
            }
            self.pi.encrypt_blocks(t);
            for (x, b) in chunk.iter_mut().zip(t.iter()) {
                *x = from_block(b);
            }
        }
        for b in tmp.iter_mut() {
            b.as_mut_slice().zeroize();
        }
    }

    /// One hash `H(x, i)` (tests; the gates and output checks use the batched form).
    #[cfg(test)]
    pub(crate) fn hash(&self, x: u128, tweak: u128) -> u128 {
        let y = Self::prepare(x, tweak);
        let mut b = [y];
        self.permute(&mut b);
        let h = b[0] ^ y;
        b.zeroize();
        h
    }
}

/// The round keys of [`FIXED_KEY`] as little-endian `u128`s (public; computed once per process).
#[cfg(target_arch = "x86_64")]
fn fixed_schedule() -> [u128; 11] {
    static SCHEDULE: std::sync::OnceLock<[u128; 11]> = std::sync::OnceLock::new();
    *SCHEDULE.get_or_init(|| schedule_le(&FIXED_KEY))
}

/// The AES-128 round keys of `key` as little-endian `u128`s (the form `crate::vaes` takes).
#[cfg(target_arch = "x86_64")]
fn schedule_le(key: &[u8; 16]) -> [u128; 11] {
    let rk = crate::aes_circuit::round_keys(key);
    core::array::from_fn(|i| {
        let mut b = [0u8; 16];
        if let Some(k) = rk.get(16 * i..16 * i + 16) {
            b.copy_from_slice(k);
        }
        u128::from_le_bytes(b)
    })
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
        let h = FixedKeyHash::new();
        let xs: Vec<u128> = (0..37u128).map(|i| i * 0x1234_5678_9abc_def1).collect();
        let mut blocks: Vec<u128> = xs.iter().map(|&x| FixedKeyHash::prepare(x, 5)).collect();
        h.permute(&mut blocks);
        for (x, b) in xs.iter().zip(&blocks) {
            assert_eq!(h.hash(*x, 5), b ^ FixedKeyHash::prepare(*x, 5));
        }
        assert_ne!(h.hash(1, 5), h.hash(1, 6));
    }

    /// π against the `aes` crate block by block, on every batch length up to 70 (all tails of
    /// the 16-block VAES kernel), for both the detected path and the portable one.
    #[test]
    fn permute_paths_match_aes() {
        let reference = Aes128::new(&GenericArray::from(FIXED_KEY));
        for h in [FixedKeyHash::new(), FixedKeyHash::portable()] {
            for n in 0..=70u128 {
                let xs: Vec<u128> = (0..n)
                    .map(|i| (i + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835))
                    .collect();
                let mut got = xs.clone();
                h.permute(&mut got);
                for (x, y) in xs.iter().zip(&got) {
                    let mut b = to_block(*x);
                    reference.encrypt_block(&mut b);
                    assert_eq!(from_block(&b), *y, "batch {n}");
                }
            }
        }
    }

    /// FIPS-197 appendix C.1 through the permutation's code path (with that key).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn vaes_fips197() {
        let key: [u8; 16] = core::array::from_fn(|i| i as u8);
        let Some(v) = crate::vaes::Vaes::new(schedule_le(&key)) else {
            return; // no VAES here: the portable path is what runs (and is tested)
        };
        let pt: [u8; 16] = core::array::from_fn(|i| (i as u8) * 0x11);
        let mut b = [u128::from_le_bytes(pt); 3];
        v.permute(&mut b);
        let ct = [
            0x69, 0xc4, 0xe0, 0xd8, 0x6a, 0x7b, 0x04, 0x30, 0xd8, 0xcd, 0xb7, 0x80, 0x70, 0xb4,
            0xc5, 0x5a,
        ];
        assert_eq!(b, [u128::from_le_bytes(ct); 3]);
    }
}
