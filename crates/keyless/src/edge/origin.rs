//! Forwarding one request to the origin over plain HTTP/1.1 and reading its whole response,
//! over a small pool of idle keep-alive connections per origin ([`OriginPool`]).
//!
//! Reuse rules:
//!
//! - requests are sent without `Connection: close` (with it when the pool keeps no connection);
//! - exactly one response is read per request. The connection goes back to the pool only if that
//!   response was complete and framed by Content-Length, chunked coding or by having no body,
//!   nothing followed it, it was HTTP/1.1 and the origin did not say `Connection: close`. A
//!   response delimited by the origin closing the connection, an error, a timeout (the future
//!   is dropped with the connection) or anything unexpected leaves the connection closed;
//! - at most `max_idle` idle connections are kept (the oldest is closed first); one idle longer
//!   than `idle_timeout` is never used and is closed within about twice that time;
//! - a pooled connection is checked before use (one non-blocking read: end of stream or stray
//!   bytes discard it). If it still turns out dead — the write fails, or the read fails or meets
//!   the end of stream before any response byte — the request is sent once more on a fresh
//!   connection. A request is never sent again once any response byte has arrived, and requests
//!   whose method is not idempotent (RFC 9110 §9.2.2: POST, PATCH, …) never take a pooled
//!   connection, so they are never sent twice either.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::http::{
    decode_chunked, head_end, parse_response, response_framing, Framing, HttpError, RequestHead,
    ResponseHead,
};

/// Idle connections kept per origin by default.
pub const DEFAULT_IDLE_CONNECTIONS: usize = 4;

/// How long an idle origin connection is kept by default: below the 5 s keep-alive timeout of
/// common origin servers (Apache httpd), so the origin rarely closes one just as it is reused.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(4);

/// Largest read from an origin at once.
const READ_BYTES: usize = 16 * 1024;

