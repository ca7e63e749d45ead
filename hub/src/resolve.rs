//! Resolve: pin the revision to a commit and store the listing at it.
//!
//! The pin is what makes a run reproducible: every later request names the
//! 40-hex commit, never a branch. A re-run keeps the stored pin and listing;
//! if the branch moved it says so and keeps the pin unless `repin` is set.

use globset::{Glob, GlobSet, GlobSetBuilder};
use serde::Deserialize;

use std::collections::BTreeMap;

use ftpipe_receipts::{FileRow, Pin, SelectionGlobs, Store};

use crate::client::{HubClient, next_link};
use crate::error::{HubError, Result};
use crate::identity::{CommitId, GitOid, LfsSha256, XetHash};
use crate::limits::{
    MAX_FILE_SIZE, MAX_FILES, MAX_JSON_BYTES, MAX_LISTING_BYTES, MAX_TREE_PAGE_BYTES,
    MAX_TREE_PAGES,
};
use ftpipe_fs::paths::validate_repo_path;
use ftpipe_progress::{ProgressEvent, Reporter};

/// What the user asked to resolve.
#[derive(Debug, Clone)]
pub struct ResolveRequest {
    /// Repository id (`owner/name`).
    pub repo: String,
    /// Branch, tag or commit.
    pub revision: String,
    /// Allow replacing an existing pin.
    pub repin: bool,
    /// Include globs (all files when empty).
    pub include: Vec<String>,
    /// Exclude globs.
    pub exclude: Vec<String>,
}

impl ResolveRequest {
    /// The include/exclude globs of this request.
    pub fn globs(&self) -> SelectionGlobs {
        SelectionGlobs {
            include: self.include.clone(),
            exclude: self.exclude.clone(),
        }
    }
}

/// A file of the pinned listing that the fetch selection leaves out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExcludedFile {
    /// Its size in the listing.
    pub size: u64,
    /// What left it out, for messages: `--exclude "GLOB"`, or that no
    /// `--include` glob matches it.
    pub by: String,
}

/// What the fetch selection (`--include` / `--exclude`) left out of the
/// pinned listing. Empty when every file is selected.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FetchSelection {
    excluded: BTreeMap<String, ExcludedFile>,
}

impl FetchSelection {
    /// The unselected files of `listing`, each with the glob of `globs`
    /// that left it out (the first `--exclude` glob matching it, else the
    /// `--include` globs none of which matches it).
    pub fn of(listing: &[FileRow], globs: &SelectionGlobs) -> Self {
        let matches =
            |g: &String, path: &str| Glob::new(g).is_ok_and(|g| g.compile_matcher().is_match(path));
        let excluded = listing
            .iter()
            .filter(|f| !f.selected)
            .map(|f| {
                let by = if let Some(g) = globs.exclude.iter().find(|g| matches(g, &f.path)) {
                    format!("--exclude {g:?}")
                } else if !globs.include.is_empty()
                    && !globs.include.iter().any(|g| matches(g, &f.path))
                {
                    let list: Vec<String> =
                        globs.include.iter().map(|g| format!("{g:?}")).collect();
                    format!("--include {} (which it does not match)", list.join(", "))
                } else {
                    "the fetch selection (the globs that left it out were not recorded)".to_owned()
                };
                (f.path.clone(), ExcludedFile { size: f.size, by })
            })
            .collect();
        FetchSelection { excluded }
    }

    /// Why `file` was left out, `None` when it is selected (or not listed).
    pub fn excluded(&self, file: &str) -> Option<&ExcludedFile> {
        self.excluded.get(file)
    }

    /// Every file is selected.
    pub fn is_empty(&self) -> bool {
        self.excluded.is_empty()
    }
}

/// The fetch selection stored with the pin of `store` (none without a pin).
pub async fn stored_selection(store: &Store) -> Result<FetchSelection> {
    Ok(FetchSelection::of(
        &store.files().await?,
        &store.selection_globs().await?,
    ))
}

/// The outcome of resolve.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// The pin in force.
    pub pin: Pin,
    /// True when the branch now points elsewhere and the pin was kept.
    pub branch_moved_to: Option<String>,
    /// Files selected for this run.
    pub selected: Vec<FileRow>,
    /// The whole pinned listing (selected or not), as stored.
    pub listing: Vec<FileRow>,
}

