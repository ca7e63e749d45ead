//! Fetch: download every selected file of the pinned listing into
//! `DIR/source/`, resuming from durable watermarks.
//!
//! - `reconcile`: before any byte moves, disk against the database (adopt
//!   verified files, revoke receipts whose file changed, cut `.part` tails
//!   the ledger does not claim).
//! - `cache`: taking a pinned file from a Hugging Face cache first.
//! - `transfer`: one file as one stream: resume, append what a validated
//!   response promised, checkpoint, verify, publish.
//! - `segmented`: a large file as several ranges into one sparse `.part`.
//! - `part`: the `.part` file.
//! - [`defaults`]: the defaults of [`FetchOptions`].
//! - `error`: [`FetchError`]; what the hub's HTTP fails with is a
//!   [`ftpipe_hub::HubError`] inside it.

// Unit tests see every dev-dependency; the lint is for the library itself.
#![cfg_attr(test, allow(unused_crate_dependencies))]

mod cache;
pub mod defaults;
mod error;
mod part;
mod reconcile;
mod segmented;
mod transfer;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use ftpipe_hub::HubError;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use ftpipe_receipts::{FileRow, Pin, RunId, Store};

use crate::defaults::{
    DEFAULT_CHECKPOINT_BYTES, DEFAULT_CHECKPOINT_INTERVAL, DEFAULT_CONNECTIONS, DEFAULT_MIN_RANGE,
    DEFAULT_MIN_RATE, DEFAULT_PIECE_SIZE, DEFAULT_SEGMENT_THRESHOLD, DEFAULT_SPLIT_BELOW_RATE,
    DEFAULT_STALL_WINDOW,
};
use ftpipe_fs::paths::safe_join;
use ftpipe_hub::client::HubClient;
use ftpipe_hub::hfcache::HfCache;
use ftpipe_progress::{ProgressEvent, Reporter};

pub use error::{FetchError, Result};
pub use ftpipe_fs::direct::IoMode;
pub use ftpipe_hub::headers::{
    ContentRange, PinContradiction, check_linked_meta, check_partial, etag, parse_content_range,
    retry_after_secs, strong_validator,
};
pub use ftpipe_hub::identity::expected_identity;
pub use reconcile::{ReconcileReport, reconcile};
pub use segmented::WRITE_ALIGN;

/// Tunables of the fetch stage.
#[derive(Debug, Clone)]
pub struct FetchOptions {
    /// Files transferred in parallel (at most `connections`).
    pub jobs: usize,
    /// HTTP requests in flight at once, over all files: each file takes
    /// one, then free ones split the largest remaining gaps of files at or
    /// above `segment_threshold`.
    pub connections: usize,
    /// Files at least this large may be fetched as several ranges.
    pub segment_threshold: u64,
    /// A range is never split below this size.
    pub min_range: u64,
    /// A new range takes a piece off the front of a file's unclaimed
    /// bytes: at least this much, or a `2 × connections`-th of the
    /// unclaimed gap when that is larger.
    pub piece_size: u64,
    /// A file is split for another connection only while its busy ones
    /// deliver less than this many bytes per second each (0: always).
    pub split_below_rate: u64,
    /// Durable checkpoint every this many bytes...
    pub checkpoint_bytes: u64,
    /// ...or this much time, whichever comes first.
    pub checkpoint_interval: Duration,
    /// Retries per file for transient failures.
    pub retries: u32,
    /// First retry delay (exponential with jitter after that).
    pub retry_base: Duration,
    /// Refuse to start when free space is below what is still needed.
    pub preflight: bool,
    /// A body slower than this many bytes per second over `stall_window`
    /// is a stall (0: no rate rule).
    pub min_rate: u64,
    /// Window of the minimum-rate rule.
    pub stall_window: Duration,
    /// How downloaded files' whole blocks are written (and a split file's
    /// read back): past the page cache (`O_DIRECT`, where the volume
    /// allows) or through it.
    pub io_mode: IoMode,
}

