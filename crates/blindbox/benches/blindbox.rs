//! Criterion benchmarks for the paper's Table 2 rows, beside plaintext baselines in the same run.
//! `cargo bench -p mbx-blindbox --bench blindbox`; `examples/blindbox_bench.rs` writes the JSON and
//! the plot under docs/bench/.

#[path = "support/workload.rs"]
mod workload;

use std::time::Duration;

use aho_corasick::{AhoCorasick, MatchKind};
use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use mbx_blindbox::dpienc::TokenMsg;
use mbx_blindbox::tokenize::Tokenization;
use mbx_record::{Aead, ContentType, RecordSealer, TlsVersion, TrafficKeys};
use workload::*;

fn packets(data: &[u8]) -> Vec<&[u8]> {
    data.chunks(PACKET).collect()
}

/// Token messages per packet (a packet's tokens are those emitted while pushing it).
fn packet_msgs(data: &[u8], mode: Tokenization) -> Vec<Vec<TokenMsg>> {
    let mut s = sender(mode);
    data.chunks(PACKET)
        .map(|p| {
            let mut out = Vec::new();
            s.push(p, &mut out);
            out
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let data = corpus(1 << 21, 1);
    let pk = packets(&data);

    let mut g = c.benchmark_group("sender");
    g.throughput(Throughput::Bytes(PACKET as u64));
    g.bench_function("encrypt_packet_window", |b| {
        let mut s = sender(Tokenization::Window);
        let mut out = Vec::new();
        let mut i = 0;
        b.iter(|| {
            if i == pk.len() {
                s = sender(Tokenization::Window);
                i = 0;
            }
            s.push(pk[i], &mut out);
            i += 1;
            out.clear();
        })
    });
    g.bench_function("baseline_tls_seal_packet", |b| {
        let keys = TrafficKeys::new(Aead::Aes128Gcm, &[1; 16], &[2; 12]).unwrap();
        let mut sealer = RecordSealer::new(TlsVersion::Tls13, keys, 0);
        let mut out = Vec::new();
        let mut i = 0;
        b.iter(|| {
            sealer
                .seal(ContentType::APPLICATION_DATA, pk[i % pk.len()], &mut out)
                .unwrap();
            i += 1;
            out.clear();
        })
    });
    g.finish();

    let msgs = packet_msgs(&data, Tokenization::Window);
    let mut g = c.benchmark_group("middlebox");
    g.throughput(Throughput::Bytes(PACKET as u64));
    for n in [1usize, 3000] {
        let enc = encrypted(&rules(n), Tokenization::Window);
        g.bench_function(format!("detect_packet_{n}_rules"), |b| {
            let mut det = detector(&enc);
            let mut ev = Vec::new();
            let mut i = 0;
            b.iter(|| {
                if i == msgs.len() {
                    det = detector(&enc);
                    i = 0;
                }
                for m in &msgs[i] {
                    det.process(m, &mut ev).unwrap();
                }
                i += 1;
                ev.clear();
            })
        });
        let kw = keywords(&rules(n));
        let ac = AhoCorasick::builder()
            .match_kind(MatchKind::Standard)
            .build(&kw)
            .unwrap();
        g.bench_function(format!("baseline_aho_corasick_packet_{n}_rules"), |b| {
            let mut i = 0;
            b.iter(|| {
                let n = ac.find_overlapping_iter(pk[i % pk.len()]).count();
                i += 1;
                black_box(n)
            })
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = bench
}
criterion_main!(benches);
