//! Ranges of a file fetched in segments: each range's durable watermark,
//! kept so that the file's ledger `committed_bytes` is always the sum of
//! the ranges' durable bytes (see `migrations/0004_fetch_ranges.sql`).

use serde::Serialize;
use sqlx::{Connection, Row, SqliteConnection};

use crate::error::{QueryContext, Result, StoreError};
use crate::events::{AttemptOutcome, DiscardReason};
use crate::model::Attempt;
use crate::model::RunId;
use crate::store::{Store, insert_attempt, insert_discard, to_i64, to_u64};

/// One range `[start, end)` of a segmented file; `[start, watermark)` is
/// durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct RangeRow {
    /// First byte of the range.
    pub start: u64,
    /// One past its last byte.
    pub end: u64,
    /// End of its durable bytes (`start ≤ watermark ≤ end`).
    pub watermark: u64,
}

impl RangeRow {
    /// Durable bytes of the range.
    pub fn durable(&self) -> u64 {
        self.watermark - self.start
    }

    /// Whether every byte of the range is durable.
    pub fn complete(&self) -> bool {
        self.watermark == self.end
    }
}

/// Progress of one range at a checkpoint: its new watermark, and the bytes
/// received since the last checkpoint by the attempt that fetches it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RangeProgress {
    /// The range (by its start).
    pub start: u64,
    /// Its new durable watermark.
    pub watermark: u64,
    /// The attempt that received the bytes, if one is in flight.
    pub attempt: Option<i64>,
    /// Bytes that attempt received since its last checkpoint.
    pub received: u64,
}

/// A tail a crash left past a range's watermark: `kept` bytes from the
/// watermark on are kept, the `rest` after them is not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CrashTail {
    /// The range's watermark when the tail was found.
    pub watermark: u64,
    /// Bytes kept from the watermark on.
    pub kept: u64,
    /// Bytes after them, thrown away.
    pub rest: u64,
}

async fn ranges_of(conn: &mut SqliteConnection, path: &str) -> Result<Vec<RangeRow>> {
    let rows = sqlx::query(
        "SELECT start, end_, watermark FROM fetch_ranges WHERE path = ? ORDER BY start",
    )
    .bind(path)
    .fetch_all(&mut *conn)
    .await
    .ctx("select fetch_ranges")?;
    rows.into_iter()
        .map(|r| {
            Ok(RangeRow {
                start: to_u64(path, "fetch_ranges.start", r.get(0))?,
                end: to_u64(path, "fetch_ranges.end_", r.get(1))?,
                watermark: to_u64(path, "fetch_ranges.watermark", r.get(2))?,
            })
        })
        .collect()
}

/// Sets the ledger's committed bytes to the ranges' durable sum, adds
/// `transferred_delta`, and sets the validator when one is given.
async fn commit_sum(
    conn: &mut SqliteConnection,
    path: &str,
    transferred_delta: u64,
    validator: Option<&str>,
) -> Result<()> {
    let changed = sqlx::query(
        "UPDATE ledger SET
           committed_bytes = (SELECT COALESCE(SUM(watermark - start), 0)
                              FROM fetch_ranges WHERE path = ?1),
           transferred_bytes = transferred_bytes + ?2,
           validator = COALESCE(?3, validator)
         WHERE path = ?1",
    )
    .bind(path)
    .bind(to_i64(path, transferred_delta)?)
    .bind(crate::store::clean(validator))
    .execute(&mut *conn)
    .await
    .ctx("ledger from ranges")?
    .rows_affected();
    if changed != 1 {
        return Err(StoreError::MissingLedger {
            path: path.to_owned(),
        });
    }
    Ok(())
}

impl Store {
    /// The ranges of `path`, by start (empty: fetched as one stream).
    pub async fn ranges(&self, path: &str) -> Result<Vec<RangeRow>> {
        let mut conn = self.conn.lock().await;
        ranges_of(&mut conn, path).await
    }

