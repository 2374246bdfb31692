//! Protocol versions, AEADs, hashes and the cipher suites built from them.

/// The two record-protection formats we implement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TlsVersion {
    Tls12,
    Tls13,
}

impl TlsVersion {
    /// The version number the version negotiates on the wire.
    pub const fn wire(self) -> u16 {
        match self {
            TlsVersion::Tls12 => mbx_wire::version::TLS1_2,
            TlsVersion::Tls13 => mbx_wire::version::TLS1_3,
        }
    }
}

/// Record AEADs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Aead {
    Aes128Gcm,
    Aes256Gcm,
    ChaCha20Poly1305,
}

impl Aead {
    pub const fn key_len(self) -> usize {
        match self {
            Aead::Aes128Gcm => 16,
            Aead::Aes256Gcm | Aead::ChaCha20Poly1305 => 32,
        }
    }

    pub const fn tag_len(self) -> usize {
        16
    }

    /// Length of the full AEAD nonce.
    pub const fn nonce_len(self) -> usize {
        12
    }

    /// Length of the TLS 1.2 "fixed IV" from the key block: the 4-byte implicit salt for GCM
    /// (RFC 5288 §3), the full 12-byte IV for ChaCha20-Poly1305 (RFC 7905 §2).
    pub const fn tls12_fixed_iv_len(self) -> usize {
        match self {
            Aead::Aes128Gcm | Aead::Aes256Gcm => 4,
            Aead::ChaCha20Poly1305 => 12,
        }
    }

    /// Bytes of explicit nonce a TLS 1.2 record carries (GCM: 8, ChaCha20: 0).
    pub const fn tls12_explicit_nonce_len(self) -> usize {
        match self {
            Aead::Aes128Gcm | Aead::Aes256Gcm => 8,
            Aead::ChaCha20Poly1305 => 0,
        }
    }

    /// Records one key may protect (RFC 8446 §5.5): AES-GCM up to 2^24.5 full-size records,
    /// for a 2^-57 margin on confidentiality; ChaCha20-Poly1305 more than the 64-bit sequence
    /// number allows. TLS would update its keys before the limit; an mbTLS hop cannot (no
    /// traffic secret is distributed), so its sealer stops there (alerts excepted: they end
    /// the session) and the session ends.
    pub const fn confidentiality_limit(self) -> u64 {
        match self {
            // floor(2^24.5)
            Aead::Aes128Gcm | Aead::Aes256Gcm => 23_726_566,
            Aead::ChaCha20Poly1305 => u64::MAX,
        }
    }

    pub(crate) fn algorithm(self) -> &'static aws_lc_rs::aead::Algorithm {
        match self {
            Aead::Aes128Gcm => &aws_lc_rs::aead::AES_128_GCM,
            Aead::Aes256Gcm => &aws_lc_rs::aead::AES_256_GCM,
            Aead::ChaCha20Poly1305 => &aws_lc_rs::aead::CHACHA20_POLY1305,
        }
    }
}

/// Hashes used by the key schedules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HashAlg {
    Sha256,
    Sha384,
}

impl HashAlg {
    pub const fn output_len(self) -> usize {
        match self {
            HashAlg::Sha256 => 32,
            HashAlg::Sha384 => 48,
        }
    }

    pub(crate) fn hkdf(self) -> aws_lc_rs::hkdf::Algorithm {
        match self {
            HashAlg::Sha256 => aws_lc_rs::hkdf::HKDF_SHA256,
            HashAlg::Sha384 => aws_lc_rs::hkdf::HKDF_SHA384,
        }
    }

    pub(crate) fn hmac(self) -> aws_lc_rs::hmac::Algorithm {
        match self {
            HashAlg::Sha256 => aws_lc_rs::hmac::HMAC_SHA256,
            HashAlg::Sha384 => aws_lc_rs::hmac::HMAC_SHA384,
        }
    }

    /// Hash `data` (e.g. a transcript).
    pub fn digest(self, data: &[u8]) -> Vec<u8> {
        let alg = match self {
            HashAlg::Sha256 => &aws_lc_rs::digest::SHA256,
            HashAlg::Sha384 => &aws_lc_rs::digest::SHA384,
        };
        aws_lc_rs::digest::digest(alg, data).as_ref().to_vec()
    }
}

/// A cipher suite: what a record layer needs to know about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CipherSuite {
    pub id: u16,
    pub version: TlsVersion,
    pub aead: Aead,
    pub hash: HashAlg,
}

const fn suite(id: u16, version: TlsVersion, aead: Aead, hash: HashAlg) -> CipherSuite {
    CipherSuite {
        id,
        version,
        aead,
        hash,
    }
}

