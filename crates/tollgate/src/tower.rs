//! A `tower::Layer` that puts admission, one deadline and retries around
//! any `tower::Service` (feature `tower`).
//!
//! The layer turns the inner service into a [`Provider`] and runs every
//! request through a [`Supervisor`]: the same lifecycle the gateway and the
//! batch runner use. Requests must be `Clone` (a retry sends the request
//! again); errors of the inner service are classified into the retry
//! classes of SPEC RT-2 by a function you provide.
//!
//! A scope with a token limit needs an estimate for every attempt (SPEC
//! Q-3): give the layer a [`TokenEstimator`] of the request with
//! [`TollgateLayer::estimator`], or every call fails with
//! `TokenEstimateRequired`. To settle each reservation with what the
//! provider really used (SPEC Q-5), give it a [`UsageExtractor`] of the
//! response with [`TollgateLayer::usage`]; without one, usage is unknown and
//! the estimate is kept.
//!
//! ```
//! use std::time::Duration;
//! use tollgate::config::{ScopeConfig, MINUTE};
//! use tollgate::lifecycle::{ErrorKind, ProviderError};
//! use tollgate::tower::TollgateLayer;
//! use tollgate::AdmissionController;
//! use tower::{Layer, Service, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let controller = AdmissionController::builder()
//!     .scope(ScopeConfig::new("upstream").requests(600, MINUTE))
//!     .concurrency(8)
//!     .build()?;
//! let layer = TollgateLayer::<String, std::io::Error>::new(controller, |e| {
//!     ProviderError::new(ErrorKind::Connect, e.to_string())
//! })
//! .timeout(Duration::from_secs(30));
//! let inner = tower::service_fn(|name: String| async move {
//!     Ok::<_, std::io::Error>(format!("hello {name}"))
//! });
//! let mut service = layer.layer(inner);
//! let reply = service.ready().await?.call("world".to_string()).await?;
//! assert_eq!(reply, "hello world");
//! # Ok(()) }
//! ```
//!
//! With a token limit, an estimator and a usage extractor (see also
//! `cargo run -p tollgate --example tower_tokens --features tower`):
//!
//! ```
//! use tollgate::config::{ScopeConfig, MINUTE};
//! use tollgate::lifecycle::{ErrorKind, ProviderError};
//! use tollgate::tower::TollgateLayer;
//! use tollgate::{AdmissionController, CharRatioEstimator, Dimension, Usage};
//! use tower::{Layer, Service, ServiceExt};
//!
//! # // proves: Q-3, Q-5 (estimated through the layer, settled with usage)
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let controller = AdmissionController::builder()
//!     .scope(ScopeConfig::new("upstream").tokens(10_000, MINUTE))
//!     .build()?;
//! // The inner service answers with its text and the tokens it used.
//! let inner = tower::service_fn(|prompt: String| async move {
//!     Ok::<_, std::io::Error>((prompt.to_uppercase(), 40))
//! });
//! let mut service = TollgateLayer::new(controller.clone(), |e: &std::io::Error| {
//!     ProviderError::new(ErrorKind::Connect, e.to_string())
//! })
//! // ceil(chars / 4) input tokens plus 100 output tokens are reserved ...
//! .estimator(CharRatioEstimator::new(4.0, 100)?)
//! // ... and settled with the tokens the response reports.
//! .usage(|reply: &(String, u64)| Usage::known(reply.1))
//! .layer(inner);
//! let (text, _) = service.ready().await?.call("hello".to_string()).await?;
//! assert_eq!(text, "HELLO");
//! let snapshot = controller.snapshot();
//! let scope = snapshot.scope_named("upstream").ok_or("no scope")?;
//! // 102 tokens were reserved, 40 used: 62 came back.
//! assert_eq!(scope.available(Dimension::Tokens, MINUTE), Some(10_000 - 40));
//! # Ok(()) }
//! ```

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_core::Stream;
use tower::{Layer, Service, ServiceExt};

use crate::admission::AdmissionController;
use crate::call::{PoolId, ScopeId};
use crate::config::ConfigError;
use crate::deadline::Deadline;
use crate::estimate::TokenEstimator;
use crate::flow::Flow;
use crate::lifecycle::{
    AttemptContext, AttemptPolicy, CallError, CallOptions, ErrorKind, Provider, ProviderError,
    Reply, RequestEstimator, StreamEvent, Supervisor,
};
use crate::usage::Usage;

