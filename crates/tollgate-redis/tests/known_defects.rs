//! Reproducers of the shared store's open defects (issue 13; docs/redis.md,
//! "Known defects"). Each asserts the rule as it should hold and is
//! `#[ignore]`d until the fix lands: `cargo test -p tollgate-redis
//! --features testing --test known_defects -- --ignored`.

mod common;

use std::sync::Arc;
use std::time::Duration;

use tollgate::config::ScopeConfig;
use tollgate::quota::RemoteBackend;
use tollgate::{AdmissionController, AdmissionError, Call, Deadline, ScopeId};
use tollgate_redis::{RedisBackend, RedisSettings};

// proves: Q-9, DQ-5 (a reservation whose answer the call did not wait for
// is given back: after a Redis stall longer than the call's deadline, with
// no concurrency permit free, nothing stays counted once its windows pass)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "open defect (issue 13): a pending hold whose answer is lost never expires"]
async fn a_pending_reservation_cut_short_by_its_deadline_is_not_lost() {
    let Some(server) =
        common::server("a_pending_reservation_cut_short_by_its_deadline_is_not_lost")
    else {
        return;
    };
    // A store timeout longer than the stall: only the call's own deadline
    // cuts the reservation's round trip short.
    let backend = Arc::new(
        RedisBackend::new(
            RedisSettings::new(server.url())
                .prefix(common::unique("clipped"))
                .timeout(Duration::from_secs(1)),
        )
        .expect("backend"),
    );
    let scope = ScopeConfig::new("clipped").requests(3, Duration::from_millis(500));
    let c = AdmissionController::builder()
        .scope(scope.clone())
        .concurrency(1)
        .shared_store(Arc::clone(&backend) as Arc<dyn RemoteBackend>)
        .build()
        .expect("controller");
    let call = Call::new(ScopeId::FIRST);
    let held = c.acquire(&call, Deadline::NONE).await.expect("first call");
    // Redis stalls for 300 ms (a failover, a slow fsync).
    let mut raw = common::raw(&server).await;
    let () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(300)
        .arg("ALL")
        .query_async(&mut raw)
        .await
        .expect("CLIENT PAUSE");
    let e = c
        .acquire(&call, Deadline::after(Duration::from_millis(100)))
        .await
        .expect_err("deadline first");
    assert!(
        matches!(e, AdmissionError::DeadlineExceeded { .. }),
        "{e:?}"
    );
    drop(held);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let limits = backend
        .open(&scope)
        .snapshot(Duration::from_secs(5))
        .await
        .expect("snapshot");
    assert_eq!(limits[0].available, 3, "a unit stays counted for good");
}
