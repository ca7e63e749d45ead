//! `convert`: the idempotent conversion stage.
//!
//! The unit of work is a component. Each is written to a temp file,
//! fsynced, renamed, its directory fsynced, and only then its receipt
//! (size, SHA-256, identity) is committed ([`super::write`]). A restart
//! skips components whose receipt has the current identity and whose file
//! has the receipt's size, deletes stale temp files (never hashed into
//! anything) and redoes the rest. Global scales go first: a PLE segment is
//! encoded under its table's scale, read back and checked against its
//! receipt. The manifest is written last, atomically, from the receipts.
//!
//! Identity: a receipt made under another identity (converter variant or
//! source digests), or a manifest from other sources or another converter,
//! stops the run with the reasons; `--rebuild` renames the whole artifact
//! aside as evidence and starts a fresh one.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures_util::StreamExt;
use serde_json::Value;
use tokio::task::block_in_place;

use ftpipe_formats::Q3GlobalScale;
use ftpipe_receipts::{ComponentReceipt, RunId, Store};

use super::error::ConvertError;
use super::manifest::{
    ConvertOptionsId, ConverterIdentity, MANIFEST_FILE, Manifest, PLACEMENT_FILE, Placement,
    TEMP_SUFFIX, sha256_hex,
};
use super::plan::{Plan, PlanOptions, SavedHeader, plan_local_saved};
use super::profile::{CONFIG_FILE, Component, ComponentKind, model_type};
use super::recipe::Recipe;
use super::skeleton::{Skeleton, files_read, source_identity};
use super::space::artifact_peak;
use super::write::{Sources, read_global_scale, write_component};
use crate::error::{Result, StageError};
use crate::fetch::sync_dir;
use crate::identity::{Expected, LfsSha256, hash_file};
use crate::progress::{ProgressEvent, Reporter};

/// Skeleton file under the state directory.
pub const SKELETON_FILE: &str = "convert.json";
/// Plan file under the state directory (evidence for audits and bundles).
pub const PLAN_FILE: &str = "plan.json";

/// What the command line chose.
#[derive(Debug, Clone, Default)]
pub struct ConvertOptions {
    /// Components converted in parallel.
    pub jobs: usize,
    /// Delete each source shard once every component reading it has a receipt.
    pub retire_sources: bool,
    /// Set a stale artifact aside and rebuild instead of refusing.
    pub rebuild: bool,
    /// Extra globs of tensors kept BF16 and marked protected.
    pub protect: Vec<String>,
    /// A declarative recipe instead of a built-in profile.
    pub recipe: Option<Recipe>,
    /// RAM budget for placement (bytes).
    pub ram_budget: u64,
    /// Bytes of the budget kept free.
    pub reserve: u64,
    /// Check free space before writing.
    pub preflight: bool,
}

impl ConvertOptions {
    /// The options that change the plan.
    pub fn plan_options(&self) -> PlanOptions {
        PlanOptions {
            protect: self.protect_globs(),
            recipe: self.recipe.clone(),
        }
    }

    /// `--protect` globs sorted and deduplicated: their order on the
    /// command line is not part of the converter identity.
    fn protect_globs(&self) -> Vec<String> {
        let set: BTreeSet<&String> = self.protect.iter().collect();
        set.into_iter().cloned().collect()
    }

    /// The options as recorded in the converter identity.
    pub fn options_id(&self) -> ConvertOptionsId {
        ConvertOptionsId {
            protect: self.protect_globs(),
            recipe: self.recipe.as_ref().map(Recipe::digest),
        }
    }
}

/// Where conversion reads and writes.
#[derive(Debug, Clone)]
pub struct ConvertPaths {
    /// `DIR`.
    pub out: PathBuf,
    /// `DIR/source`.
    pub source: PathBuf,
    /// `DIR/artifact`.
    pub artifact: PathBuf,
    /// `DIR/.ftpipe`.
    pub state_dir: PathBuf,
}

/// What a finished conversion reports.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ConvertOutcome {
    /// SHA-256 of manifest.json.
    pub manifest_sha256: String,
    /// Artifact fingerprint.
    pub fingerprint: String,
    /// Components in the artifact.
    pub components: usize,
    /// Components written by this run.
    pub written: usize,
    /// Components reused from earlier runs.
    pub reused: usize,
    /// Σ component sizes (= Σ predicted).
    pub total_bytes: u64,
    /// Source files retired by this run.
    pub retired: Vec<String>,
    /// Where a stale artifact was set aside.
    pub set_aside: Option<PathBuf>,
    /// The placement written.
    pub placement: Placement,
}

