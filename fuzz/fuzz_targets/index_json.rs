//! cargo-fuzz target `index_json`: see `ftpipe_fuzzing::index_json` for the property.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ftpipe_fuzzing::index_json(data));
