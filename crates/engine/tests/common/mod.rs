//! Shared test helpers: PKI from mbx-testbed, in-memory pumping, record splitting.
#![allow(dead_code)]

use mbx_engine::{EngineError, Handoff, Identity, TlsConfig, TlsEngine};
use mbx_record::{Aead, ContentType, RecordOpener, RecordSealer, TlsVersion};
use mbx_testbed::pki::{IssuedCert, KeyType, LeafSpec, TestPki};

pub const HOST: &str = "server.mbx.test";

pub struct Pki {
    pub ca: TestPki,
    pub server: IssuedCert,
    pub client: IssuedCert,
}

impl Pki {
    pub fn new() -> Self {
        Self::with_key(KeyType::EcdsaP256)
    }

    pub fn with_key(key: KeyType) -> Self {
        let ca = TestPki::new("mbx-engine test CA").expect("CA");
        let server = ca
            .issue(&LeafSpec::server(HOST).key_type(key))
            .expect("server cert");
        let client = ca
            .issue(&LeafSpec::client("client.mbx.test"))
            .expect("client cert");
        Pki { ca, server, client }
    }

    pub fn roots(&self) -> Vec<u8> {
        self.ca.root_pem().into_bytes()
    }

    pub fn server_identity(&self) -> Identity {
        identity(&self.server)
    }

    pub fn client_identity(&self) -> Identity {
        identity(&self.client)
    }

    pub fn client_config(&self) -> TlsConfig {
        TlsConfig::client(HOST, self.roots())
    }

    pub fn server_config(&self) -> TlsConfig {
        TlsConfig::server(self.server_identity())
    }
}

pub fn identity(c: &IssuedCert) -> Identity {
    Identity::from_pem(c.chain_pem(), c.key_pem().as_bytes())
}

/// Moves bytes between two engines until neither has anything to say and both finished the
/// handshake (or one fails).
pub fn pump(a: &mut dyn TlsEngine, b: &mut dyn TlsEngine) -> Result<(), EngineError> {
    for _ in 0..32 {
        a.process()?;
        let ab = a.take_outgoing();
        b.feed(&ab);
        b.process()?;
        let ba = b.take_outgoing();
        a.feed(&ba);
        if ab.is_empty() && ba.is_empty() && !a.is_handshaking() && !b.is_handshaking() {
            a.process()?;
            return Ok(());
        }
    }
    panic!("handshake did not converge");
}

/// Like [`pump`] but returns the first error from either side together with which side.
pub fn pump_err(
    a: &mut dyn TlsEngine,
    b: &mut dyn TlsEngine,
) -> (Option<EngineError>, Option<EngineError>) {
    let mut ea = None;
    let mut eb = None;
    for _ in 0..32 {
        if let Err(e) = a.process() {
            ea.get_or_insert(e);
        }
        let ab = a.take_outgoing();
        b.feed(&ab);
        if let Err(e) = b.process() {
            eb.get_or_insert(e);
        }
        let ba = b.take_outgoing();
        a.feed(&ba);
        if ab.is_empty() && ba.is_empty() {
            break;
        }
    }
    (ea, eb)
}

/// Splits a byte stream into whole records (panics on a partial tail: test data is whole).
pub fn split_records(mut s: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    while !s.is_empty() {
        let len = 5 + usize::from(u16::from_be_bytes([s[3], s[4]]));
        out.push(s[..len].to_vec());
        s = &s[len..];
    }
    out
}

