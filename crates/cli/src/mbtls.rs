//! `mbx mbtls`: an mbTLS client that fetches a URL through one pre-configured middlebox, the
//! middlebox itself (client side: in front of any TLS server; server side: announcing itself to
//! an mbTLS server), and the mbTLS server in front of a plain-HTTP backend.
//!
//! Options come from `[mbtls.client]` / `[mbtls.middlebox]` / `[mbtls.server]` of the config
//! file; flags override them. See docs/mbtls.md ("Running it") for a worked example.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::{bail, ensure, Context};
use mbx_apps::{HttpHeaderInsert, MiddleboxApp, PassThrough};
use mbx_attest::{
    quote_measurement_unverified, sim, AttestError, Attester, DcapEvidence, DcapVerifier, Evidence,
    GramineAttester, HexBytes, Policy, SimulatedAttester, SimulatedPlatform, TcbStatus,
    TsmAttester, REPORT_DATA_LEN,
};
use mbx_engine::{OpenSslContext, RustlsClientContext, TlsConfig};
use mbx_mbtls::driver::client::MiddleboxVerdict;
use mbx_mbtls::driver::{
    fingerprint_hex, AppFactory, ClientProxy, ClientProxyConfig, ConnectionRate, ConnectionReport,
    HandshakeProgress, Limits, ListenerStats, Listening, MbtlsClient, MbtlsServer,
    MbtlsServerConfig, MiddleboxServer, MiddleboxServerConfig, NextHop, Placement, ProxyReport,
    ServerConnectionReport, ServiceConfig,
};
use mbx_mbtls::handshake::{
    primary_client_config, primary_server_config, secondary_client_config, Approver,
    ClientHandshakeConfig, ClientMiddlebox, HopFingerprint, MiddleboxHandshakeConfig,
    ServerHandshakeConfig, ServerMiddlebox, MIDDLEBOX_TICKET_KEY_PERIOD, NOT_APPROVED,
};
use mbx_mbtls::Side;
use mbx_record::TlsVersion;

use crate::response_out::ResponseOut;
use crate::subcommand::{parse_version, path_str, print_line, runtime, set};
use mbx_engine::pem_file::{read_file, read_pem_file, PemKind};
use serde::Deserialize;
use zeroize::Zeroizing;

/// What the simulated TEE measures: this program plus the middlebox's configuration.
const PROGRAM: &str = concat!("mbx mbtls middlebox ", env!("CARGO_PKG_VERSION"));

#[derive(clap::Args, Debug)]
pub struct MbtlsArgs {
    #[command(subcommand)]
    command: MbtlsCommand,
}

impl MbtlsArgs {
    /// `mbx mbtls demo`.
    pub fn is_demo(&self) -> bool {
        matches!(self.command, MbtlsCommand::Demo(_))
    }
}

#[derive(clap::Subcommand, Debug)]
enum MbtlsCommand {
    /// Fetch an https:// URL through pre-configured mbTLS middleboxes (or any approved middlebox
    /// on the path) and print the path, each hop's key fingerprint, the attestation verdicts,
    /// the TLS version, then the response.
    /// Options: `[mbtls.client]` of the config file, overridden by these flags.
    Client(ClientFlags),
    /// Run an mbTLS middlebox: accept connections, connect each to the next hop, join the
    /// session and apply the app to the plaintext. Client side (default): joins mbTLS clients'
    /// sessions, in front of any TLS server. Server side (`--server-side`): announces itself to
    /// an mbTLS server, behind any TLS client (curl, browsers).
    /// Options: `[mbtls.middlebox]` of the config file, overridden by these flags.
    Middlebox(MiddleboxFlags),
    /// Run an mbTLS server in front of a plain-HTTP backend: terminates TLS from any client
    /// (legacy or mbTLS), gives its server-side middleboxes their keys after checking their
    /// certificates and attestation, and passes the plaintext to the backend.
    /// Options: `[mbtls.server]` of the config file, overridden by these flags.
    Server(ServerFlags),
    /// Start an mbTLS client, two client-side middleboxes, a server-side middlebox, an mbTLS server
    /// and an HTTP backend on loopback, fetch a page, and show each hop's keys, each attestation
    /// verdict and what the middleboxes did (also part of `mbx demo`).
    Demo(DemoFlags),
    /// For a CA, before it signs a middlebox's certificate signing request (from `mbx mbtls
    /// middlebox --certificate-request`): check the evidence the request carries, bound to
    /// its key and nonce, against a policy, and print its claims. Exit status 0 only if it
    /// passes.
    CheckRequest(CheckRequestFlags),
}

#[derive(clap::Args, Debug)]
struct CheckRequestFlags {
    /// The certificate signing request (PEM or DER).
    request: PathBuf,
    /// The nonce the CA issued (hex): the evidence must be bound to it.
    #[arg(long)]
    nonce: String,
    /// The code measurements, platforms and TCB the CA accepts.
    #[command(flatten)]
    attestation: PolicyFlags,
}

/// The attestation policy's flags, for every role that checks evidence.
#[derive(clap::Args, Debug, Clone)]
struct PolicyFlags {
    /// Attestation policy (TOML: an `[attestation]` table or its contents); replaces the
    /// config file's policy and what the file adds to it.
    #[arg(long)]
    policy: Option<PathBuf>,
    /// Accept evidence from the simulated TEE (demos only; never in production).
    #[arg(long)]
    allow_simulated: bool,
    /// Add an accepted code measurement (hex) to the policy.
    #[arg(long = "measurement")]
    measurements: Vec<String>,
    /// Add a trusted simulated platform key (hex) to the policy.
    #[arg(long = "sim-platform-key")]
    sim_platform_keys: Vec<String>,
}

impl PolicyFlags {
    /// Into a role's table: a policy file replaces the file's policy (and what the file adds
    /// to it), the rest adds to it.
    fn merge_into(self, table: &mut toml::Table) {
        policy_flag_replaces_the_files(table, self.policy.is_some());
        set(table, "policy", path_str(self.policy));
        if self.allow_simulated {
            table.insert("allow_simulated".into(), toml::Value::Boolean(true));
        }
        append_to_list(table, "measurements", self.measurements);
        append_to_list(table, "sim_platform_keys", self.sim_platform_keys);
    }
}

/// `list` appended to the array `key` of `table` (made if missing).
fn append_to_list(table: &mut toml::Table, key: &str, list: Vec<String>) {
    if list.is_empty() {
        return;
    }
    let entry = table
        .entry(key)
        .or_insert_with(|| toml::Value::Array(Vec::new()));
    if let toml::Value::Array(a) = entry {
        a.extend(list.into_iter().map(toml::Value::String));
    }
}

#[derive(clap::Args, Debug)]
struct DemoFlags {
    /// TLS versions to run (`1.2`, `1.3`). Default: both.
    #[arg(long = "tls", value_delimiter = ',')]
    versions: Vec<String>,
}

#[derive(clap::Args, Debug, Clone)]
struct ServerFlags {
    /// Address to listen on (default 127.0.0.1:9443).
    #[arg(long)]
    listen: Option<String>,
    /// The plain-TCP backend (host:port), e.g. a local HTTP server.
    #[arg(long)]
    backend: Option<String>,
    /// The server's certificate chain (PEM, leaf first).
    #[arg(long)]
    certificate: Option<PathBuf>,
    /// The server's private key (PEM).
    #[arg(long)]
    private_key: Option<PathBuf>,
    /// A pre-configured server-side middlebox: every session must include it, with a
    /// certificate for this name. Repeat for several, in path order from the client (these
    /// replace the config file's names and discovery settings).
    #[arg(long = "middlebox-name")]
    middlebox_names: Vec<String>,
    /// Approve a discovered (announcing) middlebox whose certificate carries this DNS name
    /// (repeatable; replaces the config file's names and discovery settings). Without this and
    /// --middlebox-name every announcing middlebox is excluded.
    #[arg(long = "allow-middlebox")]
    allow_middleboxes: Vec<String>,
    /// How many middleboxes may announce themselves in one session (default 1), approved or
    /// not: more fail the handshake, so set it to the number on the path.
    #[arg(long)]
    max_discovered: Option<u8>,
    /// CA certificates (PEM) that issue middlebox certificates.
    #[arg(long)]
    middlebox_ca: Option<PathBuf>,
    #[command(flatten)]
    attestation: PolicyFlags,
    /// Only this TLS version (1.2 or 1.3); default: both.
    #[arg(long)]
    tls: Option<String>,
    /// Check every middlebox's evidence on every session: never resume a middlebox's
    /// secondary session (by default a pre-configured middlebox's session resumes from one
    /// whose evidence passed, without new evidence; docs/mbtls.md §4.7).
    #[arg(long)]
    fresh_evidence: bool,
    /// Issue session tickets, so that TLS 1.3 clients (and TLS 1.2 ones with tickets) can
    /// resume, through server-side middleboxes too: legacy clients and mbTLS clients (e.g.
    /// `mbx mbtls client --proxy`). Off by default (TLS 1.2 clients resume by session ID
    /// either way).
    #[arg(long)]
    session_tickets: bool,
    /// With `--session-tickets`: seconds the server seals tickets under one key before it
    /// makes the next (default 3600; a ticket opens for one to two periods).
    #[arg(long)]
    ticket_key_secs: Option<u64>,
    /// Discovering (`--allow-middlebox`): also take middleboxes that announce themselves
    /// after the ClientHello, as the paper and the spec order it (other implementations;
    /// ours announce before it). Costs every session OpenSSL's key log, about 11 µs of CPU,
    /// whether or not a middlebox joins.
    #[arg(long)]
    announcements_after_hello: bool,
    #[command(flatten, next_help_heading = "Service")]
    service: Service,
}

#[derive(clap::Args, Debug, Clone)]
struct ClientFlags {
    /// The URL to fetch (https://host[:port]/path); host is the server name checked in its
    /// certificate. The TCP connection goes to --middlebox if given (which knows the server's
    /// address), else to the URL's host and port.
    url: String,
    /// Address of the first middlebox (host:port); without it the client connects to the URL's
    /// host and port (discovery: a transparent middlebox on the path may join).
    #[arg(long)]
    middlebox: Option<String>,
    /// Name the middlebox's certificate must carry (default: the host of --middlebox). Repeat
    /// for several pre-configured middleboxes, in path order from the client, every middlebox
    /// on the path named (names are taken from the server's end: one not named here takes a
    /// name); these replace the config file's names and discovery settings.
    #[arg(long = "middlebox-name")]
    middlebox_names: Vec<String>,
    /// Discovery: let a middlebox on the path join if its certificate carries this DNS name
    /// (repeatable; the allow-list policy for discovered middleboxes; replaces the config
    /// file's names and discovery settings).
    #[arg(long = "allow-middlebox")]
    allow_middleboxes: Vec<String>,
    /// Discovery: how many middleboxes on the path may join (default 1; each costs an
    /// optimistic ClientHello). The middleboxes nearest the server take them first, approved
    /// or not: set it to the number on the path.
    #[arg(long)]
    max_discovered: Option<u8>,
    /// No middlebox on the client's side (the server's middleboxes may still join): no
    /// optimistic ClientHello, and the session's keys stay inside OpenSSL. --middlebox, if
    /// given, is only the address to connect to.
    #[arg(long)]
    no_client_middleboxes: bool,
    /// CA certificates (PEM) that issue server certificates.
    #[arg(long)]
    server_ca: Option<PathBuf>,
    /// CA certificates (PEM) that issue middlebox certificates (default: --server-ca).
    #[arg(long)]
    middlebox_ca: Option<PathBuf>,
    #[command(flatten)]
    attestation: PolicyFlags,
    /// Only this TLS version (1.2 or 1.3); default: both offered.
    #[arg(long)]
    tls: Option<String>,
    /// Give up when the handshake takes longer than this many seconds, or the response
    /// pauses longer (default 30; one fetch only: with --proxy the service timeouts apply).
    #[arg(long)]
    timeout_secs: Option<u64>,
    /// Write the response body to this file (the status and header fields still go to
    /// standard output); without it, or with `-`, the body follows them on standard output.
    #[arg(long, short = 'o')]
    output: Option<PathBuf>,
    /// Check every middlebox's evidence on every session: never resume a middlebox's
    /// secondary session (by default a pre-configured middlebox's session resumes from one
    /// whose evidence passed, without new evidence; docs/mbtls.md §4.7).
    #[arg(long)]
    fresh_evidence: bool,
    /// Act as a local proxy instead of fetching once: listen here (e.g. 127.0.0.1:8080) and
    /// carry each accepted plain-TCP connection over its own mbTLS session to the URL's server
    /// (e.g. `curl http://127.0.0.1:8080/` then reaches the server through the middleboxes).
    /// The URL gives the server's name and port only: the requests, paths included, are the
    /// local application's.
    #[arg(long)]
    proxy: Option<String>,
    /// As a proxy: run a full handshake with the server for every connection instead of
    /// resuming the last session (TLS 1.2 session ID or ticket, TLS 1.3 ticket).
    #[arg(long)]
    no_resume: bool,
    /// As a proxy: its limits and its stop.
    #[command(flatten, next_help_heading = "As a proxy (--proxy only)")]
    service: Service,
}

#[derive(clap::Args, Debug, Clone)]
struct MiddleboxFlags {
    /// Address to listen on (default 127.0.0.1:8443).
    #[arg(long)]
    listen: Option<String>,
    /// The server (host:port) every accepted connection is relayed to.
    #[arg(long, conflicts_with = "transparent")]
    next_hop: Option<String>,
    /// On the path instead: relay each connection to where the client was connecting before a
    /// firewall redirected it here (nftables/iptables `redirect` or `dnat`, Linux).
    #[arg(long)]
    transparent: bool,
    /// The middlebox's certificate chain (PEM, leaf first).
    #[arg(long)]
    certificate: Option<PathBuf>,
    /// The middlebox's private key (PEM).
    #[arg(long)]
    private_key: Option<PathBuf>,
    /// `passthrough` or `http-header:NAME:VALUE` (insert a request header).
    #[arg(long)]
    app: Option<String>,
    /// `none` (send no evidence), `sim` (simulated TEE, for demos), `gramine` (Intel SGX DCAP
    /// quotes, running inside Gramine) or `tdx` (Intel TDX DCAP quotes through Linux's
    /// configfs-tsm, running in a TDX guest).
    #[arg(long)]
    attester: Option<String>,
    /// Simulated platform key (PKCS#8 DER file); created if missing.
    #[arg(long)]
    sim_platform_key: Option<PathBuf>,
    /// With `--attester gramine` or `tdx`: the platform's DCAP collateral (PCCS JSON), sent
    /// with every quote; read again for each quote, so a helper can keep it fresh.
    #[arg(long)]
    dcap_collateral: Option<PathBuf>,
    /// With `--attester gramine`: where Gramine's attestation files are (default
    /// /dev/attestation).
    #[arg(long)]
    gramine_attestation_dir: Option<PathBuf>,
    /// With `--attester tdx`: the configfs-tsm report entry to quote through (default
    /// /sys/kernel/config/tsm/report/mbx-<pid>, made at start and removed at exit).
    #[arg(long)]
    tsm_report_entry: Option<PathBuf>,
    /// Work for the server: announce ourselves to it (it must run mbTLS, e.g. `mbx mbtls
    /// server`; a legacy server fails the first session and is then passed through unchanged).
    #[arg(long)]
    server_side: bool,
    /// With --server-side: seconds a server that refused our announcement is remembered as
    /// legacy (its sessions passed through unannounced) before it is announced to again; each
    /// time costs the session that finds it legacy (default: until the middlebox stops; 0:
    /// announce on every session).
    #[arg(long)]
    forget_legacy_after_secs: Option<u64>,
    /// Seconds the middlebox seals its session tickets under one key before it makes the next
    /// (default 3600): a ticket, and with it a resumed secondary session without new
    /// evidence, opens for one to two periods.
    #[arg(long)]
    ticket_key_secs: Option<u64>,
    /// Point every session at the evidence in the middlebox's certificate instead of making
    /// evidence for each session (no quote per session); endpoints accept it only with
    /// `certificate_evidence = true` in their policy. The certificate must carry it: make its
    /// request with --certificate-request.
    #[arg(long)]
    evidence_in_certificate: bool,
    /// Fail closed: cut a session this middlebox cannot take part in (a legacy client or
    /// server, a client that offers it no hello or refuses it), instead of passing it through
    /// unread.
    #[arg(long)]
    fail_closed: bool,
    /// Make a new key at --private-key (which must not exist; under Gramine a protected file)
    /// and write a certificate signing request (PEM) for it to this file, carrying the
    /// attester's evidence for that key and --nonce (extension 2.23.133.5.4.9), then exit; the
    /// CA signs it copying its extensions but setting CA:FALSE itself (see docs/mbtls.md
    /// §4.8). No --certificate needed; the flags of a running middlebox are refused.
    #[arg(
        long,
        requires_all = ["nonce", "request_names"],
        conflicts_with_all = [
            "listen", "next_hop", "transparent", "certificate", "evidence_in_certificate",
            "ticket_key_secs",
        ]
    )]
    certificate_request: Option<PathBuf>,
    /// With --certificate-request: the verifier's nonce (hex, up to 64 bytes, not 32) the
    /// evidence is bound to; endpoints may pin it (`certificate_nonces`).
    #[arg(long, requires = "certificate_request")]
    nonce: Option<String>,
    /// With --certificate-request: a DNS name for the request (repeatable); the first is also
    /// its common name.
    #[arg(long = "request-name", requires = "certificate_request")]
    request_names: Vec<String>,
    #[command(flatten, next_help_heading = "Service")]
    service: Service,
}

/// `[mbtls]` in the config file; each table is checked after the flags are merged into it.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MbtlsConfig {
    #[serde(default)]
    pub client: toml::Table,
    #[serde(default)]
    pub middlebox: toml::Table,
    #[serde(default)]
    pub server: toml::Table,
    /// The file the tables were read from (`Config::load`), which errors about a role's
    /// settings name: a value of the wrong type is found only once the flags are merged in.
    #[serde(skip)]
    pub source: Option<std::path::PathBuf>,
}

