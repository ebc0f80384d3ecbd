//! A new configuration for a running scope (SPEC GW-15): what is counted
//! stays counted.
//!
//! Each limit of the new configuration is matched with the running limit
//! of the same dimension and window:
//!
//! * Same window and algorithm: the running state is kept as it is (its
//!   log of admissions, pending amounts, debts and what the provider's
//!   answers taught) with the new amount. A lowered amount admits nothing
//!   more until what is counted in the window in progress is below it; a
//!   raised one admits the difference at once.
//! * Another window or algorithm: the new limit starts *seeded* with
//!   everything the running limit of its dimension counts (the one whose
//!   window covers the new window best), as if admitted at the
//!   reconfiguration: later than it was, so counted at least as long as
//!   the new limit needs it; an amount the provider may count as late as
//!   an instant after the reconfiguration (SPEC Q-15) is seeded at that
//!   instant, which the running limit, once gone, no longer bounds. The running limit stays as a *transitional*
//!   limit for one of its windows (or until it counts nothing), counting
//!   new admissions too, so no window that holds admissions from before
//!   the reconfiguration admits more than either configuration would.
//!   Admissions older than the running window are not known to the
//!   store; a longer new window cannot count them.
//! * A limit the new configuration no longer has goes (its dimension is
//!   no longer limited, or is limited by the new limits only).
//!
//! A limit learned from the provider (SPEC Q-14) is kept while the scope
//! still learns and the configuration does not set its dimension; it takes
//! the new learning window like a configured limit.
//!
//! Reservations made before the reconfiguration are settled against the
//! new limits: a kept limit finds them where they are; a seeded limit holds
//! their pending amounts apart (a lease or refund finds them) and counts
//! their leased amounts in its seed, so a refund or a lower usage gives
//! nothing back there, and a recount to a later instant (SPEC Q-15)
//! counts the amount there once more, beside the seed (counted a little
//! long, never over a limit).

use super::{LocalQuota, nanos};
use crate::clock::Instant;
use crate::config::{Algorithm, Limit, ScopeConfig};
use crate::quota::demand::Dimension;
use crate::quota::limit::LimitState;

/// A limit the new configuration wants.
struct Wanted {
    limit: Limit,
    learned: bool,
    provisional: bool,
}

