//! `mbx blindbox`: the parts of BlindBox that are usable today.
//!
//! End-to-end sender / receiver / middlebox commands need the encrypted rules that only the
//! garbled-circuit setup can give a middlebox; they arrive with it, and no insecure shortcut is
//! offered meanwhile.

use std::path::PathBuf;

use anyhow::Context;
use mbx_blindbox::rules::{parse_rules, table1_report};

#[derive(clap::Args, Debug)]
pub struct BlindboxArgs {
    #[command(subcommand)]
    command: BlindboxCommand,
}

#[derive(clap::Subcommand, Debug)]
enum BlindboxCommand {
    /// Snort rule files: which rules BlindBox can address, and how.
    Rules {
        #[command(subcommand)]
        command: RulesCommand,
    },
    /// Sender, receiver and middlebox (not implemented yet: they need the rule-encryption setup).
    #[command(external_subcommand)]
    Other(Vec<String>),
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
}

pub fn run(args: BlindboxArgs) -> anyhow::Result<()> {
    match args.command {
        BlindboxCommand::Rules {
            command: RulesCommand::Stats { file, active_only },
        } => {
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("cannot read rule file {}", file.display()))?;
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
        BlindboxCommand::Other(words) => {
            let name = words.first().map(String::as_str).unwrap_or("");
            anyhow::bail!(
                "`blindbox {name}` is not implemented yet (it needs the rule-encryption setup)"
            )
        }
    }
}
