//! `plan`: the exact size of every output component before anything is
//! written, and with a disk budget the schedule of fetch, conversion and
//! retirement under it ([`ftpipe_convert::schedule`]). Read-only: it never
//! takes the lock or writes to DIR.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use ftpipe_convert::plan::CONVERSION_FILES;
use ftpipe_convert::rebuild::{RebuildPreview, repin_fates};
use ftpipe_convert::schedule::{BudgetReport, Workload};
use ftpipe_convert::{ConvertOptions, HeaderSource, Plan, PlanOptions, Planned, Published};
use ftpipe_hub::client::Token;
use ftpipe_hub::resolve::{FetchSelection, apply_selection, stored_selection};
use ftpipe_receipts::{FileRow, Pin, SelectionGlobs};
use serde::Serialize;

use crate::endpoint::open_origin;
use crate::error::{PipelineError, Result};
use crate::origin::{Origin, OriginFiles};
use crate::{Layout, open_existing};

/// Where the plan reads its sources from.
#[derive(Debug, Clone)]
pub enum PlanSource {
    /// The sources already in `DIR/source/`.
    Local,
    /// Only the safetensors headers, over HTTP Range from the hub.
    Remote {
        /// Hub endpoint.
        endpoint: String,
        /// Bearer token (never stored).
        token: Option<Token>,
        /// Per-read stall timeout.
        read_timeout: Duration,
        /// Refuse every request (`HF_HUB_OFFLINE=1` / `--offline`).
        offline: bool,
    },
    /// Only the safetensors headers, over ranged gets from a mirror in
    /// object storage (`--endpoint s3://BUCKET/PREFIX`).
    Mirror(crate::MirrorParams),
}

impl PlanSource {
    /// The origin a remote plan reads from (`None`: a local plan).
    fn origin(&self) -> Result<Option<Arc<dyn Origin>>> {
        match self {
            PlanSource::Local => Ok(None),
            PlanSource::Remote {
                endpoint,
                token,
                read_timeout,
                offline,
            } => open_origin(
                None,
                endpoint,
                token.clone(),
                *read_timeout,
                None,
                *offline,
                false,
            )
            .map(Some),
            PlanSource::Mirror(p) => {
                open_origin(Some(p), "", None, Duration::ZERO, None, false, false).map(Some)
            }
        }
    }
}

