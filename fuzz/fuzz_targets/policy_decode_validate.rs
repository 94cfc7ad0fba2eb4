#![no_main]
//! cargo-fuzz target `policy_decode_validate`: see `levee_server::fuzz`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    levee_server::fuzz::policy_decode_validate(data);
});
