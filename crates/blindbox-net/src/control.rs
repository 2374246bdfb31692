//! Hop-local control messages (stream 2) between an endpoint and the middlebox:
//! `type: u8 | body`.
//!
//! | type | name | direction | body |
//! |---|---|---|---|
//! | 1 | HandshakeDone | endpoint → middlebox | empty |
//! | 2 | Ready | middlebox → endpoint | empty |
//! | 3 | Refused | middlebox → endpoint | UTF-8 reason (≤ 255 bytes) |

use crate::NetError;

/// One control message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Control {
    HandshakeDone,
    Ready,
    Refused(String),
}

impl Control {
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Control::HandshakeDone => vec![1],
            Control::Ready => vec![2],
            Control::Refused(why) => {
                let mut v = vec![3];
                let mut end = why.len().min(255);
                while !why.is_char_boundary(end) {
                    end -= 1;
                }
                v.extend_from_slice(why.get(..end).unwrap_or_default().as_bytes());
                v
            }
        }
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, NetError> {
        match bytes.split_first() {
            Some((1, [])) => Ok(Control::HandshakeDone),
            Some((2, [])) => Ok(Control::Ready),
            Some((3, why)) if why.len() <= 255 => Ok(Control::Refused(
                String::from_utf8(why.to_vec())
                    .map_err(|_| NetError::Protocol("control message: reason is not UTF-8"))?,
            )),
            _ => Err(NetError::Protocol("malformed control message")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_refusals() {
        for c in [
            Control::HandshakeDone,
            Control::Ready,
            Control::Refused("rule setup failed".into()),
        ] {
            assert_eq!(Control::decode(&c.encode()).unwrap(), c);
        }
        for bad in [&[][..], &[1, 0], &[2, 1], &[4], &[3, 0xff]] {
            assert!(Control::decode(bad).is_err(), "{bad:?}");
        }
        let long = "é".repeat(200);
        let enc = Control::Refused(long).encode();
        assert!(enc.len() <= 256);
        assert!(Control::decode(&enc).is_ok());
    }
}
