//! A reload that adds a token limit or a spend budget to a shared scope
//! while a call is in flight: the call settles through the store handle it
//! was admitted with, which has no such limit, yet what it used beyond
//! its estimate, and its estimate once the provider's count is known
//! (`counted_by`, SPEC Q-15), must count in the new limit as they do in
//! process (the in-process scope, run through the same steps in the same
//! test, is the reference). Real `redis-server`, real clock, multi-threaded runtime:
//! every comparison is of what each store counts once the steps are
//! done (windows of a minute or more, which these steps never cross),
//! never of timings.

mod common;

use std::sync::Arc;
use std::time::Duration;

use tollgate::clock::Instant;
use tollgate::config::{Algorithm, ControllerConfig, DAY, MINUTE, ScopeConfig};
use tollgate::quota::{Dimension, RemoteBackend, RemoteQuota, Unavailable};
use tollgate::{
    AdmissionController, Call, Deadline, Lease, Price, RefusalCost, ScopeId, TokenEstimate, Usage,
};
use tollgate_redis::{RedisBackend, RedisServer};

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
    /// Refused by the provider, which charged this much.
    Refused(RefusalCost),
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

/// When the provider counted the call in flight (SPEC Q-15), as its
/// lease is told after the reload.
#[derive(Debug, Clone, Copy)]
enum Counted {
    /// Not told.
    Never,
    /// At an instant after the reload: the limits the reload added count
    /// the call as theirs from then on.
    AfterReload,
    /// At an instant between its lease and the reload: they count its
    /// estimate from then, and the call stays one from before them.
    BeforeReload,
    /// After the reload, then told again, at an instant later than the
    /// added limits' slot of the first (a minute's 512th): they move the
    /// estimate there, where a settlement then finds it.
    AfterReloadTwice,
}

/// Every limit a scope reports: dimension, window and what it has
/// available, in a stable order.
type Limits = Vec<(String, Duration, Option<u64>)>;

