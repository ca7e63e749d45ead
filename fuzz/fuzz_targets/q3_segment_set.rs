//! cargo-fuzz target `q3_segment_set`: see `ftpipe_fuzzing::q3_segment_set` for the property.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ftpipe_fuzzing::q3_segment_set(data));
