//! Adversarial review of the batch runner (SPEC §12, docs/batch.md): each
//! test is a suspected defect, written to fail while it stands.

mod common;

use std::time::Duration;

use serde_json::Value;
use tollgate::Dimension;
use tollgate::config::Limit;
use tollgate_batch::{BatchError, Outcome};

use common::{Dir, chat_line, counts, never, write_lines};

fn lines_of(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .expect("output")
        .lines()
        .map(|l| serde_json::from_str(l).expect("json"))
        .collect()
}

// docs/batch.md "Resume": "a symbolic link to the output is the same
// output"; items run again (--retry-failed) "must not leave two lines:
// their old lines are removed first by writing the file anew next to it
// ... and renaming it over the old one". Through a symbolic link the rename
// replaces the link itself: the file the link named keeps the old failure
// and never receives the new result, and the output's lock (taken on the
// resolved name, `real.jsonl.lock`) no longer covers the path, which is now
// a regular file of its own (a second run via the link locks
// `out.jsonl.lock` and appends to the same file: BATCH-3 duplicates).
#[tokio::test]
async fn retry_failed_through_a_symlinked_output_updates_the_linked_file() {
    let dir = Dir::new("rev-symlink");
    let server = common::sim_per_second(None, None).await;
    write_lines(
        &dir.path("in.jsonl"),
        &[chat_line("a", "hello", 4), chat_line("b", "there", 4)],
    );
    // A recorded failure for `a`, from another tool (no hash: trusted).
    std::fs::write(
        dir.path("real.jsonl"),
        "{\"id\":\"batch_req_x\",\"custom_id\":\"a\",\"response\":null,\"error\":{\"code\":\"server\",\"message\":\"boom\"}}\n",
    )
    .expect("write");
    std::os::unix::fs::symlink(dir.path("real.jsonl"), dir.path("out.jsonl")).expect("symlink");
    let mut c = common::http_config(&dir, &server);
    c.retry_failed = true;
    c.item_timeout = Some(Duration::from_secs(20));
    let report = tollgate_batch::run(c, never()).await.expect("run");
    assert_eq!(report.outcome, Outcome::Complete, "{}", report.summary);
    let link = std::fs::symlink_metadata(dir.path("out.jsonl")).expect("meta");
    let real = lines_of(&dir.path("real.jsonl"));
    let failures: Vec<&Value> = real.iter().filter(|l| !l["error"].is_null()).collect();
    assert!(
        link.file_type().is_symlink() && real.len() == 2 && failures.is_empty(),
        "out.jsonl is a symlink: {}; the linked file real.jsonl holds {} line(s), {} failure(s): {real:?}",
        link.file_type().is_symlink(),
        real.len(),
        failures.len()
    );
}

// BATCH-5 ("Configuration errors abort the run before any request"); a
// library caller's zero limit must be a configuration error, not a panic
// (the plan divides by the limit before the engine checks it).
#[tokio::test]
async fn a_zero_request_limit_is_a_configuration_error_not_a_panic() {
    let dir = Dir::new("rev-zero");
    let server = common::sim_per_second(None, None).await;
    write_lines(&dir.path("in.jsonl"), &[chat_line("a", "hello", 4)]);
    let mut c = common::http_config(&dir, &server);
    c.limits = vec![Limit::new(Dimension::Requests, 0, Duration::from_secs(1))];
    let handle = tokio::spawn(async move { tollgate_batch::run(c, never()).await });
    match handle.await {
        Ok(Err(BatchError::Config(_))) => {}
        Ok(other) => panic!("expected a configuration error, got {other:?}"),
        Err(e) => panic!("the run panicked: {e}"),
    }
    assert_eq!(server.stats().requests_total, 0);
    let _ = counts(&dir.path("out.jsonl"));
}