/// Ends `lease` as `end` (a usage priced by `price`), waits for every
/// settlement to land (closing `c`, none failed) and returns what every
/// limit of the scope (in Redis if `shared`) has available.
async fn end_and_read(
    c: &AdmissionController,
    mut lease: Lease,
    end: End,
    price: &Price,
    shared: bool,
) -> Limits {
    match end {
        End::Used(input, output) => {
            let usage = Usage::from_io(input, output).priced(price);
            lease.reconcile(usage).expect("first settlement");
        }
        End::Unknown => {
            lease.reconcile(Usage::UNKNOWN).expect("first settlement");
        }
        End::Refused(cost) => lease.refused(cost).expect("first settlement"),
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
    let mut out: Limits = limits
        .iter()
        .map(|l| {
            let available = u64::try_from(l.available).ok();
            (format!("{:?}", l.dimension), l.window, available)
        })
        .collect();
    out.sort();
    out
}

/// Runs the steps on `c` (a call in flight, a reload to `case`'s limits,
/// the provider counting the call as `counted` says, the call ending as
/// `end`) and returns what every limit has available afterwards.
async fn steps(
    c: &AdmissionController,
    case: &Case,
    counted: Counted,
    end: End,
    shared: bool,
) -> Limits {
    let mut lease = c
        .acquire(&case.call, Deadline::NONE)
        .await
        .expect("admitted");
    // Instants a few milliseconds apart: the lease's, the provider's
    // count, the reload's.
    tokio::time::sleep(Duration::from_millis(3)).await;
    let before = Instant::now();
    tokio::time::sleep(Duration::from_millis(3)).await;
    c.reconfigure(config(case.added.clone())).expect("reload");
    tokio::time::sleep(Duration::from_millis(3)).await;
    match counted {
        Counted::Never => {}
        Counted::AfterReload => lease.counted_by(Instant::now()),
        Counted::BeforeReload => lease.counted_by(before),
        Counted::AfterReloadTwice => {
            lease.counted_by(Instant::now());
            tokio::time::sleep(MINUTE / 512 + Duration::from_millis(30)).await;
            lease.counted_by(Instant::now());
        }
    }
    end_and_read(c, lease, end, &case.price, shared).await
}

/// [`steps`] without a recount: what the added dimension and the
/// requests (per minute) have available afterwards.
async fn run(
    c: &AdmissionController,
    case: &Case,
    end: End,
    shared: bool,
) -> (Option<u64>, Option<u64>) {
    let limits = steps(c, case, Counted::Never, end, shared).await;
    let available = |d: Dimension, window: Duration| {
        let d = format!("{d:?}");
        limits
            .iter()
            .find(|l| l.0 == d && l.1 == window)
            .and_then(|l| l.2)
    };
    (
        available(case.dimension, MINUTE),
        available(Dimension::Requests, MINUTE),
    )
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
            End::Refused(RefusalCost::Free),
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

/// The cases of a recount: the added token limit and spend budget, and a
/// new window of a limited dimension (requests per day beside requests
/// per minute: seeded with what the minute counts, the call's request).
fn recounted_cases() -> Vec<Case> {
    let mut cases = cases();
    cases.push(Case {
        dimension: Dimension::Requests,
        added: base().requests(100, DAY),
        call: Call::new(ScopeId::FIRST).with_estimate(TokenEstimate::new(10, 0)),
        price: PRICE,
    });
    cases
}

/// Every way a recounted call can end.
const ENDS: [End; 7] = [
    End::Dropped,
    End::Used(40, 50),
    End::Used(3, 2),
    End::Unknown,
    End::Refused(RefusalCost::Free),
    End::Refused(RefusalCost::Request),
    End::Refused(RefusalCost::Full),
];

/// A Redis backend whose every script runs `runs` times in a row under
/// one name, as a retry after a lost answer runs it (SPEC DQ-6).
#[derive(Debug)]
struct Repeated {
    backend: RedisBackend,
    runs: u32,
}

impl RemoteBackend for Repeated {
    fn open(&self, scope: &ScopeConfig) -> Arc<dyn RemoteQuota> {
        let quota = self.backend.open_scope(scope);
        quota.set_runs(self.runs);
        Arc::new(quota)
    }

    fn timeout(&self) -> Duration {
        self.backend.timeout()
    }

    fn on_unavailable(&self) -> Unavailable {
        self.backend.on_unavailable()
    }

    fn name(&self) -> &'static str {
        self.backend.name()
    }
}

/// The ends of a call recounted twice: where the second recount left its
/// estimate is where a settlement looks for it.
const TWICE: [End; 4] = [
    End::Dropped,
    End::Used(40, 50),
    End::Used(3, 2),
    End::Refused(RefusalCost::Free),
];

/// Runs every recounted case to every end, counted as `counted` says, on
/// both stores (every script of the shared one run `runs` times), and
/// compares what every limit has available afterwards.
async fn compare_recounted(server: &RedisServer, counted: Counted, runs: u32, ends: &[End]) {
    let cases = recounted_cases().into_iter().map(|c| (base(), c));
    compare_recounted_in(server, counted, runs, ends, cases.collect()).await;
}

/// [`compare_recounted`] for `cases`, each with the limits before the
/// reload.
async fn compare_recounted_in(
    server: &RedisServer,
    counted: Counted,
    runs: u32,
    ends: &[End],
    cases: Vec<(ScopeConfig, Case)>,
) {
    let mut differ = Vec::new();
    for (before, case) in cases {
        for &end in ends {
            let local = AdmissionController::builder()
                .config(config(before.clone()))
                .build()
                .expect("controller");
            let expected = steps(&local, &case, counted, end, false).await;
            let backend: Arc<dyn RemoteBackend> = Arc::new(Repeated {
                backend: common::backend(server, &common::unique("recounted")),
                runs,
            });
            let shared = AdmissionController::builder()
                .config(config(before.clone()))
                .shared_store(backend)
                .build()
                .expect("controller");
            let got = steps(&shared, &case, counted, end, true).await;
            if got != expected {
                differ.push(format!(
                    "{:?} {end:?}: shared {got:?}, in process {expected:?}",
                    case.dimension
                ));
            }
        }
    }
    assert!(differ.is_empty(), "{counted:?}:\n{}", differ.join("\n"));
}

// proves: Q-15, GW-15, Q-9 (a call in flight at a reload that the
// provider counted after it: a limit the reload added to a shared scope
// counts its estimate from the provider's instant, as in process, and
// takes it as its own from then on: a usage above or below the estimate
// moves it there, an unknown usage, a full refusal or a lease dropped
// unsettled keep it, a refusal that charged nothing gives it back; so
// the added limit never admits one estimate more than in process, the
// tokens limit, the spend budget or a new window of requests alike),
// BUD-2 (the same for the spend budget)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_a_reload_adds_counts_a_call_counted_after_it_as_in_process() {
    let Some(server) = common::server("recounted_after_reload") else {
        return;
    };
    compare_recounted(&server, Counted::AfterReload, 1, &ENDS).await;
}

// proves: Q-15, GW-15 (a call in flight at a reload, told twice after it
// when the provider counted it, the second time a slot later: the limits
// the reload added move its estimate there, as in process, and a usage
// below it gives back there what it does in process)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_a_reload_adds_moves_a_call_counted_twice_after_it_as_in_process() {
    let Some(server) = common::server("recounted_twice_after_reload") else {
        return;
    };
    compare_recounted(&server, Counted::AfterReloadTwice, 1, &TWICE).await;
}

