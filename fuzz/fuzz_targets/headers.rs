#![no_main]
//! cargo-fuzz target `headers`: see `levee_server::fuzz`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    levee_server::fuzz::headers(data);
});
