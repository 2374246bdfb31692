//! Socket read buffers sized by their traffic: a connection carrying bulk data reads up to its
//! maximum at once (128 KiB at a middlebox, 32 KiB at an endpoint), one carrying small messages
//! keeps 16 KiB, and an idle one holds no read buffer at all (freed by the idle trim,
//! [`Activity`](super::quiet::Activity); used by the middlebox, the server and the client proxy).

use mbx_record::wipe;
use tokio::io::AsyncReadExt;

/// Bytes a middlebox reads from a socket at once, at most: several 16 KB records per system
/// call when the peer is sending in bulk (fewer reads, and records are opened in this buffer,
/// not copied out of it).
pub(crate) const READ_BUF_MAX: usize = 128 * 1024;
/// A read buffer is this size when a socket first has bytes to read, and doubles, up to its
/// maximum, each time a read fills it: a middlebox connection that only ever carries small
/// messages keeps 16 KiB per socket instead of 128 KiB, and a bulk transfer reaches the full
/// size after three reads.
pub(crate) const READ_BUF_START: usize = 16 * 1024;

/// Consecutive reads of less than an eighth of a grown buffer after which it goes back to
/// [`READ_BUF_START`]: the transfer that grew it is over (one short read is common in
/// the middle of a transfer too, when TCP delivers part of a record).
const SHRINK_AFTER_SMALL_READS: u32 = 16;

/// One socket's read buffer, sized by its traffic, and not allocated at all while the socket
/// is idle (it is allocated when the socket becomes readable, [`read_into`]). Its owner leaves
/// no plaintext in it between reads (the middlebox opens records in it and wipes them, the
/// server and the client proxy wipe what they read from their backend or local application),
/// so resizing or freeing it copies or frees no plaintext.
pub(crate) struct ReadBuf {
    pub(crate) bytes: Vec<u8>,
    /// The most it grows to.
    max: usize,
    /// Consecutive short reads into the grown buffer.
    small_reads: u32,
}

impl ReadBuf {
    /// Nothing allocated until the socket has bytes; grows up to `max` bytes (at least
    /// [`READ_BUF_START`]).
    pub(crate) fn new(max: usize) -> ReadBuf {
        ReadBuf {
            bytes: Vec::new(),
            max: max.max(READ_BUF_START),
            small_reads: 0,
        }
    }

    /// After a read of `n` bytes: doubles the buffer (up to its maximum) when the read filled
    /// it, puts it back to the start size after [`SHRINK_AFTER_SMALL_READS`] short reads in a
    /// row. True when it shrank.
    pub(crate) fn after_read(&mut self, n: usize) -> bool {
        let len = self.bytes.len();
        if n == len && len < self.max {
            self.bytes
                .resize((len * 2).clamp(READ_BUF_START, self.max), 0);
        }
        if len <= READ_BUF_START || n >= len / 8 {
            self.small_reads = 0;
            return false;
        }
        self.small_reads += 1;
        if self.small_reads < SHRINK_AFTER_SMALL_READS {
            return false;
        }
        self.small_reads = 0;
        self.bytes.truncate(READ_BUF_START);
        self.bytes.shrink_to_fit();
        true
    }

    /// For plaintext read from a backend or a local application: hands the `n` bytes just read
    /// to `seal` (which encrypts them), then wipes them and accounts the read, so that no
    /// resize or release of the buffer leaves plaintext in freed memory.
    pub(crate) fn seal_read<T>(&mut self, n: usize, seal: impl FnOnce(&[u8]) -> T) -> T {
        let plain = self.bytes.get_mut(..n).unwrap_or_default();
        let sealed = seal(plain);
        wipe::wipe(plain);
        self.after_read(n);
        sealed
    }

    /// Gives the buffer away (its records go out as they are, [`Outbox::push_lent`]) and reads
    /// into `replacement` from now on, at the same size (a buffer lent earlier and written
    /// since, or a new one). Neither holds plaintext.
    ///
    /// [`Outbox::push_lent`]: super::outbox::Outbox::push_lent
    pub(crate) fn lend(&mut self, replacement: Option<Vec<u8>>) -> Vec<u8> {
        let len = self.bytes.len();
        let mut next = replacement.unwrap_or_default();
        next.resize(len, 0);
        core::mem::replace(&mut self.bytes, next)
    }

    /// Holds an allocation (the idle trim would free it).
    pub(crate) fn is_allocated(&self) -> bool {
        self.bytes.capacity() > 0
    }

    /// Memory returned; the next read allocates the start size again.
    pub(crate) fn release(&mut self) {
        self.small_reads = 0;
        self.bytes = Vec::new();
    }
}