impl MbtlsConfig {
    /// Where a `role`'s merged settings came from, for its errors.
    fn origin(&self, role: &str) -> String {
        match &self.source {
            Some(path) => format!("[mbtls.{role}] of {} and flags", path.display()),
            None => "flags".into(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ClientSettings {
    middlebox: Option<String>,
    middlebox_name: Option<String>,
    /// Several pre-configured middleboxes, in path order (instead of `middlebox_name`).
    #[serde(default)]
    middlebox_names: Vec<String>,
    /// Discovery allow-list (instead of pre-configured names).
    #[serde(default)]
    allow_middleboxes: Vec<String>,
    /// Discovery: how many middleboxes may join (default 1).
    max_discovered: Option<u8>,
    /// No client-side middlebox at all (server-side ones may join).
    #[serde(default)]
    no_client_middleboxes: bool,
    server_ca: PathBuf,
    middlebox_ca: Option<PathBuf>,
    policy: Option<PathBuf>,
    /// Inline policy, as the `[attestation]` table.
    attestation: Option<toml::Table>,
    #[serde(default)]
    allow_simulated: bool,
    #[serde(default)]
    measurements: Vec<String>,
    #[serde(default)]
    sim_platform_keys: Vec<String>,
    tls: Option<String>,
    timeout_secs: Option<u64>,
    /// As a proxy: resume sessions with the server (default true; `--no-resume`).
    resume: Option<bool>,
    /// Resume middleboxes' secondary sessions (default true; `--fresh-evidence`).
    middlebox_resumption: Option<bool>,
    /// As a proxy (`--proxy`) only.
    #[serde(skip)]
    service: Service,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MiddleboxSettings {
    #[serde(default = "default_listen")]
    listen: String,
    /// Either a fixed next hop or `transparent`.
    next_hop: Option<String>,
    #[serde(default)]
    transparent: bool,
    /// Required but for a certificate request.
    certificate: Option<PathBuf>,
    private_key: PathBuf,
    #[serde(default = "default_app")]
    app: String,
    /// Sessions point at the evidence in the certificate.
    #[serde(default)]
    evidence_in_certificate: bool,
    /// Sessions it cannot take part in are cut.
    #[serde(default)]
    fail_closed: bool,
    #[serde(default = "default_attester")]
    attester: String,
    sim_platform_key: Option<PathBuf>,
    dcap_collateral: Option<PathBuf>,
    gramine_attestation_dir: Option<PathBuf>,
    tsm_report_entry: Option<PathBuf>,
    /// `client` (default) or `server`.
    #[serde(default = "default_side")]
    side: String,
    /// Seconds per session-ticket key (default `MIDDLEBOX_TICKET_KEY_PERIOD`, 3600).
    ticket_key_secs: Option<u64>,
    /// Server side: seconds a legacy server is remembered (default: until the middlebox stops).
    forget_legacy_after_secs: Option<u64>,
    #[serde(skip)]
    service: Service,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ServerSettings {
    #[serde(default = "default_server_listen")]
    listen: String,
    backend: String,
    certificate: PathBuf,
    private_key: PathBuf,
    /// Pre-configured server-side middleboxes, in path order from the client.
    #[serde(default)]
    middlebox_names: Vec<String>,
    #[serde(default)]
    allow_middleboxes: Vec<String>,
    /// Discovery: how many middleboxes may announce themselves (default 1).
    max_discovered: Option<u8>,
    middlebox_ca: Option<PathBuf>,
    policy: Option<PathBuf>,
    attestation: Option<toml::Table>,
    #[serde(default)]
    allow_simulated: bool,
    #[serde(default)]
    measurements: Vec<String>,
    #[serde(default)]
    sim_platform_keys: Vec<String>,
    tls: Option<String>,
    /// Issue session tickets (`--session-tickets`).
    #[serde(default)]
    session_tickets: bool,
    /// Seconds per session-ticket key (default 3600).
    ticket_key_secs: Option<u64>,
    /// Resume middleboxes' secondary sessions (default true; `--fresh-evidence`).
    middlebox_resumption: Option<bool>,
    /// Take announcements after the ClientHello (`--announcements-after-hello`).
    #[serde(default)]
    announcements_after_hello: bool,
    #[serde(skip)]
    service: Service,
}

impl ServerSettings {
    /// Whether any middlebox may join: pre-configured names or an allow-list.
    fn middleboxes_may_join(&self) -> bool {
        !self.middlebox_names.is_empty() || !self.allow_middleboxes.is_empty()
    }
}

/// What a middlebox, a server and a client proxy share as long-running services: the same
/// fields are their flags and their config-file keys. The keys are taken out of the merged table
/// before the rest is read (serde's `flatten` and `deny_unknown_fields` do not work together),
/// so each settings struct holds them once.
#[derive(clap::Args, Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Service {
    /// Close a connection whose mbTLS handshake has not finished this many seconds after it
    /// was accepted (default 60, as nginx's ssl_handshake_timeout).
    #[arg(long)]
    handshake_timeout_secs: Option<u64>,
    /// Close an established session that carried nothing either way for this many seconds
    /// (default 600, as nginx's stream proxy_timeout; 0: never).
    #[arg(long)]
    idle_timeout_secs: Option<u64>,
    /// Serve at most this many connections at once; more wait in the listen queue (default:
    /// what the open-files limit allows, two descriptors per connection).
    #[arg(long)]
    max_connections: Option<u64>,
    /// Serve at most this many connections at once from one client address (an IPv6 client:
    /// its /64; at least 1); more are closed at once (counted in the metrics, the first of
    /// each run logged), as nginx's `limit_conn`. Default: no limit. Not behind a load balancer or server-side
    /// middleboxes, whose connections all come from one address.
    #[arg(long)]
    max_connections_per_client: Option<u64>,
    /// Accept at most this many new connections per second from one client (an IPv4 address
    /// or an IPv6 /64; 1 to 4294967295); more are closed at once (counted in the metrics, the
    /// first of each run logged), as nginx's `limit_req` with `nodelay`. Default: no limit. The
    /// same caveat as for --max-connections-per-client.
    #[arg(long)]
    connection_rate_per_client: Option<u64>,
    /// With --connection-rate-per-client: how many a client may open at once after a pause
    /// (1 to 4294967295; default: one second's worth, the rate).
    #[arg(long)]
    connection_burst_per_client: Option<u64>,
    /// On Ctrl-C or SIGTERM stop accepting and give open connections this many seconds to
    /// end before cutting them (default 10; a second signal cuts them at once).
    #[arg(long)]
    drain_secs: Option<u64>,
    /// Answer Prometheus scrapes (`GET /metrics`, plain HTTP) on this address: connections
    /// accepted, open, ended cleanly or not, with a middlebox taking part, bytes each way,
    /// failed accepts, reloads. Counts only; bind it to loopback or a management network.
    #[arg(long)]
    metrics_listen: Option<String>,
    /// What each line on standard output is: `text` (the default) or `json`, one JSON object
    /// per line (JSON Lines) with its time, for log shippers: sessions with their fields,
    /// reloads, every other line as a notice (docs/mbtls.md §4.9). Fixed at start.
    #[arg(long, value_enum)]
    report_format: Option<ReportFormat>,
}

/// How a service writes its lines on standard output.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
enum ReportFormat {
    Text,
    Json,
}

/// From the config file: a string, named in the error if it is neither (serde's own words for
/// an enum read "unit variant" for an integer, found in a user trial).
impl TryFrom<String> for ReportFormat {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        match s.as_str() {
            "text" => Ok(ReportFormat::Text),
            "json" => Ok(ReportFormat::Json),
            other => Err(format!(
                "report_format is \"text\" or \"json\", not {other:?}"
            )),
        }
    }
}

/// An error about settings that do not parse (exit status 2).
fn does_not_parse(said: String) -> anyhow::Error {
    anyhow::Error::new(crate::subcommand::DoesNotParse(said))
}

/// A role's settings from its merged table (`[mbtls.<role>]` with the flags put in, the
/// service keys taken out). serde names a missing or unknown key; the error adds the flag that
/// gives a missing one, and the service keys, which serde's list of expected keys leaves out.
fn role_settings<T: serde::de::DeserializeOwned>(
    table: toml::Table,
    role: &str,
    config: &MbtlsConfig,
) -> anyhow::Result<T> {
    T::deserialize(toml::Value::Table(table)).map_err(|e| {
        let said = e.to_string();
        let hint = if said.contains("unknown field") {
            format!(
                "; the service keys {} are accepted too",
                Service::KEYS.join(", ")
            )
        } else if let Some(key) = said
            .split("missing field `")
            .nth(1)
            .and_then(|rest| rest.split('`').next())
        {
            format!(
                "; give `{key}` in [mbtls.{role}] or as --{}",
                key.replace('_', "-")
            )
        } else {
            String::new()
        };
        // A key or a value that does not parse, as a config file that does not: exit 2.
        does_not_parse(format!(
            "invalid mbTLS {role} configuration ({}): {}{hint}",
            config.origin(role),
            said.trim_end()
        ))
    })
}

impl Service {
    const KEYS: [&'static str; 9] = [
        "handshake_timeout_secs",
        "idle_timeout_secs",
        "max_connections",
        "max_connections_per_client",
        "connection_rate_per_client",
        "connection_burst_per_client",
        "drain_secs",
        "metrics_listen",
        "report_format",
    ];

    /// Which are given, in the order of [`Self::KEYS`].
    fn given(&self) -> [bool; 9] {
        [
            self.handshake_timeout_secs.is_some(),
            self.idle_timeout_secs.is_some(),
            self.max_connections.is_some(),
            self.max_connections_per_client.is_some(),
            self.connection_rate_per_client.is_some(),
            self.connection_burst_per_client.is_some(),
            self.drain_secs.is_some(),
            self.metrics_listen.is_some(),
            self.report_format.is_some(),
        ]
    }

    /// The first one given, as its flag.
    fn first_flag_given(&self) -> Option<String> {
        Self::KEYS
            .iter()
            .zip(self.given())
            .find_map(|(key, given)| given.then(|| format!("--{}", key.replace('_', "-"))))
    }

    /// Takes the service keys out of `table` (a config-file section); the flags given win.
    fn take_from(
        table: &mut toml::Table,
        flags: &Service,
        origin: &str,
    ) -> anyhow::Result<Service> {
        let mine: toml::Table = Self::KEYS
            .iter()
            .filter_map(|&key| Some((key.to_string(), table.remove(key)?)))
            .collect();
        let file = Service::deserialize(toml::Value::Table(mine)).map_err(|e| {
            does_not_parse(format!(
                "invalid service settings ({}; {origin}): {}",
                Self::KEYS.join(", "),
                e.to_string().trim_end()
            ))
        })?;
        Ok(Service {
            handshake_timeout_secs: flags.handshake_timeout_secs.or(file.handshake_timeout_secs),
            idle_timeout_secs: flags.idle_timeout_secs.or(file.idle_timeout_secs),
            max_connections: flags.max_connections.or(file.max_connections),
            max_connections_per_client: flags
                .max_connections_per_client
                .or(file.max_connections_per_client),
            connection_rate_per_client: flags
                .connection_rate_per_client
                .or(file.connection_rate_per_client),
            connection_burst_per_client: flags
                .connection_burst_per_client
                .or(file.connection_burst_per_client),
            drain_secs: flags.drain_secs.or(file.drain_secs),
            metrics_listen: flags.metrics_listen.clone().or(file.metrics_listen),
            report_format: flags.report_format.or(file.report_format),
        })
    }

    /// Lines on standard output as JSON from now on, if asked, each naming the `service`
    /// listening on `listen`; before the banner.
    fn start_reports(&self, service: &str, listen: SocketAddr) {
        if self.report_format == Some(ReportFormat::Json) {
            crate::json_lines::turn_on(service, listen);
        }
    }

    /// The driver's limits (defaults for what was not given).
    fn limits(&self) -> anyhow::Result<Limits> {
        let mut limits = Limits::default();
        for (name, secs, zero) in [
            ("handshake_timeout_secs", self.handshake_timeout_secs, ""),
            (
                "idle_timeout_secs",
                self.idle_timeout_secs,
                "; 0 for no idle timeout",
            ),
            ("drain_secs", self.drain_secs, "; 0 cuts them at once"),
        ] {
            // Deadlines are instants: far beyond this they overflow the clock (a drain time
            // of 2^64 - 1 s panicked at the stop signal, found in an operator trial).
            if secs.is_some_and(|s| s > MAX_TIMEOUT_SECS) {
                bail!("{name} must be at most {MAX_TIMEOUT_SECS} (a year{zero})");
            }
        }
        match self.handshake_timeout_secs {
            None => {}
            Some(0) => bail!("handshake_timeout_secs must be at least 1"),
            Some(n) => limits.handshake_timeout = Duration::from_secs(n),
        }
        match self.idle_timeout_secs {
            None => {}
            Some(0) => limits.idle_timeout = None,
            Some(n) => limits.idle_timeout = Some(Duration::from_secs(n)),
        }
        limits.max_connections = match self.max_connections {
            None => connections_the_files_limit_allows(),
            Some(0) => bail!("max_connections must be at least 1"),
            Some(n) => Some(connections_the_files_limit_can_take(n)?),
        };
        limits.max_connections_per_client = match self.max_connections_per_client {
            None => None,
            Some(0) => bail!("max_connections_per_client must be at least 1"),
            // More than fits in memory is no limit.
            Some(n) => Some(usize::try_from(n).unwrap_or(usize::MAX)),
        };
        // A typo's number is refused, not quietly taken as the largest that fits.
        let per_client = |name: &str, n: u64| -> anyhow::Result<u32> {
            match u32::try_from(n) {
                Ok(0) => bail!("{name} must be at least 1"),
                Ok(n) => Ok(n),
                Err(_) => bail!("{name} must be at most {}", u32::MAX),
            }
        };
        limits.connection_rate_per_client = match (
            self.connection_rate_per_client,
            self.connection_burst_per_client,
        ) {
            (None, None) => None,
            (None, Some(_)) => {
                bail!("connection_burst_per_client needs connection_rate_per_client")
            }
            (Some(rate), burst) => Some(ConnectionRate {
                per_second: per_client("connection_rate_per_client", rate)?,
                burst: per_client("connection_burst_per_client", burst.unwrap_or(rate))?,
            }),
        };
        Ok(limits)
    }

    /// How long open connections get after the first stop signal.
    fn drain_grace(&self) -> Duration {
        Duration::from_secs(self.drain_secs.unwrap_or(10))
    }
}

fn default_side() -> String {
    "client".into()
}
fn default_server_listen() -> String {
    "127.0.0.1:9443".into()
}

fn default_listen() -> String {
    "127.0.0.1:8443".into()
}
fn default_app() -> String {
    "passthrough".into()
}
fn default_attester() -> String {
    "none".into()
}

/// `config_path`: the `--config` file, read again by a middlebox, a server or a client proxy on
/// SIGHUP.
pub fn run(
    args: MbtlsArgs,
    config: &MbtlsConfig,
    config_path: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    match args.command {
        MbtlsCommand::Client(flags) => client(flags, config, config_path),
        MbtlsCommand::Middlebox(flags) => middlebox(flags, config, config_path),
        MbtlsCommand::Server(flags) => server(flags, config, config_path),
        MbtlsCommand::CheckRequest(flags) => check_request(flags),
        MbtlsCommand::Demo(flags) => {
            crate::subcommand::exit_quietly_when_stdout_closes();
            let names = if flags.versions.is_empty() {
                vec!["1.3".to_string(), "1.2".to_string()]
            } else {
                flags.versions
            };
            let versions = names
                .iter()
                .map(|v| parse_version(v.trim()))
                .collect::<anyhow::Result<Vec<_>>>()?;
            let versions = crate::subcommand::each_once(versions);
            runtime()?.block_on(crate::mbtls_demo::run(&versions, Duration::ZERO))?;
            println!("\nAll checks passed.");
            Ok(())
        }
    }
}

/// The TLS versions a service takes (`tls`: its `--tls`), as its banner and reload lines say.
fn versions_shown(tls: Option<&str>) -> String {
    match tls {
        Some(v) => format!("TLS {v} only"),
        None => "TLS 1.2 and 1.3".to_string(),
    }
}

pub(crate) fn version_name(v: TlsVersion) -> &'static str {
    match v {
        TlsVersion::Tls12 => "TLS 1.2",
        TlsVersion::Tls13 => "TLS 1.3",
    }
}

fn fp(h: &HopFingerprint) -> String {
    format!(
        "c2s {} s2c {}",
        fingerprint_hex(&h.c2s),
        fingerprint_hex(&h.s2c)
    )
}

/// A session's hops in a report line.
fn hops_text(hops: &[HopFingerprint]) -> String {
    hops.iter().map(fp).collect::<Vec<_>>().join(" | ")
}

/// How a connection ended, as a report line ends.
fn outcome_text(outcome: &Result<(), String>) -> String {
    match outcome {
        Ok(()) => "; closed cleanly".into(),
        Err(e) => format!("; ended with error: {e}"),
    }
}

/// [`outcome_text`] for a session spliced with a plain connection, which may end without the
/// peer's close_notify (`peer`: who left so; `plain`: the connection reset for it).
fn spliced_outcome_text(
    outcome: &Result<(), String>,
    left_without_close_notify: bool,
    (peer, plain): (&str, &str),
) -> String {
    let left = left_without_close_notify.then(|| {
        format!("the {peer} without close_notify after ours (the {plain} connection was reset)")
    });
    left_outcome_text(outcome, left)
}

/// [`outcome_text`], or for a session that ended without an error but with a peer leaving
/// without close_notify, `"; closed, {left}"` (`left`: who left so, and what followed).
fn left_outcome_text(outcome: &Result<(), String>, left: Option<String>) -> String {
    match (outcome, left) {
        (Ok(()), Some(left)) => format!("; closed, {left}"),
        _ => outcome_text(outcome),
    }
}

/// `https://host[:port]/path[?query][#fragment]` → (host, host header, path and query). The
/// scheme is read case-insensitively; the fragment is the client's alone and is not sent.
fn parse_url(url: &str) -> anyhow::Result<(String, String, String)> {
    let rest = url
        .get(..8)
        .filter(|scheme| scheme.eq_ignore_ascii_case("https://"))
        .and_then(|_| url.get(8..))
        .with_context(|| format!("URL {url:?} must start with https://"))?;
    let rest = rest.split_once('#').map_or(rest, |(before, _)| before);
    let (authority, path) = match rest.find(['/', '?']) {
        Some(i) if rest[i..].starts_with('?') => (&rest[..i], format!("/{}", &rest[i..])),
        Some(i) => (&rest[..i], rest[i..].to_owned()),
        None => (rest, "/".to_owned()),
    };
    ensure!(
        !authority.contains('@'),
        "URL {url:?}: a user name or password in the URL is not supported"
    );
    ensure!(
        !authority.starts_with('['),
        "URL {url:?}: an IPv6 address is not supported as the server's name; give a name its \
         certificate carries, and reach the address with --middlebox"
    );
    let host = match authority.split_once(':') {
        Some((h, port)) => {
            ensure!(
                is_port(port),
                "URL {url:?}: the port must be a number from 1 to 65535"
            );
            h
        }
        None => authority,
    };
    ensure!(
        !host.is_empty()
            && host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-'),
        "URL {url:?} has no usable host name (letters, digits, dots and hyphens)"
    );
    ensure!(
        path.bytes().all(|b| b.is_ascii_graphic()),
        "URL {url:?}: the path must be visible ASCII"
    );
    // A fully qualified name's final dot names the same host: the certificate and SNI carry
    // the name without it (curl does the same; found in a user trial).
    let host = host
        .strip_suffix('.')
        .filter(|h| !h.is_empty())
        .unwrap_or(host);
    Ok((host.to_owned(), authority.to_owned(), path))
}

/// What a service's attestation policy accepts, for its banner; it says so when no middlebox
/// can pass it (evidence required and no measurement accepted), which every session with a
/// required middlebox would otherwise show only by failing.
fn policy_line(p: &Policy) -> String {
    let evidence = if p.required {
        "evidence required"
    } else {
        "evidence optional"
    };
    let simulated = match (p.allow_simulated, p.sim_platform_keys.len()) {
        (false, _) => "simulated TEE refused".to_string(),
        (true, n) => format!(
            "simulated TEE accepted from {}",
            count_of(n as u64, "platform keys")
        ),
    };
    let mut line = format!(
        "attestation policy: {evidence}, {} accepted, {simulated}",
        count_of(p.measurements.len() as u64, "measurements")
    );
    match (p.certificate_evidence, p.certificate_nonces.len()) {
        (false, _) => {}
        (true, 0) => line.push_str(", evidence in certificates accepted (any nonce)"),
        (true, n) => line.push_str(&format!(
            ", evidence in certificates accepted ({})",
            count_of(n as u64, "nonces")
        )),
    }
    if p.refuses_every_middlebox() {
        line.push_str(
            "; WARNING: no middlebox can pass it (no measurement is accepted: give \
             --measurement, or a policy file or [attestation] table)",
        );
    }
    line
}

/// The attestation policy from a file or an inline table, plus the flags' additions.
struct PolicyParts<'a> {
    file: &'a Option<PathBuf>,
    table: &'a Option<toml::Table>,
    allow_simulated: bool,
    measurements: &'a [String],
    sim_platform_keys: &'a [String],
}

fn client_policy(s: &ClientSettings) -> anyhow::Result<Policy> {
    build_policy(PolicyParts {
        file: &s.policy,
        table: &s.attestation,
        allow_simulated: s.allow_simulated,
        measurements: &s.measurements,
        sim_platform_keys: &s.sim_platform_keys,
    })
}

fn build_policy(s: PolicyParts<'_>) -> anyhow::Result<Policy> {
    let mut policy = match (s.file, s.table) {
        (Some(_), Some(_)) => bail!("give the attestation policy as a file or a table, not both"),
        (Some(path), None) => {
            let text = String::from_utf8(read_file(path, "policy file")?)
                .context("policy file is not UTF-8")?;
            Policy::from_toml_str(&text)
                .map_err(|e| does_not_parse(format!("invalid policy {}: {e}", path.display())))?
        }
        (None, Some(table)) => Policy::from_toml_str(&toml::to_string(table)?).map_err(|e| {
            let e = e.to_string();
            // A key appended at the end of a file lands in its last table (found in a user
            // trial: `drain_secs` after `[mbtls.server.attestation]`).
            let hint = if e.contains("unknown field") {
                " (a key belongs to the table whose header is above it: a setting of the role \
                 itself goes above its attestation table)"
            } else {
                ""
            };
            does_not_parse(format!(
                "invalid attestation table in the config file ([mbtls.<role>.attestation]): {e}{hint}"
            ))
        })?,
        (None, None) => Policy::default(),
    };
    if s.allow_simulated {
        policy.allow_simulated = true;
    }
    for m in s.measurements {
        policy
            .measurements
            .push(HexBytes::from_hex(m).with_context(|| {
                format!("measurement {m:?} (--measurement, or `measurements` in the file)")
            })?);
    }
    for k in s.sim_platform_keys {
        let key = HexBytes::from_hex(k).map_err(|_| {
            // The middlebox's flag of the same name is its key file.
            let file = if std::path::Path::new(k).exists() {
                " (a file: that is the middlebox's --sim-platform-key; an endpoint takes the \
                 public key the middlebox prints, in hex)"
            } else {
                ""
            };
            anyhow::anyhow!(
                "a simulated platform key (--sim-platform-key, or `sim_platform_keys` in the \
                 file) is the platform's public key in hex, not {k:?}{file}"
            )
        })?;
        policy.sim_platform_keys.push(key);
    }
    // The error names the policy itself ("invalid attestation policy: …").
    policy.validate()?;
    Ok(policy)
}

/// A client's configuration from its flags over the config file, for one fetch or for every
/// connection a proxy accepts until a reload.
struct ClientSetup {
    cfg: ClientHandshakeConfig,
    /// What `cfg.primary` and `cfg.secondary` were built from (a reload compares them with the
    /// running ones').
    primary_tls: TlsConfig,
    secondary_tls: TlsConfig,
    s: ClientSettings,
    /// Pre-configured middleboxes in path order; empty with discovery or none.
    names: Vec<String>,
    first_hop: String,
    server_name: String,
    authority: String,
    path: String,
}

impl ClientSetup {
    /// What a proxy's reload line and banner show: where its sessions go, its middleboxes, its
    /// TLS versions and what it resumes, and the policy its middleboxes must pass.
    fn shown_parts(&self) -> [Part; 4] {
        let s = &self.s;
        let middleboxes = if s.no_client_middleboxes {
            "no middlebox of its own".to_string()
        } else if self.names.is_empty() {
            format!(
                "discovered middleboxes, approved if named {}",
                s.allow_middleboxes.join(" or ")
            )
        } else {
            format!("middleboxes {}", self.names.join(" -> "))
        };
        let policy = match s.no_client_middleboxes {
            true => "no policy (no middlebox of its own)".to_string(),
            false => policy_line(&self.cfg.policy),
        };
        let sessions = format!("sessions to {} via {}", self.server_name, self.first_hop);
        // Found in a user trial: a reload that changed these took effect unmarked.
        // Only pre-configured middleboxes' sessions are resumed (discovered ones have no
        // name to keep them under; docs/mbtls.md §4.7): the banner said "resumed" for all
        // (found in an operator trial).
        let middlebox_sessions = match (s.no_client_middleboxes, self.names.is_empty()) {
            (true, _) => String::new(),
            (false, true) => ", discovered middleboxes' sessions not resumed".into(),
            (false, false) => match s.middlebox_resumption {
                Some(false) => ", fresh evidence every session".into(),
                _ => ", middlebox sessions resumed".into(),
            },
        };
        let tls = format!(
            "{}, {}{middlebox_sessions}",
            versions_shown(s.tls.as_deref()),
            match s.resume {
                Some(false) => "sessions not resumed",
                _ => "sessions resumed",
            },
        );
        // The server's CA with where the sessions go; the middleboxes' with the policy.
        let server_ca = trust_key(&[&self.primary_tls]);
        let policy_key = format!(
            "{:?} {}",
            self.cfg.policy,
            trust_key(&[&self.secondary_tls])
        );
        [
            (
                sessions.clone(),
                format!("{sessions} {server_ca}"),
                " (changed)",
            ),
            part(middleboxes, " (changed)"),
            part(tls, " (changed)"),
            (policy, policy_key, " (changed)"),
        ]
    }
}

fn client(
    flags: ClientFlags,
    config: &MbtlsConfig,
    config_path: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    let proxy = flags.proxy.clone();
    if proxy.is_some() {
        // Before the settings: the default connection limit follows the open-files limit (a
        // reload would otherwise find a higher one and change the limit by itself).
        raise_open_files_limit();
    }
    let setup = client_setup(flags.clone(), config)?;
    if let Some(listen) = proxy {
        // The listening address is a flag only, so a reload cannot move it.
        let running = setup.s.service.clone();
        let running_primary = RunningContext::new(&setup.primary_tls, &(), &setup.cfg.primary);
        let running_secondary = RunningContext::new(
            &setup.secondary_tls,
            &setup.cfg.policy,
            &setup.cfg.secondary,
        );
        let parts = setup.shown_parts();
        let shown = ShownParts::new(&parts);
        let reload = || {
            let new = client_setup(flags.clone(), &reread(config, config_path)?)?;
            fixed_at_start_unchanged((&listen, &running), (&listen, &new.s.service))?;
            let parts = new.shown_parts();
            let (primary_tls, secondary_tls) = (new.primary_tls.clone(), new.secondary_tls.clone());
            let mut cfg = proxy_config(new)?;
            // Remembered once nothing more can fail.
            cfg.check()?;
            let line = shown.reloaded(&parts);
            let hs = &mut cfg.handshake;
            running_primary.keep_unless_changed(primary_tls, (), &mut hs.primary);
            let policy = hs.policy.clone();
            running_secondary.keep_unless_changed(secondary_tls, policy, &mut hs.secondary);
            Ok((cfg, line))
        };
        // The banner shows what a reload's line does (found in a user trial: a log never
        // recorded the middleboxes, versions or policy the proxy started with).
        let shown_at_start = parts.map(|(text, _, _)| text).join("; ");
        return local_proxy(
            (&listen, &shown_at_start),
            proxy_config(setup)?,
            &running,
            &reload,
        );
    }
    let ClientSetup {
        cfg,
        s,
        names,
        first_hop,
        server_name,
        authority,
        path,
        ..
    } = setup;
    // `-o -` is standard output, as for curl; a body file that cannot be created is found
    // before the request goes out, not once the body comes.
    let output = flags.output.filter(|path| path.as_os_str() != "-");
    if let Some(path) = &output {
        crate::response_out::check_body_file(path)?;
    }
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {authority}\r\nUser-Agent: mbx-mbtls\r\nConnection: close\r\n\r\n"
    );
    let bound = Duration::from_secs(s.timeout_secs.unwrap_or(30));
    let middlebox_addr = first_hop;
    // A body file is created only when the body begins (a failed fetch leaves it alone).
    // Every line of the report goes through `out`: a reader of standard output that goes
    // away ends a fetch to standard output, but not one into a file.
    let mut out = ResponseOut::new(output.as_deref());
    // A file-size limit (`ulimit -f`) makes a write fail (EFBIG, said as any write error)
    // rather than kill the process without a word: the signal is taken, and dropped, from
    // before the first line is written.
    let runtime = runtime()?;
    let xfsz = tokio::signal::unix::SignalKind::from_raw(rustix::process::Signal::XFSZ.as_raw());
    let _file_size_limit = {
        let _entered = runtime.enter();
        tokio::signal::unix::signal(xfsz)
    };
    let path_names = if s.no_client_middleboxes {
        let line = "no client-side middleboxes: the session's keys stay inside OpenSSL\n";
        if !out.report(line)? {
            return Ok(());
        }
        Some(Vec::new())
    } else if names.is_empty() {
        let line = format!(
            "discovery: a middlebox on the path may join if its certificate names {}\n",
            s.allow_middleboxes.join(" or ")
        );
        if !out.report(&line)? {
            return Ok(());
        }
        None
    } else {
        Some(names.clone())
    };
    let raise = "raise --timeout-secs";
    runtime.block_on(async move {
        let discovered_at_most = match cfg.middlebox {
            ClientMiddlebox::DiscoverUpTo(_, n) => Some(n),
            _ => None,
        };
        let mut progress = HandshakeProgress::default();
        let connect = MbtlsClient::connect_with_progress(
            middlebox_addr.as_str(),
            cfg,
            request.as_bytes(),
            &mut progress,
        );
        let connected = tokio::time::timeout(bound, connect).await;
        let mut c = connected
            .map_err(|_| {
                // What the handshake waited for names the party that stopped answering (an
                // independent implementer's middlebox that sent no evidence message read
                // only "something on the path").
                let who = progress.waiting_for.as_deref().map_or_else(
                    || "something on the path stopped answering".to_string(),
                    |w| format!("it was waiting for {w}"),
                );
                anyhow::anyhow!(
                    "the mbTLS session through {middlebox_addr} was not set up within {} s \
                     ({who}; {raise} if the path is slow)",
                    bound.as_secs()
                )
            })?
            // The driver's message names every cause already: no source chain on top.
            .map_err(|e| {
                let hint = client_hint(&e);
                anyhow::anyhow!("mbTLS session through {middlebox_addr} failed: {e}{hint}")
            })?;
        let mut report = session_text(&c, path_names.as_deref(), &middlebox_addr, &server_name);
        if let Some(note) = discovered_at_most.and_then(|n| discovery_note(c.verdicts(), n)) {
            report.push_str(&note);
        }
        if !out.report(&report)? {
            return Ok(());
        }
        // Each piece as it comes, within the bound of the previous one: a long download goes
        // on as long as it moves. Once the body is whole by its framing, the server's close
        // is waited for only briefly: a server that keeps the connection open (it ignored
        // `Connection: close`) has said everything all the same.
        loop {
            let ended = out.body_ended();
            let wait = if ended {
                bound.min(BODY_END_GRACE)
            } else {
                bound
            };
            let piece = match tokio::time::timeout(wait, c.read()).await {
                Err(_) if ended => break,
                // The body is whole and authenticated: how the session ended after it changes
                // nothing in it.
                Ok(Err(e)) if ended => {
                    eprintln!(
                        "mbx: note: the body came whole; after it, {}",
                        crate::subcommand::escape_controls(&e.to_string(), false)
                    );
                    break;
                }
                read => read,
            };
            let piece = piece
                .map_err(|_| {
                    anyhow::anyhow!(
                        "the response stopped: nothing came for {} s ({raise}){}",
                        bound.as_secs(),
                        out.partial_note()
                    )
                })?
                .map_err(|e| {
                    let hint = ended_behind_hint(&e);
                    let partial = out.partial_note();
                    anyhow::anyhow!("reading the response failed: {e}{hint}{partial}")
                })?;
            let Some(piece) = piece else { break };
            if !out.push(&piece)? {
                // The body's reader (standard output) went away: nothing more is wanted.
                return Ok(());
            }
        }
        // Best effort: the server ended its direction, or the body is whole.
        let _ = c.close().await;
        out.finish()
    })
}

/// How long a fetch whose body came whole by its framing waits for the server's close before
/// it closes itself.
const BODY_END_GRACE: Duration = Duration::from_secs(2);

/// A port: digits only (`+443` would parse), 1 to 65535.
fn is_port(port: &str) -> bool {
    port.bytes().all(|b| b.is_ascii_digit()) && port.parse::<u16>().is_ok_and(|p| p != 0)
}

/// An address used only when a connection comes (a next hop, a backend, a first hop), checked
/// at the start: `host:port`, the host a name, an IPv4 address or an IPv6 address in brackets.
fn check_host_port(setting: &str, addr: &str) -> anyhow::Result<()> {
    let example = "e.g. 127.0.0.1:8080, backend.example:80 or [::1]:8080";
    let (host, port) = addr
        .rsplit_once(':')
        .with_context(|| format!("{setting} {addr:?} has no port: give host:port ({example})"))?;
    ensure!(
        is_port(port),
        "{setting} {addr:?}: the port must be a number from 1 to 65535 ({example})"
    );
    // An IPv6 address must be one the connection can use (a zone, if any, by number).
    let bracketed = host.starts_with('[') && addr.parse::<std::net::SocketAddr>().is_ok();
    ensure!(
        !host.is_empty() && (bracketed || !host.contains([':', '[', ']'])),
        "{setting} {addr:?}: give host:port, an IPv6 address in brackets ({example})"
    );
    Ok(())
}

/// The first hop only passes a close or a reset on (in the handshake too, e.g. when the
/// server behind a middlebox is down): who ended the session, and why, is in the
/// middleboxes' and the server's reports.
fn ended_behind_hint(e: &mbx_mbtls::driver::DriverError) -> String {
    use mbx_mbtls::driver::DriverError;
    const ENDED_BEHIND: &str = "; a middlebox or the server ended the session (their report \
         lines say why; a process that was killed leaves none";
    let ended_behind = e.ended_on_the_path();
    if let DriverError::Alert { description, .. } = e {
        if *description == mbx_engine::AlertDescription::HANDSHAKE_FAILURE.0 && ended_behind {
            return SERVER_REFUSED_ITS_MIDDLEBOX.into();
        }
    }
    match (ended_behind, e) {
        (false, _) => String::new(),
        (true, DriverError::Alert { .. }) => format!("{ENDED_BEHIND})"),
        // A close or a reset: also what a hop that refuses this address sends.
        (true, _) => format!(
            "{ENDED_BEHIND}, and one that refused this address for its \
             max_connections_per_client or connection_rate_per_client only a warning in its \
             log)"
        ),
    }
}

/// A `handshake_failure` alert from the path: what an mbTLS server sends when it refuses or
/// misses one of its own middleboxes (TLS 1.3: after the client's handshake looked done, since
/// the server's Finished left first; found in a user trial, where nothing said so).
const SERVER_REFUSED_ITS_MIDDLEBOX: &str = "; from an mbTLS server, handshake_failure may mean \
     it refused or missed one of its own (server-side) middleboxes: the server's report line \
     says why";

/// What would fix a refusal: the flag that would accept what a middlebox's evidence showed,
/// when the policy refused it for a reason one flag changes (an operator setting up a client
/// meets these one at a time), or where a middlebox that did not join belongs.
fn fix_hint(e: &mbx_mbtls::driver::DriverError, role: mbx_engine::Role) -> String {
    use mbx_mbtls::driver::DriverError;
    use mbx_mbtls::handshake::HandshakeError;
    let DriverError::Handshake(h) = e else {
        return String::new();
    };
    if matches!(h.cause(), HandshakeError::NotJoined { .. }) {
        return match role {
            mbx_engine::Role::Client => {
                " (the client's middleboxes are started without \
                 --server-side, and --middlebox is the address of the first one)"
            }
            mbx_engine::Role::Server => {
                " (clients must reach this server through its \
                 middleboxes, which are started with --server-side and --next-hop this server)"
            }
        }
        .into();
    }
    // What the TLS libraries found wrong with a certificate, for what an operator most likely
    // got wrong.
    let problem = h.certificate_problem();
    let named = matches!(h, HandshakeError::Middlebox { .. });
    let name_mismatch = problem == Some(mbx_engine::CertificateProblem::NameMismatch);
    // A middlebox named by default after the address of --middlebox (found in a user trial).
    let named_by_address = matches!(h, HandshakeError::Middlebox { name, .. }
        if name.parse::<std::net::IpAddr>().is_ok());
    if role == mbx_engine::Role::Client && named_by_address && name_mismatch {
        return " (without --middlebox-name a middlebox is named after the host of --middlebox, \
                 here an address: give --middlebox-name with a name its certificate carries)"
            .into();
    }
    if role == mbx_engine::Role::Client && named && name_mismatch {
        // The library's error already says to check the path's names and their order.
        return " (a middlebox is expected under its --middlebox-name, or without one under \
                 the host of --middlebox)"
            .into();
    }
    // A chain that reaches none of the trusted CAs: which certificate, and which setting
    // names the CAs (found in a user trial: the error named neither).
    let unknown_issuer = problem == Some(mbx_engine::CertificateProblem::UnknownIssuer);
    match (unknown_issuer, named, role) {
        (true, true, mbx_engine::Role::Client) => {
            return " (the middlebox's certificate does not chain to a CA of --middlebox-ca, \
                     which is --server-ca unless given)"
                .into()
        }
        (true, true, mbx_engine::Role::Server) => {
            return " (the middlebox's certificate does not chain to a CA of --middlebox-ca)".into()
        }
        (true, false, mbx_engine::Role::Client) => {
            return " (the server's certificate does not chain to a CA of --server-ca)".into()
        }
        _ => {}
    }
    if role == mbx_engine::Role::Client && !named && name_mismatch {
        return " (the server's certificate is not for the URL's host name)".into();
    }
    let version_alert =
        |a: &mbx_engine::AlertDescription| *a == mbx_engine::AlertDescription::PROTOCOL_VERSION;
    let no_shared_version = match h.cause() {
        HandshakeError::Engine(mbx_engine::EngineError::AlertReceived { alert }) => {
            version_alert(alert)
        }
        HandshakeError::Engine(mbx_engine::EngineError::Fatal { alert, .. }) => {
            alert.as_ref().is_some_and(version_alert)
        }
        _ => false,
    };
    if no_shared_version {
        return " (the two ends share no TLS version: see --tls, or tls in the config file, \
                 on each endpoint; middleboxes take the version the endpoints agree on)"
            .into();
    }
    // The primary session's alert only: one on a secondary session came from one of the
    // client's own middleboxes.
    if role == mbx_engine::Role::Client
        && !named
        && matches!(
            h.cause(),
            HandshakeError::Engine(mbx_engine::EngineError::AlertReceived { alert })
                if *alert == mbx_engine::AlertDescription::HANDSHAKE_FAILURE
        )
    {
        return SERVER_REFUSED_ITS_MIDDLEBOX.into();
    }
    let HandshakeError::Attestation(a) = h.cause() else {
        return String::new();
    };
    attestation_hint(a)
}

/// What a client (the one-shot fetch, the proxy's report line and its 502) says after a
/// failed session's error: which reports tell why, and what would fix it.
fn client_hint(e: &mbx_mbtls::driver::DriverError) -> String {
    ended_behind_hint(e) + &fix_hint(e, mbx_engine::Role::Client)
}

/// `--nonce` as bytes.
fn nonce_flag(hex_text: &str) -> anyhow::Result<Vec<u8>> {
    hex::decode(hex_text.trim()).context("--nonce must be hex")
}

/// What would make a policy accept evidence that `a` refused, for the operator (empty when
/// nothing simple would).
fn attestation_hint(a: &AttestError) -> String {
    match a {
        // All it will take at once (a newcomer met them one run at a time), the values from
        // the middlebox's own banner rather than from evidence not yet checked.
        AttestError::SimulatedNotAllowed => " (to accept a simulated TEE, for a demo or a test \
             only: --allow-simulated, with --sim-platform-key and --measurement as the \
             middlebox's \"attestation:\" line shows them)"
            .into(),
        AttestError::UntrustedPlatformKey(key) => {
            format!(" (to trust that simulated platform: --sim-platform-key {key})")
        }
        AttestError::MeasurementNotAllowed(m) => {
            format!(" (to accept that code: --measurement {m})")
        }
        AttestError::NoMeasurementsConfigured => {
            " (give the code measurements to accept: --measurement, or a policy)".into()
        }
        AttestError::EvidenceRequired => " (the middlebox sends no evidence: start it with \
             --attester, or accept middleboxes without evidence with a policy whose \
             [attestation] has required = false)"
            .into(),
        _ => String::new(),
    }
}

fn client_setup(flags: ClientFlags, config: &MbtlsConfig) -> anyhow::Result<ClientSetup> {
    let mut table = config.client.clone();
    set(&mut table, "middlebox", flags.middlebox);
    flags_choice_replaces_the_files(
        &mut table,
        !flags.middlebox_names.is_empty(),
        !flags.allow_middleboxes.is_empty(),
        flags.max_discovered.is_some(),
        flags.no_client_middleboxes,
    );
    match flags.middlebox_names.as_slice() {
        [] => {}
        [one] => set(&mut table, "middlebox_name", Some(one.clone())),
        _ => {
            table.insert(
                "middlebox_names".into(),
                toml::Value::Array(
                    flags
                        .middlebox_names
                        .iter()
                        .cloned()
                        .map(toml::Value::String)
                        .collect(),
                ),
            );
        }
    }
    set(&mut table, "server_ca", path_str(flags.server_ca));
    set(&mut table, "middlebox_ca", path_str(flags.middlebox_ca));
    flags.attestation.merge_into(&mut table);
    set(&mut table, "tls", flags.tls);
    if flags.no_client_middleboxes {
        table.insert("no_client_middleboxes".into(), toml::Value::Boolean(true));
    }
    if flags.no_resume {
        table.insert("resume".into(), toml::Value::Boolean(false));
    }
    if flags.fresh_evidence {
        table.insert("middlebox_resumption".into(), toml::Value::Boolean(false));
    }
    append_to_list(&mut table, "allow_middleboxes", flags.allow_middleboxes);
    if let Some(n) = flags.max_discovered {
        table.insert("max_discovered".into(), toml::Value::Integer(i64::from(n)));
    }
    set_secs(&mut table, "timeout_secs", flags.timeout_secs)?;
    // The config file's service keys serve the proxy and are ignored when fetching (one file
    // may serve both); the flags make no sense without --proxy.
    if let (None, Some(flag)) = (&flags.proxy, flags.service.first_flag_given()) {
        bail!("{flag} applies to the client as a proxy (--proxy) only");
    }
    if flags.proxy.is_none() && flags.no_resume {
        bail!("--no-resume applies to the client as a proxy (--proxy) only");
    }
    // A proxy's sessions are bounded by its service settings instead (a file's timeout_secs
    // serves its fetches and is left alone).
    if flags.proxy.is_some() && flags.output.is_some() {
        bail!("--output takes one fetch's body; a proxy passes each response on to its client");
    }
    if flags.proxy.is_some() && flags.timeout_secs.is_some() {
        bail!(
            "--timeout-secs bounds one fetch; a proxy's sessions are bounded by \
             --handshake-timeout-secs and --idle-timeout-secs"
        );
    }
    let service = Service::take_from(&mut table, &flags.service, &config.origin("client"))?;
    let mut s: ClientSettings = role_settings(table, "client", config)?;
    s.service = service;
    // 0 would fail every fetch at once (the services' timeouts refuse it too); a proxy
    // ignores the file's value.
    if let Some(t) = s.timeout_secs.filter(|_| flags.proxy.is_none()) {
        ensure!(
            (1..=MAX_TIMEOUT_SECS).contains(&t),
            "timeout_secs (--timeout-secs) must be from 1 to {MAX_TIMEOUT_SECS} (a year)"
        );
    }

    let (server_name, authority, path) =
        parse_url(&flags.url).map_err(|e| does_not_parse(e.to_string()))?;
    // Pre-configured names in path order, or discovery with an allow-list.
    let names: Vec<String> = match (&s.middlebox_name, s.middlebox_names.is_empty()) {
        (Some(_), false) => bail!("give middlebox_name or middlebox_names, not both"),
        (Some(n), true) => vec![n.clone()],
        (None, false) => s.middlebox_names.clone(),
        (None, true) if s.allow_middleboxes.is_empty() && !s.no_client_middleboxes => {
            let addr = s
                .middlebox
                .as_deref()
                .context("give --middlebox (and --middlebox-name), --allow-middlebox, or --no-client-middleboxes")?;
            vec![addr
                .rsplit_once(':')
                .map(|(h, _)| h.to_owned())
                .unwrap_or_else(|| addr.to_owned())]
        }
        (None, true) => Vec::new(),
    };
    check_middlebox_names(&s.middlebox_names, "middlebox_names (--middlebox-name)")?;
    check_middlebox_names(
        s.middlebox_name.as_slice(),
        "middlebox_name (--middlebox-name)",
    )?;
    check_middlebox_names(
        &s.allow_middleboxes,
        "allow_middleboxes (--allow-middlebox)",
    )?;
    ensure!(
        names.len() <= usize::from(u8::MAX),
        "at most 255 pre-configured middleboxes (middlebox_names, --middlebox-name): one \
         subchannel each"
    );
    ensure!(
        names.is_empty() || s.allow_middleboxes.is_empty(),
        "pre-configured middleboxes and a discovery allow-list do not mix"
    );
    max_discovered_only_for_discovery(&names, s.max_discovered)?;
    ensure!(
        !s.no_client_middleboxes
            || (names.is_empty() && s.allow_middleboxes.is_empty() && s.max_discovered.is_none()),
        "no_client_middleboxes excludes middlebox names, an allow-list and max_discovered"
    );
    let first_hop = match &s.middlebox {
        Some(m) => {
            check_host_port("middlebox (--middlebox)", m)?;
            m.clone()
        }
        None if names.is_empty() => {
            if authority.contains(':') {
                authority.clone()
            } else {
                format!("{authority}:443")
            }
        }
        None => bail!("pre-configured middleboxes need --middlebox (the first one's address)"),
    };
    let version = s.tls.as_deref().map(parse_version).transpose()?;
    let policy = client_policy(&s)?;
    let server_ca = read_pem_file(&s.server_ca, "server CA file", PemKind::Certificates)?;
    let mbox_ca = match &s.middlebox_ca {
        Some(p) => read_pem_file(p, "middlebox CA file", PemKind::Certificates)?,
        None => server_ca.clone(),
    };
    let mut primary = primary_client_config(&server_name, server_ca);
    if let Some(v) = version {
        primary = primary.only(v);
    }
    // Without client-side middleboxes nothing is exported: OpenSSL keeps the session and skips
    // its key log (docs/mbtls.md §6).
    primary.exportable = !s.no_client_middleboxes;
    // A proxy meets the same server on every connection: it resumes the last session (one
    // name; see docs/mbtls.md §4.6). A fetch makes one connection and has nothing to resume.
    if flags.proxy.is_some() && s.resume.unwrap_or(true) {
        primary.resume_sessions = 1;
    }
    let secondary = secondary_config(mbox_ca, s.middlebox_resumption);
    let middlebox = match names.as_slice() {
        [] if s.no_client_middleboxes => ClientMiddlebox::Disabled,
        [] => ClientMiddlebox::DiscoverUpTo(
            name_approver(s.allow_middleboxes.clone()),
            max_discovered(s.max_discovered)?,
        ),
        [one] => ClientMiddlebox::Preconfigured(one.clone()),
        _ => ClientMiddlebox::PreconfiguredPath(names.clone()),
    };
    let cfg = ClientHandshakeConfig {
        primary: Arc::new(OpenSslContext::new(&primary).context("client TLS configuration")?),
        server_name: server_name.clone(),
        secondary: Arc::new(
            RustlsClientContext::new(&secondary).context("middlebox TLS configuration")?,
        ),
        middlebox,
        policy,
        // Replaced by the time of each connection (`MbtlsClient::connect`).
        now_unix: 0,
    };
    Ok(ClientSetup {
        cfg,
        primary_tls: primary,
        secondary_tls: secondary,
        s,
        names,
        first_hop,
        server_name,
        authority,
        path,
    })
}

/// The client's last hop: it cannot see past the server's name, and a server-side middlebox
/// there holds the same keys (its server chose it, and checked it).
const BRIDGE: &str = "primary session keys, also held by any middlebox on the server's side";

/// `names`: the pre-configured middleboxes in path order; `None` with discovery (the session
/// names those that joined, by their certificates).
fn session_text(
    c: &MbtlsClient,
    names: Option<&[String]>,
    first_hop: &str,
    server: &str,
) -> String {
    let mut out = String::new();
    let discovered = c
        .summary()
        .map(|s| s.middleboxes.clone())
        .unwrap_or_default();
    let preconfigured = names.is_some();
    let names = names.unwrap_or(&discovered);
    line(&mut out, path_text(names, preconfigured, first_hop, server));
    if let Some(sum) = c.summary() {
        line(
            &mut out,
            format!("{}, {}", version_name(sum.version), sum.suite.name()),
        );
        let labels: Vec<String> = if sum.middlebox_joined() {
            let mut nodes = vec!["client".to_string()];
            nodes.extend(names.iter().cloned());
            nodes.push(server.to_string());
            nodes
                .windows(2)
                .enumerate()
                .map(|(i, w)| {
                    let what = if i + 2 == nodes.len() {
                        BRIDGE
                    } else {
                        "fresh keys"
                    };
                    format!("{} <-> {} ({what})", w[0], w[1])
                })
                .collect()
        } else {
            vec![format!("client <-> {server} ({BRIDGE})")]
        };
        for (i, (hop, name)) in sum.hops.iter().zip(&labels).enumerate() {
            line(&mut out, format!("hop {}: {name}: {}", i + 1, fp(hop)));
        }
        if sum.hops.is_empty() {
            if let Some(name) = labels.first() {
                line(
                    &mut out,
                    format!("hop 1: {name}: no fingerprint, the keys never left OpenSSL"),
                );
            }
        }
    }
    // The client knows only its own side: a server-side middlebox may well have joined.
    if c.verdicts().is_empty() {
        line(
            &mut out,
            "attestation: no client-side middlebox took part".into(),
        );
    }
    for v in c.verdicts_in_path_order() {
        // An exclusion may have nothing to do with attestation (an allow-list, a late answer).
        let label = match v {
            MiddleboxVerdict::Excluded { .. } => "middlebox",
            _ => "attestation",
        };
        line(&mut out, format!("{label}: {}", verdict_text(v, true)));
    }
    out
}

/// After discovery in which every optimistic hello was taken and one went to a middlebox not
/// on the allow-list: the hellos go to the middleboxes nearest the server first, so an allowed
/// one nearer the client may have had none, and saw nothing to answer (found in a user trial,
/// where the client named only the refused middlebox and nothing pointed at
/// `--max-discovered`).
fn discovery_note(verdicts: &[MiddleboxVerdict], max_discovered: u8) -> Option<String> {
    let answered = verdicts
        .iter()
        .filter(|v| !matches!(v, MiddleboxVerdict::Direct))
        .count();
    let not_allowed = verdicts
        .iter()
        .any(|v| matches!(v, MiddleboxVerdict::Excluded { why, .. } if *why == NOT_APPROVED));
    (not_allowed && answered >= usize::from(max_discovered)).then(|| {
        format!(
            "note: {max_discovered} optimistic hello(s) went to the middlebox(es) nearest the \
             server, approved or not; a middlebox nearer the client, if any, had none to answer \
             (raise --max-discovered to the number of middleboxes on the path)\n"
        )
    })
}

/// `text` and a line break, added to `out`.
fn line(out: &mut String, text: String) {
    out.push_str(&text);
    out.push('\n');
}

/// The client's path line. The address connected to belongs to the first pre-configured
/// middlebox; a discovering client may have connected to a middlebox that stayed out, or to the
/// server, and a client without middleboxes of its own to a server-side one, so its address is
/// given apart (found in a user trial: an excluded middlebox's address read as the server's).
fn path_text(names: &[String], preconfigured: bool, first_hop: &str, server: &str) -> String {
    match names.split_first() {
        None => format!("path: client -> {server} (first hop {first_hop})"),
        Some((first, rest)) if preconfigured => {
            let mut line = format!("path: client -> {first} ({first_hop})");
            for name in rest {
                line.push_str(&format!(" -> {name}"));
            }
            line + &format!(" -> {server}")
        }
        Some(_) => format!(
            "path: client -> {} -> {server} (first hop {first_hop})",
            names.join(" -> ")
        ),
    }
}

/// One verdict, for the client's summary (`long`: with the signer and the SVN) and the
/// services' report lines: the library's words ([`MiddleboxVerdict`]'s `Display`), with the
/// CLI's allow-list for the approval.
pub(crate) fn verdict_text(v: &MiddleboxVerdict, long: bool) -> String {
    let shown;
    let v = match v {
        MiddleboxVerdict::Excluded {
            middlebox,
            why,
            detail,
        } if *why == NOT_APPROVED => {
            shown = MiddleboxVerdict::Excluded {
                middlebox: middlebox.clone(),
                why: exclusion_text(why),
                detail: detail.clone(),
            };
            &shown
        }
        // The library's words are the client's report, which knows only its own side.
        MiddleboxVerdict::Direct if !long => return "no middlebox took part".to_string(),
        v => v,
    };
    if long {
        format!("{v:#}")
    } else {
        v.to_string()
    }
}

/// Why a middlebox was excluded, as the CLI says it: its approval is the allow-list.
pub(crate) fn exclusion_text(why: &'static str) -> &'static str {
    match why {
        NOT_APPROVED => "not in the allow-list (--allow-middlebox)",
        why => why,
    }
}

/// Verdicts on a report line, each as `; middlebox <verdict>`; an unnamed one (excluded
/// before its certificate verified) says `; a middlebox …`.
fn verdicts_text<'a>(verdicts: impl IntoIterator<Item = &'a MiddleboxVerdict>) -> String {
    let mut text = String::new();
    for v in verdicts {
        let named = !matches!(
            v,
            MiddleboxVerdict::Excluded {
                middlebox: None,
                ..
            }
        );
        text.push_str(if named { "; middlebox " } else { "; " });
        text.push_str(&verdict_text(v, false));
    }
    text
}

/// How long tickets are sealed under one key: `secs` (TOML `ticket_key_secs`), by default the
/// middleboxes' period, one hour.
fn ticket_key_period(secs: Option<u64>) -> anyhow::Result<std::time::Duration> {
    match secs {
        Some(0) => bail!("ticket_key_secs must be at least 1"),
        Some(secs) => Ok(std::time::Duration::from_secs(secs)),
        None => Ok(MIDDLEBOX_TICKET_KEY_PERIOD),
    }
}

/// `passthrough` or `http-header:NAME:VALUE`.
fn app_factory(spec: &str) -> anyhow::Result<AppFactory> {
    if spec == "passthrough" {
        return Ok(Arc::new(|| {
            Box::new(PassThrough) as Box<dyn MiddleboxApp + Send>
        }));
    }
    let Some(hv) = spec.strip_prefix("http-header:") else {
        bail!("unknown app {spec:?} (use passthrough or http-header:NAME:VALUE)");
    };
    let (name, value) = hv
        .split_once(':')
        .with_context(|| format!("app {spec:?}: expected http-header:NAME:VALUE"))?;
    let prototype =
        HttpHeaderInsert::new(name, value).map_err(|e| anyhow::anyhow!("app {spec:?}: {e}"))?;
    // A fresh copy (empty parser state) per connection.
    Ok(Arc::new(move || {
        Box::new(prototype.clone()) as Box<dyn MiddleboxApp + Send>
    }))
}

/// The simulated platform: from the key file at `path` (made if missing), or without one the
/// key made for this run, kept in `fresh` so that a reload does not replace it (endpoints
/// trust the key the banner showed).
fn platform(
    path: Option<&Path>,
    fresh: &OnceLock<Arc<SimulatedPlatform>>,
) -> anyhow::Result<(Arc<SimulatedPlatform>, String)> {
    let Some(path) = path else {
        let platform = match fresh.get() {
            Some(p) => p.clone(),
            None => {
                let p = Arc::new(SimulatedPlatform::generate()?);
                fresh.get_or_init(|| p).clone()
            }
        };
        return Ok((platform, "fresh for this run".to_owned()));
    };
    if !path.exists() {
        let pkcs8 = SimulatedPlatform::generate_pkcs8()?;
        crate::subcommand::write_new_private_file(path, &pkcs8)?;
    }
    let pkcs8 = Zeroizing::new(read_file(path, "simulated platform key")?);
    Ok((
        Arc::new(SimulatedPlatform::from_pkcs8(&pkcs8).with_context(|| {
            format!(
                "simulated platform key {} (an Ed25519 PKCS#8 key in DER, as the middlebox writes it)",
                path.display()
            )
        })?),
        format!("from {}", path.display()),
    ))
}

/// A middlebox as its settings describe it: the driver's configuration, and what the banner
/// says of it.
struct MiddleboxSetup {
    cfg: MiddleboxServerConfig,
    /// What `cfg.handshake.tls` was built from (a reload compares them).
    tls: TlsConfig,
    s: MiddleboxSettings,
    attestation_line: String,
    /// The names the middlebox's certificate carries, as endpoints check them.
    certificate_names: String,
}

fn middlebox(
    flags: MiddleboxFlags,
    config: &MbtlsConfig,
    config_path: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    if let Some(out) = flags.certificate_request.clone() {
        return certificate_request(flags, config, &out);
    }
    raise_open_files_limit();
    let fresh_platform = OnceLock::new();
    let MiddleboxSetup {
        cfg,
        tls,
        s,
        attestation_line,
        certificate_names,
    } = middlebox_setup(flags.clone(), config, &fresh_platform)?;
    // Its ticket keys live in its context: kept across a reload that changes neither its TLS
    // settings nor what its evidence shows, or every endpoint's next session would be a full
    // handshake with fresh evidence (a quote each, one at a time, on DCAP).
    let running = RunningContext::new(&tls, &attestation_line, &cfg.handshake.tls);
    // The measurement covers the app, which a reload may change: both are shown. What the
    // endpoints check (the names, the measurement) changing says that they must follow.
    // A server-side middlebox also shows how long it remembers legacy servers.
    let parts = |cfg: &MiddleboxServerConfig, app: &str, names: &str, attestation: &str| {
        let mut parts = vec![
            part(format!("next hop {}", cfg.next_hop), " (changed)"),
            part(format!("app: {app}"), " (changed)"),
            certificate_part(names, " (changed: endpoints must expect it)"),
            part(
                format!("attestation: {attestation}"),
                " (changed: endpoints' policies must accept it)",
            ),
        ];
        if cfg.placement == Placement::ServerSide {
            parts.push(part(legacy_memory_shown(cfg), " (changed)"));
        }
        parts
    };
    let shown = ShownParts::new(&parts(
        &cfg,
        &app_shown(&s),
        &certificate_names,
        &attestation_line,
    ));
    let reload = || -> anyhow::Result<(MiddleboxServerConfig, String)> {
        let config = reread(config, config_path)?;
        let mut setup = middlebox_setup(flags.clone(), &config, &fresh_platform)?;
        fixed_at_start_unchanged((&s.listen, &s.service), (&setup.s.listen, &setup.s.service))?;
        // The side decides which endpoint must know the middlebox (its names, its policy):
        // flipping it is a new deployment, which every session of the old one would fail.
        ensure!(
            setup.s.side == s.side,
            "a reload cannot change the middlebox's side from {} to {}; restart to change it",
            s.side,
            setup.s.side
        );
        let attestation = setup.attestation_line.clone();
        running.keep_unless_changed(setup.tls, attestation, &mut setup.cfg.handshake.tls);
        let line = shown.reloaded(&parts(
            &setup.cfg,
            &app_shown(&setup.s),
            &setup.certificate_names,
            &setup.attestation_line,
        ));
        Ok((setup.cfg, line))
    };
    let limits = cfg.limits;
    let next_hop = cfg.next_hop.clone();
    runtime()?.block_on(async {
        // Before the banner: a SIGHUP or SIGTERM sent once the banner is out must be handled,
        // not take the default action (exit).
        let signals = ServiceSignals::new()?;
        let mut server = MiddleboxServer::bind(s.listen.as_str(), cfg)
            .await
            .with_context(|| cannot_listen(&s.listen))?;
        let metrics = bind_metrics(&s.service).await?;
        s.service.start_reports("middlebox", server.local_addr());
        // A server-side middlebox that forgets legacy servers says after how long.
        let running = server.config();
        let forgets = match (running.placement, running.forget_legacy_after) {
            (Placement::ServerSide, Some(_)) => format!(" ({})", legacy_memory_shown(&running)),
            _ => String::new(),
        };
        let text = format!(
            "mbTLS middlebox listening on {}, next hop {next_hop}, {} side{forgets}, certificate for {certificate_names}",
            server.local_addr(),
            s.side,
        );
        print_listening(text, &*server.config());
        print_line(format_args!("app: {}", app_shown(&s)));
        print_line(format_args!("attestation: {attestation_line}"));
        print_line(limits_line(&limits, "connections"));
        let names = ("middlebox", "connections");
        serve_until_stopped(
            &mut server,
            (signals, metrics),
            &s.service,
            names,
            print_report,
            &reload,
        )
        .await
    })
}

/// What a service shows of its configuration, part by part (each with the note a change of it
/// gets): a reload's line shows every part as it now is and marks each one that changed since
/// the configuration last applied, so that a reload that moves the backend, drops a required
/// middlebox or empties a policy says so (found in a user trial: the server's and the proxy's
/// reload lines showed only the limits).
struct ShownParts(std::sync::Mutex<Vec<String>>);

/// One part of what a service shows: its text, what tells whether it changed (when the text
/// does not say all of it: a policy's measurements, the CAs' contents; empty: the text), and
/// the note a change gets.
type Part = (String, String, &'static str);

/// The part `shown`, changed only when its text changes.
fn part(shown: String, note: &'static str) -> Part {
    (shown, String::new(), note)
}

impl ShownParts {
    fn key(part: &Part) -> &String {
        if part.1.is_empty() {
            &part.0
        } else {
            &part.1
        }
    }

    fn new(parts: &[Part]) -> Self {
        ShownParts(std::sync::Mutex::new(
            parts.iter().map(|p| Self::key(p).clone()).collect(),
        ))
    }

    /// The reload's line for `parts`, which are remembered for the next reload.
    fn reloaded(&self, parts: &[Part]) -> String {
        let mut last = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let line: Vec<String> = parts
            .iter()
            .enumerate()
            .map(|(i, p)| match last.get(i) == Some(Self::key(p)) {
                true => p.0.clone(),
                false => format!("{}{}", p.0, p.2),
            })
            .collect();
        *last = parts.iter().map(|p| Self::key(p).clone()).collect();
        line.join("; ")
    }
}

/// What CAs a reload line's part is also compared by (their contents, which it does not
/// show): a digest of the trust roots of `trusted`.
fn trust_key(trusted: &[&TlsConfig]) -> String {
    let mut roots = Vec::new();
    for tls in trusted {
        roots.extend_from_slice(tls.trust_roots_pem.as_deref().unwrap_or_default());
        roots.push(0);
    }
    hex::encode(openssl::sha::sha256(&roots))
}

/// The `[mbtls]` table a reload uses: the config file read again, if there is one.
fn reread(
    first: &MbtlsConfig,
    config_path: Option<&std::path::Path>,
) -> anyhow::Result<MbtlsConfig> {
    match config_path {
        Some(p) => Ok(crate::config::Config::reload(p)?.mbtls),
        None => Ok(first.clone()),
    }
}

/// A reload cannot move the listener or the metrics listener (both bound once, at the start),
/// nor change the drain time (the stop it applies to is already set up): a configuration that
/// asks for it is refused whole, rather than applied in part. `running` and `asked`: the
/// listening address and the service settings, now and in the new configuration.
fn fixed_at_start_unchanged(
    running: (&str, &Service),
    asked: (&str, &Service),
) -> anyhow::Result<()> {
    if running.0 != asked.0 {
        bail!(
            "a reload cannot move the listener from {} to {}; restart to move it",
            running.0,
            asked.0
        );
    }
    let metrics = |s: &Service| s.metrics_listen.clone().unwrap_or_else(|| "none".into());
    if running.1.metrics_listen != asked.1.metrics_listen {
        bail!(
            "a reload cannot move the metrics listener from {} to {}; restart to move it",
            metrics(running.1),
            metrics(asked.1)
        );
    }
    if running.1.drain_grace() != asked.1.drain_grace() {
        bail!(
            "a reload cannot change drain_secs from {} to {}; restart to change it",
            running.1.drain_grace().as_secs(),
            asked.1.drain_grace().as_secs()
        );
    }
    let format = |s: &Service| match s.report_format {
        Some(ReportFormat::Json) => "json",
        _ => "text",
    };
    if format(running.1) != format(asked.1) {
        bail!(
            "a reload cannot change report_format from {} to {}; restart to change it",
            format(running.1),
            format(asked.1)
        );
    }
    Ok(())
}

/// The middlebox's app as its banner and reload lines show it, with whether it fails closed.
fn app_shown(s: &MiddleboxSettings) -> String {
    match s.fail_closed {
        true => format!(
            "{} (fails closed: sessions it cannot take part in are cut)",
            s.app
        ),
        false => s.app.clone(),
    }
}

/// The middlebox's settings: the config file's table with the flags over it.
fn middlebox_settings(
    flags: MiddleboxFlags,
    config: &MbtlsConfig,
) -> anyhow::Result<MiddleboxSettings> {
    let mut table = config.middlebox.clone();
    set(&mut table, "listen", flags.listen);
    let next_hop_flag = flags.next_hop.is_some();
    set(&mut table, "next_hop", flags.next_hop);
    set(&mut table, "certificate", path_str(flags.certificate));
    set(&mut table, "private_key", path_str(flags.private_key));
    set(&mut table, "app", flags.app);
    set(&mut table, "attester", flags.attester);
    set(
        &mut table,
        "sim_platform_key",
        path_str(flags.sim_platform_key),
    );
    set(
        &mut table,
        "dcap_collateral",
        path_str(flags.dcap_collateral),
    );
    set(
        &mut table,
        "gramine_attestation_dir",
        path_str(flags.gramine_attestation_dir),
    );
    set(
        &mut table,
        "tsm_report_entry",
        path_str(flags.tsm_report_entry),
    );
    if flags.server_side {
        set(&mut table, "side", Some("server".into()));
    }
    if flags.fail_closed {
        table.insert("fail_closed".into(), toml::Value::Boolean(true));
    }
    if flags.evidence_in_certificate {
        table.insert("evidence_in_certificate".into(), toml::Value::Boolean(true));
    }
    set_secs(&mut table, "ticket_key_secs", flags.ticket_key_secs)?;
    set_secs(
        &mut table,
        "forget_legacy_after_secs",
        flags.forget_legacy_after_secs,
    )?;
    // One way to name the next hop wins over the file's other one.
    if flags.transparent {
        table.remove("next_hop");
        table.insert("transparent".into(), toml::Value::Boolean(true));
    } else if next_hop_flag {
        table.remove("transparent");
    }
    let service = Service::take_from(&mut table, &flags.service, &config.origin("middlebox"))?;
    let mut s: MiddleboxSettings = role_settings(table, "middlebox", config)?;
    s.service = service;
    attester_options_match(&s)?;
    Ok(s)
}

/// The middlebox's attester as its settings describe it, and the banner's line about it.
fn middlebox_attester(
    s: &MiddleboxSettings,
    fresh_platform: &OnceLock<Arc<SimulatedPlatform>>,
) -> anyhow::Result<(Option<Arc<dyn Attester>>, String)> {
    // The measured configuration: what the middlebox does to traffic.
    let measured_config = format!("app={}", s.app);
    Ok(match s.attester.as_str() {
        "none" => (None, "none (sends empty evidence)".into()),
        "sim" => {
            let (platform, origin) = platform(s.sim_platform_key.as_deref(), fresh_platform)?;
            let measurement = sim::measure(PROGRAM, measured_config.as_bytes());
            let line = format!(
                "SIMULATED TEE (demo only): platform key {} ({origin}), measurement {}",
                hex::encode(platform.public_key()),
                hex::encode(measurement)
            );
            let a = SimulatedAttester::new(platform, measurement, sim::signer_id("mbx"));
            (Some(Arc::new(a)), line)
        }
        "gramine" | "tdx" => dcap_attester(s)?,
        other => bail!("unknown attester {other:?} (use none, sim, gramine or tdx)"),
    })
}

/// `cfg` set to point every session at the evidence in its certificate, once that evidence
/// is found bound to the certificate's own key; and what the banner says of it.
fn evidence_in_certificate(
    cfg: MiddleboxHandshakeConfig,
) -> anyhow::Result<(String, MiddleboxHandshakeConfig)> {
    let how = "evidence_in_certificate (--evidence-in-certificate)";
    let cfg = cfg.evidence_in_certificate().with_context(|| {
        format!(
            "{how}: the certificate's evidence cannot stand for this middlebox (it must be for \
             the certificate's own key and this middlebox's code: make a new request with \
             --certificate-request)"
        )
    })?;
    let found = cfg
        .certificate_evidence()
        .context("the certificate's evidence")?;
    let shown = format!(
        "evidence in its certificate, bound to its key and nonce {}, measurement {} as claimed \
         (endpoints need certificate_evidence = true)",
        hex::encode(&found.nonce),
        hex::encode(&found.measurement)
    );
    Ok((shown, cfg))
}

/// `mbx mbtls check-request`: the evidence of a middlebox's certificate signing request,
/// checked as a CA would before signing it.
fn check_request(flags: CheckRequestFlags) -> anyhow::Result<()> {
    let a = &flags.attestation;
    let mut policy = build_policy(PolicyParts {
        file: &a.policy,
        table: &None,
        allow_simulated: a.allow_simulated,
        measurements: &a.measurements,
        sim_platform_keys: &a.sim_platform_keys,
    })?;
    // The CA checks this mode whatever its endpoints' policies say, and only its own nonce.
    policy.certificate_evidence = true;
    policy.certificate_nonces = vec![HexBytes(nonce_flag(&flags.nonce)?)];
    // Checked again with what was just set (a nonce the mode refuses, as 32 bytes).
    policy.validate()?;
    let shown = flags.request.display();
    let bytes = read_file(&flags.request, "certificate signing request")?;
    let der = match openssl::x509::X509Req::from_pem(&bytes) {
        Ok(req) => req.to_der()?,
        // Not a PEM request: a DER one, or a certificate given by mistake.
        Err(_) => {
            ensure!(
                openssl::x509::X509::from_pem(&bytes).is_err()
                    && openssl::x509::X509::from_der(&bytes).is_err(),
                "{shown} holds a certificate, not a certificate signing request: check-request \
                 reads the request before the CA signs it (the middlebox's \
                 --certificate-request file)"
            );
            bytes
        }
    };
    let now = mbx_attest::unix_seconds(std::time::SystemTime::now());
    let check = match mbx_attest::cert_bound::check_request_evidence(&der, &policy, now) {
        Ok(check) => check,
        Err(AttestError::CertificateNonceNotAccepted(bound)) => bail!(
            "the evidence in {shown} is bound to nonce {bound}, not to --nonce {}: the request \
             was made for another verifier's nonce, or is a replay",
            flags.nonce.trim()
        ),
        Err(e) => bail!(
            "the evidence in {shown} does not pass: {e}{}",
            attestation_hint(&e)
        ),
    };
    println!(
        "evidence verified: bound to the request's key and nonce {}; {}",
        hex::encode(&check.nonce),
        check.claims
    );
    Ok(())
}

/// `mbx mbtls middlebox --certificate-request FILE`: a certificate signing request for the
/// middlebox's key that carries the attester's evidence for that key and the verifier's
/// nonce (the spec's second binding mode), written to `out`.
fn certificate_request(
    flags: MiddleboxFlags,
    config: &MbtlsConfig,
    out: &Path,
) -> anyhow::Result<()> {
    let nonce = flags.nonce.clone().unwrap_or_default();
    let names = flags.request_names.clone();
    let s = middlebox_settings(flags, config)?;
    let nonce = nonce_flag(&nonce)?;
    // Before any key or evidence is made (a quote takes milliseconds). The request is a new
    // file too (found in a trial: given the key's own path, it replaced the new key, and any
    // other file, a platform key or a CA, went the same way).
    ensure!(
        !out.exists() && out != s.private_key.as_path(),
        "{} exists or is the key's path (--certificate-request writes a new file, and will not \
         overwrite one)",
        out.display()
    );
    let no_overwrite = "--private-key: a request makes its key, and will not overwrite a file";
    ensure!(
        !s.private_key.exists(),
        "{} exists ({no_overwrite})",
        s.private_key.display()
    );
    for name in &names {
        ensure!(
            rustls::pki_types::DnsName::try_from(name.as_str()).is_ok(),
            "--request-name {name:?} is not a DNS name (letters, digits, hyphens and dots, as \
             endpoints name the middlebox)"
        );
    }
    let (attester, attestation_line) = middlebox_attester(&s, &OnceLock::new())?;
    let attester = attester
        .context("a certificate request carries evidence: give --attester sim, gramine or tdx")?;
    // The key is made here, never read: the evidence says this program (in its TEE) made
    // and holds it, which a key brought from outside would make untrue (found in a review).
    // Under Gramine the key's path must be a protected (sealed) file, so it leaves the
    // enclave encrypted; written readable by its owner only, never over a file or a link.
    let group = openssl::ec::EcGroup::from_curve_name(openssl::nid::Nid::X9_62_PRIME256V1)?;
    let made = openssl::pkey::PKey::from_ec_key(openssl::ec::EcKey::generate(&group)?)?;
    let pkcs8 = zeroize::Zeroizing::new(made.private_key_to_pkcs8()?);
    let pem = zeroize::Zeroizing::new(made.private_key_to_pem_pkcs8()?);
    let key = rcgen::KeyPair::try_from(pkcs8.as_slice())
        .map_err(|e| anyhow::anyhow!("cannot sign a request with the new key: {e}"))?;
    let spki = rcgen::PublicKeyData::subject_public_key_info(&key);
    let evidence = mbx_attest::CertificateEvidence::make(attester.as_ref(), &spki, &nonce)?;
    let mut params =
        rcgen::CertificateParams::new(names.clone()).context("--request-name must be DNS names")?;
    if let Some(first) = names.first() {
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, first.as_str());
    }
    params
        .custom_extensions
        .push(rcgen::CustomExtension::from_oid_content(
            &mbx_attest::cert_bound::EVIDENCE_EXTENSION_OID,
            evidence.encode()?,
        ));
    let request = params
        .serialize_request(&key)
        .and_then(|r| r.pem())
        .map_err(|e| anyhow::anyhow!("cannot make the certificate request: {e}"))?;
    // The key is written only once its request is made: a request that fails leaves no key
    // behind to refuse the next try (found in a review).
    crate::subcommand::write_new_private_file(&s.private_key, &pem)
        .with_context(|| format!("the middlebox's new key ({no_overwrite})"))?;
    if let Err(e) = crate::subcommand::write_new_file(out, request.as_bytes(), 0o644) {
        // The key is of no use without its request, and would refuse the next try.
        let _ = std::fs::remove_file(&s.private_key);
        return Err(e).with_context(|| {
            format!(
                "cannot write {} (the new key is removed again)",
                out.display()
            )
        });
    }
    println!(
        "certificate request for {} written to {}: evidence for its key and nonce {}; {attestation_line}",
        names.join(", "),
        out.display(),
        hex::encode(&nonce)
    );
    println!(
        "new key written to {}; sign the request copying its extensions but not letting it \
         choose CA:TRUE, e.g. openssl x509 -req -in {} -CA ca.pem -CAkey ca.key \
         -copy_extensions copy -extfile leaf.ext -days 30 -out middlebox.pem (leaf.ext: \
         basicConstraints=critical,CA:FALSE); then start the middlebox with \
         --evidence-in-certificate",
        s.private_key.display(),
        out.display()
    );
    Ok(())
}

fn middlebox_setup(
    flags: MiddleboxFlags,
    config: &MbtlsConfig,
    fresh_platform: &OnceLock<Arc<SimulatedPlatform>>,
) -> anyhow::Result<MiddleboxSetup> {
    let s = middlebox_settings(flags, config)?;
    let certificate = s.certificate.as_deref().ok_or_else(|| {
        does_not_parse(
            "invalid mbTLS middlebox configuration ([mbtls.middlebox] and flags): give \
             `certificate` in [mbtls.middlebox] or as --certificate"
                .into(),
        )
    })?;
    let mut tls = TlsConfig::server(mbx_engine::Identity::from_pem_files(
        certificate,
        &s.private_key,
    )?);
    tls.ticket_key_rotation = Some(ticket_key_period(s.ticket_key_secs)?);
    let app = app_factory(&s.app)?;
    let (attester, mut attestation_line) = middlebox_attester(&s, fresh_platform)?;
    let mut handshake =
        MiddleboxHandshakeConfig::new(&tls, attester).context("middlebox TLS configuration")?;
    if s.evidence_in_certificate {
        let (shown, cfg) = evidence_in_certificate(handshake)?;
        handshake = cfg;
        attestation_line = format!("{shown} ({attestation_line})");
    }
    if s.fail_closed {
        handshake = handshake.fail_closed();
    }
    let cfg = MiddleboxServerConfig {
        handshake,
        next_hop: match (&s.next_hop, s.transparent) {
            (Some(_), true) => bail!("give next_hop or transparent, not both"),
            (Some(addr), false) => {
                check_host_port("next_hop (--next-hop)", addr)?;
                NextHop::Address(addr.clone())
            }
            (None, true) => NextHop::OriginalDestination,
            (None, false) => {
                return Err(does_not_parse(
                    "give the next hop (next_hop in [mbtls.middlebox], --next-hop) or \
                     --transparent"
                        .into(),
                ))
            }
        },
        app,
        placement: match s.side.as_str() {
            "client" => Placement::ClientSide,
            "server" => Placement::ServerSide,
            other => bail!("unknown middlebox side {other:?} (use client or server)"),
        },
        limits: s.service.limits()?,
        forget_legacy_after: match s.forget_legacy_after_secs {
            None => None,
            Some(_) if s.side != "server" => bail!(
                "forget_legacy_after_secs is for a server-side middlebox (--server-side): a \
                 client-side one never announces itself"
            ),
            Some(n) if n > MAX_TIMEOUT_SECS => {
                bail!("forget_legacy_after_secs must be at most {MAX_TIMEOUT_SECS} (a year)")
            }
            Some(n) => Some(Duration::from_secs(n)),
        },
    };
    let certificate_names = tls.identity.as_ref().map_or_else(
        || "(none)".into(),
        |id| certificate_names(&id.cert_chain_pem),
    );
    Ok(MiddleboxSetup {
        cfg,
        tls,
        s,
        attestation_line,
        certificate_names,
    })
}

/// How long a server-side middlebox remembers legacy servers, as its banner and a reload's
/// line say it.
fn legacy_memory_shown(cfg: &MiddleboxServerConfig) -> String {
    match cfg.forget_legacy_after.map(|d| d.as_secs()) {
        None => "legacy servers remembered until the middlebox stops".into(),
        Some(0) => "legacy servers not remembered".into(),
        Some(secs) => format!("legacy servers forgotten after {secs}s"),
    }
}

/// The part "certificate for NAMES": changed when the names change, not when a validity
/// warning comes or goes (`names` as [`certificate_names`] gives them).
fn certificate_part(names: &str, note: &'static str) -> Part {
    let key = names.split(VALIDITY_WARNING).next().unwrap_or(names);
    (
        format!("certificate for {names}"),
        format!("certificate for {key}"),
        note,
    )
}

/// What starts [`validity_warning`]'s text.
const VALIDITY_WARNING: &str = " (WARNING: ";

/// The names in the first certificate of `chain_pem` (subject common name and DNS
/// subjectAltNames), as the banner and a reload show them: the name endpoints must expect.
fn certificate_names(chain_pem: &[u8]) -> String {
    let leaf = leaf_of(chain_pem);
    // The DNS subjectAltNames, which TLS clients check; the common name only without them
    // (a client ignores it when there are some).
    let names = leaf.as_ref().map(|leaf| {
        let dns: Vec<String> = leaf
            .subject_alt_names()
            .map(|sans| {
                sans.iter()
                    .filter_map(|n| n.dnsname().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        if !dns.is_empty() {
            return dns;
        }
        leaf.subject_name()
            .entries_by_nid(openssl::nid::Nid::COMMONNAME)
            .filter_map(|e| e.data().to_string().ok())
            .collect()
    });
    let names = match &names {
        Some(names) if !names.is_empty() => {
            crate::subcommand::escape_controls(&names.join(", "), false).into_owned()
        }
        _ => "(no name read)".into(),
    };
    names + &validity_warning(leaf.as_deref())
}

fn leaf_of(chain_pem: &[u8]) -> Option<openssl::x509::X509> {
    openssl::x509::X509::stack_from_pem(chain_pem)
        .ok()
        .and_then(|chain| chain.into_iter().next())
}

/// A warning, for the banner and a reload's line, when the certificate is not valid now: every
/// peer would refuse it (found in a user trial: a middlebox started with an expired
/// certificate said nothing, and every session failed).
fn validity_warning(leaf: Option<&openssl::x509::X509Ref>) -> String {
    let Some(leaf) = leaf else {
        return String::new();
    };
    let Ok(now) = openssl::asn1::Asn1Time::days_from_now(0) else {
        return String::new();
    };
    if leaf.not_after() < now {
        format!(
            "{VALIDITY_WARNING}expired {}: peers will refuse it)",
            leaf.not_after()
        )
    } else if leaf.not_before() > now {
        format!(
            "{VALIDITY_WARNING}not valid before {}: peers will refuse it)",
            leaf.not_before()
        )
    } else {
        String::new()
    }
}

/// Refuses an attester's option given for another attester: it would be ignored, and the
/// operator most likely meant another attester or mistyped the option.
fn attester_options_match(s: &MiddleboxSettings) -> anyhow::Result<()> {
    let options: [(&str, bool, &[&str]); 4] = [
        ("sim_platform_key", s.sim_platform_key.is_some(), &["sim"]),
        (
            "dcap_collateral",
            s.dcap_collateral.is_some(),
            &["gramine", "tdx"],
        ),
        (
            "gramine_attestation_dir",
            s.gramine_attestation_dir.is_some(),
            &["gramine"],
        ),
        ("tsm_report_entry", s.tsm_report_entry.is_some(), &["tdx"]),
    ];
    for (option, given, attesters) in options {
        ensure!(
            !given || attesters.contains(&s.attester.as_str()),
            "{option} applies to attester {} only, not to attester {:?}",
            attesters.join(" or "),
            s.attester
        );
    }
    Ok(())
}

/// `attester = "gramine"` or `"tdx"`: quotes one report_data at start-up, so that a middlebox
/// that cannot quote (not inside Gramine or a TDX guest, no collateral) fails now rather than on
/// every session, and says what an endpoint would find of that quote.
fn dcap_attester(s: &MiddleboxSettings) -> anyhow::Result<(Option<Arc<dyn Attester>>, String)> {
    let collateral = s.dcap_collateral.as_ref().with_context(|| {
        format!(
            "attester {} needs the platform's collateral (--dcap-collateral)",
            s.attester
        )
    })?;
    let (attester, what): (Arc<dyn Attester>, &str) = if s.attester == "tdx" {
        let entry = s
            .tsm_report_entry
            .clone()
            .unwrap_or_else(TsmAttester::default_entry);
        let a = TsmAttester::new(entry, collateral).context("attester tdx")?;
        (Arc::new(a), "Intel TDX (DCAP) through configfs-tsm")
    } else {
        let mut a = GramineAttester::new(collateral);
        if let Some(dir) = &s.gramine_attestation_dir {
            a = a.with_attestation_dir(dir);
        }
        (Arc::new(a), "Intel SGX (DCAP) in Gramine")
    };
    let evidence = match attester
        .evidence(&[0; REPORT_DATA_LEN])
        .with_context(|| format!("attester {} cannot quote", s.attester))?
    {
        Evidence::Dcap(d) => d,
        other => bail!("attester {} made {:?} evidence", s.attester, other.kind()),
    };
    let measurement = quote_measurement_unverified(evidence.quote())
        .with_context(|| format!("attester {}: its quote", s.attester))?;
    let line = format!(
        "{what}: collateral {}, measurement {}; {}",
        collateral.display(),
        hex::encode(&measurement),
        own_quote_verdict(&evidence, measurement)
    );
    Ok((Some(attester), line))
}

/// What an endpoint's check of our own quote would find now, before any policy of its own:
/// so that an operator sees stale collateral here rather than as refused sessions.
fn own_quote_verdict(evidence: &DcapEvidence, measurement: Vec<u8>) -> String {
    let anything = Policy {
        measurements: vec![HexBytes(measurement)],
        allow_debug: true,
        accepted_tcb_statuses: TcbStatus::ALL.to_vec(),
        ..Policy::default()
    };
    let now = mbx_attest::unix_seconds(std::time::SystemTime::now());
    match DcapVerifier::new(0, 0).verify_evidence(evidence, &[0; REPORT_DATA_LEN], &anything, now) {
        Ok(c) => format!("the quote verifies now: {c}"),
        Err(e) => format!(
            "WARNING: the quote does not verify now ({e}); endpoints will refuse this middlebox until it does"
        ),
    }
}

fn print_report(r: &ConnectionReport) {
    print_session(report_line(r), || crate::mbtls_json::middlebox(r));
}

/// A session's report: its text line, or with `--report-format json` its fields and the line.
fn print_session(
    text: String,
    fields: impl FnOnce() -> serde_json::Map<String, serde_json::Value>,
) {
    crate::subcommand::print_event("session", text, fields);
}

/// Where a service's stop has got to (the `"stop"` event's `phase`, docs/mbtls.md §4.9).
enum StopPhase {
    /// No new connections; the `open` ones have `grace_secs` to end.
    Draining { grace_secs: u64, open: u64 },
    /// The connections open now (`open`) are cut, on a second signal or when the drain time is
    /// over (`cause`); some may end on their own first, so the final count is
    /// [`StopPhase::Stopped`]'s `cut`.
    Cutting { open: u64, cause: CutCause },
    /// Every connection has ended (`cut` of them were cut); the process exits.
    Stopped { cut: u64 },
    /// A signal after the cut: the process exits without the reports of the `unreported`
    /// connections still ending.
    Left { unreported: u64 },
}

/// Why a stop cuts the open connections.
#[derive(Clone, Copy)]
enum CutCause {
    /// A second stop signal.
    Signal,
    /// The drain time is over.
    DrainTimeOver,
}

impl CutCause {
    /// The `"stop"` event's `cause`.
    fn name(self) -> &'static str {
        match self {
            CutCause::Signal => "signal",
            CutCause::DrainTimeOver => "drain_time_over",
        }
    }
}

/// A stop's line, in JSON a `"stop"` event whose fields are the same in every phase (null where
/// a phase has no such value).
fn print_stop(phase: StopPhase, text: String) {
    let (name, grace, open, cut, cause) = match phase {
        StopPhase::Draining { grace_secs, open } => {
            ("draining", Some(grace_secs), Some(open), None, None)
        }
        StopPhase::Cutting { open, cause } => {
            ("cutting", None, Some(open), None, Some(cause.name()))
        }
        StopPhase::Stopped { cut } => ("stopped", None, None, Some(cut), None),
        StopPhase::Left { unreported } => ("left", None, Some(unreported), None, None),
    };
    crate::subcommand::print_event("stop", text, || {
        let mut fields = serde_json::Map::new();
        fields.insert("phase".into(), name.into());
        fields.insert("grace_secs".into(), grace.into());
        fields.insert("open".into(), open.into());
        fields.insert("cut".into(), cut.into());
        fields.insert("cause".into(), cause.into());
        fields
    });
}

/// A stop signal after the cut: gives the reports already in and waits for no other; the
/// phase is "left" with those still to come ([`Listening::reports_to_come`]), or "stopped"
/// when there are none.
fn leave_now<R, C>(
    server: &mut Listening<R, C>,
    print: &impl Fn(&R),
    (who, what): (&str, &str),
) -> (StopPhase, String) {
    while let Some(r) = server.try_next_report() {
        print(&r);
    }
    match server.reports_to_come() {
        0 => {
            let cut = server.connections_cut();
            (StopPhase::Stopped { cut }, stopped_line(who, cut, what))
        }
        n => (
            StopPhase::Left { unreported: n },
            format!(
                "{who} stopped without the reports of {} still ending",
                count_of(n, what)
            ),
        ),
    }
}

/// How the process ends after [`leave_now`]: with an error (status 1, the same text on
/// standard error) when reports were left behind, so that a script or a process manager learns
/// that the record of the sessions is incomplete; without one when none were.
fn left_without_reports(phase: &StopPhase, text: &str) -> anyhow::Result<()> {
    match phase {
        StopPhase::Left { .. } => bail!("{text}"),
        _ => Ok(()),
    }
}

/// The "stopped" line: every connection has ended, `cut` of them cut.
fn stopped_line(who: &str, cut: u64, what: &str) -> String {
    format!("{who} stopped ({} cut)", count_of(cut, what))
}

/// Cuts the service's open connections now, after saying so: their reports follow, then the
/// "stopped" line.
fn cut_open<R, C>(server: &Listening<R, C>, (who, what): (&str, &str), cause: CutCause) {
    // Counted before the cut, which may end them all before a count after it.
    let open = server.open_connections();
    let text = match (open, cause) {
        (0, _) => format!("{who} stopping now: no {what} open"),
        (_, CutCause::Signal) => format!("{who} stopping now: the open {what} are cut"),
        (_, CutCause::DrainTimeOver) => {
            format!("{who} stopping now: the drain time is over, the open {what} are cut")
        }
    };
    print_stop(
        StopPhase::Cutting {
            open: open as u64,
            cause,
        },
        text,
    );
    server.cut_now();
}

/// What a service's configuration shows in its `"listening"` and `"reload"` events: its
/// `limits` and the role's facts (where it forwards to, on which side), as JSON fields.
trait ServiceFields: ServiceConfig {
    /// The role's facts; the same keys whatever the configuration.
    fn facts(&self) -> serde_json::Map<String, serde_json::Value>;

    /// The facts and the limits.
    fn fields(&self) -> serde_json::Map<String, serde_json::Value> {
        let mut fields = self.facts();
        fields.insert("limits".into(), limits_fields(self.limits()));
        fields
    }
}

impl ServiceFields for MiddleboxServerConfig {
    fn facts(&self) -> serde_json::Map<String, serde_json::Value> {
        // An address, or null and `transparent` for each connection's own destination.
        let address = match &self.next_hop {
            NextHop::Address(addr) => Some(addr.as_str()),
            NextHop::OriginalDestination => None,
        };
        let side = match self.placement {
            Placement::ClientSide => "client",
            Placement::ServerSide => "server",
        };
        crate::mbtls_json::object(serde_json::json!({
            "next_hop": address,
            "transparent": address.is_none(),
            "side": side,
            "forget_legacy_after_secs": self.forget_legacy_after.map(|d| d.as_secs()),
        }))
    }
}

impl ServiceFields for MbtlsServerConfig {
    fn facts(&self) -> serde_json::Map<String, serde_json::Value> {
        crate::mbtls_json::object(serde_json::json!({ "backend": self.backend }))
    }
}

impl ServiceFields for ClientProxyConfig {
    fn facts(&self) -> serde_json::Map<String, serde_json::Value> {
        // The pre-configured middleboxes in path order, and how many may be discovered.
        let (middleboxes, discovered) = match &self.handshake.middlebox {
            ClientMiddlebox::Preconfigured(name) => (vec![name.as_str()], 0),
            ClientMiddlebox::PreconfiguredPath(names) => {
                (names.iter().map(String::as_str).collect(), 0)
            }
            ClientMiddlebox::Discover(_) => (vec![], 1),
            ClientMiddlebox::DiscoverUpTo(_, n) => (vec![], *n),
            ClientMiddlebox::Disabled => (vec![], 0),
        };
        crate::mbtls_json::object(serde_json::json!({
            "server_name": self.handshake.server_name,
            "first_hop": self.first_hop,
            "middleboxes": middleboxes,
            "max_discovered": discovered,
        }))
    }
}

/// A service's first banner line, in JSON a `"listening"` event: the service is ready, with
/// its configuration's fields ([`ServiceFields`]; the banner's other lines stay notices).
fn print_listening(text: String, config: &impl ServiceFields) {
    crate::subcommand::print_event("listening", text, || config.fields());
}

/// A service's limits as a JSON object: seconds, null for an idle time that never ends and
/// for no limit on open connections (sessions), in all or per client address.
fn limits_fields(limits: &Limits) -> serde_json::Value {
    serde_json::json!({
        "handshake_timeout_secs": limits.handshake_timeout.as_secs(),
        "idle_timeout_secs": limits.idle_timeout.map(|d| d.as_secs()),
        "max_open": limits.max_connections,
        "max_open_per_client": limits.max_connections_per_client,
        "new_per_second_per_client": limits.connection_rate_per_client.map(|r| r.per_second),
        "burst_per_client": limits.connection_rate_per_client.map(|r| r.burst),
    })
}

/// A reload's fields for `--report-format json`: applied, with the fields of `config` (now in
/// force, [`ServiceFields`]) and whether the limits changed, or refused and why (the same
/// keys, null).
fn reload_fields<C: ServiceFields>(
    config: &C,
    outcome: Result<bool, String>,
) -> serde_json::Map<String, serde_json::Value> {
    let mut fields = config.fields();
    let (changed, refused) = match outcome {
        Ok(changed) => (Some(changed), None),
        Err(why) => {
            fields
                .values_mut()
                .for_each(|v| *v = serde_json::Value::Null);
            (None, Some(why))
        }
    };
    fields.insert("applied".into(), refused.is_none().into());
    fields.insert("error".into(), refused.into());
    fields.insert("limits_changed".into(), changed.into());
    fields
}

/// A middlebox connection's report line.
fn report_line(r: &ConnectionReport) -> String {
    let from = r
        .client
        .map(|a: SocketAddr| a.to_string())
        .unwrap_or_default();
    let mut line = format!("connection {} from {from}", r.id);
    if let Some(to) = &r.next_hop {
        line.push_str(&format!(" to {to}"));
        // The next hop names the connection by this address ("session N from …").
        if let Some(local) = r.next_hop_local {
            line.push_str(&format!(" (from {local})"));
        }
    }
    line.push_str(": ");
    if r.keys_installed {
        line.push_str(&format!(
            "joined, {}",
            r.version.map(version_name).unwrap_or("?")
        ));
        if r.resumed {
            line.push_str(" (secondary session resumed: no new evidence)");
        }
        if let Some(h) = &r.client_hop {
            line.push_str(&format!("; client hop {}", fp(h)));
        }
        if let Some(h) = &r.server_hop {
            line.push_str(&format!("; server hop {}", fp(h)));
        }
        if r.key_updates > 0 {
            line.push_str(&format!("; {} KeyUpdates followed", r.key_updates));
        }
    } else if r.legacy_server {
        // How long it is remembered is in the outcome below (`forget_legacy_after`).
        line.push_str("the server refused our announcement (a legacy server)");
    } else if let Some(why) = r.passive {
        line.push_str(&format!("not joined ({why}), bytes forwarded unchanged"));
    } else {
        line.push_str("no key material received");
    }
    // The endpoint's own words (escaped with the rest of the line when printed).
    if let Some(why) = &r.refused_by_endpoint {
        line.push_str(&format!("; refused by the endpoint: {why}"));
    }
    line.push_str(&format!(
        "; {} from the client, {} from the server",
        count_of(r.bytes_from_client, "bytes"),
        r.bytes_from_server
    ));
    match (&r.outcome, r.passive) {
        // Its relaying ended cleanly; the session may not have (an endpoint that refused
        // it ends the session): not "closed cleanly" alone (found in a user trial).
        (Ok(()), Some(_)) if r.left_without_close_notify.is_none() => line.push_str(
            "; its connections closed cleanly (how the session ended is in the endpoints' reports)",
        ),
        _ => line.push_str(&relayed_outcome_text(
            &r.outcome,
            r.left_without_close_notify,
        )),
    }
    // An orderly end the app chose reads as the peer's at each endpoint: said here.
    if let (Ok(()), Some(ended)) = (&r.outcome, &r.app_ended) {
        line.push_str(&format!(" ({ended})"));
    }
    line
}

/// [`outcome_text`] for a middlebox's session, where one side may have left without
/// close_notify after the other's (`left`).
fn relayed_outcome_text(outcome: &Result<(), String>, left: Option<Side>) -> String {
    let left = left.map(|side| {
        let (gone, other) = match side {
            Side::Client => ("client", "server"),
            Side::Server => ("server", "client"),
        };
        format!(
            "the {gone} without close_notify after the {other}'s (the {other}'s connection was closed without one too)"
        )
    });
    left_outcome_text(outcome, left)
}

/// The signals a service handles, registered before it says it is listening.
struct ServiceSignals {
    stop: StopSignals,
    hangup: tokio::signal::unix::Signal,
}

impl ServiceSignals {
    fn new() -> anyhow::Result<ServiceSignals> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(ServiceSignals {
            stop: StopSignals::new()?,
            hangup: signal(SignalKind::hangup()).context("cannot handle SIGHUP")?,
        })
    }
}

/// Ctrl-C and SIGTERM, counted: the first asks a middlebox or server to drain, the second to
/// cut what is still open (reports still printed), a third to leave without them.
struct StopSignals {
    term: tokio::signal::unix::Signal,
    interrupt: tokio::signal::unix::Signal,
    count: u32,
}

impl StopSignals {
    fn new() -> anyhow::Result<StopSignals> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(StopSignals {
            term: signal(SignalKind::terminate()).context("cannot handle SIGTERM")?,
            interrupt: signal(SignalKind::interrupt()).context("cannot handle Ctrl-C")?,
            count: 0,
        })
    }

    async fn next(&mut self) -> anyhow::Result<()> {
        tokio::select! {
            _ = self.interrupt.recv() => {}
            _ = self.term.recv() => {}
        }
        self.count += 1;
        Ok(())
    }
}

/// A middlebox holds two descriptors per connection and a server one or two per session; the
/// usual soft limit of 1,024 open files would stop them near 500 connections although the hard
/// limit allows far more. Like Go's runtime does for every program, the middlebox and the
/// server raise their soft limit to the hard one at start (best effort, logged).
fn raise_open_files_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let limit = getrlimit(Resource::Nofile);
    // `None` is "unlimited": nothing to raise, or no finite hard limit to raise to.
    if let (Some(soft), Some(hard)) = (limit.current, limit.maximum) {
        if soft < hard {
            let raised = rustix::process::Rlimit {
                current: Some(hard),
                maximum: Some(hard),
            };
            match setrlimit(Resource::Nofile, raised) {
                Ok(()) => tracing::info!(soft, hard, "raised the open-files soft limit"),
                Err(e) => tracing::warn!(error = %e, "cannot raise the open-files soft limit"),
            }
        }
    }
}

