//! Property tests: parsers never panic; deframing does not depend on how bytes are split.

use mbx_wire::record::encode_record;
use mbx_wire::{
    ClientHello, ContentType, DeframerConfig, HandshakeDeframer, Reader, RecordReader, ServerHello,
};
use proptest::prelude::*;

proptest! {
    #[test]
    fn hello_parsers_never_panic(data in proptest::collection::vec(any::<u8>(), 0..600)) {
        if let Ok(ch) = ClientHello::parse(&data) {
            let _ = ch.server_name();
            let _ = ch.supported_versions();
            let _ = ch.alpn_protocols();
        }
        if let Ok(sh) = ServerHello::parse(&data) {
            let _ = sh.selected_version();
        }
        let _ = ClientHello::parse_message(&data);
        let _ = ServerHello::parse_message(&data);
    }

    #[test]
    fn reader_never_panics(data in proptest::collection::vec(any::<u8>(), 0..64),
                           ops in proptest::collection::vec(0u8..9, 0..32)) {
        let mut r = Reader::new(&data);
        for op in ops {
            let _ = match op {
                0 => r.u8().map(|_| ()),
                1 => r.u16().map(|_| ()),
                2 => r.u24().map(|_| ()),
                3 => r.u32().map(|_| ()),
                4 => r.vec_u8().map(|_| ()),
                5 => r.vec_u16().map(|_| ()),
                6 => r.vec_u24().map(|_| ()),
                7 => r.take(5).map(|_| ()),
                _ => r.finish(),
            };
            prop_assert!(r.position() <= data.len());
        }
    }

    #[test]
    fn deframer_never_panics(data in proptest::collection::vec(any::<u8>(), 0..400)) {
        let mut rr = RecordReader::new(DeframerConfig::tls13());
        rr.push(&data);
        while let Ok(Some(_)) = rr.next_record() {}
        let mut hd = HandshakeDeframer::new(300);
        hd.push(&data);
        while let Ok(Some(_)) = hd.next_message() {}
    }

    /// Records come out identical whatever the chunking of the stream.
    #[test]
    fn deframer_split_invariance(
        records in proptest::collection::vec(
            (20u8..=24, proptest::collection::vec(any::<u8>(), 1..300)), 1..8),
        cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..20),
    ) {
        let mut stream = Vec::new();
        for (ct, payload) in &records {
            encode_record(ContentType(*ct), 0x0303, payload, &mut stream).unwrap();
        }
        let mut points: Vec<usize> = cuts.iter().map(|i| i.index(stream.len() + 1)).collect();
        points.push(0);
        points.push(stream.len());
        points.sort_unstable();
        let mut rr = RecordReader::new(DeframerConfig::tls12());
        let mut got = Vec::new();
        for w in points.windows(2) {
            rr.push(&stream[w[0]..w[1]]);
            while let Some(r) = rr.next_record().unwrap() {
                got.push((r.content_type().0, r.payload().to_vec()));
            }
        }
        prop_assert_eq!(got, records);
        prop_assert_eq!(rr.buffered(), 0);
    }
}
