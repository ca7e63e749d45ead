//! Audit tests over a real state database and a real directory: a clean
//! fetch + conversion audits clean, and each way a claim can stop matching
//! the disk (tampered ledger, tampered component receipt, missing, truncated
//! or corrupted files, stray files, pending components) makes it fail with
//! the right problem and byte count.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use sha1::{Digest, Sha1};

use ftpipe_artifact::manifest::{
    ComponentLayout, ConvertOptionsId, ConverterIdentity, MANIFEST_FILE, MANIFEST_SCHEMA, Manifest,
    ManifestComponent, PLACEMENT_FILE, Placement, SourceIdentity, sha256_hex,
};
use ftpipe_fs::TEMP_SUFFIX;
use ftpipe_receipts::{ComponentReceipt, FileRow, Pin, Receipt, RunId, Store};

use super::{AuditReport, audit};
use ftpipe_convert::engine::PLAN_FILE;
use ftpipe_convert::{Component, ComponentContent, ComponentKind, Plan};

pub(crate) const CONFIG: &str = "config.json";
pub(crate) const SHARD: &str = "model-00001-of-00001.safetensors";
pub(crate) const FTW: &str = "model.ftw";
pub(crate) const SCALE: &str = "ple/layer_000/global_scale.bf16";

/// An output directory with a pinned, fully fetched and converted model.
pub(crate) struct Fixture {
    pub _dir: tempfile::TempDir,
    pub out: PathBuf,
    pub store: Store,
    pub run: RunId,
}

impl Fixture {
    pub fn source(&self) -> PathBuf {
        self.out.join("source")
    }
    pub fn artifact(&self) -> PathBuf {
        self.out.join("artifact")
    }
    pub async fn audit(&self, deep: bool) -> AuditReport {
        audit(&self.store, &self.source(), &self.artifact(), deep)
            .await
            .unwrap()
    }
}

fn write(path: &Path, bytes: &[u8]) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, bytes).unwrap();
}

fn git_oid(bytes: &[u8]) -> String {
    let mut h = Sha1::new();
    h.update(format!("blob {}\0", bytes.len()).as_bytes());
    h.update(bytes);
    hex::encode(h.finalize())
}

fn component_bytes(path: &str) -> Vec<u8> {
    match path {
        FTW => vec![7u8; 4096],
        _ => vec![3u8; 64],
    }
}

fn receipt(path: &str, kind: &str, run: RunId) -> ComponentReceipt {
    let bytes = component_bytes(path);
    ComponentReceipt {
        path: path.into(),
        kind: kind.into(),
        predicted_bytes: bytes.len() as u64,
        size: bytes.len() as u64,
        sha256: sha256_hex(&bytes),
        identity: "0".repeat(64),
        run_id: run,
    }
}

/// Writes plan.json with `extra` planned components beyond the two written.
pub(crate) fn write_plan(f: &Fixture, extra: &[(&str, u64)]) {
    let mut components: Vec<Component> = [
        (FTW, ComponentKind::Ftw),
        (SCALE, ComponentKind::Q3GlobalScale),
    ]
    .into_iter()
    .map(|(name, kind)| (name, kind, component_bytes(name).len() as u64))
    .chain(
        extra
            .iter()
            .map(|(n, b)| (*n, ComponentKind::Q3Segment, *b)),
    )
    .map(|(name, kind, predicted_bytes)| Component {
        name: name.into(),
        kind,
        predicted_bytes,
        items: 1,
        source_files: BTreeSet::from([SHARD.to_owned()]),
        content: ComponentContent::Ftw { tensors: vec![] },
    })
    .collect();
    components.sort_by(|a, b| a.name.cmp(&b.name));
    let total_bytes = components.iter().map(|c| c.predicted_bytes).sum();
    let plan = Plan {
        model_type: "qwen3_moe".into(),
        profile: "qwen3_moe".into(),
        sources: vec![],
        source_bytes: 0,
        components,
        total_bytes,
        omitted: vec![],
        excluded_sources: vec![],
    };
    write(
        &f.out.join(".ftpipe").join(PLAN_FILE),
        &serde_json::to_vec_pretty(&plan).unwrap(),
    );
}

