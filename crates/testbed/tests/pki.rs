//! The test PKI issues certificates that parse, carry the requested SANs/EKUs/validity, and
//! verify (or fail to verify) with `openssl verify`.

use std::net::IpAddr;
use std::process::Command;

use mbx_testbed::peers::ensure_tool;
use mbx_testbed::pki::{KeyType, LeafSpec, Role, TestPki, Validity};
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::*;

fn sans(cert: &X509Certificate<'_>) -> (Vec<String>, Vec<IpAddr>) {
    let mut dns = Vec::new();
    let mut ips = Vec::new();
    if let Ok(Some(ext)) = cert.subject_alternative_name() {
        for name in &ext.value.general_names {
            match name {
                GeneralName::DNSName(d) => dns.push((*d).to_owned()),
                GeneralName::IPAddress(b) => match b.len() {
                    4 => ips.push(IpAddr::from(<[u8; 4]>::try_from(*b).unwrap())),
                    16 => ips.push(IpAddr::from(<[u8; 16]>::try_from(*b).unwrap())),
                    _ => panic!("bad IP SAN"),
                },
                _ => {}
            }
        }
    }
    (dns, ips)
}

fn eku(cert: &X509Certificate<'_>) -> (bool, bool) {
    let ext = cert
        .extended_key_usage()
        .expect("parse EKU")
        .expect("EKU present");
    (ext.value.server_auth, ext.value.client_auth)
}

#[test]
fn server_certs_for_every_key_type_parse_with_sans_eku_validity() {
    let pki = TestPki::new("keys").unwrap();
    let root = pki.root_der().to_vec();
    let (_, root_cert) = parse_x509_certificate(&root).unwrap();
    assert!(root_cert.is_ca());
    for kt in KeyType::ALL {
        let issued = pki
            .issue(
                &LeafSpec::server("server.test")
                    .dns("alt.server.test")
                    .key_type(kt),
            )
            .unwrap();
        assert_eq!(issued.key_type(), kt);
        let der = issued.cert_der().to_vec();
        let (rest, cert) = parse_x509_certificate(&der).unwrap();
        assert!(rest.is_empty());
        let (dns, ips) = sans(&cert);
        assert_eq!(dns, ["server.test", "alt.server.test"], "{kt:?}");
        assert!(ips.contains(&"127.0.0.1".parse().unwrap()), "{kt:?}");
        assert!(ips.contains(&"::1".parse().unwrap()), "{kt:?}");
        assert_eq!(eku(&cert), (true, false), "{kt:?}");
        assert!(!cert.is_ca());
        assert!(cert.validity().is_valid(), "{kt:?}");
        assert_eq!(cert.issuer(), root_cert.subject());

        // The private key is the one in the certificate, in PKCS#8 DER and PEM.
        let key = openssl::pkey::PKey::private_key_from_pkcs8(issued.key_pkcs8_der())
            .unwrap_or_else(|e| panic!("{kt:?}: {e}"));
        let from_pem =
            openssl::pkey::PKey::private_key_from_pem(issued.key_pem().as_bytes()).unwrap();
        let x509 = openssl::x509::X509::from_der(&der).unwrap();
        assert!(x509.public_key().unwrap().public_eq(&key), "{kt:?}");
        // The leaf is signed by the root's key.
        let root_x509 = openssl::x509::X509::from_der(&root).unwrap();
        assert!(x509.verify(&root_x509.public_key().unwrap()).unwrap());
        assert!(from_pem.public_eq(&key));
        let expected_bits = match kt {
            KeyType::Rsa2048 => Some(2048),
            KeyType::Rsa3072 => Some(3072),
            KeyType::Rsa4096 => Some(4096),
            _ => None,
        };
        if let Some(bits) = expected_bits {
            assert_eq!(key.bits(), bits);
        }
        let expected_id = match kt {
            KeyType::Rsa2048 | KeyType::Rsa3072 | KeyType::Rsa4096 => openssl::pkey::Id::RSA,
            KeyType::EcdsaP256 | KeyType::EcdsaP384 => openssl::pkey::Id::EC,
            KeyType::Ed25519 => openssl::pkey::Id::ED25519,
        };
        assert_eq!(key.id(), expected_id, "{kt:?}");
    }
}

#[test]
fn roles_set_extended_key_usage() {
    let pki = TestPki::new("roles").unwrap();
    for (spec, want) in [
        (LeafSpec::server("s.test"), (true, false)),
        (LeafSpec::client("alice"), (false, true)),
        (LeafSpec::middlebox("mb.test"), (true, true)),
        (LeafSpec::new(Role::Client, "bob"), (false, true)),
    ] {
        let issued = pki.issue(&spec).unwrap();
        let der = issued.cert_der().to_vec();
        let (_, cert) = parse_x509_certificate(&der).unwrap();
        assert_eq!(eku(&cert), want, "{:?}", spec.role);
    }
}

#[test]
fn validity_options() {
    let pki = TestPki::new("validity").unwrap();
    let now = ASN1Time::now();
    let expired = pki
        .issue(&LeafSpec::server("old.test").validity(Validity::Expired))
        .unwrap();
    let der = expired.cert_der().to_vec();
    let (_, cert) = parse_x509_certificate(&der).unwrap();
    assert!(cert.validity().not_after < now);
    assert!(!cert.validity().is_valid());

    let future = pki
        .issue(&LeafSpec::server("new.test").validity(Validity::NotYetValid))
        .unwrap();
    let der = future.cert_der().to_vec();
    let (_, cert) = parse_x509_certificate(&der).unwrap();
    assert!(cert.validity().not_before > now);
    assert!(!cert.validity().is_valid());
}

