//! Three-party setup in memory: exact outputs, refused chunks, every deviation detected, and
//! end-to-end detection with keys from the real setup.

use std::collections::BTreeSet;
use std::sync::Arc;

use aes::cipher::{BlockEncrypt, KeyInit};
use aes::Aes128Enc;
use mbx_blindbox::detect::Detector;
use mbx_blindbox::dpienc::{SaltScheme, TokenEncryptor, TokenKey};
use mbx_blindbox::plaintext::PlaintextMatcher;
use mbx_blindbox::rules::{BufferPolicy, MatchRule};
use mbx_blindbox::sender::Sender;
use mbx_blindbox::tokenize::{CaseMode, FlowTokenizer, Tokenization};
use mbx_blindbox_setup::{
    Endpoint, EndpointConfig, EndpointKeys, Middlebox, MiddleboxConfig, Peer, RgKey, SetupError,
    SetupOutcome, SignedChunk, TaggedRules,
};
use rand::rngs::StdRng;
use rand::SeedableRng;

const K: [u8; 16] = *b"token key k 0123";
const K_RAND: [u8; 32] = [0x5a; 32];
const K_RG: [u8; 16] = *b"rule gen key k_R";

fn aes(key: &[u8; 16], t: &[u8; 8]) -> [u8; 16] {
    let mut block = [0u8; 16];
    block[..8].copy_from_slice(t);
    let mut b = block.into();
    Aes128Enc::new(key.into()).encrypt_block(&mut b);
    b.into()
}

fn signed(words: &[&[u8; 8]]) -> Vec<SignedChunk> {
    words
        .iter()
        .map(|w| SignedChunk {
            chunk: **w,
            tag: aes(&K_RG, w),
        })
        .collect()
}

fn endpoint(k_rand: [u8; 32], k_rg: [u8; 16], seed: u64) -> Endpoint {
    let cfg = EndpointConfig {
        workers: 2,
        ..EndpointConfig::default()
    };
    Endpoint::new(
        EndpointKeys::from_parts(K, k_rand),
        &RgKey::from_bytes(k_rg),
        cfg,
        &mut StdRng::seed_from_u64(seed),
    )
    .unwrap()
}

fn middlebox(chunks: Vec<SignedChunk>, batch: u16) -> Middlebox {
    let cfg = MiddleboxConfig {
        batch,
        window: 2,
        workers: 2,
    };
    Middlebox::new(chunks, cfg, &mut StdRng::seed_from_u64(9)).unwrap()
}

/// Who reported the failure.
#[derive(Debug, PartialEq, Eq)]
enum Who {
    Mb,
    Full,
    Hash,
}

/// Moves frames between the three machines until all are done; `tamper` may change any frame
/// an endpoint sends (`Peer::Full` / `Peer::Hash`) before the middlebox sees it.
fn run(
    mb: &mut Middlebox,
    full: &mut Endpoint,
    hash: &mut Endpoint,
    mut tamper: impl FnMut(Peer, &mut Vec<u8>),
) -> Result<(), (Who, SetupError)> {
    loop {
        let mut moved = false;
        while let Some(f) = mb.poll_transmit(Peer::Full).map_err(|e| (Who::Mb, e))? {
            full.receive(&f).map_err(|e| (Who::Full, e))?;
            moved = true;
        }
        while let Some(f) = mb.poll_transmit(Peer::Hash).map_err(|e| (Who::Mb, e))? {
            hash.receive(&f).map_err(|e| (Who::Hash, e))?;
            moved = true;
        }
        while let Some(mut f) = full.poll_transmit().map_err(|e| (Who::Full, e))? {
            tamper(Peer::Full, &mut f);
            // Deliver in two pieces: framing must not depend on the split.
            let (a, b) = f.split_at(f.len() / 2);
            mb.receive(Peer::Full, a).map_err(|e| (Who::Mb, e))?;
            mb.receive(Peer::Full, b).map_err(|e| (Who::Mb, e))?;
            moved = true;
        }
        while let Some(mut f) = hash.poll_transmit().map_err(|e| (Who::Hash, e))? {
            tamper(Peer::Hash, &mut f);
            mb.receive(Peer::Hash, &f).map_err(|e| (Who::Mb, e))?;
            moved = true;
        }
        if mb.is_done() && full.is_done() && hash.is_done() {
            return Ok(());
        }
        assert!(moved, "setup stalled");
    }
}

