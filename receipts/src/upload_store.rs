//! Publish records: uploads (the upload receipt is a `verified` row), the
//! parts of multipart uploads, every request made, and publications.
//!
//! The rule of the download ledger, turned around: a part's row is written
//! only after the server acknowledged the part with its ETag, so the rows
//! never claim a byte the server does not hold; a kill between the answer
//! and the row costs that part's bytes once more, never a wrong part.

use serde::Serialize;
use sqlx::{Connection, Row};

use crate::error::{QueryContext, Result};
use crate::events::RunId;
use crate::store::{Store, clean as stored_text, to_i64, to_u64};

/// Where an upload stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum UploadState {
    /// A multipart upload created on the server, parts being sent.
    Uploading,
    /// Completed and checked (size, SHA-256 metadata): the upload receipt.
    Verified,
    /// Given up (the server lost the upload id, or the file changed).
    Abandoned,
}

impl UploadState {
    fn as_str(self) -> &'static str {
        match self {
            UploadState::Uploading => "uploading",
            UploadState::Verified => "verified",
            UploadState::Abandoned => "abandoned",
        }
    }

    fn parse(s: &str) -> UploadState {
        match s {
            "uploading" => UploadState::Uploading,
            "verified" => UploadState::Verified,
            _ => UploadState::Abandoned,
        }
    }
}

/// One upload of one file to one object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UploadRow {
    /// Database id.
    pub id: i64,
    /// The run that started it.
    pub run_id: RunId,
    /// `s3://BUCKET/PREFIX` published to.
    pub dest: String,
    /// The object key (`s3://BUCKET/KEY`).
    pub key: String,
    /// The artifact-relative path of the file.
    pub path: String,
    /// Its size.
    pub size: u64,
    /// Its SHA-256 (the manifest's).
    pub sha256: String,
    /// Part size of a multipart upload (0: one put).
    pub part_size: u64,
    /// The multipart upload id, stored redacted like every server string
    /// (an id holding a credential no longer matches: the server answers
    /// that it does not know it, and a new upload starts).
    pub upload_id: Option<String>,
    /// Where it stands.
    pub state: UploadState,
    /// The object's ETag once verified.
    pub etag: Option<String>,
    /// When it started.
    pub started_at: String,
    /// When it was verified or abandoned.
    pub finished_at: Option<String>,
}

/// A part the server acknowledged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UploadPart {
    /// 1-based part number.
    pub part_number: u64,
    /// The ETag the server answered with.
    pub etag: String,
    /// Its size.
    pub size: u64,
}

/// One request of a publish.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UploadAttempt {
    /// Database id (0 until inserted).
    pub id: i64,
    /// The object key (`s3://BUCKET/KEY`).
    pub key: String,
    /// `put`, `create_multipart`, `upload_part`, `complete`, `head`,
    /// `manifest_put`.
    pub op: &'static str,
    /// The part, for `upload_part`.
    pub part_number: Option<u64>,
    /// The server's host.
    pub host: String,
    /// Body bytes sent.
    pub bytes: u64,
    /// `in_flight`, `ok`, `failed`.
    pub outcome: String,
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
    /// `s3://BUCKET/PREFIX`.
    pub dest: String,
    /// The artifact's fingerprint.
    pub fingerprint: String,
    /// SHA-256 of the manifest's bytes.
    pub manifest_sha256: String,
    /// `published` or `already_published`.
    pub outcome: String,
    /// When.
    pub at: String,
}

