//! FTW reader must never panic; accepted files must be self-consistent.
#![no_main]

use ftpipe_formats::{FtwHeader, FtwView};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(v) = FtwView::new(data) {
        for t in v.tensors() {
            assert_eq!(t.data.len() as u64, t.entry.len());
        }
    }
    if let Ok(h) = FtwHeader::read_from(data) {
        let _ = h.check_file_len(data.len() as u64);
    }
});
