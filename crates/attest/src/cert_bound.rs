//! Evidence carried in the middlebox's certificate: the spec's second binding mode
//! (`attestation.md`, "binder = verifier nonce"), RA-TLS style, for deployments that check
//! certificates and would rather not have the middlebox quote on every session.
//!
//! `report_data = SHA-512("mbtls attestation v1" ‖ SHA-256(SPKI) ‖ nonce)`: the binder is a
//! nonce the verifier chose (at certification: the CA's challenge), not the session's exporter.
//! The evidence and the nonce ride in an X.509 extension with the TCG's interoperable OID
//! 2.23.133.5.4.9 (the DICE conceptual message wrapper, CMW). Its value is a CMW CBOR record,
//! `[type, value]`, with our media type [`CMW_TYPE`] and as value
//! `nonce length (1 byte) ‖ nonce ‖ evidence` (the evidence in its usual wire encoding).
//!
//! What it rests on differs from the per-session binding: the evidence says the TEE made the
//! key pair and holds its private half; each session then proves possession of that key (its
//! CertificateVerify), not that the TEE is running now. A key taken out of the TEE would pass
//! until the certificate expires, so endpoints accept this mode only when their policy says so
//! (`certificate_evidence = true`), and may pin the nonces they issued (`certificate_nonces`).

use crate::binding::{report_data, RememberedByDer};
use crate::claims::Claims;
use crate::error::AttestError;
use crate::evidence::Evidence;
use crate::policy::Policy;
use crate::verify::{recheck_claims, verify_bytes, Attester};

/// Certificates whose evidence [`check_certificate_evidence`] checked in full, remembered (the
/// last [`REMEMBERED_CERTIFICATES`](crate::binding::REMEMBERED_CERTIFICATES)) with the claims,
/// the nonce and the time of the check: an endpoint meets the same few middleboxes on every
/// session, and the evidence of a certificate cannot change. A remembered check stands, its
/// claims checked again under the caller's policy, for the policy's
/// `resumed_evidence_max_age` (as a resumed session's does); then the evidence is checked in
/// full again.
static CHECKED: RememberedByDer<CertificateCheck> = RememberedByDer::new();

/// The extension's OID, 2.23.133.5.4.9 (tcg-dice-conceptual-message-wrapper).
pub const EVIDENCE_EXTENSION_OID: [u64; 6] = [2, 23, 133, 5, 4, 9];

/// The media type that names our content inside the wrapper.
pub const CMW_TYPE: &str = "application/vnd.mbx.mbtls-evidence";

/// The longest nonce (a length byte frames it; 64 bytes is more than any challenge needs).
/// A nonce of 32 bytes, the session exporter's length, is refused (`check_nonce`).
pub const MAX_NONCE_LEN: usize = 64;

/// The largest extension value read (compressed DCAP evidence is under 10 KB).
pub const MAX_EXTENSION_LEN: usize = 64 * 1024;

/// What the middlebox sends on a session instead of evidence of its own: "see my certificate".
/// One byte, the evidence encoding's kind tag 4, which no evidence kind uses.
pub const IN_CERTIFICATE: &[u8] = &[4];

/// Evidence bound to a key and a nonce, as a certificate carries it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertificateEvidence {
    /// The verifier's nonce (the binder).
    pub nonce: Vec<u8>,
    /// The evidence, in its wire encoding ([`Evidence::to_bytes`]).
    pub evidence: Vec<u8>,
}

impl CertificateEvidence {
    /// Evidence from `attester` for the key `spki_der` and `nonce`.
    pub fn make(
        attester: &dyn Attester,
        spki_der: &[u8],
        nonce: &[u8],
    ) -> Result<Self, AttestError> {
        check_nonce(nonce)?;
        let evidence = attester.evidence(&report_data(spki_der, nonce))?;
        Ok(CertificateEvidence {
            nonce: nonce.to_vec(),
            evidence: evidence.to_bytes(),
        })
    }

