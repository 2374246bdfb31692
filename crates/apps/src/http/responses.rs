//! Following the server's responses, to learn whether it accepted a WebSocket upgrade.
//!
//! After a request with `Upgrade: websocket`, what the client sends next is HTTP/1.1 only if
//! the server refused: a `101 Switching Protocols` carrying the `Sec-WebSocket-Accept` value
//! for the request's key makes the connection something else. So the proxy follows the
//! responses, matched to the requests in order (pipelining), with their body framing (RFC 9112
//! §6.3), and reports the answer to an upgrade. The responses themselves pass unchanged.
//!
//! A response stream it cannot follow (a malformed head, one past the limits, a response no
//! request asked for) is not refused: the server's bytes pass as before, but every later
//! switch counts as refused, so the client's stream stays HTTP/1.1 and keeps getting the
//! header. Wrong in the other direction would let a client stop the header insertion.

use std::collections::VecDeque;

use super::body::{Body, Framing};
use super::head::Head;
use super::{framing_fields, HttpError, HttpLimits};

/// What the proxy must know of a request to follow its response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Awaited {
    /// A `HEAD` request: its response has no body whatever its fields say.
    pub(super) head_method: bool,
    /// It asks to upgrade to WebSocket: the `Sec-WebSocket-Accept` value a 101 must carry for
    /// the switch to count.
    pub(super) expected_accept: Option<[u8; 28]>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Collecting a response head.
    Head,
    /// In a response's body.
    Body,
    /// Nothing more to follow: the server switched protocols, or the stream cannot be
    /// followed any more (either way a later upgrade's answer is not known).
    Stopped,
}

/// The server's responses, followed as far as telling a switch's answer needs.
#[derive(Debug, Clone)]
pub(super) struct Responses {
    state: State,
    head: Head,
    body: Body,
    awaited: VecDeque<Awaited>,
}

impl Default for Responses {
    fn default() -> Self {
        Responses {
            state: State::Head,
            head: Head::default(),
            body: Body::default(),
            awaited: VecDeque::new(),
        }
    }
}

impl Responses {
    /// A request head went to the server; its response comes after those already awaited.
    /// Returns `false` if its answer can never be known (the stream was lost, or too many
    /// requests are waiting), in which case a switch it asks for counts as refused.
    pub(super) fn expect(&mut self, request: Awaited, limits: &HttpLimits) -> bool {
        match self.state {
            State::Stopped => return false,
            State::Head | State::Body => {}
        }
        if self.awaited.len() >= limits.max_pipelined {
            self.lose();
            return false;
        }
        self.awaited.push_back(request);
        true
    }

    /// Whether `n` bytes of the server's stream can be followed by counting alone (inside a
    /// body, or past a switch); if so, counts them.
    pub(super) fn count(&mut self, n: u64) -> bool {
        match self.state {
            State::Stopped => true,
            State::Head => false,
            State::Body => match self.body.count(n) {
                Some(ended) => {
                    if ended {
                        self.state = State::Head;
                    }
                    true
                }
                None => false,
            },
        }
    }

    /// Follows `data` from the server. Returns the answer to a switch when this data held it:
    /// `Some(true)` switched, `Some(false)` refused (or no longer knowable).
    pub(super) fn read(&mut self, mut data: &[u8], limits: &HttpLimits) -> Option<bool> {
        let mut answer = None;
        while !data.is_empty() {
            match self.state {
                State::Stopped => break,
                State::Body => match self.body.read(data, limits, b"") {
                    Ok((used, ended)) => {
                        data = data.get(used..).unwrap_or_default();
                        if ended {
                            self.state = State::Head;
                        }
                    }
                    Err(_) => answer = answer.or(self.lose()),
                },
                State::Head => {
                    // Blank lines between responses are tolerated, as between requests.
                    data = data
                        .get(self.head.leading_blank_lines(data)..)
                        .unwrap_or_default();
                    match self.head.collect(data, limits.max_head_len) {
                        Ok((used, complete)) => {
                            data = data.get(used..).unwrap_or_default();
                            if complete {
                                answer = answer.or(self.finish_head(limits));
                            }
                        }
                        Err(_) => answer = answer.or(self.lose()),
                    }
                }
            }
        }
        answer
    }

    /// The head collected is complete: match it to its request and set up what follows.
    fn finish_head(&mut self, limits: &HttpLimits) -> Option<bool> {
        let head = self.head.take();
        let mut fields = vec![httparse::EMPTY_HEADER; limits.max_headers];
        let mut response = httparse::Response::new(&mut fields);
        let (Ok(httparse::Status::Complete(_)), Some(status)) =
            (response.parse(&head), response.code)
        else {
            return self.lose();
        };
        let Some(&request) = self.awaited.front() else {
            // A response no request asked for (or an interim one before any).
            return if (100..200).contains(&status) && status != 101 {
                self.state = State::Head;
                None
            } else {
                self.lose()
            };
        };
        if status == 101 {
            let accepts: Vec<&[u8]> = response
                .headers
                .iter()
                .filter(|h| h.name.eq_ignore_ascii_case("sec-websocket-accept"))
                .map(|h| h.value.trim_ascii())
                .collect();
            match (request.expected_accept, accepts.as_slice()) {
                (Some(expected), [accept]) if *accept == expected.as_slice() => {}
                // Not a WebSocket handshake's answer: whether the server switched is unknown.
                _ => return self.lose(),
            }
            self.awaited.clear();
            self.state = State::Stopped;
            return Some(true);
        }
        if (100..200).contains(&status) {
            // Interim (100 Continue, 103 Early Hints): the final response follows.
            self.state = State::Head;
            return None;
        }
        self.awaited.pop_front();
        let Ok(framing) = final_response_framing(status, request.head_method, response.headers)
        else {
            return self.lose();
        };
        self.state = if self.body.start(framing) {
            State::Body
        } else {
            State::Head
        };
        request.expected_accept.map(|_| false)
    }

    /// Stops following the stream. A switch still awaited counts as refused.
    fn lose(&mut self) -> Option<bool> {
        self.state = State::Stopped;
        self.head = Head::default();
        let pending = self.awaited.iter().any(|r| r.expected_accept.is_some());
        self.awaited = VecDeque::new();
        pending.then_some(false)
    }
}

/// How the body of a final (non-1xx) response with `status` and `headers` is delimited (RFC
/// 9112 §6.3); `head_method`: it answers a HEAD request.
pub(super) fn final_response_framing(
    status: u16,
    head_method: bool,
    headers: &[httparse::Header],
) -> Result<Framing, HttpError> {
    if head_method || status == 204 || status == 304 {
        return Ok(Framing::None);
    }
    let f = framing_fields(headers)?;
    Ok(match (f.codings.last(), f.content_length) {
        (Some(last), _) if last == "chunked" => Framing::Chunked,
        (Some(_), _) | (None, None) => Framing::UntilClose,
        (None, Some(n)) => Framing::Length(n),
    })
}
