//! The token channel's wire format: a sans-I/O codec for one direction of a flow.
//!
//! The token channel runs beside the primary TLS session (its own byte stream). Every frame is
//!
//! ```text
//! kind: u8 | body_len: u24 (big-endian) | body | tag: [u8; 16]
//! ```
//!
//! `tag` = HMAC-SHA256(`k_auth`, `"mbx-blindbox frame v1" ‖ seq_u64 ‖ kind ‖ body_len ‖ body`)
//! truncated to 16 bytes, where `seq` counts frames from 0 in this direction and `k_auth` is
//! exported from the primary session ([`crate::keys`]). The middlebox cannot compute tags (it has
//! no `k_auth`) and does not need to: it reads the frames and forwards the bytes unchanged. The
//! receiver checks every tag, so a frame the path changed, dropped, replayed or reordered is told
//! apart from tokens the *sender* got wrong (those carry valid tags): that is how validation
//! names the misbehaving peer.
//!
//! Frames (bodies; integers big-endian):
//! * `1 Hello`: `"MBXB" | version 1 | tokenization (0 window, 1 delimiter) | case (0 exact,
//!   1 dual) | privacy (0 exact match, 1 probable cause) | direction (0 to server, 1 to client)`.
//!   Always the first frame.
//! * `2 Salt`: `salt0: u64`.
//! * `3 MessageStart`: `offset: u64`.
//! * `4 Tokens`: `first_offset: u64 | count: u32 | positions`. A position is `lanes` entries
//!   (1, or 2 with dual case: exact then folded), each `c1[5]` and, under probable cause,
//!   `c2[16]`. Window mode: position `i` is at `first_offset + i` (no offsets on the wire; a gap
//!   starts a new frame). Delimiter mode: each position after the first is preceded by its offset
//!   delta from the previous position as a LEB128 varint (≥ 1, at most 9 bytes).
//! * `5 SealedSecrets`: the primary session's traffic secrets for this direction sealed under
//!   the flow key (Protocol III only; see [`crate::flow`]). At most [`MAX_SEALED`] bytes.
//! * `6 End`: `token_count: u64`, the number of tokens (entries) sent; nothing may follow.
//!
//! Limits: a body is at most [`MAX_BODY`] bytes, a batch at most [`MAX_BATCH`] positions, and the
//! deframer never buffers more than one frame. Every error is sticky (after a bad frame nothing
//! more is returned) and nothing here panics on any input.

use aws_lc_rs::hmac;

use crate::dpienc::{EncToken, TokenMsg, C1, C1_LEN};
use crate::rules::Direction;
use crate::tokenize::{CaseMode, Lane, Tokenization};

/// Largest frame body.
pub const MAX_BODY: usize = 1 << 20;
/// Largest number of positions in one token frame.
pub const MAX_BATCH: u32 = 16_384;
/// Largest sealed-secrets body.
pub const MAX_SEALED: usize = 1024;
/// Frame header: kind and 24-bit length.
pub const HEADER_LEN: usize = 4;
/// Truncated HMAC tag.
pub const TAG_LEN: usize = 16;
const MAGIC: &[u8; 4] = b"MBXB";
const VERSION: u8 = 1;
const TAG_DOMAIN: &[u8] = b"mbx-blindbox frame v1";

const KIND_HELLO: u8 = 1;
const KIND_SALT: u8 = 2;
const KIND_MESSAGE_START: u8 = 3;
const KIND_TOKENS: u8 = 4;
const KIND_SEALED: u8 = 5;
const KIND_END: u8 = 6;

/// Malformed token-channel input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChannelError {
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
    #[error("frame body of {0} bytes exceeds the limit")]
    TooLong(usize),
    #[error("malformed {0} frame")]
    Malformed(&'static str),
    #[error("first frame is not Hello")]
    NoHello,
    #[error("second Hello")]
    DuplicateHello,
    #[error("frame after End")]
    AfterEnd,
    #[error("unsupported channel version {0}")]
    Version(u8),
    #[error("token offsets go backwards or overflow")]
    Offsets,
    #[error("an earlier frame was malformed")]
    Poisoned,
    #[error("the token stream does not fit the channel parameters: {0}")]
    Encode(&'static str),
}

/// Exact match (Protocols I/II) or probable cause (Protocol III): chosen by the endpoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Privacy {
    ExactMatch,
    ProbableCause,
}

/// What both endpoints agreed on; the middlebox learns it from the Hello frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ChannelParams {
    pub tokenization: Tokenization,
    pub case: CaseMode,
    pub privacy: Privacy,
    pub direction: Direction,
}

impl ChannelParams {
    /// Entries per position.
    pub fn lanes(&self) -> usize {
        match self.case {
            CaseMode::Exact => 1,
            CaseMode::Dual => 2,
        }
    }

    /// Bytes per entry.
    pub fn entry_len(&self) -> usize {
        match self.privacy {
            Privacy::ExactMatch => C1_LEN,
            Privacy::ProbableCause => C1_LEN + 16,
        }
    }

    fn encode(&self) -> [u8; 9] {
        let mut b = [0u8; 9];
        b[..4].copy_from_slice(MAGIC);
        b[4] = VERSION;
        b[5] = matches!(self.tokenization, Tokenization::Delimiter) as u8;
        b[6] = matches!(self.case, CaseMode::Dual) as u8;
        b[7] = matches!(self.privacy, Privacy::ProbableCause) as u8;
        b[8] = matches!(self.direction, Direction::ToClient) as u8;
        b
    }

