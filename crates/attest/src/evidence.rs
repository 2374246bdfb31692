//! Evidence and its wire encoding.
//!
//! Evidence travels from the middlebox to the endpoint over the secondary TLS session, so decoding
//! handles untrusted bytes: every length is checked against a limit before anything is allocated, and
//! nothing panics. Encoding (all integers big-endian):
//!
//! ```text
//! magic "MBXA" | version u8 (= 1) | kind u8 | body
//! kind 1, simulated: measurement[32] signer[32] product_id u16 svn u16 debug u8 (0|1)
//!                    report_data[64] platform_key[32] signature[64]
//!                    (Ed25519 signature over every preceding byte, magic included)
//! kind 2, DCAP:      quote_len u32 | quote | collateral_len u32 | collateral (JSON, PCCS format)
//! kind 3, DCAP with compressed collateral:
//!                    quote_len u32 | quote | deflated_len u32 | collateral, raw DEFLATE (RFC 1951)
//! ```
//!
//! Kind 3 exists because the collateral is most of a DCAP evidence (14–16 KB of Intel's 19–21 KB
//! samples) and compresses to a quarter (PEM chains and hex CRLs); less than TCP's initial window
//! is left for the rest of the middlebox's first flight (docs/mbtls.md §2, "Evidence size").
//! Inflating is bounded by [`MAX_COLLATERAL_LEN`].
//!
//! The decoder requires the input to end exactly where the body ends.

use std::borrow::Cow;

use crate::binding::REPORT_DATA_LEN;
use crate::error::AttestError;

/// Leading bytes of every encoded evidence.
pub const MAGIC: [u8; 4] = *b"MBXA";
/// The only encoding version produced and accepted.
pub const VERSION: u8 = 1;
/// Largest encoded evidence accepted.
pub const MAX_EVIDENCE_LEN: usize = 192 * 1024;
/// Largest DCAP quote accepted (real SGX/TDX quotes with their PCK chain are about 5 KiB).
pub const MAX_QUOTE_LEN: usize = 32 * 1024;
/// Largest DCAP collateral JSON accepted (Intel's are 14–25 KiB).
pub const MAX_COLLATERAL_LEN: usize = 128 * 1024;

/// Evidence kind tag.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum EvidenceKind {
    /// Software simulator, signed by a platform key.
    Simulated = 1,
    /// Intel SGX/TDX DCAP quote plus collateral.
    Dcap = 2,
    /// Intel SGX/TDX DCAP quote plus DEFLATE-compressed collateral.
    DcapDeflated = 3,
}

impl EvidenceKind {
    fn from_u8(v: u8) -> Result<Self, AttestError> {
        match v {
            1 => Ok(EvidenceKind::Simulated),
            2 => Ok(EvidenceKind::Dcap),
            3 => Ok(EvidenceKind::DcapDeflated),
            other => Err(AttestError::UnknownKind(other)),
        }
    }
}

/// Simulated evidence: a report signed by a software platform key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimEvidence {
    /// Code measurement (see [`crate::sim::measure`]).
    pub measurement: [u8; 32],
    /// Signer measurement (see [`crate::sim::signer_id`]).
    pub signer: [u8; 32],
    /// Product id.
    pub product_id: u16,
    /// Security version.
    pub svn: u16,
    /// Claimed debug mode.
    pub debug: bool,
    /// Session binding, see [`crate::binding::report_data`].
    pub report_data: [u8; REPORT_DATA_LEN],
    /// Ed25519 public key of the platform that signed.
    pub platform_key: [u8; 32],
    /// Ed25519 signature over [`SimEvidence::signed_bytes`].
    pub signature: [u8; 64],
}

/// Encoded length of a simulated evidence (header included).
const SIM_LEN: usize = 4 + 1 + 1 + 32 + 32 + 2 + 2 + 1 + REPORT_DATA_LEN + 32 + 64;

impl SimEvidence {
    /// The bytes the platform key signs: the whole encoding up to the signature.
    pub fn signed_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(SIM_LEN);
        out.extend_from_slice(&MAGIC);
        out.push(VERSION);
        out.push(EvidenceKind::Simulated as u8);
        out.extend_from_slice(&self.measurement);
        out.extend_from_slice(&self.signer);
        out.extend_from_slice(&self.product_id.to_be_bytes());
        out.extend_from_slice(&self.svn.to_be_bytes());
        out.push(u8::from(self.debug));
        out.extend_from_slice(&self.report_data);
        out.extend_from_slice(&self.platform_key);
        out
    }
}

/// DCAP evidence: a quote and the collateral that lets the verifier check it offline.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DcapEvidence {
    quote: Vec<u8>,
    collateral: Collateral,
}

