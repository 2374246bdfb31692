//! `mbx blindbox` end to end with real processes: the rule generator's `rules keygen` and
//! `rules sign`, then `receiver`, `middlebox` and `sender` as separate processes on loopback,
//! every connection starting with the garbled-circuit rule setup over the hop connections.
//!
//! * The middlebox's alerts on a generated corpus equal the plaintext reference matcher's
//!   (Protocol I and II rules, `nocase` with the dual lane, positions that miss on purpose).
//! * Policy `alert` only alerts on a `drop` rule; policy `block` cuts the connection.
//! * A receiver with another RG key, and a tampered tagged-rules file, make the setup fail
//!   at every party, which all exit with a clear error (no hang).
//!
//! Time is never asserted; timeouts only turn hangs into failures.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use mbx_blindbox::plaintext::PlaintextMatcher;
use mbx_blindbox::rules::{parse_rules, BufferPolicy, Direction, MatchRule};
use mbx_testbed::peers::ChildGuard;
use mbx_testbed::{LeafSpec, TestPki};

mod common;
use common::{mbx, run_ok, succeeded, TimedLines};

const BOUND: Duration = Duration::from_secs(120);

/// A long-running party whose stdout lines arrive on a channel.
struct Party {
    guard: ChildGuard,
    lines: TimedLines,
    seen: Vec<String>,
}

impl Party {
    fn spawn(cmd: &mut Command) -> Party {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        Party {
            guard: ChildGuard::new(child),
            lines: TimedLines::new(stdout),
            seen: Vec::new(),
        }
    }

    /// Lines up to and including the first one containing `needle`.
    fn until(&mut self, needle: &str) -> Vec<String> {
        let mut got = Vec::new();
        loop {
            match self.lines.next() {
                Some(Ok(l)) => {
                    self.seen.push(l.clone());
                    let done = l.contains(needle);
                    got.push(l);
                    if done {
                        return got;
                    }
                }
                _ => panic!("no line with {needle:?}; so far:\n{}", self.seen.join("\n")),
            }
        }
    }

    /// The address from the "... listening on ADDR" banner.
    fn address(&mut self) -> String {
        let l = self.until("listening on ").pop().unwrap();
        let rest = &l[l.find("listening on ").unwrap() + "listening on ".len()..];
        rest.split([' ', ',']).next().unwrap().to_owned()
    }
}

/// A tiny deterministic generator (the corpus must not depend on the run).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    fn word(&mut self, len: usize) -> String {
        const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
        (0..len)
            .map(|_| ALPHABET[(self.next() % ALPHABET.len() as u64) as usize] as char)
            .collect()
    }
    fn filler(&mut self, len: usize) -> String {
        let mut s = String::new();
        while s.len() < len {
            let n = 1 + (self.next() % 7) as usize;
            s.push_str(&self.word(n));
            s.push(' ');
        }
        s.truncate(len);
        s
    }
}

struct Corpus {
    rules: String,
    flow: Vec<u8>,
    drop: String,
}

