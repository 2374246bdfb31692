//! Helpers shared by the benchmark report programs (`examples/*_bench`): machine description
//! (CPU model, load average), per-thread CPU time from `/proc`, sample statistics, the tokio
//! runtimes the benchmarks time, and the font their plots use.
//!
//! Everything reading `/proc` is Linux-only and degrades to "unknown" (empty, `None`, 0)
//! elsewhere; the parsing is split into pure functions so it can be tested on fixed text.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde_json::{json, Value};

// ---------------------------------------------------------------------------------------------
// Machine description.

/// The `model name` of the first CPU in `/proc/cpuinfo`, or `""`.
pub fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| parse_cpu_model(&s))
        .unwrap_or_default()
}

/// The first `model name` value of a `/proc/cpuinfo` text, trimmed.
pub fn parse_cpu_model(cpuinfo: &str) -> Option<String> {
    cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map(|s| s.trim().to_string())
}

/// Logical cores available to this process, or 0 if unknown.
pub fn cores() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0)
}

fn read_loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg").unwrap_or_default()
}

/// The 1-, 5- and 15-minute load averages from `/proc/loadavg` (`None` where unreadable).
pub fn loadavg() -> [Option<f64>; 3] {
    parse_loadavg(&read_loadavg())
}

/// The 1-, 5- and 15-minute load averages of a `/proc/loadavg` line.
pub fn parse_loadavg(line: &str) -> [Option<f64>; 3] {
    let mut it = line.split_whitespace().map(|x| x.parse().ok());
    [
        it.next().flatten(),
        it.next().flatten(),
        it.next().flatten(),
    ]
}

/// The three load averages of `/proc/loadavg` exactly as the kernel writes them, separated by
/// single spaces (e.g. `"0.52 0.40 0.33"`), or `""`.
pub fn loadavg_text() -> String {
    loadavg_fields(&read_loadavg())
}

/// The first three fields of a `/proc/loadavg` line, separated by single spaces.
pub fn loadavg_fields(line: &str) -> String {
    line.split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

// ---------------------------------------------------------------------------------------------
// CPU time.

/// Total CPU time (ns) in a `schedstat` line (`/proc/<pid>/task/<tid>/schedstat`: time on CPU,
/// time waiting, timeslices), i.e. its first field.
pub fn parse_schedstat(line: &str) -> Option<u64> {
    line.split_whitespace().next().and_then(|x| x.parse().ok())
}

/// CPU time of the calling thread, ns. `CLOCK_THREAD_CPUTIME_ID` is updated on every read,
/// unlike `/proc/thread-self/schedstat` (updated at scheduler events only), so it can time
/// calls of a few microseconds.
pub fn calling_thread_cpu_ns() -> u64 {
    use rustix::time::{clock_gettime, ClockId};
    let t = clock_gettime(ClockId::ThreadCPUTime);
    (t.tv_sec as u64) * 1_000_000_000 + t.tv_nsec as u64
}

/// CPU time (ns, from `/proc/self/task/*/schedstat`) of every live thread of this process whose
/// name starts with one of `prefixes`, by thread id. The schedstat counters are updated at
/// scheduler events, so this suits whole measurement windows, not single short calls.
pub fn thread_cpu_ns(prefixes: &[&str]) -> HashMap<String, u64> {
    task_cpu_ns(Path::new("/proc/self/task"), prefixes)
}

/// [`thread_cpu_ns`] over a `task` directory laid out like `/proc/self/task` (one directory per
/// thread id holding `comm` and `schedstat`). Unreadable entries count 0 ns.
pub fn task_cpu_ns(task_dir: &Path, prefixes: &[&str]) -> HashMap<String, u64> {
    let mut out = HashMap::new();
    for tid in task_ids(task_dir) {
        let p = task_dir.join(&tid);
        let comm = std::fs::read_to_string(p.join("comm")).unwrap_or_default();
        if !prefixes.iter().any(|x| comm.starts_with(x)) {
            continue;
        }
        let ns = std::fs::read_to_string(p.join("schedstat"))
            .ok()
            .and_then(|s| parse_schedstat(&s))
            .unwrap_or(0);
        out.insert(tid, ns);
    }
    out
}

/// The entries of a `task` directory. Linux's listing of `/proc/<pid>/task` can skip a live
/// thread when another thread exits while it is read (seen about once in 2,000 listings under
/// thread churn), and a thread missing from a "before" snapshot would count its whole CPU time.
/// So the directory is listed until two listings agree (at most 8 times) and the union is
/// returned; an id that exited meanwhile finds no `comm` and is filtered by the caller.
fn task_ids(task_dir: &Path) -> BTreeSet<String> {
    let list = || -> BTreeSet<String> {
        std::fs::read_dir(task_dir)
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut all = list();
    let mut prev = all.clone();
    for _ in 0..8 {
        let next = list();
        all.extend(next.iter().cloned());
        if next == prev {
            break;
        }
        prev = next;
    }
    all
}

/// Seconds of CPU the threads used between two [`thread_cpu_ns`] snapshots (threads that
/// appeared in between count from 0; threads that exited are lost).
pub fn cpu_delta_s(before: &HashMap<String, u64>, after: &HashMap<String, u64>) -> f64 {
    after
        .iter()
        .map(|(tid, ns)| ns.saturating_sub(before.get(tid).copied().unwrap_or(0)))
        .sum::<u64>() as f64
        / 1e9
}

/// CPU time of the calling thread, seconds, from `/proc/thread-self/schedstat` (updated at
/// scheduler events only, so only for windows much longer than a timeslice).
pub fn own_cpu_s() -> f64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| parse_schedstat(&s))
        .unwrap_or(0) as f64
        / 1e9
}

