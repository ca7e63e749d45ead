//! Registry credentials the container way, and the challenges a registry
//! answers a `401` with.
//!
//! Credentials come from the first auth file that has them for the
//! registry, in the order podman/skopeo and docker read them:
//! `REGISTRY_AUTH_FILE`, `$XDG_RUNTIME_DIR/containers/auth.json`,
//! `$DOCKER_CONFIG/config.json` (else `~/.docker/config.json`). In one
//! file, as docker reads it: a credential helper named for the registry
//! (`credHelpers`), else an entry under `auths`, keyed by `HOST[:PORT]` (or
//! a URL of it), holding `auth` (base64 of `USER:PASSWORD`) or `username`
//! and `password`, else the default helper (`credsStore`).
//!
//! A helper is `docker-credential-NAME` on `PATH`, run as `get` with the
//! registry on stdin; it answers `{"Username","Secret"}` on stdout (read
//! within [`MAX_HELPER_ANSWER_BYTES`], within the command's read timeout,
//! else its process group is killed). A helper that cannot be run, fails,
//! hangs or answers anything else is an error naming the helper and the
//! file that named it; its output is never shown (it holds the secret).
//! `credentials not found in native keychain` (the protocol's answer for
//! no entry) is no credentials. An identity token (a helper's `Username`
//! `<token>`, an `auths` entry's `identitytoken`) is an OAuth2 refresh
//! token: only a Bearer registry takes it, its realm asked with
//! `POST grant_type=refresh_token`.
//!
//! Every file is read within [`MAX_AUTH_FILE_BYTES`]; a file that cannot
//! be read or is not JSON is skipped with a reason the caller warns with
//! (an anonymous registry needs none), which a later `401` names. Every
//! credential is registered with the redaction point as it is read.

use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine;

use crate::error::{ObjStoreError, Result};

/// Most bytes of an auth file read.
pub const MAX_AUTH_FILE_BYTES: u64 = 1024 * 1024;

/// Most bytes of a credential helper's answer read.
pub const MAX_HELPER_ANSWER_BYTES: u64 = 64 * 1024;

/// The answer of a helper that holds nothing for the registry.
const HELPER_NOT_FOUND: &str = "credentials not found in native keychain";

/// Where a registry's credentials came from (shown; never a credential).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CredentialSource {
    /// An `auths` entry of this auth file.
    File(PathBuf),
    /// The credential helper `docker-credential-NAME`, named by this file.
    Helper {
        /// `NAME`.
        name: String,
        /// The auth file naming it.
        config: PathBuf,
    },
}

impl std::fmt::Display for CredentialSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CredentialSource::File(p) => write!(f, "{}", p.display()),
            CredentialSource::Helper { name, config } => {
                write!(
                    f,
                    "docker-credential-{name} (named by {})",
                    config.display()
                )
            }
        }
    }
}

/// What a registry's credentials are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CredentialKind {
    /// A user name and password (Basic, or the token realm's Basic).
    Password,
    /// An identity token (`password`): a refresh token for the realm's
    /// OAuth2 `POST`; never sent as Basic.
    IdentityToken,
}

/// The user name a helper answers for an identity token.
const IDENTITY_TOKEN_USER: &str = "<token>";

/// A user name and password, or an identity token, for one registry
/// (never printed).
#[derive(Clone)]
pub struct RegistryCredentials {
    /// The user name (`<token>` for an identity token).
    pub username: String,
    /// The password, or the identity token.
    pub password: String,
    /// Which of the two.
    pub kind: CredentialKind,
    /// Where they came from.
    pub from: CredentialSource,
}

/// What the auth files hold for one registry.
#[derive(Debug, Clone, Default)]
pub struct AuthLookup {
    /// The credentials found, if any.
    pub credentials: Option<RegistryCredentials>,
    /// Auth files skipped because they could not be read or were not JSON:
    /// `FILE: reason` each (never a credential).
    pub unreadable: Vec<String>,
}