/// Writes `bytes` to `dir/name` atomically: temp → fsync → rename → fsync dir.
pub fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let path = dir.join(name);
    if std::fs::read(&path).is_ok_and(|old| old == bytes) {
        // Same bytes, maybe from a run killed before its fsyncs: make them
        // durable before anything is recorded about them.
        std::fs::File::open(&path)
            .and_then(|f| f.sync_all())
            .map_err(|e| StageError::io("fsync", &path, e))?;
        return sync_dir(dir).map_err(|e| StageError::io("fsync", dir, e));
    }
    let tmp = dir.join(format!("{name}{TEMP_SUFFIX}"));
    let mut f = std::fs::File::create(&tmp).map_err(|e| StageError::io("create", &tmp, e))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .map_err(|e| StageError::io("write", &tmp, e))?;
    std::fs::rename(&tmp, &path).map_err(|e| StageError::io("rename", &tmp, e))?;
    sync_dir(dir).map_err(|e| StageError::io("fsync", dir, e))
}

fn read_config(source: &Path) -> Result<Value> {
    let path = source.join(CONFIG_FILE);
    let bytes = std::fs::read(&path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => StageError::from(ConvertError::MissingFile {
            file: CONFIG_FILE.into(),
        }),
        _ => StageError::io("read", &path, e),
    })?;
    serde_json::from_slice(&bytes).map_err(|e| {
        ConvertError::MalformedJson {
            file: CONFIG_FILE.into(),
            message: e.to_string(),
        }
        .into()
    })
}

/// Removes leftover component temp files under `dir`; returns them.
fn remove_temp_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut removed = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        let entries = match std::fs::read_dir(&d) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(StageError::io("list", &d, e)),
        };
        for entry in entries {
            let entry = entry.map_err(|e| StageError::io("list", &d, e))?;
            let path = entry.path();
            let ft = entry
                .file_type()
                .map_err(|e| StageError::io("stat", &path, e))?;
            if ft.is_dir() {
                stack.push(path);
            } else if path.to_string_lossy().ends_with(TEMP_SUFFIX) {
                std::fs::remove_file(&path).map_err(|e| StageError::io("remove", &path, e))?;
                removed.push(path);
            }
        }
    }
    Ok(removed)
}

/// Why existing output may not be reused under `skel`.
fn stale_reasons(skel: &Skeleton, receipts: &[ComponentReceipt], artifact: &Path) -> Vec<String> {
    let mut reasons = Vec::new();
    if let Ok(bytes) = std::fs::read(artifact.join(MANIFEST_FILE))
        && let Ok(m) = serde_json::from_slice::<Manifest>(&bytes)
    {
        let now = &skel.manifest;
        if m.source != now.source {
            reasons.push(format!(
                "manifest.json was made from {}@{} (this run converts {}@{}{})",
                m.source.repo,
                m.source.commit,
                now.source.repo,
                now.source.commit,
                if m.source.commit == now.source.commit {
                    ", other file digests"
                } else {
                    ""
                }
            ));
        }
        if m.converter != now.converter {
            reasons.push(format!(
                "manifest.json was made by converter {} (this run is {})",
                serde_json::to_string(&m.converter).unwrap_or_default(),
                serde_json::to_string(&now.converter).unwrap_or_default()
            ));
        }
    }
    let stale: Vec<&str> = receipts
        .iter()
        .filter(|r| skel.identities.get(&r.path) != Some(&r.identity))
        .map(|r| r.path.as_str())
        .collect();
    if let Some(first) = stale.first() {
        reasons.push(format!(
            "{} component(s) (first: {first}) were made under another identity",
            stale.len()
        ));
    }
    reasons
}

/// Sets the artifact aside as `DIR/artifact.stale-run{N}`: the destination
/// is logged (and the receipts dropped) first, then the directory renamed,
/// so a run killed in between finishes that same rename
/// ([`finish_pending_set_aside`]) instead of choosing another name.
async fn set_aside(store: &Store, run: RunId, paths: &ConvertPaths, why: &str) -> Result<PathBuf> {
    let mut name = format!("artifact.stale-run{run}");
    let mut n = 1;
    while paths.out.join(&name).exists() {
        name = format!("artifact.stale-run{run}.{n}");
        n += 1;
    }
    let dest = paths.out.join(&name);
    store
        .set_aside_artifact(run, &name, &format!("{} ({why})", dest.display()))
        .await?;
    rename_aside(paths, &dest)?;
    Ok(dest)
}

