//! AES-128 under eight different keys at once, key schedules included (the middlebox's
//! per-chunk salts; the sender's `K_t` where the `aesni` path is not available).
//!
//! The `aes` crate expands one key at a time with `AESKEYGENASSIST`, a serial chain of ten
//! dependent steps (the largest part of the sender's profile). Here eight schedules advance in
//! lockstep, each step's S-box lookups done by one 8-block AES round
//! ([`aes::hazmat::cipher_round_par`], AES-NI with run-time detection, portable fallback), and the
//! data blocks are encrypted round by round as the keys are produced. No `unsafe`: only the `aes`
//! crate's safe round API. Measured: for the sender's one-use keys about even with the serial
//! expansion (the round API's calls, loads and stores and the scalar byte selection cost what
//! the dependency chain did, which out-of-order execution partly hid); for keys used many times
//! ([`Schedule8`], the middlebox's salt resets) a clear gain, the schedule being computed once.
//!
//! The S-box trick: an AES round is `MixColumns(ShiftRows(SubBytes(s))) ⊕ rk`. If every column
//! of `ShiftRows(s)` holds one byte four times, `MixColumns` leaves it unchanged (its
//! coefficients 2, 3, 1, 1 sum to 1 in GF(2⁸)), so with `rk = 0` the round returns `SubBytes` of
//! four chosen bytes. Column `j` of the input is the schedule word `w₃` rotated left by `8j`
//! bits; then output column `c` is `S(w₃[−c mod 4])` four times, and picking byte `r` of
//! `RotWord(SubWord(w₃))` from the right column is a few masks. The last AES round (no
//! `MixColumns`) is a full round with a zero key followed by `InvMixColumns` and the round key.

use aes::hazmat::{cipher_round_par, inv_mix_columns};
use aes::{Block, Block8};
use zeroize::Zeroize;

/// Blocks (and keys) per call.
pub(crate) const LANES: usize = 8;

/// Round constants of the AES-128 key schedule.
const RCON: [u32; 10] = [0x01, 0x02, 0x04, 0x08, 0x10, 0x20, 0x40, 0x80, 0x1b, 0x36];

#[inline(always)]
fn halves(b: &Block) -> (u64, u64) {
    let x = u128::from_le_bytes((*b).into());
    (x as u64, (x >> 64) as u64)
}

#[inline(always)]
fn block(lo: u64, hi: u64) -> Block {
    Block::from((u128::from(lo) | u128::from(hi) << 64).to_le_bytes())
}

/// Scratch of [`encrypt8`]: round keys and S-box outputs, which are secret. Reused across calls
/// and wiped by the owner when a run is done ([`Zeroize`]) and on drop, instead of after every
/// call (byte-wise volatile wiping of 256 bytes per call cost more than a key schedule).
#[derive(Default)]
pub(crate) struct Work {
    /// Current round key of each lane, as (low, high) 64-bit halves.
    rk: [(u64, u64); LANES],
    round_keys: Block8,
    sub: Block8,
}

impl Zeroize for Work {
    fn zeroize(&mut self) {
        self.rk.iter_mut().for_each(|(a, b)| {
            a.zeroize();
            b.zeroize();
        });
        for b in self.round_keys.iter_mut().chain(self.sub.iter_mut()) {
            b.as_mut_slice().zeroize();
        }
    }
}

impl Drop for Work {
    fn drop(&mut self) {
        self.zeroize();
    }
}

/// Advances the eight key schedules in `work.rk` by one round and writes the new round keys to
/// `work.round_keys`.
#[inline(always)]
fn next_round_keys(work: &mut Work, rcon: u32) {
    let zero = Block8::default();
    for (b, (_, hi)) in work.sub.iter_mut().zip(work.rk.iter()) {
        let w3 = (hi >> 32) as u32;
        *b = block(
            u64::from(w3) | u64::from(w3.rotate_left(8)) << 32,
            u64::from(w3.rotate_left(16)) | u64::from(w3.rotate_left(24)) << 32,
        );
    }
    cipher_round_par(&mut work.sub, &zero);
    for ((b, (lo, hi)), out) in work
        .sub
        .iter()
        .zip(work.rk.iter_mut())
        .zip(work.round_keys.iter_mut())
    {
        let (olo, ohi) = halves(b);
        // RotWord(SubWord(w3)) ⊕ rcon in both 32-bit halves: byte r of the word comes from
        // output column 3 − r, which holds it in every row, so masks pick the bytes in place.
        let t = (ohi & 0x0000_00FF_0000_FF00)
            | (ohi.rotate_left(32) & 0x0000_FF00_0000_00FF)
            | (olo & 0x00FF_0000_FF00_0000)
            | (olo.rotate_left(32) & 0xFF00_0000_00FF_0000);
        let t = t ^ (u64::from(rcon) | u64::from(rcon) << 32);
        // w0' = w0 ⊕ t, w1' = w1 ⊕ w0', ...: a prefix XOR over the four words.
        let plo = *lo ^ *lo << 32;
        let w01 = plo >> 32;
        *hi ^= *hi << 32 ^ w01 ^ w01 << 32 ^ t;
        *lo = plo ^ t;
        *out = block(*lo, *hi);
    }
}

