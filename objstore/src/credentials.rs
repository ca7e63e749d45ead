//! Credentials, region and endpoint, resolved as the AWS tools resolve
//! them, so a node that runs `aws s3 cp` runs `ftpipe pull` unchanged:
//!
//! 1. keys: `AWS_ACCESS_KEY_ID` + `AWS_SECRET_ACCESS_KEY` (+
//!    `AWS_SESSION_TOKEN`) from the environment; else the profile
//!    `AWS_PROFILE` (default `default`) of the shared credentials file
//!    (`AWS_SHARED_CREDENTIALS_FILE`, default `~/.aws/credentials`), then
//!    of the config file (`AWS_CONFIG_FILE`, default `~/.aws/config`,
//!    section `[profile NAME]` or `[default]`);
//! 2. region: `AWS_REGION`, `AWS_DEFAULT_REGION`, the profile's `region`
//!    in the config file, else `us-east-1`;
//! 3. endpoint: `--s3-endpoint`, `AWS_ENDPOINT_URL_S3`, `AWS_ENDPOINT_URL`,
//!    the profile's `endpoint_url`, else AWS itself.
//!
//! Every secret is registered with the redaction point
//! ([`ftpipe_secrets::register`]) the moment it is read, before it can
//! reach any error, record or output. A credentials file is read bounded
//! ([`MAX_AWS_FILE_BYTES`]); a malformed line is named by file and line
//! number, never by its text (it may hold a key). An endpoint carrying
//! credentials in its userinfo is refused; plain `http` only for loopback.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use crate::error::{ObjStoreError, Result};

/// Largest shared credentials or config file read.
pub const MAX_AWS_FILE_BYTES: u64 = 1024 * 1024;
/// Region used when nothing names one (as the AWS CLI for S3).
const DEFAULT_REGION: &str = "us-east-1";
/// Longest region name accepted.
const MAX_REGION_LEN: usize = 64;

/// The environment credentials are resolved from (the process's, or a
/// test's).
#[derive(Debug, Clone, Default)]
pub struct Env {
    vars: BTreeMap<String, String>,
}

impl Env {
    /// The process environment (only the variables this module reads).
    pub fn from_process() -> Env {
        Env::from_vars(
            [
                "AWS_ACCESS_KEY_ID",
                "AWS_SECRET_ACCESS_KEY",
                "AWS_SESSION_TOKEN",
                "AWS_PROFILE",
                "AWS_DEFAULT_PROFILE",
                "AWS_REGION",
                "AWS_DEFAULT_REGION",
                "AWS_ENDPOINT_URL",
                "AWS_ENDPOINT_URL_S3",
                "AWS_SHARED_CREDENTIALS_FILE",
                "AWS_CONFIG_FILE",
                "HOME",
            ]
            .into_iter()
            .filter_map(|k| std::env::var(k).ok().map(|v| (k.to_owned(), v))),
        )
    }

    /// An environment of exactly `vars`.
    pub fn from_vars(vars: impl IntoIterator<Item = (String, String)>) -> Env {
        Env {
            vars: vars.into_iter().collect(),
        }
    }

    /// A variable's value, when set and not empty.
    fn get(&self, key: &str) -> Option<&str> {
        self.vars
            .get(key)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }
}

/// Everything needed to talk to one S3-compatible server. Its `Debug`
/// shows no secret.
#[derive(Clone)]
pub struct S3Config {
    /// Endpoint URL (`None`: AWS itself).
    pub endpoint: Option<String>,
    /// Region.
    pub region: String,
    pub(crate) access_key_id: String,
    pub(crate) secret_access_key: String,
    pub(crate) session_token: Option<String>,
    /// Plain `http` allowed (a loopback endpoint).
    pub allow_http: bool,
    /// Where the keys came from (`environment`, or the profile and file).
    pub credentials_from: String,
    /// No byte for this long (waiting for an answer's head or inside its
    /// body) ends a request: the stall rule every source keeps
    /// (`--read-timeout`; [`DEFAULT_READ_TIMEOUT`] until a command sets it).
    pub read_timeout: std::time::Duration,
}

/// The read timeout of a configuration nobody set one for: the hub
/// fetch's default.
pub const DEFAULT_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

impl fmt::Debug for S3Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("S3Config")
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("credentials_from", &self.credentials_from)
            .field("allow_http", &self.allow_http)
            .field("read_timeout", &self.read_timeout)
            .finish_non_exhaustive()
    }
}