fn rename_aside(paths: &ConvertPaths, dest: &Path) -> Result<()> {
    if paths.artifact.exists() {
        std::fs::rename(&paths.artifact, dest)
            .map_err(|e| StageError::io("rename", &paths.artifact, e))?;
        sync_dir(&paths.out).map_err(|e| StageError::io("fsync", &paths.out, e))?;
    }
    Ok(())
}

/// Finishes a set-aside whose rename a killed run did not do: the last
/// artifact event is a set-aside to a directory that does not exist and no
/// component was written since (its receipts were dropped with it).
async fn finish_pending_set_aside(store: &Store, paths: &ConvertPaths) -> Result<Option<PathBuf>> {
    let log = store.artifact_log().await?;
    let Some(name) = log
        .last()
        .filter(|a| a.event == "set_aside")
        .and_then(|a| a.set_aside_to.clone())
    else {
        return Ok(None);
    };
    crate::paths::validate_repo_path(&name).map_err(|e| StageError::InvalidInput {
        what: "set-aside destination",
        message: format!("{name:?}: {e}"),
    })?;
    let dest = paths.out.join(&name);
    if dest.exists() || !paths.artifact.exists() || !store.components().await?.is_empty() {
        return Ok(None);
    }
    rename_aside(paths, &dest)?;
    Ok(Some(dest))
}

/// Components whose receipt has the current identity and whose file has the
/// receipt's size.
fn valid_receipts(
    skel: &Skeleton,
    receipts: Vec<ComponentReceipt>,
    artifact: &Path,
) -> BTreeMap<String, ComponentReceipt> {
    receipts
        .into_iter()
        .filter(|r| {
            skel.identities.get(&r.path) == Some(&r.identity)
                && std::fs::metadata(artifact.join(&r.path)).is_ok_and(|m| m.len() == r.size)
        })
        .map(|r| (r.path.clone(), r))
        .collect()
}

struct Prepared {
    skel: Skeleton,
    plan: Plan,
}

/// The converter identity `opts` gives for the checkpoint under `source`.
pub fn current_converter(source: &Path, opts: &ConvertOptions) -> Result<ConverterIdentity> {
    let config = read_config(source)?;
    let _ = model_type(&config)?;
    Ok(ConverterIdentity::current(
        opts.plan_options().profile(&config)?.name(),
        opts.options_id(),
    ))
}

/// Headers of retired shards absent from `source`, from the saved skeleton.
async fn retired_headers(
    store: &Store,
    paths: &ConvertPaths,
    retired: &BTreeSet<String>,
) -> Result<BTreeMap<String, SavedHeader>> {
    let path = paths.state_dir.join(SKELETON_FILE);
    let saved: BTreeMap<String, SavedHeader> = std::fs::read(&path)
        .ok()
        .and_then(|b| serde_json::from_slice::<Skeleton>(&b).ok())
        .map(|s| s.headers)
        .unwrap_or_default();
    let mut out = BTreeMap::new();
    for file in retired {
        let on_disk = crate::paths::safe_join(&paths.source, file)?;
        if on_disk.exists() {
            continue;
        }
        match saved.get(file) {
            Some(h) => {
                out.insert(file.clone(), h.clone());
            }
            None => {
                return Err(ConvertError::RetiredHeaderMissing {
                    source_file: file.clone(),
                    run: retired_by(store, file).await?,
                    skeleton: path.display().to_string(),
                }
                .into());
            }
        }
    }
    Ok(out)
}

/// The run that retired `file` (0 when the log does not say).
async fn retired_by(store: &Store, file: &str) -> Result<i64> {
    Ok(store
        .retirement_log()
        .await?
        .iter()
        .rfind(|r| r.path == file && r.event == "retired")
        .map_or(0, |r| r.run_id))
}

