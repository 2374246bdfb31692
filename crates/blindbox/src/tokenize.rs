//! Tokenizers (paper §3): turn one direction of a flow into 8-byte tokens with their stream offsets.
//!
//! * [`WindowTokenizer`]: a token at every byte offset. Any keyword of at least 8 bytes is the
//!   concatenation of (overlapping) tokens, so nothing is missed.
//! * [`DelimiterTokenizer`]: only tokens that start or end on a delimiter boundary. A keyword that
//!   starts and ends on boundaries then has its first and last 8-byte chunk among the tokens, which is
//!   what the detector checks in this mode (see `detect`). About half the tokens, at the price of
//!   missing keywords that start or end inside a word.
//!
//! Both are streaming: the tokens (and their offsets) do not depend on how the stream is split into
//! `push` calls. A *segment* is a contiguous run of inspected bytes; tokens never span two segments
//! (a skipped body or a new HTTP message ends a segment). [`FlowTokenizer`] drives a tokenizer from
//! the [`HttpFramer`].

use crate::http::{FrameEvent, HttpFramer};

/// Token length in bytes (the paper's choice; also the rule chunk length).
pub const TOKEN_LEN: usize = 8;

/// One plaintext token.
pub type Token = [u8; TOKEN_LEN];

/// A delimiter: any ASCII byte that is not a letter or a digit (punctuation, space, symbols,
/// control characters). Bytes >= 0x80 count as word characters so UTF-8 words stay whole.
pub fn is_delimiter(b: u8) -> bool {
    b < 0x80 && !b.is_ascii_alphanumeric()
}

/// Which tokenization a flow uses (both endpoints and the middlebox must agree).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Tokenization {
    Window,
    Delimiter,
}

/// Which token lanes the sender emits.
///
/// `Dual` emits, at every token position, the exact token and then its ASCII-lowercased form, so
/// `nocase` keywords can be matched (the rule side lowercases their chunks). It doubles the token
/// bandwidth and reveals nothing beyond that: both lanes are always sent, even when equal.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CaseMode {
    Exact,
    Dual,
}

/// The lane of a token in [`CaseMode::Dual`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Lane {
    Exact,
    Folded,
}

/// A token with its stream offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Positioned {
    pub offset: u64,
    pub token: Token,
}

fn token_at(w: &[u8], idx: usize) -> Option<Token> {
    let bytes = w.get(idx..idx + TOKEN_LEN)?;
    let mut t = [0u8; TOKEN_LEN];
    t.copy_from_slice(bytes);
    Some(t)
}

/// Window tokenizer: one token at every offset.
#[derive(Clone, Debug, Default)]
pub struct WindowTokenizer {
    /// Last < 8 bytes of the current segment.
    tail: Vec<u8>,
    /// Stream offset of the next byte.
    pos: u64,
}

impl WindowTokenizer {
    pub fn new() -> Self {
        Self::default()
    }

    /// Stream offset of the next byte.
    pub fn position(&self) -> u64 {
        self.pos
    }

    /// Tokenizes the next bytes of the current segment.
    pub fn push(&mut self, data: &[u8], out: &mut Vec<Positioned>) {
        out.reserve(data.len());
        self.push_runs(data, &mut |run| {
            if let WindowRun::Tokens { first, bytes } = run {
                out.extend(window_tokens(first, bytes));
            }
        });
    }

