//! What a scope reopened with other limits carries over (SPEC GW-15,
//! DQ-8): the in-process store's reconfiguration (`quota/local/
//! reconfigure.rs` in the engine), on Redis keys.
//!
//! A limit's key names its algorithm, dimension and window, not its amount
//! (`limits.rs`): a reload that changes an amount or a bucket's burst
//! keeps reading the same count. A reload that changes a window or the
//! algorithm gives the new limit a key of its own, so the backend
//! remembers the limits each scope was last opened with, and the new
//! handle
//!
//! * names a limit in force before (kept or replaced) as the *source* of
//!   each new limit of its dimension (the one whose window covers the new
//!   window best, as the in-process store chooses): the first script to
//!   find the new limit's state missing seeds it with what the source
//!   counts, as admitted then (`common.lua`, Seeds), so a longer window
//!   cannot admit its whole amount again;
//! * keeps each replaced limit that is such a source as a *transitional*
//!   one for one of its windows: passed to every script with the new
//!   limits, it still counts and bounds new admissions, so no window that
//!   holds admissions from before the reload admits more than either
//!   configuration would. A replaced limit that seeds nothing (its
//!   dimension no longer limited) goes, as in the in-process store.
//!
//! A new limit whose window is at least as long as its replaced source's
//! also keeps counting at least what the source counts, at every operation
//! (`common.lua`, Seeds): an idempotent floor, not a second seed, so a
//! window reloaded back to one whose key still lives, a call settled
//! through a handle opened before the reload and a replica not reloaded
//! yet are all counted in the longer window.
//!
//! Within one process only: a process started with other windows than the
//! one before it has nothing to carry (docs/redis.md, "Reloads").

use std::collections::HashMap;
use std::time::Duration;

use parking_lot::Mutex;
use tollgate::clock::Instant;

use crate::limits::LimitParams;

/// The limits each scope of a backend was last opened with.
#[derive(Debug, Default)]
pub(crate) struct Opened {
    scopes: Mutex<HashMap<String, Vec<Entry>>>,
}

#[derive(Debug, Clone)]
struct Entry {
    params: LimitParams,
    /// `None`: one of the scope's limits; else transitional until then.
    until: Option<Instant>,
}

/// What a handle carries over from the scope's previous limits.
#[derive(Debug, Default)]
pub(crate) struct Carried {
    /// The replaced limits still in force, each until its instant.
    pub(crate) transitional: Vec<(LimitParams, Instant)>,
    /// For each of the new limits, the limit it is seeded from: an index
    /// into the new limits followed by `transitional` (a kept limit, or
    /// a replaced one, as the in-process store's `source` chooses).
    pub(crate) sources: Vec<Option<usize>>,
}

impl Opened {
    /// Records `limits` as `scope`'s at `now`, and returns what they carry
    /// over from the limits it was opened with before.
    pub(crate) fn open(&self, scope: &str, limits: &[LimitParams], now: Instant) -> Carried {
        let mut scopes = self.scopes.lock();
        let before = scopes.remove(scope).unwrap_or_default();
        let has = |list: &[LimitParams], l: &LimitParams| {
            list.iter().any(|o| o.key_suffix() == l.key_suffix())
        };
        let mut carried = Carried::default();
        // Replaced limits that were in force become transitional for one
        // of their windows (those that seed a new limit, below); older
        // transitional ones keep their end.
        let mut replaced: Vec<usize> = Vec::new();
        let mut kept: Vec<LimitParams> = Vec::new();
        for e in &before {
            let until = e
                .until
                .unwrap_or_else(|| after(now, e.params.config_window));
            if until <= now || has(limits, &e.params) || has(&kept, &e.params) {
                continue;
            }
            if e.until.is_none() {
                replaced.push(carried.transitional.len());
            }
            kept.push(e.params.clone());
            carried.transitional.push((e.params.clone(), until));
        }
        let in_force: Vec<LimitParams> = before
            .iter()
            .filter(|e| e.until.is_none())
            .map(|e| e.params.clone())
            .collect();
        // Every limit in force before is a candidate source (as in the
        // in-process store): a kept one (among the new limits) or a
        // replaced one (among the transitional ones, after them).
        let mut candidates: Vec<(LimitParams, usize)> = limits
            .iter()
            .enumerate()
            .filter(|(_, l)| has(&in_force, l))
            .map(|(j, l)| (l.clone(), j))
            .collect();
        candidates.extend(
            replaced
                .iter()
                .map(|&k| (carried.transitional[k].0.clone(), limits.len() + k)),
        );
        carried.sources = limits
            .iter()
            .map(|l| {
                if before.is_empty() || has(&in_force, l) {
                    return None;
                }
                source(&candidates, l)
            })
            .collect();
        // A replaced limit that seeds none of the new ones goes, as in the
        // in-process store (its dimension is no longer limited, or only by
        // limits it does not cover): kept transitional, it would refuse
        // what the running configuration admits.
        let n = limits.len();
        let seeds = |k: usize| carried.sources.contains(&Some(n + k));
        let stays: Vec<bool> = (0..carried.transitional.len())
            .map(|k| !replaced.contains(&k) || seeds(k))
            .collect();
        let mut moved = vec![None; stays.len()];
        let mut next = 0;
        for (k, &stay) in stays.iter().enumerate() {
            if stay {
                moved[k] = Some(next);
                next += 1;
            }
        }
        for s in &mut carried.sources {
            if let Some(i) = *s
                && i >= n
            {
                *s = moved[i - n].map(|k| n + k);
            }
        }
        let mut k = 0;
        carried.transitional.retain(|_| {
            k += 1;
            stays[k - 1]
        });
        let mut now_open: Vec<Entry> = limits
            .iter()
            .map(|l| Entry {
                params: l.clone(),
                until: None,
            })
            .collect();
        now_open.extend(carried.transitional.iter().map(|(p, until)| Entry {
            params: p.clone(),
            until: Some(*until),
        }));
        scopes.insert(scope.to_owned(), now_open);
        carried
    }
}

