//! Credentials, region and endpoint, resolved by the AWS SDK's own default
//! chain (`aws-config`), so a node or pod that runs `aws s3 cp` runs
//! `ftpipe pull` unchanged:
//!
//! 1. credentials, the first source that has them: the environment
//!    (`AWS_ACCESS_KEY_ID` + `AWS_SECRET_ACCESS_KEY` [+
//!    `AWS_SESSION_TOKEN`]); the profile `AWS_PROFILE` (default `default`)
//!    of the shared credentials and config files (static keys,
//!    `credential_process`, SSO, `role_arn` with a source profile or web
//!    identity); web identity (`AWS_WEB_IDENTITY_TOKEN_FILE` +
//!    `AWS_ROLE_ARN`, exchanged at STS: how EKS pods get credentials);
//!    container credentials (ECS, EKS Pod Identity); the instance profile
//!    (IMDSv2). Temporary credentials are refreshed before they expire.
//! 2. region: `AWS_REGION`, `AWS_DEFAULT_REGION`, the profile's `region`,
//!    the instance's, else `us-east-1`;
//! 3. endpoint: `--s3-endpoint`, `AWS_ENDPOINT_URL_S3`, `AWS_ENDPOINT_URL`,
//!    the profile's `services` section or `endpoint_url`, else AWS itself.
//!
//! `object_store` still makes every S3 request: [`ChainCredentials`]
//! adapts the chain to its `CredentialProvider`. Every credential is
//! registered with the redaction point ([`ftpipe_secrets::register`]) the
//! moment it is obtained, before it can reach any error, record or output.
//! An endpoint carrying credentials in its userinfo is refused; plain `http`
//! is accepted (to any host: in-cluster object storage), and
//! [`S3Config::unencrypted_warning`] says when the traffic leaves the
//! machine unencrypted.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use aws_config::BehaviorVersion;
use aws_credential_types::Credentials;
use aws_credential_types::credential_feature::AwsCredentialFeature;
use aws_credential_types::provider::error::CredentialsError;
use aws_credential_types::provider::{ProvideCredentials, SharedCredentialsProvider};
use aws_types::service_config::ServiceConfigKey;
use object_store::CredentialProvider;
use object_store::aws::AwsCredential;

use crate::error::{ObjStoreError, Result};

/// Region used when nothing names one (as the AWS CLI for S3).
const DEFAULT_REGION: &str = "us-east-1";
/// Longest region name accepted.
const MAX_REGION_LEN: usize = 64;
/// Temporary credentials are renewed this long before they expire (a
/// request signed with them must still be valid when the server reads it).
const REFRESH_BEFORE_EXPIRY: Duration = Duration::from_secs(5 * 60);

/// How the endpoint is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// `https`.
    Https,
    /// Plain `http` to this machine (loopback): nothing crosses a network.
    LoopbackHttp,
    /// Plain `http` to another host: requests (signed, not encrypted) and
    /// bodies cross the network in the clear.
    RemoteHttp,
}

/// Everything needed to talk to one S3-compatible server. Its `Debug`
/// shows no secret.
#[derive(Clone)]
pub struct S3Config {
    /// Endpoint URL (`None`: AWS itself).
    pub endpoint: Option<String>,
    /// Region.
    pub region: String,
    pub(crate) credentials: Arc<ChainCredentials>,
    /// How the endpoint is reached (plain `http` or not).
    pub transport: Transport,
    /// Where the credentials came from (`environment`, `profile NAME`,
    /// `web identity`, ...).
    pub credentials_from: String,
    /// No byte for this long (waiting for an answer's head or inside its
    /// body) ends a request: the stall rule every source keeps
    /// (`--read-timeout`; [`DEFAULT_READ_TIMEOUT`] until a command sets it).
    pub read_timeout: Duration,
}

/// The read timeout of a configuration nobody set one for: the hub
/// fetch's default.
pub const DEFAULT_READ_TIMEOUT: Duration = Duration::from_secs(30);

impl fmt::Debug for S3Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("S3Config")
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("credentials_from", &self.credentials_from)
            .field("transport", &self.transport)
            .field("read_timeout", &self.read_timeout)
            .finish_non_exhaustive()
    }
}

