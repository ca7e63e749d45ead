//! Planning: every output component with its exact predicted size, before
//! anything is written, from `config.json`, `model.safetensors.index.json`
//! and the safetensors headers of the shards the index lists.
//!
//! [`plan`] is the one entry: from `DIR/source/` ([`HeaderSource::Local`])
//! it reads the headers there (or saved ones of retired shards); from a
//! remote ([`HeaderSource::Remote`]) it reads only the first 8 + N bytes of each shard over HTTP Range (two
//! requests per shard: `bytes=0-7`, then `bytes=8-(8+N-1)`, each answer
//! a `206` whose `Content-Range` is exactly what was asked) and downloads
//! no weights. Both feed the same [`plan_from_parts`], so they agree.
//! `config.json` is read once per plan and handed back with it ([`Planned`]).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use futures_util::StreamExt;
use rayon::prelude::*;
use serde::Serialize;
use serde_json::Value;

use ftpipe_receipts::{FileRow, Receipt};
use tokio::task::block_in_place;

use crate::error::{ConvertError, Result};
use crate::profile::{CONFIG_FILE, Component, OmittedTensor, Profile, model_type};
use crate::recipe::{MAX_RECIPE_BYTES, Recipe, RecipeError};
use crate::safetensors::{SourceError, SourceHeader};
use ftpipe_artifact::manifest::Partition;
use ftpipe_fs::paths::{safe_join, validate_repo_path};
use ftpipe_hub::limits::MAX_JSON_BYTES;
use ftpipe_hub::remote::RemoteFiles;
use ftpipe_hub::resolve::FetchSelection;

/// The safetensors index every plan starts from.
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// One source shard as planned.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PlannedSource {
    /// Repo-relative path.
    pub file: String,
    /// File size.
    pub bytes: u64,
    /// N, the header JSON length.
    pub header_bytes: u64,
    /// Tensors in it.
    pub tensors: u64,
}

/// Every output component with its exact size, and the known target total.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Plan {
    /// `model_type` from config.json.
    pub model_type: String,
    /// The profile chosen for it.
    pub profile: String,
    /// The shards read, in path order.
    pub sources: Vec<PlannedSource>,
    /// Sum of the shard sizes.
    pub source_bytes: u64,
    /// Output components: FTW first, then experts by layer, then PLE.
    pub components: Vec<Component>,
    /// Sum of the predicted component sizes: the known target total.
    pub total_bytes: u64,
    /// Source tensors of other partitions (vision, MTP) left out of the
    /// artifact: fetched and verified as part of the pinned sources unless
    /// their file was left out of the fetch (`fetched: false`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub omitted: Vec<OmittedTensor>,
    /// Shards the index names that the fetch selection left out; every
    /// tensor in them is an omitted, not-fetched one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub excluded_sources: Vec<ExcludedSource>,
}

/// A shard of the index left out of the fetch (`--exclude`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ExcludedSource {
    /// Repo-relative path.
    pub file: String,
    /// Its size in the pinned listing (header included: it was never read).
    pub bytes: u64,
    /// Tensors the index places in it.
    pub tensors: u64,
    /// What left it out (`--exclude "GLOB"`).
    pub by: String,
}

impl Plan {
    /// Count and source bytes of the omitted tensors that were fetched.
    pub fn omitted_totals(&self) -> (usize, u64) {
        let fetched = self.omitted.iter().filter(|o| o.fetched);
        (fetched.clone().count(), fetched.map(|o| o.bytes).sum())
    }

    /// Count of the omitted tensors left out of the fetch, and the bytes
    /// of the files holding them (their sizes in the listing).
    pub fn not_fetched_totals(&self) -> (usize, u64) {
        (
            self.omitted.iter().filter(|o| !o.fetched).count(),
            self.excluded_sources.iter().map(|s| s.bytes).sum(),
        )
    }
}

/// The files every conversion reads besides the shards: the built-in
/// profiles and recipes alike read `config.json` and the index, and nothing
/// else (the shards they need are checked against the selection by
/// [`take_unfetched`], naming the tensors).
pub const CONVERSION_FILES: [&str; 2] = [CONFIG_FILE, INDEX_FILE];

/// Refuses a fetch selection that leaves out a file the conversion reads
/// ([`CONVERSION_FILES`]): found before any shard is requested, instead of
/// after every shard was fetched and conversion found the file missing.
pub fn needed_files_selected(selection: &FetchSelection) -> Result<(), ConvertError> {
    for file in CONVERSION_FILES {
        if let Some(why) = selection.excluded(file) {
            return Err(ConvertError::NeededFileExcluded {
                file: file.to_owned(),
                by: why.by.clone(),
            });
        }
    }
    Ok(())
}

/// Tensors named in the error about a needed tensor in an excluded file.
const EXCLUDED_EXAMPLES: usize = 3;

/// Moves the index entries whose file the fetch selection left out of
/// `map`: they become not-fetched omitted tensors when `profile` leaves
/// their partition out of the artifact. Any other tensor in a left-out
/// file (text, or of no known partition) is an error naming the file, its
/// glob, and the tensors.
fn take_unfetched(
    map: &mut BTreeMap<String, String>,
    selection: &FetchSelection,
    profile: &Profile,
) -> Result<(Vec<OmittedTensor>, Vec<ExcludedSource>), ConvertError> {
    if selection.is_empty() {
        return Ok((Vec::new(), Vec::new()));
    }
    let mut by_file: BTreeMap<String, Vec<String>> = BTreeMap::new();
    map.retain(|tensor, file| {
        if selection.excluded(file).is_none() {
            return true;
        }
        by_file
            .entry(file.clone())
            .or_default()
            .push(tensor.clone());
        false
    });
    let mut omitted = Vec::new();
    let mut sources = Vec::new();
    let mut problems = Vec::new();
    for (file, tensors) in by_file {
        let Some(why) = selection.excluded(&file) else {
            continue;
        };
        let mut needed = Vec::new();
        for t in &tensors {
            match profile.partition(t) {
                Some(p) if p != Partition::Text => omitted.push(OmittedTensor {
                    tensor: t.clone(),
                    file: file.clone(),
                    reason: p,
                    bytes: 0,
                    fetched: false,
                }),
                Some(_) => needed.push(format!("{t} (text)")),
                None => needed.push(format!("{t} (no known partition)")),
            }
        }
        if !needed.is_empty() {
            let more = needed.len().saturating_sub(EXCLUDED_EXAMPLES);
            let mut shown = needed[..needed.len().min(EXCLUDED_EXAMPLES)].join(", ");
            if more > 0 {
                shown.push_str(&format!(" and {more} more"));
            }
            problems.push(format!(
                "  {file}, left out by {}: {} tensor(s) the artifact needs: {shown}",
                why.by,
                needed.len()
            ));
        }
        sources.push(ExcludedSource {
            file,
            bytes: why.size,
            tensors: tensors.len() as u64,
            by: why.by.clone(),
        });
    }
    if !problems.is_empty() {
        return Err(ConvertError::ExcludedSourceNeeded {
            profile: profile.name().to_owned(),
            count: problems.len(),
            problems: problems.join("\n"),
        });
    }
    Ok((omitted, sources))
}

