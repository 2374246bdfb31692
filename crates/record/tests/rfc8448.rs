//! TLS 1.3 key derivation and record protection against RFC 8448 §3 ("Simple 1-RTT Handshake",
//! TLS_AES_128_GCM_SHA256). All hex below is copied from that section of the RFC: the traffic
//! secrets, the derived keys/IVs, and the protected records as sent on the wire.

use mbx_record::tls13::{hkdf_expand_label, traffic_keys};
use mbx_record::{CipherSuite, ContentType, HashAlg, RecordOpener, RecordSealer, TlsVersion};

fn unhex(s: &str) -> Vec<u8> {
    hex::decode(s.split_whitespace().collect::<String>()).unwrap()
}

const SUITE: CipherSuite = CipherSuite::TLS13_AES_128_GCM_SHA256;

// {server} derive secret "tls13 s hs traffic" / {client} "tls13 c hs traffic" / "s ap traffic" /
// "c ap traffic": the four traffic secrets.
const S_HS_SECRET: &str = "b6 7b 7d 69 0c c1 6c 4e 75 e5 42 13 cb 2d 37 b4
                           e9 c9 12 bc de d9 10 5d 42 be fd 59 d3 91 ad 38";
const C_HS_SECRET: &str = "b3 ed db 12 6e 06 7f 35 a7 80 b3 ab f4 5e 2d 8f
                           3b 1a 95 07 38 f5 2e 96 00 74 6a 0e 27 a5 5a 21";
const S_AP_SECRET: &str = "a1 1a f9 f0 55 31 f8 56 ad 47 11 6b 45 a9 50 32
                           82 04 b4 f4 4b fb 6b 3a 4b 4f 1f 3f cb 63 16 43";
const C_AP_SECRET: &str = "9e 40 64 6c e7 9a 7f 9d c0 5a f8 88 9b ce 65 52
                           87 5a fa 0b 06 df 00 87 f7 92 eb b7 c1 75 04 a5";

// "derive write traffic keys" (key expanded / iv expanded) for each secret.
const S_HS_KEY: &str = "3f ce 51 60 09 c2 17 27 d0 f2 e4 e8 6e e4 03 bc";
const S_HS_IV: &str = "5d 31 3e b2 67 12 76 ee 13 00 0b 30";
const C_HS_KEY: &str = "db fa a6 93 d1 76 2c 5b 66 6a f5 d9 50 25 8d 01";
const C_HS_IV: &str = "5b d3 c7 1b 83 6e 0b 76 bb 73 26 5f";
const S_AP_KEY: &str = "9f 02 28 3b 6c 9c 07 ef c2 6b b9 f2 ac 92 e3 56";
const S_AP_IV: &str = "cf 78 2b 88 dd 83 54 9a ad f1 e9 84";
const C_AP_KEY: &str = "17 42 2d da 59 6e d5 d9 ac d8 90 e3 c6 3f 50 51";
const C_AP_IV: &str = "5b 78 92 3d ee 08 57 90 33 e5 23 d9";

// {server} calculate finished "tls13 finished": finished key from the server hs secret.
const S_FINISHED_KEY: &str = "00 8d 3b 66 f8 16 ea 55 9f 96 b5 37 e8 85 c3 1f
                              c0 68 bf 49 2c 65 2f 01 f2 88 a1 d8 cd c1 9f c8";

