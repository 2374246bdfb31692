//! Minimal record-boundary helpers over raw TLS byte streams.
//!
//! The engines hand whole records, never fragments, to the TLS libraries, so that after an export
//! every byte the library has not processed is still ours (a library holding half a record would
//! make the next sequence number ambiguous). These helpers only read the 5-byte record header and
//! the plaintext handshake messages at the start of a connection; all record protection lives in
//! `mbx-record`.

use mbx_wire::handshake::DEFAULT_MAX_HANDSHAKE_LEN;
use mbx_wire::{
    ContentType, DeframerConfig, HandshakeDeframer, HandshakeType, RecordHeader, ServerHello,
};

use crate::EngineError;

pub(crate) const CT_CHANGE_CIPHER_SPEC: u8 = ContentType::CHANGE_CIPHER_SPEC.0;
pub(crate) const CT_ALERT: u8 = ContentType::ALERT.0;
pub(crate) const CT_HANDSHAKE: u8 = ContentType::HANDSHAKE.0;
pub(crate) const CT_APPLICATION_DATA: u8 = ContentType::APPLICATION_DATA.0;

/// Length of the first complete record at the start of `buf`, `Ok(None)` if more bytes are
/// needed, an error if the header cannot be a TLS record (checked with the TLS 1.2 limits, the
/// larger of the two).
pub(crate) fn complete_record_len(buf: &[u8]) -> Result<Option<usize>, EngineError> {
    if buf.len() < mbx_wire::record::HEADER_LEN {
        return Ok(None);
    }
    let header =
        RecordHeader::parse(buf).map_err(|_| EngineError::Malformed("not a TLS record header"))?;
    header
        .validate(&DeframerConfig::tls12())
        .map_err(|_| EngineError::Malformed("not an acceptable TLS record header"))?;
    let total = mbx_wire::record::HEADER_LEN + usize::from(header.length);
    Ok((buf.len() >= total).then_some(total))
}

/// Number of leading bytes of `buf` that form complete records.
pub(crate) fn complete_prefix_len(buf: &[u8]) -> Result<usize, EngineError> {
    let mut off = 0;
    while let Some(rest) = buf.get(off..) {
        match complete_record_len(rest)? {
            Some(n) => off += n,
            None => break,
        }
    }
    Ok(off)
}

/// Reassembles the plaintext handshake messages carried by the leading handshake records of
/// `stream` (skipping TLS 1.3 compatibility ChangeCipherSpecs, stopping at any other record
/// type) and returns the first message of type `msg_type`, header included, plus the number of
/// stream bytes spanned by the records up to and including the one that completes it.
pub(crate) fn first_handshake_message(
    stream: &[u8],
    msg_type: u8,
) -> Result<Option<(Vec<u8>, usize)>, EngineError> {
    let mut messages = HandshakeDeframer::new(DEFAULT_MAX_HANDSHAKE_LEN);
    let mut off = 0;
    while let Some(rest) = stream.get(off..) {
        let Some(n) = complete_record_len(rest)? else {
            return Ok(None);
        };
        off += n;
        match rest.first().copied() {
            Some(CT_HANDSHAKE) => messages.push(
                rest.get(mbx_wire::record::HEADER_LEN..n)
                    .unwrap_or_default(),
            ),
            Some(CT_CHANGE_CIPHER_SPEC) => continue,
            _ => return Ok(None),
        }
        while let Some(msg) = messages
            .next_message()
            .map_err(|_| EngineError::Malformed("bad handshake message framing"))?
        {
            if msg.typ() == HandshakeType(msg_type) {
                return Ok(Some((msg.into_bytes(), off)));
            }
        }
    }
    Ok(None)
}

/// Stop looking for the ServerHello after this many bytes of the server's flight.
const SERVER_FLIGHT_CAP: usize = 64 * 1024;