/// The AWS default credential chain as `object_store`'s credential
/// provider: asks the chain when it holds nothing or what it holds is about
/// to expire, registers every credential with the redaction point.
#[derive(Debug)]
pub(crate) struct ChainCredentials {
    chain: SharedCredentialsProvider,
    held: tokio::sync::Mutex<Option<Held>>,
    /// How long one ask of the chain may take (an STS, container or
    /// metadata endpoint that stalls, a `credential_process` that never
    /// answers): the read timeout.
    wait: Duration,
}

/// Credentials obtained from the chain, and when they stop working.
#[derive(Debug)]
struct Held {
    credential: Arc<AwsCredential>,
    expires: Option<SystemTime>,
}

impl Held {
    fn fresh(&self) -> bool {
        self.expires.is_none_or(|t| {
            t.duration_since(SystemTime::now())
                .is_ok_and(|left| left > REFRESH_BEFORE_EXPIRY)
        })
    }
}

impl ChainCredentials {
    fn new(chain: SharedCredentialsProvider, wait: Duration) -> ChainCredentials {
        ChainCredentials {
            chain,
            held: tokio::sync::Mutex::new(None),
            wait,
        }
    }

    /// Asks the chain (not what is held); the answer is held in `held` and
    /// its secrets registered.
    async fn renew(
        &self,
        held: &mut Option<Held>,
    ) -> std::result::Result<(Credentials, Arc<AwsCredential>), CredentialsError> {
        let c = tokio::time::timeout(self.wait, self.chain.provide_credentials())
            .await
            .map_err(|_| CredentialsError::provider_timed_out(self.wait))??;
        for v in [c.access_key_id(), c.secret_access_key()]
            .into_iter()
            .chain(c.session_token())
        {
            ftpipe_secrets::register(v);
        }
        let credential = Arc::new(AwsCredential {
            key_id: c.access_key_id().to_owned(),
            secret_key: c.secret_access_key().to_owned(),
            token: c.session_token().map(str::to_owned),
        });
        *held = Some(Held {
            credential: Arc::clone(&credential),
            expires: c.expiry(),
        });
        Ok((c, credential))
    }

    /// Asks the chain now (when the command starts).
    async fn first(&self) -> std::result::Result<Credentials, CredentialsError> {
        let mut held = self.held.lock().await;
        self.renew(&mut held).await.map(|(c, _)| c)
    }
}

#[async_trait::async_trait]
impl CredentialProvider for ChainCredentials {
    type Credential = AwsCredential;

    /// What is held while it is fresh; else the chain's answer. The lock
    /// is held while the chain is asked, so the requests in flight when
    /// credentials near their expiry make one renewal, not one each.
    async fn get_credential(&self) -> object_store::Result<Arc<AwsCredential>> {
        let mut held = self.held.lock().await;
        if let Some(h) = held.as_ref().filter(|h| h.fresh()) {
            return Ok(Arc::clone(&h.credential));
        }
        self.renew(&mut held)
            .await
            .map(|(_, credential)| credential)
            .map_err(|e| object_store::Error::Unauthenticated {
                path: String::new(),
                source: Box::new(std::io::Error::other(format!(
                    "renewing S3 credentials: {}",
                    error_chain(&e)
                ))),
            })
    }
}

/// An error and its causes, `: `-separated, with every registered secret
/// redacted.
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = String::new();
    let mut cur = Some(e);
    while let Some(e) = cur {
        let text = e.to_string();
        if !out.ends_with(&text) {
            if !out.is_empty() {
                out.push_str(": ");
            }
            out.push_str(&text);
        }
        cur = e.source();
    }
    ftpipe_secrets::redact(&out).into_owned()
}

/// A process environment variable, when set and not empty.
fn env_var(key: &str) -> Option<String> {
    std::env::var(key).ok().filter(|v| !v.is_empty())
}

