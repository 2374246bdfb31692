//! `mbx mbtls middlebox`, `client` and `server` as processes: in front of a real nginx, and
//! behind curl (server-side middlebox and mbTLS server).

use std::process::Stdio;

use mbx_testbed::peers::ChildGuard;
use mbx_testbed::{LeafSpec, Nginx, PkiFiles, TestPki};
use rustix::process::Signal;

mod common;
use common::{failure, mbx, run_ok, succeeded, TimedLines};

// Locates Intel's DCAP sample quotes in the `dcap-qvl` package (as the attestation tests do).
#[path = "../../attest/tests/common/mod.rs"]
mod dcap_samples;

/// Whether one line of nginx's access log `log` is the request for `path` and carries every one
/// of `fields` (the whole log would also match fields logged for an earlier request).
fn logged(log: &str, path: &str, fields: &[&str]) -> bool {
    log.lines()
        .any(|line| line.contains(path) && fields.iter().all(|f| line.contains(f)))
}

/// A temporary directory with a test PKI's server (server.test) and middlebox (mb.test) files,
/// and nginx serving as server.test and logging the X-Mbtls request header.
struct Setup {
    dir: tempfile::TempDir,
    pki: TestPki,
    server: PkiFiles,
    mbox: PkiFiles,
    nginx: Nginx,
}

/// A temporary directory with a test PKI's server (server.test) and middlebox (`middlebox`)
/// files.
fn pki_files(root: &str, middlebox: &str) -> (tempfile::TempDir, TestPki, PkiFiles, PkiFiles) {
    let dir = tempfile::tempdir().unwrap();
    let pki = TestPki::new(root).unwrap();
    let server = pki
        .issue(&LeafSpec::server("server.test"))
        .unwrap()
        .write_to_named(dir.path(), "server")
        .unwrap();
    let mbox = pki
        .issue(&LeafSpec::middlebox(middlebox))
        .unwrap()
        .write_to_named(dir.path(), "mbox")
        .unwrap();
    (dir, pki, server, mbox)
}

impl Setup {
    fn new(root: &str) -> Setup {
        let (dir, pki, server, mbox) = pki_files(root, "mb.test");
        let nginx = Nginx::from_files(&server)
            .log_header("X-Mbtls")
            .start()
            .unwrap();
        Setup {
            dir,
            pki,
            server,
            mbox,
            nginx,
        }
    }
}

#[test]
fn client_fetches_through_the_middlebox_and_refuses_a_wrong_measurement() {
    let Setup {
        dir,
        server,
        mbox,
        nginx,
        ..
    } = Setup::new("mbx cli mbtls root");

    let (mut child, mut lines, header) = start_command(
        mbx()
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
            .arg(dir.path().join("platform.key")),
        4,
    );
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

    // The client through this middlebox, trusting its simulated platform, from flags.
    let client = || {
        let mut cmd = client_through(&addr, &server);
        cmd.args(["--allow-simulated", "--sim-platform-key", &platform_key]);
        cmd
    };

    // TLS 1.3 from flags.
    let text = run_ok(client().args(["--tls", "1.3", "--measurement", &measurement]));
    for expected in [
        "path: client -> mb.test",
        "TLS 1.3, TLS_",
        "hop 1: client <-> mb.test (fresh keys): c2s ",
        "hop 2: mb.test <-> server.test (primary session keys, also held by any middlebox on the server's side): c2s ",
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
    let text = run_ok(mbx().arg("--config").arg(&config).args([
        "mbtls",
        "client",
        "https://server.test/headers",
    ]));
    assert!(text.contains("TLS 1.2, TLS_"), "{text}");
    assert!(text.contains("x-mbtls: mb.test"), "{text}");
    let log = nginx
        .wait_access_log(|l| l.matches("x-mbtls=\"mb.test\"").count() >= 2)
        .unwrap();
    assert!(log.contains("TLSv1.2") && log.contains("TLSv1.3"), "{log}");
    let _ = lines.next();

    // A policy that accepts another measurement: refused, nothing printed on stdout.
    let out = client()
        .args(["--measurement", &"00".repeat(32)])
        .output()
        .unwrap();
    refused_attestation(&out, &mut lines, "is not accepted by policy");
    // And which flag would accept it.
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "(to accept that code: --measurement {measurement})"
        )),
        "{err}"
    );

    // A policy file as a flag replaces the config file's policy with what the file adds to it:
    // the file's allow_simulated, measurements and platform keys no longer widen it.
    let strict = dir.path().join("strict.toml");
    std::fs::write(
        &strict,
        format!("[attestation]\nmeasurements = [\"{measurement}\"]\n"),
    )
    .unwrap();
    let widening = dir.path().join("widening.toml");
    std::fs::write(
        &widening,
        format!(
            "[mbtls.client]\nserver_ca = \"{}\"\nallow_simulated = true\n\
             measurements = [\"{measurement}\"]\nsim_platform_keys = [\"{platform_key}\"]\n",
            server.ca.display()
        ),
    )
    .unwrap();
    let out = mbx()
        .arg("--config")
        .arg(&widening)
        .args([
            "mbtls",
            "client",
            "https://server.test/headers",
            "--middlebox",
        ])
        .arg(&addr)
        .args(["--middlebox-name", "mb.test", "--policy"])
        .arg(&strict)
        .output()
        .unwrap();
    refused_attestation(
        &out,
        &mut lines,
        "simulated attestation evidence is not allowed",
    );
    let err = String::from_utf8_lossy(&out.stderr);
    // Every flag it takes at once, their values to be read from the middlebox's banner.
    assert!(
        err.contains(
            "--allow-simulated, with --sim-platform-key and --measurement as the middlebox's \
             \"attestation:\" line shows them)"
        ),
        "{err}"
    );
    // The middlebox's key file given to the client, whose flag of that name takes the key.
    let out = client()
        .arg("--sim-platform-key")
        .arg(dir.path().join("strict.toml"))
        .output()
        .unwrap();
    let err = failure(&out);
    assert!(
        err.contains("is the platform's public key in hex") && err.contains("a file"),
        "{err}"
    );
    // A middlebox certificate from a CA the client does not take for middleboxes: the error
    // names the setting (twenty-seventh round; it said only "UnknownIssuer").
    let (_other_dir, _other_pki, other, _other_mbox) =
        pki_files("mbx cli other mb root", "mb.test");
    let out = client()
        .arg("--middlebox-ca")
        .arg(&other.ca)
        .output()
        .unwrap();
    let err = failure(&out);
    assert!(
        err.contains("(the middlebox's certificate does not chain to a CA of --middlebox-ca, which is --server-ca unless given)"),
        "{err}"
    );
    child.kill();
}

/// The spec's second binding mode from the command line: the middlebox makes a certificate
/// request carrying its evidence for its key and the CA's nonce, the CA signs it keeping its
/// extensions but deciding CA:FALSE itself (`openssl x509 -req -copy_extensions copy`), the
/// middlebox points every
/// session at that evidence, and a client whose policy takes the mode (and pins the nonce)
/// fetches through it; a client whose policy does not is refused with the setting to change.
#[test]
fn evidence_in_the_middleboxs_certificate_from_request_to_fetch() {
    let Setup {
        dir, server, nginx, ..
    } = Setup::new("mbx cli mbtls cert-bound root");
    let path = |name: &str| dir.path().join(name);
    let openssl =
        |args: &[&std::ffi::OsStr]| run_ok(std::process::Command::new("openssl").args(args));
    use std::ffi::OsStr;
    let os = |s: &'static str| OsStr::new(s);
    // The operator's CA for middleboxes, and the middlebox's key.
    openssl(&[
        os("req"),
        os("-x509"),
        os("-newkey"),
        os("ec"),
        os("-pkeyopt"),
        os("ec_paramgen_curve:P-256"),
        os("-nodes"),
        os("-subj"),
        os("/CN=mbx middlebox CA"),
        os("-days"),
        os("2"),
        os("-keyout"),
        path("ca.key").as_os_str(),
        os("-out"),
        path("ca.pem").as_os_str(),
    ]);
    // The request makes the middlebox's key (never brought from outside), and will not
    // overwrite one.
    std::fs::write(path("leaf.ext"), "basicConstraints=critical,CA:FALSE\n").unwrap();
    let middlebox_with_app = |app: &str, extra: &[&OsStr]| {
        let mut cmd = mbx();
        cmd.args(["mbtls", "middlebox", "--private-key"])
            .arg(path("mb.key"))
            .args(["--app", app, "--attester", "sim"])
            .arg("--sim-platform-key")
            .arg(path("platform.key"))
            .args(extra);
        cmd
    };
    let middlebox = |extra: &[&OsStr]| middlebox_with_app("http-header:X-Mbtls:cert-bound", extra);
    let nonce = "c0ffee";
    let request_named = |csr: &std::path::Path, nonce: &str, name: &str, extra: &[&OsStr]| {
        let mut args = vec![
            os("--certificate-request"),
            csr.as_os_str(),
            os("--nonce"),
            OsStr::new(nonce),
            os("--request-name"),
            OsStr::new(name),
        ];
        args.extend(extra);
        middlebox(&args).output().unwrap()
    };
    let request = |csr: &str, nonce: &str| request_named(&path(csr), nonce, "mb.test", &[]);
    // A request that fails (a nonce of the exporter's length, a name that is not a DNS name,
    // a request file that cannot be written) leaves no key behind to refuse the next one.
    let bad_nonce = "00".repeat(32);
    let err = failure(&request("bad.csr", &bad_nonce));
    assert!(err.contains("of 32 bytes"), "{err}");
    assert!(!path("mb.key").exists());
    let err = failure(&request_named(&path("bad.csr"), nonce, "bad name!", &[]));
    assert!(err.contains("\"bad name!\" is not a DNS name"), "{err}");
    assert!(!path("mb.key").exists());
    let unwritable = path("no such directory").join("mb.csr");
    let err = failure(&request_named(&unwritable, nonce, "mb.test", &[]));
    assert!(
        err.contains("cannot write") && err.contains("the new key is removed again"),
        "{err}"
    );
    assert!(!path("mb.key").exists());
    // The request is a new file: not the key's own path, not a file that exists (here the
    // platform key, which the sim attester made for the first try), and nothing is made.
    let platform_key = std::fs::read(path("platform.key")).unwrap();
    for (to, what) in [
        (path("mb.key"), "the key's path"),
        (path("platform.key"), "a file"),
    ] {
        let err = failure(&request_named(&to, nonce, "mb.test", &[]));
        assert!(err.contains("will not overwrite one"), "{what}: {err}");
        assert!(!path("mb.key").exists(), "{what}");
    }
    assert_eq!(std::fs::read(path("platform.key")).unwrap(), platform_key);
    // The flags of a running middlebox would be ignored: refused.
    let out = request_named(
        &path("bad.csr"),
        nonce,
        "mb.test",
        &[os("--listen"), os("127.0.0.1:0")],
    );
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cannot be used with"),
        "{out:?}"
    );
    assert!(!path("mb.key").exists() && !path("bad.csr").exists());
    let said = succeeded(&request("mb.csr", nonce));
    assert!(
        said.contains("certificate request for mb.test written to"),
        "{said}"
    );
    assert!(path("mb.key").exists());
    // The CA checks the request's evidence before signing (its own nonce only).
    let claimed = |word: &str| {
        let i = said.find(word).unwrap_or_else(|| panic!("{said}")) + word.len();
        said[i..].split_whitespace().next().unwrap().to_owned()
    };
    let (request_key, request_measurement) = (claimed("platform key "), claimed("measurement "));
    let check = |nonce: &str| {
        mbx()
            .args(["mbtls", "check-request"])
            .arg(path("mb.csr"))
            .args(["--nonce", nonce, "--allow-simulated"])
            .args(["--sim-platform-key", &request_key])
            .args([
                "--measurement",
                request_measurement.trim_end_matches([',', ';']),
            ])
            .output()
            .unwrap()
    };
    let verified = succeeded(&check(nonce));
    assert!(
        verified.starts_with("evidence verified: bound to the request's key and nonce c0ffee"),
        "{verified}"
    );
    let err = failure(&check("0bad"));
    assert!(
        err.contains("is bound to nonce c0ffee, not to --nonce 0bad"),
        "{err}"
    );
    let err = failure(&request("again.csr", nonce));
    assert!(err.contains("will not overwrite a file"), "{err}");
    openssl(&[
        os("x509"),
        os("-req"),
        os("-in"),
        path("mb.csr").as_os_str(),
        os("-CA"),
        path("ca.pem").as_os_str(),
        os("-CAkey"),
        path("ca.key").as_os_str(),
        os("-copy_extensions"),
        os("copy"),
        os("-extfile"),
        path("leaf.ext").as_os_str(),
        os("-days"),
        os("2"),
        os("-out"),
        path("mb.pem").as_os_str(),
    ]);
    let next_hop = nginx.addr().to_string();
    let running = |app: &str| {
        middlebox_with_app(
            app,
            &[
                os("--certificate"),
                path("mb.pem").as_os_str(),
                os("--evidence-in-certificate"),
                os("--listen"),
                os("127.0.0.1:0"),
                os("--next-hop"),
                OsStr::new(&next_hop),
            ],
        )
    };
    // The CA is shown the certificate instead of the request: named.
    let out = mbx()
        .args(["mbtls", "check-request"])
        .arg(path("mb.pem"))
        .args(["--nonce", nonce, "--allow-simulated"])
        .output()
        .unwrap();
    let err = failure(&out);
    assert!(
        err.contains("holds a certificate, not a certificate signing request"),
        "{err}"
    );
    // A middlebox that runs other code than its certificate's evidence claims (here another
    // app, which the simulated measurement covers) does not start.
    let err = failure(&running("passthrough").output().unwrap());
    assert!(
        err.contains("claims code measurement") && err.contains("runs other code"),
        "{err}"
    );
    let (_mb, mut lines, head) = start_command(&mut running("http-header:X-Mbtls:cert-bound"), 4);
    let addr = listening_addr(&head[0]);
    assert!(
        head[2].contains(&format!(
            "evidence in its certificate, bound to its key and nonce {nonce}"
        )),
        "{head:?}"
    );
    let word_after = |word: &str| {
        let line = &head[2];
        let i = line.find(word).unwrap_or_else(|| panic!("{line}")) + word.len();
        line[i..]
            .split_whitespace()
            .next()
            .unwrap()
            .trim_end_matches([')', ','])
            .to_owned()
    };
    let (measurement, platform_key) = (word_after("measurement "), word_after("platform key "));
    let policy = |extra: &str| {
        let file = path("policy.toml");
        std::fs::write(
            &file,
            format!(
                "[attestation]\nallow_simulated = true\nmeasurements = [\"{measurement}\"]\n\
                 sim_platform_keys = [\"{platform_key}\"]\n{extra}"
            ),
        )
        .unwrap();
        file
    };
    let fetch = |policy: &std::path::Path| {
        client_through(&addr, &server)
            .arg("--middlebox-ca")
            .arg(path("ca.pem"))
            .arg("--policy")
            .arg(policy)
            .output()
            .unwrap()
    };
    let out = fetch(&policy(&format!(
        "certificate_evidence = true\ncertificate_nonces = [\"{nonce}\"]\n"
    )));
    let text = succeeded(&out);
    assert!(text.contains("x-mbtls: cert-bound"), "{text}");
    // The verdict says where the evidence came from: weaker than evidence for each session.
    assert!(
        text.contains("; evidence from its certificate, made once for its key"),
        "{text}"
    );
    assert!(lines.next().unwrap().unwrap().contains("closed cleanly"));
    // The policy without the mode: refused, told which setting.
    let out = fetch(&policy(""));
    let err = failure(&out);
    assert!(err.contains("certificate_evidence = false"), "{err}");
    // The middlebox's report says why, in the endpoint's words.
    let report = lines.next().unwrap().unwrap();
    assert!(
        report.contains("refused by the endpoint: evidence refused: attestation: the middlebox's evidence is in its certificate"),
        "{report}"
    );
    // Without --middlebox-name the middlebox is named after the address (its certificate,
    // from the request, names mb.test only): the hint says so.
    let out = mbx()
        .args([
            "mbtls",
            "client",
            "https://server.test/headers",
            "--middlebox",
            &addr,
        ])
        .arg("--server-ca")
        .arg(&server.ca)
        .arg("--middlebox-ca")
        .arg(path("ca.pem"))
        .arg("--policy")
        .arg(policy("certificate_evidence = true\n"))
        .output()
        .unwrap();
    let err = failure(&out);
    assert!(
        err.contains("without --middlebox-name a middlebox is named after the host of --middlebox"),
        "{err}"
    );
    // Another nonce pinned: refused.
    let out = fetch(&policy(
        "certificate_evidence = true\ncertificate_nonces = [\"0bad\"]\n",
    ));
    let err = failure(&out);
    assert!(
        err.contains("is not in the policy's certificate_nonces"),
        "{err}"
    );
}

/// `--attester gramine` and `--attester tdx` against stand-ins for Gramine's `/dev/attestation`
/// and for a configfs-tsm report entry that answer every report_data with Intel's SGX and TDX
/// sample quotes (shipped in the `dcap-qvl` package): the middlebox starts (it quotes once to
/// check it can, and checks that quote as an endpoint would), names the quoted measurement, and
/// sends the quote with its collateral on every session; the client checks it with `dcap-qvl`
/// and refuses it (the sample is bound to another report_data, and its collateral's window is in
/// the past), and the middlebox receives no key material. Without collateral, or outside
/// Gramine or a TDX guest, the middlebox does not start.
#[test]
fn dcap_middleboxes_send_quotes_that_the_client_checks() {
    let setup = Setup::new("mbx cli mbtls dcap root");
    for tee in [Tee::Gramine, Tee::Tdx] {
        dcap_middlebox(&setup, tee);
    }
}

#[derive(Clone, Copy)]
enum Tee {
    Gramine,
    Tdx,
}

fn dcap_middlebox(setup: &Setup, tee: Tee) {
    use std::ffi::OsStr;
    let Setup {
        dir,
        server,
        mbox,
        nginx,
        ..
    } = setup;
    let samples = dcap_samples::sample_dir();
    let (name, sample, what, outside_error) = match tee {
        Tee::Gramine => (
            "gramine",
            "sgx_quote",
            "Intel SGX (DCAP) in Gramine",
            "not inside Gramine",
        ),
        Tee::Tdx => (
            "tdx",
            "tdx_quote",
            "Intel TDX (DCAP) through configfs-tsm",
            "not a TDX guest",
        ),
    };
    let quote = std::fs::read(samples.join(sample)).unwrap();
    let measurement = hex::encode(mbx_attest::quote_measurement_unverified(&quote).unwrap());
    let collateral = samples.join(format!("{sample}_collateral.json"));
    // The stand-in, and the flag that points the attester at it.
    let fake = dir.path().join(format!("{name}-stand-in"));
    std::fs::create_dir_all(&fake).unwrap();
    let place = match tee {
        Tee::Gramine => {
            std::fs::write(fake.join("attestation_type"), "dcap\n").unwrap();
            std::fs::write(fake.join("user_report_data"), []).unwrap();
            std::fs::write(fake.join("quote"), &quote).unwrap();
            "--gramine-attestation-dir"
        }
        Tee::Tdx => {
            std::fs::write(fake.join("provider"), "tdx_guest\n").unwrap();
            std::fs::write(fake.join("generation"), "1\n").unwrap();
            std::fs::write(fake.join("inblob"), []).unwrap();
            std::fs::write(fake.join("outblob"), &quote).unwrap();
            "--tsm-report-entry"
        }
    };
    let next_hop = nginx.addr().to_string();
    let args = |collateral: Option<&OsStr>, at: &std::path::Path| {
        let mut args: Vec<std::ffi::OsString> =
            service_args("middlebox", "127.0.0.1:0", ("--next-hop", &next_hop), mbox)
                .into_iter()
                .map(OsStr::to_os_string)
                .collect();
        args.extend(["--attester", name, place].map(Into::into));
        args.push(at.into());
        if let Some(c) = collateral {
            args.extend(["--dcap-collateral".into(), c.to_os_string()]);
        }
        args
    };
    // Without collateral, and outside the TEE: one clear error each, at start-up.
    let outside = dir.path().join("no-such-dir").join("entry");
    for (args, expected) in [
        (args(None, &fake), "needs the platform's collateral"),
        (args(Some(collateral.as_os_str()), &outside), outside_error),
    ] {
        let out = mbx().args(args).stdin(Stdio::null()).output().unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(expected), "{err}");
    }

    let running = args(Some(collateral.as_os_str()), &fake);
    let running: Vec<&OsStr> = running.iter().map(|a| a.as_os_str()).collect();
    let (mut child, mut lines, header) = start(&running, 4);
    let addr = listening_addr(&header[0]);
    // It checks its own quote as an endpoint would, and says the sample's collateral is past.
    assert!(
        header[2].contains(what)
            && header[2].contains(&format!("measurement {measurement}"))
            && header[2].contains("WARNING: the quote does not verify now")
            && header[2].contains("endpoints will refuse this middlebox"),
        "{header:?}"
    );
    let out = client_through(&addr, server)
        .args(["--measurement", &measurement])
        .output()
        .unwrap();
    refused_attestation(&out, &mut lines, "DCAP quote verification failed");
    child.kill();
}

