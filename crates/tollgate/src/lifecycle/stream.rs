//! A supervised stream (SPEC LC-3, LC-4, LC-5, POOL-4, CB-4, DL-6, LC-7).
//!
//! The stream holds its call's lease (so its permits) for its whole life.
//! It ends in exactly one of three ways: `None` after the provider's normal
//! end (`Completed`), one `Err` item and then `None` (`Failed` or
//! `Aborted`), or being dropped by the consumer (`Cancelled`: the upstream
//! request is dropped, so aborted, and every permit returned, with no error
//! injected into the drop).
//!
//! # The watchdog
//!
//! A consumer that stops polling (an HTTP client that stops reading, so a
//! server that stops pulling the body) must not keep the call's capacity
//! past its deadline or past a close (SPEC DL-6, LC-7, GW-17). So the parts
//! of the call that hold something — the upstream stream, the lease and
//! any [held](CallStream::hold) lease, the breaker probe and the call's
//! ownership guard — live in [`Live`], behind one lock shared with a small
//! watchdog task spawned when the stream is created. The watchdog sleeps
//! until the deadline or the controller's close, then takes the lock and
//! ends the call if it is still running: the upstream is dropped (so
//! aborted), the leases settled and released, the call reported `Aborted`.
//! The consumer, if it ever polls again, gets the typed error then `None`.
//!
//! Invariants:
//! - Every transition of [`Live`] happens under its lock, so the consumer
//!   and the watchdog end the call exactly once between them; whichever
//!   comes first wins (SPEC LC-6) and the other sees a terminal call.
//! - The watchdog holds only a `Weak` reference and is aborted when the
//!   stream ends or is dropped: it never keeps a call alive and never
//!   outlives its stream by more than one wake-up.
//! - The consumer also checks the deadline and the close itself on every
//!   poll, so a consumer that does poll sees its deadline at once, without
//!   waiting for the watchdog to be scheduled.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::task::{Context, Poll, Waker};

use futures_core::Stream;
use parking_lot::Mutex;
use tokio::task::JoinHandle;
use tokio::time::Sleep;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use super::breaker::Probe;
use super::outcome::CallError;
use super::provider::{AttemptContext, Provider, ProviderError, StreamEvent};
use super::registry::CallGuard;
use super::supervisor::{CallOptions, Supervisor, report_failure, settle_stream};
use crate::admission::{Admission, Lease};
use crate::clock::Instant;
use crate::deadline::Phase;
use crate::usage::Usage;

/// What an attempt saw before the retry window closed.
pub(crate) enum First<C> {
    Chunk(C),
    ErrorChunk(C, ProviderError),
    End,
}

/// An established stream whose first item is known.
pub(crate) struct Opened<P: Provider> {
    stream: P::Stream,
    first: First<P::Chunk>,
    usage: Option<Usage>,
}

impl<P: Provider> Opened<P> {
    /// The provider's stream.
    pub(crate) fn upstream(&self) -> &P::Stream {
        &self.stream
    }
}

/// Opens a stream and reads up to its first chunk: everything up to here is
/// part of the attempt and may be retried (SPEC LC-3).
pub(crate) async fn open<P: Provider>(
    provider: &P,
    request: &P::Request,
    ctx: AttemptContext,
) -> Result<Opened<P>, ProviderError> {
    let mut stream = provider.stream(request, ctx).await?;
    let mut usage = None;
    loop {
        match std::future::poll_fn(|cx| Pin::new(&mut stream).poll_next(cx)).await {
            Some(Ok(StreamEvent::Chunk(c))) => {
                return Ok(Opened {
                    stream,
                    first: First::Chunk(c),
                    usage,
                });
            }
            Some(Ok(StreamEvent::Usage(u))) => usage = Some(u),
            Some(Ok(StreamEvent::Error(c, e))) => {
                return Ok(Opened {
                    stream,
                    usage: reported(&e).or(usage),
                    first: First::ErrorChunk(c, e),
                });
            }
            // The usage seen before the failure is what the attempt is
            // charged, unless the error reports its own (SPEC BUD-5).
            Some(Err(e)) => {
                return Err(match usage {
                    Some(u) if reported(&e).is_none() => e.with_usage(u),
                    _ => e,
                });
            }
            None => {
                return Ok(Opened {
                    stream,
                    first: First::End,
                    usage,
                });
            }
        }
    }
}

