#![no_main]
//! libFuzzer's way into `fuzz::record` (see crates/fuzz).

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz::record(data));
