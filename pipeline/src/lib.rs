//! The durable pipeline: directory layout, locking, stage order and the
//! stage-event log.
//!
//! A command opens the output directory (taking the lock and starting a
//! run), then runs stages in order. Each stage is bracketed by `started` and
//! `completed`/`failed` events appended through [`state::StageState::record`],
//! the same function `status` replays, so what is shown is what is logged.
//!
//! It composes the stage crates: [`ftpipe_hub`] (resolve),
//! [`ftpipe_fetch`] (the transfer), [`ftpipe_convert`] (plan and convert),
//! and holds what looks across all of them (audit, bundle).
//!
//! Start reading at `run` ([`Pipeline::run`]): the whole chain.
//!
//! - this file: [`Pipeline`] (open, lock, `stage()` bracketing), the
//!   resolve and fetch stages, `status`.
//! - `run`: the plan, convert and verify stages and the whole `run`;
//!   `streamed`: the pipelined `run` (online, `--disk-budget`), the fetch
//!   driving the conversion.
//! - [`state`]: stage status as a pure function of the event log.
//! - [`audit`]: the byte ledger, receipts and artifact log against the
//!   disk; [`bundle`]: the evidence in one archive.
//! - `lock`: one ftpipe per output directory.
//! - `plan`: the read-only `plan` command.
//! - `origin`: where a repo's pin, listing and bytes come from (the
//!   `Origin` seam, held as `Arc<dyn Origin>`: the hub, a mirror);
//!   `endpoint`: [`Endpoint`], the one reading of `--endpoint`, and the one
//!   place the origin it names is built; `mirror`: a hub
//!   checkpoint in object storage, written through an output target
//!   (`mirror`, `mirror_to`) and read back (an origin); `s3source`: object
//!   storage behind the fetch's byte-source seam (mirrors and `pull`).
//! - `publish`: an artifact into an output target (`publish`,
//!   `publish_to`), every request through [`ftpipe_objstore::OutputTarget`]
//!   and recorded in the target-neutral upload records (mirror's uploads
//!   too); `part_plan`: each upload's part size and parts in flight, the
//!   user's or chosen from the object's size; `pull`: a published artifact through the fetch machinery
//!   (`pull`).
//! - `modelpack`: an artifact as a CNCF ModelPack manifest and config, and
//!   a ModelPack manifest read back and checked; `publish_oci`: an
//!   artifact into an OCI registry (`publish_oci`: blobs through the
//!   output target, the manifest by digest, then the tag); `pull_oci`: a
//!   ModelPack artifact from a registry (the tag pinned to its manifest
//!   digest) through the fetch machinery, from `ocisource` (a registry's
//!   blobs behind the byte-source seam).
//! - `error`: [`PipelineError`].

// Unit tests see every dev-dependency; the lint is for the library itself.
#![cfg_attr(test, allow(unused_crate_dependencies))]
// Unit tests build their inputs with plain `std::fs` calls (clippy.toml).
#![cfg_attr(test, allow(clippy::disallowed_methods))]

pub mod audit;
pub mod bundle;
mod endpoint;
mod error;
mod lock;
mod mirror;
mod modelpack;
mod ocisource;
mod origin;
mod part_plan;
mod plan;
mod publish;
mod publish_oci;
mod pull;
mod pull_oci;
mod run;
mod s3source;
pub mod state;
mod streamed;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio::sync::Mutex;

use crate::audit::{AuditReport, audit};
use crate::bundle::{BundleSummary, write_bundle};
use ftpipe_fetch::{ChunkReuse, FetchCtx, FetchOptions, ReconcileReport, fetch, reconcile};
use ftpipe_fs::FsError;
pub use ftpipe_fs::Layout;
use ftpipe_fs::crashpoint::{self, CrashPoint};
use ftpipe_hub::client::Token;
use ftpipe_hub::hfcache::HfCache;
use ftpipe_hub::resolve::{ResolveRequest, Resolved};
use ftpipe_progress::{Phase, ProgressEvent, Reporter};
use ftpipe_receipts::{Pin, ReadOnlyStore, RetirementEvent, RunId, StageEvent, Store};

pub use endpoint::Endpoint;
pub use error::{PipelineError, Result};
pub use ftpipe_receipts::{SelectionGlobs, Stage};
pub use lock::{DirLock, LiveRun};
pub use mirror::{MirrorOutcome, MirrorParams};
use origin::Origin;
pub use plan::{PlanReport, PlanSource, RepinReport, plan};
pub use publish::{PublishOutcome, PublishParams};
pub use publish_oci::{OciPublishOutcome, OciPublishParams};
pub use pull::{PullOutcome, PullParams, is_pull_pin, parse_remote_manifest};
pub use pull_oci::OciPullParams;
pub use run::RunOutcome;
use state::StageState;

