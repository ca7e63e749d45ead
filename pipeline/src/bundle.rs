//! The evidence bundle: one `.tar.zst` holding everything the state database
//! and the output directory claim, plus the audit that checked those claims.
//!
//! Why a bundle: a reconciliation is only as convincing as the records
//! behind it. Handing someone `state.db` ties them to our schema and to
//! SQLite; the bundle is plain JSON (one file per table, the converter's
//! `manifest.json`, `placement.json` and `plan.json` verbatim, and
//! `audit.json`), readable with `tar --zstd -x` and any JSON tool, and
//! self-contained enough to re-check the audit elsewhere.
//!
//! It is written like every other durable file of ftpipe: to a temp file
//! beside the destination, `sync_all`, rename, fsync the directory, so a
//! crash leaves either the old bundle or the complete new one.
//!
//! Tokens are never stored anywhere ftpipe writes, so none can reach the
//! bundle; as a second line of defence every entry (and its name) is
//! scanned for the bytes of `HF_TOKEN`, of every credential registered with
//! the redaction point (`ftpipe_secrets`: the token resolved from any
//! source) and of any other secret the caller passes, before anything is
//! written, and a hit fails the bundle instead.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::Serialize;

use ftpipe_artifact::manifest::{MANIFEST_FILE, PLACEMENT_FILE};
use ftpipe_receipts::Store;

use crate::audit::AuditReport;
use crate::error::{PipelineError, Result};
use ftpipe_artifact::verify::{MAX_MANIFEST_BYTES, MAX_PLACEMENT_BYTES};
use ftpipe_convert::engine::{MAX_PLAN_BYTES, MAX_SKELETON_BYTES, PLAN_FILE, SKELETON_FILE};

/// zstd level: fast, and JSON compresses well even at low levels.
const ZSTD_LEVEL: i32 = 3;
/// Shortest secret scanned for: a shorter "token" would match by chance.
const MIN_SECRET_LEN: usize = 8;

/// What [`write_bundle`] wrote.
#[derive(Debug, Clone, Serialize)]
pub struct BundleSummary {
    /// The bundle file.
    pub path: PathBuf,
    /// Number of entries.
    pub entries: usize,
    /// Entry names, in archive order.
    pub names: Vec<String>,
    /// Compressed size in bytes.
    pub bytes: u64,
}

fn json<T: Serialize + ?Sized>(name: &str, value: &T) -> Result<(String, Vec<u8>)> {
    let mut bytes = serde_json::to_vec_pretty(value)
        .map_err(|e| PipelineError::internal_from(format!("serializing bundle entry {name}"), e))?;
    bytes.push(b'\n');
    Ok((name.to_owned(), bytes))
}

/// Reads `path` (a regular file of at most `limit` bytes, not a link) into
/// an entry when it exists.
fn copy_if_present(
    name: &str,
    path: &Path,
    limit: u64,
    out: &mut Vec<(String, Vec<u8>)>,
) -> Result<()> {
    match ftpipe_fs::bounded::read_bounded_nofollow(path, limit) {
        Ok(bytes) => {
            out.push((name.to_owned(), bytes));
            Ok(())
        }
        Err(e) if e.is_not_found() => Ok(()),
        Err(e) => Err(PipelineError::io("read", path, e.into())),
    }
}

/// Every entry of the bundle of `out_dir` (`DIR`), in archive order.
async fn collect(
    store: &Store,
    out_dir: &Path,
    report: &AuditReport,
) -> Result<Vec<(String, Vec<u8>)>> {
    let mut entries = vec![
        json("pin.json", &store.pin().await?)?,
        json("files.json", &store.files().await?)?,
        json("ledger.json", &store.ledger().await?)?,
        json("discards.json", &store.discards().await?)?,
        json("attempts.json", &store.attempts().await?)?,
        json("receipts.json", &store.receipts().await?)?,
        json("components.json", &store.components().await?)?,
        json("retirements.json", &store.retirement_log().await?)?,
        json("artifacts.json", &store.artifact_log().await?)?,
        json("stage_events.json", &store.stage_events().await?)?,
        json("uploads.json", &store.uploads().await?)?,
        json("upload_attempts.json", &store.upload_attempts().await?)?,
        json("publications.json", &store.publications().await?)?,
    ];
    let artifact = out_dir.join("artifact");
    let state_dir = out_dir.join(".ftpipe");
    copy_if_present(
        MANIFEST_FILE,
        &artifact.join(MANIFEST_FILE),
        MAX_MANIFEST_BYTES,
        &mut entries,
    )?;
    copy_if_present(
        PLACEMENT_FILE,
        &artifact.join(PLACEMENT_FILE),
        MAX_PLACEMENT_BYTES,
        &mut entries,
    )?;
    copy_if_present(
        PLAN_FILE,
        &state_dir.join(PLAN_FILE),
        MAX_PLAN_BYTES,
        &mut entries,
    )?;
    copy_if_present(
        SKELETON_FILE,
        &state_dir.join(SKELETON_FILE),
        MAX_SKELETON_BYTES,
        &mut entries,
    )?;
    entries.push(json("audit.json", report)?);
    Ok(entries)
}