/// Classifies an inner service error into a provider error (SPEC RT-2).
pub type Classify<E> = Arc<dyn Fn(&E) -> ProviderError + Send + Sync>;

/// Tells which flow (tenant, class, weight) a request waits in when the
/// scope is shared (SPEC FAIR-1, FAIR-7); see [`TollgateLayer::flow`].
pub type FlowExtractor<Req> = Arc<dyn Fn(&Req) -> Flow + Send + Sync>;

/// Tells whether a request may be retried automatically (SPEC RT-5).
pub type IdempotencyExtractor<Req> = Arc<dyn Fn(&Req) -> bool + Send + Sync>;

/// Reads the usage a provider reported from a response of type `Resp`
/// (SPEC Q-5, Q-6), so the attempt's token reservation is settled with it.
///
/// A closure `Fn(&Resp) -> Usage` is one. Return [`Usage::UNKNOWN`] when the
/// response says nothing: the estimate is then kept.
pub trait UsageExtractor<Resp: ?Sized>: Send + Sync {
    /// The usage `response` reports.
    fn usage(&self, response: &Resp) -> Usage;
}

impl<Resp: ?Sized, F> UsageExtractor<Resp> for F
where
    F: Fn(&Resp) -> Usage + Send + Sync,
{
    fn usage(&self, response: &Resp) -> Usage {
        self(response)
    }
}

/// The default [`UsageExtractor`]: usage is never known, so every
/// reservation keeps its estimate (SPEC Q-5).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NoUsage;

impl<Resp: ?Sized> UsageExtractor<Resp> for NoUsage {
    fn usage(&self, _: &Resp) -> Usage {
        Usage::UNKNOWN
    }
}

/// Wraps services taking `Req` and failing with `E` in admission, a
/// deadline and retries; `U` reads usage from their responses.
pub struct TollgateLayer<Req, E, U = NoUsage> {
    controller: AdmissionController,
    classify: Classify<E>,
    estimator: Option<RequestEstimator<Req>>,
    flow: Option<FlowExtractor<Req>>,
    idempotent: Option<IdempotencyExtractor<Req>>,
    usage: Arc<U>,
    policy: AttemptPolicy,
    scope: ScopeId,
    pool: Option<PoolId>,
    timeout: Option<Duration>,
    transport_timeout: Option<Duration>,
    _req: PhantomData<fn(Req)>,
}

impl<Req, E, U> Clone for TollgateLayer<Req, E, U> {
    fn clone(&self) -> Self {
        TollgateLayer {
            controller: self.controller.clone(),
            classify: Arc::clone(&self.classify),
            estimator: self.estimator.clone(),
            flow: self.flow.clone(),
            idempotent: self.idempotent.clone(),
            usage: Arc::clone(&self.usage),
            policy: self.policy,
            scope: self.scope,
            pool: self.pool,
            timeout: self.timeout,
            transport_timeout: self.transport_timeout,
            _req: PhantomData,
        }
    }
}

impl<Req, E, U> fmt::Debug for TollgateLayer<Req, E, U> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TollgateLayer")
            .field("scope", &self.scope)
            .field("pool", &self.pool)
            .field("policy", &self.policy)
            .field("timeout", &self.timeout)
            .field("estimator", &self.estimator.is_some())
            .field("flow", &self.flow.is_some())
            .field("idempotent", &self.idempotent.is_some())
            .field("usage", &std::any::type_name::<U>())
            .finish_non_exhaustive()
    }
}

impl<Req, E: 'static> TollgateLayer<Req, E> {
    /// A layer admitting through `controller`, classifying inner errors
    /// with `classify`. It has no estimator and no usage extractor yet.
    pub fn new(
        controller: AdmissionController,
        classify: impl Fn(&E) -> ProviderError + Send + Sync + 'static,
    ) -> Self {
        TollgateLayer {
            controller,
            classify: Arc::new(classify),
            estimator: None,
            flow: None,
            idempotent: None,
            usage: Arc::new(NoUsage),
            policy: AttemptPolicy::default(),
            scope: ScopeId::FIRST,
            pool: None,
            timeout: None,
            transport_timeout: None,
            _req: PhantomData,
        }
    }
}

impl<Req, E, U> TollgateLayer<Req, E, U> {
    /// Estimates each attempt's tokens from its request (SPEC Q-3, asked
    /// again for every attempt, Q-8). Needed when the scope has a token
    /// limit: without it every call fails with `TokenEstimateRequired`. A
    /// failing estimator fails the call with `TokenEstimationFailed` before
    /// the inner service is called.
    pub fn estimator(mut self, estimator: impl TokenEstimator<Req> + 'static) -> Self {
        self.estimator = Some(Arc::new(estimator));
        self
    }