/// `mbx mbtls client` fetching server.test's `/headers` through the middlebox mb.test at `addr`.
fn client_through(addr: &str, server: &PkiFiles) -> std::process::Command {
    let mut cmd = mbx();
    cmd.args([
        "mbtls",
        "client",
        "https://server.test/headers",
        "--middlebox",
        addr,
    ])
    .args(["--middlebox-name", "mb.test", "--server-ca"])
    .arg(&server.ca);
    cmd
}

/// The client's run `out` failed on its middlebox's attestation (`why` in its error, nothing on
/// stdout), and the middlebox's next report (`lines`) says it received no key material.
fn refused_attestation(out: &std::process::Output, lines: &mut TimedLines, why: &str) {
    assert_eq!(out.status.code(), Some(1));
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(why), "{err}");
    let report = lines.next().unwrap().unwrap();
    assert!(report.contains("no key material received"), "{report}");
    // The middlebox's operator reads why, in the client's words.
    let told = report
        .split_once("; refused by the endpoint: evidence refused: attestation: ")
        .map(|(_, t)| t);
    assert!(told.is_some_and(|t| t.contains(why)), "{report}");
}

/// `--session-tickets`: a legacy TLS 1.3 client resumes its session with the mbTLS server
/// process (one `s_client` saves the session, a second resumes it); without the flag the server
/// issues no tickets, so there is no session to save and nothing is resumed.
#[test]
fn the_mbtls_server_lets_tls13_clients_resume_when_asked_for_tickets() {
    use std::ffi::OsStr;
    let (dir, _pki, server, _mbox) = pki_files("mbx cli session tickets root", "mb2.test");
    let backend = echo_backend().to_string();
    for tickets in [true, false] {
        let mut args = mbtls_server_args("127.0.0.1:0", &backend, &server);
        args.extend([OsStr::new("--tls"), OsStr::new("1.3")]);
        if tickets {
            args.push(OsStr::new("--session-tickets"));
        }
        let (mut srv, mut lines, head) = start(&args, 1);
        let addr = listening_addr(&head[0]);
        let session = dir.path().join(format!("session-{tickets}.pem"));
        let fetch = |flag: &str| {
            mbx_testbed::OpensslClient::new(addr.parse().unwrap())
                .servername("server.test")
                .cafile(&server.ca)
                .version(mbx_testbed::TlsVersion::Tls13)
                .arg(flag)
                .arg(session.to_str().unwrap())
                .input(
                    &b"GET /again HTTP/1.1\r\nHost: server.test\r\nConnection: close\r\n\r\n"[..],
                )
                .run()
                .unwrap()
                .stdout_str()
                .to_string()
        };
        let first = fetch("-sess_out");
        assert!(first.contains("New, TLSv1.3"), "{first}");
        assert!(first.contains("GET /again"), "{first}");
        // A TLS 1.3 session is saved only from a ticket: without the flag there is none.
        assert_eq!(session.exists(), tickets, "{first}");
        // A reload that changes nothing of the server's TLS keeps its context, and with it the
        // ticket keys: the ticket still opens.
        signal(&mut srv, Signal::HUP);
        // After the rest of the start-up lines and the first session's report: a few lines,
        // read one by one (a search to the end would wait for the server's exit).
        let reloaded = (0..4).any(|_| {
            let line = lines.next().unwrap().unwrap();
            line.starts_with("server reloaded")
        });
        assert!(reloaded);
        let second = fetch("-sess_in");
        if tickets {
            assert!(second.contains("Reused, TLSv1.3"), "{second}");
            assert!(second.contains("GET /again"), "{second}");
        } else {
            assert!(!second.contains("Reused"), "{second}");
        }
        // The server's line for the resumed session says so. (Without tickets s_client has no
        // session to offer, and makes no second session.)
        if tickets {
            let report = (0..5)
                .map(|_| lines.next().unwrap().unwrap())
                .find(|l| l.starts_with("session 1 "))
                .unwrap();
            assert!(report.contains("TLS 1.3, session resumed;"), "{report}");
        }
    }
}

#[test]
fn mbtls_server_without_a_backend_is_one_clear_error() {
    // Exit status 2, as for a command line or a config file that does not parse (twenty-seventh
    // round: 1, while a misspelled table was 2).
    let out = mbx().args(["mbtls", "server"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("invalid mbTLS server configuration"), "{err}");
    // Which flag gives it, and no blank line after the error.
    assert!(
        err.contains("give `backend` in [mbtls.server] or as --backend"),
        "{err}"
    );
    assert!(!err.ends_with("\n\n"), "{err:?}");
    // An unknown key: serde's list of keys leaves the service keys out, the error adds them.
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("mbx.toml");
    // The server's error with a config file holding `line` in [mbtls.server]: exit status 2.
    let refused_with = |line: &str| {
        std::fs::write(&config, format!("[mbtls.server]\n{line}\n")).unwrap();
        let out = mbx()
            .arg("--config")
            .arg(&config)
            .args(["mbtls", "server"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2));
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = refused_with("idle_timeout = 5");
    assert!(
        err.contains("unknown field `idle_timeout`")
            && err.contains("the service keys handshake_timeout_secs, idle_timeout_secs"),
        "{err}"
    );
    // A value of the wrong type is found once the flags are merged in, away from the file's
    // parse: the error names the file all the same (found in an operator trial), for a role's
    // key and for a service key.
    let origin = format!("[mbtls.server] of {} and flags", config.display());
    for line in ["backend = 8080", "idle_timeout_secs = \"5\""] {
        let err = refused_with(line);
        assert!(
            err.contains(&origin) && err.contains("invalid type"),
            "{err}"
        );
    }
}

/// An address in use is said once: the I/O error is part of the driver's message, not also
/// its source (printed whole, the chain said it twice).
#[test]
fn a_listening_address_in_use_is_one_clear_error() {
    let (_dir, _pki, _server, mbox) = pki_files("mbx cli mbtls in use root", "mb.test");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let args = service_args("middlebox", &addr, ("--next-hop", "127.0.0.1:9"), &mbox);
    let out = mbx().args(args).output().unwrap();
    let err = failure(&out);
    assert_eq!(err.matches("Address already in use").count(), 1, "{err}");
    assert_eq!(err.matches("cannot listen").count(), 1, "{err}");
    assert!(
        err.contains(&format!("cannot listen on {addr}: bind: ")),
        "{err}"
    );
    // An address without its port says so (before: "invalid socket address").
    let args = service_args(
        "middlebox",
        "127.0.0.1",
        ("--next-hop", "127.0.0.1:9"),
        &mbox,
    );
    let err = failure(&mbx().args(args).output().unwrap());
    assert!(
        err.contains("cannot listen on 127.0.0.1: it has no port; give host:port"),
        "{err}"
    );
    // A metrics address in use fails the start before the banner: no "listening" line for a
    // service that is not running.
    let mut args = service_args(
        "middlebox",
        "127.0.0.1:0",
        ("--next-hop", "127.0.0.1:9"),
        &mbox,
    );
    args.extend(["--metrics-listen", addr.as_str()].map(std::ffi::OsStr::new));
    let out = mbx().args(args).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let said = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("cannot listen for metrics on {addr}")),
        "{err}"
    );
    assert!(!said.contains("listening"), "{said}");
}

/// A plain HTTP/1.1 backend on a thread: answers each request with its head as the body.
fn echo_backend() -> std::net::SocketAddr {
    backend_answering(|head| {
        let mut answer = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            head.len()
        )
        .into_bytes();
        answer.extend_from_slice(head);
        answer
    })
}

/// A plain HTTP/1.1 backend on a thread: answers each request with what `answer` makes of
/// its head, then closes.
fn backend_answering(answer: fn(&[u8]) -> Vec<u8>) -> std::net::SocketAddr {
    use std::io::Write;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut s) = conn else { return };
            std::thread::spawn(move || {
                if let Some(head) = read_head(&mut s) {
                    let _ = s.write_all(&answer(&head));
                }
            });
        }
    });
    addr
}

/// An HTTP request's head read from `s` (up to its blank line), or `None` if the connection
/// ended first.
fn read_head(s: &mut impl std::io::Read) -> Option<Vec<u8>> {
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => return None,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    Some(head)
}

/// Body bytes reach standard output as they come, a line end or not: the backend sends part
/// of the body and waits until the reader of the fetch's standard output has seen it (before
/// the twenty-seventh round it waited for a line end, in a user trial 8 s). Also `-o
/// /dev/null`, which cannot sync (EINVAL), succeeds.
#[test]
fn body_bytes_reach_standard_output_as_they_come() {
    use std::io::{Read, Write};
    let (_dir, _pki, server, _mbox) = pki_files("mbx cli mbtls streaming root", "mb.test");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let backend = listener.local_addr().unwrap().to_string();
    let (seen, rest) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        let mut rest = Some(rest);
        for conn in listener.incoming() {
            let Ok(mut s) = conn else { return };
            if read_head(&mut s).is_none() {
                return;
            }
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nab");
            // The first connection waits for the test to have read "ab"; later ones do not.
            if let Some(rest) = rest.take() {
                let _ = rest.recv();
            }
            let _ = s.write_all(b"cdefghij");
        }
    });
    let (_srv, _lines, head) = start(&mbtls_server_args("127.0.0.1:0", &backend, &server), 1);
    let addr = listening_addr(&head[0]);
    let mut fetch = direct_client(&server.ca, &addr, "https://server.test/")
        // Without the flush the fetch gives up after this and only then shows "ab".
        .args(["--timeout-secs", "10"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = fetch.stdout.take().unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !got.ends_with(b"body:\nab") {
        let n = stdout.read(&mut buf).unwrap();
        assert!(n > 0, "{}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    seen.send(()).unwrap();
    stdout.read_to_end(&mut got).unwrap();
    assert!(fetch.wait().unwrap().success());
    assert!(
        got.ends_with(b"body:\nabcdefghij"),
        "{}",
        String::from_utf8_lossy(&got)
    );

    succeeded(&fetch_directly(
        &server,
        &addr,
        "/",
        &["-o", "/dev/null"].map(std::ffi::OsStr::new),
    ));
}

/// The client prints what the server sent without letting it drive the terminal: header
/// fields with control characters escaped, and the body byte for byte when standard output is
/// not a terminal (binary bodies survive `> file`).
#[test]
fn the_client_prints_header_fields_escaped_and_the_body_as_it_came() {
    use std::ffi::OsStr;
    const BODY: &[u8] = b"\x00\x01\xff\xfe binary\x1b[2J\r\n";
    let (dir, _pki, server, _mbox) = pki_files("mbx cli mbtls response root", "mb.test");
    // `/big` gets a body of 8 KiB, `/cut` 5 bytes of the 100 its Content-Length says (the
    // backend's end cuts it), anything else `BODY`.
    let backend = backend_answering(|request| {
        let (body, length) = if request.starts_with(b"GET /big ") {
            (vec![b'x'; 8192], 8192)
        } else if request.starts_with(b"GET /cut ") {
            (b"short".to_vec(), 100)
        } else {
            (BODY.to_vec(), BODY.len())
        };
        let mut answer = format!(
            "HTTP/1.1 200 OK\r\nX-Evil: a\x1b[2Jb\r\nContent-Length: {length}\r\nConnection: close\r\n\r\n"
        )
        .into_bytes();
        answer.extend_from_slice(&body);
        answer
    })
    .to_string();
    // The client straight to `addr`, taken for the server; its stdout into `stdout`, if given,
    // under a limit of `blocks` × 512 bytes per file written, if given.
    let fetch_into =
        |addr: &str, path: &str, stdout: Option<std::fs::File>, blocks: Option<u64>| {
            // `trap`: past the limit a write fails with EFBIG instead of the process being killed.
            let limit = blocks.map_or(String::new(), |b| {
                format!("trap '' XFSZ && ulimit -f {b} && ")
            });
            let mut fetch = std::process::Command::new("sh");
            fetch
                .arg("-c")
                .arg(format!("{limit}exec \"$0\" \"$@\""))
                .arg(env!("CARGO_BIN_EXE_mbx"))
                .args(["mbtls", "client", &format!("https://server.test{path}")])
                .args(["--middlebox", addr, "--no-client-middleboxes"])
                .arg("--server-ca")
                .arg(&server.ca)
                .env_remove("MBX_CONFIG")
                .env_remove("MBX_LOG");
            if let Some(file) = stdout {
                fetch.stdout(file);
            }
            fetch.output().unwrap()
        };
    let fetch_from = |addr: &str, path: &str| fetch_into(addr, path, None, None);
    // The same, with more flags.
    let fetch_with =
        |addr: &str, path: &str, extra: &[&OsStr]| fetch_directly(&server, addr, path, extra);
    // The client straight to a server in front of `backend`.
    let fetch_through = |backend: &str, path: &str| {
        let (_srv, _lines, head) = start(&mbtls_server_args("127.0.0.1:0", backend, &server), 1);
        fetch_from(&listening_addr(&head[0]), path)
    };
    let out = fetch_through(&backend, "/bin");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("  X-Evil: a\\u{1b}[2Jb\n"), "{text}");
    let body_line = "body:\n";
    let at = text.find(body_line).unwrap();
    // The lossy text and the bytes agree up to the body line (all ASCII before it).
    let body = &out.stdout[at + body_line.len()..];
    assert_eq!(body, BODY);

    // A response that cannot be written whole (a full disk behind `> file`) fails the fetch
    // with one line saying so: here the file may grow only to within 512 bytes past the start
    // of an 8 KiB body.
    let (_srv, _lines, head) = start(&mbtls_server_args("127.0.0.1:0", &backend, &server), 1);
    let addr = listening_addr(&head[0]);
    let whole = fetch_from(&addr, "/big");
    let body_line = "body:\n";
    let body_at = String::from_utf8_lossy(&whole.stdout)
        .find(body_line)
        .unwrap()
        + body_line.len();
    let file = tempfile::tempfile().unwrap();
    let blocks = u64::try_from(body_at / 512 + 1).unwrap();
    let out = fetch_into(&addr, "/big", Some(file.try_clone().unwrap()), Some(blocks));
    let err = failure(&out);
    assert!(
        err.contains("cannot write the response to standard output: File too large")
            && !err.contains("panicked"),
        "{err}"
    );
    assert_eq!(file.metadata().unwrap().len(), blocks * 512, "{err}");
    // So does a report line before it (before the twenty-seventh round, through the panic
    // hook of a failed `println!`).
    let full = std::fs::File::options()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let out = mbx()
        .args(["mbtls", "client", "https://server.test/"])
        .args(["--allow-middlebox", "mb.test", "--server-ca"])
        .arg(&server.ca)
        .stdout(full)
        .output()
        .unwrap();
    let err = failure(&out);
    assert!(
        err.contains(
            "mbx: error: cannot write the response to standard output: No space left on device"
        ) && !err.contains("panicked"),
        "{err}"
    );
    // With --output the body goes to the file, whole, and only the report to stdout.
    let saved = dir.path().join("big.out");
    let out = fetch_with(&addr, "/big", &[OsStr::new("--output"), saved.as_os_str()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert_eq!(std::fs::read(&saved).unwrap(), vec![b'x'; 8192]);
    assert!(
        text.ends_with(&format!(
            "body: 8192 bytes written to {}\n",
            saved.display()
        )),
        "{text}"
    );
    // A reader of standard output that goes away (`| head -1`) leaves the download into the
    // file to go on to its end (before the twenty-seventh round: exit 0 at the first report
    // line, the file not even created).
    std::fs::remove_file(&saved).unwrap();
    let client_to = |url: &str, ca: &std::path::Path| direct_client(ca, &addr, url);
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = client_to("https://server.test/big", &server.ca)
        .arg("--output")
        .arg(&saved)
        .stdout(writer)
        .output()
        .unwrap();
    succeeded(&out);
    assert_eq!(std::fs::read(&saved).unwrap(), vec![b'x'; 8192]);
    // A file-size limit stops the download into the file with exit 1 and a line that says
    // the file is incomplete (before the twenty-seventh round SIGXFSZ killed the process
    // without a word).
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg("ulimit -f 4 && exec \"$0\" \"$@\"")
        .arg(env!("CARGO_BIN_EXE_mbx"))
        .args(["mbtls", "client", "https://server.test/big"])
        .args([
            "--middlebox",
            &addr,
            "--no-client-middleboxes",
            "--server-ca",
        ])
        .arg(&server.ca)
        .arg("--output")
        .arg(dir.path().join("limited.out"))
        .env_remove("MBX_CONFIG")
        .env_remove("MBX_LOG")
        .output()
        .unwrap();
    let err = failure(&out);
    assert!(
        err.contains("File too large") && err.contains("is incomplete"),
        "{err}"
    );
    // A fetch that fails before its body leaves the file as it was (created only when the
    // body begins, as curl does).
    let refusing = mbx_testbed::refusing_addr();
    let down = refusing.addr().to_string();
    let out = fetch_with(&down, "/big", &[OsStr::new("--output"), saved.as_os_str()]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(std::fs::read(&saved).unwrap(), vec![b'x'; 8192]);
    // A server certificate from another CA, or for another name: the error says which
    // certificate and which setting (twenty-seventh round; it named neither).
    let (_other_dir, _other_pki, other, _other_mbox) = pki_files("mbx cli other root", "mb.test");
    let wrong_ca = client_to("https://server.test/", &other.ca)
        .output()
        .unwrap();
    let err = failure(&wrong_ca);
    assert!(
        err.contains("(the server's certificate does not chain to a CA of --server-ca)"),
        "{err}"
    );
    let wrong_name = client_to("https://elsewhere.test/", &server.ca)
        .output()
        .unwrap();
    let err = failure(&wrong_name);
    assert!(
        err.contains("(the server's certificate is not for the URL's host name)"),
        "{err}"
    );
    // A server that takes TLS 1.3 only and a client that offers TLS 1.2 only: the error says
    // where the version is set.
    let mut only13 = mbtls_server_args("127.0.0.1:0", &backend, &server);
    only13.extend(["--tls", "1.3"].map(OsStr::new));
    let (_srv13, _lines13, head13) = start(&only13, 1);
    let out = fetch_with(
        &listening_addr(&head13[0]),
        "/old",
        &["--tls", "1.2"].map(OsStr::new),
    );
    let err = failure(&out);
    assert!(
        err.contains("protocol_version") && err.contains("the two ends share no TLS version"),
        "{err}"
    );

    // A body its backend cut short of its Content-Length: written as far as it came, then an
    // error that says so, exit status 1 (before the twenty-sixth round: exit 0, as if whole).
    let out = fetch_through(&backend, "/cut");
    let (text, err) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(1), "{text}{err}");
    assert!(text.ends_with("body:\nshort"), "{text}");
    assert!(
        err.contains("the response body was cut: 5 of its 100 bytes"),
        "{err}"
    );

    // A backend that answers with a length and keeps the connection open (it ignores
    // `Connection: close`): the fetch ends once the body is whole, with success (before the
    // twenty-sixth round it waited for the close, then failed after --timeout-secs).
    let holding = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let holding_addr = holding.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        use std::io::{Read, Write};
        for mut conn in holding.incoming().flatten() {
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                let _ = conn.read(&mut buf);
                let _ = conn.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello");
                // Open until the other side closes.
                while matches!(conn.read(&mut buf), Ok(n) if n > 0) {}
            });
        }
    });
    let text = succeeded(&fetch_through(&holding_addr, "/keepopen"));
    assert!(text.ends_with("body:\nhello"), "{text}");

    // A server whose backend is down answers as a reverse proxy does: 502, then close_notify.
    let refusing = mbx_testbed::refusing_addr();
    let down = refusing.addr().to_string();
    let out = fetch_through(&down, "/down");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("status: HTTP/1.1 502 Bad Gateway"), "{text}");
    assert!(text.contains("the backend cannot be reached"), "{text}");

    // A first hop that closes during the handshake (a middlebox whose server is down does
    // so): the same hint.
    let closing = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = closing.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        use std::io::Read;
        for mut conn in closing.incoming().flatten() {
            // The ClientHello read, then the end of stream (a FIN, not a reset).
            let mut buf = [0u8; 4096];
            let _ = conn.read(&mut buf);
            let _ = conn.shutdown(std::net::Shutdown::Write);
            while matches!(conn.read(&mut buf), Ok(n) if n > 0) {}
        }
    });
    let out = fetch_from(&addr, "/");
    let err = failure(&out);
    assert!(
        err.contains("during the handshake")
            && err.contains("a middlebox or the server ended the session"),
        "{err}"
    );
}

/// `mbx mbtls client https://server.test{path}` straight to `addr`, taken for the server (no
/// client-side middleboxes), trusting `server`'s CA, with `extra` flags.
fn fetch_directly(
    server: &PkiFiles,
    addr: &str,
    path: &str,
    extra: &[&std::ffi::OsStr],
) -> std::process::Output {
    direct_client(&server.ca, addr, &format!("https://server.test{path}"))
        .args(extra)
        .output()
        .unwrap()
}