/// Registers the secrets of the environment with the redaction point and
/// refuses a half pair of keys (the SDK's chain would pass over it
/// silently to the next source).
fn check_environment_keys() -> Result<()> {
    for k in [
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_ACCESS_KEY_ID",
    ] {
        if let Some(v) = env_var(k) {
            ftpipe_secrets::register(&v);
        }
    }
    match (
        env_var("AWS_ACCESS_KEY_ID"),
        env_var("AWS_SECRET_ACCESS_KEY"),
    ) {
        (Some(_), None) => Err(ObjStoreError::Credentials {
            reason: "AWS_ACCESS_KEY_ID is set but AWS_SECRET_ACCESS_KEY is not".into(),
        }),
        (None, Some(_)) => Err(ObjStoreError::Credentials {
            reason: "AWS_SECRET_ACCESS_KEY is set but AWS_ACCESS_KEY_ID is not".into(),
        }),
        _ => Ok(()),
    }
}

/// The most bytes a shared AWS credentials or config file may hold: the
/// chain's parser reads it whole, so its size is checked first.
pub const MAX_SHARED_FILE_BYTES: u64 = 1 << 20;
/// The most bytes a web identity token file may hold (a projected service
/// account token is a few kB).
pub const MAX_WEB_IDENTITY_TOKEN_BYTES: u64 = 64 << 10;

/// The files the chain will read whole, each with its limit: the shared
/// credentials and config files (`AWS_SHARED_CREDENTIALS_FILE`,
/// `AWS_CONFIG_FILE`, else under `~/.aws`) and the web identity token.
fn files_the_chain_reads() -> Vec<(String, u64)> {
    let home = env_var("HOME").unwrap_or_default();
    let mut files = vec![
        (
            env_var("AWS_SHARED_CREDENTIALS_FILE")
                .unwrap_or_else(|| format!("{home}/.aws/credentials")),
            MAX_SHARED_FILE_BYTES,
        ),
        (
            env_var("AWS_CONFIG_FILE").unwrap_or_else(|| format!("{home}/.aws/config")),
            MAX_SHARED_FILE_BYTES,
        ),
    ];
    if let Some(token) = env_var("AWS_WEB_IDENTITY_TOKEN_FILE") {
        files.push((token, MAX_WEB_IDENTITY_TOKEN_BYTES));
    }
    files
}

