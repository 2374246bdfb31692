//! The mbTLS paper's HTTP proxy: insert one header into every HTTP/1.1 request.
//!
//! Requests travel client → server as a byte stream split at arbitrary points, possibly several
//! requests back to back (pipelining). The parser buffers only the request head (request line
//! and header fields) until it is complete, inserts the header before the blank line that ends
//! it, and then streams the body through unchanged while tracking its framing (RFC 9112 §6):
//! `Transfer-Encoding: chunked`, `Content-Length`, or no body. Responses are not changed.
//!
//! Ambiguous or malformed framing (both Transfer-Encoding and Content-Length, conflicting
//! Content-Length values, a non-chunked final transfer coding, bad chunk sizes, over-long
//! heads) closes the session: a proxy that guessed here would open the door to request
//! smuggling, where proxy and server disagree on where a request ends.
//!
//! Leaving HTTP/1.1 would take the rest of the connection out of the proxy's sight, so only
//! what cannot carry requests to the server is let through:
//! - A request carrying `Upgrade: websocket` and one `Sec-WebSocket-Key` asks to switch. The
//!   proxy then follows the server's responses ([`responses`]) and passes the rest of the
//!   client's stream through untouched only once the server has switched (a 101 with the
//!   `Sec-WebSocket-Accept` value for that key, which a server that merely answers with the
//!   status a client asks for cannot make up); if the server refuses, the next requests get
//!   the header as usual. Until the answer the client may send nothing more than
//!   blank lines (WebSocket clients wait for it anyway): other bytes close the session, since
//!   forwarding them unchanged would let a client send requests without the header (or with
//!   its own) by asking for a switch the server then refuses.
//! - An `Upgrade` naming anything else (`h2c`, whose HTTP/2 requests would reach the server
//!   without the header; `TLS/1.2`), or WebSocket without exactly one key, is removed from the
//!   request, so the server stays on
//!   HTTP/1.1 (the field is hop-by-hop, RFC 9110 §7.8).
//! - `CONNECT` closes the session: a tunnel would carry whatever the client likes past the
//!   proxy, and whether a 2xx opened one depends on the server being a proxy at all.
//!
//! Methods are case-sensitive (RFC 9110 §9.1): `connect` or `head` are other methods to the
//! server, and so to the proxy.

mod body;
mod head;
mod response_body;
mod responses;

pub use response_body::ResponseBody;

use body::{Body, Framing};
use head::Head;
use responses::{Awaited, Responses};

use crate::app::{CloseAlert, Direction, MiddleboxApp, Verdict};

/// Size limits that bound what one connection can make the proxy buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpLimits {
    /// Longest request or response head (start line + header fields + blank line).
    pub max_head_len: usize,
    /// Most header fields in one request or response.
    pub max_headers: usize,
    /// Longest chunk-size line (with extensions).
    pub max_chunk_line_len: usize,
    /// Longest trailer section of a chunked body.
    pub max_trailer_len: usize,
    /// Most requests awaiting their responses at once; past this the responses are no longer
    /// followed (a protocol switch then counts as refused).
    pub max_pipelined: usize,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            max_head_len: 64 * 1024,
            max_headers: 128,
            max_chunk_line_len: 4096,
            max_trailer_len: 64 * 1024,
            max_pipelined: 1024,
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
    #[error("malformed response head: {0}")]
    BadResponseHead(String),
    /// A 101 to a request that asked for no upgrade (the fetch's GET): a well-formed head
    /// after which nothing is HTTP.
    #[error("101 Switching Protocols: what follows is another protocol's, not HTTP")]
    SwitchedProtocols,
    #[error("ambiguous or invalid message framing: {0}")]
    BadFraming(&'static str),
    #[error("malformed chunked body: {0}")]
    BadChunk(&'static str),
    #[error("client sent data before the server answered its Upgrade")]
    DataBeforeUpgradeAnswer,
    #[error("CONNECT refused: a tunnel would carry requests past the proxy")]
    ConnectRefused,
    #[error("the request's Connection field names the inserted header (a proxy would drop it)")]
    ConnectionNamesTheHeader,
}

/// Where the client→server parser is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Collecting a request head.
    Head,
    /// In a request's body (see `HttpHeaderInsert::body`).
    Body,
    /// The last request asked to upgrade and the server has not answered yet.
    AwaitUpgrade,
    /// Not HTTP/1.1 any more (the server switched): pass everything through.
    Opaque,
    /// A framing error closed the session; nothing more is forwarded.
    Failed,
}

