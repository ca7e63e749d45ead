//! Fuzz entry points: one function per parser of input that strangers
//! control, in one place so that the cargo-fuzz targets (`fuzz/`, nightly)
//! and the stable corpus replay (this crate's tests, run in CI) call exactly
//! the same code.
//!
//! Each entry takes raw fuzzer bytes, feeds them to the parser as
//! production does, and asserts the parser's contract on what it accepts
//! (a property, not just "no panic"): offsets inside the file, limits
//! respected, round trips exact. A panic or failed assertion is a bug.
//!
//! | entry | parser |
//! |---|---|
//! | [`safetensors_header`] | `SourceHeader` (structure-aware: an arbitrary header JSON plus raw byte edits) |
//! | [`index_json`] | `model.safetensors.index.json` → `weight_map` |
//! | [`config_profile`] | `config.json` → profile → plan (sizes of every component) |
//! | [`hub_pages`] | the hub's revision answer and tree listing pages |
//! | [`http_headers`] | `Content-Range`, `ETag`, `Retry-After`, `Link`, `X-Repo-Commit`, `X-Linked-Size`, `X-Linked-Etag` |
//! | [`recipe_toml`] | TOML recipes |
//! | [`manifest_placement`] | `manifest.json` + `placement.json` (with a round trip) |
//! | [`ftw_reader`], [`ftexpert_reader`], [`q3_segment_set`] | the artifact readers |
//! | [`ftw_round_trip`] | FTW v1 writer → reader |
//! | [`ftexpert_round_trip`] | FTEXPERT1 writer → reader |
//! | [`codec_round_trip`] | Q3_PLE_32, NVFP4 and E4M3 encoders → decoders (fast = reference, error within the documented bound) |

// Unit tests see every dev-dependency; the lint is for the library itself.
#![cfg_attr(test, allow(unused_crate_dependencies))]
// Test support: fuzz inputs are written with plain `std::fs` calls, never
// ftpipe state (clippy.toml).
#![allow(clippy::disallowed_methods)]

use std::collections::BTreeMap;
use std::sync::OnceLock;

use arbitrary::{Arbitrary, Unstructured};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde_json::Value;

use ftpipe_artifact::manifest::{Manifest, Placement};
use ftpipe_convert::plan::{plan_from_parts, shard_files, weight_map};
use ftpipe_convert::recipe::Recipe;
use ftpipe_convert::{MAX_HEADER_LEN, PlanOptions, SourceHeader};
use ftpipe_formats::{
    Dtype, ExpertLayout, ExpertView, ExpertWriter, FtwHeader, FtwLayout, FtwView, FtwWriter,
    Q3Geometry, Q3GlobalScale, Q3SegmentSet, TensorDesc, TensorKind, e4m3, nvfp4, q3,
};
use ftpipe_hub::client::{LinkedMeta, next_link};
use ftpipe_hub::headers::{
    check_linked_meta, etag, parse_content_range, retry_after_secs, strong_validator,
};
use ftpipe_hub::resolve::{parse_revision, parse_tree_page};
use half::bf16;

/// A named entry point.
#[derive(Clone, Copy)]
pub struct Target {
    /// The cargo-fuzz target and corpus directory name.
    pub name: &'static str,
    /// The entry.
    pub run: fn(&[u8]),
}

/// Every entry point, by target name.
pub const TARGETS: &[Target] = &[
    Target {
        name: "safetensors_header",
        run: safetensors_header,
    },
    Target {
        name: "index_json",
        run: index_json,
    },
    Target {
        name: "config_profile",
        run: config_profile,
    },
    Target {
        name: "hub_pages",
        run: hub_pages,
    },
    Target {
        name: "http_headers",
        run: http_headers,
    },
    Target {
        name: "recipe_toml",
        run: recipe_toml,
    },
    Target {
        name: "manifest_placement",
        run: manifest_placement,
    },
    Target {
        name: "ftw_reader",
        run: ftw_reader,
    },
    Target {
        name: "ftexpert_reader",
        run: ftexpert_reader,
    },
    Target {
        name: "q3_segment_set",
        run: q3_segment_set,
    },
    Target {
        name: "ftw_round_trip",
        run: ftw_round_trip,
    },
    Target {
        name: "ftexpert_round_trip",
        run: ftexpert_round_trip,
    },
    Target {
        name: "codec_round_trip",
        run: codec_round_trip,
    },
];

