//! The terms of files fetched from Xet storage (migration 0016): where each
//! term lies in its file, which xorb chunks it is and each chunk's Xet hash
//! and length, and the compressed bytes its fetches brought. Recorded
//! before the term's bytes are claimed; the file's Xet hash is checked
//! against them. A later revision's fetch looks chunks up here by xorb
//! ([`Store::xet_chunk_runs`], and [`ReadOnlyStore::xet_chunk_runs`] in
//! another directory's database) to reuse them from the old files
//! (migration 0020: the `reused` bytes of a term, the index by xorb).

use serde::Serialize;
use sqlx::{Connection, Row, SqliteConnection};

use crate::error::{QueryContext, Result, StoreError};
use crate::store::{ReadOnlyStore, Store, to_i64, to_u64};

/// The most rows one chunk lookup returns: the places a xorb's chunks were
/// recorded at (a chunk recorded by many files or revisions is found in
/// the first ones; more would only be tried after those failed). A fetch
/// records a xorb range in batches of at least 1 MiB, so one recording of
/// a whole xorb (at most 64 MiB) is at most 64 rows: this finds two.
pub const MAX_CHUNK_RUNS: u32 = 128;

/// The longest `chunks` text a chunk lookup reads: a xorb's most chunks
/// (8192) at 64 hex, a colon, a length and a newline each. A longer row
/// (another directory's database is outside input) is passed over.
pub const MAX_CHUNKS_TEXT_BYTES: u32 = 8192 * 96;

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

/// Where the bytes of a recorded term came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TermBytes {
    /// Fetched from the CAS and decoded.
    Fetched,
    /// Read back from the files of an earlier fetch, every chunk checked
    /// against its recorded hash (the row's `decoded` bytes are all reused).
    Reused,
}

/// Chunks of one xorb as an earlier fetch recorded them: the term of
/// `path` (at `xet_hash`) starting at `file_start` is chunks
/// `chunk_start..chunk_end`, each `(hash, length)` in `chunks`, back to back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XetChunkRun {
    /// Source path (repo-relative) of the file that held them.
    pub path: String,
    /// That file's Xet hash.
    pub xet_hash: String,
    /// Where the first chunk starts in that file.
    pub file_start: u64,
    /// First chunk in the xorb.
    pub chunk_start: u64,
    /// One past the last chunk.
    pub chunk_end: u64,
    /// Each chunk's Xet hash (64 hex) and length, in order.
    pub chunks: Vec<(String, u64)>,
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
    /// Of the decoded bytes, those read back from the files of an earlier
    /// fetch (a previous revision, `--reuse-from`), not from the CAS.
    pub reused_bytes: u64,
    /// Terms with reused bytes.
    pub reused_terms: u64,
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

/// Up to [`MAX_CHUNK_RUNS`] recorded terms of `xorb` holding any chunk
/// of `chunks` (by the index of migration 0020 when the database has it),
/// those of files other than `path` at `xet_hash` first; rows whose chunk
/// list is longer than [`MAX_CHUNKS_TEXT_BYTES`] are not read.
async fn chunk_runs(
    conn: &mut SqliteConnection,
    xorb: &str,
    chunks: std::ops::Range<u64>,
    not_of: (&str, &str),
) -> Result<Vec<XetChunkRun>> {
    let rows = sqlx::query(
        "SELECT path, xet_hash, file_start, chunk_start, chunk_end, chunks FROM xet_terms
         WHERE xorb = ? AND chunk_start < ? AND chunk_end > ? AND length(chunks) <= ?
         ORDER BY (path = ? AND xet_hash = ?), chunk_start LIMIT ?",
    )
    .bind(xorb)
    .bind(to_i64(xorb, chunks.end)?)
    .bind(to_i64(xorb, chunks.start)?)
    .bind(MAX_CHUNKS_TEXT_BYTES)
    .bind(not_of.0)
    .bind(not_of.1)
    .bind(MAX_CHUNK_RUNS)
    .fetch_all(&mut *conn)
    .await
    .ctx("select xet chunks by xorb")?;
    rows.iter()
        .map(|r| {
            let path: String = r.get(0);
            Ok(XetChunkRun {
                xet_hash: r.get(1),
                file_start: to_u64(&path, "xet_terms.file_start", r.get(2))?,
                chunk_start: to_u64(&path, "xet_terms.chunk_start", r.get(3))?,
                chunk_end: to_u64(&path, "xet_terms.chunk_end", r.get(4))?,
                chunks: chunks_of(&path, r.get(5))?,
                path,
            })
        })
        .collect()
}

