//! The garbling hash on VAES (x86_64): the crate's one module with `unsafe`.
//!
//! Garbling hashes four blocks per AND gate (evaluation two) under one fixed, public AES key. The
//! `aes` crate runs AES-NI on one block per 128-bit register; VAES (`VAESENC` on 256-bit
//! registers) does two blocks per instruction, which doubles the AES throughput on CPUs that have
//! it (Intel Ice Lake and later, AMD Zen 3 and later). Three entry points:
//! * [`Vaes::permute`]: π on a batch of blocks, sixteen at a time (eight independent registers,
//!   enough to hide `VAESENC`'s latency);
//! * [`Vaes::garble_ands`]: a whole segment of independent AND gates, four gates per step (a
//!   gate's `[y_A, y_A ⊕ σ(Δ)]` and `[y_B, y_B ⊕ σ(Δ)]` are two registers), with σ, the tweaks and
//!   the half-gates computed in registers too; the labels and tables it writes are those of the
//!   portable loop in `Garbler::garble_segment`;
//! * [`Vaes::eval_ands`]: the same for the evaluator, eight gates (`[y_A, y_B]` each) per step.
//!
//! Why `unsafe`, and why it is sound:
//! * Intrinsics used only after run-time detection must live in `#[target_feature]` functions,
//!   and calling those needs `unsafe`. A [`Vaes`] can only be constructed after
//!   `is_x86_feature_detected!` returned true for `vaes`, `avx2` and `aes`, so holding one proves
//!   the features are there; every `unsafe` block outside the kernels is a call of a
//!   `#[target_feature(enable = "avx2,vaes,aes")]` function through a `Vaes`.
//! * Memory: every load and store goes through a Rust reference of exactly the accessed size —
//!   `&u128` / `&mut u128` for a label slot (16 bytes; slots are indexed with safe, checked
//!   indexing), `&[u8; 32]` / `&mut [u8; 32]` for one gate's table, and 32 bytes at
//!   `blocks.as_ptr().add(2 * i)`, `i < 8`, of a `&mut [u128; 16]`. The references make the bytes
//!   valid (and exclusively borrowed for stores); the unaligned load/store intrinsics need no
//!   alignment. Round keys and tweaks enter registers by value (`_mm_set_epi64x`).
//! * The kernels read all operands of a group before writing any output, and a segment's AND
//!   gates never read one another's outputs (`Circuit`'s schedule), so grouping gates changes no
//!   value.
//! * Off x86_64 the module is not compiled; on CPUs without VAES it is not called. Either way
//!   the portable path runs.
//!
//! Not secret: the key is the public fixed key of the garbling hash, so the schedule is not wiped.
//! Labels live in the callers' buffers, which the callers wipe; register and stack temporaries are
//! not wiped (as in the portable code).
//!
//! Tests: π equals the `aes` crate on batches of every length 0..=70 and on FIPS-197's vector
//! (`hash.rs`); garbling and evaluation with this path give byte-identical tables, decodings and
//! outputs to the portable path on random circuits and the BlindBox circuit (`garble.rs`), and the
//! known-answer digest in `tests/garbling.rs` pins the bytes.

use core::arch::x86_64::{
    __m128i, __m256i, _mm256_aesenc_epi128, _mm256_aesenclast_epi128, _mm256_broadcastsi128_si256,
    _mm256_castsi256_si128, _mm256_extracti128_si256, _mm256_inserti128_si256, _mm256_loadu_si256,
    _mm256_set_m128i, _mm256_setzero_si256, _mm256_storeu_si256, _mm256_xor_si256, _mm_and_si128,
    _mm_loadu_si128, _mm_set_epi64x, _mm_setzero_si128, _mm_shuffle_epi32, _mm_slli_si128,
    _mm_storeu_si128, _mm_sub_epi64, _mm_xor_si128,
};

/// Blocks per kernel call.
const CHUNK: usize = 16;

/// π under a schedule, on VAES. Exists only if the CPU has VAES, AVX2 and AES-NI.
#[derive(Clone)]
pub(crate) struct Vaes {
    /// Round keys (little-endian `u128` = the block's bytes in order).
    rk: [u128; 11],
}

