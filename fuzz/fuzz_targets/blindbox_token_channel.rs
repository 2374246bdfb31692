//! Arbitrary bytes as a BlindBox token channel: the deframer, the middlebox and the receiver must
//! never panic, the deframer must not depend on how the bytes are split, and a token stream
//! derived from the input must survive the writer → deframer round trip unchanged.
#![no_main]

use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use mbx_blindbox::channel::{
    frame_msgs, ChannelParams, ChannelWriter, Deframer, FrameAuth, Privacy,
};
use mbx_blindbox::detect::{DetectionPlan, EncryptedRules};
use mbx_blindbox::dpienc::{EncToken, KeywordKey, TokenMsg};
use mbx_blindbox::flow::{FlowConfig, FlowReceiver, MiddleboxFlow, PrimaryKeys};
use mbx_blindbox::fullrule::FullRuleSet;
use mbx_blindbox::rules::{parse_rule, BufferPolicy, Direction};
use mbx_blindbox::tokenize::{CaseMode, Lane, Tokenization};
use mbx_blindbox::SessionKeys;
use mbx_record::{CipherSuite, TrafficKeys};

fn frames(data: &[u8], cut: usize) -> (Vec<TokenMsg>, bool) {
    let mut d = Deframer::new();
    let mut msgs = Vec::new();
    let cut = cut.min(data.len());
    let mut ok = true;
    for part in [&data[..cut], &data[cut..]] {
        d.push(part);
        loop {
            match d.next_frame() {
                Ok(Some(f)) => frame_msgs(&f.frame, &mut msgs),
                Ok(None) => break,
                Err(_) => {
                    ok = false;
                    break;
                }
            }
        }
    }
    (msgs, ok)
}

fuzz_target!(|data: &[u8]| {
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    // Split invariance of the deframer.
    let (a, ok_a) = frames(rest, usize::from(first));
    let (b, ok_b) = frames(rest, rest.len());
    assert_eq!(ok_a, ok_b);
    if ok_a {
        assert_eq!(a, b);
    }

    // Middlebox and receiver on the raw bytes.
    let rules = vec![parse_rule(
        r#"alert tcp any any -> any any (content:"EVILWORD"; content:"cmd.exe?/c"; pcre:"/x+/i"; sid:1;)"#,
        1,
    )
    .unwrap()];
    let keys = SessionKeys::from_parts([first; 16], [2; 32], 3);
    let plan = DetectionPlan::new(&rules, Tokenization::Window, BufferPolicy::Approximate);
    let k = keys.token_key();
    let kk: Vec<KeywordKey> = plan.chunks().iter().map(|c| k.keyword_key(c)).collect();
    let enc = Arc::new(EncryptedRules::new(plan, &kk).unwrap());
    let full = Arc::new(FullRuleSet::new(&rules, BufferPolicy::Approximate));
    let mut mb = MiddleboxFlow::new(enc, full);
    let (mut fwd, mut ev) = (Vec::new(), Vec::new());
    let _ = mb.token_in(rest, &mut fwd, &mut ev);
    let _ = mb.primary_in(rest, &mut fwd, &mut ev);
    mb.finish(&mut ev);
    let pk = PrimaryKeys {
        version: mbx_record::TlsVersion::Tls13,
        suite: CipherSuite::TLS13_AES_128_GCM_SHA256,
        keys: TrafficKeys::new(mbx_record::Aead::Aes128Gcm, &[1; 16], &[2; 12]).unwrap(),
        next_seq: 0,
        start_offset: 0,
    };
    let cfg = FlowConfig {
        tokenization: Tokenization::Window,
        case: CaseMode::Exact,
        privacy: if first & 1 == 0 {
            Privacy::ExactMatch
        } else {
            Privacy::ProbableCause
        },
        period: 64,
        http: true,
    };
    let mut rx = FlowReceiver::new(&cfg, &keys, Direction::ToServer, pk);
    let _ = rx.tokens_in(rest);
    let _ = rx.primary_in(rest);
    let _ = rx.finish();

    // Round trip of a token stream derived from the input.
    let params = ChannelParams {
        tokenization: if first & 2 == 0 {
            Tokenization::Window
        } else {
            Tokenization::Delimiter
        },
        case: if first & 4 == 0 {
            CaseMode::Exact
        } else {
            CaseMode::Dual
        },
        privacy: if first & 8 == 0 {
            Privacy::ExactMatch
        } else {
            Privacy::ProbableCause
        },
        direction: Direction::ToClient,
    };
    let mut msgs = vec![TokenMsg::Salt(u64::from(first))];
    let mut offset = 0u64;
    for chunk in rest.chunks(2) {
        let (g, v) = (chunk[0], *chunk.get(1).unwrap_or(&0));
        match g % 16 {
            0 => msgs.push(TokenMsg::Salt(u64::from(v))),
            1 => msgs.push(TokenMsg::MessageStart(offset + 1)),
            _ => {}
        }
        offset += u64::from(g % 4) + 1;
        let lanes: &[Lane] = if params.case == CaseMode::Dual {
            &[Lane::Exact, Lane::Folded]
        } else {
            &[Lane::Exact]
        };
        for lane in lanes {
            msgs.push(TokenMsg::Token(EncToken {
                offset,
                lane: *lane,
                c1: [v; 5],
                c2: (params.privacy == Privacy::ProbableCause).then_some([g; 16]),
            }));
        }
    }
    let mut out = Vec::new();
    let mut w = ChannelWriter::new(params, FrameAuth::new(&[9; 32]), &mut out);
    for m in &msgs {
        w.push(m, &mut out).unwrap();
    }
    w.finish(&mut out).unwrap();
    let (back, ok) = frames(&out, usize::from(first) * 7);
    assert!(ok);
    assert_eq!(back, msgs);
});
