//! `mbx blindbox`: rules (Table 1 statistics, RG key generation, signing, audit), the three
//! network parties (sender, receiver, middlebox) and a loopback demo.
//!
//! The middlebox obtains `AES_k(r)` for the rule chunks only through the garbled-circuit setup
//! it runs with both endpoints over the hop connections (`mbx-blindbox-net`), for the chunks of
//! a tagged-rules file the rule generator signed. There is no other path.
//!
//! Options of the parties come from `[blindbox.sender]` / `[blindbox.receiver]` /
//! `[blindbox.middlebox]` of the config file; flags override them. Walk-through: docs/blindbox.md
//! ("Running BlindBox").

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{ensure, Context};
use mbx_blindbox::flow::{Culprit, FlowConfig, MbEvent, Misbehaviour};
use mbx_blindbox::rules::{parse_rules, table1_report, BufferPolicy};
use mbx_blindbox::tokenize::Tokenization;
use mbx_blindbox_net::control::Params;
use mbx_blindbox_net::driver::{
    serve_middlebox, BlindBoxStream, DriverError, EventSink, SetupStats,
};
use mbx_blindbox_net::middlebox::{Flow, MiddleboxEvent};
use mbx_blindbox_net::{NetError, Policy, RuleBook, SetupConfig};
use mbx_blindbox_setup::{EndpointConfig, MiddleboxConfig, RgKey, TaggedRules};
use mbx_engine::TlsConfig;
use mbx_record::TlsVersion;

use crate::subcommand::{parse_version, path_str, print_line, runtime, set};
use mbx_engine::pem_file::read_file;
use mbx_net::Acceptor;
use serde::Deserialize;
use tokio::net::TcpListener;

/// Salt reset period P (bytes of stream); both endpoints must use the same.
pub const PERIOD: u64 = 64 * 1024;

#[derive(clap::Args, Debug)]
pub struct BlindboxArgs {
    #[command(subcommand)]
    command: BlindboxCommand,
}

#[derive(clap::Subcommand, Debug)]
enum BlindboxCommand {
    /// Snort rule files: Table 1 statistics, and the rule generator's key and signed rules.
    Rules {
        #[command(subcommand)]
        command: RulesCommand,
    },
    /// Connect through a BlindBox middlebox to a receiver and send a file, stdin or an HTTP
    /// request; print the receiver's answer on stdout (status on stderr).
    /// Options: `[blindbox.sender]` of the config file, overridden by these flags.
    Sender(SenderFlags),
    /// Accept connections from a BlindBox middlebox, check every received byte against its
    /// tokens, write what arrived and answer.
    /// Options: `[blindbox.receiver]` of the config file, overridden by these flags.
    Receiver(ReceiverFlags),
    /// Run a BlindBox middlebox: for each connection, run the rule setup with both endpoints,
    /// then forward while detecting rule keywords in the encrypted tokens; print alerts.
    /// Options: `[blindbox.middlebox]` of the config file, overridden by these flags.
    Middlebox(MiddleboxFlags),
    /// Rule generator, middlebox, sender and receiver on loopback: signs a few community-style
    /// rules, runs the setup, sends attacks and clean traffic, shows alerts and a blocked
    /// connection.
    Demo,
}

#[derive(clap::Subcommand, Debug)]
enum RulesCommand {
    /// Print the BlindBox paper's Table 1 for a Snort rule file: the share of rules addressable by
    /// Protocol I (one keyword), I-II (keywords with positions), I-III (probable cause), and why
    /// the others are not; every option the detector does not evaluate is listed.
    Stats {
        /// The rule file (Snort 2 syntax), e.g. the community rules.
        file: PathBuf,
        /// Only the active rules: skip rules commented out with a leading `#`.
        #[arg(long)]
        active_only: bool,
    },
    /// Generate a rule-generator key `k_RG` (AES-128) into a new file (mode 0600; an existing
    /// file is never overwritten). The endpoints and the rule generator hold it, never the
    /// middlebox.
    Keygen {
        /// Where to write the key.
        #[arg(long)]
        out: PathBuf,
    },
    /// Sign a Snort rule file with `k_RG`: the tagged-rules file the middlebox loads (every
    /// rule chunk with its tag `AES_{k_RG}(chunk ‖ 0⁸)`, and the rule text).
    Sign {
        /// The rule generator's key file (`rules keygen`).
        #[arg(long)]
        rg_key: PathBuf,
        /// The Snort rule file.
        #[arg(long)]
        rules: PathBuf,
        /// Where to write the tagged rules (never overwritten).
        #[arg(long)]
        out: PathBuf,
        /// Only the active rules: skip rules commented out with a leading `#`.
        #[arg(long)]
        active_only: bool,
    },
    /// Check every tag of a tagged-rules file against `k_RG` (an audit by RG or an endpoint).
    Verify {
        #[arg(long)]
        rg_key: PathBuf,
        /// The tagged-rules file.
        #[arg(long)]
        tagged: PathBuf,
    },
}

