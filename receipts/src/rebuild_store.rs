//! The spans a repin's incremental rebuild compares (migration 0018): per
//! component, the digest of its spans' old bytes in the files the repin
//! changed, recorded before the fetch replaces them.

use serde::Serialize;
use sqlx::{Connection, Row};

use crate::error::{QueryContext, Result, StoreError};
use crate::events::RunId;
use crate::store::Store;

/// The old bytes of one component's spans in the files a repin changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RebuildSpans {
    /// The component (path relative to the artifact directory).
    pub component: String,
    /// The identity of the receipt the old bytes were the sources of.
    pub from_identity: String,
    /// The component's identity under the new pin.
    pub to_identity: String,
    /// The changed source files its spans read, sorted.
    pub changed_files: Vec<String>,
    /// SHA-256 of those spans' old bytes (see `convert/src/rebuild.rs`).
    pub spans_sha256: String,
}

impl Store {
    /// Records `rows` in one transaction (a row already recorded for the
    /// same component and identities is kept). Call only with digests of
    /// bytes checked against their file's recorded digest.
    pub async fn record_rebuild_spans(&self, run: RunId, rows: &[RebuildSpans]) -> Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        let mut conn = self.writer().await?;
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.ctx("begin")?;
        for r in rows {
            let files =
                serde_json::to_string(&r.changed_files).map_err(|e| StoreError::UnknownValue {
                    column: "rebuild_spans.changed_files",
                    value: e.to_string(),
                })?;
            sqlx::query(
                "INSERT OR IGNORE INTO rebuild_spans
                   (component, from_identity, to_identity, changed_files, spans_sha256, run_id)
                 VALUES (?, ?, ?, ?, ?, ?)",
            )
            .bind(&r.component)
            .bind(&r.from_identity)
            .bind(&r.to_identity)
            .bind(files)
            .bind(&r.spans_sha256)
            .bind(run)
            .execute(&mut *tx)
            .await
            .ctx("insert rebuild_spans")?;
        }
        tx.commit().await.ctx("commit rebuild_spans")
    }

    /// Every recorded [`RebuildSpans`], by component.
    pub async fn rebuild_spans(&self) -> Result<Vec<RebuildSpans>> {
        let mut conn = self.conn.lock().await;
        let rows = sqlx::query(
            "SELECT component, from_identity, to_identity, changed_files, spans_sha256
             FROM rebuild_spans ORDER BY component, rowid",
        )
        .fetch_all(&mut *conn)
        .await
        .ctx("select rebuild_spans")?;
        rows.into_iter()
            .map(|r| {
                let files: String = r.get(3);
                let changed_files =
                    serde_json::from_str(&files).map_err(|_| StoreError::UnknownValue {
                        column: "rebuild_spans.changed_files",
                        value: files.clone(),
                    })?;
                Ok(RebuildSpans {
                    component: r.get(0),
                    from_identity: r.get(1),
                    to_identity: r.get(2),
                    changed_files,
                    spans_sha256: r.get(4),
                })
            })
            .collect()
    }

    /// Drops the receipts of `components` in one transaction: a repin
    /// converts them again, and no receipt may name a file while another
    /// one is renamed over it.
    pub async fn forget_components(&self, components: &[String]) -> Result<()> {
        if components.is_empty() {
            return Ok(());
        }
        let mut conn = self.writer().await?;
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.ctx("begin")?;
        for c in components {
            sqlx::query("DELETE FROM components WHERE path = ?")
                .bind(c)
                .execute(&mut *tx)
                .await
                .ctx("delete component")?;
        }
        tx.commit().await.ctx("commit forgotten components")
    }
}
