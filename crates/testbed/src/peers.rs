//! Real peers: find-or-install tools and run `openssl s_server`/`s_client`, `nginx` and `curl`.
//!
//! Every spawned process is owned by a guard that kills it on drop. Readiness is polled (connect
//! to the port) with a bounded number of attempts; nothing assumes how long a start takes.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Attempts to bind a fresh port before a launcher gives up.
const BIND_ATTEMPTS: usize = 8;
/// Upper bound on waiting for a peer to accept connections. Generous: the machine is shared.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// Default bound for one client run (s_client, curl).
const RUN_TIMEOUT: Duration = Duration::from_secs(60);
/// Pause between readiness polls.
const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// Errors from finding, installing or running peers.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    /// The tool is missing and cannot be installed here.
    #[error("`{tool}` not found and cannot be installed: {reason}")]
    ToolMissing {
        /// Binary name.
        tool: String,
        /// Why it could not be installed.
        reason: String,
    },
    /// `apt-get` failed.
    #[error("`{command}` failed ({status}): {stderr}")]
    Install {
        /// The apt-get command line.
        command: String,
        /// Exit status.
        status: ExitStatus,
        /// Last part of its output.
        stderr: String,
    },
    /// I/O error (spawning, temp files, sockets).
    #[error("{context}: {error}")]
    Io {
        /// What was being done.
        context: String,
        /// Underlying error.
        error: std::io::Error,
    },
    /// A peer exited before it became ready.
    #[error("{what} exited early ({status}): {log}")]
    Exited {
        /// Which peer.
        what: String,
        /// Its exit status.
        status: ExitStatus,
        /// Its error output.
        log: String,
    },
    /// A peer did not become ready or a run did not finish within the bound.
    #[error("{what} timed out after {after:?}: {log}")]
    Timeout {
        /// Which peer or command.
        what: String,
        /// The bound that was exceeded.
        after: Duration,
        /// Output collected so far.
        log: String,
    },
    /// Invalid launcher configuration.
    #[error("invalid configuration: {0}")]
    Config(String),
}

fn io_err(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> PeerError {
    let context = context.into();
    move |error| PeerError::Io { context, error }
}

/// TLS protocol version selector for the launchers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TlsVersion {
    /// TLS 1.2.
    Tls12,
    /// TLS 1.3.
    Tls13,
}

impl TlsVersion {
    fn openssl_flag(self) -> &'static str {
        match self {
            TlsVersion::Tls12 => "-tls1_2",
            TlsVersion::Tls13 => "-tls1_3",
        }
    }

    fn nginx_name(self) -> &'static str {
        match self {
            TlsVersion::Tls12 => "TLSv1.2",
            TlsVersion::Tls13 => "TLSv1.3",
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Tools

/// Looks for `tool` on `PATH`, then in the sbin directories that non-login root shells often lack.
pub fn find_tool(tool: &str) -> Option<PathBuf> {
    if tool.contains('/') {
        let p = PathBuf::from(tool);
        return is_executable(&p).then_some(p);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/local/sbin", "/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from))
        .map(|dir| dir.join(tool))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|u| u == "0"))
        })
        .unwrap_or(false)
}

/// Serialises installs within the process; the bool records whether `apt-get update` ran.
static APT: Mutex<bool> = Mutex::new(false);

fn apt_get(args: &[&str]) -> Result<(), PeerError> {
    let command = format!("apt-get {}", args.join(" "));
    tracing::info!(%command, "installing test dependency");
    let out = Command::new(find_tool("apt-get").unwrap_or_else(|| PathBuf::from("apt-get")))
        // Wait for another apt process (another test binary) instead of failing on its lock.
        .args(["-o", "DPkg::Lock::Timeout=600", "-q"])
        .args(args)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .stdin(Stdio::null())
        .output()
        .map_err(io_err(format!("running {command}")))?;
    if !out.status.success() {
        let mut stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        if stderr.len() > 2000 {
            stderr = stderr.split_off(stderr.len() - 2000);
        }
        return Err(PeerError::Install {
            command,
            status: out.status,
            stderr,
        });
    }
    Ok(())
}

/// Finds `tool`, installing Debian package `package` if it is missing and we are root.
///
/// `apt-get update` runs at most once per process. Without root (or without apt) the error says
/// which package to install, e.g. via `scripts/install-deps.sh`.
pub fn ensure_tool(tool: &str, package: &str) -> Result<PathBuf, PeerError> {
    if let Some(p) = find_tool(tool) {
        return Ok(p);
    }
    let missing = |reason: &str| PeerError::ToolMissing {
        tool: tool.to_owned(),
        reason: format!(
            "{reason}; install the Debian package `{package}` (scripts/install-deps.sh)"
        ),
    };
    if !is_root() {
        return Err(missing("not running as root"));
    }
    if find_tool("apt-get").is_none() {
        return Err(missing("apt-get is not available"));
    }
    let mut updated = APT.lock().unwrap_or_else(|e| e.into_inner());
    // Another thread may have installed it while we waited for the lock.
    if let Some(p) = find_tool(tool) {
        return Ok(p);
    }
    if !*updated {
        apt_get(&["update"])?;
        *updated = true;
    }
    apt_get(&["install", "-y", "--no-install-recommends", package])?;
    find_tool(tool).ok_or_else(|| missing("package installed but the binary is still not found"))
}

