//! The flow every model route follows (SPEC GW-1..GW-14): deadline first,
//! identity, body, tenant admission, then the model and its fallbacks
//! routed over their deployments through the supervised lifecycle,
//! one-shot or streaming; every response gets the request id and the
//! tenant's rate-limit headers, and one access-log line.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::body::Body;
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode, header};
use serde::de::DeserializeOwned;
use tollgate::clock::Instant;
use tollgate::lifecycle::{CallError, CallOptions, ErrorKind, GiveUp, ProviderError};
use tollgate::{Admission, Deadline, Flow, Priority, ReservePrice, TokenEstimate, Usage};
use tollgate_openai::tokens::{TokenEstimator, TokenizerKind};
use tollgate_openai::{ErrorResponse, UpstreamRequest};

use super::common;
use crate::access_log::{AccessLog, Record};
use crate::config::ApiRoute;
use crate::connection::{Arrival, LINGER};
use crate::counting;
use crate::error::ApiError;
use crate::error::Dialect;
use crate::provider::{GatewayRequest, Started};
use crate::router::{self, Routed};
use crate::sse::{SseBody, StreamLog};
use crate::state::{AppState, Deployment, Model};
use crate::tenants::TenantLeases;
use crate::{ratelimit, request_id};

/// What tells one model route from another.
pub trait Route: 'static {
    /// The parsed request body.
    type Request: DeserializeOwned + Send + 'static;
    /// The route's label in metrics.
    const NAME: &'static str;
    /// Its `gen_ai.operation.name` in traces (SPEC OBS-5).
    const OPERATION: &'static str = crate::telemetry::semconv::OP_CHAT;
    /// The route, which models must serve (SPEC WIRE-4).
    const ROUTE: ApiRoute;
    /// The dialect of its errors.
    const DIALECT: Dialect;
    /// The model the request names.
    fn model(request: &Self::Request) -> &str;
    /// Tokens the request will spend, counted by `estimator` (a
    /// deployment's tokenizer, accounting and output allowance).
    fn estimate(estimator: &TokenEstimator, request: &Self::Request) -> TokenEstimate;
    /// [`estimate`](Self::estimate)'s output allowance alone, without
    /// counting any text: what a deployment whose estimator counts input
    /// like another's ([`TokenEstimator::same_input`]) adds to that
    /// one's input estimate.
    fn output(estimator: &TokenEstimator, request: &Self::Request) -> u64;
    /// The request as sent to `upstream_model`. `body` is the client's
    /// body as received: when nothing needs rewriting it goes upstream
    /// unchanged (no re-serialization).
    ///
    /// A request without an output cap goes with the allowance its
    /// reservation counted (`deployment.estimator.output_cap()`), so the
    /// provider never generates, and bills, more than was reserved (SPEC
    /// Q-7, BUD-2).
    fn upstream(
        request: &Self::Request,
        body: &Bytes,
        deployment: &Deployment,
    ) -> Result<UpstreamRequest, serde_json::Error>;
    /// Whether the client asked for a stream.
    fn is_stream(request: &Self::Request) -> bool;
    /// Headers of the client's request that go upstream with it (none
    /// unless the route's dialect needs them).
    fn forward(_client: &HeaderMap, upstream: UpstreamRequest) -> UpstreamRequest {
        upstream
    }
}

/// The upstream request of a dialect whose streams carry their usage in
/// their own terminal events (Messages; embeddings do not stream): the
/// client's body as received, its `model` set in its text when the model
/// is renamed (nothing is serialised again), else, for a body that cannot
/// be edited as text, `renamed()`.
pub fn as_received_or(
    endpoint: tollgate_openai::Endpoint,
    request_model: &str,
    stream: bool,
    body: &Bytes,
    upstream_model: &str,
    renamed: impl FnOnce() -> Result<UpstreamRequest, serde_json::Error>,
) -> Result<UpstreamRequest, serde_json::Error> {
    UpstreamRequest::renamed(endpoint, request_model, body, upstream_model, stream)
        .map_or_else(renamed, Ok)
}

