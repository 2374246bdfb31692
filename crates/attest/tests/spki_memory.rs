//! `spki_from_certificate` and `certificate_not_after` remember the certificates they saw
//! last: each certificate still gets its own SubjectPublicKeyInfo and end of validity, however
//! many were seen and in whatever order.

mod common;

use mbx_attest::binding::REMEMBERED_CERTIFICATES;
use mbx_attest::{certificate_not_after, spki_from_certificate};

/// Real DER certificates: the TCB-signing chain of Intel's SGX sample collateral.
fn certificates() -> Vec<Vec<u8>> {
    let chain = common::sgx().collateral.tcb_info_issuer_chain;
    x509_parser::pem::Pem::iter_from_buffer(chain.as_bytes())
        .map(|p| p.expect("PEM").contents)
        .collect()
}

fn parsed_spki(der: &[u8]) -> Vec<u8> {
    let (_, c) = x509_parser::parse_x509_certificate(der).expect("certificate");
    c.tbs_certificate.subject_pki.raw.to_vec()
}

fn parsed_not_after(der: &[u8]) -> u64 {
    let (_, c) = x509_parser::parse_x509_certificate(der).expect("certificate");
    c.validity().not_after.timestamp() as u64
}

#[test]
fn each_certificate_gets_its_own_spki_however_many_are_remembered() {
    let certs = certificates();
    assert_eq!(certs.len(), 2);
    assert_ne!(parsed_spki(&certs[0]), parsed_spki(&certs[1]));
    assert_ne!(parsed_not_after(&certs[0]), parsed_not_after(&certs[1]));
    // Interleaved, with more distinct inputs than are remembered in between (each certificate
    // with a trailing byte, a different DER that parses to the same SPKI), so that remembered
    // and evicted entries are both used.
    for round in 0..(2 * REMEMBERED_CERTIFICATES) {
        for der in &certs {
            assert_eq!(spki_from_certificate(der).unwrap(), parsed_spki(der));
            assert_eq!(certificate_not_after(der).unwrap(), parsed_not_after(der));
        }
        for der in &certs {
            let mut other = der.clone();
            other.push(round as u8);
            assert_eq!(spki_from_certificate(&other).unwrap(), parsed_spki(der));
        }
    }
    // Two certificates of the same length (the shorter one padded; the parser ignores what
    // follows a certificate): told apart by their bytes, not their size.
    let (short, long) = if certs[0].len() < certs[1].len() {
        (&certs[0], &certs[1])
    } else {
        (&certs[1], &certs[0])
    };
    let mut padded = short.clone();
    padded.resize(long.len(), 0);
    for der in [long, &padded, long, &padded] {
        assert_eq!(spki_from_certificate(der).unwrap(), parsed_spki(der));
    }
    assert!(spki_from_certificate(b"not a certificate").is_err());
    assert!(certificate_not_after(b"not a certificate").is_err());
}
