//! Counting where and what the provider counts (SPEC ):
//! how long an attempt stays counted, what a refusal costs, what a
//! provider that does not settle keeps, and budget reports from responses.
//! All on paused time.

mod common;

use std::time::Duration;

use common::script::{Ev, Script, Step};
use common::{available, ms, secs, settle};
use futures_util::StreamExt;
use tokio::time::Instant;
use tollgate::config::{Algorithm, MINUTE, ScopeConfig};
use tollgate::lifecycle::{
    ARRIVAL_CAP, ARRIVAL_MEMORY, Accounting, AttemptContext, AttemptPolicy, Budgets, CallOptions,
    ErrorKind, Provider, ProviderError, Reply, StreamEvent, Supervisor,
};
use tollgate::quota::Dimension;
use tollgate::{
    AdmissionController, BudgetReport, Call, Deadline, EstimateError, RefusalCost, ScopeId,
    TokenEstimate, Usage,
};

fn controller(scope: ScopeConfig) -> AdmissionController {
    AdmissionController::builder().scope(scope).build().unwrap()
}

fn supervisor(
    controller: &AdmissionController,
    steps: Vec<Step>,
    accounting: Accounting,
) -> Supervisor<Script> {
    Supervisor::builder(controller.clone(), Script::new(steps))
        .estimator(|_: &String| -> Result<TokenEstimate, EstimateError> {
            Ok(TokenEstimate::new(60, 40))
        })
        .policy(AttemptPolicy {
            base_delay: secs(1),
            jitter: 0.0,
            ..AttemptPolicy::default()
        })
        .without_jitter()
        .accounting(accounting)
        .build()
        .unwrap()
}

/// How long after `t0` the next request unit can be admitted.
async fn next_admission_after(controller: &AdmissionController, t0: Instant) -> Duration {
    let lease = controller
        .acquire(
            &Call::new(ScopeId::FIRST).with_estimate(TokenEstimate::new(1, 0)),
            Deadline::NONE,
        )
        .await
        .unwrap();
    drop(lease);
    Instant::now() - t0
}

fn rate_limited(after: Duration) -> Step {
    Step::Fail {
        after,
        error: ProviderError::from_status(429, "slow down"),
    }
}

// proves: Q-15 (a one-shot answer that took long to generate holds its
// slot only until the arrival bound after it was sent, plus one window;
// not W after the lease, not W after the answer)
#[tokio::test(start_paused = true)]
async fn a_slow_answer_is_counted_from_the_arrival_bound() {
    let c = controller(ScopeConfig::new("m").requests(1, MINUTE));
    let sup = supervisor(
        &c,
        vec![Step::Reply {
            after: secs(10),
            usage: Usage::known(100),
        }],
        Accounting::default(),
    );
    let t0 = Instant::now();
    sup.invoke(&"a".into(), CallOptions::default())
        .await
        .unwrap();
    assert_eq!(
        next_admission_after(&c, t0).await,
        secs(60) + ms(500),
        "counted until the 500 ms arrival floor plus one window"
    );
}

// proves: Q-15 (a refusal bounds its own counting instant and teaches the
// arrival bound that later slow answers are held for)
#[tokio::test(start_paused = true)]
async fn refusals_teach_the_arrival_bound() {
    let c = controller(ScopeConfig::new("m").requests(10, MINUTE));
    let accounting = Accounting {
        refusal_cost: RefusalCost::Free,
        ..Accounting::default()
    };
    // A refusal answered 2 s after sending, then a slow answer.
    let sup = supervisor(
        &c,
        vec![
            rate_limited(secs(2)),
            Step::Reply {
                after: secs(30),
                usage: Usage::known(100),
            },
        ],
        accounting,
    );
    let started = tokio::spawn({
        let sup = sup.clone();
        async move { sup.invoke(&"a".into(), CallOptions::default()).await }
    });
    settle().await;
    tokio::time::advance(secs(2)).await;
    settle().await;
    // The refusal cost nothing at the provider: nothing counted for it.
    assert_eq!(available(&c, Dimension::Requests), 10);
    let done = started.await.unwrap().unwrap();
    assert_eq!(done.attempts, 2);
    // The second attempt starts after the cooldown the 429 began (1 s
    // without a hint) at 3 s; its answer came at 33 s. Its unit stays until
    // 3 s + 2 s (the learned bound) + 60 s.
    let snap = c.snapshot();
    let limit = &snap.scopes[0].limits[0];
    assert_eq!(limit.available, 9);
    tokio::time::advance(secs(65) - secs(33) - ms(1)).await;
    assert_eq!(available(&c, Dimension::Requests), 9, "still counted");
    tokio::time::advance(ms(1)).await;
    assert_eq!(available(&c, Dimension::Requests), 10, "freed at 65 s");
}

