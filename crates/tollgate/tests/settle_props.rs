//! Property test of reservation, reconciliation, cancellation and 429
//! events together (SPEC, CD-1..CD-3).

mod common;

use std::time::Duration;

use proptest::prelude::*;
use tollgate::config::{Algorithm, ScopeConfig};
use tollgate::{AdmissionController, Call, Deadline, Lease, ScopeId, TokenEstimate, Usage};

const W: Duration = Duration::from_secs(60);

#[derive(Debug, Clone)]
enum Op {
    Acquire { tokens: u64, wait_ms: u64 },
    Settle { idx: usize, usage: Option<u64> },
    Release { idx: usize },
    RateLimited { idx: usize, hint_ms: Option<u64> },
    Advance { ms: u64 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1u64..60, 0u64..3_000).prop_map(|(tokens, wait_ms)| Op::Acquire { tokens, wait_ms }),
        3 => (0usize..8, prop::option::of(0u64..120)).prop_map(|(idx, usage)| Op::Settle { idx, usage }),
        2 => (0usize..8).prop_map(|idx| Op::Release { idx }),
        1 => (0usize..8, prop::option::of(0u64..4_000)).prop_map(|(idx, hint_ms)| Op::RateLimited { idx, hint_ms }),
        2 => (0u64..20_000).prop_map(|ms| Op::Advance { ms }),
    ]
}

fn algorithm() -> impl Strategy<Value = Algorithm> {
    prop_oneof![
        Just(Algorithm::SlidingWindow),
        Just(Algorithm::TokenBucket { burst: None }),
        Just(Algorithm::FixedWindow),
    ]
}

struct Held {
    lease: Lease,
    estimate: u64,
    /// `Some(known)` once settled; `known == false`: unknown usage.
    settled: Option<bool>,
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    // proves, CD-3 (tokens granted minus refunds equal tokens
    // reported plus retained estimates; availability never exceeds capacity;
    // nothing leaks once all is dropped)
    #[test]
    fn granted_minus_refunds_equals_reported_plus_retained(
        algorithm in algorithm(),
        concurrency in 1u64..4,
        ops in prop::collection::vec(op(), 1..80),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        rt.block_on(async move {
            let c = AdmissionController::builder()
                .scope(ScopeConfig::new("p").requests(20, W).tokens(200, W).algorithm(algorithm))
                .concurrency(concurrency)
                .build()
                .unwrap();
            let mut held: Vec<Held> = Vec::new();
            let mut retained = 0u64;
            for op in ops {
                match op {
                    Op::Acquire { tokens, wait_ms } => {
                        let call = Call::new(ScopeId::FIRST).with_estimate(TokenEstimate::new(tokens, 0));
                        let acquire = c.acquire(&call, Deadline::NONE);
                        if let Ok(Ok(lease)) = tokio::time::timeout(Duration::from_millis(wait_ms), acquire).await {
                            held.push(Held { lease, estimate: tokens, settled: None });
                        }
                    }
                    Op::Settle { idx, usage } => {
                        if let Some(h) = held.get_mut(idx) {
                            let usage = usage.map_or(Usage::UNKNOWN, Usage::known);
                            let first = h.lease.reconcile(usage).is_ok();
                            prop_assert_eq!(first, h.settled.is_none());
                            if first {
                                h.settled = Some(usage.is_known());
                            }
                        }
                    }
                    Op::Release { idx } => {
                        if idx < held.len() {
                            let h = held.remove(idx);
                            if h.settled != Some(true) {
                                retained += h.estimate;
                            }
                        }
                    }
                    Op::RateLimited { idx, hint_ms } => {
                        if let Some(h) = held.get(idx) {
                            h.lease.rate_limited(hint_ms.map(Duration::from_millis));
                        }
                    }
                    Op::Advance { ms } => tokio::time::advance(Duration::from_millis(ms)).await,
                }
                for l in &c.snapshot().scopes[0].limits {
                    prop_assert!(l.available <= l.capacity as i64, "{:?} above capacity", l.dimension);
                }
            }
            retained += held.iter().filter(|h| h.settled != Some(true)).map(|h| h.estimate).sum::<u64>();
            let k = c.snapshot().scopes[0].counters;
            prop_assert_eq!(
                k.tokens_reserved - k.tokens_refunded + k.tokens_debt,
                k.tokens_reported + retained
            );
            drop(held);
            tokio::time::advance(W * 4).await;
            let s = c.snapshot();
            prop_assert!(s.is_idle());
            for l in &s.scopes[0].limits {
                prop_assert_eq!(l.available, l.capacity as i64);
            }
            Ok(())
        })?;
    }
}
