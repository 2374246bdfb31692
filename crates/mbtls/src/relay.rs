//! A middlebox's data phase (sans-I/O): decrypt with the keys of the hop a record came from,
//! give the plaintext to the app, encrypt what the app returns with the keys of the other hop.
//!
//! Fail closed (architecture principle 5, spec "Data phase"): a record that cannot be framed or
//! authenticated is a fatal `bad_record_mac`. Nothing from it is forwarded; an alert goes to
//! each neighbour, sealed under that hop's keys; both directions are closed and all later input
//! is ignored. Alerts are re-protected per hop: close_notify ends one direction (after the app
//! has flushed it), a fatal alert ends the session.

use std::collections::VecDeque;
use std::ops::Range;

use mbx_apps::{CloseAlert, Direction, MiddleboxApp, Verdict};
use mbx_engine::AlertDescription;
use mbx_record::wipe::{wipe, wipe_vec};
use mbx_record::{ContentType, RecordError, TlsVersion};
use mbx_wire::record::MAX_PLAINTEXT_LEN;

use crate::error::MbtlsError;
use crate::hop::{for_each_record_at, Alert, Hop, Input, Side};
use crate::key_update::PostHandshake;
use crate::wire::KeyMaterial;

/// Why the session ended abnormally.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FailCause {
    /// A record from `from` failed framing or authentication.
    BadRecord { from: Side },
    /// `from` sent a fatal alert, which was forwarded to the other side.
    PeerAlert { from: Side },
    /// `from` sent something not allowed in the data phase.
    Protocol { from: Side, what: &'static str },
    /// The app closed the session, saying why if it did ([`MiddleboxApp::close_reason`]).
    App { why: Option<String> },
    /// Sealing failed locally (e.g. sequence numbers exhausted).
    Local,
}

/// What one side leaving without close_notify means ([`MiddleboxRelay::leaving`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leaving {
    /// The other side has not ended its direction (or the session failed): a cut.
    MidSession,
    /// After the other side's close_notify, with data or part of a record from this side
    /// since: it may have been cut.
    MayCut,
    /// After the other side's close_notify, with nothing from this side since: the session
    /// is over (HTTP clients leave so once the server has closed).
    Clean,
}

/// What happened, for the driver and for logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RelayEvent {
    /// The sender on `from` ended its direction with close_notify; it was forwarded.
    DirectionClosed { from: Side },
    /// A non-fatal alert from `from` was forwarded.
    AlertForwarded { from: Side, alert: Alert },
    /// `from` sent a KeyUpdate (TLS 1.3): it was forwarded, and both hops of that direction
    /// moved to their next keys.
    KeysUpdated { from: Side },
    /// The app ended the session in an orderly way; close_notify was sent to both sides. `why`:
    /// its [`MiddleboxApp::close_reason`], if it gave one.
    AppClosed { why: Option<String> },
    /// The session ended with `alert` (sent to both sides, or forwarded).
    Failed { cause: FailCause, alert: Alert },
}

/// The data phase of one middlebox between its client-side and server-side hops.
pub struct MiddleboxRelay<A: MiddleboxApp> {
    version: TlsVersion,
    client: Hop,
    server: Hop,
    app: A,
    out_client: Vec<u8>,
    out_server: Vec<u8>,
    /// Per receiving side: the sender ended its direction.
    ended_from_client: bool,
    ended_from_server: bool,
    /// Per sending side: application data came from it after the other side's close_notify
    /// (a half-close), so its leaving without close_notify may have cut that data.
    late_data_from_client: bool,
    late_data_from_server: bool,
    failed: bool,
    events: VecDeque<RelayEvent>,
    scratch: Vec<u8>,
    /// Post-handshake messages from each side (TLS 1.3), watched for KeyUpdates.
    post_handshake_from_client: PostHandshake,
    post_handshake_from_server: PostHandshake,
}