// proves: Q-15 (the learned arrival bound is capped and decays: a refusal
// answered after 60 s, a proxy's own timeout rather than an arrival delay,
// holds later slow answers for the cap of 10 s, not 60 s; and after ten
// minutes without a slow refusal the bound is the floor again). Found in
// review, where the first version failed: the bound only ever grew
// (`fetch_max`), so one slow 429 slowed every later attempt for the life
// of the process.
#[tokio::test(start_paused = true)]
async fn a_slow_refusal_teaches_a_capped_bound_that_decays() {
    assert_eq!((ARRIVAL_CAP, ARRIVAL_MEMORY), (secs(10), secs(300)));
    let c = controller(ScopeConfig::new("m").requests(10, MINUTE));
    let accounting = Accounting {
        refusal_cost: RefusalCost::Free,
        ..Accounting::default()
    };
    let slow_answer = || Step::Reply {
        after: secs(30),
        usage: Usage::known(100),
    };
    let sup = supervisor(
        &c,
        vec![rate_limited(secs(60)), slow_answer(), slow_answer()],
        accounting,
    );
    let t0 = Instant::now();
    let done = sup
        .invoke(&"a".into(), CallOptions::default())
        .await
        .unwrap();
    assert_eq!(done.attempts, 2);
    // The second attempt started at 61 s (after the 1 s cooldown) and was
    // answered at 91 s: its unit stays until 61 s + 10 s (the cap) + 60 s.
    let until = t0 + secs(61 + 10 + 60);
    tokio::time::advance(until - Instant::now() - ms(1)).await;
    assert_eq!(available(&c, Dimension::Requests), 9, "still counted");
    tokio::time::advance(ms(1)).await;
    assert_eq!(available(&c, Dimension::Requests), 10, "freed at the cap");

    // Ten minutes later the 60 s refusal is forgotten: a slow answer is
    // held for the 500 ms floor only.
    tokio::time::advance(secs(600)).await;
    let t1 = Instant::now();
    sup.invoke(&"b".into(), CallOptions::default())
        .await
        .unwrap();
    let until = t1 + ms(500) + secs(60);
    tokio::time::advance(until - Instant::now() - ms(1)).await;
    assert_eq!(available(&c, Dimension::Requests), 9, "still counted");
    tokio::time::advance(ms(1)).await;
    assert_eq!(available(&c, Dimension::Requests), 10, "freed at the floor");
}

// proves: Q-15 (a stream is counted from the moment its response began:
// it frees one window after that, not after its lease)
#[tokio::test(start_paused = true)]
async fn a_stream_is_counted_when_its_response_begins() {
    let c = controller(ScopeConfig::new("m").requests(1, MINUTE));
    let sup = supervisor(
        &c,
        vec![Step::Stream {
            events: vec![(secs(3), Ev::Chunk("a")), (secs(1), Ev::Usage(90))],
            end: common::script::End::Eof,
        }],
        Accounting::default(),
    );
    let t0 = Instant::now();
    let mut stream = sup
        .stream(&"s".into(), CallOptions::default())
        .await
        .unwrap();
    while let Some(item) = stream.next().await {
        item.unwrap();
    }
    drop(stream);
    assert_eq!(next_admission_after(&c, t0).await, secs(63));
}

