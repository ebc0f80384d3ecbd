//! libFuzzer entry of `checks::sse_decoder` (what it checks is documented there).
#![no_main]

#[path = "../checks/mod.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::sse_decoder::check(data));
