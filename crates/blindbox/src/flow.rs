//! One direction of a BlindBox connection: sender, middlebox and receiver as sans-I/O objects.
//!
//! Two byte streams run side by side: the *primary* stream (the TLS session's records, protected
//! by `k_ssl`; after the handshake it is sealed and opened with `mbx-record` using the keys the
//! engine exported) and the *token channel* ([`crate::channel`]).
//!
//! * [`FlowSender`]: plaintext → TLS records + token frames.
//! * [`MiddleboxFlow`]: forwards both streams unchanged while detecting; `alert` rules report,
//!   `drop`/`reject`/`sdrop` rules stop all forwarding of the flow. Under probable cause, a trigger
//!   hit recovers the flow key from `c2`, opens the sealed traffic secrets, decrypts the primary
//!   stream with a [`RecordOpener`] and runs the full Protocol III rules ([`crate::fullrule`]).
//! * [`FlowReceiver`]: decrypts the primary stream, re-tokenizes and re-encrypts the plaintext and
//!   compares with the token messages received (paper §3.4). A mismatch is a fatal
//!   [`ValidationError`] naming the culprit: frames with valid tags that do not match the plaintext
//!   were sent so by the **sender**; frames whose tag fails, missing frames (sequence numbers are
//!   inside the tag) and a channel cut before its End frame were changed on the **path** (the
//!   middlebox or the network).
//!
//! Sealed secrets (Protocol III): the SealedSecrets frame body is `start_offset: u64 | sealed`,
//! where `start_offset` (in clear: it only says how long the handshake was) is the primary-stream
//! byte offset of the first record under the exported keys and `sealed` is
//! [`seal_secrets`]`(flow_key, version u8 | suite u16 | next_seq u64 | key_len u8 | key | iv_len u8
//! | iv)`. The receiver opens it with its own copy of the flow key and checks it against its own
//! keys, so a sender cannot hand the middlebox wrong secrets.

use std::collections::VecDeque;
use std::sync::Arc;

use mbx_engine::ExportedSession;
use mbx_record::{CipherSuite, ContentType, RecordOpener, RecordSealer, TlsVersion, TrafficKeys};
use mbx_wire::{DeframerConfig, RecordReader};
use zeroize::Zeroizing;

use crate::channel::{
    frame_msgs, ChannelError, ChannelParams, ChannelWriter, Deframer, Frame, FrameAuth, Privacy,
    RawFrame,
};
use crate::detect::{Alert, DetectError, Detector, EncryptedRules, Event};
use crate::dpienc::{
    open_secrets, seal_secrets, DpiEncError, FlowKey, SaltScheme, TokenEncryptor, TokenMsg,
};
use crate::fullrule::{FullAlert, FullRuleSet};
use crate::http::{FrameEvent, HttpFramer};
use crate::keys::SessionKeys;
use crate::rules::Direction;
use crate::sender::Sender;
use crate::tokenize::{CaseMode, FlowTokenizer, Tokenization};

/// What the endpoints agree on for a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlowConfig {
    pub tokenization: Tokenization,
    pub case: CaseMode,
    pub privacy: Privacy,
    /// Salt reset period P in bytes of stream.
    pub period: u64,
    /// Frame as HTTP/1.1 (skip non-text bodies).
    pub http: bool,
}

impl FlowConfig {
    fn params(&self, direction: Direction) -> ChannelParams {
        ChannelParams {
            tokenization: self.tokenization,
            case: self.case,
            privacy: self.privacy,
            direction,
        }
    }

    fn pipeline(&self, keys: &SessionKeys, dir: Direction) -> Sender {
        let dk = keys.direction(dir);
        let enc = match self.privacy {
            Privacy::ExactMatch => TokenEncryptor::new(keys.token_key(), dk.salt0, self.period),
            Privacy::ProbableCause => TokenEncryptor::with_flow_key(
                keys.token_key(),
                dk.salt0,
                self.period,
                dk.flow_key(),
            ),
        };
        Sender::new(
            FlowTokenizer::new(self.tokenization, self.case, self.http),
            enc,
        )
    }
}

/// The primary session's protection for one direction, from the engine's export.
#[derive(Clone, Debug)]
pub struct PrimaryKeys {
    pub version: TlsVersion,
    pub suite: CipherSuite,
    pub keys: TrafficKeys,
    /// Sequence number of the first record under these keys.
    pub next_seq: u64,
    /// Byte offset of that record in this direction's primary stream.
    pub start_offset: u64,
}