// proves: Q-15 (an attempt cancelled mid-flight may still reach the
// provider: it stays counted until the arrival bound plus one window)
#[tokio::test(start_paused = true)]
async fn a_cancelled_attempt_stays_counted_for_the_arrival_bound() {
    assert_eq!(next_after_a_cancel(secs(5)).await, secs(60) + ms(500));
}

/// When the next call of a scope of one request a minute is admitted,
/// after an attempt that hangs was cancelled `after` its start.
async fn next_after_a_cancel(after: Duration) -> Duration {
    let c = controller(ScopeConfig::new("m").requests(1, MINUTE));
    let sup = supervisor(&c, vec![Step::Hang], Accounting::default());
    let t0 = Instant::now();
    let call = tokio::spawn({
        let sup = sup.clone();
        async move { sup.invoke(&"a".into(), CallOptions::default()).await }
    });
    settle().await;
    tokio::time::advance(after).await;
    call.abort();
    let _ = call.await;
    next_admission_after(&c, t0).await
}

// proves: Q-15 (an attempt cancelled before its arrival bound has passed
// stays counted until one window after the bound, not after the cancel)
#[tokio::test(start_paused = true)]
async fn an_attempt_cancelled_before_its_arrival_bound_is_counted_from_the_bound() {
    // Cancelled 100 ms in: it may still arrive until the 500 ms floor.
    assert_eq!(next_after_a_cancel(ms(100)).await, secs(60) + ms(500));
}

// proves: Q-15 (in a fixed window, an attempt cancelled before its arrival
// bound, which lies in the next window, is counted in that window too)
#[tokio::test(start_paused = true)]
async fn a_cancelled_attempt_is_counted_in_the_window_of_its_arrival_bound() {
    let c = controller(
        ScopeConfig::new("m")
            .requests(1, secs(1))
            .algorithm(Algorithm::FixedWindow),
    );
    let sup = supervisor(&c, vec![Step::Hang], Accounting::default());
    let t0 = Instant::now();
    tokio::time::advance(ms(800)).await;
    let call = tokio::spawn({
        let sup = sup.clone();
        async move { sup.invoke(&"a".into(), CallOptions::default()).await }
    });
    settle().await;
    // Leased at 800 ms, cancelled at 900 ms: it may arrive until 1.3 s,
    // in the window [1 s, 2 s).
    tokio::time::advance(ms(100)).await;
    call.abort();
    let _ = call.await;
    assert_eq!(next_admission_after(&c, t0).await, secs(2));
}

async fn after_one_refusal(cost: RefusalCost) -> (i64, i64) {
    let c = controller(
        ScopeConfig::new("m")
            .requests(10, MINUTE)
            .tokens(1_000, MINUTE),
    );
    let accounting = Accounting {
        refusal_cost: cost,
        ..Accounting::default()
    };
    let policy_once = AttemptPolicy {
        max_attempts: 1,
        ..AttemptPolicy::default()
    };
    let sup = Supervisor::builder(c.clone(), Script::new(vec![rate_limited(ms(0))]))
        .estimator(|_: &String| -> Result<TokenEstimate, EstimateError> {
            Ok(TokenEstimate::new(60, 40))
        })
        .policy(policy_once)
        .without_jitter()
        .accounting(accounting)
        .build()
        .unwrap();
    let err = sup
        .invoke(&"a".into(), CallOptions::default())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), "rate_limited");
    (
        available(&c, Dimension::Requests),
        available(&c, Dimension::Tokens),
    )
}

// proves: Q-16 (a refusal costs tollgate's window exactly what it cost at
// the provider: everything, the request unit only, or nothing)
#[tokio::test(start_paused = true)]
async fn a_refusal_costs_what_the_provider_charges() {
    assert_eq!(after_one_refusal(RefusalCost::Full).await, (9, 900));
    assert_eq!(after_one_refusal(RefusalCost::Request).await, (9, 1_000));
    assert_eq!(after_one_refusal(RefusalCost::Free).await, (10, 1_000));
}