/// Walks `bytes` of `file` once: refuses a key repeated in any object and
/// a credential of this process in any string, however it is escaped.
fn refuse_repeats_and_credentials(file: &str, bytes: &[u8]) -> Result<(), ConvertError> {
    let found =
        ftpipe_hub::json_keys::scan(bytes).map_err(|source| ConvertError::MalformedJson {
            file: file.to_owned(),
            source,
        })?;
    if found.holds_secret {
        return Err(ConvertError::HoldsCredential {
            file: file.to_owned(),
        });
    }
    if !found.duplicates.is_empty() {
        return Err(ConvertError::DuplicateJsonKeys {
            file: file.to_owned(),
            keys: ftpipe_hub::json_keys::describe(&found.duplicates),
        });
    }
    Ok(())
}

/// Parses `bytes` of `file`, refusing a key repeated in any object.
fn parse_json(file: &str, bytes: &[u8]) -> Result<Value, ConvertError> {
    let malformed = |source: serde_json::Error| ConvertError::MalformedJson {
        file: file.to_owned(),
        source,
    };
    let value = serde_json::from_slice(bytes).map_err(malformed)?;
    refuse_repeats_and_credentials(file, bytes)?;
    Ok(value)
}

/// The index's `weight_map` (tensor → file), with every file path checked.
pub fn weight_map(index: &Value) -> Result<BTreeMap<String, String>, ConvertError> {
    // Deserialized from the borrowed value: a clone of a ~300k-entry map
    // would double the index's footprint.
    let v = index
        .get("weight_map")
        .ok_or_else(|| bad_weight_map("is missing".into()))?;
    let map = <BTreeMap<String, String> as serde::Deserialize>::deserialize(v)
        .map_err(|e| bad_weight_map(format!("is not a map of strings: {e}")))?;
    check_shard_paths(&map)?;
    Ok(map)
}

fn bad_weight_map(problem: String) -> ConvertError {
    ConvertError::BadConfig {
        file: INDEX_FILE.into(),
        field: "weight_map".into(),
        problem,
    }
}

/// Every file `map` names is a safe relative `.safetensors` path.
fn check_shard_paths(map: &BTreeMap<String, String>) -> Result<(), ConvertError> {
    for file in map.values().collect::<BTreeSet<_>>() {
        validate_repo_path(file)
            .map_err(|e| bad_weight_map(format!("names an unsafe file: {e}")))?;
        if !file.ends_with(".safetensors") {
            return Err(bad_weight_map(format!(
                "names {file:?}, not a .safetensors file"
            )));
        }
    }
    Ok(())
}

/// [`weight_map`] of the index's bytes, with the checks of [`parse_json`],
/// built without the JSON tree: for ~300k tensors the tree alone is ~60 MB
/// beside the map (the walk's key sets borrow their names from `bytes`).
/// The walk for repeated keys and credentials and the typed parse run side
/// by side (the plan waits for both before its first transfer); the walk's
/// verdict comes first.
pub fn index_weight_map(bytes: &[u8]) -> Result<BTreeMap<String, String>, ConvertError> {
    #[derive(serde::Deserialize)]
    struct Index {
        weight_map: Option<Entries>,
    }
    let (walked, typed) = rayon::join(
        || refuse_repeats_and_credentials(INDEX_FILE, bytes),
        || serde_json::from_slice::<Index>(bytes),
    );
    walked?;
    match typed {
        Ok(Index {
            weight_map: Some(Entries(entries)),
        }) => {
            // The walk refused repeated names, so no entry is lost; built
            // at once from the sorted entries (an index lists its names in
            // order), not by a search from the root per name.
            let map = BTreeMap::from_iter(entries);
            check_shard_paths(&map)?;
            Ok(map)
        }
        // Not the expected shape: the general path names what is wrong.
        _ => weight_map(&parse_json(INDEX_FILE, bytes)?),
    }
}

/// A JSON object of strings as its entries in document order.
struct Entries(Vec<(String, String)>);

impl<'de> serde::Deserialize<'de> for Entries {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Entries;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a map of strings")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<Entries, A::Error> {
                let mut out = Vec::with_capacity(map.size_hint().unwrap_or(0));
                while let Some(entry) = map.next_entry()? {
                    out.push(entry);
                }
                Ok(Entries(out))
            }
        }
        d.deserialize_map(Visit)
    }
}

/// The shard files the index lists, sorted.
pub fn shard_files(map: &BTreeMap<String, String>) -> Vec<String> {
    map.values()
        .map(String::as_str)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .map(str::to_owned)
        .collect()
}

/// The shard files the index lists that `selection` keeps, sorted: the
/// ones whose headers a plan reads.
pub fn fetched_shards(map: &BTreeMap<String, String>, selection: &FetchSelection) -> Vec<String> {
    let mut files = shard_files(map);
    files.retain(|f| selection.excluded(f).is_none());
    files
}