// proves: Q-15, GW-15, Q-9 (a call in flight at a reload that the
// provider counted before it, its lease told after: a limit the reload
// added to a shared scope counts its estimate from the provider's
// instant, as in process, but the call stays one from before the limit:
// a usage above the estimate counts the difference, and nothing given
// back there, as in process)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_a_reload_adds_counts_a_call_counted_before_it_as_in_process() {
    let Some(server) = common::server("recounted_before_reload") else {
        return;
    };
    compare_recounted(&server, Counted::BeforeReload, 1, &ENDS).await;
}

// proves: DQ-6, Q-15, GW-15 (the settlements of a recounted call in
// flight at a reload, each script run twice under its name as a retry
// after a lost answer runs it, count in the limits the reload added what
// they count once, as in process)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recounted_call_in_flight_at_a_reload_settled_twice_counts_once() {
    let Some(server) = common::server("recounted_twice") else {
        return;
    };
    compare_recounted(&server, Counted::AfterReload, 2, &ENDS).await;
    compare_recounted(&server, Counted::BeforeReload, 2, &ENDS).await;
    compare_recounted(&server, Counted::AfterReloadTwice, 2, &TWICE).await;
}

/// The figures the in-process scope gives for a recounted call, for the
/// record: the added token limit of 100 counts the estimate of 10 from
/// the provider's instant (90 left), then, counted after the reload, as
/// its own (a usage of 90 leaves 10, of 5 leaves 95, a free refusal 100),
/// counted before it, as a call from before the limit (a usage of 90
/// leaves 10, of 5 or a free refusal still 90).
#[tokio::test]
async fn in_process_counts_a_recounted_call_in_flight_in_an_added_limit() {
    let case = cases().remove(0);
    let figures = [
        (Counted::AfterReload, End::Dropped, 90),
        (Counted::AfterReload, End::Used(40, 50), 10),
        (Counted::AfterReload, End::Used(3, 2), 95),
        (Counted::AfterReload, End::Refused(RefusalCost::Free), 100),
        (Counted::BeforeReload, End::Dropped, 90),
        (Counted::BeforeReload, End::Used(40, 50), 10),
        (Counted::BeforeReload, End::Used(3, 2), 90),
        (Counted::BeforeReload, End::Refused(RefusalCost::Free), 90),
    ];
    for (counted, end, tokens) in figures {
        let local = AdmissionController::builder()
            .config(config(base()))
            .build()
            .expect("controller");
        let got = steps(&local, &case, counted, end, false).await;
        let added = got.iter().find(|l| l.0 == "Tokens").and_then(|l| l.2);
        assert_eq!(added, Some(tokens), "{counted:?} {end:?}");
    }
}

/// Runs a call in flight across two reloads, the first to `first`, the
/// second to `second`, its lease told after each when the provider
/// counted it (the second time a slot later), then ending as `end`; what
/// every limit has available afterwards.
async fn across_two_reloads(
    c: &AdmissionController,
    (first, second): (&ScopeConfig, &ScopeConfig),
    call: &Call,
    end: End,
    shared: bool,
) -> Limits {
    let mut lease = c.acquire(call, Deadline::NONE).await.expect("admitted");
    tokio::time::sleep(Duration::from_millis(3)).await;
    c.reconfigure(config(first.clone())).expect("first reload");
    tokio::time::sleep(Duration::from_millis(3)).await;
    lease.counted_by(Instant::now());
    tokio::time::sleep(MINUTE / 512 + Duration::from_millis(30)).await;
    c.reconfigure(config(second.clone()))
        .expect("second reload");
    tokio::time::sleep(Duration::from_millis(3)).await;
    lease.counted_by(Instant::now());
    end_and_read(c, lease, end, &PRICE, shared).await
}

