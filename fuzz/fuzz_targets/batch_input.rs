//! libFuzzer entry of `checks::batch_input` (what it checks is documented there).
#![no_main]

#[path = "../checks/mod.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::batch_input::check(data));