// ---------------------------------------------------------------------------------------------
// Statistics.

/// Median, minimum and maximum of a sample.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Summary {
    /// The middle value; the mean of the middle two for an even count.
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Summary {
    /// `None` for an empty sample. NaNs sort last ([`f64::total_cmp`]).
    pub fn of(v: &[f64]) -> Option<Summary> {
        let mut s = v.to_vec();
        s.sort_by(f64::total_cmp);
        let n = s.len();
        let median = match n {
            0 => return None,
            _ if n % 2 == 1 => s[n / 2],
            _ => (s[n / 2 - 1] + s[n / 2]) / 2.0,
        };
        Some(Summary {
            median,
            min: s[0],
            max: s[n - 1],
        })
    }
}

/// `{"median", "min", "max", "samples"}` of a sample (all 0 when empty), the samples in the
/// order given.
pub fn stats(v: &[f64]) -> Value {
    let s = Summary::of(v).unwrap_or(Summary {
        median: 0.0,
        min: 0.0,
        max: 0.0,
    });
    json!({
        "median": s.median,
        "min": s.min,
        "max": s.max,
        "samples": v,
    })
}

/// The `median` of a [`stats`] value (0 if absent).
pub fn med(v: &Value) -> f64 {
    v["median"].as_f64().unwrap_or(0.0)
}

// ---------------------------------------------------------------------------------------------
// Reports.

/// The repository's `docs/bench` directory, where the benchmark programs write their reports
/// (made if missing).
pub fn report_dir() -> std::io::Result<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/bench");
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// Writes `report` to `docs/bench/<name>.json` (pretty, with a final newline) and returns the
/// directory, where the report's plot goes beside it.
pub fn write_report(name: &str, report: &Value) -> std::io::Result<PathBuf> {
    let dir = report_dir()?;
    let text = serde_json::to_string_pretty(report)?;
    std::fs::write(dir.join(format!("{name}.json")), text + "\n")?;
    Ok(dir)
}

// ---------------------------------------------------------------------------------------------
// Runtimes and plots.

/// A multi-threaded tokio runtime with `threads` workers named `name` (so that
/// [`thread_cpu_ns`] can find them).
pub fn runtime(name: &str, threads: usize) -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .thread_name(name)
        .enable_all()
        .build()
}

