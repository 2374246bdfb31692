//! What the two middlebox cores ([`MiddleboxHandshake`](super::MiddleboxHandshake) on the client
//! side, [`ServerSideMiddlebox`](super::ServerSideMiddlebox) on the server side) have alike: a
//! demultiplexer per neighbour, the outgoing buffers, the relay once keys are installed, the
//! event queue, the sticky failure, and the wait for the switch marker of a neighbour on the
//! far side (away from the endpoint that gives us keys). Only what a core does with a
//! handshake-phase piece differs ([`Core::piece`]).

use std::collections::VecDeque;

use mbx_apps::MiddleboxApp;
use mbx_engine::{AlertDescription, EngineError, OpenSslEngine, TlsEngine};
use mbx_record::{ContentType, TlsVersion};
use mbx_wire::{version, Record};

use super::demux::{Demux, Piece};
use super::{HandshakeError, MiddleboxHandshakeEvent};
use crate::hop::{Alert, Input, Side};
use crate::relay::{append_or_swap, MiddleboxRelay};
use crate::wire::{Encapsulated, KeyMaterial, SecondaryMessage, SecondaryReader};

pub(super) struct Wires<A: MiddleboxApp> {
    from_client: Demux,
    pub(super) from_server: Demux,
    pub(super) out_client: Vec<u8>,
    pub(super) out_server: Vec<u8>,
    pub(super) relay: Option<MiddleboxRelay<A>>,
    pub(super) events: VecDeque<MiddleboxHandshakeEvent>,
    failed: bool,
    /// The side away from our endpoint (the server's, for a client-side middlebox): where a
    /// neighbour that joined too sits.
    far: Side,
    /// Switched, the neighbour on the far side not yet: its raw records are under the bridge
    /// keys and come again through its app after its switch, so they are dropped until its
    /// marker — the first encapsulated record from it after our switch (its secondary
    /// close_notify).
    pub(super) awaiting_neighbour_marker: bool,
    /// Our endpoint refused us: nothing more may come on the secondary session but its close.
    endpoint_refused: bool,
    /// The plaintext our endpoint sent on the secondary session, read message by message.
    secondary: SecondaryReader,
    /// What the endpoint's path message said (until its key material arrives): whether a
    /// middlebox farther from it joined, and whether it wants our session ticket. Such a
    /// middlebox re-sends every application record through its own app once it switches, so
    /// what it forwarded raw before is not ours to relay.
    path: Option<PathNews>,
    /// The first fatal alert the server sent in the clear before our keys (and that went on
    /// to the client): why a handshake the server then closed ended, for the report.
    pub(super) server_alert: Option<u8>,
    /// The middlebox went passive while failing closed, and why: the session ends.
    pub(super) fail_closed: Option<&'static str>,
}

/// A middlebox core: its [`Wires`] and what it does with a piece before the data phase.
pub(super) trait Core<A: MiddleboxApp> {
    fn wires(&mut self) -> &mut Wires<A>;
    /// A demultiplexed piece from `from`, before keys are installed.
    fn piece(&mut self, from: Side, piece: Piece) -> Result<(), HandshakeError>;
}

/// Bytes from the neighbour on `from`. In the data phase, with nothing left in the
/// demultiplexer for `from` and no marker awaited from it, they are data-phase records only and
/// go straight to the relay (whose own framing is the stricter one, and which can open lent
/// records in place); otherwise piece by piece. An error is sticky: every later call fails.
pub(super) fn receive<A: MiddleboxApp>(
    core: &mut impl Core<A>,
    from: Side,
    input: Input<'_>,
) -> Result<(), HandshakeError> {
    let w = core.wires();
    w.check_fail_closed()?;
    if w.failed {
        return Err(HandshakeError::Protocol(
            "middlebox handshake already failed",
        ));
    }
    if w.direct_to_relay(from) {
        if let Some(relay) = w.relay.as_mut() {
            relay.receive_input(from, input);
        }
        w.drain_relay();
        return Ok(());
    }
    let r = receive_pieces(core, from, input.bytes());
    if r.is_err() {
        core.wires().failed = true;
    }
    r
}

