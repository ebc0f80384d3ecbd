//! Counting where and what the provider counts (SPEC ),
//! end to end: a real gateway in front of the strict simulator over real
//! sockets, a plain concurrent client, and every verdict read from the
//! simulator's own counters (the independent referee), never from the
//! gateway's view.
//!
//! Windows are short (W = 2 s, a few dozen requests per window) so that a
//! job of several windows takes a few seconds; the assertions are about
//! counts (429s, items lost, windows used), with margins that hold on two
//! busy cores.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::sync::Mutex;
use tollgate_sim::{ChargeMode, IngressDelay, RefusalCharge, SimConfig, SimServer, SimStats};

use common::{Gateway, KEY_A, RemoteSim, tenants};

/// The simulator's window, and the gateway scope's.
const W: Duration = Duration::from_secs(2);

/// 429s the simulator answered, whatever the cause.
fn rejected(s: &SimStats) -> u64 {
    s.rejected_429.total()
}

/// A gateway in front of `sim`: provider `p` with `provider_extra`, model
/// `gpt-4o-mini` on scope `s` (`scope` holds its settings, TOML lines),
/// tenants `a` and `b`.
async fn gateway(sim: &SimServer, provider_extra: &str, scope: &str) -> Gateway {
    let toml = format!(
        "[providers.p]\nbase_url = \"{}\"\n{provider_extra}\n\n\
         [scopes.s]\n{scope}\n\n\
         [models.gpt-4o-mini]\nprovider = \"p\"\nscope = \"s\"\n\n{}",
        sim.openai_base_url(),
        tenants("", ""),
    );
    Gateway::start(&toml).await
}

/// A chat body of `gpt-4o-mini` with `text` as the user message.
fn body(text: &str, max_tokens: u64) -> Value {
    json!({
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
    })
}

/// What a job did.
#[derive(Debug)]
struct Job {
    /// Items answered 200.
    ok: usize,
    /// Items that failed: (status, body), status 0 for a transport error.
    failed: Vec<(u16, String)>,
    /// From the first send to the last answer.
    elapsed: Duration,
    /// The simulator's 429 count when the first window of the job ended.
    rejected_in_first_window: u64,
    /// When the simulator's first 429 was seen, from the first send.
    first_refusal: Option<Duration>,
}