// proves: Q-16 (a provider that charges at admission and never settles
// keeps its charge: no refund below the estimate)
#[tokio::test(start_paused = true)]
async fn no_refund_below_what_a_non_settling_provider_charged() {
    for (reconciles, expected) in [(true, 1_000 - 30), (false, 1_000 - 100)] {
        let c = controller(ScopeConfig::new("m").tokens(1_000, MINUTE));
        let sup = supervisor(
            &c,
            vec![Step::Reply {
                after: ms(0),
                usage: Usage::known(30),
            }],
            Accounting {
                reconciles,
                ..Accounting::default()
            },
        );
        sup.invoke(&"a".into(), CallOptions::default())
            .await
            .unwrap();
        assert_eq!(
            available(&c, Dimension::Tokens),
            expected,
            "reconciles: {reconciles}"
        );
    }
}

fn report(
    dimension: Dimension,
    limit: Option<u64>,
    remaining: u64,
    reset: Duration,
) -> BudgetReport {
    BudgetReport {
        dimension,
        limit,
        remaining: Some(remaining),
        reset: Some(reset),
    }
}

// proves: Q-14 (a provider with less left than tollgate thinks takes the
// difference out of the window until its reset; more left never raises
// availability)
#[tokio::test(start_paused = true)]
async fn a_smaller_remaining_budget_is_taken_out_until_the_reset() {
    let c = controller(ScopeConfig::new("m").requests(100, MINUTE));
    let lease = c
        .acquire(&Call::new(ScopeId::FIRST), Deadline::NONE)
        .await
        .unwrap();
    drop(lease);
    assert_eq!(available(&c, Dimension::Requests), 99);
    let now = Instant::now();
    // More left at the provider than here: nothing changes.
    let more = c.observe(
        ScopeId::FIRST,
        &report(Dimension::Requests, None, 100, secs(60)),
        now,
    );
    assert_eq!(more.gap, 0);
    assert_eq!(available(&c, Dimension::Requests), 99);
    // Another client spent 30: the provider has 69 left, for 20 s.
    let less = c.observe(
        ScopeId::FIRST,
        &report(Dimension::Requests, None, 69, secs(20)),
        now,
    );
    assert_eq!(less.gap, 30);
    assert_eq!(available(&c, Dimension::Requests), 69);
    // The same report again takes nothing more.
    let again = c.observe(
        ScopeId::FIRST,
        &report(Dimension::Requests, None, 69, secs(20)),
        now,
    );
    assert_eq!(again.gap, 0);
    tokio::time::advance(secs(20)).await;
    assert_eq!(available(&c, Dimension::Requests), 99, "freed at the reset");
    assert_eq!(c.snapshot().scopes[0].counters.gap_requests, 30);
}

