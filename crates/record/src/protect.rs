//! Record protection: sealing and opening whole TLS records.
//!
//! TLS 1.2 (RFC 5246 §6.2.3.3): AES-GCM records carry an 8-byte explicit nonce (we send the
//! sequence number, RFC 5288 §3) after a 4-byte implicit salt; ChaCha20-Poly1305 records carry
//! none and XOR the sequence number into a 12-byte IV (RFC 7905 §2). AAD = seq ‖ type ‖
//! version ‖ plaintext length.
//!
//! TLS 1.3 (RFC 8446 §5.2–§5.4): nonce = IV XOR padded sequence number, outer type
//! application_data and version 0x0303, AAD = the 5-byte header, and the plaintext is
//! `content ‖ type ‖ zeros`.
//!
//! Sequence numbers are never reused and never wrap: at 2^64−1 both sides stop with
//! [`RecordError::SequenceExhausted`]. An AES-GCM sealer stops earlier, at the key's
//! confidentiality limit ([`RecordError::KeyUsageLimit`], RFC 8446 §5.5; alerts excepted). An
//! opener that saw one bad record refuses all later ones.

use core::fmt;
use core::ops::Range;

use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey};
use mbx_wire::record::{
    HEADER_LEN, MAX_CIPHERTEXT_LEN_TLS12, MAX_CIPHERTEXT_LEN_TLS13, MAX_PLAINTEXT_LEN,
};
use mbx_wire::{version, ContentType, RecordHeader, WireError};
use zeroize::{Zeroize, Zeroizing};

use crate::error::RecordError;
use crate::keys::TrafficKeys;
use crate::suite::{Aead, TlsVersion};
use crate::wipe::{reserve, wipe, SecretBytes};

/// The version field every protected record carries (TLS 1.2, and TLS 1.3's legacy value).
const RECORD_VERSION: u16 = version::TLS1_2;

/// A successfully opened record.
pub struct Opened {
    /// The content type; for TLS 1.3 the inner (real) type.
    pub content_type: ContentType,
    /// Wiped (word-wise, spare capacity included) when dropped.
    pub plaintext: SecretBytes,
}

impl fmt::Debug for Opened {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Opened")
            .field("content_type", &self.content_type)
            .field("plaintext_len", &self.plaintext.len())
            .finish()
    }
}

/// The keyed AEAD plus what is needed to build nonces.
struct Cipher {
    version: TlsVersion,
    aead: Aead,
    key: LessSafeKey,
    /// TLS 1.3 / TLS 1.2 ChaCha20: the full IV. TLS 1.2 GCM: the salt, then zeros.
    iv: Zeroizing<[u8; 12]>,
    fingerprint: [u8; 8],
}

impl Cipher {
    fn new(version: TlsVersion, keys: &TrafficKeys) -> Result<Cipher, RecordError> {
        let aead = keys.aead();
        let want_iv = match version {
            TlsVersion::Tls13 => aead.nonce_len(),
            TlsVersion::Tls12 => aead.tls12_fixed_iv_len(),
        };
        if keys.iv().len() != want_iv {
            return Err(RecordError::BadIvLength);
        }
        let mut iv = Zeroizing::new([0u8; 12]);
        iv.get_mut(..want_iv)
            .ok_or(RecordError::BadIvLength)?
            .copy_from_slice(keys.iv());
        let unbound =
            UnboundKey::new(aead.algorithm(), keys.key()).map_err(|_| RecordError::BadKeyLength)?;
        Ok(Cipher {
            version,
            aead,
            key: LessSafeKey::new(unbound),
            iv,
            fingerprint: keys.fingerprint(),
        })
    }

    /// The nonce for `seq`, given the explicit part carried in the record (TLS 1.2 GCM only).
    fn nonce(&self, seq: u64, explicit: Option<&[u8; 8]>) -> Nonce {
        let mut n = *self.iv;
        match explicit {
            Some(e) => {
                for (d, s) in n.iter_mut().skip(4).zip(e) {
                    *d = *s;
                }
            }
            None => {
                for (d, s) in n.iter_mut().skip(4).zip(seq.to_be_bytes()) {
                    *d ^= s;
                }
            }
        }
        let nonce = Nonce::assume_unique_for_key(n);
        n.zeroize();
        nonce
    }

