#![no_main]
//! cargo-fuzz target `snapshot_decode`: see `levee_server::fuzz`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    levee_server::fuzz::snapshot_decode(data);
});
