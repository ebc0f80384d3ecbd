//! Calls in flight on one deployment: a counter and the guard that holds
//! one unit of it until dropped (a one-shot answer, or a stream's end).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The number of attempts running on a deployment. Cloning shares it.
#[derive(Debug, Clone, Default)]
pub struct InFlight(Arc<AtomicUsize>);

impl InFlight {
    /// Attempts running now.
    pub fn get(&self) -> usize {
        self.0.load(Ordering::Relaxed)
    }

    /// Counts one more until the guard is dropped.
    pub fn enter(&self) -> InFlightGuard {
        self.0.fetch_add(1, Ordering::Relaxed);
        InFlightGuard(Arc::clone(&self.0))
    }
}

/// One attempt in flight; dropping it ends the count.
#[derive(Debug)]
pub struct InFlightGuard(Arc<AtomicUsize>);

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // proves: GW-11 (the in-flight count the router breaks ties with comes
    // back when an attempt's guard is dropped)
    #[test]
    fn guards_count_until_dropped() {
        let n = InFlight::default();
        let a = n.enter();
        let b = n.clone().enter();
        assert_eq!(n.get(), 2);
        drop(a);
        drop(b);
        assert_eq!(n.get(), 0);
    }
}
