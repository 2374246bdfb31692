//! Record protection behaviour for every (version, AEAD) pair: round trips, tampering, sequence
//! handling, limits, content types, fail-closed.

use mbx_record::{
    Aead, ContentType, RecordError, RecordOpener, RecordSealer, TlsVersion, TrafficKeys,
};
use mbx_wire::record::{MAX_CIPHERTEXT_LEN_TLS12, MAX_CIPHERTEXT_LEN_TLS13, MAX_PLAINTEXT_LEN};
use mbx_wire::WireError;
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey};

const AEADS: [Aead; 3] = [Aead::Aes128Gcm, Aead::Aes256Gcm, Aead::ChaCha20Poly1305];
const VERSIONS: [TlsVersion; 2] = [TlsVersion::Tls12, TlsVersion::Tls13];

fn keys(version: TlsVersion, aead: Aead, fill: u8) -> TrafficKeys {
    let iv_len = match version {
        TlsVersion::Tls13 => 12,
        TlsVersion::Tls12 => aead.tls12_fixed_iv_len(),
    };
    let key: Vec<u8> = (0..aead.key_len() as u8).map(|i| i ^ fill).collect();
    let iv: Vec<u8> = (0..iv_len as u8)
        .map(|i| i.wrapping_mul(7) ^ fill)
        .collect();
    TrafficKeys::new(aead, &key, &iv).unwrap()
}

fn pair(version: TlsVersion, aead: Aead) -> (RecordSealer, RecordOpener) {
    (
        RecordSealer::new(version, keys(version, aead, 0x5a), 0),
        RecordOpener::new(version, keys(version, aead, 0x5a), 0),
    )
}

fn each(mut f: impl FnMut(TlsVersion, Aead)) {
    for v in VERSIONS {
        for a in AEADS {
            f(v, a);
        }
    }
}

fn seal(s: &mut RecordSealer, ct: ContentType, pt: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    s.seal(ct, pt, &mut out).unwrap();
    out
}

#[test]
fn round_trip_many_records() {
    each(|v, a| {
        let (mut s, mut o) = pair(v, a);
        let msgs: [(ContentType, &[u8]); 5] = [
            (ContentType::HANDSHAKE, b"\x14\x00\x00\x01x"),
            (ContentType::APPLICATION_DATA, b"hello"),
            (ContentType::APPLICATION_DATA, b""),
            (ContentType::APPLICATION_DATA, &[0u8; 100]),
            (ContentType::ALERT, &[1, 0]),
        ];
        for (i, (ct, pt)) in msgs.iter().enumerate() {
            let rec = seal(&mut s, *ct, pt);
            // outer header
            match v {
                TlsVersion::Tls13 => assert_eq!(&rec[..3], &[23, 3, 3]),
                TlsVersion::Tls12 => assert_eq!(&rec[..3], &[ct.0, 3, 3]),
            }
            let opened = o.open(&rec).unwrap();
            assert_eq!(opened.content_type, *ct, "{v:?} {a:?} #{i}");
            assert_eq!(&opened.plaintext[..], *pt);
        }
        assert_eq!(s.next_seq(), 5);
        assert_eq!(o.next_seq(), 5);
    });
}

#[test]
fn record_sizes() {
    each(|v, a| {
        let (mut s, _) = pair(v, a);
        let rec = seal(&mut s, ContentType::APPLICATION_DATA, b"abc");
        let want = match (v, a) {
            (TlsVersion::Tls13, _) => 5 + 3 + 1 + 16,
            (TlsVersion::Tls12, Aead::ChaCha20Poly1305) => 5 + 3 + 16,
            (TlsVersion::Tls12, _) => 5 + 8 + 3 + 16,
        };
        assert_eq!(rec.len(), want, "{v:?} {a:?}");
    });
}

#[test]
fn tls12_gcm_explicit_nonce_is_the_sequence_number() {
    for a in [Aead::Aes128Gcm, Aead::Aes256Gcm] {
        let mut s = RecordSealer::new(
            TlsVersion::Tls12,
            keys(TlsVersion::Tls12, a, 1),
            // Distinct bytes, below the key's confidentiality limit (2^24.5 records).
            0x0102_0304,
        );
        let rec = seal(&mut s, ContentType::APPLICATION_DATA, b"x");
        assert_eq!(&rec[5..13], &[0, 0, 0, 0, 1, 2, 3, 4]);
    }
}