/// A TCP port on 127.0.0.1 that was free a moment ago (bind to port 0, read it, release it).
///
/// Another process can take it before it is used; launchers retry with a new port on bind failure.
pub fn free_port() -> Result<u16, PeerError> {
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).map_err(io_err("binding 127.0.0.1:0"))?;
    Ok(l.local_addr().map_err(io_err("local_addr"))?.port())
}

/// A loopback address nobody listens on (a connection to it is refused at once), for tests of
/// a next hop or backend that is down. Its port stays bound, never listening, while this
/// lives: a port only released (as [`free_port`] does) could be taken by a listener of a test
/// running beside it, whose connections the "down" one would then steal.
#[derive(Debug)]
pub struct RefusingAddr {
    addr: std::net::SocketAddr,
    _bound: tokio::net::TcpSocket,
}

impl RefusingAddr {
    /// The address (connections to it are refused).
    pub fn addr(&self) -> std::net::SocketAddr {
        self.addr
    }
}

/// A [`RefusingAddr`] on 127.0.0.1.
pub fn refusing_addr() -> RefusingAddr {
    let bound = tokio::net::TcpSocket::new_v4().expect("a TCP socket");
    bound
        .bind(std::net::SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
        .expect("a free loopback port");
    let addr = bound.local_addr().expect("its address");
    RefusingAddr {
        addr,
        _bound: bound,
    }
}

// ---------------------------------------------------------------------------------------------
// Processes

/// A child process that is killed (and reaped) when dropped.
#[derive(Debug)]
pub struct ChildGuard {
    child: Option<Child>,
}

impl ChildGuard {
    /// Takes ownership of `child`.
    pub fn new(child: Child) -> Self {
        ChildGuard { child: Some(child) }
    }

    /// OS process id.
    pub fn id(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The exit status if the process has exited.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// Mutable access to the child, e.g. to take its stdout.
    pub fn child_mut(&mut self) -> Option<&mut Child> {
        self.child.as_mut()
    }

    /// Kills and reaps the process now.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Waits for the process to exit by itself, killing it after `timeout`.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.try_wait() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                self.kill();
                return None;
            }
            std::thread::sleep(POLL_INTERVAL);
        }
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Polls until `addr` accepts a TCP connection, failing early if `child` exits.
pub fn wait_for_port(
    addr: SocketAddr,
    child: &mut ChildGuard,
    what: &str,
    log: &Path,
) -> Result<(), PeerError> {
    wait_for_listener(addr, child, what, log, true)
}

/// Polls until `child` listens on `addr`'s port and, if `reachable` from this process (not a
/// child in a test namespace), `addr` accepts a connection; fails early if `child` exits.
fn wait_for_listener(
    addr: SocketAddr,
    child: &mut ChildGuard,
    what: &str,
    log: &Path,
    reachable: bool,
) -> Result<(), PeerError> {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        if let Some(status) = child.try_wait() {
            return Err(PeerError::Exited {
                what: what.to_owned(),
                status,
                log: read_lossy(log),
            });
        }
        // A port that accepts may belong to another process that was handed the same "free"
        // port (ours then exits with a bind failure and is retried): it must be our child's.
        let ours = child
            .id()
            .is_some_and(|pid| owns_listener(pid, addr.port()));
        if ours
            && (!reachable || TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_ok())
        {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(PeerError::Timeout {
                what: what.to_owned(),
                after: READY_TIMEOUT,
                log: read_lossy(log),
            });
        }
        std::thread::sleep(POLL_INTERVAL);
    }
}

/// Whether process `pid` holds a listening TCP socket, IPv4 or IPv6, on `port` (from
/// `/proc/net/tcp{,6}` and the process's descriptors). Without procfs, assumes it does.
fn owns_listener(pid: u32, port: u16) -> bool {
    // The table of the child's own namespace: a peer started on a test host lists its
    // listener there only.
    let Some(entries) = crate::tcp_table::read_of(pid) else {
        return true;
    };
    let sockets = listening_sockets(&entries, port);
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.flatten().any(|fd| {
        std::fs::read_link(fd.path())
            .is_ok_and(|target| sockets.iter().any(|s| target.as_os_str() == s.as_str()))
    })
}

/// The sockets (as `/proc/PID/fd` links name them, `socket:[INODE]`) listening on `port`.
fn listening_sockets(entries: &[crate::tcp_table::TcpEntry], port: u16) -> Vec<String> {
    entries
        .iter()
        .filter(|e| e.local_port == port && e.state == crate::tcp_table::LISTEN)
        .map(|e| format!("socket:[{}]", e.inode))
        .collect()
}

fn read_lossy(path: &Path) -> String {
    std::fs::read(path)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default()
}

fn looks_like_bind_failure(log: &str) -> bool {
    let l = log.to_ascii_lowercase();
    l.contains("address already in use") || l.contains("bind") && l.contains("fail")
}

/// Output of a finished command.
#[derive(Debug, Clone)]
pub struct ProcessOutput {
    /// Exit status.
    pub status: ExitStatus,
    /// Standard output.
    pub stdout: Vec<u8>,
    /// Standard error.
    pub stderr: Vec<u8>,
}

