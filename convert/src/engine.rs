//! `convert`: the idempotent conversion stage.
//!
//! The unit of work is a component. Each is written to a temp file,
//! fsynced, renamed, its directory fsynced, and only then its receipt
//! (size, SHA-256, identity) is committed ([`crate::write`]). A restart
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

use tokio::task::block_in_place;

use ftpipe_receipts::{ComponentReceipt, Receipt, RunId, Store};

use crate::aside;
use crate::batch::Batch;
use crate::component::TensorSource;
use crate::error::{ConvertError, Result, RetiredBy};
use crate::options::{ConvertOptions, converter_identity};
use crate::plan::{HeaderSource, Plan, PlanOptions, Planned, SavedHeader, plan};
use crate::profile::{CONFIG_FILE, Component, ComponentContent};
use crate::retire::Retirer;
use crate::skeleton::{Skeleton, files_read, source_identity};
use crate::space::artifact_peak;
use crate::write::{self, Sources};
use ftpipe_artifact::manifest::{MANIFEST_FILE, Manifest, PLACEMENT_FILE, Placement};
use ftpipe_fs::Layout;
use ftpipe_fs::crashpoint::{self, CrashPoint};
use ftpipe_fs::durable::{JsonStyle, remove_temp_files, sync_dir, write_atomic_json};
use ftpipe_hub::resolve::stored_selection;

/// State files under `.ftpipe`, read back only by ftpipe.
pub(crate) const COMPACT: JsonStyle = JsonStyle {
    pretty: false,
    newline: false,
};
/// The plan, kept readable for a user who opens it.
pub(crate) const PRETTY: JsonStyle = JsonStyle {
    pretty: true,
    newline: false,
};
/// Artifact files a runtime reads: indented, newline-terminated.
const PUBLISHED: JsonStyle = JsonStyle {
    pretty: true,
    newline: true,
};
use ftpipe_progress::{ProgressEvent, Reporter};

/// Plan file under the state directory (evidence for audits and bundles).
pub const PLAN_FILE: &str = "plan.json";
pub use crate::skeleton::{MAX_SKELETON_BYTES, SKELETON_FILE};
/// Largest [`PLAN_FILE`] read back (audits, bundles).
pub const MAX_PLAN_BYTES: u64 = 1 << 30;

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
    /// Count and source bytes of the tensors left out (vision, MTP) that
    /// were fetched.
    pub omitted: (usize, u64),
    /// Count of the omitted tensors not fetched (`--exclude`), and the
    /// listed bytes of the files holding them.
    pub not_fetched: (usize, u64),
}

/// True when an artifact made under `before` is an earlier revision of
/// what `now` converts, by the same converter: a repin, rebuilt
/// incrementally ([`crate::rebuild`]) instead of refused.
fn is_repin(before: &Manifest, now: &Manifest) -> bool {
    before.source.repo == now.source.repo
        && before.source.commit != now.source.commit
        && before.converter == now.converter
}

