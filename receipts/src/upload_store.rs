//! Publish records: uploads to an output target (the upload receipt is a
//! `verified` row), the acknowledged parts of multipart sessions, every
//! request made, and publications. Target-neutral since migration 0012: a
//! session handle, part receipts and version tags are whatever the target
//! answered (S3: upload id, part ETags, object ETag), stored as text.
//!
//! The rule of the download ledger, turned around: a part's row is written
//! only after the target acknowledged the part, so the rows never claim a
//! byte the target does not hold; a kill between the answer and the row
//! costs that part's bytes once more, never a wrong part. Ops, outcomes and
//! states are the typed enums of `events`; a stored name this version does
//! not know is an error, never a default.

use serde::Serialize;
use sqlx::{Connection, Row};

use crate::error::{QueryContext, Result};
use crate::events::{FoundObject, PublicationOutcome, RunId, UploadOp, UploadOutcome, UploadState};
use crate::store::{Store, clean as stored_text, to_i64, to_u64};

/// One upload of one file to one object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UploadRow {
    /// Database id.
    pub id: i64,
    /// The run that started it.
    pub run_id: RunId,
    /// The destination published to, as its target names it
    /// (`s3://BUCKET/PREFIX`).
    pub dest: String,
    /// The object, as its target names it (`s3://BUCKET/KEY`).
    pub key: String,
    /// The artifact-relative path of the file.
    pub path: String,
    /// Its size.
    pub size: u64,
    /// Its SHA-256 (the manifest's).
    pub sha256: String,
    /// Part size of a multipart upload (0: one put).
    pub part_size: u64,
    /// The target's handle of the multipart session (S3: the upload id),
    /// stored redacted like every server string (a handle holding a
    /// credential no longer matches: the target answers that it does not
    /// know it, and a new session starts).
    pub session: Option<String>,
    /// Where it stands.
    pub state: UploadState,
    /// The object's version tag once verified (S3: its ETag).
    pub version: Option<String>,
    /// What the head before it found at the key: an object reused (its
    /// store checksum proved its bytes), or why none was (`None`: written
    /// before migration 0015, when this was not recorded).
    pub found: Option<FoundObject>,
    /// The repository a registry mounted the blob from (migration 0021):
    /// nothing was sent. `None` when bytes were sent or reused in place.
    pub mounted_from: Option<String>,
    /// When it started.
    pub started_at: String,
    /// When it was verified or abandoned.
    pub finished_at: Option<String>,
}

/// A part the target acknowledged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UploadPart {
    /// 1-based part number.
    pub part_number: u64,
    /// The target's acknowledgement, what completing the session needs
    /// (S3: the part's ETag with its SHA-256 checksum).
    pub receipt: String,
    /// Its size.
    pub size: u64,
}

/// One request of a publish.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UploadAttempt {
    /// Database id (0 until inserted).
    pub id: i64,
    /// The object, as its target names it (`s3://BUCKET/KEY`).
    pub key: String,
    /// What was asked.
    pub op: UploadOp,
    /// The part, for `send_part`.
    pub part_number: Option<u64>,
    /// The target's host.
    pub host: String,
    /// Body bytes sent.
    pub bytes: u64,
    /// How it ended (`in_flight` until it does).
    pub outcome: UploadOutcome,
    /// Why it failed.
    pub error: Option<String>,
    /// When it started.
    pub started_at: String,
}

/// One publication (a manifest put, or found already there).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Publication {
    /// The run.
    pub run_id: RunId,
    /// The destination, as its target names it (`s3://BUCKET/PREFIX`).
    pub dest: String,
    /// The artifact's fingerprint (a mirror: the pinned commit).
    pub fingerprint: String,
    /// SHA-256 of the manifest's (a mirror: the listing's) bytes.
    pub manifest_sha256: String,
    /// What the commit point held.
    pub outcome: PublicationOutcome,
    /// When.
    pub at: String,
}

