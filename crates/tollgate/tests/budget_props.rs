//! Property tests of the cost dimension (SPEC BUD-2, Q-5, Q-7) against
//! the controller's observable availability, for every algorithm: a budget
//! takes each attempt's worst case at admission, all or none; settlement
//! moves it by exactly the priced refund or debt; a refusal gives the cost
//! back; and no admission ever finds less room than it takes.

mod common;

use std::time::Duration;

use proptest::prelude::*;
use tokio::time::Instant;
use tollgate::config::ScopeConfig;
use tollgate::quota::Dimension;
use tollgate::{
    AdmissionController, Call, Deadline, Lease, Parts, Price, RefusalCost, ScopeId, Snapshot,
    TokenEstimate, Usage,
};

const W: Duration = Duration::from_secs(60);
/// The budget: $0.05 per window.
const BUDGET: u64 = 50_000;

/// What the provider reports for one attempt.
#[derive(Debug, Clone, Copy)]
enum Reported {
    Unknown,
    Zero,
    /// Some of the estimate, split into kinds: `cached` of the input read
    /// from the cache, `written` written to it, the output `percent`%.
    Below {
        cached: u64,
        written: u64,
        percent: u64,
    },
    /// More input than estimated (the estimator under-counted): debt.
    Above {
        extra: u64,
    },
    /// Only a total: the split, so the cost, is unknown.
    TotalOnly,
}

#[derive(Debug, Clone)]
enum Op {
    Acquire {
        input: u64,
        output: u64,
        price: usize,
    },
    Settle {
        idx: usize,
        reported: Reported,
    },
    Refused {
        idx: usize,
    },
    Release {
        idx: usize,
    },
    Advance {
        ms: u64,
    },
}

/// Prices (µ$ per million tokens) of a few models, dearer kinds included.
fn prices() -> [Price; 3] {
    [
        Price {
            cached_input: Some(75_000),
            ..Price::new(150_000, 600_000)
        },
        Price {
            cached_input: Some(300_000),
            cache_write: Some(3_750_000),
            cache_write_1h: Some(6_000_000),
            ..Price::new(3_000_000, 15_000_000)
        },
        Price::new(2_000_000, 8_000_000),
    ]
}

fn reported() -> impl Strategy<Value = Reported> {
    prop_oneof![
        Just(Reported::Unknown),
        Just(Reported::Zero),
        (0u64..100, 0u64..100, 0u64..=100).prop_map(|(cached, written, percent)| {
            Reported::Below {
                cached,
                written,
                percent,
            }
        }),
        (1u64..300).prop_map(|extra| Reported::Above { extra }),
        Just(Reported::TotalOnly),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u64..600, 0u64..300, 0usize..3)
            .prop_map(|(input, output, price)| Op::Acquire { input, output, price }),
        4 => (0usize..8, reported()).prop_map(|(idx, reported)| Op::Settle { idx, reported }),
        1 => (0usize..8).prop_map(|idx| Op::Refused { idx }),
        2 => (0usize..8).prop_map(|idx| Op::Release { idx }),
        2 => (0u64..30_000).prop_map(|ms| Op::Advance { ms }),
    ]
}

fn cost(s: &Snapshot) -> (i64, i64) {
    let l = s.scopes[0]
        .limits
        .iter()
        .find(|l| l.dimension == Dimension::Cost)
        .copied()
        .unwrap();
    (l.available, l.capacity as i64)
}

struct Held {
    lease: Lease,
    input: u64,
    output: u64,
    price: Price,
    /// When it was admitted.
    at: Instant,
}

