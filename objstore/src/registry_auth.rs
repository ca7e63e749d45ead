//! Registry credentials the container way, and the challenges a registry
//! answers a `401` with.
//!
//! Credentials come from the first auth file that has an entry for the
//! registry, in the order podman/skopeo and docker read them:
//! `REGISTRY_AUTH_FILE`, `$XDG_RUNTIME_DIR/containers/auth.json`,
//! `$DOCKER_CONFIG/config.json` (else `~/.docker/config.json`). An entry
//! is under `auths`, keyed by `HOST[:PORT]` (or a URL of it), holding
//! `auth` (base64 of `USER:PASSWORD`) or `username` and `password`.
//! Credential helpers (`credsStore`, `credHelpers`) are not run: an entry
//! only they hold is reported as missing. Every file is read within
//! [`MAX_AUTH_FILE_BYTES`], without following a symlink at its last
//! component; every credential is registered with the redaction point as
//! it is read.

use std::path::{Path, PathBuf};

use base64::Engine;

use crate::error::{ObjStoreError, Result};

/// Most bytes of an auth file read.
pub const MAX_AUTH_FILE_BYTES: u64 = 1024 * 1024;

/// A user name and password for one registry (never printed).
#[derive(Clone)]
pub struct RegistryCredentials {
    /// The user name.
    pub username: String,
    /// The password or identity token.
    pub password: String,
    /// The auth file they were read from.
    pub from: PathBuf,
}

impl std::fmt::Debug for RegistryCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryCredentials")
            .field("from", &self.from)
            .finish_non_exhaustive()
    }
}

/// The auth files, in the order they are asked.
fn auth_files() -> Vec<PathBuf> {
    let env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    let mut files = Vec::new();
    files.extend(env("REGISTRY_AUTH_FILE"));
    files.extend(env("XDG_RUNTIME_DIR").map(|d| d.join("containers/auth.json")));
    match env("DOCKER_CONFIG") {
        Some(d) => files.push(d.join("config.json")),
        None => files.extend(env("HOME").map(|h| h.join(".docker/config.json"))),
    }
    files
}

/// The credentials the auth files hold for `registry` (`HOST[:PORT]`).
pub fn registry_credentials(registry: &str) -> Result<Option<RegistryCredentials>> {
    for file in auth_files() {
        if let Some(c) = credentials_in(&file, registry)? {
            ftpipe_secrets::register(&c.password);
            // The Basic header (and the auth file's `auth`) carry the pair
            // in base64: a server echoing it must not print it either.
            ftpipe_secrets::register(
                &base64::engine::general_purpose::STANDARD
                    .encode(format!("{}:{}", c.username, c.password)),
            );
            return Ok(Some(c));
        }
    }
    Ok(None)
}

/// The entry for `registry` in the auth file `path`, if any (a missing
/// file has none).
fn credentials_in(path: &Path, registry: &str) -> Result<Option<RegistryCredentials>> {
    let bad = |reason: String| ObjStoreError::RegistryAuth {
        registry: registry.to_owned(),
        reason: format!("auth file {}: {reason}", path.display()),
    };
    // The user's own configuration: a link is followed (a Kubernetes
    // secret volume links `config.json` into its `..data`); the file it
    // names must be regular and within the bound.
    let bytes = match ftpipe_fs::bounded::read_bounded(path, MAX_AUTH_FILE_BYTES) {
        Ok(b) => b,
        Err(e) if e.is_not_found() => return Ok(None),
        Err(e) => return Err(bad(e.to_string())),
    };
    let doc: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|e| bad(format!("not JSON: {e}")))?;
    let Some(auths) = doc.get("auths").and_then(|a| a.as_object()) else {
        return Ok(None);
    };
    let entry = auths.iter().find(|(key, _)| {
        let k = key
            .trim_start_matches("https://")
            .trim_start_matches("http://");
        k.split('/').next() == Some(registry)
    });
    let Some((key, entry)) = entry else {
        return Ok(None);
    };
    let field = |name: &str| {
        entry
            .get(name)
            .and_then(|v| v.as_str())
            .filter(|v| !v.is_empty())
    };
    let (username, password) = match (field("auth"), field("username"), field("password")) {
        (Some(auth), _, _) => {
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(auth)
                .map_err(|_| bad(format!("auths.{key:?}.auth is not base64")))?;
            let text = String::from_utf8(decoded)
                .map_err(|_| bad(format!("auths.{key:?}.auth is not UTF-8")))?;
            let (u, p) = text
                .split_once(':')
                .ok_or_else(|| bad(format!("auths.{key:?}.auth is not USER:PASSWORD")))?;
            (u.to_owned(), p.to_owned())
        }
        (None, Some(u), Some(p)) => (u.to_owned(), p.to_owned()),
        _ => return Ok(None),
    };
    Ok(Some(RegistryCredentials {
        username,
        password,
        from: path.to_owned(),
    }))
}