/// Token-channel choices both endpoints must make identically.
#[derive(clap::Args, Debug, Default)]
struct ChannelFlags {
    /// `window` (a token at every offset) or `delimiter` (tokens on delimiter boundaries).
    #[arg(long)]
    tokenization: Option<String>,
    /// `exact-match` (Protocols I/II) or `probable-cause` (Protocol III: the middlebox may
    /// decrypt a flow in which a trigger keyword occurs).
    #[arg(long)]
    privacy: Option<String>,
    /// `exact` (one token lane) or `dual` (also a lower-cased lane, so `nocase` rules match).
    #[arg(long)]
    case: Option<String>,
    /// The rule generator's key file (checks the rules' tags inside the garbled circuits).
    #[arg(long)]
    rg_key: Option<PathBuf>,
    /// Refuse a setup with more rule chunks than this (default 1,048,576).
    #[arg(long)]
    max_chunks: Option<u32>,
    /// Threads for garbling (default: all cores).
    #[arg(long)]
    workers: Option<usize>,
    /// Only this TLS version (1.2 or 1.3); default: both.
    #[arg(long)]
    tls: Option<String>,
}

#[derive(clap::Args, Debug)]
struct SenderFlags {
    /// The middlebox (host:port).
    #[arg(long)]
    middlebox: Option<String>,
    /// The receiver's name, checked in its certificate.
    #[arg(long)]
    server_name: Option<String>,
    /// CA certificates (PEM) that issue the receiver's certificate.
    #[arg(long)]
    server_ca: Option<PathBuf>,
    #[command(flatten)]
    channel: ChannelFlags,
    /// Send this file (`-`: stdin, the default).
    #[arg(long, conflicts_with_all = ["get"])]
    file: Option<PathBuf>,
    /// Send `GET PATH HTTP/1.1` (Host: the server name) instead of a file.
    #[arg(long)]
    get: Option<String>,
    /// Write the receiver's answer here instead of stdout.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Give up after this many seconds (default 120).
    #[arg(long)]
    timeout_secs: Option<u64>,
}

#[derive(clap::Args, Debug)]
struct ReceiverFlags {
    /// Address to listen on (default 127.0.0.1:9444; port 0 picks one, printed on stdout).
    #[arg(long)]
    listen: Option<String>,
    /// The receiver's certificate chain (PEM, leaf first).
    #[arg(long)]
    certificate: Option<PathBuf>,
    /// The receiver's private key (PEM).
    #[arg(long)]
    private_key: Option<PathBuf>,
    #[command(flatten)]
    channel: ChannelFlags,
    /// Write what each connection delivered (validated) to this file.
    #[arg(long)]
    out: Option<PathBuf>,
    /// The answer: `auto` (an HTTP 200 response to an HTTP request, nothing otherwise),
    /// `echo` (send the data back) or `none`.
    #[arg(long)]
    reply: Option<String>,
    /// Exit after this many connections (status 1 if any failed); default: serve forever.
    #[arg(long)]
    connections: Option<u64>,
}