#[derive(Deserialize)]
struct RawRevision {
    sha: String,
}

#[derive(Deserialize)]
struct RawLfs {
    oid: String,
    /// Any JSON number: checked per entry, so an error names the path.
    size: serde_json::Number,
}

#[derive(Deserialize)]
struct RawTreeEntry {
    #[serde(rename = "type")]
    kind: String,
    path: String,
    #[serde(default)]
    oid: Option<String>,
    #[serde(default)]
    size: Option<serde_json::Number>,
    #[serde(default)]
    lfs: Option<RawLfs>,
    #[serde(default, rename = "xetHash")]
    xet_hash: Option<String>,
}

fn bad(path: &str, problem: impl Into<String>) -> HubError {
    HubError::BadListing {
        path: path.to_owned(),
        problem: problem.into(),
    }
}

/// Validates one raw tree entry into a listing row (`None` for directories).
fn validate_entry(raw: RawTreeEntry) -> Result<Option<FileRow>> {
    match raw.kind.as_str() {
        "directory" => return Ok(None),
        "file" => {}
        other => return Err(bad(&raw.path, format!("unknown entry type {other:?}"))),
    }
    validate_repo_path(&raw.path)?;
    let size = raw
        .size
        .as_ref()
        .ok_or_else(|| bad(&raw.path, "missing size"))?;
    let size = size.as_u64().ok_or_else(|| {
        bad(
            &raw.path,
            format!("size {size} is not an unsigned 64-bit integer"),
        )
    })?;
    if size > MAX_FILE_SIZE {
        return Err(bad(
            &raw.path,
            format!("size {size} exceeds MAX_FILE_SIZE {MAX_FILE_SIZE}"),
        ));
    }
    let oid = raw
        .oid
        .as_deref()
        .ok_or_else(|| bad(&raw.path, "missing oid"))?;
    let git_oid = GitOid::parse(oid).ok_or_else(|| {
        bad(
            &raw.path,
            format!("oid {oid:?} is not a 40-hex git blob id"),
        )
    })?;
    let lfs_sha256 = match &raw.lfs {
        None => None,
        Some(lfs) => {
            let sha = LfsSha256::parse(&lfs.oid).ok_or_else(|| {
                bad(
                    &raw.path,
                    format!("lfs.oid {:?} is not a 64-hex SHA-256", lfs.oid),
                )
            })?;
            if lfs.size.as_u64() != Some(size) {
                return Err(bad(
                    &raw.path,
                    format!("lfs.size {} differs from size {size}", lfs.size),
                ));
            }
            Some(sha.as_str().to_owned())
        }
    };
    let xet_hash = match &raw.xet_hash {
        None => None,
        Some(x) if !x.is_empty() && x.bytes().all(|b| b == b'*') => {
            return Err(bad(
                &raw.path,
                "xetHash is redacted (all '*'); refusing an identity we cannot record",
            ));
        }
        Some(x) => Some(
            XetHash::parse(x)
                .ok_or_else(|| bad(&raw.path, format!("xetHash {x:?} is not 64 hex digits")))?
                .as_str()
                .to_owned(),
        ),
    };
    Ok(Some(FileRow {
        path: raw.path,
        size,
        git_oid: git_oid.as_str().to_owned(),
        lfs_sha256,
        xet_hash,
        selected: true,
    }))
}

fn globset(what: &'static str, globs: &[String]) -> Result<Option<GlobSet>> {
    if globs.is_empty() {
        return Ok(None);
    }
    let mut b = GlobSetBuilder::new();
    for g in globs {
        if g.trim().is_empty() {
            // `--include ''` would select nothing and "succeed" having
            // fetched nothing; `--exclude ''` would leave out nothing.
            return Err(HubError::InvalidInput {
                what,
                message: format!(
                    "{g:?} is empty: an empty glob matches no file (give a pattern such as \
                     \"*.safetensors\", or leave the option out)"
                ),
            });
        }
        b.add(Glob::new(g).map_err(|e| HubError::InvalidInput {
            what,
            message: format!("{g:?}: {e}"),
        })?);
    }
    b.build().map(Some).map_err(|e| HubError::InvalidInput {
        what,
        message: e.to_string(),
    })
}