fn corpus() -> Corpus {
    let mut g = Lcg(0x5eed);
    let single: Vec<String> = (0..5).map(|i| format!("kw{i}-{}", g.word(10))).collect();
    let pairs: Vec<(String, String)> = (0..3)
        .map(|i| {
            (
                format!("pa{i}-{}", g.word(9)),
                format!("pb{i}-{}", g.word(9)),
            )
        })
        .collect();
    let nocase = format!("nocase-{}", g.word(8));
    let drop = format!("drop-me-{}", g.word(8));
    let mut rules = String::new();
    let head = "alert tcp $EXTERNAL_NET any -> $HOME_NET $HTTP_PORTS";
    for (i, k) in single.iter().enumerate() {
        rules += &format!(
            "{head} (msg:\"single keyword {i}\"; flow:to_server,established; content:\"{k}\"; sid:{};)\n",
            100 + i
        );
    }
    for (i, (a, b)) in pairs.iter().enumerate() {
        rules += &format!(
            "{head} (msg:\"keyword pair {i}\"; flow:to_server,established; content:\"{a}\"; content:\"{b}\"; distance:0; within:40; sid:{};)\n",
            200 + i
        );
    }
    rules += &format!(
        "{head} (msg:\"case-insensitive keyword\"; flow:to_server,established; content:\"{nocase}\"; nocase; sid:300;)\n"
    );
    rules += &format!(
        "drop tcp $EXTERNAL_NET any -> $HOME_NET $HTTP_PORTS (msg:\"blocking keyword\"; flow:to_server,established; content:\"{drop}\"; sid:400;)\n"
    );
    rules += "alert tcp $EXTERNAL_NET any -> $HOME_NET $HTTP_PORTS (msg:\"too short for BlindBox\"; content:\"abc\"; sid:500;)\n";

    // Requests with keywords inserted: hits, pairs in and out of position, a case variant.
    let mut flow = Vec::new();
    for req in 0..8usize {
        let mut body = g.filler(30);
        let put = |body: &mut String, s: &str, g: &mut Lcg| {
            body.push_str(s);
            body.push(' ');
            let n = 20 + (g.next() % 40) as usize;
            body.push_str(&g.filler(n));
        };
        for (i, k) in single.iter().enumerate() {
            if (req + i) % 3 == 0 {
                put(&mut body, k, &mut g);
            }
        }
        for (i, (a, b)) in pairs.iter().enumerate() {
            match (req + i) % 4 {
                0 => put(&mut body, &format!("{a}{}{b}", g.filler(10)), &mut g),
                1 => put(&mut body, &format!("{a}{}{b}", g.filler(60)), &mut g),
                2 => put(&mut body, &format!("{b} {a}"), &mut g),
                _ => put(&mut body, a, &mut g),
            }
        }
        if req % 2 == 1 {
            put(&mut body, &nocase.to_ascii_uppercase(), &mut g);
        }
        if req == 5 {
            put(&mut body, &drop, &mut g);
        }
        let path = if req % 2 == 0 {
            format!("/{}", single[req % single.len()])
        } else {
            "/index.html".to_string()
        };
        flow.extend_from_slice(
            format!(
                "POST {path} HTTP/1.1\r\nHost: server.test\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        );
    }
    Corpus { rules, flow, drop }
}

/// (sid, message offset) of every alert line of the middlebox.
fn alerts(lines: &[String]) -> BTreeSet<(u32, u64)> {
    lines
        .iter()
        .filter_map(|l| {
            let rest = &l[l.find(": alert sid ")? + ": alert sid ".len()..];
            let sid = rest.split(' ').next()?.parse().ok()?;
            let off = l
                .rsplit("message at offset ")
                .next()?
                .trim_end_matches(')')
                .parse()
                .ok()?;
            Some((sid, off))
        })
        .collect()
}

fn sender(mb: &str, ca: &Path, key: &Path, input: &Path) -> Output {
    sender_cmd(mb, ca, key).arg(input).output().unwrap()
}

/// [`sender`] with the input on stdin (`--file -`).
fn sender_stdin(mb: &str, ca: &Path, key: &Path, input: &Path) -> Output {
    sender_cmd(mb, ca, key)
        .arg("-")
        .stdin(std::fs::File::open(input).unwrap())
        .output()
        .unwrap()
}

/// The sender's command line up to `--file`, whose value the caller adds.
fn sender_cmd(mb: &str, ca: &Path, key: &Path) -> Command {
    let mut cmd = mbx();
    cmd.args(["blindbox", "sender", "--middlebox", mb])
        .args(["--server-name", "server.test", "--server-ca"])
        .arg(ca)
        .arg("--rg-key")
        .arg(key)
        .args(["--case", "dual", "--timeout-secs", "100", "--file"]);
    cmd
}

/// A receiver on a free port with `server`'s certificate and the RG key `key` (dual case).
fn receiver_cmd(server: &mbx_testbed::pki::PkiFiles, key: &Path) -> Command {
    let mut cmd = mbx();
    cmd.args([
        "blindbox",
        "receiver",
        "--listen",
        "127.0.0.1:0",
        "--certificate",
    ])
    .arg(&server.chain)
    .arg("--private-key")
    .arg(&server.key)
    .arg("--rg-key")
    .arg(key)
    .args(["--case", "dual"]);
    cmd
}

fn middlebox(next_hop: &str, rules: &Path, policy: &str) -> Party {
    Party::spawn(
        mbx()
            .args([
                "blindbox",
                "middlebox",
                "--listen",
                "127.0.0.1:0",
                "--next-hop",
            ])
            .arg(next_hop)
            .arg("--rules")
            .arg(rules)
            .args(["--policy", policy, "--batch", "8", "--connections", "1"]),
    )
}

/// One sender connection through a fresh `block` middlebox whose rule setup must fail: the
/// sender's stderr (it must exit with an error) and the middlebox's lines up to the end of
/// the connection.
fn refused_setup(
    next_hop: &str,
    rules: &Path,
    ca: &Path,
    key: &Path,
    input: &Path,
) -> (String, Vec<String>) {
    let mut mb = middlebox(next_hop, rules, "block");
    let mb_addr = mb.address();
    let out = sender(&mb_addr, ca, key, input);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    (err, mb.until("connection 1: ended"))
}

#[test]
fn sign_setup_detect_block_and_refuse_with_real_processes() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let pki = TestPki::new("mbx cli blindbox root").unwrap();
    let server = pki
        .issue(&LeafSpec::server("server.test"))
        .unwrap()
        .write_to_named(d, "server")
        .unwrap();
    let c = corpus();
    std::fs::write(d.join("test.rules"), &c.rules).unwrap();
    std::fs::write(d.join("corpus.txt"), &c.flow).unwrap();

    // Rule generator: keys and the tagged rules.
    for name in ["rg.key", "other.key"] {
        let out = run_ok(
            mbx()
                .args(["blindbox", "rules", "keygen", "--out"])
                .arg(d.join(name)),
        );
        assert!(out.contains("wrote RG key"), "{out}");
    }
    let again = mbx()
        .args(["blindbox", "rules", "keygen", "--out"])
        .arg(d.join("rg.key"))
        .output()
        .unwrap();
    assert!(!again.status.success(), "keygen overwrote a key");
    let out = run_ok(
        mbx()
            .args(["blindbox", "rules", "sign", "--rg-key"])
            .arg(d.join("rg.key"))
            .arg("--rules")
            .arg(d.join("test.rules"))
            .arg("--out")
            .arg(d.join("tagged.rules")),
    );
    assert!(out.contains("signed 11 rules (0 rejected)"), "{out}");
    let out = run_ok(
        mbx()
            .args(["blindbox", "rules", "verify", "--rg-key"])
            .arg(d.join("rg.key"))
            .arg("--tagged")
            .arg(d.join("tagged.rules")),
    );
    assert!(out.contains("tags verify"), "{out}");
    // A tampered copy: every tag's first hex digit changed.
    let tagged = std::fs::read_to_string(d.join("tagged.rules")).unwrap();
    let tampered: String = tagged
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            if f.len() == 3 && f[0].len() == 16 && f[1].len() == 32 {
                let flipped = if f[1].starts_with('0') { "1" } else { "0" };
                format!("{} {flipped}{} {}\n", f[0], &f[1][1..], f[2])
            } else {
                format!("{l}\n")
            }
        })
        .collect();
    assert_ne!(tampered, tagged);
    std::fs::write(d.join("tampered.rules"), &tampered).unwrap();
    let bad = mbx()
        .args(["blindbox", "rules", "verify", "--rg-key"])
        .arg(d.join("rg.key"))
        .arg("--tagged")
        .arg(d.join("tampered.rules"))
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("does not verify under this k_RG"));

    // The receiver (real RG key) for the detection runs.
    let mut receiver = Party::spawn(
        receiver_cmd(&server, &d.join("rg.key"))
            .arg("--out")
            .arg(d.join("received.bin")),
    );
    let rcv = receiver.address();

    // 1. Policy alert: every Protocol I/II hit of the corpus, as the plaintext matcher says.
    let mut mb = middlebox(&rcv, &d.join("tagged.rules"), "alert");
    let mb_addr = mb.address();
    // The input on stdin here, from files below.
    let out = sender_stdin(
        &mb_addr,
        &server.ca,
        &d.join("rg.key"),
        &d.join("corpus.txt"),
    );
    let answer = succeeded(&out);
    assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("rule setup done"), "{err}");
    let lines = mb.until("connection 1: closed");
    assert!(mb.guard.wait_timeout(BOUND).is_some_and(|s| s.success()));
    let got = alerts(&lines);
    let parsed = parse_rules(&c.rules, false);
    let oracle = PlaintextMatcher::new(
        parsed
            .rules
            .iter()
            .filter_map(|r| MatchRule::from_rule(r, BufferPolicy::Approximate))
            .collect(),
    )
    .unwrap();
    let want: BTreeSet<(u32, u64)> = oracle
        .scan_flow(&c.flow, true, Some(Direction::ToServer))
        .iter()
        .map(|a| (a.sid, a.message_start))
        .collect();
    assert_eq!(got, want, "middlebox lines:\n{}", lines.join("\n"));
    // The corpus exercises every addressable rule, and the pairs also miss on purpose.
    let sids: BTreeSet<u32> = got.iter().map(|(s, _)| *s).collect();
    assert_eq!(
        sids,
        BTreeSet::from([100, 101, 102, 103, 104, 200, 201, 202, 300, 400])
    );
    let pair_hits = got.iter().filter(|(s, _)| (200..300).contains(s)).count();
    assert!(pair_hits < 3 * 8, "every pair position hit: {got:?}");
    assert!(!lines.iter().any(|l| l.contains("BLOCKED")), "{lines:?}");
    assert!(lines.iter().any(|l| l.contains("rule setup done")));
    receiver.until("connection 1: answered");
    assert_eq!(std::fs::read(d.join("received.bin")).unwrap(), c.flow);

    // 2. Policy block: the drop rule cuts the connection; sender and receiver see the cut.
    let exfil = format!(
        "POST /up HTTP/1.1\r\nHost: server.test\r\nContent-Length: 30\r\n\r\nsecret {:<23}",
        c.drop
    );
    std::fs::write(d.join("exfil.txt"), exfil).unwrap();
    let mut mb = middlebox(&rcv, &d.join("tagged.rules"), "block");
    let mb_addr = mb.address();
    let out = sender(
        &mb_addr,
        &server.ca,
        &d.join("rg.key"),
        &d.join("exfil.txt"),
    );
    assert!(!out.status.success());
    assert!(
        out.stdout.is_empty(),
        "an answer through a blocked connection"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("mbx: error:"), "{err}");
    let lines = mb.until("connection 1: closed");
    assert!(
        lines
            .iter()
            .any(|l| l.contains("BLOCKED by sid 400 \"blocking keyword\"")),
        "{lines:?}"
    );
    let r = receiver.until("connection 2 failed");
    assert!(
        r.last()
            .unwrap()
            .contains("ended without its End frame; blamed on the path"),
        "{r:?}"
    );

    // 3. A receiver with another RG key: the setup fails at every party.
    let mut rogue =
        Party::spawn(receiver_cmd(&server, &d.join("other.key")).args(["--connections", "1"]));
    let rogue_addr = rogue.address();
    let (err, lines) = refused_setup(
        &rogue_addr,
        &d.join("tagged.rules"),
        &server.ca,
        &d.join("rg.key"),
        &d.join("corpus.txt"),
    );
    assert!(
        err.contains("refused by the middlebox: rule setup failed: check failed"),
        "{err}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("REFUSED: rule setup failed")),
        "{lines:?}"
    );
    let r = rogue.until("connection 1 failed");
    assert!(
        r.last().unwrap().contains("refused by the middlebox"),
        "{r:?}"
    );
    assert!(rogue
        .guard
        .wait_timeout(BOUND)
        .is_some_and(|s| !s.success()));

    // 4. A tampered tagged-rules file: the circuits refuse the chunks, the connection is refused.
    let (err, lines) = refused_setup(
        &rcv,
        &d.join("tampered.rules"),
        &server.ca,
        &d.join("rg.key"),
        &d.join("corpus.txt"),
    );
    assert!(
        err.contains("rule chunks were refused (their RG tag did not verify)"),
        "{err}"
    );
    assert!(lines.iter().any(|l| l.contains("REFUSED")), "{lines:?}");
    let r = receiver.until("connection 3 failed");
    assert!(
        r.last().unwrap().contains("their RG tag did not verify"),
        "{r:?}"
    );

    // 5. The receiver serves connections concurrently: with a connection that never starts its
    //    handshake open, another sender still gets through (one at a time, it would wait).
    let idle = std::net::TcpStream::connect(&rcv).unwrap();
    let mut mb = middlebox(&rcv, &d.join("tagged.rules"), "alert");
    let mb_addr = mb.address();
    let out = sender(
        &mb_addr,
        &server.ca,
        &d.join("rg.key"),
        &d.join("corpus.txt"),
    );
    assert!(succeeded(&out).starts_with("HTTP/1.1 200 OK"));
    receiver.until("connection 5: answered");
    drop(idle);
    receiver.until("connection 4 failed");
}

