//! [`Store`]: the single writer over the state database.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
use sqlx::{Connection, Row, SqliteConnection};
use tokio::sync::{Mutex, MutexGuard};

use ftpipe_secrets::redact;

use crate::error::{QueryContext, Result, StoreError};
use crate::events::{
    AttemptOutcome, CacheKind, CacheOutcome, DiscardReason, Placement, Stage, StageEvent,
};
use crate::model::{
    Attempt, CacheCandidate, DiscardRow, FileRow, LedgerRow, Pin, Receipt, RunId, SelectionGlobs,
    StageEventRow,
};

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations");

/// The state database. Cheap to share behind an `Arc`.
pub struct Store {
    path: PathBuf,
    options: SqliteConnectOptions,
    pub(crate) conn: Mutex<SqliteConnection>,
}

/// Another directory's state database, opened read-only: never created,
/// migrated or written, and its directory's lock not taken (the run that
/// owns it may be going on; SQLite's own shared locks keep each read
/// consistent). Only the reads a fetch reusing that directory's bytes
/// needs are offered (`--reuse-from`).
pub struct ReadOnlyStore {
    pub(crate) conn: Mutex<SqliteConnection>,
}

impl ReadOnlyStore {
    /// Opens the existing database at `path` read-only (a link planted at
    /// it or its WAL files is refused, as [`Store::open`] does).
    pub async fn open(path: &Path) -> Result<ReadOnlyStore> {
        for suffix in ["", "-wal", "-shm"] {
            let mut p = path.as_os_str().to_owned();
            p.push(suffix);
            let p = PathBuf::from(p);
            ftpipe_fs::nofollow::check_absent_or_regular(&p)
                .map_err(|source| StoreError::Unsafe { path: p, source })?;
        }
        let options = SqliteConnectOptions::new()
            .filename(path)
            .read_only(true)
            .create_if_missing(false)
            .busy_timeout(Duration::from_secs(10));
        let conn = SqliteConnection::connect_with(&options)
            .await
            .map_err(|source| StoreError::Open {
                path: path.to_owned(),
                source,
            })?;
        Ok(ReadOnlyStore {
            conn: Mutex::new(conn),
        })
    }
}

/// Bytes kept allocated beside the database while a fetch runs (see
/// [`Store::ensure_space_reserve`]).
pub const SPACE_RESERVE_BYTES: u64 = 2 << 20;

pub(crate) fn to_i64(path: &str, value: u64) -> Result<i64> {
    i64::try_from(value).map_err(|_| StoreError::CounterOverflow {
        path: path.to_owned(),
        value,
    })
}

/// A text column's value from outside (a header, an error, a URL) as
/// stored: every registered credential redacted (`ftpipe_secrets`).
pub(crate) fn clean(text: Option<&str>) -> Option<String> {
    text.map(|t| redact(t).into_owned())
}

/// Inserts `attempt` as `in_flight` in the open transaction; its id.
pub(crate) async fn insert_attempt(
    conn: &mut SqliteConnection,
    run: RunId,
    attempt: &Attempt,
) -> Result<i64> {
    let range_start = attempt
        .range_start
        .map(|v| to_i64(&attempt.path, v))
        .transpose()?;
    let id = sqlx::query(
        "INSERT INTO attempts (run_id, path, host, range_start, if_range, outcome)
         VALUES (?, ?, ?, ?, ?, ?)",
    )
    .bind(run)
    .bind(&attempt.path)
    .bind(clean(Some(attempt.host.as_str())))
    .bind(range_start)
    .bind(clean(attempt.if_range.as_deref()))
    .bind(AttemptOutcome::InFlight.as_str())
    .execute(&mut *conn)
    .await
    .ctx("insert attempt")?
    .last_insert_rowid();
    Ok(id)
}

/// Appends one discard row (inside the caller's transaction).
pub(crate) async fn insert_discard(
    conn: &mut SqliteConnection,
    run: RunId,
    path: &str,
    reason: DiscardReason,
    bytes: u64,
) -> Result<()> {
    sqlx::query("INSERT INTO discards (run_id, path, reason, bytes) VALUES (?, ?, ?, ?)")
        .bind(run)
        .bind(path)
        .bind(reason.as_str())
        .bind(to_i64(path, bytes)?)
        .execute(&mut *conn)
        .await
        .ctx("insert discard")?;
    Ok(())
}

pub(crate) fn to_u64(path: &str, column: &'static str, value: i64) -> Result<u64> {
    u64::try_from(value).map_err(|_| StoreError::CorruptCounter {
        path: path.to_owned(),
        column,
        value,
    })
}

impl Store {
    /// Opens (creating and migrating if needed) the database at `path`.
    ///
    /// WAL is set when the file is created (or when a creation interrupted by
    /// a crash is completed); SQLite persists it in the file header, so later
    /// opens inherit it.
    pub async fn open(path: &Path) -> Result<Store> {
        // SQLite follows links; refuse one planted at the database or its
        // WAL and shared-memory files before it opens anything.
        for suffix in ["", "-wal", "-shm", "-journal"] {
            let mut p = path.as_os_str().to_owned();
            p.push(suffix);
            let p = std::path::PathBuf::from(p);
            ftpipe_fs::nofollow::check_absent_or_regular(&p)
                .map_err(|source| StoreError::Unsafe { path: p, source })?;
        }
        let bootstrap = !path.exists();
        let mut options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .synchronous(SqliteSynchronous::Full)
            .foreign_keys(true)
            .busy_timeout(Duration::from_secs(10));
        if bootstrap {
            options = options.journal_mode(SqliteJournalMode::Wal);
        }
        let mut conn = SqliteConnection::connect_with(&options)
            .await
            .map_err(|source| StoreError::Open {
                path: path.to_owned(),
                source,
            })?;
        // A kill -9 while SQLite was creating the file (before the WAL header
        // reached it) leaves an empty or hot-journalled file, which SQLite
        // rolls back to empty on this open; the file exists, so the bootstrap
        // branch above was skipped. Complete the interrupted creation: a
        // database is never left in rollback-journal mode.
        if !bootstrap {
            let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
                .fetch_one(&mut conn)
                .await
                .ctx("journal_mode")?;
            if !mode.eq_ignore_ascii_case("wal") {
                let _: String = sqlx::query_scalar("PRAGMA journal_mode = WAL")
                    .fetch_one(&mut conn)
                    .await
                    .ctx("set journal_mode")?;
            }
        }
        MIGRATOR
            .run(&mut conn)
            .await
            .map_err(|source| StoreError::Migrate {
                path: path.to_owned(),
                source,
            })?;
        Ok(Store {
            path: path.to_owned(),
            options: options.journal_mode(SqliteJournalMode::Wal),
            conn: Mutex::new(conn),
        })
    }

