//! Heap held by an mbTLS middlebox per connection, against a plain TCP relay in the same run.
//!
//! `cargo run --release -p mbx-mbtls --example mbtls_memory` writes
//! `docs/bench/mbtls-memory.json` and `docs/bench/mbtls-memory.png`.
//!
//! How: this binary's allocator tags every block with whether it was allocated on a thread of
//! the middlebox's runtime, and keeps the live total of tagged bytes (a block freed on another
//! thread still leaves that total). The middlebox (`MiddleboxServer`, client side, pass-through
//! app, simulated evidence) and the baseline relay (`tokio::io::copy_bidirectional`, 32 KiB
//! buffers each way, what the relay benchmark uses) run on that runtime; clients and the TLS
//! server behind them run elsewhere. For each, `CONNS` sessions are opened and kept open, and
//! the live bytes are read at five points: sessions established (one 16 KB record relayed each),
//! after 3 s idle, right after 1 MiB was sent through every session, after 3 s idle again (the
//! middlebox gives grown buffers back after 2 s without a read, docs/mbtls.md §7), and after
//! every session closed.

// Shared with the benchmark binary, which uses the parts this one does not.
#[path = "mbtls_bench/setup.rs"]
#[allow(dead_code)]
mod setup;
#[path = "mbtls_bench/tls_io.rs"]
#[allow(dead_code)]
mod tls_io;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use mbx_apps::{MiddleboxApp, PassThrough};
use mbx_mbtls::driver::{
    AppFactory, MbtlsClient, MiddleboxServer, MiddleboxServerConfig, Placement,
};
use mbx_mbtls::handshake::ClientMiddlebox;
use mbx_record::TlsVersion;
use serde_json::{json, Value};
use tokio::runtime::Runtime;

use mbx_testbed::bench::{med, stats};
use setup::{Setup, CLIENT_SIDE};
use tls_io::{tcp_relay, tls_server, wait_for, Serve, TlsClient};

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

const CONNS: usize = 100;
const RECORD: usize = 16 * 1024;
const BULK: usize = 1 << 20;
const REPS: usize = 3;

// ---- the tagging allocator ------------------------------------------------------------------

thread_local! {
    static ON_MIDDLEBOX: Cell<bool> = const { Cell::new(false) };
}

/// Live bytes of blocks allocated on a middlebox-runtime thread.
static MIDDLEBOX_LIVE: AtomicI64 = AtomicI64::new(0);

/// Every block gets a header of `max(align, 16)` bytes in front; its last 8 bytes say whether
/// the block counts.
struct Tagging;

fn header(layout: Layout) -> usize {
    layout.align().max(16)
}

// SAFETY: blocks come from the system allocator with room for the header in front and at
// least the caller's alignment; `dealloc` recomputes the same header size from the same
// layout, so it frees exactly what `alloc` got, and reads only the tag it wrote.
unsafe impl GlobalAlloc for Tagging {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let h = header(layout);
        let Ok(outer) = Layout::from_size_align(layout.size() + h, h) else {
            return std::ptr::null_mut();
        };
        let base = unsafe { System.alloc(outer) };
        if base.is_null() {
            return base;
        }
        let tagged = ON_MIDDLEBOX.with(|t| t.get());
        unsafe {
            let user = base.add(h);
            user.cast::<u64>().sub(1).write(u64::from(tagged));
            if tagged {
                MIDDLEBOX_LIVE.fetch_add(layout.size() as i64, Ordering::Relaxed);
            }
            user
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let h = header(layout);
        unsafe {
            if ptr.cast::<u64>().sub(1).read() == 1 {
                MIDDLEBOX_LIVE.fetch_sub(layout.size() as i64, Ordering::Relaxed);
            }
            let outer = Layout::from_size_align_unchecked(layout.size() + h, h);
            System.dealloc(ptr.sub(h), outer);
        }
    }
}

#[global_allocator]
static ALLOCATOR: Tagging = Tagging;

fn live() -> i64 {
    MIDDLEBOX_LIVE.load(Ordering::SeqCst)
}

// ---- the measurement ------------------------------------------------------------------------

