//! Garbled evaluation against the cleartext reference, determinism, streaming and the checks.

use aes::cipher::{BlockEncrypt, KeyInit};
use mbx_garble::*;
use proptest::prelude::*;
use rand::{Rng, SeedableRng};

fn aes_ref(k: &[u8; 16], r: &[u8; 16]) -> [u8; 16] {
    let c = aes::Aes128::new(k.into());
    let mut b = (*r).into();
    c.encrypt_block(&mut b);
    b.into()
}

fn seed(b: u8) -> GarbleSeed {
    GarbleSeed::new([b; 16])
}

/// A random topological circuit from raw choices (operands reduced modulo the wires so far).
fn random_circuit(g: u32, e: u32, ops: &[(u8, u32, u32)], outs: &[u32]) -> Circuit {
    let mut b = CircuitBuilder::new(g, e);
    let mut wires: Vec<Wire> = b.garbler_wires();
    wires.extend(b.evaluator_wires());
    for &(op, x, y) in ops {
        let a = wires[x as usize % wires.len()];
        let c = wires[y as usize % wires.len()];
        let w = match op % 3 {
            0 => b.xor(a, c),
            1 => b.and(a, c),
            _ => b.inv(a),
        };
        wires.push(w);
    }
    let outputs: Vec<Wire> = outs
        .iter()
        .map(|&o| wires[o as usize % wires.len()])
        .collect();
    b.build(&outputs).unwrap()
}

fn select_labels(pairs: &[LabelPair], bits: &[bool]) -> Vec<Label> {
    pairs.iter().zip(bits).map(|(p, &b)| p.select(b)).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn garbled_equals_cleartext(
        g in 1u32..8, e in 1u32..8,
        ops in proptest::collection::vec((any::<u8>(), any::<u32>(), any::<u32>()), 0..300),
        outs in proptest::collection::vec(any::<u32>(), 1..12),
        input_seed in any::<u64>(), garble_seed in any::<[u8; 16]>(), instance in any::<u64>(),
        chunk in 1usize..200,
    ) {
        let c = random_circuit(g, e, &ops, &outs);
        let mut rng = rand::rngs::StdRng::seed_from_u64(input_seed);
        let gb: Vec<bool> = (0..g).map(|_| rng.gen()).collect();
        let eb: Vec<bool> = (0..e).map(|_| rng.gen()).collect();
        let expected = c.eval(&gb, &eb).unwrap();

        let gc = garble(&c, &GarbleSeed::new(garble_seed), instance, &gb).unwrap();
        prop_assert_eq!(gc.tables.len(), c.counts().and * TABLE_BYTES_PER_AND);
        let el = select_labels(&gc.evaluator_pairs, &eb);
        // Tables fed in arbitrary chunks (not aligned to gates) give the same result.
        let mut ev = Evaluator::new(&c, instance, &gc.garbler_labels, &el).unwrap();
        for piece in gc.tables.chunks(chunk) {
            ev.feed(piece).unwrap();
        }
        prop_assert_eq!(ev.finish(&gc.decoding).unwrap(), expected);
        // Serialization round trip keeps the circuit.
        prop_assert_eq!(Circuit::from_bytes(&c.to_bytes()).unwrap(), c);
    }

    #[test]
    fn parser_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let mut with_magic = b"MBXGC1".to_vec();
        with_magic.extend_from_slice(&bytes);
        let _ = Circuit::from_bytes(&bytes);
        if let Ok(c) = Circuit::from_bytes(&with_magic) {
            prop_assert_eq!(c.to_bytes().len() <= with_magic.len(), true);
        }
    }
}

#[test]
fn garbled_aes_matches_aes_crate() {
    let c = aes128_circuit().unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    for i in 0..3 {
        let (k, r): ([u8; 16], [u8; 16]) = (rng.gen(), rng.gen());
        let gc = garble(
            &c,
            &GarbleSeed::new(rng.gen()),
            i,
            &aes128_garbler_inputs(&k),
        )
        .unwrap();
        assert_eq!(gc.tables.len(), 5_120 * 32);
        let el = select_labels(&gc.evaluator_pairs, &bytes_to_bits(&r));
        let out = evaluate(&c, i, &gc.tables, &gc.garbler_labels, &el, &gc.decoding).unwrap();
        assert_eq!(block_from_bits(&out).unwrap(), aes_ref(&k, &r));
    }
}

