//! Snort 2.9 rules: parser, BlindBox classifier (paper §4, §7.1 Table 1) and the positional
//! semantics shared by the encrypted detector and the plaintext oracle.
//!
//! The parser understands the options BlindBox uses (`content` with `|hex|` bytes, `nocase`,
//! `offset`, `depth`, `distance`, `within`, `fast_pattern`, `pcre`, `msg`, `sid`, `flow`). Every
//! other option is kept in [`Rule::unsupported`] with its kind, so callers can report it; none is
//! dropped silently.

use std::collections::{BTreeMap, HashSet};

/// Keywords shorter than this cannot be matched by Protocols I/II (one token is 8 bytes).
pub const MIN_KEYWORD: usize = crate::tokenize::TOKEN_LEN;

/// A parse error with its 1-based line number.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {msg}")]
pub struct RuleError {
    pub line: usize,
    pub msg: String,
}

/// Rule action (header keyword).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    Alert,
    Log,
    Pass,
    Drop,
    Reject,
    Sdrop,
    Activate,
    Dynamic,
}

impl Action {
    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "alert" => Action::Alert,
            "log" => Action::Log,
            "pass" => Action::Pass,
            "drop" => Action::Drop,
            "reject" => Action::Reject,
            "sdrop" => Action::Sdrop,
            "activate" => Action::Activate,
            "dynamic" => Action::Dynamic,
            _ => return None,
        })
    }
}

/// Direction of the flow a rule applies to (`flow:to_server` / `from_client` and the reverse).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Direction {
    ToServer,
    ToClient,
}

/// One `content` with its modifiers.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Content {
    pub pattern: Vec<u8>,
    pub negated: bool,
    pub nocase: bool,
    pub offset: Option<i64>,
    pub depth: Option<i64>,
    pub distance: Option<i64>,
    pub within: Option<i64>,
    pub fast_pattern: bool,
    /// Buffer modifier (`http_uri`, `http_header`, `file_data`, ...) if any; see [`BufferPolicy`].
    pub buffer: Option<String>,
}

impl Content {
    /// Whether the content carries positional modifiers.
    pub fn positional(&self) -> bool {
        self.offset.is_some()
            || self.depth.is_some()
            || self.distance.is_some()
            || self.within.is_some()
    }
}

/// How an option outside the supported set affects detection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum UnsupportedKind {
    /// No effect on detection (`rev`, `classtype`, `reference`, `metadata`, `gid`, `priority`).
    Metadata,
    /// Restricts where a content may match (`http_uri`, `http_header`, `file_data`, `rawbytes`, ...).
    /// BlindBox tokens do not say which HTTP field they come from, so these are approximated by the
    /// whole HTTP message (a superset) or, under [`BufferPolicy::Strict`], need Protocol III.
    Buffer,
    /// Anything else (`byte_test`, `flowbits`, `isdataat`, `dsize`, ...): needs the plaintext, so
    /// Protocol III at best.
    Detection,
}

/// An option the BlindBox detector does not evaluate itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unsupported {
    pub name: String,
    pub value: Option<String>,
    pub kind: UnsupportedKind,
}

/// A parsed rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    /// 1-based line in the source.
    pub line: usize,
    /// The rule was commented out (`# alert ...`).
    pub commented: bool,
    pub action: Action,
    pub protocol: String,
    pub src: String,
    pub src_port: String,
    pub bidirectional: bool,
    pub dst: String,
    pub dst_port: String,
    pub msg: Option<String>,
    pub sid: Option<u32>,
    pub flow: Option<Direction>,
    pub flow_flags: Vec<String>,
    pub contents: Vec<Content>,
    /// `pcre` values as written (`/re/flags` or `m<d>re<d>flags`), with a leading `!` if negated.
    pub pcre: Vec<String>,
    pub unsupported: Vec<Unsupported>,
}