/// Converter options that change the plan.
#[derive(Debug, Clone, Default)]
pub struct PlanOptions {
    /// Extra globs of tensors kept BF16 and marked protected (`--protect`),
    /// beside those `quantization_config.ignore` names (built-in profiles
    /// only); config.json is not changed.
    pub protect: Vec<String>,
    /// A declarative recipe instead of a built-in profile (`--recipe`).
    pub recipe: Option<Recipe>,
    /// The shards left out of the fetch: not read, their tensors omitted
    /// when their partition may be (vision, MTP), else an error.
    pub selection: FetchSelection,
}

impl PlanOptions {
    /// The profile these options choose for `config`.
    pub fn profile(&self, config: &Value) -> Result<Profile, ConvertError> {
        Profile::with_options(config, self.recipe.as_ref(), &self.protect)
    }
}

/// Reads a TOML recipe through the bounded reader: a regular file (a link
/// is followed) of at most [`MAX_RECIPE_BYTES`], refused without blocking
/// when it is a FIFO or a device (`/dev/zero` has `st_size` 0 and no end).
pub fn load_recipe(path: &Path) -> Result<Recipe> {
    let label = path.display().to_string();
    let bytes = ftpipe_fs::bounded::read_bounded(path, MAX_RECIPE_BYTES as u64)?;
    let text = String::from_utf8(bytes).map_err(|e| RecipeError::Syntax {
        file: label.clone(),
        message: format!("not UTF-8 text: {e}"),
    })?;
    Ok(Recipe::from_toml(&label, &text)?)
}

/// Checks index ↔ headers agreement, chooses the profile and predicts every
/// component. `headers` are those of [`shard_files`] that the fetch
/// selection of `opts` keeps ([`fetched_shards`]), with their file sizes.
pub fn plan_from_parts(
    config: &Value,
    mut map: BTreeMap<String, String>,
    headers: &[(SourceHeader, u64)],
    opts: &PlanOptions,
) -> Result<Plan, ConvertError> {
    let profile = opts.profile(config)?;
    let (unfetched, excluded_sources) = take_unfetched(&mut map, &opts.selection, &profile)?;
    // The index is checked against the headers while the profile maps the
    // headers (it needs only them); a problem with the index comes first.
    let (index_checked, mapped) = rayon::join(
        || index_agrees_with_headers(map, headers),
        || profile.map(headers.iter().map(|(h, _)| h)),
    );
    index_checked?;
    let (components, mut omitted) = mapped?;
    omitted.extend(unfetched);
    let total_bytes = components.iter().map(|c| c.predicted_bytes).sum();
    let sources: Vec<PlannedSource> = headers
        .iter()
        .map(|(h, len)| PlannedSource {
            file: h.file().to_owned(),
            bytes: *len,
            header_bytes: h.json_len(),
            tensors: h.tensors().len() as u64,
        })
        .collect();
    Ok(Plan {
        model_type: model_type(config)?.to_owned(),
        profile: profile.name().to_owned(),
        source_bytes: sources.iter().map(|s| s.bytes).sum(),
        sources,
        components,
        total_bytes,
        omitted,
        excluded_sources,
    })
}

/// Every header's tensors where the index `map` places them, the headers
/// checked in parallel; the first problem in header order, as one at a
/// time would find it. Takes the map: it is dropped here, beside the
/// mapping.
fn index_agrees_with_headers(
    map: BTreeMap<String, String>,
    headers: &[(SourceHeader, u64)],
) -> Result<(), ConvertError> {
    let misplaced: Vec<_> = headers
        .par_iter()
        .map(|(h, _)| index_places_where_found(&map, h))
        .collect();
    misplaced
        .into_iter()
        .collect::<Result<(), ConvertError>>()?;
    // The names are unique in the index and each header tensor is at its
    // own entry, so as many tensors as entries leaves none unfound.
    let in_headers: usize = headers.iter().map(|(h, _)| h.tensors().len()).sum();
    if in_headers != map.len() {
        index_entries_found(&map, headers)?;
    }
    Ok(())
}

/// Every tensor of header `h` is in the index `map`, placed in `h`'s file.
fn index_places_where_found(
    map: &BTreeMap<String, String>,
    h: &SourceHeader,
) -> Result<(), ConvertError> {
    for t in h.tensors() {
        match map.get(t.name()) {
            Some(f) if f == h.file() => {}
            Some(f) => {
                return Err(ConvertError::IndexMismatch {
                    file: h.file().to_owned(),
                    tensor: t.name().to_owned(),
                    problem: format!("{INDEX_FILE} places it in {f}"),
                });
            }
            None => {
                return Err(ConvertError::UnexpectedTensor {
                    file: h.file().to_owned(),
                    tensor: t.name().to_owned(),
                    reason: format!("not listed in {INDEX_FILE}"),
                });
            }
        }
    }
    Ok(())
}

/// Every entry of the index `map` is a tensor of the header of its file.
fn index_entries_found(
    map: &BTreeMap<String, String>,
    headers: &[(SourceHeader, u64)],
) -> Result<(), ConvertError> {
    let by_file: BTreeMap<&str, &SourceHeader> =
        headers.iter().map(|(h, _)| (h.file(), h)).collect();
    for (tensor, file) in map {
        let found = by_file
            .get(file.as_str())
            .is_some_and(|h| h.tensor(tensor).is_some());
        if !found {
            return Err(ConvertError::MissingTensor {
                tensor: tensor.clone(),
                needed_for: format!("{INDEX_FILE}, which places it in {file}"),
            });
        }
    }
    Ok(())
}

/// `config.json` under `root`, parsed with duplicate keys refused: the one
/// reader of a local config.
pub fn read_config(root: &Path) -> Result<Value> {
    parse_json(CONFIG_FILE, &read_small(root, CONFIG_FILE)?)
}

/// A small JSON file of the source checkpoint under `root` (`DIR/source`),
/// through the bounded reader: a regular file of at most [`MAX_JSON_BYTES`]
/// with no other name (a link or a hard link could change its bytes after
/// they were verified).
fn read_small(root: &Path, file: &str) -> Result<Vec<u8>> {
    let path = safe_join(root, file)?;
    match ftpipe_fs::bounded::read_bounded_unshared(&path, MAX_JSON_BYTES) {
        Ok(b) => Ok(b),
        Err(e) if e.is_not_found() => Err(ConvertError::MissingFile {
            file: file.to_owned(),
        }),
        Err(e) => Err(e.into()),
    }
}

