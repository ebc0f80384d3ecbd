//! A throwaway `redis-server` for tests (feature `testing`).
//!
//! ```no_run
//! # async fn demo() {
//! let Some(server) = tollgate_redis::RedisServer::start_or_skip("my_test") else {
//!     return; // redis-server is missing and not required: skipped
//! };
//! let url = server.url();
//! # let _ = url; }
//! ```
//!
//! When `redis-server` is not installed, [`RedisServer::start_or_skip`]
//! prints a note and returns `None`, unless `TOLLGATE_REQUIRE_REDIS=1` is
//! set (CI sets it), which turns the missing server into a test failure.
//! `REDIS_SERVER` names another binary than `redis-server` on `PATH`.

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Whether tests must fail rather than skip without `redis-server`
/// (`TOLLGATE_REQUIRE_REDIS=1`).
pub fn require_redis() -> bool {
    std::env::var("TOLLGATE_REQUIRE_REDIS").is_ok_and(|v| v == "1")
}

fn binary() -> String {
    std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_owned())
}

/// A `redis-server` on a free loopback port, without persistence; killed
/// when dropped.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    child: Option<Child>,
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
        match RedisServer::start() {
            Ok(server) => Some(server),
            Err(e) if e.kind() == io::ErrorKind::NotFound && !require_redis() => {
                // Straight to stderr: the test harness captures `eprintln!`.
                let _ = writeln!(
                    io::stderr(),
                    "note: {test} skipped: `{}` not found (set TOLLGATE_REQUIRE_REDIS=1 to fail instead)",
                    binary()
                );
                None
            }
            Err(e) => panic!("{test}: cannot start {}: {e}", binary()),
        }
    }

    /// Starts a server on a free port and waits until it answers.
    pub fn start() -> io::Result<RedisServer> {
        let mut last = io::Error::other("no free port");
        for _ in 0..5 {
            let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
            let mut server = RedisServer { port, child: None };
            match server.spawn() {
                Ok(()) => return Ok(server),
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(e),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    fn spawn(&mut self) -> io::Result<()> {
        let child = Command::new(binary())
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .args(["--dir", &std::env::temp_dir().to_string_lossy()])
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
            if self.ping() {
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

    fn ping(&self) -> bool {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
        let mut buf = [0u8; 7];
        s.write_all(b"PING\r\n").is_ok() && s.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
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
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}