impl ReadOnlyStore {
    /// [`Store::xet_chunk_runs`] in this (another directory's) database.
    pub async fn xet_chunk_runs(
        &self,
        xorb: &str,
        chunks: std::ops::Range<u64>,
        not_of: (&str, &str),
    ) -> Result<Vec<XetChunkRun>> {
        let mut conn = self.conn.lock().await;
        chunk_runs(&mut conn, xorb, chunks, not_of).await
    }
}

impl Store {
    /// Up to [`MAX_CHUNK_RUNS`] recorded terms of `xorb` that hold any of
    /// `chunks`, those of files other than `not_of` (path, Xet hash: the
    /// file being fetched, whose published path holds other bytes) first.
    pub async fn xet_chunk_runs(
        &self,
        xorb: &str,
        chunks: std::ops::Range<u64>,
        not_of: (&str, &str),
    ) -> Result<Vec<XetChunkRun>> {
        let mut conn = self.conn.lock().await;
        chunk_runs(&mut conn, xorb, chunks, not_of).await
    }

    /// Records `row`, fetched from the CAS (replacing the term at the same
    /// start, adding its fetched bytes).
    pub async fn record_xet_term(&self, row: &XetTermRow) -> Result<()> {
        self.record_xet_term_from(row, TermBytes::Fetched).await
    }

    /// Records `row`, its bytes from `from` (reused: every decoded byte of
    /// it counts as reused, none as fetched).
    pub async fn record_xet_term_from(&self, row: &XetTermRow, from: TermBytes) -> Result<()> {
        let path = row.path.as_str();
        let reused = match from {
            TermBytes::Fetched => 0,
            TermBytes::Reused => row.decoded,
        };
        let mut conn = self.writer().await?;
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.ctx("begin")?;
        sqlx::query(
            "INSERT INTO xet_terms (path, xet_hash, file_start, file_end, xorb, chunk_start,
                                    chunk_end, chunks, fetched, decoded, skipped, reused)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
             ON CONFLICT (path, xet_hash, file_start) DO UPDATE SET
                file_end = excluded.file_end, xorb = excluded.xorb,
                chunk_start = excluded.chunk_start, chunk_end = excluded.chunk_end,
                chunks = excluded.chunks, fetched = fetched + excluded.fetched,
                decoded = decoded + excluded.decoded, skipped = skipped + excluded.skipped,
                reused = reused + excluded.reused",
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
        .bind(to_i64(path, reused)?)
        .execute(&mut *tx)
        .await
        .ctx("record xet term")?;
        tx.commit().await.ctx("commit xet term")
    }

    /// The recorded terms of `path` at `xet_hash`, by start.
    pub async fn xet_terms(&self, path: &str, xet_hash: &str) -> Result<Vec<XetTermRow>> {
        self.xet_terms_within(path, xet_hash, 0..u64::MAX).await
    }

