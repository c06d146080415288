#![no_main]
//! libFuzzer's way into `fuzz::control_request` (see crates/fuzz).

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz::control_request(data));
