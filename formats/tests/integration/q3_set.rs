//! Q3_PLE_32 segment set: exactly `shard_0..shard_{N-1}` plus the global
//! scale; every deviation is an error naming the segment.

use crate::common::*;
use ftpipe_formats::q3_set::{Q3_GLOBAL_SCALE_NAME, q3_segment_name};
use ftpipe_formats::*;
use half::bf16;

fn geo() -> Q3Geometry {
    Q3Geometry::uniform(3, 10, 64).unwrap() // 10 rows × 2 blocks × 14 = 280 bytes
}

fn segs(names: &[(&str, u64)]) -> Vec<(String, u64)> {
    names.iter().map(|(n, l)| (n.to_string(), *l)).collect()
}

const G: [u8; 2] = [0x80, 0x3F]; // bf16 1.0

fn check(list: &[(&str, u64)], g: Option<&[u8]>) -> Result<Q3SegmentSet> {
    Q3SegmentSet::validate(&geo(), segs(list), g)
}

#[test]
fn exact_set_is_accepted_in_any_order() {
    let s = check(
        &[("shard_2", 280), ("shard_0", 280), ("shard_1", 280)],
        Some(&G),
    )
    .unwrap();
    assert_eq!(s.global_scale().value(), bf16::ONE);
    assert_eq!(s.geometry().total_len(), 840);
}

#[test]
fn missing_segment_is_named() {
    let e = check(&[("shard_0", 280), ("shard_2", 280)], Some(&G)).unwrap_err();
    assert!(
        matches!(e, FormatError::Q3MissingSegment { ref name } if name == "shard_1"),
        "{e}"
    );
}

#[test]
fn extra_segment_is_named() {
    for bad in ["shard_3", "shard_01", "global", "shard_-1"] {
        let e = check(
            &[
                ("shard_0", 280),
                ("shard_1", 280),
                ("shard_2", 280),
                (bad, 280),
            ],
            Some(&G),
        )
        .unwrap_err();
        assert!(
            matches!(e, FormatError::Q3ExtraSegment { ref name } if name == bad),
            "{e}"
        );
    }
}

#[test]
fn duplicate_segment_is_named() {
    let e = check(
        &[("shard_0", 280), ("shard_1", 280), ("shard_1", 280)],
        Some(&G),
    )
    .unwrap_err();
    assert!(
        matches!(e, FormatError::Q3DuplicateSegment { ref name } if name == "shard_1"),
        "{e}"
    );
}

#[test]
fn mis_sized_segment_is_named() {
    let e = check(
        &[("shard_0", 280), ("shard_1", 266), ("shard_2", 280)],
        Some(&G),
    )
    .unwrap_err();
    assert!(
        matches!(e, FormatError::Q3SegmentSize { ref name, expected: 280, found: 266 } if name == "shard_1"),
        "{e}"
    );
}

#[test]
fn global_scale_checks() {
    let all = [("shard_0", 280), ("shard_1", 280), ("shard_2", 280)];
    assert!(matches!(
        check(&all, None),
        Err(FormatError::Q3MissingGlobalScale)
    ));
    assert!(matches!(
        check(&all, Some(&[1, 2, 3])),
        Err(FormatError::Q3GlobalScaleSize { found: 3 })
    ));
    assert!(matches!(
        check(&all, Some(&[0x80, 0xBF])),
        Err(FormatError::Q3GlobalScaleInvalid { .. })
    ));
    assert!(matches!(
        check(&all, Some(&[0x80, 0x7F])),
        Err(FormatError::Q3GlobalScaleInvalid { .. })
    ));
}

#[test]
fn geometry_limits() {
    assert!(matches!(
        Q3Geometry::uniform(1 << 20, 1, 32),
        Err(FormatError::TooMany { .. })
    ));
    assert!(matches!(
        Q3Geometry::uniform(2, 1, 33),
        Err(FormatError::Q3BadWidth { width: 33 })
    ));
    assert!(matches!(
        Q3Geometry::new(32, vec![u64::MAX / 14, u64::MAX / 14]),
        Err(FormatError::Overflow { .. })
    ));
}

/// The real Qwen4-Exp geometry: 128 segments of 2,500,012 rows × 160.
#[test]
fn real_geometry_sizes() {
    let g = Q3Geometry::uniform(128, 2_500_012, 160).unwrap();
    assert_eq!(g.total_len(), 22_400_107_520);
    assert_eq!(q3_segment_len(320_001_536, 160).unwrap(), 22_400_107_520);
    for i in 0..128 {
        assert_eq!(g.segment_len(i), Some(175_000_840));
    }
    let list: Vec<(String, u64)> = (0..128)
        .map(|i| (q3_segment_name(i), 175_000_840))
        .collect();
    Q3SegmentSet::validate(&g, list, Some(&G)).unwrap();
}

#[test]
fn ftw_stored_table_round_trips() {
    let (bytes, geometry) = write_q3_ftw(3, 4, 64);
    let view = FtwView::new(&bytes).unwrap();
    let set = Q3SegmentSet::from_ftw(&view, &geometry).unwrap();
    let g = set.global_scale();
    let seg = view.tensor("shard_1").unwrap();
    let mut out = vec![0f32; 4 * 64];
    q3::decode(seg.data, g, &mut out).unwrap();
    let want = ((5.0f32 * 0.37) + 1.0).sin();
    assert!((out[5] - want).abs() < 0.2, "{} vs {want}", out[5]);
    // Wrong geometry: segment shape differs.
    let other = Q3Geometry::uniform(3, 5, 64).unwrap();
    assert!(matches!(
        Q3SegmentSet::from_ftw(&view, &other),
        Err(FormatError::Q3SegmentShape { .. })
    ));
    // Fewer segments expected: shard_2 is extra.
    let fewer = Q3Geometry::uniform(2, 4, 64).unwrap();
    assert!(matches!(
        Q3SegmentSet::from_ftw(&view, &fewer),
        Err(FormatError::Q3ExtraSegment { .. })
    ));
}

#[test]
fn ftw_global_scale_must_be_bf16_scalar() {
    let descs = vec![
        TensorDesc::new(
            "shard_0",
            Dtype::Q3Ple32,
            TensorKind::Quantized,
            vec![1, 32],
        ),
        TensorDesc::new(Q3_GLOBAL_SCALE_NAME, Dtype::F32, TensorKind::Plain, vec![]),
    ];
    let bytes = write_ftw(descs);
    let view = FtwView::new(&bytes).unwrap();
    let g = Q3Geometry::uniform(1, 1, 32).unwrap();
    assert!(matches!(
        Q3SegmentSet::from_ftw(&view, &g),
        Err(FormatError::Q3GlobalScaleSize { found: 4 })
    ));
}