/// Everything `fetch` needs from the command line.
#[derive(Debug, Clone)]
pub struct FetchParams {
    /// Hub endpoint.
    pub endpoint: String,
    /// Bearer token (never stored).
    pub token: Option<Token>,
    /// Revision request.
    pub resolve: ResolveRequest,
    /// Per-read stall timeout.
    pub read_timeout: Duration,
    /// Transfer tunables.
    pub options: FetchOptions,
    /// Fetch sources retired by `convert --retire-sources` again.
    pub reacquire: bool,
    /// A Hugging Face cache to take pinned files from first.
    pub hf_cache: Option<HfCache>,
    /// No network at all (`HF_HUB_OFFLINE=1` / `--offline`).
    pub offline: bool,
    /// Read the repo from this mirror in object storage instead of the hub
    /// (`--endpoint s3://BUCKET/PREFIX`).
    pub mirror: Option<MirrorParams>,
    /// Files the listing names with a Xet hash come from Xet storage (off:
    /// `--no-xet` / `HF_HUB_DISABLE_XET=1`: all through `resolve`).
    pub xet: bool,
    /// Another output directory whose fetched files' Xet chunks may be
    /// reused (`--reuse-from`; its state database is only read).
    pub reuse_from: Option<PathBuf>,
}

impl FetchParams {
    /// The origin these name: the mirror when one is given, else the hub.
    pub(crate) fn origin(&self) -> Result<Arc<dyn Origin>> {
        endpoint::open_origin(
            self.mirror.as_ref(),
            &self.endpoint,
            self.token.clone(),
            self.read_timeout,
            self.hf_cache.clone(),
            self.offline,
            self.xet,
        )
    }
}

/// What a finished fetch reports.
#[derive(Debug, Clone, Serialize)]
pub struct FetchOutcome {
    /// The pin in force.
    pub pin: Pin,
    /// Set when the branch moved and the pin was kept.
    pub branch_moved_to: Option<String>,
    /// Start-of-run reconciliation.
    pub reconcile: ReconcileReport,
    /// The audit after the fetch.
    pub audit: AuditReport,
}

/// An open output directory with its lock, store and current run.
pub struct Pipeline {
    layout: Layout,
    store: Arc<Store>,
    run: RunId,
    states: Mutex<BTreeMap<Stage, StageState>>,
    /// Told of each stage as it starts: the reporter of the first command
    /// this pipeline runs (`fetch`, `run`, `convert`, `pull` set it).
    phases: std::sync::OnceLock<Arc<dyn Reporter>>,
    _lock: DirLock,
}

/// Replays the event log into per-stage states.
pub fn replay(events: &[ftpipe_receipts::StageEventRow]) -> Result<BTreeMap<Stage, StageState>> {
    let mut states: BTreeMap<Stage, StageState> = Stage::ALL
        .iter()
        .map(|s| (*s, StageState::Pending))
        .collect();
    for e in events {
        let state = states.entry(e.stage).or_insert(StageState::Pending);
        *state = state.record(e.stage, e.event, e.run_id)?;
    }
    Ok(states)
}

/// Refuses, before anything is written, a link (or a non-directory) at
/// `.ftpipe/`, `.ftpipe/kept/`, `source/` or `artifact/`, and any other
/// entry of `.ftpipe/` that is not a plain regular file: ftpipe writes
/// only there and never through a link. Files deeper in `source/`,
/// `artifact/` and `.ftpipe/kept/` are checked where they are opened.
fn check_no_links(layout: &Layout) -> Result<()> {
    use ftpipe_fs::nofollow::{check_absent_or_regular, check_real_dirs};
    let kept = layout.kept();
    for dir in [
        layout.state_dir(),
        &kept,
        layout.source(),
        layout.artifact(),
    ] {
        check_real_dirs(layout.dir(), dir)
            .map_err(|(path, source)| FsError::io("open", path, source))?;
    }
    let io = |path: PathBuf, source| FsError::io("open", path, source);
    let entries =
        std::fs::read_dir(layout.state_dir()).map_err(|e| io(layout.state_dir().to_owned(), e))?;
    for entry in entries {
        let path = entry
            .map_err(|e| io(layout.state_dir().to_owned(), e))?
            .path();
        if path == kept {
            continue;
        }
        check_absent_or_regular(&path).map_err(|e| io(path, e))?;
    }
    Ok(())
}

