//! The key server's request handler: bytes of one request in, bytes of its response out.
//!
//! No sockets, no clocks, no threads: the driver cuts the stream into frames and calls
//! [`KeyServerCore::handle_frame_into`] on a worker thread, appending each response to a buffer
//! it writes in one go. Checks, in order: major version (0x04),
//! body format (0x07), opcode (0x05 unknown/unsupported, 0x06 a response opcode), ping, key lookup
//! by SKI then digest and authorization (both 0x02), payload present (0x07), then the operation.
//! Every response is padded to at least 1024 bytes, so all responses to one fixed operation have
//! the same length.

use std::sync::{Arc, RwLock};

use zeroize::Zeroizing;

use crate::keys::{KeyOperation, KeyStore};
use crate::server::authz::{Authorization, EdgeIdentity};
use crate::wire::{
    encode_into, Body, ErrorCode, Frame, FrameError, FrameOrFormat, Message, Opcode,
    DEFAULT_MAX_BODY_LEN, MIN_MESSAGE_LEN, VERSION_MAJOR,
};

/// Key store and authorization behind locks that are only held for a pointer copy, so a reload
/// (SIGHUP) swaps them without disturbing requests in flight.
#[derive(Debug)]
pub struct KeyServerCore {
    keys: RwLock<Arc<KeyStore>>,
    authz: RwLock<Arc<Authorization>>,
    max_body_len: usize,
}

fn snapshot<T>(lock: &RwLock<Arc<T>>) -> Arc<T> {
    match lock.read() {
        Ok(g) => Arc::clone(&g),
        Err(poisoned) => Arc::clone(&poisoned.into_inner()),
    }
}

fn replace<T>(lock: &RwLock<Arc<T>>, value: T) {
    match lock.write() {
        Ok(mut g) => *g = Arc::new(value),
        Err(poisoned) => *poisoned.into_inner() = Arc::new(value),
    }
}

impl KeyServerCore {
    /// A handler serving `keys` under `authz`, with the default maximum body length.
    pub fn new(keys: KeyStore, authz: Authorization) -> KeyServerCore {
        KeyServerCore {
            keys: RwLock::new(Arc::new(keys)),
            authz: RwLock::new(Arc::new(authz)),
            max_body_len: DEFAULT_MAX_BODY_LEN,
        }
    }

    /// Sets the largest body accepted; a longer header closes the connection.
    pub fn with_max_body_len(mut self, max: usize) -> KeyServerCore {
        self.max_body_len = max;
        self
    }

    /// The largest body accepted.
    pub fn max_body_len(&self) -> usize {
        self.max_body_len
    }

    /// Replaces the key store (requests already running keep the old one).
    pub fn replace_keys(&self, keys: KeyStore) {
        replace(&self.keys, keys);
    }

    /// Replaces the authorization rules.
    pub fn replace_authorization(&self, authz: Authorization) {
        replace(&self.authz, authz);
    }

    /// The current key store.
    pub fn keys(&self) -> Arc<KeyStore> {
        snapshot(&self.keys)
    }

    /// Handles one complete request message. `Err` means the connection must be closed (no
    /// header, or a body longer than the maximum); everything else is answered.
    pub fn handle(
        &self,
        request: &[u8],
        edge: &EdgeIdentity,
    ) -> Result<Zeroizing<Vec<u8>>, FrameError> {
        match Frame::from_message(request, self.max_body_len) {
            Ok(frame) => Ok(self.handle_frame(&frame, edge)),
            Err(FrameOrFormat::Frame(e)) => Err(e),
            Err(FrameOrFormat::Format { header, error }) => {
                tracing::debug!(request_id = header.request_id, %error, "malformed request");
                Ok(respond(
                    header.request_id,
                    Body::error(ErrorCode::FormatError),
                ))
            }
        }
    }

    /// Handles one frame cut by the driver's deframer.
    pub fn handle_frame(&self, frame: &Frame, edge: &EdgeIdentity) -> Zeroizing<Vec<u8>> {
        self.handle_frame_outcome(frame, edge).0
    }

