//! The pipelined `run` (online, with or without `--disk-budget SIZE`):
//! the fetch drives the conversion.
//!
//! The plan stage plans from headers (over HTTP Range for files not yet
//! published), refuses a budget below the schedule's minimum before any
//! shard body is fetched ([`ftpipe_convert::pipelined::prepare_stream`]),
//! and saves the skeleton ([`ftpipe_convert::pipelined::save_stream`];
//! without a budget the fetch stage saves it beside its first transfers:
//! `lead`). The fetch stage then
//! admits files: under a budget in the schedule's order, head of line,
//! the next file starting only while the source bytes held (resident
//! files, every admitted shard not yet retired, a `.part` counted at its
//! full size from its first byte, anything else in `source/`) plus its
//! size fit (the few a budget admits at once may each be fetched as
//! ranges over the free connections: `budgeted_params`); without one by
//! `--jobs` workers in the link's order, each taking its next file as
//! soon as one is done. Each verified shard is
//! converted at once
//! ([`ftpipe_convert::pipelined::Streaming`]) while the other transfers go
//! on, and, under a budget or `--retire-sources`, retired as soon as
//! nothing unfinished needs it. The convert stage that follows writes the
//! manifest from the skeleton; verify checks the artifact as always.
//!
//! After a kill, the next run hands the converter every shard verified
//! before it (on disk: converted again where its spans were not claimed;
//! retired: nothing unfinished may need it, and one still on disk is
//! unlinked), counts what is on disk as held, and goes on in the same
//! order.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::Path;
use std::sync::Arc;

use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinSet;

use ftpipe_convert::pipelined::{
    StreamSetup, Streaming, finish_stream, prepare_stream, save_stream,
};
use ftpipe_convert::schedule::Workload;
use ftpipe_convert::{ConvertError, ConvertOptions, ConvertOutcome, convert};
use ftpipe_fetch::{FetchCtx, FetchError, ReconcileReport, reconcile};
use ftpipe_hub::resolve::Resolved;
use ftpipe_progress::{ProgressEvent, Reporter, human};
use ftpipe_receipts::{FileRow, Stage};

use crate::origin::Origin;
use crate::plan::resident_bytes;
use crate::run::RunOutcome;
use crate::{FetchParams, Pipeline, PipelineError, Result};

mod lead;

/// What the streamed fetch stage converted and retired.
struct Streamed {
    written: usize,
    retired: Vec<String>,
}

impl Streamed {
    /// What `streaming` wrote and retired.
    fn of(streaming: &Streaming<'_>) -> Streamed {
        Streamed {
            written: streaming.written(),
            retired: streaming.retired().to_vec(),
        }
    }
}

/// What a streamed fetch stage has to do.
struct Work {
    /// Files to fetch, in admission order.
    queue: VecDeque<FileRow>,
    /// Verified shards to hand to the converter, in order.
    ready: VecDeque<String>,
}

/// The source bytes a budgeted fetch holds, and the budget they keep to.
struct Held {
    budget: Option<u64>,
    bytes: u64,
    peak: u64,
    /// The peak last recorded in the store.
    recorded: u64,
    /// Files whose bytes are counted in `bytes`, with what each counts.
    counted: BTreeMap<String, u64>,
    /// Bytes a file reserves beyond its size until it is converted: a PLE
    /// file copied aside holds its copy beside it before it is released.
    extra: BTreeMap<String, u64>,
}

impl Held {
    fn new(budget: Option<u64>, extra: &BTreeMap<String, u64>) -> Self {
        Self {
            budget,
            bytes: 0,
            peak: 0,
            recorded: 0,
            counted: BTreeMap::new(),
            extra: extra.clone(),
        }
    }

    /// What each file of `workload` reserves beyond its size.
    fn extra_of(workload: &Workload) -> BTreeMap<String, u64> {
        workload
            .files
            .iter()
            .map(|f| (f.file.clone(), workload.peak_of(f).saturating_sub(f.bytes)))
            .filter(|(_, n)| *n > 0)
            .collect()
    }