/// What one request learned on its way, for its headers and its
/// access-log line.
struct Exchange {
    record: Record,
    /// The tenant's ordinal, once authenticated.
    tenant: Option<usize>,
    /// The class the call waits in upstream, once known (SPEC FAIR-7).
    class: Option<Priority>,
    /// The requested model, once known and allowed.
    model: Option<Arc<str>>,
    /// The model and deployment of the last attempt, once one was routed.
    served: Option<(Arc<Model>, usize)>,
    /// Tokens reserved for the tenant (input estimate and output
    /// allowance).
    tokens: TokenEstimate,
    /// The prices the tenant reserved them at, if the call is priced
    /// (SPEC BUD-2).
    price: Option<ReservePrice>,
    /// The access line was written, or handed to the stream body (which
    /// writes it when the stream ends).
    logged: bool,
    /// Where the line goes.
    log: AccessLog,
    /// Where the call's cost is counted.
    spend: crate::spend::Spend,
    /// Counts the call's attempts that reached an upstream.
    reached: Started,
    /// When the request's head was read.
    arrived: Instant,
}

impl Exchange {
    /// The deployment whose quota scope (the account) the call spent: the
    /// one of its last attempt, else the requested model's first.
    fn account<'a>(&'a self, app: &'a AppState) -> Option<&'a Deployment> {
        match &self.served {
            Some((model, d)) => model.deployments.get(*d),
            None => self
                .model
                .as_deref()
                .and_then(|m| app.models.get(m))
                .and_then(|m| m.deployments.first()),
        }
    }

    /// Notes what the call cost its tenant (`None`: not priced): in the
    /// access line and the spend of its tenant and model (SPEC BUD-6).
    fn charge(&mut self, cost: Option<u64>) {
        self.record.cost = cost;
        if let (Some(c), Some(tenant), Some(model)) =
            (cost, &self.record.tenant, &self.record.model)
        {
            self.spend.record(tenant, model, c);
        }
    }

    /// Writes the access line once, with the response's `status`.
    fn write(&mut self, status: u16) {
        if !self.logged {
            self.logged = true;
            self.record.status = status;
            self.record.total = self.arrived.elapsed();
            self.log.write(&self.record);
            if let Some(trace) = self.record.trace.take() {
                trace.finish(&self.record.call_end());
            }
        }
    }
}

impl Drop for Exchange {
    /// A request whose client went away before its response (the handler
    /// was dropped) still gets its line: status 499, as nginx writes it.
    fn drop(&mut self) {
        if !self.logged {
            self.record.error = Some("client_disconnected".to_owned());
            // What [`Unsettled`] settles the tenant's lease with: nothing
            // for a call no upstream saw (SPEC Q-9, BUD-4), else what its
            // attempts may have cost (Q-5, BUD-5).
            if self.record.cost.is_none() && self.record.cost_reserved.is_some() {
                self.charge(Some(self.reached.billed()));
            }
            self.write(499);
        }
    }
}

