//! Stable-Rust stand-in for the cargo-fuzz targets: feed arbitrary bytes
//! and mutated valid files to every reader and assert it returns (Ok or
//! Err) without panicking. The bodies mirror `fuzz/fuzz_targets/*.rs`.

mod common;

use common::*;
use ftpipe_formats::*;
use proptest::prelude::*;

fn ftw_reader(data: &[u8]) {
    if let Ok(v) = FtwView::new(data) {
        for t in v.tensors() {
            assert_eq!(t.data.len() as u64, t.entry.len());
        }
    }
    if let Ok(h) = FtwHeader::read_from(data) {
        let _ = h.check_file_len(data.len() as u64);
    }
}

fn ftexpert_reader(data: &[u8]) {
    if let Ok(v) = ExpertView::new(data) {
        for e in 0..v.layout().expert_count() {
            let r = v.expert(e).unwrap();
            for (f, b) in r.fields() {
                assert_eq!(b.len() as u64, f.len());
            }
        }
    }
    let _ = ExpertLayout::read_from(data);
}

fn q3_segment_set(data: &[u8]) {
    let [a, b, c, rest @ ..] = data else { return };
    let Ok(geo) = Q3Geometry::uniform(
        1 + u64::from(*a % 8),
        u64::from(*b % 16),
        32 * (1 + u64::from(*c % 4)),
    ) else {
        return;
    };
    if let Ok(v) = FtwView::new(rest) {
        let _ = Q3SegmentSet::from_ftw(&v, &geo);
    }
    let list: Vec<(String, u64)> = rest
        .chunks(6)
        .map(|c| {
            let name = if c[0] < 200 {
                format!("shard_{}", c[0] % 12)
            } else {
                String::from_utf8_lossy(c).into_owned()
            };
            let len = c.get(2..6).map_or(0, |l| {
                u64::from(u32::from_le_bytes(l.try_into().unwrap())) % 2048
            });
            (name, len)
        })
        .collect();
    let _ = Q3SegmentSet::validate(&geo, list, rest.get(..2));
}

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

/// Run the fuzz targets over the committed corpus, if present.
#[test]
fn committed_corpus_does_not_panic() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus");
    for (target, f) in [
        ("ftw_reader", ftw_reader as fn(&[u8])),
        ("ftexpert_reader", ftexpert_reader),
        ("q3_segment_set", q3_segment_set),
    ] {
        let Ok(dir) = std::fs::read_dir(root.join(target)) else {
            continue;
        };
        for entry in dir.flatten() {
            f(&std::fs::read(entry.path()).unwrap());
        }
    }
}

/// Regenerate the committed seed corpus:
/// `cargo test -p ftpipe-formats --test no_panic -- --ignored write_seed_corpus`.
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