/// Sends `items` copies of `body` through the gateway with `concurrency`
/// workers (each sends its next item as soon as its previous one is
/// answered), like a plain client that knows nothing about limits.
async fn run_job(
    gw: &Gateway,
    sim: &SimServer,
    items: usize,
    concurrency: usize,
    body: Value,
) -> Job {
    let next = Arc::new(AtomicUsize::new(0));
    let failed = Arc::new(Mutex::new(Vec::new()));
    let ok = Arc::new(AtomicUsize::new(0));
    let client = common::client();
    let url = gw.url("/v1/chat/completions");
    let body = Arc::new(body);
    let started = Instant::now();
    let workers: Vec<_> = (0..concurrency)
        .map(|_| {
            let (next, failed, ok) = (next.clone(), failed.clone(), ok.clone());
            let (client, url, body) = (client.clone(), url.clone(), body.clone());
            tokio::spawn(async move {
                while next.fetch_add(1, Ordering::Relaxed) < items {
                    let sent = client
                        .post(&url)
                        .bearer_auth(KEY_A)
                        .header("x-request-timeout", "30")
                        .json(&*body)
                        .send()
                        .await;
                    match sent {
                        Ok(resp) if resp.status() == 200 => {
                            // Read the body: the item is done once received.
                            match resp.bytes().await {
                                Ok(_) => {
                                    ok.fetch_add(1, Ordering::Relaxed);
                                }
                                Err(e) => failed.lock().await.push((200, e.to_string())),
                            }
                        }
                        Ok(resp) => {
                            let status = resp.status().as_u16();
                            let text = resp.text().await.unwrap_or_default();
                            failed.lock().await.push((status, text));
                        }
                        Err(e) => failed.lock().await.push((0, e.to_string())),
                    }
                }
            })
        })
        .collect();
    // The referee's count at the end of the job's first window.
    let first_window = {
        let sim_stats = sim.simulator().clone();
        tokio::spawn(async move {
            tokio::time::sleep(W).await;
            rejected(&sim_stats.stats())
        })
    };
    // The referee's 429s over time, printed when a test fails.
    let trace = {
        let sim_stats = sim.simulator().clone();
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stop = done.clone();
        let task = tokio::spawn(async move {
            let mut last = 0;
            let mut log = Vec::new();
            let mut first = None;
            while !stop.load(Ordering::Relaxed) {
                let s = sim_stats.stats();
                if rejected(&s) != last {
                    last = rejected(&s);
                    first.get_or_insert(started.elapsed());
                    log.push(format!(
                        "{} ms: {last} rejected, {} charged, {} background",
                        started.elapsed().as_millis(),
                        s.requests_charged,
                        s.background_requests
                    ));
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            (log, first)
        });
        (done, task)
    };
    for w in workers {
        common::bounded("the job's workers finish", w)
            .await
            .expect("a worker does not panic");
    }
    let elapsed = started.elapsed();
    trace.0.store(true, Ordering::Relaxed);
    let (log, first_refusal) = trace.1.await.expect("trace");
    for line in log {
        eprintln!("{line}");
    }
    eprintln!("job: {items} items in {elapsed:?}");
    let rejected_in_first_window = first_window.await.expect("first-window probe");
    let failed = std::mem::take(&mut *failed.lock().await);
    Job {
        ok: ok.load(Ordering::Relaxed),
        failed,
        elapsed,
        rejected_in_first_window,
        first_refusal,
    }
}

/// Windows the job touched: `ceil(elapsed / W)`.
fn windows_used(elapsed: Duration) -> u64 {
    elapsed.as_nanos().div_ceil(W.as_nanos()) as u64
}

/// A prompt of English text: 900 characters, which the `gpt-4o-mini`
/// tokenizer counts as 129 tokens (7 characters a token), far fewer than
/// the `900 / 4` of a character-based limiter.
fn english_prompt() -> String {
    "Please summarize the following customer feedback about our delivery service and \
     recommend improvements. "
        .repeat(9)[..900]
        .to_owned()
}

// proves: Q-15 (an attempt stays counted until W after the provider can have
// counted it: with 20-300 ms of arrival jitter before the provider counts,
// a job of several windows through the gateway draws no provider 429)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn arrival_jitter_draws_no_provider_429() {
    let sim = RemoteSim::start(SimConfig {
        rpm: Some(20),
        window: W,
        ingress_delay: IngressDelay::range(Duration::from_millis(20), Duration::from_millis(300)),
        seed: 7,
        ..SimConfig::default()
    })
    .await;
    let gw = gateway(&sim, "", "limits = [{ requests = 20, per = \"2s\" }]").await;

    // 3.5 windows of requests, 32 workers.
    let job = run_job(&gw, &sim, 70, 32, body("Say something.", 16)).await;
    let stats = sim.stats();
    assert_eq!(job.failed, Vec::<(u16, String)>::new(), "items lost");
    assert_eq!(job.ok, 70);
    assert_eq!(rejected(&stats), 0, "provider 429s: {stats:?}");
    assert_eq!(stats.ok, 70);
    assert!(stats.max_requests_in_window <= 20, "{stats:?}");
    gw.wait_idle().await;
}

/// The accounting-mismatch job: 900 characters of English, `max_tokens`
/// 64, against a simulator charging `ceil(chars / 4) + max_tokens` = 289
/// tokens per item, 2,890 tokens per window (10 items), at admission and
/// without reconciling (it generates 16 tokens, so the reported usage, 247,
/// is below the charge); a job of 3.5 windows. `accounting` is the
/// provider's `accounting` line, or empty for its default.
async fn mismatch_job(accounting: &str) -> (Job, SimStats) {
    let sim = RemoteSim::start(SimConfig {
        tpm: Some(2_890),
        window: W,
        ttft: Duration::from_millis(50),
        completion_tokens: 16,
        charge: ChargeMode::Chars {
            chars_per_token: 4,
            output: true,
        },
        ..SimConfig::default()
    })
    .await;
    let gw = gateway(
        &sim,
        &format!("{accounting}\nreconciles = false"),
        "limits = [{ tokens = 2890, per = \"2s\" }]",
    )
    .await;
    let job = run_job(&gw, &sim, 35, 16, body(&english_prompt(), 64)).await;
    gw.wait_idle().await;
    (job, sim.stats())
}

// proves: Q-16 (with the provider's accounting profile, `openai` for a
// limiter counting characters / 4 plus max_tokens, the gateway reserves what
// the provider charges: zero provider 429s from the first window on)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_accounting_matches_a_character_based_limiter() {
    let (job, stats) = mismatch_job("accounting = \"openai\"").await;
    assert_matches_the_limiter(&job, &stats);
}