/// The collateral of a DCAP evidence as it travels.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Collateral {
    /// The PCCS JSON as it is (evidence kind 2).
    Json(Vec<u8>),
    /// The PCCS JSON compressed with raw DEFLATE (evidence kind 3).
    Deflated(Vec<u8>),
}

impl Collateral {
    /// `json` compressed (DEFLATE level 6, a few hundred µs for Intel's 14–16 KB; an attester
    /// compresses each platform's collateral once).
    pub fn deflate(json: &[u8]) -> Result<Self, AttestError> {
        check_len("collateral", json.len(), MAX_COLLATERAL_LEN)?;
        let deflated = miniz_oxide::deflate::compress_to_vec(json, 6);
        check_len("compressed collateral", deflated.len(), MAX_COLLATERAL_LEN)?;
        Ok(Collateral::Deflated(deflated))
    }

    /// The kind of evidence that carries it so.
    pub fn kind(&self) -> EvidenceKind {
        match self {
            Collateral::Json(_) => EvidenceKind::Dcap,
            Collateral::Deflated(_) => EvidenceKind::DcapDeflated,
        }
    }

    /// The bytes that travel (JSON, or its DEFLATE stream).
    pub fn wire_bytes(&self) -> &[u8] {
        match self {
            Collateral::Json(b) | Collateral::Deflated(b) => b,
        }
    }

    /// The PCCS JSON, inflated if it travels compressed: never more than
    /// [`MAX_COLLATERAL_LEN`] bytes are produced, whatever the stream claims.
    pub fn json(&self) -> Result<Cow<'_, [u8]>, AttestError> {
        match self {
            Collateral::Json(b) => Ok(Cow::Borrowed(b)),
            Collateral::Deflated(z) => inflate(z).map(Cow::Owned),
        }
    }
}

/// A DEFLATE stream inflated to at most [`MAX_COLLATERAL_LEN`] bytes.
fn inflate(deflated: &[u8]) -> Result<Vec<u8>, AttestError> {
    miniz_oxide::inflate::decompress_to_vec_with_limit(deflated, MAX_COLLATERAL_LEN).map_err(|_| {
        AttestError::Malformed("compressed collateral is not DEFLATE or inflates beyond its limit")
    })
}

impl DcapEvidence {
    /// Wrap a quote and its collateral (PCCS JSON, as `dcap-qvl`'s `QuoteCollateralV3` serializes).
    pub fn new(quote: Vec<u8>, collateral_json: Vec<u8>) -> Result<Self, AttestError> {
        Self::with_collateral(quote, Collateral::Json(collateral_json))
    }

    /// A quote with its collateral as given (e.g. compressed once by [`Collateral::deflate`]).
    pub fn with_collateral(quote: Vec<u8>, collateral: Collateral) -> Result<Self, AttestError> {
        check_len("quote", quote.len(), MAX_QUOTE_LEN)?;
        check_len(
            "collateral",
            collateral.wire_bytes().len(),
            MAX_COLLATERAL_LEN,
        )?;
        Ok(DcapEvidence { quote, collateral })
    }

    /// The raw SGX/TDX quote.
    pub fn quote(&self) -> &[u8] {
        &self.quote
    }

    /// The collateral as it travels.
    pub fn collateral(&self) -> &Collateral {
        &self.collateral
    }

    /// The collateral JSON (inflated if it travels compressed).
    pub fn collateral_json(&self) -> Result<Cow<'_, [u8]>, AttestError> {
        self.collateral.json()
    }
}

/// Evidence from some TEE backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Evidence {
    /// From the software simulator.
    Simulated(SimEvidence),
    /// From Intel SGX/TDX.
    Dcap(DcapEvidence),
}

fn check_len(what: &'static str, len: usize, max: usize) -> Result<(), AttestError> {
    if len > max {
        Err(AttestError::TooLarge { what, len, max })
    } else {
        Ok(())
    }
}

/// Bounds-checked cursor over untrusted bytes.
struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], AttestError> {
        if n > self.buf.len() {
            return Err(AttestError::Malformed("truncated"));
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], AttestError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    fn u8(&mut self) -> Result<u8, AttestError> {
        Ok(u8::from_be_bytes(self.array()?))
    }

    fn u16(&mut self) -> Result<u16, AttestError> {
        Ok(u16::from_be_bytes(self.array()?))
    }

    fn u32(&mut self) -> Result<u32, AttestError> {
        Ok(u32::from_be_bytes(self.array()?))
    }

    /// A `u32`-length-prefixed field, refused above `max` before it is read.
    fn vec32(&mut self, what: &'static str, max: usize) -> Result<Vec<u8>, AttestError> {
        let len = usize::try_from(self.u32()?).unwrap_or(usize::MAX);
        check_len(what, len, max)?;
        Ok(self.take(len)?.to_vec())
    }

    fn finish(&self) -> Result<(), AttestError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(AttestError::Malformed("trailing bytes"))
        }
    }
}