/// Pin, fetch (config + one shard) and convert (two components, manifest,
/// plan), all through the public Store API.
pub(crate) async fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    std::fs::create_dir_all(out.join(".ftpipe")).unwrap();
    let store = Store::open(&out.join(".ftpipe/state.db")).await.unwrap();
    let run = store.begin_run("test", "0").await.unwrap();
    let config = br#"{"model_type":"qwen3_moe"}"#.to_vec();
    let shard = vec![5u8; 10_000];
    let files = vec![
        FileRow {
            path: CONFIG.into(),
            size: config.len() as u64,
            git_oid: git_oid(&config),
            lfs_sha256: None,
            xet_hash: None,
            selected: true,
        },
        FileRow {
            path: SHARD.into(),
            size: shard.len() as u64,
            git_oid: "1".repeat(40),
            lfs_sha256: Some(sha256_hex(&shard)),
            xet_hash: None,
            selected: true,
        },
    ];
    let pin = Pin {
        repo: "acme/tiny".into(),
        revision: "main".into(),
        commit: "a".repeat(40),
        endpoint: "http://127.0.0.1:1".into(),
    };
    store.save_pin(&pin, &files).await.unwrap();
    for (f, bytes) in files.iter().zip([&config, &shard]) {
        write(&out.join("source").join(&f.path), bytes);
        let mut attempt = ftpipe_receipts::Attempt {
            path: f.path.clone(),
            ..Default::default()
        };
        attempt.id = store.start_attempt(run, &attempt).await.unwrap();
        store
            .checkpoint(&f.path, f.size, f.size, Some("\"etag\""), Some(attempt.id))
            .await
            .unwrap();
        attempt.body_bytes = f.size;
        attempt.outcome = ftpipe_receipts::AttemptOutcome::Ok;
        store.finish_attempt(&attempt).await.unwrap();
        let (kind, digest) = match &f.lfs_sha256 {
            Some(s) => ("sha256", s.clone()),
            None => ("git-sha1", f.git_oid.clone()),
        };
        let r = Receipt {
            path: f.path.clone(),
            size: f.size,
            digest_kind: kind.into(),
            digest,
            completed_at: String::new(),
            adopted: false,
        };
        store.put_receipt(run, &r).await.unwrap();
    }
    let mut components = Vec::new();
    for (path, kind, layout) in [
        (FTW, "ftw", ComponentLayout::Ftw { tensors: 0 }),
        (
            SCALE,
            "q3_global_scale",
            ComponentLayout::Q3GlobalScale {
                layer: 0,
                segments: 1,
            },
        ),
    ] {
        write(&out.join("artifact").join(path), &component_bytes(path));
        let r = receipt(path, kind, run);
        store.put_component(run, &r).await.unwrap();
        components.push(ManifestComponent {
            path: path.into(),
            size: r.size,
            predicted_bytes: r.predicted_bytes,
            sha256: r.sha256,
            layout,
        });
    }
    let mut manifest = Manifest {
        schema: MANIFEST_SCHEMA.into(),
        fingerprint: String::new(),
        source: SourceIdentity {
            repo: pin.repo.clone(),
            commit: pin.commit.clone(),
            files: vec![],
        },
        converter: ConverterIdentity::current("qwen3_moe", ConvertOptionsId::default()),
        components,
        ftw_tensors: vec![],
        tensors: vec![],
        omitted: vec![],
    };
    manifest.fingerprint = manifest.compute_fingerprint().unwrap();
    let bytes = manifest.to_bytes().unwrap();
    write(&out.join("artifact").join(MANIFEST_FILE), &bytes);
    store
        .record_manifest(run, &sha256_hex(&bytes), &manifest.fingerprint)
        .await
        .unwrap();
    let placement = Placement::generate(&manifest, 1 << 30, 0, 8);
    write(
        &out.join("artifact").join(PLACEMENT_FILE),
        &serde_json::to_vec_pretty(&placement).unwrap(),
    );
    let f = Fixture {
        _dir: dir,
        out,
        store,
        run,
    };
    write_plan(&f, &[]);
    f
}

