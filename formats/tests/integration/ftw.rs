//! FTW v1: round trips, header-only validation, one test per reader check
//! and per writer misuse.

use crate::common::*;
use ftpipe_formats::ftw::{MAX_FTW_INDEX_LEN, MAX_FTW_TENSORS};
use ftpipe_formats::*;
use proptest::prelude::*;

fn err(bytes: &[u8]) -> FormatError {
    FtwView::new(bytes).expect_err("reader accepted a malformed file")
}

// ---- round trips -------------------------------------------------------------

fn desc_strategy() -> impl Strategy<Value = Vec<TensorDesc>> {
    let one = (
        prop::sample::select(vec![
            Dtype::BF16,
            Dtype::F16,
            Dtype::F32,
            Dtype::U8,
            Dtype::I64,
            Dtype::F8E4M3,
            Dtype::Nvfp4,
            Dtype::Q3Ple32,
        ]),
        prop::collection::vec(1u64..5, 0..3),
        1u64..4,
    )
        .prop_map(|(dtype, mut shape, last)| {
            let kind = if dtype.is_quantized() {
                TensorKind::Quantized
            } else {
                TensorKind::Plain
            };
            if dtype.is_quantized() {
                shape.push(last * dtype.block());
            }
            (dtype, kind, shape)
        });
    prop::collection::vec(one, 0..6).prop_map(|v| {
        v.into_iter()
            .enumerate()
            .map(|(i, (d, k, s))| TensorDesc::new(format!("t.{i}.é"), d, k, s))
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn write_then_read_round_trips(descs in desc_strategy(), chunk in 1usize..5000) {
        let predicted = sizes::ftw_total_len(descs.clone()).unwrap();
        let layout = FtwLayout::plan(descs.clone()).unwrap();
        let mut w = FtwWriter::new(&layout, Vec::new()).unwrap();
        let datas: Vec<Vec<u8>> = layout.entries().iter().enumerate().map(|(i, e)| fill(e.len(), i as u8)).collect();
        for (e, d) in layout.entries().iter().zip(&datas) {
            w.begin_tensor(e.key()).unwrap();
            for c in d.chunks(chunk) {
                w.write(c).unwrap();
            }
            w.end_tensor().unwrap();
        }
        let bytes = w.finish().unwrap();
        prop_assert_eq!(bytes.len() as u64, predicted);
        prop_assert_eq!(bytes.len() % 4096, 0);
        let view = FtwView::new(&bytes).unwrap();
        prop_assert_eq!(view.header().entries(), layout.entries());
        for (t, d) in view.tensors().zip(&datas) {
            prop_assert_eq!(t.data, d.as_slice());
            prop_assert_eq!(t.entry.offset() % 4096, 0);
            prop_assert_eq!(view.tensor(t.entry.key()).unwrap().data, d.as_slice());
        }
        let h = FtwHeader::read_from(&bytes[..]).unwrap();
        h.check_file_len(bytes.len() as u64).unwrap();
        prop_assert_eq!(h.entries(), layout.entries());
        for (a, b) in descs.iter().zip(layout.entries()) {
            prop_assert_eq!(a, b.desc());
        }
    }
}

#[test]
fn empty_file_is_one_page() {
    let bytes = write_ftw(vec![]);
    assert_eq!(bytes.len(), 4096);
    assert_eq!(FtwView::new(&bytes).unwrap().header().entries().len(), 0);
}

#[test]
fn offsets_follow_the_page_rule() {
    let bytes = sample_ftw();
    let v = FtwView::new(&bytes).unwrap();
    let offs: Vec<u64> = v.tensors().map(|t| t.entry.offset()).collect();
    assert_eq!(offs, vec![4096, 8192, 12288, 16384]);
    assert_eq!(bytes.len(), 20480);
}

#[test]
fn header_only_read_does_not_need_data() {
    let bytes = sample_ftw();
    let h = FtwHeader::read_from(&bytes[..4096]).unwrap();
    assert_eq!(h.total_len(), bytes.len() as u64);
    assert!(matches!(
        h.check_file_len(4096),
        Err(FormatError::FileLenMismatch { .. })
    ));
    assert!(matches!(
        FtwHeader::read_from(&bytes[..100]),
        Err(FormatError::Truncated { .. })
    ));
    assert!(matches!(
        FtwHeader::read_from(&bytes[..10]),
        Err(FormatError::Truncated { .. })
    ));
}

// ---- one test per reader check ------------------------------------------------

fn good() -> Vec<RawE> {
    vec![
        RawE::new("a", Dtype::BF16, TensorKind::Plain, &[2, 3]),
        RawE::new("b", Dtype::Nvfp4, TensorKind::Quantized, &[16]),
    ]
}

#[test]
fn raw_builder_matches_writer() {
    assert!(FtwView::new(&raw_ftw(&good(), &[])).is_ok());
}

#[test]
fn truncated() {
    assert!(matches!(
        err(&sample_ftw()[..30]),
        FormatError::Truncated { .. }
    ));
    let b = raw_ftw(&good(), &[]);
    assert!(matches!(
        FtwHeader::parse(&b[..200]),
        Err(FormatError::Truncated { .. })
    ));
}

#[test]
fn bad_magic() {
    let mut b = sample_ftw();
    b[3] = b'X';
    assert!(matches!(err(&b), FormatError::BadMagic { .. }));
}

#[test]
fn unsupported_version() {
    let mut b = sample_ftw();
    put_u32(&mut b, 8, 2);
    assert!(matches!(
        err(&b),
        FormatError::UnsupportedVersion { version: 2, .. }
    ));
}

#[test]
fn too_many_tensors() {
    let mut b = sample_ftw();
    put_u32(&mut b, 12, MAX_FTW_TENSORS + 1);
    assert!(matches!(err(&b), FormatError::TooMany { .. }));
}

#[test]
fn index_too_long() {
    let mut b = sample_ftw();
    put_u64(&mut b, 16, MAX_FTW_INDEX_LEN + 1);
    assert!(matches!(err(&b), FormatError::TooLong { .. }));
}

#[test]
fn data_offset_mismatch() {
    let mut b = sample_ftw();
    put_u64(&mut b, 24, 8192);
    assert!(matches!(
        err(&b),
        FormatError::DataOffsetMismatch {
            expected: 4096,
            found: 8192
        }
    ));
}

#[test]
fn total_len_mismatch() {
    let mut b = sample_ftw();
    let t = get_u64(&b, 32);
    put_u64(&mut b, 32, t + 4096);
    assert!(matches!(err(&b), FormatError::TotalLenMismatch { .. }));
}

#[test]
fn file_len_mismatch() {
    let mut b = sample_ftw();
    b.extend_from_slice(&[0; 4096]);
    assert!(matches!(err(&b), FormatError::FileLenMismatch { .. }));
    let b = sample_ftw();
    assert!(matches!(
        err(&b[..b.len() - 1]),
        FormatError::FileLenMismatch { .. }
    ));
}

#[test]
fn non_zero_padding() {
    let mut b = sample_ftw();
    b[4095] = 1; // header padding
    assert!(matches!(
        err(&b),
        FormatError::NonZeroPadding { offset: 4095 }
    ));
    let mut b = sample_ftw();
    b[4096 + 64] = 1; // after the 64-byte first tensor
    assert!(matches!(
        err(&b),
        FormatError::NonZeroPadding { offset: 4160 }
    ));
    let mut b = sample_ftw();
    let n = b.len();
    b[n - 1] = 1; // terminal padding
    assert!(matches!(err(&b), FormatError::NonZeroPadding { .. }));
}

fn with(f: impl FnOnce(&mut Vec<RawE>)) -> FormatError {
    let mut e = good();
    f(&mut e);
    err(&raw_ftw(&e, &[]))
}

#[test]
fn empty_name() {
    assert!(matches!(
        with(|e| e[1].key.clear()),
        FormatError::EmptyName { index: 1 }
    ));
}

#[test]
fn name_too_long() {
    assert!(matches!(
        with(|e| e[0].key = vec![b'k'; MAX_KEY_LEN + 1]),
        FormatError::NameTooLong { index: 0, .. }
    ));
}

#[test]
fn name_not_utf8() {
    assert!(matches!(
        with(|e| e[0].key = vec![0xC3, 0x28]),
        FormatError::NameNotUtf8 { index: 0 }
    ));
}

#[test]
fn duplicate_name() {
    assert!(matches!(
        with(|e| e[1].key = b"a".to_vec()),
        FormatError::DuplicateName { .. }
    ));
}

#[test]
fn unknown_dtype() {
    assert!(matches!(
        with(|e| e[0].dtype = 99),
        FormatError::UnknownDtype { code: 99, .. }
    ));
}

#[test]
fn unknown_kind() {
    assert!(matches!(
        with(|e| e[0].kind = 9),
        FormatError::UnknownKind { code: 9, .. }
    ));
}

#[test]
fn reserved_non_zero() {
    assert!(matches!(
        with(|e| e[0].reserved = 1),
        FormatError::ReservedNonZero { .. }
    ));
}

#[test]
fn kind_dtype_mismatch() {
    assert!(matches!(
        with(|e| e[1].kind = TensorKind::Protected.code()),
        FormatError::KindDtypeMismatch { .. }
    ));
    assert!(matches!(
        with(|e| e[0].kind = TensorKind::Native.code()),
        FormatError::KindDtypeMismatch { .. }
    ));
}

#[test]
fn rank_too_large() {
    assert!(matches!(
        with(|e| e[0].dims = vec![1; 9]),
        FormatError::RankTooLarge { rank: 9, .. }
    ));
}

#[test]
fn shape_not_block_aligned() {
    assert!(matches!(
        with(|e| e[1].dims = vec![8]),
        FormatError::ShapeNotBlockAligned { .. }
    ));
}

#[test]
fn shape_overflow() {
    assert!(matches!(
        with(|e| e[0].dims = vec![u64::MAX, 3]),
        FormatError::ShapeOverflow { .. }
    ));
}

#[test]
fn length_mismatch() {
    assert!(matches!(
        with(|e| e[0].len = Some(13)),
        FormatError::LengthMismatch {
            expected: 12,
            found: 13,
            ..
        }
    ));
}

#[test]
fn empty_tensor() {
    assert!(matches!(
        with(|e| e[0].dims = vec![0, 3]),
        FormatError::EmptyTensor { .. }
    ));
}

#[test]
fn offset_not_page_aligned() {
    assert!(matches!(
        with(|e| e[1].offset = Some(8193)),
        FormatError::OffsetNotPageAligned { offset: 8193, .. }
    ));
}

#[test]
fn offset_mismatch() {
    // Gap, overlap and reordering are all the same check.
    assert!(matches!(
        with(|e| e[1].offset = Some(12288)),
        FormatError::OffsetMismatch { expected: 8192, .. }
    ));
    assert!(matches!(
        with(|e| e[1].offset = Some(4096)),
        FormatError::OffsetMismatch { .. }
    ));
}

#[test]
fn index_trailing_bytes() {
    assert!(matches!(
        err(&raw_ftw(&good(), &[0; 5])),
        FormatError::IndexTrailingBytes { extra: 5 }
    ));
}

#[test]
fn offset_overflow() {
    let huge: Vec<RawE> = (0..4)
        .map(|i| RawE::new(&format!("h{i}"), Dtype::BF16, TensorKind::Plain, &[1 << 61]))
        .collect();
    let b = raw_ftw(&huge, &[]);
    assert!(matches!(
        FtwHeader::parse(&b),
        Err(FormatError::Overflow { .. })
    ));
}

// ---- writer misuse --------------------------------------------------------------

#[test]
fn writer_rejects_misuse() {
    let layout = FtwLayout::plan(sample_ftw_descs()).unwrap();
    let mut w = FtwWriter::new(&layout, Vec::new()).unwrap();
    assert!(matches!(w.write(&[1]), Err(FormatError::NoOpenTensor)));
    assert!(matches!(
        w.begin_tensor("layers.0.w"),
        Err(FormatError::WrongOrder { .. })
    ));
    w.begin_tensor("model.embed").unwrap();
    assert!(matches!(
        w.begin_tensor("layers.0.w"),
        Err(FormatError::WrongOrder { .. })
    ));
    w.write(&[1; 60]).unwrap();
    assert!(matches!(
        w.write(&[1; 5]),
        Err(FormatError::TooManyBytes {
            len: 64,
            attempted: 65,
            ..
        })
    ));
    assert!(matches!(
        w.end_tensor(),
        Err(FormatError::TooFewBytes { written: 60, .. })
    ));
    w.write(&[1; 4]).unwrap();
    w.end_tensor().unwrap();
    assert!(matches!(w.end_tensor(), Err(FormatError::NoOpenTensor)));
    assert!(matches!(
        w.finish(),
        Err(FormatError::Unfinished { remaining: 3, .. })
    ));
}

#[test]
fn plan_rejects_bad_descriptors() {
    let d = |k: &str, dt, kind, s: &[u64]| TensorDesc::new(k, dt, kind, s.to_vec());
    let bad = [
        vec![d("", Dtype::U8, TensorKind::Plain, &[1])],
        vec![
            d("a", Dtype::U8, TensorKind::Plain, &[1]),
            d("a", Dtype::U8, TensorKind::Plain, &[1]),
        ],
        vec![d("a", Dtype::U8, TensorKind::Quantized, &[1])],
        vec![d("a", Dtype::Nvfp4, TensorKind::Quantized, &[15])],
        vec![d("a", Dtype::U8, TensorKind::Plain, &[0])],
    ];
    for descs in bad {
        assert!(FtwLayout::plan(descs).is_err());
    }
}

#[test]
fn io_errors_surface() {
    struct Fail;
    impl std::io::Write for Fail {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(std::io::Error::other("disk full"))
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let layout = FtwLayout::plan(sample_ftw_descs()).unwrap();
    assert!(matches!(
        FtwWriter::new(&layout, Fail),
        Err(FormatError::Io(_))
    ));
}

/// Pins the worked hex example in docs/formats.md.
#[test]
fn worked_example_matches_docs() {
    let layout = FtwLayout::plan(vec![TensorDesc::new(
        "w",
        Dtype::BF16,
        TensorKind::Plain,
        vec![2],
    )])
    .unwrap();
    let mut w = FtwWriter::new(&layout, Vec::new()).unwrap();
    w.write_tensor("w", &[0x80, 0x3F, 0x00, 0xC0]).unwrap(); // [1.0, -2.0]
    let b = w.finish().unwrap();
    let head: Vec<u8> = [
        &b"FTW\0\r\n\x1a\n"[..],
        &[1, 0, 0, 0, 1, 0, 0, 0],
        &[0x1F, 0, 0, 0, 0, 0, 0, 0],
        &[0, 0x10, 0, 0, 0, 0, 0, 0],
        &[0, 0x20, 0, 0, 0, 0, 0, 0],
        &[1, 0, b'w', 3, 0, 1, 0],
        &[2, 0, 0, 0, 0, 0, 0, 0],
        &[0, 0x10, 0, 0, 0, 0, 0, 0],
        &[4, 0, 0, 0, 0, 0, 0, 0],
    ]
    .concat();
    assert_eq!(&b[..head.len()], &head[..]);
    assert!(b[head.len()..4096].iter().all(|&x| x == 0));
    assert_eq!(&b[4096..4100], &[0x80, 0x3F, 0x00, 0xC0]);
    assert!(b[4100..].iter().all(|&x| x == 0));
    assert_eq!(b.len(), 8192);
}
