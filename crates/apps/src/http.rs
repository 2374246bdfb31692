//! The mbTLS paper's HTTP proxy: insert one header into every HTTP/1.1 request.
//!
//! Requests travel client → server as a byte stream split at arbitrary points, possibly several
//! requests back to back (pipelining). The parser buffers only the request head (request line
//! and header fields) until it is complete, inserts the header before the blank line that ends
//! it, and then streams the body through unchanged while tracking its framing (RFC 9112 §6):
//! `Transfer-Encoding: chunked`, `Content-Length`, or no body. Responses are not touched.
//!
//! Ambiguous or malformed framing (both Transfer-Encoding and Content-Length, conflicting
//! Content-Length values, a non-chunked final transfer coding, bad chunk sizes, over-long
//! heads) closes the session: a proxy that guessed here would open the door to request
//! smuggling, where proxy and server disagree on where a request ends.
//!
//! After a `CONNECT` request or a request carrying `Upgrade`, the rest of the client's stream
//! is passed through untouched: it may no longer be HTTP/1.1 (whether the server accepted the
//! switch is not tracked, so later pipelined requests on such a connection get no header).

use crate::app::{CloseAlert, Direction, MiddleboxApp, Verdict};

/// Size limits that bound what one connection can make the proxy buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpLimits {
    /// Longest request head (request line + header fields + blank line).
    pub max_head_len: usize,
    /// Most header fields in one request.
    pub max_headers: usize,
    /// Longest chunk-size line (with extensions).
    pub max_chunk_line_len: usize,
    /// Longest trailer section of a chunked body.
    pub max_trailer_len: usize,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            max_head_len: 64 * 1024,
            max_headers: 128,
            max_chunk_line_len: 4096,
            max_trailer_len: 64 * 1024,
        }
    }
}

/// Why a request stream was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HttpError {
    #[error("invalid header to insert: {0}")]
    BadInsertedHeader(&'static str),
    #[error("request head longer than {0} bytes")]
    HeadTooLong(usize),
    #[error("malformed request head: {0}")]
    BadHead(String),
    #[error("ambiguous or invalid message framing: {0}")]
    BadFraming(&'static str),
    #[error("malformed chunked body: {0}")]
    BadChunk(&'static str),
}

/// Where the client→server parser is.
#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    /// Collecting a request head; `scan` is where the search for its end resumes.
    Head { scan: usize },
    /// Streaming `remaining` bytes of a Content-Length body.
    Body { remaining: u64 },
    /// Reading a chunk-size line (its bytes so far are in `line`).
    ChunkSize,
    /// Streaming chunk data.
    ChunkData { remaining: u64 },
    /// After chunk data: CRLF. `cr` once the CR was seen.
    ChunkDataEnd { cr: bool },
    /// Trailer section: `line_len` bytes on the current line, `total` in the section.
    Trailer { line_len: usize, total: usize },
    /// Not HTTP/1.1 any more (CONNECT / Upgrade): pass everything through.
    Opaque,
    /// A framing error closed the session; nothing more is forwarded.
    Failed,
}

/// What follows a request head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    None,
    Length(u64),
    Chunked,
}

/// Inserts `name: value` into every HTTP/1.1 request (client → server); responses pass through.
#[derive(Debug, Clone)]
pub struct HttpHeaderInsert {
    /// The encoded line, `name: value\r\n`.
    line: Vec<u8>,
    limits: HttpLimits,
    state: State,
    /// Pending bytes of the current head or chunk-size line.
    buf: Vec<u8>,
    /// After the current request: switch to [`State::Opaque`].
    opaque_after: bool,
    requests: u64,
    error: Option<HttpError>,
}

impl HttpHeaderInsert {
    /// A proxy inserting `name: value`. The name must be an RFC 9110 token and the value visible
    /// ASCII, spaces or tabs (no CR/LF: a value with a line break would inject headers).
    pub fn new(name: &str, value: &str) -> Result<Self, HttpError> {
        Self::with_limits(name, value, HttpLimits::default())
    }

    pub fn with_limits(name: &str, value: &str, limits: HttpLimits) -> Result<Self, HttpError> {
        if name.is_empty() || !name.bytes().all(is_token_char) {
            return Err(HttpError::BadInsertedHeader("name is not a token"));
        }
        if !value
            .bytes()
            .all(|b| b == b'\t' || b == b' ' || (0x21..=0x7e).contains(&b))
        {
            return Err(HttpError::BadInsertedHeader(
                "value has control or non-ASCII bytes",
            ));
        }
        let mut line = Vec::with_capacity(name.len() + value.len() + 4);
        line.extend_from_slice(name.as_bytes());
        line.extend_from_slice(b": ");
        line.extend_from_slice(value.trim_matches([' ', '\t']).as_bytes());
        line.extend_from_slice(b"\r\n");
        Ok(HttpHeaderInsert {
            line,
            limits,
            state: State::Head { scan: 0 },
            buf: Vec::new(),
            opaque_after: false,
            requests: 0,
            error: None,
        })
    }

