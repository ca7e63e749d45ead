//! A pipelined build (`run` online, with or without `--disk-budget`): the
//! conversion driven by the fetch, one verified file at a time, with the
//! receipts and retirements the convert stage would make.
//!
//! [`prepare_stream`] runs before any shard body is fetched and
//! [`save_stream`] before any component is written. From the plan
//! (headers over HTTP Range, or from disk for files already published) it
//! builds the skeleton the convert stage will build once every file is
//! verified: the identities come from the pinned listing's digests, which
//! are exactly what the download receipts will say, since a file is
//! published only when it hashes to them. The skeleton is saved with every
//! shard's header before any shard is retired, so the convert stage plans
//! retired shards from it. A budget below the schedule's minimum is refused
//! here.
//!
//! [`Streaming`] then takes each verified shard: its header must be the
//! one planned from (a ranged read is trusted only once the verified file
//! carries the same bytes), its spans go durably into every FTW and
//! FTEXPERT1 component reading it ([`crate::stream::StreamConverter`]), a
//! finished component gets its receipt under the skeleton's identity, and
//! once every PLE file is in the Q3 table is written. A shard is retired
//! (logged, unlinked, its directory fsynced) once nothing unfinished needs
//! it. The convert stage that follows ([`finish_stream`]) finds every
//! component with a valid receipt and writes the manifest: the artifact is
//! the one a fetch followed by `convert` makes, byte for byte.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use ftpipe_fs::Layout;
use ftpipe_fs::crashpoint::{self, CrashPoint};
use ftpipe_fs::durable::{create_dirs_durably, remove_temp_files, write_atomic_json};
use ftpipe_progress::{ProgressEvent, Reporter};
use ftpipe_receipts::{ComponentReceipt, FileRow, KeptMethod, PunchRecord, RunId, Store};

use crate::aside;
use crate::component::{ComponentContent, TensorSource};
use crate::copied;
use crate::engine::ConvertOutcome;
use crate::engine::{
    COMPACT, PLAN_FILE, PRETTY, SKELETON_FILE, finish_pending_aside, valid_receipts,
};
use crate::error::{ConvertError, Result};
use crate::keep::Release;
use crate::options::{ConvertOptions, converter_identity};
use crate::plan::{Plan, Planned};
use crate::punched;
use crate::retire::{retire_file, unlink_durably};
use crate::schedule::{Schedule, Workload};
use crate::skeleton::{Skeleton, files_read, listed_receipts, source_identity};
use crate::stream::StreamConverter;
use crate::write::{Sources, Written, check_lookup, table_absmax};
use tokio::task::block_in_place;

/// What a pipelined build is planned from, fixed before its fetch.
pub struct StreamSetup {
    plan: Plan,
    /// Holds each shard's header as planned from (checked against the
    /// verified file before anything is converted from it).
    skel: Skeleton,
    workload: Workload,
    schedule: Option<Schedule>,
    set_aside: Option<PathBuf>,
}

impl StreamSetup {
    /// Where a stale artifact was set aside (`--rebuild`).
    pub fn set_aside(&self) -> Option<&Path> {
        self.set_aside.as_deref()
    }

    /// The schedule's view of the plan: fetch order, PLE files, sizes.
    pub fn workload(&self) -> &Workload {
        &self.workload
    }

    /// The schedule under the budget (none without one).
    pub fn schedule(&self) -> Option<&Schedule> {
        self.schedule.as_ref()
    }

    /// Whether `record` (a punch or a copy aside) is of the version of
    /// its file the skeleton planned from.
    pub fn kept_applies(&self, record: &PunchRecord) -> bool {
        self.skel
            .headers
            .get(&record.path)
            .is_some_and(|h| h.digest == record.digest)
    }

    /// Sources whose live record is a copy aside of the planned version:
    /// released, read from their copies, never fetched or reconciled
    /// again.
    pub fn copied_aside(&self, live: &BTreeMap<String, PunchRecord>) -> BTreeSet<String> {
        live.values()
            .filter(|r| r.method == KeptMethod::CopyAside && self.kept_applies(r))
            .map(|r| r.path.clone())
            .collect()
    }
}

