//! Edges of the supervised call lifecycle found in review (SPEC §2 DL, §7
//! RT, §8 CB, §9 LC, BUD-5, Q-16, CD-2): usage a failing stream reports,
//! a failed attempt of a provider that does not settle, circuits that open
//! while a call waits, hooks past their cap, huge hints, zero-length
//! cooldowns, attempts never sent. Each test's comment tells the defect
//! it found as the code was before its fix; the last one races calls,
//! streams, deadlines, drops and the breaker on real threads and found
//! nothing.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::script::{End, Ev, Script, Step};
use common::{secs, settle};
use futures_util::StreamExt;
use parking_lot::Mutex;
use tokio::time::Instant;
use tollgate::config::{MINUTE, ScopeConfig};
use tollgate::lifecycle::{
    Accounting, AttemptPolicy, CallError, CallOptions, CallReport, CircuitBreaker, CircuitConfig,
    CircuitState, ErrorKind, Hooks, ProviderError, Supervisor, Terminal,
};
use tollgate::quota::Dimension;
use tollgate::{AdmissionController, Deadline, EstimateError, Phase, TokenEstimate, Usage};

/// 60 input + 40 output tokens reserved per attempt.
fn estimate(_: &String) -> Result<TokenEstimate, EstimateError> {
    Ok(TokenEstimate::new(60, 40))
}

struct Env {
    controller: AdmissionController,
    sup: Supervisor<Script>,
    reports: Arc<Mutex<Vec<CallReport>>>,
}

fn env_with(
    steps: Vec<Step>,
    concurrency: Option<u64>,
    policy: AttemptPolicy,
    breaker: Option<CircuitBreaker>,
    hooks: Hooks,
) -> Env {
    let mut b = AdmissionController::builder().scope(
        ScopeConfig::new("main")
            .requests(100, MINUTE)
            .tokens(1_000, MINUTE),
    );
    if let Some(c) = concurrency {
        b = b.concurrency(c);
    }
    let controller = b.build().unwrap();
    let reports = Arc::new(Mutex::new(Vec::new()));
    let sink = reports.clone();
    let mut sb = Supervisor::builder(controller.clone(), Script::new(steps))
        .estimator(estimate)
        .policy(policy)
        .without_jitter()
        .hooks(hooks)
        .observer(Arc::new(move |r: &CallReport| sink.lock().push(r.clone())));
    if let Some(b) = breaker {
        sb = sb.breaker(b);
    }
    Env {
        controller,
        sup: sb.build().unwrap(),
        reports,
    }
}

fn no_retry() -> AttemptPolicy {
    AttemptPolicy {
        jitter: 0.0,
        ..AttemptPolicy::none()
    }
}

fn tokens_available(c: &AdmissionController) -> i64 {
    common::available(c, Dimension::Tokens)
}

async fn drain(sup: &Supervisor<Script>) -> Vec<Result<String, CallError>> {
    let mut s = sup
        .stream(&"q".to_string(), CallOptions::default())
        .await
        .expect("the stream opens");
    let mut out = Vec::new();
    while let Some(item) = s.next().await {
        out.push(item);
    }
    out
}

// ------------------------------------------------------------------ BUD-5

// proves: BUD-5, Q-5 (a stream cut midway is charged what the provider
// reports: the usage the adapter hands over with the final error).
// Found in review: the supervised stream dropped the error's usage and
// kept the whole estimate.
#[tokio::test(start_paused = true)]
async fn a_stream_cut_midway_is_charged_the_usage_its_error_reports() {
    let cut =
        ProviderError::new(ErrorKind::StreamBroken, "connection reset").with_usage(Usage::known(7));
    let env = env_with(
        vec![Step::chunks(&["a", "b"], End::Fail(cut))],
        None,
        no_retry(),
        None,
        Hooks::default(),
    );
    let items = drain(&env.sup).await;
    assert_eq!(items.len(), 3, "{items:?}");
    assert!(matches!(items[2], Err(CallError::Stream { .. })));
    settle().await;
    assert_eq!(
        tokens_available(&env.controller),
        1_000 - 7,
        "the 7 tokens the provider reported are charged, not the 100 estimated"
    );
}