    fn explicit_len(&self) -> usize {
        match self.version {
            TlsVersion::Tls13 => 0,
            TlsVersion::Tls12 => self.aead.tls12_explicit_nonce_len(),
        }
    }
}

/// Content types a sealer/opener accepts: the known ones plus those explicitly allowed.
#[derive(Debug, Clone, Default)]
struct TypePolicy {
    extra: Vec<ContentType>,
}

impl TypePolicy {
    fn allows(&self, version: TlsVersion, ct: ContentType) -> bool {
        // TLS 1.3 never protects change_cipher_spec: a protected one is an unexpected_message
        // (RFC 8446 §5).
        if version == TlsVersion::Tls13 && ct == ContentType::CHANGE_CIPHER_SPEC {
            return false;
        }
        ct.is_known() || (ct.0 != 0 && self.extra.contains(&ct))
    }
}

fn header_bytes(ct: ContentType, len: usize) -> Result<[u8; HEADER_LEN], RecordError> {
    let length = u16::try_from(len).map_err(|_| RecordError::RecordOverflow)?;
    Ok(RecordHeader {
        content_type: ct,
        version: RECORD_VERSION,
        length,
    }
    .encode())
}

/// TLS 1.2 additional data: seq ‖ type ‖ version ‖ length (RFC 5246 §6.2.3.3).
fn tls12_aad(seq: u64, ct: ContentType, version: u16, len: usize) -> Result<[u8; 13], RecordError> {
    let len = u16::try_from(len).map_err(|_| RecordError::RecordOverflow)?;
    let mut aad = [0u8; 13];
    let parts = seq
        .to_be_bytes()
        .into_iter()
        .chain([ct.0])
        .chain(version.to_be_bytes())
        .chain(len.to_be_bytes());
    for (d, s) in aad.iter_mut().zip(parts) {
        *d = s;
    }
    Ok(aad)
}

/// Protects outgoing records for one direction.
pub struct RecordSealer {
    cipher: Result<Cipher, RecordError>,
    seq: u64,
    types: TypePolicy,
    /// TLS 1.2 GCM: explicit nonce = `seq + explicit_offset` (wrapping). Fixed before the first
    /// record, so explicit nonces stay as unique as sequence numbers.
    explicit_offset: u64,
    sealed_any: bool,
}

impl RecordSealer {
    /// A sealer whose first record uses sequence number `next_seq`. Keys that do not fit
    /// `version` (IV length) make every `seal` fail with that error.
    pub fn new(version: TlsVersion, keys: TrafficKeys, next_seq: u64) -> Self {
        RecordSealer {
            cipher: Cipher::new(version, &keys),
            seq: next_seq,
            types: TypePolicy::default(),
            explicit_offset: 0,
            sealed_any: false,
        }
    }

    /// TLS 1.2 AES-GCM only, before the first record: make the next record's explicit nonce
    /// `next_explicit` and count up from there, one per record.
    ///
    /// By default the explicit nonce is the sequence number. OpenSSL instead counts from a random
    /// start; continuing its counter lets a verifier re-encrypt a captured session byte for byte.
    /// Uniqueness is kept: the nonce is the sequence number plus a fixed offset.
    pub fn continue_explicit_nonces(&mut self, next_explicit: [u8; 8]) -> Result<(), RecordError> {
        let cipher = self.cipher.as_ref().map_err(Clone::clone)?;
        if cipher.explicit_len() != 8 {
            return Err(RecordError::UnexpectedExplicitNonce);
        }
        if self.sealed_any {
            return Err(RecordError::UnexpectedExplicitNonce);
        }
        self.explicit_offset = u64::from_be_bytes(next_explicit).wrapping_sub(self.seq);
        Ok(())
    }

    /// Also accept content type `ct` (e.g. mbTLS's 30/31/32). Type 0 is never accepted.
    pub fn allow_content_type(&mut self, ct: ContentType) {
        self.types.extra.push(ct);
    }