/// The usage an error reports, if it reports any: a provider hands the
/// usage seen so far over with a stream's final error (SPEC BUD-5).
fn reported(e: &ProviderError) -> Option<Usage> {
    e.usage.is_known().then_some(e.usage)
}

type Finish = Pin<Box<dyn Future<Output = Result<(), CallError>> + Send>>;

/// The consumer's side of the stream (touched only from `poll_next`).
enum State<C> {
    /// Delivering: `first` is handed out before anything else.
    Open {
        first: Option<First<C>>,
    },
    /// An error chunk was delivered and the call ended; the typed error
    /// comes next (LC-4).
    Failing(CallError),
    /// The post-stream hook runs after a normal end.
    Finishing(Finish),
    Done,
}

/// Where the call is, as the watchdog must know it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// The upstream is being read; the call holds its capacity.
    Streaming,
    /// The upstream ended normally and the capacity is back; the
    /// post-stream hook runs.
    Finishing,
    /// Terminal and reported.
    Terminal,
}

/// What a watchdog may end without the consumer (see the module
/// documentation). Only touched under the lock of `CallStream::live`.
struct Live<P: Provider> {
    // Field order is drop order: the upstream first, then the capacity,
    // the breaker probe, and the ownership guard last (SPEC LC-1).
    upstream: Option<P::Stream>,
    lease: Option<Lease>,
    /// Leases held for the stream's life besides its own (a tenant's),
    /// each with a cost to charge beside the stream's (micro-dollars).
    held: Vec<(Lease, u64)>,
    probe: Option<Probe>,
    usage: Option<Usage>,
    stage: Stage,
    /// The error the watchdog ended the call with, handed to the consumer
    /// at its next poll.
    ended: Option<CallError>,
    /// The consumer's waker while it waits, woken when the watchdog ends
    /// the call.
    waker: Option<Waker>,
    guard: CallGuard,
    /// Whether the provider's limiter settles with actual usage (SPEC
    /// Q-16); if not, the stream's own lease keeps its estimate.
    reconciles: bool,
    /// The provider's price: the usage seen is priced with it (BUD-2).
    price: Option<crate::price::Price>,
    /// The supervisor: its provider takes the upstream and the lease
    /// together when they are let go ([`Provider::stream_cut`]).
    supervisor: Supervisor<P>,
}

impl<P: Provider> Live<P> {
    /// Lets the upstream go with the stream's lease: the provider returns
    /// the permit once the upstream's work has ended (SPEC POOL-1, LC-5).
    fn let_go(&mut self, lease: Option<Lease>) {
        match (self.upstream.take(), lease) {
            (Some(upstream), Some(lease)) => {
                self.supervisor.inner.provider.stream_cut(upstream, lease);
            }
            (upstream, lease) => {
                drop(upstream);
                drop(lease);
            }
        }
    }
}

impl<P: Provider> Drop for Live<P> {
    fn drop(&mut self) {
        // The consumer dropped the stream mid-way (LC-5): the upstream and
        // the capacity go first, the guard last (LC-1), as the fields'
        // order has it.
        let lease = self.lease.take();
        self.let_go(lease);
    }
}

impl<P: Provider> Live<P> {
    /// Drops the upstream (so aborts it) and settles and releases every
    /// lease with the usage seen so far.
    fn release(&mut self) {
        let usage = self.priced_usage();
        let mut own = self.lease.take();
        if let Some(lease) = &mut own {
            let own = if self.reconciles {
                usage
            } else {
                // The provider's limiter keeps the estimate, but the
                // bill is what was used (BUD-2).
                usage
                    .and_then(|u| u.cost())
                    .map(|c| Usage::UNKNOWN.with_cost(Some(c)))
            };
            settle_stream(lease, own);
        }
        self.let_go(own);
        self.settle_held(usage);
    }