#[test]
fn gate_counts() {
    let aes = aes128_circuit().unwrap();
    assert_eq!(aes.counts().and, 5_120);
    assert_eq!(AES_AND_GATES, 5_120);
    let bb = blindbox_circuit().unwrap();
    let counts = bb.counts();
    assert_eq!(counts.and, 2 * 5_120 + 127 + 128);
    assert_eq!(counts.table_bytes(), 10_495 * 32);
    assert_eq!(
        (
            bb.garbler_inputs(),
            bb.evaluator_inputs(),
            bb.outputs().len()
        ),
        (2816, 256, 128)
    );
}

#[test]
fn blindbox_garbled_tag_check() {
    let c = blindbox_circuit().unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(2);
    let (k, k_rg, r): ([u8; 16], [u8; 16], [u8; 16]) = (rng.gen(), rng.gen(), rng.gen());
    let gb = blindbox_garbler_inputs(&k, &k_rg);
    let gc = garble(&c, &seed(3), 9, &gb).unwrap();
    let run = |tag: &[u8; 16]| {
        let el = select_labels(&gc.evaluator_pairs, &blindbox_evaluator_inputs(&r, tag));
        let out = evaluate(&c, 9, &gc.tables, &gc.garbler_labels, &el, &gc.decoding).unwrap();
        block_from_bits(&out).unwrap()
    };
    let tag = aes_ref(&k_rg, &r);
    assert_eq!(run(&tag), aes_ref(&k, &r));
    let mut wrong = tag;
    wrong[15] ^= 0x80;
    assert_eq!(run(&wrong), [0u8; 16]);
    assert_eq!(run(&[0u8; 16]), [0u8; 16]);
}

#[test]
fn same_seed_identical_different_seed_differs() {
    let c = blindbox_circuit().unwrap();
    let gb = blindbox_garbler_inputs(&[1; 16], &[2; 16]);
    let a = garble(&c, &seed(5), 0, &gb).unwrap();
    let b = garble(&c, &seed(5), 0, &gb).unwrap();
    assert_eq!(a.tables, b.tables);
    assert_eq!(a.decoding, b.decoding);
    let bytes = |ls: &[Label]| ls.iter().map(Label::to_bytes).collect::<Vec<_>>();
    assert_eq!(bytes(&a.garbler_labels), bytes(&b.garbler_labels));
    // The sent seed expands to exactly the active labels.
    assert_eq!(
        bytes(&a.garbler_label_seed.expand(gb.len())),
        bytes(&a.garbler_labels)
    );
    let pairs = |ps: &[LabelPair]| {
        ps.iter()
            .map(|p| (p.zero.to_bytes(), p.one.to_bytes()))
            .collect::<Vec<_>>()
    };
    assert_eq!(pairs(&a.evaluator_pairs), pairs(&b.evaluator_pairs));
    assert_eq!(
        hash_garbling(&c, &seed(5), 0, &gb).unwrap(),
        hash_garbling(&c, &seed(5), 0, &gb).unwrap()
    );

    let other = garble(&c, &seed(6), 0, &gb).unwrap();
    assert_ne!(a.tables, other.tables);
    assert_ne!(bytes(&a.garbler_labels), bytes(&other.garbler_labels));
    assert_ne!(
        hash_garbling(&c, &seed(5), 0, &gb).unwrap(),
        hash_garbling(&c, &seed(6), 0, &gb).unwrap()
    );
    // Instance number and garbler inputs are bound too.
    assert_ne!(
        hash_garbling(&c, &seed(5), 0, &gb).unwrap(),
        hash_garbling(&c, &seed(5), 1, &gb).unwrap()
    );
    let gb2 = blindbox_garbler_inputs(&[1; 16], &[3; 16]);
    // The garbler's active labels come from the sent seed alone: they do not reveal its bits.
    let other_key = garble(&c, &seed(5), 0, &gb2).unwrap();
    assert_eq!(bytes(&a.garbler_labels), bytes(&other_key.garbler_labels));
    assert_ne!(a.tables, other_key.tables);
    assert_ne!(
        hash_garbling(&c, &seed(5), 0, &gb).unwrap(),
        hash_garbling(&c, &seed(5), 0, &gb2).unwrap()
    );
}