    /// Sequence number of the next record.
    pub fn next_seq(&self) -> u64 {
        self.seq
    }

    /// The fingerprint of the keys in use ([`TrafficKeys::fingerprint`]), if they were usable.
    pub fn key_fingerprint(&self) -> Option<[u8; 8]> {
        self.cipher.as_ref().ok().map(|c| c.fingerprint)
    }

    /// Append one protected record (header + payload) to `out`. `plaintext` ≤ 2^14 bytes.
    pub fn seal(
        &mut self,
        content_type: ContentType,
        plaintext: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), RecordError> {
        self.seal_padded(content_type, plaintext, 0, out)
    }

    /// Like [`seal`](Self::seal) with `padding` zero bytes after the inner content type
    /// (TLS 1.3 only; any padding for TLS 1.2 is [`RecordError::PaddingNotAllowed`]).
    pub fn seal_padded(
        &mut self,
        content_type: ContentType,
        plaintext: &[u8],
        padding: usize,
        out: &mut Vec<u8>,
    ) -> Result<(), RecordError> {
        let cipher = self.cipher.as_ref().map_err(Clone::clone)?;
        if plaintext.len() > MAX_PLAINTEXT_LEN {
            return Err(RecordError::RecordOverflow);
        }
        let prefix = HEADER_LEN + cipher.explicit_len();
        let tag_len = cipher.aead.tag_len();
        let start = out.len();
        // Room for the whole record up front: sealing never reallocates (and so never leaves
        // a copy of the plaintext in freed memory).
        // (An impossible padding is refused below; it must not make the reservation overflow.)
        let padding_room = padding.min(MAX_PLAINTEXT_LEN + 1);
        out.reserve(prefix + plaintext.len() + 1 + padding_room + tag_len);
        out.resize(start + prefix, 0);
        out.extend_from_slice(plaintext);
        self.seal_vec_in_place(content_type, out, start, padding)
    }

    /// Bytes [`seal_in_place`](Self::seal_in_place) needs in front of the plaintext: the
    /// record header, and for TLS 1.2 AES-GCM the explicit nonce.
    pub fn seal_prefix_len(&self) -> usize {
        HEADER_LEN
            + self
                .cipher
                .as_ref()
                .map(Cipher::explicit_len)
                .unwrap_or_default()
    }

    /// Bytes [`seal_in_place`](Self::seal_in_place) appends after the plaintext: for TLS 1.3
    /// the inner content type, then the AEAD tag.
    pub fn seal_suffix_len(&self) -> usize {
        self.cipher.as_ref().map_or(0, |c| {
            let inner = usize::from(c.version == TlsVersion::Tls13);
            inner + c.aead.tag_len()
        })
    }

    /// Seals the plaintext that is already in `buf`, where it lies: `buf[start..]` is
    /// [`seal_prefix_len`](Self::seal_prefix_len) bytes of room (any value) followed by the
    /// plaintext (≤ 2^14 bytes). The room becomes the header (and explicit nonce), the
    /// plaintext becomes ciphertext, and the TLS 1.3 inner type and the tag are appended, so
    /// `buf[start..]` is then one protected record, as [`seal`](Self::seal) would have
    /// appended it. If `buf` must grow for the trailer, its old allocation is wiped first.
    ///
    /// On error `buf` is truncated to `start` and the bytes after it are wiped.
    pub fn seal_in_place(
        &mut self,
        content_type: ContentType,
        buf: &mut Vec<u8>,
        start: usize,
    ) -> Result<(), RecordError> {
        self.seal_vec_in_place(content_type, buf, start, 0)
    }

    /// `buf[start..]`: room, then the plaintext; sealed with `padding`. On error `buf` is
    /// truncated to `start` and the bytes after it are wiped.
    fn seal_vec_in_place(
        &mut self,
        content_type: ContentType,
        buf: &mut Vec<u8>,
        start: usize,
        padding: usize,
    ) -> Result<(), RecordError> {
        let result = self.try_seal_vec(content_type, buf, start, padding);
        if result.is_err() {
            // Do not leave plaintext behind in the caller's buffer.
            if let Some(tail) = buf.get_mut(start..) {
                wipe(tail);
            }
            buf.truncate(start);
        }
        result
    }

