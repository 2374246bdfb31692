//! The sender's DPIEnc in AES-NI registers (x86_64 only): the crate's one module with `unsafe`.
//!
//! Per token, DPIEnc needs `K_t = AES_k(t ‖ 0⁸)`, the expansion of `K_t`'s key schedule and
//! `AES_{K_t}(0⁸ ‖ salt)` (twice under probable cause). [`DpiEncNi::encrypt_batch`] does that for
//! [`LANES`] (32) tokens at once with every intermediate value in vector registers, in
//! independent chains so the latencies of `AESENC` and of the schedule steps overlap. A schedule
//! step is `SubWord(RotWord(w₃)) ⊕ rcon` by `PSHUFB` (broadcast `RotWord(w₃)` to all four
//! columns, which makes `ShiftRows` a no-op) and `AESENCLAST` with the round constant as its
//! key, then the prefix XOR of the four words by two byte shifts (no `AESKEYGENASSIST`, whose
//! immediate would force a fully unrolled loop and which is slow on several cores). Three
//! kernels, the widest the CPU has chosen at run time ([`Kernel`]): AES-NI on XMM (eight tokens
//! per call, eight chains), VAES + AVX2 on YMM (two tokens per register, eight per call) and
//! VAES + AVX-512F/BW on ZMM (four tokens per register, all 32 in eight chains; the last two
//! XORs of a schedule step fused into one `VPTERNLOGD`). Every instruction used acts on each
//! 128-bit lane separately. Between rounds each kernel runs a [`Between`] hook, the sender's
//! counting of its next batch, so that integer and vector work share the reorder window.
//! [`prefetch`] is the sender's cache hint for its count table.
//!
//! Why `unsafe`, and why it is sound:
//! * Intrinsics used only after run-time detection must live in `#[target_feature]` functions,
//!   and calling those needs `unsafe` (the compiler cannot know the CPU has the feature).
//!   [`DpiEncNi`] can only be constructed after `is_x86_feature_detected!("aes")` and `("ssse3")`
//!   returned true (SSE2 is part of x86_64), so holding one proves the features are there; its
//!   `kernel` is `Vaes256` only if `vaes` and `avx2` were detected too, and `Vaes512` only if
//!   `avx512f` and `avx512bw` were as well ([`available_kernels`]; tests can force a narrower
//!   kernel, never one the CPU lacks). Every `unsafe` block but one is a call of a
//!   `#[target_feature]` function whose features the `DpiEncNi`'s kernel implies; the other is
//!   `PREFETCHT0` (SSE, baseline), which never faults and is given a reference.
//! * No pointer is dereferenced: blocks enter and leave registers through `_mm_set_epi64x` /
//!   `_mm256_set_epi64x` / `_mm512_set_epi64` and `_mm_cvtsi128_si64` / unpack / extract (plain
//!   integer moves), never through raw loads or stores, so there is no alignment or bounds
//!   question; the kernels contain only arithmetic intrinsics. (`prefetch` passes an address to `PREFETCHT0`, which reads
//!   nothing into the program.) The [`Between`] hook is safe code given no access to the
//!   kernel's registers or arguments.
//! * Not x86_64: the module compiles to a type that cannot be constructed (an uninhabited field),
//!   and no intrinsic is referenced.
//!
//! Tests: equality with the `aes` crate (FIPS-197 vector, proptests over random and edge keys,
//! tokens and salts) for every kernel the CPU has, each forced, and the `dpienc` tests run the
//! encryptor with each kernel forced and with the portable fallback (`aes8`) forced.

/// Tokens per call of [`DpiEncNi::encrypt_batch`]: 32, so that the 512-bit kernel has eight
/// independent chains (its latency would otherwise bound it, not the AES units).
pub(crate) const LANES: usize = 32;

/// Tokens per call of the 128- and 256-bit kernels (eight chains of XMM, four of YMM).
#[cfg(target_arch = "x86_64")]
const GROUP: usize = 8;

/// Round constants of the AES-128 key schedule.
#[cfg(target_arch = "x86_64")]
const RCON: [i32; 10] = [0x01, 0x02, 0x04, 0x08, 0x10, 0x20, 0x40, 0x80, 0x1b, 0x36];

/// Which kernel [`DpiEncNi::encrypt_batch`] runs (the widest the CPU has).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) enum Kernel {
    /// AES-NI on 128-bit registers (needs AES-NI and SSSE3).
    Sse,
    /// VAES on 256-bit registers, two tokens per instruction (also needs VAES and AVX2).
    Vaes256,
    /// VAES on 512-bit registers, four tokens per instruction (also needs AVX-512F and
    /// AVX-512BW).
    Vaes512,
}

