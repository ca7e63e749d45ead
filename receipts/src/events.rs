//! The typed values the state database stores as text: run ids, stage
//! names, the events of the append-only logs, attempt outcomes, discard
//! reasons, the cache-candidate log's kinds, outcomes and placements, and
//! the upload records' states, ops, outcomes and publication outcomes.
//! Each enum's stored name is fixed data (a migration's `CHECK` lists the
//! same names; `tests` below holds each enum to its `CHECK` list); a name
//! the code does not know is [`StoreError::UnknownValue`], never a silent
//! default. Each serializes as its stored name, so a report prints what the
//! database holds.

use serde::{Serialize, Serializer};

use crate::error::StoreError;

/// Identifier of one invocation of ftpipe (a row of `runs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, sqlx::Type)]
#[serde(transparent)]
#[sqlx(transparent)]
pub struct RunId(i64);

impl RunId {
    /// The id as SQLite stores it.
    pub const fn get(self) -> i64 {
        self.0
    }

    /// A run id read from elsewhere (a test, a report).
    pub const fn from_raw(id: i64) -> RunId {
        RunId(id)
    }
}

impl std::fmt::Display for RunId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// Declares an enum stored as text: each variant with its stored name.
macro_rules! stored_enum {
    ($(#[$meta:meta])* $name:ident, $column:literal { $($(#[$vmeta:meta])* $variant:ident = $text:literal,)+ }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum $name {
            $($(#[$vmeta])* $variant,)+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant,)+];

            /// The name stored in the database.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)+
                }
            }

            /// Parses a stored name.
            pub fn parse(s: &str) -> Result<$name, StoreError> {
                match s {
                    $($text => Ok($name::$variant),)+
                    _ => Err(StoreError::UnknownValue {
                        column: $column,
                        value: s.to_owned(),
                    }),
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.pad(self.as_str())
            }
        }

        impl std::str::FromStr for $name {
            type Err = StoreError;

            fn from_str(s: &str) -> Result<$name, StoreError> {
                $name::parse(s)
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(self.as_str())
            }
        }
    };
}

stored_enum! {
    /// The stages of a run, in their fixed order.
    Stage, "stage_events.stage" {
        /// Pin the revision to a commit and store the listing.
        Resolve = "resolve",
        /// Plan the conversion from published sources or remote headers.
        Plan = "plan",
        /// Download, verify and publish the selected files.
        Fetch = "fetch",
        /// Write the artifact.
        Convert = "convert",
        /// Check the artifact on its own, as a receiver would.
        Verify = "verify",
    }
}

stored_enum! {
    /// An event on a stage.
    StageEvent, "stage_events.event" {
        /// A run began the stage.
        Started = "started",
        /// The stage finished successfully.
        Completed = "completed",
        /// The stage failed (the detail says why).
        Failed = "failed",
    }
}

stored_enum! {
    /// An event of the source-retirement log.
    RetirementEvent, "source_retirements.event" {
        /// The source was unlinked (and its directory fsynced) after every
        /// component reading it had a receipt.
        Retired = "retired",
        /// The source is about to be fetched again.
        Reacquired = "reacquired",
    }
}

stored_enum! {
    /// How a converted PLE file holds its kept ranges
    /// (`source_punches.method`, migration 0019).
    KeptMethod, "source_punches.method" {
        /// Holes punched over the rest of the file, which keeps its length:
        /// the kept ranges stay at their offsets.
        Punch = "punch",
        /// The kept ranges copied aside, back to back in offset order, and
        /// the source file released whole.
        CopyAside = "copy_aside",
    }
}

stored_enum! {
    /// An event of the artifact log.
    ArtifactEvent, "artifacts.event" {
        /// A manifest was written and fsynced.
        Manifest = "manifest",
        /// A stale artifact was moved aside.
        SetAside = "set_aside",
    }
}

stored_enum! {
    /// How an HTTP attempt at a file body ended (`attempts.outcome`).
    AttemptOutcome, "attempts.outcome" {
        /// Started and not yet finished; left so by a crash.
        InFlight = "in_flight",
        /// The body (or the requested range) arrived whole.
        Ok = "ok",
        /// Ended by a transient error or an ignored range; tried again.
        Retry = "retry",
        /// Ended by an error that is not retried.
        Failed = "failed",
        /// Stopped by the fetch itself (another range failed, the run ended).
        Cancelled = "cancelled",
    }
}

impl Default for AttemptOutcome {
    /// A new attempt is in flight until it is finished.
    fn default() -> AttemptOutcome {
        AttemptOutcome::InFlight
    }
}

stored_enum! {
    /// Why received bytes were thrown away (`discards.reason`). Declared in
    /// the order of the stored names, so a map keyed by reason lists them
    /// alphabetically, as reports always have.
    DiscardReason, "discards.reason" {
        /// The file's digest did not match the pin; every byte is fetched again.
        DigestMismatch = "digest_mismatch",
        /// A body longer than announced: the bytes past the file's end.
        LongBodyExcess = "long_body_excess",
        /// The `.part` was shorter than its watermark (a truncation the
        /// ledger had not recorded); the watermark drops to its length.
        PartShorterThanWatermark = "part_shorter_than_watermark",
        /// A published file vanished; its receipt was revoked.
        PublishedFileMissing = "published_file_missing",
        /// Received past the end of the range requested (a body longer than
        /// its `Content-Range`).
        RangeBodyExcess = "range_body_excess",
        /// A `200` answered a Range request; the prefix is fetched again.
        RangeNotHonoured = "range_not_honoured",
        /// Stored ranges did not tile the file; it starts again.
        RangesDoNotTileTheFile = "ranges_do_not_tile_the_file",
        /// A one-stream prefix cut back to a segment boundary.
        SegmentAlignment = "segment_alignment",
        /// A `.part` found with no watermark (written only by versions
        /// before `uncheckpointed_tail` took its place; kept so their
        /// databases still read).
        StalePart = "stale_part",
        /// A partial watermark replaced by a final file adopted from disk.
        SupersededByAdoptedFile = "superseded_by_adopted_file",
        /// A partial watermark replaced by a blob adopted from a Hugging
        /// Face cache.
        SupersededByHfCache = "superseded_by_hf_cache",
        /// Bytes of a file whose identity a `--repin` changed.
        SupersededByRepin = "superseded_by_repin",
        /// Received but not stored: the buffered remainder below the write
        /// alignment when a range's attempt ended.
        UnalignedRemainder = "unaligned_remainder",
        /// Bytes past the watermark after a crash (written, never claimed).
        UncheckpointedTail = "uncheckpointed_tail",
        /// The validator changed between the passes of a segmented fetch.
        ValidatorChanged = "validator_changed",
    }
}

stored_enum! {
    /// What kind of file a Hugging Face cache candidate is
    /// (`cache_candidates.kind`).
    CacheKind, "cache_candidates.kind" {
        /// An LFS blob, named by its SHA-256.
        Blob = "blob",
        /// A small file of the snapshot at the pinned commit.
        Snapshot = "snapshot",
        /// The prefix an interrupted `hf download` left.
        Incomplete = "incomplete",
    }
}

stored_enum! {
    /// What became of a Hugging Face cache candidate
    /// (`cache_candidates.outcome`).
    CacheOutcome, "cache_candidates.outcome" {
        /// The whole file was placed, verified and published.
        Adopted = "adopted",
        /// Its prefix was copied into `.part` and resumed from.
        Resumed = "resumed",
        /// Not used (wrong size, digest mismatch, unsafe link, not placeable).
        Rejected = "rejected",
    }
}

stored_enum! {
    /// How a cache file was placed at the pinned file's path
    /// (`cache_candidates.placement`).
    Placement, "cache_candidates.placement" {
        /// A copy-on-write clone (FICLONE): no bytes copied, no shared inode.
        Reflink = "reflink",
        /// A hard link to the cache's inode: recorded by older versions
        /// only (a hard link lets the cache change an adopted file; now
        /// never made, and conversion refuses a source with two links).
        Hardlink = "hardlink",
        /// A byte copy.
        Copy = "copy",
    }
}

stored_enum! {
    /// Where an upload to an output target stands (`uploads.state`).
    UploadState, "uploads.state" {
        /// A multipart upload the target created (its session recorded),
        /// parts being sent.
        Uploading = "uploading",
        /// Completed and checked (size, SHA-256 metadata): the upload receipt.
        Verified = "verified",
        /// Given up (the target lost the session, or the file changed).
        Abandoned = "abandoned",
    }
}

stored_enum! {
    /// What the head before an upload found at the object's key
    /// (`uploads.found`, since migration 0015): whether an object there was
    /// reused, and why one was not.
    FoundObject, "uploads.found" {
        /// No object there: uploaded.
        Nothing = "nothing",
        /// An object whose store checksum proves its bytes are the file's:
        /// reused, nothing sent.
        Proven = "proven",
        /// An object whose store checksum did not prove its bytes (other
        /// bytes, another size or part count): uploaded again.
        NotProven = "not_proven",
        /// An object without a store checksum (an older ftpipe's, another
        /// tool's): not trusted, uploaded again.
        NoChecksum = "no_checksum",
    }
}

impl FoundObject {
    /// What it meant for the object, as reports say it.
    pub fn describe(self) -> &'static str {
        match self {
            FoundObject::Nothing => "nothing there, uploaded",
            FoundObject::Proven => "reused, proven by store checksum",
            FoundObject::NotProven => {
                "reused object's checksum did not prove its bytes, uploaded again"
            }
            FoundObject::NoChecksum => "object had no store checksum, uploaded again",
        }
    }
}