#[derive(clap::Args, Debug)]
struct MiddleboxFlags {
    /// Address to listen on (default 127.0.0.1:9443; port 0 picks one, printed on stdout).
    #[arg(long)]
    listen: Option<String>,
    /// The receiver (host:port) every accepted connection is relayed to.
    #[arg(long)]
    next_hop: Option<String>,
    /// The tagged-rules file from the rule generator (`rules sign`).
    #[arg(long)]
    rules: Option<PathBuf>,
    /// `block` (default: drop/reject/sdrop rules cut the connection, the others alert),
    /// `alert` (monitor only) or `block-all` (every match cuts the connection).
    #[arg(long)]
    policy: Option<String>,
    /// `approximate` (default: http_* buffer modifiers match anywhere in the message) or
    /// `strict` (rules with buffer modifiers need Protocol III).
    #[arg(long)]
    buffer: Option<String>,
    /// Garbled circuits per OT batch (1..=128, default 32).
    #[arg(long)]
    batch: Option<u16>,
    /// OT batches requested ahead (1..=8, default 2): at most batch × window circuits
    /// (≈ 322 KB each) are buffered per connection.
    #[arg(long)]
    window: Option<u32>,
    /// Threads for evaluating circuits (default: all cores).
    #[arg(long)]
    workers: Option<usize>,
    /// Exit after this many connections; default: serve forever.
    #[arg(long)]
    connections: Option<u64>,
}

