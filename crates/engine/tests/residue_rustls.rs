//! The rustls engine as the mbTLS endpoint uses it, a secondary session's client: what it
//! sends (the key material) leaves no copy in this process's memory once the engines are gone
//! and the receiver wiped what it took. What it receives does: rustls decrypts in its own
//! buffers and frees them unwiped (docs/foundation.md, "Received plaintext is wiped"), which
//! is why the endpoint receives only evidence and refusals through it, and a middlebox its key
//! material through OpenSSL. (One test per binary: the scan sees the whole process.)

mod common;

use common::{no_copy, ossl, pump, split_records, Pki};
use mbx_engine::{RustlsEngine, TlsEngine};
use mbx_record::{wipe, TlsVersion};
use mbx_testbed::residue::{Masked, Scanner};

const LEN: usize = 600;
const AT: usize = 100;

/// `LEN` bytes holding the marker at `AT`.
fn message(marker: &Masked) -> Vec<u8> {
    let mut msg = vec![0x20u8; LEN];
    marker.unmask_into(&mut msg, AT);
    msg
}

#[test]
fn the_rustls_engine_leaves_no_copy_of_what_it_sent() {
    let pki = Pki::new();
    let mut scan = Scanner::new();
    for version in [TlsVersion::Tls13, TlsVersion::Tls12] {
        // Received, as a control: the scan finds rustls's copies (so it would find ours).
        for rustls_sends in [true, false] {
            let what = format!("{version:?}, rustls sends: {rustls_sends}");
            let marker = Masked::fresh(32);
            let mut c = RustlsEngine::new(&pki.client_config().only(version)).unwrap();
            let mut s = ossl(&pki.server_config().only(version));
            pump(&mut c, &mut s).unwrap();
            let (from, to): (&mut dyn TlsEngine, &mut dyn TlsEngine) = if rustls_sends {
                (&mut c, &mut s)
            } else {
                (&mut s, &mut c)
            };
            let mut msg = message(&marker);
            from.write_plaintext(&msg).unwrap();
            wipe::wipe_vec(&mut msg);
            for record in split_records(&from.take_outgoing()) {
                to.feed(&record);
                to.process().unwrap();
            }
            let mut got = to.take_plaintext();
            assert_eq!(got.len(), LEN, "{what}");
            wipe::wipe_vec(&mut got);
            drop((c, s));
            if rustls_sends {
                no_copy(&mut scan, &marker, &what);
            } else {
                assert!(!scan.find(&marker).unwrap().is_empty(), "{what}");
            }
        }
    }
}
