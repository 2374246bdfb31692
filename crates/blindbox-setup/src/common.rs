//! What the three parties derive the same way: the circuit, per-chunk garbling seeds, OT session
//! ids, the middlebox's input bits, and the work split across cores.

use std::sync::{Arc, OnceLock};

use mbx_garble::{blindbox_circuit_for, Circuit, GarbleSeed, Layout};
use sha2::{Digest, Sha256};
use zeroize::Zeroizing;

use crate::error::SetupError;
use crate::tagged::SignedChunk;
use crate::wire::Role;

/// The circuit layout: 8-byte chunks `t ‖ 0⁸` (9,983 AND gates).
pub const LAYOUT: Layout = Layout::Token64;
/// Evaluator input bits per circuit: the chunk (64) and its tag (128).
pub const EVAL_BITS: usize = 64 + 128;
/// Output bits: `AES_k(t ‖ 0⁸)`.
pub const OUTPUT_BITS: usize = 128;

/// The BlindBox circuit every party uses, built once per process and shared (a server with
/// many connections does not rebuild it per setup).
pub fn setup_circuit() -> Result<Arc<Circuit>, SetupError> {
    static CIRCUIT: OnceLock<Result<Arc<Circuit>, mbx_garble::Error>> = OnceLock::new();
    CIRCUIT
        .get_or_init(|| blindbox_circuit_for(LAYOUT).map(Arc::new))
        .clone()
        .map_err(SetupError::Garble)
}

/// The garbling seed of circuit `index`: `SHA-256("mbx-blindbox-setup garble seed v1" ‖ k_rand
/// ‖ index)[..16]`. Each circuit gets independent randomness (fresh Δ, fresh labels), and any
/// subset can be garbled in any order, on any core.
pub(crate) fn chunk_seed(k_rand: &[u8; 32], index: u32) -> GarbleSeed {
    let mut d = Sha256::new()
        .chain_update(b"mbx-blindbox-setup garble seed v1")
        .chain_update(k_rand)
        .chain_update(u64::from(index).to_be_bytes())
        .finalize();
    let mut s = Zeroizing::new([0u8; 16]);
    s.copy_from_slice(&d[..16]);
    zeroize::Zeroize::zeroize(d.as_mut_slice());
    GarbleSeed::new(*s)
}

/// OT session id between the middlebox and the endpoint in `role`.
pub(crate) fn ot_session_id(nonce: &[u8; 32], role: Role) -> Vec<u8> {
    Sha256::new()
        .chain_update(b"mbx-blindbox-setup ot v1")
        .chain_update(nonce)
        .chain_update([match role {
            Role::Full => 0u8,
            Role::Hash => 1,
        }])
        .finalize()
        .to_vec()
}

/// The middlebox's input bits for one chunk (its OT choices): chunk, then tag.
pub(crate) fn choice_bits(c: &SignedChunk) -> Zeroizing<Vec<bool>> {
    mbx_garble::blindbox_token_evaluator_inputs(&c.chunk, &c.tag)
}

/// Circuits `first..first + count` of batch `batch` (the last batch may be shorter).
pub(crate) fn batch_range(batch: u32, size: u16, total: u32) -> std::ops::Range<u32> {
    let first = u64::from(batch) * u64::from(size);
    let end = (first + u64::from(size)).min(u64::from(total));
    let first = first.min(u64::from(total)) as u32;
    first..end as u32
}

/// Number of batches for `total` circuits.
pub(crate) fn batch_count(size: u16, total: u32) -> u32 {
    total.div_ceil(u32::from(size.max(1)))
}

/// Runs `f(i)` for `i in 0..n` on up to `workers` threads and returns the results in order.
/// The result does not depend on `workers`; with 1 worker no thread is spawned.
pub(crate) fn par_map<T: Send, F: Fn(usize) -> T + Sync>(n: usize, workers: usize, f: F) -> Vec<T> {
    let w = workers.clamp(1, n.max(1));
    if w == 1 {
        return (0..n).map(f).collect();
    }
    let per = n.div_ceil(w);
    std::thread::scope(|s| {
        let f = &f;
        let handles: Vec<_> = (0..w)
            .map(|t| s.spawn(move || (t * per..((t + 1) * per).min(n)).map(f).collect::<Vec<T>>()))
            .collect();
        let mut out = Vec::with_capacity(n);
        for h in handles {
            match h.join() {
                Ok(v) => out.extend(v),
                Err(e) => std::panic::resume_unwind(e),
            }
        }
        out
    })
}

/// The number of cores to use by default.
pub fn default_workers() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Progress of one party, for a progress bar.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    /// Circuits garbled (endpoint) or evaluated and checked (middlebox).
    pub circuits_done: u32,
    /// Circuits of the whole setup (0 until announced).
    pub circuits_total: u32,
    /// Bytes handed to the transport so far (frames included).
    pub bytes_sent: u64,
    /// Bytes received so far.
    pub bytes_received: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_cover_every_circuit_once() {
        for (size, total) in [(1u16, 1u32), (32, 100), (32, 96), (7, 0), (64, 8000)] {
            let mut seen = 0;
            for b in 0..batch_count(size, total) {
                let r = batch_range(b, size, total);
                assert_eq!(r.start, seen);
                assert!(!r.is_empty());
                seen = r.end;
            }
            assert_eq!(seen, total);
        }
    }

    #[test]
    fn par_map_is_ordered_and_independent_of_workers() {
        let one = par_map(37, 1, |i| i * i);
        for w in [2, 3, 8, 100] {
            assert_eq!(par_map(37, w, |i| i * i), one);
        }
        assert!(par_map(0, 4, |i| i).is_empty());
    }

    #[test]
    fn seeds_differ_per_chunk_and_key() {
        let a = chunk_seed(&[1; 32], 0);
        let b = chunk_seed(&[1; 32], 1);
        let c = chunk_seed(&[2; 32], 0);
        let circuit = setup_circuit().unwrap();
        let inputs = vec![false; circuit.garbler_inputs()];
        let h = |s: &GarbleSeed| mbx_garble::hash_garbling(&circuit, s, 0, &inputs).unwrap();
        assert_ne!(h(&a), h(&b));
        assert_ne!(h(&a), h(&c));
        assert_eq!(h(&a), h(&chunk_seed(&[1; 32], 0)));
    }
}
