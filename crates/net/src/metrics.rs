//! A minimal Prometheus scrape endpoint: `GET /metrics` answered with the text exposition
//! (format 0.0.4) a service renders at that moment. One request per connection; a scraper that
//! sends more than 8 KiB of request head, or nothing for ten seconds, is dropped, and one still
//! sending its head gives way to a newer connection when all places are taken. Carries counts
//! only: bind it to loopback or a management network.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::AbortHandle;

use crate::Acceptor;

/// Largest HTTP request head read from a scraper.
const MAX_HEAD: usize = 8 * 1024;
/// How long a scraper has to send its request and read the answer.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(10);
/// Scrapes held at once. Without a bound, connections that send nothing would each hold a
/// descriptor for `SCRAPE_TIMEOUT`, taken from the service's own connections (services reserve
/// descriptors for these, and one for the connection being accepted).
pub const MAX_SCRAPES: usize = 8;

/// What a service renders for a scrape.
pub type Render = Arc<dyn Fn() -> String + Send + Sync>;

/// A scrape whose request head has not come in full yet: the first to give way.
struct Waiting {
    task: AbortHandle,
    head_read: Arc<AtomicBool>,
}

/// Answers scrapes on `listener` until the task is dropped; failed accepts are counted in
/// `accept_errors` (and paused after, as every listener here does). When `MAX_SCRAPES` are
/// held, a new connection takes the place of the oldest one still sending its head (found in
/// a trial: eight silent connections kept every scrape out for ten seconds at a time, as long
/// as Prometheus's own scrape timeout); it waits only while all of them are being answered.
pub async fn serve_metrics(listener: TcpListener, accept_errors: Arc<AtomicU64>, render: Render) {
    let mut acceptor = Acceptor::counting_errors_in(listener, accept_errors);
    let scrapes = Arc::new(tokio::sync::Semaphore::new(MAX_SCRAPES));
    let mut waiting: VecDeque<Waiting> = VecDeque::new();
    loop {
        let (tcp, _) = acceptor.accept().await;
        waiting.retain(|w| !w.task.is_finished() && !w.head_read.load(Ordering::Acquire));
        let permit = match Arc::clone(&scrapes).try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                // Its permit comes back when the aborted task is dropped. One whose head
                // came in since the pruning above is being answered: the next gives way.
                while let Some(oldest) = waiting.pop_front() {
                    if !oldest.head_read.load(Ordering::Acquire) {
                        oldest.task.abort();
                        break;
                    }
                }
                let Ok(permit) = Arc::clone(&scrapes).acquire_owned().await else {
                    return;
                };
                permit
            }
        };
        let render = Arc::clone(&render);
        let head_read = Arc::new(AtomicBool::new(false));
        let read = Arc::clone(&head_read);
        let task = tokio::spawn(async move {
            let scrape = answer_scrape(tcp, &*render, &read);
            let _ = tokio::time::timeout(SCRAPE_TIMEOUT, scrape).await;
            drop(permit);
        });
        waiting.push_back(Waiting {
            task: task.abort_handle(),
            head_read,
        });
    }
}

async fn answer_scrape(
    mut tcp: TcpStream,
    render: &(dyn Fn() -> String + Send + Sync),
    head_read: &AtomicBool,
) -> std::io::Result<()> {
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = tcp.read(&mut buf).await?;
        if n == 0 || head.len() + n > MAX_HEAD {
            return Ok(());
        }
        head.extend_from_slice(buf.get(..n).unwrap_or_default());
    }
    // From here it is answered: no newer connection takes its place.
    head_read.store(true, Ordering::Release);
    let route = route(&head);
    let (status, body) = match route {
        Route::Metrics | Route::MetricsHead => ("200 OK", render()),
        Route::NotFound => ("404 Not Found", "not found\n".to_owned()),
        Route::NotGet => ("405 Method Not Allowed", "GET or HEAD only\n".to_owned()),
    };
    // HEAD: the same head, no body (RFC 9110 §9.3.2).
    let shown = if route == Route::MetricsHead {
        ""
    } else {
        &body
    };
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{shown}",
        body.len()
    );
    tcp.write_all(response.as_bytes()).await?;
    tcp.shutdown().await
}

/// What a request head asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    Metrics,
    /// `HEAD /metrics`: the head of the answer only.
    MetricsHead,
    NotFound,
    NotGet,
}

/// Reads the request line of `head` (bytes from the network: anything at all; fuzz target
/// `net_metrics_route`).
pub fn route(head: &[u8]) -> Route {
    let line = head.split(|&b| b == b'\r').next().unwrap_or_default();
    let mut parts = line.split(|&b| b == b' ');
    // A query (Prometheus' `params:`) asks for the same metrics.
    let metrics =
        |target: &[u8]| target.split(|&b| b == b'?').next() == Some(b"/metrics".as_slice());
    match (parts.next(), parts.next()) {
        (Some(b"GET"), Some(t)) if metrics(t) => Route::Metrics,
        (Some(b"HEAD"), Some(t)) if metrics(t) => Route::MetricsHead,
        (Some(b"GET" | b"HEAD"), _) => Route::NotFound,
        _ => Route::NotGet,
    }
}

/// Appends one metric family with a single unlabelled sample: `kind` is `counter` or `gauge`.
pub fn write_metric(out: &mut String, kind: &str, name: &str, help: &str, value: u64) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
    );
}

