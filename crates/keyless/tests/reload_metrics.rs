//! Reloading the key server's configuration while edges stay connected, and the Prometheus
//! metrics endpoint.

mod common;

use std::path::Path;

use common::{key, Bed, SiteKey};
use mbx_keyless::server::{KeyServer, RunningServer, ServerConfig, ServerStats};
use mbx_keyless::wire::{ErrorCode, Opcode};
use mbx_keyless::{ClientError, KeylessClient};
use openssl::pkey_ctx::PkeyCtx;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Signs a SHA-256 digest with ECDSA and checks the signature with OpenSSL.
async fn ecdsa_ok(edge: &KeylessClient, site: &SiteKey) {
    let digest = openssl::sha::sha256(b"reload test");
    let sig = edge
        .sign(&key(site), Opcode::EcdsaSignSha256, &digest)
        .await
        .unwrap();
    let mut ctx = PkeyCtx::new(&site.public).unwrap();
    ctx.verify_init().unwrap();
    assert!(ctx.verify(&digest, &sig).unwrap(), "{}", site.host);
}

async fn not_found(edge: &KeylessClient, site: &SiteKey) {
    let r = edge
        .sign(&key(site), Opcode::EcdsaSignSha256, &[0u8; 32])
        .await;
    assert!(
        matches!(r, Err(ClientError::Remote(ErrorCode::KeyNotFound))),
        "{}: {r:?}",
        site.host
    );
}

fn copy_site(bed: &Bed, to: &Path, files: &[&str]) {
    for f in files {
        std::fs::copy(bed.key_dir.path().join(f), to.join(f)).unwrap();
    }
}

struct Files {
    dir: tempfile::TempDir,
    chain: std::path::PathBuf,
    key: std::path::PathBuf,
}

fn files(bed: &Bed) -> Files {
    let dir = tempfile::tempdir().unwrap();
    let paths = bed
        .server_cert
        .write_to_named(dir.path(), "server")
        .unwrap();
    std::fs::write(dir.path().join("edge-ca.pem"), bed.edge_pki.root_pem()).unwrap();
    std::fs::write(dir.path().join("other-ca.pem"), bed.other_pki.root_pem()).unwrap();
    std::fs::create_dir(dir.path().join("keys")).unwrap();
    Files {
        chain: paths.chain,
        key: paths.key,
        dir,
    }
}

fn config(f: &Files, edge_ca: &str, hostnames: &[&str]) -> ServerConfig {
    let toml = format!(
        r#"
        listen = "127.0.0.1:0"
        metrics_listen = "127.0.0.1:0"
        key_dir = "{}"
        certificate = "{}"
        private_key = "{}"
        edge_ca = "{}"
        workers = 2
        [edges."edge-a"]
        hostnames = {hostnames:?}
        "#,
        f.dir.path().join("keys").display(),
        f.chain.display(),
        f.key.display(),
        f.dir.path().join(edge_ca).display(),
    );
    ServerConfig::from_toml(&toml).unwrap()
}

async fn start(config: &ServerConfig) -> RunningServer {
    KeyServer::from_config(config)
        .unwrap()
        .bind(config.listen)
        .await
        .unwrap()
}

async fn scrape(server: &RunningServer, path: &str) -> String {
    let mut tcp = tokio::net::TcpStream::connect(server.metrics_addr().unwrap())
        .await
        .unwrap();
    tcp.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut out = String::new();
    tcp.read_to_string(&mut out).await.unwrap();
    out
}

