//! FTEXPERT1 reader must never panic; accepted files must be self-consistent.
#![no_main]

use ftpipe_formats::{ExpertLayout, ExpertView};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(v) = ExpertView::new(data) {
        for e in 0..v.layout().expert_count() {
            let r = v.expert(e).unwrap();
            for (f, b) in r.fields() {
                assert_eq!(b.len() as u64, f.len());
            }
        }
    }
    let _ = ExpertLayout::read_from(data);
});