/// Why existing output may not be reused under `skel`. After a repin
/// (same repo and converter, another commit) there is none: components
/// under another identity are kept or converted again.
pub(crate) fn stale_reasons(
    skel: &Skeleton,
    receipts: &[ComponentReceipt],
    artifact: &Path,
) -> Vec<String> {
    let mut reasons = Vec::new();
    if let Ok(bytes) = ftpipe_fs::bounded::read_bounded_nofollow(
        &artifact.join(MANIFEST_FILE),
        ftpipe_artifact::verify::MAX_MANIFEST_BYTES,
    ) && let Ok(m) = serde_json::from_slice::<Manifest>(&bytes)
    {
        let now = &skel.manifest;
        if is_repin(&m, now) {
            return reasons;
        }
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
            // Display only (the identities are compared above, not these
            // strings); a typed converter identity always serializes.
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

/// Components whose receipt has the current identity and whose file has the
/// receipt's size.
pub(crate) fn valid_receipts(
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

/// The headers of a saved skeleton ([`Skeleton::headers`]).
#[derive(serde::Deserialize)]
struct SavedHeaders {
    #[serde(default)]
    headers: BTreeMap<String, SavedHeader>,
}

/// Headers of retired shards absent from `source`, from the saved skeleton.
async fn retired_headers(
    store: &Store,
    paths: &Layout,
    retired: &BTreeSet<String>,
    receipts: &BTreeMap<String, Receipt>,
) -> Result<BTreeMap<String, SavedHeader>> {
    let mut absent = Vec::new();
    for file in retired {
        if !ftpipe_fs::paths::safe_join(paths.source(), file)?.exists() {
            absent.push(file);
        }
    }
    if absent.is_empty() {
        return Ok(BTreeMap::new());
    }
    let path = paths.state_dir().join(SKELETON_FILE);
    // No skeleton yet: no header was saved (a retired shard then fails
    // below as RetiredHeaderMissing). A skeleton that does not read or
    // parse is an error, not "nothing saved". Only the headers are kept:
    // the rest of the skeleton (~85 MB of JSON at 300k tensors) is built
    // again from the plan.
    let saved: BTreeMap<String, SavedHeader> =
        match ftpipe_fs::bounded::read_bounded_nofollow(&path, MAX_SKELETON_BYTES) {
            Ok(bytes) => {
                serde_json::from_slice::<SavedHeaders>(&bytes)
                    .map_err(|source| ConvertError::MalformedState {
                        path: path.clone(),
                        source,
                    })?
                    .headers
            }
            Err(e) if e.is_not_found() => BTreeMap::new(),
            Err(e) => return Err(e.into()),
        };
    let mut out = BTreeMap::new();
    for file in absent {
        // Saved for this version of the file (its receipt's digest) only.
        let digest = receipts.get(file).map(|r| r.digest.as_str());
        match saved
            .get(file)
            .filter(|h| Some(h.digest.as_str()) == digest)
        {
            Some(h) => {
                out.insert(file.clone(), h.clone());
            }
            None => {
                return Err(ConvertError::RetiredHeaderMissing {
                    source_file: file.clone(),
                    run: retired_by(store, file).await?,
                    skeleton: path.display().to_string(),
                });
            }
        }
    }
    Ok(out)
}

/// The run that retired `file`, as the retirement log says.
async fn retired_by(store: &Store, file: &str) -> Result<RetiredBy> {
    Ok(RetiredBy(
        store.last_retirement(file).await?.map(|r| r.run_id),
    ))
}

/// The plan and skeleton of this conversion, from the shards present and,
/// for shards retired since, the headers saved in the last skeleton.
async fn prepare(
    store: &Store,
    paths: &Layout,
    opts: &ConvertOptions,
    retired: &BTreeSet<String>,
) -> Result<Prepared> {
    let pin = store.pin().await?.ok_or_else(|| ConvertError::NotFetched {
        file: CONFIG_FILE.into(),
    })?;
    let receipts = store.receipts_by_path().await?;
    // Judged from receipts: a file is converted from only once published.
    let unfetched: Vec<String> = store
        .files()
        .await?
        .into_iter()
        .filter(|f| f.selected && !receipts.contains_key(&f.path) && !retired.contains(&f.path))
        .map(|f| f.path)
        .collect();
    if !unfetched.is_empty() {
        return Err(ConvertError::SourcesNotFetched {
            count: unfetched.len(),
            files: unfetched,
        });
    }
    let saved = retired_headers(store, paths, retired, &receipts).await?;
    let plan_opts = PlanOptions {
        selection: stored_selection(store).await?,
        ..opts.plan_options()
    };
    let source: HeaderSource<'_> = HeaderSource::Local {
        root: paths.source(),
        saved: &saved,
    };
    let Planned {
        plan,
        config,
        mut headers,
    } = plan(&source, &plan_opts).await?;
    let top_k = crate::profile::experts_per_token(&config)?;
    let converter = converter_identity(&config, opts)?;
    for (file, h) in &mut headers {
        if let Some(r) = receipts.get(file) {
            h.digest.clone_from(&r.digest);
        }
    }
    let source = source_identity(&pin.repo, &pin.commit, &files_read(&plan), &receipts)?;
    let skel = Skeleton::build(&plan, source, converter, top_k, headers)?;
    Ok(Prepared { skel, plan })
}

/// Converts the sources under `paths.source()` into `paths.artifact()`.
pub async fn convert(
    store: &Arc<Store>,
    run: RunId,
    paths: &Layout,
    opts: &ConvertOptions,
    reporter: &dyn Reporter,
) -> Result<ConvertOutcome> {
    let retired = store.retired().await?;
    let Prepared { skel, plan } = prepare(store, paths, opts, &retired).await?;
    // Shared with the write tasks, which take components by index: a copy
    // of the pending components would double the plan's source spans.
    let plan = Arc::new(plan);
    let set_aside_to =
        settle_stale_artifact(store, run, paths, opts, &skel, &plan, reporter).await?;
    open_artifact(store, paths, &skel, &plan).await?;
    crate::rebuild::keep_unchanged(store, run, paths, (&skel, &plan), reporter).await?;
    crate::rebuild::forget_superseded(store, &skel).await?;
    let mut done = valid_receipts(&skel, store.components().await?, paths.artifact());
    let punched = punched_sources(store).await?;
    let (pending, blocked) = split_blocked(&plan, &done, paths.source(), &punched);
    let total = report_planned(&skel, &plan, &pending, &blocked, reporter);
    if opts.preflight && !pending.is_empty() {
        let excluded = done
            .keys()
            .cloned()
            .chain(blocked.iter().map(|&i| plan.components[i].name.clone()))
            .collect();
        preflight(&plan, &excluded, paths, opts)?;
    }
    let sources = Arc::new(Sources::new(paths.source()));
    check_pending_lookups(&plan, &pending, &sources)?;
    let retirer = Retirer::default();
    let ctx = Batch {
        store,
        run,
        skel: &skel,
        paths,
        opts,
        reporter,
        sources,
        retirer: &retirer,
    };
    let mut written = ctx.write_pending(pending, &plan, &mut done).await?;
    if opts.retire_sources {
        written += retire_rewriting_corrupt(&ctx, &plan, &mut done).await?;
    }
    if let Some(&i) = blocked.first() {
        let c = &plan.components[i];
        if let Some(f) = c.source_files.iter().find(|f| punched.contains(*f)) {
            return Err(ConvertError::SourcePunched {
                component: c.name.clone(),
                source_file: f.clone(),
            });
        }
        // Everything readable was converted; this one needs a retired shard
        // (itself, or through its table's global scale).
        let (component, source_file) = needs_retired(&plan.components[i], &plan, paths.source());
        return Err(ConvertError::SourceRetired {
            component,
            run: retired_by(store, &source_file).await?,
            source_file,
        });
    }
    let (manifest_sha256, manifest, placement) =
        write_manifest(store, run, paths, opts, skel, &done).await?;
    Ok(ConvertOutcome {
        manifest_sha256,
        fingerprint: manifest.fingerprint,
        components: manifest.components.len(),
        written,
        reused: manifest.components.len() - written,
        total_bytes: total,
        retired: retirer.retired(),
        set_aside: set_aside_to,
        placement,
        omitted: plan.omitted_totals(),
        not_fetched: plan.not_fetched_totals(),
    })
}

/// Finishes a set-aside an earlier run began (saying so), and returns
/// where it went with the reasons the artifact on disk may not be reused
/// under `skel` (none: it may).
pub(crate) async fn finish_pending_aside(
    store: &Store,
    paths: &Layout,
    skel: &Skeleton,
    reporter: &dyn Reporter,
) -> Result<(Option<PathBuf>, Vec<String>)> {
    let finished = aside::finish_pending(store, paths).await?;
    if let Some(dest) = &finished {
        reporter.report(ProgressEvent::Note {
            message: format!(
                "finished setting the stale artifact aside as {}",
                dest.display()
            ),
        });
    }
    let reasons = stale_reasons(skel, &store.components().await?, paths.artifact());
    Ok((finished, reasons))
}

/// Finishes a set-aside an earlier run began, then refuses, or sets aside
/// (`--rebuild`), an artifact `skel` may not reuse. Returns where the
/// artifact was set aside, if it was.
async fn settle_stale_artifact(
    store: &Store,
    run: RunId,
    paths: &Layout,
    opts: &ConvertOptions,
    skel: &Skeleton,
    plan: &Plan,
    reporter: &dyn Reporter,
) -> Result<Option<PathBuf>> {
    let (finished, reasons) = finish_pending_aside(store, paths, skel, reporter).await?;
    if reasons.is_empty() {
        return Ok(finished);
    }
    // A rebuild rewrites everything: refuse before setting anything
    // aside if a shard it needs is gone.
    if let Some(c) = plan.components.iter().find(|c| {
        c.source_files
            .iter()
            .any(|f| !source_present(paths.source(), f))
    }) {
        let (component, source_file) = needs_retired(c, plan, paths.source());
        return Err(ConvertError::RebuildNeedsSources {
            dir: paths.artifact().display().to_string(),
            reasons: reasons.join("; "),
            component,
            run: retired_by(store, &source_file).await?,
            source_file,
        });
    }
    let dest =
        aside::refuse_or_set_aside(store, run, paths, opts.rebuild, &reasons, reporter).await?;
    Ok(Some(dest))
}

/// Creates the artifact directory, writes the skeleton and the plan, and
/// removes stale temp files (and, first, the span claims naming them).
async fn open_artifact(store: &Store, paths: &Layout, skel: &Skeleton, plan: &Plan) -> Result<()> {
    std::fs::create_dir_all(paths.artifact())
        .map_err(|e| ConvertError::io("create", paths.artifact(), e))?;
    sync_dir(paths.dir()).map_err(|e| ConvertError::io("fsync", paths.dir(), e))?;
    write_atomic_json(paths.state_dir(), SKELETON_FILE, skel, COMPACT)?;
    crashpoint::hit(CrashPoint::SkeletonWritten);
    write_atomic_json(paths.state_dir(), PLAN_FILE, plan, PRETTY)?;
    // Span claims name bytes in temp files about to be removed: they go
    // first, so none outlives its file.
    store.forget_all_spans().await?;
    for t in remove_temp_files(paths.artifact())? {
        tracing::info!("removed stale temp file {}", t.display());
    }
    Ok(())
}

/// Reports the artifact's size and the bytes already done (everything but
/// `pending` and `blocked`); returns the artifact's size.
fn report_planned(
    skel: &Skeleton,
    plan: &Plan,
    pending: &[usize],
    blocked: &[usize],
    reporter: &dyn Reporter,
) -> u64 {
    let total: u64 = skel.manifest.components.iter().map(|c| c.size).sum();
    let todo_bytes: u64 = pending
        .iter()
        .chain(blocked)
        .map(|&i| plan.components[i].predicted_bytes)
        .sum();
    reporter.report(ProgressEvent::ConvertPlanned {
        components: skel.manifest.components.len(),
        total_bytes: total,
        done_bytes: total.saturating_sub(todo_bytes),
    });
    total
}

/// Checks the lookup buffers the config fixes before anything is written:
/// a wrong one leaves no component from those sources behind, so the run
/// resumes on fixed sources without --rebuild.
fn check_pending_lookups(plan: &Plan, pending: &[usize], sources: &Sources) -> Result<()> {
    for &i in pending {
        if let ComponentContent::Ftw { tensors } = &plan.components[i].content {
            for t in tensors {
                if let TensorSource::Checked(chk) = &t.source {
                    block_in_place(|| write::check_lookup(sources, chk))?;
                }
            }
        }
    }
    Ok(())
}

/// Retires the sources [`Retirer::retire_eligible`] finds eligible, until
/// no component it checks fails its receipt's SHA-256: such a component is
/// rewritten first. Returns how many components were rewritten.
async fn retire_rewriting_corrupt(
    ctx: &Batch<'_>,
    plan: &Arc<Plan>,
    done: &mut BTreeMap<String, ComponentReceipt>,
) -> Result<usize> {
    let mut rewritten = 0;
    loop {
        ctx.retirer
            .retire_eligible(ctx.store, ctx.run, ctx.skel, done, ctx.paths)
            .await?;
        let corrupt = ctx.retirer.take_corrupt();
        if corrupt.is_empty() {
            return Ok(rewritten);
        }
        for c in &corrupt {
            ctx.reporter.report(ProgressEvent::Note {
                message: format!(
                    "{c} does not match its receipt's SHA-256; rewriting it before its sources are retired"
                ),
            });
            done.remove(c);
        }
        let punched = punched_sources(ctx.store).await?;
        let (_, blocked) = split_blocked(plan, done, ctx.paths.source(), &punched);
        if let Some(c) = blocked
            .iter()
            .map(|&i| &plan.components[i])
            .find(|c| corrupt.contains(&c.name))
            && let Some(f) = c.source_files.iter().find(|f| punched.contains(*f))
        {
            return Err(ConvertError::SourcePunched {
                component: c.name.clone(),
                source_file: f.clone(),
            });
        }
        let again = (0..plan.components.len())
            .filter(|&i| corrupt.contains(&plan.components[i].name))
            .collect();
        rewritten += ctx.write_pending(again, plan, done).await?;
    }
}

/// Writes `manifest.json` from `skel` and the receipts in `done` (every
/// component's), records it, then writes `placement.json`.
pub(crate) async fn write_manifest(
    store: &Store,
    run: RunId,
    paths: &Layout,
    opts: &ConvertOptions,
    skel: Skeleton,
    done: &BTreeMap<String, ComponentReceipt>,
) -> Result<(String, Manifest, Placement)> {
    let digests = done
        .iter()
        .map(|(p, r)| (p.clone(), r.sha256.clone()))
        .collect();
    let top_k = skel.top_k;
    let manifest = skel.finish(&digests)?;
    // The same bytes as Manifest::to_bytes, streamed.
    let manifest_sha256 = write_atomic_json(paths.artifact(), MANIFEST_FILE, &manifest, PUBLISHED)?;
    crashpoint::hit(CrashPoint::ManifestWritten);
    let last = store.last_manifest().await?;
    if last.and_then(|a| a.manifest_sha256).as_deref() != Some(manifest_sha256.as_str()) {
        store
            .record_manifest(run, &manifest_sha256, &manifest.fingerprint)
            .await?;
    }
    crashpoint::hit(CrashPoint::ManifestRecorded);
    let placement = Placement::generate(&manifest, opts.ram_budget, opts.reserve, top_k);
    write_atomic_json(paths.artifact(), PLACEMENT_FILE, &placement, PUBLISHED)?;
    Ok((manifest_sha256, manifest, placement))
}

/// Sources a budgeted run punched down to their PLE spans (a live punch
/// of the version their receipt names): only Q3 components may read them.
async fn punched_sources(store: &Store) -> Result<BTreeSet<String>> {
    let receipts = store.receipts_by_path().await?;
    Ok(store
        .punches()
        .await?
        .into_values()
        .filter(|p| receipts.get(&p.path).is_some_and(|r| r.digest == p.digest))
        .map(|p| p.path)
        .collect())
}

/// Components without a valid receipt, as indices into `plan.components`:
/// those that can be written now, and those that cannot because a shard
/// they read was retired, or punched down to its PLE spans when they are
/// not Q3 components — a Q3 segment also when its table's global scale
/// cannot be written.
fn split_blocked(
    plan: &Plan,
    done: &BTreeMap<String, ComponentReceipt>,
    source: &Path,
    punched: &BTreeSet<String>,
) -> (Vec<usize>, Vec<usize>) {
    let (pending, mut blocked): (Vec<usize>, Vec<usize>) = plan
        .components
        .iter()
        .enumerate()
        .filter(|(_, c)| !done.contains_key(&c.name))
        .map(|(i, _)| i)
        .partition(|&i| {
            let c = &plan.components[i];
            let q3 = matches!(
                c.content,
                ComponentContent::Q3Segment { .. } | ComponentContent::Q3GlobalScale { .. }
            );
            c.source_files
                .iter()
                .all(|f| source_present(source, f) && (q3 || !punched.contains(f)))
        });
    let blocked_scales: BTreeSet<u64> = blocked
        .iter()
        .filter_map(|&i| match plan.components[i].content {
            ComponentContent::Q3GlobalScale { layer, .. } => Some(layer),
            _ => None,
        })
        .collect();
    let (stuck, pending): (Vec<usize>, Vec<usize>) =
        pending.into_iter().partition(|&i| {
            matches!(plan.components[i].content, ComponentContent::Q3Segment { layer, .. } if blocked_scales.contains(&layer))
        });
    blocked.extend(stuck);
    (pending, blocked)
}

/// The component and retired shard to name for blocked component `c`.
fn needs_retired(c: &Component, plan: &Plan, source: &Path) -> (String, String) {
    let absent = |c: &Component| {
        c.source_files
            .iter()
            .find(|f| !source_present(source, f))
            .cloned()
    };
    if let Some(f) = absent(c) {
        return (c.name.clone(), f);
    }
    // A segment blocked by its scale: name the scale and its shard.
    let scale = plan.components.iter().find(|s| {
        matches!(
            (&s.content, &c.content),
            (ComponentContent::Q3GlobalScale { layer: a, .. }, ComponentContent::Q3Segment { layer: b, .. })
                if a == b
        )
    });
    match scale.and_then(|s| absent(s).map(|f| (s.name.clone(), f))) {
        Some(named) => named,
        None => (c.name.clone(), String::new()),
    }
}

/// True when source file `file` is on disk under `root`.
fn source_present(root: &Path, file: &str) -> bool {
    ftpipe_fs::paths::safe_join(root, file).is_ok_and(|p| p.exists())
}

/// Refuses when the artifact's peak need does not fit the volume.
fn preflight(
    plan: &Plan,
    excluded: &BTreeSet<String>,
    paths: &Layout,
    opts: &ConvertOptions,
) -> Result<()> {
    let shards: BTreeMap<String, u64> = plan
        .sources
        .iter()
        .filter(|s| source_present(paths.source(), &s.file))
        .map(|s| (s.file.clone(), s.bytes))
        .collect();
    let needed = artifact_peak(plan, excluded, &shards, opts.retire_sources, opts.jobs);
    ftpipe_fs::require_space(paths.artifact(), needed)?;
    Ok(())
}