    fn try_seal_vec(
        &mut self,
        content_type: ContentType,
        buf: &mut Vec<u8>,
        start: usize,
        padding: usize,
    ) -> Result<(), RecordError> {
        let plain_len = buf
            .len()
            .checked_sub(start + self.seal_prefix_len())
            .ok_or(RecordError::EncryptFailed)?;
        // Checked before the buffer grows for it.
        if padding > MAX_PLAINTEXT_LEN + 1 {
            return Err(RecordError::RecordOverflow);
        }
        let suffix = self.seal_suffix_len() + padding;
        reserve(buf, suffix);
        buf.resize(buf.len() + suffix, 0);
        let record = buf.get_mut(start..).ok_or(RecordError::EncryptFailed)?;
        let len = self.seal_record(content_type, record, plain_len, padding)?;
        buf.truncate(start + len);
        Ok(())
    }

    /// Seals, where it lies, the plaintext of a record buffer: `record` is
    /// [`seal_prefix_len`](Self::seal_prefix_len) bytes of room, `plain_len` bytes of plaintext
    /// (≤ 2^14), and at least [`seal_suffix_len`](Self::seal_suffix_len) more bytes of any
    /// value. Returns the protected record's length: it is `record[..len]`, as
    /// [`seal`](Self::seal) would have appended it (e.g. a record just opened in place, sealed
    /// again for another hop without moving its bytes). On error the plaintext is wiped.
    pub fn seal_record_in_place(
        &mut self,
        content_type: ContentType,
        record: &mut [u8],
        plain_len: usize,
    ) -> Result<usize, RecordError> {
        self.seal_record(content_type, record, plain_len, 0)
    }

    fn seal_record(
        &mut self,
        content_type: ContentType,
        record: &mut [u8],
        plain_len: usize,
        padding: usize,
    ) -> Result<usize, RecordError> {
        let result = self.try_seal_record(content_type, record, plain_len, padding);
        match result {
            Ok(_) => {
                self.seq += 1;
                self.sealed_any = true;
            }
            Err(_) => {
                let at = self.seal_prefix_len();
                let plain = record.get_mut(at..at.saturating_add(plain_len));
                wipe(plain.unwrap_or_default());
            }
        }
        result
    }