/// Finds the server random of the (non-HelloRetryRequest) ServerHello in a server→client
/// byte stream, fed as it arrives: each byte is looked at once, however the flight is split
/// into records (a ServerHello sent one byte per record costs what a whole one does). Gives
/// up on a record that cannot come before the ServerHello, bad message framing, or past
/// `SERVER_FLIGHT_CAP` bytes.
pub(crate) struct ServerRandomWatch {
    /// The end of the stream that is not a whole record yet.
    partial: Vec<u8>,
    messages: HandshakeDeframer,
    seen: usize,
    outcome: Watch,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Watch {
    Looking,
    Found([u8; 32]),
    GaveUp,
}

impl ServerRandomWatch {
    pub(crate) fn new() -> Self {
        ServerRandomWatch {
            partial: Vec::new(),
            messages: HandshakeDeframer::new(DEFAULT_MAX_HANDSHAKE_LEN),
            seen: 0,
            outcome: Watch::Looking,
        }
    }

    /// The random, once found.
    pub(crate) fn random(&self) -> Option<[u8; 32]> {
        match self.outcome {
            Watch::Found(r) => Some(r),
            _ => None,
        }
    }

    /// More of the stream, split anywhere.
    pub(crate) fn feed(&mut self, bytes: &[u8]) {
        if self.outcome != Watch::Looking {
            return;
        }
        self.seen += bytes.len();
        self.partial.extend_from_slice(bytes);
        let mut off = 0;
        while self.outcome == Watch::Looking {
            let rest = self.partial.get(off..).unwrap_or_default();
            let n = match complete_record_len(rest) {
                Ok(Some(n)) => n,
                Ok(None) => break,
                Err(_) => return self.stop(Watch::GaveUp),
            };
            let record = rest.get(..n).unwrap_or_default();
            off += n;
            match record.first().copied() {
                Some(CT_HANDSHAKE) => {
                    let payload = record
                        .get(mbx_wire::record::HEADER_LEN..)
                        .unwrap_or_default();
                    self.messages.push(payload);
                    self.messages_so_far();
                }
                // TLS 1.3 compatibility ChangeCipherSpec.
                Some(CT_CHANGE_CIPHER_SPEC) => {}
                _ => return self.stop(Watch::GaveUp),
            }
        }
        self.partial.drain(..off.min(self.partial.len()));
        if self.outcome == Watch::Looking && self.seen > SERVER_FLIGHT_CAP {
            self.stop(Watch::GaveUp);
        }
    }

    fn messages_so_far(&mut self) {
        loop {
            let msg = match self.messages.next_message() {
                Ok(Some(msg)) => msg,
                Ok(None) => return,
                Err(_) => return self.stop(Watch::GaveUp),
            };
            if msg.typ() != HandshakeType::SERVER_HELLO {
                continue;
            }
            match ServerHello::parse_message(msg.as_bytes()) {
                Ok(hello) if hello.is_hello_retry_request() => {}
                Ok(hello) => return self.stop(Watch::Found(hello.random)),
                Err(_) => return self.stop(Watch::GaveUp),
            }
        }
    }

