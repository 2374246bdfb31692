//! Bytes on their way to one socket, written from the driver's own `select!` loop.
//!
//! Every driver sits between two sockets. If it waited for one write to finish before reading
//! again, two neighbours that each write before they read (an echo server behind us, a client
//! that uploads while the answer streams back) could fill every buffer in a cycle and stop for
//! good. So a driver never awaits a write on its own: it queues what its core produced in the
//! [`Outbox`] of the destination and writes from there in a `select!` branch, next to its reads.
//! Back-pressure is per direction: a side is read only while the outbox its data goes to has
//! room ([`Outbox::has_room`]), and a full outbox toward one neighbour never stops reading from
//! that neighbour.

use std::collections::VecDeque;
use std::io::IoSlice;

use tokio::io::{AsyncWrite, AsyncWriteExt};

/// Chunks (up to one read buffer's worth each) queued toward one neighbour before reading from
/// the side that feeds it pauses. Small: the bytes wait in the kernel's socket buffers anyway,
/// and a recycling outbox (below) then keeps every buffer it will need. With a deep queue that
/// filled and drained, the middlebox handed back more buffers than it kept and grew fresh ones
/// (page faults and `madvise` were about 10% of a saturated middlebox's CPU).
pub(crate) const QUEUE: usize = 4;

/// Chunks handed to one vectored write.
const SLICES: usize = 8;

/// What is queued toward one socket, and whether it is to be shut down (FIN) after that.
#[derive(Debug, Default)]
pub(crate) struct Outbox {
    chunks: VecDeque<Chunk>,
    fin: Fin,
    /// Emptied buffers kept for [`take_buffer`](Self::take_buffer); `None`: not recycled.
    spare: Option<Vec<Vec<u8>>>,
    /// Read buffers lent to the outbox ([`push_lent`](Self::push_lent)) and written, kept at
    /// their length for [`take_read_buffer`](Self::take_read_buffer).
    spare_reads: Vec<Vec<u8>>,
}

/// One queued buffer: `bytes[from..]` is still to be written.
#[derive(Debug)]
struct Chunk {
    bytes: Vec<u8>,
    from: usize,
    /// A read buffer lent by the driver: it goes back to the read buffers once written.
    lent: bool,
}

/// Lent read buffers kept for reuse: one per direction in flight, and one being read into.
const SPARE_READS: usize = 2;

#[derive(Debug, Default, PartialEq, Eq)]
enum Fin {
    #[default]
    No,
    /// Shut down once the queued bytes are out.
    Wanted,
    Sent,
}

impl Outbox {
    /// An outbox that drops its chunks once written (e.g. plaintext from the core).
    pub(crate) fn new() -> Outbox {
        Outbox::default()
    }

    /// An outbox that keeps emptied chunks for [`take_buffer`](Self::take_buffer), so that a
    /// relay's buffers circulate instead of being allocated per read. Only for ciphertext.
    pub(crate) fn recycling() -> Outbox {
        Outbox {
            spare: Some(Vec::new()),
            ..Outbox::default()
        }
    }

    /// Queues `data` (nothing if empty). Bytes queued after [`finish`](Self::finish) are
    /// dropped: the neighbour was told nothing more comes.
    pub(crate) fn push(&mut self, data: Vec<u8>) {
        if data.is_empty() || self.fin != Fin::No {
            self.recycle(data);
            return;
        }
        self.chunks.push_back(Chunk {
            bytes: data,
            from: 0,
            lent: false,
        });
    }

    /// Queues `range` of a read buffer (records a relay passed on where they lay), the buffer
    /// itself and not a copy; once written, the buffer is kept for
    /// [`take_read_buffer`](Self::take_read_buffer). It holds no plaintext.
    pub(crate) fn push_lent(&mut self, mut buf: Vec<u8>, range: std::ops::Range<usize>) {
        if range.is_empty() || range.end > buf.len() || self.fin != Fin::No {
            self.keep_read_buffer(buf);
            return;
        }
        buf.truncate(range.end);
        self.chunks.push_back(Chunk {
            bytes: buf,
            from: range.start,
            lent: true,
        });
    }

    /// A read buffer lent earlier and written since, at its length as lent (its bytes are
    /// ciphertext and may be read over), or `None`.
    pub(crate) fn take_read_buffer(&mut self) -> Option<Vec<u8>> {
        self.spare_reads.pop()
    }