#[test]
fn transcript_of_received_circuit_matches_hash() {
    let c = blindbox_circuit().unwrap();
    let gb = blindbox_garbler_inputs(&[7; 16], &[8; 16]);
    let gc = garble(&c, &seed(1), 4, &gb).unwrap();
    // The middlebox hashes what it received, in whatever chunks it arrived.
    let mut h = TranscriptHasher::new(&c, 4);
    for piece in gc.tables.chunks(1000) {
        h.update_tables(piece);
    }
    let received = h.finish(&gc.garbler_label_seed, &gc.decoding);
    assert_eq!(received, hash_garbling(&c, &seed(1), 4, &gb).unwrap());
    // One flipped table bit changes it.
    let mut tampered = gc.tables.clone();
    tampered[12345] ^= 1;
    let mut h = TranscriptHasher::new(&c, 4);
    h.update_tables(&tampered);
    assert_ne!(h.finish(&gc.garbler_label_seed, &gc.decoding), received);
}

#[test]
fn streaming_garbler_equals_one_shot() {
    let c = aes128_circuit().unwrap();
    let gb = aes128_garbler_inputs(&[9; 16]);
    let whole = garble(&c, &seed(2), 0, &gb).unwrap();
    let mut g = Garbler::new(&c, &seed(2), 0, &gb).unwrap();
    let mut streamed = Vec::new();
    let mut chunk = Vec::new();
    let mut max_chunk = 0;
    loop {
        chunk.clear();
        if g.write_tables(&mut chunk, 100) == 0 {
            break;
        }
        max_chunk = max_chunk.max(chunk.len());
        streamed.extend_from_slice(&chunk);
    }
    assert_eq!(streamed, whole.tables);
    // Bounded: a chunk never exceeds the request plus one hash batch.
    assert!(max_chunk <= (100 + mbx_garble::garble::BATCH) * TABLE_BYTES_PER_AND);
    assert_eq!(g.decoding().unwrap(), whole.decoding);
}

/// Labels from another garbling (same circuit, other seed) are caught by the output check.
#[test]
fn labels_from_other_garbling_detected() {
    let c = aes128_circuit().unwrap();
    let gb = aes128_garbler_inputs(&[4; 16]);
    let r = [5u8; 16];
    let a = garble(&c, &seed(10), 0, &gb).unwrap();
    let b = garble(&c, &seed(11), 0, &gb).unwrap();
    let el_b = select_labels(&b.evaluator_pairs, &bytes_to_bits(&r));
    let el_a = select_labels(&a.evaluator_pairs, &bytes_to_bits(&r));
    // Evaluator labels from b with a's tables, garbler labels and decoding.
    let err = evaluate(&c, 0, &a.tables, &a.garbler_labels, &el_b, &a.decoding).unwrap_err();
    assert!(matches!(err, Error::OutputCheck(_)), "{err:?}");
    // Garbler labels from b.
    let err = evaluate(&c, 0, &a.tables, &b.garbler_labels, &el_a, &a.decoding).unwrap_err();
    assert!(matches!(err, Error::OutputCheck(_)), "{err:?}");
    // Right labels, wrong instance number.
    let err = evaluate(&c, 1, &a.tables, &a.garbler_labels, &el_a, &a.decoding).unwrap_err();
    assert!(matches!(err, Error::OutputCheck(_)), "{err:?}");
    // Tampered tables. The evaluator reads T_G only when lsb(A) = 1 and T_E only when lsb(B) = 1,
    // so tampering one ciphertext is caught only if it is on the evaluated path: tamper 64 gates.
    let mut t = a.tables.clone();
    for byte in &mut t[40_000..40_000 + 64 * 32] {
        *byte ^= 4;
    }
    let err = evaluate(&c, 0, &t, &a.garbler_labels, &el_a, &a.decoding).unwrap_err();
    assert!(matches!(err, Error::OutputCheck(_)), "{err:?}");
    // And the untampered run passes, so the failures above come from the check.
    assert!(evaluate(&c, 0, &a.tables, &a.garbler_labels, &el_a, &a.decoding).is_ok());
}

