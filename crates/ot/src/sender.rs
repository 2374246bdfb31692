//! The OT sender (a garbling endpoint): offers `(m0, m1)` label pairs, learns nothing of the
//! receiver's choices.

use rand::{CryptoRng, RngCore};
use subtle::{Choice, ConstantTimeEq};
use zeroize::Zeroizing;

use crate::kos::{challenge, mask, tweak};
use crate::prim::{columns_to_rows, dot, poly_hash, ColumnPrg, Tccr};
use crate::wire::{
    put_batch_header, rows_for, Reader, BASE_REPLY_LEN, POINT_LEN, TAG_BASE_REPLY, TAG_BASE_SETUP,
    TAG_EXTEND, TAG_TRANSFER,
};
use crate::{base, OtError, BASE_OTS, LABEL_LEN};

/// Sender state machine. Created from the receiver's base-OT setup message; then turns each
/// extension message into a transfer message carrying the masked pairs of that batch.
pub struct OtSender {
    sid: Vec<u8>,
    /// The extension correlation: its bits are the base-OT choices. Knowing it lets the receiver
    /// open both messages of every OT, so it never leaves this struct.
    delta: Zeroizing<u128>,
    prgs: Vec<ColumnPrg>,
    next_batch: u64,
    aborted: bool,
    tccr: Tccr,
}

impl OtSender {
    /// Answers the receiver's base-OT setup message, drawing Δ and the base-OT secrets from `rng`.
    /// Returns the sender and the base-OT reply to send back.
    pub fn new<R: RngCore + CryptoRng>(
        session_id: &[u8],
        base_setup: &[u8],
        rng: &mut R,
    ) -> Result<(Self, Vec<u8>), OtError> {
        let mut rd = Reader::new(base_setup, TAG_BASE_SETUP)?;
        let a_bytes: [u8; POINT_LEN] = rd.array()?;
        rd.finish()?;
        let a = base::decode_point(&a_bytes)?;
        let mut delta_bytes = Zeroizing::new([0u8; 16]);
        rng.fill_bytes(delta_bytes.as_mut());
        let delta = Zeroizing::new(u128::from_le_bytes(*delta_bytes));
        let mut reply = Vec::with_capacity(BASE_REPLY_LEN);
        reply.push(TAG_BASE_REPLY);
        let mut prgs = Vec::with_capacity(BASE_OTS);
        for i in 0..BASE_OTS {
            let c = Choice::from(((*delta >> i) & 1) as u8);
            let (r, seed) = base::receive(session_id, i, &a_bytes, &a, c, rng);
            reply.extend_from_slice(&r[0]);
            reply.extend_from_slice(&r[1]);
            prgs.push(ColumnPrg::new(&seed));
        }
        let sender = Self {
            sid: session_id.to_vec(),
            delta,
            prgs,
            next_batch: 0,
            aborted: false,
            tccr: Tccr::new(),
        };
        Ok((sender, reply))
    }

    /// Index of the next batch this sender accepts.
    pub fn next_batch(&self) -> u64 {
        self.next_batch
    }

    /// Processes one extension message with the pairs `(m0, m1)` to offer for its OTs (as many
    /// as [`crate::peek_extend`] reports) and returns the transfer message.
    ///
    /// A receiver that deviates from the protocol fails the consistency check: this returns
    /// [`OtError::ConsistencyCheck`] before anything derived from Δ leaves, and every later call
    /// returns [`OtError::Aborted`] (retries would let the receiver learn Δ bit by bit).
    pub fn handle_extend(
        &mut self,
        msg: &[u8],
        pairs: &[([u8; LABEL_LEN], [u8; LABEL_LEN])],
    ) -> Result<Vec<u8>, OtError> {
        if self.aborted {
            return Err(OtError::Aborted);
        }
        let mut rd = Reader::new(msg, TAG_EXTEND)?;
        let (batch, n) = rd.batch_header()?;
        if batch != self.next_batch {
            return Err(OtError::OutOfOrder {
                expected: self.next_batch,
                got: batch,
            });
        }
        if pairs.len() != n {
            return Err(OtError::CountMismatch {
                expected: n,
                got: pairs.len(),
            });
        }
        let s = rd.u128()?;
        let t = rd.u128()?;
        let rows = rows_for(n);
        let words = rows / 128;
        let u = rd.take(BASE_OTS * words * 16)?;
        rd.finish()?;

        let h = challenge(&self.sid, batch, n, u);
        let delta = *self.delta;
        let mut cols = Vec::with_capacity(BASE_OTS);
        for (i, (prg, u_col)) in self
            .prgs
            .iter_mut()
            .zip(u.chunks_exact(words * 16))
            .enumerate()
        {
            let m = mask(delta >> i);
            let mut q = vec![0u128; words];
            prg.fill(&mut q);
            for (w, ub) in q.iter_mut().zip(u_col.chunks_exact(16)) {
                let mut b = [0u8; 16];
                b.copy_from_slice(ub);
                *w ^= u128::from_le_bytes(b) & m;
            }
            cols.push(Zeroizing::new(q));
        }
        let q_rows = Zeroizing::new(columns_to_rows(&cols, words));
        drop(cols);

        let q_check = poly_hash(h, q_rows.iter().copied());
        let expected = t ^ dot(delta, s);
        if !bool::from(q_check.ct_eq(&expected)) {
            self.aborted = true;
            return Err(OtError::ConsistencyCheck);
        }
        self.next_batch += 1;

        let q_rows = q_rows.get(..n).ok_or(OtError::Truncated)?;
        let mut pad0 = Zeroizing::new(vec![0u128; n]);
        let mut pad1 = Zeroizing::new(vec![0u128; n]);
        let at = |j: usize| q_rows.get(j).copied().unwrap_or(0);
        self.tccr.hash_with(&mut pad0, at, |j| tweak(batch, j));
        self.tccr
            .hash_with(&mut pad1, |j| at(j) ^ delta, |j| tweak(batch, j));

        let mut out = Vec::with_capacity(13 + n * 2 * LABEL_LEN);
        put_batch_header(&mut out, TAG_TRANSFER, batch, n);
        for ((m0, m1), (p0, p1)) in pairs.iter().zip(pad0.iter().zip(pad1.iter())) {
            out.extend_from_slice(&(u128::from_le_bytes(*m0) ^ p0).to_le_bytes());
            out.extend_from_slice(&(u128::from_le_bytes(*m1) ^ p1).to_le_bytes());
        }
        Ok(out)
    }
}

impl core::fmt::Debug for OtSender {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("OtSender")
            .field("next_batch", &self.next_batch)
            .field("aborted", &self.aborted)
            .finish_non_exhaustive()
    }
}