/// Prints each connection's report until the first Ctrl-C or SIGTERM; then stops accepting
/// and gives the open `what` (connections, sessions) the service's drain time to end, and cuts
/// them at once on a second signal (their reports, then the "stopped" line, still come; a
/// third signal leaves without them). On SIGHUP the `who` (middlebox, server, proxy) takes the
/// configuration `reload` builds for the connections accepted from then on; one that fails to
/// build changes nothing. With a metrics listener (bound by [`bind_metrics`] before the
/// banner), answers Prometheus scrapes there.
async fn serve_until_stopped<R, C: ServiceFields>(
    server: &mut Listening<R, C>,
    (signals, metrics): (ServiceSignals, Option<tokio::net::TcpListener>),
    service: &Service,
    (who, what): (&str, &str),
    print: impl Fn(&R),
    reload: &dyn Fn() -> anyhow::Result<(C, String)>,
) -> anyhow::Result<()> {
    let ServiceSignals {
        mut stop,
        mut hangup,
    } = signals;
    let reloads = Arc::new(Reloads::default());
    let grace = service.drain_grace();
    // After the first stop signal: when the drain time is over. Then (or on a second signal)
    // the open connections are cut; a signal after that leaves without their reports.
    let mut drain_over: Option<tokio::time::Instant> = None;
    let mut cut_asked = false;
    // Stopped when this returns.
    let _metrics = match metrics {
        Some(listener) => Some(serve_service_metrics(
            listener,
            who,
            server.stats(),
            reloads.clone(),
        )?),
        None => None,
    };
    loop {
        tokio::select! {
            Some(()) = hangup.recv() => match reload().and_then(|(cfg, also)| {
                // What the line marks as changed is against the configuration running now.
                let before = *server.config().limits();
                server.reload(cfg)?;
                Ok((before, also))
            }) {
                Ok((before, also)) => {
                    reloads.applied.fetch_add(1, Ordering::Relaxed);
                    let also = if also.is_empty() { also } else { format!("; {also}") };
                    // Taken all the same: a stop is not undone by a reload.
                    let taken = match stop.count {
                        0 => format!("new {what} get the new configuration"),
                        _ => format!("it is stopping, though: no new {what} come"),
                    };
                    let config = server.config();
                    let changed = *config.limits() != before;
                    let line = format!(
                        "{who} reloaded: {taken}; {}{}{also}",
                        limits_line(config.limits(), what),
                        if changed { " (changed)" } else { "" },
                    );
                    let fields = || reload_fields(&*config, Ok(changed));
                    crate::subcommand::print_event("reload", line, fields);
                }
                Err(e) => {
                    reloads.refused.fetch_add(1, Ordering::Relaxed);
                    let why = crate::subcommand::reload_failed(&e);
                    // Standard error has it; a reader of the JSON lines gets it too.
                    if crate::json_lines::is_on() {
                        let line = format!("{who} reload refused: {why}");
                        let running = server.config();
                        let fields = || reload_fields(&*running, Err(why));
                        crate::subcommand::print_event("reload", line, fields);
                    }
                }
            },
            r = stop.next() => {
                r?;
                if cut_asked {
                    let (phase, text) = leave_now(server, &print, (who, what));
                    let left = left_without_reports(&phase, &text);
                    print_stop(phase, text);
                    return left;
                }
                if stop.count > 1 {
                    cut_asked = true;
                    cut_open(server, (who, what), CutCause::Signal);
                    continue;
                }
                // The drain's end is kept here rather than by the listener, so that the
                // "cutting" line comes before the cut connections' reports, as after a signal.
                server.drain(Duration::MAX);
                drain_over = Some(tokio::time::Instant::now() + grace);
                let open = server.open_connections() as u64;
                print_stop(
                    StopPhase::Draining { grace_secs: grace.as_secs(), open },
                    format!(
                        "{who} stopping: no new {what}; open ones have {}s to end (signal again to cut them now)",
                        grace.as_secs()
                    ),
                );
            }
            () = mbx_net::sleep_until_some(drain_over), if !cut_asked => {
                cut_asked = true;
                cut_open(server, (who, what), CutCause::DrainTimeOver);
            }
            report = server.next_report() => match report {
                Some(r) => print(&r),
                None if stop.count > 0 => {
                    let cut = server.connections_cut();
                    print_stop(StopPhase::Stopped { cut }, stopped_line(who, cut, what));
                    return Ok(());
                }
                None => bail!("the {who} stopped"),
            },
        }
    }
}