/// The client straight to the server at `addr` (no middlebox of its own), fetching `url`,
/// trusting `ca` for the server.
/// A fetch whose first hop accepts and then never answers gives up after `--timeout-secs` and
/// says what its handshake waited for (thirty-fourth round; before, only "something on the
/// path stopped answering").
#[test]
fn a_fetch_that_times_out_says_what_its_handshake_waited_for() {
    let (_dir, _pki, server, _mbox) = pki_files("mbx cli mbtls waiting root", "mb.test");
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = silent.local_addr().unwrap().to_string();
    let out = direct_client(&server.ca, &addr, "https://server.test/")
        .args(["--timeout-secs", "1"])
        .output()
        .unwrap();
    let err = failure(&out);
    assert!(
        err.contains("was not set up within 1 s (it was waiting for the server's handshake;"),
        "{err}"
    );
    drop(silent);
}

fn direct_client(ca: &std::path::Path, addr: &str, url: &str) -> std::process::Command {
    let mut client = mbx();
    client
        .args(["mbtls", "client", url])
        .args([
            "--middlebox",
            addr,
            "--no-client-middleboxes",
            "--server-ca",
        ])
        .arg(ca);
    client
}

/// A plain HTTP backend that answers every request with a head, then `pieces` pieces of 1,000
/// bytes each after a pause of `pause`, then closes (`None`: sends the head alone and holds the
/// connection until the other side closes).
fn paced_backend(pieces: Option<(usize, std::time::Duration)>) -> std::net::SocketAddr {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut s) = conn else { return };
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf);
                let _ = s.write_all(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n");
                let Some((pieces, pause)) = pieces else {
                    while matches!(s.read(&mut buf), Ok(n) if n > 0) {}
                    return;
                };
                for _ in 0..pieces {
                    std::thread::sleep(pause);
                    if s.write_all(&[b'p'; 1000]).is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// `--timeout-secs` bounds the handshake and each pause of the response, not the whole fetch:
/// a response that keeps coming in pieces 1 s apart arrives whole although it takes longer
/// than the bound (4 s), and one that stops for longer than the bound fails the fetch, saying
/// which flag to raise (found in a user trial: a download still moving failed at the bound,
/// and the body was held whole in memory until then). Only the outcome is checked; the moving
/// response's pauses leave 3 s of margin, the stalled one never resumes.
#[test]
fn a_fetch_goes_on_while_the_response_moves_and_ends_when_it_stops() {
    let (_dir, _pki, server, _mbox) = pki_files("mbx cli mbtls paced root", "mb.test");
    let fetch = |backend: std::net::SocketAddr| {
        let backend = backend.to_string();
        let (_srv, _lines, head) = start(&mbtls_server_args("127.0.0.1:0", &backend, &server), 1);
        let extra = ["--timeout-secs", "4"].map(std::ffi::OsStr::new);
        fetch_directly(&server, &listening_addr(&head[0]), "/paced", &extra)
    };
    let moving = fetch(paced_backend(Some((6, std::time::Duration::from_secs(1)))));
    let text = succeeded(&moving);
    assert!(
        text.ends_with(&format!("body:\n{}", "p".repeat(6000))),
        "{text}"
    );

    // Nothing more comes, whatever the machine's load: only the client's bound ends it.
    let stalled = fetch(paced_backend(None));
    let err = failure(&stalled);
    assert!(
        err.contains("the response stopped: nothing came for 4 s (raise --timeout-secs)"),
        "{err}"
    );
}

/// `mbx mbtls server` listening on `listen` in front of `backend`, with the certificate and key
/// of `server`; more flags are appended by the caller.
fn mbtls_server_args<'a>(
    listen: &'a str,
    backend: &'a str,
    server: &'a PkiFiles,
) -> Vec<&'a std::ffi::OsStr> {
    service_args("server", listen, ("--backend", backend), server)
}

/// `mbx mbtls <role> --listen <listen> <next flag> <next> --certificate … --private-key …`:
/// a service of the TLS path with `files`' certificate and key.
fn service_args<'a>(
    role: &'a str,
    listen: &'a str,
    (next_flag, next): (&'a str, &'a str),
    files: &'a PkiFiles,
) -> Vec<&'a std::ffi::OsStr> {
    use std::ffi::OsStr;
    vec![
        OsStr::new("mbtls"),
        OsStr::new(role),
        OsStr::new("--listen"),
        OsStr::new(listen),
        OsStr::new(next_flag),
        OsStr::new(next),
        OsStr::new("--certificate"),
        files.chain.as_os_str(),
        OsStr::new("--private-key"),
        files.key.as_os_str(),
    ]
}

/// Starts `mbx` with `args`, returns the process and its stdout lines after reading `n` of them.
fn start(args: &[&std::ffi::OsStr], n: usize) -> (ChildGuard, TimedLines, Vec<String>) {
    start_command(mbx().args(args), n)
}

/// [`start`], with the process's standard error read too (where refused reloads are said).
fn start_with_errors(
    args: &[&std::ffi::OsStr],
    n: usize,
) -> (ChildGuard, TimedLines, TimedLines, Vec<String>) {
    let mut cmd = mbx();
    let (child, lines, errors, head) = spawn_reading(cmd.args(args), n, true);
    (child, lines, errors.unwrap(), head)
}

/// [`start`] for a prepared command (in a namespace, through a shell, with more arguments).
fn start_command(
    cmd: &mut std::process::Command,
    n: usize,
) -> (ChildGuard, TimedLines, Vec<String>) {
    let (child, lines, _, head) = spawn_reading(cmd, n, false);
    (child, lines, head)
}

/// Spawns `cmd` with its stdout read line by line (and its stderr if `errors`, else dropped)
/// and returns its first `n` lines.
fn spawn_reading(
    cmd: &mut std::process::Command,
    n: usize,
    errors: bool,
) -> (ChildGuard, TimedLines, Option<TimedLines>, Vec<String>) {
    let stderr = if errors {
        Stdio::piped()
    } else {
        Stdio::null()
    };
    let child = cmd.stdout(Stdio::piped()).stderr(stderr).spawn().unwrap();
    let mut child = ChildGuard::new(child);
    let process = child.child_mut().unwrap();
    let mut lines = TimedLines::new(process.stdout.take().unwrap());
    let errors = process.stderr.take().map(TimedLines::new);
    let head = (0..n).map(|_| lines.next().unwrap().unwrap()).collect();
    (child, lines, errors, head)
}

/// Sends `sig` to a child process (SIGHUP: reload; SIGTERM: drain and stop).
fn signal(child: &mut ChildGuard, sig: Signal) {
    common::signal(child.child_mut().unwrap().id(), sig);
}

fn listening_addr(line: &str) -> String {
    line.split("listening on ")
        .nth(1)
        .and_then(|r| r.split(',').next())
        .unwrap_or_else(|| panic!("{line}"))
        .to_owned()
}

#[test]
fn curl_through_server_side_middlebox_and_mbtls_server_processes() {
    use std::ffi::OsStr;
    let (dir, _pki, server, mbox) = pki_files("mbx cli mbtls server root", "mb2.test");
    let backend = echo_backend().to_string();
    let platform = dir.path().join("platform.key");

    // The middlebox first (its banner gives the attestation facts the server's policy needs);
    // its next hop is the server's port, chosen now.
    let server_port = mbx_testbed::peers::free_port().unwrap();
    let server_addr = format!("127.0.0.1:{server_port}");
    let platform_path = platform.to_str().unwrap();
    let (_mb, mut mb_lines, mb_head) = start_middlebox(
        &server_addr,
        &mbox,
        &[
            "--server-side",
            "--app",
            "http-header:X-Mbtls:mb2.test",
            "--attester",
            "sim",
            "--sim-platform-key",
            platform_path,
            "--handshake-timeout-secs",
            "2",
            // Longer than the handshake timeout, so a silent peer is closed by that one.
            "--idle-timeout-secs",
            "4",
        ],
        4,
    );
    assert!(
        mb_head[0].ends_with("server side, certificate for mb2.test"),
        "{mb_head:?}"
    );
    assert!(
        mb_head[3].starts_with("limits: handshake 2s, idle 4s, at most "),
        "{mb_head:?}"
    );
    let mb_addr = listening_addr(&mb_head[0]);
    let word_after = |word: &str| {
        let line = &mb_head[2];
        let i = line.find(word).unwrap_or_else(|| panic!("{line}")) + word.len();
        line[i..].split_whitespace().next().unwrap().to_owned()
    };
    let platform_key = word_after("platform key ");
    let measurement = word_after("measurement ");

    let mut server_args = mbtls_server_args(&server_addr, &backend, &server);
    server_args.extend([
        OsStr::new("--middlebox-name"),
        OsStr::new("mb2.test"),
        OsStr::new("--middlebox-ca"),
        server.ca.as_os_str(),
        OsStr::new("--allow-simulated"),
        OsStr::new("--measurement"),
        OsStr::new(&measurement),
        OsStr::new("--sim-platform-key"),
        OsStr::new(&platform_key),
        // Longer than the middlebox's: it closes its connection to us first.
        OsStr::new("--handshake-timeout-secs"),
        OsStr::new("6"),
        OsStr::new("--max-connections"),
        OsStr::new("8"),
    ]);
    let (mut srv, mut srv_lines, srv_head) = start(&server_args, 3);
    assert_eq!(listening_addr(&srv_head[0]), server_addr, "{srv_head:?}");
    assert!(
        srv_head[1].contains("pre-configured mb2.test"),
        "{srv_head:?}"
    );
    assert_eq!(
        srv_head[2], "limits: handshake 6s, idle 600s, at most 8 sessions at once",
        "{srv_head:?}"
    );

    let port: u16 = mb_addr.rsplit(':').next().unwrap().parse().unwrap();
    // The server resumes its secondary session with the middlebox from the first session on
    // (docs/mbtls.md §4.7): the second reports the first one's claims, and no new evidence.
    // A reload that changes nothing of the server's TLS toward its middlebox keeps the
    // sessions it resumes.
    for (version, resumed, reload_first) in [
        (mbx_testbed::TlsVersion::Tls12, false, false),
        (mbx_testbed::TlsVersion::Tls13, true, false),
        (mbx_testbed::TlsVersion::Tls13, true, true),
    ] {
        if reload_first {
            signal(&mut srv, Signal::HUP);
            let line = srv_lines.next().unwrap().unwrap();
            // Each part as it is, none marked: nothing changed.
            assert!(
                line.starts_with("server reloaded")
                    && line.contains(
                        "; certificate for server.test; server-side middlebox: pre-configured \
                         mb2.test (required); attestation policy: evidence required"
                    )
                    && !line.contains("(changed"),
                "{line}"
            );
        }
        let out = mbx_testbed::Curl::new(&format!("https://server.test:{port}/via-mb2"))
            .cacert(&server.ca)
            .resolve("server.test", port, "127.0.0.1".parse().unwrap())
            .version(version)
            .run()
            .unwrap();
        assert_eq!(out.exit_code, Some(0), "{}", out.verbose);
        let body = out.body_str();
        assert!(body.contains("X-Mbtls: mb2.test"), "{body}");
        let mb_report = mb_lines.next().unwrap().unwrap();
        assert!(mb_report.contains("joined, TLS 1."), "{mb_report}");
        assert_eq!(
            mb_report.contains("(secondary session resumed: no new evidence)"),
            resumed,
            "{mb_report}"
        );
        assert!(
            mb_report.contains(" bytes from the client, "),
            "{mb_report}"
        );
        let srv_report = srv_lines.next().unwrap().unwrap();
        let verdict = format!("middlebox mb2.test verified (sim TEE, measurement {measurement}");
        let (_, after) = srv_report
            .split_once(&verdict)
            .unwrap_or_else(|| panic!("{srv_report}"));
        let resumed_tail = after
            .strip_prefix("; resumed: evidence checked ")
            .and_then(|t| t.split_once(" s ago, on an earlier session)"))
            .is_some_and(|(age, _)| age.parse::<u64>().is_ok());
        assert_eq!(resumed_tail, resumed, "{srv_report}");
        assert_eq!(after.starts_with(')'), !resumed, "{srv_report}");
        assert!(srv_report.contains("closed cleanly"), "{srv_report}");
    }
    // An mbTLS client without client-side middleboxes: its session stays in OpenSSL, and the
    // server-side middlebox still joins and inserts its header.
    for tls in ["1.2", "1.3"] {
        let out = mbx()
            .args(["mbtls", "client", "https://server.test/direct"])
            .args([
                "--middlebox",
                &mb_addr,
                "--no-client-middleboxes",
                "--tls",
                tls,
            ])
            .arg("--server-ca")
            .arg(&server.ca)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{text}{err}");
        for expected in [
            "no client-side middleboxes: the session's keys stay inside OpenSSL",
            &format!("path: client -> server.test (first hop {mb_addr})"),
            "hop 1: client <-> server.test (primary session keys, also held by any middlebox on the server's side): no fingerprint",
            // The server-side middlebox joined: the client can only speak for its side.
            "attestation: no client-side middlebox took part",
            "GET /direct HTTP/1.1",
            "X-Mbtls: mb2.test",
        ] {
            assert!(
                text.contains(expected),
                "{tls}: missing {expected:?} in:\n{text}"
            );
        }
        let mb_report = mb_lines.next().unwrap().unwrap();
        assert!(mb_report.contains("joined, TLS 1."), "{mb_report}");
        let srv_report = srv_lines.next().unwrap().unwrap();
        assert!(srv_report.contains("closed cleanly"), "{srv_report}");
    }
    // It takes no middlebox names or allow-list alongside.
    let out = mbx()
        .args(["mbtls", "client", "https://server.test/"])
        .args(["--no-client-middleboxes", "--allow-middlebox", "mb.test"])
        .arg("--server-ca")
        .arg(&server.ca)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no_client_middleboxes excludes"));

    // A client that takes the server-side middlebox for one of its own: the error names it and
    // says where it belongs, as does the server's report (found in a user trial: "protocol
    // violation: a pre-configured middlebox did not join").
    let out = mbx()
        .args(["mbtls", "client", "https://server.test/wrong-side"])
        .args(["--middlebox", &mb_addr, "--middlebox-name", "mb2.test"])
        .arg("--middlebox-ca")
        .arg(&server.ca)
        .arg("--server-ca")
        .arg(&server.ca)
        .output()
        .unwrap();
    let err = failure(&out);
    assert!(
        err.contains("middlebox mb2.test: a pre-configured middlebox did not join")
            && err.contains("started without --server-side"),
        "{err}"
    );
    let mb_report = mb_lines.next().unwrap().unwrap();
    assert!(!mb_report.contains("keys installed"), "{mb_report}");
    let srv_report = srv_lines.next().unwrap().unwrap();
    assert!(srv_report.contains("ended with error"), "{srv_report}");
    // A legacy client straight to the server: curl reads the server's alert, and the server's
    // report names the middlebox it misses and where clients must come from.
    let out = mbx_testbed::Curl::new(&format!("https://server.test:{server_port}/bypass"))
        .cacert(&server.ca)
        .resolve("server.test", server_port, "127.0.0.1".parse().unwrap())
        .run()
        .unwrap();
    assert!(
        out.verbose.contains("alert handshake failure"),
        "{}",
        out.verbose
    );
    let srv_report = srv_lines.next().unwrap().unwrap();
    assert!(
        srv_report.contains("middlebox mb2.test: a pre-configured middlebox did not join")
            && srv_report.contains("(clients must reach this server through its middleboxes"),
        "{srv_report}"
    );
    // The mbTLS client straight to it: the alert and what it means from an mbTLS server
    // (twenty-sixth round, found in a user trial: nothing said the server had refused; with
    // TLS 1.3 the client's handshake looks done by then, with TLS 1.2 it is not).
    for tls in ["1.3", "1.2"] {
        let straight = format!("127.0.0.1:{server_port}");
        let out = fetch_directly(
            &server,
            &straight,
            "/bypass",
            &["--tls", tls].map(OsStr::new),
        );
        let err = failure(&out);
        assert!(
            err.contains("handshake_failure(40)")
                && err.contains("it refused or missed one of its own (server-side) middleboxes"),
            "{tls}: {err}"
        );
        let srv_report = srv_lines.next().unwrap().unwrap();
        assert!(srv_report.contains("did not join"), "{tls}: {srv_report}");
    }

    // A peer that connects and sends nothing is closed after --handshake-timeout-secs by the
    // middlebox (which closes its connection to the server too) and by the server.
    let silent_peer_is_closed = |addr: &str| {
        use std::io::Read;
        let mut peer = std::net::TcpStream::connect(addr).unwrap();
        peer.set_read_timeout(Some(std::time::Duration::from_secs(60)))
            .unwrap();
        let mut buf = [0u8; 64];
        assert!(matches!(peer.read(&mut buf), Ok(0) | Err(_)), "{addr}");
    };
    silent_peer_is_closed(&mb_addr);
    let mb_report = mb_lines.next().unwrap().unwrap();
    assert!(
        mb_report.contains("did not finish within 2s; it was waiting for the client's ClientHello"),
        "{mb_report}"
    );
    // The server first reports the middlebox's connection, which ended without a byte.
    let srv_report = srv_lines.next().unwrap().unwrap();
    assert!(srv_report.contains("ended with error"), "{srv_report}");
    // Not "no middlebox": whether one would have joined is unknown.
    assert!(
        srv_report.contains(": handshake not finished;") && !srv_report.contains("no middlebox"),
        "{srv_report}"
    );
    silent_peer_is_closed(&server_addr);
    let srv_report = srv_lines.next().unwrap().unwrap();
    assert!(
        srv_report.contains("did not finish within 6s; it was waiting for the client's handshake"),
        "{srv_report}"
    );

    // An established session left idle is closed by the middlebox after --idle-timeout-secs:
    // s_client, its input ended at once (-ign_eof), waits until the session ends.
    let out = mbx_testbed::OpensslClient::new(mb_addr.parse().unwrap())
        .servername("server.test")
        .cafile(&server.ca)
        .version(mbx_testbed::TlsVersion::Tls13)
        .run()
        .unwrap();
    let text = out.stdout_str();
    assert!(text.contains("Verify return code: 0 (ok)"), "{text}");
    let mb_report = mb_lines.next().unwrap().unwrap();
    assert!(mb_report.contains("idle for 4s"), "{mb_report}");
    let srv_report = srv_lines.next().unwrap().unwrap();
    assert!(srv_report.contains("without close_notify"), "{srv_report}");

    // SIGTERM: each drains (nothing is open, so nothing is cut) and exits cleanly.
    for (mut child, lines, who, what) in [
        (_mb, mb_lines, "middlebox", "connections"),
        (srv, srv_lines, "server", "sessions"),
    ] {
        signal(&mut child, Signal::TERM);
        let rest: Vec<String> = lines.map(Result::unwrap).collect();
        let stopping = format!("{who} stopping: no new {what}");
        assert!(
            rest.first().is_some_and(|l| l.starts_with(&stopping)),
            "{rest:?}"
        );
        let stopped = format!("{who} stopped (0 {what} cut)");
        assert_eq!(rest.last(), Some(&stopped), "{rest:?}");
        let status = child.wait_timeout(std::time::Duration::from_secs(60));
        assert!(status.is_some_and(|s| s.success()), "{who}: {status:?}");
    }
}

/// A second stop signal cuts what the drain still waits for at once, and the cut connection's
/// report and the "stopped" line still come (twenty-sixth round: before, the process left at
/// the second signal without them, though the client's error pointed at those lines). So does
/// the end of the drain time, with a line of its own before the reports (thirtieth round:
/// before, nothing said the drain was over). In JSON lines the same lines are `stop` events
/// with their phase, counts and cause.
#[test]
fn a_second_stop_signal_cuts_the_open_connections_and_reports_them() {
    for json in [false, true] {
        stop_with_a_connection_open(json, false);
    }
}

#[test]
fn the_end_of_the_drain_time_cuts_the_open_connections_and_says_so() {
    for json in [false, true] {
        stop_with_a_connection_open(json, true);
    }
}

