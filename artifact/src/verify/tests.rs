//! Builds a small but real artifact with the format writers, then tampers
//! with it one way at a time and asserts exactly which checks fail where.

use std::path::Path;

use half::bf16;

use ftpipe_formats::{
    Dtype, ExpertLayout, ExpertWriter, FtwLayout, FtwWriter, Q3GlobalScale, TensorDesc, TensorKind,
    q3, q3_segment_len,
};

use super::*;
use crate::manifest::{
    ConvertOptionsId, ConverterIdentity, InventoryTensor, ManifestComponent, OmittedEntry,
    Partition, SourceFileId, SourceIdentity, sha256_hex,
};

const WIDTH: u64 = 64;
const SEGMENT_ROWS: [u64; 3] = [2, 3, 1];
const EXPERT_LAYERS: [u64; 2] = [1, 2];
const EXPERTS: u32 = 4;

fn bytes_of(n: u64, seed: u64) -> Vec<u8> {
    (0..n).map(|i| ((i * 31 + seed * 7) % 251) as u8).collect()
}

fn put(dir: &Path, path: &str, bytes: &[u8], layout: ComponentLayout) -> ManifestComponent {
    let abs = dir.join(path);
    std::fs::create_dir_all(abs.parent().unwrap()).unwrap();
    std::fs::write(&abs, bytes).unwrap();
    ManifestComponent {
        path: path.to_owned(),
        size: bytes.len() as u64,
        predicted_bytes: bytes.len() as u64,
        sha256: sha256_hex(bytes),
        layout,
    }
}

fn expert_fields() -> Vec<TensorDesc> {
    vec![
        TensorDesc::new("gate", Dtype::BF16, TensorKind::Plain, [8, 4]),
        TensorDesc::new("down", Dtype::F32, TensorKind::Plain, [4, 2]),
    ]
}

/// Writes a clean artifact into `dir` and returns its manifest.
fn build(dir: &Path) -> Manifest {
    let mut components = Vec::new();

    let ftw_tensors = vec![
        TensorDesc::new("embed", Dtype::BF16, TensorKind::Plain, [4, 8]),
        TensorDesc::new("norm", Dtype::F32, TensorKind::Protected, [8]),
    ];
    let layout = FtwLayout::plan(ftw_tensors.clone()).unwrap();
    let mut w = FtwWriter::new(&layout, Vec::new()).unwrap();
    for (i, d) in ftw_tensors.iter().enumerate() {
        w.write_tensor(&d.key, &bytes_of(d.byte_len().unwrap(), i as u64))
            .unwrap();
    }
    let ftw = w.finish().unwrap();
    components.push(put(
        dir,
        "model.ftw",
        &ftw,
        ComponentLayout::Ftw { tensors: 2 },
    ));

    for layer in EXPERT_LAYERS {
        let l = ExpertLayout::plan(layer as u32, EXPERTS, expert_fields()).unwrap();
        let mut w = ExpertWriter::new(&l, Vec::new()).unwrap();
        for e in 0..EXPERTS {
            for f in expert_fields() {
                let data = bytes_of(f.byte_len().unwrap(), layer + u64::from(e));
                w.write_field(e, &f.key, &data).unwrap();
            }
        }
        let bytes = w.finish().unwrap();
        let layout = ComponentLayout::Ftexpert {
            layer,
            experts: EXPERTS.into(),
            record_size: l.record_size(),
            fields: expert_fields(),
        };
        let path = format!("experts/layer_{layer:03}.ftexpert");
        components.push(put(dir, &path, &bytes, layout));
    }

    let total: u64 = SEGMENT_ROWS.iter().sum::<u64>() * WIDTH;
    let table: Vec<bf16> = (0..total)
        .map(|i| bf16::from_f32((i as f32 * 0.37).sin() * 3.0))
        .collect();
    let amax = table.iter().fold(0f32, |a, v| a.max(v.to_f32().abs()));
    let g = Q3GlobalScale::from_absmax(amax).unwrap();
    let mut start = 0usize;
    for (index, rows) in SEGMENT_ROWS.into_iter().enumerate() {
        let n = (rows * WIDTH) as usize;
        let mut out = vec![0u8; q3_segment_len(rows, WIDTH).unwrap() as usize];
        q3::encode(
            "ple",
            &table[start..start + n],
            WIDTH as usize,
            g,
            0,
            &mut out,
        )
        .unwrap();
        start += n;
        let layout = ComponentLayout::Q3Segment {
            layer: 0,
            index: index as u64,
            rows,
            width: WIDTH,
        };
        let path = format!("ple/layer_000/shard_{index}.q3");
        components.push(put(dir, &path, &out, layout));
    }
    let layout = ComponentLayout::Q3GlobalScale {
        layer: 0,
        segments: SEGMENT_ROWS.len() as u64,
    };
    components.push(put(
        dir,
        "ple/layer_000/global_scale.bf16",
        &g.to_bytes(),
        layout,
    ));

    let mut m = Manifest {
        schema: MANIFEST_SCHEMA.to_owned(),
        fingerprint: String::new(),
        source: SourceIdentity {
            repo: "test/tiny".into(),
            commit: "a".repeat(40),
            files: Vec::new(),
        },
        converter: ConverterIdentity::current("test", ConvertOptionsId::default()),
        components,
        ftw_tensors,
        tensors: Vec::new(),
        omitted: vec![],
    };
    m.fingerprint = m.compute_fingerprint().unwrap();
    write_manifest(dir, &m);
    let ftw_size = m.components[0].size;
    let layer_size = m.components[1].size;
    // Room for the stream and one expert layer: layer 1 resident, 2 file tier.
    write_placement(dir, &Placement::generate(&m, ftw_size + layer_size, 0, 2));
    m
}

