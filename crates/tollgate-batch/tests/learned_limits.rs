//! The batch runner learning its limits from the provider's headers (the
//! default without `--rpm`/`--tpm`/`--limit`, SPEC Q-14) when the advertised
//! token limit goes down: one answer fails no item, and a lower limit that
//! two answers confirm stops the run with a clear error instead of leaving
//! items in flight, with an output that a re-run completes.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use serde_json::Value;
use tollgate_batch::{BatchConfig, Outcome, StopReason, Target};
use tollgate_sim::SimConfig;

use common::{Advertising, Dir, chat_line, never, write_lines};

/// How long a run may take before the test calls it hung.
const PATIENCE: Duration = Duration::from_secs(30);

/// `n` items of about 300 tokens each (a short prompt and 290 output
/// tokens allowed).
fn items(dir: &Dir, n: usize) {
    let lines: Vec<Value> = (0..n)
        .map(|i| chat_line(&format!("item-{i}"), "hello there", 290))
        .collect();
    write_lines(&dir.path("in.jsonl"), &lines);
}

/// A run against `upstream` that learns its limits over `window`, with the
/// default item deadline.
fn config(dir: &Dir, upstream: &Advertising, window: Duration) -> BatchConfig {
    let mut c = BatchConfig::new(
        dir.path("in.jsonl"),
        Some(dir.path("out.jsonl")),
        Target::Http {
            base_url: upstream.base_url.clone(),
            api_key: None,
        },
    );
    c.learn_limits = Some(window);
    c.concurrency = 8;
    c
}

async fn run(config: BatchConfig) -> tollgate_batch::Report {
    tokio::time::timeout(PATIENCE, tollgate_batch::run(config, never()))
        .await
        .expect("the run hung")
        .expect("the run starts")
}

/// Each output line's `custom_id` and status code (0 for a recorded error
/// without one).
fn results(dir: &Dir) -> HashMap<String, u64> {
    let data = std::fs::read_to_string(dir.path("out.jsonl")).unwrap_or_default();
    assert!(data.is_empty() || data.ends_with('\n'), "torn last line");
    let mut seen = HashMap::new();
    for line in data.lines() {
        let v: Value = serde_json::from_str(line).expect("every output line is JSON");
        let id = v["custom_id"].as_str().expect("custom_id").to_owned();
        let status = v["response"]["status_code"].as_u64().unwrap_or(0);
        assert!(
            seen.insert(id.clone(), status).is_none(),
            "{id} written twice"
        );
    }
    seen
}

// proves: Q-14 (a token limit advertised once, lower than every item,
// fails no item: the next item goes out alone and the provider's answer
// corrects the limit). Found in review, where the first version failed:
// every item after the first was recorded as a `configuration` failure
// (estimate larger than the learned limit of 40), never sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_advertised_once_fails_no_item() {
    let upstream =
        Advertising::start(SimConfig::default(), |n| if n == 1 { 40 } else { 100_000 }).await;
    let dir = Dir::new("learn-once");
    items(&dir, 6);
    let report = run(config(&dir, &upstream, Duration::from_secs(1))).await;
    assert_eq!(report.outcome, Outcome::Complete);
    let results = results(&dir);
    assert_eq!(results.len(), 6);
    assert!(results.values().all(|s| *s == 200), "{results:?}");
}

// proves: Q-14, Q-3 (a learned token limit that goes down under queued
// items and is confirmed by a second answer stops the run at once with a
// clear error and exit code 3; the items already answered are recorded, the
// others are not, and a re-run completes the output with every item once).
// Found in review, where the first version failed: the queued head could
// no longer fit and waited with no timer, so the run hung with items "in
// flight" until their deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confirmed_lower_limit_stops_the_run_with_a_clear_error() {
    // Answers take 200 ms: the items behind the first ones are queued
    // (they need the window) when the lower limit is advertised.
    let slow = SimConfig {
        ttft: Duration::from_millis(200),
        ..SimConfig::default()
    };
    let upstream = Advertising::start(slow, |n| if n == 1 { 1_000 } else { 40 }).await;
    let dir = Dir::new("learn-lower");
    items(&dir, 8);
    let report = run(config(&dir, &upstream, Duration::from_secs(10))).await;
    let Outcome::Stopped(reason) = &report.outcome else {
        panic!("expected a stop, got {:?}", report.outcome);
    };
    assert!(
        matches!(reason, StopReason::ExceedsLearnedLimit { .. }),
        "{reason:?}"
    );
    let message = reason.to_string();
    assert!(
        message.contains("can never be sent") && message.contains("limit of 40"),
        "{message}"
    );
    assert_eq!(report.outcome.exit_code(), tollgate_batch::EXIT_STOPPED);
    let first = results(&dir);
    assert!(
        !first.is_empty() && first.len() < 8,
        "answered items are recorded, the others not: {first:?}"
    );
    assert!(first.values().all(|s| *s == 200), "{first:?}");

    // The provider's limit is back up: a re-run finishes the rest.
    drop(upstream);
    let upstream = Advertising::start(SimConfig::default(), |_| 100_000).await;
    let report = run(config(&dir, &upstream, Duration::from_secs(1))).await;
    assert_eq!(report.outcome, Outcome::Complete);
    let all = results(&dir);
    assert_eq!(all.len(), 8, "{all:?}");
    assert!(all.values().all(|s| *s == 200), "{all:?}");
    assert_eq!(
        upstream.answers.load(std::sync::atomic::Ordering::SeqCst),
        8 - first.len(),
        "the re-run sent exactly the unrecorded items"
    );
}
