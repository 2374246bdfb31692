//! A client context's resumable sessions, by server name ([`crate::TlsConfig::resume_sessions`]).

use std::collections::VecDeque;
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
}

impl ClientSessions {
    /// Sessions for up to `names` server names (at least one).
    pub(super) fn new(names: usize) -> Self {
        ClientSessions {
            names: names.max(1),
            kept: Mutex::new(VecDeque::new()),
        }
    }

    fn kept(&self) -> std::sync::MutexGuard<'_, VecDeque<(String, VecDeque<SslSession>)>> {
        // Nothing here can panic half-way through an update; a poisoned lock is still sound.
        self.kept.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A session the server of `name` gave us. A TLS 1.2 session replaces what was kept for
    /// the name; TLS 1.3 tickets queue up, newest last, the oldest dropped beyond the limit.
    pub(super) fn put(&self, name: &str, session: SslSession) {
        let mut kept = self.kept();
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
        self.kept().retain(|(n, _)| n != name);
    }
}
