#![no_main]
//! libFuzzer's way into `fuzz::log_files` (see crates/fuzz).

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz::log_files(data));
