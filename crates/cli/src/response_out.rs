//! A fetch's response on its way out, as it arrives: the status line and header fields as
//! report lines (control characters escaped), then the body, streamed (so a large body is never
//! held whole) to standard output or to a file. On a terminal the body is shown with control
//! characters escaped; anywhere else it is written byte for byte. A chunked body is written
//! decoded, and a body cut before its Content-Length or its last chunk is an error at the end
//! (as curl's "transfer closed with N bytes remaining"), though what came is written.

use std::fs::File;
use std::io::{IsTerminal as _, Write};
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use mbx_apps::ResponseBody;

use crate::subcommand::{escape_controls, escape_controls_but};

/// A head longer than this without its blank line is not taken for an HTTP head.
const MAX_HEAD: usize = 64 * 1024;

/// Where the body goes.
enum Sink {
    /// Standard output; `terminal`: shown escaped, with text cut only at whole characters.
    Stdout { terminal: bool },
    /// Created (or emptied) only when the body begins, as curl does: a fetch that fails
    /// before leaves an existing file alone.
    File { file: Option<File>, path: PathBuf },
}

/// The response written so far; its report and (without a file) its body go to `W`, standard
/// output outside tests.
pub struct ResponseOut<W: Write = std::io::Stdout> {
    out: W,
    /// Bytes of the head until its blank line is seen; `None` once the body has begun.
    head: Option<Vec<u8>>,
    sink: Sink,
    /// The body's framing, once the head is read (`None`: no HTTP head, or one whose
    /// framing cannot be read, so the bytes are written as they come and not checked).
    framing: Option<ResponseBody>,
    /// Why the response is not one whose body's end can be checked (no HTTP head, or one
    /// whose framing cannot be read): what came is written all the same, and the fetch fails
    /// at its end, as curl's does on a reply it cannot read.
    unreadable: Option<String>,
    /// The body's data bytes written (chunked framing left out).
    body_bytes: u64,
    /// Bytes that came after the body's end by its framing (not written).
    excess: u64,
    /// [`body`](Self::body)'s buffer for the decoded data, kept from piece to piece.
    decoded: Vec<u8>,
    /// Terminal only: the end of what arrived that cannot be shown yet (a character cut
    /// between two pieces, or a CR whose LF may follow).
    held: Vec<u8>,
    /// Terminal only: whether the last text shown ended a line.
    at_line_start: bool,
    /// The reader of `out` went away (a closed pipe): nothing more is written to it.
    out_gone: bool,
}

impl ResponseOut {
    /// The body goes to `output` (created, or emptied, when the body begins) if given, else
    /// to standard output.
    pub fn new(output: Option<&Path>) -> Self {
        let sink = match output {
            Some(path) => Sink::File {
                file: None,
                path: path.to_owned(),
            },
            None => Sink::Stdout {
                terminal: std::io::stdout().is_terminal(),
            },
        };
        ResponseOut::with_sink(std::io::stdout(), sink)
    }
}

impl<W: Write> ResponseOut<W> {
    fn with_sink(out: W, sink: Sink) -> Self {
        ResponseOut {
            out,
            head: Some(Vec::new()),
            sink,
            framing: None,
            unreadable: None,
            body_bytes: 0,
            excess: 0,
            decoded: Vec::new(),
            held: Vec::new(),
            at_line_start: true,
            out_gone: false,
        }
    }

    /// A line (or lines) of the report. `Ok(false)`: the reader of standard output went away
    /// and the body goes there too, so nothing more is wanted. A body going into a file is
    /// still wanted: the report is then no longer written, and the download goes on.
    pub fn report(&mut self, text: &str) -> anyhow::Result<bool> {
        if !self.out_gone && !write_out(&mut self.out, text.as_bytes())? {
            self.out_gone = true;
        }
        Ok(!self.out_gone || matches!(self.sink, Sink::File { .. }))
    }

