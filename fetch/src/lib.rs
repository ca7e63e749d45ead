//! Fetch: download every selected file of the pinned listing into
//! `DIR/source/`, resuming from durable watermarks.
//!
//! Modules, in the order a file meets them:
//! - `ctx`: [`FetchCtx`] (what every transfer shares), [`FetchOptions`] and
//!   [`CheckpointBytes`];
//!   [`defaults`]: the defaults of [`FetchOptions`].
//! - `reconcile`: before any byte moves, disk against the database (adopt
//!   verified files, revoke receipts whose file changed, cut `.part` tails
//!   the ledger does not claim).
//! - `cache`: taking a pinned file from a Hugging Face cache first.
//! - `source`: the byte-source seam in transport-neutral terms
//!   ([`ByteSource`]): a span of a file asked under a validator
//!   ([`Ask`]), a typed answer ([`Reply`]: the span sent, the whole file
//!   instead, or a refusal; a [`WireRecord`] for the attempt's row) and a
//!   [`Body`] of chunks. `hubsource`: the hub's HTTP implements it, the
//!   one place HTTP statuses and headers become outcomes ([`HubSource`]).
//!   Other sources (object storage for `pull` and mirrors) live above this
//!   crate and fail with a [`SourceFailure`].
//! - `attempt`: one request of either path: what it records, the one
//!   check of the typed answer (accepted / range ignored / refused), the
//!   body's minimum rate, the receipt after publication.
//! - `transfer`: one file as one stream: resume, append what a validated
//!   response promised, checkpoint, verify, publish.
//! - `segmented`: a large file as several ranges into one sparse `.part`
//!   (`claim`: the pure claim policy; `shared`: what the coordinator and
//!   its workers share; `coordinator`; `worker`).
//! - `part`: the `.part` file; `extent`: block alignment and the data
//!   extents a crash leaves past a watermark.
//! - `xet`: Xet storage as a byte source ([`XetSource`]): read token,
//!   reconstruction, xorb ranges, chunk decoding and hashing, each term
//!   recorded in the store; terms an earlier revision's files hold read
//!   back from them and checked ([`ChunkReuse`]).
//! - `error`: [`FetchError`]; what the hub's HTTP fails with is a
//!   [`ftpipe_hub::HubError`] inside it.
//!
//! Imports run one way: `error`, `source`, `part` and `extent` are
//! leaves; `hubsource` builds on `source`, `ctx` on `hubsource`;
//! `attempt` builds on them; `transfer` and `segmented` on `attempt`; the
//! crate root starts them.

// Unit tests see every dev-dependency; the lint is for the library itself.
#![cfg_attr(test, allow(unused_crate_dependencies))]
// Unit tests build their inputs with plain `std::fs` calls (clippy.toml).
#![cfg_attr(test, allow(clippy::disallowed_methods))]

mod attempt;
mod cache;
mod ctx;
pub mod defaults;
mod error;
mod extent;
mod hubsource;
mod part;
mod reconcile;
mod segmented;
mod source;
mod transfer;
mod xet;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use ftpipe_hub::HubError;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use ftpipe_receipts::{FileRow, Store};

use ftpipe_fs::ErrorClass;
use ftpipe_fs::paths::safe_join;
use ftpipe_progress::ProgressEvent;

pub use ctx::{CheckpointBytes, FetchCtx, FetchOptions};
pub use error::{FetchError, Result, SourceFailure};
pub use extent::WRITE_ALIGN;
pub use ftpipe_fs::direct::IoMode;
pub use ftpipe_hub::headers::{
    ContentRange, PinContradiction, check_linked_meta, check_partial, etag, parse_content_range,
    retry_after_secs, strong_validator,
};
pub use ftpipe_hub::identity::expected_identity;
pub use hubsource::HubSource;
pub use reconcile::{ReconcileReport, reconcile};
pub use source::{
    Ask, Body, BodyError, ByteSource, ReadOutcome, Reply, SentSpan, SourceFuture, Span, WireRecord,
};
pub use xet::{ChunkReuse, XetError, XetFile, XetSource};

/// Bytes still needed for the selected files (expected minus durable).
pub async fn bytes_still_needed(store: &Store, files: &[FileRow]) -> Result<u64> {
    let receipts = store.published_paths().await?;
    let ledger = store.ledger().await?;
    let selected: std::collections::HashSet<&str> = files.iter().map(|f| f.path.as_str()).collect();
    Ok(ledger
        .iter()
        .filter(|l| selected.contains(l.path.as_str()) && !receipts.contains(&l.path))
        .map(|l| l.expected.saturating_sub(l.committed))
        .sum())
}

