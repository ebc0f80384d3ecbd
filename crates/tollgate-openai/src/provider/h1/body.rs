//! The body of a stream response, read by polling its connection in the
//! reader's own task.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_core::Stream;
use hyper::body::{Body, Incoming};

use super::pool::{Conn, Key, Pool};
use crate::provider::transport::BodyError;

/// A response body whose connection is driven by the body's reader: each
/// poll first lets the connection read and decode what arrived, then takes
/// the data hyper decoded. After a normal end the connection goes back to
/// the pool; dropped earlier, or after a failure, it is closed.
pub(in crate::provider) struct DrivenBody {
    body: Incoming,
    /// The connection, until the body ended.
    conn: Option<Conn>,
    pool: Pool,
    key: Key,
    done: bool,
}

impl DrivenBody {
    pub(super) fn new(body: Incoming, conn: Conn, pool: Pool, key: Key) -> Self {
        DrivenBody {
            body,
            conn: Some(conn),
            pool,
            key,
            done: false,
        }
    }

    fn end(&mut self, reuse: bool) {
        self.done = true;
        if let Some(conn) = self.conn.take()
            && reuse
        {
            self.pool.put(self.key.clone(), conn);
        }
    }
}

impl fmt::Debug for DrivenBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DrivenBody")
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

impl Stream for DrivenBody {
    type Item = Result<Bytes, BodyError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        // hyper hands decoded data over through a one-slot channel: each
        // pass lets the connection fill it, then empties it. A pass that
        // finds it empty is tried once more, since taking the last item
        // may have let the connection decode the next one.
        let mut second_look = false;
        loop {
            let ended = match this.conn.as_mut() {
                Some(conn) => {
                    conn.drive(cx);
                    conn.ended()
                }
                None => true,
            };
            match Pin::new(&mut this.body).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    second_look = false;
                    // Trailers carry nothing a stream needs.
                    if let Ok(data) = frame.into_data()
                        && !data.is_empty()
                    {
                        return Poll::Ready(Some(Ok(data)));
                    }
                }
                Poll::Ready(Some(Err(e))) => {
                    this.end(false);
                    return Poll::Ready(Some(Err(BodyError::Http(e))));
                }
                Poll::Ready(None) => {
                    this.end(true);
                    return Poll::Ready(None);
                }
                Poll::Pending if ended => {
                    // hyper ends the body of a connection that ends; this
                    // only guards against waiting for ever if it did not.
                    this.end(false);
                    return Poll::Ready(Some(Err(BodyError::Closed)));
                }
                Poll::Pending if !second_look => second_look = true,
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}