    /// The tokens [`Self::push`] would emit, as at most two [`WindowRun::Tokens`] (those that
    /// start in the kept tail, then those that start in `data`), without copying `data`.
    pub fn push_runs(&mut self, data: &[u8], f: &mut impl FnMut(WindowRun<'_>)) {
        let start = self.pos - self.tail.len() as u64;
        // The kept tail and the 7 bytes after it hold every token that starts in the tail.
        let mut head = std::mem::take(&mut self.tail);
        head.extend_from_slice(data.get(..TOKEN_LEN - 1).unwrap_or(data));
        if head.len() >= TOKEN_LEN {
            f(WindowRun::Tokens {
                first: start,
                bytes: &head,
            });
        }
        if data.len() >= TOKEN_LEN {
            f(WindowRun::Tokens {
                first: self.pos,
                bytes: data,
            });
        }
        // The new tail: the last (up to) 7 bytes of the segment so far.
        if let Some(last) = data
            .len()
            .checked_sub(TOKEN_LEN - 1)
            .and_then(|n| data.get(n..))
        {
            head.clear();
            head.extend_from_slice(last);
        } else {
            head.drain(..head.len().saturating_sub(TOKEN_LEN - 1));
        }
        self.tail = head;
        self.pos += data.len() as u64;
    }

    /// Ends the current segment (nothing more to emit in window mode).
    pub fn end_segment(&mut self, _out: &mut Vec<Positioned>) {
        self.tail.clear();
    }

    /// Skips `n` bytes that are not tokenized (call after `end_segment`).
    pub fn skip(&mut self, n: u64) {
        self.tail.clear();
        self.pos += n;
    }
}

/// Delimiter tokenizer: a token at offset `o` iff `o` or `o + 8` is a boundary.
///
/// A boundary is a position `p` between bytes with `p` at the start or end of a segment, or with a
/// delimiter just before or just after it. Deciding whether `o + 8` is a boundary needs the byte
/// after the token, so a token is emitted once that byte arrived or the segment ended.
#[derive(Clone, Debug, Default)]
pub struct DelimiterTokenizer {
    /// Bytes from `tail_start` to `pos` (at most 9: the undecided tokens and the byte before them).
    tail: Vec<u8>,
    tail_start: u64,
    /// First token offset not decided yet.
    next: u64,
    seg_start: u64,
    pos: u64,
}

impl DelimiterTokenizer {
    pub fn new() -> Self {
        Self::default()
    }

    /// Stream offset of the next byte.
    pub fn position(&self) -> u64 {
        self.pos
    }

    /// Tokenizes the next bytes of the current segment.
    pub fn push(&mut self, data: &[u8], out: &mut Vec<Positioned>) {
        let mut work = std::mem::take(&mut self.tail);
        work.extend_from_slice(data);
        let work_start = self.tail_start;
        let work_end = work_start + work.len() as u64;
        while self.next + (TOKEN_LEN as u64) < work_end {
            let o = self.next;
            let idx = (o - work_start) as usize;
            let delim_at = |i: usize| work.get(i).copied().is_some_and(is_delimiter);
            let start_b = o == self.seg_start || delim_at(idx) || (idx > 0 && delim_at(idx - 1));
            let end_b = delim_at(idx + TOKEN_LEN - 1) || delim_at(idx + TOKEN_LEN);
            if start_b || end_b {
                if let Some(token) = token_at(&work, idx) {
                    out.push(Positioned { offset: o, token });
                }
            }
            self.next += 1;
        }
        // Keep the undecided tokens' bytes plus the byte before them.
        let keep_from = self
            .next
            .saturating_sub(1)
            .max(self.seg_start)
            .max(work_start);
        let cut = (keep_from - work_start) as usize;
        self.tail = work.get(cut..).unwrap_or_default().to_vec();
        self.tail_start = keep_from;
        self.pos = work_end;
    }

    /// Ends the current segment: the token ending exactly at its end ends on a boundary.
    pub fn end_segment(&mut self, out: &mut Vec<Positioned>) {
        if self.pos >= self.seg_start + TOKEN_LEN as u64 {
            let o = self.pos - TOKEN_LEN as u64;
            if o >= self.next {
                let idx = (o - self.tail_start) as usize;
                if let Some(token) = token_at(&self.tail, idx) {
                    out.push(Positioned { offset: o, token });
                }
            }
        }
        self.tail.clear();
        self.seg_start = self.pos;
        self.tail_start = self.pos;
        self.next = self.pos;
    }

