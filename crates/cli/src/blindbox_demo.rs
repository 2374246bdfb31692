//! `mbx blindbox demo` (and the BlindBox part of `mbx demo`): the rule generator signs a few
//! community-style rules, a middlebox, a sender and a receiver run on loopback, each connection
//! starts with the garbled-circuit rule setup, and traffic with attack strings, clean traffic
//! and an exfiltration attempt a `drop` rule blocks go through. Everything printed is measured
//! or checked: the middlebox's alerts must be exactly the expected ones, both endpoints must
//! validate every byte, the blocked connection must be cut, and (full demo) a receiver with
//! another RG key must make the setup fail at every party.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, ensure, Context};
use mbx_blindbox::flow::{FlowConfig, MbEvent};
use mbx_blindbox::rules::BufferPolicy;
use mbx_blindbox::tokenize::Tokenization;
use mbx_blindbox_net::driver::{
    serve_middlebox, BlindBoxStream, DriverError, EventSink, MiddleboxReport, SetupStats,
};
use mbx_blindbox_net::middlebox::{Flow, MiddleboxEvent};
use mbx_blindbox_net::{NetError, Policy, RuleBook, SetupConfig};
use mbx_blindbox_setup::{MiddleboxConfig, RgKey, TaggedRules};
use mbx_engine::{Identity, TlsConfig};
use mbx_testbed::pki::{KeyType, LeafSpec, TestPki};
use tokio::net::TcpListener;

use crate::blindbox::{answer, describe_flow, event_line, flow_config, setup_line};

const SERVER: &str = "receiver.test";
/// Bound on one connection; only there so a broken path fails instead of hanging.
const BOUND: Duration = Duration::from_secs(120);

/// Community-style rules: Protocol I (one keyword, one of them `nocase`), Protocol II (two
/// keywords with relative positions), a rule on the answer direction and a blocking rule.
pub const DEMO_RULES: &str = r#"# mbx BlindBox demo rules (community-rule style)
alert tcp $EXTERNAL_NET any -> $HOME_NET $HTTP_PORTS (msg:"SERVER-OTHER /etc/passwd access attempt"; flow:to_server,established; content:"/etc/passwd"; metadata:service http; classtype:attempted-recon; sid:1000001; rev:1;)
alert tcp $EXTERNAL_NET any -> $HOME_NET $HTTP_PORTS (msg:"SQL union select - possible sql injection attempt"; flow:to_server,established; content:"union select"; nocase; metadata:service http; classtype:web-application-attack; sid:1000002; rev:1;)
alert tcp $HOME_NET any -> $EXTERNAL_NET $HTTP_PORTS (msg:"MALWARE-CNC downloader check-in"; flow:to_server,established; content:"cmd=download"; content:"payload.exe"; distance:0; within:64; metadata:service http; classtype:trojan-activity; sid:1000003; rev:1;)
drop tcp $HOME_NET any -> $EXTERNAL_NET $HTTP_PORTS (msg:"POLICY-OTHER exfiltration marker - connection blocked"; flow:to_server,established; content:"TOP-SECRET-EXFIL"; metadata:service http; classtype:policy-violation; sid:1000004; rev:1;)
alert tcp $EXTERNAL_NET $HTTP_PORTS -> $HOME_NET any (msg:"INDICATOR-COMPROMISE private key in a response"; flow:to_client,established; content:"BEGIN RSA PRIVATE KEY"; metadata:service http; classtype:policy-violation; sid:1000005; rev:1;)
"#;

const ATTACKS: &str = "GET /cgi-bin/view?file=../../../../etc/passwd HTTP/1.1\r\nHost: receiver.test\r\n\r\n\
POST /search HTTP/1.1\r\nHost: receiver.test\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 72\r\n\r\n\
q=1 UNION SELECT password FROM users--&cmd=download&file=payload.exe&x=1\
GET /leak HTTP/1.1\r\nHost: receiver.test\r\n\r\n";

const CLEAN: &str = "GET /index.html HTTP/1.1\r\nHost: receiver.test\r\nAccept: text/html\r\n\r\n\
POST /comments HTTP/1.1\r\nHost: receiver.test\r\nContent-Type: text/plain\r\nContent-Length: 54\r\n\r\n\
Nice article on encrypted traffic inspection, thanks!\n";

const EXFIL: &str = "POST /upload HTTP/1.1\r\nHost: receiver.test\r\nContent-Type: text/plain\r\nContent-Length: 40\r\n\r\n\
payroll.csv TOP-SECRET-EXFIL 4242 rows\r\n";

/// What the three parties of one connection saw.
struct Outcome {
    sender: Result<(Vec<u8>, Option<SetupStats>), DriverError>,
    receiver: Result<Vec<u8>, DriverError>,
    report: MiddleboxReport,
    lines: Vec<String>,
}

struct World {
    client_tls: TlsConfig,
    server_tls: TlsConfig,
    flow: FlowConfig,
}

