//! Small pieces every system's subcommands share: merging flags into a config table, reading
//! files with a clear error, the async runtime and TLS version names.

use std::path::PathBuf;

use anyhow::{bail, Context};
pub use mbx_engine::pem_file::name_text;
use mbx_record::TlsVersion;

/// Sets `key` in a config table when a flag gave it (flags win over the config file).
pub fn set(table: &mut toml::Table, key: &str, value: Option<String>) {
    if let Some(v) = value {
        table.insert(key.into(), toml::Value::String(v));
    }
}

pub fn path_str(p: Option<PathBuf>) -> Option<String> {
    p.map(|p| p.display().to_string())
}

/// The multi-threaded runtime the drivers need (some move CPU work off the I/O threads).
pub fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

/// `1.2` or `1.3`, as flags and config files spell TLS versions.
pub fn parse_version(s: &str) -> anyhow::Result<TlsVersion> {
    match s {
        "1.2" => Ok(TlsVersion::Tls12),
        "1.3" => Ok(TlsVersion::Tls13),
        other => bail!("unknown TLS version {other:?} (use 1.2 or 1.3)"),
    }
}

/// An error about input that does not parse (a key a table does not have, a value of the
/// wrong type): exit status 2, as for a command line (clap) or a config file that does not
/// parse; every other error is 1.
#[derive(Debug)]
pub struct DoesNotParse(pub String);

impl std::fmt::Display for DoesNotParse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for DoesNotParse {}

/// For demos and fetches only: when the reader of stdout goes away (`mbx demo | head`), exit
/// with success instead of panicking in `println!`; when stdout cannot be written otherwise (a
/// full disk behind `> file`), exit 1 with one line saying so instead of a panic's report.
/// Servers and middleboxes do not install it: they must keep serving when whoever watched
/// their output leaves.
pub fn exit_quietly_when_stdout_closes() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let msg = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or_default();
        if let Some(why) = msg.strip_prefix("failed printing to stdout: ") {
            if why.contains("Broken pipe") {
                std::process::exit(0);
            }
            eprintln!("mbx: error: cannot write to standard output: {why}");
            std::process::exit(1);
        }
        default(info);
    }));
}

/// A SIGHUP whose configuration did not build: the running one stays, and the operator is told
/// why on standard error (once: the log writes there too, so it is not logged as well).
/// Returns why, as said.
pub fn reload_failed(e: &anyhow::Error) -> String {
    eprint_error("mbx: reload failed, configuration unchanged: ", e)
}

/// `e` and its causes ([`error_text`]) on standard error, its control characters escaped but
/// its line breaks kept (a config file's parse error), `prefix` before each line; returns the
/// text.
pub fn eprint_error(prefix: &str, e: &anyhow::Error) -> String {
    let text = error_text(e);
    eprint_lines(prefix, &escape_controls(&text, true));
    text
}

/// `text` on standard error with `prefix` before each of its lines: a message of several lines
/// (a config file's parse error with its caret line) stays recognizable line by line to
/// whoever filters a log by the prefix.
pub fn eprint_lines(prefix: &str, text: &str) {
    let mut lines = text.lines().peekable();
    if lines.peek().is_none() {
        eprintln!("{}", prefix.trim_end());
    }
    for line in lines {
        eprintln!("{prefix}{line}");
    }
}

/// One line of a long-running command's report on stdout. A closed stdout (its reader went
/// away) is ignored: servers and middleboxes keep serving and never panic in `println!`.
pub fn print_line(line: impl std::fmt::Display) {
    print_event("notice", line.to_string(), serde_json::Map::new);
}

/// One line on stdout: `text`, or with JSON lines on ([`crate::json_lines`]) an `event`
/// object with `fields` and the text.
pub fn print_event(
    event: &str,
    text: String,
    fields: impl FnOnce() -> serde_json::Map<String, serde_json::Value>,
) {
    use std::io::Write;
    if crate::json_lines::is_on() {
        let mut fields = fields();
        fields.insert("text".into(), text.into());
        return crate::json_lines::print(event, fields);
    }
    let _ = writeln!(
        std::io::stdout().lock(),
        "{}",
        escape_controls(&text, false)
    );
}

/// `text` with its control characters escaped (`\n`, `\u{1b}`, …), line breaks kept if
/// `keep_newlines`: report lines carry text a peer chose (error messages quoting its evidence,
/// names), which must not start a line of their own or drive the operator's terminal. The
/// Unicode line and paragraph separators and the bidirectional controls (which reorder how the
/// rest of a line is shown) count as control characters here.
pub fn escape_controls(text: &str, keep_newlines: bool) -> std::borrow::Cow<'_, str> {
    escape_controls_but(text, if keep_newlines { &['\n'] } else { &[] })
}