    /// Requests whose head was completed (and got the header) so far.
    pub fn requests(&self) -> u64 {
        self.requests
    }

    /// Why the stream was refused, once it was.
    pub fn error(&self) -> Option<&HttpError> {
        self.error.as_ref()
    }

    fn fail(&mut self, e: HttpError) -> Verdict {
        self.state = State::Failed;
        self.buf.clear();
        self.error = Some(e);
        Verdict::Close(CloseAlert::ACCESS_DENIED)
    }

    /// In a counted body (Content-Length, or a chunk's data) with at least `n` bytes left: the
    /// state after `n` more of them, which are forwarded as they are. `None` in any other state.
    fn after_counted(&mut self, n: u64) -> Option<State> {
        Some(match self.state {
            State::Body { remaining } if n <= remaining => match remaining - n {
                0 => self.next_request(),
                remaining => State::Body { remaining },
            },
            State::ChunkData { remaining } if n <= remaining => match remaining - n {
                0 => State::ChunkDataEnd { cr: false },
                remaining => State::ChunkData { remaining },
            },
            _ => return None,
        })
    }

    /// The state after a request's body ended.
    fn next_request(&mut self) -> State {
        if self.opaque_after {
            State::Opaque
        } else {
            State::Head { scan: 0 }
        }
    }

    fn requests_in(&mut self, mut data: &[u8], out: &mut Vec<u8>) -> Result<(), HttpError> {
        while !data.is_empty() {
            match self.state.clone() {
                State::Failed => return Ok(()),
                State::Opaque => {
                    out.extend_from_slice(data);
                    return Ok(());
                }
                State::Head { scan } => {
                    // Blank lines before a request line are allowed (RFC 9112 §2.2); forward them.
                    if self.buf.is_empty() {
                        let skip = data
                            .iter()
                            .take_while(|b| **b == b'\r' || **b == b'\n')
                            .count();
                        let (lead, rest) = data.split_at(skip);
                        out.extend_from_slice(lead);
                        data = rest;
                        if data.is_empty() {
                            return Ok(());
                        }
                    }
                    let room = self.limits.max_head_len.saturating_sub(self.buf.len());
                    let take = data.len().min(room.max(1));
                    let (now, rest) = data.split_at(take);
                    self.buf.extend_from_slice(now);
                    match find_head_end(&self.buf, scan) {
                        Some(end) => {
                            // Bytes after the head belong to the body or the next request.
                            let extra = self.buf.len() - end;
                            let consumed = now
                                .len()
                                .checked_sub(extra)
                                .ok_or(HttpError::BadHead("head end before new input".into()))?;
                            self.buf.truncate(end);
                            data = data.get(consumed..).unwrap_or(&[]);
                            self.finish_head(out)?;
                        }
                        None => {
                            if self.buf.len() >= self.limits.max_head_len {
                                return Err(HttpError::HeadTooLong(self.limits.max_head_len));
                            }
                            self.state = State::Head {
                                scan: self.buf.len().saturating_sub(2),
                            };
                            data = rest;
                        }
                    }
                }
                State::Body { remaining } | State::ChunkData { remaining } => {
                    let n = usize::try_from(remaining)
                        .unwrap_or(usize::MAX)
                        .min(data.len());
                    let (body, rest) = data.split_at(n);
                    out.extend_from_slice(body);
                    data = rest;
                    if let Some(next) = self.after_counted(n as u64) {
                        self.state = next;
                    }
                }
                State::ChunkSize => {
                    let Some((&b, rest)) = data.split_first() else {
                        return Ok(());
                    };
                    out.push(b);
                    data = rest;
                    if b == b'\n' {
                        let size = parse_chunk_size(&self.buf)?;
                        self.buf.clear();
                        self.state = if size == 0 {
                            State::Trailer {
                                line_len: 0,
                                total: 0,
                            }
                        } else {
                            State::ChunkData { remaining: size }
                        };
                    } else {
                        if self.buf.len() >= self.limits.max_chunk_line_len {
                            return Err(HttpError::BadChunk("chunk-size line too long"));
                        }
                        self.buf.push(b);
                    }
                }
                State::ChunkDataEnd { cr } => {
                    let Some((&b, rest)) = data.split_first() else {
                        return Ok(());
                    };
                    out.push(b);
                    data = rest;
                    self.state = match (cr, b) {
                        (false, b'\r') => State::ChunkDataEnd { cr: true },
                        (_, b'\n') => State::ChunkSize,
                        _ => return Err(HttpError::BadChunk("missing CRLF after chunk data")),
                    };
                }
                State::Trailer { line_len, total } => {
                    let Some((&b, rest)) = data.split_first() else {
                        return Ok(());
                    };
                    out.push(b);
                    data = rest;
                    let total = total + 1;
                    if total > self.limits.max_trailer_len {
                        return Err(HttpError::BadChunk("trailer section too long"));
                    }
                    self.state = match b {
                        b'\n' if line_len == 0 => self.next_request(),
                        b'\n' => State::Trailer { line_len: 0, total },
                        // A CR does not count as line content, so "\r\n" ends the section.
                        b'\r' => State::Trailer { line_len, total },
                        _ => State::Trailer {
                            line_len: line_len + 1,
                            total,
                        },
                    };
                }
            }
        }
        Ok(())
    }