fn honest_run(chunks: Vec<SignedChunk>, batch: u16) -> SetupOutcome {
    let mut mb = middlebox(chunks, batch);
    let mut a = endpoint(K_RAND, K_RG, 1);
    let mut b = endpoint(K_RAND, K_RG, 2);
    run(&mut mb, &mut a, &mut b, |_, _| {}).unwrap();
    assert_eq!(a.progress().circuits_done, mb.progress().circuits_total);
    assert_eq!(b.progress().circuits_done, mb.progress().circuits_total);
    assert_eq!(mb.progress().circuits_done, mb.progress().circuits_total);
    mb.finish().unwrap()
}

const WORDS: [&[u8; 8]; 5] = [
    b"evil.exe",
    b"malware-",
    b"re-agent",
    b"GET /adm",
    b"\x00\x01\xff\xfe\x10zz9",
];

#[test]
fn honest_setup_gives_exactly_aes_k_of_each_chunk() {
    // Batches of 2 over 5 chunks: several batches, the last one short.
    let out = honest_run(signed(&WORDS), 2);
    assert!(out.refused().is_empty());
    let keys = out.keyword_keys();
    assert_eq!(keys.len(), WORDS.len());
    let token_key = TokenKey::new(&K);
    for (i, w) in WORDS.iter().enumerate() {
        // Compare through the detector's own key type and with the aes crate directly.
        let mut block = [0u8; 16];
        block[..8].copy_from_slice(*w);
        let expect = aes(&K, w);
        let mut b = block.into();
        keys[i].cipher().encrypt_block(&mut b);
        let via_setup: [u8; 16] = b.into();
        let mut b = block.into();
        Aes128Enc::new((&expect).into()).encrypt_block(&mut b);
        let via_aes_crate: [u8; 16] = b.into();
        let mut b = block.into();
        token_key.keyword_key(w).cipher().encrypt_block(&mut b);
        let via_k: [u8; 16] = b.into();
        // Equal ciphertexts under the keys mean equal keys: the setup output is AES_k(t ‖ 0⁸).
        assert_eq!(via_setup, via_aes_crate, "chunk {i}");
        assert_eq!(via_setup, via_k, "chunk {i}");
    }
}

#[test]
fn zero_chunks_finish_at_once() {
    let out = honest_run(Vec::new(), 4);
    assert!(out.keyword_keys().is_empty());
}

#[test]
fn wrong_or_missing_tag_yields_zero_and_the_chunk_is_refused() {
    let mut chunks = signed(&WORDS[..3]);
    // An untagged chunk: the middlebox made the tag up.
    chunks[1].tag = [0x42; 16];
    // A tag made with another key.
    chunks[2].tag = aes(b"not the rg key!!", &chunks[2].chunk);
    let out = honest_run(chunks, 4);
    assert_eq!(out.refused(), &[1, 2]);
    // The honest chunk still comes out right; the refused ones carry nothing.
    let mut block = [0u8; 16];
    block[..8].copy_from_slice(WORDS[0]);
    let mut b = block.into();
    out.keyword_keys()[0].cipher().encrypt_block(&mut b);
    let mut e = block.into();
    TokenKey::new(&K)
        .keyword_key(WORDS[0])
        .cipher()
        .encrypt_block(&mut e);
    assert_eq!(b, e);
}

#[test]
fn endpoints_with_another_k_rg_refuse_every_chunk() {
    let mut mb = middlebox(signed(&WORDS[..2]), 4);
    let mut a = endpoint(K_RAND, [1; 16], 1);
    let mut b = endpoint(K_RAND, [1; 16], 2);
    run(&mut mb, &mut a, &mut b, |_, _| {}).unwrap();
    assert_eq!(mb.finish().unwrap().refused(), &[0, 1]);
}

fn deviating(
    full_k_rand: [u8; 32],
    hash_k_rand: [u8; 32],
    tamper: impl FnMut(Peer, &mut Vec<u8>),
) -> (Who, SetupError) {
    let mut mb = middlebox(signed(&WORDS[..3]), 2);
    let mut a = endpoint(full_k_rand, K_RG, 1);
    let mut b = endpoint(hash_k_rand, K_RG, 2);
    let err = run(&mut mb, &mut a, &mut b, tamper).unwrap_err();
    // The failure is sticky and the result is refused.
    assert!(mb.poll_transmit(Peer::Full).is_err());
    assert!(mb.finish().is_err());
    err
}

