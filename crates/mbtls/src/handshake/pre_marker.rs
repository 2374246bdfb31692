//! An endpoint's check of the primary-key records that reach it after its export and before
//! its nearest middlebox's switch marker: the middlebox forwarded them raw (it had no keys
//! yet) and re-sends their content through its app after the marker, so they are dropped, but
//! only once authenticated (a forged or altered one is fatal, never silently ignored).

use mbx_record::{ContentType, RecordOpener, TlsVersion};

use super::HandshakeError;
use crate::hop::next_generation;
use crate::key_update::PostHandshake;
use crate::keys::{DirectionKeys, TrafficSecret};

/// Says what else it may be than tampering: a middlebox that relays under its new keys
/// without having sent its marker first reads the same (found by an independent implementer,
/// who suspected his keys).
const FAILED: HandshakeError = HandshakeError::Protocol(
    "a record before the middlebox's switch marker (the close_notify of its secondary session, \
     on its subchannel) failed authentication under the bridge keys: altered, or sent under the \
     hop's new keys by a middlebox that had not sent its marker first",
);

/// The bridge's read direction as the peer left it at the export, moved on by the peer's
/// TLS 1.3 KeyUpdates among those records (one may follow its Finished at once, RFC 8446
/// §4.6.3), as the middlebox's relay moves it on when it re-sends them.
pub(super) struct PreMarker {
    version: TlsVersion,
    opener: RecordOpener,
    secret: Option<TrafficSecret>,
    post_handshake: PostHandshake,
}

impl PreMarker {
    pub(super) fn new(version: TlsVersion, read: DirectionKeys) -> Self {
        PreMarker {
            version,
            opener: RecordOpener::new(version, read.keys, read.next_seq),
            secret: read.secret,
            post_handshake: PostHandshake::new(),
        }
    }

    /// One whole record: authenticated at the next sequence number, then forgotten (its
    /// handshake messages other than a KeyUpdate, e.g. tickets, reach the data phase through
    /// the middlebox).
    pub(super) fn check(&mut self, record: &[u8]) -> Result<(), HandshakeError> {
        let opened = self.opener.open(record).map_err(|_| FAILED)?;
        if self.version != TlsVersion::Tls13 || opened.content_type != ContentType::HANDSHAKE {
            return Ok(());
        }
        let update = self
            .post_handshake
            .record(&opened.plaintext, |_| Ok(()))
            .map_err(|v| HandshakeError::Protocol(v.what))?;
        if update.is_some() {
            let next = next_generation(self.secret.as_ref())?;
            self.opener = RecordOpener::new(self.version, next.keys, 0);
            self.secret = next.secret;
        }
        Ok(())
    }
}
