//! Shared set-up for the key-server integration tests: a key directory with one key of each
//! algorithm (in each file format), a key server on loopback, and edge clients.
#![allow(dead_code)]

pub mod verify;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use mbx_keyless::keys::{KeyHandle, KeyStore};
use mbx_keyless::server::{Authorization, KeyServer, KeyServerCore, RunningServer};
use mbx_keyless::tls::{self, DenyList};
use mbx_keyless::{ClientError, ClientOptions, KeyId, KeylessClient};
use mbx_testbed::pki::{IssuedCert, KeyType, LeafSpec, TestPki, Validity};
use openssl::ec::{EcGroup, EcKey};
use openssl::nid::Nid;
use openssl::pkey::{PKey, Private, Public};
use rustls::pki_types::ServerName;

/// One site key: its public half and how to name it.
pub struct SiteKey {
    pub host: &'static str,
    pub public: PKey<Public>,
    pub ski: [u8; 20],
}

pub struct Bed {
    pub server_pki: TestPki,
    pub edge_pki: TestPki,
    pub other_pki: TestPki,
    pub rsa: SiteKey,
    pub p256: SiteKey,
    pub p384: SiteKey,
    pub p521: SiteKey,
    pub ed25519: SiteKey,
    pub b_site: SiteKey,
    pub key_dir: tempfile::TempDir,
    pub server_cert: IssuedCert,
}

fn ski_of(pkey: &PKey<Private>) -> [u8; 20] {
    mbx_keyless::x509::ski_from_spki(&pkey.public_key_to_der().unwrap()).unwrap()
}

fn public(pkey: &PKey<Private>) -> PKey<Public> {
    PKey::public_key_from_der(&pkey.public_key_to_der().unwrap()).unwrap()
}

fn write(dir: &Path, name: &str, data: &[u8]) {
    std::fs::write(dir.join(name), data).unwrap();
}

/// Issues a site certificate and writes its key in the chosen format.
fn site(pki: &TestPki, dir: &Path, host: &'static str, kt: KeyType, format: &str) -> SiteKey {
    let cert = pki.issue(&LeafSpec::server(host).key_type(kt)).unwrap();
    let pkey = PKey::private_key_from_pkcs8(cert.key_pkcs8_der()).unwrap();
    match format {
        "pkcs1-pem" => write(
            dir,
            &format!("{host}.key"),
            &pkey.rsa().unwrap().private_key_to_pem().unwrap(),
        ),
        "pkcs8-der" => write(dir, &format!("{host}.der"), cert.key_pkcs8_der()),
        _ => write(dir, &format!("{host}.key"), cert.key_pem().as_bytes()),
    }
    write(dir, &format!("{host}.crt"), cert.cert_pem().as_bytes());
    SiteKey {
        host,
        ski: ski_of(&pkey),
        public: public(&pkey),
    }
}

impl Bed {
    pub fn new() -> Bed {
        let server_pki = TestPki::new("keyserver").unwrap();
        let edge_pki = TestPki::new("edges").unwrap();
        let other_pki = TestPki::new("other").unwrap();
        let sites = TestPki::new("sites").unwrap();
        let key_dir = tempfile::tempdir().unwrap();
        let dir = key_dir.path();
        let rsa = site(&sites, dir, "rsa.example", KeyType::Rsa2048, "pkcs1-pem");
        let p256 = site(&sites, dir, "p256.example", KeyType::EcdsaP256, "pkcs8-der");
        let p384 = site(&sites, dir, "p384.example", KeyType::EcdsaP384, "pkcs8-pem");
        let ed25519 = site(&sites, dir, "ed.example", KeyType::Ed25519, "pkcs8-pem");
        let b_site = site(&sites, dir, "b.example", KeyType::EcdsaP256, "pkcs8-pem");
        // The test PKI has no P-521: a SEC1 key without a certificate, authorized by SKI.
        let ec = EcKey::generate(&EcGroup::from_curve_name(Nid::SECP521R1).unwrap()).unwrap();
        write(dir, "p521.pem", &ec.private_key_to_pem().unwrap());
        let p521_pkey = PKey::from_ec_key(ec).unwrap();
        let p521 = SiteKey {
            host: "p521 (no certificate)",
            ski: ski_of(&p521_pkey),
            public: public(&p521_pkey),
        };
        let server_cert = server_pki
            .issue(&LeafSpec::server("keyserver.test"))
            .unwrap();
        Bed {
            server_pki,
            edge_pki,
            other_pki,
            rsa,
            p256,
            p384,
            p521,
            ed25519,
            b_site,
            key_dir,
            server_cert,
        }
    }

    /// edge-a: every site except b.example (hostnames, and P-521 by SKI); edge-b: b.example.
    pub fn authorization(&self) -> Authorization {
        let toml = format!(
            r#"
            [edges."edge-a"]
            hostnames = ["rsa.example", "P256.example", "p384.example", "ed.example"]
            skis = ["{}"]
            [edges."edge-b"]
            hostnames = ["b.example"]
            "#,
            hex::encode(self.p521.ski)
        );
        Authorization::from_toml(&toml).unwrap()
    }

    pub fn keys(&self) -> KeyStore {
        KeyStore::load_dir(self.key_dir.path()).unwrap()
    }

    /// Starts a key server on loopback with these keys and deny list.
    pub async fn start_with(
        &self,
        keys: KeyStore,
        deny: DenyList,
        workers: usize,
    ) -> RunningServer {
        self.start_with_depth(keys, deny, workers, 256).await
    }

