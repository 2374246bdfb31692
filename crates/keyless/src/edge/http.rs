//! The small part of HTTP/1.1 the edge needs, sans-I/O: request and response heads, body framing
//! (Content-Length, chunked, until close) and serialization. Heads are bounded; anything this
//! module does not understand is an error the driver answers with 400 or 502.

/// Largest request or response head accepted.
pub const MAX_HEAD: usize = 16 * 1024;

/// Why bytes are not acceptable HTTP.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HttpError {
    /// The head is longer than [`MAX_HEAD`].
    #[error("head too large")]
    HeadTooLarge,
    /// Malformed start line, header or framing.
    #[error("malformed HTTP: {0}")]
    Malformed(&'static str),
    /// A body larger than the configured bound.
    #[error("body too large")]
    BodyTooLarge,
}

/// Header fields in order; names compared case-insensitively.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Headers(pub Vec<(String, String)>);

impl Headers {
    /// The first value of `name`.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// All values of `name`.
    pub fn get_all<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.0
            .iter()
            .filter(move |(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Whether a comma-separated header (Connection, Cache-Control) has `token`.
    pub fn has_token(&self, name: &str, token: &str) -> bool {
        self.get_all(name)
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case(token))
    }

    /// Copies without hop-by-hop fields (RFC 9110 §7.6.1), including those Connection names.
    pub fn end_to_end(&self) -> Headers {
        const HOP: [&str; 8] = [
            "connection",
            "keep-alive",
            "proxy-connection",
            "proxy-authenticate",
            "proxy-authorization",
            "te",
            "trailer",
            "transfer-encoding",
        ];
        let named: Vec<String> = self
            .get_all("connection")
            .flat_map(|v| v.split(','))
            .map(|t| t.trim().to_ascii_lowercase())
            .collect();
        Headers(
            self.0
                .iter()
                .filter(|(n, _)| {
                    let l = n.to_ascii_lowercase();
                    !HOP.contains(&l.as_str()) && l != "upgrade" && !named.contains(&l)
                })
                .cloned()
                .collect(),
        )
    }
}

/// A request head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHead {
    /// Method.
    pub method: String,
    /// Request target as sent.
    pub target: String,
    /// Minor version (`HTTP/1.x`).
    pub minor: u8,
    /// Fields.
    pub headers: Headers,
}

/// A response head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseHead {
    /// Status code.
    pub status: u16,
    /// Reason phrase.
    pub reason: String,
    /// Fields.
    pub headers: Headers,
}

/// Where the head ends (index after `\r\n\r\n`), if it is complete.
pub fn head_end(buf: &[u8]) -> Result<Option<usize>, HttpError> {
    match buf.windows(4).position(|w| w == b"\r\n\r\n") {
        Some(i) if i + 4 <= MAX_HEAD => Ok(Some(i + 4)),
        Some(_) => Err(HttpError::HeadTooLarge),
        None if buf.len() > MAX_HEAD => Err(HttpError::HeadTooLarge),
        None => Ok(None),
    }
}

fn lines(head: &[u8]) -> Result<Vec<&str>, HttpError> {
    let text = std::str::from_utf8(head).map_err(|_| HttpError::Malformed("not UTF-8"))?;
    Ok(text
        .strip_suffix("\r\n\r\n")
        .unwrap_or(text)
        .split("\r\n")
        .collect())
}

fn parse_fields(lines: &[&str]) -> Result<Headers, HttpError> {
    let mut out = Vec::new();
    for line in lines {
        let (name, value) = line
            .split_once(':')
            .ok_or(HttpError::Malformed("header without colon"))?;
        let valid_name = !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
        if !valid_name {
            return Err(HttpError::Malformed("bad header name"));
        }
        if value.bytes().any(|b| b == b'\r' || b == b'\n' || b == 0) {
            return Err(HttpError::Malformed("bad header value"));
        }
        out.push((name.to_owned(), value.trim().to_owned()));
    }
    Ok(Headers(out))
}

fn minor_version(v: &str) -> Result<u8, HttpError> {
    match v {
        "HTTP/1.1" => Ok(1),
        "HTTP/1.0" => Ok(0),
        _ => Err(HttpError::Malformed("version")),
    }
}

