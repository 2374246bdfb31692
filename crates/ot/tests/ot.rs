//! Behaviour of the OT: correctness, what each side learns, malformed input, scale.

use mbx_ot::{peek_extend, OtError, OtReceiver, OtSender, MAX_BATCH, PAD_ROWS};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;

type Pair = ([u8; 16], [u8; 16]);

fn rng(seed: u64) -> ChaCha20Rng {
    ChaCha20Rng::seed_from_u64(seed)
}

/// A session with the base OT done.
fn session(seed: u64) -> (OtReceiver, OtSender, ChaCha20Rng) {
    let mut r = rng(seed);
    let (mut receiver, setup) = OtReceiver::new(b"test session", &mut r);
    let (sender, reply) = OtSender::new(b"test session", &setup, &mut r).unwrap();
    receiver.handle_base_reply(&reply).unwrap();
    (receiver, sender, r)
}

fn random_pairs(r: &mut ChaCha20Rng, n: usize) -> Vec<Pair> {
    (0..n).map(|_| (r.gen(), r.gen())).collect()
}

fn random_choices(r: &mut ChaCha20Rng, n: usize) -> Vec<bool> {
    (0..n).map(|_| r.gen()).collect()
}

fn xor(a: &[u8], b: &[u8]) -> [u8; 16] {
    let mut out = [0u8; 16];
    for (o, (x, y)) in out.iter_mut().zip(a.iter().zip(b)) {
        *o = x ^ y;
    }
    out
}

/// The two masked messages of OT `j` in a transfer message.
fn ciphertexts(transfer: &[u8], j: usize) -> (&[u8], &[u8]) {
    let at = 13 + 32 * j;
    (&transfer[at..at + 16], &transfer[at + 16..at + 32])
}

#[test]
fn receiver_gets_exactly_the_chosen_messages() {
    let (mut receiver, mut sender, mut r) = session(1);
    for n in [1usize, 5, 127, 128, 129, 1000, 3000] {
        let pairs = random_pairs(&mut r, n);
        let choices = random_choices(&mut r, n);
        let ext = receiver.extend(&choices, &mut r).unwrap();
        assert_eq!(peek_extend(&ext).unwrap().1, n);
        let transfer = sender.handle_extend(&ext, &pairs).unwrap();
        let labels = receiver.handle_transfer(&transfer).unwrap();
        assert_eq!(labels.len(), n);
        for j in 0..n {
            let (m0, m1) = pairs[j];
            let (chosen, other) = if choices[j] { (m1, m0) } else { (m0, m1) };
            assert_eq!(labels[j], chosen, "n={n} j={j}");
            // The receiver's key is y_c ⊕ m_c; it does not open the other ciphertext.
            let (y0, y1) = ciphertexts(&transfer, j);
            let (yc, yo) = if choices[j] { (y1, y0) } else { (y0, y1) };
            let key = xor(yc, &chosen);
            assert_ne!(xor(yo, &key), other, "n={n} j={j}");
            // Neither ciphertext is the plain message.
            assert_ne!(yo, &other[..]);
        }
    }
}

#[test]
fn both_endpoints_give_the_same_labels_for_the_same_pairs() {
    // The middlebox runs one session per endpoint; with identical pairs the labels compare equal.
    let mut r = rng(2);
    let pairs = random_pairs(&mut r, 512);
    let choices = random_choices(&mut r, 512);
    let mut got = Vec::new();
    for seed in [20u64, 21] {
        let (mut receiver, mut sender, mut r) = session(seed);
        let ext = receiver.extend(&choices, &mut r).unwrap();
        let transfer = sender.handle_extend(&ext, &pairs).unwrap();
        got.push(receiver.handle_transfer(&transfer).unwrap());
    }
    assert_eq!(*got[0], *got[1]);
}

#[test]
fn pipelined_batches_are_decoded_in_order() {
    let (mut receiver, mut sender, mut r) = session(3);
    let batches: Vec<(Vec<Pair>, Vec<bool>)> = (0..4)
        .map(|i| {
            (
                random_pairs(&mut r, 200 + i),
                random_choices(&mut r, 200 + i),
            )
        })
        .collect();
    let exts: Vec<Vec<u8>> = batches
        .iter()
        .map(|(_, c)| receiver.extend(c, &mut r).unwrap())
        .collect();
    assert_eq!(receiver.pending_batches(), 4);
    let transfers: Vec<Vec<u8>> = exts
        .iter()
        .zip(&batches)
        .map(|(e, (p, _))| sender.handle_extend(e, p).unwrap())
        .collect();
    // A later batch's transfer before an earlier one is refused and changes nothing.
    assert_eq!(
        receiver.handle_transfer(&transfers[1]).unwrap_err(),
        OtError::OutOfOrder {
            expected: 0,
            got: 1
        }
    );
    for (t, (pairs, choices)) in transfers.iter().zip(&batches) {
        let labels = receiver.handle_transfer(t).unwrap();
        for ((l, (m0, m1)), c) in labels.iter().zip(pairs).zip(choices) {
            assert_eq!(l, if *c { m1 } else { m0 });
        }
    }
    assert_eq!(receiver.pending_batches(), 0);
    assert_eq!(
        receiver.handle_transfer(&transfers[0]).unwrap_err(),
        OtError::NoPendingBatch
    );
}

