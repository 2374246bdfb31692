//! Handing a finished session from a TLS engine over to the mbx record layer.

use std::fmt;

use mbx_record::{CipherSuite, TlsVersion, TrafficKeys};
use subtle::ConstantTimeEq;
use zeroize::Zeroizing;

use crate::{EngineError, Role};

/// Keys and position of one direction of a session, as our record layer needs them.
pub struct DirectionState {
    /// AEAD key and IV of the current epoch.
    pub keys: TrafficKeys,
    /// Sequence number of the next record in this direction (records already sent/received
    /// through the engine in this epoch are counted).
    pub next_seq: u64,
    /// TLS 1.3 only: the traffic secret of the current epoch, to derive KeyUpdate successors.
    pub traffic_secret: Option<Zeroizing<Vec<u8>>>,
}

impl fmt::Debug for DirectionState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DirectionState")
            .field("keys", &hex::encode(self.keys.fingerprint()))
            .field("next_seq", &self.next_seq)
            .field(
                "traffic_secret",
                &self.traffic_secret.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

/// A session exported at a well-defined point after the handshake. `tx` is what this endpoint
/// sends, `rx` what it receives; so a client's `tx` equals its server's `rx`.
#[derive(Debug)]
pub struct ExportedSession {
    pub version: TlsVersion,
    pub suite: CipherSuite,
    pub client_random: [u8; 32],
    pub server_random: [u8; 32],
    pub tx: DirectionState,
    pub rx: DirectionState,
}

/// Everything needed to continue a connection without the engine: the session plus the bytes
/// that were in flight inside the engine's buffers when it was exported.
#[derive(Debug)]
pub struct Handoff {
    pub session: ExportedSession,
    /// Ciphertext received but not processed by the engine: whole records to open from
    /// `session.rx.next_seq` on, possibly followed by the start of a partial record.
    pub unprocessed_incoming: Vec<u8>,
    /// Ciphertext the engine produced but nobody took yet; send it before any record sealed
    /// with `session.tx`.
    pub pending_outgoing: Vec<u8>,
    /// Application data the engine decrypted but nobody took yet (wiped when dropped; its
    /// `Debug` does not show it).
    pub pending_plaintext: Zeroizing<Vec<u8>>,
}

/// Secrets collected from an engine's key log (NSS SSLKEYLOGFILE labels).
#[derive(Default)]
pub(crate) struct KeyLogSecrets {
    client_random: Option<[u8; 32]>,
    /// TLS 1.2 `CLIENT_RANDOM` (the (extended) master secret).
    master_secret: Option<Zeroizing<Vec<u8>>>,
    client_traffic_0: Option<Zeroizing<Vec<u8>>>,
    server_traffic_0: Option<Zeroizing<Vec<u8>>>,
}

impl KeyLogSecrets {
    /// Records one NSS key log line (`LABEL <client_random hex> <secret hex>`); lines we do not
    /// need are ignored.
    pub(crate) fn record_line(&mut self, line: &str) {
        let mut parts = line.split(' ');
        let (Some(label), Some(cr), Some(secret), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return;
        };
        if !matches!(label, "CLIENT_TRAFFIC_SECRET_0" | "SERVER_TRAFFIC_SECRET_0") {
            // Not needed, not worth decoding: TLS 1.3 logs five secrets and we use two; the
            // TLS 1.2 master secret comes from the session (`CLIENT_RANDOM` only via `record`).
            return;
        }
        let Ok(cr) = hex::decode(cr) else { return };
        // Decoded into its final, wiped buffer: `hex::decode` grows a vector and would leave
        // the outgrown copies of the secret in freed memory.
        let mut bytes = Zeroizing::new(vec![0u8; secret.len() / 2]);
        if hex::decode_to_slice(secret, &mut bytes).is_err() {
            return;
        }
        self.record(label, &cr, &bytes);
    }

    /// Records one secret, as rustls's `KeyLog::log` hands it over.
    pub(crate) fn record(&mut self, label: &str, client_random: &[u8], secret: &[u8]) {
        let slot = match label {
            "CLIENT_RANDOM" => &mut self.master_secret,
            "CLIENT_TRAFFIC_SECRET_0" => &mut self.client_traffic_0,
            "SERVER_TRAFFIC_SECRET_0" => &mut self.server_traffic_0,
            _ => return,
        };
        *slot = Some(Zeroizing::new(secret.to_vec()));
        if let Ok(cr) = client_random.try_into() {
            self.client_random = Some(cr);
        }
    }

    pub(crate) fn client_random(&self) -> Option<[u8; 32]> {
        self.client_random
    }

    /// Keys derived from these secrets are this handshake's: `suite` is of the negotiated
    /// `version`, and the key log, when it says whose it is, belongs to `client_random`.
    fn check_handshake(
        &self,
        suite: &CipherSuite,
        version: TlsVersion,
        client_random: &[u8; 32],
    ) -> Result<(), EngineError> {
        if suite.version != version {
            return Err(EngineError::UnsupportedSuite(suite.id));
        }
        if let Some(logged) = self.client_random {
            if !bool::from(logged.ct_eq(client_random)) {
                return Err(EngineError::InexactExport(
                    "key log belongs to another handshake",
                ));
            }
        }
        Ok(())
    }

    /// The keys `role` writes with now (after its ChangeCipherSpec or Finished): TLS 1.2 from
    /// the master secret, TLS 1.3 from its own traffic secret alone (a server that waits for
    /// the client's Finished has not logged the client's yet).
    pub(crate) fn own_write_keys(
        &self,
        role: Role,
        (suite, version): (&CipherSuite, TlsVersion),
        client_random: &[u8; 32],
        server_random: &[u8; 32],
    ) -> Result<TrafficKeys, EngineError> {
        self.check_handshake(suite, version, client_random)?;
        match suite.version {
            TlsVersion::Tls12 => {
                let ms = self
                    .master_secret
                    .as_ref()
                    .ok_or(EngineError::MissingSecret("CLIENT_RANDOM (master secret)"))?;
                let kb = mbx_record::tls12::key_block(suite, ms, client_random, server_random)?;
                Ok(match role {
                    Role::Client => kb.client_write,
                    Role::Server => kb.server_write,
                })
            }
            TlsVersion::Tls13 => {
                let (secret, label) = match role {
                    Role::Client => (&self.client_traffic_0, "CLIENT_TRAFFIC_SECRET_0"),
                    Role::Server => (&self.server_traffic_0, "SERVER_TRAFFIC_SECRET_0"),
                };
                let secret = secret.as_ref().ok_or(EngineError::MissingSecret(label))?;
                Ok(mbx_record::tls13::traffic_keys(suite, secret)?)
            }
        }
    }
}

/// What an engine knows at the export point.
pub(crate) struct ExportInputs<'a> {
    pub role: Role,
    pub version: TlsVersion,
    pub suite_id: u16,
    pub client_random: [u8; 32],
    pub server_random: [u8; 32],
    pub secrets: &'a KeyLogSecrets,
    pub tx_seq: u64,
    pub rx_seq: u64,
}