/// Opens every record with `opener`; checks that re-sealing each with a sealer at the same
/// sequence number reproduces the peer's bytes exactly; returns (content type, plaintext) pairs.
///
/// TLS 1.2 AES-GCM records carry an explicit nonce the sender chooses (OpenSSL counts up from a
/// random start, rustls and mbx-record use the sequence number, and a stream may mix both after
/// a handoff), so each re-seal continues from that record's own explicit nonce.
pub fn open_and_reseal(
    version: TlsVersion,
    keys: &mbx_record::TrafficKeys,
    opener: &mut RecordOpener,
    records: &[Vec<u8>],
) -> Vec<(ContentType, Vec<u8>)> {
    let gcm12 = version == TlsVersion::Tls12 && keys.aead() != Aead::ChaCha20Poly1305;
    let mut out = Vec::new();
    for rec in records {
        let seq = opener.next_seq();
        let opened = opener
            .open(rec)
            .unwrap_or_else(|e| panic!("record at seq {seq} did not open: {e}"));
        let mut sealer = RecordSealer::new(version, keys.clone(), seq);
        if gcm12 {
            let explicit: [u8; 8] = rec[5..13].try_into().unwrap();
            sealer.continue_explicit_nonces(explicit).unwrap();
        }
        let mut again = Vec::new();
        sealer
            .seal(opened.content_type, &opened.plaintext, &mut again)
            .expect("reseal");
        assert_eq!(
            &again, rec,
            "re-encrypted record at seq {seq} differs from the peer's"
        );
        out.push((opened.content_type, opened.plaintext.to_vec()));
    }
    out
}

/// Application data in opened records, concatenated.
pub fn app_data(opened: &[(ContentType, Vec<u8>)]) -> Vec<u8> {
    opened
        .iter()
        .filter(|(ct, _)| *ct == ContentType::APPLICATION_DATA)
        .flat_map(|(_, p)| p.clone())
        .collect()
}

pub const V12: TlsVersion = TlsVersion::Tls12;
pub const V13: TlsVersion = TlsVersion::Tls13;

/// (version, suite id) pairs covering every AEAD suite with an ECDSA certificate: TLS 1.2
/// AES-128/256-GCM and ChaCha20, TLS 1.3 AES-128/256-GCM and ChaCha20.
pub const SUITES: [(TlsVersion, u16); 6] = [
    (V12, 0xC02B),
    (V12, 0xC02C),
    (V12, 0xCCA9),
    (V13, 0x1301),
    (V13, 0x1302),
    (V13, 0x1303),
];

/// `from` sends `msg` and `to` reads exactly it.
pub fn transfer(from: &mut dyn TlsEngine, to: &mut dyn TlsEngine, msg: &[u8]) {
    from.write_plaintext(msg).unwrap();
    to.feed(&from.take_outgoing());
    to.process().unwrap();
    assert_eq!(to.take_plaintext(), msg);
}

/// Seals one record with each side's exported `tx` and opens it with the other's `rx` (and
/// checks one sequence number later would not open): the numbers are exact.
pub fn check_exact(c: &Handoff, s: &Handoff) {
    let v = c.session.version;
    for (tx, rx) in [
        (&c.session.tx, &s.session.rx),
        (&s.session.tx, &c.session.rx),
    ] {
        assert_eq!(tx.next_seq, rx.next_seq);
        let mut rec = Vec::new();
        RecordSealer::new(v, tx.keys.clone(), tx.next_seq)
            .seal(ContentType::APPLICATION_DATA, b"after export", &mut rec)
            .unwrap();
        let mut opener = RecordOpener::new(v, rx.keys.clone(), rx.next_seq);
        let opened = open_and_reseal(v, &rx.keys, &mut opener, &split_records(&rec));
        assert_eq!(app_data(&opened), b"after export");
        let mut late = RecordOpener::new(v, rx.keys.clone(), rx.next_seq + 1);
        assert!(late.open(&rec).is_err());
    }
}

/// An OpenSSL engine of a context made from `cfg`.
pub fn ossl(cfg: &TlsConfig) -> mbx_engine::OpenSslEngine {
    mbx_engine::OpenSslContext::new(cfg)
        .expect("context")
        .engine()
        .expect("engine")
}

/// The scan finds no copy of `marker` anywhere in the process (`what` names the moment).
pub fn no_copy(
    scan: &mut mbx_testbed::residue::Scanner,
    marker: &mbx_testbed::residue::Masked,
    what: &str,
) {
    let found = scan.find(marker).unwrap();
    assert_eq!(found, Vec::<usize>::new(), "{what}");
}
