//! cargo-fuzz target `recipe_toml`: see `ftpipe_fuzzing::recipe_toml` for the property.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ftpipe_fuzzing::recipe_toml(data));
