//! Remembers server certificate chains a rustls client has verified, so that the same chain
//! from the same peer is not verified again (see [`crate::TlsConfig::verified_chain_cache`]).
//!
//! Why: an mbTLS endpoint opens a secondary session to each of its middleboxes on every
//! connection, and the same few middleboxes present the same chains every time. Verifying the
//! chain is one signature check per certificate (≈ 55 µs for ECDSA P-256 here) on every
//! connection for an answer that cannot change while the chain is inside its validity window.
//!
//! What is remembered: a SHA-256 digest of the name checked and the exact bytes of every
//! certificate presented (end entity and intermediates, in order), with the window in which
//! all of them are valid. Only chains that verified are remembered; a chain that failed is
//! checked in full every time. A remembered chain outside its window is verified in full
//! again. The handshake signature (CertificateVerify), which proves the peer holds the key
//! of this session, is never skipped: rustls asks for it separately and it goes to the inner
//! verifier every time. The cache belongs to one client context, whose roots do not change.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use sha2::{Digest, Sha256};

/// Seconds since the Unix epoch, both ends included (as webpki checks validity).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Window {
    not_before: i64,
    not_after: i64,
}

impl Window {
    fn contains(&self, now: UnixTime) -> bool {
        let now = i64::try_from(now.as_secs()).unwrap_or(i64::MAX);
        self.not_before <= now && now <= self.not_after
    }

    /// The window in which every certificate of the chain is valid; `None` if one of them
    /// does not parse (then nothing is remembered).
    fn of_chain(
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
    ) -> Option<Self> {
        let mut window = Window {
            not_before: i64::MIN,
            not_after: i64::MAX,
        };
        for der in std::iter::once(end_entity).chain(intermediates) {
            let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
            let validity = cert.validity();
            window.not_before = window.not_before.max(validity.not_before.timestamp());
            window.not_after = window.not_after.min(validity.not_after.timestamp());
        }
        Some(window)
    }
}

type Key = [u8; 32];

