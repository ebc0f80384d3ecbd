//! The lifecycle conformance matrix (SPEC LC-1..LC-7, DL-3..DL-7, RT, CB):
//! shape × phase × outcome ⇒ terminal state, typed error and phase, every
//! reservation and permit back, no provider work left running; plus the
//! success and failure rows. All on paused time. Prints the row count.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::script::{End, Ev, Script, Step, Work};
use common::{breaker, secs, settle};
use futures_util::StreamExt;
use parking_lot::Mutex;
use tokio::time::Instant;
use tollgate::config::{MINUTE, ScopeConfig};
use tollgate::lifecycle::{
    AttemptPolicy, CallError, CallOptions, CallReport, CircuitBreaker, CircuitState, ErrorKind,
    GiveUp, Hooks, ProviderError, Supervisor, Terminal,
};
use tollgate::{AdmissionController, Call, CallId, Deadline, Lease, Phase, ScopeId};

const ID: CallId = CallId(1);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    Invoke,
    Stream,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Deadline,
    Cancel,
    Close,
}

struct Env {
    controller: AdmissionController,
    sup: Supervisor<Script>,
    work: Arc<Work>,
    reports: Arc<Mutex<Vec<CallReport>>>,
    held: Vec<Lease>,
}

impl Env {
    fn new(
        scope: ScopeConfig,
        concurrency: Option<u64>,
        steps: Vec<Step>,
        hooks: Hooks,
        breaker: Option<CircuitBreaker>,
    ) -> Env {
        let mut b = AdmissionController::builder().scope(scope);
        if let Some(c) = concurrency {
            b = b.concurrency(c);
        }
        let controller = b.build().unwrap();
        let script = Script::new(steps);
        let work = script.work.clone();
        let reports = Arc::new(Mutex::new(Vec::new()));
        let sink = reports.clone();
        let mut sb = Supervisor::builder(controller.clone(), script)
            .policy(AttemptPolicy {
                jitter: 0.0,
                ..AttemptPolicy::default()
            })
            .without_jitter()
            .hooks(hooks)
            .observer(Arc::new(move |r: &CallReport| sink.lock().push(r.clone())));
        if let Some(b) = breaker {
            sb = sb.breaker(b);
        }
        Env {
            controller,
            sup: sb.build().unwrap(),
            work,
            reports,
            held: Vec::new(),
        }
    }

    fn simple(steps: Vec<Step>) -> Env {
        Env::new(
            ScopeConfig::new("main").requests(100, MINUTE),
            None,
            steps,
            Hooks::default(),
            None,
        )
    }

    async fn hold(&mut self) {
        let lease = self
            .controller
            .acquire(&Call::new(ScopeId::FIRST), Deadline::NONE)
            .await
            .unwrap();
        self.held.push(lease);
    }

    fn report(&self) -> CallReport {
        let reports = self.reports.lock();
        let mine: Vec<_> = reports
            .iter()
            .filter(|r| r.id == Some(ID))
            .cloned()
            .collect();
        assert_eq!(mine.len(), 1, "exactly one terminal report: {mine:?}");
        mine[0].clone()
    }

    /// No provider work left, no call owned, every reservation and permit
    /// back once the windows have passed.
    async fn assert_clean(mut self) {
        settle().await;
        assert_eq!(self.work.in_flight(), 0, "provider work left running");
        assert_eq!(self.sup.active_calls(), 0, "a call is still owned");
        self.held.clear();
        settle().await;
        // Sleeping (not `advance`) lets every timer fire at its own instant.
        tokio::time::sleep(MINUTE * 6).await;
        let s = self.controller.snapshot();
        assert_eq!(s.active, 0);
        for scope in &s.scopes {
            assert_eq!(
                (scope.queued, scope.waiting_for_slot, scope.pending),
                (0, 0, 0),
                "{s:#?}"
            );
            if !s.closed {
                for l in &scope.limits {
                    assert_eq!(
                        l.available, l.capacity as i64,
                        "{:?} not whole again",
                        l.dimension
                    );
                }
            }
        }
        for p in &s.pools {
            assert_eq!(
                (p.available, p.waiting),
                (p.limit, 0),
                "pool {} not whole",
                p.name
            );
        }
    }
}