/// Serves one request of route `R`: the deadline from the instant its
/// head was read (SPEC DL-1), identity from the headers alone (401 before
/// any body byte is read), then the body under its size and time bounds
/// (SPEC GW-17), then admission. Every response carries the request id
/// and, once the tenant is known, its rate-limit headers (GW-13, GW-14).
pub async fn handle<R: Route>(app: &AppState, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let arrival = parts.extensions.get::<Arrival>();
    let arrived = arrival.map_or_else(Instant::now, |a| a.at);
    let id = request_id::of(&parts.headers);
    let mut x = Exchange {
        record: Record {
            at: SystemTime::now().checked_sub(arrived.elapsed()),
            request_id: id.to_str().unwrap_or_default().to_owned(),
            route: R::NAME,
            ..Record::default()
        },
        tenant: None,
        class: None,
        model: None,
        served: None,
        tokens: TokenEstimate::new(0, 0),
        price: None,
        logged: false,
        log: app.access_log.clone(),
        spend: app.spend.clone(),
        reached: Started::default(),
        arrived,
    };
    x.record.trace = app.telemetry.call(
        &parts.headers,
        R::OPERATION,
        R::NAME,
        x.record.at.unwrap_or_else(SystemTime::now),
    );
    let mut response = match serve::<R>(app, &parts, body, arrived, &id, &mut x).await {
        Ok(response) => response,
        Err(e) => {
            app.metrics
                .request(R::NAME, x.model.as_deref().unwrap_or(""), e.status.as_u16());
            x.record.error = Some(e.reason().to_owned());
            e.into_response_for(R::DIALECT)
        }
    };
    let headers = response.headers_mut();
    // Room for what usually follows (the rate-limit headers of requests
    // and tokens, the request id, the class) at once, not one table growth
    // after another.
    headers.reserve(8);
    if let Some(slot) = x.tenant.and_then(|t| app.tenant_slots.get(t)) {
        let account = x.account(app).map(|d| (d.supervisor.controller(), d.scope));
        ratelimit::add(
            slot,
            x.model.as_deref(),
            account,
            x.tokens,
            x.price,
            headers,
        );
    }
    headers.insert(request_id::HEADER, id);
    if let Some(class) = x.class {
        headers.insert(
            common::PRIORITY_HEADER,
            HeaderValue::from_static(class.as_str()),
        );
    }
    x.write(response.status().as_u16());
    response
}

