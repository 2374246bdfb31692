//! Message body framing (RFC 9112 §6–7), the same for requests and responses: how many of the
//! next bytes still belong to the current message. The bytes themselves are never changed.

use super::{HttpError, HttpLimits};

/// How the body after a head is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Framing {
    /// No body.
    None,
    Length(u64),
    Chunked,
    /// Until the sender closes (responses only).
    UntilClose,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    /// `remaining` bytes of a Content-Length body.
    Length {
        remaining: u64,
    },
    /// A chunk-size line (its bytes so far are in `line`).
    ChunkSize,
    ChunkData {
        remaining: u64,
    },
    /// After chunk data: CRLF. `cr` once the CR was seen.
    ChunkDataEnd {
        cr: bool,
    },
    /// Trailer section: `line_len` bytes on the current line, `total` in the section.
    Trailer {
        line_len: usize,
        total: usize,
    },
    UntilClose,
    Ended,
}

/// Where a reader is in one message's body.
#[derive(Debug, Clone)]
pub(super) struct Body {
    part: Part,
    line: Vec<u8>,
}

impl Default for Body {
    fn default() -> Self {
        Body {
            part: Part::Ended,
            line: Vec::new(),
        }
    }
}

impl Body {
    /// Starts reading a body framed as `framing`. Returns whether there is one at all.
    pub(super) fn start(&mut self, framing: Framing) -> bool {
        self.line.clear();
        self.part = match framing {
            Framing::None | Framing::Length(0) => Part::Ended,
            Framing::Length(remaining) => Part::Length { remaining },
            Framing::Chunked => Part::ChunkSize,
            Framing::UntilClose => Part::UntilClose,
        };
        self.part != Part::Ended
    }

    /// Whether `n` more bytes lie wholly inside a counted part (a Content-Length body or a
    /// chunk's data), so they can be passed on by counting alone; if so, counts them and
    /// returns whether the body ended with them.
    pub(super) fn count(&mut self, n: u64) -> Option<bool> {
        let (remaining, chunk) = match self.part {
            Part::Length { remaining } => (remaining, false),
            Part::ChunkData { remaining } => (remaining, true),
            Part::UntilClose => return Some(false),
            _ => return None,
        };
        let left = remaining.checked_sub(n)?;
        self.part = match (left, chunk) {
            (0, false) => Part::Ended,
            (0, true) => Part::ChunkDataEnd { cr: false },
            (remaining, false) => Part::Length { remaining },
            (remaining, true) => Part::ChunkData { remaining },
        };
        Some(self.part == Part::Ended)
    }

    /// Reads body bytes from the front of `data`: returns how many belong to this body and
    /// whether it ended with them (the rest of `data` is the next message).
    pub(super) fn read(
        &mut self,
        data: &[u8],
        limits: &HttpLimits,
    ) -> Result<(usize, bool), HttpError> {
        let mut used = 0;
        while self.part != Part::Ended {
            let rest = data.get(used..).unwrap_or_default();
            if rest.is_empty() {
                break;
            }
            used += self.read_part(rest, limits)?;
        }
        Ok((used, self.part == Part::Ended))
    }

    /// Reads from the front of non-empty `data` within the current part; returns how many bytes
    /// it took (at least one).
    fn read_part(&mut self, data: &[u8], limits: &HttpLimits) -> Result<usize, HttpError> {
        match self.part {
            Part::Ended => Ok(0),
            Part::UntilClose => Ok(data.len()),
            Part::Length { remaining } | Part::ChunkData { remaining } => {
                let n = usize::try_from(remaining)
                    .unwrap_or(usize::MAX)
                    .min(data.len());
                self.count(n as u64);
                Ok(n)
            }
            Part::ChunkSize => {
                let end = data.iter().position(|b| *b == b'\n');
                let content = end.unwrap_or(data.len());
                if self.line.len() + content > limits.max_chunk_line_len {
                    return Err(HttpError::BadChunk("chunk-size line too long"));
                }
                self.line
                    .extend_from_slice(data.get(..content).unwrap_or_default());
                let Some(end) = end else {
                    return Ok(data.len());
                };
                let size = parse_chunk_size(&self.line)?;
                self.line.clear();
                self.part = if size == 0 {
                    Part::Trailer {
                        line_len: 0,
                        total: 0,
                    }
                } else {
                    Part::ChunkData { remaining: size }
                };
                Ok(end + 1)
            }
            Part::ChunkDataEnd { cr } => {
                self.part = match (cr, data.first()) {
                    (false, Some(b'\r')) => Part::ChunkDataEnd { cr: true },
                    (_, Some(b'\n')) => Part::ChunkSize,
                    _ => return Err(HttpError::BadChunk("missing CRLF after chunk data")),
                };
                Ok(1)
            }
            Part::Trailer { line_len, total } => {
                let total = total + 1;
                if total > limits.max_trailer_len {
                    return Err(HttpError::BadChunk("trailer section too long"));
                }
                self.part = match data.first() {
                    Some(b'\n') if line_len == 0 => Part::Ended,
                    Some(b'\n') => Part::Trailer { line_len: 0, total },
                    // A CR does not count as line content, so "\r\n" ends the section.
                    Some(b'\r') => Part::Trailer { line_len, total },
                    _ => Part::Trailer {
                        line_len: line_len + 1,
                        total,
                    },
                };
                Ok(1)
            }
        }
    }
}

/// `chunk-size [ chunk-ext ] CRLF` with the LF already removed (RFC 9112 §7.1).
fn parse_chunk_size(line: &[u8]) -> Result<u64, HttpError> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let size = line.split(|b| *b == b';').next().unwrap_or_default();
    let size = size.trim_ascii();
    if size.is_empty() || size.len() > 16 || !size.iter().all(u8::is_ascii_hexdigit) {
        return Err(HttpError::BadChunk("invalid chunk size"));
    }
    let s = core::str::from_utf8(size).map_err(|_| HttpError::BadChunk("invalid chunk size"))?;
    u64::from_str_radix(s, 16).map_err(|_| HttpError::BadChunk("invalid chunk size"))
}
