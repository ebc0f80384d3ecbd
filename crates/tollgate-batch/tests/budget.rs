//! Money in the batch runner (SPEC BUD-6): the dry run prints the
//! worst-case cost of the file, the summary the actual cost, and
//! `--budget` stops the run cleanly (resumable, exit 3) once the next item
//! no longer fits; the simulator's own bill checks it.

mod common;

use std::time::Duration;

use serde_json::{Value, json};
use tollgate_batch::config::SharedStore;
use tollgate_batch::{BatchConfig, BatchError, Outcome, StopReason};
use tollgate_redis::RedisServer;
use tollgate_sim::{SimConfig, SimServer, Simulator};

use common::{Dir, counts, never, write_lines};

/// A chat line for model `model` with `max_tokens`.
fn line(id: &str, model: &str, max_tokens: u64) -> Value {
    json!({"custom_id": id, "method": "POST", "url": "/v1/chat/completions",
           "body": {"model": model, "messages": [{"role": "user", "content": "Summarise this."}],
                    "max_tokens": max_tokens}})
}

async fn sim(completion_tokens: u32) -> SimServer {
    Simulator::spawn(
        SimConfig {
            completion_tokens,
            ttft: Duration::from_millis(20),
            ..SimConfig::default()
        },
        "127.0.0.1:0",
    )
    .await
    .expect("simulator")
}

fn config(dir: &Dir, server: &SimServer) -> BatchConfig {
    let mut c = common::http_config(dir, server);
    c.item_timeout = Some(Duration::from_secs(30));
    c.concurrency = 8;
    c
}

fn micros(text: &str) -> u64 {
    tollgate::price::parse_usd(text, u64::MAX).expect("dollars")
}

// proves: BUD-6 (the dry run prints the worst-case cost of the file: each
// item's input estimate and output allowance at its model's list price;
// items of unpriced models are named, not counted as free)
#[tokio::test]
async fn the_dry_run_prints_the_worst_case_cost() {
    let dir = Dir::new("cost-dry");
    let server = sim(16).await;
    let mut lines: Vec<Value> = (0..10)
        .map(|i| line(&format!("o{i}"), "o1", 1_000))
        .collect();
    lines.push(line("x", "my-llama", 10));
    write_lines(&dir.path("in.jsonl"), &lines);
    let mut c = config(&dir, &server);
    c.dry_run = true;
    c.summary_json = Some(dir.path("summary.json"));
    let report = tollgate_batch::run(c, never()).await.expect("dry run");
    let plan = &report.summary.plan;
    // o1: $15 input, $60 output per million; ten items of 1000 output
    // tokens: at least $0.60.
    let per_item = tollgate_openai::prices::PriceTable::builtin()
        .price("o1")
        .expect("priced")
        .worst_case(plan.input_tokens / 11, 1_000);
    assert!(plan.worst_case_cost >= 600_000, "{}", plan.worst_case_cost);
    assert!(plan.worst_case_cost.abs_diff(10 * per_item) < 1_000);
    assert_eq!(
        (plan.priced, plan.unpriced_models.as_slice()),
        (10, &["my-llama".to_owned()][..])
    );
    let text = report.summary.to_string();
    assert!(text.contains("worst-case cost: $0.6"), "{text}");
    assert!(text.contains("not priced: 1 items of my-llama"), "{text}");
    let json: Value =
        serde_json::from_slice(&std::fs::read(dir.path("summary.json")).expect("summary"))
            .expect("json");
    assert_eq!(
        micros(json["plan"]["worst_case_cost_usd"].as_str().unwrap()),
        plan.worst_case_cost
    );
    assert_eq!(server.stats().requests_total, 0);
}

// proves: BUD-6 (a run's summary prints what it cost: the priced usage,
// equal to the provider's own bill rounded up per item)
#[tokio::test]
async fn the_summary_prints_the_actual_cost() {
    let dir = Dir::new("cost-run");
    let server = sim(100).await;
    let lines: Vec<Value> = (0..20)
        .map(|i| line(&format!("m{i}"), "gpt-4o-mini", 500))
        .collect();
    write_lines(&dir.path("in.jsonl"), &lines);
    let report = tollgate_batch::run(config(&dir, &server), never())
        .await
        .expect("run");
    assert_eq!(report.outcome, Outcome::Complete);
    let cost = report.summary.cost;
    let billed = server.stats().cost_charged_pico_usd;
    assert!(billed > 0);
    assert!(u128::from(cost.charged) * 1_000_000 >= billed);
    assert!(u128::from(cost.charged) * 1_000_000 < billed + 20 * 1_000_000);
    assert!(cost.reserved > cost.charged, "the worst cases came back");
    let text = report.summary.to_string();
    assert!(
        text.contains(&format!(
            "cost: ${}",
            tollgate::price::format_usd(cost.charged)
        )),
        "{text}"
    );
}

