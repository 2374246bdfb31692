//! Echo round trips through an mbTLS client session, for the driver tests.

use std::time::Duration;

use mbx_mbtls::driver::MbtlsClient;
use tokio::time::timeout;

/// Upper bound for one echo; only there so that a hang fails instead of blocking.
const BOUND: Duration = Duration::from_secs(60);

/// Sends `data` through the session in 64 KiB pieces and reads each echo back.
pub async fn echo_through(client: &mut MbtlsClient, data: &[u8]) {
    for piece in data.chunks(65536) {
        client.write_all(piece).await.unwrap();
        let mut got = Vec::new();
        while got.len() < piece.len() {
            let chunk = timeout(BOUND, client.read()).await.unwrap().unwrap();
            got.extend_from_slice(&chunk.expect("the server closed early"));
        }
        assert_eq!(got, piece);
    }
}
