//! Sender → middlebox → receiver over real TLS sessions (rustls through `mbx-engine`), in memory.
//!
//! `AES_k(r)` for the rule chunks is computed by the tests from `k` in place of the garbled-circuit
//! setup (the production API never takes `k` on the middlebox side).

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;

use mbx_blindbox::channel::{ChannelParams, ChannelWriter, Privacy};
use mbx_blindbox::detect::{DetectionPlan, EncryptedRules};
use mbx_blindbox::dpienc::{KeywordKey, TokenEncryptor, TokenMsg};
use mbx_blindbox::flow::{
    Culprit, FlowConfig, FlowOutput, FlowReceiver, FlowSender, MbEvent, MiddleboxFlow,
    Misbehaviour, PrimaryKeys, ValidationError,
};
use mbx_blindbox::fullrule::FullRuleSet;
use mbx_blindbox::plaintext::PlaintextMatcher;
use mbx_blindbox::rules::{parse_rule, parse_rules, BufferPolicy, Direction, MatchRule, Rule};
use mbx_blindbox::sender::Sender;
use mbx_blindbox::tokenize::{CaseMode, FlowTokenizer, Tokenization};
use mbx_blindbox::SessionKeys;
use mbx_engine::{Identity, RustlsEngine, TlsConfig, TlsEngine};
use mbx_record::{ContentType, RecordSealer, TlsVersion};
use mbx_testbed::pki::{LeafSpec, TestPki};

/// A finished handshake: both sides' keys and the client's primary-stream state.
struct Session {
    client_keys: SessionKeys,
    server_keys: SessionKeys,
    /// Sending side (client tx) and receiving side (server rx) of the client→server direction.
    tx: PrimaryKeys,
    rx: PrimaryKeys,
    /// The client's handshake bytes (the middlebox sees them first on the primary stream).
    handshake_c2s: Vec<u8>,
}

fn handshake(version: TlsVersion) -> Session {
    let ca = TestPki::new("blindbox test CA").unwrap();
    let leaf = ca.issue(&LeafSpec::server("server.test")).unwrap();
    let id = Identity::from_pem(leaf.chain_pem(), leaf.key_pem().as_bytes());
    let mut sc = TlsConfig::server(id).only(version);
    sc.session_tickets = false;
    let mut cc = TlsConfig::client("server.test", ca.root_pem().into_bytes()).only(version);
    cc.session_tickets = false;
    let mut c = RustlsEngine::new(&cc).unwrap();
    let mut s = RustlsEngine::new(&sc).unwrap();
    let mut c2s = Vec::new();
    for _ in 0..16 {
        c.process().unwrap();
        let a = c.take_outgoing();
        c2s.extend_from_slice(&a);
        s.feed(&a);
        s.process().unwrap();
        let b = s.take_outgoing();
        c.feed(&b);
        if a.is_empty() && b.is_empty() && !c.is_handshaking() && !s.is_handshaking() {
            break;
        }
    }
    let client_keys = SessionKeys::derive(&c).unwrap();
    let server_keys = SessionKeys::derive(&s).unwrap();
    let ch = c.export_session().unwrap();
    let sh = s.export_session().unwrap();
    assert!(ch.pending_outgoing.is_empty() && sh.unprocessed_incoming.is_empty());
    let start = c2s.len() as u64;
    Session {
        client_keys,
        server_keys,
        tx: PrimaryKeys::from_session(&ch.session, true, start),
        rx: PrimaryKeys::from_session(&sh.session, false, start),
        handshake_c2s: c2s,
    }
}

fn encrypted_rules(
    rules: &[Rule],
    mode: Tokenization,
    keys: &SessionKeys,
) -> (Arc<EncryptedRules>, Arc<FullRuleSet>) {
    let plan = DetectionPlan::new(rules, mode, BufferPolicy::Approximate);
    // Stands in for the garbled-circuit setup.
    let k = keys.token_key();
    let kk: Vec<KeywordKey> = plan.chunks().iter().map(|c| k.keyword_key(c)).collect();
    (
        Arc::new(EncryptedRules::new(plan, &kk).unwrap()),
        Arc::new(FullRuleSet::new(rules, BufferPolicy::Approximate)),
    )
}

