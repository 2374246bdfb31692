//! The hop wire: one TCP connection per hop carries three streams as frames
//! `stream: u8 | length: u24 | bytes`.
//!
//! | stream | content | forwarded by the middlebox |
//! |---|---|---|
//! | 0 primary | the TLS session's records, end to end | yes, unchanged (after detection) |
//! | 1 tokens | the token channel (`mbx_blindbox::channel`) | yes, unchanged (after detection) |
//! | 2 control | hop-local messages between an endpoint and the middlebox | no |
//! | 3 setup | hop-local: the rule setup's byte stream (`mbx_blindbox_setup::wire` frames) | no |
//!
//! A frame carries at most [`MAX_FRAME`] bytes; an empty frame is refused. Errors are sticky.

/// Largest frame payload.
pub const MAX_FRAME: usize = 64 * 1024;
const HEADER: usize = 4;

/// Which stream a frame belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Primary,
    Tokens,
    Control,
    /// The rule setup between this endpoint and the middlebox (garbled circuits, OT).
    Setup,
}

impl Stream {
    fn id(self) -> u8 {
        match self {
            Stream::Primary => 0,
            Stream::Tokens => 1,
            Stream::Control => 2,
            Stream::Setup => 3,
        }
    }

    fn from_id(id: u8) -> Option<Self> {
        match id {
            0 => Some(Stream::Primary),
            1 => Some(Stream::Tokens),
            2 => Some(Stream::Control),
            3 => Some(Stream::Setup),
            _ => None,
        }
    }
}

/// Why the hop wire is broken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MuxError {
    #[error("unknown stream {0}")]
    UnknownStream(u8),
    #[error("frame of {0} bytes (1..={MAX_FRAME} allowed)")]
    BadLength(usize),
}

/// Appends `bytes` to `out` as frames of `stream` (nothing for empty input).
pub fn encode(stream: Stream, bytes: &[u8], out: &mut Vec<u8>) {
    for chunk in bytes.chunks(MAX_FRAME) {
        let len = chunk.len();
        out.push(stream.id());
        out.extend_from_slice(&[(len >> 16) as u8, (len >> 8) as u8, len as u8]);
        out.extend_from_slice(chunk);
    }
}

/// Splits the byte stream of a hop into frames, from any split of its bytes.
#[derive(Debug, Default)]
pub struct Demux {
    buf: Vec<u8>,
    error: Option<MuxError>,
}

impl Demux {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next whole frame; `Ok(None)` when more bytes are needed.
    pub fn next_frame(&mut self) -> Result<Option<(Stream, Vec<u8>)>, MuxError> {
        if let Some(e) = &self.error {
            return Err(e.clone());
        }
        let Some(header) = self.buf.get(..HEADER) else {
            return Ok(None);
        };
        let id = header.first().copied().unwrap_or_default();
        let len = header
            .get(1..HEADER)
            .map(|l| l.iter().fold(0usize, |a, b| (a << 8) | usize::from(*b)))
            .unwrap_or_default();
        let stream = match Stream::from_id(id) {
            Some(s) => s,
            None => return Err(self.fail(MuxError::UnknownStream(id))),
        };
        if len == 0 || len > MAX_FRAME {
            return Err(self.fail(MuxError::BadLength(len)));
        }
        if self.buf.len() < HEADER + len {
            return Ok(None);
        }
        let payload = self
            .buf
            .get(HEADER..HEADER + len)
            .map(<[u8]>::to_vec)
            .unwrap_or_default();
        self.buf.drain(..HEADER + len);
        Ok(Some((stream, payload)))
    }

    fn fail(&mut self, e: MuxError) -> MuxError {
        self.error = Some(e.clone());
        self.buf.clear();
        e
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_from_any_split() {
        let mut wire = Vec::new();
        encode(Stream::Primary, b"hello", &mut wire);
        encode(Stream::Tokens, &vec![7u8; MAX_FRAME + 3], &mut wire);
        encode(Stream::Control, b"x", &mut wire);
        encode(Stream::Setup, b"yz", &mut wire);
        for split in [1, 3, 4, 5, 1000, wire.len()] {
            let mut d = Demux::new();
            let mut got = Vec::new();
            for piece in wire.chunks(split) {
                d.push(piece);
                while let Some(f) = d.next_frame().unwrap() {
                    got.push(f);
                }
            }
            assert_eq!(got.len(), 5);
            assert_eq!(got[0], (Stream::Primary, b"hello".to_vec()));
            assert_eq!(got[1].1.len() + got[2].1.len(), MAX_FRAME + 3);
            assert_eq!(got[3], (Stream::Control, b"x".to_vec()));
            assert_eq!(got[4], (Stream::Setup, b"yz".to_vec()));
        }
    }

    #[test]
    fn bad_frames_are_sticky_errors() {
        let mut d = Demux::new();
        d.push(&[9, 0, 0, 1, 0]);
        assert_eq!(d.next_frame(), Err(MuxError::UnknownStream(9)));
        d.push(&[0, 0, 0, 1, 0]);
        assert!(d.next_frame().is_err());
        let mut d = Demux::new();
        d.push(&[0, 0, 0, 0]);
        assert_eq!(d.next_frame(), Err(MuxError::BadLength(0)));
        let mut d = Demux::new();
        d.push(&[1, 0x01, 0x00, 0x01]);
        assert_eq!(d.next_frame(), Err(MuxError::BadLength(MAX_FRAME + 1)));
    }
}