impl Default for FetchOptions {
    fn default() -> Self {
        FetchOptions {
            jobs: 4,
            connections: DEFAULT_CONNECTIONS,
            segment_threshold: DEFAULT_SEGMENT_THRESHOLD,
            min_range: DEFAULT_MIN_RANGE,
            piece_size: DEFAULT_PIECE_SIZE,
            split_below_rate: DEFAULT_SPLIT_BELOW_RATE,
            checkpoint_bytes: DEFAULT_CHECKPOINT_BYTES,
            checkpoint_interval: DEFAULT_CHECKPOINT_INTERVAL,
            retries: 8,
            retry_base: Duration::from_millis(250),
            preflight: true,
            min_rate: DEFAULT_MIN_RATE,
            stall_window: DEFAULT_STALL_WINDOW,
            io_mode: IoMode::Direct,
        }
    }
}

/// Shared state of one fetch.
pub struct FetchCtx {
    pub(crate) client: HubClient,
    pub(crate) store: Arc<Store>,
    pub(crate) run: RunId,
    pub(crate) pin: Pin,
    pub(crate) reporter: Arc<dyn Reporter>,
    pub(crate) opts: FetchOptions,
    /// Where the target directory's paths are (files land in `source()`).
    pub(crate) layout: ftpipe_fs::Layout,
    /// Set by the first job that hits a full volume: the others stop
    /// appending so the freed space reserve is left to the ledger.
    pub(crate) volume_full: AtomicBool,
    /// The connection budget (`FetchOptions::connections`).
    pub(crate) connections: Arc<Semaphore>,
    /// Files not yet started, and files holding a connection.
    pub(crate) unstarted: AtomicUsize,
    pub(crate) in_flight: AtomicUsize,
    /// Bytes not yet written of each pass of a file fetched in ranges (by
    /// pass id), as of its last claim: how close the whole fetch is to its
    /// end. Keyed by pass, so a pass that ends late never removes a newer
    /// pass of the same file.
    pub(crate) remaining: std::sync::Mutex<std::collections::HashMap<u64, u64>>,
    /// The next pass id.
    pub(crate) next_pass: std::sync::atomic::AtomicU64,
    /// A Hugging Face cache to take pinned files from before the network.
    pub(crate) hf_cache: Option<HfCache>,
    /// No network: files not durable and not in the cache fail.
    pub(crate) offline: bool,
}

impl FetchCtx {
    /// Bundles what every file transfer needs.
    pub fn new(
        client: HubClient,
        store: Arc<Store>,
        run: RunId,
        pin: Pin,
        reporter: Arc<dyn Reporter>,
        opts: FetchOptions,
        layout: ftpipe_fs::Layout,
    ) -> Self {
        FetchCtx {
            client,
            store,
            run,
            pin,
            reporter,
            layout,
            volume_full: AtomicBool::new(false),
            connections: Arc::new(Semaphore::new(opts.connections.max(1))),
            unstarted: AtomicUsize::new(0),
            in_flight: AtomicUsize::new(0),
            remaining: std::sync::Mutex::new(std::collections::HashMap::new()),
            next_pass: std::sync::atomic::AtomicU64::new(0),
            opts,
            hf_cache: None,
            offline: false,
        }
    }

    /// Records that pass `pass` has `bytes` left to fetch in ranges (0:
    /// done) and returns what all such passes have left.
    pub(crate) fn remaining_after(&self, pass: u64, bytes: u64) -> u64 {
        let mut all = self.remaining.lock().unwrap_or_else(|p| p.into_inner());
        if bytes == 0 {
            all.remove(&pass);
        } else {
            all.insert(pass, bytes);
        }
        all.values().fold(0u64, |a, b| a.saturating_add(*b))
    }

    /// Whether a file may take one more connection to split a range: only
    /// when no file is waiting to start that could start now.
    pub(crate) fn may_add_connection(&self) -> bool {
        self.unstarted.load(Ordering::SeqCst) == 0
            || self.in_flight.load(Ordering::SeqCst) >= self.opts.jobs.max(1)
    }

