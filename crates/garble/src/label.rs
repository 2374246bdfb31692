//! Wire labels and the garbling seed: secret 128-bit values, wiped on drop, compared in constant time.

use subtle::{Choice, ConstantTimeEq};
use zeroize::{Zeroize, ZeroizeOnDrop};

/// Bytes of one wire label.
pub const LABEL_BYTES: usize = 16;

/// One wire label. Its least significant bit is the point-and-permute bit.
#[derive(Clone, Zeroize, ZeroizeOnDrop)]
pub struct Label(pub(crate) u128);

impl Label {
    /// A label from its 16-byte wire form (little endian).
    pub fn from_bytes(bytes: [u8; LABEL_BYTES]) -> Self {
        Self(u128::from_le_bytes(bytes))
    }

    /// The 16-byte wire form.
    pub fn to_bytes(&self) -> [u8; LABEL_BYTES] {
        self.0.to_le_bytes()
    }
}

impl ConstantTimeEq for Label {
    fn ct_eq(&self, other: &Self) -> Choice {
        self.to_bytes().ct_eq(&other.to_bytes())
    }
}

impl core::fmt::Debug for Label {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("Label(..)")
    }
}

/// Both labels of an evaluator input wire: what the garbler offers in the oblivious transfer.
#[derive(Clone, Debug, Zeroize, ZeroizeOnDrop)]
pub struct LabelPair {
    /// The label meaning 0.
    pub zero: Label,
    /// The label meaning 1.
    pub one: Label,
}

impl LabelPair {
    /// The label for `bit`, selected without a branch on `bit`.
    pub fn select(&self, bit: bool) -> Label {
        Label(select(self.zero.0, self.one.0, bit))
    }
}

/// Seed of the garbler's *active* input labels, sent to the evaluator in place of the labels
/// (16 bytes instead of 16 per garbler input bit: 45 KB per BlindBox circuit).
///
/// The garbler draws its active labels `Aᵢ = AES_s(i)` from this seed and sets the zero-labels to
/// `Aᵢ ⊕ vᵢ·Δ` for its input bits `vᵢ`. The evaluator learns exactly what it learns when it is sent
/// the active labels: values independent of Δ and of the garbler's bits (their point-and-permute
/// bits are pseudorandom). Half-gates security (TCCR with secret Δ) allows evaluator-known labels
/// chosen independently of Δ, so nothing else changes.
#[derive(Clone, PartialEq, Eq, Zeroize, ZeroizeOnDrop)]
pub struct LabelSeed(pub(crate) [u8; 16]);

impl LabelSeed {
    pub fn from_bytes(bytes: [u8; 16]) -> Self {
        Self(bytes)
    }

    pub fn to_bytes(&self) -> [u8; 16] {
        self.0
    }

    /// The first `n` active labels.
    pub fn expand(&self, n: usize) -> Vec<Label> {
        let mut raw = vec![0u128; n];
        crate::hash::Prg::new(&self.0).fill(0, &mut raw);
        let labels = raw.iter().map(|&x| Label(x)).collect();
        wipe(&mut raw);
        labels
    }
}

impl core::fmt::Debug for LabelSeed {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("LabelSeed(..)")
    }
}

/// The 128-bit seed all of one garbling's randomness comes from (BlindBox derives it from `k_rand`).
#[derive(Clone, Zeroize, ZeroizeOnDrop)]
pub struct GarbleSeed([u8; 16]);

impl GarbleSeed {
    pub fn new(bytes: [u8; 16]) -> Self {
        Self(bytes)
    }

    pub(crate) fn bytes(&self) -> &[u8; 16] {
        &self.0
    }
}

impl core::fmt::Debug for GarbleSeed {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("GarbleSeed(..)")
    }
}

/// All-ones if `bit`, else zero.
#[inline]
pub(crate) fn mask(bit: bool) -> u128 {
    0u128.wrapping_sub(u128::from(bit))
}

/// `a` if `!bit`, `b` if `bit`, without branching.
#[inline]
pub(crate) fn select(a: u128, b: u128, bit: bool) -> u128 {
    a ^ ((a ^ b) & mask(bit))
}

/// The point-and-permute bit of a label.
#[inline]
pub(crate) fn lsb(x: u128) -> bool {
    x & 1 == 1
}

/// Wipes a label buffer including its spare capacity, element-wise (the `Vec` impl of `zeroize`
/// wipes spare capacity byte by byte, which is slow on the hot path).
pub(crate) fn wipe(v: &mut Vec<u128>) {
    let cap = v.capacity();
    v.resize(cap, 0);
    v.as_mut_slice().zeroize();
    v.clear();
}