/// The commit, listing and selection of `out`'s pin when it is for
/// `repo` at `revision`.
async fn stored_pin(
    out: &Path,
    repo: &str,
    revision: &str,
) -> Result<Option<(String, Vec<FileRow>, FetchSelection)>> {
    match open_existing(out).await {
        Ok((_, store)) => Ok(match store.pin().await? {
            Some(p) if p.repo == repo && p.revision == revision => Some((
                p.commit,
                store.files().await?,
                stored_selection(&store).await?,
            )),
            _ => None,
        }),
        Err(PipelineError::NoState { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// A plan and, when a disk budget was given, its schedule under it.
#[derive(Debug, Clone, Serialize)]
pub struct PlanReport {
    /// The plan.
    #[serde(flatten)]
    pub plan: Plan,
    /// The schedule's figures under `--disk-budget`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk_budget: Option<BudgetReport>,
    /// With `--repin`, what the repin of DIR's artifact fetches and
    /// converts again.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub repin: Option<RepinReport>,
}

/// What `run --repin` will do to DIR, known before anything is fetched.
#[derive(Debug, Clone, Serialize)]
pub struct RepinReport {
    /// The commit DIR's artifact was made from.
    pub from_commit: String,
    /// The commit the revision points to now.
    pub to_commit: String,
    /// Selected files the repin fetches (changed, new, or without a
    /// receipt); a file whose size and digests are unchanged is kept.
    pub fetch_files: Vec<String>,
    /// Their bytes.
    pub fetch_bytes: u64,
    /// Of them, the bytes of files the listing names with a Xet hash: a
    /// term of theirs whose chunks the old files hold is read back from
    /// them and checked, not fetched, so the CAS sends at most these (what
    /// it does send is known per term once the fetch asks).
    pub xet_fetch_bytes: u64,
    /// Every component of the new plan with its fate.
    #[serde(flatten)]
    pub rebuild: RebuildPreview,
}

/// The selected files of `listing` that a repin from `stored` (with
/// download receipts for `published`) fetches.
fn files_to_fetch<'l>(
    listing: &'l [FileRow],
    stored: &[FileRow],
    published: &BTreeSet<String>,
) -> Vec<&'l FileRow> {
    listing
        .iter()
        .filter(|f| f.selected)
        .filter(|f| {
            !published.contains(&f.path)
                || !stored.iter().any(|s| {
                    s.path == f.path
                        && s.size == f.size
                        && s.git_oid == f.git_oid
                        && s.lfs_sha256 == f.lfs_sha256
                })
        })
        .collect()
}

/// What a repin of `out` to `commit` fetches and converts again (`None`
/// when `out` has no state or no artifact planned from another commit).
async fn repin_report(
    out: &Path,
    (repo, commit): (&str, &str),
    planned: &Planned,
    listing: &[FileRow],
    opts: &PlanOptions,
) -> Result<Option<RepinReport>> {
    let (layout, store) = match open_existing(out).await {
        Ok(opened) => opened,
        Err(PipelineError::NoState { .. }) => return Ok(None),
        Err(e) => return Err(e),
    };
    let convert_opts = ConvertOptions {
        protect: opts.protect.clone(),
        recipe: opts.recipe.clone(),
        ..ConvertOptions::default()
    };
    let Some((old, rebuild)) = repin_fates(
        &store,
        &layout,
        (repo, commit),
        planned,
        listing,
        &convert_opts,
    )
    .await?
    else {
        return Ok(None);
    };
    let stored = store.files().await?;
    let published = store.published_paths().await?;
    let fetch = files_to_fetch(listing, &stored, &published);
    Ok(Some(RepinReport {
        from_commit: old.source().commit.clone(),
        to_commit: commit.to_owned(),
        fetch_bytes: fetch.iter().map(|f| f.size).sum(),
        xet_fetch_bytes: fetch
            .iter()
            .filter(|f| f.xet_hash.is_some())
            .map(|f| f.size)
            .sum(),
        fetch_files: fetch.into_iter().map(|f| f.path.clone()).collect(),
        rebuild,
    }))
}

/// Plans the conversion of `repo` at `revision` into `out`, and with
/// `disk_budget` its schedule (a budget below the minimum is an error
/// naming it). A remote plan
/// reuses the pin of `out` when it is for the same repo and revision, and
/// otherwise resolves the commit without writing anything. Shards the
/// fetch selection leaves out are not read: `globs` when it has any, else
/// the selection stored with the pin of `out`. With `repin` a remote plan
/// resolves the revision's commit now and reports what a repin of `out`
/// to it fetches and converts again.
#[allow(clippy::too_many_arguments)]
pub async fn plan(
    out: &Path,
    repo: &str,
    revision: &str,
    source: PlanSource,
    globs: &SelectionGlobs,
    opts: &PlanOptions,
    disk_budget: Option<u64>,
    repin: bool,
) -> Result<PlanReport> {
    let (planned, listing, commit) =
        plan_with_listing(out, (repo, revision), source, globs, opts, repin).await?;
    let repin = match commit.filter(|_| repin) {
        Some(commit) => repin_report(out, (repo, &commit), &planned, &listing, opts).await?,
        None => None,
    };
    let plan = planned.plan;
    let disk_budget = match disk_budget {
        Some(budget) => {
            let resident = resident_bytes(&plan, &listing, &Layout::new(out));
            let release = ftpipe_convert::keep::Release::probe(out);
            Some(Workload::of_plan(&plan, resident, release).report(budget)?)
        }
        None => None,
    };
    Ok(PlanReport {
        plan,
        disk_budget,
        repin,
    })
}

/// Bytes of the selected files that are not planned shards (config,
/// index, tokenizer, ...): fetched and never retired. Without a listing
/// (a local plan of a directory ftpipe did not fetch), the files every
/// conversion reads, as found in `source/`.
pub(crate) fn resident_bytes(plan: &Plan, listing: &[FileRow], layout: &Layout) -> u64 {
    let shard = |p: &str| plan.sources.iter().any(|s| s.file == p);
    if listing.is_empty() {
        return CONVERSION_FILES
            .iter()
            .filter_map(|f| ftpipe_fs::paths::safe_join(layout.source(), f).ok())
            .filter_map(|p| std::fs::symlink_metadata(p).ok())
            .filter(std::fs::Metadata::is_file)
            .map(|m| m.len())
            .sum();
    }
    listing
        .iter()
        .filter(|f| f.selected && !shard(&f.path))
        .map(|f| f.size)
        .sum()
}

/// [`plan`] without the schedule, with the listing it planned for (empty
/// for a local plan of a directory without state) and, for a remote plan,
/// the commit. `repin` resolves the commit even when `out` has a pin.
async fn plan_with_listing(
    out: &Path,
    (repo, revision): (&str, &str),
    source: PlanSource,
    globs: &SelectionGlobs,
    opts: &PlanOptions,
    repin: bool,
) -> Result<(Planned, Vec<FileRow>, Option<String>)> {
    let with_selection = |mut listing: Vec<FileRow>, stored: Option<FetchSelection>| {
        let selection = if globs.include.is_empty() && globs.exclude.is_empty() {
            stored.unwrap_or_default()
        } else {
            apply_selection(&mut listing, &globs.include, &globs.exclude)?;
            FetchSelection::of(&listing, globs)
        };
        Ok::<_, PipelineError>((
            listing,
            PlanOptions {
                selection,
                ..opts.clone()
            },
        ))
    };
    let Some(origin) = source.origin()? else {
        let (listing, stored) = match open_existing(out).await {
            Ok((_, store)) => (store.files().await?, Some(stored_selection(&store).await?)),
            Err(PipelineError::NoState { .. }) => (Vec::new(), None),
            Err(e) => return Err(e),
        };
        let (listing, opts) = with_selection(listing, stored)?;
        let layout = Layout::new(out);
        let planned = ftpipe_convert::plan(&HeaderSource::local(layout.source()), &opts).await?;
        return Ok((planned, listing, None));
    };
    let pinned = if origin.plan_reuses_stored_pin() && !repin {
        stored_pin(out, repo, revision).await?
    } else {
        None
    };
    let (commit, listing, stored) = match pinned {
        Some((commit, listing, stored)) => (commit, listing, Some(stored)),
        None => {
            let (commit, listing) = origin.listing(repo, revision).await?;
            (commit, listing, None)
        }
    };
    let (listing, opts) = with_selection(listing, stored)?;
    let pin = Pin {
        repo: repo.to_owned(),
        revision: revision.to_owned(),
        commit: commit.clone(),
        endpoint: String::new(),
    };
    let remote = OriginFiles {
        origin: origin.as_ref(),
        pin: &pin,
    };
    let published = Published::none();
    let source = HeaderSource::Remote {
        remote: &remote,
        listing: &listing,
        published: &published,
    };
    let planned = ftpipe_convert::plan(&source, &opts).await?;
    Ok((planned, listing, Some(commit)))
}