    fn keep_read_buffer(&mut self, buf: Vec<u8>) {
        if self.spare.is_some() && self.spare_reads.len() < SPARE_READS {
            self.spare_reads.push(buf);
        }
    }

    /// Shut the socket's write side down once everything queued is written.
    pub(crate) fn finish(&mut self) {
        if self.fin == Fin::No {
            self.fin = Fin::Wanted;
        }
    }

    /// Whether the side whose data comes here may be read.
    pub(crate) fn has_room(&self) -> bool {
        self.chunks.len() < QUEUE
    }

    /// Bytes queued and not written yet.
    pub(crate) fn pending(&self) -> usize {
        self.chunks
            .iter()
            .map(|c| c.bytes.len().saturating_sub(c.from))
            .sum()
    }

    /// Whether [`write_some`](Self::write_some) has anything to do.
    pub(crate) fn wants_write(&self) -> bool {
        !self.chunks.is_empty() || self.fin == Fin::Wanted
    }

    /// An empty buffer for the next chunk: an emptied one if any is kept.
    pub(crate) fn take_buffer(&mut self) -> Vec<u8> {
        self.spare
            .as_mut()
            .and_then(|s| s.pop())
            .unwrap_or_default()
    }

    /// Hands back a buffer [`take_buffer`](Self::take_buffer) gave out that stayed empty.
    pub(crate) fn recycle(&mut self, mut buf: Vec<u8>) {
        if let Some(spare) = self.spare.as_mut() {
            // Every chunk that can be in flight: queued, being written, being filled.
            if spare.len() < QUEUE + 2 {
                buf.clear();
                spare.push(buf);
            }
        }
    }

    /// Frees the kept buffers (the traffic that needed them is over); recycling goes on.
    pub(crate) fn trim_spares(&mut self) {
        if let Some(spare) = self.spare.as_mut() {
            *spare = Vec::new();
        }
        self.spare_reads = Vec::new();
    }

    /// Whether emptied buffers are kept.
    pub(crate) fn holds_spares(&self) -> bool {
        self.spare.as_ref().is_some_and(|s| !s.is_empty()) || !self.spare_reads.is_empty()
    }

    /// One vectored write of the queued chunks, or the shutdown once they are out. Cancel
    /// safe (a `select!` branch): a write either happened and is accounted, or did not.
    pub(crate) async fn write_some<W: AsyncWrite + Unpin>(
        &mut self,
        w: &mut W,
    ) -> std::io::Result<()> {
        if self.chunks.is_empty() {
            if self.fin == Fin::Wanted {
                w.shutdown().await?;
                self.fin = Fin::Sent;
            }
            return Ok(());
        }
        let mut slices = [IoSlice::new(&[]); SLICES];
        let mut count = 0;
        for (slot, chunk) in slices.iter_mut().zip(&self.chunks) {
            *slot = IoSlice::new(chunk.bytes.get(chunk.from..).unwrap_or_default());
            count += 1;
        }
        let mut n = w
            .write_vectored(slices.get(..count).unwrap_or_default())
            .await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        while n > 0 {
            let Some(front) = self.chunks.front_mut() else {
                break;
            };
            let left = front.bytes.len() - front.from;
            if n < left {
                front.from += n;
                break;
            }
            n -= left;
            if let Some(done) = self.chunks.pop_front() {
                if done.lent {
                    self.keep_read_buffer(done.bytes);
                } else {
                    self.recycle(done.bytes);
                }
            }
        }
        Ok(())
    }