/// [`receive`] of lent bytes whose records the relay may pass on where they lie when its app
/// lets them through unchanged ([`MiddleboxRelay::receive_lending`]): the range of `bytes` to send toward
/// `from.other()` after that side's queued output.
pub(super) fn receive_lending<A: MiddleboxApp>(
    core: &mut impl Core<A>,
    from: Side,
    bytes: &mut [u8],
) -> Result<Option<std::ops::Range<usize>>, HandshakeError> {
    let w = core.wires();
    if !w.failed && w.direct_to_relay(from) {
        let lent = w
            .relay
            .as_mut()
            .and_then(|relay| relay.receive_lending(from, bytes));
        w.drain_relay();
        return Ok(lent);
    }
    receive(core, from, Input::Lent(bytes)).map(|()| None)
}

fn receive_pieces<A: MiddleboxApp>(
    core: &mut impl Core<A>,
    from: Side,
    bytes: &[u8],
) -> Result<(), HandshakeError> {
    core.wires().demux(from).push(bytes);
    loop {
        let w = core.wires();
        let Some(piece) = w.demux(from).next_piece()? else {
            return Ok(());
        };
        if from == w.far && w.awaiting_neighbour_marker {
            if let Piece::Sub { .. } = piece {
                w.awaiting_neighbour_marker = false;
            }
            continue;
        }
        if let Some(relay) = w.relay.as_mut() {
            let raw = match &piece {
                Piece::Primary(r) => r.as_bytes(),
                Piece::Sub { raw, .. } => raw.as_bytes(),
            };
            relay.receive(from, raw);
            w.drain_relay();
            continue;
        }
        core.piece(from, piece)?;
        // Failing closed: nothing after the piece that made it passive is passed on.
        core.wires().check_fail_closed()?;
    }
}

impl<A: MiddleboxApp> Wires<A> {
    /// `far`: the side away from our endpoint.
    pub(super) fn new(far: Side) -> Self {
        Wires {
            from_client: Demux::new(),
            from_server: Demux::new(),
            out_client: Vec::new(),
            out_server: Vec::new(),
            relay: None,
            events: VecDeque::new(),
            failed: false,
            far,
            awaiting_neighbour_marker: false,
            endpoint_refused: false,
            secondary: SecondaryReader::new(),
            path: None,
            server_alert: None,
            fail_closed: None,
        }
    }

    /// The session's end once this middlebox went passive while failing closed (set by the
    /// cores' `go_passive`): checked after every piece and before any later input, so
    /// nothing more passes whichever way the bytes came in.
    pub(super) fn check_fail_closed(&self) -> Result<(), HandshakeError> {
        match self.fail_closed {
            Some(why) => Err(HandshakeError::FailClosed(why)),
            None => Ok(()),
        }
    }

    /// Notes `rec`, from the server, if it is a fatal alert in the clear (an encrypted one
    /// is longer than its two bytes, and unread).
    pub(super) fn note_server_alert(&mut self, rec: &Record) {
        if let (ContentType::ALERT, [Alert::LEVEL_FATAL, description]) =
            (rec.content_type(), rec.payload())
        {
            self.server_alert.get_or_insert(*description);
        }
    }

    fn demux(&mut self, from: Side) -> &mut Demux {
        match from {
            Side::Client => &mut self.from_client,
            Side::Server => &mut self.from_server,
        }
    }

    fn direct_to_relay(&self, from: Side) -> bool {
        let buffered = match from {
            Side::Client => self.from_client.buffered(),
            Side::Server => self.from_server.buffered(),
        };
        self.relay.is_some()
            && buffered == 0
            && !(from == self.far && self.awaiting_neighbour_marker)
    }