    /// Starts segmenting `path`: one range `[0, size)` whose watermark is
    /// the file's committed bytes (a single-stream prefix carries over).
    /// A no-op returning the existing ranges when there are some.
    pub async fn begin_ranges(&self, path: &str) -> Result<Vec<RangeRow>> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.ctx("begin")?;
        let existing = ranges_of(&mut tx, path).await?;
        if !existing.is_empty() {
            tx.commit().await.ctx("commit")?;
            return Ok(existing);
        }
        let inserted = sqlx::query(
            "INSERT INTO fetch_ranges (path, start, end_, watermark)
             SELECT path, 0, expected_bytes, committed_bytes FROM ledger
             WHERE path = ? AND expected_bytes > 0 AND adopted_bytes = 0",
        )
        .bind(path)
        .execute(&mut *tx)
        .await
        .ctx("insert first range")?
        .rows_affected();
        if inserted != 1 {
            return Err(StoreError::MissingLedger {
                path: path.to_owned(),
            });
        }
        let ranges = ranges_of(&mut tx, path).await?;
        tx.commit().await.ctx("commit begin_ranges")?;
        Ok(ranges)
    }

    /// Claims a range for one HTTP attempt, in one transaction: every
    /// position in `boundaries` becomes a range start (the range holding it
    /// now ends there, and a new range with nothing durable follows), and
    /// `attempt` is inserted `in_flight`; its id is returned.
    ///
    /// A boundary that already starts a range is left as it is, so claims
    /// made in memory may commit in any order: the ranges tile the file
    /// whichever of them are durable. A boundary must lie past the
    /// watermark of the range holding it. Ranges are split only under a
    /// known validator, which is stored with them.
    pub async fn claim_range(
        &self,
        run: RunId,
        path: &str,
        boundaries: &[u64],
        validator: Option<&str>,
        attempt: &Attempt,
    ) -> Result<i64> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.ctx("begin")?;
        if !boundaries.is_empty() {
            for &at in boundaries {
                let ranges = ranges_of(&mut tx, path).await?;
                if ranges.iter().any(|r| r.start == at) {
                    continue;
                }
                let holder = ranges.into_iter().find(|r| r.start < at && at < r.end);
                let Some(range) = holder.filter(|r| r.watermark < at) else {
                    return Err(StoreError::BadRange {
                        path: path.to_owned(),
                        start: at,
                        at,
                    });
                };
                sqlx::query("UPDATE fetch_ranges SET end_ = ? WHERE path = ? AND start = ?")
                    .bind(to_i64(path, at)?)
                    .bind(path)
                    .bind(to_i64(path, range.start)?)
                    .execute(&mut *tx)
                    .await
                    .ctx("shrink range")?;
                sqlx::query(
                    "INSERT INTO fetch_ranges (path, start, end_, watermark) VALUES (?, ?, ?, ?)",
                )
                .bind(path)
                .bind(to_i64(path, at)?)
                .bind(to_i64(path, range.end)?)
                .bind(to_i64(path, at)?)
                .execute(&mut *tx)
                .await
                .ctx("insert split range")?;
            }
            commit_sum(&mut tx, path, 0, validator).await?;
        }
        let id = insert_attempt(&mut tx, run, attempt).await?;
        tx.commit().await.ctx("commit claim")?;
        Ok(id)
    }

    /// Advances the watermarks of `path`'s ranges and, in the same
    /// transaction, the ledger (committed = Σ durable, transferred += Σ
    /// received) and each attempt's bytes. Call only after the bytes up to
    /// every new watermark are fsynced.
    pub async fn checkpoint_ranges(
        &self,
        path: &str,
        progress: &[RangeProgress],
        validator: Option<&str>,
    ) -> Result<()> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.ctx("begin")?;
        let mut received = 0u64;
        for p in progress {
            let changed = sqlx::query(
                "UPDATE fetch_ranges SET watermark = ?1
                 WHERE path = ?2 AND start = ?3 AND watermark <= ?1 AND ?1 <= end_",
            )
            .bind(to_i64(path, p.watermark)?)
            .bind(path)
            .bind(to_i64(path, p.start)?)
            .execute(&mut *tx)
            .await
            .ctx("range watermark")?
            .rows_affected();
            if changed != 1 {
                return Err(StoreError::BadRange {
                    path: path.to_owned(),
                    start: p.start,
                    at: p.watermark,
                });
            }
            if let Some(id) = p.attempt
                && p.received > 0
            {
                sqlx::query("UPDATE attempts SET body_bytes = body_bytes + ? WHERE id = ?")
                    .bind(to_i64(path, p.received)?)
                    .bind(id)
                    .execute(&mut *tx)
                    .await
                    .ctx("attempt bytes")?;
            }
            received = received
                .checked_add(p.received)
                .ok_or_else(|| StoreError::BadRange {
                    path: path.to_owned(),
                    start: p.start,
                    at: p.watermark,
                })?;
        }
        commit_sum(&mut tx, path, received, validator).await?;
        tx.commit().await.ctx("commit range checkpoint")
    }
}

