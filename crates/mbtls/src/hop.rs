//! One hop's record protection as a node sees it: an opener for what its neighbour sends and a
//! sealer for what it sends back, both from `mbx-record`, plus the deframing in front.
//!
//! Records are opened where they lie (in the caller's buffer when it lends one mutably,
//! otherwise in the hop's own buffer) and their plaintext is wiped right after use; only the
//! ciphertext of an incomplete record is kept between calls.

use mbx_engine::AlertDescription;
use mbx_record::{ContentType, OpenedInPlace, RecordError, RecordOpener, RecordSealer, TlsVersion};
use mbx_wire::record::{HEADER_LEN, MAX_PLAINTEXT_LEN};
use mbx_wire::{DeframerConfig, RecordHeader, WireError};

use crate::error::MbtlsError;
use crate::keys::{DirectionKeys, TrafficSecret};

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

/// `fatal decrypt_error(51)`, `warning close_notify(0)`.
impl core::fmt::Display for Alert {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self.level {
            Alert::LEVEL_WARNING => write!(f, "warning {}", self.description),
            Alert::LEVEL_FATAL => write!(f, "fatal {}", self.description),
            other => write!(f, "level {other} {}", self.description),
        }
    }
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
    /// Ciphertext of the incomplete record at the end of what the neighbour sent so far.
    pending: Vec<u8>,
    opener: RecordOpener,
    sealer: RecordSealer,
    /// TLS 1.3: the traffic secrets of the current read and write keys, for KeyUpdates.
    read_secret: Option<TrafficSecret>,
    write_secret: Option<TrafficSecret>,
}

/// Bytes from a neighbour: borrowed (copied before opening) or lent mutably (opened in place;
/// the contents are unspecified afterwards, and no plaintext is left in them).
pub(crate) enum Input<'a> {
    Borrowed(&'a [u8]),
    Lent(&'a mut [u8]),
}

impl Input<'_> {
    fn len(&self) -> usize {
        match self {
            Input::Borrowed(b) => b.len(),
            Input::Lent(b) => b.len(),
        }
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        match self {
            Input::Borrowed(b) => b,
            Input::Lent(b) => b,
        }
    }

    fn advance(self, n: usize) -> Self {
        match self {
            Input::Borrowed(b) => Input::Borrowed(b.get(n..).unwrap_or_default()),
            Input::Lent(b) => Input::Lent(b.get_mut(n..).unwrap_or_default()),
        }
    }
}

impl Hop {
    pub(crate) fn new(version: TlsVersion, read: DirectionKeys, write: DirectionKeys) -> Hop {
        Hop {
            version,
            pending: Vec::new(),
            opener: RecordOpener::new(version, read.keys, read.next_seq),
            sealer: RecordSealer::new(version, write.keys, write.next_seq),
            read_secret: read.secret,
            write_secret: write.secret,
        }
    }

    /// Whether the read keys and the write keys have carried three quarters of their AEAD's
    /// confidentiality limit (AES-GCM: 2^24.5 records, RFC 8446 §5.5), so that an endpoint
    /// updates them before the limit, leaving room on hops whose middlebox app adds records.
    /// Only keys that can be updated (TLS 1.3, with a traffic secret) are ever worn.
    pub(crate) fn worn(&self) -> (bool, bool) {
        let worn = |secret: &Option<TrafficSecret>, seq: u64| {
            secret.as_ref().is_some_and(|s| {
                let limit = s.suite().aead.confidentiality_limit();
                seq >= limit - limit / 4
            })
        };
        (
            worn(&self.read_secret, self.opener.next_seq()),
            worn(&self.write_secret, self.sealer.next_seq()),
        )
    }

    /// After a KeyUpdate from the neighbour: its next records are under the next generation of
    /// its keys, from sequence number 0.
    pub(crate) fn update_read_keys(&mut self) -> Result<(), MbtlsError> {
        let next = next_generation(self.read_secret.as_ref())?;
        self.opener = RecordOpener::new(self.version, next.keys, 0);
        self.read_secret = next.secret;
        Ok(())
    }

