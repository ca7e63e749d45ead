//! Progress events. Stages emit them through [`Reporter`]; only the binary
//! decides how to show them (bars, log lines, JSON).
//!
//! - [`human`]: the one formatter of byte counts for people.

pub mod human;

use std::time::Duration;

use serde::Serialize;

/// Something worth telling the user.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum ProgressEvent {
    /// The fetch is about to start: totals, with already committed bytes done.
    FetchPlanned {
        /// Files selected for the fetch.
        files: usize,
        /// Of them, files already published (a receipt) before it starts.
        done_files: usize,
        /// Bytes of all selected files.
        total_bytes: u64,
        /// Bytes of them already committed.
        done_bytes: u64,
    },
    /// A file transfer (re)starts at `resumed_from`.
    FileStarted {
        /// The file's repo path.
        path: String,
        /// The file's size in bytes.
        size: u64,
        /// Bytes already committed, where the transfer starts.
        resumed_from: u64,
    },
    /// Bytes were appended to a file.
    FileBytes {
        /// The file's repo path.
        path: String,
        /// Bytes appended by this step.
        bytes: u64,
    },
    /// A file's progress went back to `to` (bytes discarded).
    FileRewound {
        /// The file's repo path.
        path: String,
        /// The byte offset progress went back to.
        to: u64,
        /// Why the bytes were discarded.
        reason: String,
    },
    /// An attempt failed and will be retried after `delay`.
    FileRetry {
        /// The file's repo path.
        path: String,
        /// The number of the attempt that failed (1-based).
        attempt: u32,
        /// The wait before the retry (serialized as milliseconds).
        #[serde(with = "millis")]
        delay: Duration,
        /// Set when the wait is the hub's `Retry-After` (seconds it asked
        /// for; the wait is capped at `MAX_RETRY_AFTER`).
        retry_after_secs: Option<u64>,
        /// The failed attempt's error message.
        error: String,
    },
    /// A file was taken whole from the Hugging Face cache: verified and
    /// published, no byte requested (`placement`: reflink or copy).
    FileAdopted {
        /// The file's repo path.
        path: String,
        /// The file's size in bytes.
        size: u64,
        /// How it was placed: `reflink` or `copy` (`hardlink` only in rows
        /// recorded by older versions).
        placement: String,
    },
    /// The prefix of an interrupted download in the cache was copied into
    /// the file's `.part` and is now its watermark (not network bytes).
    FileResumedFromCache {
        /// The file's repo path.
        path: String,
        /// Bytes copied from the cache (the new watermark).
        bytes: u64,
    },
    /// Bytes a crash left written past `path`'s last checkpoint, `[from,
    /// to)`, were proven by the source's records (Xet chunk hashes) and
    /// kept, not fetched again.
    FileTailKept {
        /// The file's repo path.
        path: String,
        /// The watermark before.
        from: u64,
        /// The watermark after.
        to: u64,
    },
    /// A cache file looked at for `path` was not used (recorded).
    CacheRejected {
        /// The repo path the cache file was considered for.
        path: String,
        /// The cache file that was not used.
        cache_path: String,
        /// Why it was not used.
        reason: String,
    },
    /// A file was verified and published.
    FilePublished {
        /// The file's repo path.
        path: String,
        /// The file's size in bytes.
        size: u64,
        /// A file fetched as several ranges: bytes its digest read back
        /// after every byte was written (absent for one stream, hashed
        /// inline).
        #[serde(skip_serializing_if = "Option::is_none")]
        digest_catch_up_bytes: Option<u64>,
        /// Bytes of the file its last attempt (one stream) or pass (ranges)
        /// wrote past the page cache (`O_DIRECT`): its whole 4 KiB blocks,
        /// unless the volume refused it or `--buffered-io` was given.
        direct_io_bytes: u64,
    },
    /// A file failed for good.
    FileFailed {
        /// The file's repo path.
        path: String,
        /// The final error message.
        error: String,
    },
    /// Conversion is about to start: components, with reused bytes done.
    ConvertPlanned {
        /// Components of the artifact.
        components: usize,
        /// Bytes of all components.
        total_bytes: u64,
        /// Bytes of components reused from an earlier run.
        done_bytes: u64,
    },
    /// A component is durable and has its receipt.
    ComponentWritten {
        /// The component's path in the artifact.
        path: String,
        /// The component's kind.
        kind: String,
        /// The component's size in bytes.
        size: u64,
    },
    /// A component a repin left unchanged (its spans' bytes are the
    /// same) got its receipt under the new pin without being converted
    /// again.
    ComponentKept {
        /// The component's path in the artifact.
        path: String,
        /// The component's kind.
        kind: String,
        /// The component's size in bytes.
        size: u64,
    },
    /// A stage of the pipeline starts: what the command is doing while
    /// no byte total is known yet (resolving, planning) and after.
    Phase {
        /// The stage that started.
        phase: Phase,
    },
    /// A free-form note (e.g. the branch moved).
    Note {
        /// The note's text.
        message: String,
    },
}

/// The stage a command is in, as the progress display names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Pinning the revision and reading the listing.
    Resolving,
    /// Predicting every output component (reading source headers).
    Planning,
    /// Downloading the selected files.
    Fetching,
    /// Writing the artifact's components.
    Converting,
    /// Checking the artifact against its manifest.
    Verifying,
}

impl Phase {
    /// The label shown beside the bars.
    pub fn label(self) -> &'static str {
        match self {
            Phase::Resolving => "resolving",
            Phase::Planning => "planning",
            Phase::Fetching => "fetching",
            Phase::Converting => "converting",
            Phase::Verifying => "verifying",
        }
    }
}

mod millis {
    use std::time::Duration;
    pub fn serialize<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }
}

/// Receives progress events; must be cheap (called on the transfer path).
pub trait Reporter: Send + Sync {
    /// Handles one event.
    fn report(&self, event: ProgressEvent);

    /// The command is done: clear anything live (bars) so the final lines
    /// that follow are readable.
    fn finish(&self) {}
}

/// A reporter that drops everything.
pub struct Silent;

impl Reporter for Silent {
    fn report(&self, _event: ProgressEvent) {}
}
