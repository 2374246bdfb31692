//! TLS RSA key transport unpadding on the edge, in constant time with implicit rejection.
//!
//! The key server returns the raw RSA block (`0x00 0x02 PS 0x00 premaster`) with the padding in
//! place, so the key server never says whether padding was valid: it is no Bleichenbacher oracle.
//! The edge then applies RFC 5246 §7.4.7.1: a random 48-byte premaster replaces the decrypted one
//! when the padding, the length or the version is wrong, and the handshake fails later at
//! Finished, indistinguishably from any other wrong premaster.
//!
//! Because a valid premaster is exactly 48 bytes, every byte of a valid block sits at a fixed
//! position: the function looks at every byte once, in the same order, whatever their values,
//! and selects between the two candidates with `subtle`, so neither time nor memory access
//! depends on the secret block.

use subtle::{Choice, ConditionallySelectable, ConstantTimeEq};
use zeroize::Zeroizing;

/// Length of a TLS premaster secret.
pub const PREMASTER_LEN: usize = 48;
/// Smallest block that can hold `00 02`, 8 padding bytes, `00` and a premaster.
pub const MIN_BLOCK_LEN: usize = PREMASTER_LEN + 11;

/// Returns the premaster from a raw PKCS#1 v1.5 block, or `random` when the block is not
/// `00 02 PS(nonzero, ≥ 8) 00 M` with `M` 48 bytes starting with `client_version`.
///
/// `random` must be fresh random bytes drawn before looking at the block. The block's length is
/// public (it equals the RSA modulus size); a block shorter than [`MIN_BLOCK_LEN`] yields
/// `random`.
pub fn unpad_premaster(
    block: &[u8],
    client_version: [u8; 2],
    random: &[u8; PREMASTER_LEN],
) -> Zeroizing<[u8; PREMASTER_LEN]> {
    let mut out = Zeroizing::new(*random);
    if block.len() < MIN_BLOCK_LEN {
        return out;
    }
    let (head, m) = block.split_at(block.len() - PREMASTER_LEN);
    let (Some((&separator, rest)), Some((&b0, after0))) = (head.split_last(), head.split_first())
    else {
        return out;
    };
    let (Some(&b1), Some(padding)) = (after0.first(), rest.get(2..)) else {
        return out;
    };
    let mut good: Choice = b0.ct_eq(&0x00) & b1.ct_eq(&0x02) & separator.ct_eq(&0x00);
    for byte in padding {
        good &= !byte.ct_eq(&0x00);
    }
    let (Some(&v0), Some(&v1)) = (m.first(), m.get(1)) else {
        return out;
    };
    good &= v0.ct_eq(&client_version[0]) & v1.ct_eq(&client_version[1]);
    for (o, &b) in out.iter_mut().zip(m) {
        *o = u8::conditional_select(o, &b, good);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn block(k: usize, version: [u8; 2], fill: u8) -> Vec<u8> {
        let mut b = vec![0x00, 0x02];
        b.extend(vec![fill; k - 3 - PREMASTER_LEN]);
        b.push(0);
        b.extend(version);
        b.extend((0..46).map(|i| i as u8 ^ 0xA5));
        b
    }

    const R: [u8; 48] = [0x77; 48];

    #[test]
    fn good_block_gives_its_premaster() {
        let b = block(256, [3, 3], 0x5A);
        assert_eq!(&unpad_premaster(&b, [3, 3], &R)[..], &b[256 - 48..]);
    }

    #[test]
    fn every_defect_gives_the_random_premaster() {
        let good = block(256, [3, 3], 0x5A);
        let mut cases = Vec::new();
        let mut b = good.clone();
        b[0] = 1;
        cases.push(b); // first byte
        let mut b = good.clone();
        b[1] = 1;
        cases.push(b); // block type
        let mut b = good.clone();
        b[256 - 49] = 1;
        cases.push(b); // no separator before M: M would be longer than 48
        let mut b = good.clone();
        b[100] = 0;
        cases.push(b); // zero in padding: M would be longer than 48... or a short PS
        let mut b = good.clone();
        b[2] = 0;
        cases.push(b); // empty padding string
        let mut b = good.clone();
        b[256 - 48] = 2;
        cases.push(b); // major version
        let mut b = good.clone();
        b[256 - 47] = 1;
        cases.push(b); // minor version
        for (i, b) in cases.iter().enumerate() {
            assert_eq!(&unpad_premaster(b, [3, 3], &R)[..], &R[..], "case {i}");
        }
        assert_eq!(&unpad_premaster(&good[..58], [3, 3], &R)[..], &R[..]);
        assert_eq!(&unpad_premaster(&[], [3, 3], &R)[..], &R[..]);
    }

    proptest! {
        #[test]
        fn random_blocks_never_panic_and_give_block_or_random(b in proptest::collection::vec(any::<u8>(), 0..300)) {
            let out = unpad_premaster(&b, [3, 3], &R);
            prop_assert!(out[..] == R[..] || (b.len() >= 59 && out[..] == b[b.len() - 48..]));
        }
    }
}