    fn try_seal_record(
        &self,
        content_type: ContentType,
        record: &mut [u8],
        plain_len: usize,
        padding: usize,
    ) -> Result<usize, RecordError> {
        let cipher = self.cipher.as_ref().map_err(Clone::clone)?;
        if cipher.version == TlsVersion::Tls12 && padding > 0 {
            return Err(RecordError::PaddingNotAllowed);
        }
        if !self.types.allows(cipher.version, content_type) {
            return Err(RecordError::UnexpectedContentType);
        }
        let explicit = cipher.explicit_len();
        let body_at = HEADER_LEN + explicit;
        if plain_len == 0 && !content_type.may_be_empty() {
            return Err(RecordError::EmptyFragment);
        }
        if plain_len > MAX_PLAINTEXT_LEN {
            return Err(RecordError::RecordOverflow);
        }
        if self.seq == u64::MAX {
            return Err(RecordError::SequenceExhausted);
        }
        // A fatal alert or close_notify may still go out at the limit: it is the last record,
        // and the peer learns why the session ends (the limit has a wide safety margin).
        if self.seq >= cipher.aead.confidentiality_limit() && content_type != ContentType::ALERT {
            return Err(RecordError::KeyUsageLimit);
        }
        let tag_len = cipher.aead.tag_len();
        let (header, aad, body_len) = match cipher.version {
            TlsVersion::Tls13 => {
                // TLSInnerPlaintext must not exceed 2^14 + 1 bytes (RFC 8446 §5.4).
                let inner = plain_len
                    .checked_add(1)
                    .and_then(|n| n.checked_add(padding))
                    .filter(|n| *n <= MAX_PLAINTEXT_LEN + 1)
                    .ok_or(RecordError::RecordOverflow)?;
                let header = header_bytes(ContentType::APPLICATION_DATA, inner + tag_len)?;
                let trailer = record
                    .get_mut(body_at + plain_len..body_at + inner)
                    .ok_or(RecordError::EncryptFailed)?;
                trailer.fill(0);
                if let Some(ct) = trailer.first_mut() {
                    *ct = content_type.0;
                }
                (header, AadBytes::Header(header), inner)
            }
            TlsVersion::Tls12 => {
                let header = header_bytes(content_type, explicit + plain_len + tag_len)?;
                let aad = tls12_aad(self.seq, content_type, RECORD_VERSION, plain_len)?;
                (header, AadBytes::Tls12(aad), plain_len)
            }
        };
        let len = body_at + body_len + tag_len;
        if record.len() < len {
            return Err(RecordError::EncryptFailed);
        }
        let explicit_nonce = self.explicit_nonce().to_be_bytes();
        record
            .get_mut(..HEADER_LEN)
            .ok_or(RecordError::EncryptFailed)?
            .copy_from_slice(&header);
        if explicit == 8 {
            record
                .get_mut(HEADER_LEN..body_at)
                .ok_or(RecordError::EncryptFailed)?
                .copy_from_slice(&explicit_nonce);
        }
        let nonce = match explicit {
            8 => cipher.nonce(self.seq, Some(&explicit_nonce)),
            _ => cipher.nonce(self.seq, None),
        };
        let aad = aad.as_aad();
        let body = record
            .get_mut(body_at..body_at + body_len)
            .ok_or(RecordError::EncryptFailed)?;
        let tag = cipher
            .key
            .seal_in_place_separate_tag(nonce, aad, body)
            .map_err(|_| RecordError::EncryptFailed)?;
        record
            .get_mut(body_at + body_len..len)
            .ok_or(RecordError::EncryptFailed)?
            .copy_from_slice(tag.as_ref());
        Ok(len)
    }
}

impl RecordSealer {
    fn explicit_nonce(&self) -> u64 {
        self.seq.wrapping_add(self.explicit_offset)
    }
}

impl fmt::Debug for RecordSealer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecordSealer")
            .field("seq", &self.seq)
            .field("keys", &self.key_fingerprint())
            .finish_non_exhaustive()
    }
}

/// Removes protection from incoming records for one direction.
pub struct RecordOpener {
    cipher: Result<Cipher, RecordError>,
    seq: u64,
    types: TypePolicy,
    failed: bool,
}

impl RecordOpener {
    /// An opener expecting sequence number `next_seq` next. Keys that do not fit `version`
    /// make every `open` fail with that error.
    pub fn new(version: TlsVersion, keys: TrafficKeys, next_seq: u64) -> Self {
        RecordOpener {
            cipher: Cipher::new(version, &keys),
            seq: next_seq,
            types: TypePolicy::default(),
            failed: false,
        }
    }

    /// Also accept content type `ct` (e.g. mbTLS's 30/31/32). Type 0 is never accepted.
    pub fn allow_content_type(&mut self, ct: ContentType) {
        self.types.extra.push(ct);
    }

    /// Sequence number of the next record.
    pub fn next_seq(&self) -> u64 {
        self.seq
    }

    /// True once an open has failed: the opener refuses everything from then on.
    pub fn is_poisoned(&self) -> bool {
        self.failed
    }

    pub fn key_fingerprint(&self) -> Option<[u8; 8]> {
        self.cipher.as_ref().ok().map(|c| c.fingerprint)
    }

    /// Open exactly one complete record (header included). The plaintext is copied out of
    /// `record`; see [`open_in_place`](Self::open_in_place) for the copy-free form.
    ///
    /// Any failure is final: this opener returns [`RecordError::Poisoned`] afterwards, since a
    /// stream with one bad record cannot be trusted again (RFC 8446 §5.2: bad_record_mac is
    /// fatal).
    pub fn open(&mut self, record: &[u8]) -> Result<Opened, RecordError> {
        if self.failed {
            return Err(RecordError::Poisoned);
        }
        let result = self.prepare(record).and_then(|p| {
            let sealed = record.get(p.sealed_at..).ok_or(RecordError::BadRecordMac)?;
            let mut buf = SecretBytes::new(sealed.to_vec());
            let (content_type, len) = self.decrypt(&p, &mut buf)?;
            buf.truncate(len);
            Ok(Opened {
                content_type,
                plaintext: buf,
            })
        });
        self.finish(result)
    }

