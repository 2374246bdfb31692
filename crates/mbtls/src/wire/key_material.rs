//! `MBTLSKeyMaterial`: the keys of a middlebox's two adjacent hops.
//!
//! Names follow the paper and are from the **middlebox's** point of view: `client*` keys
//! protect the hop toward the client, `server*` keys the hop toward the server; `Write` is what
//! the middlebox sends on that hop, `Read` what it receives. So
//! `clientRead` = client→server data on the client-side hop, `clientWrite` = server→client data
//! on it, `serverWrite` = client→server data on the server-side hop, `serverRead` =
//! server→client data on it.
//!
//! TLS 1.2 (paper Appendix A, byte for byte):
//! ```text
//! uint16 version = 0x0303
//! uint64 client_to_server_sequence     /* next record, every hop */
//! uint64 server_to_client_sequence
//! uint16 cipher_suite
//! uint32 key_len                       /* = the suite's AEAD key length */
//! uint32 iv_len                        /* = 4 (AES-GCM salt) or 12 (ChaCha20-Poly1305) */
//! clientWriteKey, clientWriteIV, clientReadKey, clientReadIV,
//! serverWriteKey, serverWriteIV, serverReadKey, serverReadIV
//! ```
//! One sequence number per direction: all hops of a direction must start at the same number.
//!
//! TLS 1.3 (ours; the same fields, with a sequence number per direction of each hop, and the
//! traffic secret each key and IV derive from):
//! ```text
//! uint16 version = 0x0304
//! uint16 cipher_suite                  /* 0x1301 | 0x1302 | 0x1303 */
//! uint32 key_len                       /* = the suite's AEAD key length */
//! uint32 iv_len                        /* = 12 */
//! uint32 secret_len                    /* = the suite's hash length (32 or 48) */
//! { opaque key[key_len]; opaque iv[iv_len]; uint64 next_sequence;
//!   opaque traffic_secret[secret_len]; }
//!     client_write, client_read, server_write, server_read   /* in this order */
//! ```
//! Keys and IVs are the record-layer key and IV, HKDF-Expand-Label "key"/"iv" of the traffic
//! secret beside them (RFC 8446 §7.3): with the secrets, both ends of every hop follow a
//! KeyUpdate (§7.2). Unknown versions, suites that do not match the version, wrong lengths and
//! trailing bytes are rejected.

use mbx_record::{CipherSuite, TlsVersion, TrafficKeys};
use mbx_wire::{version, Reader, WireError, Writer};
use zeroize::Zeroizing;

use super::malformed;
use crate::keys::{iv_len, DirectionKeys, HopKeys, TrafficSecret};

/// Upper bound of an encoded key material message (TLS 1.3, 32-byte keys and 48-byte secrets:
/// 416 bytes).
pub const MAX_KEY_MATERIAL_LEN: usize = 512;

/// The keys a middlebox needs to join the session.
#[derive(Debug, Clone)]
pub struct KeyMaterial {
    pub version: TlsVersion,
    pub suite: CipherSuite,
    /// The hop between the middlebox and its neighbour toward the client.
    pub toward_client: HopKeys,
    /// The hop between the middlebox and its neighbour toward the server.
    pub toward_server: HopKeys,
}

impl KeyMaterial {
    /// The four directions in wire order: client write, client read, server write, server read.
    fn wire_order(&self) -> [&DirectionKeys; 4] {
        [
            &self.toward_client.s2c,
            &self.toward_client.c2s,
            &self.toward_server.c2s,
            &self.toward_server.s2c,
        ]
    }

