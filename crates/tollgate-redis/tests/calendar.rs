//! Calendar windows on a shared scope (SPEC BUD-3, DQ-1): the store keeps
//! no calendar and counts one as a sliding window of its longest period
//! (docs/redis.md), so two replicas sharing a scope's "per day" limit
//! admit at most its amount between them. Real `redis-server`.

mod common;

use std::sync::Arc;
use std::time::Duration;

use tollgate::config::{Calendar, ControllerConfig, Limit, Period, ScopeConfig, Zone};
use tollgate::quota::{Dimension, RemoteBackend};
use tollgate::{AdmissionController, AdmissionError, Call, Deadline, ScopeId};

// proves: BUD-3, DQ-1, Q-7 (a calendar day limit of a shared scope is
// accepted and holds across two replicas: 5 requests per day (Paris), 3
// admitted by one replica and 2 by the other, the sixth refused by either
// with the instant room frees, since none frees within its deadline)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_calendar_day_is_shared_by_replicas() {
    let Some(server) = common::server("calendar") else {
        return;
    };
    let day = Calendar::new(Period::Day).zone(Zone::named("Europe/Paris").expect("zone"));
    let scope =
        ScopeConfig::new(common::unique("calendar")).limit(Limit::per(Dimension::Requests, 5, day));
    let replica = || {
        let backend: Arc<dyn RemoteBackend> = Arc::new(common::backend(&server, "calendar"));
        AdmissionController::builder()
            .config(ControllerConfig {
                scopes: vec![scope.clone()],
                ..ControllerConfig::default()
            })
            .shared_store(backend)
            .build()
            .expect("a calendar window on a shared scope is accepted")
    };
    let (a, b) = (replica(), replica());
    let call = Call::new(ScopeId::FIRST);
    let soon = || Deadline::after(Duration::from_secs(2));
    let mut held = Vec::new();
    for (c, n) in [(&a, 3), (&b, 2)] {
        for _ in 0..n {
            held.push(c.acquire(&call, soon()).await.expect("room"));
        }
    }
    for c in [&a, &b] {
        let sixth = c.acquire(&call, soon()).await;
        assert!(
            matches!(
                sixth,
                Err(AdmissionError::DeadlineExceeded {
                    retry_at: Some(_),
                    ..
                })
            ),
            "a sixth request of a 5 per day limit: {sixth:?}"
        );
    }
    drop(held);
}

// proves: DQ-1, CFG-3 (two limits of a shared scope that the store would
// count as one, same dimension, arithmetic and window once a calendar
// window is its longest sliding window, are a located configuration error:
// a day in Paris (25 hours) beside a rolling 25 hours; a day in Paris
// beside a rolling day is not, since they are counted apart)
#[tokio::test]
async fn limits_the_store_would_count_as_one_are_refused() {
    let Some(server) = common::server("calendar_duplicates") else {
        return;
    };
    let day = Calendar::new(Period::Day).zone(Zone::named("Europe/Paris").expect("zone"));
    let build = |second: Limit| {
        let backend: Arc<dyn RemoteBackend> = Arc::new(common::backend(&server, "dup"));
        let scope = ScopeConfig::new("acct")
            .limit(Limit::per(Dimension::Requests, 5, day))
            .limit(second);
        AdmissionController::builder()
            .config(ControllerConfig {
                scopes: vec![scope],
                ..ControllerConfig::default()
            })
            .shared_store(backend)
            .build()
    };
    let hours = |h: u64| Duration::from_secs(h * 3_600);
    let err = build(Limit::new(Dimension::Requests, 9, hours(25))).expect_err("one count");
    assert_eq!(err.field, "scopes.acct.limits[1]", "{err}");
    build(Limit::new(Dimension::Requests, 9, hours(24))).expect("counted apart");
    build(Limit::new(Dimension::Tokens, 9, hours(25))).expect("another dimension");
}
