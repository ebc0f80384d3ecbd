//! The plan (`--dry-run`), the final summary and the physical lower bound
//! on wall time (SPEC BATCH-4, BATCH-6).
//!
//! # The lower bound
//!
//! A limit of `A` units per window `W` admits at most `A` units in any
//! interval of length `W` (a full limit may be used at once). A demand of
//! `D` units therefore needs `k = ceil(D / A)` disjoint windows, and its
//! last unit cannot start before `(k - 1) * W` after its first. Over all
//! limits:
//!
//! ```text
//! lower_bound = max over limits (A, W) of (ceil(D / A) - 1) * W
//! ```
//!
//! with `D` the number of requests for a request limit and the tokens for
//! a token limit. The plan uses the estimates (what is reserved); the
//! summary after a run uses what the provider reported (what it charged),
//! with the estimate for any attempt of unknown usage. Latency is not in
//! the bound: the last request's own response time comes on top.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::time::Duration;

use serde::Serialize;
use tollgate::config::Limit;
use tollgate::price::format_usd;
use tollgate::{Dimension, ScopeCounters};
use tollgate_openai::prices::PriceTable;

use crate::config::BatchConfig;
use crate::input::Item;
use crate::stats::Stats;
use crate::{BatchError, Outcome};

/// What a run asks of each dimension, for [`lower_bound`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Amounts {
    /// Requests.
    pub requests: u64,
    /// Tokens (input plus output).
    pub tokens: u64,
    /// Input tokens (0 when unknown: the bound stays a lower bound).
    pub input: u64,
    /// Output tokens (0 when unknown).
    pub output: u64,
    /// Micro-dollars (0 when unknown).
    pub cost: u64,
}

/// The lower bound on wall time for a demand of `amounts` under `limits`
/// (see the module docs); each limit counts its own dimension (SPEC Q-12).
pub fn lower_bound(limits: &[Limit], amounts: Amounts) -> Duration {
    limits
        .iter()
        .map(|l| {
            let demand = match l.dimension {
                Dimension::Requests => amounts.requests,
                Dimension::Tokens => amounts.tokens,
                Dimension::InputTokens => amounts.input,
                Dimension::OutputTokens => amounts.output,
                Dimension::Cost => amounts.cost,
            };
            if l.amount == 0 {
                // Refused by the configuration check before any plan; a
                // limit of zero lets nothing through, ever.
                return if demand == 0 {
                    Duration::ZERO
                } else {
                    Duration::MAX
                };
            }
            let windows = demand.div_ceil(l.amount).saturating_sub(1);
            l.window
                .saturating_mul(u32::try_from(windows).unwrap_or(u32::MAX))
        })
        .max()
        .unwrap_or(Duration::ZERO)
}

/// What the items to run will ask for.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Plan {
    /// Items to run.
    pub requests: u64,
    /// Estimated input tokens.
    pub input_tokens: u64,
    /// Output allowance (output caps).
    pub output_tokens: u64,
    /// Input plus output: what is reserved.
    pub tokens: u64,
    /// The lower bound on wall time of the estimates, in seconds.
    pub lower_bound_s: f64,
    /// The most the priced items can cost (SPEC BUD-6): each item's input
    /// estimate and output allowance at its model's dearest input and
    /// output prices, in micro-dollars (written in dollars).
    #[serde(rename = "worst_case_cost_usd", serialize_with = "usd")]
    pub worst_case_cost: u64,
    /// Items whose model has a price.
    pub priced: u64,
    /// The models without a price (their items are not in the cost).
    pub unpriced_models: Vec<String>,
}

/// Micro-dollars as a decimal string of dollars.
fn usd<S: serde::Serializer>(micros: &u64, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&tollgate::price::format_usd(*micros))
}

impl Plan {
    /// The plan of `items` under `limits`, priced with `prices`.
    pub fn of(items: &[Item], limits: &[Limit], prices: &PriceTable) -> Plan {
        let mut p = Plan {
            requests: items.len() as u64,
            ..Plan::default()
        };
        for i in items {
            p.input_tokens = p.input_tokens.saturating_add(i.estimate.input);
            p.output_tokens = p.output_tokens.saturating_add(i.estimate.output);
            match prices.price(&i.model) {
                Some(price) => {
                    let worst = price.worst_case(i.estimate.input, i.estimate.output);
                    p.worst_case_cost = p.worst_case_cost.saturating_add(worst);
                    p.priced += 1;
                }
                None if !p.unpriced_models.contains(&i.model) => {
                    p.unpriced_models.push(i.model.clone());
                }
                None => {}
            }
        }
        p.tokens = p.input_tokens.saturating_add(p.output_tokens);
        let amounts = Amounts {
            requests: p.requests,
            tokens: p.tokens,
            input: p.input_tokens,
            output: p.output_tokens,
            cost: p.worst_case_cost,
        };
        p.lower_bound_s = lower_bound(limits, amounts).as_secs_f64();
        p
    }
}

