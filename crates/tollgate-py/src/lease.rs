//! `tollgate.Lease`: an admitted attempt, owning its reservation and
//! permit (SPEC PY-2, Q-5, Q-9, Q-15, Q-16).

use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use tollgate::{Counter, RefusalCost, Usage};

use crate::errors;
use crate::process::Made;
use crate::usage;

/// An admitted attempt. Settle it with what the provider reported
/// (`settle`), or say the provider refused it (`refused`); leaving the
/// `with` / `async with` block (or `release()`) returns its concurrency
/// permit. A lease never settled keeps its whole estimate counted (the
/// safe choice for unknown usage, SPEC Q-5); once released it can no
/// longer be settled.
#[pyclass(frozen, module = "tollgate._tollgate", name = "Lease")]
pub(crate) struct PyLease {
    lease: Mutex<Option<tollgate::Lease>>,
    /// Whether the lease was settled when it was released (written under
    /// `lease`'s lock as the lease is taken out).
    settled_at_release: AtomicBool,
    scope: Py<pyo3::types::PyString>,
    estimate: tollgate::TokenEstimate,
    refusal: RefusalCost,
    /// The process the lease was granted in.
    made: Made,
}

impl PyLease {
    pub(crate) fn new(
        lease: tollgate::Lease,
        scope: Py<pyo3::types::PyString>,
        estimate: tollgate::TokenEstimate,
    ) -> Self {
        PyLease {
            lease: Mutex::new(Some(lease)),
            settled_at_release: AtomicBool::new(false),
            scope,
            estimate,
            refusal: RefusalCost::Full,
            made: Made::current(),
        }
    }

    /// Runs `f` on the lease while it is held; `RuntimeError` once it was
    /// released.
    fn with<T>(&self, f: impl FnOnce(&mut tollgate::Lease) -> T) -> PyResult<T> {
        self.made.check("Lease")?;
        let mut guard = self.lease.lock();
        match guard.as_mut() {
            Some(lease) => Ok(in_runtime(|| f(lease))),
            None => Err(pyo3::exceptions::PyRuntimeError::new_err(
                "this lease was already released",
            )),
        }
    }

    /// Runs the settlement `f` on the lease while it is held. Once it was
    /// released, the engine's lease is gone (its settlement was decided
    /// then: the usage given before, or the whole estimate as unknown
    /// usage, SPEC Q-5): `AlreadySettled` if it had been settled,
    /// `RuntimeError` if not.
    fn settling<T>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut tollgate::Lease) -> T,
    ) -> PyResult<T> {
        self.made.check("Lease")?;
        let mut guard = self.lease.lock();
        match guard.as_mut() {
            Some(lease) => Ok(in_runtime(|| f(lease))),
            None if self.settled_at_release.load(Ordering::Relaxed) => Err(already(py)),
            None => Err(pyo3::exceptions::PyRuntimeError::new_err(
                "this lease was released without being settled, so it keeps its whole \
                 estimate (unknown usage); settle before release() or leaving the block",
            )),
        }
    }

    /// Drops the engine's lease: the permit goes back.
    pub(crate) fn release_now(&self) {
        let lease = {
            let mut guard = self.lease.lock();
            let lease = guard.take();
            if let Some(l) = &lease {
                self.settled_at_release
                    .store(l.is_reconciled(), Ordering::Relaxed);
            }
            lease
        };
        if let Some(lease) = lease {
            self.made.drop_here(lease);
        }
    }
}

/// Runs `f` in the runtime's context: a settlement of a scope kept in
/// Redis goes to the store as a task of the runtime (outside it, none
/// could start and the settlement would be lost).
fn in_runtime<T>(f: impl FnOnce() -> T) -> T {
    let _runtime = crate::runtime::enter();
    f()
}

impl Drop for PyLease {
    fn drop(&mut self) {
        // A lease collected without `release()` or the end of its block
        // gives back what it holds as release does: in the runtime (its
        // store round trip is a runtime task). In a forked child the
        // lease is the parent's: never dropped there.
        if let Some(lease) = self.lease.get_mut().take() {
            self.made.drop_here(lease);
        }
    }
}

fn already(py: Python<'_>) -> PyErr {
    errors::make(
        py,
        "AlreadySettled",
        "this lease was already settled".into(),
        &[],
    )
}

