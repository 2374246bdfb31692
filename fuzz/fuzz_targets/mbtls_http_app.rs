//! The header-inserting HTTP proxy app on arbitrary bytes, cut where the input says, each piece
//! going the way the input says (requests and responses interleaved, as a protocol switch
//! needs both): it never panics, and letting pieces through unchanged where it accepts them
//! (`pass_unchanged`, the relay's copy-free path) forwards exactly what `on_data` alone does.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mbx_apps::{Direction, HttpHeaderInsert, MiddleboxApp, Verdict};

fuzz_target!(|data: &[u8]| {
    let Some((&control, stream)) = data.split_first() else {
        return;
    };
    let new = || HttpHeaderInsert::new("X-Mbtls", "fuzz").expect("valid header");
    let (mut offered, mut plain) = (new(), new());
    let mut outs_offered = [Vec::new(), Vec::new()];
    let mut outs_plain = [Vec::new(), Vec::new()];
    // Piece sizes and directions from the stream's own bytes: small and large pieces, runs
    // of one direction and alternations all occur.
    let mut rest = stream;
    let mut i = 0usize;
    while !rest.is_empty() {
        let pick = rest[i % rest.len()];
        let size = usize::from(pick) * usize::from(control >> 1 | 1) % 700 + 1;
        let (piece, tail) = rest.split_at(size.min(rest.len()));
        rest = tail;
        i += 1;
        let side = usize::from((control & 1 == 1) ^ (pick & 0x80 != 0));
        let dir = [Direction::ClientToServer, Direction::ServerToClient][side];
        let v_offered = match offered.pass_unchanged(dir, piece) {
            Some(v) => {
                if v == Verdict::Continue {
                    outs_offered[side].extend_from_slice(piece);
                }
                v
            }
            None => offered.on_data(dir, piece, &mut outs_offered[side]),
        };
        let v_plain = plain.on_data(dir, piece, &mut outs_plain[side]);
        assert_eq!(v_offered, v_plain);
        if v_plain != Verdict::Continue {
            return;
        }
    }
    for (side, dir) in [Direction::ClientToServer, Direction::ServerToClient]
        .into_iter()
        .enumerate()
    {
        assert_eq!(
            offered.on_end(dir, &mut outs_offered[side]),
            plain.on_end(dir, &mut outs_plain[side])
        );
    }
    assert_eq!(outs_offered, outs_plain);
    assert_eq!(offered.requests(), plain.requests());
});