// proves: Q-15, GW-15, Q-9 (a call in flight across two reloads, its
// lease told after each when the provider counted it: the limits the
// second reload added count its estimate from the second instant and
// take it as their own, as in process, whether the first reload added
// limits of its own or changed none, so a usage below the estimate or a
// free refusal gives back there what it does in process; each script
// run once and twice under its name, DQ-6)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_recounted_after_each_of_two_reloads_settles_as_in_process() {
    let Some(server) = common::server("recounted_after_two_reloads") else {
        return;
    };
    let call = Call::new(ScopeId::FIRST)
        .with_estimate(TokenEstimate::new(10, 0))
        .with_price(PRICE);
    let reloads = [
        // The first reload changes no limit.
        (base(), base().tokens(100, MINUTE)),
        // Each adds one.
        (
            base().tokens(100, MINUTE),
            base().tokens(100, MINUTE).cost(100, MINUTE),
        ),
    ];
    let mut differ = Vec::new();
    for (first, second) in &reloads {
        for runs in [1, 2] {
            for &end in &ENDS {
                let local = AdmissionController::builder()
                    .config(config(base()))
                    .build()
                    .expect("controller");
                let expected = across_two_reloads(&local, (first, second), &call, end, false).await;
                let backend: Arc<dyn RemoteBackend> = Arc::new(Repeated {
                    backend: common::backend(&server, &common::unique("two-reloads")),
                    runs,
                });
                let shared = AdmissionController::builder()
                    .config(config(base()))
                    .shared_store(backend)
                    .build()
                    .expect("controller");
                let got = across_two_reloads(&shared, (first, second), &call, end, true).await;
                if got != expected {
                    differ.push(format!(
                        "{first:?} -> {second:?}, runs {runs}, {end:?}: shared {got:?}, in process {expected:?}"
                    ));
                }
            }
        }
    }
    assert!(differ.is_empty(), "{}", differ.join("\n"));
}

/// A new window of a dimension the scope limits already, and the limits
/// before the reload: the reload seeds it with what the old window of its
/// dimension counts, the call in flight included (a request per day
/// beside the request per minute; tokens per day beside tokens per
/// minute).
fn new_window_cases() -> Vec<(ScopeConfig, Case)> {
    let call = Call::new(ScopeId::FIRST).with_estimate(TokenEstimate::new(10, 0));
    let tokens = base().tokens(100, MINUTE);
    vec![
        (
            base(),
            Case {
                dimension: Dimension::Requests,
                added: base().requests(100, DAY),
                call,
                price: PRICE,
            },
        ),
        (
            tokens.clone(),
            Case {
                dimension: Dimension::Tokens,
                added: tokens.tokens(1000, DAY),
                call,
                price: PRICE,
            },
        ),
    ]
}

// proves: GW-15, Q-9, Q-16, DQ-6 (a call in flight at a reload that adds
// a window beside one of the same dimension, never recounted, settled
// through its pre-reload handle before the reloaded handle has run a
// script: the new window, seeded from the old one, holds the call as the
// in-process scope's, seeded at the reload, does; a refusal or a usage
// below the estimate no longer settles before the seed and leaves it
// out (a request per day: 100 available after a free refusal, 99 in
// process; tokens per day: 1000 after a free refusal, 995 after a usage
// of 5, 990 in process), nor a usage above it counts its excess twice
// (830 after a usage of 90, 910 in process); each script run twice
// alike)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_window_counts_a_call_in_flight_settled_before_its_first_script_as_in_process() {
    let Some(server) = common::server("new_window_in_flight") else {
        return;
    };
    compare_recounted_in(&server, Counted::Never, 1, &ENDS, new_window_cases()).await;
    compare_recounted_in(&server, Counted::Never, 2, &ENDS, new_window_cases()).await;
}

/// A token bucket a reload adds to a token-bucket scope, whose spend
/// budget is a sliding window (which moves a recounted call, so that the
/// bucket adopts it), and the limits before the reload.
fn added_bucket() -> Vec<(ScopeConfig, Case)> {
    let before = base()
        .cost(100, MINUTE)
        .algorithm(Algorithm::TokenBucket { burst: None });
    let call = Call::new(ScopeId::FIRST)
        .with_estimate(TokenEstimate::new(10, 0))
        .with_price(PRICE);
    vec![(
        before.clone(),
        Case {
            dimension: Dimension::Tokens,
            added: before.tokens(100, MINUTE),
            call,
            price: PRICE,
        },
    )]
}

// proves: Q-15, GW-15, Q-9, Q-7 (a token bucket a reload added to a
// shared scope takes the estimate of a call in flight at the reload
// that the provider counted after it, as in process, and a usage below
// it or a refusal gives back only that: never tokens it did not take.
// Counted after the reload and dropped, the bucket had 100 of 100
// tokens available in Redis, 90 in process; a usage of 90 left 20, 10
// in process; counted before the reload it takes nothing in both)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_a_reload_adds_takes_a_call_counted_after_it_as_in_process() {
    let Some(server) = common::server("added_bucket") else {
        return;
    };
    for counted in [Counted::AfterReload, Counted::BeforeReload] {
        compare_recounted_in(&server, counted, 1, &ENDS, added_bucket()).await;
    }
    compare_recounted_in(
        &server,
        Counted::AfterReloadTwice,
        1,
        &TWICE,
        added_bucket(),
    )
    .await;
    compare_recounted_in(&server, Counted::AfterReload, 2, &ENDS, added_bucket()).await;
}
