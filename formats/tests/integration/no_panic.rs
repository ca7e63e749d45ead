//! Stable-Rust stand-in for the cargo-fuzz targets: feed arbitrary bytes
//! and mutated valid files to every reader through the fuzz entry points
//! (`ftpipe_fuzzing`, the same functions the cargo-fuzz targets call) and
//! assert each returns without panicking. The committed corpora are
//! replayed by `ftpipe-fuzzing`'s own tests.

use crate::common::*;
use ftpipe_formats::*;
use proptest::prelude::*;

use ftpipe_fuzzing::{ftexpert_reader, ftw_reader, q3_segment_set};

fn mutate(mut b: Vec<u8>, edits: &[(usize, u8)], cut: usize) -> Vec<u8> {
    if b.is_empty() {
        return b;
    }
    for &(i, v) in edits {
        let n = b.len();
        b[i % n] = v;
    }
    let keep = b.len() - cut % (b.len() / 2 + 1);
    b.truncate(keep);
    b
}

fn edits() -> impl Strategy<Value = (Vec<(usize, u8)>, usize)> {
    (
        prop::collection::vec((0usize..200, any::<u8>()), 0..6),
        0usize..64,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn arbitrary_bytes(data in prop::collection::vec(any::<u8>(), 0..600)) {
        ftw_reader(&data);
        ftexpert_reader(&data);
        q3_segment_set(&data);
    }

    #[test]
    fn mutated_ftw((e, cut) in edits()) {
        // Edits concentrate on the header and index (the first 200 bytes).
        ftw_reader(&mutate(sample_ftw(), &e, cut));
    }

    #[test]
    fn mutated_ftexpert((e, cut) in edits()) {
        ftexpert_reader(&mutate(sample_expert(), &e, cut));
    }

    #[test]
    fn mutated_q3((e, cut) in edits()) {
        let (b, _) = write_q3_ftw(2, 1, 32);
        let mut data = vec![1, 1, 0];
        data.extend(mutate(b, &e, cut));
        q3_segment_set(&data);
    }
}

/// Regenerate the committed seed corpus:
/// `cargo test -p ftpipe-formats --test integration -- --ignored no_panic::write_seed_corpus`.
#[test]
#[ignore]
fn write_seed_corpus() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus");
    let write = |target: &str, name: &str, bytes: &[u8]| {
        let d = root.join(target);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join(name), bytes).unwrap();
    };
    write("ftw_reader", "sample", &sample_ftw());
    write("ftw_reader", "empty", &write_ftw(vec![]));
    write("ftexpert_reader", "sample", &sample_expert());
    write(
        "ftexpert_reader",
        "one_field",
        &write_expert(
            0,
            1,
            vec![TensorDesc::new(
                "w",
                Dtype::BF16,
                TensorKind::Plain,
                vec![2],
            )],
        ),
    );
    let (q, _) = write_q3_ftw(2, 1, 32);
    let mut seed = vec![1, 1, 0];
    seed.extend(q);
    write("q3_segment_set", "two_segments", &seed);
    write(
        "q3_segment_set",
        "list",
        &[2, 3, 1, 0, 0, 168, 0, 0, 0, 1, 0, 168, 0, 0, 0],
    );
}
