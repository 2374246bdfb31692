//! Keys on a PKCS#11 token (SoftHSM2 from Debian), served over the network like file keys.
//!
//! One test function on purpose: SoftHSM2 reads `SOFTHSM2_CONF` once, when the module is first
//! initialized in this process, so every step shares one token directory.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use common::verify::{input_for, openssl_verifies, ring_verifies, ECDSA_SIGN, RSA_SIGN};
use common::{key, Bed, SiteKey};
use mbx_keyless::pkcs11::Pkcs11Token;
use mbx_keyless::server::{KeyServer, RunningServer, ServerConfig, ServerStats};
use mbx_keyless::wire::{ErrorCode, Opcode};
use mbx_keyless::{ClientError, KeyHandle, KeylessClient};
use mbx_testbed::pki::{IssuedCert, KeyType, LeafSpec, TestPki};
use openssl::pkey::PKey;
use openssl::rsa::Padding;

const MODULE: &str = "/usr/lib/softhsm/libsofthsm2.so";
const PIN: &str = "4242";

struct Hsm {
    dir: tempfile::TempDir,
    conf: PathBuf,
    util: PathBuf,
}

impl Hsm {
    fn new() -> Hsm {
        let util = mbx_testbed::peers::ensure_tool("softhsm2-util", "softhsm2").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let tokens = dir.path().join("tokens");
        std::fs::create_dir(&tokens).unwrap();
        let conf = dir.path().join("softhsm2.conf");
        std::fs::write(
            &conf,
            format!(
                "directories.tokendir = {}\nobjectstore.backend = file\nlog.level = ERROR\n\
                 slots.removable = false\n",
                tokens.display()
            ),
        )
        .unwrap();
        // The module in this process reads it when first initialized (no thread runs yet).
        std::env::set_var("SOFTHSM2_CONF", &conf);
        let hsm = Hsm { dir, conf, util };
        hsm.util(&[
            "--init-token",
            "--free",
            "--label",
            "keyless",
            "--pin",
            PIN,
            "--so-pin",
            "999999",
        ]);
        std::fs::write(hsm.pin_file(), format!("{PIN}\n")).unwrap();
        hsm
    }

    fn util(&self, args: &[&str]) {
        let out = Command::new(&self.util)
            .args(args)
            .env("SOFTHSM2_CONF", &self.conf)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "softhsm2-util {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn pin_file(&self) -> PathBuf {
        self.dir.path().join("pin")
    }

    /// Imports a PKCS#8 key under this label and ID.
    fn import(&self, cert: &IssuedCert, label: &str, id: &str) {
        let pem = self.dir.path().join(format!("{label}.p8"));
        std::fs::write(&pem, cert.key_pem().as_bytes()).unwrap();
        self.util(&[
            "--import",
            pem.to_str().unwrap(),
            "--token",
            "keyless",
            "--label",
            label,
            "--id",
            id,
            "--pin",
            PIN,
        ]);
        // The private key exists only on the token now.
        std::fs::remove_file(&pem).unwrap();
    }
}

fn site_key(cert: &IssuedCert, host: &'static str) -> SiteKey {
    let public = PKey::public_key_from_der(
        &openssl::x509::X509::from_der(cert.cert_der())
            .unwrap()
            .public_key()
            .unwrap()
            .public_key_to_der()
            .unwrap(),
    )
    .unwrap();
    SiteKey {
        host,
        ski: mbx_keyless::x509::ski_from_certificate(cert.cert_der()).unwrap(),
        public,
    }
}

fn config(bed: &Bed, files: &Path, key_dir: &Path, token: &str, pin_file: &Path) -> ServerConfig {
    let paths = bed.server_cert.write_to_named(files, "server").unwrap();
    std::fs::write(files.join("edge-ca.pem"), bed.edge_pki.root_pem()).unwrap();
    ServerConfig::from_toml(&format!(
        r#"
        listen = "127.0.0.1:0"
        key_dir = "{}"
        certificate = "{}"
        private_key = "{}"
        edge_ca = "{}"
        workers = 2
        [[pkcs11]]
        module = "{MODULE}"
        token_label = "{token}"
        pin_file = "{}"
        [edges."edge-a"]
        hostnames = ["rsa.hsm.test", "p256.hsm.test", "p384.hsm.test", "ed.hsm.test", "late.hsm.test"]
        "#,
        key_dir.display(),
        paths.chain.display(),
        paths.key.display(),
        files.join("edge-ca.pem").display(),
        pin_file.display(),
    ))
    .unwrap()
}

