//! The sans-I/O request handler and the key directory loader, without any socket.

mod common;

use common::Bed;
use mbx_keyless::keys::{KeyAlgorithm, KeyStore, KeyStoreError, SoftwareKey};
use mbx_keyless::server::{EdgeIdentity, KeyServerCore};
use mbx_keyless::wire::{decode, encode, Body, FrameError, Message, DEFAULT_MAX_BODY_LEN};
use mbx_keyless::{ErrorCode, Opcode};

fn answer(core: &KeyServerCore, edge: &EdgeIdentity, body: Body) -> Body {
    let request = encode(&Message {
        request_id: 42,
        body,
    })
    .unwrap();
    let response = core.handle(&request, edge).unwrap();
    let m = decode(&response, DEFAULT_MAX_BODY_LEN).unwrap();
    assert_eq!(m.request_id, 42);
    m.body
}

fn error_of(body: &Body) -> Option<ErrorCode> {
    (body.known_opcode() == Some(Opcode::Error))
        .then(|| ErrorCode::from_u8(body.payload.as_deref().unwrap()[0]).unwrap())
}

#[test]
fn handler_answers_without_any_io() {
    let bed = Bed::new();
    let core = KeyServerCore::new(bed.keys(), bed.authorization()).with_max_body_len(2048);
    let edge_a = EdgeIdentity::new(["EDGE-A".to_string()]);
    let nobody = EdgeIdentity::new(["stranger".to_string()]);

    let pong = answer(&core, &nobody, Body::op(Opcode::Ping, b"hello".to_vec()));
    assert_eq!(pong.known_opcode(), Some(Opcode::Pong));
    assert_eq!(pong.payload.as_deref(), Some(&b"hello"[..]));

    let mut sign = Body::op(Opcode::EcdsaSignSha256, vec![9u8; 32]);
    sign.ski = Some(bed.p256.ski);
    let ok = answer(&core, &edge_a, sign.clone());
    assert_eq!(
        ok.known_opcode(),
        Some(Opcode::Response),
        "identity match ignores case"
    );
    assert_eq!(
        error_of(&answer(&core, &nobody, sign.clone())),
        Some(ErrorCode::KeyNotFound)
    );

    // No opcode, or no payload: format errors.
    let mut no_opcode = sign.clone();
    no_opcode.opcode = None;
    assert_eq!(
        error_of(&answer(&core, &edge_a, no_opcode)),
        Some(ErrorCode::FormatError)
    );
    let mut no_payload = sign.clone();
    no_payload.payload = None;
    assert_eq!(
        error_of(&answer(&core, &edge_a, no_payload)),
        Some(ErrorCode::FormatError)
    );

    // A header announcing more than the maximum: close, do not answer.
    let mut big = vec![1u8, 0, 0x08, 0x01, 0, 0, 0, 1];
    big.extend(vec![0x20; 2049]);
    assert_eq!(
        core.handle(&big, &edge_a),
        Err(FrameError::BodyTooLong {
            len: 2049,
            max: 2048
        })
    );
    assert_eq!(core.handle(&[1, 0], &edge_a), Err(FrameError::NoHeader));

    // Keys can be swapped while running (the basis of a reload).
    core.replace_keys(KeyStore::new());
    assert_eq!(
        error_of(&answer(&core, &edge_a, sign)),
        Some(ErrorCode::KeyNotFound)
    );
}

#[test]
fn key_directory_formats_hostnames_and_errors() {
    let bed = Bed::new();
    let store = bed.keys();
    assert_eq!(store.len(), 6);
    let rsa = store.by_ski(&bed.rsa.ski).unwrap();
    assert_eq!(rsa.algorithm(), KeyAlgorithm::Rsa { bits: 2048 });
    assert!(rsa.hostnames().iter().any(|h| h == "rsa.example"));
    assert!(store
        .by_digest(&rsa.certificate_digest().unwrap())
        .is_some());
    let p521 = store.by_ski(&bed.p521.ski).unwrap();
    assert_eq!(
        p521.algorithm(),
        KeyAlgorithm::Ecdsa(mbx_keyless::keys::Curve::P521)
    );
    assert!(p521.hostnames().is_empty());
    assert!(store
        .by_ski(&bed.ed25519.ski)
        .unwrap()
        .certificate_digest()
        .is_none());

    // Files with other endings are ignored; a key file that is not a key is an error.
    let dir = bed.key_dir.path();
    std::fs::write(dir.join("README.txt"), "not a key").unwrap();
    assert_eq!(KeyStore::load_dir(dir).unwrap().len(), 6);
    std::fs::write(dir.join("broken.key"), "garbage").unwrap();
    assert!(matches!(
        KeyStore::load_dir(dir),
        Err(KeyStoreError::BadFile { .. })
    ));
    std::fs::remove_file(dir.join("broken.key")).unwrap();
    // The same key twice is an error, not a silent overwrite.
    std::fs::copy(dir.join("p521.pem"), dir.join("p521-copy.pem")).unwrap();
    assert!(matches!(
        KeyStore::load_dir(dir),
        Err(KeyStoreError::Duplicate(_))
    ));

    // Key sizes and types outside the spec are refused.
    let small = openssl::rsa::Rsa::generate(1024).unwrap();
    let r = SoftwareKey::from_pem(&small.private_key_to_pem().unwrap());
    assert!(matches!(r, Err(KeyStoreError::Unsupported(_))), "{r:?}");
    let k1 = openssl::ec::EcKey::generate(
        &openssl::ec::EcGroup::from_curve_name(openssl::nid::Nid::SECP256K1).unwrap(),
    )
    .unwrap();
    let r = SoftwareKey::from_pem(&k1.private_key_to_pem().unwrap());
    assert!(matches!(r, Err(KeyStoreError::Unsupported(_))), "{r:?}");
}