    /// Skips `n` bytes that are not tokenized (call after `end_segment`).
    pub fn skip(&mut self, n: u64) {
        self.tail.clear();
        self.pos += n;
        self.seg_start = self.pos;
        self.tail_start = self.pos;
        self.next = self.pos;
    }
}

#[derive(Clone, Debug)]
enum Inner {
    Window(WindowTokenizer),
    Delimiter(DelimiterTokenizer),
}

impl Inner {
    fn push(&mut self, data: &[u8], out: &mut Vec<Positioned>) {
        match self {
            Inner::Window(t) => t.push(data, out),
            Inner::Delimiter(t) => t.push(data, out),
        }
    }
    fn end_segment(&mut self, out: &mut Vec<Positioned>) {
        match self {
            Inner::Window(t) => t.end_segment(out),
            Inner::Delimiter(t) => t.end_segment(out),
        }
    }
    fn skip(&mut self, n: u64) {
        match self {
            Inner::Window(t) => t.skip(n),
            Inner::Delimiter(t) => t.skip(n),
        }
    }
}

/// A window-tokenized, exact-lane flow as [`FlowTokenizer::push_windows`] hands it over: the
/// same events as [`FlowEvent`]s, with the tokens left in the bytes they come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WindowRun<'a> {
    /// [`FlowEvent::MessageStart`].
    MessageStart(u64),
    /// An `Exact` token at each offset `first + i` for which `bytes[i..i + 8]` exists: that
    /// slice.
    Tokens { first: u64, bytes: &'a [u8] },
}

impl WindowRun<'_> {
    /// The same events as [`FlowEvent`]s.
    pub fn events(&self) -> Vec<FlowEvent> {
        match *self {
            WindowRun::MessageStart(o) => vec![FlowEvent::MessageStart(o)],
            WindowRun::Tokens { first, bytes } => window_tokens(first, bytes)
                .map(|p| FlowEvent::Token {
                    offset: p.offset,
                    lane: Lane::Exact,
                    token: p.token,
                })
                .collect(),
        }
    }
}

/// The token at every offset of `bytes`, which starts at stream offset `first`.
fn window_tokens(first: u64, bytes: &[u8]) -> impl Iterator<Item = Positioned> + '_ {
    bytes.windows(TOKEN_LEN).zip(first..).map(|(w, offset)| {
        let mut token = [0u8; TOKEN_LEN];
        token.copy_from_slice(w);
        Positioned { offset, token }
    })
}

/// What a [`FlowTokenizer`] produces, in stream order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FlowEvent {
    /// A new HTTP message (the anchor for absolute rule offsets) starts here.
    MessageStart(u64),
    /// A token; in [`CaseMode::Dual`] each position gives an `Exact` then a `Folded` event.
    Token {
        offset: u64,
        lane: Lane,
        token: Token,
    },
}

/// Tokenizes one direction of a flow: HTTP framing, skipped bodies, segments and case lanes.
#[derive(Debug)]
pub struct FlowTokenizer {
    framer: HttpFramer,
    inner: Inner,
    case: CaseMode,
    scratch: Vec<Positioned>,
}

impl FlowTokenizer {
    /// `http`: frame the flow as HTTP/1.1 (skip non-text bodies); otherwise inspect every byte.
    pub fn new(mode: Tokenization, case: CaseMode, http: bool) -> Self {
        let inner = match mode {
            Tokenization::Window => Inner::Window(WindowTokenizer::new()),
            Tokenization::Delimiter => Inner::Delimiter(DelimiterTokenizer::new()),
        };
        let framer = if http {
            HttpFramer::new()
        } else {
            HttpFramer::raw()
        };
        Self {
            framer,
            inner,
            case,
            scratch: Vec::new(),
        }
    }

    /// The framer (for its raw-mode diagnostics).
    pub fn framer(&self) -> &HttpFramer {
        &self.framer
    }

    /// Tokenizes the next bytes of the flow.
    pub fn push(&mut self, data: &[u8], out: &mut Vec<FlowEvent>) {
        for ev in self.framer.push(data) {
            match ev {
                FrameEvent::MessageStart(o) => {
                    self.inner.end_segment(&mut self.scratch);
                    self.drain(out);
                    out.push(FlowEvent::MessageStart(o));
                }
                FrameEvent::Inspect { range, .. } => {
                    self.inner
                        .push(data.get(range).unwrap_or_default(), &mut self.scratch);
                    self.drain(out);
                }
                FrameEvent::Skip { range, .. } => {
                    self.inner.end_segment(&mut self.scratch);
                    self.drain(out);
                    self.inner.skip(range.len() as u64);
                }
            }
        }
    }

    /// Whether [`Self::push_windows`] applies: window tokenization, [`CaseMode::Exact`].
    pub fn is_window_exact(&self) -> bool {
        matches!(self.inner, Inner::Window(_)) && self.case == CaseMode::Exact
    }