/// Why the origin exchange failed (the client gets 502).
#[derive(Debug, thiserror::Error)]
pub enum OriginError {
    /// Socket error.
    #[error("origin socket: {0}")]
    Io(#[from] std::io::Error),
    /// The origin's answer is not HTTP we accept.
    #[error("origin response: {0}")]
    Http(#[from] HttpError),
    /// The origin closed before the response was complete.
    #[error("origin closed early")]
    Truncated,
}

/// The request as sent to the origin: the client's end-to-end fields, our Host, framing by
/// Content-Length, forwarding information; `Connection: close` unless `keep_alive`.
pub fn origin_request(
    head: &RequestHead,
    host: &str,
    body: &[u8],
    client: SocketAddr,
    keep_alive: bool,
) -> Vec<u8> {
    let mut out = format!(
        "{} {} HTTP/1.1\r\nHost: {host}\r\n",
        head.method, head.target
    )
    .into_bytes();
    for (n, v) in &head.headers.end_to_end().0 {
        if n.eq_ignore_ascii_case("host")
            || n.eq_ignore_ascii_case("content-length")
            || n.eq_ignore_ascii_case("x-forwarded-for")
            || n.eq_ignore_ascii_case("x-forwarded-proto")
            // The edge has already read the whole body.
            || n.eq_ignore_ascii_case("expect")
        {
            continue;
        }
        out.extend_from_slice(format!("{n}: {v}\r\n").as_bytes());
    }
    out.extend_from_slice(format!("X-Forwarded-For: {}\r\n", client.ip()).as_bytes());
    out.extend_from_slice(b"X-Forwarded-Proto: https\r\n");
    if !keep_alive {
        out.extend_from_slice(b"Connection: close\r\n");
    }
    if !body.is_empty() || matches!(head.method.as_str(), "POST" | "PUT" | "PATCH") {
        out.extend_from_slice(format!("Content-Length: {}\r\n", body.len()).as_bytes());
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body);
    out
}

/// Limits of an [`OriginPool`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OriginPoolOptions {
    /// Idle connections kept for reuse; 0: a new connection (with `Connection: close`) per
    /// request.
    pub max_idle: usize,
    /// An idle connection older than this is not used again.
    pub idle_timeout: Duration,
}

impl Default for OriginPoolOptions {
    fn default() -> OriginPoolOptions {
        OriginPoolOptions {
            max_idle: DEFAULT_IDLE_CONNECTIONS,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
        }
    }
}

/// One origin address and its idle keep-alive connections.
#[derive(Debug)]
pub struct OriginPool {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    addr: SocketAddr,
    options: OriginPoolOptions,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Oldest first.
    idle: VecDeque<Idle>,
    /// A task closing expired connections is running.
    reaper: bool,
}

#[derive(Debug)]
struct Idle {
    tcp: TcpStream,
    since: Instant,
}

impl State {
    /// Closes the connections idle for `timeout` or longer.
    fn prune(&mut self, now: Instant, timeout: Duration) {
        self.idle
            .retain(|i| now.saturating_duration_since(i.since) < timeout);
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Why one exchange failed, and whether the request may be sent again on a fresh connection
/// (the connection was pooled and gave no response byte).
struct Failed {
    error: OriginError,
    dead_before_response: bool,
}

impl Failed {
    fn after_response(error: impl Into<OriginError>) -> Failed {
        Failed {
            error: error.into(),
            dead_before_response: false,
        }
    }
}

/// A finished exchange: the response, and the connection if it may carry another request.
struct Exchange {
    head: ResponseHead,
    body: Vec<u8>,
    reusable: Option<TcpStream>,
}

impl OriginPool {
    /// A pool for the origin at `addr`; no connection is opened yet.
    pub fn new(addr: SocketAddr, options: OriginPoolOptions) -> OriginPool {
        OriginPool {
            inner: Arc::new(Inner {
                addr,
                options,
                state: Mutex::new(State::default()),
            }),
        }
    }

    /// The origin's address.
    pub fn address(&self) -> SocketAddr {
        self.inner.addr
    }

    /// Whether requests may be sent as keep-alive (see [`origin_request`]).
    pub fn keeps_alive(&self) -> bool {
        self.inner.options.max_idle > 0 && !self.inner.options.idle_timeout.is_zero()
    }

    /// Idle connections held now (expired ones included until they are closed).
    pub fn idle_connections(&self) -> usize {
        self.inner.lock().idle.len()
    }

    /// Sends the request (built by [`origin_request`]) and returns the final (non-1xx)
    /// response head and its decoded body. Bound the whole call with a timeout: dropping it
    /// closes the connection in use.
    pub async fn fetch(
        &self,
        request: &[u8],
        method: &str,
        max_body: usize,
    ) -> Result<(ResponseHead, Vec<u8>), OriginError> {
        if idempotent(method) {
            if let Some(tcp) = self.take() {
                match exchange(tcp, request, method, max_body).await {
                    Ok(done) => return Ok(self.finish(done)),
                    Err(f) if f.dead_before_response => {
                        tracing::debug!(origin = %self.inner.addr, error = %f.error,
                            "pooled origin connection was closed; retrying on a new one");
                    }
                    Err(f) => return Err(f.error),
                }
            }
        }
        let tcp = TcpStream::connect(self.inner.addr).await?;
        let _ = tcp.set_nodelay(true);
        match exchange(tcp, request, method, max_body).await {
            Ok(done) => Ok(self.finish(done)),
            Err(f) => Err(f.error),
        }
    }

    fn finish(&self, done: Exchange) -> (ResponseHead, Vec<u8>) {
        if let Some(tcp) = done.reusable {
            self.put(tcp);
        }
        (done.head, done.body)
    }

    /// The most recently used idle connection that is still open and not expired.
    fn take(&self) -> Option<TcpStream> {
        loop {
            let idle = {
                let mut state = self.inner.lock();
                state.prune(Instant::now(), self.inner.options.idle_timeout);
                state.idle.pop_back()
            }?;
            if still_open(&idle.tcp) {
                return Some(idle.tcp);
            }
        }
    }

    /// Keeps a connection whose last response was complete, closing the oldest idle one if
    /// the pool is full.
    fn put(&self, tcp: TcpStream) {
        if !self.keeps_alive() {
            return;
        }
        let options = self.inner.options;
        let now = Instant::now();
        let start_reaper = {
            let mut state = self.inner.lock();
            state.prune(now, options.idle_timeout);
            while state.idle.len() >= options.max_idle {
                state.idle.pop_front();
            }
            state.idle.push_back(Idle { tcp, since: now });
            !std::mem::replace(&mut state.reaper, true)
        };
        if start_reaper {
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => {
                    runtime.spawn(reap(Arc::downgrade(&self.inner)));
                }
                // No runtime to run the reaper: expired connections are closed on the next use.
                Err(_) => self.inner.lock().reaper = false,
            }
        }
    }
}

/// Closes expired idle connections every `idle_timeout` until the pool is empty or dropped.
async fn reap(pool: Weak<Inner>) {
    let period = match pool.upgrade() {
        Some(inner) => inner.options.idle_timeout,
        None => return,
    };
    loop {
        tokio::time::sleep(period).await;
        let Some(inner) = pool.upgrade() else { return };
        let mut state = inner.lock();
        state.prune(Instant::now(), inner.options.idle_timeout);
        if state.idle.is_empty() {
            state.reaper = false;
            return;
        }
    }
}

/// RFC 9110 §9.2.2: sending these twice has the effect of sending them once.
fn idempotent(method: &str) -> bool {
    matches!(
        method,
        "GET" | "HEAD" | "OPTIONS" | "TRACE" | "PUT" | "DELETE"
    )
}

/// An idle connection is usable if reading from it would block: no end of stream, no error and
/// no unsolicited bytes. Best effort: it sees what the reactor has already noticed; a close it
/// has not seen yet is caught by the retry in [`OriginPool::fetch`].
fn still_open(tcp: &TcpStream) -> bool {
    let mut probe = [0u8; 1];
    matches!(tcp.try_read(&mut probe), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
}

/// The origin's bytes read so far, and whether any arrived at all.
struct Reader {
    tcp: TcpStream,
    buf: Vec<u8>,
    received: bool,
}

impl Reader {
    /// Reads more; the end of stream is an error here ([`OriginError::Truncated`]).
    async fn more(&mut self) -> Result<(), Failed> {
        match self.read().await {
            Ok(true) => Ok(()),
            Ok(false) => Err(self.failed(OriginError::Truncated)),
            Err(e) => Err(self.failed(e.into())),
        }
    }

    /// Reads more: `Ok(false)` at the end of stream.
    async fn read(&mut self) -> std::io::Result<bool> {
        self.buf.reserve(READ_BYTES);
        let n = self.tcp.read_buf(&mut self.buf).await?;
        if n > 0 {
            self.received = true;
        }
        Ok(n > 0)
    }

    fn failed(&self, error: OriginError) -> Failed {
        Failed {
            error,
            dead_before_response: !self.received,
        }
    }
}

/// Sends one request on `tcp` and reads exactly one final response.
async fn exchange(
    mut tcp: TcpStream,
    request: &[u8],
    method: &str,
    max_body: usize,
) -> Result<Exchange, Failed> {
    if let Err(e) = tcp.write_all(request).await {
        return Err(Failed {
            error: e.into(),
            dead_before_response: true,
        });
    }
    let mut r = Reader {
        tcp,
        buf: Vec::new(),
        received: false,
    };
    let (head, http11) = loop {
        let Some(end) = head_end(&r.buf).map_err(Failed::after_response)? else {
            r.more().await?;
            continue;
        };
        let raw = r.buf.get(..end).unwrap_or_default();
        let http11 = raw.starts_with(b"HTTP/1.1 ");
        let head = parse_response(raw).map_err(Failed::after_response)?;
        r.buf.drain(..end);
        if head.status >= 200 {
            break (head, http11);
        }
        // 100 Continue and other interim responses: skip.
    };
    let framing = response_framing(method, &head).map_err(Failed::after_response)?;
    let (body, complete) = match framing {
        Framing::None => (Vec::new(), r.buf.is_empty()),
        Framing::Length(n) => {
            if n > max_body {
                return Err(Failed::after_response(HttpError::BodyTooLarge));
            }
            while r.buf.len() < n {
                r.more().await?;
            }
            let exact = r.buf.len() == n;
            let mut body = std::mem::take(&mut r.buf);
            body.truncate(n);
            (body, exact)
        }
        Framing::Chunked => loop {
            if let Some((body, used)) =
                decode_chunked(&r.buf, max_body).map_err(Failed::after_response)?
            {
                break (body, used == r.buf.len());
            }
            r.more().await?;
        },
        Framing::UntilClose => {
            loop {
                match r.read().await {
                    Ok(true) if r.buf.len() > max_body => {
                        return Err(Failed::after_response(HttpError::BodyTooLarge))
                    }
                    Ok(true) => {}
                    Ok(false) => break,
                    Err(e) => return Err(Failed::after_response(e)),
                }
            }
            // The end of stream delimits it: nothing more can follow on this connection.
            (std::mem::take(&mut r.buf), false)
        }
    };
    let reusable = complete && http11 && !head.headers.has_token("connection", "close");
    Ok(Exchange {
        head,
        body,
        reusable: reusable.then_some(r.tcp),
    })
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tokio::net::TcpListener;
    use tokio::sync::mpsc;

    use super::*;

    /// How the test origin answers.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Mode {
        /// Content-Length responses, connection kept open.
        KeepAlive,
        /// Chunked responses, connection kept open.
        Chunked,
        /// `Connection: close`, then closes.
        Close,
        /// No length: the body ends when the origin closes.
        UntilClose,
        /// A keep-alive response, then closes the idle connection (and reports it).
        CloseWhenIdle,
        /// Answers the first request of a connection; closes on the second without answering.
        DropSecond,
        /// Answers the first request; to the second, part of a response, then closes.
        PartialSecond,
    }

    /// A plain HTTP/1.1 origin counting accepted connections and requests. Bodies name the
    /// connection and the request on it: `c1r2` = second request on the first connection.
    struct TestOrigin {
        addr: SocketAddr,
        accepted: Arc<AtomicUsize>,
        requests: Arc<AtomicUsize>,
        closed: mpsc::UnboundedReceiver<usize>,
    }

    impl TestOrigin {
        async fn start(mode: Mode) -> TestOrigin {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let accepted = Arc::new(AtomicUsize::new(0));
            let requests = Arc::new(AtomicUsize::new(0));
            let (closed_tx, closed) = mpsc::unbounded_channel();
            let (a, r) = (Arc::clone(&accepted), Arc::clone(&requests));
            tokio::spawn(async move {
                while let Ok((tcp, _)) = listener.accept().await {
                    let conn = a.fetch_add(1, Ordering::SeqCst) + 1;
                    tokio::spawn(serve(tcp, mode, conn, Arc::clone(&r), closed_tx.clone()));
                }
            });
            TestOrigin {
                addr,
                accepted,
                requests,
                closed,
            }
        }

        fn accepted(&self) -> usize {
            self.accepted.load(Ordering::SeqCst)
        }

        fn requests(&self) -> usize {
            self.requests.load(Ordering::SeqCst)
        }
    }

    async fn serve(
        mut tcp: TcpStream,
        mode: Mode,
        conn: usize,
        requests: Arc<AtomicUsize>,
        closed: mpsc::UnboundedSender<usize>,
    ) {
        let mut buf = Vec::new();
        for n in 1.. {
            let end = loop {
                if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                    break i + 4;
                }
                let mut chunk = [0u8; 4096];
                match tcp.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(k) => buf.extend_from_slice(&chunk[..k]),
                }
            };
            buf.drain(..end);
            requests.fetch_add(1, Ordering::SeqCst);
            let body = format!("c{conn}r{n}");
            let ok = format!("HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\n{body}");
            let reply = match (mode, n) {
                (Mode::KeepAlive, _) | (Mode::DropSecond | Mode::PartialSecond, 1) => ok,
                (Mode::Chunked, _) => {
                    format!("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\n{body}\r\n0\r\n\r\n")
                }
                (Mode::Close, _) => {
                    format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: 4\r\nConnection: close\r\n\r\n{body}"
                    )
                }
                (Mode::UntilClose, _) => format!("HTTP/1.1 200 OK\r\n\r\n{body}"),
                (Mode::CloseWhenIdle, _) => {
                    let _ = tcp.write_all(ok.as_bytes()).await;
                    let _ = tcp.shutdown().await;
                    drop(tcp);
                    let _ = closed.send(conn);
                    return;
                }
                (Mode::DropSecond, _) => return,
                (Mode::PartialSecond, _) => {
                    "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc".to_owned()
                }
            };
            if tcp.write_all(reply.as_bytes()).await.is_err() {
                return;
            }
            let close = match mode {
                Mode::Close | Mode::UntilClose => true,
                Mode::PartialSecond => n == 2,
                _ => false,
            };
            if close {
                let _ = tcp.shutdown().await;
                return;
            }
        }
    }

    fn get() -> Vec<u8> {
        let head = RequestHead {
            method: "GET".into(),
            target: "/".into(),
            minor: 1,
            headers: Default::default(),
        };
        origin_request(&head, "o.test", b"", ([127, 0, 0, 1], 1).into(), true)
    }

    async fn body(pool: &OriginPool) -> Result<String, OriginError> {
        let (head, body) = pool.fetch(&get(), "GET", 1 << 20).await?;
        assert_eq!(head.status, 200);
        Ok(String::from_utf8(body).unwrap())
    }

    fn pool(origin: &TestOrigin) -> OriginPool {
        OriginPool::new(origin.addr, OriginPoolOptions::default())
    }

    #[test]
    fn keep_alive_requests_do_not_ask_to_close() {
        let text = String::from_utf8(get()).unwrap();
        assert!(!text.to_ascii_lowercase().contains("connection:"), "{text}");
        let head = RequestHead {
            method: "GET".into(),
            target: "/".into(),
            minor: 1,
            headers: Default::default(),
        };
        let closing = origin_request(&head, "o.test", b"", ([127, 0, 0, 1], 1).into(), false);
        assert!(String::from_utf8(closing)
            .unwrap()
            .contains("\r\nConnection: close\r\n"));
    }

    #[tokio::test]
    async fn sequential_requests_reuse_one_connection() {
        for mode in [Mode::KeepAlive, Mode::Chunked] {
            let origin = TestOrigin::start(mode).await;
            let pool = pool(&origin);
            assert_eq!(body(&pool).await.unwrap(), "c1r1", "{mode:?}");
            assert_eq!(pool.idle_connections(), 1, "{mode:?}");
            assert_eq!(body(&pool).await.unwrap(), "c1r2", "{mode:?}");
            assert_eq!(origin.accepted(), 1, "{mode:?}");
        }
    }

    #[tokio::test]
    async fn connections_the_origin_closes_are_not_pooled() {
        for mode in [Mode::Close, Mode::UntilClose] {
            let origin = TestOrigin::start(mode).await;
            let pool = pool(&origin);
            assert_eq!(body(&pool).await.unwrap(), "c1r1", "{mode:?}");
            assert_eq!(pool.idle_connections(), 0, "{mode:?}");
            assert_eq!(body(&pool).await.unwrap(), "c2r1", "{mode:?}");
            assert_eq!(origin.accepted(), 2, "{mode:?}");
            assert_eq!(origin.requests(), 2, "{mode:?}");
        }
    }

    #[tokio::test]
    async fn an_idle_connection_closed_by_the_origin_is_replaced() {
        let mut origin = TestOrigin::start(Mode::CloseWhenIdle).await;
        let pool = pool(&origin);
        assert_eq!(body(&pool).await.unwrap(), "c1r1");
        // The origin has closed the pooled connection.
        assert_eq!(origin.closed.recv().await, Some(1));
        assert_eq!(body(&pool).await.unwrap(), "c2r1");
        assert_eq!(origin.accepted(), 2);
    }

    #[tokio::test]
    async fn a_pooled_connection_dead_before_any_response_byte_is_retried_once_on_a_new_one() {
        let origin = TestOrigin::start(Mode::DropSecond).await;
        let pool = pool(&origin);
        assert_eq!(body(&pool).await.unwrap(), "c1r1");
        // The pooled connection takes the request and closes without a byte: sent again.
        assert_eq!(body(&pool).await.unwrap(), "c2r1");
        assert_eq!((origin.accepted(), origin.requests()), (2, 3));
    }

    #[tokio::test]
    async fn a_request_is_never_sent_again_after_response_bytes() {
        let origin = TestOrigin::start(Mode::PartialSecond).await;
        let pool = pool(&origin);
        assert_eq!(body(&pool).await.unwrap(), "c1r1");
        assert!(matches!(body(&pool).await, Err(OriginError::Truncated)));
        assert_eq!((origin.accepted(), origin.requests()), (1, 2));
        assert_eq!(pool.idle_connections(), 0);
    }

    #[tokio::test]
    async fn requests_that_are_not_idempotent_take_a_new_connection() {
        let origin = TestOrigin::start(Mode::KeepAlive).await;
        let pool = pool(&origin);
        assert_eq!(body(&pool).await.unwrap(), "c1r1");
        let (_, post) = pool.fetch(&get(), "POST", 1 << 20).await.unwrap();
        assert_eq!(post, b"c2r1");
        // Both connections are now idle; the most recent one is used next.
        assert_eq!(pool.idle_connections(), 2);
        assert_eq!(body(&pool).await.unwrap(), "c2r2");
        assert_eq!(origin.accepted(), 2);
    }

    #[tokio::test]
    async fn the_pool_is_bounded_and_expired_connections_are_dropped() {
        let origin = TestOrigin::start(Mode::KeepAlive).await;
        let pool = OriginPool::new(
            origin.addr,
            OriginPoolOptions {
                max_idle: 2,
                idle_timeout: Duration::from_secs(3600),
            },
        );
        for _ in 0..3 {
            pool.put(TcpStream::connect(origin.addr).await.unwrap());
        }
        assert_eq!(pool.idle_connections(), 2);
        // As if the idle time had passed (no waiting): nothing is left to reuse.
        let later = Instant::now() + Duration::from_secs(3600);
        pool.inner.lock().prune(later, Duration::from_secs(3600));
        assert_eq!(pool.idle_connections(), 0);
        // No pooling at all: `Connection: close` and nothing kept.
        let none = OriginPool::new(
            origin.addr,
            OriginPoolOptions {
                max_idle: 0,
                idle_timeout: DEFAULT_IDLE_TIMEOUT,
            },
        );
        assert!(!none.keeps_alive());
        assert_eq!(body(&none).await.unwrap(), "c4r1");
        assert_eq!(none.idle_connections(), 0);
    }
}
