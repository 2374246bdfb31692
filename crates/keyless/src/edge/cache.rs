//! The edge's response cache, sans-I/O (the caller passes the time).
//!
//! A shared cache in the sense of RFC 9111, reduced to what an edge in front of one origin needs:
//! only GET responses with status 200 and an explicit `max-age` (or `s-maxage`) are stored;
//! `no-store`, `private` and `no-cache` responses are never stored, nor responses to requests that
//! carry `Authorization` or `Cache-Control: no-store`/`no-cache`, nor responses that set cookies.
//! The cache is bounded in bytes; the least recently used entry goes first.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::http::{Headers, RequestHead, ResponseHead};

/// Longest freshness lifetime honoured (one year).
pub const MAX_LIFETIME_SECS: u64 = 365 * 24 * 3600;

/// A stored response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachedResponse {
    /// Status code.
    pub status: u16,
    /// Reason phrase.
    pub reason: String,
    /// End-to-end header fields.
    pub headers: Headers,
    /// The body.
    pub body: Vec<u8>,
}

impl CachedResponse {
    fn size(&self) -> usize {
        self.body.len()
            + self
                .headers
                .0
                .iter()
                .map(|(n, v)| n.len() + v.len() + 4)
                .sum::<usize>()
            + 64
    }
}

#[derive(Debug)]
struct Entry {
    response: CachedResponse,
    stored: Instant,
    expires: Instant,
    last_used: u64,
}

/// The key of a cached response: the site and the request target.
pub type CacheKey = (String, String);

/// Responses by (host, target), bounded in bytes.
#[derive(Debug)]
pub struct Cache {
    entries: HashMap<CacheKey, Entry>,
    bytes: usize,
    max_bytes: usize,
    max_entry: usize,
    clock: u64,
}

/// Freshness lifetime of a response: `s-maxage`, else `max-age`; `None` if it must not be stored.
pub fn storable_lifetime(request: &RequestHead, response: &ResponseHead) -> Option<Duration> {
    if request.method != "GET" || response.status != 200 {
        return None;
    }
    let rq = &request.headers;
    if rq.get("authorization").is_some()
        || rq.has_token("cache-control", "no-store")
        || rq.has_token("cache-control", "no-cache")
    {
        return None;
    }
    let rs = &response.headers;
    if rs.get("set-cookie").is_some() || rs.get("vary").is_some_and(|v| v.trim() == "*") {
        return None;
    }
    let mut max_age = None;
    let mut s_maxage = None;
    for directive in rs.get_all("cache-control").flat_map(|v| v.split(',')) {
        let d = directive.trim();
        let (name, value) = match d.split_once('=') {
            Some((n, v)) => (n.trim(), Some(v.trim().trim_matches('"'))),
            None => (d, None),
        };
        let lower = name.to_ascii_lowercase();
        match lower.as_str() {
            "no-store" | "private" | "no-cache" => return None,
            "max-age" => max_age = value.and_then(|v| v.parse::<u64>().ok()),
            "s-maxage" => s_maxage = value.and_then(|v| v.parse::<u64>().ok()),
            _ => {}
        }
    }
    let age = rs
        .get("age")
        .and_then(|a| a.parse::<u64>().ok())
        .unwrap_or(0);
    let secs = s_maxage.or(max_age)?.checked_sub(age)?;
    // Bounded so that `now + lifetime` cannot overflow whatever the origin says.
    (secs > 0).then(|| Duration::from_secs(secs.min(MAX_LIFETIME_SECS)))
}

/// Whether a request may be answered from the cache.
pub fn may_use_cache(request: &RequestHead) -> bool {
    let h = &request.headers;
    request.method == "GET"
        && h.get("authorization").is_none()
        && !h.has_token("cache-control", "no-cache")
        && !h.has_token("cache-control", "no-store")
        && !h.has_token("pragma", "no-cache")
}

impl Cache {
    /// A cache of at most `max_bytes`, no single entry above `max_entry` bytes.
    pub fn new(max_bytes: usize, max_entry: usize) -> Cache {
        Cache {
            entries: HashMap::new(),
            bytes: 0,
            max_bytes,
            max_entry: max_entry.min(max_bytes),
            clock: 0,
        }
    }