/// The DejaVu Sans font file the plots register as `sans-serif`, read once and kept for the
/// life of the process (plotters wants `'static` bytes); `None` if it is not installed.
pub fn sans_font() -> Option<&'static [u8]> {
    static FONT: OnceLock<Option<Vec<u8>>> = OnceLock::new();
    FONT.get_or_init(|| std::fs::read("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf").ok())
        .as_deref()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_of_odd_even_and_empty_samples() {
        let s = Summary::of(&[3.0, 1.0, 2.0, 10.0, 0.5]).unwrap();
        assert_eq!(
            s,
            Summary {
                median: 2.0,
                min: 0.5,
                max: 10.0
            }
        );
        let s = Summary::of(&[4.0, 1.0, 3.0, 2.0]).unwrap();
        assert_eq!((s.median, s.min, s.max), (2.5, 1.0, 4.0));
        assert_eq!(Summary::of(&[]), None);
    }

    #[test]
    fn stats_keeps_sample_order_and_field_names() {
        let v = stats(&[3.0, 1.0, 2.0]);
        assert_eq!(
            v,
            json!({"median": 2.0, "min": 1.0, "max": 3.0, "samples": [3.0, 1.0, 2.0]})
        );
        assert_eq!(med(&v), 2.0);
        assert_eq!(
            stats(&[]),
            json!({"median": 0.0, "min": 0.0, "max": 0.0, "samples": []})
        );
        assert_eq!(med(&json!({})), 0.0);
    }

    #[test]
    fn parses_proc_lines() {
        let line = "0.52 0.40 0.33 2/345 12345\n";
        assert_eq!(parse_loadavg(line), [Some(0.52), Some(0.40), Some(0.33)]);
        assert_eq!(loadavg_fields(line), "0.52 0.40 0.33");
        assert_eq!(parse_loadavg(""), [None, None, None]);
        assert_eq!(parse_loadavg("1.5 x"), [Some(1.5), None, None]);
        assert_eq!(loadavg_fields(""), "");

        assert_eq!(parse_schedstat("123456789 4567 89\n"), Some(123_456_789));
        assert_eq!(parse_schedstat(""), None);
        assert_eq!(parse_schedstat("junk 1 2"), None);

        let cpuinfo = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) CPU @ 2.20GHz\nprocessor\t: 1\nmodel name\t: other\n";
        assert_eq!(
            parse_cpu_model(cpuinfo).as_deref(),
            Some("Intel(R) Xeon(R) CPU @ 2.20GHz")
        );
        assert_eq!(parse_cpu_model("processor : 0\n"), None);
    }

    #[test]
    fn task_cpu_by_name_prefix_and_delta() {
        let dir = tempfile::tempdir().unwrap();
        let task = |tid: &str, comm: &str, schedstat: &str| {
            let p = dir.path().join(tid);
            std::fs::create_dir(&p).unwrap();
            std::fs::write(p.join("comm"), format!("{comm}\n")).unwrap();
            std::fs::write(p.join("schedstat"), schedstat).unwrap();
        };
        task("100", "main", "5000000000 0 1\n");
        task("101", "ks-rt-0", "1000000000 0 1\n");
        task("102", "keyless-worker", "2000000000 0 1\n");
        task("103", "ks-rt-1", "garbage\n");
        let before = task_cpu_ns(dir.path(), &["ks-rt", "keyless-worker"]);
        assert_eq!(
            before,
            HashMap::from([
                ("101".to_string(), 1_000_000_000),
                ("102".to_string(), 2_000_000_000),
                ("103".to_string(), 0),
            ])
        );
        assert_eq!(task_cpu_ns(dir.path(), &["nothing"]), HashMap::new());
        assert_eq!(
            task_cpu_ns(&dir.path().join("missing"), &["ks-rt"]),
            HashMap::new()
        );

        // Thread 101 used 0.5 s more, 104 appeared with 0.25 s, 102 exited.
        let after = HashMap::from([
            ("101".to_string(), 1_500_000_000),
            ("103".to_string(), 0),
            ("104".to_string(), 250_000_000),
        ]);
        assert_eq!(cpu_delta_s(&before, &after), 0.75);
        assert_eq!(cpu_delta_s(&after, &after), 0.0);
    }

    #[test]
    fn live_proc_reads_do_not_fail() {
        // Values depend on the machine; on Linux the readers must find them.
        if Path::new("/proc/loadavg").exists() {
            assert!(loadavg().iter().all(Option::is_some), "{:?}", loadavg());
            assert_eq!(loadavg_text().split_whitespace().count(), 3);
        }
        if let Ok(text) = std::fs::read_to_string("/proc/thread-self/schedstat") {
            // The figure itself may be 0 (a fresh thread before its first scheduler event): only
            // its format is ours to check (`own_cpu_s` is this parse over the same file).
            assert!(parse_schedstat(&text).is_some(), "{text:?}");
        }
        let rt = runtime("bench-test-rt", 1).unwrap();
        let mine = rt
            .block_on(rt.spawn(async { thread_cpu_ns(&["bench-test-rt"]) }))
            .unwrap();
        if Path::new("/proc/self/task").exists() {
            assert!(!mine.is_empty());
        }
    }
}
