//! The calling thread's CPU-time clock, exact enough to time single calls. (A named tokio
//! runtime's threads, for whole measurement windows: `mbx_testbed::bench::thread_cpu_ns`.)

use rustix::time::{clock_gettime, ClockId};

/// CPU time of the calling thread, ns. `CLOCK_THREAD_CPUTIME_ID` is updated on every read,
/// unlike `/proc/thread-self/schedstat` (updated at scheduler events only), so it can time
/// calls of a few microseconds.
pub fn thread_ns() -> u64 {
    let t = clock_gettime(ClockId::ThreadCPUTime);
    (t.tv_sec as u64) * 1_000_000_000 + t.tv_nsec as u64
}