    /// The head in `self.buf` is complete: validate it, insert the header, forward it, and set
    /// up the body's framing.
    fn finish_head(&mut self, out: &mut Vec<u8>) -> Result<(), HttpError> {
        let head = core::mem::take(&mut self.buf);
        let mut headers = vec![httparse::EMPTY_HEADER; self.limits.max_headers];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(&head) {
            Ok(httparse::Status::Complete(n)) if n == head.len() => {}
            Ok(_) => return Err(HttpError::BadHead("incomplete head".into())),
            Err(e) => return Err(HttpError::BadHead(e.to_string())),
        }
        let method = req.method.unwrap_or_default();
        let mut content_length: Option<u64> = None;
        let mut transfer_codings: Vec<String> = Vec::new();
        let mut upgrade = method.eq_ignore_ascii_case("CONNECT");
        for h in req.headers.iter() {
            if h.name.eq_ignore_ascii_case("content-length") {
                for v in split_list(h.value) {
                    let n =
                        parse_decimal(v).ok_or(HttpError::BadFraming("invalid Content-Length"))?;
                    match content_length {
                        Some(prev) if prev != n => {
                            return Err(HttpError::BadFraming("conflicting Content-Length"))
                        }
                        _ => content_length = Some(n),
                    }
                }
            } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
                for v in split_list(h.value) {
                    transfer_codings.push(String::from_utf8_lossy(v).to_ascii_lowercase());
                }
            } else if h.name.eq_ignore_ascii_case("upgrade") {
                upgrade = true;
            }
        }
        let framing = match (transfer_codings.last(), content_length) {
            (Some(_), Some(_)) => {
                return Err(HttpError::BadFraming(
                    "both Transfer-Encoding and Content-Length",
                ))
            }
            (Some(last), None) if last == "chunked" => {
                if transfer_codings.iter().filter(|c| *c == "chunked").count() > 1 {
                    return Err(HttpError::BadFraming("chunked applied twice"));
                }
                Framing::Chunked
            }
            (Some(_), None) => {
                return Err(HttpError::BadFraming(
                    "request transfer coding does not end in chunked",
                ))
            }
            (None, Some(n)) => Framing::Length(n),
            (None, None) => Framing::None,
        };
        // Insert before the blank line that ends the head ("\r\n" or a bare "\n").
        let blank = if head.ends_with(b"\r\n") { 2 } else { 1 };
        let split = head.len().saturating_sub(blank);
        let (fields, end) = head.split_at(split);
        out.extend_from_slice(fields);
        out.extend_from_slice(&self.line);
        out.extend_from_slice(end);
        self.requests += 1;
        self.opaque_after = upgrade;
        self.state = match framing {
            Framing::None | Framing::Length(0) => self.next_request(),
            Framing::Length(n) => State::Body { remaining: n },
            Framing::Chunked => State::ChunkSize,
        };
        Ok(())
    }
}

impl MiddleboxApp for HttpHeaderInsert {
    fn on_data(&mut self, dir: Direction, data: &[u8], out: &mut Vec<u8>) -> Verdict {
        match dir {
            Direction::ServerToClient => {
                out.extend_from_slice(data);
                Verdict::Continue
            }
            Direction::ClientToServer => {
                if self.state == State::Failed {
                    return Verdict::Close(CloseAlert::ACCESS_DENIED);
                }
                match self.requests_in(data, out) {
                    Ok(()) => Verdict::Continue,
                    Err(e) => self.fail(e),
                }
            }
        }
    }