#[test]
fn endpoint_garbling_with_other_randomness_is_detected() {
    let mut other = K_RAND;
    other[31] ^= 1;
    assert_eq!(
        deviating(K_RAND, other, |_, _| {}),
        (Who::Mb, SetupError::LabelMismatch)
    );
    assert_eq!(
        deviating(other, K_RAND, |_, _| {}),
        (Who::Mb, SetupError::LabelMismatch)
    );
}

/// Frame type bytes (see `wire`).
const T_TRANSFER: u8 = 0x12;
const T_CIRCUIT: u8 = 0x13;
/// Offset of the first OT ciphertext pair in a Transfer frame: frame header, batch, OT header.
const TRANSFER_PAIRS: usize = 5 + 4 + 13;
/// Offsets in a Circuit frame: header, index, label seed, table length.
const CIRCUIT_SEED: usize = 5 + 4;
const CIRCUIT_TABLES: usize = 5 + 4 + 16 + 4;
const DECODING_BYTES: usize = 128 * 17;

#[test]
fn altered_ot_label_is_detected_by_the_label_check() {
    // Flip the same bit in both masked messages of one OT: the label the middlebox decodes
    // differs whatever its choice bit. The hash endpoint's labels are only ever compared, so
    // without the label check this run would succeed.
    for target in [Peer::Hash, Peer::Full] {
        let mut done = false;
        let err = deviating(K_RAND, K_RAND, |peer, f| {
            if peer == target && f[0] == T_TRANSFER && !done {
                f[TRANSFER_PAIRS + 40 * 32] ^= 4;
                f[TRANSFER_PAIRS + 40 * 32 + 16] ^= 4;
                done = true;
            }
        });
        assert_eq!(err, (Who::Mb, SetupError::LabelMismatch), "{target}");
    }
}

#[test]
fn altered_tables_decoding_or_label_seed_are_detected_by_the_transcript_check() {
    // A flipped decoding bit passes the output-label check and silently flips an output bit:
    // only the transcript comparison catches it.
    type Change = fn(&mut Vec<u8>);
    let cases: [(&str, Change); 3] = [
        ("table", |f| f[CIRCUIT_TABLES + 1000] ^= 1),
        ("decoding bit", |f| {
            let at = f.len() - DECODING_BYTES;
            f[at] ^= 1;
        }),
        ("label seed", |f| f[CIRCUIT_SEED] ^= 1),
    ];
    for (what, change) in cases {
        let mut n = 0;
        let err = deviating(K_RAND, K_RAND, |peer, f| {
            if peer == Peer::Full && f[0] == T_CIRCUIT {
                n += 1;
                if n == 2 {
                    change(f);
                }
            }
        });
        assert_eq!(err, (Who::Mb, SetupError::TranscriptMismatch), "{what}");
    }
}

#[test]
fn malformed_frames_are_typed_errors() {
    let err = deviating(K_RAND, K_RAND, |peer, f| {
        if peer == Peer::Hash && f[0] == 0x14 {
            f[0] = 0x13; // a circuit from the hash endpoint
        }
    });
    assert!(
        matches!(
            err,
            (
                Who::Mb,
                SetupError::Frame {
                    peer: Peer::Hash,
                    ..
                }
            )
        ),
        "{err:?}"
    );
    let err = deviating(K_RAND, K_RAND, |peer, f| {
        if peer == Peer::Full && f[0] == T_CIRCUIT {
            f.truncate(f.len() - 1);
            let len = (f.len() - 5) as u32;
            f[1..5].copy_from_slice(&len.to_be_bytes());
        }
    });
    assert!(
        matches!(
            err,
            (
                Who::Mb,
                SetupError::Protocol {
                    peer: Peer::Full,
                    ..
                }
            )
        ),
        "{err:?}"
    );
}

#[test]
fn endpoint_refuses_too_many_chunks() {
    let mut mb = middlebox(signed(&WORDS[..3]), 2);
    let mut ep = Endpoint::new(
        EndpointKeys::from_parts(K, K_RAND),
        &RgKey::from_bytes(K_RG),
        EndpointConfig {
            max_chunks: 2,
            workers: 1,
            group: 1,
        },
        &mut StdRng::seed_from_u64(1),
    )
    .unwrap();
    let f = mb.poll_transmit(Peer::Full).unwrap().unwrap();
    assert_eq!(
        ep.receive(&f),
        Err(SetupError::TooManyChunks { got: 3, max: 2 })
    );
}