/// The demo receiver's answer: the `auto` answer, plus a private key marker when asked for
/// `/leak` (so the answer direction raises an alert too).
fn demo_answer(data: &[u8]) -> Vec<u8> {
    let mut a = answer("auto", data);
    if data.windows(10).any(|w| w == b"GET /leak ") {
        let body = "-----BEGIN RSA PRIVATE KEY-----\nMIIEdemo...\n-----END RSA PRIVATE KEY-----\n";
        a.extend_from_slice(
            format!(
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        );
    }
    a
}

/// One connection: sender → middlebox → receiver, each party in its own task.
async fn connection(
    w: &World,
    book: Arc<RuleBook>,
    sender_key: RgKey,
    receiver_key: RgKey,
    request: &[u8],
) -> anyhow::Result<Outcome> {
    let rcv_l = TcpListener::bind("127.0.0.1:0").await?;
    let rcv_addr = rcv_l.local_addr()?;
    let mb_l = TcpListener::bind("127.0.0.1:0").await?;
    let mb_addr = mb_l.local_addr()?;
    let (server_tls, flow) = (w.server_tls.clone(), w.flow);
    let receiver = tokio::spawn(async move {
        let (s, _) = rcv_l.accept().await.map_err(|e| DriverError::Io {
            context: "accept",
            error: e,
        })?;
        let mut conn =
            BlindBoxStream::accept(s, &server_tls, flow, SetupConfig::new(receiver_key)).await?;
        let got = conn.read_to_end().await?;
        conn.write_all(&demo_answer(&got)).await?;
        conn.finish().await?;
        Ok::<_, DriverError>(got)
    });
    let lines = Arc::new(Mutex::new(Vec::new()));
    let sink: EventSink = {
        let (lines, book) = (lines.clone(), book.clone());
        Arc::new(move |ev: &MiddleboxEvent| {
            let keep = matches!(
                ev,
                MiddleboxEvent::Detection(..) | MiddleboxEvent::Refused(_)
            );
            if keep {
                if let Ok(mut v) = lines.lock() {
                    v.push(event_line(&book, ev));
                }
            }
        })
    };
    let mb = tokio::spawn(async move {
        let (c, _) = mb_l.accept().await?;
        anyhow::Ok(serve_middlebox(c, &rcv_addr.to_string(), book, Some(sink)).await)
    });
    let sender = async {
        let mut conn =
            BlindBoxStream::connect(mb_addr, &w.client_tls, w.flow, SetupConfig::new(sender_key))
                .await?;
        let stats = conn.setup_stats();
        conn.write_all(request).await?;
        conn.finish().await?;
        Ok::<_, DriverError>((conn.read_to_end().await?, stats))
    };
    let sender = tokio::time::timeout(BOUND, sender)
        .await
        .context("the sender did not finish")?;
    let receiver = tokio::time::timeout(BOUND, receiver)
        .await
        .context("the receiver did not finish")??;
    let report = tokio::time::timeout(BOUND, mb)
        .await
        .context("the middlebox did not finish")???;
    let lines = lines.lock().map(|v| v.clone()).unwrap_or_default();
    Ok(Outcome {
        sender,
        receiver,
        report,
        lines,
    })
}

fn alerts(r: &MiddleboxReport) -> Vec<(Flow, u32)> {
    let mut v: Vec<(Flow, u32)> = r
        .events
        .iter()
        .filter_map(|e| match e {
            MiddleboxEvent::Detection(f, MbEvent::Alert(a)) => Some((*f, a.sid)),
            _ => None,
        })
        .collect();
    v.sort_by_key(|(f, sid)| (*f == Flow::ToClient, *sid));
    v
}

fn print_setup(o: &Outcome) {
    if let Ok((_, Some(st))) = &o.sender {
        println!("  rule setup, sender: {}", setup_line(st));
    }
    if let Some(st) = &o.report.setup {
        println!("  rule setup, middlebox: {}", setup_line(st));
    }
}

fn print_lines(o: &Outcome) {
    if o.lines.is_empty() {
        println!("  middlebox: no alert");
    }
    for l in &o.lines {
        println!("  middlebox: {l}");
    }
}

/// Runs the demo; `short` (the part of `mbx demo`) runs the attack and blocking connections only.
pub async fn run(short: bool) -> anyhow::Result<()> {
    let pki = TestPki::new("mbx blindbox demo CA")?;
    let leaf = pki.issue(&LeafSpec::server(SERVER).key_type(KeyType::EcdsaP256))?;
    let mut server_tls = TlsConfig::server(Identity::from_pem(
        leaf.chain_pem(),
        leaf.key_pem().as_bytes(),
    ));
    server_tls.session_tickets = false;
    let mut client_tls = TlsConfig::client(SERVER, pki.root_pem().into_bytes());
    client_tls.session_tickets = false;
    let w = World {
        client_tls,
        server_tls,
        flow: flow_config("window", "exact-match", "dual")?,
    };

    // Rule generator: k_RG and the tagged rules (through the file format the middlebox loads).
    let rg = RgKey::generate(&mut rand::rngs::OsRng);
    let signed = TaggedRules::sign(DEMO_RULES, false, &rg);
    let file = signed.to_bytes();
    let tagged = TaggedRules::parse(&file).context("re-reading the tagged rules")?;
    tagged
        .verify(&rg)
        .context("the tagged rules do not verify")?;
    let book = Arc::new(RuleBook::new(
        &tagged,
        BufferPolicy::Approximate,
        Policy::Block,
        MiddleboxConfig::default(),
    )?);
    println!(
        "\nBlindBox{}: rule generator, middlebox, sender and receiver on loopback (rustls, TLS 1.3)",
        if short { "" } else { " demo" }
    );
    println!(
        "  rule generator: k_RG key id {}; {} community-style rules signed: {} rule chunks, tagged-rules file {} bytes",
        hex::encode(rg.key_id()),
        book.rule_count(),
        tagged.chunks().len(),
        file.len()
    );
    println!(
        "  middlebox: policy block; {} rule chunks to encrypt per connection for window tokenization",
        book.chunk_count(Tokenization::Window)
    );
    println!(
        "  endpoints: {}; they hold k_RG, never the rules",
        describe_flow(&w.flow)
    );

    // 1. Attacks in both directions.
    println!("\n[blindbox 1] attacks: /etc/passwd, UNION SELECT, cmd=download … payload.exe; the answer leaks a key");
    let o = connection(&w, book.clone(), rg.clone(), rg.clone(), ATTACKS.as_bytes()).await?;
    print_setup(&o);
    print_lines(&o);
    let expected = vec![
        (Flow::ToServer, 1000001),
        (Flow::ToServer, 1000002),
        (Flow::ToServer, 1000003),
        (Flow::ToClient, 1000005),
    ];
    ensure!(
        alerts(&o.report) == expected,
        "middlebox alerts {:?}, expected {expected:?}",
        alerts(&o.report)
    );
    let got = o.receiver.context("receiver")?;
    ensure!(got == ATTACKS.as_bytes(), "the receiver got other bytes");
    println!(
        "  receiver: {} bytes received, identical to what was sent, every byte validated against its tokens",
        got.len()
    );
    let (ans, _) = o.sender.context("sender")?;
    ensure!(
        ans == demo_answer(ATTACKS.as_bytes()),
        "the sender got another answer"
    );
    println!(
        "  sender: {}-byte answer received and validated against its tokens",
        ans.len()
    );
    ensure!(
        o.report.outcome.is_ok(),
        "middlebox: {:?}",
        o.report.outcome
    );

    // 2. Clean traffic.
    if !short {
        println!("\n[blindbox 2] clean traffic");
        let o = connection(&w, book.clone(), rg.clone(), rg.clone(), CLEAN.as_bytes()).await?;
        print_setup(&o);
        print_lines(&o);
        ensure!(alerts(&o.report).is_empty(), "alerts on clean traffic");
        if let (Err(e), Err(s)) = (&o.receiver, &o.sender) {
            bail!(
                "receiver: {e}; sender: {s}; middlebox: {:?}",
                o.report.outcome
            );
        }
        let got = o.receiver.context("receiver")?;
        ensure!(got == CLEAN.as_bytes(), "the receiver got other bytes");
        o.sender.context("sender")?;
        println!(
            "  receiver: {} bytes received and validated; sender: answer validated",
            got.len()
        );
    }

    // 3. A blocking rule cuts the connection.
    println!(
        "\n[blindbox {}] exfiltration attempt (a drop rule)",
        if short { 2 } else { 3 }
    );
    let o = connection(&w, book.clone(), rg.clone(), rg.clone(), EXFIL.as_bytes()).await?;
    print_lines(&o);
    ensure!(
        o.report.events.iter().any(|e| matches!(
            e,
            MiddleboxEvent::Detection(Flow::ToServer, MbEvent::Blocked { sid: 1000004 })
        )),
        "the drop rule did not block"
    );
    match &o.receiver {
        Err(DriverError::Net(NetError::Validation(v))) => println!(
            "  receiver: connection cut before the request was complete ({v}); nothing unvalidated delivered"
        ),
        other => bail!("the receiver should have seen the connection cut, got {other:?}"),
    }
    match &o.sender {
        Err(e) => println!("  sender: {e}"),
        Ok(_) => bail!("the sender got an answer through a blocked connection"),
    }
    println!("  a blocking rule cut the connection: checked");

    // 4. A receiver with another RG key: the setup fails at every party.
    if !short {
        println!("\n[blindbox 4] a receiver configured with another RG key");
        let other = RgKey::generate(&mut rand::rngs::OsRng);
        let o = connection(&w, book.clone(), rg.clone(), other, CLEAN.as_bytes()).await?;
        print_lines(&o);
        fn refused<T>(r: &Result<T, DriverError>) -> bool {
            matches!(
                r,
                Err(DriverError::Net(NetError::Refused(_) | NetError::Setup(_)))
            )
        }
        ensure!(
            refused(&o.sender) && refused(&o.receiver) && o.report.outcome.is_err(),
            "the setup should have failed at every party"
        );
        if let Err(e) = &o.receiver {
            println!("  receiver: {e}");
        }
        if let Err(e) = &o.sender {
            println!("  sender: {e}");
        }
        println!("  refused at every party, no data sent: checked");
    }
    Ok(())
}
