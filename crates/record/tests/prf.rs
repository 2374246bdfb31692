//! TLS 1.2 PRF known-answer tests and key-block layout.
//!
//! The PRF vectors are the ones posted to the IETF TLS working group list ("TLS 1.2 PRF test
//! vectors", P_SHA256 and P_SHA384, label "test label") and reused by many TLS libraries' test
//! suites (e.g. mbedTLS, BoringSSL-based and Botan test data).

use mbx_record::tls12::{key_block, prf};
use mbx_record::{
    CipherSuite, ContentType, HashAlg, RecordError, RecordOpener, RecordSealer, TlsVersion,
};

fn unhex(s: &str) -> Vec<u8> {
    hex::decode(s.split_whitespace().collect::<String>()).unwrap()
}

#[test]
fn prf_sha256_vector() {
    let out = prf(
        HashAlg::Sha256,
        &unhex("9b be 43 6b a9 40 f0 17 b1 76 52 84 9a 71 db 35"),
        b"test label",
        &unhex("a0 ba 9f 93 6c da 31 18 27 a6 f7 96 ff d5 19 8c"),
        100,
    );
    let want = unhex(
        "e3 f2 29 ba 72 7b e1 7b 8d 12 26 20 55 7c d4 53 c2 aa b2 1d 07 c3 d4 95
         32 9b 52 d4 e6 1e db 5a 6b 30 17 91 e9 0d 35 c9 c9 a4 6b 4e 14 ba f9 af
         0f a0 22 f7 07 7d ef 17 ab fd 37 97 c0 56 4b ab 4f bc 91 66 6e 9d ef 9b
         97 fc e3 4f 79 67 89 ba a4 80 82 d1 22 ee 42 c5 a7 2e 5a 51 10 ff f7 01
         87 34 7b 66",
    );
    assert_eq!(hex::encode(&*out), hex::encode(want));
}

#[test]
fn prf_sha384_vector() {
    let out = prf(
        HashAlg::Sha384,
        &unhex("b8 0b 73 3d 6c ee fc dc 71 56 6e a4 8e 55 67 df"),
        b"test label",
        &unhex("cd 66 5c f6 a8 44 7d d6 ff 8b 27 55 5e db 74 65"),
        148,
    );
    let want = unhex(
        "7b 0c 18 e9 ce d4 10 ed 18 04 f2 cf a3 4a 33 6a 1c 14 df fb 49 00 bb 5f
         d7 94 21 07 e8 1c 83 cd e9 ca 0f aa 60 be 9f e3 4f 82 b1 23 3c 91 46 a0
         e5 34 cb 40 0f ed 27 00 88 4f 9d c2 36 f8 0e dd 8b fa 96 11 44 c9 e8 d7
         92 ec a7 22 a7 b3 2f c3 d4 16 d4 73 eb c2 c5 fd 4a bf da d0 5d 91 84 25
         9b 5b f8 cd 4d 90 fa 0d 31 e2 de c4 79 e4 f1 a2 60 66 f2 ee a9 a6 92 36
         a3 e5 26 55 c9 e9 ae e6 91 c8 f3 a2 68 54 30 8d 5e aa 3b e8 5e 09 90 70
         3d 73 e5 6f",
    );
    assert_eq!(hex::encode(&*out), hex::encode(want));
}

#[test]
fn prf_output_is_a_prefix_stream() {
    let a = prf(HashAlg::Sha256, b"s", b"l", b"seed", 7);
    let b = prf(HashAlg::Sha256, b"s", b"l", b"seed", 70);
    assert_eq!(&a[..], &b[..7]);
    assert!(prf(HashAlg::Sha384, b"s", b"l", b"seed", 0).is_empty());
}

#[test]
fn key_block_layout() {
    let ms = [0x42u8; 48];
    let cr = [1u8; 32];
    let sr = [2u8; 32];
    // key_block = PRF(master, "key expansion", server_random ‖ client_random) (RFC 5246 §6.3)
    let mut seed = sr.to_vec();
    seed.extend_from_slice(&cr);
    for suite in CipherSuite::ALL
        .iter()
        .filter(|s| s.version == TlsVersion::Tls12)
    {
        let k = suite.aead.key_len();
        let iv = suite.aead.tls12_fixed_iv_len();
        let block = prf(suite.hash, &ms, b"key expansion", &seed, 2 * k + 2 * iv);
        let kb = key_block(suite, &ms, &cr, &sr).unwrap();
        assert_eq!(kb.client_write.key(), &block[..k], "{}", suite.name());
        assert_eq!(kb.server_write.key(), &block[k..2 * k]);
        assert_eq!(kb.client_write.iv(), &block[2 * k..2 * k + iv]);
        assert_eq!(kb.server_write.iv(), &block[2 * k + iv..]);
        // and the keys work as a pair of directions
        let mut s = RecordSealer::new(TlsVersion::Tls12, kb.client_write.clone(), 0);
        let mut o = RecordOpener::new(TlsVersion::Tls12, kb.client_write.clone(), 0);
        let mut rec = Vec::new();
        s.seal(ContentType::APPLICATION_DATA, b"ping", &mut rec)
            .unwrap();
        assert_eq!(&o.open(&rec).unwrap().plaintext[..], b"ping");
        let mut wrong = RecordOpener::new(TlsVersion::Tls12, kb.server_write.clone(), 0);
        assert_eq!(wrong.open(&rec).err(), Some(RecordError::BadRecordMac));
    }
}

#[test]
fn key_block_rejects_bad_inputs() {
    assert_eq!(
        key_block(
            &CipherSuite::TLS13_AES_128_GCM_SHA256,
            &[0; 48],
            &[0; 32],
            &[0; 32]
        )
        .err(),
        Some(RecordError::UnsupportedCipherSuite(0x1301))
    );
    assert_eq!(
        key_block(
            &CipherSuite::TLS_RSA_WITH_AES_128_GCM_SHA256,
            &[0; 47],
            &[0; 32],
            &[0; 32]
        )
        .err(),
        Some(RecordError::BadSecretLength)
    );
}