    /// [`Self::push`] for a window-tokenized, exact-lane flow: the same events, in order, as
    /// [`WindowRun`]s (no token is copied out of `data`). Returns `false` and consumes nothing
    /// when [`Self::is_window_exact`] does not hold.
    pub fn push_windows(&mut self, data: &[u8], mut f: impl FnMut(WindowRun<'_>)) -> bool {
        if self.case != CaseMode::Exact {
            return false;
        }
        let Inner::Window(window) = &mut self.inner else {
            return false;
        };
        for ev in self.framer.push(data) {
            match ev {
                FrameEvent::MessageStart(o) => {
                    window.tail.clear();
                    f(WindowRun::MessageStart(o));
                }
                FrameEvent::Inspect { range, .. } => {
                    window.push_runs(data.get(range).unwrap_or_default(), &mut f);
                }
                FrameEvent::Skip { range, .. } => {
                    window.tail.clear();
                    window.skip(range.len() as u64);
                }
            }
        }
        true
    }

    /// The flow ended: flush the tokens that end at its last byte.
    pub fn finish(&mut self, out: &mut Vec<FlowEvent>) {
        self.inner.end_segment(&mut self.scratch);
        self.drain(out);
    }

    fn drain(&mut self, out: &mut Vec<FlowEvent>) {
        if self.case == CaseMode::Exact {
            out.extend(self.scratch.drain(..).map(|p| FlowEvent::Token {
                offset: p.offset,
                lane: Lane::Exact,
                token: p.token,
            }));
            return;
        }
        for p in self.scratch.drain(..) {
            out.push(FlowEvent::Token {
                offset: p.offset,
                lane: Lane::Exact,
                token: p.token,
            });
            if self.case == CaseMode::Dual {
                let folded = p.token.map(|b| b.to_ascii_lowercase());
                out.push(FlowEvent::Token {
                    offset: p.offset,
                    lane: Lane::Folded,
                    token: folded,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn window_all(data: &[u8]) -> Vec<Positioned> {
        let mut t = WindowTokenizer::new();
        let mut out = Vec::new();
        t.push(data, &mut out);
        t.end_segment(&mut out);
        out
    }

    fn delim_all(data: &[u8]) -> Vec<Positioned> {
        let mut t = DelimiterTokenizer::new();
        let mut out = Vec::new();
        t.push(data, &mut out);
        t.end_segment(&mut out);
        out
    }

    fn split_run(data: &[u8], cuts: &[usize], mode: Tokenization) -> Vec<FlowEvent> {
        let mut t = FlowTokenizer::new(mode, CaseMode::Dual, true);
        let mut out = Vec::new();
        let mut prev = 0;
        let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (data.len() + 1)).collect();
        cuts.sort_unstable();
        for c in cuts {
            t.push(&data[prev..c], &mut out);
            prev = c;
        }
        t.push(&data[prev..], &mut out);
        t.finish(&mut out);
        out
    }

    /// Reference: boundary per the definition, computed over the whole segment.
    fn delim_reference(data: &[u8]) -> Vec<Positioned> {
        let boundary = |p: usize| {
            p == 0
                || p == data.len()
                || is_delimiter(data[p - 1])
                || data.get(p).copied().is_some_and(is_delimiter)
        };
        (0..data.len().saturating_sub(7))
            .filter(|&o| boundary(o) || boundary(o + 8))
            .map(|o| Positioned {
                offset: o as u64,
                token: token_at(data, o).unwrap(),
            })
            .collect()
    }

    #[test]
    fn window_example_from_paper() {
        let toks = window_all(b"alice apple");
        let words: Vec<&[u8]> = toks.iter().map(|p| &p.token[..]).collect();
        assert_eq!(
            words,
            vec![&b"alice ap"[..], b"lice app", b"ice appl", b"ce apple"]
        );
    }

    #[test]
    fn delimiter_tokens_start_or_end_on_boundaries() {
        let toks = delim_all(b"login.php?user=alice");
        let words: Vec<&[u8]> = toks.iter().map(|p| &p.token[..]).collect();
        // "login.ph" starts at 0, "gin.php?" ends before '?', "er=alice" ends at the end.
        for w in [
            &b"login.ph"[..],
            b"ogin.php",
            b"gin.php?",
            b"php?user",
            b"hp?user=",
            b"er=alice",
        ] {
            assert!(
                words.contains(&w),
                "{:?} missing",
                String::from_utf8_lossy(w)
            );
        }
        assert!(
            !words.contains(&&b"n.php?us"[..]),
            "starts and ends inside words"
        );
        // A token strictly inside a word on both ends is absent.
        let mid = delim_all(b"abcdefghijklmnop");
        assert_eq!(
            mid.len(),
            2,
            "only the first and the last token of a long word"
        );
        assert_eq!(
            delim_all(b"login.php?user=alice"),
            delim_reference(b"login.php?user=alice")
        );
    }

    proptest! {
        #[test]
        fn window_is_split_invariant(data in proptest::collection::vec(any::<u8>(), 0..300),
                                     cuts in proptest::collection::vec(any::<usize>(), 0..8)) {
            let whole = split_run(&data, &[], Tokenization::Window);
            let split = split_run(&data, &cuts, Tokenization::Window);
            prop_assert_eq!(whole, split);
        }

        #[test]
        fn delimiter_is_split_invariant(data in proptest::collection::vec(
                                            prop_oneof![Just(b' '), Just(b'.'), Just(b'a'), Just(b'B'), any::<u8>()], 0..300),
                                        cuts in proptest::collection::vec(any::<usize>(), 0..8)) {
            let whole = split_run(&data, &[], Tokenization::Delimiter);
            let split = split_run(&data, &cuts, Tokenization::Delimiter);
            prop_assert_eq!(whole, split);
        }

        #[test]
        fn window_gives_every_offset(data in proptest::collection::vec(any::<u8>(), 0..200)) {
            let toks = window_all(&data);
            prop_assert_eq!(toks.len(), data.len().saturating_sub(7));
            for (i, p) in toks.iter().enumerate() {
                prop_assert_eq!(p.offset, i as u64);
                prop_assert_eq!(&p.token[..], &data[i..i + 8]);
            }
        }

        #[test]
        fn delimiter_matches_reference(data in proptest::collection::vec(
                                           prop_oneof![Just(b' '), Just(b'/'), Just(b'x'), Just(b'Y'), any::<u8>()], 0..200),
                                       cuts in proptest::collection::vec(any::<usize>(), 0..6)) {
            let mut t = DelimiterTokenizer::new();
            let mut out = Vec::new();
            let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (data.len() + 1)).collect();
            cuts.sort_unstable();
            let mut prev = 0;
            for c in cuts { t.push(&data[prev..c], &mut out); prev = c; }
            t.push(&data[prev..], &mut out);
            t.end_segment(&mut out);
            prop_assert_eq!(out, delim_reference(&data));
        }

        #[test]
        fn delimiter_is_subset_of_window(data in proptest::collection::vec(any::<u8>(), 0..200)) {
            let w = window_all(&data);
            for p in delim_all(&data) {
                prop_assert!(w.contains(&p));
            }
        }
    }

    #[test]
    fn tokens_never_span_a_skipped_body() {
        let msg =
            b"HTTP/1.1 200 OK\r\nContent-Type: image/gif\r\nContent-Length: 12\r\n\r\nSECRETSECRET";
        let out = split_run(msg, &[5, 40], Tokenization::Window);
        let body_start = (msg.len() - 12) as u64;
        for ev in out {
            if let FlowEvent::Token { offset, .. } = ev {
                assert!(
                    offset + 8 <= body_start,
                    "token at {offset} reaches into the image body"
                );
            }
        }
    }

    #[test]
    fn dual_lane_folds_case() {
        let mut t = FlowTokenizer::new(Tokenization::Window, CaseMode::Dual, false);
        let mut out = Vec::new();
        t.push(b"ABCDEFGH", &mut out);
        t.finish(&mut out);
        assert_eq!(
            out,
            vec![
                FlowEvent::MessageStart(0),
                FlowEvent::Token {
                    offset: 0,
                    lane: Lane::Exact,
                    token: *b"ABCDEFGH"
                },
                FlowEvent::Token {
                    offset: 0,
                    lane: Lane::Folded,
                    token: *b"abcdefgh"
                },
            ]
        );
    }
}
