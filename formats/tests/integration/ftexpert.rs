//! FTEXPERT1: round trips, one-pread record access, one test per check.

use crate::common::*;
use ftpipe_formats::ftexpert::{MAX_EXPERTS, MAX_RECORD_FIELDS, MAX_RECORD_TABLE_LEN};
use ftpipe_formats::*;
use proptest::prelude::*;

fn err(b: &[u8]) -> FormatError {
    ExpertView::new(b).expect_err("reader accepted a malformed sidecar")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    #[test]
    fn write_then_read_round_trips(
        layer in 0u32..100,
        experts in 0u32..5,
        rows in prop::collection::vec(1u64..40, 1..4),
        chunk in 1usize..700,
    ) {
        let fields: Vec<TensorDesc> = rows.iter().enumerate().map(|(i, &r)| {
            if i % 2 == 0 {
                TensorDesc::new(format!("f{i}"), Dtype::Nvfp4, TensorKind::Quantized, vec![r, 32])
            } else {
                TensorDesc::new(format!("f{i}"), Dtype::BF16, TensorKind::Protected, vec![r, 3])
            }
        }).collect();
        let predicted = sizes::ftexpert_total_len(layer, experts, fields.clone()).unwrap();
        let layout = ExpertLayout::plan(layer, experts, fields).unwrap();
        prop_assert_eq!(layout.record_size() % 4096, 0);
        let mut w = ExpertWriter::new(&layout, Vec::new()).unwrap();
        for e in 0..experts {
            for f in layout.fields() {
                w.begin_field(e, f.key()).unwrap();
                for c in fill(f.len(), e as u8).chunks(chunk) {
                    w.write(c).unwrap();
                }
                w.end_field().unwrap();
            }
        }
        let bytes = w.finish().unwrap();
        prop_assert_eq!(bytes.len() as u64, predicted);
        let view = ExpertView::new(&bytes).unwrap();
        prop_assert_eq!(view.layout(), &layout);
        let h = ExpertLayout::read_from(&bytes[..]).unwrap();
        prop_assert_eq!(&h, &layout);
        for e in 0..experts {
            // One aligned pread per expert.
            let (off, len) = h.record_range(e).unwrap();
            prop_assert_eq!(off % 4096, 0);
            let rec = h.record(&bytes[off as usize..(off + len) as usize]).unwrap();
            for f in h.fields() {
                let want = fill(f.len(), e as u8);
                prop_assert_eq!(rec.field(f.key()).unwrap(), want.as_slice());
                prop_assert_eq!(view.expert(e).unwrap().field(f.key()).unwrap(), want.as_slice());
            }
        }
    }
}

#[test]
fn sample_geometry() {
    let b = sample_expert();
    let l = ExpertView::new(&b).unwrap().layout().clone();
    assert_eq!(
        (
            l.layer(),
            l.expert_count(),
            l.record_size(),
            l.data_offset()
        ),
        (3, 2, 4096, 4096)
    );
    let offs: Vec<u64> = l.fields().iter().map(|f| f.offset()).collect();
    assert_eq!(offs, vec![0, 128, 256]); // NVFP4 [4,32] = 76 bytes, 64-aligned
    assert_eq!(b.len(), 3 * 4096);
}

#[test]
fn truncated() {
    assert!(matches!(
        err(&sample_expert()[..40]),
        FormatError::Truncated { .. }
    ));
    assert!(matches!(
        ExpertLayout::read_from(&sample_expert()[..100]),
        Err(FormatError::Truncated { .. })
    ));
}

#[test]
fn bad_magic() {
    let mut b = sample_expert();
    b[8] = b'2';
    assert!(matches!(err(&b), FormatError::BadMagic { .. }));
}

#[test]
fn reserved_non_zero() {
    let mut b = sample_expert();
    b[10] = 1;
    assert!(matches!(err(&b), FormatError::ReservedNonZero { .. }));
    let mut b = sample_expert();
    put_u32(&mut b, 28, 7);
    assert!(matches!(
        err(&b),
        FormatError::ReservedNonZero { found: 7, .. }
    ));
}

#[test]
fn unsupported_version() {
    let mut b = sample_expert();
    put_u32(&mut b, 12, 9);
    assert!(matches!(
        err(&b),
        FormatError::UnsupportedVersion { version: 9, .. }
    ));
}

#[test]
fn too_many_experts_and_fields() {
    let mut b = sample_expert();
    put_u32(&mut b, 20, MAX_EXPERTS + 1);
    assert!(matches!(
        err(&b),
        FormatError::TooMany { what: "expert", .. }
    ));
    let mut b = sample_expert();
    put_u32(&mut b, 24, MAX_RECORD_FIELDS + 1);
    assert!(matches!(
        err(&b),
        FormatError::TooMany {
            what: "record field",
            ..
        }
    ));
}

#[test]
fn empty_record() {
    let mut b = sample_expert();
    put_u32(&mut b, 24, 0);
    assert!(matches!(err(&b), FormatError::EmptyRecord));
    assert!(matches!(
        ExpertLayout::plan(0, 1, vec![]),
        Err(FormatError::EmptyRecord)
    ));
}