impl Store {
    /// Records `bytes` of `path` that were received by `attempt` but are not
    /// kept, and counts them as transferred (the watermarks do not move).
    /// With `crash_tail` that attempt's tail is marked measured, so it is
    /// never counted twice.
    pub async fn discard_unkept(
        &self,
        run: RunId,
        path: &str,
        reason: DiscardReason,
        bytes: u64,
        attempt: i64,
        crash_tail: bool,
    ) -> Result<()> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.ctx("begin")?;
        insert_discard(&mut tx, run, path, reason, bytes).await?;
        sqlx::query(
            "UPDATE attempts SET body_bytes = body_bytes + ?1,
               tail_measured = tail_measured OR ?2 WHERE id = ?3",
        )
        .bind(to_i64(path, bytes)?)
        .bind(crash_tail)
        .bind(attempt)
        .execute(&mut *tx)
        .await
        .ctx("attempt bytes")?;
        commit_sum(&mut tx, path, bytes, None).await?;
        tx.commit().await.ctx("commit discard")
    }

    /// Settles the tail a crash left past the watermark of `path`'s range
    /// at `start`, written by `attempt`, in one transaction: its first
    /// `tail.kept` bytes (fsynced by the caller and proven the source's own)
    /// become durable (the watermark moves past them), the `tail.rest`
    /// after them is recorded as discarded for `reason`; both count as
    /// received by the attempt, whose tail is then measured (never counted
    /// twice).
    pub async fn settle_crash_tail(
        &self,
        run: RunId,
        path: &str,
        start: u64,
        tail: CrashTail,
        reason: DiscardReason,
        attempt: i64,
    ) -> Result<()> {
        let bad = || StoreError::BadRange {
            path: path.to_owned(),
            start,
            at: tail.watermark,
        };
        let received = tail.kept.checked_add(tail.rest).ok_or_else(bad)?;
        let new_watermark = tail.watermark.checked_add(tail.kept).ok_or_else(bad)?;
        let mut conn = self.writer().await?;
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.ctx("begin")?;
        let moved = sqlx::query(
            "UPDATE fetch_ranges SET watermark = ?1
             WHERE path = ?2 AND start = ?3 AND watermark = ?4 AND ?1 <= end_",
        )
        .bind(to_i64(path, new_watermark)?)
        .bind(path)
        .bind(to_i64(path, start)?)
        .bind(to_i64(path, tail.watermark)?)
        .execute(&mut *tx)
        .await
        .ctx("range watermark")?
        .rows_affected();
        if moved != 1 {
            return Err(bad());
        }
        if tail.rest > 0 {
            insert_discard(&mut tx, run, path, reason, tail.rest).await?;
        }
        sqlx::query(
            "UPDATE attempts SET body_bytes = body_bytes + ?1, tail_measured = 1 WHERE id = ?2",
        )
        .bind(to_i64(path, received)?)
        .bind(attempt)
        .execute(&mut *tx)
        .await
        .ctx("attempt bytes")?;
        commit_sum(&mut tx, path, received, None).await?;
        tx.commit().await.ctx("commit crash tail")
    }

    /// The newest attempt of `path` still `in_flight` (one cut short by a
    /// crash) whose range started inside `[start, end)` (a stream's first
    /// attempt, without a range, starts at 0) and whose tail was not
    /// measured yet.
    pub async fn in_flight_attempt(&self, path: &str, start: u64, end: u64) -> Result<Option<i64>> {
        let mut conn = self.conn.lock().await;
        let id: Option<i64> = sqlx::query_scalar(
            "SELECT MAX(id) FROM attempts WHERE path = ?1 AND outcome = ?4
               AND tail_measured = 0 AND COALESCE(range_start, 0) >= ?2
               AND COALESCE(range_start, 0) < ?3",
        )
        .bind(path)
        .bind(to_i64(path, start)?)
        .bind(to_i64(path, end)?)
        .bind(AttemptOutcome::InFlight.as_str())
        .fetch_one(&mut *conn)
        .await
        .ctx("in-flight attempt")?;
        Ok(id)
    }

    /// Ends `path`'s ranges (its bytes were all discarded).
    pub async fn end_ranges(&self, path: &str) -> Result<()> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.ctx("begin")?;
        sqlx::query("DELETE FROM fetch_ranges WHERE path = ?")
            .bind(path)
            .execute(&mut *tx)
            .await
            .ctx("delete ranges")?;
        tx.commit().await.ctx("commit end_ranges")
    }
}

impl Store {
    /// What a repin left of `path`'s `.part` (see `save_pin`): the old
    /// pin's ranges by start, or its stream watermark as one range; empty
    /// when there is nothing to settle.
    pub async fn superseded_part(&self, path: &str) -> Result<Vec<RangeRow>> {
        let mut conn = self.conn.lock().await;
        let rows = sqlx::query(
            "SELECT start, end_, watermark FROM superseded_parts WHERE path = ? ORDER BY start",
        )
        .bind(path)
        .fetch_all(&mut *conn)
        .await
        .ctx("select superseded_parts")?;
        rows.into_iter()
            .map(|r| {
                Ok(RangeRow {
                    start: to_u64(path, "superseded_parts.start", r.get(0))?,
                    end: to_u64(path, "superseded_parts.end_", r.get(1))?,
                    watermark: to_u64(path, "superseded_parts.watermark", r.get(2))?,
                })
            })
            .collect()
    }

    /// Forgets the old pin's `.part` of `path` (it was emptied).
    pub async fn end_superseded_part(&self, path: &str) -> Result<()> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.ctx("begin")?;
        sqlx::query("DELETE FROM superseded_parts WHERE path = ?")
            .bind(path)
            .execute(&mut *tx)
            .await
            .ctx("delete superseded_parts")?;
        tx.commit().await.ctx("commit end_superseded_part")
    }
}
