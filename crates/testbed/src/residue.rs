//! Looking for leftover copies of a secret in this process's memory, for tests that check
//! secrets are wiped: after a session ends, no readable page of the process (heap, stacks,
//! library data, freed allocations included) may still hold them.
//!
//! The secret is given *masked* (each byte XORed with a mask), so that the test and the scan
//! never hold it in the clear themselves: the scan unmasks byte by byte while comparing.
//! Linux only (`/proc/self/maps`, `/proc/self/mem`).

use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::FileExt;

use zeroize::Zeroize;

/// A secret's bytes XORed with `mask`. [`Masked::unmask_into`] rebuilds it where a test needs
/// it (and must wipe it afterwards).
#[derive(Clone, Debug)]
pub struct Masked {
    pub masked: Vec<u8>,
    pub mask: u8,
}

impl Masked {
    /// A random-looking marker of `len` bytes, never held unmasked. Seeded from std's
    /// `RandomState` (random per process, new keys per call): unique is all it has to be.
    pub fn fresh(len: usize) -> Masked {
        use std::hash::BuildHasher;
        let mut x = std::collections::hash_map::RandomState::new().hash_one(len) | 1;
        let masked = (0..len)
            .map(|_| {
                // xorshift64: plenty for a marker that only has to be unique.
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 24) as u8
            })
            .collect();
        Masked { masked, mask: 0xA5 }
    }

    /// Writes the unmasked secret into `out[at..]`.
    pub fn unmask_into(&self, out: &mut [u8], at: usize) {
        let mask = std::hint::black_box(self.mask);
        for (o, m) in out[at..at + self.masked.len()].iter_mut().zip(&self.masked) {
            *o = m ^ mask;
        }
    }
}

/// Scans this process's readable and writable memory for a [`Masked`] secret. Its buffers are
/// allocated once, by [`Scanner::new`], before the code under test runs: a scan that allocated
/// could be handed (and overwrite, or zero) the very freed memory it is meant to inspect.
pub struct Scanner {
    chunk: Vec<u8>,
    maps: Vec<u8>,
    found: Vec<usize>,
}

/// At most this many matches are reported.
const MAX_FOUND: usize = 16;

impl Scanner {
    pub fn new() -> Scanner {
        Scanner {
            chunk: vec![0u8; 1 << 20],
            maps: Vec::with_capacity(1 << 20),
            found: Vec::with_capacity(MAX_FOUND),
        }
    }

    /// Where the secret behind `m` appears (page addresses of the matches, at most 16).
    /// Mappings the kernel will not let us read are skipped.
    pub fn find(&mut self, m: &Masked) -> io::Result<Vec<usize>> {
        let n = m.masked.len();
        assert!(n >= 8, "a marker of at least 8 bytes");
        self.maps.clear();
        File::open("/proc/self/maps")?.read_to_end(&mut self.maps)?;
        let mem = File::open("/proc/self/mem")?;
        let mask = std::hint::black_box(m.mask);
        let first = m.masked[0] ^ mask;
        self.found.clear();
        for line in self.maps.split(|&b| b == b'\n') {
            let Some((start, end)) = writable_range(line) else {
                continue;
            };
            // Chunks overlap by n - 1 bytes so that a match across a boundary is seen.
            let mut at = start;
            while at < end {
                let len = self.chunk.len().min(end - at);
                let Ok(got) = mem.read_at(&mut self.chunk[..len], at as u64) else {
                    break;
                };
                if got == 0 {
                    break;
                }
                let data = &self.chunk[..got];
                for i in 0..(got + 1).saturating_sub(n) {
                    if data[i] == first
                        && data[i..i + n]
                            .iter()
                            .zip(&m.masked)
                            .all(|(d, k)| d ^ mask == *k)
                        && self.found.len() < MAX_FOUND
                    {
                        self.found.push((at + i) & !0xfff);
                    }
                }
                if at + got >= end {
                    break;
                }
                at += got.saturating_sub(n - 1).max(1);
            }
        }
        // The chunk holds a copy of the last mapping read: clear it, so that a later scan
        // cannot find there a match it put there itself.
        self.chunk.as_mut_slice().zeroize();
        Ok(self.found.clone())
    }
}

impl Default for Scanner {
    fn default() -> Self {
        Scanner::new()
    }
}

/// The address range of a `/proc/self/maps` line if the mapping is readable and writable.
fn writable_range(line: &[u8]) -> Option<(usize, usize)> {
    let line = std::str::from_utf8(line).ok()?;
    let mut fields = line.split_whitespace();
    let (range, perms) = (fields.next()?, fields.next()?);
    if !perms.starts_with("rw") {
        return None;
    }
    let (start, end) = range.split_once('-')?;
    Some((
        usize::from_str_radix(start, 16).ok()?,
        usize::from_str_radix(end, 16).ok()?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_a_copy_and_not_a_wiped_one() {
        let mut scan = Scanner::new();
        let m = Masked::fresh(32);
        let mut buf = vec![0u8; 4096];
        m.unmask_into(&mut buf, 1000);
        assert_eq!(scan.find(&m).unwrap().len(), 1);
        buf.zeroize();
        assert_eq!(scan.find(&m).unwrap(), Vec::<usize>::new());
        assert_eq!(writable_range(b"7f00-7f10 r-xp 0 00:00 0 /lib"), None);
        assert_eq!(
            writable_range(b"1000-3000 rw-p 0 00:00 0 [heap]"),
            Some((0x1000, 0x3000))
        );
    }
}