    /// What `file` (`size` bytes, not yet converted) holds at most: its
    /// size and what it reserves beyond it.
    fn reserved(&self, file: &str, size: u64) -> u64 {
        size.saturating_add(self.extra.get(file).copied().unwrap_or(0))
    }

    /// Counts `file` (`size` bytes) if it is not counted yet.
    fn count(&mut self, file: &str, size: u64) {
        if !self.counted.contains_key(file) {
            self.counted.insert(file.to_owned(), size);
            self.bytes = self.bytes.saturating_add(size);
            self.peak = self.peak.max(self.bytes);
        }
    }

    /// `file` may start now.
    fn admits(&self, file: &FileRow) -> bool {
        let extra = if self.counted.contains_key(&file.path) {
            0
        } else {
            self.reserved(&file.path, file.size)
        };
        self.budget
            .is_none_or(|b| self.bytes.saturating_add(extra) <= b)
    }

    /// `file` was punched down to `kept` bytes: the rest is released.
    fn shrink(&mut self, file: &str, kept: u64) {
        if let Some(n) = self.counted.get_mut(file) {
            self.bytes = self.bytes.saturating_sub(n.saturating_sub(kept));
            *n = kept.min(*n);
        }
    }

    /// `file` is gone from disk: what it counted is released.
    fn release(&mut self, file: &str) {
        if let Some(n) = self.counted.remove(file) {
            self.bytes = self.bytes.saturating_sub(n);
        }
    }

    /// Bytes counted for files this run does not fetch.
    fn untracked(&self) -> u64 {
        self.counted.get(UNTRACKED).copied().unwrap_or(0)
    }
}

impl Pipeline {
    /// resolve → plan (schedule, skeleton) → fetch driving the conversion
    /// → convert (the manifest) → verify.
    pub(crate) async fn run_streamed(
        &self,
        params: FetchParams,
        opts: ConvertOptions,
        budget: Option<u64>,
        reporter: Arc<dyn Reporter>,
    ) -> Result<RunOutcome> {
        let origin = params.origin()?;
        let origin = origin.as_ref();
        if origin.is_offline() {
            return Err(PipelineError::InvalidInput {
                what: "--disk-budget",
                message: "a budgeted run plans from the hub's headers before fetching; offline, run without --disk-budget (the cache already holds the files)".into(),
            });
        }
        let resolved = self.resolve_stage(origin, &params, &reporter).await?;
        let lead = budget.is_none() && self.transfers_may_lead().await?;
        let setup = self
            .streamed_plan_stage(origin, &params, &resolved, &opts, budget, &reporter, !lead)
            .await?;
        let (report, streamed) = if lead {
            self.fetch_stage_leading(origin, &params, &resolved, &setup, &opts, &reporter)
                .await?
        } else {
            self.streamed_fetch_stage(
                origin,
                &params,
                &resolved,
                &setup,
                (budget, &opts),
                &reporter,
            )
            .await?
        };
        let converted = self
            .streamed_convert_stage(&opts, setup, streamed, &reporter)
            .await?;
        self.verify_stage().await?;
        Ok(RunOutcome::done(report, converted))
    }

    /// The convert stage after a streamed fetch: the manifest from the
    /// skeleton planned before it when every component is receipted, else
    /// the convert stage in full (it counts what the fetch stage wrote as
    /// written, not reused).
    async fn streamed_convert_stage(
        &self,
        opts: &ConvertOptions,
        setup: StreamSetup,
        streamed: Streamed,
        reporter: &Arc<dyn Reporter>,
    ) -> Result<ConvertOutcome> {
        let set_aside = setup.set_aside().map(Path::to_path_buf);
        self.stage(Stage::Convert, async {
            let (store, run, paths) = (&self.store, self.run, &self.layout);
            let done = (streamed.written, streamed.retired.clone());
            if let Some(outcome) = finish_stream(store, run, paths, opts, setup, done).await? {
                return Ok(outcome);
            }
            let mut converted = convert(store, run, paths, opts, reporter.as_ref()).await?;
            converted.written += streamed.written;
            converted.reused = converted.reused.saturating_sub(streamed.written);
            converted.retired.splice(0..0, streamed.retired);
            if converted.set_aside.is_none() {
                converted.set_aside = set_aside;
            }
            Ok(converted)
        })
        .await
    }

