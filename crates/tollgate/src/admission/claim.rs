//! A call id held for a whole call (SPEC ADM-6).

use std::fmt;
use std::sync::Arc;

use super::controller::Inner;
use crate::call::CallId;
use crate::error::AdmissionError;

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

/// Registers a caller-chosen id for the duration of the admission.
pub(crate) struct IdGuard<'a> {
    inner: &'a Inner,
    id: Option<CallId>,
}

impl<'a> IdGuard<'a> {
    #[inline]
    pub(crate) fn register(inner: &'a Inner, id: Option<CallId>) -> Result<Self, AdmissionError> {
        if let Some(id) = id {
            Self::insert(inner, id)?;
        }
        Ok(IdGuard { inner, id })
    }

    #[cold]
    pub(crate) fn insert(inner: &Inner, id: CallId) -> Result<(), AdmissionError> {
        if inner.ids.lock().insert(id) {
            Ok(())
        } else {
            Err(AdmissionError::Conflict(id))
        }
    }

    /// Hands the id over to the lease.
    pub(crate) fn disarm(&mut self) -> Option<CallId> {
        self.id.take()
    }
}

impl Drop for IdGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        if let Some(id) = self.id {
            self.inner.forget_id(id);
        }
    }
}