#[test]
fn tls12_gcm_explicit_nonces_can_continue_a_peer_counter() {
    for a in [Aead::Aes128Gcm, Aead::Aes256Gcm] {
        let mut s = RecordSealer::new(TlsVersion::Tls12, keys(TlsVersion::Tls12, a, 1), 5);
        s.continue_explicit_nonces([0xff; 8]).unwrap();
        let r1 = seal(&mut s, ContentType::APPLICATION_DATA, b"one");
        let r2 = seal(&mut s, ContentType::APPLICATION_DATA, b"two");
        assert_eq!(&r1[5..13], &[0xff; 8]);
        assert_eq!(&r2[5..13], &[0; 8], "the counter wraps like a u64");
        // The receiver needs no change: it reads the explicit nonce from the record.
        let mut o = RecordOpener::new(TlsVersion::Tls12, keys(TlsVersion::Tls12, a, 1), 5);
        assert_eq!(&o.open(&r1).unwrap().plaintext[..], b"one");
        assert_eq!(&o.open(&r2).unwrap().plaintext[..], b"two");
        // Fixed before the first record, so nonces stay unique.
        assert_eq!(
            s.continue_explicit_nonces([1; 8]),
            Err(RecordError::UnexpectedExplicitNonce)
        );
    }
    for (v, a) in [
        (TlsVersion::Tls12, Aead::ChaCha20Poly1305),
        (TlsVersion::Tls13, Aead::Aes128Gcm),
    ] {
        let mut s = RecordSealer::new(v, keys(v, a, 1), 0);
        assert_eq!(
            s.continue_explicit_nonces([1; 8]),
            Err(RecordError::UnexpectedExplicitNonce)
        );
    }
}

/// Independent construction of TLS 1.2 records straight from RFC 5246 §6.2.3.3 / RFC 5288 /
/// RFC 7905 with `ring`, compared byte-for-byte with the sealer's output.
#[test]
fn tls12_matches_spec_construction() {
    for a in AEADS {
        let k = keys(TlsVersion::Tls12, a, 9);
        // Distinct bytes, below AES-GCM's confidentiality limit (2^24.5 records).
        let seq: u64 = 0x0112_2334;
        let pt = b"GET / HTTP/1.1\r\n\r\n";
        let ct = ContentType::APPLICATION_DATA;
        let mut s = RecordSealer::new(TlsVersion::Tls12, k.clone(), seq);
        let got = seal(&mut s, ct, pt);

        let mut aad = seq.to_be_bytes().to_vec();
        aad.extend([23, 3, 3]);
        aad.extend((pt.len() as u16).to_be_bytes());
        let mut nonce = [0u8; 12];
        let explicit: Vec<u8> = match a {
            Aead::ChaCha20Poly1305 => {
                nonce.copy_from_slice(k.iv());
                for (n, s) in nonce[4..].iter_mut().zip(seq.to_be_bytes()) {
                    *n ^= s;
                }
                vec![]
            }
            _ => {
                nonce[..4].copy_from_slice(k.iv());
                nonce[4..].copy_from_slice(&seq.to_be_bytes());
                seq.to_be_bytes().to_vec()
            }
        };
        let alg = match a {
            Aead::Aes128Gcm => &ring::aead::AES_128_GCM,
            Aead::Aes256Gcm => &ring::aead::AES_256_GCM,
            Aead::ChaCha20Poly1305 => &ring::aead::CHACHA20_POLY1305,
        };
        let key = LessSafeKey::new(UnboundKey::new(alg, k.key()).unwrap());
        let mut body = pt.to_vec();
        key.seal_in_place_append_tag(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(aad),
            &mut body,
        )
        .unwrap();
        let mut want = vec![23, 3, 3];
        want.extend(((explicit.len() + body.len()) as u16).to_be_bytes());
        want.extend(explicit);
        want.extend(body);
        assert_eq!(got, want, "{a:?}");
    }
}

#[test]
fn flipping_any_bit_fails_closed() {
    each(|v, a| {
        let (mut s, _) = pair(v, a);
        let rec = seal(&mut s, ContentType::APPLICATION_DATA, b"attack at dawn");
        for byte in 0..rec.len() {
            for bit in 0..8 {
                let mut bad = rec.clone();
                bad[byte] ^= 1 << bit;
                let mut o = RecordOpener::new(v, keys(v, a, 0x5a), 0);
                let err = o
                    .open(&bad)
                    .err()
                    .unwrap_or_else(|| panic!("{v:?} {a:?} byte {byte} bit {bit} accepted"));
                if byte >= 5 {
                    // every payload bit (explicit nonce, ciphertext, tag) is authenticated
                    assert_eq!(err, RecordError::BadRecordMac, "{v:?} {a:?} byte {byte}");
                }
                assert!(o.is_poisoned());
                assert_eq!(o.open(&rec).err(), Some(RecordError::Poisoned));
            }
        }
    });
}