    /// The recorded terms of `path` at `xet_hash` that hold a byte of
    /// `span`, by start.
    pub async fn xet_terms_within(
        &self,
        path: &str,
        xet_hash: &str,
        span: std::ops::Range<u64>,
    ) -> Result<Vec<XetTermRow>> {
        let mut conn = self.conn.lock().await;
        let rows = sqlx::query(
            "SELECT file_start, file_end, xorb, chunk_start, chunk_end, chunks, fetched,
                    decoded, skipped
             FROM xet_terms WHERE path = ? AND xet_hash = ? AND file_end > ? AND file_start < ?
             ORDER BY file_start",
        )
        .bind(path)
        .bind(xet_hash)
        .bind(to_i64(path, span.start)?)
        .bind(i64::try_from(span.end).unwrap_or(i64::MAX))
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
                    COALESCE(SUM(decoded), 0), COALESCE(SUM(skipped), 0),
                    COALESCE(SUM(reused), 0), COUNT(*) FILTER (WHERE reused > 0)
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
            reused_bytes: col(5, "reused")?,
            reused_terms: col(6, "reused terms")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(path: &str, hash: char, file_start: u64, chunks: std::ops::Range<u64>) -> XetTermRow {
        let list: Vec<(String, u64)> = chunks.clone().map(|i| (format!("{i:064x}"), 100)).collect();
        XetTermRow {
            path: path.into(),
            xet_hash: hash.to_string().repeat(64),
            file_start,
            file_end: file_start + 100 * list.len() as u64,
            xorb: "x".repeat(64),
            chunk_start: chunks.start,
            chunk_end: chunks.end,
            chunks: list,
            fetched: 50,
            decoded: 100 * (chunks.end - chunks.start),
            skipped: 0,
        }
    }

    /// Chunks are found by xorb and chunk range, other files' first; a
    /// reused term counts its bytes as reused; another directory's
    /// database is read without being written (its bytes unchanged).
    #[tokio::test]
    async fn chunk_runs_are_found_by_xorb_and_reuse_is_counted() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("state.db");
        let store = Store::open(&db).await.unwrap();
        store
            .record_xet_term(&row("a", 'a', 0, 0..4))
            .await
            .unwrap();
        store
            .record_xet_term(&row("a", 'a', 400, 4..8))
            .await
            .unwrap();
        store
            .record_xet_term_from(&row("b", 'b', 0, 2..6), TermBytes::Reused)
            .await
            .unwrap();
        let x = "x".repeat(64);
        let runs = store
            .xet_chunk_runs(&x, 3..5, ("b", &"b".repeat(64)))
            .await
            .unwrap();
        let starts: Vec<_> = runs
            .iter()
            .map(|r| (r.path.as_str(), r.chunk_start))
            .collect();
        assert_eq!(starts, [("a", 0), ("a", 4), ("b", 2)]);
        assert!(
            store
                .xet_chunk_runs(&x, 8..9, ("", ""))
                .await
                .unwrap()
                .is_empty()
        );
        let t = store.xet_totals().await.unwrap();
        assert_eq!((t.reused_bytes, t.reused_terms), (400, 1));
        assert_eq!(t.compressed_bytes, 150);
        store.conn.into_inner().close().await.unwrap();
        let before = std::fs::read(&db).unwrap();
        let other = ReadOnlyStore::open(&db).await.unwrap();
        let runs = other.xet_chunk_runs(&x, 0..1, ("", "")).await.unwrap();
        assert_eq!(runs.len(), 1);
        assert_eq!(runs[0].chunks.len(), 4);
        other.conn.into_inner().close().await.unwrap();
        assert!(
            std::fs::read(&db).unwrap() == before,
            "the database changed"
        );
        assert!(
            ReadOnlyStore::open(&dir.path().join("none.db"))
                .await
                .is_err()
        );
        assert!(!dir.path().join("none.db").exists());
    }

    /// Regression: a lookup returned at most 32 rows, while a fetch
    /// records a xorb range in 1 MiB batches (a 64 MiB xorb is 64 rows), so
    /// the chunks of a large term past its 32nd batch were never found and
    /// the term was fetched again (`bench/xet.sh`: a repin of a 78 MB shard
    /// reused 3 terms). A whole xorb recorded batch by batch is found.
    #[tokio::test]
    async fn a_whole_xorb_recorded_in_batches_is_found() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("state.db")).await.unwrap();
        for batch in 0..64u64 {
            let chunks = batch * 4..batch * 4 + 4;
            store
                .record_xet_term(&row("a", 'a', batch * 400, chunks))
                .await
                .unwrap();
        }
        let runs = store
            .xet_chunk_runs(&"x".repeat(64), 0..256, ("", ""))
            .await
            .unwrap();
        assert_eq!(runs.len(), 64);
    }
}
