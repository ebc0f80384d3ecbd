//! A client that stops reading a response loses its connection (SPEC
//! GW-17): a connection's writes fail once the socket has accepted no byte
//! for the send timeout, as nginx's `send_timeout` does. Progress of any
//! size restarts the timer, so a slow reader that keeps reading is served.
//! Streams also end at their deadline (see [`crate::connection`]); this
//! covers every response, one-shot ones included, whose bytes wait in the
//! server's buffer after the handler returned.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

/// `T` whose writes fail with [`io::ErrorKind::TimedOut`] after `limit`
/// without progress.
#[derive(Debug)]
pub struct SendTimeout<T> {
    inner: T,
    limit: Duration,
    /// Running while a write waits for the socket.
    stalled: Option<Pin<Box<Sleep>>>,
}

impl<T> SendTimeout<T> {
    /// Wraps `inner`.
    pub fn new(inner: T, limit: Duration) -> Self {
        SendTimeout {
            inner,
            limit,
            stalled: None,
        }
    }

    /// A write's answer: progress clears the timer, a wait starts it (or
    /// fails once it fired).
    fn judge<R>(
        &mut self,
        cx: &mut Context<'_>,
        answer: Poll<io::Result<R>>,
    ) -> Poll<io::Result<R>> {
        match answer {
            Poll::Pending => {
                let limit = self.limit;
                let timer = self
                    .stalled
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
                match timer.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the client accepted no response byte within the send timeout",
                    ))),
                    Poll::Pending => Poll::Pending,
                }
            }
            ready => {
                self.stalled = None;
                ready
            }
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for SendTimeout<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for SendTimeout<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let answer = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.judge(cx, answer)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let answer = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.judge(cx, answer)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let answer = Pin::new(&mut self.inner).poll_flush(cx);
        self.judge(cx, answer)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let answer = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.judge(cx, answer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    // proves: GW-17 (a peer that reads nothing fails the write at the send
    // timeout; one that reads keeps it going)
    #[tokio::test(start_paused = true)]
    async fn a_stalled_peer_fails_the_write_a_reading_one_does_not() {
        let (client, server) = tokio::io::duplex(64);
        let mut w = SendTimeout::new(client, Duration::from_secs(5));
        let started = tokio::time::Instant::now();
        let err = w.write_all(&[0u8; 1024]).await.expect_err("stalled");
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert_eq!(started.elapsed(), Duration::from_secs(5));

        let (client, mut server2) = tokio::io::duplex(64);
        let mut w = SendTimeout::new(client, Duration::from_secs(5));
        let reader = tokio::spawn(async move {
            let mut buf = [0u8; 16];
            let mut got = 0;
            while got < 4096 {
                tokio::time::sleep(Duration::from_secs(1)).await;
                got += tokio::io::AsyncReadExt::read(&mut server2, &mut buf)
                    .await
                    .unwrap();
            }
        });
        w.write_all(&[0u8; 4096])
            .await
            .expect("a reading peer is served");
        reader.await.unwrap();
        drop(server);
    }
}
