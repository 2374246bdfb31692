//! Key material that crossed the secondary-session wire code leaves no copy of a secret in this
//! process's memory once the messages holding it are dropped: not in the encoder's buffer, not
//! in the allocations a reader outgrew while the message arrived in pieces. (One test per
//! binary: the scan sees the whole process.)

use mbx_mbtls::keys::{DirectionKeys, HopKeys, TrafficSecret};
use mbx_mbtls::wire::{KeyMaterial, SecondaryMessage, SecondaryReader};
use mbx_record::{wipe, CipherSuite, TlsVersion};
use mbx_testbed::residue::{Masked, Scanner};

#[test]
fn key_material_leaves_no_copy_behind() {
    let mut scan = Scanner::new();
    let marker = Masked::fresh(48);
    let suite = CipherSuite::TLS13_AES_256_GCM_SHA384;
    let km = {
        // One direction's traffic secret is the marker; the others are fresh random secrets.
        let mut secret = vec![0u8; 48];
        marker.unmask_into(&mut secret, 0);
        let mut hop = HopKeys::generate(TlsVersion::Tls13, &suite, 0, 0).unwrap();
        hop.c2s =
            DirectionKeys::from_secret(TrafficSecret::new(suite, &secret).unwrap(), 0).unwrap();
        wipe::wipe_vec(&mut secret);
        KeyMaterial {
            version: TlsVersion::Tls13,
            suite,
            toward_client: HopKeys::generate(TlsVersion::Tls13, &suite, 0, 0).unwrap(),
            toward_server: hop,
        }
    };
    let bytes = SecondaryMessage::KeyMaterial(Box::new(km))
        .encode()
        .unwrap();
    // Arrives in small pieces: the reader's buffer grows several times with keys in it.
    let mut reader = SecondaryReader::new();
    for piece in bytes.chunks(7) {
        reader.push(piece);
    }
    drop(bytes);
    let Some(SecondaryMessage::KeyMaterial(got)) = reader.next_message().unwrap() else {
        panic!("no key material");
    };
    let mut check = vec![0u8; 48];
    marker.unmask_into(&mut check, 0);
    let secret = got.toward_server.c2s.secret.as_ref().unwrap();
    assert_eq!(secret.as_bytes(), &check[..]);
    wipe::wipe_vec(&mut check);
    drop((got, reader));
    assert_eq!(scan.find(&marker).unwrap(), Vec::<usize>::new());
}