async fn serve<R: Route>(
    app: &AppState,
    parts: &http::request::Parts,
    body: Body,
    arrived: Instant,
    id: &HeaderValue,
    x: &mut Exchange,
) -> Result<Response, ApiError> {
    let arrival = parts.extensions.get::<Arrival>();
    let headers = &parts.headers;
    let deadline = common::deadline(app, headers, arrived);
    if app.is_shutting_down() {
        return Err(ApiError::shutting_down());
    }
    let tenant = common::tenant(app, headers, R::DIALECT)?;
    x.tenant = Some(tenant);
    x.record.tenant = app.tenant_slots.get(tenant).map(|t| Arc::clone(&t.name));
    let flow = common::flow(app, tenant, headers)?;
    x.class = Some(flow.priority());
    x.record.class = Some(flow.priority().as_str());
    let raw = common::read_body(app, headers, body, arrived, deadline).await?;
    // A large body is parsed, then counted, off the async workers, in one
    // turn of the counting lane (SPEC GW-17).
    let mut turn = None;
    let request: R::Request = if raw.len() >= counting::PARSE_OFF_WORKER_BYTES {
        let parsing = "parsing its body";
        let work = raw.len() / counting::PARSE_SHARE;
        let t = within(deadline, parsing, counting::turn(flow, work)).await?;
        let body = raw.clone();
        let parsed = within(deadline, parsing, t.run(move || common::parse(&body))).await?;
        app.metrics
            .large_body_job(x.record.tenant.as_ref(), "parse");
        turn = Some(t);
        parsed?
    } else {
        common::parse(&raw)?
    };
    let first = common::model(app, tenant, R::model(&request), R::ROUTE)?;
    x.model = Some(Arc::clone(&first.name));
    x.record.model = Some(Arc::clone(&first.name));
    if let Some(trace) = &x.record.trace {
        trace.requested(&first.name);
    }
    if first.deployments.is_empty() {
        return Err(ApiError::shutting_down());
    }
    let chain = common::chain(app, tenant, &first, R::ROUTE);
    // The estimates of every deployment of the chain serve both the
    // tenant's reservation and the attempts: the tokenizer runs once per
    // estimator; a long count, off the async workers (SPEC GW-17).
    let (request, estimates) = match Estimates::<R>::long(&chain, &request, raw.len()) {
        Some(bytes) => {
            let turn = match turn.take() {
                Some(t) => {
                    t.charge(bytes);
                    t
                }
                None => within(deadline, COUNTING, counting::turn(flow, bytes)).await?,
            };
            let chain = chain.to_vec();
            let count = turn.run(move || {
                let estimates = Estimates::<R>::new(&chain, &request);
                (request, estimates)
            });
            let counted = within(deadline, COUNTING, count).await?;
            app.metrics
                .large_body_job(x.record.tenant.as_ref(), "count");
            counted
        }
        None => {
            let estimates = Estimates::<R>::new(&chain, &request);
            (request, estimates)
        }
    };
    // The lane's turn ends before admission, which may wait.
    drop(turn);
    // The tenant reserves the worst case of whichever deployment of the
    // chain may serve the call (SPEC BUD-2, GW-10, GW-11): the largest
    // input estimate and the largest output allowance any of them sends
    // upstream, at the dearest prices of the chain. Whichever answers, the
    // provider cannot bill more than the tenant reserved.
    let estimate = estimates.worst();
    let total = estimate.input.checked_add(estimate.output);
    if total.is_none_or(|t| t > crate::error::MAX_CALL_TOKENS) {
        return Err(ApiError::call_too_large(total));
    }
    x.tokens = estimate;
    x.record.tokens_estimated = Some(estimate.total());
    let price = crate::state::reserve_price(&chain);
    x.price = price;
    let reached = x.reached.clone();
    let unsettled = Unsettled {
        leases: common::admit_tenant(app, tenant, &first.name, estimate, price, deadline).await?,
        reached: reached.clone(),
    };
    let tenant_lease = &unsettled.leases;
    x.record.queue = tenant_lease.wait();
    if price.is_some() {
        x.record.cost_reserved = Some(tenant_lease.reserved_cost());
    }
    let options = CallOptions::deadline(deadline);
    let trace = x.record.trace.clone();
    let mut last = None;
    // A budget of the tenant that kept the call from going on: a
    // fallback's per-model budget, or a budget that could not take a
    // retry (SPEC BUD-2, BUD-4).
    let mut refusal = None;
    for (i, model) in chain.iter().enumerate() {
        if i > 0 {
            app.metrics.fallback(&chain[i - 1].name, &model.name);
            // The tenant's limits on the fallback model, if it has some,
            // take the call before any attempt on it (SPEC GW-10, GW-12):
            // its worst case on that model. A budget that cannot take it
            // skips the model, as an open circuit does.
            if !tenant_lease.has_model(i) {
                let on = std::slice::from_ref(model);
                let worst = estimates.worst_of(model);
                let admitted = common::admit_model(
                    app,
                    tenant,
                    &model.name,
                    worst,
                    crate::state::reserve_price(on).or(price),
                    deadline,
                )
                .await;
                match admitted {
                    Ok(Some(lease)) => tenant_lease.add_model(i, lease),
                    Ok(None) => {}
                    Err(e) => {
                        refusal = Some(e);
                        continue;
                    }
                }
            }
            refusal = None;
        }
        let estimate = |d: &Deployment| estimates.get(d);
        // A body that cannot be rewritten for a deployment fails the call
        // as a client error (400), never retried.
        let make = |d: &Deployment| -> Result<GatewayRequest, Box<CallError>> {
            let upstream = R::upstream(&request, &raw, d)
                .map_err(|e| {
                    Box::new(CallError::Provider {
                        error: ProviderError::new(ErrorKind::Client, e.to_string()),
                        attempts: 0,
                        gave_up: GiveUp::NotRetryable,
                    })
                })?
                .with_request_id(id.clone());
            let upstream = R::forward(headers, upstream);
            Ok(GatewayRequest {
                upstream,
                estimate: estimates.get(d),
                price: d.price,
                started: reached.clone(),
                trace: trace.clone(),
                model: i,
                tenant: Some(tenant_lease.clone()),
            })
        };
        let started = Instant::now();
        let result = if R::is_stream(&request) {
            // Boxed, here and below: the attempts' state is most of the
            // handler's future, which is otherwise copied whole into its
            // box at the start of every request (BENCHMARKS.md, "Smaller
            // futures, and the driven path for one-shot calls measured").
            let routed = Box::pin(router::route(model, &estimate, options, flow, |d| {
                let call = make(d);
                let supervisor = d.supervisor.clone();
                async move {
                    supervisor
                        .stream_with_flow(&call.map_err(|e| *e)?, options, flow)
                        .await
                }
            }))
            .await;
            match routed {
                Ok(Routed {
                    value: mut stream,
                    deployment,
                    in_flight,
                }) => {
                    let a = *stream.admission();
                    let elapsed = started.elapsed();
                    model
                        .metrics
                        .success(true, elapsed, a.quota_wait, a.concurrency_wait);
                    // The tenant's permit lives and ends with the stream,
                    // even one nobody polls (SPEC POOL-1, GW-17); it is
                    // charged the stream's cost and what the attempts
                    // before it may have cost (BUD-2, BUD-5).
                    let before = tenant_lease.hand_to_stream(&reached, i, &mut stream);
                    // A client that stops reading cannot keep its
                    // connection past the deadline either.
                    let close = arrival
                        .zip(deadline.instant())
                        .map(|(a, at)| a.connection.close_at(at.checked_add(LINGER).unwrap_or(at)));
                    let mut record = x.record.clone();
                    served(&mut record, model, deployment, &reached, &a, elapsed);
                    count_served(app, tenant, flow, estimates.get_for(model, deployment));
                    x.served = Some((Arc::clone(model), deployment));
                    record.stream = true;
                    record.status = 200;
                    x.logged = true;
                    let log = StreamLog {
                        record,
                        log: app.access_log.clone(),
                        arrived,
                        spend: app.spend.clone(),
                        charged_before: before,
                    };
                    let body = SseBody::new(
                        stream,
                        app.metrics.clone(),
                        Arc::clone(&model.name),
                        close,
                        in_flight,
                        log,
                        R::DIALECT,
                    );
                    let mut response = Body::from_stream(body).into_response();
                    let h = response.headers_mut();
                    h.insert(
                        header::CONTENT_TYPE,
                        HeaderValue::from_static("text/event-stream"),
                    );
                    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
                    return Ok(response);
                }
                Err(e) => e,
            }
        } else {
            let routed = Box::pin(router::route(model, &estimate, options, flow, |d| {
                let call = make(d);
                let supervisor = d.supervisor.clone();
                async move {
                    supervisor
                        .invoke_with_flow(&call.map_err(|e| *e)?, options, flow)
                        .await
                }
            }))
            .await;
            match routed {
                Ok(Routed {
                    value: done,
                    deployment,
                    ..
                }) => {
                    let elapsed = started.elapsed();
                    let a = done.admission;
                    model
                        .metrics
                        .success(false, elapsed, a.quota_wait, a.concurrency_wait);
                    served(&mut x.record, model, deployment, &reached, &a, elapsed);
                    count_served(app, tenant, flow, estimates.get_for(model, deployment));
                    x.served = Some((Arc::clone(model), deployment));
                    let usage = done.settlement.map_or(Usage::UNKNOWN, |s| s.usage);
                    x.record.tokens_reported = usage.total();
                    x.record.usage = Some(usage);
                    // The tenant pays the answer and every attempt before
                    // it the provider may have billed (SPEC BUD-2, BUD-5),
                    // settled before the rate-limit headers are read, so
                    // they show the settled amounts; its permit goes back
                    // at once (POOL-1).
                    let cost = tenant_lease.settle_answer(&reached, i, usage);
                    x.charge(cost);
                    return Ok(one_shot(done.response, arrival, deadline));
                }
                Err(e) => e,
            }
        };
        x.record.attempts = reached.count();
        if let Some(i) = result.deployment
            && let Some(d) = model.deployments.get(i)
        {
            x.record.deployment = Some(Arc::clone(&d.name));
            x.served = Some((Arc::clone(model), i));
        }
        let next = common::falls_back(&result.error);
        last = Some(result.error);
        if !next {
            break;
        }
    }
    let cost = tenant_lease.settle_failed(&reached);
    x.charge(cost);
    let now = Instant::now();
    // A budget of the tenant that kept an attempt from being sent, or the
    // call from its fallback, names itself (SPEC BUD-4).
    if let Some((e, scope)) = tenant_lease.refused().or(refusal) {
        return Err(common::tenant_refusal(app, tenant, &e, scope, now));
    }
    let err = match (&last, &x.served) {
        // A budget of the account (the deployment's scope) names itself
        // (SPEC BUD-4).
        (Some(CallError::Admission(a)), Some((model, d))) if crate::spend::is_budget(a) => {
            match model.deployments.get(*d) {
                Some(d) => {
                    let controller = d.supervisor.controller();
                    let name = controller
                        .snapshot()
                        .scope(d.scope)
                        .map_or_else(String::new, |s| s.name.clone());
                    let who = format!("account {name}");
                    crate::spend::budget_exceeded(a, controller, d.scope, &who, now)
                }
                None => ApiError::from_admission(a, now),
            }
        }
        (Some(e), _) => ApiError::from_call(e, now),
        (None, _) => ApiError::shutting_down(),
    };
    if err.status == StatusCode::TOO_MANY_REQUESTS {
        app.metrics.rejected(err.reason());
    }
    Err(err)
}