// proves: Q-14 (attempts in flight do not hide another client's
// spending: an answer is compared with what the provider certainly counted
// of tollgate's traffic when it counted that attempt; among answers to
// overlapping attempts the smallest estimate holds, and an estimate is
// replaced, not added to, by a later one)
#[tokio::test(start_paused = true)]
async fn answers_reveal_other_clients_despite_attempts_in_flight() {
    let c = controller(ScopeConfig::new("m").requests(100, MINUTE));
    let call = Call::new(ScopeId::FIRST);
    let requests = |remaining| report(Dimension::Requests, None, remaining, secs(60));
    // Two attempts answered before the burst: the provider counted them.
    for _ in 0..2 {
        let mut lease = c.acquire(&call, Deadline::NONE).await.unwrap();
        tokio::time::advance(ms(10)).await;
        lease.counted_by(Instant::now());
    }
    tokio::time::advance(ms(100)).await;
    // Ten attempts in flight at once; another client holds 30.
    let mut burst = Vec::new();
    for _ in 0..10 {
        burst.push(c.acquire(&call, Deadline::NONE).await.unwrap());
    }
    assert_eq!(available(&c, Dimension::Requests), 88);
    tokio::time::advance(ms(20)).await;
    let now = Instant::now();
    // The fourth of the burst answers first; it arrived after two others
    // of the burst: 100 - 30 - 2 earlier - 2 of the burst - itself.
    let mut answered = burst.remove(3);
    answered.counted_by(now);
    let first = c.observe_answer(&answered, &requests(65), now);
    assert_eq!(
        first.gap, 32,
        "an upper bound: two of the burst look like others"
    );
    assert_eq!(available(&c, Dimension::Requests), 56);
    // The burst's first arrival answers: exactly the other client's 30.
    let mut earliest = burst.remove(0);
    earliest.counted_by(now);
    let exact = c.observe_answer(&earliest, &requests(67), now);
    assert_eq!((exact.gap, exact.freed), (0, 2));
    assert_eq!(available(&c, Dimension::Requests), 58);
    // A later answer of the same burst (more of it counted) changes nothing.
    let mut later = burst.remove(0);
    later.counted_by(now);
    let same = c.observe_answer(&later, &requests(60), now);
    assert_eq!((same.gap, same.freed), (0, 0));
    for lease in &mut burst {
        lease.counted_by(now);
    }
    drop((answered, earliest, later, burst));
    // Alone in flight later: the other client now holds 20, its estimate
    // replaces the old one.
    tokio::time::advance(secs(1)).await;
    let mut alone = c.acquire(&call, Deadline::NONE).await.unwrap();
    tokio::time::advance(ms(10)).await;
    let now = Instant::now();
    alone.counted_by(now);
    // 100 - 20 - 12 before it - itself.
    let replaced = c.observe_answer(&alone, &requests(67), now);
    assert_eq!((replaced.gap, replaced.freed), (0, 10));
    assert_eq!(available(&c, Dimension::Requests), 100 - 13 - 20);
    // What others hold leaves one window after the provider counted it.
    tokio::time::advance(secs(60)).await;
    assert_eq!(available(&c, Dimension::Requests), 100);
    assert_eq!(c.snapshot().scopes[0].counters.gap_requests, 32);
}

// proves: Q-14, Q-12 (an input-token budget report, as Anthropic sends
// for its ITPM, takes another client's input spending out of the scope's
// input-token limit until its reset, and leaves the other limits alone)
#[tokio::test(start_paused = true)]
async fn a_smaller_input_token_budget_is_taken_out_of_the_input_limit() {
    let c = controller(
        ScopeConfig::new("m")
            .input_tokens(1_000, MINUTE)
            .output_tokens(500, MINUTE),
    );
    let call = Call::new(ScopeId::FIRST).with_estimate(TokenEstimate::new(100, 50));
    let lease = c.acquire(&call, Deadline::NONE).await.unwrap();
    drop(lease);
    assert_eq!(available(&c, Dimension::InputTokens), 900);
    let now = Instant::now();
    // Another client spent 300 input tokens: 600 left for 10 s.
    let less = c.observe(
        ScopeId::FIRST,
        &report(Dimension::InputTokens, None, 600, secs(10)),
        now,
    );
    assert_eq!(less.gap, 300);
    assert_eq!(available(&c, Dimension::InputTokens), 600);
    assert_eq!(available(&c, Dimension::OutputTokens), 450);
    tokio::time::advance(secs(10)).await;
    assert_eq!(
        available(&c, Dimension::InputTokens),
        900,
        "freed at the reset"
    );
}