#[test]
fn header_tampering_is_detected() {
    each(|v, a| {
        let (mut s, _) = pair(v, a);
        let rec = seal(&mut s, ContentType::APPLICATION_DATA, b"data");
        // minor version change: authenticated (AAD) in both versions
        let mut bad = rec.clone();
        bad[2] = 1;
        let mut o = RecordOpener::new(v, keys(v, a, 0x5a), 0);
        assert_eq!(
            o.open(&bad).err(),
            Some(RecordError::BadRecordMac),
            "{v:?} {a:?}"
        );
        // major version change: not TLS
        let mut bad = rec.clone();
        bad[1] = 4;
        let mut o = RecordOpener::new(v, keys(v, a, 0x5a), 0);
        assert_eq!(
            o.open(&bad).err(),
            Some(RecordError::Wire(WireError::BadVersion(0x0403)))
        );
        // content type change
        let mut bad = rec.clone();
        bad[0] = 22;
        let mut o = RecordOpener::new(v, keys(v, a, 0x5a), 0);
        let want = match v {
            TlsVersion::Tls13 => RecordError::UnexpectedContentType, // outer must be 23
            TlsVersion::Tls12 => RecordError::BadRecordMac,          // type is in the AAD
        };
        assert_eq!(o.open(&bad).err(), Some(want));
    });
}

#[test]
fn wrong_sequence_number() {
    each(|v, a| {
        let (mut s, _) = pair(v, a);
        let r0 = seal(&mut s, ContentType::APPLICATION_DATA, b"zero");
        let r1 = seal(&mut s, ContentType::APPLICATION_DATA, b"one");
        // replay / reorder: opener at 0 gets record 1
        let mut o = RecordOpener::new(v, keys(v, a, 0x5a), 0);
        assert_eq!(
            o.open(&r1).err(),
            Some(RecordError::BadRecordMac),
            "{v:?} {a:?}"
        );
        // opener at 1 gets record 0
        let mut o = RecordOpener::new(v, keys(v, a, 0x5a), 1);
        assert_eq!(o.open(&r0).err(), Some(RecordError::BadRecordMac));
        // replaying the same record twice
        let mut o = RecordOpener::new(v, keys(v, a, 0x5a), 0);
        o.open(&r0).unwrap();
        assert_eq!(o.open(&r0).err(), Some(RecordError::BadRecordMac));
    });
}

#[test]
fn truncation() {
    each(|v, a| {
        let (mut s, _) = pair(v, a);
        let rec = seal(&mut s, ContentType::APPLICATION_DATA, b"truncate me");
        // bytes missing relative to the header
        let mut o = RecordOpener::new(v, keys(v, a, 0x5a), 0);
        assert_eq!(
            o.open(&rec[..rec.len() - 1]).err(),
            Some(RecordError::Wire(WireError::Truncated { needed: 1 }))
        );
        // consistent header, shortened ciphertext (tag cut)
        let mut short = rec[..rec.len() - 1].to_vec();
        let len = (short.len() - 5) as u16;
        short[3..5].copy_from_slice(&len.to_be_bytes());
        let mut o = RecordOpener::new(v, keys(v, a, 0x5a), 0);
        assert_eq!(
            o.open(&short).err(),
            Some(RecordError::BadRecordMac),
            "{v:?} {a:?}"
        );
        // shorter than the AEAD overhead
        let tiny = [23, 3, 3, 0, 3, 1, 2, 3];
        let mut o = RecordOpener::new(v, keys(v, a, 0x5a), 0);
        assert_eq!(o.open(&tiny).err(), Some(RecordError::BadRecordMac));
        // less than a header
        let mut o = RecordOpener::new(v, keys(v, a, 0x5a), 0);
        assert!(matches!(
            o.open(&rec[..3]).err(),
            Some(RecordError::Wire(WireError::Truncated { .. }))
        ));
        // trailing bytes: not exactly one record
        let mut long = rec.clone();
        long.push(0);
        let mut o = RecordOpener::new(v, keys(v, a, 0x5a), 0);
        assert_eq!(
            o.open(&long).err(),
            Some(RecordError::Wire(WireError::TrailingBytes(1)))
        );
    });
}

#[test]
fn oversize() {
    each(|v, a| {
        let (mut s, mut o) = pair(v, a);
        let mut out = Vec::new();
        assert_eq!(
            s.seal(
                ContentType::APPLICATION_DATA,
                &vec![0; MAX_PLAINTEXT_LEN + 1],
                &mut out
            ),
            Err(RecordError::RecordOverflow)
        );
        assert!(out.is_empty());
        assert_eq!(
            s.next_seq(),
            0,
            "a refused seal must not consume a sequence number"
        );
        // exactly the limit works
        let rec = seal(
            &mut s,
            ContentType::APPLICATION_DATA,
            &vec![7; MAX_PLAINTEXT_LEN],
        );
        assert_eq!(o.open(&rec).unwrap().plaintext.len(), MAX_PLAINTEXT_LEN);
        // a ciphertext over the version's limit is refused before decryption
        let max = match v {
            TlsVersion::Tls13 => MAX_CIPHERTEXT_LEN_TLS13,
            TlsVersion::Tls12 => MAX_CIPHERTEXT_LEN_TLS12,
        };
        let mut big = vec![23, 3, 3];
        big.extend(((max + 1) as u16).to_be_bytes());
        big.resize(5 + max + 1, 0xaa);
        let mut o = RecordOpener::new(v, keys(v, a, 0x5a), 0);
        assert_eq!(
            o.open(&big).err(),
            Some(RecordError::RecordOverflow),
            "{v:?} {a:?}"
        );
        // TLS 1.2: a ciphertext within the limit whose plaintext would exceed 2^14
        if v == TlsVersion::Tls12 {
            let overhead = a.tls12_explicit_nonce_len() + 16;
            let len = MAX_PLAINTEXT_LEN + 1 + overhead;
            let mut r = vec![23, 3, 3];
            r.extend((len as u16).to_be_bytes());
            r.resize(5 + len, 0);
            let mut o = RecordOpener::new(v, keys(v, a, 0x5a), 0);
            assert_eq!(o.open(&r).err(), Some(RecordError::RecordOverflow));
        }
    });
}