/// Refuses, before the chain reads them, a file of
/// [`files_the_chain_reads`] that is not a regular file (a FIFO nobody
/// writes would block the chain's read) or holds more than its limit. The
/// files may be links (a Kubernetes secret mount is one): the file a link
/// names is checked. A missing file is the chain's to skip.
fn check_files_the_chain_reads() -> Result<()> {
    let mut problems = Vec::new();
    for (path, max) in files_the_chain_reads() {
        let meta = match std::fs::metadata(&path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => {
                problems.push(format!("{path}: {e}"));
                continue;
            }
        };
        if !meta.is_file() {
            problems.push(format!("{path}: not a regular file"));
        } else if meta.len() > max {
            problems.push(format!(
                "{path}: {} bytes, at most {max} are read",
                meta.len()
            ));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(ObjStoreError::Credentials {
            reason: problems.join("; "),
        })
    }
}

/// The region the chain found, else [`DEFAULT_REGION`]; checked to be a
/// region name.
fn checked_region(found: Option<&str>) -> Result<String> {
    let region = found.unwrap_or(DEFAULT_REGION).to_owned();
    if region.is_empty()
        || region.len() > MAX_REGION_LEN
        || !region
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-')
    {
        return Err(ObjStoreError::Credentials {
            reason: format!("region {region:?}: expected letters, digits and '-' (e.g. us-east-1)"),
        });
    }
    Ok(region)
}

/// The S3 endpoint the AWS configuration names (`AWS_ENDPOINT_URL_S3`,
/// `AWS_ENDPOINT_URL`, the profile's `services` section, its
/// `endpoint_url`), as the SDK's S3 client would find it.
fn configured_endpoint(sdk: &aws_types::SdkConfig) -> Option<String> {
    let key = ServiceConfigKey::builder()
        .service_id("S3")
        .env("AWS_ENDPOINT_URL")
        .profile("endpoint_url")
        .build()
        .ok()?;
    sdk.service_config()
        .and_then(|c| c.load_config(key))
        .or_else(|| sdk.endpoint_url().map(str::to_owned))
        .filter(|e| !e.is_empty())
}

/// The source of `c`, from the marks the SDK's providers leave on what
/// they return.
fn source_of(c: &Credentials) -> String {
    let profile = env_var("AWS_PROFILE").unwrap_or_else(|| "default".to_owned());
    let marks = c
        .get_property::<Vec<AwsCredentialFeature>>()
        .cloned()
        .unwrap_or_default();
    let has = |f: &AwsCredentialFeature| marks.contains(f);
    use AwsCredentialFeature as F;
    if has(&F::CredentialsEnvVars) {
        "environment".to_owned()
    } else if has(&F::CredentialsProfileStsWebIdToken) || has(&F::CredentialsStsAssumeRoleWebId) {
        if env_var("AWS_WEB_IDENTITY_TOKEN_FILE").is_some() {
            "web identity (AWS_WEB_IDENTITY_TOKEN_FILE, AWS_ROLE_ARN)".to_owned()
        } else {
            format!("profile {profile} (web identity)")
        }
    } else if has(&F::CredentialsProfileProcess) || has(&F::CredentialsProcess) {
        format!("profile {profile} (credential_process)")
    } else if has(&F::CredentialsSso) || has(&F::CredentialsProfileSso) {
        format!("profile {profile} (sso)")
    } else if has(&F::CredentialsStsAssumeRole) {
        format!("profile {profile} (role_arn)")
    } else if has(&F::CredentialsProfile) {
        format!("profile {profile}")
    } else if has(&F::CredentialsHttp) {
        "container credentials".to_owned()
    } else if has(&F::CredentialsImds) {
        "instance profile (IMDSv2)".to_owned()
    } else {
        "the AWS default credential chain".to_owned()
    }
}

/// Each source of the default chain, in its order, and what of it this
/// process's environment sets: the message of "none found".
fn sources_tried() -> Vec<String> {
    let unset = |keys: &[&str]| -> Vec<String> {
        keys.iter()
            .filter(|k| env_var(k).is_none())
            .map(|k| (*k).to_owned())
            .collect()
    };
    let state = |keys: &[&str]| match unset(keys) {
        u if u.is_empty() => "set, but gave no credentials".to_owned(),
        u => format!("{} not set", u.join(" and ")),
    };
    let profile = env_var("AWS_PROFILE").unwrap_or_else(|| "default".to_owned());
    let home = env_var("HOME").unwrap_or_else(|| "~".to_owned());
    let creds_file = env_var("AWS_SHARED_CREDENTIALS_FILE")
        .unwrap_or_else(|| format!("{home}/.aws/credentials"));
    let config_file = env_var("AWS_CONFIG_FILE").unwrap_or_else(|| format!("{home}/.aws/config"));
    let container = [
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    ];
    let container = if unset(&container).len() == container.len() {
        "neither AWS_CONTAINER_CREDENTIALS_FULL_URI nor AWS_CONTAINER_CREDENTIALS_RELATIVE_URI set"
            .to_owned()
    } else {
        "set, but gave no credentials".to_owned()
    };
    let imds_disabled =
        env_var("AWS_EC2_METADATA_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"));
    vec![
        format!(
            "environment: {}",
            state(&["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"])
        ),
        format!(
            "profile {profile} in {creds_file} and {config_file}: no keys, credential_process, sso or role_arn"
        ),
        format!(
            "web identity: {}",
            state(&["AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN"])
        ),
        format!("container credentials: {container}"),
        format!(
            "instance profile (IMDSv2): {}",
            if imds_disabled {
                "disabled by AWS_EC2_METADATA_DISABLED"
            } else {
                "no answer from the instance metadata service"
            }
        ),
    ]
}

/// The error of a chain that gave no credentials: the sources it tried
/// when none had any, else the one that failed and why.
fn chain_error(e: &CredentialsError) -> ObjStoreError {
    match e {
        CredentialsError::CredentialsNotLoaded(_) => ObjStoreError::NoCredentials {
            tried: sources_tried(),
        },
        e => ObjStoreError::Credentials {
            reason: error_chain(e),
        },
    }
}

