//! The checks behind the fuzz targets, one module per parser of outside
//! input, each with `check(data)`: panics on a finding, returns on any
//! other input.
//!
//! They live apart from the targets so that two builds share them: the
//! libFuzzer binaries (`fuzz/fuzz_targets/*.rs`, built by
//! `scripts/fuzz-smoke.sh`) and the main workspace's replay test
//! (`crates/tollgate-cli/tests/fuzz_seeds.rs`), which runs every check on
//! the committed seeds and on mutations of them in every test run, so a
//! check that stops compiling or a finding that comes back fails CI.
#![allow(
    dead_code,
    reason = "each fuzz target uses one check; the replay test uses all"
)]

pub mod batch_input;
pub mod batch_output;
pub mod chat_request;
pub mod gateway_config;
pub mod gateway_headers;
pub mod messages_request;
pub mod rate_limit_headers;
pub mod responses_request;
mod shared;
pub mod sse_decoder;
pub mod stream_dialects;