impl Rule {
    /// Whether this is an HTTP rule (HTTP ports, an `http_*` buffer or `service http` metadata).
    pub fn is_http(&self) -> bool {
        let port_http = |p: &str| p.contains("HTTP_PORTS") || p == "80" || p == "8080";
        port_http(&self.src_port)
            || port_http(&self.dst_port)
            || self
                .contents
                .iter()
                .any(|c| c.buffer.as_deref().is_some_and(|b| b.starts_with("http_")))
            || self.unsupported.iter().any(|u| {
                u.name == "metadata"
                    && u.value
                        .as_deref()
                        .is_some_and(|v| v.contains("service http"))
            })
    }
}

/// A rule file after parsing.
#[derive(Debug, Default)]
pub struct RuleFile {
    pub rules: Vec<Rule>,
    pub errors: Vec<RuleError>,
    /// Comment lines that are not commented-out rules.
    pub comment_lines: usize,
}

/// Parses a rule file. `include_commented`: also parse rules commented out with a leading `#`.
pub fn parse_rules(text: &str, include_commented: bool) -> RuleFile {
    let mut file = RuleFile::default();
    let mut pending = String::new();
    let mut pending_line = 0;
    for (i, raw) in text.lines().enumerate() {
        let line_no = i + 1;
        let line = raw.trim();
        if pending.is_empty() {
            pending_line = line_no;
        }
        // Line continuation.
        if let Some(head) = line.strip_suffix('\\') {
            pending.push_str(head);
            continue;
        }
        pending.push_str(line);
        let full = std::mem::take(&mut pending);
        let full = full.trim();
        if full.is_empty() {
            continue;
        }
        let (body, commented) = match full.strip_prefix('#') {
            Some(rest) => (rest.trim_start(), true),
            None => (full, false),
        };
        let first = body.split_whitespace().next().unwrap_or_default();
        if commented && (Action::parse(first).is_none() || !body.contains('(')) {
            file.comment_lines += 1;
            continue;
        }
        if commented && !include_commented {
            continue;
        }
        match parse_rule(body, pending_line) {
            Ok(mut r) => {
                r.commented = commented;
                file.rules.push(r);
            }
            Err(e) => file.errors.push(e),
        }
    }
    file
}

/// Parses one rule (no leading `#`).
pub fn parse_rule(text: &str, line: usize) -> Result<Rule, RuleError> {
    let err = |msg: String| RuleError { line, msg };
    let open = text.find('(').ok_or_else(|| err("no option list".into()))?;
    let close = text
        .rfind(')')
        .ok_or_else(|| err("unterminated option list".into()))?;
    if close < open {
        return Err(err("unterminated option list".into()));
    }
    let header: Vec<&str> = text
        .get(..open)
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    let [action, protocol, src, src_port, dir, dst, dst_port] = header.as_slice() else {
        return Err(err(format!(
            "header has {} fields, expected 7",
            header.len()
        )));
    };
    let action = Action::parse(action).ok_or_else(|| err(format!("unknown action {action:?}")))?;
    let bidirectional = match *dir {
        "->" => false,
        "<>" => true,
        other => return Err(err(format!("bad direction {other:?}"))),
    };
    let mut rule = Rule {
        line,
        commented: false,
        action,
        protocol: protocol.to_ascii_lowercase(),
        src: src.to_string(),
        src_port: src_port.to_string(),
        bidirectional,
        dst: dst.to_string(),
        dst_port: dst_port.to_string(),
        msg: None,
        sid: None,
        flow: None,
        flow_flags: Vec::new(),
        contents: Vec::new(),
        pcre: Vec::new(),
        unsupported: Vec::new(),
    };
    let body = text.get(open + 1..close).unwrap_or_default();
    for (name, value) in split_options(body).map_err(|m| err(m.to_string()))? {
        apply_option(&mut rule, &name, value).map_err(|m| err(format!("{name}: {m}")))?;
    }
    if rule.sid.is_none() {
        return Err(err("rule without sid".into()));
    }
    Ok(rule)
}