/// The plan and skeleton of this conversion, from the shards present and,
/// for shards retired since, the headers saved in the last skeleton.
async fn prepare(
    store: &Store,
    paths: &ConvertPaths,
    opts: &ConvertOptions,
    retired: &BTreeSet<String>,
) -> Result<Prepared> {
    let pin = store.pin().await?.ok_or_else(|| ConvertError::NotFetched {
        file: CONFIG_FILE.into(),
    })?;
    let receipts: BTreeMap<_, _> = store
        .receipts()
        .await?
        .into_iter()
        .map(|r| (r.path.clone(), r))
        .collect();
    let config = read_config(&paths.source)?;
    let top_k = config
        .get("num_experts_per_tok")
        .and_then(Value::as_u64)
        .unwrap_or(8);
    let converter = current_converter(&paths.source, opts)?;
    let saved = retired_headers(store, paths, retired).await?;
    let (plan, headers) =
        block_in_place(|| plan_local_saved(&paths.source, &opts.plan_options(), &saved))?;
    let source = source_identity(&pin.repo, &pin.commit, &files_read(&plan), &receipts)?;
    let skel = Skeleton::build(&plan, source, converter, top_k, headers)?;
    Ok(Prepared { skel, plan })
}

/// Converts the sources under `paths.source` into `paths.artifact`.
pub async fn convert(
    store: &Arc<Store>,
    run: RunId,
    paths: &ConvertPaths,
    opts: &ConvertOptions,
    reporter: &dyn Reporter,
) -> Result<ConvertOutcome> {
    let retired = store.retired_sources().await?;
    let Prepared { skel, plan } = prepare(store, paths, opts, &retired).await?;
    let mut set_aside_to = finish_pending_set_aside(store, paths).await?;
    if let Some(dest) = &set_aside_to {
        reporter.report(ProgressEvent::Note {
            message: format!(
                "finished setting the stale artifact aside as {}",
                dest.display()
            ),
        });
    }
    let reasons = stale_reasons(&skel, &store.components().await?, &paths.artifact);
    if !reasons.is_empty() {
        if !opts.rebuild {
            return Err(ConvertError::StaleArtifact {
                dir: paths.artifact.display().to_string(),
                reasons: reasons.join("; "),
            }
            .into());
        }
        let dest = set_aside(store, run, paths, &reasons.join("; ")).await?;
        reporter.report(ProgressEvent::Note {
            message: format!("stale artifact set aside as {}", dest.display()),
        });
        set_aside_to = Some(dest);
    }
    std::fs::create_dir_all(&paths.artifact)
        .map_err(|e| StageError::io("create", &paths.artifact, e))?;
    sync_dir(&paths.out).map_err(|e| StageError::io("fsync", &paths.out, e))?;
    write_atomic(
        &paths.state_dir,
        SKELETON_FILE,
        &serde_json::to_vec(&skel).unwrap_or_default(),
    )?;
    write_atomic(
        &paths.state_dir,
        PLAN_FILE,
        &serde_json::to_vec_pretty(&plan).unwrap_or_default(),
    )?;
    for t in remove_temp_files(&paths.artifact)? {
        tracing::info!("removed stale temp file {}", t.display());
    }
    let mut done = valid_receipts(&skel, store.components().await?, &paths.artifact);
    if opts.retire_sources {
        for bad in block_in_place(|| unhashed_before_retirement(&skel, &done, paths))? {
            reporter.report(ProgressEvent::Note {
                message: format!(
                    "{bad} does not match its receipt's SHA-256; rewriting it before its sources are retired"
                ),
            });
            done.remove(&bad);
        }
    }
    let present = |f: &String| source_present(&paths.source, f);
    let (pending, blocked): (Vec<Component>, Vec<Component>) = plan
        .components
        .iter()
        .filter(|c| !done.contains_key(&c.name))
        .cloned()
        .partition(|c| c.source_files.iter().all(present));
    let total: u64 = skel.manifest.components.iter().map(|c| c.size).sum();
    let todo_bytes: u64 = pending
        .iter()
        .chain(&blocked)
        .map(|c| c.predicted_bytes)
        .sum();
    reporter.report(ProgressEvent::ConvertPlanned {
        components: skel.manifest.components.len(),
        total_bytes: total,
        done_bytes: total.saturating_sub(todo_bytes),
    });
    if opts.preflight && !pending.is_empty() {
        preflight(&plan, &done, paths, opts)?;
    }
    let mut written = 0;
    if !pending.is_empty() {
        let (scales, rest): (Vec<_>, Vec<_>) = pending
            .into_iter()
            .partition(|c| c.kind == ComponentKind::Q3GlobalScale);
        let ctx = Batch {
            store,
            run,
            skel: &skel,
            paths,
            opts,
            reporter,
            sources: Arc::new(Sources::new(&paths.source)),
        };
        written += ctx.write_all(scales, &mut done, BTreeMap::new()).await?;
        let mut g = BTreeMap::new();
        for c in &plan.components {
            if let super::profile::ComponentContent::Q3GlobalScale { layer, .. } = c.content
                && let Some(r) = done.get(&c.name)
            {
                g.insert(
                    layer,
                    block_in_place(|| read_global_scale(&paths.artifact, &c.name, &r.sha256))?,
                );
            }
        }
        written += ctx.write_all(rest, &mut done, g).await?;
    }
    if let Some(c) = blocked.first() {
        // Everything readable was converted; this one needs a retired shard.
        let source_file = c
            .source_files
            .iter()
            .find(|f| !present(f))
            .cloned()
            .unwrap_or_default();
        return Err(ConvertError::SourceRetired {
            component: c.name.clone(),
            run: retired_by(store, &source_file).await?,
            source_file,
        }
        .into());
    }
    let digests = done
        .iter()
        .map(|(p, r)| (p.clone(), r.sha256.clone()))
        .collect();
    let manifest = skel
        .finish(&digests)
        .ok_or_else(|| StageError::InvalidInput {
            what: "manifest",
            message: "a component has no receipt after conversion".into(),
        })?;
    let bytes = manifest.to_bytes();
    let manifest_sha256 = sha256_hex(&bytes);
    write_atomic(&paths.artifact, MANIFEST_FILE, &bytes)?;
    let last = store
        .artifact_log()
        .await?
        .into_iter()
        .rfind(|a| a.event == "manifest");
    if last.and_then(|a| a.manifest_sha256).as_deref() != Some(manifest_sha256.as_str()) {
        store
            .record_manifest(run, &manifest_sha256, &manifest.fingerprint)
            .await?;
    }
    let placement = Placement::generate(&manifest, opts.ram_budget, opts.reserve, skel.top_k);
    let mut pbytes = serde_json::to_vec_pretty(&placement).unwrap_or_default();
    pbytes.push(b'\n');
    write_atomic(&paths.artifact, PLACEMENT_FILE, &pbytes)?;
    let retired_now = if opts.retire_sources {
        retire_eligible(store, run, &skel, &done, &paths.source).await?
    } else {
        Vec::new()
    };
    Ok(ConvertOutcome {
        manifest_sha256,
        fingerprint: manifest.fingerprint,
        components: manifest.components.len(),
        written,
        reused: manifest.components.len() - written,
        total_bytes: total,
        retired: retired_now,
        set_aside: set_aside_to,
        placement,
    })
}

