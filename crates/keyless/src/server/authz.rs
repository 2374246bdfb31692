//! Which edge may use which key.
//!
//! An edge is identified by the names in its client certificate (subject CN and DNS SANs); each
//! configured identity lists the keys it may use, by SKI or by host name (a name from a
//! certificate that carries the key). An edge that is not authorized for a key is told the key
//! does not exist (error 0x02), so it cannot probe which keys the server holds.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::Deserialize;

use crate::keys::KeyHandle;
use crate::x509;

/// The authenticated identity of an edge: the names of its verified client certificate.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EdgeIdentity {
    names: Vec<String>,
}

impl EdgeIdentity {
    /// An identity with these names (compared case-insensitively).
    pub fn new(names: impl IntoIterator<Item = String>) -> EdgeIdentity {
        let mut names: Vec<String> = names.into_iter().map(|n| n.to_ascii_lowercase()).collect();
        names.sort();
        names.dedup();
        EdgeIdentity { names }
    }

    /// The subject CN and DNS SANs of a (verified) certificate.
    pub fn from_certificate(cert_der: &[u8]) -> Result<EdgeIdentity, x509::ParseError> {
        Ok(EdgeIdentity::new(x509::certificate_names(cert_der)?))
    }

    /// The names, lower case.
    pub fn names(&self) -> &[String] {
        &self.names
    }
}

/// One identity's grant, as written in TOML.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct EdgeGrant {
    /// SKIs (hex, colons allowed) of keys the edge may use.
    #[serde(default)]
    pub skis: Vec<String>,
    /// Host names whose keys the edge may use.
    #[serde(default)]
    pub hostnames: Vec<String>,
}

/// Errors in the authorization configuration.
#[derive(Debug, thiserror::Error)]
pub enum AuthzError {
    /// The TOML is malformed.
    #[error("authorization config: {0}")]
    Toml(#[from] toml::de::Error),
    /// An SKI is not 20 bytes of hex.
    #[error("edge {edge:?}: SKI {ski:?} is not 40 hex digits")]
    BadSki {
        /// The identity.
        edge: String,
        /// The bad value.
        ski: String,
    },
}

#[derive(Debug, Clone, Default)]
struct Grant {
    skis: HashSet<[u8; 20]>,
    hostnames: HashSet<String>,
}

/// Edge identity → permitted keys.
#[derive(Debug, Clone, Default)]
pub struct Authorization {
    grants: HashMap<String, Grant>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AuthzFile {
    #[serde(default)]
    edges: BTreeMap<String, EdgeGrant>,
}

impl Authorization {
    /// Nobody may use anything.
    pub fn new() -> Authorization {
        Authorization::default()
    }

    /// From `[edges."<identity>"]` tables with `skis` and `hostnames` lists.
    pub fn from_toml(text: &str) -> Result<Authorization, AuthzError> {
        let file: AuthzFile = toml::from_str(text)?;
        Authorization::from_grants(&file.edges)
    }

    /// From already parsed grants.
    pub fn from_grants(grants: &BTreeMap<String, EdgeGrant>) -> Result<Authorization, AuthzError> {
        let mut authz = Authorization::new();
        for (edge, grant) in grants {
            let mut skis = Vec::new();
            for s in &grant.skis {
                let clean: String = s.chars().filter(|c| *c != ':').collect();
                let ski: [u8; 20] = hex::decode(&clean)
                    .ok()
                    .and_then(|v| v.try_into().ok())
                    .ok_or_else(|| AuthzError::BadSki {
                        edge: edge.clone(),
                        ski: s.clone(),
                    })?;
                skis.push(ski);
            }
            authz.allow(edge, skis, grant.hostnames.iter().cloned());
        }
        Ok(authz)
    }

    /// Grants `identity` the keys with these SKIs and host names (adds to earlier grants).
    pub fn allow(
        &mut self,
        identity: &str,
        skis: impl IntoIterator<Item = [u8; 20]>,
        hostnames: impl IntoIterator<Item = String>,
    ) {
        let grant = self
            .grants
            .entry(identity.to_ascii_lowercase())
            .or_default();
        grant.skis.extend(skis);
        grant
            .hostnames
            .extend(hostnames.into_iter().map(|h| h.to_ascii_lowercase()));
    }

    /// Whether any of the edge's names is granted this key, by SKI or by one of its host names.
    pub fn permits(&self, edge: &EdgeIdentity, key: &dyn KeyHandle) -> bool {
        let ski = key.ski();
        edge.names()
            .iter()
            .filter_map(|n| self.grants.get(n))
            .any(|g| {
                g.skis.contains(&ski) || key.hostnames().iter().any(|h| g.hostnames.contains(h))
            })
    }
}
