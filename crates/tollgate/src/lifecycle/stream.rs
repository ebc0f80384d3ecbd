//! A supervised stream (SPEC LC-3, LC-4, LC-5, POOL-4, CB-4).
//!
//! The stream holds its call's lease (so its permits) for its whole life.
//! It ends in exactly one of three ways: `None` after the provider's normal
//! end (`Completed`), one `Err` item and then `None` (`Failed` or
//! `Aborted`), or being dropped by the consumer (`Cancelled`: the upstream
//! request is dropped, so aborted, and every permit returned, with no error
//! injected into the drop).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures_core::Stream;
use tokio::time::Sleep;
use tokio_util::sync::WaitForCancellationFutureOwned;

use super::breaker::Probe;
use super::outcome::CallError;
use super::provider::{AttemptContext, Provider, ProviderError, StreamEvent};
use super::registry::CallGuard;
use super::supervisor::{CallOptions, Supervisor, report_failure, settle_stream};
use crate::admission::Lease;
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
                    first: First::ErrorChunk(c, e),
                    usage,
                });
            }
            Some(Err(e)) => return Err(e),
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

type Finish = Pin<Box<dyn Future<Output = Result<(), CallError>> + Send>>;

enum State<C> {
    /// Delivering: `first` is handed out before anything else.
    Open {
        first: Option<First<C>>,
    },
    /// An error chunk was delivered; the typed error comes next (LC-4).
    Failing(CallError),
    /// The post-stream hook runs after a normal end.
    Finishing(Finish),
    Done,
}

/// The stream returned by [`Supervisor::stream`]: chunks, then either a
/// normal end or one typed error.
pub struct CallStream<P: Provider> {
    // Field order is drop order: the upstream first, then the capacity,
    // the breaker probe, and the ownership guard last (SPEC LC-1).
    upstream: Option<P::Stream>,
    lease: Option<Lease>,
    probe: Option<Probe>,
    state: State<P::Chunk>,
    usage: Option<Usage>,
    deadline: Option<Pin<Box<Sleep>>>,
    closing: Pin<Box<WaitForCancellationFutureOwned>>,
    supervisor: Supervisor<P>,
    options: CallOptions,
    guard: CallGuard,
}

impl<P: Provider> fmt::Debug for CallStream<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CallStream")
            .field("id", &self.guard.id)
            .field("chunks", &self.guard.chunks)
            .field("done", &matches!(self.state, State::Done))
            .finish_non_exhaustive()
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
    ) -> Self {
        let deadline = options
            .deadline
            .instant()
            .map(|d| Box::pin(tokio::time::sleep_until(d)));
        let closing = Box::pin(supervisor.inner.calls.shutdown.clone().cancelled_owned());
        CallStream {
            upstream: Some(opened.stream),
            lease: Some(lease),
            probe,
            state: State::Open {
                first: Some(opened.first),
            },
            usage: opened.usage,
            deadline,
            closing,
            supervisor,
            options,
            guard,
        }
    }

    /// Chunks delivered so far.
    pub fn chunks(&self) -> u64 {
        self.guard.chunks
    }

    /// The usage the provider reported so far, if any.
    pub fn usage(&self) -> Option<Usage> {
        self.usage
    }

    /// The lease of the attempt being streamed (e.g. for its admission
    /// timings).
    pub fn lease(&self) -> Option<&Lease> {
        self.lease.as_ref()
    }

    /// Ends the call with `error`: the upstream is dropped (aborted) and
    /// every permit returned before the error is handed out (SPEC DL-6).
    fn fail(&mut self, error: CallError) -> Poll<Option<Result<P::Chunk, CallError>>> {
        self.upstream = None;
        if let Some(mut lease) = self.lease.take() {
            settle_stream(&mut lease, self.usage);
        }
        report_failure(self.probe.take(), &error);
        self.guard.finish(Err(&error));
        self.state = State::Done;
        Poll::Ready(Some(Err(error)))
    }

    /// The provider ended normally.
    fn complete(&mut self) {
        self.upstream = None;
        if let Some(mut lease) = self.lease.take() {
            settle_stream(&mut lease, self.usage);
            let supervisor = &self.supervisor.inner;
            supervisor.controller.clear_backoff(lease.scope());
        }
        if let Some(p) = self.probe.take() {
            p.success();
        }
        match self.supervisor.inner.hooks.post.clone() {
            None => {
                self.guard.finish(Ok(()));
                self.state = State::Done;
            }
            Some(hook) => {
                let supervisor = self.supervisor.clone();
                let (options, attempt) = (self.options, self.guard.attempts);
                self.state = State::Finishing(Box::pin(async move {
                    supervisor.run_hook(Some(&hook), options, attempt).await
                }));
            }
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
        loop {
            match &mut this.state {
                State::Done => return Poll::Ready(None),
                State::Failing(_) => {
                    let State::Failing(e) = std::mem::replace(&mut this.state, State::Done) else {
                        return Poll::Ready(None);
                    };
                    return this.fail(e);
                }
                State::Finishing(finish) => {
                    let Poll::Ready(result) = finish.as_mut().poll(cx) else {
                        return Poll::Pending;
                    };
                    // Output already went out: a failing post-stream hook is
                    // logged and does not undo the completed stream.
                    if let Err(e) = result {
                        tracing::warn!(call = ?this.guard.id, error = %e, "post-stream hook failed");
                    }
                    this.guard.finish(Ok(()));
                    this.state = State::Done;
                    return Poll::Ready(None);
                }
                State::Open { first } => {
                    if let Some(first) = first.take() {
                        match first {
                            First::Chunk(c) => {
                                this.guard.chunks += 1;
                                return Poll::Ready(Some(Ok(c)));
                            }
                            First::ErrorChunk(c, e) => {
                                this.guard.chunks += 1;
                                this.state = State::Failing(CallError::Stream { error: e });
                                return Poll::Ready(Some(Ok(c)));
                            }
                            First::End => {
                                this.complete();
                                continue;
                            }
                        }
                    }
                    let Some(upstream) = this.upstream.as_mut() else {
                        this.state = State::Done;
                        return Poll::Ready(None);
                    };
                    match Pin::new(upstream).poll_next(cx) {
                        Poll::Ready(Some(Ok(StreamEvent::Chunk(c)))) => {
                            this.guard.chunks += 1;
                            return Poll::Ready(Some(Ok(c)));
                        }
                        Poll::Ready(Some(Ok(StreamEvent::Usage(u)))) => {
                            this.usage = Some(u);
                            continue;
                        }
                        Poll::Ready(Some(Ok(StreamEvent::Error(c, e)))) => {
                            this.guard.chunks += 1;
                            this.state = State::Failing(CallError::Stream { error: e });
                            return Poll::Ready(Some(Ok(c)));
                        }
                        Poll::Ready(Some(Err(e))) => {
                            return this.fail(CallError::Stream { error: e });
                        }
                        Poll::Ready(None) => {
                            this.complete();
                            continue;
                        }
                        Poll::Pending => {}
                    }
                    if this.closing.as_mut().poll(cx).is_ready() {
                        return this.fail(CallError::Closed);
                    }
                    if let Some(deadline) = this.deadline.as_mut()
                        && deadline.as_mut().poll(cx).is_ready()
                    {
                        return this.fail(CallError::Deadline {
                            phase: Phase::Stream,
                            retry_at: None,
                        });
                    }
                    return Poll::Pending;
                }
            }
        }
    }
}