/// Marks each file selected or not by the include/exclude globs.
pub fn apply_selection(
    files: &mut [FileRow],
    include: &[String],
    exclude: &[String],
) -> Result<()> {
    let inc = globset("--include glob", include)?;
    let exc = globset("--exclude glob", exclude)?;
    for f in files {
        f.selected = inc.as_ref().is_none_or(|s| s.is_match(&f.path))
            && !exc.as_ref().is_some_and(|s| s.is_match(&f.path));
    }
    Ok(())
}

/// Asks the hub which commit `revision` points to.
pub async fn revision_commit(client: &HubClient, repo: &str, revision: &str) -> Result<String> {
    let invalid = |message| HubError::BadName { message };
    crate::paths::validate_repo_id(repo).map_err(invalid)?;
    crate::paths::validate_revision(revision).map_err(invalid)?;
    let revision = crate::client::percent_encode_segment(revision);
    let url = client_url(client, &format!("/api/models/{repo}/revision/{revision}"))?;
    let (body, _) = client.get_bytes_limited(&url, MAX_JSON_BYTES).await?;
    parse_revision(url.as_str(), &body)
}

/// The commit in the revision API's answer (`{"sha": "<40 hex>", …}`).
pub fn parse_revision(url: &str, body: &[u8]) -> Result<String> {
    let raw: RawRevision =
        serde_json::from_slice(body).map_err(|source| HubError::MalformedJson {
            url: url.to_owned(),
            source,
        })?;
    CommitId::parse(&raw.sha)
        .map(|c| c.as_str().to_owned())
        .ok_or_else(|| {
            bad(
                "<revision>",
                format!("sha {:?} is not a 40-hex commit", raw.sha),
            )
        })
}

/// One page of the tree listing, parsed and every entry validated
/// (directories skipped); duplicates across pages are the caller's check.
pub fn parse_tree_page(url: &str, body: &[u8]) -> Result<Vec<FileRow>> {
    // Paths are stored and become file names: a page echoing the token
    // (in a path or anywhere) is refused, never recorded.
    if crate::json_keys::holds_secret(body) {
        return Err(HubError::BadListing {
            path: url.to_owned(),
            problem: "the listing page holds the token this process sent".into(),
        });
    }
    let page: Vec<RawTreeEntry> =
        serde_json::from_slice(body).map_err(|source| HubError::MalformedJson {
            url: url.to_owned(),
            source,
        })?;
    page.into_iter()
        .filter_map(|raw| validate_entry(raw).transpose())
        .collect()
}

fn client_url(client: &HubClient, path: &str) -> Result<url::Url> {
    url::Url::parse(&format!("{}{}", client.endpoint(), path)).map_err(|e| HubError::InvalidInput {
        what: "url",
        message: e.to_string(),
    })
}

/// Lists every file at `commit`, following `Link: rel="next"` pages.
pub async fn list_tree(client: &HubClient, repo: &str, commit: &str) -> Result<Vec<FileRow>> {
    crate::paths::validate_repo_id(repo).map_err(|message| HubError::BadName { message })?;
    if CommitId::parse(commit).is_none() {
        return Err(bad(
            "<listing>",
            format!("{commit:?} is not a 40-hex commit"),
        ));
    }
    let mut url = client_url(
        client,
        &format!("/api/models/{repo}/tree/{commit}?recursive=true"),
    )?;
    let mut files = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mut total = 0u64;
    for pages in 0..MAX_TREE_PAGES {
        // The last page may use only what is left of the listing budget.
        let left = MAX_LISTING_BYTES - total;
        let limit = MAX_TREE_PAGE_BYTES.min(left);
        let (body, headers) = match client.get_bytes_limited(&url, limit).await {
            Err(HubError::OversizedResponse { .. }) if limit == left => {
                return Err(bad(
                    "<listing>",
                    format!(
                        "more than MAX_LISTING_BYTES = {MAX_LISTING_BYTES} bytes over {} pages",
                        pages + 1
                    ),
                ));
            }
            r => r?,
        };
        total += body.len() as u64;
        for row in parse_tree_page(url.as_str(), &body)? {
            if !seen.insert(row.path.clone()) {
                return Err(bad(&row.path, "listed twice"));
            }
            files.push(row);
            if files.len() > MAX_FILES {
                return Err(bad(
                    "<listing>",
                    format!("more than MAX_FILES = {MAX_FILES} files"),
                ));
            }
        }
        match next_link(&headers) {
            Some(next) => {
                let next = url
                    .join(&next)
                    .map_err(|e| bad("<listing>", format!("bad Link header: {e}")))?;
                if next.origin() != url.origin() {
                    return Err(bad("<listing>", "Link header points to another origin"));
                }
                url = next;
            }
            None => {
                files.sort_by(|a, b| a.path.cmp(&b.path));
                return Ok(files);
            }
        }
    }
    Err(bad(
        "<listing>",
        format!("more than MAX_TREE_PAGES = {MAX_TREE_PAGES} pages"),
    ))
}

