//! The sender's DPIEnc in AES-NI registers (x86_64 only): the crate's one module with `unsafe`.
//!
//! Per token, DPIEnc needs `K_t = AES_k(t ‖ 0⁸)`, the expansion of `K_t`'s key schedule and
//! `AES_{K_t}(0⁸ ‖ salt)` (twice under probable cause). [`DpiEncNi::encrypt8`] does that for
//! eight tokens at once with every intermediate value in XMM registers: eight independent chains,
//! so the latencies of `AESENC` and of the schedule steps overlap. A schedule step is
//! `SubWord(RotWord(w₃)) ⊕ rcon` by `PSHUFB` (broadcast `RotWord(w₃)` to all four columns, which
//! makes `ShiftRows` a no-op) and `AESENCLAST` with the round constant as its key, then the
//! prefix XOR of the four words by two byte shifts (no `AESKEYGENASSIST`, whose
//! immediate would force a fully unrolled loop and which is slow on several cores). With VAES
//! and AVX2 the same kernel runs two tokens per 256-bit register
//! (every instruction used acts on each 128-bit half separately). [`prefetch`] is the sender's
//! cache hint for its count table.
//!
//! Why `unsafe`, and why it is sound:
//! * Intrinsics used only after run-time detection must live in `#[target_feature]` functions,
//!   and calling those needs `unsafe` (the compiler cannot know the CPU has the feature).
//!   [`DpiEncNi`] can only be constructed after `is_x86_feature_detected!("aes")` and `("ssse3")`
//!   returned true (SSE2 is part of x86_64), so holding one proves the features are there; its
//!   `vaes` flag is set only if `vaes` and `avx2` were detected too. Every `unsafe` block but one
//!   is a call of a `#[target_feature]` function through a `DpiEncNi` whose features it checked;
//!   the other is `PREFETCHT0` (SSE, baseline), which never faults and is given a reference.
//! * No pointer is dereferenced: blocks enter and leave registers through `_mm_set_epi64x` /
//!   `_mm256_set_epi64x` and `_mm_cvtsi128_si64` / unpack / extract (plain integer moves), never
//!   through raw loads or stores, so there is no alignment or bounds question; the kernels contain
//!   only arithmetic intrinsics. (`prefetch` passes an address to `PREFETCHT0`, which reads
//!   nothing into the program.)
//! * Not x86_64: the module compiles to a type that cannot be constructed (an uninhabited field),
//!   and no intrinsic is referenced.
//!
//! Tests: equality with the `aes` crate (FIPS-197 vector, proptests over random and edge keys,
//! tokens and salts) for both the VAES and the 128-bit kernel, and the `dpienc` tests run the
//! encryptor both with this path and with the portable fallback (`aes8`) forced.

/// Tokens per call.
pub(crate) const LANES: usize = 8;

/// Round constants of the AES-128 key schedule.
#[cfg(target_arch = "x86_64")]
const RCON: [i32; 10] = [0x01, 0x02, 0x04, 0x08, 0x10, 0x20, 0x40, 0x80, 0x1b, 0x36];

/// The token key `k`'s expanded schedule, for the AES-NI path. Exists only if the CPU has AES-NI
/// and SSSE3 (checked at run time by [`DpiEncNi::new`]). Wiped on drop.
pub(crate) struct DpiEncNi {
    /// Round keys of `k` (little-endian `u128` = the block's bytes in order).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    rk: [u128; 11],
    /// The CPU also has VAES and AVX2 (and the compiler their intrinsics): two tokens per
    /// 256-bit register.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    vaes: bool,
    #[cfg(not(target_arch = "x86_64"))]
    never: core::convert::Infallible,
}