    /// Open exactly one complete record (header included) where it lies: on success the
    /// plaintext is `record[opened.range]`, and the caller must wipe it
    /// ([`crate::wipe::wipe`]) once done with it. On failure no plaintext is left in `record`.
    /// The rest of `record` (header, explicit nonce, tag, TLS 1.3 inner type and padding) is
    /// left unspecified.
    ///
    /// Failures are final, as for [`open`](Self::open).
    pub fn open_in_place(&mut self, record: &mut [u8]) -> Result<OpenedInPlace, RecordError> {
        if self.failed {
            return Err(RecordError::Poisoned);
        }
        let result = self.prepare(record).and_then(|p| {
            let sealed = record
                .get_mut(p.sealed_at..)
                .ok_or(RecordError::BadRecordMac)?;
            let (content_type, len) = self.decrypt(&p, sealed)?;
            Ok(OpenedInPlace {
                content_type,
                range: p.sealed_at..p.sealed_at + len,
            })
        });
        self.finish(result)
    }

    fn finish<T>(&mut self, result: Result<T, RecordError>) -> Result<T, RecordError> {
        match &result {
            Ok(_) => self.seq += 1,
            Err(_) => self.failed = true,
        }
        result
    }

    /// Checks the header and framing of `record` and works out where its AEAD input starts.
    fn prepare(&self, record: &[u8]) -> Result<Prepared, RecordError> {
        let cipher = self.cipher.as_ref().map_err(Clone::clone)?;
        if self.seq == u64::MAX {
            return Err(RecordError::SequenceExhausted);
        }
        let header = RecordHeader::parse(record)?;
        let len = usize::from(header.length);
        let total = HEADER_LEN + len;
        if record.len() < total {
            return Err(WireError::Truncated {
                needed: total - record.len(),
            }
            .into());
        }
        if record.len() > total {
            return Err(WireError::TrailingBytes(record.len() - total).into());
        }
        if (header.version >> 8) as u8 != version::MAJOR {
            return Err(WireError::BadVersion(header.version).into());
        }
        let header_raw: [u8; HEADER_LEN] = record
            .get(..HEADER_LEN)
            .and_then(|h| h.try_into().ok())
            .ok_or(RecordError::BadRecordMac)?;
        let tag_len = cipher.aead.tag_len();
        match cipher.version {
            TlsVersion::Tls13 => {
                if header.content_type != ContentType::APPLICATION_DATA {
                    return Err(RecordError::UnexpectedContentType);
                }
                if len > MAX_CIPHERTEXT_LEN_TLS13 {
                    return Err(RecordError::RecordOverflow);
                }
                if len < tag_len {
                    return Err(RecordError::BadRecordMac);
                }
                Ok(Prepared {
                    aad: AadBytes::Header(header_raw),
                    explicit: None,
                    outer_type: header.content_type,
                    sealed_at: HEADER_LEN,
                })
            }
            TlsVersion::Tls12 => {
                let ct = header.content_type;
                if !self.types.allows(cipher.version, ct) {
                    return Err(RecordError::UnexpectedContentType);
                }
                if len > MAX_CIPHERTEXT_LEN_TLS12 {
                    return Err(RecordError::RecordOverflow);
                }
                let explicit_len = cipher.explicit_len();
                let plain_len = len
                    .checked_sub(explicit_len + tag_len)
                    .ok_or(RecordError::BadRecordMac)?;
                if plain_len > MAX_PLAINTEXT_LEN {
                    return Err(RecordError::RecordOverflow);
                }
                let explicit: Option<[u8; 8]> = if explicit_len > 0 {
                    let e = record
                        .get(HEADER_LEN..HEADER_LEN + 8)
                        .ok_or(RecordError::BadRecordMac)?;
                    Some(<[u8; 8]>::try_from(e).map_err(|_| RecordError::BadRecordMac)?)
                } else {
                    None
                };
                Ok(Prepared {
                    aad: AadBytes::Tls12(tls12_aad(self.seq, ct, header.version, plain_len)?),
                    explicit,
                    outer_type: ct,
                    sealed_at: HEADER_LEN + explicit_len,
                })
            }
        }
    }

