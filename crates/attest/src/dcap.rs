//! Intel SGX / TDX DCAP quote verification, offline, with `dcap-qvl`.
//!
//! The evidence carries the quote *and* its collateral (TCB info, QE identity, CRLs and their issuer
//! chains, as served by a PCCS), so the verifier needs no network: `dcap-qvl` checks the chain up to
//! Intel's SGX root CA (compiled into it), signatures, CRLs and the validity windows at the `now` we
//! pass, and computes the platform TCB status. We then check the session binding and apply our
//! [`Policy`]. Debug enclaves are let through `dcap-qvl` on purpose so that our policy's
//! `allow_debug` (with its own error) decides.

use dcap_qvl::quote::{Quote, Report};
use dcap_qvl::verify::QuoteVerifier;
use dcap_qvl::{QuoteCollateralV3, QuotePolicy};

use crate::binding::{report_data_eq, REPORT_DATA_LEN};
use crate::claims::{Claims, TcbStatus, TeeKind};
use crate::dcap_cache::{DcapVerifier, ParsedQuote};
use crate::error::AttestError;
use crate::evidence::DcapEvidence;
use crate::policy::Policy;

/// SGX `ATTRIBUTES.DEBUG` (bit 1 of the first attribute byte).
const SGX_ATTR_DEBUG: u8 = 0x02;
/// TDX `TDATTRIBUTES.TUD` ("TD under debug") byte: bit 0 is DEBUG, the others are reserved debug
/// features; any of them set means the host may inspect the TD, so all count as debug.
const TDX_TUD_MASK: u8 = 0xff;

/// Verify DCAP evidence at time `now_unix` (seconds since the epoch).
pub fn verify_dcap(
    ev: &DcapEvidence,
    expected_report_data: &[u8; REPORT_DATA_LEN],
    policy: &Policy,
    now_unix: u64,
) -> Result<Claims, AttestError> {
    DcapVerifier::shared().verify_evidence(ev, expected_report_data, policy, now_unix)
}

/// Verify a raw quote with its collateral JSON, check its report_data against
/// `expected_report_data`, and apply `policy`.
///
/// Lower-level than [`verify_dcap`] so that a quote whose report_data is not one of our bindings
/// (such as Intel sample quotes) can be checked. Through the process-wide
/// [`DcapVerifier::shared`]: a quote of a platform verified in full less than
/// [`SHARED_WINDOW_SECS`](crate::dcap_cache::SHARED_WINDOW_SECS) ago, with the same collateral,
/// is checked by its own signature alone ([`crate::dcap_cache`]).
pub fn verify_dcap_quote(
    quote: &[u8],
    collateral_json: &[u8],
    expected_report_data: &[u8; REPORT_DATA_LEN],
    policy: &Policy,
    now_unix: u64,
) -> Result<Claims, AttestError> {
    DcapVerifier::shared().verify_quote(
        quote,
        collateral_json,
        expected_report_data,
        policy,
        now_unix,
    )
}

impl DcapVerifier {
    /// [`verify_dcap_quote`] with this verifier's memory of platforms.
    pub fn verify_quote(
        &self,
        quote: &[u8],
        collateral_json: &[u8],
        expected_report_data: &[u8; REPORT_DATA_LEN],
        policy: &Policy,
        now_unix: u64,
    ) -> Result<Claims, AttestError> {
        // The evidence's own constructor bounds both before they are used.
        let ev = DcapEvidence::new(quote.to_vec(), collateral_json.to_vec())?;
        self.verify_evidence(&ev, expected_report_data, policy, now_unix)
    }

    /// [`verify_dcap`] with this verifier's memory of platforms. A compressed collateral is
    /// inflated only for a full check: a remembered platform is recognised by the bytes that
    /// travelled.
    pub fn verify_evidence(
        &self,
        ev: &DcapEvidence,
        expected_report_data: &[u8; REPORT_DATA_LEN],
        policy: &Policy,
        now_unix: u64,
    ) -> Result<Claims, AttestError> {
        policy.validate()?;
        let parsed = ParsedQuote::parse(ev.quote())?;
        let claims = self.claims(&parsed, ev.collateral(), now_unix, |at| {
            full_check(ev.quote(), &ev.collateral_json()?, at)
        })?;
        if !report_data_eq(&parsed.report_data(), expected_report_data) {
            return Err(AttestError::ReportDataMismatch);
        }
        policy.check_claims(&claims)?;
        policy.check_collateral_age(&claims, now_unix)?;
        Ok(claims)
    }
}

