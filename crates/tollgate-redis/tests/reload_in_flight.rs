//! A reload that adds a token limit or a spend budget to a shared scope
//! while a call is in flight: the call settles through the store handle it
//! was admitted with, which has no such limit, yet what it used beyond
//! its estimate must count in the new limit as it does in process (the
//! in-process scope, run through the same steps in the same test, is the
//! reference). Real `redis-server`, real clock, multi-threaded runtime.

mod common;

use std::sync::Arc;
use std::time::Duration;

use tollgate::config::{ControllerConfig, MINUTE, ScopeConfig};
use tollgate::quota::{Dimension, RemoteBackend};
use tollgate::{
    AdmissionController, Call, Deadline, Price, RefusalCost, ScopeId, TokenEstimate, Usage,
};

fn config(scope: ScopeConfig) -> ControllerConfig {
    ControllerConfig {
        scopes: vec![scope],
        ..ControllerConfig::default()
    }
}

/// How the in-flight call ends.
#[derive(Debug, Clone, Copy)]
enum End {
    /// Reconciled with this usage (input, output).
    Used(u64, u64),
    /// Reconciled with an unknown usage.
    Unknown,
    /// Refused by the provider, which charged nothing.
    Refused,
    /// Dropped without a settlement.
    Dropped,
}

/// One dimension a reload adds, the call that is in flight through it,
/// and the price that values its usage.
struct Case {
    dimension: Dimension,
    added: ScopeConfig,
    call: Call,
    price: Price,
}

/// 1 micro-dollar per token, in and out.
const PRICE: Price = Price::new(1_000_000, 1_000_000);

fn base() -> ScopeConfig {
    ScopeConfig::new("main").requests(10, MINUTE)
}

fn cases() -> Vec<Case> {
    let estimated = Call::new(ScopeId::FIRST).with_estimate(TokenEstimate::new(10, 0));
    vec![
        Case {
            dimension: Dimension::Tokens,
            added: base().tokens(100, MINUTE),
            call: estimated,
            price: PRICE,
        },
        Case {
            dimension: Dimension::Cost,
            added: base().cost(100, MINUTE),
            call: estimated.with_price(PRICE),
            price: PRICE,
        },
    ]
}

/// Runs the steps on `c` (a call in flight, a reload adding `case`'s
/// limit, the call ending as `end`) and returns what the added dimension
/// and the requests have available afterwards.
async fn run(
    c: &AdmissionController,
    case: &Case,
    end: End,
    shared: bool,
) -> (Option<u64>, Option<u64>) {
    let mut lease = c
        .acquire(&case.call, Deadline::NONE)
        .await
        .expect("admitted");
    c.reconfigure(config(case.added.clone())).expect("reload");
    match end {
        End::Used(input, output) => {
            let usage = Usage::from_io(input, output).priced(&case.price);
            lease.reconcile(usage).expect("first settlement");
        }
        End::Unknown => {
            lease.reconcile(Usage::UNKNOWN).expect("first settlement");
        }
        End::Refused => lease.refused(RefusalCost::Free).expect("first settlement"),
        End::Dropped => {}
    }
    drop(lease);
    // Waits for every settlement to land.
    tokio::time::timeout(Duration::from_secs(10), c.close())
        .await
        .expect("close resolves");
    assert_eq!(c.snapshot().scopes[0].counters.settlements_failed, 0);
    let limits = if shared {
        c.shared_limits(ScopeId::FIRST)
            .await
            .expect("shared")
            .expect("answered")
    } else {
        c.snapshot().scopes[0].limits.clone()
    };
    let available = |d: Dimension| {
        limits
            .iter()
            .find(|l| l.dimension == d)
            .and_then(|l| u64::try_from(l.available).ok())
    };
    (available(case.dimension), available(Dimension::Requests))
}

// proves: GW-15, Q-9 (calls in flight across a reload keep being settled
// as in process: a token limit the reload added to a shared scope counts
// what an in-flight call used beyond its estimate, 80 of 100 tokens, as
// the in-process scope does, not nothing; a usage below the estimate, an
// unknown usage, a free refusal or a lease dropped unsettled count nothing
// there, in both), BUD-2 (the same for a spend budget the reload added:
// the in-flight call's spend beyond its worst case counts against it, so
// replicas never spend past it by what calls in flight at a reload spend)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_a_reload_adds_counts_what_calls_in_flight_use_as_in_process() {
    let Some(server) = common::server("reload_in_flight") else {
        return;
    };
    for case in cases() {
        for end in [
            End::Used(40, 50),
            End::Used(3, 2),
            End::Unknown,
            End::Refused,
            End::Dropped,
        ] {
            let local = AdmissionController::builder()
                .config(config(base()))
                .build()
                .expect("controller");
            let expected = run(&local, &case, end, false).await;
            let backend: Arc<dyn RemoteBackend> =
                Arc::new(common::backend(&server, &common::unique("in-flight")));
            let shared = AdmissionController::builder()
                .config(config(base()))
                .shared_store(backend)
                .build()
                .expect("controller");
            let got = run(&shared, &case, end, true).await;
            assert_eq!(got, expected, "{:?} {end:?}", case.dimension);
        }
    }
}

/// The figures the in-process scope gives, for the record: 80 of the 90
/// units used beyond the 10 estimated count in the added limit.
#[tokio::test]
async fn in_process_counts_the_debt_of_a_call_in_flight_in_an_added_limit() {
    for case in cases() {
        let local = AdmissionController::builder()
            .config(config(base()))
            .build()
            .expect("controller");
        let got = run(&local, &case, End::Used(40, 50), false).await;
        assert_eq!(got, (Some(20), Some(9)), "{:?}", case.dimension);
    }
}
