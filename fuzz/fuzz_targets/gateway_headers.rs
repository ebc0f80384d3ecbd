//! libFuzzer entry of `checks::gateway_headers` (what it checks is documented there).
#![no_main]

#[path = "../checks/mod.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::gateway_headers::check(data));