#[test]
fn tls13_padding() {
    for a in AEADS {
        let (mut s, mut o) = pair(TlsVersion::Tls13, a);
        let mut rec = Vec::new();
        s.seal_padded(ContentType::APPLICATION_DATA, b"hi", 100, &mut rec)
            .unwrap();
        assert_eq!(rec.len(), 5 + 2 + 1 + 100 + 16);
        let opened = o.open(&rec).unwrap();
        assert_eq!(&opened.plaintext[..], b"hi");
        // the whole inner plaintext may be 2^14 + 1 bytes, not more
        let mut rec = Vec::new();
        s.seal_padded(
            ContentType::APPLICATION_DATA,
            b"",
            MAX_PLAINTEXT_LEN,
            &mut rec,
        )
        .unwrap();
        assert_eq!(o.open(&rec).unwrap().plaintext.len(), 0);
        let mut out = Vec::new();
        assert_eq!(
            s.seal_padded(
                ContentType::APPLICATION_DATA,
                b"x",
                MAX_PLAINTEXT_LEN,
                &mut out
            ),
            Err(RecordError::RecordOverflow)
        );
        assert_eq!(
            s.seal_padded(ContentType::APPLICATION_DATA, b"x", usize::MAX, &mut out),
            Err(RecordError::RecordOverflow)
        );
    }
    for a in AEADS {
        let (mut s, _) = pair(TlsVersion::Tls12, a);
        let mut out = Vec::new();
        assert_eq!(
            s.seal_padded(ContentType::APPLICATION_DATA, b"hi", 1, &mut out),
            Err(RecordError::PaddingNotAllowed)
        );
        s.seal_padded(ContentType::APPLICATION_DATA, b"hi", 0, &mut out)
            .unwrap();
    }
}

#[test]
fn content_type_policy() {
    each(|v, a| {
        let mbtls = ContentType(30);
        let (mut s, mut o) = pair(v, a);
        let mut out = Vec::new();
        assert_eq!(
            s.seal(mbtls, b"x", &mut out),
            Err(RecordError::UnexpectedContentType)
        );
        assert_eq!(
            s.seal(ContentType(0), b"x", &mut out),
            Err(RecordError::UnexpectedContentType)
        );
        s.allow_content_type(mbtls);
        s.allow_content_type(ContentType(0));
        assert_eq!(
            s.seal(ContentType(0), b"x", &mut out),
            Err(RecordError::UnexpectedContentType)
        );
        let rec = seal(&mut s, mbtls, b"encapsulated");
        // an opener that was not told about type 30 refuses it
        assert_eq!(
            o.open(&rec).err(),
            Some(RecordError::UnexpectedContentType),
            "{v:?} {a:?}"
        );
        let mut o = RecordOpener::new(v, keys(v, a, 0x5a), 0);
        o.allow_content_type(mbtls);
        let opened = o.open(&rec).unwrap();
        assert_eq!(opened.content_type, mbtls);
        assert_eq!(&opened.plaintext[..], b"encapsulated");
    });
}

#[test]
fn empty_fragments() {
    each(|v, a| {
        let (mut s, mut o) = pair(v, a);
        let mut out = Vec::new();
        let mut types = vec![ContentType::HANDSHAKE, ContentType::ALERT];
        if v == TlsVersion::Tls12 {
            types.push(ContentType::CHANGE_CIPHER_SPEC);
        }
        for ct in types {
            assert_eq!(s.seal(ct, b"", &mut out), Err(RecordError::EmptyFragment));
        }
        let rec = seal(&mut s, ContentType::APPLICATION_DATA, b"");
        assert!(o.open(&rec).unwrap().plaintext.is_empty());
    });
}

