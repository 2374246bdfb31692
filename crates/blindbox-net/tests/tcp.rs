//! Client → BlindBox middlebox → server over TCP on loopback (tokio drivers), TLS 1.2 and 1.3.
//!
//! `AES_k(r)` for the rule chunks is computed by the test from `k` in place of the
//! garbled-circuit setup: the middlebox's `RuleSource` waits for the keys the test's client
//! hook hands over. Time is never asserted; timeouts only turn hangs into failures.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use mbx_blindbox::channel::Privacy;
use mbx_blindbox::detect::{DetectionPlan, EncryptedRules};
use mbx_blindbox::dpienc::KeywordKey;
use mbx_blindbox::flow::{Culprit, FlowConfig, MbEvent, Misbehaviour};
use mbx_blindbox::fullrule::FullRuleSet;
use mbx_blindbox::rules::{parse_rule, BufferPolicy, Rule};
use mbx_blindbox::tokenize::{CaseMode, Tokenization};
use mbx_blindbox::SessionKeys;
use mbx_blindbox_net::driver::{
    serve_middlebox, BlindBoxStream, DriverError, KeysHook, MiddleboxReport, RuleSource, Rules,
};
use mbx_blindbox_net::middlebox::{Flow, MiddleboxEvent};
use mbx_blindbox_net::NetError;
use mbx_engine::{Identity, TlsConfig};
use mbx_record::TlsVersion;
use mbx_testbed::pki::{LeafSpec, TestPki};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::time::timeout;
use zeroize::Zeroizing;

const BOUND: Duration = Duration::from_secs(60);

fn flow_cfg() -> FlowConfig {
    FlowConfig {
        tokenization: Tokenization::Window,
        case: CaseMode::Exact,
        privacy: Privacy::ExactMatch,
        period: 4096,
        http: true,
    }
}

fn rules() -> Vec<Rule> {
    vec![
        parse_rule(
            r#"alert tcp any any -> any any (msg:"marker"; content:"attack-marker-one"; sid:1001;)"#,
            1,
        )
        .unwrap(),
        parse_rule(
            r#"drop tcp any any -> any any (msg:"blocked"; content:"please-drop-this"; sid:1002;)"#,
            2,
        )
        .unwrap(),
    ]
}

/// Stands in for the garbled-circuit setup: the rules encrypted under the session's `k`.
fn encrypt(rules: &[Rule], keys: &SessionKeys) -> Rules {
    let plan = DetectionPlan::new(rules, Tokenization::Window, BufferPolicy::Approximate);
    let k = keys.token_key();
    let kk: Vec<KeywordKey> = plan.chunks().iter().map(|c| k.keyword_key(c)).collect();
    (
        Arc::new(EncryptedRules::new(plan, &kk).unwrap()),
        Arc::new(FullRuleSet::new(rules, BufferPolicy::Approximate)),
    )
}

struct World {
    client_tls: TlsConfig,
    server_tls: TlsConfig,
}

fn world(version: TlsVersion) -> World {
    let pki = TestPki::new("blindbox net root").unwrap();
    let leaf = pki.issue(&LeafSpec::server("server.test")).unwrap();
    let mut server_tls = TlsConfig::server(Identity {
        cert_chain_pem: leaf.chain_pem().into_bytes(),
        key_pem: Zeroizing::new(leaf.key_pem().as_bytes().to_vec()),
    })
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

/// One connection through the middlebox; the server echoes what it read, upper-cased.
async fn run(
    version: TlsVersion,
    request: &[u8],
) -> (
    Result<Vec<u8>, DriverError>,
    Result<Vec<u8>, DriverError>,
    MiddleboxReport,
) {
    let w = world(version);
    // The client's hook hands `k` to the middlebox's rule source (the setup's place).
    let (keys_tx, keys_rx) = oneshot::channel::<Rules>();
    let keys_tx = Arc::new(Mutex::new(Some(keys_tx)));
    let hook: KeysHook = Arc::new(move |keys: &SessionKeys| {
        if let Some(tx) = keys_tx.lock().unwrap().take() {
            let _ = tx.send(encrypt(&rules(), keys));
        }
    });
    let keys_rx = Arc::new(Mutex::new(Some(keys_rx)));
    let source: RuleSource = Arc::new(move || {
        let rx = keys_rx.lock().unwrap().take();
        Box::pin(async move {
            match rx {
                Some(rx) => rx.await.map_err(|_| "no keys".to_string()),
                None => Err("rules asked twice".to_string()),
            }
        })
    });

    let server_l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server_addr = server_l.local_addr().unwrap();
    let mb_l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mb_addr = mb_l.local_addr().unwrap();
    let server_tls = w.server_tls.clone();
    let server = tokio::spawn(async move {
        let (s, _) = server_l.accept().await.unwrap();
        let mut conn = BlindBoxStream::accept(s, &server_tls, flow_cfg(), None).await?;
        let got = conn.read_to_end().await?;
        conn.write_all(&got.to_ascii_uppercase()).await?;
        conn.finish().await?;
        Ok::<_, DriverError>(got)
    });
    let mb = tokio::spawn(async move {
        let (c, _) = mb_l.accept().await.unwrap();
        serve_middlebox(c, &server_addr.to_string(), source).await
    });
    let client = async {
        let mut conn =
            BlindBoxStream::connect(mb_addr, &w.client_tls, flow_cfg(), Some(hook)).await?;
        conn.write_all(request).await?;
        conn.finish().await?;
        conn.read_to_end().await
    };
    let client = timeout(BOUND, client).await.unwrap();
    let server = timeout(BOUND, server).await.unwrap().unwrap();
    let report = timeout(BOUND, mb).await.unwrap().unwrap();
    (client, server, report)
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
        let (client, server, report) = run(version, request).await;
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
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_keyword_no_alert() {
    let (client, server, report) = run(TlsVersion::Tls13, b"GET /harmless HTTP/1.1\r\n\r\n").await;
    assert!(client.is_ok() && server.is_ok());
    assert!(alert_sids(&report).is_empty(), "{report:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocking_rule_closes_the_connection_and_the_receiver_names_the_path() {
    let (_client, server, report) =
        run(TlsVersion::Tls13, b"GET /please-drop-this HTTP/1.1\r\n\r\n").await;
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