    /// Writes everything queued (and the shutdown, if wanted).
    pub(crate) async fn flush<W: AsyncWrite + Unpin>(&mut self, w: &mut W) -> std::io::Result<()> {
        while self.wants_write() {
            self.write_some(w).await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    /// A writer that accepts at most `max` bytes per call, to split writes anywhere.
    #[derive(Default)]
    struct Trickle {
        got: Vec<u8>,
        max: usize,
        shut: bool,
    }

    impl AsyncWrite for Trickle {
        fn poll_write(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            let n = buf.len().min(self.max);
            self.got.extend_from_slice(&buf[..n]);
            Poll::Ready(Ok(n))
        }

        fn poll_write_vectored(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            bufs: &[IoSlice<'_>],
        ) -> Poll<std::io::Result<usize>> {
            let mut left = self.max;
            let mut n = 0;
            for b in bufs {
                let take = b.len().min(left);
                self.got.extend_from_slice(&b[..take]);
                left -= take;
                n += take;
            }
            Poll::Ready(Ok(n))
        }

        fn is_write_vectored(&self) -> bool {
            true
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<std::io::Result<()>> {
            self.shut = true;
            Poll::Ready(Ok(()))
        }
    }

    fn run<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(f)
    }

    #[test]
    fn bytes_leave_in_order_across_partial_writes_then_the_shutdown() {
        for max in [1, 3, 7, 100, 1 << 20] {
            let mut out = Outbox::recycling();
            let mut w = Trickle {
                max,
                ..Trickle::default()
            };
            let mut want = Vec::new();
            for i in 0..12u8 {
                let chunk: Vec<u8> = (0..(i as usize * 5 + 1)).map(|j| i ^ j as u8).collect();
                want.extend_from_slice(&chunk);
                out.push(chunk);
            }
            out.push(Vec::new());
            out.finish();
            out.push(vec![0xee; 4]); // after finish: dropped
            run(out.flush(&mut w)).unwrap();
            assert_eq!(w.got, want, "max {max}");
            assert!(w.shut);
            assert!(!out.wants_write());
        }
    }

    #[test]
    fn a_lent_read_buffer_goes_out_from_its_range_and_comes_back_at_its_length() {
        for max in [1, 5, 1 << 20] {
            let mut out = Outbox::recycling();
            let mut w = Trickle {
                max,
                ..Trickle::default()
            };
            out.push(b"queued ".to_vec());
            let mut lent = b"xxrecordsyy".to_vec();
            lent.resize(64, b'z');
            out.push_lent(lent, 2..9);
            out.push(b" after".to_vec());
            run(out.flush(&mut w)).unwrap();
            assert_eq!(w.got, b"queued records after", "max {max}");
            let back = out.take_read_buffer().expect("kept once written");
            assert_eq!(back.len(), 9, "cut at its range's end, not cleared");
            assert!(out.take_read_buffer().is_none());
        }
        // An empty or impossible range sends nothing; after the shutdown nothing is queued.
        let mut out = Outbox::recycling();
        out.push_lent(vec![1; 8], 3..3);
        out.push_lent(vec![1; 8], 2..20);
        assert!(!out.wants_write());
        out.finish();
        out.push_lent(vec![1; 8], 0..8);
        assert!(out.wants_write(), "the shutdown only");
        // Kept buffers are bounded, and trimmed with the rest.
        for _ in 0..5 {
            out.keep_read_buffer(vec![0; 4]);
        }
        assert_eq!(out.spare_reads.len(), SPARE_READS);
        out.trim_spares();
        assert!(!out.holds_spares());
    }

    #[test]
    fn room_and_recycling_are_bounded() {
        let mut out = Outbox::recycling();
        for _ in 0..QUEUE {
            assert!(out.has_room());
            let mut b = out.take_buffer();
            b.extend_from_slice(&[1; 64]);
            out.push(b);
        }
        assert!(!out.has_room());
        let mut w = Trickle {
            max: usize::MAX,
            ..Trickle::default()
        };
        run(out.flush(&mut w)).unwrap();
        assert!(out.has_room());
        // The written chunks came back empty, with their capacity.
        let b = out.take_buffer();
        assert!(b.is_empty() && b.capacity() >= 64);
        for _ in 0..3 * QUEUE {
            out.recycle(vec![0; 8]);
        }
        assert_eq!(out.spare.as_ref().map(Vec::len), Some(QUEUE + 2));
        assert!(out.holds_spares());
        out.trim_spares();
        assert!(!out.holds_spares());
        assert_eq!(out.take_buffer().capacity(), 0, "trimmed");
        out.recycle(vec![0; 8]);
        assert_eq!(
            out.take_buffer().capacity(),
            8,
            "still recycling after a trim"
        );
        // A plain outbox keeps nothing.
        let mut plain = Outbox::new();
        plain.recycle(vec![0; 8]);
        assert!(!plain.holds_spares());
        assert!(plain.take_buffer().capacity() == 0);
    }
}