impl Vaes {
    /// `None` when the CPU lacks VAES, AVX2 or AES-NI. `rk` is the expanded key schedule.
    pub(crate) fn new(rk: [u128; 11]) -> Option<Self> {
        if std::arch::is_x86_feature_detected!("vaes")
            && std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("aes")
        {
            Some(Self { rk })
        } else {
            None
        }
    }

    /// `b ← AES(b)` for every block (a block's bytes are its little-endian `u128`).
    pub(crate) fn permute(&self, blocks: &mut [u128]) {
        let mut chunks = blocks.chunks_exact_mut(CHUNK);
        for c in &mut chunks {
            if let Ok(c) = <&mut [u128; CHUNK]>::try_from(c) {
                // SAFETY: a `Vaes` exists only after VAES, AVX2 and AES-NI were detected (`new`).
                unsafe { encrypt16(&self.rk, c) };
            }
        }
        let rest = chunks.into_remainder();
        if !rest.is_empty() {
            let mut tmp = [0u128; CHUNK];
            if let Some(t) = tmp.get_mut(..rest.len()) {
                t.copy_from_slice(rest);
            }
            // SAFETY: as above.
            unsafe { encrypt16(&self.rk, &mut tmp) };
            if let Some(t) = tmp.get(..rest.len()) {
                rest.copy_from_slice(t);
            }
            zeroize::Zeroize::zeroize(&mut tmp);
        }
    }
}

/// # Safety
/// The CPU must support AVX2 (SSE2 is part of x86_64).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn broadcast(k: u128) -> __m256i {
    _mm256_broadcastsi128_si256(from_u128(k))
}

/// # Safety
/// The CPU must support SSE2 (always on x86_64).
#[inline]
#[target_feature(enable = "sse2")]
unsafe fn from_u128(x: u128) -> __m128i {
    _mm_set_epi64x((x >> 64) as u64 as i64, x as u64 as i64)
}

/// The expanded schedule, each round key in both lanes.
///
/// # Safety
/// The CPU must support AVX2.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn schedule(rk: &[u128; 11]) -> [__m256i; 11] {
    core::array::from_fn(|i| broadcast(rk[i]))
}

/// AES-128 on `N` two-block registers in lock step, in place.
///
/// # Safety
/// The CPU must support VAES, AVX2 and AES-NI.
#[inline]
#[target_feature(enable = "avx2,vaes,aes")]
unsafe fn aes<const N: usize>(k: &[__m256i; 11], s: &mut [__m256i; N]) {
    for s in s.iter_mut() {
        *s = _mm256_xor_si256(*s, k[0]);
    }
    for k in &k[1..10] {
        for s in s.iter_mut() {
            *s = _mm256_aesenc_epi128(*s, *k);
        }
    }
    for s in s.iter_mut() {
        *s = _mm256_aesenclast_epi128(*s, k[10]);
    }
}

/// AES-128 on sixteen blocks in place, as eight two-block registers in lock step.
///
/// # Safety
/// The CPU must support VAES, AVX2 and AES-NI.
#[target_feature(enable = "avx2,vaes,aes")]
unsafe fn encrypt16(rk: &[u128; 11], blocks: &mut [u128; CHUNK]) {
    let k = schedule(rk);
    let p = blocks.as_mut_ptr();
    let mut s = [k[0]; 8];
    for (i, s) in s.iter_mut().enumerate() {
        // SAFETY: `2 * i + 2 <= 16`, so the 32 bytes at `p + 2i` lie inside `*blocks`.
        *s = unsafe { _mm256_loadu_si256(p.add(2 * i).cast::<__m256i>()) };
    }
    aes(&k, &mut s);
    for (i, s) in s.iter().enumerate() {
        // SAFETY: as for the loads; `blocks` is borrowed mutably, nothing else aliases it.
        unsafe { _mm256_storeu_si256(p.add(2 * i).cast::<__m256i>(), *s) };
    }
}

