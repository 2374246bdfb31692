//! Plaintext an engine received leaves no copy in this process's memory once the application
//! has taken (and wiped) it: not in OpenSSL's record buffers, not in the engine's scratch
//! buffer, not in allocations freed while its plaintext buffer grew. This is what keeps an
//! mbTLS middlebox's key material, which arrives as application data of its secondary session,
//! from outliving the session. (One test per binary: the scan sees the whole process.)

mod common;

use common::{no_copy, ossl, pump, split_records, Pki};
use mbx_engine::{OpenSslEngine, TlsEngine};
use mbx_record::{wipe, TlsVersion};
use mbx_testbed::residue::{Masked, Scanner};

/// Where the marker goes in the message: in the first record and in the second (whose arrival
/// grows the receiver's plaintext buffer).
const AT: [usize; 2] = [5_000, 18_000];
const LEN: usize = 20_000;

/// A connected pair of `version` whose client has received `LEN` bytes holding the marker
/// twice, record by record (the plaintext buffer grows between two calls); the message is
/// wiped on the way.
fn delivered(pki: &Pki, version: TlsVersion, marker: &Masked) -> (OpenSslEngine, OpenSslEngine) {
    let mut c = ossl(&pki.client_config().only(version));
    let mut s = ossl(&pki.server_config().only(version));
    pump(&mut c, &mut s).unwrap();
    let mut msg = vec![0x20u8; LEN];
    for at in AT {
        marker.unmask_into(&mut msg, at);
    }
    s.write_plaintext(&msg).unwrap();
    wipe::wipe_vec(&mut msg);
    for record in split_records(&s.take_outgoing()) {
        c.feed(&record);
        c.process().unwrap();
    }
    (c, s)
}

#[test]
fn received_plaintext_leaves_no_copy_behind() {
    let pki = Pki::new();
    let mut scan = Scanner::new();
    for version in [TlsVersion::Tls13, TlsVersion::Tls12] {
        // Taken and wiped by the application.
        let marker = Masked::fresh(32);
        let (mut c, s) = delivered(&pki, version, &marker);
        let mut got = c.take_plaintext();
        assert_eq!(got.len(), LEN);
        let mut check = vec![0u8; 32];
        marker.unmask_into(&mut check, 0);
        assert!(
            AT.iter().all(|&at| got[at..at + 32] == check[..]),
            "{version:?}"
        );
        wipe::wipe_vec(&mut check);
        wipe::wipe_vec(&mut got);
        no_copy(
            &mut scan,
            &marker,
            &format!("{version:?}: while the engines live"),
        );
        drop((c, s));
        no_copy(
            &mut scan,
            &marker,
            &format!("{version:?}: after the engines are gone"),
        );

        // Never taken: the engine wipes it when dropped.
        let marker = Masked::fresh(32);
        let (c, s) = delivered(&pki, version, &marker);
        drop((c, s));
        no_copy(
            &mut scan,
            &marker,
            &format!("{version:?}: untaken plaintext after the engines are gone"),
        );
    }
}
