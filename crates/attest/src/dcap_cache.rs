//! Quotes of a platform already verified in full: only the new quote's own signature is checked.
//!
//! A DCAP quote check with `dcap-qvl` costs ≈ 420 µs (docs/foundation.md, "DCAP quote checks"),
//! nearly all of it on what every quote of one platform shares: the collateral (TCB info, QE
//! identity, CRLs and their chains), the PCK chain in the quote's certification data, the quoting
//! enclave's report and its signature, the TCB matching. Per session only two things change: the
//! report body's `report_data` (the binding, fresh per handshake) and the attestation key's
//! signature over header and body.
//!
//! So a quote whose bytes, with `report_data` and that signature set to zero (its *template*), and
//! whose collateral bytes are exactly those of a quote that passed the full check is checked by
//! that signature alone, with the attestation key of the template, which the full check tied to
//! the PCK chain. Everything else `dcap-qvl` looked at is the same bytes; its only other input is
//! the time, and every time check is a window (certificates, CRLs, TCB info, QE identity): a
//! template that passed at `now` is used from `now` until the window ends or the earliest
//! expiry of its collateral (which `dcap-qvl` reports), whichever comes first. New collateral (a
//! fresher CRL) is a new template. Quotes whose encoding is not the canonical one are always checked in full.

use std::collections::VecDeque;
use std::sync::{Mutex, OnceLock, PoisonError};

use aws_lc_rs::signature::{UnparsedPublicKey, ECDSA_P256_SHA256_FIXED};
use dcap_qvl::quote::{AuthData, Quote, Report};
use parity_scale_codec::Encode;
use sha2::{Digest, Sha256};

use crate::claims::Claims;
use crate::error::AttestError;
use crate::evidence::Collateral;

/// Domain separation of the template hash.
const TEMPLATE_CONTEXT: &[u8] = b"mbx dcap platform template v1";

/// Platforms remembered by the process-wide verifier ([`DcapVerifier::shared`]).
pub const SHARED_PLATFORMS: usize = 64;

/// How long (seconds) a verified template is used by the process-wide verifier.
pub const SHARED_WINDOW_SECS: u64 = 3600;

/// How many quotes a [`DcapVerifier`] checked each way.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DcapCounts {
    /// Checked in full by `dcap-qvl`.
    pub full: u64,
    /// Checked by their signature alone, on a remembered template.
    pub signature_only: u64,
}

/// A DCAP quote verifier that remembers the platforms it verified in full (module docs).
pub struct DcapVerifier {
    capacity: usize,
    window_secs: u64,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Most recently used last.
    platforms: VecDeque<Platform>,
    counts: DcapCounts,
}

struct Platform {
    template: [u8; 32],
    /// Used from `from` (its full check) to `until` (window or collateral expiry), inclusive.
    from: u64,
    until: u64,
    /// What the full check found, before any policy.
    claims: Claims,
}

/// A quote, parsed, with what the check needs of it.
pub(crate) struct ParsedQuote<'a> {
    raw: &'a [u8],
    quote: Quote,
}

impl<'a> ParsedQuote<'a> {
    pub(crate) fn parse(raw: &'a [u8]) -> Result<Self, AttestError> {
        let quote = Quote::parse(raw).map_err(|e| AttestError::Dcap(format!("{e:#}")))?;
        Ok(ParsedQuote { raw, quote })
    }

    pub(crate) fn report_data(&self) -> [u8; 64] {
        match &self.quote.report {
            Report::SgxEnclave(r) => r.report_data,
            Report::TD10(r) => r.report_data,
            Report::TD15(r) => r.base.report_data,
            Report::TD15Ex(r) => r.base.base.report_data,
        }
    }

    /// The hash of the template and the collateral; `None` if the quote is not in its canonical
    /// encoding (then the template would not describe its bytes). Bytes after the quote (TDX
    /// quotes often come padded with zeros; `dcap-qvl` ignores them) are part of the template.
    fn template(&self, collateral: &Collateral) -> Option<[u8; 32]> {
        let encoded = self.quote.encode();
        let trailing = self.raw.strip_prefix(encoded.as_slice())?;
        let mut t = self.quote.clone();
        *report_data_mut(&mut t.report) = [0; 64];
        match &mut t.auth_data {
            AuthData::V3(a) => a.ecdsa_signature = [0; 64],
            AuthData::V4(a) => a.ecdsa_signature = [0; 64],
        }
        let template = t.encode();
        let mut h = Sha256::new();
        h.update(TEMPLATE_CONTEXT);
        h.update((template.len() as u64).to_be_bytes());
        h.update(&template);
        h.update((trailing.len() as u64).to_be_bytes());
        h.update(trailing);
        // The collateral as it travelled: JSON, or its DEFLATE stream (told apart by the
        // evidence kind).
        h.update([collateral.kind() as u8]);
        h.update(collateral.wire_bytes());
        Some(h.finalize().into())
    }

