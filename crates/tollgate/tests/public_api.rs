//! The library as a new user meets it: only `tollgate::…` paths a user can
//! name, the root re-exports first (SPEC, DL-1, OBS-1, OBS-4).

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use futures_core::Stream;
use tokio::time::Instant;
use tollgate::config::{MINUTE, PoolConfig, ScopeConfig};
use tollgate::lifecycle::{
    AttemptContext, AttemptPolicy, CallError, CallOptions, Provider, ProviderError, Reply,
    StreamEvent, Supervisor,
};
use tollgate::{
    AdmissionController, AdmissionError, Call, CharRatioEstimator, Deadline, Dimension,
    EstimateError, LimitSnapshot, LimitedBy, Phase, PoolId, ScopeId, TokenEstimate, Usage,
};

const SEC: Duration = Duration::from_secs(1);

fn in_a_minute() -> Deadline {
    Deadline::after(MINUTE)
}

/// Echoes text; the first `fail_first` attempts answer 503.
struct Echo {
    attempts: AtomicU32,
    fail_first: u32,
}

type Chunks = Pin<Box<dyn Stream<Item = Result<StreamEvent<String>, ProviderError>> + Send>>;

impl Provider for Echo {
    type Request = String;
    type Response = String;
    type Chunk = String;
    type Stream = Chunks;

    async fn call(&self, r: &String, _: AttemptContext) -> Result<Reply<String>, ProviderError> {
        if self.attempts.fetch_add(1, Ordering::SeqCst) < self.fail_first {
            return Err(ProviderError::from_status(503, "warming up"));
        }
        Ok(Reply::new(r.clone(), Usage::UNKNOWN))
    }

    async fn stream(&self, _: &String, _: AttemptContext) -> Result<Chunks, ProviderError> {
        Err(ProviderError::from_status(501, "no streams here"))
    }
}

// proves: DL-1 (`Deadline::after` turns a duration into one absolute
// deadline on tokio's clock, at the caller's boundary; inner stages see the
// same instant however long they wait)
#[tokio::test(start_paused = true)]
async fn deadline_after_reads_tokios_clock_once() {
    let start = Instant::now();
    let deadline = Deadline::after(5 * SEC);
    assert_eq!(deadline.instant(), Some(start + 5 * SEC));
    tokio::time::advance(3 * SEC).await;
    assert_eq!(deadline.remaining(Instant::now()), Some(2 * SEC));
    assert_eq!(deadline, Deadline::from_timeout(Some(5 * SEC), start));
    tokio::time::advance(2 * SEC).await;
    assert!(deadline.is_expired(Instant::now()));
    // A huge budget saturates instead of overflowing.
    assert!(!Deadline::after(Duration::MAX).is_expired(Instant::now()));
}

// proves: DL-1, DL-5 (a deadline made with `after` bounds admission: once
// it has passed, acquire fails at once in the queue phase)
#[tokio::test(start_paused = true)]
async fn an_expired_after_deadline_fails_admission() {
    let c = AdmissionController::builder()
        .scope(ScopeConfig::new("api").requests(10, MINUTE))
        .build()
        .unwrap();
    let deadline = Deadline::after(SEC);
    tokio::time::advance(2 * SEC).await;
    let err = c.acquire(&Call::new(ScopeId::FIRST), deadline).await;
    assert!(
        matches!(
            err,
            Err(AdmissionError::DeadlineExceeded {
                phase: Phase::Queue,
                ..
            })
        ),
        "{err:?}"
    );
    assert_eq!(c.snapshot().scopes[0].counters.admitted, 0);
}