#[test]
fn blindbox_demo_shows_alerts_a_block_and_a_refused_setup() {
    let text = run_ok(mbx().args(["blindbox", "demo"]));
    for expected in [
        "rule generator: k_RG key id ",
        "rule setup, sender: ",
        "middlebox: alert sid 1000002 \"SQL union select - possible sql injection attempt\"",
        "middlebox: alert sid 1000005 \"INDICATOR-COMPROMISE private key in a response\" (receiver -> sender",
        "[blindbox 2] clean traffic",
        "middlebox: no alert",
        "a blocking rule cut the connection: checked",
        "refused at every party, no data sent: checked",
        "All checks passed.",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }
}

#[test]
fn blindbox_parties_read_their_options_from_the_config_file() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("mbx.toml");
    std::fs::write(
        &config,
        "[blindbox.middlebox]\nnext_hop = \"127.0.0.1:1\"\nrules = \"/nonexistent/tagged.rules\"\n",
    )
    .unwrap();
    let out = mbx()
        .arg("--config")
        .arg(&config)
        .args(["blindbox", "middlebox"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot load the tagged rules /nonexistent/tagged.rules"),
        "{err}"
    );
    std::fs::write(
        &config,
        "[blindbox.sender]\nmiddlebox = \"127.0.0.1:1\"\nserver_name = \"x\"\nserver_ca = \"/nonexistent/ca.pem\"\nrg_key = \"/nonexistent/rg.key\"\ntokenization = \"sideways\"\n",
    )
    .unwrap();
    let out = mbx()
        .arg("--config")
        .arg(&config)
        .args(["blindbox", "sender"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("unknown tokenization \"sideways\""),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