/// Splits `name:value; name; ...` honouring quotes and backslash escapes.
fn split_options(body: &str) -> Result<Vec<(String, Option<String>)>, &'static str> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut in_quotes = false;
    let mut escaped = false;
    for ch in body.chars() {
        if escaped {
            cur.push(ch);
            escaped = false;
            continue;
        }
        match ch {
            '\\' => {
                cur.push(ch);
                escaped = true;
            }
            '"' => {
                in_quotes = !in_quotes;
                cur.push(ch);
            }
            ';' if !in_quotes => {
                push_option(&mut out, &cur)?;
                cur.clear();
            }
            _ => cur.push(ch),
        }
    }
    if in_quotes {
        return Err("unterminated quoted string");
    }
    push_option(&mut out, &cur)?;
    Ok(out)
}

fn push_option(out: &mut Vec<(String, Option<String>)>, opt: &str) -> Result<(), &'static str> {
    let opt = opt.trim();
    if opt.is_empty() {
        return Ok(());
    }
    let (name, value) = match opt.split_once(':') {
        Some((n, v)) => (n.trim(), Some(v.trim().to_string())),
        None => (opt, None),
    };
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
    {
        return Err("malformed option name");
    }
    out.push((name.to_ascii_lowercase(), value));
    Ok(())
}

fn need(value: &Option<String>) -> Result<&str, String> {
    value.as_deref().ok_or_else(|| "missing value".to_string())
}

fn int(value: &Option<String>) -> Result<Option<i64>, String> {
    let v = need(value)?;
    // byte_extract variables are names: reported as unsupported by the caller.
    match v.parse::<i64>() {
        Ok(n) if n.abs() <= 1 << 20 => Ok(Some(n)),
        Ok(_) => Err(format!("value {v} out of range")),
        Err(_) if v.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') => Ok(None),
        Err(_) => Err(format!("bad integer {v:?}")),
    }
}

fn apply_option(rule: &mut Rule, name: &str, value: Option<String>) -> Result<(), String> {
    match name {
        "msg" => rule.msg = Some(unquote(need(&value)?)?),
        "sid" => rule.sid = Some(need(&value)?.parse().map_err(|_| "bad sid".to_string())?),
        "flow" => {
            for f in need(&value)?.split(',').map(str::trim) {
                match f {
                    "to_server" | "from_client" => rule.flow = Some(Direction::ToServer),
                    "to_client" | "from_server" => rule.flow = Some(Direction::ToClient),
                    other => rule.flow_flags.push(other.to_string()),
                }
            }
        }
        "content" => {
            let v = need(&value)?;
            let (negated, v) = match v.strip_prefix('!') {
                Some(rest) => (true, rest.trim_start()),
                None => (false, v),
            };
            let pattern = decode_content(&unquote_raw(v)?)?;
            if pattern.is_empty() {
                return Err("empty content".into());
            }
            rule.contents.push(Content {
                pattern,
                negated,
                ..Content::default()
            });
        }
        "pcre" => {
            let v = need(&value)?;
            let negated = v.starts_with('!');
            let v = unquote_raw(v.strip_prefix('!').map_or(v, str::trim_start))?;
            if !(v.starts_with('/') || v.starts_with('m')) || v.len() < 2 {
                return Err("pcre without delimiters".into());
            }
            // A negated pcre keeps its `!` (see `Rule::pcre`).
            rule.pcre.push(if negated { format!("!{v}") } else { v });
        }
        "nocase" | "offset" | "depth" | "distance" | "within" | "fast_pattern" => {
            let last = rule
                .contents
                .last_mut()
                .ok_or_else(|| "modifier before any content".to_string())?;
            let numeric = match name {
                "offset" | "depth" | "distance" | "within" => Some(int(&value)?),
                _ => None,
            };
            match (name, numeric) {
                ("nocase", _) => last.nocase = true,
                ("fast_pattern", _) => last.fast_pattern = true,
                (_, Some(None)) => {
                    // A byte_extract variable: position not known before decryption.
                    rule.unsupported.push(Unsupported {
                        name: format!("{name} (variable)"),
                        value,
                        kind: UnsupportedKind::Detection,
                    });
                }
                ("offset", Some(n)) => last.offset = n,
                ("depth", Some(n)) => last.depth = n,
                ("distance", Some(n)) => last.distance = n,
                ("within", Some(n)) => last.within = n,
                _ => {}
            }
        }
        _ => {
            let kind = match name {
                "rev" | "classtype" | "reference" | "metadata" | "gid" | "priority" => {
                    UnsupportedKind::Metadata
                }
                n if n.starts_with("http_")
                    || n == "file_data"
                    || n == "rawbytes"
                    || n == "pkt_data" =>
                {
                    if let Some(last) = rule.contents.last_mut() {
                        if n.starts_with("http_") || n == "rawbytes" {
                            last.buffer = Some(n.to_string());
                        }
                    }
                    UnsupportedKind::Buffer
                }
                _ => UnsupportedKind::Detection,
            };
            rule.unsupported.push(Unsupported {
                name: name.to_string(),
                value,
                kind,
            });
        }
    }
    Ok(())
}