    /// The attestation key's ECDSA P-256 signature over header and body (what `dcap-qvl` checks
    /// as the ISV report signature).
    fn check_signature(&self) -> Result<(), AttestError> {
        let (signature, key) = match &self.quote.auth_data {
            AuthData::V3(a) => (&a.ecdsa_signature, &a.ecdsa_attestation_key),
            AuthData::V4(a) => (&a.ecdsa_signature, &a.ecdsa_attestation_key),
        };
        let mut public = [0x04u8; 65];
        public[1..].copy_from_slice(key);
        let signed = self
            .raw
            .get(..self.quote.signed_length())
            .ok_or_else(|| AttestError::Dcap("quote shorter than its signed part".into()))?;
        UnparsedPublicKey::new(&ECDSA_P256_SHA256_FIXED, &public)
            .verify(signed, signature)
            .map_err(|_| AttestError::Dcap("ISV enclave report signature is invalid".into()))
    }
}

fn report_data_mut(report: &mut Report) -> &mut [u8; 64] {
    match report {
        Report::SgxEnclave(r) => &mut r.report_data,
        Report::TD10(r) => &mut r.report_data,
        Report::TD15(r) => &mut r.base.report_data,
        Report::TD15Ex(r) => &mut r.base.base.report_data,
    }
}

impl DcapVerifier {
    /// Remembers up to `capacity` platforms (the least recently used goes first), each for
    /// `window_secs` after its full check at most. With `capacity` 0 every quote is checked in
    /// full.
    pub fn new(capacity: usize, window_secs: u64) -> Self {
        DcapVerifier {
            capacity,
            window_secs,
            state: Mutex::new(State::default()),
        }
    }

    /// The process-wide verifier behind [`crate::verify_dcap_quote`] (and so behind
    /// [`crate::verify_bytes`]): [`SHARED_PLATFORMS`] platforms, [`SHARED_WINDOW_SECS`].
    pub fn shared() -> &'static DcapVerifier {
        static SHARED: OnceLock<DcapVerifier> = OnceLock::new();
        SHARED.get_or_init(|| DcapVerifier::new(SHARED_PLATFORMS, SHARED_WINDOW_SECS))
    }

    /// How many quotes were checked each way so far.
    pub fn counts(&self) -> DcapCounts {
        self.lock().counts
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // The state is consistent after every statement; a panic elsewhere leaves it usable.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The claims of `quote` before any policy, by whichever check applies; `full_check` is
    /// `dcap-qvl`'s, at a given time.
    pub(crate) fn claims(
        &self,
        quote: &ParsedQuote<'_>,
        collateral: &Collateral,
        now: u64,
        full_check: impl FnOnce(u64) -> Result<Claims, AttestError>,
    ) -> Result<Claims, AttestError> {
        // A verifier that remembers nothing has no use for the template.
        let template = if self.capacity > 0 {
            quote.template(collateral)
        } else {
            None
        };
        if let Some(t) = &template {
            if let Some(claims) = self.remembered(t, now) {
                quote.check_signature()?;
                self.lock().counts.signature_only += 1;
                return Ok(claims);
            }
        }
        self.lock().counts.full += 1;
        let claims = full_check(now)?;
        if let Some(template) = template {
            // Used from now until the window ends or the collateral expires, whichever is
            // first: every check in between would have passed as this one did.
            let expires = claims.collateral_valid_until.unwrap_or(u64::MAX);
            let until = now.saturating_add(self.window_secs).min(expires);
            self.remember(Platform {
                template,
                from: now,
                until,
                claims: claims.clone(),
            });
        }
        Ok(claims)
    }

    fn remembered(&self, template: &[u8; 32], now: u64) -> Option<Claims> {
        let mut state = self.lock();
        let i = state
            .platforms
            .iter()
            .position(|p| &p.template == template)?;
        let p = state.platforms.remove(i)?;
        let claims = (p.from..=p.until).contains(&now).then(|| p.claims.clone());
        state.platforms.push_back(p);
        claims
    }

    /// Only called with room for one (`capacity > 0`): the least recently used goes first.
    fn remember(&self, platform: Platform) {
        let mut state = self.lock();
        state.platforms.retain(|p| p.template != platform.template);
        while state.platforms.len() >= self.capacity {
            state.platforms.pop_front();
        }
        state.platforms.push_back(platform);
    }
}