    /// The next piece of the response. `Ok(false)`: the reader of the body (standard output)
    /// went away (`| head`), so nothing more is wanted; that is not an error of the fetch.
    pub fn push(&mut self, data: &[u8]) -> anyhow::Result<bool> {
        let Some(head) = self.head.as_mut() else {
            return self.body(data);
        };
        // The blank line may straddle two pieces: look from 3 bytes before the new ones.
        let mut from = head.len().saturating_sub(3);
        head.extend_from_slice(data);
        // Interim (1xx) heads are shown as they come, then the final head is looked for in
        // what follows them: a loop, so that any number of them costs no stack.
        loop {
            let head = self.head.get_or_insert_with(Vec::new);
            // However the response is cut: a blank line past the limit does not end a head.
            let end = head_end(head, from).filter(|&(at, _)| at <= MAX_HEAD);
            let (text, rest) = match end {
                Some((at, body_at)) => {
                    let head = self.head.take().unwrap_or_default();
                    let text = head.get(..at).unwrap_or_default();
                    let rest = head.get(body_at..).unwrap_or_default().to_vec();
                    if is_interim(text) {
                        let shown = format!("interim {}", head_lines(text));
                        if !self.report(&shown)? {
                            return Ok(false);
                        }
                        self.head = Some(rest);
                        from = 0;
                        continue;
                    }
                    // A body whose framing cannot be read is written as it comes, and said
                    // so: a cut would not be noticed.
                    let unchecked = match ResponseBody::after_head(text) {
                        Ok(framing) => {
                            self.framing = Some(framing);
                            String::new()
                        }
                        Err(e) => {
                            let why = escape_controls(&e.to_string(), false).into_owned();
                            let shown = format!(" (its end is not checked: {why})");
                            self.unreadable = Some(why);
                            shown
                        }
                    };
                    let opened = match &self.sink {
                        Sink::Stdout { .. } => format!("body{unchecked}:\n"),
                        Sink::File { path, .. } => {
                            format!("body: into {}{unchecked}\n", path.display())
                        }
                    };
                    (head_lines(text) + &opened, rest)
                }
                None if head.len() > MAX_HEAD => {
                    self.unreadable = Some(format!(
                        "no HTTP head ends within its first {} KiB",
                        MAX_HEAD / 1024
                    ));
                    (
                        "response (no HTTP header):\n".to_string(),
                        self.head.take().unwrap_or_default(),
                    )
                }
                None => return Ok(true),
            };
            if !self.report(&text)? {
                return Ok(false);
            }
            return self.body(&rest);
        }
    }

    /// The response ended (the server's close_notify): what is held goes out, and a body cut
    /// short of its framing is an error.
    pub fn finish(&mut self) -> anyhow::Result<()> {
        if let Some(head) = self.head.take() {
            // It ended before its head did: all of it is shown as it came.
            self.unreadable = Some("it ended before an HTTP head did".into());
            if !self.report("response (no HTTP header):\n")? || !self.body(&head)? {
                return Ok(());
            }
        }
        self.write_the_end()?;
        if self.excess > 0 {
            // Not written, as curl does ("Excess found"); not an error either.
            let (n, were) = match self.excess {
                1 => ("1 byte".to_string(), "was"),
                n => (format!("{n} bytes"), "were"),
            };
            eprintln!(
                "mbx: note: {n} came after the body's end (by its framing) and {were} not written"
            );
        }
        if let Some(why) = &self.unreadable {
            let written = match &self.sink {
                Sink::File { path, .. } => format!("written to {}", path.display()),
                Sink::Stdout { .. } => "written above".into(),
            };
            anyhow::bail!("the response is not HTTP that can be read ({why}): what came is {written}, its end unchecked");
        }
        match self.framing.as_ref().and_then(ResponseBody::cut_at_close) {
            // The reason says how much came already.
            Some(why) => Err(anyhow::anyhow!("{why}{}", self.note(false))),
            None => Ok(()),
        }
    }

    /// Whether the body has come whole by its framing (Content-Length reached, last chunk and
    /// trailers read, or no body): nothing more is needed of the server.
    pub fn body_ended(&self) -> bool {
        self.head.is_none() && self.framing.as_ref().is_some_and(ResponseBody::ended)
    }

    /// For an error that ends the fetch part-way: how much of the body came, when its framing
    /// tells, and where it is (a file is left as it is, as curl leaves it).
    pub fn partial_note(&self) -> String {
        self.note(true)
    }