/// A shard's header JSON and file length, saved while the shard is present
/// so that it can still be planned after `--retire-sources` deleted it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct SavedHeader {
    /// The shard's length when its header was read.
    pub len: u64,
    /// The header JSON (N bytes after the 8-byte length).
    pub json: String,
    /// The shard's digest from its download receipt: the saved header is
    /// used only for that version of the file.
    #[serde(default)]
    pub digest: String,
}

/// A shard's header as the skeleton saves it ([`SavedHeader`] on disk).
/// The JSON of a shard that is present is not kept in memory (for ~300k
/// tensors it is ~40 MB): it is read again from the shard when the
/// skeleton is serialized, and must hash to what was planned from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeptHeader {
    /// The shard's length when its header was read.
    pub len: u64,
    /// The header JSON, or where to read it again.
    pub json: KeptJson,
    /// The shard's digest from its download receipt (see [`SavedHeader`]).
    pub digest: String,
}

/// Where a [`KeptHeader`]'s JSON is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeptJson {
    /// In the shard at `path`: its N = `json_len` bytes after the length,
    /// whose SHA-256 is `sha256`.
    InShard {
        /// The shard under the source root.
        path: PathBuf,
        /// N, the header JSON length.
        json_len: u64,
        /// SHA-256 of the N bytes read while planning.
        sha256: [u8; 32],
    },
    /// Saved by an earlier skeleton (the shard was retired since).
    Saved(String),
}

impl From<SavedHeader> for KeptHeader {
    fn from(h: SavedHeader) -> KeptHeader {
        KeptHeader {
            len: h.len,
            json: KeptJson::Saved(h.json),
            digest: h.digest,
        }
    }
}

/// [`SavedHeader`]'s fields and order, borrowed: the bytes a
/// [`KeptHeader`] serializes to are those of the equal [`SavedHeader`].
#[derive(Serialize)]
struct SavedHeaderRef<'a> {
    len: u64,
    json: &'a str,
    digest: &'a str,
}

impl KeptHeader {
    /// SHA-256 of the header JSON planned from.
    fn planned_sha256(&self) -> [u8; 32] {
        match &self.json {
            KeptJson::InShard { sha256, .. } => *sha256,
            KeptJson::Saved(json) => Sha256::digest(json.as_bytes()).into(),
        }
    }

    /// Refuses `file` (verified at `path`) unless its header JSON is the
    /// one planned from: a header read over HTTP Range before the file
    /// was fetched is only trusted once the verified file carries it.
    pub fn check_published(&self, path: &Path, file: &str) -> Result<()> {
        let (json, len) = block_in_place(|| SourceHeader::read_json(path, file))
            .map_err(|e| ConvertError::io("read", path, e))??;
        let now: [u8; 32] = Sha256::digest(&json).into();
        if now != self.planned_sha256() || len != self.len {
            return Err(ConvertError::HeaderNotPlanned {
                source_file: file.to_owned(),
                len,
                planned_len: self.len,
            });
        }
        Ok(())
    }

    /// The header JSON read again from the shard, refused unless it is the
    /// one planned from.
    fn reread(path: &Path, json_len: u64, sha256: &[u8; 32]) -> Result<String, String> {
        let at = path.display();
        let (json, _) = SourceHeader::read_json(path, &at.to_string())
            .map_err(|e| format!("{at}: cannot read its header again: {e}"))?
            .map_err(|e| format!("{e}"))?;
        if json.len() as u64 != json_len || <[u8; 32]>::from(Sha256::digest(&json)) != *sha256 {
            return Err(format!(
                "{at}: header changed since it was planned ({} bytes now, {json_len} then)",
                json.len()
            ));
        }
        String::from_utf8(json).map_err(|e| format!("{at}: header is not UTF-8: {e}"))
    }
}

impl Serialize for KeptHeader {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let reread;
        let json = match &self.json {
            KeptJson::Saved(json) => json.as_str(),
            KeptJson::InShard {
                path,
                json_len,
                sha256,
            } => {
                reread =
                    Self::reread(path, *json_len, sha256).map_err(serde::ser::Error::custom)?;
                reread.as_str()
            }
        };
        SavedHeaderRef {
            len: self.len,
            json,
            digest: &self.digest,
        }
        .serialize(s)
    }
}

impl<'de> serde::Deserialize<'de> for KeptHeader {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        SavedHeader::deserialize(d).map(KeptHeader::from)
    }
}

/// A shard's header from `root`, or, when the shard is absent from it
/// (retired), from `saved`; with the header as the skeleton keeps it.
fn local_header(
    root: &Path,
    saved: &BTreeMap<String, SavedHeader>,
    file: &str,
) -> Result<(SourceHeader, KeptHeader)> {
    let path = safe_join(root, file)?;
    match std::fs::metadata(&path) {
        Ok(m) => {
            let (header, json) = block_in_place(|| SourceHeader::read_with_json(&path, file))
                .map_err(|e| ConvertError::io("read", &path, e))??;
            let json = String::from_utf8(json).map_err(|source| SourceError::HeaderNotUtf8 {
                file: file.to_owned(),
                source,
            })?;
            let kept = KeptHeader {
                len: m.len(),
                json: KeptJson::InShard {
                    json_len: json.len() as u64,
                    sha256: Sha256::digest(json.as_bytes()).into(),
                    path,
                },
                digest: String::new(),
            };
            Ok((header, kept))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let kept = saved
                .get(file)
                .cloned()
                .ok_or_else(|| ConvertError::MissingFile {
                    file: file.to_owned(),
                })?;
            let header = SourceHeader::parse(file, kept.json.as_bytes(), kept.len)?;
            Ok((header, KeptHeader::from(kept)))
        }
        Err(e) => Err(ConvertError::io("stat", path, e)),
    }
}

