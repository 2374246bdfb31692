//! Open arbitrary bytes as a record under fixed keys, for every version and AEAD. Forging a
//! valid record is infeasible, so any success is a bug; failures must poison the opener.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mbx_record::{Aead, RecordOpener, TlsVersion, TrafficKeys};

fuzz_target!(|data: &[u8]| {
    for version in [TlsVersion::Tls12, TlsVersion::Tls13] {
        for aead in [Aead::Aes128Gcm, Aead::Aes256Gcm, Aead::ChaCha20Poly1305] {
            let iv_len = match version {
                TlsVersion::Tls13 => 12,
                TlsVersion::Tls12 => aead.tls12_fixed_iv_len(),
            };
            let keys = TrafficKeys::new(aead, &vec![0x11; aead.key_len()], &vec![0x22; iv_len])
                .expect("fixed keys are valid");
            let mut opener = RecordOpener::new(version, keys, 0);
            assert!(opener.open(data).is_err());
            assert!(opener.open(data).is_err());
            assert!(opener.is_poisoned());
        }
    }
});