/// Strips the surrounding quotes of a string option (escapes kept).
fn unquote_raw(v: &str) -> Result<String, String> {
    let v = v.trim();
    let inner = v
        .strip_prefix('"')
        .and_then(|s| s.strip_suffix('"'))
        .ok_or_else(|| "value is not a quoted string".to_string())?;
    Ok(inner.to_string())
}

/// A quoted text option with `\"`, `\;`, `\\`, `\:` escapes resolved.
fn unquote(v: &str) -> Result<String, String> {
    let inner = unquote_raw(v)?;
    let mut out = String::new();
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            if let Some(n) = chars.next() {
                out.push(n);
            }
        } else {
            out.push(c);
        }
    }
    Ok(out)
}

/// Decodes a content string: `|41 42|` hex runs and backslash escapes.
pub fn decode_content(s: &str) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    let mut hex = false;
    let mut nibble: Option<u8> = None;
    let mut bytes = s.bytes();
    while let Some(b) = bytes.next() {
        if hex {
            match b {
                b'|' => {
                    if nibble.is_some() {
                        return Err("odd number of hex digits".into());
                    }
                    hex = false;
                }
                b' ' | b'\t' => {
                    if nibble.is_some() {
                        return Err("space inside a hex byte".into());
                    }
                }
                _ => {
                    let d = (b as char)
                        .to_digit(16)
                        .ok_or_else(|| format!("bad hex digit {:?}", b as char))?
                        as u8;
                    match nibble.take() {
                        Some(h) => out.push(h << 4 | d),
                        None => nibble = Some(d),
                    }
                }
            }
        } else {
            match b {
                b'|' => hex = true,
                b'\\' => out.push(
                    bytes
                        .next()
                        .ok_or_else(|| "dangling backslash".to_string())?,
                ),
                _ => out.push(b),
            }
        }
    }
    if hex {
        return Err("unterminated hex run".into());
    }
    Ok(out)
}

/// BlindBox protocol a rule needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Protocol {
    /// One keyword (>= 8 bytes) anywhere: exact match privacy.
    I,
    /// Several keywords (>= 8 bytes) with positions: exact match privacy.
    II,
    /// Needs the plaintext (pcre, short keywords, other options); a >= 8-byte keyword gives the
    /// probable cause that lets the middlebox decrypt.
    III,
    /// No >= 8-byte keyword to trigger on, or not TCP.
    NotAddressable,
}

/// How content buffer modifiers (`http_uri`, ...) are treated by the classifier.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BufferPolicy {
    /// Match the content anywhere in the HTTP message (a superset; the paper's reading).
    Approximate,
    /// A buffer modifier needs the plaintext, so Protocol III.
    Strict,
}

/// The classifier's verdict with its reasons.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Classification {
    pub protocol: Protocol,
    pub reasons: Vec<String>,
}