async fn run_call(
    sup: Supervisor<Script>,
    shape: Shape,
    options: CallOptions,
) -> Result<Vec<String>, CallError> {
    match shape {
        Shape::Invoke => sup
            .invoke(&"q".to_string(), options)
            .await
            .map(|c| vec![c.response]),
        Shape::Stream => {
            let mut s = sup.stream(&"q".to_string(), options).await?;
            let mut out = Vec::new();
            while let Some(item) = s.next().await {
                out.push(item?);
            }
            Ok(out)
        }
    }
}

fn failing(status: u16, retry_after: Option<Duration>) -> ProviderError {
    ProviderError::from_status(status, "scripted").with_retry_after(retry_after)
}

/// Builds the scenario that parks a call in `phase`; returns the deadline
/// its call gets for the deadline outcome.
async fn scenario(shape: Shape, phase: Phase, outcome: Outcome) -> (Env, Duration) {
    let one = || ScopeConfig::new("main").requests(1, MINUTE);
    let many = || ScopeConfig::new("main").requests(100, MINUTE);
    let hang = match shape {
        Shape::Invoke => Step::Hang,
        Shape::Stream => Step::Stream {
            events: vec![],
            end: End::Hang,
        },
    };
    match phase {
        Phase::Queue => {
            let mut env = Env::new(one(), None, vec![], Hooks::default(), None);
            env.hold().await;
            // A head (no deadline) waits for the window; our call queues
            // behind it.
            let c = env.controller.clone();
            tokio::spawn(async move {
                drop(c.acquire(&Call::new(ScopeId::FIRST), Deadline::NONE).await)
            });
            settle().await;
            (env, secs(150))
        }
        Phase::Cooldown => {
            let env = Env::new(many(), None, vec![], Hooks::default(), None);
            env.controller.start_cooldown(ScopeId::FIRST, secs(200));
            (env, secs(50))
        }
        Phase::Rate => {
            let mut env = Env::new(one(), None, vec![], Hooks::default(), None);
            env.hold().await;
            (env, secs(30))
        }
        Phase::Concurrency => {
            let mut env = Env::new(many(), Some(1), vec![], Hooks::default(), None);
            env.hold().await;
            (env, secs(30))
        }
        Phase::Hook => {
            let hooks = Hooks {
                pre: Some(Arc::new(|_| {
                    Box::pin(async {
                        tokio::time::sleep(secs(3_600)).await;
                        Ok(())
                    })
                })),
                ..Hooks::default()
            };
            (Env::new(many(), None, vec![], hooks, None), secs(30))
        }
        Phase::RetryDelay => {
            // With the deadline outcome the hinted delay (40 s) cannot fit
            // the 30 s deadline; otherwise the call sleeps 20 s.
            let hint = if outcome == Outcome::Deadline {
                secs(40)
            } else {
                secs(20)
            };
            let steps = vec![Step::fail(failing(503, Some(hint))), hang];
            (
                Env::new(many(), None, steps, Hooks::default(), None),
                secs(30),
            )
        }
        Phase::Transport => (
            Env::new(many(), None, vec![hang], Hooks::default(), None),
            secs(30),
        ),
        _ => {
            let steps = vec![Step::chunks(&["a"], End::Hang)];
            (
                Env::new(many(), None, steps, Hooks::default(), None),
                secs(30),
            )
        }
    }
}