impl ProcessOutput {
    /// Standard output as text.
    pub fn stdout_str(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    /// Standard error as text.
    pub fn stderr_str(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }
}

/// Runs `cmd` with `input` on stdin, capturing output; killed after `timeout`.
pub fn run_with_timeout(
    mut cmd: Command,
    input: &[u8],
    timeout: Duration,
) -> Result<ProcessOutput, PeerError> {
    let what = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(io_err(format!("spawning {what}")))?;
    let stdin = child.stdin.take();
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    let input = input.to_vec();
    let writer = std::thread::spawn(move || {
        if let Some(mut s) = stdin {
            let _ = s.write_all(&input);
        }
    });
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_end(&mut buf);
            }
            buf
        })
    };
    let out_t = drain(stdout.map(|s| Box::new(s) as Box<dyn Read + Send>));
    let err_t = drain(stderr.map(|s| Box::new(s) as Box<dyn Read + Send>));
    let mut guard = ChildGuard::new(child);
    let status = guard.wait_timeout(timeout);
    let _ = writer.join();
    let stdout = out_t.join().unwrap_or_default();
    let stderr = err_t.join().unwrap_or_default();
    match status {
        Some(status) => Ok(ProcessOutput {
            status,
            stdout,
            stderr,
        }),
        None => Err(PeerError::Timeout {
            what,
            after: timeout,
            log: String::from_utf8_lossy(&stderr).into_owned(),
        }),
    }
}

fn temp_dir(prefix: &str) -> Result<tempfile::TempDir, PeerError> {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .map_err(io_err("creating temp dir"))
}

fn log_file(path: &Path) -> Result<std::fs::File, PeerError> {
    std::fs::File::create(path).map_err(io_err(format!("creating {}", path.display())))
}

/// Lines for a peer's standard input: what the interactive `s_server` and `s_client` send
/// (or, for `k` / `K` on a line of their own, a TLS 1.3 KeyUpdate).
#[derive(Debug)]
struct StdinLines(Option<std::process::ChildStdin>);

impl StdinLines {
    fn send_line(&mut self, line: &str) -> Result<(), PeerError> {
        use std::io::Write;
        let stdin = self.0.as_mut().ok_or_else(|| PeerError::Io {
            context: "peer stdin (not started interactive, or closed)".into(),
            error: std::io::ErrorKind::NotConnected.into(),
        })?;
        stdin
            .write_all(format!("{line}\n").as_bytes())
            .and_then(|()| stdin.flush())
            .map_err(io_err("writing to the peer's stdin"))
    }
}

/// `openssl` under `stdbuf -oL` (coreutils): its stdio output line-buffered, so that a log
/// file shows each line as it is printed (interactive peers report commands that way).
fn line_buffered_openssl(openssl: &Path) -> Command {
    let mut c = Command::new("stdbuf");
    c.arg("-oL").arg(openssl);
    c
}

// ---------------------------------------------------------------------------------------------
// openssl s_server

/// What `openssl s_server` does with a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerMode {
    /// `-www`: answers any GET with an HTML status page (includes the negotiated protocol).
    Www,
    /// `-rev`: echoes each received line reversed; a line `CLOSE` closes the connection.
    Reverse,
    /// Neither: prints what it receives, and sends each line written with
    /// [`OpensslServer::send_line`]; the lines `k` and `K` send a TLS 1.3 KeyUpdate instead
    /// (`K`: asking the client to update too) and print `SSL_do_handshake -> 1`, when
    /// s_server reads them on their own (it reads its input in chunks).
    Interactive,
}

/// Builder for [`OpensslServer`].
#[derive(Debug, Clone)]
pub struct OpensslServerBuilder {
    cert: PathBuf,
    key: PathBuf,
    chain: Option<PathBuf>,
    version: Option<TlsVersion>,
    mode: ServerMode,
    args: Vec<String>,
}

impl OpensslServerBuilder {
    /// Intermediates sent after the leaf (`-cert_chain`).
    pub fn chain(mut self, chain: impl Into<PathBuf>) -> Self {
        self.chain = Some(chain.into());
        self
    }

    /// Restricts to one protocol version (`-tls1_2` / `-tls1_3`); default: whatever OpenSSL allows.
    pub fn version(mut self, version: TlsVersion) -> Self {
        self.version = Some(version);
        self
    }

    /// Connection handling mode (default [`ServerMode::Www`]).
    pub fn mode(mut self, mode: ServerMode) -> Self {
        self.mode = mode;
        self
    }

    /// Extra `s_server` argument (e.g. `-Verify 1`, `-CAfile`, `-keylogfile`).
    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// Starts the server on a free 127.0.0.1 port and waits until it accepts connections.
    pub fn start(self) -> Result<OpensslServer, PeerError> {
        let openssl = ensure_tool("openssl", "openssl")?;
        let dir = temp_dir("mbx-s_server")?;
        let interactive = self.mode == ServerMode::Interactive;
        let started = start_on_free_port("openssl s_server", dir.path(), interactive, |port| {
            // Interactive: s_server reports commands through stdio, line-buffered by `stdbuf`
            // (coreutils) so that its log shows each as it happens.
            let mut cmd = if interactive {
                line_buffered_openssl(&openssl)
            } else {
                Command::new(&openssl)
            };
            cmd.arg("s_server")
                .arg("-accept")
                .arg(format!("127.0.0.1:{port}"))
                .arg("-cert")
                .arg(&self.cert)
                .arg("-key")
                .arg(&self.key);
            if let Some(chain) = &self.chain {
                cmd.arg("-cert_chain").arg(chain);
            }
            if let Some(v) = self.version {
                cmd.arg(v.openssl_flag());
            }
            let mode = match self.mode {
                ServerMode::Www => Some("-www"),
                ServerMode::Reverse => Some("-rev"),
                ServerMode::Interactive => None,
            };
            cmd.args(mode);
            cmd.args(&self.args);
            cmd
        })?;
        Ok(OpensslServer {
            addr: started.addr,
            log: started.log,
            stdin: StdinLines(started.stdin),
            child: started.child,
            _dir: dir,
        })
    }
}

