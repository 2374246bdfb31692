//! The client's handshake with one client-side middlebox (sans-I/O): pre-configured (must join)
//! or discovered on the path (joins only if the application approves it).
//!
//! The primary handshake runs in a real OpenSSL client engine (paused right after the
//! handshake); the secondary handshake with the middlebox runs in an independent OpenSSL client
//! engine whose ClientHello travels inside the MiddleboxSupport extension. Key material is sent
//! only after the middlebox's certificate (engine), the application's approval (discovered
//! middleboxes) and its exporter-bound evidence (policy) were all checked and the primary
//! handshake finished. A discovered middlebox that fails any check is excluded: the client
//! closes the secondary session without key material, the middlebox falls back to forwarding
//! ciphertext it cannot read, and the session continues on the primary keys.

use std::sync::Arc;

use mbx_attest::Policy;
use mbx_engine::{OpenSslContext, Role, TlsEngine};

use super::demux::{Demux, Piece};
use super::endpoint_core::{Approver, ClientHandshakeEvent, EndpointCore, SessionSummary};
use super::HandshakeError;
use crate::wire::{MiddleboxSupport, MIDDLEBOX_SUPPORT_EXTENSION};

/// Which middlebox the client expects.
#[derive(Clone)]
pub enum ClientMiddlebox {
    /// Configured a priori: must join, and its certificate must be valid for this name (sent in
    /// the extension's middlebox list).
    Preconfigured(String),
    /// Any on-path middlebox may offer to join; its chain must verify against the secondary
    /// context's roots and the approver must accept it. With none on the path the session is
    /// direct (an mbTLS client that allows server-side middleboxes only).
    Discover(Approver),
}

/// The client's configuration for one client-side middlebox.
#[derive(Clone)]
pub struct ClientHandshakeConfig {
    /// Primary context: must register [`MIDDLEBOX_SUPPORT_EXTENSION`] as a custom extension and
    /// set `pause_after_handshake` (so no application record is consumed before the export).
    pub primary: Arc<OpenSslContext>,
    /// The server's name (SNI, certificate check).
    pub server_name: String,
    /// Context for the secondary session (trust roots for middlebox certificates).
    pub secondary: Arc<OpenSslContext>,
    pub middlebox: ClientMiddlebox,
    /// Attestation policy for the middlebox.
    pub policy: Policy,
    /// Current time for evidence verification (seconds since the Unix epoch).
    pub now_unix: u64,
}

/// A client whose path has (at most) one client-side middlebox.
pub struct ClientHandshake {
    core: EndpointCore,
    demux: Demux,
}

/// The only subchannel used with one client-side middlebox.
const SUBCHANNEL: u8 = 0;

impl ClientHandshake {
    /// Starts the handshake; the first flight is in [`take_outgoing`](Self::take_outgoing).
    pub fn new(cfg: ClientHandshakeConfig) -> Result<Self, HandshakeError> {
        let (mut secondary, listed, approver) = match &cfg.middlebox {
            ClientMiddlebox::Preconfigured(name) => (
                cfg.secondary.engine_for(Some(name))?,
                vec![name.clone()],
                None,
            ),
            ClientMiddlebox::Discover(a) => {
                (cfg.secondary.engine_for(None)?, Vec::new(), Some(a.clone()))
            }
        };
        let hello = secondary.take_client_hello()?;
        let ext = MiddleboxSupport {
            client_hellos: vec![hello],
            middleboxes: listed,
        }
        .encode()?;
        let mut primary = cfg.primary.engine_for(Some(&cfg.server_name))?;
        primary.set_extension_payload(MIDDLEBOX_SUPPORT_EXTENSION, ext)?;
        primary.process()?;
        let out = primary.take_outgoing();
        let mut core = EndpointCore::new(
            Role::Client,
            cfg.policy,
            cfg.now_unix,
            approver,
            primary,
            Some(secondary),
        );
        core.subchannel = SUBCHANNEL;
        core.out = out;
        Ok(ClientHandshake {
            core,
            demux: Demux::new(),
        })
    }

    /// Bytes from the next hop. Errors are fatal and no key material is sent afterwards.
    pub fn receive(&mut self, bytes: &[u8]) -> Result<(), HandshakeError> {
        self.demux.push(bytes);
        let demux = &mut self.demux;
        self.core.guarded(|core| {
            while let Some(piece) = demux.next_piece()? {
                match piece {
                    Piece::Sub { enc, .. } if enc.subchannel == SUBCHANNEL => {
                        core.secondary_in(&enc)?
                    }
                    Piece::Sub { .. } => {
                        return Err(HandshakeError::Protocol("record on an unknown subchannel"))
                    }
                    Piece::Primary(rec) => core.primary_record(&rec)?,
                }
            }
            Ok(())
        })
    }

    /// Application data for the server; held until the data phase starts.
    pub fn write(&mut self, data: &[u8]) -> Result<(), HandshakeError> {
        self.core.write(data)
    }

    /// Ends our direction with close_notify (data phase only).
    pub fn close(&mut self) -> Result<(), HandshakeError> {
        self.core.close()
    }

    /// Version, suite and hop key fingerprints, once the data phase started.
    pub fn summary(&self) -> Option<&SessionSummary> {
        self.core.summary()
    }

    /// Ciphertext for the next hop, in order.
    pub fn take_outgoing(&mut self) -> Vec<u8> {
        self.core.take_outgoing()
    }

    /// Application data received (once ready).
    pub fn take_plaintext(&mut self) -> Vec<u8> {
        self.core.take_plaintext()
    }

    pub fn poll_event(&mut self) -> Option<ClientHandshakeEvent> {
        self.core.poll_event()
    }

    /// True once key material was sent to the middlebox.
    pub fn keys_sent(&self) -> bool {
        self.core.keys_sent()
    }

    /// True once the data phase started (with or without a middlebox).
    pub fn data_phase_started(&self) -> bool {
        self.core.data_phase_started()
    }

    /// Primary-key records dropped because the middlebox re-sends them (0 when it held them).
    pub fn discarded_records(&self) -> usize {
        self.core.discarded_records()
    }

    pub fn is_ready(&self) -> bool {
        self.core.is_ready()
    }
}
