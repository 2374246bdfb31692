//! Messages on a secondary session's application-data stream.
//!
//! After its secondary handshake a middlebox sends attestation evidence, and the endpoint
//! answers with key material; both travel as application data of the secondary TLS session
//! (so encrypted under the secondary keys, inside encapsulated records). No TLS engine lets us
//! add record or handshake types, so the stream is framed by us:
//! ```text
//! uint8  msg_type      /* 17 = evidence, 18 = path, 19 = refused, 31 = key material */
//! uint24 length
//! opaque body[length]
//! ```
//! 17 is the paper's `sgx_attestation` handshake number and 31 its key-material record type.
//! An evidence body is `mbx-attest`'s evidence encoding; an empty one means "no evidence".
//! A path body (ours, sent right before the key material) is one byte: 1 if a middlebox
//! farther from the endpoint joined too (so this one waits for its switch marker), else 0.
//! A refused body (ours) is UTF-8 text, why the endpoint refused the middlebox (its evidence,
//! its approval), sent instead of the key material before the endpoint closes the session.

use mbx_wire::{Reader, WireError, Writer};
use zeroize::Zeroizing;

use super::{malformed, KeyMaterial, MAX_KEY_MATERIAL_LEN};

/// Message type of attestation evidence.
pub const MSG_EVIDENCE: u8 = 17;
/// Message type of the path message (whether a middlebox farther from the endpoint joined).
pub const MSG_PATH: u8 = 18;
/// Message type of a refusal: why the endpoint gives the middlebox no key material.
pub const MSG_REFUSED: u8 = 19;
/// Message type of key material.
pub const MSG_KEY_MATERIAL: u8 = 31;
/// Longest refusal text sent (longer is cut at a character boundary) and accepted.
pub const MAX_REFUSED_LEN: usize = 1024;
/// Largest evidence body accepted (mbx-attest's evidence is at most 192 KiB).
pub const MAX_EVIDENCE_LEN: usize = 256 * 1024;

/// One message of the secondary stream.
#[derive(Debug, Clone)]
pub enum SecondaryMessage {
    /// Attestation evidence bytes (empty: the middlebox has none).
    Evidence(Vec<u8>),
    /// Sent by the endpoint right before the key material: whether a middlebox farther from
    /// the endpoint than the receiver (on the receiver's side of the path) joined too. Only
    /// then does the receiver, after its switch, wait for that middlebox's marker and leave the
    /// records it forwarded raw to that middlebox's replay. A middlebox that was offered a
    /// subchannel but excluded does not count. `ticket_wanted`: the endpoint keeps the
    /// receiver's TLS 1.3 session ticket, so the receiver sends the ticket it holds right
    /// before its switch marker; without it the ticket is dropped. The endpoint asks only when
    /// it resumes this middlebox's sessions and no middlebox nearer it joined (that one
    /// switches first and would take the ticket for the receiver's marker; docs/mbtls.md §4.7).
    /// Encoded as one flags byte: bit 0 far, bit 1 ticket.
    Path {
        far_neighbour_joined: bool,
        ticket_wanted: bool,
    },
    KeyMaterial(Box<KeyMaterial>),
    /// Sent by the endpoint instead of the path message and key material when it refuses the
    /// middlebox (its evidence, or its approval), right before it closes the secondary
    /// session: why, as text for the middlebox's report (so its operator learns more than
    /// "closed"). Cut to [`MAX_REFUSED_LEN`] bytes when encoded.
    Refused(String),
}

impl SecondaryMessage {
    /// Encode; zeroized on drop since key material is secret.
    pub fn encode(&self) -> Result<Zeroizing<Vec<u8>>, WireError> {
        let mut out = Zeroizing::new(Vec::with_capacity(self.max_encoded_len()));
        self.encode_into(&mut out)?;
        Ok(out)
    }

    /// The most bytes [`Self::encode_into`] appends. A buffer for secret messages is sized with
    /// it up front: one that grew would leave parts of the key material in the allocations it
    /// outgrew, which `Zeroizing` does not wipe.
    pub fn max_encoded_len(&self) -> usize {
        4 + match self {
            SecondaryMessage::Evidence(e) => e.len(),
            SecondaryMessage::Path { .. } => 1,
            SecondaryMessage::KeyMaterial(_) => MAX_KEY_MATERIAL_LEN,
            SecondaryMessage::Refused(why) => why.len().min(MAX_REFUSED_LEN),
        }
    }

    /// Appends the encoding to `out` (see [`Self::max_encoded_len`] for its capacity).
    pub fn encode_into(&self, out: &mut Vec<u8>) -> Result<(), WireError> {
        let mut w = Writer::new(out);
        match self {
            SecondaryMessage::Evidence(e) => {
                if e.len() > MAX_EVIDENCE_LEN {
                    return Err(WireError::TooLong {
                        len: e.len(),
                        max: MAX_EVIDENCE_LEN,
                    });
                }
                w.u8(MSG_EVIDENCE);
                w.vec_u24(e)?;
            }
            SecondaryMessage::Path {
                far_neighbour_joined,
                ticket_wanted,
            } => {
                w.u8(MSG_PATH);
                let flags = u8::from(*far_neighbour_joined) | u8::from(*ticket_wanted) << 1;
                w.vec_u24(&[flags])?;
            }
            SecondaryMessage::KeyMaterial(km) => {
                let body = km.encode()?;
                w.u8(MSG_KEY_MATERIAL);
                w.vec_u24(&body)?;
            }
            SecondaryMessage::Refused(why) => {
                w.u8(MSG_REFUSED);
                w.vec_u24(mbx_wire::text_prefix(why, MAX_REFUSED_LEN).as_bytes())?;
            }
        }
        Ok(())
    }
}

