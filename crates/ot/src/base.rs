//! Base OT: Masny–Rindal "endemic OT" (CCS 2019) over Ristretto255, 128 instances.
//!
//! Roles are reversed with respect to the extension: the extension *receiver* (middlebox) is the
//! base-OT sender and ends with both seeds of every pair; the extension *sender* (endpoint) is the
//! base-OT receiver with choice bits Δ and ends with one seed per pair.
//!
//! * base sender: `a` random, sends `A = a·G`.
//! * base receiver, choice `c`: `sk` random, `r_{1-c}` a uniformly random point,
//!   `r_c = sk·G − H(r_{1-c})`; sends `(r_0, r_1)`; its seed is `KDF(sk·A)`.
//! * base sender: `pk_b = r_b + H(r_{1-b})`, seeds `KDF(a·pk_b)` for `b ∈ {0, 1}`.
//!
//! `(r_0, r_1)` is a pair of uniform points whatever `c` is, so the choice is hidden even from a
//! malicious base sender; in the random-oracle model a receiver can know the discrete log of at
//! most one `pk_b`, so it learns at most one seed.

use curve25519_dalek::ristretto::{CompressedRistretto, RistrettoPoint};
use curve25519_dalek::scalar::Scalar;
use curve25519_dalek::traits::Identity;
use rand::{CryptoRng, RngCore};
use sha2::{Digest, Sha256, Sha512};
use subtle::{Choice, ConditionallySelectable};
use zeroize::Zeroizing;

use crate::wire::POINT_LEN;
use crate::OtError;

pub(crate) fn random_scalar<R: RngCore + CryptoRng>(rng: &mut R) -> Scalar {
    let mut wide = Zeroizing::new([0u8; 64]);
    rng.fill_bytes(wide.as_mut());
    Scalar::from_bytes_mod_order_wide(&wide)
}

pub(crate) fn random_point<R: RngCore + CryptoRng>(rng: &mut R) -> RistrettoPoint {
    let mut wide = [0u8; 64];
    rng.fill_bytes(&mut wide);
    RistrettoPoint::from_uniform_bytes(&wide)
}

/// Decodes a point, rejecting non-canonical encodings and the identity.
pub(crate) fn decode_point(bytes: &[u8]) -> Result<RistrettoPoint, OtError> {
    let p = CompressedRistretto::from_slice(bytes)
        .map_err(|_| OtError::InvalidPoint)?
        .decompress()
        .ok_or(OtError::InvalidPoint)?;
    if p == RistrettoPoint::identity() {
        return Err(OtError::InvalidPoint);
    }
    Ok(p)
}

fn absorb(h: &mut impl Digest, sid: &[u8], index: usize) {
    h.update((sid.len() as u64).to_le_bytes());
    h.update(sid);
    h.update((index as u64).to_le_bytes());
}

/// Random oracle onto the group, bound to the session and instance.
fn hash_to_point(sid: &[u8], index: usize, point: &[u8; POINT_LEN]) -> RistrettoPoint {
    let mut h = Sha512::new();
    h.update(b"mbx-ot/mr19/h2g");
    absorb(&mut h, sid, index);
    h.update(point);
    let wide: [u8; 64] = h.finalize().into();
    RistrettoPoint::from_uniform_bytes(&wide)
}

/// The seed of one base OT: a hash of the shared point and the whole instance transcript.
fn kdf(
    sid: &[u8],
    index: usize,
    a: &[u8; POINT_LEN],
    r: &[[u8; POINT_LEN]; 2],
    shared: &RistrettoPoint,
) -> Zeroizing<[u8; 16]> {
    let mut h = Sha256::new();
    h.update(b"mbx-ot/mr19/kdf");
    absorb(&mut h, sid, index);
    h.update(a);
    h.update(r[0]);
    h.update(r[1]);
    h.update(shared.compress().as_bytes());
    let digest = Zeroizing::new(<[u8; 32]>::from(h.finalize()));
    let mut seed = Zeroizing::new([0u8; 16]);
    seed.copy_from_slice(&digest[..16]);
    seed
}

/// Base receiver side of instance `index` with secret choice `c`: returns `(r_0, r_1)` and the
/// chosen seed.
pub(crate) fn receive<R: RngCore + CryptoRng>(
    sid: &[u8],
    index: usize,
    a_bytes: &[u8; POINT_LEN],
    a: &RistrettoPoint,
    c: Choice,
    rng: &mut R,
) -> ([[u8; POINT_LEN]; 2], Zeroizing<[u8; 16]>) {
    let sk = Zeroizing::new(random_scalar(rng));
    let other = random_point(rng).compress().to_bytes();
    let mine = (RistrettoPoint::mul_base(&sk) - hash_to_point(sid, index, &other))
        .compress()
        .to_bytes();
    let mut r = [[0u8; POINT_LEN]; 2];
    for k in 0..POINT_LEN {
        r[0][k] = u8::conditional_select(&mine[k], &other[k], c);
        r[1][k] = u8::conditional_select(&other[k], &mine[k], c);
    }
    // Multiply by reference: no unwiped copy of the secret scalar.
    let shared = core::ops::Mul::mul(a, &*sk);
    let seed = kdf(sid, index, a_bytes, &r, &shared);
    (r, seed)
}

/// Base sender side of instance `index`: both seeds.
pub(crate) fn send(
    sid: &[u8],
    index: usize,
    a_bytes: &[u8; POINT_LEN],
    a: &Scalar,
    r: &[[u8; POINT_LEN]; 2],
) -> Result<[Zeroizing<[u8; 16]>; 2], OtError> {
    let r0 = decode_point(&r[0])?;
    let r1 = decode_point(&r[1])?;
    let pk0 = r0 + hash_to_point(sid, index, &r[1]);
    let pk1 = r1 + hash_to_point(sid, index, &r[0]);
    Ok([
        kdf(sid, index, a_bytes, r, &(pk0 * a)),
        kdf(sid, index, a_bytes, r, &(pk1 * a)),
    ])
}