/// The pin `store` holds, for every origin; a pin of another repo is
/// refused (one directory holds one repo).
pub async fn existing_pin(store: &Store, req: &ResolveRequest) -> Result<Option<Pin>> {
    let existing = store.pin().await?;
    if let Some(pin) = &existing
        && pin.repo != req.repo
    {
        return Err(HubError::OtherRepo {
            dir: store.path().to_owned(),
            pinned: pin.repo.clone(),
            requested: req.repo.clone(),
        });
    }
    Ok(existing)
}

/// Pins the revision and stores the listing (idempotent).
pub async fn resolve(
    client: &HubClient,
    store: &Store,
    req: &ResolveRequest,
    reporter: &dyn Reporter,
) -> Result<Resolved> {
    let existing = existing_pin(store, req).await?;
    if client.is_offline() {
        return resolve_offline(store, req, existing).await;
    }
    let current = revision_commit(client, &req.repo, &req.revision).await?;
    let (keep, branch_moved_to) = pin_rules(existing.as_ref(), req, &current, reporter)?;
    let (pin, files) = match existing {
        Some(pin) if keep => {
            let files = store.files().await?;
            (pin, files)
        }
        _ => {
            let files = list_tree(client, &req.repo, &current).await?;
            let pin = Pin {
                repo: req.repo.clone(),
                revision: req.revision.clone(),
                commit: current,
                endpoint: client.endpoint().to_owned(),
            };
            (pin, files)
        }
    };
    save_resolved(store, req, pin, files, branch_moved_to).await
}

/// The pin rules, for every origin (the hub, a mirror): whether the
/// stored pin `existing` is kept for `req` when its revision is at
/// `current`, and the commit a kept branch has moved to. A full commit
/// asked for must be the commit answered (as `hf download --revision SHA`
/// gets that commit or fails); a pin to another revision is an error; a
/// moved branch keeps its pin unless `--repin`.
pub fn pin_rules(
    existing: Option<&Pin>,
    req: &ResolveRequest,
    current: &str,
    reporter: &dyn Reporter,
) -> Result<(bool, Option<String>)> {
    if let Some(asked) = CommitId::parse(&req.revision)
        && !asked.as_str().eq_ignore_ascii_case(current)
    {
        return Err(HubError::RevisionNotHonoured {
            requested: req.revision.clone(),
            answered: current.to_owned(),
        });
    }
    let mut branch_moved_to = None;
    let keep = match existing {
        Some(pin) if pin.revision == req.revision && pin.commit == current => true,
        Some(pin) if req.repin => {
            reporter.report(ProgressEvent::Note {
                message: format!(
                    "repinning {} from {} to {current}",
                    req.revision, pin.commit
                ),
            });
            false
        }
        Some(pin) if pin.revision == req.revision => {
            reporter.report(ProgressEvent::Note {
                message: format!(
                    "{} has moved from {} to {current}; keeping the pin (pass --repin to follow it)",
                    req.revision, pin.commit
                ),
            });
            branch_moved_to = Some(current.to_owned());
            true
        }
        Some(pin) => {
            return Err(HubError::PinMismatch {
                requested: req.revision.clone(),
                pinned: pin.revision.clone(),
                commit: pin.commit.clone(),
            });
        }
        None => false,
    };
    Ok((keep, branch_moved_to))
}

