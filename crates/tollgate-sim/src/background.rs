//! The background consumer: another client of the same account, invisible
//! to the client under test except through the `x-ratelimit-*` headers.
//!
//! With `background_rpm = N` and `background_tpm = M` over a window `W`, it
//! ticks every `ceil(W / N)` of tokio time, starting one period after it
//! starts. Tick `k` (counted modulo `N`) spends one request unit and
//! `floor((k + 1)·M / N) − floor(k·M / N)` tokens, so every `N` consecutive
//! ticks spend exactly `M` tokens. A tick is all or nothing: when either
//! window lacks room for it, it is skipped (not made up later). A late tick
//! is not made up either: the next one is due a full period after the
//! instant this one was recorded, so recorded ticks are never closer than
//! the period and at most `N` of them fall in any window (a late tick
//! makes the consumer spend a little less, never more).

use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::task::AbortHandle;

use crate::state::Shared;

/// Spawns the consumer of `shared` (which must have `background_rpm`). The
/// task holds only a weak reference and ends when the state is dropped.
pub(crate) fn spawn(shared: &Arc<Shared>) -> AbortHandle {
    let ticks = shared.config.background_rpm.unwrap_or(1).max(1);
    let tokens = shared.config.background_tpm.unwrap_or(0);
    let period = period(shared.config.window, ticks);
    let weak = Arc::downgrade(shared);
    tokio::spawn(run(weak, period, ticks, tokens)).abort_handle()
}

/// `ceil(window / ticks)`, at least one nanosecond.
fn period(window: Duration, ticks: u64) -> Duration {
    let nanos = window.as_nanos().div_ceil(u128::from(ticks)).max(1);
    Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
}

/// Tokens spent by tick `k` (`k < ticks`) when `tokens` are spread over
/// `ticks` ticks.
pub(crate) fn tick_tokens(k: u64, ticks: u64, tokens: u64) -> u64 {
    let share = |i: u64| u128::from(i) * u128::from(tokens) / u128::from(ticks.max(1));
    u64::try_from(share(k + 1) - share(k)).unwrap_or(u64::MAX)
}

async fn run(shared: Weak<Shared>, period: Duration, ticks: u64, tokens: u64) {
    let mut next = tokio::time::Instant::now() + period;
    let mut k = 0;
    loop {
        tokio::time::sleep_until(next).await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        shared.background_tick(tick_tokens(k, ticks, tokens));
        // Read after the tick was recorded: the next one is at least a
        // period after it, however late this one came.
        next = tokio::time::Instant::now() + period;
        k = (k + 1) % ticks;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // proves: SIM-2 (the background consumer spreads exactly M tokens over N ticks)
    #[test]
    fn ticks_spread_the_tokens_exactly() {
        for (ticks, tokens) in [(3, 10), (7, 1000), (10, 3), (1, 5), (4, 0)] {
            let spent: Vec<u64> = (0..ticks).map(|k| tick_tokens(k, ticks, tokens)).collect();
            assert_eq!(spent.iter().sum::<u64>(), tokens, "{ticks} {tokens}");
            let (min, max) = (spent.iter().min(), spent.iter().max());
            assert!(max.zip(min).is_some_and(|(a, b)| a - b <= 1), "{spent:?}");
        }
        assert_eq!(
            period(Duration::from_secs(1), 3),
            Duration::from_nanos(333_333_334)
        );
        assert_eq!(period(Duration::from_secs(60), 60), Duration::from_secs(1));
    }
}