impl Evidence {
    /// The report_data and code measurement this evidence claims, read without checking it
    /// (its verifier does): for a middlebox's start-up checks of its own evidence.
    pub fn claimed_unverified(&self) -> Result<([u8; REPORT_DATA_LEN], Vec<u8>), AttestError> {
        Ok(match self {
            Evidence::Simulated(ev) => (ev.report_data, ev.measurement.to_vec()),
            Evidence::Dcap(ev) => (
                crate::dcap::quote_report_data_unverified(ev.quote())?,
                crate::dcap::quote_measurement_unverified(ev.quote())?,
            ),
        })
    }

    /// The kind tag.
    pub fn kind(&self) -> EvidenceKind {
        match self {
            Evidence::Simulated(_) => EvidenceKind::Simulated,
            Evidence::Dcap(d) => d.collateral.kind(),
        }
    }

    /// Encode for the wire.
    pub fn to_bytes(&self) -> Vec<u8> {
        match self {
            Evidence::Simulated(sim) => {
                let mut out = sim.signed_bytes();
                out.extend_from_slice(&sim.signature);
                out
            }
            Evidence::Dcap(d) => {
                let collateral = d.collateral.wire_bytes();
                let mut out = Vec::with_capacity(14 + d.quote.len() + collateral.len());
                out.extend_from_slice(&MAGIC);
                out.push(VERSION);
                out.push(self.kind() as u8);
                // Lengths fit: `DcapEvidence` bounds them far below u32::MAX.
                out.extend_from_slice(&(d.quote.len() as u32).to_be_bytes());
                out.extend_from_slice(&d.quote);
                out.extend_from_slice(&(collateral.len() as u32).to_be_bytes());
                out.extend_from_slice(collateral);
                out
            }
        }
    }

    /// Decode untrusted bytes. Never panics; refuses oversize input before allocating.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, AttestError> {
        check_len("evidence", bytes.len(), MAX_EVIDENCE_LEN)?;
        let mut r = Reader { buf: bytes };
        if r.array::<4>()? != MAGIC {
            return Err(AttestError::Malformed("bad magic"));
        }
        let version = r.u8()?;
        if version != VERSION {
            return Err(AttestError::UnsupportedVersion(version));
        }
        let evidence = match EvidenceKind::from_u8(r.u8()?)? {
            EvidenceKind::Simulated => {
                let measurement = r.array()?;
                let signer = r.array()?;
                let product_id = r.u16()?;
                let svn = r.u16()?;
                let debug = match r.u8()? {
                    0 => false,
                    1 => true,
                    _ => return Err(AttestError::Malformed("debug flag is not 0 or 1")),
                };
                Evidence::Simulated(SimEvidence {
                    measurement,
                    signer,
                    product_id,
                    svn,
                    debug,
                    report_data: r.array()?,
                    platform_key: r.array()?,
                    signature: r.array()?,
                })
            }
            kind @ (EvidenceKind::Dcap | EvidenceKind::DcapDeflated) => {
                let quote = r.vec32("quote", MAX_QUOTE_LEN)?;
                let bytes = r.vec32("collateral", MAX_COLLATERAL_LEN)?;
                // A compressed collateral is inflated (bounded) only when it is checked.
                let collateral = match kind {
                    EvidenceKind::Dcap => Collateral::Json(bytes),
                    _ => Collateral::Deflated(bytes),
                };
                Evidence::Dcap(DcapEvidence { quote, collateral })
            }
        };
        r.finish()?;
        Ok(evidence)
    }
}

/// Serialized as its wire encoding (a byte string), so evidence can sit inside other messages.
impl serde::Serialize for Evidence {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(&self.to_bytes())
    }
}

