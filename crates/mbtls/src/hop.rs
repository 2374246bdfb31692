//! One hop's record protection as a node sees it: an opener for what its neighbour sends and a
//! sealer for what it sends back, both from `mbx-record`, plus the deframer in front.

use mbx_engine::AlertDescription;
use mbx_record::{ContentType, RecordError, RecordOpener, RecordSealer, TlsVersion};
use mbx_wire::record::MAX_PLAINTEXT_LEN;
use mbx_wire::{DeframerConfig, Record, RecordReader};

use crate::keys::DirectionKeys;

/// A node's neighbours: the one toward the client and the one toward the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Side {
    Client,
    Server,
}

impl Side {
    pub const fn other(self) -> Side {
        match self {
            Side::Client => Side::Server,
            Side::Server => Side::Client,
        }
    }
}

/// A TLS alert (RFC 8446 §6): level 1 = warning, 2 = fatal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Alert {
    pub level: u8,
    pub description: AlertDescription,
}

impl Alert {
    pub const LEVEL_WARNING: u8 = 1;
    pub const LEVEL_FATAL: u8 = 2;

    pub const fn fatal(description: AlertDescription) -> Alert {
        Alert {
            level: Self::LEVEL_FATAL,
            description,
        }
    }

    pub const fn close_notify() -> Alert {
        Alert {
            level: Self::LEVEL_WARNING,
            description: AlertDescription::CLOSE_NOTIFY,
        }
    }

    pub const fn is_close_notify(&self) -> bool {
        self.description.0 == AlertDescription::CLOSE_NOTIFY.0
    }

    pub fn encode(&self) -> [u8; 2] {
        [self.level, self.description.0]
    }

    /// Decode an alert record's plaintext: exactly two bytes, level 1 or 2.
    pub fn parse(plaintext: &[u8]) -> Option<Alert> {
        match plaintext {
            [level @ (1 | 2), desc] => Some(Alert {
                level: *level,
                description: AlertDescription(*desc),
            }),
            _ => None,
        }
    }

    /// Whether the alert ends the session. TLS 1.3 (RFC 8446 §6) has only two non-error
    /// alerts, close_notify and user_canceled, whatever the level says; TLS 1.2 trusts the level.
    pub fn ends_session(&self, version: TlsVersion) -> bool {
        match version {
            TlsVersion::Tls13 => !matches!(self.description.0, 0 | 90),
            TlsVersion::Tls12 => self.level == Self::LEVEL_FATAL,
        }
    }
}

/// Record protection of one hop, from one node's point of view.
pub(crate) struct Hop {
    version: TlsVersion,
    reader: RecordReader,
    opener: RecordOpener,
    sealer: RecordSealer,
}

impl Hop {
    pub(crate) fn new(version: TlsVersion, read: DirectionKeys, write: DirectionKeys) -> Hop {
        let cfg = match version {
            TlsVersion::Tls12 => DeframerConfig::tls12(),
            TlsVersion::Tls13 => DeframerConfig::tls13(),
        };
        Hop {
            version,
            reader: RecordReader::new(cfg),
            opener: RecordOpener::new(version, read.keys, read.next_seq),
            sealer: RecordSealer::new(version, write.keys, write.next_seq),
        }
    }

    pub(crate) fn version(&self) -> TlsVersion {
        self.version
    }

    pub(crate) fn push(&mut self, bytes: &[u8]) {
        self.reader.push(bytes);
    }

    /// The next complete record from the neighbour; framing errors are sticky.
    pub(crate) fn next_record(&mut self) -> Result<Option<Record>, RecordError> {
        Ok(self.reader.next_record()?)
    }

    pub(crate) fn open(&mut self, record: &Record) -> Result<mbx_record::Opened, RecordError> {
        self.opener.open(record.as_bytes())
    }

    /// Seal `data` as records of at most 2^14 bytes of plaintext each. Nothing for empty data.
    pub(crate) fn seal_data(
        &mut self,
        ct: ContentType,
        data: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), RecordError> {
        for chunk in data.chunks(MAX_PLAINTEXT_LEN) {
            self.sealer.seal(ct, chunk, out)?;
        }
        Ok(())
    }

    pub(crate) fn seal_alert(
        &mut self,
        alert: Alert,
        out: &mut Vec<u8>,
    ) -> Result<(), RecordError> {
        self.sealer.seal(ContentType::ALERT, &alert.encode(), out)
    }

    /// Fingerprints of (read, write) keys, for logs and tests.
    pub(crate) fn fingerprints(&self) -> (Option<[u8; 8]>, Option<[u8; 8]>) {
        (self.opener.key_fingerprint(), self.sealer.key_fingerprint())
    }
}

impl core::fmt::Debug for Hop {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Hop")
            .field("version", &self.version)
            .field("opener", &self.opener.key_fingerprint())
            .field("sealer", &self.sealer)
            .finish_non_exhaustive()
    }
}