    /// Responses, and request bytes that lie wholly inside a body the parser only counts (a
    /// Content-Length body, chunk data) or after a switch away from HTTP/1.1, pass unchanged;
    /// anything that may hold a request head, a chunk-size line or a trailer goes to `on_data`.
    fn pass_unchanged(&mut self, dir: Direction, data: &[u8]) -> Option<Verdict> {
        if dir == Direction::ServerToClient {
            return Some(Verdict::Continue);
        }
        if self.state != State::Opaque {
            self.state = self.after_counted(u64::try_from(data.len()).ok()?)?;
        }
        Some(Verdict::Continue)
    }

    fn on_end(&mut self, dir: Direction, out: &mut Vec<u8>) -> Verdict {
        // An unfinished head is not a request: forward it as it is (the server will see a
        // truncated request and reject it); there is nothing to insert into.
        if dir == Direction::ClientToServer && matches!(self.state, State::Head { .. }) {
            out.append(&mut self.buf);
        }
        Verdict::Continue
    }
}

/// RFC 9110 §5.6.2 `tchar`.
fn is_token_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
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

/// Elements of a comma-separated field value, trimmed, empty ones skipped.
fn split_list(v: &[u8]) -> impl Iterator<Item = &[u8]> {
    v.split(|b| *b == b',')
        .map(|s| s.trim_ascii())
        .filter(|s| !s.is_empty())
}

