//! Collecting a message head (start line and fields, up to the blank line) across pieces, for
//! requests and responses alike.

/// The bytes of one head so far.
#[derive(Debug, Clone, Default)]
pub(super) struct Head {
    buf: Vec<u8>,
    /// Where the search for the blank line resumes.
    scan: usize,
}

/// The head would be longer than allowed.
pub(super) struct TooLong;

impl Head {
    /// Blank lines at the front of `data` before a head starts (RFC 9112 §2.2 lets a
    /// recipient skip them): how many bytes they take.
    pub(super) fn leading_blank_lines(&self, data: &[u8]) -> usize {
        if !self.buf.is_empty() {
            return 0;
        }
        data.iter()
            .take_while(|b| **b == b'\r' || **b == b'\n')
            .count()
    }

    /// Takes bytes of the head from the front of `data`, at most up to its blank line: returns
    /// how many it took and whether the head is complete (then [`Head::take`] gives it).
    pub(super) fn collect(
        &mut self,
        data: &[u8],
        max_len: usize,
    ) -> Result<(usize, bool), TooLong> {
        let room = max_len.saturating_sub(self.buf.len());
        let take = data.len().min(room.max(1));
        let before = self.buf.len();
        self.buf
            .extend_from_slice(data.get(..take).unwrap_or_default());
        match find_head_end(&self.buf, self.scan) {
            Some(end) => {
                // The blank line was not in the bytes held before, or it would have been found.
                self.buf.truncate(end);
                Ok((end.saturating_sub(before), true))
            }
            None if self.buf.len() >= max_len => Err(TooLong),
            None => {
                self.scan = self.buf.len().saturating_sub(2);
                Ok((take, false))
            }
        }
    }

    /// The head (complete, or whatever there is of it when its sender closed); the next one
    /// starts empty.
    pub(super) fn take(&mut self) -> Vec<u8> {
        self.scan = 0;
        core::mem::take(&mut self.buf)
    }
}

/// Index just past the blank line ending a head, searching from `from`: the first `\n`
/// followed by `\n` or `\r\n`.
fn find_head_end(buf: &[u8], from: usize) -> Option<usize> {
    let mut i = from;
    while let Some(&b) = buf.get(i) {
        if b == b'\n' {
            match (buf.get(i + 1), buf.get(i + 2)) {
                (Some(b'\n'), _) => return Some(i + 2),
                (Some(b'\r'), Some(b'\n')) => return Some(i + 3),
                _ => {}
            }
        }
        i += 1;
    }
    None
}
