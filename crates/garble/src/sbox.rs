//! The AES S-box as a 115-gate straight-line program: 32 AND, 83 XOR/XNOR.
//!
//! Source: J. Boyar and R. Peralta, "A new combinational logic minimization technique with
//! applications to cryptology", SEA 2010 (LNCS 6049), and J. Boyar, P. Matthews, R. Peralta,
//! "Logic minimization techniques with applications to cryptology", J. Cryptology 26(2), 2013:
//! the forward S-box as a top linear layer (23 XOR), a shared non-linear middle (inversion in
//! GF(2⁴)-towers: 32 AND + 30 XOR) and a bottom linear layer (26 XOR + 4 XNOR, which fold in the
//! affine constant 0x63). The gate list below follows that published description; `U0`/`S0` are the
//! most significant bits. It is checked against the FIPS-197 S-box on all 256 inputs in the tests.
//!
//! The program is written once, generic over [`BitOps`], and instantiated for cleartext bits (the
//! garbler's key schedule, which thus has no secret-indexed table lookups) and for circuit building.
//! Independent AND gates are listed first in each layer so that a builder that emits the program for
//! many S-boxes in lock step gives the garbler long runs of independent ANDs to hash in one batch.

/// Bit operations the S-box program needs.
pub(crate) trait BitOps {
    type W: Copy;
    fn xor(&mut self, a: Self::W, b: Self::W) -> Self::W;
    fn xnor(&mut self, a: Self::W, b: Self::W) -> Self::W;
    fn and(&mut self, a: Self::W, b: Self::W) -> Self::W;
}

/// Cleartext bits.
pub(crate) struct Clear;

impl BitOps for Clear {
    type W = bool;
    fn xor(&mut self, a: bool, b: bool) -> bool {
        a ^ b
    }
    fn xnor(&mut self, a: bool, b: bool) -> bool {
        !(a ^ b)
    }
    fn and(&mut self, a: bool, b: bool) -> bool {
        a & b
    }
}

/// The S-box on `u = [U0 (msb), …, U7 (lsb)]`, returning `[S0 (msb), …, S7 (lsb)]`.
pub(crate) fn sbox<O: BitOps>(o: &mut O, u: [O::W; 8]) -> [O::W; 8] {
    let [u0, u1, u2, u3, u4, u5, u6, u7] = u;
    // Top linear layer (23 XOR).
    let y14 = o.xor(u3, u5);
    let y13 = o.xor(u0, u6);
    let y9 = o.xor(u0, u3);
    let y8 = o.xor(u0, u5);
    let t0 = o.xor(u1, u2);
    let y1 = o.xor(t0, u7);
    let y4 = o.xor(y1, u3);
    let y12 = o.xor(y13, y14);
    let y2 = o.xor(y1, u0);
    let y5 = o.xor(y1, u6);
    let y3 = o.xor(y5, y8);
    let t1 = o.xor(u4, y12);
    let y15 = o.xor(t1, u5);
    let y20 = o.xor(t1, u1);
    let y6 = o.xor(y15, u7);
    let y10 = o.xor(y15, t0);
    let y11 = o.xor(y20, y9);
    let y7 = o.xor(u7, y11);
    let y17 = o.xor(y10, y11);
    let y19 = o.xor(y10, y8);
    let y16 = o.xor(t0, y11);
    let y21 = o.xor(y13, y16);
    let y18 = o.xor(u0, y16);

    // Non-linear middle (32 AND, 30 XOR). The nine independent ANDs first.
    let t2 = o.and(y12, y15);
    let t3 = o.and(y3, y6);
    let t5 = o.and(y4, u7);
    let t7 = o.and(y13, y16);
    let t8 = o.and(y5, y1);
    let t10 = o.and(y2, y7);
    let t12 = o.and(y9, y11);
    let t13 = o.and(y14, y17);
    let t15 = o.and(y8, y10);
    let t4 = o.xor(t3, t2);
    let t6 = o.xor(t5, t2);
    let t9 = o.xor(t8, t7);
    let t11 = o.xor(t10, t7);
    let t14 = o.xor(t13, t12);
    let t16 = o.xor(t15, t12);
    let t17 = o.xor(t4, t14);
    let t18 = o.xor(t6, t16);
    let t19 = o.xor(t9, t14);
    let t20 = o.xor(t11, t16);
    let t21 = o.xor(t17, y20);
    let t22 = o.xor(t18, y19);
    let t23 = o.xor(t19, y21);
    let t24 = o.xor(t20, y18);
    let t25 = o.xor(t21, t22);
    let t26 = o.and(t21, t23);
    let t27 = o.xor(t24, t26);
    let t28 = o.and(t25, t27);
    let t29 = o.xor(t28, t22);
    let t30 = o.xor(t23, t24);
    let t31 = o.xor(t22, t26);
    let t32 = o.and(t31, t30);
    let t33 = o.xor(t32, t24);
    let t34 = o.xor(t23, t33);
    let t35 = o.xor(t27, t33);
    let t36 = o.and(t24, t35);
    let t37 = o.xor(t36, t34);
    let t38 = o.xor(t27, t36);
    let t39 = o.and(t29, t38);
    let t40 = o.xor(t25, t39);
    let t41 = o.xor(t40, t37);
    let t42 = o.xor(t29, t33);
    let t43 = o.xor(t29, t40);
    let t44 = o.xor(t33, t37);
    let t45 = o.xor(t42, t41);
    let z0 = o.and(t44, y15);
    let z1 = o.and(t37, y6);
    let z2 = o.and(t33, u7);
    let z3 = o.and(t43, y16);
    let z4 = o.and(t40, y1);
    let z5 = o.and(t29, y7);
    let z6 = o.and(t42, y11);
    let z7 = o.and(t45, y17);
    let z8 = o.and(t41, y10);
    let z9 = o.and(t44, y12);
    let z10 = o.and(t37, y3);
    let z11 = o.and(t33, y4);
    let z12 = o.and(t43, y13);
    let z13 = o.and(t40, y5);
    let z14 = o.and(t29, y2);
    let z15 = o.and(t42, y9);
    let z16 = o.and(t45, y14);
    let z17 = o.and(t41, y8);

    // Bottom linear layer (26 XOR, 4 XNOR).
    let t46 = o.xor(z15, z16);
    let t47 = o.xor(z10, z11);
    let t48 = o.xor(z5, z13);
    let t49 = o.xor(z9, z10);
    let t50 = o.xor(z2, z12);
    let t51 = o.xor(z2, z5);
    let t52 = o.xor(z7, z8);
    let t53 = o.xor(z0, z3);
    let t54 = o.xor(z6, z7);
    let t55 = o.xor(z16, z17);
    let t56 = o.xor(z12, t48);
    let t57 = o.xor(t50, t53);
    let t58 = o.xor(z4, t46);
    let t59 = o.xor(z3, t54);
    let t60 = o.xor(t46, t57);
    let t61 = o.xor(z14, t57);
    let t62 = o.xor(t52, t58);
    let t63 = o.xor(t49, t58);
    let t64 = o.xor(z4, t59);
    let t65 = o.xor(t61, t62);
    let t66 = o.xor(z1, t63);
    let s0 = o.xor(t59, t63);
    let s6 = o.xnor(t56, t62);
    let s7 = o.xnor(t48, t60);
    let t67 = o.xor(t64, t65);
    let s3 = o.xor(t53, t66);
    let s4 = o.xor(t51, t66);
    let s5 = o.xor(t47, t65);
    let s1 = o.xnor(t64, s3);
    let s2 = o.xnor(t55, t67);
    [s0, s1, s2, s3, s4, s5, s6, s7]
}

