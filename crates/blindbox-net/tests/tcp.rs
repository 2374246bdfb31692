//! Client → BlindBox middlebox → server over TCP on loopback (tokio drivers), TLS 1.2 and 1.3,
//! with the real rule setup: the rules are signed with an RG key into a tagged-rules file, the
//! middlebox runs the garbled-circuit setup with both endpoints over the hop connections and
//! obtains `AES_k(r)` only through it. Deviations (another RG key, a tampered tag, an endpoint
//! that refuses the setup, disagreeing endpoints) refuse the connection at every party. Time is
//! never asserted; timeouts only turn hangs into failures.

use std::sync::Arc;
use std::time::Duration;

use mbx_blindbox::channel::Privacy;
use mbx_blindbox::flow::{Culprit, FlowConfig, MbEvent, Misbehaviour};
use mbx_blindbox::rules::BufferPolicy;
use mbx_blindbox::tokenize::{CaseMode, Tokenization};
use mbx_blindbox_net::driver::{serve_middlebox, BlindBoxStream, DriverError, MiddleboxReport};
use mbx_blindbox_net::middlebox::{Flow, MiddleboxEvent};
use mbx_blindbox_net::{NetError, Policy, RuleBook, SetupConfig};
use mbx_blindbox_setup::{ChunkTag, MiddleboxConfig, RgKey, TaggedRules};
use mbx_engine::{Identity, TlsConfig};
use mbx_record::TlsVersion;
use mbx_testbed::pki::{LeafSpec, TestPki};
use tokio::net::TcpListener;
use tokio::time::timeout;

const BOUND: Duration = Duration::from_secs(120);

fn flow_cfg() -> FlowConfig {
    FlowConfig {
        tokenization: Tokenization::Window,
        case: CaseMode::Exact,
        privacy: Privacy::ExactMatch,
        period: 4096,
        http: true,
    }
}

const RULES: &str = concat!(
    "alert tcp any any -> any any (msg:\"marker\"; content:\"attack-marker-one\"; sid:1001;)\n",
    "drop tcp any any -> any any (msg:\"blocked\"; content:\"please-drop-this\"; sid:1002;)\n",
    "alert tcp any any -> any any (msg:\"two keywords\"; content:\"first-keyword\"; content:\"second-keyword\"; distance:0; sid:1003;)\n",
);

fn rg_key(byte: u8) -> RgKey {
    RgKey::from_bytes([byte; 16])
}

fn book_from(tagged: &TaggedRules, policy: Policy) -> Arc<RuleBook> {
    let setup = MiddleboxConfig {
        batch: 4,
        window: 2,
        workers: 2,
    };
    Arc::new(RuleBook::new(tagged, BufferPolicy::Approximate, policy, setup).unwrap())
}

fn book() -> Arc<RuleBook> {
    book_from(&TaggedRules::sign(RULES, false, &rg_key(7)), Policy::Block)
}

struct World {
    client_tls: TlsConfig,
    server_tls: TlsConfig,
}

fn world(version: TlsVersion) -> World {
    let pki = TestPki::new("blindbox net root").unwrap();
    let leaf = pki.issue(&LeafSpec::server("server.test")).unwrap();
    let mut server_tls = TlsConfig::server(Identity::from_pem(
        leaf.chain_pem(),
        leaf.key_pem().as_bytes(),
    ))
    .only(version);
    server_tls.session_tickets = false;
    let mut client_tls =
        TlsConfig::client("server.test", pki.root_pem().into_bytes()).only(version);
    client_tls.session_tickets = false;
    World {
        client_tls,
        server_tls,
    }
}

/// What each party of one connection ended with.
struct Run {
    client: Result<Vec<u8>, DriverError>,
    server: Result<Vec<u8>, DriverError>,
    report: MiddleboxReport,
}

struct Parties {
    book: Arc<RuleBook>,
    client_setup: SetupConfig,
    server_setup: SetupConfig,
    client_flow: FlowConfig,
    server_flow: FlowConfig,
}

