//! What one client may take of a listener: connections open at once
//! ([`Limits::max_connections_per_client`]) and new connections per second
//! ([`Limits::connection_rate_per_client`]). Both are checked at the accept, before anything is
//! read; a connection over either is closed at once, counted, and the first refusal of a run
//! logged.
//!
//! A client is an IPv4 address (IPv4-mapped IPv6 counts as IPv4) or an IPv6 /64: a host is
//! commonly given a whole /64 and may send from any address in it, so a limit per IPv6 address
//! would bound nothing.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::{ConnectionRate, Limits};

/// A client as the per-client limits count it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct Client(IpAddr);

impl Client {
    pub(super) fn of(peer: SocketAddr) -> Client {
        match peer.ip().to_canonical() {
            // One host whatever its /64 (::/64) holds: named as itself in the log.
            IpAddr::V6(v6) if v6.is_loopback() => Client(IpAddr::V6(v6)),
            IpAddr::V6(v6) => {
                let prefix = u128::from(v6) & !((1u128 << 64) - 1);
                Client(IpAddr::V6(Ipv6Addr::from(prefix)))
            }
            v4 => Client(v4),
        }
    }
}

impl core::fmt::Display for Client {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self.0 {
            IpAddr::V4(v4) => write!(f, "{v4}"),
            IpAddr::V6(v6) if v6.is_loopback() => write!(f, "{v6}"),
            IpAddr::V6(v6) => write!(f, "{v6}/64"),
        }
    }
}

/// Why a connection was closed at its accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Refused {
    /// Its client had `max_connections_per_client` open.
    Open,
    /// Its client opened connections faster than `connection_rate_per_client`.
    Rate,
}

/// A listener's per-client state: both limits' tables and their refusal counts.
#[derive(Default)]
pub(super) struct ClientLimits {
    open: Arc<OpenPerClient>,
    rates: Mutex<RatePerClient>,
    log: Mutex<LogGate>,
    pub(super) refused_open: Arc<AtomicU64>,
    pub(super) refused_rate: Arc<AtomicU64>,
}

impl ClientLimits {
    /// Whether a connection from `peer`, accepted at `now`, may be served under `limits`:
    /// `Ok(Some(slot))` holds its place among its client's open connections until dropped
    /// (`Ok(None)` without that limit). A refusal is counted, and logged when it is the first
    /// of its client's run. A connection refused for the number open does not use up the
    /// client's rate.
    pub(super) fn admit(
        &self,
        peer: SocketAddr,
        limits: &Limits,
        now: Instant,
    ) -> Result<Option<OpenSlot>, Refused> {
        let client = Client::of(peer);
        let slot = match limits.max_connections_per_client {
            None => None,
            Some(max) => match self.open.take(client, max) {
                Ok(slot) => Some(slot),
                Err(first) => {
                    self.refused_open.fetch_add(1, Ordering::Relaxed);
                    if let Some(unlogged) = self.log_now(first, now) {
                        tracing::warn!(
                            %client,
                            limit = max,
                            unlogged,
                            "connections from this client closed at their accept while it has max_connections_per_client open (later ones while it has: counted in connections_refused_per_client_total, not logged)"
                        );
                    }
                    return Err(Refused::Open);
                }
            },
        };
        if let Some(rate) = limits.connection_rate_per_client {
            let taken = self
                .rates
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take(client, rate, now);
            if let Err(first) = taken {
                self.refused_rate.fetch_add(1, Ordering::Relaxed);
                if let Some(unlogged) = self.log_now(first, now) {
                    tracing::warn!(
                        %client,
                        per_second = rate.per_second,
                        burst = rate.burst,
                        unlogged,
                        "connections from this client closed at their accept: it opens them faster than connection_rate_per_client (later ones until it slows down: counted in connections_refused_rate_per_client_total, not logged)"
                    );
                }
                return Err(Refused::Rate);
            }
        }
        Ok(slot)
    }

    /// Whether a client's first refusal of a run is logged now, and how many such first
    /// refusals the gate held back since the last line ([`LogGate`]).
    fn log_now(&self, first: bool, now: Instant) -> Option<u64> {
        if !first {
            return None;
        }
        self.log.lock().unwrap_or_else(|e| e.into_inner()).pass(now)
    }
}

/// Refusal warnings a listener writes per minute at most: each client's first refusal of a
/// run is one line, and many clients at once (a scan, a botnet) would otherwise flood the
/// log. The next line that passes says how many were held back (`unlogged`).
const REFUSAL_LINES_PER_MINUTE: u32 = 10;

#[derive(Debug, Default)]
struct LogGate {
    /// When the current minute began, and the lines written in it.
    window: Option<(Instant, u32)>,
    held_back: u64,
}