const RULES: &str = r#"
alert tcp any any -> any any (msg:"one"; content:"evil.exe download"; sid:101;)
alert tcp any any -> any any (msg:"nocase"; content:"X-Malware-Agent"; nocase; sid:102;)
alert tcp any any -> any any (msg:"positional"; content:"GET /admin"; depth:10; content:"secret-token"; distance:0; sid:103;)
alert tcp any any -> any any (msg:"not in flow"; content:"never-appears-here"; sid:104;)
"#;

#[test]
fn end_to_end_detection_with_keys_from_the_real_setup() {
    let rg = RgKey::from_bytes(K_RG);
    // RG signs and writes the file; the middlebox parses it and builds its plan.
    let file = TaggedRules::sign(RULES, false, &rg).to_bytes();
    let tagged = TaggedRules::parse(&file).unwrap();
    let mode = Tokenization::Window;
    let plan = tagged.plan(mode, BufferPolicy::Approximate);
    let chunks = tagged.signed_chunks(&plan).unwrap();
    let outcome = honest_run(chunks, 4);
    let rules = Arc::new(outcome.into_encrypted_rules(plan).unwrap());

    let flow =
        b"GET /admin?q=secret-token HTTP/1.1\r\nHost: a\r\nUser-Agent: x-malware-agent\r\n\r\n\
GET /x HTTP/1.1\r\nHost: b\r\nX: evil.exe download now\r\n\r\n";
    let match_rules: Vec<MatchRule> = tagged
        .rule_file()
        .rules
        .iter()
        .filter_map(|r| MatchRule::from_rule(r, BufferPolicy::Approximate))
        .collect();
    let want: BTreeSet<(u32, u64)> = PlaintextMatcher::new(match_rules)
        .unwrap()
        .scan_flow(flow, true, None)
        .into_iter()
        .map(|a| (a.sid, a.message_start))
        .collect();
    assert_eq!(
        want.iter().map(|w| w.0).collect::<BTreeSet<_>>(),
        BTreeSet::from([101, 102, 103])
    );

    let enc = TokenEncryptor::new(TokenKey::new(&K), 1 << 20, 4096);
    let mut sender = Sender::new(FlowTokenizer::new(mode, CaseMode::Dual, true), enc);
    let mut det = Detector::new(rules, SaltScheme::ExactMatch, None);
    let mut msgs = Vec::new();
    sender.push(flow, &mut msgs);
    sender.finish(&mut msgs);
    let mut events = Vec::new();
    for m in &msgs {
        det.process(m, &mut events).unwrap();
    }
    let got: BTreeSet<(u32, u64)> = events
        .iter()
        .filter_map(|e| e.as_alert().map(|a| (a.sid, a.message_start)))
        .collect();
    assert_eq!(got, want);
}

#[test]
fn outcome_refuses_a_different_plan() {
    let rg = RgKey::from_bytes(K_RG);
    let tagged = TaggedRules::sign(RULES, false, &rg);
    let plan = tagged.plan(Tokenization::Window, BufferPolicy::Approximate);
    let mut chunks = tagged.signed_chunks(&plan).unwrap();
    chunks.pop();
    let outcome = honest_run(chunks, 8);
    assert!(matches!(
        outcome.into_encrypted_rules(plan),
        Err(SetupError::Usage(_))
    ));
}

#[test]
fn endpoint_bounds_what_a_middlebox_can_make_it_buffer() {
    let mut mb = middlebox(signed(&WORDS), 1);
    let mut ep = endpoint(K_RAND, K_RG, 1);
    let f = mb.poll_transmit(Peer::Full).unwrap().unwrap();
    ep.receive(&f).unwrap();
    // Extension messages the endpoint has not answered yet: at most MAX_WINDOW are queued.
    for batch in 0..mbx_blindbox_setup::wire::MAX_WINDOW {
        let m = mbx_blindbox_setup::Message::Extend { batch, ot: vec![] };
        if batch < 5 {
            ep.receive(&m.encode()).unwrap();
        } else {
            // Only 5 batches exist (5 chunks, batch size 1).
            assert!(matches!(
                ep.receive(&m.encode()),
                Err(SetupError::Protocol { .. })
            ));
            return;
        }
    }
}

