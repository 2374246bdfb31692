//! CPU-time clocks: the calling thread's (exact, for timing single calls) and a named tokio
//! runtime's threads (from `/proc/self/task/*/schedstat`, for whole measurement windows).

use std::collections::HashMap;

use rustix::time::{clock_gettime, ClockId};

/// CPU time of the calling thread, ns. `CLOCK_THREAD_CPUTIME_ID` is updated on every read,
/// unlike `/proc/thread-self/schedstat` (updated at scheduler events only), so it can time
/// calls of a few microseconds.
pub fn thread_ns() -> u64 {
    let t = clock_gettime(ClockId::ThreadCPUTime);
    (t.tv_sec as u64) * 1_000_000_000 + t.tv_nsec as u64
}

/// CPU time (ns) of every live thread whose name starts with `prefix`, by thread id.
pub fn threads_ns(prefix: &str) -> HashMap<String, u64> {
    let mut out = HashMap::new();
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return out;
    };
    for e in dir.flatten() {
        let p = e.path();
        let comm = std::fs::read_to_string(p.join("comm")).unwrap_or_default();
        if !comm.starts_with(prefix) {
            continue;
        }
        let ns = std::fs::read_to_string(p.join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next().and_then(|x| x.parse().ok()))
            .unwrap_or(0);
        out.insert(e.file_name().to_string_lossy().into_owned(), ns);
    }
    out
}

/// Seconds of CPU the threads used between two [`threads_ns`] snapshots.
pub fn delta_s(before: &HashMap<String, u64>, after: &HashMap<String, u64>) -> f64 {
    after
        .iter()
        .map(|(tid, ns)| ns.saturating_sub(before.get(tid).copied().unwrap_or(0)))
        .sum::<u64>() as f64
        / 1e9
}

/// The 1-, 5- and 15-minute load averages.
pub fn loadavg() -> [f64; 3] {
    let s = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let mut it = s.split_whitespace().map(|x| x.parse().unwrap_or(0.0));
    [
        it.next().unwrap_or(0.0),
        it.next().unwrap_or(0.0),
        it.next().unwrap_or(0.0),
    ]
}