    /// Plans from headers, refuses a budget below the minimum or a volume
    /// without room for the schedule's peak, and with `save` saves the
    /// skeleton (else the fetch stage does, beside its first transfers).
    #[allow(clippy::too_many_arguments)]
    async fn streamed_plan_stage(
        &self,
        origin: &dyn Origin,
        params: &FetchParams,
        resolved: &Resolved,
        opts: &ConvertOptions,
        budget: Option<u64>,
        reporter: &Arc<dyn Reporter>,
        save: bool,
    ) -> Result<StreamSetup> {
        self.stage(Stage::Plan, async {
            let planned = self
                .plan_from_origin(origin, params, resolved, opts)
                .await?;
            let listing = &resolved.listing;
            let resident = resident_bytes(&planned.plan, listing, &self.layout);
            let setup = prepare_stream(
                &self.store,
                self.run,
                &self.layout,
                opts,
                planned,
                listing,
                resident,
                budget,
                reporter.as_ref(),
            )
            .await?;
            if save {
                save_stream(&self.layout, &setup)?;
            }
            if params.options.preflight {
                self.streamed_preflight(&setup, reporter)?;
            }
            Ok(setup)
        })
        .await
    }

    /// Refuses when the schedule's peak (sources held + artifact written)
    /// does not fit beside what is already on disk.
    fn streamed_preflight(&self, setup: &StreamSetup, reporter: &Arc<dyn Reporter>) -> Result<()> {
        let peak = match setup.schedule() {
            Some(s) => s.peak,
            None => setup.workload().unbudgeted_peak(),
        };
        let present = dir_bytes(self.layout.source()) + dir_bytes(self.layout.artifact());
        let needed = peak.saturating_sub(present);
        let checked = ftpipe_fs::require_space(self.layout.dir(), needed);
        if let Ok(available)
        | Err(ftpipe_fs::FsError::InsufficientSpace(ftpipe_fs::InsufficientSpace {
            available,
            ..
        })) = &checked
        {
            reporter.report(ProgressEvent::Note {
                message: format!(
                    "preflight: {} still needed (peak {} of sources held + artifact, {} on disk), {} \
                     available",
                    human::bytes(needed),
                    human::bytes(peak),
                    human::bytes(present),
                    human::bytes(*available)
                ),
            });
        }
        checked.map_err(PipelineError::from)?;
        Ok(())
    }

    /// Fetches in the schedule's order under the budget, converting each
    /// verified shard and retiring what nothing unfinished needs.
    async fn streamed_fetch_stage(
        &self,
        origin: &dyn Origin,
        params: &FetchParams,
        resolved: &Resolved,
        setup: &StreamSetup,
        (budget, opts): (Option<u64>, &ConvertOptions),
        reporter: &Arc<dyn Reporter>,
    ) -> Result<(ReconcileReport, Streamed)> {
        self.stage(Stage::Fetch, async {
            let retired = self.store.retired().await?;
            let files: Vec<FileRow> = resolved
                .selected
                .iter()
                .filter(|f| !retired.contains(&f.path))
                .cloned()
                .collect();
            // A file released after its PLE spans were copied aside is
            // gone from `source/` on purpose: its receipt stays.
            let copied = setup.copied_aside(&self.store.punches().await?);
            let on_disk: Vec<FileRow> = files
                .iter()
                .filter(|f| !copied.contains(&f.path))
                .cloned()
                .collect();
            let source = self.layout.source().to_owned();
            let report =
                reconcile(&self.store, self.run, &source, &on_disk, reporter.as_ref()).await?;
            let budgeted = budget.map(|_| budgeted_params(params));
            let params = budgeted.as_ref().unwrap_or(params);
            let ctx = Arc::new(
                self.fetch_ctx(origin, params, resolved, &files, reporter)
                    .await?,
            );
            let mut streaming = Streaming::open(
                &self.store,
                self.run,
                &self.layout,
                setup,
                reporter.as_ref(),
            )
            .await?;
            let mut held = Held::new(budget, &Held::extra_of(setup.workload()));
            let work = self
                .resume_streamed(setup, &files, &retired, &mut streaming, &mut held)
                .await?;
            let retire = budget.is_some() || opts.retire_sources;
            if retire {
                // A shard punched before the kill is handed over without
                // being converted again: one the Q3 table no longer needs
                // goes now, even when no other file is left to hand over.
                self.retire_done(&mut streaming, &files, &mut held).await?;
            }
            let how = (params.options.jobs, retire);
            self.drive(&ctx, &files, work, &mut streaming, &mut held, how, reporter)
                .await?;
            Ok((report, Streamed::of(&streaming)))
        })
        .await
    }