// proves: OBS-1 (the snapshot is looked up by scope and pool, by id and by
// name, and reports what is available per dimension and window)
#[tokio::test(start_paused = true)]
async fn snapshot_lookups_and_availability() {
    let c = AdmissionController::builder()
        .scope(
            ScopeConfig::new("chat")
                .requests(10, MINUTE)
                .tokens(1_000, MINUTE)
                .tokens(5_000, 10 * MINUTE),
        )
        .scope(ScopeConfig::new("embed").requests(100, MINUTE))
        .pool(PoolConfig::new("gpu", 3))
        .build()
        .unwrap();
    let chat = c.scope_id("chat").unwrap();
    let embed = c.scope_id("embed").unwrap();
    let gpu = c.pool_id("gpu").unwrap();

    let mut call = Call::new(chat).with_estimate(TokenEstimate::new(200, 100));
    call.pool = Some(gpu);
    let lease = c.acquire(&call, in_a_minute()).await.unwrap();

    let s = c.snapshot();
    let by_id = s.scope(chat).unwrap();
    assert_eq!(by_id.name, "chat");
    assert_eq!(s.scope_named("chat"), Some(by_id));
    assert_eq!(s.scope(embed).unwrap().name, "embed");
    assert_eq!(s.scope_named("nope"), None);
    assert_eq!(by_id.available(Dimension::Requests, MINUTE), Some(9));
    assert_eq!(by_id.available(Dimension::Tokens, MINUTE), Some(700));
    assert_eq!(by_id.available(Dimension::Tokens, 10 * MINUTE), Some(4_700));
    assert_eq!(by_id.available(Dimension::Requests, 10 * MINUTE), None);
    assert_eq!(by_id.min_available(Dimension::Tokens), Some(700));
    let limit: &LimitSnapshot = by_id.limit(Dimension::Tokens, 10 * MINUTE).unwrap();
    assert_eq!((limit.limit, limit.available), (5_000, 4_700));
    let embed_s = s.scope(embed).unwrap();
    assert_eq!(embed_s.available(Dimension::Requests, MINUTE), Some(100));
    assert_eq!(embed_s.min_available(Dimension::Tokens), None);

    let pool = s.pool(gpu).unwrap();
    assert_eq!(
        (pool.name.as_str(), pool.limit, pool.available),
        ("gpu", 3, 2)
    );
    assert_eq!(s.pool_named("gpu"), Some(pool));
    assert_eq!(s.pool(PoolId::new(99)), None);
    assert_eq!(s.pool_named("cpu"), None);

    drop(lease);
    let s = c.snapshot();
    assert_eq!(s.pool(gpu).unwrap().available, 3);
    // The request unit stays spent after the lease is returned.
    assert_eq!(
        s.scope(chat)
            .unwrap()
            .available(Dimension::Requests, MINUTE),
        Some(9)
    );
}

// proves: OBS-4 (an admission that waited for a token limit reports
// `limited_by` tokens only, named with the root re-exports)
#[tokio::test(start_paused = true)]
async fn limited_by_names_the_binding_dimension() {
    let c = AdmissionController::builder()
        .scope(
            ScopeConfig::new("api")
                .requests(100, MINUTE)
                .tokens(100, MINUTE),
        )
        .build()
        .unwrap();
    let call = Call::new(ScopeId::FIRST).with_estimate(TokenEstimate::new(80, 0));
    let first = c.acquire(&call, in_a_minute()).await.unwrap();
    assert_eq!(first.admission().limited_by, LimitedBy::default());
    drop(first);
    let second = c.acquire(&call, Deadline::after(2 * MINUTE)).await.unwrap();
    let expected = LimitedBy {
        requests: false,
        tokens: true,
        ..LimitedBy::default()
    };
    assert_eq!(second.admission().limited_by, expected);
    assert_eq!(expected.as_str(), Dimension::Tokens.as_str());
    assert!(second.admission().quota_wait >= 59 * SEC);
}

