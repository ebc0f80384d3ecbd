//! The circuit breaker through the supervisor (SPEC CB-1, CB-2, GW-16):
//! who may open a provider's circuit, and which late outcomes count. All on
//! paused time.

mod common;

use std::time::Duration;

use common::script::{End, Script, Step};
use common::{secs, settle};
use futures_util::StreamExt;
use tokio::time::Instant;
use tollgate::config::{MINUTE, ScopeConfig};
use tollgate::lifecycle::{
    AttemptPolicy, CallError, CallOptions, CircuitBreaker, CircuitConfig, CircuitState, ErrorKind,
    ProviderError, Supervisor,
};
use tollgate::{AdmissionController, Deadline, Phase};

fn breaker(failure_threshold: u32, half_open_calls: u32) -> CircuitBreaker {
    CircuitBreaker::new(CircuitConfig {
        failure_threshold,
        recovery_time: secs(30),
        half_open_calls,
    })
    .unwrap()
}

fn supervisor(
    steps: Vec<Step>,
    breaker: &CircuitBreaker,
    max_attempts: u32,
    transport_timeout: Option<Duration>,
) -> Supervisor<Script> {
    let controller = AdmissionController::builder()
        .scope(ScopeConfig::new("main").requests(1_000, MINUTE))
        .build()
        .unwrap();
    let mut b = Supervisor::builder(controller, Script::new(steps))
        .policy(AttemptPolicy {
            max_attempts,
            jitter: 0.0,
            ..AttemptPolicy::default()
        })
        .without_jitter()
        .breaker(breaker.clone());
    if let Some(t) = transport_timeout {
        b = b.transport_timeout(t);
    }
    b.build().unwrap()
}

fn server_error() -> Step {
    Step::fail(ProviderError::from_status(500, "scripted"))
}

fn within(d: Duration) -> CallOptions {
    CallOptions::deadline(Deadline::from_timeout(Some(d), Instant::now()))
}

fn is_deadline(result: &Result<impl std::fmt::Debug, CallError>, phase: Phase) -> bool {
    matches!(result, Err(CallError::Deadline { phase: p, .. }) if *p == phase)
}

// proves: CB-2, GW-16 (calls that run out of their own, caller-chosen
// deadline while the provider works, in transport and in stream phase, never
// open the circuit, however many there are)
#[tokio::test(start_paused = true)]
async fn caller_deadlines_never_open_the_circuit() {
    const N: usize = 6;
    let b = breaker(2, 1);
    let hanging_stream = || Step::Stream {
        events: vec![],
        end: End::Hang,
    };
    let steps = (0..N)
        .flat_map(|_| {
            [
                Step::Hang,
                hanging_stream(),
                Step::chunks(&["a"], End::Hang),
            ]
        })
        .collect();
    let sup = supervisor(steps, &b, 3, None);
    for _ in 0..N {
        // A one-shot attempt that outlives its 1 ms deadline.
        let r = sup
            .invoke(&"q".into(), within(Duration::from_millis(1)))
            .await;
        assert!(is_deadline(&r, Phase::Transport), "{r:?}");
        // A stream that never sends its first chunk: still transport.
        let r = sup.stream(&"q".into(), within(secs(1))).await;
        assert!(is_deadline(&r, Phase::Transport), "{r:?}");
        // A stream that stalls after its first chunk.
        let mut s = sup.stream(&"q".into(), within(secs(1))).await.unwrap();
        assert_eq!(s.next().await.unwrap().unwrap(), "a");
        let r = s.next().await.unwrap();
        assert!(is_deadline(&r, Phase::Stream), "{r:?}");
        assert!(s.next().await.is_none());
        assert_eq!(b.state(), CircuitState::Closed);
    }
    assert_eq!(sup.provider().work.started() as usize, 3 * N);
    // Anyone's ordinary call is still served.
    let ok = sup.invoke(&"q".into(), CallOptions::default()).await;
    assert!(ok.is_ok(), "{ok:?}");
    assert_eq!(b.state(), CircuitState::Closed);
}

// proves: CB-2, GW-16 (by contrast, the provider running past the
// supervisor's own attempt timeout is the provider's failure: exhausted
// retries of it count once each and open the circuit at the threshold)
#[tokio::test(start_paused = true)]
async fn the_providers_own_attempt_timeouts_do_count() {
    let b = breaker(2, 1);
    let sup = supervisor(vec![Step::Hang; 4], &b, 2, Some(secs(1)));
    let first = sup.invoke(&"q".into(), within(secs(60))).await;
    assert!(
        matches!(&first, Err(CallError::Provider { error, attempts: 2, .. }) if error.kind == ErrorKind::Timeout),
        "{first:?}"
    );
    assert_eq!(b.state(), CircuitState::Closed, "one logical failure");
    let _ = sup.invoke(&"q".into(), within(secs(60))).await.unwrap_err();
    assert_eq!(b.state(), CircuitState::Open);
}

