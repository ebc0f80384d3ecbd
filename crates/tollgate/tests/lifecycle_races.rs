//! Supervised calls: one admission for both shapes (SPEC ADM-3), races
//! between results and cancellation (LC-6), and a fresh start (LC-8). All on
//! paused time.

mod common;

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use common::script::{End, Ev, Script, Step};
use common::{secs, settle};
use futures_core::Stream;
use futures_util::StreamExt;
use parking_lot::Mutex;
use tokio::time::Instant;
use tollgate::config::{MINUTE, ScopeConfig};
use tollgate::lifecycle::{
    AttemptContext, CallError, CallOptions, CallReport, CircuitBreaker, CircuitConfig,
    CircuitState, Provider, ProviderError, Reply, StreamEvent, Supervisor, Terminal,
};
use tollgate::quota::Dimension;
use tollgate::{
    AdmissionController, Call, CallId, Deadline, EstimateError, ScopeId, TokenEstimate, Usage,
};

fn available(c: &AdmissionController, dim: Dimension) -> i64 {
    common::available(c, dim)
}

// ---------------------------------------------------------------- ADM-3

/// What the controller looked like when the provider was asked for work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Seen {
    shape: &'static str,
    at: Duration,
    active: usize,
    pending: usize,
    requests: i64,
    tokens: i64,
}

/// A provider that records the controller's state the moment it is asked
/// for a one-shot reply or a stream, then answers after 10 s.
struct Recorder {
    controller: AdmissionController,
    t0: Instant,
    seen: Mutex<Vec<Seen>>,
}

impl Recorder {
    fn record(&self, shape: &'static str) {
        let s = self.controller.snapshot();
        self.seen.lock().push(Seen {
            shape,
            at: Instant::now() - self.t0,
            active: s.active,
            pending: s.scopes[0].pending,
            requests: available(&self.controller, Dimension::Requests),
            tokens: available(&self.controller, Dimension::Tokens),
        });
    }
}

type Chunks = Pin<Box<dyn Stream<Item = Result<StreamEvent<String>, ProviderError>> + Send>>;

impl Provider for Recorder {
    type Request = String;
    type Response = String;
    type Chunk = String;
    type Stream = Chunks;

    async fn call(&self, r: &String, _: AttemptContext) -> Result<Reply<String>, ProviderError> {
        self.record("call");
        tokio::time::sleep(secs(10)).await;
        Ok(Reply::new(r.clone(), Usage::UNKNOWN))
    }

    async fn stream(&self, _: &String, _: AttemptContext) -> Result<Chunks, ProviderError> {
        self.record("stream");
        Ok(Box::pin(futures_util::stream::once(async {
            tokio::time::sleep(secs(10)).await;
            Ok(StreamEvent::Chunk("chunk".to_string()))
        })))
    }
}

