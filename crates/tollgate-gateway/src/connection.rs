//! What a request knows about its connection (SPEC DL-1, GW-17).
//!
//! The server's connection task stamps every request with an [`Arrival`]:
//! the instant its head was read (where the request's deadline starts,
//! DL-1) and a [`Connection`] handle through which a response can ask for
//! the connection to be dropped at a given instant. A streaming response
//! registers its deadline (plus [`LINGER`]) there: if the client stopped
//! reading, hyper stops polling the body, so nothing inside the body could
//! end it; the connection task drops the whole connection instead. The
//! call's capacity is already back by then (the engine's stream watchdog
//! ends the call at its deadline whether or not it is polled).
//!
//! A one-shot answer larger than [`FRAME_BYTES`] does the same
//! ([`one_shot_body`]): its bytes go out in frames while the registration
//! lives, so a client that reads it slowly, never slowly enough for the
//! send timeout, cannot keep the connection (and the answer's memory)
//! past its deadline either (SPEC GW-17, DL-3).
//!
//! HTTP/1.1 serves one request at a time on a connection, so one slot per
//! connection is enough: a registration replaces the previous one and
//! clears it when dropped.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use bytes::{Buf, Bytes};
use hyper::body::{Frame, SizeHint};
use tokio::sync::watch;
use tollgate::Deadline;
use tollgate::clock::Instant;

/// How long after its deadline a streaming response may keep its
/// connection: time for a client that still reads to receive the error
/// event that ends the stream before the connection is dropped.
pub const LINGER: Duration = Duration::from_millis(500);

/// Attached to every request by the server (a request extension).
#[derive(Debug, Clone)]
pub struct Arrival {
    /// When the request head was read: the request's deadline starts here
    /// (SPEC DL-1).
    pub at: Instant,
    /// The connection the request came on.
    pub connection: Connection,
}

/// One client connection, as the responses served on it see it.
#[derive(Debug, Clone)]
pub struct Connection {
    close_at: Arc<watch::Sender<Option<Instant>>>,
}

impl Connection {
    /// A new connection handle and the receiver its connection task
    /// watches: the instant the connection must be dropped, if any.
    pub fn new() -> (Connection, watch::Receiver<Option<Instant>>) {
        let (tx, rx) = watch::channel(None);
        (
            Connection {
                close_at: Arc::new(tx),
            },
            rx,
        )
    }

    /// Asks for the connection to be dropped at `at` unless the returned
    /// registration is dropped first.
    pub fn close_at(&self, at: Instant) -> CloseAt {
        self.close_at.send_replace(Some(at));
        CloseAt {
            close_at: Arc::clone(&self.close_at),
            at,
        }
    }
}

/// A registered close instant, cleared on drop (see
/// [`Connection::close_at`]).
#[derive(Debug)]
pub struct CloseAt {
    close_at: Arc<watch::Sender<Option<Instant>>>,
    at: Instant,
}

impl Drop for CloseAt {
    fn drop(&mut self) {
        // Clears only its own registration: a later one stays.
        self.close_at.send_if_modified(|slot| {
            if *slot == Some(self.at) {
                *slot = None;
                true
            } else {
                false
            }
        });
    }
}

/// Largest frame of a one-shot answer; an answer up to this size goes out
/// whole, without a close instant.
pub const FRAME_BYTES: usize = 64 * 1024;

/// The body of a one-shot answer of a request that arrived as `arrival`
/// with `deadline`: `bytes` whole when small (or when the request has no
/// connection or no deadline); else in frames of at most [`FRAME_BYTES`]
/// while the connection is registered to close at the deadline plus
/// [`LINGER`], so that a client reading it slowly loses the connection
/// then (SPEC GW-17, DL-3). Each frame is a copy: once the last one is
/// taken, the answer's own buffer is freed and the registration cleared.
pub fn one_shot_body(bytes: Bytes, arrival: Option<&Arrival>, deadline: Deadline) -> Body {
    if bytes.len() <= FRAME_BYTES {
        return Body::from(bytes);
    }
    match arrival.zip(deadline.instant()) {
        Some((a, at)) => Body::new(Framed {
            rest: bytes,
            close: Some(a.connection.close_at(at.checked_add(LINGER).unwrap_or(at))),
        }),
        None => Body::from(bytes),
    }
}

/// See [`one_shot_body`].
#[derive(Debug)]
struct Framed {
    rest: Bytes,
    close: Option<CloseAt>,
}

impl hyper::body::Body for Framed {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let n = self.rest.len().min(FRAME_BYTES);
        if n == 0 {
            self.close = None;
            return Poll::Ready(None);
        }
        let frame = Bytes::copy_from_slice(&self.rest[..n]);
        self.rest.advance(n);
        if self.rest.is_empty() {
            // The whole answer is handed over: its buffer and the close
            // instant go.
            self.rest = Bytes::new();
            self.close = None;
        }
        Poll::Ready(Some(Ok(Frame::data(frame))))
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.rest.len() as u64)
    }
}

/// Resolves when the instant `rx` holds passes; follows changes, and never
/// resolves while no instant is set.
pub async fn closing(rx: &mut watch::Receiver<Option<Instant>>) {
    loop {
        let at = *rx.borrow_and_update();
        let expired = async {
            match at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = expired => return,
            changed = rx.changed() => {
                if changed.is_err() {
                    // Every handle is gone: nothing can register any more.
                    std::future::pending::<()>().await;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn registration_is_cleared_on_drop() {
        let (conn, mut rx) = Connection::new();
        let now = Instant::now();
        let first = conn.close_at(now + Duration::from_secs(1));
        drop(first);
        assert_eq!(*rx.borrow_and_update(), None);
        let _second = conn.close_at(now + Duration::from_secs(2));
        let waited = tokio::time::timeout(Duration::from_secs(5), closing(&mut rx)).await;
        assert!(waited.is_ok());
        assert!(Instant::now() >= now + Duration::from_secs(2));
    }

    #[tokio::test(start_paused = true)]
    async fn nothing_registered_never_closes() {
        let (_conn, mut rx) = Connection::new();
        let waited = tokio::time::timeout(Duration::from_secs(60), closing(&mut rx)).await;
        assert!(waited.is_err());
    }
}