    /// The connection, for a write transaction.
    ///
    /// No transaction outlives a method here, so a connection still "in a
    /// transaction" at the start of one is stale and is replaced. (When
    /// SQLite rolls a transaction back by itself, a `COMMIT` failing with
    /// `SQLITE_FULL`, sqlx still counts it as open, and its `ROLLBACK` on
    /// drop fails; every later `BEGIN` would fail and hide the real error.)
    pub(crate) async fn writer(&self) -> Result<MutexGuard<'_, SqliteConnection>> {
        let mut conn = self.conn.lock().await;
        if conn.is_in_transaction() {
            tracing::warn!("state database connection left in a failed transaction; reopening it");
            *conn = SqliteConnection::connect_with(&self.options)
                .await
                .map_err(|source| StoreError::Open {
                    path: self.path.clone(),
                    source,
                })?;
        }
        Ok(conn)
    }

    fn reserve_path(&self) -> PathBuf {
        self.path.with_file_name("space-reserve")
    }

    /// Makes sure [`SPACE_RESERVE_BYTES`] are allocated in a file beside the
    /// database. The database lives on the target volume: when downloads
    /// fill it, [`Store::release_space_reserve`] frees this space so the
    /// watermark, the attempt and the stage event can still be written.
    /// Best effort: returns false when the space could not be allocated.
    pub fn ensure_space_reserve(&self) -> bool {
        use std::io::Write;
        let path = self.reserve_path();
        if std::fs::symlink_metadata(&path)
            .is_ok_and(|m| m.is_file() && m.nlink() == 1 && m.len() == SPACE_RESERVE_BYTES)
        {
            return true;
        }
        // Real blocks (zeros written), not a sparse `set_len`. Never through
        // a planted link: a refused entry is left alone (and reported).
        if let Err(e) = ftpipe_fs::nofollow::check_absent_or_regular(&path) {
            tracing::warn!("not writing the space reserve {}: {e}", path.display());
            return false;
        }
        let written = ftpipe_fs::nofollow::create_truncated(&path).and_then(|mut f| {
            let block = vec![0u8; 64 << 10];
            for _ in 0..SPACE_RESERVE_BYTES / block.len() as u64 {
                f.write_all(&block)?;
            }
            f.sync_all()
        });
        if written.is_err() {
            let _ = std::fs::remove_file(&path);
        }
        written.is_ok()
    }

    /// Frees the reserve (idempotent). Returns whether there was one.
    pub fn release_space_reserve(&self) -> bool {
        std::fs::remove_file(self.reserve_path()).is_ok()
    }

    /// Path of the database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `PRAGMA integrity_check` and fails unless it answers `ok`.
    pub async fn integrity_check(&self) -> Result<()> {
        let mut conn = self.conn.lock().await;
        let report: String = sqlx::query_scalar("PRAGMA integrity_check")
            .fetch_one(&mut *conn)
            .await
            .ctx("integrity_check")?;
        if report == "ok" {
            Ok(())
        } else {
            Err(StoreError::Integrity { report })
        }
    }

    /// The journal mode in force (`wal` once bootstrapped).
    pub async fn journal_mode(&self) -> Result<String> {
        let mut conn = self.conn.lock().await;
        sqlx::query_scalar("PRAGMA journal_mode")
            .fetch_one(&mut *conn)
            .await
            .ctx("journal_mode")
    }

    /// Records a new run and returns its id.
    pub async fn begin_run(&self, command: &str, version: &str) -> Result<RunId> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.ctx("begin")?;
        let id = sqlx::query("INSERT INTO runs (command, pid, ftpipe_version) VALUES (?, ?, ?)")
            .bind(command)
            .bind(i64::from(std::process::id()))
            .bind(version)
            .execute(&mut *tx)
            .await
            .ctx("insert run")?
            .last_insert_rowid();
        tx.commit().await.ctx("commit run")?;
        Ok(RunId::from_raw(id))
    }

    /// Appends one stage event to the log.
    pub async fn append_stage_event(
        &self,
        run: RunId,
        stage: Stage,
        event: StageEvent,
        detail: &str,
    ) -> Result<()> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.ctx("begin")?;
        sqlx::query("INSERT INTO stage_events (run_id, stage, event, detail) VALUES (?, ?, ?, ?)")
            .bind(run)
            .bind(stage.as_str())
            .bind(event.as_str())
            .bind(redact(detail))
            .execute(&mut *tx)
            .await
            .ctx("insert stage event")?;
        tx.commit().await.ctx("commit stage event")
    }

    /// The whole stage-event log in order.
    pub async fn stage_events(&self) -> Result<Vec<StageEventRow>> {
        let mut conn = self.conn.lock().await;
        let rows = sqlx::query(
            "SELECT id, run_id, stage, event, detail, at FROM stage_events ORDER BY id",
        )
        .fetch_all(&mut *conn)
        .await
        .ctx("select stage events")?;
        rows.into_iter()
            .map(|r| {
                Ok(StageEventRow {
                    id: r.get(0),
                    run_id: r.get(1),
                    stage: Stage::parse(r.get(2))?,
                    event: StageEvent::parse(r.get(3))?,
                    detail: r.get(4),
                    at: r.get(5),
                })
            })
            .collect()
    }

    /// The pin, if resolve has run.
    pub async fn pin(&self) -> Result<Option<Pin>> {
        let mut conn = self.conn.lock().await;
        let row = sqlx::query("SELECT repo, revision, commit_sha, endpoint FROM pin WHERE id = 1")
            .fetch_optional(&mut *conn)
            .await
            .ctx("select pin")?;
        Ok(row.map(|r| Pin {
            repo: r.get(0),
            revision: r.get(1),
            commit: r.get(2),
            endpoint: r.get(3),
        }))
    }

    /// [`Store::save_pin_selected`] for a listing selected without globs.
    pub async fn save_pin(&self, pin: &Pin, files: &[FileRow]) -> Result<()> {
        self.save_pin_selected(pin, files, &SelectionGlobs::default())
            .await
    }

    /// Stores the pin, its listing and the globs that selected it in one
    /// transaction, replacing an older pin. Ledger rows are created for new
    /// selected files and kept for files whose identity is unchanged; rows
    /// of files whose identity changed or that left the listing are removed
    /// with their receipts.
    pub async fn save_pin_selected(
        &self,
        pin: &Pin,
        files: &[FileRow],
        globs: &SelectionGlobs,
    ) -> Result<()> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.ctx("begin")?;
        replace_selection_globs(&mut tx, globs).await?;
        upsert_pin(&mut tx, pin).await?;
        stage_new_listing(&mut tx, files).await?;
        retire_changed_and_gone_files(&mut tx).await?;
        install_new_listing(&mut tx).await?;
        tx.commit().await.ctx("commit pin")
    }

    /// The globs the stored listing was selected with (none when it was
    /// selected without any, or before they were recorded).
    pub async fn selection_globs(&self) -> Result<SelectionGlobs> {
        let mut conn = self.conn.lock().await;
        let rows = sqlx::query("SELECT kind, glob FROM selection_globs ORDER BY kind, position")
            .fetch_all(&mut *conn)
            .await
            .ctx("select selection globs")?;
        let mut globs = SelectionGlobs::default();
        for r in rows {
            let kind: String = r.get(0);
            let glob: String = r.get(1);
            if kind == "include" {
                globs.include.push(glob);
            } else {
                globs.exclude.push(glob);
            }
        }
        Ok(globs)
    }

    /// The pinned listing, ordered by path.
    pub async fn files(&self) -> Result<Vec<FileRow>> {
        let mut conn = self.conn.lock().await;
        let rows = sqlx::query(
            "SELECT path, size, git_oid, lfs_sha256, xet_hash, selected FROM files ORDER BY path",
        )
        .fetch_all(&mut *conn)
        .await
        .ctx("select files")?;
        rows.into_iter()
            .map(|r| {
                let path: String = r.get(0);
                Ok(FileRow {
                    size: to_u64(&path, "size", r.get(1))?,
                    git_oid: r.get(2),
                    lfs_sha256: r.get(3),
                    xet_hash: r.get(4),
                    selected: r.get(5),
                    path,
                })
            })
            .collect()
    }

    /// Every ledger row with its discard total, ordered by path.
    pub async fn ledger(&self) -> Result<Vec<LedgerRow>> {
        self.ledger_where(None).await
    }

    /// The ledger row of one file.
    pub async fn ledger_row(&self, path: &str) -> Result<LedgerRow> {
        self.ledger_where(Some(path))
            .await?
            .pop()
            .ok_or_else(|| StoreError::MissingLedger {
                path: path.to_owned(),
            })
    }

    async fn ledger_where(&self, only: Option<&str>) -> Result<Vec<LedgerRow>> {
        let mut conn = self.conn.lock().await;
        let query = sqlx::query(
            "SELECT l.path, l.expected_bytes, l.committed_bytes, l.transferred_bytes,
                    l.adopted_bytes, l.validator,
                    (SELECT COALESCE(SUM(bytes), 0) FROM discards d WHERE d.path = l.path),
                    l.cache_bytes
             FROM ledger l WHERE ?1 IS NULL OR l.path = ?1 ORDER BY l.path",
        )
        .bind(only);
        let rows = query.fetch_all(&mut *conn).await.ctx("select ledger")?;
        rows.into_iter()
            .map(|r| {
                let path: String = r.get(0);
                Ok(LedgerRow {
                    expected: to_u64(&path, "expected_bytes", r.get(1))?,
                    committed: to_u64(&path, "committed_bytes", r.get(2))?,
                    transferred: to_u64(&path, "transferred_bytes", r.get(3))?,
                    adopted: to_u64(&path, "adopted_bytes", r.get(4))?,
                    validator: r.get(5),
                    discarded: to_u64(&path, "discards", r.get(6))?,
                    cache: to_u64(&path, "cache_bytes", r.get(7))?,
                    path,
                })
            })
            .collect()
    }

    /// Advances the watermark of `path` to `committed` and adds
    /// `transferred_delta` received bytes. Call only after the bytes up to
    /// `committed` are fsynced.
    pub async fn checkpoint(
        &self,
        path: &str,
        committed: u64,
        transferred_delta: u64,
        validator: Option<&str>,
        attempt: Option<i64>,
    ) -> Result<()> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.ctx("begin")?;
        // The attempt that received the bytes counts them in the same
        // transaction: an attempt cut short by a crash shows what it
        // committed, and Σ attempt bytes = transferred at every commit.
        if let Some(id) = attempt {
            sqlx::query("UPDATE attempts SET body_bytes = body_bytes + ? WHERE id = ?")
                .bind(to_i64(path, transferred_delta)?)
                .bind(id)
                .execute(&mut *tx)
                .await
                .ctx("attempt bytes")?;
        }
        let changed = sqlx::query(
            "UPDATE ledger SET committed_bytes = ?, transferred_bytes = transferred_bytes + ?,
               validator = ? WHERE path = ?",
        )
        .bind(to_i64(path, committed)?)
        .bind(to_i64(path, transferred_delta)?)
        .bind(clean(validator))
        .bind(path)
        .execute(&mut *tx)
        .await
        .ctx("checkpoint")?
        .rows_affected();
        if changed != 1 {
            return Err(StoreError::MissingLedger {
                path: path.to_owned(),
            });
        }
        tx.commit().await.ctx("commit checkpoint")
    }

    /// Records that `bytes` were thrown away for `reason` and sets the
    /// watermark to `committed`. `also_transferred` is for bytes received
    /// but never counted (a tail beyond the watermark found after a crash).
    pub async fn discard(
        &self,
        run: RunId,
        path: &str,
        reason: DiscardReason,
        bytes: u64,
        committed: u64,
        also_transferred: bool,
    ) -> Result<()> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.ctx("begin")?;
        // Bytes received but not yet counted belong to the attempt that
        // received them: the newest one of this path still in flight (cut
        // short by a crash, or the current one). Network bytes are only ever
        // written while their attempt is in flight, so a tail no attempt can
        // own was never received uncounted: it is the excess of a cut whose
        // truncation a crash undid (already discarded) or an unclaimed cache
        // copy (never counted). It is cut without a second count.
        let attributed = if also_transferred {
            sqlx::query(
                "UPDATE attempts SET body_bytes = body_bytes + ? WHERE id =
                   (SELECT MAX(id) FROM attempts WHERE path = ? AND outcome = ?)",
            )
            .bind(to_i64(path, bytes)?)
            .bind(path)
            .bind(AttemptOutcome::InFlight.as_str())
            .execute(&mut *tx)
            .await
            .ctx("attempt bytes")?
            .rows_affected()
                > 0
        } else {
            false
        };
        let extra = if attributed { to_i64(path, bytes)? } else { 0 };
        if attributed || !also_transferred {
            insert_discard(&mut tx, run, path, reason, bytes).await?;
        }
        let validator_reset = committed == 0;
        sqlx::query(
            "UPDATE ledger SET committed_bytes = ?, transferred_bytes = transferred_bytes + ?,
               validator = CASE WHEN ? THEN NULL ELSE validator END WHERE path = ?",
        )
        .bind(to_i64(path, committed)?)
        .bind(extra)
        .bind(validator_reset)
        .bind(path)
        .execute(&mut *tx)
        .await
        .ctx("discard ledger")?;
        tx.commit().await.ctx("commit discard")
    }

    /// After a crash: the `kept` bytes written past `path`'s watermark
    /// `watermark` (a stream's part; fsynced by the caller and proven the
    /// source's own) become durable, counted as received by the newest
    /// attempt of `path` still in flight whose tail was not measured, which
    /// is then marked measured, in one transaction. `false`, and nothing
    /// changed, when there is no such attempt (bytes no attempt received
    /// are not claimed: see [`Store::discard`]) or the watermark moved.
    pub async fn claim_stream_tail(&self, path: &str, watermark: u64, kept: u64) -> Result<bool> {
        let new_watermark =
            watermark
                .checked_add(kept)
                .ok_or_else(|| StoreError::UnknownValue {
                    column: "ledger.committed_bytes",
                    value: format!("{watermark} + {kept} of {path}"),
                })?;
        let mut conn = self.writer().await?;
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.ctx("begin")?;
        let attributed = sqlx::query(
            "UPDATE attempts SET body_bytes = body_bytes + ?, tail_measured = 1 WHERE id =
               (SELECT MAX(id) FROM attempts WHERE path = ? AND outcome = ? AND tail_measured = 0)",
        )
        .bind(to_i64(path, kept)?)
        .bind(path)
        .bind(AttemptOutcome::InFlight.as_str())
        .execute(&mut *tx)
        .await
        .ctx("attempt bytes")?
        .rows_affected();
        let moved = sqlx::query(
            "UPDATE ledger SET committed_bytes = ?, transferred_bytes = transferred_bytes + ?
             WHERE path = ? AND committed_bytes = ?",
        )
        .bind(to_i64(path, new_watermark)?)
        .bind(to_i64(path, kept)?)
        .bind(path)
        .bind(to_i64(path, watermark)?)
        .execute(&mut *tx)
        .await
        .ctx("claim stream tail")?
        .rows_affected();
        if attributed != 1 || moved != 1 {
            tx.rollback().await.ctx("roll back stream tail")?;
            return Ok(false);
        }
        tx.commit().await.ctx("commit stream tail")?;
        Ok(true)
    }

    /// Marks the tails of `path`'s attempts still in flight (their process
    /// died) measured, once a stream's part was settled against its
    /// watermark: bytes found past it later are not theirs to claim.
    pub async fn measure_stream_tails(&self, path: &str) -> Result<()> {
        let unmeasured: i64 = {
            let mut conn = self.conn.lock().await;
            sqlx::query_scalar(
                "SELECT COUNT(*) FROM attempts WHERE path = ? AND outcome = ? AND tail_measured = 0",
            )
            .bind(path)
            .bind(AttemptOutcome::InFlight.as_str())
            .fetch_one(&mut *conn)
            .await
            .ctx("unmeasured stream tails")?
        };
        if unmeasured == 0 {
            return Ok(());
        }
        let mut conn = self.writer().await?;
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.ctx("begin")?;
        sqlx::query("UPDATE attempts SET tail_measured = 1 WHERE path = ? AND outcome = ?")
            .bind(path)
            .bind(AttemptOutcome::InFlight.as_str())
            .execute(&mut *tx)
            .await
            .ctx("measure stream tails")?;
        tx.commit().await.ctx("commit stream tails")
    }

    /// All discards, in order.
    pub async fn discards(&self) -> Result<Vec<DiscardRow>> {
        let mut conn = self.conn.lock().await;
        let rows = sqlx::query("SELECT path, reason, bytes, at FROM discards ORDER BY id")
            .fetch_all(&mut *conn)
            .await
            .ctx("select discards")?;
        rows.into_iter()
            .map(|r| {
                let path: String = r.get(0);
                Ok(DiscardRow {
                    reason: DiscardReason::parse(r.get(1))?,
                    bytes: to_u64(&path, "discards.bytes", r.get(2))?,
                    at: r.get(3),
                    path,
                })
            })
            .collect()
    }

    /// Inserts an attempt as `in_flight` and returns its id.
    pub async fn start_attempt(&self, run: RunId, attempt: &Attempt) -> Result<i64> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.ctx("begin")?;
        let id = insert_attempt(&mut tx, run, attempt).await?;
        tx.commit().await.ctx("commit attempt")?;
        Ok(id)
    }

    /// Records how an attempt ended.
    pub async fn finish_attempt(&self, attempt: &Attempt) -> Result<()> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.ctx("begin")?;
        sqlx::query(
            "UPDATE attempts SET finished_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now'), host = ?,
               status = ?, content_range = ?, etag = ?, body_bytes = ?, outcome = ?, error = ?
             WHERE id = ?",
        )
        .bind(clean(Some(attempt.host.as_str())))
        .bind(attempt.status.map(i64::from))
        .bind(clean(attempt.content_range.as_deref()))
        .bind(clean(attempt.etag.as_deref()))
        .bind(to_i64(&attempt.path, attempt.body_bytes)?)
        .bind(attempt.outcome.as_str())
        .bind(clean(attempt.error.as_deref()))
        .bind(attempt.id)
        .execute(&mut *tx)
        .await
        .ctx("finish attempt")?;
        tx.commit().await.ctx("commit attempt")
    }

    /// Σ body bytes of every attempt, per path.
    pub async fn attempt_bytes(&self) -> Result<std::collections::HashMap<String, u64>> {
        let mut conn = self.conn.lock().await;
        let rows = sqlx::query("SELECT path, SUM(body_bytes) FROM attempts GROUP BY path")
            .fetch_all(&mut *conn)
            .await
            .ctx("sum attempt bytes")?;
        rows.into_iter()
            .map(|r| {
                let path: String = r.get(0);
                let sum = to_u64(&path, "attempts.body_bytes", r.get(1))?;
                Ok((path, sum))
            })
            .collect()
    }

    /// All attempts, in order.
    pub async fn attempts(&self) -> Result<Vec<Attempt>> {
        let mut conn = self.conn.lock().await;
        let rows = sqlx::query(
            "SELECT id, path, host, range_start, if_range, status, content_range, etag,
                    body_bytes, outcome, error, started_at FROM attempts ORDER BY id",
        )
        .fetch_all(&mut *conn)
        .await
        .ctx("select attempts")?;
        rows.into_iter()
            .map(|r| {
                let path: String = r.get(1);
                let range_start: Option<i64> = r.get(3);
                let status: Option<i64> = r.get(5);
                Ok(Attempt {
                    id: r.get(0),
                    host: r.get(2),
                    range_start: range_start
                        .map(|v| to_u64(&path, "range_start", v))
                        .transpose()?,
                    if_range: r.get(4),
                    status: status.and_then(|s| u16::try_from(s).ok()),
                    content_range: r.get(6),
                    etag: r.get(7),
                    body_bytes: to_u64(&path, "body_bytes", r.get(8))?,
                    outcome: AttemptOutcome::parse(r.get(9))?,
                    error: r.get(10),
                    started_at: r.get(11),
                    path,
                })
            })
            .collect()
    }

    /// Writes the receipt of a published file. When `adopted` the file was
    /// found on disk: any partial watermark is discarded and its bytes are
    /// counted as adopted.
    pub async fn put_receipt(&self, run: RunId, receipt: &Receipt) -> Result<()> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.ctx("begin")?;
        if receipt.adopted {
            sqlx::query(
                "INSERT INTO discards (run_id, path, reason, bytes)
                 SELECT ?, path, ?, committed_bytes FROM ledger
                 WHERE path = ? AND committed_bytes > 0 AND committed_bytes < expected_bytes",
            )
            .bind(run)
            .bind(DiscardReason::SupersededByAdoptedFile.as_str())
            .bind(&receipt.path)
            .execute(&mut *tx)
            .await
            .ctx("adopt discard")?;
            sqlx::query(
                "UPDATE ledger SET
                   committed_bytes = CASE WHEN committed_bytes = expected_bytes THEN committed_bytes ELSE 0 END,
                   adopted_bytes = CASE WHEN committed_bytes = expected_bytes THEN 0 ELSE expected_bytes END
                 WHERE path = ?",
            )
            .bind(&receipt.path)
            .execute(&mut *tx)
            .await
            .ctx("adopt ledger")?;
        }
        sqlx::query(
            "INSERT INTO receipts (path, size, digest_kind, digest, run_id, adopted)
             VALUES (?, ?, ?, ?, ?, ?)
             ON CONFLICT(path) DO UPDATE SET size = excluded.size, digest_kind = excluded.digest_kind,
               digest = excluded.digest, run_id = excluded.run_id, adopted = excluded.adopted,
               completed_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now')",
        )
        .bind(&receipt.path)
        .bind(to_i64(&receipt.path, receipt.size)?)
        .bind(&receipt.digest_kind)
        .bind(&receipt.digest)
        .bind(run)
        .bind(receipt.adopted)
        .execute(&mut *tx)
        .await
        .ctx("insert receipt")?;
        tx.commit().await.ctx("commit receipt")
    }

    /// Removes a receipt whose file vanished and discards its committed bytes
    /// so the ledger keeps adding up when the file is fetched again.
    pub async fn revoke_receipt(
        &self,
        run: RunId,
        path: &str,
        reason: DiscardReason,
    ) -> Result<()> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.ctx("begin")?;
        sqlx::query(
            "INSERT INTO discards (run_id, path, reason, bytes)
             SELECT ?, path, ?, committed_bytes FROM ledger WHERE path = ? AND committed_bytes > 0",
        )
        .bind(run)
        .bind(reason.as_str())
        .bind(path)
        .execute(&mut *tx)
        .await
        .ctx("revoke discard")?;
        sqlx::query(
            "UPDATE ledger SET committed_bytes = 0, adopted_bytes = 0, validator = NULL WHERE path = ?",
        )
        .bind(path)
        .execute(&mut *tx)
        .await
        .ctx("revoke ledger")?;
        sqlx::query("DELETE FROM receipts WHERE path = ?")
            .bind(path)
            .execute(&mut *tx)
            .await
            .ctx("delete receipt")?;
        tx.commit().await.ctx("commit revoke")
    }

    /// Paths that hold a receipt (published and verified).
    pub async fn published_paths(&self) -> Result<std::collections::BTreeSet<String>> {
        Ok(self.receipts().await?.into_iter().map(|r| r.path).collect())
    }

    /// Every receipt, keyed by path.
    pub async fn receipts_by_path(&self) -> Result<std::collections::BTreeMap<String, Receipt>> {
        Ok(self
            .receipts()
            .await?
            .into_iter()
            .map(|r| (r.path.clone(), r))
            .collect())
    }

    /// All receipts, ordered by path.
    pub async fn receipts(&self) -> Result<Vec<Receipt>> {
        let mut conn = self.conn.lock().await;
        let rows = sqlx::query(
            "SELECT path, size, digest_kind, digest, completed_at, adopted FROM receipts ORDER BY path",
        )
        .fetch_all(&mut *conn)
        .await
        .ctx("select receipts")?;
        rows.into_iter()
            .map(|r| {
                let path: String = r.get(0);
                Ok(Receipt {
                    size: to_u64(&path, "receipts.size", r.get(1))?,
                    digest_kind: r.get(2),
                    digest: r.get(3),
                    completed_at: r.get(4),
                    adopted: r.get(5),
                    path,
                })
            })
            .collect()
    }

    /// Publishes a file adopted whole from a Hugging Face cache, in one
    /// transaction: a partial watermark becomes a `superseded_by_hf_cache`
    /// discard, the watermark jumps to the file size with those bytes
    /// counted in `cache_bytes` (not `transferred`), the candidate is logged
    /// and the receipt written. Call only after the file is published and
    /// its directory fsynced.
    pub async fn adopt_from_cache(
        &self,
        run: RunId,
        receipt: &Receipt,
        candidate: &CacheCandidate,
    ) -> Result<()> {
        let path = &receipt.path;
        let size = to_i64(path, receipt.size)?;
        let mut conn = self.writer().await?;
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.ctx("begin")?;
        sqlx::query(
            "INSERT INTO discards (run_id, path, reason, bytes)
             SELECT ?, path, ?, committed_bytes FROM ledger
             WHERE path = ? AND committed_bytes > 0",
        )
        .bind(run)
        .bind(DiscardReason::SupersededByHfCache.as_str())
        .bind(path)
        .execute(&mut *tx)
        .await
        .ctx("cache discard")?;
        let changed = sqlx::query(
            "UPDATE ledger SET committed_bytes = ?, cache_bytes = cache_bytes + ?, validator = NULL
             WHERE path = ? AND expected_bytes = ?",
        )
        .bind(size)
        .bind(size)
        .bind(path)
        .bind(size)
        .execute(&mut *tx)
        .await
        .ctx("cache ledger")?
        .rows_affected();
        if changed != 1 {
            return Err(StoreError::MissingLedger { path: path.clone() });
        }
        insert_candidate(&mut tx, run, candidate).await?;
        sqlx::query(
            "INSERT INTO receipts (path, size, digest_kind, digest, run_id, adopted)
             VALUES (?, ?, ?, ?, ?, 0)
             ON CONFLICT(path) DO UPDATE SET size = excluded.size, digest_kind = excluded.digest_kind,
               digest = excluded.digest, run_id = excluded.run_id, adopted = 0,
               completed_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now')",
        )
        .bind(path)
        .bind(size)
        .bind(&receipt.digest_kind)
        .bind(&receipt.digest)
        .bind(run)
        .execute(&mut *tx)
        .await
        .ctx("insert receipt")?;
        tx.commit().await.ctx("commit cache adoption")
    }

    /// Sets the watermark of `path` (which must be 0) to `len` bytes copied
    /// from an interrupted download in the cache, counted in `cache_bytes`,
    /// and logs the candidate. Call only after the `.part` holding them is
    /// fsynced.
    pub async fn seed_from_cache(
        &self,
        run: RunId,
        path: &str,
        len: u64,
        candidate: &CacheCandidate,
    ) -> Result<()> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.ctx("begin")?;
        let changed = sqlx::query(
            "UPDATE ledger SET committed_bytes = ?, cache_bytes = cache_bytes + ?, validator = NULL
             WHERE path = ? AND committed_bytes = 0 AND expected_bytes >= ?",
        )
        .bind(to_i64(path, len)?)
        .bind(to_i64(path, len)?)
        .bind(path)
        .bind(to_i64(path, len)?)
        .execute(&mut *tx)
        .await
        .ctx("seed ledger")?
        .rows_affected();
        if changed != 1 {
            return Err(StoreError::MissingLedger {
                path: path.to_owned(),
            });
        }
        insert_candidate(&mut tx, run, candidate).await?;
        tx.commit().await.ctx("commit cache seed")
    }

    /// Logs a cache candidate that was looked at and not used.
    pub async fn reject_cache_candidate(
        &self,
        run: RunId,
        candidate: &CacheCandidate,
    ) -> Result<()> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.ctx("begin")?;
        insert_candidate(&mut tx, run, candidate).await?;
        tx.commit().await.ctx("commit cache candidate")
    }

    /// Every cache candidate logged, in order.
    pub async fn cache_candidates(&self) -> Result<Vec<CacheCandidate>> {
        let mut conn = self.conn.lock().await;
        let rows = sqlx::query(
            "SELECT path, cache_path, kind, outcome, placement, bytes, detail
             FROM cache_candidates ORDER BY id",
        )
        .fetch_all(&mut *conn)
        .await
        .ctx("select cache candidates")?;
        rows.into_iter()
            .map(|r| {
                let path: String = r.get(0);
                let placement: Option<&str> = r.get(4);
                Ok(CacheCandidate {
                    cache_path: r.get(1),
                    kind: CacheKind::parse(r.get(2))?,
                    outcome: CacheOutcome::parse(r.get(3))?,
                    placement: placement.map(Placement::parse).transpose()?,
                    bytes: to_u64(&path, "cache_candidates.bytes", r.get(5))?,
                    detail: r.get(6),
                    path,
                })
            })
            .collect()
    }
}