/// Waits for the server to count `n` handshake failures (the client may see the alert first).
async fn wait_handshake_failures(server: &RunningServer, n: u64) {
    for _ in 0..6000 {
        if ServerStats::get(&server.stats().handshake_failures) >= n {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_swaps_keys_rules_and_tls_while_connections_stay_open() {
    let bed = Bed::new();
    let f = files(&bed);
    let keys = f.dir.path().join("keys");
    copy_site(&bed, &keys, &["p256.example.der", "p256.example.crt"]);
    let server = start(&config(&f, "edge-ca.pem", &["p256.example"])).await;

    let old = bed.edge(&server, "edge-a").await;
    ecdsa_ok(&old, &bed.p256).await;
    not_found(&old, &bed.p384).await;

    // A new key and a rule for it: the connection opened before the reload uses it.
    copy_site(&bed, &keys, &["p384.example.key", "p384.example.crt"]);
    let c2 = config(&f, "edge-ca.pem", &["p256.example", "p384.example"]);
    // Not before the reload: keys are read only at start and on reload.
    not_found(&old, &bed.p384).await;
    server.reload(&c2).unwrap();
    let digest = openssl::sha::sha384(b"p384");
    let sig = old
        .sign(&key(&bed.p384), Opcode::EcdsaSignSha384, &digest)
        .await
        .unwrap();
    let mut ctx = PkeyCtx::new(&bed.p384.public).unwrap();
    ctx.verify_init().unwrap();
    assert!(ctx.verify(&digest, &sig).unwrap());
    ecdsa_ok(&old, &bed.p256).await;
    let new = bed.edge(&server, "edge-a").await;
    ecdsa_ok(&new, &bed.p256).await;

    // A reload that does not load changes nothing: a broken key file in the directory.
    std::fs::write(keys.join("broken.pem"), b"not a key").unwrap();
    let c3 = config(&f, "edge-ca.pem", &["p256.example"]);
    assert!(server.reload(&c3).is_err());
    assert_eq!(ServerStats::get(&server.stats().reload_failures), 1);
    // The p384 rule of c2 is still in force, for old and new connections.
    ecdsa_ok(&old, &bed.p256).await;
    let sig = old
        .sign(&key(&bed.p384), Opcode::EcdsaSignSha384, &digest)
        .await;
    assert!(sig.is_ok(), "{sig:?}");
    bed.edge(&server, "edge-a").await.ping(b"x").await.unwrap();
    std::fs::remove_file(keys.join("broken.pem")).unwrap();

    // A new edge CA: edges of the old CA can no longer connect, those already connected stay.
    let c4 = config(&f, "other-ca.pem", &["p256.example"]);
    server.reload(&c4).unwrap();
    let refused = bed
        .connect_as(&server, Some(&bed.edge_cert("edge-a")), &[])
        .await;
    let refused = match refused {
        Ok(c) => c.ping(b"x").await.map(|_| ()),
        Err(e) => Err(e),
    };
    assert!(refused.is_err(), "old CA accepted after reload");
    wait_handshake_failures(&server, 1).await;
    ecdsa_ok(&old, &bed.p256).await;
    // … and the rules of c4 apply to the old connection: p384 is no longer authorized.
    not_found(&old, &bed.p384).await;
    let other = bed
        .other_pki
        .issue(&mbx_testbed::pki::LeafSpec::client("edge-a"))
        .unwrap();
    let fresh = bed.connect_as(&server, Some(&other), &[]).await.unwrap();
    ecdsa_ok(&fresh, &bed.p256).await;
    assert_eq!(ServerStats::get(&server.stats().reloads), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_endpoint_counts_requests_errors_and_failures() {
    let bed = Bed::new();
    let f = files(&bed);
    copy_site(
        &bed,
        &f.dir.path().join("keys"),
        &["p256.example.der", "p256.example.crt"],
    );
    let c = config(&f, "edge-ca.pem", &["p256.example"]);
    let server = start(&c).await;
    let edge = bed.edge(&server, "edge-a").await;
    for _ in 0..3 {
        ecdsa_ok(&edge, &bed.p256).await;
    }
    not_found(&edge, &bed.p384).await;
    edge.ping(b"hi").await.unwrap();
    // Wrong input length: a format error for an ECDSA-SHA384 request.
    let r = edge
        .sign(&key(&bed.p256), Opcode::EcdsaSignSha384, &[0u8; 10])
        .await;
    assert!(
        matches!(r, Err(ClientError::Remote(ErrorCode::FormatError))),
        "{r:?}"
    );
    let expired = bed.expired_edge_cert("edge-a");
    let bad = match bed.connect_as(&server, Some(&expired), &[]).await {
        Ok(c) => c.ping(b"x").await.map(|_| ()),
        Err(e) => Err(e),
    };
    assert!(bad.is_err());
    wait_handshake_failures(&server, 1).await;
    // The refused connection's task ends just after counting the failure: wait for that event.
    for _ in 0..6000 {
        if ServerStats::get(&server.stats().open_connections) == 1 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    server.reload(&c).unwrap();

    let text = scrape(&server, "/metrics").await;
    assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
    assert!(text.contains("Content-Type: text/plain; version=0.0.4"));
    for line in [
        "keyless_requests_total{opcode=\"EcdsaSignSha256\"} 4\n",
        "keyless_requests_total{opcode=\"EcdsaSignSha384\"} 1\n",
        "keyless_requests_total{opcode=\"Ping\"} 1\n",
        "keyless_errors_total{code=\"KeyNotFound\"} 1\n",
        "keyless_errors_total{code=\"FormatError\"} 1\n",
        "keyless_connections_total 2\n",
        // The edge's connection is open; the refused one is closed.
        "keyless_open_connections 1\n",
        "keyless_handshake_failures_total 1\n",
        "keyless_reloads_total 1\n",
        "keyless_reload_failures_total 0\n",
        "keyless_request_duration_seconds_count{opcode=\"EcdsaSignSha256\"} 4\n",
        "keyless_request_duration_seconds_bucket{opcode=\"EcdsaSignSha256\",le=\"+Inf\"} 4\n",
    ] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }
    assert!(!text.contains("keyless_errors_total{code=\"CryptoFailure\"}"));
    let missing = scrape(&server, "/other").await;
    assert!(missing.starts_with("HTTP/1.1 404"), "{missing}");
}