    /// Hands the converter every shard retired before this run, counts
    /// what is held, and returns the work: the files still to fetch in
    /// admission order (resident files, shards begun before, whose `.part`
    /// is held, then the schedule's order) and the shards verified before
    /// this run, still to hand over.
    async fn resume_streamed(
        &self,
        setup: &StreamSetup,
        files: &[FileRow],
        retired: &BTreeSet<String>,
        streaming: &mut Streaming<'_>,
        held: &mut Held,
    ) -> Result<Work> {
        let mut ready = VecDeque::new();
        let shards: Vec<&str> = setup
            .workload()
            .files
            .iter()
            .map(|f| f.file.as_str())
            .collect();
        for f in &shards {
            if retired.contains(*f) {
                streaming.retired_before(f)?;
            }
        }
        let published = self.store.published_paths().await?;
        let punches = self.store.punches().await?;
        streaming.remove_stale_copies(&punches)?;
        let row = |p: &str| files.iter().find(|f| f.path == p);
        let mut resident = Vec::new();
        for f in files.iter().filter(|f| !shards.contains(&f.path.as_str())) {
            held.count(&f.path, f.size);
            if !published.contains(&f.path) {
                resident.push(f.clone());
            }
        }
        let mut begun = Vec::new();
        let mut rest = Vec::new();
        for &s in &shards {
            let Some(f) = row(s) else { continue };
            let on_disk = on_disk_bytes(self.layout.source(), s);
            let punch = punches.get(s).filter(|p| streaming.punch_applies(p));
            if let (true, Some(p)) = (published.contains(s), punch) {
                // Converted and punched down to its PLE spans before.
                let kept = streaming.punched_before(s, p)?;
                held.count(s, kept);
            } else if published.contains(s) {
                held.count(s, held.reserved(s, f.size));
                ready.push_back(s.to_owned());
            } else if on_disk.part.is_some() || on_disk.final_len > 0 {
                // Begun (its `.part` counted whole), and any older version
                // of the file a repin left (replaced when the new one is
                // published): held until it is retired.
                held.count(
                    s,
                    held.reserved(s, f.size).saturating_add(on_disk.final_len),
                );
                begun.push(f.clone());
            } else {
                rest.push(f.clone());
            }
        }
        // Whatever else lies in `source/` (a file an earlier pin or
        // selection left, a copy from the HF cache beside a stale `.part`)
        // takes room too: counted as held, never released by this run.
        let tracked: u64 = files
            .iter()
            .map(|f| {
                let d = on_disk_bytes(self.layout.source(), &f.path);
                d.final_len + d.part.unwrap_or(0)
            })
            .sum();
        let untracked = dir_bytes(self.layout.source()).saturating_sub(tracked);
        if untracked > 0 {
            held.count(UNTRACKED, untracked);
        }
        let queue = resident.into_iter().chain(begun).chain(rest).collect();
        Ok(Work { queue, ready })
    }