impl LocalQuota {
    /// Takes `config`'s limits, algorithm and learning at `now` (see the
    /// module documentation).
    pub(crate) fn reconfigure(&mut self, config: &ScopeConfig, now: Instant) {
        let t = self.tick(now);
        self.advance(t);
        let wanted = self.wanted(config);
        let old = std::mem::take(&mut self.limits);
        // The running limit each wanted one keeps (same window and
        // arithmetic), each running limit kept at most once.
        let mut kept: Vec<Option<usize>> = Vec::with_capacity(wanted.len());
        let mut taken = vec![false; old.len()];
        for w in &wanted {
            let i = old.iter().enumerate().position(|(i, o)| {
                !taken[i]
                    && !o.is_transitional()
                    && o.dimension() == w.limit.dimension
                    && o.same_window(&w.limit, config.algorithm)
            });
            if let Some(i) = i {
                taken[i] = true;
            }
            kept.push(i);
        }
        // New limits take as their own only reservations stamped from
        // `at` on, or, leased, past every stamp a recount moved ahead
        // (`LimitState::foreign`): `at` is an instant no existing
        // reservation is stamped with (a sliding window's seed lands
        // there).
        let at = if kept.iter().any(Option::is_none) {
            self.fresh_start()
        } else {
            t
        };
        let leased_born = self.leased_born(at);
        let mut replaced = vec![false; old.len()];
        let mut fresh: Vec<Option<LimitState>> = Vec::with_capacity(wanted.len());
        for (w, k) in wanted.iter().zip(&kept) {
            if k.is_some() {
                fresh.push(None);
                continue;
            }
            let mut state = LimitState::new(w.limit, config.algorithm, at, self.epoch_utc);
            if let Some(i) = source(&old, w.limit) {
                let (counted, pending) = old[i].counted();
                let ahead = old[i].ahead(t);
                state.seed(counted, pending, &ahead, at, old[i].holds_from());
                // Unless kept itself, it bounds its window a while longer;
                // not a provisional stand-in (one request per window until
                // the provider answers): no limit of the provider's, it
                // would only throttle the new one.
                replaced[i] = !old[i].provisional;
            }
            fresh.push(Some(state));
        }
        let mut old: Vec<Option<LimitState>> = old.into_iter().map(Some).collect();
        let mut limits = Vec::with_capacity(wanted.len() + 1);
        for ((w, k), f) in wanted.iter().zip(kept).zip(fresh) {
            let mut state = match (k.and_then(|i| old[i].take()), f) {
                (Some(mut state), _) => {
                    state.set_amount(w.limit.amount, config.algorithm);
                    state
                }
                (None, Some(state)) => state,
                (None, None) => LimitState::new(w.limit, config.algorithm, at, self.epoch_utc),
            };
            if k.is_none() {
                state.born_at(at, leased_born);
            }
            state.learned = w.learned;
            state.provisional = w.provisional;
            limits.push(state);
        }
        for (i, o) in old.into_iter().enumerate() {
            let Some(mut o) = o else { continue };
            // Still bounding an earlier configuration's window, or the one
            // the new limits replace: until one of its windows has passed.
            if replaced[i] && !o.is_transitional() {
                o.transitional = Some(t.saturating_add(nanos(o.window())));
            }
            if o.is_transitional() && !o.expired(at) {
                o.learned = false;
                o.provisional = false;
                limits.push(o);
            }
        }
        self.limits = limits;
        self.draining = self.limits.iter().any(LimitState::is_transitional);
        self.algorithm = config.algorithm;
        self.learn = config.learn;
        let sliding = matches!(config.algorithm, Algorithm::SlidingWindow);
        let shortest = self
            .limits
            .iter()
            .filter(|l| !l.is_transitional())
            .map(LimitState::window)
            .chain(config.learn)
            .min()
            .unwrap_or_default();
        self.sent = self
            .sent
            .rewindowed(if sliding { nanos(shortest) } else { 0 });
    }

    /// The limits `config` wants: its own, then the learned ones it keeps,
    /// then the provisional stand-in of a scope that learns without a
    /// request limit (as at its start, SPEC Q-14), unless the provider
    /// answered already without advertising one (a reload keeps what the
    /// provider taught, GW-15).
    fn wanted(&self, config: &ScopeConfig) -> Vec<Wanted> {
        let mut wanted: Vec<Wanted> = config
            .limits
            .iter()
            .map(|&limit| Wanted {
                limit,
                learned: false,
                provisional: false,
            })
            .collect();
        let Some(window) = config.learn else {
            return wanted;
        };
        for l in self
            .limits
            .iter()
            .filter(|l| l.learned && !l.is_transitional())
        {
            if wanted.iter().any(|w| w.limit.dimension == l.dimension()) {
                continue;
            }
            wanted.push(Wanted {
                limit: Limit::new(l.dimension(), l.config.amount, window),
                learned: true,
                provisional: l.provisional,
            });
        }
        // A scope that learned already and has no request limit at all
        // heard the provider answer without advertising one (the answer
        // dropped the stand-in): a stand-in now would throttle it to one
        // request per window until the next answer, for nothing.
        let answered = self.learn.is_some()
            && !self
                .limits
                .iter()
                .any(|l| l.dimension() == Dimension::Requests && !l.is_transitional());
        if !answered
            && !wanted
                .iter()
                .any(|w| w.limit.dimension == Dimension::Requests)
        {
            wanted.push(Wanted {
                limit: Limit::new(Dimension::Requests, 1, window),
                learned: true,
                provisional: true,
            });
        }
        wanted
    }
}

/// The running limit a new `limit` is seeded from: of its dimension, the
/// shortest window covering the new one (it knows every admission of the
/// new window), else the longest.
fn source(old: &[LimitState], limit: Limit) -> Option<usize> {
    let same = || {
        old.iter()
            .enumerate()
            .filter(move |(_, o)| o.dimension() == limit.dimension && !o.is_transitional())
    };
    same()
        .filter(|(_, o)| o.window() >= limit.window)
        .min_by_key(|(_, o)| o.window())
        .or_else(|| same().max_by_key(|(_, o)| o.window()))
        .map(|(i, _)| i)
}