stored_enum! {
    /// What one request of a publish or mirror asked of the output target
    /// (`upload_attempts.op`). Target-neutral: S3's multipart upload is a
    /// session with parts, as a registry's chunked blob upload is.
    UploadOp, "upload_attempts.op" {
        /// The object's size and checksum metadata, or its absence.
        Head = "head",
        /// A whole object in one request.
        Put = "put",
        /// A multipart session created (S3: create multipart upload).
        BeginUpload = "begin_upload",
        /// One part of a session sent (S3: upload part).
        SendPart = "send_part",
        /// A session completed from its acknowledged parts.
        CompleteUpload = "complete_upload",
        /// The create-only put of the commit point (`manifest.json`,
        /// `listing.json`), written last.
        PutCommit = "put_commit",
    }
}

stored_enum! {
    /// How one request to an output target ended (`upload_attempts.outcome`).
    UploadOutcome, "upload_attempts.outcome" {
        /// Started and not yet finished; left so by a kill.
        InFlight = "in_flight",
        /// The target answered as asked.
        Ok = "ok",
        /// The request failed (the row holds the error).
        Failed = "failed",
    }
}

stored_enum! {
    /// What a publish or mirror found at its commit point
    /// (`publications.outcome`).
    PublicationOutcome, "publications.outcome" {
        /// This run put the manifest (or listing).
        Published = "published",
        /// The same artifact (or pin) was already there.
        AlreadyPublished = "already_published",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_names_round_trip_and_unknown_names_are_errors() {
        for s in Stage::ALL {
            assert_eq!(Stage::parse(s.as_str()).unwrap(), *s);
        }
        for e in StageEvent::ALL {
            assert_eq!(StageEvent::parse(e.as_str()).unwrap(), *e);
        }
        for e in RetirementEvent::ALL {
            assert_eq!(RetirementEvent::parse(e.as_str()).unwrap(), *e);
        }
        for e in ArtifactEvent::ALL {
            assert_eq!(ArtifactEvent::parse(e.as_str()).unwrap(), *e);
        }
        for e in KeptMethod::ALL {
            assert_eq!(KeptMethod::parse(e.as_str()).unwrap(), *e);
        }
        for e in UploadOp::ALL {
            assert_eq!(UploadOp::parse(e.as_str()).unwrap(), *e);
        }
        for e in FoundObject::ALL {
            assert_eq!(FoundObject::parse(e.as_str()).unwrap(), *e);
        }
        // The S3-shaped names before migration 0012 are no longer stored:
        // one read back is an error, never a default op.
        let err = UploadOp::parse("manifest_put").unwrap_err();
        assert!(err.to_string().contains("upload_attempts.op"), "{err}");
        let err = UploadState::parse("done").unwrap_err();
        assert!(err.to_string().contains("uploads.state"), "{err}");
        let err = Stage::parse("Fetch").unwrap_err();
        assert!(err.to_string().contains("stage_events.stage"), "{err}");
    }

    /// The `CHECK (column IN (...))` list of `column` in `CREATE TABLE
    /// table` of a migration, in order.
    fn check_list(sql: &str, table: &str, column: &str) -> Vec<String> {
        let create = format!("CREATE TABLE {table} (");
        let body = &sql[sql.find(&create).unwrap_or_else(|| panic!("no {create}"))..];
        let body = &body[..body.find("\n);").expect("end of CREATE TABLE")];
        let key = format!("{column} IN (");
        let list = &body[body
            .find(&key)
            .unwrap_or_else(|| panic!("no {key} in {table}"))
            + key.len()..];
        let list = &list[..list.find(')').expect("end of the IN list")];
        list.split(',')
            .map(|v| v.trim().trim_matches('\'').to_owned())
            .collect()
    }

    /// Guards `uploads.found`'s list (migration 0015 adds the column with
    /// `ALTER TABLE`, so it is read from there, not from a `CREATE TABLE`).
    #[test]
    fn found_object_equals_its_check_list() {
        let sql = include_str!("../../migrations/0015_upload_found.sql");
        let alter = &sql[sql
            .find("ALTER TABLE uploads ADD COLUMN found")
            .expect("the ALTER")..];
        let list = &alter[alter.find("found IN (").expect("the IN list") + "found IN (".len()..];
        let list: Vec<String> = list[..list.find(')').expect("end of the IN list")]
            .split(',')
            .map(|v| v.trim().trim_matches('\'').to_owned())
            .collect();
        assert_eq!(names(FoundObject::ALL, FoundObject::as_str), list);
    }

    fn names<T: Copy>(all: &[T], as_str: fn(T) -> &'static str) -> Vec<String> {
        all.iter().map(|v| as_str(*v).to_owned()).collect()
    }

    /// Guards that every enum stored as text names exactly the values its
    /// column's `CHECK` accepts: a variant added without a migration (or a
    /// migration without the variant) fails here, not in a user's database.
    #[test]
    fn each_enum_equals_its_check_list() {
        let convert = include_str!("../../migrations/0002_convert.sql");
        let cache = include_str!("../../migrations/0004_hf_cache.sql");
        let typed = include_str!("../../migrations/0008_typed_records.sql");
        let stages = include_str!("../../migrations/0013_stage_event_checks.sql");
        let uploads = include_str!("../../migrations/0009_uploads.sql");
        let neutral = include_str!("../../migrations/0012_upload_records.sql");
        let cases = [
            (
                names(Stage::ALL, Stage::as_str),
                check_list(stages, "stage_events_typed", "stage"),
            ),
            (
                names(StageEvent::ALL, StageEvent::as_str),
                check_list(stages, "stage_events_typed", "event"),
            ),
            (
                names(AttemptOutcome::ALL, AttemptOutcome::as_str),
                check_list(typed, "attempts_typed", "outcome"),
            ),
            (
                names(DiscardReason::ALL, DiscardReason::as_str),
                check_list(typed, "discards_typed", "reason"),
            ),
            (
                names(CacheKind::ALL, CacheKind::as_str),
                check_list(cache, "cache_candidates", "kind"),
            ),
            (
                names(CacheOutcome::ALL, CacheOutcome::as_str),
                check_list(cache, "cache_candidates", "outcome"),
            ),
            (
                names(Placement::ALL, Placement::as_str),
                check_list(cache, "cache_candidates", "placement"),
            ),
            (
                names(RetirementEvent::ALL, RetirementEvent::as_str),
                check_list(convert, "source_retirements", "event"),
            ),
            (
                names(ArtifactEvent::ALL, ArtifactEvent::as_str),
                check_list(convert, "artifacts", "event"),
            ),
            (
                names(UploadState::ALL, UploadState::as_str),
                check_list(uploads, "uploads", "state"),
            ),
            (
                names(PublicationOutcome::ALL, PublicationOutcome::as_str),
                check_list(uploads, "publications", "outcome"),
            ),
            (
                names(UploadOp::ALL, UploadOp::as_str),
                check_list(neutral, "upload_attempts_neutral", "op"),
            ),
            (
                names(UploadOutcome::ALL, UploadOutcome::as_str),
                check_list(neutral, "upload_attempts_neutral", "outcome"),
            ),
        ];
        for (variants, check) in cases {
            assert_eq!(variants, check);
        }
    }

    /// Guards the order of `waste_by_reason` in reports: a map keyed by
    /// [`DiscardReason`] lists reasons as a map keyed by their names did.
    #[test]
    fn discard_reasons_are_declared_in_name_order() {
        let names = names(DiscardReason::ALL, DiscardReason::as_str);
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(names, sorted);
    }

    /// Guards that reports print what the database holds: each value
    /// serializes as its stored name, and a stored name this version does
    /// not know names its column.
    #[test]
    fn values_serialize_as_their_stored_names() {
        for r in DiscardReason::ALL {
            assert_eq!(
                serde_json::to_value(r).unwrap(),
                serde_json::Value::String(r.as_str().to_owned())
            );
            assert_eq!(r.as_str().parse::<DiscardReason>().unwrap(), *r);
        }
        for o in AttemptOutcome::ALL {
            assert_eq!(AttemptOutcome::parse(o.as_str()).unwrap(), *o);
        }
        assert_eq!(
            serde_json::to_string(&ArtifactEvent::SetAside).unwrap(),
            "\"set_aside\""
        );
        let err = DiscardReason::parse("range_ignored").unwrap_err();
        assert!(
            matches!(&err, StoreError::UnknownValue { column: "discards.reason", value } if value == "range_ignored"),
            "{err}"
        );
    }

    #[test]
    fn stages_keep_their_order() {
        let names: Vec<_> = Stage::ALL.iter().map(|s| s.as_str()).collect();
        assert_eq!(names, ["resolve", "plan", "fetch", "convert", "verify"]);
    }
}