/// Reads from `r` into `buf`, allocating the buffer only once the socket has something to read
/// (bytes or its end): an idle connection holds no read buffer. Readiness can be reported
/// without bytes (tokio says so; a new socket does it here): a read that would block gives the
/// buffer back and waits again. Cancel safe, like `read`: a dropped future read nothing.
/// `r`: a read half, owned or borrowed, of a TCP stream.
pub(crate) async fn read_into<R>(r: &mut R, buf: &mut ReadBuf) -> std::io::Result<usize>
where
    R: tokio::io::AsyncRead + Unpin + AsRef<tokio::net::TcpStream>,
{
    if !buf.bytes.is_empty() {
        return r.read(&mut buf.bytes).await;
    }
    loop {
        r.as_ref().readable().await?;
        buf.bytes.resize(READ_BUF_START, 0);
        match r.as_ref().try_read(&mut buf.bytes) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => buf.release(),
            done => return done,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::{TcpListener, TcpStream};

    #[test]
    fn read_buffers_double_when_filled_and_shrink_when_the_transfer_is_over() {
        let mut rb = ReadBuf::new(READ_BUF_MAX);
        rb.bytes.resize(READ_BUF_START, 0); // as `read_into` does
        assert!(!rb.after_read(100));
        assert_eq!(
            rb.bytes.len(),
            READ_BUF_START,
            "a short read does not grow it"
        );
        let mut sizes = Vec::new();
        for _ in 0..6 {
            let n = rb.bytes.len();
            assert!(!rb.after_read(n));
            sizes.push(rb.bytes.len() / 1024);
        }
        assert_eq!(sizes, [32, 64, 128, 128, 128, 128]);
        // Short reads in the middle of a transfer keep it: a read of an eighth or more resets
        // the count.
        for _ in 0..3 {
            for _ in 0..SHRINK_AFTER_SMALL_READS - 1 {
                assert!(!rb.after_read(1));
            }
            assert!(!rb.after_read(READ_BUF_MAX / 8));
        }
        assert_eq!(rb.bytes.len(), READ_BUF_MAX);
        // Enough short reads in a row put it back to the start size.
        for _ in 0..SHRINK_AFTER_SMALL_READS - 1 {
            assert!(!rb.after_read(10));
        }
        assert!(rb.after_read(10));
        assert_eq!(rb.bytes.len(), READ_BUF_START);
        assert!(rb.bytes.capacity() < READ_BUF_MAX);
        // At the start size nothing shrinks, however many short reads.
        for _ in 0..2 * SHRINK_AFTER_SMALL_READS {
            assert!(!rb.after_read(1));
        }
    }

    #[test]
    fn an_idle_release_frees_a_grown_buffer_and_counts_afresh() {
        let mut rb = ReadBuf::new(READ_BUF_MAX);
        assert!(!rb.is_allocated());
        rb.bytes.resize(READ_BUF_START, 0);
        for _ in 0..3 {
            let n = rb.bytes.len();
            rb.after_read(n);
        }
        assert_eq!(rb.bytes.len(), READ_BUF_MAX);
        rb.after_read(1);
        rb.release();
        assert!(!rb.is_allocated());
        assert_eq!(rb.small_reads, 0);
    }

    /// The read buffer is allocated only once the socket is readable, and at the start size;
    /// after a release the socket waits without one again.
    #[tokio::test]
    async fn a_socket_with_nothing_to_read_holds_no_read_buffer() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut peer = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (ours, _) = listener.accept().await.unwrap();
        let (mut r, _w) = ours.into_split();
        let mut rb = ReadBuf::new(READ_BUF_MAX);
        // Nothing sent: the read waits (and is given up) without allocating.
        let waited = tokio::time::timeout(
            std::time::Duration::from_millis(20),
            read_into(&mut r, &mut rb),
        );
        assert!(waited.await.is_err(), "nothing was sent");
        assert!(!rb.is_allocated());
        for round in 0..2 {
            tokio::io::AsyncWriteExt::write_all(&mut peer, b"hello")
                .await
                .unwrap();
            let n = read_into(&mut r, &mut rb).await.unwrap();
            assert_eq!(rb.bytes.get(..n), Some(&b"hello"[..n]), "round {round}");
            assert_eq!(rb.bytes.len(), READ_BUF_START);
            rb.after_read(n);
            rb.release();
            assert!(!rb.is_allocated());
        }
        // The end of the stream is readable too: it reads as 0 bytes.
        drop(peer);
        assert_eq!(read_into(&mut r, &mut rb).await.unwrap(), 0);
    }

    /// Plaintext read from a backend reaches the sealing step and is gone from the buffer after.
    #[test]
    fn a_sealed_read_leaves_no_plaintext_in_the_buffer() {
        let mut rb = ReadBuf::new(READ_BUF_MAX);
        rb.bytes.resize(READ_BUF_START, 0);
        rb.bytes[..5].copy_from_slice(b"hello");
        let seen = rb.seal_read(5, <[u8]>::to_vec);
        assert_eq!(seen, b"hello");
        assert!(rb.bytes.iter().all(|&b| b == 0));
    }
}
