//! Planning at the real Qwen4-Exp geometry from headers alone: the BF16
//! release (131 files) and the ModelOpt NVFP4 export (206 files, ~297k
//! tensors) written as sparse files (real headers and lengths, holes for
//! data). The plan must give 48 FTEXPERT1 sidecars, 128 Q3_PLE_32 segments
//! of 2,500,012 rows plus the global scale, Q3 = 22,400,107,520 bytes, and
//! sidecar sizes equal to the FTEXPERT1 formula of docs/formats.md computed
//! here a second way.

use std::time::Instant;

use ftpipe_fixtures::qwen4::release::{ReleaseShape, write_release_sparse};
use ftpipe_formats::sizes;
use ftpipe_stages::convert::{ComponentKind, plan_local};

fn plan_real(nvfp4: bool, files: u64) -> (ftpipe_stages::convert::Plan, usize) {
    let tmp = tempfile::tempdir().unwrap();
    let shape = ReleaseShape::real(nvfp4);
    write_release_sparse(tmp.path(), 5, &shape, files).unwrap();
    let shards = std::fs::read_dir(tmp.path())
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "safetensors")
        })
        .count();
    let started = Instant::now();
    let plan = plan_local(tmp.path()).unwrap();
    eprintln!(
        "planned {} ({} files) in {:?}",
        if nvfp4 { "NVFP4" } else { "BF16" },
        shards,
        started.elapsed()
    );
    (plan, shards)
}

/// FTEXPERT1 size from docs/formats.md, computed here: a 64-byte header,
/// a layout table of one index entry per field (2 + key + 4 + 8·rank + 16
/// bytes), data at round_up(64 + table, 4096), then 512 records whose
/// fields start 64-byte aligned and whose size rounds up to 4096. A field
/// is BF16 (2 bytes per weight) or NVFP4 (codes out·in/2, block scales
/// out·in/16, one F32 tensor scale).
fn ftexpert_len(nvfp4: bool) -> u64 {
    let (h, i, experts) = (2560u64, 640u64, 512u64);
    let up = |x: u64, a: u64| x.div_ceil(a) * a;
    let field = |out: u64, inp: u64| {
        if nvfp4 {
            out * inp / 2 + out * inp / 16 + 4
        } else {
            out * inp * 2
        }
    };
    let fields = [
        ("gate_proj", field(i, h)),
        ("up_proj", field(i, h)),
        ("down_proj", field(h, i)),
    ];
    let table: u64 = fields
        .iter()
        .map(|(k, _)| 2 + k.len() as u64 + 4 + 8 * 2 + 16)
        .sum();
    let mut end = 0;
    for (_, len) in fields {
        end = up(end, 64) + len;
    }
    up(64 + table, 4096) + experts * up(end, 4096)
}

fn check(nvfp4: bool, files: u64) {
    let (plan, shards) = plan_real(nvfp4, files);
    assert_eq!(shards as u64, files);
    let of = |k: ComponentKind| {
        plan.components
            .iter()
            .filter(|c| c.kind == k)
            .collect::<Vec<_>>()
    };
    let sidecars = of(ComponentKind::Ftexpert);
    assert_eq!(sidecars.len(), 48);
    let want = ftexpert_len(nvfp4);
    for c in &sidecars {
        assert_eq!((c.items, c.predicted_bytes), (512, want), "{}", c.name);
    }
    let segments = of(ComponentKind::Q3Segment);
    assert_eq!(segments.len(), 128);
    assert!(
        segments
            .iter()
            .all(|c| c.items == 2_500_012 && c.name.starts_with("ple/layer_001/"))
    );
    let q3: u64 = segments.iter().map(|c| c.predicted_bytes).sum();
    assert_eq!(q3, 22_400_107_520);
    assert_eq!(q3, sizes::q3_len(320_001_536, 160).unwrap());
    assert_eq!(of(ComponentKind::Q3GlobalScale).len(), 1);
    assert_eq!(plan.omitted.len(), 333 + 31);
}

#[test]
fn bf16_release_plans_at_real_geometry_from_131_sparse_files() {
    check(false, 131);
}

#[test]
fn nvfp4_export_plans_at_real_geometry_from_206_sparse_files() {
    check(true, 206);
}