use Aead::*;
use HashAlg::*;
use TlsVersion::*;

impl CipherSuite {
    // TLS 1.3 (RFC 8446 §B.4)
    pub const TLS13_AES_128_GCM_SHA256: CipherSuite = suite(0x1301, Tls13, Aes128Gcm, Sha256);
    pub const TLS13_AES_256_GCM_SHA384: CipherSuite = suite(0x1302, Tls13, Aes256Gcm, Sha384);
    pub const TLS13_CHACHA20_POLY1305_SHA256: CipherSuite =
        suite(0x1303, Tls13, ChaCha20Poly1305, Sha256);

    // TLS 1.2 AEAD suites (RFC 5288, RFC 5289, RFC 7905)
    pub const TLS_RSA_WITH_AES_128_GCM_SHA256: CipherSuite =
        suite(0x009c, Tls12, Aes128Gcm, Sha256);
    pub const TLS_RSA_WITH_AES_256_GCM_SHA384: CipherSuite =
        suite(0x009d, Tls12, Aes256Gcm, Sha384);
    pub const TLS_DHE_RSA_WITH_AES_128_GCM_SHA256: CipherSuite =
        suite(0x009e, Tls12, Aes128Gcm, Sha256);
    pub const TLS_DHE_RSA_WITH_AES_256_GCM_SHA384: CipherSuite =
        suite(0x009f, Tls12, Aes256Gcm, Sha384);
    pub const TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256: CipherSuite =
        suite(0xc02b, Tls12, Aes128Gcm, Sha256);
    pub const TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384: CipherSuite =
        suite(0xc02c, Tls12, Aes256Gcm, Sha384);
    pub const TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256: CipherSuite =
        suite(0xc02f, Tls12, Aes128Gcm, Sha256);
    pub const TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384: CipherSuite =
        suite(0xc030, Tls12, Aes256Gcm, Sha384);
    pub const TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256: CipherSuite =
        suite(0xcca8, Tls12, ChaCha20Poly1305, Sha256);
    pub const TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256: CipherSuite =
        suite(0xcca9, Tls12, ChaCha20Poly1305, Sha256);
    pub const TLS_DHE_RSA_WITH_CHACHA20_POLY1305_SHA256: CipherSuite =
        suite(0xccaa, Tls12, ChaCha20Poly1305, Sha256);

    /// Every suite this crate supports.
    pub const ALL: &'static [CipherSuite] = &[
        Self::TLS13_AES_128_GCM_SHA256,
        Self::TLS13_AES_256_GCM_SHA384,
        Self::TLS13_CHACHA20_POLY1305_SHA256,
        Self::TLS_RSA_WITH_AES_128_GCM_SHA256,
        Self::TLS_RSA_WITH_AES_256_GCM_SHA384,
        Self::TLS_DHE_RSA_WITH_AES_128_GCM_SHA256,
        Self::TLS_DHE_RSA_WITH_AES_256_GCM_SHA384,
        Self::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
        Self::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
        Self::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
        Self::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
        Self::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
        Self::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
        Self::TLS_DHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
    ];

    pub fn from_id(id: u16) -> Option<CipherSuite> {
        Self::ALL.iter().copied().find(|s| s.id == id)
    }

    /// The IANA name (TLS 1.3 suites without the `13`).
    pub fn name(&self) -> &'static str {
        match self.id {
            0x1301 => "TLS_AES_128_GCM_SHA256",
            0x1302 => "TLS_AES_256_GCM_SHA384",
            0x1303 => "TLS_CHACHA20_POLY1305_SHA256",
            0x009c => "TLS_RSA_WITH_AES_128_GCM_SHA256",
            0x009d => "TLS_RSA_WITH_AES_256_GCM_SHA384",
            0x009e => "TLS_DHE_RSA_WITH_AES_128_GCM_SHA256",
            0x009f => "TLS_DHE_RSA_WITH_AES_256_GCM_SHA384",
            0xc02b => "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
            0xc02c => "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
            0xc02f => "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
            0xc030 => "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
            0xcca8 => "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
            0xcca9 => "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
            0xccaa => "TLS_DHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
            _ => "UNKNOWN",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_and_names() {
        for s in CipherSuite::ALL {
            assert_eq!(CipherSuite::from_id(s.id), Some(*s));
            assert_ne!(s.name(), "UNKNOWN");
        }
        assert_eq!(CipherSuite::from_id(0x1304), None);
        assert_eq!(CipherSuite::from_id(0xc027), None); // CBC suite: not supported
        assert_eq!(
            CipherSuite::from_id(0x1302).unwrap().name(),
            "TLS_AES_256_GCM_SHA384"
        );
    }
}