async fn matrix_row(shape: Shape, phase: Phase, outcome: Outcome) {
    let (mut env, deadline) = scenario(shape, phase, outcome).await;
    let options = CallOptions {
        id: Some(ID),
        deadline: if outcome == Outcome::Deadline {
            Deadline::from_timeout(Some(deadline), Instant::now())
        } else {
            Deadline::NONE
        },
        idempotent: true,
    };
    let task = tokio::spawn(run_call(env.sup.clone(), shape, options));
    settle().await;
    match phase {
        // After the first failure the call sleeps before its second attempt.
        Phase::RetryDelay if outcome != Outcome::Deadline => tokio::time::advance(secs(5)).await,
        // Queued calls whose deadline stays reachable until a long cooldown
        // starts behind their back.
        Phase::Queue if outcome == Outcome::Deadline => {
            env.controller.start_cooldown(ScopeId::FIRST, secs(200));
        }
        _ => {}
    }
    settle().await;
    let result = match outcome {
        Outcome::Deadline => Some(task.await.unwrap()),
        Outcome::Cancel => {
            assert!(
                !task.is_finished(),
                "{shape:?}/{phase:?}: the call should be waiting"
            );
            task.abort();
            let _ = task.await;
            None
        }
        Outcome::Close => {
            assert!(
                !task.is_finished(),
                "{shape:?}/{phase:?}: the call should be waiting"
            );
            let sup = env.sup.clone();
            let closing = tokio::spawn(async move { sup.close().await });
            settle().await;
            let r = task.await.unwrap();
            env.held.clear();
            closing.await.unwrap();
            Some(r)
        }
    };
    settle().await;
    let report = env.report();
    match (outcome, phase) {
        (Outcome::Deadline, Phase::RetryDelay) => {
            // RT-4: a delay that cannot fit the deadline is not slept; the
            // call fails at once with the last provider error.
            let err = result.unwrap().unwrap_err();
            assert!(
                matches!(
                    err,
                    CallError::Provider {
                        gave_up: GiveUp::Deadline,
                        attempts: 1,
                        ..
                    }
                ),
                "{err:?}"
            );
            assert_eq!(report.terminal, Terminal::Failed);
        }
        (Outcome::Deadline, _) => {
            let err = result.unwrap().unwrap_err();
            assert_eq!(err.phase(), Some(phase), "{shape:?}/{phase:?}: {err:?}");
            assert_eq!(report.terminal, Terminal::Aborted);
            assert_eq!(report.phase, Some(phase));
        }
        (Outcome::Cancel, _) => {
            assert_eq!(report.terminal, Terminal::Cancelled);
            assert_eq!(report.error, None);
        }
        (Outcome::Close, _) => {
            let err = result.unwrap().unwrap_err();
            assert_eq!(err, CallError::Closed, "{shape:?}/{phase:?}");
            assert_eq!(report.terminal, Terminal::Aborted);
        }
    }
    env.assert_clean().await;
}

// proves: LC-1, LC-5, LC-7, DL-3, DL-5, DL-6, DL-7, Q-9, RT-4, RT-6 (every
// shape × phase × outcome)
#[tokio::test(start_paused = true)]
async fn matrix_of_phases_and_outcomes() {
    let mut rows = 0;
    for shape in [Shape::Invoke, Shape::Stream] {
        for phase in Phase::ALL {
            if phase == Phase::Stream && shape == Shape::Invoke {
                continue;
            }
            for outcome in [Outcome::Deadline, Outcome::Cancel, Outcome::Close] {
                println!("row: {shape:?} × {phase} × {outcome:?}");
                matrix_row(shape, phase, outcome).await;
                rows += 1;
            }
        }
    }
    println!("conformance matrix: {rows} phase rows");
    assert_eq!(rows, 2 * 7 * 3 + 3);
}

async fn expect(env: &Env, terminal: Terminal, attempts: u32) {
    settle().await;
    let r = env.report();
    assert_eq!((r.terminal, r.attempts), (terminal, attempts), "{r:?}");
}

