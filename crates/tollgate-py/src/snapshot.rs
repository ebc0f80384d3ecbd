//! `limiter.snapshot()` as plain dicts (SPEC OBS-1).

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use tollgate::{Dimension, LimitedBy, ScopeCounters, Snapshot, StoreMode};

/// The dimensions that bound a wait, by name.
pub(crate) fn limited_by(l: LimitedBy) -> Vec<&'static str> {
    Dimension::ALL
        .into_iter()
        .filter(|d| l.has(*d))
        .map(Dimension::as_str)
        .collect()
}

/// The snapshot as a dict: `closed`, `idle` (nothing queued, pending or
/// active: every reservation and permit is back), `active`,
/// `concurrency_limit`, `concurrency_available`, `queue_capacity`,
/// `overflow`, `backend` and `scopes`, a dict by scope name of `queued`,
/// `waiting_for_slot`, `pending`, `queue_capacity`, `cooldown_remaining`
/// (seconds or `None`), `cooldown_generation`, `store`, `limits` (a list of
/// `dimension`, `window` seconds, `limit`, `capacity`, `available`,
/// `algorithm`) and `counters`.
pub(crate) fn to_dict<'py>(py: Python<'py>, s: &Snapshot) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("closed", s.closed)?;
    d.set_item("idle", s.is_idle())?;
    d.set_item("active", s.active)?;
    d.set_item("concurrency_limit", s.concurrency_limit)?;
    d.set_item("concurrency_available", s.concurrency_available)?;
    d.set_item("queue_capacity", s.queue_capacity)?;
    d.set_item("overflow", s.overflow.as_str())?;
    d.set_item("backend", s.backend)?;
    let scopes = PyDict::new(py);
    for scope in &s.scopes {
        let sd = PyDict::new(py);
        sd.set_item("queued", scope.queued)?;
        sd.set_item("waiting_for_slot", scope.waiting_for_slot)?;
        sd.set_item("pending", scope.pending)?;
        sd.set_item("queue_capacity", scope.queue_capacity)?;
        sd.set_item("cooldown_generation", scope.cooldown_generation)?;
        sd.set_item(
            "cooldown_remaining",
            scope.cooldown_remaining.map(|d| d.as_secs_f64()),
        )?;
        sd.set_item(
            "store",
            scope.store.map(|m| match m {
                StoreMode::Shared => "shared",
                StoreMode::Unavailable => "unavailable",
                StoreMode::LocalFallback => "local_fallback",
            }),
        )?;
        let limits = PyList::empty(py);
        for l in &scope.limits {
            let ld = PyDict::new(py);
            ld.set_item("dimension", l.dimension.as_str())?;
            ld.set_item("window", l.window.as_secs_f64())?;
            ld.set_item("limit", l.limit)?;
            ld.set_item("capacity", l.capacity)?;
            ld.set_item("available", l.available)?;
            ld.set_item("algorithm", l.algorithm.as_str())?;
            limits.append(ld)?;
        }
        sd.set_item("limits", limits)?;
        sd.set_item("counters", counters(py, &scope.counters)?)?;
        scopes.set_item(&scope.name, sd)?;
    }
    d.set_item("scopes", scopes)?;
    Ok(d)
}

fn counters<'py>(py: Python<'py>, c: &ScopeCounters) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for (name, value) in [
        ("admitted", c.admitted),
        ("preempted", c.preempted),
        ("refunded_reservations", c.refunded_reservations),
        ("tokens_reserved", c.tokens_reserved),
        ("tokens_reported", c.tokens_reported),
        ("tokens_refunded", c.tokens_refunded),
        ("tokens_debt", c.tokens_debt),
        ("unknown_usage", c.unknown_usage),
        ("known_zero", c.known_zero),
        ("cooldowns", c.cooldowns),
        ("stale_rate_limits", c.stale_rate_limits),
        ("refusals_released", c.refusals_released),
        ("gap_requests", c.gap_requests),
        ("gap_tokens", c.gap_tokens),
        ("limits_adopted", c.limits_adopted),
        ("store_errors", c.store_errors),
        ("store_unavailable", c.store_unavailable),
    ] {
        d.set_item(name, value)?;
    }
    Ok(d)
}