    /// Like [`Bed::start_with`], with `max_in_flight` requests per connection.
    pub async fn start_with_depth(
        &self,
        keys: KeyStore,
        deny: DenyList,
        workers: usize,
        max_in_flight: usize,
    ) -> RunningServer {
        let core = KeyServerCore::new(keys, self.authorization());
        let tls = tls::server_config(
            self.server_cert.chain_der(),
            self.server_cert.private_key(),
            &[self.edge_pki.root_der().clone()],
            deny,
        )
        .unwrap();
        KeyServer::new(core, tls, workers, max_in_flight)
            .unwrap()
            .bind("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap()
    }

    pub async fn start(&self) -> RunningServer {
        self.start_with(self.keys(), DenyList::new(), 0).await
    }

    pub fn edge_cert(&self, name: &str) -> IssuedCert {
        self.edge_pki.issue(&LeafSpec::client(name)).unwrap()
    }

    pub fn expired_edge_cert(&self, name: &str) -> IssuedCert {
        self.edge_pki
            .issue(&LeafSpec::client(name).validity(Validity::Expired))
            .unwrap()
    }

    pub async fn connect_as(
        &self,
        server: &RunningServer,
        cert: Option<&IssuedCert>,
        versions: &[&'static rustls::SupportedProtocolVersion],
    ) -> Result<KeylessClient, ClientError> {
        let tls = tls::client_config(
            &[self.server_pki.root_der().clone()],
            cert.map(|c| (c.chain_der(), c.private_key())),
            versions,
        )
        .unwrap();
        KeylessClient::connect(
            server.local_addr(),
            ServerName::try_from("keyserver.test").unwrap(),
            tls,
            ClientOptions {
                // Generous: no test depends on how long anything takes.
                timeout: Duration::from_secs(60),
                ..ClientOptions::default()
            },
        )
        .await
    }

    pub async fn edge(&self, server: &RunningServer, name: &str) -> KeylessClient {
        let cert = self.edge_cert(name);
        self.connect_as(server, Some(&cert), &[]).await.unwrap()
    }
}

pub fn key(site: &SiteKey) -> KeyId {
    KeyId::ski(site.ski)
}

/// A key handle whose `perform` calls all block until the test releases them one at a time
/// (to force a response to come late), counting how many are inside `perform` at once.
#[derive(Debug)]
pub struct CountingKey {
    pub ski: [u8; 20],
    pub state: Arc<(std::sync::Mutex<Counts>, std::sync::Condvar)>,
}

#[derive(Debug, Default, Clone, Copy)]
pub struct Counts {
    /// Calls inside `perform` now.
    pub current: usize,
    /// The most that were inside at once.
    pub max: usize,
    /// Calls that entered so far.
    pub entered: usize,
    /// Releases not yet taken by a call.
    pub releases: usize,
    /// Answers the test has received (counted by the test with [`note_answer`]).
    pub answered: usize,
}

impl CountingKey {
    pub fn new(ski: [u8; 20]) -> CountingKey {
        CountingKey {
            ski,
            state: Arc::new(Default::default()),
        }
    }
}

/// Waits until `ready(counts)` holds; a hang guard (not a timing check) panics after 60 s.
pub fn wait_counts(
    state: &(std::sync::Mutex<Counts>, std::sync::Condvar),
    what: &str,
    ready: impl Fn(&Counts) -> bool,
) -> Counts {
    let mut g = state.0.lock().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !ready(&g) {
        let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) else {
            let counts = *g;
            drop(g);
            panic!("stuck waiting for {what}: {counts:?}");
        };
        g = state.1.wait_timeout(g, left).unwrap().0;
    }
    *g
}

/// Lets one blocked (or the next) `perform` call return; wait for `releases == 0` before
/// counting the calls still inside.
pub fn release_one(state: &(std::sync::Mutex<Counts>, std::sync::Condvar)) {
    state.0.lock().unwrap().releases += 1;
    state.1.notify_all();
}

/// Counts an answer received by the test.
pub fn note_answer(state: &(std::sync::Mutex<Counts>, std::sync::Condvar)) {
    state.0.lock().unwrap_or_else(|p| p.into_inner()).answered += 1;
    state.1.notify_all();
}

impl KeyHandle for CountingKey {
    fn ski(&self) -> [u8; 20] {
        self.ski
    }
    fn certificate_digest(&self) -> Option<[u8; 32]> {
        None
    }
    fn hostnames(&self) -> &[String] {
        &[]
    }
    fn algorithm(&self) -> mbx_keyless::KeyAlgorithm {
        mbx_keyless::KeyAlgorithm::Ed25519
    }
    fn perform(
        &self,
        _op: mbx_keyless::KeyOperation,
        input: &[u8],
    ) -> Result<zeroize::Zeroizing<Vec<u8>>, mbx_keyless::OperationError> {
        let (lock, cv) = &*self.state;
        let mut g = lock.lock().unwrap_or_else(|p| p.into_inner());
        g.current += 1;
        g.entered += 1;
        g.max = g.max.max(g.current);
        cv.notify_all();
        while g.releases == 0 {
            g = cv.wait(g).unwrap_or_else(|p| p.into_inner());
        }
        g.releases -= 1;
        g.current -= 1;
        cv.notify_all();
        Ok(zeroize::Zeroizing::new(
            input.iter().rev().copied().collect(),
        ))
    }
}