// docs/batch.md "Stopping cleanly (... Ctrl-C): no new item starts; items
// not sent yet are dropped unrecorded; calls already at the provider (paid
// for) finish and are recorded". An item whose first attempt failed (5xx)
// and that waits in its retry backoff when Ctrl-C comes is not at the
// provider: the run goes on sending it new attempts after the interrupt
// (here every one of them, until --max-attempts), and records it failed.
#[tokio::test]
async fn an_interrupt_sends_no_new_attempt_of_an_item_in_backoff() {
    let dir = Dir::new("rev-backoff");
    let server = tollgate_sim::Simulator::spawn(
        tollgate_sim::SimConfig {
            error_rate: 1.0,
            window: Duration::from_secs(1),
            ..tollgate_sim::SimConfig::default()
        },
        "127.0.0.1:0",
    )
    .await
    .expect("simulator");
    let server = std::sync::Arc::new(server);
    write_lines(&dir.path("in.jsonl"), &[chat_line("a", "hello", 4)]);
    let mut c = common::http_config(&dir, &server);
    c.concurrency = 1;
    c.max_attempts = 3;
    c.item_timeout = Some(Duration::from_secs(30));
    let at_interrupt = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let seen = std::sync::Arc::clone(&at_interrupt);
    let sim = std::sync::Arc::clone(&server);
    let stats = move || sim.stats();
    let interrupt = async move {
        while stats().requests_total < 1 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // The 5xx came back; the item now waits ~1 s before its retry.
        tokio::time::sleep(Duration::from_millis(200)).await;
        seen.store(stats().requests_total, std::sync::atomic::Ordering::SeqCst);
    };
    let report = tollgate_batch::run(c, interrupt).await.expect("run");
    let sent_before = at_interrupt.load(std::sync::atomic::Ordering::SeqCst);
    let total = server.stats().requests_total;
    assert_eq!(
        total, sent_before,
        "{} attempt(s) sent after the interrupt; outcome {:?}; output {:?}",
        total - sent_before,
        report.outcome,
        std::fs::read_to_string(dir.path("out.jsonl")).unwrap_or_default()
    );
}

// docs/batch.md "One run per output" (the lock is named after the output's
// resolved path, "so a symbolic link to the output is the same output").
// A run with --retry-failed through a link replaces the link with a
// regular file while it holds `real.jsonl.lock`; a second run started on
// the same path meanwhile locks `out.jsonl.lock`, is let in, and both
// send and append the same items (BATCH-3: two lines for one custom_id).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_run_on_a_symlinked_output_is_refused_during_a_retry_failed_run() {
    let dir = Dir::new("rev-symlink-lock");
    let server = tollgate_sim::Simulator::spawn(
        tollgate_sim::SimConfig {
            ttft: Duration::from_millis(1500),
            window: Duration::from_secs(1),
            ..tollgate_sim::SimConfig::default()
        },
        "127.0.0.1:0",
    )
    .await
    .expect("simulator");
    write_lines(
        &dir.path("in.jsonl"),
        &[chat_line("a", "hello", 4), chat_line("b", "there", 4)],
    );
    std::fs::write(
        dir.path("real.jsonl"),
        "{\"id\":\"batch_req_x\",\"custom_id\":\"a\",\"response\":null,\"error\":{\"code\":\"server\",\"message\":\"boom\"}}\n",
    )
    .expect("write");
    std::os::unix::fs::symlink(dir.path("real.jsonl"), dir.path("out.jsonl")).expect("symlink");
    let mut first = common::http_config(&dir, &server);
    first.retry_failed = true;
    first.item_timeout = Some(Duration::from_secs(20));
    let second = first.clone();
    let mut second = second;
    second.retry_failed = false;
    let a = tokio::spawn(tollgate_batch::run(first, never()));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let b = tollgate_batch::run(second, never()).await;
    let _ = a.await;
    let per_id = counts(&dir.path("out.jsonl"));
    assert!(
        matches!(
            b,
            Err(BatchError::Output(tollgate_batch::output::OutputError::InUse { .. }))
        ),
        "the second run was let in: {:?}; lines per custom_id in out.jsonl: {per_id:?}",
        b.map(|r| r.outcome)
    );
}
