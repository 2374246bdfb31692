//! Typed errors shared by both engines.

use std::fmt;

/// A TLS alert description (RFC 8446 §6), with names for the common ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AlertDescription(pub u8);

impl AlertDescription {
    pub const CLOSE_NOTIFY: Self = Self(0);
    pub const UNEXPECTED_MESSAGE: Self = Self(10);
    pub const BAD_RECORD_MAC: Self = Self(20);
    pub const HANDSHAKE_FAILURE: Self = Self(40);
    pub const BAD_CERTIFICATE: Self = Self(42);
    pub const CERTIFICATE_UNKNOWN: Self = Self(46);
    pub const ILLEGAL_PARAMETER: Self = Self(47);
    pub const UNKNOWN_CA: Self = Self(48);
    pub const DECODE_ERROR: Self = Self(50);
    pub const DECRYPT_ERROR: Self = Self(51);
    pub const PROTOCOL_VERSION: Self = Self(70);
    pub const INSUFFICIENT_SECURITY: Self = Self(71);
    pub const INTERNAL_ERROR: Self = Self(80);
    pub const UNSUPPORTED_EXTENSION: Self = Self(110);
    pub const UNRECOGNIZED_NAME: Self = Self(112);
    pub const CERTIFICATE_REQUIRED: Self = Self(116);
    pub const NO_APPLICATION_PROTOCOL: Self = Self(120);

    /// The RFC name of this alert, if it is one we know.
    pub fn name(self) -> Option<&'static str> {
        Some(match self.0 {
            0 => "close_notify",
            10 => "unexpected_message",
            20 => "bad_record_mac",
            22 => "record_overflow",
            40 => "handshake_failure",
            42 => "bad_certificate",
            43 => "unsupported_certificate",
            44 => "certificate_revoked",
            45 => "certificate_expired",
            46 => "certificate_unknown",
            47 => "illegal_parameter",
            48 => "unknown_ca",
            49 => "access_denied",
            50 => "decode_error",
            51 => "decrypt_error",
            70 => "protocol_version",
            71 => "insufficient_security",
            80 => "internal_error",
            86 => "inappropriate_fallback",
            90 => "user_canceled",
            109 => "missing_extension",
            110 => "unsupported_extension",
            112 => "unrecognized_name",
            116 => "certificate_required",
            120 => "no_application_protocol",
            _ => return None,
        })
    }
}

impl fmt::Display for AlertDescription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => write!(f, "{n}({})", self.0),
            None => write!(f, "alert({})", self.0),
        }
    }
}

/// Why the TLS library refused a peer's certificate, in the few kinds an operator fixes
/// differently.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CertificateProblem {
    /// The chain reaches none of the trusted CAs (an unknown issuer, a self-signed
    /// certificate).
    UnknownIssuer,
    /// The certificate is not for the name or address the peer was expected under.
    NameMismatch,
    /// Past its notAfter.
    Expired,
    /// Before its notBefore.
    NotYetValid,
    /// Refused for another reason (a bad signature, a wrong key usage, ...).
    Other,
}

