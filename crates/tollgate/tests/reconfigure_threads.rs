//! Reconfiguring a controller again and again while many threads admit
//! calls on a real clock (SPEC GW-15 with, POOL-1): asserts
//! invariants only, never timings. Every admission made under a known
//! configuration finds its window (admissions before the reconfiguration
//! included) within that configuration's limit and its pool within that
//! configuration's size; nothing is lost, and everything is idle at the
//! end.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;
use tollgate::config::{ControllerConfig, PoolConfig, ScopeConfig};
use tollgate::{AdmissionController, Call, Deadline, ScopeId, Usage};

use common::assert_idle;

const WINDOW: Duration = Duration::from_millis(20);
/// (requests per window, pool size) in turn.
const CONFIGS: [(u64, u64); 5] = [(6, 2), (12, 4), (3, 1), (9, 3), (12, 1)];
const TASKS: usize = 24;
const ROUNDS: usize = 60;
const RELOADS: usize = 60;

fn config((requests, pool): (u64, u64)) -> ControllerConfig {
    ControllerConfig {
        scopes: vec![ScopeConfig::new("main").requests(requests, WINDOW)],
        pools: vec![PoolConfig::new("p", pool)],
        ..ControllerConfig::default()
    }
}

/// One admission: counted between `before` and `after`; `active` calls
/// held the pool's permits, this one included, once it had its lease.
#[derive(Debug, Clone, Copy)]
struct Seen {
    before: Instant,
    after: Instant,
    active: usize,
}

/// One reconfiguration, applied between `before` and `after`.
#[derive(Debug, Clone, Copy)]
struct Reload {
    before: Instant,
    after: Instant,
    config: (u64, u64),
}

/// A small deterministic generator per task (xorshift64*).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
    }
}

async fn worker(
    c: AdmissionController,
    seed: u64,
    seen: Arc<Mutex<Vec<Seen>>>,
    active: Arc<AtomicUsize>,
) {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let pool = c.pool_id("p").expect("pool p");
    let call = Call {
        pool: Some(pool),
        ..Call::new(ScopeId::FIRST)
    };
    for _ in 0..ROUNDS {
        let before = Instant::now();
        let deadline = Deadline::from_timeout(Some(Duration::from_millis(100)), before);
        let acquire = c.acquire(&call, deadline);
        // Some give up while waiting: nothing may be left behind.
        let lease = if rng.below(8) == 0 {
            match tokio::time::timeout(Duration::from_micros(rng.below(3_000)), acquire).await {
                Ok(r) => r,
                Err(_) => continue,
            }
        } else {
            acquire.await
        };
        let Ok(mut lease) = lease else { continue };
        let now_active = active.fetch_add(1, Ordering::SeqCst) + 1;
        let after = Instant::now();
        seen.lock().push(Seen {
            before,
            after,
            active: now_active,
        });
        tokio::time::sleep(Duration::from_micros(rng.below(2_000))).await;
        lease.reconcile(Usage::from_io(0, 0)).expect("settled once");
        active.fetch_sub(1, Ordering::SeqCst);
        drop(lease);
    }
}

// proves: GW-15, Q-7, Q-9, POOL-1 (reconfigured under load on a real
// clock: no window over the limit in force, no pool over its size, every
// unit and permit back at the end)
#[test]
fn reconfigurations_under_load_keep_every_limit() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(8)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let c = AdmissionController::new(config(CONFIGS[0])).unwrap();
        let start = Instant::now();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let active = Arc::new(AtomicUsize::new(0));
        let workers: Vec<_> = (0..TASKS)
            .map(|t| tokio::spawn(worker(c.clone(), t as u64, seen.clone(), active.clone())))
            .collect();
        let reloader = {
            let c = c.clone();
            tokio::spawn(async move {
                let mut rng = Rng(7);
                let mut reloads = vec![Reload {
                    before: start,
                    after: start,
                    config: CONFIGS[0],
                }];
                for n in 1..=RELOADS {
                    tokio::time::sleep(Duration::from_micros(2_000 + rng.below(10_000))).await;
                    let next = CONFIGS[n % CONFIGS.len()];
                    let before = Instant::now();
                    c.reconfigure(config(next)).expect("a valid configuration");
                    reloads.push(Reload {
                        before,
                        after: Instant::now(),
                        config: next,
                    });
                }
                reloads
            })
        };
        let joined = tokio::time::timeout(Duration::from_secs(120), async {
            for w in workers {
                w.await.expect("worker panicked");
            }
        })
        .await;
        assert!(joined.is_ok(), "admissions stalled");
        let reloads = reloader.await.expect("reloader panicked");
        let seen = std::mem::take(&mut *seen.lock());
        let checked = check(&seen, &reloads);
        println!(
            "{} admitted, {checked} under a known configuration, {} reconfigurations",
            seen.len(),
            reloads.len() - 1
        );
        assert!(
            checked > 0,
            "some admissions fell under a known configuration"
        );

        // Nothing lost: after quiet windows the last configuration is
        // whole again, nothing queued, pending or held.
        tokio::time::sleep(3 * WINDOW).await;
        assert_idle(&c);
        let s = c.snapshot();
        let last = reloads.last().expect("at least the first").config;
        assert_eq!(s.scopes[0].limits[0].available, last.0 as i64, "{s:#?}");
        assert_eq!(
            s.pool_named("p").map(|p| p.available),
            Some(last.1 as usize)
        );
        tokio::time::timeout(Duration::from_secs(10), c.close())
            .await
            .expect("close resolves once every lease is back");
    });
}

/// Checks every admission made certainly under one configuration: its
/// lease started after that reconfiguration ended and before the next one
/// began. The admissions certainly counted in the window ending at its own
/// count (counted after `after - WINDOW`, and done before it began), plus
/// itself, are within the configuration's limit, whatever was admitted
/// under the ones before; the calls holding permits are within its pool.
/// Returns how many were checked.
fn check(seen: &[Seen], reloads: &[Reload]) -> usize {
    let mut checked = 0;
    for j in seen {
        let Some(k) = reloads.iter().rposition(|r| r.after < j.before) else {
            continue;
        };
        if reloads
            .get(k + 1)
            .is_some_and(|next| next.before <= j.after)
        {
            continue;
        }
        let (limit, pool) = reloads[k].config;
        let window = 1 + seen
            .iter()
            .filter(|i| i.before + WINDOW > j.after && i.after <= j.before)
            .count() as u64;
        assert!(
            window <= limit,
            "{window} admissions in one window under a limit of {limit}: {j:?} after {:?}",
            reloads[k]
        );
        assert!(
            j.active <= pool as usize,
            "{} calls held permits of a pool of {pool}: {j:?}",
            j.active
        );
        checked += 1;
    }
    checked
}
