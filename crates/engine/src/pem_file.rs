//! Reading certificates and keys from files, with errors that name the file and say what is
//! wrong with it. OpenSSL's own messages ("no certificate found", "key values mismatch") name
//! neither file nor cause; every embedder, and the CLI, should get the same clear ones.

use std::path::Path;

use openssl::x509::{X509NameRef, X509};

use crate::{EngineError, Identity};

/// What a PEM file must hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PemKind {
    /// Certificates: a chain, or trust roots.
    Certificates,
    /// A private key.
    PrivateKey,
}

/// The bytes of the file at `path`; the error names it as `what` ("certificate",
/// "configuration file", ...) and, for a relative path that does not exist, the directory it
/// was looked for in.
pub fn read_file(path: &Path, what: &str) -> Result<Vec<u8>, EngineError> {
    std::fs::read(path).map_err(|e| {
        // A relative path in a config file is read from the working directory, not the
        // file's (found in a user trial started from another directory).
        let from = match (e.kind(), path.is_relative(), std::env::current_dir()) {
            (std::io::ErrorKind::NotFound, true, Ok(cwd)) => format!(
                " (a relative path is read from the working directory, {})",
                cwd.display()
            ),
            _ => String::new(),
        };
        EngineError::BadFile(format!("cannot read {what} {}{from}: {e}", path.display()))
    })
}

/// [`read_file`], refused at once, naming the file, when it holds no PEM of `kind`: a swapped
/// certificate and key, or a CA's key given as its certificate, are otherwise found deep in
/// the TLS library.
pub fn read_pem_file(path: &Path, what: &str, kind: PemKind) -> Result<Vec<u8>, EngineError> {
    // A private key given where it does not belong is wiped when refused.
    let mut bytes = zeroize::Zeroizing::new(read_file(path, what)?);
    let holds = |marker: &str| bytes.windows(marker.len()).any(|w| w == marker.as_bytes());
    let (marker, missing) = match kind {
        PemKind::Certificates => ("CERTIFICATE-----", "no PEM certificate"),
        PemKind::PrivateKey => ("PRIVATE KEY-----", "no PEM private key"),
    };
    if holds(marker) {
        return Ok(std::mem::take(&mut *bytes));
    }
    let instead = match kind {
        PemKind::Certificates if holds("PRIVATE KEY-----") => {
            " (it holds a private key: certificate and key swapped?)"
        }
        PemKind::PrivateKey if holds("CERTIFICATE-----") => {
            " (it holds a certificate: certificate and key swapped?)"
        }
        PemKind::Certificates if holds("CERTIFICATE REQUEST-----") => {
            " (it holds a certificate signing request: give the certificate issued for it)"
        }
        _ => "",
    };
    Err(EngineError::BadFile(format!(
        "{what} {} holds {missing}{instead}",
        path.display()
    )))
}

/// A certificate's subject or issuer on one line (`CN=…, O=…`).
pub fn name_text(name: &X509NameRef) -> String {
    name.entries()
        .map(|e| {
            let key = e.object().nid().short_name().unwrap_or("?");
            let value = e.data().to_string().unwrap_or_default();
            format!("{key}={value}")
        })
        .collect::<Vec<_>>()
        .join(", ")
}