/// Applies `req`'s selection to `files` and stores them with `pin`.
pub async fn save_resolved(
    store: &Store,
    req: &ResolveRequest,
    pin: Pin,
    mut files: Vec<FileRow>,
    branch_moved_to: Option<String>,
) -> Result<Resolved> {
    apply_selection(&mut files, &req.include, &req.exclude)?;
    store.save_pin_selected(&pin, &files, &req.globs()).await?;
    let selected = files.iter().filter(|f| f.selected).cloned().collect();
    Ok(Resolved {
        pin,
        branch_moved_to,
        selected,
        listing: files,
    })
}

/// Offline: the stored pin answers the request (same revision, or its
/// commit), else nothing can be resolved.
async fn resolve_offline(
    store: &Store,
    req: &ResolveRequest,
    existing: Option<Pin>,
) -> Result<Resolved> {
    let dir = store
        .path()
        .parent()
        .and_then(|p| p.parent())
        .unwrap_or(store.path())
        .display()
        .to_string();
    let Some(pin) = existing else {
        return Err(HubError::Offline {
            what: format!(
                "pinning {}@{} ({dir} holds no pin yet; run once online)",
                req.repo, req.revision
            ),
        });
    };
    if req.repin {
        return Err(HubError::Offline {
            what: format!("--repin of {}@{}", req.repo, req.revision),
        });
    }
    if pin.revision != req.revision && pin.commit != req.revision {
        return Err(HubError::Offline {
            what: format!(
                "resolving {}@{} ({dir} is pinned to {} = {})",
                req.repo, req.revision, pin.revision, pin.commit
            ),
        });
    }
    let mut files = store.files().await?;
    apply_selection(&mut files, &req.include, &req.exclude)?;
    store.save_pin_selected(&pin, &files, &req.globs()).await?;
    let selected = files.iter().filter(|f| f.selected).cloned().collect();
    Ok(Resolved {
        pin,
        branch_moved_to: None,
        selected,
        listing: files,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(json: &str) -> Result<Option<FileRow>> {
        validate_entry(serde_json::from_str(json).unwrap())
    }

    #[test]
    fn rejects_redacted_xet_hash() {
        let e = entry(&format!(
            r#"{{"type":"file","path":"a.bin","oid":"{}","size":1,"xetHash":"{}"}}"#,
            "a".repeat(40),
            "*".repeat(64)
        ))
        .unwrap_err();
        assert!(e.to_string().contains("redacted"), "{e}");
    }

    #[test]
    fn rejects_lfs_size_disagreement() {
        let e = entry(&format!(
            r#"{{"type":"file","path":"a.bin","oid":"{}","size":5,"lfs":{{"oid":"{}","size":6}}}}"#,
            "a".repeat(40),
            "b".repeat(64)
        ))
        .unwrap_err();
        assert!(e.to_string().contains("lfs.size 6 differs"), "{e}");
    }

    #[test]
    fn selection_applies_include_then_exclude() {
        let mut files: Vec<FileRow> = ["a.json", "b.safetensors", "c/d.safetensors"]
            .iter()
            .map(|p| FileRow {
                path: p.to_string(),
                size: 1,
                git_oid: "a".repeat(40),
                lfs_sha256: None,
                xet_hash: None,
                selected: false,
            })
            .collect();
        apply_selection(&mut files, &["*.safetensors".into()], &["c/*".into()]).unwrap();
        let sel: Vec<bool> = files.iter().map(|f| f.selected).collect();
        assert_eq!(sel, [false, true, false]);
        // Each left-out file names the glob that left it out.
        let globs = SelectionGlobs {
            include: vec!["*.safetensors".into()],
            exclude: vec!["x*".into(), "c/*".into()],
        };
        let s = FetchSelection::of(&files, &globs);
        assert_eq!(
            s.excluded("c/d.safetensors").unwrap().by,
            r#"--exclude "c/*""#
        );
        assert_eq!(
            s.excluded("a.json").unwrap().by,
            r#"--include "*.safetensors" (which it does not match)"#
        );
        assert!(s.excluded("b.safetensors").is_none());
    }
}
