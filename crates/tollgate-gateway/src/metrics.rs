//! Prometheus metrics (SPEC OBS-2): bounded labels only, i.e. configured
//! model, scope and provider names and reason enums; never keys, tenants'
//! raw identities or payloads.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use metrics::{counter, gauge, histogram};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use parking_lot::Mutex;
use tollgate::lifecycle::{CallReport, CircuitState};
use tollgate::{Snapshot, StoreMode};

static RECORDER: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// How often the server runs [`Metrics::upkeep`] (the exporter's own
/// default period).
pub const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// The label sets of the per-flow queue gauges published last, so a flow
/// whose queue emptied reads 0 instead of its last length.
type FlowLabels = (&'static str, String, Arc<str>, &'static str);
static FLOW_GAUGES: Mutex<Vec<FlowLabels>> = Mutex::new(Vec::new());

/// Metric handles of one model, registered once so that a successful
/// request records its figures without building label sets or allocating.
#[derive(Clone, Debug)]
pub struct ModelMetrics {
    ok: metrics::Counter,
    latency: metrics::Histogram,
    ttft: metrics::Histogram,
    quota_wait: metrics::Histogram,
    concurrency_wait: metrics::Histogram,
    completed: metrics::Counter,
}

impl ModelMetrics {
    /// The handles of `model` on `route`.
    pub fn new(route: &'static str, model: &str) -> Self {
        let m = || model.to_owned();
        ModelMetrics {
            ok: counter!("tollgate_requests_total", "route" => route, "model" => m(), "status" => "200"),
            latency: histogram!("tollgate_upstream_latency_seconds", "model" => m()),
            ttft: histogram!("tollgate_time_to_first_token_seconds", "model" => m()),
            quota_wait: histogram!("tollgate_quota_wait_seconds", "model" => m()),
            concurrency_wait: histogram!("tollgate_concurrency_wait_seconds", "model" => m()),
            completed: counter!("tollgate_calls_total", "model" => m(), "terminal" => "completed"),
        }
    }

    /// A successful request: status 200, its upstream time (whole response,
    /// or first chunk of a stream) and its admission waits (SPEC OBS-4).
    pub fn success(
        &self,
        stream: bool,
        upstream: Duration,
        quota: Duration,
        concurrency: Duration,
    ) {
        self.ok.increment(1);
        let h = if stream { &self.ttft } else { &self.latency };
        h.record(upstream.as_secs_f64());
        self.quota_wait.record(quota.as_secs_f64());
        self.concurrency_wait.record(concurrency.as_secs_f64());
    }

    /// A completed call (the common case of the supervisor's reports).
    pub fn completed(&self) {
        self.completed.increment(1);
    }
}

/// Metric handles of one deployment (SPEC GW-11, OBS-2), labelled by the
/// configured model and deployment names.
#[derive(Clone, Debug)]
pub struct DeploymentMetrics {
    attempts: metrics::Counter,
    rate_limited: metrics::Counter,
    quota_wait: metrics::Histogram,
    /// Its upstream's 429s, read by the status page's sampler.
    upstream_429s: Arc<std::sync::atomic::AtomicU64>,
    /// `(model, deployment)`, for the gauges published at scrape time.
    labels: (Arc<str>, Arc<str>),
}

impl DeploymentMetrics {
    /// The handles of deployment `deployment` of `model`.
    pub fn new(model: &str, deployment: &str) -> Self {
        let l = || {
            [
                ("model", model.to_owned()),
                ("deployment", deployment.to_owned()),
            ]
        };
        DeploymentMetrics {
            attempts: counter!("tollgate_deployment_attempts_total", &l()),
            rate_limited: counter!("tollgate_deployment_upstream_429_total", &l()),
            quota_wait: histogram!("tollgate_deployment_quota_wait_seconds", &l()),
            upstream_429s: Arc::default(),
            labels: (Arc::from(model), Arc::from(deployment)),
        }
    }