/// A peer [`start_on_free_port`] started.
struct Started {
    addr: SocketAddr,
    log: PathBuf,
    stdin: Option<std::process::ChildStdin>,
    child: ChildGuard,
}

/// Starts `what` on a free 127.0.0.1 port and waits until it accepts connections:
/// `command(port)` is its command for that port; its output goes to a log in `dir`, and its
/// standard input is piped if `stdin`. One that fails to bind (another process took the
/// port in between) is started again on another.
fn start_on_free_port(
    what: &str,
    dir: &Path,
    stdin: bool,
    command: impl Fn(u16) -> Command,
) -> Result<Started, PeerError> {
    let mut last = None;
    for attempt in 0..BIND_ATTEMPTS {
        let port = free_port()?;
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let log = dir.join(format!("{}.{attempt}.log", what.replace(' ', "-")));
        let out = log_file(&log)?;
        let err = out.try_clone().map_err(io_err("dup log"))?;
        let mut child = command(port)
            .stdin(if stdin { Stdio::piped() } else { Stdio::null() })
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(io_err(format!("spawning {what}")))?;
        let stdin = child.stdin.take();
        let mut child = ChildGuard::new(child);
        match wait_for_port(addr, &mut child, what, &log) {
            Ok(()) => {
                return Ok(Started {
                    addr,
                    log,
                    stdin,
                    child,
                })
            }
            Err(PeerError::Exited { log: text, .. }) if looks_like_bind_failure(&text) => {
                last = Some(text);
            }
            Err(e) => return Err(e),
        }
    }
    Err(PeerError::Timeout {
        what: format!("{what} (no free port)"),
        after: READY_TIMEOUT,
        log: last.unwrap_or_default(),
    })
}

/// A running `openssl s_server`, killed on drop.
#[derive(Debug)]
pub struct OpensslServer {
    addr: SocketAddr,
    log: PathBuf,
    /// [`ServerMode::Interactive`]: what the server sends.
    stdin: StdinLines,
    child: ChildGuard,
    _dir: tempfile::TempDir,
}

impl OpensslServer {
    /// A server presenting `cert` (leaf PEM) with `key`.
    pub fn builder(cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> OpensslServerBuilder {
        OpensslServerBuilder {
            cert: cert.into(),
            key: key.into(),
            chain: None,
            version: None,
            mode: ServerMode::Www,
            args: Vec::new(),
        }
    }

    /// A server for files written by [`crate::pki::IssuedCert::write_to`], sending intermediates.
    pub fn from_files(files: &crate::pki::PkiFiles) -> OpensslServerBuilder {
        let b = Self::builder(&files.cert, &files.key);
        let has_intermediates = std::fs::metadata(&files.intermediates)
            .map(|m| m.len() > 0)
            .unwrap_or(false);
        if has_intermediates {
            b.chain(&files.intermediates)
        } else {
            b
        }
    }

    /// Listening address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Listening port.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Everything s_server printed so far (stdout and stderr).
    pub fn log(&self) -> String {
        read_lossy(&self.log)
    }

    /// [`ServerMode::Interactive`]: has the server send `line` and a newline to its client
    /// (or, for `k` / `K`, a KeyUpdate).
    pub fn send_line(&mut self, line: &str) -> Result<(), PeerError> {
        self.stdin.send_line(line)
    }

    /// Process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }
}

// ---------------------------------------------------------------------------------------------
// openssl s_client

/// Builder-style runner for `openssl s_client`.
#[derive(Debug, Clone)]
pub struct OpensslClient {
    connect: String,
    servername: Option<String>,
    cafile: Option<PathBuf>,
    version: Option<TlsVersion>,
    cert: Option<(PathBuf, PathBuf)>,
    ign_eof: bool,
    args: Vec<String>,
    input: Vec<u8>,
    timeout: Duration,
}

impl OpensslClient {
    /// A client for `addr`.
    pub fn new(addr: SocketAddr) -> Self {
        OpensslClient {
            connect: addr.to_string(),
            servername: None,
            cafile: None,
            version: None,
            cert: None,
            ign_eof: true,
            args: Vec::new(),
            input: Vec::new(),
            timeout: RUN_TIMEOUT,
        }
    }

    /// SNI name (`-servername`) and name to verify (`-verify_hostname`).
    pub fn servername(mut self, name: &str) -> Self {
        self.servername = Some(name.to_owned());
        self
    }

    /// Trust anchors; verification failures abort the handshake (`-verify_return_error`).
    pub fn cafile(mut self, path: impl Into<PathBuf>) -> Self {
        self.cafile = Some(path.into());
        self
    }

    /// Restricts to one protocol version.
    pub fn version(mut self, version: TlsVersion) -> Self {
        self.version = Some(version);
        self
    }