    /// What our secondary engine produced, in encapsulated records on `subchannel`, toward
    /// our endpoint (the side opposite `far`).
    pub(super) fn send_to_endpoint(
        &mut self,
        subchannel: u8,
        engine: &mut OpenSslEngine,
    ) -> Result<(), HandshakeError> {
        let out = engine.take_outgoing();
        let to = match self.far {
            Side::Server => &mut self.out_client,
            Side::Client => &mut self.out_server,
        };
        Encapsulated::wrap_stream(subchannel, &out, version::TLS1_2, to)?;
        Ok(())
    }

    /// Our switch marker (our secondary session's close_notify), after a TLS 1.3 session
    /// ticket if `ticket` (the endpoint wants one and our configuration issues them): made
    /// only now, so that no record the endpoint does not see takes a sequence number before
    /// the marker (docs/mbtls.md §4.7).
    pub(super) fn send_marker(
        &mut self,
        subchannel: u8,
        engine: &mut OpenSslEngine,
        ticket: bool,
    ) -> Result<(), HandshakeError> {
        if ticket && engine.version() == Some(TlsVersion::Tls13) {
            engine.send_session_ticket()?;
        }
        engine.close()?;
        self.send_to_endpoint(subchannel, engine)
    }

    /// Gives back memory kept for traffic that is over: output buffers beyond their bytes, empty
    /// demultiplexer buffers, and the relay's (see [`MiddleboxRelay::release_idle_buffers`]).
    pub(super) fn release_idle_buffers(&mut self) {
        self.out_client.shrink_to_fit();
        self.out_server.shrink_to_fit();
        self.from_client.release_if_empty();
        self.from_server.release_if_empty();
        if let Some(relay) = self.relay.as_mut() {
            relay.release_idle_buffers();
        }
    }

    /// The relay's output and events, moved to ours.
    pub(super) fn drain_relay(&mut self) {
        if let Some(relay) = self.relay.as_mut() {
            relay.append_outgoing(Side::Client, &mut self.out_client);
            relay.append_outgoing(Side::Server, &mut self.out_server);
            while let Some(ev) = relay.poll_event() {
                self.events.push_back(MiddleboxHandshakeEvent::Relay(ev));
            }
        }
    }

    /// Starts the data phase: `replay` (records from `from` forwarded raw before our keys
    /// arrived, which the endpoint dropped) goes through the relay first.
    pub(super) fn start_relay(
        &mut self,
        mut relay: MiddleboxRelay<A>,
        from: Side,
        replay: &[Record],
    ) {
        for rec in replay {
            relay.receive(from, rec.as_bytes());
        }
        self.relay = Some(relay);
        self.events
            .push_back(MiddleboxHandshakeEvent::KeysInstalled);
        self.drain_relay();
    }

    pub(super) fn take_outgoing(&mut self, to: Side) -> Vec<u8> {
        match to {
            Side::Client => core::mem::take(&mut self.out_client),
            Side::Server => core::mem::take(&mut self.out_server),
        }
    }

    /// Appends what is to be sent to the neighbour on `to` to `dst`; swaps buffers instead of
    /// copying when `dst` is empty, so a driver handing back emptied buffers allocates nothing
    /// per call.
    pub(super) fn append_outgoing(&mut self, to: Side, dst: &mut Vec<u8>) {
        let out = match to {
            Side::Client => &mut self.out_client,
            Side::Server => &mut self.out_server,
        };
        append_or_swap(out, dst);
    }
}

