//! Setup messages and their framing.
//!
//! Every message is one frame `type: u8 | body_len: u32 (big endian) | body`, body at most
//! [`MAX_FRAME`] bytes. The middlebox has one byte stream to each endpoint; the endpoints do not
//! talk to each other (they share `k_rand` through the primary TLS session).
//!
//! | type | direction | body |
//! |---|---|---|
//! | 0x01 Announce | MB → endpoint | `"MBXS"`, version 1, role (0 full / 1 hash), layout (1 = 8-byte chunks), chunk count u32, batch size u16, nonce `[32]`, OT base setup (rest) |
//! | 0x02 Extend | MB → endpoint | batch u32, OT extension message (rest) |
//! | 0x03 Finished | MB → endpoint | empty: every check passed |
//! | 0x11 Ready | endpoint → MB | OT base reply (rest) |
//! | 0x12 Transfer | endpoint → MB | batch u32, OT transfer message (rest) |
//! | 0x13 Circuit | full endpoint → MB | index u32, label seed `[16]`, tables_len u32, tables, decoding (rest) |
//! | 0x14 Digests | hash endpoint → MB | first index u32, count u16, count × `[32]` |
//!
//! All integers big endian. Parsing never panics and rejects trailing bytes.

/// Largest frame body (a circuit is ≈ 322 KB; OT messages of a 64-circuit batch ≈ 400 KB).
pub const MAX_FRAME: usize = 1 << 20;
/// Most circuits per OT batch: the batch's OT transfer (`13 + 32 × 192 × batch` bytes) must
/// fit in one frame.
pub const MAX_BATCH_CIRCUITS: u16 = 128;
/// Most OT batches the middlebox may have outstanding at an endpoint (bounds the endpoint's
/// buffered extension messages).
pub const MAX_WINDOW: u32 = 8;
/// Bytes of a frame header.
pub const FRAME_HEADER: usize = 5;
/// Protocol version in [`Announce`].
pub const VERSION: u8 = 1;
/// Layout byte: 8-byte chunks `t ‖ 0⁸` (`mbx_garble::Layout::Token64`).
pub const LAYOUT_TOKEN64: u8 = 1;
const MAGIC: &[u8; 4] = b"MBXS";

pub(crate) const T_ANNOUNCE: u8 = 0x01;
pub(crate) const T_EXTEND: u8 = 0x02;
pub(crate) const T_FINISHED: u8 = 0x03;
pub(crate) const T_READY: u8 = 0x11;
pub(crate) const T_TRANSFER: u8 = 0x12;
pub(crate) const T_CIRCUIT: u8 = 0x13;
pub(crate) const T_DIGESTS: u8 = 0x14;

/// Which endpoint (from the middlebox's point of view), or the middlebox (from an endpoint's).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Peer {
    /// The endpoint sending full garbled circuits.
    Full,
    /// The endpoint sending transcript digests only.
    Hash,
    /// The middlebox.
    Middlebox,
}

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Peer::Full => "full-circuit endpoint",
            Peer::Hash => "hash endpoint",
            Peer::Middlebox => "middlebox",
        })
    }
}

/// What the middlebox asks an endpoint to send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Garbled tables, label seed and decoding information of every circuit.
    Full,
    /// Only the transcript digest of every circuit.
    Hash,
}

/// The middlebox's opening message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Announce {
    pub role: Role,
    /// Number of rule chunks = circuits.
    pub chunks: u32,
    /// Circuits per OT batch (the last batch may be shorter).
    pub batch: u16,
    /// Fresh per setup; separates the OT sessions.
    pub nonce: [u8; 32],
    /// The OT receiver's base-OT setup message.
    pub ot_setup: Vec<u8>,
}

/// One full garbled circuit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CircuitMsg {
    pub index: u32,
    pub label_seed: [u8; 16],
    pub tables: Vec<u8>,
    pub decoding: Vec<u8>,
}

/// Every setup message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message {
    Announce(Announce),
    Extend { batch: u32, ot: Vec<u8> },
    Finished,
    Ready { ot: Vec<u8> },
    Transfer { batch: u32, ot: Vec<u8> },
    Circuit(CircuitMsg),
    Digests { first: u32, digests: Vec<[u8; 32]> },
}

/// Why a frame or message could not be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WireError(pub &'static str);

