//! Named crash points, for tests that must stop the process at one exact
//! step (a seeded SIGKILL lands anywhere, so it cannot aim at a window of a
//! few microseconds). With `FTPIPE_CRASH_AT=NAME` in the environment the
//! process aborts — no destructors, no flush, like a kill — when it first
//! reaches point `NAME`; with `FTPIPE_CRASH_AT=NAME#N`, the N-th time
//! (e.g. the publish of the last of N files fetched one at a time). Unset, a
//! point costs one cached lookup.
//!
//! `FTPIPE_HOLD_AT=NAME` (or `NAME#N`) instead holds the thread that
//! reaches the point there until the process is killed: a test that must
//! see what the rest of the process does while one step never ends (the
//! digest's read-back, which checkpoints must not wait for).
//!
//! The points are the variants of [`CrashPoint`], each with its name; the
//! crash tables of `docs/design.md` give each one a row (a test holds the
//! enum and the tables to each other).

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// The environment variable naming the point to crash at.
pub const CRASH_AT_ENV: &str = "FTPIPE_CRASH_AT";

/// The environment variable naming the point to hold a thread at.
pub const HOLD_AT_ENV: &str = "FTPIPE_HOLD_AT";

/// A point and the arrival (1-based) something happens at.
struct Target {
    name: String,
    nth: u64,
    seen: AtomicU64,
}

impl Target {
    /// `NAME` or `NAME#N` from `env`.
    fn from_env(env: &str) -> Option<Target> {
        let spec = std::env::var(env).ok()?;
        let (name, nth) = match spec.split_once('#') {
            Some((name, n)) => (name.to_owned(), n.parse().ok().filter(|n| *n > 0)?),
            None => (spec, 1),
        };
        Some(Target {
            name,
            nth,
            seen: AtomicU64::new(0),
        })
    }

    /// Whether this arrival at `name` is the one targeted.
    fn arrived(&self, name: &str) -> bool {
        self.name == name && self.seen.fetch_add(1, Ordering::SeqCst) + 1 == self.nth
    }
}

fn target() -> Option<&'static Target> {
    static AT: OnceLock<Option<Target>> = OnceLock::new();
    AT.get_or_init(|| Target::from_env(CRASH_AT_ENV)).as_ref()
}

fn hold() -> Option<&'static Target> {
    static AT: OnceLock<Option<Target>> = OnceLock::new();
    AT.get_or_init(|| Target::from_env(HOLD_AT_ENV)).as_ref()
}