/// One INI-style file: section name → key → value.
type Sections = BTreeMap<String, BTreeMap<String, String>>;

fn cred_err(reason: impl Into<String>) -> ObjStoreError {
    ObjStoreError::Credentials {
        reason: reason.into(),
    }
}

/// Reads and parses an AWS shared file; `None` when it does not exist.
fn read_sections(path: &Path) -> Result<Option<Sections>> {
    let bytes = match ftpipe_fs::bounded::read_bounded(path, MAX_AWS_FILE_BYTES) {
        Ok(b) => b,
        Err(e) if e.is_not_found() => return Ok(None),
        Err(source) => {
            return Err(ObjStoreError::CredentialsFile {
                path: path.to_owned(),
                source,
            });
        }
    };
    let text = String::from_utf8(bytes)
        .map_err(|_| cred_err(format!("{} is not UTF-8 text", path.display())))?;
    let mut sections = Sections::new();
    let mut current: Option<String> = None;
    for (n, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            let name = name.trim().to_owned();
            sections.entry(name.clone()).or_default();
            current = Some(name);
            continue;
        }
        // Never quote the line: it may hold a key.
        let malformed = || {
            cred_err(format!(
                "{} line {}: expected `[section]` or `key = value`",
                path.display(),
                n + 1
            ))
        };
        let (k, v) = line.split_once('=').ok_or_else(malformed)?;
        let section = current.as_ref().ok_or_else(malformed)?;
        let (k, v) = (k.trim(), v.trim());
        if k.starts_with("aws_") && k.contains("secret") || k == "aws_session_token" {
            ftpipe_secrets::register(v);
        }
        sections
            .entry(section.clone())
            .or_default()
            .insert(k.to_owned(), v.to_owned());
    }
    Ok(Some(sections))
}

/// The profile's keys in `sections` under `section`, when it has both.
fn keys_in(sections: &Sections, section: &str) -> Result<Option<(String, String, Option<String>)>> {
    let Some(s) = sections.get(section) else {
        return Ok(None);
    };
    let id = s.get("aws_access_key_id").filter(|v| !v.is_empty());
    let secret = s.get("aws_secret_access_key").filter(|v| !v.is_empty());
    match (id, secret) {
        (Some(id), Some(secret)) => Ok(Some((
            id.clone(),
            secret.clone(),
            s.get("aws_session_token")
                .filter(|v| !v.is_empty())
                .cloned(),
        ))),
        (None, None) => Ok(None),
        (Some(_), None) => Err(cred_err(format!(
            "section [{section}] has aws_access_key_id but no aws_secret_access_key"
        ))),
        (None, Some(_)) => Err(cred_err(format!(
            "section [{section}] has aws_secret_access_key but no aws_access_key_id"
        ))),
    }
}

/// An access key id, its secret access key and a session token.
type Keys = (String, String, Option<String>);

/// The AWS shared files of a profile: where they are and what they hold.
struct SharedFiles<'a> {
    /// `AWS_PROFILE` or, else, `AWS_DEFAULT_PROFILE`, when set.
    explicit_profile: Option<&'a str>,
    /// The explicit profile, else `default`.
    profile: &'a str,
    /// The profile's section in the config file: `[profile NAME]`, or
    /// `[default]`.
    config_section: String,
    creds_path: Option<PathBuf>,
    config_path: Option<PathBuf>,
    /// The credentials file's sections, `None` when it does not exist.
    creds_file: Option<Sections>,
    /// The config file's sections, `None` when it does not exist.
    config_file: Option<Sections>,
}

