//! The tower layer runs any service through the same lifecycle (SPEC DL-1,
//! RT-1, ADM-1).
#![cfg(feature = "tower")]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use common::secs;
use tokio::time::Instant;
use tollgate::AdmissionController;
use tollgate::config::{MINUTE, ScopeConfig};
use tollgate::lifecycle::{AttemptPolicy, CallError, ErrorKind, ProviderError};
use tollgate::tower::TollgateLayer;
use tower::{Layer, Service, ServiceExt};

#[derive(Debug)]
struct Flaky;

fn layer(c: &AdmissionController) -> TollgateLayer<u32, Flaky> {
    TollgateLayer::new(c.clone(), |_: &Flaky| {
        ProviderError::new(ErrorKind::Server, "flaky")
    })
    .policy(AttemptPolicy {
        jitter: 0.0,
        ..AttemptPolicy::default()
    })
    .unwrap()
}

// proves: RT-1, ADM-1 (an inner service's retryable failures are retried
// with backoff, each attempt admitted again)
#[tokio::test(start_paused = true)]
async fn retries_a_failing_service() {
    let c = AdmissionController::builder()
        .scope(ScopeConfig::new("svc").requests(10, MINUTE))
        .build()
        .unwrap();
    let calls = Arc::new(AtomicU32::new(0));
    let seen = calls.clone();
    let inner = tower::service_fn(move |x: u32| {
        let n = seen.fetch_add(1, Ordering::SeqCst);
        async move { if n == 0 { Err(Flaky) } else { Ok(x * 2) } }
    });
    let t0 = Instant::now();
    let mut svc = layer(&c).layer(inner);
    assert_eq!(svc.ready().await.unwrap().call(21).await.unwrap(), 42);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(Instant::now() - t0, secs(1));
    assert_eq!(c.snapshot().scopes[0].counters.admitted, 2);
}

// proves: DL-1, Q-11 (the layer's timeout becomes one deadline at the
// service boundary; admission fails early when quota cannot be had in time)
#[tokio::test(start_paused = true)]
async fn timeout_becomes_one_deadline() {
    let c = AdmissionController::builder()
        .scope(ScopeConfig::new("svc").requests(1, MINUTE))
        .build()
        .unwrap();
    let inner = tower::service_fn(|x: u32| async move { Ok::<_, Flaky>(x) });
    let mut svc = layer(&c).timeout(secs(5)).layer(inner);
    assert_eq!(svc.ready().await.unwrap().call(1).await.unwrap(), 1);
    let err = svc.ready().await.unwrap().call(2).await.unwrap_err();
    assert!(matches!(err, CallError::Deadline { .. }), "{err:?}");
}

// proves: FAIR-7 (the tower layer takes each request's flow from its
// extractor: an interactive request waiting behind a batch backlog is
// served first)
#[tokio::test(start_paused = true)]
async fn the_flow_extractor_sets_each_requests_flow() {
    use tollgate::{Flow, Priority};
    let c = AdmissionController::builder()
        .scope(ScopeConfig::new("svc").requests(1, secs(1)))
        .build()
        .unwrap();
    let order = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let seen = order.clone();
    let inner = tower::service_fn(move |x: u32| {
        seen.lock().push(x);
        async move { Ok::<_, Flaky>(x) }
    });
    // Requests under 100 are batch work; the others are interactive.
    let svc = layer(&c)
        .flow(|x: &u32| {
            let class = if *x < 100 {
                Priority::Batch
            } else {
                Priority::Interactive
            };
            Flow::new(*x / 100, class)
        })
        .layer(inner);
    let mut tasks = Vec::new();
    for x in [1u32, 2, 3, 4, 100] {
        let mut svc = svc.clone();
        tasks.push(tokio::spawn(async move {
            svc.ready().await.unwrap().call(x).await.unwrap()
        }));
        common::settle().await;
    }
    for t in tasks {
        t.await.unwrap();
    }
    // 1 went at once; 100 arrived behind the batch backlog and goes next
    // (a higher class takes the head's turn).
    assert_eq!(*order.lock(), [1, 100, 2, 3, 4]);
}

// proves: RT-5 (idempotency is declared per request through the layer: a
// request the extractor calls non-idempotent gets one attempt and its
// error, the others are retried as before). Found in review: every
// request through the layer was retried.
#[tokio::test(start_paused = true)]
async fn a_non_idempotent_request_is_not_retried() {
    let c = AdmissionController::builder()
        .scope(ScopeConfig::new("svc").requests(10, MINUTE))
        .build()
        .unwrap();
    let calls = Arc::new(AtomicU32::new(0));
    let seen = calls.clone();
    let inner = tower::service_fn(move |x: u32| {
        seen.fetch_add(1, Ordering::SeqCst);
        async move {
            if x.is_multiple_of(2) {
                Ok(x)
            } else {
                Err(Flaky)
            }
        }
    });
    // Odd requests are not idempotent (and always fail once sent).
    let mut svc = layer(&c)
        .idempotent(|x: &u32| x.is_multiple_of(2))
        .layer(inner);
    let err = svc.ready().await.unwrap().call(3).await.unwrap_err();
    assert!(
        matches!(err, CallError::Provider { attempts: 1, .. }),
        "{err:?}"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1, "sent once");
    assert_eq!(svc.ready().await.unwrap().call(4).await.unwrap(), 4);
}