// proves: OBS-1 (a lease's Debug shows the lease — scope, id, pool, hold,
// generation, tokens reserved — and nothing of the controller behind it)
#[tokio::test(start_paused = true)]
async fn lease_debug_is_the_lease_only() {
    let c = AdmissionController::builder()
        .scope(
            ScopeConfig::new("secret-tenant-scope")
                .requests(10, MINUTE)
                .tokens(1_000, MINUTE),
        )
        .pool(PoolConfig::new("secret-pool", 2))
        .build()
        .unwrap();
    let mut call = Call::new(ScopeId::FIRST).with_estimate(TokenEstimate::new(250, 50));
    call.pool = c.pool_id("secret-pool");
    let lease = c.acquire(&call, in_a_minute()).await.unwrap();
    let shown = format!("{lease:?}");
    for field in [
        "scope",
        "id: None",
        "pool: Some",
        "hold: Leased",
        "generation: 0",
        "tokens_reserved: 300",
    ] {
        assert!(shown.contains(field), "{field} missing from {shown}");
    }
    // No controller state: no names, queues, limits or clocks.
    for leak in ["secret", "queue", "limit", "clock", "Inner"] {
        assert!(!shown.contains(leak), "{leak} leaked into {shown}");
    }
    assert!(shown.len() < 300, "{shown}");
}

// proves: Q-3, Q-8 (the supervisor builder takes any `TokenEstimator`; a
// fresh estimate is reserved for every attempt, retries included)
#[tokio::test(start_paused = true)]
async fn supervisor_takes_a_token_estimator() {
    let c = AdmissionController::builder()
        .scope(ScopeConfig::new("api").tokens(10_000, MINUTE))
        .build()
        .unwrap();
    let provider = Echo {
        attempts: AtomicU32::new(0),
        fail_first: 1,
    };
    let supervisor = Supervisor::builder(c.clone(), provider)
        .estimator(CharRatioEstimator::new(4.0, 100).unwrap())
        .policy(AttemptPolicy {
            jitter: 0.0,
            ..AttemptPolicy::default()
        })
        .build()
        .unwrap();
    let prompt = "x".repeat(40); // 10 input tokens + 100 output
    let done = supervisor
        .invoke(&prompt, CallOptions::deadline(in_a_minute()))
        .await
        .unwrap();
    assert_eq!(done.attempts, 2);
    let s = c.snapshot();
    let api = s.scope_named("api").unwrap();
    assert_eq!(api.counters.admitted, 2);
    assert_eq!(api.counters.tokens_reserved, 220);
    // Unknown usage keeps both estimates.
    assert_eq!(api.available(Dimension::Tokens, MINUTE), Some(10_000 - 220));
}

// proves: Q-3 (one estimator shared as an `Arc` serves several supervisors;
// a failing estimator is `TokenEstimationFailed` before any provider work)
#[tokio::test(start_paused = true)]
async fn a_shared_estimator_and_a_failing_one() {
    let c = AdmissionController::builder()
        .scope(ScopeConfig::new("api").tokens(10_000, MINUTE))
        .build()
        .unwrap();
    let shared = Arc::new(|r: &String| Ok(TokenEstimate::new(r.len() as u64, 0)));
    let echo = || Echo {
        attempts: AtomicU32::new(0),
        fail_first: 0,
    };
    for _ in 0..2 {
        let s = Supervisor::builder(c.clone(), echo())
            .estimator(Arc::clone(&shared))
            .build()
            .unwrap();
        s.invoke(&"abcd".to_string(), CallOptions::deadline(in_a_minute()))
            .await
            .unwrap();
    }
    assert_eq!(c.snapshot().scopes[0].counters.tokens_reserved, 8);

    let failing = Supervisor::builder(c.clone(), echo())
        .estimator(|_: &String| Err(EstimateError::new("no tokenizer")))
        .build()
        .unwrap();
    let err = failing
        .invoke(&"abcd".to_string(), CallOptions::deadline(in_a_minute()))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            CallError::Admission(AdmissionError::TokenEstimationFailed { .. })
        ),
        "{err:?}"
    );
    assert_eq!(failing.provider().attempts.load(Ordering::SeqCst), 0);
    assert_eq!(c.snapshot().scopes[0].counters.admitted, 2);
}