/// `[blindbox]` in the config file; each table is checked after the flags are merged into it.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BlindboxConfig {
    #[serde(default)]
    pub sender: toml::Table,
    #[serde(default)]
    pub receiver: toml::Table,
    #[serde(default)]
    pub middlebox: toml::Table,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ChannelSettings {
    #[serde(default = "default_tokenization")]
    tokenization: String,
    #[serde(default = "default_privacy")]
    privacy: String,
    #[serde(default = "default_case")]
    case: String,
    rg_key: PathBuf,
    max_chunks: Option<u32>,
    workers: Option<usize>,
    tls: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SenderSettings {
    middlebox: String,
    server_name: String,
    server_ca: PathBuf,
    #[serde(flatten)]
    channel: ChannelSettings,
    timeout_secs: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReceiverSettings {
    #[serde(default = "default_receiver_listen")]
    listen: String,
    certificate: PathBuf,
    private_key: PathBuf,
    #[serde(flatten)]
    channel: ChannelSettings,
    out: Option<PathBuf>,
    #[serde(default = "default_reply")]
    reply: String,
    connections: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MiddleboxSettings {
    #[serde(default = "default_mb_listen")]
    listen: String,
    next_hop: String,
    rules: PathBuf,
    #[serde(default = "default_policy")]
    policy: String,
    #[serde(default = "default_buffer")]
    buffer: String,
    batch: Option<u16>,
    window: Option<u32>,
    workers: Option<usize>,
    connections: Option<u64>,
}

fn default_tokenization() -> String {
    "window".into()
}
fn default_privacy() -> String {
    "exact-match".into()
}
fn default_case() -> String {
    "exact".into()
}
fn default_receiver_listen() -> String {
    "127.0.0.1:9444".into()
}
fn default_mb_listen() -> String {
    "127.0.0.1:9443".into()
}
fn default_reply() -> String {
    "auto".into()
}
fn default_policy() -> String {
    "block".into()
}
fn default_buffer() -> String {
    "approximate".into()
}

pub fn run(args: BlindboxArgs, config: &BlindboxConfig) -> anyhow::Result<()> {
    match args.command {
        BlindboxCommand::Rules { command } => rules(command),
        BlindboxCommand::Sender(flags) => sender(flags, config),
        BlindboxCommand::Receiver(flags) => receiver(flags, config),
        BlindboxCommand::Middlebox(flags) => middlebox(flags, config),
        BlindboxCommand::Demo => {
            crate::subcommand::exit_quietly_when_stdout_closes();
            runtime()?.block_on(crate::blindbox_demo::run(false))?;
            println!("\nAll checks passed.");
            Ok(())
        }
    }
}

fn rules(command: RulesCommand) -> anyhow::Result<()> {
    match command {
        RulesCommand::Stats { file, active_only } => {
            let text = read_text(&file, "rule file")?;
            let parsed = parse_rules(&text, !active_only);
            for e in &parsed.errors {
                eprintln!("mbx: {}: {e}", file.display());
            }
            println!(
                "{}: {} rules parsed, {} rejected",
                file.display(),
                parsed.rules.len(),
                parsed.errors.len()
            );
            println!();
            print!("{}", table1_report(&parsed));
            Ok(())
        }
        RulesCommand::Keygen { out } => {
            let key = RgKey::generate(&mut rand::rngs::OsRng);
            key.save(&out)
                .with_context(|| format!("cannot write the RG key to {}", out.display()))?;
            println!(
                "wrote RG key {} (key id {})",
                out.display(),
                hex::encode(key.key_id())
            );
            Ok(())
        }
        RulesCommand::Sign {
            rg_key,
            rules,
            out,
            active_only,
        } => {
            let key = load_rg_key(&rg_key)?;
            let text = read_text(&rules, "rule file")?;
            let parsed = parse_rules(&text, !active_only);
            for e in &parsed.errors {
                eprintln!("mbx: {}: {e} (skipped)", rules.display());
            }
            let tagged = TaggedRules::sign(&text, !active_only, &key);
            tagged
                .save(&out)
                .with_context(|| format!("cannot write the tagged rules to {}", out.display()))?;
            println!(
                "signed {} rules ({} rejected): {} rule chunks tagged with key id {} -> {}",
                parsed.rules.len(),
                parsed.errors.len(),
                tagged.chunks().len(),
                hex::encode(tagged.key_id()),
                out.display()
            );
            Ok(())
        }
        RulesCommand::Verify { rg_key, tagged } => {
            let key = load_rg_key(&rg_key)?;
            let t = load_tagged(&tagged)?;
            ensure!(
                t.key_id() == key.key_id(),
                "{} was signed with key id {}, not this key ({})",
                tagged.display(),
                hex::encode(t.key_id()),
                hex::encode(key.key_id())
            );
            t.verify(&key)
                .with_context(|| format!("{} does not verify", tagged.display()))?;
            println!(
                "{}: all {} tags verify under key id {}",
                tagged.display(),
                t.chunks().len(),
                hex::encode(key.key_id())
            );
            Ok(())
        }
    }
}

fn read_text(path: &Path, what: &str) -> anyhow::Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("cannot read {what} {}", path.display()))
}

fn load_rg_key(path: &Path) -> anyhow::Result<RgKey> {
    RgKey::load(path).with_context(|| format!("cannot load the RG key {}", path.display()))
}

fn load_tagged(path: &Path) -> anyhow::Result<TaggedRules> {
    TaggedRules::load(path)
        .with_context(|| format!("cannot load the tagged rules {}", path.display()))
}

fn set_int(table: &mut toml::Table, key: &str, value: Option<u64>) -> anyhow::Result<()> {
    if let Some(v) = value {
        table.insert(key.into(), toml::Value::Integer(i64::try_from(v)?));
    }
    Ok(())
}

fn merge_channel(table: &mut toml::Table, f: ChannelFlags) -> anyhow::Result<()> {
    set(table, "tokenization", f.tokenization);
    set(table, "privacy", f.privacy);
    set(table, "case", f.case);
    set(table, "rg_key", path_str(f.rg_key));
    set(table, "tls", f.tls);
    set_int(table, "max_chunks", f.max_chunks.map(u64::from))?;
    set_int(table, "workers", f.workers.map(|w| w as u64))?;
    Ok(())
}

/// The flow configuration from the names used in flags and config files.
pub fn flow_config(tokenization: &str, privacy: &str, case: &str) -> anyhow::Result<FlowConfig> {
    Ok(FlowConfig {
        tokenization: tokenization.parse().map_err(anyhow::Error::msg)?,
        privacy: privacy.parse().map_err(anyhow::Error::msg)?,
        case: case.parse().map_err(anyhow::Error::msg)?,
        period: PERIOD,
        http: true,
    })
}

pub fn describe_flow(f: &FlowConfig) -> String {
    Params::from(f).to_string()
}

/// An endpoint's channel and setup choices.
struct Channel {
    flow: FlowConfig,
    setup: SetupConfig,
    key_id: String,
    version: Option<TlsVersion>,
}

fn channel(s: &ChannelSettings) -> anyhow::Result<Channel> {
    let flow = flow_config(&s.tokenization, &s.privacy, &s.case)?;
    let rg_key = load_rg_key(&s.rg_key)?;
    let key_id = hex::encode(rg_key.key_id());
    let mut endpoint = EndpointConfig::default();
    if let Some(m) = s.max_chunks {
        endpoint.max_chunks = m;
    }
    if let Some(w) = s.workers {
        ensure!(w > 0, "workers must be at least 1");
        endpoint.workers = w;
    }
    Ok(Channel {
        flow,
        setup: SetupConfig { rg_key, endpoint },
        key_id,
        version: s.tls.as_deref().map(parse_version).transpose()?,
    })
}

pub fn kb(bytes: u64) -> String {
    if bytes >= 1_000_000 {
        format!("{:.1} MB", bytes as f64 / 1e6)
    } else {
        format!("{:.1} KB", bytes as f64 / 1e3)
    }
}

pub fn setup_line(s: &SetupStats) -> String {
    format!(
        "{} garbled circuits in {:.2} s, sent {}, received {}",
        s.progress.circuits_total,
        s.elapsed.as_secs_f64(),
        kb(s.progress.bytes_sent),
        kb(s.progress.bytes_received)
    )
}

fn sender(flags: SenderFlags, config: &BlindboxConfig) -> anyhow::Result<()> {
    let mut table = config.sender.clone();
    set(&mut table, "middlebox", flags.middlebox);
    set(&mut table, "server_name", flags.server_name);
    set(&mut table, "server_ca", path_str(flags.server_ca));
    set_int(&mut table, "timeout_secs", flags.timeout_secs)?;
    merge_channel(&mut table, flags.channel)?;
    let s = SenderSettings::deserialize(toml::Value::Table(table))
        .context("invalid BlindBox sender configuration ([blindbox.sender] and flags)")?;
    let ch = channel(&s.channel)?;
    let ca = read_file(&s.server_ca, "server CA file")?;
    let mut tls = TlsConfig::client(&s.server_name, ca);
    tls.session_tickets = false;
    if let Some(v) = ch.version {
        tls = tls.only(v);
    }
    // What to send: a GET request, or a file or stdin read and sent a chunk at a time.
    let mut input: Box<dyn tokio::io::AsyncRead + Unpin + Send> = match (&flags.get, &flags.file) {
        (Some(path), _) => {
            ensure!(
                path.starts_with('/') && path.bytes().all(|b| b.is_ascii_graphic()),
                "--get wants a path such as /index.html"
            );
            Box::new(std::io::Cursor::new(
                format!(
                    "GET {path} HTTP/1.1\r\nHost: {}\r\nUser-Agent: mbx-blindbox\r\nConnection: close\r\n\r\n",
                    s.server_name
                )
                .into_bytes(),
            ))
        }
        (None, Some(p)) if p.as_os_str() != "-" => Box::new(
            std::fs::File::open(p)
                .map(tokio::fs::File::from_std)
                .with_context(|| format!("cannot open the input file {}", p.display()))?,
        ),
        (None, _) => Box::new(tokio::io::stdin()),
    };
    let timeout = Duration::from_secs(s.timeout_secs.unwrap_or(120));
    let rt = runtime()?;
    let answer = rt.block_on(async {
        tokio::time::timeout(timeout, async {
            eprintln!(
                "blindbox sender: connecting to {} for {} ({}, RG key id {})",
                s.middlebox,
                s.server_name,
                describe_flow(&ch.flow),
                ch.key_id
            );
            let mut conn = BlindBoxStream::connect(&s.middlebox, &tls, ch.flow, ch.setup)
                .await
                .map_err(|e| net_error("connection failed", &e))?;
            if let Some(st) = conn.setup_stats() {
                eprintln!("blindbox sender: rule setup done: {}", setup_line(&st));
            }
            let mut chunk = vec![0u8; 64 * 1024];
            let mut sent = 0usize;
            loop {
                let n = tokio::io::AsyncReadExt::read(&mut input, &mut chunk)
                    .await
                    .context("cannot read the input")?;
                let Some(part) = chunk.get(..n).filter(|p| !p.is_empty()) else {
                    break;
                };
                conn.write_all(part)
                    .await
                    .map_err(|e| net_error("sending failed", &e))?;
                sent += n;
            }
            conn.finish()
                .await
                .map_err(|e| net_error("sending failed", &e))?;
            eprintln!("blindbox sender: sent {sent} bytes with their tokens");
            let answer = conn
                .read_to_end()
                .await
                .map_err(|e| net_error("receiving the answer failed", &e))?;
            eprintln!(
                "blindbox sender: received {} bytes, every byte validated against its tokens",
                answer.len()
            );
            anyhow::Ok(answer)
        })
        .await
        .map_err(|_| anyhow::anyhow!("no answer within {} s", timeout.as_secs()))?
    })?;
    match &flags.out {
        Some(p) => std::fs::write(p, &answer)
            .with_context(|| format!("cannot write the answer to {}", p.display()))?,
        None => {
            let mut out = std::io::stdout().lock();
            out.write_all(&answer)?;
            out.flush()?;
        }
    }
    Ok(())
}

/// One line for a connection error (the driver's errors already carry their causes).
pub fn net_error(what: &str, e: &DriverError) -> anyhow::Error {
    match e {
        DriverError::Net(NetError::Validation(v))
            if v.culprit == Culprit::Path && v.what == Misbehaviour::Truncated =>
        {
            anyhow::anyhow!(
                "{what}: the connection was cut on the path before the peer's data was complete \
                 (a middlebox blocking rule, or a network failure): {v}"
            )
        }
        other => anyhow::anyhow!("{what}: {other}"),
    }
}

/// An HTTP request line at the start of `data`.
fn http_request_line(data: &[u8]) -> Option<String> {
    let line_end = data.windows(2).position(|w| w == b"\r\n")?;
    let line = std::str::from_utf8(data.get(..line_end)?).ok()?;
    let mut parts = line.split(' ');
    let (method, _, version) = (parts.next()?, parts.next()?, parts.next()?);
    (method.bytes().all(|b| b.is_ascii_uppercase()) && version.starts_with("HTTP/1."))
        .then(|| line.to_string())
}

/// The receiver's answer to `data`.
pub fn answer(reply: &str, data: &[u8]) -> Vec<u8> {
    match reply {
        "echo" => data.to_vec(),
        "none" => Vec::new(),
        _ => match http_request_line(data) {
            Some(line) => {
                let body = format!(
                    "BlindBox receiver: got {} bytes ({line}), all validated against their tokens\n",
                    data.len()
                );
                format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                )
                .into_bytes()
            }
            None => Vec::new(),
        },
    }
}