    /// Records a new peak of held source bytes under a budget, before the
    /// file that raises it starts (so a killed run leaves its peak too).
    async fn record_peak(&self, held: &mut Held) -> Result<()> {
        if let Some(budget) = held.budget
            && held.peak > held.recorded
        {
            self.store
                .record_disk_budget(self.run, budget, held.peak)
                .await?;
            held.recorded = held.peak;
        }
        Ok(())
    }

    /// Retires every shard nothing unfinished needs.
    async fn retire_done(
        &self,
        streaming: &mut Streaming<'_>,
        files: &[FileRow],
        held: &mut Held,
    ) -> Result<()> {
        for f in streaming.retirable() {
            let size = files
                .iter()
                .find(|r| r.path == f)
                .map(|r| r.size)
                .ok_or_else(|| ConvertError::internal(format!("{f} is not a selected file")))?;
            streaming.retire(&self.store, &f, size).await?;
            held.release(&f);
        }
        Ok(())
    }

    /// Punches every converted PLE shard down to its kept ranges (its
    /// other spans are all written), releasing the rest of what it held.
    async fn punch_done(
        &self,
        streaming: &mut Streaming<'_>,
        files: &[FileRow],
        held: &mut Held,
    ) -> Result<()> {
        for f in streaming.punchable() {
            let size = files
                .iter()
                .find(|r| r.path == f)
                .map(|r| r.size)
                .ok_or_else(|| ConvertError::internal(format!("{f} is not a selected file")))?;
            let kept = streaming.punch(&self.store, &f, size).await?;
            held.shrink(&f, kept);
        }
        Ok(())
    }

    /// The admission loop: starts files in order while they fit and a job
    /// slot is free, converts each shard as it is verified, retires what it
    /// can. After the first failure nothing new starts; transfers in flight
    /// finish.
    #[allow(clippy::too_many_arguments)]
    async fn drive(
        &self,
        ctx: &Arc<FetchCtx>,
        files: &[FileRow],
        work: Work,
        streaming: &mut Streaming<'_>,
        held: &mut Held,
        (jobs, retire): (usize, bool),
        reporter: &Arc<dyn Reporter>,
    ) -> Result<()> {
        if held.budget.is_none() {
            return self
                .drive_unbudgeted(ctx, files, work, streaming, (jobs, retire), reporter)
                .await;
        }
        let Work {
            mut queue,
            mut ready,
        } = work;
        ftpipe_fetch::begin(ctx, files).await?;
        let jobs = Arc::new(Semaphore::new(jobs.max(1)));
        let mut set = JoinSet::new();
        let mut fetch_errors: Vec<FetchError> = Vec::new();
        // Once set, nothing new starts; transfers in flight finish and
        // the fetch is ended (its space reserve released) before it is
        // returned.
        let mut failed: Option<PipelineError> = self.record_peak(held).await.err();
        loop {
            while failed.is_none() && fetch_errors.is_empty() {
                let Some(next) = queue.front() else { break };
                if !held.admits(next) {
                    break;
                }
                let Ok(slot) = jobs.clone().try_acquire_owned() else {
                    break;
                };
                let Some(file) = queue.pop_front() else { break };
                held.count(&file.path, held.reserved(&file.path, file.size));
                if let Err(e) = self.record_peak(held).await {
                    failed = Some(e);
                    queue.push_front(file);
                    break;
                }
                let ctx = ctx.clone();
                set.spawn(async move {
                    let _slot = slot;
                    let path = file.path.clone();
                    (path, ftpipe_fetch::fetch_file(ctx, file).await)
                });
            }
            // New transfers start before a verified shard is converted:
            // the link stays busy while the conversion runs.
            let Some(path) = ready.pop_front().filter(|_| failed.is_none()) else {
                let Some(joined) = set.join_next().await else {
                    break;
                };
                match joined {
                    Ok((path, Ok(()))) if streaming.is_shard(&path) => ready.push_back(path),
                    Ok((_, Ok(()))) => {}
                    Ok((_, Err(e))) => fetch_errors.push(e),
                    Err(join) => fetch_errors.push(FetchError::internal_from("fetch task", join)),
                }
                continue;
            };
            let converted = self
                .convert_verified(streaming, &path, files, held, retire, reporter)
                .await;
            if let Err(e) = converted {
                failed = Some(e);
            }
        }
        end_fetch(ctx, files, fetch_errors, failed).await?;
        if let Some(next) = queue.front() {
            return Err(ConvertError::DiskBudgetStuck {
                budget: held.budget.unwrap_or(u64::MAX),
                held: held.bytes,
                untracked: held.untracked(),
                next: next.path.clone(),
                size: next.size,
                needed: held.bytes.saturating_add(next.size),
            }
            .into());
        }
        Ok(())
    }