impl S3Config {
    /// Resolves credentials, region and endpoint the AWS way (see the
    /// module doc); `endpoint` is `--s3-endpoint`. The credentials are
    /// obtained once here, so that none found is an error before any
    /// request; every secret found is registered with the redaction point.
    /// Loading the chain and each ask of it (now and at every renewal)
    /// ends at `read_timeout`, which is also the configuration's.
    pub async fn resolve(endpoint: Option<&str>, read_timeout: Duration) -> Result<S3Config> {
        // A given endpoint is checked before anything is read or asked.
        let given = endpoint.map(check_endpoint).transpose()?;
        check_environment_keys()?;
        check_files_the_chain_reads()?;
        let sdk = tokio::time::timeout(
            read_timeout,
            aws_config::defaults(BehaviorVersion::latest()).load(),
        )
        .await
        .map_err(|_| ObjStoreError::Credentials {
            reason: format!(
                "loading the AWS configuration took longer than the read timeout ({read_timeout:?})"
            ),
        })?;
        let region = checked_region(sdk.region().map(|r| r.as_ref()))?;
        let (endpoint, transport) = match given {
            Some((e, t)) => (Some(e), t),
            None => match configured_endpoint(&sdk) {
                Some(e) => {
                    let (e, t) = check_endpoint(&e)?;
                    (Some(e), t)
                }
                None => (None, Transport::Https),
            },
        };
        let chain = sdk
            .credentials_provider()
            .ok_or_else(|| ObjStoreError::NoCredentials {
                tried: sources_tried(),
            })?;
        let credentials = ChainCredentials::new(chain, read_timeout);
        let first = credentials.first().await.map_err(|e| chain_error(&e))?;
        Ok(S3Config {
            endpoint,
            region,
            credentials: Arc::new(credentials),
            transport,
            credentials_from: source_of(&first),
            read_timeout,
        })
    }

    /// A configuration with fixed keys (no chain: for a caller that holds
    /// them itself), `endpoint` checked as `--s3-endpoint` is; the keys are
    /// registered with the redaction point.
    pub fn from_keys(
        endpoint: Option<&str>,
        region: &str,
        access_key_id: &str,
        secret_access_key: &str,
    ) -> Result<S3Config> {
        ftpipe_secrets::register(access_key_id);
        ftpipe_secrets::register(secret_access_key);
        let (endpoint, transport) = match endpoint.map(check_endpoint).transpose()? {
            Some((e, t)) => (Some(e), t),
            None => (None, Transport::Https),
        };
        let keys = Credentials::new(access_key_id, secret_access_key, None, None, "ftpipe");
        Ok(S3Config {
            endpoint,
            region: checked_region(Some(region))?,
            credentials: Arc::new(ChainCredentials::new(
                SharedCredentialsProvider::new(keys),
                DEFAULT_READ_TIMEOUT,
            )),
            transport,
            credentials_from: "given keys".to_owned(),
            read_timeout: DEFAULT_READ_TIMEOUT,
        })
    }

    /// Whether requests may go over plain `http`.
    pub fn allow_http(&self) -> bool {
        self.transport != Transport::Https
    }

    /// The warning to show when the endpoint is plain `http` to another
    /// host, `None` otherwise.
    pub fn unencrypted_warning(&self) -> Option<String> {
        match (&self.endpoint, self.transport) {
            (Some(e), Transport::RemoteHttp) => Some(format!(
                "S3 endpoint {e} is plain http: requests and object bytes cross the network unencrypted (use https where the server offers it)"
            )),
            _ => None,
        }
    }
}

/// Why an endpoint holding `user:password@` is refused.
const CREDENTIALS_IN_URL: &str = "credentials in the endpoint URL are refused (and not \
     shown); use AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE";

