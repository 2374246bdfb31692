//! The heap the C libraries hold: OpenSSL's and AWS-LC's allocations routed through counting
//! functions (`CRYPTO_set_mem_functions`), so that tests and the memory benchmark see the bytes
//! a TLS session keeps inside them (Rust's allocator never sees those).
//!
//! [`route`] must run before either library allocates anything (both refuse afterwards), so a
//! test that uses it lives in a binary of its own. Each block is counted with its 16-byte size
//! header, about what `malloc` itself adds.

use std::alloc::{GlobalAlloc, Layout, System};
use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::OnceLock;

/// Live bytes of counted blocks.
static LIVE: AtomicI64 = AtomicI64::new(0);
/// Which new blocks count (e.g. those allocated on a measured thread).
static COUNTS: OnceLock<fn() -> bool> = OnceLock::new();

/// In front of each block: its size, then whether it counts.
const HEADER: usize = 16;

/// Routes OpenSSL's and AWS-LC's allocations through the counting functions; a block counts
/// when `counts()` says so on the thread that allocates it. Errors if either library had
/// allocated already, or if called twice.
pub fn route(counts: fn() -> bool) -> Result<(), String> {
    COUNTS
        .set(counts)
        .map_err(|_| "the C allocators are routed already".to_string())?;
    // SAFETY: the three functions form one allocator (blocks from `c_malloc` are only resized
    // and freed by the other two) and stay valid for the whole process.
    let openssl = unsafe { CRYPTO_set_mem_functions(c_malloc, c_realloc, c_free) };
    let aws_lc = unsafe {
        aws_lc_sys::CRYPTO_set_mem_functions(Some(c_malloc), Some(c_realloc), Some(c_free))
    };
    if openssl != 1 || aws_lc != 1 {
        return Err(format!(
            "could not route the C allocators (OpenSSL {openssl}, AWS-LC {aws_lc}): one allocated first"
        ));
    }
    Ok(())
}

/// Live bytes of the counted C blocks.
pub fn live() -> i64 {
    LIVE.load(Ordering::SeqCst)
}

fn layout(size: usize) -> Option<Layout> {
    Layout::from_size_align(size.checked_add(HEADER)?, HEADER).ok()
}

type CMalloc = unsafe extern "C" fn(usize, *const c_char, c_int) -> *mut c_void;
type CRealloc = unsafe extern "C" fn(*mut c_void, usize, *const c_char, c_int) -> *mut c_void;
type CFree = unsafe extern "C" fn(*mut c_void, *const c_char, c_int);

extern "C" {
    // OpenSSL 3 (crypto.h), not bound by openssl-sys; linked through the `openssl` crate.
    fn CRYPTO_set_mem_functions(m: CMalloc, r: CRealloc, f: CFree) -> c_int;
}

unsafe extern "C" fn c_malloc(size: usize, _file: *const c_char, _line: c_int) -> *mut c_void {
    let Some(layout) = layout(size) else {
        return std::ptr::null_mut();
    };
    let counted = COUNTS.get().is_some_and(|counts| counts());
    // SAFETY: a non-zero layout (the header), freed by `c_free` with the same layout; the
    // header is written within the block before the caller's part.
    unsafe {
        let base = System.alloc(layout);
        if base.is_null() {
            return std::ptr::null_mut();
        }
        base.cast::<usize>().write(size);
        base.add(8).write(u8::from(counted));
        if counted {
            LIVE.fetch_add(layout.size() as i64, Ordering::Relaxed);
        }
        base.add(HEADER).cast()
    }
}

/// The size `c_malloc` recorded for `ptr`.
///
/// # Safety
/// `ptr` is a live block from `c_malloc`.
unsafe fn size_of_block(ptr: *mut c_void) -> usize {
    unsafe { ptr.cast::<u8>().sub(HEADER).cast::<usize>().read() }
}

unsafe extern "C" fn c_free(ptr: *mut c_void, _file: *const c_char, _line: c_int) {
    if ptr.is_null() {
        return;
    }
    // SAFETY: `ptr` came from `c_malloc`: its header is in front of it.
    unsafe {
        let base = ptr.cast::<u8>().sub(HEADER);
        let Some(layout) = layout(size_of_block(ptr)) else {
            return;
        };
        if base.add(8).read() == 1 {
            LIVE.fetch_sub(layout.size() as i64, Ordering::Relaxed);
        }
        System.dealloc(base, layout);
    }
}

unsafe extern "C" fn c_realloc(
    ptr: *mut c_void,
    size: usize,
    file: *const c_char,
    line: c_int,
) -> *mut c_void {
    // SAFETY: `ptr` is null or came from `c_malloc`; the copy stays within both blocks.
    unsafe {
        if ptr.is_null() {
            return c_malloc(size, file, line);
        }
        if size == 0 {
            c_free(ptr, file, line);
            return std::ptr::null_mut();
        }
        let new = c_malloc(size, file, line);
        if !new.is_null() {
            let old = size_of_block(ptr);
            std::ptr::copy_nonoverlapping(ptr.cast::<u8>(), new.cast::<u8>(), old.min(size));
            c_free(ptr, file, line);
        }
        new
    }
}
