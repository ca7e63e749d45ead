//! The one sentence with the fix for the failures a new user meets first
//! (the hub refusing or not knowing the repo or revision, an endpoint that
//! does not answer), printed before the failure's exact text, which stays
//! whole below it.
//!
//! The sentence is worded from typed facts only: the [`HubError`] found
//! anywhere in the chain (its status, the hub's `X-Error-Code`, why a
//! connection failed), the command's repo, revision and endpoint, and where
//! the token came from (never the token).

use ftpipe_convert::ConvertError;
use ftpipe_fetch::FetchError;
use ftpipe_hub::says::HubErrorCode;
use ftpipe_hub::token::{TokenSource, token_source};
use ftpipe_hub::{HubError, Unreachable};
use ftpipe_pipeline::PipelineError;

use crate::cli::Command;

/// What the advice may name about the command that failed.
pub struct Facts {
    repo: Option<String>,
    revision: Option<String>,
    token: TokenSource,
}

impl Facts {
    /// The repo, revision and token source `command` works with, taken
    /// before it runs and without reading the token (a pipe is read once).
    pub fn of(command: &Command) -> Facts {
        let (repo, origin, token_file) = match command {
            Command::Fetch(a) => (Some(&a.hub.repo), Some(&a.hub.origin), &a.hub.token_file),
            Command::Run(a) => (
                Some(&a.fetch.hub.repo),
                Some(&a.fetch.hub.origin),
                &a.fetch.hub.token_file,
            ),
            Command::Plan(a) => (Some(&a.hub.repo), Some(&a.hub.origin), &a.hub.token_file),
            Command::Mirror(a) => (Some(&a.source), Some(&a.origin), &a.token_file),
            _ => (None, None, &None),
        };
        let token = token_source(token_file.as_deref());
        Facts {
            repo: repo.cloned(),
            revision: origin.map(|o| o.revision.clone()),
            token,
        }
    }

    fn repo(&self) -> &str {
        self.repo.as_deref().unwrap_or("the repo")
    }

    fn revision(&self) -> &str {
        self.revision.as_deref().unwrap_or("the revision")
    }

    /// Where the token sent came from, or that none was found.
    fn token_words(&self) -> Option<&'static str> {
        match self.token {
            TokenSource::TokenFile => Some("the token from --token-file"),
            TokenSource::Env => Some("the token from HF_TOKEN"),
            TokenSource::TokenPath => Some("the token from the file at HF_TOKEN_PATH"),
            TokenSource::HfHome => Some("the token `hf auth login` saved ($HF_HOME/token)"),
            TokenSource::None => None,
        }
    }
}

/// Where a token is looked for, for "none was found".
const TOKEN_PLACES: &str = "--token-file, HF_TOKEN, HF_TOKEN_PATH or $HF_HOME/token";

/// The hub's error anywhere in `err`'s chain (a transparent wrapper hides
/// it from the chain, so each of ftpipe's error types is asked).
fn hub_error(err: &anyhow::Error) -> Option<&HubError> {
    err.chain().find_map(|cause| {
        if let Some(e) = cause.downcast_ref::<HubError>() {
            return Some(e);
        }
        if let Some(e) = cause.downcast_ref::<PipelineError>() {
            return e.hub();
        }
        if let Some(e) = cause.downcast_ref::<FetchError>() {
            return e.hub();
        }
        cause
            .downcast_ref::<ConvertError>()
            .and_then(ConvertError::hub)
    })
}

/// The sentence with the fix for `err`, when it is a failure this knows.
pub fn advice(err: &anyhow::Error, facts: &Facts) -> Option<String> {
    match hub_error(err)? {
        HubError::Status { status, hub, .. } => refused(*status, hub.code.as_ref(), facts),
        e @ HubError::Http { url, .. } => unreachable(e.unreachable()?, origin_of(url)),
        _ => None,
    }
}

/// `scheme://host[:port]` of `url` (the endpoint the request went to).
fn origin_of(url: &str) -> &str {
    let host_at = url.find("://").map_or(0, |i| i + 3);
    match url[host_at..].find('/') {
        Some(path_at) => &url[..host_at + path_at],
        None => url,
    }
}

