#![no_main]
//! libFuzzer's way into `fuzz::token_file` (see crates/fuzz).

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz::token_file(data));