/// The columns [`upload_row`] reads, in its order.
macro_rules! upload_columns {
    () => {
        "id, run_id, dest, key, path, size, sha256, part_size, session, state, version, started_at, finished_at, found, mounted_from"
    };
}

fn upload_row(r: &sqlx::sqlite::SqliteRow) -> Result<UploadRow> {
    let key: String = r.get(3);
    Ok(UploadRow {
        id: r.get(0),
        run_id: r.get(1),
        dest: r.get(2),
        path: r.get(4),
        size: to_u64(&key, "uploads.size", r.get(5))?,
        sha256: r.get(6),
        part_size: to_u64(&key, "uploads.part_size", r.get(7))?,
        session: r.get(8),
        state: UploadState::parse(&r.get::<String, _>(9))?,
        version: r.get(10),
        started_at: r.get(11),
        finished_at: r.get(12),
        found: r
            .get::<Option<String>, _>(13)
            .as_deref()
            .map(FoundObject::parse)
            .transpose()?,
        mounted_from: r.get(14),
        key,
    })
}

impl Store {
    /// Records a multipart upload the server created (before any part is
    /// sent).
    pub async fn begin_upload(&self, run: RunId, u: &UploadRow) -> Result<i64> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.ctx("begin")?;
        let id = sqlx::query(
            "INSERT INTO uploads (run_id, dest, key, path, size, sha256, part_size, session, state, found)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(run)
        .bind(&u.dest)
        .bind(&u.key)
        .bind(&u.path)
        .bind(to_i64(&u.key, u.size)?)
        .bind(&u.sha256)
        .bind(to_i64(&u.key, u.part_size)?)
        .bind(stored_text(u.session.as_deref()))
        .bind(UploadState::Uploading.as_str())
        .bind(u.found.map(FoundObject::as_str))
        .execute(&mut *tx)
        .await
        .ctx("insert upload")?
        .last_insert_rowid();
        tx.commit().await.ctx("commit upload")?;
        Ok(id)
    }

    /// The upload of `key` to `dest` in progress, if any.
    pub async fn upload_in_progress(&self, dest: &str, key: &str) -> Result<Option<UploadRow>> {
        let mut conn = self.conn.lock().await;
        let row = sqlx::query(concat!(
            "SELECT ",
            upload_columns!(),
            " FROM uploads WHERE dest = ? AND key = ? AND state = ?"
        ))
        .bind(dest)
        .bind(key)
        .bind(UploadState::Uploading.as_str())
        .fetch_optional(&mut *conn)
        .await
        .ctx("select upload in progress")?;
        row.as_ref().map(upload_row).transpose()
    }

    /// The parts of upload `upload` the target acknowledged, by number.
    pub async fn upload_parts(&self, upload: i64) -> Result<Vec<UploadPart>> {
        let mut conn = self.conn.lock().await;
        let rows = sqlx::query(
            "SELECT part_number, receipt, size FROM upload_parts WHERE upload = ? ORDER BY part_number",
        )
        .bind(upload)
        .fetch_all(&mut *conn)
        .await
        .ctx("select upload parts")?;
        rows.iter()
            .map(|r| {
                Ok(UploadPart {
                    part_number: to_u64("upload part", "upload_parts.part_number", r.get(0))?,
                    receipt: r.get(1),
                    size: to_u64("upload part", "upload_parts.size", r.get(2))?,
                })
            })
            .collect()
    }