/// True when source file `file` is on disk under `root`.
fn source_present(root: &Path, file: &str) -> bool {
    crate::paths::safe_join(root, file).is_ok_and(|p| p.exists())
}

/// Refuses when the artifact's peak need does not fit the volume.
fn preflight(
    plan: &Plan,
    done: &BTreeMap<String, ComponentReceipt>,
    paths: &ConvertPaths,
    opts: &ConvertOptions,
) -> Result<()> {
    let shards: BTreeMap<String, u64> = plan
        .sources
        .iter()
        .filter(|s| source_present(&paths.source, &s.file))
        .map(|s| (s.file.clone(), s.bytes))
        .collect();
    let done: BTreeSet<String> = done.keys().cloned().collect();
    let needed = artifact_peak(plan, &done, &shards, opts.retire_sources, opts.jobs);
    let available = fs4::available_space(&paths.artifact)
        .map_err(|e| StageError::io("statvfs", &paths.artifact, e))?;
    if needed > available {
        return Err(StageError::InsufficientSpace {
            volume: paths.artifact.clone(),
            available,
            needed,
        });
    }
    Ok(())
}

/// Reused components (checked by size only) that read a shard still on
/// disk and whose file does not hash to their receipt: they are rewritten
/// before `--retire-sources` may delete that shard.
fn unhashed_before_retirement(
    skel: &Skeleton,
    done: &BTreeMap<String, ComponentReceipt>,
    paths: &ConvertPaths,
) -> Result<Vec<String>> {
    let mut bad = Vec::new();
    for (name, r) in done {
        let reads_present = skel.readers.get(name).is_some_and(|files| {
            files
                .iter()
                .any(|f| f.ends_with(".safetensors") && source_present(&paths.source, f))
        });
        if !reads_present {
            continue;
        }
        let path = paths.artifact.join(name);
        let matches = match LfsSha256::parse(&r.sha256) {
            Some(d) => {
                hash_file(&path, &Expected::Sha256(d), r.size)
                    .map_err(|e| StageError::io("read", &path, e))?
                    == r.sha256
            }
            None => false,
        };
        if !matches {
            bad.push(name.clone());
        }
    }
    Ok(bad)
}