impl PrimaryKeys {
    /// The sending (`tx`) or receiving side of an exported session.
    pub fn from_session(s: &ExportedSession, tx: bool, start_offset: u64) -> Self {
        let d = if tx { &s.tx } else { &s.rx };
        Self {
            version: s.version,
            suite: s.suite,
            keys: d.keys.clone(),
            next_seq: d.next_seq,
            start_offset,
        }
    }

    fn encode(&self) -> Zeroizing<Vec<u8>> {
        let mut v = Zeroizing::new(Vec::new());
        v.push(match self.version {
            TlsVersion::Tls12 => 2,
            TlsVersion::Tls13 => 3,
        });
        v.extend_from_slice(&self.suite.id.to_be_bytes());
        v.extend_from_slice(&self.next_seq.to_be_bytes());
        v.push(self.keys.key().len() as u8);
        v.extend_from_slice(self.keys.key());
        v.push(self.keys.iv().len() as u8);
        v.extend_from_slice(self.keys.iv());
        v
    }

    fn decode(b: &[u8], start_offset: u64) -> Option<Self> {
        let version = match b.first()? {
            2 => TlsVersion::Tls12,
            3 => TlsVersion::Tls13,
            _ => return None,
        };
        let suite = CipherSuite::from_id(u16::from_be_bytes(b.get(1..3)?.try_into().ok()?))?;
        let next_seq = u64::from_be_bytes(b.get(3..11)?.try_into().ok()?);
        let kl = usize::from(*b.get(11)?);
        let key = b.get(12..12 + kl)?;
        let il = usize::from(*b.get(12 + kl)?);
        let iv = b.get(13 + kl..13 + kl + il)?;
        if b.len() != 13 + kl + il || suite.version != version {
            return None;
        }
        Some(Self {
            version,
            suite,
            keys: TrafficKeys::new(suite.aead, key, iv).ok()?,
            next_seq,
            start_offset,
        })
    }

    fn same_as(&self, o: &PrimaryKeys) -> bool {
        use subtle::ConstantTimeEq;
        self.version == o.version
            && self.suite == o.suite
            && self.next_seq == o.next_seq
            && self.start_offset == o.start_offset
            && bool::from(self.keys.key().ct_eq(o.keys.key()))
            && bool::from(self.keys.iv().ct_eq(o.keys.iv()))
    }

    fn deframer_config(&self) -> DeframerConfig {
        match self.version {
            TlsVersion::Tls12 => DeframerConfig::tls12(),
            TlsVersion::Tls13 => DeframerConfig::tls13(),
        }
    }
}

