//! What one pass over a file shares between its coordinator and its
//! workers: the part file, the slots (ranges in memory), the validator,
//! the split verdict and the sequential digest. Claims are made here, under
//! the slots' lock, with the policy of `claim`.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::{Notify, watch};

use ftpipe_fs::crashpoint::{self, CrashPoint};
use ftpipe_fs::direct::{Bounce, DirectFile};
use ftpipe_hub::identity::IdentityHasher;

use super::claim::{
    Claim, Policy, Slot, delivered, judged_after, next_claim, split_pays, written_prefix,
};
use crate::ctx::FetchCtx;
use crate::error::FetchError;
use crate::extent::WRITE_ALIGN;

/// A worker writes once this much is buffered (a multiple of the alignment).
pub(super) const WRITE_BATCH: usize = 4 * WRITE_ALIGN as usize;

/// Chunk of the digest's reads of the written prefix.
pub(super) const HASH_CHUNK: u64 = 1 << 20;

/// A worker's write buffer: whole blocks are copied there (aligned in
/// memory) to be written past the page cache; one write call each.
pub(super) const WRITE_BOUNCE: usize = 2 * WRITE_BATCH;

/// [`Shared::split_verdict`] values.
pub(super) const SPLIT_UNJUDGED: u8 = 0;
pub(super) const SPLIT_PAYS: u8 = 1;
pub(super) const SPLIT_DOES_NOT_PAY: u8 = 2;

/// What the coordinator shares with its workers.
pub(super) struct Shared {
    pub(super) ctx: Arc<FetchCtx>,
    pub(super) path: String,
    pub(super) size: u64,
    pub(super) lfs_sha256: Option<String>,
    pub(super) part_path: PathBuf,
    /// The part file; whole blocks bypass the page cache where the
    /// volume allows (see `ftpipe_fs::direct`).
    pub(super) file: DirectFile,
    /// Workers' write buffers, kept between ranges.
    pub(super) bounces: Mutex<Vec<Bounce>>,
    /// This pass's id in `FetchCtx::remaining`.
    pub(super) pass: u64,
    /// Whether splitting pays, once judged ([`Shared::another_connection_pays`]);
    /// judged to pay from the start where it paid for an earlier file
    /// from the same host ([`FetchCtx::split_paid_before`]).
    pub(super) split_verdict: std::sync::atomic::AtomicU8,
    pub(super) slots: Mutex<Vec<Slot>>,
    /// The strong validator, once known (the store's, or the first response's).
    pub(super) validator: Mutex<Option<String>>,
    /// False once a response shows the file cannot be split (no strong
    /// validator, or ranges ignored).
    pub(super) splittable: std::sync::atomic::AtomicBool,
    /// The file's digest so far.
    pub(super) digest: Mutex<Digest>,
    /// Wakes the coordinator when bytes were written, and when the file
    /// became splittable (its validator learned).
    pub(super) wrote: Notify,
    pub(super) cancel: watch::Receiver<bool>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.ctx.remaining_after(self.pass, 0);
    }
}

impl Shared {
    pub(super) fn slots(&self) -> std::sync::MutexGuard<'_, Vec<Slot>> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A write buffer for a worker: a kept one, or a new one.
    pub(super) fn bounce(&self) -> Bounce {
        let kept = self.bounces.lock().unwrap_or_else(|p| p.into_inner()).pop();
        kept.unwrap_or_else(|| Bounce::new(WRITE_BOUNCE))
    }

    pub(super) fn give_back(&self, bounce: Bounce) {
        self.bounces
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(bounce);
    }

    pub(super) fn digest(&self) -> std::sync::MutexGuard<'_, Digest> {
        self.digest.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Hashes the file's contiguous written prefix as far as it reaches,
    /// reading back what the workers could not hash as they wrote it.
    pub(super) fn catch_up_digest(&self) -> std::io::Result<()> {
        let mut d = self.digest();
        loop {
            let (prefix, all_written) = {
                let slots = self.slots();
                (
                    written_prefix(&slots),
                    slots.iter().all(|s| s.written == s.end),
                )
            };
            let from = d.hashed;
            if from >= prefix {
                return Ok(());
            }
            crashpoint::hit(CrashPoint::DigestReadBack);
            let Digest { hasher, bounce, .. } = &mut *d;
            let bounce = bounce.get_or_insert_with(|| Bounce::new(HASH_CHUNK as usize));
            self.file
                .read_range(bounce, from, prefix, |b| hasher.update(b))?;
            d.hashed = prefix;
            if all_written {
                d.catch_up += prefix - from;
            }
        }
    }

