//! OTs per second for 2^20 label transfers in memory, one batch, single thread (base OT excluded;
//! it is measured separately).

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use mbx_ot::{OtReceiver, OtSender};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;

const N: usize = 1 << 20;

fn bench(c: &mut Criterion) {
    let mut rng = ChaCha20Rng::seed_from_u64(1);
    let pairs: Vec<([u8; 16], [u8; 16])> = (0..N).map(|_| (rng.gen(), rng.gen())).collect();
    let choices: Vec<bool> = (0..N).map(|_| rng.gen()).collect();

    let mut g = c.benchmark_group("ot");
    g.sample_size(10);
    g.bench_function("base_ot_128", |b| {
        b.iter(|| {
            let (mut receiver, setup) = OtReceiver::new(b"bench", &mut rng);
            let (_sender, reply) = OtSender::new(b"bench", &setup, &mut rng).unwrap();
            receiver.handle_base_reply(&reply).unwrap();
        })
    });

    let (mut receiver, setup) = OtReceiver::new(b"bench", &mut rng);
    let (mut sender, reply) = OtSender::new(b"bench", &setup, &mut rng).unwrap();
    receiver.handle_base_reply(&reply).unwrap();
    g.throughput(Throughput::Elements(N as u64));
    g.bench_function("labels_2^20_one_batch", |b| {
        b.iter(|| {
            let ext = receiver.extend(&choices, &mut rng).unwrap();
            let transfer = sender.handle_extend(&ext, &pairs).unwrap();
            receiver.handle_transfer(&transfer).unwrap()
        })
    });
    let batch = 1 << 16;
    g.bench_function("labels_2^20_in_2^16_batches", |b| {
        b.iter(|| {
            for (c, p) in choices.chunks(batch).zip(pairs.chunks(batch)) {
                let ext = receiver.extend(c, &mut rng).unwrap();
                let transfer = sender.handle_extend(&ext, p).unwrap();
                receiver.handle_transfer(&transfer).unwrap();
            }
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
