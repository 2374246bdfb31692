//! Round trips and never-panic properties of the mbTLS wire formats.

use mbx_mbtls::wire::{
    Encapsulated, KeyMaterial, MiddleboxSupport, SecondaryMessage, SecondaryReader,
    MAX_INNER_PAYLOAD_LEN, MAX_REFUSED_LEN,
};
use mbx_mbtls::{DirectionKeys, HopKeys, TrafficSecret};
use mbx_record::{CipherSuite, TlsVersion, TrafficKeys};
use mbx_wire::record::encode_record;
use mbx_wire::{ContentType, Record};
use proptest::prelude::*;

fn suite() -> impl Strategy<Value = CipherSuite> {
    proptest::sample::select(CipherSuite::ALL.to_vec())
}

fn direction(s: CipherSuite, seq: u64) -> impl Strategy<Value = DirectionKeys> {
    (
        proptest::collection::vec(any::<u8>(), s.aead.key_len()),
        proptest::collection::vec(any::<u8>(), s.aead.tls12_fixed_iv_len()),
        proptest::collection::vec(any::<u8>(), s.hash.output_len()),
        any::<u64>(),
    )
        .prop_map(move |(k, iv, secret, own_seq)| match s.version {
            // TLS 1.2 carries one sequence number per direction for all hops, and no secret.
            TlsVersion::Tls12 => {
                DirectionKeys::without_secret(TrafficKeys::new(s.aead, &k, &iv).unwrap(), seq)
            }
            // TLS 1.3: the key and IV of a traffic secret.
            TlsVersion::Tls13 => {
                DirectionKeys::from_secret(TrafficSecret::new(s, &secret).unwrap(), own_seq)
                    .unwrap()
            }
        })
}

fn key_material() -> impl Strategy<Value = KeyMaterial> {
    (suite(), any::<u64>(), any::<u64>()).prop_flat_map(|(s, c2s, s2c)| {
        (
            direction(s, c2s),
            direction(s, s2c),
            direction(s, c2s),
            direction(s, s2c),
        )
            .prop_map(move |(a, b, c, d)| KeyMaterial {
                version: s.version,
                suite: s,
                toward_client: HopKeys { c2s: a, s2c: b },
                toward_server: HopKeys { c2s: c, s2c: d },
            })
    })
}

fn client_hello() -> impl Strategy<Value = Vec<u8>> {
    (
        any::<[u8; 32]>(),
        proptest::collection::vec(any::<u8>(), 0..=32),
        proptest::collection::vec(any::<u8>(), 0..200),
    )
        .prop_map(|(random, sid, ext_data)| {
            let mut body = vec![3, 3];
            body.extend(random);
            body.push(sid.len() as u8);
            body.extend(&sid);
            body.extend([0, 2, 0x13, 0x01, 1, 0]);
            // one private extension carrying arbitrary data
            let ext_len = ext_data.len() + 4;
            body.extend((ext_len as u16).to_be_bytes());
            body.extend([0xfe, 0x00]);
            body.extend((ext_data.len() as u16).to_be_bytes());
            body.extend(ext_data);
            let mut msg = vec![1, 0];
            msg.extend((body.len() as u16).to_be_bytes());
            msg.extend(body);
            msg
        })
}

/// The one message `bytes` hold, read from a reader given them in two pieces cut at `cut`:
/// nothing is read from the first piece alone, and nothing is left over.
fn read_in_two(bytes: &[u8], cut: usize) -> Result<SecondaryMessage, TestCaseError> {
    let mut r = SecondaryReader::new();
    let cut = cut.min(bytes.len());
    r.push(&bytes[..cut]);
    if cut < bytes.len() {
        prop_assert!(r.next_message().unwrap().is_none());
        r.push(&bytes[cut..]);
    }
    let msg = r.next_message().unwrap();
    prop_assert_eq!(r.buffered(), 0);
    msg.ok_or_else(|| TestCaseError::fail("no message"))
}

