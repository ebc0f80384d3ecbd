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