/// The job lost nothing and the character-based limiter refused nothing.
fn assert_matches_the_limiter(job: &Job, stats: &SimStats) {
    assert_eq!(job.failed, Vec::<(u16, String)>::new(), "items lost");
    assert_eq!(job.ok, 35);
    assert_eq!(rejected(stats), 0, "provider 429s: {stats:?}");
    assert_eq!(stats.tokens_charged, 35 * 289);
    assert!(stats.max_tokens_in_window <= 2_890, "{stats:?}");
}

// proves: Q-16 (the default accounting follows the flavour: a provider of
// flavour `openai`, the default one, configured without `accounting`
// counts as OpenAI documents its limits, characters / 4 plus max_tokens,
// and draws zero provider 429s from a limiter that counts so)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_openai_provider_counts_like_openai_by_default() {
    let (job, stats) = mismatch_job("").await;
    assert_matches_the_limiter(&job, &stats);
}

// proves: Q-16 (the contrast: the tokenizer profile by mistake reserves
// 193 tokens where the limiter charges 289, so the gateway admits more than
// fits and the provider refuses some; how many depends on timing)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenizer_accounting_under_reserves_for_a_character_based_limiter() {
    let (_, stats) = mismatch_job("accounting = \"tokenizer\"").await;
    assert!(rejected(&stats) > 0, "{stats:?}");
}

// proves: Q-14 (a consumer the gateway cannot see spends 30 % of the
// account's budget; the remaining-budget headers, compared with what the
// provider certainly counted of the gateway's own traffic, take its share
// out of the gateway's window: without them the gateway would send 40 a
// window where 28 fit, a dozen provider 429s a window; with them at most
// one a window, and the job finishes)
//
// Not "none after the first window": the headers show what the other
// consumer holds when an answer is counted, and its spending after the
// latest answer is unseen until the next one (docs/tokens.md, "What
// remains"). The simulator's consumer ticks every W / 12, each tick a
// period after the previous one actually ran and skipped when the window
// is full, so what it holds moves between 10 and 12: on a busy machine its
// ticks run a millisecond or two late and leave a gap of 11 for ~15 ms of
// every period, and a tick falls when the gateway has just filled the
// window. An answer counted then measures less (the estimate follows a
// lower exact measurement at once and rises only on certain evidence,
// others.rs), and when the consumer is back at 12 the gateway's next fill
// draws one 429. Measured: 6 of 50 runs under load drew one at the edge of
// the second or third window. The refused attempt then stays counted in
// tollgate's window (refusal cost `full`) where the simulator charged
// nothing, which covers that unit until the window ends: one a window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hidden_consumer_is_learned_from_the_headers() {
    let sim = RemoteSim::start(SimConfig {
        rpm: Some(40),
        window: W,
        background_rpm: Some(12),
        ..SimConfig::default()
    })
    .await;
    let gw = gateway(&sim, "", "limits = [{ requests = 40, per = \"2s\" }]").await;
    // The other consumer has been spending for a whole window already.
    tokio::time::sleep(W).await;

    // About 3 windows of what is left (28 a window), 16 workers.
    let job = run_job(&gw, &sim, 84, 16, body("Say something.", 16)).await;
    let stats = sim.stats();
    eprintln!("gateway scope: {:?}", gw.upstream_scope("s").counters);
    assert_eq!(job.failed, Vec::<(u16, String)>::new(), "items lost");
    assert_eq!(job.ok, 84);
    assert!(
        rejected(&stats) <= windows_used(job.elapsed),
        "at most one provider 429 a window ({:?}): {stats:?}",
        job.elapsed
    );
    assert!(stats.background_requests > 0, "{stats:?}");
    let snapshot = gw.upstream_scope("s");
    assert!(
        snapshot.counters.gap_requests > 0,
        "{:?}",
        snapshot.counters
    );
    gw.wait_idle().await;
}