fn receiver(flags: ReceiverFlags, config: &BlindboxConfig) -> anyhow::Result<()> {
    let mut table = config.receiver.clone();
    set(&mut table, "listen", flags.listen);
    set(&mut table, "certificate", path_str(flags.certificate));
    set(&mut table, "private_key", path_str(flags.private_key));
    set(&mut table, "out", path_str(flags.out));
    set(&mut table, "reply", flags.reply);
    set_int(&mut table, "connections", flags.connections)?;
    merge_channel(&mut table, flags.channel)?;
    let s = ReceiverSettings::deserialize(toml::Value::Table(table))
        .context("invalid BlindBox receiver configuration ([blindbox.receiver] and flags)")?;
    ensure!(
        matches!(s.reply.as_str(), "auto" | "echo" | "none"),
        "unknown reply {:?} (use auto, echo or none)",
        s.reply
    );
    let ch = channel(&s.channel)?;
    let mut tls = TlsConfig::server(mbx_engine::Identity::from_pem_files(
        &s.certificate,
        &s.private_key,
    )?);
    tls.session_tickets = false;
    if let Some(v) = ch.version {
        tls = tls.only(v);
    }
    let rt = runtime()?;
    rt.block_on(async move {
        let listener = TcpListener::bind(&s.listen)
            .await
            .with_context(|| format!("cannot listen on {}", s.listen))?;
        crate::subcommand::print_line(format_args!(
            "BlindBox receiver listening on {} ({}, RG key id {})",
            listener.local_addr()?,
            describe_flow(&ch.flow),
            ch.key_id
        ));
        // Connections are served concurrently (a rule setup takes seconds); `--out` holds the
        // data of the connection that finished last.
        let (tls, s) = (Arc::new(tls), Arc::new(s));
        let out_lock = Arc::new(tokio::sync::Mutex::new(()));
        let failed = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let mut tasks = tokio::task::JoinSet::new();
        let mut n = 0u64;
        // Out of descriptors, accept pauses and tries again instead of ending the listener.
        let mut acceptor = Acceptor::new(listener);
        while s.connections.is_none_or(|max| n < max) {
            let (stream, peer) = acceptor.accept().await;
            n += 1;
            let (tls, s, out_lock, failed) =
                (tls.clone(), s.clone(), out_lock.clone(), failed.clone());
            let (flow, setup) = (ch.flow, ch.setup.clone());
            tasks.spawn(async move {
                let r = receive_one(n, peer, stream, &tls, flow, setup, &s, &out_lock).await;
                if let Err(e) = r {
                    failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    print_line(format_args!(
                        "connection {n} failed: {}",
                        crate::subcommand::error_text(&e)
                    ));
                }
            });
        }
        while tasks.join_next().await.is_some() {}
        let failed = failed.load(std::sync::atomic::Ordering::Relaxed);
        ensure!(failed == 0, "{failed} of {n} connections failed");
        Ok(())
    })
}