// proves: ADM-3 (one-shot and streaming calls go through the same
// admission: one FIFO queue, one quota, one concurrency limit; a stream is
// fully admitted (its permit held, its request unit and tokens taken, its
// reservation leased) before the provider is asked to open it)
#[tokio::test(start_paused = true)]
async fn streams_and_one_shots_share_one_admission() {
    let t0 = Instant::now();
    let controller = AdmissionController::builder()
        .scope(
            ScopeConfig::new("main")
                .requests(2, MINUTE)
                .tokens(1_000, MINUTE),
        )
        .concurrency(1)
        .build()
        .unwrap();
    let recorder = Recorder {
        controller: controller.clone(),
        t0,
        seen: Mutex::new(Vec::new()),
    };
    let sup = Supervisor::builder(controller.clone(), recorder)
        .estimator(|_: &String| -> Result<TokenEstimate, EstimateError> {
            Ok(TokenEstimate::new(60, 40))
        })
        .build()
        .unwrap();

    // A one-shot call takes the only permit for 10 s.
    let s = sup.clone();
    let first = tokio::spawn(async move { s.invoke(&"a".into(), CallOptions::default()).await });
    settle().await;
    // A stream: its quota is reserved, it waits for the permit, and the
    // provider has not been asked for anything.
    let s = sup.clone();
    let stream = tokio::spawn(async move {
        let mut st = s.stream(&"b".into(), CallOptions::default()).await?;
        let admission = *st.admission();
        let mut chunks = Vec::new();
        while let Some(c) = st.next().await {
            chunks.push(c?);
        }
        Ok::<_, CallError>((admission, chunks))
    });
    settle().await;
    let snap = controller.snapshot();
    assert_eq!(snap.scopes[0].pending, 1, "the stream waits for the permit");
    assert_eq!(sup.provider().seen.lock().len(), 1, "no provider work yet");
    // A third call (one-shot) finds the request limit spent: it queues in
    // the same FIFO queue.
    let s = sup.clone();
    let third = tokio::spawn(async move { s.invoke(&"c".into(), CallOptions::default()).await });
    settle().await;
    assert_eq!(controller.snapshot().scopes[0].queued, 1);

    let first = first.await.unwrap().unwrap();
    let (admission, chunks) = stream.await.unwrap().unwrap();
    let third = third.await.unwrap().unwrap();
    assert_eq!(chunks, ["chunk"]);
    assert_eq!(first.admission.total_wait(), Duration::ZERO);
    assert_eq!(admission.concurrency_wait, secs(10));
    assert!(admission.concurrency);
    // The first one-shot answer took 10 s, so the provider may have counted
    // its request up to the arrival floor (500 ms) after it was sent: its
    // unit stays counted until then plus one window (SPEC Q-15).
    assert_eq!(
        third.admission.quota_wait,
        secs(60) + Duration::from_millis(500)
    );
    assert!(third.admission.limited_by.requests);

    let at = |shape, millis: u64, requests, tokens| Seen {
        shape,
        at: Duration::from_millis(millis),
        active: 1,
        pending: 0,
        requests,
        tokens,
    };
    assert_eq!(
        *sup.provider().seen.lock(),
        [
            at("call", 0, 1, 900),
            // Opened at 10 s, once the one-shot call gave its permit back:
            // its own lease holds the permit and both quota dimensions.
            at("stream", 10_000, 0, 800),
            // The first request unit ages out at 60.5 s (Q-15, above).
            at("call", 60_500, 0, 800),
        ]
    );
}

// ---------------------------------------------------------------- LC-6

struct Env {
    controller: AdmissionController,
    sup: Supervisor<Script>,
    reports: Arc<Mutex<Vec<CallReport>>>,
}

fn env(steps: Vec<Step>) -> Env {
    let controller = AdmissionController::builder()
        .scope(
            ScopeConfig::new("main")
                .requests(100, MINUTE)
                .tokens(10_000, MINUTE),
        )
        .build()
        .unwrap();
    let reports = Arc::new(Mutex::new(Vec::new()));
    let sink = reports.clone();
    let sup = Supervisor::builder(controller.clone(), Script::new(steps))
        .estimator(|_: &String| -> Result<TokenEstimate, EstimateError> {
            Ok(TokenEstimate::new(100, 0))
        })
        .without_jitter()
        .observer(Arc::new(move |r: &CallReport| sink.lock().push(r.clone())))
        .build()
        .unwrap();
    Env {
        controller,
        sup,
        reports,
    }
}

impl Env {
    fn terminals(&self) -> Vec<Terminal> {
        self.reports.lock().iter().map(|r| r.terminal).collect()
    }

    fn tokens_reported(&self) -> u64 {
        self.controller.snapshot().scopes[0]
            .counters
            .tokens_reported
    }
}

fn with_id(id: u64) -> CallOptions {
    CallOptions {
        id: Some(CallId(id)),
        ..CallOptions::default()
    }
}

