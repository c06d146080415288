#![no_main]
//! libFuzzer's way into `fuzz::peer_message` (see crates/fuzz).

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz::peer_message(data));
