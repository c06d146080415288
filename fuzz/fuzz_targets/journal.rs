#![no_main]
//! libFuzzer's way into `fuzz::journal` (see crates/fuzz).

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz::journal(data));