fn write_manifest(dir: &Path, m: &Manifest) {
    std::fs::write(dir.join(MANIFEST_FILE), m.to_bytes().unwrap()).unwrap();
}

fn write_placement(dir: &Path, p: &Placement) {
    std::fs::write(
        dir.join(PLACEMENT_FILE),
        serde_json::to_vec_pretty(p).unwrap(),
    )
    .unwrap();
}

/// Failures as sorted `(component, check)` pairs.
fn failed(r: &VerifyReport) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = r
        .failures
        .iter()
        .map(|f| (f.component.clone().unwrap_or_default(), f.check.clone()))
        .collect();
    v.sort();
    v
}

fn expect(r: &VerifyReport, want: &[(&str, &str)]) {
    let mut want: Vec<(String, String)> = want
        .iter()
        .map(|(c, k)| ((*c).to_owned(), (*k).to_owned()))
        .collect();
    want.sort();
    assert_eq!(failed(r), want, "{:#?}", r.failures);
    assert_eq!(r.ok, want.is_empty());
}

fn verify(dir: &Path, deep: bool) -> VerifyReport {
    verify_artifact(dir, deep).unwrap()
}

fn copy_tree(from: &Path, to: &Path) {
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let dest = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            std::fs::create_dir(&dest).unwrap();
            copy_tree(&entry.path(), &dest);
        } else {
            std::fs::copy(entry.path(), &dest).unwrap();
        }
    }
}

#[test]
fn clean_artifact_passes_quick_and_deep_and_after_a_copy() {
    let dir = tempfile::tempdir().unwrap();
    let m = build(dir.path());
    for deep in [false, true] {
        let r = verify(dir.path(), deep);
        expect(&r, &[]);
        assert_eq!(r.deep, deep);
        assert_eq!(r.fingerprint.as_deref(), Some(m.fingerprint.as_str()));
        assert_eq!(r.schema.as_deref(), Some(MANIFEST_SCHEMA));
        assert_eq!(
            (r.expert_layers, r.experts, r.experts_per_layer),
            (2, 8, Some(4))
        );
        assert_eq!((r.resident_layers, r.file_tier_layers), (1, 1));
        assert_eq!((r.components, r.ple_layers), (7, 1));
        assert_eq!(r.bytes, m.components.iter().map(|c| c.size).sum::<u64>());
    }
    let copy = tempfile::tempdir().unwrap();
    copy_tree(dir.path(), copy.path());
    expect(&verify(copy.path(), true), &[]);
}