impl LogGate {
    /// `Some(held back since the last line)` if a line may be written at `now`.
    fn pass(&mut self, now: Instant) -> Option<u64> {
        let minute = Duration::from_secs(60);
        let (start, lines) = match self.window {
            Some((start, lines)) if now.saturating_duration_since(start) < minute => (start, lines),
            _ => (now, 0),
        };
        if lines >= REFUSAL_LINES_PER_MINUTE {
            self.window = Some((start, lines));
            self.held_back += 1;
            return None;
        }
        self.window = Some((start, lines + 1));
        Some(std::mem::take(&mut self.held_back))
    }
}

/// The open connections of each client (only clients with a connection open have an entry).
#[derive(Default)]
struct OpenPerClient(Mutex<HashMap<Client, ClientOpen>>);

struct ClientOpen {
    connections: usize,
    /// A refusal of this client was logged since its first connection opened: a client that
    /// keeps knocking at its limit is logged once, not once per attempt.
    refusal_logged: bool,
}

/// One open connection of a client, given back when its task ends or is aborted.
pub(super) struct OpenSlot {
    table: Arc<OpenPerClient>,
    client: Client,
}

impl OpenPerClient {
    fn entries(&self) -> MutexGuard<'_, HashMap<Client, ClientOpen>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A slot for one more connection of `client`, or, when it has `max` open, whether this
    /// refusal is the first to log.
    fn take(self: &Arc<Self>, client: Client, max: usize) -> Result<OpenSlot, bool> {
        // No entry for a client that may never open one: it would never be removed.
        if max == 0 {
            return Err(false);
        }
        let mut entries = self.entries();
        let open = entries.entry(client).or_insert(ClientOpen {
            connections: 0,
            refusal_logged: false,
        });
        if open.connections >= max {
            return Err(!std::mem::replace(&mut open.refusal_logged, true));
        }
        open.connections += 1;
        Ok(OpenSlot {
            table: self.clone(),
            client,
        })
    }
}

impl Drop for OpenSlot {
    fn drop(&mut self) {
        let mut entries = self.table.entries();
        if let Some(open) = entries.get_mut(&self.client) {
            open.connections -= 1;
            if open.connections == 0 {
                entries.remove(&self.client);
            }
        }
    }
}

/// The table is swept of clients whose budget is whole again when it grows past this many
/// entries, or past twice what the last sweep left: each sweep then pays for as many
/// accepts as it looks at.
const SWEEP_AT_LEAST: usize = 1024;

/// New connections per client, as a generic cell rate algorithm (a token bucket kept as one
/// instant per client): a client may open `burst` at once, then one every `1 / per_second`.
/// Sans-I/O: the caller gives the time. Only clients whose budget is not whole have to be
/// kept; the others are swept out as the table grows, so it holds about the clients seen
/// within the last `burst / per_second` seconds.
#[derive(Debug)]
struct RatePerClient {
    entries: HashMap<Client, RateEntry>,
    sweep_above: usize,
}

impl Default for RatePerClient {
    fn default() -> RatePerClient {
        RatePerClient {
            entries: HashMap::new(),
            sweep_above: SWEEP_AT_LEAST,
        }
    }
}

#[derive(Debug)]
struct RateEntry {
    /// When the client's budget is whole again; a connection is admitted while this is at
    /// most `(burst - 1) / per_second` ahead of now, and moves it `1 / per_second` on.
    whole_at: Instant,
    /// A refusal was logged since the budget was last whole.
    refusal_logged: bool,
}

impl RatePerClient {
    /// Takes one connection of `client`'s budget at `now`, or says whether this refusal is the
    /// first to log since its budget was whole.
    fn take(&mut self, client: Client, rate: ConnectionRate, now: Instant) -> Result<(), bool> {
        if rate.per_second == 0 {
            return Err(false);
        }
        let interval = Duration::from_nanos(1_000_000_000 / u64::from(rate.per_second));
        let ahead_allowed = interval
            .checked_mul(rate.burst.max(1) - 1)
            .unwrap_or(Duration::MAX);
        self.sweep(now);
        let entry = self.entries.entry(client).or_insert(RateEntry {
            whole_at: now,
            refusal_logged: false,
        });
        if entry.whole_at <= now {
            entry.whole_at = now;
            entry.refusal_logged = false;
        }
        if entry.whole_at - now > ahead_allowed {
            return Err(!std::mem::replace(&mut entry.refusal_logged, true));
        }
        entry.whole_at += interval;
        Ok(())
    }

