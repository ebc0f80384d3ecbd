//! Shared by the binary's tests.

use std::io::{BufRead, BufReader};
use std::process::ChildStdout;
use std::sync::mpsc::Receiver;

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