    /// Client certificate and key.
    pub fn client_cert(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        self.cert = Some((cert.into(), key.into()));
        self
    }

    /// Whether to keep reading after stdin ends until the server closes (default true, so the
    /// response to the input is captured; with [`ServerMode::Reverse`] end the input with `CLOSE\n`).
    pub fn ign_eof(mut self, on: bool) -> Self {
        self.ign_eof = on;
        self
    }

    /// Bytes written to s_client's stdin.
    pub fn input(mut self, input: impl Into<Vec<u8>>) -> Self {
        self.input = input.into();
        self
    }

    /// Extra argument.
    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// Bound on the whole run (default 60 s); the process is killed after it.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Runs s_client to completion.
    pub fn run(&self) -> Result<ProcessOutput, PeerError> {
        let openssl = ensure_tool("openssl", "openssl")?;
        let mut cmd = Command::new(openssl);
        self.add_args(&mut cmd);
        run_with_timeout(cmd, &self.input, self.timeout)
    }

    /// Starts s_client and leaves it running: each line given to
    /// [`InteractiveClient::send_line`] is sent to the server (`k` / `K` on their own send a
    /// TLS 1.3 KeyUpdate and print `KEYUPDATE`); what it prints is in its log. The input set
    /// with [`input`](Self::input) and the timeout are not used.
    pub fn start_interactive(&self) -> Result<InteractiveClient, PeerError> {
        let openssl = ensure_tool("openssl", "openssl")?;
        let dir = temp_dir("mbx-s_client")?;
        let log = dir.path().join("s_client.log");
        let mut cmd = line_buffered_openssl(&openssl);
        self.add_args(&mut cmd);
        let out = log_file(&log)?;
        let err = out.try_clone().map_err(io_err("dup log"))?;
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(io_err("spawning openssl s_client"))?;
        Ok(InteractiveClient {
            stdin: StdinLines(child.stdin.take()),
            log,
            _child: ChildGuard::new(child),
            _dir: dir,
        })
    }

    fn add_args(&self, cmd: &mut Command) {
        cmd.args(["s_client", "-connect", &self.connect]);
        if let Some(name) = &self.servername {
            cmd.args(["-servername", name, "-verify_hostname", name]);
        }
        if let Some(ca) = &self.cafile {
            cmd.arg("-CAfile").arg(ca).arg("-verify_return_error");
        }
        if let Some(v) = self.version {
            cmd.arg(v.openssl_flag());
        }
        if let Some((cert, key)) = &self.cert {
            cmd.arg("-cert").arg(cert).arg("-key").arg(key);
        }
        if self.ign_eof {
            cmd.arg("-ign_eof");
        }
        cmd.args(&self.args);
    }
}

/// A running `openssl s_client` ([`OpensslClient::start_interactive`]), killed on drop.
#[derive(Debug)]
pub struct InteractiveClient {
    stdin: StdinLines,
    log: PathBuf,
    _child: ChildGuard,
    _dir: tempfile::TempDir,
}

impl InteractiveClient {
    /// Sends `line` and a newline to the server (or, for `k` / `K`, a KeyUpdate).
    pub fn send_line(&mut self, line: &str) -> Result<(), PeerError> {
        self.stdin.send_line(line)
    }

    /// Everything s_client printed so far (stdout and stderr).
    pub fn log(&self) -> String {
        read_lossy(&self.log)
    }
}

// ---------------------------------------------------------------------------------------------
// nginx

/// Builder for [`Nginx`].
#[derive(Debug, Clone)]
pub struct NginxBuilder {
    cert_chain: PathBuf,
    key: PathBuf,
    protocols: Vec<TlsVersion>,
    headers: Vec<String>,
    extra_server: String,
    extra_http: String,
    ipv6: bool,
}

impl NginxBuilder {
    /// Protocols to enable (default TLS 1.2 and 1.3).
    pub fn protocols(mut self, protocols: &[TlsVersion]) -> Self {
        self.protocols = protocols.to_vec();
        self
    }

    /// A request header to record in the access log and echo at `/headers`
    /// (e.g. `X-Mbtls`). nginx has no variable for all headers, so name each one.
    pub fn log_header(mut self, name: &str) -> Self {
        self.headers.push(name.to_owned());
        self
    }

    /// Extra directives inside the `server` block (e.g. more `location`s, `ssl_verify_client`).
    pub fn extra_server_config(mut self, conf: &str) -> Self {
        self.extra_server.push_str(conf);
        self.extra_server.push('\n');
        self
    }

    /// Extra directives inside the `http` block (e.g. a second plain-HTTP `server`).
    pub fn extra_http_config(mut self, conf: &str) -> Self {
        self.extra_http.push_str(conf);
        self.extra_http.push('\n');
        self
    }

    /// Started on a namespace host ([`start_on`](Self::start_on)), listen on its IPv6 address
    /// too, at the same port ([`Nginx::addr6`]).
    pub fn also_ipv6(mut self) -> Self {
        self.ipv6 = true;
        self
    }

