//! [`RedisServer`]: one throwaway `redis-server`, plain or TLS-only.

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::certs::Certificates;
use super::{TempDir, binary, or_skip};

/// How the server listens.
#[derive(Debug)]
pub(super) enum Listen {
    /// Plain TCP on `port`.
    Plain,
    /// TLS only on `port` (no plain port), with these certificates (a
    /// TLS cluster's nodes share them).
    Tls(Arc<Certificates>),
}

/// A `redis-server` on a free loopback port, without persistence; killed
/// when dropped.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    listen: Listen,
    /// More arguments (a cluster node's).
    extra: Vec<String>,
    child: Option<Child>,
    dir: TempDir,
}

impl RedisServer {
    /// Starts a server, or returns `None` (after printing why) when
    /// `redis-server` is missing and not required.
    ///
    /// # Panics
    ///
    /// When the server cannot be started and `TOLLGATE_REQUIRE_REDIS=1`,
    /// or it was found but did not start: that is the test's failure.
    pub fn start_or_skip(test: &str) -> Option<RedisServer> {
        or_skip(test, &binary(), RedisServer::start())
    }

    /// Starts a TLS-only server (see [`start_tls`](Self::start_tls)), or
    /// returns `None` (after printing why) when `redis-server` or
    /// `openssl` is missing and not required.
    ///
    /// # Panics
    ///
    /// As [`start_or_skip`](Self::start_or_skip).
    pub fn start_tls_or_skip(test: &str) -> Option<RedisServer> {
        or_skip(test, "a TLS redis-server", RedisServer::start_tls())
    }

    /// Starts a server on a free port and waits until it answers.
    pub fn start() -> io::Result<RedisServer> {
        RedisServer::start_with(|| Ok(Listen::Plain), Vec::new)
    }

    /// Starts a server that speaks TLS only (no plain port), with a server
    /// certificate for `127.0.0.1` and `localhost` signed by a certificate
    /// authority made for it ([`ca_file`](Self::ca_file)); clients need no
    /// certificate of their own.
    pub fn start_tls() -> io::Result<RedisServer> {
        let certs = Arc::new(Certificates::make()?);
        RedisServer::start_with(|| Ok(Listen::Tls(Arc::clone(&certs))), Vec::new)
    }

    /// Starts a server with `extra` arguments, trying a few free ports.
    pub(super) fn start_with(
        listen: impl Fn() -> io::Result<Listen>,
        extra: impl Fn() -> Vec<String>,
    ) -> io::Result<RedisServer> {
        let mut last = io::Error::other("no free port");
        for _ in 0..5 {
            let mut server = RedisServer {
                port: free_port()?,
                listen: listen()?,
                extra: extra(),
                child: None,
                dir: TempDir::new("redis")?,
            };
            match server.spawn() {
                Ok(()) => return Ok(server),
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(e),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// Starts a cluster node: the cluster bus on a port of its own; with
    /// `certs`, TLS only, the bus too.
    pub(super) fn start_node(certs: Option<&Arc<Certificates>>) -> io::Result<RedisServer> {
        let listen = || {
            Ok(match certs {
                Some(c) => Listen::Tls(Arc::clone(c)),
                None => Listen::Plain,
            })
        };
        RedisServer::start_with(listen, || {
            let bus = free_port().unwrap_or(0);
            let mut args: Vec<String> = [
                "--cluster-enabled",
                "yes",
                "--cluster-port",
                &bus.to_string(),
                "--cluster-node-timeout",
                "5000",
                "--cluster-config-file",
                "nodes.conf",
            ]
            .map(String::from)
            .into();
            if certs.is_some() {
                args.extend(["--tls-cluster", "yes"].map(String::from));
            }
            args
        })
    }

    fn spawn(&mut self) -> io::Result<()> {
        let mut cmd = Command::new(binary());
        cmd.args(["--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(self.dir.path());
        match &self.listen {
            Listen::Plain => {
                cmd.args(["--port", &self.port.to_string()]);
            }
            Listen::Tls(certs) => {
                cmd.args(["--port", "0", "--tls-port", &self.port.to_string()])
                    .arg("--tls-cert-file")
                    .arg(certs.server_cert())
                    .arg("--tls-key-file")
                    .arg(certs.server_key())
                    .arg("--tls-ca-cert-file")
                    .arg(certs.ca_file())
                    .args(["--tls-auth-clients", "no"]);
            }
        }
        let child = cmd
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut()
                && let Some(status) = child.try_wait()?
            {
                self.child = None;
                return Err(io::Error::other(format!("redis-server exited: {status}")));
            }
            if self.ready() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill();
        Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "redis-server did not answer within 10 s",
        ))
    }

    /// A plain server answers `INFO server` with this child's process id:
    /// a server another test suite started on the same port between
    /// [`free_port`] and the spawn would otherwise pass for this one (this
    /// child then exits, unable to bind, and the next port is tried). A
    /// TLS one accepts connections (it listens once it is ready).
    fn ready(&self) -> bool {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        if matches!(self.listen, Listen::Tls(_)) {
            return true;
        }
        let Some(pid) = self.child.as_ref().map(Child::id) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
        if s.write_all(b"INFO server\r\n").is_err() {
            return false;
        }
        let mut reply = Vec::new();
        let mut buf = [0u8; 4096];
        while reply.len() < 64 * 1024 {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => return false,
                Ok(n) => reply.extend_from_slice(&buf[..n]),
            }
            let text = String::from_utf8_lossy(&reply);
            if let Some(rest) = text.split("\r\nprocess_id:").nth(1)
                && let Some((id, _)) = rest.split_once("\r\n")
            {
                return id.trim() == pid.to_string();
            }
        }
        false
    }

    /// `redis://127.0.0.1:<port>`, or `rediss://127.0.0.1:<port>` for a
    /// TLS server.
    pub fn url(&self) -> String {
        match self.listen {
            Listen::Plain => format!("redis://127.0.0.1:{}", self.port),
            Listen::Tls(_) => format!("rediss://127.0.0.1:{}", self.port),
        }
    }

    /// A client of this server (checking a TLS server's certificate
    /// against its authority).
    pub(super) fn client(&self) -> io::Result<redis::Client> {
        match &self.listen {
            Listen::Plain => redis::Client::open(self.url()),
            Listen::Tls(certs) => {
                crate::connect::ensure_crypto_provider();
                let root_cert = Some(std::fs::read(certs.ca_file())?);
                redis::Client::build_with_tls(
                    self.url(),
                    redis::TlsCertificates {
                        client_tls: None,
                        root_cert,
                    },
                )
            }
        }
        .map_err(io::Error::other)
    }

    /// The PEM file of the certificate authority of a TLS server's
    /// certificate.
    pub fn ca_file(&self) -> Option<&Path> {
        match &self.listen {
            Listen::Plain => None,
            Listen::Tls(certs) => Some(certs.ca_file()),
        }
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Whether the server runs.
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Kills the server at once (SIGKILL), as an outage would.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port (empty: no persistence).
    pub fn restart(&mut self) -> io::Result<()> {
        self.kill();
        self.spawn()
    }

    /// A cluster node's bus port.
    pub(super) fn bus_port(&self) -> Option<u16> {
        let at = self.extra.iter().position(|a| a == "--cluster-port")?;
        self.extra.get(at + 1)?.parse().ok()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A port that was free a moment ago.
fn free_port() -> io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}
