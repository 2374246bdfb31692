//! A client context's resumable sessions, by server name ([`crate::TlsConfig::resume_sessions`]).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use openssl::ssl::{SslSession, SslVersion};

/// TLS 1.3 tickets kept per name: enough for a few connections opened at once, each of which
/// takes one (a server sends one or more with every handshake).
const TLS13_TICKETS_PER_NAME: usize = 4;

/// Sessions OpenSSL handed out (its new-session callback), offered again for the same name.
/// OpenSSL's own client cache is left off: it stores nothing for clients anyway, and the
/// context twin without the key log (see `OpenSslContext::forgo_export`) must share these.
pub(super) struct ClientSessions {
    names: usize,
    /// Per name, its sessions (newest last); names least recently given a session first. A
    /// context meets few names, so a list searched in order is all the index it needs.
    kept: Mutex<VecDeque<(String, VecDeque<SslSession>)>>,
    /// How many times a name was forgotten: a connection made before the latest forget may
    /// hold a forgotten session, which its renewal must not bring back.
    forgets: AtomicU64,
}

impl ClientSessions {
    /// Sessions for up to `names` server names (at least one).
    pub(super) fn new(names: usize) -> Self {
        ClientSessions {
            names: names.max(1),
            kept: Mutex::new(VecDeque::new()),
            forgets: AtomicU64::new(0),
        }
    }

    fn kept(&self) -> std::sync::MutexGuard<'_, VecDeque<(String, VecDeque<SslSession>)>> {
        // Nothing here can panic half-way through an update; a poisoned lock is still sound.
        self.kept.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A session the server of `name` gave us. A TLS 1.2 session replaces what was kept for
    /// the name; TLS 1.3 tickets queue up, newest last, the oldest dropped beyond the limit.
    pub(super) fn put(&self, name: &str, session: SslSession) {
        self.put_into(&mut self.kept(), name, session);
    }

    fn put_into(
        &self,
        kept: &mut VecDeque<(String, VecDeque<SslSession>)>,
        name: &str,
        session: SslSession,
    ) {
        let mut sessions = match kept.iter().position(|(n, _)| n == name) {
            Some(at) => kept.remove(at).map(|(_, s)| s).unwrap_or_default(),
            None => VecDeque::new(),
        };
        if session.protocol_version() == SslVersion::TLS1_3 {
            sessions.retain(|s| s.protocol_version() == SslVersion::TLS1_3);
            if sessions.len() == TLS13_TICKETS_PER_NAME {
                sessions.pop_front();
            }
        } else {
            sessions.clear();
        }
        sessions.push_back(session);
        kept.push_back((name.to_owned(), sessions));
        while kept.len() > self.names {
            kept.pop_front();
        }
    }

    /// The session to offer to `name`: the newest TLS 1.3 ticket, which is given out only
    /// once, or the TLS 1.2 session, which stays for later connections.
    pub(super) fn offer(&self, name: &str) -> Option<SslSession> {
        let mut kept = self.kept();
        let at = kept.iter().position(|(n, _)| n == name)?;
        let sessions = &mut kept.get_mut(at)?.1;
        let newest = sessions.back()?;
        if newest.protocol_version() != SslVersion::TLS1_3 {
            return Some(newest.clone());
        }
        let ticket = sessions.pop_back();
        if sessions.is_empty() {
            kept.remove(at);
        }
        ticket
    }

    /// Drops what is kept for `name`.
    pub(super) fn forget(&self, name: &str) {
        let mut kept = self.kept();
        kept.retain(|(n, _)| n != name);
        self.forgets.fetch_add(1, Ordering::SeqCst);
    }

    /// Counts forgets, for [`put_renewed`](Self::put_renewed).
    pub(super) fn forgets(&self) -> u64 {
        self.forgets.load(Ordering::SeqCst)
    }

    /// A TLS 1.2 session a connection resumed (and its server may have renewed), from a
    /// connection made when [`forgets`](Self::forgets) read `forgets_then`: kept unless a name
    /// was forgotten since, since the session it resumed may be the one forgotten (any name's
    /// forget counts: a renewal then goes unkept, and the next connection makes a full
    /// handshake at worst).
    pub(super) fn put_renewed(&self, name: &str, session: SslSession, forgets_then: u64) {
        // Under the lock, which a forget takes too: none can fall between check and put.
        let mut kept = self.kept();
        if self.forgets() == forgets_then {
            self.put_into(&mut kept, name, session);
        }
    }
}
