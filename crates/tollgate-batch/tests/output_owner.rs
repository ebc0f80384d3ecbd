//! One run owns its output (SPEC BATCH-3: a finished item is never sent or
//! recorded twice, a result is never lost): a second run on the same
//! output is refused before it sends anything, and an output removed or
//! replaced during a run is never reported complete. Both found in review,
//! where the first version let two runs append every item twice and
//! reported a run complete whose every line had gone to a deleted file.
//! Also: a byte order mark before the first line is not part of it.

mod common;

use std::time::Duration;

use serde_json::Value;
use tollgate::Dimension;
use tollgate::config::Limit;
use tollgate_batch::{BatchConfig, Outcome, StopReason};
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
