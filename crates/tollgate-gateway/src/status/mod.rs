//! The status page (SPEC OBS-6): `GET /status` serves one self-contained
//! HTML page ([`PAGE`]) that polls `GET /status/json` ([`report`]) and
//! draws each scope's window fill over the last minutes from a bounded
//! history the gateway samples once a second ([`History`]).

mod history;
mod page;
mod report;

pub use history::{
    HISTORY_SAMPLES, History, LimitKey, MAX_SCOPES, MAX_THROTTLES, Point, SAMPLE_EVERY, Series,
    Side, Throttle, now_ms, sample_every,
};
pub use page::page;
pub use report::report;