/// Replaces the stored selection globs by `globs`, in command-line order
/// (inside the caller's transaction).
async fn replace_selection_globs(
    conn: &mut SqliteConnection,
    globs: &SelectionGlobs,
) -> Result<()> {
    sqlx::query("DELETE FROM selection_globs")
        .execute(&mut *conn)
        .await
        .ctx("clear selection globs")?;
    for (kind, list) in [("include", &globs.include), ("exclude", &globs.exclude)] {
        for (position, glob) in (0i64..).zip(list) {
            sqlx::query("INSERT INTO selection_globs (kind, position, glob) VALUES (?, ?, ?)")
                .bind(kind)
                .bind(position)
                .bind(glob)
                .execute(&mut *conn)
                .await
                .ctx("insert selection glob")?;
        }
    }
    Ok(())
}

/// Inserts or replaces the one pin row (inside the caller's transaction);
/// its endpoint is stored redacted.
async fn upsert_pin(conn: &mut SqliteConnection, pin: &Pin) -> Result<()> {
    sqlx::query(
        "INSERT INTO pin (id, repo, revision, commit_sha, endpoint) VALUES (1, ?, ?, ?, ?)
         ON CONFLICT(id) DO UPDATE SET repo = excluded.repo, revision = excluded.revision,
           commit_sha = excluded.commit_sha, endpoint = excluded.endpoint,
           pinned_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now')",
    )
    .bind(&pin.repo)
    .bind(&pin.revision)
    .bind(&pin.commit)
    .bind(redact(&pin.endpoint))
    .execute(&mut *conn)
    .await
    .ctx("upsert pin")?;
    Ok(())
}