const DTYPES: &[&str] = &[
    "BOOL", "U8", "I8", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "F64", "I64", "U64",
    "F8_E4M3", "F8_E5M2", "F4", "BOGUS",
];

/// One tensor of a generated header.
#[derive(Debug, Arbitrary)]
struct ArbTensor {
    name: u8,
    dtype: u8,
    shape: Vec<u8>,
    /// Offsets follow the previous tensor's end (a valid tiling) unless set.
    offsets: Option<(u16, u16)>,
}

/// A generated safetensors file: header JSON built from `tensors` (names
/// may repeat: duplicate keys), then raw edits of the JSON bytes.
#[derive(Debug, Arbitrary)]
struct ArbHeader {
    tensors: Vec<ArbTensor>,
    metadata: Option<Vec<(u8, u8)>>,
    edits: Vec<(u16, u8)>,
    extra_data: u8,
    /// Declared header length differs from the JSON's.
    len_delta: i8,
}

/// Most tensor data a generated file carries.
const MAX_GENERATED_DATA: u64 = 1 << 20;

fn width(dtype: &str) -> u64 {
    match dtype {
        "BOOL" | "U8" | "I8" | "F8_E4M3" | "F8_E5M2" | "F4" => 1,
        "I16" | "U16" | "F16" | "BF16" => 2,
        "I32" | "U32" | "F32" => 4,
        _ => 8,
    }
}