    fn decode(body: &[u8]) -> Result<Self, ChannelError> {
        let [m0, m1, m2, m3, v, t, c, p, d] = body else {
            return Err(ChannelError::Malformed("Hello"));
        };
        if [*m0, *m1, *m2, *m3] != *MAGIC {
            return Err(ChannelError::Malformed("Hello"));
        }
        if *v != VERSION {
            return Err(ChannelError::Version(*v));
        }
        let bit = |x: u8| match x {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(ChannelError::Malformed("Hello")),
        };
        Ok(Self {
            tokenization: if bit(*t)? {
                Tokenization::Delimiter
            } else {
                Tokenization::Window
            },
            case: if bit(*c)? {
                CaseMode::Dual
            } else {
                CaseMode::Exact
            },
            privacy: if bit(*p)? {
                Privacy::ProbableCause
            } else {
                Privacy::ExactMatch
            },
            direction: if bit(*d)? {
                Direction::ToClient
            } else {
                Direction::ToServer
            },
        })
    }
}

/// A decoded batch of tokens; the entries stay in their wire form until iterated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenBatch {
    first_offset: u64,
    count: u32,
    lanes: usize,
    entry_len: usize,
    delimiter: bool,
    /// Positions as on the wire (after `first_offset` and `count`).
    data: Vec<u8>,
}

impl TokenBatch {
    /// Number of positions.
    pub fn positions(&self) -> u32 {
        self.count
    }

    /// Number of tokens (positions × lanes).
    pub fn tokens(&self) -> u64 {
        u64::from(self.count) * self.lanes as u64
    }

    /// Calls `f` with every token in order. The batch was validated when decoded.
    pub fn for_each(&self, mut f: impl FnMut(EncToken)) {
        let mut pos = 0usize;
        let mut offset = self.first_offset;
        for i in 0..self.count {
            if i > 0 {
                if self.delimiter {
                    let Some((delta, used)) = read_varint(self.data.get(pos..).unwrap_or_default())
                    else {
                        return;
                    };
                    pos += used;
                    offset = offset.wrapping_add(delta);
                } else {
                    offset = offset.wrapping_add(1);
                }
            }
            for lane in 0..self.lanes {
                let Some(e) = self.data.get(pos..pos + self.entry_len) else {
                    return;
                };
                pos += self.entry_len;
                let mut c1: C1 = [0; C1_LEN];
                c1.copy_from_slice(e.get(..C1_LEN).unwrap_or(&[0; C1_LEN]));
                let c2 = e.get(C1_LEN..C1_LEN + 16).map(|b| {
                    let mut c = [0u8; 16];
                    c.copy_from_slice(b);
                    c
                });
                f(EncToken {
                    offset,
                    lane: if lane == 0 { Lane::Exact } else { Lane::Folded },
                    c1,
                    c2,
                });
            }
        }
    }

    /// Offset of the first position.
    pub fn first_offset(&self) -> u64 {
        self.first_offset
    }

    /// Window mode: all entries as one slice of `entry_len`-byte entries, `lanes` per position
    /// (entry `i` is at `first_offset + i / lanes`, lane `i % lanes`); `None` in delimiter mode.
    pub(crate) fn window_entries(&self) -> Option<(&[u8], usize, usize)> {
        (!self.delimiter).then_some((self.data.as_slice(), self.entry_len, self.lanes))
    }

    /// Whether entries carry `c2` (probable cause).
    pub fn has_c2(&self) -> bool {
        self.entry_len > C1_LEN
    }

    /// Splits one wire entry into `c1` and `c2`.
    #[inline]
    fn split_entry(e: &[u8]) -> Option<(&C1, Option<&[u8; 16]>)> {
        let c1: &C1 = e.get(..C1_LEN)?.try_into().ok()?;
        let c2 = e.get(C1_LEN..C1_LEN + 16).and_then(|b| b.try_into().ok());
        Some((c1, c2))
    }

    /// Calls `f(offset, lane, c1, c2)` for every entry without copying it out: the middlebox's
    /// hot path (window mode is a plain walk over fixed-size entries).
    #[inline]
    pub fn for_each_entry(&self, mut f: impl FnMut(u64, Lane, &C1, Option<&[u8; 16]>)) {
        let lane_of = |i: usize| if i == 0 { Lane::Exact } else { Lane::Folded };
        if !self.delimiter {
            let per_pos = self.lanes * self.entry_len;
            for (i, pos) in self.data.chunks_exact(per_pos).enumerate() {
                let offset = self.first_offset.wrapping_add(i as u64);
                for (lane, e) in pos.chunks_exact(self.entry_len).enumerate() {
                    if let Some((c1, c2)) = Self::split_entry(e) {
                        f(offset, lane_of(lane), c1, c2);
                    }
                }
            }
            return;
        }
        let mut pos = 0usize;
        let mut offset = self.first_offset;
        for i in 0..self.count {
            if i > 0 {
                let Some((delta, used)) = read_varint(self.data.get(pos..).unwrap_or_default())
                else {
                    return;
                };
                pos += used;
                offset = offset.wrapping_add(delta);
            }
            for lane in 0..self.lanes {
                let Some((c1, c2)) = self
                    .data
                    .get(pos..pos + self.entry_len)
                    .and_then(Self::split_entry)
                else {
                    return;
                };
                pos += self.entry_len;
                f(offset, lane_of(lane), c1, c2);
            }
        }
    }