impl Identity {
    /// From PEM files: the certificate chain (leaf first, then the CAs that issued it) and
    /// the private key. Refused, naming the file, when a file cannot be read or holds no PEM
    /// of its kind (certificate and key swapped, a signing request instead of its
    /// certificate), when the key is encrypted (a service cannot ask for a passphrase), and
    /// when the key is not the leaf's (a chain in the wrong order is said to be one). A
    /// certificate or key that does not parse is left to the TLS library, which says why when
    /// a context is built from it.
    pub fn from_pem_files(
        cert_chain: impl AsRef<Path>,
        key: impl AsRef<Path>,
    ) -> Result<Identity, EngineError> {
        let (cert_path, key_path) = (cert_chain.as_ref(), key.as_ref());
        let id = Identity::from_pem(
            read_pem_file(cert_path, "certificate", PemKind::Certificates)?,
            read_pem_file(key_path, "private key", PemKind::PrivateKey)?,
        );
        let key = match id.private_key() {
            Err(EngineError::EncryptedPrivateKey) => {
                return Err(EngineError::BadFile(format!(
                    "private key {0} is encrypted (passphrase-protected), and a service cannot \
                     ask for a passphrase at each start and reload: give it unencrypted, \
                     readable by the service only (e.g. openssl pkey -in {0} -out plain.key)",
                    key_path.display()
                )))
            }
            other => other,
        };
        // The first certificate is the leaf, as the engines take it.
        let chain = X509::stack_from_pem(&id.cert_chain_pem).unwrap_or_default();
        let (Some(leaf), Ok(key)) = (chain.first(), key) else {
            return Ok(id);
        };
        let belongs = |c: &X509| c.public_key().is_ok_and(|k| k.public_eq(&key));
        if belongs(leaf) {
            return Ok(id);
        }
        // A chain in the wrong order (`cat ca.pem leaf.pem`): the key is a later one's.
        Err(EngineError::BadFile(match chain.iter().position(belongs) {
            Some(n) => format!(
                "certificate {} lists its certificates in the wrong order: the private key \
                 belongs to certificate {} of the file ({}), but the leaf must come first (then \
                 the CAs that issued it)",
                cert_path.display(),
                n + 1,
                name_text(chain[n].subject_name())
            ),
            None => format!(
                "private key {} does not belong to certificate {} (their public keys differ)",
                key_path.display(),
                cert_path.display()
            ),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mbx_testbed::pki::{LeafSpec, TestPki};

    /// Each way a pair of files can be wrong is refused with a message naming the file and
    /// the cause; a good pair is read as it is.
    #[test]
    fn an_identity_from_files_says_which_file_is_wrong_and_how() {
        let pki = TestPki::new("pem-file-test").unwrap();
        let leaf = pki.issue(&LeafSpec::server("server.test")).unwrap();
        let other = pki.issue(&LeafSpec::server("other.test")).unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let file = |name: &str, text: &str| {
            let path = tmp.path().join(name);
            std::fs::write(&path, text).unwrap();
            path
        };
        let chain = file("chain.pem", &(leaf.cert_pem() + &pki.root_pem()));
        let key = file("key.pem", &leaf.key_pem());
        let refused =
            |cert: &Path, key: &Path| Identity::from_pem_files(cert, key).unwrap_err().to_string();

        let id = Identity::from_pem_files(&chain, &key).unwrap();
        assert_eq!(id.cert_chain_pem, std::fs::read(&chain).unwrap());
        assert_eq!(*id.key_pem, std::fs::read(&key).unwrap());

        let missing = tmp.path().join("missing.pem");
        let e = refused(&chain, &missing);
        assert!(
            e.starts_with("cannot read private key") && e.contains("missing.pem"),
            "{e}"
        );
        let e = refused(Path::new("no-such-dir/chain.pem"), &key);
        assert!(
            e.contains("a relative path is read from the working directory"),
            "{e}"
        );

        let e = refused(&key, &chain);
        assert!(
            e.contains("holds no PEM certificate") && e.contains("swapped?"),
            "{e}"
        );
        let csr = file("req.pem", "-----BEGIN CERTIFICATE REQUEST-----\n");
        assert!(refused(&csr, &key).contains("a certificate signing request"));

        let other_key = file("other.key", &other.key_pem());
        let e = refused(&chain, &other_key);
        assert!(e.contains("does not belong to certificate"), "{e}");
        assert!(e.contains("other.key") && e.contains("chain.pem"), "{e}");

        let backwards = file("backwards.pem", &(pki.root_pem() + &leaf.cert_pem()));
        let e = refused(&backwards, &key);
        assert!(
            e.contains("wrong order") && e.contains("certificate 2"),
            "{e}"
        );

        let pkey = openssl::pkey::PKey::private_key_from_pem(leaf.key_pem().as_bytes()).unwrap();
        let encrypted = pkey
            .private_key_to_pem_pkcs8_passphrase(openssl::symm::Cipher::aes_256_cbc(), b"pw")
            .unwrap();
        let encrypted = file("encrypted.key", std::str::from_utf8(&encrypted).unwrap());
        let e = refused(&chain, &encrypted);
        assert!(e.contains("encrypted.key is encrypted"), "{e}");
    }
}