/// One file, as several ranges when it is large enough (or was begun so),
/// else as one stream, starting on `connection`; a retry waiting its delay gives it back.
async fn fetch_one(
    ctx: &Arc<FetchCtx>,
    file: FileRow,
    final_path: PathBuf,
    connection: tokio::sync::OwnedSemaphorePermit,
) -> Result<()> {
    let segmented = (ctx.opts.connections > 1 && file.size >= ctx.opts.segment_threshold.max(1))
        || !ctx.store.ranges(&file.path).await?.is_empty();
    if segmented {
        segmented::fetch_segmented(ctx.clone(), file, final_path, connection).await
    } else {
        transfer::fetch_file(ctx.clone(), file, final_path, connection).await
    }
}

/// Downloads every selected file not yet published. Reconciliation must
/// have run first.
pub async fn fetch(ctx: Arc<FetchCtx>, files: &[FileRow]) -> Result<()> {
    let mut todo = unpublished(&ctx, files).await?;
    order_for_the_link(&ctx, &mut todo);
    let needed = begin(&ctx, files).await?;
    ctx.jobs.admit(todo.len());
    let res = fetch_files(&ctx, files, todo, needed).await;
    ctx.store.release_space_reserve();
    res
}

/// Orders `todo` for the link: files fetched as one stream first, largest
/// first; then the large files, which split into ranges and so absorb the
/// connections the others leave free: the link is not left with one long
/// stream at the end.
pub fn order_for_the_link(ctx: &FetchCtx, todo: &mut [FileRow]) {
    let threshold = ctx.opts.segment_threshold.max(1);
    todo.sort_by_key(|f| (f.size >= threshold, std::cmp::Reverse(f.size)));
}

/// The selected files of `files` without a receipt.
pub async fn unpublished(ctx: &FetchCtx, files: &[FileRow]) -> Result<Vec<FileRow>> {
    let receipts = ctx.store.published_paths().await?;
    Ok(files
        .iter()
        .filter(|f| f.selected && !receipts.contains(&f.path))
        .cloned()
        .collect())
}

/// Starts a fetch of `files`: reports it, makes `source/` durable and
/// reserves room for the ledger. Returns the bytes still needed. A fetch
/// begun so ends with [`end`].
pub async fn begin(ctx: &FetchCtx, files: &[FileRow]) -> Result<u64> {
    let store = &ctx.store;
    let total: u64 = files.iter().map(|f| f.size).sum();
    let needed = bytes_still_needed(store, files).await?;
    let receipts = store.published_paths().await?;
    ctx.reporter.report(ProgressEvent::FetchPlanned {
        files: files.len(),
        done_files: files.iter().filter(|f| receipts.contains(&f.path)).count(),
        total_bytes: total,
        done_bytes: total - needed.min(total),
    });
    // `source/` and its entry in `DIR` durable before any byte is claimed.
    ftpipe_fs::durable::create_dirs_durably(ctx.layout.dir(), ctx.dest())
        .map_err(|e| FetchError::io("create", ctx.dest(), e))?;
    // Keep room for the ledger on the target volume (see
    // `Store::ensure_space_reserve`); released when the fetch ends.
    if needed > 0 && !tokio::task::block_in_place(|| store.ensure_space_reserve()) {
        tracing::warn!("no space reserve for the state database could be allocated");
    }
    Ok(needed)
}

/// One file of a fetch whose order the caller drives (`run`), after
/// [`begin`]. Only files the caller has admitted count as not yet started
/// (so a large file may take idle connections while others wait for
/// admission): this one from now on.
pub async fn fetch_file(ctx: Arc<FetchCtx>, file: FileRow) -> Result<()> {
    ctx.jobs.admit(1);
    fetch_admitted(ctx, file).await
}

/// Counts `n` files the caller will hand to [`fetch_admitted`] as not yet
/// started, from now until each takes its connection: while one waits in
/// the caller's queue, a file in flight is not alone on the link.
pub fn admit(ctx: &FetchCtx, n: usize) {
    ctx.jobs.admit(n);
}

/// Uncounts `n` files counted by [`admit`] that will not be handed to
/// [`fetch_admitted`] (the caller stopped): files in flight are no longer
/// held back from more connections by files that will never start.
pub fn withdraw(ctx: &FetchCtx, n: usize) {
    ctx.jobs.withdraw(n);
}

/// [`fetch_file`] of a file counted by [`admit`].
pub async fn fetch_admitted(ctx: Arc<FetchCtx>, file: FileRow) -> Result<()> {
    let final_path = match safe_join(ctx.dest(), &file.path) {
        Ok(p) => p,
        Err(e) => {
            ctx.jobs.withdraw(1);
            return Err(e.into());
        }
    };
    run_job(ctx, file, final_path).await
}

/// Ends a fetch begun with [`begin`] whose files failed with `errors`:
/// the one error to report (see `combine`).
pub async fn end(ctx: &FetchCtx, files: &[FileRow], errors: Vec<FetchError>) -> Result<()> {
    ctx.store.release_space_reserve();
    combine(ctx, files, errors).await
}