    /// After sending a KeyUpdate to the neighbour: what follows is under the next generation
    /// of our keys, from sequence number 0.
    pub(crate) fn update_write_keys(&mut self) -> Result<(), MbtlsError> {
        let next = next_generation(self.write_secret.as_ref())?;
        self.sealer = RecordSealer::new(self.version, next.keys, 0);
        self.write_secret = next.secret;
        Ok(())
    }

    pub(crate) fn version(&self) -> TlsVersion {
        self.version
    }

    /// The buffered incomplete record, taken out so that records can be handled while the
    /// hop is borrowed elsewhere; give it back with [`restore_pending`](Self::restore_pending).
    pub(crate) fn take_pending(&mut self) -> Vec<u8> {
        core::mem::take(&mut self.pending)
    }

    pub(crate) fn restore_pending(&mut self, pending: Vec<u8>) {
        self.pending = pending;
    }

    /// Bytes of an incomplete record held until the rest comes.
    pub(crate) fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    pub(crate) fn pending_capacity(&self) -> usize {
        self.pending.capacity()
    }

    /// Gives back the memory of the incomplete-record buffer beyond what it holds, all of it
    /// when empty (ciphertext only, so the old allocation needs no wipe).
    pub(crate) fn release_idle_buffer(&mut self) {
        self.pending.shrink_to_fit();
    }

    /// Opens one complete record where it lies. The plaintext is `record[range]`; the caller
    /// wipes it ([`mbx_record::wipe::wipe`]) after use.
    pub(crate) fn open_in_place(
        &mut self,
        record: &mut [u8],
    ) -> Result<OpenedInPlace, RecordError> {
        self.opener.open_in_place(record)
    }

    /// Room [`seal_in_place`](Self::seal_in_place) needs in front of the plaintext.
    pub(crate) fn seal_prefix_len(&self) -> usize {
        self.sealer.seal_prefix_len()
    }

    /// What sealing in place appends after the plaintext (TLS 1.3 inner type, AEAD tag).
    pub(crate) fn seal_suffix_len(&self) -> usize {
        self.sealer.seal_suffix_len()
    }

    /// Seal `buf[start + seal_prefix_len()..]` (≤ 2^14 bytes) in place as one record.
    pub(crate) fn seal_in_place(
        &mut self,
        ct: ContentType,
        buf: &mut Vec<u8>,
        start: usize,
    ) -> Result<(), RecordError> {
        self.sealer.seal_in_place(ct, buf, start)
    }