/// Errors of the sender and the middlebox.
#[derive(Debug, thiserror::Error)]
pub enum FlowError {
    #[error("record layer: {0}")]
    Record(#[from] mbx_record::RecordError),
    #[error("primary stream: {0}")]
    Wire(#[from] mbx_wire::WireError),
    #[error("token channel: {0}")]
    Channel(#[from] ChannelError),
    #[error("token stream: {0}")]
    Detect(#[from] DetectError),
    #[error("sealed secrets: {0}")]
    Secrets(#[from] DpiEncError),
    #[error("sealed secrets malformed")]
    SecretsMalformed,
    #[error("flow already finished")]
    Finished,
}

/// Bytes for the two streams.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct FlowOutput {
    pub primary: Vec<u8>,
    pub tokens: Vec<u8>,
}

/// The sending endpoint of one direction.
#[derive(Debug)]
pub struct FlowSender {
    pipeline: Sender,
    writer: ChannelWriter,
    sealer: RecordSealer,
    msgs: Vec<TokenMsg>,
    finished: bool,
}

impl FlowSender {
    /// Writes the Hello (and, under probable cause, the sealed secrets) into `out.tokens`.
    pub fn new(
        cfg: &FlowConfig,
        keys: &SessionKeys,
        dir: Direction,
        primary: PrimaryKeys,
        out: &mut FlowOutput,
    ) -> Result<Self, FlowError> {
        let dk = keys.direction(dir);
        let mut writer = ChannelWriter::new(cfg.params(dir), dk.frame_auth(), &mut out.tokens);
        if cfg.privacy == Privacy::ProbableCause {
            let sealed = seal_secrets(&dk.flow_key(), &primary.encode())?;
            let mut body = primary.start_offset.to_be_bytes().to_vec();
            body.extend_from_slice(&sealed);
            writer.sealed_secrets(&body, &mut out.tokens)?;
        }
        Ok(Self {
            pipeline: cfg.pipeline(keys, dir),
            writer,
            sealer: RecordSealer::new(primary.version, primary.keys, primary.next_seq),
            msgs: Vec::new(),
            finished: false,
        })
    }

    /// Sends plaintext: TLS records into `out.primary`, its tokens into `out.tokens`.
    pub fn send(&mut self, data: &[u8], out: &mut FlowOutput) -> Result<(), FlowError> {
        if self.finished {
            return Err(FlowError::Finished);
        }
        for chunk in data.chunks(mbx_wire::record::MAX_PLAINTEXT_LEN) {
            self.sealer
                .seal(ContentType::APPLICATION_DATA, chunk, &mut out.primary)?;
        }
        self.pipeline.push(data, &mut self.msgs);
        self.emit(out)
    }

    fn emit(&mut self, out: &mut FlowOutput) -> Result<(), FlowError> {
        let pushed = self.writer.push_all(&self.msgs, &mut out.tokens);
        self.msgs.clear();
        pushed?;
        self.writer.flush(&mut out.tokens);
        Ok(())
    }

    /// Ends the direction: the last tokens, the End frame and a close_notify record.
    pub fn finish(&mut self, out: &mut FlowOutput) -> Result<(), FlowError> {
        if self.finished {
            return Ok(());
        }
        self.pipeline.finish(&mut self.msgs);
        self.emit(out)?;
        self.writer.finish(&mut out.tokens)?;
        self.sealer
            .seal(ContentType::ALERT, &[1, 0], &mut out.primary)?;
        self.finished = true;
        Ok(())
    }
}

/// Who misbehaved, according to the receiver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Culprit {
    /// Authenticated token frames that do not match the plaintext the sender sent.
    Sender,
    /// The middlebox or the network: frames changed, dropped or cut off in transit.
    Path,
}

/// What went wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Misbehaviour {
    /// Tokens the plaintext needs are missing.
    Omitted,
    /// A token's ciphertext is wrong.
    Altered,
    /// Correct tokens in the wrong order.
    Reordered,
    /// Tokens (or control messages) the plaintext does not produce.
    Forged,
    /// Hello parameters other than agreed.
    WrongParams,
    /// The sealed secrets do not open to the session's keys (or are missing).
    WrongSecrets,
    /// End frame's token count differs from the tokens sent.
    WrongCount,
    /// A frame's tag failed.
    BadTag,
    /// The channel ended without its End frame (or the primary stream without close_notify).
    Truncated,
    /// A frame with a valid tag is malformed, or the byte stream could not be framed.
    Malformed(ChannelError),
    /// The primary stream failed TLS record protection.
    Primary(String),
}

impl core::fmt::Display for Culprit {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            Culprit::Sender => "the sender",
            Culprit::Path => "the path (middlebox or network)",
        })
    }
}

impl core::fmt::Display for Misbehaviour {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Misbehaviour::Omitted => f.write_str("tokens the plaintext needs are missing"),
            Misbehaviour::Altered => f.write_str("a token's ciphertext is wrong"),
            Misbehaviour::Reordered => f.write_str("tokens arrived out of order"),
            Misbehaviour::Forged => f.write_str("tokens the plaintext does not produce"),
            Misbehaviour::WrongParams => f.write_str("hello parameters other than agreed"),
            Misbehaviour::WrongSecrets => {
                f.write_str("the sealed secrets do not open to the session's keys")
            }
            Misbehaviour::WrongCount => {
                f.write_str("the End frame's token count differs from the tokens sent")
            }
            Misbehaviour::BadTag => f.write_str("a frame's tag failed"),
            Misbehaviour::Truncated => f.write_str("the token channel ended without its End frame"),
            Misbehaviour::Malformed(e) => write!(f, "malformed token channel ({e})"),
            Misbehaviour::Primary(e) => write!(f, "the primary stream failed ({e})"),
        }
    }
}

/// Fatal validation failure (paper §3.4). Displayed as what went wrong, whom it is blamed on,
/// and the stream offset of the first wrong token when there is one.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("token validation failed: {what}; blamed on {culprit}{}", offset_text(*offset))]
pub struct ValidationError {
    pub culprit: Culprit,
    pub what: Misbehaviour,
    /// Stream offset of the first wrong token, when there is one.
    pub offset: Option<u64>,
}

fn offset_text(offset: Option<u64>) -> String {
    offset.map_or(String::new(), |o| format!(", at stream offset {o}"))
}