/// Retires every weight shard all of whose readers have receipts. The
/// retirement is logged first, then the file is unlinked and its directory
/// fsynced: a crash in between leaves a logged retirement of a file still
/// present, which is harmless (it is counted as retained and retired again).
async fn retire_eligible(
    store: &Store,
    run: RunId,
    skel: &Skeleton,
    done: &BTreeMap<String, ComponentReceipt>,
    source_root: &Path,
) -> Result<Vec<String>> {
    let mut readers: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (c, files) in &skel.readers {
        for f in files {
            readers.entry(f.as_str()).or_default().push(c.as_str());
        }
    }
    let retired = store.retired_sources().await?;
    let mut out = Vec::new();
    for (file, comps) in readers {
        if !file.ends_with(".safetensors") || !comps.iter().all(|c| done.contains_key(*c)) {
            continue;
        }
        let path = crate::paths::safe_join(source_root, file)?;
        let Ok(meta) = std::fs::metadata(&path) else {
            continue;
        };
        // Logged by a run killed before its unlink: finish it, no new row.
        if !retired.contains(file) {
            store
                .log_retirement(run, file, "retired", meta.len())
                .await?;
        }
        std::fs::remove_file(&path).map_err(|e| StageError::io("remove", &path, e))?;
        let dir = path.parent().unwrap_or(source_root);
        sync_dir(dir).map_err(|e| StageError::io("fsync", dir, e))?;
        out.push(file.to_owned());
    }
    Ok(out)
}

/// One batch of components written in parallel.
struct Batch<'a> {
    store: &'a Arc<Store>,
    run: RunId,
    skel: &'a Skeleton,
    paths: &'a ConvertPaths,
    opts: &'a ConvertOptions,
    reporter: &'a dyn Reporter,
    sources: Arc<Sources>,
}

impl Batch<'_> {
    /// Writes `components` up to `jobs` at a time, committing each receipt
    /// as soon as its file is durable. After the first failure no new
    /// component starts; those in flight finish (and get receipts).
    async fn write_all(
        &self,
        components: Vec<Component>,
        done: &mut BTreeMap<String, ComponentReceipt>,
        scales: BTreeMap<u64, Q3GlobalScale>,
    ) -> Result<usize> {
        let failed = Arc::new(AtomicBool::new(false));
        let scales = Arc::new(scales);
        let mut results = futures_util::stream::iter(components)
            .map(|c| {
                let (sources, scales, failed) =
                    (self.sources.clone(), scales.clone(), failed.clone());
                let artifact = self.paths.artifact.clone();
                tokio::task::spawn_blocking(move || {
                    if failed.load(Ordering::SeqCst) {
                        return (c, None);
                    }
                    let r = write_component(&sources, &artifact, &c, &scales);
                    if r.is_err() {
                        failed.store(true, Ordering::SeqCst);
                    }
                    (c, Some(r))
                })
            })
            .buffer_unordered(self.opts.jobs.max(1));
        let mut first_err = None;
        let mut written = 0;
        while let Some(joined) = results.next().await {
            let (c, r) = joined.map_err(|e| StageError::InvalidInput {
                what: "conversion task",
                message: e.to_string(),
            })?;
            match r {
                None => {}
                Some(Err(e)) => {
                    first_err.get_or_insert(e);
                }
                Some(Ok(w)) => {
                    let receipt = ComponentReceipt {
                        path: c.name.clone(),
                        kind: c.kind.as_str().to_owned(),
                        predicted_bytes: c.predicted_bytes,
                        size: w.size,
                        sha256: w.sha256,
                        identity: self
                            .skel
                            .identities
                            .get(&c.name)
                            .cloned()
                            .unwrap_or_default(),
                        run_id: self.run,
                    };
                    self.store.put_component(self.run, &receipt).await?;
                    self.reporter.report(ProgressEvent::ComponentWritten {
                        path: c.name.clone(),
                        kind: c.kind.as_str().to_owned(),
                        size: w.size,
                    });
                    done.insert(c.name.clone(), receipt);
                    written += 1;
                    if self.opts.retire_sources {
                        retire_eligible(self.store, self.run, self.skel, done, &self.paths.source)
                            .await?;
                    }
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(written),
        }
    }
}
