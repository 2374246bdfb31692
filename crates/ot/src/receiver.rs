//! The OT receiver (the middlebox): obtains the label of its choice bit for every OT, and nothing
//! about the other label.

use std::collections::VecDeque;

use curve25519_dalek::ristretto::RistrettoPoint;
use curve25519_dalek::scalar::Scalar;
use rand::{CryptoRng, RngCore};
use zeroize::Zeroizing;

use crate::kos::{challenge, mask, tweak};
use crate::prim::{columns_to_rows, poly_hash, ColumnPrg, Tccr, X128};
use crate::wire::{
    put_batch_header, rows_for, Reader, EXTEND_PREFIX_LEN, POINT_LEN, TAG_BASE_REPLY,
    TAG_BASE_SETUP, TAG_EXTEND, TAG_TRANSFER,
};
use crate::{base, OtError, BASE_OTS, LABEL_LEN, MAX_BATCH};

/// Labels the receiver obtained in one batch, in choice order; wiped on drop.
pub type Labels = Zeroizing<Vec<[u8; LABEL_LEN]>>;

/// One extension batch waiting for its transfer message.
struct Pending {
    batch: u64,
    choices: Zeroizing<Vec<u8>>,
    /// `t_j` for the batch's OTs (the receiver's keys before hashing).
    rows: Zeroizing<Vec<u128>>,
}

enum State {
    AwaitBaseReply {
        a: Zeroizing<Scalar>,
        a_bytes: [u8; POINT_LEN],
    },
    Ready {
        /// Both seeds' PRGs for each of the 128 base OTs.
        prgs: Vec<[ColumnPrg; 2]>,
        next_batch: u64,
        pending: VecDeque<Pending>,
    },
}

/// Receiver state machine: sends the base-OT setup, absorbs the reply, then for each batch of
/// choice bits produces an extension message and decodes the matching transfer message.
/// Several batches may be outstanding (pipelining); transfers must come back in order.
pub struct OtReceiver {
    sid: Vec<u8>,
    state: State,
    tccr: Tccr,
}

impl OtReceiver {
    /// Starts a session; returns the receiver and the base-OT setup message for the sender.
    /// `session_id` must be the same on both sides and unique per OT session (e.g. a transcript
    /// hash of the connection and the endpoint's identity).
    pub fn new<R: RngCore + CryptoRng>(session_id: &[u8], rng: &mut R) -> (Self, Vec<u8>) {
        let a = Zeroizing::new(base::random_scalar(rng));
        let a_bytes = RistrettoPoint::mul_base(&a).compress().to_bytes();
        let mut msg = Vec::with_capacity(1 + POINT_LEN);
        msg.push(TAG_BASE_SETUP);
        msg.extend_from_slice(&a_bytes);
        let receiver = Self {
            sid: session_id.to_vec(),
            state: State::AwaitBaseReply { a, a_bytes },
            tccr: Tccr::new(),
        };
        (receiver, msg)
    }

    /// Absorbs the sender's base-OT reply. Invalid input leaves the receiver unchanged.
    pub fn handle_base_reply(&mut self, msg: &[u8]) -> Result<(), OtError> {
        let State::AwaitBaseReply { a, a_bytes } = &self.state else {
            return Err(OtError::BaseOtDone);
        };
        let mut rd = Reader::new(msg, TAG_BASE_REPLY)?;
        let mut pairs = Vec::with_capacity(BASE_OTS);
        for _ in 0..BASE_OTS {
            pairs.push([rd.array::<POINT_LEN>()?, rd.array::<POINT_LEN>()?]);
        }
        rd.finish()?;
        let mut prgs = Vec::with_capacity(BASE_OTS);
        for (i, r) in pairs.iter().enumerate() {
            let [s0, s1] = base::send(&self.sid, i, a_bytes, a, r)?;
            prgs.push([ColumnPrg::new(&s0), ColumnPrg::new(&s1)]);
        }
        self.state = State::Ready {
            prgs,
            next_batch: 0,
            pending: VecDeque::new(),
        };
        Ok(())
    }

    /// Number of batches sent whose transfer has not been decoded yet.
    pub fn pending_batches(&self) -> usize {
        match &self.state {
            State::Ready { pending, .. } => pending.len(),
            State::AwaitBaseReply { .. } => 0,
        }
    }