/// What a `401`'s `WWW-Authenticate` asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Challenge {
    /// Basic credentials.
    Basic,
    /// A token from `realm`.
    Bearer {
        /// Where to ask.
        realm: String,
        /// The `service` parameter to send.
        service: Option<String>,
        /// The `scope` parameter to send.
        scope: Option<String>,
    },
}

/// The challenge in a `WWW-Authenticate` header.
pub fn parse_challenge(
    header: Option<&reqwest::header::HeaderValue>,
) -> std::result::Result<Challenge, String> {
    let value = header
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| "answered 401 without a readable WWW-Authenticate challenge".to_owned())?;
    let (scheme, params) = value.split_once(' ').unwrap_or((value, ""));
    if scheme.eq_ignore_ascii_case("basic") {
        return Ok(Challenge::Basic);
    }
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(format!(
            "asks for the {scheme:?} scheme; Basic and Bearer are supported"
        ));
    }
    let param = |name: &str| param_of(params, name);
    let realm = param("realm").ok_or_else(|| "a Bearer challenge without a realm".to_owned())?;
    Ok(Challenge::Bearer {
        realm,
        service: param("service"),
        scope: param("scope"),
    })
}

/// The value of `name="..."` in a challenge's parameters (quoted values
/// may hold commas).
fn param_of(params: &str, name: &str) -> Option<String> {
    let mut rest = params;
    while !rest.is_empty() {
        rest = rest.trim_start_matches([' ', ',']);
        let (key, after) = rest.split_once('=')?;
        let (value, next) = match after.strip_prefix('"') {
            Some(quoted) => {
                let end = quoted.find('"')?;
                (&quoted[..end], &quoted[end + 1..])
            }
            None => after.split_once(',').unwrap_or((after, "")),
        };
        if key.trim().eq_ignore_ascii_case(name) {
            return Some(value.to_owned());
        }
        rest = next;
    }
    None
}

/// The token of a token endpoint's JSON answer (`token` or
/// `access_token`), registered with the redaction point.
pub fn token_from_answer(body: &[u8]) -> std::result::Result<String, String> {
    let v: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| format!("the token answer is not JSON: {e}"))?;
    let token = ["token", "access_token"]
        .iter()
        .find_map(|k| v.get(*k).and_then(|t| t.as_str()).filter(|t| !t.is_empty()))
        .ok_or_else(|| {
            "the token answer holds no token (expected \"token\" or \"access_token\")".to_owned()
        })?;
    ftpipe_secrets::register(token);
    Ok(token.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_bearer_challenges() {
        let h = reqwest::header::HeaderValue::from_static(
            r#"Bearer realm="https://auth.example/token",service="registry.example",scope="repository:a/b:pull,push""#,
        );
        assert_eq!(
            parse_challenge(Some(&h)).unwrap(),
            Challenge::Bearer {
                realm: "https://auth.example/token".into(),
                service: Some("registry.example".into()),
                scope: Some("repository:a/b:pull,push".into()),
            }
        );
        let h = reqwest::header::HeaderValue::from_static(r#"Basic realm="basic-realm""#);
        assert_eq!(parse_challenge(Some(&h)).unwrap(), Challenge::Basic);
        assert!(parse_challenge(None).is_err());
    }

    #[test]
    fn reads_auth_entries() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("auth.json");
        std::fs::write(
            &path,
            r#"{"auths":{"https://127.0.0.1:5000":{"auth":"dXNlcjpzZWNyZXQtcGFzcw=="}}}"#,
        )
        .unwrap();
        let c = credentials_in(&path, "127.0.0.1:5000").unwrap().unwrap();
        assert_eq!(
            (c.username.as_str(), c.password.as_str()),
            ("user", "secret-pass")
        );
        assert!(credentials_in(&path, "127.0.0.1:5001").unwrap().is_none());
    }
}
