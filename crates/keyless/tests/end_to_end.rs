//! The key server and the edge client over real TCP on loopback, with mutual TLS.

mod common;

use std::sync::Arc;

use common::verify::*;
use common::{key, Bed, CountingKey, SiteKey};
use mbx_keyless::keys::rsa_modulus_digest;
use mbx_keyless::server::ServerStats;
use mbx_keyless::tls::DenyList;
use mbx_keyless::wire::{encode, Body, Header, Message, HEADER_LEN, MIN_MESSAGE_LEN};
use mbx_keyless::{ClientError, ErrorCode, KeyId, Opcode};
use openssl::hash::{hash, MessageDigest};
use openssl::rsa::Padding;
use openssl::sign::Verifier;

async fn sign_and_verify(
    client: &mbx_keyless::KeylessClient,
    site: &SiteKey,
    id: KeyId,
    op: Opcode,
) -> usize {
    let sig = client.sign(&id, op, &input_for(op)).await.unwrap();
    assert!(
        openssl_verifies(&site.public, op, &sig),
        "{} {op:?}: OpenSSL rejects the signature",
        site.host
    );
    // A signature over another message must not verify (the verifier is really checking).
    let mut bad = sig.clone();
    let last = bad.len() - 1;
    bad[last] ^= 1;
    assert!(!openssl_verifies(&site.public, op, &bad));
    let mut checked = 1;
    if let Some(ok) = ring_verifies(&site.public, op, &sig) {
        assert!(ok, "{} {op:?}: ring rejects the signature", site.host);
        checked += 1;
    }
    checked
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_signing_opcode_for_every_key_type_verifies() {
    let bed = Bed::new();
    let server = bed.start().await;
    let edge = bed.edge(&server, "edge-a").await;
    let mut ring_checked = 0;
    for op in RSA_SIGN {
        ring_checked += sign_and_verify(&edge, &bed.rsa, key(&bed.rsa), op).await - 1;
    }
    for site in [&bed.p256, &bed.p384, &bed.p521] {
        for op in ECDSA_SIGN {
            ring_checked += sign_and_verify(&edge, site, key(site), op).await - 1;
        }
    }
    ring_checked +=
        sign_and_verify(&edge, &bed.ed25519, key(&bed.ed25519), Opcode::Ed25519Sign).await - 1;
    // RSA 256/384/512 and PSS ×3, P-256 ×2, P-384 ×2, Ed25519.
    assert_eq!(ring_checked, 6 + 2 + 2 + 1);

    // The RSA key is also found by the certificate digest alone.
    let n = bed.rsa.public.rsa().unwrap().n().to_vec();
    let digest: [u8; 32] = hash(MessageDigest::sha256(), hex::encode_upper(&n).as_bytes())
        .unwrap()
        .to_vec()
        .try_into()
        .unwrap();
    assert_eq!(digest, rsa_modulus_digest(&n));
    sign_and_verify(
        &edge,
        &bed.rsa,
        KeyId::digest(digest),
        Opcode::RsaSignSha256,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls12_link_works_too() {
    let bed = Bed::new();
    let server = bed.start().await;
    let cert = bed.edge_cert("edge-a");
    let edge = bed
        .connect_as(&server, Some(&cert), &[&rustls::version::TLS12])
        .await
        .unwrap();
    assert_eq!(edge.ping(b"over TLS 1.2").await.unwrap(), b"over TLS 1.2");
    sign_and_verify(&edge, &bed.p256, key(&bed.p256), Opcode::EcdsaSignSha256).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_inputs_get_the_specified_error_bytes() {
    let bed = Bed::new();
    let server = bed.start().await;
    let edge = bed.edge(&server, "edge-a").await;
    let remote = |r: Result<Vec<u8>, ClientError>| match r {
        Err(ClientError::Remote(code)) => code,
        other => panic!("expected a key-server error, got {other:?}"),
    };
    // Digest length not matching the opcode's hash: 0x07.
    for op in [
        Opcode::RsaSignSha256,
        Opcode::RsaPssSignSha384,
        Opcode::RsaSignMd5Sha1,
    ] {
        let r = edge.sign(&key(&bed.rsa), op, &[0u8; 20]).await;
        assert_eq!(remote(r), ErrorCode::FormatError, "{op:?}");
    }
    let r = edge
        .sign(&key(&bed.p256), Opcode::EcdsaSignSha384, &[0u8; 32])
        .await;
    assert_eq!(remote(r), ErrorCode::FormatError);
    // An RSA ciphertext of the wrong size: 0x07.
    let r = edge.rsa_decrypt_raw(&key(&bed.rsa), &[1u8; 255]).await;
    assert!(matches!(
        r,
        Err(ClientError::Remote(ErrorCode::FormatError))
    ));
    // An operation the key cannot do: 0x05.
    let r = edge
        .sign(&key(&bed.rsa), Opcode::EcdsaSignSha256, &[0u8; 32])
        .await;
    assert_eq!(remote(r), ErrorCode::BadOpcode);
    let r = edge
        .sign(&key(&bed.p256), Opcode::RsaSignSha256, &[0u8; 32])
        .await;
    assert_eq!(remote(r), ErrorCode::BadOpcode);
    // Unsupported (seal, unseal, RPC, custom) and unknown opcodes: 0x05.
    for byte in [0x21u8, 0x22, 0x23, 0x24, 0x99] {
        let mut body = Body::op(Opcode::Ping, vec![0u8; 32]);
        body.opcode = Some(byte);
        body.ski = Some(bed.p256.ski);
        let r = edge.request(body).await;
        assert!(
            matches!(r, Err(ClientError::Remote(ErrorCode::BadOpcode))),
            "{byte:#x}: {r:?}"
        );
    }
    // Response opcodes sent as requests: 0x06.
    for op in [Opcode::Response, Opcode::Pong, Opcode::Error] {
        let mut body = Body::op(op, vec![0u8; 32]);
        body.ski = Some(bed.p256.ski);
        let r = edge.request(body).await;
        assert!(
            matches!(r, Err(ClientError::Remote(ErrorCode::UnexpectedOpcode))),
            "{op:?}: {r:?}"
        );
    }
    // No key named, or an unknown one: 0x02.
    let r = edge
        .sign(&KeyId::default(), Opcode::EcdsaSignSha256, &[0u8; 32])
        .await;
    assert_eq!(remote(r), ErrorCode::KeyNotFound);
    let r = edge
        .sign(&KeyId::ski([7; 20]), Opcode::EcdsaSignSha256, &[0u8; 32])
        .await;
    assert_eq!(remote(r), ErrorCode::KeyNotFound);
    // The connection survived every error.
    assert_eq!(edge.ping(b"still here").await.unwrap(), b"still here");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edges_only_reach_the_keys_they_are_authorized_for() {
    let bed = Bed::new();
    let server = bed.start().await;
    let a = bed.edge(&server, "edge-a").await;
    let b = bed.edge(&server, "edge-b").await;
    let digest = input_for(Opcode::EcdsaSignSha256);
    // Positive controls: each edge reaches its own host's key.
    sign_and_verify(&b, &bed.b_site, key(&bed.b_site), Opcode::EcdsaSignSha256).await;
    sign_and_verify(&a, &bed.p256, key(&bed.p256), Opcode::EcdsaSignSha256).await;
    // Host A's edge asking for host B's key, and the reverse: "key not found".
    let r = a
        .sign(&key(&bed.b_site), Opcode::EcdsaSignSha256, &digest)
        .await;
    assert!(
        matches!(r, Err(ClientError::Remote(ErrorCode::KeyNotFound))),
        "{r:?}"
    );
    let r = b
        .sign(&key(&bed.p256), Opcode::EcdsaSignSha256, &digest)
        .await;
    assert!(
        matches!(r, Err(ClientError::Remote(ErrorCode::KeyNotFound))),
        "{r:?}"
    );
    // SKI grants work as well as host-name grants: P-521 is granted to edge-a by SKI only.
    let r = b
        .sign(&key(&bed.p521), Opcode::EcdsaSignSha256, &digest)
        .await;
    assert!(
        matches!(r, Err(ClientError::Remote(ErrorCode::KeyNotFound))),
        "{r:?}"
    );
    // An edge with a valid certificate but no grant at all.
    let c = bed.edge(&server, "edge-c").await;
    let r = c
        .sign(&key(&bed.p256), Opcode::EcdsaSignSha256, &digest)
        .await;
    assert!(
        matches!(r, Err(ClientError::Remote(ErrorCode::KeyNotFound))),
        "{r:?}"
    );
    assert_eq!(
        c.ping(b"ping needs no grant").await.unwrap(),
        b"ping needs no grant"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_at_the_handshake() {
    let bed = Bed::new();
    let denied_by_hash = bed.edge_cert("edge-a");
    let denied_by_serial = bed.edge_cert("edge-a");
    let mut deny = DenyList::new();
    deny.deny_sha256(mbx_keyless::x509::certificate_sha256(
        denied_by_hash.cert_der(),
    ));
    deny.deny_serial(&mbx_keyless::x509::certificate_serial(denied_by_serial.cert_der()).unwrap());
    let server = bed.start_with(bed.keys(), deny, 0).await;

    let good = bed.edge_cert("edge-a");
    let expired = bed.expired_edge_cert("edge-a");
    let foreign = bed
        .other_pki
        .issue(&mbx_testbed::pki::LeafSpec::client("edge-a"))
        .unwrap();
    let cases: [(&str, Option<&mbx_testbed::pki::IssuedCert>); 5] = [
        ("no certificate", None),
        ("expired", Some(&expired)),
        ("another CA", Some(&foreign)),
        ("denied by SHA-256", Some(&denied_by_hash)),
        ("denied by serial", Some(&denied_by_serial)),
    ];
    let mut refused = 0;
    for versions in [
        &[&rustls::version::TLS13][..],
        &[&rustls::version::TLS12][..],
    ] {
        for (what, cert) in cases {
            // TLS 1.2 fails in connect; TLS 1.3 lets the client finish first, so the refusal
            // surfaces on the first request.
            let result = match bed.connect_as(&server, cert, versions).await {
                Ok(client) => client.ping(b"x").await.map(|_| ()),
                Err(e) => Err(e),
            };
            assert!(
                matches!(
                    result,
                    Err(ClientError::Connect(_) | ClientError::ConnectionClosed)
                ),
                "{what} over {versions:?}: {result:?}"
            );
            refused += 1;
        }
    }
    // The client may see the alert just before the server task counts the failure: wait for the
    // count (an event), without any assertion on how long that takes.
    for _ in 0..6000 {
        if ServerStats::get(&server.stats().handshake_failures) >= refused {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(
        ServerStats::get(&server.stats().handshake_failures),
        refused,
        "every refusal happened in the server's handshake"
    );
    // A good certificate from the same CA still gets in.
    let ok = bed.connect_as(&server, Some(&good), &[]).await.unwrap();
    assert_eq!(ok.ping(b"ok").await.unwrap(), b"ok");
    assert_eq!(
        ServerStats::get(&server.stats().handshake_failures),
        refused
    );
}

fn raw_message(major: u8, id: u32, body: &[u8]) -> Vec<u8> {
    let mut v = Header {
        major,
        minor: 0,
        body_length: body.len() as u16,
        request_id: id,
    }
    .to_bytes()
    .to_vec();
    v.extend_from_slice(body);
    v
}

fn error_byte(frame: &mbx_keyless::wire::Frame) -> Option<u8> {
    let m = frame.decode().unwrap();
    (m.body.known_opcode() == Some(Opcode::Error)).then(|| m.body.payload.as_deref().unwrap()[0])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn version_and_format_errors_keep_the_connection() {
    let bed = Bed::new();
    let server = bed.start().await;
    let edge = bed.edge(&server, "edge-a").await;
    let ping_body = |id: u32| {
        let mut b = encode(&Message {
            request_id: id,
            body: Body::op(Opcode::Ping, b"v".to_vec()),
        })
        .unwrap();
        b.drain(..HEADER_LEN);
        b
    };
    // Wrong major version: 0x04, echoed request id.
    let mut sent_id = 0;
    let frame = edge
        .send_raw(|id| {
            sent_id = id;
            raw_message(2, id, &ping_body(id))
        })
        .await
        .unwrap();
    assert_eq!(frame.header.request_id, sent_id);
    assert_eq!(error_byte(&frame), Some(ErrorCode::VersionMismatch.to_u8()));
    // The same message with major 1 is fine (the check is on the version, not the body).
    let frame = edge
        .send_raw(|id| raw_message(1, id, &ping_body(id)))
        .await
        .unwrap();
    assert_eq!(error_byte(&frame), None);
    // Malformed bodies: repeated opcode, truncated item, opcode of length 2, 5-byte IP.
    let malformed: [&[u8]; 4] = [
        &[0x11, 0, 1, 0xF1, 0x11, 0, 1, 0xF1],
        &[0x12, 0, 9, 1, 2],
        &[0x11, 0, 2, 0xF1, 0xF1],
        &[0x11, 0, 1, 0xF1, 0x03, 0, 5, 1, 2, 3, 4, 5],
    ];
    for body in malformed {
        let frame = edge.send_raw(|id| raw_message(1, id, body)).await.unwrap();
        assert_eq!(
            error_byte(&frame),
            Some(ErrorCode::FormatError.to_u8()),
            "{body:?}"
        );
        // The next request on the same connection still works.
        assert_eq!(edge.ping(b"next").await.unwrap(), b"next");
    }
    sign_and_verify(&edge, &bed.p256, key(&bed.p256), Opcode::EcdsaSignSha256).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_header_length_closes_the_connection() {
    let bed = Bed::new();
    let server = bed.start().await;
    let edge = bed.edge(&server, "edge-a").await;
    assert_eq!(edge.ping(b"before").await.unwrap(), b"before");
    // 0xFFFF > the default maximum of 16 KiB; no body follows, so a server that waited for it
    // would leave the request hanging (timeout) instead of closing.
    let r = edge
        .send_raw(|id| {
            raw_message(1, id, &[])
                .iter()
                .take(2)
                .copied()
                .chain([0xFF, 0xFF])
                .chain(id.to_be_bytes())
                .collect()
        })
        .await;
    assert!(matches!(r, Err(ClientError::ConnectionClosed)), "{r:?}");
    let r = edge.ping(b"after").await;
    assert!(matches!(r, Err(ClientError::ConnectionClosed)), "{r:?}");
    assert_eq!(ServerStats::get(&server.stats().oversized_closes), 1);
    // The server itself is fine: a new connection works.
    let again = bed.edge(&server, "edge-a").await;
    assert_eq!(again.ping(b"new").await.unwrap(), b"new");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_to_one_operation_have_one_length() {
    let bed = Bed::new();
    let server = bed.start().await;
    let edge = bed.edge(&server, "edge-a").await;
    let mut der_lengths = std::collections::BTreeSet::new();
    let mut frame_lengths = std::collections::BTreeSet::new();
    for i in 0..40u8 {
        let digest = hash(MessageDigest::sha256(), &[i]).unwrap().to_vec();
        let mut body = Body::op(Opcode::EcdsaSignSha256, digest);
        body.ski = Some(bed.p256.ski);
        let frame = edge
            .send_raw(|id| {
                encode(&Message {
                    request_id: id,
                    body,
                })
                .unwrap()
            })
            .await
            .unwrap();
        frame_lengths.insert(HEADER_LEN + frame.body.len());
        der_lengths.insert(frame.decode().unwrap().body.payload.as_ref().unwrap().len());
    }
    // DER ECDSA signatures vary in length; the messages carrying them do not.
    assert_eq!(
        frame_lengths.into_iter().collect::<Vec<_>>(),
        [MIN_MESSAGE_LEN]
    );
    assert!(!der_lengths.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_requests_are_answered_out_of_order() {
    let bed = Bed::new();
    let gated_ski = [0x6A; 20];
    let gated = CountingKey::new(gated_ski);
    let state = Arc::clone(&gated.state);
    let mut keys = bed.keys();
    keys.insert(Arc::new(gated)).unwrap();
    let server = bed.start_with(keys, DenyList::new(), 4).await;
    let edge = Arc::new(bed.edge(&server, "edge-b").await);
    let mut authz = bed.authorization();
    authz.allow("edge-b", [gated_ski], []);
    server.core().replace_authorization(authz);

    // Request 1 is held inside the key operation...
    let slow = {
        let edge = Arc::clone(&edge);
        tokio::spawn(async move {
            edge.sign(&KeyId::ski(gated_ski), Opcode::Ed25519Sign, b"first")
                .await
        })
    };
    let held = Arc::clone(&state);
    tokio::task::spawn_blocking(move || {
        common::wait_counts(&held, "the held request", |c| c.entered == 1)
    })
    .await
    .unwrap();
    // ...while many later requests on the same connection are answered, each with its own
    // result.
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..100u32 {
        let edge = Arc::clone(&edge);
        let public = bed.b_site.public.clone();
        let ski = bed.b_site.ski;
        tasks.spawn(async move {
            if i % 2 == 0 {
                let payload = i.to_be_bytes();
                assert_eq!(edge.ping(&payload).await.unwrap(), payload);
            } else {
                let msg = format!("message {i}");
                let digest = hash(MessageDigest::sha256(), msg.as_bytes()).unwrap();
                let sig = edge
                    .sign(&KeyId::ski(ski), Opcode::EcdsaSignSha256, &digest)
                    .await
                    .unwrap();
                let mut v = Verifier::new(MessageDigest::sha256(), &public).unwrap();
                v.update(msg.as_bytes()).unwrap();
                assert!(
                    v.verify(&sig).unwrap(),
                    "request {i} got another request's answer"
                );
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.unwrap();
    }
    assert!(!slow.is_finished());
    common::release_one(&state);
    let first = slow.await.unwrap().unwrap();
    assert_eq!(first, b"tsrif");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_finished_before_a_slow_operation_are_sent_before_it() {
    let bed = Bed::new();
    let gated_ski = [0x6B; 20];
    let gated = CountingKey::new(gated_ski);
    let state = Arc::clone(&gated.state);
    let mut keys = bed.keys();
    keys.insert(Arc::new(gated)).unwrap();
    // One worker, so both requests below are served by the same job, one after the other.
    let server = bed.start_with(keys, DenyList::new(), 1).await;
    let edge = bed.edge(&server, "edge-b").await;
    let mut authz = bed.authorization();
    authz.allow("edge-b", [gated_ski], []);
    server.core().replace_authorization(authz);

    // A ping and, in the same TLS record, a request that blocks in the key operation. The
    // server batches responses; the pong must still go out before the blocked operation ends.
    let frame = edge
        .send_raw(|id| {
            let mut bytes = encode(&Message {
                request_id: id,
                body: Body::op(Opcode::Ping, b"before".to_vec()),
            })
            .unwrap();
            let mut slow = Body::op(Opcode::Ed25519Sign, b"blocked".to_vec());
            slow.ski = Some(gated_ski);
            bytes.extend(
                encode(&Message {
                    request_id: 1_000_000,
                    body: slow,
                })
                .unwrap(),
            );
            bytes
        })
        .await
        .expect("the pong is not held behind the blocked operation");
    let pong = frame.decode().unwrap().body;
    assert_eq!(pong.known_opcode(), Some(Opcode::Pong));
    assert_eq!(pong.payload.as_deref(), Some(&b"before"[..]));
    tokio::task::spawn_blocking(move || {
        common::wait_counts(&state, "the blocked request", |c| c.entered == 1);
        common::release_one(&state);
    })
    .await
    .unwrap();
}

/// Back-pressure: with `max_in_flight_per_connection = 2` and four workers, no more than two
/// requests of one connection are ever inside the key operation at once, however many are
/// pipelined, and every request is still answered. The key operations block until the test
/// releases them one by one; the check is on the counted maximum, never on time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_limit_bounds_the_requests_worked_on_per_connection() {
    const LIMIT: usize = 2;
    const REQUESTS: usize = 12;
    let bed = Bed::new();
    let ski = [0x6C; 20];
    let counting = CountingKey::new(ski);
    let state = Arc::clone(&counting.state);
    let mut keys = bed.keys();
    keys.insert(Arc::new(counting)).unwrap();
    // More workers than the limit, so only the limit can keep the third request out.
    let server = bed.start_with_depth(keys, DenyList::new(), 4, LIMIT).await;
    let edge = Arc::new(bed.edge(&server, "edge-b").await);
    let mut authz = bed.authorization();
    authz.allow("edge-b", [ski], []);
    server.core().replace_authorization(authz);

    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..REQUESTS {
        let edge = Arc::clone(&edge);
        let state = Arc::clone(&state);
        tasks.spawn(async move {
            let input = format!("request {i}");
            let out = edge
                .sign(&KeyId::ski(ski), Opcode::Ed25519Sign, input.as_bytes())
                .await
                .unwrap();
            let expected: Vec<u8> = input.bytes().rev().collect();
            assert_eq!(out, expected, "request {i} got another request's answer");
            common::note_answer(&state);
        });
    }
    // Release the blocked operations one at a time, each time once as many requests as the
    // limit allows (or as are left) are inside the key operation, and wait for the released
    // request's answer to reach the edge before looking again (without the limit, the other
    // workers take further requests in the meantime).
    let releaser = {
        let state = Arc::clone(&state);
        tokio::task::spawn_blocking(move || {
            for released in 0..REQUESTS {
                let want = LIMIT.min(REQUESTS - released);
                let counts = common::wait_counts(&state, "blocked requests", |c| {
                    c.releases == 0 && c.current >= want
                });
                assert!(
                    counts.current <= LIMIT,
                    "{} requests in the key operation at once: {counts:?}",
                    counts.current
                );
                common::release_one(&state);
                common::wait_counts(&state, "the released answer", |c| c.answered > released);
            }
        })
    };
    releaser.await.unwrap();
    while let Some(r) = tasks.join_next().await {
        r.unwrap();
    }
    let counts = common::wait_counts(&state, "the end", |_| true);
    assert_eq!(counts.entered, REQUESTS);
    assert_eq!(counts.current, 0);
    assert_eq!(
        counts.max, LIMIT,
        "never more than the limit at once: {counts:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rsa_key_transport_is_unpadded_on_the_edge() {
    let bed = Bed::new();
    let server = bed.start().await;
    let edge = bed.edge(&server, "edge-a").await;
    let rsa = bed.rsa.public.rsa().unwrap();
    let k = rsa.size() as usize;
    let id = key(&bed.rsa);

    let mut premaster = [0u8; 48];
    openssl::rand::rand_bytes(&mut premaster).unwrap();
    premaster[..2].copy_from_slice(&[3, 3]);
    let mut ct = vec![0; k];
    rsa.public_encrypt(&premaster, &mut ct, Padding::PKCS1)
        .unwrap();

    // The key server returns the raw block, padding in place.
    let block = edge.rsa_decrypt_raw(&id, &ct).await.unwrap();
    assert_eq!(block.len(), k);
    assert_eq!(&block[..2], &[0, 2]);
    assert_eq!(&block[k - 48..], &premaster);
    // The edge unpads it.
    let got = edge.rsa_decrypt_premaster(&id, &ct, [3, 3]).await.unwrap();
    assert_eq!(*got, premaster);

    // Wrong version, bad block type, M of 47 bytes: a random premaster, no error.
    let raw_encrypt = |block: &[u8]| {
        let mut ct = vec![0; k];
        rsa.public_encrypt(block, &mut ct, Padding::NONE).unwrap();
        ct
    };
    let wrong_version = edge.rsa_decrypt_premaster(&id, &ct, [3, 1]).await.unwrap();
    let mut bad_type = block.to_vec();
    bad_type[1] = 1;
    let mut short_m = block.to_vec();
    short_m[k - 49] = 0x11;
    short_m[k - 48] = 0;
    let mut results = vec![wrong_version];
    for bad in [bad_type, short_m] {
        results.push(
            edge.rsa_decrypt_premaster(&id, &raw_encrypt(&bad), [3, 3])
                .await
                .unwrap(),
        );
    }
    for r in &results {
        assert_eq!(r.len(), 48);
        assert_ne!(**r, premaster);
    }
    // Random, not a constant: the same bad ciphertext twice gives two different premasters.
    let again = edge.rsa_decrypt_premaster(&id, &ct, [3, 1]).await.unwrap();
    assert_ne!(*again, *results[0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_starts_from_a_toml_config() {
    let bed = Bed::new();
    let files = tempfile::tempdir().unwrap();
    let paths = bed
        .server_cert
        .write_to_named(files.path(), "server")
        .unwrap();
    let edge_ca = files.path().join("edge-ca.pem");
    std::fs::write(&edge_ca, bed.edge_pki.root_pem()).unwrap();
    let denied = bed.edge_cert("edge-a");
    let serial = mbx_keyless::x509::certificate_serial(denied.cert_der()).unwrap();
    let toml = format!(
        r#"
        listen = "127.0.0.1:0"
        key_dir = "{}"
        certificate = "{}"
        private_key = "{}"
        edge_ca = "{}"
        workers = 2
        [deny]
        serials = ["{}"]
        [edges."edge-a"]
        hostnames = ["p256.example"]
        "#,
        bed.key_dir.path().display(),
        paths.chain.display(),
        paths.key.display(),
        edge_ca.display(),
        hex::encode(serial),
    );
    let config = mbx_keyless::ServerConfig::from_toml(&toml).unwrap();
    let server = mbx_keyless::KeyServer::from_config(&config)
        .unwrap()
        .bind(config.listen)
        .await
        .unwrap();
    let edge = bed.edge(&server, "edge-a").await;
    sign_and_verify(&edge, &bed.p256, key(&bed.p256), Opcode::EcdsaSignSha256).await;
    let r = edge
        .sign(&key(&bed.p384), Opcode::EcdsaSignSha384, &[0u8; 48])
        .await;
    assert!(
        matches!(r, Err(ClientError::Remote(ErrorCode::KeyNotFound))),
        "{r:?}"
    );
    let refused = match bed.connect_as(&server, Some(&denied), &[]).await {
        Ok(c) => c.ping(b"x").await.map(|_| ()),
        Err(e) => Err(e),
    };
    assert!(refused.is_err());
}
