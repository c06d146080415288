#![no_main]
//! libFuzzer's way into `fuzz::frame` (see crates/fuzz).

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz::frame(data));
