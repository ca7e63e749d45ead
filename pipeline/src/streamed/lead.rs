//! The pipelined `run` without a budget starts its transfers before the
//! skeleton is saved.
//!
//! Every check of the checkpoint, the options and the volume is in the
//! plan stage, before any shard body: the headers and the index, the
//! profile, a stale artifact (set aside under `--rebuild`), the
//! preflight. What follows it needs only the plan in memory to start:
//! the workers take every unpublished file in the link's order whatever
//! the converter does. So the fetch stage starts them first and then
//! saves the skeleton and the plan (`skeleton-written`) and opens the
//! converter beside the first transfers; a shard verified meanwhile waits
//! in the arrivals channel. What can still fail there (an I/O error, a
//! file in the way under `artifact/`) cancels the transfers where they
//! are (`Workers::abandon`), as an interrupt would, and is reported at
//! once.
//! The skeleton is durable before any component is written or any shard
//! retired, which is all the convert stage and a resume need of it: a
//! kill before it is saved leaves fetched files and no conversion, and
//! the next run plans again (its plan stage always runs).
//!
//! Only when no shard was retired, punched or copied aside before: which
//! files such a run fetches and hands over depends on what the converter
//! finds when it opens ([`Pipeline::streamed_fetch_stage`] then).

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use tokio::task::block_in_place;

use ftpipe_convert::ConvertOptions;
use ftpipe_convert::pipelined::{StreamSetup, Streaming, save_stream};
use ftpipe_fetch::{ReconcileReport, reconcile};
use ftpipe_hub::resolve::Resolved;
use ftpipe_progress::Reporter;
use ftpipe_receipts::{FileRow, Stage};

use super::{Held, Streamed, Workers};
use crate::origin::Origin;
use crate::{FetchParams, Pipeline, Result};

impl Pipeline {
    /// The transfers may start before the skeleton is saved: no shard was
    /// retired, punched or copied aside by an earlier run.
    pub(super) async fn transfers_may_lead(&self) -> Result<bool> {
        Ok(self.store.retired().await?.is_empty() && self.store.punches().await?.is_empty())
    }

    /// The fetch stage of an unbudgeted run whose plan stage did not save
    /// the skeleton: the workers start, then the skeleton is saved and the
    /// converter opened beside them (see the module documentation).
    pub(super) async fn fetch_stage_leading(
        &self,
        origin: &dyn Origin,
        params: &FetchParams,
        resolved: &Resolved,
        setup: &StreamSetup,
        opts: &ConvertOptions,
        reporter: &Arc<dyn Reporter>,
    ) -> Result<(ReconcileReport, Streamed)> {
        self.stage(Stage::Fetch, async {
            let files = &resolved.selected;
            let source = self.layout.source().to_owned();
            let report =
                reconcile(&self.store, self.run, &source, files, reporter.as_ref()).await?;
            let ctx = Arc::new(
                self.fetch_ctx(origin, params, resolved, files, reporter)
                    .await?,
            );
            // Read before any worker starts: a shard published before this
            // run is handed over from here, one published by a worker
            // arrives through the channel.
            let published = self.store.published_paths().await?;
            let queue: VecDeque<FileRow> = files
                .iter()
                .filter(|f| !published.contains(&f.path))
                .cloned()
                .collect();
            let ready: VecDeque<String> = setup
                .workload()
                .files
                .iter()
                .filter(|f| published.contains(&f.file))
                .map(|f| f.file.clone())
                .collect();
            let workers = Workers::start(&ctx, files, queue, params.options.jobs).await?;
            let retire = opts.retire_sources;
            let mut streaming = match self.open_leading(setup, files, retire, reporter).await {
                Ok(streaming) => streaming,
                Err(e) => return Err(workers.abandon(&ctx, files, e).await),
            };
            self.convert_arrivals(
                &ctx,
                files,
                workers,
                ready,
                &mut streaming,
                retire,
                reporter,
            )
            .await?;
            Ok((report, Streamed::of(&streaming)))
        })
        .await
    }

    /// Saves the skeleton and the plan, then opens the converter on them
    /// (stale copies aside removed; with `retire`, every shard nothing
    /// unfinished needs retired).
    async fn open_leading<'s>(
        &self,
        setup: &'s StreamSetup,
        files: &[FileRow],
        retire: bool,
        reporter: &Arc<dyn Reporter>,
    ) -> Result<Streaming<'s>> {
        block_in_place(|| save_stream(&self.layout, setup))?;
        let mut streaming = Streaming::open(
            &self.store,
            self.run,
            &self.layout,
            setup,
            reporter.as_ref(),
        )
        .await?;
        streaming.remove_stale_copies(&self.store.punches().await?)?;
        if retire {
            let mut held = Held::new(None, &BTreeMap::new());
            self.retire_done(&mut streaming, files, &mut held).await?;
        }
        Ok(streaming)
    }
}