/// A middlebox with one connection open is stopped: cut by a second signal, or (`by_time`) at
/// the end of a 1 s drain.
fn stop_with_a_connection_open(json: bool, by_time: bool) {
    use serde_json::{json, Value};
    let (_dir, _pki, _server, mbox) = pki_files("mbx cli second signal root", "mb.test");
    // A next hop that takes the connection and never answers.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let next_hop = listener.local_addr().unwrap().to_string();
    let grace = if by_time { 1 } else { 3600 };
    let grace_arg = grace.to_string();
    let mut extra = vec!["--drain-secs", grace_arg.as_str()];
    if json {
        extra.extend(["--report-format", "json"]);
    }
    let (mut mb, lines, head) = start_middlebox(&next_hop, &mbox, &extra, 4);
    // Each line's text, and in JSON its object.
    let read = move |line: String| -> (String, Value) {
        if !json {
            return (line, Value::Null);
        }
        let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
        (v["text"].as_str().unwrap_or_default().to_owned(), v)
    };
    let stop_fields = |v: &Value| {
        ["phase", "grace_secs", "open", "cut", "cause"].map(|k| v.get(k).cloned().unwrap())
    };
    let mut lines = lines.map(move |l| read(l.unwrap()));
    let (banner, _) = read(head[0].clone());
    // A client that connects and says nothing: open until its handshake timeout (60 s).
    let _client = std::net::TcpStream::connect(listening_addr(&banner)).unwrap();
    // The middlebox has taken it once it connects to its next hop: only then is a
    // connection open when the signal comes.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(listener.accept());
    });
    let _held = rx
        .recv_timeout(std::time::Duration::from_secs(60))
        .unwrap()
        .unwrap();
    signal(&mut mb, Signal::TERM);
    let (stopping, v) = lines.next().unwrap();
    assert!(
        stopping.starts_with("middlebox stopping: no new connections"),
        "{stopping}"
    );
    let null = Value::Null;
    if json {
        let draining = [
            json!("draining"),
            json!(grace),
            json!(1),
            null.clone(),
            null.clone(),
        ];
        assert_eq!(stop_fields(&v), draining, "{v}");
    }
    if !by_time {
        // A reload while stopping is taken, and says that no new connection comes.
        signal(&mut mb, Signal::HUP);
        let (reloaded, _) = lines.next().unwrap();
        assert!(
            reloaded.starts_with(
                "middlebox reloaded: it is stopping, though: no new connections come; limits: \
                 handshake 60s, idle 600s, at most"
            ),
            "{reloaded}"
        );
        signal(&mut mb, Signal::TERM);
    }
    let rest: Vec<(String, Value)> = lines.collect();
    let texts: Vec<&str> = rest.iter().map(|(t, _)| t.as_str()).collect();
    let (cutting, cause) = if by_time {
        (
            "middlebox stopping now: the drain time is over, the open connections are cut",
            "drain_time_over",
        )
    } else {
        (
            "middlebox stopping now: the open connections are cut",
            "signal",
        )
    };
    assert_eq!(texts.first().copied(), Some(cutting), "{texts:?}");
    assert!(
        texts.iter().any(|l| l.contains("cut: the service stopped")),
        "{texts:?}"
    );
    assert_eq!(
        texts.last().copied(),
        Some("middlebox stopped (1 connection cut)"),
        "{texts:?}"
    );
    if json {
        let (first, last) = (&rest[0].1, &rest[rest.len() - 1].1);
        let cutting = [
            json!("cutting"),
            null.clone(),
            json!(1),
            null.clone(),
            json!(cause),
        ];
        assert_eq!(stop_fields(first), cutting, "{first}");
        let stopped = [json!("stopped"), null.clone(), null.clone(), json!(1), null];
        assert_eq!(stop_fields(last), stopped, "{last}");
        // The cut connection's report: never past its handshake.
        let cut = rest
            .iter()
            .map(|(_, v)| v)
            .find(|v| v["event"] == "session");
        assert!(
            cut.is_some_and(|v| v["ok"] == false && v["handshake_ms"].is_null()),
            "{rest:?}"
        );
        let cut = cut.unwrap();
        assert_eq!(
            (&cut["cut_at_stop"], &cut["error_kind"]),
            (&json!(true), &json!("cut_at_stop")),
            "{cut}"
        );
    }
    let status = mb.wait_timeout(std::time::Duration::from_secs(60));
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
}