/// The result of one direction's run.
struct Run {
    events: Vec<MbEvent>,
    received: Vec<u8>,
    validation: Result<(), ValidationError>,
    opens: u64,
}

/// Streams through the middlebox to the receiver, tokens and records interleaved. `tamper` may
/// change each forwarded token-channel chunk (the path misbehaving).
fn relay(
    s: &Session,
    mb: &mut MiddleboxFlow,
    rx: &mut FlowReceiver,
    chunks: &[FlowOutput],
    mut tamper: impl FnMut(usize, &mut Vec<u8>),
) -> Run {
    let mut events = Vec::new();
    let mut received = Vec::new();
    let mut fwd = Vec::new();
    mb.primary_in(&s.handshake_c2s, &mut fwd, &mut events)
        .unwrap();
    let mut validation = Ok(());
    for (i, out) in chunks.iter().enumerate() {
        let mut tok = Vec::new();
        mb.token_in(&out.tokens, &mut tok, &mut events).unwrap();
        tamper(i, &mut tok);
        let mut prim = Vec::new();
        mb.primary_in(&out.primary, &mut prim, &mut events).unwrap();
        if validation.is_ok() {
            validation = rx.tokens_in(&tok);
        }
        if validation.is_ok() {
            match rx.primary_in(&prim) {
                Ok(p) => received.extend_from_slice(&p),
                Err(e) => validation = Err(e),
            }
        }
    }
    mb.finish(&mut events);
    if validation.is_ok() {
        validation = rx.finish();
    }
    Run {
        events,
        received,
        validation,
        opens: mb.records_opened(),
    }
}

fn honest(s: &Session, cfg: &FlowConfig, pieces: &[&[u8]]) -> Vec<FlowOutput> {
    let mut first = FlowOutput::default();
    let mut snd = FlowSender::new(
        cfg,
        &s.client_keys,
        Direction::ToServer,
        s.tx.clone(),
        &mut first,
    )
    .unwrap();
    let mut outs = vec![first];
    for p in pieces {
        let mut o = FlowOutput::default();
        snd.send(p, &mut o).unwrap();
        outs.push(o);
    }
    let mut o = FlowOutput::default();
    snd.finish(&mut o).unwrap();
    outs.push(o);
    outs
}

fn cfg(mode: Tokenization, case: CaseMode, privacy: Privacy) -> FlowConfig {
    FlowConfig {
        tokenization: mode,
        case,
        privacy,
        period: 4096,
        http: true,
    }
}

fn alerts(events: &[MbEvent]) -> BTreeSet<(u32, u64)> {
    events
        .iter()
        .filter_map(|e| match e {
            MbEvent::Alert(a) => Some((a.sid, a.message_start)),
            _ => None,
        })
        .collect()
}

/// An HTTP request flow with the given keywords in bodies and headers.
fn http_flow(keywords: &[Vec<u8>]) -> Vec<u8> {
    let mut f = Vec::new();
    for (i, group) in keywords.chunks(5).enumerate() {
        let mut body = b"lorem ipsum dolor sit amet, ".to_vec();
        for k in group {
            body.extend_from_slice(k);
            body.extend_from_slice(b" consectetur adipiscing ");
        }
        f.extend_from_slice(
            format!(
                "POST /page/{i}.html HTTP/1.1\r\nHost: example.test\r\nContent-Type: text/html\r\nContent-Length: {}\r\n\r\n",
                body.len()
            )
            .as_bytes(),
        );
        f.extend_from_slice(&body);
        if i % 3 == 1 {
            // An image body must not be inspected.
            let img = b"\x89PNG....binary....";
            f.extend_from_slice(
                format!(
                    "POST /up HTTP/1.1\r\nContent-Type: image/png\r\nContent-Length: {}\r\n\r\n",
                    img.len()
                )
                .as_bytes(),
            );
            f.extend_from_slice(img);
        }
    }
    f
}