    /// [`partial_note`](Self::partial_note); `amount`: with how much of the body came, as
    /// "5 of its 9 bytes (Content-Length)", when its framing tells (for stdout too: found in a
    /// user trial, a download cut by a dead middlebox said nothing of it).
    fn note(&self, amount: bool) -> String {
        let whole = self.framing.as_ref().is_some_and(ResponseBody::ended);
        let short = match amount {
            true => self
                .framing
                .as_ref()
                .and_then(ResponseBody::short_of_its_end),
            false => None,
        };
        let (n, path) = match &self.sink {
            Sink::File {
                file: Some(_),
                path,
            } => (self.body_bytes, path.display()),
            _ if whole => return " (the body had come whole by then)".into(),
            _ => {
                return short
                    .map(|came| format!(" (the body is incomplete: {came})"))
                    .unwrap_or_default()
            }
        };
        match (whole, short) {
            (true, _) => format!(" (the body had come whole by then: {n} bytes in {path})"),
            (false, Some(came)) => {
                format!(" (the body is incomplete: {came}; what came is in {path})")
            }
            (false, None) => {
                format!(" ({n} bytes of the body came and are in {path}, which is incomplete)")
            }
        }
    }

    fn write_the_end(&mut self) -> anyhow::Result<()> {
        match &mut self.sink {
            Sink::Stdout { terminal: false } => gone_or_error(self.out.flush()).map(drop),
            Sink::Stdout { terminal: true } => {
                let rest = std::mem::take(&mut self.held);
                let mut shown = escape_body(&String::from_utf8_lossy(&rest));
                if let Some(last) = shown.chars().last() {
                    self.at_line_start = last == '\n';
                }
                // The terminal's prompt starts on a line of its own.
                if !self.at_line_start {
                    shown.push('\n');
                }
                write_out(&mut self.out, shown.as_bytes()).map(drop)
            }
            Sink::File { file, path } => {
                let file = open_once(file, path)?;
                // Only a regular file has data to sync: /dev/null or a FIFO refuse the call
                // (EINVAL), and the body went there whole (found in a user trial).
                let regular = file.metadata().is_ok_and(|m| m.is_file());
                file.flush()
                    .and_then(|()| if regular { file.sync_data() } else { Ok(()) })
                    .with_context(|| {
                        format!("cannot write the response body to {}", path.display())
                    })?;
                let line = format!(
                    "body: {} bytes written to {}\n",
                    self.body_bytes,
                    path.display()
                );
                self.report(&line).map(drop)
            }
        }
    }

    fn body(&mut self, data: &[u8]) -> anyhow::Result<bool> {
        let Some(framing) = self.framing.as_mut() else {
            return self.body_data(data);
        };
        // The data without the chunked framing, into a buffer kept from piece to piece (a
        // copy: small beside the record layer's work on the same bytes); what follows the
        // body's end is not read.
        let mut decoded = std::mem::take(&mut self.decoded);
        decoded.clear();
        let read = framing.read(data, |d| decoded.extend_from_slice(d));
        // What came before a fault is written all the same.
        let written = self.body_data(&decoded);
        self.decoded = decoded;
        let written = written?;
        match read {
            Ok(used) => {
                self.excess += (data.len() - used) as u64;
                Ok(written)
            }
            Err(e) => {
                let note = self.partial_note();
                // Best effort: what a terminal still holds, the file's line.
                let _ = self.write_the_end();
                Err(anyhow::Error::new(e).context(format!("the response body is malformed{note}")))
            }
        }
    }

    fn body_data(&mut self, data: &[u8]) -> anyhow::Result<bool> {
        self.body_bytes += data.len() as u64;
        match &mut self.sink {
            // Flushed at once: standard output holds what it is given until a line ends, and
            // a body that pauses mid-line must still show what came (found in a user trial).
            Sink::Stdout { terminal: false } => {
                let written = write_out(&mut self.out, data)?;
                Ok(written && gone_or_error(self.out.flush())?)
            }
            Sink::Stdout { terminal: true } => {
                self.held.extend_from_slice(data);
                let ready = text_ready(&self.held);
                let rest = self.held.split_off(ready);
                let text = std::mem::replace(&mut self.held, rest);
                let shown = escape_body(&String::from_utf8_lossy(&text));
                if let Some(last) = shown.chars().last() {
                    self.at_line_start = last == '\n';
                }
                let written = write_out(&mut self.out, shown.as_bytes())?;
                Ok(written && gone_or_error(self.out.flush())?)
            }
            Sink::File { file, path } => {
                let before = self.body_bytes - data.len() as u64;
                open_once(file, path)?.write_all(data).with_context(|| {
                    format!(
                        "cannot write the response body to {} ({before} bytes of it came \
                         before this piece; the file is incomplete)",
                        path.display()
                    )
                })?;
                Ok(true)
            }
        }
    }
}