    fn config(
        &self,
        dir: &Path,
        addr: SocketAddr,
        addr6: Option<SocketAddr>,
    ) -> Result<String, PeerError> {
        let mut vars = Vec::new();
        for h in &self.headers {
            if h.is_empty() || !h.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
                return Err(PeerError::Config(format!("header name {h:?}")));
            }
            vars.push((
                h.clone(),
                format!("$http_{}", h.to_ascii_lowercase().replace('-', "_")),
            ));
        }
        if self.protocols.is_empty() {
            return Err(PeerError::Config("no TLS protocol enabled".into()));
        }
        let protocols: Vec<&str> = self.protocols.iter().map(|p| p.nginx_name()).collect();
        let log_fields: String = vars
            .iter()
            .map(|(name, var)| format!(" {}=\"{var}\"", name.to_ascii_lowercase()))
            .collect();
        let echo: String = vars
            .iter()
            .map(|(name, var)| format!("{}: {var}\\n", name.to_ascii_lowercase()))
            .collect();
        let d = dir.display();
        let listen6 = addr6.map_or_else(String::new, |a| format!("        listen {a} ssl;\n"));
        Ok(format!(
            r#"# generated by mbx-testbed
master_process off;
worker_processes 1;
pid {d}/nginx.pid;
error_log {d}/error.log info;
events {{ worker_connections 256; }}
http {{
    default_type text/plain;
    client_body_temp_path {d}/client_body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    log_format mbx '$remote_addr "$request" $status $ssl_protocol{log_fields}';
    access_log {d}/access.log mbx;
    server {{
        listen {addr} ssl;
{listen6}        server_name _;
        ssl_certificate {chain};
        ssl_certificate_key {key};
        ssl_protocols {protocols};
        location = /headers {{ return 200 "{echo}"; }}
        location = /protocol {{ return 200 "$ssl_protocol\n"; }}
        location / {{ return 200 "mbx nginx ok\n"; }}
{extra_server}    }}
{extra_http}}}
"#,
            chain = self.cert_chain.display(),
            key = self.key.display(),
            protocols = protocols.join(" "),
            extra_server = self.extra_server,
            extra_http = self.extra_http,
        ))
    }

    /// Writes the config, starts nginx in the foreground on a free port and waits until it accepts.
    pub fn start(self) -> Result<Nginx, PeerError> {
        self.launch(None)
    }

    /// Starts nginx on a test host: in its network namespace, listening on the host's address
    /// (reached from processes on the topology's hosts, not from the test process). On a
    /// loopback topology the same as [`start`](Self::start).
    pub fn start_on(self, host: &crate::netns::Host) -> Result<Nginx, PeerError> {
        match host.namespace() {
            Some(_) => self.launch(Some(host)),
            None => self.start(),
        }
    }

    fn launch(self, host: Option<&crate::netns::Host>) -> Result<Nginx, PeerError> {
        let nginx = ensure_tool("nginx", "nginx")?;
        let dir = temp_dir("mbx-nginx")?;
        let mut last = None;
        for attempt in 0..BIND_ATTEMPTS {
            let addr = match host {
                None => SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()?)),
                Some(h) => h.addr(h.port().map_err(|e| PeerError::Io {
                    context: "a port on the test host".into(),
                    error: std::io::Error::other(e.to_string()),
                })?),
            };
            let addr6 = host
                .and_then(|h| h.ip6())
                .filter(|_| self.ipv6)
                .map(|ip6| SocketAddr::new(ip6.into(), addr.port()));
            let conf_path = dir.path().join("nginx.conf");
            std::fs::write(&conf_path, self.config(dir.path(), addr, addr6)?)
                .map_err(io_err("writing nginx.conf"))?;
            let log = dir.path().join(format!("stderr.{attempt}.log"));
            let out = log_file(&log)?;
            let err = out.try_clone().map_err(io_err("dup log"))?;
            let child = host
                .map_or_else(|| Command::new(&nginx), |h| h.command(&nginx))
                .arg("-p")
                .arg(dir.path())
                .arg("-e")
                .arg(dir.path().join("error.log"))
                .arg("-c")
                .arg(&conf_path)
                .args(["-g", "daemon off;"])
                .stdin(Stdio::null())
                .stdout(out)
                .stderr(err)
                .spawn()
                .map_err(io_err("spawning nginx"))?;
            let mut child = ChildGuard::new(child);
            match wait_for_listener(addr, &mut child, "nginx", &log, host.is_none()) {
                Ok(()) => {
                    return Ok(Nginx {
                        addr,
                        addr6,
                        dir,
                        child,
                    })
                }
                Err(PeerError::Exited { log: text, .. }) if looks_like_bind_failure(&text) => {
                    last = Some(text);
                }
                Err(PeerError::Exited {
                    what,
                    status,
                    log: text,
                }) => {
                    let errlog = read_lossy(&dir.path().join("error.log"));
                    return Err(PeerError::Exited {
                        what,
                        status,
                        log: format!("{text}\n{errlog}"),
                    });
                }
                Err(e) => return Err(e),
            }
        }
        Err(PeerError::Timeout {
            what: "nginx (no free port)".into(),
            after: READY_TIMEOUT,
            log: last.unwrap_or_default(),
        })
    }
}

/// A running nginx (single process, foreground), killed on drop.
///
/// Locations: `/headers` echoes the configured headers as `name: value` lines, `/protocol`
/// returns the negotiated TLS version, everything else returns `mbx nginx ok`.
#[derive(Debug)]
pub struct Nginx {
    addr: SocketAddr,
    addr6: Option<SocketAddr>,
    dir: tempfile::TempDir,
    child: ChildGuard,
}

