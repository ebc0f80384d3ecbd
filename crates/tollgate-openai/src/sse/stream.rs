//! A `Stream` adapter: a stream of byte chunks in, a stream of SSE items out.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_core::Stream;

use super::decode::SseDecoder;
use super::error::SseError;
use super::event::SseItem;

/// Error of an [`SseStream`]: the body failed, or its bytes were not a valid
/// event stream.
#[derive(Debug, thiserror::Error)]
pub enum SseStreamError<E> {
    /// The underlying byte stream failed.
    #[error("event stream body failed: {0}")]
    Body(#[source] E),
    /// The bytes could not be decoded (oversize or truncated event).
    #[error(transparent)]
    Sse(#[from] SseError),
}

/// Decodes a stream of byte chunks (e.g. an HTTP body) into [`SseItem`]s.
///
/// The body's end is checked with [`SseDecoder::finish`], so a body that is
/// cut inside an event yields `Err(SseStreamError::Sse(SseError::Truncated
/// { .. }))` rather than a silent end. Items completed before a decode error
/// are yielded before it; after any error the stream ends.
///
/// The inner stream must be `Unpin`; pin it in a `Box` otherwise.
#[derive(Debug)]
pub struct SseStream<S> {
    inner: S,
    decoder: SseDecoder,
    ready: VecDeque<SseItem>,
    scratch: Vec<SseItem>,
    /// A decode error to report once the items completed before it are out.
    failed: Option<SseError>,
    done: bool,
}

impl<S> SseStream<S> {
    /// Wraps `inner` with a decoder (its size limit applies).
    pub fn new(inner: S, decoder: SseDecoder) -> Self {
        SseStream {
            inner,
            decoder,
            ready: VecDeque::new(),
            scratch: Vec::new(),
            failed: None,
            done: false,
        }
    }

    /// The wrapped byte stream.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, E> Stream for SseStream<S>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
{
    type Item = Result<SseItem, SseStreamError<E>>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if let Some(item) = this.ready.pop_front() {
                return Poll::Ready(Some(Ok(item)));
            }
            if let Some(err) = this.failed.take() {
                return Poll::Ready(Some(Err(err.into())));
            }
            if this.done {
                return Poll::Ready(None);
            }
            match Pin::new(&mut this.inner).poll_next(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Ok(chunk))) => {
                    let pushed = this.decoder.push(&chunk, &mut this.scratch);
                    this.ready.extend(this.scratch.drain(..));
                    if let Err(err) = pushed {
                        // Items completed before the error go out first.
                        this.failed = Some(err);
                        this.done = true;
                    }
                }
                Poll::Ready(Some(Err(err))) => {
                    this.done = true;
                    return Poll::Ready(Some(Err(SseStreamError::Body(err))));
                }
                Poll::Ready(None) => {
                    this.done = true;
                    match this.decoder.finish() {
                        Ok(Some(item)) => this.ready.push_back(item),
                        Ok(None) => {}
                        Err(err) => return Poll::Ready(Some(Err(err.into()))),
                    }
                }
            }
        }
    }
}
