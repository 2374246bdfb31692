//! Sites served by the edge: a certificate chain per SNI name whose key is on a key server, the
//! names the certificate covers (for the Host check) and the origin behind it.

use std::collections::HashMap;
use std::sync::Arc;

use rustls::pki_types::CertificateDer;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use x509_parser::oid_registry;

use super::signer::SiteKeyKind;
use crate::x509;

/// One site.
#[derive(Debug)]
pub struct Site {
    /// The SNI name that selects it (lower case).
    pub sni: String,
    /// Chain and remote key given to rustls.
    pub certified: Arc<CertifiedKey>,
    /// Names of the leaf certificate (CN and DNS SANs, lower case; may hold wildcards).
    pub names: Vec<String>,
    /// Index of the site's origin in the edge's origin list.
    pub origin: usize,
}

impl Site {
    /// Whether an HTTP Host value (port and trailing dot removed) is a name of this site's
    /// certificate. A wildcard `*.example.com` covers exactly one more label.
    pub fn covers_host(&self, host: &str) -> bool {
        let host = host_without_port(host)
            .trim_end_matches('.')
            .to_ascii_lowercase();
        !host.is_empty() && self.names.iter().any(|n| name_matches(n, &host))
    }
}

/// `host[:port]` or `[v6]:port` → the host part.
pub fn host_without_port(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or("");
    }
    match host.rsplit_once(':') {
        Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => host,
    }
}

/// RFC 6125 matching: exact, or `*.` covering exactly one left-most label.
pub fn name_matches(pattern: &str, host: &str) -> bool {
    match pattern.strip_prefix("*.") {
        Some(suffix) => host
            .split_once('.')
            .is_some_and(|(label, rest)| !label.is_empty() && rest == suffix),
        None => pattern == host,
    }
}

/// What kind of key a certificate's subject key is (RSA, ECDSA curve, Ed25519).
pub fn key_kind(cert: &CertificateDer<'_>) -> Result<SiteKeyKind, x509::ParseError> {
    let (_, parsed) =
        x509_parser::parse_x509_certificate(cert).map_err(|_| x509::ParseError("certificate"))?;
    let spki = parsed.public_key();
    let alg = &spki.algorithm.algorithm;
    if *alg == oid_registry::OID_PKCS1_RSAENCRYPTION {
        return Ok(SiteKeyKind::Rsa);
    }
    if *alg == oid_registry::OID_SIG_ED25519 {
        return Ok(SiteKeyKind::Ed25519);
    }
    if *alg == oid_registry::OID_KEY_TYPE_EC_PUBLIC_KEY {
        let curve = spki
            .algorithm
            .parameters
            .as_ref()
            .and_then(|p| p.as_oid().ok())
            .ok_or(x509::ParseError("EC curve"))?;
        if curve == oid_registry::OID_EC_P256 {
            return Ok(SiteKeyKind::EcdsaP256);
        }
        if curve == oid_registry::OID_NIST_EC_P384 {
            return Ok(SiteKeyKind::EcdsaP384);
        }
        if curve == oid_registry::OID_NIST_EC_P521 {
            return Ok(SiteKeyKind::EcdsaP521);
        }
        return Err(x509::ParseError(
            "EC curve (P-256, P-384 or P-521 expected)",
        ));
    }
    Err(x509::ParseError(
        "key algorithm (RSA, ECDSA or Ed25519 expected)",
    ))
}

/// The set of sites, by SNI name.
#[derive(Debug, Default)]
pub struct SiteSet {
    by_sni: HashMap<String, Arc<Site>>,
}

impl SiteSet {
    /// An empty set.
    pub fn new() -> SiteSet {
        SiteSet::default()
    }

    /// Adds a site; a second site with the same SNI name replaces the first.
    pub fn insert(&mut self, site: Site) {
        self.by_sni.insert(site.sni.clone(), Arc::new(site));
    }

    /// The site for an SNI name (case-insensitive, trailing dot ignored).
    pub fn get(&self, sni: &str) -> Option<&Arc<Site>> {
        self.by_sni
            .get(&sni.trim_end_matches('.').to_ascii_lowercase())
    }

    /// Number of sites.
    pub fn len(&self) -> usize {
        self.by_sni.len()
    }

    /// Whether there is no site.
    pub fn is_empty(&self) -> bool {
        self.by_sni.is_empty()
    }

    /// All sites.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Site>> {
        self.by_sni.values()
    }
}

/// Certificate choice by SNI: no SNI or an unknown name aborts the handshake (rustls answers
/// with an alert), so a client never gets some other site's certificate.
#[derive(Debug)]
pub struct SniResolver {
    sites: Arc<SiteSet>,
}

impl SniResolver {
    /// A resolver over `sites`.
    pub fn new(sites: Arc<SiteSet>) -> SniResolver {
        SniResolver { sites }
    }
}

impl ResolvesServerCert for SniResolver {
    fn resolve(&self, client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let name = client_hello.server_name()?;
        let site = self.sites.get(name);
        if site.is_none() {
            tracing::info!(sni = name, "no site for this SNI name");
        }
        site.map(|s| Arc::clone(&s.certified))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_names_match_exactly_or_by_one_wildcard_label() {
        assert!(name_matches("www.a.test", "www.a.test"));
        assert!(!name_matches("www.a.test", "www.b.test"));
        assert!(name_matches("*.a.test", "x.a.test"));
        assert!(!name_matches("*.a.test", "a.test"));
        assert!(!name_matches("*.a.test", "y.x.a.test"));
        assert_eq!(host_without_port("a.test:8443"), "a.test");
        assert_eq!(host_without_port("[::1]:443"), "::1");
        assert_eq!(host_without_port("a.test"), "a.test");
    }
}
