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
//! * keeps each replaced limit as a *transitional* one for one of its
//!   windows: passed to every script with the new limits, it still counts
//!   and bounds new admissions, so no window that holds admissions from
//!   before the reload admits more than either configuration would;
//! * names it as the *source* of each new limit of its dimension (the one
//!   whose window covers the new window best): the first script to find
//!   the new limit's state missing seeds it with what the source counts,
//!   as admitted then (`common.lua`, Seeds), so a longer window cannot
//!   admit its whole amount again.
//!
//! Within one process only: a process started with other windows than the
//! one before it has nothing to carry (docs/redis.md, "Reloads"). And a
//! seed lands only on a missing state: a window reloaded back to one
//! whose key still lives is not seeded with what the window between
//! admitted (that one bounds new admissions for one of its windows, then
//! goes; seeding a live key would add the same count once per replica).
//! Left so: flipping a window back and forth within one window is not a
//! change anyone makes on purpose.

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
    /// For each of the new limits, the transitional limit (an index into
    /// `transitional`) it is seeded from.
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
        // of their windows; older transitional ones keep their end.
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
        carried.sources = limits
            .iter()
            .map(|l| {
                if before.is_empty() || has(&in_force, l) {
                    return None;
                }
                source(&carried.transitional, &replaced, l)
            })
            .collect();
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

/// Among the replaced limits (`candidates`, indices into `transitional`)
/// of `limit`'s dimension: the shortest window at least as long as
/// `limit`'s, else the longest (as the in-process store chooses).
fn source(
    transitional: &[(LimitParams, Instant)],
    candidates: &[usize],
    limit: &LimitParams,
) -> Option<usize> {
    let same = || {
        candidates
            .iter()
            .copied()
            .filter(|&i| transitional[i].0.dimension == limit.dimension)
    };
    let window = |i: usize| transitional[i].0.window_us;
    same()
        .filter(|&i| window(i) >= limit.window_us)
        .min_by_key(|&i| window(i))
        .or_else(|| same().max_by_key(|&i| window(i)))
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
        assert_eq!(second.sources, vec![Some(0), Some(0), None]);
        let again = opened.open("s", &limits(&split), later + HOUR);
        assert_eq!(again.transitional.len(), 1);
        assert_eq!(again.transitional[0].1, later + 24 * HOUR, "its end kept");
        assert_eq!(again.sources, vec![None, None, None]);
        let ended = opened.open("s", &limits(&split), later + 24 * HOUR);
        assert!(ended.transitional.is_empty());
    }
}
