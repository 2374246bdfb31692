//! The edge-side client of the key-server protocol.
//!
//! One [`KeylessClient`] is one mutually authenticated TLS connection that carries many requests
//! at once: each request gets a fresh request id, a writer task sends it, and a reader task hands
//! each response to whoever waits for that id, in whatever order the server answers. Every
//! operation has a timeout; a request that times out is forgotten and a late answer is dropped.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_rustls::TlsConnector;
use zeroize::Zeroizing;

use crate::premaster::{unpad_premaster, PREMASTER_LEN};
use crate::wire::{
    encode, Body, Deframer, EncodeError, ErrorCode, Frame, Message, Opcode, DEFAULT_MAX_BODY_LEN,
};

/// Which key a request is for: by SKI, by certificate digest, or both (the server tries the SKI
/// first).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KeyId {
    /// Subject key identifier.
    pub ski: Option<[u8; 20]>,
    /// SHA-256 of the upper-case hex RSA modulus.
    pub digest: Option<[u8; 32]>,
}

impl KeyId {
    /// A key named by SKI.
    pub fn ski(ski: [u8; 20]) -> KeyId {
        KeyId {
            ski: Some(ski),
            digest: None,
        }
    }

    /// A key named by certificate digest.
    pub fn digest(digest: [u8; 32]) -> KeyId {
        KeyId {
            ski: None,
            digest: Some(digest),
        }
    }

    fn body(&self, opcode: Opcode, payload: &[u8]) -> Body {
        let mut body = Body::op(opcode, payload.to_vec());
        body.ski = self.ski;
        body.certificate_digest = self.digest;
        body
    }
}

/// Errors seen by the edge.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// TCP connect or TLS handshake failed.
    #[error("connecting to the key server: {0}")]
    Connect(std::io::Error),
    /// The connection is closed (by either side, or after a protocol violation).
    #[error("connection to the key server closed")]
    ConnectionClosed,
    /// No answer within the operation timeout.
    #[error("key server did not answer within {0:?}")]
    Timeout(Duration),
    /// The key server answered with an error byte.
    #[error("key server error: {0}")]
    Remote(ErrorCode),
    /// An error byte we do not know.
    #[error("key server error byte 0x{0:02x}")]
    UnknownRemoteError(u8),
    /// The answer is not what the request calls for.
    #[error("unexpected answer: {0}")]
    BadResponse(&'static str),
    /// The opcode given to [`KeylessClient::sign`] is not a signing opcode.
    #[error("{0:?} is not a signing opcode")]
    NotSigning(Opcode),
    /// The request could not be encoded.
    #[error(transparent)]
    Encode(#[from] EncodeError),
}

/// Connection options.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// How long one operation may take, from sending to receiving the answer.
    pub timeout: Duration,
    /// Largest response body accepted; a longer one closes the connection.
    pub max_body_len: usize,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            timeout: Duration::from_secs(5),
            max_body_len: DEFAULT_MAX_BODY_LEN,
        }
    }
}

type Pending = Arc<Mutex<Option<HashMap<u32, oneshot::Sender<Frame>>>>>;

/// Removes and returns the waiter for `id`; `None` once the connection is closed.
fn take_waiter(pending: &Pending, id: u32) -> Option<oneshot::Sender<Frame>> {
    let mut guard = pending.lock().unwrap_or_else(|p| p.into_inner());
    guard.as_mut().and_then(|m| m.remove(&id))
}

/// A pipelined connection to one key server.
#[derive(Debug)]
pub struct KeylessClient {
    tx: mpsc::UnboundedSender<Zeroizing<Vec<u8>>>,
    pending: Pending,
    next_id: AtomicU32,
    timeout: Duration,
    tasks: [JoinHandle<()>; 2],
}