    /// Settles and releases the held leases with `usage` (the stream's
    /// priced usage so far), each charged its extra beside it (SPEC BUD-2).
    fn settle_held(&mut self, usage: Option<Usage>) {
        for (mut lease, extra) in self.held.drain(..) {
            let usage = with_extra(usage, extra, &lease);
            settle_stream(&mut lease, usage);
        }
    }

    /// The usage seen so far, priced at the stream's own model: a held
    /// lease (a tenant's, reserved at another price) settles the money the
    /// attempt cost (SPEC BUD-2).
    fn priced_usage(&self) -> Option<Usage> {
        match (self.usage, &self.price) {
            (Some(u), Some(p)) => Some(u.priced(p)),
            (u, _) => u,
        }
    }

    /// Ends a streaming call with `error`: capacity back first, then the
    /// breaker told, then the report (SPEC DL-6). False if it was no
    /// longer streaming.
    fn fail(&mut self, error: &CallError) -> bool {
        if self.stage != Stage::Streaming {
            return false;
        }
        self.release();
        report_failure(self.probe.take(), error);
        self.guard.finish(Err(error));
        self.stage = Stage::Terminal;
        true
    }

    /// The watchdog fired with `error` while nobody was polling.
    fn expire(&mut self, error: CallError, supervisor: &Supervisor<P>) {
        match self.stage {
            Stage::Streaming
                if self
                    .upstream
                    .as_ref()
                    .is_some_and(|u| supervisor.inner.provider.stream_finished(u)) =>
            {
                // Every item is out, only the transport's end is being
                // read: the call is complete. Its post-stream hook cannot
                // run without a consumer to drive it.
                let scope = self.lease.as_ref().map(Lease::scope);
                self.release();
                if let Some(scope) = scope {
                    supervisor.inner.controller.clear_backoff(scope);
                }
                if let Some(p) = self.probe.take() {
                    p.success();
                }
                if supervisor.inner.hooks.post.is_some() {
                    tracing::warn!(call = ?self.guard.id, "post-stream hook skipped: the stream ended at its deadline with nobody polling");
                }
                self.guard.finish(Ok(()));
                self.stage = Stage::Terminal;
            }
            Stage::Streaming => {
                if self.fail(&error) {
                    self.ended = Some(error);
                }
            }
            // The output is complete and the capacity back; only the
            // post-stream hook is late, which does not undo the stream
            // (as when the hook fails).
            Stage::Finishing => {
                tracing::warn!(call = ?self.guard.id, error = %error, "post-stream hook did not finish");
                self.guard.finish(Ok(()));
                self.stage = Stage::Terminal;
            }
            Stage::Terminal => return,
        }
        if let Some(waker) = self.waker.take() {
            waker.wake();
        }
    }

    fn park(&mut self, cx: &Context<'_>) {
        match &self.waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            _ => self.waker = Some(cx.waker().clone()),
        }
    }
}

/// The stream returned by [`Supervisor::stream`]: chunks, then either a
/// normal end or one typed error.
///
/// Its deadline and the controller's close end the call whether or not
/// the stream is polled (see the module documentation): the capacity is
/// returned at once and the next poll yields the typed error.
pub struct CallStream<P: Provider> {
    live: Arc<Mutex<Live<P>>>,
    state: State<P::Chunk>,
    admission: Admission,
    deadline: Option<Pin<Box<Sleep>>>,
    closing: Pin<Box<WaitForCancellationFutureOwned>>,
    watchdog: Option<JoinHandle<()>>,
    supervisor: Supervisor<P>,
    options: CallOptions,
}