impl<A: MiddleboxApp> MiddleboxRelay<A> {
    /// A relay under the keys an endpoint sent this middlebox.
    pub fn new(keys: KeyMaterial, app: A) -> Result<Self, MbtlsError> {
        if keys.suite.version != keys.version {
            return Err(MbtlsError::KeyMaterial(
                "cipher suite does not match version",
            ));
        }
        let KeyMaterial {
            version,
            toward_client,
            toward_server,
            ..
        } = keys;
        Ok(MiddleboxRelay {
            version,
            client: Hop::new(version, toward_client.c2s, toward_client.s2c),
            server: Hop::new(version, toward_server.s2c, toward_server.c2s),
            app,
            out_client: Vec::new(),
            out_server: Vec::new(),
            ended_from_client: false,
            ended_from_server: false,
            late_data_from_client: false,
            late_data_from_server: false,
            failed: false,
            events: VecDeque::new(),
            scratch: Vec::new(),
            post_handshake_from_client: PostHandshake::new(),
            post_handshake_from_server: PostHandshake::new(),
        })
    }

    pub fn version(&self) -> TlsVersion {
        self.version
    }

    pub fn app(&self) -> &A {
        &self.app
    }

    /// True once both directions ended or the session failed.
    pub fn is_closed(&self) -> bool {
        self.failed || (self.ended_from_client && self.ended_from_server)
    }

    /// True once the sender on `from` ended its direction (close_notify), or the session failed.
    pub fn direction_ended(&self, from: Side) -> bool {
        self.failed || self.ended(from)
    }

    /// What `from` leaving now, without close_notify, means for the session.
    pub fn leaving(&self, from: Side) -> Leaving {
        if self.failed || !self.ended(from.other()) {
            Leaving::MidSession
        } else if self.sent_data_after_the_others_close(from) || self.has_partial_record(from) {
            Leaving::MayCut
        } else {
            Leaving::Clean
        }
    }

    /// True once the sender on `from` sent application data after the other side ended its
    /// direction with close_notify (part of [`leaving`](Self::leaving)). Until then, `from` leaving without close_notify of its own
    /// cut nothing this middlebox saw (HTTP clients close so once the server closed).
    pub fn sent_data_after_the_others_close(&self, from: Side) -> bool {
        match from {
            Side::Client => self.late_data_from_client,
            Side::Server => self.late_data_from_server,
        }
    }

    /// True while part of a record from `from` waits for the rest: that side leaving now
    /// would cut it (part of [`leaving`](Self::leaving)).
    pub fn has_partial_record(&self, from: Side) -> bool {
        self.hop_ref(from).has_pending()
    }

    pub fn is_failed(&self) -> bool {
        self.failed
    }

    /// Key fingerprints per side: (read, write). Identify hop keys in logs without revealing them.
    pub fn key_fingerprints(&self, side: Side) -> (Option<[u8; 8]>, Option<[u8; 8]>) {
        self.hop_ref(side).fingerprints()
    }

    /// Gives back memory kept for traffic that is over (a driver calls it on an idle
    /// connection): the output buffers beyond their bytes (their allocations come from swaps
    /// with the driver's and reach a read buffer's size), the sealing scratch, and the hops'
    /// incomplete-record buffers beyond what they hold. Nothing queued or buffered is lost.
    pub fn release_idle_buffers(&mut self) {
        // `shrink_to_fit` frees an empty buffer outright. Output is ciphertext, and the scratch
        // is always emptied (and wiped) after use, so no allocation left behind holds plaintext.
        self.out_client.shrink_to_fit();
        self.out_server.shrink_to_fit();
        self.scratch.shrink_to_fit();
        self.client.release_idle_buffer();
        self.server.release_idle_buffer();
        self.post_handshake_from_client.release_idle_buffer();
        self.post_handshake_from_server.release_idle_buffer();
    }

    /// Bytes of buffer capacity the relay holds (output, scratch, incomplete records and
    /// post-handshake messages): what [`release_idle_buffers`](Self::release_idle_buffers) can
    /// give back, and what it keeps.
    pub fn held_capacity(&self) -> usize {
        self.out_client.capacity()
            + self.out_server.capacity()
            + self.scratch.capacity()
            + self.client.pending_capacity()
            + self.server.pending_capacity()
            + self.post_handshake_from_client.held_capacity()
            + self.post_handshake_from_server.held_capacity()
    }

    /// Ciphertext to send to the neighbour on `to`.
    pub fn take_outgoing(&mut self, to: Side) -> Vec<u8> {
        core::mem::take(self.out(to))
    }

