//! Pre- and post-call hooks: async callbacks with a local time cap clipped
//! by the call's deadline (SPEC DL-3, DL-4).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use crate::call::CallId;

/// What a hook learns about the attempt it runs for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HookContext {
    /// The call's id, if it has one.
    pub call_id: Option<CallId>,
    /// The attempt (1-based).
    pub attempt: u32,
}

/// A hook refused or failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct HookError(pub String);

/// A hook's future.
pub type HookFuture = Pin<Box<dyn Future<Output = Result<(), HookError>> + Send>>;

/// An async callback.
pub type Hook = Arc<dyn Fn(HookContext) -> HookFuture + Send + Sync>;

/// The hooks of a supervisor.
#[derive(Clone, Default)]
pub struct Hooks {
    /// Runs after admission, before the provider starts (a failure fails
    /// the call without provider work).
    pub pre: Option<Hook>,
    /// Runs after a successful response or normal stream end.
    pub post: Option<Hook>,
    /// Local cap of each hook run, clipped by the deadline.
    pub timeout: Option<Duration>,
}

impl fmt::Debug for Hooks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hooks")
            .field("pre", &self.pre.is_some())
            .field("post", &self.post.is_some())
            .field("timeout", &self.timeout)
            .finish()
    }
}