impl Parties {
    fn honest() -> Self {
        Parties {
            book: book(),
            client_setup: SetupConfig::new(rg_key(7)),
            server_setup: SetupConfig::new(rg_key(7)),
            client_flow: flow_cfg(),
            server_flow: flow_cfg(),
        }
    }
}

/// One connection through the middlebox; the server echoes what it read, upper-cased.
async fn run(version: TlsVersion, request: &[u8], p: Parties) -> Run {
    let w = world(version);
    let server_l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server_addr = server_l.local_addr().unwrap();
    let mb_l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mb_addr = mb_l.local_addr().unwrap();
    let server_tls = w.server_tls.clone();
    let (server_setup, server_flow) = (p.server_setup, p.server_flow);
    let server = tokio::spawn(async move {
        let (s, _) = server_l.accept().await.unwrap();
        let mut conn = BlindBoxStream::accept(s, &server_tls, server_flow, server_setup).await?;
        assert!(conn.setup_stats().is_some());
        let got = conn.read_to_end().await?;
        conn.write_all(&got.to_ascii_uppercase()).await?;
        conn.finish().await?;
        Ok::<_, DriverError>(got)
    });
    let book = p.book;
    let mb = tokio::spawn(async move {
        let (c, _) = mb_l.accept().await.unwrap();
        serve_middlebox(c, &server_addr.to_string(), book, None).await
    });
    let client = async {
        let mut conn =
            BlindBoxStream::connect(mb_addr, &w.client_tls, p.client_flow, p.client_setup).await?;
        conn.write_all(request).await?;
        conn.finish().await?;
        conn.read_to_end().await
    };
    let client = timeout(BOUND, client).await.unwrap();
    let server = timeout(BOUND, server).await.unwrap().unwrap();
    let report = timeout(BOUND, mb).await.unwrap().unwrap();
    Run {
        client,
        server,
        report,
    }
}