    fn sweep(&mut self, now: Instant) {
        if self.entries.len() <= self.sweep_above {
            return;
        }
        self.entries.retain(|_, e| e.whole_at > now);
        self.sweep_above = (self.entries.len() * 2).max(SWEEP_AT_LEAST);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(s: &str) -> Client {
        Client::of(SocketAddr::new(s.parse().unwrap(), 443))
    }

    #[test]
    fn a_client_is_an_ipv4_address_or_an_ipv6_slash_64() {
        assert_eq!(client("192.0.2.7"), client("::ffff:192.0.2.7"));
        assert_ne!(client("192.0.2.7"), client("192.0.2.8"));
        assert_eq!(client("2001:db8:1:2::1"), client("2001:db8:1:2:ffff::9"));
        assert_ne!(client("2001:db8:1:2::1"), client("2001:db8:1:3::1"));
        assert_eq!(
            client("2001:db8:1:2:abcd::1").to_string(),
            "2001:db8:1:2::/64"
        );
        assert_eq!(client("::ffff:192.0.2.7").to_string(), "192.0.2.7");
    }

    const RATE: ConnectionRate = ConnectionRate {
        per_second: 10,
        burst: 3,
    };

    /// `burst` at once, then one per `1 / per_second`; refusals do not use the budget up; one
    /// client's budget is not another's; the first refusal of a run is the one logged.
    #[test]
    fn a_client_opens_its_burst_then_one_per_interval() {
        let mut rates = RatePerClient::default();
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let a = client("192.0.2.1");
        for _ in 0..3 {
            assert_eq!(rates.take(a, RATE, t0), Ok(()));
        }
        assert_eq!(rates.take(a, RATE, t0), Err(true));
        assert_eq!(rates.take(a, RATE, ms(99)), Err(false));
        assert_eq!(rates.take(client("192.0.2.2"), RATE, ms(99)), Ok(()));
        assert_eq!(rates.take(a, RATE, ms(100)), Ok(()));
        assert_eq!(rates.take(a, RATE, ms(100)), Err(false));
        assert_eq!(rates.take(a, RATE, ms(200)), Ok(()));
        // Idle long enough to be whole again: a burst, and a new run to log.
        for _ in 0..3 {
            assert_eq!(rates.take(a, RATE, ms(10_000)), Ok(()));
        }
        assert_eq!(rates.take(a, RATE, ms(10_000)), Err(true));
        // Idle for part of it: part of the burst.
        assert_eq!(rates.take(a, RATE, ms(10_250)), Ok(()));
        assert_eq!(rates.take(a, RATE, ms(10_250)), Ok(()));
        // The same run: not logged again.
        assert_eq!(rates.take(a, RATE, ms(10_250)), Err(false));
    }

    #[test]
    fn a_rate_of_zero_refuses_everything_and_a_burst_of_zero_is_one() {
        let mut rates = RatePerClient::default();
        let t0 = Instant::now();
        let a = client("192.0.2.1");
        let none = ConnectionRate {
            per_second: 0,
            burst: 5,
        };
        assert_eq!(rates.take(a, none, t0), Err(false));
        assert!(rates.entries.is_empty());
        let one = ConnectionRate {
            per_second: 1,
            burst: 0,
        };
        assert_eq!(rates.take(a, one, t0), Ok(()));
        assert_eq!(rates.take(a, one, t0), Err(true));
        let huge = ConnectionRate {
            per_second: u32::MAX,
            burst: u32::MAX,
        };
        assert_eq!(rates.take(client("192.0.2.9"), huge, t0), Ok(()));
    }

    /// At most ten refusal lines a minute, the next one after saying how many were held
    /// back; a new minute starts afresh.
    #[test]
    fn refusal_lines_are_at_most_ten_a_minute() {
        let mut gate = LogGate::default();
        let t0 = Instant::now();
        for _ in 0..REFUSAL_LINES_PER_MINUTE {
            assert_eq!(gate.pass(t0), Some(0));
        }
        for _ in 0..5 {
            assert_eq!(gate.pass(t0 + Duration::from_secs(59)), None);
        }
        assert_eq!(gate.pass(t0 + Duration::from_secs(60)), Some(5));
        assert_eq!(gate.pass(t0 + Duration::from_secs(61)), Some(0));
    }

    #[test]
    fn ipv6_loopback_is_its_own_client() {
        assert_eq!(client("::1").to_string(), "::1");
        assert_ne!(client("::1"), client("::2"));
    }

    /// Both limits at one accept: a connection refused for the number open leaves the rate's
    /// budget as it was, each refusal is counted under its own limit, and a slot given back
    /// lets the client in again.
    #[test]
    fn a_connection_refused_for_the_number_open_does_not_use_the_rate_up() {
        let limits = Limits {
            max_connections_per_client: Some(1),
            connection_rate_per_client: Some(ConnectionRate {
                per_second: 1,
                burst: 2,
            }),
            ..Limits::default()
        };
        let clients = ClientLimits::default();
        let t0 = Instant::now();
        let peer = |port| SocketAddr::new("192.0.2.1".parse().unwrap(), port);
        let first = clients.admit(peer(1), &limits, t0).unwrap();
        assert!(first.is_some());
        for port in 2..10 {
            assert_eq!(
                clients.admit(peer(port), &limits, t0).err(),
                Some(Refused::Open)
            );
        }
        drop(first);
        let second = clients.admit(peer(10), &limits, t0).unwrap();
        drop(second);
        assert_eq!(
            clients.admit(peer(11), &limits, t0).err(),
            Some(Refused::Rate)
        );
        let counts = |c: &ClientLimits| {
            (
                c.refused_open.load(Ordering::Relaxed),
                c.refused_rate.load(Ordering::Relaxed),
            )
        };
        assert_eq!(counts(&clients), (8, 1));
        // One client: an IPv4 address as itself or mapped, any address of an IPv6 /64.
        let mapped = SocketAddr::new("::ffff:192.0.2.1".parse().unwrap(), 12);
        assert_eq!(
            clients.admit(mapped, &limits, t0).err(),
            Some(Refused::Rate)
        );
        let v6 = |s: &str| SocketAddr::new(s.parse().unwrap(), 443);
        let _held = clients.admit(v6("2001:db8:0:1::1"), &limits, t0).unwrap();
        let same_64 = clients.admit(v6("2001:db8:0:1:8000::2"), &limits, t0);
        assert_eq!(same_64.err(), Some(Refused::Open));
        assert!(clients.admit(v6("2001:db8:0:2::1"), &limits, t0).is_ok());
        // Without limits nothing is kept or counted.
        let free = ClientLimits::default();
        for port in 0..100 {
            assert!(free
                .admit(peer(port), &Limits::default(), t0)
                .unwrap()
                .is_none());
        }
        assert_eq!(counts(&free), (0, 0));
        assert!(free.open.entries().is_empty());
    }

    proptest::proptest! {
        /// Whatever the arrivals, no window of time admits more than the burst and the rate
        /// over its length, and a client whose arrivals are paced at the rate is never refused.
        #[test]
        fn no_window_admits_more_than_the_burst_and_its_rate(
            per_second in 1u32..50,
            burst in 1u32..8,
            gaps_ms in proptest::collection::vec(0u64..400, 1..120),
        ) {
            let rate = ConnectionRate { per_second, burst };
            let mut rates = RatePerClient::default();
            let a = client("192.0.2.1");
            let t0 = Instant::now();
            let mut at = t0;
            let mut admitted = Vec::new();
            for gap in gaps_ms {
                at += Duration::from_millis(gap);
                if rates.take(a, rate, at).is_ok() {
                    admitted.push(at - t0);
                }
            }
            let interval = Duration::from_nanos(1_000_000_000 / u64::from(per_second));
            for (i, &start) in admitted.iter().enumerate() {
                for (j, &end) in admitted.iter().enumerate().skip(i) {
                    let in_window = (j - i + 1) as u128;
                    let allowed = u128::from(burst) + (end - start).as_nanos() / interval.as_nanos();
                    proptest::prop_assert!(in_window <= allowed, "{in_window} in {:?}", end - start);
                }
            }
            let mut paced = RatePerClient::default();
            for n in 0..50u32 {
                proptest::prop_assert!(paced.take(a, rate, t0 + interval * n).is_ok());
            }
        }
    }

    /// Clients whose budget is whole again are swept out once the table is large, so that a
    /// stream of new clients does not grow it without bound; those still owing are kept.
    #[test]
    fn the_rate_table_keeps_only_clients_that_still_owe() {
        let mut rates = RatePerClient::default();
        let t0 = Instant::now();
        let owing = client("198.51.100.1");
        for _ in 0..3 {
            rates.take(owing, RATE, t0).unwrap();
        }
        for i in 0..SWEEP_AT_LEAST as u32 {
            let c = Client(IpAddr::V4((0x0a00_0000 + i).into()));
            rates.take(c, RATE, t0).unwrap();
        }
        assert_eq!(rates.entries.len(), SWEEP_AT_LEAST + 1);
        // 150 ms on, the single connections are paid off; the burst is not.
        rates
            .take(client("203.0.113.1"), RATE, t0 + Duration::from_millis(150))
            .unwrap();
        assert_eq!(rates.entries.len(), 2);
        assert_eq!(
            rates.take(owing, RATE, t0 + Duration::from_millis(150)),
            Ok(())
        );
        assert_eq!(
            rates.take(owing, RATE, t0 + Duration::from_millis(150)),
            Err(true)
        );
    }
}
