//! `mbx keyless keyserver` reloads on SIGHUP: a key and rule added to the files become usable on a
//! connection opened before the signal, and a config file that no longer parses, or a key file
//! that does not load, changes nothing.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use mbx_keyless::wire::{ErrorCode, Opcode};
use mbx_keyless::{tls, x509, ClientError, ClientOptions, KeyId, KeylessClient};
use mbx_testbed::pki::{IssuedCert, KeyType, LeafSpec, TestPki};
use rustls::pki_types::ServerName;

mod common;

struct Killed(Child);
impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn write_config(path: &Path, hostnames: &[&str]) {
    std::fs::write(
        path,
        format!(
            "[keyless.keyserver]\nlisten = \"127.0.0.1:0\"\n\
             [keyless.keyserver.edges.\"edge-a.cdn.test\"]\nhostnames = {hostnames:?}\n"
        ),
    )
    .unwrap();
}

fn hup(pid: u32) {
    common::signal(pid, rustix::process::Signal::HUP);
}

async fn signs(edge: &KeylessClient, site: &IssuedCert) -> Result<(), ClientError> {
    let ski = x509::ski_from_certificate(site.cert_der()).unwrap();
    let digest = openssl::sha::sha256(b"reload");
    let sig = edge
        .sign(&KeyId::ski(ski), Opcode::EcdsaSignSha256, &digest)
        .await?;
    let public = openssl::x509::X509::from_der(site.cert_der())
        .unwrap()
        .public_key()
        .unwrap();
    let sig = openssl::ecdsa::EcdsaSig::from_der(&sig).unwrap();
    assert!(sig.verify(&digest, &public.ec_key().unwrap()).unwrap());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_adds_a_key_without_dropping_connections() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let keys = d.join("keys");
    std::fs::create_dir(&keys).unwrap();
    let sites = TestPki::new("site CA").unwrap();
    let issue = |host: &str| {
        sites
            .issue(&LeafSpec::server(host).key_type(KeyType::EcdsaP256))
            .unwrap()
    };
    let old_site = issue("old.example.test");
    let new_site = issue("new.example.test");
    std::fs::write(keys.join("old.key"), old_site.key_pem().as_bytes()).unwrap();
    std::fs::write(keys.join("old.crt"), old_site.cert_pem()).unwrap();

    let server_pki = TestPki::new("keyserver CA").unwrap();
    let server_files = server_pki
        .issue(&LeafSpec::server("keyserver.test"))
        .unwrap()
        .write_to_named(d, "server")
        .unwrap();
    let edge_pki = TestPki::new("edge CA").unwrap();
    std::fs::write(d.join("edge-ca.pem"), edge_pki.root_pem()).unwrap();
    let config = d.join("mbx.toml");
    write_config(&config, &["old.example.test"]);

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
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let stdout = child.stdout.take().unwrap();
    let stderr = child.stderr.take().unwrap();
    let _guard = Killed(child);
    let (tx, lines) = mpsc::channel::<String>();
    let tx2 = tx.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.starts_with("mbx:") {
                let _ = tx2.send(line);
            }
        }
    });
    let next = || tokio::task::block_in_place(|| lines.recv().unwrap());
    let first = next();
    let addr: std::net::SocketAddr = first
        .strip_prefix("key server listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {first:?}"))
        .parse()
        .unwrap();

    let cert = edge_pki
        .issue(&LeafSpec::client("edge-a.cdn.test"))
        .unwrap();
    let connect = || {
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
    let old_conn = connect().await.unwrap();
    signs(&old_conn, &old_site).await.unwrap();
    let before = signs(&old_conn, &new_site).await;
    assert!(
        matches!(before, Err(ClientError::Remote(ErrorCode::KeyNotFound))),
        "{before:?}"
    );

    // The new key and a rule for it, then SIGHUP.
    std::fs::write(keys.join("new.key"), new_site.key_pem().as_bytes()).unwrap();
    std::fs::write(keys.join("new.crt"), new_site.cert_pem()).unwrap();
    write_config(&config, &["old.example.test", "new.example.test"]);
    hup(pid);
    assert_eq!(next(), "key server reloaded");
    signs(&old_conn, &new_site).await.unwrap();
    signs(&old_conn, &old_site).await.unwrap();
    let new_conn = connect().await.unwrap();
    signs(&new_conn, &new_site).await.unwrap();

    // A config file that does not parse: refused, the running configuration stays.
    std::fs::write(&config, "[keyless.keyserver\nbroken").unwrap();
    hup(pid);
    let msg = next();
    assert!(msg.starts_with("mbx: reload failed"), "{msg}");
    signs(&old_conn, &new_site).await.unwrap();
    signs(&new_conn, &old_site).await.unwrap();

    // A config that parses but a key file that does not load: the key server itself refuses
    // the reload, and the file's name (here with an escape sequence in it) is said escaped.
    write_config(&config, &["old.example.test", "new.example.test"]);
    let bad = keys.join("bad\u{1b}[31m.key");
    std::fs::write(&bad, "not a key").unwrap();
    hup(pid);
    // (The parse error above spans several lines, each with the prefix.)
    let msg = loop {
        let line = next();
        assert!(
            line.starts_with("mbx: reload failed, configuration unchanged: "),
            "{line}"
        );
        if line.contains("[31m.key") {
            break line;
        }
    };
    assert!(
        msg.contains("bad\\u{1b}[31m.key: neither a private key nor a certificate"),
        "{msg}"
    );
    assert!(!msg.contains('\u{1b}'), "{msg}");
    signs(&old_conn, &new_site).await.unwrap();
    signs(&new_conn, &old_site).await.unwrap();
}