    /// Decrypts `sealed` (ciphertext ‖ tag) in place and checks what it holds. Returns the
    /// content type and the plaintext length (at the start of `sealed`). On any error no
    /// plaintext is left in `sealed`.
    fn decrypt(
        &self,
        p: &Prepared,
        sealed: &mut [u8],
    ) -> Result<(ContentType, usize), RecordError> {
        let cipher = self.cipher.as_ref().map_err(Clone::clone)?;
        let nonce = cipher.nonce(self.seq, p.explicit.as_ref());
        let aad = p.aad.as_aad();
        let plain_len = match cipher.key.open_in_place(nonce, aad, sealed) {
            Ok(plain) => plain.len(),
            Err(_) => {
                // AWS-LC clears the output itself on a bad tag; wiping here keeps that true
                // whatever library runs below.
                wipe(sealed);
                return Err(RecordError::BadRecordMac);
            }
        };
        let checked = self.check_plaintext(cipher.version, p.outer_type, sealed.get(..plain_len));
        if checked.is_err() {
            wipe(sealed);
        }
        checked
    }

    /// The content type and content length of an authenticated plaintext.
    fn check_plaintext(
        &self,
        version: TlsVersion,
        outer_type: ContentType,
        plain: Option<&[u8]>,
    ) -> Result<(ContentType, usize), RecordError> {
        let plain = plain.ok_or(RecordError::BadRecordMac)?;
        match version {
            TlsVersion::Tls13 => {
                if plain.len() > MAX_PLAINTEXT_LEN + 1 {
                    return Err(RecordError::RecordOverflow);
                }
                // The content type is the last non-zero byte; zeros after it are padding.
                let type_at = plain
                    .iter()
                    .rposition(|b| *b != 0)
                    .ok_or(RecordError::MissingInnerContentType)?;
                let ct = ContentType(plain.get(type_at).copied().unwrap_or(0));
                if !self.types.allows(version, ct) {
                    return Err(RecordError::UnexpectedContentType);
                }
                if type_at == 0 && !ct.may_be_empty() {
                    return Err(RecordError::EmptyFragment);
                }
                Ok((ct, type_at))
            }
            TlsVersion::Tls12 => {
                if plain.is_empty() && !outer_type.may_be_empty() {
                    return Err(RecordError::EmptyFragment);
                }
                Ok((outer_type, plain.len()))
            }
        }
    }
}

/// A record opened where it lies ([`RecordOpener::open_in_place`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenedInPlace {
    /// The content type; for TLS 1.3 the inner (real) type.
    pub content_type: ContentType,
    /// Where the plaintext is, within the record passed in.
    pub range: Range<usize>,
}

/// The additional data of one record.
enum AadBytes {
    /// TLS 1.3: the record header.
    Header([u8; HEADER_LEN]),
    /// TLS 1.2: seq ‖ type ‖ version ‖ length.
    Tls12([u8; 13]),
}

impl AadBytes {
    fn as_aad(&self) -> Aad<&[u8]> {
        match self {
            AadBytes::Header(h) => Aad::from(&h[..]),
            AadBytes::Tls12(a) => Aad::from(&a[..]),
        }
    }
}

/// What [`RecordOpener::decrypt`] needs from a framed record.
struct Prepared {
    aad: AadBytes,
    explicit: Option<[u8; 8]>,
    outer_type: ContentType,
    /// Offset of ciphertext ‖ tag in the record.
    sealed_at: usize,
}

impl fmt::Debug for RecordOpener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecordOpener")
            .field("seq", &self.seq)
            .field("poisoned", &self.failed)
            .field("keys", &self.key_fingerprint())
            .finish_non_exhaustive()
    }
}