impl<P: Provider> fmt::Debug for CallStream<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("CallStream");
        if let Some(live) = self.live.try_lock() {
            d.field("id", &live.guard.id)
                .field("chunks", &live.guard.chunks)
                .field("stage", &live.stage);
        }
        d.field("done", &matches!(self.state, State::Done))
            .finish_non_exhaustive()
    }
}

/// The deadline error of a stream.
fn stream_deadline() -> CallError {
    CallError::Deadline {
        phase: Phase::Stream,
        retry_at: None,
    }
}

/// Sleeps until the deadline or the close, then ends the call if it still
/// runs (see the module documentation).
async fn watch<P: Provider>(
    supervisor: Supervisor<P>,
    live: Weak<Mutex<Live<P>>>,
    deadline: Option<Instant>,
    closing: CancellationToken,
) {
    let expired = async {
        match deadline {
            Some(d) => tokio::time::sleep_until(d).await,
            None => std::future::pending().await,
        }
    };
    let error = tokio::select! {
        () = closing.cancelled() => CallError::Closed,
        () = expired => stream_deadline(),
    };
    if let Some(live) = live.upgrade() {
        live.lock().expire(error, &supervisor);
    }
}

impl<P: Provider> CallStream<P> {
    pub(crate) fn new(
        supervisor: Supervisor<P>,
        opened: Opened<P>,
        lease: Lease,
        probe: Option<Probe>,
        guard: CallGuard,
        options: CallOptions,
        price: Option<crate::price::Price>,
    ) -> Self {
        let deadline_at = options.deadline.instant();
        let deadline = deadline_at.map(|d| Box::pin(tokio::time::sleep_until(d)));
        let token = supervisor.inner.calls.shutdown.clone();
        let closing = Box::pin(token.clone().cancelled_owned());
        let admission = *lease.admission();
        let live = Arc::new(Mutex::new(Live {
            upstream: Some(opened.stream),
            lease: Some(lease),
            held: Vec::new(),
            probe,
            usage: opened.usage,
            stage: Stage::Streaming,
            ended: None,
            waker: None,
            guard,
            reconciles: supervisor.inner.accounting.reconciles,
            price,
            supervisor: supervisor.clone(),
        }));
        // Outside a tokio runtime nothing here could sleep anyway; the
        // consumer's own checks then remain.
        let watchdog = tokio::runtime::Handle::try_current().ok().map(|rt| {
            rt.spawn(watch(
                supervisor.clone(),
                Arc::downgrade(&live),
                deadline_at,
                token,
            ))
        });
        CallStream {
            live,
            state: State::Open {
                first: Some(opened.first),
            },
            admission,
            deadline,
            closing,
            watchdog,
            supervisor,
            options,
        }
    }

    /// Chunks delivered so far.
    pub fn chunks(&self) -> u64 {
        self.live.lock().guard.chunks
    }

    /// The usage the provider reported so far, if any, priced when the
    /// supervisor has a price (SPEC BUD-2).
    pub fn usage(&self) -> Option<Usage> {
        self.live.lock().priced_usage()
    }

    /// How the streamed attempt was admitted (its quota and concurrency
    /// waits, SPEC OBS-4).
    pub fn admission(&self) -> &Admission {
        &self.admission
    }

    /// Whether the call is terminal (ended normally, failed, or ended by
    /// its deadline or a close), whether or not the consumer saw it yet.
    pub fn is_terminal(&self) -> bool {
        self.live.lock().stage == Stage::Terminal
    }

    /// Holds `lease` (for example a caller's own per-tenant lease) for the
    /// stream's life: it is settled with the stream's usage and released
    /// together with the stream's own lease, however the stream ends —
    /// normally, by a failure, by its deadline or a close (polled or not,
    /// see the module documentation) or by being dropped. A stream that is
    /// already terminal settles and releases it at once.
    pub fn hold(&mut self, lease: Lease) {
        self.hold_charging(lease, 0);
    }

