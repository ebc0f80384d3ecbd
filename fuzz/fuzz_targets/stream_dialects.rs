//! libFuzzer entry of `checks::stream_dialects` (what it checks is documented there).
#![no_main]

#[path = "../checks/mod.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::stream_dialects::check(data));