// proves: BUD-6, BATCH-3 (--budget: the run stops cleanly once the next
// item's worst case no longer fits, with exit 3, every finished item
// recorded once, nothing over budget at the provider; a re-run with a new
// budget resumes where it stopped)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_stops_the_run_and_a_rerun_resumes() {
    let dir = Dir::new("cost-budget");
    let server = sim(300).await;
    // o1, 1000 output allowed, 300 generated: each item reserves about
    // $0.06 and costs about $0.018.
    let lines: Vec<Value> = (0..60)
        .map(|i| line(&format!("b{i}"), "o1", 1_000))
        .collect();
    write_lines(&dir.path("in.jsonl"), &lines);
    let mut c = config(&dir, &server);
    c.budget = Some(500_000);
    let report = tollgate_batch::run(c.clone(), never()).await.expect("run");
    let Outcome::Stopped(StopReason::Budget { budget, .. }) = &report.outcome else {
        panic!("expected a budget stop, got {:?}", report.outcome);
    };
    assert_eq!(*budget, 500_000);
    assert_eq!(report.outcome.exit_code(), 3);
    assert!(
        report
            .summary
            .stop_reason
            .as_deref()
            .unwrap_or_default()
            .contains("--budget of $0.5")
    );
    let billed = server.stats().cost_charged_pico_usd;
    assert!(
        billed <= 500_000 * 1_000_000,
        "billed {billed} p$ over a $0.5 budget"
    );
    let done = counts(&dir.path("out.jsonl"));
    assert!(done.values().all(|&n| n == 1));
    let finished = done.len();
    // Used up: in-flight worst cases gave way to later items, so the run
    // did not stop at the first refusal (about 8 of 60 fit at once).
    assert!((20..60).contains(&finished), "{finished}");
    assert_eq!(report.summary.succeeded, finished as u64);
    assert_eq!(report.summary.failed, 0);
    assert!(report.summary.cost.charged <= 500_000);
    // Resume with what the rest needs.
    c.budget = Some(5_000_000);
    let rest = tollgate_batch::run(c, never()).await.expect("resume");
    assert_eq!(rest.outcome, Outcome::Complete);
    assert_eq!(rest.summary.already_done, finished as u64);
    assert!(counts(&dir.path("out.jsonl")).values().all(|&n| n == 1));
    assert_eq!(counts(&dir.path("out.jsonl")).len(), 60);
    assert_eq!(server.stats().requests_total, 60);
}

// proves: BUD-1 (a budget over items of a model without a price is a
// clear error before anything is sent, naming the models)
#[tokio::test]
async fn a_budget_over_unpriced_items_is_refused() {
    let dir = Dir::new("cost-unpriced");
    let server = sim(10).await;
    write_lines(
        &dir.path("in.jsonl"),
        &[line("a", "my-llama", 10), line("b", "o1", 10)],
    );
    let mut c = config(&dir, &server);
    c.budget = Some(1_000_000);
    let e = tollgate_batch::run(c.clone(), never())
        .await
        .expect_err("refused");
    assert!(
        matches!(&e, BatchError::Config(m) if m.contains("my-llama") && m.contains("--prices")),
        "{e}"
    );
    assert_eq!(server.stats().requests_total, 0);
    // Priced by --prices: runs.
    std::fs::write(
        dir.path("prices.toml"),
        "[models.\"my-llama\"]\ninput = 0.1\noutput = 0.2\n",
    )
    .expect("write");
    c.prices = tollgate_batch::config::read_prices(&dir.path("prices.toml")).expect("prices");
    let report = tollgate_batch::run(c, never()).await.expect("run");
    assert_eq!(report.outcome, Outcome::Complete);
}

