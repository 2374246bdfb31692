//! Header insertion inserts exactly once per request, however the stream is split, and letting
//! bytes through unchanged where the app takes them changes nothing.

use mbx_apps::{Direction, HttpHeaderInsert, MiddleboxApp, Verdict};
use proptest::prelude::*;

/// One generated request: the bytes a client sends and the bytes the server must receive.
#[derive(Debug, Clone)]
struct Req {
    sent: Vec<u8>,
    expected: Vec<u8>,
}

const HEADER: &str = "X-Mbtls-Proxy: inserted";

fn request() -> impl Strategy<Value = Req> {
    let method = prop_oneof![Just("GET"), Just("POST"), Just("PUT")];
    let path = "/[a-z0-9/]{0,12}";
    let extra = proptest::collection::vec(("[A-Za-z][A-Za-z0-9-]{0,10}", "[ -~]{0,20}"), 0..4);
    // 0: no body, 1: Content-Length, 2: chunked
    let body_kind = 0u8..3;
    // Bodies deliberately contain request-like text and CRLFs.
    let body = proptest::collection::vec(
        prop_oneof![
            Just(b"GET / HTTP/1.1\r\n\r\n".to_vec()),
            Just(b"\r\n".to_vec()),
            Just(b"0\r\n\r\n".to_vec()),
            proptest::collection::vec(any::<u8>(), 0..40),
        ],
        0..5,
    )
    .prop_map(|parts| parts.concat());
    let chunk_sizes = proptest::collection::vec(1usize..30, 0..6);
    (method, path, extra, body_kind, body, chunk_sizes).prop_map(
        |(method, path, extra, kind, body, chunk_sizes)| {
            let mut head = format!("{method} /{path} HTTP/1.1\r\nHost: example.test\r\n");
            for (n, v) in &extra {
                // Never generate framing headers by accident.
                let lower = n.to_ascii_lowercase();
                if lower == "content-length" || lower == "transfer-encoding" || lower == "upgrade" {
                    continue;
                }
                head.push_str(&format!("{n}: {}\r\n", v.trim()));
            }
            let mut body_bytes = Vec::new();
            match kind {
                1 => {
                    head.push_str(&format!("Content-Length: {}\r\n", body.len()));
                    body_bytes = body;
                }
                2 => {
                    head.push_str("Transfer-Encoding: chunked\r\n");
                    let mut rest = &body[..];
                    let mut sizes = chunk_sizes.into_iter().cycle();
                    while !rest.is_empty() {
                        let n = sizes.next().unwrap_or(7).min(rest.len());
                        body_bytes.extend_from_slice(format!("{n:x};x=y\r\n").as_bytes());
                        body_bytes.extend_from_slice(&rest[..n]);
                        body_bytes.extend_from_slice(b"\r\n");
                        rest = &rest[n..];
                    }
                    body_bytes.extend_from_slice(b"0\r\nTrailer-A: GET / HTTP/1.1\r\n\r\n");
                }
                _ => {}
            }
            let mut sent = head.clone().into_bytes();
            sent.extend_from_slice(b"\r\n");
            sent.extend_from_slice(&body_bytes);
            let mut expected = head.into_bytes();
            expected.extend_from_slice(HEADER.as_bytes());
            expected.extend_from_slice(b"\r\n\r\n");
            expected.extend_from_slice(&body_bytes);
            Req { sent, expected }
        },
    )
}

