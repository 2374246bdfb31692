//! What OpenSSL itself holds for a session, counted through `mbx_testbed::c_heap`. A binary of
//! its own: OpenSSL's allocator can only be replaced before its first allocation.

mod common;

use common::{pump, transfer, Pki, V12, V13};
use mbx_engine::OpenSslContext;
use mbx_testbed::c_heap;

/// An idle session gives OpenSSL's record buffers back (a read and a write buffer of about
/// 16.7 KB each per engine) and carries on both ways afterwards (OpenSSL allocates them
/// again), both versions.
#[test]
fn an_idle_session_gives_openssls_record_buffers_back_and_carries_on() {
    c_heap::route(|| true).unwrap();
    let pki = Pki::new();
    for version in [V12, V13] {
        let client = OpenSslContext::new(&pki.client_config().only(version)).unwrap();
        let server = OpenSslContext::new(&pki.server_config().only(version)).unwrap();
        let (mut c, mut s) = (client.engine().unwrap(), server.engine().unwrap());
        pump(&mut c, &mut s).unwrap();
        transfer(&mut c, &mut s, &[1; 40_000]);
        transfer(&mut s, &mut c, b"reply");
        let before = c_heap::live();
        assert!(c.release_idle_buffers(), "{version:?}");
        assert!(s.release_idle_buffers(), "{version:?}");
        let freed = before - c_heap::live();
        // Both buffers of both engines, with room for OpenSSL's exact sizes.
        assert!(freed >= 4 * 16_000, "{version:?}: {freed} bytes freed");
        transfer(&mut c, &mut s, &[2; 40_000]);
        transfer(&mut s, &mut c, &[3; 40_000]);
    }
}