impl Drop for KeylessClient {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl KeylessClient {
    /// Connects to `addr`, verifying the server as `server_name`, with a TLS configuration from
    /// [`crate::tls::client_config`] (which presents the edge's certificate).
    pub async fn connect(
        addr: SocketAddr,
        server_name: ServerName<'static>,
        tls: Arc<rustls::ClientConfig>,
        options: ClientOptions,
    ) -> Result<KeylessClient, ClientError> {
        let tcp = tokio::time::timeout(options.timeout, TcpStream::connect(addr))
            .await
            .map_err(|_| ClientError::Timeout(options.timeout))?
            .map_err(ClientError::Connect)?;
        let _ = tcp.set_nodelay(true);
        let stream = tokio::time::timeout(
            options.timeout,
            TlsConnector::from(tls).connect(server_name, tcp),
        )
        .await
        .map_err(|_| ClientError::Timeout(options.timeout))?
        .map_err(ClientError::Connect)?;
        let (mut reader, mut writer) = tokio::io::split(stream);
        let pending: Pending = Arc::new(Mutex::new(Some(HashMap::new())));
        let (tx, mut rx) = mpsc::unbounded_channel::<Zeroizing<Vec<u8>>>();
        let writer_task = tokio::spawn(async move {
            // Every request queued by the time the writer runs goes out in one TLS write, so
            // pipelined requests cost the key server one read, not one each.
            let mut out = Zeroizing::new(Vec::new());
            while let Some(first) = rx.recv().await {
                crate::wipe::reserve(&mut out, first.len());
                out.extend_from_slice(&first);
                drop(first);
                // Woken by the first request of a burst: let the tasks woken with it queue
                // theirs before writing.
                tokio::task::yield_now().await;
                while out.len() < 64 * 1024 {
                    match rx.try_recv() {
                        Ok(more) => {
                            crate::wipe::reserve(&mut out, more.len());
                            out.extend_from_slice(&more);
                        }
                        Err(_) => break,
                    }
                }
                let sent = writer.write_all(&out).await;
                crate::wipe::wipe(&mut out);
                out.clear();
                if sent.is_err() {
                    break;
                }
            }
            let _ = writer.shutdown().await;
        });
        let reader_pending = Arc::clone(&pending);
        let max = options.max_body_len;
        let reader_task = tokio::spawn(async move {
            let mut deframer = Deframer::new(max);
            let mut buf = Zeroizing::new(vec![0u8; 16 * 1024]);
            'read: loop {
                let n = match reader.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                deframer.push(buf.get(..n).unwrap_or_default());
                loop {
                    match deframer.next_frame() {
                        Ok(Some(frame)) => {
                            if let Some(waiter) =
                                take_waiter(&reader_pending, frame.header.request_id)
                            {
                                let _ = waiter.send(frame);
                            }
                        }
                        Ok(None) => break,
                        Err(e) => {
                            tracing::warn!(error = %e, "bad frame from key server; closing");
                            break 'read;
                        }
                    }
                }
            }
            // Dropping every waiter wakes all requests with `ConnectionClosed`.
            let mut guard = reader_pending.lock().unwrap_or_else(|p| p.into_inner());
            *guard = None;
        });
        Ok(KeylessClient {
            tx,
            pending,
            next_id: AtomicU32::new(1),
            timeout: options.timeout,
            tasks: [writer_task, reader_task],
        })
    }

