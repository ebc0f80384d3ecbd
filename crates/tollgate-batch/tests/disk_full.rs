//! A full disk under the output (SPEC BATCH-3: a finished line is never
//! corrupted, a result is never lost), on a real small filesystem: a tmpfs
//! mounted for the test. Mounting needs root; as another user the tests
//! print why they are skipped and pass.
//!
//! Found by a run on a 256 KiB tmpfs: the append that met the full disk
//! left a torn fragment, the other workers kept appending, a later line
//! was glued to the fragment once space came back, and resume refused the
//! file (`corrupt_output`).

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use tollgate_batch::output::{self, Meta, OutputLine, OutputWriter, ResponseRecord};
use tollgate_batch::{BatchConfig, EXIT_STOPPED, Outcome, StopReason, Target};
use tollgate_sim::{SimConfig, Simulator};

use common::{Dir, chat_line, counts, never, write_lines};

/// A tmpfs of `size` mounted on a fresh directory, unmounted when dropped.
struct Tmpfs {
    dir: Dir,
}

impl Tmpfs {
    /// The mount, or `None` (with a message) when not running as root.
    fn mount(name: &str, size: &str) -> Option<Tmpfs> {
        if !is_root() {
            println!("skipped: mounting a tmpfs needs root (the test runs as root in CI)");
            return None;
        }
        let dir = Dir::new(name);
        let at = dir.path("");
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&at)
            .status()
            .expect("run mount");
        assert!(status.success(), "mount -t tmpfs on {}", at.display());
        Some(Tmpfs { dir })
    }

    fn path(&self, f: &str) -> PathBuf {
        self.dir.path(f)
    }

    /// Gives the filesystem a new size (space comes back).
    fn resize(&self, size: &str) {
        let status = Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(self.dir.path(""))
            .status()
            .expect("run mount");
        assert!(status.success(), "remount");
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir.path("")).status();
    }
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|euid| euid == "0"))
        })
        .unwrap_or(false)
}

/// Writes to `path` until the filesystem is full.
fn fill(path: &Path) {
    let mut f = std::fs::File::create(path).expect("filler");
    let chunk = vec![b'x'; 4096];
    loop {
        if f.write_all(&chunk).is_err() {
            break;
        }
    }
}

fn line(id: &str, body_bytes: usize) -> OutputLine {
    OutputLine {
        id: format!("batch_req_{id}"),
        custom_id: id.to_owned(),
        response: Some(ResponseRecord {
            status_code: 200,
            request_id: None,
            body: serde_json::json!({ "text": "y".repeat(body_bytes) }),
        }),
        error: None,
        tollgate: Some(Meta {
            input_hash: format!("sha256:{id}"),
            attempts: 1,
        }),
    }
}

// proves: BATCH-3 (an append that meets a full disk leaves the file as it
// was before it and refuses every later append, so no line can be glued
// to a fragment when space comes back; the file resumes as it was)
#[test]
fn a_failed_append_leaves_the_file_as_it_was_and_refuses_the_next() {
    let Some(fs) = Tmpfs::mount("disk-full-writer", "256k") else {
        return;
    };
    let path = fs.path("out.jsonl");
    let writer = OutputWriter::open(&path, false).expect("open");
    writer.append(&line("a", 100)).expect("a fits");
    let before = std::fs::metadata(&path).expect("meta").len();

    // The disk is full but for the rest of the output's last page: a line
    // longer than that is written in part, then fails.
    fill(&fs.path("filler"));
    let failed = writer.append(&line("b", 16 * 1024));
    assert!(failed.is_err(), "a line larger than the free space");
    let after = std::fs::metadata(&path).expect("meta").len();
    assert_eq!(
        after,
        before,
        "the failed append left {} torn bytes",
        after - before
    );

    // Space comes back: the writer still refuses (another worker's line
    // would follow whatever the failure left).
    std::fs::remove_file(fs.path("filler")).expect("free space");
    assert!(
        writer.append(&line("c", 10)).is_err(),
        "an append after a failed one is refused"
    );
    drop(writer);

    let existing = output::scan(&path, false).expect("the file resumes");
    assert_eq!(existing.torn_bytes, 0);
    assert_eq!(existing.records.keys().collect::<Vec<_>>(), vec!["a"]);
}

// proves: BATCH-3 (a run whose output's disk fills stops with a clear
// error and the "stopped, re-run to resume" exit code, its output whole;
// once there is space the re-run finishes every item, each exactly once)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_on_a_full_disk_stops_cleanly_and_resumes_with_nothing_lost() {
    let Some(fs) = Tmpfs::mount("disk-full-run", "256k") else {
        return;
    };
    let dir = Dir::new("disk-full-run-input");
    let server = Simulator::spawn(
        SimConfig {
            completion_tokens: 400,
            ttft: Duration::from_millis(2),
            ..SimConfig::default()
        },
        "127.0.0.1:0",
    )
    .await
    .expect("simulator");
    // About 3 KiB per output line: the 256 KiB hold fewer than 100 of them.
    let n = 200;
    let lines: Vec<Value> = (0..n)
        .map(|i| chat_line(&format!("item-{i}"), "hello", 400))
        .collect();
    write_lines(&dir.path("in.jsonl"), &lines);
    let out = fs.path("out.jsonl");
    let config = || {
        let mut c = BatchConfig::new(
            dir.path("in.jsonl"),
            Some(out.clone()),
            Target::Http {
                base_url: server.openai_base_url(),
                api_key: None,
            },
        );
        c.concurrency = 16;
        c.item_timeout = Some(Duration::from_secs(30));
        c
    };

    let report = tollgate_batch::run(config(), never()).await.expect("run");
    match &report.outcome {
        Outcome::Stopped(StopReason::Output(e)) => {
            assert!(e.contains("No space left"), "the error says why: {e}");
        }
        other => panic!("the run stops on the full disk: {other:?}"),
    }
    assert_eq!(report.outcome.exit_code(), EXIT_STOPPED);
    let existing = output::scan(&out, false).expect("the output resumes");
    assert_eq!(existing.torn_bytes, 0, "the output is left whole");
    assert!(existing.records.values().all(|r| !r.failed));
    let recorded = counts(&out);
    assert!(recorded.len() < n, "the disk filled before the end");
    assert!(recorded.values().all(|&c| c == 1));
    assert_eq!(
        report.summary.succeeded,
        recorded.len() as u64,
        "the summary counts the lines written"
    );

    fs.resize("4m");
    let report = tollgate_batch::run(config(), never())
        .await
        .expect("resume");
    assert_eq!(report.outcome, Outcome::Complete, "{}", report.summary);
    assert_eq!(report.summary.already_done, recorded.len() as u64);
    let seen = counts(&out);
    assert!(
        output::scan(&out, false)
            .expect("scan")
            .records
            .values()
            .all(|r| !r.failed)
    );
    assert_eq!(seen.len(), n, "every item has a result");
    assert!(seen.values().all(|&c| c == 1), "none twice");
}
