//! cargo-fuzz target `http_headers`: see `ftpipe_fuzzing::http_headers` for the property.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ftpipe_fuzzing::http_headers(data));
