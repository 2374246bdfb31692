//! Helpers shared by the tests that run the `mbx` binary.
// Each test file is its own crate and uses only some of these.
#![allow(dead_code)]

use std::process::{Command, Output};

/// The `mbx` binary, without the user's configuration or log settings.
pub fn mbx() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_mbx"));
    cmd.env_remove("MBX_CONFIG").env_remove("MBX_LOG");
    cmd
}

/// The stdout of a command that must have succeeded (else the test fails with both outputs).
pub fn succeeded(out: &Output) -> String {
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// A run that must have failed with exit status 1: its standard error.
pub fn failure(out: &Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{err}");
    err
}

/// Runs `cmd` to completion; its stdout, which it must have succeeded to give.
pub fn run_ok(cmd: &mut Command) -> String {
    succeeded(&cmd.output().unwrap())
}

/// Sends `sig` to process `pid` (SIGHUP: reload; SIGTERM: drain and stop), without needing a
/// `kill` binary.
pub fn signal(pid: u32, sig: rustix::process::Signal) {
    let pid = rustix::process::Pid::from_raw(pid as i32).expect("a child's pid is positive");
    rustix::process::kill_process(pid, sig).unwrap();
}

/// A started process's stdout, line by line, read on a thread: a line that does not come
/// within [`LINE_WAIT`] is an error (`TimedOut`), so a test waiting for it fails instead of
/// hanging the suite. The lines end (`None`) when the process closes its stdout.
pub struct TimedLines {
    rx: std::sync::mpsc::Receiver<String>,
}

/// How long a test waits for the next line of a process's output.
pub const LINE_WAIT: std::time::Duration = std::time::Duration::from_secs(120);

impl TimedLines {
    pub fn new(stdout: impl std::io::Read + Send + 'static) -> TimedLines {
        use std::io::BufRead as _;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        TimedLines { rx }
    }
}

impl Iterator for TimedLines {
    type Item = std::io::Result<String>;

    fn next(&mut self) -> Option<Self::Item> {
        use std::sync::mpsc::RecvTimeoutError;
        match self.rx.recv_timeout(LINE_WAIT) {
            Ok(line) => Some(Ok(line)),
            Err(RecvTimeoutError::Disconnected) => None,
            Err(RecvTimeoutError::Timeout) => Some(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no line within {LINE_WAIT:?}"),
            ))),
        }
    }
}