/// Counts a call of `tenant` admitted upstream in `flow`'s class, with its
/// token estimate (SPEC FAIR-8); `/metrics` publishes the counts.
fn count_served(app: &AppState, tenant: usize, flow: Flow, estimate: TokenEstimate) {
    let Some(slot) = app.tenant_slots.get(tenant) else {
        return;
    };
    slot.served.add(flow.priority(), estimate.total());
}

/// Notes in `record` where and how a call was served.
fn served(
    record: &mut Record,
    model: &Model,
    deployment: usize,
    reached: &Started,
    admission: &Admission,
    elapsed: Duration,
) {
    let wait = admission.total_wait();
    let quota_wait = admission.quota_wait;
    record.model = Some(Arc::clone(&model.name));
    if let Some(d) = model.deployments.get(deployment) {
        d.metrics.admitted(quota_wait);
        record.deployment = Some(Arc::clone(&d.name));
    }
    record.attempts = reached.count();
    record.limited_by = Some(admission.limited_by.as_str());
    record.admission = Some(*admission);
    record.queue += wait;
    record.upstream = elapsed.saturating_sub(wait);
}

/// The response of a completed one-shot call. A large body keeps its
/// connection no longer than the request's deadline (SPEC GW-17, see
/// [`crate::connection::one_shot_body`]).
fn one_shot(body: Bytes, arrival: Option<&Arrival>, deadline: tollgate::Deadline) -> Response {
    let body = crate::connection::one_shot_body(body, arrival, deadline);
    let mut response = (StatusCode::OK, body).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// The tenant's leases of a call until the call is over. Dropped unsettled
/// (its client went away) while no attempt had reached an upstream, they
/// are given back in full: tokens and money, only the request unit stays
/// spent (SPEC Q-9, BUD-4); once an attempt reached an upstream, an
/// unsettled lease keeps its token estimate and is charged what the
/// attempts may have cost, the one in flight at its worst case (Q-5,
/// BUD-5). Dropping them releases the tenant's permit.
struct Unsettled {
    leases: TenantLeases,
    reached: Started,
}

impl Drop for Unsettled {
    fn drop(&mut self) {
        // Leases already settled (or handed to a stream) stay as they were.
        let _ = self.leases.settle_failed(&self.reached);
    }
}

/// What the counting lane does to a request, in its errors.
const COUNTING: &str = "counting its tokens";

/// `job`, a wait for the counting lane or a job on it ([`counting`]),
/// within the request's deadline (504 past it). `doing` says what the
/// lane does to the request ("parsing its body", [`COUNTING`]) in the
/// errors.
async fn within<T>(
    deadline: Deadline,
    doing: &'static str,
    job: impl Future<Output = Result<T, counting::NotCounted>>,
) -> Result<T, ApiError> {
    let done = match deadline.instant() {
        Some(at) => tokio::time::timeout_at(at, job).await.map_err(|_| {
            ApiError::new(
                StatusCode::GATEWAY_TIMEOUT,
                ErrorResponse::deadline_exceeded(format!(
                    "The request's deadline ran out before the gateway finished {doing}."
                )),
            )
        })?,
        None => job.await,
    };
    done.map_err(|e| match e {
        counting::NotCounted::ShuttingDown => ApiError::shutting_down(),
        counting::NotCounted::Panicked => ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            ErrorResponse::server_error(
                "internal_error",
                format!("The gateway failed while {doing}."),
            ),
        ),
    })
}

