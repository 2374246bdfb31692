//! Message framing: one type byte, fixed-size fields, exact lengths. Parsing never panics.

use crate::{OtError, BASE_OTS, MAX_BATCH, PAD_ROWS};

/// Receiver → sender: the base-OT sender key `A` (32 bytes).
pub(crate) const TAG_BASE_SETUP: u8 = 0x01;
/// Sender → receiver: 128 base-OT pairs `(r0, r1)` (64 bytes each).
pub(crate) const TAG_BASE_REPLY: u8 = 0x02;
/// Receiver → sender: one extension batch (`u` matrix and consistency-check values).
pub(crate) const TAG_EXTEND: u8 = 0x03;
/// Sender → receiver: the masked message pairs of one batch.
pub(crate) const TAG_TRANSFER: u8 = 0x04;

/// Bytes of a point on the wire.
pub(crate) const POINT_LEN: usize = 32;
/// Bytes of a batch header after the type byte: batch index (u64) and OT count (u32).
const BATCH_HEADER_LEN: usize = 12;
/// Bytes of an [`TAG_EXTEND`] message before the `u` columns.
pub(crate) const EXTEND_PREFIX_LEN: usize = 1 + BATCH_HEADER_LEN + 32;

/// Rows of the extension matrix for a batch of `count` OTs: rounded up to whole 128-row blocks,
/// plus [`PAD_ROWS`] rows with random choices that mask the consistency-check value.
pub(crate) fn rows_for(count: usize) -> usize {
    count.div_ceil(128) * 128 + PAD_ROWS
}

/// Cursor over an untrusted message.
pub(crate) struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    /// Starts reading `msg`, which must begin with type byte `tag`.
    pub(crate) fn new(msg: &'a [u8], tag: u8) -> Result<Self, OtError> {
        let (&got, rest) = msg.split_first().ok_or(OtError::Truncated)?;
        if got != tag {
            return Err(OtError::UnexpectedType { got, expected: tag });
        }
        Ok(Self { rest })
    }

    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], OtError> {
        let (head, rest) = self.rest.split_at_checked(n).ok_or(OtError::Truncated)?;
        self.rest = rest;
        Ok(head)
    }

    pub(crate) fn array<const N: usize>(&mut self) -> Result<[u8; N], OtError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    pub(crate) fn u128(&mut self) -> Result<u128, OtError> {
        Ok(u128::from_le_bytes(self.array()?))
    }

    /// Reads the batch index and OT count, checking the count is within limits.
    pub(crate) fn batch_header(&mut self) -> Result<(u64, usize), OtError> {
        let batch = u64::from_le_bytes(self.array()?);
        let count = u32::from_le_bytes(self.array()?) as usize;
        if count == 0 || count > MAX_BATCH {
            return Err(OtError::BatchSize(count));
        }
        Ok((batch, count))
    }

    /// Succeeds only if the whole message was consumed.
    pub(crate) fn finish(self) -> Result<(), OtError> {
        if self.rest.is_empty() {
            Ok(())
        } else {
            Err(OtError::Trailing(self.rest.len()))
        }
    }
}

/// Writes a batch header.
pub(crate) fn put_batch_header(out: &mut Vec<u8>, tag: u8, batch: u64, count: usize) {
    out.push(tag);
    out.extend_from_slice(&batch.to_le_bytes());
    // `count <= MAX_BATCH < 2^32` is checked by every caller before building a message.
    out.extend_from_slice(&(count as u32).to_le_bytes());
}

/// Length of a base-OT reply message.
pub(crate) const BASE_REPLY_LEN: usize = 1 + BASE_OTS * 2 * POINT_LEN;

/// Batch index and OT count of an extension message, so a sender can fetch that many message
/// pairs before calling [`crate::OtSender::handle_extend`].
pub fn peek_extend(msg: &[u8]) -> Result<(u64, usize), OtError> {
    Reader::new(msg, TAG_EXTEND)?.batch_header()
}
