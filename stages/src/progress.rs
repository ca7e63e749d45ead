//! Progress events. Stages emit them through [`Reporter`]; only the binary
//! decides how to show them (bars, log lines, JSON).

use std::time::Duration;

use serde::Serialize;

/// Something worth telling the user.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum ProgressEvent {
    /// The fetch is about to start: totals, with already committed bytes done.
    FetchPlanned {
        files: usize,
        total_bytes: u64,
        done_bytes: u64,
    },
    /// A file transfer (re)starts at `resumed_from`.
    FileStarted {
        path: String,
        size: u64,
        resumed_from: u64,
    },
    /// Bytes were appended to a file.
    FileBytes { path: String, bytes: u64 },
    /// A file's progress went back to `to` (bytes discarded).
    FileRewound {
        path: String,
        to: u64,
        reason: String,
    },
    /// An attempt failed and will be retried after `delay`.
    FileRetry {
        path: String,
        attempt: u32,
        #[serde(with = "millis")]
        delay: Duration,
        /// Set when the wait is the hub's `Retry-After` (seconds it asked
        /// for; the wait is capped at `MAX_RETRY_AFTER`).
        retry_after_secs: Option<u64>,
        error: String,
    },
    /// A file was taken whole from the Hugging Face cache: verified and
    /// published, no byte requested (`placement`: reflink, hardlink, copy).
    FileAdopted {
        path: String,
        size: u64,
        placement: String,
    },
    /// The prefix of an interrupted download in the cache was copied into
    /// the file's `.part` and is now its watermark (not network bytes).
    FileResumedFromCache { path: String, bytes: u64 },
    /// A cache file looked at for `path` was not used (recorded).
    CacheRejected {
        path: String,
        cache_path: String,
        reason: String,
    },
    /// A file was verified and published.
    FilePublished { path: String, size: u64 },
    /// A file failed for good.
    FileFailed { path: String, error: String },
    /// Conversion is about to start: components, with reused bytes done.
    ConvertPlanned {
        components: usize,
        total_bytes: u64,
        done_bytes: u64,
    },
    /// A component is durable and has its receipt.
    ComponentWritten {
        path: String,
        kind: String,
        size: u64,
    },
    /// A free-form note (e.g. the branch moved).
    Note { message: String },
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