impl Nginx {
    /// nginx serving `cert_chain` (leaf then intermediates, PEM) with `key`.
    pub fn builder(cert_chain: impl Into<PathBuf>, key: impl Into<PathBuf>) -> NginxBuilder {
        NginxBuilder {
            cert_chain: cert_chain.into(),
            key: key.into(),
            protocols: vec![TlsVersion::Tls12, TlsVersion::Tls13],
            headers: Vec::new(),
            extra_server: String::new(),
            extra_http: String::new(),
            ipv6: false,
        }
    }

    /// nginx for files written by [`crate::pki::IssuedCert::write_to`].
    pub fn from_files(files: &crate::pki::PkiFiles) -> NginxBuilder {
        Self::builder(&files.chain, &files.key)
    }

    /// Listening address (127.0.0.1, or the test host's).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The IPv6 listening address, with [`NginxBuilder::also_ipv6`] on a namespace host.
    pub fn addr6(&self) -> Option<SocketAddr> {
        self.addr6
    }

    /// Listening port.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Directory holding the config and logs.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Path of the access log.
    pub fn access_log_path(&self) -> PathBuf {
        self.dir.path().join("access.log")
    }

    /// Current access log contents.
    pub fn access_log(&self) -> String {
        read_lossy(&self.access_log_path())
    }

    /// Current error log contents.
    pub fn error_log(&self) -> String {
        read_lossy(&self.dir.path().join("error.log"))
    }

    /// Polls the access log until `pred` holds (nginx logs after sending the response, so a
    /// client can finish first). Returns the log, or the last contents on timeout.
    pub fn wait_access_log(&self, pred: impl Fn(&str) -> bool) -> Result<String, PeerError> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let log = self.access_log();
            if pred(&log) {
                return Ok(log);
            }
            if Instant::now() >= deadline {
                return Err(PeerError::Timeout {
                    what: "nginx access log".into(),
                    after: READY_TIMEOUT,
                    log,
                });
            }
            std::thread::sleep(POLL_INTERVAL);
        }
    }

    /// Process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }
}

// ---------------------------------------------------------------------------------------------
// GnuTLS: gnutls-serv and gnutls-cli, a TLS stack independent of OpenSSL

/// The GnuTLS priority string that allows `version` only (or GnuTLS's defaults).
fn gnutls_priority(version: Option<TlsVersion>) -> &'static str {
    match version {
        None => "NORMAL",
        Some(TlsVersion::Tls12) => "NORMAL:-VERS-ALL:+VERS-TLS1.2",
        Some(TlsVersion::Tls13) => "NORMAL:-VERS-ALL:+VERS-TLS1.3",
    }
}

/// A running `gnutls-serv --http` (GnuTLS's test server; it answers any request with an HTML
/// page naming the protocol and echoing the request's header), killed on drop.
#[derive(Debug)]
pub struct GnutlsServer {
    addr: SocketAddr,
    log: PathBuf,
    _child: ChildGuard,
    _dir: tempfile::TempDir,
}

impl GnutlsServer {
    /// Starts a server with `files`' chain and key on a free port (it listens on every
    /// address; this is its 127.0.0.1), allowing `version` only if given, and waits until it
    /// accepts connections. Installs `gnutls-bin` if missing (as root).
    pub fn start(
        files: &crate::pki::PkiFiles,
        version: Option<TlsVersion>,
    ) -> Result<GnutlsServer, PeerError> {
        let serv = ensure_tool("gnutls-serv", "gnutls-bin")?;
        let dir = temp_dir("mbx-gnutls-serv")?;
        let started = start_on_free_port("gnutls-serv", dir.path(), false, |port| {
            let mut cmd = Command::new(&serv);
            cmd.args(["--http", "--port", &port.to_string()])
                .arg("--x509certfile")
                .arg(&files.chain)
                .arg("--x509keyfile")
                .arg(&files.key)
                .args(["--priority", gnutls_priority(version)]);
            cmd
        })?;
        Ok(GnutlsServer {
            addr: started.addr,
            log: started.log,
            _child: started.child,
            _dir: dir,
        })
    }

    /// Its address on loopback.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Everything it printed so far.
    pub fn log(&self) -> String {
        read_lossy(&self.log)
    }
}

/// A run of `gnutls-cli` (GnuTLS's client) against `addr`: the server's name is sent (SNI)
/// and checked against its certificate, which must chain to `cafile`; `input` is sent, and
/// what comes back until the server closes is captured.
pub fn gnutls_cli(
    addr: SocketAddr,
    server_name: &str,
    cafile: &Path,
    version: Option<TlsVersion>,
    input: &[u8],
) -> Result<ProcessOutput, PeerError> {
    let cli = ensure_tool("gnutls-cli", "gnutls-bin")?;
    let mut cmd = Command::new(cli);
    cmd.arg("--x509cafile")
        .arg(cafile)
        .args(["--priority", gnutls_priority(version)])
        .args(["--sni-hostname", server_name])
        .args(["--verify-hostname", server_name])
        .args(["--port", &addr.port().to_string()])
        .arg(addr.ip().to_string());
    run_with_timeout(cmd, input, RUN_TIMEOUT)
}

// ---------------------------------------------------------------------------------------------
// curl

