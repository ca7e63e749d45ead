//! Segmented fetch: a file at or above the segment threshold is fetched as
//! several HTTP ranges into one sparse `.part` with positioned writes.
//!
//! Each range `[start, end)` has its own durable watermark in the store
//! (`fetch_ranges`); the ledger's committed bytes are their sum, written in
//! the same transaction. One coordinator per file checkpoints (fsync, then
//! all watermarks at once), accounts each range's end, and starts workers
//! on free connections. A worker streams a range and writes it, and when
//! it is done claims the next one itself: a piece of the file's unclaimed
//! bytes, front to back, or once all is claimed a split of the largest
//! remaining gap (work stealing, never below the minimum range size). A
//! claim is made in memory and made durable with the attempt's row in one
//! transaction while the request is on its way. One sequential digest
//! follows the contiguous written prefix (from memory at the front, read
//! back behind it), so verification needs no second pass over the file
//! and, as ranges complete roughly in file order, little of it waits for
//! the last byte.
//!
//! A file takes another connection only while that can raise its rate:
//! its connections are slower than `split_below_rate` (a capped server),
//! not limited by this machine (`shared::Shared::another_connection_pays`). Whole
//! blocks bypass the page cache (`ftpipe_fs::direct`): each byte is written
//! once and hashed from memory or read back once.
//!
//! Writes are aligned: a worker writes whole [`crate::WRITE_ALIGN`] blocks (only a
//! range's end may be unaligned) and keeps the remainder in memory, so
//! after a crash the bytes written past a watermark are exactly the data
//! extent that `SEEK_DATA` / `SEEK_HOLE` find there: the un-checkpointed
//! tail, recorded as a discard before the range is fetched again.
//!
//! Strictness is that of one stream: every request carries `If-Range` with
//! the validator, and each 206 must carry exactly the requested
//! `Content-Range` and that validator. A file is split only once a strong
//! validator is known. A `200` to a range request means the server ignores
//! ranges (same validator: the file falls back to one stream) or the file
//! changed (another validator); either way every byte of the file is
//! discarded, recorded, and the file starts again.
//!
//! The parts, each depending only on those before it:
//! - `claim`: the claim policy, pure over the ranges in memory (the
//!   [`claim::Slot`]s): how much a claim takes, when a file is near the
//!   end of the whole fetch, whether another connection pays, where a
//!   range is split.
//! - `shared`: what a file's coordinator and its workers share (the part
//!   file, the slots, the validator, the sequential digest).
//! - `worker`: one connection streaming ranges into the part file.
//! - `coordinator`: one file's passes: opening the part against the store,
//!   starting workers, checkpoints, retries, verify and publish.

mod claim;
mod coordinator;
mod shared;
mod worker;

pub(crate) use coordinator::fetch_segmented;