#[test]
fn a_flipped_byte_fails_only_the_deep_hash() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    let path = dir.path().join("experts/layer_001.ftexpert");
    let mut bytes = std::fs::read(&path).unwrap();
    let i = ExpertLayout::parse(&bytes).unwrap().data_offset() as usize + 5;
    bytes[i] ^= 0x40;
    std::fs::write(&path, &bytes).unwrap();
    expect(&verify(dir.path(), false), &[]);
    let r = verify(dir.path(), true);
    expect(&r, &[("experts/layer_001.ftexpert", check::SHA256)]);
    assert!(r.failures[0].message.contains("expected "), "{r:?}");
}

#[test]
fn missing_extra_and_resized_segments_are_named() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    let ple = dir.path().join("ple/layer_000");
    std::fs::remove_file(ple.join("shard_1.q3")).unwrap();
    std::fs::write(ple.join("shard_9.q3"), [0u8; 14]).unwrap();
    let mut seg = std::fs::read(ple.join("shard_2.q3")).unwrap();
    seg.push(0);
    std::fs::write(ple.join("shard_2.q3"), &seg).unwrap();
    let r = verify(dir.path(), false);
    expect(
        &r,
        &[
            ("ple/layer_000/shard_1.q3", check::MISSING),
            ("ple/layer_000/shard_9.q3", check::Q3_SEGMENT_SET),
            ("ple/layer_000/shard_2.q3", check::SIZE),
        ],
    );
    let size = r.failures.iter().find(|f| f.check == check::SIZE).unwrap();
    assert!(
        size.message.contains("expected 28 bytes"),
        "{}",
        size.message
    );
    assert!(size.message.contains("found 29"), "{}", size.message);
}

#[test]
fn edited_digest_breaks_the_fingerprint_and_edited_size_the_size() {
    let dir = tempfile::tempdir().unwrap();
    let mut m = build(dir.path());
    m.components[3].sha256 = "0".repeat(64);
    write_manifest(dir.path(), &m);
    expect(
        &verify(dir.path(), false),
        &[(MANIFEST_FILE, check::FINGERPRINT)],
    );
    expect(
        &verify(dir.path(), true),
        &[
            (MANIFEST_FILE, check::FINGERPRINT),
            ("ple/layer_000/shard_0.q3", check::SHA256),
        ],
    );

    // Sizes are hashed into the fingerprint too; the disk catches them as well.
    let mut m = build(dir.path());
    m.components[0].size += 4096;
    write_manifest(dir.path(), &m);
    expect(
        &verify(dir.path(), false),
        &[
            (MANIFEST_FILE, check::FINGERPRINT),
            ("model.ftw", check::PREDICTED_SIZE),
            ("model.ftw", check::SIZE),
        ],
    );
}

/// Schema 1 hashed only the identities and the component digests: the
/// inventory's `sources` (provenance) could be rewritten by anyone with
/// write access to a bucket, and the artifact still verified under the same
/// fingerprint. Every field but the fingerprint is covered now.
#[test]
fn an_edit_of_any_field_breaks_the_fingerprint() {
    let dir = tempfile::tempdir().unwrap();
    let clean = build(dir.path());
    type Edit = fn(&mut Manifest);
    let edits: [(&str, Edit); 5] = [
        ("tensors[].sources", |m| {
            m.tensors.push(InventoryTensor {
                component: "model.ftw".into(),
                key: "planted".into(),
                sources: vec!["model.embed_tokens.weight".into()],
            });
        }),
        ("ftw_tensors", |m| m.ftw_tensors.truncate(1)),
        ("components[].layout", |m| {
            for c in &mut m.components {
                if let ComponentLayout::Q3GlobalScale { segments, .. } = &mut c.layout {
                    *segments += 1;
                }
            }
        }),
        ("components[].predicted_bytes", |m| {
            m.components[1].predicted_bytes += 1;
        }),
        ("omitted", |m| {
            m.omitted.push(OmittedEntry {
                tensor: "model.visual.x".into(),
                file: "a.safetensors".into(),
                reason: Partition::Vision,
                fetched: true,
            });
        }),
    ];
    for (field, edit) in edits {
        let mut m = clean.clone();
        edit(&mut m);
        assert_ne!(m, clean, "{field}: the edit changed nothing");
        write_manifest(dir.path(), &m);
        let r = verify(dir.path(), false);
        assert!(
            failed(&r).contains(&(MANIFEST_FILE.to_owned(), check::FINGERPRINT.to_owned())),
            "{field}: {:#?}",
            r.failures
        );
    }
    // A schema-1 manifest (even one whose fingerprint is consistent) is
    // refused, naming how to rewrite it.
    let mut m = clean.clone();
    m.schema = MANIFEST_SCHEMA_V1.to_owned();
    m.fingerprint = m.compute_fingerprint().unwrap();
    write_manifest(dir.path(), &m);
    write_placement(dir.path(), &Placement::generate(&m, u64::MAX, 0, 2));
    let r = verify(dir.path(), false);
    expect(&r, &[(MANIFEST_FILE, check::SCHEMA)]);
    assert!(
        r.failures[0].message.contains("ftpipe convert"),
        "{:#?}",
        r.failures
    );
}