/// The columns [`upload_row`] reads, in its order.
macro_rules! upload_columns {
    () => {
        "id, run_id, dest, key, path, size, sha256, part_size, upload_id, state, etag, started_at, finished_at"
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
        upload_id: r.get(8),
        state: UploadState::parse(&r.get::<String, _>(9)),
        etag: r.get(10),
        started_at: r.get(11),
        finished_at: r.get(12),
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
            "INSERT INTO uploads (run_id, dest, key, path, size, sha256, part_size, upload_id, state)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'uploading')",
        )
        .bind(run)
        .bind(&u.dest)
        .bind(&u.key)
        .bind(&u.path)
        .bind(to_i64(&u.key, u.size)?)
        .bind(&u.sha256)
        .bind(to_i64(&u.key, u.part_size)?)
        .bind(stored_text(u.upload_id.as_deref()))
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
            " FROM uploads WHERE dest = ? AND key = ? AND state = 'uploading'"
        ))
        .bind(dest)
        .bind(key)
        .fetch_optional(&mut *conn)
        .await
        .ctx("select upload in progress")?;
        row.as_ref().map(upload_row).transpose()
    }

    /// The parts of upload `upload` the server acknowledged, by number.
    pub async fn upload_parts(&self, upload: i64) -> Result<Vec<UploadPart>> {
        let mut conn = self.conn.lock().await;
        let rows = sqlx::query(
            "SELECT part_number, etag, size FROM upload_parts WHERE upload = ? ORDER BY part_number",
        )
        .bind(upload)
        .fetch_all(&mut *conn)
        .await
        .ctx("select upload parts")?;
        rows.iter()
            .map(|r| {
                Ok(UploadPart {
                    part_number: to_u64("upload part", "upload_parts.part_number", r.get(0))?,
                    etag: r.get(1),
                    size: to_u64("upload part", "upload_parts.size", r.get(2))?,
                })
            })
            .collect()
    }

    /// Claims a part the server acknowledged (a re-sent part replaces its
    /// row, as the server replaces the part).
    pub async fn record_part(&self, run: RunId, upload: i64, part: &UploadPart) -> Result<()> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.ctx("begin")?;
        sqlx::query(
            "INSERT INTO upload_parts (upload, part_number, etag, size, run_id) VALUES (?, ?, ?, ?, ?)
             ON CONFLICT(upload, part_number) DO UPDATE SET etag = excluded.etag,
               size = excluded.size, run_id = excluded.run_id,
               at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now')",
        )
        .bind(upload)
        .bind(to_i64("upload part", part.part_number)?)
        .bind(stored_text(Some(&part.etag)))
        .bind(to_i64("upload part", part.size)?)
        .bind(run)
        .execute(&mut *tx)
        .await
        .ctx("insert upload part")?;
        tx.commit().await.ctx("commit upload part")
    }

    /// Ends upload `upload` as verified (with the object's ETag) or
    /// abandoned.
    pub async fn finish_upload(
        &self,
        upload: i64,
        state: UploadState,
        etag: Option<&str>,
    ) -> Result<()> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.ctx("begin")?;
        sqlx::query(
            "UPDATE uploads SET state = ?, etag = ?, finished_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now')
             WHERE id = ?",
        )
        .bind(state.as_str())
        .bind(stored_text(etag))
        .bind(upload)
        .execute(&mut *tx)
        .await
        .ctx("finish upload")?;
        tx.commit().await.ctx("commit finished upload")
    }

    /// Records an object verified without a multipart upload in progress
    /// (one put, or an object found complete and checked): its receipt.
    pub async fn put_verified_upload(&self, run: RunId, u: &UploadRow) -> Result<()> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.ctx("begin")?;
        sqlx::query(
            "INSERT INTO uploads (run_id, dest, key, path, size, sha256, part_size, upload_id, state, etag, finished_at)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'verified', ?, strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))",
        )
        .bind(run)
        .bind(&u.dest)
        .bind(&u.key)
        .bind(&u.path)
        .bind(to_i64(&u.key, u.size)?)
        .bind(&u.sha256)
        .bind(to_i64(&u.key, u.part_size)?)
        .bind(stored_text(u.upload_id.as_deref()))
        .bind(stored_text(u.etag.as_deref()))
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
             VALUES (?, ?, ?, ?, ?, ?, 'in_flight')",
        )
        .bind(run)
        .bind(&a.key)
        .bind(a.op)
        .bind(a.part_number.map(|n| to_i64(&a.key, n)).transpose()?)
        .bind(stored_text(Some(&a.host)))
        .bind(to_i64(&a.key, a.bytes)?)
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
        .bind(if error.is_some() { "failed" } else { "ok" })
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
                let op: String = r.get(2);
                Ok(UploadAttempt {
                    id: r.get(0),
                    op: match op.as_str() {
                        "put" => "put",
                        "create_multipart" => "create_multipart",
                        "upload_part" => "upload_part",
                        "complete" => "complete",
                        "head" => "head",
                        _ => "manifest_put",
                    },
                    part_number: r
                        .get::<Option<i64>, _>(3)
                        .map(|n| to_u64(&key, "upload_attempts.part_number", n))
                        .transpose()?,
                    host: r.get(4),
                    bytes: to_u64(&key, "upload_attempts.bytes", r.get(5))?,
                    outcome: r.get(6),
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
        .bind(&p.outcome)
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
        Ok(rows
            .iter()
            .map(|r| Publication {
                run_id: r.get(0),
                dest: r.get(1),
                fingerprint: r.get(2),
                manifest_sha256: r.get(3),
                outcome: r.get(4),
                at: r.get(5),
            })
            .collect())
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
            upload_id: Some("up-1".into()),
            state: UploadState::Uploading,
            etag: None,
            started_at: String::new(),
            finished_at: None,
        };
        let id = store.begin_upload(run, &u).await.unwrap();
        // A second upload of the same object in progress is refused.
        assert!(store.begin_upload(run, &u).await.is_err());
        let part = UploadPart {
            part_number: 1,
            etag: "\"e1\"".into(),
            size: 5,
        };
        store.record_part(run, id, &part).await.unwrap();
        store.record_part(run, id, &part).await.unwrap();
        let live = store
            .upload_in_progress("s3://b/p", &u.key)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(live.upload_id.as_deref(), Some("up-1"));
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
                    op: "upload_part",
                    part_number: Some(2),
                    host: "127.0.0.1:1".into(),
                    bytes: 5,
                    outcome: String::new(),
                    error: None,
                    started_at: String::new(),
                },
            )
            .await
            .unwrap();
        store.finish_upload_attempt(a, Some("boom")).await.unwrap();
        let attempts = store.upload_attempts().await.unwrap();
        assert_eq!(attempts[0].outcome, "failed");
        assert_eq!(attempts[0].op, "upload_part");
    }
}