    /// Settled: what it kept is freed.
    fn stop(&mut self, outcome: Watch) {
        self.outcome = outcome;
        self.partial = Vec::new();
        self.messages = HandshakeDeframer::new(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(ct: u8, payload: &[u8]) -> Vec<u8> {
        let mut v = vec![ct, 3, 3];
        v.extend_from_slice(&(payload.len() as u16).to_be_bytes());
        v.extend_from_slice(payload);
        v
    }

    #[test]
    fn prefix_counts_only_whole_records() {
        let mut s = rec(23, b"abc");
        s.extend(rec(23, b"defg"));
        let whole = s.len();
        s.extend_from_slice(&[23, 3, 3, 0, 10, 1]);
        assert_eq!(complete_prefix_len(&s).unwrap(), whole);
        assert!(complete_prefix_len(&[99, 3, 3, 0, 0]).is_err());
        assert!(complete_prefix_len(&[23, 3, 3, 0xff, 0xff]).is_err());
    }

    /// A ServerHello handshake message (header included) with `random`.
    fn server_hello(random: [u8; 32]) -> Vec<u8> {
        let mut body = vec![3, 3];
        body.extend(random);
        body.extend([0, 0xc0, 0x2f, 0]);
        let mut msg = vec![2, 0, 0, body.len() as u8];
        msg.extend(body);
        msg
    }

    /// `payload` as handshake records of at most `size` bytes each.
    fn records_of(payload: &[u8], size: usize) -> Vec<u8> {
        payload.chunks(size).flat_map(|c| rec(22, c)).collect()
    }

    #[test]
    fn the_server_random_is_found_however_the_flight_is_split() {
        let hrr = server_hello(mbx_wire::hello::HELLO_RETRY_REQUEST_RANDOM);
        let flight = [hrr, server_hello([7; 32])].concat();
        for size in [1, 3, flight.len()] {
            let stream = [rec(20, &[1]), records_of(&flight, size)].concat();
            // Fed one byte at a time, and all at once.
            let mut w = ServerRandomWatch::new();
            for b in &stream {
                w.feed(core::slice::from_ref(b));
            }
            assert_eq!(w.random(), Some([7; 32]), "{size}");
            let mut w = ServerRandomWatch::new();
            w.feed(&stream);
            assert_eq!(w.random(), Some([7; 32]), "{size}");
        }
    }

    #[test]
    fn the_watch_gives_up_on_what_cannot_precede_a_server_hello_and_past_its_cap() {
        let hello = records_of(&server_hello([7; 32]), 16);
        for before in [rec(23, b"data"), rec(21, &[2, 40]), vec![99, 3, 3, 0, 1, 0]] {
            let mut w = ServerRandomWatch::new();
            w.feed(&before);
            w.feed(&hello);
            assert_eq!(w.random(), None);
        }
        // A ServerHello announced at 64 KB, sent one byte per record, past the cap.
        let mut w = ServerRandomWatch::new();
        w.feed(&rec(22, &[2, 1, 0, 0]));
        for _ in 0..SERVER_FLIGHT_CAP / 6 {
            w.feed(&rec(22, &[0]));
        }
        assert_eq!(w.outcome, Watch::GaveUp);
        assert!(w.partial.capacity() == 0 && w.messages.buffered() == 0);
        w.feed(&hello);
        assert_eq!(w.random(), None);
        // A ServerHello at the start of one feed larger than the cap is still found.
        let mut w = ServerRandomWatch::new();
        w.feed(&[hello.clone(), rec(23, &vec![0; 16_000]).repeat(5)].concat());
        assert_eq!(w.random(), Some([7; 32]));
    }

    proptest::proptest! {
        /// Whatever the bytes and however they are split, the watch finds what it finds in
        /// them whole (within its cap), and never panics.
        #[test]
        fn the_watch_depends_on_the_bytes_not_their_split(
            stream in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..600),
            hello_first in proptest::prelude::any::<bool>(),
            hello_at in 0usize..600,
            cuts in proptest::collection::vec(1usize..64, 1..40),
        ) {
            // A ServerHello in pieces, first in half the runs (then it is found), elsewhere
            // in the noise in the others (where the watch usually gives up before it).
            let mut stream = stream;
            let at = if hello_first { 0 } else { hello_at.min(stream.len()) };
            stream.splice(at..at, records_of(&server_hello([9; 32]), 7));
            let mut whole = ServerRandomWatch::new();
            whole.feed(&stream);
            let mut pieces = ServerRandomWatch::new();
            let mut rest = stream.as_slice();
            for cut in cuts.iter().cycle() {
                if rest.is_empty() {
                    break;
                }
                let (piece, tail) = rest.split_at((*cut).min(rest.len()));
                pieces.feed(piece);
                rest = tail;
            }
            proptest::prop_assert_eq!(whole.random(), pieces.random());
            proptest::prop_assert_eq!(whole.outcome, pieces.outcome);
            if hello_first {
                proptest::prop_assert_eq!(whole.random(), Some([9; 32]));
            }
        }
    }

    #[test]
    fn handshake_message_reassembled_across_records() {
        let mut msg = vec![1, 0, 0, 40];
        msg.extend((0..40u8).collect::<Vec<_>>());
        let mut s = rec(22, &msg[..10]);
        s.extend(rec(22, &msg[10..]));
        let (m, used) = first_handshake_message(&s, 1).unwrap().unwrap();
        assert_eq!(m, msg);
        assert_eq!(used, s.len());
        assert_eq!(first_handshake_message(&s[..s.len() - 1], 1).unwrap(), None);
    }
}