    /// As [`KeyServerCore::handle_frame`], and says what happened, for the metrics.
    pub fn handle_frame_outcome(
        &self,
        frame: &Frame,
        edge: &EdgeIdentity,
    ) -> (Zeroizing<Vec<u8>>, RequestOutcome) {
        let mut out = Zeroizing::new(Vec::with_capacity(MIN_MESSAGE_LEN));
        let outcome = self.handle_frame_into(frame, edge, &mut out, |_, _| {});
        (out, outcome)
    }

    /// As [`KeyServerCore::handle_frame_outcome`], appending the response to `out`, so that a
    /// driver can gather a run of responses into one buffer (and one TLS write).
    /// `before_operation` is called with the opcode and `out` once the request is decoded,
    /// its key found and its edge authorized, just before the private-key operation (not for
    /// pings or refusals): the driver uses it to send the responses it holds in `out` before an
    /// operation that may be slow.
    pub fn handle_frame_into(
        &self,
        frame: &Frame,
        edge: &EdgeIdentity,
        out: &mut Vec<u8>,
        before_operation: impl FnOnce(Opcode, &mut Vec<u8>),
    ) -> RequestOutcome {
        let id = frame.header.request_id;
        let mut outcome = RequestOutcome::default();
        let body = match self.answer(frame, edge, &mut outcome, |op| before_operation(op, out)) {
            Ok(body) => body,
            Err(code) => {
                tracing::debug!(request_id = id, error = %code, edge = ?edge.names(), "request refused");
                outcome.error = Some(code);
                Body::error(code)
            }
        };
        respond_into(id, body, out);
        outcome
    }

    fn answer(
        &self,
        frame: &Frame,
        edge: &EdgeIdentity,
        outcome: &mut RequestOutcome,
        before_operation: impl FnOnce(Opcode),
    ) -> Result<Body, ErrorCode> {
        if frame.header.major != VERSION_MAJOR {
            return Err(ErrorCode::VersionMismatch);
        }
        let request = frame.decode().map_err(|_| ErrorCode::FormatError)?;
        let body = request.body;
        let opcode_byte = body.opcode.ok_or(ErrorCode::FormatError)?;
        let opcode = Opcode::from_u8(opcode_byte).ok_or(ErrorCode::BadOpcode)?;
        outcome.opcode = Some(opcode);
        if opcode == Opcode::Ping {
            let mut body = body;
            return Ok(Body::op(
                Opcode::Pong,
                body.payload.take().unwrap_or_default(),
            ));
        }
        let operation = KeyOperation::from_opcode(opcode)?;
        let keys = self.keys();
        let key = keys
            .find(body.ski.as_ref(), body.certificate_digest.as_ref())
            .ok_or(ErrorCode::KeyNotFound)?;
        if !snapshot(&self.authz).permits(edge, key.as_ref()) {
            // Same answer as a missing key: an edge cannot learn which keys exist.
            return Err(ErrorCode::KeyNotFound);
        }
        let payload = body.payload.as_deref().ok_or(ErrorCode::FormatError)?;
        before_operation(opcode);
        let output = key.perform(operation, payload).map_err(|e| {
            tracing::debug!(error = %e, "key operation failed");
            e.code()
        })?;
        Ok(Body::op(Opcode::Response, output.to_vec()))
    }
}

/// What a request asked for and how it ended, as counted by the metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RequestOutcome {
    /// The request's opcode, if it had a known one.
    pub opcode: Option<Opcode>,
    /// The error byte answered, `None` for success.
    pub error: Option<ErrorCode>,
}

/// Encodes a response; a ping echo too large to encode becomes a format error.
fn respond(request_id: u32, body: Body) -> Zeroizing<Vec<u8>> {
    let mut out = Zeroizing::new(Vec::with_capacity(MIN_MESSAGE_LEN));
    respond_into(request_id, body, &mut out);
    out
}

/// As [`respond`], appending to `out`.
fn respond_into(request_id: u32, body: Body, out: &mut Vec<u8>) {
    if encode_into(&Message { request_id, body }, out).is_err() {
        // An error body is 7 bytes, so it always encodes; if not, nothing is appended.
        let _ = encode_into(
            &Message {
                request_id,
                body: Body::error(ErrorCode::FormatError),
            },
            out,
        );
    }
}