    /// The tokens as [`TokenMsg`]s (allocates; the middlebox's hot path uses [`Self::for_each`]).
    pub fn to_msgs(&self) -> Vec<TokenMsg> {
        let mut v = Vec::with_capacity(self.tokens() as usize);
        self.for_each(|t| v.push(TokenMsg::Token(t)));
        v
    }

    /// Offset of the last position.
    pub fn last_offset(&self) -> u64 {
        let mut last = self.first_offset;
        self.for_each(|t| last = t.offset);
        last
    }

    fn decode(body: &[u8], params: &ChannelParams) -> Result<Self, ChannelError> {
        const BAD: ChannelError = ChannelError::Malformed("Tokens");
        let first_offset =
            u64::from_be_bytes(body.get(..8).and_then(|b| b.try_into().ok()).ok_or(BAD)?);
        let count = u32::from_be_bytes(body.get(8..12).and_then(|b| b.try_into().ok()).ok_or(BAD)?);
        if count == 0 || count > MAX_BATCH {
            return Err(BAD);
        }
        let data = body.get(12..).ok_or(BAD)?;
        let lanes = params.lanes();
        let entry_len = params.entry_len();
        let per_pos = lanes * entry_len;
        let delimiter = params.tokenization == Tokenization::Delimiter;
        let mut offset = first_offset;
        if delimiter {
            // Walk the varints to check the layout and the offsets.
            let mut pos = 0usize;
            for i in 0..count {
                if i > 0 {
                    let (delta, used) =
                        read_varint(data.get(pos..).unwrap_or_default()).ok_or(BAD)?;
                    if delta == 0 {
                        return Err(ChannelError::Offsets);
                    }
                    offset = offset.checked_add(delta).ok_or(ChannelError::Offsets)?;
                    pos += used;
                }
                pos = pos.checked_add(per_pos).ok_or(BAD)?;
                if pos > data.len() {
                    return Err(BAD);
                }
            }
            if pos != data.len() {
                return Err(BAD);
            }
        } else {
            if data.len() != count as usize * per_pos {
                return Err(BAD);
            }
            first_offset
                .checked_add(u64::from(count) - 1)
                .ok_or(ChannelError::Offsets)?;
        }
        Ok(Self {
            first_offset,
            count,
            lanes,
            entry_len,
            delimiter,
            data: data.to_vec(),
        })
    }
}

fn read_varint(b: &[u8]) -> Option<(u64, usize)> {
    let mut v: u64 = 0;
    for (i, byte) in b.iter().take(10).enumerate() {
        let part = u64::from(byte & 0x7f);
        if i == 9 && part > 1 {
            return None;
        }
        v |= part << (7 * i);
        if byte & 0x80 == 0 {
            return Some((v, i + 1));
        }
    }
    None
}

fn write_varint(mut v: u64, out: &mut Vec<u8>) {
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(b);
            return;
        }
        out.push(b | 0x80);
    }
}

/// One decoded frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame {
    Hello(ChannelParams),
    Salt(u64),
    MessageStart(u64),
    Tokens(TokenBatch),
    SealedSecrets(Vec<u8>),
    End { tokens: u64 },
}

/// A frame with its sequence number and the bytes its tag covers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawFrame {
    pub seq: u64,
    pub frame: Frame,
    /// Header and body, exactly as received (what the tag authenticates).
    pub authenticated: Vec<u8>,
    pub tag: [u8; TAG_LEN],
}

/// The frame authentication key (`k_auth` of one direction).
pub struct FrameAuth(hmac::Key);

impl FrameAuth {
    pub fn new(key: &[u8; 32]) -> Self {
        Self(hmac::Key::new(hmac::HMAC_SHA256, key))
    }

    fn tag(&self, seq: u64, authenticated: &[u8]) -> [u8; TAG_LEN] {
        let mut ctx = hmac::Context::with_key(&self.0);
        ctx.update(TAG_DOMAIN);
        ctx.update(&seq.to_be_bytes());
        ctx.update(authenticated);
        let full = ctx.sign();
        let mut t = [0u8; TAG_LEN];
        t.copy_from_slice(full.as_ref().get(..TAG_LEN).unwrap_or(&[0; TAG_LEN]));
        t
    }

    /// Checks a received frame's tag in constant time.
    pub fn verify(&self, raw: &RawFrame) -> bool {
        let want = self.tag(raw.seq, &raw.authenticated);
        subtle::ConstantTimeEq::ct_eq(&want[..], &raw.tag[..]).into()
    }
}

impl std::fmt::Debug for FrameAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FrameAuth(..)")
    }
}

/// Streaming decoder for one direction of the token channel.
#[derive(Debug, Default)]
pub struct Deframer {
    buf: Vec<u8>,
    start: usize,
    seq: u64,
    params: Option<ChannelParams>,
    ended: bool,
    failed: bool,
    /// Leave [`RawFrame::authenticated`] empty (for the middlebox, which cannot check tags).
    skip_authenticated: bool,
}

impl Deframer {
    pub fn new() -> Self {
        Self::default()
    }

    /// A deframer whose frames carry no copy of the tagged bytes ([`RawFrame::authenticated`]
    /// is empty): for the middlebox, which has no `k_auth` and forwards the bytes unchanged
    /// anyway. Saves one copy of every frame.
    pub fn without_tag_bytes() -> Self {
        Self {
            skip_authenticated: true,
            ..Self::default()
        }
    }

