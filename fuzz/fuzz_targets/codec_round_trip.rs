//! cargo-fuzz target `codec_round_trip`: see `ftpipe_fuzzing::codec_round_trip` for the property.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ftpipe_fuzzing::codec_round_trip(data));
