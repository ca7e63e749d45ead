//! Where a repo's pin, listing and bytes come from: the [`Origin`] seam,
//! held as `Arc<dyn Origin>`. The hub's HTTP ([`HubOrigin`]) and a mirror
//! in object storage (`crate::mirror::Mirror`) implement it; every stage
//! that needs a repo's files (resolve, plan, fetch) goes through it and
//! never asks which one it holds. `crate::endpoint` builds the origin the
//! command line names.
//!
//! Adding a source: implement [`ftpipe_fetch::ByteSource`] for its bytes
//! (mapping its protocol onto the typed outcomes, in one place), implement
//! [`Origin`] for its listing and header reads, and give
//! `crate::endpoint::Endpoint` the form that names it.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin as Pinned;
use std::sync::Arc;
use std::time::Duration;

use ftpipe_fetch::{ByteSource, ChunkReuse, FetchCtx, HubSource, XetFile, XetSource};
use ftpipe_hub::HubError;
use ftpipe_hub::client::HubClient;
use ftpipe_hub::hfcache::HfCache;
use ftpipe_hub::remote::{PinnedRepo, RemoteFiles};
use ftpipe_hub::resolve::{ResolveRequest, Resolved, list_tree, resolve, revision_commit};
use ftpipe_progress::Reporter;
use ftpipe_receipts::{FileRow, Pin, Store};

use crate::error::Result;

/// A future an [`Origin`] returns (object-safe).
pub(crate) type OriginFuture<'a, T> = Pinned<Box<dyn Future<Output = T> + Send + 'a>>;

/// Where a repo's pin, listing and bytes come from.
pub(crate) trait Origin: Send + Sync {
    /// No network for file bodies (the hub when offline).
    fn is_offline(&self) -> bool {
        false
    }

    /// The resolve stage: the pin and listing, saved in `store`.
    fn resolve<'a>(
        &'a self,
        store: &'a Store,
        req: &'a ResolveRequest,
        reporter: &'a dyn Reporter,
    ) -> OriginFuture<'a, Result<Resolved>>;

    /// The commit `revision` of `repo` names and its listing, read-only
    /// (the `plan` command).
    fn listing<'a>(
        &'a self,
        repo: &'a str,
        revision: &'a str,
    ) -> OriginFuture<'a, Result<(String, Vec<FileRow>)>>;

    /// Whether a read-only plan takes the commit and listing from a stored
    /// pin of the same repo and revision instead of [`Origin::listing`].
    fn plan_reuses_stored_pin(&self) -> bool {
        true
    }

    /// The byte source of `todo` (the files still to fetch) at `pin`
    /// (recording what it must in `store`; taking what earlier fetches
    /// hold from them where the source can, `reuse`).
    fn byte_source<'a>(
        &'a self,
        pin: &'a Pin,
        todo: &'a [FileRow],
        store: &'a Arc<Store>,
        reuse: ChunkReuse,
    ) -> OriginFuture<'a, Result<Arc<dyn ByteSource>>>;

    /// `ctx` with what this origin adds before the network (the hub: a
    /// Hugging Face cache, offline mode).
    fn with_cache(&self, ctx: FetchCtx) -> FetchCtx {
        ctx
    }

    /// The whole of `path` at `pin` (`size` bytes), for the planner.
    fn read_whole<'a>(
        &'a self,
        pin: &'a Pin,
        path: &'a str,
        size: u64,
    ) -> OriginFuture<'a, Result<Vec<u8>, HubError>>;

    /// Bytes `first..=last` of the `size`-byte `path` at `pin`.
    fn read_range<'a>(
        &'a self,
        pin: &'a Pin,
        path: &'a str,
        span: (u64, u64),
        size: u64,
    ) -> OriginFuture<'a, Result<Vec<u8>, HubError>>;
}

/// A pinned revision's files through an origin: what the planner reads.
pub(crate) struct OriginFiles<'a> {
    /// The origin.
    pub origin: &'a dyn Origin,
    /// The pin its files are read at.
    pub pin: &'a Pin,
}