/// Everything that can go wrong in an engine.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The configuration cannot be applied (bad PEM, unknown suite, ...).
    #[error("invalid engine configuration: {0}")]
    Config(String),
    /// A certificate or key file that cannot be used, and why; the message names the file
    /// ([`crate::pem_file`], [`crate::Identity::from_pem_files`]).
    #[error("{0}")]
    BadFile(String),
    /// The private key is encrypted: refused rather than decrypted ([`crate::Identity::private_key`]).
    #[error("invalid engine configuration: private key: it is encrypted (a passphrase-protected PEM); give the key unencrypted, readable by the service only (e.g. openssl pkey -in KEY -out PLAIN)")]
    EncryptedPrivateKey,
    /// The peer sent a fatal alert.
    #[error("peer sent fatal alert {alert}")]
    AlertReceived { alert: AlertDescription },
    /// The TLS library failed; `alert` is the alert it sent to the peer, when it sent one we
    /// could read (rustls's are encrypted once the handshake has keys: `detail` then says an
    /// alert went out).
    #[error("TLS failure{}: {detail}", .alert.map(|a| format!(" (sent alert: {a})")).unwrap_or_default())]
    #[non_exhaustive]
    Fatal {
        alert: Option<AlertDescription>,
        /// OpenSSL error stack or rustls error text.
        detail: String,
        /// The peer's certificate failed the library's check, and why: typed, so that callers
        /// (the CLI's hints) need not read `detail`, whose words change between versions.
        certificate: Option<CertificateProblem>,
    },
    /// An OpenSSL call outside the TLS state machine failed (said as [`stack_words`] says it).
    #[error("OpenSSL: {}", stack_words(.0))]
    OpenSsl(#[from] openssl::error::ErrorStack),
    /// The operation exists in the trait but this engine cannot do it (rustls cannot add or read
    /// custom handshake extensions, by design).
    #[error("not supported by this engine: {0}")]
    Unsupported(&'static str),
    /// The operation needs a completed handshake.
    #[error("handshake not complete")]
    HandshakeIncomplete,
    /// The operation is only valid before the handshake starts, or for the other role.
    #[error("invalid state: {0}")]
    State(&'static str),
    /// A secret needed for export never appeared in the key log.
    #[error("key log did not provide {0}")]
    MissingSecret(&'static str),
    /// The negotiated suite is not one our record layer implements (only AEAD suites are).
    #[error("cipher suite {0:#06x} is not supported by the mbx record layer")]
    UnsupportedSuite(u16),
    /// Sequence numbers (or keys) at the export point cannot be determined exactly; refusing to
    /// guess.
    #[error("cannot export session exactly: {0}")]
    InexactExport(&'static str),
    /// Deriving keys in the record layer failed.
    #[error("record layer: {0}")]
    Record(#[from] mbx_record::RecordError),
    /// Bytes from the network that are not TLS records.
    #[error("malformed TLS data: {0}")]
    Malformed(&'static str),
    /// The connection was closed (close_notify received or sent) and cannot carry data.
    #[error("connection closed")]
    Closed,
}

impl EngineError {
    /// A fatal failure that is not about the peer's certificate.
    pub fn fatal(alert: Option<AlertDescription>, detail: String) -> Self {
        EngineError::Fatal {
            alert,
            detail,
            certificate: None,
        }
    }

    /// Why the peer's certificate was refused, when that is what failed.
    pub fn certificate_problem(&self) -> Option<CertificateProblem> {
        match self {
            EngineError::Fatal { certificate, .. } => *certificate,
            _ => None,
        }
    }
}

/// OpenSSL's error stack as its `Display` says it (`error:CODE:library:function:reason`, and
/// any data), without the source file and line of each entry.
pub(crate) fn stack_words(stack: &openssl::error::ErrorStack) -> String {
    let words: Vec<String> = stack
        .errors()
        .iter()
        .map(|e| {
            let mut w = format!(
                "error:{:08X}:{}:{}:{}",
                e.code(),
                e.library().unwrap_or("unknown library"),
                e.function().unwrap_or("unknown function"),
                e.reason().unwrap_or("unknown reason")
            );
            if let Some(data) = e.data() {
                w.push(':');
                w.push_str(data);
            }
            w
        })
        .collect();
    if words.is_empty() {
        "OpenSSL error".to_string()
    } else {
        words.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An OpenSSL failure outside a handshake is said without OpenSSL's source files and
    /// lines too, as a handshake's is.
    #[test]
    fn an_openssl_error_names_its_reason_without_source_lines() {
        let stack = openssl::pkey::PKey::private_key_from_pem(b"not a key").unwrap_err();
        let said = EngineError::from(stack).to_string();
        assert!(said.starts_with("OpenSSL: error:"), "{said}");
        assert!(!said.contains(".c:"), "{said}");
    }
}
