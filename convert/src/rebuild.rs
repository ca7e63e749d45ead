//! Incremental rebuild after a repin: which components a new revision
//! keeps, which it must convert again, and the durable comparison that
//! decides the rest.
//!
//! A component's identity ([`crate::skeleton`]) covers the converter, the
//! component (name, layout, exact source spans), `config.json` and the
//! digests of the files it reads. After a repin, a component falls in one
//! of three [`Fate`]s:
//!
//! - `kept`: its receipt has the identity the new plan gives it (it reads
//!   no changed file); it is reused as any receipt is.
//! - `checked`: its receipt was made from the old files with exactly the
//!   content the new plan gives it (same converter, config, spans and
//!   layout: the identity of the new component under the old digests is
//!   the receipt's), and it reads a changed file. Before the fetch
//!   replaces those files, [`record_old_spans`] hashes the old bytes of its
//!   spans in them (after checking each old file against its recorded
//!   SHA-256) and records the digest. Once the new files are published,
//!   [`keep_unchanged`] hashes the same spans of the new bytes: equal, and
//!   the component's file still hashing to its receipt, it gets a receipt
//!   under its new identity (its bytes are the ones a fresh build writes);
//!   otherwise it is converted again.
//! - `rebuilt`: anything else (new, another layout or span, another
//!   config or converter, or no old bytes to compare).
//!
//! A Q3 segment is encoded under its table's global scale, which reads
//! every segment: its spans include the scale's, so a segment is kept only
//! when no segment of its table changed.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;

use serde::Serialize;
use sha2::{Digest, Sha256};
use tokio::task::block_in_place;

use ftpipe_artifact::manifest::{ConverterIdentity, SourceIdentity};
use ftpipe_fs::Layout;
use ftpipe_fs::crashpoint::{self, CrashPoint};
use ftpipe_progress::{ProgressEvent, Reporter};
use ftpipe_receipts::{ComponentReceipt, FileRow, RebuildSpans, RunId, Store};

use crate::component::{CONFIG_FILE, Component, ComponentContent, SourceSpan};
use crate::error::{ConvertError, Result};
use crate::options::{ConvertOptions, converter_identity};
use crate::plan::{Plan, Planned};
use crate::skeleton::{
    MAX_SKELETON_BYTES, SKELETON_FILE, Skeleton, files_read, listed_receipts, source_identity,
};
use crate::write::{CHUNK_BYTES, Sources, SpanReader};

/// What a repin does to one component (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Fate {
    /// Its identity is unchanged: reused.
    Kept,
    /// Same content, reads a changed file: kept when its spans' bytes are
    /// unchanged, known once the new files are fetched.
    Checked,
    /// Converted again.
    Rebuilt,
}

/// The fate of one component of the new plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ComponentFate {
    /// The component's path in the artifact.
    pub component: String,
    /// What the repin does to it.
    pub fate: Fate,
    /// Its predicted size.
    pub bytes: u64,
    /// The changed source files its spans read (for `checked`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub changed_files: Vec<String>,
    /// Its identity under the new pin.
    #[serde(skip)]
    pub identity: String,
}

/// The components of a repin by fate, in plan order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RebuildPreview {
    /// Every component of the new plan with its fate.
    pub components: Vec<ComponentFate>,
}

impl RebuildPreview {
    /// The components with `fate`.
    pub fn with(&self, fate: Fate) -> impl Iterator<Item = &ComponentFate> {
        self.components.iter().filter(move |c| c.fate == fate)
    }

    /// Count and predicted bytes of the components with `fate`.
    pub fn totals(&self, fate: Fate) -> (usize, u64) {
        self.with(fate)
            .fold((0, 0), |(n, b), c| (n + 1, b + c.bytes))
    }
}

/// The old side of a repin: the skeleton the artifact was made under.
pub struct OldBuild {
    skel: Skeleton,
}