/// Derives both directions' keys from the key log secrets with the mbx record layer's own key
/// schedules (so what we hand over is exactly what our record layer would compute).
pub(crate) fn derive_session(i: ExportInputs<'_>) -> Result<ExportedSession, EngineError> {
    let suite =
        CipherSuite::from_id(i.suite_id).ok_or(EngineError::UnsupportedSuite(i.suite_id))?;
    i.secrets
        .check_handshake(&suite, i.version, &i.client_random)?;
    let (client_write, server_write, client_secret, server_secret) = match i.version {
        TlsVersion::Tls12 => {
            let ms = i
                .secrets
                .master_secret
                .as_ref()
                .ok_or(EngineError::MissingSecret("CLIENT_RANDOM (master secret)"))?;
            let kb = mbx_record::tls12::key_block(&suite, ms, &i.client_random, &i.server_random)?;
            (kb.client_write, kb.server_write, None, None)
        }
        TlsVersion::Tls13 => {
            let c = i
                .secrets
                .client_traffic_0
                .clone()
                .ok_or(EngineError::MissingSecret("CLIENT_TRAFFIC_SECRET_0"))?;
            let s = i
                .secrets
                .server_traffic_0
                .clone()
                .ok_or(EngineError::MissingSecret("SERVER_TRAFFIC_SECRET_0"))?;
            (
                mbx_record::tls13::traffic_keys(&suite, &c)?,
                mbx_record::tls13::traffic_keys(&suite, &s)?,
                Some(c),
                Some(s),
            )
        }
    };
    let client = DirectionState {
        keys: client_write,
        next_seq: 0,
        traffic_secret: client_secret,
    };
    let server = DirectionState {
        keys: server_write,
        next_seq: 0,
        traffic_secret: server_secret,
    };
    let (mut tx, mut rx) = match i.role {
        Role::Client => (client, server),
        Role::Server => (server, client),
    };
    tx.next_seq = i.tx_seq;
    rx.next_seq = i.rx_seq;
    Ok(ExportedSession {
        version: i.version,
        suite,
        client_random: i.client_random,
        server_random: i.server_random,
        tx,
        rx,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_log_lines_parsed_and_garbage_ignored() {
        let mut s = KeyLogSecrets::default();
        let cr = "11".repeat(32);
        s.record_line(&format!("CLIENT_TRAFFIC_SECRET_0 {cr} {}", "22".repeat(32)));
        s.record_line(&format!("SERVER_TRAFFIC_SECRET_0 {cr} zz"));
        s.record_line("CLIENT_RANDOM");
        s.record_line(&format!("CLIENT_RANDOM {cr} {} extra", "33".repeat(48)));
        s.record_line(&format!("EXPORTER_SECRET {cr} {}", "44".repeat(32)));
        assert_eq!(s.client_random(), Some([0x11; 32]));
        assert_eq!(
            s.client_traffic_0.as_deref().map(Vec::as_slice),
            Some(&[0x22; 32][..])
        );
        assert!(s.server_traffic_0.is_none());
        assert!(s.master_secret.is_none());
    }
}
