//! The header-inserting HTTP proxy app on arbitrary bytes, cut where the input says, in either
//! direction: it never panics, and letting pieces through unchanged where it accepts them
//! (`pass_unchanged`, the relay's copy-free path) forwards exactly what `on_data` alone does.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mbx_apps::{Direction, HttpHeaderInsert, MiddleboxApp, Verdict};

fuzz_target!(|data: &[u8]| {
    let Some((&control, stream)) = data.split_first() else {
        return;
    };
    let dir = if control & 1 == 0 {
        Direction::ClientToServer
    } else {
        Direction::ServerToClient
    };
    let new = || HttpHeaderInsert::new("X-Mbtls", "fuzz").expect("valid header");
    let (mut offered, mut plain) = (new(), new());
    let (mut out_offered, mut out_plain) = (Vec::new(), Vec::new());
    // Piece sizes from the stream's own bytes: small and large pieces both occur.
    let mut rest = stream;
    let mut i = 0usize;
    while !rest.is_empty() {
        let size = usize::from(rest[i % rest.len()]) * usize::from(control >> 1 | 1) % 700 + 1;
        let (piece, tail) = rest.split_at(size.min(rest.len()));
        rest = tail;
        i += 1;
        let v_offered = match offered.pass_unchanged(dir, piece) {
            Some(v) => {
                if v == Verdict::Continue {
                    out_offered.extend_from_slice(piece);
                }
                v
            }
            None => offered.on_data(dir, piece, &mut out_offered),
        };
        let v_plain = plain.on_data(dir, piece, &mut out_plain);
        assert_eq!(v_offered, v_plain);
        if v_plain != Verdict::Continue {
            return;
        }
    }
    assert_eq!(
        offered.on_end(dir, &mut out_offered),
        plain.on_end(dir, &mut out_plain)
    );
    assert_eq!(out_offered, out_plain);
    assert_eq!(offered.requests(), plain.requests());
});
