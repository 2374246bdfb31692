//! Embedding mbTLS: a client fetches a page through one client-side middlebox, which runs an
//! application of ours (it stamps each request with a header), from an mbTLS server in front
//! of a plain-HTTP backend; every party on loopback, in one tokio runtime. Attestation is the
//! simulated TEE, accepted only because the client's policy says so (never in production).
//!
//! `cargo run -p mbx-mbtls --example embed`; `tests/embed_example.rs` runs it too.

use std::sync::Arc;

use mbx_mbtls::apps::{Direction, MiddleboxApp, Verdict};
use mbx_mbtls::attest::sim::{measure, signer_id};
use mbx_mbtls::attest::{HexBytes, Policy, SimulatedAttester, SimulatedPlatform};
use mbx_mbtls::driver::{
    AppFactory, MbtlsClient, MbtlsServer, MbtlsServerConfig, MiddleboxServer,
    MiddleboxServerConfig, Placement,
};
use mbx_mbtls::engine::{Identity, TlsConfig};
use mbx_mbtls::handshake::{
    ClientHandshakeConfig, ClientMiddlebox, MiddleboxHandshakeConfig, ServerHandshakeConfig,
};
use mbx_testbed::pki::{LeafSpec, TestPki};

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// Our middlebox application: inserts `X-Seen-By: <name>` after the request line of each
/// request from the client (a request line is found at the start of the stream only, which is
/// enough for one request per connection), and passes everything else on.
struct Stamp {
    name: &'static str,
    stamped: bool,
}

impl MiddleboxApp for Stamp {
    fn on_data(&mut self, dir: Direction, data: &[u8], out: &mut Vec<u8>) -> Verdict {
        match data.windows(2).position(|w| w == b"\r\n") {
            Some(end) if dir == Direction::ClientToServer && !self.stamped => {
                self.stamped = true;
                out.extend_from_slice(&data[..end + 2]);
                out.extend_from_slice(format!("X-Seen-By: {}\r\n", self.name).as_bytes());
                out.extend_from_slice(&data[end + 2..]);
            }
            _ => out.extend_from_slice(data),
        }
        Verdict::Continue
    }
}

/// Runs the whole path once and returns the page the client got.
pub async fn run() -> Res<String> {
    // Certificates: one CA for the server and the middlebox (any PKI will do). A deployment
    // reads its own files instead: `Identity::from_pem_files("chain.pem", "key.pem")?` (the
    // certificate chain, leaf first, and the private key; an error names the file at fault).
    let pki = TestPki::new("embed example CA")?;
    let identity = |spec: &LeafSpec| -> Res<Identity> {
        let leaf = pki.issue(spec)?;
        Ok(Identity::from_pem(
            leaf.chain_pem(),
            leaf.key_pem().as_bytes(),
        ))
    };
    let root = pki.root_pem().into_bytes();

    // A plain-HTTP backend that answers each request with the request it got (the test bed's
    // stand-in for the application behind the server).
    let backend = mbx_testbed::http_echo::echo_backend().await?;

    // The mbTLS server: no server-side middlebox. The builder makes its TLS contexts
    // (OpenSSL for the session with the client, rustls toward middleboxes it would have).
    let server_handshake =
        ServerHandshakeConfig::builder(identity(&LeafSpec::server("server.test"))?).build()?;
    let server = MbtlsServer::bind(
        "127.0.0.1:0",
        MbtlsServerConfig::new(server_handshake, backend.to_string()),
    )
    .await?;

    // The middlebox, in a simulated TEE whose code measurement names its app.
    let platform = Arc::new(SimulatedPlatform::generate()?);
    let measurement = measure("embed example middlebox", b"app=stamp");
    let attester = SimulatedAttester::new(platform.clone(), measurement, signer_id("embed"));
    let handshake = MiddleboxHandshakeConfig::new(
        &TlsConfig::server(identity(&LeafSpec::middlebox("mb.test"))?),
        Some(Arc::new(attester)),
    )?;
    let app: AppFactory = Arc::new(|| {
        Box::new(Stamp {
            name: "mb.test",
            stamped: false,
        })
    });
    let mut middlebox = MiddleboxServer::bind(
        "127.0.0.1:0",
        MiddleboxServerConfig::new(
            handshake,
            server.local_addr().to_string(),
            app,
            Placement::ClientSide,
        ),
    )
    .await?;

    // The client: mb.test must join, and its evidence must show that code on that platform.
    let policy = Policy {
        allow_simulated: true,
        measurements: vec![HexBytes(measurement.to_vec())],
        sim_platform_keys: vec![HexBytes(platform.public_key().to_vec())],
        ..Policy::default()
    };
    let client = ClientHandshakeConfig::builder("server.test", root)
        .middleboxes(ClientMiddlebox::Preconfigured("mb.test".into()))
        .policy(policy)
        .build()?;
    let request = b"GET / HTTP/1.1\r\nHost: server.test\r\nConnection: close\r\n\r\n";
    let mut session =
        MbtlsClient::connect_with_data(middlebox.local_addr(), client, request).await?;
    // Each middlebox's verdict in words, in path order (`{:#}` adds the TEE's signer and SVN).
    for verdict in session.verdicts_in_path_order() {
        println!("client: {verdict:#}");
    }
    let page = String::from_utf8(session.read_to_end().await?)?;
    // Our close_notify: the session ends on every hop, and the middlebox reports it.
    session.close().await?;
    let report = middlebox.next_report().await.ok_or("no middlebox report")?;
    println!(
        "middlebox: joined {}, outcome {:?}",
        report.keys_installed, report.outcome
    );
    Ok(page)
}

#[allow(dead_code)] // Not when the test includes this file.
#[tokio::main]
async fn main() -> Res<()> {
    let page = run().await?;
    println!("the page the client got:\n{page}");
    Ok(())
}
