//! The pipelined `run` without a budget plans beside its first transfers.
//!
//! Nothing such a fetch does waits for the plan: its workers take every
//! unpublished file in the link's order (largest first) whatever the plan
//! says, and a shard they verify waits in the arrivals channel until the
//! converter is open. So the fetch stage starts first (reconcile, room
//! for the sources still needed, the workers) and the plan stage (the
//! headers, the skeleton, the preflight with the artifact's room) runs
//! inside it while the first files arrive: the stage log reads
//! `fetch:started`, `plan:started`, `plan:completed`, `fetch:completed`.
//! The converter then takes the shards published before this run, in the
//! plan's order, and each shard the workers verify, in the order verified.
//!
//! A plan that fails (a checkpoint it refuses, a volume without room for
//! the artifact, an artifact of another identity) stops the transfers
//! where they are, as a kill would: what they made durable is kept, and
//! the next run goes on from it.
//!
//! Only when nothing was released before (no shard retired, punched or
//! copied aside: which files such a run fetches depends on the plan's
//! workload) and the volume has room for the sources still needed twice
//! over (else the preflight may refuse, and it refuses before any shard
//! body is fetched); otherwise the run plans first
//! ([`Pipeline::streamed_fetch_stage`]).

use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;

use ftpipe_convert::ConvertOptions;
use ftpipe_convert::pipelined::{StreamSetup, Streaming};
use ftpipe_fetch::{FetchCtx, ReconcileReport, bytes_still_needed, reconcile};
use ftpipe_hub::resolve::Resolved;
use ftpipe_progress::Reporter;
use ftpipe_receipts::{FileRow, Stage};

use super::{Held, Streamed, Transfers};
use crate::origin::Origin;
use crate::{FetchParams, Pipeline, Result};

/// How many times the source bytes still needed the volume must hold for
/// the transfers to start before the plan's preflight.
const LEAD_ROOM_FACTOR: u64 = 2;

impl Pipeline {
    /// The fetch may start before the plan: no shard was retired, punched
    /// or copied aside by an earlier run, and (unless `--no-preflight`)
    /// the volume has room for the source bytes still needed twice over.
    /// The artifact's size is known only from the plan; the release
    /// profiles copy tensors verbatim or shrink them, so a volume that
    /// cannot hold the sources twice may be one the preflight refuses, and
    /// then it refuses before any shard body is fetched.
    pub(super) async fn fetch_may_lead_the_plan(
        &self,
        params: &FetchParams,
        resolved: &Resolved,
    ) -> Result<bool> {
        if !self.store.retired().await?.is_empty() || !self.store.punches().await?.is_empty() {
            return Ok(false);
        }
        if !params.options.preflight {
            return Ok(true);
        }
        let needed = bytes_still_needed(&self.store, &resolved.selected).await?;
        let room = ftpipe_fs::space::available(self.layout.dir())?;
        Ok(needed.saturating_mul(LEAD_ROOM_FACTOR) <= room)
    }

    /// The fetch stage with the plan stage inside it, beside the first
    /// transfers; returns what the convert stage needs.
    pub(super) async fn fetch_with_plan_beside(
        &self,
        origin: &dyn Origin,
        params: &FetchParams,
        resolved: &Resolved,
        opts: &ConvertOptions,
        reporter: &Arc<dyn Reporter>,
    ) -> Result<(ReconcileReport, StreamSetup, Streamed)> {
        self.stage(Stage::Fetch, async {
            let files = resolved.selected.clone();
            let source = self.layout.source().to_owned();
            let report =
                reconcile(&self.store, self.run, &source, &files, reporter.as_ref()).await?;
            let ctx = Arc::new(
                self.fetch_ctx(origin, params, resolved, &files, reporter)
                    .await?,
            );
            let published = self.store.published_paths().await?;
            let mut queue: Vec<FileRow> = files
                .iter()
                .filter(|f| !published.contains(&f.path))
                .cloned()
                .collect();
            ftpipe_fetch::order_for_the_link(&ctx, &mut queue);
            ftpipe_fetch::begin(&ctx, &files).await?;
            let transfers = Transfers::start(&ctx, queue.into(), params.options.jobs);
            let planned = self
                .streamed_plan_stage(origin, params, resolved, opts, None, reporter)
                .await;
            let setup = match planned {
                Ok(setup) => setup,
                Err(e) => return Err(transfers.abandon(&ctx, &files, e).await),
            };
            let streamed = self
                .convert_beside(&ctx, &files, transfers, &setup, &published, opts, reporter)
                .await?;
            Ok((report, setup, streamed))
        })
        .await
    }

    /// Opens the converter on `setup` and converts the shards `published`
    /// before this run, then every shard `transfers` verify.
    #[allow(clippy::too_many_arguments)]
    async fn convert_beside(
        &self,
        ctx: &FetchCtx,
        files: &[FileRow],
        transfers: Transfers,
        setup: &StreamSetup,
        published: &BTreeSet<String>,
        opts: &ConvertOptions,
        reporter: &Arc<dyn Reporter>,
    ) -> Result<Streamed> {
        let retire = opts.retire_sources;
        let opened = self.open_beside(setup, files, retire, reporter).await;
        let mut streaming = match opened {
            Ok(streaming) => streaming,
            Err(e) => return Err(transfers.abandon(ctx, files, e).await),
        };
        let ready: VecDeque<String> = setup
            .workload()
            .files
            .iter()
            .filter(|f| published.contains(&f.file))
            .map(|f| f.file.clone())
            .collect();
        self.convert_arrivals(
            ctx,
            files,
            transfers,
            ready,
            &mut streaming,
            retire,
            reporter,
        )
        .await?;
        Ok(Streamed {
            written: streaming.written(),
            retired: streaming.retired().to_vec(),
        })
    }

    /// The converter on `setup`, stale copies of PLE spans removed and,
    /// with `retire`, every shard nothing unfinished needs retired.
    async fn open_beside<'s>(
        &self,
        setup: &'s StreamSetup,
        files: &[FileRow],
        retire: bool,
        reporter: &Arc<dyn Reporter>,
    ) -> Result<Streaming<'s>>
    where
        Self: 's,
    {
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
            let mut held = Held::new(None, &Default::default());
            self.retire_done(&mut streaming, files, &mut held).await?;
        }
        Ok(streaming)
    }
}
