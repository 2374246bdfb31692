//! `mbx`: one command for the five middlebox-in-TLS systems of this toolkit.
//!
//! Each system is a subcommand. Systems that are not built yet say so and exit non-zero: the CLI never
//! prints output it did not compute.

mod blindbox;
mod blindbox_demo;
mod config;
mod demo;
mod driver;
mod json_lines;
mod keyless;
mod keyless_demo;
mod mbtls;
mod mbtls_demo;
mod mbtls_json;
mod response_out;
mod subcommand;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::config::Config;

#[derive(Parser, Debug)]
#[command(
    name = "mbx",
    version,
    about = "Middleboxes in encrypted traffic without giving up end-to-end security",
    long_about = "mbx brings middleboxes back into TLS without breaking end-to-end security.\n\
        It implements mbTLS, BlindBox and Keyless SSL as subcommands of one program (maTLS and\n\
        EndBox have their subcommands reserved, not built yet).\n\
        Options can come from a TOML file (--config); flags given on the command line win."
)]
struct Cli {
    /// TOML configuration file; every option in it can also be given as a flag.
    #[arg(long, short = 'c', global = true, env = "MBX_CONFIG")]
    config: Option<PathBuf>,

    /// Log filter (tracing env-filter syntax, e.g. `info`, `mbx_engine=debug`).
    #[arg(long, global = true, env = "MBX_LOG")]
    log: Option<String>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Start every party on loopback and show what happened on the wire.
    ///
    /// Runs real TLS 1.2 and 1.3 sessions between our OpenSSL and rustls engines through a
    /// tapping relay, exports the session keys, decrypts and re-encrypts the captured records with
    /// the toolkit's own record layer, and checks attestation evidence bound to the session
    /// (simulated TEE, explicitly allowed); then fetches a page over mbTLS through two client-side
    /// middleboxes and a server-side one and checks every hop's keys, verdict and inserted header;
    /// then runs BlindBox: rule setup, alerts on encrypted traffic and a blocked connection.
    Demo(demo::DemoArgs),
    /// Middlebox TLS: endpoints add middleboxes to a TLS session with per-hop keys,
    /// in-band discovery, attestation of middlebox code and one legacy endpoint.
    /// (`mbtls client`, `mbtls middlebox` client or server side, `mbtls server`, `mbtls demo`;
    /// several middleboxes per side, pre-configured or discovered)
    Mbtls(mbtls::MbtlsArgs),
    /// Middlebox-aware TLS: certified middleboxes, security-parameter reports and modification
    /// logs that endpoints can audit. (not implemented yet)
    Matls(NotYet),
    /// BlindBox: a middlebox detects attack keywords in traffic it cannot decrypt.
    /// (`blindbox rules stats|keygen|sign|verify`, `blindbox sender`, `receiver`, `middlebox`,
    /// `demo`)
    Blindbox(blindbox::BlindboxArgs),
    /// Keyless SSL: an edge terminates TLS while the private key stays on a key server.
    /// (`keyless keyserver`, `keyless edge`, `keyless demo`)
    Keyless(keyless::KeylessArgs),
    /// EndBox: middlebox functions in a TEE on each client behind an attested VPN. (not implemented yet)
    Endbox(NotYet),
}

/// Arguments of a system that is not built yet: accepted so `--help` works, then refused.
#[derive(clap::Args, Debug)]
struct NotYet {
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
    rest: Vec<String>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let config = match cli.config.as_deref().map(Config::load).transpose() {
        Ok(c) => c.unwrap_or_default(),
        Err(e) => {
            subcommand::eprint_error("mbx: error: ", &e);
            return ExitCode::from(2);
        }
    };
    // A demo says itself that its middleboxes run in a simulated TEE: the warning each
    // acceptance of simulated evidence logs (a dozen per run) is left out unless asked for.
    let demo = match &cli.command {
        Command::Demo(_) => true,
        Command::Mbtls(args) => args.is_demo(),
        _ => false,
    };
    // The file's `log` is in force only without --log or MBX_LOG: only then may a reload not
    // change it.
    if cli.log.is_none() {
        config.remember_log_at_start();
    }
    let default = if demo { DEMO_LOG } else { DEFAULT_LOG };
    if let Err(e) = init_tracing(cli.log.as_deref().or(config.log.as_deref()), default) {
        eprintln!(
            "mbx: error: {}",
            subcommand::escape_controls(&subcommand::error_text(&e), false)
        );
        return ExitCode::from(2);
    }

    let result = match cli.command {
        Command::Demo(args) => demo::run(args, &config.demo),
        Command::Mbtls(args) => mbtls::run(args, &config.mbtls, cli.config.as_deref()),
        Command::Matls(_) => not_yet("matls"),
        Command::Blindbox(args) => blindbox::run(args, &config.blindbox),
        Command::Keyless(args) => keyless::run(args, &config.keyless, cli.config.as_deref()),
        Command::Endbox(_) => not_yet("endbox"),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Errors may quote a peer (its evidence, its alert): no terminal controls; line
            // breaks stay for the operator's own files' parse errors.
            subcommand::eprint_error("mbx: error: ", &e);
            match e
                .chain()
                .any(|cause| cause.is::<subcommand::DoesNotParse>())
            {
                true => ExitCode::from(2),
                false => ExitCode::FAILURE,
            }
        }
    }
}

fn not_yet(system: &str) -> anyhow::Result<()> {
    anyhow::bail!("`{system}` is not implemented yet")
}

/// The log filter unless `--log`, `MBX_LOG` or the config file's `log` says otherwise.
const DEFAULT_LOG: &str = "warn,mbx_mbtls::driver::reports=error";

/// [`DEFAULT_LOG`] for the demos.
const DEMO_LOG: &str = "warn,mbx_mbtls::driver::reports=error,mbx_attest=error";

fn init_tracing(filter: Option<&str>, default: &str) -> anyhow::Result<()> {
    use anyhow::Context;
    // The services print a report line per connection on stdout: the drivers' own warning
    // for each failed one would say it again on stderr.
    let filter = tracing_subscriber::EnvFilter::try_new(filter.unwrap_or(default))
        .context("invalid log filter (--log, MBX_LOG or the config file's log)")?;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(|| EscapedStderr)
        // Colours are terminal controls too; the writer would escape them.
        .with_ansi(false)
        .with_target(false)
        .init();
    Ok(())
}

/// Standard error for log lines, whose messages may quote a peer (a name, an alert, a parse
/// error): control characters are escaped, so a peer cannot forge a line or drive the
/// terminal. `tracing` writes each event in one call, ending in its own line break.
struct EscapedStderr;

impl std::io::Write for EscapedStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        std::io::stderr().write_all(escaped_event(buf).as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

/// One formatted log event with its control characters escaped, its final line break kept.
fn escaped_event(event: &[u8]) -> String {
    let text = String::from_utf8_lossy(event);
    let (line, end) = match text.strip_suffix('\n') {
        Some(line) => (line, "\n"),
        None => (&*text, ""),
    };
    format!("{}{end}", subcommand::escape_controls(line, false))
}

#[cfg(test)]
mod tests {
    use super::escaped_event;

    #[test]
    fn a_log_event_quoting_a_peer_stays_one_line_without_terminal_controls() {
        let event = b"WARN session 3: peer said \"x\nINFO session 4: closed cleanly\x1b[2J\"\n";
        assert_eq!(
            escaped_event(event),
            "WARN session 3: peer said \"x\\nINFO session 4: closed cleanly\\u{1b}[2J\"\n"
        );
    }
}