// proves: LC-2, Q-5 (one-shot success)
async fn one_shot_success() {
    let env = Env::simple(vec![Step::ok()]);
    let c = env
        .sup
        .invoke(
            &"q".into(),
            CallOptions {
                id: Some(ID),
                ..CallOptions::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(c.response, "reply to q");
    assert_eq!(c.settlement.unwrap().reported, Some(10));
    expect(&env, Terminal::Completed, 1).await;
    env.assert_clean().await;
}

// proves: LC-2, RT-2 (one-shot provider failure keeps its error; a 4xx is
// never retried)
async fn one_shot_failure() {
    let env = Env::simple(vec![Step::fail(failing(400, None))]);
    let err = env
        .sup
        .invoke(
            &"q".into(),
            CallOptions {
                id: Some(ID),
                ..CallOptions::default()
            },
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, CallError::Provider { gave_up: GiveUp::NotRetryable, error, .. } if error.status == Some(400))
    );
    expect(&env, Terminal::Failed, 1).await;
    env.assert_clean().await;
}

// proves: LC-3, POOL-4 (stream EOF with chunks; the lease lives as long as
// the stream)
async fn stream_eof_with_chunks() {
    let env = Env::new(
        ScopeConfig::new("main").requests(100, MINUTE),
        Some(1),
        vec![Step::chunks(&["a", "b"], End::Eof)],
        Hooks::default(),
        None,
    );
    let mut s = env
        .sup
        .stream(
            &"q".into(),
            CallOptions {
                id: Some(ID),
                ..CallOptions::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(s.next().await.unwrap().unwrap(), "a");
    assert_eq!(
        env.controller.snapshot().concurrency_available,
        Some(0),
        "permit held while streaming"
    );
    assert_eq!(s.next().await.unwrap().unwrap(), "b");
    assert!(s.next().await.is_none());
    drop(s);
    expect(&env, Terminal::Completed, 1).await;
    env.assert_clean().await;
}

// proves: LC-3 (a stream may end normally without any chunk)
async fn stream_eof_without_chunks() {
    let env = Env::simple(vec![Step::chunks(&[], End::Eof)]);
    let out = run_call(
        env.sup.clone(),
        Shape::Stream,
        CallOptions {
            id: Some(ID),
            ..CallOptions::default()
        },
    )
    .await;
    assert_eq!(out.unwrap(), Vec::<String>::new());
    expect(&env, Terminal::Completed, 1).await;
    env.assert_clean().await;
}

// proves: LC-3 (a failure after the first chunk is a typed error, never a
// normal end, never a replay)
async fn mid_stream_failure() {
    let broken = ProviderError::new(ErrorKind::StreamBroken, "connection reset");
    let env = Env::simple(vec![Step::chunks(&["a"], End::Fail(broken))]);
    let mut s = env
        .sup
        .stream(
            &"q".into(),
            CallOptions {
                id: Some(ID),
                ..CallOptions::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(s.next().await.unwrap().unwrap(), "a");
    let err = s.next().await.unwrap().unwrap_err();
    assert!(matches!(&err, CallError::Stream { error } if error.kind == ErrorKind::StreamBroken));
    assert!(s.next().await.is_none());
    drop(s);
    assert_eq!(env.work.started(), 1, "no replay");
    expect(&env, Terminal::Failed, 1).await;
    env.assert_clean().await;
}

// proves: LC-4 (a provider error chunk is delivered once, then a typed error)
async fn provider_error_chunk() {
    let declared = ProviderError::new(ErrorKind::Declared, "model overloaded");
    let env = Env::simple(vec![Step::Stream {
        events: vec![
            (Duration::ZERO, Ev::Chunk("a")),
            (Duration::ZERO, Ev::ErrorChunk("err", declared)),
        ],
        end: End::Eof,
    }]);
    let mut s = env
        .sup
        .stream(
            &"q".into(),
            CallOptions {
                id: Some(ID),
                ..CallOptions::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(s.next().await.unwrap().unwrap(), "a");
    assert_eq!(s.next().await.unwrap().unwrap(), "err");
    let err = s.next().await.unwrap().unwrap_err();
    assert!(matches!(&err, CallError::Stream { error } if error.kind == ErrorKind::Declared));
    assert!(s.next().await.is_none());
    drop(s);
    expect(&env, Terminal::Failed, 1).await;
    env.assert_clean().await;
}

// proves: RT-1, Q-8 (a retryable failure, then success after the exact
// backoff; each attempt has its own reservation)
async fn retry_then_success() {
    let env = Env::simple(vec![Step::fail(failing(503, None)), Step::ok()]);
    let t0 = Instant::now();
    let c = env
        .sup
        .invoke(
            &"q".into(),
            CallOptions {
                id: Some(ID),
                ..CallOptions::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(c.attempts, 2);
    assert_eq!(Instant::now() - t0, secs(1));
    assert_eq!(env.controller.snapshot().scopes[0].counters.admitted, 2);
    expect(&env, Terminal::Completed, 2).await;
    env.assert_clean().await;
}

// proves: RT-1, CD-4, RT-3 (retries exhausted on 429s: the call fails at
// once, without waiting out the cooldown it triggered, which keeps pausing
// its peers; hints are floors)
async fn retry_exhausted() {
    let limited = || Step::fail(failing(429, Some(secs(3))));
    let env = Env::simple(vec![limited(), limited(), limited()]);
    let t0 = Instant::now();
    let err = env
        .sup
        .invoke(
            &"q".into(),
            CallOptions {
                id: Some(ID),
                ..CallOptions::default()
            },
        )
        .await
        .unwrap_err();
    assert!(matches!(
        err,
        CallError::Provider {
            gave_up: GiveUp::Exhausted,
            attempts: 3,
            ..
        }
    ));
    assert_eq!(
        Instant::now() - t0,
        secs(6),
        "two hinted delays, no wait after the last"
    );
    assert!(
        env.controller.cooldown(ScopeId::FIRST).unwrap().1.is_some(),
        "cooldown keeps running"
    );
    expect(&env, Terminal::Failed, 3).await;
    env.assert_clean().await;
}

// proves: RT-5 (a non-idempotent call is never retried automatically)
async fn non_idempotent_no_retry() {
    let env = Env::simple(vec![Step::fail(failing(503, None))]);
    let options = CallOptions {
        id: Some(ID),
        idempotent: false,
        ..CallOptions::default()
    };
    let err = env.sup.invoke(&"q".into(), options).await.unwrap_err();
    assert!(matches!(
        err,
        CallError::Provider {
            gave_up: GiveUp::NotIdempotent,
            attempts: 1,
            ..
        }
    ));
    expect(&env, Terminal::Failed, 1).await;
    env.assert_clean().await;
}

// proves: CB-3 (an open circuit fails the call with zero transport
// attempts). With a threshold of 1 this cannot tell whether exhausted
// retries count once: tests/breaker.rs proves CB-2 with a threshold of 3.
async fn circuit_open() {
    let b = breaker();
    let env = Env::new(
        ScopeConfig::new("main").requests(100, MINUTE),
        None,
        vec![
            Step::fail(failing(500, None)),
            Step::fail(failing(500, None)),
            Step::fail(failing(500, None)),
        ],
        Hooks::default(),
        Some(b.clone()),
    );
    let _ = env
        .sup
        .invoke(&"first".into(), CallOptions::default())
        .await
        .unwrap_err();
    assert_eq!(b.state(), CircuitState::Open);
    let started = env.work.started();
    let err = env
        .sup
        .invoke(
            &"q".into(),
            CallOptions {
                id: Some(ID),
                ..CallOptions::default()
            },
        )
        .await
        .unwrap_err();
    assert!(matches!(err, CallError::CircuitOpen(_)));
    assert_eq!(env.work.started(), started, "no transport attempt");
    expect(&env, Terminal::Failed, 0).await;
    env.assert_clean().await;
}

// proves: CB-4 (a half-open stream keeps its probe until EOF; its first
// chunk does not close the circuit)
async fn half_open_stream_probe() {
    let b = breaker();
    let env = Env::new(
        ScopeConfig::new("main").requests(100, MINUTE),
        None,
        vec![
            Step::fail(failing(500, None)),
            Step::chunks(&["a", "b"], End::Eof),
        ],
        Hooks::default(),
        Some(b.clone()),
    );
    let options = CallOptions {
        idempotent: false,
        ..CallOptions::default()
    };
    let _ = env.sup.invoke(&"trip".into(), options).await.unwrap_err();
    assert_eq!(b.state(), CircuitState::Open);
    tokio::time::advance(secs(30)).await;
    let mut s = env
        .sup
        .stream(
            &"q".into(),
            CallOptions {
                id: Some(ID),
                ..CallOptions::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(s.next().await.unwrap().unwrap(), "a");
    assert_eq!(b.state(), CircuitState::HalfOpen);
    let other = env
        .sup
        .invoke(&"other".into(), CallOptions::default())
        .await
        .unwrap_err();
    assert!(
        matches!(other, CallError::CircuitOpen(_)),
        "the probe slot is taken"
    );
    assert_eq!(s.next().await.unwrap().unwrap(), "b");
    assert!(s.next().await.is_none());
    assert_eq!(b.state(), CircuitState::Closed);
    drop(s);
    expect(&env, Terminal::Completed, 1).await;
    env.assert_clean().await;
}

// proves: LC-3, RT-2 (a stream that fails before its first chunk is retried
// like a one-shot call)
async fn stream_setup_failure_is_retried() {
    let env = Env::simple(vec![
        Step::fail(failing(502, None)),
        Step::chunks(&["a"], End::Eof),
    ]);
    let out = run_call(
        env.sup.clone(),
        Shape::Stream,
        CallOptions {
            id: Some(ID),
            ..CallOptions::default()
        },
    )
    .await;
    assert_eq!(out.unwrap(), ["a"]);
    expect(&env, Terminal::Completed, 2).await;
    env.assert_clean().await;
}

// proves: DL-5 (a deadline already past fails before any provider work)
async fn past_deadline() {
    let env = Env::simple(vec![]);
    let options = CallOptions {
        id: Some(ID),
        deadline: Deadline::at(Instant::now()),
        idempotent: true,
    };
    let err = env.sup.invoke(&"q".into(), options).await.unwrap_err();
    assert_eq!(err.phase(), Some(Phase::Queue));
    assert_eq!(env.work.started(), 0);
    expect(&env, Terminal::Aborted, 0).await;
    env.assert_clean().await;
}

// proves: DL-6 (a provider enforcing the attempt's timeout, which is the
// call's remaining time, times out at the deadline: that is the deadline
// in phase transport and the call is Aborted, not a retryable timeout)
async fn provider_timeout_at_the_deadline() {
    let env = Env::simple(vec![Step::Fail {
        after: secs(2),
        error: ProviderError::new(ErrorKind::Timeout, "attempt timeout elapsed"),
    }]);
    let options = CallOptions {
        id: Some(ID),
        deadline: Deadline::from_timeout(Some(secs(2)), Instant::now()),
        idempotent: true,
    };
    let err = env.sup.invoke(&"q".into(), options).await.unwrap_err();
    assert!(
        matches!(
            err,
            CallError::Deadline {
                phase: Phase::Transport,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(env.work.started(), 1);
    expect(&env, Terminal::Aborted, 1).await;
    env.assert_clean().await;
}

/// Request units the scope's request limit has left now.
fn requests_left(env: &Env) -> i64 {
    let s = env.controller.snapshot();
    s.scopes[0]
        .limits
        .iter()
        .find(|l| l.dimension == tollgate::quota::Dimension::Requests)
        .map_or(-1, |l| l.available)
}

// proves: LC-2, Q-9 (a failing pre-hook fails the call before any provider
// work and gives its request unit back; a post-hook runs after the
// response)
async fn hooks_run_around_the_attempt() {
    let ran = Arc::new(Mutex::new(Vec::new()));
    let (pre_log, post_log) = (ran.clone(), ran.clone());
    let hooks = Hooks {
        pre: Some(Arc::new(move |ctx| {
            pre_log.lock().push(format!("pre {}", ctx.attempt));
            Box::pin(async { Ok(()) })
        })),
        post: Some(Arc::new(move |ctx| {
            post_log.lock().push(format!("post {}", ctx.attempt));
            Box::pin(async { Ok(()) })
        })),
        timeout: Some(secs(1)),
    };
    let env = Env::new(
        ScopeConfig::new("main").requests(100, MINUTE),
        None,
        vec![],
        hooks,
        None,
    );
    env.sup
        .invoke(
            &"q".into(),
            CallOptions {
                id: Some(ID),
                ..CallOptions::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(*ran.lock(), ["pre 1", "post 1"]);
    expect(&env, Terminal::Completed, 1).await;
    env.assert_clean().await;

    let refusing = Hooks {
        pre: Some(Arc::new(|_| {
            Box::pin(async { Err(tollgate::lifecycle::HookError("policy says no".into())) })
        })),
        ..Hooks::default()
    };
    let env = Env::new(
        ScopeConfig::new("main").requests(100, MINUTE),
        None,
        vec![],
        refusing,
        None,
    );
    let err = env
        .sup
        .invoke(
            &"q".into(),
            CallOptions {
                id: Some(ID),
                ..CallOptions::default()
            },
        )
        .await
        .unwrap_err();
    assert_eq!(
        err,
        CallError::Hook {
            message: "policy says no".into()
        }
    );
    assert_eq!(env.work.started(), 0, "no provider work");
    assert_eq!(requests_left(&env), 100, "nothing was sent: nothing counts");
    expect(&env, Terminal::Failed, 1).await;
    env.assert_clean().await;
}

fn sleeping_hook(d: Duration) -> tollgate::lifecycle::Hook {
    Arc::new(move |_| {
        Box::pin(async move {
            tokio::time::sleep(d).await;
            Ok(())
        })
    })
}

// proves: DL-3, DL-4, Q-9 (hooks run under the call's one deadline: a pre-
// or post-hook that outlasts it fails the call at the deadline instant
// with DeadlineExceeded{phase: hook}, although its own cap is longer; a
// pre-hook's call sent nothing and its request unit is back)
async fn hooks_run_under_the_deadline() {
    for pre in [true, false] {
        let hook = Some(sleeping_hook(secs(3_600)));
        let hooks = Hooks {
            pre: if pre { hook.clone() } else { None },
            post: if pre { None } else { hook },
            timeout: Some(secs(600)),
        };
        let env = Env::new(
            ScopeConfig::new("main").requests(100, MINUTE),
            None,
            vec![],
            hooks,
            None,
        );
        let t0 = Instant::now();
        let options = CallOptions {
            id: Some(ID),
            deadline: Deadline::from_timeout(Some(secs(2)), t0),
            idempotent: true,
        };
        let err = env.sup.invoke(&"q".into(), options).await.unwrap_err();
        assert_eq!(
            err,
            CallError::Deadline {
                phase: Phase::Hook,
                retry_at: None
            },
            "pre: {pre}"
        );
        assert_eq!(Instant::now() - t0, secs(2), "pre: {pre}");
        assert_eq!(env.work.started(), u32::from(!pre), "pre: {pre}");
        assert_eq!(requests_left(&env), 99 + i64::from(pre), "pre: {pre}");
        settle().await;
        let r = env.report();
        assert_eq!(
            (r.terminal, r.phase),
            (Terminal::Aborted, Some(Phase::Hook))
        );
        env.assert_clean().await;
    }
}

// proves: LC-1..LC-4, RT-1..RT-5, CB-3, CB-4, DL-3 (the success and
// failure rows; each row names its own rules)
#[tokio::test(start_paused = true)]
async fn success_and_failure_rows() {
    let mut rows = 0;
    macro_rules! row {
        ($f:ident) => {
            println!("row: {}", stringify!($f));
            $f().await;
            rows += 1;
        };
    }
    row!(one_shot_success);
    row!(one_shot_failure);
    row!(stream_eof_with_chunks);
    row!(stream_eof_without_chunks);
    row!(mid_stream_failure);
    row!(provider_error_chunk);
    row!(retry_then_success);
    row!(retry_exhausted);
    row!(non_idempotent_no_retry);
    row!(circuit_open);
    row!(half_open_stream_probe);
    row!(stream_setup_failure_is_retried);
    row!(past_deadline);
    row!(provider_timeout_at_the_deadline);
    row!(hooks_run_around_the_attempt);
    row!(hooks_run_under_the_deadline);
    println!("conformance matrix: {rows} success/failure rows");
}