    /// Appends the ciphertext to send to the neighbour on `to` to `dst`. When `dst` is empty
    /// the buffers are swapped instead of copied, and `dst`'s allocation is reused for later
    /// output: a driver that hands back the same (emptied) buffers allocates nothing per call.
    pub fn append_outgoing(&mut self, to: Side, dst: &mut Vec<u8>) {
        append_or_swap(self.out(to), dst);
    }

    pub fn poll_event(&mut self) -> Option<RelayEvent> {
        self.events.pop_front()
    }

    /// Ciphertext arrived from the neighbour on `from`, split anywhere.
    pub fn receive(&mut self, from: Side, bytes: &[u8]) {
        self.receive_input(from, Input::Borrowed(bytes));
    }

    /// Like [`receive`](Self::receive), but records are decrypted where they lie in `bytes`
    /// (no copy); afterwards `bytes` holds no plaintext and its contents are unspecified.
    pub fn receive_in_place(&mut self, from: Side, bytes: &mut [u8]) {
        self.receive_input(from, Input::Lent(bytes));
    }

    /// Like [`receive_in_place`](Self::receive_in_place), and the application data records
    /// that lie whole in `bytes` and that the app lets through unchanged
    /// ([`MiddleboxApp::pass_unchanged`]) are sealed again for the other hop where they
    /// were opened, not copied: the returned range of `bytes` is then output toward
    /// `from.other()`, to be sent right after what
    /// [`append_outgoing`](Self::append_outgoing) gives for that side now (a driver sends
    /// that buffer instead of copying it). `bytes` holds no plaintext afterwards.
    pub fn receive_lending(&mut self, from: Side, bytes: &mut [u8]) -> Option<Range<usize>> {
        let to = from.other();
        let lent = self.receive_records(from, Input::Lent(&mut *bytes), true)?;
        let (range, mark) = lent;
        if self.out(to).len() == mark {
            return Some(range);
        }
        // Output for that side followed the records (e.g. an alert): they go first.
        let piece = bytes.get(range).unwrap_or_default();
        self.out(to).splice(mark..mark, piece.iter().copied());
        None
    }

    pub(crate) fn receive_input(&mut self, from: Side, input: Input<'_>) {
        self.receive_records(from, input, false);
    }

    /// Opens every complete record from `from` and handles it. `lend`: pass the data records the
    /// app lets through unchanged on where they lie in lent input; returns where those records
    /// are in it and how long the output toward the other side was when they started.
    fn receive_records(
        &mut self,
        from: Side,
        input: Input<'_>,
        lend: bool,
    ) -> Option<(Range<usize>, usize)> {
        if self.failed || self.ended(from) {
            return None;
        }
        let version = self.version;
        let mut lent: Option<(Range<usize>, usize)> = None;
        let mut pending = self.hop(from).take_pending();
        for_each_record_at(version, &mut pending, input, |record, at| {
            let Ok(record) = record else {
                self.bad_record(from);
                return false;
            };
            let opened = match self.hop(from).open_in_place(record) {
                Ok(o) => o,
                Err(_) => {
                    self.bad_record(from);
                    return false;
                }
            };
            if opened.content_type != ContentType::HANDSHAKE
                && self.post_handshake(from).mid_message()
            {
                let v = crate::key_update::INTERLEAVED;
                let what = v.what;
                self.fail_both(FailCause::Protocol { from, what }, Alert::fatal(v.alert));
                // Opened, so wiped as any record's plaintext.
                wipe(record.get_mut(opened.range).unwrap_or_default());
                return false;
            }
            if opened.content_type == ContentType::APPLICATION_DATA
                && !opened.range.is_empty()
                && self.ended(from.other())
            {
                match from {
                    Side::Client => self.late_data_from_client = true,
                    Side::Server => self.late_data_from_server = true,
                }
            }
            match at {
                Some(at) if lend && opened.content_type == ContentType::APPLICATION_DATA => {
                    self.pass_on_in_place(from, record, opened.range, at, &mut lent);
                }
                _ => {
                    if let Some(plaintext) = record.get_mut(opened.range) {
                        self.handle(from, opened.content_type, plaintext);
                        wipe(plaintext);
                    }
                }
            }
            !self.failed && !self.ended(from)
        });
        if self.failed || self.ended(from) {
            pending.clear();
        }
        self.hop(from).restore_pending(pending);
        lent
    }