    /// The extension's value (what its OCTET STRING holds): the CMW CBOR record.
    pub fn encode(&self) -> Result<Vec<u8>, AttestError> {
        check_nonce(&self.nonce)?;
        let mut value = Vec::with_capacity(1 + self.nonce.len() + self.evidence.len());
        value.push(self.nonce.len() as u8);
        value.extend_from_slice(&self.nonce);
        value.extend_from_slice(&self.evidence);
        let mut out = Vec::with_capacity(value.len() + CMW_TYPE.len() + 12);
        out.push(0x82); // a CBOR array of two items
        cbor_head(&mut out, 3, CMW_TYPE.len());
        out.extend_from_slice(CMW_TYPE.as_bytes());
        cbor_head(&mut out, 2, value.len());
        out.extend_from_slice(&value);
        if out.len() > MAX_EXTENSION_LEN {
            return Err(AttestError::TooLarge {
                what: "certificate evidence extension",
                len: out.len(),
                max: MAX_EXTENSION_LEN,
            });
        }
        Ok(out)
    }

    /// Reads an extension value. Only the definite-length record with our type is taken;
    /// anything else, or a byte after it, is an error. Never panics.
    pub fn decode(bytes: &[u8]) -> Result<Self, AttestError> {
        if bytes.len() > MAX_EXTENSION_LEN {
            return Err(AttestError::TooLarge {
                what: "certificate evidence extension",
                len: bytes.len(),
                max: MAX_EXTENSION_LEN,
            });
        }
        let rest = bytes.strip_prefix(&[0x82]).ok_or(AttestError::Malformed(
            "certificate evidence: not a CMW record",
        ))?;
        let (media_type, rest) = cbor_item(rest, 3)?;
        if media_type != CMW_TYPE.as_bytes() {
            return Err(AttestError::Malformed(
                "certificate evidence: another CMW type than ours",
            ));
        }
        let (value, rest) = cbor_item(rest, 2)?;
        if !rest.is_empty() {
            return Err(AttestError::Malformed(
                "certificate evidence: bytes after the CMW record",
            ));
        }
        let (&len, value) = value
            .split_first()
            .ok_or(AttestError::Malformed("certificate evidence: empty value"))?;
        let len = usize::from(len);
        if len > MAX_NONCE_LEN || len > value.len() {
            return Err(AttestError::Malformed("certificate evidence: nonce length"));
        }
        let (nonce, evidence) = value.split_at(len);
        check_nonce(nonce)?;
        Ok(CertificateEvidence {
            nonce: nonce.to_vec(),
            evidence: evidence.to_vec(),
        })
    }

    /// Whether the evidence's report_data binds `spki_der` and this nonce, read without
    /// checking the evidence itself (its endpoints do): the middlebox's start-up check that
    /// its certificate carries evidence for its own key. Also gives the code measurement
    /// the evidence claims, for its banner.
    pub fn check_binding(&self, spki_der: &[u8]) -> Result<Vec<u8>, AttestError> {
        let (bound, measurement) = Evidence::from_bytes(&self.evidence)?.claimed_unverified()?;
        if !crate::binding::report_data_eq(&bound, &report_data(spki_der, &self.nonce)) {
            return Err(AttestError::ReportDataMismatch);
        }
        Ok(measurement)
    }

    /// The evidence a DER certificate carries in its extension, if it has one.
    pub fn from_certificate(cert_der: &[u8]) -> Result<Option<Self>, AttestError> {
        Ok(Self::with_key(cert_der)?.map(|(found, _)| found))
    }

    /// [`from_certificate`](Self::from_certificate), with the certificate's
    /// SubjectPublicKeyInfo (DER), from the same parse.
    fn with_key(cert_der: &[u8]) -> Result<Option<(Self, Vec<u8>)>, AttestError> {
        let (_, cert) = x509_parser::parse_x509_certificate(cert_der)
            .map_err(|_| AttestError::Malformed("certificate"))?;
        let found = cert
            .get_extension_unique(&evidence_oid()?)
            .map_err(|_| AttestError::Malformed("certificate evidence: extension twice"))?;
        let spki = cert.tbs_certificate.subject_pki.raw;
        found
            .map(|ext| Ok((Self::decode(ext.value)?, spki.to_vec())))
            .transpose()
    }

    /// The full check of this evidence: bound to `spki_der` and its nonce, under `policy`
    /// (which must take the mode and the nonce) at `now_unix`.
    fn check(
        self,
        spki_der: &[u8],
        policy: &Policy,
        now_unix: u64,
    ) -> Result<CertificateCheck, AttestError> {
        policy.check_certificate_evidence(&self.nonce)?;
        let bound = report_data(spki_der, &self.nonce);
        let claims = verify_bytes(&self.evidence, &bound, policy, now_unix)?;
        Ok(CertificateCheck {
            claims,
            nonce: self.nonce,
            checked_at: now_unix,
        })
    }
}