fn unreachable(why: Unreachable, endpoint: &str) -> Option<String> {
    let what = match why {
        Unreachable::Refused => format!("nothing answers at {endpoint} (connection refused)"),
        Unreachable::NameNotResolved => format!("the host name of {endpoint} does not resolve"),
        Unreachable::Timeout => format!("{endpoint} did not answer in time"),
        Unreachable::Other => return None,
    };
    Some(format!(
        "{what}: check --endpoint and HF_ENDPOINT (and the network), or pass --offline to \
         work from DIR's state and the Hugging Face cache only"
    ))
}

/// A status the hub refused with: 401 and 403 (no access), 404 (no such
/// repo, revision or file).
fn refused(status: u16, code: Option<&HubErrorCode>, facts: &Facts) -> Option<String> {
    let repo = facts.repo();
    let no_token = || format!("no token was found in {TOKEN_PLACES}");
    let sent = || {
        facts
            .token_words()
            .map_or_else(no_token, |t| format!("the request carried {t}"))
    };
    Some(match (status, code) {
        (401 | 403, Some(HubErrorCode::GatedRepo)) => format!(
            "{repo} is gated and {}: accept its terms on its hub page, then run `hf auth \
             login` with that account (or set HF_TOKEN)",
            sent()
        ),
        (401 | 403, _) => match facts.token_words() {
            Some(t) => format!(
                "the hub refused {t} for {repo} (a private or gated repo this account cannot \
                 read, or a token that is invalid or expired): check the repo id, or run `hf \
                 auth login` with an account that can read it"
            ),
            None => format!(
                "the hub refused {repo} to a request without a token ({}): it may be private \
                 or gated, or not exist; check the repo id, or run `hf auth login`",
                no_token()
            ),
        },
        (404, Some(HubErrorCode::RepoNotFound)) => format!(
            "the hub has no repository {repo} that the request could see ({}): check the repo \
             id (NAMESPACE/NAME); a private repo needs `hf auth login`",
            sent()
        ),
        (404, Some(HubErrorCode::RevisionNotFound)) => format!(
            "{repo} has no revision {}: check --revision (a branch, a tag or a full commit id)",
            facts.revision()
        ),
        // A file of the pin gone from its commit: the exact text says it.
        (404, Some(HubErrorCode::EntryNotFound)) => return None,
        (404, _) => format!(
            "the hub answered 404 without saying whether the repository {repo} or the revision \
             {} is missing: check both, and that --endpoint or HF_ENDPOINT names a hub",
            facts.revision()
        ),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(token: TokenSource) -> Facts {
        Facts {
            repo: Some("acme/tiny".into()),
            revision: Some("v2".into()),
            token,
        }
    }

    fn status(status: u16, code: Option<HubErrorCode>) -> anyhow::Error {
        let hub = ftpipe_hub::says::HubSays {
            code,
            message: None,
        };
        let err = HubError::Status {
            url: "http://hub/api/models/acme/tiny/revision/v2".into(),
            status,
            detail: String::new(),
            hub,
        };
        anyhow::Error::from(PipelineError::Fetch(FetchError::Hub(err)))
    }

    #[test]
    fn each_refusal_gets_its_sentence() {
        let say = |s, c, t| advice(&status(s, c), &facts(t)).unwrap_or_default();
        let denied = say(401, None, TokenSource::None);
        assert!(
            denied.contains("without a token (no token was found in --token-file"),
            "{denied}"
        );
        let denied = say(403, None, TokenSource::HfHome);
        assert!(
            denied.contains("the token `hf auth login` saved"),
            "{denied}"
        );
        let gated = say(403, Some(HubErrorCode::GatedRepo), TokenSource::TokenPath);
        assert!(
            gated.contains("HF_TOKEN_PATH") && gated.contains("accept its terms"),
            "{gated}"
        );
        let unknown = say(404, None, TokenSource::None);
        assert!(
            unknown.contains("repository acme/tiny or the revision v2"),
            "{unknown}"
        );
        assert_eq!(
            say(404, Some(HubErrorCode::EntryNotFound), TokenSource::None),
            ""
        );
        assert_eq!(say(500, None, TokenSource::None), "");
    }

    #[test]
    fn the_endpoint_is_named_without_its_path() {
        assert_eq!(
            origin_of("http://127.0.0.1:9/api/models/a/b"),
            "http://127.0.0.1:9"
        );
        assert_eq!(origin_of("https://hub.example"), "https://hub.example");
    }
}