#[test]
fn client_through_two_middleboxes_and_through_a_discovered_one() {
    let dir = tempfile::tempdir().unwrap();
    let pki = TestPki::new("mbx cli mbtls path root").unwrap();
    let server = pki
        .issue(&LeafSpec::server("server.test"))
        .unwrap()
        .write_to_named(dir.path(), "server")
        .unwrap();
    let nginx = Nginx::from_files(&server)
        .log_header("X-Mb0")
        .log_header("X-Mb1")
        .start()
        .unwrap();
    // Both middleboxes were verified (each named once) and both apps ran on the request for
    // `path`.
    let both_verified_and_both_apps_ran = |text: &str, path: &str| {
        let at = ["mb0.test", "mb1.test"].map(|mb| {
            let verified = format!("attestation: {mb} verified (sim TEE");
            assert_eq!(text.matches(&verified).count(), 1, "{text}");
            text.find(&verified)
        });
        // In path order, whatever the order in which they were checked.
        let path_line = text.lines().find(|l| l.starts_with("path: ")).unwrap();
        let on_path = ["mb0.test", "mb1.test"].map(|mb| path_line.find(mb));
        assert_eq!(at[0] < at[1], on_path[0] < on_path[1], "{text}");
        nginx
            .wait_access_log(|l| logged(l, path, &["x-mb0=\"mb0.test\"", "x-mb1=\"mb1.test\""]))
            .unwrap();
    };
    let platform = dir.path().join("platform.key");
    let start_mb = |name: &str, header: &str, next_hop: &str| {
        let files = pki
            .issue(&LeafSpec::middlebox(name))
            .unwrap()
            .write_to_named(dir.path(), name)
            .unwrap();
        let app = format!("http-header:{header}:{name}");
        let platform = platform.to_str().unwrap();
        let sim = [
            "--app",
            &app,
            "--attester",
            "sim",
            "--sim-platform-key",
            platform,
        ];
        let (guard, _lines, head) = start_middlebox(next_hop, &files, &sim, 4);
        let line = head[2].clone();
        let after = |word: &str| {
            let i = line.find(word).unwrap() + word.len();
            line[i..].split_whitespace().next().unwrap().to_owned()
        };
        (
            guard,
            listening_addr(&head[0]),
            after("platform key "),
            after("measurement "),
        )
    };
    // mb0 is nearer the server; mb1 is the client's first hop.
    let (_g0, mb0, platform_key, m0) = start_mb("mb0.test", "X-Mb0", &nginx.addr().to_string());
    let (_g1, mb1, _, m1) = start_mb("mb1.test", "X-Mb1", &mb0);
    let fetch_path = |path: &str, extra: &[&str]| {
        let out = mbx()
            .args([
                "mbtls",
                "client",
                &format!("https://server.test{path}"),
                "--middlebox",
                &mb1,
            ])
            .args(extra)
            .arg("--server-ca")
            .arg(&server.ca)
            .args(["--allow-simulated", "--sim-platform-key", &platform_key])
            .args(["--measurement", &m0, "--measurement", &m1])
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let fetch = |extra: &[&str]| fetch_path("/path", extra);
    let (ok, text, err) = fetch(&[
        "--middlebox-name",
        "mb1.test",
        "--middlebox-name",
        "mb0.test",
    ]);
    assert!(ok, "{text}{err}");
    for expected in [
        "path: client -> mb1.test (",
        ") -> mb0.test -> server.test",
        "hop 1: client <-> mb1.test (fresh keys)",
        "hop 2: mb1.test <-> mb0.test (fresh keys)",
        "hop 3: mb0.test <-> server.test (primary session keys, also held by any middlebox on the server's side)",
        "status: HTTP/1.1 200 OK",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }
    // Both apps ran, each once.
    both_verified_and_both_apps_ran(&text, "/path");
    // The names in the other order: the certificate check fails, and the error says how the
    // names are matched (found in a user trial: it named the wrong middlebox, no more).
    let (ok, text, err) = fetch(&[
        "--middlebox-name",
        "mb0.test",
        "--middlebox-name",
        "mb1.test",
    ]);
    assert!(!ok, "{text}");
    assert!(
        err.contains(
            "checked against the name at its place in the path (in order from the client)"
        ) && err.contains("(a middlebox is expected under its --middlebox-name"),
        "{err}"
    );

    // Discovery through the same two: only one optimistic hello is offered, so the middlebox
    // nearest the server (mb0) joins if the allow-list names it; mb1 forwards unchanged.
    let (ok, text, err) = fetch(&["--allow-middlebox", "mb0.test"]);
    assert!(ok, "{text}{err}");
    assert!(
        text.contains(
            "discovery: a middlebox on the path may join if its certificate names mb0.test"
        ),
        "{text}"
    );
    // The client names it by its certificate.
    for expected in [
        "path: client -> mb0.test -> server.test (first hop ",
        "attestation: mb0.test verified (sim TEE",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }
    assert!(
        text.contains("hop 2: ") && !text.contains("hop 3: "),
        "{text}"
    );
    nginx
        .wait_access_log(|l| l.contains("x-mb0=\"mb0.test\" x-mb1=\"-\""))
        .unwrap();
    // Not on the allow-list: excluded, and the session continues without it.
    let (ok, text, err) = fetch(&["--allow-middlebox", "someone-else.test"]);
    assert!(ok, "{text}{err}");
    assert!(
        text.contains("middlebox: mb0.test was excluded: not in the allow-list")
            && text.contains("raise --max-discovered to the number of middleboxes on the path"),
        "{text}"
    );
    assert!(
        text.contains("hop 1: client <-> server.test (primary session keys, also held by any middlebox on the server's side)"),
        "{text}"
    );
    // Discovery with no middlebox on the path (straight to nginx): none answered by the
    // primary ServerHello, so the client gave its export up there; the keys stay in OpenSSL.
    let text = run_ok(
        mbx()
            .args([
                "mbtls",
                "client",
                "https://server.test/alone",
                "--middlebox",
            ])
            .arg(nginx.addr().to_string())
            .args(["--allow-middlebox", "mb0.test", "--server-ca"])
            .arg(&server.ca),
    );
    for expected in [
        "hop 1: client <-> server.test (primary session keys, also held by any middlebox on the server's side): no fingerprint",
        "attestation: no client-side middlebox took part",
        "status: HTTP/1.1 200 OK",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }

    // Two discovered: both join when both are allowed (each app ran once)...
    let (ok, text, err) = fetch_path(
        "/two-discovered",
        &[
            "--max-discovered",
            "2",
            "--allow-middlebox",
            "mb0.test",
            "--allow-middlebox",
            "mb1.test",
        ],
    );
    assert!(ok, "{text}{err}");
    for expected in [
        "hop 2: mb1.test <-> mb0.test (fresh keys)",
        "hop 3: mb0.test <-> server.test (primary session keys, also held by any middlebox on the server's side)",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }
    both_verified_and_both_apps_ran(&text, "/two-discovered");
    // ...and when the one nearest the server is refused, the other still joins (and, told
    // that nothing beyond it joined, does not wait for the refused one's switch).
    let (ok, text, err) = fetch_path(
        "/nearest-refused",
        &["--max-discovered", "2", "--allow-middlebox", "mb1.test"],
    );
    assert!(ok, "{text}{err}");
    for expected in [
        "middlebox: mb0.test was excluded: not in the allow-list",
        "attestation: mb1.test verified (sim TEE",
        "hop 2: mb1.test <-> server.test (primary session keys, also held by any middlebox on the server's side)",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }
    nginx
        .wait_access_log(|l| logged(l, "/nearest-refused", &["x-mb0=\"-\" x-mb1=\"mb1.test\""]))
        .unwrap();
}

/// `--fail-closed`: a middlebox cuts a session it cannot take part in (here a client that
/// offers it no hello), its banner says it will, and its report says why (thirty-third round,
/// from an embedder's trial). Without the flag the same session passes through it.
#[test]
fn a_middlebox_that_fails_closed_cuts_a_session_it_cannot_join() {
    let (_dir, _pki, server, mbox) = pki_files("mbx cli mbtls fail closed root", "mb.test");
    let nginx = Nginx::from_files(&server).start().unwrap();
    for fail_closed in [true, false] {
        let extra: &[&str] = if fail_closed { &["--fail-closed"] } else { &[] };
        let (_mb, mut lines, head) = start_middlebox(&nginx.addr().to_string(), &mbox, extra, 4);
        let said = head[1].contains("(fails closed: sessions it cannot take part in are cut)");
        assert_eq!(said, fail_closed, "{head:?}");
        let out = fetch_directly(&server, &listening_addr(&head[0]), "/", &[]);
        assert_eq!(out.status.success(), !fail_closed);
        let line = lines.next().unwrap().unwrap();
        let cut = line.contains("no optimistic ClientHello left for us")
            && line.contains("fails closed: the session is cut");
        assert_eq!(cut, fail_closed, "{line}");
    }
}

/// A client-side middlebox process (attester none) in front of `nginx` that inserts
/// `X-Mbtls: value`, and its address.
fn header_middlebox(nginx: &Nginx, mbox: &PkiFiles, value: &str) -> (ChildGuard, String) {
    let app = format!("http-header:X-Mbtls:{value}");
    let (child, _lines, head) =
        start_middlebox(&nginx.addr().to_string(), mbox, &["--app", &app], 4);
    (child, listening_addr(&head[0]))
}

/// `mbx mbtls middlebox` on loopback toward `next_hop` with `mbox`'s certificate and `extra`
/// flags; its first `banner` lines.
fn start_middlebox(
    next_hop: &str,
    mbox: &PkiFiles,
    extra: &[&str],
    banner: usize,
) -> (ChildGuard, TimedLines, Vec<String>) {
    let mut args = service_args("middlebox", "127.0.0.1:0", ("--next-hop", next_hop), mbox);
    args.extend(extra.iter().map(std::ffi::OsStr::new));
    start(&args, banner)
}

/// A client policy file that expects no evidence, for middleboxes with attester none.
fn no_evidence_policy(dir: &tempfile::TempDir) -> std::path::PathBuf {
    let policy = dir.path().join("policy.toml");
    std::fs::write(&policy, "[attestation]\nrequired = false\n").unwrap();
    policy
}

/// curl through the client proxy at `proxy_addr` to nginx's `/headers`: the headers nginx
/// received, as it echoes them.
fn headers_through_proxy(proxy_addr: &str) -> String {
    let out = mbx_testbed::Curl::new(&format!("http://{proxy_addr}/headers"))
        .header("Host: server.test")
        .run()
        .unwrap();
    assert_eq!(out.exit_code, Some(0), "{}", out.verbose);
    assert_eq!(out.status, Some(200), "{}", out.verbose);
    out.body_str().to_owned()
}

/// [`headers_through_proxy`]: the X-Mbtls header nginx received.
fn header_through_proxy(proxy_addr: &str) -> String {
    let body = headers_through_proxy(proxy_addr);
    body.lines()
        .find_map(|l| l.strip_prefix("x-mbtls: "))
        .unwrap_or_else(|| panic!("{body}"))
        .to_owned()
}

/// Where the client proxy tests start: the test PKI's files and nginx, a middlebox in front of
/// nginx that inserts `X-Mbtls: value` (its process and address), and a policy that asks for
/// no evidence. The files live as long as the returned `Setup`.
fn proxy_setup(root: &str, value: &str) -> (Setup, ChildGuard, String, std::path::PathBuf) {
    let setup = Setup::new(root);
    let (mb, mb_addr) = header_middlebox(&setup.nginx, &setup.mbox, value);
    let policy = no_evidence_policy(&setup.dir);
    (setup, mb, mb_addr, policy)
}

/// `mbx mbtls client https://server.test/` as a proxy on loopback, trusting `server`'s CA, with
/// `policy` and `flags`; its first two lines.
fn start_proxy(
    server: &PkiFiles,
    policy: &std::path::Path,
    flags: &[&str],
) -> (ChildGuard, TimedLines, Vec<String>) {
    use std::ffi::OsStr;
    let mut args: Vec<&OsStr> = ["mbtls", "client", "https://server.test/"]
        .iter()
        .chain(flags)
        .map(OsStr::new)
        .collect();
    args.extend([
        OsStr::new("--server-ca"),
        server.ca.as_os_str(),
        OsStr::new("--policy"),
        policy.as_os_str(),
        OsStr::new("--proxy"),
        OsStr::new("127.0.0.1:0"),
    ]);
    start(&args, 2)
}

/// The client proxy raises its open-files soft limit before it works out its default
/// connection limit, as the middlebox does (`the_middlebox_raises_its_open_files_soft_limit_to_the_hard_one`, whose
/// limits this takes): started under a soft limit of 256 and a hard one of 1,024, it allows
/// (1,024 - 40) / 2 connections, and a reload with nothing changed keeps that number (it once
/// started from the low limit and changed on the first SIGHUP).
#[test]
fn the_client_proxy_sets_its_connection_limit_from_the_raised_files_limit() {
    let (_dir, _pki, server, _mbox) = pki_files("mbx cli mbtls files root", "mb.test");
    let mut cmd = std::process::Command::new("sh");
    cmd.arg("-c")
        .arg("ulimit -S -n 256 && ulimit -H -n 1024 && exec \"$0\" \"$@\"")
        .arg(env!("CARGO_BIN_EXE_mbx"))
        .args([
            "mbtls",
            "client",
            "https://server.test/",
            "--no-client-middleboxes",
        ])
        .args([
            "--middlebox",
            "127.0.0.1:9",
            "--proxy",
            "127.0.0.1:0",
            "--server-ca",
        ])
        .arg(&server.ca)
        .env_remove("MBX_CONFIG")
        .env_remove("MBX_LOG");
    let (mut proxy, mut lines, head) = start_command(&mut cmd, 2);
    let at_most = |line: &str| -> u64 {
        let n = line
            .split("at most ")
            .nth(1)
            .unwrap_or_else(|| panic!("{line}"));
        n.split(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap_or_else(|_| panic!("{line}"))
    };
    let started = at_most(&head[1]);
    assert_eq!(started, 492, "{head:?}");
    signal(&mut proxy, Signal::HUP);
    let reloaded = lines.next().unwrap().unwrap();
    assert_eq!(at_most(&reloaded), started, "{reloaded}");
    // A proxy with no middlebox of its own resumes no middlebox session, nor does one that
    // discovers its middleboxes; its banner said so from the thirty-third round on (before:
    // "middlebox sessions resumed" in both, found in an operator trial).
    assert!(
        head[0].contains(", sessions resumed; ") && !head[0].contains("middlebox sessions"),
        "{head:?}"
    );
    let (_discovering, _lines, head) = start_command(
        mbx()
            .args(["mbtls", "client", "https://server.test/"])
            .args(["--allow-middlebox", "mb.test", "--proxy", "127.0.0.1:0"])
            .arg("--middlebox-ca")
            .arg(&server.ca)
            .arg("--server-ca")
            .arg(&server.ca)
            .env_remove("MBX_CONFIG"),
        1,
    );
    assert!(
        head[0].contains(", sessions resumed, discovered middleboxes' sessions not resumed; "),
        "{head:?}"
    );
}

#[test]
fn client_as_a_local_proxy_carries_curl_over_mbtls() {
    let (setup, _mb, mb_addr, policy) = proxy_setup("mbx cli mbtls proxy root", "via-proxy");
    let server = &setup.server;
    let (_proxy, mut proxy_lines, phead) = start_proxy(
        server,
        &policy,
        &[
            "--middlebox",
            &mb_addr,
            "--middlebox-name",
            "mb.test",
            "--idle-timeout-secs",
            "2",
            "--max-connections",
            "4",
        ],
    );
    // The banner says what the proxy runs with, as a reload's line does.
    assert!(
        phead[0].ends_with(&format!(
            ", sessions to server.test via {mb_addr}; middleboxes mb.test; TLS 1.2 and 1.3, \
             sessions resumed, middlebox sessions resumed; attestation policy: evidence \
             optional, 0 measurements accepted, simulated TEE refused"
        )),
        "{phead:?}"
    );
    assert_eq!(
        phead[1], "limits: handshake 60s, idle 2s, at most 4 connections at once",
        "{phead:?}"
    );
    let proxy_addr = listening_addr(&phead[0]);
    assert_eq!(header_through_proxy(&proxy_addr), "via-proxy");
    let line = proxy_lines.next().unwrap().unwrap();
    assert!(
        line.contains(": TLS 1.")
            && line.contains("bytes up")
            && line.contains("; via mb.test; hops "),
        "{line}"
    );
    // A local connection that sends nothing gets its session, which the proxy closes once it
    // was idle for --idle-timeout-secs.
    {
        use std::io::Read;
        let mut idle = std::net::TcpStream::connect(&proxy_addr).unwrap();
        idle.set_read_timeout(Some(std::time::Duration::from_secs(60)))
            .unwrap();
        assert!(matches!(idle.read(&mut [0u8; 16]), Ok(0) | Err(_)));
    }
    let line = proxy_lines.next().unwrap().unwrap();
    assert!(
        line.contains("ended with error: the session was idle for 2s"),
        "{line}"
    );
    // SIGTERM: the proxy drains (nothing is open) and exits cleanly.
    let mut child = _proxy;
    signal(&mut child, Signal::TERM);
    let rest: Vec<String> = proxy_lines.map(Result::unwrap).collect();
    assert_eq!(
        rest.last().map(String::as_str),
        Some("proxy stopped (0 connections cut)"),
        "{rest:?}"
    );
    let status = child.wait_timeout(std::time::Duration::from_secs(60));
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
    // Without --proxy the service flags make no sense, and say so.
    refused_without_proxy(server, &["--idle-timeout-secs", "5"]);

    // A proxy whose sessions fail: curl gets a 502 saying why, and the proxy's line for it.
    let failing_proxy = |first_hop: &str| {
        let (_proxy, mut proxy_lines, phead) = start_proxy(
            server,
            &policy,
            &["--middlebox", first_hop, "--middlebox-name", "mb.test"],
        );
        let out = mbx_testbed::Curl::new(&format!("http://{}/", listening_addr(&phead[0])))
            .header("Host: server.test")
            .run()
            .unwrap();
        assert_eq!(out.status, Some(502), "{}", out.verbose);
        let line = proxy_lines.next().unwrap().unwrap();
        (out.body_str().to_owned(), line)
    };
    // A first hop that cannot be reached: the 502 says why, not "couldn't connect" (found in a
    // user trial), and the proxy's line says the same.
    let refusing = mbx_testbed::refusing_addr();
    let (body, line) = failing_proxy(&refusing.addr().to_string());
    assert!(
        body.starts_with(
            "mbx mbtls proxy: the mbTLS session to the server failed: cannot connect to the first hop"
        ),
        "{body}"
    );
    assert!(line.contains("cannot connect to the first hop"), "{line}");
    // A middlebox that is not on the path (the proxy sent straight to the server): the line
    // says where it belongs, as the one-shot client's error does (twenty-sixth round, from a
    // user trial: the proxy's line had no such hint).
    let (_, line) = failing_proxy(&setup.nginx.addr().to_string());
    assert!(
        line.contains("mb.test: a pre-configured middlebox did not join")
            && line.contains("--middlebox is the address of the first one"),
        "{line}"
    );
}

/// `mbx mbtls client` fetching once with `flag` (and its value) fails, saying that the flag
/// is for the proxy.
fn refused_without_proxy(server: &PkiFiles, flag: &[&str]) {
    let out = mbx()
        .args(["mbtls", "client", "https://server.test/"])
        .args(flag)
        .arg("--server-ca")
        .arg(&server.ca)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let expected = format!(
        "{} applies to the client as a proxy (--proxy) only",
        flag[0]
    );
    assert!(err.contains(&expected), "{err}");
}

/// The client proxy resumes its session with the server on later connections: through a
/// middlebox (which joins every session), both versions, and without client-side middleboxes;
/// with --no-resume every connection is a full handshake.
#[test]
fn the_client_proxy_resumes_sessions_unless_told_not_to() {
    let (setup, _mb, mb_addr, policy) = proxy_setup("mbx cli mbtls resume root", "resuming");
    let server = &setup.server;
    let nginx_addr = setup.nginx.addr().to_string();
    let via_mb = ["--middlebox", &mb_addr, "--middlebox-name", "mb.test"];
    let direct = ["--middlebox", &nginx_addr, "--no-client-middleboxes"];
    // Expected per connection: (the session with the server resumed, the secondary session
    // with the middlebox resumed). Both resume on their own: `--no-resume` concerns the
    // server, `--fresh-evidence` the middlebox (docs/mbtls.md §4.7).
    type Resumed = [(bool, bool); 2];
    let cases: [(&[&str], &[&str], Resumed); 6] = [
        (&via_mb, &["--tls", "1.2"], [(false, false), (true, true)]),
        (&via_mb, &["--tls", "1.3"], [(false, false), (true, true)]),
        (&direct, &["--tls", "1.3"], [(false, false), (true, false)]),
        (
            &via_mb,
            &["--tls", "1.2", "--no-resume"],
            [(false, false), (false, true)],
        ),
        (
            &via_mb,
            &["--tls", "1.3", "--fresh-evidence"],
            [(false, false), (true, false)],
        ),
        (
            &via_mb,
            &["--tls", "1.3", "--no-resume", "--fresh-evidence"],
            [(false, false), (false, false)],
        ),
    ];
    for (path, extra, expected) in cases {
        let flags = [path, extra].concat();
        let (_proxy, mut lines, head) = start_proxy(server, &policy, &flags);
        let proxy_addr = listening_addr(&head[0]);
        let mut resumed = Vec::new();
        for _ in 0..2 {
            let headers = headers_through_proxy(&proxy_addr);
            let via = path == via_mb;
            assert_eq!(headers.contains("x-mbtls: resuming"), via, "{headers}");
            let line = lines.next().unwrap().unwrap();
            assert!(line.contains("bytes up"), "{line}");
            resumed.push((
                line.contains("session resumed; "),
                line.contains("middlebox sessions resumed: mb.test; "),
            ));
        }
        assert_eq!(resumed, expected, "{path:?} {extra:?}");
    }
    // A fetch makes one connection: nothing to resume, and it says so.
    refused_without_proxy(server, &["--no-resume"]);
}

/// A middlebox reloaded with nothing changed keeps its ticket keys: a session resumed before
/// the reload resumes after it too (it once made new keys on every SIGHUP, and every
/// endpoint's next session was a full handshake with fresh evidence).
#[test]
fn a_middlebox_reload_that_changes_nothing_keeps_its_tickets() {
    let setup = Setup::new("mbx cli mbtls reload tickets root");
    let app = "http-header:X-Mbtls:kept";
    let nginx = setup.nginx.addr().to_string();
    let (mut mb, mut mb_lines, head) = start_middlebox(&nginx, &setup.mbox, &["--app", app], 4);
    let mb_addr = listening_addr(&head[0]);
    let policy = no_evidence_policy(&setup.dir);
    let flags = [
        "--middlebox",
        &mb_addr,
        "--middlebox-name",
        "mb.test",
        "--tls",
        "1.3",
    ];
    let (_proxy, mut lines, head) = start_proxy(&setup.server, &policy, &flags);
    let proxy_addr = listening_addr(&head[0]);
    let mut fetch = || {
        let headers = headers_through_proxy(&proxy_addr);
        assert!(headers.contains("x-mbtls: kept"), "{headers}");
        let line = lines.next().unwrap().unwrap();
        assert!(line.contains("bytes up"), "{line}");
        line.contains("middlebox sessions resumed: mb.test; ")
    };
    assert!(!fetch());
    assert!(fetch());
    for _ in 0..2 {
        let _ = mb_lines.next();
    }
    signal(&mut mb, Signal::HUP);
    let reloaded = mb_lines.next().unwrap().unwrap();
    assert!(reloaded.starts_with("middlebox reloaded"), "{reloaded}");
    assert!(fetch(), "the ticket from before the reload");
}

/// A server's reload line shows its configuration as the banner does and marks what changed:
/// a reload that drops its required middlebox or moves its backend says so (found in a user
/// trial: the line showed the limits alone, and such a reload passed unnoticed).
#[test]
fn a_servers_reload_says_what_changed() {
    use std::ffi::OsStr;
    let Setup {
        dir, server, mbox, ..
    } = Setup::new("mbx cli mbtls server reload root");
    let policy = dir.path().join("policy.toml");
    let accept = |measurement: u8| {
        let m = format!("{measurement:02x}").repeat(32);
        std::fs::write(
            &policy,
            format!("[attestation]\nmeasurements = [\"{m}\"]\n"),
        )
        .unwrap();
    };
    accept(1);
    let config = dir.path().join("mbx.toml");
    let write_config = |backend: &str, middleboxes: &str| {
        let text = format!(
            "[mbtls.server]\nlisten = \"127.0.0.1:0\"\nbackend = \"{backend}\"\n\
             certificate = {:?}\nprivate_key = {:?}\n{middleboxes}",
            server.chain, server.key,
        );
        std::fs::write(&config, text).unwrap();
    };
    let middlebox_settings = format!(
        "middlebox_ca = {:?}\npolicy = {:?}\nmiddlebox_names = [\"mb2.test\"]\n",
        mbox.ca, policy
    );
    write_config("127.0.0.1:9", &middlebox_settings);
    let args = [
        OsStr::new("--config"),
        config.as_os_str(),
        OsStr::new("mbtls"),
        OsStr::new("server"),
    ];
    let (mut srv, mut lines, mut errors, head) = start_with_errors(&args, 3);
    assert!(head[1].contains("pre-configured mb2.test"), "{head:?}");
    // Another measurement: the policy's text reads the same ("1 measurement accepted"), and
    // the change is marked all the same; so is the middlebox CA's content.
    accept(2);
    signal(&mut srv, Signal::HUP);
    let line = lines.next().unwrap().unwrap();
    assert!(
        line.ends_with("1 measurement accepted, simulated TEE refused (changed)"),
        "{line}"
    );
    let (_other_dir, _other_pki, other, _) = pki_files("mbx cli other middlebox root", "mb.test");
    std::fs::copy(&other.ca, &mbox.ca).unwrap();
    signal(&mut srv, Signal::HUP);
    let line = lines.next().unwrap().unwrap();
    assert!(line.ends_with("simulated TEE refused (changed)"), "{line}");
    // Without the middlebox's name, its CA and policy would be ignored: the reload is
    // refused, and taken once they are gone too.
    write_config(
        "127.0.0.1:10",
        &middlebox_settings.replace("middlebox_names = [\"mb2.test\"]\n", ""),
    );
    signal(&mut srv, Signal::HUP);
    let refused = errors
        .find(|l| l.as_ref().map_or(true, |l| l.contains("reload")))
        .unwrap()
        .unwrap();
    assert!(
        refused.contains("reload failed, configuration unchanged")
            && refused.contains(
                "middlebox_ca (--middlebox-ca), policy (--policy, [attestation]) would be ignored"
            ),
        "{refused}"
    );
    write_config("127.0.0.1:10", "");
    signal(&mut srv, Signal::HUP);
    let line = lines.next().unwrap().unwrap();
    assert!(
        line.contains(
            "; backend 127.0.0.1:10 (changed); TLS 1.2 and 1.3; certificate for server.test; \
             server-side middlebox: none accepted (announcing middleboxes are excluded) \
             (changed); no policy (no middlebox may join) (changed)"
        ),
        "{line}"
    );
    // Marked against the last reload, not the start: the same file again marks nothing.
    a_reload_marks_nothing(&mut srv, &mut lines, "server");
}

/// A SIGHUP to `child` (a `who`) with its configuration unchanged: its reload line marks
/// nothing as changed.
fn a_reload_marks_nothing(child: &mut ChildGuard, lines: &mut TimedLines, who: &str) {
    signal(child, Signal::HUP);
    let line = lines.next().unwrap().unwrap();
    assert!(
        line.starts_with(&format!("{who} reloaded")) && !line.contains("(changed"),
        "{line}"
    );
}

/// The config file's `log` is refused at a reload only when it is the filter in force: with
/// `--log` given, a reload that changes it is taken (the second trial found every such reload
/// refused); without, it is refused and the next reload of the old value is taken.
#[test]
fn a_reload_refuses_a_log_change_only_when_the_files_log_is_in_force() {
    use std::ffi::OsStr;
    let (dir, _pki, _server, mbox) = pki_files("mbx cli mbtls log reload root", "mb.test");
    let config = dir.path().join("mbx.toml");
    // The app tells which reload a line comes from.
    let write_config = |log: &str, app: &str| {
        let text = format!(
            "{log}[mbtls.middlebox]\nlisten = \"127.0.0.1:0\"\nnext_hop = \"127.0.0.1:9\"\n\
             certificate = {:?}\nprivate_key = {:?}\napp = \"{app}\"\n",
            mbox.chain, mbox.key,
        );
        std::fs::write(&config, text).unwrap();
    };
    for flag in [true, false] {
        write_config("", "passthrough");
        let mut args = vec![OsStr::new("--config"), config.as_os_str()];
        if flag {
            args.extend(["--log", "warn"].map(OsStr::new));
        }
        args.extend(["mbtls", "middlebox"].map(OsStr::new));
        // Standard error read too: the refusal is said there. (The banner: 4 lines.)
        let (mut mb, mut lines, mut errors, _) = start_with_errors(&args, 4);
        write_config("log = \"debug\"\n", "http-header:X-Log:changed");
        signal(&mut mb, Signal::HUP);
        if !flag {
            // Refused, said on standard error before the next reload is asked for (two
            // signals close together could be taken as one, reading the later file).
            let refusal = errors
                .find(|l| l.as_ref().map_or(true, |l| l.contains("reload")))
                .unwrap()
                .unwrap();
            assert!(
                refusal.contains("a reload cannot change log from the default to \"debug\""),
                "{refusal}"
            );
            write_config("", "http-header:X-Log:after");
            signal(&mut mb, Signal::HUP);
        }
        let line = lines.next().unwrap().unwrap();
        let app = if flag { "changed" } else { "after" };
        assert!(
            line.starts_with("middlebox reloaded")
                && line.contains(&format!("app: http-header:X-Log:{app} (changed)")),
            "--log given: {flag}: {line}"
        );
    }
}

/// SIGHUP makes a client proxy read its config file again: connections accepted afterwards get
/// their sessions through the middlebox the file names now; a file that no longer builds a
/// configuration changes nothing. The session with the server is resumed across reloads that
/// leave the TLS configuration toward the server as it was, and made afresh after one that
/// changed it.
#[test]
fn the_client_proxy_reloads_its_config_file_on_sighup() {
    use std::ffi::OsStr;
    let Setup {
        dir,
        server,
        mbox,
        nginx,
        ..
    } = Setup::new("mbx cli mbtls proxy reload root");
    let (_one, one) = header_middlebox(&nginx, &mbox, "one");
    let (_two, two) = header_middlebox(&nginx, &mbox, "two");
    let policy = no_evidence_policy(&dir);
    let config = dir.path().join("mbx.toml");
    let write_config = |middlebox: &str, extra: &str| {
        let text = format!(
            "[mbtls.client]\nmiddlebox = \"{middlebox}\"\nmiddlebox_name = \"mb.test\"\n\
             server_ca = {:?}\npolicy = {:?}\n{extra}",
            server.ca, policy,
        );
        std::fs::write(&config, text).unwrap();
    };
    write_config(&one, "");
    let (mut proxy, mut lines, head) = start(
        &[
            OsStr::new("--config"),
            config.as_os_str(),
            OsStr::new("mbtls"),
            OsStr::new("client"),
            OsStr::new("https://server.test/"),
            OsStr::new("--proxy"),
            OsStr::new("127.0.0.1:0"),
        ],
        2,
    );
    let proxy_addr = listening_addr(&head[0]);
    let header_through_proxy = || header_through_proxy(&proxy_addr);
    // The header the middlebox inserted, whether the session was resumed, and whether the
    // secondary session with the middlebox was.
    let next_connection = |lines: &mut TimedLines| {
        let header = header_through_proxy();
        let line = lines.next().unwrap().unwrap();
        assert!(line.starts_with("connection "), "{line}");
        let middlebox_resumed = line.contains("middlebox sessions resumed: mb.test;");
        (
            header,
            line.contains("session resumed; "),
            middlebox_resumed,
        )
    };
    assert_eq!(
        next_connection(&mut lines),
        ("one".to_string(), false, false)
    );

    write_config(&two, "max_connections = 3\n");
    signal(&mut proxy, Signal::HUP);
    // What changed since the last reload is marked (twenty-seventh round: the line showed
    // the limits alone).
    assert_eq!(
        lines.next().unwrap().unwrap(),
        format!(
            "proxy reloaded: new connections get the new configuration; \
             limits: handshake 60s, idle 600s, at most 3 connections at once (changed); \
             sessions to server.test via {two} (changed); middleboxes mb.test; \
             TLS 1.2 and 1.3, sessions resumed, middlebox sessions resumed; \
             attestation policy: evidence optional, 0 measurements accepted, simulated TEE \
             refused"
        )
    );
    // Another middlebox, the same TLS toward the server: the session resumes through it (the
    // other middlebox process cannot open the first one's tickets).
    assert_eq!(
        next_connection(&mut lines),
        ("two".to_string(), true, false)
    );

    // Both a name and a list of names: refused, the proxy keeps going through the second.
    write_config(&one, "middlebox_names = [\"mb.test\"]\n");
    signal(&mut proxy, Signal::HUP);
    assert_eq!(next_connection(&mut lines), ("two".to_string(), true, true));

    // Only TLS 1.3 now: a new primary context, whose first session is a full one; the
    // settings toward the middlebox did not change, so its session still resumes.
    write_config(&two, "tls = \"1.3\"\n");
    signal(&mut proxy, Signal::HUP);
    let line = lines.next().unwrap().unwrap();
    // Marked (found in a user trial: it took effect unmarked).
    assert!(
        line.starts_with("proxy reloaded")
            && line.contains(
                "; TLS 1.3 only, sessions resumed, middlebox sessions resumed (changed); "
            ),
        "{line}"
    );
    assert_eq!(
        next_connection(&mut lines),
        ("two".to_string(), false, true)
    );
    assert_eq!(next_connection(&mut lines), ("two".to_string(), true, true));
}

/// Started with a low soft limit on open files (as a login shell's 1,024), the middlebox raises
/// it to the hard limit before it serves: the kernel's view of the running process says so.
#[test]
fn the_middlebox_raises_its_open_files_soft_limit_to_the_hard_one() {
    let dir = tempfile::tempdir().unwrap();
    let pki = TestPki::new("mbx cli limits root").unwrap();
    let mbox = pki
        .issue(&LeafSpec::middlebox("mb.test"))
        .unwrap()
        .write_to_named(dir.path(), "mbox")
        .unwrap();
    let mbx_path = mbx().get_program().to_owned();
    let (mut child, _, banner) = start_command(
        std::process::Command::new("sh")
            .arg("-c")
            // A hard limit of its own (lowering one is always allowed), so that the test checks
            // the raise on every machine instead of skipping where the inherited hard limit is
            // odd.
            .arg("ulimit -S -n 256 && ulimit -H -n 1024 && exec \"$0\" \"$@\"")
            .arg(mbx_path)
            .args(["mbtls", "middlebox", "--listen", "127.0.0.1:0"])
            .args(["--next-hop", "127.0.0.1:9"])
            .arg("--certificate")
            .arg(&mbox.chain)
            .arg("--private-key")
            .arg(&mbox.key)
            .env_remove("MBX_CONFIG"),
        4,
    );
    let pid = child.child_mut().unwrap().id();
    assert!(
        banner[0].starts_with("mbTLS middlebox listening on"),
        "{banner:?}"
    );
    // The default connection limit follows from the raised limit: (1,024 - 40 reserved, 8 of
    // them for metrics scrapes) / 2 sockets.
    assert_eq!(
        banner[3], "limits: handshake 60s, idle 600s, at most 492 connections at once",
        "{banner:?}"
    );
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let open_files: Vec<&str> = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap()
        .split_whitespace()
        .skip(3)
        .take(2)
        .collect();
    assert_eq!(open_files, ["1024", "1024"], "{limits}");
}

/// SIGHUP makes a middlebox read its config file again: connections accepted afterwards get the
/// new configuration (here another inserted header and another connection limit), and a file
/// that no longer loads changes nothing.
#[test]
fn a_middlebox_reloads_its_config_file_on_sighup() {
    use std::ffi::OsStr;
    let Setup {
        dir,
        pki,
        server,
        mbox,
        nginx,
    } = Setup::new("mbx cli mbtls reload root");
    let config = dir.path().join("mbx.toml");
    let write_config = |app: &str, extra: &str| {
        let text = format!(
            "[mbtls.middlebox]\nlisten = \"127.0.0.1:0\"\nnext_hop = \"{}\"\n\
             certificate = {:?}\nprivate_key = {:?}\napp = \"{app}\"\n{extra}",
            nginx.addr(),
            mbox.chain,
            mbox.key,
        );
        std::fs::write(&config, text).unwrap();
    };
    write_config("http-header:X-Mbtls:before", "");
    // Standard error read too: a refused reload is said there, and each is awaited before the
    // next fetch (a fetch right after the signal could come before the reload was handled,
    // and two signals close together can be taken as one).
    let (mut mb, mut lines, mut errors, head) = start_with_errors(
        &[
            OsStr::new("--config"),
            config.as_os_str(),
            OsStr::new("mbtls"),
            OsStr::new("middlebox"),
        ],
        4,
    );
    // The next refused reload on standard error, which must say `why`.
    let mut refused_reload = |why: &str| {
        let line = errors
            .find(|l| l.as_ref().map_or(true, |l| l.contains("reload failed")))
            .unwrap()
            .unwrap();
        assert!(line.contains(why), "{why}: {line}");
    };
    let mb_addr = listening_addr(&head[0]);
    let policy = no_evidence_policy(&dir);
    let try_fetch = |path: &str| {
        mbx()
            .args(["mbtls", "client", &format!("https://server.test{path}")])
            .args(["--middlebox", &mb_addr, "--middlebox-name", "mb.test"])
            .arg("--server-ca")
            .arg(&server.ca)
            .arg("--policy")
            .arg(&policy)
            .env_remove("MBX_CONFIG")
            .output()
            .unwrap()
    };
    // Fetches `path`: nginx logs it with the header `X-Mbtls: {value}`, and the middlebox
    // reports the connection closed cleanly.
    let fetched_with = |path: &str, value: &str, lines: &mut TimedLines| {
        let out = try_fetch(path);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{text}");
        let header = format!("x-mbtls=\"{value}\"");
        nginx
            .wait_access_log(|l| logged(l, path, &[header.as_str()]))
            .unwrap();
        let next: String = lines.next().unwrap().unwrap();
        assert!(
            next.starts_with("connection ") && next.contains("closed cleanly"),
            "{next}"
        );
    };
    fetched_with("/first", "before", &mut lines);

    write_config("http-header:X-Mbtls:after", "max_connections = 7\n");
    signal(&mut mb, Signal::HUP);
    let reloaded = lines.next().unwrap().unwrap();
    assert_eq!(
        reloaded,
        format!(
            "middlebox reloaded: new connections get the new configuration; \
             limits: handshake 60s, idle 600s, at most 7 connections at once (changed); \
             next hop {}; app: http-header:X-Mbtls:after (changed); certificate for mb.test; \
             attestation: none (sends empty evidence)",
            nginx.addr()
        )
    );
    fetched_with("/second", "after", &mut lines);

    // A file that no longer loads, or one that would move the listener: the middlebox keeps
    // serving with what it had.
    write_config("no-such-app", "");
    signal(&mut mb, Signal::HUP);
    refused_reload("unknown app \"no-such-app\"");
    fetched_with("/third", "after", &mut lines);
    std::fs::write(
        &config,
        std::fs::read_to_string(&config)
            .unwrap()
            .replace("127.0.0.1:0", "127.0.0.1:1")
            .replace("no-such-app", "http-header:X-Mbtls:moved"),
    )
    .unwrap();
    signal(&mut mb, Signal::HUP);
    refused_reload("a reload cannot move the listener");
    fetched_with("/moved", "after", &mut lines);
    // Nor may a reload start (or move) the metrics listener.
    write_config(
        "http-header:X-Mbtls:metrics-moved",
        "metrics_listen = \"127.0.0.1:0\"\n",
    );
    signal(&mut mb, Signal::HUP);
    refused_reload("a reload cannot move the metrics listener");
    fetched_with("/metrics-moved", "after", &mut lines);
    // Nor change the drain time, which the stop it applies to already holds.
    write_config("http-header:X-Mbtls:drain-changed", "drain_secs = 99\n");
    signal(&mut mb, Signal::HUP);
    refused_reload("a reload cannot change drain_secs");
    fetched_with("/drain-changed", "after", &mut lines);
    // Nor flip the middlebox's side, nor change the log filter, which is set up once (before
    // the twenty-seventh round both were taken: the side silently, the log ignored).
    write_config("http-header:X-Mbtls:side-changed", "side = \"server\"\n");
    signal(&mut mb, Signal::HUP);
    refused_reload("a reload cannot change the middlebox's side");
    fetched_with("/side-changed", "after", &mut lines);
    write_config("http-header:X-Mbtls:log-changed", "");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, format!("log = \"debug\"\n{text}")).unwrap();
    signal(&mut mb, Signal::HUP);
    refused_reload("a reload cannot change log");
    fetched_with("/log-changed", "after", &mut lines);

    // The certificate and key files are read again too: renewed in place with a certificate
    // for another name, the middlebox is refused by a client that wants mb.test.
    pki.issue(&LeafSpec::middlebox("other.test"))
        .unwrap()
        .write_to_named(dir.path(), "mbox")
        .unwrap();
    write_config("http-header:X-Mbtls:after", "");
    signal(&mut mb, Signal::HUP);
    // The reload line says the name changed (twenty-sixth round, from a user trial: it said
    // nothing of the certificate, and every client then failed).
    let reloaded = lines.next().unwrap().unwrap();
    assert!(
        reloaded.starts_with("middlebox reloaded")
            && reloaded.contains("certificate for other.test (changed: endpoints must expect it)"),
        "{reloaded}"
    );
    let out = try_fetch("/fourth");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("certificate"), "{err}");
    assert!(!nginx.access_log().contains("/fourth"));
}