impl ArbHeader {
    /// The file bytes: 8-byte length, JSON, then (zero) data.
    fn file(&self) -> Vec<u8> {
        let mut json = String::from("{");
        let mut end = 0u64;
        for (i, t) in self.tensors.iter().take(64).enumerate() {
            let dtype = DTYPES[usize::from(t.dtype) % DTYPES.len()];
            let shape: Vec<u64> = t.shape.iter().take(9).map(|d| u64::from(*d % 8)).collect();
            let len = shape.iter().product::<u64>() * width(dtype);
            let (b, e) = match t.offsets {
                Some((b, e)) => (u64::from(b), u64::from(e)),
                None => (end, end + len),
            };
            end = end.max(e);
            if i > 0 {
                json.push(',');
            }
            json.push_str(&format!(
                r#""t{}":{{"dtype":"{dtype}","shape":{shape:?},"data_offsets":[{b},{e}]}}"#,
                t.name % 16
            ));
        }
        if let Some(meta) = &self.metadata {
            if json.len() > 1 {
                json.push(',');
            }
            let pairs: Vec<String> = meta
                .iter()
                .take(8)
                .map(|(k, v)| format!(r#""k{k}":"v{v}""#))
                .collect();
            json.push_str(&format!(r#""__metadata__":{{{}}}"#, pairs.join(",")));
        }
        json.push('}');
        let mut json = json.into_bytes();
        for (at, byte) in self.edits.iter().take(8) {
            if !json.is_empty() {
                let i = usize::from(*at) % json.len();
                json[i] = *byte;
            }
        }
        let declared = (json.len() as i64 + i64::from(self.len_delta))
            .max(0)
            .cast_unsigned();
        let mut file = declared.to_le_bytes().to_vec();
        file.extend_from_slice(&json);
        // The generator's own data stays small (the parser never reads it).
        let data = end.min(MAX_GENERATED_DATA) as usize + usize::from(self.extra_data % 4);
        file.resize(file.len() + data, 0);
        file
    }
}

/// Parses a safetensors file's header as `plan` does (length, then JSON);
/// an accepted header tiles the data exactly within the file.
fn check_safetensors(file: &[u8]) {
    let file_len = file.len() as u64;
    let Ok(n) = SourceHeader::header_len("fuzz.safetensors", file, file_len) else {
        return;
    };
    assert!(n <= MAX_HEADER_LEN && 8 + n <= file_len);
    let json = &file[8..8 + n as usize];
    let Ok(h) = SourceHeader::parse("fuzz.safetensors", json, file_len) else {
        return;
    };
    let data_start = 8 + n;
    let mut end = data_start;
    let mut spans: Vec<(u64, u64)> = h.tensors().iter().map(|t| (t.offset(), t.len())).collect();
    spans.sort_unstable();
    for (offset, len) in spans {
        assert_eq!(offset, end, "accepted header leaves a gap or an overlap");
        end = offset.checked_add(len).expect("span overflows");
    }
    assert_eq!(
        end, file_len,
        "accepted data does not end at the end of the file"
    );
    let mut names: Vec<&str> = h.tensors().iter().map(|t| t.name()).collect();
    names.sort_unstable();
    let before = names.len();
    names.dedup();
    assert_eq!(
        before,
        names.len(),
        "accepted header has a duplicate tensor name"
    );
}

/// `SourceHeader`, structure-aware: the first byte chooses raw bytes (0) or
/// a generated header with raw edits (else).
pub fn safetensors_header(data: &[u8]) {
    match data.split_first() {
        Some((0, raw)) => check_safetensors(raw),
        Some((_, rest)) => {
            if let Ok(h) = ArbHeader::arbitrary_take_rest(Unstructured::new(rest)) {
                check_safetensors(&h.file());
            }
        }
        None => check_safetensors(data),
    }
}

/// `model.safetensors.index.json`: every shard named is a validated
/// relative `.safetensors` path.
pub fn index_json(data: &[u8]) {
    let Ok(v) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    let Ok(map) = weight_map(&v) else { return };
    for f in shard_files(&map) {
        assert!(f.ends_with(".safetensors") && !f.starts_with('/'), "{f}");
        assert!(
            !f.split('/').any(|c| c.is_empty() || c == "." || c == ".."),
            "{f}"
        );
    }
}

/// A checkpoint's index map and its shards' headers with their lengths.
type CheckpointParts = (BTreeMap<String, String>, Vec<(SourceHeader, u64)>);

/// The shards of a small generated qwen4_exp checkpoint: the fuzzed config
/// is planned against real headers.
fn fixture_parts() -> &'static CheckpointParts {
    static PARTS: OnceLock<CheckpointParts> = OnceLock::new();
    PARTS.get_or_init(|| {
        use ftpipe_fixtures::checkpoint::content_bytes;
        let files = ftpipe_fixtures::qwen4::generate_qwen4_repo(
            1,
            ftpipe_fixtures::qwen4::QwenShape::default(),
        );
        let get = |p: &str| {
            content_bytes(files.iter().find(|f| f.path == p).expect("fixture file"))
                .expect("fixture bytes")
        };
        let index: Value =
            serde_json::from_slice(&get("model.safetensors.index.json")).expect("index");
        let map = weight_map(&index).expect("weight map");
        let headers = shard_files(&map)
            .into_iter()
            .map(|f| {
                let b = get(&f);
                let n = SourceHeader::header_len(&f, &b, b.len() as u64).expect("len");
                let h =
                    SourceHeader::parse(&f, &b[8..8 + n as usize], b.len() as u64).expect("header");
                (h, b.len() as u64)
            })
            .collect();
        (map, headers)
    })
}

/// `config.json` → profile → plan: an accepted config gives a plan whose
/// total is the sum of its components.
pub fn config_profile(data: &[u8]) {
    let Ok(config) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    let (map, headers) = fixture_parts();
    if let Ok(plan) = plan_from_parts(&config, map.clone(), headers, &PlanOptions::default()) {
        let sum: u64 = plan.components.iter().map(|c| c.predicted_bytes).sum();
        assert_eq!(sum, plan.total_bytes);
    }
}

/// The hub's JSON answers: the first byte chooses the revision answer (0)
/// or a tree page (else). An accepted page names only validated relative
/// paths with sizes within the limit.
pub fn hub_pages(data: &[u8]) {
    const URL: &str = "http://hub.invalid/api/models/a/b/tree/c";
    match data.split_first() {
        Some((0, body)) => {
            if let Ok(commit) = parse_revision(URL, body) {
                assert!(commit.len() == 40 && commit.bytes().all(|b| b.is_ascii_hexdigit()));
            }
        }
        Some((_, body)) => {
            if let Ok(rows) = parse_tree_page(URL, body) {
                for r in rows {
                    assert!(!r.path.is_empty() && !r.path.starts_with('/'), "{}", r.path);
                    assert!(
                        !r.path.split('/').any(|c| c == ".." || c == "."),
                        "{}",
                        r.path
                    );
                    assert!(r.size <= ftpipe_hub::limits::MAX_FILE_SIZE);
                }
            }
        }
        None => {}
    }
}

/// Response headers: lines `name: value`; every parser of a header the
/// hub sends. An accepted `Content-Range` is an ordered range inside its
/// total.
pub fn http_headers(data: &[u8]) {
    let mut headers = HeaderMap::new();
    for line in data.split(|b| *b == b'\n').take(16) {
        let Some(colon) = line.iter().position(|b| *b == b':') else {
            continue;
        };
        let (name, value) = (&line[..colon], line[colon + 1..].trim_ascii());
        if let (Ok(n), Ok(v)) = (HeaderName::from_bytes(name), HeaderValue::from_bytes(value)) {
            headers.append(n, v);
        }
    }
    for v in headers.values() {
        if let Some(cr) = v.to_str().ok().and_then(parse_content_range) {
            assert!(cr.first <= cr.last && cr.last < cr.total, "{cr:?}");
        }
    }
    let _ = strong_validator(&headers);
    let _ = etag(&headers);
    let _ = retry_after_secs(&headers);
    let _ = next_link(&headers);
    linked_meta(&headers);
}

/// The hub's file metadata: a pin built from the headers' own values is
/// never contradicted, and one differing in each field is, by that
/// field's header.
fn linked_meta(headers: &HeaderMap) {
    let mut meta = LinkedMeta::default();
    meta.gather(headers);
    let size = meta
        .linked_size
        .as_deref()
        .and_then(|s| s.trim().parse::<u64>().ok());
    let commit = meta.repo_commit.clone().unwrap_or_default();
    let sha = meta.linked_etag.as_deref().map(|e| {
        e.strip_prefix("W/")
            .unwrap_or(e)
            .trim_matches('"')
            .to_owned()
    });
    if meta.linked_size.is_none() || size.is_some() {
        let agreed = check_linked_meta(&meta, &commit, size.unwrap_or(0), sha.as_deref());
        assert!(agreed.is_ok(), "{meta:?} contradicts itself: {agreed:?}");
    }
    if let Some(s) = size {
        let other = s.wrapping_add(1);
        let c = check_linked_meta(&meta, &commit, other, sha.as_deref()).expect_err("size");
        assert_eq!(c.header, "X-Linked-Size");
    }
    if meta.repo_commit.is_some() {
        let c = check_linked_meta(&meta, &format!("{commit}x"), size.unwrap_or(0), None)
            .expect_err("commit");
        assert_eq!(c.header, "X-Repo-Commit");
    }
}

/// TOML recipes: parsing is deterministic (same digest twice).
pub fn recipe_toml(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(r) = Recipe::from_toml("fuzz.toml", text) {
        let again = Recipe::from_toml("fuzz.toml", text).expect("accepted once, accepted twice");
        assert_eq!(r.digest(), again.digest());
    }
}

/// `manifest.json`, a NUL byte, `placement.json`: an accepted manifest
/// serializes back to bytes that parse to the same manifest, and the
/// placement check never panics.
pub fn manifest_placement(data: &[u8]) {
    let (m, p) = match data.iter().position(|b| *b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[][..]),
    };
    let Ok(manifest) = serde_json::from_slice::<Manifest>(m) else {
        return;
    };
    let bytes = manifest.to_bytes().expect("a parsed manifest serializes");
    let again: Manifest = serde_json::from_slice(&bytes).expect("a written manifest parses");
    assert_eq!(
        again.to_bytes().expect("a reparsed manifest serializes"),
        bytes,
        "manifest round trip changed bytes"
    );
    manifest
        .compute_fingerprint()
        .expect("a parsed manifest's fingerprint input serializes");
    if let Ok(placement) = serde_json::from_slice::<Placement>(p) {
        let _ = placement.check(&manifest);
    }
}

/// FTW reader: an accepted file is self-consistent.
pub fn ftw_reader(data: &[u8]) {
    if let Ok(v) = FtwView::new(data) {
        for t in v.tensors() {
            assert_eq!(t.data.len() as u64, t.entry.len());
        }
    }
    if let Ok(h) = FtwHeader::read_from(data) {
        let _ = h.check_file_len(data.len() as u64);
    }
}

/// FTEXPERT1 reader: every field of an accepted sidecar has its length.
pub fn ftexpert_reader(data: &[u8]) {
    if let Ok(v) = ExpertView::new(data) {
        for e in 0..v.layout().expert_count() {
            let r = v.expert(e).expect("an accepted sidecar has every expert");
            for (f, b) in r.fields() {
                assert_eq!(b.len() as u64, f.len());
            }
        }
    }
    let _ = ExpertLayout::read_from(data);
}

/// Q3 segment set: 3 geometry bytes, then an FTW file holding segments,
/// also read as a listing of `(name, len)` pairs.
pub fn q3_segment_set(data: &[u8]) {
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
            let len = c
                .get(2..6)
                .and_then(|l| <[u8; 4]>::try_from(l).ok())
                .map_or(0, |l| u64::from(u32::from_le_bytes(l)) % 2048);
            (name, len)
        })
        .collect();
    let _ = Q3SegmentSet::validate(&geo, list, rest.get(..2));
}