    /// An attempt reached the upstream; `rate_limited` when it answered
    /// 429.
    pub fn attempt(&self, rate_limited: bool) {
        self.attempts.increment(1);
        if rate_limited {
            self.rate_limited.increment(1);
            self.upstream_429s
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// The 429s its upstream answered since these handles were made (the
    /// status page's sampler reads it; SPEC OBS-6).
    pub fn upstream_429s(&self) -> u64 {
        self.upstream_429s
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// A call admitted on this deployment waited `wait` for quota.
    pub fn admitted(&self, wait: Duration) {
        self.quota_wait.record(wait.as_secs_f64());
    }

    /// Publishes the deployment's state at scrape time: attempts in
    /// flight, its scope's queue and cooldowns, its provider's circuit.
    pub fn publish(
        &self,
        in_flight: usize,
        queued: Option<usize>,
        cooldowns: Option<u64>,
        circuit: CircuitState,
    ) {
        let (m, d) = (self.labels.0.to_string(), self.labels.1.to_string());
        let l = [("model", m), ("deployment", d)];
        gauge!("tollgate_deployment_in_flight", &l).set(in_flight as f64);
        if let Some(q) = queued {
            gauge!("tollgate_deployment_queued", &l).set(q as f64);
        }
        if let Some(c) = cooldowns {
            counter!("tollgate_deployment_cooldowns_total", &l).absolute(c);
        }
        gauge!("tollgate_deployment_circuit_state", &l).set(circuit_value(circuit));
    }
}

/// 0 closed, 1 half-open, 2 open.
fn circuit_value(state: CircuitState) -> f64 {
    match state {
        CircuitState::Closed => 0.0,
        CircuitState::HalfOpen => 1.0,
        CircuitState::Open => 2.0,
    }
}

/// The process's metrics recorder and helpers. Cloning is cheap.
#[derive(Clone, Debug)]
pub struct Metrics {
    handle: Option<PrometheusHandle>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::install()
    }
}

impl Metrics {
    /// Installs the Prometheus recorder once per process (later calls share
    /// it). Without it (another recorder is installed) metrics are dropped.
    pub fn install() -> Self {
        let handle = RECORDER
            .get_or_init(|| {
                let builder = PrometheusBuilder::new()
                    .set_buckets(&[
                        0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                        2.5, 5.0, 10.0, 30.0, 60.0,
                    ])
                    .ok()?;
                builder.install_recorder().ok()
            })
            .clone();
        Metrics { handle }
    }

    /// Folds the histogram samples recorded since the last call into
    /// their buckets. The recorder keeps every sample until then (or until
    /// `/metrics` is rendered), so without it memory grows with every
    /// request between scrapes; the server runs it every
    /// [`UPKEEP_EVERY`].
    pub fn upkeep(&self) {
        if let Some(handle) = &self.handle {
            handle.run_upkeep();
        }
    }

    /// The exposition text for `GET /metrics`.
    pub fn render(&self) -> String {
        self.handle
            .as_ref()
            .map(PrometheusHandle::render)
            .unwrap_or_default()
    }

    /// A request finished with an HTTP status.
    pub fn request(&self, route: &'static str, model: &str, status: u16) {
        counter!("tollgate_requests_total", "route" => route, "model" => model.to_owned(), "status" => status.to_string())
            .increment(1);
    }

    /// Publishes, at scrape time, the calls of tenant `tenant` (its
    /// configured name) admitted upstream per class and their estimated
    /// tokens (SPEC FAIR-8), from the tenant's own counters (kept across
    /// reloads): a request only adds to two atomics, no label set is
    /// built per request. A class with no call yet has no series.
    pub fn served(&self, tenant: &str, served: &crate::tenants::Served) {
        for class in tollgate::Priority::ALL {
            let (calls, tokens) = served.get(class);
            if calls == 0 {
                continue;
            }
            let labels = [
                ("tenant", tenant.to_owned()),
                ("class", class.as_str().to_owned()),
            ];
            counter!("tollgate_tenant_served_total", &labels).absolute(calls);
            counter!("tollgate_tenant_served_tokens_total", &labels).absolute(tokens);
        }
    }

    /// A request was refused before any upstream work (SPEC GW-4).
    pub fn rejected(&self, reason: &str) {
        counter!("tollgate_rejected_total", "reason" => reason.to_owned()).increment(1);
    }

    /// A stream failed after output began.
    pub fn stream_failed(&self, model: &str, reason: &str) {
        counter!("tollgate_stream_failures_total", "model" => model.to_owned(), "reason" => reason.to_owned())
            .increment(1);
    }

    /// A large request of `tenant` had its body parsed (`parse`) or its
    /// tokens counted (`count`) on the counting lane, off the async
    /// workers (SPEC GW-17).
    pub fn large_body_job(&self, tenant: Option<&Arc<str>>, job: &'static str) {
        let tenant = tenant.map_or_else(String::new, |t| t.to_string());
        counter!("tollgate_large_body_jobs_total", "tenant" => tenant, "job" => job).increment(1);
    }

    /// A model moved to its fallback (SPEC GW-10).
    pub fn fallback(&self, from: &str, to: &str) {
        counter!("tollgate_fallbacks_total", "from" => from.to_owned(), "to" => to.to_owned())
            .increment(1);
    }

    /// A call of `model` ended (from the supervisor's observer).
    pub fn call(&self, model: &Arc<str>, handles: &ModelMetrics, report: &CallReport) {
        if report.terminal == tollgate::lifecycle::Terminal::Completed && report.attempts <= 1 {
            handles.completed();
            return;
        }
        let model = model.to_string();
        counter!("tollgate_calls_total", "model" => model.clone(), "terminal" => report.terminal.as_str()).increment(1);
        if report.attempts > 1 {
            counter!("tollgate_retries_total", "model" => model.clone())
                .increment(u64::from(report.attempts - 1));
        }
        if let Some(phase) = report.phase {
            counter!("tollgate_deadline_exceeded_total", "phase" => phase.as_str()).increment(1);
        }
    }

    /// Publishes controller state: queue depths, availability and token
    /// accounting per scope, pool occupancy per pool, labelled with their
    /// names: configured scope names, `model:<model>[/<deployment>]`, and
    /// `tenant:<tenant>[/<model>]` from the configured tenant names (never
    /// keys or anything a client sent; SPEC Q-10).
    ///
    /// Per class, each scope's served cost; per tenant and class, each
    /// scope's queue (SPEC FAIR-8), labelled with the tenant's configured
    /// name (`names` maps a flow's tenant number to it; flows of tenants no
    /// longer configured are left out).
    pub fn snapshot(
        &self,
        side: &'static str,
        s: &Snapshot,
        names: &dyn Fn(u32) -> Option<Arc<str>>,
    ) {
        let mut flows: Vec<(FlowLabels, usize)> = Vec::new();
        for scope in &s.scopes {
            let name = scope.name.clone();
            for class in tollgate::Priority::ALL {
                counter!("tollgate_served_cost_total", "side" => side, "scope" => name.clone(), "class" => class.as_str())
                    .absolute(scope.counters.served_cost[class.index()]);
            }
            for f in &scope.flows {
                if let Some(tenant) = names(f.tenant) {
                    let labels = (side, name.clone(), tenant, f.priority.as_str());
                    match flows.iter_mut().find(|(l, _)| *l == labels) {
                        Some((_, n)) => *n += f.queued,
                        None => flows.push((labels, f.queued)),
                    }
                }
            }
            gauge!("tollgate_queued", "side" => side, "scope" => name.clone())
                .set(scope.queued as f64);
            let k = &scope.counters;
            counter!("tollgate_admitted_total", "side" => side, "scope" => name.clone())
                .absolute(k.admitted);
            counter!("tollgate_tokens_reserved_total", "side" => side, "scope" => name.clone())
                .absolute(k.tokens_reserved);
            counter!("tollgate_tokens_reported_total", "side" => side, "scope" => name.clone())
                .absolute(k.tokens_reported);
            counter!("tollgate_tokens_refunded_total", "side" => side, "scope" => name.clone())
                .absolute(k.tokens_refunded);
            counter!("tollgate_tokens_debt_total", "side" => side, "scope" => name.clone())
                .absolute(k.tokens_debt);
            counter!("tollgate_cooldowns_total", "side" => side, "scope" => name.clone())
                .absolute(k.cooldowns);
            // What the provider's headers taught (SPEC ).
            for (dimension, gap) in [("requests", k.gap_requests), ("tokens", k.gap_tokens)] {
                counter!("tollgate_budget_gap_total", "side" => side, "scope" => name.clone(), "dimension" => dimension)
                    .absolute(gap);
            }
            counter!("tollgate_limits_adopted_total", "side" => side, "scope" => name.clone())
                .absolute(k.limits_adopted);
            counter!("tollgate_refusals_released_total", "side" => side, "scope" => name.clone())
                .absolute(k.refusals_released);
            // A shared quota store's state (SPEC DQ-3): 1 for the current
            // state, 0 for the others.
            if let Some(mode) = scope.store {
                for state in [
                    StoreMode::Shared,
                    StoreMode::Unavailable,
                    StoreMode::LocalFallback,
                ] {
                    gauge!("tollgate_quota_store_state", "side" => side, "scope" => name.clone(), "state" => state.as_str())
                        .set(if state == mode { 1.0 } else { 0.0 });
                }
                for (what, n) in [
                    ("store_errors", k.store_errors),
                    ("refused_unavailable", k.store_unavailable),
                    ("fallback_admissions", k.fallback_admissions),
                    ("settlements_failed", k.settlements_failed),
                    ("holds_expired", k.holds_expired),
                ] {
                    counter!("tollgate_quota_store_events_total", "side" => side, "scope" => name.clone(), "event" => what)
                        .absolute(n);
                }
            }
            // Without reported usage (nothing settled yet, or a provider
            // set to `reconciles = false`) there is no ratio to show.
            if k.tokens_reserved > 0 && k.tokens_reported > 0 {
                gauge!("tollgate_accounting_ratio", "side" => side, "scope" => name.clone())
                    .set(k.tokens_reported as f64 / k.tokens_reserved as f64);
            }
            for l in &scope.limits {
                gauge!(
                    "tollgate_quota_available",
                    "side" => side,
                    "scope" => name.clone(),
                    "dimension" => l.dimension.as_str(),
                    "window_seconds" => l.window.as_secs().to_string(),
                    "calendar" => calendar_label(l.calendar.as_ref())
                )
                .set(l.available as f64);
            }
        }
        for p in &s.pools {
            let name = p.name.clone();
            gauge!("tollgate_pool_in_use", "side" => side, "pool" => name.clone())
                .set(p.limit.saturating_sub(p.available) as f64);
            gauge!("tollgate_pool_waiting", "side" => side, "pool" => name).set(p.waiting as f64);
        }
        let flow_gauge = |l: &FlowLabels, n: usize| {
            let labels = [
                ("side", l.0.to_owned()),
                ("scope", l.1.clone()),
                ("tenant", l.2.to_string()),
                ("class", l.3.to_owned()),
            ];
            gauge!("tollgate_flow_queued", &labels).set(n as f64);
        };
        let mut published = FLOW_GAUGES.lock();
        for old in published.iter().filter(|l| l.0 == side) {
            if !flows.iter().any(|(l, _)| l == old) {
                flow_gauge(old, 0);
            }
        }
        published.retain(|l| l.0 != side);
        for (labels, n) in flows {
            flow_gauge(&labels, n);
            published.push(labels);
        }
    }

    /// Publishes a provider's circuit state: 0 closed, 1 half-open, 2 open.
    pub fn circuit(&self, provider: &str, state: CircuitState) {
        gauge!("tollgate_circuit_state", "provider" => provider.to_owned())
            .set(circuit_value(state));
    }
}

/// The `calendar` label of a limit: empty for a rolling window, else the
/// period, with its time zone unless UTC (`day`, `month@Europe/Paris`).
pub fn calendar_label(calendar: Option<&tollgate::config::Calendar>) -> String {
    match calendar {
        None => String::new(),
        Some(c) if c.zone == tollgate::config::Zone::UTC => c.period.as_str().to_owned(),
        Some(c) => format!("{}@{}", c.period.as_str(), c.zone.name()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // proves: OBS-2 (samples folded into their buckets between scrapes,
    // which the server does to keep its memory flat, still count: the
    // histogram shows every recorded sample once)
    #[test]
    fn upkeep_between_scrapes_loses_no_sample() {
        let metrics = Metrics::install();
        let model = ModelMetrics::new("chat", "upkeep-test-model");
        let ms = Duration::from_millis;
        for _ in 0..3 {
            model.success(false, ms(2), Duration::ZERO, Duration::ZERO);
        }
        metrics.upkeep();
        model.success(false, ms(200), Duration::ZERO, Duration::ZERO);
        metrics.upkeep();
        metrics.upkeep();
        let text = metrics.render();
        let line = |prefix: &str| {
            text.lines()
                .find(|l| l.starts_with(prefix) && l.contains("upkeep-test-model"))
                .map(|l| l.rsplit(' ').next().unwrap_or_default().to_owned())
        };
        assert_eq!(
            line("tollgate_upstream_latency_seconds_count").as_deref(),
            Some("4"),
            "{text}"
        );
        let sum: f64 = line("tollgate_upstream_latency_seconds_sum")
            .and_then(|v| v.parse().ok())
            .unwrap_or_default();
        assert!((sum - 0.206).abs() < 1e-9, "{text}");
        // A second scrape counts nothing twice.
        let text = metrics.render();
        assert!(
            text.lines()
                .any(|l| l.starts_with("tollgate_upstream_latency_seconds_count")
                    && l.contains("upkeep-test-model")
                    && l.ends_with(" 4")),
            "{text}"
        );
    }
}