/// Classifies a rule (paper §7.1, Table 1 logic).
pub fn classify(rule: &Rule, policy: BufferPolicy) -> Classification {
    let mut reasons = Vec::new();
    if rule.protocol != "tcp" {
        return Classification {
            protocol: Protocol::NotAddressable,
            reasons: vec![format!(
                "protocol {} (BlindBox inspects TLS over TCP)",
                rule.protocol
            )],
        };
    }
    let long = rule
        .contents
        .iter()
        .filter(|c| !c.negated && c.pattern.len() >= MIN_KEYWORD)
        .count();
    if !rule.pcre.is_empty() {
        reasons.push("pcre".to_string());
    }
    if rule
        .contents
        .iter()
        .any(|c| !c.negated && c.pattern.len() < MIN_KEYWORD)
    {
        reasons.push("keyword shorter than 8 bytes".to_string());
    }
    if rule.contents.iter().any(|c| c.negated) {
        reasons.push("negated content".to_string());
    }
    let mut seen = HashSet::new();
    for u in &rule.unsupported {
        let blocks = match u.kind {
            UnsupportedKind::Metadata => false,
            UnsupportedKind::Buffer => policy == BufferPolicy::Strict,
            UnsupportedKind::Detection => true,
        };
        if blocks && seen.insert(u.name.clone()) {
            reasons.push(format!("option {}", u.name));
        }
    }
    let protocol = if long == 0 {
        reasons.push("no keyword of at least 8 bytes".to_string());
        Protocol::NotAddressable
    } else if !reasons.is_empty() {
        Protocol::III
    } else if rule.contents.len() == 1 && rule.contents.iter().all(|c| !c.positional()) {
        Protocol::I
    } else {
        Protocol::II
    };
    Classification { protocol, reasons }
}

/// One row of the paper's Table 1.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Table1Row {
    pub total: usize,
    pub p1: usize,
    pub p2: usize,
    pub p3: usize,
    pub none: usize,
}

impl Table1Row {
    /// Cumulative fraction addressable with Protocol I, I–II and I–III (the paper's columns).
    pub fn cumulative(&self) -> [f64; 3] {
        let t = self.total.max(1) as f64;
        [
            self.p1 as f64 / t,
            (self.p1 + self.p2) as f64 / t,
            (self.p1 + self.p2 + self.p3) as f64 / t,
        ]
    }
}

/// Table 1 statistics for a set of rules.
#[derive(Clone, Debug, Default)]
pub struct RuleStats {
    pub row: Table1Row,
    /// Why rules fell out of Protocols I/II, by reason.
    pub reasons: BTreeMap<String, usize>,
    /// Every option the detector does not evaluate, by (kind, name): number of rules using it.
    pub unsupported: BTreeMap<(UnsupportedKind, String), usize>,
}

/// Computes Table 1 (and the unsupported-option report) for `rules`.
pub fn stats<'a>(rules: impl IntoIterator<Item = &'a Rule>, policy: BufferPolicy) -> RuleStats {
    let mut s = RuleStats::default();
    for r in rules {
        let c = classify(r, policy);
        s.row.total += 1;
        match c.protocol {
            Protocol::I => s.row.p1 += 1,
            Protocol::II => s.row.p2 += 1,
            Protocol::III => s.row.p3 += 1,
            Protocol::NotAddressable => s.row.none += 1,
        }
        for reason in c.reasons {
            *s.reasons.entry(reason).or_default() += 1;
        }
        let mut names = HashSet::new();
        for u in &r.unsupported {
            if names.insert((u.kind, u.name.clone())) {
                *s.unsupported.entry((u.kind, u.name.clone())).or_default() += 1;
            }
        }
    }
    s
}