    /// The parameters from the Hello frame, once seen.
    pub fn params(&self) -> Option<ChannelParams> {
        self.params
    }

    /// Whether the End frame was seen.
    pub fn ended(&self) -> bool {
        self.ended
    }

    /// Bytes buffered but not yet returned as a frame.
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.start
    }

    /// Appends received bytes.
    pub fn push(&mut self, data: &[u8]) {
        if self.start > 0 && self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
        }
        self.buf.extend_from_slice(data);
    }

    /// The next complete frame, `Ok(None)` if more bytes are needed.
    pub fn next_frame(&mut self) -> Result<Option<RawFrame>, ChannelError> {
        if self.failed {
            return Err(ChannelError::Poisoned);
        }
        let r = self.try_next();
        if r.is_err() {
            self.failed = true;
        }
        r
    }

    fn try_next(&mut self) -> Result<Option<RawFrame>, ChannelError> {
        let avail = self.buf.get(self.start..).unwrap_or_default();
        let Some((frame, total)) = parse_frame(
            &mut self.params,
            &mut self.ended,
            &mut self.seq,
            self.skip_authenticated,
            avail,
        )?
        else {
            return Ok(None);
        };
        self.start += total;
        if self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
        } else if self.start > MAX_BODY {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        Ok(Some(frame))
    }

    /// [`Self::push`] then [`Self::next_frame`] until it returns `None`, handing each frame to
    /// `f` (stopping at the first error, its own or `f`'s): the same frames, errors and state.
    /// Complete frames are decoded straight from `data` when nothing is buffered, so the bytes
    /// are not copied into the buffer first (the middlebox's hot path).
    pub fn push_frames<E: From<ChannelError>>(
        &mut self,
        data: &[u8],
        mut f: impl FnMut(RawFrame) -> Result<(), E>,
    ) -> Result<(), E> {
        if self.failed {
            return Err(ChannelError::Poisoned.into());
        }
        let mut rest = data;
        if self.buffered() == 0 {
            loop {
                let parsed = parse_frame(
                    &mut self.params,
                    &mut self.ended,
                    &mut self.seq,
                    self.skip_authenticated,
                    rest,
                );
                match parsed {
                    Ok(Some((frame, total))) => {
                        rest = rest.get(total..).unwrap_or_default();
                        if let Err(e) = f(frame) {
                            // As if everything had been pushed: the rest waits in the buffer.
                            self.push(rest);
                            return Err(e);
                        }
                    }
                    Ok(None) => break,
                    Err(e) => {
                        self.failed = true;
                        return Err(e.into());
                    }
                }
            }
        }
        self.push(rest);
        while let Some(frame) = self.next_frame()? {
            f(frame)?;
        }
        Ok(())
    }
}

/// Decodes the frame at the start of `avail`: `None` if it is incomplete, else the frame and
/// its length on the wire.
fn parse_frame(
    params: &mut Option<ChannelParams>,
    ended: &mut bool,
    seq: &mut u64,
    skip_authenticated: bool,
    avail: &[u8],
) -> Result<Option<(RawFrame, usize)>, ChannelError> {
    let Some(&[kind, l0, l1, l2]) = avail.get(..HEADER_LEN) else {
        return Ok(None);
    };
    if !(KIND_HELLO..=KIND_END).contains(&kind) {
        return Err(ChannelError::UnknownKind(kind));
    }
    let len = usize::from(l0) << 16 | usize::from(l1) << 8 | usize::from(l2);
    if len > MAX_BODY {
        return Err(ChannelError::TooLong(len));
    }
    if *ended {
        return Err(ChannelError::AfterEnd);
    }
    let total = HEADER_LEN + len + TAG_LEN;
    let Some(whole) = avail.get(..total) else {
        return Ok(None);
    };
    let body = whole.get(HEADER_LEN..HEADER_LEN + len).unwrap_or_default();
    let mut tag = [0u8; TAG_LEN];
    tag.copy_from_slice(whole.get(HEADER_LEN + len..).unwrap_or(&[0; TAG_LEN]));
    let frame = decode_frame(params, ended, kind, body)?;
    let authenticated = if skip_authenticated {
        Vec::new()
    } else {
        whole.get(..HEADER_LEN + len).unwrap_or_default().to_vec()
    };
    let this = *seq;
    *seq += 1;
    Ok(Some((
        RawFrame {
            seq: this,
            frame,
            authenticated,
            tag,
        },
        total,
    )))
}

fn decode_frame(
    params_slot: &mut Option<ChannelParams>,
    ended: &mut bool,
    kind: u8,
    body: &[u8],
) -> Result<Frame, ChannelError> {
    {
        let u64_body = |what| {
            body.try_into()
                .map(u64::from_be_bytes)
                .map_err(|_| ChannelError::Malformed(what))
        };
        let Some(params) = *params_slot else {
            if kind != KIND_HELLO {
                return Err(ChannelError::NoHello);
            }
            let p = ChannelParams::decode(body)?;
            *params_slot = Some(p);
            return Ok(Frame::Hello(p));
        };
        Ok(match kind {
            KIND_HELLO => return Err(ChannelError::DuplicateHello),
            KIND_SALT => Frame::Salt(u64_body("Salt")?),
            KIND_MESSAGE_START => Frame::MessageStart(u64_body("MessageStart")?),
            KIND_TOKENS => Frame::Tokens(TokenBatch::decode(body, &params)?),
            KIND_SEALED => {
                if body.len() > MAX_SEALED || params.privacy != Privacy::ProbableCause {
                    return Err(ChannelError::Malformed("SealedSecrets"));
                }
                Frame::SealedSecrets(body.to_vec())
            }
            KIND_END => {
                *ended = true;
                Frame::End {
                    tokens: u64_body("End")?,
                }
            }
            other => return Err(ChannelError::UnknownKind(other)),
        })
    }
}