// proves: Q-14 (limits the configuration leaves out are learned from the
// provider: one request per window until the first report, then the
// advertised amounts; a configured limit is never changed)
#[tokio::test(start_paused = true)]
async fn missing_limits_are_learned_from_the_provider() {
    let c = controller(
        ScopeConfig::new("m")
            .tokens(5_000, MINUTE)
            .learn_limits(MINUTE),
    );
    let call = Call::new(ScopeId::FIRST).with_estimate(TokenEstimate::new(100, 0));
    let first = c.acquire(&call, Deadline::NONE).await.unwrap();
    // Nothing else goes out before the provider has answered once.
    let second = c
        .acquire(&call, Deadline::after(secs(1)))
        .await
        .unwrap_err();
    assert!(second.phase().is_some(), "{second:?}");
    let now = Instant::now();
    let adopted = c.observe(
        ScopeId::FIRST,
        &report(Dimension::Requests, Some(600), 599, secs(60)),
        now,
    );
    assert_eq!(adopted.adopted, Some(600));
    drop(first);
    assert_eq!(available(&c, Dimension::Requests), 599);
    // The configured token limit stays what it is.
    let tokens = c.observe(
        ScopeId::FIRST,
        &report(Dimension::Tokens, Some(90_000), 89_900, secs(60)),
        now,
    );
    assert_eq!(tokens.adopted, None);
    let snap = c.snapshot();
    let limit = snap.scopes[0]
        .limits
        .iter()
        .find(|l| l.dimension == Dimension::Tokens)
        .unwrap();
    assert_eq!(limit.limit, 5_000);
}

// proves: Q-14 (while limits are being learned, queued calls wait for the
// provider's first answer instead of failing an early verdict; a provider
// that advertises no request limit leaves none behind)
#[tokio::test(start_paused = true)]
async fn a_provider_that_advertises_nothing_leaves_no_stand_in() {
    let c = controller(ScopeConfig::new("m").learn_limits(MINUTE));
    let call = Call::new(ScopeId::FIRST).with_estimate(TokenEstimate::new(10, 0));
    let first = c.acquire(&call, Deadline::NONE).await.unwrap();
    let waiting = tokio::spawn({
        let c = c.clone();
        async move { c.acquire(&call, Deadline::after(secs(30))).await }
    });
    settle().await;
    assert!(!waiting.is_finished(), "no early verdict while learning");
    tokio::time::advance(secs(2)).await;
    c.provider_answered(ScopeId::FIRST);
    let second = waiting
        .await
        .unwrap()
        .expect("admitted once the provider answered");
    drop((first, second));
    for _ in 0..100 {
        drop(c.acquire(&call, Deadline::NONE).await.unwrap());
    }
    assert!(c.snapshot().scopes[0].limits.is_empty());
}

/// A provider whose one-shot answers take `after` and carry a request
/// budget report.
struct Reporting {
    after: Duration,
    remaining: u64,
    reset: Duration,
}

impl Provider for Reporting {
    type Request = String;
    type Response = String;
    type Chunk = String;
    type Stream = futures_util::stream::Empty<Result<StreamEvent<String>, ProviderError>>;

    async fn call(&self, r: &String, _: AttemptContext) -> Result<Reply<String>, ProviderError> {
        tokio::time::sleep(self.after).await;
        Ok(
            Reply::new(r.clone(), Usage::known(10)).with_budget(Budgets {
                requests: Some(BudgetReport {
                    dimension: Dimension::Requests,
                    limit: Some(100),
                    remaining: Some(self.remaining),
                    reset: Some(self.reset),
                }),
                ..Budgets::default()
            }),
        )
    }

    async fn stream(&self, _: &String, _: AttemptContext) -> Result<Self::Stream, ProviderError> {
        Err(ProviderError::new(ErrorKind::Client, "no streams"))
    }
}

// proves: Q-14 (the supervisor hands every response's budget report to the
// controller: a hidden consumer's spending becomes tollgate's debt)
#[tokio::test(start_paused = true)]
async fn supervised_answers_report_the_providers_budget() {
    let c = controller(ScopeConfig::new("m").requests(100, MINUTE));
    let sup = Supervisor::builder(
        c.clone(),
        Reporting {
            after: Duration::ZERO,
            remaining: 49,
            reset: secs(60),
        },
    )
    .build()
    .unwrap();
    sup.invoke(&"a".into(), CallOptions::default())
        .await
        .unwrap();
    // tollgate counted 1, the provider has 49 left: 50 taken out.
    assert_eq!(available(&c, Dimension::Requests), 49);
}