/// Whether `path` can take a body, checked before the fetch starts (the file itself is
/// created only when the body begins): not a directory, in a directory that exists.
pub fn check_body_file(path: &Path) -> anyhow::Result<()> {
    let names_a_directory = path.as_os_str().as_encoded_bytes().ends_with(b"/");
    anyhow::ensure!(
        !path.is_dir() && !names_a_directory,
        "--output {}: a directory, not a file",
        path.display()
    );
    let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
    if let Some(dir) = parent {
        anyhow::ensure!(
            dir.is_dir(),
            "--output {}: {} {}",
            path.display(),
            dir.display(),
            match dir.exists() {
                true => "is not a directory",
                false => "does not exist",
            }
        );
    }
    Ok(())
}

/// The body's file, created (or emptied) on its first use.
fn open_once<'a>(file: &'a mut Option<File>, path: &Path) -> anyhow::Result<&'a mut File> {
    if file.is_none() {
        let created =
            File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
        *file = Some(created);
    }
    file.as_mut().context("the body's file")
}

/// Where the head in `bytes` ends, looking from `from`: (the end of its text, without the
/// last line's end; where the body begins). Its end is an empty line, its line ends CRLF or
/// a bare LF (as curl reads them; found in a user trial).
fn head_end(bytes: &[u8], from: usize) -> Option<(usize, usize)> {
    let start = from.min(bytes.len());
    bytes[start..].iter().enumerate().find_map(|(k, &b)| {
        let lf = start + k;
        if b != b'\n' {
            return None;
        }
        let text_end = match lf.checked_sub(1).map(|i| bytes[i]) {
            Some(b'\r') => lf - 1,
            _ => lf,
        };
        match bytes.get(lf + 1..) {
            Some([b'\n', ..]) => Some((text_end, lf + 2)),
            Some([b'\r', b'\n', ..]) => Some((text_end, lf + 3)),
            _ => None,
        }
    })
}

/// Whether `head` (without its blank line) is an interim response's: `HTTP/1.x 1xx`, other
/// than 101 (a switch, after which nothing is HTTP).
fn is_interim(head: &[u8]) -> bool {
    match head {
        [b'H', b'T', b'T', b'P', b'/', b'1', b'.', _, b' ', b'1', d1, d2, ..] => {
            d1.is_ascii_digit() && d2.is_ascii_digit() && (*d1, *d2) != (b'0', b'1')
        }
        _ => false,
    }
}

/// The status line and header fields as report lines.
fn head_lines(head: &[u8]) -> String {
    let head = String::from_utf8_lossy(head);
    let mut lines = head.split('\n').map(|l| l.strip_suffix('\r').unwrap_or(l));
    let mut out = String::new();
    if let Some(status) = lines.next() {
        out.push_str(&format!(
            "status: {}\nheaders:\n",
            escape_controls(status, false)
        ));
    }
    for l in lines {
        out.push_str(&format!("  {}\n", escape_controls(l, false)));
    }
    out
}

/// How much of `held` can be shown now: all but a character cut at its end (up to 3 bytes
/// of a longer UTF-8 sequence) and a final CR (its LF may come next, and CRLF shows as LF).
fn text_ready(held: &[u8]) -> usize {
    let mut ready = held.len();
    for back in 1..=held.len().min(3) {
        let at = held.len() - back;
        let byte = held.get(at).copied().unwrap_or_default();
        if byte & 0xC0 == 0x80 {
            continue; // a continuation byte: look further back for the lead byte
        }
        let needs = match byte {
            0xF0..=0xF7 => 4,
            0xE0..=0xEF => 3,
            0xC0..=0xDF => 2,
            _ => 1,
        };
        if needs > back {
            ready = at;
        }
        break;
    }
    if ready > 0 && held.get(ready - 1) == Some(&b'\r') {
        ready -= 1;
    }
    ready
}

/// A body for a terminal: control characters escaped (as report lines escape them), line
/// breaks (LF or CRLF) and tabs kept.
pub fn escape_body(text: &str) -> String {
    let text = text.replace("\r\n", "\n");
    escape_controls_but(&text, &['\n', '\t']).into_owned()
}