/// The service's metrics listener, if it has one: bound with the service's own, before the
/// banner, so that an address in use fails the start instead of following a "listening" line.
async fn bind_metrics(service: &Service) -> anyhow::Result<Option<tokio::net::TcpListener>> {
    let Some(addr) = service.metrics_listen.as_deref() else {
        return Ok(None);
    };
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen for metrics on {addr}"))?;
    Ok(Some(listener))
}

/// A task answering Prometheus scrapes on `listener` with the counters of `stats` (`who`: the
/// metric names' role) and `reloads`; it stops when the guard drops.
fn serve_service_metrics(
    listener: tokio::net::TcpListener,
    who: &str,
    stats: ListenerStats,
    reloads: Arc<Reloads>,
) -> anyhow::Result<AbortOnDrop> {
    print_line(format!(
        "metrics: http://{}/metrics",
        listener.local_addr().context("metrics listener")?
    ));
    let errors = Arc::new(AtomicU64::new(0));
    let prefix = format!("mbtls_{who}");
    let scrape_errors = errors.clone();
    let render: mbx_net::metrics::Render = Arc::new(move || {
        service_metrics_text(
            &prefix,
            &stats,
            &reloads,
            scrape_errors.load(Ordering::Relaxed),
        )
    });
    let task = tokio::spawn(mbx_net::metrics::serve_metrics(listener, errors, render));
    Ok(AbortOnDrop(task))
}