/// Plans a pipelined build from `planned` (see the module documentation):
/// refuses a budget below the minimum and a stale artifact (set aside
/// under `--rebuild`). Saving the skeleton and the plan is left to
/// [`save_stream`], which must come before [`Streaming::open`].
#[allow(clippy::too_many_arguments)]
pub async fn prepare_stream(
    store: &Store,
    run: RunId,
    paths: &Layout,
    opts: &ConvertOptions,
    planned: Planned,
    listing: &[FileRow],
    resident: u64,
    budget: Option<u64>,
    reporter: &dyn Reporter,
) -> Result<StreamSetup> {
    let Planned {
        plan,
        config,
        mut headers,
    } = planned;
    let workload = Workload::of_plan(&plan, resident, Release::probe(paths.dir()));
    let schedule = budget.map(|b| workload.simulate(b)).transpose()?;
    let pin = store.pin().await?.ok_or_else(|| ConvertError::NotFetched {
        file: crate::profile::CONFIG_FILE.into(),
    })?;
    let receipts = listed_receipts(listing)?;
    for (file, h) in &mut headers {
        if let Some(r) = receipts.get(file) {
            h.digest.clone_from(&r.digest);
        }
    }
    let top_k = crate::profile::experts_per_token(&config)?;
    let converter = converter_identity(&config, opts)?;
    let source = source_identity(&pin.repo, &pin.commit, &files_read(&plan), &receipts)?;
    let skel = Skeleton::build(&plan, source, converter, top_k, headers)?;
    let set_aside = set_aside_if_stale(store, run, paths, opts, (&skel, &plan), reporter).await?;
    // A repin rebuilds here without comparing spans: every component
    // under another identity is converted again.
    crate::rebuild::forget_superseded(store, &skel).await?;
    Ok(StreamSetup {
        plan,
        skel,
        workload,
        schedule,
        set_aside,
    })
}

/// Saves `setup`'s skeleton (with every shard's header: the convert stage
/// plans retired shards from it, so it is durable before any component
/// is written or any shard retired) and its plan, and makes the artifact
/// directory durable.
pub fn save_stream(paths: &Layout, setup: &StreamSetup) -> Result<()> {
    create_dirs_durably(paths.dir(), paths.artifact())
        .map_err(|e| ConvertError::io("create", paths.artifact(), e))?;
    write_atomic_json(paths.state_dir(), SKELETON_FILE, &setup.skel, COMPACT)?;
    crashpoint::hit(CrashPoint::SkeletonWritten);
    write_atomic_json(paths.state_dir(), PLAN_FILE, &setup.plan, PRETTY)?;
    Ok(())
}

/// Refuses an artifact made under another identity, or sets it aside
/// under `--rebuild` (as the convert stage does), unless a shard the
/// rebuild needs was retired.
async fn set_aside_if_stale(
    store: &Store,
    run: RunId,
    paths: &Layout,
    opts: &ConvertOptions,
    (skel, plan): (&Skeleton, &Plan),
    reporter: &dyn Reporter,
) -> Result<Option<PathBuf>> {
    let (finished, reasons) = finish_pending_aside(store, paths, skel, reporter).await?;
    if reasons.is_empty() {
        return Ok(finished);
    }
    let retired = store.retired().await?;
    if let Some((c, f)) = plan.components.iter().find_map(|c| {
        c.source_files
            .iter()
            .find(|f| retired.contains(*f))
            .map(|f| (c, f))
    }) {
        return Err(ConvertError::RebuildNeedsSources {
            dir: paths.artifact().display().to_string(),
            reasons: reasons.join("; "),
            component: c.name.clone(),
            source_file: f.clone(),
            run: crate::RetiredBy(store.last_retirement(f).await?.map(|r| r.run_id)),
        });
    }
    let dest =
        aside::refuse_or_set_aside(store, run, paths, opts.rebuild, &reasons, reporter).await?;
    Ok(Some(dest))
}

