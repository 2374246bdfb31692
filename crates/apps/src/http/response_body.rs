//! One response's body as the client that asked for it reads it (the CLI's fetch): its data,
//! chunked framing removed, and whether it came whole. A connection that closes before the
//! body's Content-Length or its last chunk is a cut body, which a client must not take for
//! the whole (curl: "transfer closed with N bytes remaining").

use super::body::{Body, Framing};
use super::responses::final_response_framing;
use super::{HttpError, HttpLimits};

/// The body of one final response to a GET, read as it arrives.
#[derive(Debug, Clone)]
pub struct ResponseBody {
    body: Body,
    framing: Framing,
    limits: HttpLimits,
    /// Data bytes read so far.
    data: u64,
}

impl ResponseBody {
    /// The body that follows `head`: a response's status line and header fields, with or
    /// without the blank line that ends them, answering a GET. An interim (1xx) or malformed
    /// head, or one with ambiguous framing, is an error.
    pub fn after_head(head: &[u8]) -> Result<ResponseBody, HttpError> {
        let limits = HttpLimits::default();
        // A control character in a field's value does not change where the body ends: read
        // as a space here (the head itself is shown as it came), as lenient clients do,
        // rather than leaving the body's end unchecked for it.
        let mut whole: Vec<u8> = head
            .iter()
            .map(|&b| match b {
                b'\r' | b'\n' | b'\t' => b,
                0..=0x1f | 0x7f => b' ',
                _ => b,
            })
            .collect();
        if !whole.ends_with(b"\r\n\r\n") {
            whole.extend_from_slice(b"\r\n\r\n");
        }
        let mut fields = vec![httparse::EMPTY_HEADER; limits.max_headers];
        let mut response = httparse::Response::new(&mut fields);
        // An obsolete line folding in a field (RFC 9112 §5.2) reads as a space, as curl
        // reads it.
        let parsed = httparse::ParserConfig::default()
            .allow_obsolete_multiline_headers_in_responses(true)
            .parse_response(&mut response, &whole);
        let status = match (parsed, response.code) {
            (Ok(httparse::Status::Complete(_)), Some(status)) => status,
            (Err(e), _) => return Err(HttpError::BadResponseHead(e.to_string())),
            _ => return Err(HttpError::BadResponseHead("incomplete".into())),
        };
        if status == 101 {
            // What follows is another protocol's, with no end that HTTP gives.
            return Err(HttpError::SwitchedProtocols);
        }
        if (100..200).contains(&status) {
            return Err(HttpError::BadResponseHead(format!(
                "interim response {status}, not a final one"
            )));
        }
        let framing = final_response_framing(status, false, response.headers)?;
        let mut body = Body::default();
        body.start(framing);
        Ok(ResponseBody {
            body,
            framing,
            limits,
            data: 0,
        })
    }

    /// Reads the next bytes after the head, giving `data_out` the body's data as it comes.
    /// Returns how many of `bytes` belong to the body: those after its end are not read
    /// ([`ended`](Self::ended) says whether it has). On an error, the data before the fault
    /// has been given.
    pub fn read(
        &mut self,
        bytes: &[u8],
        mut data_out: impl FnMut(&[u8]),
    ) -> Result<usize, HttpError> {
        let mut data = 0u64;
        let read = self.body.read_data(bytes, &self.limits, b"", |d| {
            data += d.len() as u64;
            data_out(d);
        });
        self.data += data;
        read.map(|(used, _)| used)
    }

    /// Whether the body has ended as its framing says.
    pub fn ended(&self) -> bool {
        self.body.ended()
    }