#[test]
fn a_consistently_refingerprinted_edit_still_fails_deep_and_placement() {
    let dir = tempfile::tempdir().unwrap();
    let mut m = build(dir.path());
    m.components[1].sha256 = "f".repeat(64);
    m.fingerprint = m.compute_fingerprint().unwrap();
    write_manifest(dir.path(), &m);
    expect(
        &verify(dir.path(), false),
        &[(PLACEMENT_FILE, check::PLACEMENT)],
    );
    expect(
        &verify(dir.path(), true),
        &[
            (PLACEMENT_FILE, check::PLACEMENT),
            ("experts/layer_001.ftexpert", check::SHA256),
        ],
    );
}

#[test]
fn placement_for_another_fingerprint_fails() {
    let dir = tempfile::tempdir().unwrap();
    let m = build(dir.path());
    let mut p = Placement::generate(&m, u64::MAX, 0, 2);
    p.fingerprint = "b".repeat(64);
    write_placement(dir.path(), &p);
    let r = verify(dir.path(), false);
    expect(&r, &[(PLACEMENT_FILE, check::PLACEMENT)]);
    assert!(r.failures[0].message.contains(&"b".repeat(64)));
    std::fs::remove_file(dir.path().join(PLACEMENT_FILE)).unwrap();
    expect(
        &verify(dir.path(), false),
        &[(PLACEMENT_FILE, check::PLACEMENT)],
    );
}

#[test]
fn extra_and_temp_files_are_reported_one_by_one() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    std::fs::write(dir.path().join("notes.txt"), b"hi").unwrap();
    std::fs::write(dir.path().join("experts/layer_003.ftexpert"), b"x").unwrap();
    std::fs::write(dir.path().join("model.ftw.ftpipe-tmp"), b"x").unwrap();
    std::fs::create_dir_all(dir.path().join("ple/layer_007")).unwrap();
    std::fs::write(dir.path().join("ple/layer_007/shard_0.q3"), b"x").unwrap();
    expect(
        &verify(dir.path(), false),
        &[
            ("notes.txt", check::UNEXPECTED_FILE),
            ("experts/layer_003.ftexpert", check::UNEXPECTED_FILE),
            ("model.ftw.ftpipe-tmp", check::STALE_TEMP),
            ("ple/layer_007/shard_0.q3", check::UNEXPECTED_FILE),
        ],
    );
}

#[test]
fn headers_are_checked_against_the_manifest_layout() {
    let dir = tempfile::tempdir().unwrap();
    let mut m = build(dir.path());
    m.ftw_tensors[1].shape = vec![16];
    if let ComponentLayout::Ftexpert {
        fields, experts, ..
    } = &mut m.components[2].layout
    {
        fields[0].kind = TensorKind::Protected;
        *experts = 5;
    }
    if let ComponentLayout::Q3GlobalScale { segments, .. } = &mut m.components[6].layout {
        *segments = 4;
    }
    m.fingerprint = m.compute_fingerprint().unwrap();
    write_manifest(dir.path(), &m);
    write_placement(dir.path(), &Placement::generate(&m, 0, 0, 2));
    let r = verify(dir.path(), false);
    expect(
        &r,
        &[
            ("model.ftw", check::FTW_INDEX),
            ("experts/layer_002.ftexpert", check::FTEXPERT_LAYOUT),
            ("ple/layer_000/", check::Q3_SEGMENT_SET),
        ],
    );
    let ftw = &r.failures[0].message;
    assert!(ftw.contains("tensors #1") && ftw.contains("[16]"), "{ftw}");
}