/// A label from its slot (16 bytes behind a reference: valid, no alignment needed).
///
/// # Safety
/// The CPU must support SSE2 (always on x86_64).
#[inline]
#[target_feature(enable = "sse2")]
unsafe fn load(x: &u128) -> __m128i {
    // SAFETY: `x` points to 16 readable bytes; the load is unaligned.
    unsafe { _mm_loadu_si128((x as *const u128).cast::<__m128i>()) }
}

/// # Safety
/// The CPU must support SSE2 (always on x86_64).
#[inline]
#[target_feature(enable = "sse2")]
unsafe fn store(x: &mut u128, v: __m128i) {
    // SAFETY: `x` points to 16 writable, exclusively borrowed bytes; the store is unaligned.
    unsafe { _mm_storeu_si128((x as *mut u128).cast::<__m128i>(), v) }
}

/// Stores the two ciphertexts of one AND gate, `T_G ‖ T_E`.
///
/// # Safety
/// The CPU must support AVX2.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn store_table(t: &mut [u8; 32], t_g: __m128i, t_e: __m128i) {
    // SAFETY: `t` points to 32 writable, exclusively borrowed bytes; the store is unaligned.
    unsafe { _mm256_storeu_si256(t.as_mut_ptr().cast::<__m256i>(), _mm256_set_m128i(t_e, t_g)) }
}

/// # Safety
/// The CPU must support AVX2.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn load_table(t: &[u8; 32]) -> __m256i {
    // SAFETY: `t` points to 32 readable bytes; the load is unaligned.
    unsafe { _mm256_loadu_si256(t.as_ptr().cast::<__m256i>()) }
}

/// σ(xL ‖ xR) = (xL ⊕ xR) ‖ xL (`crate::hash::sigma`): lanes `[lo, hi]` → `[hi, hi ⊕ lo]`.
///
/// # Safety
/// The CPU must support SSE2 (always on x86_64).
#[inline]
#[target_feature(enable = "sse2")]
unsafe fn sigma(x: __m128i) -> __m128i {
    _mm_xor_si128(_mm_shuffle_epi32::<0xee>(x), _mm_slli_si128::<8>(x))
}

/// The tweak `instance ‖ j` (`crate::garble::tweak`).
///
/// # Safety
/// The CPU must support SSE2 (always on x86_64).
#[inline]
#[target_feature(enable = "sse2")]
unsafe fn tweak(instance: u64, j: u64) -> __m128i {
    _mm_set_epi64x(instance as i64, j as i64)
}

/// All-ones if the label's point-and-permute bit (bit 0) is set, else zero.
///
/// # Safety
/// The CPU must support SSE2 (always on x86_64).
#[inline]
#[target_feature(enable = "sse2")]
unsafe fn lsb_mask(x: __m128i) -> __m128i {
    let bit = _mm_and_si128(x, _mm_set_epi64x(0, 1));
    _mm_shuffle_epi32::<0x44>(_mm_sub_epi64(_mm_setzero_si128(), bit))
}

/// What the batched AND kernels need besides the gates.
pub(crate) struct AndBatch {
    /// Tweak index of the first gate's first hash (`2j` for AND gate `j`).
    pub(crate) j0: u64,
    pub(crate) instance: u64,
    /// The garbler's Δ (ignored when evaluating).
    pub(crate) delta: u128,
}

impl Vaes {
    /// Garbles AND gates `[a, b, out]` over the zero-label slots `zero` (a power-of-two length;
    /// slot indices are masked with `len − 1`), writing their tables `T_G ‖ T_E` to `tables`
    /// (32 bytes per gate). Same results as the portable loop in `Garbler::garble_segment`.
    /// The gates must be independent: no gate reads another's output slot.
    pub(crate) fn garble_ands(
        &self,
        zero: &mut [u128],
        ands: &[[u32; 3]],
        batch: &AndBatch,
        tables: &mut [u8],
    ) {
        let (tables, _) = tables.as_chunks_mut::<32>();
        let mut j = batch.j0;
        let mut gates = ands.chunks_exact(4).zip(tables.chunks_exact_mut(4));
        for (g, t) in &mut gates {
            if let (Ok(g), Ok(t)) = (
                <&[[u32; 3]; 4]>::try_from(g),
                <&mut [[u8; 32]; 4]>::try_from(t),
            ) {
                // SAFETY: a `Vaes` exists only after VAES, AVX2 and AES-NI were detected (`new`).
                unsafe { garble_group::<4, 8>(&self.rk, zero, g, t, j, batch) };
            }
            j += 8;
        }
        let rest = ands.len() / 4 * 4;
        let gates = ands.get(rest..).unwrap_or_default();
        let tables = tables.get_mut(rest..).unwrap_or_default();
        for (g, t) in gates.iter().zip(tables.iter_mut()) {
            // SAFETY: as above.
            unsafe {
                garble_group::<1, 2>(&self.rk, zero, &[*g], core::array::from_mut(t), j, batch)
            };
            j += 2;
        }
    }

