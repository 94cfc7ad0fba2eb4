#![no_main]
//! cargo-fuzz target `import_hystrix`: see `levee_server::fuzz`.

use levee_server::import::Source;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    levee_server::fuzz::import(Source::Hystrix, data);
});