#[test]
fn sender_rejects_out_of_order_and_replayed_batches() {
    let (mut receiver, mut sender, mut r) = session(4);
    let c = random_choices(&mut r, 10);
    let p = random_pairs(&mut r, 10);
    let e0 = receiver.extend(&c, &mut r).unwrap();
    let e1 = receiver.extend(&c, &mut r).unwrap();
    assert_eq!(
        sender.handle_extend(&e1, &p).unwrap_err(),
        OtError::OutOfOrder {
            expected: 0,
            got: 1
        }
    );
    sender.handle_extend(&e0, &p).unwrap();
    assert_eq!(
        sender.handle_extend(&e0, &p).unwrap_err(),
        OtError::OutOfOrder {
            expected: 1,
            got: 0
        }
    );
    sender.handle_extend(&e1, &p).unwrap();
}

#[test]
fn inconsistent_extension_fails_the_check_and_aborts_the_session() {
    // Flipping one bit of `u` is exactly a receiver using a different choice bit in one column,
    // the attack that leaks a bit of Δ in plain IKNP.
    let mut r = rng(5);
    let pairs = random_pairs(&mut r, 300);
    let choices = random_choices(&mut r, 300);
    let prefix = 45;
    for (pos, what) in [
        (prefix + 3, "u first column"),
        (prefix + 16 * 5 * 40 + 7, "u middle column"),
        (13, "check value s"),
        (29 + 15, "check value t"),
    ] {
        let (mut receiver, mut sender, mut r) = session(50);
        let mut ext = receiver.extend(&choices, &mut r).unwrap();
        ext[pos] ^= 0x10;
        assert_eq!(
            sender.handle_extend(&ext, &pairs).unwrap_err(),
            OtError::ConsistencyCheck,
            "{what}"
        );
        // No retry: even an honest batch is refused now.
        let good = receiver.extend(&choices, &mut r).unwrap();
        assert_eq!(
            sender.handle_extend(&good, &pairs).unwrap_err(),
            OtError::Aborted
        );
    }
}

#[test]
fn mismatched_session_ids_fail_the_check() {
    let mut r = rng(6);
    let (mut receiver, setup) = OtReceiver::new(b"session A", &mut r);
    let (mut sender, reply) = OtSender::new(b"session B", &setup, &mut r).unwrap();
    receiver.handle_base_reply(&reply).unwrap();
    let ext = receiver.extend(&[true, false, true], &mut r).unwrap();
    let pairs = random_pairs(&mut r, 3);
    assert_eq!(
        sender.handle_extend(&ext, &pairs).unwrap_err(),
        OtError::ConsistencyCheck
    );
}

/// Bits of a byte string that are 1.
fn ones(bytes: &[u8]) -> u64 {
    bytes.iter().map(|b| u64::from(b.count_ones())).sum()
}

/// Pearson chi-square of byte-value counts against uniform.
fn chi_square_uniform(bytes: &[u8]) -> f64 {
    let mut counts = [0u64; 256];
    for &b in bytes {
        counts[b as usize] += 1;
    }
    let e = bytes.len() as f64 / 256.0;
    counts.iter().map(|&c| (c as f64 - e).powi(2) / e).sum()
}