fn split(data: &[u8], cuts: &[usize]) -> Vec<Vec<u8>> {
    let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (data.len() + 1)).collect();
    cuts.sort_unstable();
    let mut out = Vec::new();
    let mut prev = 0;
    for c in cuts.into_iter().chain([data.len()]) {
        out.push(data[prev..c].to_vec());
        prev = c;
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn inserts_exactly_once_per_request(
        reqs in proptest::collection::vec(request(), 1..6),
        cuts in proptest::collection::vec(any::<usize>(), 0..40),
    ) {
        let sent: Vec<u8> = reqs.iter().flat_map(|r| r.sent.clone()).collect();
        let expected: Vec<u8> = reqs.iter().flat_map(|r| r.expected.clone()).collect();
        let mut app = HttpHeaderInsert::new("X-Mbtls-Proxy", "inserted").unwrap();
        let mut out = Vec::new();
        for piece in split(&sent, &cuts) {
            prop_assert_eq!(app.on_data(Direction::ClientToServer, &piece, &mut out), Verdict::Continue);
        }
        prop_assert_eq!(app.on_end(Direction::ClientToServer, &mut out), Verdict::Continue);
        prop_assert_eq!(app.requests(), reqs.len() as u64);
        prop_assert_eq!(out, expected);
    }

    #[test]
    fn one_byte_at_a_time(reqs in proptest::collection::vec(request(), 1..4)) {
        let sent: Vec<u8> = reqs.iter().flat_map(|r| r.sent.clone()).collect();
        let expected: Vec<u8> = reqs.iter().flat_map(|r| r.expected.clone()).collect();
        let mut app = HttpHeaderInsert::new("X-Mbtls-Proxy", "inserted").unwrap();
        let mut out = Vec::new();
        for b in &sent {
            prop_assert_eq!(app.on_data(Direction::ClientToServer, &[*b], &mut out), Verdict::Continue);
        }
        prop_assert_eq!(out, expected);
    }

    /// What the app lets through unchanged (`pass_unchanged`; the core then forwards those
    /// bytes itself) plus what `on_data` forwards is exactly what `on_data` alone forwards,
    /// with the same verdicts and request count: for request streams (an upgrade among them,
    /// never answered, makes the next byte close the session), followed by garbage, cut
    /// anywhere, and for responses.
    #[test]
    fn bytes_passed_unchanged_are_what_on_data_would_forward(
        reqs in proptest::collection::vec(request(), 0..6),
        upgrade_at in proptest::option::of(0usize..6),
        tail in proptest::collection::vec(any::<u8>(), 0..64),
        cuts in proptest::collection::vec(any::<usize>(), 0..40),
        responses in any::<bool>(),
    ) {
        let mut sent = Vec::new();
        for (i, r) in reqs.iter().enumerate() {
            if upgrade_at == Some(i) {
                sent.extend_from_slice(b"GET /ws HTTP/1.1\r\nUpgrade: websocket\r\nSec-WebSocket-Key: k\r\n\r\n");
            }
            sent.extend_from_slice(&r.sent);
        }
        sent.extend_from_slice(&tail);
        let dir = if responses { Direction::ServerToClient } else { Direction::ClientToServer };
        let new = || HttpHeaderInsert::new("X-Mbtls-Proxy", "inserted").unwrap();
        let (mut offered, mut plain) = (new(), new());
        let (mut out_offered, mut out_plain) = (Vec::new(), Vec::new());
        for piece in split(&sent, &cuts) {
            let v_offered = match offered.pass_unchanged(dir, &piece) {
                Some(v) => {
                    if v == Verdict::Continue {
                        out_offered.extend_from_slice(&piece);
                    }
                    v
                }
                None => offered.on_data(dir, &piece, &mut out_offered),
            };
            let v_plain = plain.on_data(dir, &piece, &mut out_plain);
            prop_assert_eq!(v_offered, v_plain);
            if v_plain != Verdict::Continue {
                break;
            }
        }
        prop_assert_eq!(offered.on_end(dir, &mut out_offered), plain.on_end(dir, &mut out_plain));
        prop_assert_eq!(out_offered, out_plain);
        prop_assert_eq!(offered.requests(), plain.requests());
    }

    #[test]
    fn never_panics_on_garbage(
        data in proptest::collection::vec(any::<u8>(), 0..2048),
        cuts in proptest::collection::vec(any::<usize>(), 0..10),
    ) {
        let mut app = HttpHeaderInsert::new("X-A", "b").unwrap();
        let mut out = Vec::new();
        for piece in split(&data, &cuts) {
            let _ = app.on_data(Direction::ClientToServer, &piece, &mut out);
        }
        let _ = app.on_end(Direction::ClientToServer, &mut out);
    }

    /// Clients pipeline requests until one asks for a protocol switch, then wait for the
    /// responses up to its answer. Every request gets the header exactly once until the server
    /// switches, and everything after a switch passes untouched, however the server's responses
    /// are framed and cut, and whether they go through `pass_unchanged` or `on_data`.
    #[test]
    fn requests_get_the_header_until_the_server_switches(
        exchanges in proptest::collection::vec(exchange(), 1..8),
        after in proptest::collection::vec(any::<u8>(), 1..64),
        cuts in proptest::collection::vec(any::<usize>(), 0..20),
        counted in proptest::collection::vec(any::<bool>(), 1..8),
    ) {
        let mut app = HttpHeaderInsert::new("X-Mbtls-Proxy", "inserted").unwrap();
        let mut out = Vec::new();
        let mut expected = Vec::new();
        let mut counted = counted.iter().cycle();
        // Groups of pipelined requests, each ending at a switch (or at the end).
        let groups = exchanges.split_inclusive(|e| e.switch.is_some());
        let mut switched = false;
        for group in groups {
            let sent: Vec<u8> = group.iter().flat_map(|e| e.request.sent.clone()).collect();
            for piece in split(&sent, &cuts) {
                prop_assert_eq!(app.on_data(Direction::ClientToServer, &piece, &mut out), Verdict::Continue);
            }
            expected.extend(group.iter().flat_map(|e| e.request.expected.clone()));
            let responses: Vec<u8> = group.iter().flat_map(|e| e.response.clone()).collect();
            for piece in split(&responses, &cuts) {
                let s2c = Direction::ServerToClient;
                let v = if *counted.next().unwrap() {
                    app.pass_unchanged(s2c, &piece).unwrap()
                } else {
                    let mut through = Vec::new();
                    let v = app.on_data(s2c, &piece, &mut through);
                    prop_assert_eq!(&through, &piece);
                    v
                };
                prop_assert_eq!(v, Verdict::Continue);
            }
            if group.last().and_then(|e| e.switch) == Some(true) {
                switched = true;
                break;
            }
        }
        if switched {
            prop_assert_eq!(app.on_data(Direction::ClientToServer, &after, &mut out), Verdict::Continue);
            expected.extend_from_slice(&after);
        }
        prop_assert_eq!(out, expected);
    }
}