    /// Claims a part the target acknowledged (a re-sent part replaces its
    /// row, as the target replaces the part).
    pub async fn record_part(&self, run: RunId, upload: i64, part: &UploadPart) -> Result<()> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.ctx("begin")?;
        sqlx::query(
            "INSERT INTO upload_parts (upload, part_number, receipt, size, run_id) VALUES (?, ?, ?, ?, ?)
             ON CONFLICT(upload, part_number) DO UPDATE SET receipt = excluded.receipt,
               size = excluded.size, run_id = excluded.run_id,
               at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now')",
        )
        .bind(upload)
        .bind(to_i64("upload part", part.part_number)?)
        .bind(stored_text(Some(&part.receipt)))
        .bind(to_i64("upload part", part.size)?)
        .bind(run)
        .execute(&mut *tx)
        .await
        .ctx("insert upload part")?;
        tx.commit().await.ctx("commit upload part")
    }

    /// Ends upload `upload` as verified (with the object's version tag) or
    /// abandoned.
    pub async fn finish_upload(
        &self,
        upload: i64,
        state: UploadState,
        version: Option<&str>,
    ) -> Result<()> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.ctx("begin")?;
        sqlx::query(
            "UPDATE uploads SET state = ?, version = ?, finished_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now')
             WHERE id = ?",
        )
        .bind(state.as_str())
        .bind(stored_text(version))
        .bind(upload)
        .execute(&mut *tx)
        .await
        .ctx("finish upload")?;
        tx.commit().await.ctx("commit finished upload")
    }

    /// Ends upload `upload` (a session in progress) as verified by an
    /// object found complete at its key, whose store checksum proved its
    /// bytes: nothing more is sent.
    pub async fn finish_upload_reused(&self, upload: i64, version: Option<&str>) -> Result<()> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.ctx("begin")?;
        sqlx::query(
            "UPDATE uploads SET state = ?, version = ?, found = ?,
               finished_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now')
             WHERE id = ?",
        )
        .bind(UploadState::Verified.as_str())
        .bind(stored_text(version))
        .bind(FoundObject::Proven.as_str())
        .bind(upload)
        .execute(&mut *tx)
        .await
        .ctx("finish reused upload")?;
        tx.commit().await.ctx("commit reused upload")
    }

    /// Records an object verified without a multipart upload in progress
    /// (one put, or an object found complete and checked): its receipt.
    pub async fn put_verified_upload(&self, run: RunId, u: &UploadRow) -> Result<()> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.ctx("begin")?;
        sqlx::query(
            "INSERT INTO uploads (run_id, dest, key, path, size, sha256, part_size, session, state, version, found, mounted_from, finished_at)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))",
        )
        .bind(run)
        .bind(&u.dest)
        .bind(&u.key)
        .bind(&u.path)
        .bind(to_i64(&u.key, u.size)?)
        .bind(&u.sha256)
        .bind(to_i64(&u.key, u.part_size)?)
        .bind(stored_text(u.session.as_deref()))
        .bind(UploadState::Verified.as_str())
        .bind(stored_text(u.version.as_deref()))
        .bind(u.found.map(FoundObject::as_str))
        .bind(u.mounted_from.as_deref())
        .execute(&mut *tx)
        .await
        .ctx("insert verified upload")?;
        tx.commit().await.ctx("commit verified upload")
    }

    /// Every upload, oldest first.
    pub async fn uploads(&self) -> Result<Vec<UploadRow>> {
        let mut conn = self.conn.lock().await;
        let rows = sqlx::query(concat!(
            "SELECT ",
            upload_columns!(),
            " FROM uploads ORDER BY id"
        ))
        .fetch_all(&mut *conn)
        .await
        .ctx("select uploads")?;
        rows.iter().map(upload_row).collect()
    }

    /// Appends a request about to be made (`in_flight`); its id.
    pub async fn start_upload_attempt(&self, run: RunId, a: &UploadAttempt) -> Result<i64> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.ctx("begin")?;
        let id = sqlx::query(
            "INSERT INTO upload_attempts (run_id, key, op, part_number, host, bytes, outcome)
             VALUES (?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(run)
        .bind(&a.key)
        .bind(a.op.as_str())
        .bind(a.part_number.map(|n| to_i64(&a.key, n)).transpose()?)
        .bind(stored_text(Some(&a.host)))
        .bind(to_i64(&a.key, a.bytes)?)
        .bind(UploadOutcome::InFlight.as_str())
        .execute(&mut *tx)
        .await
        .ctx("insert upload attempt")?
        .last_insert_rowid();
        tx.commit().await.ctx("commit upload attempt")?;
        Ok(id)
    }

    /// Ends a request: `ok`, or `failed` with the error (redacted).
    pub async fn finish_upload_attempt(&self, id: i64, error: Option<&str>) -> Result<()> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.ctx("begin")?;
        sqlx::query(
            "UPDATE upload_attempts SET outcome = ?, error = ?,
               finished_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now') WHERE id = ?",
        )
        .bind(match error {
            Some(_) => UploadOutcome::Failed.as_str(),
            None => UploadOutcome::Ok.as_str(),
        })
        .bind(stored_text(error))
        .bind(id)
        .execute(&mut *tx)
        .await
        .ctx("finish upload attempt")?;
        tx.commit().await.ctx("commit upload attempt")
    }

    /// Every request of every publish, oldest first.
    pub async fn upload_attempts(&self) -> Result<Vec<UploadAttempt>> {
        let mut conn = self.conn.lock().await;
        let rows = sqlx::query(
            "SELECT id, key, op, part_number, host, bytes, outcome, error, started_at
             FROM upload_attempts ORDER BY id",
        )
        .fetch_all(&mut *conn)
        .await
        .ctx("select upload attempts")?;
        rows.iter()
            .map(|r| {
                let key: String = r.get(1);
                Ok(UploadAttempt {
                    id: r.get(0),
                    op: UploadOp::parse(&r.get::<String, _>(2))?,
                    part_number: r
                        .get::<Option<i64>, _>(3)
                        .map(|n| to_u64(&key, "upload_attempts.part_number", n))
                        .transpose()?,
                    host: r.get(4),
                    bytes: to_u64(&key, "upload_attempts.bytes", r.get(5))?,
                    outcome: UploadOutcome::parse(&r.get::<String, _>(6))?,
                    error: r.get(7),
                    started_at: r.get(8),
                    key,
                })
            })
            .collect()
    }

    /// Records a publication.
    pub async fn record_publication(&self, p: &Publication) -> Result<()> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.ctx("begin")?;
        sqlx::query(
            "INSERT INTO publications (run_id, dest, fingerprint, manifest_sha256, outcome)
             VALUES (?, ?, ?, ?, ?)",
        )
        .bind(p.run_id)
        .bind(&p.dest)
        .bind(&p.fingerprint)
        .bind(&p.manifest_sha256)
        .bind(p.outcome.as_str())
        .execute(&mut *tx)
        .await
        .ctx("insert publication")?;
        tx.commit().await.ctx("commit publication")
    }

    /// Every publication, oldest first.
    pub async fn publications(&self) -> Result<Vec<Publication>> {
        let mut conn = self.conn.lock().await;
        let rows = sqlx::query(
            "SELECT run_id, dest, fingerprint, manifest_sha256, outcome, at FROM publications ORDER BY id",
        )
        .fetch_all(&mut *conn)
        .await
        .ctx("select publications")?;
        rows.iter()
            .map(|r| {
                Ok(Publication {
                    run_id: r.get(0),
                    dest: r.get(1),
                    fingerprint: r.get(2),
                    manifest_sha256: r.get(3),
                    outcome: PublicationOutcome::parse(&r.get::<String, _>(4))?,
                    at: r.get(5),
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn parts_resume_and_receipts_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("state.db")).await.unwrap();
        let run = store.begin_run("publish", "test").await.unwrap();
        let u = UploadRow {
            id: 0,
            run_id: run,
            dest: "s3://b/p".into(),
            key: "s3://b/p/fp/a.ftw".into(),
            path: "a.ftw".into(),
            size: 10,
            sha256: "0".repeat(64),
            part_size: 5,
            session: Some("up-1".into()),
            state: UploadState::Uploading,
            version: None,
            found: Some(FoundObject::NoChecksum),
            mounted_from: None,
            started_at: String::new(),
            finished_at: None,
        };
        let id = store.begin_upload(run, &u).await.unwrap();
        // A second upload of the same object in progress is refused.
        assert!(store.begin_upload(run, &u).await.is_err());
        let part = UploadPart {
            part_number: 1,
            receipt: "\"e1\"".into(),
            size: 5,
        };
        store.record_part(run, id, &part).await.unwrap();
        store.record_part(run, id, &part).await.unwrap();
        let live = store
            .upload_in_progress("s3://b/p", &u.key)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(live.session.as_deref(), Some("up-1"));
        assert_eq!(live.found, Some(FoundObject::NoChecksum));
        assert_eq!(store.upload_parts(id).await.unwrap(), vec![part]);
        store
            .finish_upload(id, UploadState::Verified, Some("\"e-2\""))
            .await
            .unwrap();
        assert!(
            store
                .upload_in_progress("s3://b/p", &u.key)
                .await
                .unwrap()
                .is_none()
        );
        let all = store.uploads().await.unwrap();
        assert_eq!(all[0].state, UploadState::Verified);
        let a = store
            .start_upload_attempt(
                run,
                &UploadAttempt {
                    id: 0,
                    key: u.key.clone(),
                    op: UploadOp::SendPart,
                    part_number: Some(2),
                    host: "127.0.0.1:1".into(),
                    bytes: 5,
                    outcome: UploadOutcome::InFlight,
                    error: None,
                    started_at: String::new(),
                },
            )
            .await
            .unwrap();
        store.finish_upload_attempt(a, Some("boom")).await.unwrap();
        let attempts = store.upload_attempts().await.unwrap();
        assert_eq!(attempts[0].outcome, UploadOutcome::Failed);
        assert_eq!(attempts[0].op, UploadOp::SendPart);
    }

    /// Guards migration 0015: an upload row written before it keeps its
    /// row and reads back with `found` unknown (`None`, never a default
    /// reason); rows written after it carry what the head found, and a
    /// reason this version does not know is refused by the CHECK.
    #[tokio::test]
    async fn upload_rows_from_before_0015_read_back_with_found_unknown() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("state.db");
        crate::store::database_at_migration(&db, 13,
                "INSERT INTO runs (command, pid, ftpipe_version) VALUES ('publish', 1, '0.0');
                 INSERT INTO uploads (run_id, dest, key, path, size, sha256, part_size, state, version, finished_at)
                 VALUES (1, 's3://b/p', 's3://b/p/f/b', 'b', 3, 'y', 0, 'verified', '\"e-b\"', 'now');",
        )
        .await;
        let store = Store::open(&db).await.unwrap();
        let old = &store.uploads().await.unwrap()[0];
        assert_eq!((old.id, old.found), (1, None));
        let run = store.begin_run("publish", "test").await.unwrap();
        let reused = UploadRow {
            found: Some(FoundObject::Proven),
            id: 0,
            run_id: run,
            ..old.clone()
        };
        store.put_verified_upload(run, &reused).await.unwrap();
        assert_eq!(
            store.uploads().await.unwrap()[1].found,
            Some(FoundObject::Proven)
        );
        let mut conn = store.writer().await.unwrap();
        let refused = sqlx::query("UPDATE uploads SET found = 'trusted' WHERE id = 1")
            .execute(&mut *conn)
            .await;
        assert!(refused.is_err(), "an unknown reason was stored");
    }

    /// Guards migration 0012: upload records written before it (S3-shaped:
    /// upload ids, part ETags, the old op names) migrate with their rows and
    /// ids, read back under the target-neutral names and typed, and the new
    /// CHECKs hold afterwards (an unknown op, a part number on a request
    /// that is not a part, an unknown outcome are refused).
    #[tokio::test]
    async fn upload_records_from_before_0012_migrate_and_read_typed() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("state.db");
        crate::store::database_at_migration(&db, 11,
                "INSERT INTO runs (command, pid, ftpipe_version) VALUES ('publish', 1, '0.0');
                 INSERT INTO uploads (run_id, dest, key, path, size, sha256, part_size, upload_id, state)
                 VALUES (1, 's3://b/p', 's3://b/p/f/a', 'a', 10, 'x', 5, 'up-1', 'uploading');
                 INSERT INTO uploads (run_id, dest, key, path, size, sha256, part_size, state, etag, finished_at)
                 VALUES (1, 's3://b/p', 's3://b/p/f/b', 'b', 3, 'y', 0, 'verified', '\"e-b\"', 'now');
                 INSERT INTO upload_parts (upload, part_number, etag, size, run_id)
                 VALUES (1, 1, '\"e1\"', 5, 1), (1, 2, '\"e2\"', 5, 1);
                 INSERT INTO upload_attempts (run_id, key, op, part_number, host, bytes, outcome, error)
                 VALUES (1, 'k', 'head', NULL, 'h', 0, 'ok', NULL),
                        (1, 'k', 'create_multipart', NULL, 'h', 0, 'ok', NULL),
                        (1, 'k', 'upload_part', 2, 'h', 5, 'failed', 'boom'),
                        (1, 'k', 'complete', NULL, 'h', 0, 'in_flight', NULL),
                        (1, 'k', 'put', NULL, 'h', 3, 'ok', NULL),
                        (1, 'k', 'manifest_put', NULL, 'h', 9, 'ok', NULL);",
        )
        .await;
        let store = Store::open(&db).await.unwrap();
        let live = store
            .upload_in_progress("s3://b/p", "s3://b/p/f/a")
            .await
            .unwrap()
            .unwrap();
        assert_eq!((live.id, live.session.as_deref()), (1, Some("up-1")));
        let uploads = store.uploads().await.unwrap();
        assert_eq!(uploads[1].state, UploadState::Verified);
        assert_eq!(uploads[1].version.as_deref(), Some("\"e-b\""));
        let receipts: Vec<_> = store
            .upload_parts(1)
            .await
            .unwrap()
            .into_iter()
            .map(|p| (p.part_number, p.receipt))
            .collect();
        assert_eq!(receipts, [(1, "\"e1\"".into()), (2, "\"e2\"".into())]);
        let attempts: Vec<_> = store
            .upload_attempts()
            .await
            .unwrap()
            .into_iter()
            .map(|a| (a.id, a.op, a.part_number, a.outcome))
            .collect();
        assert_eq!(
            attempts,
            [
                (1, UploadOp::Head, None, UploadOutcome::Ok),
                (2, UploadOp::BeginUpload, None, UploadOutcome::Ok),
                (3, UploadOp::SendPart, Some(2), UploadOutcome::Failed),
                (4, UploadOp::CompleteUpload, None, UploadOutcome::InFlight),
                (5, UploadOp::Put, None, UploadOutcome::Ok),
                (6, UploadOp::PutCommit, None, UploadOutcome::Ok),
            ]
        );
        let mut conn = store.conn.lock().await;
        for sql in [
            "INSERT INTO upload_attempts (run_id, key, op, host, outcome) VALUES (1, 'k', 'upload_part', 'h', 'ok')",
            "INSERT INTO upload_attempts (run_id, key, op, part_number, host, outcome) VALUES (1, 'k', 'head', 1, 'h', 'ok')",
            "INSERT INTO upload_attempts (run_id, key, op, host, outcome) VALUES (1, 'k', 'head', 'h', 'retry')",
            "INSERT INTO upload_parts (upload, part_number, receipt, size, run_id) VALUES (1, 0, 'r', 1, 1)",
        ] {
            let err = sqlx::query(sql).execute(&mut *conn).await.unwrap_err();
            assert!(err.to_string().contains("CHECK"), "{sql}: {err}");
        }
        // Past S3's 10,000 parts: the target's limit, not the table's.
        sqlx::query(
            "INSERT INTO upload_parts (upload, part_number, receipt, size, run_id) VALUES (1, 10001, 'r', 1, 1)",
        )
        .execute(&mut *conn)
        .await
        .unwrap();
        drop(conn);
        store.integrity_check().await.unwrap();
    }
}
