//! Binding evidence to one TLS session.
//!
//! The attester puts `report_data(spki, binder)` into its evidence; the verifier recomputes it from the
//! middlebox certificate it saw and from *its own* view of the binder. The binder is normally the TLS
//! exporter of the secondary session, which is unique per handshake, so evidence replayed from an earlier
//! handshake carries a different value and is refused (spec `attestation.md`, "Binding").

use std::collections::VecDeque;
use std::sync::{Mutex, PoisonError};

use sha2::{Digest, Sha256, Sha512};
use subtle::ConstantTimeEq;

/// Domain-separation prefix of the binding hash.
pub const BINDING_CONTEXT: &[u8] = b"mbtls attestation v1";

/// TLS exporter label (RFC 5705 / RFC 8446 §7.5) whose output is the default binder.
pub const EXPORTER_LABEL: &[u8] = b"EXPORTER-mbtls-attestation";

/// Length in bytes of the exporter output used as binder.
pub const EXPORTER_LEN: usize = 32;

/// Length of a TEE report's user data field (SGX/TDX `REPORTDATA`).
pub const REPORT_DATA_LEN: usize = 64;

/// `SHA-512("mbtls attestation v1" ‖ SHA-256(spki_der) ‖ binder)`.
///
/// `spki_der` is the DER SubjectPublicKeyInfo of the middlebox's TLS key, which ties the evidence to
/// the key that terminates the secondary session; `binder` is the exporter value (or a verifier
/// nonce). No length prefix is needed: the only variable-length input comes last.
pub fn report_data(spki_der: &[u8], binder: &[u8]) -> [u8; REPORT_DATA_LEN] {
    let spki_hash = Sha256::digest(spki_der);
    let mut h = Sha512::new();
    h.update(BINDING_CONTEXT);
    h.update(spki_hash);
    h.update(binder);
    h.finalize().into()
}

/// Certificates whose SubjectPublicKeyInfo [`spki_from_certificate`] (and end of validity,
/// [`certificate_not_after`]) keeps: an endpoint meets the same few middleboxes on every
/// session, and parsing a certificate costs ≈ 2 µs alone and ≈ 8 µs inside a handshake
/// (docs/mbtls.md §9).
pub const REMEMBERED_CERTIFICATES: usize = 16;

/// What the verifier reads from a middlebox's certificate.
#[derive(Clone)]
struct CertificateFacts {
    spki: Vec<u8>,
    /// `notAfter`, seconds since the Unix epoch (0 before it).
    not_after: u64,
}

/// The facts of a DER X.509 certificate, parsed or remembered. The last
/// [`REMEMBERED_CERTIFICATES`] certificates seen are remembered (the whole DER is the key, so
/// a certificate is never mistaken for another).
fn certificate_facts(cert_der: &[u8]) -> Result<CertificateFacts, crate::AttestError> {
    static SEEN: RememberedByDer<CertificateFacts> = RememberedByDer::new();
    if let Some(facts) = SEEN.get(cert_der) {
        return Ok(facts);
    }
    let (_, cert) = x509_parser::parse_x509_certificate(cert_der)
        .map_err(|_| crate::AttestError::Malformed("certificate is not valid DER X.509"))?;
    let facts = CertificateFacts {
        spki: cert.tbs_certificate.subject_pki.raw.to_vec(),
        not_after: u64::try_from(cert.validity().not_after.timestamp()).unwrap_or(0),
    };
    SEEN.put(cert_der, facts.clone());
    Ok(facts)
}

/// What was learned about the last [`REMEMBERED_CERTIFICATES`] certificates, keyed by their
/// whole DER (so a certificate is never mistaken for another), most recently used last.
pub(crate) struct RememberedByDer<T>(Mutex<VecDeque<(Vec<u8>, T)>>);

impl<T: Clone> RememberedByDer<T> {
    pub(crate) const fn new() -> Self {
        RememberedByDer(Mutex::new(VecDeque::new()))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<(Vec<u8>, T)>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// What is remembered of `der`, which becomes the most recently used.
    pub(crate) fn get(&self, der: &[u8]) -> Option<T> {
        let mut seen = self.lock();
        let i = seen.iter().position(|(d, _)| d == der)?;
        let entry = seen.remove(i)?;
        let found = entry.1.clone();
        seen.push_back(entry);
        Some(found)
    }

    /// Remembers `value` for `der` (replacing what was), forgetting the least recently used.
    pub(crate) fn put(&self, der: &[u8], value: T) {
        let mut seen = self.lock();
        seen.retain(|(d, _)| d != der);
        while seen.len() >= REMEMBERED_CERTIFICATES {
            seen.pop_front();
        }
        seen.push_back((der.to_vec(), value));
    }
}

/// The DER SubjectPublicKeyInfo of a DER X.509 certificate: the `spki_der` input of
/// [`report_data`] when the verifier knows the attester's key from its TLS certificate
/// (remembered, [`REMEMBERED_CERTIFICATES`]).
pub fn spki_from_certificate(cert_der: &[u8]) -> Result<Vec<u8>, crate::AttestError> {
    Ok(certificate_facts(cert_der)?.spki)
}

/// The end of a DER X.509 certificate's validity (`notAfter`, inclusive), in seconds since
/// the Unix epoch (remembered, [`REMEMBERED_CERTIFICATES`]): how long a session resumed from
/// one that checked the certificate may rely on that check (docs/mbtls.md §4.7).
pub fn certificate_not_after(cert_der: &[u8]) -> Result<u64, crate::AttestError> {
    Ok(certificate_facts(cert_der)?.not_after)
}

/// Constant-time equality of two report_data values.
///
/// Not secret as such, but the comparison is the freshness check, so it leaks nothing about how much
/// of a forged value was right.
pub fn report_data_eq(a: &[u8; REPORT_DATA_LEN], b: &[u8; REPORT_DATA_LEN]) -> bool {
    bool::from(a.ct_eq(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binding_depends_on_every_input() {
        let base = report_data(b"spki", &[1; 32]);
        assert_ne!(base, report_data(b"spkj", &[1; 32]));
        assert_ne!(base, report_data(b"spki", &[2; 32]));
        assert!(report_data_eq(&base, &report_data(b"spki", &[1; 32])));
    }

    #[test]
    fn spki_extraction_rejects_garbage() {
        assert!(spki_from_certificate(b"not a certificate").is_err());
        assert!(spki_from_certificate(&[]).is_err());
    }

    #[test]
    fn binding_matches_the_spec_formula() {
        let spki = b"some spki";
        let binder = [7u8; 32];
        let mut input = Vec::new();
        input.extend_from_slice(b"mbtls attestation v1");
        input.extend_from_slice(&Sha256::digest(spki));
        input.extend_from_slice(&binder);
        let expected: [u8; 64] = Sha512::digest(&input).into();
        assert_eq!(report_data(spki, &binder), expected);
        assert_eq!(EXPORTER_LABEL, b"EXPORTER-mbtls-attestation");
    }
}
