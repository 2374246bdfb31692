//! The crate's only `unsafe` code: OpenSSL hooks the safe `openssl` crate does not wrap.
//!
//! * `SSL_CTX_add_custom_ext` — our own ClientHello / ServerHello / EncryptedExtensions
//!   extensions (mbTLS MiddleboxSupport).
//! * `SSL_set_msg_callback` — record-header and handshake-message notifications, used to count
//!   records per key epoch so exported sequence numbers are exact.
//! * `SSL_set_max_send_fragment` (a macro over `SSL_ctrl`) — the largest plaintext per record
//!   this connection sends.
//! * `SSL_set_SSL_CTX` — moves a connection to another context (the `openssl` crate wraps it on
//!   `&mut SslRef`, which an `SslStream` does not hand out).
//! * `SSL_key_update` — schedules a TLS 1.3 KeyUpdate (not bound by `openssl-sys`).
//! * `SSL_free_buffers` — gives an idle connection's record buffers back (not bound either).
//! * `SSL_new_session_ticket` — a TLS 1.3 server's session ticket on demand (OpenSSL 3.0; not
//!   bound either).
//! * `SSL_CTX_set_tlsext_ticket_key_evp_cb` — session tickets sealed under keys the context
//!   replaces on a schedule (`ticket_keys.rs`; not bound either), with `EVP_EncryptInit_ex`,
//!   `EVP_DecryptInit_ex` and `EVP_MAC_CTX_set_params` to hand OpenSSL the keys.
//!
//! Design for memory safety: the callbacks receive no user pointer (`arg` is always null). They
//! find the per-connection state through the `SSL`'s ex_data slot, which the `openssl` crate owns
//! and frees together with the `SSL`; so no callback data can outlive or be outlived by the
//! objects it belongs to. Every callback catches panics (unwinding into C is undefined), turns
//! them into `internal_error`, and hands plain slices to safe code in the parent module.

