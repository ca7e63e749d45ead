//! `oci://REGISTRY/REPOSITORY[:TAG|@sha256:HEX]`: where an artifact lives
//! in an OCI registry, checked by the distribution spec's grammar before
//! any request (a repository of lowercase path components, a tag of at
//! most 128 characters, a digest of 64 lowercase hex digits).

use crate::error::{ObjStoreError, Result};

/// The scheme of a registry reference.
pub const OCI_SCHEME: &str = "oci://";

/// The tag a reference without one names.
pub const DEFAULT_TAG: &str = "latest";

/// Longest tag the distribution spec allows.
const MAX_TAG_LEN: usize = 128;

/// Longest repository name taken (the distribution registry's limit).
const MAX_REPOSITORY_LEN: usize = 255;

/// What a reference names in its repository.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pointer {
    /// A tag (which may move).
    Tag(String),
    /// A manifest digest, `sha256:HEX` (which may not).
    Digest(String),
}

/// A parsed `oci://` reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OciReference {
    /// `HOST[:PORT]`.
    pub registry: String,
    /// The repository, `a/b/c`.
    pub repository: String,
    /// The tag or digest.
    pub pointer: Pointer,
}

impl OciReference {
    /// Parses `oci://REGISTRY/REPOSITORY[:TAG|@sha256:HEX]` (no tag: [`DEFAULT_TAG`]).
    pub fn parse(given: &str) -> Result<OciReference> {
        let bad = |reason: &'static str| ObjStoreError::BadReference {
            given: given.to_owned(),
            reason,
        };
        let rest = given
            .strip_prefix(OCI_SCHEME)
            .ok_or_else(|| bad("it does not start with oci://"))?;
        let (registry, path) = rest
            .split_once('/')
            .ok_or_else(|| bad("no repository after the registry"))?;
        if registry.is_empty()
            || registry.contains('@')
            || !registry
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-.:[]".contains(&b))
        {
            return Err(bad("the registry must be HOST or HOST:PORT"));
        }
        let (repository, pointer) = split_pointer(path).map_err(bad)?;
        check_repository(repository).map_err(bad)?;
        Ok(OciReference {
            registry: registry.to_owned(),
            repository: repository.to_owned(),
            pointer,
        })
    }

    /// Whether the registry is this machine (plain HTTP is allowed only
    /// to loopback unless asked for).
    pub fn is_loopback(&self) -> bool {
        let host = self.host();
        host == "localhost"
            || host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
    }

    /// The registry's host without its port.
    pub fn host(&self) -> &str {
        if self.registry.starts_with('[') {
            return self
                .registry
                .split_once(']')
                .map_or(self.registry.as_str(), |(h, _)| h)
                .trim_start_matches('[');
        }
        self.registry
            .split_once(':')
            .map_or(self.registry.as_str(), |(h, _)| h)
    }

    /// `oci://REGISTRY/REPOSITORY`.
    pub fn repository_url(&self) -> String {
        format!("{OCI_SCHEME}{}/{}", self.registry, self.repository)
    }

    /// The reference with `pointer` in place of its own.
    pub fn with_pointer(&self, pointer: Pointer) -> OciReference {
        OciReference {
            pointer,
            ..self.clone()
        }
    }

    /// The tag or digest as a manifest URL path takes it.
    pub fn pointer_str(&self) -> &str {
        match &self.pointer {
            Pointer::Tag(t) | Pointer::Digest(t) => t,
        }
    }
}

impl std::fmt::Display for OciReference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let sep = match self.pointer {
            Pointer::Tag(_) => ':',
            Pointer::Digest(_) => '@',
        };
        write!(f, "{}{sep}{}", self.repository_url(), self.pointer_str())
    }
}

/// A repository of a registry (`a/b/c`), checked by the distribution
/// spec's grammar: the source of a cross-repository mount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepositoryName(String);

impl RepositoryName {
    /// `given` when it is a repository name.
    pub fn parse(given: &str) -> Result<RepositoryName> {
        check_repository(given).map_err(|reason| ObjStoreError::BadReference {
            given: given.to_owned(),
            reason,
        })?;
        Ok(RepositoryName(given.to_owned()))
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for RepositoryName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn split_pointer(path: &str) -> std::result::Result<(&str, Pointer), &'static str> {
    if let Some((repo, digest)) = path.split_once('@') {
        if !is_sha256_digest(digest) {
            return Err("the digest must be sha256: and 64 lowercase hex digits");
        }
        return Ok((repo, Pointer::Digest(digest.to_owned())));
    }
    let last = path.rfind('/').map_or(0, |i| i + 1);
    match path[last..].split_once(':') {
        Some((_, tag)) => {
            let ok = !tag.is_empty()
                && tag.len() <= MAX_TAG_LEN
                && tag.bytes().enumerate().all(|(i, b)| {
                    b.is_ascii_alphanumeric() || b == b'_' || (i > 0 && (b == b'.' || b == b'-'))
                });
            if !ok {
                return Err("a tag is 1 to 128 of [A-Za-z0-9_.-], not starting with . or -");
            }
            let repo = &path[..last + path[last..].len() - tag.len() - 1];
            Ok((repo, Pointer::Tag(tag.to_owned())))
        }
        None => Ok((path, Pointer::Tag(DEFAULT_TAG.to_owned()))),
    }
}

fn check_repository(repo: &str) -> std::result::Result<(), &'static str> {
    let component_ok = |c: &str| {
        !c.is_empty()
            && c.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
            && c.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric())
            && c.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
    };
    if repo.is_empty() || repo.len() > MAX_REPOSITORY_LEN || !repo.split('/').all(component_ok) {
        return Err("the repository must be lowercase path components of [a-z0-9._-]");
    }
    Ok(())
}

/// Whether `s` is `sha256:` and 64 lowercase hex digits.
pub fn is_sha256_digest(s: &str) -> bool {
    s.strip_prefix("sha256:").is_some_and(is_sha256_hex)
}

/// Whether `s` is 64 lowercase hex digits.
pub fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_tags_digests_and_ports() {
        let r = OciReference::parse("oci://127.0.0.1:5000/models/qwen:v1").unwrap();
        assert_eq!(r.registry, "127.0.0.1:5000");
        assert_eq!(r.repository, "models/qwen");
        assert_eq!(r.pointer, Pointer::Tag("v1".into()));
        assert!(r.is_loopback());
        let d = format!("sha256:{}", "a".repeat(64));
        let r = OciReference::parse(&format!("oci://reg.example/m@{d}")).unwrap();
        assert_eq!(r.pointer, Pointer::Digest(d));
        assert!(!r.is_loopback());
        let r = OciReference::parse("oci://localhost:5000/m").unwrap();
        assert_eq!(r.pointer, Pointer::Tag(DEFAULT_TAG.into()));
    }

    #[test]
    fn refuses_malformed_references() {
        for bad in [
            "s3://b/p",
            "oci://reg",
            "oci://reg/Upper",
            "oci://reg/a//b",
            "oci://reg/a:-x",
            "oci://reg/a@sha256:abc",
            "oci://user@reg/a",
        ] {
            assert!(OciReference::parse(bad).is_err(), "{bad}");
        }
    }
}