// proves: LC-6 (a terminal result that is ready when a close arrives at the
// same instant stays: the one-shot reply and the stream's last chunk and
// normal end win over the close; dropping the finished stream later does
// not turn it into a cancellation)
#[tokio::test(start_paused = true)]
async fn a_result_before_cancellation_stays() {
    // The close's timer is registered before or after the calls' timers, so
    // that both wake-up orders of that same instant are run.
    for close_first in [true, false] {
        let e = env(vec![
            Step::Reply {
                after: secs(10),
                usage: Usage::known(30),
            },
            Step::Stream {
                events: vec![
                    (Duration::ZERO, Ev::Usage(40)),
                    (Duration::ZERO, Ev::Chunk("a")),
                    (secs(10), Ev::Chunk("b")),
                ],
                end: End::Eof,
            },
        ]);
        // Both results become ready at 10 s; the close comes at 10 s.
        let s = e.sup.clone();
        let close_at_10 = move || {
            tokio::spawn(async move {
                tokio::time::sleep(secs(10)).await;
                s.close().await;
            })
        };
        let close_a = close_first.then(close_at_10.clone());
        let s = e.sup.clone();
        let call = tokio::spawn(async move { s.invoke(&"q".into(), with_id(1)).await });
        let s = e.sup.clone();
        let stream = tokio::spawn(async move {
            let mut st = s.stream(&"q".into(), with_id(2)).await?;
            let mut out = Vec::new();
            while let Some(c) = st.next().await {
                out.push(c?);
            }
            // The finished stream is dropped after its end.
            drop(st);
            Ok::<_, CallError>(out)
        });
        settle().await;
        let close_b = (!close_first).then(close_at_10);
        let reply = call.await.unwrap();
        assert_eq!(
            reply.unwrap().response,
            "reply to q",
            "close first: {close_first}"
        );
        let chunks = stream.await.unwrap();
        assert_eq!(chunks.unwrap(), ["a", "b"], "close first: {close_first}");
        close_a.or(close_b).unwrap().await.unwrap();
        assert_eq!(e.terminals(), [Terminal::Completed, Terminal::Completed]);
        assert_eq!(e.tokens_reported(), 70, "both results were settled");
    }
}

// proves: LC-6 (a cancellation observed first wins: the call ends
// Cancelled, or Aborted by a close, the provider's work is dropped, and its
// late result is discarded: no second terminal state, no late settlement)
#[tokio::test(start_paused = true)]
async fn a_cancellation_observed_first_wins() {
    let slow_reply = || Step::Reply {
        after: secs(10),
        usage: Usage::known(30),
    };
    let slow_stream = || Step::Stream {
        events: vec![
            (Duration::ZERO, Ev::Chunk("a")),
            (secs(10), Ev::Usage(40)),
            (Duration::ZERO, Ev::Chunk("b")),
        ],
        end: End::Eof,
    };
    // Dropped by the caller at 5 s.
    let e = env(vec![slow_reply(), slow_stream()]);
    let s = e.sup.clone();
    let call = tokio::spawn(async move { s.invoke(&"q".into(), with_id(1)).await });
    let s = e.sup.clone();
    let stream = tokio::spawn(async move {
        let mut st = s.stream(&"q".into(), with_id(2)).await.unwrap();
        let first = st.next().await;
        assert_eq!(first.unwrap().unwrap(), "a");
        std::future::pending::<()>().await;
    });
    tokio::time::sleep(secs(5)).await;
    call.abort();
    stream.abort();
    let _ = (call.await, stream.await);
    settle().await;
    assert_eq!(e.terminals(), [Terminal::Cancelled, Terminal::Cancelled]);
    let work = &e.sup.provider().work;
    assert_eq!((work.dropped(), work.in_flight()), (2, 0));
    // Long after the provider would have answered: nothing changes.
    tokio::time::sleep(secs(30)).await;
    assert_eq!(e.terminals(), [Terminal::Cancelled, Terminal::Cancelled]);
    assert_eq!(e.tokens_reported(), 0, "the late usage is never settled");
    assert!(e.controller.snapshot().is_idle());

    // Closed at 5 s.
    let e = env(vec![slow_reply(), slow_stream()]);
    let s = e.sup.clone();
    let call = tokio::spawn(async move { s.invoke(&"q".into(), with_id(1)).await });
    let s = e.sup.clone();
    let stream = tokio::spawn(async move {
        let mut st = s.stream(&"q".into(), with_id(2)).await?;
        let mut out = Vec::new();
        while let Some(c) = st.next().await {
            out.push(c?);
        }
        Ok::<_, CallError>(out)
    });
    tokio::time::sleep(secs(5)).await;
    e.sup.close().await;
    assert_eq!(call.await.unwrap().unwrap_err(), CallError::Closed);
    assert_eq!(stream.await.unwrap().unwrap_err(), CallError::Closed);
    assert_eq!(e.terminals(), [Terminal::Aborted, Terminal::Aborted]);
    tokio::time::sleep(secs(30)).await;
    assert_eq!(e.terminals(), [Terminal::Aborted, Terminal::Aborted]);
    assert_eq!(e.tokens_reported(), 0);
    let work = &e.sup.provider().work;
    assert_eq!((work.dropped(), work.in_flight()), (2, 0));
}