fn runtime(name: &str, tagged: bool) -> Res<Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name(name)
        .on_thread_start(move || ON_MIDDLEBOX.with(|t| t.set(tagged)))
        .enable_all()
        .build()?)
}

/// Waits until the tagged total stops moving (tasks finishing after a close).
async fn settled() -> i64 {
    let mut last = live();
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = live();
        if now == last {
            return now;
        }
        last = now;
    }
    last
}

/// Either kind of client.
enum Conn {
    Mbtls(Box<MbtlsClient>),
    Tls(TlsClient),
}

impl Conn {
    async fn send(&mut self, data: &[u8]) -> Res<()> {
        match self {
            Conn::Mbtls(c) => c.write_all(data).await?,
            Conn::Tls(c) => c.write_all(data).await?,
        }
        Ok(())
    }
}

/// Bytes per connection at each point, for one kind of middlebox.
fn sample(
    load: &Runtime,
    connect: &(dyn Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = Res<Conn>> + Send>>
          + Sync),
    sink: &AtomicU64,
) -> Res<[f64; 5]> {
    load.block_on(async {
        sink.store(0, Ordering::SeqCst);
        let base = settled().await;
        let record = vec![0x5au8; RECORD];
        let mut conns = Vec::with_capacity(CONNS);
        for _ in 0..CONNS {
            let mut c = connect().await?;
            c.send(&record).await?;
            conns.push(c);
        }
        wait_for(sink, (RECORD * CONNS) as u64).await?;
        let established = settled().await - base;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let quiet = settled().await - base;
        for c in conns.iter_mut() {
            for _ in 0..BULK / RECORD {
                c.send(&record).await?;
            }
        }
        wait_for(sink, ((RECORD + BULK) * CONNS) as u64).await?;
        let bulk = live() - base;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let idle = settled().await - base;
        for c in conns.iter_mut() {
            if let Conn::Mbtls(m) = c {
                m.close().await?;
            }
        }
        drop(conns);
        tokio::time::sleep(Duration::from_millis(500)).await;
        let closed = settled().await - base;
        let per = |b: i64| b as f64 / CONNS as f64;
        Ok([
            per(established),
            per(quiet),
            per(bulk),
            per(idle),
            per(closed),
        ])
    })
}

const POINTS: [&str; 5] = [
    "established",
    "then 3 s idle",
    "after 1 MiB each",
    "after 3 s idle",
    "after close",
];