    /// Tells each request's flow (tenant, class, weight): requests of
    /// several tenants sharing the scope then wait fairly (SPEC FAIR-1,
    /// FAIR-7). Without it every request is in [`Flow::DEFAULT`] (FIFO).
    ///
    /// ```
    /// # use tollgate::lifecycle::{ErrorKind, ProviderError};
    /// # use tollgate::tower::TollgateLayer;
    /// # use tollgate::AdmissionController;
    /// use tollgate::{Flow, Priority};
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let controller = AdmissionController::builder().build()?;
    /// // (tenant, prompt) requests; tenant 1 is a batch job.
    /// let layer = TollgateLayer::<(u32, String), std::io::Error>::new(controller, |e| {
    ///     ProviderError::new(ErrorKind::Connect, e.to_string())
    /// })
    /// .flow(|(tenant, _): &(u32, String)| {
    ///     let class = if *tenant == 1 { Priority::Batch } else { Priority::Standard };
    ///     Flow::new(*tenant, class)
    /// });
    /// # let _ = layer; Ok(()) }
    /// ```
    pub fn flow(mut self, extractor: impl Fn(&Req) -> Flow + Send + Sync + 'static) -> Self {
        self.flow = Some(Arc::new(extractor));
        self
    }

    /// Tells which requests may be retried automatically (SPEC RT-5): one
    /// for which `extractor` answers `false` gets a single attempt. Without
    /// it every request is idempotent, as chat completions and embeddings
    /// are.
    pub fn idempotent(mut self, extractor: impl Fn(&Req) -> bool + Send + Sync + 'static) -> Self {
        self.idempotent = Some(Arc::new(extractor));
        self
    }

    /// Reads the provider's usage from each response, so its reservation
    /// is settled (SPEC Q-5): usage below the estimate refunds the
    /// difference, above it records debt. Without an extractor, usage is
    /// unknown and the estimate is kept.
    pub fn usage<U2>(self, extractor: U2) -> TollgateLayer<Req, E, U2> {
        TollgateLayer {
            controller: self.controller,
            classify: self.classify,
            estimator: self.estimator,
            flow: self.flow,
            idempotent: self.idempotent,
            usage: Arc::new(extractor),
            policy: self.policy,
            scope: self.scope,
            pool: self.pool,
            timeout: self.timeout,
            transport_timeout: self.transport_timeout,
            _req: PhantomData,
        }
    }

    /// Retry settings (validated here, SPEC CFG-2).
    pub fn policy(mut self, policy: AttemptPolicy) -> Result<Self, ConfigError> {
        policy.validate()?;
        self.policy = policy;
        Ok(self)
    }

    /// The quota scope requests spend.
    pub fn scope(mut self, scope: ScopeId) -> Self {
        self.scope = scope;
        self
    }

    /// The pool each attempt takes a permit from.
    pub fn pool(mut self, pool: PoolId) -> Self {
        self.pool = Some(pool);
        self
    }

    /// Each request's whole budget, turned into a deadline when the request
    /// enters the service (SPEC DL-1).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Local cap of one attempt (clipped by the deadline); must be longer
    /// than zero.
    pub fn transport_timeout(mut self, timeout: Duration) -> Result<Self, ConfigError> {
        crate::config::non_zero("transport_timeout", timeout)?;
        self.transport_timeout = Some(timeout);
        Ok(self)
    }
}

impl<S, Req, E, U> Layer<S> for TollgateLayer<Req, E, U>
where
    S: Service<Req, Error = E> + Clone + Send + Sync + 'static,
    S::Future: Send,
    S::Response: Send + 'static,
    Req: Clone + Send + Sync + 'static,
    E: Send + 'static,
    U: UsageExtractor<S::Response> + 'static,
{
    type Service = TollgateService<S, Req, E, U>;

    fn layer(&self, service: S) -> Self::Service {
        let provider = ServiceProvider {
            service,
            classify: Arc::clone(&self.classify),
            usage: Arc::clone(&self.usage),
            _req: PhantomData,
        };
        let mut b = Supervisor::builder(self.controller.clone(), provider)
            .policy(self.policy)
            .scope(self.scope);
        if let Some(pool) = self.pool {
            b = b.pool(pool);
        }
        if let Some(estimator) = &self.estimator {
            b = b.estimator(Arc::clone(estimator));
        }
        if let Some(t) = self.transport_timeout {
            b = b.transport_timeout(t);
        }
        TollgateService {
            // The settings were validated by the layer's setters.
            supervisor: b.build_validated(),
            timeout: self.timeout,
            flow: self.flow.clone(),
            idempotent: self.idempotent.clone(),
        }
    }
}

