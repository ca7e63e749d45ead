//! cargo-fuzz target `manifest_placement`: see `ftpipe_fuzzing::manifest_placement` for the property.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ftpipe_fuzzing::manifest_placement(data));