/// GETs a whole small file (config, index), refused before any request
/// when its listed size is past [`MAX_JSON_BYTES`].
async fn get_small(remote: &impl RemoteFiles, file: &FileRow) -> Result<Vec<u8>> {
    if file.size > MAX_JSON_BYTES {
        return Err(ConvertError::JsonTooLarge {
            file: file.path.clone(),
            len: file.size,
            limit: MAX_JSON_BYTES,
        });
    }
    let bytes = read_small_remote(remote, file).await?;
    // The plan (and the converter identity) is made from these bytes
    // before the file itself is fetched and verified: they must be the
    // pinned file's, as its digest in the listing says.
    let expected = ftpipe_hub::identity::expected_identity(file)?;
    let mut h = expected.hasher(bytes.len() as u64);
    h.update(&bytes);
    let actual = h.finish_hex();
    if actual != expected.hex() {
        return Err(ConvertError::SmallFileDigest {
            file: file.path.clone(),
            kind: expected.kind(),
            expected: expected.hex().to_owned(),
            actual,
        });
    }
    Ok(bytes)
}

/// Files at least this long are read for the plan in [`SMALL_FILE_RANGES`]
/// ranges at once (a capped link caps each connection: a multi-MB index
/// would otherwise hold back every shard request behind it).
pub const SPLIT_SMALL_FILE_AT: u64 = 1 << 20;
/// Ranges a small file past [`SPLIT_SMALL_FILE_AT`] is read in.
pub const SMALL_FILE_RANGES: u64 = 4;

/// The whole of a small listed file: one GET, or [`SMALL_FILE_RANGES`]
/// ranged GETs at once (each checked by the remote), concatenated.
async fn read_small_remote(remote: &impl RemoteFiles, file: &FileRow) -> Result<Vec<u8>> {
    let size = file.size;
    if size < SPLIT_SMALL_FILE_AT {
        return Ok(remote.read_whole(&file.path, size).await?);
    }
    let step = size.div_ceil(SMALL_FILE_RANGES);
    let ranges = (0..SMALL_FILE_RANGES)
        .map(|i| (i * step, ((i + 1) * step).min(size) - 1))
        .filter(|(first, last)| first <= last);
    let parts = futures_util::future::try_join_all(
        ranges.map(|(first, last)| remote.read_range(&file.path, first, last, size)),
    )
    .await;
    match parts {
        Ok(parts) => Ok(parts.concat()),
        // A server that will not answer ranges of it (a 200, no 206)
        // still serves it whole.
        Err(e) => {
            tracing::debug!(file = %file.path, error = %e, "ranged read refused; reading it whole");
            Ok(remote.read_whole(&file.path, size).await?)
        }
    }
}

/// Reads and validates one shard's header over HTTP Range (8 + N bytes).
pub async fn remote_header(
    remote: &impl RemoteFiles,
    path: &str,
    size: u64,
) -> Result<SourceHeader> {
    Ok(remote_header_json(remote, path, size).await?.0)
}

/// [`remote_header`] with the header JSON it was parsed from.
pub async fn remote_header_json(
    remote: &impl RemoteFiles,
    path: &str,
    size: u64,
) -> Result<(SourceHeader, Vec<u8>)> {
    if size < 8 {
        return Err(ConvertError::from(SourceError::TooShort {
            file: path.to_owned(),
            len: size,
        }));
    }
    let first8 = remote.read_range(path, 0, 7, size).await?;
    let n = SourceHeader::header_len(path, &first8, size).map_err(ConvertError::from)?;
    let json = if n == 0 {
        Vec::new()
    } else {
        remote.read_range(path, 8, 8 + n - 1, size).await?
    };
    let file = path.to_owned();
    let parsed = off_runtime(path, move || {
        SourceHeader::parse(&file, &json, size).map(|header| (header, json))
    });
    Ok(parsed.await??)
}

/// Runs CPU-bound `parse` (of `file`'s JSON) on the blocking pool: the
/// plan's parses overlap with its other reads and use every core.
async fn off_runtime<T: Send + 'static>(
    file: &str,
    parse: impl FnOnce() -> T + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(parse)
        .await
        .map_err(|e| ConvertError::internal_from(format!("parsing {file}"), e))
}

/// The source files a plan may read from disk: those with a download
/// receipt whose file is at its final path with the receipt's size. A file
/// whose watermark reached its size but that was not published yet (no
/// receipt) is not among them — it is read from the hub.
#[derive(Debug, Clone)]
pub struct Published<'a> {
    root: Option<&'a Path>,
    files: BTreeSet<String>,
}

impl<'a> Published<'a> {
    /// No file is read locally.
    pub fn none() -> Published<'static> {
        Published {
            root: None,
            files: BTreeSet::new(),
        }
    }

    /// The files of `receipts` present under `root` with their receipt's size.
    pub fn from_receipts(root: &'a Path, receipts: &[Receipt]) -> Published<'a> {
        let files = receipts
            .iter()
            .filter(|r| {
                safe_join(root, &r.path)
                    .ok()
                    .and_then(|p| std::fs::symlink_metadata(p).ok())
                    .is_some_and(|m| m.is_file() && m.len() == r.size)
            })
            .map(|r| r.path.clone())
            .collect();
        Published {
            root: Some(root),
            files,
        }
    }

    /// The source root to read `file` from, if it is published.
    fn root_of(&self, file: &str) -> Option<&'a Path> {
        self.root.filter(|_| self.files.contains(file))
    }

    /// Every file of `listing` is published.
    pub fn covers(&self, listing: &[FileRow]) -> bool {
        listing.iter().all(|f| self.files.contains(&f.path))
    }
}

/// Where the planner reads `config.json`, the index and each shard's
/// header. Every plan, whatever its source, goes through [`plan`].
pub enum HeaderSource<'a, R: RemoteFiles = LocalOnly> {
    /// `DIR/source` (`root`); a shard absent from it (retired after its
    /// header was saved) from `saved`, the headers of an earlier skeleton.
    Local {
        /// The source root.
        root: &'a Path,
        /// Headers of retired shards, by file.
        saved: &'a BTreeMap<String, SavedHeader>,
    },
    /// Before or during a fetch: each published file from disk, every other
    /// one from `remote` at the pin (8 + N header bytes per shard), sized
    /// by the pinned `listing`.
    Remote {
        /// The pinned revision's files.
        remote: &'a R,
        /// The pinned listing (sizes).
        listing: &'a [FileRow],
        /// The files already published locally.
        published: &'a Published<'a>,
    },
}

