//! `mbx keyless`: the Keyless SSL key server and edge server.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::Context;
use mbx_keyless::edge::{Edge, EdgeConfig};
use mbx_keyless::server::{KeyServer, ServerConfig};
use serde::Deserialize;

#[derive(clap::Args, Debug)]
pub struct KeylessArgs {
    #[command(subcommand)]
    command: KeylessCommand,
}

#[derive(clap::Subcommand, Debug)]
enum KeylessCommand {
    /// Run a key server: holds the sites' private keys and signs (or decrypts) for authorized edges
    /// over mutually authenticated TLS (default port 2407). Options come from the `[keyless.keyserver]`
    /// table of the config file (see docs/keyless.md); these flags override it. SIGHUP re-reads the
    /// config file, keys, certificates and rules without dropping connections.
    Keyserver(KeyserverFlags),
    /// Run an edge server: terminates clients' TLS with the sites' certificates, has every
    /// signature made by key servers, checks the Host header and proxies (with a cache) to the
    /// origins. Options come from the `[keyless.edge]` table of the config file (see
    /// docs/keyless.md); these flags override it or add a key-server group, origin and sites
    /// all named "default".
    Edge(EdgeFlags),
    /// Run Keyless SSL on loopback in one process: an origin, one key server per site (ECDSA
    /// P-256 and RSA-2048) and an edge holding only certificates; fetch pages through the edge
    /// like curl and show which key server signed, the edge cache and the Host check.
    Demo(crate::keyless_demo::KeylessDemoArgs),
}

#[derive(clap::Args, Debug)]
struct EdgeFlags {
    /// Address to listen on (default 0.0.0.0:443).
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// A key server of the "default" group (repeatable; replaces the group's addresses).
    #[arg(long = "key-server")]
    key_servers: Vec<SocketAddr>,
    /// Name in the key servers' certificates ("default" group).
    #[arg(long)]
    key_server_name: Option<String>,
    /// CA certificates (PEM) of the key servers ("default" group).
    #[arg(long)]
    key_server_ca: Option<PathBuf>,
    /// This edge's client certificate chain (PEM) towards key servers ("default" group).
    #[arg(long)]
    client_certificate: Option<PathBuf>,
    /// This edge's client private key (PEM) ("default" group).
    #[arg(long)]
    client_key: Option<PathBuf>,
    /// Per-operation key-server timeout in milliseconds (every group).
    #[arg(long)]
    key_server_timeout_ms: Option<u64>,
    /// Bound on a whole client handshake in milliseconds.
    #[arg(long)]
    handshake_timeout_ms: Option<u64>,
    /// Address of the "default" origin (plain HTTP/1.1).
    #[arg(long)]
    origin: Option<SocketAddr>,
    /// Session-ticket key file of the "default" origin (64 hex digits).
    #[arg(long)]
    ticket_key_file: Option<PathBuf>,
    /// A site: `SNI_NAME=CERTIFICATE_CHAIN.pem`, served with the "default" group and origin
    /// (repeatable).
    #[arg(long = "site")]
    sites: Vec<String>,
}

#[derive(clap::Args, Debug)]
struct KeyserverFlags {
    /// Address to listen on (default 0.0.0.0:2407).
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Directory of the sites' private keys (PEM/DER: PKCS#8, PKCS#1, SEC1) and their certificates.
    #[arg(long)]
    key_dir: Option<PathBuf>,
    /// The key server's own certificate chain (PEM).
    #[arg(long)]
    certificate: Option<PathBuf>,
    /// The key server's own private key (PEM).
    #[arg(long)]
    private_key: Option<PathBuf>,
    /// CA certificates (PEM) that issue edge client certificates.
    #[arg(long)]
    edge_ca: Option<PathBuf>,
    /// Worker threads for private-key operations (0: one per core).
    #[arg(long)]
    workers: Option<usize>,
    /// Serve Prometheus metrics on plain HTTP at this address (`GET /metrics`).
    #[arg(long)]
    metrics_listen: Option<SocketAddr>,
}