#[test]
fn table_too_long() {
    let mut b = sample_expert();
    put_u64(&mut b, 40, MAX_RECORD_TABLE_LEN + 1);
    assert!(matches!(err(&b), FormatError::TooLong { .. }));
    assert!(matches!(
        ExpertLayout::read_from(&b[..]),
        Err(FormatError::TooLong { .. })
    ));
}

#[test]
fn record_size_mismatch() {
    let mut b = sample_expert();
    put_u64(&mut b, 32, 8192);
    assert!(matches!(
        err(&b),
        FormatError::RecordSizeMismatch {
            expected: 4096,
            found: 8192
        }
    ));
}

#[test]
fn data_offset_mismatch() {
    let mut b = sample_expert();
    put_u64(&mut b, 48, 0);
    assert!(matches!(err(&b), FormatError::DataOffsetMismatch { .. }));
}

#[test]
fn total_len_mismatch() {
    let mut b = sample_expert();
    put_u64(&mut b, 56, 1);
    assert!(matches!(err(&b), FormatError::TotalLenMismatch { .. }));
}

#[test]
fn file_len_mismatch() {
    let b = sample_expert();
    assert!(matches!(
        err(&b[..8192]),
        FormatError::FileLenMismatch { .. }
    ));
}

#[test]
fn non_zero_padding() {
    let mut b = sample_expert();
    b[4000] = 1; // header padding
    assert!(matches!(
        err(&b),
        FormatError::NonZeroPadding { offset: 4000 }
    ));
    let mut b = sample_expert();
    b[4096 + 100] = 1; // between fields of expert 0
    assert!(matches!(
        err(&b),
        FormatError::NonZeroPadding { offset: 4196 }
    ));
    let mut b = sample_expert();
    b[3 * 4096 - 1] = 1; // record tail padding of expert 1
    assert!(matches!(err(&b), FormatError::NonZeroPadding { .. }));
}

/// Rewrite the layout table of the sample with raw entries.
fn with_table(entries: &[RawE], extra: &[u8]) -> Vec<u8> {
    let mut b = sample_expert();
    let (mut t, _) = raw_index(entries, 0, 64);
    t.extend_from_slice(extra);
    let old = get_u64(&b, 40) as usize;
    assert!(t.len() <= 4096 - 64);
    b[64..64 + old].fill(0);
    b[64..64 + t.len()].copy_from_slice(&t);
    put_u64(&mut b, 40, t.len() as u64);
    put_u32(&mut b, 24, entries.len() as u32);
    b
}

fn sample_raw() -> Vec<RawE> {
    vec![
        RawE::new("gate_proj", Dtype::Nvfp4, TensorKind::Quantized, &[4, 32]),
        RawE::new("up_proj", Dtype::Nvfp4, TensorKind::Native, &[4, 32]),
        RawE::new("down_proj", Dtype::BF16, TensorKind::Protected, &[32, 4]),
    ]
}

#[test]
fn raw_table_builder_matches_writer() {
    assert!(ExpertView::new(&with_table(&sample_raw(), &[])).is_ok());
}

#[test]
fn field_offset_mismatch() {
    let mut e = sample_raw();
    e[1].offset = Some(76); // packed without 64-byte alignment
    assert!(matches!(
        err(&with_table(&e, &[])),
        FormatError::OffsetMismatch {
            expected: 128,
            found: 76,
            ..
        }
    ));
}

#[test]
fn table_trailing_bytes() {
    assert!(matches!(
        err(&with_table(&sample_raw(), &[1, 2])),
        FormatError::IndexTrailingBytes { extra: 2 }
    ));
}

#[test]
fn table_entry_checks_are_shared() {
    let mut e = sample_raw();
    e[2].key = b"gate_proj".to_vec();
    assert!(matches!(
        err(&with_table(&e, &[])),
        FormatError::DuplicateName { .. }
    ));
}

#[test]
fn expert_out_of_range_and_record_size() {
    let b = sample_expert();
    let v = ExpertView::new(&b).unwrap();
    assert!(matches!(
        v.expert(2),
        Err(FormatError::ExpertOutOfRange {
            expert: 2,
            count: 2
        })
    ));
    assert!(matches!(
        v.layout().record(&b[..100]),
        Err(FormatError::BufferSize { .. })
    ));
    assert!(v.expert(1).unwrap().field("nope").is_none());
}

#[test]
fn writer_rejects_misuse() {
    let layout = ExpertLayout::plan(0, 2, sample_expert_fields()).unwrap();
    let mut w = ExpertWriter::new(&layout, Vec::new()).unwrap();
    assert!(matches!(
        w.begin_field(1, "gate_proj"),
        Err(FormatError::WrongOrder { .. })
    ));
    assert!(matches!(
        w.begin_field(0, "up_proj"),
        Err(FormatError::WrongOrder { .. })
    ));
    w.begin_field(0, "gate_proj").unwrap();
    assert!(matches!(
        w.write(&[0; 77]),
        Err(FormatError::TooManyBytes { .. })
    ));
    assert!(matches!(
        w.end_field(),
        Err(FormatError::TooFewBytes { .. })
    ));
    w.write(&[0; 76]).unwrap();
    w.end_field().unwrap();
    assert!(matches!(
        w.finish(),
        Err(FormatError::Unfinished { remaining: 5, .. })
    ));
}
