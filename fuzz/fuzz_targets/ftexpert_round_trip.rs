//! cargo-fuzz target `ftexpert_round_trip`: see `ftpipe_fuzzing::ftexpert_round_trip` for the property.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ftpipe_fuzzing::ftexpert_round_trip(data));