/// A request's token estimate per distinct estimator of the deployments of
/// a fallback chain (usually one per provider: deployments of one provider
/// count alike), so the tokenizer runs once per way of counting input, not
/// once per deployment.
struct Estimates<R: Route> {
    computed: Vec<(TokenEstimator, TokenEstimate)>,
    _route: std::marker::PhantomData<fn() -> R>,
}

impl<R: Route> Estimates<R> {
    /// The count's size (`len` times the chain's distinct estimators that
    /// run the tokenizer: each counts the text once) if counting
    /// `request`, a body of `len` bytes, would hold up an async worker: a
    /// model counted by a tokenizer, and a size of at least
    /// [`counting::OFF_WORKER_BYTES`]. A body under 1 KiB is counted in
    /// microseconds by any chain, and a model without a known tokenizer
    /// (or a `chars` accounting rule) by characters, in microseconds even
    /// for 1 MiB.
    fn long(chain: &[Arc<Model>], request: &R::Request, len: usize) -> Option<usize> {
        if len < 1024 || TokenizerKind::for_model(R::model(request)) == TokenizerKind::CharRatio {
            return None;
        }
        let mut distinct: Vec<TokenEstimator> = Vec::with_capacity(1);
        for d in chain.iter().flat_map(|m| &m.deployments) {
            let e = d.estimator;
            if e.tokenizes() && !distinct.iter().any(|c| c.same_input(&e)) {
                distinct.push(e);
            }
        }
        let bytes = len.saturating_mul(distinct.len());
        (bytes >= counting::OFF_WORKER_BYTES).then_some(bytes)
    }

