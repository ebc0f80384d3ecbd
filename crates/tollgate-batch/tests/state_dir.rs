//! `--state-dir` (SPEC DQ-8): a day limit spent by one run is still spent
//! for the next run on the same directory.

mod common;

use std::time::Duration;

use serde_json::Value;
use tollgate::Dimension;
use tollgate::config::Limit;
use tollgate_batch::{BatchConfig, Target};
use tollgate_sim::{SimConfig, Simulator};

use common::{Dir, chat_line, never, write_lines};

const DAY: Duration = Duration::from_secs(86_400);

// proves: DQ-8 (5 requests per day: a run of 3 then a run of 4 on the same
// state directory reach the provider 5 times in all, not 7)
#[tokio::test]
async fn a_second_run_finds_the_day_spent() {
    let dir = Dir::new("state-dir");
    let server = Simulator::spawn(SimConfig::default(), "127.0.0.1:0")
        .await
        .expect("simulator");
    let run = |name: &str, n: usize| {
        let lines: Vec<Value> = (0..n)
            .map(|i| chat_line(&format!("{name}-{i}"), "hello", 4))
            .collect();
        write_lines(&dir.path(&format!("{name}.jsonl")), &lines);
        let mut c = BatchConfig::new(
            dir.path(&format!("{name}.jsonl")),
            Some(dir.path(&format!("{name}-out.jsonl"))),
            Target::Http {
                base_url: server.openai_base_url(),
                api_key: None,
            },
        );
        c.limits = vec![Limit::new(Dimension::Requests, 5, DAY)];
        c.item_timeout = Some(Duration::from_secs(5));
        c.concurrency = 2;
        c.state_dir = Some(dir.path("state"));
        c
    };
    let first = tollgate_batch::run(run("a", 3), never())
        .await
        .expect("run");
    assert_eq!(first.summary.succeeded, 3, "{}", first.summary);
    let second = tollgate_batch::run(run("b", 4), never())
        .await
        .expect("run");
    assert_eq!(second.summary.succeeded, 2, "{}", second.summary);
    assert_eq!(server.stats().requests_total, 5);
    server.shutdown().await.expect("shutdown");
}