/// A simulated middlebox without a key file keeps the platform key made at its start across
/// reloads (endpoints trust the key its banner showed), and the reload line shows the
/// measurement, which changes with the app.
#[test]
fn a_reload_keeps_the_fresh_platform_key_and_shows_the_new_measurement() {
    use std::ffi::OsStr;
    let (dir, _pki, _server, mbox) = pki_files("mbx cli mbtls sim reload root", "mb.test");
    let config = dir.path().join("mbx.toml");
    let write_config = |app: &str| {
        let text = format!(
            "[mbtls.middlebox]\nlisten = \"127.0.0.1:0\"\nnext_hop = \"127.0.0.1:9\"\n\
             certificate = {:?}\nprivate_key = {:?}\napp = \"{app}\"\nattester = \"sim\"\n",
            mbox.chain, mbox.key,
        );
        std::fs::write(&config, text).unwrap();
    };
    write_config("http-header:X-Mbtls:before");
    let args = [
        OsStr::new("--config"),
        config.as_os_str(),
        OsStr::new("mbtls"),
        OsStr::new("middlebox"),
    ];
    let (mut mb, mut lines, head) = start(&args, 4);
    // "attestation: SIMULATED TEE (demo only): platform key K (fresh for this run), measurement M"
    let parts = |line: &str| -> (String, String) {
        let key = line.split("platform key ").nth(1).unwrap();
        let measurement = line.split("measurement ").nth(1).unwrap();
        (
            key.split(' ').next().unwrap().to_string(),
            measurement.split([' ', ';']).next().unwrap().to_string(),
        )
    };
    assert!(head[2].contains("(fresh for this run)"), "{head:?}");
    let (key, measurement) = parts(&head[2]);
    write_config("http-header:X-Mbtls:after");
    signal(&mut mb, Signal::HUP);
    let reloaded = lines.next().unwrap().unwrap();
    assert!(reloaded.starts_with("middlebox reloaded"), "{reloaded}");
    let (key_after, measurement_after) = parts(&reloaded);
    assert_eq!(key_after, key, "{reloaded}");
    assert_ne!(measurement_after, measurement, "{reloaded}");
    // Said to have changed (twenty-sixth round); a reload that changes nothing says nothing.
    assert!(
        reloaded.ends_with("(changed: endpoints' policies must accept it)"),
        "{reloaded}"
    );
    a_reload_marks_nothing(&mut mb, &mut lines, "middlebox");
}

/// Client, router and server as network namespaces, `nft` found or installed, and a test PKI's
/// files (server.test, mb.test).
struct RouterBed {
    topo: mbx_testbed::Topology,
    nft: std::path::PathBuf,
    dir: tempfile::TempDir,
    server: PkiFiles,
    mbox: PkiFiles,
}

impl RouterBed {
    /// `None`, after saying why `test` is skipped, where namespaces are unavailable (not root).
    fn new(test: &str) -> Option<RouterBed> {
        if let Some(reason) = mbx_testbed::netns::unavailable_reason() {
            eprintln!("SKIPPED {test}: {reason}");
            return None;
        }
        let nft = mbx_testbed::ensure_tool("nft", "nftables").unwrap();
        let (dir, _pki, server, mbox) = pki_files(&format!("mbx cli {test} root"), "mb.test");
        let topo = mbx_testbed::Topology::namespaces(3).unwrap();
        Some(RouterBed {
            topo,
            nft,
            dir,
            server,
            mbox,
        })
    }

    /// The `nft` tool, the directory for rule files, and the server's and middlebox's PKI files.
    fn parts(&self) -> (&std::path::Path, &tempfile::TempDir, &PkiFiles, &PkiFiles) {
        (&self.nft, &self.dir, &self.server, &self.mbox)
    }

    /// Client, router, server.
    fn hosts(&self) -> [&mbx_testbed::Host; 3] {
        [0, 1, 2].map(|i| self.topo.host(i).unwrap())
    }
}

/// On the router `router` of a namespace topology: nftables redirects every connection to one
/// of `to` (IPv4 or IPv6) to a port of the router, which it returns (for a transparent
/// middlebox to listen on).
fn redirect_on(
    router: &mbx_testbed::Host,
    nft: &std::path::Path,
    dir: &tempfile::TempDir,
    to: &[std::net::SocketAddr],
) -> u16 {
    let port = router.port().unwrap();
    let rules = dir.path().join(format!("redirect-{port}.nft"));
    let redirects: String = to
        .iter()
        .map(|a| {
            let family = if a.is_ipv4() { "ip" } else { "ip6" };
            let (ip, dport) = (a.ip(), a.port());
            format!("    {family} daddr {ip} tcp dport {dport} redirect to :{port}\n")
        })
        .collect();
    std::fs::write(
        &rules,
        format!(
            "table inet mbx_transparent_{port} {{\n  chain prerouting {{\n    \
             type nat hook prerouting priority dstnat;\n{redirects}  }}\n}}\n"
        ),
    )
    .unwrap();
    let out = router.command(nft).arg("-f").arg(&rules).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    port
}

/// `mbx mbtls middlebox --transparent` on `router`, listening on `port` of every address (IPv4
/// and IPv6: `[::]`, which sees IPv4 connections at IPv4-mapped addresses), with
/// `mbox`'s certificate and `extra` flags; its report lines (after the banner, checked).
fn transparent_middlebox(
    router: &mbx_testbed::Host,
    port: u16,
    mbox: &PkiFiles,
    extra: &[&str],
) -> (ChildGuard, TimedLines) {
    let (mb, lines, banner) = start_command(
        router
            .command(mbx().get_program())
            .args(["mbtls", "middlebox", "--transparent", "--listen"])
            .arg(format!("[::]:{port}"))
            .arg("--certificate")
            .arg(&mbox.chain)
            .arg("--private-key")
            .arg(&mbox.key)
            .args(extra)
            .env_remove("MBX_CONFIG"),
        4,
    );
    assert!(
        banner[0].contains("next hop transparent (each connection's original destination)"),
        "{banner:?}"
    );
    (mb, lines)
}