/// [`escape_controls`] keeping the control characters in `kept` as they are.
pub fn escape_controls_but<'a>(text: &'a str, kept: &[char]) -> std::borrow::Cow<'a, str> {
    let escaped = |c: char| must_escape(c) && !kept.contains(&c);
    if !text.chars().any(escaped) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if escaped(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// An error and its causes, `: `-separated like anyhow's `{:#}`, but without a cause whose
/// text the message already carries: many library errors put their source's text in their own
/// message and also return it as `source()` (thiserror's `#[from]` with a `{0}` message), and
/// printed whole they would say the same thing two or three times.
pub fn error_text(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain() {
        // Without the line break some messages end with (the TOML parser's).
        let said = cause.to_string();
        let said = said.trim_end();
        if text.contains(said) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(said);
    }
    text
}

/// `items` in their order, each only the first time it comes (a version given twice runs once).
pub fn each_once<T: PartialEq>(items: Vec<T>) -> Vec<T> {
    let mut kept: Vec<T> = Vec::with_capacity(items.len());
    for item in items {
        if !kept.contains(&item) {
            kept.push(item);
        }
    }
    kept
}

/// What may not reach a terminal as it is: the control characters (C0, DEL, C1), U+2028,
/// U+2029 and the bidirectional formatting characters.
pub(crate) fn must_escape(c: char) -> bool {
    c.is_control() || is_separator_or_bidi(c)
}

/// U+2028, U+2029 and the bidirectional formatting characters (marks, embeddings, overrides,
/// isolates).
fn is_separator_or_bidi(c: char) -> bool {
    matches!(
        c,
        '\u{2028}' | '\u{2029}' | '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}'
            | '\u{2066}'..='\u{2069}'
    )
}

/// A new private key file: readable by its owner only, and never written over a file, nor
/// through a link left in its place.
pub fn write_new_private_file(path: &std::path::Path, bytes: &[u8]) -> anyhow::Result<()> {
    use anyhow::Context as _;
    write_new_file(path, bytes, 0o600).with_context(|| format!("cannot write {}", path.display()))
}

/// `bytes` to a new file at `path` with permissions `mode`, never over a file or a link; a
/// file that could not be written whole is removed again.
pub fn write_new_file(path: &std::path::Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)?;
    file.write_all(bytes).inspect_err(|_| {
        let _ = std::fs::remove_file(path);
    })
}

#[cfg(test)]
mod tests {
    use super::{each_once, escape_controls};

    #[test]
    fn an_error_chain_says_each_cause_once() {
        use std::fmt;
        /// A library error that puts its source's text in its message and returns it as its
        /// source too.
        #[derive(Debug)]
        struct Engine(std::io::Error);
        impl fmt::Display for Engine {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "TLS engine: {}", self.0)
            }
        }
        impl std::error::Error for Engine {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let io = std::io::Error::other("key values mismatch");
        let e = anyhow::Error::new(Engine(io)).context("middlebox TLS configuration");
        assert_eq!(
            super::error_text(&e),
            "middlebox TLS configuration: TLS engine: key values mismatch"
        );
        let plain = anyhow::anyhow!("root").context("outer");
        assert_eq!(super::error_text(&plain), "outer: root");
    }

    #[test]
    fn each_once_keeps_the_first_of_each_in_order() {
        assert_eq!(each_once(vec![3, 1, 3, 2, 1]), vec![3, 1, 2]);
    }

    #[test]
    fn control_characters_are_escaped_line_breaks_kept_only_if_asked() {
        let forged = "unknown variant `X\nsession 7: closed cleanly\u{1b}[2J`";
        assert_eq!(
            escape_controls(forged, false),
            "unknown variant `X\\nsession 7: closed cleanly\\u{1b}[2J`"
        );
        assert_eq!(
            escape_controls(forged, true),
            "unknown variant `X\nsession 7: closed cleanly\\u{1b}[2J`"
        );
        assert!(matches!(
            escape_controls("plain text, caf\u{e9}", false),
            std::borrow::Cow::Borrowed(_)
        ));
        assert_eq!(
            escape_controls("name\u{202e}txt.exe\u{2028}line", true),
            "name\\u{202e}txt.exe\\u{2028}line"
        );
    }
}
