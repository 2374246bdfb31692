//! The key server's counters and their Prometheus text exposition.
//!
//! [`ServerStats`] is a set of atomics the driver bumps (no lock on the request path);
//! [`ServerStats::render`] turns them into the Prometheus text format (version 0.0.4), and
//! [`serve_metrics`] answers `GET /metrics` with it on an optional plain-HTTP listener. The
//! listener carries no secrets and no key material, only counts, so it has no TLS; bind it to
//! loopback or a management network.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;

use crate::server::core::RequestOutcome;
use crate::wire::{ErrorCode, Opcode};

/// Upper bounds (seconds) of the latency histogram buckets: from a fast ECDSA signature
/// (tens of µs) to an RSA-4096 operation on a loaded machine (tens of ms) and beyond.
pub const LATENCY_BUCKETS: [f64; 12] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5,
];

/// One operation's request count and latency histogram.
#[derive(Debug, Default)]
struct OpStats {
    /// Requests with this opcode.
    count: AtomicU64,
    /// Non-cumulative bucket counts; the last slot is `+Inf`.
    buckets: [AtomicU64; LATENCY_BUCKETS.len() + 1],
    /// Sum of the latencies in nanoseconds.
    sum_nanos: AtomicU64,
}

/// Counters kept by a running server, exported on the metrics endpoint.
#[derive(Debug)]
pub struct ServerStats {
    /// TCP connections accepted.
    pub connections: AtomicU64,
    /// Connections open now (TCP accepted, not yet closed).
    pub open_connections: AtomicU64,
    /// TLS handshakes that failed (no, expired, unknown-CA or denied certificate, …).
    pub handshake_failures: AtomicU64,
    /// Failed `accept` calls on the service and metrics listeners (out of descriptors and the
    /// like; each is followed by a pause, `mbx_net::Acceptor`). Shared with the acceptors.
    pub accept_errors: Arc<AtomicU64>,
    /// Requests answered (including error answers).
    pub requests: AtomicU64,
    /// Connections closed because a header announced an oversized body.
    pub oversized_closes: AtomicU64,
    /// Successful configuration reloads.
    pub reloads: AtomicU64,
    /// Reloads refused because the new configuration did not load.
    pub reload_failures: AtomicU64,
    /// Indexed like [`Opcode::ALL`], plus one slot for requests without a known opcode.
    per_op: Vec<OpStats>,
    /// Indexed like [`ErrorCode::ALL`].
    per_error: Vec<AtomicU64>,
}

impl Default for ServerStats {
    fn default() -> ServerStats {
        ServerStats {
            connections: AtomicU64::new(0),
            open_connections: AtomicU64::new(0),
            handshake_failures: AtomicU64::new(0),
            accept_errors: Arc::default(),
            requests: AtomicU64::new(0),
            oversized_closes: AtomicU64::new(0),
            reloads: AtomicU64::new(0),
            reload_failures: AtomicU64::new(0),
            per_op: (0..=Opcode::ALL.len())
                .map(|_| OpStats::default())
                .collect(),
            per_error: ErrorCode::ALL.iter().map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

fn op_index(op: Option<Opcode>) -> usize {
    op.and_then(|op| Opcode::ALL.iter().position(|&o| o == op))
        .unwrap_or(Opcode::ALL.len())
}

fn op_label(index: usize) -> String {
    Opcode::ALL
        .get(index)
        .map_or_else(|| "unknown".to_owned(), |op| format!("{op:?}"))
}

impl ServerStats {
    pub(crate) fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Reads a counter.
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }

    /// Counts one answered request: its opcode, its error byte (if any) and how long the
    /// handler took.
    pub fn record(&self, outcome: &RequestOutcome, elapsed: Duration) {
        Self::bump(&self.requests);
        if let Some(op) = self.per_op.get(op_index(outcome.opcode)) {
            Self::bump(&op.count);
            let secs = elapsed.as_secs_f64();
            let bucket = LATENCY_BUCKETS
                .iter()
                .position(|&le| secs <= le)
                .unwrap_or(LATENCY_BUCKETS.len());
            if let Some(b) = op.buckets.get(bucket) {
                Self::bump(b);
            }
            let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
            op.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
        }
        if let Some(code) = outcome.error {
            if let Some(i) = ErrorCode::ALL.iter().position(|&c| c == code) {
                if let Some(c) = self.per_error.get(i) {
                    Self::bump(c);
                }
            }
        }
    }

    /// Requests counted for `op` (`None`: requests without a known opcode).
    pub fn requests_for(&self, op: Option<Opcode>) -> u64 {
        self.per_op
            .get(op_index(op))
            .map_or(0, |s| Self::get(&s.count))
    }

    /// Mean handling time of `op` so far; `None` before its first request. The driver uses it
    /// to guess whether the next operation will be quick.
    pub fn mean_duration(&self, op: Opcode) -> Option<Duration> {
        let s = self.per_op.get(op_index(Some(op)))?;
        let count = Self::get(&s.count);
        if count == 0 {
            return None;
        }
        Some(Duration::from_nanos(Self::get(&s.sum_nanos) / count))
    }

    /// Error answers counted with `code`.
    pub fn errors_for(&self, code: ErrorCode) -> u64 {
        ErrorCode::ALL
            .iter()
            .position(|&c| c == code)
            .and_then(|i| self.per_error.get(i))
            .map_or(0, Self::get)
    }

    /// The Prometheus text exposition (format 0.0.4) of every counter. Operations and error
    /// codes that never occurred are left out, except that every metric family is declared.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let mut counter = |name: &str, help: &str, value: u64| {
            mbx_net::metrics::write_metric(&mut out, "counter", name, help, value)
        };
        counter(
            "keyless_connections_total",
            "TCP connections accepted.",
            Self::get(&self.connections),
        );
        counter(
            "keyless_handshake_failures_total",
            "TLS handshakes refused or failed.",
            Self::get(&self.handshake_failures),
        );
        counter(
            "keyless_accept_errors_total",
            "Failed accepts (out of file descriptors or memory); each is followed by a pause.",
            Self::get(&self.accept_errors),
        );
        counter(
            "keyless_oversized_closes_total",
            "Connections closed for an oversized request header.",
            Self::get(&self.oversized_closes),
        );
        counter(
            "keyless_reloads_total",
            "Successful configuration reloads.",
            Self::get(&self.reloads),
        );
        counter(
            "keyless_reload_failures_total",
            "Reloads refused; the previous configuration stayed in force.",
            Self::get(&self.reload_failures),
        );
        mbx_net::metrics::write_metric(
            &mut out,
            "gauge",
            "keyless_open_connections",
            "Connections open now.",
            Self::get(&self.open_connections),
        );
        let requests = self.per_op.iter().enumerate();
        mbx_net::metrics::write_labelled(
            &mut out,
            "counter",
            "keyless_requests_total",
            "Requests answered, by opcode.",
            "opcode",
            requests
                .map(|(i, op)| (op_label(i), Self::get(&op.count)))
                .filter(|&(_, n)| n > 0),
        );
        mbx_net::metrics::write_labelled(
            &mut out,
            "counter",
            "keyless_errors_total",
            "Error answers, by error code.",
            "code",
            ErrorCode::ALL
                .iter()
                .zip(&self.per_error)
                .map(|(code, c)| (format!("{code:?}"), Self::get(c)))
                .filter(|&(_, n)| n > 0),
        );
        out.push_str(
            "# HELP keyless_request_duration_seconds Time to handle a request, by opcode.\n\
             # TYPE keyless_request_duration_seconds histogram\n",
        );
        for (i, op) in self.per_op.iter().enumerate() {
            let count = Self::get(&op.count);
            if count == 0 {
                continue;
            }
            let label = op_label(i);
            let mut cumulative = 0u64;
            for (le, b) in LATENCY_BUCKETS.iter().zip(&op.buckets) {
                cumulative += Self::get(b);
                let _ = writeln!(
                    out,
                    "keyless_request_duration_seconds_bucket{{opcode=\"{label}\",le=\"{le}\"}} {cumulative}"
                );
            }
            // The +Inf bucket equals the count by definition (a sample recorded between the
            // two loads is counted once, in the count).
            let _ = writeln!(
                out,
                "keyless_request_duration_seconds_bucket{{opcode=\"{label}\",le=\"+Inf\"}} {count}"
            );
            let sum = Self::get(&op.sum_nanos) as f64 / 1e9;
            let _ = writeln!(
                out,
                "keyless_request_duration_seconds_sum{{opcode=\"{label}\"}} {sum}\n\
                 keyless_request_duration_seconds_count{{opcode=\"{label}\"}} {count}"
            );
        }
        out
    }
}