#[test]
fn endpoint_refuses_more_outstanding_batches_than_the_window() {
    let chunks: Vec<SignedChunk> = (0..20u8)
        .map(|i| SignedChunk {
            chunk: [i; 8],
            tag: [0; 16],
        })
        .collect();
    let mut mb = middlebox(chunks, 1);
    let mut ep = endpoint(K_RAND, K_RG, 1);
    let f = mb.poll_transmit(Peer::Full).unwrap().unwrap();
    ep.receive(&f).unwrap();
    let max = mbx_blindbox_setup::wire::MAX_WINDOW;
    for batch in 0..max {
        let m = mbx_blindbox_setup::Message::Extend { batch, ot: vec![] };
        ep.receive(&m.encode()).unwrap();
    }
    let m = mbx_blindbox_setup::Message::Extend {
        batch: max,
        ot: vec![],
    };
    assert_eq!(
        ep.receive(&m.encode()),
        Err(SetupError::Protocol {
            peer: Peer::Middlebox,
            what: "more OT batches outstanding than MAX_WINDOW"
        })
    );
}

#[test]
fn middlebox_config_is_bounded() {
    for (batch, window) in [(0, 2), (129, 2), (32, 0), (32, 9)] {
        let cfg = MiddleboxConfig {
            batch,
            window,
            workers: 1,
        };
        assert!(Middlebox::new(signed(&WORDS), cfg, &mut StdRng::seed_from_u64(1)).is_err());
    }
}

/// Both endpoints derive `k` and `k_rand` from a real TLS 1.3 session's exporter; the setup then
/// gives exactly the keyword keys `mbx_blindbox::SessionKeys` (what the sender encrypts with)
/// implies.
#[test]
fn exporter_keys_of_both_endpoints_agree_with_session_keys() {
    use mbx_blindbox::SessionKeys;
    use mbx_engine::{Identity, RustlsEngine, TlsConfig, TlsEngine};
    use mbx_record::TlsVersion;
    use mbx_testbed::pki::{LeafSpec, TestPki};

    let ca = TestPki::new("setup test CA").unwrap();
    let leaf = ca.issue(&LeafSpec::server("server.test")).unwrap();
    let id = Identity::from_pem(leaf.chain_pem(), leaf.key_pem().as_bytes());
    let sc = TlsConfig::server(id).only(TlsVersion::Tls13);
    let cc = TlsConfig::client("server.test", ca.root_pem().into_bytes()).only(TlsVersion::Tls13);
    let mut c = RustlsEngine::new(&cc).unwrap();
    let mut s = RustlsEngine::new(&sc).unwrap();
    for _ in 0..16 {
        c.process().unwrap();
        let a = c.take_outgoing();
        s.feed(&a);
        s.process().unwrap();
        let b = s.take_outgoing();
        c.feed(&b);
        if a.is_empty() && b.is_empty() && !c.is_handshaking() && !s.is_handshaking() {
            break;
        }
    }
    let session = SessionKeys::derive(&c).unwrap();
    let rg = RgKey::from_bytes(K_RG);
    let cfg = || EndpointConfig {
        workers: 1,
        ..EndpointConfig::default()
    };
    let ep = |e: &RustlsEngine, seed| {
        Endpoint::new(
            EndpointKeys::derive(e).unwrap(),
            &rg,
            cfg(),
            &mut StdRng::seed_from_u64(seed),
        )
        .unwrap()
    };
    let (mut a, mut b) = (ep(&c, 1), ep(&s, 2));
    let mut mb = middlebox(signed(&WORDS[..2]), 2);
    run(&mut mb, &mut a, &mut b, |_, _| {}).unwrap();
    let out = mb.finish().unwrap();
    let token_key = session.token_key();
    for (i, w) in WORDS[..2].iter().enumerate() {
        let probe = [0x33u8; 16];
        let mut x = probe.into();
        out.keyword_keys()[i].cipher().encrypt_block(&mut x);
        let mut y = probe.into();
        token_key.keyword_key(w).cipher().encrypt_block(&mut y);
        assert_eq!(x, y);
    }
}
