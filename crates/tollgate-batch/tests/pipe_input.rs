//! Input from a pipe (a FIFO, as `--input /dev/stdin` under a shell pipe
//! is): read once, the run reads each item's body back from its copy, and
//! a resume pipes the same lines again (SPEC BATCH-1, BATCH-3).
#![cfg(unix)]

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;
use tollgate_batch::Outcome;

use common::{Dir, chat_line, counts, never};

/// Writes `lines` into the FIFO at `path` from a thread (opening it
/// waits for the reader).
fn feed(path: &Path, lines: &[Value]) -> std::thread::JoinHandle<()> {
    let path = path.to_owned();
    let mut text = String::new();
    for l in lines {
        text.push_str(&l.to_string());
        text.push('\n');
    }
    std::thread::spawn(move || {
        std::fs::write(&path, text).expect("write the FIFO");
    })
}

/// Lets a reader blocked opening the FIFO go on (a writer that opens and
/// closes it at once), so a failing test ends instead of hanging.
fn unblock(path: PathBuf) {
    std::thread::spawn(move || {
        let _ = std::fs::OpenOptions::new().write(true).open(path);
    });
}

// proves: BATCH-1 (an input that can be read only once, a FIFO or a shell
// pipe as `--input /dev/stdin`, runs: each item's body is read back from
// the copy made while the input was validated), BATCH-3 (resumable: the
// same lines piped again skip every finished item). Found in review: the
// runner opened the input again by its path to read each body at its
// offset, which on a pipe blocks (a FIFO has no writer any more) or fails
// as "input changed" (`/dev/stdin` cannot seek), and nothing was sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn input_from_a_fifo_runs_and_resumes() {
    let dir = Dir::new("fifo");
    let server = common::sim_per_second(None, None).await;
    let fifo = dir.path("in.fifo");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("mkfifo");
    assert!(made.success(), "mkfifo failed");
    let lines: Vec<Value> = (0..6)
        .map(|i| chat_line(&format!("p{i}"), "hello", 4))
        .collect();
    for round in 0..2 {
        let writer = feed(&fifo, &lines);
        let mut c = common::http_config(&dir, &server);
        c.input = fifo.clone();
        c.concurrency = 2;
        let run = tokio::spawn(tollgate_batch::run(c, never()));
        let report = match tokio::time::timeout(Duration::from_secs(30), run).await {
            Ok(joined) => joined.expect("join").expect("run"),
            Err(_) => {
                unblock(fifo.clone());
                panic!("round {round}: the run hung reading the FIFO again");
            }
        };
        writer.join().expect("writer");
        assert!(
            matches!(report.outcome, Outcome::Complete),
            "round {round}: {:?}",
            report.outcome
        );
        let out = counts(&dir.path("out.jsonl"));
        assert_eq!(out.len(), 6, "round {round}: {out:?}");
        assert!(out.values().all(|&n| n == 1), "round {round}: {out:?}");
        if round == 1 {
            assert_eq!(report.summary.already_done, 6);
        }
        assert_eq!(server.stats().requests_total, 6, "round {round}");
    }
    server.shutdown().await.expect("shutdown");
}
