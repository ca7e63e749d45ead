//! `--rebuild`: setting a stale artifact aside as evidence.
//!
//! Order, each step durable before the next:
//! 1. the marker `.ftpipe/set-aside.json` names the destination
//!    `artifact.stale-run{N}` (written atomically);
//! 2. one transaction drops the component receipts and logs `set_aside`
//!    with that destination;
//! 3. `DIR/artifact` is renamed there and `DIR` fsynced;
//! 4. the marker is removed and `.ftpipe` fsynced.
//!
//! A run that finds the marker finishes the job: if the log's last artifact
//! event is that set-aside (step 2 committed) and the rename did not happen,
//! it renames; either way it removes the marker. Without a marker nothing
//! is pending, so deleting the evidence directory later never makes a run
//! rename a fresh artifact.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use ftpipe_receipts::{ArtifactEvent, RunId, Store};

use crate::error::{ConvertError, Result};
use ftpipe_fs::Layout;
use ftpipe_fs::crashpoint::{self, CrashPoint};
use ftpipe_fs::durable::write_atomic;
use ftpipe_fs::durable::{rename_durably, sync_dir};
use ftpipe_progress::{ProgressEvent, Reporter};

/// The marker file under the state directory.
pub const SET_ASIDE_MARKER: &str = "set-aside.json";
/// Largest [`SET_ASIDE_MARKER`] read back (two paths and a run id).
pub const MAX_MARKER_BYTES: u64 = 64 * 1024;

#[derive(Debug, Serialize, Deserialize)]
struct Marker {
    /// Directory name under DIR the artifact goes to.
    to: String,
}

/// Sets `DIR/artifact` aside; returns where it went.
/// An artifact made under another identity (`reasons`): refused without
/// `--rebuild`, else set aside (and the user told where).
pub(super) async fn refuse_or_set_aside(
    store: &Store,
    run: RunId,
    paths: &Layout,
    rebuild: bool,
    reasons: &[String],
    reporter: &dyn Reporter,
) -> Result<PathBuf> {
    if !rebuild {
        return Err(ConvertError::StaleArtifact {
            dir: paths.artifact().display().to_string(),
            reasons: reasons.join("; "),
        });
    }
    let dest = set_aside(store, run, paths, &reasons.join("; ")).await?;
    reporter.report(ProgressEvent::Note {
        message: format!("stale artifact set aside as {}", dest.display()),
    });
    Ok(dest)
}

pub(super) async fn set_aside(
    store: &Store,
    run: RunId,
    paths: &Layout,
    why: &str,
) -> Result<PathBuf> {
    let mut name = format!("artifact.stale-run{run}");
    let mut n = 1;
    while paths.dir().join(&name).exists() {
        name = format!("artifact.stale-run{run}.{n}");
        n += 1;
    }
    let dest = paths.dir().join(&name);
    let marker = serde_json::to_vec(&Marker { to: name.clone() })
        .map_err(|e| ConvertError::internal_from("serializing the set-aside marker", e))?;
    write_atomic(paths.state_dir(), SET_ASIDE_MARKER, &marker)?;
    store
        .set_aside_artifact(run, &name, &format!("{} ({why})", dest.display()))
        .await?;
    crashpoint::hit(CrashPoint::SetAsideLogged);
    rename_aside(paths, &dest)?;
    crashpoint::hit(CrashPoint::SetAsideRenamed);
    remove_marker(paths)?;
    Ok(dest)
}

fn rename_aside(paths: &Layout, dest: &Path) -> Result<()> {
    if paths.artifact().exists() {
        rename_durably(paths.artifact(), dest)?;
    }
    Ok(())
}

fn remove_marker(paths: &Layout) -> Result<()> {
    let path = paths.state_dir().join(SET_ASIDE_MARKER);
    match std::fs::remove_file(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(ConvertError::io("remove", &path, e)),
    }
    sync_dir(paths.state_dir()).map_err(|e| ConvertError::io("fsync", paths.state_dir(), e))
}

/// Finishes a set-aside a killed run left pending; returns where the
/// artifact went if this call renamed it.
pub(super) async fn finish_pending(store: &Store, paths: &Layout) -> Result<Option<PathBuf>> {
    let path = paths.state_dir().join(SET_ASIDE_MARKER);
    let bytes = match ftpipe_fs::bounded::read_bounded_nofollow(&path, MAX_MARKER_BYTES) {
        Ok(b) => b,
        Err(e) if e.is_not_found() => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let marker: Marker =
        serde_json::from_slice(&bytes).map_err(|source| ConvertError::MalformedState {
            path: path.clone(),
            source,
        })?;
    ftpipe_fs::paths::validate_repo_path(&marker.to).map_err(|e| ConvertError::BadState {
        path: path.clone(),
        problem: format!("set-aside destination {:?}: {e}", marker.to),
    })?;
    let committed = store.artifact_log().await?.last().is_some_and(|a| {
        a.event == ArtifactEvent::SetAside && a.set_aside_to.as_deref() == Some(&marker.to)
    });
    let dest = paths.dir().join(&marker.to);
    let renamed = if committed && !dest.exists() && paths.artifact().exists() {
        rename_aside(paths, &dest)?;
        Some(dest)
    } else {
        None
    };
    remove_marker(paths)?;
    Ok(renamed)
}