/// Builder-style runner for `curl`.
#[derive(Debug, Clone)]
pub struct Curl {
    url: String,
    cacert: Option<PathBuf>,
    resolve: Vec<String>,
    version: Option<TlsVersion>,
    headers: Vec<String>,
    args: Vec<String>,
    timeout: Duration,
}

/// Result of a curl run.
#[derive(Debug, Clone)]
pub struct CurlOutput {
    /// curl's exit code (0 on success; 60 = certificate problem, 35 = handshake failure).
    pub exit_code: Option<i32>,
    /// HTTP status, if a response was received.
    pub status: Option<u16>,
    /// Response body.
    pub body: Vec<u8>,
    /// `-v` trace and errors (stderr).
    pub verbose: String,
}

impl CurlOutput {
    /// Body as text.
    pub fn body_str(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The TLS version curl reports (`SSL connection using TLSv1.3 / ...`).
    pub fn tls_version(&self) -> Option<String> {
        self.verbose.lines().find_map(|l| {
            let rest = l.split("SSL connection using ").nth(1)?;
            rest.split_whitespace().next().map(str::to_owned)
        })
    }
}

impl Curl {
    /// A GET of `url`.
    pub fn new(url: &str) -> Self {
        Curl {
            url: url.to_owned(),
            cacert: None,
            resolve: Vec::new(),
            version: None,
            headers: Vec::new(),
            args: Vec::new(),
            timeout: RUN_TIMEOUT,
        }
    }

    /// Trust anchors (`--cacert`).
    pub fn cacert(mut self, path: impl Into<PathBuf>) -> Self {
        self.cacert = Some(path.into());
        self
    }

    /// Resolve `host:port` to `ip` (`--resolve`), so a DNS name from the test PKI reaches loopback.
    pub fn resolve(mut self, host: &str, port: u16, ip: std::net::IpAddr) -> Self {
        self.resolve.push(format!("{host}:{port}:{ip}"));
        self
    }

    /// Exactly this TLS version (`--tlsv1.x --tls-max 1.x`).
    pub fn version(mut self, version: TlsVersion) -> Self {
        self.version = Some(version);
        self
    }

    /// A request header, `Name: value`.
    pub fn header(mut self, header: &str) -> Self {
        self.headers.push(header.to_owned());
        self
    }

    /// Extra argument.
    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// Bound on the run (also passed as `--max-time`).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Runs curl. A failed transfer is not an `Err`: inspect `exit_code`.
    pub fn run(&self) -> Result<CurlOutput, PeerError> {
        let curl = ensure_tool("curl", "curl")?;
        let dir = temp_dir("mbx-curl")?;
        let body_path = dir.path().join("body");
        let mut cmd = Command::new(curl);
        cmd.args(["-sS", "-v", "--max-time"])
            .arg(self.timeout.as_secs().max(1).to_string())
            .arg("-o")
            .arg(&body_path)
            .args(["-w", "%{http_code}"]);
        if let Some(ca) = &self.cacert {
            cmd.arg("--cacert").arg(ca);
        }
        for r in &self.resolve {
            cmd.args(["--resolve", r]);
        }
        match self.version {
            Some(TlsVersion::Tls12) => {
                cmd.args(["--tlsv1.2", "--tls-max", "1.2"]);
            }
            Some(TlsVersion::Tls13) => {
                cmd.args(["--tlsv1.3", "--tls-max", "1.3"]);
            }
            None => {}
        }
        for h in &self.headers {
            cmd.args(["-H", h]);
        }
        cmd.args(&self.args).arg(&self.url);
        let out = run_with_timeout(cmd, &[], self.timeout + Duration::from_secs(5))?;
        let status = String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse::<u16>()
            .ok()
            .filter(|s| *s != 0);
        Ok(CurlOutput {
            exit_code: out.status.code(),
            status,
            body: std::fs::read(&body_path).unwrap_or_default(),
            verbose: out.stderr_str(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::{listening_sockets, owns_listener};
    use crate::tcp_table::parse;
    use std::net::TcpListener;

    /// Listening entries of both table formats are found by port; other states and ports are
    /// not (lines as the kernel writes them, trimmed after the inode).
    #[test]
    fn listening_sockets_of_ipv4_and_ipv6_tables() {
        let head = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n";
        let v4 = format!(
            "{head}   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4242\n   1: 0100007F:1F90 0100007F:A0B2 01 00000000:00000000 00:00000000 00000000     0        0 4343\n"
        );
        let v6 = format!(
            "{head}   0: 00000000000000000000000001000000:1F90 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 5151\n"
        );
        let (v4, v6) = (parse(&v4), parse(&v6));
        assert_eq!(listening_sockets(&v4, 8080), vec!["socket:[4242]"]);
        assert_eq!(listening_sockets(&v6, 8080), vec!["socket:[5151]"]);
        assert!(listening_sockets(&v4, 8081).is_empty());
        assert!(listening_sockets(&parse("garbage"), 8080).is_empty());
    }

    /// Our own listener counts; a port nobody of ours listens on does not.
    #[test]
    fn owns_listener_sees_our_listener_only() {
        let me = std::process::id();
        let v4 = TcpListener::bind("127.0.0.1:0").unwrap();
        assert!(owns_listener(me, v4.local_addr().unwrap().port()));
        let closed = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = closed.local_addr().unwrap().port();
        drop(closed);
        assert!(!owns_listener(me, port));
    }
}