// proves: BUD-6, DQ-1 (with --redis a run's budget is spent in the shared
// scope: a second run of the same scope and budget, with other items,
// finds it spent and stops without going over; both runs together stay
// within the one budget at the provider)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_the_budget_spans_runs() {
    let Some(redis) = RedisServer::start_or_skip("with_redis_the_budget_spans_runs") else {
        return;
    };
    let dir = Dir::new("cost-redis");
    let server = sim(300).await;
    let items = |prefix: &str| -> Vec<Value> {
        (0..30)
            .map(|i| line(&format!("{prefix}{i}"), "o1", 1_000))
            .collect()
    };
    write_lines(&dir.path("in.jsonl"), &items("r"));
    write_lines(&dir.path("in2.jsonl"), &items("s"));
    let mut c = config(&dir, &server);
    c.budget = Some(500_000);
    c.scope = "acct".into();
    c.limits = vec![tollgate::config::Limit::new(
        tollgate::Dimension::Requests,
        1_000,
        Duration::from_secs(60),
    )];
    c.shared = Some(SharedStore {
        url: redis.url(),
        prefix: format!("cost-{}", std::process::id()),
        timeout: Duration::from_secs(2),
        on_unavailable: tollgate::quota::Unavailable::FailClosed,
        cluster: false,
        ca_file: None,
    });
    let first = tollgate_batch::run(c.clone(), never()).await.expect("run");
    assert!(
        matches!(first.outcome, Outcome::Stopped(StopReason::Budget { .. })),
        "{:?}",
        first.outcome
    );
    let sent = server.stats().requests_total;
    assert!(sent > 0);
    c.input = dir.path("in2.jsonl");
    c.output = Some(dir.path("out2.jsonl"));
    let second = tollgate_batch::run(c, never()).await.expect("run");
    assert!(
        matches!(second.outcome, Outcome::Stopped(StopReason::Budget { .. })),
        "{:?}",
        second.outcome
    );
    let billed = server.stats().cost_charged_pico_usd;
    assert!(
        billed <= 500_000 * 1_000_000,
        "billed {billed} p$ over a $0.5 budget in two runs"
    );
    // How much each run sends is not fixed: the first stops when a
    // reservation at its worst case no longer fits, and what its calls in
    // flight then settle below their worst case goes back to the shared
    // budget for the second (one run in fifty sent more in the second).
    // The invariant is the bill above.
}

// proves: BUD-6, DQ-8 (with `--state-dir` and no Redis, `--budget` belongs
// to one run: a second run of new items on the same directory is given its
// whole budget, not what the first run left, also when the file holds a
// budget an earlier version saved; the long `--limit` windows are what the
// directory keeps, see state_dir.rs)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runs_budget_is_its_own_with_a_state_dir() {
    let dir = Dir::new("cost-state-dir");
    let server = sim(300).await;
    let run = |name: &str| {
        let lines: Vec<Value> = (0..10)
            .map(|i| line(&format!("{name}{i}"), "o1", 1_000))
            .collect();
        write_lines(&dir.path(&format!("{name}.jsonl")), &lines);
        let mut c = config(&dir, &server);
        c.input = dir.path(&format!("{name}.jsonl"));
        c.output = Some(dir.path(&format!("{name}-out.jsonl")));
        c.concurrency = 2;
        // Ten items of about $0.018 each; two in flight reserve $0.12.
        c.budget = Some(micros("0.30"));
        c.state_dir = Some(dir.path("state"));
        c
    };
    let first = tollgate_batch::run(run("a"), never()).await.expect("run");
    assert_eq!(first.outcome, Outcome::Complete, "{}", first.summary);
    let charged = first.summary.cost.charged;
    assert!(charged > micros("0.15"), "the first run spent {charged} µ$");
    let second = tollgate_batch::run(run("b"), never()).await.expect("run");
    assert_eq!(
        second.outcome,
        Outcome::Complete,
        "the first run's {charged} µ$ counted against the second's budget: {}",
        second.summary
    );

    // A file in which an earlier version saved the run's budget, spent.
    {
        let file = tollgate_state::StateFile::open(&dir.path("state"), Default::default())
            .expect("state file");
        let spent = tollgate::AdmissionController::builder()
            .scope(
                tollgate::config::ScopeConfig::new("batch")
                    .cost(micros("0.30"), tollgate_batch::config::BUDGET_WINDOW),
            )
            .build()
            .expect("controller");
        let call = tollgate::Call::new(tollgate::ScopeId::FIRST)
            .with_estimate(tollgate::TokenEstimate::new(300_000, 0))
            .with_price(tollgate::Price::new(1_000_000, 0));
        let lease = spent
            .acquire(&call, tollgate::Deadline::NONE)
            .await
            .expect("the whole budget");
        drop(lease);
        assert_eq!(file.save(&[("batch", &spent)]).expect("saved"), 1);
    }
    let third = tollgate_batch::run(run("c"), never()).await.expect("run");
    assert_eq!(third.outcome, Outcome::Complete, "{}", third.summary);
    server.shutdown().await.expect("shutdown");
}
