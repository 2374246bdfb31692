//! Session-ticket keys that a server context makes itself and replaces on a schedule
//! ([`crate::TlsConfig::ticket_key_rotation`]).
//!
//! Why: OpenSSL's own ticket key lives as long as its context. Whoever obtains it can open
//! every ticket the context ever issued: read a resumed TLS 1.2 session's master secret (such a
//! session has no fresh key exchange), or pose as the server to a client that resumes (for an
//! mbTLS middlebox, whose resumed secondary sessions carry no new evidence, that is the ticket
//! key standing in for its attestation). Replacing the key bounds both to a few periods.
//!
//! Keys belong to epochs of one period each, counted from the context's creation: a ticket is
//! sealed under the current epoch's key and opens during that epoch and the next (OpenSSL then
//! renews it under the current key), so it opens for between one and two periods. A key is
//! wiped when it leaves. Epochs advance with the clock as tickets are sealed or opened, or by
//! hand ([`TicketKeys::rotate`]). The cryptography is OpenSSL's (AES-256-CBC and
//! HMAC-SHA256 over its own ticket format, `ffi::ticket_key_cb`); here are only the keys.

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use openssl::error::ErrorStack;
use zeroize::Zeroizing;

/// One epoch's key: its public name (sent in every ticket, to find the key again) and the
/// secret AES-256 and HMAC-SHA256 keys.
#[derive(Clone)]
pub(super) struct TicketKey {
    epoch: u64,
    pub(super) name: [u8; 16],
    pub(super) aes: Zeroizing<[u8; 32]>,
    pub(super) hmac: Zeroizing<[u8; 32]>,
}

impl TicketKey {
    fn generate(epoch: u64) -> Result<Self, ErrorStack> {
        let mut key = TicketKey {
            epoch,
            name: [0; 16],
            aes: Zeroizing::new([0; 32]),
            hmac: Zeroizing::new([0; 32]),
        };
        openssl::rand::rand_bytes(&mut key.name)?;
        openssl::rand::rand_bytes(key.aes.as_mut())?;
        openssl::rand::rand_bytes(key.hmac.as_mut())?;
        Ok(key)
    }
}

/// The keys of the current and the previous epoch.
struct Ring {
    current: TicketKey,
    previous: Option<TicketKey>,
    /// Epochs skipped by hand ([`TicketKeys::rotate`]).
    skipped: u64,
}

impl Ring {
    /// The first epoch's key.
    fn new() -> Result<Self, ErrorStack> {
        Ok(Ring {
            current: TicketKey::generate(0)?,
            previous: None,
            skipped: 0,
        })
    }

    /// Brings the keys to `epoch`: the current key becomes the previous one if it is one epoch
    /// old, and goes if older.
    fn advance(&mut self, epoch: u64) -> Result<(), ErrorStack> {
        if self.current.epoch >= epoch {
            return Ok(());
        }
        let old = std::mem::replace(&mut self.current, TicketKey::generate(epoch)?);
        self.previous = (old.epoch + 1 == epoch).then_some(old);
        Ok(())
    }
}

/// A server context's ticket keys ([`crate::TlsConfig::ticket_key_rotation`]).
pub(crate) struct TicketKeys {
    period: Duration,
    start: Instant,
    ring: Mutex<Ring>,
}

