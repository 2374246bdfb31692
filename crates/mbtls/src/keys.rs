//! Per-hop keys: generation, the bridge from the primary session, and what each middlebox gets.
//!
//! Paper Figure 4: every hop has its own keys. Each endpoint generates fresh keys for the hops
//! on its side; the primary session's keys bridge the client side and the server side. A hop's
//! keys are the same at both of its ends; [`HopKeys`] names the two directions by the way data
//! flows (client→server, server→client), not by who reads, so one value describes a hop for
//! both nodes.

use mbx_engine::{ExportedSession, Role};
use mbx_record::{tls13, CipherSuite, TlsVersion, TrafficKeys};
use ring::rand::{SecureRandom, SystemRandom};
use zeroize::Zeroizing;

use crate::error::MbtlsError;
use crate::wire::KeyMaterial;

/// A TLS 1.3 application traffic secret of one direction of one hop (zeroized on drop): its
/// record key and IV derive from it, and so does the next generation after a KeyUpdate
/// (RFC 8446 §7.2), which both ends of the hop derive alike.
#[derive(Clone)]
pub struct TrafficSecret {
    suite: CipherSuite,
    secret: Zeroizing<Vec<u8>>,
}

impl TrafficSecret {
    /// `secret` must be as long as the suite's hash, and the suite a TLS 1.3 one.
    pub fn new(suite: CipherSuite, secret: &[u8]) -> Result<TrafficSecret, MbtlsError> {
        if suite.version != TlsVersion::Tls13 || secret.len() != suite.hash.output_len() {
            return Err(MbtlsError::KeyMaterial(
                "a traffic secret needs a TLS 1.3 suite and the length of its hash",
            ));
        }
        Ok(TrafficSecret {
            suite,
            secret: Zeroizing::new(secret.to_vec()),
        })
    }

    pub fn suite(&self) -> CipherSuite {
        self.suite
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.secret
    }

    /// The record key and IV of this secret.
    pub fn keys(&self) -> Result<TrafficKeys, MbtlsError> {
        Ok(tls13::traffic_keys(&self.suite, &self.secret)?)
    }

    /// The secret of the next generation, after a KeyUpdate.
    pub fn next(&self) -> Result<TrafficSecret, MbtlsError> {
        Ok(TrafficSecret {
            suite: self.suite,
            secret: tls13::next_traffic_secret(self.suite.hash, &self.secret)?,
        })
    }
}

impl core::fmt::Debug for TrafficSecret {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("TrafficSecret")
            .field("suite", &self.suite.id)
            .finish_non_exhaustive()
    }
}

/// Keys of one direction of one hop, and the sequence number of the next record on it.
#[derive(Debug, Clone)]
pub struct DirectionKeys {
    /// AEAD key and IV (zeroized on drop).
    pub keys: TrafficKeys,
    pub next_seq: u64,
    /// TLS 1.3: the traffic secret `keys` derive from, so that the hop can follow a KeyUpdate.
    /// TLS 1.2 has none (and no KeyUpdate).
    pub secret: Option<TrafficSecret>,
}

impl DirectionKeys {
    /// TLS 1.2 keys (or TLS 1.3 keys whose hop cannot update them).
    pub fn without_secret(keys: TrafficKeys, next_seq: u64) -> DirectionKeys {
        DirectionKeys {
            keys,
            next_seq,
            secret: None,
        }
    }

    /// TLS 1.3: the key and IV of `secret`.
    pub fn from_secret(secret: TrafficSecret, next_seq: u64) -> Result<DirectionKeys, MbtlsError> {
        Ok(DirectionKeys {
            keys: secret.keys()?,
            next_seq,
            secret: Some(secret),
        })
    }
}

/// Both directions of one hop.
#[derive(Debug, Clone)]
pub struct HopKeys {
    pub c2s: DirectionKeys,
    pub s2c: DirectionKeys,
}

/// The IV length the record layer expects for `suite` under `version`.
pub(crate) fn iv_len(version: TlsVersion, suite: &CipherSuite) -> usize {
    match version {
        TlsVersion::Tls12 => suite.aead.tls12_fixed_iv_len(),
        TlsVersion::Tls13 => suite.aead.nonce_len(),
    }
}