/// SIGHUP reloads so far: applied, and refused (the configuration stayed).
#[derive(Default)]
struct Reloads {
    applied: AtomicU64,
    refused: AtomicU64,
}

/// Aborts its task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The Prometheus text of one service's counters.
fn service_metrics_text(
    prefix: &str,
    stats: &ListenerStats,
    reloads: &Reloads,
    metrics_accept_errors: u64,
) -> String {
    use mbx_net::metrics::{write_labelled, write_metric};
    let ended = stats.ended();
    let mut out = String::new();
    let name = |n: &str| format!("{prefix}_{n}");
    write_metric(
        &mut out,
        "counter",
        &name("connections_accepted_total"),
        "Connections accepted.",
        stats.accepted(),
    );
    write_metric(
        &mut out,
        "gauge",
        &name("connections_open"),
        "Connections being served now.",
        stats.open_connections() as u64,
    );
    write_labelled(
        &mut out,
        "counter",
        &name("connections_ended_total"),
        "Connections that ended, cleanly or with an error.",
        "outcome",
        [("clean", ended.ended_cleanly), ("failed", ended.failed)],
    );
    write_metric(
        &mut out,
        "counter",
        &name("connections_refused_per_client_total"),
        "Connections closed at their accept: their client address had max_connections_per_client open.",
        stats.refused_per_client(),
    );
    write_metric(
        &mut out,
        "counter",
        &name("connections_refused_rate_per_client_total"),
        "Connections closed at their accept: their client opened them faster than connection_rate_per_client.",
        stats.refused_rate_per_client(),
    );
    // Only a middlebox remembers legacy servers.
    if let Some(remembered) = stats.legacy_servers_remembered() {
        write_metric(
            &mut out,
            "gauge",
            &name("legacy_servers_remembered"),
            "Next hops remembered as legacy servers (server side): their sessions pass through unannounced.",
            remembered as u64,
        );
    }
    write_metric(
        &mut out,
        "counter",
        &name("connections_cut_total"),
        "Connections cut by a stop after the drain's grace period.",
        stats.connections_cut(),
    );
    write_metric(
        &mut out,
        "counter",
        &name("sessions_with_middlebox_total"),
        "Ended sessions in which a middlebox held keys (at a middlebox: this one).",
        ended.middlebox_took_part,
    );
    write_metric(
        &mut out,
        "counter",
        &name("key_updates_total"),
        "TLS 1.3 KeyUpdates followed by ended sessions (at a middlebox: passed on; at a server or client proxy: the peer's).",
        ended.key_updates,
    );
    write_labelled(
        &mut out,
        "counter",
        &name("bytes_total"),
        "Bytes carried by ended connections, toward the server (upstream) and back.",
        "direction",
        [
            ("upstream", ended.upstream_bytes),
            ("downstream", ended.downstream_bytes),
        ],
    );
    write_metric(
        &mut out,
        "counter",
        &name("accept_errors_total"),
        "Failed accepts (out of file descriptors or memory), service and metrics listeners.",
        stats.accept_errors() + metrics_accept_errors,
    );
    write_labelled(
        &mut out,
        "counter",
        &name("reloads_total"),
        "SIGHUP reloads, applied or refused (the configuration stayed).",
        "result",
        [
            ("applied", reloads.applied.load(Ordering::Relaxed)),
            ("refused", reloads.refused.load(Ordering::Relaxed)),
        ],
    );
    out
}