fn verr(culprit: Culprit, what: Misbehaviour, offset: Option<u64>) -> ValidationError {
    ValidationError {
        culprit,
        what,
        offset,
    }
}

/// Largest number of token messages waiting for their counterpart.
const MAX_LAG: usize = 1 << 24;

/// The receiving endpoint of one direction.
#[derive(Debug)]
pub struct FlowReceiver {
    params: ChannelParams,
    pipeline: Sender,
    auth: FrameAuth,
    flow_key: FlowKey,
    primary: PrimaryKeys,
    reader: RecordReader,
    opener: RecordOpener,
    deframer: Deframer,
    expected: VecDeque<TokenMsg>,
    received: VecDeque<TokenMsg>,
    scratch: Vec<TokenMsg>,
    seen_hello: bool,
    seen_secrets: bool,
    end_count: Option<u64>,
    tokens_received: u64,
    primary_closed: bool,
    failed: Option<ValidationError>,
}

impl FlowReceiver {
    pub fn new(cfg: &FlowConfig, keys: &SessionKeys, dir: Direction, primary: PrimaryKeys) -> Self {
        let dk = keys.direction(dir);
        Self {
            params: cfg.params(dir),
            pipeline: cfg.pipeline(keys, dir),
            auth: dk.frame_auth(),
            flow_key: dk.flow_key(),
            reader: RecordReader::new(primary.deframer_config()),
            opener: RecordOpener::new(primary.version, primary.keys.clone(), primary.next_seq),
            primary,
            deframer: Deframer::new(),
            expected: VecDeque::new(),
            received: VecDeque::new(),
            scratch: Vec::new(),
            seen_hello: false,
            seen_secrets: false,
            end_count: None,
            tokens_received: 0,
            primary_closed: false,
            failed: None,
        }
    }

    fn sticky<T>(&mut self, r: Result<T, ValidationError>) -> Result<T, ValidationError> {
        if let Err(e) = &r {
            self.failed.get_or_insert_with(|| e.clone());
        }
        r
    }