/// Quota waits of succeeded items, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Percentiles {
    /// Median.
    pub p50: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest.
    pub max: f64,
}

impl Percentiles {
    fn of(sorted: &[Duration]) -> Percentiles {
        let at = |q: f64| -> f64 {
            if sorted.is_empty() {
                return 0.0;
            }
            let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
            sorted
                .get(rank - 1)
                .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
        };
        Percentiles {
            p50: at(0.50),
            p95: at(0.95),
            p99: at(0.99),
            max: at(1.0),
        }
    }
}

/// What the in-process simulator counted (its own accounting).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct SimFigures {
    /// Requests it received.
    pub requests: u64,
    /// 429s it answered.
    pub rejected_429: u64,
    /// Tokens it charged.
    pub tokens_charged: u64,
    /// Most requests it counted in one window.
    pub max_requests_in_window: u64,
    /// Most tokens it counted in one window.
    pub max_tokens_in_window: u64,
}

/// Tokens as the engine counted them (SPEC Q-5).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Tokens {
    /// Reserved by leased attempts.
    pub reserved: u64,
    /// Reported by the provider.
    pub reported: u64,
    /// Given back (reported below the estimate).
    pub refunded: u64,
    /// Charged beyond the estimate.
    pub debt: u64,
    /// Attempts whose usage was unknown (their estimate was kept).
    pub unknown_usage: u64,
}

/// Money as the engine counted it (SPEC BUD-6), in micro-dollars
/// (written in dollars).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Cost {
    /// What the run cost: each attempt's priced usage, or its worst case
    /// when the usage is unknown (reserved, less what came back, plus
    /// debt).
    #[serde(rename = "charged_usd", serialize_with = "usd")]
    pub charged: u64,
    /// The worst cases reserved by leased attempts.
    #[serde(rename = "reserved_usd", serialize_with = "usd")]
    pub reserved: u64,
    /// `--budget`, if any.
    #[serde(rename = "budget_usd", serialize_with = "usd_opt")]
    pub budget: Option<u64>,
}

fn usd_opt<S: serde::Serializer>(micros: &Option<u64>, s: S) -> Result<S::Ok, S::Error> {
    match micros {
        Some(m) => s.serialize_str(&format_usd(*m)),
        None => s.serialize_none(),
    }
}

/// The summary of a run (printed, and written by `--summary-json`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    /// `complete`, `dry_run` or `stopped`.
    pub outcome: String,
    /// Why the run stopped early.
    pub stop_reason: Option<String>,
    /// The limits, as text.
    pub limits: Vec<String>,
    /// Requests in the input.
    pub items_total: u64,
    /// Items the output already held a result for (skipped).
    pub already_done: u64,
    /// Items run again (`--retry-failed`, `--rerun-changed`).
    pub rerun: u64,
    /// What this run had to do.
    pub plan: Plan,
    /// Items recorded as succeeded in this run.
    pub succeeded: u64,
    /// Items recorded as failed in this run.
    pub failed: u64,
    /// Items not run (stopped early); a re-run picks them up.
    pub not_run: u64,
    /// Recorded failures by class.
    pub failures_by_class: BTreeMap<String, u64>,
    /// Most items in progress at once (never above the concurrency).
    pub max_in_flight: u64,
    /// Provider attempts.
    pub attempts: u64,
    /// Attempts beyond each item's first.
    pub retries: u64,
    /// Failed attempts by cause (retried or not).
    pub attempt_failures: BTreeMap<String, u64>,
    /// Coordinated cooldowns started by 429s.
    pub cooldowns: u64,
    /// Tokens as the engine counted them.
    pub tokens: Tokens,
    /// Money as the engine counted it (SPEC BUD-6).
    pub cost: Cost,
    /// Wall time of the run, in seconds.
    pub wall_time_s: f64,
    /// The lower bound on wall time from what the provider charged, in
    /// seconds.
    pub lower_bound_s: f64,
    /// Quota waits of succeeded items (their last attempt's), in ms.
    pub quota_wait_ms: Percentiles,
    /// The in-process simulator's own counts (`--sim`).
    pub sim: Option<SimFigures>,
}