impl<'de> serde::Deserialize<'de> for Evidence {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Evidence;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("encoded attestation evidence (bytes)")
            }
            fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<Evidence, E> {
                Evidence::from_bytes(v).map_err(E::custom)
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Evidence, A::Error> {
                let mut buf = Vec::new();
                while let Some(b) = seq.next_element::<u8>()? {
                    if buf.len() >= MAX_EVIDENCE_LEN {
                        return Err(serde::de::Error::custom("evidence too large"));
                    }
                    buf.push(b);
                }
                Evidence::from_bytes(&buf).map_err(serde::de::Error::custom)
            }
        }
        d.deserialize_bytes(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sim() -> SimEvidence {
        SimEvidence {
            measurement: [1; 32],
            signer: [2; 32],
            product_id: 0x0304,
            svn: 0x0506,
            debug: true,
            report_data: [7; 64],
            platform_key: [8; 32],
            signature: [9; 64],
        }
    }

    #[test]
    fn round_trips() {
        let e = Evidence::Simulated(sim());
        let bytes = e.to_bytes();
        assert_eq!(bytes.len(), SIM_LEN);
        assert_eq!(Evidence::from_bytes(&bytes).unwrap(), e);

        let d = Evidence::Dcap(DcapEvidence::new(vec![1, 2, 3], b"{}".to_vec()).unwrap());
        assert_eq!(Evidence::from_bytes(&d.to_bytes()).unwrap(), d);
        assert_eq!(d.kind(), EvidenceKind::Dcap);

        let json = br#"{"tcbInfo": "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"}"#;
        let z = Collateral::deflate(json).unwrap();
        let c = DcapEvidence::with_collateral(vec![1, 2, 3], z).unwrap();
        assert_eq!(c.collateral_json().unwrap().as_ref(), json);
        let c = Evidence::Dcap(c);
        assert_eq!(c.kind(), EvidenceKind::DcapDeflated);
        let bytes = c.to_bytes();
        assert_eq!(bytes[5], 3);
        assert!(
            bytes.len()
                < Evidence::Dcap(DcapEvidence::new(vec![1, 2, 3], json.to_vec()).unwrap())
                    .to_bytes()
                    .len()
        );
        assert_eq!(Evidence::from_bytes(&bytes).unwrap(), c);
    }

    #[test]
    fn compressed_collateral_inflates_to_its_limit_and_no_further() {
        // A stream inflating to one byte more than the limit: refused, with no more than the
        // limit ever produced (miniz_oxide stops there).
        let bomb = miniz_oxide::deflate::compress_to_vec(&vec![0; MAX_COLLATERAL_LEN + 1], 9);
        assert!(bomb.len() < 1024);
        let c = Collateral::Deflated(bomb);
        assert!(matches!(c.json(), Err(AttestError::Malformed(_))));
        let at_limit = miniz_oxide::deflate::compress_to_vec(&vec![0; MAX_COLLATERAL_LEN], 9);
        assert_eq!(
            Collateral::Deflated(at_limit).json().unwrap().len(),
            MAX_COLLATERAL_LEN
        );
        // Not DEFLATE at all.
        let c = Collateral::Deflated(vec![0xff; 64]);
        assert!(matches!(c.json(), Err(AttestError::Malformed(_))));
        // Too much to compress is refused before compressing.
        assert!(Collateral::deflate(&vec![0; MAX_COLLATERAL_LEN + 1]).is_err());
    }

    #[test]
    fn serde_uses_the_wire_encoding() {
        let e = Evidence::Simulated(sim());
        let json = serde_json::to_vec(&e).unwrap();
        assert_eq!(serde_json::from_slice::<Evidence>(&json).unwrap(), e);
        let expected: Vec<u8> = e.to_bytes();
        assert_eq!(json, serde_json::to_vec(&expected).unwrap());
        assert!(serde_json::from_slice::<Evidence>(b"[1,2,3]").is_err());
    }

    #[test]
    fn rejects_header_problems() {
        let good = Evidence::Simulated(sim()).to_bytes();
        let mut b = good.clone();
        b[0] ^= 1;
        assert!(matches!(
            Evidence::from_bytes(&b),
            Err(AttestError::Malformed("bad magic"))
        ));
        let mut b = good.clone();
        b[4] = 2;
        assert!(matches!(
            Evidence::from_bytes(&b),
            Err(AttestError::UnsupportedVersion(2))
        ));
        let mut b = good.clone();
        b[5] = 9;
        assert!(matches!(
            Evidence::from_bytes(&b),
            Err(AttestError::UnknownKind(9))
        ));
        let mut b = good.clone();
        b[4 + 1 + 1 + 64 + 4] = 2; // debug flag
        assert!(matches!(
            Evidence::from_bytes(&b),
            Err(AttestError::Malformed(_))
        ));
        let mut b = good;
        b.push(0);
        assert!(matches!(
            Evidence::from_bytes(&b),
            Err(AttestError::Malformed("trailing bytes"))
        ));
    }

    #[test]
    fn length_limits_apply_before_allocation() {
        let mut b = MAGIC.to_vec();
        b.extend_from_slice(&[VERSION, EvidenceKind::Dcap as u8]);
        b.extend_from_slice(&u32::MAX.to_be_bytes());
        assert!(matches!(
            Evidence::from_bytes(&b),
            Err(AttestError::TooLarge { what: "quote", .. })
        ));
        assert!(matches!(
            Evidence::from_bytes(&vec![0; MAX_EVIDENCE_LEN + 1]),
            Err(AttestError::TooLarge {
                what: "evidence",
                ..
            })
        ));
        assert!(DcapEvidence::new(vec![0; MAX_QUOTE_LEN + 1], vec![]).is_err());
        assert!(DcapEvidence::new(vec![], vec![0; MAX_COLLATERAL_LEN + 1]).is_err());
    }
}
