//! Network namespaces linked by veth pairs, and a [`Topology`] that falls back to loopback.
//!
//! Namespaces need root and the `ip` tool. Addresses are from `10.231.0.0/16` and, for IPv6,
//! `fd31:231::/32` (unique local); they exist only inside namespaces created here, so nothing leaves the machine and parallel tests never collide: each
//! namespace and interface name carries the process id and a per-process counter.
//!
//! In-process tokio code always runs in the namespace of the test process; only child processes
//! (the `mbx` binary, real peers) run inside a namespace, through `ip netns exec`.

use std::ffi::OsStr;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};

use crate::peers::{find_tool, free_port, ChildGuard, PeerError};

/// Errors from namespace management.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    /// Namespaces cannot be used here (not root, or no `ip`).
    #[error("network namespaces unavailable: {0}")]
    Unavailable(String),
    /// An `ip` command failed.
    #[error("`{command}` failed: {stderr}")]
    Command {
        /// The command line.
        command: String,
        /// Its standard error.
        stderr: String,
    },
    /// Spawning a process failed.
    #[error("spawning {command}: {error}")]
    Spawn {
        /// The command line.
        command: String,
        /// Underlying error.
        error: std::io::Error,
    },
    /// Port allocation on loopback failed.
    #[error(transparent)]
    Peer(#[from] PeerError),
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

fn unique_suffix() -> String {
    // Hex keeps interface names within the kernel's 15-character limit.
    format!(
        "{:x}x{:x}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

fn effective_uid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

fn ip_tool() -> Option<PathBuf> {
    find_tool("ip")
}

/// Why namespaces are unavailable, or `None` if they can be used. Checked once per process.
pub fn unavailable_reason() -> Option<String> {
    static REASON: OnceLock<Option<String>> = OnceLock::new();
    REASON
        .get_or_init(|| {
            if effective_uid() != Some(0) {
                return Some("not running as root".to_owned());
            }
            let Some(ip) = ip_tool() else {
                return Some("the `ip` tool (iproute2) is not installed".to_owned());
            };
            match Command::new(ip).args(["netns", "list"]).output() {
                Ok(out) if out.status.success() => None,
                Ok(out) => Some(format!(
                    "`ip netns list` failed: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                )),
                Err(e) => Some(format!("running `ip`: {e}")),
            }
        })
        .clone()
}

/// Whether network namespaces can be created (root and `ip` present).
pub fn available() -> bool {
    unavailable_reason().is_none()
}

fn run_ip<I, S>(args: I) -> Result<Output, NetnsError>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let ip = ip_tool().ok_or_else(|| NetnsError::Unavailable("no `ip` tool".into()))?;
    let args: Vec<std::ffi::OsString> = args.into_iter().map(|a| a.as_ref().to_owned()).collect();
    let command = format!(
        "ip {}",
        args.iter()
            .map(|a| a.to_string_lossy())
            .collect::<Vec<_>>()
            .join(" ")
    );
    let out = Command::new(ip)
        .args(&args)
        .stdin(Stdio::null())
        .output()
        .map_err(|error| NetnsError::Spawn {
            command: command.clone(),
            error,
        })?;
    if !out.status.success() {
        return Err(NetnsError::Command {
            command,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(out)
}

/// Deletes namespaces left by earlier test processes that were killed before their `Drop` ran
/// (names `mbx<hex pid>x<n>` whose pid no longer exists). Returns how many were deleted.
pub fn cleanup_stale() -> usize {
    if !available() {
        return 0;
    }
    let Ok(out) = run_ip(["netns", "list"]) else {
        return 0;
    };
    let listing = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut deleted = 0;
    for name in listing.lines().filter_map(|l| l.split_whitespace().next()) {
        let Some(pid) = name
            .strip_prefix("mbx")
            .and_then(|rest| rest.split('x').next())
            .and_then(|hex| u32::from_str_radix(hex, 16).ok())
        else {
            continue;
        };
        let alive = std::path::Path::new(&format!("/proc/{pid}")).exists();
        if !alive && run_ip(["netns", "del", name]).is_ok() {
            deleted += 1;
        }
    }
    deleted
}

/// A network namespace, deleted (with its interfaces) on drop.
#[derive(Debug)]
pub struct Namespace {
    name: String,
}

impl Namespace {
    /// Creates a namespace named `mbx<pid>x<n>` with its loopback up.
    pub fn create() -> Result<Namespace, NetnsError> {
        if let Some(reason) = unavailable_reason() {
            return Err(NetnsError::Unavailable(reason));
        }
        let name = format!("mbx{}", unique_suffix());
        run_ip(["netns", "add", name.as_str()])?;
        let ns = Namespace { name };
        ns.ip(["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// The namespace name (as used by `ip netns exec`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Runs `ip <args>` inside the namespace.
    pub fn ip<I, S>(&self, args: I) -> Result<Output, NetnsError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut full: Vec<std::ffi::OsString> = vec!["-n".into(), self.name.clone().into()];
        full.extend(args.into_iter().map(|a| a.as_ref().to_owned()));
        run_ip(full)
    }

    /// A command that runs `program` inside the namespace (`ip netns exec <ns> program`).
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut cmd = Command::new(ip_tool().unwrap_or_else(|| PathBuf::from("ip")));
        cmd.args(["netns", "exec", self.name.as_str()]).arg(program);
        cmd
    }

    /// Runs `program args...` inside the namespace and waits for it.
    pub fn exec<I, S>(&self, program: impl AsRef<OsStr>, args: I) -> Result<Output, NetnsError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut cmd = self.command(program);
        cmd.args(args).stdin(Stdio::null());
        let command = format!("{cmd:?}");
        cmd.output()
            .map_err(|error| NetnsError::Spawn { command, error })
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        // Deleting the namespace destroys the veth ends inside it, and with them their peers.
        if let Err(e) = run_ip(["netns", "del", self.name.as_str()]) {
            tracing::warn!(ns = %self.name, error = %e, "deleting network namespace failed");
        }
    }
}

/// Connects two namespaces with a veth pair, giving `a_addr/prefix` and `b_addr/prefix`, both up.
pub fn link(
    a: &Namespace,
    a_addr: Ipv4Addr,
    b: &Namespace,
    b_addr: Ipv4Addr,
    prefix: u8,
) -> Result<(String, String), NetnsError> {
    let suffix = unique_suffix();
    let (a_if, b_if) = (format!("va{suffix}"), format!("vb{suffix}"));
    run_ip([
        "link",
        "add",
        &a_if,
        "netns",
        a.name(),
        "type",
        "veth",
        "peer",
        "name",
        &b_if,
        "netns",
        b.name(),
    ])?;
    for (ns, ifname, addr) in [(a, &a_if, a_addr), (b, &b_if, b_addr)] {
        ns.ip(["addr", "add", &format!("{addr}/{prefix}"), "dev", ifname])?;
        ns.ip(["link", "set", ifname, "up"])?;
    }
    Ok((a_if, b_if))
}

/// One host of a [`Topology`].
#[derive(Debug, Clone)]
pub struct Host {
    index: usize,
    ip: IpAddr,
    ip6: Option<Ipv6Addr>,
    ns: Option<Arc<Namespace>>,
    next_port: Arc<AtomicU32>,
}

impl Host {
    /// Position in the chain, from 0.
    pub fn index(&self) -> usize {
        self.index
    }

    /// The address other hosts use to reach this one (127.0.0.1 on loopback).
    pub fn ip(&self) -> IpAddr {
        self.ip
    }

    /// `ip:port` on this host.
    pub fn addr(&self, port: u16) -> SocketAddr {
        SocketAddr::new(self.ip, port)
    }

    /// The host's IPv6 address, which every namespace host has too (`None` on loopback).
    pub fn ip6(&self) -> Option<Ipv6Addr> {
        self.ip6
    }

    /// The namespace, when the topology uses namespaces.
    pub fn namespace(&self) -> Option<&Namespace> {
        self.ns.as_deref()
    }

    /// A port for a listener on this host. On loopback a currently free port (hosts are told apart
    /// by port); in a namespace the next port of a per-host counter, since only our processes
    /// run there.
    pub fn port(&self) -> Result<u16, NetnsError> {
        match self.ns {
            None => Ok(free_port()?),
            Some(_) => {
                let p = self.next_port.fetch_add(1, Ordering::Relaxed);
                Ok(u16::try_from(p).unwrap_or(20000))
            }
        }
    }

    /// A command that runs `program` on this host.
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        match &self.ns {
            Some(ns) => ns.command(program),
            None => Command::new(program),
        }
    }

    /// Spawns `program args...` on this host; the process is killed when the guard drops.
    pub fn spawn<I, S>(&self, program: impl AsRef<OsStr>, args: I) -> Result<ChildGuard, NetnsError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut cmd = self.command(program);
        cmd.args(args);
        self.spawn_command(cmd)
    }

    /// Spawns a prepared command (from [`Host::command`]); killed when the guard drops.
    pub fn spawn_command(&self, mut cmd: Command) -> Result<ChildGuard, NetnsError> {
        let command = format!("{cmd:?}");
        let child = cmd
            .stdin(Stdio::null())
            .spawn()
            .map_err(|error| NetnsError::Spawn { command, error })?;
        Ok(ChildGuard::new(child))
    }
}

/// A chain of hosts `0 - 1 - ... - n-1`, e.g. client, middleboxes, server.
///
/// With namespaces each host is a namespace; neighbours share a veth link `10.231.k.0/24` and
/// `fd31:231:k::/64` (host k is `.1`/`::1`, host k+1 is `.2`/`::2`); hosts forward and route so
/// any host reaches any other at [`Host::ip`] and [`Host::ip6`]. On loopback every host is 127.0.0.1 and listeners differ by port.
#[derive(Debug)]
pub struct Topology {
    hosts: Vec<Host>,
    // Keeps namespaces alive even if hosts are cloned out and dropped.
    _namespaces: Vec<Arc<Namespace>>,
}

impl Topology {
    /// Loopback topology of `n` hosts.
    pub fn loopback(n: usize) -> Topology {
        let hosts = (0..n)
            .map(|index| Host {
                index,
                ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
                ip6: None,
                ns: None,
                next_port: Arc::new(AtomicU32::new(20000)),
            })
            .collect();
        Topology {
            hosts,
            _namespaces: Vec::new(),
        }
    }

    /// Namespaces if [`available`], otherwise loopback.
    pub fn auto(n: usize) -> Result<Topology, NetnsError> {
        if available() {
            Topology::namespaces(n)
        } else {
            Ok(Topology::loopback(n))
        }
    }

    /// A chain of `n` namespaces (at most 250). Fails if namespaces are unavailable.
    pub fn namespaces(n: usize) -> Result<Topology, NetnsError> {
        if n > 250 {
            return Err(NetnsError::Unavailable("at most 250 hosts".into()));
        }
        static CLEANED: std::sync::Once = std::sync::Once::new();
        CLEANED.call_once(|| {
            let n = cleanup_stale();
            if n > 0 {
                tracing::info!(count = n, "deleted stale test namespaces");
            }
        });
        let namespaces: Vec<Arc<Namespace>> = (0..n)
            .map(|_| Namespace::create().map(Arc::new))
            .collect::<Result<_, _>>()?;
        // Link k joins host k (.1, ::1) and host k+1 (.2, ::2) on 10.231.k.0/24 and
        // fd31:231:k::/64.
        let link_addr = |k: usize, side: u8| Ipv4Addr::new(10, 231, k as u8, side);
        let link_addr6 = |k: usize, side: u8| {
            Ipv6Addr::new(0xfd31, 0x231, k as u16, 0, 0, 0, 0, u16::from(side))
        };
        for k in 0..n.saturating_sub(1) {
            if let (Some(a), Some(b)) = (namespaces.get(k), namespaces.get(k + 1)) {
                let (a_if, b_if) = link(a, link_addr(k, 1), b, link_addr(k, 2), 24)?;
                // `nodad`: usable at once, not after duplicate address detection.
                for (ns, ifname, side) in [(a, &a_if, 1), (b, &b_if, 2)] {
                    let addr = format!("{}/64", link_addr6(k, side));
                    ns.ip(["-6", "addr", "add", &addr, "dev", ifname, "nodad"])?;
                }
            }
        }
        for (h, ns) in namespaces.iter().enumerate() {
            if n > 2 {
                for setting in ["net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1"] {
                    let out = ns.exec("sysctl", ["-q", "-w", setting])?;
                    if !out.status.success() {
                        return Err(NetnsError::Command {
                            command: format!("sysctl {setting}"),
                            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
                        });
                    }
                }
            }
            for k in 0..n.saturating_sub(1) {
                // Links attached to host h are h-1 and h; others are reached via a neighbour.
                let (via, via6) = if k + 1 < h {
                    (link_addr(h - 1, 1), link_addr6(h - 1, 1)) // left neighbour's end of link h-1
                } else if k > h {
                    (link_addr(h, 2), link_addr6(h, 2)) // right neighbour's end of link h
                } else {
                    continue;
                };
                let (net, net6) = (format!("10.231.{k}.0/24"), format!("fd31:231:{k:x}::/64"));
                ns.ip(["route", "add", &net, "via", &via.to_string()])?;
                ns.ip(["-6", "route", "add", &net6, "via", &via6.to_string()])?;
            }
        }
        let hosts = namespaces
            .iter()
            .enumerate()
            .map(|(index, ns)| Host {
                index,
                // Host 0's only address is on link 0; every other host is reached on its left link.
                ip: IpAddr::V4(if index == 0 {
                    link_addr(0, 1)
                } else {
                    link_addr(index - 1, 2)
                }),
                ip6: Some(if index == 0 {
                    link_addr6(0, 1)
                } else {
                    link_addr6(index - 1, 2)
                }),
                ns: Some(ns.clone()),
                next_port: Arc::new(AtomicU32::new(20000)),
            })
            .collect();
        Ok(Topology {
            hosts,
            _namespaces: namespaces,
        })
    }

    /// Whether hosts are namespaces (false: loopback).
    pub fn is_netns(&self) -> bool {
        !self._namespaces.is_empty()
    }

    /// Number of hosts.
    pub fn len(&self) -> usize {
        self.hosts.len()
    }

    /// Whether the topology has no hosts.
    pub fn is_empty(&self) -> bool {
        self.hosts.is_empty()
    }

    /// Host `i`, if it exists.
    pub fn host(&self, i: usize) -> Option<&Host> {
        self.hosts.get(i)
    }

    /// All hosts in chain order.
    pub fn hosts(&self) -> &[Host] {
        &self.hosts
    }
}
