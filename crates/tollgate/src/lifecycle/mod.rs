//! The supervised call lifecycle (SPEC §7, §8, §9): one-shot and streaming
//! calls under one deadline, with retries and a circuit breaker.

mod accounting;
mod breaker;
mod hooks;
mod outcome;
mod policy;
mod provider;
mod registry;
mod stream;
mod supervisor;

pub use accounting::{ARRIVAL_CAP, ARRIVAL_MEMORY, Accounting, Budgets};
pub use breaker::{CircuitBreaker, CircuitConfig, CircuitOpen, CircuitState, Probe};
pub use hooks::{Hook, HookContext, HookError, HookFuture, Hooks};
pub use outcome::{CallError, CallReport, Completed, Terminal};
pub use policy::{AttemptPolicy, Decision, GiveUp, Jitter, NoJitter, SeededJitter, SharedJitter};
pub use provider::{AttemptContext, ErrorKind, Provider, ProviderError, Reply, StreamEvent};
pub use registry::Observer;
pub use stream::CallStream;
pub use supervisor::{CallOptions, Pricer, RequestEstimator, Supervisor, SupervisorBuilder};
