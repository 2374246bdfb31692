//! Running the process out of file descriptors for a moment, to test what a listener does while
//! `accept` fails (EMFILE) and after. Process-wide: use it only in a test binary of its own.
//! Time is never asserted: a slower machine only makes a pausing listener try less often.

use std::os::fd::AsRawFd;
use std::time::Duration;

use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};

/// How long the process stays out of descriptors while failed accepts are counted.
pub const STARVED: Duration = Duration::from_millis(600);

/// With pauses of 5, 10, 20, … ms at most 8 tries fit in [`STARVED`] (plus the one seen before
/// it starts), on any machine. A listener that retries at once fails thousands of times.
pub const MOST_TRIES: u64 = 12;

/// While alive, the open-files soft limit is the lowest free descriptor: every new socket and
/// every accept fails with EMFILE. Dropping it restores the limit.
pub struct OutOfDescriptors {
    saved: Rlimit,
}

impl OutOfDescriptors {
    /// Lowers the limit. Sockets made before (e.g. a client's, to connect with) still work.
    pub fn new() -> std::io::Result<OutOfDescriptors> {
        let saved = getrlimit(Resource::Nofile);
        let lowest_free = std::fs::File::open("/dev/null")?.as_raw_fd();
        setrlimit(
            Resource::Nofile,
            Rlimit {
                current: Some(lowest_free as u64),
                maximum: saved.maximum,
            },
        )?;
        Ok(OutOfDescriptors { saved })
    }
}

impl Drop for OutOfDescriptors {
    fn drop(&mut self) {
        let _ = setrlimit(Resource::Nofile, self.saved);
    }
}

/// For each of `N` listeners whose failed accepts `counts` reads: how many more failed during
/// [`STARVED`], counted from the first failure of each (waited for up to `bound`). `None` if
/// some listener's accept never failed.
pub async fn failures_while_starved<const N: usize>(
    counts: impl Fn() -> [u64; N],
    bound: Duration,
) -> Option<[u64; N]> {
    let first = tokio::time::timeout(bound, async {
        while counts().contains(&0) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        counts()
    })
    .await
    .ok()?;
    tokio::time::sleep(STARVED).await;
    let now = counts();
    Some(std::array::from_fn(|i| now[i] - first[i]))
}
