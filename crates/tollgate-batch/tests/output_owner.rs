//! One run owns its output (SPEC BATCH-3: a finished item is never sent or
//! recorded twice, a result is never lost): a second run on the same
//! output is refused before it sends anything, and an output removed or
//! replaced during a run is never reported complete. Both found in review,
//! where the first version let two runs append every item twice and
//! reported a run complete whose every line had gone to a deleted file.
//! The output named through a symbolic link is the same output, also when
//! --retry-failed rewrites it. Also: a byte order mark before the first
//! line is not part of it.

mod common;

use std::time::Duration;

use serde_json::Value;
use tollgate::Dimension;
use tollgate::config::Limit;
use tollgate_batch::{BatchConfig, BatchError, Outcome, StopReason};
use tollgate_sim::{SimConfig, SimServer, Simulator};

use common::{Dir, chat_line, counts, never, write_lines};

const W: Duration = Duration::from_secs(1);

async fn sim(rpm: Option<u64>, ttft: Duration) -> SimServer {
    Simulator::spawn(
        SimConfig {
            rpm,
            window: W,
            ttft,
            ..SimConfig::default()
        },
        "127.0.0.1:0",
    )
    .await
    .expect("simulator")
}

fn config(dir: &Dir, server: &SimServer, rpm: Option<u64>) -> BatchConfig {
    let mut c = common::http_config(dir, server);
    if let Some(amount) = rpm {
        c.limits = vec![Limit::new(Dimension::Requests, amount, W)];
    }
    c.item_timeout = Some(Duration::from_secs(30));
    c
}

// proves: BATCH-3 (a second run on an output in use is refused before it
// sends anything; the first completes, one line per item)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_second_run_on_an_output_in_use_is_refused() {
    let dir = Dir::new("two");
    let server = sim(None, Duration::from_millis(5)).await;
    let n = 100;
    let lines: Vec<Value> = (0..n)
        .map(|i| chat_line(&format!("i{i}"), "hello", 4))
        .collect();
    write_lines(&dir.path("in.jsonl"), &lines);
    let c = config(&dir, &server, None);
    let (a, b) = tokio::join!(
        tollgate_batch::run(c.clone(), never()),
        tollgate_batch::run(c.clone(), never())
    );
    let (done, refused) = match (a, b) {
        (Ok(done), Err(refused)) | (Err(refused), Ok(done)) => (done, refused),
        (a, b) => panic!("expected one run and one refusal: {a:?} / {b:?}"),
    };
    assert_eq!(done.outcome, Outcome::Complete);
    let message = refused.to_string();
    assert!(message.contains("output_in_use"), "{message}");
    assert_eq!(refused.exit_code(), 1);
    let seen = counts(&dir.path("out.jsonl"));
    assert_eq!(seen.len(), n);
    assert!(seen.values().all(|&k| k == 1), "{seen:?}");
    assert_eq!(
        server.stats().requests_total,
        n as u64,
        "nothing sent twice"
    );
    // The lock went with the run: a re-run starts and has nothing to do.
    let again = tollgate_batch::run(c, never()).await.expect("re-run");
    assert_eq!(again.outcome, Outcome::Complete);
    assert_eq!(server.stats().requests_total, n as u64);
    server.shutdown().await.expect("shutdown");
}

// proves: BATCH-3 (the same output named through a symbolic link is the
// same output: the second run is refused). Found in review, where the lock
// was named after the path as given and both runs recorded every item.
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_second_run_through_a_symlink_is_refused() {
    let dir = Dir::new("link");
    let server = sim(None, Duration::from_millis(5)).await;
    let n = 50;
    let lines: Vec<Value> = (0..n)
        .map(|i| chat_line(&format!("i{i}"), "hello", 4))
        .collect();
    write_lines(&dir.path("in.jsonl"), &lines);
    std::fs::write(dir.path("out.jsonl"), "").expect("output");
    std::os::unix::fs::symlink(dir.path("out.jsonl"), dir.path("latest.jsonl")).expect("ln -s");
    let a = config(&dir, &server, None);
    let mut b = a.clone();
    b.output = Some(dir.path("latest.jsonl"));
    let (ra, rb) = tokio::join!(
        tollgate_batch::run(a, never()),
        tollgate_batch::run(b, never())
    );
    assert!(
        ra.is_err() != rb.is_err(),
        "{:?} / {:?}",
        ra.map(|r| r.outcome),
        rb.map(|r| r.outcome)
    );
    let seen = counts(&dir.path("out.jsonl"));
    assert_eq!(seen.len(), n);
    assert!(seen.values().all(|&k| k == 1), "{seen:?}");
    assert_eq!(server.stats().requests_total, n as u64);
    server.shutdown().await.expect("shutdown");
}

