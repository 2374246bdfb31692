//! `mbx mbtls middlebox` and `mbx mbtls client` as processes, in front of a real nginx.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use mbx_testbed::peers::ChildGuard;
use mbx_testbed::{LeafSpec, Nginx, TestPki};

fn mbx() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_mbx"));
    cmd.env_remove("MBX_CONFIG").env_remove("MBX_LOG");
    cmd
}

#[test]
fn client_fetches_through_the_middlebox_and_refuses_a_wrong_measurement() {
    let dir = tempfile::tempdir().unwrap();
    let pki = TestPki::new("mbx cli mbtls root").unwrap();
    let server = pki
        .issue(&LeafSpec::server("server.test"))
        .unwrap()
        .write_to_named(dir.path(), "server")
        .unwrap();
    let mbox = pki
        .issue(&LeafSpec::middlebox("mb.test"))
        .unwrap()
        .write_to_named(dir.path(), "mbox")
        .unwrap();
    let nginx = Nginx::from_files(&server)
        .log_header("X-Mbtls")
        .start()
        .unwrap();

    let child = mbx()
        .args([
            "mbtls",
            "middlebox",
            "--listen",
            "127.0.0.1:0",
            "--next-hop",
        ])
        .arg(nginx.addr().to_string())
        .arg("--certificate")
        .arg(&mbox.chain)
        .arg("--private-key")
        .arg(&mbox.key)
        .args(["--app", "http-header:X-Mbtls:mb.test", "--attester", "sim"])
        .arg("--sim-platform-key")
        .arg(dir.path().join("platform.key"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut child = ChildGuard::new(child);
    let stdout = child.child_mut().unwrap().stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let mut header = Vec::new();
    for _ in 0..3 {
        header.push(lines.next().unwrap().unwrap());
    }
    let addr = header[0]
        .strip_prefix("mbTLS middlebox listening on ")
        .and_then(|r| r.split(',').next())
        .unwrap_or_else(|| panic!("{header:?}"))
        .to_owned();
    let word_after = |word: &str| {
        let line = &header[2];
        let i = line.find(word).unwrap_or_else(|| panic!("{line}")) + word.len();
        line[i..].split_whitespace().next().unwrap().to_owned()
    };
    let platform_key = word_after("platform key ");
    let measurement = word_after("measurement ");

    // TLS 1.3 from flags.
    let out = mbx()
        .args([
            "mbtls",
            "client",
            "https://server.test/headers",
            "--middlebox",
        ])
        .arg(&addr)
        .args(["--middlebox-name", "mb.test", "--server-ca"])
        .arg(&server.ca)
        .args(["--allow-simulated", "--tls", "1.3"])
        .args(["--sim-platform-key", &platform_key])
        .args(["--measurement", &measurement])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for expected in [
        "path: client -> mb.test",
        "TLS 1.3, TLS_",
        "hop 1: client <-> mb.test (fresh keys): c2s ",
        "hop 2: mb.test <-> server.test (primary session keys): c2s ",
        &format!("attestation: mb.test verified (sim TEE, measurement {measurement}"),
        "status: HTTP/1.1 200 OK",
        "x-mbtls: mb.test",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }
    let report = lines.next().unwrap().unwrap();
    assert!(
        report.contains("joined, TLS 1.3") && report.contains("closed cleanly"),
        "{report}"
    );

    // TLS 1.2 from `[mbtls.client]` in a config file.
    let config = dir.path().join("mbx.toml");
    std::fs::write(
        &config,
        format!(
            "[mbtls.client]\nmiddlebox = \"{addr}\"\nmiddlebox_name = \"mb.test\"\nserver_ca = \"{}\"\ntls = \"1.2\"\n\
             [mbtls.client.attestation]\nallow_simulated = true\nmeasurements = [\"{measurement}\"]\nsim_platform_keys = [\"{platform_key}\"]\n",
            server.ca.display()
        ),
    )
    .unwrap();
    let out = mbx()
        .arg("--config")
        .arg(&config)
        .args(["mbtls", "client", "https://server.test/headers"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("TLS 1.2, TLS_"), "{text}");
    assert!(text.contains("x-mbtls: mb.test"), "{text}");
    let log = nginx
        .wait_access_log(|l| l.matches("x-mbtls=\"mb.test\"").count() >= 2)
        .unwrap();
    assert!(log.contains("TLSv1.2") && log.contains("TLSv1.3"), "{log}");
    let _ = lines.next();

    // A policy that accepts another measurement: refused, nothing printed on stdout.
    let out = mbx()
        .args([
            "mbtls",
            "client",
            "https://server.test/headers",
            "--middlebox",
        ])
        .arg(&addr)
        .args(["--middlebox-name", "mb.test", "--server-ca"])
        .arg(&server.ca)
        .args(["--allow-simulated", "--sim-platform-key", &platform_key])
        .args(["--measurement", &"00".repeat(32)])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("is not accepted by policy"), "{err}");
    let report = lines.next().unwrap().unwrap();
    assert!(report.contains("no key material received"), "{report}");
    child.kill();
}

#[test]
fn mbtls_server_is_not_built_and_says_so() {
    let out = mbx().args(["mbtls", "server", "--help"]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("not implemented yet"));
}
