//! TLS 1.3 KeyUpdate across hops (RFC 8446 §4.6.3, §7.2).
//!
//! Every hop carries the traffic secrets its keys derive from (the key material sends them),
//! so a KeyUpdate is followed hop by hop: a node that receives one from a neighbour reads that
//! neighbour's next records under the next generation of its keys; a middlebox forwards the
//! KeyUpdate under the old keys of its other hop and then updates those too, so the message
//! crosses the whole path and every hop moves on. An endpoint asked to update
//! (`update_requested`) answers with its own KeyUpdate, which crosses the path the other way.
//! Post-handshake messages are reassembled across records here only to find KeyUpdates; the
//! records themselves are forwarded as they came.

use mbx_engine::AlertDescription;
use mbx_wire::handshake::DEFAULT_MAX_HANDSHAKE_LEN;
use mbx_wire::{HandshakeDeframer, HandshakeMessage, HandshakeType, WireError};

/// `KeyUpdate` with `request_update` = `update_requested` (1) or `update_not_requested` (0).
pub(crate) fn key_update_message(request_peer: bool) -> Result<Vec<u8>, WireError> {
    let body = [u8::from(request_peer)];
    HandshakeMessage::new(HandshakeType::KEY_UPDATE, &body).map(HandshakeMessage::into_bytes)
}

/// Why a post-handshake record ends the session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Violation {
    pub alert: AlertDescription,
    pub what: &'static str,
}

/// The post-handshake messages one neighbour sends (TLS 1.3 handshake records after the
/// handshake), reassembled across records.
#[derive(Debug)]
pub(crate) struct PostHandshake {
    deframer: HandshakeDeframer,
}

impl PostHandshake {
    pub(crate) fn new() -> Self {
        PostHandshake {
            deframer: HandshakeDeframer::new(DEFAULT_MAX_HANDSHAKE_LEN),
        }
    }

    /// Bytes of buffer capacity the reassembly holds.
    pub(crate) fn held_capacity(&self) -> usize {
        self.deframer.capacity()
    }

    /// Whether a handshake message has begun and not ended: until it ends, a record of another
    /// type is refused (RFC 8446 §5.1: handshake messages must not be interleaved with other
    /// record types; found in an adversarial trial, which split a KeyUpdate around a data
    /// record and then a message around a close_notify, and both went through).
    pub(crate) fn mid_message(&self) -> bool {
        self.deframer.buffered() > 0
    }

    /// Gives back the reassembly buffer's memory when it holds no partial message (a driver
    /// calls it on an idle connection).
    pub(crate) fn release_idle_buffer(&mut self) {
        if self.deframer.buffered() == 0 {
            self.deframer = HandshakeDeframer::new(DEFAULT_MAX_HANDSHAKE_LEN);
        }
    }

    /// The plaintext of one handshake record. Every complete message other than a KeyUpdate
    /// goes to `other`, which may refuse it. `Some(requested)` when the record ends with a
    /// KeyUpdate: the sender's next record is under its next keys. A KeyUpdate must end its
    /// record (a key change, RFC 8446 §5.1) and carry 0 or 1.
    pub(crate) fn record(
        &mut self,
        plaintext: &[u8],
        mut other: impl FnMut(&HandshakeMessage) -> Result<(), Violation>,
    ) -> Result<Option<bool>, Violation> {
        self.deframer.push(plaintext);
        let mut update = None;
        loop {
            let msg = match self.deframer.next_message() {
                Ok(Some(m)) => m,
                Ok(None) => break,
                Err(_) => {
                    return Err(Violation {
                        alert: AlertDescription::DECODE_ERROR,
                        what: "bad post-handshake message framing",
                    })
                }
            };
            if update.is_some() {
                return Err(NOT_AT_RECORD_END);
            }
            if msg.typ() != HandshakeType::KEY_UPDATE {
                other(&msg)?;
                continue;
            }
            update = Some(match msg.body() {
                [0] => false,
                [1] => true,
                _ => {
                    return Err(Violation {
                        alert: AlertDescription::ILLEGAL_PARAMETER,
                        what: "malformed KeyUpdate",
                    })
                }
            });
        }
        if update.is_some() && self.deframer.buffered() > 0 {
            return Err(NOT_AT_RECORD_END);
        }
        Ok(update)
    }
}

/// A record of another type while a handshake message is unfinished
/// ([`PostHandshake::mid_message`]).
pub(crate) const INTERLEAVED: Violation = Violation {
    alert: AlertDescription::UNEXPECTED_MESSAGE,
    what: "a record of another type inside a handshake message (RFC 8446 §5.1)",
};

const NOT_AT_RECORD_END: Violation = Violation {
    alert: AlertDescription::UNEXPECTED_MESSAGE,
    what: "KeyUpdate not at the end of its record",
};

#[cfg(test)]
mod tests {
    use super::*;

    fn ticket() -> Vec<u8> {
        vec![4, 0, 0, 2, 9, 9]
    }

    #[test]
    fn finds_a_key_update_at_the_end_of_a_record_only() {
        let none = |_: &HandshakeMessage| Ok(());
        let mut p = PostHandshake::new();
        let (ask, ku) = (
            key_update_message(true).unwrap(),
            key_update_message(false).unwrap(),
        );
        assert_eq!(
            (&ask[..], &ku[..]),
            (&[24, 0, 0, 1, 1][..], &[24, 0, 0, 1, 0][..])
        );
        assert_eq!(p.record(&ask, none), Ok(Some(true)));
        assert_eq!(
            p.record(&[ticket(), ku.clone()].concat(), none),
            Ok(Some(false))
        );
        // Split across records: found with its last byte.
        assert_eq!(p.record(&ku[..2], none), Ok(None));
        assert_eq!(p.record(&ku[2..], none), Ok(Some(false)));
        // Followed by a message, or by the start of one, in the same record.
        for tail in [ticket(), ticket()[..2].to_vec()] {
            let mut p = PostHandshake::new();
            let rec = [ku.clone(), tail].concat();
            assert_eq!(p.record(&rec, none), Err(NOT_AT_RECORD_END));
        }
        // request_update other than 0 or 1, or a longer body.
        let mut p = PostHandshake::new();
        assert_eq!(
            p.record(&[24, 0, 0, 1, 2], none).map_err(|v| v.alert),
            Err(AlertDescription::ILLEGAL_PARAMETER)
        );
        let mut p = PostHandshake::new();
        assert!(p.record(&[24, 0, 0, 2, 0, 0], none).is_err());
    }

    #[test]
    fn other_messages_go_to_the_callback_which_may_refuse_them() {
        let mut seen = Vec::new();
        let mut p = PostHandshake::new();
        let r = p.record(&ticket(), |msg| {
            seen.push((msg.typ(), msg.as_bytes().to_vec()));
            Ok(())
        });
        assert_eq!(
            (r, seen),
            (
                Ok(None),
                vec![(HandshakeType::NEW_SESSION_TICKET, ticket())]
            )
        );
        let refuse = Violation {
            alert: AlertDescription::UNEXPECTED_MESSAGE,
            what: "no",
        };
        assert_eq!(p.record(&ticket(), |_| Err(refuse)), Err(refuse));
    }
}
