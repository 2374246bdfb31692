//! A response body as the CLI's fetch reads it (`mbx_apps::ResponseBody`): a head from the
//! input's first line block, then the rest cut into pieces where the input says. It never
//! panics, and the data it gives (up to a fault, if any) is the same however the rest is cut.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mbx_apps::ResponseBody;

fuzz_target!(|data: &[u8]| {
    let Some((&cut, data)) = data.split_first() else {
        return;
    };
    let at = data
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or(data.len(), |p| p + 4);
    let (head, rest) = data.split_at(at);
    let Ok(mut whole) = ResponseBody::after_head(head) else {
        return;
    };
    let mut pieced = whole.clone();
    let (mut a, mut b) = (Vec::new(), Vec::new());
    let r_whole = whole.read(rest, |d| a.extend_from_slice(d));
    let (mut r_pieced, mut used) = (Ok(0), 0);
    for piece in rest.chunks(usize::from(cut) + 1) {
        r_pieced = pieced.read(piece, |d| b.extend_from_slice(d));
        used += r_pieced.as_ref().map_or(0, |n| *n);
        if r_pieced.is_err() || pieced.ended() {
            break;
        }
    }
    assert_eq!(r_whole.is_err(), r_pieced.is_err());
    // The data before a fault is given either way.
    assert_eq!(a, b);
    if let Ok(whole_used) = r_whole {
        assert_eq!(whole.ended(), pieced.ended());
        assert_eq!(whole.cut_at_close(), pieced.cut_at_close());
        // The bytes the body took (what follows its end is excess) add up however it is cut.
        assert_eq!(whole_used, used);
    }
});
