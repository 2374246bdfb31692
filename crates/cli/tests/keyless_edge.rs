//! `mbx keyless edge` as a process: configured from a TOML file plus flags, with an in-process key
//! server and origin; curl fetches a page through it over TLS 1.3 and 1.2, verifying the site
//! certificate whose key only the key server has.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, Ipv4Addr, TcpListener};
use std::process::{Child, Command, Stdio};

use mbx_keyless::keys::KeyStore;
use mbx_keyless::server::{Authorization, KeyServer, KeyServerCore};
use mbx_keyless::tls::{self, DenyList};
use mbx_testbed::peers::{Curl, TlsVersion};
use mbx_testbed::pki::{KeyType, LeafSpec, TestPki};

struct Killed(Child);
impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A one-page origin on a std thread: answers every request with "pong" and closes.
fn origin() -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { continue };
            let mut buf = Vec::new();
            let mut chunk = [0u8; 1024];
            while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                match s.read(&mut chunk) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
            let _ = s.write_all(
                b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\npong\n",
            );
        }
    });
    addr
}

#[test]
fn edge_process_serves_a_site_whose_key_is_on_a_key_server() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let keys = d.join("keys");
    std::fs::create_dir(&keys).unwrap();

    let sites = TestPki::new("site CA").unwrap();
    let site = sites
        .issue(&LeafSpec::server("www.example.test").key_type(KeyType::EcdsaP256))
        .unwrap();
    std::fs::write(keys.join("www.key"), site.key_pem().as_bytes()).unwrap();
    std::fs::write(keys.join("www.crt"), site.cert_pem()).unwrap();
    std::fs::write(d.join("www.chain.pem"), site.chain_pem()).unwrap();
    std::fs::write(d.join("sites-ca.pem"), sites.root_pem()).unwrap();

    let server_pki = TestPki::new("keyserver CA").unwrap();
    let server_cert = server_pki
        .issue(&LeafSpec::server("keyserver.test"))
        .unwrap();
    std::fs::write(d.join("keyserver-ca.pem"), server_pki.root_pem()).unwrap();
    let edge_pki = TestPki::new("edge CA").unwrap();
    let edge_files = edge_pki
        .issue(&LeafSpec::client("edge-a.cdn.test"))
        .unwrap()
        .write_to_named(d, "edge")
        .unwrap();

    // The key server, in this process.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let key_server = runtime.block_on(async {
        let authz = Authorization::from_toml(
            "[edges.\"edge-a.cdn.test\"]\nhostnames = [\"www.example.test\"]\n",
        )
        .unwrap();
        let tls = tls::server_config(
            server_cert.chain_der(),
            server_cert.private_key(),
            &[edge_pki.root_der().clone()],
            DenyList::new(),
        )
        .unwrap();
        KeyServer::new(
            KeyServerCore::new(KeyStore::load_dir(&keys).unwrap(), authz),
            tls,
            1,
            16,
        )
        .unwrap()
        .bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap()
    });
    let origin = origin();

    // Sites in the file; key server, origin and listen address from flags.
    let config = d.join("mbx.toml");
    std::fs::write(
        &config,
        format!(
            "[keyless.edge]\nlisten = \"0.0.0.0:443\"\n\
             [keyless.edge.sites.\"www.example.test\"]\ncertificate = {:?}\n\
             key_server = \"default\"\norigin = \"default\"\n",
            d.join("www.chain.pem")
        ),
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_mbx"))
        .arg("--config")
        .arg(&config)
        .args(["keyless", "edge", "--listen", "127.0.0.1:0", "--key-server"])
        .arg(key_server.local_addr().to_string())
        .args(["--key-server-name", "keyserver.test", "--key-server-ca"])
        .arg(d.join("keyserver-ca.pem"))
        .arg("--client-certificate")
        .arg(&edge_files.chain)
        .arg("--client-key")
        .arg(&edge_files.key)
        .arg("--origin")
        .arg(origin.to_string())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let _guard = Killed(child);
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).unwrap();
    let addr: std::net::SocketAddr = line
        .trim()
        .strip_prefix("edge listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .parse()
        .unwrap();

    for version in [TlsVersion::Tls13, TlsVersion::Tls12] {
        let out = Curl::new(&format!("https://www.example.test:{}/ping", addr.port()))
            .cacert(d.join("sites-ca.pem"))
            .resolve(
                "www.example.test",
                addr.port(),
                IpAddr::V4(Ipv4Addr::LOCALHOST),
            )
            .version(version)
            .run()
            .unwrap();
        assert_eq!(out.exit_code, Some(0), "{}", out.verbose);
        assert_eq!(out.body_str(), "pong\n");
    }
    let signed = mbx_keyless::server::ServerStats::get(&key_server.stats().requests);
    assert!(signed >= 2, "the key server made the signatures ({signed})");
}