/// `window` after `now`; a window beyond the clock's range ends a
/// century on (for ever, for a transitional limit).
fn after(now: Instant, window: Duration) -> Instant {
    now.checked_add(window)
        .or_else(|| now.checked_add(Duration::from_secs(100 * 365 * 86_400)))
        .unwrap_or(now)
}

/// Among the limits in force before (`candidates`: each with its index)
/// of `limit`'s dimension: the shortest window at least as long as
/// `limit`'s, else the longest (as the in-process store chooses).
fn source(candidates: &[(LimitParams, usize)], limit: &LimitParams) -> Option<usize> {
    let same = || {
        candidates
            .iter()
            .filter(|(c, _)| c.dimension == limit.dimension)
    };
    same()
        .filter(|(c, _)| c.window_us >= limit.window_us)
        .min_by_key(|(c, _)| c.window_us)
        .or_else(|| same().max_by_key(|(c, _)| c.window_us))
        .map(|&(_, i)| i)
}

#[cfg(test)]
mod tests {
    use tollgate::config::ScopeConfig;
    use tollgate::quota::LocalQuota;

    use super::*;

    const HOUR: Duration = Duration::from_secs(3_600);

    fn limits(config: &ScopeConfig) -> Vec<LimitParams> {
        let mut local = LocalQuota::new(config, Instant::now());
        LimitParams::of(config, &mut local).0
    }

    // proves: GW-15, DQ-8 (a replaced window stays in force for one of its
    // windows and seeds the new limit of its dimension, the one covering it
    // best; a reload that keeps the windows carries the replaced limit on
    // to its end and seeds nothing again)
    #[test]
    fn a_replaced_window_is_carried_for_one_window_and_seeds_once() {
        let opened = Opened::default();
        let now = Instant::now();
        let day = ScopeConfig::new("s")
            .tokens(1_000, 24 * HOUR)
            .requests(10, HOUR);
        let first = opened.open("s", &limits(&day), now);
        assert!(first.transitional.is_empty());
        assert_eq!(first.sources, vec![None, None]);
        // Tokens per hour and per two days instead of per day.
        let split = ScopeConfig::new("s")
            .tokens(100, HOUR)
            .tokens(2_000, 48 * HOUR)
            .requests(20, HOUR);
        let later = now + HOUR;
        let second = opened.open("s", &limits(&split), later);
        assert_eq!(second.transitional.len(), 1);
        let (replaced, until) = &second.transitional[0];
        assert_eq!(replaced.config_window, 24 * HOUR);
        assert_eq!(*until, later + 24 * HOUR);
        // The day covers the hour best; only the day is there for two days.
        assert_eq!(second.sources, vec![Some(3), Some(3), None]);
        let again = opened.open("s", &limits(&split), later + HOUR);
        assert_eq!(again.transitional.len(), 1);
        assert_eq!(again.transitional[0].1, later + 24 * HOUR, "its end kept");
        assert_eq!(again.sources, vec![None, None, None]);
        let ended = opened.open("s", &limits(&split), later + 24 * HOUR);
        assert!(ended.transitional.is_empty());
    }
}