/// Refuses an `out` that is, or lies under, something other than a
/// directory (a link to a directory is one): the deepest existing path on
/// the way must be a directory for `.ftpipe/` to be created there.
pub fn check_out_dir(out: &Path) -> Result<()> {
    let mut at = Some(out);
    while let Some(path) = at {
        if let Ok(meta) = std::fs::metadata(path) {
            if meta.is_dir() {
                return Ok(());
            }
            return Err(PipelineError::OutNotDirectory {
                out: out.to_owned(),
                blocker: path.to_owned(),
            });
        }
        at = path.parent().filter(|p| !p.as_os_str().is_empty());
    }
    Ok(())
}

impl Pipeline {
    /// Opens `out` for writing: creates the layout, takes the lock, opens the
    /// store and records a new run.
    pub async fn open(out: &Path, command: &str) -> Result<Pipeline> {
        check_out_dir(out)?;
        let layout = Layout::new(out);
        // `.ftpipe/` (and every directory this run creates on the way to
        // it) must be durable entries before the database claims anything:
        // fsync up to `DIR`, or to its deepest ancestor that already exists.
        let io = |source| FsError::io("create", layout.state_dir(), source);
        let state_dir = std::path::absolute(layout.state_dir()).map_err(io)?;
        let mut top = state_dir.parent().unwrap_or(&state_dir);
        while !top.exists()
            && let Some(parent) = top.parent()
        {
            top = parent;
        }
        ftpipe_fs::durable::create_dirs_durably(top, &state_dir).map_err(io)?;
        check_no_links(&layout)?;
        let lock = DirLock::acquire(&layout.lock())?;
        let store = Store::open(&layout.db()).await?;
        let states = replay(&store.stage_events().await?)?;
        let run = store.begin_run(command, env!("CARGO_PKG_VERSION")).await?;
        Ok(Pipeline {
            layout,
            store: Arc::new(store),
            run,
            states: Mutex::new(states),
            phases: std::sync::OnceLock::new(),
            _lock: lock,
        })
    }

    /// The layout.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The store.
    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// Reports each stage's start to `reporter` from now on (a second call
    /// keeps the first reporter: `run` and the stages it calls share one).
    pub(crate) fn report_phases_to(&self, reporter: &Arc<dyn Reporter>) {
        let _ = self.phases.set(reporter.clone());
    }

    async fn record(&self, stage: Stage, event: StageEvent, detail: &str) -> Result<()> {
        let mut states = self.states.lock().await;
        let current = states.get(&stage).copied().unwrap_or(StageState::Pending);
        let next = current.record(stage, event, self.run)?;
        self.store
            .append_stage_event(self.run, stage, event, detail)
            .await?;
        states.insert(stage, next);
        Ok(())
    }

    /// Runs one stage between `started` and `completed`/`failed` events.
    pub(crate) async fn stage<T, F>(&self, name: Stage, fut: F) -> Result<T>
    where
        F: std::future::Future<Output = Result<T>>,
    {
        self.record(name, StageEvent::Started, "").await?;
        if let Some(reporter) = self.phases.get() {
            reporter.report(ProgressEvent::Phase {
                phase: phase_of(name),
            });
        }
        match fut.await {
            Ok(v) => {
                // The stage's work is durable; its completion is not logged.
                crashpoint::hit(done_point(name));
                self.record(name, StageEvent::Completed, "").await?;
                // Logged; the next stage has not started.
                crashpoint::hit(completed_point(name));
                Ok(v)
            }
            Err(e) => {
                // The stage's own error is what the user must see; when the
                // log cannot take the failure (a full disk fails both), the
                // stage stays `running`, as after a kill.
                if let Err(log) = self.record(name, StageEvent::Failed, &e.to_string()).await {
                    tracing::warn!(stage = %name, error = %log, "could not log the stage failure");
                }
                Err(e)
            }
        }
    }

    /// resolve → reconcile → fetch → audit.
    pub async fn fetch(
        &self,
        params: FetchParams,
        reporter: Arc<dyn Reporter>,
    ) -> Result<FetchOutcome> {
        self.report_phases_to(&reporter);
        let origin = params.origin()?;
        let resolved = self
            .resolve_stage(origin.as_ref(), &params, &reporter)
            .await?;
        let report = self
            .fetch_stage(origin.as_ref(), &params, &resolved, &reporter)
            .await?;
        let audit = audit(
            &self.store,
            self.layout.source(),
            self.layout.artifact(),
            false,
        )
        .await?;
        Ok(FetchOutcome {
            pin: resolved.pin,
            branch_moved_to: resolved.branch_moved_to,
            reconcile: report,
            audit,
        })
    }

