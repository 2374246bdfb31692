//! The MiddleboxSupport ClientHello extension ([`super::MIDDLEBOX_SUPPORT_EXTENSION`]).
//!
//! ```text
//! uint8  num_hellos
//! uint16 hello_lengths[num_hellos]
//! opaque client_hellos[sum of hello_lengths]   /* each a complete ClientHello handshake message */
//! uint8  num_mboxes
//! { uint8 length; opaque identity[length]; } middleboxes[num_mboxes]
//! ```
//! The optimistic ClientHellos come from independent client engines, one per middlebox the
//! client expects to accept; a middlebox answers one of them with its secondary ServerHello.
//! Identities are "host:port" or DNS names: 1–255 visible ASCII bytes (no spaces or controls,
//! so they are safe to log and to compare).

use mbx_wire::{ClientHello, Reader, WireError, Writer};

use super::malformed;

/// Longest middlebox identity.
pub const MAX_IDENTITY_LEN: usize = 255;

/// The extension's content.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MiddleboxSupport {
    /// Complete ClientHello handshake messages (4-byte header included).
    pub client_hellos: Vec<Vec<u8>>,
    /// Middleboxes the client knows a priori, in path order.
    pub middleboxes: Vec<String>,
}

fn check_identity(id: &[u8]) -> Result<(), WireError> {
    if id.is_empty() || id.len() > MAX_IDENTITY_LEN {
        return Err(malformed("middlebox identity length"));
    }
    if !id.iter().all(|b| (0x21..=0x7e).contains(b)) {
        return Err(malformed("middlebox identity is not visible ASCII"));
    }
    Ok(())
}

fn check_hello(h: &[u8]) -> Result<(), WireError> {
    ClientHello::parse_message(h).map(|_| ())
}

impl MiddleboxSupport {
    /// Encode as extension data (at most 65535 bytes).
    pub fn encode(&self) -> Result<Vec<u8>, WireError> {
        let n_hellos = u8::try_from(self.client_hellos.len())
            .map_err(|_| malformed("more than 255 optimistic ClientHellos"))?;
        let n_mboxes = u8::try_from(self.middleboxes.len())
            .map_err(|_| malformed("more than 255 middleboxes"))?;
        let mut out = Vec::new();
        let mut w = Writer::new(&mut out);
        w.u8(n_hellos);
        for h in &self.client_hellos {
            check_hello(h)?;
            let len = u16::try_from(h.len()).map_err(|_| WireError::TooLong {
                len: h.len(),
                max: usize::from(u16::MAX),
            })?;
            w.u16(len);
        }
        for h in &self.client_hellos {
            w.bytes(h);
        }
        w.u8(n_mboxes);
        for m in &self.middleboxes {
            check_identity(m.as_bytes())?;
            w.vec_u8(m.as_bytes())?;
        }
        if out.len() > usize::from(u16::MAX) {
            return Err(WireError::TooLong {
                len: out.len(),
                max: usize::from(u16::MAX),
            });
        }
        Ok(out)
    }

    /// Decode extension data from an untrusted ClientHello.
    pub fn parse(data: &[u8]) -> Result<Self, WireError> {
        let mut r = Reader::new(data);
        let n = usize::from(r.u8()?);
        let mut lens = Vec::with_capacity(n);
        for _ in 0..n {
            lens.push(usize::from(r.u16()?));
        }
        let mut client_hellos = Vec::with_capacity(n);
        for len in lens {
            let h = r.take(len)?;
            check_hello(h)?;
            client_hellos.push(h.to_vec());
        }
        let m = usize::from(r.u8()?);
        let mut middleboxes = Vec::with_capacity(m);
        for _ in 0..m {
            let id = r.vec_u8()?;
            check_identity(id)?;
            let s = core::str::from_utf8(id).map_err(|_| malformed("middlebox identity"))?;
            middleboxes.push(s.to_owned());
        }
        r.finish()?;
        Ok(MiddleboxSupport {
            client_hellos,
            middleboxes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal well-formed ClientHello message.
    pub(crate) fn hello(tag: u8) -> Vec<u8> {
        let mut body = vec![3, 3];
        body.extend([tag; 32]);
        body.push(0); // session id
        body.extend([0, 2, 0x13, 0x01]); // suites
        body.extend([1, 0]); // compression
        let mut msg = vec![1, 0, 0, body.len() as u8];
        msg.extend(body);
        msg
    }

    #[test]
    fn exact_layout_and_round_trip() {
        let ext = MiddleboxSupport {
            client_hellos: vec![hello(1), hello(2)],
            middleboxes: vec!["mb.example:443".into()],
        };
        let enc = ext.encode().unwrap();
        let h = hello(1).len() as u16;
        let mut want = vec![2];
        want.extend(h.to_be_bytes());
        want.extend(h.to_be_bytes());
        want.extend(hello(1));
        want.extend(hello(2));
        want.push(1);
        want.push(14);
        want.extend(b"mb.example:443");
        assert_eq!(enc, want);
        assert_eq!(MiddleboxSupport::parse(&enc).unwrap(), ext);
        let empty = MiddleboxSupport::default();
        assert_eq!(empty.encode().unwrap(), [0, 0]);
        assert_eq!(MiddleboxSupport::parse(&[0, 0]).unwrap(), empty);
    }

    #[test]
    fn rejects_bad_content() {
        assert!(MiddleboxSupport::parse(&[]).is_err());
        assert!(MiddleboxSupport::parse(&[0]).is_err());
        assert!(MiddleboxSupport::parse(&[0, 0, 0]).is_err());
        assert!(MiddleboxSupport::parse(&[0, 1, 0]).is_err());
        assert!(MiddleboxSupport::parse(&[0, 1, 2, b'a', b' ']).is_err());
        assert!(MiddleboxSupport::parse(&[1, 0, 4, 2, 0, 0, 0, 0]).is_err()); // not a ClientHello
        let mut bad = hello(1);
        bad.push(0);
        let ext = MiddleboxSupport {
            client_hellos: vec![bad],
            middleboxes: vec![],
        };
        assert!(ext.encode().is_err());
        let ext = MiddleboxSupport {
            client_hellos: vec![],
            middleboxes: vec!["a\nb".into()],
        };
        assert!(ext.encode().is_err());
        let ext = MiddleboxSupport {
            client_hellos: vec![],
            middleboxes: vec!["x".repeat(256)],
        };
        assert!(ext.encode().is_err());
    }
}