/// A transparent middlebox on the path: client, router and server are network namespaces, and
/// nftables on the router redirects the client's connection to the server to the middlebox
/// (`--transparent`), which takes it to its original destination and joins the session the
/// client, which knows nothing of it, offers discovery on, over IPv4 and over IPv6. A connection
/// made to the middlebox's own address has no other destination and is refused, saying why.
/// Runs only as root with `ip`; otherwise prints why it is skipped.
#[test]
fn a_transparent_middlebox_on_the_router_joins_a_discovering_client() {
    let Some(bed) =
        RouterBed::new("a_transparent_middlebox_on_the_router_joins_a_discovering_client")
    else {
        return;
    };
    let (nft, dir, server, mbox) = bed.parts();
    let [client_host, router, server_host] = bed.hosts();
    let nginx = Nginx::from_files(server)
        .log_header("X-Mbtls")
        .also_ipv6()
        .start_on(server_host)
        .unwrap();
    let (server_addr, server_addr6) = (nginx.addr(), nginx.addr6().unwrap());
    let mb_port = redirect_on(router, nft, dir, &[server_addr, server_addr6]);
    let mbx_path = mbx().get_program().to_owned();
    let (_mb, mut lines) = transparent_middlebox(
        router,
        mb_port,
        mbox,
        &["--app", "http-header:X-Mbtls:on-the-path"],
    );

    // The client connects to the server's address and offers discovery; the router's
    // redirect puts the middlebox in its path.
    let policy = no_evidence_policy(dir);
    let fetch = |to: &str| {
        client_host
            .command(&mbx_path)
            .args(["mbtls", "client", "https://server.test/headers"])
            .args(["--middlebox", to, "--allow-middlebox", "mb.test"])
            .arg("--server-ca")
            .arg(&server.ca)
            .arg("--policy")
            .arg(&policy)
            .env_remove("MBX_CONFIG")
            .output()
            .unwrap()
    };
    for to in [server_addr, server_addr6] {
        let out = fetch(&to.to_string());
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(text.contains("hop 2: "), "{text}");
        assert!(text.contains("x-mbtls: on-the-path"), "{text}");
        let line = lines.next().unwrap().unwrap();
        assert!(line.contains(&format!(" to {to} (from ")), "{line}");
        assert!(line.contains("): joined"), "{line}");
        // The client as it connected, IPv4 not IPv4-mapped: "from 10.231.0.1:…".
        let client_ip = match to {
            std::net::SocketAddr::V4(_) => client_host.ip(),
            std::net::SocketAddr::V6(_) => client_host.ip6().unwrap().into(),
        };
        let from = std::net::SocketAddr::new(client_ip, 0).to_string();
        assert!(
            line.contains(&format!(" from {}", &from[..from.len() - 1])),
            "{line}"
        );
    }

    // A rule in the output hook that catches the middlebox's own connection to the server
    // too (no `meta skuid != …`): that connection comes back to the middlebox, which refuses
    // it rather than connect it again, and again (an operator trial saw 24,000 connections
    // in seconds). The session fails; the next one, the rule gone, runs, and its line is
    // the next: nothing else was connected meanwhile.
    let table = format!("mbx_loop_{mb_port}");
    let nft_run = |args: &[&str]| {
        let out = router.command(nft).args(args).output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let (ip, dport) = (server_addr.ip().to_string(), server_addr.port().to_string());
    nft_run(&["add", "table", "inet", &table]);
    nft_run(&[
        "add",
        "chain",
        "inet",
        &table,
        "output",
        "{ type nat hook output priority -100 ; }",
    ]);
    nft_run(&[
        "add",
        "rule",
        "inet",
        &table,
        "output",
        "ip",
        "daddr",
        &ip,
        "tcp",
        "dport",
        &dport,
        "redirect",
        "to",
        &format!(":{mb_port}"),
    ]);
    assert!(!fetch(&server_addr.to_string()).status.success());
    let mut two = [0, 1].map(|_| lines.next().unwrap().unwrap());
    two.sort_by_key(|l| !l.contains("redirected back"));
    assert!(
        two[0].contains("redirect rule must leave the middlebox's own traffic alone"),
        "{two:?}"
    );
    assert!(
        two[1].contains(&format!(" to {server_addr} (from ")),
        "{two:?}"
    );
    nft_run(&["delete", "table", "inet", &table]);
    assert!(fetch(&server_addr.to_string()).status.success());
    let line = lines.next().unwrap().unwrap();
    assert!(line.contains("): joined"), "{line}");

    // Straight to the middlebox: not redirected, so nowhere to go.
    let out = fetch(&router.addr(mb_port).to_string());
    assert!(!out.status.success());
    let line = lines.next().unwrap().unwrap();
    assert!(line.contains("was not redirected"), "{line}");
}

/// The same on the server's side: a legacy client (curl) reaches an mbTLS server whose
/// connections the router redirects to a transparent server-side middlebox, which announces
/// itself and is approved by the server; the header it inserts reaches the backend (nginx,
/// plain HTTP, next to the server). Runs only as root with `ip`.
#[test]
fn a_transparent_server_side_middlebox_on_the_router_announces_itself() {
    let Some(bed) =
        RouterBed::new("a_transparent_server_side_middlebox_on_the_router_announces_itself")
    else {
        return;
    };
    let (nft, dir, server, mbox) = bed.parts();
    let [client_host, router, server_host] = bed.hosts();
    let curl = mbx_testbed::ensure_tool("curl", "curl").unwrap();
    // The backend: nginx on the server's host, plain HTTP, echoing the inserted header.
    let backend = server_host.addr(server_host.port().unwrap());
    let _nginx = Nginx::from_files(server)
        .extra_http_config(&format!(
            "server {{ listen {backend}; location / {{ return 200 \"x-mbtls: $http_x_mbtls\\n\"; }} }}"
        ))
        .start_on(server_host)
        .unwrap();
    let server_addr = server_host.addr(server_host.port().unwrap());
    let policy = no_evidence_policy(dir);
    let (_srv, mut srv_lines, banner) = start_command(
        server_host
            .command(mbx().get_program())
            .args(["mbtls", "server", "--listen"])
            .arg(server_addr.to_string())
            .arg("--backend")
            .arg(backend.to_string())
            .arg("--certificate")
            .arg(&server.chain)
            .arg("--private-key")
            .arg(&server.key)
            .args(["--allow-middlebox", "mb.test", "--middlebox-ca"])
            .arg(&server.ca)
            .arg("--policy")
            .arg(&policy)
            .env_remove("MBX_CONFIG"),
        3,
    );
    assert!(
        banner[0].starts_with("mbTLS server listening on"),
        "{banner:?}"
    );

    let mb_port = redirect_on(router, nft, dir, &[server_addr]);
    let app = ["--server-side", "--app", "http-header:X-Mbtls:server-side"];
    let (_mb, mut mb_lines) = transparent_middlebox(router, mb_port, mbox, &app);

    let resolve = format!("server.test:{}:{}", server_addr.port(), server_addr.ip());
    let out = client_host
        .command(&curl)
        .args(["-sS", "--max-time", "60", "--resolve", &resolve, "--cacert"])
        .arg(&server.ca)
        .arg(format!("https://server.test:{}/", server_addr.port()))
        .output()
        .unwrap();
    let body = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{body}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(body, "x-mbtls: server-side\n");
    let line = mb_lines.next().unwrap().unwrap();
    assert!(
        line.contains(&format!(" to {server_addr} (from ")) && line.contains("): joined"),
        "{line}"
    );
    let line = srv_lines.next().unwrap().unwrap();
    assert!(
        line.contains("middlebox mb.test sent no evidence"),
        "{line}"
    );
}

/// The value of the sample `name` (with its labels, if any) in a scrape's `text`.
fn metric(text: &str, name: &str) -> u64 {
    let key = format!("{name} ");
    text.lines()
        .find_map(|l| l.strip_prefix(key.as_str()))
        .unwrap_or_else(|| panic!("no {name} in:\n{text}"))
        .parse()
        .unwrap()
}

/// The text a service's metrics endpoint (`metrics: URL` in its banner) answers with.
fn scrape(metrics_url: &str) -> String {
    let out = mbx_testbed::Curl::new(metrics_url).run().unwrap();
    assert_eq!(out.status, Some(200), "{}", out.verbose);
    out.body_str().to_owned()
}

/// `--metrics-listen`: the middlebox answers Prometheus scrapes with its counters, which follow
/// the connections it served (one session it joined, one connection that failed) and its
/// reloads.
#[test]
fn the_middlebox_counts_its_connections_for_prometheus() {
    let Setup {
        dir,
        server,
        mbox,
        nginx,
        ..
    } = Setup::new("mbx cli mbtls metrics root");
    let next_hop = nginx.addr().to_string();
    let metrics = [
        "--metrics-listen",
        "127.0.0.1:0",
        "--max-connections-per-client",
        "1",
    ];
    let (mut mb, mut lines, head) = start_middlebox(&next_hop, &mbox, &metrics, 5);
    let mb_addr = listening_addr(&head[0]);
    assert!(
        head.iter()
            .any(|l| l.contains(" at once, 1 per client address")),
        "{head:?}"
    );
    let metrics_url = head[4]
        .strip_prefix("metrics: ")
        .unwrap_or_else(|| panic!("{head:?}"))
        .to_owned();
    let scrape = || scrape(&metrics_url);
    let policy = no_evidence_policy(&dir);
    let out = mbx()
        .args(["mbtls", "client", "https://server.test/headers"])
        .args(["--middlebox", &mb_addr, "--middlebox-name", "mb.test"])
        .arg("--server-ca")
        .arg(&server.ca)
        .arg("--policy")
        .arg(&policy)
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(lines.next().unwrap().unwrap().contains("closed cleanly"));
    // A connection that says nothing and goes: a failed one.
    drop(std::net::TcpStream::connect(&mb_addr).unwrap());
    assert!(lines.next().unwrap().unwrap().contains("ended with error"));
    signal(&mut mb, Signal::HUP);
    assert!(lines
        .next()
        .unwrap()
        .unwrap()
        .starts_with("middlebox reloaded"));

    let text = scrape();
    for expected in [
        "mbtls_middlebox_connections_accepted_total 2\n",
        "mbtls_middlebox_connections_open 0\n",
        "mbtls_middlebox_connections_ended_total{outcome=\"clean\"} 1\n",
        "mbtls_middlebox_connections_ended_total{outcome=\"failed\"} 1\n",
        "mbtls_middlebox_sessions_with_middlebox_total 1\n",
        "# TYPE mbtls_middlebox_key_updates_total counter\nmbtls_middlebox_key_updates_total 0\n",
        "mbtls_middlebox_reloads_total{result=\"applied\"} 1\n",
        "mbtls_middlebox_reloads_total{result=\"refused\"} 0\n",
        "# TYPE mbtls_middlebox_bytes_total counter\n",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }
    let bytes = |direction: &str| -> u64 {
        metric(
            &text,
            &format!("mbtls_middlebox_bytes_total{{direction=\"{direction}\"}}"),
        )
    };
    // The request and the response crossed, with the handshakes: some hundreds of bytes.
    assert!(
        bytes("upstream") > 300 && bytes("downstream") > 300,
        "{text}"
    );

    // `--max-connections-per-client 1`: while one connection from this address is open (it
    // says nothing, so it waits for its handshake), a second is closed at once and counted.
    let _held = std::net::TcpStream::connect(&mb_addr).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !scrape().contains("mbtls_middlebox_connections_open 1\n") {
        assert!(std::time::Instant::now() < deadline, "{}", scrape());
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let mut refused = std::net::TcpStream::connect(&mb_addr).unwrap();
    refused
        .set_read_timeout(Some(std::time::Duration::from_secs(60)))
        .unwrap();
    let read = std::io::Read::read(&mut refused, &mut [0u8; 1]);
    assert!(
        matches!(read, Ok(0))
            || read
                .as_ref()
                .is_err_and(|e| e.kind() != std::io::ErrorKind::WouldBlock),
        "{read:?}"
    );
    let text = scrape();
    assert!(
        text.contains("mbtls_middlebox_connections_refused_per_client_total 1\n")
            && text.contains("mbtls_middlebox_connections_accepted_total 3\n"),
        "{text}"
    );
}

/// A server-side middlebox in front of a legacy server (nginx) that forgets it after the
/// time set (TOML `forget_legacy_after_secs`): the session that finds it legacy fails, it is
/// counted as remembered (the metrics' gauge) and the next session passes through; a reload
/// to 0 forgets it at once (the gauge reads 0 before any session), and the next session is
/// announced again, and fails again.
#[test]
fn a_server_side_middlebox_forgets_a_legacy_server_when_told() {
    // The directory holds the files: kept to the end.
    let Setup {
        dir,
        server,
        mbox,
        nginx,
        ..
    } = Setup::new("mbx cli mbtls forget legacy root");
    let config = dir.path().join("forget.toml");
    std::fs::write(
        &config,
        "[mbtls.middlebox]\nforget_legacy_after_secs = 3600\n",
    )
    .unwrap();
    let next_hop = nginx.addr().to_string();
    let mut args = service_args("middlebox", "127.0.0.1:0", ("--next-hop", &next_hop), &mbox);
    args.splice(0..0, [std::ffi::OsStr::new("--config"), config.as_os_str()]);
    args.extend(["--server-side", "--metrics-listen", "127.0.0.1:0"].map(std::ffi::OsStr::new));
    let (mut mb, mut lines, head) = start(&args, 5);
    assert!(
        head[0].contains(", server side (legacy servers forgotten after 3600s), certificate for "),
        "{head:?}"
    );
    let mb_addr: std::net::SocketAddr = listening_addr(&head[0]).parse().unwrap();
    let metrics_url = head[4]
        .strip_prefix("metrics: ")
        .unwrap_or_else(|| panic!("{head:?}"))
        .to_owned();
    let remembered = || {
        let text = scrape(&metrics_url);
        assert!(
            text.contains("# TYPE mbtls_middlebox_legacy_servers_remembered gauge\n"),
            "{text}"
        );
        metric(&text, "mbtls_middlebox_legacy_servers_remembered")
    };
    let fetch = || {
        mbx_testbed::Curl::new(&format!("https://server.test:{}/", mb_addr.port()))
            .resolve("server.test", mb_addr.port(), mb_addr.ip())
            .cacert(&server.ca)
            .run()
            .unwrap()
    };
    let found_legacy = |what: &str, lines: &mut TimedLines| {
        let out = fetch();
        assert_ne!(out.exit_code, Some(0), "{what}: {}", out.verbose);
        let line = lines.next().unwrap().unwrap();
        assert!(
            line.contains("the server refused our announcement (a legacy server)")
                && line.contains("later sessions to it are passed through unannounced"),
            "{what}: {line}"
        );
        line
    };
    let line = found_legacy("first", &mut lines);
    assert!(line.contains("for 3600s"), "{line}");
    assert_eq!(remembered(), 1);
    // Passed through, unannounced (nginx answers the request).
    let out = fetch();
    assert_eq!(out.exit_code, Some(0), "{}", out.verbose);
    lines.next().unwrap().unwrap();
    std::fs::write(&config, "[mbtls.middlebox]\nforget_legacy_after_secs = 0\n").unwrap();
    signal(&mut mb, Signal::HUP);
    let reloaded = lines.next().unwrap().unwrap();
    assert!(
        reloaded.contains("legacy servers not remembered (changed)"),
        "{reloaded}"
    );
    assert_eq!(remembered(), 0);
    let out = fetch();
    assert_ne!(out.exit_code, Some(0), "{}", out.verbose);
    let line = lines.next().unwrap().unwrap();
    assert!(
        line.contains("the server refused our announcement (a legacy server)")
            && line.contains("not remembered (forget_legacy_after is 0)"),
        "{line}"
    );
}

/// `--connection-rate-per-client` with `--connection-burst-per-client`: the server's banner
/// says the limit, connections a client opens faster are closed at their accept, counted for
/// Prometheus and logged once. (Twenty at once against a burst of two and one a second: the
/// last ones are refused however slow the machine.)
#[test]
fn a_server_closes_connections_a_client_opens_faster_than_its_rate() {
    let (_dir, _pki, server, _mbox) = pki_files("mbx cli mbtls rate root", "mb.test");
    let mut args = mbtls_server_args("127.0.0.1:0", "127.0.0.1:9", &server);
    args.extend(
        [
            "--metrics-listen",
            "127.0.0.1:0",
            "--connection-rate-per-client",
            "1",
            "--connection-burst-per-client",
            "2",
        ]
        .map(std::ffi::OsStr::new),
    );
    let (_srv, _lines, errors, head) = start_with_errors(&args, 4);
    let addr = listening_addr(&head[0]);
    assert!(
        head.iter().any(|l| l.starts_with("limits: ")
            && l.ends_with(" at once, 1 new per second per client address (burst 2)")),
        "{head:?}"
    );
    let metrics_url = head
        .iter()
        .find_map(|l| l.strip_prefix("metrics: "))
        .unwrap_or_else(|| panic!("{head:?}"))
        .to_owned();
    let scrape = || scrape(&metrics_url);
    let counter = |text: &str, name: &str| metric(text, &format!("mbtls_server_{name}"));
    let held: Vec<_> = (0..20)
        .map(|_| std::net::TcpStream::connect(&addr).unwrap())
        .collect();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let text = loop {
        let text = scrape();
        let refused = counter(&text, "connections_refused_rate_per_client_total");
        if counter(&text, "connections_accepted_total") + refused == 20 {
            break text;
        }
        assert!(std::time::Instant::now() < deadline, "{text}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert!(
        counter(&text, "connections_refused_rate_per_client_total") >= 10,
        "{text}"
    );
    assert_eq!(
        counter(&text, "connections_refused_per_client_total"),
        0,
        "{text}"
    );
    let warned = errors
        .map_while(Result::ok)
        .find(|l| l.contains("connection_rate_per_client"))
        .unwrap();
    assert!(warned.contains("127.0.0.1"), "{warned}");
    drop(held);
}

/// `--ticket-key-secs` (TOML `ticket_key_secs`) sets how long the middlebox seals tickets
/// under one key; zero is refused at start-up with a clear error, a positive value starts.
/// Service timeouts beyond a year are refused at the start (a deadline that far overflows the
/// clock, which made every connection panic); a simulated platform key the middlebox creates is
/// readable by its owner only, and it never writes through a link left in its place.
#[test]
fn service_settings_and_the_simulated_key_file_are_checked() {
    use std::os::unix::fs::PermissionsExt;
    let (dir, _pki, _server, mbox) = pki_files("mbx cli mbtls service settings root", "mb.test");
    // A middlebox with `extra` flags refused at start: its error.
    let refused_middlebox = |extra: &[&std::ffi::OsStr]| -> String {
        let mut args = service_args(
            "middlebox",
            "127.0.0.1:0",
            ("--next-hop", "127.0.0.1:9"),
            &mbox,
        );
        args.extend(extra);
        let (status, err) = refused_at_start(&args);
        assert!(
            status.is_some_and(|s| !s.success()),
            "{extra:?}: {status:?}: {err}"
        );
        err
    };
    let os = std::ffi::OsStr::new;
    // A drain time that large panicked at the stop signal (found in an operator trial).
    for flag in [
        "--handshake-timeout-secs",
        "--idle-timeout-secs",
        "--drain-secs",
    ] {
        let err = refused_middlebox(&[os(flag), os("18446744073709551615")]);
        assert!(err.contains("must be at most 31536000"), "{flag}: {err}");
        // Only the idle timeout is off at 0.
        let off = err.contains("0 for no idle timeout");
        assert_eq!(off, flag == "--idle-timeout-secs", "{flag}: {err}");
    }
    let err = refused_middlebox(&[os("--max-connections-per-client"), os("0")]);
    assert!(
        err.contains("max_connections_per_client must be at least 1"),
        "{err}"
    );
    for (flags, said) in [
        (
            &["--forget-legacy-after-secs", "5"][..],
            "forget_legacy_after_secs is for a server-side middlebox (--server-side)",
        ),
        (
            &["--connection-rate-per-client", "0"],
            "connection_rate_per_client must be at least 1",
        ),
        (
            &["--connection-burst-per-client", "5"],
            "connection_burst_per_client needs connection_rate_per_client",
        ),
        (
            &[
                "--connection-rate-per-client",
                "5",
                "--connection-burst-per-client",
                "0",
            ],
            "connection_burst_per_client must be at least 1",
        ),
        (
            &["--connection-rate-per-client", "4294967296"],
            "connection_rate_per_client must be at most 4294967295",
        ),
    ] {
        let err = refused_middlebox(&flags.iter().map(|f| os(f)).collect::<Vec<_>>());
        assert!(err.contains(said), "{flags:?}: {err}");
    }
    // More connections than the open-files limit has descriptors for (the middlebox raises
    // its soft limit to the hard one, so only an unlimited hard limit takes any number).
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap();
    let hard = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(4));
    if hard != Some("unlimited") {
        let err = refused_middlebox(&[os("--max-connections"), os("18446744073709551615")]);
        assert!(
            err.contains("is more than the open-files limit") && err.contains("ulimit -n"),
            "{err}"
        );
    }
    let key = dir.path().join("platform.key");
    let key_arg = key.to_str().unwrap();
    let (_mb, _lines, head) = start_middlebox(
        "127.0.0.1:9",
        &mbox,
        &["--attester", "sim", "--sim-platform-key", key_arg],
        4,
    );
    assert!(head[2].contains("SIMULATED TEE"), "{head:?}");
    let mode = std::fs::metadata(&key).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "{mode:o}");
    // A dangling link where the key should be: refused, the link's target not created.
    let link = dir.path().join("linked.key");
    let target = dir.path().join("elsewhere.key");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    refused_middlebox(&[
        os("--attester"),
        os("sim"),
        os("--sim-platform-key"),
        link.as_os_str(),
    ]);
    assert!(!target.exists());
    // A number past what a setting can hold names the setting; a platform key file that is
    // not a key names the file.
    let err = refused_middlebox(&[os("--ticket-key-secs"), os("18446744073709551615")]);
    assert!(
        err.contains("ticket_key_secs 18446744073709551615 is too large"),
        "{err}"
    );
    let not_a_key = dir.path().join("not-a.key");
    std::fs::write(&not_a_key, "ca14aa\n").unwrap();
    let err = refused_middlebox(&[
        os("--attester"),
        os("sim"),
        os("--sim-platform-key"),
        not_a_key.as_os_str(),
    ]);
    assert!(
        err.contains(&format!("simulated platform key {}", not_a_key.display())),
        "{err}"
    );
}

/// A certificate and a key given the wrong way round, or a CA's key given as its certificate,
/// are refused at start with the file named, not deep in the TLS library.
#[test]
fn pem_files_of_the_wrong_kind_are_named() {
    use std::ffi::OsStr;
    let (dir, _pki, server, mbox) = pki_files("mbx cli mbtls pem root", "mb.test");
    // The server's arguments with the values of --certificate and --private-key swapped.
    let mut swapped = mbtls_server_args("127.0.0.1:0", "127.0.0.1:9", &server);
    let cert = swapped
        .iter()
        .position(|a| *a == OsStr::new("--certificate"))
        .unwrap();
    let key = swapped
        .iter()
        .position(|a| *a == OsStr::new("--private-key"))
        .unwrap();
    swapped.swap(cert + 1, key + 1);
    let err = refused(&swapped);
    assert!(
        err.contains(&format!(
            "certificate {} holds no PEM certificate",
            server.key.display()
        )) && err.contains("swapped?"),
        "{err}"
    );
    let mut key_as_ca = mbtls_server_args("127.0.0.1:0", "127.0.0.1:9", &server);
    key_as_ca.extend([
        OsStr::new("--middlebox-name"),
        OsStr::new("mb.test"),
        OsStr::new("--middlebox-ca"),
        server.key.as_os_str(),
    ]);
    let err = refused(&key_as_ca);
    assert!(
        err.contains("middlebox CA file") && err.contains("holds no PEM certificate"),
        "{err}"
    );
    // A key that is not the certificate's (the middlebox's key with the server's certificate)
    // names both files, where OpenSSL said "key values mismatch"; a signing request given as
    // the certificate says so.
    let mut mismatched = mbtls_server_args("127.0.0.1:0", "127.0.0.1:9", &server);
    set_flag(&mut mismatched, "--private-key", mbox.key.as_os_str());
    let err = refused(&mismatched);
    assert!(
        err.contains(&format!(
            "private key {} does not belong to certificate {}",
            mbox.key.display(),
            server.chain.display()
        )),
        "{err}"
    );
    let csr = dir.path().join("server.csr");
    openssl_writes(
        &["req", "-new", "-subj", "/CN=server.test", "-key"],
        &server.key,
        &csr,
    );
    let mut request = mbtls_server_args("127.0.0.1:0", "127.0.0.1:9", &server);
    set_flag(&mut request, "--certificate", csr.as_os_str());
    let err = refused(&request);
    assert!(
        err.contains("it holds a certificate signing request"),
        "{err}"
    );
}

/// An encrypted (passphrase-protected) key is refused with one line saying so: OpenSSL would
/// ask for the passphrase on the terminal at every start and reload, which stopped a server
/// that reloaded, or print a page of errors without a terminal. A chain whose leaf is not
/// first (`cat ca.pem leaf.pem`) is named as such, not as a key of another certificate. So
/// are a relative path that is not found (with the directory it was read from) and a backend
/// that is the server's own address (all found in user trials).
#[test]
fn an_encrypted_key_and_a_chain_in_the_wrong_order_are_named() {
    use std::ffi::OsStr;
    let (dir, _pki, server, _mbox) = pki_files("mbx cli mbtls key root", "mb.test");
    let encrypted = dir.path().join("encrypted.key");
    openssl_writes(
        &["pkey", "-aes256", "-passout", "pass:secret", "-in"],
        &server.key,
        &encrypted,
    );
    let mut args = mbtls_server_args("127.0.0.1:0", "127.0.0.1:9", &server);
    set_flag(&mut args, "--private-key", encrypted.as_os_str());
    let (status, err) = refused_at_start(&args);
    assert_eq!(status.and_then(|s| s.code()), Some(1), "{err}");
    assert!(
        err.contains("encrypted.key is encrypted (passphrase-protected)")
            && err.lines().count() == 1,
        "{err}"
    );
    // A relative path that is not found names the directory it was read from.
    let mut args = mbtls_server_args("127.0.0.1:0", "127.0.0.1:9", &server);
    set_flag(&mut args, "--private-key", OsStr::new("no-such.key"));
    let err = refused(&args);
    assert!(
        err.contains("cannot read private key no-such.key (a relative path is read from the working directory, "),
        "{err}"
    );
    // A backend that is the server's own address.
    let args = mbtls_server_args("127.0.0.1:8443", "127.0.0.1:8443", &server);
    let err = refused(&args);
    assert!(
        err.contains("backend (--backend) 127.0.0.1:8443 is this server's own listening address"),
        "{err}"
    );
    let leaf_last = dir.path().join("leaf-last.pem");
    let chain = std::fs::read_to_string(&server.chain).unwrap();
    let ca = std::fs::read_to_string(&server.ca).unwrap();
    std::fs::write(&leaf_last, format!("{ca}{chain}")).unwrap();
    let mut args = mbtls_server_args("127.0.0.1:0", "127.0.0.1:9", &server);
    set_flag(&mut args, "--certificate", leaf_last.as_os_str());
    let err = refused(&args);
    assert!(
        err.contains("lists its certificates in the wrong order")
            && err.contains("certificate 2 of the file (CN=server.test")
            && err.contains("the leaf must come first"),
        "{err}"
    );
}

/// A server or middlebox whose standard output cannot be written (a full disk behind
/// `> file`, a reader that left) serves anyway and stops cleanly: its banner lines went
/// through `println!`, which panicked (exit 101) before the first connection (found in a user
/// trial; the report lines already ignored the failure).
#[test]
fn services_whose_standard_output_fails_serve_anyway() {
    use std::io::Read;
    let (_dir, _pki, server, mbox) = pki_files("mbx cli mbtls stdout root", "mb.test");
    for (role, files, next) in [
        ("server", &server, ("--backend", "127.0.0.1:9")),
        ("middlebox", &mbox, ("--next-hop", "127.0.0.1:9")),
    ] {
        let listen = {
            let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            free.local_addr().unwrap().to_string()
        };
        let full = std::fs::File::options()
            .write(true)
            .open("/dev/full")
            .unwrap();
        let child = mbx()
            .args(service_args(role, &listen, next, files))
            .stdin(Stdio::null())
            .stdout(full)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut guard = ChildGuard::new(child);
        // Accepting connections, however long it took to start: a process that panicked at
        // its banner never does.
        let deadline = std::time::Instant::now() + common::LINE_WAIT;
        while std::net::TcpStream::connect(&listen).is_err() {
            assert!(guard.try_wait().is_none(), "{role} stopped before serving");
            assert!(std::time::Instant::now() < deadline, "{role} never served");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        signal(&mut guard, Signal::TERM);
        let status = guard.wait_timeout(std::time::Duration::from_secs(60));
        let mut err = String::new();
        if let Some(stderr) = guard.child_mut().and_then(|c| c.stderr.as_mut()) {
            let _ = stderr.read_to_string(&mut err);
        }
        assert!(
            status.is_some_and(|s| s.success()) && !err.contains("panicked"),
            "{role}: {status:?}: {err}"
        );
    }
}

/// Runs `openssl <args> <input> -out <out>`, which must succeed.
fn openssl_writes(args: &[&str], input: &std::path::Path, out: &std::path::Path) {
    run_ok(
        std::process::Command::new("openssl")
            .args(args)
            .arg(input)
            .arg("-out")
            .arg(out),
    );
}

/// `args` with the value after `flag` replaced by `value`.
fn set_flag<'a>(args: &mut [&'a std::ffi::OsStr], flag: &str, value: &'a std::ffi::OsStr) {
    let at = args
        .iter()
        .position(|a| *a == std::ffi::OsStr::new(flag))
        .unwrap_or_else(|| panic!("no {flag} in {args:?}"));
    args[at + 1] = value;
}

/// [`refused_at_start`] for a start that must fail: its standard error.
fn refused(args: &[&std::ffi::OsStr]) -> String {
    let (status, err) = refused_at_start(args);
    assert!(status.is_some_and(|s| !s.success()), "{status:?}: {err}");
    err
}

