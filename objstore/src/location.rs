//! Where a published artifact lives: `s3://BUCKET/PREFIX`, and the keys of
//! its objects.
//!
//! The layout under `PREFIX` (argued in `docs/design.md`, "Publish and
//! pull"):
//!
//! ```text
//! PREFIX/manifest.json                   written last, create-only: the commit point
//! PREFIX/<fingerprint>/<component path>  every component the manifest lists
//! PREFIX/<fingerprint>/placement.json    the publisher's placement
//! ```
//!
//! Components live under the fingerprint of the artifact they belong to,
//! so a second publisher of another artifact never overwrites a byte the
//! first one's manifest names: the two meet only at `manifest.json`, where
//! the create-only put lets exactly one win.

use crate::error::{ObjStoreError, Result};

/// Longest bucket name S3 accepts.
const MAX_BUCKET_LEN: usize = 63;
/// Longest prefix accepted (S3 keys are at most 1024 bytes; the prefix
/// leaves room for the fingerprint and component paths).
pub const MAX_PREFIX_LEN: usize = 512;

/// `s3://BUCKET/PREFIX`, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct S3Location {
    bucket: String,
    /// Without leading or trailing `/`; may be empty (the bucket's root).
    prefix: String,
}

impl S3Location {
    /// Parses `s3://BUCKET/PREFIX` (the prefix may be empty; `//`, `.` and
    /// `..` segments are refused, as are characters S3 keys should not hold).
    pub fn parse(given: &str) -> Result<S3Location> {
        let bad = |reason| ObjStoreError::BadLocation {
            given: ftpipe_secrets::strip_userinfo(given).into_owned(),
            reason,
        };
        if ftpipe_secrets::has_userinfo(given) {
            return Err(bad(
                "credentials in the location are refused (and not shown); use \
                 AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE",
            ));
        }
        let rest = given
            .strip_prefix("s3://")
            .ok_or_else(|| bad("it does not start with s3://"))?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() || bucket.len() > MAX_BUCKET_LEN {
            return Err(bad("the bucket name must have 1 to 63 characters"));
        }
        if !bucket
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        {
            return Err(bad(
                "the bucket name may hold only a-z, 0-9, '-' and '.' (no credentials in the location)",
            ));
        }
        let prefix = prefix.trim_end_matches('/');
        if prefix.len() > MAX_PREFIX_LEN {
            return Err(bad("the prefix is longer than 512 bytes"));
        }
        if !prefix.is_empty() {
            for seg in prefix.split('/') {
                if seg.is_empty() || seg == "." || seg == ".." {
                    return Err(bad("the prefix has an empty, '.' or '..' segment"));
                }
            }
            if prefix
                .bytes()
                .any(|b| b.is_ascii_control() || b == b'\\' || b == b'?' || b == b'#')
            {
                return Err(bad("the prefix has a control character, '\\', '?' or '#'"));
            }
        }
        Ok(S3Location {
            bucket: bucket.to_owned(),
            prefix: prefix.to_owned(),
        })
    }

    /// The bucket.
    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    /// The prefix (no leading or trailing `/`; empty at the bucket's root).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The key of `rel` under the prefix.
    pub fn key(&self, rel: &str) -> String {
        if self.prefix.is_empty() {
            rel.to_owned()
        } else {
            format!("{}/{rel}", self.prefix)
        }
    }

    /// `s3://BUCKET/KEY` of `key`, for messages and records.
    pub fn url_of(&self, key: &str) -> String {
        format!("s3://{}/{key}", self.bucket)
    }

    /// The keys of the artifact with `fingerprint` under this location.
    pub fn artifact(&self, fingerprint: &str) -> ArtifactKeys {
        ArtifactKeys {
            location: self.clone(),
            fingerprint: fingerprint.to_owned(),
        }
    }
}

impl std::fmt::Display for S3Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.prefix.is_empty() {
            write!(f, "s3://{}", self.bucket)
        } else {
            write!(f, "s3://{}/{}", self.bucket, self.prefix)
        }
    }
}

/// The manifest's name under the prefix: the commit point of a publish.
pub const MANIFEST_KEY: &str = "manifest.json";

/// The name under the prefix of `path` (a component, or `placement.json`)
/// of the artifact with `fingerprint`.
pub fn artifact_file_key(fingerprint: &str, path: &str) -> String {
    format!("{fingerprint}/{path}")
}

/// The keys of one artifact under a location.
#[derive(Debug, Clone)]
pub struct ArtifactKeys {
    location: S3Location,
    fingerprint: String,
}

impl ArtifactKeys {
    /// `PREFIX/manifest.json`.
    pub fn manifest(&self) -> String {
        self.location.key(MANIFEST_KEY)
    }

    /// `PREFIX/<fingerprint>/<path>` of a component (or `placement.json`).
    pub fn file(&self, path: &str) -> String {
        self.location
            .key(&artifact_file_key(&self.fingerprint, path))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_in_a_location_are_refused_without_echoing_them() {
        for given in [
            "s3://KEYID:TYPEDPW@bkt/p",
            "s3://KEYID@bkt",
            "s3://k:p@B@D/x",
        ] {
            let e = S3Location::parse(given).unwrap_err().to_string();
            assert!(e.contains("credentials in the location"), "{e}");
            assert!(
                !e.contains("KEYID") && !e.contains("TYPEDPW") && !e.contains(":p@"),
                "{e}"
            );
            assert!(e.contains("<redacted>@"), "{e}");
        }
    }

    #[test]
    fn parses_bucket_and_prefix() {
        let l = S3Location::parse("s3://models/qwen/exp/").unwrap();
        assert_eq!(l.bucket(), "models");
        assert_eq!(l.prefix(), "qwen/exp");
        assert_eq!(l.key("manifest.json"), "qwen/exp/manifest.json");
        assert_eq!(l.to_string(), "s3://models/qwen/exp");
        let root = S3Location::parse("s3://models").unwrap();
        assert_eq!(root.key("manifest.json"), "manifest.json");
        assert_eq!(root.artifact("ab").file("x/y.ftw"), "ab/x/y.ftw".to_owned());
    }

    #[test]
    fn refuses_malformed_locations() {
        for bad in [
            "models/x",
            "s3://",
            "s3:///x",
            "s3://Models/x",
            "s3://user:secret@models/x",
            "s3://models/a//b",
            "s3://models/../b",
            "s3://models/a/./b",
            "s3://models/a?b",
        ] {
            assert!(S3Location::parse(bad).is_err(), "{bad}");
        }
    }
}