/// Appends one metric family with one sample per `(label value, value)` under `label` (none:
/// the family is only declared).
pub fn write_labelled<L: std::fmt::Display>(
    out: &mut String,
    kind: &str,
    name: &str,
    help: &str,
    label: &str,
    samples: impl IntoIterator<Item = (L, u64)>,
) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    for (value_of_label, value) in samples {
        let _ = writeln!(out, "{name}{{{label}=\"{value_of_label}\"}} {value}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Request heads near the one that is served: a start from a few that differ by a byte or
    /// a method, then anything. (Random bytes alone almost never start with `GET /metrics`.)
    fn heads() -> impl Strategy<Value = Vec<u8>> {
        let starts = prop_oneof![
            Just(&b"GET /metrics"[..]),
            Just(&b"GET /metric"[..]),
            Just(&b"POST /metrics"[..]),
            Just(&b"GET "[..]),
            Just(&b""[..]),
        ];
        (starts, proptest::collection::vec(any::<u8>(), 0..64)).prop_map(|(start, tail)| {
            let mut head = start.to_vec();
            head.extend(tail);
            head
        })
    }

    proptest! {
        /// Any request head is answered without a panic, and only `GET /metrics` (the whole
        /// target) gets the metrics.
        #[test]
        fn only_get_metrics_is_served(head in heads()) {
            let r = route(&head);
            prop_assert_eq!(r == Route::Metrics, head.starts_with(b"GET /metrics")
                && matches!(head.get(12), None | Some(b' ') | Some(b'\r') | Some(b'?')));
        }
    }

    #[test]
    fn request_lines_are_routed() {
        assert_eq!(route(b"GET /metrics HTTP/1.1\r\n\r\n"), Route::Metrics);
        assert_eq!(route(b"GET /metricsx HTTP/1.1\r\n\r\n"), Route::NotFound);
        assert_eq!(route(b"POST /metrics HTTP/1.1\r\n\r\n"), Route::NotGet);
        assert_eq!(route(b""), Route::NotGet);
        // A query asks for the same; HEAD for the head only.
        assert_eq!(route(b"GET /metrics?a=1 HTTP/1.1\r\n\r\n"), Route::Metrics);
        assert_eq!(route(b"HEAD /metrics HTTP/1.1\r\n\r\n"), Route::MetricsHead);
        assert_eq!(route(b"HEAD /other HTTP/1.1\r\n\r\n"), Route::NotFound);
    }

    #[test]
    fn families_render_in_the_text_format() {
        let mut out = String::new();
        write_metric(&mut out, "gauge", "x_open", "Open now.", 3);
        write_labelled(
            &mut out,
            "counter",
            "x_total",
            "Ended.",
            "outcome",
            [("ok", 2), ("error", 1)],
        );
        assert_eq!(
            out,
            "# HELP x_open Open now.\n# TYPE x_open gauge\nx_open 3\n\
             # HELP x_total Ended.\n# TYPE x_total counter\n\
             x_total{outcome=\"ok\"} 2\nx_total{outcome=\"error\"} 1\n"
        );
    }

    #[tokio::test]
    async fn a_scrape_gets_the_rendered_text_and_other_paths_get_404() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(serve_metrics(
            listener,
            Arc::default(),
            Arc::new(|| "x_total 7\n".to_owned()),
        ));
        let ask = |method: &'static str, path: &'static str| async move {
            let mut tcp = TcpStream::connect(addr).await.unwrap();
            tcp.write_all(format!("{method} {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
                .await
                .unwrap();
            let mut answer = String::new();
            tcp.read_to_string(&mut answer).await.unwrap();
            answer
        };
        let metrics = ask("GET", "/metrics").await;
        assert!(metrics.starts_with("HTTP/1.1 200 OK\r\n"), "{metrics}");
        assert!(metrics.ends_with("\r\n\r\nx_total 7\n"), "{metrics}");
        assert!(ask("GET", "/other").await.starts_with("HTTP/1.1 404"));
        // With a query, the same; HEAD, the head alone (its length the body's).
        let queried = ask("GET", "/metrics?module=mbx").await;
        assert!(queried.ends_with("\r\n\r\nx_total 7\n"), "{queried}");
        let head = ask("HEAD", "/metrics").await;
        assert!(
            head.starts_with("HTTP/1.1 200 OK\r\n")
                && head.ends_with("Content-Length: 10\r\nConnection: close\r\n\r\n"),
            "{head}"
        );
        task.abort();
    }

    /// Connections that send nothing hold at most `MAX_SCRAPES` places, and cannot keep a
    /// scrape out: each newer connection takes the place of the oldest one still sending its
    /// head, which is closed, while the newer ones stay open (their ten seconds are not over
    /// when the scrape is answered: before, the scrape waited for them).
    #[tokio::test]
    async fn silent_connections_give_way_to_newer_ones() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(serve_metrics(
            listener,
            Arc::default(),
            Arc::new(|| "up 1\n".to_owned()),
        ));
        let mut silent = Vec::new();
        for _ in 0..MAX_SCRAPES + 4 {
            silent.push(TcpStream::connect(addr).await.unwrap());
        }
        let mut scrape = TcpStream::connect(addr).await.unwrap();
        scrape
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut answer = String::new();
        let hang_guard = Duration::from_secs(60);
        tokio::time::timeout(hang_guard, scrape.read_to_string(&mut answer))
            .await
            .unwrap()
            .unwrap();
        assert!(answer.ends_with("up 1\n"), "{answer}");
        // The 5 oldest gave way (to 4 silent ones and the scrape), the 7 newest are held.
        let gave_way = 5;
        let mut buf = [0u8; 1];
        for (i, tcp) in silent.iter_mut().enumerate() {
            if i < gave_way {
                let n = tokio::time::timeout(hang_guard, tcp.read(&mut buf)).await;
                assert!(matches!(n, Ok(Ok(0))), "{i}: {n:?}");
            } else {
                let open = tcp.try_read(&mut buf);
                assert!(
                    matches!(&open, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
                    "{i}: {open:?}"
                );
            }
        }
        task.abort();
    }
}
