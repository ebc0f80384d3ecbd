//! The library surface (the tower layer and the Supervisor) used the way a
//! hostile or careless caller would: futures dropped at every await point,
//! clones from many threads, a panicking inner service or observer, close
//! with calls in flight, and errors that must not open the circuit. After
//! each, nothing is in flight and the whole budget comes back. The tower
//! tests need the `tower` feature (on in a workspace run).
#![cfg_attr(not(feature = "tower"), allow(dead_code, unused_imports))]

mod common;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use common::script::{Script, Step};
use common::{assert_idle, available as avail, breaker, ms, secs};
use tollgate::config::{MINUTE, ScopeConfig};
use tollgate::lifecycle::{
    AttemptPolicy, CallError, CallOptions, CallReport, CircuitState, ErrorKind, ProviderError,
    Supervisor,
};
use tollgate::quota::Dimension;
#[cfg(feature = "tower")]
use tollgate::tower::TollgateLayer;
use tollgate::{AdmissionController, Deadline, TokenEstimate};
#[cfg(feature = "tower")]
use tower::{Layer, Service, ServiceExt};

/// Polls the inner future at most `n` times, then drops it.
struct DropAfter<F> {
    inner: Option<Pin<Box<F>>>,
    left: usize,
}

impl<F: Future> Future for DropAfter<F> {
    type Output = Option<F::Output>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if self.left == 0 {
            self.inner = None;
            return Poll::Ready(None);
        }
        self.left -= 1;
        let Some(f) = self.inner.as_mut() else {
            return Poll::Ready(None);
        };
        match f.as_mut().poll(cx) {
            Poll::Ready(v) => {
                self.inner = None;
                Poll::Ready(Some(v))
            }
            Poll::Pending => {
                if self.left == 0 {
                    cx.waker().wake_by_ref();
                }
                Poll::Pending
            }
        }
    }
}

fn drop_after<F: Future>(f: F, n: usize) -> DropAfter<F> {
    DropAfter {
        inner: Some(Box::pin(f)),
        left: n,
    }
}

#[derive(Debug)]
enum Fail {
    Server,
    Limited,
    Client,
}

fn classify(e: &Fail) -> ProviderError {
    match e {
        Fail::Server => ProviderError::from_status(500, "server"),
        Fail::Limited => ProviderError::from_status(429, "limited").with_retry_after(Some(secs(2))),
        Fail::Client => ProviderError::from_status(400, "client"),
    }
}

// proves: LC-1, Q-9 (every permit and reservation back)
// Drop the tower future at every await point of a call that waits for
// concurrency, fails with a 5xx, gets a 429 (cooldown), then succeeds.
#[cfg(feature = "tower")]
#[tokio::test(start_paused = true)]
async fn tower_drop_at_every_await_point() {
    for n in 0..60 {
        let c = AdmissionController::builder()
            .scope(
                ScopeConfig::new("svc")
                    .requests(10, MINUTE)
                    .tokens(1000, MINUTE),
            )
            .concurrency(1)
            .build()
            .unwrap();
        let calls = Arc::new(AtomicU32::new(0));
        let seen = calls.clone();
        let inner = tower::service_fn(move |x: u32| {
            let k = seen.fetch_add(1, Ordering::SeqCst);
            async move {
                match k {
                    0 => {
                        tokio::time::sleep(ms(100)).await;
                        Err(Fail::Server)
                    }
                    1 => Err(Fail::Limited),
                    _ => {
                        tokio::time::sleep(secs(1)).await;
                        Ok(x)
                    }
                }
            }
        });
        let mut svc = TollgateLayer::new(c.clone(), classify)
            .policy(AttemptPolicy {
                max_attempts: 4,
                jitter: 0.0,
                ..AttemptPolicy::default()
            })
            .unwrap()
            .estimator(|_: &u32| Ok(TokenEstimate::new(10, 90)))
            .timeout(secs(300))
            .layer(inner);
        // A holder makes the first attempt wait for concurrency.
        let holder = c
            .acquire(
                &tollgate::Call::new(tollgate::ScopeId::FIRST)
                    .with_estimate(TokenEstimate::new(1, 0)),
                Deadline::NONE,
            )
            .await
            .unwrap();
        let h = tokio::spawn(async move {
            tokio::time::sleep(ms(50)).await;
            drop(holder);
        });
        let fut = svc.ready().await.unwrap().call(7);
        let out = drop_after(fut, n).await;
        h.await.unwrap();
        assert_idle(&c);
        tokio::time::sleep(secs(200)).await;
        assert_idle(&c);
        assert_eq!(avail(&c, Dimension::Requests), 10, "n={n}");
        assert_eq!(avail(&c, Dimension::Tokens), 1000, "n={n}");
        // Reuse after the drop.
        let again = svc.ready().await.unwrap().call(3).await;
        assert!(again.is_ok(), "n={n}: {again:?}");
        if let Some(r) = out {
            assert_eq!(r.unwrap(), 7);
            break;
        }
    }
}