/// The paper's Table 1 for a rule file, as Markdown: every rule, the active (uncommented) ones and
/// the HTTP ones, under both buffer policies, then why rules need more than Protocol II and which
/// options the detector does not evaluate. Used by `mbx blindbox rules stats` and the docs.
pub fn table1_report(file: &RuleFile) -> String {
    use std::fmt::Write as _;
    fn pct(n: usize, total: usize) -> String {
        format!("{:.1}%", 100.0 * n as f64 / total.max(1) as f64)
    }
    let all: Vec<&Rule> = file.rules.iter().collect();
    let active: Vec<&Rule> = file.rules.iter().filter(|r| !r.commented).collect();
    let http: Vec<&Rule> = file.rules.iter().filter(|r| r.is_http()).collect();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| rule set | rules | I | I-II | I-III | not addressable |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|");
    for policy in [BufferPolicy::Approximate, BufferPolicy::Strict] {
        for (name, set) in [("all", &all), ("active", &active), ("HTTP", &http)] {
            let r = stats(set.iter().copied(), policy).row;
            let _ = writeln!(
                out,
                "| {name}, {policy:?} | {} | {} | {} | {} | {} |",
                r.total,
                pct(r.p1, r.total),
                pct(r.p1 + r.p2, r.total),
                pct(r.p1 + r.p2 + r.p3, r.total),
                pct(r.none, r.total)
            );
        }
    }
    let s = stats(http.iter().copied(), BufferPolicy::Approximate);
    let _ = writeln!(out, "\nWhy HTTP rules need more than Protocol II (Approximate; a rule may have several reasons):\n");
    let _ = writeln!(out, "| reason | rules |\n|---|---|");
    for (reason, n) in &s.reasons {
        let _ = writeln!(out, "| {reason} | {n} |");
    }
    let s = stats(all.iter().copied(), BufferPolicy::Approximate);
    let _ = writeln!(
        out,
        "\nOptions the detector does not evaluate (all rules):\n"
    );
    let _ = writeln!(out, "| option | kind | rules |\n|---|---|---|");
    for ((kind, name), n) in &s.unsupported {
        let _ = writeln!(out, "| {name} | {kind:?} | {n} |");
    }
    out
}

/// Occurrences of one content kept per HTTP message (by both matchers, first ones first); bounds the
/// positional search on hostile input.
pub const MAX_OCCURRENCES: usize = 64;

/// A content as the matchers see it: bytes, case and position constraints.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MatchContent {
    pub pattern: Vec<u8>,
    pub nocase: bool,
    pub offset: Option<i64>,
    pub depth: Option<i64>,
    pub distance: Option<i64>,
    pub within: Option<i64>,
}

/// A Protocol I/II rule reduced to what exact matching needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MatchRule {
    pub sid: u32,
    pub action: Action,
    pub flow: Option<Direction>,
    pub contents: Vec<MatchContent>,
}

impl MatchRule {
    /// The rule's exact-match part, if it is a Protocol I/II rule under `policy`.
    pub fn from_rule(rule: &Rule, policy: BufferPolicy) -> Option<Self> {
        let p = classify(rule, policy).protocol;
        if !matches!(p, Protocol::I | Protocol::II) {
            return None;
        }
        Some(Self {
            sid: rule.sid.unwrap_or_default(),
            action: rule.action,
            flow: rule.flow,
            contents: rule
                .contents
                .iter()
                .map(|c| MatchContent {
                    pattern: c.pattern.clone(),
                    nocase: c.nocase,
                    offset: c.offset,
                    depth: c.depth,
                    distance: c.distance,
                    within: c.within,
                })
                .collect(),
        })
    }

    /// Whether the rule applies to a flow in direction `dir` (`None`: direction unknown, apply).
    pub fn applies(&self, dir: Option<Direction>) -> bool {
        match (self.flow, dir) {
            (Some(want), Some(have)) => want == have,
            _ => true,
        }
    }

    /// Snort's positional semantics over the keyword occurrences of one HTTP message.
    ///
    /// `occ[j]`: sorted start positions of content `j`, relative to the message start. Content `j`
    /// with neither `distance` nor `within` must lie in `[offset, offset + depth)`; a relative one
    /// must lie in `[e + distance, e + distance + within)` where `e` is the end of the match chosen
    /// for content `j - 1` (0 for the first content). Contents are matched in rule order with
    /// backtracking, as Snort does.
    pub fn satisfied(&self, occ: &[Vec<u64>]) -> bool {
        self.satisfied_in(occ)
    }

    /// [`Self::satisfied`] over borrowed position lists (the detector's hot path: no copies).
    pub fn satisfied_slices(&self, occ: &[&[u64]]) -> bool {
        self.satisfied_in(occ)
    }

    #[inline]
    fn satisfied_in<O: AsRef<[u64]>>(&self, occ: &[O]) -> bool {
        if let ([c], [positions]) = (self.contents.as_slice(), occ) {
            // One content: no backtracking, no memo table.
            let (lo, hi_end, len) = Self::window(c, 0);
            return positions
                .as_ref()
                .iter()
                .any(|&p| Self::fits(p, lo, hi_end, len));
        }
        let mut failed = HashSet::new();
        self.search(0, 0, occ, &mut failed)
    }

