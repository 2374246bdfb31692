//! Real peers with test-PKI certificates: `openssl s_server` and nginx fetched with curl over
//! TLS 1.2 and 1.3, s_client against s_server, nginx logging a header sent by curl.

use std::net::{IpAddr, Ipv4Addr};

use mbx_testbed::peers::{
    ensure_tool, free_port, Curl, Nginx, OpensslClient, OpensslServer, ServerMode, TlsVersion,
};
use mbx_testbed::pki::{KeyType, LeafSpec, TestPki};

const LOCAL: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

#[test]
fn ensure_tool_finds_installed_tools() {
    let p = ensure_tool("openssl", "openssl").unwrap();
    assert!(p.is_absolute() && p.ends_with("openssl"));
    assert!(ensure_tool("curl", "curl").unwrap().ends_with("curl"));
}

#[test]
fn free_port_is_bindable() {
    let port = free_port().unwrap();
    assert_ne!(port, 0);
    std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, port)).unwrap();
}

#[test]
fn s_server_www_fetched_by_curl_tls12_and_tls13() {
    let dir = tempfile::tempdir().unwrap();
    let pki = TestPki::new("s_server").unwrap();
    let files = pki
        .issue(&LeafSpec::server("server.test").key_type(KeyType::EcdsaP256))
        .unwrap()
        .write_to(dir.path())
        .unwrap();
    for (version, name) in [
        (TlsVersion::Tls12, "TLSv1.2"),
        (TlsVersion::Tls13, "TLSv1.3"),
    ] {
        let server = OpensslServer::from_files(&files)
            .version(version)
            .mode(ServerMode::Www)
            .start()
            .unwrap();
        let url = format!("https://server.test:{}/", server.port());
        let out = Curl::new(&url)
            .cacert(&files.ca)
            .resolve("server.test", server.port(), LOCAL)
            .version(version)
            .run()
            .unwrap();
        assert_eq!(out.exit_code, Some(0), "{}", out.verbose);
        assert_eq!(out.status, Some(200));
        assert_eq!(out.tls_version().as_deref(), Some(name));
        // s_server's status page names the negotiated protocol.
        assert!(
            out.body_str().contains(&format!("New, {name}")),
            "{}",
            out.body_str()
        );

        // Negative: the same server under an unrelated CA fails verification (curl exit 60).
        let other = TestPki::new("unrelated").unwrap();
        let odir = tempfile::tempdir().unwrap();
        let ofiles = other
            .issue(&LeafSpec::server("x.test"))
            .unwrap()
            .write_to(odir.path())
            .unwrap();
        let bad = Curl::new(&url)
            .cacert(&ofiles.ca)
            .resolve("server.test", server.port(), LOCAL)
            .run()
            .unwrap();
        assert_eq!(bad.exit_code, Some(60), "{}", bad.verbose);
        assert_eq!(bad.status, None);
    }
}

#[test]
fn s_client_talks_to_reversing_s_server_through_intermediate_chain() {
    let dir = tempfile::tempdir().unwrap();
    let pki = TestPki::new("rev").unwrap();
    let inter = pki.intermediate("rev-issuing").unwrap();
    let files = inter
        .issue(&LeafSpec::server("rev.test").key_type(KeyType::Ed25519))
        .unwrap()
        .write_to(dir.path())
        .unwrap();
    let server = OpensslServer::from_files(&files)
        .version(TlsVersion::Tls13)
        .mode(ServerMode::Reverse)
        .start()
        .unwrap();
    let out = OpensslClient::new(server.addr())
        .servername("rev.test")
        .cafile(&files.ca)
        .version(TlsVersion::Tls13)
        .input("hello mbx\nCLOSE\n")
        .run()
        .unwrap();
    let stdout = out.stdout_str();
    assert!(out.status.success(), "{stdout}\n{}", out.stderr_str());
    assert!(stdout.contains("xbm olleh"), "{stdout}");
    assert!(stdout.contains("Verify return code: 0 (ok)"), "{stdout}");

    // Negative: a name not in the certificate fails hostname verification.
    let bad = OpensslClient::new(server.addr())
        .servername("other.test")
        .cafile(&files.ca)
        .input("hi\nCLOSE\n")
        .run()
        .unwrap();
    assert!(!bad.status.success());
    assert!(!bad.stdout_str().contains("ih"), "{}", bad.stdout_str());
}

