//! Client session resumption that waits for the application's word: a rustls client's
//! sessions become resumable only once the caller vouched for the connection they came from
//! ([`crate::TlsEngine::vouch_for_session`]), and each carries the note the caller gave then.
//!
//! Why: an mbTLS endpoint checks more than TLS does before it trusts a middlebox (its
//! exporter-bound evidence, its approval). A ticket from a middlebox that failed those checks
//! must never let a later connection skip them, and a resumed connection must know what the
//! connection it resumes had established (the evidence's claims). rustls's store sees only
//! server names, never connections, so each connection gets its own [`SessionCapture`] in
//! front of the context's shared [`VouchedSessions`]: lookups go to the shared store, what the
//! server gives is held in the capture until the caller vouches.
//!
//! Each vouched session also carries the time until which the caller will accept it (for an
//! mbTLS endpoint, until its check of the middlebox's evidence grows too old): lookups skip,
//! and drop, sessions past it, so a connection offers only what its caller can still accept
//! and does a full handshake otherwise. The time is read from the system clock, the clock
//! rustls's own ticket ages and certificate checks read.

use std::any::Any;
use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use rustls::client::{ClientSessionStore, Tls12ClientSessionValue, Tls13ClientSessionValue};
use rustls::pki_types::{ServerName, UnixTime};
use rustls::NamedGroup;

/// What the caller knew about a connection when it vouched for it; handed back, unchanged, to
/// the connections that resume its sessions.
pub type SessionNote = Arc<dyn Any + Send + Sync>;

/// TLS 1.3 tickets kept per server name (each is offered once, RFC 8446 §C.4).
const TICKETS_PER_NAME: usize = 4;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A vouched session's note and the time (seconds since the Unix epoch, exclusive) until which
/// its caller accepts it.
#[derive(Clone)]
struct Vouch {
    note: SessionNote,
    valid_until: u64,
}

impl Vouch {
    fn valid_at(&self, now: u64) -> bool {
        now < self.valid_until
    }
}

/// What one server name left: its newest TLS 1.2 session, its TLS 1.3 tickets (oldest first),
/// and the key-exchange group it chose last.
#[derive(Default)]
struct NameEntry {
    tls12: Option<(Tls12ClientSessionValue, Vouch)>,
    tls13: VecDeque<(Tls13ClientSessionValue, Vouch)>,
    kx_hint: Option<NamedGroup>,
}

/// The sessions of up to `capacity` server names, shared by a context's connections; the
/// least recently used name goes first.
pub(crate) struct VouchedSessions {
    capacity: usize,
    /// Most recently used last. Linear search: a secondary-session context meets a few names.
    names: Mutex<Vec<(ServerName<'static>, NameEntry)>>,
}

impl VouchedSessions {
    pub(crate) fn new(capacity: usize) -> Self {
        VouchedSessions {
            capacity,
            names: Mutex::new(Vec::new()),
        }
    }

    /// Runs `f` on `name`'s entry (made if `create`), which becomes the most recently used.
    fn with_entry<R>(
        &self,
        name: &ServerName<'_>,
        create: bool,
        f: impl FnOnce(&mut NameEntry) -> R,
    ) -> Option<R> {
        let mut names = lock(&self.names);
        let entry = match names.iter().position(|(n, _)| n == name) {
            Some(i) => {
                let e = names.remove(i);
                names.push(e);
                names.last_mut()
            }
            None if create => {
                if names.len() >= self.capacity {
                    names.remove(0);
                }
                names.push((name.to_owned(), NameEntry::default()));
                names.last_mut()
            }
            None => None,
        };
        entry.map(|(_, e)| f(e))
    }

    fn put_tls12(&self, name: ServerName<'static>, value: Tls12ClientSessionValue, vouch: Vouch) {
        self.with_entry(&name, true, |e| e.tls12 = Some((value, vouch)));
    }

    fn put_tls13(&self, name: ServerName<'static>, value: Tls13ClientSessionValue, vouch: Vouch) {
        self.with_entry(&name, true, |e| {
            if e.tls13.len() >= TICKETS_PER_NAME {
                e.tls13.pop_front();
            }
            e.tls13.push_back((value, vouch));
        });
    }