// proves: BUD-5, LC-4 (a provider-declared error chunk that carries
// usage is charged that usage). Found in review: the estimate was kept.
#[tokio::test(start_paused = true)]
async fn a_declared_error_chunk_is_charged_the_usage_it_reports() {
    let declared =
        ProviderError::new(ErrorKind::Declared, "overloaded").with_usage(Usage::known(7));
    let env = env_with(
        vec![Step::Stream {
            events: vec![
                (Duration::ZERO, Ev::Chunk("a")),
                (Duration::ZERO, Ev::ErrorChunk("err", declared)),
            ],
            end: End::Eof,
        }],
        None,
        no_retry(),
        None,
        Hooks::default(),
    );
    let items = drain(&env.sup).await;
    assert_eq!(items.len(), 3, "{items:?}");
    settle().await;
    assert_eq!(tokens_available(&env.controller), 1_000 - 7);
}

// proves: BUD-5, Q-5 (usage reported before the first chunk of an
// attempt that then fails is what that attempt is charged). Found in
// review: `stream::open` dropped it and the attempt kept its estimate.
#[tokio::test(start_paused = true)]
async fn usage_reported_before_a_setup_failure_is_charged() {
    let env = env_with(
        vec![Step::Stream {
            events: vec![(Duration::ZERO, Ev::Usage(7))],
            end: End::Fail(ProviderError::new(ErrorKind::StreamBroken, "reset")),
        }],
        None,
        no_retry(),
        None,
        Hooks::default(),
    );
    let err = env
        .sup
        .stream(&"q".to_string(), CallOptions::default())
        .await
        .map(|_| ())
        .unwrap_err();
    assert!(matches!(err, CallError::Provider { .. }), "{err:?}");
    settle().await;
    assert_eq!(tokens_available(&env.controller), 1_000 - 7);
}

// ------------------------------------------------------------------

// proves: Q-16 (settlement never refunds below what a provider that
// does not reconcile has charged: a failed attempt on such a provider
// keeps its estimate). Found in review: a failed attempt was reconciled
// with its error's usage, giving back tokens the provider kept charged.
#[tokio::test(start_paused = true)]
async fn a_failed_attempt_on_a_non_reconciling_provider_keeps_its_estimate() {
    let env = env_with(vec![], None, no_retry(), None, Hooks::default());
    let sup = Supervisor::builder(
        env.controller.clone(),
        Script::new(vec![Step::fail(
            ProviderError::from_status(500, "down").with_usage(Usage::known(5)),
        )]),
    )
    .estimator(estimate)
    .policy(no_retry())
    .accounting(Accounting {
        reconciles: false,
        ..Accounting::default()
    })
    .build()
    .unwrap();
    let _ = sup
        .invoke(&"q".to_string(), CallOptions::default())
        .await
        .unwrap_err();
    settle().await;
    assert_eq!(
        tokens_available(&env.controller),
        1_000 - 100,
        "the provider keeps the 100 tokens it charged at admission"
    );
    // By contrast, the same provider's successful attempt keeps them.
    let ok = Supervisor::builder(
        env.controller.clone(),
        Script::new(vec![Step::Reply {
            after: Duration::ZERO,
            usage: Usage::known(5),
        }]),
    )
    .estimator(estimate)
    .policy(no_retry())
    .accounting(Accounting {
        reconciles: false,
        ..Accounting::default()
    })
    .build()
    .unwrap();
    ok.invoke(&"q".to_string(), CallOptions::default())
        .await
        .unwrap();
    assert_eq!(tokens_available(&env.controller), 1_000 - 200);
}

// ------------------------------------------------------------------- CB-4

fn half_open_breaker() -> CircuitBreaker {
    CircuitBreaker::new(CircuitConfig {
        failure_threshold: 1,
        recovery_time: secs(30),
        half_open_calls: 1,
    })
    .unwrap()
}

// proves: CB-4 (a half-open stream that fails mid-way with a
// provider-declared error is a failure: the circuit opens again). Found
// in review: it was reported neutral and the circuit stayed half-open.
#[tokio::test(start_paused = true)]
async fn a_half_open_stream_failing_midway_with_a_declared_error_reopens() {
    let b = half_open_breaker();
    let declared = ProviderError::new(ErrorKind::Declared, "overloaded");
    let env = env_with(
        vec![
            Step::fail(ProviderError::from_status(500, "down")),
            Step::Stream {
                events: vec![
                    (Duration::ZERO, Ev::Chunk("a")),
                    (Duration::ZERO, Ev::ErrorChunk("err", declared)),
                ],
                end: End::Eof,
            },
        ],
        None,
        no_retry(),
        Some(b.clone()),
        Hooks::default(),
    );
    let _ = env
        .sup
        .invoke(&"trip".into(), CallOptions::default())
        .await
        .unwrap_err();
    assert_eq!(b.state(), CircuitState::Open);
    tokio::time::advance(secs(30)).await;
    let items = drain(&env.sup).await;
    assert!(matches!(items.last(), Some(Err(CallError::Stream { .. }))));
    assert_eq!(
        b.state(),
        CircuitState::Open,
        "a half-open stream that failed mid-way reopens the circuit"
    );
}