    /// The fetch without a budget: `jobs` workers take files in the
    /// link's order (largest first, so no long transfer is left for the
    /// end: the fetch alone's order, which beat starting the PLE files
    /// first once the Q3 table is encoded beside the last file's spans),
    /// each starting its next file as soon as one is done, while this task
    /// converts the shards they verify, in the order verified. After the
    /// first failure no worker starts another file; transfers in flight
    /// finish.
    async fn drive_unbudgeted(
        &self,
        ctx: &Arc<FetchCtx>,
        files: &[FileRow],
        work: Work,
        streaming: &mut Streaming<'_>,
        (jobs, retire): (usize, bool),
        reporter: &Arc<dyn Reporter>,
    ) -> Result<()> {
        let Work { queue, ready } = work;
        let workers = Workers::start(ctx, files, queue, jobs).await?;
        self.convert_arrivals(ctx, files, workers, ready, streaming, retire, reporter)
            .await
    }

    /// Converts the shards in `ready`, then each shard `workers` verify, in
    /// the order verified, until every worker is done; then ends the
    /// fetch.
    #[allow(clippy::too_many_arguments)]
    async fn convert_arrivals(
        &self,
        ctx: &Arc<FetchCtx>,
        files: &[FileRow],
        mut workers: Workers,
        mut ready: VecDeque<String>,
        streaming: &mut Streaming<'_>,
        retire: bool,
        reporter: &Arc<dyn Reporter>,
    ) -> Result<()> {
        let mut fetch_errors: Vec<FetchError> = Vec::new();
        let mut failed: Option<PipelineError> = None;
        // Without a budget held bytes only matter to `--retire-sources`'s
        // retirements, which release them.
        let mut held = Held::new(None, &BTreeMap::new());
        loop {
            let path = match ready.pop_front() {
                Some(path) => path,
                None => match workers.arrivals.recv().await {
                    None => break,
                    Some((path, Ok(()))) if streaming.is_shard(&path) => path,
                    Some((_, Ok(()))) => continue,
                    Some((_, Err(e))) => {
                        fetch_errors.push(e);
                        continue;
                    }
                },
            };
            // After a failed transfer the shards verified go on being
            // converted (kept for the next run); after a failed
            // conversion nothing more is.
            if failed.is_some() {
                continue;
            }
            let converted = self
                .convert_verified(streaming, &path, files, &mut held, retire, reporter)
                .await;
            if let Err(e) = converted {
                workers.halt.now();
                failed = Some(e);
            }
        }
        fetch_errors.extend(workers.join().await);
        end_fetch(ctx, files, fetch_errors, failed).await
    }

    /// Converts verified shard `path` and, under a budget or when
    /// `retire`, releases every converted PLE shard's other bytes (holes
    /// punched, or its PLE spans copied aside) and retires every shard
    /// nothing unfinished needs any more.
    async fn convert_verified(
        &self,
        streaming: &mut Streaming<'_>,
        path: &str,
        files: &[FileRow],
        held: &mut Held,
        retire: bool,
        reporter: &Arc<dyn Reporter>,
    ) -> Result<()> {
        streaming
            .published(&self.store, path, reporter.as_ref())
            .await?;
        if held.budget.is_some() || retire {
            self.punch_done(streaming, files, held).await?;
        }
        if retire {
            self.retire_done(streaming, files, held).await?;
        }
        Ok(())
    }
}

