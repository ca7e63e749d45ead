//! `plan`: the exact size of every output component before anything is
//! written, and with a disk budget the schedule of fetch, conversion and
//! retirement under it ([`ftpipe_convert::schedule`]). Read-only: it never
//! takes the lock or writes to DIR.

use std::path::Path;
use std::time::Duration;

use ftpipe_convert::plan::CONVERSION_FILES;
use ftpipe_convert::schedule::{BudgetReport, Workload};
use ftpipe_convert::{HeaderSource, Plan, PlanOptions, Published};
use ftpipe_hub::client::{HubClient, Token};
use ftpipe_hub::remote::PinnedRepo;
use ftpipe_hub::resolve::{
    FetchSelection, apply_selection, list_tree, revision_commit, stored_selection,
};
use ftpipe_receipts::{FileRow, SelectionGlobs};
use serde::Serialize;

use crate::error::{PipelineError, Result};
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

/// A plan and, when a disk budget was given, its schedule under it.
#[derive(Debug, Clone, Serialize)]
pub struct PlanReport {
    /// The plan.
    #[serde(flatten)]
    pub plan: Plan,
    /// The schedule's figures under `--disk-budget`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk_budget: Option<BudgetReport>,
}

/// Plans the conversion of `repo` at `revision` into `out`, and with
/// `disk_budget` its schedule (a budget below the minimum is an error
/// naming it). A remote plan
/// reuses the pin of `out` when it is for the same repo and revision, and
/// otherwise resolves the commit without writing anything. Shards the
/// fetch selection leaves out are not read: `globs` when it has any, else
/// the selection stored with the pin of `out`.
pub async fn plan(
    out: &Path,
    repo: &str,
    revision: &str,
    source: PlanSource,
    globs: &SelectionGlobs,
    opts: &PlanOptions,
    disk_budget: Option<u64>,
) -> Result<PlanReport> {
    let (plan, listing) = plan_with_listing(out, repo, revision, source, globs, opts).await?;
    let disk_budget = match disk_budget {
        Some(budget) => {
            let resident = resident_bytes(&plan, &listing, &Layout::new(out));
            Some(Workload::of_plan(&plan, resident).report(budget)?)
        }
        None => None,
    };
    Ok(PlanReport { plan, disk_budget })
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
/// for a local plan of a directory without state).
async fn plan_with_listing(
    out: &Path,
    repo: &str,
    revision: &str,
    source: PlanSource,
    globs: &SelectionGlobs,
    opts: &PlanOptions,
) -> Result<(Plan, Vec<FileRow>)> {
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
    match source {
        PlanSource::Local => {
            let (listing, stored) = match open_existing(out).await {
                Ok((_, store)) => (store.files().await?, Some(stored_selection(&store).await?)),
                Err(PipelineError::NoState { .. }) => (Vec::new(), None),
                Err(e) => return Err(e),
            };
            let (listing, opts) = with_selection(listing, stored)?;
            let layout = Layout::new(out);
            let plan = ftpipe_convert::plan(&HeaderSource::local(layout.source()), &opts)
                .await?
                .plan;
            Ok((plan, listing))
        }
        PlanSource::Remote {
            endpoint,
            token,
            read_timeout,
            offline,
        } => {
            let client = HubClient::new(&endpoint, token, read_timeout)?;
            let client = if offline {
                client.into_offline()
            } else {
                client
            };
            let pinned = match open_existing(out).await {
                Ok((_, store)) => match store.pin().await? {
                    Some(p) if p.repo == repo && p.revision == revision => Some((
                        p.commit,
                        store.files().await?,
                        stored_selection(&store).await?,
                    )),
                    _ => None,
                },
                Err(PipelineError::NoState { .. }) => None,
                Err(e) => return Err(e),
            };
            let (commit, listing, stored) = match pinned {
                Some((commit, listing, stored)) => (commit, listing, Some(stored)),
                None => {
                    let commit = revision_commit(&client, repo, revision).await?;
                    let listing = list_tree(&client, repo, &commit).await?;
                    (commit, listing, None)
                }
            };
            let (listing, opts) = with_selection(listing, stored)?;
            let remote = PinnedRepo {
                client: &client,
                repo,
                commit: &commit,
            };
            let published = Published::none();
            let source = HeaderSource::Remote {
                remote: &remote,
                listing: &listing,
                published: &published,
            };
            let plan = ftpipe_convert::plan(&source, &opts).await?.plan;
            Ok((plan, listing))
        }
        PlanSource::Mirror(p) => {
            let mirror = crate::mirror::Mirror::open(&p)?;
            let (commit, listing) = mirror.listing_for(repo, revision).await?;
            let (listing, opts) = with_selection(listing, None)?;
            let remote = mirror.files(&commit);
            let published = Published::none();
            let source = HeaderSource::Remote {
                remote: &remote,
                listing: &listing,
                published: &published,
            };
            let plan = ftpipe_convert::plan(&source, &opts).await?.plan;
            Ok((plan, listing))
        }
    }
}