/// One receiver connection: setup, the validated data, the reply.
#[allow(clippy::too_many_arguments)]
async fn receive_one(
    n: u64,
    peer: std::net::SocketAddr,
    stream: tokio::net::TcpStream,
    tls: &TlsConfig,
    flow: FlowConfig,
    setup: SetupConfig,
    s: &ReceiverSettings,
    out_lock: &tokio::sync::Mutex<()>,
) -> anyhow::Result<()> {
    let mut conn = BlindBoxStream::accept(stream, tls, flow, setup)
        .await
        .map_err(|e| net_error("connection failed", &e))?;
    if let Some(st) = conn.setup_stats() {
        print_line(format_args!(
            "connection {n} from {peer}: rule setup done: {}",
            setup_line(&st)
        ));
    }
    let data = conn
        .read_to_end()
        .await
        .map_err(|e| net_error("receiving failed", &e))?;
    print_line(format_args!(
        "connection {n}: received {} bytes, every byte validated against its tokens",
        data.len()
    ));
    if let Some(p) = &s.out {
        let _one_writer = out_lock.lock().await;
        std::fs::write(p, &data).with_context(|| format!("cannot write {}", p.display()))?;
    }
    let reply = answer(&s.reply, &data);
    conn.write_all(&reply)
        .await
        .map_err(|e| net_error("answering failed", &e))?;
    conn.finish()
        .await
        .map_err(|e| net_error("answering failed", &e))?;
    print_line(format_args!(
        "connection {n}: answered {} bytes, closed cleanly",
        reply.len()
    ));
    Ok(())
}