/// One tensor descriptor of [`ftw_round_trip`].
#[derive(Debug, Arbitrary)]
struct ArbDesc {
    dtype: u8,
    shape: Vec<u8>,
    fill: u8,
}

/// FTW v1 writer → reader: what is written reads back exactly.
pub fn ftw_round_trip(data: &[u8]) {
    const PLAIN: &[Dtype] = &[Dtype::BF16, Dtype::F16, Dtype::F32, Dtype::U8, Dtype::I64];
    let Ok(descs) = Vec::<ArbDesc>::arbitrary_take_rest(Unstructured::new(data)) else {
        return;
    };
    let descs: Vec<(TensorDesc, u8)> = descs
        .into_iter()
        .take(8)
        .enumerate()
        .map(|(i, d)| {
            let dtype = PLAIN[usize::from(d.dtype) % PLAIN.len()];
            let shape: Vec<u64> = d.shape.iter().take(4).map(|x| u64::from(*x % 6)).collect();
            (
                TensorDesc::new(format!("t{i}"), dtype, TensorKind::Plain, shape),
                d.fill,
            )
        })
        .collect();
    let Ok(layout) = FtwLayout::plan(descs.iter().map(|(d, _)| d.clone()).collect()) else {
        return;
    };
    let mut w = FtwWriter::new(&layout, Vec::new()).expect("writer");
    let mut datas = Vec::new();
    for (e, (_, fill)) in layout.entries().iter().zip(&descs) {
        let d = vec![*fill; usize::try_from(e.len()).expect("small")];
        w.begin_tensor(e.key()).expect("begin");
        w.write(&d).expect("write");
        w.end_tensor().expect("end");
        datas.push(d);
    }
    let bytes = w.finish().expect("finish");
    let view = FtwView::new(&bytes).expect("a written FTW file reads back");
    assert_eq!(view.header().entries(), layout.entries());
    for (t, d) in view.tensors().zip(&datas) {
        assert_eq!(t.data, d.as_slice());
    }
}

