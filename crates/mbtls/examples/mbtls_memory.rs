//! Heap held per connection by an mbTLS middlebox, against a plain TCP relay in the same run,
//! and by an mbTLS server (sessions straight from the client, and through a middlebox).
//!
//! `cargo run --release -p mbx-mbtls --example mbtls_memory` writes
//! `docs/bench/mbtls-memory.json` and `docs/bench/mbtls-memory.png`.
//!
//! How: this binary's allocator tags every block with whether it was allocated on a thread of
//! a measured runtime, and keeps the live total of tagged bytes (a block freed on another
//! thread still leaves that total). The middlebox (`MiddleboxServer`, client side, pass-through
//! app, simulated evidence) and the baseline relay (`tokio::io::copy_bidirectional`, 32 KiB
//! buffers each way, what the relay benchmark uses) run on one measured runtime, the mbTLS
//! server (`MbtlsServer` in front of a plain TCP sink) on another; clients, the TLS server
//! behind the relays, the sink and the middlebox in front of the mbTLS server run elsewhere.
//! For each, `CONNS` sessions are opened and kept open, and the live bytes are read at five
//! points: sessions established (one 16 KB record relayed each), after 3 s idle, right after
//! 1 MiB was sent through every session, after 3 s idle again (the middlebox and the server
//! give grown buffers back after 2 s without a read, docs/mbtls.md §4.3), and after every
//! session closed.
//!
//! Since the fifteenth round the C libraries' heap counts too: OpenSSL's and AWS-LC's
//! allocations made on a measured thread are counted by `mbx_testbed::c_heap` (routed before
//! either library allocates), so OpenSSL's sessions and the record layer's AEAD keys are in the
//! totals; their share is reported on its own as well ("C heap"), and the Rust heap alone is the
//! total minus it (what the rounds before measured).

// Shared with the benchmark binary, which uses the parts this one does not.
#[path = "mbtls_bench/setup.rs"]
#[allow(dead_code)]
mod setup;
#[path = "mbtls_bench/tls_io.rs"]
#[allow(dead_code)]
mod tls_io;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use mbx_apps::{MiddleboxApp, PassThrough};
use mbx_mbtls::driver::{
    AppFactory, Limits, MbtlsClient, MbtlsServer, MbtlsServerConfig, MiddleboxServer,
    MiddleboxServerConfig, Placement,
};
use mbx_mbtls::handshake::{ClientHandshakeConfig, ClientMiddlebox, ServerMiddlebox};
use mbx_record::TlsVersion;
use serde_json::{json, Value};
use tokio::runtime::Runtime;

use mbx_testbed::bench::{med, stats};
use mbx_testbed::c_heap;
use setup::{Setup, CLIENT_SIDE};
use tls_io::{tcp_relay, tls_server, wait_for, Serve, TlsClient};

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

const CONNS: usize = 100;
const RECORD: usize = 16 * 1024;
const BULK: usize = 1 << 20;
const REPS: usize = 3;

// ---- the tagging allocator ------------------------------------------------------------------

thread_local! {
    static ON_MEASURED: Cell<bool> = const { Cell::new(false) };
}

/// Live bytes of blocks allocated on a middlebox-runtime thread.
static MEASURED_LIVE: AtomicI64 = AtomicI64::new(0);

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
        let tagged = ON_MEASURED.with(|t| t.get());
        unsafe {
            let user = base.add(h);
            user.cast::<u64>().sub(1).write(u64::from(tagged));
            if tagged {
                MEASURED_LIVE.fetch_add(layout.size() as i64, Ordering::Relaxed);
            }
            user
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let h = header(layout);
        unsafe {
            if ptr.cast::<u64>().sub(1).read() == 1 {
                MEASURED_LIVE.fetch_sub(layout.size() as i64, Ordering::Relaxed);
            }
            let outer = Layout::from_size_align_unchecked(layout.size() + h, h);
            System.dealloc(ptr.sub(h), outer);
        }
    }
}

#[global_allocator]
static ALLOCATOR: Tagging = Tagging;

/// Live bytes of blocks allocated on a measured thread: Rust's and the C libraries'.
fn live() -> i64 {
    MEASURED_LIVE.load(Ordering::SeqCst) + c_heap::live()
}

// ---- the measurement ------------------------------------------------------------------------

fn runtime(name: &str, tagged: bool) -> Res<Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name(name)
        .on_thread_start(move || ON_MEASURED.with(|t| t.set(tagged)))
        .enable_all()
        .build()?)
}