#[test]
fn change_cipher_spec_is_never_protected_in_tls13() {
    for a in AEADS {
        let (mut s, _) = pair(TlsVersion::Tls13, a);
        let mut out = Vec::new();
        assert_eq!(
            s.seal(ContentType::CHANGE_CIPHER_SPEC, &[1], &mut out),
            Err(RecordError::UnexpectedContentType)
        );
        // TLS 1.2 protects it like any other record
        let (mut s, mut o) = pair(TlsVersion::Tls12, a);
        let rec = seal(&mut s, ContentType::CHANGE_CIPHER_SPEC, &[1]);
        assert_eq!(
            o.open(&rec).unwrap().content_type,
            ContentType::CHANGE_CIPHER_SPEC
        );
    }
}

/// Seal a TLS 1.3 record whose inner plaintext is given verbatim (bypassing the sealer's
/// checks), as a misbehaving peer would.
fn raw_tls13(aead: Aead, k: &TrafficKeys, seq: u64, inner: &[u8]) -> Vec<u8> {
    let alg = match aead {
        Aead::Aes128Gcm => &ring::aead::AES_128_GCM,
        Aead::Aes256Gcm => &ring::aead::AES_256_GCM,
        Aead::ChaCha20Poly1305 => &ring::aead::CHACHA20_POLY1305,
    };
    let key = LessSafeKey::new(UnboundKey::new(alg, k.key()).unwrap());
    let mut nonce = [0u8; 12];
    nonce.copy_from_slice(k.iv());
    for (n, s) in nonce[4..].iter_mut().zip(seq.to_be_bytes()) {
        *n ^= s;
    }
    let len = (inner.len() + 16) as u16;
    let mut rec = vec![23, 3, 3];
    rec.extend(len.to_be_bytes());
    let mut body = inner.to_vec();
    key.seal_in_place_append_tag(
        Nonce::assume_unique_for_key(nonce),
        Aad::from(rec.clone()),
        &mut body,
    )
    .unwrap();
    rec.extend(body);
    rec
}

#[test]
fn tls13_inner_plaintext_checks() {
    for a in AEADS {
        let k = keys(TlsVersion::Tls13, a, 0x5a);
        // the raw helper agrees with the sealer
        let good = raw_tls13(a, &k, 0, b"ok\x17\x00\x00");
        let mut o = RecordOpener::new(TlsVersion::Tls13, k.clone(), 0);
        assert_eq!(&o.open(&good).unwrap().plaintext[..], b"ok");
        for (inner, want) in [
            (&b"\x00\x00\x00"[..], RecordError::MissingInnerContentType),
            (&b""[..], RecordError::MissingInnerContentType),
            (&b"x\x63"[..], RecordError::UnexpectedContentType), // inner type 99
            (&b"\x16\x00"[..], RecordError::EmptyFragment),      // empty handshake, padded
            (&b"\x01\x14"[..], RecordError::UnexpectedContentType), // protected CCS
        ] {
            let rec = raw_tls13(a, &k, 0, inner);
            let mut o = RecordOpener::new(TlsVersion::Tls13, k.clone(), 0);
            assert_eq!(o.open(&rec).err(), Some(want), "{a:?} {inner:?}");
            assert_eq!(o.open(&good).err(), Some(RecordError::Poisoned));
        }
        // inner plaintext longer than 2^14 + 1
        let mut inner = vec![1u8; MAX_PLAINTEXT_LEN + 1];
        inner.push(23);
        let rec = raw_tls13(a, &k, 0, &inner);
        let mut o = RecordOpener::new(TlsVersion::Tls13, k.clone(), 0);
        assert_eq!(o.open(&rec).err(), Some(RecordError::RecordOverflow));
    }
}

/// Sequence numbers never wrap. (AES-GCM keys stop long before, at their confidentiality
/// limit: the next test.)
#[test]
fn sequence_exhaustion() {
    each(|v, a| {
        if a != Aead::ChaCha20Poly1305 {
            return;
        }
        let mut s = RecordSealer::new(v, keys(v, a, 1), u64::MAX - 1);
        let mut o = RecordOpener::new(v, keys(v, a, 1), u64::MAX - 1);
        let last = seal(&mut s, ContentType::APPLICATION_DATA, b"last");
        assert_eq!(s.next_seq(), u64::MAX);
        let mut out = Vec::new();
        assert_eq!(
            s.seal(ContentType::APPLICATION_DATA, b"one more", &mut out),
            Err(RecordError::SequenceExhausted)
        );
        assert!(out.is_empty());
        assert_eq!(s.next_seq(), u64::MAX);
        o.open(&last).unwrap();
        assert_eq!(o.next_seq(), u64::MAX);
        assert_eq!(o.open(&last).err(), Some(RecordError::SequenceExhausted));
    });
}