impl Summary {
    pub(crate) fn dry_run(
        config: &BatchConfig,
        items_total: u64,
        already_done: u64,
        plan: Plan,
    ) -> Summary {
        let (not_run, lower_bound_s) = (plan.requests, plan.lower_bound_s);
        Summary {
            outcome: "dry_run".into(),
            stop_reason: None,
            limits: config.limits.iter().map(crate::runner::describe).collect(),
            items_total,
            already_done,
            rerun: 0,
            plan,
            succeeded: 0,
            failed: 0,
            not_run,
            failures_by_class: BTreeMap::new(),
            max_in_flight: 0,
            attempts: 0,
            retries: 0,
            attempt_failures: BTreeMap::new(),
            cooldowns: 0,
            tokens: Tokens::default(),
            cost: Cost {
                budget: config.budget,
                ..Cost::default()
            },
            wall_time_s: 0.0,
            lower_bound_s,
            quota_wait_ms: Percentiles::default(),
            sim: None,
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn finished(
        config: &BatchConfig,
        items_total: u64,
        already_done: u64,
        rerun: u64,
        plan: Plan,
        stats: &Stats,
        counters: &ScopeCounters,
        wall: Duration,
        sim: Option<SimFigures>,
        outcome: &Outcome,
    ) -> Summary {
        use std::sync::atomic::Ordering::Relaxed;
        let succeeded = stats.succeeded.load(Relaxed);
        let failed = stats.failed.load(Relaxed);
        let attempts = stats.attempts.load(Relaxed);
        // What the provider charged: reported usage, plus the estimate
        // where it was unknown (reserved - refunded + debt).
        let charged = counters
            .tokens_reserved
            .saturating_sub(counters.tokens_refunded)
            .saturating_add(counters.tokens_debt);
        let finished = succeeded + failed;
        let not_run = plan.requests.saturating_sub(finished);
        Summary {
            outcome: outcome.as_str().into(),
            stop_reason: match outcome {
                Outcome::Stopped(r) => Some(r.to_string()),
                _ => None,
            },
            limits: config.limits.iter().map(crate::runner::describe).collect(),
            items_total,
            already_done,
            rerun,
            plan,
            succeeded,
            failed,
            not_run,
            failures_by_class: stats
                .failures()
                .into_iter()
                .map(|(k, v)| (k.as_str().to_owned(), v))
                .collect(),
            max_in_flight: stats.max_in_flight.load(Relaxed),
            attempts,
            retries: stats.retries.load(Relaxed),
            attempt_failures: stats
                .attempt_failures()
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v))
                .collect(),
            cooldowns: counters.cooldowns,
            tokens: Tokens {
                reserved: counters.tokens_reserved,
                reported: counters.tokens_reported,
                refunded: counters.tokens_refunded,
                debt: counters.tokens_debt,
                unknown_usage: counters.unknown_usage,
            },
            cost: Cost {
                charged: counters
                    .cost_reserved
                    .saturating_sub(counters.cost_refunded)
                    .saturating_add(counters.cost_debt),
                reserved: counters.cost_reserved,
                budget: config.budget,
            },
            wall_time_s: wall.as_secs_f64(),
            // The counters keep the total only: input and output limits
            // do not raise this bound (it stays a lower bound).
            lower_bound_s: lower_bound(
                &config.limits,
                Amounts {
                    requests: counters.admitted,
                    tokens: charged,
                    ..Amounts::default()
                },
            )
            .as_secs_f64(),
            quota_wait_ms: Percentiles::of(&stats.quota_waits()),
            sim,
        }
    }