/// A number from a flag overrides the config file's.
fn set_secs(table: &mut toml::Table, key: &str, secs: Option<u64>) -> anyhow::Result<()> {
    if let Some(t) = secs {
        // Past what a TOML integer holds (said without the conversion's own words).
        let t = i64::try_from(t)
            .map_err(|_| anyhow::anyhow!("{key} {t} is too large (at most {})", i64::MAX))?;
        table.insert(key.into(), toml::Value::Integer(t));
    }
    Ok(())
}

/// The longest handshake or idle timeout a service takes: a year.
const MAX_TIMEOUT_SECS: u64 = 365 * 24 * 3600;

/// Descriptors the process keeps for itself (listener, epoll, standard streams, files read while
/// serving, the metrics endpoint's scrapes) besides its connections'.
const RESERVED_FILES: u64 = 32 + mbx_net::metrics::MAX_SCRAPES as u64;

/// A middlebox connection and a server session each hold two sockets; with the open-files soft
/// limit (already raised to the hard one) that caps how many can be served. Accepting more
/// would only fail them when their second socket cannot be opened, so the default connection
/// limit is that cap (HAProxy derives its default `maxconn` the same way); `None` when the limit
/// is unlimited.
fn connections_the_files_limit_allows() -> Option<usize> {
    let soft = rustix::process::getrlimit(rustix::process::Resource::Nofile).current?;
    let cap = soft.saturating_sub(RESERVED_FILES) / 2;
    usize::try_from(cap.max(1)).ok()
}

/// `max_connections` as asked, refused when the open-files limit (already raised to the hard
/// one) cannot hold that many connections' descriptors: beyond it each connection accepted
/// would fail when it opens its second socket (found in an operator trial: 1,000 asked under
/// a limit of 128, and every session past the 40th failed with "Too many open files").
fn connections_the_files_limit_can_take(asked: u64) -> anyhow::Result<usize> {
    if let Some(cap) = connections_the_files_limit_allows() {
        if asked > cap as u64 {
            let soft = rustix::process::getrlimit(rustix::process::Resource::Nofile).current;
            bail!(
                "max_connections {asked} is more than the open-files limit ({}) can serve: each \
                 connection holds two descriptors and {RESERVED_FILES} are kept for the \
                 process, so at most {cap}; raise the limit (ulimit -n, systemd's \
                 LimitNOFILE=) or lower max_connections",
                soft.unwrap_or_default()
            );
        }
    }
    Ok(usize::try_from(asked)?)
}

/// The banner line that states a middlebox's or server's limits.
fn limits_line(limits: &Limits, what: &str) -> String {
    let secs = |d: Duration| format!("{}s", d.as_secs());
    let per_client = limits
        .max_connections_per_client
        .map_or(String::new(), |n| format!(", {n} per client address"));
    let rate = limits
        .connection_rate_per_client
        .map_or(String::new(), |r| {
            format!(
                ", {} new per second per client address (burst {})",
                r.per_second, r.burst
            )
        });
    format!(
        "limits: handshake {}, idle {}, at most {} at once{per_client}{rate}",
        secs(limits.handshake_timeout),
        limits.idle_timeout.map_or("never".into(), secs),
        limits
            .max_connections
            .map_or(format!("unlimited {what}"), |n| {
                count_of(n as u64, what)
            }),
    )
}

/// What a failed bind of `addr` says; an address without a port is named as such (before,
/// "bind: invalid socket address", found in a user trial).
fn cannot_listen(addr: &str) -> String {
    let port = addr.rsplit_once(':').map(|(_, port)| port);
    if port.is_none_or(|p| p.parse::<u16>().is_err()) {
        format!("cannot listen on {addr}: it has no port; give host:port (e.g. 127.0.0.1:8443 or [::]:443)")
    } else {
        format!("cannot listen on {addr}")
    }
}

/// `n` of `what` (a plural: "connections", "sessions"), singular for one.
fn count_of(n: u64, what: &str) -> String {
    match n {
        1 => format!("1 {}", what.strip_suffix('s').unwrap_or(what)),
        n => format!("{n} {what}"),
    }
}

fn server_settings(flags: ServerFlags, config: &MbtlsConfig) -> anyhow::Result<ServerSettings> {
    let mut table = config.server.clone();
    set(&mut table, "listen", flags.listen);
    set(&mut table, "backend", flags.backend);
    // Before the flags' own choice is put in.
    flags_choice_replaces_the_files(
        &mut table,
        !flags.middlebox_names.is_empty(),
        !flags.allow_middleboxes.is_empty(),
        flags.max_discovered.is_some(),
        false,
    );
    set(&mut table, "certificate", path_str(flags.certificate));
    set(&mut table, "private_key", path_str(flags.private_key));
    set(&mut table, "middlebox_ca", path_str(flags.middlebox_ca));
    flags.attestation.merge_into(&mut table);
    set(&mut table, "tls", flags.tls);
    if flags.session_tickets {
        table.insert("session_tickets".into(), toml::Value::Boolean(true));
    }
    set_secs(&mut table, "ticket_key_secs", flags.ticket_key_secs)?;
    if flags.fresh_evidence {
        table.insert("middlebox_resumption".into(), toml::Value::Boolean(false));
    }
    if flags.announcements_after_hello {
        table.insert(
            "announcements_after_hello".into(),
            toml::Value::Boolean(true),
        );
    }
    if let Some(n) = flags.max_discovered {
        table.insert("max_discovered".into(), toml::Value::Integer(i64::from(n)));
    }
    append_to_list(&mut table, "middlebox_names", flags.middlebox_names);
    append_to_list(&mut table, "allow_middleboxes", flags.allow_middleboxes);
    let service = Service::take_from(&mut table, &flags.service, &config.origin("server"))?;
    let mut s: ServerSettings = role_settings(table, "server", config)?;
    s.service = service;
    Ok(s)
}

/// `max_discovered` beside pre-configured names would mean nothing: refused, not ignored.
fn max_discovered_only_for_discovery(names: &[String], max: Option<u8>) -> anyhow::Result<()> {
    ensure!(
        names.is_empty() || max.is_none(),
        "max_discovered (--max-discovered) applies to discovery (an allow-list), not to pre-configured middleboxes"
    );
    Ok(())
}

