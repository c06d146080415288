#![no_main]
//! libFuzzer's way into `fuzz::server_session` (see crates/fuzz).

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz::server_session(data));