    /// How much of a body that ends by its framing has come, while it has not all come:
    /// `5 of its 9 bytes (Content-Length) came`, `5 bytes of data came, not its last chunk`.
    pub fn short_of_its_end(&self) -> Option<String> {
        if self.body.ended() {
            return None;
        }
        match self.framing {
            Framing::None | Framing::UntilClose => None,
            Framing::Length(total) => Some(format!(
                "{} of its {total} bytes (Content-Length) came",
                self.data
            )),
            Framing::Chunked => Some(format!(
                "{} bytes of data came, not its last chunk",
                self.data
            )),
        }
    }

    /// At the connection's orderly close: why the body is not whole, if it is not (its
    /// Content-Length not reached, its last chunk not come). A body delimited by the close is
    /// whole then.
    pub fn cut_at_close(&self) -> Option<String> {
        let came = self.short_of_its_end()?;
        Some(match self.framing {
            Framing::Chunked => format!(
                "the chunked response body was cut: the connection closed before its last chunk ({} bytes of data came)",
                self.data
            ),
            _ => format!("the response body was cut: {came} before the connection closed"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_all(head: &[u8], pieces: &[&[u8]]) -> (Vec<u8>, ResponseBody) {
        let mut body = ResponseBody::after_head(head).unwrap();
        let mut out = Vec::new();
        for p in pieces {
            body.read(p, |d| out.extend_from_slice(d)).unwrap();
        }
        (out, body)
    }

    #[test]
    fn a_content_length_body_is_whole_only_at_its_length() {
        let head = b"HTTP/1.1 200 OK\r\nContent-Length: 10";
        let (out, body) = read_all(head, &[b"01234", b"56789", b"extra"]);
        assert_eq!(out, b"0123456789");
        assert!(body.ended() && body.cut_at_close().is_none());
        let mut body = ResponseBody::after_head(head).unwrap();
        assert_eq!(body.read(b"0123456789extra", |_| {}), Ok(10));
        let (out, body) = read_all(head, &[b"0123"]);
        assert_eq!(out, b"0123");
        let why = body.cut_at_close().unwrap();
        assert!(why.contains("4 of its 10 bytes"), "{why}");
    }

    #[test]
    fn a_chunked_body_is_decoded_and_whole_only_after_its_last_chunk() {
        let head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";
        let wire: &[u8] = b"5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\nX-T: 1\r\n\r\n";
        // Every split of the stream into two pieces gives the same data.
        for at in 0..=wire.len() {
            let (a, b) = wire.split_at(at);
            let (out, body) = read_all(head, &[a, b]);
            assert_eq!(out, b"hello, world", "split at {at}");
            assert!(body.cut_at_close().is_none(), "split at {at}");
        }
        let (out, body) = read_all(head, &[b"5\r\nhello\r\n"]);
        assert_eq!(out, b"hello");
        assert!(body
            .cut_at_close()
            .unwrap()
            .contains("before its last chunk"));
        let mut bad = ResponseBody::after_head(head).unwrap();
        assert!(bad.read(b"zz\r\n", |_| {}).is_err());
    }

    #[test]
    fn bodies_without_framing_or_without_a_body() {
        let (out, body) = read_all(b"HTTP/1.0 200 OK\r\nServer: x", &[b"until the close"]);
        assert_eq!(out, b"until the close");
        assert!(body.cut_at_close().is_none());
        for head in [
            &b"HTTP/1.1 204 No Content\r\nContent-Length: 5"[..],
            b"HTTP/1.1 304 Not Modified",
        ] {
            let (out, body) = read_all(head, &[b"stray"]);
            assert!(out.is_empty() && body.ended());
        }
        assert!(ResponseBody::after_head(b"HTTP/1.1 100 Continue").is_err());
        // A control character in an unrelated field does not hide the framing.
        let (_, body) = read_all(
            b"HTTP/1.1 200 OK\r\nX: a\x1bb\r\nContent-Length: 3",
            &[b"ab"],
        );
        assert!(body.cut_at_close().is_some());
        assert!(ResponseBody::after_head(b"not http").is_err());
        assert!(ResponseBody::after_head(
            b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2"
        )
        .is_err());
    }
}
