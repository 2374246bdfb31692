//! What a middlebox or an endpoint keeps of a peer's data until keys (or its middleboxes'
//! sessions) let it pass on: one bound for all of them.

use mbx_wire::Record;

use super::HandshakeError;

/// Application data a middlebox keeps before its keys arrive: a server-side one the client's
/// records it forwards raw (and copies), a client-side one the server's records it copies or
/// holds; and what an endpoint's paused engine keeps between the primary handshake and the
/// data phase. More fails the session. It is what a peer can send in about one round trip
/// between the middlebox and the endpoint whose keys it waits for; without a bound the two
/// endpoints of one session could have a middlebox keep all they send until its handshake
/// timeout.
pub const MAX_COPIED_BYTES: usize = 16 * 1024 * 1024;

/// What keeping one record counts against [`MAX_COPIED_BYTES`] beyond its own bytes: its
/// handle and allocation (about 64 bytes), and the trial opening it may cost when the keys
/// arrive. Without it a peer could have millions of empty records kept within the bound.
const KEPT_RECORD_COST: usize = 256;

/// From this much kept (records' own bytes and their cost), a middlebox stops reading from the
/// side whose data it keeps until its keys arrive, and TCP makes that side wait: a peer that
/// never sends the keys' flight cannot have it keep [`MAX_COPIED_BYTES`] of what the other side
/// sends (found in an adversarial trial: a client that joined a middlebox, had the server send
/// a 15 MB file and never sent key material made it keep 15 MB per connection, 3 GB with 200).
/// Far above what an honest session keeps before the keys (a handshake flight, tickets, a first
/// answer), and below what a data-phase connection with a slow reader holds (≈ 0.5 MB,
/// docs/mbtls.md §9).
pub const PAUSE_READING_AT: usize = 256 * 1024;

/// Bytes kept so far, against [`MAX_COPIED_BYTES`].
#[derive(Debug, Default)]
pub(super) struct Kept(usize);

impl Kept {
    /// One more record kept as a record of its own. `too_much`: the error once past the bound.
    pub(super) fn record(
        &mut self,
        rec: &Record,
        too_much: &'static str,
    ) -> Result<(), HandshakeError> {
        self.bytes(rec.as_bytes().len() + KEPT_RECORD_COST, too_much)
    }

    /// Whether [`PAUSE_READING_AT`] is reached.
    pub(super) fn asks_for_a_pause(&self) -> bool {
        self.0 >= PAUSE_READING_AT
    }

    /// `n` more bytes kept in a buffer that holds them all.
    pub(super) fn bytes(&mut self, n: usize, too_much: &'static str) -> Result<(), HandshakeError> {
        self.0 = self.0.saturating_add(n);
        if self.0 > MAX_COPIED_BYTES {
            return Err(HandshakeError::Protocol(too_much));
        }
        Ok(())
    }
}