/// `[keyless]` in the config file. The key server table is kept as TOML so that flags can fill in
/// what it leaves out before it is checked.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeylessConfig {
    #[serde(default)]
    pub keyserver: toml::Table,
    #[serde(default)]
    pub edge: toml::Table,
}

/// `config_path` is the `--config` file, re-read by the key server on SIGHUP.
pub fn run(
    args: KeylessArgs,
    config: &KeylessConfig,
    config_path: Option<&Path>,
) -> anyhow::Result<()> {
    match args.command {
        KeylessCommand::Keyserver(flags) => keyserver(flags, config, config_path),
        KeylessCommand::Edge(flags) => edge(flags, config),
        KeylessCommand::Demo(args) => crate::keyless_demo::run(args),
    }
}

/// The sub-table `name` of `table`, created if missing.
fn sub_table<'a>(table: &'a mut toml::Table, name: &str) -> anyhow::Result<&'a mut toml::Table> {
    table
        .entry(name.to_owned())
        .or_insert_with(|| toml::Value::Table(toml::Table::new()))
        .as_table_mut()
        .with_context(|| format!("`{name}` must be a table"))
}

fn edge(flags: EdgeFlags, config: &KeylessConfig) -> anyhow::Result<()> {
    let mut table = config.edge.clone();
    let path = |p: &PathBuf| toml::Value::String(p.display().to_string());
    if let Some(v) = flags.listen {
        table.insert("listen".into(), toml::Value::String(v.to_string()));
    }
    if let Some(v) = flags.handshake_timeout_ms {
        table.insert(
            "handshake_timeout_ms".into(),
            toml::Value::Integer(i64::try_from(v)?),
        );
    }
    {
        let groups = sub_table(&mut table, "key_servers")?;
        let touches_default = !flags.key_servers.is_empty()
            || flags.key_server_name.is_some()
            || flags.key_server_ca.is_some()
            || flags.client_certificate.is_some()
            || flags.client_key.is_some();
        if touches_default {
            let g = sub_table(groups, "default")?;
            if !flags.key_servers.is_empty() {
                let list = flags
                    .key_servers
                    .iter()
                    .map(|a| toml::Value::String(a.to_string()))
                    .collect();
                g.insert("addresses".into(), toml::Value::Array(list));
            }
            if let Some(v) = &flags.key_server_name {
                g.insert("server_name".into(), toml::Value::String(v.clone()));
            }
            for (key, value) in [
                ("ca", &flags.key_server_ca),
                ("certificate", &flags.client_certificate),
                ("private_key", &flags.client_key),
            ] {
                if let Some(v) = value {
                    g.insert(key.into(), path(v));
                }
            }
        }
        if let Some(ms) = flags.key_server_timeout_ms {
            for (_, g) in groups.iter_mut() {
                if let Some(g) = g.as_table_mut() {
                    g.insert(
                        "timeout_ms".into(),
                        toml::Value::Integer(i64::try_from(ms)?),
                    );
                }
            }
        }
    }
    if flags.origin.is_some() || flags.ticket_key_file.is_some() {
        let o = sub_table(sub_table(&mut table, "origins")?, "default")?;
        if let Some(v) = flags.origin {
            o.insert("address".into(), toml::Value::String(v.to_string()));
        }
        if let Some(v) = &flags.ticket_key_file {
            o.insert("ticket_key_file".into(), path(v));
        }
    }
    for site in &flags.sites {
        let (name, chain) = site
            .split_once('=')
            .with_context(|| format!("--site {site:?}: expected SNI_NAME=CERTIFICATE_CHAIN"))?;
        let s = sub_table(sub_table(&mut table, "sites")?, name)?;
        s.insert("certificate".into(), toml::Value::String(chain.to_owned()));
        s.insert("key_server".into(), toml::Value::String("default".into()));
        s.insert("origin".into(), toml::Value::String("default".into()));
    }
    let cfg = EdgeConfig::deserialize(toml::Value::Table(table))
        .context("invalid edge configuration ([keyless.edge] and flags)")?;
    let runtime = crate::subcommand::runtime()?;
    runtime.block_on(async {
        let edge = Edge::from_config(&cfg).context("cannot start the edge")?;
        let running = edge.bind(cfg.listen).await.context("cannot listen")?;
        crate::subcommand::print_line(format_args!("edge listening on {}", running.local_addr()));
        tokio::signal::ctrl_c()
            .await
            .context("cannot wait for Ctrl-C")?;
        crate::subcommand::print_line("edge stopping");
        Ok(())
    })
}