/// RFC 8446 §5.5: an AES-GCM key seals at most 2^24.5 records, then the sealer refuses (an
/// mbTLS hop cannot update its keys, so its session ends); what it sealed still opens.
/// ChaCha20-Poly1305 has no limit below the sequence number's.
#[test]
fn aes_gcm_keys_stop_at_their_confidentiality_limit() {
    each(|v, a| {
        let limit = a.confidentiality_limit();
        if a == Aead::ChaCha20Poly1305 {
            assert_eq!(limit, u64::MAX);
            let mut s = RecordSealer::new(v, keys(v, a, 1), 23_726_566);
            seal(&mut s, ContentType::APPLICATION_DATA, b"no limit here");
            return;
        }
        assert_eq!(limit, 23_726_566, "floor(2^24.5)");
        let mut s = RecordSealer::new(v, keys(v, a, 1), limit - 1);
        let mut o = RecordOpener::new(v, keys(v, a, 1), limit - 1);
        let last = seal(&mut s, ContentType::APPLICATION_DATA, b"last");
        let mut out = Vec::new();
        assert_eq!(
            s.seal(ContentType::APPLICATION_DATA, b"one more", &mut out),
            Err(RecordError::KeyUsageLimit),
            "{v:?} {a:?}"
        );
        assert!(out.is_empty());
        assert_eq!(&o.open(&last).unwrap().plaintext[..], b"last");
        // The alert that ends the session still goes out, and opens.
        let alert = seal(&mut s, ContentType::ALERT, &[2, 80]);
        assert_eq!(o.open(&alert).unwrap().content_type, ContentType::ALERT);
    });
}

#[test]
fn keys_that_do_not_fit_the_version() {
    // TLS 1.3 needs a 12-byte IV; a 4-byte GCM salt is TLS 1.2 only, and vice versa.
    let k4 = TrafficKeys::new(Aead::Aes128Gcm, &[0; 16], &[0; 4]).unwrap();
    let k12 = TrafficKeys::new(Aead::Aes128Gcm, &[0; 16], &[0; 12]).unwrap();
    let mut out = Vec::new();
    let mut s = RecordSealer::new(TlsVersion::Tls13, k4.clone(), 0);
    assert_eq!(
        s.seal(ContentType::APPLICATION_DATA, b"x", &mut out),
        Err(RecordError::BadIvLength)
    );
    let mut s = RecordSealer::new(TlsVersion::Tls12, k12.clone(), 0);
    assert_eq!(
        s.seal(ContentType::APPLICATION_DATA, b"x", &mut out),
        Err(RecordError::BadIvLength)
    );
    let mut o = RecordOpener::new(TlsVersion::Tls13, k4, 0);
    assert_eq!(
        o.open(&[23, 3, 3, 0, 0]).err(),
        Some(RecordError::BadIvLength)
    );
    assert!(out.is_empty());
}

#[test]
fn different_keys_do_not_open() {
    each(|v, a| {
        let mut s = RecordSealer::new(v, keys(v, a, 1), 0);
        let mut o = RecordOpener::new(v, keys(v, a, 2), 0);
        let rec = seal(&mut s, ContentType::APPLICATION_DATA, b"secret");
        assert_eq!(o.open(&rec).err(), Some(RecordError::BadRecordMac));
        assert_ne!(s.key_fingerprint(), o.key_fingerprint());
    });
}

#[test]
fn key_update_changes_keys() {
    use mbx_record::tls13::{next_traffic_secret, traffic_keys};
    use mbx_record::{CipherSuite, HashAlg};
    let suite = CipherSuite::TLS13_AES_256_GCM_SHA384;
    let s0 = vec![3u8; 48];
    let s1 = next_traffic_secret(HashAlg::Sha384, &s0).unwrap();
    assert_eq!(s1.len(), 48);
    assert_ne!(&s1[..], &s0[..]);
    // RFC 8446 §7.2: application_traffic_secret_N+1 = HKDF-Expand-Label(secret_N, "traffic upd", "", Hash.length)
    let manual =
        mbx_record::tls13::hkdf_expand_label(HashAlg::Sha384, &s0, b"traffic upd", b"", 48)
            .unwrap();
    assert_eq!(&s1[..], &manual[..]);
    let k0 = traffic_keys(&suite, &s0).unwrap();
    let k1 = traffic_keys(&suite, &s1).unwrap();
    let mut s = RecordSealer::new(TlsVersion::Tls13, k1, 0);
    let mut o = RecordOpener::new(TlsVersion::Tls13, k0, 0);
    let rec = seal(&mut s, ContentType::APPLICATION_DATA, b"after update");
    assert_eq!(o.open(&rec).err(), Some(RecordError::BadRecordMac));
    assert_eq!(
        next_traffic_secret(HashAlg::Sha256, &s0).err(),
        Some(RecordError::BadSecretLength)
    );
}