/// Parses a complete request head (as delimited by [`head_end`]).
pub fn parse_request(head: &[u8]) -> Result<RequestHead, HttpError> {
    let lines = lines(head)?;
    let (first, rest) = lines.split_first().ok_or(HttpError::Malformed("empty"))?;
    let mut parts = first.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(HttpError::Malformed("request line"));
    };
    if method.is_empty() || !method.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err(HttpError::Malformed("method"));
    }
    if target.is_empty() || target.bytes().any(|b| b <= b' ' || b == 0x7f) {
        return Err(HttpError::Malformed("target"));
    }
    Ok(RequestHead {
        method: method.to_owned(),
        target: target.to_owned(),
        minor: minor_version(version)?,
        headers: parse_fields(rest)?,
    })
}

/// Parses a complete response head.
pub fn parse_response(head: &[u8]) -> Result<ResponseHead, HttpError> {
    let lines = lines(head)?;
    let (first, rest) = lines.split_first().ok_or(HttpError::Malformed("empty"))?;
    let mut parts = first.splitn(3, ' ');
    let (Some(version), Some(code)) = (parts.next(), parts.next()) else {
        return Err(HttpError::Malformed("status line"));
    };
    minor_version(version)?;
    let status: u16 = code
        .parse()
        .ok()
        .filter(|s| (100..=999).contains(s))
        .ok_or(HttpError::Malformed("status code"))?;
    Ok(ResponseHead {
        status,
        reason: parts.next().unwrap_or("").to_owned(),
        headers: parse_fields(rest)?,
    })
}

/// How a message body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// No body.
    None,
    /// Exactly this many bytes.
    Length(usize),
    /// Chunked transfer coding.
    Chunked,
    /// Until the connection closes (responses only).
    UntilClose,
}

fn content_length(headers: &Headers) -> Result<Option<usize>, HttpError> {
    let mut values = headers.get_all("content-length");
    let Some(first) = values.next() else {
        return Ok(None);
    };
    let n: usize = first
        .parse()
        .map_err(|_| HttpError::Malformed("content-length"))?;
    if values.any(|v| v != first) {
        return Err(HttpError::Malformed("conflicting content-length"));
    }
    Ok(Some(n))
}

fn is_chunked(headers: &Headers) -> Result<bool, HttpError> {
    match headers.get("transfer-encoding") {
        None => Ok(false),
        Some(te) if te.eq_ignore_ascii_case("chunked") => Ok(true),
        Some(_) => Err(HttpError::Malformed("transfer-encoding")),
    }
}

/// Framing of a request body.
pub fn request_framing(head: &RequestHead) -> Result<Framing, HttpError> {
    if is_chunked(&head.headers)? {
        if head.headers.get("content-length").is_some() {
            return Err(HttpError::Malformed("both chunked and content-length"));
        }
        return Ok(Framing::Chunked);
    }
    Ok(match content_length(&head.headers)? {
        Some(0) | None => Framing::None,
        Some(n) => Framing::Length(n),
    })
}

/// Framing of a response body to a request with `method`.
pub fn response_framing(method: &str, head: &ResponseHead) -> Result<Framing, HttpError> {
    if method == "HEAD" || head.status < 200 || head.status == 204 || head.status == 304 {
        return Ok(Framing::None);
    }
    if is_chunked(&head.headers)? {
        return Ok(Framing::Chunked);
    }
    Ok(match content_length(&head.headers)? {
        Some(0) => Framing::None,
        Some(n) => Framing::Length(n),
        None => Framing::UntilClose,
    })
}

/// Decodes a complete chunked body from `buf`: `Ok(Some((body, consumed)))` when the last chunk
/// and trailers are in, `Ok(None)` when more bytes are needed.
pub fn decode_chunked(buf: &[u8], max: usize) -> Result<Option<(Vec<u8>, usize)>, HttpError> {
    let mut body = Vec::new();
    let mut pos = 0usize;
    loop {
        let Some(rel) = buf
            .get(pos..)
            .and_then(|b| b.windows(2).position(|w| w == b"\r\n"))
        else {
            if buf.len().saturating_sub(pos) > 1024 {
                return Err(HttpError::Malformed("chunk size line"));
            }
            return Ok(None);
        };
        let line = buf
            .get(pos..pos + rel)
            .ok_or(HttpError::Malformed("chunk"))?;
        let size_text = std::str::from_utf8(line)
            .map_err(|_| HttpError::Malformed("chunk size"))?
            .split(';')
            .next()
            .unwrap_or("")
            .trim();
        let size =
            usize::from_str_radix(size_text, 16).map_err(|_| HttpError::Malformed("chunk size"))?;
        pos += rel + 2;
        if size == 0 {
            // Trailers until an empty line.
            loop {
                let Some(rel) = buf
                    .get(pos..)
                    .and_then(|b| b.windows(2).position(|w| w == b"\r\n"))
                else {
                    return Ok(None);
                };
                pos += rel + 2;
                if rel == 0 {
                    return Ok(Some((body, pos)));
                }
            }
        }
        if body.len().saturating_add(size) > max {
            return Err(HttpError::BodyTooLarge);
        }
        let end = pos.checked_add(size).ok_or(HttpError::BodyTooLarge)?;
        let Some(data) = buf.get(pos..end) else {
            return Ok(None);
        };
        match buf.get(end..end + 2) {
            None => return Ok(None),
            Some(b"\r\n") => {}
            Some(_) => return Err(HttpError::Malformed("chunk terminator")),
        }
        body.extend_from_slice(data);
        pos = end + 2;
    }
}

