//! Sans-I/O HTTP/1.1 message framer: tells the tokenizer which bytes of one direction of a flow to
//! inspect.
//!
//! BlindBox tokenizes HTTP headers and text bodies but not the bodies of images, video, audio, fonts
//! and archives (paper §3, "ignore tokenization for images and videos"). To know where a body starts
//! and ends the framer follows `Content-Length` and `chunked` framing; a response without either runs
//! until the connection closes. Anything it cannot frame (not HTTP, oversized head, conflicting
//! lengths) switches it to raw mode for the rest of the flow: every remaining byte is inspected, so a
//! framing failure can only make the middlebox see more, never less.
//!
//! The framer never buffers payload: [`HttpFramer::push`] returns ranges into the slice it was given.
//! Only the current header block (bounded by [`MAX_HEAD`]) and a chunk-size line are copied.

use std::ops::Range;

/// Largest header block the framer parses; a longer one switches the flow to raw mode.
pub const MAX_HEAD: usize = 64 * 1024;

/// Longest chunk-size line (`hex[;ext]CRLF`) accepted before switching to raw mode.
const MAX_CHUNK_LINE: usize = 1024;

/// What the framer says about a piece of the input.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FrameEvent {
    /// A new HTTP message starts at this stream offset (absolute rule offsets count from here).
    MessageStart(u64),
    /// Bytes `range` of the pushed slice (stream offset `offset`) are to be tokenized.
    Inspect { offset: u64, range: Range<usize> },
    /// Bytes `range` of the pushed slice belong to a body of a non-text content type.
    Skip { offset: u64, range: Range<usize> },
}

/// Whether a body is tokenized.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BodyClass {
    Inspect,
    Skip,
}

#[derive(Debug)]
enum ChunkState {
    /// Reading the `hex[;ext]` line; the buffer holds the line so far.
    Size(Vec<u8>),
    /// `n` bytes of chunk data left.
    Data(u64),
    /// The CRLF after chunk data: how many of its bytes are still expected.
    DataEnd(u8),
    /// Trailer section after the last chunk: bytes of the current trailer line seen so far.
    Trailer(usize),
}

#[derive(Debug)]
enum State {
    /// Accumulating a header block (copy kept for parsing).
    Head(Vec<u8>),
    Body {
        remaining: u64,
        class: BodyClass,
    },
    Chunked {
        state: ChunkState,
        class: BodyClass,
    },
    UntilClose(BodyClass),
    /// Not (or no longer) frameable HTTP: inspect everything.
    Raw,
}

/// Incremental HTTP/1.1 framer for one direction of a flow.
#[derive(Debug)]
pub struct HttpFramer {
    state: State,
    /// Stream offset of the next byte.
    pos: u64,
    /// Whether the start of the current message was announced.
    announced: bool,
    raw_reason: Option<&'static str>,
}

impl Default for HttpFramer {
    fn default() -> Self {
        Self::new()
    }
}

impl HttpFramer {
    /// A framer expecting an HTTP message at stream offset 0.
    pub fn new() -> Self {
        Self {
            state: State::Head(Vec::new()),
            pos: 0,
            announced: false,
            raw_reason: None,
        }
    }

    /// A framer that inspects every byte (for non-HTTP flows); announces one message at offset 0.
    pub fn raw() -> Self {
        Self {
            state: State::Raw,
            pos: 0,
            announced: false,
            raw_reason: Some("raw mode requested"),
        }
    }