impl OldBuild {
    /// The skeleton saved in `paths`' state directory (`None`: no
    /// conversion was ever planned there).
    pub fn load(paths: &Layout) -> Result<Option<OldBuild>> {
        let path = paths.state_dir().join(SKELETON_FILE);
        match ftpipe_fs::bounded::read_bounded_nofollow(&path, MAX_SKELETON_BYTES) {
            Ok(bytes) => serde_json::from_slice::<Skeleton>(&bytes)
                .map(|skel| Some(OldBuild { skel }))
                .map_err(|source| ConvertError::MalformedState { path, source }),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// The source identity the artifact was made from.
    pub fn source(&self) -> &SourceIdentity {
        &self.skel.manifest.source
    }
}

/// The spans of a component's content, in output order.
fn content_spans(content: &ComponentContent) -> Vec<&SourceSpan> {
    match content {
        ComponentContent::Ftw { tensors } => {
            tensors.iter().flat_map(|t| t.source.spans()).collect()
        }
        ComponentContent::Experts { records, .. } => {
            records.iter().flatten().flat_map(|s| s.spans()).collect()
        }
        ComponentContent::Q3Segment { source, scale, .. } => {
            std::iter::once(source).chain(scale.iter()).collect()
        }
        ComponentContent::Q3GlobalScale {
            segments, scales, ..
        } => segments.iter().chain(scales).collect(),
    }
}

/// The spans whose bytes decide `c`: its own and, for a Q3 segment, its
/// table's global scale's.
fn deciding_spans<'p>(plan: &'p Plan, c: &'p Component) -> Vec<&'p SourceSpan> {
    let mut spans = content_spans(&c.content);
    if let ComponentContent::Q3Segment { layer, .. } = c.content
        && let Some(scale) = plan.components.iter().find(
            |s| matches!(s.content, ComponentContent::Q3GlobalScale { layer: l, .. } if l == layer),
        )
    {
        spans.extend(content_spans(&scale.content));
    }
    spans
}

/// Files whose digest differs between `old` and `new` (or that `old`
/// lacks).
fn changed_files(old: &SourceIdentity, new: &SourceIdentity) -> BTreeSet<String> {
    let before: BTreeMap<&str, _> = old.files.iter().map(|f| (f.path.as_str(), f)).collect();
    new.files
        .iter()
        .filter(|f| {
            before.get(f.path.as_str()).is_none_or(|o| {
                o.digest != f.digest || o.digest_kind != f.digest_kind || o.size != f.size
            })
        })
        .map(|f| f.path.clone())
        .collect()
}

/// The fate of every component of `plan` under `new` (see the module
/// documentation), given the artifact's component `receipts` and the
/// build it was made under.
pub fn fates(
    plan: &Plan,
    converter: &ConverterIdentity,
    new: &SourceIdentity,
    old: &OldBuild,
    receipts: &BTreeMap<String, ComponentReceipt>,
) -> Result<RebuildPreview> {
    let identities = |source: &SourceIdentity| {
        Skeleton::build(plan, source.clone(), converter.clone(), 0, BTreeMap::new())
            .map(|s| s.identities)
    };
    let now = identities(new)?;
    let before = identities(old.source())?;
    let changed = changed_files(old.source(), new);
    // Another converter or config changes every component's content.
    let comparable = old.skel.manifest.converter == *converter && !changed.contains(CONFIG_FILE);
    let components = plan
        .components
        .iter()
        .map(|c| {
            let receipt = receipts.get(&c.name).map(|r| r.identity.as_str());
            let reads: BTreeSet<String> = deciding_spans(plan, c)
                .iter()
                .map(|s| s.file.to_string())
                .filter(|f| changed.contains(f))
                .collect();
            let fate = if receipt.is_some() && receipt == now.get(&c.name).map(String::as_str) {
                Fate::Kept
            } else if comparable
                && !reads.is_empty()
                && receipt.is_some()
                && receipt == before.get(&c.name).map(String::as_str)
            {
                Fate::Checked
            } else {
                Fate::Rebuilt
            };
            ComponentFate {
                component: c.name.clone(),
                fate,
                bytes: c.predicted_bytes,
                changed_files: if fate == Fate::Checked {
                    reads.into_iter().collect()
                } else {
                    Vec::new()
                },
                identity: now.get(&c.name).cloned().unwrap_or_default(),
            }
        })
        .collect();
    Ok(RebuildPreview { components })
}

/// SHA-256 of the bytes of `spans` in `files`, each framed by its file,
/// offset and length, read from `sources`.
fn spans_sha256(sources: &Sources, spans: &[&SourceSpan], files: &[String]) -> Result<String> {
    let mut hasher = Sha256::new();
    let mut buf = Vec::new();
    let mut reader = SpanReader::new(sources);
    for s in spans
        .iter()
        .filter(|s| files.iter().any(|f| **f == *s.file))
    {
        hasher.update((s.file.len() as u64).to_le_bytes());
        hasher.update(s.file.as_bytes());
        hasher.update(s.offset.to_le_bytes());
        hasher.update(s.len.to_le_bytes());
        reader.stream(s, CHUNK_BYTES, &mut buf, |_, b| {
            hasher.update(b);
            Ok(())
        })?;
    }
    Ok(hex::encode(hasher.finalize()))
}

/// True when source `file` under `paths` is exactly `size` bytes hashing
/// to the SHA-256 `digest` (read at most `size` + 1 bytes).
fn holds(paths: &Layout, file: &str, size: u64, digest: &str) -> Result<bool> {
    let path = ftpipe_fs::paths::safe_join(paths.source(), file)?;
    let f = match ftpipe_fs::nofollow::open_read_unshared(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(ConvertError::io("read", path, e)),
    };
    let (len, sha) = sha256_of(f, &path, size)?;
    Ok(len == size && sha == digest)
}

/// Length and hex SHA-256 of `f` (at `path`), reading at most `limit` + 1
/// bytes.
pub(crate) fn sha256_of(
    f: std::fs::File,
    path: &std::path::Path,
    limit: u64,
) -> Result<(u64, String)> {
    let mut f = f.take(limit.saturating_add(1));
    let (mut hasher, mut len) = (Sha256::new(), 0u64);
    let mut buf = vec![0u8; CHUNK_BYTES];
    loop {
        let n = f
            .read(&mut buf)
            .map_err(|e| ConvertError::io("read", path, e))?;
        if n == 0 {
            return Ok((len, hex::encode(hasher.finalize())));
        }
        hasher.update(&buf[..n]);
        len += n as u64;
    }
}

/// Which old source files are still on disk as the artifact's build read
/// them (each hashed once).
struct OldFiles<'a> {
    paths: &'a Layout,
    old: &'a OldBuild,
    checked: BTreeMap<String, bool>,
}

impl OldFiles<'_> {
    /// True when every one of `files` still holds the old bytes.
    fn all(&mut self, files: &[String]) -> Result<bool> {
        for f in files {
            if !self.one(f)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    fn one(&mut self, file: &str) -> Result<bool> {
        if let Some(ok) = self.checked.get(file) {
            return Ok(*ok);
        }
        let ok = match self.old.source().files.iter().find(|o| o.path == file) {
            Some(o) if o.digest_kind == "sha256" => {
                block_in_place(|| holds(self.paths, file, o.size, &o.digest))?
            }
            _ => false,
        };
        self.checked.insert(file.to_owned(), ok);
        Ok(ok)
    }
}

/// Before a repin's fetch: records, for every `checked` component of
/// `preview` not recorded yet, the digest of its spans' old bytes in the
/// files the repin changed — only from old files on disk that still hash
/// to the SHA-256 the artifact was made from (a file already replaced, or
/// not a SHA-256-named one, leaves its components to be rebuilt). Returns
/// how many components were recorded.
pub async fn record_old_spans(
    store: &Store,
    run: RunId,
    paths: &Layout,
    plan: &Plan,
    old: &OldBuild,
    preview: &RebuildPreview,
) -> Result<usize> {
    let receipts: BTreeMap<String, ComponentReceipt> = store
        .components()
        .await?
        .into_iter()
        .map(|r| (r.path.clone(), r))
        .collect();
    let recorded: BTreeSet<(String, String)> = store
        .rebuild_spans()
        .await?
        .into_iter()
        .map(|r| (r.component, r.from_identity))
        .collect();
    let sources = Sources::new(paths.source());
    let mut intact = OldFiles {
        paths,
        old,
        checked: BTreeMap::new(),
    };
    let mut rows = Vec::new();
    for fate in preview.with(Fate::Checked) {
        let Some(r) = receipts.get(&fate.component) else {
            continue;
        };
        if recorded.contains(&(fate.component.clone(), r.identity.clone()))
            || !intact.all(&fate.changed_files)?
        {
            continue;
        }
        let Some(c) = plan.components.iter().find(|c| c.name == fate.component) else {
            continue;
        };
        let spans = deciding_spans(plan, c);
        let digest = block_in_place(|| spans_sha256(&sources, &spans, &fate.changed_files))?;
        rows.push(RebuildSpans {
            component: fate.component.clone(),
            from_identity: r.identity.clone(),
            to_identity: fate.identity.clone(),
            changed_files: fate.changed_files.clone(),
            spans_sha256: digest,
        });
    }
    store.record_rebuild_spans(run, &rows).await?;
    crashpoint::hit(CrashPoint::RebuildSpansRecorded);
    Ok(rows.len())
}

/// After a repin's files are published: gives every component recorded by
/// [`record_old_spans`] whose spans' new bytes hash as the old ones did, and
/// whose file still hashes to its receipt, a receipt under its identity in
/// `skel` (a component file that no longer matches its receipt is said so
/// and converted again). Returns the components kept.
pub(crate) async fn keep_unchanged(
    store: &Store,
    run: RunId,
    paths: &Layout,
    (skel, plan): (&Skeleton, &Plan),
    reporter: &dyn Reporter,
) -> Result<Vec<String>> {
    let rows = store.rebuild_spans().await?;
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    let receipts: BTreeMap<String, ComponentReceipt> = store
        .components()
        .await?
        .into_iter()
        .map(|r| (r.path.clone(), r))
        .collect();
    let sources = Sources::new(paths.source());
    let mut kept = Vec::new();
    for row in rows {
        let (Some(r), Some(c)) = (
            receipts.get(&row.component),
            plan.components.iter().find(|c| c.name == row.component),
        ) else {
            continue;
        };
        if r.identity != row.from_identity
            || skel.identities.get(&c.name) != Some(&row.to_identity)
            || kept.contains(&c.name)
        {
            continue;
        }
        let spans = deciding_spans(plan, c);
        let now = block_in_place(|| spans_sha256(&sources, &spans, &row.changed_files))?;
        if now != row.spans_sha256 || !component_intact(paths, r, reporter)? {
            continue;
        }
        let receipt = ComponentReceipt {
            identity: row.to_identity.clone(),
            run_id: run,
            ..r.clone()
        };
        store.put_component(run, &receipt).await?;
        crashpoint::hit(CrashPoint::ComponentKept);
        reporter.report(ProgressEvent::ComponentKept {
            path: receipt.path.clone(),
            kind: receipt.kind.clone(),
            size: receipt.size,
        });
        kept.push(c.name.clone());
    }
    Ok(kept)
}

/// Drops the receipts of the components of `skel` made under another
/// identity (after [`keep_unchanged`], those a repin converts again), so
/// that no receipt names a file while the new one is renamed over it.
/// Returns how many were dropped.
pub(crate) async fn forget_superseded(store: &Store, skel: &Skeleton) -> Result<usize> {
    let superseded: Vec<String> = store
        .components()
        .await?
        .into_iter()
        .filter(|r| {
            skel.identities
                .get(&r.path)
                .is_some_and(|id| *id != r.identity)
        })
        .map(|r| r.path)
        .collect();
    store.forget_components(&superseded).await?;
    Ok(superseded.len())
}

/// True when component `r`'s file is exactly its receipt's size and
/// SHA-256; otherwise says so (it is converted again).
fn component_intact(paths: &Layout, r: &ComponentReceipt, reporter: &dyn Reporter) -> Result<bool> {
    let path = ftpipe_fs::paths::safe_join(paths.artifact(), &r.path)?;
    let f = match ftpipe_fs::nofollow::open_read_unshared(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(ConvertError::io("read back", path, e)),
    };
    let (len, sha) = block_in_place(|| sha256_of(f, &path, r.size))?;
    let intact = len == r.size && sha == r.sha256;
    if !intact {
        reporter.report(ProgressEvent::Note {
            message: format!(
                "{} does not match its receipt (size {len}, SHA-256 {sha}; the receipt says {} and {}); converting it again",
                r.path, r.size, r.sha256
            ),
        });
    }
    Ok(intact)
}

/// A repin of the artifact in `paths` to `repo`@`commit` (listing
/// `listing`, planned as `planned` under `opts`): the build the artifact
/// was made under and every component's fate. `None` when there is
/// nothing to compare: no conversion was planned in `paths` yet, or it was
/// of this very commit.
pub async fn repin_fates(
    store: &Store,
    paths: &Layout,
    (repo, commit): (&str, &str),
    planned: &Planned,
    listing: &[FileRow],
    opts: &ConvertOptions,
) -> Result<Option<(OldBuild, RebuildPreview)>> {
    let Some(old) = OldBuild::load(paths)? else {
        return Ok(None);
    };
    if old.source().repo != repo || old.source().commit == commit {
        return Ok(None);
    }
    let converter = converter_identity(&planned.config, opts)?;
    let receipts = listed_receipts(listing)?;
    let new = source_identity(repo, commit, &files_read(&planned.plan), &receipts)?;
    let components = store
        .components()
        .await?
        .into_iter()
        .map(|r| (r.path.clone(), r))
        .collect();
    let preview = fates(&planned.plan, &converter, &new, &old, &components)?;
    Ok(Some((old, preview)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::tests::plan_of_generated;
    use crate::skeleton::tests::source_identity;

    fn plan() -> Plan {
        plan_of_generated(6)
    }

    /// The fates of a repin from `source_identity(None)` to `new`, every component
    /// having its old receipt.
    fn fates_to(plan: &Plan, new: &SourceIdentity) -> BTreeMap<String, Fate> {
        let converter = ConverterIdentity::current("qwen4_exp", Default::default());
        let skel = Skeleton::build(
            plan,
            source_identity(plan, 'a', None),
            converter.clone(),
            8,
            BTreeMap::new(),
        )
        .unwrap();
        let receipts = skel
            .identities
            .iter()
            .map(|(path, identity)| {
                let r = ComponentReceipt {
                    path: path.clone(),
                    kind: String::new(),
                    predicted_bytes: 1,
                    size: 1,
                    sha256: String::new(),
                    identity: identity.clone(),
                    run_id: RunId::from_raw(1),
                };
                (path.clone(), r)
            })
            .collect();
        let old = OldBuild { skel };
        fates(plan, &converter, new, &old, &receipts)
            .unwrap()
            .components
            .into_iter()
            .map(|c| (c.component, c.fate))
            .collect()
    }

    /// A changed shard: its readers are checked, every other component
    /// kept; a changed config.json: everything converted again.
    #[test]
    fn a_changed_shard_checks_its_readers_and_a_changed_config_rebuilds_all() {
        let plan = plan();
        let shard = plan.sources[0].file.clone();
        let fates = fates_to(&plan, &source_identity(&plan, 'b', Some(&shard)));
        for c in &plan.components {
            let reads = deciding_spans(&plan, c).iter().any(|s| *s.file == *shard);
            let want = if reads { Fate::Checked } else { Fate::Kept };
            assert_eq!(fates[&c.name], want, "{}", c.name);
        }
        assert!(fates.values().any(|f| *f == Fate::Kept));
        assert!(fates.values().any(|f| *f == Fate::Checked));
        let fates = fates_to(&plan, &source_identity(&plan, 'b', Some(CONFIG_FILE)));
        assert!(fates.values().all(|f| *f == Fate::Rebuilt), "{fates:?}");
    }
}