/// One response the server gives, as bytes, with its request's method and whether it is the
/// answer to a switch.
#[derive(Debug, Clone)]
struct Exchange {
    request: Req,
    response: Vec<u8>,
    /// `Some(accepted)` when the request asks for a protocol switch.
    switch: Option<bool>,
}

fn response_body() -> impl Strategy<Value = Vec<u8>> {
    // Bodies that quote response heads, a switch among them.
    proptest::collection::vec(
        prop_oneof![
            Just(b"HTTP/1.1 101 Switching Protocols\r\n\r\n".to_vec()),
            Just(b"0\r\n\r\n".to_vec()),
            proptest::collection::vec(any::<u8>(), 0..30),
        ],
        0..4,
    )
    .prop_map(|parts| parts.concat())
}

fn exchange() -> impl Strategy<Value = Exchange> {
    // 0: plain request, 1: HEAD, 2: WebSocket upgrade, 3: h2c upgrade (taken out of the request)
    let kind = 0u8..4;
    let status = prop_oneof![Just(200u16), Just(404), Just(204), Just(304), Just(101)];
    (
        request(),
        kind,
        status,
        any::<bool>(),
        response_body(),
        any::<bool>(),
    )
        .prop_map(|(request, kind, status, chunked, body, interim)| {
            // A 101 answers only an upgrade; elsewhere it would be a server's error.
            let status = if status == 101 && kind != 2 {
                200
            } else {
                status
            };
            let (request, switch) = match kind {
                1 => (simple_request("HEAD /h HTTP/1.1\r\n"), None),
                // RFC 6455's example key; its accept value is in the 101 below.
                2 => (
                    simple_request(
                        "GET /ws HTTP/1.1\r\nUpgrade: websocket\r\n\
                         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n",
                    ),
                    Some(status == 101),
                ),
                3 => {
                    let mut req = simple_request("GET /h2 HTTP/1.1\r\nUpgrade: h2c\r\n");
                    req.expected = format!("GET /h2 HTTP/1.1\r\n{HEADER}\r\n\r\n").into_bytes();
                    (req, None)
                }
                _ => (request, None),
            };
            let mut response = Vec::new();
            if interim {
                response.extend_from_slice(b"HTTP/1.1 100 Continue\r\n\r\n");
            }
            response.extend_from_slice(format!("HTTP/1.1 {status} X\r\n").as_bytes());
            if status == 101 {
                response
                    .extend_from_slice(b"Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n");
            }
            let no_body = kind == 1 || status == 204 || status == 304 || switch == Some(true);
            if chunked {
                response.extend_from_slice(b"Transfer-Encoding: chunked\r\n\r\n");
                if !no_body {
                    if !body.is_empty() {
                        response.extend_from_slice(format!("{:x}\r\n", body.len()).as_bytes());
                        response.extend_from_slice(&body);
                        response.extend_from_slice(b"\r\n");
                    }
                    response.extend_from_slice(b"0\r\n\r\n");
                }
            } else {
                response.extend_from_slice(
                    format!("Content-Length: {}\r\n\r\n", body.len()).as_bytes(),
                );
                if !no_body {
                    response.extend_from_slice(&body);
                }
            }
            Exchange {
                request,
                response,
                switch,
            }
        })
}

/// A request without a body: `start` is its request line and any fields.
fn simple_request(start: &str) -> Req {
    Req {
        sent: format!("{start}\r\n").into_bytes(),
        expected: format!("{start}{HEADER}\r\n\r\n").into_bytes(),
    }
}
