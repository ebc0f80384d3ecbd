//! libFuzzer entry of `checks::messages_request` (what it checks is documented there).
#![no_main]

#[path = "../checks/mod.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::messages_request::check(data));
