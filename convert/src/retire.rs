//! `--retire-sources`: deleting a source shard once everything that reads
//! it is durable and checked.
//!
//! A shard goes when every component reading it has a receipt and a file
//! that hashes to it. Components written by this run were hashed on the
//! way; a reused one (checked by size only when the run started) is hashed
//! here, at most once per run, just before a shard it could be rebuilt from
//! goes. One that does not match is reported corrupt and the shard stays;
//! the caller rewrites the component, then retires again.
//!
//! The retirement is logged first, then the file is unlinked and its
//! directory fsynced: a crash in between leaves a logged retirement of a
//! file still present, which the next retiring run finishes without a
//! second row.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use tokio::task::block_in_place;

use ftpipe_receipts::{ComponentReceipt, RetirementEvent, RunId, Store};

use crate::error::{ConvertError, Result};
use crate::skeleton::Skeleton;
use ftpipe_fs::Layout;
use ftpipe_fs::crashpoint::{self, CrashPoint};
use ftpipe_fs::durable::sync_dir;
use ftpipe_hub::identity::{Expected, LfsSha256, hash_file};

/// What one run has checked, found corrupt and retired.
#[derive(Debug, Default)]
pub(super) struct Retirer {
    state: Mutex<RetireState>,
}

#[derive(Debug, Default)]
struct RetireState {
    /// Components whose file is known to match its receipt in this run.
    verified: BTreeSet<String>,
    /// Reused components whose file does not match their receipt.
    corrupt: BTreeSet<String>,
    /// Shards retired by this run.
    retired: Vec<String>,
}

impl Retirer {
    fn state(&self) -> MutexGuard<'_, RetireState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `component` was written (and hashed) by this run.
    pub(super) fn written(&self, component: &str) {
        self.state().verified.insert(component.to_owned());
    }

    /// Corrupt components found since the last call.
    pub(super) fn take_corrupt(&self) -> BTreeSet<String> {
        std::mem::take(&mut self.state().corrupt)
    }

    /// Shards retired by this run.
    pub(super) fn retired(&self) -> Vec<String> {
        self.state().retired.clone()
    }

    /// True when every component in `readers` is known to match its
    /// receipt, hashing those not yet checked in this run.
    fn readers_match(
        &self,
        readers: &[&str],
        done: &BTreeMap<String, ComponentReceipt>,
        artifact: &Path,
    ) -> Result<bool> {
        let mut all = true;
        for &c in readers {
            if self.state().verified.contains(c) {
                continue;
            }
            let Some(r) = done.get(c) else {
                return Ok(false);
            };
            let path = artifact.join(c);
            let matches = match LfsSha256::parse(&r.sha256) {
                Some(d) => {
                    block_in_place(|| hash_file(&path, &Expected::Sha256(d), r.size))
                        .map_err(|e| ConvertError::io("read", &path, e))?
                        == r.sha256
                }
                None => false,
            };
            let mut st = self.state();
            if matches {
                st.verified.insert(c.to_owned());
            } else {
                st.corrupt.insert(c.to_owned());
                all = false;
            }
        }
        Ok(all)
    }

    /// Retires every weight shard still on disk all of whose readers have
    /// receipts that their files match.
    pub(super) async fn retire_eligible(
        &self,
        store: &Store,
        run: RunId,
        skel: &Skeleton,
        done: &BTreeMap<String, ComponentReceipt>,
        paths: &Layout,
    ) -> Result<()> {
        let mut readers: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (c, files) in &skel.readers {
            for f in files {
                readers.entry(f.as_str()).or_default().push(c.as_str());
            }
        }
        let logged = store.retired().await?;
        for (file, comps) in readers {
            if !file.ends_with(".safetensors") || !comps.iter().all(|c| done.contains_key(*c)) {
                continue;
            }
            let path = ftpipe_fs::paths::safe_join(paths.source(), file)?;
            let Ok(meta) = std::fs::metadata(&path) else {
                continue;
            };
            if !self.readers_match(&comps, done, paths.artifact())? {
                continue;
            }
            retire_file(
                store,
                run,
                paths.source(),
                file,
                meta.len(),
                logged.contains(file),
            )
            .await?;
            self.state().retired.push(file.to_owned());
        }
        Ok(())
    }
}

/// Retires source `file` (`bytes` long) under `root`: the retirement is
/// logged first (not again when `logged`: a run killed before its unlink
/// left the row), then the file is unlinked and its directory fsynced. A
/// crash in between leaves a logged retirement of a present file, which
/// the next run finishes.
pub(crate) async fn retire_file(
    store: &Store,
    run: RunId,
    root: &Path,
    file: &str,
    bytes: u64,
    logged: bool,
) -> Result<()> {
    if !logged {
        store
            .log_retirement(run, file, RetirementEvent::Retired, bytes)
            .await?;
    }
    crashpoint::hit(CrashPoint::RetirementLogged);
    unlink_durably(root, file)
}

/// Removes `file` under `root` if present and fsyncs its directory.
pub(crate) fn unlink_durably(root: &Path, file: &str) -> Result<()> {
    let path = ftpipe_fs::paths::safe_join(root, file)?;
    match std::fs::remove_file(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(ConvertError::io("remove", &path, e)),
    }
    let dir = path.parent().unwrap_or(root);
    sync_dir(dir).map_err(|e| ConvertError::io("fsync", dir, e))
}
