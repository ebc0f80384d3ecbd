//! tollgate's gateway: an OpenAI-compatible multi-tenant HTTP proxy that
//! puts the admission engine in front of upstream providers (SPEC §11).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod access_log;
pub mod auth;
pub mod build;
pub mod client_cap;
pub mod config;
pub mod connection;
pub mod counting;
pub mod deadline;
pub mod error;
pub mod live;
pub mod metrics;
pub mod persist;
pub mod provider;
pub mod ratelimit;
pub mod request_id;
pub mod router;
pub mod routes;
mod run;
pub mod send_timeout;
pub mod server;
pub mod spend;
pub mod sse;
pub mod state;
pub mod status;
pub mod telemetry;
pub mod tenants;
pub mod threads;

pub use run::{DEMO_KEY, RunError, embedded_sim_config, run};
