//! `run`: the whole chain resolve → plan → fetch → convert → verify as
//! stages of the event log, and the plan, convert and verify stages.
//! [`Pipeline::run`] is where one `ftpipe run` goes from the binary.
//!
//! `plan` runs before `fetch` in `run` (reading published files from disk
//! and, for every file without a receipt, only its safetensors header over
//! HTTP Range) so the preflight can refuse before a byte of weights is
//! downloaded: it compares the space still needed — sources not yet durable
//! plus artifact components without receipts, or with `--retire-sources` the
//! peak of the two as shards are retired — with the free space on the target
//! volume.

use std::collections::BTreeSet;
use std::sync::Arc;

use serde::Serialize;
use tokio::task::block_in_place;

use ftpipe_convert::PlanOptions;
use ftpipe_convert::rebuild::{Fate, record_old_spans, repin_fates};
use ftpipe_convert::space::artifact_peak;
use ftpipe_convert::{
    ConvertOptions, ConvertOutcome, HeaderSource, Planned, Published, convert, current_artifact,
    plan,
};
use ftpipe_fetch::{ReconcileReport, bytes_still_needed};
use ftpipe_hub::resolve::{FetchSelection, Resolved, apply_selection};
use ftpipe_progress::{ProgressEvent, Reporter, human};

use crate::origin::{Origin, OriginFiles};
use crate::state::StageState;
use crate::{FetchParams, Pipeline, PipelineError, Result, replay};
use ftpipe_receipts::{RunId, Stage};

/// What `run` reports.
#[derive(Debug, Clone, Serialize)]
pub struct RunOutcome {
    /// True when the finished run was found complete and nothing was done.
    pub noop: bool,
    /// Why it was (or was not) a no-op, for the user.
    pub summary: String,
    /// Reconciliation of the fetch stage (absent on a no-op).
    pub reconcile: Option<ReconcileReport>,
    /// The conversion (absent on a no-op).
    pub convert: Option<ConvertOutcome>,
    /// SHA-256 of manifest.json.
    pub manifest_sha256: String,
    /// Artifact fingerprint.
    pub fingerprint: String,
}

impl RunOutcome {
    /// A run that fetched (`report`) and converted.
    pub(crate) fn done(report: ReconcileReport, converted: ConvertOutcome) -> RunOutcome {
        RunOutcome {
            noop: false,
            summary: format!(
                "{} components ({} written, {} reused), {}",
                converted.components,
                converted.written,
                converted.reused,
                human::bytes(converted.total_bytes)
            ),
            reconcile: Some(report),
            manifest_sha256: converted.manifest_sha256.clone(),
            fingerprint: converted.fingerprint.clone(),
            convert: Some(converted),
        }
    }
}

impl Pipeline {
    /// The `convert` stage.
    pub async fn convert(
        &self,
        opts: &ConvertOptions,
        reporter: Arc<dyn Reporter>,
    ) -> Result<ConvertOutcome> {
        self.report_phases_to(&reporter);
        let paths = self.layout.clone();
        self.stage(Stage::Convert, async {
            Ok(convert(&self.store, self.run, &paths, opts, reporter.as_ref()).await?)
        })
        .await
    }

    /// The `plan` stage of `run`, with the preflight: from the local
    /// sources when every shard is published, else from the headers over
    /// HTTP Range.
    async fn plan_stage(
        &self,
        origin: &dyn Origin,
        params: &FetchParams,
        resolved: &Resolved,
        opts: &ConvertOptions,
        reporter: &Arc<dyn Reporter>,
    ) -> Result<()> {
        self.stage(Stage::Plan, async {
            let Resolved { selected, .. } = resolved;
            let sources_needed = bytes_still_needed(&self.store, selected).await?;
            let retired = self.store.retired().await?;
            if !retired.is_empty() && !params.reacquire {
                // Nothing will be fetched; convert works from its skeleton
                // and says what to re-acquire if a component is missing.
                return Ok(());
            }
            // Re-acquired shards are downloaded again in full.
            let sources_needed = sources_needed
                + selected
                    .iter()
                    .filter(|f| retired.contains(&f.path))
                    .map(|f| f.size)
                    .sum::<u64>();
            let planned = self
                .plan_from_origin(origin, params, resolved, opts)
                .await?;
            self.record_repin(&planned, resolved, opts, reporter)
                .await?;
            let plan = planned.plan;
            if !params.options.preflight {
                return Ok(());
            }
            let done: BTreeSet<String> = self
                .store
                .components()
                .await?
                .into_iter()
                .filter(|c| {
                    std::fs::metadata(self.layout.artifact().join(&c.path))
                        .is_ok_and(|m| m.len() == c.size)
                })
                .map(|c| c.path)
                .collect();
            let shards = plan
                .sources
                .iter()
                .map(|s| (s.file.clone(), s.bytes))
                .collect();
            let artifact = artifact_peak(&plan, &done, &shards, opts.retire_sources, opts.jobs);
            let needed = sources_needed.saturating_add(artifact);
            std::fs::create_dir_all(self.layout.dir())
                .map_err(|e| PipelineError::io("create", self.layout.dir(), e))?;
            let checked = ftpipe_fs::require_space(self.layout.dir(), needed);
            if let Ok(available)
            | Err(ftpipe_fs::FsError::InsufficientSpace(ftpipe_fs::InsufficientSpace {
                available,
                ..
            })) = &checked
            {
                reporter.report(ProgressEvent::Note {
                    message: format!(
                        "preflight: {} still needed ({} sources + {} artifact{}), {} available",
                        human::bytes(needed),
                        human::bytes(sources_needed),
                        human::bytes(artifact),
                        if opts.retire_sources {
                            " at peak with retirement"
                        } else {
                            ""
                        },
                        human::bytes(*available)
                    ),
                });
            }
            checked.map_err(PipelineError::from)?;
            Ok(())
        })
        .await
    }