// {server} send handshake record: complete record (679 octets): EncryptedExtensions,
// Certificate, CertificateVerify, Finished under the server handshake keys, seq 0.
const S_HS_RECORD: &str = "
    17 03 03 02 a2 d1 ff 33 4a 56 f5 bf f6 59 4a 07 cc 87 b5 80 23 3f 50 0f
    45 e4 89 e7 f3 3a f3 5e df 78 69 fc f4 0a a4 0a a2 b8 ea 73 f8 48 a7 ca
    07 61 2e f9 f9 45 cb 96 0b 40 68 90 51 23 ea 78 b1 11 b4 29 ba 91 91 cd
    05 d2 a3 89 28 0f 52 61 34 aa dc 7f c7 8c 4b 72 9d f8 28 b5 ec f7 b1 3b
    d9 ae fb 0e 57 f2 71 58 5b 8e a9 bb 35 5c 7c 79 02 07 16 cf b9 b1 18 3e
    f3 ab 20 e3 7d 57 a6 b9 d7 47 76 09 ae e6 e1 22 a4 cf 51 42 73 25 25 0c
    7d 0e 50 92 89 44 4c 9b 3a 64 8f 1d 71 03 5d 2e d6 5b 0e 3c dd 0c ba e8
    bf 2d 0b 22 78 12 cb b3 60 98 72 55 cc 74 41 10 c4 53 ba a4 fc d6 10 92
    8d 80 98 10 e4 b7 ed 1a 8f d9 91 f0 6a a6 24 82 04 79 7e 36 a6 a7 3b 70
    a2 55 9c 09 ea d6 86 94 5b a2 46 ab 66 e5 ed d8 04 4b 4c 6d e3 fc f2 a8
    94 41 ac 66 27 2f d8 fb 33 0e f8 19 05 79 b3 68 45 96 c9 60 bd 59 6e ea
    52 0a 56 a8 d6 50 f5 63 aa d2 74 09 96 0d ca 63 d3 e6 88 61 1e a5 e2 2f
    44 15 cf 95 38 d5 1a 20 0c 27 03 42 72 96 8a 26 4e d6 54 0c 84 83 8d 89
    f7 2c 24 46 1a ad 6d 26 f5 9e ca ba 9a cb bb 31 7b 66 d9 02 f4 f2 92 a3
    6a c1 b6 39 c6 37 ce 34 31 17 b6 59 62 22 45 31 7b 49 ee da 0c 62 58 f1
    00 d7 d9 61 ff b1 38 64 7e 92 ea 33 0f ae ea 6d fa 31 c7 a8 4d c3 bd 7e
    1b 7a 6c 71 78 af 36 87 90 18 e3 f2 52 10 7f 24 3d 24 3d c7 33 9d 56 84
    c8 b0 37 8b f3 02 44 da 8c 87 c8 43 f5 e5 6e b4 c5 e8 28 0a 2b 48 05 2c
    f9 3b 16 49 9a 66 db 7c ca 71 e4 59 94 26 f7 d4 61 e6 6f 99 88 2b d8 9f
    c5 08 00 be cc a6 2d 6c 74 11 6d bd 29 72 fd a1 fa 80 f8 5d f8 81 ed be
    5a 37 66 89 36 b3 35 58 3b 59 91 86 dc 5c 69 18 a3 96 fa 48 a1 81 d6 b6
    fa 4f 9d 62 d5 13 af bb 99 2f 2b 99 2f 67 f8 af e6 7f 76 91 3f a3 88 cb
    56 30 c8 ca 01 e0 c6 5d 11 c6 6a 1e 2a c4 c8 59 77 b7 c7 a6 99 9b bf 10
    dc 35 ae 69 f5 51 56 14 63 6c 0b 9b 68 c1 9e d2 e3 1c 0b 3b 66 76 30 38
    eb ba 42 f3 b3 8e dc 03 99 f3 a9 f2 3f aa 63 97 8c 31 7f c9 fa 66 a7 3f
    60 f0 50 4d e9 3b 5b 84 5e 27 55 92 c1 23 35 ee 34 0b bc 4f dd d5 02 78
    40 16 e4 b3 be 7e f0 4d da 49 f4 b4 40 a3 0c b5 d2 af 93 98 28 fd 4a e3
    79 4e 44 f9 4d f5 a6 31 ed e4 2c 17 19 bf da bf 02 53 fe 51 75 be 89 8e
    75 0e dc 53 37 0d 2b";

// The server Finished message (last handshake message inside that record).
const S_FINISHED_MSG: &str = "14 00 00 20 9b 9b 14 1d 90 63 37 fb d2 cb dc e7 1d f4 de da 4a
                              b4 2c 30 95 72 cb 7f ff ee 54 54 b7 8f 07 18";

// {client} send handshake record: complete record (58 octets): client Finished, client hs keys.
const C_FIN_RECORD: &str = "
    17 03 03 00 35 75 ec 4d c2 38 cc e6 0b 29 80 44 a7 1e 21 9c 56 cc 77 b0
    51 7f e9 b9 3c 7a 4b fc 44 d8 7f 38 f8 03 38 ac 98 fc 46 de b3 84 bd 1c
    ae ac ab 68 67 d7 26 c4 05 46";