// proves: CB-4 (the same with a stream whose body breaks the protocol
// mid-way, `ErrorKind::Protocol`).
#[tokio::test(start_paused = true)]
async fn a_half_open_stream_failing_midway_with_a_protocol_error_reopens() {
    let b = half_open_breaker();
    let env = env_with(
        vec![
            Step::fail(ProviderError::from_status(500, "down")),
            Step::chunks(
                &["a"],
                End::Fail(ProviderError::new(ErrorKind::Protocol, "bad event")),
            ),
        ],
        None,
        no_retry(),
        Some(b.clone()),
        Hooks::default(),
    );
    let _ = env
        .sup
        .invoke(&"trip".into(), CallOptions::default())
        .await
        .unwrap_err();
    tokio::time::advance(secs(30)).await;
    let items = drain(&env.sup).await;
    assert!(matches!(items.last(), Some(Err(CallError::Stream { .. }))));
    assert_eq!(b.state(), CircuitState::Open);
}

// ------------------------------------------------------------------- CB-3

// proves: CB-3 (an open circuit ⇒ `CircuitOpen` without any transport
// attempt, also for a call admitted before it opened that waited for a
// concurrency permit meanwhile). Found in review: the breaker was read
// once, before admission, and the request went out.
#[tokio::test(start_paused = true)]
async fn a_call_admitted_after_the_circuit_opened_makes_no_transport_attempt() {
    let b = half_open_breaker();
    let env = env_with(
        vec![],
        Some(1),
        no_retry(),
        Some(b.clone()),
        Hooks::default(),
    );
    let held = env
        .controller
        .acquire(&common::tokens(100), Deadline::NONE)
        .await
        .unwrap();
    let sup = env.sup.clone();
    let waiting =
        tokio::spawn(async move { sup.invoke(&"q".to_string(), CallOptions::default()).await });
    settle().await;
    assert!(!waiting.is_finished(), "waits for the permit");
    // Another call of the same upstream fails: the circuit opens.
    b.try_acquire().unwrap().failure();
    assert_eq!(b.state(), CircuitState::Open);
    drop(held);
    let result = waiting.await.unwrap();
    assert_eq!(
        env.sup.provider().work.started(),
        0,
        "no request to an upstream whose circuit is open: {result:?}"
    );
}

// proves: CB-3 (a call sleeping between two attempts while the circuit
// opens makes no further attempt). Found in review: it retried anyway.
#[tokio::test(start_paused = true)]
async fn a_retry_after_the_circuit_opened_makes_no_transport_attempt() {
    let b = half_open_breaker();
    let env = env_with(
        vec![Step::fail(ProviderError::from_status(503, "busy"))],
        None,
        AttemptPolicy {
            jitter: 0.0,
            ..AttemptPolicy::default()
        },
        Some(b.clone()),
        Hooks::default(),
    );
    let sup = env.sup.clone();
    let call =
        tokio::spawn(async move { sup.invoke(&"q".to_string(), CallOptions::default()).await });
    settle().await;
    assert_eq!(env.sup.provider().work.started(), 1);
    b.try_acquire().unwrap().failure();
    assert_eq!(b.state(), CircuitState::Open);
    let result = call.await.unwrap();
    assert_eq!(
        env.sup.provider().work.started(),
        1,
        "no retry to an upstream whose circuit is open: {result:?}"
    );
}

// ------------------------------------------------------------------- DL-6

// proves: DL-6 (the phase is where the time ran out: a pre-hook that
// uses the call's time up to its deadline reports phase `hook`). Found
// in review: it reported `rate`, the admission's phase.
#[tokio::test(start_paused = true)]
async fn a_pre_hook_that_runs_to_the_deadline_reports_phase_hook() {
    let hooks = Hooks {
        pre: Some(Arc::new(|_| {
            Box::pin(async {
                tokio::time::sleep(secs(5)).await;
                Ok(())
            })
        })),
        ..Hooks::default()
    };
    let env = env_with(vec![], None, no_retry(), None, hooks);
    let deadline = Deadline::from_timeout(Some(secs(5)), Instant::now());
    let err = env
        .sup
        .invoke(&"q".to_string(), CallOptions::deadline(deadline))
        .await
        .unwrap_err();
    assert_eq!(err.phase(), Some(Phase::Hook), "{err:?}");
    assert_eq!(env.sup.provider().work.started(), 0);
}