/// The conversion side of a pipelined build in progress.
pub struct Streaming<'s> {
    setup: &'s StreamSetup,
    conv: StreamConverter<'s>,
    /// Components with a valid receipt, by name.
    done: BTreeMap<String, ComponentReceipt>,
    sources: Sources,
    paths: Layout,
    run: RunId,
    /// Shards handed over (verified), not yet retired.
    on_disk: BTreeSet<String>,
    /// Shards retired by this process.
    retired: Vec<String>,
    /// Shards punched down to their PLE spans (by this process or one
    /// before it), with the bytes they still hold.
    punched: BTreeMap<String, u64>,
    /// Per global-scale component: the absolute max of the segments read
    /// so far (as their files arrived) and how many.
    partial_absmax: BTreeMap<String, (f32, usize)>,
    written: usize,
}

impl<'s> Streaming<'s> {
    /// Opens every unfinished component (resuming from its span claims)
    /// and finishes those already complete.
    pub async fn open(
        store: &Store,
        run: RunId,
        paths: &Layout,
        setup: &'s StreamSetup,
        reporter: &dyn Reporter,
    ) -> Result<Streaming<'s>> {
        let done = valid_receipts(&setup.skel, store.components().await?, paths.artifact());
        let names: BTreeSet<String> = done.keys().cloned().collect();
        let identities = &setup.skel.identities;
        if let Some(c) = setup
            .plan
            .components
            .iter()
            .find(|c| !identities.contains_key(&c.name))
        {
            return Err(ConvertError::internal(format!(
                "component {} has no identity in the skeleton",
                c.name
            )));
        }
        let conv = StreamConverter::open(store, paths.artifact(), &setup.plan, &names, |c| {
            identities[&c.name].clone()
        })
        .await?;
        let total = setup.workload.artifact_bytes();
        let done_bytes: u64 = done.values().map(|r| r.size).sum();
        reporter.report(ProgressEvent::ConvertPlanned {
            components: setup.plan.components.len(),
            total_bytes: total,
            done_bytes,
        });
        let mut s = Streaming {
            setup,
            conv,
            done,
            sources: Sources::new(paths.source()),
            paths: paths.clone(),
            run,
            on_disk: BTreeSet::new(),
            retired: Vec::new(),
            punched: BTreeMap::new(),
            partial_absmax: BTreeMap::new(),
            written: 0,
        };
        let finished = s.conv.finish_complete()?;
        s.receipts(store, finished, reporter).await?;
        Ok(s)
    }

    /// `file` is a planned shard (other files are only fetched).
    pub fn is_shard(&self, file: &str) -> bool {
        self.setup.plan.sources.iter().any(|s| s.file == file)
    }

    /// Components written by this process.
    pub fn written(&self) -> usize {
        self.written
    }

    /// Shards retired by this process.
    pub fn retired(&self) -> &[String] {
        &self.retired
    }

    /// Shard `file` was retired by an earlier process. A kill between the
    /// retirement's row and the unlink (or a power cut before the
    /// directory fsync) left it on disk: it is unlinked now, without a
    /// second row.
    pub fn retired_before(&mut self, file: &str) -> Result<()> {
        self.conv.retired(file)?;
        unlink_durably(self.paths.source(), file)
    }

    /// Shard `file` is verified on disk: its header is checked against the
    /// plan, its lookup buffers and PLE values checked, its spans written,
    /// finished components receipted, and the Q3 table written once every
    /// PLE file is in. A file that fails a check leaves no component of
    /// it behind, so a run on fixed sources needs no `--rebuild` (an FP8
    /// segment whose scale is in a file not here yet is checked only with
    /// the whole table: components of its file may then be receipted).
    pub async fn published(
        &mut self,
        store: &Store,
        file: &str,
        reporter: &dyn Reporter,
    ) -> Result<()> {
        let path = ftpipe_fs::paths::safe_join(self.paths.source(), file)?;
        if let Some(h) = self.setup.skel.headers.get(file) {
            h.check_published(&path, file)?;
        }
        self.check_lookups(file)?;
        if !self.conv.q3_written() {
            self.check_ple_values(file)?;
        }
        // Once every PLE file is in, the Q3 table is encoded on the
        // blocking pool while this file's spans are written.
        let q3 = (!self.conv.q3_written() && self.conv.q3_ready_with(file)).then(|| {
            let shas = self
                .done
                .iter()
                .map(|(k, r)| (k.clone(), r.sha256.clone()))
                .collect();
            let job = self.conv.q3_job(&self.sources, shas, self.known_absmax());
            tokio::task::spawn_blocking(move || job.run())
        });
        self.on_disk.insert(file.to_owned());
        let spans = self.write_spans(store, file, reporter).await;
        let Some(q3) = q3 else { return spans };
        // Joined before any error is returned: no write outlives it.
        let written = q3
            .await
            .map_err(|e| ConvertError::internal(format!("the Q3 table's writer failed: {e}")));
        if spans.is_err()
            && let Err(q3) | Ok(Err(q3)) = &written
        {
            tracing::warn!(error = %q3, "the Q3 table failed too");
        }
        spans?;
        self.receipts(store, written??, reporter).await?;
        self.conv.q3_done();
        Ok(())
    }

    /// Reads the PLE table segments `file` holds (FP8 ones with their
    /// scales) and refuses a non-finite value before anything is written
    /// from the file: the table's encoding later fails on nothing this
    /// file holds, so a bad table leaves no component of it behind.
    fn check_ple_values(&mut self, file: &str) -> Result<()> {
        for c in &self.setup.plan.components {
            let ComponentContent::Q3GlobalScale {
                segments, scales, ..
            } = &c.content
            else {
                continue;
            };
            let (mut segs, mut scs) = (Vec::new(), Vec::new());
            for (i, s) in segments.iter().enumerate() {
                let scale = scales.get(i);
                // An FP8 segment whose scale sits in a file not here yet is
                // checked with the whole table.
                let readable = scale.is_none_or(|sc| {
                    &*sc.file == file
                        || self.sources.is_copied(&sc.file)
                        || on_disk(self.paths.source(), &sc.file)
                });
                if &*s.file == file && readable {
                    segs.push(s.clone());
                    scs.extend(scale.cloned());
                }
            }
            if !segs.is_empty() {
                let m = block_in_place(|| table_absmax(&self.sources, &c.name, &segs, &scs))?;
                let (amax, counted) = self.partial_absmax.entry(c.name.clone()).or_default();
                *amax = amax.max(m);
                *counted += segs.len();
            }
        }
        Ok(())
    }

    /// The absolute max of every PLE table whose segments were all read
    /// as their files arrived.
    fn known_absmax(&self) -> BTreeMap<String, f32> {
        self.setup
            .plan
            .components
            .iter()
            .filter_map(|c| match &c.content {
                ComponentContent::Q3GlobalScale { segments, .. } => self
                    .partial_absmax
                    .get(&c.name)
                    .filter(|(_, n)| *n == segments.len())
                    .map(|(m, _)| (c.name.clone(), *m)),
                _ => None,
            })
            .collect()
    }

    /// Checks every lookup buffer `file` holds against the bytes the
    /// config fixes, before anything is written from it (as the convert
    /// stage does before its first component): a wrong one leaves no
    /// component of that file behind.
    fn check_lookups(&self, file: &str) -> Result<()> {
        for c in &self.setup.plan.components {
            let ComponentContent::Ftw { tensors } = &c.content else {
                continue;
            };
            for t in tensors {
                if let TensorSource::Checked(chk) = &t.source
                    && &*chk.span.file == file
                {
                    block_in_place(|| check_lookup(&self.sources, chk))?;
                }
            }
        }
        Ok(())
    }

    async fn write_spans(
        &mut self,
        store: &Store,
        file: &str,
        reporter: &dyn Reporter,
    ) -> Result<()> {
        let finished = self
            .conv
            .published(store, self.run, &self.sources, file)
            .await?;
        self.receipts(store, finished, reporter).await
    }

    /// After a restart: shard `file` was punched, or copied aside and
    /// released, by an earlier process (`record`, its live record, for the
    /// version the skeleton planned from). The punch is finished (the
    /// release after a copy done) and every kept range checked by its
    /// digest; its PLE values are read again; no unfinished component may
    /// need another span of it.
    /// Returns the bytes it holds.
    pub fn punched_before(&mut self, file: &str, record: &PunchRecord) -> Result<u64> {
        let held = match record.method {
            KeptMethod::Punch => punched::resume(self.paths.source(), record)?,
            KeptMethod::CopyAside => {
                let held = copied::resume(&self.paths, record)?;
                self.read_from_copy(record)?;
                held
            }
        };
        self.conv.punched(file)?;
        self.on_disk.insert(file.to_owned());
        self.punched.insert(file.to_owned(), held);
        self.check_ple_values(file)?;
        Ok(held)
    }

    /// Whether `record` is a punch of the version of its file the
    /// skeleton planned from.
    pub fn punch_applies(&self, record: &PunchRecord) -> bool {
        self.setup.kept_applies(record)
    }

    /// Removes every copy aside no live record in `live` claims (a kill
    /// before its row, or after the retirement that ended it).
    pub fn remove_stale_copies(&self, live: &BTreeMap<String, PunchRecord>) -> Result<()> {
        let applying: BTreeMap<String, PunchRecord> = live
            .iter()
            .filter(|(_, r)| self.setup.kept_applies(r))
            .map(|(k, r)| (k.clone(), r.clone()))
            .collect();
        for f in copied::remove_stale(&self.paths, &applying)? {
            tracing::info!(file = %f, "removed a copy aside no live record claims");
        }
        Ok(())
    }

    /// The Q3 writer reads `record.path` from its copy from now on.
    fn read_from_copy(&mut self, record: &PunchRecord) -> Result<()> {
        let copy = copied::copy_path(&self.paths, &record.path)?;
        self.sources
            .copied(&record.path, copy, copied::copy_ranges(record));
        Ok(())
    }

    /// Verified PLE shards on disk that may be punched down to their kept
    /// ranges (or copied aside) now.
    pub fn punchable(&self) -> Vec<String> {
        self.on_disk
            .iter()
            .filter(|f| !self.punched.contains_key(*f) && self.setup.workload.kept.contains_key(*f))
            .filter(|f| self.conv.punchable(f))
            .cloned()
            .collect()
    }

    /// Punches shard `file` (`size` bytes) down to its kept ranges: hashed,
    /// logged, punched, synced; on a volume that cannot punch, copies
    /// them aside and releases the file ([`copied::copy_aside`]). Returns
    /// the bytes it still holds (as counted, or as the filesystem says
    /// when that is more; the copy's length).
    pub async fn punch(&mut self, store: &Store, file: &str, size: u64) -> Result<u64> {
        let kept = self.setup.workload.kept.get(file).ok_or_else(|| {
            ConvertError::internal(format!("{file} has no kept ranges to punch down to"))
        })?;
        let digest = self
            .setup
            .skel
            .headers
            .get(file)
            .map(|h| h.digest.clone())
            .ok_or_else(|| ConvertError::internal(format!("{file} has no planned header")))?;
        if self.setup.workload.release == Release::CopyAside {
            let paths = self.paths.clone();
            let record =
                copied::copy_aside(store, self.run, &paths, (file, &digest, size), kept).await?;
            self.read_from_copy(&record)?;
            self.punched.insert(file.to_owned(), record.kept_bytes);
            return Ok(record.kept_bytes);
        }
        let root = self.paths.source().to_owned();
        let unit = self.setup.workload.release.unit();
        let record =
            punched::punch(store, self.run, &root, (file, &digest, size), (kept, unit)).await?;
        let held = punched::held_after(&ftpipe_fs::paths::safe_join(&root, file)?, &record)?;
        self.punched.insert(file.to_owned(), held);
        Ok(held)
    }

    /// Verified shards on disk that nothing unfinished needs any more.
    pub fn retirable(&self) -> Vec<String> {
        self.on_disk
            .iter()
            .filter(|f| self.conv.retirable(f))
            .cloned()
            .collect()
    }

    /// Deletes shard `file`: logged first, then unlinked and its directory
    /// fsynced (a crash between leaves a logged retirement of a present
    /// file, which the next run finishes without a second row); a copy
    /// aside of it goes after (one a crash leaves, claimed by no live
    /// record, goes on the next run).
    pub async fn retire(&mut self, store: &Store, file: &str, bytes: u64) -> Result<()> {
        let logged = store.retired().await?.contains(file);
        retire_file(store, self.run, self.paths.source(), file, bytes, logged).await?;
        if self.sources.is_copied(file) {
            copied::remove(&self.paths, file)?;
        }
        self.on_disk.remove(file);
        self.punched.remove(file);
        self.retired.push(file.to_owned());
        Ok(())
    }

    /// Commits the receipts of components renamed into place.
    async fn receipts(
        &mut self,
        store: &Store,
        finished: Vec<(String, Written)>,
        reporter: &dyn Reporter,
    ) -> Result<()> {
        for (name, w) in finished {
            crashpoint::hit(CrashPoint::ComponentRenamed);
            let receipt = self.receipt(&name, w)?;
            store.put_component(self.run, &receipt).await?;
            reporter.report(ProgressEvent::ComponentWritten {
                path: name.clone(),
                kind: receipt.kind.clone(),
                size: receipt.size,
            });
            self.done.insert(name, receipt);
            self.written += 1;
        }
        Ok(())
    }

    fn receipt(&self, name: &str, w: Written) -> Result<ComponentReceipt> {
        let c = self
            .setup
            .plan
            .components
            .iter()
            .find(|c| c.name == name)
            .ok_or_else(|| ConvertError::internal(format!("{name} is not in the plan")))?;
        self.setup.skel.receipt(c, w, self.run)
    }
}