/// A TLS 1.2 record built straight from the spec with `ring` (RFC 5246 §6.2.3.3, RFC 5288,
/// RFC 7905), bypassing the sealer's checks, as a misbehaving peer would.
fn raw_tls12(aead: Aead, k: &TrafficKeys, seq: u64, ct: u8, pt: &[u8]) -> Vec<u8> {
    let alg = match aead {
        Aead::Aes128Gcm => &ring::aead::AES_128_GCM,
        Aead::Aes256Gcm => &ring::aead::AES_256_GCM,
        Aead::ChaCha20Poly1305 => &ring::aead::CHACHA20_POLY1305,
    };
    let key = LessSafeKey::new(UnboundKey::new(alg, k.key()).unwrap());
    let mut nonce = [0u8; 12];
    let explicit = if aead == Aead::ChaCha20Poly1305 {
        nonce.copy_from_slice(k.iv());
        for (n, s) in nonce[4..].iter_mut().zip(seq.to_be_bytes()) {
            *n ^= s;
        }
        vec![]
    } else {
        nonce[..4].copy_from_slice(k.iv());
        nonce[4..].copy_from_slice(&seq.to_be_bytes());
        seq.to_be_bytes().to_vec()
    };
    let mut aad = seq.to_be_bytes().to_vec();
    aad.extend([ct, 3, 3]);
    aad.extend((pt.len() as u16).to_be_bytes());
    let mut body = pt.to_vec();
    key.seal_in_place_append_tag(
        Nonce::assume_unique_for_key(nonce),
        Aad::from(aad),
        &mut body,
    )
    .unwrap();
    let mut rec = vec![ct, 3, 3];
    rec.extend(((explicit.len() + body.len()) as u16).to_be_bytes());
    rec.extend(explicit);
    rec.extend(body);
    rec
}

#[test]
fn tls12_opener_rejects_what_the_sealer_would_not_send() {
    for a in AEADS {
        let k = keys(TlsVersion::Tls12, a, 0x5a);
        let good = raw_tls12(a, &k, 0, 23, b"fine");
        let mut o = RecordOpener::new(TlsVersion::Tls12, k.clone(), 0);
        assert_eq!(&o.open(&good).unwrap().plaintext[..], b"fine");
        for (ct, want) in [
            (22u8, RecordError::EmptyFragment),
            (21, RecordError::EmptyFragment),
            (99, RecordError::UnexpectedContentType),
        ] {
            let rec = raw_tls12(a, &k, 0, ct, b"");
            let mut o = RecordOpener::new(TlsVersion::Tls12, k.clone(), 0);
            assert_eq!(o.open(&rec).err(), Some(want), "{a:?} type {ct}");
        }
    }
}

/// `open_in_place` agrees with `open` on every (version, AEAD), padding included, and points at
/// the plaintext inside the record it was given.
#[test]
fn open_in_place_matches_open() {
    each(|v, a| {
        let (mut s, mut o) = pair(v, a);
        let mut o2 = RecordOpener::new(v, keys(v, a, 0x5a), 0);
        let msgs: [(ContentType, &[u8], usize); 5] = [
            (ContentType::APPLICATION_DATA, b"hello", 0),
            (ContentType::APPLICATION_DATA, b"", 0),
            (ContentType::APPLICATION_DATA, &[7u8; MAX_PLAINTEXT_LEN], 0),
            (ContentType::ALERT, &[1, 0], 0),
            (ContentType::HANDSHAKE, b"\x14\x00\x00\x01x", 9),
        ];
        for (ct, pt, pad) in msgs {
            let pad = if v == TlsVersion::Tls13 { pad } else { 0 };
            let mut rec = Vec::new();
            s.seal_padded(ct, pt, pad, &mut rec).unwrap();
            let copied = o.open(&rec).unwrap();
            let mut buf = rec.clone();
            let inplace = o2.open_in_place(&mut buf).unwrap();
            assert_eq!(inplace.content_type, copied.content_type);
            assert_eq!(
                &buf[inplace.range.clone()],
                &copied.plaintext[..],
                "{v:?} {a:?}"
            );
            assert_eq!(&buf[inplace.range.clone()], pt);
        }
        assert_eq!(o.next_seq(), o2.next_seq());
    });
}

/// A record that fails after authentication (bad inner type, missing type, empty fragment)
/// or fails authentication leaves no plaintext in the caller's buffer, and poisons the opener.
#[test]
fn open_in_place_failures_leave_no_plaintext() {
    for a in AEADS {
        let k = keys(TlsVersion::Tls13, a, 0x5a);
        for inner in [
            &b"secret secret secret\x63"[..],         // inner type 99
            &b"secret secret secret\x16\x00"[..],     // fine (handshake), then tampered below
            &b"\x00\x00\x00\x00\x00\x00\x00\x00"[..], // no content type
        ] {
            let mut rec = raw_tls13(a, &k, 0, inner);
            if inner.ends_with(b"\x16\x00") {
                let n = rec.len();
                rec[n - 1] ^= 1; // the tag
            }
            let mut o = RecordOpener::new(TlsVersion::Tls13, k.clone(), 0);
            let mut buf = rec.clone();
            assert!(o.open_in_place(&mut buf).is_err());
            assert!(
                !buf.windows(6).any(|w| w == b"secret"),
                "{a:?}: plaintext left behind"
            );
            let sealed_len = buf.len() - 5 - 16;
            assert!(buf[5..5 + sealed_len].iter().all(|&b| b == 0), "{a:?}");
            let mut again = rec.clone();
            assert_eq!(
                o.open_in_place(&mut again).err(),
                Some(RecordError::Poisoned)
            );
        }
    }
}