/// The key server configuration: the `[keyless.keyserver]` table with the flags applied.
fn keyserver_config(flags: &KeyserverFlags, table: &toml::Table) -> anyhow::Result<ServerConfig> {
    let mut table = table.clone();
    let path = |p: &PathBuf| toml::Value::String(p.display().to_string());
    for (key, value) in [
        ("listen", flags.listen),
        ("metrics_listen", flags.metrics_listen),
    ] {
        if let Some(v) = value {
            table.insert(key.into(), toml::Value::String(v.to_string()));
        }
    }
    for (key, value) in [
        ("key_dir", &flags.key_dir),
        ("certificate", &flags.certificate),
        ("private_key", &flags.private_key),
        ("edge_ca", &flags.edge_ca),
    ] {
        if let Some(v) = value {
            table.insert(key.into(), path(v));
        }
    }
    if let Some(v) = flags.workers {
        table.insert("workers".into(), toml::Value::Integer(i64::try_from(v)?));
    }
    ServerConfig::deserialize(toml::Value::Table(table))
        .context("invalid key server configuration ([keyless.keyserver] and flags)")
}

/// The configuration a SIGHUP asks for: the config file read again (if there is one), flags
/// applied again.
fn reread_keyserver_config(
    flags: &KeyserverFlags,
    first: &KeylessConfig,
    config_path: Option<&Path>,
) -> anyhow::Result<ServerConfig> {
    match config_path {
        Some(p) => keyserver_config(flags, &crate::config::Config::reload(p)?.keyless.keyserver),
        None => keyserver_config(flags, &first.keyserver),
    }
}

fn keyserver(
    flags: KeyserverFlags,
    config: &KeylessConfig,
    config_path: Option<&Path>,
) -> anyhow::Result<()> {
    let cfg = keyserver_config(&flags, &config.keyserver)?;
    let runtime = crate::subcommand::runtime()?;
    runtime.block_on(async {
        use tokio::signal::unix::{signal, SignalKind};
        // Installed before the address is printed, so a SIGHUP right after it is not fatal.
        let mut hangup = signal(SignalKind::hangup()).context("cannot handle SIGHUP")?;
        let server = KeyServer::from_config(&cfg).context("cannot start the key server")?;
        let running = server.bind(cfg.listen).await.context("cannot listen")?;
        crate::subcommand::print_line(format_args!(
            "key server listening on {}",
            running.local_addr()
        ));
        if let Some(m) = running.metrics_addr() {
            crate::subcommand::print_line(format_args!("metrics listening on {m}"));
        }
        loop {
            tokio::select! {
                r = tokio::signal::ctrl_c() => {
                    r.context("cannot wait for Ctrl-C")?;
                    break;
                }
                _ = hangup.recv() => {
                    // A failed reload keeps the running configuration; the server logs why.
                    match reread_keyserver_config(&flags, config, config_path) {
                        Ok(new) => match running.reload(&new) {
                            Ok(()) => crate::subcommand::print_line("key server reloaded"),
                            Err(e) => {
                                crate::subcommand::reload_failed(&anyhow::Error::new(e));
                            }
                        },
                        Err(e) => {
                            crate::subcommand::reload_failed(&e);
                        }
                    }
                }
            }
        }
        crate::subcommand::print_line(format_args!("key server stopping"));
        Ok(())
    })
}