#[test]
fn senders_view_does_not_reveal_choices() {
    // Everything the sender receives after the base OT is the extension message. For all-zero,
    // all-one and random choices (fixed seeds: deterministic), its payload is balanced, its byte
    // histogram is uniform, and no column bit agrees with the choice bit more than chance.
    let n = 8192;
    let mut r = rng(7);
    let random = random_choices(&mut r, n);
    let inputs: [(&str, Vec<bool>); 3] = [
        ("zeros", vec![false; n]),
        ("ones", vec![true; n]),
        ("random", random),
    ];
    let mut histograms = Vec::new();
    for (name, choices) in &inputs {
        let (mut receiver, _sender, mut r) = session(70);
        let ext = receiver.extend(choices, &mut r).unwrap();
        let payload = &ext[13..]; // s, t and u
        let bits = payload.len() as f64 * 8.0;
        let frac = ones(payload) as f64 / bits;
        let sigma = 0.5 / bits.sqrt();
        assert!(
            (frac - 0.5).abs() < 5.0 * sigma,
            "{name}: ones fraction {frac}"
        );
        // 255 degrees of freedom: mean 255, sd ≈ 22.6; 6 sd bound.
        let chi = chi_square_uniform(payload);
        assert!(chi < 255.0 + 6.0 * 22.6, "{name}: chi-square {chi}");

        // Agreement of each u column's bit j with choice j.
        let u = &ext[45..];
        let col_bytes = u.len() / 128;
        let mut agree = 0u64;
        for col in u.chunks_exact(col_bytes) {
            for (j, &c) in choices.iter().enumerate() {
                let bit = (col[j / 8] >> (j % 8)) & 1 == 1;
                agree += u64::from(bit == c);
            }
        }
        let total = (128 * n) as f64;
        let frac = agree as f64 / total;
        assert!(
            (frac - 0.5).abs() < 5.0 * 0.5 / total.sqrt(),
            "{name}: agreement {frac}"
        );
        let mut h = [0u64; 256];
        for &b in u {
            h[b as usize] += 1;
        }
        histograms.push(h);
    }
    // Two-sample chi-square between the all-zero and all-one views' byte histograms.
    let (a, b) = (&histograms[0], &histograms[1]);
    let chi: f64 = a
        .iter()
        .zip(b)
        .filter(|(x, y)| **x + **y > 0)
        .map(|(&x, &y)| (x as f64 - y as f64).powi(2) / (x + y) as f64)
        .sum();
    assert!(chi < 255.0 + 6.0 * 22.6, "zeros vs ones chi-square {chi}");
}

#[test]
fn check_value_is_masked_by_the_padding_rows() {
    // `s = Σ r_j·χ_j` would be 0 for all-zero choices (telling the sender so) without the rows
    // of random choices added to every batch.
    let (mut receiver, _sender, mut r) = session(12);
    let zeros = vec![false; 1000];
    let a = receiver.extend(&zeros, &mut r).unwrap();
    let b = receiver.extend(&zeros, &mut r).unwrap();
    assert_ne!(&a[13..29], &[0u8; 16][..]);
    assert_ne!(&a[13..29], &b[13..29]);
    let bits = ones(&a[13..29]) + ones(&b[13..29]);
    assert!((80..=176).contains(&bits), "{bits} of 256 bits set");
}

#[test]
fn truncated_messages_are_errors() {
    let mut r = rng(8);
    let (mut receiver, setup) = OtReceiver::new(b"t", &mut r);
    for len in 0..setup.len() {
        assert!(
            OtSender::new(b"t", &setup[..len], &mut r).is_err(),
            "setup len {len}"
        );
    }
    let (mut sender, reply) = OtSender::new(b"t", &setup, &mut r).unwrap();
    for len in (0..reply.len()).step_by(61).chain([reply.len() - 1]) {
        assert_eq!(
            receiver.handle_base_reply(&reply[..len]).unwrap_err(),
            OtError::Truncated
        );
    }
    receiver.handle_base_reply(&reply).unwrap();
    assert_eq!(
        receiver.handle_base_reply(&reply).unwrap_err(),
        OtError::BaseOtDone
    );

    let pairs = random_pairs(&mut r, 100);
    let choices = random_choices(&mut r, 100);
    let ext = receiver.extend(&choices, &mut r).unwrap();
    for len in (0..ext.len()).step_by(97).chain([ext.len() - 1]) {
        let err = sender.handle_extend(&ext[..len], &pairs).unwrap_err();
        assert!(matches!(err, OtError::Truncated), "ext len {len}: {err:?}");
    }
    // Truncated input did not disturb the sender: the full message still works.
    let transfer = sender.handle_extend(&ext, &pairs).unwrap();
    for len in (0..transfer.len()).step_by(89).chain([transfer.len() - 1]) {
        let err = receiver.handle_transfer(&transfer[..len]).unwrap_err();
        assert!(
            matches!(err, OtError::Truncated),
            "transfer len {len}: {err:?}"
        );
    }
    let labels = receiver.handle_transfer(&transfer).unwrap();
    assert_eq!(labels[0], if choices[0] { pairs[0].1 } else { pairs[0].0 });
}