    /// Bytes in use.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the cache is empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// A fresh response for `key` and its age in seconds; an expired entry is removed.
    pub fn get(&mut self, key: &CacheKey, now: Instant) -> Option<(CachedResponse, u64)> {
        self.clock += 1;
        let expired = match self.entries.get_mut(key) {
            None => return None,
            Some(e) if now < e.expires => {
                e.last_used = self.clock;
                let age = now.saturating_duration_since(e.stored).as_secs();
                return Some((e.response.clone(), age));
            }
            Some(_) => true,
        };
        if expired {
            self.remove(key);
        }
        None
    }

    fn remove(&mut self, key: &CacheKey) {
        if let Some(e) = self.entries.remove(key) {
            self.bytes = self.bytes.saturating_sub(e.response.size());
        }
    }

    /// Stores `response` for `lifetime`, evicting least recently used entries to make room.
    /// Returns whether it was stored (too large entries are not).
    pub fn put(
        &mut self,
        key: CacheKey,
        response: CachedResponse,
        lifetime: Duration,
        now: Instant,
    ) -> bool {
        let size = response.size();
        let Some(expires) = now.checked_add(lifetime) else {
            return false;
        };
        if size > self.max_entry {
            return false;
        }
        self.remove(&key);
        while self.bytes + size > self.max_bytes {
            let Some(oldest) = self
                .entries
                .iter()
                .min_by_key(|(_, e)| e.last_used)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            self.remove(&oldest);
        }
        self.clock += 1;
        self.bytes += size;
        self.entries.insert(
            key,
            Entry {
                response,
                stored: now,
                expires,
                last_used: self.clock,
            },
        );
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::edge::http::{parse_request, parse_response};

    fn req(extra: &str) -> RequestHead {
        parse_request(format!("GET /x HTTP/1.1\r\nHost: a\r\n{extra}\r\n").as_bytes()).unwrap()
    }

    fn resp(cc: &str) -> ResponseHead {
        parse_response(format!("HTTP/1.1 200 OK\r\nCache-Control: {cc}\r\n\r\n").as_bytes())
            .unwrap()
    }

    fn body(n: usize) -> CachedResponse {
        CachedResponse {
            status: 200,
            reason: "OK".into(),
            headers: Headers::default(),
            body: vec![0; n],
        }
    }

    #[test]
    fn only_explicitly_fresh_public_responses_are_storable() {
        assert_eq!(
            storable_lifetime(&req(""), &resp("public, max-age=60")),
            Some(Duration::from_secs(60))
        );
        assert_eq!(
            storable_lifetime(&req(""), &resp("max-age=60, s-maxage=5")),
            Some(Duration::from_secs(5))
        );
        for cc in [
            "no-store",
            "private, max-age=60",
            "max-age=60, no-cache",
            "max-age=0",
            "public",
        ] {
            assert_eq!(storable_lifetime(&req(""), &resp(cc)), None, "{cc}");
        }
        assert_eq!(
            storable_lifetime(&req("Authorization: x\r\n"), &resp("max-age=60")),
            None
        );
        assert_eq!(
            storable_lifetime(&req(""), &resp("max-age=18446744073709551615")),
            Some(Duration::from_secs(MAX_LIFETIME_SECS))
        );
        assert!(!may_use_cache(&req("Cache-Control: no-cache\r\n")));
        assert!(may_use_cache(&req("")));
    }

    #[test]
    fn entries_expire_and_the_least_recently_used_is_evicted() {
        let t0 = Instant::now();
        let mut c = Cache::new(1000, 600);
        let k = |s: &str| ("h".to_string(), s.to_string());
        assert!(c.put(k("a"), body(300), Duration::from_secs(10), t0));
        assert!(c.put(k("b"), body(300), Duration::from_secs(10), t0));
        assert!(c.get(&k("a"), t0).is_some()); // a is now more recent than b
        assert!(c.put(k("c"), body(300), Duration::from_secs(10), t0));
        assert!(c.get(&k("b"), t0).is_none(), "b evicted");
        assert!(c.get(&k("a"), t0).is_some());
        assert!(c.bytes() <= 1000);
        assert!(!c.put(k("big"), body(700), Duration::from_secs(10), t0));
        assert!(
            c.get(&k("a"), t0 + Duration::from_secs(10)).is_none(),
            "expired"
        );
    }
}