// proves: BATCH-3 (an output removed during the run: the run stops as an
// output failure instead of reporting complete, and a re-run records every
// item in the file the path names)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_output_removed_during_the_run_is_never_complete() {
    let dir = Dir::new("rm");
    let server = sim(Some(50), Duration::from_millis(5)).await;
    let n = 100;
    let lines: Vec<Value> = (0..n)
        .map(|i| chat_line(&format!("i{i}"), "hello", 4))
        .collect();
    write_lines(&dir.path("in.jsonl"), &lines);
    let c = config(&dir, &server, Some(50));
    let h = tokio::spawn(tollgate_batch::run(c.clone(), never()));
    // Removed once some lines are in it (50 a window of 1 s).
    while counts(&dir.path("out.jsonl")).len() < 10 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    std::fs::remove_file(dir.path("out.jsonl")).expect("rm");
    let r = h.await.expect("join").expect("run");
    match &r.outcome {
        Outcome::Stopped(StopReason::Output(e)) => assert!(e.contains("output_replaced"), "{e}"),
        other => panic!("outcome {other:?}"),
    }
    let again = tollgate_batch::run(c, never()).await.expect("re-run");
    assert_eq!(again.outcome, Outcome::Complete);
    let seen = counts(&dir.path("out.jsonl"));
    assert_eq!(seen.len(), n, "every item in the output");
    assert!(seen.values().all(|&k| k == 1), "{seen:?}");
    server.shutdown().await.expect("shutdown");
}

// proves: BATCH-1 (a UTF-8 byte order mark before the first line is
// skipped: the line runs, and a resume reads the same items)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_byte_order_mark_is_not_part_of_the_first_line() {
    let dir = Dir::new("bom");
    let server = sim(None, Duration::ZERO).await;
    let body = format!(
        "\u{feff}{}\r\n{}\r\n",
        chat_line("first", "hello", 4),
        chat_line("second", "hello", 4)
    );
    std::fs::write(dir.path("in.jsonl"), body).expect("write input");
    let c = config(&dir, &server, None);
    let r = tollgate_batch::run(c.clone(), never()).await.expect("run");
    assert_eq!(r.outcome, Outcome::Complete);
    let seen = counts(&dir.path("out.jsonl"));
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert!(seen.contains_key("first"));
    let again = tollgate_batch::run(c, never()).await.expect("re-run");
    assert_eq!(again.outcome, Outcome::Complete);
    assert_eq!(server.stats().requests_total, 2, "nothing sent again");
    server.shutdown().await.expect("shutdown");
}

fn lines_of(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .expect("output")
        .lines()
        .map(|l| serde_json::from_str(l).expect("json"))
        .collect()
}

/// Items `a` and `b` in `in.jsonl`; `out.jsonl` a symbolic link to
/// `real.jsonl`, which holds a recorded failure of `a` from another tool
/// (no hash: trusted).
#[cfg(unix)]
fn symlinked_failure(dir: &Dir) {
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
}

// proves: BATCH-3 (--retry-failed through a symbolic link to the output
// rewrites the file the link names and leaves the link a link: the failure
// is replaced by the new result, one line per item). Found in review, where
// the rewrite renamed a new file over the link itself, so the linked file
// kept the failure and never got the result.
#[cfg(unix)]
#[tokio::test]
async fn retry_failed_through_a_symlinked_output_updates_the_linked_file() {
    let dir = Dir::new("rev-symlink");
    let server = common::sim_per_second(None, None).await;
    symlinked_failure(&dir);
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

// proves: BATCH-3 (a second run on a symbolic link to the output is refused
// while a --retry-failed run holds it). Found in review, where the rewrite
// replaced the link with a regular file, so the second run locked another
// name, was let in and appended the same items again.
#[cfg(unix)]
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
    symlinked_failure(&dir);
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
            Err(BatchError::Output(
                tollgate_batch::output::OutputError::InUse { .. }
            ))
        ),
        "the second run was let in: {:?}; lines per custom_id in out.jsonl: {per_id:?}",
        b.map(|r| r.outcome)
    );
}