/// TLS 1.3: a random traffic secret and its key and IV; TLS 1.2: a random key and IV.
fn fresh_direction(
    rng: &SystemRandom,
    version: TlsVersion,
    suite: &CipherSuite,
    next_seq: u64,
) -> Result<DirectionKeys, MbtlsError> {
    if version == TlsVersion::Tls13 {
        let mut secret = Zeroizing::new(vec![0u8; suite.hash.output_len()]);
        rng.fill(&mut secret).map_err(|_| MbtlsError::Random)?;
        return DirectionKeys::from_secret(TrafficSecret::new(*suite, &secret)?, next_seq);
    }
    let mut key = Zeroizing::new(vec![0u8; suite.aead.key_len()]);
    let mut iv = Zeroizing::new(vec![0u8; iv_len(version, suite)]);
    rng.fill(&mut key).map_err(|_| MbtlsError::Random)?;
    rng.fill(&mut iv).map_err(|_| MbtlsError::Random)?;
    Ok(DirectionKeys::without_secret(
        TrafficKeys::new(suite.aead, &key, &iv)?,
        next_seq,
    ))
}

impl HopKeys {
    /// Fresh random keys for a hop (the system CSPRNG), starting at the given sequence numbers.
    ///
    /// The suite must be usable with `version`; fresh keys are never reused, so with TLS 1.2
    /// GCM (explicit nonce = sequence number) nonces stay unique under each key.
    pub fn generate(
        version: TlsVersion,
        suite: &CipherSuite,
        c2s_next: u64,
        s2c_next: u64,
    ) -> Result<HopKeys, MbtlsError> {
        if suite.version != version {
            return Err(MbtlsError::KeyMaterial(
                "cipher suite does not match version",
            ));
        }
        let rng = SystemRandom::new();
        Ok(HopKeys {
            c2s: fresh_direction(&rng, version, suite, c2s_next)?,
            s2c: fresh_direction(&rng, version, suite, s2c_next)?,
        })
    }

    /// The bridge hop: the primary session as exported by an endpoint's engine (`role` is that
    /// endpoint's role), with its exact next sequence numbers and, for TLS 1.3, its traffic
    /// secrets (so the bridge follows a KeyUpdate of a legacy peer).
    pub fn from_export(role: Role, session: &ExportedSession) -> Result<HopKeys, MbtlsError> {
        let direction = |d: &mbx_engine::DirectionState| -> Result<DirectionKeys, MbtlsError> {
            let secret = match (&d.traffic_secret, session.version) {
                (Some(s), TlsVersion::Tls13) => Some(TrafficSecret::new(session.suite, s)?),
                _ => None,
            };
            Ok(DirectionKeys {
                keys: d.keys.clone(),
                next_seq: d.next_seq,
                secret,
            })
        };
        let (tx, rx) = (direction(&session.tx)?, direction(&session.rx)?);
        Ok(match role {
            Role::Client => HopKeys { c2s: tx, s2c: rx },
            Role::Server => HopKeys { c2s: rx, s2c: tx },
        })
    }
}

/// What an endpoint distributes on its side of the session.
#[derive(Debug)]
pub struct SideKeys {
    /// The keys of the endpoint's own hop (to its nearest middlebox, or the bridge if none).
    pub endpoint: HopKeys,
    /// Key material for each middlebox on this side, in path order from client to server.
    pub middleboxes: Vec<KeyMaterial>,
}

/// Client side: path `client, M0, …, M(n−1), bridge`. Fresh hops start at the bridge's
/// sequence numbers (the TLS 1.2 key material carries one pair for all hops).
pub fn client_side_keys(
    version: TlsVersion,
    suite: CipherSuite,
    bridge: HopKeys,
    middleboxes: usize,
) -> Result<SideKeys, MbtlsError> {
    let (c, s) = (bridge.c2s.next_seq, bridge.s2c.next_seq);
    let mut hops = Vec::with_capacity(middleboxes + 1);
    for _ in 0..middleboxes {
        hops.push(HopKeys::generate(version, &suite, c, s)?);
    }
    hops.push(bridge);
    assemble(version, suite, hops, true)
}

