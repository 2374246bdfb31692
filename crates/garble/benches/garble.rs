//! Garbling and evaluation cost of the BlindBox circuit (targets: ≤ 150 µs garbling per circuit,
//! ≤ 350 KB per circuit; paper: 1,042 µs and 599 KB). Throughput is in AND gates, so criterion's
//! `thrpt` line gives gates per second (ns per AND = 1e3 / Melem/s).

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use mbx_garble::*;

fn bench(c: &mut Criterion) {
    let bb = blindbox_circuit().unwrap_or_else(|e| panic!("{e}"));
    let aes = aes128_circuit().unwrap_or_else(|e| panic!("{e}"));
    let k = [0x11u8; 16];
    let k_rg = [0x22u8; 16];
    let r = [0x33u8; 16];
    let gb = blindbox_garbler_inputs(&k, &k_rg);
    let seed = GarbleSeed::new([7; 16]);
    eprintln!(
        "blindbox circuit: {} AND, {} XOR, {} INV, {} wires in {} label slots; tables {} bytes; decoding {} bytes",
        bb.counts().and,
        bb.counts().xor,
        bb.counts().inv,
        bb.wires(),
        bb.label_slots(),
        bb.counts().table_bytes(),
        bb.outputs().len() * garble::DECODE_ENTRY_BYTES
    );

    let mut group = c.benchmark_group("blindbox_circuit");
    group.throughput(Throughput::Elements(bb.counts().and as u64));
    // Streams the tables through a 64 KiB buffer, as a sender would.
    group.bench_function("garble", |b| {
        let mut buf = Vec::with_capacity(1 << 16);
        b.iter(|| {
            let mut g = Garbler::new(&bb, &seed, 1, &gb).unwrap_or_else(|e| panic!("{e}"));
            let labels = g.garbler_label_seed();
            let pairs = g.evaluator_input_pairs();
            let mut bytes = 0;
            loop {
                buf.clear();
                if g.write_tables(&mut buf, 2048) == 0 {
                    break;
                }
                bytes += buf.len();
                black_box(&buf);
            }
            black_box((labels, pairs, g.decoding(), bytes))
        })
    });
    group.bench_function("garble_one_shot", |b| {
        b.iter(|| black_box(garble(&bb, &seed, 1, &gb)))
    });
    let gc = garble(&bb, &seed, 1, &gb).unwrap_or_else(|e| panic!("{e}"));
    let tag = {
        use aes::cipher::{BlockEncrypt, KeyInit};
        let c = aes::Aes128::new(&k_rg.into());
        let mut blk = r.into();
        c.encrypt_block(&mut blk);
        let t: [u8; 16] = blk.into();
        t
    };
    let el: Vec<Label> = gc
        .evaluator_pairs
        .iter()
        .zip(blindbox_evaluator_inputs(&r, &tag).iter())
        .map(|(p, &bit)| p.select(bit))
        .collect();
    group.bench_function("evaluate", |b| {
        b.iter(|| {
            let mut e =
                Evaluator::new(&bb, 1, &gc.garbler_labels, &el).unwrap_or_else(|e| panic!("{e}"));
            for chunk in gc.tables.chunks(1 << 16) {
                e.feed(chunk).unwrap_or_else(|e| panic!("{e}"));
            }
            black_box(e.finish(&gc.decoding))
        })
    });
    group.bench_function("hash_garbling", |b| {
        b.iter(|| black_box(hash_garbling(&bb, &seed, 1, &gb)))
    });
    group.finish();

    // The raw fixed-key AES calls one garbling needs (4 per AND gate), in batches of 256, with the
    // `aes` crate (AES-NI, one block per instruction): the floor of the portable path. On CPUs with
    // VAES the garbler's own kernel runs them about twice as fast (see `docs/garbling.md`).
    let mut group = c.benchmark_group("floor");
    group.throughput(Throughput::Elements(bb.counts().and as u64));
    group.bench_function("aes_4_blocks_per_and", |b| {
        use aes::cipher::{BlockEncrypt, KeyInit};
        let pi = aes::Aes128::new(&[0u8; 16].into());
        let mut blocks = vec![aes::Block::default(); 256];
        let n = bb.counts().and * 4 / 256;
        b.iter(|| {
            for _ in 0..n {
                pi.encrypt_blocks(&mut blocks);
            }
            black_box(&blocks);
        })
    });
    let tables = vec![0x5au8; bb.counts().table_bytes()];
    group.bench_function("sha256_sha2_tables", |b| {
        use sha2::Digest;
        b.iter(|| black_box(sha2::Sha256::digest(&tables)))
    });
    group.finish();

    let tok = blindbox_circuit_for(Layout::Token64).unwrap_or_else(|e| panic!("{e}"));
    let gt = blindbox_token_garbler_inputs(&k, &k_rg);
    let mut group = c.benchmark_group("blindbox_token_circuit");
    group.throughput(Throughput::Elements(tok.counts().and as u64));
    group.bench_function("garble", |b| {
        b.iter(|| black_box(garble(&tok, &seed, 1, &gt)))
    });
    group.finish();

    let mut group = c.benchmark_group("aes128_circuit");
    group.throughput(Throughput::Elements(aes.counts().and as u64));
    let ga = aes128_garbler_inputs(&k);
    group.bench_function("garble", |b| {
        b.iter(|| black_box(garble(&aes, &seed, 1, &ga)))
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