impl Message {
    /// The frame (header included).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode_into(&mut out);
        out
    }

    /// Appends the frame to `out`.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.extend_from_slice(&[0; FRAME_HEADER]);
        let ty = match self {
            Message::Announce(a) => {
                out.extend_from_slice(MAGIC);
                out.push(VERSION);
                out.push(match a.role {
                    Role::Full => 0,
                    Role::Hash => 1,
                });
                out.push(LAYOUT_TOKEN64);
                out.extend_from_slice(&a.chunks.to_be_bytes());
                out.extend_from_slice(&a.batch.to_be_bytes());
                out.extend_from_slice(&a.nonce);
                out.extend_from_slice(&a.ot_setup);
                T_ANNOUNCE
            }
            Message::Extend { batch, ot } => {
                out.extend_from_slice(&batch.to_be_bytes());
                out.extend_from_slice(ot);
                T_EXTEND
            }
            Message::Finished => T_FINISHED,
            Message::Ready { ot } => {
                out.extend_from_slice(ot);
                T_READY
            }
            Message::Transfer { batch, ot } => {
                out.extend_from_slice(&batch.to_be_bytes());
                out.extend_from_slice(ot);
                T_TRANSFER
            }
            Message::Circuit(c) => {
                put_circuit_head(out, c.index, &c.label_seed, c.tables.len());
                out.extend_from_slice(&c.tables);
                out.extend_from_slice(&c.decoding);
                T_CIRCUIT
            }
            Message::Digests { first, digests } => {
                out.extend_from_slice(&first.to_be_bytes());
                out.extend_from_slice(&(digests.len() as u16).to_be_bytes());
                for d in digests {
                    out.extend_from_slice(d);
                }
                T_DIGESTS
            }
        };
        finish_frame(out, start, ty);
    }

    /// Parses one frame's type and body. Never panics.
    pub fn decode(ty: u8, body: &[u8]) -> Result<Self, WireError> {
        let mut r = Reader(body);
        let msg = match ty {
            T_ANNOUNCE => {
                if r.take(4)? != MAGIC {
                    return Err(WireError("bad magic"));
                }
                if r.u8()? != VERSION {
                    return Err(WireError("unsupported version"));
                }
                let role = match r.u8()? {
                    0 => Role::Full,
                    1 => Role::Hash,
                    _ => return Err(WireError("unknown role")),
                };
                if r.u8()? != LAYOUT_TOKEN64 {
                    return Err(WireError("unknown circuit layout"));
                }
                let chunks = r.u32()?;
                let batch = r.u16()?;
                if batch == 0 || batch > MAX_BATCH_CIRCUITS {
                    return Err(WireError("batch size outside 1..=MAX_BATCH_CIRCUITS"));
                }
                let nonce = r.array()?;
                Message::Announce(Announce {
                    role,
                    chunks,
                    batch,
                    nonce,
                    ot_setup: r.rest().to_vec(),
                })
            }
            T_EXTEND => Message::Extend {
                batch: r.u32()?,
                ot: r.rest().to_vec(),
            },
            T_FINISHED => Message::Finished,
            T_READY => Message::Ready {
                ot: r.rest().to_vec(),
            },
            T_TRANSFER => Message::Transfer {
                batch: r.u32()?,
                ot: r.rest().to_vec(),
            },
            T_CIRCUIT => {
                let index = r.u32()?;
                let label_seed = r.array()?;
                let n = r.u32()? as usize;
                let tables = r.take(n)?.to_vec();
                Message::Circuit(CircuitMsg {
                    index,
                    label_seed,
                    tables,
                    decoding: r.rest().to_vec(),
                })
            }
            T_DIGESTS => {
                let first = r.u32()?;
                let count = r.u16()?;
                let mut digests = Vec::with_capacity(usize::from(count));
                for _ in 0..count {
                    digests.push(r.array()?);
                }
                Message::Digests { first, digests }
            }
            _ => return Err(WireError("unknown message type")),
        };
        r.finish()?;
        Ok(msg)
    }
}

/// Writes a circuit message's fields before the tables (the full endpoint appends tables and
/// decoding in place, without a second copy).
pub(crate) fn put_circuit_head(out: &mut Vec<u8>, index: u32, seed: &[u8; 16], tables: usize) {
    out.extend_from_slice(&index.to_be_bytes());
    out.extend_from_slice(seed);
    out.extend_from_slice(&(tables as u32).to_be_bytes());
}

/// Fills in the header of the frame that starts at `start`.
pub(crate) fn finish_frame(out: &mut [u8], start: usize, ty: u8) {
    let len = (out.len() - start - FRAME_HEADER) as u32;
    if let Some(h) = out.get_mut(start..start + FRAME_HEADER) {
        h[0] = ty;
        h[1..].copy_from_slice(&len.to_be_bytes());
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        let (a, b) = self
            .0
            .split_at_checked(n)
            .ok_or(WireError("message truncated"))?;
        self.0 = b;
        Ok(a)
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }
    fn u8(&mut self) -> Result<u8, WireError> {
        Ok(u8::from_be_bytes(self.array()?))
    }
    fn u16(&mut self) -> Result<u16, WireError> {
        Ok(u16::from_be_bytes(self.array()?))
    }
    fn u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_be_bytes(self.array()?))
    }
    fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.0)
    }
    fn finish(self) -> Result<(), WireError> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(WireError("trailing bytes"))
        }
    }
}

/// Splits a byte stream into frames (any chunking of the input). Holds at most one frame.
#[derive(Default, Debug)]
pub struct Deframer {
    buf: Vec<u8>,
    off: usize,
    failed: bool,
}

