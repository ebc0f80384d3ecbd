//! The status page's history: a bounded ring of samples per scope, and
//! the recent upstream 429s.
//!
//! One background task ([`sample_every`]) reads the engine's snapshots
//! once per [`SAMPLE_EVERY`] and appends one point per scope: its queue
//! length and how much of each of its limits is in use. Requests never
//! touch the history: the only hot-path cost of the status page is the
//! atomic increment of a deployment's 429 counter when an upstream answers
//! 429 (see [`crate::metrics::DeploymentMetrics::upstream_429s`]).
//!
//! Memory is bounded: at most [`MAX_SCOPES`] scopes, [`HISTORY_SAMPLES`]
//! points each (a point is 16 bytes and 8 per limit), and
//! [`MAX_THROTTLES`] 429 entries; a scope that no sample saw for a whole
//! history span is dropped.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use tollgate::Snapshot;
use tollgate::quota::Dimension;

use crate::live::Live;
use crate::state::AppState;

/// How often the sampler reads the engine's state.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(1);
/// Points kept per scope: five minutes at one a second.
pub const HISTORY_SAMPLES: usize = 300;
/// Scopes kept (upstream scopes first, then tenants'); others are shown
/// live but without history.
pub const MAX_SCOPES: usize = 256;
/// Upstream 429 entries kept (the most recent).
pub const MAX_THROTTLES: usize = 50;

/// Which controller a scope belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Side {
    /// An upstream quota scope (a provider account, a model, a deployment).
    Upstream,
    /// A tenant's own scope.
    Tenant,
}

impl Side {
    /// `upstream` or `tenant`.
    pub fn as_str(self) -> &'static str {
        match self {
            Side::Upstream => "upstream",
            Side::Tenant => "tenant",
        }
    }
}

/// What identifies one limit of a scope across samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitKey {
    /// Its dimension.
    pub dimension: Dimension,
    /// Its window.
    pub window: Duration,
    /// Its capacity (the most it holds).
    pub capacity: u64,
}

/// One sample of one scope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Point {
    /// Wall-clock time, milliseconds since the Unix epoch.
    pub t_ms: u64,
    /// Calls queued on the scope.
    pub queued: u32,
    /// Per limit (in the order of [`Series::limits`]): capacity minus what
    /// is available, above the capacity while in debt.
    pub used: Box<[i64]>,
}

/// The points of one scope.
#[derive(Debug, Clone)]
pub struct Series {
    /// Its controller.
    pub side: Side,
    /// Its name.
    pub name: String,
    /// Its limits; a change (a reload) starts the series afresh.
    pub limits: Vec<LimitKey>,
    /// The points, oldest first, at most [`HISTORY_SAMPLES`].
    pub points: VecDeque<Point>,
}

/// An upstream's 429s seen by one sample.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Throttle {
    /// When the sampler saw them (ms since the Unix epoch).
    pub t_ms: u64,
    /// The model (configured name).
    pub model: Arc<str>,
    /// Its deployment (configured name).
    pub deployment: Arc<str>,
    /// How many 429s since the previous sample.
    pub count: u64,
}

/// The status page's history, shared across reloads.
#[derive(Debug, Default)]
pub struct History {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    series: Vec<Series>,
    throttles: VecDeque<Throttle>,
    /// Each deployment's 429 count at the last sample.
    seen_429: HashMap<(Arc<str>, Arc<str>), u64>,
}

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl History {
    /// Samples `app` now (at `t_ms`).
    pub fn record(&self, t_ms: u64, app: &AppState) {
        let upstream = app.upstream_snapshot();
        let tenants = app.tenant_snapshot();
        let mut counts = Vec::new();
        for model in app.models.values() {
            for d in &model.deployments {
                counts.push((
                    Arc::clone(&model.name),
                    Arc::clone(&d.name),
                    d.metrics.upstream_429s(),
                ));
            }
        }
        let mut inner = self.inner.lock();
        inner.add(t_ms, Side::Upstream, &upstream);
        inner.add(t_ms, Side::Tenant, &tenants);
        let span = SAMPLE_EVERY.as_millis() as u64 * HISTORY_SAMPLES as u64;
        inner.series.retain(|s| {
            s.points
                .back()
                .is_some_and(|p| p.t_ms.saturating_add(span) >= t_ms)
        });
        counts.sort();
        for (model, deployment, count) in counts {
            let last = inner
                .seen_429
                .insert((Arc::clone(&model), Arc::clone(&deployment)), count);
            // A reload builds new counters from zero.
            let new = match last {
                Some(last) if count >= last => count - last,
                Some(_) => count,
                None => count,
            };
            if new > 0 {
                if inner.throttles.len() == MAX_THROTTLES {
                    inner.throttles.pop_front();
                }
                inner.throttles.push_back(Throttle {
                    t_ms,
                    model,
                    deployment,
                    count: new,
                });
            }
        }
    }

    /// Each kept scope's points later than `since_ms`.
    pub fn series_since(&self, since_ms: u64) -> Vec<Series> {
        self.inner
            .lock()
            .series
            .iter()
            .map(|s| Series {
                side: s.side,
                name: s.name.clone(),
                limits: s.limits.clone(),
                points: s
                    .points
                    .iter()
                    .filter(|p| p.t_ms > since_ms)
                    .cloned()
                    .collect(),
            })
            .collect()
    }

    /// The recent upstream 429s, oldest first.
    pub fn throttles(&self) -> Vec<Throttle> {
        self.inner.lock().throttles.iter().cloned().collect()
    }
}

