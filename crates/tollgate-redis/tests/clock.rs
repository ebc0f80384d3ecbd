//! Clock independence (SPEC DQ-5): every decision is made on Redis `TIME`;
//! a replica's own clock only stamps the answers it receives, and a wait is
//! relative (`local now + d`), so replicas whose clocks disagree by seconds
//! admit exactly the same and agree on every wait.

mod common;

use std::sync::Arc;
use std::time::Duration;

use tollgate::clock::{Clock, Instant, ManualClock};
use tollgate::config::ScopeConfig;
use tollgate::quota::{Demand, RemoteHold, RemoteQuota};
use tollgate_redis::{RedisBackend, RedisSettings};

use common::BUDGET;

// proves: DQ-5 (the store's results do not depend on local clocks: a
// replica whose clock is a minute ahead and one whose clock stands still
// share one budget exactly, and each gets the same wait relative to its
// own clock)
#[tokio::test]
async fn replicas_with_skewed_clocks_admit_exactly() {
    let Some(server) = common::server("replicas_with_skewed_clocks_admit_exactly") else {
        return;
    };
    let ahead = ManualClock::new(Instant::now() + Duration::from_secs(60));
    let frozen = ManualClock::new(Instant::now());
    let replica = |clock: &ManualClock| {
        RedisBackend::new(
            RedisSettings::new(server.url())
                .prefix("skew")
                .clock(Arc::new(clock.clone())),
        )
        .unwrap()
    };
    let config = ScopeConfig::new(common::unique("skew")).requests(4, Duration::from_secs(30));
    let a = replica(&ahead).open_scope(&config);
    let b = replica(&frozen).open_scope(&config);

    // Four admissions in all, alternating replicas, then both are refused.
    let mut granted = Vec::new();
    for i in 0..4 {
        let store = if i % 2 == 0 { &a } else { &b };
        let r = store
            .reserve(Demand::new(0, 0), RemoteHold::Leased, BUDGET)
            .await
            .unwrap();
        granted.push(r.expect("within the limit"));
    }
    // Ticks are the store's instants: ordered, whatever the local clocks.
    assert!(granted.windows(2).all(|w| w[0].tick <= w[1].tick));
    assert_eq!(granted[0].stamp, ahead.now(), "stamped by its own clock");
    assert_eq!(granted[1].stamp, frozen.now(), "stamped by its own clock");
    let refused_a = a
        .reserve(Demand::new(0, 0), RemoteHold::Leased, BUDGET)
        .await
        .unwrap();
    let refused_b = b
        .reserve(Demand::new(0, 0), RemoteHold::Leased, BUDGET)
        .await
        .unwrap();
    let wait_a = refused_a.expect_err("full").at.unwrap() - ahead.now();
    let wait_b = refused_b.expect_err("full").at.unwrap() - frozen.now();
    // Both waits are the store's: 30 s after the first admission, measured
    // from the store's now (a few ms apart at most), not from the clocks.
    for wait in [wait_a, wait_b] {
        assert!(
            wait > Duration::from_secs(25) && wait <= Duration::from_secs(30),
            "{wait:?}"
        );
    }
    let diff = wait_a.abs_diff(wait_b);
    assert!(diff < Duration::from_secs(1), "waits disagree by {diff:?}");

    // A local clock that jumps ten minutes frees nothing: only the store's
    // clock does.
    frozen.advance(Duration::from_secs(600));
    let again = b
        .reserve(Demand::new(0, 0), RemoteHold::Leased, BUDGET)
        .await
        .unwrap();
    let wait = again.expect_err("still full").at.unwrap() - frozen.now();
    assert!(wait > Duration::from_secs(25), "{wait:?}");
}
