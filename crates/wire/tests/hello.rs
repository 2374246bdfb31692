//! ClientHello / ServerHello parsing against RFC 8448 §3 bytes, plus malformed variants.

use mbx_wire::hello::extension_type as ext;
use mbx_wire::{ClientHello, ContentType, HandshakeType, RecordHeader, ServerHello, WireError};

fn unhex(s: &str) -> Vec<u8> {
    let s: String = s.split_whitespace().collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// RFC 8448 §3 "Simple 1-RTT Handshake": {client} construct a ClientHello handshake message,
/// ClientHello (196 octets).
const RFC8448_CLIENT_HELLO: &str = "
    01 00 00 c0 03 03 cb 34 ec b1 e7 81 63 ba 1c 38 c6 da cb 19 6a 6d ff a2
    1a 8d 99 12 ec 18 a2 ef 62 83 02 4d ec e7 00 00 06 13 01 13 03 13 02 01
    00 00 91 00 00 00 0b 00 09 00 00 06 73 65 72 76 65 72 ff 01 00 01 00 00
    0a 00 14 00 12 00 1d 00 17 00 18 00 19 01 00 01 01 01 02 01 03 01 04 00
    23 00 00 00 33 00 26 00 24 00 1d 00 20 99 38 1d e5 60 e4 bd 43 d2 3d 8e
    43 5a 7d ba fe b3 c0 6e 51 c1 3c ae 4d 54 13 69 1e 52 9a af 2c 00 2b 00
    03 02 03 04 00 0d 00 20 00 1e 04 03 05 03 06 03 02 03 08 04 08 05 08 06
    04 01 05 01 06 01 02 01 04 02 05 02 06 02 02 02 00 2d 00 02 01 01 00 1c
    00 02 40 01";

/// RFC 8448 §3: {server} send handshake record, complete record (95 octets): the ServerHello.
const RFC8448_SERVER_HELLO_RECORD: &str = "
    16 03 03 00 5a 02 00 00 56 03 03 a6 af 06 a4 12 18 60 dc 5e 6e 60 24 9c
    d3 4c 95 93 0c 8a c5 cb 14 34 da c1 55 77 2e d3 e2 69 28 00 13 01 00 00
    2e 00 33 00 24 00 1d 00 20 c9 82 88 76 11 20 95 fe 66 76 2b db f7 c6 72
    e1 56 d6 cc 25 3b 83 3d f1 dd 69 b1 b0 4e 75 1f 0f 00 2b 00 02 03 04";

#[test]
fn rfc8448_client_hello() {
    let raw = unhex(RFC8448_CLIENT_HELLO);
    assert_eq!(raw.len(), 196);
    let ch = ClientHello::parse_message(&raw).unwrap();
    assert_eq!(ch.legacy_version, 0x0303);
    assert_eq!(&ch.random[..4], &[0xcb, 0x34, 0xec, 0xb1]);
    assert!(ch.session_id.is_empty());
    assert_eq!(ch.cipher_suites, vec![0x1301, 0x1303, 0x1302]);
    assert_eq!(ch.compression_methods, &[0]);
    let types: Vec<u16> = ch.extensions.iter().map(|e| e.typ).collect();
    assert_eq!(types, vec![0, 0xff01, 10, 35, 51, 43, 13, 45, 28]);
    assert_eq!(ch.server_name().unwrap(), Some("server"));
    assert_eq!(ch.supported_versions().unwrap(), Some(vec![0x0304]));
    assert_eq!(
        ch.extension(ext::PSK_KEY_EXCHANGE_MODES),
        Some(&[1u8, 1][..])
    );
    assert_eq!(ch.extension(ext::EARLY_DATA), None);
    assert_eq!(ch.alpn_protocols().unwrap(), None);
}

#[test]
fn rfc8448_server_hello() {
    let rec = unhex(RFC8448_SERVER_HELLO_RECORD);
    let h = RecordHeader::parse(&rec).unwrap();
    assert_eq!(h.content_type, ContentType::HANDSHAKE);
    assert_eq!(usize::from(h.length), rec.len() - 5);
    let sh = ServerHello::parse_message(&rec[5..]).unwrap();
    assert_eq!(sh.legacy_version, 0x0303);
    assert_eq!(sh.cipher_suite, 0x1301);
    assert_eq!(sh.compression_method, 0);
    assert_eq!(sh.supported_versions().unwrap(), Some(0x0304));
    assert_eq!(sh.selected_version().unwrap(), 0x0304);
    assert!(!sh.is_hello_retry_request());
    assert_eq!(sh.extension(ext::KEY_SHARE).map(|d| d.len()), Some(36));
}

#[test]
fn wrong_message_type_is_rejected() {
    let rec = unhex(RFC8448_SERVER_HELLO_RECORD);
    assert_eq!(
        ClientHello::parse_message(&rec[5..]),
        Err(WireError::UnexpectedMessage {
            expected: HandshakeType::CLIENT_HELLO.0,
            got: 2
        })
    );
}

/// Build a ClientHello body from parts, so each malformation is exactly one change.
fn ch_body(suites: &[u8], exts: Option<&[u8]>, trailing: &[u8]) -> Vec<u8> {
    let mut b = vec![3, 3];
    b.extend([7u8; 32]);
    b.push(0); // session id
    b.extend((suites.len() as u16).to_be_bytes());
    b.extend(suites);
    b.extend([1, 0]); // compression: null
    if let Some(e) = exts {
        b.extend((e.len() as u16).to_be_bytes());
        b.extend(e);
    }
    b.extend(trailing);
    b
}

#[test]
fn client_hello_structure_checks() {
    let sni = [0, 0, 0, 6, 0, 4, 0, 0, 1, b'a'];
    // baseline parses
    let ok = ch_body(&[0x13, 0x01], Some(&sni), &[]);
    assert_eq!(
        ClientHello::parse(&ok).unwrap().server_name().unwrap(),
        Some("a")
    );
    // no extensions at all is legal (pre-1.2 style)
    assert!(ClientHello::parse(&ch_body(&[0x13, 0x01], None, &[]))
        .unwrap()
        .extensions
        .is_empty());
    // duplicate extension
    let mut dup = sni.to_vec();
    dup.extend(sni);
    assert_eq!(
        ClientHello::parse(&ch_body(&[0x13, 0x01], Some(&dup), &[])),
        Err(WireError::DuplicateExtension(0))
    );
    // trailing bytes after the extensions block
    assert_eq!(
        ClientHello::parse(&ch_body(&[0x13, 0x01], Some(&sni), &[0])),
        Err(WireError::TrailingBytes(1))
    );
    // an extension whose length overruns the block
    let overrun = [0, 0, 0, 9, 0, 4, 0, 0, 1, b'a'];
    assert!(matches!(
        ClientHello::parse(&ch_body(&[0x13, 0x01], Some(&overrun), &[])),
        Err(WireError::Truncated { .. })
    ));
    // odd cipher_suites length, empty cipher_suites
    assert_eq!(
        ClientHello::parse(&ch_body(&[0x13], Some(&sni), &[])),
        Err(WireError::Malformed("cipher_suites length"))
    );
    assert_eq!(
        ClientHello::parse(&ch_body(&[], Some(&sni), &[])),
        Err(WireError::Malformed("cipher_suites length"))
    );
    // truncated anywhere: never Ok, never panics
    // (except exactly before the extensions block, which is the legal no-extensions form)
    let no_ext_len = ok.len() - 2 - sni.len();
    for cut in (0..ok.len()).filter(|c| *c != no_ext_len) {
        assert!(ClientHello::parse(&ok[..cut]).is_err(), "cut at {cut}");
    }
}

#[test]
fn server_name_and_versions_checks() {
    // SNI list that overruns its extension
    let bad_sni = [0, 0, 0, 5, 0, 9, 0, 0, 1];
    let ch = ch_body(&[0x13, 0x01], Some(&bad_sni), &[]);
    let ch = ClientHello::parse(&ch).unwrap();
    assert!(ch.server_name().is_err());
    // non-ASCII host name
    let utf = [0, 0, 0, 7, 0, 5, 0, 0, 2, 0xc3, 0xa9];
    let ch = ch_body(&[0x13, 0x01], Some(&utf), &[]);
    assert_eq!(
        ClientHello::parse(&ch).unwrap().server_name(),
        Err(WireError::Malformed("host_name"))
    );
    // supported_versions with odd length
    let sv = [0, 43, 0, 4, 3, 3, 4, 0];
    let ch = ch_body(&[0x13, 0x01], Some(&sv), &[]);
    assert_eq!(
        ClientHello::parse(&ch).unwrap().supported_versions(),
        Err(WireError::Malformed("supported_versions length"))
    );
}

#[test]
fn server_hello_checks() {
    let mut body = vec![3, 3];
    body.extend([1u8; 32]);
    body.extend([0, 0xc0, 0x2f, 0]);
    // TLS 1.2 style: no extensions -> legacy_version is the version
    let sh = ServerHello::parse(&body).unwrap();
    assert_eq!(sh.selected_version().unwrap(), 0x0303);
    // supported_versions must be exactly one u16
    let mut bad = body.clone();
    bad.extend([0, 7, 0, 43, 0, 3, 3, 4, 0]);
    let sh = ServerHello::parse(&bad).unwrap();
    assert_eq!(sh.selected_version(), Err(WireError::TrailingBytes(1)));
    // duplicate extensions
    let mut dup = body.clone();
    dup.extend([0, 12, 0, 43, 0, 2, 3, 4, 0, 43, 0, 2, 3, 4]);
    assert_eq!(
        ServerHello::parse(&dup),
        Err(WireError::DuplicateExtension(43))
    );
    // HelloRetryRequest detection
    let mut hrr = body.clone();
    hrr[2..34].copy_from_slice(&mbx_wire::hello::HELLO_RETRY_REQUEST_RANDOM);
    assert!(ServerHello::parse(&hrr).unwrap().is_hello_retry_request());
}

#[test]
fn session_id_and_compression_limits() {
    let mut body = vec![3, 3];
    body.extend([7u8; 32]);
    body.push(33);
    body.extend([0u8; 33]);
    body.extend([0, 2, 0x13, 0x01, 1, 0]);
    assert_eq!(
        ClientHello::parse(&body),
        Err(WireError::Malformed("session_id longer than 32 bytes"))
    );
    // 32 bytes is the maximum that is allowed
    let mut ok = vec![3, 3];
    ok.extend([7u8; 32]);
    ok.push(32);
    ok.extend([0u8; 32]);
    ok.extend([0, 2, 0x13, 0x01, 1, 0]);
    assert_eq!(ClientHello::parse(&ok).unwrap().session_id.len(), 32);
    // no compression method at all
    let mut nocomp = ok.clone();
    nocomp.truncate(nocomp.len() - 2);
    nocomp.push(0);
    assert_eq!(
        ClientHello::parse(&nocomp),
        Err(WireError::Malformed("empty compression_methods"))
    );
    // ServerHello session id over 32
    let mut sh = vec![3, 3];
    sh.extend([1u8; 32]);
    sh.push(33);
    sh.extend([0u8; 33]);
    sh.extend([0x13, 0x01, 0]);
    assert_eq!(
        ServerHello::parse(&sh),
        Err(WireError::Malformed("session_id longer than 32 bytes"))
    );
}

#[test]
fn server_name_list_rules() {
    // two host_name entries: list = [0,0,1,'a'] ++ [0,0,2,'b','c'] (9 bytes), data = 2 + 9
    let mut dup = vec![0, 0, 0, 11, 0, 9];
    dup.extend([0, 0, 1, b'a', 0, 0, 2, b'b', b'c']);
    let ch = ch_body(&[0x13, 0x01], Some(&dup), &[]);
    assert_eq!(
        ClientHello::parse(&ch).unwrap().server_name(),
        Err(WireError::Malformed("two host_name entries"))
    );
    // empty server_name_list
    let empty = [0, 0, 0, 2, 0, 0];
    let ch = ch_body(&[0x13, 0x01], Some(&empty), &[]);
    assert_eq!(
        ClientHello::parse(&ch).unwrap().server_name(),
        Err(WireError::Malformed("empty server_name_list"))
    );
    // an entry of another name type only: no host name, not an error
    let other = [0, 0, 0, 6, 0, 4, 7, 0, 1, b'x'];
    let ch = ch_body(&[0x13, 0x01], Some(&other), &[]);
    assert_eq!(ClientHello::parse(&ch).unwrap().server_name(), Ok(None));
}

#[test]
fn alpn_rules() {
    // "h2", "http/1.1"
    let mut alpn = vec![0, 16, 0, 14, 0, 12, 2, b'h', b'2', 8];
    alpn.extend(b"http/1.1");
    let ch = ch_body(&[0x13, 0x01], Some(&alpn), &[]);
    assert_eq!(
        ClientHello::parse(&ch).unwrap().alpn_protocols().unwrap(),
        Some(vec![&b"h2"[..], &b"http/1.1"[..]])
    );
    let empty_name = [0, 16, 0, 3, 0, 1, 0];
    let ch = ch_body(&[0x13, 0x01], Some(&empty_name), &[]);
    assert_eq!(
        ClientHello::parse(&ch).unwrap().alpn_protocols(),
        Err(WireError::Malformed("empty ALPN protocol name"))
    );
    let empty_list = [0, 16, 0, 2, 0, 0];
    let ch = ch_body(&[0x13, 0x01], Some(&empty_list), &[]);
    assert_eq!(
        ClientHello::parse(&ch).unwrap().alpn_protocols(),
        Err(WireError::Malformed("empty ALPN list"))
    );
}
