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
//! | [`http_headers`] | `Content-Range`, `ETag`, `Retry-After`, `Link` |
//! | [`recipe_toml`] | TOML recipes |
//! | [`manifest_placement`] | `manifest.json` + `placement.json` (with a round trip) |
//! | [`ftw_reader`], [`ftexpert_reader`], [`q3_segment_set`] | the artifact readers |
//! | [`ftw_round_trip`] | FTW v1 writer → reader |

use std::collections::BTreeMap;
use std::sync::OnceLock;

use arbitrary::{Arbitrary, Unstructured};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde_json::Value;

use ftpipe_formats::{
    Dtype, ExpertLayout, ExpertView, FtwHeader, FtwLayout, FtwView, FtwWriter, Q3Geometry,
    Q3SegmentSet, TensorDesc, TensorKind,
};
use ftpipe_stages::convert::manifest::{Manifest, Placement};
use ftpipe_stages::convert::plan::{plan_from_parts, shard_files, weight_map};
use ftpipe_stages::convert::recipe::Recipe;
use ftpipe_stages::convert::{MAX_HEADER_LEN, PlanOptions, SourceHeader};
use ftpipe_stages::fetch::{etag, parse_content_range, retry_after_secs, strong_validator};
use ftpipe_stages::hub::next_link;
use ftpipe_stages::resolve::{parse_revision, parse_tree_page};

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
        let declared = (json.len() as i64 + i64::from(self.len_delta)).max(0) as u64;
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
                    assert!(r.size <= ftpipe_stages::limits::MAX_FILE_SIZE);
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
    let bytes = manifest.to_bytes();
    let again: Manifest = serde_json::from_slice(&bytes).expect("a written manifest parses");
    assert_eq!(again.to_bytes(), bytes, "manifest round trip changed bytes");
    let _ = manifest.compute_fingerprint();
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
    /// `recipe_toml` seed is the recipe of `tests/recipe.rs`: see
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