/// How the refusal jobs force 429s at their start.
#[derive(Clone, Copy)]
enum Forced {
    /// The simulator serves at most 24 requests at once; the client sends
    /// 32 (the gateway knows nothing of that cap).
    ConcurrencyCap,
    /// 600 tokens are spent straight at the simulator just before the job
    /// (another client the gateway does not know).
    DirectBurst,
}

/// Tokens spent straight at the simulator by [`Forced::DirectBurst`].
const DIRECT_TOKENS: u64 = 600;

/// A refusal job: `items` of 50 tokens through a gateway whose provider
/// has `refusals`, against a simulator of 2,000 tokens per window (answers
/// after 50 ms) that charges `charge` for a 429, with 429s `forced` at the
/// start.
async fn refusal_job(
    charge: RefusalCharge,
    refusals: &str,
    forced: Forced,
    items: usize,
) -> (Job, SimStats) {
    let sim = RemoteSim::start(SimConfig {
        tpm: Some(2_000),
        window: W,
        ttft: Duration::from_millis(50),
        completion_tokens: 4,
        max_concurrency: matches!(forced, Forced::ConcurrencyCap).then_some(24),
        charge: ChargeMode::Chars {
            chars_per_token: 4,
            output: true,
        },
        charge_refusals: charge,
        ..SimConfig::default()
    })
    .await;
    let gw = gateway(
        &sim,
        &format!("accounting = \"openai\"\nreconciles = false\nrefusals = \"{refusals}\""),
        "limits = [{ tokens = 2000, per = \"2s\" }]",
    )
    .await;
    // 184 characters + max_tokens 4 = 50 tokens at the simulator.
    let prompt = "x".repeat(184);
    if let Forced::DirectBurst = forced {
        let direct = common::client();
        let calls = (0..DIRECT_TOKENS / 50).map(|_| {
            direct
                .post(sim.url("/v1/chat/completions"))
                .json(&json!({
                    "model": "gpt-4o-mini",
                    "messages": [{"role": "user", "content": prompt}],
                    "max_tokens": 4,
                }))
                .send()
        });
        for resp in futures_util::future::join_all(calls).await {
            assert_eq!(resp.expect("direct call").status(), 200);
        }
    }
    let job = run_job(&gw, &sim, items, 32, body(&prompt, 4)).await;
    gw.wait_idle().await;
    (job, sim.stats())
}

/// [`refusal_job`] run again (at most three runs in all) until its setup
/// forced the refusals the test is about (`forced_refusals`): on two loaded
/// cores the client's calls can spread out so that they never reach the
/// simulator's cap of 24 at once, or the direct burst leaves the
/// simulator's window before the job's first calls arrive (flake hunt:
/// each once in about 30 runs). A run without refusals says nothing about
/// them, for or against the rule; every run must still lose no item.
async fn forced_refusal_job(
    charge: RefusalCharge,
    refusals: &str,
    forced: Forced,
    items: usize,
    forced_refusals: impl Fn(&Job, &SimStats) -> bool,
) -> (Job, SimStats) {
    let mut runs = 0;
    loop {
        let (job, stats) = refusal_job(charge, refusals, forced, items).await;
        assert_eq!(job.failed, Vec::<(u16, String)>::new(), "items lost");
        runs += 1;
        if forced_refusals(&job, &stats) || runs == 3 {
            assert!(
                forced_refusals(&job, &stats),
                "the refusals were not forced as planned in {runs} runs: {job:?} {stats:?}"
            );
            return (job, stats);
        }
    }
}