#[test]
fn end_to_end_community_rules_equal_plaintext_matcher() {
    let text = common::community_rules();
    let file = parse_rules(&text, true);
    let rules: Vec<Rule> = file.rules;
    let match_rules: Vec<MatchRule> = rules
        .iter()
        .filter_map(|r| MatchRule::from_rule(r, BufferPolicy::Approximate))
        .filter(|m| m.applies(Some(Direction::ToServer)))
        .collect();
    // Keywords of 150 rules spread over the rule file.
    let step = (match_rules.len() / 150).max(1);
    let keywords: Vec<Vec<u8>> = match_rules
        .iter()
        .step_by(step)
        .flat_map(|m| m.contents.iter().map(|c| c.pattern.clone()))
        .collect();
    let flow = http_flow(&keywords);
    let oracle = PlaintextMatcher::new(match_rules).unwrap();
    let want: BTreeSet<(u32, u64)> = oracle
        .scan_flow(&flow, true, Some(Direction::ToServer))
        .into_iter()
        .map(|a| (a.sid, a.message_start))
        .collect();
    assert!(want.len() >= 100, "corpus fires {} alerts", want.len());

    for version in [TlsVersion::Tls13, TlsVersion::Tls12] {
        let s = handshake(version);
        let (enc, full) = encrypted_rules(&rules, Tokenization::Window, &s.server_keys);
        let case = if enc.plan().needs_folding() {
            CaseMode::Dual
        } else {
            CaseMode::Exact
        };
        let c = cfg(Tokenization::Window, case, Privacy::ExactMatch);
        let pieces: Vec<&[u8]> = flow.chunks(1777).collect();
        let outs = honest(&s, &c, &pieces);
        let mut mb = MiddleboxFlow::new(enc, full);
        let mut rx = FlowReceiver::new(&c, &s.server_keys, Direction::ToServer, s.rx.clone());
        let run = relay(&s, &mut mb, &mut rx, &outs, |_, _| {});
        run.validation.unwrap();
        assert_eq!(run.received, flow);
        assert_eq!(alerts(&run.events), want, "{version:?}");
        assert_eq!(run.opens, 0, "exact match never decrypts");
    }
}

const P3_RULES: &str = r#"
alert tcp any any -> any any (msg:"cmd"; flow:to_server; content:"cmd.exe?/c"; content:"dir"; pcre:"/dir\s+c:/i"; sid:3;)
alert tcp any any -> any any (msg:"plain"; content:"EVILWORDS"; sid:4;)
"#;

fn p3_setup(s: &Session) -> (Arc<EncryptedRules>, Arc<FullRuleSet>) {
    let rules = parse_rules(P3_RULES, false).rules;
    encrypted_rules(&rules, Tokenization::Window, &s.server_keys)
}