/// Encrypts, for every lane `i`, block `i` of each of `states` under `keys[i]` (a raw AES-128
/// key, little-endian in the `u128`): `states[s][i] ← AES_{keys[i]}(states[s][i])`. Several
/// states share one key-schedule computation (Protocol III encrypts two salts per token).
/// `work` holds secrets afterwards: the caller zeroizes it.
pub(crate) fn encrypt8(keys: &[u128; LANES], states: &mut [Block8], work: &mut Work) {
    let zero = Block8::default();
    for (r, k) in work.rk.iter_mut().zip(keys.iter()) {
        *r = (*k as u64, (*k >> 64) as u64);
    }
    for s in states.iter_mut() {
        for (b, (lo, hi)) in s.iter_mut().zip(work.rk.iter()) {
            let (x, y) = halves(b);
            *b = block(x ^ lo, y ^ hi);
        }
    }
    for (round, rcon) in RCON.iter().enumerate() {
        next_round_keys(work, *rcon);
        if round + 1 < RCON.len() {
            for s in states.iter_mut() {
                cipher_round_par(s, &work.round_keys);
            }
        } else {
            for s in states.iter_mut() {
                cipher_round_par(s, &zero);
                for (b, (lo, hi)) in s.iter_mut().zip(work.rk.iter()) {
                    inv_mix_columns(b);
                    let (x, y) = halves(b);
                    *b = block(x ^ lo, y ^ hi);
                }
            }
        }
    }
}

/// The eleven round keys of eight AES-128 keys, lane `i` of each [`Block8`] for `keys[i]`
/// (for keys used many times: the middlebox's chunk keys at every salt reset).
pub(crate) struct Schedule8 {
    rounds: [Block8; 11],
}

impl Schedule8 {
    pub(crate) fn new(keys: &[u128; LANES]) -> Self {
        let mut rounds: [Block8; 11] = Default::default();
        let mut work = Work::default();
        for (b, k) in rounds[0].iter_mut().zip(keys.iter()) {
            *b = block(*k as u64, (*k >> 64) as u64);
        }
        for r in work.rk.iter_mut().zip(keys.iter()) {
            *r.0 = (*r.1 as u64, (*r.1 >> 64) as u64);
        }
        for (round, rcon) in RCON.iter().enumerate() {
            next_round_keys(&mut work, *rcon);
            if let Some(rk) = rounds.get_mut(round + 1) {
                rk.clone_from(&work.round_keys);
            }
        }
        Self { rounds }
    }

    /// `states[s][i] ← AES_{keys[i]}(states[s][i])`.
    pub(crate) fn encrypt(&self, states: &mut [Block8]) {
        let zero = Block8::default();
        let [first, middle @ .., last] = &self.rounds;
        for s in states.iter_mut() {
            for (b, k) in s.iter_mut().zip(first.iter()) {
                let (x, y) = halves(b);
                let (kx, ky) = halves(k);
                *b = block(x ^ kx, y ^ ky);
            }
            for rk in middle {
                cipher_round_par(s, rk);
            }
            cipher_round_par(s, &zero);
            for (b, k) in s.iter_mut().zip(last.iter()) {
                inv_mix_columns(b);
                let (x, y) = halves(b);
                let (kx, ky) = halves(k);
                *b = block(x ^ kx, y ^ ky);
            }
        }
    }
}

impl Drop for Schedule8 {
    fn drop(&mut self) {
        for b in self.rounds.iter_mut().flat_map(|r| r.iter_mut()) {
            b.as_mut_slice().zeroize();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aes::cipher::{BlockEncrypt, KeyInit};
    use rand::{Rng, SeedableRng};

    #[test]
    fn equals_aes_for_random_keys() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        for _ in 0..200 {
            let keys: [[u8; 16]; LANES] = core::array::from_fn(|_| rng.gen());
            let pts: [[[u8; 16]; LANES]; 2] =
                core::array::from_fn(|_| core::array::from_fn(|_| rng.gen()));
            let mut states: [Block8; 2] = core::array::from_fn(|s| {
                let mut b = Block8::default();
                for (x, p) in b.iter_mut().zip(pts[s].iter()) {
                    *x = Block::from(*p);
                }
                b
            });
            let k128 = keys.map(u128::from_le_bytes);
            encrypt8(&k128, &mut states, &mut Work::default());
            for s in 0..2 {
                for i in 0..LANES {
                    let mut want = Block::from(pts[s][i]);
                    aes::Aes128::new(&keys[i].into()).encrypt_block(&mut want);
                    assert_eq!(states[s][i], want, "state {s} lane {i}");
                }
            }
        }
    }

    #[test]
    fn stored_schedule_equals_aes() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(12);
        for _ in 0..50 {
            let keys: [[u8; 16]; LANES] = core::array::from_fn(|_| rng.gen());
            let pts: [[u8; 16]; LANES] = core::array::from_fn(|_| rng.gen());
            let mut states = [Block8::default()];
            for (x, p) in states[0].iter_mut().zip(pts.iter()) {
                *x = Block::from(*p);
            }
            Schedule8::new(&keys.map(u128::from_le_bytes)).encrypt(&mut states);
            for i in 0..LANES {
                let mut want = Block::from(pts[i]);
                aes::Aes128::new(&keys[i].into()).encrypt_block(&mut want);
                assert_eq!(states[0][i], want, "lane {i}");
            }
        }
    }

    #[test]
    fn fips197_vector() {
        let key: [u8; 16] = core::array::from_fn(|i| i as u8);
        let pt: [u8; 16] = core::array::from_fn(|i| (i as u8) * 0x11);
        let mut states = [Block8::default()];
        for b in states[0].iter_mut() {
            *b = Block::from(pt);
        }
        encrypt8(
            &[u128::from_le_bytes(key); LANES],
            &mut states,
            &mut Work::default(),
        );
        let want = [
            0x69, 0xc4, 0xe0, 0xd8, 0x6a, 0x7b, 0x04, 0x30, 0xd8, 0xcd, 0xb7, 0x80, 0x70, 0xb4,
            0xc5, 0x5a,
        ];
        for b in states[0].iter() {
            assert_eq!(b.as_slice(), &want);
        }
    }
}