/// 1*DIGIT that fits a u64.
fn parse_decimal(v: &[u8]) -> Option<u64> {
    if v.is_empty() || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    core::str::from_utf8(v).ok()?.parse().ok()
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

#[cfg(test)]
mod tests {
    use super::*;

    fn run(app: &mut HttpHeaderInsert, chunks: &[&[u8]]) -> (Vec<u8>, Verdict) {
        let mut out = Vec::new();
        let mut v = Verdict::Continue;
        for c in chunks {
            v = app.on_data(Direction::ClientToServer, c, &mut out);
            if v != Verdict::Continue {
                break;
            }
        }
        (out, v)
    }

    fn proxy() -> HttpHeaderInsert {
        HttpHeaderInsert::new("X-Mbtls", "seen").unwrap()
    }

    #[test]
    fn inserts_before_blank_line() {
        let mut app = proxy();
        let (out, v) = run(&mut app, &[b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"]);
        assert_eq!(v, Verdict::Continue);
        assert_eq!(out, b"GET / HTTP/1.1\r\nHost: a\r\nX-Mbtls: seen\r\n\r\n");
        assert_eq!(app.requests(), 1);
    }

    #[test]
    fn bare_lf_heads_and_leading_blank_lines() {
        let mut app = proxy();
        let (out, _) = run(&mut app, &[b"\r\nGET / HTTP/1.1\nHost: a\n\n"]);
        assert_eq!(out, b"\r\nGET / HTTP/1.1\nHost: a\nX-Mbtls: seen\r\n\n");
    }

    #[test]
    fn content_length_body_is_not_parsed_as_a_request() {
        let body = b"GET /fake HTTP/1.1\r\n\r\n";
        let req = format!("POST / HTTP/1.1\r\nContent-Length: {}\r\n\r\n", body.len());
        let mut stream = req.into_bytes();
        stream.extend_from_slice(body);
        stream.extend_from_slice(b"GET /2 HTTP/1.1\r\n\r\n");
        let mut app = proxy();
        let (out, v) = run(&mut app, &[&stream]);
        assert_eq!(v, Verdict::Continue);
        assert_eq!(app.requests(), 2);
        let s = String::from_utf8(out).unwrap();
        assert_eq!(s.matches("X-Mbtls").count(), 2);
        assert!(s.contains("GET /fake HTTP/1.1\r\n\r\nGET /2"));
    }

    #[test]
    fn chunked_body_with_trailers() {
        let stream = b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n\
            4;ext=1\r\nGET \r\n0\r\nX-T: GET / HTTP/1.1\r\n\r\nGET /n HTTP/1.1\r\n\r\n";
        let mut app = proxy();
        for cut in 0..stream.len() {
            let mut app2 = proxy();
            let (out, v) = run(&mut app2, &[&stream[..cut], &stream[cut..]]);
            assert_eq!(v, Verdict::Continue);
            assert_eq!(app2.requests(), 2, "cut at {cut}");
            assert_eq!(
                String::from_utf8(out).unwrap().matches("X-Mbtls").count(),
                2
            );
        }
        let (_, v) = run(&mut app, &[stream]);
        assert_eq!(v, Verdict::Continue);
    }

    #[test]
    fn ambiguous_framing_closes() {
        for bad in [
            &b"POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"[..],
            b"POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: 3, 4\r\n\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: -3\r\n\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n",
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nab",
            b"GET / HTTP/1.1\r\nBad Header: x\r\n\r\n",
            b"\xff\xfe / HTTP/1.1\r\n\r\n",
        ] {
            let mut app = proxy();
            let (out, v) = run(&mut app, &[bad]);
            assert_eq!(v, Verdict::Close(CloseAlert::ACCESS_DENIED), "{bad:?}");
            assert!(app.error().is_some());
            // A refused head is never forwarded (chunk errors come after a forwarded head).
            if !bad.ends_with(b"zz\r\n") && !bad.ends_with(b"ab") {
                assert!(out.is_empty(), "{bad:?}");
            }
            // Nothing passes after the failure.
            let mut more = Vec::new();
            assert_eq!(
                app.on_data(
                    Direction::ClientToServer,
                    b"GET / HTTP/1.1\r\n\r\n",
                    &mut more
                ),
                Verdict::Close(CloseAlert::ACCESS_DENIED)
            );
            assert!(more.is_empty());
        }
    }

    #[test]
    fn head_limit() {
        let mut app = HttpHeaderInsert::with_limits(
            "X-A",
            "1",
            HttpLimits {
                max_head_len: 64,
                ..HttpLimits::default()
            },
        )
        .unwrap();
        let long = [b'a'; 100];
        let (out, v) = run(&mut app, &[b"GET / HTTP/1.1\r\nX: ", &long]);
        assert_eq!(v, Verdict::Close(CloseAlert::ACCESS_DENIED));
        assert_eq!(app.error(), Some(&HttpError::HeadTooLong(64)));
        assert!(out.is_empty());
    }

    #[test]
    fn upgrade_switches_to_opaque() {
        let mut app = proxy();
        let (out, v) = run(
            &mut app,
            &[b"GET /ws HTTP/1.1\r\nUpgrade: websocket\r\n\r\n\x81\x05hello GET / HTTP/1.1\r\n\r\n"],
        );
        assert_eq!(v, Verdict::Continue);
        assert_eq!(app.requests(), 1);
        assert!(out.ends_with(b"\x81\x05hello GET / HTTP/1.1\r\n\r\n"));
    }

    #[test]
    fn responses_untouched_and_partial_head_flushed_at_end() {
        let mut app = proxy();
        let mut out = Vec::new();
        app.on_data(
            Direction::ServerToClient,
            b"HTTP/1.1 200 OK\r\n\r\n",
            &mut out,
        );
        assert_eq!(out, b"HTTP/1.1 200 OK\r\n\r\n");
        out.clear();
        app.on_data(Direction::ClientToServer, b"GET / HT", &mut out);
        assert!(out.is_empty());
        app.on_end(Direction::ClientToServer, &mut out);
        assert_eq!(out, b"GET / HT");
    }

    /// Request bodies and responses are let through unchanged; heads are not.
    #[test]
    fn bodies_and_responses_pass_unchanged_heads_do_not() {
        let mut app = proxy();
        let c2s = Direction::ClientToServer;
        assert_eq!(
            app.pass_unchanged(Direction::ServerToClient, b"HTTP/1.1 200 OK\r\n"),
            Some(Verdict::Continue)
        );
        assert_eq!(app.pass_unchanged(c2s, b"POST / HTTP/1.1\r\n"), None);
        let (_, v) = run(
            &mut app,
            &[b"POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\n"],
        );
        assert_eq!(v, Verdict::Continue);
        assert_eq!(app.pass_unchanged(c2s, b"0123456"), Some(Verdict::Continue));
        // Longer than what is left of the body: the next head may start inside.
        assert_eq!(app.pass_unchanged(c2s, b"789GET"), None);
        assert_eq!(app.pass_unchanged(c2s, b"789"), Some(Verdict::Continue));
        assert_eq!(app.pass_unchanged(c2s, b"GET / HTTP/1.1\r\n\r\n"), None);
    }

    #[test]
    fn inserted_header_validated() {
        assert!(HttpHeaderInsert::new("X A", "v").is_err());
        assert!(HttpHeaderInsert::new("", "v").is_err());
        assert!(HttpHeaderInsert::new("X", "v\r\nEvil: 1").is_err());
        assert!(HttpHeaderInsert::new("X", "caf\u{e9}").is_err());
    }
}
