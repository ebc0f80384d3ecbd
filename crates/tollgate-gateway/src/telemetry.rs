//! The gateway's traces (SPEC OBS-5): `tollgate-telemetry`'s exporter and
//! spans, shared with the batch runner, fed from the access-log record
//! (the call span ends where the line is written).

pub use tollgate_telemetry::*;

use crate::access_log::Record;

impl Record {
    /// What the call's span says when it ends.
    pub fn call_end(&self) -> CallEnd<'_> {
        CallEnd {
            status: Some(self.status),
            stream: self.stream,
            attempts: self.attempts,
            queue: Some(self.queue),
            request_id: Some(&self.request_id),
            tenant: self.tenant.as_deref(),
            deployment: self.deployment.as_deref(),
            class: self.class,
            limited_by: self.limited_by,
            admission: self.admission.as_ref(),
            tokens_estimated: self.tokens_estimated,
            cost: self.cost,
            usage: self.usage,
            error: self.error.as_deref(),
        }
    }
}