impl Inner {
    fn add(&mut self, t_ms: u64, side: Side, snapshot: &Snapshot) {
        for scope in &snapshot.scopes {
            let limits: Vec<LimitKey> = scope
                .limits
                .iter()
                .map(|l| LimitKey {
                    dimension: l.dimension,
                    window: l.window,
                    capacity: l.capacity,
                })
                .collect();
            let used: Box<[i64]> = scope
                .limits
                .iter()
                .map(|l| {
                    i64::try_from(l.capacity)
                        .unwrap_or(i64::MAX)
                        .saturating_sub(l.available)
                })
                .collect();
            let point = Point {
                t_ms,
                queued: u32::try_from(scope.queued).unwrap_or(u32::MAX),
                used,
            };
            let at = self
                .series
                .iter()
                .position(|s| s.side == side && s.name == scope.name);
            let i = match at {
                Some(i) => i,
                None if self.series.len() < MAX_SCOPES => {
                    self.series.push(Series {
                        side,
                        name: scope.name.clone(),
                        limits: limits.clone(),
                        points: VecDeque::with_capacity(HISTORY_SAMPLES),
                    });
                    self.series.len() - 1
                }
                None => continue,
            };
            let series = &mut self.series[i];
            if series.limits != limits {
                series.limits = limits;
                series.points.clear();
            }
            if series.points.len() == HISTORY_SAMPLES {
                series.points.pop_front();
            }
            series.points.push_back(point);
        }
    }
}

/// Samples the current state every [`SAMPLE_EVERY`] into `live`'s
/// history, until aborted.
pub async fn sample_every(live: Arc<Live>) {
    let mut tick = tokio::time::interval(SAMPLE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let app = live.current();
        live.history().record(now_ms(), &app);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::GatewayConfig;
    use crate::metrics::Metrics;

    fn app() -> Arc<AppState> {
        let config = GatewayConfig::from_toml(
            r#"
[providers.p]
base_url = "http://127.0.0.1:9/v1"
[scopes.account]
limits = [{ requests = 10, per = "1s" }, { tokens = 1000, per = "1m" }]
[models.m]
provider = "p"
scope = "account"
[anonymous]
enabled = true
"#,
            "test.toml",
        )
        .expect("valid");
        crate::build::build(&config, Metrics::install()).expect("builds")
    }

    // proves: OBS-6 (the history is bounded: points per scope, 429 entries)
    #[test]
    fn history_is_bounded_and_counts_new_429s_only() {
        let app = app();
        let history = History::default();
        let deployment = &app.models["m"].deployments[0];
        for i in 0..(HISTORY_SAMPLES as u64 + 20) {
            if i % 2 == 0 {
                deployment.metrics.attempt(true);
            }
            history.record(1_000 * (i + 1), &app);
        }
        let series = history.series_since(0);
        let account = series
            .iter()
            .find(|s| s.side == Side::Upstream && s.name == "account")
            .expect("the account scope is kept");
        assert_eq!(account.points.len(), HISTORY_SAMPLES);
        assert_eq!(account.limits.len(), 2);
        assert_eq!(account.points.back().map(|p| p.t_ms), Some(1_000 * 320));
        assert_eq!(account.points.back().map(|p| p.used.len()), Some(2));
        let throttles = history.throttles();
        assert_eq!(throttles.len(), MAX_THROTTLES);
        assert!(throttles.iter().all(|t| t.count == 1 && &*t.model == "m"));
        // Only points after `since`.
        assert_eq!(history.series_since(1_000 * 318)[0].points.len(), 2);
        // A scope no sample saw for a whole span is dropped.
        let mut gone = account.clone();
        gone.name = "gone".into();
        history.inner.lock().series.push(gone);
        history.record(1_000 * 321, &app);
        assert!(history.series_since(0).iter().any(|s| s.name == "gone"));
        history.record(1_000 * (321 + HISTORY_SAMPLES as u64), &app);
        assert!(history.series_since(0).iter().all(|s| s.name != "gone"));
    }
}