// proves: Q-14 (a slow one-shot answer's estimate lasts until the reset
// counted from the answer). Found in review, where the first version
// failed: The same through the supervisor: for a one-shot answer the
// record's counted instant is `sent + arrival bound`, and the estimate is
// kept until `counted + reset`; when generation takes longer than the
// provider's reset (typical: OpenAI's `x-ratelimit-reset-*` is often a
// few seconds or less), the gap is never applied at all. Before the first version
// the debt ran from the response (`at + reset`), so this took 50 out.
#[tokio::test(start_paused = true)]
async fn a_slow_one_shot_answer_takes_the_gap_out() {
    let c = controller(ScopeConfig::new("m").requests(100, MINUTE));
    let sup = Supervisor::builder(
        c.clone(),
        Reporting {
            after: secs(20),
            remaining: 49,
            reset: secs(10),
        },
    )
    .build()
    .unwrap();
    sup.invoke(&"a".into(), CallOptions::default())
        .await
        .unwrap();
    let snapshot = c.snapshot();
    println!(
        "available {}, gap_requests {}",
        available(&c, Dimension::Requests),
        snapshot.scopes[0].counters.gap_requests
    );
    // tollgate counted 1, the provider has 49 left for another 10 s.
    assert_eq!(available(&c, Dimension::Requests), 49);
}

// proves, Q-15 (an attempt counted by an instant of the next
// window and settled above its estimate keeps its debt in the window it
// is counted in: that window admits nothing more)
#[tokio::test(start_paused = true)]
async fn debt_after_a_recount_ahead_stays_counted() {
    for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingWindow] {
        let c = controller(
            ScopeConfig::new("m")
                .tokens(100, secs(60))
                .algorithm(algorithm),
        );
        let t0 = Instant::now();
        let mut lease = c
            .acquire(&common::tokens(10), Deadline::NONE)
            .await
            .unwrap();
        // The provider may count it as late as 70 s, in the next window.
        lease.counted_by(t0 + secs(70));
        // It used 100 tokens: 90 over its estimate.
        lease.reconcile(Usage::known(100)).unwrap();
        drop(lease);
        settle().await;
        assert_eq!(available(&c, Dimension::Tokens), 0, "{algorithm:?}");
        assert!(
            c.acquire(&common::tokens(10), common::within(secs(50)))
                .await
                .is_err(),
            "{algorithm:?}: 10 more tokens admitted into a window that counts 100 of 100"
        );
    }
}

// proves: Q-15 (an arrival bound moved ahead twice counts the attempt
// once in each window up to the later bound, not twice)
#[tokio::test(start_paused = true)]
async fn a_bound_moved_ahead_twice_counts_once() {
    for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingWindow] {
        let c = controller(
            ScopeConfig::new("m")
                .requests(2, secs(60))
                .algorithm(algorithm),
        );
        let t0 = Instant::now();
        let mut lease = c.acquire(&common::plain(), Deadline::NONE).await.unwrap();
        lease.counted_by(t0 + secs(70));
        lease.counted_by(t0 + secs(80));
        drop(lease);
        assert_eq!(
            available(&c, Dimension::Requests),
            1,
            "{algorithm:?}, [0, 60 s)"
        );
        tokio::time::advance(secs(65)).await;
        assert_eq!(
            available(&c, Dimension::Requests),
            1,
            "{algorithm:?}, at 65 s"
        );
        tokio::time::advance(secs(100)).await;
        assert_eq!(
            available(&c, Dimension::Requests),
            2,
            "{algorithm:?}, at 165 s"
        );
    }
}