    /// Writes the summary as JSON to `path`, if given.
    ///
    /// # Errors
    /// I/O errors.
    pub fn write_json(&self, path: Option<&Path>) -> Result<(), BatchError> {
        let Some(path) = path else { return Ok(()) };
        let mut json = serde_json::to_vec_pretty(self).map_err(|e| BatchError::Io {
            path: path.to_owned(),
            source: std::io::Error::other(e),
        })?;
        json.push(b'\n');
        std::fs::write(path, json).map_err(|source| BatchError::Io {
            path: path.to_owned(),
            source,
        })
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let limits = if self.limits.is_empty() {
            "none".to_owned()
        } else {
            self.limits.join(", ")
        };
        let p = &self.plan;
        if self.outcome == "dry_run" {
            writeln!(f, "dry run: nothing was sent")?;
            writeln!(
                f,
                "items: {} in the input, {} already in the output, {} to run",
                self.items_total, self.already_done, p.requests
            )?;
            writeln!(
                f,
                "estimated tokens: {} ({} input + {} output allowance)",
                p.tokens, p.input_tokens, p.output_tokens
            )?;
            writeln!(
                f,
                "worst-case cost: ${} ({} items at their model's list price, each input estimate \
                 and output allowance at the dearest input and output rates){}",
                format_usd(p.worst_case_cost),
                p.priced,
                if p.unpriced_models.is_empty() {
                    String::new()
                } else {
                    format!(
                        "; not priced: {} items of {}",
                        p.requests - p.priced,
                        p.unpriced_models.join(", ")
                    )
                }
            )?;
            writeln!(f, "limits: {limits}")?;
            return write!(
                f,
                "physical lower bound on wall time: {:.1} s (max over limits of (ceil(demand / limit) - 1) x window; response latency comes on top)",
                p.lower_bound_s
            );
        }
        writeln!(
            f,
            "{}: {} succeeded, {} failed, {} not run ({} in the input, {} already done{})",
            self.outcome,
            self.succeeded,
            self.failed,
            self.not_run,
            self.items_total,
            self.already_done,
            if self.rerun > 0 {
                format!(", {} run again", self.rerun)
            } else {
                String::new()
            }
        )?;
        if let Some(r) = &self.stop_reason {
            writeln!(f, "stopped: {r}")?;
        }
        if !self.failures_by_class.is_empty() {
            let v: Vec<_> = self
                .failures_by_class
                .iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect();
            writeln!(f, "failures by class: {}", v.join(", "))?;
        }
        let causes: Vec<_> = self
            .attempt_failures
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        writeln!(
            f,
            "attempts: {}, retries: {}, failed attempts: {}, cooldowns: {}",
            self.attempts,
            self.retries,
            if causes.is_empty() {
                "none".to_owned()
            } else {
                causes.join(", ")
            },
            self.cooldowns
        )?;
        writeln!(f, "limits: {limits}")?;
        let ratio = if self.lower_bound_s > 0.0 {
            format!(" ({:.3}x)", self.wall_time_s / self.lower_bound_s)
        } else {
            String::new()
        };
        writeln!(
            f,
            "wall time: {:.2} s; physical lower bound {:.2} s{ratio}",
            self.wall_time_s, self.lower_bound_s
        )?;
        let q = &self.quota_wait_ms;
        writeln!(
            f,
            "quota wait: p50 {:.0} ms, p95 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
            q.p50, q.p95, q.p99, q.max
        )?;
        let t = &self.tokens;
        write!(
            f,
            "tokens: reserved {}, reported {}, refunded {}, debt {}, unknown usage {}",
            t.reserved, t.reported, t.refunded, t.debt, t.unknown_usage
        )?;
        if self.cost.reserved > 0 || self.cost.budget.is_some() {
            write!(
                f,
                "\ncost: ${} (priced usage; the worst case where usage is unknown){}",
                format_usd(self.cost.charged),
                self.cost
                    .budget
                    .map(|b| format!(" of a ${} budget", format_usd(b)))
                    .unwrap_or_default()
            )?;
        }
        if let Some(s) = &self.sim {
            write!(
                f,
                "\nsimulator: {} requests, {} 429s, {} tokens charged",
                s.requests, s.rejected_429, s.tokens_charged
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // proves: BATCH-6 (the physical lower bound formula)
    #[test]
    fn lower_bound_is_the_last_window_start() {
        let m = Duration::from_secs(60);
        let limits = [
            Limit::new(Dimension::Requests, 100, m),
            Limit::new(Dimension::Tokens, 1_000, m),
        ];
        let rt = |requests, tokens| Amounts {
            requests,
            tokens,
            ..Amounts::default()
        };
        assert_eq!(lower_bound(&limits, rt(0, 0)), Duration::ZERO);
        assert_eq!(lower_bound(&limits, rt(100, 1_000)), Duration::ZERO);
        assert_eq!(lower_bound(&limits, rt(101, 10)), m);
        assert_eq!(lower_bound(&limits, rt(10, 4_500)), 4 * m);
        assert_eq!(lower_bound(&[], rt(10, 4_500)), Duration::ZERO);
        // A zero limit (refused before any plan) divides nothing.
        let zero = [Limit::new(Dimension::Requests, 0, m)];
        assert_eq!(lower_bound(&zero, rt(0, 0)), Duration::ZERO);
        assert_eq!(lower_bound(&zero, rt(1, 0)), Duration::MAX);
    }

    // proves: Q-12 (input and output limits bound the run by their own
    // amounts, not the total)
    #[test]
    fn lower_bound_counts_input_and_output_limits_by_their_own_amounts() {
        let m = Duration::from_secs(60);
        let limit = |dimension, amount| Limit::new(dimension, amount, m);
        let limits = [
            limit(Dimension::InputTokens, 1_000),
            limit(Dimension::OutputTokens, 100),
        ];
        let a = Amounts {
            requests: 1,
            tokens: 1_300,
            input: 1_000,
            output: 300,
            cost: 0,
        };
        // Output binds: 300 output tokens need three windows of 100.
        assert_eq!(lower_bound(&limits, a), 2 * m);
        assert_eq!(lower_bound(&limits[..1], a), Duration::ZERO);
        let p = Percentiles::of(&[
            Duration::from_millis(1),
            Duration::from_millis(2),
            Duration::from_millis(3),
            Duration::from_millis(4),
        ]);
        assert_eq!((p.p50, p.p95, p.max), (2.0, 4.0, 4.0));
    }
}