/// Declares [`CrashPoint`]: each variant with its name.
macro_rules! crash_points {
    ($($(#[$meta:meta])* $variant:ident = $name:literal,)+) => {
        /// A named step where `FTPIPE_CRASH_AT` can stop the process.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum CrashPoint {
            $($(#[$meta])* $variant,)+
        }

        impl CrashPoint {
            /// Every point, in declaration order.
            pub const ALL: &'static [CrashPoint] = &[$(CrashPoint::$variant,)+];

            /// The name `FTPIPE_CRASH_AT` gives it.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(CrashPoint::$variant => $name,)+
                }
            }
        }
    };
}

crash_points! {
    /// Resolve's pin and listing committed, its completion not logged.
    ResolveDone = "resolve-done",
    /// `resolve` completed, the next stage not started.
    ResolveCompleted = "resolve-completed",
    /// The plan and preflight computed, the completion not logged.
    PlanDone = "plan-done",
    /// `plan` completed, the next stage not started.
    PlanCompleted = "plan-completed",
    /// A `.part`'s bytes fsynced, its watermark not committed.
    CheckpointSynced = "checkpoint-synced",
    /// After a crash, the bytes past a watermark that the source proved its
    /// own (recorded chunk hashes) fsynced, not yet claimed.
    TailProven = "tail-proven",
    /// A proven tail claimed and the rest of it recorded as discarded (one
    /// transaction), the rest not yet punched out or cut off.
    TailClaimed = "tail-claimed",
    /// The digest of a file fetched as ranges about to read back a piece
    /// of the written prefix it could not hash from memory.
    DigestReadBack = "digest-read-back",
    /// A range claim committed, nothing of the new range written.
    RangeSplit = "range-split",
    /// The last checkpoint (W = S) and the digest verified, not renamed.
    FetchVerified = "fetch-verified",
    /// Renamed to the final name and the directory fsynced, no receipt.
    FetchRenamed = "fetch-renamed",
    /// A Xet term fetched, decoded and recorded with its chunk hashes, its
    /// bytes not yet handed to the transfer (not written, not claimed).
    XetTermRecorded = "xet-term-recorded",
    /// A cache blob placed at `.hfcache` and verified, not renamed.
    CacheVerified = "cache-verified",
    /// A cache blob renamed to the final name, no receipt.
    CacheRenamed = "cache-renamed",
    /// A cache prefix copied into `.part` and fsynced, the watermark not
    /// committed.
    CachePrefixSynced = "cache-prefix-synced",
    /// A repin's superseded tail recorded, the `.part` not yet emptied.
    SupersededTailRecorded = "superseded-tail-recorded",
    /// A superseded `.part` emptied, its old ranges still stored.
    SupersededPartEmptied = "superseded-part-emptied",
    /// Every file published, `fetch`'s completion not logged.
    FetchDone = "fetch-done",
    /// `fetch` completed, the next stage not started.
    FetchCompleted = "fetch-completed",
    /// A repin's old span digests recorded, its fetch not started.
    RebuildSpansRecorded = "rebuild-spans-recorded",
    /// A component kept by a repin got its new receipt, nothing after it
    /// done.
    ComponentKept = "component-kept",
    /// `convert.json` durable, `plan.json` not written.
    SkeletonWritten = "skeleton-written",
    /// A component renamed and its directories fsynced, no receipt.
    ComponentRenamed = "component-renamed",
    /// A source file's spans written into a component's temp file and
    /// fsynced, their claim not committed.
    SpanSynced = "span-synced",
    /// A source file's span claim committed.
    SpanClaimed = "span-claimed",
    /// A source's retirement logged, the file not yet unlinked.
    RetirementLogged = "retirement-logged",
    /// A source's punch logged (its kept ranges and their digests), the
    /// holes not yet punched.
    PunchLogged = "punch-logged",
    /// A source's holes punched and synced, nothing after it done.
    PunchDone = "punch-done",
    /// The hole-punching probe's scratch file written in `DIR`, not yet
    /// punched or removed.
    PunchProbing = "punch-probing",
    /// A source's kept ranges copied aside (the copy renamed and its
    /// directory synced), its row not committed.
    KeptCopied = "kept-copied",
    /// The row claiming a copy aside committed, the source file not yet
    /// unlinked.
    CopyLogged = "copy-logged",
    /// A source copied aside unlinked and its directory synced.
    CopyReleased = "copy-released",
    /// A `--rebuild` set-aside committed, the rename not done.
    SetAsideLogged = "set-aside-logged",
    /// The set-aside rename done, the marker not removed.
    SetAsideRenamed = "set-aside-renamed",
    /// `manifest.json` durable, not recorded.
    ManifestWritten = "manifest-written",
    /// The manifest recorded, `placement.json` not written.
    ManifestRecorded = "manifest-recorded",
    /// The artifact written, `convert`'s completion not logged.
    ConvertDone = "convert-done",
    /// `convert` completed, the next stage not started.
    ConvertCompleted = "convert-completed",
    /// The artifact verified, `verify`'s completion not logged.
    VerifyDone = "verify-done",
    /// `verify` completed, before the exit.
    VerifyCompleted = "verify-completed",
    /// A multipart upload created on the server, its id not recorded.
    UploadCreated = "upload-created",
    /// A part acknowledged by the server, its row not committed.
    UploadPartSent = "upload-part-sent",
    /// A part's row committed.
    UploadPartRecorded = "upload-part-recorded",
    /// A multipart upload completed on the server, not yet checked.
    UploadCompleted = "upload-completed",
    /// An object checked and its upload receipt committed.
    UploadVerified = "upload-verified",
    /// Every component's upload receipt committed, `manifest.json` not put.
    PublishComponentsDone = "publish-components-done",
    /// `manifest.json` put, the publication not recorded.
    PublishManifestPut = "publish-manifest-put",
    /// Every component of a pull published in `DIR/artifact`,
    /// `placement.json` and `manifest.json` not written.
    PullComponentsDone = "pull-components-done",
    /// A pull's `manifest.json` durable, the artifact not yet verified.
    PullManifestWritten = "pull-manifest-written",
}

impl std::fmt::Display for CrashPoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

/// Aborts the process if `FTPIPE_CRASH_AT` names this point (and arrival);
/// holds this thread here for good if `FTPIPE_HOLD_AT` does.
pub fn hit(point: CrashPoint) {
    let name = point.as_str();
    if let Some(t) = target()
        && t.arrived(name)
    {
        eprintln!("{CRASH_AT_ENV}={name}#{}: aborting here", t.nth);
        std::process::abort();
    }
    if let Some(t) = hold()
        && t.arrived(name)
    {
        eprintln!("{HOLD_AT_ENV}={name}#{}: holding here until killed", t.nth);
        loop {
            std::thread::park();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::CrashPoint;

    /// The crash-point names in the first column of every crash table of
    /// `docs/design.md` (a table whose header starts `| crash`): the
    /// backticked words joined by `-`.
    fn names_in_crash_tables(design: &str) -> Vec<String> {
        let mut names = Vec::new();
        let mut in_table = false;
        for line in design.lines() {
            if !line.starts_with('|') {
                in_table = false;
                continue;
            }
            if line.starts_with("| crash") {
                in_table = true;
                continue;
            }
            if !in_table || line.starts_with("|---") {
                continue;
            }
            let first = line.trim_start_matches('|').split('|').next().unwrap_or("");
            for (i, word) in first.split('`').enumerate() {
                let kebab = word.contains('-')
                    && word
                        .split('-')
                        .all(|w| !w.is_empty() && w.bytes().all(|b| b.is_ascii_lowercase()));
                if i % 2 == 1 && kebab {
                    names.push(word.to_owned());
                }
            }
        }
        names
    }

    /// Guards the crash tables of `docs/design.md` against drift: every
    /// crash point has a row that says what is durable there and why
    /// resuming is safe, and every point a row names exists.
    #[test]
    fn every_crash_point_has_a_row_in_design_md_and_every_row_a_point() {
        let design = include_str!("../../docs/design.md");
        let in_tables = names_in_crash_tables(design);
        for p in CrashPoint::ALL {
            assert!(
                in_tables.iter().any(|n| n == p.as_str()),
                "crash point `{p}` has no row in a crash table of docs/design.md"
            );
        }
        for n in &in_tables {
            assert!(
                CrashPoint::ALL.iter().any(|p| p.as_str() == n),
                "docs/design.md names `{n}` in a crash table; no such crash point"
            );
        }
    }

    /// Guards the names tests pass in `FTPIPE_CRASH_AT`: unique, and
    /// written as the environment spells them (lowercase words joined by
    /// `-`, no `#`, which starts the arrival count).
    #[test]
    fn names_are_unique_kebab_case() {
        let mut seen = std::collections::HashSet::new();
        for p in CrashPoint::ALL {
            let name = p.as_str();
            assert!(seen.insert(name), "{name} twice");
            assert!(
                name.split('-').count() >= 2
                    && name
                        .split('-')
                        .all(|w| !w.is_empty() && w.bytes().all(|b| b.is_ascii_lowercase())),
                "{name}"
            );
        }
    }
}
