//! The shared state of one fetch and its tunables: what every file's
//! transfer reads (the store, the pin, the byte source, the options) and
//! the counters the jobs share (connections, files waiting, bytes left).
//! Its own module so that the transfer modules depend on it, not on the
//! crate root that starts them.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::Semaphore;

use ftpipe_hub::client::HubClient;
use ftpipe_hub::hfcache::HfCache;
use ftpipe_progress::Reporter;
use ftpipe_receipts::{Pin, RunId, Store};

use crate::defaults::{
    CHECKPOINT_SHARE_OF_FILE, DEFAULT_CHECKPOINT_INTERVAL, DEFAULT_CONNECTIONS, DEFAULT_MIN_RANGE,
    DEFAULT_MIN_RATE, DEFAULT_PIECE_SIZE, DEFAULT_SEGMENT_THRESHOLD, DEFAULT_SPLIT_BELOW_RATE,
    DEFAULT_STALL_WINDOW, MAX_CHECKPOINT_BYTES, MIN_CHECKPOINT_BYTES,
};
use crate::error::FetchError;
use crate::hubsource::HubSource;
use crate::source::ByteSource;
use ftpipe_fs::direct::IoMode;

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
    /// Durable checkpoint every this many bytes of a file...
    pub checkpoint_bytes: CheckpointBytes,
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

/// How many bytes of a file a transfer receives between durable
/// checkpoints: what a kill can cost it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckpointBytes {
    /// A share of the file's size ([`CHECKPOINT_SHARE_OF_FILE`]) within
    /// [`MIN_CHECKPOINT_BYTES`] and [`MAX_CHECKPOINT_BYTES`], so a kill
    /// costs a large file a bounded share of its bytes.
    ShareOfFile,
    /// This many bytes (at least 1) whatever the file's size
    /// (`--checkpoint-bytes`).
    Fixed(u64),
}