fn key(
    end_entity: &CertificateDer<'_>,
    intermediates: &[CertificateDer<'_>],
    name: &ServerName<'_>,
) -> Key {
    let mut h = Sha256::new();
    // Length-prefixed parts, so that no two different inputs hash the same bytes.
    let mut part = |bytes: &[u8]| {
        h.update((bytes.len() as u64).to_be_bytes());
        h.update(bytes);
    };
    part(name.to_str().as_bytes());
    part(end_entity);
    for c in intermediates {
        part(c);
    }
    h.finalize().into()
}

/// Verified chains, oldest first out when full.
#[derive(Debug, Default)]
struct Entries {
    windows: HashMap<Key, Window>,
    order: VecDeque<Key>,
}

/// A [`ServerCertVerifier`] that remembers up to `capacity` chains `inner` accepted.
#[derive(Debug)]
pub(crate) struct CachingVerifier {
    inner: Arc<dyn ServerCertVerifier>,
    capacity: usize,
    entries: Mutex<Entries>,
}

impl CachingVerifier {
    pub(crate) fn new(inner: Arc<dyn ServerCertVerifier>, capacity: usize) -> Self {
        CachingVerifier {
            inner,
            capacity: capacity.max(1),
            entries: Mutex::new(Entries::default()),
        }
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, Entries> {
        // A panic elsewhere while holding the lock leaves a consistent map (every update is
        // one insert or remove), so the poison flag can be ignored.
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn remembers(&self, key: &Key, now: UnixTime) -> bool {
        self.entries()
            .windows
            .get(key)
            .is_some_and(|w| w.contains(now))
    }

    fn remember(&self, key: Key, window: Window) {
        let mut e = self.entries();
        if e.windows.insert(key, window).is_none() {
            e.order.push_back(key);
        }
        while e.order.len() > self.capacity {
            if let Some(old) = e.order.pop_front() {
                e.windows.remove(&old);
            }
        }
    }
}

impl ServerCertVerifier for CachingVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let key = key(end_entity, intermediates, server_name);
        if self.remembers(&key, now) {
            return Ok(ServerCertVerified::assertion());
        }
        let verified = self.inner.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        )?;
        if let Some(window) = Window::of_chain(end_entity, intermediates) {
            self.remember(key, window);
        }
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }

    fn requires_raw_public_keys(&self) -> bool {
        self.inner.requires_raw_public_keys()
    }

    fn root_hint_subjects(&self) -> Option<&[rustls::DistinguishedName]> {
        self.inner.root_hint_subjects()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mbx_testbed::pki::{LeafSpec, TestPki};
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Accepts or refuses every chain and counts the calls of each kind.
    #[derive(Debug, Default)]
    struct Counting {
        refuse: std::sync::atomic::AtomicBool,
        chains: AtomicUsize,
    }

    impl ServerCertVerifier for Counting {
        fn verify_server_cert(
            &self,
            _: &CertificateDer<'_>,
            _: &[CertificateDer<'_>],
            _: &ServerName<'_>,
            _: &[u8],
            _: UnixTime,
        ) -> Result<ServerCertVerified, rustls::Error> {
            self.chains.fetch_add(1, Ordering::SeqCst);
            if self.refuse.load(Ordering::SeqCst) {
                return Err(rustls::Error::InvalidCertificate(
                    rustls::CertificateError::UnknownIssuer,
                ));
            }
            Ok(ServerCertVerified::assertion())
        }
        fn verify_tls12_signature(
            &self,
            _: &[u8],
            _: &CertificateDer<'_>,
            _: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            Err(rustls::Error::General("bad signature".into()))
        }
        fn verify_tls13_signature(
            &self,
            m: &[u8],
            c: &CertificateDer<'_>,
            d: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            self.verify_tls12_signature(m, c, d)
        }
        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            vec![SignatureScheme::ECDSA_NISTP256_SHA256]
        }
    }

    fn setup(capacity: usize) -> (Arc<Counting>, CachingVerifier) {
        let inner = Arc::new(Counting::default());
        let v = CachingVerifier::new(inner.clone(), capacity);
        (inner, v)
    }

    fn name(n: &str) -> ServerName<'static> {
        ServerName::try_from(n.to_owned()).unwrap()
    }

    fn verify(v: &CachingVerifier, ee: &CertificateDer<'_>, n: &str, now: UnixTime) -> bool {
        v.verify_server_cert(ee, &[], &name(n), &[], now).is_ok()
    }

    #[test]
    fn a_chain_that_verified_is_not_verified_again() {
        let pki = TestPki::new("cache CA").unwrap();
        let mb = pki.issue(&LeafSpec::middlebox("mb.test")).unwrap();
        let (inner, v) = setup(8);
        let now = UnixTime::now();
        assert!(verify(&v, mb.cert_der(), "mb.test", now));
        assert!(verify(&v, mb.cert_der(), "mb.test", now));
        assert_eq!(inner.chains.load(Ordering::SeqCst), 1);
        // The handshake signature is checked every time: tests/chain_cache.rs.
    }

    #[test]
    fn another_chain_another_name_or_a_time_outside_the_window_is_verified_in_full() {
        let pki = TestPki::new("cache CA").unwrap();
        let a = pki.issue(&LeafSpec::middlebox("mb.test")).unwrap();
        let b = pki.issue(&LeafSpec::middlebox("mb.test")).unwrap();
        let (inner, v) = setup(8);
        let now = UnixTime::now();
        assert!(verify(&v, a.cert_der(), "mb.test", now));
        assert!(verify(&v, b.cert_der(), "mb.test", now));
        assert_eq!(inner.chains.load(Ordering::SeqCst), 2);
        assert!(verify(&v, a.cert_der(), "other.test", now));
        assert_eq!(inner.chains.load(Ordering::SeqCst), 3);
        // The same chain with intermediates that differ is another chain.
        assert!(v
            .verify_server_cert(
                a.cert_der(),
                &[b.cert_der().clone()],
                &name("mb.test"),
                &[],
                now
            )
            .is_ok());
        assert_eq!(inner.chains.load(Ordering::SeqCst), 4);
        // Two years on, the leaf (valid for a year) has expired: the cached verdict does not
        // cover that time, and the inner verifier's refusal stands.
        let later = UnixTime::since_unix_epoch(std::time::Duration::from_secs(
            now.as_secs() + 2 * 365 * 86_400,
        ));
        inner.refuse.store(true, Ordering::SeqCst);
        assert!(!verify(&v, a.cert_der(), "mb.test", later));
        assert_eq!(inner.chains.load(Ordering::SeqCst), 5);
        // Still remembered for times inside the window.
        assert!(verify(&v, a.cert_der(), "mb.test", now));
        assert_eq!(inner.chains.load(Ordering::SeqCst), 5);
    }

    #[test]
    fn a_refused_chain_is_not_remembered() {
        let pki = TestPki::new("cache CA").unwrap();
        let mb = pki.issue(&LeafSpec::middlebox("mb.test")).unwrap();
        let (inner, v) = setup(8);
        let now = UnixTime::now();
        inner.refuse.store(true, Ordering::SeqCst);
        assert!(!verify(&v, mb.cert_der(), "mb.test", now));
        assert!(!verify(&v, mb.cert_der(), "mb.test", now));
        assert_eq!(inner.chains.load(Ordering::SeqCst), 2);
        inner.refuse.store(false, Ordering::SeqCst);
        assert!(verify(&v, mb.cert_der(), "mb.test", now));
        assert_eq!(inner.chains.load(Ordering::SeqCst), 3);
    }

    #[test]
    fn the_oldest_chain_leaves_when_the_cache_is_full() {
        let pki = TestPki::new("cache CA").unwrap();
        let certs: Vec<_> = (0..3)
            .map(|_| pki.issue(&LeafSpec::middlebox("mb.test")).unwrap())
            .collect();
        let (inner, v) = setup(2);
        let now = UnixTime::now();
        for c in &certs {
            assert!(verify(&v, c.cert_der(), "mb.test", now));
        }
        assert_eq!(inner.chains.load(Ordering::SeqCst), 3);
        // The two newest are remembered, the first was pushed out.
        assert!(verify(&v, certs[2].cert_der(), "mb.test", now));
        assert!(verify(&v, certs[1].cert_der(), "mb.test", now));
        assert_eq!(inner.chains.load(Ordering::SeqCst), 3);
        assert!(verify(&v, certs[0].cert_der(), "mb.test", now));
        assert_eq!(inner.chains.load(Ordering::SeqCst), 4);
        assert_eq!(v.entries().windows.len(), 2);
        assert_eq!(v.entries().order.len(), 2);
    }

    #[test]
    fn the_window_is_where_every_certificate_of_the_chain_is_valid() {
        let pki = TestPki::new("cache CA").unwrap();
        let mb = pki.issue(&LeafSpec::middlebox("mb.test")).unwrap();
        let leaf = Window::of_chain(mb.cert_der(), &[]).unwrap();
        let with_ca = Window::of_chain(mb.cert_der(), &[pki.ca_der().clone()]).unwrap();
        assert!(leaf.not_before < leaf.not_after);
        assert!(with_ca.not_before >= leaf.not_before && with_ca.not_after <= leaf.not_after);
        assert!(Window::of_chain(&CertificateDer::from(vec![0x30, 0x00]), &[]).is_none());
    }

    mod model {
        //! The cache against a model of what it may answer: a chain is accepted if the inner
        //! verifier accepts it now, or if the inner verifier accepted the same chain under the
        //! same name earlier, the time is inside that chain's window, and fewer than
        //! `capacity` other chains were remembered since.
        use super::*;
        use mbx_testbed::pki::Validity;
        use proptest::prelude::*;
        use std::sync::OnceLock;

        const NAMES: [&str; 2] = ["mb.test", "other.test"];

        /// Three chains: valid now, expired, not yet valid.
        fn chains() -> &'static [CertificateDer<'static>] {
            static CHAINS: OnceLock<Vec<CertificateDer<'static>>> = OnceLock::new();
            CHAINS.get_or_init(|| {
                let pki = TestPki::new("model CA").unwrap();
                [Validity::Current, Validity::Expired, Validity::NotYetValid]
                    .into_iter()
                    .map(|v| {
                        let spec = LeafSpec::middlebox("mb.test").validity(v);
                        pki.issue(&spec).unwrap().cert_der().clone()
                    })
                    .collect()
            })
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(64))]
            #[test]
            fn answers_only_what_the_inner_verifier_said_of_that_chain_in_its_window(
                ops in proptest::collection::vec((0..3usize, 0..2usize, 0..3usize, any::<bool>()), 1..40)
            ) {
                let (inner, v) = setup(2);
                let day = 86_400u64;
                let now = UnixTime::now().as_secs();
                let times = [now, now - 10 * day, now + 10 * day];
                let mut remembered: Vec<((usize, usize), Window)> = Vec::new();
                for (chain, name_i, t, accepts) in ops {
                    let der = &chains()[chain];
                    let at = UnixTime::since_unix_epoch(std::time::Duration::from_secs(times[t]));
                    inner.refuse.store(!accepts, Ordering::SeqCst);
                    let got = v.verify_server_cert(der, &[], &name(NAMES[name_i]), &[], at).is_ok();
                    let hit = remembered
                        .iter()
                        .any(|(k, w)| *k == (chain, name_i) && w.contains(at));
                    prop_assert_eq!(got, accepts || hit);
                    if accepts && !hit {
                        let w = Window::of_chain(der, &[]).unwrap();
                        match remembered.iter_mut().find(|(k, _)| *k == (chain, name_i)) {
                            Some(entry) => entry.1 = w,
                            None => remembered.push(((chain, name_i), w)),
                        }
                        if remembered.len() > 2 {
                            remembered.remove(0);
                        }
                    }
                }
            }
        }
    }
}