#[test]
fn nginx_serves_tls12_and_tls13_and_logs_custom_header() {
    let dir = tempfile::tempdir().unwrap();
    let pki = TestPki::new("nginx").unwrap();
    let inter = pki.intermediate("nginx-issuing").unwrap();
    let files = inter
        .issue(&LeafSpec::server("www.test").key_type(KeyType::Rsa2048))
        .unwrap()
        .write_to(dir.path())
        .unwrap();
    let nginx = Nginx::from_files(&files)
        .log_header("X-Mbtls")
        .start()
        .unwrap();
    for (version, name) in [
        (TlsVersion::Tls12, "TLSv1.2"),
        (TlsVersion::Tls13, "TLSv1.3"),
    ] {
        let value = format!("hop-{name}");
        let out = Curl::new(&format!("https://www.test:{}/headers", nginx.port()))
            .cacert(&files.ca)
            .resolve("www.test", nginx.port(), LOCAL)
            .version(version)
            .header(&format!("X-Mbtls: {value}"))
            .run()
            .unwrap();
        assert_eq!(out.exit_code, Some(0), "{}", out.verbose);
        assert_eq!(out.status, Some(200));
        assert_eq!(out.tls_version().as_deref(), Some(name));
        assert_eq!(out.body_str(), format!("x-mbtls: {value}\n"));
        let needle = format!("\"GET /headers HTTP/1.1\" 200 {name} x-mbtls=\"{value}\"");
        let log = nginx.wait_access_log(|l| l.contains(&needle)).unwrap();
        assert!(log.contains(&needle));
    }
    // A request without the header logs it as "-".
    let out = Curl::new(&format!("https://www.test:{}/", nginx.port()))
        .cacert(&files.ca)
        .resolve("www.test", nginx.port(), LOCAL)
        .run()
        .unwrap();
    assert_eq!(out.body_str(), "mbx nginx ok\n");
    nginx
        .wait_access_log(|l| l.contains("\"GET / HTTP/1.1\" 200 TLSv1.3 x-mbtls=\"-\""))
        .unwrap();
}

#[test]
fn nginx_protocol_restriction_is_enforced() {
    let dir = tempfile::tempdir().unwrap();
    let pki = TestPki::new("nginx13").unwrap();
    let files = pki
        .issue(&LeafSpec::server("only13.test").key_type(KeyType::EcdsaP384))
        .unwrap()
        .write_to(dir.path())
        .unwrap();
    let nginx = Nginx::from_files(&files)
        .protocols(&[TlsVersion::Tls13])
        .start()
        .unwrap();
    let url = format!("https://only13.test:{}/protocol", nginx.port());
    let ok = Curl::new(&url)
        .cacert(&files.ca)
        .resolve("only13.test", nginx.port(), LOCAL)
        .run()
        .unwrap();
    assert_eq!(ok.body_str(), "TLSv1.3\n");
    let refused = Curl::new(&url)
        .cacert(&files.ca)
        .resolve("only13.test", nginx.port(), LOCAL)
        .version(TlsVersion::Tls12)
        .run()
        .unwrap();
    assert_ne!(refused.exit_code, Some(0));
    assert_eq!(refused.status, None);
}

#[test]
fn dropping_a_launcher_kills_the_process() {
    let dir = tempfile::tempdir().unwrap();
    let pki = TestPki::new("drop").unwrap();
    let files = pki
        .issue(&LeafSpec::server("drop.test"))
        .unwrap()
        .write_to(dir.path())
        .unwrap();
    let server = OpensslServer::from_files(&files).start().unwrap();
    let pid = server.pid().unwrap();
    assert!(std::path::Path::new(&format!("/proc/{pid}")).exists());
    let nginx = Nginx::from_files(&files).start().unwrap();
    let npid = nginx.pid().unwrap();
    drop(server);
    drop(nginx);
    // Drop kills and reaps, so the pids are gone (not zombies) immediately.
    assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
    assert!(!std::path::Path::new(&format!("/proc/{npid}")).exists());
}