    /// On a repin of a converted artifact, before anything is fetched:
    /// records the old bytes of the spans of every component to check
    /// ([`ftpipe_convert::rebuild`]) and says what the repin keeps and
    /// converts again.
    async fn record_repin(
        &self,
        planned: &Planned,
        resolved: &Resolved,
        opts: &ConvertOptions,
        reporter: &Arc<dyn Reporter>,
    ) -> Result<()> {
        let pin = &resolved.pin;
        let Some((old, preview)) = repin_fates(
            &self.store,
            &self.layout,
            (&pin.repo, &pin.commit),
            planned,
            &resolved.listing,
            opts,
        )
        .await?
        else {
            return Ok(());
        };
        let recorded = record_old_spans(
            &self.store,
            self.run,
            &self.layout,
            &planned.plan,
            &old,
            &preview,
        )
        .await?;
        let (kept, checked, rebuilt) = (
            preview.totals(Fate::Kept),
            preview.totals(Fate::Checked),
            preview.totals(Fate::Rebuilt),
        );
        reporter.report(ProgressEvent::Note {
            message: format!(
                "repin {}@{} -> {}: {} components kept ({}), {} reading changed files checked                  after the fetch ({}; {recorded} with their old spans recorded), {} converted                  again ({})",
                pin.repo,
                old.source().commit,
                pin.commit,
                kept.0,
                human::bytes(kept.1),
                checked.0,
                human::bytes(checked.1),
                rebuilt.0,
                human::bytes(rebuilt.1)
            ),
        });
        Ok(())
    }

    /// The plan of `resolved` from the published files and, for every
    /// other one, its headers from `origin` (the hub or a mirror). Judged
    /// from receipts, never from watermarks: a `.part` that reached its
    /// size but was not published is read from the origin.
    pub(crate) async fn plan_from_origin(
        &self,
        origin: &dyn Origin,
        params: &FetchParams,
        resolved: &Resolved,
        opts: &ConvertOptions,
    ) -> Result<Planned> {
        let Resolved { pin, listing, .. } = resolved;
        let receipts = self.store.receipts().await?;
        let published = Published::from_receipts(self.layout.source(), &receipts);
        let plan_opts = PlanOptions {
            selection: FetchSelection::of(listing, &params.resolve.globs()),
            ..opts.plan_options()
        };
        let remote = OriginFiles { origin, pin };
        let source = HeaderSource::Remote {
            remote: &remote,
            listing,
            published: &published,
        };
        Ok(plan(&source, &plan_opts).await?)
    }

    /// The `verify` stage: the artifact checked on its own, as a receiver would.
    pub(crate) async fn verify_stage(&self) -> Result<()> {
        let artifact = self.layout.artifact().to_owned();
        self.stage(Stage::Verify, async move {
            let report =
                block_in_place(|| ftpipe_artifact::verify::verify_artifact(&artifact, false))
                    .map_err(PipelineError::from)?;
            if report.ok {
                return Ok(());
            }
            let problems = crate::verify_problems(&report);
            Err(PipelineError::VerifyFailed { artifact, problems })
        })
        .await
    }