impl Deframer {
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends received bytes.
    pub fn push(&mut self, bytes: &[u8]) {
        if self.off > 0 && self.off == self.buf.len() {
            self.buf.clear();
            self.off = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// The next complete frame's type and body, if one is buffered. Errors are sticky.
    pub fn next_frame(&mut self) -> Result<Option<(u8, &[u8])>, WireError> {
        if self.failed {
            return Err(WireError("stream already failed"));
        }
        if self.off > 0 && self.off == self.buf.len() {
            self.buf.clear();
            self.off = 0;
        } else if self.off > MAX_FRAME {
            self.buf.drain(..self.off);
            self.off = 0;
        }
        let avail = self.buf.get(self.off..).unwrap_or_default();
        let Some(head) = avail.get(..FRAME_HEADER) else {
            return Ok(None);
        };
        let ty = head[0];
        let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
        if len > MAX_FRAME {
            self.failed = true;
            return Err(WireError("frame larger than MAX_FRAME"));
        }
        let Some(body) = avail.get(FRAME_HEADER..FRAME_HEADER + len) else {
            return Ok(None);
        };
        self.off += FRAME_HEADER + len;
        Ok(Some((ty, body)))
    }

    /// Bytes received but not yet returned as frames.
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.off
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn arb_msg() -> impl Strategy<Value = Message> {
        let bytes = || proptest::collection::vec(any::<u8>(), 0..64);
        prop_oneof![
            (
                any::<bool>(),
                any::<u32>(),
                1..=MAX_BATCH_CIRCUITS,
                any::<[u8; 32]>(),
                bytes()
            )
                .prop_map(|(full, chunks, batch, nonce, ot_setup)| Message::Announce(
                    Announce {
                        role: if full { Role::Full } else { Role::Hash },
                        chunks,
                        batch,
                        nonce,
                        ot_setup,
                    }
                )),
            (any::<u32>(), bytes()).prop_map(|(batch, ot)| Message::Extend { batch, ot }),
            Just(Message::Finished),
            bytes().prop_map(|ot| Message::Ready { ot }),
            (any::<u32>(), bytes()).prop_map(|(batch, ot)| Message::Transfer { batch, ot }),
            (any::<u32>(), any::<[u8; 16]>(), bytes(), bytes()).prop_map(
                |(index, label_seed, tables, decoding)| Message::Circuit(CircuitMsg {
                    index,
                    label_seed,
                    tables,
                    decoding,
                })
            ),
            (
                any::<u32>(),
                proptest::collection::vec(any::<[u8; 32]>(), 0..5)
            )
                .prop_map(|(first, digests)| Message::Digests { first, digests }),
        ]
    }

    proptest! {
        #[test]
        fn frames_round_trip_under_any_split(
            msgs in proptest::collection::vec(arb_msg(), 1..6),
            cuts in proptest::collection::vec(1usize..50, 1..40),
        ) {
            let mut stream = Vec::new();
            for m in &msgs {
                m.encode_into(&mut stream);
            }
            let mut d = Deframer::new();
            let mut got = Vec::new();
            let mut pos = 0;
            let mut cut = cuts.iter().cycle();
            while pos < stream.len() {
                let n = (*cut.next().unwrap()).min(stream.len() - pos);
                d.push(&stream[pos..pos + n]);
                pos += n;
                while let Some((ty, body)) = d.next_frame().unwrap() {
                    got.push(Message::decode(ty, body).unwrap());
                }
            }
            prop_assert_eq!(got, msgs);
            prop_assert_eq!(d.buffered(), 0);
        }

        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let mut d = Deframer::new();
            d.push(&bytes);
            while let Ok(Some((ty, body))) = d.next_frame() {
                let _ = Message::decode(ty, body);
            }
            for ty in 0..=255u8 {
                let _ = Message::decode(ty, &bytes);
            }
        }
    }

    #[test]
    fn oversized_frame_is_refused_and_sticky() {
        let mut d = Deframer::new();
        d.push(&[T_CIRCUIT, 0xff, 0xff, 0xff, 0xff]);
        assert!(d.next_frame().is_err());
        d.push(&Message::Finished.encode());
        assert!(d.next_frame().is_err());
    }

    #[test]
    fn trailing_bytes_and_bad_announce_are_refused() {
        assert!(Message::decode(T_FINISHED, &[0]).is_err());
        let a = Message::Announce(Announce {
            role: Role::Full,
            chunks: 1,
            batch: 1,
            nonce: [0; 32],
            ot_setup: vec![],
        })
        .encode();
        let body = &a[FRAME_HEADER..];
        assert!(Message::decode(T_ANNOUNCE, body).is_ok());
        let mut v2 = body.to_vec();
        v2[4] = 2;
        assert_eq!(
            Message::decode(T_ANNOUNCE, &v2),
            Err(WireError("unsupported version"))
        );
        let mut zero_batch = body.to_vec();
        zero_batch[11..13].copy_from_slice(&[0, 0]);
        assert_eq!(
            Message::decode(T_ANNOUNCE, &zero_batch),
            Err(WireError("batch size outside 1..=MAX_BATCH_CIRCUITS"))
        );
    }
}
