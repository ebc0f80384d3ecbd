//! Shared by the binary's tests.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, ChildStdout, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

/// Reads the server's stdout on a thread of its own and sends the URL of
/// every "listening on URL" line it prints.
pub fn announced_urls(stdout: ChildStdout) -> Receiver<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            if let Some(rest) = line.split("listening on ").nth(1) {
                let url = rest.split_whitespace().next().unwrap_or("").to_owned();
                let _ = tx.send(url);
            }
        }
    });
    rx
}

pub const BIN: &str = env!("CARGO_BIN_EXE_tollgate");

/// How long the binary may take to start, answer or stop.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// Writes `text` to a fresh file called `name` under the target's
/// scratch directory and returns its path.
pub fn write_config(name: &str, text: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "serve-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// Waits (bounded) for `child` to exit; kills it and fails otherwise.
pub fn wait_exit(child: &mut Child) -> ExitStatus {
    let until = Instant::now() + PATIENCE;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > until {
            let _ = child.kill();
            panic!("tollgate did not exit in time");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A running `tollgate serve`, stopped (SIGKILL) on drop if still alive.
pub struct Served {
    /// The process.
    pub child: Child,
    /// Its base URL.
    pub base: String,
}

impl Served {
    /// Starts `tollgate serve` with `args` and `env`, and waits for its
    /// banner line to learn the address.
    pub fn start(args: &[&str], env: &[(&str, &str)]) -> Served {
        let mut cmd = Command::new(BIN);
        cmd.arg("serve")
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap();
        let stdout = child.stdout.take().unwrap();
        let rx = announced_urls(stdout);
        let base = match rx.recv_timeout(PATIENCE) {
            Ok(base) => base,
            Err(_) => {
                let _ = child.kill();
                panic!("no banner from tollgate serve");
            }
        };
        Served { child, base }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Sends SIGTERM and waits for the exit.
    pub fn terminate(&mut self) -> ExitStatus {
        terminate(&mut self.child)
    }
}

/// Sends `child` SIGTERM and waits (bounded) for its exit.
pub fn terminate(child: &mut Child) -> ExitStatus {
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    wait_exit(child)
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An HTTP client without proxy, patient.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(PATIENCE)
        .build()
        .unwrap()
}

/// Runs `tollgate serve --config <path>` and expects it to refuse to start.
pub fn serve_fails(path: &str) -> Output {
    let mut child = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--config", path])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = wait_exit(&mut child);
    let output = child.wait_with_output().unwrap();
    assert!(!status.success(), "serve must fail on {path}");
    assert_ne!(status.code(), Some(0));
    output
}

/// The process's standard error, as text.
pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}