#[tokio::test(flavor = "multi_thread")]
async fn clean_directory_audits_clean_with_every_total() {
    let f = fixture().await;
    for deep in [false, true] {
        let a = f.audit(deep).await;
        assert!(a.ok, "{a:#?}");
        assert_eq!(a.reconciliation_error, 0);
        assert_eq!((a.metadata_sources.files, a.weight_sources.files), (1, 1));
        assert_eq!(a.weight_sources.bytes, 10_000);
        assert_eq!(a.retirement.retained_files, 2);
        assert_eq!(a.retirement.retired_files, 0);
        assert_eq!(a.known_target_from, "plan");
        assert_eq!(a.known_target_total, 4096 + 64);
        let ftw = a.components["ftw"];
        assert_eq!(
            (ftw.count, ftw.predicted_bytes, ftw.actual_bytes),
            (1, 4096, 4096)
        );
        assert_eq!(a.components["q3_global_scale"].actual_bytes, 64);
        assert!(a.manifest_present && a.plan_present);
        assert!(a.pending_components.is_empty() && a.component_problems.is_empty());
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn ledger_tamper_is_a_reconciliation_error() {
    let f = fixture().await;
    // Same effect as `UPDATE ledger SET committed_bytes = committed_bytes - 1`.
    f.store
        .checkpoint(SHARD, 10_000 - 1, 0, Some("\"etag\""), None)
        .await
        .unwrap();
    let a = f.audit(false).await;
    assert!(!a.ok);
    assert!(a.reconciliation_error > 0, "{a:#?}");
    let line = a.files.iter().find(|l| l.path == SHARD).unwrap();
    assert!(!line.verified && line.problem.is_some(), "{line:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn component_receipt_sha_tamper_is_caught_without_deep() {
    let f = fixture().await;
    let mut r = receipt(FTW, "ftw", f.run);
    r.sha256 = "f".repeat(64);
    f.store.put_component(f.run, &r).await.unwrap();
    let a = f.audit(false).await;
    assert!(!a.ok && !a.artifact_ok && a.sources_ok);
    assert_eq!(a.reconciliation_error, 4096, "{a:#?}");
    assert!(a.component_problems.iter().any(|p| p.path == FTW), "{a:#?}");
    // With deep the file itself no longer matches its receipt either.
    let deep = f.audit(true).await;
    assert_eq!(deep.reconciliation_error, 2 * 4096, "{deep:#?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn component_receipt_size_tamper_is_caught() {
    let f = fixture().await;
    let mut r = receipt(FTW, "ftw", f.run);
    (r.size, r.predicted_bytes) = (4097, 4097);
    f.store.put_component(f.run, &r).await.unwrap();
    let a = f.audit(false).await;
    assert!(!a.ok);
    // 1 byte vs disk, 1 vs plan.json, 1 vs manifest.json.
    assert_eq!(a.reconciliation_error, 3, "{a:#?}");
    assert_eq!(a.components["ftw"].predicted_bytes, 4097);
    assert_eq!(a.components["ftw"].actual_bytes, 4096);
}

#[tokio::test(flavor = "multi_thread")]
async fn missing_truncated_and_corrupt_components() {
    let f = fixture().await;
    std::fs::remove_file(f.artifact().join(SCALE)).unwrap();
    let a = f.audit(false).await;
    assert!(!a.ok);
    assert_eq!(a.receipts_without_files, [format!("artifact/{SCALE}")]);
    assert_eq!(a.reconciliation_error, 64);

    write(&f.artifact().join(SCALE), &component_bytes(SCALE));
    write(&f.artifact().join(FTW), &[7u8; 4000]);
    let a = f.audit(false).await;
    assert_eq!(a.reconciliation_error, 96, "{a:#?}");
    assert_eq!(a.components["ftw"].actual_bytes, 4000);

    // Same size, one byte flipped: only a deep audit can see it.
    let mut bytes = component_bytes(FTW);
    bytes[100] ^= 1;
    write(&f.artifact().join(FTW), &bytes);
    assert!(f.audit(false).await.ok);
    let deep = f.audit(true).await;
    assert!(!deep.ok);
    assert_eq!(deep.reconciliation_error, 4096);
}

#[tokio::test(flavor = "multi_thread")]
async fn stray_and_temp_files_in_the_artifact() {
    let f = fixture().await;
    write(&f.artifact().join(format!("{FTW}{TEMP_SUFFIX}")), b"x");
    write(&f.artifact().join("notes.txt"), b"x");
    let a = f.audit(false).await;
    assert!(!a.ok);
    assert_eq!(a.reconciliation_error, 0);
    assert_eq!(a.stale_temp_files, [format!("artifact/{FTW}{TEMP_SUFFIX}")]);
    assert_eq!(a.files_without_receipts, ["artifact/notes.txt"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn retired_sources_are_counted_not_missing() {
    let f = fixture().await;
    f.store
        .log_retirement(
            f.run,
            SHARD,
            ftpipe_receipts::RetirementEvent::Retired,
            10_000,
        )
        .await
        .unwrap();
    // Logged but not yet deleted (a crash in between): retained, fine.
    let a = f.audit(true).await;
    assert!(a.ok, "{a:#?}");
    assert_eq!(
        (a.retirement.retained_files, a.retirement.retired_files),
        (2, 0)
    );

    std::fs::remove_file(f.source().join(SHARD)).unwrap();
    let a = f.audit(true).await;
    assert!(a.ok, "{a:#?}");
    assert_eq!(a.retirement.retired_files, 1);
    assert_eq!(a.retirement.retired_bytes, 10_000);
    assert_eq!(a.retirement.retained_bytes, a.metadata_sources.bytes);
    let line = a.files.iter().find(|l| l.path == SHARD).unwrap();
    assert!(line.retired && line.verified);

    // A source missing without a retirement is a receipt without its file.
    std::fs::remove_file(f.source().join(CONFIG)).unwrap();
    let a = f.audit(false).await;
    assert!(!a.ok);
    assert_eq!(a.receipts_without_files, [format!("source/{CONFIG}")]);
}

#[tokio::test(flavor = "multi_thread")]
async fn planned_components_without_receipts_are_pending() {
    let f = fixture().await;
    write_plan(&f, &[("ple/layer_000/shard_0.q3", 1000)]);
    let a = f.audit(false).await;
    assert!(!a.ok && !a.artifact_ok);
    assert_eq!(a.reconciliation_error, 0);
    assert_eq!(a.known_target_total, 4096 + 64 + 1000);
    assert_eq!(a.pending_components.len(), 1);
    assert_eq!(a.components["q3_segment"].pending_bytes, 1000);
    // The manifest lists what is done; a missing manifest with nothing
    // pending is a problem of its own.
    write_plan(&f, &[]);
    std::fs::remove_file(f.artifact().join(MANIFEST_FILE)).unwrap();
    let a = f.audit(false).await;
    assert!(!a.ok);
    assert!(
        a.component_problems.iter().any(|p| p.path == MANIFEST_FILE),
        "{a:#?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn edited_manifest_is_caught() {
    let f = fixture().await;
    let path = f.artifact().join(MANIFEST_FILE);
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, text.replace("\"size\": 4096", "\"size\": 4095")).unwrap();
    let a = f.audit(false).await;
    assert!(!a.ok);
    assert_eq!(a.reconciliation_error, 1, "{a:#?}");
    let paths: Vec<&str> = a
        .component_problems
        .iter()
        .map(|p| p.path.as_str())
        .collect();
    assert!(
        paths.contains(&MANIFEST_FILE) && paths.contains(&FTW),
        "{paths:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn no_conversion_yet_is_clean() {
    let f = fixture().await;
    std::fs::remove_dir_all(f.artifact()).unwrap();
    std::fs::remove_file(f.out.join(".ftpipe").join(PLAN_FILE)).unwrap();
    f.store
        .set_aside_artifact(f.run, "artifact.stale-test", "test")
        .await
        .unwrap();
    let a = f.audit(true).await;
    assert!(a.ok, "{a:#?}");
    assert_eq!(a.known_target_from, "receipts");
    assert_eq!(a.known_target_total, 0);
    assert!(!a.manifest_present && !a.plan_present);
}