/// The token key `k`'s expanded schedule, for the AES-NI path. Exists only if the CPU has AES-NI
/// and SSSE3 (checked at run time by [`DpiEncNi::new`]). Wiped on drop.
pub(crate) struct DpiEncNi {
    /// Round keys of `k` (little-endian `u128` = the block's bytes in order).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    rk: [u128; 11],
    /// The kernel to run; set by [`DpiEncNi::new`] only to one whose features were detected.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    kernel: Kernel,
    #[cfg(not(target_arch = "x86_64"))]
    never: core::convert::Infallible,
}

/// The kernels this CPU can run, narrowest first (empty without AES-NI / SSSE3 and off x86_64).
pub(crate) fn available_kernels() -> Vec<Kernel> {
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
    let mut v = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        if has!("aes") && has!("ssse3") {
            v.push(Kernel::Sse);
            if has!("vaes") && has!("avx2") {
                v.push(Kernel::Vaes256);
                if has!("avx512f") && has!("avx512bw") {
                    v.push(Kernel::Vaes512);
                }
            }
        }
    }
    v
}

impl DpiEncNi {
    /// `None` when the CPU lacks AES-NI or SSSE3, and on other architectures.
    pub(crate) fn new(k: &[u8; 16]) -> Option<Self> {
        let kernel = *available_kernels().last()?;
        Self::with_kernel(k, kernel)
    }

    /// `k` on `kernel`: `None` unless the CPU has every feature `kernel` needs (and off x86_64).
    pub(crate) fn with_kernel(k: &[u8; 16], kernel: Kernel) -> Option<Self> {
        #[cfg(target_arch = "x86_64")]
        {
            if available_kernels().contains(&kernel) {
                let mut rk = [0u128; 11];
                // SAFETY: `expand` only needs AES-NI and SSSE3 (and SSE2, always present on
                // x86_64); every kernel in `available_kernels` was detected with both.
                unsafe { x86::expand(u128::from_le_bytes(*k), &mut rk) };
                return Some(Self { rk, kernel });
            }
        }
        let _ = (k, kernel);
        None
    }

    /// The kernel this key runs.
    #[cfg(test)]
    pub(crate) fn kernel(&self) -> Kernel {
        self.kernel
    }

    /// For lane `i < LANES` (all are computed; unused lanes are just ignored by the
    /// caller): `K = AES_k(tokens[i] ‖ 0⁸)`, `c1[i]` = the first 8 bytes of
    /// `AES_K(0⁸ ‖ salts[i]_be64)` as a little-endian `u64` (DPIEnc keeps 5 of them), and if `p3`,
    /// `c2[i] = AES_K(0⁸ ‖ (salts[i] + 1)_be64)` as a little-endian `u128` (otherwise `c2` is
    /// not written).
    /// `tokens[i]` is the token's 8 bytes as a little-endian `u64`.
    ///
    /// `between` is called [`BETWEEN_CALLS`] times while the kernel runs, between its rounds:
    /// scalar work placed there (the next batch's counting) runs on the integer units while
    /// the AES rounds occupy the vector units, instead of after them.
    pub(crate) fn encrypt_batch(
        &self,
        tokens: &[u64; LANES],
        salts: &[u64; LANES],
        c1: &mut [u64; LANES],
        c2: &mut [u128; LANES],
        p3: bool,
        between: &mut impl Between,
    ) {
        #[cfg(target_arch = "x86_64")]
        {
            match self.kernel {
                // SAFETY: `kernel` is `Vaes512` only if `available_kernels` detected AVX-512F,
                // AVX-512BW, VAES, AVX2, AES-NI and SSSE3 (`with_kernel`).
                Kernel::Vaes512 => unsafe {
                    if p3 {
                        x86::dpienc_vaes512::<true>(&self.rk, tokens, salts, c1, c2, between);
                    } else {
                        x86::dpienc_vaes512::<false>(&self.rk, tokens, salts, c1, c2, between);
                    }
                },
                // `kernel` is `Vaes256` only if `available_kernels` detected VAES and AVX2 after
                // AES-NI and SSSE3 (`with_kernel`).
                Kernel::Vaes256 => {
                    for (((t, s), c1), c2) in groups(tokens, salts, c1, c2) {
                        // SAFETY: as above, VAES and AVX2 after AES-NI and SSSE3.
                        unsafe {
                            if p3 {
                                x86::dpienc8_vaes::<true>(&self.rk, t, s, c1, c2);
                            } else {
                                x86::dpienc8_vaes::<false>(&self.rk, t, s, c1, c2);
                            }
                        }
                        between_group(between);
                    }
                }
                // A `DpiEncNi` exists only after AES-NI and SSSE3 were detected (`with_kernel`).
                Kernel::Sse => {
                    for (((t, s), c1), c2) in groups(tokens, salts, c1, c2) {
                        // SAFETY: as above, AES-NI and SSSE3.
                        unsafe {
                            if p3 {
                                x86::dpienc8::<true>(&self.rk, t, s, c1, c2);
                            } else {
                                x86::dpienc8::<false>(&self.rk, t, s, c1, c2);
                            }
                        }
                        between_group(between);
                    }
                }
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (tokens, salts, c1, c2, p3, between);
            match self.never {}
        }
    }

    /// `AES_k(block)` (for tests).
    #[cfg(test)]
    fn encrypt_block(&self, block: u128) -> u128 {
        #[cfg(target_arch = "x86_64")]
        {
            // SAFETY: a `DpiEncNi` exists only after AES-NI and SSSE3 were detected (`new`).
            unsafe { x86::encrypt(&self.rk, block) }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = block;
            match self.never {}
        }
    }
}

/// Scalar work [`DpiEncNi::encrypt_batch`] runs between its rounds. A trait rather than a
/// closure, so that implementations can mark `between` `#[inline(always)]` and be compiled into
/// the kernel: a call out of it would spill its vector registers each time.
pub(crate) trait Between {
    /// One share of the work.
    fn between(&mut self);
}

/// How often [`DpiEncNi::encrypt_batch`] calls its `between` (after every other round of both
/// halves of the 512-bit kernel; twice per group of the narrower ones).
pub(crate) const BETWEEN_CALLS: usize = 8;

/// The narrower kernels' share of the `between` calls, after each group.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn between_group(between: &mut impl Between) {
    for _ in 0..BETWEEN_CALLS / (LANES / GROUP) {
        between.between();
    }
}