/// Fails when any entry name or content contains one of `secrets` or a
/// credential registered with the redaction point (the resolved token,
/// whatever its source).
fn scan(entries: &[(String, Vec<u8>)], secrets: &[Vec<u8>]) -> Result<()> {
    let given = |hay: &[u8]| {
        secrets
            .iter()
            .filter(|s| s.len() >= MIN_SECRET_LEN)
            .any(|secret| hay.windows(secret.len()).any(|w| w == secret.as_slice()))
    };
    let hit = |hay: &[u8]| given(hay) || ftpipe_secrets::contains_secret(hay);
    if let Some((name, _)) = entries
        .iter()
        .find(|(name, bytes)| hit(name.as_bytes()) || hit(bytes))
    {
        return Err(PipelineError::InvalidInput {
            what: "evidence bundle",
            message: format!(
                "entry {} contains a secret token; refusing to write the bundle",
                ftpipe_secrets::redact(name)
            ),
        });
    }
    Ok(())
}

/// Streams the entries through tar and zstd into `tmp`, then makes it
/// durable as `dest`. Returns the compressed size.
fn write_archive(entries: &[(String, Vec<u8>)], tmp: &Path, dest: &Path) -> Result<u64> {
    let io = |op, e| PipelineError::io(op, tmp, e);
    let file = ftpipe_fs::nofollow::create_truncated(tmp).map_err(|e| io("create", e))?;
    let encoder = zstd::Encoder::new(std::io::BufWriter::new(file), ZSTD_LEVEL)
        .map_err(|e| io("compress", e))?;
    let mut tar = tar::Builder::new(encoder);
    let mtime = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    for (name, bytes) in entries {
        let mut header = tar::Header::new_gnu();
        header.set_size(bytes.len() as u64);
        header.set_mode(0o644);
        header.set_mtime(mtime);
        tar.append_data(&mut header, name, bytes.as_slice())
            .map_err(|e| io("write", e))?;
    }
    let encoder = tar.into_inner().map_err(|e| io("write", e))?;
    let mut buffered = encoder.finish().map_err(|e| io("compress", e))?;
    buffered.flush().map_err(|e| io("write", e))?;
    let file = buffered
        .into_inner()
        .map_err(|e| io("write", e.into_error()))?;
    let bytes = file.metadata().map_err(|e| io("stat", e))?.len();
    ftpipe_fs::durable::publish(&file, tmp, dest)?;
    Ok(bytes)
}

/// Writes the evidence bundle of `out_dir` (`DIR`) with `report` as
/// `audit.json` to `dest` (conventionally `*.tar.zst`). Refuses to write
/// when an entry contains the value of `HF_TOKEN`, `AWS_SECRET_ACCESS_KEY`,
/// `AWS_SESSION_TOKEN`, `AWS_ACCESS_KEY_ID` or any credential registered
/// with `ftpipe_secrets` (the caller resolves the token and the AWS
/// credentials first).
pub async fn write_bundle(
    store: &Store,
    out_dir: &Path,
    report: &AuditReport,
    dest: &Path,
) -> Result<BundleSummary> {
    // The object-store credentials as well: `publish` and `pull` hold them.
    let secrets: Vec<Vec<u8>> = [
        "HF_TOKEN",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_ACCESS_KEY_ID",
    ]
    .into_iter()
    .filter_map(std::env::var_os)
    .map(|t| t.into_encoded_bytes())
    .filter(|t| !t.is_empty())
    .collect();
    write_bundle_checked(store, out_dir, report, dest, &secrets).await
}