    /// Sends bytes built by `build` from a fresh request id, and waits for the frame answering
    /// that id. For diagnostics and tests: the bytes are sent as they are.
    pub async fn send_raw(&self, build: impl FnOnce(u32) -> Vec<u8>) -> Result<Frame, ClientError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (waiter, answer) = oneshot::channel();
        {
            let mut guard = self.pending.lock().unwrap_or_else(|p| p.into_inner());
            let map = guard.as_mut().ok_or(ClientError::ConnectionClosed)?;
            map.insert(id, waiter);
        }
        if self.tx.send(Zeroizing::new(build(id))).is_err() {
            take_waiter(&self.pending, id);
            return Err(ClientError::ConnectionClosed);
        }
        match tokio::time::timeout(self.timeout, answer).await {
            Ok(Ok(frame)) => Ok(frame),
            Ok(Err(_)) => Err(ClientError::ConnectionClosed),
            Err(_) => {
                take_waiter(&self.pending, id);
                Err(ClientError::Timeout(self.timeout))
            }
        }
    }

    /// Sends `body` and returns the response body; an error response becomes
    /// [`ClientError::Remote`].
    pub async fn request(&self, body: Body) -> Result<Body, ClientError> {
        // Encoded once with id 0; the id is patched in when it is assigned.
        let mut bytes = encode(&Message {
            request_id: 0,
            body,
        })?;
        let frame = self
            .send_raw(|id| {
                if let Some(slot) = bytes.get_mut(4..8) {
                    slot.copy_from_slice(&id.to_be_bytes());
                }
                bytes
            })
            .await?;
        let mut response = frame
            .decode()
            .map_err(|_| ClientError::BadResponse("malformed response"))?
            .body;
        match response.known_opcode() {
            Some(Opcode::Error) => {
                let byte = match response.payload.as_deref() {
                    Some([b]) => *b,
                    _ => return Err(ClientError::BadResponse("error without one error byte")),
                };
                Err(ErrorCode::from_u8(byte)
                    .map(ClientError::Remote)
                    .unwrap_or(ClientError::UnknownRemoteError(byte)))
            }
            Some(Opcode::Response) | Some(Opcode::Pong) => {
                // Hand the payload over without copying it out of a body that zeroizes.
                let mut out = Body::default();
                out.opcode = response.opcode;
                out.payload = response.payload.take();
                Ok(out)
            }
            _ => Err(ClientError::BadResponse("not a response opcode")),
        }
    }

    async fn operation(
        &self,
        key: &KeyId,
        opcode: Opcode,
        input: &[u8],
    ) -> Result<Zeroizing<Vec<u8>>, ClientError> {
        let mut response = self.request(key.body(opcode, input)).await?;
        if response.known_opcode() != Some(Opcode::Response) {
            return Err(ClientError::BadResponse("expected opcode 0xF0"));
        }
        response
            .payload
            .take()
            .map(Zeroizing::new)
            .ok_or(ClientError::BadResponse("response without payload"))
    }

    /// Liveness check: the server echoes `payload`.
    pub async fn ping(&self, payload: &[u8]) -> Result<Vec<u8>, ClientError> {
        let mut response = self
            .request(Body::op(Opcode::Ping, payload.to_vec()))
            .await?;
        if response.known_opcode() != Some(Opcode::Pong) {
            return Err(ClientError::BadResponse("expected pong"));
        }
        let echoed = response.payload.take().unwrap_or_default();
        if echoed != payload {
            return Err(ClientError::BadResponse("pong does not echo the ping"));
        }
        Ok(echoed)
    }

    /// Signs a precomputed `digest` (or, for Ed25519, the whole message) with a signing opcode.
    pub async fn sign(
        &self,
        key: &KeyId,
        opcode: Opcode,
        digest: &[u8],
    ) -> Result<Vec<u8>, ClientError> {
        let signing = matches!(
            crate::keys::KeyOperation::from_opcode(opcode),
            Ok(op) if op != crate::keys::KeyOperation::RsaDecryptRaw
        );
        if !signing {
            return Err(ClientError::NotSigning(opcode));
        }
        Ok(self.operation(key, opcode, digest).await?.to_vec())
    }

    /// Raw RSA decryption: the block with its padding still in place.
    pub async fn rsa_decrypt_raw(
        &self,
        key: &KeyId,
        ciphertext: &[u8],
    ) -> Result<Zeroizing<Vec<u8>>, ClientError> {
        self.operation(key, Opcode::RsaDecrypt, ciphertext).await
    }

    /// Decrypts a TLS RSA ClientKeyExchange and unpads it here, in constant time with implicit
    /// rejection (RFC 5246 §7.4.7.1): bad padding, a wrong length or a version other than
    /// `client_version` (the ClientHello's) give a random 48-byte premaster, not an error.
    /// Errors are only transport or key-server errors, which do not depend on the plaintext.
    pub async fn rsa_decrypt_premaster(
        &self,
        key: &KeyId,
        ciphertext: &[u8],
        client_version: [u8; 2],
    ) -> Result<Zeroizing<[u8; PREMASTER_LEN]>, ClientError> {
        // Drawn before the block is seen, whatever the block turns out to be.
        let mut random = Zeroizing::new([0u8; PREMASTER_LEN]);
        openssl::rand::rand_bytes(&mut random[..])
            .map_err(|_| ClientError::BadResponse("no randomness"))?;
        let block = self.rsa_decrypt_raw(key, ciphertext).await?;
        if block.len() != ciphertext.len() {
            // The block length is the modulus size, public: this is a broken server, not padding.
            return Err(ClientError::BadResponse(
                "RSA block length differs from ciphertext",
            ));
        }
        Ok(unpad_premaster(&block, client_version, &random))
    }
}
