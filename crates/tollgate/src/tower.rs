//! A `tower::Layer` that puts admission, one deadline and retries around
//! any `tower::Service` (feature `tower`).
//!
//! The layer turns the inner service into a [`Provider`] and runs every
//! request through a [`Supervisor`]: the same lifecycle the gateway and the
//! batch runner use. Requests must be `Clone` (a retry sends the request
//! again); errors of the inner service are classified into the retry
//! classes of SPEC RT-2 by a function you provide.
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
use crate::lifecycle::{
    AttemptContext, AttemptPolicy, CallError, CallOptions, ErrorKind, Provider, ProviderError,
    Reply, StreamEvent, Supervisor,
};
use crate::usage::Usage;

/// Classifies an inner service error into a provider error (SPEC RT-2).
pub type Classify<E> = Arc<dyn Fn(&E) -> ProviderError + Send + Sync>;

/// Wraps services taking `Req` and failing with `E` in admission, a
/// deadline and retries.
pub struct TollgateLayer<Req, E> {
    controller: AdmissionController,
    classify: Classify<E>,
    policy: AttemptPolicy,
    scope: ScopeId,
    pool: Option<PoolId>,
    timeout: Option<Duration>,
    transport_timeout: Option<Duration>,
    _req: PhantomData<fn(Req)>,
}

impl<Req, E> Clone for TollgateLayer<Req, E> {
    fn clone(&self) -> Self {
        TollgateLayer {
            controller: self.controller.clone(),
            classify: Arc::clone(&self.classify),
            policy: self.policy,
            scope: self.scope,
            pool: self.pool,
            timeout: self.timeout,
            transport_timeout: self.transport_timeout,
            _req: PhantomData,
        }
    }
}

impl<Req, E> fmt::Debug for TollgateLayer<Req, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TollgateLayer")
            .field("scope", &self.scope)
            .field("policy", &self.policy)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl<Req, E: 'static> TollgateLayer<Req, E> {
    /// A layer admitting through `controller`, classifying inner errors
    /// with `classify`.
    pub fn new(
        controller: AdmissionController,
        classify: impl Fn(&E) -> ProviderError + Send + Sync + 'static,
    ) -> Self {
        TollgateLayer {
            controller,
            classify: Arc::new(classify),
            policy: AttemptPolicy::default(),
            scope: ScopeId::FIRST,
            pool: None,
            timeout: None,
            transport_timeout: None,
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

impl<S, Req, E> Layer<S> for TollgateLayer<Req, E>
where
    S: Service<Req, Error = E> + Clone + Send + Sync + 'static,
    S::Future: Send,
    S::Response: Send + 'static,
    Req: Clone + Send + Sync + 'static,
    E: Send + 'static,
{
    type Service = TollgateService<S, Req, E>;

    fn layer(&self, service: S) -> Self::Service {
        let provider = ServiceProvider {
            service,
            classify: Arc::clone(&self.classify),
            _req: PhantomData,
        };
        let mut b = Supervisor::builder(self.controller.clone(), provider)
            .policy(self.policy)
            .scope(self.scope);
        if let Some(pool) = self.pool {
            b = b.pool(pool);
        }
        if let Some(t) = self.transport_timeout {
            b = b.transport_timeout(t);
        }
        TollgateService {
            // The settings were validated by the layer's setters.
            supervisor: b.build_validated(),
            timeout: self.timeout,
        }
    }
}

/// An inner service seen as a one-shot provider.
pub struct ServiceProvider<S, Req, E> {
    service: S,
    classify: Classify<E>,
    _req: PhantomData<fn(Req)>,
}

/// Streaming is not offered by plain services.
pub type NoStream<R> = Pin<Box<dyn Stream<Item = Result<StreamEvent<R>, ProviderError>> + Send>>;

impl<S, Req, E> Provider for ServiceProvider<S, Req, E>
where
    S: Service<Req, Error = E> + Clone + Send + Sync + 'static,
    S::Future: Send,
    S::Response: Send + 'static,
    E: Send + 'static,
    Req: Clone + Send + Sync + 'static,
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
            Ok(body) => Ok(Reply {
                body,
                usage: Usage::UNKNOWN,
            }),
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
pub struct TollgateService<S, Req, E>
where
    S: Service<Req, Error = E> + Clone + Send + Sync + 'static,
    S::Future: Send,
    S::Response: Send + 'static,
    E: Send + 'static,
    Req: Clone + Send + Sync + 'static,
{
    supervisor: Supervisor<ServiceProvider<S, Req, E>>,
    timeout: Option<Duration>,
}

impl<S, Req, E> Clone for TollgateService<S, Req, E>
where
    S: Service<Req, Error = E> + Clone + Send + Sync + 'static,
    S::Future: Send,
    S::Response: Send + 'static,
    E: Send + 'static,
    Req: Clone + Send + Sync + 'static,
{
    fn clone(&self) -> Self {
        TollgateService {
            supervisor: self.supervisor.clone(),
            timeout: self.timeout,
        }
    }
}

impl<S, Req, E> Service<Req> for TollgateService<S, Req, E>
where
    S: Service<Req, Error = E> + Clone + Send + Sync + 'static,
    S::Future: Send,
    S::Response: Send + 'static,
    E: Send + 'static,
    Req: Clone + Send + Sync + 'static,
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
        Box::pin(async move {
            supervisor
                .invoke(&request, CallOptions::deadline(deadline))
                .await
                .map(|c| c.response)
        })
    }
}
