//! Property tests: seal→open round trips for random inputs; opening random bytes never panics
//! and never succeeds.

use mbx_record::{Aead, ContentType, RecordOpener, RecordSealer, TlsVersion, TrafficKeys};
use proptest::prelude::*;

fn keys(version: TlsVersion, aead: Aead, key_byte: u8) -> TrafficKeys {
    let iv_len = match version {
        TlsVersion::Tls13 => 12,
        TlsVersion::Tls12 => aead.tls12_fixed_iv_len(),
    };
    TrafficKeys::new(
        aead,
        &vec![key_byte; aead.key_len()],
        &vec![key_byte ^ 0xff; iv_len],
    )
    .unwrap()
}

fn version() -> impl Strategy<Value = TlsVersion> {
    prop_oneof![Just(TlsVersion::Tls12), Just(TlsVersion::Tls13)]
}

fn aead() -> impl Strategy<Value = Aead> {
    prop_oneof![
        Just(Aead::Aes128Gcm),
        Just(Aead::Aes256Gcm),
        Just(Aead::ChaCha20Poly1305)
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn seal_open_round_trip(
        v in version(),
        a in aead(),
        key_byte in any::<u8>(),
        start_seq in prop_oneof![Just(0u64), any::<u64>().prop_map(|s| s / 2), Just(u64::MAX - 10)],
        recs in proptest::collection::vec(
            (20u8..=24, proptest::collection::vec(any::<u8>(), 1..600), 0usize..300), 1..6),
    ) {
        // Below the key's confidentiality limit (AES-GCM: 2^24.5 records), where sealing stops.
        let start_seq = start_seq.min(a.confidentiality_limit() - 10);
        let mut s = RecordSealer::new(v, keys(v, a, key_byte), start_seq);
        let mut o = RecordOpener::new(v, keys(v, a, key_byte), start_seq);
        for (ct, pt, pad) in &recs {
            // TLS 1.3 never protects change_cipher_spec (RFC 8446 §5)
            let ct = &if v == TlsVersion::Tls13 && *ct == 20 { 23 } else { *ct };
            let mut rec = Vec::new();
            match v {
                TlsVersion::Tls13 => s.seal_padded(ContentType(*ct), pt, *pad, &mut rec).unwrap(),
                TlsVersion::Tls12 => s.seal(ContentType(*ct), pt, &mut rec).unwrap(),
            }
            let opened = o.open(&rec).unwrap();
            prop_assert_eq!(opened.content_type, ContentType(*ct));
            prop_assert_eq!(&opened.plaintext[..], &pt[..]);
        }
        prop_assert_eq!(s.next_seq(), start_seq + recs.len() as u64);
        prop_assert_eq!(o.next_seq(), s.next_seq());
    }

    #[test]
    fn opening_garbage_fails_without_panicking(
        v in version(),
        a in aead(),
        body in proptest::collection::vec(any::<u8>(), 0..200),
        framed in any::<bool>(),
    ) {
        // either raw garbage, or garbage behind a plausible header
        let data = if framed {
            let mut d = vec![23, 3, 3];
            d.extend((body.len() as u16).to_be_bytes());
            d.extend(&body);
            d
        } else {
            body
        };
        let mut o = RecordOpener::new(v, keys(v, a, 1), 0);
        prop_assert!(o.open(&data).is_err());
        prop_assert!(o.is_poisoned());
    }
}
