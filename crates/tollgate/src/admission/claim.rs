//! A call id held for a whole call (SPEC ADM-6).

use std::fmt;
use std::sync::Arc;

use super::controller::Inner;
use crate::call::CallId;

/// A call id registered with a controller for as long as this value lives.
///
/// [`AdmissionController::acquire`] registers the id of a [`Call`] for one
/// attempt, from admission to the lease's release. A caller that retries
/// (a supervisor, a batch runner) holds the id across every attempt and
/// every backoff delay instead, until the call is terminal: it claims the
/// id once with [`AdmissionController::claim`] and admits its attempts
/// without an id. Meanwhile any other admission or claim of the same id
/// fails with [`AdmissionError::Conflict`]. Dropping the claim frees the
/// id.
///
/// [`AdmissionController::acquire`]: crate::AdmissionController::acquire
/// [`AdmissionController::claim`]: crate::AdmissionController::claim
/// [`Call`]: crate::Call
/// [`AdmissionError::Conflict`]: crate::AdmissionError::Conflict
#[must_use = "dropping the claim frees the id at once"]
pub struct CallClaim {
    pub(crate) inner: Arc<Inner>,
    pub(crate) id: CallId,
}

impl CallClaim {
    /// The claimed id.
    pub fn id(&self) -> CallId {
        self.id
    }
}

impl fmt::Debug for CallClaim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CallClaim").field("id", &self.id).finish()
    }
}

impl Drop for CallClaim {
    fn drop(&mut self) {
        self.inner.forget_id(self.id);
    }
}