    /// Primary-stream bytes (after the handshake); returns the application data.
    pub fn primary_in(&mut self, data: &[u8]) -> Result<Vec<u8>, ValidationError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let r = self.primary_inner(data);
        self.sticky(r)
    }

    fn primary_inner(&mut self, data: &[u8]) -> Result<Vec<u8>, ValidationError> {
        let tls = |e: String| verr(Culprit::Path, Misbehaviour::Primary(e), None);
        self.reader.push(data);
        let mut plain = Vec::new();
        while let Some(rec) = self.reader.next_record().map_err(|e| tls(e.to_string()))? {
            if self.primary_closed {
                return Err(tls("data after close_notify".into()));
            }
            let opened = self
                .opener
                .open(rec.as_bytes())
                .map_err(|e| tls(e.to_string()))?;
            if opened.content_type == ContentType::APPLICATION_DATA {
                plain.extend_from_slice(&opened.plaintext);
            } else if opened.content_type == ContentType::ALERT
                && opened.plaintext.get(1) == Some(&0)
            {
                self.primary_closed = true;
            } else {
                return Err(tls(format!(
                    "unexpected record type {:?}",
                    opened.content_type
                )));
            }
        }
        self.pipeline.push(&plain, &mut self.scratch);
        self.expected.extend(self.scratch.drain(..));
        self.compare()?;
        Ok(plain)
    }

    /// Token-channel bytes as forwarded by the middlebox.
    pub fn tokens_in(&mut self, data: &[u8]) -> Result<(), ValidationError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let r = self.tokens_inner(data);
        self.sticky(r)
    }

    fn tokens_inner(&mut self, data: &[u8]) -> Result<(), ValidationError> {
        self.deframer.push(data);
        loop {
            let raw = match self.deframer.next_frame() {
                Ok(Some(r)) => r,
                Ok(None) => break,
                // Framing failed before a tag could be checked: the bytes were not a frame the
                // sender tagged (a sender cannot make a tagged frame unparseable here except by
                // oversize, which we also lay on the path: only the path can cut frames).
                Err(e) => return Err(verr(Culprit::Path, Misbehaviour::Malformed(e), None)),
            };
            if !self.auth.verify(&raw) {
                return Err(verr(Culprit::Path, Misbehaviour::BadTag, None));
            }
            match &raw.frame {
                Frame::Hello(p) => {
                    if *p != self.params {
                        return Err(verr(Culprit::Sender, Misbehaviour::WrongParams, None));
                    }
                    self.seen_hello = true;
                }
                Frame::SealedSecrets(body) => self.check_secrets(body)?,
                Frame::End { tokens } => self.end_count = Some(*tokens),
                f => {
                    if self.params.privacy == Privacy::ProbableCause && !self.seen_secrets {
                        return Err(verr(Culprit::Sender, Misbehaviour::WrongSecrets, None));
                    }
                    if let Frame::Tokens(b) = f {
                        self.tokens_received += b.tokens();
                    }
                    frame_msgs(f, &mut self.scratch);
                    self.received.extend(self.scratch.drain(..));
                }
            }
        }
        self.compare()
    }

    fn check_secrets(&mut self, body: &[u8]) -> Result<(), ValidationError> {
        let bad = || verr(Culprit::Sender, Misbehaviour::WrongSecrets, None);
        if self.seen_secrets {
            return Err(bad());
        }
        let start = u64::from_be_bytes(
            body.get(..8)
                .and_then(|b| b.try_into().ok())
                .ok_or_else(bad)?,
        );
        let opened =
            open_secrets(&self.flow_key, body.get(8..).unwrap_or_default()).map_err(|_| bad())?;
        let theirs = PrimaryKeys::decode(&opened, start).ok_or_else(bad)?;
        if !theirs.same_as(&self.primary) {
            return Err(bad());
        }
        self.seen_secrets = true;
        Ok(())
    }

    fn compare(&mut self) -> Result<(), ValidationError> {
        while let (Some(e), Some(r)) = (self.expected.front(), self.received.front()) {
            if e != r {
                let (what, offset) = classify_mismatch(e, r, &self.expected);
                return Err(verr(Culprit::Sender, what, offset));
            }
            self.expected.pop_front();
            self.received.pop_front();
        }
        if self.expected.len() > MAX_LAG || self.received.len() > MAX_LAG {
            // One stream is far ahead of the other; with an honest sender both advance together.
            return Err(verr(Culprit::Sender, Misbehaviour::Omitted, None));
        }
        Ok(())
    }

    /// Both streams ended: everything must have matched.
    pub fn finish(&mut self) -> Result<(), ValidationError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let r = self.finish_inner();
        self.sticky(r)
    }

    fn finish_inner(&mut self) -> Result<(), ValidationError> {
        let Some(count) = self.end_count else {
            return Err(verr(Culprit::Path, Misbehaviour::Truncated, None));
        };
        if !self.primary_closed {
            return Err(verr(Culprit::Path, Misbehaviour::Truncated, None));
        }
        self.pipeline.finish(&mut self.scratch);
        self.expected.extend(self.scratch.drain(..));
        self.compare()?;
        if let Some(e) = self.expected.front() {
            return Err(verr(Culprit::Sender, Misbehaviour::Omitted, msg_offset(e)));
        }
        if let Some(r) = self.received.front() {
            return Err(verr(Culprit::Sender, Misbehaviour::Forged, msg_offset(r)));
        }
        if count != self.tokens_received {
            return Err(verr(Culprit::Sender, Misbehaviour::WrongCount, None));
        }
        Ok(())
    }
}

fn msg_offset(m: &TokenMsg) -> Option<u64> {
    match m {
        TokenMsg::Token(t) => Some(t.offset),
        TokenMsg::MessageStart(o) => Some(*o),
        TokenMsg::Salt(_) => None,
    }
}

/// Names a mismatch between the expected message `e` and the received `r`.
fn classify_mismatch(
    e: &TokenMsg,
    r: &TokenMsg,
    expected: &VecDeque<TokenMsg>,
) -> (Misbehaviour, Option<u64>) {
    match (e, r) {
        (TokenMsg::Token(et), TokenMsg::Token(rt)) => {
            let key = |t: &crate::dpienc::EncToken| (t.offset, t.lane as u8);
            if key(et) == key(rt) {
                // Same position: a ciphertext that belongs elsewhere was moved here.
                let moved = expected
                    .iter()
                    .take(4096)
                    .any(|m| matches!(m, TokenMsg::Token(t) if t.c1 == rt.c1));
                let what = if moved {
                    Misbehaviour::Reordered
                } else {
                    Misbehaviour::Altered
                };
                (what, Some(et.offset))
            } else if key(rt) > key(et) {
                let later = expected.iter().take(4096).any(|m| m == r);
                let what = if later {
                    Misbehaviour::Omitted
                } else {
                    Misbehaviour::Altered
                };
                (what, Some(et.offset))
            } else {
                (Misbehaviour::Forged, Some(rt.offset))
            }
        }
        (TokenMsg::Token(et), _) => (Misbehaviour::Omitted, Some(et.offset)),
        (_, TokenMsg::Token(rt)) => (Misbehaviour::Forged, Some(rt.offset)),
        _ => (Misbehaviour::Altered, msg_offset(e)),
    }
}

