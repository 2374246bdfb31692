//! The garbling transcript hash: "full circuit from one endpoint, a hash from the other".
//!
//! Both endpoints garble identically (same seed from `k_rand`). One sends the middlebox everything
//! it needs to evaluate — tables, the seed of its active input labels, decoding information — and the other
//! sends only [`hash_garbling`] of the same. The middlebox runs a [`TranscriptHasher`] over what it
//! received (tables chunk by chunk as they stream past) and compares the two 32-byte digests in
//! constant time. The evaluator's input labels are not in the transcript: the middlebox gets them by
//! OT from both endpoints and compares them directly (the spec's label check).
//!
//! Digest = SHA-256("mbx-garble transcript v1" ‖ circuit digest ‖ instance ‖ tables
//!          ‖ table length ‖ garbler label seed ‖ decoding).

use sha2::{Digest, Sha256};

use crate::circuit::Circuit;
use crate::error::Error;
use crate::garble::{Decoding, Garbler};
use crate::label::{GarbleSeed, LabelSeed};

const DOMAIN: &[u8] = b"mbx-garble transcript v1";

/// Chunk size (AND gates) [`hash_garbling`] garbles per step: 64 KiB of tables in memory at once.
const HASH_CHUNK_ANDS: usize = 2048;

/// Incremental transcript digest (same result on the sending endpoint and on the middlebox).
#[derive(Clone)]
pub struct TranscriptHasher {
    sha: Sha256,
    table_bytes: u64,
}

impl TranscriptHasher {
    pub fn new(circuit: &Circuit, instance: u64) -> Self {
        let mut sha = Sha256::new();
        sha.update(DOMAIN);
        sha.update(circuit.digest());
        sha.update(instance.to_be_bytes());
        Self {
            sha,
            table_bytes: 0,
        }
    }

    /// Absorbs the next chunk of tables (chunk boundaries do not matter).
    pub fn update_tables(&mut self, chunk: &[u8]) {
        self.sha.update(chunk);
        self.table_bytes += chunk.len() as u64;
    }

    /// Absorbs the garbler's label seed and the decoding information and returns the digest.
    pub fn finish(mut self, garbler_label_seed: &LabelSeed, decoding: &Decoding) -> [u8; 32] {
        self.sha.update(self.table_bytes.to_be_bytes());
        self.sha.update(garbler_label_seed.to_bytes());
        self.sha.update(decoding.to_bytes());
        self.sha.finalize().into()
    }
}

/// The digest of the garbling of `circuit` under (`seed`, `instance`) with the garbler's inputs,
/// computed with bounded memory (the tables are hashed as they are produced, never stored whole).
pub fn hash_garbling(
    circuit: &Circuit,
    seed: &GarbleSeed,
    instance: u64,
    garbler_inputs: &[bool],
) -> Result<[u8; 32], Error> {
    let mut g = Garbler::new(circuit, seed, instance, garbler_inputs)?;
    let mut h = TranscriptHasher::new(circuit, instance);
    let mut chunk = Vec::with_capacity(HASH_CHUNK_ANDS * crate::garble::TABLE_BYTES_PER_AND);
    loop {
        chunk.clear();
        if g.write_tables(&mut chunk, HASH_CHUNK_ANDS) == 0 {
            break;
        }
        h.update_tables(&chunk);
    }
    let decoding = g.decoding()?;
    Ok(h.finish(&g.garbler_label_seed(), &decoding))
}