#[test]
fn protocol3_decrypts_only_flows_with_a_hit() {
    let s = handshake(TlsVersion::Tls13);
    let c = cfg(
        Tokenization::Window,
        CaseMode::Exact,
        Privacy::ProbableCause,
    );
    let innocent = b"GET /index.html HTTP/1.1\r\nHost: a\r\n\r\nGET /cmd.exx?/c HTTP/1.1\r\n\r\n";
    let guilty = b"GET /index.html HTTP/1.1\r\nHost: a\r\n\r\nGET /scripts/cmd.exe?/c+x HTTP/1.1\r\nX-Run: dir  C:\\\r\n\r\n";
    let trigger_no_pcre = b"GET /scripts/cmd.exe?/c+ls+dir HTTP/1.1\r\n\r\n";
    let mut results = Vec::new();
    for flow in [&innocent[..], &guilty[..], &trigger_no_pcre[..]] {
        let (enc, full) = p3_setup(&s);
        let outs = honest(&s, &c, &flow.chunks(10).collect::<Vec<_>>());
        let mut mb = MiddleboxFlow::new(enc, full);
        let mut rx = FlowReceiver::new(&c, &s.server_keys, Direction::ToServer, s.rx.clone());
        let run = relay(&s, &mut mb, &mut rx, &outs, |_, _| {});
        assert_eq!(run.validation, Ok(()));
        assert_eq!(run.received, flow);
        results.push(run);
    }
    // No trigger keyword: not a single primary record opened, no event at all.
    assert_eq!(results[0].opens, 0);
    assert!(results[0].events.is_empty());
    // Trigger and pcre: decrypted, the full rule (pcre, case-insensitive) fires.
    assert!(results[1].opens > 0);
    let full: Vec<u32> = results[1]
        .events
        .iter()
        .filter_map(|e| match e {
            MbEvent::FullAlert(f) => Some(f.alert.sid),
            _ => None,
        })
        .collect();
    assert_eq!(full, vec![3]);
    assert!(results[1]
        .events
        .iter()
        .any(|e| matches!(e, MbEvent::ProbableCause { sid: 3, .. })));
    // Trigger without the pcre: decrypted (probable cause), but the full rule does not match.
    assert!(results[2].opens > 0);
    assert!(!results[2]
        .events
        .iter()
        .any(|e| matches!(e, MbEvent::FullAlert(_))));
}

/// A malicious sender: the real pipeline, then `edit` on its token messages before framing.
fn malicious(
    s: &Session,
    c: &FlowConfig,
    flow: &[u8],
    edit: impl FnOnce(&mut Vec<TokenMsg>),
) -> Vec<FlowOutput> {
    let dk = s.client_keys.direction(Direction::ToServer);
    let params = ChannelParams {
        tokenization: c.tokenization,
        case: c.case,
        privacy: c.privacy,
        direction: Direction::ToServer,
    };
    let mut out = FlowOutput::default();
    let mut w = ChannelWriter::new(params, dk.frame_auth(), &mut out.tokens);
    let mut pipeline = Sender::new(
        FlowTokenizer::new(c.tokenization, c.case, c.http),
        TokenEncryptor::new(s.client_keys.token_key(), dk.salt0, c.period),
    );
    let mut msgs = Vec::new();
    pipeline.push(flow, &mut msgs);
    pipeline.finish(&mut msgs);
    edit(&mut msgs);
    for m in &msgs {
        w.push(m, &mut out.tokens).unwrap();
    }
    w.finish(&mut out.tokens).unwrap();
    let mut sealer = RecordSealer::new(s.tx.version, s.tx.keys.clone(), s.tx.next_seq);
    sealer
        .seal(ContentType::APPLICATION_DATA, flow, &mut out.primary)
        .unwrap();
    sealer
        .seal(ContentType::ALERT, &[1, 0], &mut out.primary)
        .unwrap();
    vec![out]
}

fn validate(s: &Session, c: &FlowConfig, outs: &[FlowOutput]) -> Result<(), ValidationError> {
    let rules = parse_rules(P3_RULES, false).rules;
    let (enc, full) = encrypted_rules(&rules, c.tokenization, &s.server_keys);
    let mut mb = MiddleboxFlow::new(enc, full);
    let mut rx = FlowReceiver::new(c, &s.server_keys, Direction::ToServer, s.rx.clone());
    relay(s, &mut mb, &mut rx, outs, |_, _| {}).validation
}

fn token_positions(msgs: &[TokenMsg]) -> Vec<usize> {
    msgs.iter()
        .enumerate()
        .filter(|(_, m)| matches!(m, TokenMsg::Token(_)))
        .map(|(i, _)| i)
        .collect()
}