use std::os::raw::{c_char, c_int, c_uchar, c_uint, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;

use foreign_types::ForeignTypeRef;
use libc::size_t;
use openssl::error::ErrorStack;
use openssl::ssl::{SslContextBuilder, SslContextRef, SslRef, SslSessionRef};
use openssl_sys as sys;

use crate::AlertDescription;

/// Where our extensions may appear: ClientHello, TLS 1.2 ServerHello, TLS 1.3
/// EncryptedExtensions; TLS only (not DTLS). Values from OpenSSL's `ssl.h`, as exported by
/// `openssl-sys`.
const EXT_CONTEXT: c_uint = sys::SSL_EXT_TLS_ONLY
    | sys::SSL_EXT_CLIENT_HELLO
    | sys::SSL_EXT_TLS1_2_SERVER_HELLO
    | sys::SSL_EXT_TLS1_3_ENCRYPTED_EXTENSIONS;

/// `msg_callback` pseudo content type for a record header (`ssl3.h`: `SSL3_RT_HEADER`).
pub(super) const RT_HEADER: c_int = 0x100;

type MsgCallback = unsafe extern "C" fn(
    write_p: c_int,
    version: c_int,
    content_type: c_int,
    buf: *const c_void,
    len: size_t,
    ssl: *mut sys::SSL,
    arg: *mut c_void,
);

type TicketKeyCallback = unsafe extern "C" fn(
    ssl: *mut sys::SSL,
    key_name: *mut c_uchar,
    iv: *mut c_uchar,
    cipher: *mut sys::EVP_CIPHER_CTX,
    mac: *mut sys::EVP_MAC_CTX,
    enc: c_int,
) -> c_int;

extern "C" {
    // Not bound by openssl-sys; real functions in libssl 3 (ssl.h), linked through openssl-sys.
    fn SSL_set_msg_callback(ssl: *mut sys::SSL, cb: Option<MsgCallback>);
    fn SSL_key_update(ssl: *mut sys::SSL, updatetype: c_int) -> c_int;
    fn SSL_free_buffers(ssl: *mut sys::SSL) -> c_int;
    fn SSL_new_session_ticket(ssl: *mut sys::SSL) -> c_int;
    fn SSL_CTX_set_tlsext_ticket_key_evp_cb(
        ctx: *mut sys::SSL_CTX,
        cb: Option<TicketKeyCallback>,
    ) -> c_int;
    // libcrypto 3 (params.h).
    fn OSSL_PARAM_construct_utf8_string(
        key: *const c_char,
        buf: *mut c_char,
        bsize: size_t,
    ) -> sys::OSSL_PARAM;
}

/// Length of a ticket key's name, and of the IV buffer OpenSSL hands the ticket callback
/// (`EVP_MAX_IV_LENGTH`, `evp.h`; AES-CBC uses all of it).
const TICKET_KEY_NAME_LEN: usize = 16;
const TICKET_IV_LEN: usize = 16;

/// Seals and opens this context's session tickets under the keys its connections' state
/// names ([`super::ticket_keys_of`]).
pub(super) fn set_ticket_key_callback(builder: &mut SslContextBuilder) -> bool {
    // SAFETY: `builder.as_ptr()` is the live SSL_CTX the builder owns; the callback is a
    // `'static` function and takes no user pointer.
    unsafe { SSL_CTX_set_tlsext_ticket_key_evp_cb(builder.as_ptr(), Some(ticket_key_cb)) == 1 }
}

/// Sets up OpenSSL's ticket cipher (AES-256-CBC, to seal or to open) and HMAC (SHA-256) with
/// `key` and the ticket's IV.
///
/// # Safety
/// `cipher` and `mac` must be the live contexts OpenSSL passed to the ticket callback, and `iv`
/// its buffer of `TICKET_IV_LEN` bytes holding the IV.
unsafe fn set_up_ticket_crypto(
    cipher: *mut sys::EVP_CIPHER_CTX,
    mac: *mut sys::EVP_MAC_CTX,
    key: &super::ticket_keys::TicketKey,
    iv: *const c_uchar,
    seal: bool,
) -> bool {
    let init = if seal {
        sys::EVP_EncryptInit_ex
    } else {
        sys::EVP_DecryptInit_ex
    };
    let mut digest = *b"SHA256\0";
    // SAFETY: per the contract for `cipher`, `mac` and `iv`; the key bytes and the parameter
    // array (which points at `key.hmac` and `digest`) stay alive until the calls return, and
    // OpenSSL copies what it keeps. It only reads through the octet string's pointer (`*mut`
    // is its API's). A size of 0 makes it read the NUL-terminated digest name.
    unsafe {
        if init(
            cipher,
            sys::EVP_aes_256_cbc(),
            ptr::null_mut(),
            key.aes.as_ptr(),
            iv,
        ) != 1
        {
            return false;
        }
        let params = [
            sys::OSSL_PARAM_construct_octet_string(
                c"key".as_ptr(),
                key.hmac.as_ptr().cast_mut().cast::<c_void>(),
                key.hmac.len(),
            ),
            OSSL_PARAM_construct_utf8_string(
                c"digest".as_ptr(),
                digest.as_mut_ptr().cast::<c_char>(),
                0,
            ),
            sys::OSSL_PARAM_construct_end(),
        ];
        sys::EVP_MAC_CTX_set_params(mac, params.as_ptr()) == 1
    }
}

/// `SSL_CTX_set_tlsext_ticket_key_evp_cb` callback. Sealing (`enc == 1`): writes the current
/// key's name and a fresh IV, sets up the cipher and the MAC, returns 1. Opening: 0 if the
/// named key is gone (OpenSSL then makes a full handshake), 1 under the current key, 2 under
/// the previous one (the ticket is renewed). -1 on failure.
unsafe extern "C" fn ticket_key_cb(
    ssl: *mut sys::SSL,
    key_name: *mut c_uchar,
    iv: *mut c_uchar,
    cipher: *mut sys::EVP_CIPHER_CTX,
    mac: *mut sys::EVP_MAC_CTX,
    enc: c_int,
) -> c_int {
    // SAFETY: OpenSSL calls us with the live SSL whose ticket is made or read.
    let Some(Some(keys)) = (unsafe { with_ssl(ssl, super::ticket_keys_of) }) else {
        return -1;
    };
    if key_name.is_null() || iv.is_null() || cipher.is_null() || mac.is_null() {
        return -1;
    }
    let run = || -> Option<c_int> {
        if enc == 1 {
            let key = keys.sealing_key().ok()?;
            let mut fresh_iv = [0u8; TICKET_IV_LEN];
            openssl::rand::rand_bytes(&mut fresh_iv).ok()?;
            // SAFETY: `key_name` and `iv` are OpenSSL's buffers of 16 and EVP_MAX_IV_LENGTH
            // (16) bytes, writable during the callback; `cipher` and `mac` its live contexts.
            let ok = unsafe {
                ptr::copy_nonoverlapping(key.name.as_ptr(), key_name, TICKET_KEY_NAME_LEN);
                ptr::copy_nonoverlapping(fresh_iv.as_ptr(), iv, TICKET_IV_LEN);
                set_up_ticket_crypto(cipher, mac, &key, iv, true)
            };
            ok.then_some(1)
        } else {
            // SAFETY: `key_name` holds the 16-byte name read from the ticket.
            let name = unsafe { slice(key_name, TICKET_KEY_NAME_LEN) };
            let Some((key, current)) = keys.opening_key(name).ok()? else {
                return Some(0);
            };
            // SAFETY: as above; `iv` holds the ticket's IV.
            let ok = unsafe { set_up_ticket_crypto(cipher, mac, &key, iv, false) };
            ok.then_some(if current { 1 } else { 2 })
        }
    };
    catch_unwind(AssertUnwindSafe(run))
        .ok()
        .flatten()
        .unwrap_or(-1)
}

/// Schedules one TLS 1.3 session ticket, sent by the next `SSL_do_handshake` or write. False
/// if OpenSSL refused (not a TLS 1.3 server, handshake not done).
pub(super) fn new_session_ticket(ssl: &SslRef) -> bool {
    // SAFETY: `ssl.as_ptr()` is a live SSL owned by the engine, which calls this through
    // `&mut self` (as for `key_update`); the call takes no pointer besides it.
    unsafe { SSL_new_session_ticket(ssl.as_ptr()) == 1 }
}

/// Frees the connection's read and write buffers if they hold nothing (OpenSSL allocates them
/// again when needed). False if they were in use and kept.
pub(super) fn free_buffers(ssl: &SslRef) -> bool {
    // SAFETY: `ssl.as_ptr()` is a live SSL owned by the engine, which calls this through
    // `&mut self` (as for `set_max_send_fragment`); OpenSSL keeps buffers that hold data.
    unsafe { SSL_free_buffers(ssl.as_ptr()) == 1 }
}

/// Marks the connection as closed both ways (`SSL_set_shutdown`), without sending anything,
/// so that freeing it does not make its session unresumable.
pub(super) fn mark_closed(ssl: &SslRef) {
    // SAFETY: `ssl.as_ptr()` is a live SSL owned by the engine, which calls this through
    // `self` as it gives the connection up (as for `set_max_send_fragment`); the call only
    // sets flags.
    unsafe {
        sys::SSL_set_shutdown(
            ssl.as_ptr(),
            sys::SSL_SENT_SHUTDOWN | sys::SSL_RECEIVED_SHUTDOWN,
        )
    }
}

/// `SSL_KEY_UPDATE_NOT_REQUESTED` / `SSL_KEY_UPDATE_REQUESTED` (`ssl.h`).
const KEY_UPDATE_NOT_REQUESTED: c_int = 0;
const KEY_UPDATE_REQUESTED: c_int = 1;

/// Schedules a TLS 1.3 KeyUpdate (`request_peer`: with update_requested), sent by the next
/// `SSL_do_handshake` or write. False if OpenSSL refused (not TLS 1.3, handshake not done).
pub(super) fn key_update(ssl: &SslRef, request_peer: bool) -> bool {
    let kind = if request_peer {
        KEY_UPDATE_REQUESTED
    } else {
        KEY_UPDATE_NOT_REQUESTED
    };
    // SAFETY: `ssl.as_ptr()` is a live SSL owned by the engine, which calls this through
    // `&mut self` (as for `set_max_send_fragment`); the call takes no pointer besides it.
    unsafe { SSL_key_update(ssl.as_ptr(), kind) == 1 }
}

/// Registers extension `ext_type` on the context with our add/free/parse callbacks.
pub(super) fn register_custom_extension(builder: &mut SslContextBuilder, ext_type: u16) -> bool {
    // SAFETY: `builder.as_ptr()` is the live SSL_CTX the builder owns. The callbacks are
    // `'static` functions, and both user-data pointers are null, so nothing has to outlive the
    // context. OpenSSL copies the registration into every SSL created from the context.
    let rc = unsafe {
        sys::SSL_CTX_add_custom_ext(
            builder.as_ptr(),
            c_uint::from(ext_type),
            EXT_CONTEXT,
            Some(add_cb),
            Some(free_cb),
            ptr::null_mut(),
            Some(parse_cb),
            ptr::null_mut(),
        )
    };
    rc == 1
}

/// Installs the message callback on one connection.
pub(super) fn install_msg_callback(ssl: &mut SslRef) {
    // SAFETY: `ssl.as_ptr()` is a live SSL we hold exclusively; `msg_cb` is a `'static` function
    // and no callback argument is set (it stays null).
    unsafe { SSL_set_msg_callback(ssl.as_ptr(), Some(msg_cb)) }
}

/// `SSL_CTRL_SET_MAX_SEND_FRAGMENT` (`ssl.h`), the control behind the
/// `SSL_set_max_send_fragment` macro.
const CTRL_SET_MAX_SEND_FRAGMENT: c_int = 52;

/// Caps the plaintext OpenSSL puts in one record on this connection (512..=16384, checked by
/// OpenSSL). False if OpenSSL refused the value.
pub(super) fn set_max_send_fragment(ssl: &SslRef, len: u16) -> bool {
    // SAFETY: `ssl.as_ptr()` is a live SSL owned by the engine, which calls this through
    // `&mut self` (no other use of the SSL can run meanwhile; `SslRef` is an opaque foreign type,
    // mutable behind shared references as far as Rust is concerned). The control takes a
    // number and no pointer (`parg` is null).
    let rc = unsafe {
        sys::SSL_ctrl(
            ssl.as_ptr(),
            CTRL_SET_MAX_SEND_FRAGMENT,
            std::os::raw::c_long::from(len),
            ptr::null_mut(),
        )
    };
    rc == 1
}

/// Offers `session` for resumption (`SSL_set_session`).
pub(super) fn set_session(ssl: &mut SslRef, session: &SslSessionRef) -> Result<(), ErrorStack> {
    // SAFETY: the `openssl` crate asks that the session come from the connection's own
    // context because it looks up its callbacks and session ex_data per context. Sessions
    // reach here only from the store of the `OpenSslContext` that makes this connection, filled
    // by that context's new-session callback or its twin's, which is built from the same
    // configuration with the same callback and store; no session ex_data is used.
    unsafe { ssl.set_session(session) }
}

/// Removes `session` from `ctx`'s server cache and marks it unresumable
/// (`SSL_CTX_remove_session`). False if it was not cached.
pub(super) fn remove_session(ctx: &SslContextRef, session: &SslSessionRef) -> bool {
    // SAFETY: the `openssl` crate asks that the session belong to `ctx`: both were taken from
    // the same server connection when it was exported (`ssl.ssl_context()`, `ssl.session()`;
    // servers never change context), and each is kept alive by its own reference.
    unsafe { ctx.remove_session(session) }
}

/// Moves the connection to `ctx` (`SSL_set_SSL_CTX`). False if OpenSSL refused.
pub(super) fn set_context(ssl: &SslRef, ctx: &SslContextRef) -> bool {
    // SAFETY: both pointers are live objects: `ssl` is owned by the engine, which calls this
    // through `&mut self` (as for `set_max_send_fragment`), and `ctx` is borrowed for the call.
    // OpenSSL takes its own reference on `ctx` and drops the one on the old context; the
    // `openssl` crate keeps the SSL's original context alive in ex_data for the session cache,
    // and holds no other pointer into the old context's certificate data.
    let rc = unsafe { sys::SSL_set_SSL_CTX(ssl.as_ptr(), ctx.as_ptr()) };
    !rc.is_null()
}

/// Runs `f` on the `SslRef` behind a callback's `SSL*`, catching panics.
///
/// # Safety
/// `ssl` must be the non-null, live `SSL` OpenSSL invoked the callback for.
unsafe fn with_ssl<R>(ssl: *mut sys::SSL, f: impl FnOnce(&SslRef) -> R) -> Option<R> {
    if ssl.is_null() {
        return None;
    }
    // SAFETY: per the contract, `ssl` is live for the whole callback; we only create a shared
    // reference, as the `openssl` crate does for its own callbacks.
    let ssl = unsafe { SslRef::from_ptr(ssl) };
    catch_unwind(AssertUnwindSafe(|| f(ssl))).ok()
}

/// Builds a byte slice from a C buffer, treating null/empty as empty.
///
/// # Safety
/// If `len > 0` and `p` is non-null, `p` must point to `len` readable bytes that stay valid and
/// unmodified for the returned lifetime (true for callback arguments during the callback).
unsafe fn slice<'a>(p: *const c_uchar, len: size_t) -> &'a [u8] {
    if p.is_null() || len == 0 {
        &[]
    } else {
        // SAFETY: see the function contract.
        unsafe { std::slice::from_raw_parts(p, len) }
    }
}

/// `SSL_custom_ext_add_cb_ex`: returns 1 with a malloc'ed copy of the payload to send, 0 to send
/// nothing, -1 on failure.
unsafe extern "C" fn add_cb(
    ssl: *mut sys::SSL,
    ext_type: c_uint,
    context: c_uint,
    out: *mut *const c_uchar,
    outlen: *mut size_t,
    _x: *mut sys::X509,
    _chainidx: size_t,
    al: *mut c_int,
    _add_arg: *mut c_void,
) -> c_int {
    let Ok(ty) = u16::try_from(ext_type) else {
        return 0;
    };
    let in_client_hello = context & sys::SSL_EXT_CLIENT_HELLO != 0;
    // SAFETY: OpenSSL calls us with the live SSL being handshaked.
    let payload = unsafe { with_ssl(ssl, |s| super::extension_to_send(s, ty, in_client_hello)) };
    let payload = match payload {
        Some(Some(p)) => p,
        Some(None) => return 0,
        None => {
            // SAFETY: `al` is a valid out-pointer for the duration of the callback.
            unsafe { *al = c_int::from(AlertDescription::INTERNAL_ERROR.0) };
            return -1;
        }
    };
    // SAFETY: malloc of at least 1 byte (so the pointer is non-null and freeable even for an
    // empty payload); we copy `payload.len()` bytes into it. Ownership goes to OpenSSL until it
    // calls `free_cb` with the same pointer, which frees it with the matching `free`.
    unsafe {
        let buf = libc::malloc(payload.len().max(1)).cast::<c_uchar>();
        if buf.is_null() {
            *al = c_int::from(AlertDescription::INTERNAL_ERROR.0);
            return -1;
        }
        ptr::copy_nonoverlapping(payload.as_ptr(), buf, payload.len());
        *out = buf;
        *outlen = payload.len();
    }
    1
}

/// `SSL_custom_ext_free_cb_ex`: frees what `add_cb` allocated.
unsafe extern "C" fn free_cb(
    _ssl: *mut sys::SSL,
    _ext_type: c_uint,
    _context: c_uint,
    out: *const c_uchar,
    _add_arg: *mut c_void,
) {
    // SAFETY: `out` is exactly a pointer `add_cb` returned from `libc::malloc` (OpenSSL only
    // calls free_cb after a successful add_cb), freed once.
    unsafe { libc::free(out.cast_mut().cast::<c_void>()) }
}

/// `SSL_custom_ext_parse_cb_ex`: 1 to accept, 0 with `*al` set to abort the handshake.
unsafe extern "C" fn parse_cb(
    ssl: *mut sys::SSL,
    ext_type: c_uint,
    context: c_uint,
    input: *const c_uchar,
    inlen: size_t,
    _x: *mut sys::X509,
    _chainidx: size_t,
    al: *mut c_int,
    _parse_arg: *mut c_void,
) -> c_int {
    let from_client_hello = context & sys::SSL_EXT_CLIENT_HELLO != 0;
    // SAFETY: `input`/`inlen` describe the extension body, valid during the callback.
    let data = unsafe { slice(input, inlen) };
    let verdict = match u16::try_from(ext_type) {
        // SAFETY: OpenSSL calls us with the live SSL being handshaked.
        Ok(ty) => unsafe {
            with_ssl(ssl, |s| {
                super::extension_received(s, ty, from_client_hello, data)
            })
        },
        Err(_) => None,
    };
    match verdict {
        Some(Ok(())) => 1,
        Some(Err(alert)) => {
            // SAFETY: `al` is a valid out-pointer for the duration of the callback.
            unsafe { *al = c_int::from(alert.0) };
            0
        }
        None => {
            // SAFETY: as above.
            unsafe { *al = c_int::from(AlertDescription::INTERNAL_ERROR.0) };
            0
        }
    }
}

/// `SSL_set_msg_callback` callback: forwards record headers, handshake messages, CCS and alerts.
unsafe extern "C" fn msg_cb(
    write_p: c_int,
    _version: c_int,
    content_type: c_int,
    buf: *const c_void,
    len: size_t,
    ssl: *mut sys::SSL,
    _arg: *mut c_void,
) {
    // SAFETY: `buf`/`len` describe the message or header, valid during the callback.
    let data = unsafe { slice(buf.cast::<c_uchar>(), len) };
    // SAFETY: OpenSSL calls us with the live SSL whose records are being processed.
    unsafe {
        with_ssl(ssl, |s| {
            super::on_message(s, write_p != 0, content_type, data)
        })
    };
}
