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