// ---------------------------------------------------------------- LC-8

fn estimate(_: &String) -> Result<TokenEstimate, EstimateError> {
    Ok(TokenEstimate::new(100, 0))
}

// proves: LC-8 (restart begins empty: a controller, supervisor and breaker
// built from the same configuration as a busy, cooled-down, closed one
// start with every limit whole, nothing queued or active, no cooldown, zero
// counters, a closed circuit, and every call id free)
#[tokio::test(start_paused = true)]
async fn a_new_controller_and_supervisor_begin_empty() {
    let scope = || {
        ScopeConfig::new("main")
            .requests(3, MINUTE)
            .tokens(1_000, MINUTE)
    };
    let build = || {
        AdmissionController::builder()
            .scope(scope())
            .concurrency(2)
            .build()
            .unwrap()
    };
    let circuit = CircuitConfig {
        failure_threshold: 1,
        ..CircuitConfig::default()
    };
    // The old process: quota spent, a permit held, a call queued, a
    // cooldown running, the circuit open, then closed down.
    let old = build();
    let old_breaker = CircuitBreaker::new(circuit).unwrap();
    let old_sup = Supervisor::builder(
        old.clone(),
        Script::new(vec![Step::fail(ProviderError::from_status(500, "down"))]),
    )
    .breaker(old_breaker.clone())
    .estimator(estimate)
    .policy(tollgate::lifecycle::AttemptPolicy {
        max_attempts: 1,
        ..Default::default()
    })
    .build()
    .unwrap();
    let _ = old_sup
        .invoke(&"q".into(), CallOptions::default())
        .await
        .unwrap_err();
    assert_eq!(old_breaker.state(), CircuitState::Open);
    let id = CallId(42);
    let call = |t| {
        Call::new(ScopeId::FIRST)
            .with_estimate(TokenEstimate::new(t, 0))
            .with_id(id)
    };
    let held = old.acquire(&call(500), Deadline::NONE).await.unwrap();
    held.rate_limited(Some(secs(30)));
    let o = old.clone();
    let queued = tokio::spawn(async move {
        o.acquire(&Call::new(ScopeId::FIRST).with_tokens(1), Deadline::NONE)
            .await
    });
    settle().await;
    let s = old.snapshot();
    assert_eq!((s.active, s.scopes[0].queued), (1, 1));
    assert!(s.scopes[0].cooldown_remaining.is_some());

    // The new process, while the old one is still busy...
    let new = build();
    let new_breaker = CircuitBreaker::new(circuit).unwrap();
    let new_sup = Supervisor::builder(new.clone(), Script::new(vec![]))
        .breaker(new_breaker.clone())
        .estimator(estimate)
        .build()
        .unwrap();
    let fresh = |c: &AdmissionController| {
        let s = c.snapshot();
        assert!(!s.closed);
        assert!(s.is_idle(), "{s:#?}");
        assert_eq!(s.active, 0);
        assert_eq!(s.concurrency_available, Some(2));
        let sc = &s.scopes[0];
        assert_eq!((sc.queued, sc.pending), (0, 0));
        assert_eq!((sc.cooldown_generation, sc.cooldown_remaining), (0, None));
        for l in &sc.limits {
            assert_eq!(l.available, l.capacity as i64, "{:?}", l.dimension);
        }
        assert_eq!(sc.counters, Default::default());
    };
    fresh(&new);
    assert_eq!(new_breaker.state(), CircuitState::Closed);
    assert_eq!(new_sup.active_calls(), 0);
    // ...and after it closed.
    drop(held);
    old.close().await;
    let _ = queued.await;
    fresh(&new);
    // The old process's id means nothing here, and calls run at once.
    let lease = new.acquire(&call(500), Deadline::NONE).await.unwrap();
    assert_eq!(lease.admission().total_wait(), Duration::ZERO);
    drop(lease);
    let done = new_sup
        .invoke(&"q".into(), CallOptions::default())
        .await
        .unwrap();
    assert_eq!(done.attempts, 1);
}