proptest! {
    #[test]
    fn encapsulated_round_trip(
        sub in any::<u8>(),
        ct in proptest::sample::select(vec![20u8, 21, 22, 23]),
        payload in proptest::collection::vec(any::<u8>(), 1..2000),
        big in any::<bool>(),
    ) {
        let payload = if big { vec![7u8; MAX_INNER_PAYLOAD_LEN] } else { payload };
        let mut inner = Vec::new();
        encode_record(ContentType(ct), 0x0303, &payload, &mut inner).unwrap();
        let e = Encapsulated::new(sub, Record::from_bytes(inner).unwrap()).unwrap();
        let mut out = Vec::new();
        e.encode(0x0303, &mut out).unwrap();
        let back = Encapsulated::from_record(&Record::from_bytes(out).unwrap()).unwrap();
        prop_assert_eq!(back, e);
    }

    #[test]
    fn encapsulated_never_panics(data in proptest::collection::vec(any::<u8>(), 0..300)) {
        if let Ok(e) = Encapsulated::parse(&data) {
            // Whatever parses re-encodes to the same payload.
            let mut out = Vec::new();
            e.encode(0x0303, &mut out).unwrap();
            prop_assert_eq!(&out[5..], &data[..]);
        }
    }

    #[test]
    fn key_material_round_trip(km in key_material()) {
        let enc = km.encode().unwrap();
        let back = KeyMaterial::decode(&enc).unwrap();
        prop_assert_eq!(back.encode().unwrap(), enc);
        prop_assert_eq!(back.suite, km.suite);
        prop_assert_eq!(back.toward_server.s2c.next_seq, km.toward_server.s2c.next_seq);
        prop_assert_eq!(back.toward_client.c2s.keys.key(), km.toward_client.c2s.keys.key());
    }

    #[test]
    fn key_material_never_panics(
        km in key_material(),
        flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..4),
        cut in any::<usize>(),
        random in proptest::collection::vec(any::<u8>(), 0..300),
    ) {
        let _ = KeyMaterial::decode(&random);
        let mut enc = km.encode().unwrap().to_vec();
        for (i, x) in flips {
            let n = enc.len();
            enc[i % n] ^= x;
        }
        let _ = KeyMaterial::decode(&enc);
        let _ = KeyMaterial::decode(&enc[..cut % (enc.len() + 1)]);
    }

    #[test]
    fn support_round_trip(
        hellos in proptest::collection::vec(client_hello(), 0..4),
        mboxes in proptest::collection::vec("[a-z0-9.-]{1,60}(:[0-9]{1,5})?", 0..5),
    ) {
        let ext = MiddleboxSupport { client_hellos: hellos, middleboxes: mboxes };
        let enc = ext.encode().unwrap();
        prop_assert_eq!(MiddleboxSupport::parse(&enc).unwrap(), ext);
    }

    #[test]
    fn support_never_panics(
        data in proptest::collection::vec(any::<u8>(), 0..600),
        hello in client_hello(),
        flip in (any::<usize>(), any::<u8>()),
    ) {
        let _ = MiddleboxSupport::parse(&data);
        let mut enc = MiddleboxSupport { client_hellos: vec![hello], middleboxes: vec!["m:1".into()] }
            .encode()
            .unwrap();
        let n = enc.len();
        enc[flip.0 % n] ^= flip.1;
        let _ = MiddleboxSupport::parse(&enc);
    }

    /// A path message survives encoding and any split, and is read as sent.
    #[test]
    fn path_message_round_trips(far in any::<bool>(), ticket in any::<bool>(), cut in 0usize..5) {
        let bytes = SecondaryMessage::Path { far_neighbour_joined: far, ticket_wanted: ticket }
            .encode()
            .unwrap();
        match read_in_two(&bytes, cut)? {
            SecondaryMessage::Path { far_neighbour_joined, ticket_wanted } => {
                prop_assert_eq!(far_neighbour_joined, far);
                prop_assert_eq!(ticket_wanted, ticket);
            }
            other => prop_assert!(false, "{:?}", other),
        }
    }

    /// A refusal's text survives encoding and any split: whole up to MAX_REFUSED_LEN bytes,
    /// else cut there at a character boundary.
    #[test]
    fn a_refusal_round_trips_cut_to_its_limit(why in ".{0,700}", cut in 0usize..3000) {
        let bytes = SecondaryMessage::Refused(why.clone()).encode().unwrap();
        let mut end = why.len().min(MAX_REFUSED_LEN);
        while !why.is_char_boundary(end) {
            end -= 1;
        }
        match read_in_two(&bytes, cut)? {
            SecondaryMessage::Refused(got) => prop_assert_eq!(got.as_str(), &why[..end]),
            other => prop_assert!(false, "{:?}", other),
        }
    }

    #[test]
    fn secondary_reader_never_panics(
        data in proptest::collection::vec(any::<u8>(), 0..600),
        evidence in proptest::collection::vec(any::<u8>(), 0..100),
    ) {
        let mut r = SecondaryReader::new();
        r.push(&SecondaryMessage::Evidence(evidence.clone()).encode().unwrap());
        match r.next_message().unwrap() {
            Some(SecondaryMessage::Evidence(e)) => prop_assert_eq!(e, evidence),
            other => prop_assert!(false, "{:?}", other),
        }
        r.push(&data);
        while let Ok(Some(_)) = r.next_message() {}
    }
}