/// Server side: path `bridge, M0, …, M(m−1), server`.
pub fn server_side_keys(
    version: TlsVersion,
    suite: CipherSuite,
    bridge: HopKeys,
    middleboxes: usize,
) -> Result<SideKeys, MbtlsError> {
    let (c, s) = (bridge.c2s.next_seq, bridge.s2c.next_seq);
    let mut hops = Vec::with_capacity(middleboxes + 1);
    hops.push(bridge);
    for _ in 0..middleboxes {
        hops.push(HopKeys::generate(version, &suite, c, s)?);
    }
    assemble(version, suite, hops, false)
}

/// `hops` in path order; middlebox i sits between hops i and i+1.
fn assemble(
    version: TlsVersion,
    suite: CipherSuite,
    hops: Vec<HopKeys>,
    endpoint_first: bool,
) -> Result<SideKeys, MbtlsError> {
    let endpoint = if endpoint_first {
        hops.first()
    } else {
        hops.last()
    }
    .cloned()
    .ok_or(MbtlsError::KeyMaterial("no hops"))?;
    let middleboxes = hops
        .windows(2)
        .map(|w| match w {
            [a, b] => Ok(KeyMaterial {
                version,
                suite,
                toward_client: a.clone(),
                toward_server: b.clone(),
            }),
            _ => Err(MbtlsError::KeyMaterial("hop window")),
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(SideKeys {
        endpoint,
        middleboxes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_keys_differ_and_have_suite_lengths() {
        let s = CipherSuite::TLS13_AES_256_GCM_SHA384;
        let a = HopKeys::generate(TlsVersion::Tls13, &s, 0, 0).unwrap();
        let b = HopKeys::generate(TlsVersion::Tls13, &s, 0, 0).unwrap();
        assert_ne!(a.c2s.keys.key(), b.c2s.keys.key());
        assert_ne!(a.c2s.keys.key(), a.s2c.keys.key());
        assert_eq!(a.c2s.keys.key().len(), 32);
        assert_eq!(a.c2s.keys.iv().len(), 12);
        // TLS 1.3: the key and IV of a fresh traffic secret of the suite's hash length.
        let secret = a.c2s.secret.as_ref().unwrap();
        assert_eq!(secret.as_bytes().len(), 48);
        assert_eq!(secret.keys().unwrap().key(), a.c2s.keys.key());
        assert_eq!(secret.keys().unwrap().iv(), a.c2s.keys.iv());
        let g = CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256;
        let h = HopKeys::generate(TlsVersion::Tls12, &g, 5, 6).unwrap();
        assert_eq!(h.c2s.keys.iv().len(), 4);
        assert!(h.c2s.secret.is_none());
        assert_eq!((h.c2s.next_seq, h.s2c.next_seq), (5, 6));
        assert!(HopKeys::generate(TlsVersion::Tls12, &s, 0, 0).is_err());
    }

    #[test]
    fn adjacent_middleboxes_share_a_hop() {
        let s = CipherSuite::TLS13_AES_128_GCM_SHA256;
        let bridge = HopKeys::generate(TlsVersion::Tls13, &s, 3, 4).unwrap();
        let side = client_side_keys(TlsVersion::Tls13, s, bridge.clone(), 3).unwrap();
        assert_eq!(side.middleboxes.len(), 3);
        assert_eq!(
            side.endpoint.c2s.keys.key(),
            side.middleboxes[0].toward_client.c2s.keys.key()
        );
        for w in side.middleboxes.windows(2) {
            assert_eq!(
                w[0].toward_server.s2c.keys.key(),
                w[1].toward_client.s2c.keys.key()
            );
        }
        assert_eq!(
            side.middleboxes[2].toward_server.c2s.keys.key(),
            bridge.c2s.keys.key()
        );
        assert_eq!(side.middleboxes[0].toward_client.c2s.next_seq, 3);
        let server = server_side_keys(TlsVersion::Tls13, s, bridge.clone(), 0).unwrap();
        assert!(server.middleboxes.is_empty());
        assert_eq!(server.endpoint.s2c.keys.key(), bridge.s2c.keys.key());
    }
}