    pub(crate) async fn resolve_stage(
        &self,
        origin: &dyn Origin,
        params: &FetchParams,
        reporter: &Arc<dyn Reporter>,
    ) -> Result<Resolved> {
        self.stage(
            Stage::Resolve,
            origin.resolve(&self.store, &params.resolve, reporter.as_ref()),
        )
        .await
    }

    /// Reconciles and downloads the selected files. Sources retired by
    /// `convert --retire-sources` are left alone unless `reacquire` asks
    /// for them back (logged first, so the retirement log stays truthful).
    async fn fetch_stage(
        &self,
        origin: &dyn Origin,
        params: &FetchParams,
        resolved: &Resolved,
        reporter: &Arc<dyn Reporter>,
    ) -> Result<ReconcileReport> {
        let source = self.layout.source().to_owned();
        self.stage(Stage::Fetch, async {
            let mut retired = self.store.retired().await?;
            if params.reacquire {
                for path in std::mem::take(&mut retired) {
                    let bytes = resolved
                        .selected
                        .iter()
                        .find(|f| f.path == path)
                        .map_or(0, |f| f.size);
                    self.store
                        .log_retirement(self.run, &path, RetirementEvent::Reacquired, bytes)
                        .await?;
                }
            }
            let files: Vec<_> = resolved
                .selected
                .iter()
                .filter(|f| !retired.contains(&f.path))
                .cloned()
                .collect();
            let report =
                reconcile(&self.store, self.run, &source, &files, reporter.as_ref()).await?;
            let ctx = self
                .fetch_ctx(origin, params, resolved, &files, reporter)
                .await?;
            fetch(Arc::new(ctx), &files).await?;
            Ok(report)
        })
        .await
    }

    /// What every transfer of a fetch of `files` from `origin` shares.
    pub(crate) async fn fetch_ctx(
        &self,
        origin: &dyn Origin,
        params: &FetchParams,
        resolved: &Resolved,
        files: &[ftpipe_receipts::FileRow],
        reporter: &Arc<dyn Reporter>,
    ) -> Result<FetchCtx> {
        // Only what is still to fetch must be at the origin.
        let published = self.store.published_paths().await?;
        let todo: Vec<_> = files
            .iter()
            .filter(|f| !published.contains(&f.path))
            .cloned()
            .collect();
        let reuse = self.chunk_reuse(params.reuse_from.as_deref()).await?;
        let ctx = FetchCtx::with_source(
            origin
                .byte_source(&resolved.pin, &todo, &self.store, reuse)
                .await?,
            self.store.clone(),
            self.run,
            resolved.pin.clone(),
            reporter.clone(),
            params.options.clone(),
            self.layout.clone(),
            self.layout.source().to_owned(),
        );
        Ok(origin.with_cache(ctx))
    }
}

impl Pipeline {
    /// Where a Xet fetch finds chunks it already has: this directory's
    /// earlier fetches, then `other`'s (its state database opened
    /// read-only, never locked or migrated; its files only read).
    async fn chunk_reuse(&self, other: Option<&Path>) -> Result<ChunkReuse> {
        let own = ChunkReuse::own(self.store.clone(), self.layout.source().to_owned());
        let Some(other) = other else {
            return Ok(own);
        };
        let theirs = Layout::new(other);
        if !theirs.db().is_file() {
            return Err(PipelineError::NoState {
                dir: other.to_owned(),
            });
        }
        let same = std::fs::canonicalize(theirs.db())
            .ok()
            .zip(std::fs::canonicalize(self.layout.db()).ok())
            .is_some_and(|(a, b)| a == b);
        if same {
            return Err(PipelineError::InvalidInput {
                what: "--reuse-from",
                message: format!(
                    "{} is the output directory itself (its own earlier fetches are reused anyway)",
                    other.display()
                ),
            });
        }
        let store = ReadOnlyStore::open(&theirs.db()).await?;
        Ok(own.and_other(store, theirs.source().to_owned()))
    }
}

/// Opens the store of an existing output directory without the lock, for
/// read-only commands (`status`, `audit`) that may run beside a fetch.
pub async fn open_existing(out: &Path) -> Result<(Layout, Store)> {
    let layout = Layout::new(out);
    if !layout.db().is_file() {
        return Err(PipelineError::NoState {
            dir: out.to_owned(),
        });
    }
    let store = Store::open(&layout.db()).await?;
    Ok((layout, store))
}