    /// A data record opened in place at `at` of the lent input. When the app lets it through
    /// unchanged, it is sealed again for the other hop where it lies, and extends `lent` when
    /// it follows the run directly (otherwise its bytes are queued as usual); when the app
    /// stops it, nothing is passed on; otherwise the app's `on_data` runs on it.
    fn pass_on_in_place(
        &mut self,
        from: Side,
        record: &mut [u8],
        plaintext: Range<usize>,
        at: usize,
        lent: &mut Option<(Range<usize>, usize)>,
    ) {
        let to = from.other();
        let plain_len = plaintext.len();
        let Some(p) = record.get_mut(plaintext) else {
            return self.local_failure();
        };
        let Some(verdict) = self.app.pass_unchanged(direction(from), p) else {
            // Changed, or held back: the app's output is queued, sealed as usual.
            self.app_output(from, p);
            return wipe(p);
        };
        if verdict != Verdict::Continue {
            wipe(p);
            // Not passed on: the app stopped it.
            self.apply(verdict);
            return;
        }
        let sealed = {
            let (hop, _) = self.hop_and_out(to);
            hop.seal_record_in_place(ContentType::APPLICATION_DATA, record, plain_len)
        };
        let Ok(len) = sealed else {
            self.local_failure();
            return;
        };
        // A padded TLS 1.3 record comes out shorter and leaves bytes behind (its padding and
        // old tag), which then separate it from the next record: a run has no gaps.
        if let Some(rest) = record.get_mut(len..) {
            wipe(rest);
        }
        // Contiguous records only: any record handled otherwise in between (and queued, if
        // it produced output) breaks the run, so nothing queued can belong inside it.
        match lent {
            Some((range, _)) if range.end == at => range.end += len,
            None => *lent = Some((at..at + len, self.out(to).len())),
            Some(_) => self
                .out(to)
                .extend_from_slice(record.get(..len).unwrap_or_default()),
        }
    }

    fn handle(&mut self, from: Side, ct: ContentType, plaintext: &[u8]) {
        let dir = direction(from);
        match ct {
            // What the app lets through unchanged is passed on as it came.
            ContentType::APPLICATION_DATA => match self.app.pass_unchanged(dir, plaintext) {
                Some(Verdict::Continue) => self.forward_data(from.other(), plaintext),
                Some(stop) => self.apply(stop),
                None => self.app_output(from, plaintext),
            },
            ContentType::ALERT => match Alert::parse(plaintext) {
                None => self.fail_both(
                    FailCause::Protocol {
                        from,
                        what: "malformed alert",
                    },
                    Alert::fatal(AlertDescription::DECODE_ERROR),
                ),
                Some(a) if a.is_close_notify() => {
                    let mut out = Vec::new();
                    let verdict = self.app.on_end(dir, &mut out);
                    self.forward_data(from.other(), &out);
                    wipe_vec(&mut out);
                    self.set_ended(from);
                    self.seal_alert(from.other(), Alert::close_notify());
                    self.events.push_back(RelayEvent::DirectionClosed { from });
                    self.apply(verdict);
                }
                Some(a) if a.ends_session(self.version) => {
                    self.failed = true;
                    self.seal_alert(from.other(), a);
                    self.events.push_back(RelayEvent::Failed {
                        cause: FailCause::PeerAlert { from },
                        alert: a,
                    });
                }
                Some(a) => {
                    self.seal_alert(from.other(), a);
                    self.events
                        .push_back(RelayEvent::AlertForwarded { from, alert: a });
                }
            },
            // TLS 1.3 post-handshake messages (NewSessionTicket, KeyUpdate) belong to the
            // endpoints: pass them on re-protected. After a KeyUpdate, both hops of its
            // direction move to their next keys (see `key_update`).
            ContentType::HANDSHAKE if self.version == TlsVersion::Tls13 => {
                let update = match self.post_handshake(from).record(plaintext, |_| Ok(())) {
                    Ok(update) => update,
                    Err(v) => {
                        let what = v.what;
                        return self
                            .fail_both(FailCause::Protocol { from, what }, Alert::fatal(v.alert));
                    }
                };
                let to = from.other();
                let r = {
                    let (hop, out) = self.hop_and_out(to);
                    hop.seal_data(ContentType::HANDSHAKE, plaintext, out)
                };
                if r.is_err() {
                    return self.local_failure();
                }
                if update.is_some() {
                    let updated = self
                        .hop(to)
                        .update_write_keys()
                        .and_then(|()| self.hop(from).update_read_keys());
                    if updated.is_err() {
                        return self.local_failure();
                    }
                    self.events.push_back(RelayEvent::KeysUpdated { from });
                }
            }
            ContentType::HANDSHAKE => self.fail_both(
                FailCause::Protocol {
                    from,
                    what: crate::endpoint::RENEGOTIATION,
                },
                Alert::fatal(AlertDescription::UNEXPECTED_MESSAGE),
            ),
            _ => self.fail_both(
                FailCause::Protocol {
                    from,
                    what: "record type not allowed in the data phase",
                },
                Alert::fatal(AlertDescription::UNEXPECTED_MESSAGE),
            ),
        }
    }