impl<'a> SharedFiles<'a> {
    /// Finds and reads the credentials file, then the config file, of the
    /// profile `env` names.
    fn read(env: &'a Env) -> Result<SharedFiles<'a>> {
        let home = env.get("HOME").map(PathBuf::from);
        let in_home = |rel: &str| home.as_ref().map(|h| h.join(rel));
        let creds_path = env
            .get("AWS_SHARED_CREDENTIALS_FILE")
            .map(PathBuf::from)
            .or_else(|| in_home(".aws/credentials"));
        let config_path = env
            .get("AWS_CONFIG_FILE")
            .map(PathBuf::from)
            .or_else(|| in_home(".aws/config"));
        let explicit_profile = env
            .get("AWS_PROFILE")
            .or_else(|| env.get("AWS_DEFAULT_PROFILE"));
        let profile = explicit_profile.unwrap_or("default");
        let config_section = if profile == "default" {
            "default".to_owned()
        } else {
            format!("profile {profile}")
        };
        let creds_file = match &creds_path {
            Some(p) => read_sections(p)?,
            None => None,
        };
        let config_file = match &config_path {
            Some(p) => read_sections(p)?,
            None => None,
        };
        Ok(SharedFiles {
            explicit_profile,
            profile,
            config_section,
            creds_path,
            config_path,
            creds_file,
            config_file,
        })
    }

    /// The profile's `key` in the config file, when set and not empty.
    fn config_value(&self, key: &str) -> Option<String> {
        self.config_file
            .as_ref()
            .and_then(|c| c.get(&self.config_section))
            .and_then(|s| s.get(key))
            .filter(|v| !v.is_empty())
            .cloned()
    }

    /// The keys to use and where they came from: `env_keys`, else the
    /// profile's in the credentials file, else in the config file; none is
    /// an error naming both files.
    fn choose_keys(&self, env_keys: Option<Keys>) -> Result<(Keys, String)> {
        let profile = self.profile;
        let (creds, config) = (
            show_path(self.creds_path.as_deref()),
            show_path(self.config_path.as_deref()),
        );
        if let Some(k) = env_keys {
            return Ok((k, "environment".to_owned()));
        }
        if let Some(c) = &self.creds_file
            && let Some(k) = keys_in(c, profile)?
        {
            return Ok((k, format!("profile {profile} in {creds}")));
        }
        if let Some(c) = &self.config_file
            && let Some(k) = keys_in(c, &self.config_section)?
        {
            return Ok((k, format!("profile {profile} in {config}")));
        }
        Err(cred_err(match self.explicit_profile {
            Some(p) => format!(
                "profile {p} (AWS_PROFILE) has no aws_access_key_id and aws_secret_access_key in {creds} or {config}"
            ),
            None => format!(
                "none found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE with keys in {creds} or {config}"
            ),
        }))
    }
}

/// A shared file's path for messages.
fn show_path(p: Option<&Path>) -> String {
    p.map_or_else(|| "(no HOME)".to_owned(), |p| p.display().to_string())
}

/// The keys in `env`, when both the id and the secret are set; one
/// without the other is an error.
fn env_keys(env: &Env) -> Result<Option<Keys>> {
    match (
        env.get("AWS_ACCESS_KEY_ID"),
        env.get("AWS_SECRET_ACCESS_KEY"),
    ) {
        (Some(id), Some(secret)) => Ok(Some((
            id.to_owned(),
            secret.to_owned(),
            env.get("AWS_SESSION_TOKEN").map(str::to_owned),
        ))),
        (Some(_), None) => Err(cred_err(
            "AWS_ACCESS_KEY_ID is set but AWS_SECRET_ACCESS_KEY is not",
        )),
        (None, Some(_)) => Err(cred_err(
            "AWS_SECRET_ACCESS_KEY is set but AWS_ACCESS_KEY_ID is not",
        )),
        (None, None) => Ok(None),
    }
}

/// The region: `AWS_REGION`, `AWS_DEFAULT_REGION`, the profile's
/// `region`, else [`DEFAULT_REGION`]; checked to be a region name.
fn resolve_region(env: &Env, files: &SharedFiles<'_>) -> Result<String> {
    let region = env
        .get("AWS_REGION")
        .or_else(|| env.get("AWS_DEFAULT_REGION"))
        .map(str::to_owned)
        .or_else(|| files.config_value("region"))
        .unwrap_or_else(|| DEFAULT_REGION.to_owned());
    if region.is_empty()
        || region.len() > MAX_REGION_LEN
        || !region
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-')
    {
        return Err(cred_err(format!(
            "region {region:?}: expected letters, digits and '-' (e.g. us-east-1)"
        )));
    }
    Ok(region)
}

/// The endpoint (`given`, `AWS_ENDPOINT_URL_S3`, `AWS_ENDPOINT_URL`, the
/// profile's `endpoint_url`, else `None`: AWS itself), checked, and
/// whether it is plain `http`.
fn resolve_endpoint(
    env: &Env,
    given: Option<&str>,
    files: &SharedFiles<'_>,
) -> Result<(Option<String>, bool)> {
    let endpoint = given
        .map(str::to_owned)
        .or_else(|| env.get("AWS_ENDPOINT_URL_S3").map(str::to_owned))
        .or_else(|| env.get("AWS_ENDPOINT_URL").map(str::to_owned))
        .or_else(|| files.config_value("endpoint_url"));
    match endpoint {
        Some(e) => {
            let (e, http) = check_endpoint(&e)?;
            Ok((Some(e), http))
        }
        None => Ok((None, false)),
    }
}

impl S3Config {
    /// This configuration with `read_timeout` as its stall rule.
    pub fn with_read_timeout(mut self, read_timeout: std::time::Duration) -> S3Config {
        self.read_timeout = read_timeout;
        self
    }