#[test]
fn table_length_and_decoding_errors() {
    let c = aes128_circuit().unwrap();
    let gb = aes128_garbler_inputs(&[4; 16]);
    let a = garble(&c, &seed(10), 0, &gb).unwrap();
    let el = select_labels(&a.evaluator_pairs, &bytes_to_bits(&[0; 16]));
    let short = &a.tables[..a.tables.len() - 1];
    let err = evaluate(&c, 0, short, &a.garbler_labels, &el, &a.decoding).unwrap_err();
    assert!(matches!(err, Error::MissingTables { .. }), "{err:?}");
    let mut long = a.tables.clone();
    long.push(0);
    assert_eq!(
        evaluate(&c, 0, &long, &a.garbler_labels, &el, &a.decoding).unwrap_err(),
        Error::ExtraTables
    );
    // Too few labels.
    assert!(matches!(
        Evaluator::new(&c, 0, &a.garbler_labels, &el[1..]),
        Err(Error::InputLength { .. })
    ));
    // Decoding wire form round-trips and rejects bad input.
    let bytes = a.decoding.to_bytes();
    assert_eq!(Decoding::from_bytes(&bytes, 128).unwrap(), a.decoding);
    assert_eq!(
        Decoding::from_bytes(&bytes[1..], 128),
        Err(Error::BadDecoding)
    );
    let mut bad = bytes.clone();
    bad[0] = 2;
    assert_eq!(Decoding::from_bytes(&bad, 128), Err(Error::BadDecoding));
    // A decoding with flipped bits decodes the flipped value (so the bit matters)...
    let mut flipped = bytes.clone();
    flipped[0] ^= 1;
    let d = Decoding::from_bytes(&flipped, 128).unwrap();
    let good = evaluate(&c, 0, &a.tables, &a.garbler_labels, &el, &a.decoding).unwrap();
    let out = evaluate(&c, 0, &a.tables, &a.garbler_labels, &el, &d).unwrap();
    assert_eq!(out[0], !good[0]);
    // ...while a corrupted tag is caught.
    let mut tag = bytes;
    tag[1] ^= 1;
    tag[9] ^= 1;
    let d = Decoding::from_bytes(&tag, 128).unwrap();
    assert_eq!(
        evaluate(&c, 0, &a.tables, &a.garbler_labels, &el, &d).unwrap_err(),
        Error::OutputCheck(0)
    );
}

#[test]
fn garbler_decoding_requires_completion() {
    let c = aes128_circuit().unwrap();
    let mut g = Garbler::new(&c, &seed(1), 0, &aes128_garbler_inputs(&[1; 16])).unwrap();
    let mut out = Vec::new();
    assert!(g.write_tables(&mut out, 10) > 0);
    assert_eq!(g.decoding().unwrap_err(), Error::NotFinished);
}

#[test]
fn blindbox_token_layout_garbled() {
    let c = blindbox_circuit_for(Layout::Token64).unwrap();
    assert_eq!(c.counts().and, 9_983);
    let (k, k_rg, t) = ([0x21u8; 16], [0x43u8; 16], *b"GET /adm");
    let mut r = [0u8; 16];
    r[..8].copy_from_slice(&t);
    let gc = garble(&c, &seed(8), 2, &blindbox_token_garbler_inputs(&k, &k_rg)).unwrap();
    let run = |tag: &[u8; 16]| {
        let el = select_labels(
            &gc.evaluator_pairs,
            &blindbox_token_evaluator_inputs(&t, tag),
        );
        let out = evaluate(&c, 2, &gc.tables, &gc.garbler_labels, &el, &gc.decoding).unwrap();
        block_from_bits(&out).unwrap()
    };
    assert_eq!(run(&aes_ref(&k_rg, &r)), aes_ref(&k, &r));
    assert_eq!(run(&aes_ref(&k, &r)), [0u8; 16]);
}

/// Known answer: the transcript digest of one fixed garbling of the BlindBox circuit. Two endpoints
/// compare garblings by this digest, so any change to the garbled bytes (tables, decoding, label
/// seed, or the circuit itself) must be deliberate: both endpoints must run the same version.
#[test]
fn blindbox_token_garbling_known_answer() {
    let c = blindbox_circuit_for(Layout::Token64).unwrap();
    let gb = blindbox_token_garbler_inputs(&[3; 16], &[4; 16]);
    let digest = hash_garbling(&c, &seed(7), 5, &gb).unwrap();
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(
        hex,
        "162a5fc135397bd056b0328bd7694ed68cf1203a55d21663ff7ac292d02fdfd4"
    );
}
