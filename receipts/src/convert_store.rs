//! Conversion records: component receipts, source retirements and the
//! artifact log (manifests written, artifacts set aside).

use std::collections::BTreeSet;

use serde::Serialize;
use sqlx::{Connection, Row};

use crate::error::{QueryContext, Result};
use crate::events::{ArtifactEvent, RetirementEvent, RunId};
use crate::store::{Store, to_i64, to_u64};

/// The durable claim that a component file is complete, fsynced and named.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ComponentReceipt {
    /// Path relative to the artifact directory.
    pub path: String,
    /// Component kind (`ftw`, `ftexpert`, `q3_segment`, `q3_global_scale`).
    pub kind: String,
    /// Size the plan predicted.
    pub predicted_bytes: u64,
    /// Size written (equal to the prediction, enforced by a CHECK).
    pub size: u64,
    /// SHA-256 of the bytes written.
    pub sha256: String,
    /// SHA-256 of everything that determines the bytes.
    pub identity: String,
    /// Run that wrote it.
    pub run_id: RunId,
}

/// The claim that every span one source file feeds into a component is
/// durable in that component's temp file (migration 0010).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SpanClaim {
    /// The component (path relative to the artifact directory).
    pub component: String,
    /// The component identity its temp file is written for.
    pub identity: String,
    /// The source file (repo-relative) whose spans are in.
    pub file: String,
    /// Source bytes of those spans.
    pub bytes: u64,
}

/// What one `run --disk-budget` held (migration 0011).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DiskBudgetRecord {
    /// The run.
    pub run_id: RunId,
    /// The budget, in bytes.
    pub budget: u64,
    /// The peak of source bytes held by the admission's count.
    pub peak_held: u64,
}

/// One row of the retirement log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RetirementRow {
    /// Run that appended it.
    pub run_id: RunId,
    /// Source path (repo-relative).
    pub path: String,
    /// What happened to the source.
    pub event: RetirementEvent,
    /// Size of the source file.
    pub bytes: u64,
    /// When.
    pub at: String,
}

/// One row of the artifact log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ArtifactRow {
    /// Run that appended it.
    pub run_id: RunId,
    /// What happened to the artifact.
    pub event: ArtifactEvent,
    /// SHA-256 of manifest.json.
    pub manifest_sha256: Option<String>,
    /// The artifact fingerprint.
    pub fingerprint: Option<String>,
    /// Free text (where an artifact was set aside, and why).
    pub detail: String,
    /// For `set_aside`: the directory name under DIR it goes to.
    pub set_aside_to: Option<String>,
    /// When.
    pub at: String,
}