/// Encodes one direction of the token channel, batching tokens and tagging every frame.
#[derive(Debug)]
pub struct ChannelWriter {
    params: ChannelParams,
    auth: FrameAuth,
    seq: u64,
    /// Body of the open token frame (empty: none open).
    batch: Vec<u8>,
    batch_count: u32,
    /// Lane index expected next within the current position.
    lane: usize,
    last_offset: u64,
    tokens: u64,
    ended: bool,
}

impl ChannelWriter {
    /// Writes the Hello frame into `out`.
    pub fn new(params: ChannelParams, auth: FrameAuth, out: &mut Vec<u8>) -> Self {
        let mut w = Self {
            params,
            auth,
            seq: 0,
            batch: Vec::new(),
            batch_count: 0,
            lane: 0,
            last_offset: 0,
            tokens: 0,
            ended: false,
        };
        w.frame(KIND_HELLO, &params.encode(), out);
        w
    }

    pub fn params(&self) -> ChannelParams {
        self.params
    }

    /// Tokens written so far.
    pub fn tokens(&self) -> u64 {
        self.tokens
    }

    fn frame(&mut self, kind: u8, body: &[u8], out: &mut Vec<u8>) {
        let start = out.len();
        let len = body.len() as u32;
        out.push(kind);
        out.extend_from_slice(&len.to_be_bytes()[1..]);
        out.extend_from_slice(body);
        let tag = self
            .auth
            .tag(self.seq, out.get(start..).unwrap_or_default());
        out.extend_from_slice(&tag);
        self.seq += 1;
    }

    /// Closes the open token frame, if any.
    pub fn flush(&mut self, out: &mut Vec<u8>) {
        if self.batch.is_empty() {
            return;
        }
        let mut body = std::mem::take(&mut self.batch);
        if let Some(c) = body.get_mut(8..12) {
            c.copy_from_slice(&self.batch_count.to_be_bytes());
        }
        self.frame(KIND_TOKENS, &body, out);
        body.clear();
        self.batch = body;
        self.batch_count = 0;
    }

    /// Encodes one token-channel message (tokens are batched until [`Self::flush`] or a
    /// non-token message).
    pub fn push(&mut self, msg: &TokenMsg, out: &mut Vec<u8>) -> Result<(), ChannelError> {
        if self.ended {
            return Err(ChannelError::AfterEnd);
        }
        match msg {
            TokenMsg::Salt(s) => self.control(KIND_SALT, *s, out),
            TokenMsg::MessageStart(o) => self.control(KIND_MESSAGE_START, *o, out),
            TokenMsg::Token(t) => self.token(t, out),
        }
    }

    /// [`Self::push`] for each message of `msgs`, in order, with the same output. The common
    /// case — the next window token of a one-lane channel, with room in the open batch — is
    /// appended in this loop instead of going through the general checks per token.
    pub fn push_all(&mut self, msgs: &[TokenMsg], out: &mut Vec<u8>) -> Result<(), ChannelError> {
        let one_lane_window =
            self.params.tokenization == Tokenization::Window && self.params.lanes() == 1;
        let p3 = self.params.privacy == Privacy::ProbableCause;
        for m in msgs {
            if let TokenMsg::Token(t) = m {
                if one_lane_window
                    && !self.ended
                    && !self.batch.is_empty()
                    && t.lane == Lane::Exact
                    && t.c2.is_some() == p3
                    && self.last_offset.checked_add(1) == Some(t.offset)
                    && !self.batch_full()
                {
                    self.batch_count += 1;
                    self.last_offset = t.offset;
                    self.append_entry(t);
                    continue;
                }
            }
            self.push(m, out)?;
        }
        Ok(())
    }

    fn control(&mut self, kind: u8, v: u64, out: &mut Vec<u8>) -> Result<(), ChannelError> {
        if self.lane != 0 {
            return Err(ChannelError::Encode("position split by a control message"));
        }
        self.flush(out);
        self.frame(kind, &v.to_be_bytes(), out);
        Ok(())
    }

    fn token(&mut self, t: &EncToken, out: &mut Vec<u8>) -> Result<(), ChannelError> {
        let want_lane = if self.lane == 0 {
            Lane::Exact
        } else {
            Lane::Folded
        };
        if t.lane != want_lane {
            return Err(ChannelError::Encode("lanes out of order"));
        }
        let p3 = self.params.privacy == Privacy::ProbableCause;
        if t.c2.is_some() != p3 {
            return Err(ChannelError::Encode("c2 does not match the privacy model"));
        }
        if self.lane > 0 {
            if t.offset != self.last_offset {
                return Err(ChannelError::Encode("lanes of one position at two offsets"));
            }
        } else {
            let full = self.batch_full();
            let window = self.params.tokenization == Tokenization::Window;
            let contiguous = !self.batch.is_empty()
                && if window {
                    self.last_offset.checked_add(1) == Some(t.offset)
                } else {
                    t.offset > self.last_offset
                };
            if !self.batch.is_empty() && (!contiguous || full) {
                if t.offset <= self.last_offset {
                    return Err(ChannelError::Encode("token offsets go backwards"));
                }
                self.flush(out);
            }
            if self.batch.is_empty() {
                self.batch.extend_from_slice(&t.offset.to_be_bytes());
                self.batch.extend_from_slice(&[0; 4]);
            } else if !window {
                write_varint(t.offset - self.last_offset, &mut self.batch);
            }
            self.batch_count += 1;
            self.last_offset = t.offset;
        }
        self.append_entry(t);
        self.lane = (self.lane + 1) % self.params.lanes();
        Ok(())
    }

