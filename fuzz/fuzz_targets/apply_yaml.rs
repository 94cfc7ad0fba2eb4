#![no_main]
//! cargo-fuzz target `apply_yaml`: see `levee_server::fuzz`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    levee_server::fuzz::apply_yaml(data);
});