#[test]
fn receiver_names_a_sender_that_drops_alters_reorders_or_forges_tokens() {
    let s = handshake(TlsVersion::Tls13);
    let flow = b"GET /scripts/cmd.exe?/c+dir HTTP/1.1\r\nHost: victim.test\r\n\r\n";
    for mode in [Tokenization::Window, Tokenization::Delimiter] {
        let c = cfg(mode, CaseMode::Exact, Privacy::ExactMatch);
        // The unmodified malicious pipeline is honest: validation passes (control).
        validate(&s, &c, &malicious(&s, &c, flow, |_| {})).unwrap();

        let err = |edit: &dyn Fn(&mut Vec<TokenMsg>)| {
            validate(&s, &c, &malicious(&s, &c, flow, edit)).unwrap_err()
        };
        // Omitted: the token for the keyword's position is left out.
        let e = err(&|m| {
            let i = token_positions(m)[13];
            m.remove(i);
        });
        assert_eq!(
            (e.culprit, e.what),
            (Culprit::Sender, Misbehaviour::Omitted),
            "{mode:?}"
        );
        // Omitted at the end: the last tokens are missing.
        let e = err(&|m| {
            let i = *token_positions(m).last().unwrap();
            m.truncate(i);
        });
        assert_eq!(
            (e.culprit, e.what),
            (Culprit::Sender, Misbehaviour::Omitted),
            "{mode:?}"
        );
        // Altered: one ciphertext changed.
        let e = err(&|m| {
            let i = token_positions(m)[5];
            if let TokenMsg::Token(t) = &mut m[i] {
                t.c1[0] ^= 1;
            }
        });
        assert_eq!(
            (e.culprit, e.what),
            (Culprit::Sender, Misbehaviour::Altered),
            "{mode:?}"
        );
        assert!(e.offset.is_some());
        // Reordered: two ciphertexts swapped between their positions.
        let e = err(&|m| {
            let p = token_positions(m);
            let (a, b) = (p[3], p[9]);
            let (TokenMsg::Token(ta), TokenMsg::Token(tb)) = (m[a], m[b]) else {
                unreachable!()
            };
            if let TokenMsg::Token(t) = &mut m[a] {
                t.c1 = tb.c1;
            }
            if let TokenMsg::Token(t) = &mut m[b] {
                t.c1 = ta.c1;
            }
        });
        assert_eq!(
            (e.culprit, e.what),
            (Culprit::Sender, Misbehaviour::Reordered),
            "{mode:?}"
        );
        // Forged: an extra token after the last one.
        let e = err(&|m| {
            let i = *token_positions(m).last().unwrap();
            let TokenMsg::Token(mut t) = m[i] else {
                unreachable!()
            };
            t.offset += 1000;
            m.push(TokenMsg::Token(t));
        });
        assert_eq!(
            (e.culprit, e.what),
            (Culprit::Sender, Misbehaviour::Forged),
            "{mode:?}"
        );
    }
}

#[test]
fn receiver_names_the_path_when_frames_change_in_transit() {
    let s = handshake(TlsVersion::Tls12);
    let c = cfg(Tokenization::Window, CaseMode::Exact, Privacy::ExactMatch);
    let flow = b"GET /a/EVILWORDS/b HTTP/1.1\r\nHost: x\r\n\r\n";
    let outs = honest(&s, &c, &[&flow[..20], &flow[20..]]);
    let rules = parse_rules(P3_RULES, false).rules;
    let run_with = |tamper: &mut dyn FnMut(usize, &mut Vec<u8>)| {
        let (enc, full) = encrypted_rules(&rules, c.tokenization, &s.server_keys);
        let mut mb = MiddleboxFlow::new(enc, full);
        let mut rx = FlowReceiver::new(&c, &s.server_keys, Direction::ToServer, s.rx.clone());
        relay(&s, &mut mb, &mut rx, &outs, tamper)
    };
    let ok = run_with(&mut |_, _| {});
    ok.validation.unwrap();
    assert!(alerts(&ok.events).contains(&(4, 0)));
    // A flipped bit in a token frame (after the middlebox read it).
    let e = run_with(&mut |i, b| {
        if i == 2 && !b.is_empty() {
            let n = b.len();
            b[n - 20] ^= 0x40;
        }
    })
    .validation
    .unwrap_err();
    assert_eq!((e.culprit, e.what), (Culprit::Path, Misbehaviour::BadTag));
    // A whole chunk of frames dropped: the next frame's sequence number is wrong.
    let e = run_with(&mut |i, b| {
        if i == 1 {
            b.clear();
        }
    })
    .validation
    .unwrap_err();
    assert_eq!((e.culprit, e.what), (Culprit::Path, Misbehaviour::BadTag));
    // The channel cut before its End frame.
    let last = outs.len() - 1;
    let e = run_with(&mut |i, b| {
        if i == last {
            b.clear();
        }
    })
    .validation
    .unwrap_err();
    assert_eq!(
        (e.culprit, e.what),
        (Culprit::Path, Misbehaviour::Truncated)
    );
}