    /// Encode (the result holds keys, so it is zeroized on drop).
    pub fn encode(&self) -> Result<Zeroizing<Vec<u8>>, WireError> {
        if self.suite.version != self.version {
            return Err(malformed("cipher suite does not match version"));
        }
        let key_len = self.suite.aead.key_len();
        let iv_len = iv_len(self.version, &self.suite);
        for d in self.wire_order() {
            if d.keys.aead() != self.suite.aead
                || d.keys.key().len() != key_len
                || d.keys.iv().len() != iv_len
            {
                return Err(malformed("key or IV does not fit the cipher suite"));
            }
            let secret_fits = match (&d.secret, self.version) {
                (Some(s), TlsVersion::Tls13) => s.suite() == self.suite,
                (None, TlsVersion::Tls12) => true,
                _ => false,
            };
            if !secret_fits {
                return Err(malformed(
                    "TLS 1.3 key material has a traffic secret of its suite per direction, TLS 1.2 none",
                ));
            }
        }
        let mut buf = Zeroizing::new(Vec::with_capacity(MAX_KEY_MATERIAL_LEN));
        let mut w = Writer::new(&mut buf);
        match self.version {
            TlsVersion::Tls12 => {
                let c2s = self.toward_client.c2s.next_seq;
                let s2c = self.toward_client.s2c.next_seq;
                if self.toward_server.c2s.next_seq != c2s || self.toward_server.s2c.next_seq != s2c
                {
                    return Err(malformed(
                        "TLS 1.2 key material has one sequence number per direction",
                    ));
                }
                w.u16(version::TLS1_2);
                w.u64(c2s);
                w.u64(s2c);
                w.u16(self.suite.id);
                w.u32(key_len as u32);
                w.u32(iv_len as u32);
                for d in self.wire_order() {
                    w.bytes(d.keys.key());
                    w.bytes(d.keys.iv());
                }
            }
            TlsVersion::Tls13 => {
                w.u16(version::TLS1_3);
                w.u16(self.suite.id);
                w.u32(key_len as u32);
                w.u32(iv_len as u32);
                w.u32(self.suite.hash.output_len() as u32);
                for d in self.wire_order() {
                    w.bytes(d.keys.key());
                    w.bytes(d.keys.iv());
                    w.u64(d.next_seq);
                    w.bytes(d.secret.as_ref().map(|s| s.as_bytes()).unwrap_or_default());
                }
            }
        }
        Ok(buf)
    }