    pub(super) fn validator(&self) -> Option<String> {
        self.validator
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub(super) fn io(&self, op: &'static str, e: std::io::Error) -> FetchError {
        FetchError::io(op, &self.part_path, e)
    }

    /// Whether a connection added to this file may raise its rate: its
    /// busy connections, measured in bytes received since their first byte
    /// after the claim over [`RATE_WINDOW`](super::claim::RATE_WINDOW) (well below the limit) or
    /// [`RATE_WINDOW_FULL`](super::claim::RATE_WINDOW_FULL), have delivered less than `split_below_rate`
    /// per second on average, and kept their workers waiting for bytes at
    /// least [`MIN_WAITING_SHARE`](super::claim::MIN_WAITING_SHARE) of the time ([`delivered`]). A
    /// server or path that caps each connection keeps them below it; a
    /// connection above it is limited by this machine (the one-core digest,
    /// the disk), where a second range of the file only adds bytes written
    /// ahead of the digest, read back from disk. Judged once per pass, at
    /// the first measurement (until then: no), so that stealing at the end
    /// never waits for young ranges to be measured. With no busy connection
    /// (all waiting to retry) there is nothing to judge: yes. A file whose
    /// source decodes its bodies ([`crate::source::ByteSource::decodes_bodies`]) is split
    /// until it has a busy range per core first. A verdict that another
    /// connection pays is kept for the host's later files.
    pub(super) fn another_connection_pays(&self, slots: &[Slot], now: Instant) -> bool {
        let limit = self.ctx.opts.split_below_rate;
        if limit == 0 {
            return true;
        }
        if self.ctx.source.decodes_bodies(&self.path)
            && slots.iter().filter(|s| s.busy).count() < cores()
        {
            return true;
        }
        match self.split_verdict.load(Ordering::SeqCst) {
            SPLIT_PAYS => return true,
            SPLIT_DOES_NOT_PAY => return false,
            _ => {}
        }
        let Some(d) = delivered(slots, now) else {
            return true;
        };
        let jobs = self.ctx.jobs.now();
        let alone = jobs.in_flight <= 1 && jobs.unstarted == 0;
        let Some(pays) = split_pays(limit, &d, judged_after(alone)) else {
            return false;
        };
        let verdict = if pays { SPLIT_PAYS } else { SPLIT_DOES_NOT_PAY };
        self.split_verdict.store(verdict, Ordering::SeqCst);
        if pays {
            self.ctx.split_paid(&self.path);
        }
        pays
    }

    /// The next range for a connection ([`next_claim`]), marked busy.
    /// Called by the coordinator for a new connection and by a worker whose
    /// range is done, which goes on at once on the same connection.
    pub(super) fn claim(&self) -> Option<Claim> {
        let splittable = self.splittable.load(Ordering::SeqCst) && self.validator().is_some();
        let mut slots = self.slots();
        let left = slots
            .iter()
            .filter(|s| !s.complete())
            .fold(0u64, |a, s| a.saturating_add(s.end - s.pos));
        let total = self.ctx.remaining_after(self.pass, left);
        let policy = Policy {
            opts: &self.ctx.opts,
            total,
            waiting: self.ctx.jobs.now().unstarted > 0,
            splittable,
        };
        next_claim(&mut slots, &policy, |slots, now| {
            self.another_connection_pays(slots, now)
        })
    }
}

/// The digest of one pass. It follows the contiguous written prefix from
/// byte 0: a worker whose bytes are the digest's next hashes them from
/// memory as it writes them; the coordinator reads back the rest (ranges
/// written ahead of the digest) at its checkpoints and before the final
/// comparison. After a crash the pass starts over from the durable prefix,
/// re-hashed from disk, so hashing bytes not yet durable is safe.
pub(super) struct Digest {
    pub(super) hasher: IdentityHasher,
    /// `[0, hashed)` is hashed.
    pub(super) hashed: u64,
    /// Bytes read back once every byte of the file was written.
    pub(super) catch_up: u64,
    /// Read-back buffer (aligned for reads past the page cache), made on
    /// first use.
    pub(super) bounce: Option<Bounce>,
}

/// The cores this process may run on (1 when unknown).
pub(super) fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
}
