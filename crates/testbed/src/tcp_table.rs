//! This machine's TCP sockets as the kernel lists them in `/proc/net/tcp` and `/proc/net/tcp6`:
//! which process listens where (the peer launchers), and which timer a connection has pending
//! (the drivers' keepalive tests).

/// One line of a table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpEntry {
    pub local_port: u16,
    pub remote_port: u16,
    /// The kernel's state number ([`ESTABLISHED`], [`LISTEN`], …).
    pub state: u8,
    /// The kind of timer pending (0 none, 1 retransmission, [`KEEPALIVE`], …).
    pub timer: u8,
    pub inode: u64,
}

pub const ESTABLISHED: u8 = 0x01;
pub const LISTEN: u8 = 0x0A;
/// The timer kind of an idle connection with TCP keepalive on.
pub const KEEPALIVE: u8 = 2;

/// Every entry of one table (the header and lines that do not parse are skipped).
pub fn parse(table: &str) -> Vec<TcpEntry> {
    let port = |addr: &str| u16::from_str_radix(addr.rsplit(':').next()?, 16).ok();
    table
        .lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            Some(TcpEntry {
                local_port: port(f.get(1)?)?,
                remote_port: port(f.get(2)?)?,
                state: u8::from_str_radix(f.get(3)?, 16).ok()?,
                timer: u8::from_str_radix(f.get(5)?.split(':').next()?, 16).ok()?,
                inode: f.get(9)?.parse().ok()?,
            })
        })
        .collect()
}

/// The IPv4 and IPv6 tables together; `None` without procfs.
pub fn read() -> Option<Vec<TcpEntry>> {
    read_from("/proc/net")
}

/// The tables of the network namespace process `pid` is in (e.g. a peer started in a test
/// namespace); `None` without procfs or without that process.
pub fn read_of(pid: u32) -> Option<Vec<TcpEntry>> {
    read_from(&format!("/proc/{pid}/net"))
}

fn read_from(dir: &str) -> Option<Vec<TcpEntry>> {
    let tables: Vec<String> = ["tcp", "tcp6"]
        .iter()
        .filter_map(|t| std::fs::read_to_string(format!("{dir}/{t}")).ok())
        .collect();
    (!tables.is_empty()).then(|| tables.iter().flat_map(|t| parse(t)).collect())
}

/// The pending timer of the one established entry `pick` selects (`None`: not exactly one).
pub fn established_timer(entries: &[TcpEntry], pick: impl Fn(&TcpEntry) -> bool) -> Option<u8> {
    let mut found = entries.iter().filter(|e| e.state == ESTABLISHED && pick(e));
    match (found.next(), found.next()) {
        (Some(one), None) => Some(one.timer),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ports, state and timer kind as the kernel writes them; one entry per established pair.
    #[test]
    fn entries_and_the_timer_of_an_established_connection() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n   0: 0100007F:1F90 0100007F:A0B2 01 00000000:00000000 02:00000E9A 00000000     0        0 4343\n   1: 0100007F:A0B2 0100007F:1F90 01 00000000:00000000 00:00000000 00000000     0        0 4444\n";
        let entries = parse(table);
        assert_eq!(entries.len(), 2);
        assert_eq!(
            entries[0],
            TcpEntry {
                local_port: 8080,
                remote_port: 0xA0B2,
                state: ESTABLISHED,
                timer: KEEPALIVE,
                inode: 4343
            }
        );
        assert_eq!(
            established_timer(&entries, |e| e.local_port == 8080),
            Some(KEEPALIVE)
        );
        assert_eq!(
            established_timer(&entries, |e| e.remote_port == 8080),
            Some(0)
        );
        assert_eq!(established_timer(&entries, |_| true), None, "two match");
        assert_eq!(established_timer(&entries, |e| e.local_port == 1), None);
    }
}