/// What the middlebox reports for a flow.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MbEvent {
    /// A Protocol I/II rule matched on the encrypted tokens.
    Alert(Alert),
    /// A Protocol III trigger keyword occurred (the flow may now be decrypted).
    ProbableCause { sid: u32, message_start: u64 },
    /// A Protocol III rule matched on the decrypted flow.
    FullAlert(FullAlert),
    /// A blocking rule fired: nothing more of this flow is forwarded.
    Blocked { sid: u32 },
    /// Probable cause fired but the flow could not be decrypted (sealed secrets that do not
    /// open, or records that fail under them). The middlebox fails closed: the flow is blocked.
    DecryptionFailed(String),
}

/// Ciphertext kept for a later Protocol III decryption, per direction.
pub const MAX_RETAINED: usize = 16 << 20;
/// Largest HTTP message (inspected bytes) kept for full-rule evaluation.
const MAX_MESSAGE: usize = 4 << 20;

/// A decrypted message being collected: its start, its inspected segments, their total size.
type OpenMessage = (u64, Vec<(u64, Vec<u8>)>, usize);

/// Inspection state for the decrypted primary stream (Protocol III).
#[derive(Debug)]
struct Decrypted {
    opener: RecordOpener,
    framer: HttpFramer,
    /// Stream offset where the current message starts, and its inspected segments.
    message: Option<OpenMessage>,
}

/// The middlebox's view of one direction: both streams, forwarded unchanged.
pub struct MiddleboxFlow {
    rules: Arc<EncryptedRules>,
    full: Arc<FullRuleSet>,
    deframer: Deframer,
    detector: Option<Detector>,
    params: Option<ChannelParams>,
    msgs: Vec<TokenMsg>,
    events: Vec<Event>,
    blocked: bool,
    // Protocol III.
    sealed: Option<(u64, Vec<u8>)>,
    flow_key: Option<FlowKey>,
    /// Primary bytes seen so far.
    primary_seen: u64,
    /// Primary bytes from offset `pre_start` on, while `start_offset` is unknown or the key is.
    retained: Vec<u8>,
    retained_from: u64,
    retain_overflow: bool,
    reader: Option<RecordReader>,
    records_skipped: u64,
    decrypted: Option<Decrypted>,
    opens: u64,
    decrypt_failed: bool,
}

impl std::fmt::Debug for MiddleboxFlow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MiddleboxFlow")
            .field("params", &self.params)
            .field("blocked", &self.blocked)
            .field("opens", &self.opens)
            .finish_non_exhaustive()
    }
}

impl MiddleboxFlow {
    /// `rules`: the encrypted rule set (from the setup); `full`: the Protocol III rules for the
    /// decrypted flow.
    pub fn new(rules: Arc<EncryptedRules>, full: Arc<FullRuleSet>) -> Self {
        Self {
            rules,
            full,
            deframer: Deframer::without_tag_bytes(),
            detector: None,
            params: None,
            msgs: Vec::new(),
            events: Vec::new(),
            blocked: false,
            sealed: None,
            flow_key: None,
            primary_seen: 0,
            retained: Vec::new(),
            retained_from: 0,
            retain_overflow: false,
            reader: None,
            records_skipped: 0,
            decrypted: None,
            opens: 0,
            decrypt_failed: false,
        }
    }

    /// Primary records opened so far (zero unless a probable cause fired).
    pub fn records_opened(&self) -> u64 {
        self.opens
    }

    /// Whether a blocking rule stopped the flow.
    pub fn blocked(&self) -> bool {
        self.blocked
    }

    /// The parameters the sender announced.
    pub fn params(&self) -> Option<ChannelParams> {
        self.params
    }

