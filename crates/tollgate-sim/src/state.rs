//! State shared by every route: configuration, clock, and one lock around the
//! referee and the counters.
//!
//! One lock keeps it obviously consistent: a check and its charge happen in
//! one critical section, `/stats` sees one coherent picture and `/reset`
//! clears everything at once. The critical sections are a few dozen
//! instructions; no `.await` happens under the lock.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::http::HeaderMap;
use parking_lot::Mutex;

use crate::anthropic::limits::{
    MessagesCause, MessagesLimitConfig, MessagesLimits, MessagesRejection, MessagesState,
};
use crate::clock::Clock;
use crate::config::SimConfig;
use crate::faults::FaultPlan;
use crate::referee::{Limits, RateState, Referee, Rejection, Ticket};
use crate::stats::{Counters, SimStats};
use crate::wire::ApiError;

/// The route a request arrived on, for the per-route counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    ChatCompletions,
    Embeddings,
    Responses,
    AzureChatCompletions,
    AzureEmbeddings,
    Messages,
    Models,
    NotFound,
}

impl Route {
    /// Whether the route is an API call (counted in `requests_total`, given
    /// a sequence number).
    fn is_api(self) -> bool {
        !matches!(self, Route::Models | Route::NotFound)
    }
}

pub(crate) struct Shared {
    pub(crate) config: SimConfig,
    clock: Arc<dyn Clock>,
    inner: Mutex<Inner>,
    /// Whether the background consumer task was started.
    background_started: AtomicBool,
    /// Stops the background consumer when the state goes away.
    background_task: Mutex<Option<tokio::task::AbortHandle>>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        if let Some(task) = self.background_task.get_mut().take() {
            task.abort();
        }
    }
}

/// What the windows charge an API request at its counting instant, and what
/// it is billed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Charge {
    /// The rate-limit charge (by the configured charge mode).
    pub(crate) tokens: u64,
    /// The billing usage (prompt + generated), which replaces the charge
    /// when the response completes if reconciliation is on.
    pub(crate) usage: u64,
    /// The money bill in pico-dollars at the model's list price, `None`
    /// for a model without a price ([`crate::prices`]).
    pub(crate) bill: Option<u128>,
}

/// The money bill of `input` and `output` tokens of `model`, in
/// pico-dollars, at the repository's list price (`None`: no price).
pub(crate) fn bill(model: &str, input: u64, output: u64) -> Option<u128> {
    crate::prices::price(model).map(|p| p.bill(input, output))
}

struct Inner {
    referee: Referee,
    /// The Anthropic buckets of `POST /v1/messages`.
    messages: MessagesLimits,
    counters: Counters,
    /// How many times `/reset` ran: a request admitted before the last one
    /// changes no counter when it ends.
    resets: u64,
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

/// The outcome of admission for one `POST /v1/messages` request.
pub(crate) enum MessagesAdmission {
    /// Taken from the buckets; the guard holds the concurrency slot and
    /// gives the unused output allowance back when the request ends.
    Admitted {
        guard: RequestGuard,
        state: MessagesState,
    },
    /// Refused with 429; nothing taken.
    Rejected(MessagesRejection),
    /// Would have been admitted, but the fault plan fails it; nothing taken.
    ServerError { status: u16, state: MessagesState },
}

/// What a Messages request asks of the Anthropic buckets.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MessagesDemand {
    /// Input tokens (the simulator's count).
    pub(crate) input: u64,
    /// `max_tokens`: the output allowance taken at admission.
    pub(crate) max_tokens: u64,
    /// Output tokens the response will generate (at most `max_tokens`).
    pub(crate) generated: u64,
    /// The money bill in pico-dollars (`None`: no price for the model).
    pub(crate) bill: Option<u128>,
}