// proves: LC-1 (a panicking inner service returns its permit)
// A panicking inner service: the panic propagates to the caller's task, the
// permit comes back and the service stays usable.
#[cfg(feature = "tower")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tower_panicking_inner_returns_permit() {
    let c = AdmissionController::builder()
        .scope(ScopeConfig::new("svc").requests(1000, MINUTE))
        .concurrency(2)
        .build()
        .unwrap();
    let inner = tower::service_fn(|x: u32| async move {
        if x.is_multiple_of(2) {
            panic!("boom");
        }
        Ok::<_, Fail>(x)
    });
    let svc = TollgateLayer::new(c.clone(), classify).layer(inner);
    let mut tasks = Vec::new();
    for i in 0..200u32 {
        let mut s = svc.clone();
        tasks.push(tokio::spawn(async move {
            s.ready().await.unwrap().call(i).await
        }));
    }
    let mut panics = 0;
    for t in tasks {
        match t.await {
            Ok(r) => {
                r.unwrap();
            }
            Err(e) => {
                assert!(e.is_panic());
                panics += 1;
            }
        }
    }
    assert_eq!(panics, 100);
    assert_idle(&c);
}

// proves: LC-7 (close resolves with calls in flight), Q-13
// Many clones on a multi-threaded runtime, some dropped mid-flight, some
// failing with client errors; close while calls are in flight resolves.
#[cfg(feature = "tower")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tower_close_with_calls_in_flight() {
    let c = AdmissionController::builder()
        .scope(ScopeConfig::new("svc").requests(100_000, MINUTE))
        .concurrency(4)
        .build()
        .unwrap();
    let inner = tower::service_fn(|x: u32| async move {
        match x % 4 {
            0 => std::future::pending().await,
            1 => Err(Fail::Client),
            _ => {
                tokio::time::sleep(ms(5)).await;
                Ok(x)
            }
        }
    });
    let svc = TollgateLayer::new(c.clone(), classify)
        .policy(AttemptPolicy {
            base_delay: ms(1),
            max_delay: ms(10),
            ..AttemptPolicy::default()
        })
        .unwrap()
        .layer(inner);
    let mut tasks = Vec::new();
    for i in 0..400u32 {
        let mut s = svc.clone();
        tasks.push(tokio::spawn(async move {
            let f = s.call(i);
            if i % 7 == 0 {
                let _ = tokio::time::timeout(ms(3), f).await;
                return;
            }
            let _ = f.await;
        }));
    }
    tokio::time::sleep(ms(50)).await;
    let closed = tokio::time::timeout(secs(10), c.close()).await;
    assert!(closed.is_ok(), "close hung: {:#?}", c.snapshot());
    for t in tasks {
        tokio::time::timeout(secs(10), t)
            .await
            .expect("task hung")
            .unwrap();
    }
    assert_idle(&c);
}

// proves: LC-1, LC-7 (a panicking observer still lets its call leave the
// supervisor's ownership: close resolves). Found in review, where the first
// version skipped the call's exit when the observer panicked and close
// waited for ever.
#[tokio::test(start_paused = true)]
async fn a_panicking_observer_lets_close_resolve() {
    let c = AdmissionController::builder()
        .scope(ScopeConfig::new("svc").requests(10, MINUTE))
        .build()
        .unwrap();
    let sup = Supervisor::builder(c.clone(), Script::new(vec![Step::ok()]))
        .observer(Arc::new(|_: &CallReport| panic!("observer boom")))
        .build()
        .unwrap();
    let s2 = sup.clone();
    let r = tokio::spawn(async move {
        let _ = s2.invoke(&"x".to_string(), CallOptions::default()).await;
    })
    .await;
    assert!(r.is_err());
    // The lease itself came back...
    assert_idle(&c);
    // ...but the supervisor still owns the call, so close never resolves.
    let closed = tokio::time::timeout(secs(60), sup.close()).await;
    assert!(
        closed.is_ok(),
        "Supervisor::close hangs: active_calls = {}",
        sup.active_calls()
    );
}