fn middlebox(flags: MiddleboxFlags, config: &BlindboxConfig) -> anyhow::Result<()> {
    let mut table = config.middlebox.clone();
    set(&mut table, "listen", flags.listen);
    set(&mut table, "next_hop", flags.next_hop);
    set(&mut table, "rules", path_str(flags.rules));
    set(&mut table, "policy", flags.policy);
    set(&mut table, "buffer", flags.buffer);
    set_int(&mut table, "batch", flags.batch.map(u64::from))?;
    set_int(&mut table, "window", flags.window.map(u64::from))?;
    set_int(&mut table, "workers", flags.workers.map(|w| w as u64))?;
    set_int(&mut table, "connections", flags.connections)?;
    let s = MiddleboxSettings::deserialize(toml::Value::Table(table))
        .context("invalid BlindBox middlebox configuration ([blindbox.middlebox] and flags)")?;
    let policy: Policy = s.policy.parse().map_err(anyhow::Error::msg)?;
    let buffer: BufferPolicy = s.buffer.parse().map_err(anyhow::Error::msg)?;
    let mut setup = MiddleboxConfig::default();
    if let Some(b) = s.batch {
        ensure!((1..=128).contains(&b), "batch must be in 1..=128");
        setup.batch = b;
    }
    if let Some(w) = s.window {
        ensure!((1..=8).contains(&w), "window must be in 1..=8");
        setup.window = w;
    }
    if let Some(w) = s.workers {
        ensure!(w > 0, "workers must be at least 1");
        setup.workers = w;
    }
    let tagged = load_tagged(&s.rules)?;
    let book = Arc::new(
        RuleBook::new(&tagged, buffer, policy, setup)
            .with_context(|| format!("the tagged rules {} are unusable", s.rules.display()))?,
    );
    let rt = runtime()?;
    rt.block_on(async move {
        let listener = TcpListener::bind(&s.listen)
            .await
            .with_context(|| format!("cannot listen on {}", s.listen))?;
        crate::subcommand::print_line(format_args!(
            "BlindBox middlebox listening on {}, next hop {}",
            listener.local_addr()?,
            s.next_hop
        ));
        crate::subcommand::print_line(format_args!(
            "rules: {} from {} (RG key id {}): {} window / {} delimiter rule chunks; policy {}",
            book.rule_count(),
            s.rules.display(),
            hex::encode(tagged.key_id()),
            book.chunk_count(Tokenization::Window),
            book.chunk_count(Tokenization::Delimiter),
            s.policy
        ));
        let mut tasks = Vec::new();
        let mut n = 0u64;
        // Out of descriptors, accept pauses and tries again instead of ending the listener.
        let mut acceptor = Acceptor::new(listener);
        while s.connections.is_none_or(|max| n < max) {
            let (stream, peer) = acceptor.accept().await;
            n += 1;
            let id = n;
            let book = book.clone();
            let next_hop = s.next_hop.clone();
            tasks.push(tokio::spawn(async move {
                print_line(format_args!("connection {id} from {peer}"));
                let sink: EventSink = {
                    let book = book.clone();
                    Arc::new(move |ev: &MiddleboxEvent| {
                        print_line(format_args!("connection {id}: {}", event_line(&book, ev)));
                    })
                };
                let report = serve_middlebox(stream, &next_hop, book, Some(sink)).await;
                match report.outcome {
                    Ok(()) => print_line(format_args!("connection {id}: closed")),
                    Err(e) => print_line(format_args!("connection {id}: ended: {e}")),
                }
            }));
        }
        for t in tasks {
            let _ = t.await;
        }
        Ok(())
    })
}