/// Everything `dcap-qvl` checks (collateral, chains, CRLs, QE, signatures, TCB) at `now_unix`: the
/// quote's claims, before the binding and any policy, with the last second its collateral is
/// valid (`collateral_valid_until`, the earliest `nextUpdate`/`notAfter` of all of it: every
/// check `dcap-qvl` makes with the time is a window, so all of them hold from `now_unix` to
/// then).
fn full_check(quote: &[u8], collateral_json: &[u8], now_unix: u64) -> Result<Claims, AttestError> {
    let collateral: QuoteCollateralV3 = serde_json::from_slice(collateral_json)
        .map_err(|e| AttestError::Collateral(e.to_string()))?;
    // `claims_only`: dcap-qvl verifies everything and appraises nothing; our policy decides.
    let verified = QuoteVerifier::new_prod()
        .allow_debug(true)
        .verify_with_policy(
            quote,
            collateral,
            now_unix,
            &QuotePolicy::claims_only(now_unix),
        )
        .map_err(|e| AttestError::Dcap(format!("{e:#}")))?;
    let tcb_status: TcbStatus = verified
        .tcb
        .status
        .to_string()
        .parse()
        .map_err(|e: String| AttestError::Dcap(e))?;
    let body = Body::of(&verified.report)?;
    let claims = Claims {
        tee: body.tee,
        measurement: body.measurement,
        signer: body.signer,
        product_id: body.product_id,
        svn: body.svn,
        debug: body.debug,
        tcb_status: Some(tcb_status),
        advisory_ids: verified.tcb.advisory_ids,
        tcb_evaluation_data_number: Some(verified.tcb.eval_data_number),
        platform_key: None,
        collateral_valid_until: Some(verified.earliest_expiration_date),
        collateral_issued_at: Some(verified.earliest_issue_date),
    };
    Ok(claims)
}

/// What a report body says of the TEE and its code. TDX has no workload signer or ISV SVN: they
/// are reported empty/0 and policy decides (a non-empty `signers` list or `min_svn > 0` refuses
/// TDX evidence).
struct Body {
    tee: TeeKind,
    measurement: Vec<u8>,
    signer: Vec<u8>,
    product_id: u16,
    svn: u16,
    debug: bool,
}

impl Body {
    fn of(report: &Report) -> Result<Body, AttestError> {
        if let Some(r) = report.as_sgx() {
            return Ok(Body {
                tee: TeeKind::Sgx,
                measurement: r.mr_enclave.to_vec(),
                signer: r.mr_signer.to_vec(),
                product_id: r.isv_prod_id,
                svn: r.isv_svn,
                debug: r.attributes[0] & SGX_ATTR_DEBUG != 0,
            });
        }
        // Every TD report (1.0, 1.5, 1.5 extended) has the 1.0 fields.
        let r = report
            .as_td10()
            .ok_or_else(|| AttestError::Dcap("a report body of no known kind".into()))?;
        Ok(Body {
            tee: TeeKind::Tdx,
            measurement: tdx_measurement(r).to_vec(),
            signer: Vec::new(),
            product_id: 0,
            svn: 0,
            debug: r.td_attributes[0] & TDX_TUD_MASK != 0,
        })
    }
}

/// Domain separation of [`tdx_measurement`].
const TDX_MEASUREMENT_LABEL: &[u8] = b"mbx tdx measurement v1\0";

/// A trust domain's code measurement, as policies pin it:
/// `SHA-384("mbx tdx measurement v1\0" ‖ MRTD ‖ MRCONFIGID ‖ MROWNER ‖ MROWNERCONFIG ‖
/// RTMR0 ‖ RTMR1 ‖ RTMR2 ‖ RTMR3)`. MRTD alone measures only the TD's initial image (its
/// firmware): a TD booted from the expected firmware with another kernel, initrd or
/// middlebox program differs only in the RTMRs, and the host sets MRCONFIGID, MROWNER and
/// MROWNERCONFIG. Pinning all of them pins the software the TD runs and its configuration,
/// as MRENCLAVE does for an enclave.
fn tdx_measurement(r: &dcap_qvl::quote::TDReport10) -> [u8; 48] {
    use sha2::{Digest, Sha384};
    let mut h = Sha384::new();
    h.update(TDX_MEASUREMENT_LABEL);
    for field in [
        &r.mr_td,
        &r.mr_config_id,
        &r.mr_owner,
        &r.mr_owner_config,
        &r.rt_mr0,
        &r.rt_mr1,
        &r.rt_mr2,
        &r.rt_mr3,
    ] {
        h.update(field);
    }
    h.finalize().into()
}

/// The report_data field of a quote, read **without verifying anything**.
///
/// For diagnostics and tests (e.g. to learn what a sample quote is bound to); never a basis for trust.
pub fn quote_report_data_unverified(quote: &[u8]) -> Result<[u8; REPORT_DATA_LEN], AttestError> {
    Ok(ParsedQuote::parse(quote)?.report_data())
}

/// The code measurement of a quote (SGX MRENCLAVE, TDX [`tdx_measurement`]), read **without
/// verifying anything**: for a middlebox to show what it runs, never a basis for trust.
pub fn quote_measurement_unverified(quote: &[u8]) -> Result<Vec<u8>, AttestError> {
    let q = Quote::parse(quote).map_err(|e| AttestError::Dcap(format!("{e:#}")))?;
    Ok(Body::of(&q.report)?.measurement)
}
