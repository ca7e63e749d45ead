//! The terms of files fetched from Xet storage (migration 0016): where each
//! term lies in its file, which xorb chunks it is and each chunk's Xet hash
//! and length, and the compressed bytes its fetches brought. Recorded
//! before the term's bytes are claimed; the file's Xet hash is checked
//! against them.

use serde::Serialize;
use sqlx::{Connection, Row};

use crate::error::{QueryContext, Result, StoreError};
use crate::store::{Store, to_i64, to_u64};

/// One term of a Xet file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct XetTermRow {
    /// Source path (repo-relative).
    pub path: String,
    /// The file's Xet hash.
    pub xet_hash: String,
    /// First byte of the term in the file.
    pub file_start: u64,
    /// One past its last byte.
    pub file_end: u64,
    /// The xorb's hash.
    pub xorb: String,
    /// First chunk in the xorb.
    pub chunk_start: u64,
    /// One past the last chunk.
    pub chunk_end: u64,
    /// Each chunk's Xet hash (64 hex) and length, in order.
    pub chunks: Vec<(String, u64)>,
    /// Compressed bytes fetched for it (by this fetch; the stored row adds
    /// up every fetch).
    pub fetched: u64,
    /// Bytes decoded (added up the same way).
    pub decoded: u64,
    /// Decoded bytes outside the span asked, not handed on (added up).
    pub skipped: u64,
}

/// What Xet storage brought, over every recorded term.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct XetTotals {
    /// Files with a recorded term.
    pub files: u64,
    /// Terms recorded.
    pub terms: u64,
    /// Compressed xorb bytes fetched.
    pub compressed_bytes: u64,
    /// Bytes they decoded to.
    pub decoded_bytes: u64,
    /// Decoded bytes outside the spans asked (not handed to the transfer).
    pub skipped_bytes: u64,
}

fn chunks_text(chunks: &[(String, u64)]) -> String {
    chunks.iter().map(|(h, n)| format!("{h}:{n}\n")).collect()
}

fn chunks_of(path: &str, text: &str) -> Result<Vec<(String, u64)>> {
    text.lines()
        .map(|l| {
            let parsed = l
                .split_once(':')
                .and_then(|(h, n)| Some((h.to_owned(), n.parse().ok()?)));
            parsed.ok_or_else(|| StoreError::UnknownValue {
                column: "xet_terms.chunks",
                value: format!("{l:?} of {path}"),
            })
        })
        .collect()
}

impl Store {
    /// Records `row` (replacing the term at the same start, adding its
    /// fetched bytes).
    pub async fn record_xet_term(&self, row: &XetTermRow) -> Result<()> {
        let path = row.path.as_str();
        let mut conn = self.writer().await?;
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.ctx("begin")?;
        sqlx::query(
            "INSERT INTO xet_terms (path, xet_hash, file_start, file_end, xorb, chunk_start,
                                    chunk_end, chunks, fetched, decoded, skipped)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
             ON CONFLICT (path, xet_hash, file_start) DO UPDATE SET
                file_end = excluded.file_end, xorb = excluded.xorb,
                chunk_start = excluded.chunk_start, chunk_end = excluded.chunk_end,
                chunks = excluded.chunks, fetched = fetched + excluded.fetched,
                decoded = decoded + excluded.decoded, skipped = skipped + excluded.skipped",
        )
        .bind(path)
        .bind(&row.xet_hash)
        .bind(to_i64(path, row.file_start)?)
        .bind(to_i64(path, row.file_end)?)
        .bind(&row.xorb)
        .bind(to_i64(path, row.chunk_start)?)
        .bind(to_i64(path, row.chunk_end)?)
        .bind(chunks_text(&row.chunks))
        .bind(to_i64(path, row.fetched)?)
        .bind(to_i64(path, row.decoded)?)
        .bind(to_i64(path, row.skipped)?)
        .execute(&mut *tx)
        .await
        .ctx("record xet term")?;
        tx.commit().await.ctx("commit xet term")
    }

    /// The recorded terms of `path` at `xet_hash`, by start.
    pub async fn xet_terms(&self, path: &str, xet_hash: &str) -> Result<Vec<XetTermRow>> {
        let mut conn = self.conn.lock().await;
        let rows = sqlx::query(
            "SELECT file_start, file_end, xorb, chunk_start, chunk_end, chunks, fetched,
                    decoded, skipped
             FROM xet_terms WHERE path = ? AND xet_hash = ? ORDER BY file_start",
        )
        .bind(path)
        .bind(xet_hash)
        .fetch_all(&mut *conn)
        .await
        .ctx("select xet terms")?;
        rows.iter()
            .map(|r| {
                Ok(XetTermRow {
                    path: path.to_owned(),
                    xet_hash: xet_hash.to_owned(),
                    file_start: to_u64(path, "xet_terms.file_start", r.get(0))?,
                    file_end: to_u64(path, "xet_terms.file_end", r.get(1))?,
                    xorb: r.get(2),
                    chunk_start: to_u64(path, "xet_terms.chunk_start", r.get(3))?,
                    chunk_end: to_u64(path, "xet_terms.chunk_end", r.get(4))?,
                    chunks: chunks_of(path, r.get(5))?,
                    fetched: to_u64(path, "xet_terms.fetched", r.get(6))?,
                    decoded: to_u64(path, "xet_terms.decoded", r.get(7))?,
                    skipped: to_u64(path, "xet_terms.skipped", r.get(8))?,
                })
            })
            .collect()
    }

    /// What Xet storage brought, over every recorded term.
    pub async fn xet_totals(&self) -> Result<XetTotals> {
        let mut conn = self.conn.lock().await;
        let r = sqlx::query(
            "SELECT COUNT(DISTINCT path), COUNT(*), COALESCE(SUM(fetched), 0),
                    COALESCE(SUM(decoded), 0), COALESCE(SUM(skipped), 0)
             FROM xet_terms",
        )
        .fetch_one(&mut *conn)
        .await
        .ctx("sum xet terms")?;
        let col = |i: usize, name: &'static str| to_u64("xet_terms", name, r.get(i));
        Ok(XetTotals {
            files: col(0, "files")?,
            terms: col(1, "terms")?,
            compressed_bytes: col(2, "fetched")?,
            decoded_bytes: col(3, "decoded")?,
            skipped_bytes: col(4, "skipped")?,
        })
    }
}