/// The [`RemoteFiles`] of a [`HeaderSource::Local`]: there are none.
pub enum LocalOnly {}

impl RemoteFiles for LocalOnly {
    async fn read_whole(&self, _: &str, _: u64) -> ftpipe_hub::Result<Vec<u8>> {
        match *self {}
    }

    async fn read_range(&self, _: &str, _: u64, _: u64, _: u64) -> ftpipe_hub::Result<Vec<u8>> {
        match *self {}
    }
}

impl<'a> HeaderSource<'a> {
    /// Everything from `root`, no saved header.
    pub fn local(root: &'a Path) -> Self {
        static NONE: BTreeMap<String, SavedHeader> = BTreeMap::new();
        HeaderSource::Local { root, saved: &NONE }
    }
}

/// A plan with what it was made from.
#[derive(Debug)]
pub struct Planned {
    /// The plan.
    pub plan: Plan,
    /// `config.json` as read (once) for it.
    pub config: Value,
    /// Every shard header read, from disk, saved or from a remote, as the
    /// skeleton keeps it.
    pub headers: BTreeMap<String, KeptHeader>,
}

impl<R: RemoteFiles> HeaderSource<'_, R> {
    fn listed(&self, file: &str) -> Result<&FileRow> {
        let listing = match self {
            HeaderSource::Remote { listing, .. } => *listing,
            HeaderSource::Local { .. } => &[],
        };
        listing
            .iter()
            .find(|f| f.path == file)
            .ok_or_else(|| ConvertError::MissingFile {
                file: file.to_owned(),
            })
    }

    /// The files of a remote listing that the selection keeps and that
    /// are named as the index's shards are (`NAME-NNNNN-of-NNNNN.safetensors`
    /// at the top level; a lone `consolidated.safetensors` or a variant's
    /// subfolder is not read on a guess); none for a local source.
    fn likely_shards(&self, selection: &FetchSelection) -> Vec<String> {
        match self {
            HeaderSource::Remote { listing, .. } => listing
                .iter()
                .filter(|f| is_shard_name(&f.path) && selection.excluded(&f.path).is_none())
                .map(|f| f.path.clone())
                .collect(),
            HeaderSource::Local { .. } => Vec::new(),
        }
    }

    async fn small(&self, file: &str) -> Result<Vec<u8>> {
        match self {
            HeaderSource::Local { root, .. } => read_small(root, file),
            HeaderSource::Remote {
                remote, published, ..
            } => match published.root_of(file) {
                Some(root) => read_small(root, file),
                None => get_small(*remote, self.listed(file)?).await,
            },
        }
    }

    async fn header(&self, file: &str) -> Result<(SourceHeader, Option<KeptHeader>)> {
        match self {
            HeaderSource::Local { root, saved } => {
                local_header(root, saved, file).map(|(h, kept)| (h, Some(kept)))
            }
            HeaderSource::Remote {
                remote, published, ..
            } => match published.root_of(file) {
                Some(root) => {
                    local_header(root, &BTreeMap::new(), file).map(|(h, kept)| (h, Some(kept)))
                }
                None => {
                    let size = self.listed(file)?.size;
                    let (header, json) = remote_header_json(*remote, file, size).await?;
                    let json =
                        String::from_utf8(json).map_err(|source| SourceError::HeaderNotUtf8 {
                            file: file.to_owned(),
                            source,
                        })?;
                    let kept = KeptHeader {
                        len: size,
                        json: KeptJson::Saved(json),
                        digest: String::new(),
                    };
                    Ok((header, Some(kept)))
                }
            },
        }
    }
}

/// Shard headers read at once while planning from a remote.
pub const HEADER_READS: usize = 8;