fn flow_name(f: Flow) -> &'static str {
    match f {
        Flow::ToServer => "sender -> receiver",
        Flow::ToClient => "receiver -> sender",
    }
}

/// One line for a middlebox event (alerts with sid and message).
pub fn event_line(book: &RuleBook, ev: &MiddleboxEvent) -> String {
    let msg = |sid: u32| book.message(sid).unwrap_or("(no msg)").to_string();
    match ev {
        MiddleboxEvent::SetupStarted { params, chunks } => {
            format!("rule setup started: {chunks} rule chunks, endpoints use {params}")
        }
        MiddleboxEvent::SetupDone { progress } => format!(
            "rule setup done: {} circuits checked and evaluated, sent {}, received {}",
            progress.circuits_done,
            kb(progress.bytes_sent),
            kb(progress.bytes_received)
        ),
        MiddleboxEvent::Ready => "ready: traffic flows".into(),
        MiddleboxEvent::Refused(why) => format!("REFUSED: {why}"),
        MiddleboxEvent::Detection(f, e) => match e {
            MbEvent::Alert(a) => format!(
                "alert sid {} \"{}\" ({}, message at offset {})",
                a.sid,
                msg(a.sid),
                flow_name(*f),
                a.message_start
            ),
            MbEvent::ProbableCause { sid, message_start } => format!(
                "probable cause sid {sid} \"{}\" ({}, message at offset {message_start}): flow decryptable",
                msg(*sid),
                flow_name(*f)
            ),
            MbEvent::FullAlert(a) => format!(
                "full-rule alert sid {} \"{}\" on the decrypted flow ({}, message at offset {})",
                a.alert.sid,
                msg(a.alert.sid),
                flow_name(*f),
                a.alert.message_start
            ),
            MbEvent::Blocked { sid } => format!(
                "BLOCKED by sid {sid} \"{}\" ({}): connection cut",
                msg(*sid),
                flow_name(*f)
            ),
            MbEvent::DecryptionFailed(why) => {
                format!("decryption failed ({}): blocked: {why}", flow_name(*f))
            }
        },
    }
}