async fn fetch_files(
    ctx: &Arc<FetchCtx>,
    files: &[FileRow],
    todo: Vec<FileRow>,
    needed: u64,
) -> Result<()> {
    if ctx.opts.preflight && needed > 0 {
        ftpipe_fs::require_space(ctx.dest(), needed)?;
    }
    let limit = Arc::new(Semaphore::new(ctx.opts.jobs.max(1)));
    let mut set = JoinSet::new();
    for file in todo {
        let final_path = safe_join(ctx.dest(), &file.path)?;
        let ctx = ctx.clone();
        // The job slot is taken here, in the planned order: a task polled
        // first is not necessarily the one spawned first.
        let job = limit
            .clone()
            .acquire_owned()
            .await
            .map_err(|e| FetchError::internal_from("job pool", e))?;
        set.spawn(async move {
            let _job = job;
            run_job(ctx, file, final_path).await
        });
    }
    let mut errors = Vec::new();
    while let Some(joined) = set.join_next().await {
        match joined {
            Ok(Ok(())) => {}
            Ok(Err(e)) => errors.push(e),
            Err(join) => errors.push(FetchError::internal_from("fetch task", join)),
        }
    }
    combine(ctx, files, errors).await
}

/// One file's job, once its job slot is held: waits for a connection,
/// fetches the file (unless the volume is already full), and reports a
/// failure; a full state database is the same full disk.
async fn run_job(ctx: Arc<FetchCtx>, file: FileRow, final_path: PathBuf) -> Result<()> {
    let connection = ctx.connections.clone().acquire_owned().await;
    ctx.jobs.start();
    let path = file.path.clone();
    // Once the volume is full, files not yet started are not started.
    let res = if ctx.volume_full.load(Ordering::SeqCst) {
        Err(ctx.no_space(&path, ctx.dest().to_owned()).await)
    } else {
        let fetched = match connection {
            Err(e) => Err(FetchError::internal_from("connection pool", e)),
            Ok(connection) => fetch_one(&ctx, file, final_path, connection).await,
        };
        match fetched {
            // The state database shares the volume: SQLITE_FULL is
            // the same full disk, report it as such (exit 5).
            Err(FetchError::Store(s)) if s.is_disk_full() => {
                ctx.mark_volume_full();
                let db_dir = ctx.store.path().parent().map(PathBuf::from);
                let volume = db_dir.unwrap_or_else(|| ctx.layout.state_dir().to_owned());
                Err(ctx.no_space(&path, volume).await)
            }
            r => r,
        }
    };
    ctx.jobs.finish();
    if let Err(e) = &res {
        ctx.reporter.report(ProgressEvent::FileFailed {
            path,
            error: e.to_string(),
        });
    }
    res
}

/// The one error of a fetch whose jobs failed with `errors` (none: `Ok`):
/// offline, every file the network would have had to provide; a full
/// disk, with the bytes the whole fetch still needs; else the only error,
/// or the first of several.
async fn combine(ctx: &FetchCtx, files: &[FileRow], mut errors: Vec<FetchError>) -> Result<()> {
    let store = &ctx.store;
    let total_files = files.len();
    // Offline: one error naming every file the network would have had to
    // provide, with the bytes still needed.
    if ctx.offline
        && errors
            .iter()
            .any(|e| matches!(e, FetchError::Hub(HubError::Offline { .. })))
    {
        let ledger = store.ledger().await?;
        let receipts = store.published_paths().await?;
        let mut missing = Vec::new();
        let mut bytes = 0u64;
        for f in files {
            if receipts.contains(&f.path) {
                continue;
            }
            let committed = ledger
                .iter()
                .find(|l| l.path == f.path)
                .map_or(0, |l| l.committed);
            missing.push(f.path.clone());
            bytes += f.size.saturating_sub(committed);
        }
        return Err(FetchError::OfflineMissing {
            dir: ctx.layout.dir().to_owned(),
            cache: ctx.hf_cache.as_ref().map(|c| c.root.clone()),
            missing,
            bytes,
        });
    }
    // A full disk is reported with the bytes still needed by the whole fetch,
    // unless a task failed on a bug: the more severe class wins.
    let internal = errors.iter().any(|e| e.class() == ErrorClass::Internal);
    if let Some(pos) = errors
        .iter()
        .position(|e| matches!(e, FetchError::NoSpace { .. }))
        .filter(|_| !internal)
    {
        let still = bytes_still_needed(store, files).await?;
        if let FetchError::NoSpace { volume, path, .. } = errors.swap_remove(pos) {
            // What the ledger holds, not what the failed job last saw.
            let committed = store.ledger_row(&path).await?.committed;
            return Err(FetchError::NoSpace {
                volume,
                path,
                committed,
                still_needed: still,
            });
        }
    }
    match FetchError::several(total_files, errors) {
        None => Ok(()),
        Some(e) => Err(e),
    }
}