    /// resolve → plan (+ preflight) → fetch → convert → verify; a no-op
    /// when the last run finished every stage for the same request and the
    /// artifact on disk is still exactly what it recorded.
    pub async fn run(
        &self,
        params: FetchParams,
        opts: ConvertOptions,
        disk_budget: Option<u64>,
        reporter: Arc<dyn Reporter>,
    ) -> Result<RunOutcome> {
        self.report_phases_to(&reporter);
        if let Some(outcome) = self.finished(&params, &opts).await? {
            return Ok(outcome);
        }
        // Online, the fetch drives the conversion (each shard converted as
        // soon as it is verified). Offline the plan needs the files first;
        // after `convert --retire-sources` (or to re-acquire) the convert
        // stage knows what to do with retired shards. Shards retired by a
        // budgeted run are part of its durable plan: any later run goes on
        // pipelined, whatever budget it is given.
        let retired = self.store.retired().await?;
        let budgeted_before = !self.store.disk_budgets().await?.is_empty();
        // A repin of a converted artifact plans, records the old spans of
        // the components to check, fetches, then keeps or converts each
        // (ftpipe_convert::rebuild): it needs every new file first.
        let incremental = params.resolve.repin && !self.store.components().await?.is_empty();
        let pipelined = disk_budget.is_some()
            || (!params.offline
                && !params.reacquire
                && !incremental
                && (retired.is_empty() || budgeted_before));
        if pipelined {
            if disk_budget.is_none() && !retired.is_empty() {
                reporter.report(ProgressEvent::Note {
                    message: format!(
                        "resuming a run begun with --disk-budget without one: the {} shards it \
                         retired are not fetched again (every component reading them is \
                         durable), and every file still on disk is kept",
                        retired.len()
                    ),
                });
            }
            return self.run_streamed(params, opts, disk_budget, reporter).await;
        }
        let origin = params.origin()?;
        let origin = origin.as_ref();
        let resolved = self.resolve_stage(origin, &params, &reporter).await?;
        // Offline, the plan cannot read headers of unfetched shards from the
        // hub: fetch (from the cache) first, then plan from `source/`.
        let report = if origin.is_offline() {
            let report = self
                .fetch_stage(origin, &params, &resolved, &reporter)
                .await?;
            self.plan_stage(origin, &params, &resolved, &opts, &reporter)
                .await?;
            report
        } else {
            self.plan_stage(origin, &params, &resolved, &opts, &reporter)
                .await?;
            self.fetch_stage(origin, &params, &resolved, &reporter)
                .await?
        };
        let converted = self.convert(&opts, reporter.clone()).await?;
        self.verify_stage().await?;
        Ok(RunOutcome::done(report, converted))
    }

    /// `Some` when nothing is left to do: every stage of `run` completed in
    /// one earlier run, the pin answers this request, the manifest on disk
    /// is the last one recorded and was made with these options, every
    /// component has its recorded size, and the placement is current.
    /// Reads only `config.json` of the sources and makes no request.
    async fn finished(
        &self,
        params: &FetchParams,
        opts: &ConvertOptions,
    ) -> Result<Option<RunOutcome>> {
        if opts.rebuild || params.reacquire || params.resolve.repin {
            return Ok(None);
        }
        let states = replay(&self.store.stage_events().await?)?;
        let runs: BTreeSet<RunId> = Stage::ALL
            .iter()
            .filter_map(|s| match states.get(s) {
                Some(StageState::Completed { run }) => Some(*run),
                _ => None,
            })
            .collect();
        if runs.len() != 1
            || states
                .values()
                .any(|s| !matches!(s, StageState::Completed { .. }))
        {
            return Ok(None);
        }
        let Some(pin) = self.store.pin().await? else {
            return Ok(None);
        };
        let req = &params.resolve;
        if pin.repo != req.repo || (pin.revision != req.revision && pin.commit != req.revision) {
            return Ok(None);
        }
        // Another selection fetches other files: not finished.
        let stored = self.store.files().await?;
        let mut asked = stored.clone();
        apply_selection(&mut asked, &req.include, &req.exclude)?;
        if asked != stored {
            return Ok(None);
        }
        let Some(current) = current_artifact(&self.store, &self.layout, &pin, opts).await? else {
            return Ok(None);
        };
        Ok(Some(RunOutcome {
            noop: true,
            summary: format!(
                "nothing to do: {}@{} is converted and verified ({} components, {})",
                pin.repo,
                pin.commit,
                current.components,
                human::bytes(current.bytes)
            ),
            reconcile: None,
            convert: None,
            manifest_sha256: current.manifest_sha256,
            fingerprint: current.fingerprint,
        }))
    }
}