/// An inner service seen as a one-shot provider.
pub struct ServiceProvider<S, Req, E, U = NoUsage> {
    service: S,
    classify: Classify<E>,
    usage: Arc<U>,
    _req: PhantomData<fn(Req)>,
}

/// Streaming is not offered by plain services.
pub type NoStream<R> = Pin<Box<dyn Stream<Item = Result<StreamEvent<R>, ProviderError>> + Send>>;

impl<S, Req, E, U> Provider for ServiceProvider<S, Req, E, U>
where
    S: Service<Req, Error = E> + Clone + Send + Sync + 'static,
    S::Future: Send,
    S::Response: Send + 'static,
    E: Send + 'static,
    Req: Clone + Send + Sync + 'static,
    U: UsageExtractor<S::Response> + 'static,
{
    type Request = Req;
    type Response = S::Response;
    type Chunk = S::Response;
    type Stream = NoStream<S::Response>;

    async fn call(
        &self,
        request: &Req,
        _: AttemptContext,
    ) -> Result<Reply<S::Response>, ProviderError> {
        let service = self.service.clone();
        match service.oneshot(request.clone()).await {
            Ok(body) => {
                let usage = self.usage.usage(&body);
                Ok(Reply::new(body, usage))
            }
            Err(e) => Err((self.classify)(&e)),
        }
    }

    async fn stream(&self, _: &Req, _: AttemptContext) -> Result<Self::Stream, ProviderError> {
        Err(ProviderError::new(
            ErrorKind::Client,
            "this service does not stream",
        ))
    }
}

/// A service wrapped by [`TollgateLayer`].
pub struct TollgateService<S, Req, E, U = NoUsage>
where
    S: Service<Req, Error = E> + Clone + Send + Sync + 'static,
    S::Future: Send,
    S::Response: Send + 'static,
    E: Send + 'static,
    Req: Clone + Send + Sync + 'static,
    U: UsageExtractor<S::Response> + 'static,
{
    supervisor: Supervisor<ServiceProvider<S, Req, E, U>>,
    timeout: Option<Duration>,
    flow: Option<FlowExtractor<Req>>,
    idempotent: Option<IdempotencyExtractor<Req>>,
}

impl<S, Req, E, U> Clone for TollgateService<S, Req, E, U>
where
    S: Service<Req, Error = E> + Clone + Send + Sync + 'static,
    S::Future: Send,
    S::Response: Send + 'static,
    E: Send + 'static,
    Req: Clone + Send + Sync + 'static,
    U: UsageExtractor<S::Response> + 'static,
{
    fn clone(&self) -> Self {
        TollgateService {
            supervisor: self.supervisor.clone(),
            timeout: self.timeout,
            flow: self.flow.clone(),
            idempotent: self.idempotent.clone(),
        }
    }
}

impl<S, Req, E, U> Service<Req> for TollgateService<S, Req, E, U>
where
    S: Service<Req, Error = E> + Clone + Send + Sync + 'static,
    S::Future: Send,
    S::Response: Send + 'static,
    E: Send + 'static,
    Req: Clone + Send + Sync + 'static,
    U: UsageExtractor<S::Response> + 'static,
{
    type Response = S::Response;
    type Error = CallError;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, CallError>> + Send>>;

    /// Always ready: capacity is awaited inside each call, under its
    /// deadline, so a waiting request never holds a slot of the caller.
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), CallError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Req) -> Self::Future {
        let supervisor = self.supervisor.clone();
        let now = supervisor.controller().clock().now();
        let deadline = Deadline::from_timeout(self.timeout, now);
        let flow = self.flow.as_ref().map_or(Flow::DEFAULT, |f| f(&request));
        let options = CallOptions {
            idempotent: self.idempotent.as_ref().is_none_or(|f| f(&request)),
            ..CallOptions::deadline(deadline)
        };
        Box::pin(async move {
            supervisor
                .invoke_with_flow(&request, options, flow)
                .await
                .map(|c| c.response)
        })
    }
}
