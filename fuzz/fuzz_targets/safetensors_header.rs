//! cargo-fuzz target `safetensors_header`: see `ftpipe_fuzzing::safetensors_header` for the property.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ftpipe_fuzzing::safetensors_header(data));