/// Where a middlebox core stands with its endpoint once their secondary handshake is over.
pub(super) enum EndpointTurn {
    /// The key material and the path message before it (boxed: the rest is small).
    Keys(Box<KeyMaterial>, PathNews),
    /// The endpoint closed the secondary session without key material (after a refusal, or
    /// without a word): why, for the report.
    Closed(&'static str),
    /// Nothing conclusive yet.
    Waiting,
}

/// The plaintext the endpoint (on `endpoint`'s side) sent on our finished secondary session,
/// read for its messages: its keys, or its close without them. The plaintext is read before a
/// close is looked at: a refusal comes right before it.
pub(super) fn endpoint_turn<A: MiddleboxApp>(
    wires: &mut Wires<A>,
    engine: &mut OpenSslEngine,
    endpoint: Side,
) -> Result<EndpointTurn, HandshakeError> {
    // May hold key material: wiped when dropped.
    let plain = zeroize::Zeroizing::new(engine.take_plaintext());
    let peer_closed = engine.peer_closed();
    wires.secondary.push(&plain);
    let (sent_evidence, closed) = match endpoint {
        Side::Client => (
            "a client sent evidence",
            "the client closed the secondary session without key material",
        ),
        Side::Server => (
            "a server sent evidence",
            "the server closed the secondary session without key material",
        ),
    };
    if let Some((km, path)) = endpoint_keys(wires, sent_evidence)? {
        return Ok(EndpointTurn::Keys(km, path));
    }
    Ok(match peer_closed {
        true => EndpointTurn::Closed(closed),
        false => EndpointTurn::Waiting,
    })
}

/// [`endpoint_messages`] for a middlebox core: the key material and path message once both
/// are in; a refusal becomes a [`MiddleboxHandshakeEvent::RefusedByEndpoint`] in the wires'
/// events, after which any message is refused.
fn endpoint_keys<A: MiddleboxApp>(
    wires: &mut Wires<A>,
    sent_evidence: &'static str,
) -> Result<Option<(Box<KeyMaterial>, PathNews)>, HandshakeError> {
    if wires.endpoint_refused && wires.secondary.buffered() > 0 {
        return Err(HandshakeError::Protocol(
            "a message after the endpoint's refusal on the secondary session",
        ));
    }
    match endpoint_messages(&mut wires.secondary, &mut wires.path, sent_evidence)? {
        Some(FromEndpoint::Keys(km, path)) => Ok(Some((km, path))),
        Some(FromEndpoint::Refused(why)) => {
            wires.endpoint_refused = true;
            wires
                .events
                .push_back(MiddleboxHandshakeEvent::RefusedByEndpoint(why));
            // Whatever followed it in the same piece is refused now.
            endpoint_keys(wires, sent_evidence)
        }
        None => Ok(None),
    }
}

/// What the endpoint's messages on our secondary session came to.
pub(super) enum FromEndpoint {
    /// The key material and the path message before it (boxed: the refusal is small).
    Keys(Box<KeyMaterial>, PathNews),
    /// It refused us, saying why (its close follows).
    Refused(String),
}

/// The endpoint's messages on our secondary session so far: one path message (kept in
/// `path` until the rest arrives), then the key material, which must be the last thing on
/// the stream; or a refusal instead. `sent_evidence` is the error for evidence from the
/// endpoint.
pub(super) fn endpoint_messages(
    reader: &mut SecondaryReader,
    path: &mut Option<PathNews>,
    sent_evidence: &'static str,
) -> Result<Option<FromEndpoint>, HandshakeError> {
    loop {
        match reader.next_message()? {
            Some(SecondaryMessage::Path {
                far_neighbour_joined,
                ticket_wanted,
            }) if path.is_none() => {
                *path = Some(PathNews {
                    far: far_neighbour_joined,
                    ticket: ticket_wanted,
                })
            }
            Some(SecondaryMessage::Path { .. }) => {
                return Err(HandshakeError::Protocol("two path messages"))
            }
            Some(SecondaryMessage::KeyMaterial(_)) if reader.buffered() > 0 => {
                return Err(HandshakeError::Protocol(
                    "data after the key material on the secondary session",
                ))
            }
            Some(SecondaryMessage::KeyMaterial(km)) => {
                let path = path.ok_or(HandshakeError::Protocol(
                    "key material without a path message",
                ))?;
                return Ok(Some(FromEndpoint::Keys(km, path)));
            }
            Some(SecondaryMessage::Refused(_)) if path.is_some() => {
                return Err(HandshakeError::Protocol(
                    "a refusal after the path message on the secondary session",
                ))
            }
            Some(SecondaryMessage::Refused(why)) => return Ok(Some(FromEndpoint::Refused(why))),
            Some(SecondaryMessage::Evidence(_)) => {
                return Err(HandshakeError::Protocol(sent_evidence))
            }
            None => return Ok(None),
        }
    }
}

/// What the endpoint's path message said: whether a middlebox farther from it joined too
/// (`far`), and whether it wants our TLS 1.3 session ticket (`ticket`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct PathNews {
    pub(super) far: bool,
    pub(super) ticket: bool,
}

