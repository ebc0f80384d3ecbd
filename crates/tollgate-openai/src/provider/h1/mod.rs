//! An HTTP/1.1 path of its own for streams, the driven path: the upstream
//! connection is driven by the task that reads the response body, not by a
//! task of its own.
//!
//! hyper's pooling client (used for one-shot calls) runs every connection
//! in a spawned task and hands the response body over one HTTP chunk at a
//! time through a one-slot channel, so every event of a stream costs a
//! wake-up of the other task (often on the other worker thread: an eventfd
//! write and a context switch). Here the connection of a stream is polled
//! by whoever polls its body — in the gateway, the task that writes the
//! response to the client: one wake-up per upstream read, whatever the
//! number of events in it. (One-shot calls to plain-`http` upstreams were
//! tried on this path too and cost more CPU at saturation: BENCHMARKS.md,
//! "Smaller futures, and the driven path for one-shot calls measured".)
//!
//! Implementation notes (invariants):
//! * A [`Conn`](pool::Conn) is owned by exactly one place at a time: the
//!   pool (idle, polled by nobody), a request waiting for its response
//!   head, or a [`DrivenBody`]. Dropping it closes the connection, so a
//!   request or body dropped early aborts its upstream request (SPEC DL-6,
//!   LC-5).
//! * A connection goes back to the pool only after its body ended
//!   normally and hyper reports it ready for another request; anything
//!   else (an error, a body dropped early, `connection: close`) closes it.
//! * Idle connections are not polled with a waker: a connection the
//!   server closed while idle is found out when it is taken (polled once
//!   first, without a waker) or by the pool's reaper, and dropped then.
//!   Idle ones past the pool's idle timeout are dropped when their host is
//!   next used or by the reaper (every half timeout while any is idle); at
//!   most `max_idle_per_host` stay per host.
//! * Only HTTP/1.1 is spoken (the TLS handshake offers no ALPN: an
//!   upstream that speaks only HTTP/2 over TLS fails on this path).

mod body;
mod client;
mod pool;

pub(super) use body::DrivenBody;
pub(super) use client::DrivenClient;

#[cfg(test)]
pub(super) mod resend_tests;
#[cfg(test)]
pub(super) mod tests;