/// The convert stage of a pipelined build: when every planned component
/// has a valid receipt (the fetch stage wrote them all), the manifest and
/// placement from the skeleton planned before the fetch, without planning
/// again; `None` when something is missing (the caller runs the convert
/// stage in full).
pub async fn finish_stream(
    store: &Store,
    run: RunId,
    paths: &Layout,
    opts: &ConvertOptions,
    setup: StreamSetup,
    streamed: (usize, Vec<String>),
) -> Result<Option<ConvertOutcome>> {
    let done = valid_receipts(&setup.skel, store.components().await?, paths.artifact());
    let complete = setup
        .plan
        .components
        .iter()
        .all(|c| done.contains_key(&c.name));
    if !complete {
        return Ok(None);
    }
    // Every component is receipted: a temp file left is a write a kill
    // interrupted (never hashed into anything).
    for t in remove_temp_files(paths.artifact())? {
        tracing::info!("removed stale temp file {}", t.display());
    }
    let StreamSetup {
        plan,
        skel,
        set_aside,
        ..
    } = setup;
    let total: u64 = skel.manifest.components.iter().map(|c| c.size).sum();
    let (manifest_sha256, manifest, placement) =
        crate::engine::write_manifest(store, run, paths, opts, skel, &done).await?;
    let (written, retired) = streamed;
    Ok(Some(ConvertOutcome {
        manifest_sha256,
        fingerprint: manifest.fingerprint,
        components: manifest.components.len(),
        written,
        reused: manifest.components.len().saturating_sub(written),
        total_bytes: total,
        retired,
        set_aside,
        placement,
        omitted: plan.omitted_totals(),
        not_fetched: plan.not_fetched_totals(),
    }))
}

/// True when `file` under `root` is on disk.
fn on_disk(root: &Path, file: &str) -> bool {
    ftpipe_fs::paths::safe_join(root, file).is_ok_and(|p| std::fs::symlink_metadata(p).is_ok())
}