/// The usage `reported` describes for an attempt of `input` and `output`.
fn usage(reported: Reported, input: u64, output: u64) -> Usage {
    match reported {
        Reported::Unknown => Usage::UNKNOWN,
        Reported::Zero => Usage::known(0),
        Reported::Below {
            cached,
            written,
            percent,
        } => {
            let cached = input * cached / 100;
            let written = (input - cached) * written / 100;
            let parts = Parts {
                cached_input: cached,
                cache_write: written,
                ..Parts::plain(input - cached - written, output * percent / 100)
            };
            Usage::from_io(parts.input_total(), parts.output_total()).with_parts(Some(parts))
        }
        Reported::Above { extra } => Usage::from_io(input + extra, output),
        Reported::TotalOnly => Usage::known(input + output),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    // proves: BUD-2 (a budget takes each attempt's worst case at its
    // price, all or none: an admission finds at least that much room in
    // the window, counting every earlier admission still inside it at its
    // settled cost, so the cost dimension never admits over its limit;
    // BUD-3: in any of its windows, whatever the scope's algorithm),
    // Q-5 (settling moves the available budget by exactly the priced
    // refund or debt, each kind at its own price; an unknown cost, or a
    // total without a split, keeps the worst case; known zero gives it all
    // back), BUD-5 (a refused attempt gives its whole cost back, whatever
    // the provider's limiter charges), Q-9 (nothing leaks)
    #[test]
    fn the_budget_moves_by_exactly_each_charge(
        algorithm in common::algorithm(),
        ops in prop::collection::vec(op(), 1..80),
    ) {
        common::paused_runtime().block_on(async move {
            let c = AdmissionController::builder()
                .scope(
                    ScopeConfig::new("budget")
                        .requests(1_000, W)
                        .cost(BUDGET, W)
                        .algorithm(algorithm),
                )
                .build()
                .unwrap();
            // A rolling budget is a sliding window whatever the scope's
            // algorithm (BUD-2, BUD-3: a bucket would refill it as it is
            // spent, a fixed window admit it again at each window's start).
            // Whether an amount counted at `at` is still counted now:
            // `None` while the window may still hold it in a merged slot
            // (up to W / 512 longer).
            let counted = |at: Instant| -> Option<bool> {
                let age = Instant::now().duration_since(at);
                if age < W {
                    Some(true)
                } else if age >= W + W / 256 {
                    Some(false)
                } else {
                    None
                }
            };
            let prices = prices();
            let mut held: Vec<Held> = Vec::new();
            // Every admission still in the window, for the sliding window's
            // own check: (instant, settled cost).
            let mut admitted: Vec<(Instant, u64)> = Vec::new();
            for op in ops {
                let (before, _) = cost(&c.snapshot());
                match op {
                    Op::Acquire { input, output, price } => {
                        let price = prices[price];
                        let worst = price.worst_case(input, output);
                        let call = Call::new(ScopeId::FIRST)
                            .with_estimate(TokenEstimate::new(input, output))
                            .with_price(price);
                        let got = tokio::time::timeout(Duration::ZERO, c.acquire(&call, Deadline::NONE)).await;
                        let (after, _) = cost(&c.snapshot());
                        match got {
                            Ok(Ok(lease)) => {
                                prop_assert!(before >= worst as i64, "admitted {worst} with {before} left");
                                prop_assert_eq!(after, before - worst as i64);
                                prop_assert_eq!(lease.reservation().demand.cost, worst);
                                let now = Instant::now();
                                let inside: u64 = admitted
                                    .iter()
                                    .filter(|(t, ..)| now.duration_since(*t) < W)
                                    .map(|(_, c)| c)
                                    .sum();
                                prop_assert!(inside + worst <= BUDGET, "window held {inside} + {worst}");
                                admitted.push((now, worst));
                                held.push(Held { lease, input, output, price, at: now });
                            }
                            _ => prop_assert_eq!(after, before, "given up: all back"),
                        }
                    }
                    Op::Settle { idx, reported } => {
                        let Some(h) = held.get_mut(idx) else { continue };
                        if h.lease.is_reconciled() {
                            continue;
                        }
                        let reserved = h.lease.reservation().demand.cost;
                        let used = usage(reported, h.input, h.output);
                        let charged = used.priced(&h.price).cost();
                        let s = h.lease.reconcile(used.priced(&h.price)).unwrap();
                        prop_assert_eq!(s.cost.reported, charged);
                        let (after, _) = cost(&c.snapshot());
                        // The change lands where the attempt was counted:
                        // once it aged out of the window, nothing changes.
                        let inside = counted(h.at);
                        let expected = match charged {
                            None => Some(before),
                            Some(_) if inside == Some(false) => Some(before),
                            _ if inside.is_none() => None,
                            Some(x) if x > reserved => Some(before - (x - reserved) as i64),
                            Some(x) => Some(before + (reserved - x) as i64),
                        };
                        if let Some(expected) = expected {
                            prop_assert_eq!(after, expected, "{:?} of {}", reported, reserved);
                        }
                        if let Some(x) = charged {
                            prop_assert_eq!(s.cost.charged(), x);
                            if let Some(e) = admitted.iter_mut().find(|e| e.0 == h.at && e.1 == reserved) {
                                e.1 = x;
                            }
                        } else {
                            prop_assert_eq!(s.cost.charged(), reserved);
                        }
                    }
                    Op::Refused { idx } => {
                        let Some(h) = held.get_mut(idx) else { continue };
                        if h.lease.is_reconciled() {
                            continue;
                        }
                        let reserved = h.lease.reservation().demand.cost;
                        h.lease.refused(RefusalCost::Full).unwrap();
                        let (after, _) = cost(&c.snapshot());
                        let want = match counted(h.at) {
                            Some(true) => Some(before + reserved as i64),
                            Some(false) => Some(before),
                            None => None,
                        };
                        if let Some(want) = want {
                            prop_assert_eq!(after, want, "a refusal costs nothing");
                        }
                        if let Some(e) = admitted.iter_mut().find(|e| e.0 == h.at && e.1 == reserved) {
                            e.1 = 0;
                        }
                    }
                    Op::Release { idx } => {
                        if idx < held.len() {
                            drop(held.remove(idx));
                            prop_assert_eq!(cost(&c.snapshot()).0, before, "releasing gives no money back");
                        }
                    }
                    Op::Advance { ms } => tokio::time::advance(Duration::from_millis(ms)).await,
                }
                let (now_available, capacity) = cost(&c.snapshot());
                prop_assert!(now_available <= capacity);
            }
            drop(held);
            tokio::time::sleep(W * 8).await;
            let s = c.snapshot();
            prop_assert!(s.is_idle());
            for l in &s.scopes[0].limits {
                prop_assert_eq!(l.available, l.capacity as i64, "{} leaked", l.dimension);
            }
            Ok(())
        })?;
    }
}

// proves: BUD-2 (a call of a scope with a budget needs a price and an
// estimate: it is never counted as free)
#[tokio::test(start_paused = true)]
async fn a_budget_needs_a_price_and_an_estimate() {
    let c = AdmissionController::builder()
        .scope(ScopeConfig::new("b").cost(BUDGET, W))
        .build()
        .unwrap();
    let no_price = Call::new(ScopeId::FIRST).with_estimate(TokenEstimate::new(1, 1));
    let e = c.acquire(&no_price, Deadline::NONE).await.unwrap_err();
    assert_eq!(e.kind(), "price_required");
    assert!(e.is_configuration());
    let no_estimate = Call::new(ScopeId::FIRST).with_price(Price::new(1, 1));
    let e = c.acquire(&no_estimate, Deadline::NONE).await.unwrap_err();
    assert_eq!(e.kind(), "token_estimate_required");
    common::assert_idle(&c);
}
