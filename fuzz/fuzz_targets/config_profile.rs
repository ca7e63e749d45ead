//! cargo-fuzz target `config_profile`: see `ftpipe_fuzzing::config_profile` for the property.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ftpipe_fuzzing::config_profile(data));