/// Reassembles secondary messages from decrypted application data in any split. Errors are
/// sticky; buffered bytes are zeroized.
#[derive(Debug, Default)]
pub struct SecondaryReader {
    buf: Zeroizing<Vec<u8>>,
    failed: Option<WireError>,
}

impl SecondaryReader {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn push(&mut self, data: &[u8]) {
        if self.failed.is_none() {
            // Grown without leaving a copy of buffered key material in freed memory.
            mbx_record::wipe::reserve(&mut self.buf, data.len());
            self.buf.extend_from_slice(data);
        }
    }

    /// Bytes buffered but not yet returned.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// The next complete message, `Ok(None)` if more bytes are needed.
    pub fn next_message(&mut self) -> Result<Option<SecondaryMessage>, WireError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        match self.try_next() {
            Ok(m) => Ok(m),
            Err(e) => {
                self.buf.clear();
                self.failed = Some(e.clone());
                Err(e)
            }
        }
    }

    fn try_next(&mut self) -> Result<Option<SecondaryMessage>, WireError> {
        let mut r = Reader::new(&self.buf);
        let (Ok(typ), Ok(len)) = (r.u8(), r.u24()) else {
            return Ok(None);
        };
        let len = len as usize;
        let max = match typ {
            MSG_EVIDENCE => MAX_EVIDENCE_LEN,
            MSG_PATH => 1,
            MSG_KEY_MATERIAL => MAX_KEY_MATERIAL_LEN,
            MSG_REFUSED => MAX_REFUSED_LEN,
            _ => return Err(malformed("unknown secondary message type")),
        };
        if len > max {
            return Err(WireError::TooLong { len, max });
        }
        let Ok(body) = r.take(len) else {
            return Ok(None);
        };
        let msg = match typ {
            MSG_EVIDENCE => SecondaryMessage::Evidence(body.to_vec()),
            MSG_PATH => match body {
                [flags @ 0..=3] => SecondaryMessage::Path {
                    far_neighbour_joined: flags & 1 != 0,
                    ticket_wanted: flags & 2 != 0,
                },
                _ => return Err(malformed("path message body")),
            },
            // Text for a report: whatever it holds is shown, never interpreted.
            MSG_REFUSED => SecondaryMessage::Refused(String::from_utf8_lossy(body).into_owned()),
            _ => SecondaryMessage::KeyMaterial(Box::new(KeyMaterial::decode(body)?)),
        };
        let used = 4 + len;
        let rest = Zeroizing::new(self.buf.get(used..).unwrap_or(&[]).to_vec());
        self.buf = rest;
        Ok(Some(msg))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::HopKeys;
    use mbx_record::{CipherSuite, TlsVersion};

    #[test]
    fn messages_reassembled_byte_by_byte() {
        let s = CipherSuite::TLS13_CHACHA20_POLY1305_SHA256;
        let km = KeyMaterial {
            version: TlsVersion::Tls13,
            suite: s,
            toward_client: HopKeys::generate(TlsVersion::Tls13, &s, 0, 1).unwrap(),
            toward_server: HopKeys::generate(TlsVersion::Tls13, &s, 2, 3).unwrap(),
        };
        let mut stream = SecondaryMessage::Evidence(b"evidence".to_vec())
            .encode()
            .unwrap()
            .to_vec();
        for far_neighbour_joined in [true, false] {
            stream.extend_from_slice(
                &SecondaryMessage::Path {
                    far_neighbour_joined,
                    ticket_wanted: !far_neighbour_joined,
                }
                .encode()
                .unwrap(),
            );
        }
        stream.extend_from_slice(
            &SecondaryMessage::KeyMaterial(Box::new(km.clone()))
                .encode()
                .unwrap(),
        );
        let mut r = SecondaryReader::new();
        let mut got = Vec::new();
        for b in &stream {
            r.push(&[*b]);
            while let Some(m) = r.next_message().unwrap() {
                got.push(m);
            }
        }
        assert_eq!(got.len(), 4);
        assert!(matches!(&got[0], SecondaryMessage::Evidence(e) if e == b"evidence"));
        assert!(matches!(
            got[1],
            SecondaryMessage::Path {
                far_neighbour_joined: true,
                ticket_wanted: false
            }
        ));
        assert!(matches!(
            got[2],
            SecondaryMessage::Path {
                far_neighbour_joined: false,
                ticket_wanted: true
            }
        ));
        match &got[3] {
            SecondaryMessage::KeyMaterial(k) => {
                assert_eq!(k.encode().unwrap(), km.encode().unwrap())
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(r.buffered(), 0);
    }

    #[test]
    fn unknown_type_and_oversize_are_sticky_errors() {
        let mut r = SecondaryReader::new();
        r.push(&[99, 0, 0, 0]);
        assert!(r.next_message().is_err());
        r.push(&[17, 0, 0, 0]);
        assert!(r.next_message().is_err());
        let mut r = SecondaryReader::new();
        r.push(&[31, 0, 2, 1]);
        assert!(matches!(r.next_message(), Err(WireError::TooLong { .. })));
        let mut r = SecondaryReader::new();
        r.push(&[31, 0, 0, 1, 0]);
        assert!(r.next_message().is_err());
        // A path body is one byte, flags 0 to 3.
        for bad in [&[18, 0, 0, 1, 4][..], &[18, 0, 0, 2, 1, 1], &[18, 0, 0, 0]] {
            let mut r = SecondaryReader::new();
            r.push(bad);
            assert!(r.next_message().is_err(), "{bad:?}");
        }
    }
}
