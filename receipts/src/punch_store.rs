//! Punched sources (migration 0014): a budgeted run keeps only the PLE
//! spans of a converted PLE file and punches holes over the rest, or, on a
//! volume that cannot punch, copies them aside and releases the file
//! (migration 0019, [`KeptMethod`]). The row is written before the first
//! hole (after the copy is durable, before the file is unlinked); it names the file version, the kept
//! ranges and their SHA-256, and stays live until the file is retired or
//! re-acquired (the retirement log's writer ends it in the same
//! transaction).

use std::collections::BTreeMap;

use serde::Serialize;
use sqlx::{Connection, Row, SqliteConnection};

use crate::error::{QueryContext, Result};
use crate::events::{KeptMethod, RunId};
use crate::store::{Store, to_i64, to_u64};

/// One range a punched file keeps, with the SHA-256 of its bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KeptRange {
    /// Offset in the file.
    pub offset: u64,
    /// Length (> 0).
    pub len: u64,
    /// SHA-256 (hex) of the bytes, read from the verified file.
    pub sha256: String,
}

/// A punch: which version of a source keeps which ranges.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PunchRecord {
    /// Run that punched it.
    pub run_id: RunId,
    /// Source path (repo-relative).
    pub path: String,
    /// The receipt digest of the version punched.
    pub digest: String,
    /// Its length (kept: holes are punched without changing it).
    pub size: u64,
    /// How the kept ranges are held.
    pub method: KeptMethod,
    /// The bytes it still holds on disk: punched, every allocation unit
    /// a kept range touches, whole, at most `size`; copied aside, the
    /// copy's length.
    pub kept_bytes: u64,
    /// The kept ranges, in offset order.
    pub kept: Vec<KeptRange>,
}

impl Store {
    /// Logs a punch of `record.path` (call before the first hole).
    pub async fn log_punch(&self, record: &PunchRecord) -> Result<()> {
        let path = record.path.as_str();
        let mut conn = self.writer().await?;
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.ctx("begin")?;
        let id: i64 = sqlx::query(
            "INSERT INTO source_punches (run_id, path, digest, size, kept_bytes, method)
             VALUES (?, ?, ?, ?, ?, ?) RETURNING id",
        )
        .bind(record.run_id)
        .bind(path)
        .bind(&record.digest)
        .bind(to_i64(path, record.size)?)
        .bind(to_i64(path, record.kept_bytes)?)
        .bind(record.method.as_str())
        .fetch_one(&mut *tx)
        .await
        .ctx("insert punch")?
        .get(0);
        for k in &record.kept {
            sqlx::query(
                "INSERT INTO source_kept_ranges (punch_id, offset, len, sha256) VALUES (?, ?, ?, ?)",
            )
            .bind(id)
            .bind(to_i64(path, k.offset)?)
            .bind(to_i64(path, k.len)?)
            .bind(&k.sha256)
            .execute(&mut *tx)
            .await
            .ctx("insert kept range")?;
        }
        tx.commit().await.ctx("commit punch")
    }

    /// The live punch of every source path (the latest not ended by a
    /// retirement or re-acquisition), with its kept ranges.
    pub async fn punches(&self) -> Result<BTreeMap<String, PunchRecord>> {
        let mut conn = self.conn.lock().await;
        let rows = sqlx::query(
            "SELECT p.id, p.run_id, p.path, p.digest, p.size, p.kept_bytes,
                    k.offset, k.len, k.sha256, p.method
             FROM source_punches p JOIN source_kept_ranges k ON k.punch_id = p.id
             WHERE p.ended = 0 ORDER BY p.id, k.offset",
        )
        .fetch_all(&mut *conn)
        .await
        .ctx("select punches")?;
        let mut out: BTreeMap<String, (i64, PunchRecord)> = BTreeMap::new();
        for r in rows {
            let (id, path): (i64, String) = (r.get(0), r.get(2));
            let range = KeptRange {
                offset: to_u64(&path, "source_kept_ranges.offset", r.get(6))?,
                len: to_u64(&path, "source_kept_ranges.len", r.get(7))?,
                sha256: r.get(8),
            };
            match out.get_mut(&path) {
                Some((known, p)) if *known == id => p.kept.push(range),
                Some((known, _)) if *known > id => {}
                _ => {
                    let record = PunchRecord {
                        run_id: r.get(1),
                        digest: r.get(3),
                        size: to_u64(&path, "source_punches.size", r.get(4))?,
                        kept_bytes: to_u64(&path, "source_punches.kept_bytes", r.get(5))?,
                        method: KeptMethod::parse(&r.get::<String, _>(9))?,
                        kept: vec![range],
                        path: path.clone(),
                    };
                    out.insert(path, (id, record));
                }
            }
        }
        Ok(out
            .into_values()
            .map(|(_, p)| (p.path.clone(), p))
            .collect())
    }
}

/// Ends the live punch of `path` (it is being retired or re-acquired), in
/// the caller's transaction.
pub(crate) async fn end_punch(conn: &mut SqliteConnection, path: &str) -> Result<()> {
    sqlx::query("UPDATE source_punches SET ended = 1 WHERE path = ? AND ended = 0")
        .bind(path)
        .execute(conn)
        .await
        .ctx("end punch")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RetirementEvent;

    #[tokio::test]
    async fn a_punch_is_live_until_its_file_is_retired() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("state.db")).await.unwrap();
        let run = store.begin_run("test", "0").await.unwrap();
        let record = |digest: &str| PunchRecord {
            run_id: run,
            path: "a.safetensors".into(),
            digest: digest.into(),
            size: 10_000,
            method: KeptMethod::Punch,
            kept_bytes: 8192,
            kept: vec![
                KeptRange {
                    offset: 0,
                    len: 4096,
                    sha256: "0".repeat(64),
                },
                KeptRange {
                    offset: 4096 * 2,
                    len: 4096,
                    sha256: "1".repeat(64),
                },
            ],
        };
        store.log_punch(&record("d1")).await.unwrap();
        let mut copied = record("d2");
        copied.method = KeptMethod::CopyAside;
        store.log_punch(&copied).await.unwrap();
        let live = store.punches().await.unwrap();
        assert_eq!(live.len(), 1);
        assert_eq!(live["a.safetensors"], copied, "the method is read back");
        store
            .log_retirement(run, "a.safetensors", RetirementEvent::Retired, 10_000)
            .await
            .unwrap();
        assert!(store.punches().await.unwrap().is_empty());
        let mut bad = record("d3");
        bad.kept_bytes = 20_000;
        assert!(store.log_punch(&bad).await.is_err(), "kept past the size");
        assert!(store.punches().await.unwrap().is_empty());
    }
}