/// Runs `mbx` with `args`, expecting it to stop by itself at once: its exit status (`None` if
/// it was still running after a minute, then killed) and its standard error.
fn refused_at_start(args: &[&std::ffi::OsStr]) -> (Option<std::process::ExitStatus>, String) {
    use std::io::Read;
    let child = mbx()
        .args(args)
        .env_remove("MBX_CONFIG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut guard = ChildGuard::new(child);
    let status = guard.wait_timeout(std::time::Duration::from_secs(60));
    let mut err = String::new();
    if let Some(stderr) = guard.child_mut().and_then(|c| c.stderr.as_mut()) {
        let _ = stderr.read_to_string(&mut err);
    }
    (status, err)
}

#[test]
fn the_middleboxs_ticket_key_period_is_checked() {
    let (_dir, _pki, _server, mbox) = pki_files("mbx cli mbtls ticket key root", "mb.test");
    let mut args = service_args(
        "middlebox",
        "127.0.0.1:0",
        ("--next-hop", "127.0.0.1:9"),
        &mbox,
    );
    args.extend(["--ticket-key-secs", "0"].map(std::ffi::OsStr::new));
    let err = refused(&args);
    assert!(err.contains("ticket_key_secs must be at least 1"), "{err}");
    let (_mb, _lines, head) =
        start_middlebox("127.0.0.1:9", &mbox, &["--ticket-key-secs", "90"], 4);
    assert!(
        head[0].starts_with("mbTLS middlebox listening on"),
        "{head:?}"
    );
}

/// Options that would be ignored are refused with a message naming them, instead of being
/// dropped in silence: an attester's option given for another attester, `--timeout-secs`
/// with `--proxy` (its sessions have the service's timeouts), `max_discovered` beside
/// pre-configured names, and a log filter that does not parse. Names and a policy given as
/// flags replace a config file's instead of clashing with them.
#[test]
fn options_that_would_be_ignored_are_refused() {
    use std::ffi::OsStr;
    let (dir, _pki, server, mbox) = pki_files("mbx cli mbtls ignored options root", "mb.test");
    let key = dir.path().join("platform.key");
    let collateral = dir.path().join("collateral.json");
    for (attester, option, path, expected) in [
        (
            "none",
            "--sim-platform-key",
            &key,
            "sim_platform_key applies to attester sim only, not to attester \"none\"",
        ),
        (
            "sim",
            "--dcap-collateral",
            &collateral,
            "dcap_collateral applies to attester gramine or tdx only",
        ),
        (
            "sim",
            "--gramine-attestation-dir",
            &collateral,
            "gramine_attestation_dir applies to attester gramine only",
        ),
        (
            "gramine",
            "--tsm-report-entry",
            &collateral,
            "tsm_report_entry applies to attester tdx only",
        ),
    ] {
        let mut args = service_args(
            "middlebox",
            "127.0.0.1:0",
            ("--next-hop", "127.0.0.1:9"),
            &mbox,
        );
        args.extend([
            OsStr::new("--attester"),
            OsStr::new(attester),
            OsStr::new(option),
        ]);
        args.push(path.as_os_str());
        if attester == "sim" {
            // A key the sim attester would create: it must not be, since the start is refused.
            args.extend([OsStr::new("--sim-platform-key"), key.as_os_str()]);
        }
        let err = refused(&args);
        assert!(err.contains(expected), "{option}: {err}");
        assert!(!key.exists(), "nothing is created for an ignored option");
    }

    let client = |extra: &[&str]| {
        let mut args: Vec<&OsStr> = ["mbtls", "client", "https://server.test/"]
            .map(OsStr::new)
            .to_vec();
        args.extend(extra.iter().map(OsStr::new));
        args.extend([OsStr::new("--server-ca"), server.ca.as_os_str()]);
        refused_at_start(&args)
    };
    let (status, err) = client(&["--proxy", "127.0.0.1:0", "--timeout-secs", "5"]);
    assert!(status.is_some_and(|s| !s.success()), "{status:?}");
    assert!(err.contains("--timeout-secs bounds one fetch"), "{err}");
    let (status, err) = client(&[
        "--middlebox",
        "127.0.0.1:9",
        "--middlebox-name",
        "mb.test",
        "--max-discovered",
        "2",
    ]);
    assert!(status.is_some_and(|s| !s.success()), "{status:?}");
    assert!(
        err.contains("max_discovered (--max-discovered) applies to discovery"),
        "{err}"
    );
    let (status, err) = client(&["--log", "mbx=[[[", "--middlebox", "127.0.0.1:9"]);
    assert_eq!(status.and_then(|s| s.code()), Some(2), "{err}");
    assert!(err.contains("invalid log filter"), "{err}");

    // A file's names and discovery settings and one name as a flag, a file's inline policy
    // and a policy file as a flag: the flags win, and the client gets as far as the (closed)
    // first hop.
    let config = dir.path().join("names.toml");
    std::fs::write(
        &config,
        "[mbtls.client]\nmiddlebox_names = [\"a.test\", \"b.test\"]\n\
         allow_middleboxes = [\"c.test\"]\nmax_discovered = 2\n\
         [mbtls.client.attestation]\nallow_simulated = true\n",
    )
    .unwrap();
    let policy = no_evidence_policy(&dir);
    let (status, err) = client(&[
        "--config",
        config.to_str().unwrap(),
        "--policy",
        policy.to_str().unwrap(),
        "--middlebox",
        "127.0.0.1:9",
        "--middlebox-name",
        "mb.test",
        "--timeout-secs",
        "5",
    ]);
    assert!(status.is_some_and(|s| !s.success()), "{status:?}");
    assert!(!err.contains("not both"), "{err}");
    assert!(
        err.contains("mbTLS session through 127.0.0.1:9 failed"),
        "{err}"
    );

    // The server alike: max_discovered beside names is refused, and names given as flags
    // replace the file's path and discovery settings instead of lengthening or clashing.
    let server_config = dir.path().join("server.toml");
    std::fs::write(
        &server_config,
        "[mbtls.server]\nmiddlebox_names = [\"a.test\", \"b.test\"]\n\
         allow_middleboxes = [\"c.test\"]\nmax_discovered = 2\n",
    )
    .unwrap();
    let mut base: Vec<&OsStr> = vec![OsStr::new("--config"), server_config.as_os_str()];
    base.extend(mbtls_server_args("127.0.0.1:0", "127.0.0.1:9", &server));
    base.extend([OsStr::new("--middlebox-ca"), server.ca.as_os_str()]);
    let with = |extra: &[&'static str]| -> Vec<&OsStr> {
        let mut args = base.clone();
        args.extend(extra.iter().copied().map(OsStr::new));
        args
    };
    let both = with(&["--middlebox-name", "mb.test", "--max-discovered", "2"]);
    let err = refused(&both);
    assert!(
        err.contains("max_discovered (--max-discovered) applies to discovery"),
        "{err}"
    );
    // Ticket keys without tickets.
    let err = refused(&with(&["--ticket-key-secs", "60"]));
    assert!(err.contains("applies with session_tickets"), "{err}");
    let (_srv, _lines, head) = start(&with(&["--middlebox-name", "mb.test"]), 2);
    // With the default attestation policy no middlebox can pass: the banner says so at once.
    assert!(
        head[1].starts_with("server-side middlebox: pre-configured mb.test (required); attestation policy: evidence required, 0 measurements accepted")
            && head[1].contains("WARNING: no middlebox can pass it"),
        "{head:?}"
    );
    // What checks middleboxes, given where none may join (the file's names replaced by an
    // empty allow-list is not possible, so without the file): an operator who forgot the
    // name is told, where the server started and served every session without it.
    let mut bare = mbtls_server_args("127.0.0.1:0", "127.0.0.1:9", &server);
    bare.extend(
        [
            "--middlebox-ca",
            "unread.pem",
            "--allow-simulated",
            "--fresh-evidence",
            "--max-discovered",
            "2",
            "--announcements-after-hello",
        ]
        .map(OsStr::new),
    );
    let err = refused(&bare);
    assert!(
        err.contains(
            "middlebox_ca (--middlebox-ca), allow_simulated (--allow-simulated), \
             middlebox_resumption (--fresh-evidence), max_discovered (--max-discovered), \
             announcements_after_hello (--announcements-after-hello) \
             would be ignored: no middlebox may join"
        ),
        "{err}"
    );
    // Late announcements are for discovery: pre-configured middleboxes need no option.
    let mut named = mbtls_server_args("127.0.0.1:0", "127.0.0.1:9", &server);
    named.extend(
        [
            "--middlebox-name",
            "mb.test",
            "--announcements-after-hello",
            "--middlebox-ca",
        ]
        .map(OsStr::new),
    );
    named.push(server.ca.as_os_str());
    let err = refused(&named);
    assert!(
        err.contains(
            "announcements_after_hello (--announcements-after-hello) is for discovered middleboxes"
        ),
        "{err}"
    );
    // Names that match no certificate: a pattern (compared exactly, it matched nothing) and
    // an empty name; on the client too.
    for (flag, name, said) in [
        ("--allow-middlebox", "*.test", "\"*.test\" is a pattern"),
        ("--middlebox-name", "", "a middlebox name is empty"),
    ] {
        let mut args = mbtls_server_args("127.0.0.1:0", "127.0.0.1:9", &server);
        args.extend([flag, name, "--middlebox-ca"].map(OsStr::new));
        args.push(server.ca.as_os_str());
        let err = refused(&args);
        assert!(err.contains(said), "{flag} {name:?}: {err}");
        let (status, err) = client(&["--middlebox", "127.0.0.1:9", flag, name]);
        assert!(
            status.is_some_and(|s| !s.success()),
            "{flag} {name:?}: {status:?}"
        );
        assert!(err.contains(said), "client {flag} {name:?}: {err}");
    }
}

/// `--report-format json` on the three services: every line on standard output is one JSON
/// object with its time and event (a banner's first line as `"listening"` with the service's
/// limits and facts, its others as notices), and each session's report gives
/// its facts as fields that agree across the path: the client proxy's two hops are the
/// middlebox's client and server hops, by their key fingerprints (the server, which no
/// middlebox of its own side could join, kept its keys in OpenSSL and lists none); the proxy's
/// verdict names the middlebox it verified.
#[test]
fn json_reports_from_a_client_proxy_a_middlebox_and_a_server() {
    use serde_json::{json, Value};
    use std::ffi::OsStr;
    let (dir, _pki, server, mbox) = pki_files("mbx cli json reports root", "mb.test");
    let backend = echo_backend().to_string();
    let server_addr = format!("127.0.0.1:{}", mbx_testbed::peers::free_port().unwrap());
    let parse = |line: &str, event: &str| -> Value {
        let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert_eq!(v["event"], event, "{line}");
        assert!(
            v["service"].is_string() && v["listen"].is_string() && v["pid"].is_u64(),
            "{line}"
        );
        let time = v["time"].as_str().unwrap_or_else(|| panic!("{line}"));
        assert!(time.len() == 24 && time.ends_with('Z'), "{line}");
        v
    };
    // The banners: a "listening" event, then notices; the text lines, and the first's fields.
    let banner_fields = |head: &[String]| -> (Vec<String>, Value) {
        let first = parse(&head[0], "listening");
        let rest = head[1..].iter().map(|l| parse(l, "notice"));
        let text = std::iter::once(first.clone())
            .chain(rest)
            .map(|v| v["text"].as_str().unwrap().to_owned())
            .collect();
        (text, first)
    };
    // What a banner's limits line ("limits: handshake 60s, idle 600s, at most 9980 sessions
    // at once", and ", 2 per client address" with that limit) says, as the JSON fields should
    // give it.
    let limits_said = |line: &str| -> Value {
        let words: Vec<&str> = line.split([' ', ',']).filter(|w| !w.is_empty()).collect();
        let secs = |w: &str| w.strip_suffix('s').and_then(|n| n.parse::<u64>().ok());
        assert_eq!(
            (words[0], words[5], words[6]),
            ("limits:", "at", "most"),
            "{line}"
        );
        // ", N per client address" and ", N new per second per client address (burst B)".
        let part = |ends: &str| {
            line.split(", ")
                .find_map(|p| p.strip_suffix(ends))
                .and_then(|n| n.parse::<u64>().ok())
        };
        let rate = line
            .split(", ")
            .find_map(|p| p.split_once(" new per second per client address (burst "));
        let number = |n: Option<&str>| {
            let digits = n?.split(|c: char| !c.is_ascii_digit()).next()?;
            digits.parse::<u64>().ok()
        };
        json!({
            "handshake_timeout_secs": secs(words[2]),
            "idle_timeout_secs": secs(words[4]),
            "max_open": words[7].parse::<u64>().ok(),
            "max_open_per_client": part(" per client address"),
            "new_per_second_per_client": number(rate.map(|r| r.0)),
            "burst_per_client": number(rate.map(|r| r.1)),
        })
    };
    // A config file, for the reloads at the end.
    let server_config = dir.path().join("server.toml");
    std::fs::write(&server_config, "[mbtls.server]\n").unwrap();
    let mut server_args = mbtls_server_args(&server_addr, &backend, &server);
    server_args.extend(["--report-format", "json"].map(OsStr::new));
    server_args.splice(0..0, [OsStr::new("--config"), server_config.as_os_str()]);
    let (mut srv, mut srv_lines, srv_head) = start(&server_args, 3);
    let (srv_head, listening) = banner_fields(&srv_head);
    assert!(
        srv_head[0].starts_with("mbTLS server listening on "),
        "{srv_head:?}"
    );
    // The limits as the banner's line says them: the defaults, and at most as many sessions
    // as the process may open descriptors for.
    let default_limits = limits_said(&srv_head[2]);
    assert!(
        srv_head[2].starts_with("limits: handshake 60s, idle 600s, at most "),
        "{srv_head:?}"
    );
    assert!(default_limits["max_open"].is_u64(), "{srv_head:?}");
    assert_eq!(
        (&listening["backend"], &listening["limits"]),
        (&json!(backend), &default_limits),
        "{listening}"
    );
    let (_mb, mut mb_lines, mb_head) =
        start_middlebox(&server_addr, &mbox, &["--report-format", "json"], 4);
    let (mb_head, listening) = banner_fields(&mb_head);
    let mb_addr = listening_addr(&mb_head[0]);
    assert_eq!(
        (
            &listening["next_hop"],
            &listening["transparent"],
            &listening["side"]
        ),
        (&json!(server_addr), &json!(false), &json!("client")),
        "{listening}"
    );
    assert_eq!(listening["limits"], limits_said(&mb_head[3]), "{listening}");
    let policy = no_evidence_policy(&dir);
    let (_proxy, mut proxy_lines, phead) = start_proxy(
        &server,
        &policy,
        &[
            "--middlebox",
            &mb_addr,
            "--middlebox-name",
            "mb.test",
            "--report-format",
            "json",
        ],
    );
    let (phead, listening) = banner_fields(&phead);
    let proxy_addr = listening_addr(&phead[0]);
    assert_eq!(listening["limits"], limits_said(&phead[1]), "{listening}");
    assert_eq!(
        [
            &listening["server_name"],
            &listening["first_hop"],
            &listening["middleboxes"],
            &listening["max_discovered"]
        ],
        [
            &json!("server.test"),
            &json!(mb_addr),
            &json!(["mb.test"]),
            &json!(0)
        ],
        "{listening}"
    );
    let out = mbx_testbed::Curl::new(&format!("http://{proxy_addr}/json"))
        .header("Host: server.test")
        .run()
        .unwrap();
    assert_eq!(out.status, Some(200), "{}", out.verbose);

    let p = parse(&proxy_lines.next().unwrap().unwrap(), "session");
    let m = parse(&mb_lines.next().unwrap().unwrap(), "session");
    let s = parse(&srv_lines.next().unwrap().unwrap(), "session");
    assert_eq!(
        (&p["role"], &m["role"], &s["role"]),
        (
            &json!("client-proxy"),
            &json!("middlebox"),
            &json!("server")
        )
    );
    for v in [&p, &m, &s] {
        assert_eq!((&v["ok"], &v["error"]), (&json!(true), &Value::Null), "{v}");
        assert_eq!(
            (&v["error_kind"], &v["cut_at_stop"]),
            (&Value::Null, &json!(false)),
            "{v}"
        );
        assert_eq!(v["version"], "TLS 1.3", "{v}");
        assert!(v["text"].as_str().is_some_and(|t| !t.is_empty()), "{v}");
        // Each party's handshake was over within its session, both counted from its accept.
        let (handshake, total) = (v["handshake_ms"].as_f64(), v["duration_ms"].as_f64());
        assert!(
            handshake.zip(total).is_some_and(|(h, t)| 0.0 < h && h <= t),
            "{v}"
        );
    }
    let hops = p["hops"].as_array().unwrap();
    assert_eq!(hops.len(), 2, "{p}");
    assert_eq!((&m["client_hop"], &m["server_hop"]), (&hops[0], &hops[1]));
    // No middlebox of the server's side could join: its keys stayed in OpenSSL.
    assert_eq!(s["hops"], json!([]), "{s}");
    assert_ne!(hops[0], hops[1]);
    assert!(
        hops[0]["c2s"].as_str().is_some_and(|f| f.len() == 16),
        "{p}"
    );
    assert_eq!(
        (&m["joined"], &m["secondary_session_started"]),
        (&json!(true), &json!(true)),
        "{m}"
    );
    // Each line names its service and where it listens; the middlebox saw the proxy's
    // connection come from the address the proxy reports.
    assert_eq!(m["listen"], mb_addr.as_str(), "{m}");
    assert_eq!(s["listen"], server_addr.as_str(), "{s}");
    assert_eq!(s["pid"].as_u64(), srv.id().map(u64::from), "{s}");
    assert_eq!(p["listen"], proxy_addr.as_str(), "{p}");
    assert!(m["client"].is_string(), "{m}");
    assert_eq!(m["client"], p["first_hop_local"], "{m} {p}");
    assert_eq!(m["left_without_close_notify"], "none", "{m}");
    for v in [&p, &s] {
        assert_eq!(v["peer_left_without_close_notify"], false, "{v}");
        assert_eq!(v["failed_on_middlebox"], Value::Null, "{v}");
    }
    assert_eq!(p["middleboxes"], json!(["mb.test"]), "{p}");
    assert_eq!(p["verdicts"][0]["middlebox"], "mb.test", "{p}");
    assert_eq!(p["verdicts"][0]["verdict"], "verified", "{p}");
    assert_eq!(s["verdicts"], json!([]), "{s}");
    assert!(p["bytes_up"].as_u64().is_some_and(|n| n > 0), "{p}");
    assert!(s["bytes_to_backend"].as_u64().is_some_and(|n| n > 0), "{s}");
    // A reload is an event of its own, applied or refused (the refusal is on standard error
    // too, as in text mode).
    signal(&mut srv, Signal::HUP);
    let r = parse(&srv_lines.next().unwrap().unwrap(), "reload");
    assert_eq!(
        (&r["applied"], &r["error"]),
        (&json!(true), &Value::Null),
        "{r}"
    );
    assert!(
        r["text"].as_str().unwrap().starts_with("server reloaded: "),
        "{r}"
    );
    assert_eq!(
        (&r["limits"], &r["limits_changed"], &r["backend"]),
        (&default_limits, &json!(false), &json!(backend)),
        "{r}"
    );
    // A changed limit: the limits now in force, marked as changed.
    std::fs::write(
        &server_config,
        "[mbtls.server]\nmax_connections = 7\nmax_connections_per_client = 2\nconnection_rate_per_client = 50\nconnection_burst_per_client = 80\n",
    )
    .unwrap();
    signal(&mut srv, Signal::HUP);
    let r = parse(&srv_lines.next().unwrap().unwrap(), "reload");
    let mut limits = default_limits.clone();
    limits["max_open"] = json!(7);
    limits["max_open_per_client"] = json!(2);
    limits["new_per_second_per_client"] = json!(50);
    limits["burst_per_client"] = json!(80);
    // What the reload's text says, its fields say.
    let said = r["text"].as_str().unwrap().to_owned();
    let limits_part = said
        .split("limits: ")
        .nth(1)
        .map(|l| format!("limits: {l}"));
    if let Some(line) = limits_part {
        assert_eq!(limits_said(&line), limits, "{said}");
    }
    assert_eq!(
        (&r["applied"], &r["limits"], &r["limits_changed"]),
        (&json!(true), &limits, &json!(true)),
        "{r}"
    );
    // A key given twice: the TOML parser's message, which ends with a line break.
    std::fs::write(&server_config, "[mbtls.server]\nbogus = 1\nbogus = 2\n").unwrap();
    signal(&mut srv, Signal::HUP);
    let r = parse(&srv_lines.next().unwrap().unwrap(), "reload");
    assert_eq!(r["applied"], false, "{r}");
    // The configuration's fields are null, the same keys as when applied.
    assert_eq!(
        (&r["limits"], &r["limits_changed"], &r["backend"]),
        (&Value::Null, &Value::Null, &Value::Null),
        "{r}"
    );
    assert!(r.as_object().unwrap().contains_key("backend"), "{r}");
    assert!(
        r["error"].as_str().is_some_and(|e| !e.ends_with('\n')),
        "{r}"
    );
    assert!(
        r["error"].as_str().is_some_and(|e| e.contains("bogus")),
        "{r}"
    );
    // A stop, in its phases, with the same keys in each.
    signal(&mut srv, Signal::TERM);
    let stop = |line: &str| {
        let v = parse(line, "stop");
        let fields = ["phase", "grace_secs", "open", "cut", "cause"].map(|k| v.get(k).cloned());
        (v, fields)
    };
    let (v, fields) = stop(&srv_lines.next().unwrap().unwrap());
    assert_eq!(
        fields,
        [
            Some(json!("draining")),
            Some(json!(10)),
            Some(json!(0)),
            Some(Value::Null),
            Some(Value::Null)
        ],
        "{v}"
    );
    assert!(
        v["text"]
            .as_str()
            .unwrap()
            .starts_with("server stopping: no new sessions"),
        "{v}"
    );
    let (v, fields) = stop(&srv_lines.next().unwrap().unwrap());
    assert_eq!(
        fields,
        [
            Some(json!("stopped")),
            Some(Value::Null),
            Some(Value::Null),
            Some(json!(0)),
            Some(Value::Null)
        ],
        "{v}"
    );
    assert_eq!(v["text"], "server stopped (0 sessions cut)", "{v}");
    // A value that does not parse in the config file: exit status 2, and every line of the
    // error (the TOML library's message has two) starts with the prefix.
    let config = dir.path().join("yaml.toml");
    std::fs::write(&config, "[mbtls.middlebox]\nreport_format = \"yaml\"\n").unwrap();
    let mut args = service_args(
        "middlebox",
        "127.0.0.1:0",
        ("--next-hop", &server_addr),
        &mbox,
    );
    args.splice(0..0, [OsStr::new("--config"), config.as_os_str()]);
    let (status, err) = refused_at_start(&args);
    assert_eq!(status.and_then(|s| s.code()), Some(2), "{err}");
    assert!(
        err.contains("report_format is \"text\" or \"json\", not \"yaml\"")
            && err.lines().count() > 1,
        "{err}"
    );
    assert!(err.lines().all(|l| l.starts_with("mbx: error: ")), "{err}");
}