/// The extension's OID as x509-parser compares it.
fn evidence_oid() -> Result<x509_parser::oid_registry::Oid<'static>, AttestError> {
    x509_parser::oid_registry::Oid::from(&EVIDENCE_EXTENSION_OID)
        .map_err(|_| AttestError::Malformed("certificate evidence OID"))
}

/// The claims of the evidence in `cert_der`'s extension, checked under `policy` at `now_unix`:
/// the policy must accept this mode and, if it lists nonces, this one; the evidence must be
/// bound to the certificate's own key and that nonce.
pub fn verify_certificate_evidence(
    cert_der: &[u8],
    policy: &Policy,
    now_unix: u64,
) -> Result<Claims, AttestError> {
    Ok(check_certificate_evidence(cert_der, policy, now_unix)?.claims)
}

/// What [`check_certificate_evidence`] found.
#[derive(Clone, Debug)]
pub struct CertificateCheck {
    /// The evidence's claims.
    pub claims: Claims,
    /// The nonce the evidence is bound to.
    pub nonce: Vec<u8>,
    /// When the evidence was last checked in full (seconds since the Unix epoch): earlier
    /// than `now_unix` when a remembered check answered.
    pub checked_at: u64,
}

/// [`verify_certificate_evidence`], with the nonce and the time of the full check the answer
/// rests on (a session resumed from this one must count its age from there).
pub fn check_certificate_evidence(
    cert_der: &[u8],
    policy: &Policy,
    now_unix: u64,
) -> Result<CertificateCheck, AttestError> {
    if !policy.certificate_evidence {
        return Err(AttestError::CertificateEvidenceNotAllowed);
    }
    if let Some(check) = CHECKED.get(cert_der) {
        policy.check_certificate_evidence(&check.nonce)?;
        match recheck_claims(&check.claims, check.checked_at, now_unix, policy) {
            Ok(()) => return Ok(check),
            // Checked too long ago: in full again, below.
            Err(AttestError::EvidenceTooOld { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    let (found, spki) =
        CertificateEvidence::with_key(cert_der)?.ok_or(AttestError::NoCertificateEvidence)?;
    let check = found.check(&spki, policy, now_unix)?;
    CHECKED.put(cert_der, check.clone());
    Ok(check)
}

/// What a CA checks before it signs a middlebox's certificate signing request (DER): the
/// evidence in the request's extension, bound to the request's own key and nonce, under
/// `policy` (which must take the mode, and its `certificate_nonces`, if any, the nonce). The
/// request's own signature (proof that its sender holds the key) is the signing tool's to
/// check, as `openssl x509 -req` does.
pub fn check_request_evidence(
    csr_der: &[u8],
    policy: &Policy,
    now_unix: u64,
) -> Result<CertificateCheck, AttestError> {
    use x509_parser::certification_request::X509CertificationRequest;
    use x509_parser::cri_attributes::ParsedCriAttribute;
    use x509_parser::prelude::FromDer;
    let oid = evidence_oid()?;
    let (rest, csr) = X509CertificationRequest::from_der(csr_der)
        .map_err(|_| AttestError::Malformed("certificate signing request"))?;
    if !rest.is_empty() {
        return Err(AttestError::Malformed(
            "bytes after the certificate signing request",
        ));
    }
    let info = &csr.certification_request_info;
    let value = info
        .iter_attributes()
        .find_map(|a| match a.parsed_attribute() {
            ParsedCriAttribute::ExtensionRequest(r) => r.extensions.iter().find(|e| e.oid == oid),
            _ => None,
        })
        .ok_or(AttestError::NoCertificateEvidence)?
        .value;
    CertificateEvidence::decode(value)?.check(info.subject_pki.raw, policy, now_unix)
}

/// A nonce of the exporter's length would make the two modes' report_data inputs the same
/// shape: evidence made for a certificate with a session's exporter as its nonce would pass
/// as that session's evidence (found in a review). Every other length keeps them apart (the
/// binder comes last, after fixed-length parts, so inputs of different lengths differ).
fn check_nonce(nonce: &[u8]) -> Result<(), AttestError> {
    if nonce.len() > MAX_NONCE_LEN {
        return Err(AttestError::TooLarge {
            what: "certificate evidence nonce",
            len: nonce.len(),
            max: MAX_NONCE_LEN,
        });
    }
    if nonce.len() == crate::binding::EXPORTER_LEN {
        return Err(AttestError::Malformed(
            "a certificate evidence nonce of 32 bytes (the session exporter's length) is \
             refused: it could pass for a session's binder; use another length",
        ));
    }
    Ok(())
}

/// A CBOR head of major type `major` and argument `len` (definite length).
fn cbor_head(out: &mut Vec<u8>, major: u8, len: usize) {
    let m = major << 5;
    match len {
        0..=23 => out.push(m | len as u8),
        24..=0xff => out.extend_from_slice(&[m | 24, len as u8]),
        0x100..=0xffff => {
            out.push(m | 25);
            out.extend_from_slice(&(len as u16).to_be_bytes());
        }
        _ => {
            out.push(m | 26);
            out.extend_from_slice(&(len as u32).to_be_bytes());
        }
    }
}

/// A definite-length CBOR byte string (major 2) or text string (major 3) at the start of
/// `bytes`: its contents and what follows.
fn cbor_item(bytes: &[u8], major: u8) -> Result<(&[u8], &[u8]), AttestError> {
    const BAD: AttestError = AttestError::Malformed("certificate evidence: CBOR item");
    let (&first, rest) = bytes.split_first().ok_or(BAD)?;
    if first >> 5 != major {
        return Err(BAD);
    }
    let (len, rest) = match first & 0x1f {
        n @ 0..=23 => (usize::from(n), rest),
        24 => {
            let (&b, rest) = rest.split_first().ok_or(BAD)?;
            (usize::from(b), rest)
        }
        25 => {
            let (b, rest) = rest.split_at_checked(2).ok_or(BAD)?;
            (usize::from(u16::from_be_bytes([b[0], b[1]])), rest)
        }
        26 => {
            let (b, rest) = rest.split_at_checked(4).ok_or(BAD)?;
            let n = u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
            (usize::try_from(n).map_err(|_| BAD)?, rest)
        }
        // 8-byte lengths, indefinite lengths and reserved values: not ours.
        _ => return Err(BAD),
    };
    rest.split_at_checked(len).ok_or(BAD)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_back_and_every_cut_of_it_is_refused() {
        for (nonce, evidence) in [
            (vec![], vec![]),
            (vec![7; 31], vec![1; 20]),
            (vec![9; 64], vec![3; 300]),
            (vec![1], vec![5; 60_000]),
        ] {
            let ce = CertificateEvidence { nonce, evidence };
            let bytes = ce.encode().unwrap();
            assert_eq!(CertificateEvidence::decode(&bytes).unwrap(), ce);
            if bytes.len() < 2_000 {
                for cut in 0..bytes.len() {
                    assert!(CertificateEvidence::decode(&bytes[..cut]).is_err(), "{cut}");
                }
            }
            let mut longer = bytes.clone();
            longer.push(0);
            assert!(CertificateEvidence::decode(&longer).is_err());
        }
        let too_long = CertificateEvidence {
            nonce: vec![0; MAX_NONCE_LEN + 1],
            evidence: vec![],
        };
        assert!(too_long.encode().is_err());
    }

    /// A nonce of the session exporter's length is refused everywhere: evidence made with a
    /// session's exporter as the nonce would pass as that session's evidence (found in a
    /// review, where `--certificate-request --nonce <exporter>` forged session evidence).
    #[test]
    fn a_nonce_of_the_exporters_length_is_refused() {
        let platform = std::sync::Arc::new(crate::SimulatedPlatform::from_seed(&[5; 32]).unwrap());
        let attester = crate::SimulatedAttester::new(platform, [1; 32], [2; 32]);
        let exporter = [9u8; crate::binding::EXPORTER_LEN];
        assert!(CertificateEvidence::make(&attester, b"spki", &exporter).is_err());
        // Made by hand and encoded around the check: refused when read.
        let mut bytes = CertificateEvidence {
            nonce: vec![1; 31],
            evidence: vec![],
        }
        .encode()
        .unwrap();
        // The record's value starts after the array head, the type (a two-byte head: over 23
        // bytes) and the byte-string head (two bytes for a value under 256): its first byte
        // is the nonce length.
        let at = 1 + 2 + CMW_TYPE.len() + 2;
        bytes[at] = 32;
        bytes.push(0);
        bytes[at - 1] += 1;
        let e = CertificateEvidence::decode(&bytes).unwrap_err().to_string();
        assert!(e.contains("of 32 bytes"), "{e}");
    }

    /// A full check is remembered with its time; within the policy's resumed_evidence_max_age
    /// it answers (under each caller's policy), past it the evidence is checked in full again
    /// and remembered anew.
    #[test]
    fn a_full_check_is_remembered_until_it_is_too_old() {
        let platform = std::sync::Arc::new(crate::SimulatedPlatform::from_seed(&[6; 32]).unwrap());
        let attester = crate::SimulatedAttester::new(platform.clone(), [3; 32], [4; 32]);
        let key = rcgen::KeyPair::generate().unwrap();
        let spki = rcgen::PublicKeyData::subject_public_key_info(&key);
        let value = CertificateEvidence::make(&attester, &spki, b"n")
            .unwrap()
            .encode()
            .unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["mb.test".to_string()]).unwrap();
        params
            .custom_extensions
            .push(rcgen::CustomExtension::from_oid_content(
                &EVIDENCE_EXTENSION_OID,
                value,
            ));
        let cert = params.self_signed(&key).unwrap().der().to_vec();
        let policy = Policy {
            allow_simulated: true,
            measurements: vec![crate::HexBytes::from([3u8; 32])],
            sim_platform_keys: vec![crate::HexBytes::from(platform.public_key())],
            certificate_evidence: true,
            resumed_evidence_max_age: 100,
            ..Policy::default()
        };
        const T: u64 = 1_700_000_000;
        assert_eq!(
            check_certificate_evidence(&cert, &policy, T)
                .unwrap()
                .checked_at,
            T
        );
        assert_eq!(CHECKED.get(&cert).map(|c| c.checked_at), Some(T));
        // Answered from memory: the time of the full check, not now.
        let answer = check_certificate_evidence(&cert, &policy, T + 50).unwrap();
        assert_eq!(answer.checked_at, T);
        // Past the age: in full again, remembered anew.
        let again = check_certificate_evidence(&cert, &policy, T + 500).unwrap();
        assert_eq!(again.checked_at, T + 500);
        assert_eq!(CHECKED.get(&cert).map(|c| c.checked_at), Some(T + 500));
    }

    #[test]
    fn another_type_or_shape_is_refused() {
        let ce = CertificateEvidence {
            nonce: vec![1, 2],
            evidence: vec![3],
        };
        let mut bytes = ce.encode().unwrap();
        // The type's first letter.
        bytes[2] ^= 0x01;
        assert!(CertificateEvidence::decode(&bytes).is_err());
        // An indefinite-length array.
        assert!(CertificateEvidence::decode(&[0x9f, 0xff]).is_err());
    }

    proptest::proptest! {
        /// A record, then cut, one byte changed, or bytes added: an error, or a record that
        /// encodes back to one that reads the same; never a panic. (Random bytes alone would
        /// almost never reach past the record's head.)
        #[test]
        fn any_altered_record_decodes_or_fails_cleanly(
            nonce in proptest::strategy::Strategy::prop_filter(
                proptest::collection::vec(proptest::prelude::any::<u8>(), 0..=MAX_NONCE_LEN),
                "not the exporter's length",
                |n| n.len() != crate::binding::EXPORTER_LEN,
            ),
            evidence in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300),
            cut in proptest::prelude::any::<proptest::sample::Index>(),
            flip in proptest::prelude::any::<(proptest::sample::Index, u8)>(),
            added in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..4),
        ) {
            let record = CertificateEvidence { nonce, evidence };
            let bytes = record.encode().unwrap();
            proptest::prop_assert_eq!(&CertificateEvidence::decode(&bytes).unwrap(), &record);
            let mut altered = bytes[..cut.index(bytes.len() + 1)].to_vec();
            if !altered.is_empty() {
                let at = flip.0.index(altered.len());
                altered[at] ^= flip.1;
            }
            altered.extend_from_slice(&added);
            if let Ok(ce) = CertificateEvidence::decode(&altered) {
                let again = CertificateEvidence::decode(&ce.encode().unwrap()).unwrap();
                proptest::prop_assert_eq!(again, ce);
            }
        }
    }
}