impl Store {
    /// Claims a component. Call only after the file and its directory entry
    /// are fsynced.
    pub async fn put_component(&self, run: RunId, c: &ComponentReceipt) -> Result<()> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.ctx("begin")?;
        sqlx::query(
            "INSERT INTO components (path, kind, predicted_bytes, size, sha256, identity, run_id)
             VALUES (?, ?, ?, ?, ?, ?, ?)
             ON CONFLICT(path) DO UPDATE SET kind = excluded.kind,
               predicted_bytes = excluded.predicted_bytes, size = excluded.size,
               sha256 = excluded.sha256, identity = excluded.identity, run_id = excluded.run_id,
               completed_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now')",
        )
        .bind(&c.path)
        .bind(&c.kind)
        .bind(to_i64(&c.path, c.predicted_bytes)?)
        .bind(to_i64(&c.path, c.size)?)
        .bind(&c.sha256)
        .bind(&c.identity)
        .bind(run)
        .execute(&mut *tx)
        .await
        .ctx("insert component")?;
        // Its temp file was renamed: no span of it is pending.
        sqlx::query("DELETE FROM component_spans WHERE component = ?")
            .bind(&c.path)
            .execute(&mut *tx)
            .await
            .ctx("delete component_spans")?;
        tx.commit().await.ctx("commit component")
    }

    /// Claims the spans of `c.file` in `c.component`'s temp file. Call only
    /// after that file was fsynced with them in it.
    pub async fn claim_spans(&self, run: RunId, c: &SpanClaim) -> Result<()> {
        self.claim_spans_all(run, std::slice::from_ref(c)).await
    }

    /// Records that `run` held at most `peak_held` source bytes under a
    /// disk budget of `budget` bytes (the larger peak stays if recorded
    /// twice).
    pub async fn record_disk_budget(&self, run: RunId, budget: u64, peak_held: u64) -> Result<()> {
        let mut conn = self.writer().await?;
        sqlx::query(
            "INSERT INTO disk_budget (run_id, budget, peak_held) VALUES (?, ?, ?)
             ON CONFLICT(run_id) DO UPDATE SET budget = excluded.budget,
               peak_held = max(peak_held, excluded.peak_held)",
        )
        .bind(run)
        .bind(to_i64("disk_budget.budget", budget)?)
        .bind(to_i64("disk_budget.peak_held", peak_held)?)
        .execute(&mut *conn)
        .await
        .ctx("insert disk_budget")?;
        Ok(())
    }

    /// Every run's budget and peak of source bytes held, oldest first.
    pub async fn disk_budgets(&self) -> Result<Vec<DiskBudgetRecord>> {
        let mut conn = self.conn.lock().await;
        let rows = sqlx::query("SELECT run_id, budget, peak_held FROM disk_budget ORDER BY run_id")
            .fetch_all(&mut *conn)
            .await
            .ctx("select disk_budget")?;
        rows.into_iter()
            .map(|r| {
                Ok(DiskBudgetRecord {
                    run_id: r.get(0),
                    budget: to_u64("disk_budget", "budget", r.get(1))?,
                    peak_held: to_u64("disk_budget", "peak_held", r.get(2))?,
                })
            })
            .collect()
    }

    /// [`Store::claim_spans`] for every claim in `claims`, in one
    /// transaction. Call only after every file they name was fsynced.
    pub async fn claim_spans_all(&self, run: RunId, claims: &[SpanClaim]) -> Result<()> {
        if claims.is_empty() {
            return Ok(());
        }
        let mut conn = self.writer().await?;
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.ctx("begin")?;
        for c in claims {
            sqlx::query(
                "INSERT INTO component_spans (component, identity, file, bytes, run_id)
                 VALUES (?, ?, ?, ?, ?)
                 ON CONFLICT(component, file) DO UPDATE SET identity = excluded.identity,
                   bytes = excluded.bytes, run_id = excluded.run_id,
                   at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now')",
            )
            .bind(&c.component)
            .bind(&c.identity)
            .bind(&c.file)
            .bind(to_i64(&c.file, c.bytes)?)
            .bind(run)
            .execute(&mut *tx)
            .await
            .ctx("insert component_spans")?;
        }
        tx.commit().await.ctx("commit component_spans")
    }

    /// The components with at least one span claim.
    pub async fn components_with_span_claims(&self) -> Result<BTreeSet<String>> {
        let mut conn = self.conn.lock().await;
        let rows = sqlx::query("SELECT DISTINCT component FROM component_spans")
            .fetch_all(&mut *conn)
            .await
            .ctx("select component_spans")?;
        Ok(rows.into_iter().map(|r| r.get(0)).collect())
    }

    /// The span claims of `component`, by source file.
    pub async fn span_claims(&self, component: &str) -> Result<Vec<SpanClaim>> {
        let mut conn = self.conn.lock().await;
        let rows = sqlx::query(
            "SELECT identity, file, bytes FROM component_spans WHERE component = ? ORDER BY file",
        )
        .bind(component)
        .fetch_all(&mut *conn)
        .await
        .ctx("select component_spans")?;
        rows.into_iter()
            .map(|r| {
                let file: String = r.get(1);
                Ok(SpanClaim {
                    component: component.to_owned(),
                    identity: r.get(0),
                    bytes: to_u64(&file, "component_spans.bytes", r.get(2))?,
                    file,
                })
            })
            .collect()
    }

    /// Forgets every span claim (every temp file is about to be removed).
    pub async fn forget_all_spans(&self) -> Result<()> {
        let mut conn = self.writer().await?;
        sqlx::query("DELETE FROM component_spans")
            .execute(&mut *conn)
            .await
            .ctx("delete component_spans")?;
        Ok(())
    }

    /// Forgets every span claim of `component` (its temp file is about to
    /// be recreated).
    pub async fn forget_spans(&self, component: &str) -> Result<()> {
        let mut conn = self.writer().await?;
        sqlx::query("DELETE FROM component_spans WHERE component = ?")
            .bind(component)
            .execute(&mut *conn)
            .await
            .ctx("delete component_spans")?;
        Ok(())
    }

    /// All component receipts, by path.
    pub async fn components(&self) -> Result<Vec<ComponentReceipt>> {
        let mut conn = self.conn.lock().await;
        let rows = sqlx::query(
            "SELECT path, kind, predicted_bytes, size, sha256, identity, run_id
             FROM components ORDER BY path",
        )
        .fetch_all(&mut *conn)
        .await
        .ctx("select components")?;
        rows.into_iter()
            .map(|r| {
                let path: String = r.get(0);
                Ok(ComponentReceipt {
                    kind: r.get(1),
                    predicted_bytes: to_u64(&path, "components.predicted_bytes", r.get(2))?,
                    size: to_u64(&path, "components.size", r.get(3))?,
                    sha256: r.get(4),
                    identity: r.get(5),
                    run_id: r.get(6),
                    path,
                })
            })
            .collect()
    }

    /// Drops every component receipt (the artifact they claim was set
    /// aside) and logs where it went, in one transaction.
    pub async fn set_aside_artifact(&self, run: RunId, dest: &str, detail: &str) -> Result<()> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.ctx("begin")?;
        sqlx::query("DELETE FROM components")
            .execute(&mut *tx)
            .await
            .ctx("delete components")?;
        sqlx::query(
            "INSERT INTO artifacts (run_id, event, detail, set_aside_to) VALUES (?, 'set_aside', ?, ?)",
        )
        .bind(run)
        .bind(crate::store::clean(Some(detail)))
        .bind(dest)
            .execute(&mut *tx)
            .await
            .ctx("insert set_aside")?;
        tx.commit().await.ctx("commit set_aside")
    }

    /// Records a manifest written (after it is fsynced).
    pub async fn record_manifest(
        &self,
        run: RunId,
        manifest_sha256: &str,
        fingerprint: &str,
    ) -> Result<()> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.ctx("begin")?;
        sqlx::query(
            "INSERT INTO artifacts (run_id, event, manifest_sha256, fingerprint)
             VALUES (?, 'manifest', ?, ?)",
        )
        .bind(run)
        .bind(manifest_sha256)
        .bind(fingerprint)
        .execute(&mut *tx)
        .await
        .ctx("insert manifest")?;
        tx.commit().await.ctx("commit manifest")
    }

    /// The artifact log, oldest first.
    pub async fn artifact_log(&self) -> Result<Vec<ArtifactRow>> {
        let mut conn = self.conn.lock().await;
        let rows = sqlx::query(
            "SELECT run_id, event, manifest_sha256, fingerprint, detail, at, set_aside_to \
             FROM artifacts ORDER BY id",
        )
        .fetch_all(&mut *conn)
        .await
        .ctx("select artifacts")?;
        rows.into_iter()
            .map(|r| {
                Ok(ArtifactRow {
                    run_id: r.get(0),
                    event: ArtifactEvent::parse(r.get(1))?,
                    manifest_sha256: r.get(2),
                    fingerprint: r.get(3),
                    detail: r.get(4),
                    at: r.get(5),
                    set_aside_to: r.get(6),
                })
            })
            .collect()
    }

    /// Appends a retirement event (`retired` after the file was unlinked and
    /// its directory fsynced; `reacquired` before fetching it again).
    pub async fn log_retirement(
        &self,
        run: RunId,
        path: &str,
        event: RetirementEvent,
        bytes: u64,
    ) -> Result<()> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.ctx("begin")?;
        sqlx::query(
            "INSERT INTO source_retirements (run_id, path, event, bytes) VALUES (?, ?, ?, ?)",
        )
        .bind(run)
        .bind(path)
        .bind(event.as_str())
        .bind(to_i64(path, bytes)?)
        .execute(&mut *tx)
        .await
        .ctx("insert retirement")?;
        // Retired or about to be fetched again: a punch no longer
        // describes what is on disk.
        crate::punch_store::end_punch(&mut tx, path).await?;
        tx.commit().await.ctx("commit retirement")
    }

    /// The retirement log, oldest first.
    pub async fn retirement_log(&self) -> Result<Vec<RetirementRow>> {
        let mut conn = self.conn.lock().await;
        let rows = sqlx::query(
            "SELECT run_id, path, event, bytes, at FROM source_retirements ORDER BY id",
        )
        .fetch_all(&mut *conn)
        .await
        .ctx("select retirements")?;
        rows.into_iter()
            .map(|r| {
                let path: String = r.get(1);
                Ok(RetirementRow {
                    run_id: r.get(0),
                    bytes: to_u64(&path, "source_retirements.bytes", r.get(3))?,
                    event: RetirementEvent::parse(r.get(2))?,
                    at: r.get(4),
                    path,
                })
            })
            .collect()
    }

    /// Source paths whose last retirement event is `retired`.
    pub async fn retired(&self) -> Result<BTreeSet<String>> {
        let mut out = BTreeSet::new();
        for r in self.retirement_log().await? {
            match r.event {
                RetirementEvent::Retired => out.insert(r.path),
                RetirementEvent::Reacquired => out.remove(&r.path),
            };
        }
        Ok(out)
    }

    /// The last retirement of `path`, if its last event is a retirement.
    pub async fn last_retirement(&self, path: &str) -> Result<Option<RetirementRow>> {
        Ok(self
            .retirement_log()
            .await?
            .into_iter()
            .rfind(|r| r.path == path)
            .filter(|r| r.event == RetirementEvent::Retired))
    }

    /// The last manifest recorded, if any.
    pub async fn last_manifest(&self) -> Result<Option<ArtifactRow>> {
        Ok(self
            .artifact_log()
            .await?
            .into_iter()
            .rfind(|a| a.event == ArtifactEvent::Manifest))
    }
}