impl RemoteFiles for OriginFiles<'_> {
    async fn read_whole(&self, path: &str, size: u64) -> Result<Vec<u8>, HubError> {
        self.origin.read_whole(self.pin, path, size).await
    }

    async fn read_range(
        &self,
        path: &str,
        first: u64,
        last: u64,
        size: u64,
    ) -> Result<Vec<u8>, HubError> {
        self.origin
            .read_range(self.pin, path, (first, last), size)
            .await
    }
}

/// The hub's HTTP, with what a fetch may take before it.
pub(crate) struct HubOrigin {
    /// The client (refusing every request when offline).
    pub client: HubClient,
    /// A Hugging Face cache to take pinned files from first.
    pub hf_cache: Option<HfCache>,
    /// No network at all.
    pub offline: bool,
    /// Files the listing names with a Xet hash come from Xet storage
    /// (off: `--no-xet`, `HF_HUB_DISABLE_XET=1`; all through `resolve`).
    pub xet: bool,
    /// The stall rule of every read (the CAS's too).
    pub read_timeout: Duration,
}

impl HubOrigin {
    fn files<'a>(&'a self, pin: &'a Pin) -> PinnedRepo<'a> {
        PinnedRepo {
            client: &self.client,
            repo: &pin.repo,
            commit: &pin.commit,
        }
    }
}

impl Origin for HubOrigin {
    fn is_offline(&self) -> bool {
        self.client.is_offline()
    }

    fn resolve<'a>(
        &'a self,
        store: &'a Store,
        req: &'a ResolveRequest,
        reporter: &'a dyn Reporter,
    ) -> OriginFuture<'a, Result<Resolved>> {
        Box::pin(async move { Ok(resolve(&self.client, store, req, reporter).await?) })
    }

    fn listing<'a>(
        &'a self,
        repo: &'a str,
        revision: &'a str,
    ) -> OriginFuture<'a, Result<(String, Vec<FileRow>)>> {
        Box::pin(async move {
            let commit = revision_commit(&self.client, repo, revision).await?;
            let listing = list_tree(&self.client, repo, &commit).await?;
            Ok((commit, listing))
        })
    }

    /// The hub's `resolve`, with the files the listing names with a Xet
    /// hash taken from Xet storage instead (unless Xet is off): the source
    /// is chosen per file here, not in the transfer. Xet terms whose chunks
    /// earlier fetches hold are read back from them (`reuse`).
    fn byte_source<'a>(
        &'a self,
        pin: &'a Pin,
        todo: &'a [FileRow],
        store: &'a Arc<Store>,
        reuse: ChunkReuse,
    ) -> OriginFuture<'a, Result<Arc<dyn ByteSource>>> {
        Box::pin(async move {
            let hub: Arc<dyn ByteSource> = Arc::new(HubSource {
                client: self.client.clone(),
                repo: pin.repo.clone(),
                commit: pin.commit.clone(),
            });
            let xet_files: HashMap<String, XetFile> = todo
                .iter()
                .filter(|f| self.xet && f.size > 0)
                .filter_map(|f| {
                    let file = XetFile {
                        xet_hash: f.xet_hash.clone()?,
                        size: f.size,
                    };
                    Some((f.path.clone(), file))
                })
                .collect();
            if xet_files.is_empty() {
                return Ok(hub);
            }
            let xet = XetSource::new(
                self.client.clone(),
                &pin.repo,
                &pin.commit,
                xet_files,
                self.read_timeout,
                store.clone(),
                reuse,
                hub,
            )?;
            Ok(Arc::new(xet) as Arc<dyn ByteSource>)
        })
    }

    fn with_cache(&self, ctx: FetchCtx) -> FetchCtx {
        ctx.with_cache(self.hf_cache.clone(), self.offline)
    }

    fn read_whole<'a>(
        &'a self,
        pin: &'a Pin,
        path: &'a str,
        size: u64,
    ) -> OriginFuture<'a, Result<Vec<u8>, HubError>> {
        Box::pin(async move { self.files(pin).read_whole(path, size).await })
    }

    fn read_range<'a>(
        &'a self,
        pin: &'a Pin,
        path: &'a str,
        (first, last): (u64, u64),
        size: u64,
    ) -> OriginFuture<'a, Result<Vec<u8>, HubError>> {
        Box::pin(async move { self.files(pin).read_range(path, first, last, size).await })
    }
}