    /// Takes pinned files from `cache` (when given) before the network, and
    /// with `offline` never uses the network for file bodies.
    pub fn with_cache(mut self, cache: Option<HfCache>, offline: bool) -> Self {
        self.hf_cache = cache;
        self.offline = offline;
        self
    }
}

impl FetchCtx {
    /// The volume is full (a file write or a ledger write said so): stop
    /// appending file bytes in every job and free the space reserve so the
    /// ledger can still record what is on disk.
    pub(crate) fn mark_volume_full(&self) {
        self.volume_full.store(true, Ordering::SeqCst);
        self.store.release_space_reserve();
    }

    /// The `NoSpace` error for `path` on `volume`, with what its ledger row
    /// holds.
    async fn no_space(&self, path: &str, volume: PathBuf) -> FetchError {
        let (committed, still_needed) = match self.store.ledger_row(path).await {
            Ok(l) => (l.committed, l.expected.saturating_sub(l.committed)),
            Err(_) => (0, 0),
        };
        FetchError::NoSpace {
            volume,
            path: path.to_owned(),
            committed,
            still_needed,
        }
    }
}

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
    let store = &ctx.store;
    let receipts = store.published_paths().await?;
    let mut todo: Vec<FileRow> = files
        .iter()
        .filter(|f| f.selected && !receipts.contains(&f.path))
        .cloned()
        .collect();
    // Files fetched as one stream first, largest first; then the large
    // files, which split into ranges and so absorb the connections the
    // others leave free: the link is not left with one long stream at the end.
    let threshold = ctx.opts.segment_threshold.max(1);
    todo.sort_by_key(|f| (f.size >= threshold, std::cmp::Reverse(f.size)));
    let total: u64 = files.iter().map(|f| f.size).sum();
    let needed = bytes_still_needed(store, files).await?;
    ctx.reporter.report(ProgressEvent::FetchPlanned {
        files: files.len(),
        total_bytes: total,
        done_bytes: total - needed.min(total),
    });
    // `source/` and its entry in `DIR` durable before any byte is claimed.
    ftpipe_fs::durable::create_dirs_durably(ctx.layout.dir(), ctx.layout.source())
        .map_err(|e| FetchError::io("create", ctx.layout.source(), e))?;
    // Keep room for the ledger on the target volume (see
    // `Store::ensure_space_reserve`); released when the fetch ends.
    if needed > 0 && !tokio::task::block_in_place(|| store.ensure_space_reserve()) {
        tracing::warn!("no space reserve for the state database could be allocated");
    }
    let res = fetch_files(&ctx, files, todo, needed).await;
    store.release_space_reserve();
    res
}

async fn fetch_files(
    ctx: &Arc<FetchCtx>,
    files: &[FileRow],
    todo: Vec<FileRow>,
    needed: u64,
) -> Result<()> {
    let store = &ctx.store;
    if ctx.opts.preflight && needed > 0 {
        ftpipe_fs::require_space(ctx.layout.source(), needed)?;
    }
    let limit = Arc::new(Semaphore::new(ctx.opts.jobs.max(1)));
    let mut set = JoinSet::new();
    ctx.unstarted.store(todo.len(), Ordering::SeqCst);
    for file in todo {
        let final_path = safe_join(ctx.layout.source(), &file.path)?;
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
            let connection = ctx.connections.clone().acquire_owned().await;
            ctx.unstarted.fetch_sub(1, Ordering::SeqCst);
            ctx.in_flight.fetch_add(1, Ordering::SeqCst);
            let path = file.path.clone();
            // Once the volume is full, files not yet started are not started.
            let res = if ctx.volume_full.load(Ordering::SeqCst) {
                Err(ctx.no_space(&path, ctx.layout.source().to_owned()).await)
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
            ctx.in_flight.fetch_sub(1, Ordering::SeqCst);
            if let Err(e) = &res {
                ctx.reporter.report(ProgressEvent::FileFailed {
                    path,
                    error: e.to_string(),
                });
            }
            res
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
    // A full disk is reported with the bytes still needed by the whole fetch.
    if let Some(pos) = errors
        .iter()
        .position(|e| matches!(e, FetchError::NoSpace { .. }))
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
