//! Pieces of the KOS extension shared by both sides.

use sha2::{Digest, Sha256};

/// The consistency-check challenge, derived Fiat–Shamir style from the receiver's `u` matrix so a
/// batch is one request and one response. The receiver cannot know which challenges its
/// deviations survive without knowing Δ, so grinding `u` offline only adds the number of hash
/// evaluations as a factor to the (2^-128-scale) failure probability.
pub(crate) fn challenge(sid: &[u8], batch: u64, count: usize, u: &[u8]) -> u128 {
    let mut h = Sha256::new();
    h.update(b"mbx-ot/kos/chi");
    h.update((sid.len() as u64).to_le_bytes());
    h.update(sid);
    h.update(batch.to_le_bytes());
    h.update((count as u64).to_le_bytes());
    h.update(u);
    let d: [u8; 32] = h.finalize().into();
    let mut c = [0u8; 16];
    c.copy_from_slice(&d[..16]);
    u128::from_le_bytes(c)
}

/// Hash tweak of OT `j` of batch `batch`: unique over the session.
pub(crate) fn tweak(batch: u64, j: usize) -> u128 {
    (u128::from(batch) << 64) | j as u128
}

/// All-ones if `bit` is 1, else zero (branch-free selection on secret bits).
pub(crate) fn mask(bit: u128) -> u128 {
    0u128.wrapping_sub(bit & 1)
}