// proves: DL-6, LC-2 (a hook that runs past its own cap while the call
// has most of its deadline left is a hook failure, the call Failed, not
// `DeadlineExceeded`). Found in review: it was `Deadline { phase: Hook }`
// and the call Aborted.
#[tokio::test(start_paused = true)]
async fn a_hook_over_its_local_cap_is_not_a_deadline() {
    let hooks = Hooks {
        pre: Some(Arc::new(|_| {
            Box::pin(async {
                tokio::time::sleep(secs(10)).await;
                Ok(())
            })
        })),
        timeout: Some(secs(1)),
        ..Hooks::default()
    };
    let env = env_with(vec![], None, no_retry(), None, hooks);
    let deadline = Deadline::from_timeout(Some(secs(60)), Instant::now());
    let err = env
        .sup
        .invoke(&"q".to_string(), CallOptions::deadline(deadline))
        .await
        .unwrap_err();
    settle().await;
    assert!(
        !matches!(err, CallError::Deadline { .. }),
        "59 s of the deadline are left: {err:?}"
    );
    assert_eq!(env.reports.lock()[0].terminal, Terminal::Failed);
}

// ------------------------------------------------------------------- RT-3

// proves: RT-3, RT-4 (a server hint is a floor for the next delay: a
// hint too large for the clock never leads to an immediate retry). Found
// in review: `now + delay` overflowed and the supervisor retried at once.
#[tokio::test(start_paused = true)]
async fn a_hint_too_large_for_the_clock_is_not_an_immediate_retry() {
    let env = env_with(
        vec![Step::fail(
            ProviderError::from_status(503, "busy").with_retry_after(Some(Duration::MAX)),
        )],
        None,
        AttemptPolicy {
            jitter: 0.0,
            max_wait: Duration::MAX,
            ..AttemptPolicy::default()
        },
        None,
        Hooks::default(),
    );
    let sup = env.sup.clone();
    let call =
        tokio::spawn(async move { sup.invoke(&"q".to_string(), CallOptions::default()).await });
    settle().await;
    tokio::time::advance(secs(1)).await;
    settle().await;
    assert_eq!(
        env.sup.provider().work.started(),
        1,
        "the retry came before the server's floor: {:?}",
        call.is_finished()
    );
    call.abort();
}

// ------------------------------------------------------------- reports

// proves: LC-1 (a stream cut midway is reported Failed, once).
#[tokio::test(start_paused = true)]
async fn a_cut_stream_is_reported_failed_once() {
    let cut = ProviderError::new(ErrorKind::StreamBroken, "reset");
    let env = env_with(
        vec![Step::chunks(&["a"], End::Fail(cut))],
        None,
        no_retry(),
        None,
        Hooks::default(),
    );
    let _ = drain(&env.sup).await;
    settle().await;
    let reports = env.reports.lock().clone();
    assert_eq!(reports.len(), 1);
    assert_eq!(reports[0].terminal, Terminal::Failed);
}

// ------------------------------------------------------------ CD-1, CD-2

// proves: CD-1, CD-2 (a 429 whose hint is zero pauses nothing and does
// not make the 429s of attempts in flight stale: the next one with a real
// hint starts its cooldown). Found in review: the zero-length cooldown
// bumped the generation, so the 30 s hint that followed started none.
#[tokio::test(start_paused = true)]
async fn a_zero_hint_429_does_not_make_the_next_real_429_stale() {
    let controller = AdmissionController::builder()
        .scope(ScopeConfig::new("main").requests(100, MINUTE))
        .build()
        .unwrap();
    let a = controller
        .acquire(&common::plain(), Deadline::NONE)
        .await
        .unwrap();
    let b = controller
        .acquire(&common::plain(), Deadline::NONE)
        .await
        .unwrap();
    let first = a.rate_limited(Some(Duration::ZERO));
    let second = b.rate_limited(Some(secs(30)));
    let (_, running) = controller.cooldown(tollgate::ScopeId::FIRST).unwrap();
    assert!(
        running.is_some(),
        "the 30 s hint pauses the scope (first: {first:?}, second: {second:?})"
    );
}