/// `seal_in_place` over room + plaintext produces exactly what `seal` appends, after whatever
/// the buffer held before; a refused record leaves no plaintext and the buffer as it was.
#[test]
fn seal_in_place_matches_seal() {
    each(|v, a| {
        let (mut s1, _) = pair(v, a);
        let (mut s2, mut o) = pair(v, a);
        for pt in [&b"abc"[..], &[9u8; MAX_PLAINTEXT_LEN][..], b"\x01\x00"] {
            let mut want = b"earlier".to_vec();
            s1.seal(ContentType::APPLICATION_DATA, pt, &mut want)
                .unwrap();
            let mut got = b"earlier".to_vec();
            let start = got.len();
            got.resize(start + s2.seal_prefix_len(), 0xEE);
            got.extend_from_slice(pt);
            s2.seal_in_place(ContentType::APPLICATION_DATA, &mut got, start)
                .unwrap();
            assert_eq!(got, want, "{v:?} {a:?}");
            // Prefix and suffix account for every byte the record adds.
            assert_eq!(
                got.len() - start,
                s2.seal_prefix_len() + pt.len() + s2.seal_suffix_len(),
                "{v:?} {a:?}"
            );
            assert_eq!(&o.open(&got[start..]).unwrap().plaintext[..], pt);
        }
        // Too long: refused, nothing left behind, sequence number unchanged.
        let seq = s2.next_seq();
        let mut buf = b"earlier".to_vec();
        buf.resize(7 + s2.seal_prefix_len(), 0);
        buf.extend(std::iter::repeat_n(b's', MAX_PLAINTEXT_LEN + 1));
        assert_eq!(
            s2.seal_in_place(ContentType::APPLICATION_DATA, &mut buf, 7),
            Err(RecordError::RecordOverflow)
        );
        assert_eq!(buf, b"earlier");
        assert_eq!(s2.next_seq(), seq);
        // No room for the header.
        let mut short = vec![1u8, 2];
        assert_eq!(
            s2.seal_in_place(ContentType::APPLICATION_DATA, &mut short, 1),
            Err(RecordError::EncryptFailed)
        );
        assert_eq!(short, [1]);
    });
}

/// A record opened in place and sealed again where it lies (a middlebox passing a record on
/// under the next hop's keys) is exactly what `seal` appends for the same plaintext, and
/// shorter when the record it replaced was padded; a record without room for the trailer is
/// refused with its plaintext wiped.
#[test]
fn seal_record_in_place_reseals_an_opened_record_where_it_lies() {
    each(|v, a| {
        let (mut in_sealer, mut opener) = pair(v, a);
        let mut out_sealer = RecordSealer::new(v, keys(v, a, 0x77), 0);
        let mut reference = RecordSealer::new(v, keys(v, a, 0x77), 0);
        let padding: &[usize] = if v == TlsVersion::Tls13 {
            &[0, 5]
        } else {
            &[0]
        };
        for (i, pt) in [&b"abc"[..], &[9u8; MAX_PLAINTEXT_LEN][..]]
            .iter()
            .enumerate()
        {
            // A full record has no room for padding.
            for &pad in padding
                .iter()
                .filter(|p| pt.len() + **p <= MAX_PLAINTEXT_LEN)
            {
                let mut record = Vec::new();
                in_sealer
                    .seal_padded(ContentType::APPLICATION_DATA, pt, pad, &mut record)
                    .unwrap();
                let opened = opener.open_in_place(&mut record).unwrap();
                assert_eq!(opened.range.start, out_sealer.seal_prefix_len());
                let len = out_sealer
                    .seal_record_in_place(
                        ContentType::APPLICATION_DATA,
                        &mut record,
                        opened.range.len(),
                    )
                    .unwrap();
                let want = seal(&mut reference, ContentType::APPLICATION_DATA, pt);
                assert_eq!(&record[..len], &want[..], "{v:?} {a:?} {i} pad {pad}");
                assert_eq!(record.len() - len, pad, "{v:?} {a:?}");
            }
        }
        // No room for the trailer: refused, the plaintext wiped, the sequence number kept.
        let seq = out_sealer.next_seq();
        let prefix = out_sealer.seal_prefix_len();
        let mut short = vec![0u8; prefix];
        short.extend_from_slice(b"secret");
        assert_eq!(
            out_sealer.seal_record_in_place(ContentType::APPLICATION_DATA, &mut short, 6),
            Err(RecordError::EncryptFailed)
        );
        assert!(short[prefix..].iter().all(|b| *b == 0));
        assert_eq!(out_sealer.next_seq(), seq);
    });
}
