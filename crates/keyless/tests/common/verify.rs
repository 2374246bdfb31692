//! Independent checks of what the key server returns: OpenSSL's whole-message verifiers, and ring
//! where it has the algorithm.
#![allow(dead_code)]

use mbx_keyless::Opcode;
use openssl::hash::{hash, MessageDigest};
use openssl::pkey::{PKey, Public};
use openssl::rsa::Padding;
use openssl::sign::{RsaPssSaltlen, Verifier};

pub const MSG: &[u8] = b"ServerKeyExchange params or a TLS 1.3 CertificateVerify input";

pub fn md(op: Opcode) -> Option<MessageDigest> {
    use Opcode::*;
    match op {
        RsaSignSha1 | EcdsaSignSha1 => Some(MessageDigest::sha1()),
        RsaSignSha224 | EcdsaSignSha224 => Some(MessageDigest::sha224()),
        RsaSignSha256 | EcdsaSignSha256 | RsaPssSignSha256 => Some(MessageDigest::sha256()),
        RsaSignSha384 | EcdsaSignSha384 | RsaPssSignSha384 => Some(MessageDigest::sha384()),
        RsaSignSha512 | EcdsaSignSha512 | RsaPssSignSha512 => Some(MessageDigest::sha512()),
        _ => None,
    }
}

pub fn md5_sha1(msg: &[u8]) -> Vec<u8> {
    let mut d = hash(MessageDigest::md5(), msg).unwrap().to_vec();
    d.extend_from_slice(&hash(MessageDigest::sha1(), msg).unwrap());
    d
}

/// What the edge sends for `op`: the digest of MSG, or MSG itself for Ed25519.
pub fn input_for(op: Opcode) -> Vec<u8> {
    match (op, md(op)) {
        (Opcode::Ed25519Sign, _) => MSG.to_vec(),
        (_, Some(m)) => hash(m, MSG).unwrap().to_vec(),
        _ => md5_sha1(MSG),
    }
}

/// Verifies with OpenSSL's whole-message verifiers (they hash MSG themselves).
pub fn openssl_verifies(public: &PKey<Public>, op: Opcode, sig: &[u8]) -> bool {
    use Opcode::*;
    match op {
        RsaSignMd5Sha1 => {
            let rsa = public.rsa().unwrap();
            let mut out = vec![0; rsa.size() as usize];
            match rsa.public_decrypt(sig, &mut out, Padding::PKCS1) {
                Ok(n) => out[..n] == md5_sha1(MSG)[..],
                Err(_) => false,
            }
        }
        EcdsaSignMd5Sha1 => {
            let sig = openssl::ecdsa::EcdsaSig::from_der(sig).unwrap();
            sig.verify(&md5_sha1(MSG), &public.ec_key().unwrap())
                .unwrap()
        }
        Ed25519Sign => Verifier::new_without_digest(public)
            .unwrap()
            .verify_oneshot(sig, MSG)
            .unwrap(),
        _ => {
            let mut v = Verifier::new(md(op).unwrap(), public).unwrap();
            if matches!(op, RsaPssSignSha256 | RsaPssSignSha384 | RsaPssSignSha512) {
                v.set_rsa_padding(Padding::PKCS1_PSS).unwrap();
                v.set_rsa_pss_saltlen(RsaPssSaltlen::DIGEST_LENGTH).unwrap();
                v.set_rsa_mgf1_md(md(op).unwrap()).unwrap();
            } else if public.rsa().is_ok() {
                v.set_rsa_padding(Padding::PKCS1).unwrap();
            }
            v.update(MSG).unwrap();
            v.verify(sig).unwrap_or(false)
        }
    }
}

/// Verifies with ring where ring has the algorithm (an implementation independent of OpenSSL).
pub fn ring_verifies(public: &PKey<Public>, op: Opcode, sig: &[u8]) -> Option<bool> {
    use ring::signature as s;
    use Opcode::*;
    let alg: &dyn s::VerificationAlgorithm = match op {
        RsaSignSha256 => &s::RSA_PKCS1_2048_8192_SHA256,
        RsaSignSha384 => &s::RSA_PKCS1_2048_8192_SHA384,
        RsaSignSha512 => &s::RSA_PKCS1_2048_8192_SHA512,
        RsaPssSignSha256 => &s::RSA_PSS_2048_8192_SHA256,
        RsaPssSignSha384 => &s::RSA_PSS_2048_8192_SHA384,
        RsaPssSignSha512 => &s::RSA_PSS_2048_8192_SHA512,
        Ed25519Sign => &s::ED25519,
        EcdsaSignSha256 | EcdsaSignSha384 => {
            let ec = public.ec_key().unwrap();
            let alg: &dyn s::VerificationAlgorithm = match (ec.group().curve_name(), op) {
                (Some(openssl::nid::Nid::X9_62_PRIME256V1), EcdsaSignSha256) => {
                    &s::ECDSA_P256_SHA256_ASN1
                }
                (Some(openssl::nid::Nid::X9_62_PRIME256V1), EcdsaSignSha384) => {
                    &s::ECDSA_P256_SHA384_ASN1
                }
                (Some(openssl::nid::Nid::SECP384R1), EcdsaSignSha256) => &s::ECDSA_P384_SHA256_ASN1,
                (Some(openssl::nid::Nid::SECP384R1), EcdsaSignSha384) => &s::ECDSA_P384_SHA384_ASN1,
                _ => return None,
            };
            let mut ctx = openssl::bn::BigNumContext::new().unwrap();
            let point = ec
                .public_key()
                .to_bytes(
                    ec.group(),
                    openssl::ec::PointConversionForm::UNCOMPRESSED,
                    &mut ctx,
                )
                .unwrap();
            return Some(
                s::UnparsedPublicKey::new(alg, point)
                    .verify(MSG, sig)
                    .is_ok(),
            );
        }
        _ => return None,
    };
    let raw = match public.rsa() {
        Ok(rsa) => rsa.public_key_to_der_pkcs1().unwrap(),
        Err(_) => public.raw_public_key().unwrap(),
    };
    Some(s::UnparsedPublicKey::new(alg, raw).verify(MSG, sig).is_ok())
}

pub const RSA_SIGN: [Opcode; 9] = [
    Opcode::RsaSignMd5Sha1,
    Opcode::RsaSignSha1,
    Opcode::RsaSignSha224,
    Opcode::RsaSignSha256,
    Opcode::RsaSignSha384,
    Opcode::RsaSignSha512,
    Opcode::RsaPssSignSha256,
    Opcode::RsaPssSignSha384,
    Opcode::RsaPssSignSha512,
];

pub const ECDSA_SIGN: [Opcode; 6] = [
    Opcode::EcdsaSignMd5Sha1,
    Opcode::EcdsaSignSha1,
    Opcode::EcdsaSignSha224,
    Opcode::EcdsaSignSha256,
    Opcode::EcdsaSignSha384,
    Opcode::EcdsaSignSha512,
];