// {server} send handshake record: complete record (227 octets): NewSessionTicket, server ap
// keys, seq 0.
const S_NST_RECORD: &str = "
    17 03 03 00 de 3a 6b 8f 90 41 4a 97 d6 95 9c 34 87 68 0d e5 13 4a 2b 24
    0e 6c ff ac 11 6e 95 d4 1d 6a f8 f6 b5 80 dc f3 d1 1d 63 c7 58 db 28 9a
    01 59 40 25 2f 55 71 3e 06 1d c1 3e 07 88 91 a3 8e fb cf 57 53 ad 8e f1
    70 ad 3c 73 53 d1 6d 9d a7 73 b9 ca 7f 2b 9f a1 b6 c0 d4 a3 d0 3f 75 e0
    9c 30 ba 1e 62 97 2a c4 6f 75 f7 b9 81 be 63 43 9b 29 99 ce 13 06 46 15
    13 98 91 d5 e4 c5 b4 06 f1 6e 3f c1 81 a7 7c a4 75 84 00 25 db 2f 0a 77
    f8 1b 5a b0 5b 94 c0 13 46 75 5f 69 23 2c 86 51 9d 86 cb ee ac 87 aa c3
    47 d1 43 f9 60 5d 64 f6 50 db 4d 02 3e 70 e9 52 ca 49 fe 51 37 12 1c 74
    bc 26 97 68 7e 24 87 46 d6 df 35 30 05 f3 bc e1 86 96 12 9c 81 53 55 6b
    3b 6c 67 79 b3 7b f1 59 85 68 4f";

// {client} send application_data record (72 octets): payload 00 01 .. 31, client ap keys seq 0.
const C_APP_RECORD: &str = "
    17 03 03 00 43 a2 3f 70 54 b6 2c 94 d0 af fa fe 82 28 ba 55 cb ef ac ea
    42 f9 14 aa 66 bc ab 3f 2b 98 19 a8 a5 b4 6b 39 5b d5 4a 9a 20 44 1e 2b
    62 97 4e 1f 5a 62 92 a2 97 70 14 bd 1e 3d ea e6 3a ee bb 21 69 49 15 e4";

// {server} send application_data record (72 octets): the same payload, server ap keys seq 1.
const S_APP_RECORD: &str = "
    17 03 03 00 43 2e 93 7e 11 ef 4a c7 40 e5 38 ad 36 00 5f c4 a4 69 32 fc
    32 25 d0 5f 82 aa 1b 36 e3 0e fa f9 7d 90 e6 df fc 60 2d cb 50 1a 59 a8
    fc c4 9c 4b f2 e5 f0 a2 1c 00 47 c2 ab f3 32 54 0d d0 32 e1 67 c2 95 5d";

// {client} / {server} send alert record (24 octets): close_notify, ap keys (client seq 1,
// server seq 2).
const C_ALERT_RECORD: &str =
    "17 03 03 00 13 c9 87 27 60 65 56 66 b7 4d 7f f1 15 3e fd 6d b6 d0 b0 e3";
const S_ALERT_RECORD: &str =
    "17 03 03 00 13 b5 8f d6 71 66 eb f5 99 d2 47 20 cf be 7e fa 7a 88 64 a9";

#[test]
fn traffic_keys_match_rfc8448() {
    for (secret, key, iv) in [
        (S_HS_SECRET, S_HS_KEY, S_HS_IV),
        (C_HS_SECRET, C_HS_KEY, C_HS_IV),
        (S_AP_SECRET, S_AP_KEY, S_AP_IV),
        (C_AP_SECRET, C_AP_KEY, C_AP_IV),
    ] {
        let keys = traffic_keys(&SUITE, &unhex(secret)).unwrap();
        assert_eq!(keys.key(), unhex(key).as_slice());
        assert_eq!(keys.iv(), unhex(iv).as_slice());
    }
}

#[test]
fn hkdf_expand_label_matches_rfc8448_finished_key() {
    let fk = hkdf_expand_label(HashAlg::Sha256, &unhex(S_HS_SECRET), b"finished", &[], 32).unwrap();
    assert_eq!(fk.as_slice(), unhex(S_FINISHED_KEY).as_slice());
}