/// Counts a connection as open until dropped.
pub(crate) struct OpenConnection(pub(crate) Arc<ServerStats>);

impl OpenConnection {
    pub(crate) fn new(stats: &Arc<ServerStats>) -> OpenConnection {
        ServerStats::bump(&stats.open_connections);
        OpenConnection(Arc::clone(stats))
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.open_connections.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Answers `GET /metrics` with [`ServerStats::render`] on `listener` until the task is
/// dropped (`mbx_net::metrics`: one request per connection, heads up to 8 KiB, ten seconds).
pub async fn serve_metrics(listener: TcpListener, stats: Arc<ServerStats>) {
    let errors = Arc::clone(&stats.accept_errors);
    let render: mbx_net::metrics::Render = Arc::new(move || stats.render());
    mbx_net::metrics::serve_metrics(listener, errors, render).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_counts_requests_errors_and_buckets() {
        let s = ServerStats::default();
        let ok = RequestOutcome {
            opcode: Some(Opcode::EcdsaSignSha256),
            error: None,
        };
        s.record(&ok, Duration::from_micros(70));
        s.record(&ok, Duration::from_secs(2));
        s.record(
            &RequestOutcome {
                opcode: None,
                error: Some(ErrorCode::BadOpcode),
            },
            Duration::ZERO,
        );
        let text = s.render();
        assert!(text.contains("keyless_requests_total{opcode=\"EcdsaSignSha256\"} 2\n"));
        assert!(text.contains("keyless_requests_total{opcode=\"unknown\"} 1\n"));
        assert!(text.contains("keyless_errors_total{code=\"BadOpcode\"} 1\n"));
        // 70 µs falls in the 100 µs bucket, not the 50 µs one; 2 s only in +Inf.
        assert!(text.contains(
            "keyless_request_duration_seconds_bucket{opcode=\"EcdsaSignSha256\",le=\"0.00005\"} 0\n"
        ));
        assert!(text.contains(
            "keyless_request_duration_seconds_bucket{opcode=\"EcdsaSignSha256\",le=\"0.0001\"} 1\n"
        ));
        assert!(text.contains(
            "keyless_request_duration_seconds_bucket{opcode=\"EcdsaSignSha256\",le=\"0.5\"} 1\n"
        ));
        assert!(text.contains(
            "keyless_request_duration_seconds_bucket{opcode=\"EcdsaSignSha256\",le=\"+Inf\"} 2\n"
        ));
        assert!(
            text.contains("keyless_request_duration_seconds_count{opcode=\"EcdsaSignSha256\"} 2\n")
        );
        assert_eq!(ServerStats::get(&s.requests), 3);
        assert_eq!(s.errors_for(ErrorCode::BadOpcode), 1);
        assert_eq!(s.errors_for(ErrorCode::KeyNotFound), 0);
    }
}