#[test]
fn malformed_messages_are_errors() {
    let mut r = rng(9);
    let (mut receiver, setup) = OtReceiver::new(b"m", &mut r);

    // Wrong type byte, trailing bytes, bad points.
    let mut bad = setup.clone();
    bad[0] = 0x02;
    assert_eq!(
        OtSender::new(b"m", &bad, &mut r).unwrap_err(),
        OtError::UnexpectedType {
            got: 2,
            expected: 1
        }
    );
    let mut long = setup.clone();
    long.push(0);
    assert_eq!(
        OtSender::new(b"m", &long, &mut r).unwrap_err(),
        OtError::Trailing(1)
    );
    let mut identity = setup.clone();
    identity[1..].fill(0);
    assert_eq!(
        OtSender::new(b"m", &identity, &mut r).unwrap_err(),
        OtError::InvalidPoint
    );
    let mut noncanonical = setup.clone();
    noncanonical[1..].fill(0xff);
    assert_eq!(
        OtSender::new(b"m", &noncanonical, &mut r).unwrap_err(),
        OtError::InvalidPoint
    );

    let (mut sender, reply) = OtSender::new(b"m", &setup, &mut r).unwrap();
    let mut bad_reply = reply.clone();
    bad_reply[1 + 64 * 7 + 32..1 + 64 * 8].fill(0xff);
    assert_eq!(
        receiver.handle_base_reply(&bad_reply).unwrap_err(),
        OtError::InvalidPoint
    );
    assert_eq!(
        receiver.extend(&[true], &mut r).unwrap_err(),
        OtError::BaseOtPending,
        "failed base reply must leave the receiver waiting"
    );
    receiver.handle_base_reply(&reply).unwrap();

    // Batch sizes.
    assert_eq!(
        receiver.extend(&[], &mut r).unwrap_err(),
        OtError::BatchSize(0)
    );
    let ext = receiver.extend(&[true, false], &mut r).unwrap();
    let mut zero = ext.clone();
    zero[9..13].copy_from_slice(&0u32.to_le_bytes());
    assert_eq!(
        sender.handle_extend(&zero, &[]).unwrap_err(),
        OtError::BatchSize(0)
    );
    let mut huge = ext.clone();
    huge[9..13].copy_from_slice(&(MAX_BATCH as u32 + 1).to_le_bytes());
    assert_eq!(
        peek_extend(&huge).unwrap_err(),
        OtError::BatchSize(MAX_BATCH + 1)
    );
    let pairs3 = random_pairs(&mut r, 3);
    let pairs = random_pairs(&mut r, 2);
    assert_eq!(
        sender.handle_extend(&ext, &pairs3).unwrap_err(),
        OtError::CountMismatch {
            expected: 2,
            got: 3
        }
    );
    let mut trailing = ext.clone();
    trailing.push(7);
    assert_eq!(
        sender.handle_extend(&trailing, &pairs).unwrap_err(),
        OtError::Trailing(1)
    );
    let transfer = sender.handle_extend(&ext, &pairs).unwrap();

    // A count raised within the same padded size keeps the length valid, but the check binds
    // the count (it is hashed into the challenge), so nothing is released.
    let mut bigger = receiver.extend(&[false, true], &mut r).unwrap();
    bigger[9..13].copy_from_slice(&3u32.to_le_bytes());
    assert_eq!(
        sender.handle_extend(&bigger, &pairs3).unwrap_err(),
        OtError::ConsistencyCheck
    );

    // Transfer with a wrong count or type.
    let mut wrong_count = transfer.clone();
    wrong_count[9..13].copy_from_slice(&1u32.to_le_bytes());
    assert_eq!(
        receiver.handle_transfer(&wrong_count).unwrap_err(),
        OtError::CountMismatch {
            expected: 2,
            got: 1
        }
    );
    assert!(matches!(
        receiver.handle_transfer(&ext).unwrap_err(),
        OtError::UnexpectedType {
            got: 3,
            expected: 4
        }
    ));
    receiver.handle_transfer(&transfer).unwrap();
}

#[test]
fn extension_message_size_is_sixteen_bytes_per_ot_plus_padding() {
    let (mut receiver, mut sender, mut r) = session(10);
    let n = 1000;
    let ext = receiver.extend(&random_choices(&mut r, n), &mut r).unwrap();
    let rows = n.div_ceil(128) * 128 + PAD_ROWS;
    assert_eq!(ext.len(), 45 + 16 * rows);
    let transfer = sender
        .handle_extend(&ext, &random_pairs(&mut r, n))
        .unwrap();
    assert_eq!(transfer.len(), 13 + 32 * n);
}

#[test]
fn a_million_ots_in_one_batch() {
    let (mut receiver, mut sender, mut r) = session(11);
    let n = 1 << 20;
    let pairs = random_pairs(&mut r, n);
    let choices = random_choices(&mut r, n);
    let ext = receiver.extend(&choices, &mut r).unwrap();
    let transfer = sender.handle_extend(&ext, &pairs).unwrap();
    let labels = receiver.handle_transfer(&transfer).unwrap();
    assert_eq!(labels.len(), n);
    let wrong = labels
        .iter()
        .zip(&pairs)
        .zip(&choices)
        .filter(|((l, (m0, m1)), c)| *l != if **c { m1 } else { m0 })
        .count();
    assert_eq!(wrong, 0);
}