#[pymethods]
impl PyLease {
    /// Settles the reservation with the provider's reported usage (SPEC
    /// below the estimate refunds the difference, above it is
    /// counted as debt. Give `input_tokens` and/or `output_tokens` (an
    /// absent one counts as zero), or `total_tokens`, or `usage=`: an
    /// OpenAI or Anthropic usage object or dict (`prompt_tokens` /
    /// `completion_tokens` / `total_tokens`, `input_tokens` /
    /// `output_tokens`), read by the rules of Q-6 (an invalid counter makes
    /// the usage unknown, which keeps the estimate). Each lease settles
    /// once; a second call raises `AlreadySettled`. A lease released
    /// without being settled keeps its whole estimate and can no longer be
    /// settled: `settle` then raises `RuntimeError`.
    #[pyo3(signature = (input_tokens = None, output_tokens = None, *, total_tokens = None, usage = None))]
    fn settle(
        &self,
        py: Python<'_>,
        input_tokens: Option<&Bound<'_, PyAny>>,
        output_tokens: Option<&Bound<'_, PyAny>>,
        total_tokens: Option<&Bound<'_, PyAny>>,
        usage: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let counts = [input_tokens, output_tokens, total_tokens];
        let usage = match usage.filter(|u| !u.is_none()) {
            Some(u) if counts.iter().all(Option::is_none) => usage::from_object(u)?,
            Some(_) => {
                return Err(PyTypeError::new_err(
                    "settle() takes usage= or token counts, not both",
                ));
            }
            None => {
                let count = |name: &str, v: Option<&Bound<'_, PyAny>>| -> PyResult<Counter> {
                    v.map_or(Ok(Counter::Absent), |v| usage::strict_count(name, v))
                };
                let (input, output, total) = (
                    count("input_tokens", input_tokens)?,
                    count("output_tokens", output_tokens)?,
                    count("total_tokens", total_tokens)?,
                );
                if [input, output, total].iter().all(|c| *c == Counter::Absent) {
                    return Err(PyTypeError::new_err(
                        "settle() needs input_tokens/output_tokens, total_tokens or usage=",
                    ));
                }
                Usage::from_counters(total, input, output, Counter::Absent)
            }
        };
        match self.settling(py, |lease| lease.reconcile(usage))? {
            Ok(_) => Ok(()),
            Err(_) => Err(already(py)),
        }
    }

    /// The provider refused this attempt with a 429 (SPEC Q-16, CD-1):
    /// settles it at what the provider charged for it (`cost`: `"full"`,
    /// `"request"` or `"free"`; default `"full"`) and starts the scope's
    /// cooldown for `retry_after` seconds (the server's hint) or, without
    /// one, a short exponential backoff. Counts as the settlement; like
    /// `settle`, it raises `AlreadySettled` after a settlement and
    /// `RuntimeError` once the lease was released unsettled.
    #[pyo3(signature = (retry_after = None, *, cost = None))]
    fn refused(
        &self,
        py: Python<'_>,
        retry_after: Option<&Bound<'_, PyAny>>,
        cost: Option<&str>,
    ) -> PyResult<()> {
        let hint = retry_after
            .filter(|v| !v.is_none())
            .map(|v| crate::config::duration("retry_after", v))
            .transpose()?;
        let cost = match cost {
            None => self.refusal,
            Some(name) => [RefusalCost::Full, RefusalCost::Request, RefusalCost::Free]
                .into_iter()
                .find(|c| c.as_str() == name)
                .ok_or_else(|| {
                    PyValueError::new_err(format!(
                        "cost must be \"full\", \"request\" or \"free\", got {name:?}"
                    ))
                })?,
        };
        let settled = self.settling(py, |lease| {
            let settled = lease.refused(cost);
            lease.rate_limited(hint);
            settled
        })?;
        settled.map_err(|_| already(py))
    }

    /// Tells the engine that the provider counted this attempt no later
    /// than now, or `seconds_ago` seconds ago (SPEC Q-15): call it when the
    /// response began (headers, a refusal, a stream's first bytes), so the
    /// attempt stays counted one window from then rather than from the
    /// admission.
    #[pyo3(signature = (seconds_ago = 0.0))]
    fn counted_by(&self, seconds_ago: f64) -> PyResult<()> {
        let ago = errors::seconds("seconds_ago", seconds_ago)?;
        let now = tollgate::clock::Instant::now();
        let at = now.checked_sub(ago).unwrap_or(now);
        self.with(|lease| lease.counted_by(at))
    }

    /// Returns the concurrency permit now (also done on leaving the
    /// `with` block). Idempotent.
    fn release(&self) {
        self.release_now();
    }

    /// The scope this attempt spends.
    #[getter]
    fn scope(&self, py: Python<'_>) -> Py<pyo3::types::PyString> {
        self.scope.clone_ref(py)
    }

    /// Tokens reserved (input + output estimate).
    #[getter]
    fn tokens(&self) -> u64 {
        self.estimate.total()
    }

    /// Whether it was settled (`settle` or `refused`). A lease released
    /// without a settlement stays unsettled (its whole estimate counted).
    #[getter]
    fn settled(&self) -> bool {
        match self.lease.lock().as_ref() {
            Some(lease) => lease.is_reconciled(),
            None => self.settled_at_release.load(Ordering::Relaxed),
        }
    }

    /// Whether its permit was returned.
    #[getter]
    fn released(&self) -> bool {
        self.lease.lock().is_none()
    }

    /// What the admission waited for (SPEC OBS-4): `quota_wait` and
    /// `concurrency_wait` in seconds, `limited_by`, `cooldown`,
    /// `preemptions`.
    #[getter]
    fn admission<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let a = self.with(|lease| *lease.admission())?;
        let d = PyDict::new(py);
        d.set_item("quota_wait", a.quota_wait.as_secs_f64())?;
        d.set_item("concurrency_wait", a.concurrency_wait.as_secs_f64())?;
        d.set_item("limited_by", crate::snapshot::limited_by(a.limited_by))?;
        d.set_item("cooldown", a.cooldown)?;
        d.set_item("preemptions", a.preemptions)?;
        Ok(d)
    }

    fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, _args: &Bound<'_, pyo3::types::PyTuple>) -> bool {
        self.release_now();
        false
    }

    fn __repr__(&self) -> String {
        let state = match self.lease.lock().as_ref() {
            None => "released",
            Some(l) if l.is_reconciled() => "settled",
            Some(_) => "held",
        };
        format!("<tollgate.Lease tokens={} {state}>", self.estimate.total())
    }
}
