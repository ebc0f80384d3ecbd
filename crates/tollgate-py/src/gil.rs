//! Whether this thread holds the GIL inside one of the package's calls.
//!
//! Code that may run either with the GIL (polled from an event loop's
//! thread) or without it (a tokio worker, a blocking wait that released
//! it) asks [`held`] before it touches Python: with the GIL it may act at
//! once (a re-entrant `Python::attach` costs nothing), without it it must
//! not take the GIL where an engine lock may be held, and hands the work to
//! the notifier thread instead (`notifier.rs`).
//!
//! The flag is set by [`Held::enter`] at the entry points that run Rust
//! futures with the GIL (`Driver::step`, `Driver::cancel`, the done
//! callback of an awaited Python task) and cleared by [`detach`] for the
//! duration of a blocking wait.

use std::cell::Cell;

use pyo3::Python;

thread_local! {
    /// Nesting depth of `Held` guards on this thread.
    static HELD: Cell<u32> = const { Cell::new(0) };
}

/// Marks this thread as holding the GIL until dropped.
pub(crate) struct Held(());

impl Held {
    /// The GIL is held (the token proves it) until the guard is dropped.
    pub(crate) fn enter(_py: Python<'_>) -> Held {
        HELD.with(|h| h.set(h.get().saturating_add(1)));
        Held(())
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        HELD.with(|h| h.set(h.get().saturating_sub(1)));
    }
}

/// Whether a [`Held`] guard is live on this thread.
pub(crate) fn held() -> bool {
    HELD.with(|h| h.get() > 0)
}

/// Releases the GIL while `f` runs (`py.detach`), with the flag cleared.
pub(crate) fn detach<T: Send>(py: Python<'_>, f: impl FnOnce() -> T + Send) -> T {
    let depth = HELD.with(|h| h.replace(0));
    let out = py.detach(f);
    HELD.with(|h| h.set(depth));
    out
}