    /// No room in the open token frame for another position (all its lanes).
    #[inline]
    fn batch_full(&self) -> bool {
        self.batch_count >= MAX_BATCH
            || self.batch.len() + 10 + self.params.lanes() * self.params.entry_len() > MAX_BODY
    }

    /// One token's entry (`c1`, and `c2` under probable cause) into the open frame.
    #[inline]
    fn append_entry(&mut self, t: &EncToken) {
        self.batch.extend_from_slice(&t.c1);
        if let Some(c2) = &t.c2 {
            self.batch.extend_from_slice(c2);
        }
        self.tokens += 1;
    }

    /// Sends the sealed traffic secrets (Protocol III).
    pub fn sealed_secrets(&mut self, sealed: &[u8], out: &mut Vec<u8>) -> Result<(), ChannelError> {
        if sealed.len() > MAX_SEALED || self.params.privacy != Privacy::ProbableCause {
            return Err(ChannelError::Encode("sealed secrets"));
        }
        if self.lane != 0 {
            return Err(ChannelError::Encode("position split by a control message"));
        }
        self.flush(out);
        self.frame(KIND_SEALED, sealed, out);
        Ok(())
    }

    /// Ends the channel (the End frame authenticates the token count, so truncation is seen).
    pub fn finish(&mut self, out: &mut Vec<u8>) -> Result<(), ChannelError> {
        if self.ended {
            return Ok(());
        }
        if self.lane != 0 {
            return Err(ChannelError::Encode("position split at the end"));
        }
        self.flush(out);
        let n = self.tokens;
        self.frame(KIND_END, &n.to_be_bytes(), out);
        self.ended = true;
        Ok(())
    }
}

