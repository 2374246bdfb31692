//! The kernel's view of this machine's TCP sockets, for the driver tests.

/// One IPv4 TCP socket of this machine, from `/proc/net/tcp`: local and remote port, state
/// (1 = established) and the kernel timer pending on it (2 = keepalive).
#[derive(Debug)]
pub struct KernelSocket {
    pub local_port: u16,
    pub remote_port: u16,
    pub state: u8,
    pub timer: u8,
}

pub fn kernel_sockets() -> Vec<KernelSocket> {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    let port = |addr: &str| u16::from_str_radix(addr.rsplit(':').next().unwrap(), 16).unwrap();
    table
        .lines()
        .skip(1)
        .map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            KernelSocket {
                local_port: port(f[1]),
                remote_port: port(f[2]),
                state: u8::from_str_radix(f[3], 16).unwrap(),
                timer: u8::from_str_radix(f[5].split(':').next().unwrap(), 16).unwrap(),
            }
        })
        .collect()
}

/// The kernel's number for a pending keepalive timer.
pub const KEEPALIVE: u8 = 2;

/// The pending timer of the one established socket `pick` selects (`None`: not exactly one).
pub fn timer_of(all: &[KernelSocket], pick: impl Fn(&KernelSocket) -> bool) -> Option<u8> {
    let found: Vec<&KernelSocket> = all.iter().filter(|s| s.state == 1 && pick(s)).collect();
    match found.as_slice() {
        [one] => Some(one.timer),
        _ => None,
    }
}