    /// Evaluates AND gates `[a, b, out]` over the label slots `labels` (a power-of-two length)
    /// with their tables (32 bytes per gate). Same results as the portable loop in
    /// `Evaluator::eval_segment`. The gates must be independent.
    pub(crate) fn eval_ands(
        &self,
        labels: &mut [u128],
        ands: &[[u32; 3]],
        batch: &AndBatch,
        tables: &[u8],
    ) {
        let (tables, _) = tables.as_chunks::<32>();
        let mut j = batch.j0;
        let mut gates = ands.chunks_exact(8).zip(tables.chunks_exact(8));
        for (g, t) in &mut gates {
            if let (Ok(g), Ok(t)) = (<&[[u32; 3]; 8]>::try_from(g), <&[[u8; 32]; 8]>::try_from(t)) {
                // SAFETY: a `Vaes` exists only after VAES, AVX2 and AES-NI were detected (`new`).
                unsafe { eval_group(&self.rk, labels, g, t, j, batch.instance) };
            }
            j += 16;
        }
        let rest = ands.len() / 8 * 8;
        let gates = ands.get(rest..).unwrap_or_default();
        let tables = tables.get(rest..).unwrap_or_default();
        for (g, t) in gates.iter().zip(tables.iter()) {
            // SAFETY: as above.
            unsafe {
                eval_group::<1>(
                    &self.rk,
                    labels,
                    &[*g],
                    core::array::from_ref(t),
                    j,
                    batch.instance,
                )
            };
            j += 2;
        }
    }
}

