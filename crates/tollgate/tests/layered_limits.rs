//! Several limits on one scope, reserved all or nothing (SPEC Q-1), for
//! every algorithm. All on paused time.

mod common;

use std::time::Duration;

use common::{secs, settle, tokens, within};
use tollgate::config::{Algorithm, DAY, MINUTE, ScopeConfig};
use tollgate::quota::Dimension;
use tollgate::{AdmissionController, Deadline};

/// Availability of (requests/min, tokens/min, tokens/day).
fn avail(c: &AdmissionController) -> [i64; 3] {
    let s = c.snapshot();
    let of = |dimension: Dimension, window: Duration| {
        s.scopes[0]
            .limits
            .iter()
            .find(|l| l.dimension == dimension && l.window == window)
            .map(|l| l.available)
            .expect("limit configured")
    };
    [
        of(Dimension::Requests, MINUTE),
        of(Dimension::Tokens, MINUTE),
        of(Dimension::Tokens, DAY),
    ]
}

fn minus(a: [i64; 3], d: [i64; 3]) -> [i64; 3] {
    [a[0] - d[0], a[1] - d[1], a[2] - d[2]]
}

// proves: Q-1 (a scope with requests/min, tokens/min and tokens/day: a
// demand that fits some limits but not another takes nothing from any,
// whether it is refused at once or waits at the head of the queue; a demand
// that fits all takes 1 request and its tokens from every limit at once)
#[tokio::test(start_paused = true)]
async fn several_limits_are_reserved_all_or_nothing() {
    for algorithm in [
        Algorithm::SlidingWindow,
        Algorithm::TokenBucket { burst: None },
        Algorithm::FixedWindow,
    ] {
        let c = AdmissionController::builder()
            .scope(
                ScopeConfig::new("layered")
                    .requests(3, MINUTE)
                    .tokens(1_000, MINUTE)
                    .tokens(1_200, DAY)
                    .algorithm(algorithm),
            )
            .build()
            .unwrap();
        let a0 = avail(&c);
        assert_eq!(a0, [3, 1_000, 1_200], "{algorithm:?}");

        let first = c.acquire(&tokens(900), Deadline::NONE).await.unwrap();
        let a1 = avail(&c);
        assert_eq!(a1, minus(a0, [1, 900, 900]), "{algorithm:?}");

        // 200 tokens fit the request limit and the day, not the minute.
        let refused = c.acquire(&tokens(200), within(secs(1))).await;
        assert!(refused.is_err(), "{algorithm:?}: {refused:?}");
        assert_eq!(avail(&c), a1, "{algorithm:?}: refused, nothing taken");
        // Waiting at the head of the queue takes nothing either.
        let c2 = c.clone();
        let waiter = tokio::spawn(async move { c2.acquire(&tokens(200), Deadline::NONE).await });
        settle().await;
        assert_eq!(c.snapshot().scopes[0].queued, 1, "{algorithm:?}");
        assert_eq!(avail(&c), a1, "{algorithm:?}: waiting, nothing taken");
        waiter.abort();
        settle().await;
        assert_eq!(avail(&c), a1, "{algorithm:?}: given up, nothing taken");
        drop(first);

        // A minute later the minute limits have room again, the day not.
        tokio::time::advance(MINUTE).await;
        let a2 = avail(&c);
        assert_eq!(a2[0], 3, "{algorithm:?}");
        assert!(a2[1] >= 700 && a2[2] < 700, "{algorithm:?}: {a2:?}");
        let refused = c.acquire(&tokens(700), within(secs(3_600))).await;
        assert!(refused.is_err(), "{algorithm:?}: {refused:?}");
        assert_eq!(
            avail(&c),
            a2,
            "{algorithm:?}: the day refused, nothing taken"
        );

        // A demand that fits every limit takes from every limit.
        let fits = c.acquire(&tokens(250), Deadline::NONE).await.unwrap();
        let a3 = avail(&c);
        assert_eq!(a3, minus(a2, [1, 250, 250]), "{algorithm:?}");

        // The request limit alone can refuse too: the token limits keep
        // their room.
        let more = [
            c.acquire(&tokens(1), Deadline::NONE).await.unwrap(),
            c.acquire(&tokens(1), Deadline::NONE).await.unwrap(),
        ];
        let a4 = avail(&c);
        assert_eq!(a4, minus(a3, [2, 2, 2]), "{algorithm:?}");
        assert_eq!(a4[0], 0);
        let refused = c.acquire(&tokens(1), within(secs(1))).await;
        assert!(refused.is_err(), "{algorithm:?}: {refused:?}");
        assert_eq!(
            avail(&c),
            a4,
            "{algorithm:?}: requests refused, nothing taken"
        );
        drop((fits, more));
    }
}