/// Why a middlebox's secondary session with its endpoint (`endpoint`: the client or the
/// server) failed, for its report: the endpoint's alert says whether it refused our
/// certificate or us, which the operator needs to know.
pub(super) fn why_secondary_failed(e: &EngineError, endpoint: Side) -> &'static str {
    // bad_certificate to certificate_unknown (RFC 8446 §6.2: 42 to 46), and unknown_ca.
    let refused_certificate = |a: AlertDescription| {
        (AlertDescription::BAD_CERTIFICATE.0..=AlertDescription::CERTIFICATE_UNKNOWN.0)
            .contains(&a.0)
            || a == AlertDescription::UNKNOWN_CA
    };
    match (e, endpoint) {
        (EngineError::AlertReceived { alert }, Side::Client) if refused_certificate(*alert) => {
            "the client refused our certificate; its own error says why"
        }
        (EngineError::AlertReceived { alert }, Side::Server) if refused_certificate(*alert) => {
            "the server refused our certificate; its own error says why"
        }
        (EngineError::AlertReceived { .. }, Side::Client) => {
            "the client ended the secondary session with an alert"
        }
        (EngineError::AlertReceived { .. }, Side::Server) => {
            "the server ended the secondary session with an alert"
        }
        _ => "secondary session failed",
    }
}

/// Reports that the evidence went out, and before it whether the session resumed (the
/// evidence is then empty).
pub(super) fn evidence_sent(events: &mut VecDeque<MiddleboxHandshakeEvent>, resumed: bool) {
    if resumed {
        events.push_back(MiddleboxHandshakeEvent::Resumed);
    }
    events.push_back(MiddleboxHandshakeEvent::EvidenceSent);
}

