//! `mbx keyless demo` as a process: every check passes, and the output shows the TLS versions,
//! which key server signed for which site, the cache hit and the 421.

use std::process::Command;

fn mbx() -> Command {
    Command::new(env!("CARGO_BIN_EXE_mbx"))
}

fn run(args: &[&str]) -> (bool, String, String) {
    let out = mbx().args(args).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn keyless_demo_runs_both_versions_and_every_check_passes() {
    let (ok, stdout, stderr) = run(&["keyless", "demo"]);
    assert!(ok, "keyless demo failed: {stdout}\n{stderr}");
    for expected in [
        "none contains a site private key",
        "[1] TLS 1.3 to ec.keyless.test (ECDSA P-256)",
        "[4] TLS 1.2 to rsa.keyless.test (RSA-2048)",
        "* SSL connection using TLSv1.3 / TLS_",
        "* SSL connection using TLSv1.2 / TLS_ECDHE_ECDSA_WITH_",
        "* SSL connection using TLSv1.2 / TLS_ECDHE_RSA_WITH_",
        "*  subject: CN=ec.keyless.test",
        "*  subject: CN=rsa.keyless.test",
        "< HTTP/1.1 200 OK",
        "hello from the origin: rsa.keyless.test/",
        "signed: EcdsaSignSha256 0 → 1",
        "signed: EcdsaSignSha256 1 → 2",
        "signed: RsaPssSignSha256 0 → 1",
        "uses key-server pool \"ecdsa\"",
        "uses key-server pool \"rsa\"",
        "< X-Cache: HIT",
        "origin hits unchanged (1)",
        "< HTTP/1.1 421 Misdirected Request",
        "All checks passed.",
    ] {
        assert!(
            stdout.contains(expected),
            "keyless demo output lacks {expected:?}:\n{stdout}"
        );
    }
    // Each fetch is signed by its site's key server only.
    assert_eq!(stdout.matches(": no request").count(), 4, "{stdout}");
}

#[test]
fn keyless_demo_runs_only_the_requested_version_and_refuses_unknown_ones() {
    let (ok, stdout, stderr) = run(&["keyless", "demo", "--tls", "1.2"]);
    assert!(ok, "{stdout}\n{stderr}");
    assert!(stdout.contains("TLSv1.2 /") && !stdout.contains("TLSv1.3 /"));
    assert!(stdout.contains("All checks passed."));

    let (ok, stdout, stderr) = run(&["keyless", "demo", "--tls", "1.1"]);
    assert!(!ok, "an unknown version must fail: {stdout}");
    assert!(stderr.contains("unknown TLS version"), "{stderr}");
    assert!(
        stdout.is_empty(),
        "nothing runs before the flags are checked"
    );
}