/// Open `records` in order with keys from `secret` (first record at `seq`), check each against
/// `check`, then re-seal the plaintexts and require the exact same bytes.
fn open_and_reseal(
    secret: &str,
    seq: u64,
    records: &[&str],
    check: impl Fn(usize, ContentType, &[u8]),
) {
    let mut opener = RecordOpener::new(
        TlsVersion::Tls13,
        traffic_keys(&SUITE, &unhex(secret)).unwrap(),
        seq,
    );
    let mut sealer = RecordSealer::new(
        TlsVersion::Tls13,
        traffic_keys(&SUITE, &unhex(secret)).unwrap(),
        seq,
    );
    for (i, rec) in records.iter().enumerate() {
        let rec = unhex(rec);
        let opened = opener.open(&rec).unwrap();
        check(i, opened.content_type, &opened.plaintext);
        let mut out = Vec::new();
        sealer
            .seal(opened.content_type, &opened.plaintext, &mut out)
            .unwrap();
        assert_eq!(
            hex::encode(&out),
            hex::encode(&rec),
            "record {i} re-sealed differently"
        );
    }
    assert_eq!(opener.next_seq(), seq + records.len() as u64);
    assert_eq!(sealer.next_seq(), seq + records.len() as u64);
}

#[test]
fn server_handshake_flight() {
    open_and_reseal(S_HS_SECRET, 0, &[S_HS_RECORD], |_, ct, pt| {
        assert_eq!(ct, ContentType::HANDSHAKE);
        assert_eq!(pt.len(), 679 - 5 - 16 - 1);
        // EncryptedExtensions first ...
        assert_eq!(&pt[..4], &[0x08, 0x00, 0x00, 0x24]);
        // ... server Finished last.
        assert!(pt.ends_with(&unhex(S_FINISHED_MSG)));
    });
}

#[test]
fn client_finished() {
    open_and_reseal(C_HS_SECRET, 0, &[C_FIN_RECORD], |_, ct, pt| {
        assert_eq!(ct, ContentType::HANDSHAKE);
        assert_eq!(pt.len(), 36);
        assert_eq!(&pt[..4], &[0x14, 0, 0, 0x20]);
    });
}

#[test]
fn server_application_traffic() {
    open_and_reseal(
        S_AP_SECRET,
        0,
        &[S_NST_RECORD, S_APP_RECORD, S_ALERT_RECORD],
        |i, ct, pt| {
            match i {
                0 => {
                    assert_eq!(ct, ContentType::HANDSHAKE);
                    assert_eq!(pt[0], 4); // NewSessionTicket
                }
                1 => {
                    assert_eq!(ct, ContentType::APPLICATION_DATA);
                    assert_eq!(pt, (0u8..50).collect::<Vec<_>>().as_slice());
                }
                _ => {
                    assert_eq!(ct, ContentType::ALERT);
                    assert_eq!(pt, &[1, 0]); // warning, close_notify
                }
            }
        },
    );
}

#[test]
fn client_application_traffic() {
    open_and_reseal(
        C_AP_SECRET,
        0,
        &[C_APP_RECORD, C_ALERT_RECORD],
        |i, ct, pt| {
            if i == 0 {
                assert_eq!(ct, ContentType::APPLICATION_DATA);
                assert_eq!(pt, (0u8..50).collect::<Vec<_>>().as_slice());
            } else {
                assert_eq!(ct, ContentType::ALERT);
                assert_eq!(pt, &[1, 0]);
            }
        },
    );
}

#[test]
fn rfc8448_record_under_wrong_seq_or_key_fails() {
    // seq 1 instead of 0
    let mut o = RecordOpener::new(
        TlsVersion::Tls13,
        traffic_keys(&SUITE, &unhex(C_AP_SECRET)).unwrap(),
        1,
    );
    assert_eq!(
        o.open(&unhex(C_APP_RECORD)).err(),
        Some(mbx_record::RecordError::BadRecordMac)
    );
    // the server's keys for the client's record
    let mut o = RecordOpener::new(
        TlsVersion::Tls13,
        traffic_keys(&SUITE, &unhex(S_AP_SECRET)).unwrap(),
        0,
    );
    assert_eq!(
        o.open(&unhex(C_APP_RECORD)).err(),
        Some(mbx_record::RecordError::BadRecordMac)
    );
}