/// The batch in groups of [`GROUP`] for the narrower kernels.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::type_complexity)]
fn groups<'a>(
    tokens: &'a [u64; LANES],
    salts: &'a [u64; LANES],
    c1: &'a mut [u64; LANES],
    c2: &'a mut [u128; LANES],
) -> impl Iterator<
    Item = (
        ((&'a [u64; GROUP], &'a [u64; GROUP]), &'a mut [u64; GROUP]),
        &'a mut [u128; GROUP],
    ),
> {
    let (t, _) = tokens.as_chunks::<GROUP>();
    let (s, _) = salts.as_chunks::<GROUP>();
    let (a, _) = c1.as_chunks_mut::<GROUP>();
    let (b, _) = c2.as_chunks_mut::<GROUP>();
    t.iter().zip(s.iter()).zip(a.iter_mut()).zip(b.iter_mut())
}

/// Asks the CPU to load the cache line holding `x` (`PREFETCHT0` on x86_64, nothing elsewhere):
/// the sender's count-table slots a few tokens ahead.
#[inline(always)]
pub(crate) fn prefetch<T>(x: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `PREFETCHT0` is SSE, part of the x86_64 baseline; it only hints the cache, never
    // faults and reads nothing into the program (the address is a valid reference anyway).
    unsafe {
        use core::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>((x as *const T).cast::<i8>());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = x;
}

impl Drop for DpiEncNi {
    fn drop(&mut self) {
        zeroize::Zeroize::zeroize(&mut self.rk);
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! The kernels. Every function here is `unsafe` only because of `#[target_feature]`: the
    //! caller must make sure the CPU has AES-NI and SSSE3. No pointers are dereferenced.

    use super::{Between, GROUP, LANES, RCON};
    use core::arch::x86_64::{
        __m128i, _mm_aesenc_si128, _mm_aesenclast_si128, _mm_cvtsi128_si64, _mm_set1_epi32,
        _mm_set_epi64x, _mm_setzero_si128, _mm_shuffle_epi8, _mm_slli_si128, _mm_unpackhi_epi64,
        _mm_xor_si128,
    };
    use core::arch::x86_64::{
        __m256i, _mm256_aesenc_epi128, _mm256_aesenclast_epi128, _mm256_castsi256_si128,
        _mm256_extracti128_si256, _mm256_set1_epi32, _mm256_set_epi64x, _mm256_setzero_si256,
        _mm256_shuffle_epi8, _mm256_slli_si256, _mm256_xor_si256,
    };
    use core::arch::x86_64::{
        __m512i, _mm512_aesenc_epi128, _mm512_aesenclast_epi128, _mm512_bslli_epi128,
        _mm512_extracti32x4_epi32, _mm512_set1_epi32, _mm512_set_epi64, _mm512_setzero_si512,
        _mm512_shuffle_epi8, _mm512_ternarylogic_epi32, _mm512_xor_si512,
    };

    /// # Safety
    /// The CPU must support SSE2 (always on x86_64).
    #[inline]
    #[target_feature(enable = "sse2")]
    unsafe fn from_u128(x: u128) -> __m128i {
        _mm_set_epi64x((x >> 64) as u64 as i64, x as u64 as i64)
    }

    /// # Safety
    /// The CPU must support SSE2 (always on x86_64).
    #[inline]
    #[target_feature(enable = "sse2")]
    unsafe fn to_u128(x: __m128i) -> u128 {
        let lo = _mm_cvtsi128_si64(x) as u64;
        let hi = _mm_cvtsi128_si64(_mm_unpackhi_epi64(x, x)) as u64;
        u128::from(lo) | u128::from(hi) << 64
    }

    /// One AES-128 key-schedule step: the next round key from `k` and the round constant
    /// (broadcast to all four columns).
    ///
    /// # Safety
    /// The CPU must support AES-NI and SSSE3.
    #[inline]
    #[target_feature(enable = "aes,ssse3")]
    unsafe fn next_key(k: __m128i, rcon: __m128i) -> __m128i {
        // RotWord(w3) in every column: bytes 13, 14, 15, 12.
        let rot = _mm_set1_epi32(0x0c0f_0e0d);
        // All columns equal, so ShiftRows changes nothing: SubWord(RotWord(w3)) ⊕ rcon, x4.
        let t = _mm_aesenclast_si128(_mm_shuffle_epi8(k, rot), rcon);
        // Prefix XOR of the words: [w0, w0^w1, w1^w2, w2^w3], then add [0, 0, w0, w0^w1].
        let x = _mm_xor_si128(k, _mm_slli_si128::<4>(k));
        let p = _mm_xor_si128(x, _mm_slli_si128::<8>(x));
        _mm_xor_si128(p, t)
    }

    /// The eleven round keys of `key`.
    ///
    /// # Safety
    /// The CPU must support AES-NI and SSSE3.
    #[target_feature(enable = "aes,ssse3")]
    pub(super) unsafe fn expand(key: u128, rk: &mut [u128; 11]) {
        let mut k = from_u128(key);
        rk[0] = key;
        for (r, c) in RCON.iter().enumerate() {
            k = next_key(k, _mm_set1_epi32(*c));
            rk[r + 1] = to_u128(k);
        }
    }

    /// `AES(block)` under a stored schedule (for tests).
    ///
    /// # Safety
    /// The CPU must support AES-NI and SSSE3.
    #[cfg(test)]
    #[target_feature(enable = "aes,ssse3")]
    pub(super) unsafe fn encrypt(rk: &[u128; 11], block: u128) -> u128 {
        let mut s = _mm_xor_si128(from_u128(block), from_u128(rk[0]));
        for k in &rk[1..10] {
            s = _mm_aesenc_si128(s, from_u128(*k));
        }
        to_u128(_mm_aesenclast_si128(s, from_u128(rk[10])))
    }

    /// One key-schedule step in each 128-bit half (two keys).
    ///
    /// # Safety
    /// The CPU must support AVX2, VAES and AES-NI.
    #[inline]
    #[target_feature(enable = "avx2,vaes,aes")]
    unsafe fn next_key2(k: __m256i, rcon: __m256i) -> __m256i {
        let rot = _mm256_set1_epi32(0x0c0f_0e0d);
        let t = _mm256_aesenclast_epi128(_mm256_shuffle_epi8(k, rot), rcon);
        let x = _mm256_xor_si256(k, _mm256_slli_si256::<4>(k));
        let p = _mm256_xor_si256(x, _mm256_slli_si256::<8>(x));
        _mm256_xor_si256(p, t)
    }

    /// `x` in both 128-bit halves.
    ///
    /// # Safety
    /// The CPU must support AVX.
    #[inline]
    #[target_feature(enable = "avx")]
    unsafe fn both(x: u128) -> __m256i {
        let (lo, hi) = (x as u64 as i64, (x >> 64) as u64 as i64);
        _mm256_set_epi64x(hi, lo, hi, lo)
    }

    /// The salt blocks `0⁸ ‖ a_be64` (low half) and `0⁸ ‖ b_be64` (high half).
    ///
    /// # Safety
    /// The CPU must support AVX.
    #[inline]
    #[target_feature(enable = "avx")]
    unsafe fn salt_blocks(a: u64, b: u64) -> __m256i {
        _mm256_set_epi64x(b.swap_bytes() as i64, 0, a.swap_bytes() as i64, 0)
    }

    /// [`dpienc8`] on VAES: tokens `2j` and `2j + 1` in the low and high half of register `j`.
    ///
    /// # Safety
    /// The CPU must support AVX2, VAES and AES-NI.
    #[target_feature(enable = "avx2,vaes,aes")]
    pub(super) unsafe fn dpienc8_vaes<const P3: bool>(
        rk: &[u128; 11],
        tokens: &[u64; GROUP],
        salts: &[u64; GROUP],
        c1: &mut [u64; GROUP],
        c2: &mut [u128; GROUP],
    ) {
        const H: usize = GROUP / 2;
        let mut key = [_mm256_setzero_si256(); H];
        let k0 = both(rk[0]);
        for j in 0..H {
            let (a, b) = (tokens[2 * j] as i64, tokens[2 * j + 1] as i64);
            key[j] = _mm256_xor_si256(_mm256_set_epi64x(0, b, 0, a), k0);
        }
        for r in &rk[1..10] {
            let r = both(*r);
            for k in key.iter_mut() {
                *k = _mm256_aesenc_epi128(*k, r);
            }
        }
        let last = both(rk[10]);
        for k in key.iter_mut() {
            *k = _mm256_aesenclast_epi128(*k, last);
        }
        let mut x = [_mm256_setzero_si256(); H];
        let mut y = [_mm256_setzero_si256(); H];
        for j in 0..H {
            let (a, b) = (salts[2 * j], salts[2 * j + 1]);
            x[j] = _mm256_xor_si256(salt_blocks(a, b), key[j]);
            if P3 {
                y[j] = _mm256_xor_si256(salt_blocks(a.wrapping_add(1), b.wrapping_add(1)), key[j]);
            }
        }
        for (round, c) in RCON.iter().enumerate() {
            let rcon = _mm256_set1_epi32(*c);
            let final_round = round + 1 == RCON.len();
            for j in 0..H {
                key[j] = next_key2(key[j], rcon);
                if final_round {
                    x[j] = _mm256_aesenclast_epi128(x[j], key[j]);
                    if P3 {
                        y[j] = _mm256_aesenclast_epi128(y[j], key[j]);
                    }
                } else {
                    x[j] = _mm256_aesenc_epi128(x[j], key[j]);
                    if P3 {
                        y[j] = _mm256_aesenc_epi128(y[j], key[j]);
                    }
                }
            }
        }
        for j in 0..H {
            let (lo, hi) = (
                _mm256_castsi256_si128(x[j]),
                _mm256_extracti128_si256::<1>(x[j]),
            );
            c1[2 * j] = _mm_cvtsi128_si64(lo) as u64;
            c1[2 * j + 1] = _mm_cvtsi128_si64(hi) as u64;
            if P3 {
                c2[2 * j] = to_u128(_mm256_castsi256_si128(y[j]));
                c2[2 * j + 1] = to_u128(_mm256_extracti128_si256::<1>(y[j]));
            }
        }
    }

    /// One key-schedule step in each 128-bit lane (four keys). As [`next_key`], with the last
    /// two XORs fused into one `VPTERNLOGD`.
    ///
    /// # Safety
    /// The CPU must support AVX-512F, AVX-512BW, VAES and AES-NI.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,vaes,aes")]
    unsafe fn next_key4(k: __m512i, rcon: __m512i) -> __m512i {
        let rot = _mm512_set1_epi32(0x0c0f_0e0d);
        let t = _mm512_aesenclast_epi128(_mm512_shuffle_epi8(k, rot), rcon);
        let x = _mm512_xor_si512(k, _mm512_bslli_epi128::<4>(k));
        // x ^ (x << 8) ^ t: truth table 0x96 is the three-way XOR.
        _mm512_ternarylogic_epi32::<0x96>(x, _mm512_bslli_epi128::<8>(x), t)
    }

    /// `x` in all four 128-bit lanes.
    ///
    /// # Safety
    /// The CPU must support AVX-512F.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn all4(x: u128) -> __m512i {
        let (lo, hi) = (x as u64 as i64, (x >> 64) as u64 as i64);
        _mm512_set_epi64(hi, lo, hi, lo, hi, lo, hi, lo)
    }

    /// Lane `i` of `x` (`I < 4`) as `(low, high)` 64-bit halves.
    ///
    /// # Safety
    /// The CPU must support AVX-512F.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn lane<const I: i32>(x: __m512i) -> __m128i {
        _mm512_extracti32x4_epi32::<I>(x)
    }

    /// [`dpienc8`] on 512-bit VAES, for [`LANES`] tokens: tokens `4j..4j + 4` in the four 128-bit lanes of register
    /// `j` (lowest lane first).
    ///
    /// # Safety
    /// The CPU must support AVX-512F, AVX-512BW, VAES, AES-NI and SSSE3.
    #[target_feature(enable = "avx512f,avx512bw,vaes,aes,ssse3")]
    pub(super) unsafe fn dpienc_vaes512<const P3: bool>(
        rk: &[u128; 11],
        tokens: &[u64; LANES],
        salts: &[u64; LANES],
        c1: &mut [u64; LANES],
        c2: &mut [u128; LANES],
        between: &mut impl Between,
    ) {
        const H: usize = LANES / 4;
        let mut key = [_mm512_setzero_si512(); H];
        let k0 = all4(rk[0]);
        for (j, k) in key.iter_mut().enumerate() {
            let t = |i: usize| tokens[4 * j + i] as i64;
            *k = _mm512_xor_si512(_mm512_set_epi64(0, t(3), 0, t(2), 0, t(1), 0, t(0)), k0);
        }
        for (i, r) in rk[1..10].iter().enumerate() {
            let r = all4(*r);
            for k in key.iter_mut() {
                *k = _mm512_aesenc_epi128(*k, r);
            }
            if i % 2 == 1 {
                between.between();
            }
        }
        let last = all4(rk[10]);
        for k in key.iter_mut() {
            *k = _mm512_aesenclast_epi128(*k, last);
        }
        // Salt blocks 0⁸ ‖ salt_be64 (high half of each lane), round 0 under K_t.
        let mut x = [_mm512_setzero_si512(); H];
        let mut y = [_mm512_setzero_si512(); H];
        for j in 0..H {
            let s = |i: usize, d: u64| salts[4 * j + i].wrapping_add(d).swap_bytes() as i64;
            x[j] = _mm512_xor_si512(
                _mm512_set_epi64(s(3, 0), 0, s(2, 0), 0, s(1, 0), 0, s(0, 0), 0),
                key[j],
            );
            if P3 {
                y[j] = _mm512_xor_si512(
                    _mm512_set_epi64(s(3, 1), 0, s(2, 1), 0, s(1, 1), 0, s(0, 1), 0),
                    key[j],
                );
            }
        }
        let (last_rcon, rcons) = RCON.split_last().unwrap_or((&0, &[]));
        // Rounds unrolled by hand: with `between` inlined into the round loop, the compiler kept
        // the registers of `for j` loops in memory.
        macro_rules! round {
            ($rcon:expr, $enc:ident) => {{
                let rcon = $rcon;
                round!(@ rcon, $enc, 0 1 2 3 4 5 6 7);
            }};
            (@ $rcon:ident, $enc:ident, $($j:literal)*) => {$(
                key[$j] = next_key4(key[$j], $rcon);
                x[$j] = $enc(x[$j], key[$j]);
                if P3 {
                    y[$j] = $enc(y[$j], key[$j]);
                }
            )*};
        }
        for (round, c) in rcons.iter().enumerate() {
            round!(_mm512_set1_epi32(*c), _mm512_aesenc_epi128);
            if round % 2 == 1 {
                between.between();
            }
        }
        round!(_mm512_set1_epi32(*last_rcon), _mm512_aesenclast_epi128);
        for j in 0..H {
            let xs = [
                lane::<0>(x[j]),
                lane::<1>(x[j]),
                lane::<2>(x[j]),
                lane::<3>(x[j]),
            ];
            for (i, v) in xs.iter().enumerate() {
                c1[4 * j + i] = _mm_cvtsi128_si64(*v) as u64;
            }
            if P3 {
                let ys = [
                    lane::<0>(y[j]),
                    lane::<1>(y[j]),
                    lane::<2>(y[j]),
                    lane::<3>(y[j]),
                ];
                for (i, v) in ys.iter().enumerate() {
                    c2[4 * j + i] = to_u128(*v);
                }
            }
        }
    }

    /// Eight DPIEnc token encryptions (see `DpiEncNi::encrypt_batch`); `c2` is written only if `P3`.
    ///
    /// # Safety
    /// The CPU must support AES-NI and SSSE3.
    #[target_feature(enable = "aes,ssse3")]
    pub(super) unsafe fn dpienc8<const P3: bool>(
        rk: &[u128; 11],
        tokens: &[u64; GROUP],
        salts: &[u64; GROUP],
        c1: &mut [u64; GROUP],
        c2: &mut [u128; GROUP],
    ) {
        // K_t = AES_k(t ‖ 0⁸) for the eight tokens, round by round.
        let mut key = [_mm_setzero_si128(); GROUP];
        let k0 = from_u128(rk[0]);
        for (s, t) in key.iter_mut().zip(tokens.iter()) {
            *s = _mm_xor_si128(_mm_set_epi64x(0, *t as i64), k0);
        }
        for r in &rk[1..10] {
            let r = from_u128(*r);
            for s in key.iter_mut() {
                *s = _mm_aesenc_si128(*s, r);
            }
        }
        let last = from_u128(rk[10]);
        for s in key.iter_mut() {
            *s = _mm_aesenclast_si128(*s, last);
        }
        // Salt blocks 0⁸ ‖ salt_be64: the high half's little-endian bytes are the salt's
        // big-endian bytes. Round 0 under K_t.
        let mut x = [_mm_setzero_si128(); GROUP];
        let mut y = [_mm_setzero_si128(); GROUP];
        for i in 0..GROUP {
            x[i] = _mm_xor_si128(_mm_set_epi64x(salts[i].swap_bytes() as i64, 0), key[i]);
            if P3 {
                let s1 = salts[i].wrapping_add(1).swap_bytes() as i64;
                y[i] = _mm_xor_si128(_mm_set_epi64x(s1, 0), key[i]);
            }
        }
        // Rounds 1..=10 with K_t's schedule computed as it is used.
        for (round, c) in RCON.iter().enumerate() {
            let rcon = _mm_set1_epi32(*c);
            let final_round = round + 1 == RCON.len();
            for i in 0..GROUP {
                key[i] = next_key(key[i], rcon);
                if final_round {
                    x[i] = _mm_aesenclast_si128(x[i], key[i]);
                    if P3 {
                        y[i] = _mm_aesenclast_si128(y[i], key[i]);
                    }
                } else {
                    x[i] = _mm_aesenc_si128(x[i], key[i]);
                    if P3 {
                        y[i] = _mm_aesenc_si128(y[i], key[i]);
                    }
                }
            }
        }
        for i in 0..GROUP {
            c1[i] = _mm_cvtsi128_si64(x[i]) as u64;
            if P3 {
                c2[i] = to_u128(y[i]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aes::cipher::{BlockEncrypt, KeyInit};
    use proptest::prelude::*;

    fn aes(key: &[u8; 16], block: [u8; 16]) -> [u8; 16] {
        let mut b = block.into();
        aes::Aes128::new(key.into()).encrypt_block(&mut b);
        b.into()
    }

    /// Reference DPIEnc with the `aes` crate: (c1 as le u64, c2 as le u128).
    fn reference(k: &[u8; 16], token: u64, salt: u64) -> (u64, u128) {
        let mut t = [0u8; 16];
        t[..8].copy_from_slice(&token.to_le_bytes());
        let kt = aes(k, t);
        let block = |s: u64| {
            let mut b = [0u8; 16];
            b[8..].copy_from_slice(&s.to_be_bytes());
            b
        };
        let c = aes(&kt, block(salt));
        let mut lo = [0u8; 8];
        lo.copy_from_slice(&c[..8]);
        (
            u64::from_le_bytes(lo),
            u128::from_le_bytes(aes(&kt, block(salt.wrapping_add(1)))),
        )
    }

    /// Counts the kernel's `between` calls.
    struct Calls(usize);

    impl Between for Calls {
        fn between(&mut self) {
            self.0 += 1;
        }
    }

    fn check(k: [u8; 16], tokens: [u64; LANES], salts: [u64; LANES]) -> Result<(), TestCaseError> {
        // Every kernel the CPU has (none without AES-NI: then the fallback is what runs, and
        // is tested).
        for kernel in available_kernels() {
            let kernel = DpiEncNi::with_kernel(&k, kernel).expect("available kernel");
            let (mut c1, mut c1b, mut c2) = ([0; LANES], [0; LANES], [0; LANES]);
            let mut calls = Calls(0);
            kernel.encrypt_batch(&tokens, &salts, &mut c1, &mut c2, true, &mut calls);
            prop_assert_eq!(calls.0, BETWEEN_CALLS, "between calls with p3");
            let mut untouched = [7u128; LANES];
            kernel.encrypt_batch(&tokens, &salts, &mut c1b, &mut untouched, false, &mut calls);
            prop_assert_eq!(calls.0, 2 * BETWEEN_CALLS, "between calls without p3");
            prop_assert_eq!(untouched, [7u128; LANES], "c2 written without p3");
            for i in 0..LANES {
                let (w1, w2) = reference(&k, tokens[i], salts[i]);
                prop_assert_eq!(c1[i], w1, "c1 lane {} {:?}", i, kernel.kernel);
                prop_assert_eq!(c1b[i], w1, "c1 without c2, lane {} {:?}", i, kernel.kernel);
                prop_assert_eq!(c2[i], w2, "c2 lane {} {:?}", i, kernel.kernel);
            }
        }
        Ok(())
    }

    fn edge_u64() -> impl Strategy<Value = u64> {
        prop_oneof![
            Just(0u64),
            Just(u64::MAX),
            Just(u64::MAX - 1),
            Just(1u64),
            Just(0x8000_0000_0000_0000),
            any::<u64>(),
        ]
    }

    fn edge_key() -> impl Strategy<Value = [u8; 16]> {
        prop_oneof![
            Just([0u8; 16]),
            Just([0xff; 16]),
            Just(core::array::from_fn(|i| i as u8)),
            any::<u8>().prop_map(|b| [b; 16]),
            any::<[u8; 16]>(),
            any::<[u8; 16]>(),
        ]
    }

    #[test]
    fn fips197_vector() {
        let key: [u8; 16] = core::array::from_fn(|i| i as u8);
        let pt: [u8; 16] = core::array::from_fn(|i| (i as u8) * 0x11);
        let Some(ni) = DpiEncNi::new(&key) else {
            return;
        };
        let ct = ni.encrypt_block(u128::from_le_bytes(pt)).to_le_bytes();
        assert_eq!(
            ct,
            [
                0x69, 0xc4, 0xe0, 0xd8, 0x6a, 0x7b, 0x04, 0x30, 0xd8, 0xcd, 0xb7, 0x80, 0x70, 0xb4,
                0xc5, 0x5a
            ]
        );
    }

    #[test]
    fn new_picks_the_widest_kernel_and_each_can_be_forced() {
        let k = [7u8; 16];
        let avail = available_kernels();
        assert_eq!(DpiEncNi::new(&k).map(|n| n.kernel()), avail.last().copied());
        for kernel in [Kernel::Sse, Kernel::Vaes256, Kernel::Vaes512] {
            let forced = DpiEncNi::with_kernel(&k, kernel);
            assert_eq!(forced.is_some(), avail.contains(&kernel), "{kernel:?}");
            if let Some(n) = forced {
                assert_eq!(n.kernel(), kernel);
            }
        }
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            let wide = has!("aes")
                && has!("ssse3")
                && has!("vaes")
                && has!("avx2")
                && has!("avx512f")
                && has!("avx512bw");
            assert_eq!(avail.contains(&Kernel::Vaes512), wide);
        }
    }

    #[test]
    fn edge_inputs_equal_aes() {
        let keys = [[0u8; 16], [0xff; 16], [0x80; 16], [0x01; 16]];
        let vals = [
            0u64,
            1,
            u64::MAX,
            u64::MAX - 1,
            1 << 63,
            0x0101_0101_0101_0101,
        ];
        for k in keys {
            for a in vals {
                for b in vals {
                    let t8 = [a, b, a, b, b, a, 0, u64::MAX];
                    let s8 = [b, a, a, b, a, b, u64::MAX, 0];
                    // Every lane of the batch sees every pair (rotated per group of 8).
                    let t = core::array::from_fn(|i| t8[(i + i / 8) % 8]);
                    let s = core::array::from_fn(|i| s8[(i + 3 * (i / 8)) % 8]);
                    check(k, t, s).unwrap();
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]
        /// Key expansion, `K_t` and both salt encryptions equal the `aes` crate.
        #[test]
        fn equals_aes_crate(k in edge_key(),
                            tokens in proptest::collection::vec(edge_u64(), LANES),
                            salts in proptest::collection::vec(edge_u64(), LANES)) {
            // (Vectors: 32-element array strategies overflow the test thread's stack unoptimized.)
            let (Ok(tokens), Ok(salts)) = (tokens.try_into(), salts.try_into()) else {
                return Err(TestCaseError::fail("length"));
            };
            check(k, tokens, salts)?;
        }

        /// The stored schedule of `k` encrypts like the `aes` crate.
        #[test]
        fn schedule_equals_aes_crate(k in edge_key(), block in any::<[u8; 16]>()) {
            if let Some(ni) = DpiEncNi::new(&k) {
                prop_assert_eq!(ni.encrypt_block(u128::from_le_bytes(block)).to_le_bytes(), aes(&k, block));
            }
        }
    }
}