/// A plain TCP backend that counts what it reads (behind the mbTLS server).
async fn tcp_sink(count: Arc<AtomicU64>) -> Res<std::net::SocketAddr> {
    use tokio::io::AsyncReadExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            let count = count.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                while let Ok(n @ 1..) = sock.read(&mut buf).await {
                    count.fetch_add(n as u64, Ordering::SeqCst);
                }
            });
        }
    });
    Ok(addr)
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

/// Opens one session of the kind measured.
type ConnectFn = dyn Fn() -> Pin<Box<dyn Future<Output = Res<Conn>> + Send>> + Sync;
type Connect = Box<ConnectFn>;

/// mbTLS sessions to `addr` with `cfg`.
fn mbtls_to(addr: SocketAddr, cfg: ClientHandshakeConfig) -> Connect {
    Box::new(move || {
        let cfg = cfg.clone();
        Box::pin(async move {
            Ok(Conn::Mbtls(Box::new(
                MbtlsClient::connect(addr, cfg).await?,
            )))
        })
    })
}

/// Bytes per connection at each point, for one kind of middlebox: all heap, and the C
/// libraries' part of it.
fn sample(load: &Runtime, connect: &ConnectFn, sink: &AtomicU64) -> Res<([f64; 5], [f64; 5])> {
    load.block_on(async {
        sink.store(0, Ordering::SeqCst);
        let base = (settled().await, c_heap::live());
        // Live bytes (all, C) since `base`, read once the total settled.
        let at = |total: i64| (total - base.0, c_heap::live() - base.1);
        let record = vec![0x5au8; RECORD];
        let mut conns = Vec::with_capacity(CONNS);
        for _ in 0..CONNS {
            let mut c = connect().await?;
            c.send(&record).await?;
            conns.push(c);
        }
        wait_for(sink, (RECORD * CONNS) as u64).await?;
        let established = at(settled().await);
        tokio::time::sleep(Duration::from_secs(3)).await;
        let quiet = at(settled().await);
        for c in conns.iter_mut() {
            for _ in 0..BULK / RECORD {
                c.send(&record).await?;
            }
        }
        wait_for(sink, ((RECORD + BULK) * CONNS) as u64).await?;
        let bulk = at(live());
        tokio::time::sleep(Duration::from_secs(3)).await;
        let idle = at(settled().await);
        for c in conns.iter_mut() {
            if let Conn::Mbtls(m) = c {
                m.close().await?;
            }
        }
        drop(conns);
        tokio::time::sleep(Duration::from_millis(500)).await;
        let closed = at(settled().await);
        let points = [established, quiet, bulk, idle, closed];
        let per = |b: i64| b as f64 / CONNS as f64;
        Ok((points.map(|p| per(p.0)), points.map(|p| per(p.1))))
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
    c_heap::route(|| ON_MEASURED.with(|t| t.get()))?;
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
        next_hop: server.to_string().into(),
        app,
        placement: Placement::ClientSide,
        limits: Limits::default(),
        forget_legacy_after: None,
    };
    let mut mbox = mbox_rt.block_on(MiddleboxServer::bind("127.0.0.1:0", cfg.clone()))?;
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

    let mbtls = mbtls_to(mbox_addr, client_cfg.clone());
    let tls: Connect = Box::new(move || {
        let ctx = tls_ctx.clone();
        Box::pin(async move { Ok(Conn::Tls(TlsClient::connect(relay_addr, &ctx, &[]).await?)) })
    });

    // The mbTLS server on its own measured runtime, in front of a plain TCP sink; reached
    // straight from the client (no middlebox: the session stays in OpenSSL) and through a
    // client-side middlebox on the load runtime (the primary keys are exported).
    let server_rt = runtime("server-rt", true)?;
    let backend_sink = Arc::new(AtomicU64::new(0));
    let backend = load.block_on(tcp_sink(backend_sink.clone()))?;
    let refuse: mbx_mbtls::handshake::Approver = Arc::new(|_: &[Vec<u8>]| false);
    let mut mbtls_server = server_rt.block_on(MbtlsServer::bind(
        "127.0.0.1:0",
        MbtlsServerConfig {
            handshake: setup.mbtls_server(version, ServerMiddlebox::Discover(refuse), true)?,
            backend: backend.to_string(),
            limits: Limits::default(),
            backend_unavailable: None,
        },
    ))?;
    let server_addr = mbtls_server.local_addr();
    load.spawn(async move { while mbtls_server.next_report().await.is_some() {} });
    let mut front = load.block_on(MiddleboxServer::bind(
        "127.0.0.1:0",
        MiddleboxServerConfig {
            next_hop: server_addr.to_string().into(),
            ..cfg
        },
    ))?;
    let front_addr = front.local_addr();
    load.spawn(async move { while front.next_report().await.is_some() {} });
    let direct = mbtls_to(
        server_addr,
        setup.mbtls_client(version, ClientMiddlebox::Disabled, true)?,
    );
    let via = mbtls_to(front_addr, client_cfg);

    // Per kind: JSON key, and every repetition's (all heap, C heap).
    let kinds: [(&str, &ConnectFn, &AtomicU64); 4] = [
        ("mbtls_middlebox", &*mbtls, &*sink),
        ("tcp_relay", &*tls, &*sink),
        ("mbtls_server_direct", &*direct, &*backend_sink),
        ("mbtls_server_via_middlebox", &*via, &*backend_sink),
    ];
    // Warm-up: one round of each (first-use allocations of the runtime and the libraries).
    for (_, connect, sink) in &kinds {
        sample(&load, *connect, sink)?;
    }
    let mut samples: Vec<Vec<([f64; 5], [f64; 5])>> = vec![Vec::new(); kinds.len()];
    for rep in 0..REPS {
        let mut line = format!(
            "rep {}: bytes per connection ({}), all heap / C heap:",
            rep + 1,
            POINTS.join(", ")
        );
        for ((who, connect, sink), out) in kinds.iter().zip(samples.iter_mut()) {
            let (all, c) = sample(&load, *connect, sink)?;
            line += &format!(
                " | {who} {:?} / {:?}",
                all.map(|x| x.round()),
                c.map(|x| x.round())
            );
            out.push((all, c));
        }
        println!("{line}");
    }
    let column = |v: &[([f64; 5], [f64; 5])], i: usize, c: bool| {
        v.iter()
            .map(|s| if c { s.1[i] } else { s.0[i] })
            .collect::<Vec<_>>()
    };
    let by_point = |v: &[([f64; 5], [f64; 5])], c: bool| {
        POINTS
            .iter()
            .enumerate()
            .map(|(i, p)| (p.to_string(), stats(&column(v, i, c))))
            .collect::<serde_json::Map<_, _>>()
    };
    let mut report = json!({
        "machine": "2 shared cores; one runtime thread for the middlebox",
        "connections": CONNS,
        "repetitions": REPS,
        "unit": "heap bytes per connection held by the measured runtime (the middlebox's or relay's; the mbTLS server's): Rust's heap and the C libraries' (OpenSSL, AWS-LC) together; `<kind>_c_heap` is the C part",
        "points": POINTS,
    });
    for ((who, _, _), v) in kinds.iter().zip(&samples) {
        report[*who] = Value::Object(by_point(v, false));
        report[format!("{who}_c_heap")] = Value::Object(by_point(v, true));
    }
    let dir = mbx_testbed::bench::write_report("mbtls-memory", &report)?;
    plot(&report, &dir.join("mbtls-memory.png"))?;
    Ok(())
}

/// What the plot shows: JSON key, legend, colour.
const KINDS: [(&str, &str, plotters::style::RGBColor); 4] = [
    (
        "mbtls_middlebox",
        "mbTLS middlebox",
        plotters::style::colors::BLUE,
    ),
    ("tcp_relay", "plain TCP relay", plotters::style::colors::RED),
    (
        "mbtls_server_direct",
        "mbTLS server, no middlebox",
        plotters::style::colors::GREEN,
    ),
    (
        "mbtls_server_via_middlebox",
        "mbTLS server, behind a middlebox",
        plotters::style::RGBColor(160, 100, 0),
    ),
];

fn plot(report: &Value, path: &std::path::Path) -> Res<()> {
    use plotters::prelude::*;
    let median = |who: &str, p: &str| med(&report[who][p]) / 1024.0;
    let top = POINTS
        .iter()
        .flat_map(|p| KINDS.map(|(who, _, _)| median(who, p)))
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
            format!("Heap per connection, Rust and C ({CONNS} connections, TLS 1.3)"),
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
    for (k, (who, label, colour)) in KINDS.into_iter().enumerate() {
        chart
            .draw_series(POINTS.iter().enumerate().map(|(i, p)| {
                let x0 = i as f64 + 0.1 + 0.2 * k as f64;
                Rectangle::new([(x0, 0.0), (x0 + 0.18, median(who, p))], colour.filled())
            }))?
            .label(label)
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