    /// Seal the plaintext at `record[seal_prefix_len()..][..plain_len]` where it lies, the
    /// record's other bytes being room (a record just opened in place): the new record's
    /// length (`record[..len]`). On error the plaintext is wiped.
    pub(crate) fn seal_record_in_place(
        &mut self,
        ct: ContentType,
        record: &mut [u8],
        plain_len: usize,
    ) -> Result<usize, RecordError> {
        self.sealer.seal_record_in_place(ct, record, plain_len)
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

/// The keys after a KeyUpdate, or why there are none (no traffic secret: TLS 1.2).
pub(crate) fn next_generation(secret: Option<&TrafficSecret>) -> Result<DirectionKeys, MbtlsError> {
    let secret = secret.ok_or(MbtlsError::KeyMaterial(
        "this hop has no traffic secret (TLS 1.2): it cannot update its keys",
    ))?;
    DirectionKeys::from_secret(secret.next()?, 0)
}

fn deframer_config(version: TlsVersion) -> DeframerConfig {
    match version {
        TlsVersion::Tls12 => DeframerConfig::tls12(),
        TlsVersion::Tls13 => DeframerConfig::tls13(),
    }
}

/// Total length (header included) of the record starting `buf`, once its header is there
/// (checked then); `None` while fewer than 5 bytes are.
fn record_len(cfg: &DeframerConfig, buf: &[u8]) -> Result<Option<usize>, WireError> {
    if buf.len() < HEADER_LEN {
        return Ok(None);
    }
    let header = RecordHeader::parse(buf)?;
    header.validate(cfg)?;
    Ok(Some(HEADER_LEN + usize::from(header.length)))
}

/// Length of the complete record at the start of `buf`; `None` if more bytes are needed.
fn frame(cfg: &DeframerConfig, buf: &[u8]) -> Result<Option<usize>, WireError> {
    Ok(record_len(cfg, buf)?.filter(|total| buf.len() >= *total))
}

/// Bytes still missing from the (non-empty) incomplete record in `pending`; 0 once complete.
fn missing(cfg: &DeframerConfig, pending: &[u8]) -> Result<usize, WireError> {
    let total = record_len(cfg, pending)?.unwrap_or(HEADER_LEN);
    Ok(total.saturating_sub(pending.len()))
}

/// Calls `f` on every complete record in `buf`, in order, until it returns `false`. Returns
/// where the incomplete tail starts, or `None` if `f` stopped or the framing failed (`f` is
/// then called once with the error, and the rest is dropped).
fn each_record(
    cfg: &DeframerConfig,
    buf: &mut [u8],
    f: &mut impl FnMut(Result<&mut [u8], WireError>, usize) -> bool,
) -> Option<usize> {
    let mut pos = 0;
    loop {
        let rest = buf.get_mut(pos..).unwrap_or_default();
        match frame(cfg, rest) {
            Err(e) => {
                f(Err(e), pos);
                return None;
            }
            Ok(None) => return Some(pos),
            Ok(Some(total)) => {
                if !f(Ok(rest.get_mut(..total).unwrap_or_default()), pos) {
                    return None;
                }
                pos += total;
            }
        }
    }
}

/// Splits the stream of one neighbour into records: `pending` (the incomplete record left from
/// earlier calls, see [`Hop::take_pending`]) is completed from `input` first, then every
/// complete record of `input` follows, and the incomplete tail is left in `pending`. Each
/// record is passed to `f` mutably (to be opened in place), or the framing error that ends the
/// stream. When `f` returns `false` (the stream ended or failed) the rest is dropped.
///
/// Only lent input is used in place; borrowed input is copied into `pending` first.
pub(crate) fn for_each_record(
    version: TlsVersion,
    pending: &mut Vec<u8>,
    input: Input<'_>,
    mut f: impl FnMut(Result<&mut [u8], WireError>) -> bool,
) {
    for_each_record_at(version, pending, input, |record, _| f(record));
}

/// [`for_each_record`], telling for each record where it starts in lent input (`None`: it
/// was completed in `pending`, or the input was borrowed).
pub(crate) fn for_each_record_at(
    version: TlsVersion,
    pending: &mut Vec<u8>,
    input: Input<'_>,
    mut f: impl FnMut(Result<&mut [u8], WireError>, Option<usize>) -> bool,
) {
    let cfg = deframer_config(version);
    let mut input = input;
    // Where the rest of `input` starts in what was lent.
    let mut base = 0;
    if !pending.is_empty() {
        loop {
            match missing(&cfg, pending) {
                Err(e) => {
                    pending.clear();
                    f(Err(e), None);
                    return;
                }
                Ok(0) => break,
                Ok(need) => {
                    let take = need.min(input.len());
                    pending.extend_from_slice(input.bytes().get(..take).unwrap_or_default());
                    input = input.advance(take);
                    base += take;
                    if take < need {
                        return;
                    }
                }
            }
        }
        let go_on = f(Ok(pending.as_mut_slice()), None);
        pending.clear();
        if !go_on {
            return;
        }
    }
    match input {
        Input::Lent(buf) => {
            if let Some(tail) = each_record(&cfg, buf, &mut |r, at| f(r, Some(base + at))) {
                pending.extend_from_slice(buf.get(tail..).unwrap_or_default());
            }
        }
        Input::Borrowed(bytes) => {
            pending.extend_from_slice(bytes);
            match each_record(&cfg, pending, &mut |r, _| f(r, None)) {
                Some(tail) => {
                    pending.drain(..tail);
                }
                None => pending.clear(),
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MbtlsError;

    #[test]
    fn alerts_display_level_and_name() {
        let fatal = Alert::fatal(AlertDescription::DECRYPT_ERROR);
        assert_eq!(fatal.to_string(), "fatal decrypt_error(51)");
        assert_eq!(
            MbtlsError::Failed(fatal).to_string(),
            "session failed with alert fatal decrypt_error(51)"
        );
        assert_eq!(Alert::close_notify().to_string(), "warning close_notify(0)");
    }
}
