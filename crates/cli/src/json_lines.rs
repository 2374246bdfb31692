//! Standard output as JSON Lines (`report_format = "json"` of the mbTLS services): one object
//! per line, each with the time, what it is and which service wrote it, for log shippers and
//! SIEMs, in place of the text lines. Turned on once, before a service's banner; every line
//! the service prints then goes out this way ([`crate::subcommand::print_line`] asks
//! [`is_on`]).

use std::net::SocketAddr;
use std::sync::OnceLock;

use serde_json::{Map, Value};

/// The service whose lines these are, the address it listens on and the process: set once,
/// when the lines turn to JSON.
static SOURCE: OnceLock<(String, String, u32)> = OnceLock::new();

/// From now on, every line on standard output is a JSON object naming `service` (its role)
/// and its `listen` address, so that the lines of several services in one log stay apart.
pub fn turn_on(service: &str, listen: SocketAddr) {
    let _ = SOURCE.set((service.to_owned(), listen.to_string(), std::process::id()));
}

pub fn is_on() -> bool {
    SOURCE.get().is_some()
}

/// Writes `{"time": …, "event": event, "service": …, "listen": …, "pid": …, …fields}` as one
/// line (a closed standard output is ignored, as for text lines).
pub fn print(event: &str, fields: Map<String, Value>) {
    use std::io::Write;
    let (service, listen, pid) = SOURCE.get().map_or(("", "", 0), |(s, l, p)| (s, l, *p));
    let head = Head {
        time: &now(),
        event,
        service,
        listen,
        pid,
    };
    let _ = writeln!(std::io::stdout().lock(), "{}", line(&head, fields));
}

/// What every line starts with.
struct Head<'a> {
    time: &'a str,
    event: &'a str,
    service: &'a str,
    listen: &'a str,
    /// The process: session ids count from 0 in each, so `pid` and `id` name a session across
    /// restarts.
    pid: u32,
}

/// One line: the time, the event and the source first (they lead when read by eye), then
/// `fields`.
fn line(h: &Head, fields: Map<String, Value>) -> String {
    let head = format!(
        "{{\"time\":{},\"event\":{},\"service\":{},\"listen\":{},\"pid\":{}",
        Value::from(h.time),
        Value::from(h.event),
        Value::from(h.service),
        Value::from(h.listen),
        h.pid
    );
    // The head's keys are the head's: a field of the same name would make a second key.
    let mut fields = fields;
    for key in ["time", "event", "service", "listen", "pid"] {
        fields.remove(key);
    }
    let rest = Value::Object(fields).to_string();
    let text = match rest.strip_prefix('{') {
        Some("}") | None => head + "}",
        Some(rest) => head + "," + rest,
    };
    escape_invisible(&text)
}

/// serde_json escapes only the C0 controls: DEL, the C1 controls (U+009B starts a terminal
/// command as ESC [ does), the Unicode line separators and the bidirectional controls it
/// leaves as they are, and in a peer's words (an error quoting its evidence, a name) they
/// would drive, reorder or break the line for whoever reads it in a terminal (`tail -f`).
/// They can only stand inside strings, where `\uXXXX` is the same character to a JSON reader.
fn escape_invisible(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if crate::subcommand::must_escape(c) {
            out.push_str(&format!("\\u{:04x}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    out
}

/// Now, as RFC 3339 in UTC to the millisecond (`2026-11-27T19:30:45.123Z`).
fn now() -> String {
    let t = time::OffsetDateTime::now_utc();
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second(),
        t.millisecond()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn fields(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => unreachable!(),
        }
    }

    fn head(event: &str) -> Head<'_> {
        Head {
            time: "2026-11-27T19:30:45.123Z",
            event,
            service: "middlebox",
            listen: "127.0.0.1:8443",
            pid: 4242,
        }
    }

    const HEAD: &str = "{\"time\":\"2026-11-27T19:30:45.123Z\",\"event\":\"session\",\
                        \"service\":\"middlebox\",\"listen\":\"127.0.0.1:8443\",\"pid\":4242";

    #[test]
    fn a_line_is_one_object_with_time_event_and_source_first() {
        let l = line(
            &head("session"),
            fields(json!({"id": 7, "text": "a \"quoted\"\nline"})),
        );
        assert_eq!(
            l,
            format!("{HEAD},\"id\":7,\"text\":\"a \\\"quoted\\\"\\nline\"}}")
        );
        let back: Value = serde_json::from_str(&l).unwrap();
        assert_eq!(back["text"], "a \"quoted\"\nline");
        assert_eq!(line(&head("session"), Map::new()), format!("{HEAD}}}"));
    }

    #[test]
    fn separators_and_bidi_controls_are_escaped_and_read_back_the_same() {
        let said = "mb\u{202e}txt.exe\u{2028}next\u{9b}2J\u{7f}\u{1b}[0m";
        let l = line(&head("notice"), fields(json!({ "text": said })));
        for c in ['\u{202e}', '\u{2028}', '\u{9b}', '\u{7f}', '\u{1b}'] {
            assert!(!l.contains(c), "{c:?} in {l}");
        }
        assert!(
            l.contains("\\u202e") && l.contains("\\u2028") && l.contains("\\u009b"),
            "{l}"
        );
        let back: Value = serde_json::from_str(&l).unwrap();
        assert_eq!(back["text"], said);
        // A field cannot take a head key's place.
        let l = line(
            &head("notice"),
            fields(json!({ "event": "forged", "time": 0, "pid": 1 })),
        );
        let back: Value = serde_json::from_str(&l).unwrap();
        assert_eq!(
            (&back["event"], l.matches("\"event\"").count()),
            (&json!("notice"), 1)
        );
        assert_eq!(
            (&back["time"], l.matches("\"time\"").count()),
            (&json!("2026-11-27T19:30:45.123Z"), 1)
        );
        assert_eq!(
            (&back["pid"], l.matches("\"pid\"").count()),
            (&json!(4242), 1)
        );
    }

    #[test]
    fn the_time_is_rfc3339_utc_to_the_millisecond() {
        let t = now();
        assert_eq!(t.len(), "2026-11-27T19:30:45.123Z".len(), "{t}");
        assert!(t.ends_with('Z') && t.as_bytes()[10] == b'T' && t.as_bytes()[19] == b'.');
    }
}
