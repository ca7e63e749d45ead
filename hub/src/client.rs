//! The hub client: revision and tree APIs, and body requests with manual,
//! bounded redirects so the token can never follow a cross-host hop.

use std::time::Duration;

use reqwest::header::{self, HeaderMap, HeaderValue};
use reqwest::{Method, Response, StatusCode};
use serde::de::DeserializeOwned;
use url::Url;

use crate::error::{HubError, Result};
use crate::limits::{MAX_JSON_BYTES, MAX_REDIRECTS};
use crate::says::HubSays;

/// A secret bearer token. Its `Debug` never prints the value.
#[derive(Clone)]
pub struct Token(String);

impl Token {
    /// Wraps a token, trimming surrounding whitespace, and registers it
    /// with the redaction point (`ftpipe_secrets`): from here on no output
    /// or record of this process can hold it, whatever echoes it back.
    pub fn new(raw: &str) -> Option<Token> {
        let t = raw.trim();
        (!t.is_empty()).then(|| {
            ftpipe_secrets::register(t);
            Token(t.to_owned())
        })
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

/// Metadata the hub sends on the resolve response (possibly on a redirect).
#[derive(Debug, Default, Clone)]
pub struct LinkedMeta {
    /// `X-Repo-Commit`.
    pub repo_commit: Option<String>,
    /// `X-Linked-Size`.
    pub linked_size: Option<String>,
    /// `X-Linked-Etag`.
    pub linked_etag: Option<String>,
}

impl LinkedMeta {
    /// Takes each header from `headers` unless an earlier hop of the
    /// redirect chain already sent it (the first hop describes the file).
    pub fn gather(&mut self, headers: &HeaderMap) {
        for (slot, name) in [
            (&mut self.repo_commit, "x-repo-commit"),
            (&mut self.linked_size, "x-linked-size"),
            (&mut self.linked_etag, "x-linked-etag"),
        ] {
            if slot.is_none() {
                *slot = header_str(headers, name);
            }
        }
    }
}

/// A response with the redirect chain's metadata and the final host.
pub struct BodyResponse {
    /// The final response.
    pub response: Response,
    /// Metadata gathered along the chain.
    pub meta: LinkedMeta,
    /// Host of the final response (recorded in attempts; never the full URL).
    pub host: String,
}

/// HTTP access to one hub endpoint.
#[derive(Clone)]
pub struct HubClient {
    http: reqwest::Client,
    endpoint: Url,
    token: Option<Token>,
    /// `HF_HUB_OFFLINE=1` / `--offline`: every request fails, naming it.
    offline: bool,
}

fn header_str(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

fn same_origin(a: &Url, b: &Url) -> bool {
    a.scheme() == b.scheme()
        && a.host_str() == b.host_str()
        && a.port_or_known_default() == b.port_or_known_default()
}

impl HubClient {
    /// Builds a client for `endpoint` with a per-read stall timeout.
    pub fn new(endpoint: &str, token: Option<Token>, read_timeout: Duration) -> Result<HubClient> {
        let endpoint = parse_endpoint(endpoint)?;
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .read_timeout(read_timeout)
            .connect_timeout(Duration::from_secs(30))
            .user_agent(concat!("ftpipe/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| HubError::Http {
                url: endpoint.to_string(),
                source: e.without_url(),
            })?;
        Ok(HubClient {
            http,
            endpoint,
            token,
            offline: false,
        })
    }

    /// A client that makes no request: each one fails with
    /// [`HubError::Offline`] naming what it was for.
    pub fn into_offline(mut self) -> HubClient {
        self.offline = true;
        self
    }

    /// Whether this client refuses the network.
    pub fn is_offline(&self) -> bool {
        self.offline
    }

    fn refuse_offline(&self, what: &str, url: &Url) -> Result<()> {
        if self.offline {
            return Err(HubError::Offline {
                what: format!("{what} ({})", redact(url)),
            });
        }
        Ok(())
    }

    /// The endpoint origin, without credentials.
    pub fn endpoint(&self) -> &str {
        self.endpoint.as_str().trim_end_matches('/')
    }

    fn url(&self, path_and_query: &str) -> Result<Url> {
        let raw = format!("{}{}", self.endpoint(), path_and_query);
        Url::parse(&raw).map_err(|e| HubError::InvalidInput {
            what: "url",
            message: format!("{raw}: {e}"),
        })
    }

    /// URL of a file at a commit.
    pub fn resolve_url(&self, repo: &str, commit: &str, path: &str) -> Result<Url> {
        let encoded: Vec<String> = path.split('/').map(percent_encode_segment).collect();
        self.url(&format!("/{repo}/resolve/{commit}/{}", encoded.join("/")))
    }

    /// GETs JSON with the token, bounded in size. Returns the value and the
    /// response headers (for `Link` pagination).
    pub async fn get_json<T: DeserializeOwned>(&self, url: &Url) -> Result<(T, HeaderMap)> {
        let (value, headers, _) = self.get_json_limited(url, MAX_JSON_BYTES).await?;
        Ok((value, headers))
    }

    /// [`HubClient::get_json`] with a body limit of `limit` bytes (checked
    /// against `Content-Length` first, then while reading); also returns
    /// the body length.
    pub async fn get_json_limited<T: DeserializeOwned>(
        &self,
        url: &Url,
        limit: u64,
    ) -> Result<(T, HeaderMap, u64)> {
        let (body, headers) = self.get_bytes_limited(url, limit).await?;
        let value = serde_json::from_slice(&body).map_err(|source| HubError::MalformedJson {
            url: url.to_string(),
            source,
        })?;
        Ok((value, headers, body.len() as u64))
    }

    /// GETs a small API response of at most `limit` bytes (checked against
    /// `Content-Length` first, then while reading).
    pub async fn get_bytes_limited(&self, url: &Url, limit: u64) -> Result<(Vec<u8>, HeaderMap)> {
        self.refuse_offline("a hub API request", url)?;
        let mut req = self.http.get(url.clone());
        if let Some(token) = &self.token
            && same_origin(url, &self.endpoint)
        {
            req = req.bearer_auth(&token.0);
        }
        let mut resp = req.send().await.map_err(|e| HubError::Http {
            url: url.to_string(),
            source: e.without_url(),
        })?;
        let status = resp.status();
        if !status.is_success() {
            // The hub's explanation is optional: none adds nothing.
            return Err(HubError::Status {
                url: url.to_string(),
                status: status.as_u16(),
                detail: String::new(),
                hub: HubSays::from_headers(resp.headers()),
            });
        }
        if let Some(len) = resp.content_length()
            && len > limit
        {
            return Err(HubError::OversizedResponse {
                url: url.to_string(),
                limit,
            });
        }
        let headers = resp.headers().clone();
        let mut body = Vec::new();
        while let Some(chunk) = resp.chunk().await.map_err(|e| HubError::Http {
            url: url.to_string(),
            source: e.without_url(),
        })? {
            if body.len() as u64 + chunk.len() as u64 > limit {
                return Err(HubError::OversizedResponse {
                    url: url.to_string(),
                    limit,
                });
            }
            body.extend_from_slice(&chunk);
        }
        Ok((body, headers))
    }

    /// Sends a body request, following at most [`MAX_REDIRECTS`] redirects
    /// by hand. `Authorization` is attached only while the URL has the
    /// endpoint's origin; once a hop leaves it, it is never sent again.
    pub async fn get_body(&self, path: &str, url: Url, extra: HeaderMap) -> Result<BodyResponse> {
        self.refuse_offline(&format!("downloading {path}"), &url)?;
        let mut url = url;
        let mut meta = LinkedMeta::default();
        let mut token_allowed = true;
        for _ in 0..=MAX_REDIRECTS {
            let mut req = self
                .http
                .request(Method::GET, url.clone())
                .headers(extra.clone())
                .header(
                    header::ACCEPT_ENCODING,
                    HeaderValue::from_static("identity"),
                );
            token_allowed &= same_origin(&url, &self.endpoint);
            if token_allowed && let Some(token) = &self.token {
                req = req.bearer_auth(&token.0);
            }
            let resp = req.send().await.map_err(|e| HubError::Http {
                url: redact(&url),
                source: e.without_url(),
            })?;
            let headers = resp.headers();
            meta.gather(headers);
            if resp.status().is_redirection() && resp.status() != StatusCode::NOT_MODIFIED {
                let location =
                    header_str(headers, "location").ok_or_else(|| HubError::BadHeader {
                        path: path.to_owned(),
                        header: "Location",
                        expected: "a redirect target".into(),
                        actual: String::new(),
                    })?;
                url = url.join(&location).map_err(|e| HubError::BadHeader {
                    path: path.to_owned(),
                    header: "Location",
                    expected: format!("a valid URL ({e})"),
                    actual: location.clone(),
                })?;
                continue;
            }
            // Recorded with the attempt: a URL that was fetched has a host.
            let host = url
                .host_str()
                .ok_or_else(|| HubError::internal(format!("{} has no host", redact(&url))))?
                .to_owned();
            return Ok(BodyResponse {
                response: resp,
                meta,
                host,
            });
        }
        Err(HubError::TooManyRedirects {
            path: path.to_owned(),
            limit: MAX_REDIRECTS,
        })
    }
}

/// Refuses an endpoint carrying credentials (`http://user:secret@host`).
///
/// Refused rather than stripped: stripping would silently send requests
/// without the authentication the user wrote, and keeping them would put a
/// password in `pin.endpoint`, the audit and the bundle. The hub takes a
/// bearer token (`HF_TOKEN`, `--token-file`), which ftpipe keeps out of
/// every record. The error shows the endpoint with its userinfo masked.
/// The hub endpoint as every client uses it: an http or https URL without
/// credentials (checked before anything is opened or stored, so a refused
/// endpoint leaves no trace).
pub fn parse_endpoint(endpoint: &str) -> Result<Url> {
    let url = Url::parse(endpoint.trim_end_matches('/')).map_err(|e| HubError::InvalidInput {
        what: "endpoint",
        message: format!("{:?}: {e}", mask_userinfo(endpoint)),
    })?;
    refuse_userinfo(&url)?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(HubError::InvalidInput {
            what: "endpoint",
            message: format!("{url}: only http and https are supported"),
        });
    }
    Ok(url)
}

fn refuse_userinfo(endpoint: &Url) -> Result<()> {
    if endpoint.username().is_empty() && endpoint.password().is_none() {
        return Ok(());
    }
    if let Some(password) = endpoint.password() {
        ftpipe_secrets::register(password);
    }
    Err(HubError::InvalidInput {
        what: "endpoint",
        message: format!(
            "{}: credentials in the endpoint URL are refused (they would be stored with the pin); \
             give the token with HF_TOKEN or --token-file",
            mask_userinfo(endpoint.as_str())
        ),
    })
}

/// `raw` with the userinfo of its URL(s) replaced (for errors about an
/// endpoint that may hold a password, parseable or not): the one
/// [`ftpipe_secrets::strip_userinfo`].
pub fn mask_userinfo(raw: &str) -> String {
    ftpipe_secrets::strip_userinfo(raw).into_owned()
}

/// A URL without its query (which may carry signed credentials).
pub fn redact(url: &Url) -> String {
    let mut u = url.clone();
    u.set_query(None);
    u.set_fragment(None);
    let _ = u.set_password(None);
    let _ = u.set_username("");
    u.to_string()
}

/// Percent-encodes one URL path segment (everything but unreserved bytes).
pub fn percent_encode_segment(seg: &str) -> String {
    let mut out = String::with_capacity(seg.len());
    for b in seg.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Parses the `rel="next"` target of a `Link` header.
pub fn next_link(headers: &HeaderMap) -> Option<String> {
    let link = headers.get(header::LINK)?.to_str().ok()?;
    link.split(',').find_map(|part| {
        let (target, params) = part.split_once(';')?;
        let is_next = params
            .split(';')
            .any(|p| p.trim().replace(' ', "") == "rel=\"next\"" || p.trim() == "rel=next");
        let target = target.trim().strip_prefix('<')?.strip_suffix('>')?;
        is_next.then(|| target.to_owned())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_next_link() {
        let mut h = HeaderMap::new();
        h.insert(
            header::LINK,
            HeaderValue::from_static("<http://h/api?cursor=2>; rel=\"next\""),
        );
        assert_eq!(next_link(&h).as_deref(), Some("http://h/api?cursor=2"));
    }

    #[test]
    fn endpoint_credentials_are_refused_and_masked() {
        let e = HubClient::new(
            "http://user:pa55word_secret@127.0.0.1:9/",
            None,
            Duration::from_secs(1),
        )
        .err()
        .expect("userinfo refused")
        .to_string();
        assert!(e.contains("http://<redacted>@127.0.0.1:9/"), "{e}");
        assert!(!e.contains("pa55word"), "{e}");
        assert_eq!(mask_userinfo("http://a:b@h/x@y"), "http://<redacted>@h/x@y");
        assert_eq!(mask_userinfo("http://h/x@y"), "http://h/x@y");
        assert_eq!(mask_userinfo("no scheme"), "no scheme");
        let bad = HubClient::new("http://u:p@[::1", None, Duration::from_secs(1))
            .err()
            .expect("unparseable")
            .to_string();
        assert!(!bad.contains("u:p"), "{bad}");
    }

    #[test]
    fn token_debug_is_redacted() {
        let t = Token::new("hf_secret").unwrap();
        assert!(!format!("{t:?}").contains("secret"));
    }
}
