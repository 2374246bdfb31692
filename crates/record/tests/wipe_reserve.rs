//! `wipe::reserve` leaves no copy of a buffer's bytes in the memory it frees when the buffer
//! must move. glibc often grows a buffer in place, so a test under the system allocator may
//! never see a move; this test binary's allocator never grows in place (the default
//! `GlobalAlloc::realloc`: allocate, copy, free) and looks into every block it frees for a
//! marker.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use mbx_record::wipe;

/// Counts freed blocks that still hold the marker, while armed.
struct Inspecting;

static ARMED: AtomicBool = AtomicBool::new(false);
static MARKER: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];
static FREED_WITH_MARKER: AtomicUsize = AtomicUsize::new(0);

fn marker() -> [u8; 16] {
    let mut m = [0u8; 16];
    m[..8].copy_from_slice(&MARKER[0].load(Ordering::SeqCst).to_le_bytes());
    m[8..].copy_from_slice(&MARKER[1].load(Ordering::SeqCst).to_le_bytes());
    m
}

// SAFETY: every call is passed on unchanged to the system allocator; `dealloc` only reads the
// block it is given, which is still allocated and `layout.size()` bytes long at that point.
unsafe impl GlobalAlloc for Inspecting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if ARMED.load(Ordering::SeqCst) && layout.size() >= 16 {
            let block = unsafe { std::slice::from_raw_parts(ptr, layout.size()) };
            let m = marker();
            if block.windows(16).any(|w| w == m) {
                FREED_WITH_MARKER.fetch_add(1, Ordering::SeqCst);
            }
        }
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Inspecting = Inspecting;

/// One test, so that no other test thread frees blocks while the scan is armed.
#[test]
fn reserve_wipes_the_allocation_it_leaves() {
    // A marker made at run time (never a literal in the binary), from the std hasher's seed.
    use std::hash::{BuildHasher, RandomState};
    let seed = RandomState::new().hash_one(0x6d62_7821u32);
    MARKER[0].store(seed, Ordering::SeqCst);
    MARKER[1].store(!seed.rotate_left(17), Ordering::SeqCst);
    let m = marker();

    // Control: `Vec::reserve` moves the bytes and frees the old block with them in it, so
    // the inspection does see a copy left behind.
    let mut plain: Vec<u8> = Vec::with_capacity(32);
    plain.extend_from_slice(&m);
    ARMED.store(true, Ordering::SeqCst);
    plain.reserve(4096);
    ARMED.store(false, Ordering::SeqCst);
    assert_eq!(
        FREED_WITH_MARKER.swap(0, Ordering::SeqCst),
        1,
        "the control should leave exactly one copy in freed memory"
    );
    wipe::wipe_vec(&mut plain);

    // `wipe::reserve`: the bytes move, and the old block is wiped before it is freed.
    let mut secret: Vec<u8> = Vec::with_capacity(32);
    secret.extend_from_slice(&m);
    let before = secret.as_ptr();
    ARMED.store(true, Ordering::SeqCst);
    wipe::reserve(&mut secret, 4096);
    for _ in 0..4 {
        // Several growths in a row, each a move.
        let extra = secret.capacity() - secret.len() + 1;
        wipe::reserve(&mut secret, extra);
    }
    ARMED.store(false, Ordering::SeqCst);
    assert_ne!(secret.as_ptr(), before, "the buffer did not move");
    assert_eq!(&secret[..16], &m, "the bytes moved intact");
    assert_eq!(FREED_WITH_MARKER.load(Ordering::SeqCst), 0);

    // Room enough already: nothing moves.
    let at = secret.as_ptr();
    wipe::reserve(&mut secret, 1);
    assert_eq!(secret.as_ptr(), at);
    wipe::wipe_vec(&mut secret);
}