    /// Resolves credentials, region and endpoint from `env` (see the module
    /// doc); `endpoint` is `--s3-endpoint`. Every secret found is
    /// registered with the redaction point.
    pub fn resolve(env: &Env, endpoint: Option<&str>) -> Result<S3Config> {
        for k in [
            "AWS_SECRET_ACCESS_KEY",
            "AWS_SESSION_TOKEN",
            "AWS_ACCESS_KEY_ID",
        ] {
            if let Some(v) = env.get(k) {
                ftpipe_secrets::register(v);
            }
        }
        let files = SharedFiles::read(env)?;
        let (keys, from) = files.choose_keys(env_keys(env)?)?;
        let (access_key_id, secret_access_key, session_token) = keys;
        for v in [&access_key_id, &secret_access_key]
            .into_iter()
            .chain(session_token.as_ref())
        {
            ftpipe_secrets::register(v);
        }
        let region = resolve_region(env, &files)?;
        let (endpoint, allow_http) = resolve_endpoint(env, endpoint, &files)?;
        Ok(S3Config {
            endpoint,
            region,
            access_key_id,
            secret_access_key,
            session_token,
            allow_http,
            credentials_from: from,
            read_timeout: DEFAULT_READ_TIMEOUT,
        })
    }
}

/// Why an endpoint holding `user:password@` is refused.
const CREDENTIALS_IN_URL: &str = "credentials in the endpoint URL are refused (and not \
     shown); use AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE";

/// The endpoint without a trailing `/`, and whether it is plain `http`
/// (allowed only for a loopback host). Credentials in the userinfo are
/// refused, not stripped: they would be sent nowhere and the user would not
/// learn which keys were used.
fn check_endpoint(given: &str) -> Result<(String, bool)> {
    let bad = |reason: &str| ObjStoreError::BadEndpoint {
        endpoint: ftpipe_secrets::redact(given).into_owned(),
        reason: reason.to_owned(),
    };
    // Before the URL is parsed: a URL that does not parse (a bad port) must
    // not echo its userinfo either.
    if ftpipe_secrets::has_userinfo(given) {
        return Err(bad(CREDENTIALS_IN_URL));
    }
    let url = url::Url::parse(given).map_err(|e| bad(&format!("not a URL: {e}")))?;
    if !url.username().is_empty() || url.password().is_some() {
        if let Some(p) = url.password() {
            ftpipe_secrets::register(p);
        }
        return Err(ObjStoreError::BadEndpoint {
            endpoint: format!("{}://{}", url.scheme(), url.host_str().unwrap_or("")),
            reason: CREDENTIALS_IN_URL.into(),
        });
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(bad("an endpoint has no query or fragment"));
    }
    let host = url.host().ok_or_else(|| bad("no host"))?;
    let loopback = match host {
        url::Host::Domain(d) => d == "localhost",
        url::Host::Ipv4(a) => a.is_loopback(),
        url::Host::Ipv6(a) => a.is_loopback(),
    };
    let http = match url.scheme() {
        "https" => false,
        "http" if loopback => true,
        "http" => {
            return Err(bad(
                "plain http is allowed only for a loopback host (127.0.0.1, ::1, localhost); use https",
            ));
        }
        _ => return Err(bad("expected an http(s) URL")),
    };
    Ok((given.trim_end_matches('/').to_owned(), http))
}

/// Resolves the credentials of the process environment only to register
/// them with the redaction point (for the bundle guard of `audit`); a
/// failure to resolve is not an error here.
pub fn register_credentials_from_env() {
    let _ = S3Config::resolve(&Env::from_process(), None);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Env {
        Env::from_vars(
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
        )
    }

    #[test]
    fn environment_keys_win_and_are_registered() {
        let c = S3Config::resolve(
            &env(&[
                ("AWS_ACCESS_KEY_ID", "AKIAENVKEYID0000001"),
                ("AWS_SECRET_ACCESS_KEY", "env-secret-value-0001"),
                ("AWS_REGION", "eu-west-1"),
            ]),
            Some("http://127.0.0.1:9000/"),
        )
        .unwrap();
        assert_eq!(c.region, "eu-west-1");
        assert_eq!(c.endpoint.as_deref(), Some("http://127.0.0.1:9000"));
        assert!(c.allow_http);
        assert!(ftpipe_secrets::contains_secret(
            b"x env-secret-value-0001 y"
        ));
        assert!(!format!("{c:?}").contains("env-secret-value-0001"));
    }

    #[test]
    fn a_profile_from_the_shared_files() {
        let dir = tempfile::tempdir().unwrap();
        let creds = dir.path().join("credentials");
        let config = dir.path().join("config");
        std::fs::write(
            &creds,
            "[default]\naws_access_key_id = AKIADEFAULT000000001\naws_secret_access_key = default-secret-0001\n\n[ci]\naws_access_key_id=AKIACI00000000000001\naws_secret_access_key=ci-profile-secret-0001\naws_session_token=ci-session-token-0001\n",
        )
        .unwrap();
        std::fs::write(
            &config,
            "[profile ci]\nregion = ap-south-1\nendpoint_url = http://localhost:4566\n",
        )
        .unwrap();
        let c = S3Config::resolve(
            &env(&[
                ("AWS_PROFILE", "ci"),
                ("AWS_SHARED_CREDENTIALS_FILE", creds.to_str().unwrap()),
                ("AWS_CONFIG_FILE", config.to_str().unwrap()),
            ]),
            None,
        )
        .unwrap();
        assert_eq!(c.region, "ap-south-1");
        assert_eq!(c.access_key_id, "AKIACI00000000000001");
        assert_eq!(c.session_token.as_deref(), Some("ci-session-token-0001"));
        assert_eq!(c.endpoint.as_deref(), Some("http://localhost:4566"));
        assert!(ftpipe_secrets::contains_secret(b"ci-profile-secret-0001"));
        assert!(ftpipe_secrets::contains_secret(b"ci-session-token-0001"));
    }

    #[test]
    fn missing_or_half_credentials_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().to_str().unwrap();
        let e = S3Config::resolve(&env(&[("HOME", home)]), None).unwrap_err();
        assert!(e.to_string().contains("AWS_ACCESS_KEY_ID"), "{e}");
        let e = S3Config::resolve(
            &env(&[("HOME", home), ("AWS_ACCESS_KEY_ID", "AKIAX")]),
            None,
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("AWS_SECRET_ACCESS_KEY is not"),
            "{e}"
        );
        let e =
            S3Config::resolve(&env(&[("HOME", home), ("AWS_PROFILE", "nope")]), None).unwrap_err();
        assert!(e.to_string().contains("profile nope"), "{e}");
        let bad = dir.path().join("bad");
        std::fs::write(&bad, "[default]\nthis line holds a-secret-like-value\n").unwrap();
        let e = S3Config::resolve(
            &env(&[("AWS_SHARED_CREDENTIALS_FILE", bad.to_str().unwrap())]),
            None,
        )
        .unwrap_err();
        assert!(e.to_string().contains("line 2"), "{e}");
        assert!(!e.to_string().contains("a-secret-like-value"), "{e}");
    }

    #[test]
    fn endpoints_with_credentials_or_remote_http_are_refused() {
        let keys = [
            ("AWS_ACCESS_KEY_ID", "AKIAENDPOINT00000001"),
            ("AWS_SECRET_ACCESS_KEY", "endpoint-secret-0001"),
        ];
        let e = S3Config::resolve(
            &env(&keys),
            Some("http://user:pass-word-0001@127.0.0.1:9000"),
        )
        .unwrap_err();
        assert!(!e.to_string().contains("pass-word-0001"), "{e}");
        assert!(e.to_string().contains("credentials in the endpoint"), "{e}");
        let e = S3Config::resolve(&env(&keys), Some("http://s3.example.com")).unwrap_err();
        assert!(e.to_string().contains("loopback"), "{e}");
        let c = S3Config::resolve(&env(&keys), Some("https://s3.example.com")).unwrap();
        assert!(!c.allow_http);
    }
}