#[cfg(feature = "tower")]
mod tower_layer {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    use tollgate::config::{MINUTE, ScopeConfig};
    use tollgate::lifecycle::{CallError, ErrorKind, ProviderError};
    use tollgate::tower::TollgateLayer;
    use tollgate::{
        AdmissionController, AdmissionError, Dimension, EstimateError, TokenEstimate, Usage,
    };
    use tower::{Layer, Service, ServiceExt};

    /// A request with its own estimate; the reply reports `used` tokens.
    #[derive(Debug, Clone)]
    struct Ask {
        estimate: u64,
        used: Option<u64>,
    }

    #[derive(Debug)]
    struct Reply {
        used: Option<u64>,
    }

    #[derive(Debug)]
    struct Down;

    fn controller() -> AdmissionController {
        AdmissionController::builder()
            .scope(
                ScopeConfig::new("llm")
                    .requests(100, MINUTE)
                    .tokens(1_000, MINUTE),
            )
            .build()
            .unwrap()
    }

    fn layer(c: &AdmissionController) -> TollgateLayer<Ask, Down> {
        TollgateLayer::new(c.clone(), |_: &Down| {
            ProviderError::new(ErrorKind::Server, "down")
        })
        .timeout(MINUTE)
    }

    fn counted(
        calls: &Arc<AtomicU32>,
    ) -> impl Service<
        Ask,
        Response = Reply,
        Error = Down,
        Future = impl Future<Output = Result<Reply, Down>> + Send,
    > + Clone
    + Send
    + Sync
    + 'static {
        let calls = Arc::clone(calls);
        tower::service_fn(move |a: Ask| {
            calls.fetch_add(1, Ordering::SeqCst);
            async move { Ok::<_, Down>(Reply { used: a.used }) }
        })
    }

    fn estimate(a: &Ask) -> Result<TokenEstimate, EstimateError> {
        Ok(TokenEstimate::new(a.estimate, 0))
    }

    fn tokens_available(c: &AdmissionController) -> Option<i64> {
        c.snapshot()
            .scope_named("llm")
            .and_then(|s| s.available(Dimension::Tokens, MINUTE))
    }

    // proves: Q-3 (through the layer, a scope with a token limit needs an
    // estimator: without one every call is `TokenEstimateRequired` before
    // the inner service runs; with one it is admitted and reserves it)
    #[tokio::test(start_paused = true)]
    async fn a_token_scope_works_through_the_layer_with_an_estimator() {
        let c = controller();
        let calls = Arc::new(AtomicU32::new(0));
        let ask = Ask {
            estimate: 300,
            used: None,
        };

        let mut bare = layer(&c).layer(counted(&calls));
        let err = bare.ready().await.unwrap().call(ask.clone()).await;
        assert!(
            matches!(
                err,
                Err(CallError::Admission(
                    AdmissionError::TokenEstimateRequired { .. }
                ))
            ),
            "{err:?}"
        );
        assert_eq!(calls.load(Ordering::SeqCst), 0);

        let mut svc = layer(&c).estimator(estimate).layer(counted(&calls));
        svc.ready().await.unwrap().call(ask).await.unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        let s = c.snapshot();
        assert_eq!(s.scopes[0].counters.admitted, 1);
        assert_eq!(s.scopes[0].counters.tokens_reserved, 300);
        // No usage extractor: usage is unknown, the estimate is kept.
        assert_eq!(s.scopes[0].counters.unknown_usage, 1);
        assert_eq!(tokens_available(&c), Some(700));
    }

    // proves: Q-3 (an estimator failure through the layer is
    // `TokenEstimationFailed`, raised before the inner service runs)
    #[tokio::test(start_paused = true)]
    async fn a_failing_estimator_stops_the_call_before_the_service() {
        let c = controller();
        let calls = Arc::new(AtomicU32::new(0));
        let mut svc = layer(&c)
            .estimator(|_: &Ask| Err(EstimateError::new("unknown model")))
            .layer(counted(&calls));
        let err = svc
            .ready()
            .await
            .unwrap()
            .call(Ask {
                estimate: 1,
                used: None,
            })
            .await;
        assert!(
            matches!(
                err,
                Err(CallError::Admission(
                    AdmissionError::TokenEstimationFailed { .. }
                ))
            ),
            "{err:?}"
        );
        assert_eq!(calls.load(Ordering::SeqCst), 0);
        assert_eq!(c.snapshot().scopes[0].counters.admitted, 0);
    }

    // proves: Q-5 (the layer's usage extractor settles each reservation:
    // usage below the estimate refunds the difference, above it is debt,
    // known zero refunds every token, unknown keeps the estimate — all
    // visible in `controller.snapshot()`)
    #[tokio::test(start_paused = true)]
    async fn reported_usage_settles_the_reservation() {
        let c = controller();
        let calls = Arc::new(AtomicU32::new(0));
        let mut svc = layer(&c)
            .estimator(estimate)
            .usage(|r: &Reply| r.used.map_or(Usage::UNKNOWN, Usage::known))
            .layer(counted(&calls));
        let mut call = async |estimate, used| {
            svc.ready()
                .await
                .unwrap()
                .call(Ask { estimate, used })
                .await
                .unwrap();
            let s = c.snapshot();
            let llm = s.scope_named("llm").unwrap();
            (
                llm.available(Dimension::Tokens, MINUTE).unwrap(),
                llm.counters,
            )
        };

        // Below: 300 reserved, 100 used, 200 back at once.
        let (available, counters) = call(300, Some(100)).await;
        assert_eq!(available, 900);
        assert_eq!(counters.tokens_reported, 100);
        assert_eq!(counters.tokens_refunded, 200);

        // Known zero: every token back, the request unit stays spent.
        let (available, counters) = call(300, Some(0)).await;
        assert_eq!(available, 900);
        assert_eq!(counters.known_zero, 1);
        assert_eq!(counters.tokens_refunded, 500);

        // Unknown: the estimate is kept.
        let (available, counters) = call(300, None).await;
        assert_eq!(available, 600);
        assert_eq!(counters.unknown_usage, 1);

        // Above: 100 reserved, 400 used, 300 of debt.
        let (available, counters) = call(100, Some(400)).await;
        assert_eq!(available, 200);
        assert_eq!(counters.tokens_debt, 300);
        assert_eq!(counters.admitted, 4);
        assert_eq!(
            c.snapshot()
                .scope_named("llm")
                .and_then(|s| s.available(Dimension::Requests, MINUTE)),
            Some(96)
        );
    }
}

// proves: Q-3 (an estimator written as a type-erased `Arc<dyn Fn>`, the
// builder's former argument, is still accepted and reserved)
#[tokio::test(start_paused = true)]
async fn a_boxed_fn_estimator_still_works() {
    let c = AdmissionController::builder()
        .scope(ScopeConfig::new("api").tokens(10_000, MINUTE))
        .build()
        .unwrap();
    type DynEstimate = dyn Fn(&String) -> Result<TokenEstimate, EstimateError> + Send + Sync;
    let erased: Arc<DynEstimate> = Arc::new(|r: &String| Ok(TokenEstimate::new(7, r.len() as u64)));
    let s = Supervisor::builder(
        c.clone(),
        Echo {
            attempts: AtomicU32::new(0),
            fail_first: 0,
        },
    )
    .estimator(erased)
    .build()
    .unwrap();
    s.invoke(&"abc".to_string(), CallOptions::deadline(in_a_minute()))
        .await
        .unwrap();
    assert_eq!(c.snapshot().scopes[0].counters.tokens_reserved, 10);
}