// ------------------------------------------------ races (real clock, threads)

mod racing {
    use std::pin::Pin;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
    use std::time::Duration;

    use futures_core::Stream;
    use futures_util::StreamExt;
    use parking_lot::Mutex;
    use tollgate::config::{MINUTE, ScopeConfig};
    use tollgate::lifecycle::{
        AttemptContext, AttemptPolicy, CallOptions, CallReport, CircuitBreaker, CircuitConfig,
        ErrorKind, Provider, ProviderError, Reply, StreamEvent, Supervisor,
    };
    use tollgate::{AdmissionController, CallId, Deadline, Usage};

    /// A provider whose every attempt picks, from the call's request
    /// number and attempt, to succeed, fail (5xx, 429, timeout) or stall,
    /// after a few milliseconds; counts work alive.
    struct Chaos {
        alive: Arc<AtomicI64>,
    }

    struct Alive(Arc<AtomicI64>);
    impl Drop for Alive {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::SeqCst);
        }
    }

    fn mix(mut x: u64) -> u64 {
        x ^= x >> 33;
        x = x.wrapping_mul(0xff51afd7ed558ccd);
        x ^= x >> 33;
        x
    }

    type Events = Pin<Box<dyn Stream<Item = Result<StreamEvent<u64>, ProviderError>> + Send>>;

    fn pick(r: u64, ctx: &AttemptContext) -> u64 {
        mix(r.wrapping_mul(31).wrapping_add(u64::from(ctx.attempt)))
    }

    impl Provider for Chaos {
        type Request = u64;
        type Response = u64;
        type Chunk = u64;
        type Stream = Events;

        async fn call(&self, r: &u64, ctx: AttemptContext) -> Result<Reply<u64>, ProviderError> {
            self.alive.fetch_add(1, Ordering::SeqCst);
            let _alive = Alive(self.alive.clone());
            let x = pick(*r, &ctx);
            tokio::time::sleep(Duration::from_micros(x % 3000)).await;
            match x % 7 {
                0 => Err(ProviderError::from_status(503, "busy")),
                1 => Err(ProviderError::from_status(429, "slow down")
                    .with_retry_after(Some(Duration::from_millis(x % 3)))),
                2 => std::future::pending().await,
                _ => Ok(Reply::new(*r, Usage::known(x % 150))),
            }
        }

        async fn stream(&self, r: &u64, ctx: AttemptContext) -> Result<Events, ProviderError> {
            self.alive.fetch_add(1, Ordering::SeqCst);
            let alive = Alive(self.alive.clone());
            let x = pick(*r, &ctx);
            tokio::time::sleep(Duration::from_micros(x % 2000)).await;
            if x.is_multiple_of(7) {
                return Err(ProviderError::from_status(502, "bad gateway"));
            }
            let n = x % 5;
            let mode = (x >> 8) % 4;
            Ok(Box::pin(futures_util::stream::unfold(
                (0u64, alive),
                move |(i, alive)| async move {
                    tokio::time::sleep(Duration::from_micros(300)).await;
                    if i < n {
                        return Some((Ok(StreamEvent::Chunk(i)), (i + 1, alive)));
                    }
                    match (mode, i == n) {
                        (0, true) => {
                            Some((Ok(StreamEvent::Usage(Usage::known(9))), (i + 1, alive)))
                        }
                        (1, true) => Some((
                            Err(ProviderError::new(ErrorKind::StreamBroken, "cut")),
                            (i + 1, alive),
                        )),
                        (2, _) => {
                            std::future::pending::<()>().await;
                            None
                        }
                        _ => None,
                    }
                },
            )))
        }
    }

    // proves: LC-1, LC-5, LC-6, Q-9, CB-2, CB-4 (under real concurrency:
    // one-shot calls and streams with tiny deadlines, dropped at random
    // instants, on a half-open-prone breaker. Afterwards: every call
    // reported exactly once, no provider work alive, the controller idle,
    // and the breaker not stuck with probe slots nobody holds)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn calls_and_streams_racing_deadlines_drops_and_the_breaker() {
        let controller = AdmissionController::builder()
            .scope(
                ScopeConfig::new("main")
                    .requests(100_000, MINUTE)
                    .tokens(10_000_000, MINUTE),
            )
            .concurrency(4)
            .build()
            .unwrap();
        let breaker = CircuitBreaker::new(CircuitConfig {
            failure_threshold: 2,
            recovery_time: Duration::from_millis(3),
            half_open_calls: 2,
        })
        .unwrap();
        let alive = Arc::new(AtomicI64::new(0));
        let reports: Arc<Mutex<Vec<CallReport>>> = Arc::default();
        let sink = reports.clone();
        let sup = Supervisor::builder(
            controller.clone(),
            Chaos {
                alive: alive.clone(),
            },
        )
        .estimator(|_: &u64| Ok(tollgate::TokenEstimate::new(50, 50)))
        .breaker(breaker.clone())
        .transport_timeout(Duration::from_millis(4))
        .policy(AttemptPolicy {
            base_delay: Duration::from_millis(1),
            max_delay: Duration::from_millis(4),
            ..AttemptPolicy::default()
        })
        .observer(Arc::new(move |r: &CallReport| sink.lock().push(r.clone())))
        .build()
        .unwrap();
        let next_id = Arc::new(AtomicU64::new(1));
        let mut tasks = Vec::new();
        for w in 0..16u64 {
            let sup = sup.clone();
            let next_id = next_id.clone();
            tasks.push(tokio::spawn(async move {
                for k in 0..60u64 {
                    let r = mix(w * 1000 + k);
                    let id = next_id.fetch_add(1, Ordering::SeqCst);
                    let options = CallOptions {
                        id: Some(CallId(id)),
                        deadline: Deadline::after(Duration::from_micros(500 + r % 12_000)),
                        idempotent: !r.is_multiple_of(5),
                    };
                    let drop_at = Duration::from_micros(200 + (r >> 16) % 10_000);
                    if r.is_multiple_of(2) {
                        let _ = tokio::time::timeout(drop_at, sup.invoke(&r, options)).await;
                    } else {
                        let _ = tokio::time::timeout(drop_at, async {
                            if let Ok(mut s) = sup.stream(&r, options).await {
                                while let Some(item) = s.next().await {
                                    if item.is_err() {
                                        break;
                                    }
                                }
                            }
                        })
                        .await;
                    }
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        let total = next_id.load(Ordering::SeqCst) - 1;
        let reports = reports.lock().clone();
        assert_eq!(reports.len() as u64, total, "one report per call");
        let mut ids: Vec<_> = reports.iter().map(|r| r.id).collect();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len() as u64, total, "no call reported twice");
        assert_eq!(alive.load(Ordering::SeqCst), 0, "provider work left alive");
        assert_eq!(sup.active_calls(), 0);
        let s = controller.snapshot();
        assert_eq!(s.active, 0, "{s:#?}");
        assert_eq!((s.scopes[0].queued, s.scopes[0].pending), (0, 0), "{s:#?}");
        // Recovery time has passed: a probe must be admitted now.
        assert!(
            breaker.try_acquire().is_ok(),
            "breaker stuck in {:?}",
            breaker.state()
        );
    }
}

// ------------------------------------------------------------------

// proves, BUD-5 (an attempt whose request never left, such as
// a connection refused at connect, costs nothing anywhere: its request
// unit and tokens come back in full and the retry that answers is the
// only one counted; an attempt that failed after it may have been sent
// stays counted)
#[tokio::test(start_paused = true)]
async fn an_attempt_never_sent_costs_nothing() {
    let retry = AttemptPolicy {
        jitter: 0.0,
        ..AttemptPolicy::default()
    };
    let run = |error: ProviderError| {
        let env = env_with(
            vec![Step::fail(error), Step::ok()],
            None,
            retry,
            None,
            Hooks::default(),
        );
        async move {
            env.sup
                .invoke(&"q".to_string(), CallOptions::default())
                .await
                .expect("the retry answers");
            settle().await;
            (
                common::available(&env.controller, Dimension::Requests),
                tokens_available(&env.controller),
            )
        }
    };
    let refused = ProviderError::new(ErrorKind::Connect, "connection refused").never_sent();
    assert_eq!(
        run(refused).await,
        (99, 1_000 - 10),
        "only the answered attempt is counted"
    );
    let broken = ProviderError::new(ErrorKind::Connect, "connection reset after sending");
    let (requests, tokens) = run(broken).await;
    assert_eq!(
        requests, 98,
        "an attempt that may have been sent is counted"
    );
    assert!(tokens < 1_000 - 10, "and keeps its tokens: {tokens}");
}