    /// [`hold`](CallStream::hold), charging `extra` micro-dollars beside
    /// the stream's cost when `lease` settles (for example what earlier
    /// attempts of the same call cost, SPEC BUD-2): the stream's priced
    /// usage plus `extra`, or the lease's reserved cost plus `extra` when
    /// the stream's cost is unknown.
    pub fn hold_charging(&mut self, mut lease: Lease, extra: u64) {
        let mut live = self.live.lock();
        if live.stage == Stage::Streaming {
            live.held.push((lease, extra));
        } else {
            let usage = with_extra(live.priced_usage(), extra, &lease);
            settle_stream(&mut lease, usage);
        }
    }

    fn stop_watchdog(&mut self) {
        if let Some(w) = self.watchdog.take() {
            w.abort();
        }
    }
}

/// The provider ended normally: capacity back, breaker told, then the
/// post-stream hook (if any) before the call is terminal.
fn complete<P: Provider>(
    live: &mut Live<P>,
    supervisor: &Supervisor<P>,
    options: CallOptions,
) -> State<P::Chunk> {
    let scope = live.lease.as_ref().map(Lease::scope);
    live.release();
    if let Some(scope) = scope {
        supervisor.inner.controller.clear_backoff(scope);
    }
    if let Some(p) = live.probe.take() {
        p.success();
    }
    match supervisor.inner.hooks.post.clone() {
        None => {
            live.guard.finish(Ok(()));
            live.stage = Stage::Terminal;
            State::Done
        }
        Some(hook) => {
            live.stage = Stage::Finishing;
            let supervisor = supervisor.clone();
            let attempt = live.guard.attempts;
            State::Finishing(Box::pin(async move {
                supervisor.run_hook(Some(&hook), options, attempt).await
            }))
        }
    }
}

impl<P: Provider> Drop for CallStream<P> {
    /// A stream its consumer drops settles its held leases as any other
    /// end does (see [`hold_charging`](CallStream::hold_charging)): the
    /// usage seen so far, else the reserved cost, plus each one's extra
    /// (SPEC BUD-2, BUD-5). Dropped unsettled, a held lease would keep its
    /// reservation and lose the extra it was to charge.
    fn drop(&mut self) {
        self.stop_watchdog();
        let mut live = self.live.lock();
        if live.stage == Stage::Streaming {
            let usage = live.priced_usage();
            live.settle_held(usage);
        }
    }
}

// Nothing in a `CallStream` is ever pinned in place: chunks are moved out
// by value, and the upstream stream and timers are `Unpin` or boxed.
impl<P: Provider> Unpin for CallStream<P> {}

impl<P: Provider> Stream for CallStream<P> {
    type Item = Result<P::Chunk, CallError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        let poll = this.poll_live(cx);
        if matches!(this.state, State::Done) {
            this.stop_watchdog();
        }
        poll
    }
}