/// Cleartext S-box of one byte, computed by the straight-line program (constant time).
pub(crate) fn sbox_byte(x: u8) -> u8 {
    let u: [bool; 8] = core::array::from_fn(|i| (x >> (7 - i)) & 1 == 1);
    let s = sbox(&mut Clear, u);
    s.iter().fold(0u8, |acc, &b| (acc << 1) | u8::from(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reference S-box from its definition: multiplicative inverse in GF(2⁸), then the affine map.
    fn reference(x: u8) -> u8 {
        fn mul(mut a: u8, mut b: u8) -> u8 {
            let mut p = 0u8;
            while b != 0 {
                if b & 1 == 1 {
                    p ^= a;
                }
                let hi = a & 0x80;
                a <<= 1;
                if hi != 0 {
                    a ^= 0x1b;
                }
                b >>= 1;
            }
            p
        }
        let inv = (1..=255u8).find(|&y| mul(x, y) == 1).unwrap_or(0);
        inv ^ inv.rotate_left(1)
            ^ inv.rotate_left(2)
            ^ inv.rotate_left(3)
            ^ inv.rotate_left(4)
            ^ 0x63
    }

    #[test]
    fn matches_fips197_on_all_inputs() {
        assert_eq!(sbox_byte(0x00), 0x63);
        assert_eq!(sbox_byte(0x53), 0xed);
        for x in 0..=255u8 {
            assert_eq!(sbox_byte(x), reference(x), "S({x:#04x})");
        }
    }

    #[test]
    fn gate_counts_are_the_published_ones() {
        #[derive(Default)]
        struct Count {
            and: usize,
            xor: usize,
        }
        impl BitOps for Count {
            type W = ();
            fn xor(&mut self, _: (), _: ()) {
                self.xor += 1;
            }
            fn xnor(&mut self, _: (), _: ()) {
                self.xor += 1;
            }
            fn and(&mut self, _: (), _: ()) {
                self.and += 1;
            }
        }
        let mut c = Count::default();
        sbox(&mut c, [(); 8]);
        assert_eq!((c.and, c.xor), (32, 83));
    }
}