impl DpiEncNi {
    /// `None` when the CPU lacks AES-NI or SSSE3, and on other architectures.
    pub(crate) fn new(k: &[u8; 16]) -> Option<Self> {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("aes")
                && std::arch::is_x86_feature_detected!("ssse3")
            {
                let mut rk = [0u128; 11];
                // SAFETY: `expand` only needs AES-NI and SSSE3 (and SSE2, always present on
                // x86_64); both were detected just above.
                unsafe { x86::expand(u128::from_le_bytes(*k), &mut rk) };
                let vaes = std::arch::is_x86_feature_detected!("vaes")
                    && std::arch::is_x86_feature_detected!("avx2");
                return Some(Self { rk, vaes });
            }
        }
        let _ = k;
        None
    }

    /// For lane `i < LANES` (all eight are computed; unused lanes are just ignored by the
    /// caller): `K = AES_k(tokens[i] ‖ 0⁸)`, `c1[i]` = the first 8 bytes of
    /// `AES_K(0⁸ ‖ salts[i]_be64)` as a little-endian `u64` (DPIEnc keeps 5 of them), and if `c2`
    /// is given, `c2[i] = AES_K(0⁸ ‖ (salts[i] + 1)_be64)` as a little-endian `u128`.
    /// `tokens[i]` is the token's 8 bytes as a little-endian `u64`.
    pub(crate) fn encrypt8(
        &self,
        tokens: &[u64; LANES],
        salts: &[u64; LANES],
        c1: &mut [u64; LANES],
        c2: Option<&mut [u128; LANES]>,
    ) {
        #[cfg(target_arch = "x86_64")]
        {
            let mut unused = [0u128; LANES];
            let (p3, c2) = match c2 {
                Some(c2) => (true, c2),
                None => (false, &mut unused),
            };
            if self.vaes {
                // SAFETY: `vaes` is true only if VAES and AVX2 were detected in `new`, after
                // AES-NI and SSSE3.
                unsafe {
                    if p3 {
                        x86::dpienc8_vaes::<true>(&self.rk, tokens, salts, c1, c2);
                    } else {
                        x86::dpienc8_vaes::<false>(&self.rk, tokens, salts, c1, c2);
                    }
                }
                return;
            }
            // SAFETY: a `DpiEncNi` exists only after AES-NI and SSSE3 were detected (`new`).
            unsafe {
                if p3 {
                    x86::dpienc8::<true>(&self.rk, tokens, salts, c1, c2);
                } else {
                    x86::dpienc8::<false>(&self.rk, tokens, salts, c1, c2);
                }
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (tokens, salts, c1, c2);
            match self.never {}
        }
    }

    /// The same schedule on the 128-bit kernel only (tests cover both kernels).
    #[cfg(test)]
    fn without_vaes(&self) -> Self {
        Self {
            rk: self.rk,
            vaes: false,
            #[cfg(not(target_arch = "x86_64"))]
            never: self.never,
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

    use super::{LANES, RCON};
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
        tokens: &[u64; LANES],
        salts: &[u64; LANES],
        c1: &mut [u64; LANES],
        c2: &mut [u128; LANES],
    ) {
        const H: usize = LANES / 2;
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

    /// Eight DPIEnc token encryptions (see `DpiEncNi::encrypt8`); `c2` is written only if `P3`.
    ///
    /// # Safety
    /// The CPU must support AES-NI and SSSE3.
    #[target_feature(enable = "aes,ssse3")]
    pub(super) unsafe fn dpienc8<const P3: bool>(
        rk: &[u128; 11],
        tokens: &[u64; LANES],
        salts: &[u64; LANES],
        c1: &mut [u64; LANES],
        c2: &mut [u128; LANES],
    ) {
        // K_t = AES_k(t ‖ 0⁸) for the eight tokens, round by round.
        let mut key = [_mm_setzero_si128(); LANES];
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
        let mut x = [_mm_setzero_si128(); LANES];
        let mut y = [_mm_setzero_si128(); LANES];
        for i in 0..LANES {
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
            for i in 0..LANES {
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
        for i in 0..LANES {
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

    fn check(k: [u8; 16], tokens: [u64; LANES], salts: [u64; LANES]) -> Result<(), TestCaseError> {
        let Some(ni) = DpiEncNi::new(&k) else {
            return Ok(()); // no AES-NI here: the fallback is what runs (and is tested)
        };
        // The VAES kernel where the CPU has it, and the 128-bit kernel always.
        for kernel in [ni.without_vaes(), ni] {
            let (mut c1, mut c1b, mut c2) = ([0; LANES], [0; LANES], [0; LANES]);
            kernel.encrypt8(&tokens, &salts, &mut c1, Some(&mut c2));
            kernel.encrypt8(&tokens, &salts, &mut c1b, None);
            for i in 0..LANES {
                let (w1, w2) = reference(&k, tokens[i], salts[i]);
                prop_assert_eq!(c1[i], w1, "c1 lane {} vaes {}", i, kernel.vaes);
                prop_assert_eq!(c1b[i], w1, "c1 without c2, lane {} vaes {}", i, kernel.vaes);
                prop_assert_eq!(c2[i], w2, "c2 lane {} vaes {}", i, kernel.vaes);
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
                    check(
                        k,
                        [a, b, a, b, b, a, 0, u64::MAX],
                        [b, a, a, b, a, b, u64::MAX, 0],
                    )
                    .unwrap();
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]
        /// Key expansion, `K_t` and both salt encryptions equal the `aes` crate.
        #[test]
        fn equals_aes_crate(k in edge_key(),
                            tokens in proptest::array::uniform8(edge_u64()),
                            salts in proptest::array::uniform8(edge_u64())) {
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
