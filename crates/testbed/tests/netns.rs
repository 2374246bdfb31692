//! TCP echo across network namespaces. Runs only as root with `ip`; otherwise prints why it is
//! skipped and passes.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Command, Stdio};

use mbx_testbed::netns::{self, Topology};

const ECHO: &str = env!("CARGO_BIN_EXE_mbx-testbed-echo");

fn netns_list() -> String {
    let out = Command::new(mbx_testbed::peers::find_tool("ip").unwrap())
        .args(["netns", "list"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The echo server on `host`, listening on `addr` once this returns (it prints one line once
/// bound); killed when the guard drops.
fn echo_server(host: &netns::Host, addr: SocketAddr) -> mbx_testbed::peers::ChildGuard {
    let mut cmd = host.command(ECHO);
    cmd.arg("serve")
        .arg(addr.to_string())
        .stdout(Stdio::piped());
    let mut server = host.spawn_command(cmd).unwrap();
    let stdout = server.child_mut().unwrap().stdout.take().unwrap();
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).unwrap();
    assert_eq!(line.trim(), format!("listening {addr}"));
    server
}

#[test]
fn tcp_echo_across_namespaces() {
    if let Some(reason) = netns::unavailable_reason() {
        eprintln!("SKIPPED tcp_echo_across_namespaces: {reason}");
        return;
    }
    let names;
    {
        let topo = Topology::namespaces(3).unwrap();
        assert!(topo.is_netns());
        names = topo
            .hosts()
            .iter()
            .map(|h| h.namespace().unwrap().name().to_owned())
            .collect::<Vec<_>>();
        let listed = netns_list();
        for n in &names {
            assert!(listed.contains(n.as_str()), "{n} not in `ip netns list`");
        }
        let server_host = topo.host(2).unwrap();
        let port = server_host.port().unwrap();
        let server_addr = server_host.addr(port);
        let _server = echo_server(server_host, server_addr);

        // Neighbour (host 1) and two hops away (host 0, routed through host 1).
        for client in [1, 0] {
            let host = topo.host(client).unwrap();
            let msg = format!("hello from host {client}");
            let out = host
                .namespace()
                .unwrap()
                .exec(ECHO, ["send", &server_addr.to_string(), &msg])
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert_eq!(String::from_utf8_lossy(&out.stdout), msg);
        }

        // ICMP too: host 0 pings host 2 through host 1's forwarding.
        let ping = mbx_testbed::peers::ensure_tool("ping", "iputils-ping").unwrap();
        let out = topo
            .host(0)
            .unwrap()
            .namespace()
            .unwrap()
            .exec(&ping, ["-c", "1", "-W", "5", &server_addr.ip().to_string()])
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );

        // IPv6 too: every host has an address of its own, routed the same way.
        let server_addr6 = SocketAddr::new(
            server_host.ip6().unwrap().into(),
            server_host.port().unwrap(),
        );
        let _server6 = echo_server(server_host, server_addr6);
        let out = topo
            .host(0)
            .unwrap()
            .namespace()
            .unwrap()
            .exec(ECHO, ["send", &server_addr6.to_string(), "over IPv6"])
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(String::from_utf8_lossy(&out.stdout), "over IPv6");

        // The server is not reachable from the root namespace: the address exists only inside.
        let out = Command::new(ECHO)
            .args(["send", &server_addr.to_string(), "x"])
            .output()
            .unwrap();
        assert!(
            !out.status.success(),
            "namespace address reachable from the host"
        );
    }
    // Dropping the topology deleted every namespace.
    let listed = netns_list();
    for n in &names {
        assert!(!listed.contains(n.as_str()), "{n} left behind");
    }
}

#[test]
fn loopback_topology_spawns_on_localhost() {
    let topo = Topology::loopback(2);
    assert!(!topo.is_netns());
    let host = topo.host(1).unwrap();
    let port = host.port().unwrap();
    let addr = host.addr(port);
    assert!(addr.ip().is_loopback());
    let _server = echo_server(host, addr);
    let out = topo
        .host(0)
        .unwrap()
        .command(ECHO)
        .args(["send", &addr.to_string(), "ping"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ping");
}