    /// Why the framer fell back to raw mode, if it did.
    pub fn raw_reason(&self) -> Option<&'static str> {
        self.raw_reason
    }

    /// Stream offset of the next byte.
    pub fn position(&self) -> u64 {
        self.pos
    }

    /// Frames `data` (the next bytes of the stream). Events come in stream order, and the
    /// `Inspect`/`Skip` ranges cover `data` exactly once.
    pub fn push(&mut self, data: &[u8]) -> Vec<FrameEvent> {
        let mut out = Vec::new();
        let mut i = 0usize;
        while i < data.len() {
            if !self.announced {
                self.announced = true;
                out.push(FrameEvent::MessageStart(self.pos));
            }
            let rest = data.get(i..).unwrap_or_default();
            let (used, class) = self.step(rest);
            // `step` always consumes at least one byte when `rest` is non-empty.
            let used = used.max(1).min(rest.len());
            let range = i..i + used;
            let offset = self.pos;
            push_event(&mut out, class, offset, range);
            i += used;
            self.pos += used as u64;
        }
        out
    }

    /// Consumes a prefix of `rest` in the current state; returns its length and its class.
    fn step(&mut self, rest: &[u8]) -> (usize, BodyClass) {
        match &mut self.state {
            State::Raw => (rest.len(), BodyClass::Inspect),
            State::UntilClose(class) => (rest.len(), *class),
            State::Body { remaining, class } => {
                let class = *class;
                let n = (*remaining).min(rest.len() as u64) as usize;
                *remaining -= n as u64;
                if *remaining == 0 {
                    self.next_message();
                }
                (n, class)
            }
            State::Head(buf) => {
                // Copy up to the end of the header block (or all of `rest`).
                let mut used = 0;
                let mut complete = false;
                for &b in rest {
                    used += 1;
                    buf.push(b);
                    if head_complete(buf) {
                        complete = true;
                        break;
                    }
                    if buf.len() > MAX_HEAD {
                        break;
                    }
                }
                if complete {
                    let head = std::mem::take(buf);
                    self.on_head(&head);
                } else if buf.len() > MAX_HEAD {
                    self.go_raw("header block too large");
                }
                (used, BodyClass::Inspect)
            }
            State::Chunked { state, class } => {
                let class = *class;
                let (used, next) = chunk_step(state, rest);
                match next {
                    ChunkNext::Continue => {}
                    ChunkNext::Done => self.next_message(),
                    ChunkNext::Invalid(why) => self.go_raw(why),
                }
                (used, class)
            }
        }
    }

    fn next_message(&mut self) {
        self.state = State::Head(Vec::new());
        self.announced = false;
    }

    fn go_raw(&mut self, why: &'static str) {
        self.state = State::Raw;
        self.raw_reason = Some(why);
    }

    fn on_head(&mut self, head: &[u8]) {
        match parse_head(head) {
            Err(why) => self.go_raw(why),
            Ok(h) if h.blank => {
                // Stray CRLFs between messages: keep them in the current (empty) message.
                self.state = State::Head(Vec::new());
            }
            Ok(h) => {
                let class = if h.content_type.as_deref().is_some_and(is_skipped_type) {
                    BodyClass::Skip
                } else {
                    BodyClass::Inspect
                };
                self.state = match h.framing {
                    Framing::None | Framing::Length(0) => {
                        self.next_message();
                        return;
                    }
                    Framing::Length(n) => State::Body {
                        remaining: n,
                        class,
                    },
                    Framing::Chunked => State::Chunked {
                        state: ChunkState::Size(Vec::new()),
                        class,
                    },
                    Framing::UntilClose => State::UntilClose(class),
                };
            }
        }
    }
}

fn push_event(out: &mut Vec<FrameEvent>, class: BodyClass, offset: u64, range: Range<usize>) {
    // Merge with the previous event of the same class when contiguous.
    match (out.last_mut(), class) {
        (Some(FrameEvent::Inspect { range: r, .. }), BodyClass::Inspect)
        | (Some(FrameEvent::Skip { range: r, .. }), BodyClass::Skip)
            if r.end == range.start =>
        {
            r.end = range.end;
        }
        (_, BodyClass::Inspect) => out.push(FrameEvent::Inspect { offset, range }),
        (_, BodyClass::Skip) => out.push(FrameEvent::Skip { offset, range }),
    }
}

fn head_complete(buf: &[u8]) -> bool {
    // A head made only of CRLFs so far is "complete" after its first line (stray empty line).
    if buf == b"\r\n" || buf == b"\n" {
        return true;
    }
    buf.ends_with(b"\r\n\r\n") || buf.ends_with(b"\n\n")
}

