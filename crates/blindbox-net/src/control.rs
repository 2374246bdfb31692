//! Hop-local control messages (stream 2) between an endpoint and the middlebox:
//! `type: u8 | body`.
//!
//! | type | name | direction | body |
//! |---|---|---|---|
//! | 1 | HandshakeDone | endpoint → middlebox | tokenization u8 (0 window, 1 delimiter), case u8 (0 exact, 1 dual), privacy u8 (0 exact match, 1 probable cause) |
//! | 2 | Ready | middlebox → endpoint | empty |
//! | 3 | Refused | middlebox → endpoint | UTF-8 reason (≤ 255 bytes) |
//! | 4 | Abort | endpoint → middlebox | UTF-8 reason (≤ 255 bytes): the endpoint's side of the rule setup failed |
//!
//! The parameters in `HandshakeDone` are what the endpoint will use on the token channel: the
//! middlebox needs the tokenization to choose its rule chunks before the setup, and refuses the
//! connection when the two endpoints disagree (they would fail validation anyway).

use mbx_blindbox::channel::Privacy;
use mbx_blindbox::flow::FlowConfig;
use mbx_blindbox::tokenize::{CaseMode, Tokenization};

use crate::NetError;

/// What an endpoint announces it will use on the token channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Params {
    pub tokenization: Tokenization,
    pub case: CaseMode,
    pub privacy: Privacy,
}

impl From<&FlowConfig> for Params {
    fn from(f: &FlowConfig) -> Self {
        Params {
            tokenization: f.tokenization,
            case: f.case,
            privacy: f.privacy,
        }
    }
}

impl std::fmt::Display for Params {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} tokenization, {} case, {} privacy",
            self.tokenization, self.case, self.privacy
        )
    }
}

impl Params {
    fn encode(&self) -> [u8; 3] {
        [
            match self.tokenization {
                Tokenization::Window => 0,
                Tokenization::Delimiter => 1,
            },
            match self.case {
                CaseMode::Exact => 0,
                CaseMode::Dual => 1,
            },
            match self.privacy {
                Privacy::ExactMatch => 0,
                Privacy::ProbableCause => 1,
            },
        ]
    }

    fn decode(b: &[u8]) -> Option<Self> {
        let [t, c, p] = b else { return None };
        Some(Params {
            tokenization: match t {
                0 => Tokenization::Window,
                1 => Tokenization::Delimiter,
                _ => return None,
            },
            case: match c {
                0 => CaseMode::Exact,
                1 => CaseMode::Dual,
                _ => return None,
            },
            privacy: match p {
                0 => Privacy::ExactMatch,
                1 => Privacy::ProbableCause,
                _ => return None,
            },
        })
    }
}

/// One control message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Control {
    HandshakeDone(Params),
    Ready,
    Refused(String),
    Abort(String),
}

fn put_reason(v: &mut Vec<u8>, why: &str) {
    v.extend_from_slice(mbx_wire::text_prefix(why, 255).as_bytes());
}

fn reason(why: &[u8]) -> Result<String, NetError> {
    if why.len() > 255 {
        return Err(NetError::Protocol("control message: reason too long"));
    }
    String::from_utf8(why.to_vec())
        .map_err(|_| NetError::Protocol("control message: reason is not UTF-8"))
}

impl Control {
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Control::HandshakeDone(p) => {
                let mut v = vec![1];
                v.extend_from_slice(&p.encode());
                v
            }
            Control::Ready => vec![2],
            Control::Refused(why) => {
                let mut v = vec![3];
                put_reason(&mut v, why);
                v
            }
            Control::Abort(why) => {
                let mut v = vec![4];
                put_reason(&mut v, why);
                v
            }
        }
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, NetError> {
        match bytes.split_first() {
            Some((1, p)) => Params::decode(p)
                .map(Control::HandshakeDone)
                .ok_or(NetError::Protocol("malformed HandshakeDone")),
            Some((2, [])) => Ok(Control::Ready),
            Some((3, why)) => Ok(Control::Refused(reason(why)?)),
            Some((4, why)) => Ok(Control::Abort(reason(why)?)),
            _ => Err(NetError::Protocol("malformed control message")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_refusals() {
        let params = Params {
            tokenization: Tokenization::Delimiter,
            case: CaseMode::Dual,
            privacy: Privacy::ProbableCause,
        };
        for c in [
            Control::HandshakeDone(params),
            Control::Ready,
            Control::Refused("rule setup failed".into()),
            Control::Abort("too many chunks".into()),
        ] {
            assert_eq!(Control::decode(&c.encode()).unwrap(), c);
        }
        assert_eq!(
            Control::decode(&[1, 0, 0, 0]).unwrap(),
            Control::HandshakeDone(Params {
                tokenization: Tokenization::Window,
                case: CaseMode::Exact,
                privacy: Privacy::ExactMatch,
            })
        );
        for bad in [
            &[][..],
            &[1],
            &[1, 0, 0],
            &[1, 2, 0, 0],
            &[1, 0, 0, 0, 0],
            &[2, 1],
            &[5],
            &[3, 0xff],
            &[4, 0xc3],
        ] {
            assert!(Control::decode(bad).is_err(), "{bad:?}");
        }
        let long = "é".repeat(200);
        for enc in [
            Control::Refused(long.clone()).encode(),
            Control::Abort(long).encode(),
        ] {
            assert!(enc.len() <= 256);
            assert!(Control::decode(&enc).is_ok());
        }
        let mut too_long = vec![3];
        too_long.extend_from_slice(&[b'a'; 256]);
        assert!(Control::decode(&too_long).is_err());
    }
}