/// A middlebox's secondary server engine: no TLS 1.3 session ticket of its own accord (the
/// next record after its handshake is its switch marker; a ticket the endpoint wants is made
/// right before it, `Wires::send_marker`; TLS 1.2 tickets travel in the handshake), 0.5-RTT
/// enabled (TLS 1.3 evidence in the first flight), and no record larger than an encapsulated
/// record can carry, so that a long certificate chain or large evidence is split over more
/// records instead of failing the handshake.
pub(super) fn secondary_server_engine(
    cfg: &super::MiddleboxHandshakeConfig,
) -> Result<OpenSslEngine, &'static str> {
    let mut engine = cfg
        .tls
        .engine_without_tickets()
        .map_err(|_| "cannot create our TLS engine")?;
    engine
        .enable_half_rtt()
        .map_err(|_| "our secondary context is not a server")?;
    engine
        .set_max_send_fragment(crate::wire::MAX_INNER_PLAINTEXT_LEN)
        .map_err(|_| "cannot limit our TLS records to encapsulated records")?;
    Ok(engine)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::HopKeys;
    use mbx_record::{CipherSuite, TlsVersion};

    fn km() -> KeyMaterial {
        let s = CipherSuite::TLS13_AES_128_GCM_SHA256;
        KeyMaterial {
            version: TlsVersion::Tls13,
            suite: s,
            toward_client: HopKeys::generate(TlsVersion::Tls13, &s, 0, 1).unwrap(),
            toward_server: HopKeys::generate(TlsVersion::Tls13, &s, 2, 3).unwrap(),
        }
    }

    fn push(r: &mut SecondaryReader, m: SecondaryMessage) {
        r.push(&m.encode().unwrap());
    }

    /// A refusal is told once, as an event; anything after it on the secondary session is
    /// refused (a "joined and refused" middlebox could otherwise follow).
    #[test]
    fn nothing_may_follow_a_refusal() {
        let mut wires: Wires<mbx_apps::PassThrough> = Wires::new(Side::Server);
        push(
            &mut wires.secondary,
            SecondaryMessage::Refused("evidence refused".into()),
        );
        assert!(endpoint_keys(&mut wires, "e").unwrap().is_none());
        assert_eq!(
            wires.events.pop_front(),
            Some(MiddleboxHandshakeEvent::RefusedByEndpoint(
                "evidence refused".into()
            ))
        );
        push(
            &mut wires.secondary,
            SecondaryMessage::Path {
                far_neighbour_joined: false,
                ticket_wanted: false,
            },
        );
        let after = |r: Result<_, HandshakeError>| {
            let e = r.err().map(|e| e.to_string()).unwrap_or_default();
            assert!(e.contains("a message after the endpoint's refusal"), "{e}");
        };
        after(endpoint_keys(&mut wires, "e"));
        // Also when it comes in the same piece as the refusal (a path message, which is
        // taken otherwise).
        let mut wires: Wires<mbx_apps::PassThrough> = Wires::new(Side::Server);
        push(&mut wires.secondary, SecondaryMessage::Refused("no".into()));
        push(
            &mut wires.secondary,
            SecondaryMessage::Path {
                far_neighbour_joined: false,
                ticket_wanted: false,
            },
        );
        after(endpoint_keys(&mut wires, "e"));
    }

    #[test]
    fn path_then_key_material_and_nothing_else() {
        // Path, then key material: both taken.
        let (mut r, mut far) = (SecondaryReader::new(), None);
        push(
            &mut r,
            SecondaryMessage::Path {
                far_neighbour_joined: true,
                ticket_wanted: false,
            },
        );
        assert!(endpoint_messages(&mut r, &mut far, "e").unwrap().is_none());
        push(&mut r, SecondaryMessage::KeyMaterial(Box::new(km())));
        let Some(FromEndpoint::Keys(_, path)) = endpoint_messages(&mut r, &mut far, "e").unwrap()
        else {
            panic!("no key material");
        };
        assert_eq!(
            path,
            PathNews {
                far: true,
                ticket: false
            }
        );
        // A refusal instead: its text.
        let (mut r, mut far) = (SecondaryReader::new(), None);
        push(&mut r, SecondaryMessage::Refused("evidence refused".into()));
        assert!(matches!(
            endpoint_messages(&mut r, &mut far, "e").unwrap(),
            Some(FromEndpoint::Refused(why)) if why == "evidence refused"
        ));
        // Refused: key material without a path message, two path messages, a refusal after
        // the path message, anything after the key material, evidence.
        let path = || SecondaryMessage::Path {
            far_neighbour_joined: false,
            ticket_wanted: true,
        };
        let refused: [Vec<SecondaryMessage>; 5] = [
            vec![SecondaryMessage::KeyMaterial(Box::new(km()))],
            vec![path(), path()],
            vec![path(), SecondaryMessage::Refused("too late".into())],
            vec![
                path(),
                SecondaryMessage::KeyMaterial(Box::new(km())),
                path(),
            ],
            vec![SecondaryMessage::Evidence(b"e".to_vec())],
        ];
        for msgs in refused {
            let (mut r, mut far) = (SecondaryReader::new(), None);
            for m in msgs {
                push(&mut r, m);
            }
            assert!(endpoint_messages(&mut r, &mut far, "e").is_err());
        }
    }
}