/// One field of [`ftexpert_round_trip`].
#[derive(Debug, Arbitrary)]
struct ArbField {
    dtype: u8,
    shape: Vec<u8>,
}

/// FTEXPERT1 writer → reader: every expert's every field reads back with
/// the bytes written, under the planned layout.
pub fn ftexpert_round_trip(data: &[u8]) {
    const PLAIN: &[Dtype] = &[Dtype::BF16, Dtype::F16, Dtype::F32, Dtype::U8, Dtype::I64];
    let mut u = Unstructured::new(data);
    let (Ok(layer), Ok(experts), Ok(fields)) = (
        u.arbitrary::<u8>(),
        u.int_in_range::<u32>(0..=9),
        Vec::<ArbField>::arbitrary_take_rest(u),
    ) else {
        return;
    };
    let fields: Vec<TensorDesc> = fields
        .into_iter()
        .take(6)
        .enumerate()
        .map(|(i, f)| {
            let dtype = PLAIN[usize::from(f.dtype) % PLAIN.len()];
            let shape: Vec<u64> = f.shape.iter().take(4).map(|x| u64::from(*x % 7)).collect();
            TensorDesc::new(format!("f{i}"), dtype, TensorKind::Plain, shape)
        })
        .collect();
    let Ok(layout) = ExpertLayout::plan(u32::from(layer), experts, fields) else {
        return;
    };
    let fill = |e: u32, f: usize, len: u64| -> Vec<u8> {
        (0..len)
            .map(|i| (u64::from(e) * 31 + f as u64 * 7 + i) as u8)
            .collect()
    };
    let mut w = ExpertWriter::new(&layout, Vec::new()).expect("writer");
    for e in 0..experts {
        for (f, entry) in layout.fields().iter().enumerate() {
            w.write_field(e, entry.key(), &fill(e, f, entry.len()))
                .expect("write");
        }
    }
    let bytes = w.finish().expect("finish");
    assert_eq!(bytes.len() as u64, layout.total_len());
    let view = ExpertView::new(&bytes).expect("a written sidecar reads back");
    let read = view.layout();
    assert_eq!(
        (read.layer(), read.expert_count(), read.fields()),
        (layout.layer(), layout.expert_count(), layout.fields())
    );
    assert_eq!(
        ExpertLayout::read_from(bytes.as_slice())
            .expect("header")
            .fields(),
        layout.fields()
    );
    for e in 0..experts {
        let r = view.expert(e).expect("every expert");
        for (f, (entry, b)) in r.fields().enumerate() {
            assert_eq!(
                b,
                fill(e, f, entry.len()).as_slice(),
                "expert {e} field {f}"
            );
        }
    }
    assert!(view.expert(experts).is_err(), "an expert past the count");
}