/// What `status` shows.
#[derive(Debug, Clone, Serialize)]
pub struct StatusReport {
    /// The pin, if any.
    pub pin: Option<Pin>,
    /// Per-stage state replayed from the log.
    pub stages: BTreeMap<Stage, StageState>,
    /// Selected files.
    pub files: usize,
    /// Files with receipts.
    pub published: usize,
    /// Files with bytes committed but not published.
    pub partial: usize,
    /// Sum of expected bytes.
    pub expected_bytes: u64,
    /// Sum of durable bytes (committed + adopted).
    pub durable_bytes: u64,
}

/// Status of `out`, derived from the event log and the ledger.
pub async fn status(out: &Path) -> Result<StatusReport> {
    let (_, store) = open_existing(out).await?;
    let stages = replay(&store.stage_events().await?)?;
    let ledger = store.ledger().await?;
    let selected: std::collections::HashSet<String> = store
        .files()
        .await?
        .into_iter()
        .filter(|f| f.selected)
        .map(|f| f.path)
        .collect();
    let receipts = store.published_paths().await?;
    let ledger: Vec<_> = ledger
        .into_iter()
        .filter(|l| selected.contains(&l.path))
        .collect();
    Ok(StatusReport {
        pin: store.pin().await?,
        stages,
        files: ledger.len(),
        published: ledger.iter().filter(|l| receipts.contains(&l.path)).count(),
        partial: ledger
            .iter()
            .filter(|l| !receipts.contains(&l.path) && l.committed > 0)
            .count(),
        expected_bytes: ledger.iter().map(|l| l.expected).sum(),
        durable_bytes: ledger.iter().map(|l| l.committed + l.adopted).sum(),
    })
}

/// Audit of `out` (read-only).
pub async fn audit_dir(out: &Path, deep: bool) -> Result<AuditReport> {
    Ok(audit_with_bundle(out, deep, None).await?.0)
}

/// Audit of `out` (marked as of a run in progress when another process
/// holds its lock), and with `bundle` the zstd evidence bundle written there
/// (receipts, ledger, attempts, stage events, manifest, plan, audit report;
/// never a token).
pub async fn audit_with_bundle(
    out: &Path,
    deep: bool,
    bundle: Option<&Path>,
) -> Result<(AuditReport, Option<BundleSummary>)> {
    let (layout, store) = open_existing(out).await?;
    let live_run = DirLock::holder(&layout.lock())?;
    let mut report = audit(&store, layout.source(), layout.artifact(), deep).await?;
    report.live_run = live_run;
    let summary = match bundle {
        Some(dest) => Some(write_bundle(&store, layout.dir(), &report, dest).await?),
        None => None,
    };
    Ok((report, summary))
}

/// Every failure of a verification, one line each.
pub(crate) fn verify_problems(report: &ftpipe_artifact::verify::VerifyReport) -> Vec<String> {
    report
        .failures
        .iter()
        .map(|f| match &f.component {
            Some(c) => format!("{c}: {}: {}", f.check, f.message),
            None => format!("{}: {}", f.check, f.message),
        })
        .collect()
}

/// How the progress display names `stage`.
fn phase_of(stage: Stage) -> Phase {
    match stage {
        Stage::Resolve => Phase::Resolving,
        Stage::Plan => Phase::Planning,
        Stage::Fetch => Phase::Fetching,
        Stage::Convert => Phase::Converting,
        Stage::Verify => Phase::Verifying,
    }
}

/// The crash point after `stage`'s work is durable, before its completion
/// is logged.
fn done_point(stage: Stage) -> CrashPoint {
    match stage {
        Stage::Resolve => CrashPoint::ResolveDone,
        Stage::Plan => CrashPoint::PlanDone,
        Stage::Fetch => CrashPoint::FetchDone,
        Stage::Convert => CrashPoint::ConvertDone,
        Stage::Verify => CrashPoint::VerifyDone,
    }
}

/// The crash point after `stage`'s completion is logged, before the next
/// stage starts.
fn completed_point(stage: Stage) -> CrashPoint {
    match stage {
        Stage::Resolve => CrashPoint::ResolveCompleted,
        Stage::Plan => CrashPoint::PlanCompleted,
        Stage::Fetch => CrashPoint::FetchCompleted,
        Stage::Convert => CrashPoint::ConvertCompleted,
        Stage::Verify => CrashPoint::VerifyCompleted,
    }
}