/// Garbles `G` independent AND gates: `2G` registers `[y, y ⊕ σ(Δ)]` (for A and for B) through
/// AES in lock step, then the half-gates of each.
///
/// # Safety
/// The CPU must support VAES, AVX2 and AES-NI.
#[target_feature(enable = "avx2,vaes,aes")]
unsafe fn garble_group<const G: usize, const N: usize>(
    rk: &[u128; 11],
    zero: &mut [u128],
    gates: &[[u32; 3]; G],
    tables: &mut [[u8; 32]; G],
    j0: u64,
    batch: &AndBatch,
) {
    const { assert!(N == 2 * G) };
    let m = zero.len().wrapping_sub(1);
    let k = schedule(rk);
    let delta = from_u128(batch.delta);
    // [0, σ(Δ)]: the second hash of each pair is of x ⊕ Δ, and σ(x ⊕ Δ) = σ(x) ⊕ σ(Δ).
    let sd = _mm256_inserti128_si256::<1>(_mm256_setzero_si256(), sigma(delta));
    let mut ops = [[_mm_setzero_si128(); 2]; G];
    // Registers 2i and 2i + 1: gate i's `[y_A, y_A ⊕ σ(Δ)]` and `[y_B, y_B ⊕ σ(Δ)]`.
    let mut y = [_mm256_setzero_si256(); N];
    let mut j = j0;
    for ((g, op), y) in gates.iter().zip(ops.iter_mut()).zip(y.chunks_exact_mut(2)) {
        let a0 = load(&zero[g[0] as usize & m]);
        let b0 = load(&zero[g[1] as usize & m]);
        let ya = _mm_xor_si128(sigma(a0), tweak(batch.instance, j));
        let yb = _mm_xor_si128(sigma(b0), tweak(batch.instance, j + 1));
        y[0] = _mm256_xor_si256(_mm256_broadcastsi128_si256(ya), sd);
        y[1] = _mm256_xor_si256(_mm256_broadcastsi128_si256(yb), sd);
        *op = [a0, b0];
        j += 2;
    }
    let mut s = y;
    aes(&k, &mut s);
    let per_gate = gates.iter().zip(ops.iter()).zip(tables.iter_mut());
    for (((g, &[a0, b0]), t), (s, y)) in per_gate.zip(s.chunks_exact(2).zip(y.chunks_exact(2))) {
        // H = π(y) ⊕ y, two hashes per register.
        let ha = _mm256_xor_si256(s[0], y[0]);
        let hb = _mm256_xor_si256(s[1], y[1]);
        let (ha0, ha1) = (
            _mm256_castsi256_si128(ha),
            _mm256_extracti128_si256::<1>(ha),
        );
        let (hb0, hb1) = (
            _mm256_castsi256_si128(hb),
            _mm256_extracti128_si256::<1>(hb),
        );
        let (pa, pb) = (lsb_mask(a0), lsb_mask(b0));
        // Generator half-gate: T_G = H(A⁰) ⊕ H(A¹) ⊕ pb·Δ, W_G = H(A⁰) ⊕ pa·T_G.
        let t_g = _mm_xor_si128(_mm_xor_si128(ha0, ha1), _mm_and_si128(delta, pb));
        let w_g = _mm_xor_si128(ha0, _mm_and_si128(t_g, pa));
        // Evaluator half-gate: T_E = H(B⁰) ⊕ H(B¹) ⊕ A⁰, W_E = H(B⁰) ⊕ pb·(T_E ⊕ A⁰).
        let hb01 = _mm_xor_si128(hb0, hb1);
        let t_e = _mm_xor_si128(hb01, a0);
        let w_e = _mm_xor_si128(hb0, _mm_and_si128(hb01, pb));
        store(&mut zero[g[2] as usize & m], _mm_xor_si128(w_g, w_e));
        store_table(t, t_g, t_e);
    }
}

/// Evaluates `G` independent AND gates: `G` registers `[y_A, y_B]` through AES in lock step.
///
/// # Safety
/// The CPU must support VAES, AVX2 and AES-NI.
#[target_feature(enable = "avx2,vaes,aes")]
unsafe fn eval_group<const G: usize>(
    rk: &[u128; 11],
    labels: &mut [u128],
    gates: &[[u32; 3]; G],
    tables: &[[u8; 32]; G],
    j0: u64,
    instance: u64,
) {
    let m = labels.len().wrapping_sub(1);
    let k = schedule(rk);
    let mut ops = [[_mm_setzero_si128(); 2]; G];
    let mut y = [_mm256_setzero_si256(); G];
    let mut j = j0;
    for ((g, op), y) in gates.iter().zip(ops.iter_mut()).zip(y.iter_mut()) {
        let a = load(&labels[g[0] as usize & m]);
        let b = load(&labels[g[1] as usize & m]);
        let ya = _mm_xor_si128(sigma(a), tweak(instance, j));
        let yb = _mm_xor_si128(sigma(b), tweak(instance, j + 1));
        *y = _mm256_set_m128i(yb, ya);
        *op = [a, b];
        j += 2;
    }
    let mut s = y;
    aes::<G>(&k, &mut s);
    for (((g, &[a, b]), t), (s, y)) in gates
        .iter()
        .zip(ops.iter())
        .zip(tables.iter())
        .zip(s.iter().zip(y.iter()))
    {
        let h = _mm256_xor_si256(*s, *y);
        let (ha, hb) = (_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h));
        let t = load_table(t);
        let (t_g, t_e) = (_mm256_castsi256_si128(t), _mm256_extracti128_si256::<1>(t));
        let w_g = _mm_xor_si128(ha, _mm_and_si128(t_g, lsb_mask(a)));
        let w_e = _mm_xor_si128(hb, _mm_and_si128(_mm_xor_si128(t_e, a), lsb_mask(b)));
        store(&mut labels[g[2] as usize & m], _mm_xor_si128(w_g, w_e));
    }
}
