//! State shared by every route: configuration, clock, and one lock around the
//! referee and the counters.
//!
//! One lock keeps it obviously consistent: a check and its charge happen in
//! one critical section, `/stats` sees one coherent picture and `/reset`
//! clears everything at once. The critical sections are a few dozen
//! instructions; no `.await` happens under the lock.

use std::fmt;
use std::sync::Arc;

use axum::http::HeaderMap;
use parking_lot::Mutex;

use crate::clock::Clock;
use crate::config::SimConfig;
use crate::faults::FaultPlan;
use crate::referee::{Limits, RateState, Referee, Rejection};
use crate::stats::{Counters, SimStats};
use crate::wire::ApiError;

/// The route a request arrived on, for the per-route counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    ChatCompletions,
    Embeddings,
    Models,
    NotFound,
}

pub(crate) struct Shared {
    pub(crate) config: SimConfig,
    clock: Arc<dyn Clock>,
    inner: Mutex<Inner>,
}

struct Inner {
    referee: Referee,
    counters: Counters,
    /// Sequence number of the next API request (fault seeding).
    next_seq: u64,
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shared")
            .field("config", &self.config)
            .field("clock", &self.clock)
            .finish_non_exhaustive()
    }
}

/// The outcome of admission for one API request.
pub(crate) enum Admission {
    /// Charged; the guard holds the concurrency slot.
    Admitted {
        guard: RequestGuard,
        state: RateState,
    },
    /// Refused with 429; nothing charged.
    Rejected(Rejection),
    /// Would have been admitted, but the fault plan fails it with this
    /// status; nothing charged (a real provider does not bill a 5xx).
    ServerError { status: u16, state: RateState },
}

impl Shared {
    pub(crate) fn new(config: SimConfig, clock: Arc<dyn Clock>) -> Self {
        let limits = Limits {
            requests: config.rpm,
            tokens: config.tpm,
            concurrency: config.max_concurrency,
            window: config.window,
        };
        Self {
            config,
            clock,
            inner: Mutex::new(Inner {
                referee: Referee::new(limits),
                counters: Counters::default(),
                next_seq: 0,
            }),
        }
    }

    /// Counts a request on `route` and returns the sequence number of an API
    /// request (chat completions, embeddings; other routes do not consume
    /// one).
    pub(crate) fn begin(&self, route: Route) -> u64 {
        let mut inner = self.inner.lock();
        let routes = &mut inner.counters.routes;
        match route {
            Route::ChatCompletions => routes.chat_completions += 1,
            Route::Embeddings => routes.embeddings += 1,
            Route::Models => routes.models += 1,
            Route::NotFound => routes.not_found += 1,
        }
        let seq = inner.next_seq;
        if matches!(route, Route::ChatCompletions | Route::Embeddings) {
            inner.counters.requests_total += 1;
            inner.next_seq += 1;
        }
        seq
    }

    /// Updates the counters.
    pub(crate) fn count(&self, f: impl FnOnce(&mut Counters)) {
        f(&mut self.inner.lock().counters);
    }

    /// Checks the bearer key when one is required; counts and returns the
    /// 401 otherwise.
    pub(crate) fn authorize(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        let Some(key) = &self.config.require_key else {
            return Ok(());
        };
        let given = headers
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token.trim());
        if given == Some(key.as_str()) {
            return Ok(());
        }
        self.count(|c| c.unauthorized += 1);
        Err(ApiError {
            status: http::StatusCode::UNAUTHORIZED,
            message: if given.is_some() {
                "Incorrect API key provided.".to_owned()
            } else {
                "Missing bearer key: send `Authorization: Bearer <key>`.".to_owned()
            },
            kind: "invalid_request_error",
            param: None,
            code: Some("invalid_api_key"),
        })
    }

    /// Admits (and charges) a request of `tokens` tokens, refuses it, or
    /// fails it as the fault plan says — all in one critical section.
    pub(crate) fn admit(self: &Arc<Self>, tokens: u64, plan: &FaultPlan) -> Admission {
        let mut inner = self.inner.lock();
        let now = self.clock.now();
        let inner = &mut *inner;
        if let Err(rejection) = inner.referee.check(now, tokens) {
            inner.counters.count_rejection(rejection.cause);
            return Admission::Rejected(rejection);
        }
        if let Some(status) = plan.server_error {
            inner.counters.faults.server_error += 1;
            return Admission::ServerError {
                status,
                state: inner.referee.state(now),
            };
        }
        match inner.referee.try_admit(now, tokens) {
            Ok(state) => Admission::Admitted {
                guard: RequestGuard {
                    shared: Arc::clone(self),
                    done: false,
                },
                state,
            },
            // Unreachable: `check` passed under the same lock.
            Err(rejection) => {
                inner.counters.count_rejection(rejection.cause);
                Admission::Rejected(rejection)
            }
        }
    }

    pub(crate) fn stats(&self) -> SimStats {
        let inner = self.inner.lock();
        inner.counters.snapshot(&inner.referee)
    }

    pub(crate) fn reset(&self) {
        let mut inner = self.inner.lock();
        inner.referee.clear();
        inner.counters = Counters::default();
        inner.next_seq = 0;
    }
}

/// The concurrency slot of an admitted request, released exactly once: by
/// [`finish`](Self::finish) when the response is complete (or cut by a
/// fault), or on drop — which means the client went away first and is
/// counted as a client disconnect.
pub(crate) struct RequestGuard {
    shared: Arc<Shared>,
    done: bool,
}

impl RequestGuard {
    /// Releases the slot and applies `f` to the counters, once.
    pub(crate) fn finish(&mut self, f: impl FnOnce(&mut Counters)) {
        if self.done {
            return;
        }
        self.done = true;
        let mut inner = self.shared.inner.lock();
        inner.referee.release();
        f(&mut inner.counters);
    }
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.finish(|c| c.client_disconnects += 1);
    }
}