/// [`write_bundle`] scanning for `secrets` (e.g. a token read from
/// `--token-file`) instead of only `HF_TOKEN`.
pub async fn write_bundle_checked(
    store: &Store,
    out_dir: &Path,
    report: &AuditReport,
    dest: &Path,
    secrets: &[Vec<u8>],
) -> Result<BundleSummary> {
    let entries = collect(store, out_dir, report).await?;
    scan(&entries, secrets)?;
    let name = dest
        .file_name()
        .ok_or_else(|| PipelineError::InvalidInput {
            what: "bundle path",
            message: format!("{} has no file name", dest.display()),
        })?
        .to_string_lossy()
        .into_owned();
    let tmp = dest.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
    let dest_owned = dest.to_path_buf();
    let names: Vec<String> = entries.iter().map(|(n, _)| n.clone()).collect();
    let tmp_owned = tmp.clone();
    let written =
        tokio::task::spawn_blocking(move || write_archive(&entries, &tmp_owned, &dest_owned))
            .await
            .map_err(|e| PipelineError::internal_from("bundle task", e))?;
    let bytes = match written {
        Ok(b) => b,
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
    };
    Ok(BundleSummary {
        path: dest.to_path_buf(),
        entries: names.len(),
        names,
        bytes,
    })
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;
    use crate::audit::tests::fixture;

    fn unpack(path: &Path) -> Vec<(String, Vec<u8>)> {
        let file = std::fs::File::open(path).unwrap();
        let mut archive = tar::Archive::new(zstd::Decoder::new(file).unwrap());
        archive
            .entries()
            .unwrap()
            .map(|e| {
                let mut e = e.unwrap();
                let name = e.path().unwrap().to_string_lossy().into_owned();
                let mut bytes = Vec::new();
                e.read_to_end(&mut bytes).unwrap();
                (name, bytes)
            })
            .collect()
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn bundle_holds_every_record_and_the_audit() {
        let f = fixture().await;
        let report = f.audit(false).await;
        let dest = f.out.join("evidence.tar.zst");
        let s = write_bundle_checked(&f.store, &f.out, &report, &dest, &[])
            .await
            .unwrap();
        assert_eq!(s.bytes, std::fs::metadata(&dest).unwrap().len());
        let entries = unpack(&dest);
        let names: Vec<&str> = entries.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "pin.json",
                "files.json",
                "ledger.json",
                "discards.json",
                "attempts.json",
                "receipts.json",
                "components.json",
                "retirements.json",
                "artifacts.json",
                "stage_events.json",
                "uploads.json",
                "upload_attempts.json",
                "publications.json",
                "manifest.json",
                "placement.json",
                "plan.json",
                "audit.json",
            ]
        );
        assert_eq!(s.entries, names.len());
        let get = |n: &str| -> serde_json::Value {
            serde_json::from_slice(&entries.iter().find(|(e, _)| e == n).unwrap().1).unwrap()
        };
        let audit = get("audit.json");
        assert_eq!(audit["ok"], true);
        assert_eq!(audit["reconciliation_error"], 0);
        assert_eq!(get("components.json").as_array().unwrap().len(), 2);
        assert_eq!(get("receipts.json").as_array().unwrap().len(), 2);
        let manifest = std::fs::read(f.artifact().join(MANIFEST_FILE)).unwrap();
        let copied = &entries.iter().find(|(n, _)| n == MANIFEST_FILE).unwrap().1;
        assert_eq!(copied, &manifest, "manifest.json copied verbatim");
        // No temp file left beside it.
        let left: Vec<_> = std::fs::read_dir(&f.out)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".tmp"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_secret_in_any_entry_refuses_the_bundle() {
        let f = fixture().await;
        let report = f.audit(false).await;
        let dest = f.out.join("evidence.tar.zst");
        // The pinned repo name stands in for a leaked token.
        let secret = b"acme/tiny".to_vec();
        let err = write_bundle_checked(&f.store, &f.out, &report, &dest, &[secret])
            .await
            .unwrap_err();
        assert!(err.to_string().contains("secret"), "{err}");
        assert!(!dest.exists());
        // A secret that appears nowhere does not block it.
        let other = b"hf_notpresentanywhere".to_vec();
        write_bundle_checked(&f.store, &f.out, &report, &dest, &[other])
            .await
            .unwrap();
        assert!(dest.exists());
    }
}