/// How the middleboxes are chosen (by name, by an allow-list for discovery, or none on the
/// client's side), when the flags say it, replaces the config file's choice instead of
/// clashing with it or lengthening it: names replace the file's names and its discovery
/// settings, an allow-list replaces the file's allow-list and names (the file's
/// `max_discovered` still applies to it), `--max-discovered` alone drops the file's names.
fn flags_choice_replaces_the_files(
    table: &mut toml::Table,
    names: bool,
    allow_list: bool,
    max_discovered: bool,
    none: bool,
) {
    let mut replaced = Vec::new();
    if names || allow_list || max_discovered || none {
        replaced.extend(["middlebox_name", "middlebox_names", "no_client_middleboxes"]);
    }
    if names || allow_list || none {
        replaced.push("allow_middleboxes");
    }
    if names || none {
        replaced.push("max_discovered");
    }
    for key in replaced {
        table.remove(key);
    }
}

/// A policy file given as a flag replaces the config file's policy: its `policy` or inline
/// `[attestation]`, and what the file adds to it (`measurements`, `sim_platform_keys`,
/// `allow_simulated`), which would otherwise widen the policy the flag names. The flags' own
/// additions still apply.
fn policy_flag_replaces_the_files(table: &mut toml::Table, policy_flag: bool) {
    if policy_flag {
        for key in [
            "attestation",
            "measurements",
            "sim_platform_keys",
            "allow_simulated",
        ] {
            table.remove(key);
        }
    }
}

/// An endpoint's configuration for its secondary sessions; `resumption`: the
/// `middlebox_resumption` setting (`Some(false)`: `--fresh-evidence`, no session kept).
fn secondary_config(middlebox_ca: Vec<u8>, resumption: Option<bool>) -> TlsConfig {
    let mut cfg = secondary_client_config(middlebox_ca);
    if resumption == Some(false) {
        cfg.resume_sessions = 0;
    }
    cfg
}

/// Refuses middlebox names that can match no certificate: an empty one, and a wildcard
/// (names are compared exactly with the certificate's DNS names; a `*.test` in an allow-list
/// matched nothing and every session ran without its middlebox, found in a user trial).
fn check_middlebox_names(names: &[String], key: &str) -> anyhow::Result<()> {
    for name in names {
        ensure!(!name.trim().is_empty(), "{key}: a middlebox name is empty");
        ensure!(
            !name.contains('*'),
            "{key}: {name:?} is a pattern, but middlebox names are exact DNS names, compared \
             with the certificate's: list each middlebox's name"
        );
    }
    Ok(())
}

/// Approves a discovered middlebox whose leaf certificate carries one of `names` as a DNS name.
fn name_approver(names: Vec<String>) -> Approver {
    Arc::new(move |chain: &[Vec<u8>]| {
        let Some(leaf) = chain.first() else {
            return false;
        };
        let Ok(cert) = openssl::x509::X509::from_der(leaf) else {
            return false;
        };
        let Some(sans) = cert.subject_alt_names() else {
            return false;
        };
        sans.iter()
            .filter_map(|n| n.dnsname())
            .any(|d| names.iter().any(|allowed| allowed.eq_ignore_ascii_case(d)))
    })
}

/// A server as its settings describe it: the driver's configuration, and what the banner says.
struct ServerSetup {
    cfg: MbtlsServerConfig,
    /// What the primary and secondary contexts were built from.
    primary_tls: TlsConfig,
    secondary_tls: TlsConfig,
    s: ServerSettings,
    described: String,
    /// The names the server's certificate carries.
    certificate_names: String,
}

impl ServerSetup {
    /// What a reload's line shows (the banner too, in its own order): backend, TLS versions,
    /// certificate, middleboxes and, when middleboxes may join, the policy they must pass.
    fn shown_parts(&self) -> [Part; 5] {
        let s = &self.s;
        let policy = match !s.middleboxes_may_join() {
            true => part("no policy (no middlebox may join)".into(), " (changed)"),
            false => {
                // The policy's text sums it up: the whole of it, and the middleboxes' CA,
                // tell whether it changed.
                let policy = &self.cfg.handshake.policy;
                let key = format!("{policy:?} {}", trust_key(&[&self.secondary_tls]));
                (policy_line(policy), key, " (changed)")
            }
        };
        [
            part(format!("backend {}", s.backend), " (changed)"),
            part(versions_shown(s.tls.as_deref()), " (changed)"),
            certificate_part(
                &self.certificate_names,
                " (changed: clients must expect it)",
            ),
            part(
                format!("server-side middlebox: {}", self.described),
                " (changed)",
            ),
            policy,
        ]
    }
}

fn server(
    flags: ServerFlags,
    config: &MbtlsConfig,
    config_path: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    raise_open_files_limit();
    let setup = server_setup(flags.clone(), config)?;
    let parts = setup.shown_parts();
    let shown = ShownParts::new(&parts);
    // The banner's TLS versions and certificate (with its validity warning, if any), as a
    // reload's line shows them.
    let (versions, certificate) = (parts[1].0.clone(), parts[2].0.clone());
    let ServerSetup {
        cfg,
        primary_tls,
        secondary_tls,
        s,
        described,
        ..
    } = setup;
    let hs = &cfg.handshake;
    let running_primary = RunningContext::new(&primary_tls, &(), &hs.primary);
    let running_secondary = RunningContext::new(&secondary_tls, &hs.policy, &hs.secondary);
    let reload = || -> anyhow::Result<(MbtlsServerConfig, String)> {
        let mut new = server_setup(flags.clone(), &reread(config, config_path)?)?;
        fixed_at_start_unchanged((&s.listen, &s.service), (&new.s.listen, &new.s.service))?;
        // Remembered once nothing more can fail.
        new.cfg.check()?;
        let line = shown.reloaded(&new.shown_parts());
        let hs = &mut new.cfg.handshake;
        running_primary.keep_unless_changed(new.primary_tls, (), &mut hs.primary);
        let policy = hs.policy.clone();
        running_secondary.keep_unless_changed(new.secondary_tls, policy, &mut hs.secondary);
        Ok((new.cfg, line))
    };
    let limits = cfg.limits;
    // Only when middleboxes may join.
    let policy = s
        .middleboxes_may_join()
        .then(|| policy_line(&cfg.handshake.policy));
    runtime()?.block_on(async {
        let signals = ServiceSignals::new()?;
        let mut server = MbtlsServer::bind(s.listen.as_str(), cfg)
            .await
            .with_context(|| cannot_listen(&s.listen))?;
        let metrics = bind_metrics(&s.service).await?;
        s.service.start_reports("server", server.local_addr());
        let text = format!(
            "mbTLS server listening on {}, backend {}, {versions}, {certificate}",
            server.local_addr(),
            s.backend,
        );
        print_listening(text, &*server.config());
        match &policy {
            Some(policy) => {
                print_line(format_args!("server-side middlebox: {described}; {policy}"))
            }
            None => print_line(format_args!("server-side middlebox: {described}")),
        }
        print_line(limits_line(&limits, "sessions"));
        let names = ("server", "sessions");
        let print = print_server_report;
        let started = (signals, metrics);
        serve_until_stopped(&mut server, started, &s.service, names, print, &reload).await
    })
}

/// What the server answers when its backend cannot be reached, before its close_notify: an
/// HTTP 502, as a reverse proxy does (the backend is an HTTP server), not a silent close.
const BAD_GATEWAY: &[u8] = b"HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain\r\n\
Content-Length: 30\r\nConnection: close\r\n\r\nthe backend cannot be reached\n";

fn server_setup(flags: ServerFlags, config: &MbtlsConfig) -> anyhow::Result<ServerSetup> {
    let s = server_settings(flags, config)?;
    // The server would connect to itself for every session (found in a user trial: curl got
    // an empty reply and the server reported a clean end).
    let own = |a: &str| a.parse::<SocketAddr>().ok();
    ensure!(
        own(&s.listen).is_none() || own(&s.listen) != own(&s.backend),
        "backend (--backend) {} is this server's own listening address: give the address of \
         the plain-HTTP server behind it",
        s.backend
    );
    let policy = build_policy(PolicyParts {
        file: &s.policy,
        table: &s.attestation,
        allow_simulated: s.allow_simulated,
        measurements: &s.measurements,
        sim_platform_keys: &s.sim_platform_keys,
    })?;
    let id = mbx_engine::Identity::from_pem_files(&s.certificate, &s.private_key)?;
    let chain = id.cert_chain_pem.clone();
    let certificate_names = certificate_names(&chain);
    let mut primary = primary_server_config(id);
    if let Some(v) = s.tls.as_deref().map(parse_version).transpose()? {
        primary = primary.only(v);
    }
    // Tickets only when asked (each costs the server some work per handshake). TLS 1.2
    // clients can resume by session ID (OpenSSL's server cache) either way, through
    // server-side middleboxes too.
    primary.session_tickets = s.session_tickets;
    ensure!(
        s.session_tickets || s.ticket_key_secs.is_none(),
        "ticket_key_secs (--ticket-key-secs) applies with session_tickets (--session-tickets) only: without it the server seals no tickets"
    );
    // Under keys replaced every hour (a resumed TLS 1.2 session has no fresh key exchange: a
    // ticket key opens its sessions for as long as it is kept).
    primary.ticket_key_rotation = Some(ticket_key_period(s.ticket_key_secs)?);
    let names = s.middlebox_names.clone();
    max_discovered_only_for_discovery(&names, s.max_discovered)?;
    check_middlebox_names(&names, "middlebox_names (--middlebox-name)")?;
    check_middlebox_names(
        &s.allow_middleboxes,
        "allow_middleboxes (--allow-middlebox)",
    )?;
    if !s.middleboxes_may_join() {
        // No middlebox may join: what would check one is ignored, and an operator who gave it
        // most likely forgot the middlebox's name (found in a user trial).
        let given: Vec<&str> = [
            (s.middlebox_ca.is_some(), "middlebox_ca (--middlebox-ca)"),
            (
                s.policy.is_some() || s.attestation.is_some(),
                "policy (--policy, [attestation])",
            ),
            (s.allow_simulated, "allow_simulated (--allow-simulated)"),
            (!s.measurements.is_empty(), "measurements (--measurement)"),
            (
                !s.sim_platform_keys.is_empty(),
                "sim_platform_keys (--sim-platform-key)",
            ),
            (
                s.middlebox_resumption.is_some(),
                "middlebox_resumption (--fresh-evidence)",
            ),
            (
                s.max_discovered.is_some(),
                "max_discovered (--max-discovered)",
            ),
            (
                s.announcements_after_hello,
                "announcements_after_hello (--announcements-after-hello)",
            ),
        ]
        .into_iter()
        .filter_map(|(given, what)| given.then_some(what))
        .collect();
        ensure!(
            given.is_empty(),
            "{} would be ignored: no middlebox may join this server; give its name \
             (middlebox_names, --middlebox-name) or an allow-list (allow_middleboxes, \
             --allow-middlebox)",
            given.join(", ")
        );
    }
    ensure!(
        names.is_empty() || !s.announcements_after_hello,
        "announcements_after_hello (--announcements-after-hello) is for discovered middleboxes \
         (allow_middleboxes, --allow-middlebox): pre-configured ones may announce themselves \
         after the ClientHello anyway"
    );
    let (middlebox, described) = match (names.as_slice(), s.allow_middleboxes.is_empty()) {
        ([_, ..], false) => bail!(
            "give middlebox_names (--middlebox-name) or allow_middleboxes (--allow-middlebox), not both"
        ),
        ([name], true) => (
            ServerMiddlebox::Preconfigured(name.clone()),
            format!("pre-configured {name} (required)"),
        ),
        ([_, _, ..], true) => (
            ServerMiddlebox::PreconfiguredPath(names.clone()),
            format!(
                "pre-configured {} (all required, in this order from the client)",
                names.join(" -> ")
            ),
        ),
        ([], false) => {
            let n = max_discovered(s.max_discovered)?;
            (
                ServerMiddlebox::DiscoverUpTo(name_approver(s.allow_middleboxes.clone()), n),
                format!(
                    "discovered (up to {n}), approved if named {}{}",
                    s.allow_middleboxes.join(", "),
                    if s.announcements_after_hello {
                        ", announcing before or after the ClientHello"
                    } else {
                        ""
                    }
                ),
            )
        }
        ([], true) => (
            ServerMiddlebox::DiscoverUpTo(
                Arc::new(|_: &[Vec<u8>]| false),
                max_discovered(s.max_discovered)?,
            ),
            "none accepted (announcing middleboxes are excluded)".to_string(),
        ),
    };
    // Without a middlebox CA nothing can verify: the server's own chain stands in as the trust
    // store, so only a middlebox certified by the server's own CA chain could pass.
    let mbox_ca = match &s.middlebox_ca {
        Some(p) => read_pem_file(p, "middlebox CA file", PemKind::Certificates)?,
        None if !names.is_empty() || !s.allow_middleboxes.is_empty() => {
            bail!(
                "middlebox_ca (--middlebox-ca) is required with middlebox_names (--middlebox-name) or allow_middleboxes (--allow-middlebox)"
            )
        }
        None => chain,
    };
    let secondary = secondary_config(mbox_ca, s.middlebox_resumption);
    let cfg = MbtlsServerConfig {
        handshake: ServerHandshakeConfig {
            primary: Arc::new(OpenSslContext::new(&primary).context("server TLS configuration")?),
            secondary: Arc::new(
                RustlsClientContext::new(&secondary).context("middlebox TLS configuration")?,
            ),
            middlebox,
            policy,
            now_unix: 0,
            announcements_after_hello: s.announcements_after_hello,
        },
        backend: {
            check_host_port("backend (--backend)", &s.backend)?;
            s.backend.clone()
        },
        limits: s.service.limits()?,
        backend_unavailable: Some(BAD_GATEWAY.to_vec()),
    };
    Ok(ServerSetup {
        cfg,
        primary_tls: primary,
        secondary_tls: secondary,
        s,
        described,
        certificate_names,
    })
}

fn print_server_report(r: &ServerConnectionReport) {
    print_session(server_report_line(r), || crate::mbtls_json::server(r));
}

fn server_report_line(r: &ServerConnectionReport) -> String {
    let from = r.peer.map(|a| a.to_string()).unwrap_or_default();
    let mut line = format!("session {} from {from}: ", r.id);
    match &r.summary {
        Some(sum) => {
            line.push_str(version_name(sum.version));
            if sum.resumed {
                line.push_str(", session resumed");
            }
            if sum.hops.is_empty() {
                // Never exported: no middlebox could join (docs/mbtls.md §6).
                line.push_str("; keys kept in OpenSSL");
            } else {
                line.push_str(&format!("; hops {}", hops_text(&sum.hops)));
            }
            if r.verdicts.is_empty() {
                line.push_str("; no middlebox");
            }
        }
        // A refused middlebox has no verdict: the error below names it.
        None => line.push_str("handshake not finished"),
    }
    line.push_str(&verdicts_text(r.verdicts_in_path_order()));
    line.push_str(&format!(
        "; {} to the backend, {} back",
        count_of(r.bytes_to_backend, "bytes"),
        r.bytes_from_backend
    ));
    // As the middlebox's line says them (its count has the answers too).
    if r.key_updates > 0 {
        line.push_str(&format!(
            "; {} from the client followed",
            count_of(u64::from(r.key_updates), "KeyUpdates")
        ));
    }
    let end = spliced_outcome_text(
        &r.outcome,
        r.peer_left_without_close_notify,
        ("client", "backend"),
    );
    line.push_str(&end);
    // What would fix a refusal, as the client's error says it.
    if let Some(e) = &r.error {
        line.push_str(&fix_hint(e, mbx_engine::Role::Server));
    }
    line
}

/// What a client proxy serves its connections with.
fn proxy_config(setup: ClientSetup) -> anyhow::Result<ClientProxyConfig> {
    Ok(ClientProxyConfig {
        limits: setup.s.service.limits()?,
        handshake: setup.cfg,
        first_hop: setup.first_hop,
        session_failed_answer: Some(Arc::new(proxy_session_failed)),
    })
}

/// What the client proxy's local connection is told when its mbTLS session fails before the
/// server sent anything (before or after the session came up: the words fit both, found in an
/// adversarial trial where "no mbTLS session" followed 750 KB carried): an HTTP 502, as the
/// server answers when its backend is down (the proxy carries HTTP to an https URL), so that
/// curl says why instead of "couldn't connect", with the error and what the one-shot client
/// would say of it (found in a user trial: a 502 that said only "the first hop closed the
/// connection").
fn proxy_session_failed(e: &mbx_mbtls::driver::DriverError) -> Vec<u8> {
    let why = format!("{e}{}", client_hint(e));
    format!(
        "HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain; charset=utf-8\r\n\
         Connection: close\r\n\r\nmbx mbtls proxy: the mbTLS session to the server failed: {}\n",
        crate::subcommand::escape_controls(&why, false)
    )
    .into_bytes()
}

/// A TLS context in use, and the settings it was built from. A reload whose settings for it did
/// not change keeps it, and with it what it holds across sessions: a client's sessions to
/// resume (docs/mbtls.md §4.6), the vouched secondary sessions with middleboxes (§4.7), a
/// server's session cache and ticket keys. Any change (a name, a CA, a certificate, versions,
/// resumption) starts afresh, since a session is resumed without the checks the new settings
/// would make; for the secondary context so does a new attestation policy, under which the
/// sessions vouched for by the old one would be offered until their old end and then fail
/// (a shorter `resumed_evidence_max_age`) instead of making full handshakes.
/// A middlebox's context holds its ticket keys, and a resumed session brings no new evidence:
/// it is kept only while what its evidence shows (the attestation line: the measurement, which
/// covers the app, and the platform) is the same.
struct RunningContext<C: ?Sized, V>(std::sync::Mutex<Running<C, V>>);

/// The settings a context was built from, and what its sessions were vouched under (`V`: an
/// endpoint's secondary context, the attestation policy; a middlebox's, what its evidence
/// shows; a primary context, nothing of ours, `()`).
type Running<C, V> = (TlsConfig, V, Arc<C>);

impl<C: ?Sized, V: PartialEq + Clone> RunningContext<C, V> {
    fn new(tls: &TlsConfig, vouched: &V, context: &Arc<C>) -> Self {
        let running = (tls.clone(), vouched.clone(), context.clone());
        RunningContext(std::sync::Mutex::new(running))
    }

    /// Puts the running context in `new_context` if `new_tls` and `new_vouched` ask for the
    /// same, else makes the new one the running one.
    fn keep_unless_changed(&self, new_tls: TlsConfig, new_vouched: V, new_context: &mut Arc<C>) {
        let mut running = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if running.0.same_settings(&new_tls) && running.1 == new_vouched {
            *new_context = running.2.clone();
        } else {
            *running = (new_tls, new_vouched, new_context.clone());
        }
    }
}

/// `mbx mbtls client --proxy`: every local connection gets its own mbTLS session. On SIGHUP
/// `reload` gives the configuration for the connections accepted afterwards; `grace` is the
/// drain's (a reload does not change it, as for the middlebox and the server).
fn local_proxy(
    (listen, shown): (&str, &str),
    cfg: ClientProxyConfig,
    service: &Service,
    reload: &dyn Fn() -> anyhow::Result<(ClientProxyConfig, String)>,
) -> anyhow::Result<()> {
    let limits = cfg.limits;
    runtime()?.block_on(async move {
        let signals = ServiceSignals::new()?;
        let mut proxy = ClientProxy::bind(listen, cfg)
            .await
            .with_context(|| cannot_listen(listen))?;
        let metrics = bind_metrics(service).await?;
        service.start_reports("client-proxy", proxy.local_addr());
        // The policy's part carries the warning when middleboxes of ours may join and none
        // can pass (what a fetch prints with its verdicts).
        let text = format!(
            "mbTLS client proxy listening on {}, {shown}",
            proxy.local_addr()
        );
        print_listening(text, &*proxy.config());
        print_line(limits_line(&limits, "connections"));
        let names = ("proxy", "connections");
        serve_until_stopped(
            &mut proxy,
            (signals, metrics),
            service,
            names,
            print_proxy_report,
            reload,
        )
        .await
    })
}

fn print_proxy_report(r: &ProxyReport) {
    print_session(proxy_report_line(r), || crate::mbtls_json::proxy(r));
}

/// A client proxy connection's report line.
fn proxy_report_line(r: &ProxyReport) -> String {
    let peer = r
        .local_peer
        .map_or_else(|| "?".to_string(), |p| p.to_string());
    let hops = r
        .summary
        .as_ref()
        .map(|s| match s.hops.as_slice() {
            [] => "kept in OpenSSL".to_string(),
            hops => hops_text(hops),
        })
        .unwrap_or_default();
    // Where the first hop saw the connection come from, which its report names.
    let peer = match r.first_hop_local {
        Some(local) => format!("{peer} (to the first hop from {local})"),
        None => peer,
    };
    // What would fix a failure, as the one-shot client says (found in a user trial: the
    // proxy's line lacked the flag that accepts a refused measurement); with TLS 1.3 a server
    // refuses its own middlebox after the handshake (a second trial).
    let fix = r.error.as_deref().map_or(String::new(), client_hint);
    match (&r.outcome, r.connected) {
        (Err(e), false) => {
            // The middleboxes it had checked (its JSON line lists them too).
            let checked = verdicts_text(r.verdicts_in_path_order());
            format!(
                "connection {} from {peer}: mbTLS session failed: {e}{checked}{fix}",
                r.id
            )
        }
        (outcome, _) => {
            // As the server's and the middlebox's lines say it (a reload may change `tls`).
            let version = r
                .summary
                .as_ref()
                .map_or(String::new(), |s| format!("{}; ", version_name(s.version)));
            let bytes = format!("{version}{} bytes up, {} down; ", r.bytes_up, r.bytes_down);
            let key_updates = match r.key_updates {
                0 => String::new(),
                n => format!(
                    "{} from the server followed; ",
                    count_of(u64::from(n), "KeyUpdates")
                ),
            };
            let via = match r.summary.as_ref().map(|s| s.middleboxes.join(", ")) {
                Some(names) if !names.is_empty() => format!("via {names}; "),
                _ => String::new(),
            };
            let resumed = match r.summary.as_ref() {
                Some(s) if s.resumed => "session resumed; ",
                _ => "",
            };
            let mb_resumed: Vec<&str> = r
                .verdicts
                .iter()
                .filter_map(|v| match v {
                    MiddleboxVerdict::Verified {
                        middlebox,
                        resumed: true,
                        ..
                    } => Some(middlebox.as_str()),
                    _ => None,
                })
                .collect();
            let mb_resumed = match mb_resumed.as_slice() {
                [] => String::new(),
                names => format!("middlebox sessions resumed: {}; ", names.join(", ")),
            };
            // A middlebox the client refused (the allow-list, its evidence) stood aside; the
            // line says so and why (found in a user trial: only the JSON did).
            let excluded: String = r
                .verdicts
                .iter()
                .filter(|v| matches!(v, MiddleboxVerdict::Excluded { .. }))
                .map(|v| format!("{}; ", verdict_text(v, false)))
                .collect();
            let end = spliced_outcome_text(
                outcome,
                r.peer_left_without_close_notify,
                ("server", "local"),
            );
            format!(
                "connection {} from {peer}: {bytes}{key_updates}{via}{resumed}{mb_resumed}{excluded}hops {hops}{end}{fix}",
                r.id
            )
        }
    }
}