/// Fills the temporary table `new_files` with the new listing, which the
/// statements of [`retire_changed_and_gone_files`] and
/// [`install_new_listing`] compare with `files`.
async fn stage_new_listing(conn: &mut SqliteConnection, files: &[FileRow]) -> Result<()> {
    sqlx::query("CREATE TEMP TABLE IF NOT EXISTS new_files (path TEXT PRIMARY KEY, size INTEGER, git_oid TEXT, lfs_sha256 TEXT, xet_hash TEXT, selected INTEGER)")
        .execute(&mut *conn)
        .await
        .ctx("temp table")?;
    sqlx::query("DELETE FROM new_files")
        .execute(&mut *conn)
        .await
        .ctx("clear temp")?;
    for f in files {
        sqlx::query("INSERT INTO new_files VALUES (?, ?, ?, ?, ?, ?)")
            .bind(&f.path)
            .bind(to_i64(&f.path, f.size)?)
            .bind(&f.git_oid)
            .bind(&f.lfs_sha256)
            .bind(&f.xet_hash)
            .bind(f.selected)
            .execute(&mut *conn)
            .await
            .ctx("insert temp file")?;
    }
    Ok(())
}

/// Resets the ledger rows of files whose identity changed and drops the
/// rows of files that left the listing, comparing `files` with
/// `new_files` (inside the caller's transaction).
async fn retire_changed_and_gone_files(conn: &mut SqliteConnection) -> Result<()> {
    // On a repin, a file whose identity changed keeps its ledger row
    // (its discards are append-only, so `transferred = committed +
    // discarded` must keep holding): the row is reset to zero and its
    // committed bytes become a `superseded_by_repin` discard. That
    // discard (written even for 0 bytes when the file had a receipt)
    // tells reconcile the old final file is ours to replace. Only files
    // that left the listing lose their ledger row.
    macro_rules! changed {
        () => {
            "SELECT f.path FROM files f JOIN new_files n ON n.path = f.path
             WHERE n.size IS NOT f.size OR n.git_oid IS NOT f.git_oid
               OR n.lfs_sha256 IS NOT f.lfs_sha256"
        };
    }
    macro_rules! gone {
        () => {
            "SELECT f.path FROM files f LEFT JOIN new_files n ON n.path = f.path
             WHERE n.path IS NULL"
        };
    }
    // The old pin's `.part` geometry is kept for the next open (see
    // migration 0006) before the ledger reset ends the ranges; a file
    // repinned again before that keeps the oldest, which is on disk.
    for sql in [
        concat!(
            "INSERT OR IGNORE INTO superseded_parts (path, start, end_, watermark)
             SELECT path, start, end_, watermark FROM fetch_ranges WHERE path IN (",
            changed!(),
            ")"
        ),
        concat!(
            "INSERT OR IGNORE INTO superseded_parts (path, start, end_, watermark)
             SELECT l.path, 0, l.expected_bytes, l.committed_bytes FROM ledger l
             WHERE l.path IN (",
            changed!(),
            ") AND l.committed_bytes > 0 AND l.committed_bytes <= l.expected_bytes
               AND l.path NOT IN (SELECT path FROM receipts)
               AND NOT EXISTS (SELECT 1 FROM fetch_ranges r WHERE r.path = l.path)"
        ),
        concat!("DELETE FROM fetch_ranges WHERE path IN (", changed!(), ")"),
        concat!(
            "INSERT INTO discards (run_id, path, reason, bytes)
             SELECT (SELECT MAX(id) FROM runs), l.path, 'superseded_by_repin', l.committed_bytes
             FROM ledger l
             WHERE EXISTS (SELECT 1 FROM runs) AND l.path IN (",
            changed!(),
            ") AND (l.committed_bytes > 0 OR l.path IN (SELECT path FROM receipts))"
        ),
        concat!(
            "UPDATE ledger SET committed_bytes = 0, adopted_bytes = 0, validator = NULL,
               expected_bytes = (SELECT n.size FROM new_files n WHERE n.path = ledger.path)
             WHERE path IN (",
            changed!(),
            ")"
        ),
        concat!("DELETE FROM receipts WHERE path IN (", changed!(), ")"),
        concat!("DELETE FROM receipts WHERE path IN (", gone!(), ")"),
        concat!("DELETE FROM superseded_parts WHERE path IN (", gone!(), ")"),
        concat!("DELETE FROM ledger WHERE path IN (", gone!(), ")"),
        concat!("DELETE FROM files WHERE path IN (", gone!(), ")"),
    ] {
        sqlx::query(sql)
            .execute(&mut *conn)
            .await
            .ctx("drop stale rows")?;
    }
    Ok(())
}

/// Writes `new_files` over `files` and creates the ledger rows of newly
/// selected files (inside the caller's transaction).
async fn install_new_listing(conn: &mut SqliteConnection) -> Result<()> {
    sqlx::query(
        "INSERT INTO files (path, size, git_oid, lfs_sha256, xet_hash, selected)
         SELECT path, size, git_oid, lfs_sha256, xet_hash, selected FROM new_files WHERE true
         ON CONFLICT(path) DO UPDATE SET size = excluded.size, git_oid = excluded.git_oid,
           lfs_sha256 = excluded.lfs_sha256, selected = excluded.selected,
           xet_hash = excluded.xet_hash",
    )
    .execute(&mut *conn)
    .await
    .ctx("upsert files")?;
    sqlx::query(
        "INSERT OR IGNORE INTO ledger (path, expected_bytes)
         SELECT path, size FROM files WHERE selected = 1",
    )
    .execute(&mut *conn)
    .await
    .ctx("create ledger rows")?;
    Ok(())
}

async fn insert_candidate(
    tx: &mut sqlx::Transaction<'_, sqlx::Sqlite>,
    run: RunId,
    c: &CacheCandidate,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO cache_candidates (run_id, path, cache_path, kind, outcome, placement, bytes, detail)
         VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(run)
    .bind(&c.path)
    .bind(&c.cache_path)
    .bind(c.kind.as_str())
    .bind(c.outcome.as_str())
    .bind(c.placement.map(Placement::as_str))
    .bind(to_i64(&c.path, c.bytes)?)
    .bind(redact(&c.detail))
    .execute(&mut **tx)
    .await
    .ctx("insert cache candidate")?;
    Ok(())
}

/// A state database at `db` migrated to `version` only, holding the rows
/// `sql` writes (for the tests of a later migration).
#[cfg(test)]
pub(crate) async fn database_at_migration(db: &std::path::Path, version: i64, sql: &'static str) {
    let options = SqliteConnectOptions::new()
        .filename(db)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Full)
        .foreign_keys(true);
    let mut conn = SqliteConnection::connect_with(&options).await.unwrap();
    MIGRATOR.run_to(version, &mut conn).await.unwrap();
    sqlx::raw_sql(sql).execute(&mut conn).await.unwrap();
}

#[cfg(test)]
mod tests {
    //! Regression: after a power cut between lowering a watermark (with its
    //! discard) and the durable truncation of the `.part`, the next run found
    //! the same excess past the watermark again, counted it as received
    //! bytes a second time and attributed it to no attempt, so the ledger
    //! claimed more transferred bytes than its attempts received (the
    //! power-cut test's seeded cache prefix: 35,538 bytes).

    use super::*;

    const PATH: &str = "model.safetensors";

    async fn store_with_one_file(dir: &Path) -> (Store, RunId) {
        let store = Store::open(&dir.join("state.db")).await.unwrap();
        let run = store.begin_run("test", "0").await.unwrap();
        let pin = Pin {
            repo: "acme/tiny".into(),
            revision: "main".into(),
            commit: "a".repeat(40),
            endpoint: "http://127.0.0.1".into(),
        };
        let file = FileRow {
            path: PATH.into(),
            size: 1000,
            git_oid: "b".repeat(40),
            lfs_sha256: Some("c".repeat(64)),
            xet_hash: None,
            selected: true,
        };
        store.save_pin(&pin, &[file]).await.unwrap();
        (store, run)
    }

    fn attempt() -> Attempt {
        Attempt {
            id: 0,
            path: PATH.into(),
            host: "127.0.0.1".into(),
            range_start: None,
            if_range: None,
            status: None,
            content_range: None,
            etag: None,
            body_bytes: 0,
            outcome: AttemptOutcome::InFlight,
            error: None,
            started_at: String::new(),
        }
    }

    /// Σ attempt bytes of `PATH`.
    async fn attempt_sum(store: &Store) -> u64 {
        store
            .attempt_bytes()
            .await
            .unwrap()
            .get(PATH)
            .copied()
            .unwrap_or(0)
    }

    /// A crash's tail in a range: the kept bytes move the watermark and
    /// count as received, the rest is discarded and counted too, both for
    /// the attempt, which is then measured (not found again); a watermark
    /// that moved meanwhile is refused and changes nothing.
    #[tokio::test]
    async fn a_settled_crash_tail_is_counted_once_for_its_attempt() {
        use crate::ranges::CrashTail;
        let dir = tempfile::tempdir().unwrap();
        let (store, run) = store_with_one_file(dir.path()).await;
        store.begin_ranges(PATH).await.unwrap();
        let id = store.start_attempt(run, &attempt()).await.unwrap();
        assert_eq!(
            store.in_flight_attempt(PATH, 0, 1000).await.unwrap(),
            Some(id)
        );
        let stale = CrashTail {
            watermark: 10,
            kept: 300,
            rest: 50,
        };
        assert!(
            store
                .settle_crash_tail(run, PATH, 0, stale, DiscardReason::UncheckpointedTail, id)
                .await
                .is_err()
        );
        let tail = CrashTail {
            watermark: 0,
            kept: 300,
            rest: 50,
        };
        store
            .settle_crash_tail(run, PATH, 0, tail, DiscardReason::UncheckpointedTail, id)
            .await
            .unwrap();
        let l = store.ledger_row(PATH).await.unwrap();
        assert_eq!((l.committed, l.transferred, l.discarded), (300, 350, 50));
        assert_eq!(attempt_sum(&store).await, 350);
        assert_eq!(store.ranges(PATH).await.unwrap()[0].watermark, 300);
        assert_eq!(store.in_flight_attempt(PATH, 0, 1000).await.unwrap(), None);
    }

    /// A stream's proven tail is claimed for the newest attempt in flight
    /// whose tail was not measured, which is then measured; with none, or
    /// a watermark that moved, nothing changes. Once a part is settled,
    /// `measure_stream_tails` leaves no attempt to claim for.
    #[tokio::test]
    async fn a_streams_tail_is_claimed_only_for_an_unmeasured_attempt() {
        let dir = tempfile::tempdir().unwrap();
        let (store, run) = store_with_one_file(dir.path()).await;
        assert!(!store.claim_stream_tail(PATH, 0, 100).await.unwrap());
        store.start_attempt(run, &attempt()).await.unwrap();
        assert!(!store.claim_stream_tail(PATH, 5, 100).await.unwrap());
        assert_eq!(store.ledger_row(PATH).await.unwrap().committed, 0);
        assert!(store.claim_stream_tail(PATH, 0, 100).await.unwrap());
        let l = store.ledger_row(PATH).await.unwrap();
        assert_eq!((l.committed, l.transferred), (100, 100));
        assert_eq!(attempt_sum(&store).await, 100);
        // Measured by the claim: the next tail is not its to claim.
        assert!(!store.claim_stream_tail(PATH, 100, 100).await.unwrap());
        store.start_attempt(run, &attempt()).await.unwrap();
        store.measure_stream_tails(PATH).await.unwrap();
        assert!(!store.claim_stream_tail(PATH, 100, 100).await.unwrap());
        assert_eq!(store.ledger_row(PATH).await.unwrap().committed, 100);
    }

    /// The selection globs are stored with the pin and replaced, not
    /// appended to, by the next pin.
    #[tokio::test]
    async fn selection_globs_are_replaced_with_the_pin() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = store_with_one_file(dir.path()).await;
        assert_eq!(
            store.selection_globs().await.unwrap(),
            SelectionGlobs::default()
        );
        let pin = store.pin().await.unwrap().unwrap();
        let files = store.files().await.unwrap();
        let globs = SelectionGlobs {
            include: vec!["*.json".into(), "*.safetensors".into()],
            exclude: vec!["model-vision*".into()],
        };
        store.save_pin_selected(&pin, &files, &globs).await.unwrap();
        assert_eq!(store.selection_globs().await.unwrap(), globs);
        let fewer = SelectionGlobs {
            include: vec![],
            exclude: vec!["mtp*".into()],
        };
        store.save_pin_selected(&pin, &files, &fewer).await.unwrap();
        assert_eq!(store.selection_globs().await.unwrap(), fewer);
    }

    #[tokio::test]
    async fn a_tail_no_attempt_owns_is_not_counted_as_received() {
        let dir = tempfile::tempdir().unwrap();
        let (store, run) = store_with_one_file(dir.path()).await;
        store
            .discard(run, PATH, DiscardReason::UncheckpointedTail, 40, 0, true)
            .await
            .unwrap();
        let row = store.ledger_row(PATH).await.unwrap();
        assert_eq!((row.transferred, row.discarded), (0, 0), "{row:?}");
        assert!(store.discards().await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_tail_of_an_attempt_in_flight_is_counted_once_for_it() {
        let dir = tempfile::tempdir().unwrap();
        let (store, run) = store_with_one_file(dir.path()).await;
        let id = store.start_attempt(run, &attempt()).await.unwrap();
        store
            .checkpoint(PATH, 100, 100, None, Some(id))
            .await
            .unwrap();
        store
            .discard(run, PATH, DiscardReason::UncheckpointedTail, 40, 100, true)
            .await
            .unwrap();
        let row = store.ledger_row(PATH).await.unwrap();
        assert_eq!(
            (row.committed, row.transferred, row.discarded),
            (100, 140, 40)
        );
        let bytes = store.attempt_bytes().await.unwrap();
        assert_eq!(bytes.get(PATH), Some(&140), "Σ attempt bytes = transferred");
    }

    /// Guards migration 0008: a database written before it (attempts and
    /// discards without CHECKs, every outcome and reason an older version
    /// could write, including the retired `stale_part`) migrates with its
    /// rows and ids intact, reads back typed, and refuses an unknown name
    /// afterwards.
    #[tokio::test]
    async fn a_database_from_before_typed_records_migrates_and_reads_typed() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("state.db");
        database_at_migration(
            &db,
            7,
            "INSERT INTO runs (command, pid, ftpipe_version) VALUES ('fetch', 1, '0.0');
                 INSERT INTO attempts (run_id, path, host, outcome, body_bytes, tail_measured)
                 VALUES (1, 'a', 'h', 'in_flight', 5, 1), (1, 'a', 'h', 'ok', 6, 0),
                        (1, 'a', 'h', 'retry', 0, 0), (1, 'a', 'h', 'failed', 0, 0),
                        (1, 'a', 'h', 'cancelled', 0, 0);
                 INSERT INTO discards (run_id, path, reason, bytes)
                 VALUES (1, 'a', 'stale_part', 7), (1, 'a', 'uncheckpointed_tail', 8),
                        (1, 'a', 'superseded_by_repin', 9);",
        )
        .await;
        let store = Store::open(&db).await.unwrap();
        let attempts = store.attempts().await.unwrap();
        let outcomes: Vec<_> = attempts.iter().map(|a| (a.id, a.outcome)).collect();
        assert_eq!(
            outcomes,
            [
                (1, AttemptOutcome::InFlight),
                (2, AttemptOutcome::Ok),
                (3, AttemptOutcome::Retry),
                (4, AttemptOutcome::Failed),
                (5, AttemptOutcome::Cancelled),
            ]
        );
        assert_eq!(attempts[1].body_bytes, 6);
        let discards: Vec<_> = store
            .discards()
            .await
            .unwrap()
            .into_iter()
            .map(|d| (d.reason, d.bytes))
            .collect();
        assert_eq!(
            discards,
            [
                (DiscardReason::StalePart, 7),
                (DiscardReason::UncheckpointedTail, 8),
                (DiscardReason::SupersededByRepin, 9),
            ]
        );
        // The tail mark came along; ids go on after the copied ones.
        assert_eq!(store.in_flight_attempt("a", 0, 100).await.unwrap(), None);
        let run = store.begin_run("test", "0").await.unwrap();
        let mut a = attempt();
        a.path = "a".into();
        assert_eq!(store.start_attempt(run, &a).await.unwrap(), 6);
        // The CHECKs hold now.
        let mut conn = store.conn.lock().await;
        for sql in [
            "INSERT INTO attempts (run_id, path, host, outcome) VALUES (1, 'a', 'h', 'done')",
            "INSERT INTO discards (run_id, path, reason, bytes) VALUES (1, 'a', 'range_ignored', 1)",
        ] {
            let err = sqlx::query(sql).execute(&mut *conn).await.unwrap_err();
            assert!(err.to_string().contains("CHECK"), "{sql}: {err}");
        }
        drop(conn);
        store.integrity_check().await.unwrap();
    }

    /// Migration 0013: a database whose stage events were written before
    /// their CHECKs keeps every row with its id, and the database itself
    /// then refuses a stage or an event `Stage` / `StageEvent` do not name.
    #[tokio::test]
    async fn stage_events_keep_their_rows_and_refuse_unknown_names() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("state.db");
        database_at_migration(
            &db,
            11,
            "INSERT INTO runs (command, pid, ftpipe_version) VALUES ('run', 1, '0.0');
                 INSERT INTO stage_events (run_id, stage, event, detail)
                 VALUES (1, 'resolve', 'started', ''), (1, 'resolve', 'completed', 'pinned'),
                        (1, 'fetch', 'started', ''), (1, 'fetch', 'failed', 'no space');",
        )
        .await;
        let store = Store::open(&db).await.unwrap();
        let rows: Vec<_> = store
            .stage_events()
            .await
            .unwrap()
            .into_iter()
            .map(|e| (e.id, e.stage, e.event, e.detail))
            .collect();
        assert_eq!(
            rows,
            [
                (1, Stage::Resolve, StageEvent::Started, String::new()),
                (2, Stage::Resolve, StageEvent::Completed, "pinned".into()),
                (3, Stage::Fetch, StageEvent::Started, String::new()),
                (4, Stage::Fetch, StageEvent::Failed, "no space".into()),
            ]
        );
        let run = store.begin_run("test", "0").await.unwrap();
        store
            .append_stage_event(run, Stage::Verify, StageEvent::Started, "")
            .await
            .unwrap();
        assert_eq!(store.stage_events().await.unwrap()[4].id, 5);
        let mut conn = store.conn.lock().await;
        for sql in [
            "INSERT INTO stage_events (run_id, stage, event) VALUES (1, 'publish', 'started')",
            "INSERT INTO stage_events (run_id, stage, event) VALUES (1, 'Fetch', 'started')",
            "INSERT INTO stage_events (run_id, stage, event) VALUES (1, 'fetch', 'done')",
        ] {
            let err = sqlx::query(sql).execute(&mut *conn).await.unwrap_err();
            assert!(err.to_string().contains("CHECK"), "{sql}: {err}");
        }
        drop(conn);
        assert_eq!(store.stage_events().await.unwrap().len(), 5);
        store.integrity_check().await.unwrap();
    }

    /// The same file under a new identity (a repin that changed it).
    async fn repin_changed(store: &Store) {
        let pin = Pin {
            repo: "acme/tiny".into(),
            revision: "main".into(),
            commit: "d".repeat(40),
            endpoint: "http://127.0.0.1".into(),
        };
        let file = FileRow {
            path: PATH.into(),
            size: 1000,
            git_oid: "e".repeat(40),
            lfs_sha256: Some("f".repeat(64)),
            xet_hash: None,
            selected: true,
        };
        store.save_pin(&pin, &[file]).await.unwrap();
    }

    /// Claims are made in memory and committed by their workers, in any
    /// order: a piece `[0, 256)` claimed first and its follower `[256,
    /// 512)` claimed next leave the same durable ranges whichever commits
    /// first, and a boundary that is already a range start is kept.
    #[tokio::test]
    async fn claims_commit_in_any_order_to_the_same_ranges() {
        let mut geometries = Vec::new();
        for order in [[0, 1], [1, 0]] {
            let dir = tempfile::tempdir().unwrap();
            let (store, run) = store_with_one_file(dir.path()).await;
            store.begin_ranges(PATH).await.unwrap();
            let claims: [&[u64]; 2] = [&[256], &[512]];
            for i in order {
                let mut a = attempt();
                a.range_start = Some([0, 256][i]);
                let id = store
                    .claim_range(run, PATH, claims[i], Some("\"v\""), &a)
                    .await
                    .unwrap();
                assert!(id > 0);
            }
            // Claiming an existing start again changes nothing.
            store
                .claim_range(run, PATH, &[256], Some("\"v\""), &attempt())
                .await
                .unwrap();
            let ranges = store.ranges(PATH).await.unwrap();
            geometries.push(
                ranges
                    .iter()
                    .map(|r| (r.start, r.end, r.watermark))
                    .collect::<Vec<_>>(),
            );
        }
        assert_eq!(
            geometries[0],
            [(0, 256, 0), (256, 512, 256), (512, 1000, 512)]
        );
        assert_eq!(geometries[0], geometries[1]);
    }

    /// A boundary at or below the durable watermark of the range holding
    /// it would claim durable bytes for a new range: refused, and the
    /// attempt is not recorded either.
    #[tokio::test]
    async fn a_claim_below_a_watermark_is_refused_whole() {
        let dir = tempfile::tempdir().unwrap();
        let (store, run) = store_with_one_file(dir.path()).await;
        store.begin_ranges(PATH).await.unwrap();
        let progress = [crate::RangeProgress {
            start: 0,
            watermark: 300,
            attempt: None,
            received: 300,
        }];
        store
            .checkpoint_ranges(PATH, &progress, Some("\"v\""))
            .await
            .unwrap();
        let err = store
            .claim_range(run, PATH, &[256], Some("\"v\""), &attempt())
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::BadRange { at: 256, .. }), "{err}");
        let ranges = store.ranges(PATH).await.unwrap();
        assert_eq!(ranges.len(), 1);
        assert!(store.attempts().await.unwrap().is_empty());
    }

    /// Regression: a repin ended a changed file's ranges and kept nothing
    /// of them, so the next open took the old pin's sparse `.part` for one
    /// stream and counted its whole length as a tail. The repin now keeps
    /// the old ranges (or a stream's watermark) in `superseded_parts`.
    #[tokio::test]
    async fn a_repin_keeps_the_old_parts_geometry() {
        let dir = tempfile::tempdir().unwrap();
        let (store, run) = store_with_one_file(dir.path()).await;
        store.begin_ranges(PATH).await.unwrap();
        store
            .claim_range(run, PATH, &[512], Some("\"v\""), &attempt())
            .await
            .unwrap();
        let progress = [
            crate::RangeProgress {
                start: 0,
                watermark: 100,
                attempt: None,
                received: 100,
            },
            crate::RangeProgress {
                start: 512,
                watermark: 600,
                attempt: None,
                received: 88,
            },
        ];
        store
            .checkpoint_ranges(PATH, &progress, Some("\"v\""))
            .await
            .unwrap();
        repin_changed(&store).await;
        let old = store.superseded_part(PATH).await.unwrap();
        let geometry: Vec<_> = old.iter().map(|r| (r.start, r.end, r.watermark)).collect();
        assert_eq!(geometry, [(0, 512, 100), (512, 1000, 600)]);
        assert!(store.ranges(PATH).await.unwrap().is_empty());
        let row = store.ledger_row(PATH).await.unwrap();
        assert_eq!(
            (row.committed, row.transferred, row.discarded),
            (0, 188, 188)
        );
        // Repinned again before any fetch: the oldest geometry, on disk, stays.
        repin_changed(&store).await;
        assert_eq!(store.superseded_part(PATH).await.unwrap(), old);
        store.end_superseded_part(PATH).await.unwrap();
        assert!(store.superseded_part(PATH).await.unwrap().is_empty());

        // A stream's watermark is kept as one range.
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = store_with_one_file(dir.path()).await;
        store.checkpoint(PATH, 300, 300, None, None).await.unwrap();
        repin_changed(&store).await;
        let old = store.superseded_part(PATH).await.unwrap();
        let geometry: Vec<_> = old.iter().map(|r| (r.start, r.end, r.watermark)).collect();
        assert_eq!(geometry, [(0, 1000, 300)]);
    }
}
