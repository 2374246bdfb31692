//! `mbx keyless`: the Keyless SSL key server (the edge comes later).

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
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
    /// table of the config file (see docs/keyless.md); these flags override it.
    Keyserver(KeyserverFlags),
    /// The edge server (not implemented yet).
    #[command(external_subcommand)]
    Other(Vec<String>),
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
}

/// `[keyless]` in the config file. The key server table is kept as TOML so that flags can fill in
/// what it leaves out before it is checked.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeylessConfig {
    #[serde(default)]
    pub keyserver: toml::Table,
}

pub fn run(args: KeylessArgs, config: &KeylessConfig) -> anyhow::Result<()> {
    match args.command {
        KeylessCommand::Keyserver(flags) => keyserver(flags, config),
        KeylessCommand::Other(words) => {
            let name = words.first().map(String::as_str).unwrap_or("");
            anyhow::bail!("`keyless {name}` is not implemented yet")
        }
    }
}

fn keyserver(flags: KeyserverFlags, config: &KeylessConfig) -> anyhow::Result<()> {
    let mut table = config.keyserver.clone();
    let path = |p: PathBuf| toml::Value::String(p.display().to_string());
    if let Some(v) = flags.listen {
        table.insert("listen".into(), toml::Value::String(v.to_string()));
    }
    for (key, value) in [
        ("key_dir", flags.key_dir),
        ("certificate", flags.certificate),
        ("private_key", flags.private_key),
        ("edge_ca", flags.edge_ca),
    ] {
        if let Some(v) = value {
            table.insert(key.into(), path(v));
        }
    }
    if let Some(v) = flags.workers {
        table.insert("workers".into(), toml::Value::Integer(i64::try_from(v)?));
    }
    let cfg = ServerConfig::deserialize(toml::Value::Table(table))
        .context("invalid key server configuration ([keyless.keyserver] and flags)")?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async {
        let server = KeyServer::from_config(&cfg).context("cannot start the key server")?;
        let running = server.bind(cfg.listen).await.context("cannot listen")?;
        println!("key server listening on {}", running.local_addr());
        tokio::signal::ctrl_c()
            .await
            .context("cannot wait for Ctrl-C")?;
        println!("key server stopping");
        Ok(())
    })
}