// proves: CB-1, CB-2 (with a threshold of 3 the unit is the logical call:
// a call that exhausts 3 attempts counts once; two failed calls and a
// success reset the count; three consecutive failed calls open)
#[tokio::test(start_paused = true)]
async fn threshold_three_counts_logical_calls() {
    let b = breaker(3, 1);
    let failed_call = || [server_error(), server_error(), server_error()];
    let mut steps = Vec::new();
    steps.extend(failed_call());
    steps.extend(failed_call());
    steps.push(Step::ok());
    for _ in 0..3 {
        steps.extend(failed_call());
    }
    let sup = supervisor(steps, &b, 3, None);
    for _ in 0..2 {
        let err = sup.invoke(&"q".into(), CallOptions::default()).await;
        assert!(
            matches!(err, Err(CallError::Provider { attempts: 3, .. })),
            "{err:?}"
        );
        assert_eq!(b.state(), CircuitState::Closed);
    }
    sup.invoke(&"q".into(), CallOptions::default())
        .await
        .unwrap();
    for _ in 0..2 {
        let _ = sup
            .invoke(&"q".into(), CallOptions::default())
            .await
            .unwrap_err();
        assert_eq!(b.state(), CircuitState::Closed, "the success reset it");
    }
    let _ = sup
        .invoke(&"q".into(), CallOptions::default())
        .await
        .unwrap_err();
    assert_eq!(b.state(), CircuitState::Open);
    assert_eq!(sup.provider().work.started(), 16);
    let err = sup.invoke(&"q".into(), CallOptions::default()).await;
    assert!(matches!(err, Err(CallError::CircuitOpen(_))), "{err:?}");
}

// proves: CB-2 (a late success of a call admitted while the circuit was
// closed, reported after it opened, leaves it open: for a one-shot reply
// and for a stream's normal end)
#[tokio::test(start_paused = true)]
async fn a_late_success_does_not_close_an_open_circuit() {
    let b = breaker(1, 1);
    let slow_stream = Step::Stream {
        events: vec![(secs(10), common::script::Ev::Chunk("late"))],
        end: End::Eof,
    };
    let steps = vec![
        Step::Reply {
            after: secs(10),
            usage: tollgate::Usage::known(1),
        },
        slow_stream,
        server_error(),
    ];
    let sup = supervisor(steps, &b, 1, None);
    let (s1, s2) = (sup.clone(), sup.clone());
    let late_reply =
        tokio::spawn(async move { s1.invoke(&"q".into(), CallOptions::default()).await });
    settle().await;
    let late_stream = tokio::spawn(async move {
        let mut s = s2.stream(&"q".into(), CallOptions::default()).await?;
        let mut out = Vec::new();
        while let Some(c) = s.next().await {
            out.push(c?);
        }
        Ok::<_, CallError>(out)
    });
    settle().await;
    assert_eq!(sup.provider().work.started(), 2);
    let _ = sup
        .invoke(&"q".into(), CallOptions::default())
        .await
        .unwrap_err();
    assert_eq!(b.state(), CircuitState::Open);
    tokio::time::advance(secs(10)).await;
    late_reply.await.unwrap().unwrap();
    assert_eq!(late_stream.await.unwrap().unwrap(), ["late"]);
    assert_eq!(b.state(), CircuitState::Open, "late successes are stale");
    let err = sup.invoke(&"q".into(), CallOptions::default()).await;
    assert!(matches!(err, Err(CallError::CircuitOpen(_))), "{err:?}");
}

// proves: CB-2 (a probe of an earlier half-open period that succeeds late
// cannot close a newer half-open period; that period's own probe does)
#[tokio::test(start_paused = true)]
async fn a_stale_half_open_probe_cannot_close_a_newer_period() {
    let b = breaker(1, 2);
    let steps = vec![
        server_error(),
        // First half-open period: a slow success and a quick failure.
        Step::Reply {
            after: secs(60),
            usage: tollgate::Usage::known(1),
        },
        server_error(),
        // Second half-open period: a slower success.
        Step::Reply {
            after: secs(100),
            usage: tollgate::Usage::known(1),
        },
    ];
    let sup = supervisor(steps, &b, 1, None);
    let t0 = Instant::now();
    let _ = sup
        .invoke(&"trip".into(), CallOptions::default())
        .await
        .unwrap_err();
    assert_eq!(b.state(), CircuitState::Open);
    tokio::time::advance(secs(30)).await;
    let s = sup.clone();
    let stale = tokio::spawn(async move { s.invoke(&"p1".into(), CallOptions::default()).await });
    settle().await;
    let _ = sup
        .invoke(&"p2".into(), CallOptions::default())
        .await
        .unwrap_err();
    assert_eq!(b.state(), CircuitState::Open, "the quick probe reopened it");
    tokio::time::advance(secs(30)).await;
    let s = sup.clone();
    let current = tokio::spawn(async move { s.invoke(&"p3".into(), CallOptions::default()).await });
    settle().await;
    assert_eq!(b.state(), CircuitState::HalfOpen);
    // The first period's probe succeeds at t = 90 s.
    tokio::time::advance(secs(30)).await;
    stale.await.unwrap().unwrap();
    assert_eq!(Instant::now() - t0, secs(90));
    assert_eq!(
        b.state(),
        CircuitState::HalfOpen,
        "the stale success is ignored"
    );
    // The current period's probe succeeds at t = 160 s and closes it.
    tokio::time::advance(secs(70)).await;
    current.await.unwrap().unwrap();
    assert_eq!(b.state(), CircuitState::Closed);
}