/// The unbudgeted fetch's worker tasks: each takes the next file of a
/// shared queue (in the link's order) as soon as its last is done, and
/// sends every file's outcome to `arrivals`.
struct Workers {
    set: JoinSet<()>,
    arrivals: mpsc::UnboundedReceiver<(String, std::result::Result<(), FetchError>)>,
    halt: Halt,
}

/// What stops the workers after the first failure: the flag they check
/// before each file, and the queue they take files from, emptied (its
/// files uncounted as waiting) so that the transfers still in flight are
/// not held back by files that will never start.
#[derive(Clone)]
struct Halt {
    ctx: Arc<FetchCtx>,
    queue: Arc<std::sync::Mutex<VecDeque<FileRow>>>,
    stop: Arc<AtomicBool>,
}

impl Halt {
    fn now(&self) {
        self.stop.store(true, Ordering::SeqCst);
        // Draining cannot panic: a poisoned lock still holds the queue.
        let left = self
            .queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .drain(..)
            .count();
        ftpipe_fetch::withdraw(&self.ctx, left);
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// The next file in the link's order, unless stopped.
    fn next(&self) -> Option<FileRow> {
        if self.stopped() {
            return None;
        }
        self.queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .pop_front()
    }
}

impl Workers {
    /// Begins the fetch of `files` and starts `jobs` workers on `queue`,
    /// every file of it counted as waiting from now on.
    async fn start(
        ctx: &Arc<FetchCtx>,
        files: &[FileRow],
        mut queue: VecDeque<FileRow>,
        jobs: usize,
    ) -> Result<Workers> {
        ftpipe_fetch::order_for_the_link(ctx, queue.make_contiguous());
        ftpipe_fetch::begin(ctx, files).await?;
        // Every queued file counts as waiting from here: a worker between
        // two files leaves no file in flight looking alone on the link.
        ftpipe_fetch::admit(ctx, queue.len());
        let halt = Halt {
            ctx: ctx.clone(),
            queue: Arc::new(std::sync::Mutex::new(queue)),
            stop: Arc::new(AtomicBool::new(false)),
        };
        let (verified, arrivals) = mpsc::unbounded_channel();
        let mut set = JoinSet::new();
        for _ in 0..jobs.max(1) {
            let (halt, verified) = (halt.clone(), verified.clone());
            set.spawn(async move {
                while let Some(file) = halt.next() {
                    let path = file.path.clone();
                    let fetched = ftpipe_fetch::fetch_admitted(halt.ctx.clone(), file).await;
                    if fetched.is_err() {
                        halt.now();
                    }
                    if verified.send((path, fetched)).is_err() {
                        break;
                    }
                }
            });
        }
        Ok(Workers {
            set,
            arrivals,
            halt,
        })
    }

    /// Waits for every worker; what failed to join.
    /// A worker cancelled by [`Workers::abandon`] is not a failure.
    async fn join(&mut self) -> Vec<FetchError> {
        let mut errors = Vec::new();
        while let Some(joined) = self.set.join_next().await {
            match joined {
                Err(join) if !join.is_cancelled() => {
                    errors.push(FetchError::internal_from("fetch task", join));
                }
                _ => {}
            }
        }
        errors
    }