    /// Decode untrusted bytes.
    pub fn decode(data: &[u8]) -> Result<KeyMaterial, WireError> {
        let mut r = Reader::new(data);
        let ver = r.u16()?;
        let (version, seqs) = match ver {
            version::TLS1_2 => (TlsVersion::Tls12, Some((r.u64()?, r.u64()?))),
            version::TLS1_3 => (TlsVersion::Tls13, None),
            _ => return Err(WireError::BadVersion(ver)),
        };
        let suite_id = r.u16()?;
        let suite = CipherSuite::from_id(suite_id)
            .filter(|s| s.version == version)
            .ok_or(malformed("cipher suite unknown or not for this version"))?;
        let key_len = r.u32()? as usize;
        let iv_len_wire = r.u32()? as usize;
        if key_len != suite.aead.key_len() {
            return Err(malformed("key_len does not match the cipher suite"));
        }
        if iv_len_wire != iv_len(version, &suite) {
            return Err(malformed("iv_len does not match the cipher suite"));
        }
        let secret_len = match version {
            TlsVersion::Tls12 => 0,
            TlsVersion::Tls13 => r.u32()? as usize,
        };
        if version == TlsVersion::Tls13 && secret_len != suite.hash.output_len() {
            return Err(malformed("secret_len does not match the cipher suite"));
        }
        let mut dirs = Vec::with_capacity(4);
        for _ in 0..4 {
            let key = r.take(key_len)?;
            let iv = r.take(iv_len_wire)?;
            let next_seq = match seqs {
                Some(_) => 0,
                None => r.u64()?,
            };
            let keys =
                TrafficKeys::new(suite.aead, key, iv).map_err(|_| malformed("key or IV length"))?;
            let secret = match version {
                TlsVersion::Tls12 => None,
                // Kept for the next generation; the current key and IV are taken as sent
                // (deriving them again would cost 8 HMACs per handshake to check the endpoint
                // that chose both; a pair that does not match fails closed at the first
                // KeyUpdate).
                TlsVersion::Tls13 => Some(
                    TrafficSecret::new(suite, r.take(secret_len)?)
                        .map_err(|_| malformed("traffic secret length"))?,
                ),
            };
            dirs.push(DirectionKeys {
                keys,
                next_seq,
                secret,
            });
        }
        r.finish()?;
        let mut it = dirs.into_iter();
        let (Some(mut cw), Some(mut cr), Some(mut sw), Some(mut sr), None) =
            (it.next(), it.next(), it.next(), it.next(), it.next())
        else {
            return Err(malformed("key material directions"));
        };
        if let Some((c2s, s2c)) = seqs {
            cr.next_seq = c2s;
            sw.next_seq = c2s;
            cw.next_seq = s2c;
            sr.next_seq = s2c;
        }
        Ok(KeyMaterial {
            version,
            suite,
            toward_client: HopKeys { c2s: cr, s2c: cw },
            toward_server: HopKeys { c2s: sw, s2c: sr },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(aead: mbx_record::Aead, fill: u8, iv_len: usize, seq: u64) -> DirectionKeys {
        DirectionKeys::without_secret(
            TrafficKeys::new(aead, &vec![fill; aead.key_len()], &vec![fill; iv_len]).unwrap(),
            seq,
        )
    }

    /// TLS 1.3: keys derived from a secret of `fill` bytes.
    fn dir13(s: CipherSuite, fill: u8, seq: u64) -> DirectionKeys {
        let secret = TrafficSecret::new(s, &vec![fill; s.hash.output_len()]).unwrap();
        DirectionKeys::from_secret(secret, seq).unwrap()
    }

    /// The paper's layout, checked byte by byte.
    #[test]
    fn tls12_paper_layout() {
        let s = CipherSuite::TLS_RSA_WITH_AES_256_GCM_SHA384;
        let a = s.aead;
        let km = KeyMaterial {
            version: TlsVersion::Tls12,
            suite: s,
            toward_client: HopKeys {
                c2s: dir(a, 2, 4, 7),
                s2c: dir(a, 1, 4, 9),
            },
            toward_server: HopKeys {
                c2s: dir(a, 3, 4, 7),
                s2c: dir(a, 4, 4, 9),
            },
        };
        let enc = km.encode().unwrap();
        let mut want = vec![3, 3];
        want.extend(7u64.to_be_bytes());
        want.extend(9u64.to_be_bytes());
        want.extend([0x00, 0x9d]);
        want.extend(32u32.to_be_bytes());
        want.extend(4u32.to_be_bytes());
        for f in [1u8, 2, 3, 4] {
            want.extend(vec![f; 32]);
            want.extend(vec![f; 4]);
        }
        assert_eq!(&enc[..], &want[..]);
        let back = KeyMaterial::decode(&enc).unwrap();
        assert_eq!(&back.encode().unwrap()[..], &want[..]);
        assert_eq!(back.toward_client.s2c.keys.key(), &[1; 32]);
        assert_eq!(back.toward_server.c2s.next_seq, 7);
        assert_eq!(back.toward_server.s2c.next_seq, 9);
    }

    fn km13(s: CipherSuite, seqs: [u64; 4]) -> KeyMaterial {
        KeyMaterial {
            version: TlsVersion::Tls13,
            suite: s,
            toward_client: HopKeys {
                c2s: dir13(s, 2, seqs[1]),
                s2c: dir13(s, 1, seqs[0]),
            },
            toward_server: HopKeys {
                c2s: dir13(s, 3, seqs[2]),
                s2c: dir13(s, 4, seqs[3]),
            },
        }
    }

    #[test]
    fn tls13_layout() {
        for s in [
            CipherSuite::TLS13_AES_128_GCM_SHA256,
            CipherSuite::TLS13_AES_256_GCM_SHA384,
        ] {
            let km = km13(s, [10, 20, 30, 40]);
            let enc = km.encode().unwrap();
            let (key_len, secret_len) = (s.aead.key_len(), s.hash.output_len());
            let mut want = vec![3, 4, 0x13, s.id as u8];
            want.extend((key_len as u32).to_be_bytes());
            want.extend(12u32.to_be_bytes());
            want.extend((secret_len as u32).to_be_bytes());
            for (f, seq) in [(1u8, 10u64), (2, 20), (3, 30), (4, 40)] {
                // The key and IV are those of the secret (RFC 8446 §7.3).
                let keys = mbx_record::tls13::traffic_keys(&s, &vec![f; secret_len]).unwrap();
                want.extend(keys.key());
                want.extend(keys.iv());
                want.extend(seq.to_be_bytes());
                want.extend(vec![f; secret_len]);
            }
            assert_eq!(&enc[..], &want[..]);
            let back = KeyMaterial::decode(&enc).unwrap();
            assert_eq!(&back.encode().unwrap()[..], &want[..]);
            let secret = back.toward_server.s2c.secret.as_ref().unwrap();
            assert_eq!(secret.as_bytes(), &vec![4u8; secret_len][..]);
        }
    }

    #[test]
    fn tls13_keys_must_come_with_their_secret() {
        let s = CipherSuite::TLS13_AES_128_GCM_SHA256;
        let mut km = km13(s, [0; 4]);
        // Encoding: a direction without a secret, or with another suite's.
        km.toward_client.c2s.secret = None;
        assert!(km.encode().is_err());
        let other = CipherSuite::TLS13_CHACHA20_POLY1305_SHA256;
        km.toward_client.c2s.secret = Some(TrafficSecret::new(other, &[2; 32]).unwrap());
        assert!(km.encode().is_err());
        // Decoding: the secret of every direction is kept.
        let enc = km13(s, [0; 4]).encode().unwrap().to_vec();
        let back = KeyMaterial::decode(&enc).unwrap();
        for d in back.wire_order() {
            let secret = d.secret.as_ref().unwrap();
            assert_eq!(secret.keys().unwrap().key(), d.keys.key());
        }
        // A TLS 1.2 direction with a secret cannot be encoded.
        let g = CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256;
        let mut d = dir(g.aead, 1, 4, 0);
        d.secret = Some(TrafficSecret::new(s, &[1; 32]).unwrap());
        let km12 = KeyMaterial {
            version: TlsVersion::Tls12,
            suite: g,
            toward_client: HopKeys {
                c2s: d,
                s2c: dir(g.aead, 1, 4, 0),
            },
            toward_server: HopKeys {
                c2s: dir(g.aead, 1, 4, 0),
                s2c: dir(g.aead, 1, 4, 0),
            },
        };
        assert!(km12.encode().is_err());
    }

    #[test]
    fn rejects_inconsistent_input() {
        let s = CipherSuite::TLS13_AES_128_GCM_SHA256;
        let good = km13(s, [0; 4]);
        let enc = good.encode().unwrap().to_vec();
        // trailing byte, truncation, wrong version, TLS 1.2 suite under 1.3, wrong lengths
        let mut t = enc.clone();
        t.push(0);
        assert!(KeyMaterial::decode(&t).is_err());
        assert!(KeyMaterial::decode(&enc[..enc.len() - 1]).is_err());
        let mut v = enc.clone();
        v[1] = 2;
        assert!(KeyMaterial::decode(&v).is_err());
        let mut c = enc.clone();
        c[2..4].copy_from_slice(&[0xc0, 0x2f]);
        assert!(KeyMaterial::decode(&c).is_err());
        let mut k = enc.clone();
        k[7] = 32;
        assert!(KeyMaterial::decode(&k).is_err());
        let mut i = enc.clone();
        i[11] = 4;
        assert!(KeyMaterial::decode(&i).is_err());
        let mut l = enc.clone();
        l[15] = 48;
        assert!(KeyMaterial::decode(&l).is_err());
        // TLS 1.2 with different sequence numbers on the two hops cannot be encoded
        let g = CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256;
        let bad12 = KeyMaterial {
            version: TlsVersion::Tls12,
            suite: g,
            toward_client: HopKeys {
                c2s: dir(g.aead, 1, 4, 1),
                s2c: dir(g.aead, 1, 4, 0),
            },
            toward_server: HopKeys {
                c2s: dir(g.aead, 1, 4, 2),
                s2c: dir(g.aead, 1, 4, 0),
            },
        };
        assert!(bad12.encode().is_err());
        // a TLS 1.3-length IV under TLS 1.2 GCM
        let bad_iv = KeyMaterial {
            version: TlsVersion::Tls12,
            suite: g,
            toward_client: HopKeys {
                c2s: dir(g.aead, 1, 12, 0),
                s2c: dir(g.aead, 1, 4, 0),
            },
            toward_server: HopKeys {
                c2s: dir(g.aead, 1, 4, 0),
                s2c: dir(g.aead, 1, 4, 0),
            },
        };
        assert!(bad_iv.encode().is_err());
    }
}
