//! Ownership of a supervisor's calls until they are terminal and clean
//! (SPEC LC-1, LC-7).

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::outcome::{CallError, CallReport, Terminal};
use crate::admission::CallClaim;
use crate::call::CallId;
use crate::in_flight::InFlight;

/// Receives a report for every call once it is terminal and cleaned up.
pub type Observer = Arc<dyn Fn(&CallReport) + Send + Sync>;

/// The calls a supervisor owns.
#[derive(Debug)]
pub(crate) struct Calls {
    active: InFlight,
    pub(crate) shutdown: CancellationToken,
}

impl Calls {
    pub(crate) fn new(shutdown: CancellationToken) -> Arc<Self> {
        Arc::new(Calls {
            active: InFlight::default(),
            shutdown,
        })
    }

    pub(crate) fn active(&self) -> usize {
        self.active.get()
    }

    /// Resolves once no call is owned.
    pub(crate) async fn idle(&self) {
        self.active.idle().await;
    }
}

/// One owned call. Whatever path the call takes, it leaves ownership only
/// through `finish` or `Drop`, and only once terminal: a call dropped
/// before it finished is `Cancelled` (SPEC DL-7, LC-5).
pub(crate) struct CallGuard {
    calls: Arc<Calls>,
    observer: Option<Observer>,
    pub(crate) id: Option<CallId>,
    /// The id, held from the first admission until the call is terminal,
    /// across retries and backoff delays (SPEC ADM-6).
    pub(crate) claim: Option<CallClaim>,
    pub(crate) attempts: u32,
    pub(crate) chunks: u64,
    done: bool,
}

impl CallGuard {
    pub(crate) fn begin(
        calls: &Arc<Calls>,
        observer: Option<Observer>,
        id: Option<CallId>,
    ) -> Self {
        calls.active.enter();
        CallGuard {
            calls: Arc::clone(calls),
            observer,
            id,
            claim: None,
            attempts: 0,
            chunks: 0,
            done: false,
        }
    }

    /// Marks the call terminal. Call it after the call's capacity was
    /// released; the report goes out and ownership ends.
    pub(crate) fn finish(&mut self, result: Result<(), &CallError>) {
        let (terminal, error, phase) = match result {
            Ok(()) => (Terminal::Completed, None, None),
            Err(e) => (e.terminal(), Some(e.kind()), e.phase()),
        };
        self.end(terminal, error, phase);
    }

    fn end(
        &mut self,
        terminal: Terminal,
        error: Option<&'static str>,
        phase: Option<crate::Phase>,
    ) {
        if std::mem::replace(&mut self.done, true) {
            return;
        }
        // Terminal: the id may be used again (SPEC ADM-6).
        drop(self.claim.take());
        // The call leaves the supervisor's ownership after its report,
        // even when the observer panics (a close must not wait for ever).
        let _leave = Leave(&self.calls.active);
        if let Some(observer) = &self.observer {
            observer(&CallReport {
                id: self.id,
                terminal,
                error,
                phase,
                attempts: self.attempts,
                chunks: self.chunks,
            });
        }
        tracing::debug!(
            call = ?self.id,
            terminal = terminal.as_str(),
            error,
            phase = phase.map(|p| p.as_str()),
            attempts = self.attempts,
            "call finished"
        );
    }
}

/// Leaves the in-flight count when dropped, unwinding included.
struct Leave<'a>(&'a InFlight);

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        self.0.leave();
    }
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        self.end(Terminal::Cancelled, None, None);
    }
}