/// Serializes a response with a Content-Length (the edge always re-frames bodies).
pub fn write_response(
    status: u16,
    reason: &str,
    headers: &Headers,
    body: &[u8],
    close: bool,
) -> Vec<u8> {
    let mut out = format!("HTTP/1.1 {status} {reason}\r\n").into_bytes();
    for (n, v) in &headers.0 {
        if n.eq_ignore_ascii_case("content-length") {
            continue;
        }
        out.extend_from_slice(format!("{n}: {v}\r\n").as_bytes());
    }
    out.extend_from_slice(format!("Content-Length: {}\r\n", body.len()).as_bytes());
    if close {
        out.extend_from_slice(b"Connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body);
    out
}

/// A short text response generated by the edge itself.
pub fn simple_response(status: u16, reason: &str, text: &str, close: bool) -> Vec<u8> {
    let headers = Headers(vec![(
        "Content-Type".into(),
        "text/plain; charset=utf-8".into(),
    )]);
    write_response(
        status,
        reason,
        &headers,
        format!("{text}\n").as_bytes(),
        close,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_request_and_its_framing() {
        let raw = b"GET /a?b HTTP/1.1\r\nHost: x.test\r\nConnection: keep-alive, X-Drop\r\nX-Drop: 1\r\nX-Keep: 2\r\n\r\n";
        let end = head_end(raw).unwrap().unwrap();
        assert_eq!(end, raw.len());
        let r = parse_request(raw).unwrap();
        assert_eq!(
            (r.method.as_str(), r.target.as_str(), r.minor),
            ("GET", "/a?b", 1)
        );
        assert_eq!(r.headers.get("host"), Some("x.test"));
        let e2e = r.headers.end_to_end();
        assert!(e2e.get("x-drop").is_none() && e2e.get("connection").is_none());
        assert_eq!(e2e.get("x-keep"), Some("2"));
        assert_eq!(request_framing(&r).unwrap(), Framing::None);
        assert!(parse_request(b"GET / HTTP/2\r\n\r\n").is_err());
        assert!(parse_request(b"GET  / HTTP/1.1\r\n\r\n").is_err());
        assert!(parse_request(b"GET / HTTP/1.1\r\nBad Name: x\r\n\r\n").is_err());
        assert!(head_end(&vec![b'a'; MAX_HEAD + 1]).is_err());
    }

    #[test]
    fn decodes_chunked_bodies_incrementally() {
        let raw = b"4\r\nWiki\r\n5;ext=1\r\npedia\r\n0\r\nX-T: 1\r\n\r\nNEXT";
        for cut in 0..raw.len() - 4 {
            assert_eq!(decode_chunked(&raw[..cut], 100).unwrap(), None, "cut {cut}");
        }
        let (body, used) = decode_chunked(raw, 100).unwrap().unwrap();
        assert_eq!(body, b"Wikipedia");
        assert_eq!(&raw[used..], b"NEXT");
        assert_eq!(decode_chunked(raw, 5), Err(HttpError::BodyTooLarge));
        assert!(decode_chunked(b"zz\r\n", 100).is_err());
        assert!(decode_chunked(b"1\r\nabc", 100).is_err());
    }

    #[test]
    fn response_framing_follows_the_status_and_headers() {
        let h = parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n").unwrap();
        assert_eq!(response_framing("GET", &h).unwrap(), Framing::Length(3));
        assert_eq!(response_framing("HEAD", &h).unwrap(), Framing::None);
        let h = parse_response(b"HTTP/1.1 200 OK\r\n\r\n").unwrap();
        assert_eq!(response_framing("GET", &h).unwrap(), Framing::UntilClose);
        let h =
            parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n")
                .unwrap();
        assert!(response_framing("GET", &h).is_err());
    }
}
