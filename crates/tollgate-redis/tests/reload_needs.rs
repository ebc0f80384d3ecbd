//! A reload that makes a shared scope need a token estimate (a token
//! limit added, SPEC Q-3) or a price (a spend budget added, BUD-1): the
//! calls queued without one fail with `TokenEstimateRequired` /
//! `PriceRequired` instead of being admitted with nothing reserved, and
//! leave nothing held, in Redis or in the process. Real `redis-server`,
//! real clock, multi-threaded runtime.

mod common;

use std::sync::Arc;
use std::time::Duration;

use tollgate::config::{ControllerConfig, MINUTE, ScopeConfig};
use tollgate::quota::{Dimension, RemoteBackend, RemoteQuota};
use tollgate::{
    AdmissionController, AdmissionError, Call, Deadline, Price, ScopeId, TokenEstimate,
};
use tollgate_redis::RedisServer;

fn config(scope: ScopeConfig, concurrency: Option<u64>) -> ControllerConfig {
    ControllerConfig {
        scopes: vec![scope],
        concurrency,
        ..ControllerConfig::default()
    }
}

/// Waits (at most 10 s) until `n` calls are queued on the first scope.
async fn queued(c: &AdmissionController, n: usize) {
    let end = tokio::time::Instant::now() + Duration::from_secs(10);
    while c.snapshot().scopes[0].queued != n {
        assert!(tokio::time::Instant::now() < end, "never {n} queued");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Pending holds left in Redis under `prefix` for `scope`.
async fn holds(server: &RedisServer, prefix: &str, scope: &ScopeConfig) -> u64 {
    let store = common::backend(server, prefix).open_scope(scope);
    let mut raw = common::raw(server).await;
    let mut n = 0;
    for key in store.keys().iter().filter(|k| k.ends_with(":pend")) {
        let len: u64 = redis::cmd("HLEN")
            .arg(key)
            .query_async(&mut raw)
            .await
            .expect("HLEN");
        n += len;
    }
    n
}

// proves: Q-3 (a token limit added by a reload to a shared scope fails the
// calls queued without a token estimate, the turn's holder asleep on the
// request limit and the call in line behind it, with
// `TokenEstimateRequired`; nothing of them is reserved in Redis nor held
// in the process), BUD-1 (the same for a spend budget and calls without a
// price: `PriceRequired`), GW-15
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_needs_an_estimate_or_a_price_fails_shared_calls_without() {
    let Some(server) = common::server("reload_needs") else {
        return;
    };
    let price = Price::new(1_000_000, 1_000_000);
    let estimated = Call::new(ScopeId::FIRST).with_estimate(TokenEstimate::new(1, 0));
    let base = || ScopeConfig::new("main").requests(1, MINUTE);
    for (added, lacking, expected, dimension) in [
        (
            base().tokens(100, MINUTE),
            Call::new(ScopeId::FIRST),
            AdmissionError::TokenEstimateRequired {
                scope: ScopeId::FIRST,
            },
            Dimension::Tokens,
        ),
        (
            base().cost(100, MINUTE),
            estimated,
            AdmissionError::PriceRequired {
                scope: ScopeId::FIRST,
            },
            Dimension::Cost,
        ),
    ] {
        // Both with and without a pool: a call queued without a permit
        // free reserves a pending hold.
        for concurrency in [None, Some(4)] {
            let prefix = common::unique("needs");
            let backend: Arc<dyn RemoteBackend> = Arc::new(common::backend(&server, &prefix));
            let c = AdmissionController::builder()
                .config(config(base(), concurrency))
                .shared_store(backend)
                .build()
                .expect("controller");
            let full = c
                .acquire(&estimated.with_price(price), Deadline::NONE)
                .await
                .expect("the minute's one request");
            let waiting: Vec<_> = (0..2)
                .map(|_| {
                    let c = c.clone();
                    tokio::spawn(async move { c.acquire(&lacking, Deadline::NONE).await })
                })
                .collect();
            queued(&c, 2).await;
            c.reconfigure(config(added.clone(), concurrency))
                .expect("reload");
            for w in waiting {
                let got = tokio::time::timeout(Duration::from_secs(10), w)
                    .await
                    .expect("failed at once, not after the minute")
                    .expect("no panic");
                assert_eq!(got.err(), Some(expected.clone()), "{concurrency:?}");
            }
            // Nothing held in the process.
            let snapshot = c.snapshot();
            let s = &snapshot.scopes[0];
            assert_eq!((s.queued, s.pending), (0, 0), "{concurrency:?}");
            // Nothing reserved in Redis: the new limit is whole, the
            // request limit counts only the first call, no hold is left.
            let limits = c
                .shared_limits(ScopeId::FIRST)
                .await
                .expect("shared")
                .expect("answered");
            let available = |d: Dimension| {
                limits
                    .iter()
                    .find(|l| l.dimension == d)
                    .map(|l| l.available)
            };
            assert_eq!(available(dimension), Some(100), "{concurrency:?}");
            assert_eq!(available(Dimension::Requests), Some(0), "{concurrency:?}");
            assert_eq!(holds(&server, &prefix, &added).await, 0, "{concurrency:?}");
            // A call that arrives now lacking it is refused on arrival.
            assert_eq!(
                c.acquire(&lacking, Deadline::NONE).await.err(),
                Some(expected.clone())
            );
            drop(full);
            tokio::time::timeout(Duration::from_secs(10), c.close())
                .await
                .expect("close resolves");
            assert!(c.snapshot().is_idle());
            assert_eq!(c.snapshot().scopes[0].counters.settlements_failed, 0);
            // The remote handle's snapshot agrees once closed.
            let store = common::backend(&server, &prefix).open_scope(&added);
            let after = store
                .snapshot(common::BUDGET)
                .await
                .expect("snapshot")
                .iter()
                .find(|l| l.dimension == dimension)
                .map(|l| l.available);
            assert_eq!(after, Some(100), "{concurrency:?}");
        }
    }
}