/// `path` is named as a sharded checkpoint's shards are:
/// `NAME-NNNNN-of-NNNNN.safetensors` at the top level.
fn is_shard_name(path: &str) -> bool {
    let Some(stem) = path.strip_suffix(".safetensors") else {
        return false;
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    !path.contains('/')
        && stem
            .rsplit_once("-of-")
            .and_then(|(head, total)| head.rsplit_once('-').map(|(_, n)| (n, total)))
            .is_some_and(|(n, total)| digits(n) && digits(total))
}

/// A shard header as [`HeaderSource`] reads it.
type ReadHeader = Result<(SourceHeader, Option<KeptHeader>)>;

/// Reads the headers of `files`, [`HEADER_READS`] at a time (remote ones
/// are two ranged requests each: latency-bound, one capped connection
/// each), each with its file.
async fn read_headers<R: RemoteFiles>(
    source: &HeaderSource<'_, R>,
    files: Vec<String>,
) -> BTreeMap<String, ReadHeader> {
    futures_util::stream::iter(files)
        .map(|file| async move {
            let r = source.header(&file).await;
            (file, r)
        })
        .buffered(HEADER_READS)
        .collect()
        .await
}

/// Plans from `source`: config.json and the index whole, then each shard
/// the selection of `opts` keeps up to the end of its header. From a
/// remote, the headers of the listing's selected `.safetensors` files are
/// read while the index downloads (a header the index turns out not to
/// need is dropped, its error too).
pub async fn plan<R: RemoteFiles>(
    source: &HeaderSource<'_, R>,
    opts: &PlanOptions,
) -> Result<Planned> {
    needed_files_selected(&opts.selection)?;
    let config = parse_json(CONFIG_FILE, &source.small(CONFIG_FILE).await?)?;
    // Choose the profile before any shard request: an unknown model_type
    // costs nothing.
    opts.profile(&config)?;
    let likely = source.likely_shards(&opts.selection);
    let index = async {
        let bytes = source.small(INDEX_FILE).await?;
        off_runtime(INDEX_FILE, move || index_weight_map(&bytes)).await?
    };
    let (map, mut early) = tokio::join!(index, read_headers(source, likely));
    let map = map?;
    let shards = fetched_shards(&map, &opts.selection);
    let rest = shards
        .iter()
        .filter(|f| !early.contains_key(*f))
        .cloned()
        .collect();
    let mut late = read_headers(source, rest).await;
    let mut headers = Vec::new();
    let mut kept_headers = BTreeMap::new();
    for file in shards {
        let read = early.remove(&file).or_else(|| late.remove(&file));
        let (header, kept) =
            read.ok_or_else(|| ConvertError::internal(format!("{file}'s header was not read")))??;
        let len = match &kept {
            Some(k) => k.len,
            None => source.listed(&file)?.size,
        };
        headers.push((header, len));
        if let Some(k) = kept {
            kept_headers.insert(file, k);
        }
    }
    let plan = plan_from_parts(&config, map, &headers, opts)?;
    Ok(Planned {
        plan,
        config,
        headers: kept_headers,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// [`plan`] from `root` alone, on a runtime of its own (a local plan
    /// reads files in `block_in_place`, which needs a multi-thread one).
    pub(crate) fn plan_local(root: &Path) -> Result<Plan> {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .build()
            .expect("a test runtime")
            .block_on(plan(&HeaderSource::local(root), &PlanOptions::default()))
            .map(|p| p.plan)
    }

    /// [`plan_local`] of the fixture checkpoint `seed` written to a
    /// temporary directory.
    pub(crate) fn plan_of_generated(seed: u64) -> Plan {
        let dir = tempfile::tempdir().unwrap();
        for f in qwen4::generate_qwen4_repo(seed, QwenShape::default()) {
            let path = dir.path().join(&f.path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, content_bytes(&f).unwrap()).unwrap();
        }
        plan_local(dir.path()).unwrap()
    }
    use crate::profile::{ComponentContent, TensorSource};
    use ftpipe_fixtures::RepoFile;
    use ftpipe_fixtures::checkpoint::content_bytes;
    use ftpipe_fixtures::qwen4::{self, Mutation, QwenShape};
    use ftpipe_formats::{Dtype, TensorKind};

    /// Only top-level `NAME-NNNNN-of-NNNNN.safetensors` files are read on
    /// a guess while the index downloads.
    #[test]
    fn shard_names_read_on_a_guess() {
        for yes in ["model-00001-of-00131.safetensors", "a-b-1-of-2.safetensors"] {
            assert!(is_shard_name(yes), "{yes}");
        }
        for no in [
            "consolidated.safetensors",
            "model.safetensors",
            "sub/model-00001-of-00002.safetensors",
            "model-00001-of-00002.bin",
            "model--of-00002.safetensors",
            "model-0001-of-.safetensors",
            "model-x1-of-2.safetensors",
        ] {
            assert!(!is_shard_name(no), "{no}");
        }
    }

    /// Malformed JSON names the file and the parser's position, and keeps
    /// the parser's error as the source for programs walking the chain.
    #[test]
    fn malformed_json_keeps_the_parser_error_as_its_source() {
        let e = parse_json("config.json", b"{\"a\": }").unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.starts_with("config.json: malformed JSON: expected value at line 1 column 7"),
            "{msg}"
        );
        let source = std::error::Error::source(&e).expect("a source");
        assert!(
            source.downcast_ref::<serde_json::Error>().is_some(),
            "{source:?}"
        );
        assert!(msg.ends_with(&source.to_string()), "{msg}");
    }

    /// A present shard's header is not kept in memory: the skeleton reads
    /// it again and writes exactly what a [`SavedHeader`] with the JSON
    /// would, and refuses a header that changed since it was planned.
    #[test]
    fn kept_header_rereads_the_shard_and_refuses_a_changed_header() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.safetensors");
        let json = r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#;
        let write = |json: &str| {
            let mut b = (json.len() as u64).to_le_bytes().to_vec();
            b.extend_from_slice(json.as_bytes());
            b.extend_from_slice(&[0; 4]);
            std::fs::write(&path, b).unwrap();
        };
        write(json);
        let kept = KeptHeader {
            len: 8 + json.len() as u64 + 4,
            json: KeptJson::InShard {
                path: path.clone(),
                json_len: json.len() as u64,
                sha256: Sha256::digest(json.as_bytes()).into(),
            },
            digest: "d".repeat(64),
        };
        let saved = SavedHeader {
            len: kept.len,
            json: json.to_owned(),
            digest: kept.digest.clone(),
        };
        assert_eq!(
            serde_json::to_string(&kept).unwrap(),
            serde_json::to_string(&saved).unwrap()
        );
        // Same length, other bytes: the digest tells them apart.
        write(&json.replace(r#""a""#, r#""b""#));
        let e = serde_json::to_string(&kept).unwrap_err().to_string();
        assert!(e.contains("header changed since it was planned"), "{e}");
    }

    /// The index is read without its JSON tree: every index the tree path
    /// refuses is refused with the same message, and a good one gives the
    /// same map.
    #[test]
    fn index_weight_map_agrees_with_the_json_tree() {
        let tree = |b: &[u8]| parse_json(INDEX_FILE, b).and_then(|v| weight_map(&v));
        let cases: [&[u8]; 9] = [
            br#"{"metadata": {"total_size": 1}, "weight_map": {"a": "m-1.safetensors", "b": "m-2.safetensors"}}"#,
            br#"{"metadata": {}}"#,
            br#"{"weight_map": null}"#,
            br#"{"weight_map": {"a": 1}}"#,
            br#"{"weight_map": {"a": "m.safetensors", "a": "n.safetensors"}}"#,
            br#"{"weight_map": {"a": "../m.safetensors"}}"#,
            br#"{"weight_map": {"a": "m.bin"}}"#,
            br#"{"weight_map": {"a": "m.safetensors"}"#,
            br#"[1, 2]"#,
        ];
        for b in cases {
            let (direct, via_tree) = (index_weight_map(b), tree(b));
            match (&direct, &via_tree) {
                (Ok(a), Ok(t)) => assert_eq!(a, t),
                (Err(a), Err(t)) => assert_eq!(a.to_string(), t.to_string()),
                _ => panic!("{}: {direct:?} vs {via_tree:?}", String::from_utf8_lossy(b)),
            }
        }
        assert_eq!(index_weight_map(cases[0]).unwrap().len(), 2);
    }

    fn plan_of(files: &[RepoFile]) -> Result<Plan, ConvertError> {
        let get = |p: &str| content_bytes(files.iter().find(|f| f.path == p).unwrap()).unwrap();
        let config = parse_json(CONFIG_FILE, &get(CONFIG_FILE))?;
        let map = index_weight_map(&get(INDEX_FILE))?;
        let headers = shard_files(&map)
            .into_iter()
            .map(|f| {
                let b = get(&f);
                let n = SourceHeader::header_len(&f, &b, b.len() as u64)?;
                let h = SourceHeader::parse(&f, &b[8..8 + n as usize], b.len() as u64)?;
                Ok((h, b.len() as u64))
            })
            .collect::<Result<Vec<_>, SourceError>>()?;
        plan_from_parts(&config, map, &headers, &PlanOptions::default())
    }

    fn ftw_desc(plan: &Plan, key: &str) -> (Dtype, TensorKind, Vec<u64>, TensorSource) {
        let ComponentContent::Ftw { tensors } = &plan.components[0].content else {
            panic!("FTW first")
        };
        let t = tensors.iter().find(|t| t.desc.key == key).unwrap();
        (
            t.desc.dtype,
            t.desc.kind,
            t.desc.shape.clone(),
            t.source.clone(),
        )
    }

    #[test]
    fn qwen4_policy_native_protected_plain() {
        let plan = plan_of(&qwen4::generate_qwen4_repo(1, QwenShape::default())).unwrap();
        assert_eq!(plan.profile, "qwen4_exp");
        let (d, k, s, src) = ftw_desc(&plan, "model.layers.0.self_attn.o_proj.weight");
        assert_eq!((d, k, s), (Dtype::Nvfp4, TensorKind::Native, vec![64, 64]));
        assert!(matches!(src, TensorSource::Native(_)));
        let (d, k, _, _) = ftw_desc(&plan, "model.layers.2.self_attn.q_proj.weight");
        assert_eq!((d, k), (Dtype::BF16, TensorKind::Protected));
        let (d, k, _, _) = ftw_desc(&plan, "model.norm.weight");
        assert_eq!((d, k), (Dtype::BF16, TensorKind::Plain));
        // Fused experts: per-expert slices of the fused tensors, contiguous.
        let c = plan
            .components
            .iter()
            .find(|c| c.name == "experts/layer_002.ftexpert")
            .unwrap();
        let ComponentContent::Experts { records, .. } = &c.content else {
            panic!()
        };
        let span = |s: &TensorSource| match s {
            TensorSource::Span(s) => s.clone(),
            TensorSource::Native(_) | TensorSource::Checked(_) => panic!(),
        };
        let (g1, u1) = (span(&records[1][0]), span(&records[1][1]));
        assert_eq!(g1.len, 32 * 64 * 2);
        assert_eq!(u1.offset, g1.offset + g1.len);
        assert_eq!(span(&records[0][0]).offset + 2 * g1.len, g1.offset);
    }

    #[test]
    fn qwen3_moe_has_experts_and_no_ple() {
        let plan = plan_of(&qwen4::generate_qwen3_moe_repo(2, QwenShape::default())).unwrap();
        assert_eq!(plan.profile, "qwen3_moe");
        let kinds: Vec<_> = plan.components.iter().map(|c| c.kind.as_str()).collect();
        assert_eq!(kinds, ["ftw", "ftexpert", "ftexpert", "ftexpert"]);
        // Plain BF16 experts are exact FTEXPERT1 sizes.
        assert!(plan.components[1].predicted_bytes > 16 * 3 * 32 * 64 * 2);
    }

    #[test]
    fn lone_weight_scale_names_the_missing_weight() {
        // Make the lm_head an NVFP4 triplet while `ignore` protects it.
        let files = qwen4::generate_qwen4_repo_mutated(
            1,
            QwenShape::default(),
            &[
                Mutation::Drop("lm_head.weight".into()),
                Mutation::Add("lm_head.weight_scale".into(), vec![128, 4]),
            ],
        );
        // weight_scale without weight: the triplet is broken.
        let e = plan_of(&files).unwrap_err().to_string();
        assert!(e.contains("lm_head.weight"), "{e}");
    }

    #[test]
    fn mixed_expert_layout_is_refused() {
        let files = qwen4::generate_qwen4_repo_mutated(
            1,
            QwenShape::default(),
            &[Mutation::Reshape(
                "model.layers.1.mlp.experts.5.down_proj.weight".into(),
                vec![64, 48],
            )],
        );
        let e = plan_of(&files).unwrap_err().to_string();
        assert!(
            e.contains("model.layers.1.mlp.experts.5.down_proj.weight") && e.contains("[64, 32]"),
            "{e}"
        );
    }

    /// The plan's error once the index places `tensor` in `file`.
    fn plan_error_with_index_entry(tensor: &str, file: &str) -> String {
        let mut files = qwen4::generate_qwen4_repo(1, QwenShape::default());
        let idx = files.iter_mut().find(|f| f.path == INDEX_FILE).unwrap();
        let mut v: Value = serde_json::from_slice(&content_bytes(idx).unwrap()).unwrap();
        v["weight_map"][tensor] = file.into();
        *idx = RepoFile::bytes(INDEX_FILE, serde_json::to_vec(&v).unwrap());
        plan_of(&files).unwrap_err().to_string()
    }

    #[test]
    fn index_must_match_headers() {
        let e =
            plan_error_with_index_entry("model.norm.weight", "model-00001-of-00003.safetensors");
        assert!(
            e.contains("model.norm.weight") && e.contains("places it in"),
            "{e}"
        );
    }

    /// An index entry that no header holds is named, with the file the
    /// index places it in: every header tensor is where the index says,
    /// so only the count of tensors against entries shows it.
    #[test]
    fn index_entry_without_a_tensor_is_named() {
        let e = plan_error_with_index_entry(
            "model.layers.0.ghost.weight",
            "model-00002-of-00003.safetensors",
        );
        assert!(
            e.contains("model.layers.0.ghost.weight")
                && e.contains("which places it in model-00002-of-00003.safetensors"),
            "{e}"
        );
    }
}