/// `max_discovered` from the configuration: at least 1 (default 1).
fn max_discovered(n: Option<u8>) -> anyhow::Result<u8> {
    match n.unwrap_or(1) {
        0 => bail!("max_discovered (--max-discovered) must be at least 1"),
        n => Ok(n),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stop signal after the cut gives the reports already in and says how many it leaves
    /// without (a user trial saw "left" say 0 while four reports were waiting unread); once
    /// every report is in, it is "stopped".
    #[tokio::test(flavor = "current_thread")]
    async fn a_leave_gives_the_reports_already_in_and_counts_the_others() {
        let pki = mbx_testbed::TestPki::new("cli leave CA").unwrap();
        let leaf = pki
            .issue(&mbx_testbed::LeafSpec::middlebox("mb.test"))
            .unwrap();
        let identity = mbx_engine::Identity::from_pem(leaf.chain_pem(), leaf.key_pem().as_bytes());
        // A next hop whose kernel takes the connections, which then wait there.
        let next_hop = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let cfg = MiddleboxServerConfig {
            handshake: MiddleboxHandshakeConfig::new(&TlsConfig::server(identity), None).unwrap(),
            next_hop: next_hop.local_addr().unwrap().to_string().into(),
            app: Arc::new(|| Box::new(PassThrough) as Box<_>),
            placement: Placement::ClientSide,
            limits: Limits::default(),
            forget_legacy_after: None,
        };
        let mut server = MiddleboxServer::bind("127.0.0.1:0", cfg).await.unwrap();
        // Two clients that say nothing: each connection waits for its ClientHello.
        let addr = server.local_addr();
        let _clients = [
            tokio::net::TcpStream::connect(addr).await.unwrap(),
            tokio::net::TcpStream::connect(addr).await.unwrap(),
        ];
        // Both connected to the next hop (the listener counts them open from their accept).
        let mut _held = Vec::new();
        for _ in 0..2 {
            _held.push(next_hop.accept().await.unwrap());
        }
        let printed = std::cell::Cell::new(0u64);
        let print = |_: &ConnectionReport| printed.set(printed.get() + 1);
        let names = ("middlebox", "connections");
        server.drain(Duration::MAX);
        server.cut_now();
        // On this one thread the listener has not run since: no report is in yet.
        let (phase, text) = leave_now(&mut server, &print, names);
        assert!(matches!(phase, StopPhase::Left { unreported: 2 }), "{text}");
        assert_eq!(
            text,
            "middlebox stopped without the reports of 2 connections still ending"
        );
        // Reports left behind end the process with an error (status 1), the same text.
        let left = left_without_reports(&phase, &text).unwrap_err();
        assert_eq!(left.to_string(), text);
        // Once the cut connections' reports are in, a leave gives them and says "stopped".
        while server.open_connections() > 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let (phase, text) = leave_now(&mut server, &print, names);
        assert!(matches!(phase, StopPhase::Stopped { cut: 2 }), "{text}");
        assert_eq!((printed.get(), server.reports_to_come()), (2, 0));
        assert_eq!(text, "middlebox stopped (2 connections cut)");
        assert!(left_without_reports(&phase, &text).is_ok());
    }

    /// A client proxy's line names its own address toward the first hop (which the first
    /// hop's report names), says what would fix a failure also when the session had come up
    /// (with TLS 1.3 a server refuses its own middlebox after the handshake, with an alert),
    /// and names a middlebox it excluded.
    #[test]
    fn the_proxys_line_names_its_first_hop_address_and_a_fix_after_the_handshake() {
        // What the proxy's session ends with then (found in a user trial).
        let alert = mbx_mbtls::driver::DriverError::Alert {
            description: mbx_engine::AlertDescription::HANDSHAKE_FAILURE.0,
            what: mbx_mbtls::driver::RECEIVED_FROM_THE_PATH,
        };
        let r = ProxyReport {
            id: 2,
            local_peer: Some("127.0.0.1:5000".parse().unwrap()),
            first_hop_local: Some("127.0.0.1:6000".parse().unwrap()),
            connected: true,
            verdicts: Vec::new(),
            summary: None,
            bytes_up: 3,
            bytes_down: 0,
            key_updates: 0,
            peer_left_without_close_notify: false,
            durations: Default::default(),
            cut_at_stop: false,
            outcome: Err(alert.to_string()),
            error: Some(Arc::new(alert)),
        };
        let line = proxy_report_line(&r);
        assert!(
            line.starts_with(
                "connection 2 from 127.0.0.1:5000 (to the first hop from 127.0.0.1:6000): "
            ),
            "{line}"
        );
        assert!(line.ends_with(SERVER_REFUSED_ITS_MIDDLEBOX), "{line}");
        // A middlebox the client excluded is named with why, on a session that went on.
        let excluded = ProxyReport {
            verdicts: vec![MiddleboxVerdict::Excluded {
                middlebox: Some("mb9.test".into()),
                why: NOT_APPROVED,
                detail: None,
            }],
            outcome: Ok(()),
            error: None,
            ..r
        };
        let line = proxy_report_line(&excluded);
        assert!(
            line.contains(
                "; mb9.test was excluded: not in the allow-list (--allow-middlebox); hops "
            ),
            "{line}"
        );
        // The server's KeyUpdates, as the middlebox's line counts them.
        let updated = ProxyReport {
            key_updates: 1,
            ..excluded.clone()
        };
        let line = proxy_report_line(&updated);
        assert!(
            line.contains("3 bytes up, 0 down; 1 KeyUpdate from the server followed; "),
            "{line}"
        );
        // A session that failed in its handshake names what the client had checked.
        let failed = ProxyReport {
            connected: false,
            outcome: Err("mbTLS handshake failed".into()),
            ..excluded
        };
        // One excluded before its name was known reads as the server's line says it.
        let unnamed = ProxyReport {
            verdicts: vec![MiddleboxVerdict::Excluded {
                middlebox: None,
                why: NOT_APPROVED,
                detail: None,
            }],
            ..failed.clone()
        };
        let line = proxy_report_line(&unnamed);
        assert!(
            line.contains("failed; a middlebox was excluded: not in the allow-list"),
            "{line}"
        );
        let line = proxy_report_line(&failed);
        assert!(
            line.ends_with(
                "mbTLS session failed: mbTLS handshake failed; middlebox mb9.test was \
                 excluded: not in the allow-list (--allow-middlebox)"
            ),
            "{line}"
        );
    }

    /// The report format is fixed at start: a reload that changes it (from the config file;
    /// the flags stay as started) is refused, one that keeps it, or says `text` where nothing
    /// was said, goes ahead; and the key is read from a config file's service keys.
    #[test]
    fn a_reload_cannot_change_the_report_format() {
        let with = |format: Option<ReportFormat>| Service {
            report_format: format,
            ..Service::default()
        };
        let json = with(Some(ReportFormat::Json));
        let refused = fixed_at_start_unchanged(("a", &with(None)), ("a", &json)).unwrap_err();
        assert_eq!(
            refused.to_string(),
            "a reload cannot change report_format from text to json; restart to change it"
        );
        assert!(fixed_at_start_unchanged(("a", &json), ("a", &with(None))).is_err());
        assert!(fixed_at_start_unchanged(("a", &json), ("a", &json)).is_ok());
        let text = with(Some(ReportFormat::Text));
        assert!(fixed_at_start_unchanged(("a", &with(None)), ("a", &text)).is_ok());
        let mut table: toml::Table = toml::from_str("report_format = \"json\"\nother = 1").unwrap();
        let taken = Service::take_from(&mut table, &Service::default(), "flags").unwrap();
        assert_eq!(taken.report_format, Some(ReportFormat::Json));
        assert!(table.contains_key("other") && !table.contains_key("report_format"));
        let mut bad: toml::Table = toml::from_str("report_format = \"xml\"").unwrap();
        let e = Service::take_from(&mut bad, &Service::default(), "flags").unwrap_err();
        assert!(
            e.to_string()
                .contains("report_format is \"text\" or \"json\", not \"xml\""),
            "{e}"
        );
    }

    /// A certificate that is not valid now is warned of where its names are shown.
    #[test]
    fn a_certificate_not_valid_now_is_warned_of() {
        use mbx_testbed::{LeafSpec, TestPki, Validity};
        let pki = TestPki::new("mbx cli validity root").unwrap();
        for (validity, want) in [
            (Validity::Expired, "mb.test (WARNING: expired "),
            (Validity::NotYetValid, "mb.test (WARNING: not valid before "),
        ] {
            let cert = pki
                .issue(&LeafSpec::middlebox("mb.test").validity(validity))
                .unwrap();
            let shown = certificate_names(cert.chain_pem().as_bytes());
            assert!(
                shown.starts_with(want) && shown.ends_with(": peers will refuse it)"),
                "{shown}"
            );
        }
        let cert = pki.issue(&LeafSpec::middlebox("mb.test")).unwrap();
        assert_eq!(certificate_names(cert.chain_pem().as_bytes()), "mb.test");
    }

    /// A middlebox that stayed out of a session (passive) says its own connections closed
    /// cleanly, not that the session did: an endpoint that refused it ended the session.
    #[test]
    fn a_passive_middleboxs_clean_end_is_its_connections() {
        let r = ConnectionReport {
            id: 7,
            client: Some("127.0.0.1:4000".parse().unwrap()),
            next_hop: Some("127.0.0.1:9".into()),
            next_hop_local: Some("127.0.0.1:5000".parse().unwrap()),
            announced: true,
            legacy_server: false,
            joined: true,
            evidence_sent: true,
            resumed: false,
            keys_installed: false,
            app_ended: None,
            passive: Some("the server refused our certificate; its own error says why"),
            refused_by_endpoint: None,
            version: None,
            client_hop: None,
            server_hop: None,
            bytes_from_client: 1,
            bytes_from_server: 2,
            idle_trims: 0,
            key_updates: 0,
            left_without_close_notify: None,
            durations: Default::default(),
            cut_at_stop: false,
            error_kind: None,
            outcome: Ok(()),
        };
        let line = report_line(&r);
        // The next hop reports the connection as from 127.0.0.1:5000: named here too.
        assert!(
            line.starts_with(
                "connection 7 from 127.0.0.1:4000 to 127.0.0.1:9 (from 127.0.0.1:5000): "
            ),
            "{line}"
        );
        assert!(
            line.ends_with(
                "not joined (the server refused our certificate; its own error says why), bytes \
                 forwarded unchanged; 1 byte from the client, 2 from the server; its \
                 connections closed cleanly (how the session ended is in the endpoints' reports)"
            ),
            "{line}"
        );
    }

    /// A middlebox that sends no evidence to an endpoint whose policy requires it: the hint
    /// names both ways out.
    #[test]
    fn missing_evidence_is_told_how_to_fix() {
        let e = mbx_mbtls::driver::DriverError::Handshake(
            mbx_mbtls::handshake::HandshakeError::Attestation(
                mbx_attest::AttestError::EvidenceRequired,
            ),
        );
        for role in [mbx_engine::Role::Client, mbx_engine::Role::Server] {
            let hint = fix_hint(&e, role);
            assert!(
                hint.contains("start it with --attester") && hint.contains("required = false"),
                "{hint}"
            );
        }
    }

    /// The parts of a URL the fetch uses; the fragment is not sent, the scheme may be in
    /// capitals, and what cannot be used is named.
    #[test]
    fn urls_are_split_and_their_faults_named() {
        let parts = |url: &str| parse_url(url).map_err(|e| e.to_string());
        let ok = |h: &str, a: &str, p: &str| Ok((h.to_owned(), a.to_owned(), p.to_owned()));
        assert_eq!(parts("https://s.test"), ok("s.test", "s.test", "/"));
        assert_eq!(
            parts("HTTPS://s.test:8443/a?x=1#frag"),
            ok("s.test", "s.test:8443", "/a?x=1")
        );
        assert_eq!(parts("https://s.test?x=1"), ok("s.test", "s.test", "/?x=1"));
        assert_eq!(parts("https://s.test#top"), ok("s.test", "s.test", "/"));
        assert_eq!(parts("https://s.test./"), ok("s.test", "s.test.", "/"));
        for (url, why) in [
            ("http://s.test/", "must start with https://"),
            ("https://s.test:abc/", "the port must be a number"),
            ("https://s.test:0/", "the port must be a number"),
            ("https://u:pw@s.test/", "a user name or password"),
            ("https://[::1]:8443/", "an IPv6 address is not supported"),
            ("https://s.test:+443/", "the port must be a number"),
            ("https://s_t/", "has no usable host name"),
            ("https:", "must start with https://"),
        ] {
            let e = parts(url).unwrap_err();
            assert!(e.contains(why), "{url}: {e}");
        }
    }

    /// A close, a reset or a fatal alert from the path points at the other parties' report
    /// lines (a handshake_failure at what an mbTLS server means by it); an alert we sent
    /// ourselves does not.
    #[test]
    fn what_the_path_ended_points_at_its_report_lines() {
        use mbx_mbtls::driver::{DriverError, RECEIVED_FROM_THE_PATH};
        let from_path = DriverError::Alert {
            description: 80,
            what: RECEIVED_FROM_THE_PATH,
        };
        let text = format!("{from_path}{}", ended_behind_hint(&from_path));
        assert_eq!(
            text,
            "session ended with alert internal_error(80) (received from the path); a \
             middlebox or the server ended the session (their report lines say why; a process \
             that was killed leaves none)"
        );
        let refused = DriverError::Alert {
            description: 40,
            what: RECEIVED_FROM_THE_PATH,
        };
        assert_eq!(ended_behind_hint(&refused), SERVER_REFUSED_ITS_MIDDLEBOX);
        let ours = DriverError::Alert {
            description: 20,
            what: "sent",
        };
        assert_eq!(ended_behind_hint(&ours), "");
        // A close before anything came may be a hop refusing this address: said too.
        let closed = DriverError::PeerGone {
            peer: "first hop",
            when: "during the handshake",
        };
        assert!(
            ended_behind_hint(&closed).ends_with(
                "one that refused this address for its max_connections_per_client or \
                 connection_rate_per_client only a warning in its log)"
            ),
            "{}",
            ended_behind_hint(&closed)
        );
    }

    /// Addresses used only when a connection comes are checked at the start (a backend
    /// without a port was accepted, then every session failed with "invalid socket address").
    #[test]
    fn addresses_used_later_need_host_and_port() {
        for good in [
            "127.0.0.1:8080",
            "backend.example:80",
            "[::1]:8080",
            "[fe80::1%2]:1",
        ] {
            check_host_port("backend", good).unwrap();
        }
        for (bad, says) in [
            ("localhost", "has no port"),
            ("127.0.0.1", "has no port"),
            ("127.0.0.1:0", "from 1 to 65535"),
            ("h:99999", "from 1 to 65535"),
            ("h:x", "from 1 to 65535"),
            ("::1", "in brackets"),
            ("a:b:80", "in brackets"),
            (":80", "in brackets"),
            ("[]:80", "in brackets"),
            // Accepted in form, but no connection could use it (a zone by name).
            ("[fe80::1%eth0]:1", "in brackets"),
            ("[not-ipv6]:80", "in brackets"),
        ] {
            let err = check_host_port("backend", bad).unwrap_err().to_string();
            assert!(err.contains(says) && err.contains(bad), "{bad}: {err}");
        }
    }

    #[test]
    fn a_session_left_without_close_notify_is_told_from_a_clean_one() {
        let sides = ("client", "backend");
        assert_eq!(
            spliced_outcome_text(&Ok(()), false, sides),
            "; closed cleanly"
        );
        assert_eq!(
            spliced_outcome_text(&Ok(()), true, sides),
            "; closed, the client without close_notify after ours (the backend connection was reset)"
        );
        assert_eq!(
            spliced_outcome_text(&Err("cut".into()), true, sides),
            "; ended with error: cut"
        );
        // A middlebox's session.
        assert_eq!(relayed_outcome_text(&Ok(()), None), "; closed cleanly");
        assert_eq!(
            relayed_outcome_text(&Ok(()), Some(Side::Client)),
            "; closed, the client without close_notify after the server's (the server's connection was closed without one too)"
        );
        assert_eq!(
            relayed_outcome_text(&Ok(()), Some(Side::Server)),
            "; closed, the server without close_notify after the client's (the client's connection was closed without one too)"
        );
        assert_eq!(
            relayed_outcome_text(&Err("cut".into()), Some(Side::Client)),
            "; ended with error: cut"
        );
    }

    #[test]
    fn the_servers_line_says_what_it_knows_and_names_no_one_it_cannot() {
        let summary = |hops: Vec<HopFingerprint>, resumed| mbx_mbtls::handshake::SessionSummary {
            version: mbx_record::TlsVersion::Tls13,
            suite: mbx_record::CipherSuite::TLS13_AES_128_GCM_SHA256,
            hops,
            middleboxes: Vec::new(),
            resumed,
        };
        let mut r = ServerConnectionReport {
            id: 7,
            peer: None,
            verdicts: Vec::new(),
            summary: Some(summary(Vec::new(), true)),
            bytes_to_backend: 1,
            bytes_from_backend: 2,
            idle_trims: 0,
            key_updates: 0,
            peer_left_without_close_notify: false,
            durations: Default::default(),
            cut_at_stop: false,
            outcome: Ok(()),
            error: None,
        };
        assert_eq!(
            server_report_line(&r),
            "session 7 from : TLS 1.3, session resumed; keys kept in OpenSSL; no middlebox; 1 byte to the backend, 2 back; closed cleanly"
        );
        r.summary = Some(summary(Vec::new(), false));
        r.verdicts = vec![MiddleboxVerdict::Excluded {
            middlebox: None,
            why: "secondary handshake failed",
            detail: None,
        }];
        let line = server_report_line(&r);
        assert!(
            line.starts_with("session 7 from : TLS 1.3; keys kept in OpenSSL; a middlebox was excluded: secondary handshake failed;"),
            "{line}"
        );
        // The client's KeyUpdates, as the middlebox's line counts them.
        r.key_updates = 2;
        let line = server_report_line(&r);
        assert!(
            line.ends_with("; 1 byte to the backend, 2 back; 2 KeyUpdates from the client followed; closed cleanly"),
            "{line}"
        );
    }

    /// The server's answer when its backend is down is a whole HTTP response: its
    /// Content-Length is its body's.
    #[test]
    fn the_bad_gateway_answer_is_a_whole_response() {
        let text = std::str::from_utf8(BAD_GATEWAY).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 502 Bad Gateway\r\n"), "{head}");
        assert!(
            head.contains(&format!("\r\nContent-Length: {}\r\n", body.len())),
            "{head}"
        );
    }

    /// A service's banner says what its attestation policy accepts, and warns when no
    /// middlebox can pass it (the default policy: evidence required, no measurement).
    #[test]
    fn the_policy_line_warns_when_no_middlebox_can_pass() {
        let default = policy_line(&Policy::default());
        assert!(
            default.contains("evidence required, 0 measurements accepted, simulated TEE refused"),
            "{default}"
        );
        assert!(
            default.contains("WARNING: no middlebox can pass it"),
            "{default}"
        );
        let pinned = Policy {
            measurements: vec![HexBytes(vec![1; 32])],
            allow_simulated: true,
            sim_platform_keys: vec![HexBytes(vec![2; 32])],
            ..Policy::default()
        };
        assert_eq!(
            policy_line(&pinned),
            "attestation policy: evidence required, 1 measurement accepted, simulated TEE accepted from 1 platform key"
        );
        let optional = Policy {
            required: false,
            ..Policy::default()
        };
        assert!(!policy_line(&optional).contains("WARNING"));
    }

    #[test]
    fn one_of_a_count_is_singular() {
        assert_eq!(count_of(0, "connections"), "0 connections");
        assert_eq!(count_of(1, "connections"), "1 connection");
        assert_eq!(count_of(2, "sessions"), "2 sessions");
    }

    #[test]
    fn the_path_line_puts_the_address_where_the_client_connected() {
        let names = ["mb1.test".to_string(), "mb0.test".to_string()];
        let (addr, server) = ("127.0.0.1:8443", "server.test");
        assert_eq!(
            path_text(&names, true, addr, server),
            "path: client -> mb1.test (127.0.0.1:8443) -> mb0.test -> server.test"
        );
        assert_eq!(
            path_text(&names[1..], false, addr, server),
            "path: client -> mb0.test -> server.test (first hop 127.0.0.1:8443)"
        );
        assert_eq!(
            path_text(&[], false, addr, server),
            "path: client -> server.test (first hop 127.0.0.1:8443)"
        );
    }

    /// A reload keeps a context only when its TLS settings and the policy its sessions were
    /// vouched under are the same.
    #[test]
    fn a_reload_keeps_a_context_only_for_the_same_settings_and_policy() {
        let tls = TlsConfig::client("mb.test", b"roots".to_vec());
        let policy = Policy::default();
        let first = Arc::new(1u32);
        let running = RunningContext::new(&tls, &policy, &first);
        let kept = |tls: &TlsConfig, policy: &Policy| {
            let mut new = Arc::new(0u32);
            running.keep_unless_changed(tls.clone(), policy.clone(), &mut new);
            Arc::ptr_eq(&new, &first)
        };
        assert!(kept(&tls, &policy));
        let stricter = Policy {
            resumed_evidence_max_age: 60,
            ..Policy::default()
        };
        assert!(!kept(&tls, &stricter));
        // The new context is the running one now, the first one gone for good.
        assert!(!kept(&tls, &policy));
        let other_roots = TlsConfig::client("mb.test", b"other roots".to_vec());
        assert!(!kept(&other_roots, &policy));
    }
}