    /// How many TLS 1.2 sessions and TLS 1.3 tickets are kept for `name` (tests, reports).
    pub(crate) fn count(&self, name: &str) -> usize {
        let Ok(name) = ServerName::try_from(name) else {
            return 0;
        };
        lock(&self.names)
            .iter()
            .find(|(n, _)| *n == name)
            .map_or(0, |(_, e)| usize::from(e.tls12.is_some()) + e.tls13.len())
    }
}

/// What one connection's server gave before its caller vouched, and what it was offered.
#[derive(Default)]
struct CaptureState {
    /// Set by [`SessionCapture::vouch`]: from then on sessions go to the shared store.
    vouched: Option<Vouch>,
    held_tls12: Option<(ServerName<'static>, Tls12ClientSessionValue)>,
    held_tls13: Vec<(ServerName<'static>, Tls13ClientSessionValue)>,
    /// The notes of the TLS 1.3 ticket / TLS 1.2 session offered in our ClientHello.
    offered_tls13: Option<SessionNote>,
    offered_tls12: Option<SessionNote>,
}

/// One connection's view of a [`VouchedSessions`] (the `ClientSessionStore` of its own
/// rustls configuration).
pub(crate) struct SessionCapture {
    shared: Arc<VouchedSessions>,
    state: Mutex<CaptureState>,
}

impl SessionCapture {
    pub(crate) fn new(shared: Arc<VouchedSessions>) -> Self {
        SessionCapture {
            shared,
            state: Mutex::new(CaptureState::default()),
        }
    }

    /// Makes what this connection's server gave, and gives from now on, resumable with `note`
    /// until `valid_until` (seconds since the Unix epoch, exclusive).
    pub(crate) fn vouch(&self, note: SessionNote, valid_until: u64) {
        let vouch = Vouch { note, valid_until };
        let mut st = lock(&self.state);
        if let Some((name, value)) = st.held_tls12.take() {
            self.shared.put_tls12(name, value, vouch.clone());
        }
        for (name, value) in st.held_tls13.drain(..) {
            self.shared.put_tls13(name, value, vouch.clone());
        }
        st.vouched = Some(vouch);
    }

    /// The note of the session offered for `version`, if one was.
    pub(crate) fn offered_note(&self, tls13: bool) -> Option<SessionNote> {
        let st = lock(&self.state);
        if tls13 {
            st.offered_tls13.clone()
        } else {
            st.offered_tls12.clone()
        }
    }
}

impl fmt::Debug for SessionCapture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SessionCapture")
    }
}

impl ClientSessionStore for SessionCapture {
    fn set_kx_hint(&self, server_name: ServerName<'static>, group: NamedGroup) {
        // Only a name that already has a vouched session: an unvouched connection leaves
        // nothing behind.
        self.shared
            .with_entry(&server_name, false, |e| e.kx_hint = Some(group));
    }

    fn kx_hint(&self, server_name: &ServerName<'_>) -> Option<NamedGroup> {
        self.shared
            .with_entry(server_name, false, |e| e.kx_hint)
            .flatten()
    }

    fn set_tls12_session(&self, server_name: ServerName<'static>, value: Tls12ClientSessionValue) {
        let mut st = lock(&self.state);
        match st.vouched.clone() {
            Some(vouch) => self.shared.put_tls12(server_name, value, vouch),
            None => st.held_tls12 = Some((server_name, value)),
        }
    }

    fn tls12_session(&self, server_name: &ServerName<'_>) -> Option<Tls12ClientSessionValue> {
        let now = UnixTime::now().as_secs();
        let (value, vouch) = self
            .shared
            .with_entry(server_name, false, |e| {
                // One past its time is of no use to anyone: it goes.
                e.tls12.take_if(|(_, v)| !v.valid_at(now));
                e.tls12.clone()
            })
            .flatten()?;
        lock(&self.state).offered_tls12 = Some(vouch.note);
        Some(value)
    }

    fn remove_tls12_session(&self, server_name: &ServerName<'static>) {
        self.shared
            .with_entry(server_name, false, |e| e.tls12 = None);
        lock(&self.state).held_tls12 = None;
    }

    fn insert_tls13_ticket(
        &self,
        server_name: ServerName<'static>,
        value: Tls13ClientSessionValue,
    ) {
        let mut st = lock(&self.state);
        match st.vouched.clone() {
            Some(vouch) => self.shared.put_tls13(server_name, value, vouch),
            None => {
                // A server may send any number of tickets; keep what would be kept anyway.
                if st.held_tls13.len() >= TICKETS_PER_NAME {
                    st.held_tls13.remove(0);
                }
                st.held_tls13.push((server_name, value));
            }
        }
    }

    fn take_tls13_ticket(
        &self,
        server_name: &ServerName<'static>,
    ) -> Option<Tls13ClientSessionValue> {
        let now = UnixTime::now().as_secs();
        let (value, vouch) = self
            .shared
            .with_entry(server_name, false, |e| {
                // Every ticket past its time goes (the newest need not be the longest valid:
                // a resumed connection's tickets keep the time of the one it resumed).
                e.tls13.retain(|(_, v)| v.valid_at(now));
                e.tls13.pop_back()
            })
            .flatten()?;
        lock(&self.state).offered_tls13 = Some(vouch.note);
        Some(value)
    }
}