/// Most elements a [`codec_round_trip`] input encodes.
const MAX_CODEC_ELEMENTS: usize = 4096;

/// The encoders, against their references and decoders: the first byte
/// picks Q3_PLE_32 (with a global scale from the data, or a fuzzed one
/// that may be too small), NVFP4, or E4M3; the rest is the values (BF16,
/// or F32 for E4M3). The fast encoder's bytes and errors equal the
/// reference's; accepted output decodes within the documented bound.
pub fn codec_round_trip(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let values: Vec<bf16> = rest
        .chunks_exact(2)
        .take(MAX_CODEC_ELEMENTS)
        .map(|b| bf16::from_bits(u16::from_le_bytes([b[0], b[1]])))
        .collect();
    match mode % 4 {
        0 => q3_round_trip(&values, None),
        1 => {
            let g = values.first().map(|v| v.to_bits()).unwrap_or(0);
            q3_round_trip(values.get(1..).unwrap_or(&[]), Some(g));
        }
        2 => nvfp4_round_trip(&values),
        _ => {
            for c in rest.chunks_exact(4).take(256) {
                let x = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                let code = e4m3::encode(x);
                assert_eq!(code, e4m3::encode_ref(x), "e4m3 of {x:e}");
                let back = e4m3::decode(code);
                if x.is_finite() && x.abs() <= e4m3::E4M3_MAX {
                    // Nearest: no other finite code is closer.
                    let err = (f64::from(x) - f64::from(back)).abs();
                    for other in (0u8..=0x7E).chain(0x80..=0xFE) {
                        let o = (f64::from(x) - f64::from(e4m3::decode(other))).abs();
                        assert!(err <= o, "e4m3 {x:e}: {code:#x} but {other:#x} is closer");
                    }
                }
            }
        }
    }
}

fn q3_round_trip(values: &[bf16], global_bits: Option<u16>) {
    const WIDTH: usize = 32;
    let x = &values[..values.len() - values.len() % WIDTH];
    let g = match global_bits {
        None => {
            let Ok(amax) = q3::table_absmax("fuzz", x, 0) else {
                assert!(x.iter().any(|v| !v.to_f32().is_finite()));
                return;
            };
            Q3GlobalScale::from_absmax(amax).expect("a finite table has a global scale")
        }
        Some(bits) => match Q3GlobalScale::from_bits(bits) {
            Ok(g) => g,
            Err(_) => return,
        },
    };
    let blocks = x.len() / q3::Q3_BLOCK;
    let mut fast = vec![0u8; blocks * q3::Q3_BLOCK_BYTES];
    let mut reference = fast.clone();
    let fast_result = q3::encode("fuzz", x, WIDTH, g, 0, &mut fast);
    let ref_result = q3::encode_ref("fuzz", x, WIDTH, g, 0, &mut reference);
    assert_eq!(
        fast_result.as_ref().map_err(ToString::to_string),
        ref_result.as_ref().map_err(ToString::to_string),
        "Q3 fast and reference encoders disagree"
    );
    let f32s: Vec<f32> = x.iter().map(|v| v.to_f32()).collect();
    let mut from_f32 = vec![0u8; fast.len()];
    let f32_result = q3::encode_f32("fuzz", &f32s, WIDTH, g, 0, &mut from_f32);
    assert_eq!(
        f32_result.as_ref().map_err(ToString::to_string),
        ref_result.as_ref().map_err(ToString::to_string),
        "Q3 f32 and reference encoders disagree"
    );
    if ref_result.is_err() {
        return;
    }
    assert_eq!(fast, reference, "Q3 fast encoder bytes differ");
    assert_eq!(from_f32, reference, "Q3 f32 encoder bytes differ");
    let mut decoded = vec![0f32; x.len()];
    q3::decode(&fast, g, &mut decoded).expect("decode");
    for (b, (xs, ds)) in f32s
        .chunks(q3::Q3_BLOCK)
        .zip(decoded.chunks(q3::Q3_BLOCK))
        .enumerate()
    {
        let at = b * q3::Q3_BLOCK_BYTES;
        let bound = q3::error_bound(u16::from_le_bytes([fast[at], fast[at + 1]]), g);
        for (i, (a, d)) in xs.iter().zip(ds).enumerate() {
            assert!(
                (a - d).abs() <= bound,
                "Q3 block {b} element {i}: {a:e} → {d:e}, bound {bound:e}"
            );
        }
    }
}