/// Inserts `name: value` into every HTTP/1.1 request (client → server); responses pass through.
#[derive(Debug, Clone)]
pub struct HttpHeaderInsert {
    /// The encoded line, `name: value\r\n`.
    line: Vec<u8>,
    /// The inserted field's name: the first `name_len` bytes of `line`.
    name_len: usize,
    limits: HttpLimits,
    state: State,
    /// The current request's head, until it is complete.
    head: Head,
    /// The current request's body.
    body: Body,
    /// Whether the current request asked to upgrade, and the server's answer once given (the
    /// server may answer before the request's body ended).
    upgrade: Upgrade,
    responses: Responses,
    requests: u64,
    error: Option<HttpError>,
}

/// Fields the proxy refuses to insert: the client already sent those that apply, and a second
/// one would change how the server frames the request (Content-Length, Transfer-Encoding: two
/// readings of one stream, the app's and the server's), where it routes it (Host), or how it
/// treats the connection. Found in an operator trial: `Transfer-Encoding: chunked` and
/// `Host` were taken, and every request then got a 400 from nginx.
const MESSAGE_CONTROL_FIELDS: [&str; 10] = [
    "Host",
    "Content-Length",
    "Transfer-Encoding",
    "Connection",
    "Upgrade",
    "Keep-Alive",
    "TE",
    "Trailer",
    "Proxy-Connection",
    "Expect",
];

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
        if MESSAGE_CONTROL_FIELDS
            .iter()
            .any(|f| f.eq_ignore_ascii_case(name))
        {
            return Err(HttpError::BadInsertedHeader(
                "name is a field that frames, routes or controls the message or its connection \
                 (Host, Content-Length, Transfer-Encoding, Connection, Upgrade, Keep-Alive, TE, \
                 Trailer, Proxy-Connection, Expect): a second one makes the request ambiguous \
                 (request smuggling) or one the server refuses",
            ));
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
            name_len: name.len(),
            limits,
            state: State::Head,
            head: Head::default(),
            body: Body::default(),
            upgrade: Upgrade::NotAsked,
            responses: Responses::default(),
            requests: 0,
            error: None,
        })
    }

    fn inserted_name(&self) -> &[u8] {
        self.line.get(..self.name_len).unwrap_or_default()
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
        self.head.take();
        self.error = Some(e);
        Verdict::Close(CloseAlert::ACCESS_DENIED)
    }

    /// The state after a request ended: the next request, or whatever its upgrade led to.
    fn next_request(&mut self) -> State {
        match core::mem::replace(&mut self.upgrade, Upgrade::NotAsked) {
            Upgrade::NotAsked | Upgrade::Answered { switched: false } => State::Head,
            Upgrade::Answered { switched: true } => State::Opaque,
            Upgrade::Asked => State::AwaitUpgrade,
        }
    }

    /// The server answered the upgrade the last request asked for.
    fn upgrade_answered(&mut self, switched: bool) {
        match self.state {
            State::AwaitUpgrade => {
                self.state = if switched { State::Opaque } else { State::Head };
            }
            State::Failed | State::Opaque => {}
            State::Head | State::Body => {
                if self.upgrade == Upgrade::Asked {
                    self.upgrade = Upgrade::Answered { switched };
                }
            }
        }
    }

    fn responses_in(&mut self, data: &[u8]) {
        if let Some(switched) = self.responses.read(data, &self.limits) {
            self.upgrade_answered(switched);
        }
    }

    fn requests_in(&mut self, mut data: &[u8], out: &mut Vec<u8>) -> Result<(), HttpError> {
        while !data.is_empty() {
            match self.state {
                State::Failed => return Ok(()),
                State::Opaque => {
                    out.extend_from_slice(data);
                    return Ok(());
                }
                State::AwaitUpgrade => {
                    // Blank lines go either way: as the new protocol's bytes or before the next
                    // request (RFC 9112 §2.2).
                    if self.head.leading_blank_lines(data) < data.len() {
                        return Err(HttpError::DataBeforeUpgradeAnswer);
                    }
                    out.extend_from_slice(data);
                    return Ok(());
                }
                State::Head => {
                    // Blank lines before a request line are allowed; they are forwarded.
                    let (lead, rest) = data.split_at(self.head.leading_blank_lines(data));
                    out.extend_from_slice(lead);
                    let max = self.limits.max_head_len;
                    let (used, complete) = self
                        .head
                        .collect(rest, max)
                        .map_err(|_| HttpError::HeadTooLong(max))?;
                    // Bytes after the head belong to the body or the next request.
                    data = rest.get(used..).unwrap_or_default();
                    if complete {
                        self.finish_head(out)?;
                    }
                }
                State::Body => {
                    let name = self.line.get(..self.name_len).unwrap_or_default();
                    let (used, ended) = self.body.read(data, &self.limits, name)?;
                    let (body, rest) = data.split_at(used.min(data.len()));
                    out.extend_from_slice(body);
                    data = rest;
                    if ended {
                        self.state = self.next_request();
                    }
                }
            }
        }
        Ok(())
    }

    /// The head collected is complete: validate it, insert the header, forward it, and set up
    /// the body's framing.
    fn finish_head(&mut self, out: &mut Vec<u8>) -> Result<(), HttpError> {
        let head = self.head.take();
        let mut headers = vec![httparse::EMPTY_HEADER; self.limits.max_headers];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(&head) {
            Ok(httparse::Status::Complete(n)) if n == head.len() => {}
            Ok(_) => return Err(HttpError::BadHead("incomplete head".into())),
            Err(e) => return Err(HttpError::BadHead(e.to_string())),
        }
        // Case-sensitive (RFC 9110 §9.1): `connect` is not CONNECT to the server either.
        let method = req.method.unwrap_or_default();
        if method == "CONNECT" {
            return Err(HttpError::ConnectRefused);
        }
        let head_method = method == "HEAD";
        // A proxy in front of the application removes the fields `Connection` names. Its
        // tokens are split on blanks and `;` too, not only on commas: older Apache
        // `mod_proxy` releases read `close X-Mbtls` as two names.
        if req.headers.iter().any(|h| {
            h.name.eq_ignore_ascii_case("connection")
                && h.value
                    .split(|b| matches!(b, b',' | b' ' | b'\t' | b';'))
                    .any(|t| t.eq_ignore_ascii_case(self.inserted_name()))
        }) {
            return Err(HttpError::ConnectionNamesTheHeader);
        }
        let fields = framing_fields(req.headers)?;
        // RFC 9112 §6.1: an HTTP/1.0 message with Transfer-Encoding has faulty framing (HTTP/1.0
        // servers ignore the field and would read the body as something else).
        if req.version == Some(0) && !fields.codings.is_empty() {
            return Err(HttpError::BadFraming(
                "Transfer-Encoding in an HTTP/1.0 request",
            ));
        }
        let framing = match (fields.codings.last(), fields.content_length) {
            (Some(_), Some(_)) => {
                return Err(HttpError::BadFraming(
                    "both Transfer-Encoding and Content-Length",
                ))
            }
            (Some(last), None) if last == "chunked" => {
                if fields.codings.iter().filter(|c| *c == "chunked").count() > 1 {
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
        // A WebSocket upgrade is followed only with one key: the switch then counts only if the
        // server's 101 carries the accept value for it, which an endpoint that merely answers
        // with the status a client asks for (and goes on parsing HTTP/1.1) cannot make up.
        let expected_accept = match (fields.upgrade, fields.websocket_keys.as_slice()) {
            (UpgradeField::WebSocket, [key]) => Some(websocket_accept(key)),
            _ => None,
        };
        let head = if fields.upgrade != UpgradeField::None && expected_accept.is_none() {
            without_upgrade_fields(&head)
        } else {
            head
        };
        // Insert before the blank line that ends the head ("\r\n" or a bare "\n").
        let blank = if head.ends_with(b"\r\n") { 2 } else { 1 };
        let split = head.len().saturating_sub(blank);
        let (before_blank, end) = head.split_at(split);
        out.extend_from_slice(before_blank);
        out.extend_from_slice(&self.line);
        out.extend_from_slice(end);
        self.requests += 1;
        let awaited = Awaited {
            head_method,
            expected_accept,
        };
        let followed = self.responses.expect(awaited, &self.limits);
        // An upgrade whose answer cannot be known counts as refused: the stream stays HTTP.
        self.upgrade = match (expected_accept, followed) {
            (None, _) => Upgrade::NotAsked,
            (Some(_), true) => Upgrade::Asked,
            (Some(_), false) => Upgrade::Answered { switched: false },
        };
        self.state = if self.body.start(framing) {
            State::Body
        } else {
            self.next_request()
        };
        Ok(())
    }
}

impl MiddleboxApp for HttpHeaderInsert {
    fn on_data(&mut self, dir: Direction, data: &[u8], out: &mut Vec<u8>) -> Verdict {
        match dir {
            Direction::ServerToClient => {
                out.extend_from_slice(data);
                self.responses_in(data);
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
        let n = u64::try_from(data.len()).ok()?;
        if dir == Direction::ServerToClient {
            if !self.responses.count(n) {
                self.responses_in(data);
            }
            return Some(Verdict::Continue);
        }
        match self.state {
            State::Opaque => {}
            State::Body => {
                if self.body.count(n)? {
                    self.state = self.next_request();
                }
            }
            _ => return None,
        }
        Some(Verdict::Continue)
    }

    fn close_reason(&self) -> Option<String> {
        self.error.as_ref().map(ToString::to_string)
    }

    fn on_end(&mut self, dir: Direction, _out: &mut Vec<u8>) -> Verdict {
        // An unfinished head is dropped, not forwarded: a lenient server would take the end of
        // the stream for the end of the head and serve a request without the header.
        if dir == Direction::ClientToServer && self.state == State::Head {
            self.head.take();
        }
        Verdict::Continue
    }
}

/// Where a request stands on switching protocols.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Upgrade {
    NotAsked,
    /// Asked, not answered yet.
    Asked,
    Answered {
        switched: bool,
    },
}

/// What a head's `Upgrade` fields ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum UpgradeField {
    None,
    /// WebSocket only.
    WebSocket,
    /// Anything else among the protocols named.
    Other,
}

/// What a head's fields say about its framing and about a protocol switch.
struct FramingFields {
    content_length: Option<u64>,
    /// Transfer codings, lower-cased, in the order applied.
    codings: Vec<String>,
    upgrade: UpgradeField,
    /// `Sec-WebSocket-Key` values, trimmed.
    websocket_keys: Vec<Vec<u8>>,
}

/// Reads `Content-Length` (all values must agree), `Transfer-Encoding`, `Upgrade` and
/// `Sec-WebSocket-Key`.
fn framing_fields(headers: &[httparse::Header]) -> Result<FramingFields, HttpError> {
    let mut fields = FramingFields {
        content_length: None,
        codings: Vec::new(),
        upgrade: UpgradeField::None,
        websocket_keys: Vec::new(),
    };
    for h in headers {
        if h.name.eq_ignore_ascii_case("content-length") {
            for v in split_list(h.value) {
                let n = parse_decimal(v).ok_or(HttpError::BadFraming("invalid Content-Length"))?;
                match fields.content_length {
                    Some(prev) if prev != n => {
                        return Err(HttpError::BadFraming("conflicting Content-Length"))
                    }
                    _ => fields.content_length = Some(n),
                }
            }
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            for v in split_list(h.value) {
                fields
                    .codings
                    .push(String::from_utf8_lossy(v).to_ascii_lowercase());
            }
        } else if h.name.eq_ignore_ascii_case("sec-websocket-key") {
            fields.websocket_keys.push(h.value.trim_ascii().to_vec());
        } else if h.name.eq_ignore_ascii_case("upgrade") {
            // `protocol-name ["/" protocol-version]`, case-insensitive (RFC 9110 §7.8); an
            // empty field names nothing a server could switch to.
            for protocol in split_list(h.value) {
                let name = protocol.split(|b| *b == b'/').next().unwrap_or_default();
                fields.upgrade = match (fields.upgrade, name.eq_ignore_ascii_case(b"websocket")) {
                    (UpgradeField::Other, _) | (_, false) => UpgradeField::Other,
                    (_, true) => UpgradeField::WebSocket,
                };
            }
        }
    }
    Ok(fields)
}

/// The `Sec-WebSocket-Accept` value a server answers `key` with (RFC 6455 §4.2.2): base64 of
/// the SHA-1 of the key and the protocol's GUID.
fn websocket_accept(key: &[u8]) -> [u8; 28] {
    use base64::Engine as _;
    let mut sha1 = ring::digest::Context::new(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY);
    sha1.update(key);
    sha1.update(b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11");
    let digest = sha1.finish();
    let mut accept = [0u8; 28];
    // 20 bytes always encode to 28.
    let _ = base64::engine::general_purpose::STANDARD.encode_slice(digest, &mut accept);
    accept
}

/// `head` without its `Upgrade` field lines. Request heads have no folded lines (httparse
/// refuses them), so each field is one line.
fn without_upgrade_fields(head: &[u8]) -> Vec<u8> {
    let mut kept = Vec::with_capacity(head.len());
    for (i, line) in head.split_inclusive(|b| *b == b'\n').enumerate() {
        let name = line.split(|b| *b == b':').next().unwrap_or_default();
        if i > 0 && name.eq_ignore_ascii_case(b"upgrade") {
            continue;
        }
        kept.extend_from_slice(line);
    }
    kept
}

/// RFC 9110 §5.6.2 `tchar`.
fn is_token_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
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
            b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
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

    /// Chunked framing is read strictly (CRLF, hex digits first, no control bytes): servers
    /// differ in what they tolerate, and reading a line otherwise than the server allows
    /// smuggling (CVE-2025-22871 was a lone LF in a chunk line).
    #[test]
    fn chunk_lines_are_read_strictly() {
        for body in [
            &b"1\na\r\n0\r\n\r\n"[..],
            b" 1\r\na\r\n",
            b"1\x0c\r\na\r\n",
            b"1;ext\x01\r\na\r\n",
            b"1;ext\rx\r\na\r\n",
            b"1\r\na\n0\r\n\r\n",
            b"0\r\nX: y\n\r\n",
            b"0\r\nX: y\x00\r\n\r\n",
        ] {
            let mut app = proxy();
            let head = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n";
            let (_, v) = run(&mut app, &[head, body]);
            assert_eq!(v, Verdict::Close(CloseAlert::ACCESS_DENIED), "{body:?}");
            assert!(
                matches!(app.error(), Some(HttpError::BadChunk(_))),
                "{body:?}"
            );
        }
        // Blanks before an extension, extensions and trailers as the RFC has them.
        let mut app = proxy();
        let (_, v) = run(
            &mut app,
            &[b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n\
               1 \t;a=b;c=\"d e\"\r\nx\r\n0\r\nT: v\tw\r\n\r\nGET / HTTP/1.1\r\n\r\n"],
        );
        assert_eq!(v, Verdict::Continue);
        assert_eq!(app.requests(), 2);
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

    /// Feeds the server's bytes (through `pass_unchanged` when `counted`, as the relay does).
    fn respond(app: &mut HttpHeaderInsert, data: &[u8], counted: bool) {
        let s2c = Direction::ServerToClient;
        if counted {
            assert_eq!(app.pass_unchanged(s2c, data), Some(Verdict::Continue));
        } else {
            let mut out = Vec::new();
            assert_eq!(app.on_data(s2c, data, &mut out), Verdict::Continue);
            assert_eq!(out, data, "responses pass unchanged");
        }
    }

    /// A WebSocket upgrade, and the server's 101 for it (the key and accept value of RFC 6455's
    /// example).
    const UPGRADE: &[u8] =
        b"GET /ws HTTP/1.1\r\nUpgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n";
    const SWITCHED: &[u8] = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\
        Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n";
    const FORGED: &[u8] = b"GET /admin HTTP/1.1\r\nX-Mbtls: forged\r\n\r\n";

    /// The stream is still HTTP to the app: a request with a forged header of the same name
    /// passes, and gets the app's own after it. `case` names the case in a failure.
    fn still_inserts(app: &mut HttpHeaderInsert, case: &dyn core::fmt::Debug) {
        let (out, v) = run(app, &[FORGED]);
        assert_eq!(v, Verdict::Continue, "{case:?}");
        assert!(out.ends_with(b"X-Mbtls: seen\r\n\r\n"), "{case:?}");
    }

    #[test]
    fn a_switch_the_server_accepted_makes_the_rest_opaque() {
        for counted in [false, true] {
            let mut app = proxy();
            let (out, v) = run(&mut app, &[UPGRADE]);
            assert_eq!(v, Verdict::Continue);
            assert!(out.ends_with(b"X-Mbtls: seen\r\n\r\n"));
            respond(&mut app, &[SWITCHED, b"\x81\x02hi"].concat(), counted);
            let (out, v) = run(&mut app, &[b"\x81\x05hello GET / HTTP/1.1\r\n\r\n"]);
            assert_eq!(v, Verdict::Continue);
            assert_eq!(out, b"\x81\x05hello GET / HTTP/1.1\r\n\r\n");
            assert_eq!(app.requests(), 1);
        }
    }

    /// Before, any request asking for an upgrade made the rest of the stream opaque: a client
    /// could send requests without the header, or with its own, once the server refused.
    #[test]
    fn requests_after_a_refused_switch_still_get_the_header() {
        for counted in [false, true] {
            let mut app = proxy();
            run(&mut app, &[UPGRADE]);
            respond(
                &mut app,
                b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
                counted,
            );
            let (out, v) = run(&mut app, &[FORGED]);
            assert_eq!(v, Verdict::Continue);
            assert_eq!(
                out,
                b"GET /admin HTTP/1.1\r\nX-Mbtls: forged\r\nX-Mbtls: seen\r\n\r\n"
            );
            assert_eq!(app.requests(), 2);
        }
    }

    #[test]
    fn data_before_the_upgrade_is_answered_closes_the_session() {
        let mut app = proxy();
        // Blank lines may come first: they are forwarded whatever the answer will be.
        let (out, v) = run(&mut app, &[UPGRADE, b"\r\n", FORGED]);
        assert_eq!(v, Verdict::Close(CloseAlert::ACCESS_DENIED));
        assert!(out.ends_with(b"X-Mbtls: seen\r\n\r\n\r\n"), "{out:?}");
        assert_eq!(app.error(), Some(&HttpError::DataBeforeUpgradeAnswer));
        assert_eq!(app.pass_unchanged(Direction::ClientToServer, b"x"), None);
    }

    /// A tunnel would carry anything past the proxy, and a 2xx opens one only if the server is
    /// a proxy: CONNECT is refused before anything of it is forwarded. Methods are
    /// case-sensitive, so `connect` is an ordinary request (it gets the header and opens
    /// nothing), as is `head`, whose response has a body.
    #[test]
    fn connect_is_refused_and_methods_are_case_sensitive() {
        refused_unforwarded(
            b"CONNECT example.test:443 HTTP/1.1\r\nHost: example.test:443\r\n\r\n",
            HttpError::ConnectRefused,
        );

        let mut app = proxy();
        let (out, v) = run(
            &mut app,
            &[
                b"connect /x HTTP/1.1\r\n\r\nhead /echo HTTP/1.1\r\n\r\n",
                UPGRADE,
            ],
        );
        assert_eq!(v, Verdict::Continue);
        assert_eq!(
            String::from_utf8_lossy(&out)
                .matches("X-Mbtls: seen")
                .count(),
            3
        );
        // The `connect` answered with 200 (an origin server) opens no tunnel; the `head`
        // response's body quotes a 101, which is not the answer to the upgrade: that is the
        // real 101 after it, so the stream switches then. (Read as HEAD, the body would be
        // taken for the upgrade's answer, refused for lack of an accept value, and the real
        // 101 would answer nothing: the stream would stay HTTP.)
        respond(
            &mut app,
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
            false,
        );
        respond(
            &mut app,
            b"HTTP/1.1 200 OK\r\nContent-Length: 36\r\n\r\nHTTP/1.1 101 Switching Protocols\r\n\r\n",
            false,
        );
        respond(&mut app, SWITCHED, false);
        let (out, v) = run(&mut app, &[FORGED]);
        assert_eq!(v, Verdict::Continue);
        assert_eq!(out, FORGED);
    }

    /// An upgrade to anything but WebSocket (h2c would carry HTTP/2 requests without the
    /// header) is taken out of the request: the server stays on HTTP/1.1.
    #[test]
    fn upgrades_other_than_websocket_are_removed() {
        for upgrade in ["h2c", "websocket, h2c", "TLS/1.2", "HTTP/2.0"] {
            let mut app = proxy();
            let request = format!(
                "GET / HTTP/1.1\r\nHost: a\r\nConnection: Upgrade, HTTP2-Settings\r\n\
                 Upgrade: {upgrade}\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n\r\n"
            );
            let (out, v) = run(&mut app, &[request.as_bytes(), FORGED]);
            assert_eq!(v, Verdict::Continue, "{upgrade}");
            assert_eq!(
                String::from_utf8(out).unwrap(),
                format!(
                    "GET / HTTP/1.1\r\nHost: a\r\nConnection: Upgrade, HTTP2-Settings\r\n\
                     HTTP2-Settings: AAMAAABkAAQAAP__\r\nX-Mbtls: seen\r\n\r\n\
                     GET /admin HTTP/1.1\r\nX-Mbtls: forged\r\nX-Mbtls: seen\r\n\r\n"
                ),
                "{upgrade}"
            );
        }
        // WebSocket, in any case, is kept (with its key).
        let mut app = proxy();
        let (out, _) = run(
            &mut app,
            &[b"GET / HTTP/1.1\r\nUpgrade: WebSocket\r\nSec-WebSocket-Key: a\r\n\r\n"],
        );
        assert!(String::from_utf8_lossy(&out).contains("Upgrade: WebSocket\r\n"));
    }

    /// The answer to a switch is the response after those of the requests before it, whatever
    /// their bodies hold: a chunked body quoting a 101, a HEAD response announcing a body it
    /// does not have, 204 and 304, interim responses.
    #[test]
    fn responses_are_matched_to_their_requests() {
        let stream: &[u8] = b"GET /a HTTP/1.1\r\n\r\nHEAD /b HTTP/1.1\r\n\r\n\
            GET /c HTTP/1.1\r\n\r\nGET /d HTTP/1.1\r\n\r\n\
            POST /ws HTTP/1.1\r\nUpgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
            Content-Length: 2\r\n\r\nhi";
        let responses: &[u8] = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\
            1c\r\nHTTP/1.1 101 Switching Pr...\r\n0\r\n\r\n\
            HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n\
            HTTP/1.1 204 No Content\r\n\r\nHTTP/1.1 304 Not Modified\r\nContent-Length: 7\r\n\r\n\
            HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 101 Switching Protocols\r\n\
            Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n";
        for cut in 0..responses.len() {
            for counted in [false, true] {
                let mut app = proxy();
                let (_, v) = run(&mut app, &[stream]);
                assert_eq!(v, Verdict::Continue);
                respond(&mut app, &responses[..cut], counted);
                respond(&mut app, &responses[cut..], counted);
                let (out, v) = run(&mut app, &[b"PRI * HTTP/2.0\r\n\r\n"]);
                assert_eq!(v, Verdict::Continue, "cut at {cut}");
                assert_eq!(out, b"PRI * HTTP/2.0\r\n\r\n", "cut at {cut}");
            }
        }
    }

    /// A server may answer before the request's body has arrived.
    #[test]
    fn an_answer_before_the_end_of_the_body_applies_after_it() {
        for switched in [false, true] {
            let mut app = proxy();
            run(
                &mut app,
                &[
                    b"POST / HTTP/1.1\r\nUpgrade: websocket\r\nContent-Length: 4\r\n\
                    Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\nab",
                ],
            );
            let answer: &[u8] = if switched {
                SWITCHED
            } else {
                b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
            };
            respond(&mut app, answer, false);
            let (out, v) = run(&mut app, &[b"cd", FORGED]);
            assert_eq!(v, Verdict::Continue);
            assert_eq!(out.ends_with(FORGED), switched);
        }
    }

    /// Responses the proxy cannot follow make a switch count as refused, never as accepted.
    #[test]
    fn a_switch_whose_answer_cannot_be_known_counts_as_refused() {
        for garbage in [
            &b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n"[..],
            b"NOT HTTP\r\n\r\n",
            b"HTTP/1.1 101 Switching Protocols\r\n\r\n",
        ] {
            let mut app = proxy();
            run(&mut app, &[b"GET / HTTP/1.1\r\n\r\n"]);
            respond(&mut app, garbage, false);
            run(&mut app, &[UPGRADE]);
            respond(&mut app, SWITCHED, false);
            still_inserts(&mut app, &garbage);
        }
        // Lost while the switch is awaited: the client's next bytes are HTTP again.
        let mut app = proxy();
        run(&mut app, &[UPGRADE]);
        respond(&mut app, b"HTTP/1.1 abc\r\n\r\n", false);
        still_inserts(&mut app, &"lost while awaited");
    }

    #[test]
    fn too_many_requests_awaiting_answers_stop_the_following() {
        let limits = HttpLimits {
            max_pipelined: 2,
            ..HttpLimits::default()
        };
        let mut app = HttpHeaderInsert::with_limits("X-Mbtls", "seen", limits).unwrap();
        run(
            &mut app,
            &[b"GET / HTTP/1.1\r\n\r\nGET / HTTP/1.1\r\n\r\n", UPGRADE],
        );
        respond(
            &mut app,
            b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
            false,
        );
        respond(
            &mut app,
            b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
            false,
        );
        respond(&mut app, SWITCHED, false);
        still_inserts(&mut app, &"past the limit");
    }

    /// An endpoint that answers with the status a client asks for (`/status/101`) and goes on
    /// parsing HTTP/1.1 cannot make the app stop inserting: a 101 counts only with the
    /// `Sec-WebSocket-Accept` for the request's one key, and an upgrade without a key is taken
    /// out of the request.
    #[test]
    fn a_101_counts_only_with_the_accept_value_for_the_key() {
        for answer in [
            &b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n"[..],
            b"HTTP/1.1 101 Switching Protocols\r\nSec-WebSocket-Accept: AAAAAAAAAAAAAAAAAAAAAAAAAAA=\r\n\r\n",
            b"HTTP/1.1 101 Switching Protocols\r\nSec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\
              Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n",
        ] {
            let mut app = proxy();
            run(&mut app, &[UPGRADE]);
            respond(&mut app, answer, false);
            still_inserts(&mut app, &answer);
        }
        for keys in ["", "Sec-WebSocket-Key: a\r\nSec-WebSocket-Key: b\r\n"] {
            let mut app = proxy();
            let request = format!("GET /ws HTTP/1.1\r\nUpgrade: websocket\r\n{keys}\r\n");
            let (out, _) = run(&mut app, &[request.as_bytes()]);
            assert!(!String::from_utf8_lossy(&out).contains("Upgrade"), "{keys}");
        }
    }

    /// A proxy in front of the application would drop a field the request's `Connection` names,
    /// separated by commas or, for older Apache releases, by blanks.
    #[test]
    fn a_connection_field_naming_the_header_closes_the_session() {
        for value in [
            "keep-alive, x-mbtls",
            "close X-Mbtls",
            "close\tx-mbtls",
            "a;X-MBTLS",
        ] {
            let request = format!("GET /admin HTTP/1.1\r\nHost: a\r\nConnection: {value}\r\n\r\n");
            refused_unforwarded(request.as_bytes(), HttpError::ConnectionNamesTheHeader);
        }
        // A longer token is another name.
        let mut app = proxy();
        let request = b"GET / HTTP/1.1\r\nConnection: close, x-mbtls-other\r\n\r\n";
        let (_, v) = run(&mut app, &[request]);
        assert_eq!(v, Verdict::Continue);
    }

    /// A chunk-size line is checked as its bytes come: one that cannot be a valid line is
    /// refused before any byte of it is passed on, however the stream is cut (a bare CR ends a
    /// line for lenient servers, which would read what follows as a new request).
    #[test]
    fn a_bad_chunk_size_line_is_refused_before_it_is_passed_on() {
        let head = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n";
        for line in [
            &b"0\r\rGET /admin HTTP/1.1\rHost: a\r\r"[..],
            b"1;ext\rx",
            b"zz",
            b"1 2",
        ] {
            for cut in 1..=line.len() {
                let mut app = proxy();
                let (out, v) = run(&mut app, &[head, &line[..cut]]);
                let (out2, v2) = if v == Verdict::Continue {
                    run(&mut app, &[&line[cut..]])
                } else {
                    (Vec::new(), v)
                };
                let all = [out, out2].concat();
                let forwarded = all
                    .len()
                    .saturating_sub(head.len() + b"X-Mbtls: seen\r\n".len());
                // Whatever was passed on of the line is what could still begin a good one.
                assert!(
                    forwarded == 0 || check_line_start_ok(&line[..forwarded]),
                    "{line:?} cut at {cut}: {all:?}"
                );
                assert_eq!(
                    v2,
                    Verdict::Close(CloseAlert::ACCESS_DENIED),
                    "{line:?} cut at {cut}"
                );
            }
        }
        // A CR before the line's CRLF: refused at its LF as before.
        {
            let mut app = proxy();
            let (_, v) = run(&mut app, &[head, b"0\r\r\n"]);
            assert_eq!(v, Verdict::Close(CloseAlert::ACCESS_DENIED));
        }
    }

    /// Hex digits first, and a CR, if any, only last (the LF it waits for may still come: a
    /// server that ends a line at a bare CR then has a line as good as ours, and nothing after
    /// that CR but its LF is ever passed on).
    fn check_line_start_ok(bytes: &[u8]) -> bool {
        let cr = bytes.iter().position(|b| *b == b'\r');
        bytes.first().is_some_and(u8::is_ascii_hexdigit)
            && cr.is_none_or(|at| at + 1 == bytes.len())
    }

    /// A trailer field with the inserted field's name is refused at its colon (a server that
    /// merges trailers into the header section would read the client's value last).
    #[test]
    fn a_trailer_with_the_inserted_name_is_refused() {
        let stream =
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nx-mbtls: forged\r\n\r\n";
        for cut in 0..stream.len() {
            let mut app = proxy();
            let (out, v) = run(&mut app, &[&stream[..cut], &stream[cut..]]);
            assert_eq!(v, Verdict::Close(CloseAlert::ACCESS_DENIED), "cut at {cut}");
            assert!(
                !String::from_utf8_lossy(&out).contains("x-mbtls:"),
                "cut at {cut}"
            );
        }
        // Another name that begins the same is fine.
        let fine =
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX-Mbtls-Other: a\r\n\r\n";
        let mut app = proxy();
        let (_, v) = run(&mut app, &[fine]);
        assert_eq!(v, Verdict::Continue);
        assert_eq!(app.requests(), 1);
    }

    /// `request` ends the session with access_denied for `why`, nothing of it forwarded.
    fn refused_unforwarded(request: &[u8], why: HttpError) {
        let mut app = proxy();
        let (out, v) = run(&mut app, &[request]);
        assert_eq!(v, Verdict::Close(CloseAlert::ACCESS_DENIED));
        assert!(out.is_empty());
        assert_eq!(app.error(), Some(&why));
    }

    #[test]
    fn responses_untouched_and_partial_head_dropped_at_end() {
        let mut app = proxy();
        let mut out = Vec::new();
        app.on_data(
            Direction::ServerToClient,
            b"HTTP/1.1 200 OK\r\n\r\n",
            &mut out,
        );
        assert_eq!(out, b"HTTP/1.1 200 OK\r\n\r\n");
        out.clear();
        // A lenient server would take the end of the stream for the end of the head: an
        // unfinished head is not forwarded.
        app.on_data(
            Direction::ClientToServer,
            b"GET /admin HTTP/1.1\r\nX-Mbtls: forged\r\n",
            &mut out,
        );
        assert!(out.is_empty());
        app.on_end(Direction::ClientToServer, &mut out);
        assert!(out.is_empty());
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
        for name in [
            "Host",
            "content-length",
            "TRANSFER-ENCODING",
            "Connection",
            "te",
        ] {
            let e = HttpHeaderInsert::new(name, "1").err();
            assert!(
                e.is_some_and(|e| e.to_string().contains("request smuggling")),
                "{name}"
            );
        }
        // A longer name that begins like one is another field.
        assert!(HttpHeaderInsert::new("Host-Info", "1").is_ok());
    }
}
