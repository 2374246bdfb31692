//! The few facts this crate reads from certificates and public keys: names, serial, SKI.

use openssl::sha::{sha1, sha256};
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::FromDer;
use x509_parser::x509::SubjectPublicKeyInfo;

/// A certificate or public key that could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot parse {0}")]
pub struct ParseError(pub &'static str);

/// Subject key identifier, RFC 5280 §4.2.1.2 method 1: SHA-1 of the subjectPublicKey BIT STRING
/// contents (without tag, length and unused-bits byte), from a DER SubjectPublicKeyInfo.
pub fn ski_from_spki(spki_der: &[u8]) -> Result<[u8; 20], ParseError> {
    let (_, spki) =
        SubjectPublicKeyInfo::from_der(spki_der).map_err(|_| ParseError("SubjectPublicKeyInfo"))?;
    Ok(sha1(&spki.subject_public_key.data))
}

/// The SKI of a certificate's subject key.
pub fn ski_from_certificate(cert_der: &[u8]) -> Result<[u8; 20], ParseError> {
    let (_, cert) =
        x509_parser::parse_x509_certificate(cert_der).map_err(|_| ParseError("certificate"))?;
    Ok(sha1(&cert.public_key().subject_public_key.data))
}

/// Subject common names and DNS subjectAltNames, lower-cased, without duplicates.
pub fn certificate_names(cert_der: &[u8]) -> Result<Vec<String>, ParseError> {
    let (_, cert) =
        x509_parser::parse_x509_certificate(cert_der).map_err(|_| ParseError("certificate"))?;
    let mut names = Vec::new();
    for cn in cert.subject().iter_common_name() {
        if let Ok(s) = cn.as_str() {
            names.push(s.to_ascii_lowercase());
        }
    }
    let san = cert
        .subject_alternative_name()
        .map_err(|_| ParseError("subjectAltName"))?;
    if let Some(san) = san {
        for name in &san.value.general_names {
            if let GeneralName::DNSName(dns) = name {
                names.push(dns.to_ascii_lowercase());
            }
        }
    }
    names.sort();
    names.dedup();
    Ok(names)
}

/// The serial number's magnitude, big-endian, without leading zero bytes.
pub fn certificate_serial(cert_der: &[u8]) -> Result<Vec<u8>, ParseError> {
    let (_, cert) =
        x509_parser::parse_x509_certificate(cert_der).map_err(|_| ParseError("certificate"))?;
    Ok(strip_leading_zeros(cert.raw_serial()).to_vec())
}

/// SHA-256 of the whole DER certificate (the usual "fingerprint").
pub fn certificate_sha256(cert_der: &[u8]) -> [u8; 32] {
    sha256(cert_der)
}

pub(crate) fn strip_leading_zeros(bytes: &[u8]) -> &[u8] {
    let first = bytes.iter().position(|&b| b != 0).unwrap_or(bytes.len());
    bytes.get(first..).unwrap_or_default()
}