// proves: CB-1 (only the provider's failures count toward the circuit)
// Client errors, 429s, quota waits, cancellations, zero deadlines must not
// open the circuit.
#[tokio::test(start_paused = true)]
async fn breaker_only_opens_on_provider_failures() {
    let c = AdmissionController::builder()
        .scope(ScopeConfig::new("svc").requests(3, MINUTE))
        .concurrency(1)
        .build()
        .unwrap();
    let b = breaker();
    let steps = vec![
        Step::fail(ProviderError::from_status(400, "bad")),
        Step::fail(ProviderError::from_status(429, "lim").with_retry_after(Some(secs(500)))),
        Step::Hang,
    ];
    let sup = Supervisor::builder(c.clone(), Script::new(steps))
        .breaker(b.clone())
        .without_jitter()
        .build()
        .unwrap();
    let r = "x".to_string();
    assert!(sup.invoke(&r, CallOptions::default()).await.is_err());
    assert_eq!(b.state(), CircuitState::Closed, "400");
    assert!(sup.invoke(&r, CallOptions::default()).await.is_err());
    assert_eq!(b.state(), CircuitState::Closed, "429");
    // Hang, cancelled by drop.
    let _ = tokio::time::timeout(secs(1), sup.invoke(&r, CallOptions::default())).await;
    assert_eq!(b.state(), CircuitState::Closed, "cancel");
    // Quota spent: deadline in rate phase.
    let e = sup
        .invoke(&r, CallOptions::deadline(Deadline::after(secs(1))))
        .await
        .unwrap_err();
    assert!(matches!(e, CallError::Deadline { .. }), "{e:?}");
    assert_eq!(b.state(), CircuitState::Closed, "quota wait");
    let e = sup
        .invoke(&r, CallOptions::deadline(Deadline::after(Duration::ZERO)))
        .await
        .unwrap_err();
    assert!(matches!(e, CallError::Deadline { .. }), "{e:?}");
    assert_eq!(b.state(), CircuitState::Closed, "zero deadline");
    let _ = ErrorKind::Server;
    tokio::time::sleep(secs(600)).await;
    assert_idle(&c);
}

// proves: LC-1, LC-3 (a stream dropped at any poll leaves nothing held and
// is never replayed)
// Drop a supervised stream (open future, then the stream) at every poll.
#[tokio::test(start_paused = true)]
async fn stream_drop_at_every_poll() {
    use common::script::{End, Ev};
    use futures_util::StreamExt;
    for n in 0..30 {
        let c = AdmissionController::builder()
            .scope(ScopeConfig::new("svc").requests(10, MINUTE))
            .concurrency(1)
            .build()
            .unwrap();
        let steps = vec![
            Step::fail(ProviderError::from_status(503, "x")),
            Step::Stream {
                events: vec![(ms(10), Ev::Chunk("a")), (ms(10), Ev::Chunk("b"))],
                end: End::Eof,
            },
        ];
        let sup = Supervisor::builder(c.clone(), Script::new(steps))
            .breaker(breaker())
            .without_jitter()
            .build()
            .unwrap();
        let r = "x".to_string();
        let sup2 = sup.clone();
        let fut = async move {
            let mut s = sup2
                .stream(&r, CallOptions::deadline(Deadline::after(secs(30))))
                .await?;
            let mut v = Vec::new();
            while let Some(x) = s.next().await {
                v.push(x?);
            }
            Ok::<_, CallError>(v)
        };
        let out = drop_after(fut, n).await;
        assert_idle(&c);
        assert_eq!(sup.active_calls(), 0);
        // 503 counts once as a failure only if the call ends failing.
        tokio::time::sleep(secs(120)).await;
        assert_eq!(avail(&c, Dimension::Requests), 10, "n={n}");
        if let Some(r) = out {
            assert_eq!(r.unwrap(), vec!["a".to_string(), "b".to_string()]);
            assert_eq!(sup.breaker().unwrap().state(), CircuitState::Closed);
            break;
        }
        assert_eq!(
            sup.breaker().unwrap().state(),
            CircuitState::Closed,
            "n={n}"
        );
    }
}