fn alert_sids(r: &MiddleboxReport) -> Vec<(Flow, u32)> {
    r.events
        .iter()
        .filter_map(|e| match e {
            MiddleboxEvent::Detection(f, MbEvent::Alert(a)) => Some((*f, a.sid)),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detects_the_keyword_and_both_endpoints_validate_both_versions() {
    for version in [TlsVersion::Tls12, TlsVersion::Tls13] {
        let request =
            b"POST /form HTTP/1.1\r\nHost: server.test\r\nContent-Type: text/plain\r\nContent-Length: 28\r\n\r\nsome attack-marker-one text.";
        let Run {
            client,
            server,
            report,
        } = run(version, request, Parties::honest()).await;
        let got = server.unwrap();
        assert_eq!(got, request, "{version:?}");
        // The reply (upper-cased) does not contain the lower-case keyword: one alert only,
        // client to server.
        assert_eq!(client.unwrap(), request.to_ascii_uppercase());
        assert_eq!(
            alert_sids(&report),
            vec![(Flow::ToServer, 1001)],
            "{report:?}"
        );
        assert!(report.outcome.is_ok(), "{report:?}");
        assert!(report.events.contains(&MiddleboxEvent::Ready));
        // Every chunk of the window plan went through the garbled circuits.
        let setup = report.setup.expect("setup stats");
        assert_eq!(
            setup.progress.circuits_done as usize,
            book().chunk_count(Tokenization::Window)
        );
        assert!(setup.progress.bytes_received > 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_keyword_no_alert() {
    let Run {
        client,
        server,
        report,
    } = run(
        TlsVersion::Tls13,
        b"GET /harmless HTTP/1.1\r\n\r\n",
        Parties::honest(),
    )
    .await;
    assert!(client.is_ok() && server.is_ok());
    assert!(alert_sids(&report).is_empty(), "{report:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocking_rule_closes_the_connection_and_the_receiver_names_the_path() {
    let Run { server, report, .. } = run(
        TlsVersion::Tls13,
        b"GET /please-drop-this HTTP/1.1\r\n\r\n",
        Parties::honest(),
    )
    .await;
    assert!(report.events.iter().any(|e| matches!(
        e,
        MiddleboxEvent::Detection(Flow::ToServer, MbEvent::Blocked { sid: 1002 })
    )));
    match server {
        Err(DriverError::Net(NetError::Validation(v))) => {
            assert_eq!(
                (v.culprit, v.what),
                (Culprit::Path, Misbehaviour::Truncated)
            )
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protocol_ii_rule_and_delimiter_tokenization_through_the_setup() {
    let mut p = Parties::honest();
    let flow = FlowConfig {
        tokenization: Tokenization::Delimiter,
        case: CaseMode::Dual,
        privacy: Privacy::ProbableCause,
        ..flow_cfg()
    };
    p.client_flow = flow;
    p.server_flow = flow;
    let request =
        b"POST /x HTTP/1.1\r\nContent-Length: 40\r\n\r\nfirst-keyword then the second-keyword .";
    let Run {
        client,
        server,
        report,
    } = run(TlsVersion::Tls12, request, p).await;
    assert_eq!(server.unwrap(), request);
    assert!(client.is_ok());
    assert_eq!(
        alert_sids(&report),
        vec![(Flow::ToServer, 1003)],
        "{report:?}"
    );
    assert!(report.events.iter().any(|e| matches!(
        e,
        MiddleboxEvent::SetupStarted { params, .. } if params.tokenization == Tokenization::Delimiter
    )));
}

/// Every party must end with an error naming the refusal; nothing was forwarded.
fn assert_refused(r: &Run, needle: &str) {
    let refused = |res: &Result<Vec<u8>, DriverError>, who: &str| match res {
        Err(DriverError::Net(NetError::Refused(why))) => {
            assert!(why.contains(needle), "{who}: {why}")
        }
        Err(DriverError::Net(NetError::Setup(why))) => {
            assert!(why.contains(needle), "{who} (own setup): {why}")
        }
        other => panic!("{who} was not refused: {other:?}"),
    };
    refused(&r.client, "client");
    refused(&r.server, "server");
    let why = r.report.outcome.as_ref().unwrap_err();
    assert!(why.contains(needle), "middlebox: {why}");
    assert!(!r.report.events.contains(&MiddleboxEvent::Ready));
    assert!(r
        .report
        .events
        .iter()
        .any(|e| matches!(e, MiddleboxEvent::Refused(_))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_with_another_rg_key_is_refused() {
    // The server garbles with another k_RG: its circuits differ from the client's, so the
    // transcript check fails at the middlebox, whichever endpoint deviates.
    let mut p = Parties::honest();
    p.server_setup = SetupConfig::new(rg_key(8));
    let r = run(TlsVersion::Tls13, b"GET / HTTP/1.1\r\n\r\n", p).await;
    assert_refused(&r, "does not match the other endpoint's digest");
    let mut p = Parties::honest();
    p.client_setup = SetupConfig::new(rg_key(8));
    let r = run(TlsVersion::Tls12, b"GET / HTTP/1.1\r\n\r\n", p).await;
    assert_refused(&r, "rule setup failed: check failed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tampered_tag_is_refused_by_the_circuit() {
    let tagged = TaggedRules::sign(RULES, false, &rg_key(7));
    // Flip a bit of the tag of one chunk the window plan uses.
    let target = tagged
        .plan(Tokenization::Window, BufferPolicy::Approximate)
        .chunks()[0];
    let mut chunks: Vec<ChunkTag> = tagged.chunks().to_vec();
    chunks.iter_mut().find(|c| c.chunk == target).unwrap().tag[0] ^= 1;
    let tampered = TaggedRules::from_parts(
        tagged.key_id(),
        false,
        chunks,
        tagged.rules_text().to_string(),
    )
    .unwrap();
    let mut p = Parties::honest();
    p.book = book_from(&tampered, Policy::Block);
    let r = run(TlsVersion::Tls13, b"GET / HTTP/1.1\r\n\r\n", p).await;
    assert_refused(
        &r,
        "1 rule chunks were refused (their RG tag did not verify)",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_that_refuses_the_setup_refuses_the_connection() {
    // The server accepts at most one chunk: it aborts, and everyone learns why.
    let mut p = Parties::honest();
    p.server_setup.endpoint.max_chunks = 1;
    let r = run(TlsVersion::Tls13, b"GET / HTTP/1.1\r\n\r\n", p).await;
    assert_refused(&r, "this endpoint accepts at most 1");
    match &r.client {
        Err(DriverError::Net(NetError::Refused(why))) => {
            assert!(why.contains("the server aborted"), "{why}")
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoints_that_disagree_on_the_tokenization_are_refused() {
    let mut p = Parties::honest();
    p.server_flow.tokenization = Tokenization::Delimiter;
    let r = run(TlsVersion::Tls13, b"GET / HTTP/1.1\r\n\r\n", p).await;
    assert_refused(&r, "the endpoints disagree on the token channel");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alert_policy_never_blocks_and_block_all_blocks_every_hit() {
    let tagged = TaggedRules::sign(RULES, false, &rg_key(7));
    let mut p = Parties::honest();
    p.book = book_from(&tagged, Policy::Alert);
    let request = b"GET /please-drop-this HTTP/1.1\r\n\r\n";
    let r = run(TlsVersion::Tls13, request, p).await;
    assert_eq!(r.server.unwrap(), request);
    assert_eq!(alert_sids(&r.report), vec![(Flow::ToServer, 1002)]);

    let mut p = Parties::honest();
    p.book = book_from(&tagged, Policy::BlockAll);
    let r = run(
        TlsVersion::Tls13,
        b"GET /attack-marker-one HTTP/1.1\r\n\r\n",
        p,
    )
    .await;
    assert!(r.report.events.iter().any(|e| matches!(
        e,
        MiddleboxEvent::Detection(Flow::ToServer, MbEvent::Blocked { sid: 1001 })
    )));
    assert!(r.server.is_err());
}

/// An endpoint that connects and then says nothing must not hold the middlebox forever: after
/// `SETUP_DEADLINE` the middlebox refuses the connection and tells the endpoint why. The clock
/// is tokio's paused test clock, so the deadline passes without waiting for it.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_silent_endpoint_is_refused_after_the_setup_deadline() {
    use tokio::io::AsyncReadExt;
    let next_hop = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let next_addr = next_hop.local_addr().unwrap().to_string();
    let mb_listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mb_addr = mb_listener.local_addr().unwrap();
    let middlebox = tokio::spawn(async move {
        let (sock, _) = mb_listener.accept().await.unwrap();
        serve_middlebox(sock, &next_addr, book(), None).await
    });
    let mut silent = tokio::net::TcpStream::connect(mb_addr).await.unwrap();
    let (_server_side, _) = next_hop.accept().await.unwrap();
    // Far beyond the deadline (paused clock): without the deadline this fails instead of hanging.
    let report = timeout(Duration::from_secs(3600), middlebox)
        .await
        .expect("the middlebox kept a silent endpoint's connection open")
        .unwrap();
    let err = report
        .outcome
        .expect_err("a silent endpoint must be refused");
    assert!(err.contains("did not finish within"), "{err}");
    assert!(
        report
            .events
            .iter()
            .any(|e| matches!(e, MiddleboxEvent::Refused(_))),
        "{:?}",
        report.events
    );
    // The endpoint is told why (a Refused control frame), then the connection ends.
    let mut got = Vec::new();
    silent.read_to_end(&mut got).await.unwrap();
    assert!(
        String::from_utf8_lossy(&got).contains("did not finish within"),
        "{got:?}"
    );
}