impl CheckpointBytes {
    /// The checkpoint interval of a file of `size` bytes.
    pub fn for_file(self, size: u64) -> u64 {
        match self {
            CheckpointBytes::ShareOfFile => {
                (size / CHECKPOINT_SHARE_OF_FILE).clamp(MIN_CHECKPOINT_BYTES, MAX_CHECKPOINT_BYTES)
            }
            CheckpointBytes::Fixed(n) => n.max(1),
        }
    }
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
            checkpoint_bytes: CheckpointBytes::ShareOfFile,
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
    /// Where file bytes come from (the hub's HTTP for the pinned commit).
    pub(crate) source: Arc<dyn ByteSource>,
    pub(crate) store: Arc<Store>,
    pub(crate) run: RunId,
    pub(crate) pin: Pin,
    pub(crate) reporter: Arc<dyn Reporter>,
    pub(crate) opts: FetchOptions,
    /// Where the target directory's paths are.
    pub(crate) layout: ftpipe_fs::Layout,
    /// Where files land: `DIR/source` for a hub fetch, `DIR/artifact`
    /// for a pull.
    pub(crate) dest: PathBuf,
    /// Set by the first job that hits a full volume: the others stop
    /// appending so the freed space reserve is left to the ledger.
    pub(crate) volume_full: AtomicBool,
    /// The connection budget (`FetchOptions::connections`).
    pub(crate) connections: Arc<Semaphore>,
    /// Files not yet started, and files holding a connection.
    pub(crate) jobs: JobCounts,
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
    /// Hosts where a file's connections were measured slower than
    /// `split_below_rate` (another connection paid): a later file from the
    /// same host is split at once instead of measuring the link again
    /// with one connection (a budgeted run admits its shards one after
    /// another, each re-measured for a rate window).
    pub(crate) split_pays_at: std::sync::Mutex<std::collections::HashSet<String>>,
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
        let source = Arc::new(HubSource {
            client,
            repo: pin.repo.clone(),
            commit: pin.commit.clone(),
        });
        let dest = layout.source().to_owned();
        FetchCtx::with_source(source, store, run, pin, reporter, opts, layout, dest)
    }

    /// Bundles what every file transfer needs, the bytes coming from
    /// `source` and the files landing in `dest` (a directory of `layout`).
    #[allow(clippy::too_many_arguments)]
    pub fn with_source(
        source: Arc<dyn ByteSource>,
        store: Arc<Store>,
        run: RunId,
        pin: Pin,
        reporter: Arc<dyn Reporter>,
        opts: FetchOptions,
        layout: ftpipe_fs::Layout,
        dest: PathBuf,
    ) -> Self {
        FetchCtx {
            dest,
            source,
            store,
            run,
            pin,
            reporter,
            layout,
            volume_full: AtomicBool::new(false),
            connections: Arc::new(Semaphore::new(opts.connections.max(1))),
            jobs: JobCounts::default(),
            remaining: std::sync::Mutex::new(std::collections::HashMap::new()),
            next_pass: std::sync::atomic::AtomicU64::new(0),
            opts,
            hf_cache: None,
            offline: false,
            split_pays_at: std::sync::Mutex::new(std::collections::HashSet::new()),
        }
    }

    /// Whether another connection was found to pay for an earlier file
    /// from `path`'s host ([`FetchCtx::split_pays_at`]).
    pub(crate) fn split_paid_before(&self, path: &str) -> bool {
        let Ok(host) = self.source.host(path) else {
            return false;
        };
        self.split_pays_at
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&host)
    }

    /// Remembers that another connection paid for a file from `path`'s
    /// host.
    pub(crate) fn split_paid(&self, path: &str) {
        if let Ok(host) = self.source.host(path) {
            self.split_pays_at
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(host);
        }
    }

    /// The directory files land in.
    pub(crate) fn dest(&self) -> &std::path::Path {
        &self.dest
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
        let Jobs {
            unstarted,
            in_flight,
        } = self.jobs.now();
        unstarted == 0 || in_flight >= self.opts.jobs.max(1)
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
    pub(crate) async fn no_space(&self, path: &str, volume: PathBuf) -> FetchError {
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

/// How many files of a fetch wait for a connection and how many hold
/// one, read together ([`JobCounts::now`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Jobs {
    pub(crate) unstarted: usize,
    pub(crate) in_flight: usize,
}

/// [`Jobs`] in one atomic word (files waiting in the low half, files in
/// flight in the high half), so that a file moving from waiting to in
/// flight is never seen in neither: with two counters a reader between
/// the two updates could take the one file left in flight for a file
/// alone, and judge whether splitting it pays after the short window
/// kept for a file alone (`segmented::claim::judged_after`).
#[derive(Debug, Default)]
pub(crate) struct JobCounts(AtomicU64);

/// One file in flight, in the packed word.
const IN_FLIGHT_ONE: u64 = 1 << 32;
/// The half of the packed word that counts the files waiting.
const UNSTARTED_MASK: u64 = IN_FLIGHT_ONE - 1;

impl JobCounts {
    /// Both counts, from one load.
    pub(crate) fn now(&self) -> Jobs {
        Self::unpack(self.0.load(Ordering::SeqCst))
    }

    /// `n` more files wait to start.
    pub(crate) fn admit(&self, n: usize) {
        self.update(|j| Jobs {
            unstarted: j.unstarted.saturating_add(n),
            ..j
        });
    }

    /// A waiting file takes its connection (one that was never counted as
    /// waiting still counts as in flight).
    pub(crate) fn start(&self) {
        self.update(|j| Jobs {
            unstarted: j.unstarted.saturating_sub(1),
            in_flight: j.in_flight.saturating_add(1),
        });
    }

    /// `n` files counted as waiting will not start after all.
    pub(crate) fn withdraw(&self, n: usize) {
        self.update(|j| Jobs {
            unstarted: j.unstarted.saturating_sub(n),
            ..j
        });
    }

    /// A file in flight is done (or failed) and gives its connection back.
    pub(crate) fn finish(&self) {
        self.update(|j| Jobs {
            in_flight: j.in_flight.saturating_sub(1),
            ..j
        });
    }

    fn update(&self, f: impl Fn(Jobs) -> Jobs) {
        // The closure always returns Some: the update cannot fail.
        let _ = self
            .0
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |word| {
                Some(Self::pack(f(Self::unpack(word))))
            });
    }

    fn unpack(word: u64) -> Jobs {
        // Each half is at most u32::MAX, which fits a usize on every
        // platform this builds for (64-bit).
        Jobs {
            unstarted: usize::try_from(word & UNSTARTED_MASK).unwrap_or(usize::MAX),
            in_flight: usize::try_from(word >> 32).unwrap_or(usize::MAX),
        }
    }

    fn pack(j: Jobs) -> u64 {
        let half = |n: usize| u64::try_from(n).unwrap_or(u64::MAX).min(UNSTARTED_MASK);
        (half(j.in_flight) << 32) | half(j.unstarted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1024 * 1024;

    #[test]
    fn a_file_checkpoints_every_256th_of_its_bytes_within_the_bounds() {
        let share = CheckpointBytes::ShareOfFile;
        assert_eq!(share.for_file(0), MIN_CHECKPOINT_BYTES);
        assert_eq!(share.for_file(100 * MIB), MIN_CHECKPOINT_BYTES);
        assert_eq!(share.for_file(1024 * MIB), 4 * MIB);
        assert_eq!(share.for_file(2048 * MIB), 8 * MIB);
        assert_eq!(share.for_file(16 * 1024 * MIB), MAX_CHECKPOINT_BYTES);
        assert_eq!(share.for_file(u64::MAX), MAX_CHECKPOINT_BYTES);
    }

    #[test]
    fn a_fixed_interval_holds_whatever_the_size() {
        assert_eq!(CheckpointBytes::Fixed(65536).for_file(1 << 40), 65536);
        assert_eq!(CheckpointBytes::Fixed(0).for_file(10), 1);
    }

    #[test]
    fn job_counts_move_a_file_from_waiting_to_in_flight_at_once() {
        let c = JobCounts::default();
        c.admit(3);
        c.start();
        assert_eq!(
            c.now(),
            Jobs {
                unstarted: 2,
                in_flight: 1
            }
        );
        c.withdraw(5);
        assert_eq!(
            c.now(),
            Jobs {
                unstarted: 0,
                in_flight: 1
            }
        );
        c.admit(1);
        c.finish();
        c.finish();
        c.start();
        c.start();
        c.start();
        assert_eq!(
            c.now(),
            Jobs {
                unstarted: 0,
                in_flight: 3
            },
            "saturates at zero, never borrows from the other half"
        );
    }

    /// Two threads move files from waiting to in flight while a third
    /// reads both counts: no file finishes, so every file is in one of
    /// them at every read. (With two counters updated one after the
    /// other, a reader between the updates saw a file in neither.)
    #[test]
    fn a_reader_never_sees_a_file_in_neither_count() {
        const EACH: usize = 500_000;
        let c = std::sync::Arc::new(JobCounts::default());
        c.admit(2 * EACH);
        let movers: Vec<_> = (0..2)
            .map(|_| {
                let c = c.clone();
                std::thread::spawn(move || (0..EACH).for_each(|_| c.start()))
            })
            .collect();
        loop {
            let done = movers.iter().all(|m| m.is_finished());
            let j = c.now();
            assert_eq!(j.unstarted + j.in_flight, 2 * EACH, "{j:?}");
            if done {
                break;
            }
        }
        for m in movers {
            m.join().unwrap();
        }
        let j = c.now();
        assert_eq!((j.unstarted, j.in_flight), (0, 2 * EACH));
    }
}
