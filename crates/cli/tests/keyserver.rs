//! `mbx keyless keyserver` as a process: configured from a TOML file plus flags, an authorized edge
//! gets signatures that verify, an unauthorized one gets "key not found".

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use mbx_keyless::wire::{ErrorCode, Opcode};
use mbx_keyless::{tls, x509, ClientError, ClientOptions, KeyId, KeylessClient};
use mbx_testbed::pki::{KeyType, LeafSpec, TestPki};
use rustls::pki_types::ServerName;

struct Killed(Child);
impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyserver_process_signs_for_authorized_edges_only() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let keys = d.join("keys");
    std::fs::create_dir(&keys).unwrap();

    // The site's key (and certificate, which gives the key its host name).
    let sites = TestPki::new("site CA").unwrap();
    let site = sites
        .issue(&LeafSpec::server("www.example.test").key_type(KeyType::EcdsaP256))
        .unwrap();
    std::fs::write(keys.join("www.key"), site.key_pem().as_bytes()).unwrap();
    std::fs::write(keys.join("www.crt"), site.cert_pem()).unwrap();
    let ski = x509::ski_from_certificate(site.cert_der()).unwrap();

    // The key server's own identity, and the CA of the edges.
    let server_pki = TestPki::new("keyserver CA").unwrap();
    let server_files = server_pki
        .issue(&LeafSpec::server("keyserver.test"))
        .unwrap()
        .write_to_named(d, "server")
        .unwrap();
    let edge_pki = TestPki::new("edge CA").unwrap();
    std::fs::write(d.join("edge-ca.pem"), edge_pki.root_pem()).unwrap();

    let config = d.join("mbx.toml");
    std::fs::write(
        &config,
        "[keyless.keyserver]\nlisten = \"127.0.0.1:0\"\n\
         [keyless.keyserver.edges.\"edge-a.cdn.test\"]\nhostnames = [\"www.example.test\"]\n",
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_mbx"))
        .arg("--config")
        .arg(&config)
        .args(["keyless", "keyserver", "--key-dir"])
        .arg(&keys)
        .arg("--certificate")
        .arg(&server_files.chain)
        .arg("--private-key")
        .arg(&server_files.key)
        .arg("--edge-ca")
        .arg(d.join("edge-ca.pem"))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let _guard = Killed(child);
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).unwrap();
    let addr: std::net::SocketAddr = line
        .trim()
        .strip_prefix("key server listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .parse()
        .unwrap();

    let connect = |name: &str| {
        let cert = edge_pki.issue(&LeafSpec::client(name)).unwrap();
        let tls = tls::client_config(
            &[server_pki.root_der().clone()],
            Some((cert.chain_der(), cert.private_key())),
            &[],
        )
        .unwrap();
        KeylessClient::connect(
            addr,
            ServerName::try_from("keyserver.test").unwrap(),
            tls,
            ClientOptions {
                timeout: Duration::from_secs(60),
                ..ClientOptions::default()
            },
        )
    };
    let key = KeyId::ski(ski);
    let digest = openssl::sha::sha256(b"a TLS 1.3 CertificateVerify input");

    let edge_a = Arc::new(connect("edge-a.cdn.test").await.unwrap());
    assert_eq!(edge_a.ping(b"hello").await.unwrap(), b"hello");
    let sig = edge_a
        .sign(&key, Opcode::EcdsaSignSha256, &digest)
        .await
        .unwrap();
    let public = openssl::x509::X509::from_der(site.cert_der())
        .unwrap()
        .public_key()
        .unwrap();
    let ec = public.ec_key().unwrap();
    let sig = openssl::ecdsa::EcdsaSig::from_der(&sig).unwrap();
    assert!(
        sig.verify(&digest, &ec).unwrap(),
        "signature does not verify"
    );

    let edge_b = connect("edge-b.cdn.test").await.unwrap();
    match edge_b.sign(&key, Opcode::EcdsaSignSha256, &digest).await {
        Err(ClientError::Remote(ErrorCode::KeyNotFound)) => {}
        other => panic!("unauthorized edge got {other:?}"),
    }
}