#[test]
fn corrupt_headers_truncation_and_bad_scales_fail() {
    let dir = tempfile::tempdir().unwrap();
    let mut m = build(dir.path());
    let ftw = dir.path().join("model.ftw");
    let bytes = std::fs::read(&ftw).unwrap();
    std::fs::write(&ftw, &bytes[..bytes.len() - 4096]).unwrap();
    let exp = dir.path().join("experts/layer_002.ftexpert");
    let mut bytes = std::fs::read(&exp).unwrap();
    bytes[0] = b'X';
    std::fs::write(&exp, &bytes).unwrap();
    // A negative scale, recorded honestly in a re-fingerprinted manifest.
    let neg = bf16::from_f32(-1.0).to_bits().to_le_bytes();
    std::fs::write(dir.path().join("ple/layer_000/global_scale.bf16"), neg).unwrap();
    m.components[6].sha256 = sha256_hex(&neg);
    m.fingerprint = m.compute_fingerprint().unwrap();
    write_manifest(dir.path(), &m);
    write_placement(dir.path(), &Placement::generate(&m, 0, 0, 2));
    expect(
        &verify(dir.path(), false),
        &[
            ("model.ftw", check::SIZE),
            ("model.ftw", check::FTW_HEADER),
            ("experts/layer_002.ftexpert", check::FTEXPERT_HEADER),
            ("ple/layer_000/global_scale.bf16", check::Q3_GLOBAL_SCALE),
        ],
    );
}

#[test]
fn hostile_manifest_paths_are_refused_without_touching_them() {
    let dir = tempfile::tempdir().unwrap();
    let mut m = build(dir.path());
    m.components[3].path = "../outside.q3".into();
    m.components[4].path = "ple/layer_000/shard_0.q3".into();
    m.fingerprint = m.compute_fingerprint().unwrap();
    write_manifest(dir.path(), &m);
    write_placement(dir.path(), &Placement::generate(&m, 0, 0, 2));
    let r = verify(dir.path(), false);
    expect(
        &r,
        &[
            ("../outside.q3", check::COMPONENT_PATH),
            ("ple/layer_000/shard_0.q3", check::COMPONENT_PATH),
            ("ple/layer_000/shard_1.q3", check::Q3_SEGMENT_SET),
        ],
    );
}

#[cfg(unix)]
#[test]
fn a_symlinked_component_is_not_a_regular_file() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    let outside = tempfile::tempdir().unwrap();
    let seg = dir.path().join("ple/layer_000/shard_0.q3");
    let target = outside.path().join("shard_0.q3");
    std::fs::copy(&seg, &target).unwrap();
    std::fs::remove_file(&seg).unwrap();
    std::os::unix::fs::symlink(&target, &seg).unwrap();
    expect(
        &verify(dir.path(), true),
        &[("ple/layer_000/shard_0.q3", check::NOT_REGULAR_FILE)],
    );
}

#[test]
fn a_missing_or_broken_manifest_is_a_failure_and_no_dir_an_error() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    std::fs::write(dir.path().join("stale.json.ftpipe-tmp"), b"{").unwrap();
    std::fs::write(dir.path().join(MANIFEST_FILE), b"{\"schema\":").unwrap();
    let r = verify(dir.path(), false);
    expect(
        &r,
        &[
            (MANIFEST_FILE, check::MANIFEST),
            ("stale.json.ftpipe-tmp", check::STALE_TEMP),
        ],
    );
    assert_eq!(r.fingerprint, None);
    std::fs::remove_file(dir.path().join(MANIFEST_FILE)).unwrap();
    let r = verify(dir.path(), false);
    assert!(r.failures[0].message.contains("not found"), "{r:?}");
    assert!(verify_artifact(&dir.path().join("nope"), false).is_err());
    let file = dir.path().join("notes");
    std::fs::write(&file, b"x").unwrap();
    assert!(verify_artifact(&file, false).is_err());
}