impl<P: Provider> CallStream<P> {
    fn poll_live(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<P::Chunk, CallError>>> {
        let mut live = self.live.lock();
        loop {
            match &mut self.state {
                State::Done => return Poll::Ready(None),
                State::Failing(_) => {
                    let State::Failing(e) = std::mem::replace(&mut self.state, State::Done) else {
                        return Poll::Ready(None);
                    };
                    return Poll::Ready(Some(Err(e)));
                }
                State::Finishing(finish) => {
                    if live.stage == Stage::Terminal {
                        // The watchdog ended it while nobody polled.
                        self.state = State::Done;
                        return Poll::Ready(None);
                    }
                    let Poll::Ready(result) = finish.as_mut().poll(cx) else {
                        live.park(cx);
                        return Poll::Pending;
                    };
                    // Output already went out: a failing post-stream hook is
                    // logged and does not undo the completed stream.
                    if let Err(e) = result {
                        tracing::warn!(call = ?live.guard.id, error = %e, "post-stream hook failed");
                    }
                    live.guard.finish(Ok(()));
                    live.stage = Stage::Terminal;
                    self.state = State::Done;
                    return Poll::Ready(None);
                }
                State::Open { first } => {
                    if let Some(e) = live.ended.take() {
                        self.state = State::Done;
                        return Poll::Ready(Some(Err(e)));
                    }
                    if live.stage != Stage::Streaming {
                        self.state = State::Done;
                        return Poll::Ready(None);
                    }
                    if let Some(first) = first.take() {
                        match first {
                            First::Chunk(c) => {
                                live.guard.chunks += 1;
                                return Poll::Ready(Some(Ok(c)));
                            }
                            First::ErrorChunk(c, e) => {
                                live.guard.chunks += 1;
                                live.usage = reported(&e).or(live.usage);
                                let error = CallError::Stream { error: e };
                                live.fail(&error);
                                self.state = State::Failing(error);
                                return Poll::Ready(Some(Ok(c)));
                            }
                            First::End => {
                                self.state = complete(&mut live, &self.supervisor, self.options);
                                continue;
                            }
                        }
                    }
                    let Some(upstream) = live.upstream.as_mut() else {
                        self.state = State::Done;
                        return Poll::Ready(None);
                    };
                    match Pin::new(upstream).poll_next(cx) {
                        Poll::Ready(Some(Ok(StreamEvent::Chunk(c)))) => {
                            live.guard.chunks += 1;
                            return Poll::Ready(Some(Ok(c)));
                        }
                        Poll::Ready(Some(Ok(StreamEvent::Usage(u)))) => {
                            live.usage = Some(u);
                            continue;
                        }
                        Poll::Ready(Some(Ok(StreamEvent::Error(c, e)))) => {
                            live.guard.chunks += 1;
                            live.usage = reported(&e).or(live.usage);
                            let error = CallError::Stream { error: e };
                            live.fail(&error);
                            self.state = State::Failing(error);
                            return Poll::Ready(Some(Ok(c)));
                        }
                        Poll::Ready(Some(Err(e))) => {
                            live.usage = reported(&e).or(live.usage);
                            let error = CallError::Stream { error: e };
                            live.fail(&error);
                            self.state = State::Done;
                            return Poll::Ready(Some(Err(error)));
                        }
                        Poll::Ready(None) => {
                            self.state = complete(&mut live, &self.supervisor, self.options);
                            continue;
                        }
                        Poll::Pending => {}
                    }
                    let expired = if self.closing.as_mut().poll(cx).is_ready() {
                        Some(CallError::Closed)
                    } else if let Some(deadline) = self.deadline.as_mut()
                        && deadline.as_mut().poll(cx).is_ready()
                    {
                        Some(stream_deadline())
                    } else {
                        None
                    };
                    if let Some(error) = expired {
                        // Every item is out and only the transport's end is
                        // being read: the output is complete (LC-3 is not
                        // at stake), so the call completes.
                        let finished = live
                            .upstream
                            .as_ref()
                            .is_some_and(|u| self.supervisor.inner.provider.stream_finished(u));
                        if finished {
                            self.state = complete(&mut live, &self.supervisor, self.options);
                            continue;
                        }
                        live.fail(&error);
                        self.state = State::Done;
                        return Poll::Ready(Some(Err(error)));
                    }
                    live.park(cx);
                    return Poll::Pending;
                }
            }
        }
    }
}

/// `usage` with `extra` micro-dollars more cost: its own cost, or the
/// cost `lease` reserved when it has none, plus `extra`. Unchanged when
/// `extra` is zero.
fn with_extra(usage: Option<Usage>, extra: u64, lease: &Lease) -> Option<Usage> {
    if extra == 0 {
        return usage;
    }
    let own = usage
        .and_then(|u| u.cost())
        .unwrap_or(lease.reservation().demand.cost);
    Some(
        usage
            .unwrap_or(Usage::UNKNOWN)
            .with_cost(Some(own.saturating_add(extra))),
    )
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;
    use crate::admission::AdmissionController;
    use crate::call::{Call, ScopeId};
    use crate::config::{MINUTE, ScopeConfig};
    use crate::deadline::Deadline;
    use crate::lifecycle::outcome::{CallReport, Terminal};
    use crate::lifecycle::provider::Reply;

    type Events = Pin<Box<dyn Stream<Item = Result<StreamEvent<u8>, ProviderError>> + Send>>;

    /// One chunk, then nothing ever again; counts streams still alive.
    #[derive(Clone, Default)]
    struct Stalling {
        alive: Arc<AtomicUsize>,
        /// What `stream_finished` answers.
        finished: Arc<std::sync::atomic::AtomicBool>,
    }

    struct Alive(Arc<AtomicUsize>);

    impl Drop for Alive {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::AcqRel);
        }
    }

    impl Provider for Stalling {
        type Request = ();
        type Response = ();
        type Chunk = u8;
        type Stream = Events;

        async fn call(&self, _: &(), _: AttemptContext) -> Result<Reply<()>, ProviderError> {
            std::future::pending().await
        }

        async fn stream(&self, _: &(), _: AttemptContext) -> Result<Events, ProviderError> {
            self.alive.fetch_add(1, Ordering::AcqRel);
            let alive = Alive(Arc::clone(&self.alive));
            let first = futures_util::stream::once(async { Ok(StreamEvent::Chunk(1)) });
            let rest = futures_util::stream::unfold(alive, |alive| async move {
                std::future::pending::<()>().await;
                Some((Ok(StreamEvent::Chunk(2)), alive))
            });
            Ok(Box::pin(futures_util::StreamExt::chain(first, rest)))
        }

        fn stream_finished(&self, _: &Events) -> bool {
            self.finished.load(Ordering::Acquire)
        }
    }

    struct Env {
        controller: AdmissionController,
        sup: Supervisor<Stalling>,
        provider: Stalling,
        reports: Arc<Mutex<Vec<CallReport>>>,
    }

    fn env() -> Env {
        let controller = AdmissionController::builder()
            .scope(ScopeConfig::new("s").requests(100, MINUTE))
            .concurrency(1)
            .build()
            .expect("valid controller");
        let provider = Stalling::default();
        let reports = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&reports);
        let sup = Supervisor::builder(controller.clone(), provider.clone())
            .without_jitter()
            .observer(Arc::new(move |r: &CallReport| sink.lock().push(r.clone())))
            .build()
            .expect("valid supervisor");
        Env {
            controller,
            sup,
            provider,
            reports,
        }
    }

    /// A stream that delivered its first chunk and is then left alone.
    async fn abandoned(env: &Env, deadline: Deadline) -> CallStream<Stalling> {
        let mut stream = env
            .sup
            .stream(&(), CallOptions::deadline(deadline))
            .await
            .expect("stream opens");
        let first = futures_util::StreamExt::next(&mut stream).await;
        assert!(matches!(first, Some(Ok(1))));
        stream
    }

    fn tenant_controller() -> AdmissionController {
        AdmissionController::builder()
            .scope(ScopeConfig::new("tenant").requests(100, MINUTE))
            .concurrency(1)
            .build()
            .expect("valid controller")
    }

    // proves: LC-3, DL-6 (a stream whose every item is out and that only
    // reads its transport's end completes at its deadline: no error after
    // complete output)
    #[tokio::test(start_paused = true)]
    async fn a_finished_stream_completes_at_its_deadline() {
        let env = env();
        let deadline = Deadline::from_timeout(Some(Duration::from_secs(2)), Instant::now());
        let mut stream = abandoned(&env, deadline).await;
        env.provider.finished.store(true, Ordering::Release);
        let end = futures_util::StreamExt::next(&mut stream).await;
        assert!(end.is_none(), "a normal end, not an error: {end:?}");
        drop(stream);
        let reports = env.reports.lock();
        assert_eq!(reports.len(), 1);
        assert_eq!(reports[0].terminal, Terminal::Completed);
        assert_eq!(env.provider.alive.load(Ordering::Acquire), 0);
        assert_eq!(env.controller.snapshot().active, 0);
    }

    // proves: LC-3, GW-17 (the same with nobody polling: the watchdog
    // completes the call and returns its capacity; the consumer then sees
    // a normal end)
    #[tokio::test(start_paused = true)]
    async fn an_unpolled_finished_stream_completes_at_its_deadline() {
        let env = env();
        let deadline = Deadline::from_timeout(Some(Duration::from_secs(2)), Instant::now());
        let mut stream = abandoned(&env, deadline).await;
        env.provider.finished.store(true, Ordering::Release);
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(
            env.controller.snapshot().active,
            0,
            "capacity back unpolled"
        );
        assert_eq!(env.reports.lock()[0].terminal, Terminal::Completed);
        let end = futures_util::StreamExt::next(&mut stream).await;
        assert!(end.is_none(), "{end:?}");
    }

    // proves: DL-6, POOL-4 (a stream nobody polls still ends at its deadline: the upstream is dropped, its permit and the lease it holds returned, the call Aborted; the consumer then gets the typed error)
    #[tokio::test(start_paused = true)]
    async fn unpolled_stream_ends_at_its_deadline() {
        let env = env();
        let tenants = tenant_controller();
        let deadline = Deadline::from_timeout(Some(Duration::from_secs(2)), Instant::now());
        let mut stream = abandoned(&env, deadline).await;
        let tenant = tenants
            .acquire(&Call::new(ScopeId::FIRST), Deadline::NONE)
            .await
            .expect("tenant lease");
        stream.hold(tenant);
        assert_eq!(env.controller.snapshot().active, 1);
        assert_eq!(tenants.snapshot().active, 1);

        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(stream.is_terminal(), "ended without being polled");
        assert!(env.controller.snapshot().is_idle(), "its permit is back");
        assert!(tenants.snapshot().is_idle(), "the held lease is back");
        assert_eq!(
            env.provider.alive.load(Ordering::Acquire),
            0,
            "upstream dropped"
        );
        assert_eq!(env.sup.active_calls(), 0);
        let reports = env.reports.lock().clone();
        assert_eq!(reports.len(), 1);
        assert_eq!(reports[0].terminal, Terminal::Aborted);
        assert_eq!(reports[0].phase, Some(Phase::Stream));
        let next = futures_util::StreamExt::next(&mut stream).await;
        assert!(matches!(
            next,
            Some(Err(CallError::Deadline {
                phase: Phase::Stream,
                ..
            }))
        ));
        assert!(futures_util::StreamExt::next(&mut stream).await.is_none());
    }

    // proves: LC-7 (close ends a stream nobody polls: close resolves, the call is Aborted, the consumer gets `Closed`)
    #[tokio::test(start_paused = true)]
    async fn close_ends_an_unpolled_stream() {
        let env = env();
        let mut stream = abandoned(&env, Deadline::NONE).await;
        let closed = tokio::time::timeout(Duration::from_secs(60), env.sup.close()).await;
        assert!(closed.is_ok(), "close does not wait for the consumer");
        assert!(env.controller.snapshot().is_idle());
        assert_eq!(env.provider.alive.load(Ordering::Acquire), 0);
        assert_eq!(env.reports.lock()[0].terminal, Terminal::Aborted);
        let next = futures_util::StreamExt::next(&mut stream).await;
        assert!(matches!(next, Some(Err(CallError::Closed))));
    }

    // proves: LC-5 (a stream dropped before its deadline is Cancelled and its watchdog goes with it)
    #[tokio::test(start_paused = true)]
    async fn dropped_stream_is_cancelled_and_the_watchdog_stops() {
        let env = env();
        let deadline = Deadline::from_timeout(Some(Duration::from_secs(2)), Instant::now());
        let stream = abandoned(&env, deadline).await;
        drop(stream);
        assert!(env.controller.snapshot().is_idle());
        tokio::time::sleep(Duration::from_secs(3)).await;
        let reports = env.reports.lock().clone();
        assert_eq!(reports.len(), 1, "reported once, by the drop");
        assert_eq!(reports[0].terminal, Terminal::Cancelled);
    }
}
