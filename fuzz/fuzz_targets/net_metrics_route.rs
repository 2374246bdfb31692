//! The metrics endpoint's request-line router: any bytes a scraper sends are answered without a
//! panic, and only a `GET /metrics` request line gets the metrics.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mbx_net::metrics::{route, Route};

fuzz_target!(|head: &[u8]| {
    if route(head) == Route::Metrics {
        assert!(head.starts_with(b"GET /metrics"));
    }
});
