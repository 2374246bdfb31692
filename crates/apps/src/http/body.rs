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
    /// Trailer section: `line_len` bytes on the current line, `total` in the section, `cr`
    /// once a CR was seen (the LF must follow).
    Trailer {
        line_len: usize,
        total: usize,
        cr: bool,
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
    /// `refused_trailer`: a field name no trailer may carry (compared without case; empty:
    /// any), for the request bodies of a proxy that inserts that field: a server that merges
    /// trailers into the header section would read a client's value after the inserted one.
    pub(super) fn read(
        &mut self,
        data: &[u8],
        limits: &HttpLimits,
        refused_trailer: &[u8],
    ) -> Result<(usize, bool), HttpError> {
        self.read_data(data, limits, refused_trailer, |_| {})
    }

    /// [`read`](Self::read), also giving `data_out` each run of the body's data (without the
    /// chunked framing and trailers), for a reader of the body itself.
    pub(super) fn read_data(
        &mut self,
        data: &[u8],
        limits: &HttpLimits,
        refused_trailer: &[u8],
        mut data_out: impl FnMut(&[u8]),
    ) -> Result<(usize, bool), HttpError> {
        let mut used = 0;
        while self.part != Part::Ended {
            let rest = data.get(used..).unwrap_or_default();
            if rest.is_empty() {
                break;
            }
            let is_data = matches!(
                self.part,
                Part::Length { .. } | Part::ChunkData { .. } | Part::UntilClose
            );
            let n = self.read_part(rest, limits, refused_trailer)?;
            if is_data {
                data_out(rest.get(..n).unwrap_or_default());
            }
            used += n;
        }
        Ok((used, self.part == Part::Ended))
    }

    /// Whether the body ended as its framing says (a body delimited by the close never does).
    pub(super) fn ended(&self) -> bool {
        self.part == Part::Ended
    }

    /// Reads from the front of non-empty `data` within the current part; returns how many bytes
    /// it took (at least one).
    fn read_part(
        &mut self,
        data: &[u8],
        limits: &HttpLimits,
        refused_trailer: &[u8],
    ) -> Result<usize, HttpError> {
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
                    // Checked as it comes, not only at its LF: the bytes taken here are passed
                    // on, and none of a line that turns out bad may be.
                    check_chunk_line_start(&self.line)?;
                    return Ok(data.len());
                };
                let size = parse_chunk_size(&self.line)?;
                self.line.clear();
                self.part = if size == 0 {
                    Part::Trailer {
                        line_len: 0,
                        total: 0,
                        cr: false,
                    }
                } else {
                    Part::ChunkData { remaining: size }
                };
                Ok(end + 1)
            }
            Part::ChunkDataEnd { cr } => {
                // CRLF exactly (RFC 9112 §7.1): a lone LF is read differently by some servers.
                self.part = match (cr, data.first()) {
                    (false, Some(b'\r')) => Part::ChunkDataEnd { cr: true },
                    (true, Some(b'\n')) => Part::ChunkSize,
                    _ => return Err(HttpError::BadChunk("missing CRLF after chunk data")),
                };
                Ok(1)
            }
            Part::Trailer {
                line_len,
                total,
                cr,
            } => {
                let total = total + 1;
                if total > limits.max_trailer_len {
                    return Err(HttpError::BadChunk("trailer section too long"));
                }
                // Lines end in CRLF, and hold no other control byte than HTAB: a lenient
                // server could otherwise end a line, or the section, elsewhere than we do.
                let b = data.first().copied().unwrap_or_default();
                // The start of each line, up to the refused name's length, is kept: a field of
                // that name is refused at its colon, which is never passed on.
                if line_len == 0 {
                    self.line.clear();
                }
                if !refused_trailer.is_empty() && !cr {
                    // The name whole, then its colon (or a blank, which some servers allow
                    // before it).
                    let named = line_len == refused_trailer.len()
                        && self.line.eq_ignore_ascii_case(refused_trailer);
                    if named && matches!(b, b':' | b' ' | b'\t') {
                        return Err(HttpError::BadChunk(
                            "a trailer field has the name of the inserted field",
                        ));
                    }
                    if line_len < refused_trailer.len() {
                        self.line.push(b);
                    }
                }
                self.part = match (cr, b) {
                    (true, b'\n') if line_len == 0 => Part::Ended,
                    (true, b'\n') => Part::Trailer {
                        line_len: 0,
                        total,
                        cr: false,
                    },
                    (false, b'\r') => Part::Trailer {
                        line_len,
                        total,
                        cr: true,
                    },
                    (false, _) if b == b'\t' || (0x20..0x7f).contains(&b) || b >= 0x80 => {
                        Part::Trailer {
                            line_len: line_len + 1,
                            total,
                            cr: false,
                        }
                    }
                    _ => return Err(HttpError::BadChunk("trailer line not ended by CRLF")),
                };
                Ok(1)
            }
        }
    }
}

/// The bytes of a chunk-size line so far (before its LF) can still begin a valid one
/// ([`parse_chunk_size`]'s rules): a CR only last, hex digits first, then blanks, then a `;`
/// and extension bytes without control bytes but HTAB.
fn check_chunk_line_start(line: &[u8]) -> Result<(), HttpError> {
    let bad = HttpError::BadChunk("invalid chunk size");
    let body = match line.iter().position(|b| *b == b'\r') {
        Some(at) if at + 1 == line.len() => line.get(..at).unwrap_or_default(),
        Some(_) => return Err(HttpError::BadChunk("chunk-size line not ended by CRLF")),
        None => line,
    };
    let digits = body.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    let rest = body.get(digits..).unwrap_or_default();
    if digits > 16 || (digits == 0 && !rest.is_empty()) {
        return Err(bad);
    }
    let blanks = rest
        .iter()
        .take_while(|b| **b == b' ' || **b == b'\t')
        .count();
    let ext = rest.get(blanks..).unwrap_or_default();
    let ext_ok = ext.is_empty()
        || (ext.first() == Some(&b';')
            && ext.iter().all(|b| *b == b'\t' || (0x20..0x7f).contains(b)));
    if ext_ok {
        Ok(())
    } else {
        Err(bad)
    }
}

/// `chunk-size [ chunk-ext ] CRLF` with the LF already removed (RFC 9112 §7.1), strictly:
/// the CR there, hex digits first, then only blanks before a `;` and extensions without
/// control bytes. Servers differ in what they tolerate here, and a proxy that reads a line
/// otherwise than its server opens the door to request smuggling.
fn parse_chunk_size(line: &[u8]) -> Result<u64, HttpError> {
    // The rules for its start (a CR only last among them), on the whole line; then its CR,
    // and at least one digit.
    check_chunk_line_start(line)?;
    let line = line
        .strip_suffix(b"\r")
        .ok_or(HttpError::BadChunk("chunk-size line not ended by CRLF"))?;
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    let size = line.get(..digits).unwrap_or_default();
    let s = core::str::from_utf8(size).map_err(|_| HttpError::BadChunk("invalid chunk size"))?;
    if s.is_empty() {
        return Err(HttpError::BadChunk("invalid chunk size"));
    }
    u64::from_str_radix(s, 16).map_err(|_| HttpError::BadChunk("invalid chunk size"))
}