    /// One frame of the token channel (detection; nothing is forwarded here).
    fn on_token_frame(&mut self, raw: RawFrame) -> Result<(), FlowError> {
        match raw.frame {
            Frame::Hello(p) => {
                let scheme = match p.privacy {
                    Privacy::ExactMatch => SaltScheme::ExactMatch,
                    Privacy::ProbableCause => SaltScheme::ProbableCause,
                };
                self.params = Some(p);
                if p.privacy == Privacy::ExactMatch {
                    // Nothing will ever be decrypted: keep no ciphertext.
                    self.retained = Vec::new();
                }
                self.detector = Some(Detector::new(
                    Arc::clone(&self.rules),
                    scheme,
                    Some(p.direction),
                ));
            }
            Frame::SealedSecrets(body) => {
                if self.sealed.is_none() && body.len() >= 8 {
                    let mut s = [0u8; 8];
                    s.copy_from_slice(body.get(..8).unwrap_or(&[0; 8]));
                    self.sealed = Some((
                        u64::from_be_bytes(s),
                        body.get(8..).unwrap_or_default().to_vec(),
                    ));
                    self.trim_retained();
                }
            }
            Frame::End { .. } => {}
            Frame::Salt(_) | Frame::MessageStart(_) | Frame::Tokens(_) => {
                let Some(det) = self.detector.as_mut() else {
                    return Err(ChannelError::NoHello.into());
                };
                match &raw.frame {
                    Frame::Tokens(b) => det.process_batch(b, &mut self.events)?,
                    f => {
                        frame_msgs(f, &mut self.msgs);
                        for m in self.msgs.drain(..) {
                            det.process(&m, &mut self.events)?;
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Token-channel bytes from the sender; appends what to forward to `fwd`.
    pub fn token_in(
        &mut self,
        data: &[u8],
        fwd: &mut Vec<u8>,
        events: &mut Vec<MbEvent>,
    ) -> Result<(), FlowError> {
        if self.blocked {
            return Ok(());
        }
        let mut deframer = std::mem::take(&mut self.deframer);
        let r = deframer.push_frames(data, |raw| self.on_token_frame(raw));
        self.deframer = deframer;
        r?;
        self.handle_events(events)?;
        if !self.blocked {
            fwd.extend_from_slice(data);
        }
        Ok(())
    }

    fn handle_events(&mut self, events: &mut Vec<MbEvent>) -> Result<(), FlowError> {
        for ev in std::mem::take(&mut self.events) {
            match ev {
                Event::Alert(a) => {
                    let block = a.blocks();
                    let sid = a.sid;
                    events.push(MbEvent::Alert(a));
                    if block && !self.blocked {
                        self.blocked = true;
                        events.push(MbEvent::Blocked { sid });
                    }
                }
                Event::ProbableCause(pc) => {
                    events.push(MbEvent::ProbableCause {
                        sid: pc.sid,
                        message_start: pc.message_start,
                    });
                    if self.flow_key.is_none() {
                        self.flow_key = Some(pc.flow_key);
                    }
                }
            }
        }
        self.decrypt_or_block(events);
        Ok(())
    }

    fn decrypt_or_block(&mut self, events: &mut Vec<MbEvent>) {
        if self.decrypt_failed {
            return;
        }
        if let Err(e) = self.try_decrypt(events) {
            self.decrypt_failed = true;
            self.decrypted = None;
            self.retained = Vec::new();
            events.push(MbEvent::DecryptionFailed(e.to_string()));
            self.blocked = true;
        }
    }

    /// Primary-stream bytes from the sender; appends what to forward to `fwd`.
    pub fn primary_in(
        &mut self,
        data: &[u8],
        fwd: &mut Vec<u8>,
        events: &mut Vec<MbEvent>,
    ) -> Result<(), FlowError> {
        if self.blocked {
            return Ok(());
        }
        if self.params.map(|p| p.privacy) != Some(Privacy::ExactMatch) && !self.retain_overflow {
            self.retained.extend_from_slice(data);
            self.trim_retained();
        }
        self.primary_seen += data.len() as u64;
        self.decrypt_or_block(events);
        if !self.blocked {
            fwd.extend_from_slice(data);
        }
        Ok(())
    }

    /// Drops retained bytes before the first protected record; bounds the rest.
    fn trim_retained(&mut self) {
        if let Some((start, _)) = &self.sealed {
            if self.retained_from < *start {
                let cut = (*start - self.retained_from).min(self.retained.len() as u64) as usize;
                self.retained.drain(..cut);
                self.retained_from += cut as u64;
            }
        }
        if self.params.map(|p| p.privacy) == Some(Privacy::ExactMatch) {
            self.retained = Vec::new();
        }
        if self.retained.len() > MAX_RETAINED {
            // Too much ciphertext before a trigger: a later decryption could not start at the
            // first record, so give up on it for this flow (detection on tokens goes on).
            self.retain_overflow = true;
            self.retained = Vec::new();
        }
    }

    fn try_decrypt(&mut self, events: &mut Vec<MbEvent>) -> Result<(), FlowError> {
        if self.decrypted.is_none() {
            let (Some(fk), Some((start, sealed))) = (&self.flow_key, &self.sealed) else {
                return Ok(());
            };
            if self.retain_overflow || self.retained_from != *start {
                return Ok(());
            }
            let opened = open_secrets(fk, sealed)?;
            let pk = PrimaryKeys::decode(&opened, *start).ok_or(FlowError::SecretsMalformed)?;
            self.reader = Some(RecordReader::new(pk.deframer_config()));
            self.decrypted = Some(Decrypted {
                opener: RecordOpener::new(pk.version, pk.keys, pk.next_seq),
                framer: HttpFramer::new(),
                message: None,
            });
        }
        let (Some(reader), Some(dec)) = (self.reader.as_mut(), self.decrypted.as_mut()) else {
            return Ok(());
        };
        reader.push(&self.retained);
        self.retained.clear();
        let dir = self.params.map(|p| p.direction);
        let mut found = Vec::new();
        while let Some(rec) = reader.next_record()? {
            let opened = dec.opener.open(rec.as_bytes())?;
            self.opens += 1;
            if opened.content_type != ContentType::APPLICATION_DATA {
                self.records_skipped += 1;
                continue;
            }
            inspect(dec, &opened.plaintext, &self.full, dir, &mut found);
        }
        self.report_full(found, events);
        Ok(())
    }

    fn report_full(&mut self, found: Vec<FullAlert>, events: &mut Vec<MbEvent>) {
        for f in found {
            let (sid, block) = (f.alert.sid, f.alert.blocks());
            events.push(MbEvent::FullAlert(f));
            if block && !self.blocked {
                self.blocked = true;
                events.push(MbEvent::Blocked { sid });
            }
        }
    }

    /// Both streams ended: evaluates the last decrypted message.
    pub fn finish(&mut self, events: &mut Vec<MbEvent>) {
        let dir = self.params.map(|p| p.direction);
        let mut found = Vec::new();
        if let Some(dec) = self.decrypted.as_mut() {
            if let Some((start, segs, _)) = dec.message.take() {
                eval(&self.full, start, &segs, dir, &mut found);
            }
        }
        self.report_full(found, events);
    }
}

fn eval(
    full: &FullRuleSet,
    start: u64,
    segs: &[(u64, Vec<u8>)],
    dir: Option<Direction>,
    out: &mut Vec<FullAlert>,
) {
    let view: Vec<(u64, &[u8])> = segs
        .iter()
        .map(|(o, b)| (o.saturating_sub(start), b.as_slice()))
        .collect();
    full.eval_message(start, &view, dir, out);
}

/// Feeds decrypted application data to the HTTP framer; evaluates each completed message.
fn inspect(
    dec: &mut Decrypted,
    plain: &[u8],
    full: &FullRuleSet,
    dir: Option<Direction>,
    out: &mut Vec<FullAlert>,
) {
    for ev in dec.framer.push(plain) {
        match ev {
            FrameEvent::MessageStart(o) => {
                if let Some((start, segs, _)) = dec.message.take() {
                    eval(full, start, &segs, dir, out);
                }
                dec.message = Some((o, Vec::new(), 0));
            }
            FrameEvent::Inspect { offset, range } => {
                if let (Some((_, segs, size)), Some(bytes)) =
                    (dec.message.as_mut(), plain.get(range))
                {
                    if *size + bytes.len() > MAX_MESSAGE {
                        continue;
                    }
                    *size += bytes.len();
                    // Join with the previous segment when contiguous (a record boundary).
                    match segs.last_mut() {
                        Some((o, b)) if *o + b.len() as u64 == offset => b.extend_from_slice(bytes),
                        _ => segs.push((offset, bytes.to_vec())),
                    }
                }
            }
            FrameEvent::Skip { .. } => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_errors_read_as_sentences() {
        assert_eq!(
            verr(Culprit::Path, Misbehaviour::Truncated, None).to_string(),
            "token validation failed: the token channel ended without its End frame; \
             blamed on the path (middlebox or network)"
        );
        assert_eq!(
            verr(Culprit::Sender, Misbehaviour::Omitted, Some(1234)).to_string(),
            "token validation failed: tokens the plaintext needs are missing; blamed on the \
             sender, at stream offset 1234"
        );
    }
}