/// The endpoint without a trailing `/`, and how it is reached. Credentials
/// in the userinfo are refused, not stripped: they would be sent nowhere
/// and the user would not learn which keys were used.
fn check_endpoint(given: &str) -> Result<(String, Transport)> {
    let bad = |reason: &str| ObjStoreError::BadEndpoint {
        endpoint: ftpipe_secrets::redact(given).into_owned(),
        reason: reason.to_owned(),
    };
    // Before the URL is parsed: a URL that does not parse (a bad port) must
    // not echo its userinfo either.
    if ftpipe_secrets::has_userinfo(given) {
        return Err(ObjStoreError::BadEndpoint {
            endpoint: ftpipe_secrets::strip_userinfo(given).into_owned(),
            reason: CREDENTIALS_IN_URL.into(),
        });
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
    let transport = match url.scheme() {
        "https" => Transport::Https,
        "http" if loopback => Transport::LoopbackHttp,
        "http" => Transport::RemoteHttp,
        _ => return Err(bad("expected an http(s) URL")),
    };
    Ok((given.trim_end_matches('/').to_owned(), transport))
}

/// Registers with the redaction point the credentials the environment and
/// every profile of the shared files hold as plain values (for the bundle
/// guard of `audit`), without asking any server or process for them; a
/// file that cannot be read or parsed registers nothing.
pub async fn register_credentials_from_env() {
    let _ = check_environment_keys();
    if check_files_the_chain_reads().is_err() {
        return;
    }
    let Ok(profiles) = aws_config::profile::load(
        &aws_types::os_shim_internal::Fs::real(),
        &aws_types::os_shim_internal::Env::real(),
        &aws_runtime::env_config::file::EnvConfigFiles::default(),
        None,
    )
    .await
    else {
        return;
    };
    for name in profiles.profiles() {
        let Some(p) = profiles.get_profile(name) else {
            continue;
        };
        for key in [
            "aws_access_key_id",
            "aws_secret_access_key",
            "aws_session_token",
        ] {
            if let Some(v) = p.get(key).filter(|v| !v.is_empty()) {
                ftpipe_secrets::register(v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_with_credentials_are_refused_and_remote_http_is_warned_of() {
        let e = check_endpoint("http://user:pass-word-0001@127.0.0.1:9000").unwrap_err();
        assert!(!e.to_string().contains("pass-word-0001"), "{e}");
        assert!(e.to_string().contains("credentials in the endpoint"), "{e}");
        let (e, t) = check_endpoint("http://minio.internal:9000/").unwrap();
        assert_eq!(
            (e.as_str(), t),
            ("http://minio.internal:9000", Transport::RemoteHttp)
        );
        let (_, t) = check_endpoint("http://127.0.0.1:9000").unwrap();
        assert_eq!(t, Transport::LoopbackHttp);
        let (_, t) = check_endpoint("https://s3.example.com").unwrap();
        assert_eq!(t, Transport::Https);
        assert!(check_endpoint("ftp://s3.example.com").is_err());
    }

    /// A chain answering credentials valid for `valid`, counting its calls.
    fn counting_chain(valid: Duration) -> (ChainCredentials, Arc<std::sync::atomic::AtomicUsize>) {
        let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = Arc::clone(&calls);
        let chain = aws_credential_types::credential_fn::provide_credentials_fn(move || {
            let n = counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async move {
                Ok(Credentials::new(
                    "AKIACHAINTEST0000001",
                    format!("chain-secret-{n}-0000000001"),
                    None,
                    Some(SystemTime::now() + valid),
                    "test",
                ))
            }
        });
        (
            ChainCredentials::new(SharedCredentialsProvider::new(chain), DEFAULT_READ_TIMEOUT),
            calls,
        )
    }

    #[tokio::test]
    async fn credentials_are_held_until_near_expiry_and_registered() {
        let (c, calls) = counting_chain(Duration::from_secs(3600));
        c.first().await.unwrap();
        for _ in 0..3 {
            let got = c.get_credential().await.unwrap();
            assert_eq!(got.secret_key, "chain-secret-0-0000000001");
        }
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert!(ftpipe_secrets::contains_secret(
            b"x chain-secret-0-0000000001 y"
        ));
        // Within the renewal margin: every use asks the chain again.
        let (c, calls) = counting_chain(REFRESH_BEFORE_EXPIRY / 2);
        c.first().await.unwrap();
        let got = c.get_credential().await.unwrap();
        assert_eq!(got.secret_key, "chain-secret-1-0000000001");
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 2);
    }

    #[test]
    fn regions_are_checked() {
        assert_eq!(checked_region(None).unwrap(), "us-east-1");
        assert_eq!(checked_region(Some("eu-west-1")).unwrap(), "eu-west-1");
        assert!(checked_region(Some("eu west")).is_err());
    }
}
