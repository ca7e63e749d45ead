//! cargo-fuzz target `ftexpert_reader`: see `ftpipe_fuzzing::ftexpert_reader` for the property.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ftpipe_fuzzing::ftexpert_reader(data));