    /// Runs the app's `on_data` on `plaintext` from `from` and seals its output for the other
    /// side.
    fn app_output(&mut self, from: Side, plaintext: &[u8]) {
        let (hop, out) = match from.other() {
            Side::Client => (&mut self.client, &mut self.out_client),
            Side::Server => (&mut self.server, &mut self.out_server),
        };
        let (verdict, sealed) = app_data(
            &mut self.app,
            direction(from),
            plaintext,
            hop,
            out,
            &mut self.scratch,
        );
        if sealed.is_err() {
            self.local_failure();
        }
        self.apply(verdict);
    }

    /// Act on what the app decided after its output was forwarded.
    fn apply(&mut self, verdict: Verdict) {
        match verdict {
            Verdict::Continue => {}
            Verdict::Close(CloseAlert(0)) => {
                for side in [Side::Client, Side::Server] {
                    if !self.ended(side.other()) {
                        self.seal_alert(side, Alert::close_notify());
                    }
                }
                self.ended_from_client = true;
                self.ended_from_server = true;
                let why = self.app.close_reason();
                self.events.push_back(RelayEvent::AppClosed { why });
            }
            Verdict::Close(CloseAlert(d)) => {
                let why = self.app.close_reason();
                self.fail_both(FailCause::App { why }, Alert::fatal(AlertDescription(d)))
            }
        }
    }

    fn bad_record(&mut self, from: Side) {
        self.fail_both(
            FailCause::BadRecord { from },
            Alert::fatal(AlertDescription::BAD_RECORD_MAC),
        );
    }

    /// Send `alert` to both neighbours, each under its own hop's keys, and stop.
    fn fail_both(&mut self, cause: FailCause, alert: Alert) {
        self.failed = true;
        for side in [Side::Client, Side::Server] {
            self.seal_alert(side, alert);
        }
        self.events.push_back(RelayEvent::Failed { cause, alert });
    }

    fn local_failure(&mut self) {
        self.fail_both(
            FailCause::Local,
            Alert::fatal(AlertDescription::INTERNAL_ERROR),
        );
    }

    fn forward_data(&mut self, to: Side, data: &[u8]) {
        if data.is_empty() || self.failed {
            return;
        }
        let r = {
            let (hop, out) = self.hop_and_out(to);
            hop.seal_data(ContentType::APPLICATION_DATA, data, out)
        };
        if r.is_err() {
            self.local_failure();
        }
    }

    /// Best effort: if even the alert cannot be sealed, the session is failed anyway.
    fn seal_alert(&mut self, to: Side, alert: Alert) {
        let (hop, out) = self.hop_and_out(to);
        if hop.seal_alert(alert, out).is_err() {
            self.failed = true;
        }
    }

    fn ended(&self, from: Side) -> bool {
        match from {
            Side::Client => self.ended_from_client,
            Side::Server => self.ended_from_server,
        }
    }