impl TicketKeys {
    pub(crate) fn new(period: Duration) -> Result<Self, ErrorStack> {
        Ok(TicketKeys {
            // A zero period would make every ticket's key the last one at once.
            period: period.max(Duration::from_secs(1)),
            start: Instant::now(),
            ring: Mutex::new(Ring::new()?),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Ring> {
        self.ring.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The keys, brought to the epoch of this moment.
    fn ring_now(&self) -> Result<MutexGuard<'_, Ring>, ErrorStack> {
        let mut ring = self.lock();
        let epoch = self.epoch(&ring, Instant::now());
        ring.advance(epoch)?;
        Ok(ring)
    }

    /// The epoch at `now`, hand-made rotations included.
    fn epoch(&self, ring: &Ring, now: Instant) -> u64 {
        let elapsed = now.saturating_duration_since(self.start).as_nanos();
        let by_clock = u64::try_from(elapsed / self.period.as_nanos()).unwrap_or(u64::MAX);
        by_clock.saturating_add(ring.skipped)
    }

    /// The key to seal a new ticket under.
    pub(super) fn sealing_key(&self) -> Result<TicketKey, ErrorStack> {
        Ok(self.ring_now()?.current.clone())
    }

    /// The key named `name`, if it is still kept, and whether it is the current one (a
    /// ticket under the previous key is renewed).
    pub(super) fn opening_key(&self, name: &[u8]) -> Result<Option<(TicketKey, bool)>, ErrorStack> {
        let ring = self.ring_now()?;
        let found = [(Some(&ring.current), true), (ring.previous.as_ref(), false)]
            .into_iter()
            .find_map(|(k, current)| k.filter(|k| k.name == name).map(|k| (k.clone(), current)));
        Ok(found)
    }

    /// Starts a new epoch now: tickets sealed before open until the next one starts, those
    /// of the epoch before never again.
    pub(crate) fn rotate(&self) -> Result<(), ErrorStack> {
        self.lock().skipped += 1;
        self.ring_now().map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A key is current in its epoch, previous in the next, gone after; a skipped epoch takes
    /// both away.
    #[test]
    fn keys_live_for_their_epoch_and_the_next() {
        let mut ring = Ring::new().unwrap();
        ring.advance(0).unwrap();
        let first = ring.current.name;
        ring.advance(0).unwrap();
        assert_eq!(ring.current.name, first);
        assert!(ring.previous.is_none());
        ring.advance(1).unwrap();
        let second = ring.current.name;
        assert_ne!(second, first);
        assert_eq!(ring.previous.as_ref().unwrap().name, first);
        ring.advance(2).unwrap();
        assert_eq!(ring.previous.as_ref().unwrap().name, second);
        ring.advance(4).unwrap();
        assert!(ring.previous.is_none());
        // Time does not run backwards for the ring.
        let now = ring.current.name;
        ring.advance(3).unwrap();
        assert_eq!(ring.current.name, now);
    }

    proptest::proptest! {
        /// Whatever epochs the clock and the hand give, in whatever order: the current key is
        /// the newest epoch's, the previous one is kept only if it is exactly one epoch older,
        /// and a key never comes back once it left.
        #[test]
        fn only_the_newest_epoch_and_the_one_before_are_kept(
            epochs in proptest::collection::vec(0u64..12, 1..24)
        ) {
            let mut ring = Ring::new().unwrap();
            let mut newest = 0;
            let mut gone = std::collections::HashSet::new();
            for e in epochs {
                let before = ring.current.name;
                ring.advance(e).unwrap();
                newest = newest.max(e);
                let current = &ring.current;
                proptest::prop_assert_eq!(current.epoch, newest);
                if let Some(p) = &ring.previous {
                    proptest::prop_assert_eq!(p.epoch + 1, current.epoch);
                }
                let kept: Vec<[u8; 16]> = [Some(&ring.current), ring.previous.as_ref()]
                    .into_iter()
                    .flatten()
                    .map(|k| k.name)
                    .collect();
                if !kept.contains(&before) {
                    gone.insert(before);
                }
                proptest::prop_assert!(kept.iter().all(|n| !gone.contains(n)));
            }
        }
    }

    #[test]
    fn a_hand_made_rotation_keeps_the_previous_key_once() {
        let keys = TicketKeys::new(Duration::from_secs(3600)).unwrap();
        let first = keys.sealing_key().unwrap();
        assert!(keys.opening_key(&first.name).unwrap().unwrap().1);
        keys.rotate().unwrap();
        let second = keys.sealing_key().unwrap();
        assert_ne!(second.name, first.name);
        let (k, current) = keys.opening_key(&first.name).unwrap().unwrap();
        assert!(!current);
        assert_eq!(*k.aes, *first.aes);
        keys.rotate().unwrap();
        assert!(keys.opening_key(&first.name).unwrap().is_none());
        assert!(keys.opening_key(&[0; 16]).unwrap().is_none());
    }
}
