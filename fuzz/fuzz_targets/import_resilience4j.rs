#![no_main]
//! cargo-fuzz target `import_resilience4j`: see `levee_server::fuzz`.

use levee_server::import::Source;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    levee_server::fuzz::import(Source::Resilience4j, data);
});
