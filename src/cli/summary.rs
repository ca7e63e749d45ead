//! The last thing a command prints: its outcome as one JSON summary line
//! (with what it ran with: the hub session or the object store's, and the
//! jobs), or as text; never a credential.

use std::path::PathBuf;

use ftpipe_hub::token::TokenSource;

use super::args::ProgressArgs;

/// What a fetching command reports beside its outcome (never a token).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Session {
    /// Where the token came from (never the token).
    pub token_source: TokenSource,
    /// The Hugging Face cache files were taken from, if any.
    pub hf_cache: Option<PathBuf>,
    /// What named that cache: `--hf-cache`, HF_HUB_CACHE, HF_HOME or the
    /// default.
    pub hf_cache_from: Option<&'static str>,
    /// No network (`--offline` or `HF_HUB_OFFLINE`).
    pub offline: bool,
}

/// How many files and components a command works on at once, reported in
/// the JSON summary.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Jobs {
    /// Files transferred at once, for a command that fetches.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fetch: Option<usize>,
    /// Components converted at once, for a command that converts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub convert: Option<usize>,
}

/// Prints `outcome` as the final JSON summary line (with the session:
/// token source, cache, offline; and the jobs used), or as `text()`;
/// nothing when `quiet`.
pub fn print_summary<T: serde::Serialize>(
    progress: ProgressArgs,
    session: Option<&Session>,
    jobs: Jobs,
    outcome: &T,
    text: impl FnOnce() -> String,
) {
    if progress.quiet && !progress.json {
        return;
    }
    if progress.json {
        let mut v = serde_json::json!({ "event": "summary", "outcome": outcome, "jobs": jobs });
        if let (Some(s), Some(obj)) = (session, v.as_object_mut()) {
            obj.insert("session".into(), serde_json::json!(s));
        }
        println!("{v}");
    } else {
        print!("{}", text());
    }
}

/// `total` objects or files of which `uploaded` were sent, for people:
/// `11 uploaded`, `11 already there`, or `11 (3 uploaded, 8 already
/// there, proven by the store's checksum)`. What was not sent was there
/// already (reused on the store's checksum, or a prefix already
/// published, where nothing is counted).
pub fn upload_counts(total: usize, uploaded: usize) -> String {
    let there = total.saturating_sub(uploaded);
    match (uploaded, there) {
        (_, 0) => format!("{total} uploaded"),
        (0, _) => format!("{total} already there"),
        _ => format!(
            "{total} ({uploaded} uploaded, {there} already there, proven by the store's checksum)"
        ),
    }
}

/// What an object-store command reports beside its outcome (never a key).
#[derive(Debug, Clone, serde::Serialize)]
pub struct S3Session {
    endpoint: Option<String>,
    region: String,
    credentials_from: String,
}

impl S3Session {
    /// What of `c` may be shown.
    pub fn of(c: &ftpipe_objstore::S3Config) -> S3Session {
        S3Session {
            endpoint: c.endpoint.clone(),
            region: c.region.clone(),
            credentials_from: c.credentials_from.clone(),
        }
    }
}

/// Prints an object-store command's JSON summary, or `text()`.
pub fn print_s3_summary<T: serde::Serialize>(
    json: bool,
    quiet: bool,
    session: &S3Session,
    outcome: &T,
    text: impl FnOnce() -> String,
) {
    if json {
        let v = serde_json::json!({ "event": "summary", "outcome": outcome, "session": session });
        println!("{v}");
    } else if !quiet {
        print!("{}", text());
    }
}