fn nvfp4_round_trip(values: &[bf16]) {
    let x = &values[..values.len() - values.len() % nvfp4::NVFP4_BLOCK];
    let len = usize::try_from(nvfp4::nvfp4_len(x.len() as u64).expect("small")).expect("small");
    let (mut fast, mut reference) = (vec![0u8; len], vec![0u8; len]);
    let fast_result = nvfp4::encode("fuzz", x, &mut fast);
    let ref_result = nvfp4::encode_ref("fuzz", x, &mut reference);
    assert_eq!(
        fast_result.as_ref().map_err(ToString::to_string),
        ref_result.as_ref().map_err(ToString::to_string),
        "NVFP4 fast and reference encoders disagree"
    );
    if ref_result.is_err() {
        assert!(x.iter().any(|v| !v.to_f32().is_finite()));
        return;
    }
    assert_eq!(fast, reference, "NVFP4 fast encoder bytes differ");
    let mut decoded = vec![0f32; x.len()];
    nvfp4::decode(&fast, &mut decoded).expect("decode");
    let n = x.len();
    let scales = &fast[n / 2..n / 2 + n / nvfp4::NVFP4_BLOCK];
    let s2 = f32::from_le_bytes(fast[len - 4..].try_into().expect("4 bytes"));
    for (b, (xs, ds)) in x
        .chunks(nvfp4::NVFP4_BLOCK)
        .zip(decoded.chunks(nvfp4::NVFP4_BLOCK))
        .enumerate()
    {
        let bound = nvfp4::error_bound(scales[b], s2);
        for (i, (a, d)) in xs.iter().zip(ds).enumerate() {
            let a = a.to_f32();
            assert!(
                (a - d).abs() <= bound,
                "NVFP4 block {b} element {i}: {a:e} → {d:e}, bound {bound:e}"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every committed corpus file, through the entry of its target: the
    /// stable-toolchain half of the fuzzing (CI runs it).
    #[test]
    fn committed_corpora_replay_without_failure() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus");
        let mut replayed = 0;
        for t in TARGETS {
            let dir = root.join(t.name);
            let entries = std::fs::read_dir(&dir)
                .unwrap_or_else(|e| panic!("corpus {} missing: {e}", dir.display()));
            for entry in entries {
                let path = entry.unwrap().path();
                let bytes = std::fs::read(&path).unwrap();
                let outcome = std::panic::catch_unwind(|| (t.run)(&bytes));
                assert!(outcome.is_ok(), "{}: {} fails", t.name, path.display());
                replayed += 1;
            }
        }
        assert!(replayed >= TARGETS.len(), "only {replayed} corpus files");
    }

    /// Regenerates the seed files of the stage-parser corpora:
    /// `cargo test -p ftpipe-fuzzing -- --ignored write_seed_corpus`.
    /// (`manifest_placement` seeds come from a real artifact, the
    /// `recipe_toml` seed is the recipe of `tests/e2e/recipe.rs`: see
    /// docs/fuzzing.md.)
    #[test]
    #[ignore]
    fn write_seed_corpus() {
        use ftpipe_fixtures::checkpoint::content_bytes;
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus");
        let put = |target: &str, name: &str, bytes: &[u8]| {
            let dir = root.join(target);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join(name), bytes).unwrap();
        };
        let files = ftpipe_fixtures::qwen4::generate_qwen4_repo(
            1,
            ftpipe_fixtures::qwen4::QwenShape::default(),
        );
        let get = |p: &str| content_bytes(files.iter().find(|f| f.path == p).unwrap()).unwrap();
        put("config_profile", "qwen4_exp", &get("config.json"));
        put(
            "index_json",
            "qwen4_exp",
            &get("model.safetensors.index.json"),
        );
        // A small valid safetensors file (raw mode) and a header prefix.
        let json = br#"{"a":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]},"__metadata__":{"format":"pt"}}"#;
        let mut raw = vec![0u8];
        raw.extend_from_slice(&(json.len() as u64).to_le_bytes());
        raw.extend_from_slice(json);
        raw.extend_from_slice(&[1; 12]);
        put("safetensors_header", "raw_two_tensors", &raw);
        put(
            "safetensors_header",
            "structured",
            &[1, 3, 0, 6, 2, 2, 2, 0, 1, 9, 1, 7, 0, 0],
        );
        put(
            "http_headers",
            "partial",
            b"content-range: bytes 0-99/1000\netag: \"abc\"\nretry-after: 5\nlink: <https://hub/api?cursor=x>; rel=\"next\"\n",
        );
        put(
            "hub_pages",
            "revision",
            b"\0{\"sha\":\"8c0646b6f1259abe3010739c82ef9f722c0ad08e\",\"id\":\"acme/x\"}",
        );
        put(
            "hub_pages",
            "tree",
            &[&[1u8][..], br#"[{"type":"directory","path":"d","oid":"0000000000000000000000000000000000000000","size":0},{"type":"file","path":"d/config.json","oid":"8c0646b6f1259abe3010739c82ef9f722c0ad08e","size":12},{"type":"file","path":"m.safetensors","oid":"8c0646b6f1259abe3010739c82ef9f722c0ad08e","size":100,"lfs":{"oid":"0a0b0c0d0e0f101112131415161718191a1b1c1d1e1f202122232425262728292a","size":100}}]"#].concat(),
        );
        put(
            "http_headers",
            "weak",
            b"etag: W/\"abc\"\ncontent-range: bytes */1000\n",
        );
        put(
            "ftw_round_trip",
            "three",
            &[6, 2, 3, 4, 7, 0, 1, 5, 9, 4, 1, 1, 1, 3],
        );
        put(
            "ftexpert_round_trip",
            "three_fields",
            &[1, 4, 1, 1, 2, 3, 4, 1, 6, 1, 5, 0, 1, 2],
        );
        // Codec inputs: mode byte, then 64 (or 65) BF16 values of a ramp
        // with both signs, and 16 F32 values around E4M3's range.
        let ramp: Vec<u8> = (0..64i32)
            .flat_map(|i| {
                bf16::from_f32((i - 30) as f32 * 0.37)
                    .to_bits()
                    .to_le_bytes()
            })
            .collect();
        put("codec_round_trip", "q3_ramp", &[&[0u8][..], &ramp].concat());
        let small_g = bf16::from_f32(2.0).to_bits().to_le_bytes();
        put(
            "codec_round_trip",
            "q3_scale_too_small",
            &[&[1u8][..], &small_g, &ramp].concat(),
        );
        put(
            "codec_round_trip",
            "nvfp4_ramp",
            &[&[2u8][..], &ramp].concat(),
        );
        let floats: Vec<u8> = [
            0.0f32,
            -0.0,
            1e-3,
            2e-3,
            0.5,
            1.0625,
            17.0,
            240.0,
            448.0,
            464.0,
            1e9,
            -3.3,
            f32::NAN,
            f32::INFINITY,
            1e-40,
            -448.0,
        ]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
        put(
            "codec_round_trip",
            "e4m3_values",
            &[&[3u8][..], &floats].concat(),
        );
    }

    /// The first `index_json` campaign stopped on
    /// `fuzz/corpus/index_json/dotted_shard_name`: a shard named
    /// `mode....l-00001-of-00003.safetensors`. Not a parser bug: the
    /// property rejected any `..` substring, but a run of dots inside a name
    /// is a valid file name; only a `..` (or `.`, or empty) path component
    /// escapes. The property now checks components, as `validate_repo_path`
    /// does.
    #[test]
    fn a_run_of_dots_inside_a_shard_name_is_a_valid_name() {
        let index = br#"{"weight_map":{"w":"mode....l-00001-of-00003.safetensors"}}"#;
        index_json(index);
        let escape = br#"{"weight_map":{"w":"../x.safetensors"}}"#;
        let v: Value = serde_json::from_slice(escape).unwrap();
        assert!(weight_map(&v).is_err(), "a `..` component is refused");
    }

    #[test]
    fn every_target_has_a_cargo_fuzz_binary() {
        let manifest = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/Cargo.toml"),
        )
        .unwrap();
        for t in TARGETS {
            assert!(
                manifest.contains(&format!("name = \"{}\"", t.name)),
                "fuzz/Cargo.toml lacks the target {}",
                t.name
            );
        }
    }
}
