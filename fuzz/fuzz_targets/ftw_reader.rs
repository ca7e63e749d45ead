//! cargo-fuzz target `ftw_reader`: see `ftpipe_fuzzing::ftw_reader` for the property.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ftpipe_fuzzing::ftw_reader(data));
