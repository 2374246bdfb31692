//! A client context's resumable sessions, by server name ([`crate::TlsConfig::resume_sessions`]).

use std::collections::{HashMap, VecDeque};
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
    inner: Mutex<Entries>,
}

#[derive(Default)]
struct Entries {
    by_name: HashMap<String, VecDeque<SslSession>>,
    /// Names, least recently given a session first.
    order: VecDeque<String>,
}

impl ClientSessions {
    /// Sessions for up to `names` server names (at least one).
    pub(super) fn new(names: usize) -> Self {
        ClientSessions {
            names: names.max(1),
            inner: Mutex::new(Entries::default()),
        }
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, Entries> {
        // Nothing here can panic half-way through an update; a poisoned lock is still sound.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A session the server of `name` gave us. A TLS 1.2 session replaces what was kept for
    /// the name; TLS 1.3 tickets queue up, newest last, the oldest dropped beyond the limit.
    pub(super) fn put(&self, name: &str, session: SslSession) {
        let mut e = self.entries();
        if let Some(at) = e.order.iter().position(|n| n == name) {
            e.order.remove(at);
        }
        e.order.push_back(name.to_owned());
        let kept = e.by_name.entry(name.to_owned()).or_default();
        if session.protocol_version() == SslVersion::TLS1_3 {
            kept.retain(|s| s.protocol_version() == SslVersion::TLS1_3);
            if kept.len() == TLS13_TICKETS_PER_NAME {
                kept.pop_front();
            }
        } else {
            kept.clear();
        }
        kept.push_back(session);
        while e.order.len() > self.names {
            if let Some(old) = e.order.pop_front() {
                e.by_name.remove(&old);
            }
        }
    }

    /// The session to offer to `name`: the newest TLS 1.3 ticket, which is given out only
    /// once, or the TLS 1.2 session, which stays for later connections.
    pub(super) fn offer(&self, name: &str) -> Option<SslSession> {
        let mut e = self.entries();
        let kept = e.by_name.get_mut(name)?;
        let newest = kept.back()?;
        if newest.protocol_version() != SslVersion::TLS1_3 {
            return Some(newest.clone());
        }
        let ticket = kept.pop_back();
        if kept.is_empty() {
            e.by_name.remove(name);
            e.order.retain(|n| n != name);
        }
        ticket
    }

    /// Drops what is kept for `name`.
    pub(super) fn forget(&self, name: &str) {
        let mut e = self.entries();
        e.by_name.remove(name);
        e.order.retain(|n| n != name);
    }
}