/// What one auth file says of one registry.
enum FileEntry {
    Nothing,
    Credentials(RegistryCredentials),
    Helper(String),
    Unreadable(String),
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

/// The credentials the auth files hold for `registry` (`HOST[:PORT]`); a
/// helper is given `timeout` to answer.
pub async fn registry_credentials(registry: &str, timeout: Duration) -> Result<AuthLookup> {
    let mut lookup = AuthLookup::default();
    for file in auth_files() {
        let found = match credentials_in(&file, registry)? {
            FileEntry::Nothing => None,
            FileEntry::Unreadable(reason) => {
                lookup
                    .unreadable
                    .push(format!("{}: {reason}", file.display()));
                None
            }
            FileEntry::Credentials(c) => Some(c),
            FileEntry::Helper(name) => run_helper(&name, &file, registry, timeout).await?,
        };
        if let Some(c) = found {
            register(&c);
            lookup.credentials = Some(c);
            break;
        }
    }
    Ok(lookup)
}

/// Registers `c`'s password with the redaction point, and the Basic
/// header's (and an auth file's `auth`) base64 of the pair: a server
/// echoing it must not print it either.
fn register(c: &RegistryCredentials) {
    ftpipe_secrets::register(&c.password);
    ftpipe_secrets::register(
        &base64::engine::general_purpose::STANDARD.encode(format!("{}:{}", c.username, c.password)),
    );
}

/// What the auth file `path` says of `registry` (a missing file: nothing).
fn credentials_in(path: &Path, registry: &str) -> Result<FileEntry> {
    let bad = |reason: String| ObjStoreError::RegistryAuth {
        registry: registry.to_owned(),
        reason: format!("auth file {}: {reason}", path.display()),
    };
    // The user's own configuration: a link is followed (a Kubernetes
    // secret volume links `config.json` into its `..data`); the file it
    // names must be regular and within the bound.
    let bytes = match ftpipe_fs::bounded::read_bounded(path, MAX_AUTH_FILE_BYTES) {
        Ok(b) => b,
        Err(e) if e.is_not_found() => return Ok(FileEntry::Nothing),
        Err(e) => return Ok(FileEntry::Unreadable(e.to_string())),
    };
    let doc: serde_json::Value = match serde_json::from_slice(&bytes) {
        Ok(doc) => doc,
        Err(e) => return Ok(FileEntry::Unreadable(format!("not JSON: {e}"))),
    };
    let helper = |v: Option<&serde_json::Value>| {
        v.and_then(|v| v.as_str())
            .filter(|n| !n.is_empty())
            .map(str::to_owned)
    };
    let named = doc
        .get("credHelpers")
        .and_then(|h| h.as_object())
        .and_then(|h| h.iter().find(|(key, _)| entry_names(key, registry)))
        .map(|(_, v)| v);
    if let Some(name) = helper(named) {
        return Ok(FileEntry::Helper(name));
    }
    if let Some(c) = auths_entry(&doc, path, registry).map_err(bad)? {
        return Ok(FileEntry::Credentials(c));
    }
    Ok(helper(doc.get("credsStore")).map_or(FileEntry::Nothing, FileEntry::Helper))
}

/// Whether the key `key` of `auths` or `credHelpers` names `registry`.
fn entry_names(key: &str, registry: &str) -> bool {
    let k = key
        .trim_start_matches("https://")
        .trim_start_matches("http://");
    k.split('/').next() == Some(registry)
}

/// The credentials of `registry`'s `auths` entry in `doc`, if it holds any.
fn auths_entry(
    doc: &serde_json::Value,
    path: &Path,
    registry: &str,
) -> std::result::Result<Option<RegistryCredentials>, String> {
    let Some(auths) = doc.get("auths").and_then(|a| a.as_object()) else {
        return Ok(None);
    };
    let Some((key, entry)) = auths.iter().find(|(key, _)| entry_names(key, registry)) else {
        return Ok(None);
    };
    let field = |name: &str| {
        entry
            .get(name)
            .and_then(|v| v.as_str())
            .filter(|v| !v.is_empty())
    };
    if let Some(token) = field("identitytoken") {
        return Ok(Some(RegistryCredentials {
            username: IDENTITY_TOKEN_USER.to_owned(),
            password: token.to_owned(),
            kind: CredentialKind::IdentityToken,
            from: CredentialSource::File(path.to_owned()),
        }));
    }
    let (username, password) = match (field("auth"), field("username"), field("password")) {
        (Some(auth), _, _) => {
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(auth)
                .map_err(|_| format!("auths.{key:?}.auth is not base64"))?;
            let text = String::from_utf8(decoded)
                .map_err(|_| format!("auths.{key:?}.auth is not UTF-8"))?;
            let (u, p) = text
                .split_once(':')
                .ok_or_else(|| format!("auths.{key:?}.auth is not USER:PASSWORD"))?;
            (u.to_owned(), p.to_owned())
        }
        (None, Some(u), Some(p)) => (u.to_owned(), p.to_owned()),
        _ => return Ok(None),
    };
    Ok(Some(RegistryCredentials {
        username,
        password,
        kind: CredentialKind::Password,
        from: CredentialSource::File(path.to_owned()),
    }))
}

/// The helper's answer to `get`.
#[derive(serde::Deserialize)]
#[serde(rename_all = "PascalCase")]
struct HelperAnswer {
    username: String,
    secret: String,
}

/// Runs `docker-credential-NAME get` for `registry` (see the module doc).
async fn run_helper(
    name: &str,
    config: &Path,
    registry: &str,
    timeout: Duration,
) -> Result<Option<RegistryCredentials>> {
    let program = format!("docker-credential-{name}");
    let fail = |reason: String| ObjStoreError::RegistryAuth {
        registry: registry.to_owned(),
        reason: format!(
            "credential helper {program} (named by {}): {reason}",
            config.display()
        ),
    };
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
    {
        return Err(fail("the name is not [A-Za-z0-9._-]".into()));
    }
    let out = helper_output(&program, registry, timeout)
        .await
        .map_err(fail)?;
    if !out.status.success() {
        if String::from_utf8_lossy(&out.stdout).trim() == HELPER_NOT_FOUND {
            return Ok(None);
        }
        return Err(fail(format!(
            "`get` failed ({}; its output is not shown: it may hold a secret)",
            out.status
        )));
    }
    let answer: HelperAnswer = serde_json::from_slice(&out.stdout).map_err(|_| {
        fail(
            "its answer is not {\"Username\",\"Secret\"} JSON (not shown: it may hold a secret)"
                .into(),
        )
    })?;
    ftpipe_secrets::register(&answer.secret);
    if answer.secret.is_empty() {
        return Ok(None);
    }
    let kind = if answer.username == IDENTITY_TOKEN_USER {
        CredentialKind::IdentityToken
    } else {
        CredentialKind::Password
    };
    Ok(Some(RegistryCredentials {
        username: answer.username,
        password: answer.secret,
        kind,
        from: CredentialSource::Helper {
            name: name.to_owned(),
            config: config.to_owned(),
        },
    }))
}

/// `PROGRAM get` with `registry` on stdin: its exit status and stdout
/// (at most [`MAX_HELPER_ANSWER_BYTES`]), within `timeout` (else its
/// process group is killed). Errors never hold its output.
async fn helper_output(
    program: &str,
    registry: &str,
    timeout: Duration,
) -> std::result::Result<std::process::Output, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut child = tokio::process::Command::new(program)
        .arg("get")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot be run ({e}; it must be on PATH)"))?;
    let pid = child.id();
    let talk = async {
        if let Some(mut stdin) = child.stdin.take() {
            // A helper that exits without reading its stdin is judged by
            // its answer, not by the broken pipe.
            let _ = stdin.write_all(registry.as_bytes()).await;
        }
        let mut stdout = Vec::new();
        if let Some(out) = child.stdout.take() {
            out.take(MAX_HELPER_ANSWER_BYTES.saturating_add(1))
                .read_to_end(&mut stdout)
                .await
                .map_err(|e| format!("reading its answer: {e}"))?;
        }
        if stdout.len() as u64 > MAX_HELPER_ANSWER_BYTES {
            return Err(format!(
                "its answer is over {MAX_HELPER_ANSWER_BYTES} bytes"
            ));
        }
        let status = child
            .wait()
            .await
            .map_err(|e| format!("waiting for it: {e}"))?;
        Ok(std::process::Output {
            status,
            stdout,
            stderr: Vec::new(),
        })
    };
    match tokio::time::timeout(timeout, talk).await {
        Ok(r) => r,
        Err(_) => {
            kill_group(pid);
            Err(format!(
                "no answer within {} s (--read-timeout); it was killed",
                timeout.as_secs_f64()
            ))
        }
    }
}

/// Kills the process group the helper leads (a shell helper's children
/// with it).
fn kill_group(pid: Option<u32>) {
    let pid = pid
        .and_then(|p| i32::try_from(p).ok())
        .and_then(rustix::process::Pid::from_raw);
    if let Some(pid) = pid {
        let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
    }
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
        let FileEntry::Credentials(c) = credentials_in(&path, "127.0.0.1:5000").unwrap() else {
            panic!("no credentials");
        };
        assert_eq!(
            (c.username.as_str(), c.password.as_str()),
            ("user", "secret-pass")
        );
        assert!(matches!(
            credentials_in(&path, "127.0.0.1:5001").unwrap(),
            FileEntry::Nothing
        ));
    }
}
