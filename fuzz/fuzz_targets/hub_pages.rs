//! cargo-fuzz target `hub_pages`: see `ftpipe_fuzzing::hub_pages` for the property.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ftpipe_fuzzing::hub_pages(data));