/// `Ok(false)` when the reader went away (a closed pipe); any other failure is an error: the
/// response could not be written whole (a full disk behind `> file`).
fn write_out(out: &mut impl Write, bytes: &[u8]) -> anyhow::Result<bool> {
    gone_or_error(out.write_all(bytes))
}

fn gone_or_error(r: std::io::Result<()>) -> anyhow::Result<bool> {
    match r {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
        Err(e) => {
            Err(anyhow::Error::new(e).context("cannot write the response to standard output"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_shown_at_whole_characters_and_a_final_cr_waits() {
        assert_eq!(text_ready(b"abc"), 3);
        assert_eq!(text_ready(b"abc\r"), 3);
        assert_eq!(text_ready(b"ab\r\n"), 4);
        // "é" is C3 A9; "€" is E2 82 AC; "𝄞" is F0 9D 84 9E.
        assert_eq!(text_ready(b"a\xc3"), 1);
        assert_eq!(text_ready(b"a\xc3\xa9"), 3);
        assert_eq!(text_ready(b"a\xe2\x82"), 1);
        assert_eq!(text_ready(b"a\xe2\x82\xac"), 4);
        assert_eq!(text_ready(b"a\xf0\x9d\x84"), 1);
        assert_eq!(text_ready(b"a\xf0\x9d\x84\x9e"), 5);
        // Not UTF-8 at all: shown (lossily) rather than held forever.
        assert_eq!(text_ready(b"a\xff\xfe"), 3);
        assert_eq!(text_ready(b""), 0);
    }

    /// What a terminal would be shown, the response cut into pieces of `piece` bytes; the
    /// end is an error if and only if the response is not HTTP.
    fn on_terminal(response: &[u8], piece: usize) -> String {
        let mut out = ResponseOut::with_sink(Vec::new(), Sink::Stdout { terminal: true });
        for p in response.chunks(piece) {
            assert!(out.push(p).unwrap());
        }
        let end = out.finish();
        let shown = String::from_utf8(out.out).unwrap();
        assert_eq!(
            end.is_err(),
            shown.starts_with("response (no HTTP header):"),
            "{end:?}"
        );
        shown
    }

    /// However the response is cut, a terminal is shown the same: the head as report lines,
    /// CRLF as one line break, characters whole, control characters escaped, and a final line
    /// break.
    #[test]
    fn a_terminal_is_shown_the_same_however_the_response_is_cut() {
        let response = "HTTP/1.1 200 OK\r\nX-A: \u{1b}b\r\n\r\nline 1\r\n€ and 𝄞\r\n\u{1b}[2J end";
        let want = "status: HTTP/1.1 200 OK\nheaders:\n  X-A: \\u{1b}b\nbody:\n\
                    line 1\n€ and 𝄞\n\\u{1b}[2J end\n";
        for piece in 1..=response.len() {
            assert_eq!(
                on_terminal(response.as_bytes(), piece),
                want,
                "pieces of {piece}"
            );
        }
        // A response without a head is shown as it came; an empty body adds nothing.
        assert_eq!(
            on_terminal(b"no head", 3),
            "response (no HTTP header):\nno head\n"
        );
        assert_eq!(
            on_terminal(b"HTTP/1.1 204 No Content\r\n\r\n", 5),
            "status: HTTP/1.1 204 No Content\nheaders:\nbody:\n"
        );
    }

    proptest::proptest! {
        /// Any response, cut anywhere, is shown the same as when it comes whole, on a terminal
        /// and elsewhere, and nothing panics.
        #[test]
        fn any_response_cut_anywhere_shows_the_same(
            // Bytes that matter at a cut: CR and LF, the parts of multi-byte characters,
            // control characters, bytes that are never UTF-8, and any byte at all.
            response in proptest::collection::vec(
                proptest::prop_oneof![
                    proptest::sample::select(
                        b"\r\n\r\na\x1b\xe2\x82\xac\xc3\xa9\xf0\x9d\x84\x9e\xff".to_vec()
                    ),
                    proptest::prelude::any::<u8>(),
                ],
                0..300,
            ),
            cuts in proptest::collection::vec(1usize..40, 1..20),
            head_first in proptest::prelude::any::<bool>(),
            // With a head: the body until the close, by its length, or chunked (in chunks of
            // up to `chunk` bytes).
            framing in 0u8..3,
            chunk in 1usize..50,
        ) {
            let data = response.clone();
            let mut response = response;
            if head_first {
                let (fields, body) = match framing {
                    0 => (String::new(), response.clone()),
                    1 => (format!("Content-Length: {}\r\n", response.len()), response.clone()),
                    _ => {
                        let mut body = Vec::new();
                        for c in response.chunks(chunk) {
                            body.extend_from_slice(format!("{:x}\r\n", c.len()).as_bytes());
                            body.extend_from_slice(c);
                            body.extend_from_slice(b"\r\n");
                        }
                        body.extend_from_slice(b"0\r\n\r\n");
                        ("Transfer-Encoding: chunked\r\n".to_string(), body)
                    }
                };
                let mut with_head = format!("HTTP/1.1 200 OK\r\nX: y\r\n{fields}\r\n").into_bytes();
                with_head.extend_from_slice(&body);
                response = with_head;
            }
            for terminal in [true, false] {
                // What is shown, and the verdict at the end.
                let show = |pieces: &[&[u8]]| {
                    let mut out = ResponseOut::with_sink(Vec::new(), Sink::Stdout { terminal });
                    for p in pieces {
                        assert!(out.push(p).unwrap());
                    }
                    let end = out.finish().map_err(|e| e.to_string());
                    (out.out, end)
                };
                let whole = show(&[&response]);
                // A response with its head is read, and ends, whole.
                if head_first {
                    proptest::prop_assert!(whole.1.is_ok(), "{:?}", whole.1);
                }
                let mut pieces = Vec::new();
                let mut rest = &response[..];
                for &c in cuts.iter().cycle().take(response.len() + 1) {
                    if rest.is_empty() {
                        break;
                    }
                    let (p, r) = rest.split_at(c.min(rest.len()));
                    pieces.push(p);
                    rest = r;
                }
                // Written byte for byte, its framing removed.
                if head_first && !terminal {
                    proptest::prop_assert!(whole.0.ends_with(&data), "framing {}", framing);
                }
                proptest::prop_assert_eq!(show(&pieces), whole, "terminal {}", terminal);
            }
        }
    }

    /// A blank line past the head's limit does not end a head, whether it comes in one piece
    /// or in many.
    #[test]
    fn a_head_too_long_is_no_head_however_it_is_cut() {
        let mut response = b"HTTP/1.1 200 OK\r\nX: ".to_vec();
        response.extend(std::iter::repeat_n(b'a', MAX_HEAD));
        response.extend_from_slice(b"\r\n\r\nbody");
        for piece in [response.len(), 1000, 7] {
            let mut out = ResponseOut::with_sink(Vec::new(), Sink::Stdout { terminal: false });
            for p in response.chunks(piece) {
                assert!(out.push(p).unwrap());
            }
            let why = out.finish().unwrap_err().to_string();
            assert!(
                why.contains("no HTTP head ends within its first 64 KiB"),
                "{why}"
            );
            assert!(
                out.out
                    .starts_with(b"response (no HTTP header):\nHTTP/1.1 200 OK"),
                "pieces of {piece}"
            );
        }
    }

    /// A chunked body is written decoded; a body cut short of its Content-Length or its last
    /// chunk is written as far as it came, and its end is an error that says so (twenty-sixth
    /// round, found in a user trial: a download cut by the backend's end passed for whole).
    #[test]
    fn chunked_bodies_are_decoded_and_cut_bodies_are_errors() {
        let fetch = |response: &[u8]| {
            let mut out = ResponseOut::with_sink(Vec::new(), Sink::Stdout { terminal: false });
            for p in response.chunks(3) {
                assert!(out.push(p).unwrap());
            }
            let end = out.finish().map_err(|e| e.to_string());
            (out.out, end)
        };
        let (shown, end) = fetch(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n1\r\n!\r\n0\r\n\r\n",
        );
        assert!(shown.ends_with(b"body:\nhello!"), "{shown:?}");
        assert_eq!(end, Ok(()));
        let (shown, end) = fetch(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello");
        assert!(shown.ends_with(b"body:\nhello"), "{shown:?}");
        assert_eq!(end, Ok(()));
        let (shown, end) = fetch(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nhello");
        assert!(shown.ends_with(b"body:\nhello"), "{shown:?}");
        let why = end.unwrap_err();
        assert!(why.contains("5 of its 9 bytes"), "{why}");
        // A fetch that fails otherwise part-way (a middlebox gone: no close) says it too, once.
        let mut out = ResponseOut::with_sink(Vec::new(), Sink::Stdout { terminal: false });
        assert!(out
            .push(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nhello")
            .unwrap());
        assert_eq!(
            out.partial_note(),
            " (the body is incomplete: 5 of its 9 bytes (Content-Length) came)"
        );
        assert_eq!(
            out.finish()
                .unwrap_err()
                .to_string()
                .matches("5 of its 9")
                .count(),
            1
        );
        let (shown, end) =
            fetch(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n");
        assert!(shown.ends_with(b"body:\nhello"), "{shown:?}");
        assert!(end.unwrap_err().contains("before its last chunk"));
        let mut out = ResponseOut::with_sink(Vec::new(), Sink::Stdout { terminal: false });
        let bad = out.push(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n");
        assert!(bad.unwrap_err().to_string().contains("malformed"));
        // Into a file: the error says where the part that came is.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("body");
        let sink = Sink::File {
            file: None,
            path: path.clone(),
        };
        let mut out = ResponseOut::with_sink(Vec::new(), sink);
        assert_eq!(out.partial_note(), "");
        assert!(out
            .push(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nhello")
            .unwrap());
        assert_eq!(
            out.partial_note(),
            format!(
                " (the body is incomplete: 5 of its 9 bytes (Content-Length) came; what came is in {})",
                path.display()
            )
        );
        let why = out.finish().unwrap_err().to_string();
        assert!(
            why.contains(&format!(
                "5 bytes of the body came and are in {}",
                path.display()
            )),
            "{why}"
        );
        assert_eq!(std::fs::read(&path).unwrap(), b"hello");
    }

    /// Interim heads (103 Early Hints) are shown as such and the final head's framing is
    /// used, however the response is cut; a malformed chunk after good ones in the same piece
    /// leaves the good ones written; a body that came whole says so in a later error's note;
    /// bytes after the body's end are counted, not written.
    #[test]
    fn interim_heads_faults_after_good_data_and_bytes_past_the_end() {
        let response = b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n\
                         HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
        let want = "interim status: HTTP/1.1 103 Early Hints\nheaders:\n  Link: </a>\n\
                    status: HTTP/1.1 200 OK\nheaders:\n  Content-Length: 2\nbody:\nok\n";
        for piece in 1..=response.len() {
            assert_eq!(on_terminal(response, piece), want, "pieces of {piece}");
        }
        let mut out = ResponseOut::with_sink(Vec::new(), Sink::Stdout { terminal: false });
        let bad =
            out.push(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\nzz\r\n");
        assert!(bad.unwrap_err().to_string().contains("malformed"));
        assert!(out.out.ends_with(b"body:\nok"), "{:?}", out.out);
        let mut out = ResponseOut::with_sink(Vec::new(), Sink::Stdout { terminal: false });
        assert!(out
            .push(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokEXTRA")
            .unwrap());
        assert_eq!(out.partial_note(), " (the body had come whole by then)");
        assert_eq!(out.excess, 5);
        out.finish().unwrap();
        assert!(out.out.ends_with(b"body:\nok"), "{:?}", out.out);
    }

    /// Standard output whose reader has gone (`| head` that has read its lines).
    struct Gone;

    impl Write for Gone {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(std::io::ErrorKind::BrokenPipe.into())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Err(std::io::ErrorKind::BrokenPipe.into())
        }
    }

    /// A reader of standard output that goes away ends a fetch whose body goes there, but
    /// not one whose body goes into a file: that download goes on to its end, whole, and a
    /// cut is still an error.
    #[test]
    fn a_gone_stdout_reader_stops_only_a_body_that_goes_to_it() {
        let response = b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n0123456789";
        let mut out = ResponseOut::with_sink(Gone, Sink::Stdout { terminal: false });
        assert!(!out.report("path: client -> server\n").unwrap());
        assert!(!out.push(response).unwrap());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("body");
        for piece in [1, 7, response.len()] {
            let sink = Sink::File {
                file: None,
                path: path.clone(),
            };
            let mut out = ResponseOut::with_sink(Gone, sink);
            assert!(out.report("path: client -> server\n").unwrap());
            for p in response.chunks(piece) {
                assert!(out.push(p).unwrap(), "pieces of {piece}");
            }
            out.finish().unwrap();
            assert_eq!(std::fs::read(&path).unwrap(), b"0123456789");
        }
        let sink = Sink::File {
            file: None,
            path: path.clone(),
        };
        let mut out = ResponseOut::with_sink(Gone, sink);
        assert!(out.push(&response[..response.len() - 1]).unwrap());
        let why = out.finish().unwrap_err().to_string();
        assert!(why.contains("9 bytes of the body came"), "{why}");
    }

    #[test]
    fn a_body_file_is_refused_before_the_fetch_when_it_cannot_be_created() {
        let dir = tempfile::tempdir().unwrap();
        let e = check_body_file(dir.path()).unwrap_err().to_string();
        assert!(e.contains("a directory, not a file"), "{e}");
        let e = check_body_file(&dir.path().join("no/such/file"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("does not exist"), "{e}");
        let e = check_body_file(&dir.path().join("new/"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("a directory, not a file"), "{e}");
        std::fs::write(dir.path().join("file"), b"").unwrap();
        let e = check_body_file(&dir.path().join("file/x"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("file is not a directory"), "{e}");
        check_body_file(&dir.path().join("new")).unwrap();
        check_body_file(Path::new("relative")).unwrap();
    }

    /// Heads whose lines end in a bare LF, and fields folded over two lines (obsolete, RFC
    /// 9112 §5.2), are read as curl reads them, however the response is cut (before the
    /// twenty-seventh round: "it ended before an HTTP head did", and "invalid header name").
    #[test]
    fn bare_lf_heads_and_folded_fields_are_read() {
        let lf = b"HTTP/1.1 200 OK\nContent-Length: 3\n\nabc";
        let want = "status: HTTP/1.1 200 OK\nheaders:\n  Content-Length: 3\nbody:\nabc\n";
        for piece in 1..=lf.len() {
            assert_eq!(on_terminal(lf, piece), want, "pieces of {piece}");
        }
        let folded = b"HTTP/1.1 200 OK\r\nX-A: a\r\n b\r\nContent-Length: 2\r\n\r\nok";
        let mut out = ResponseOut::with_sink(Vec::new(), Sink::Stdout { terminal: false });
        assert!(out.push(folded).unwrap());
        out.finish().unwrap();
        assert!(out.out.ends_with(b"body:\nok"), "{:?}", out.out);
    }

    /// Anywhere but a terminal the body is written byte for byte.
    #[test]
    fn elsewhere_the_body_is_written_as_it_came() {
        let mut out = ResponseOut::with_sink(Vec::new(), Sink::Stdout { terminal: false });
        for p in b"HTTP/1.1 200 OK\r\n\r\n\x00\xff\r\n\x1b".chunks(2) {
            assert!(out.push(p).unwrap());
        }
        out.finish().unwrap();
        assert_eq!(
            out.out,
            b"status: HTTP/1.1 200 OK\nheaders:\nbody:\n\x00\xff\r\n\x1b"
        );
        // After a 101 the bytes are another protocol's: written as they come, unchecked (an
        // error at the end, as for any reply that is not HTTP to a GET), and
        // the 101 is not called interim (as it was before the twenty-seventh round).
        let mut out = ResponseOut::with_sink(Vec::new(), Sink::Stdout { terminal: false });
        assert!(out
            .push(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\nraw")
            .unwrap());
        let why = out.finish().unwrap_err().to_string();
        assert!(why.contains("not HTTP that can be read"), "{why}");
        let shown = String::from_utf8(out.out).unwrap();
        assert!(
            shown.ends_with(
                "body (its end is not checked: 101 Switching Protocols: what follows is \
                 another protocol's, not HTTP):\nraw"
            ),
            "{shown}"
        );
    }

    #[test]
    fn a_terminal_sees_control_characters_escaped_line_breaks_and_tabs_kept() {
        assert_eq!(
            escape_body("a\tb\r\nc\u{1b}[2J\n\u{202e}x\ry"),
            "a\tb\nc\\u{1b}[2J\n\\u{202e}x\\ry"
        );
    }
}