/// Turns a frame into the token messages it carries (Hello, SealedSecrets and End carry none).
pub fn frame_msgs(frame: &Frame, out: &mut Vec<TokenMsg>) {
    match frame {
        Frame::Salt(s) => out.push(TokenMsg::Salt(*s)),
        Frame::MessageStart(o) => out.push(TokenMsg::MessageStart(*o)),
        Frame::Tokens(b) => b.for_each(|t| out.push(TokenMsg::Token(t))),
        Frame::Hello(_) | Frame::SealedSecrets(_) | Frame::End { .. } => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn params(t: Tokenization, c: CaseMode, p: Privacy) -> ChannelParams {
        ChannelParams {
            tokenization: t,
            case: c,
            privacy: p,
            direction: Direction::ToServer,
        }
    }

    fn tok(offset: u64, lane: Lane, c1: u8, p3: bool) -> TokenMsg {
        TokenMsg::Token(EncToken {
            offset,
            lane,
            c1: [c1; 5],
            c2: p3.then_some([c1 ^ 0xff; 16]),
        })
    }

    /// A well-formed message stream from (offset gap, byte) pairs.
    fn stream(spec: &[(u8, u8, u8)], p: &ChannelParams) -> Vec<TokenMsg> {
        let p3 = p.privacy == Privacy::ProbableCause;
        let mut v = vec![TokenMsg::Salt(7)];
        let mut offset = 0u64;
        for &(gap, byte, ctl) in spec {
            offset += u64::from(gap % 3) + 1;
            if ctl % 17 == 0 {
                v.push(TokenMsg::Salt(u64::from(byte)));
            } else if ctl % 23 == 0 {
                v.push(TokenMsg::MessageStart(offset));
            }
            v.push(tok(offset, Lane::Exact, byte, p3));
            if p.case == CaseMode::Dual {
                v.push(tok(offset, Lane::Folded, byte.wrapping_add(1), p3));
            }
        }
        v
    }

    fn assert_push_all_equals_push(
        p: &ChannelParams,
        msgs: &[TokenMsg],
    ) -> Result<(), TestCaseError> {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        let mut wa = ChannelWriter::new(*p, FrameAuth::new(&[1; 32]), &mut a);
        let mut wb = ChannelWriter::new(*p, FrameAuth::new(&[1; 32]), &mut b);
        let ra = wa.push_all(msgs, &mut a);
        let rb = msgs.iter().try_for_each(|m| wb.push(m, &mut b));
        prop_assert_eq!(format!("{ra:?}"), format!("{rb:?}"));
        wa.flush(&mut a);
        wb.flush(&mut b);
        prop_assert_eq!(wa.tokens(), wb.tokens());
        prop_assert_eq!(a, b);
        Ok(())
    }

    /// Long contiguous runs cross the batch limit the same way with `push_all`.
    #[test]
    fn push_all_splits_long_runs_like_push() {
        for privacy in [Privacy::ExactMatch, Privacy::ProbableCause] {
            let p = params(Tokenization::Window, CaseMode::Exact, privacy);
            let p3 = privacy == Privacy::ProbableCause;
            let mut msgs = vec![TokenMsg::Salt(1)];
            msgs.extend(
                (0..2 * u64::from(MAX_BATCH) + 5).map(|o| tok(o, Lane::Exact, o as u8, p3)),
            );
            assert_push_all_equals_push(&p, &msgs).unwrap();
        }
    }

    fn decode_all(bytes: &[u8], cuts: &[usize], auth: &FrameAuth) -> Vec<TokenMsg> {
        let mut d = Deframer::new();
        let mut msgs = Vec::new();
        let mut prev = 0;
        let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
        cuts.sort_unstable();
        cuts.push(bytes.len());
        for c in cuts {
            d.push(&bytes[prev..c]);
            prev = c;
            while let Some(f) = d.next_frame().unwrap() {
                assert!(auth.verify(&f));
                frame_msgs(&f.frame, &mut msgs);
            }
        }
        assert!(d.ended());
        msgs
    }

    proptest! {
        #[test]
        fn round_trip_any_split(spec in proptest::collection::vec(any::<(u8, u8, u8)>(), 0..300),
                                cuts in proptest::collection::vec(any::<usize>(), 0..6),
                                delim in any::<bool>(), dual in any::<bool>(), p3 in any::<bool>(),
                                flush_every in 1usize..50) {
            let p = params(
                if delim { Tokenization::Delimiter } else { Tokenization::Window },
                if dual { CaseMode::Dual } else { CaseMode::Exact },
                if p3 { Privacy::ProbableCause } else { Privacy::ExactMatch },
            );
            let msgs = stream(&spec, &p);
            let mut out = Vec::new();
            let mut w = ChannelWriter::new(p, FrameAuth::new(&[1; 32]), &mut out);
            for (i, m) in msgs.iter().enumerate() {
                w.push(m, &mut out).unwrap();
                if i % flush_every == 0 && matches!(m, TokenMsg::Token(t) if t.lane == Lane::Folded || !dual) {
                    w.flush(&mut out);
                }
            }
            w.finish(&mut out).unwrap();
            let back = decode_all(&out, &cuts, &FrameAuth::new(&[1; 32]));
            prop_assert_eq!(back, msgs);
        }

        /// `push_all` writes exactly what one `push` per message writes, and fails at the same
        /// message with the same error, on valid streams and on streams with an offset moved
        /// back, a lane changed or `c2` added or dropped.
        #[test]
        fn push_all_equals_push_per_message(spec in proptest::collection::vec(any::<(u8, u8, u8)>(), 0..300),
                                            delim in any::<bool>(), dual in any::<bool>(), p3 in any::<bool>(),
                                            spoil in proptest::collection::vec((any::<usize>(), 0u8..3), 0..3)) {
            let p = params(
                if delim { Tokenization::Delimiter } else { Tokenization::Window },
                if dual { CaseMode::Dual } else { CaseMode::Exact },
                if p3 { Privacy::ProbableCause } else { Privacy::ExactMatch },
            );
            let mut msgs = stream(&spec, &p);
            for (at, how) in spoil {
                let i = at % msgs.len();
                if let Some(TokenMsg::Token(t)) = msgs.get_mut(i) {
                    match how {
                        0 => t.offset = t.offset.saturating_sub(2),
                        1 => t.lane = Lane::Folded,
                        _ => t.c2 = if t.c2.is_some() { None } else { Some([0; 16]) },
                    }
                }
            }
            assert_push_all_equals_push(&p, &msgs)?;
        }

        /// `push_frames` hands out exactly the frames (and the first error) that `push` +
        /// `next_frame` give, for any split, on valid streams with garbage appended.
        #[test]
        fn push_frames_equals_push_and_next(spec in proptest::collection::vec(any::<(u8, u8, u8)>(), 0..100),
                                            garbage in proptest::collection::vec(any::<u8>(), 0..40),
                                            cuts in proptest::collection::vec(any::<usize>(), 0..6)) {
            let p = params(Tokenization::Window, CaseMode::Exact, Privacy::ExactMatch);
            let mut bytes = Vec::new();
            let mut w = ChannelWriter::new(p, FrameAuth::new(&[1; 32]), &mut bytes);
            for m in stream(&spec, &p) {
                w.push(&m, &mut bytes).unwrap();
                if m == TokenMsg::MessageStart(0) {
                    w.flush(&mut bytes);
                }
            }
            w.flush(&mut bytes);
            bytes.extend_from_slice(&garbage);
            let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
            cuts.sort_unstable();
            cuts.push(bytes.len());
            let (mut a, mut b) = (Deframer::new(), Deframer::new());
            let (mut fa, mut fb) = (Vec::new(), Vec::new());
            let (mut ea, mut eb) = (None, None);
            let mut prev = 0;
            for c in cuts {
                let piece = &bytes[prev..c];
                prev = c;
                if ea.is_none() {
                    a.push(piece);
                    loop {
                        match a.next_frame() {
                            Ok(Some(f)) => fa.push(f),
                            Ok(None) => break,
                            Err(e) => {
                                ea = Some(e);
                                break;
                            }
                        }
                    }
                }
                if eb.is_none() {
                    if let Err(e) = b.push_frames(piece, |f| -> Result<(), ChannelError> {
                        fb.push(f);
                        Ok(())
                    }) {
                        eb = Some(e);
                    }
                }
            }
            prop_assert_eq!(fa, fb);
            prop_assert_eq!(ea, eb);
        }

        #[test]
        fn garbage_never_panics(data in proptest::collection::vec(any::<u8>(), 0..2000)) {
            let mut d = Deframer::new();
            d.push(&data);
            while let Ok(Some(f)) = d.next_frame() {
                let mut v = Vec::new();
                frame_msgs(&f.frame, &mut v);
            }
        }
    }

    #[test]
    fn window_mode_sends_no_offsets() {
        let p = params(Tokenization::Window, CaseMode::Exact, Privacy::ExactMatch);
        let mut out = Vec::new();
        let mut w = ChannelWriter::new(p, FrameAuth::new(&[0; 32]), &mut out);
        let hello = out.len();
        for o in 100..200 {
            w.push(&tok(o, Lane::Exact, 1, false), &mut out).unwrap();
        }
        w.flush(&mut out);
        // One frame: header, first offset, count, 100 × 5 bytes, tag.
        assert_eq!(out.len() - hello, HEADER_LEN + 12 + 500 + TAG_LEN);
    }

    #[test]
    fn limits_and_sticky_errors() {
        let mut d = Deframer::new();
        d.push(&[KIND_HELLO, 0xff, 0xff, 0xff]);
        assert_eq!(d.next_frame(), Err(ChannelError::TooLong(0xff_ffff)));
        d.push(&[0; 100]);
        assert_eq!(d.next_frame(), Err(ChannelError::Poisoned));

        let mut d = Deframer::new();
        d.push(&[KIND_SALT, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 1]);
        d.push(&[0; 16]);
        assert_eq!(d.next_frame(), Err(ChannelError::NoHello));

        // A zero-position batch, a count above the limit and a wrong length are refused.
        let p = params(Tokenization::Window, CaseMode::Exact, Privacy::ExactMatch);
        for (count, extra) in [(0u32, 0usize), (MAX_BATCH + 1, 0), (2, 1)] {
            let mut body = 5u64.to_be_bytes().to_vec();
            body.extend_from_slice(&count.to_be_bytes());
            body.extend(std::iter::repeat_n(0, count.min(4) as usize * 5 + extra));
            assert_eq!(
                TokenBatch::decode(&body, &p),
                Err(ChannelError::Malformed("Tokens"))
            );
        }
        // Window offsets that overflow.
        let mut body = u64::MAX.to_be_bytes().to_vec();
        body.extend_from_slice(&2u32.to_be_bytes());
        body.extend_from_slice(&[0; 10]);
        assert_eq!(TokenBatch::decode(&body, &p), Err(ChannelError::Offsets));
        // Delimiter delta of zero.
        let p = params(
            Tokenization::Delimiter,
            CaseMode::Exact,
            Privacy::ExactMatch,
        );
        let mut body = 5u64.to_be_bytes().to_vec();
        body.extend_from_slice(&2u32.to_be_bytes());
        body.extend_from_slice(&[1; 5]);
        body.push(0);
        body.extend_from_slice(&[2; 5]);
        assert_eq!(TokenBatch::decode(&body, &p), Err(ChannelError::Offsets));
    }

    #[test]
    fn tags_bind_sequence_and_content() {
        let p = params(Tokenization::Window, CaseMode::Exact, Privacy::ExactMatch);
        let auth = FrameAuth::new(&[3; 32]);
        let mut out = Vec::new();
        let mut w = ChannelWriter::new(p, FrameAuth::new(&[3; 32]), &mut out);
        w.push(&TokenMsg::Salt(1), &mut out).unwrap();
        w.push(&TokenMsg::Salt(2), &mut out).unwrap();
        let frame_len = HEADER_LEN + 8 + TAG_LEN;
        let hello_len = out.len() - 2 * frame_len;
        // Swap the two Salt frames: each is intact but sits at the wrong sequence number.
        let mut swapped = out[..hello_len].to_vec();
        swapped.extend_from_slice(&out[hello_len + frame_len..]);
        swapped.extend_from_slice(&out[hello_len..hello_len + frame_len]);
        let mut d = Deframer::new();
        d.push(&swapped);
        let verdicts: Vec<bool> = std::iter::from_fn(|| d.next_frame().unwrap())
            .map(|f| auth.verify(&f))
            .collect();
        assert_eq!(verdicts, vec![true, false, false]);
        // A flipped body bit fails too; the original passes.
        let mut flipped = out.clone();
        flipped[hello_len + HEADER_LEN + 7] ^= 1;
        for (bytes, ok) in [(&out, true), (&flipped, false)] {
            let mut d = Deframer::new();
            d.push(bytes);
            let all: Vec<bool> = std::iter::from_fn(|| d.next_frame().unwrap())
                .map(|f| auth.verify(&f))
                .collect();
            assert_eq!(all.iter().all(|v| *v), ok);
        }
    }

    #[test]
    fn writer_refuses_inconsistent_streams() {
        let p = params(Tokenization::Window, CaseMode::Dual, Privacy::ExactMatch);
        let mut out = Vec::new();
        let mut w = ChannelWriter::new(p, FrameAuth::new(&[0; 32]), &mut out);
        assert!(w.push(&tok(1, Lane::Folded, 1, false), &mut out).is_err());
        let mut w = ChannelWriter::new(p, FrameAuth::new(&[0; 32]), &mut out);
        assert!(w.push(&tok(1, Lane::Exact, 1, true), &mut out).is_err());
        w.push(&tok(1, Lane::Exact, 1, false), &mut out).unwrap();
        assert!(w.push(&TokenMsg::Salt(3), &mut out).is_err());
    }
}