// proves: Q-16 (a refusal costs tollgate's window what it cost at the
// provider: with a provider that charges nothing for a 429 and `refusals =
// "free"`, the 429s forced at the start park nothing, and a job of 3.95
// windows uses at least 0.97 of the physical bound)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn free_refusals_keep_utilisation() {
    let (job, stats) = forced_refusal_job(
        RefusalCharge::None,
        "free",
        Forced::ConcurrencyCap,
        158,
        // Refused at the start, and soon: a refusal answered 600 ms after
        // its send teaches the gateway that the provider may count that
        // late, so every window after it is held 600 ms longer,
        // which is right and costs a fifth window here (flake hunt: 2 runs
        // in 25 on loaded cores, refusals seen after 510 and 633 ms, 8.1 s).
        // Below 400 ms, three windows of 2.4 s and the last answers still
        // end before 8 s.
        |job, stats| {
            rejected(stats) > 0
                && job
                    .first_refusal
                    .is_some_and(|t| t < Duration::from_millis(400))
        },
    )
    .await;
    assert_eq!(job.ok, 158);
    // The gateway does not know the simulator's cap of 24 and the client
    // sends 32 at once, so a window edge that admits more than 24 calls
    // within one answer's time draws concurrency 429s again. Whether it
    // does depends on how the retried calls spread over the first window
    // (under load it did, once in 5 runs of the flake hunt): not part of
    // the rule. What the rule promises is that those refusals park
    // nothing, hence the utilisation below.
    // Utilisation of the physical bound: the budget the job needed (158 ×
    // 50 tokens = 3.95 windows) over the budget of the windows it touched,
    // ceil(elapsed / W) × 2,000, counted from the job's first send. It
    // fits in four windows at the earliest (0.9875); the refused attempts'
    // tokens parked for a window (`refusals = "full"` here) push it into a
    // fifth (0.79).
    let used = windows_used(job.elapsed);
    let utilisation = (158.0 * 50.0) / (used as f64 * 2_000.0);
    assert!(
        utilisation >= 0.97,
        "utilisation {utilisation:.3}: {used} windows for {:?}; {stats:?}",
        job.elapsed
    );
}

// proves: Q-16 (with a provider that charges a refused request in full and
// `refusals = "full"`, 429s forced by another client's burst are paid for in
// tollgate's window too: no further provider 429 after the first window)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn charged_refusals_draw_no_extra_429() {
    let (job, stats) = forced_refusal_job(
        RefusalCharge::All,
        "full",
        Forced::DirectBurst,
        146,
        |_, stats| stats.refusal_tokens_charged > 0,
    )
    .await;
    assert_eq!(job.ok, 146);
    assert_eq!(
        rejected(&stats),
        job.rejected_in_first_window,
        "no 429 after the first window: {stats:?}"
    );
}

// proves: Q-14 (with no rpm/tpm configured and learn_limits, the gateway
// sends one request, adopts the limits the provider advertises and draws no
// provider 429)
// proves: OBS-2 (the learned gap, adopted limits, released refusals and the
// accounting ratio are metrics per scope)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn learned_limits_draw_no_provider_429() {
    let sim = RemoteSim::start(SimConfig {
        rpm: Some(20),
        tpm: Some(1_000),
        window: W,
        ..SimConfig::default()
    })
    .await;
    let gw = gateway(&sim, "", "learn_limits = true\nlearn_window = \"2s\"").await;
    // 3 windows of requests (each item is 3 + 3 + 4 + 16 = 26 tokens: the
    // request limit binds).
    let job = run_job(&gw, &sim, 60, 16, body("Say something, please.", 16)).await;
    let stats = sim.stats();
    assert_eq!(job.failed, Vec::<(u16, String)>::new(), "items lost");
    assert_eq!(job.ok, 60);
    assert_eq!(rejected(&stats), 0, "provider 429s: {stats:?}");
    let snapshot = gw.upstream_scope("s");
    assert!(
        snapshot.counters.limits_adopted >= 2,
        "{:?}",
        snapshot.counters
    );
    let limits: Vec<(u64, Duration)> = snapshot
        .limits
        .iter()
        .map(|l| (l.limit, l.window))
        .collect();
    assert!(limits.contains(&(20, W)), "{limits:?}");
    assert!(limits.contains(&(1_000, W)), "{limits:?}");
    gw.wait_idle().await;

    // OBS-2: what was learned is on /metrics, per scope.
    let metrics = common::metrics_text(&gw).await;
    for series in [
        "tollgate_limits_adopted_total{side=\"upstream\",scope=\"s\"}",
        "tollgate_budget_gap_total{side=\"upstream\",scope=\"s\",dimension=\"tokens\"}",
        "tollgate_budget_gap_total{side=\"upstream\",scope=\"s\",dimension=\"requests\"}",
        "tollgate_refusals_released_total{side=\"upstream\",scope=\"s\"}",
        "tollgate_accounting_ratio{side=\"upstream\",scope=\"s\"}",
    ] {
        assert!(metrics.contains(series), "{series} missing:\n{metrics}");
    }
}