/// The manifest of a ~300k-tensor NVFP4 MoE export (94 layers × 256
/// experts × 3 projections, each a weight / weight_scale / weight_scale_2 /
/// input_scale quadruple, with realistic names) stays under half of
/// [`MAX_MANIFEST_BYTES`]: the limit refuses a padded or bloated manifest,
/// never a real one.
#[test]
fn max_manifest_bytes_holds_a_300k_tensor_nvfp4_manifest_twice() {
    const LAYERS: u64 = 94;
    const EXPERTS: u64 = 256;
    let parts = ["weight", "weight_scale", "weight_scale_2", "input_scale"];
    let desc = |key: &str| TensorDesc::new(key, Dtype::U8, TensorKind::Native, vec![4096, 768]);
    let mut components = Vec::new();
    let mut tensors = Vec::new();
    let mut ftw_tensors = Vec::new();
    let mut sources = 0usize;
    for l in 0..LAYERS {
        let name = format!("experts/layer_{l:03}.ftexpert");
        let fields: Vec<TensorDesc> = ["gate_proj", "up_proj", "down_proj"]
            .iter()
            .map(|f| desc(f))
            .collect();
        for e in 0..EXPERTS {
            for f in ["gate_proj", "up_proj", "down_proj"] {
                tensors.push(InventoryTensor {
                    component: name.as_str().into(),
                    key: format!("{e}.{f}"),
                    sources: parts
                        .iter()
                        .map(|p| format!("model.layers.{l}.mlp.experts.{e}.{f}.{p}").into())
                        .collect(),
                });
                sources += parts.len();
            }
        }
        components.push(ManifestComponent {
            path: name,
            size: 1 << 30,
            predicted_bytes: 1 << 30,
            sha256: "0".repeat(64),
            layout: ComponentLayout::Ftexpert {
                layer: l,
                experts: EXPERTS,
                record_size: 1 << 22,
                fields,
            },
        });
        for proj in ["q_proj", "k_proj", "v_proj", "o_proj"] {
            let key = format!("model.layers.{l}.self_attn.{proj}.weight");
            ftw_tensors.push(desc(&key));
            tensors.push(InventoryTensor {
                component: FTW_COMPONENT.into(),
                key: key.clone(),
                sources: parts
                    .iter()
                    .map(|p| format!("model.layers.{l}.self_attn.{proj}.{p}").into())
                    .collect(),
            });
            sources += parts.len();
        }
    }
    assert!(sources >= 290_000, "{sources} source tensors");
    let manifest = Manifest {
        schema: MANIFEST_SCHEMA.into(),
        fingerprint: "0".repeat(64),
        source: SourceIdentity {
            repo: "nvidia/Some-Large-MoE-NVFP4".into(),
            commit: "0".repeat(40),
            files: (1..=200)
                .map(|i| SourceFileId {
                    path: format!("model-{i:05}-of-00200.safetensors"),
                    size: 5 << 30,
                    digest_kind: "sha256".into(),
                    digest: "0".repeat(64),
                })
                .collect(),
        },
        converter: ConverterIdentity::current("qwen4_exp", ConvertOptionsId::default()),
        components,
        ftw_tensors,
        tensors,
        // The export's vision tower (333) and MTP head (31), omitted.
        omitted: (0..364)
            .map(|i| OmittedEntry {
                tensor: format!("model.visual.blocks.{i}.attn.qkv.weight"),
                file: format!("model-{:05}-of-00206.safetensors", 1 + i % 206),
                reason: if i < 333 {
                    Partition::Vision
                } else {
                    Partition::Mtp
                },
                fetched: true,
            })
            .collect(),
    };
    let len = manifest.to_bytes().unwrap().len() as u64;
    eprintln!("{sources} source tensors: manifest.json of {len} bytes");
    assert!(
        len.saturating_mul(2) <= MAX_MANIFEST_BYTES,
        "{len} bytes leave less than 2x headroom under {MAX_MANIFEST_BYTES}"
    );
}