enum ChunkNext {
    Continue,
    Done,
    Invalid(&'static str),
}

fn chunk_step(state: &mut ChunkState, rest: &[u8]) -> (usize, ChunkNext) {
    match state {
        ChunkState::Data(n) => {
            let k = (*n).min(rest.len() as u64) as usize;
            *n -= k as u64;
            if *n == 0 {
                *state = ChunkState::DataEnd(2);
            }
            (k, ChunkNext::Continue)
        }
        ChunkState::DataEnd(left) => {
            let Some(&b) = rest.first() else {
                return (0, ChunkNext::Continue);
            };
            match (*left, b) {
                (2, b'\r') => *left = 1,
                (2, b'\n') | (1, b'\n') => *state = ChunkState::Size(Vec::new()),
                _ => return (1, ChunkNext::Invalid("bad CRLF after chunk data")),
            }
            (1, ChunkNext::Continue)
        }
        ChunkState::Size(line) => {
            let Some(&b) = rest.first() else {
                return (0, ChunkNext::Continue);
            };
            if b != b'\n' {
                line.push(b);
                if line.len() > MAX_CHUNK_LINE {
                    return (1, ChunkNext::Invalid("chunk-size line too long"));
                }
                return (1, ChunkNext::Continue);
            }
            let text = line.strip_suffix(b"\r").unwrap_or(line);
            let hex_part = text.split(|&c| c == b';').next().unwrap_or_default();
            let hex_part = trim(hex_part);
            match parse_hex(hex_part) {
                None => (1, ChunkNext::Invalid("bad chunk size")),
                Some(0) => {
                    *state = ChunkState::Trailer(0);
                    (1, ChunkNext::Continue)
                }
                Some(n) => {
                    *state = ChunkState::Data(n);
                    (1, ChunkNext::Continue)
                }
            }
        }
        ChunkState::Trailer(len) => {
            let Some(&b) = rest.first() else {
                return (0, ChunkNext::Continue);
            };
            if b == b'\n' {
                if *len == 0 {
                    return (1, ChunkNext::Done);
                }
                *len = 0;
            } else if b != b'\r' {
                *len += 1;
                if *len > MAX_HEAD {
                    return (1, ChunkNext::Invalid("trailer too long"));
                }
            }
            (1, ChunkNext::Continue)
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Framing {
    None,
    Length(u64),
    Chunked,
    UntilClose,
}

#[derive(Debug)]
struct Head {
    blank: bool,
    framing: Framing,
    content_type: Option<String>,
}

fn trim(s: &[u8]) -> &[u8] {
    let start = s
        .iter()
        .position(|c| !c.is_ascii_whitespace())
        .unwrap_or(s.len());
    let end = s
        .iter()
        .rposition(|c| !c.is_ascii_whitespace())
        .map_or(start, |e| e + 1);
    s.get(start..end).unwrap_or_default()
}

fn parse_hex(s: &[u8]) -> Option<u64> {
    if s.is_empty() || s.len() > 15 {
        return None;
    }
    let text = std::str::from_utf8(s).ok()?;
    u64::from_str_radix(text, 16).ok()
}

fn parse_dec(s: &[u8]) -> Option<u64> {
    if s.is_empty() || s.len() > 18 || !s.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(s).ok()?.parse().ok()
}

fn parse_head(head: &[u8]) -> Result<Head, &'static str> {
    let mut lines = head
        .split(|&b| b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l));
    let start = lines.next().unwrap_or_default();
    if start.is_empty() {
        return Ok(Head {
            blank: true,
            framing: Framing::None,
            content_type: None,
        });
    }
    let mut parts = start.splitn(3, |&b| b == b' ');
    let first = parts.next().unwrap_or_default();
    let second = parts.next().unwrap_or_default();
    let third = parts.next().unwrap_or_default();
    let is_response = first.starts_with(b"HTTP/1.");
    let status = if is_response {
        if second.len() != 3 {
            return Err("bad status line");
        }
        Some(parse_dec(second).ok_or("bad status code")?)
    } else {
        let method_ok = !first.is_empty() && first.iter().all(|c| c.is_ascii_uppercase());
        if !method_ok || second.is_empty() || !third.starts_with(b"HTTP/1.") {
            return Err("not an HTTP/1.x request or response");
        }
        None
    };
    let mut length: Option<u64> = None;
    let mut chunked = false;
    let mut content_type = None;
    for line in lines {
        if line.is_empty() {
            break;
        }
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            return Err("header line without colon");
        };
        let name = line.get(..colon).unwrap_or_default();
        let value = trim(line.get(colon + 1..).unwrap_or_default());
        if name.eq_ignore_ascii_case(b"content-length") {
            let n = parse_dec(value).ok_or("bad Content-Length")?;
            if length.is_some_and(|m| m != n) {
                return Err("conflicting Content-Length");
            }
            length = Some(n);
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            let last = value.rsplit(|&b| b == b',').next().unwrap_or_default();
            chunked = trim(last).eq_ignore_ascii_case(b"chunked");
            if !chunked {
                // Another transfer coding as the last one: the body runs to close (responses)
                // or cannot be framed (requests).
                if status.is_none() {
                    return Err("request with a non-chunked transfer coding");
                }
            }
        } else if name.eq_ignore_ascii_case(b"content-type") {
            content_type = Some(String::from_utf8_lossy(value).to_ascii_lowercase());
        }
    }
    let has_te = chunked;
    let framing = match status {
        Some(s) if (100..200).contains(&s) || s == 204 || s == 304 => Framing::None,
        _ if has_te => Framing::Chunked,
        _ => match (length, status) {
            (Some(n), _) => Framing::Length(n),
            (None, Some(_)) => Framing::UntilClose,
            (None, None) => Framing::None,
        },
    };
    Ok(Head {
        blank: false,
        framing,
        content_type,
    })
}

/// Whether a body with this `Content-Type` value is left untokenized: images, video, audio, fonts
/// and archives (the spec's list). Parameters after `;` are ignored; the comparison is
/// case-insensitive.
pub fn is_skipped_type(content_type: &str) -> bool {
    let media = content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    const PREFIXES: [&str; 4] = ["image/", "video/", "audio/", "font/"];
    const ARCHIVES_AND_FONTS: [&str; 17] = [
        "application/zip",
        "application/gzip",
        "application/x-gzip",
        "application/x-bzip",
        "application/x-bzip2",
        "application/x-xz",
        "application/x-7z-compressed",
        "application/x-rar-compressed",
        "application/vnd.rar",
        "application/x-tar",
        "application/zstd",
        "application/x-compress",
        "application/font-woff",
        "application/font-woff2",
        "application/x-font-ttf",
        "application/x-font-otf",
        "application/vnd.ms-fontobject",
    ];
    PREFIXES.iter().any(|p| media.starts_with(p)) || ARCHIVES_AND_FONTS.contains(&media.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn classes(framer: &mut HttpFramer, data: &[u8]) -> (Vec<u64>, Vec<u8>, Vec<u8>) {
        let mut starts = Vec::new();
        let mut inspected = Vec::new();
        let mut skipped = Vec::new();
        for ev in framer.push(data) {
            match ev {
                FrameEvent::MessageStart(o) => starts.push(o),
                FrameEvent::Inspect { range, .. } => inspected.extend_from_slice(&data[range]),
                FrameEvent::Skip { range, .. } => skipped.extend_from_slice(&data[range]),
            }
        }
        (starts, inspected, skipped)
    }

    #[test]
    fn image_body_is_skipped_and_next_message_framed() {
        let msg = b"HTTP/1.1 200 OK\r\nContent-Type: image/png\r\nContent-Length: 5\r\n\r\nPNG!!HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 3\r\n\r\nabc";
        let mut f = HttpFramer::new();
        let (starts, inspected, skipped) = classes(&mut f, msg);
        assert_eq!(skipped, b"PNG!!");
        assert!(inspected.ends_with(b"\r\n\r\nabc"));
        let second = msg.windows(6).rposition(|w| w == b"HTTP/1").unwrap() as u64;
        assert_eq!(starts, vec![0, second]);
        assert_eq!(f.raw_reason(), None);
    }

    #[test]
    fn chunked_skipped_body_covers_framing() {
        let msg = b"HTTP/1.1 200 OK\r\nContent-Type: video/mp4\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\nGET / HTTP/1.1\r\n\r\n";
        let mut f = HttpFramer::new();
        let (starts, inspected, skipped) = classes(&mut f, msg);
        assert_eq!(skipped, b"3\r\nabc\r\n0\r\n\r\n");
        assert!(inspected.ends_with(b"GET / HTTP/1.1\r\n\r\n"));
        assert_eq!(starts.len(), 2);
    }

    #[test]
    fn non_http_goes_raw_and_inspects_everything() {
        let mut f = HttpFramer::new();
        let (starts, inspected, skipped) = classes(&mut f, b"\x00\x01binary stuff\r\n\r\nmore");
        assert_eq!(starts, vec![0]);
        assert!(skipped.is_empty());
        assert_eq!(inspected.len(), 22);
        assert!(f.raw_reason().is_some());
    }

    #[test]
    fn split_pushes_give_same_classification() {
        let msg = b"POST /x HTTP/1.1\r\nContent-Type: application/zip\r\nContent-Length: 4\r\n\r\nZIPZGET /y HTTP/1.1\r\n\r\n";
        let whole = classes(&mut HttpFramer::new(), msg);
        let mut f = HttpFramer::new();
        let mut acc = (Vec::new(), Vec::new(), Vec::new());
        for piece in msg.chunks(3) {
            let (s, i, k) = classes(&mut f, piece);
            acc.0.extend(s);
            acc.1.extend(i);
            acc.2.extend(k);
        }
        assert_eq!(whole, acc);
        assert_eq!(acc.2, b"ZIPZ");
    }

    #[test]
    fn skip_list() {
        assert!(is_skipped_type("Image/JPEG; q=1"));
        assert!(is_skipped_type("font/woff2"));
        assert!(is_skipped_type("application/x-7z-compressed"));
        assert!(!is_skipped_type("text/html; charset=utf-8"));
        assert!(!is_skipped_type("application/json"));
    }
}