/// The outcome of admission for one API request.
pub(crate) enum Admission {
    /// Charged; the guard holds the concurrency slot.
    Admitted {
        guard: RequestGuard,
        state: RateState,
    },
    /// Refused with 429; charged only as `charge_refusals` says.
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
        let messages = MessagesLimitConfig {
            requests: config.anthropic_rpm,
            input_tokens: config.itpm,
            output_tokens: config.otpm,
            period: config.window,
        };
        Self {
            config,
            clock,
            inner: Mutex::new(Inner {
                referee: Referee::new(limits),
                messages: MessagesLimits::new(messages),
                counters: Counters::default(),
                resets: 0,
                next_seq: 0,
            }),
            background_started: AtomicBool::new(false),
            background_task: Mutex::new(None),
        }
    }

    /// Starts the background consumer, once, when one is configured and a
    /// tokio runtime is running (otherwise a later call starts it).
    pub(crate) fn ensure_background(self: &Arc<Self>) {
        if self.config.background_rpm.is_none()
            || tokio::runtime::Handle::try_current().is_err()
            || self.background_started.swap(true, Ordering::AcqRel)
        {
            return;
        }
        let task = crate::background::spawn(self);
        *self.background_task.lock() = Some(task);
    }

    /// One tick of the background consumer: spends one request unit and
    /// `tokens` tokens if the windows have room, else skips.
    pub(crate) fn background_tick(&self, tokens: u64) -> bool {
        let mut inner = self.inner.lock();
        let now = self.clock.now();
        inner.referee.try_background(now, tokens)
    }

    /// Waits until API request `seq`, received at `received`, reaches the
    /// limiter: its ingress delay after receipt. Returns at once when no
    /// delay is configured.
    pub(crate) async fn ingress(&self, seq: u64, received: tokio::time::Instant) {
        let delay = &self.config.ingress_delay;
        if delay.is_zero() {
            return;
        }
        let wait = delay.draw(self.config.seed, seq);
        tokio::time::sleep_until(received + wait).await;
    }

    /// Counts a request on `route` and returns the sequence number of an API
    /// request (every route but `/v1/models` and the 404 fallback, which do
    /// not consume one).
    pub(crate) fn begin(&self, route: Route) -> u64 {
        let mut inner = self.inner.lock();
        let routes = &mut inner.counters.routes;
        match route {
            Route::ChatCompletions => routes.chat_completions += 1,
            Route::Embeddings => routes.embeddings += 1,
            Route::Responses => routes.responses += 1,
            Route::AzureChatCompletions => routes.azure_chat_completions += 1,
            Route::AzureEmbeddings => routes.azure_embeddings += 1,
            Route::Messages => routes.messages += 1,
            Route::Models => routes.models += 1,
            Route::NotFound => routes.not_found += 1,
        }
        let seq = inner.next_seq;
        if route.is_api() {
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

    /// Admits (and charges) a request, refuses it, or fails it as the fault
    /// plan says — all in one critical section, at the counting instant.
    pub(crate) fn admit(self: &Arc<Self>, charge: Charge, plan: &FaultPlan) -> Admission {
        let tokens = charge.tokens;
        let mut inner = self.inner.lock();
        let now = self.clock.now();
        let inner = &mut *inner;
        if let Err(rejection) = inner.referee.check(now, tokens) {
            inner.counters.count_rejection(rejection.cause);
            let rejection =
                inner
                    .referee
                    .charge_refusal(now, tokens, self.config.charge_refusals, rejection);
            return Admission::Rejected(rejection);
        }
        if let Some(status) = plan.server_error {
            inner.counters.faults.server_error += 1;
            return Admission::ServerError {
                status,
                state: inner.referee.state(now),
            };
        }
        let admitted = if self.config.reconcile {
            inner
                .referee
                .try_admit_settled(now, tokens)
                .map(|(state, ticket)| (state, Some((ticket, charge.usage))))
        } else {
            inner
                .referee
                .try_admit(now, tokens)
                .map(|state| (state, None))
        };
        match admitted {
            Ok((state, settle)) => {
                inner.counters.bill(charge.bill);
                Admission::Admitted {
                    guard: RequestGuard {
                        shared: Arc::clone(self),
                        done: false,
                        settle,
                        refund_output: 0,
                        resets: inner.resets,
                    },
                    state,
                }
            }
            // Unreachable: `check` passed under the same lock.
            Err(rejection) => {
                inner.counters.count_rejection(rejection.cause);
                Admission::Rejected(rejection)
            }
        }
    }

    /// Admits a Messages request on the Anthropic buckets and the account's
    /// concurrency cap (all or nothing), refuses it, or fails it as the fault
    /// plan says, in one critical section at the counting instant.
    pub(crate) fn admit_messages(
        self: &Arc<Self>,
        demand: MessagesDemand,
        plan: &FaultPlan,
    ) -> MessagesAdmission {
        let mut inner = self.inner.lock();
        let now = self.clock.now();
        let inner = &mut *inner;
        if let Err(rejection) = inner.messages.check(now, demand.input, demand.max_tokens) {
            inner.counters.count_messages_rejection(rejection.cause);
            return MessagesAdmission::Rejected(rejection);
        }
        if !inner.referee.try_occupy() {
            let rejection = MessagesRejection {
                cause: MessagesCause::Concurrency,
                retry_after: None,
                state: inner.messages.state(now),
            };
            inner.counters.count_messages_rejection(rejection.cause);
            return MessagesAdmission::Rejected(rejection);
        }
        if let Some(status) = plan.server_error {
            inner.referee.release();
            inner.counters.faults.server_error += 1;
            return MessagesAdmission::ServerError {
                status,
                state: inner.messages.state(now),
            };
        }
        match inner
            .messages
            .try_admit(now, demand.input, demand.max_tokens)
        {
            Ok(state) => {
                inner.counters.bill(demand.bill);
                MessagesAdmission::Admitted {
                    guard: RequestGuard {
                        shared: Arc::clone(self),
                        done: false,
                        settle: None,
                        refund_output: demand.max_tokens.saturating_sub(demand.generated),
                        resets: inner.resets,
                    },
                    state,
                }
            }
            // Unreachable: `check` passed under the same lock.
            Err(rejection) => {
                inner.referee.release();
                inner.counters.count_messages_rejection(rejection.cause);
                MessagesAdmission::Rejected(rejection)
            }
        }
    }

    pub(crate) fn stats(&self) -> SimStats {
        let inner = self.inner.lock();
        inner.counters.snapshot(&inner.referee, &inner.messages)
    }

    pub(crate) fn reset(&self) {
        let mut inner = self.inner.lock();
        inner.referee.clear();
        inner.messages.clear();
        inner.counters = Counters::default();
        inner.resets += 1;
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
    /// With reconciliation: the token entry and the usage that replaces its
    /// charge when the request ends.
    settle: Option<(Ticket, u64)>,
    /// The state's reset count when the request was admitted.
    resets: u64,
    /// A Messages request's unused output allowance, given back to the OTPM
    /// bucket when the request ends (0 for the other routes).
    refund_output: u64,
}

impl RequestGuard {
    /// Releases the slot and applies `f` to the counters, once.
    pub(crate) fn finish(&mut self, f: impl FnOnce(&mut Counters)) {
        if self.done {
            return;
        }
        self.done = true;
        let mut inner = self.shared.inner.lock();
        if let Some((ticket, usage)) = self.settle.take() {
            let now = self.shared.clock.now();
            inner.referee.settle(now, ticket, usage);
        }
        if self.refund_output > 0 && inner.resets == self.resets {
            let now = self.shared.clock.now();
            let amount = std::mem::take(&mut self.refund_output);
            inner.messages.refund_output(now, amount);
        }
        inner.referee.release();
        // Counters cleared by a `/reset` since the request was admitted do
        // not count its end.
        if inner.resets == self.resets {
            f(&mut inner.counters);
        }
    }
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.finish(|c| c.client_disconnects += 1);
    }
}
