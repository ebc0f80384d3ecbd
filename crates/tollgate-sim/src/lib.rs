//! A strict simulated OpenAI-compatible provider: the independent referee
//! that tollgate's tests and benchmarks run against (SPEC §14, SIM-1..4).
//!
//! * **SIM-1** `POST /v1/chat/completions` (one-shot and SSE stream),
//!   `POST /v1/embeddings`, `GET /v1/models`, with `usage` in responses and in
//!   the final stream chunk when asked. Beyond OpenAI's own wire: the
//!   Responses API (`POST /v1/responses`, one-shot and typed SSE events), the
//!   Azure OpenAI shape (`/openai/deployments/{deployment}/...?api-version=`
//!   with the `api-key` header, Azure's 401/404/429 bodies) and Anthropic's
//!   Messages API (`POST /v1/messages`, one-shot and its SSE events,
//!   Anthropic's errors and `anthropic-ratelimit-*` headers).
//! * **SIM-2** Its own exact sliding windows for requests and tokens plus a
//!   concurrency cap ([`referee`], [`window`]); it shares no code with
//!   tollgate's limiter. Refusals are 429 with `retry-after`,
//!   `retry-after-ms` and `x-ratelimit-*` headers computed from the window
//!   log. The Messages route has its own limits instead: requests, input
//!   tokens (ITPM) and output tokens (OTPM) per window, each a continuously
//!   replenished bucket ([`anthropic`]); admission reserves `max_tokens`
//!   and the unused part is given back when the response ends.
//! * **SIM-3** Latency (time to first token, per token) and seeded,
//!   deterministic faults: 5xx, mid-stream disconnect, slow headers
//!   ([`faults`]).
//! * **SIM-4** `GET /stats` and [`Simulator::stats`] ([`SimStats`]),
//!   including what the requests it served would cost at the list prices
//!   of the repository's price file ([`prices`]).
//!
//! # Charging
//!
//! By default a request is charged once, at arrival: one request unit and its
//! actual tokens — prompt tokens by the simulator's documented count
//! ([`tokens`]) plus the completion tokens it will generate, known up front.
//! The `usage` it reports is exactly what it charged. A refused request (429)
//! and an injected 5xx are not charged.
//!
//! To model how a real provider's limiter differs from its billing
//! ([`accounting`]): an ingress delay with jitter before a request is counted
//! ([`IngressDelay`]), a character-based token charge with or without later
//! reconciliation ([`ChargeMode`], `reconcile`), a charge for refusals
//! ([`RefusalCharge`]) and a background consumer spending from the same
//! windows (`background_rpm`, `background_tpm`).
//!
//! # Embedding in a test
//!
//! ```no_run
//! # async fn demo() -> Result<(), tollgate_sim::SimError> {
//! use tollgate_sim::{SimConfig, Simulator};
//! let server = Simulator::spawn(
//!     SimConfig { rpm: Some(60), tpm: Some(10_000), ..SimConfig::default() },
//!     "127.0.0.1:0",
//! )
//! .await?;
//! let url = server.url("/v1/chat/completions");
//! // ... drive the client under test against `url` ...
//! assert_eq!(server.stats().rejected_429.total(), 0);
//! server.shutdown().await
//! # }
//! ```
#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod accounting;
pub mod anthropic;
mod args;
mod azure;
mod background;
mod clock;
mod config;
pub mod duration;
pub mod faults;
mod headers;
pub mod prices;
pub mod referee;
mod responses;
mod routes;
mod script;
mod server;
mod state;
mod stats;
mod stream;
pub mod tokens;
pub mod window;
mod wire;

pub use accounting::{ChargeMode, IngressDelay, RefusalCharge};
pub use args::SimArgs;
pub use clock::{Clock, ManualClock, TokioClock};
pub use config::{ConfigError, MAX_WINDOW, SimConfig, default_models};
pub use headers::REJECT_CAUSE_HEADER;
pub use server::{SimError, SimServer, Simulator, run};
pub use stats::{FaultStats, LimitStats, RejectedStats, RouteStats, SimStats};