    fn new(chain: &[Arc<Model>], request: &R::Request) -> Self {
        let mut computed: Vec<(TokenEstimator, TokenEstimate)> = Vec::with_capacity(1);
        for d in chain.iter().flat_map(|m| &m.deployments) {
            let e = d.estimator;
            if computed.iter().any(|(c, _)| *c == e) {
                continue;
            }
            // Estimators that differ only in their output allowance (models
            // with their own `default_max_tokens`) count the text once.
            let estimate = match computed.iter().find(|(c, _)| c.same_input(&e)) {
                Some((_, t)) => TokenEstimate::new(t.input, R::output(&e, request)),
                None => R::estimate(&e, request),
            };
            computed.push((e, estimate));
        }
        Estimates {
            computed,
            _route: std::marker::PhantomData,
        }
    }

    /// The largest input estimate and the largest output allowance over
    /// every deployment (SPEC BUD-2): no attempt sends more.
    fn worst(&self) -> TokenEstimate {
        self.computed
            .iter()
            .fold(TokenEstimate::new(0, 0), |w, (_, t)| {
                TokenEstimate::new(w.input.max(t.input), w.output.max(t.output))
            })
    }

    /// [`worst`](Self::worst) over the deployments of `model` only.
    fn worst_of(&self, model: &Model) -> TokenEstimate {
        model
            .deployments
            .iter()
            .map(|d| self.get(d))
            .fold(TokenEstimate::new(0, 0), |w, t| {
                TokenEstimate::new(w.input.max(t.input), w.output.max(t.output))
            })
    }

    fn get(&self, d: &Deployment) -> TokenEstimate {
        self.computed
            .iter()
            .find(|(e, _)| *e == d.estimator)
            .map_or(TokenEstimate::new(0, 0), |(_, t)| *t)
    }

    /// The estimate on deployment number `deployment` of `model`.
    fn get_for(&self, model: &Model, deployment: usize) -> TokenEstimate {
        model
            .deployments
            .get(deployment)
            .map_or(TokenEstimate::new(0, 0), |d| self.get(d))
    }
}
