//! Writing components in parallel: up to `--jobs` at a time on blocking
//! threads, each receipt committed as soon as its file is durable
//! ([`crate::write::write_component`] fsyncs file and directories first).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use tokio::task::block_in_place;

use ftpipe_formats::Q3GlobalScale;
use ftpipe_receipts::{ComponentReceipt, RunId, Store};

use crate::component::{ComponentContent, ComponentKind};
use crate::error::{ConvertError, Result};
use crate::options::ConvertOptions;
use crate::plan::Plan;
use crate::retire::Retirer;
use crate::skeleton::Skeleton;
use crate::write::{Sources, read_global_scale, write_component};
use ftpipe_fs::Layout;
use ftpipe_fs::crashpoint::{self, CrashPoint};
use ftpipe_progress::{ProgressEvent, Reporter};

/// One batch of components written in parallel.
pub(super) struct Batch<'a> {
    pub(super) store: &'a Arc<Store>,
    pub(super) run: RunId,
    pub(super) skel: &'a Skeleton,
    pub(super) paths: &'a Layout,
    pub(super) opts: &'a ConvertOptions,
    pub(super) reporter: &'a dyn Reporter,
    pub(super) sources: Arc<Sources>,
    pub(super) retirer: &'a Retirer,
}

impl Batch<'_> {
    /// Writes `pending` (indices into `plan.components`): global scales
    /// first, then the rest encoded under the scales' receipted bytes (read
    /// back and checked).
    pub(super) async fn write_pending(
        &self,
        pending: Vec<usize>,
        plan: &Arc<Plan>,
        done: &mut BTreeMap<String, ComponentReceipt>,
    ) -> Result<usize> {
        let (scales, rest): (Vec<_>, Vec<_>) = pending
            .into_iter()
            .partition(|&i| plan.components[i].kind == ComponentKind::Q3GlobalScale);
        let mut written = self.write_all(plan, scales, done, BTreeMap::new()).await?;
        if rest.is_empty() {
            return Ok(written);
        }
        let mut g = BTreeMap::new();
        for c in &plan.components {
            if let ComponentContent::Q3GlobalScale { layer, .. } = c.content
                && let Some(r) = done.get(&c.name)
            {
                g.insert(
                    layer,
                    block_in_place(|| {
                        read_global_scale(self.paths.artifact(), &c.name, &r.sha256)
                    })?,
                );
            }
        }
        written += self.write_all(plan, rest, done, g).await?;
        Ok(written)
    }

    /// Writes `components` (indices into `plan.components`) up to `jobs` at
    /// a time, committing each receipt as soon as its file is durable.
    /// After the first failure no new component starts; those in flight
    /// finish (and get receipts).
    async fn write_all(
        &self,
        plan: &Arc<Plan>,
        components: Vec<usize>,
        done: &mut BTreeMap<String, ComponentReceipt>,
        scales: BTreeMap<u64, Q3GlobalScale>,
    ) -> Result<usize> {
        let failed = Arc::new(AtomicBool::new(false));
        let scales = Arc::new(scales);
        let tasks = futures_util::stream::iter(components).map(|i| {
            let (sources, scales, failed) = (self.sources.clone(), scales.clone(), failed.clone());
            let artifact = self.paths.artifact().to_owned();
            let plan = plan.clone();
            tokio::task::spawn_blocking(move || {
                if failed.load(Ordering::SeqCst) {
                    return (i, None);
                }
                let r = write_component(&sources, &artifact, &plan.components[i], &scales);
                if r.is_err() {
                    failed.store(true, Ordering::SeqCst);
                }
                (i, Some(r))
            })
        });
        let jobs = self.opts.jobs.max(1);
        // With retirement, receipts land in write order, so a shard is freed
        // no later than the space model (`space::artifact_peak`) assumes.
        let mut results: BoxStream<'_, _> = if self.opts.retire_sources {
            tasks.buffered(jobs).boxed()
        } else {
            tasks.buffer_unordered(jobs).boxed()
        };
        let mut first_err = None;
        let mut written = 0;
        while let Some(joined) = results.next().await {
            let (i, r) = joined.map_err(|e| ConvertError::internal_from("conversion task", e))?;
            let c = &plan.components[i];
            match r {
                None => {}
                Some(Err(e)) => {
                    first_err.get_or_insert(e);
                }
                Some(Ok(w)) => {
                    // Renamed into place and fsynced, no receipt yet.
                    crashpoint::hit(CrashPoint::ComponentRenamed);
                    let receipt = self.skel.receipt(c, w, self.run)?;
                    self.store.put_component(self.run, &receipt).await?;
                    self.reporter.report(ProgressEvent::ComponentWritten {
                        path: c.name.clone(),
                        kind: receipt.kind.clone(),
                        size: receipt.size,
                    });
                    done.insert(c.name.clone(), receipt);
                    written += 1;
                    self.retirer.written(&c.name);
                    if self.opts.retire_sources {
                        self.retirer
                            .retire_eligible(self.store, self.run, self.skel, done, self.paths)
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