async fn sign_and_verify(edge: &KeylessClient, site: &SiteKey, op: Opcode) {
    let sig = edge.sign(&key(site), op, &input_for(op)).await.unwrap();
    assert!(
        openssl_verifies(&site.public, op, &sig),
        "{} {op:?}: OpenSSL rejects the token's signature",
        site.host
    );
    let mut bad = sig.to_vec();
    let last = bad.len() - 1;
    bad[last] ^= 1;
    assert!(!openssl_verifies(&site.public, op, &bad));
    if let Some(ok) = ring_verifies(&site.public, op, &sig) {
        assert!(
            ok,
            "{} {op:?}: ring rejects the token's signature",
            site.host
        );
    }
}

async fn start(config: &ServerConfig) -> RunningServer {
    KeyServer::from_config(config)
        .unwrap()
        .bind(config.listen)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_keys_serve_every_opcode_like_file_keys() {
    let hsm = Hsm::new();
    let bed = Bed::new();
    let sites = TestPki::new("hsm sites").unwrap();
    let issue = |host: &str, kt| sites.issue(&LeafSpec::server(host).key_type(kt)).unwrap();
    let rsa_cert = issue("rsa.hsm.test", KeyType::Rsa2048);
    let p256_cert = issue("p256.hsm.test", KeyType::EcdsaP256);
    let p384_cert = issue("p384.hsm.test", KeyType::EcdsaP384);
    let ed_cert = issue("ed.hsm.test", KeyType::Ed25519);
    hsm.import(&rsa_cert, "rsa", "01");
    hsm.import(&p256_cert, "p256", "02");
    hsm.import(&p384_cert, "p384", "03");
    hsm.import(&ed_cert, "ed", "04");
    let rsa = site_key(&rsa_cert, "rsa.hsm.test");
    let p256 = site_key(&p256_cert, "p256.hsm.test");
    let p384 = site_key(&p384_cert, "p384.hsm.test");
    let ed = site_key(&ed_cert, "ed.hsm.test");

    // Only the certificates are files: they give the token keys their host names.
    let files = tempfile::tempdir().unwrap();
    let key_dir = files.path().join("keys");
    std::fs::create_dir(&key_dir).unwrap();
    for (name, c) in [
        ("rsa", &rsa_cert),
        ("p256", &p256_cert),
        ("p384", &p384_cert),
        ("ed", &ed_cert),
    ] {
        std::fs::write(key_dir.join(format!("{name}.crt")), c.cert_pem()).unwrap();
    }
    let cfg = config(&bed, files.path(), &key_dir, "keyless", &hsm.pin_file());
    let server = start(&cfg).await;
    assert_eq!(server.core().keys().len(), 4);
    let edge = Arc::new(bed.edge(&server, "edge-a").await);

    for op in RSA_SIGN {
        sign_and_verify(&edge, &rsa, op).await;
    }
    for site in [&p256, &p384] {
        for op in ECDSA_SIGN {
            sign_and_verify(&edge, site, op).await;
        }
    }
    sign_and_verify(&edge, &ed, Opcode::Ed25519Sign).await;

    // Raw RSA decryption: the token returns the whole block, leading zero included.
    let pub_rsa = rsa.public.rsa().unwrap();
    let mut block = vec![0u8; 256];
    openssl::rand::rand_bytes(&mut block[2..]).unwrap();
    block[1] = 2;
    let mut ct = vec![0u8; 256];
    pub_rsa
        .public_encrypt(&block, &mut ct, Padding::NONE)
        .unwrap();
    let plain = edge.rsa_decrypt_raw(&key(&rsa), &ct).await.unwrap();
    assert_eq!(&plain[..], &block[..]);
    // Found by certificate digest too, like file RSA keys.
    let digest_id =
        mbx_keyless::KeyId::digest(mbx_keyless::keys::rsa_modulus_digest(&pub_rsa.n().to_vec()));
    let sig = edge
        .sign(
            &digest_id,
            Opcode::RsaSignSha256,
            &input_for(Opcode::RsaSignSha256),
        )
        .await
        .unwrap();
    assert!(openssl_verifies(&rsa.public, Opcode::RsaSignSha256, &sig));

    // Errors map as for file keys.
    let r = edge
        .sign(&key(&p256), Opcode::EcdsaSignSha256, &[0u8; 31])
        .await;
    assert!(
        matches!(r, Err(ClientError::Remote(ErrorCode::FormatError))),
        "{r:?}"
    );
    let r = edge
        .sign(&key(&rsa), Opcode::EcdsaSignSha256, &[0u8; 32])
        .await;
    assert!(
        matches!(r, Err(ClientError::Remote(ErrorCode::BadOpcode))),
        "{r:?}"
    );
    let r = edge.rsa_decrypt_raw(&key(&rsa), &[0xffu8; 256]).await;
    assert!(
        matches!(r, Err(ClientError::Remote(ErrorCode::CryptoFailure))),
        "{r:?}"
    );
    let r = edge.rsa_decrypt_raw(&key(&rsa), &[1u8; 255]).await;
    assert!(
        matches!(r, Err(ClientError::Remote(ErrorCode::FormatError))),
        "{r:?}"
    );

    // Concurrent requests on pooled sessions, every signature checked.
    let mut tasks = Vec::new();
    for i in 0..24 {
        let edge = Arc::clone(&edge);
        let (site, op) = match i % 3 {
            0 => (&p256, Opcode::EcdsaSignSha256),
            1 => (&rsa, Opcode::RsaPssSignSha256),
            _ => (&ed, Opcode::Ed25519Sign),
        };
        let public = site.public.clone();
        let id = key(site);
        tasks.push(tokio::spawn(async move {
            let sig = edge.sign(&id, op, &input_for(op)).await.unwrap();
            openssl_verifies(&public, op, &sig)
        }));
    }
    for t in tasks {
        assert!(t.await.unwrap());
    }

    // Label and ID filters choose among the token's keys.
    let mut only = cfg.pkcs11[0].clone();
    only.labels = vec!["p256".into(), "ed".into()];
    let keys = Pkcs11Token::open(&only).unwrap();
    let mut skis: Vec<_> = keys.iter().map(|k| k.ski()).collect();
    skis.sort();
    let mut want = vec![p256.ski, ed.ski];
    want.sort();
    assert_eq!(skis, want);
    only.labels.clear();
    only.ids = vec!["03".into()];
    let keys = Pkcs11Token::open(&only).unwrap();
    assert_eq!(keys.len(), 1);
    assert_eq!(keys[0].ski(), p384.ski);
    assert_eq!(keys[0].label(), "p384");

    // Reload picks up a key imported into the token later; the open connection uses it.
    let late_cert = issue("late.hsm.test", KeyType::EcdsaP256);
    hsm.import(&late_cert, "late", "05");
    std::fs::write(key_dir.join("late.crt"), late_cert.cert_pem()).unwrap();
    let late = site_key(&late_cert, "late.hsm.test");
    let r = edge
        .sign(
            &key(&late),
            Opcode::EcdsaSignSha256,
            &input_for(Opcode::EcdsaSignSha256),
        )
        .await;
    assert!(
        matches!(r, Err(ClientError::Remote(ErrorCode::KeyNotFound))),
        "{r:?}"
    );
    server.reload(&cfg).unwrap();
    assert_eq!(server.core().keys().len(), 5);
    sign_and_verify(&edge, &late, Opcode::EcdsaSignSha256).await;
    sign_and_verify(&edge, &rsa, Opcode::RsaSignSha384).await;

    // A wrong PIN (for a second token: the first is logged in for the whole process already):
    // the reload fails, says why without the PIN, and changes nothing.
    hsm.util(&[
        "--init-token",
        "--free",
        "--label",
        "second",
        "--pin",
        "123456",
        "--so-pin",
        "999999",
    ]);
    let wrong = hsm.dir.path().join("wrong-pin");
    std::fs::write(&wrong, "987654\n").unwrap();
    let bad_cfg = config(&bed, files.path(), &key_dir, "second", &wrong);
    let err = server.reload(&bad_cfg).unwrap_err().to_string();
    assert!(err.contains("PKCS#11"), "{err}");
    assert!(!err.contains("987654"), "{err}");
    assert_eq!(ServerStats::get(&server.stats().reload_failures), 1);
    sign_and_verify(&edge, &p384, Opcode::EcdsaSignSha384).await;
}