    /// Where content `c` may start and end, after a previous match ending at `prev_end`:
    /// `(lowest start, highest end, length)`.
    fn window(c: &MatchContent, prev_end: i64) -> (i64, Option<i64>, i64) {
        // Positions come from the network: saturate instead of overflowing.
        let len = i64::try_from(c.pattern.len()).unwrap_or(i64::MAX);
        let relative = c.distance.is_some() || c.within.is_some();
        let (lo, hi_end) = if relative {
            let lo = prev_end.saturating_add(c.distance.unwrap_or(0));
            (lo, c.within.map(|w| lo.saturating_add(w)))
        } else {
            let lo = c.offset.unwrap_or(0);
            (lo, c.depth.map(|d| lo.max(0).saturating_add(d)))
        };
        (lo.max(0), hi_end, len)
    }

    fn pos(p: u64) -> i64 {
        i64::try_from(p).unwrap_or(i64::MAX)
    }

    fn fits(p: u64, lo: i64, hi_end: Option<i64>, len: i64) -> bool {
        let start = Self::pos(p);
        start >= lo && hi_end.is_none_or(|h| start.saturating_add(len) <= h)
    }

    fn search<O: AsRef<[u64]>>(
        &self,
        j: usize,
        prev_end: i64,
        occ: &[O],
        failed: &mut HashSet<(usize, i64)>,
    ) -> bool {
        let Some(c) = self.contents.get(j) else {
            return true;
        };
        if failed.contains(&(j, prev_end)) {
            return false;
        }
        let (lo, hi_end, len) = Self::window(c, prev_end);
        let pos = Self::pos;
        let positions = occ.get(j).map(AsRef::as_ref).unwrap_or_default();
        let first = positions.partition_point(|&p| pos(p) < lo);
        for &p in positions.get(first..).unwrap_or_default() {
            let end = pos(p).saturating_add(len);
            if hi_end.is_some_and(|h| end > h) {
                break;
            }
            if self.search(j + 1, end, occ, failed) {
                return true;
            }
        }
        failed.insert((j, prev_end));
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = r#"alert tcp $EXTERNAL_NET $HTTP_PORTS -> $HOME_NET 1025:5000 (msg:"nginx \"x\"; y"; flow: established,from_server; content: "Server|3a| nginx/0."; offset: 17; depth: 19; content: "Content-Type|3a| text/html"; content: "|3a|80|3b|255.255.255.255"; sid:2003296; rev:1;)"#;

    #[test]
    fn parses_the_papers_example() {
        let r = parse_rule(EXAMPLE, 1).unwrap();
        assert_eq!(r.sid, Some(2003296));
        assert_eq!(r.msg.as_deref(), Some("nginx \"x\"; y"));
        assert_eq!(r.flow, Some(Direction::ToClient));
        assert_eq!(r.flow_flags, vec!["established"]);
        assert_eq!(r.contents.len(), 3);
        assert_eq!(r.contents[0].pattern, b"Server: nginx/0.");
        assert_eq!(
            (r.contents[0].offset, r.contents[0].depth),
            (Some(17), Some(19))
        );
        assert_eq!(r.contents[2].pattern, b":80;255.255.255.255");
        assert_eq!(
            r.unsupported,
            vec![Unsupported {
                name: "rev".into(),
                value: Some("1".into()),
                kind: UnsupportedKind::Metadata
            }]
        );
        assert_eq!(classify(&r, BufferPolicy::Strict).protocol, Protocol::II);
    }

    #[test]
    fn classification() {
        let p = |s: &str| classify(&parse_rule(s, 1).unwrap(), BufferPolicy::Approximate);
        assert_eq!(
            p(r#"alert tcp any any -> any any (content:"longkeyword"; sid:1;)"#).protocol,
            Protocol::I
        );
        assert_eq!(
            p(r#"alert tcp any any -> any any (content:"longkeyword"; depth:20; sid:1;)"#).protocol,
            Protocol::II
        );
        let c = p(r#"alert tcp any any -> any any (content:"longkeyword"; content:"ab"; sid:1;)"#);
        assert_eq!(c.protocol, Protocol::III);
        assert_eq!(c.reasons, vec!["keyword shorter than 8 bytes"]);
        assert_eq!(
            p(r#"alert tcp any any -> any any (content:"longkeyword"; pcre:"/a+/i"; sid:1;)"#)
                .protocol,
            Protocol::III
        );
        assert_eq!(
            p(r#"alert tcp any any -> any any (content:"short"; pcre:"/a+/i"; sid:1;)"#).protocol,
            Protocol::NotAddressable
        );
        assert_eq!(
            p(r#"alert udp any any -> any any (content:"longkeyword"; sid:1;)"#).protocol,
            Protocol::NotAddressable
        );
        let b = r#"alert tcp any any -> any any (content:"longkeyword"; http_uri; sid:1;)"#;
        assert_eq!(p(b).protocol, Protocol::I);
        assert_eq!(
            classify(&parse_rule(b, 1).unwrap(), BufferPolicy::Strict).protocol,
            Protocol::III
        );
        let d =
            p(r#"alert tcp any any -> any any (content:"longkeyword"; byte_test:1,>,2,0; sid:1;)"#);
        assert_eq!(
            (d.protocol, d.reasons),
            (Protocol::III, vec!["option byte_test".to_string()])
        );
    }

    #[test]
    fn unknown_options_are_reported_not_ignored() {
        let r = parse_rule(
            r#"alert tcp any any -> any any (content:"longkeyword"; frobnicate:3; sid:1;)"#,
            7,
        )
        .unwrap();
        assert_eq!(r.unsupported[0].name, "frobnicate");
        assert_eq!(r.unsupported[0].kind, UnsupportedKind::Detection);
        let s = stats([&r], BufferPolicy::Approximate);
        assert_eq!(
            s.unsupported
                .get(&(UnsupportedKind::Detection, "frobnicate".into())),
            Some(&1)
        );
        assert_eq!(s.row.p3, 1);
    }

    #[test]
    fn parse_errors() {
        for bad in [
            r#"alert tcp any any -> any any (content:"abc|4"; sid:1;)"#,
            r#"alert tcp any any -> any any (content:"abc; sid:1;)"#,
            r#"alert tcp any any any any (content:"abc"; sid:1;)"#,
            r#"alert tcp any any -> any any (nocase; content:"abc"; sid:1;)"#,
            r#"alert tcp any any -> any any (content:"abc";)"#,
            r#"frob tcp any any -> any any (content:"abc"; sid:1;)"#,
        ] {
            assert!(parse_rule(bad, 1).is_err(), "{bad}");
        }
    }

    #[test]
    fn positional_semantics() {
        let r = MatchRule {
            sid: 1,
            action: Action::Alert,
            flow: None,
            contents: vec![
                MatchContent {
                    pattern: b"AAAAAAAA".to_vec(),
                    nocase: false,
                    offset: Some(2),
                    depth: Some(10),
                    distance: None,
                    within: None,
                },
                MatchContent {
                    pattern: b"BBBBBBBB".to_vec(),
                    nocase: false,
                    offset: None,
                    depth: None,
                    distance: Some(1),
                    within: Some(9),
                },
            ],
        };
        assert!(r.satisfied(&[vec![2], vec![11]]));
        assert!(!r.satisfied(&[vec![1], vec![10]]), "before offset");
        assert!(!r.satisfied(&[vec![5], vec![14]]), "past depth");
        assert!(!r.satisfied(&[vec![2], vec![10]]), "distance");
        assert!(
            r.satisfied(&[vec![2], vec![12]]),
            "ends exactly at the within limit"
        );
        assert!(!r.satisfied(&[vec![2], vec![13]]), "within");
        assert!(
            r.satisfied(&[vec![2, 4], vec![13]]),
            "needs backtracking to the second A"
        );
        assert!(!r.satisfied(&[vec![2], vec![13]]));
    }
}
