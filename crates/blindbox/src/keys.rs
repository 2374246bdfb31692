//! BlindBox keys derived from the primary TLS session's exporter (RFC 5705 / RFC 8446 §7.5).
//!
//! Both endpoints run the same derivations on their end of the primary session, so they agree
//! without sending anything; the middlebox, which does not have the session secrets, learns none
//! of them. Labels (all distinct, so the keys are independent):
//!
//! | label | context | length | use |
//! |---|---|---|---|
//! | `EXPORTER-mbx-blindbox k` | none | 16 | `k`, the DPIEnc token key (both directions) |
//! | `EXPORTER-mbx-blindbox k_rand` | none | 32 | seed of the garbling randomness |
//! | `EXPORTER-mbx-blindbox flow key` | `c2s` / `s2c` | 16 | Protocol III flow key (wrapped in `c2`) |
//! | `EXPORTER-mbx-blindbox channel auth` | `c2s` / `s2c` | 32 | token-channel frame tags |
//! | `EXPORTER-mbx-blindbox salt0` | `c2s` / `s2c` | 8 | the first `salt0` of the direction |
//!
//! `k_ssl` is the primary session's own protection (standard TLS). Deriving the flow key and the
//! first `salt0` instead of drawing them at random makes the sender's whole token stream a
//! function of its plaintext, so the receiver can recompute it exactly (validation, paper §3.4).

use mbx_engine::{EngineError, TlsEngine};
use zeroize::{Zeroize, ZeroizeOnDrop, Zeroizing};

use crate::channel::FrameAuth;
use crate::dpienc::{FlowKey, TokenKey};
use crate::rules::Direction;

pub const LABEL_K: &str = "EXPORTER-mbx-blindbox k";
pub const LABEL_K_RAND: &str = "EXPORTER-mbx-blindbox k_rand";
pub const LABEL_FLOW_KEY: &str = "EXPORTER-mbx-blindbox flow key";
pub const LABEL_CHANNEL_AUTH: &str = "EXPORTER-mbx-blindbox channel auth";
pub const LABEL_SALT0: &str = "EXPORTER-mbx-blindbox salt0";

/// Exporter context naming a direction.
pub fn direction_context(d: Direction) -> &'static [u8] {
    match d {
        Direction::ToServer => b"c2s",
        Direction::ToClient => b"s2c",
    }
}

/// Keys of one direction.
#[derive(Clone, Zeroize, ZeroizeOnDrop)]
pub struct DirectionKeys {
    flow_key: [u8; 16],
    channel_auth: [u8; 32],
    #[zeroize(skip)]
    pub salt0: u64,
}

impl DirectionKeys {
    pub fn flow_key(&self) -> FlowKey {
        FlowKey::from_bytes(self.flow_key)
    }

    pub fn frame_auth(&self) -> FrameAuth {
        FrameAuth::new(&self.channel_auth)
    }
}

/// Everything BlindBox derives from one primary session.
#[derive(Clone, Zeroize, ZeroizeOnDrop)]
pub struct SessionKeys {
    k: [u8; 16],
    k_rand: [u8; 32],
    pub to_server: DirectionKeys,
    pub to_client: DirectionKeys,
}

fn fixed<const N: usize>(
    e: &dyn TlsEngine,
    label: &str,
    ctx: Option<&[u8]>,
) -> Result<[u8; N], EngineError> {
    let v = e.export_keying_material(label, ctx, N)?;
    let mut out = [0u8; N];
    if v.len() != N {
        return Err(EngineError::State("exporter returned a wrong length"));
    }
    out.copy_from_slice(&v);
    Ok(out)
}

impl SessionKeys {
    /// Runs the derivations on a finished handshake (before `export_session`).
    pub fn derive(engine: &dyn TlsEngine) -> Result<Self, EngineError> {
        let dir = |d: Direction| -> Result<DirectionKeys, EngineError> {
            let ctx = Some(direction_context(d));
            Ok(DirectionKeys {
                flow_key: fixed(engine, LABEL_FLOW_KEY, ctx)?,
                channel_auth: fixed(engine, LABEL_CHANNEL_AUTH, ctx)?,
                salt0: u64::from_be_bytes(fixed(engine, LABEL_SALT0, ctx)?),
            })
        };
        Ok(Self {
            k: fixed(engine, LABEL_K, None)?,
            k_rand: fixed(engine, LABEL_K_RAND, None)?,
            to_server: dir(Direction::ToServer)?,
            to_client: dir(Direction::ToClient)?,
        })
    }

    /// From raw values (benchmarks and tests that have no TLS session).
    pub fn from_parts(k: [u8; 16], k_rand: [u8; 32], seed: u8) -> Self {
        let d = |b: u8| DirectionKeys {
            flow_key: [b; 16],
            channel_auth: [b.wrapping_add(1); 32],
            salt0: u64::from(b) << 40,
        };
        Self {
            k,
            k_rand,
            to_server: d(seed),
            to_client: d(seed.wrapping_add(2)),
        }
    }

    /// `k`: token encryption. The middlebox never gets it.
    pub fn token_key(&self) -> TokenKey {
        TokenKey::new(&self.k)
    }

    /// `k_rand`: the seed both endpoints garble with (the garbling setup uses it).
    pub fn k_rand(&self) -> Zeroizing<[u8; 32]> {
        Zeroizing::new(self.k_rand)
    }

    pub fn direction(&self, d: Direction) -> &DirectionKeys {
        match d {
            Direction::ToServer => &self.to_server,
            Direction::ToClient => &self.to_client,
        }
    }
}

impl std::fmt::Debug for SessionKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SessionKeys(..)")
    }
}