#[test]
fn probable_cause_secrets_are_checked_by_the_receiver() {
    let s = handshake(TlsVersion::Tls13);
    let c = cfg(
        Tokenization::Window,
        CaseMode::Exact,
        Privacy::ProbableCause,
    );
    let flow = b"GET /scripts/cmd.exe?/c+dir+c: HTTP/1.1\r\n\r\n";
    validate(&s, &c, &honest(&s, &c, &[&flow[..]])).unwrap();
    // A sender that seals other keys (here: a wrong next sequence number) for the middlebox.
    let mut wrong = s.tx.clone();
    wrong.next_seq += 1;
    let mut first = FlowOutput::default();
    let _ = FlowSender::new(&c, &s.client_keys, Direction::ToServer, wrong, &mut first).unwrap();
    let mut outs = honest(&s, &c, &[&flow[..]]);
    outs[0].tokens = first.tokens;
    let rules = parse_rules(P3_RULES, false).rules;
    let (enc, full) = encrypted_rules(&rules, c.tokenization, &s.server_keys);
    let mut mb = MiddleboxFlow::new(enc, full);
    let mut rx = FlowReceiver::new(&c, &s.server_keys, Direction::ToServer, s.rx.clone());
    let run = relay(&s, &mut mb, &mut rx, &outs, |_, _| {});
    // The middlebox cannot open the records under those secrets and fails closed ...
    assert!(run
        .events
        .iter()
        .any(|e| matches!(e, MbEvent::DecryptionFailed(_))));
    assert!(mb.blocked());
    // ... and the receiver names the sender.
    let e = run.validation.unwrap_err();
    assert_eq!(
        (e.culprit, e.what),
        (Culprit::Sender, Misbehaviour::WrongSecrets)
    );
}

#[test]
fn blocking_rule_stops_forwarding() {
    let s = handshake(TlsVersion::Tls13);
    let c = cfg(Tokenization::Window, CaseMode::Exact, Privacy::ExactMatch);
    let rules = vec![parse_rule(
        r#"drop tcp any any -> any any (content:"EVILWORDS"; sid:8;)"#,
        1,
    )
    .unwrap()];
    let (enc, full) = encrypted_rules(&rules, c.tokenization, &s.server_keys);
    let outs = honest(&s, &c, &[b"GET /EVILWORDS HTTP/1.1\r\n\r\n", b"more"]);
    let mut mb = MiddleboxFlow::new(enc, full);
    let mut rx = FlowReceiver::new(&c, &s.server_keys, Direction::ToServer, s.rx.clone());
    let run = relay(&s, &mut mb, &mut rx, &outs, |_, _| {});
    assert!(mb.blocked());
    assert!(run
        .events
        .iter()
        .any(|e| matches!(e, MbEvent::Blocked { sid: 8 })));
    let e = run.validation.unwrap_err();
    assert_eq!(
        (e.culprit, e.what),
        (Culprit::Path, Misbehaviour::Truncated)
    );
}