    /// Starts a batch of `choices.len()` OTs (1..=[`MAX_BATCH`]); returns the extension message.
    /// Memory held until the transfer arrives: 16 bytes per OT plus the choices.
    pub fn extend<R: RngCore + CryptoRng>(
        &mut self,
        choices: &[bool],
        rng: &mut R,
    ) -> Result<Vec<u8>, OtError> {
        let State::Ready {
            prgs,
            next_batch,
            pending,
        } = &mut self.state
        else {
            return Err(OtError::BaseOtPending);
        };
        let n = choices.len();
        if n == 0 || n > MAX_BATCH {
            return Err(OtError::BatchSize(n));
        }
        let batch = *next_batch;
        let rows = rows_for(n);
        let words = rows / 128;

        // The choice column; rows past `n` get random bits that mask the check value `s`.
        let mut r = Zeroizing::new(vec![0u128; words]);
        for (w, chunk) in r.iter_mut().zip(choices.chunks(128)) {
            for (k, &c) in chunk.iter().enumerate() {
                *w |= u128::from(c) << k;
            }
        }
        let mut pad = Zeroizing::new([0u8; 16]);
        for j in n..rows {
            if j % 128 == 0 || j == n {
                rng.fill_bytes(pad.as_mut());
            }
            if let Some(w) = r.get_mut(j / 128) {
                *w |= (u128::from_le_bytes(*pad) >> (j % 128) & 1) << (j % 128);
            }
        }

        let mut msg = Vec::with_capacity(EXTEND_PREFIX_LEN + BASE_OTS * words * 16);
        put_batch_header(&mut msg, TAG_EXTEND, batch, n);
        msg.extend_from_slice(&[0u8; 32]);
        let mut t_cols: Vec<Zeroizing<Vec<u128>>> = Vec::with_capacity(BASE_OTS);
        let mut g1 = Zeroizing::new(vec![0u128; words]);
        for [p0, p1] in prgs.iter_mut() {
            let mut t = Zeroizing::new(vec![0u128; words]);
            p0.fill(&mut t);
            p1.fill(&mut g1);
            for ((t, g), r) in t.iter().zip(g1.iter()).zip(r.iter()) {
                msg.extend_from_slice(&(t ^ g ^ r).to_le_bytes());
            }
            t_cols.push(t);
        }
        let h = challenge(
            &self.sid,
            batch,
            n,
            msg.get(EXTEND_PREFIX_LEN..).unwrap_or(&[]),
        );
        let mut t_rows = Zeroizing::new(columns_to_rows(&t_cols, words));
        drop(t_cols);
        let t_check = poly_hash(h, t_rows.iter().copied());
        let s = poly_hash(
            h,
            (0..rows).map(|j| {
                let bit = r.get(j / 128).copied().unwrap_or(0) >> (j % 128);
                X128 & mask(bit)
            }),
        );
        if let Some(slot) = msg.get_mut(EXTEND_PREFIX_LEN - 32..EXTEND_PREFIX_LEN) {
            slot[..16].copy_from_slice(&s.to_le_bytes());
            slot[16..].copy_from_slice(&t_check.to_le_bytes());
        }
        t_rows.truncate(n);
        pending.push_back(Pending {
            batch,
            choices: Zeroizing::new(choices.iter().map(|&c| u8::from(c)).collect()),
            rows: t_rows,
        });
        *next_batch += 1;
        Ok(msg)
    }

    /// Decodes the transfer message of the oldest outstanding batch: the chosen message of each
    /// OT. Invalid input leaves the receiver unchanged.
    pub fn handle_transfer(&mut self, msg: &[u8]) -> Result<Labels, OtError> {
        let State::Ready { pending, .. } = &mut self.state else {
            return Err(OtError::BaseOtPending);
        };
        let mut rd = Reader::new(msg, TAG_TRANSFER)?;
        let (batch, n) = rd.batch_header()?;
        let front = pending.front().ok_or(OtError::NoPendingBatch)?;
        if batch != front.batch {
            return Err(OtError::OutOfOrder {
                expected: front.batch,
                got: batch,
            });
        }
        if n != front.choices.len() {
            return Err(OtError::CountMismatch {
                expected: front.choices.len(),
                got: n,
            });
        }
        let body = rd.take(n * 2 * LABEL_LEN)?;
        rd.finish()?;
        let rows = &front.rows;
        let mut keys = Zeroizing::new(vec![0u128; n]);
        self.tccr.hash_with(
            &mut keys,
            |j| rows.get(j).copied().unwrap_or(0),
            |j| tweak(batch, j),
        );
        let mut out = Zeroizing::new(Vec::with_capacity(n));
        for ((y, key), &c) in body
            .chunks_exact(2 * LABEL_LEN)
            .zip(keys.iter())
            .zip(front.choices.iter())
        {
            let (y0, y1) = y.split_at(LABEL_LEN);
            let mut b0 = [0u8; LABEL_LEN];
            let mut b1 = [0u8; LABEL_LEN];
            b0.copy_from_slice(y0);
            b1.copy_from_slice(y1);
            let (y0, y1) = (u128::from_le_bytes(b0), u128::from_le_bytes(b1));
            let m = mask(u128::from(c));
            out.push((((y0 & !m) | (y1 & m)) ^ key).to_le_bytes());
        }
        pending.pop_front();
        Ok(out)
    }
}

impl core::fmt::Debug for OtReceiver {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("OtReceiver")
            .field("pending_batches", &self.pending_batches())
            .finish_non_exhaustive()
    }
}