    /// Stops the workers after `failed`, which came before any shard was
    /// converted: their transfers are cancelled where they are (as an
    /// interrupt cancels them: what their checkpoints made durable is
    /// kept, the rest is a kill's tail to the next run), the fetch is
    /// ended and the error to report returned (`failed`, before the
    /// transfers' own).
    async fn abandon(
        mut self,
        ctx: &FetchCtx,
        files: &[FileRow],
        failed: PipelineError,
    ) -> PipelineError {
        self.halt.now();
        self.set.abort_all();
        let mut errors = self.join().await;
        while let Ok((_, fetched)) = self.arrivals.try_recv() {
            errors.extend(fetched.err());
        }
        end_fetch_failed(ctx, files, errors, failed).await
    }
}

/// A budgeted fetch splits a file into ranges from this many
/// `--min-range`s up, whatever `--segment-threshold` says.
const BUDGETED_SPLIT_FROM_MIN_RANGES: u64 = 2;

/// The fetch parameters of a budgeted run: any file of at least
/// [`BUDGETED_SPLIT_FROM_MIN_RANGES`] minimum ranges may be fetched as
/// several ranges. The budget admits few files at once (at the minimum
/// often one, the largest file alone filling it beside the resident
/// ones), so the connections `--connections` allows would otherwise sit
/// idle while one stream carries the whole link's work; the split rule
/// (`--split-below-rate`) still decides whether another connection pays.
/// A split file's `.part` is sparse and counted whole from its first byte,
/// so what the budget holds is unchanged.
///
/// Its files are written through the page cache (as with `--buffered-io`),
/// not past it: each shard is read back at once (the digest reads the
/// ranges written ahead of it, then the conversion reads its spans) and
/// retired soon after, so its bytes are still in memory for both reads,
/// and the budget bounds the source bytes held, so what the cache keeps
/// of them is bounded too.
fn budgeted_params(params: &FetchParams) -> FetchParams {
    let mut params = params.clone();
    let o = &mut params.options;
    o.segment_threshold = o
        .segment_threshold
        .min(o.min_range.saturating_mul(BUDGETED_SPLIT_FROM_MIN_RANGES));
    o.io_mode = ftpipe_fetch::IoMode::Buffered;
    params
}

/// Ends the fetch (its space reserve released) with the transfers'
/// `errors`; a failed conversion is the error returned, before the
/// fetch's own.
async fn end_fetch(
    ctx: &FetchCtx,
    files: &[FileRow],
    errors: Vec<FetchError>,
    failed: Option<PipelineError>,
) -> Result<()> {
    match failed {
        Some(e) => Err(end_fetch_failed(ctx, files, errors, e).await),
        None => Ok(ftpipe_fetch::end(ctx, files, errors).await?),
    }
}

/// [`end_fetch`] after `failed`: the error to return.
async fn end_fetch_failed(
    ctx: &FetchCtx,
    files: &[FileRow],
    errors: Vec<FetchError>,
    failed: PipelineError,
) -> PipelineError {
    if let Err(f) = ftpipe_fetch::end(ctx, files, errors).await {
        tracing::warn!(error = %f, "the fetch also failed");
    }
    failed
}

/// The name under which bytes in `source/` that belong to no selected
/// file are counted as held.
const UNTRACKED: &str = "\0untracked";

/// What of one selected file is on disk.
struct OnDisk {
    /// Its final file's length (0 when absent).
    final_len: u64,
    /// Its `.part`'s length, when there is one.
    part: Option<u64>,
}

/// What of `file` is under `root`.
fn on_disk_bytes(root: &Path, file: &str) -> OnDisk {
    let Ok(path) = ftpipe_fs::paths::safe_join(root, file) else {
        return OnDisk {
            final_len: 0,
            part: None,
        };
    };
    let part = ftpipe_hub::paths::part_path(&path);
    let len = |p: &Path| {
        std::fs::symlink_metadata(p)
            .ok()
            .filter(std::fs::Metadata::is_file)
            .map(|m| m.len())
    };
    OnDisk {
        final_len: len(&path).unwrap_or(0),
        part: len(&part),
    }
}

/// Bytes of the regular files under `dir` (0 when absent or not a real
/// directory: a link is not followed).
fn dir_bytes(dir: &std::path::Path) -> u64 {
    if !std::fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir()) {
        return 0;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_bytes(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map_or(0, |m| m.len()),
            _ => 0,
        })
        .sum()
}
