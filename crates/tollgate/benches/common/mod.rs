//! The uncontended scenario shared by `admission.rs` (criterion) and
//! `ratio.rs` (interleaved ratios), so both measure the same thing.

use tollgate::config::{MINUTE, ScopeConfig};
use tollgate::{AdmissionController, Call, ScopeId, TokenEstimate};

/// A scope with an RPM and a TPM limit (sliding windows, never binding)
/// and a concurrency limit of 64.
pub fn uncontended_controller() -> AdmissionController {
    AdmissionController::builder()
        .scope(
            ScopeConfig::new("main")
                .requests(1 << 60, MINUTE)
                .tokens(1 << 60, MINUTE),
        )
        .concurrency(64)
        .build()
        .expect("valid configuration")
}

/// One call of 150 estimated tokens on that scope.
pub fn uncontended_call() -> Call {
    Call::new(ScopeId::FIRST).with_estimate(TokenEstimate::new(100, 50))
}