fn main() -> Res<()> {
    let setup = Setup::new(mbx_testbed::pki::KeyType::EcdsaP256)?;
    let version = TlsVersion::Tls13;
    let load = runtime("load", false)?;
    let mbox_rt = runtime("mbox-rt", true)?;
    let sink = Arc::new(AtomicU64::new(0));
    let server = load.block_on(tls_server(
        setup.tls_server(version)?,
        Serve::Sink(sink.clone()),
    ))?;
    let app: AppFactory = Arc::new(|| Box::new(PassThrough) as Box<dyn MiddleboxApp + Send>);
    let cfg = MiddleboxServerConfig {
        handshake: setup.middlebox(CLIENT_SIDE[0], true)?,
        next_hop: server.to_string(),
        app,
        placement: Placement::ClientSide,
        handshake_timeout: mbx_mbtls::driver::DEFAULT_HANDSHAKE_TIMEOUT,
    };
    let mut mbox = mbox_rt.block_on(MiddleboxServer::bind("127.0.0.1:0", cfg))?;
    let mbox_addr = mbox.local_addr();
    // Reports are read as they come, as the CLI does.
    load.spawn(async move { while mbox.next_report().await.is_some() {} });
    let relay_addr = mbox_rt.block_on(tcp_relay(server))?;
    let client_cfg = setup.mbtls_client(
        version,
        ClientMiddlebox::Preconfigured(CLIENT_SIDE[0].into()),
        true,
    )?;
    let tls_ctx = setup.tls_client(version)?;

    let mbtls =
        move || -> std::pin::Pin<Box<dyn std::future::Future<Output = Res<Conn>> + Send>> {
            let cfg = client_cfg.clone();
            Box::pin(async move {
                Ok(Conn::Mbtls(Box::new(
                    MbtlsClient::connect(mbox_addr, cfg).await?,
                )))
            })
        };
    let tls = move || -> std::pin::Pin<Box<dyn std::future::Future<Output = Res<Conn>> + Send>> {
        let ctx = tls_ctx.clone();
        Box::pin(async move { Ok(Conn::Tls(TlsClient::connect(relay_addr, &ctx, &[]).await?)) })
    };

    // Warm-up: one round of each (first-use allocations of the runtime and the libraries).
    sample(&load, &mbtls, &sink)?;
    sample(&load, &tls, &sink)?;
    let mut mb: Vec<[f64; 5]> = Vec::new();
    let mut relay: Vec<[f64; 5]> = Vec::new();
    for rep in 0..REPS {
        let m = sample(&load, &mbtls, &sink)?;
        let r = sample(&load, &tls, &sink)?;
        println!(
            "rep {}: bytes per connection, mbTLS middlebox {:?} | TCP relay {:?} ({})",
            rep + 1,
            m.map(|x| x.round()),
            r.map(|x| x.round()),
            POINTS.join(", ")
        );
        mb.push(m);
        relay.push(r);
    }
    let column = |v: &[[f64; 5]], i: usize| v.iter().map(|s| s[i]).collect::<Vec<_>>();
    let report = json!({
        "machine": "2 shared cores; one runtime thread for the middlebox",
        "connections": CONNS,
        "repetitions": REPS,
        "unit": "heap bytes per connection held by the middlebox's runtime",
        "points": POINTS,
        "mbtls_middlebox": POINTS.iter().enumerate().map(|(i, p)| (p.to_string(), stats(&column(&mb, i)))).collect::<serde_json::Map<_, _>>(),
        "tcp_relay": POINTS.iter().enumerate().map(|(i, p)| (p.to_string(), stats(&column(&relay, i)))).collect::<serde_json::Map<_, _>>(),
    });
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/bench");
    std::fs::write(
        dir.join("mbtls-memory.json"),
        serde_json::to_string_pretty(&report)? + "\n",
    )?;
    plot(&report, &dir.join("mbtls-memory.png"))?;
    Ok(())
}

fn plot(report: &Value, path: &std::path::Path) -> Res<()> {
    use plotters::prelude::*;
    let median = |who: &str, p: &str| med(&report[who][p]) / 1024.0;
    let top = POINTS
        .iter()
        .flat_map(|p| [median("mbtls_middlebox", p), median("tcp_relay", p)])
        .fold(1.0f64, f64::max)
        * 1.15;
    let root = BitMapBackend::new(path, (1000, 520)).into_drawing_area();
    root.fill(&WHITE)?;
    if let Some(font) = mbx_testbed::bench::sans_font() {
        plotters::style::register_font("sans-serif", FontStyle::Normal, font)
            .map_err(|_| "font")?;
    }
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("Heap per middlebox connection ({CONNS} connections, TLS 1.3)"),
            ("sans-serif", 22),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..(POINTS.len() as f64), 0f64..top)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .y_labels(10)
        .y_desc("KiB per connection (median)")
        .draw()?;
    // Each group's name above it (the axis cannot label bands).
    chart.draw_series(POINTS.iter().enumerate().map(|(i, p)| {
        Text::new(
            p.to_string(),
            (i as f64 + 0.15, top * 0.97),
            ("sans-serif", 16).into_font(),
        )
    }))?;
    for (k, (who, colour)) in [("mbtls_middlebox", BLUE), ("tcp_relay", RED)]
        .into_iter()
        .enumerate()
    {
        chart
            .draw_series(POINTS.iter().enumerate().map(|(i, p)| {
                let x0 = i as f64 + 0.15 + 0.35 * k as f64;
                Rectangle::new([(x0, 0.0), (x0 + 0.3, median(who, p))], colour.filled())
            }))?
            .label(if k == 0 {
                "mbTLS middlebox"
            } else {
                "plain TCP relay"
            })
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], colour.filled()));
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE)
        .draw()?;
    root.present()?;
    Ok(())
}