fn openssl_verify(args: &[&std::path::Path], extra: &[&str]) -> (bool, String) {
    let openssl = ensure_tool("openssl", "openssl").unwrap();
    let mut cmd = Command::new(openssl);
    cmd.arg("verify").args(extra);
    let (ca, rest) = args.split_first().unwrap();
    cmd.arg("-CAfile").arg(ca);
    if let Some((untrusted, leaf)) = rest.split_first().filter(|_| rest.len() == 2) {
        cmd.arg("-untrusted").arg(untrusted).arg(leaf[0]);
    } else {
        cmd.args(rest);
    }
    let out = cmd.output().unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn chains_verify_with_openssl() {
    let dir = tempfile::tempdir().unwrap();
    let pki = TestPki::new("chain").unwrap();
    let inter = pki.intermediate("issuing").unwrap();
    let inter2 = inter.intermediate("issuing2").unwrap();
    let other = TestPki::new("unrelated").unwrap();

    // Leaf directly under the root.
    let direct = pki.issue(&LeafSpec::server("direct.test")).unwrap();
    let f = direct.write_to_named(dir.path(), "direct").unwrap();
    let (ok, out) = openssl_verify(&[&f.ca, &f.cert], &["-purpose", "sslserver"]);
    assert!(ok, "{out}");

    // Leaf under one intermediate: fails without the intermediate, verifies with it.
    let leaf = inter
        .issue(&LeafSpec::server("leaf.test").key_type(KeyType::Rsa2048))
        .unwrap();
    assert_eq!(leaf.chain_der().len(), 2);
    assert_eq!(leaf.root_der(), pki.root_der());
    let f = leaf.write_to_named(dir.path(), "leaf").unwrap();
    let (ok, out) = openssl_verify(&[&f.ca, &f.cert], &[]);
    assert!(!ok, "verified without intermediate: {out}");
    let (ok, out) = openssl_verify(
        &[&f.ca, &f.intermediates, &f.cert],
        &["-purpose", "sslserver"],
    );
    assert!(ok, "{out}");

    // Two intermediates.
    let deep = inter2.issue(&LeafSpec::client("deep")).unwrap();
    assert_eq!(deep.chain_der().len(), 3);
    let f = deep.write_to_named(dir.path(), "deep").unwrap();
    let (ok, out) = openssl_verify(
        &[&f.ca, &f.intermediates, &f.cert],
        &["-purpose", "sslclient"],
    );
    assert!(ok, "{out}");
    // A clientAuth-only certificate is not a server certificate.
    let (ok, out) = openssl_verify(
        &[&f.ca, &f.intermediates, &f.cert],
        &["-purpose", "sslserver"],
    );
    assert!(!ok, "client cert accepted as server: {out}");

    // Wrong CA.
    let f_other = other.issue(&LeafSpec::server("direct.test")).unwrap();
    let fo = f_other.write_to_named(dir.path(), "other").unwrap();
    let wrong_ca = dir.path().join("direct.ca.crt");
    let (ok, out) = openssl_verify(&[&wrong_ca, &fo.cert], &[]);
    assert!(!ok, "verified under the wrong CA: {out}");
    assert_ne!(other.root_der(), pki.root_der());

    // Expired and not yet valid.
    for (stem, validity) in [
        ("expired", Validity::Expired),
        ("future", Validity::NotYetValid),
    ] {
        let c = pki
            .issue(&LeafSpec::server("t.test").validity(validity))
            .unwrap();
        let f = c.write_to_named(dir.path(), stem).unwrap();
        let (ok, out) = openssl_verify(&[&f.ca, &f.cert], &[]);
        assert!(!ok, "{stem} verified: {out}");
    }
}

#[test]
fn write_to_produces_pem_files_with_private_key_mode() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let pki = TestPki::new("files").unwrap();
    let inter = pki.intermediate("mid").unwrap();
    let leaf = inter.issue(&LeafSpec::middlebox("mb.test")).unwrap();
    let f = leaf.write_to(dir.path()).unwrap();
    let chain = std::fs::read_to_string(&f.chain).unwrap();
    assert_eq!(chain.matches("BEGIN CERTIFICATE").count(), 2);
    assert_eq!(chain, leaf.chain_pem());
    let stack = openssl::x509::X509::stack_from_pem(chain.as_bytes()).unwrap();
    assert_eq!(stack[0].to_der().unwrap(), leaf.cert_der().to_vec());
    assert_eq!(stack[1].to_der().unwrap(), inter.ca_der().to_vec());
    let ca = openssl::x509::X509::from_pem(&std::fs::read(&f.ca).unwrap()).unwrap();
    assert_eq!(ca.to_der().unwrap(), pki.root_der().to_vec());
    let key = std::fs::read(&f.key).unwrap();
    assert!(key.starts_with(b"-----BEGIN PRIVATE KEY-----\n"));
    let pkey = openssl::pkey::PKey::private_key_from_pem(&key).unwrap();
    assert!(stack[0].public_key().unwrap().public_eq(&pkey));
    let mode = std::fs::metadata(&f.key).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    // rustls-facing accessors agree with the DER.
    assert!(matches!(
        leaf.private_key(),
        rustls_pki_types::PrivateKeyDer::Pkcs8(_)
    ));
}