    fn set_ended(&mut self, from: Side) {
        match from {
            Side::Client => self.ended_from_client = true,
            Side::Server => self.ended_from_server = true,
        }
    }

    fn hop(&mut self, side: Side) -> &mut Hop {
        match side {
            Side::Client => &mut self.client,
            Side::Server => &mut self.server,
        }
    }

    fn post_handshake(&mut self, from: Side) -> &mut PostHandshake {
        match from {
            Side::Client => &mut self.post_handshake_from_client,
            Side::Server => &mut self.post_handshake_from_server,
        }
    }

    fn hop_ref(&self, side: Side) -> &Hop {
        match side {
            Side::Client => &self.client,
            Side::Server => &self.server,
        }
    }

    fn out(&mut self, side: Side) -> &mut Vec<u8> {
        match side {
            Side::Client => &mut self.out_client,
            Side::Server => &mut self.out_server,
        }
    }

    fn hop_and_out(&mut self, side: Side) -> (&mut Hop, &mut Vec<u8>) {
        match side {
            Side::Client => (&mut self.client, &mut self.out_client),
            Side::Server => (&mut self.server, &mut self.out_server),
        }
    }
}

impl<A: MiddleboxApp> core::fmt::Debug for MiddleboxRelay<A> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("MiddleboxRelay")
            .field("client", &self.client)
            .field("server", &self.server)
            .field("failed", &self.failed)
            .finish_non_exhaustive()
    }
}

/// What an app may add to a record's plaintext (e.g. a header it inserts) without making the
/// output queue reallocate while it holds plaintext.
const APP_HEADROOM: usize = 1024;

/// Runs the app on `plaintext` with its output going straight into `out` (the ciphertext queue
/// toward the next hop), behind room for the record header, and seals it there: no copy of the
/// app's output. Output larger than one record is moved to `scratch` and sealed in pieces.
/// Plaintext is never left in `out` or `scratch`.
fn app_data<A: MiddleboxApp>(
    app: &mut A,
    dir: Direction,
    plaintext: &[u8],
    hop: &mut Hop,
    out: &mut Vec<u8>,
    scratch: &mut Vec<u8>,
) -> (Verdict, Result<(), RecordError>) {
    let start = out.len();
    let body = start + hop.seal_prefix_len();
    // Room for the app's output and the trailer: no reallocation, which would leave plaintext
    // in freed memory. An app that outputs up to `APP_HEADROOM` more than it got (a header it
    // inserts) fits; one that outputs more may still cause one.
    out.reserve(body - start + plaintext.len() + APP_HEADROOM + hop.seal_suffix_len());
    out.resize(body, 0);
    let verdict = app.on_data(dir, plaintext, out);
    let sealed = match out.len().checked_sub(body) {
        // The app removed bytes it had not appended: nothing sensible can be sent any more.
        None => {
            if let Some(tail) = out.get_mut(start..) {
                wipe(tail);
            }
            out.truncate(start);
            Err(RecordError::EncryptFailed)
        }
        Some(0) => {
            out.truncate(start);
            Ok(())
        }
        Some(n) if n <= MAX_PLAINTEXT_LEN => {
            hop.seal_in_place(ContentType::APPLICATION_DATA, out, start)
        }
        Some(_) => {
            scratch.extend_from_slice(out.get(body..).unwrap_or_default());
            if let Some(tail) = out.get_mut(start..) {
                wipe(tail);
            }
            out.truncate(start);
            let r = hop.seal_data(ContentType::APPLICATION_DATA, scratch, out);
            wipe_vec(scratch);
            r
        }
    };
    (verdict, sealed)
}

/// Moves `src` to the end of `dst`: a swap when `dst` is empty (its allocation goes to `src`),
/// a copy otherwise. `src` is left empty.
pub(crate) fn append_or_swap(src: &mut Vec<u8>, dst: &mut Vec<u8>) {
    if dst.is_empty() {
        core::mem::swap(src, dst);
    } else {
        dst.extend_from_slice(src);
        src.clear();
    }
}

/// Data received from `from` travels in this direction.
fn direction(from: Side) -> Direction {
    match from {
        Side::Client => Direction::ClientToServer,
        Side::Server => Direction::ServerToClient,
    }
}
