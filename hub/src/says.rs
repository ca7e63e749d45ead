//! What the hub says about a refused request: its `X-Error-Code` (e.g.
//! `RepoNotFound`, `RevisionNotFound`, `GatedRepo`, `EntryNotFound`) and
//! `X-Error-Message`, each cut to [`MAX_HUB_SAYS_CHARS`] characters and
//! redacted through `ftpipe_secrets` as it is read (a server may echo the
//! token it was sent), so an error holding them can be printed, logged or
//! stored as it is.

use reqwest::header::HeaderMap;

/// Longest `X-Error-Code` or `X-Error-Message` kept, in characters; the
/// rest is dropped and the cut marked with `…`.
pub const MAX_HUB_SAYS_CHARS: usize = 300;

/// The hub's `X-Error-Code`, as far as ftpipe tells them apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HubErrorCode {
    /// `RepoNotFound`: no such repository (or one the token cannot see).
    RepoNotFound,
    /// `RevisionNotFound`: the repository has no such branch, tag or commit.
    RevisionNotFound,
    /// `EntryNotFound`: no such file at that revision.
    EntryNotFound,
    /// `GatedRepo`: the repository needs its terms accepted by the token's
    /// account.
    GatedRepo,
    /// Any other code, as sent (bounded and redacted).
    Other(String),
}

impl HubErrorCode {
    fn parse(code: &str) -> HubErrorCode {
        match code {
            "RepoNotFound" => HubErrorCode::RepoNotFound,
            "RevisionNotFound" => HubErrorCode::RevisionNotFound,
            "EntryNotFound" => HubErrorCode::EntryNotFound,
            "GatedRepo" => HubErrorCode::GatedRepo,
            other => HubErrorCode::Other(other.to_owned()),
        }
    }

    /// The code as the hub spells it.
    pub fn as_str(&self) -> &str {
        match self {
            HubErrorCode::RepoNotFound => "RepoNotFound",
            HubErrorCode::RevisionNotFound => "RevisionNotFound",
            HubErrorCode::EntryNotFound => "EntryNotFound",
            HubErrorCode::GatedRepo => "GatedRepo",
            HubErrorCode::Other(s) => s,
        }
    }
}

/// The hub's own explanation of a refused request; both parts optional.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HubSays {
    /// `X-Error-Code`.
    pub code: Option<HubErrorCode>,
    /// `X-Error-Message`.
    pub message: Option<String>,
}

impl HubSays {
    /// Reads `X-Error-Code` and `X-Error-Message` from `headers` (a value
    /// that is not UTF-8 is taken lossily), bounded and redacted.
    pub fn from_headers(headers: &HeaderMap) -> HubSays {
        let read = |name: &str| {
            headers
                .get(name)
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                .map(|v| bounded_redacted(&v))
                .filter(|v| !v.is_empty())
        };
        HubSays {
            code: read("x-error-code").map(|c| HubErrorCode::parse(&c)),
            message: read("x-error-message"),
        }
    }
}

/// `: MESSAGE (CODE)`, `: MESSAGE`, `: CODE`, or nothing: appended to the
/// status line of an error.
impl std::fmt::Display for HubSays {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (&self.message, &self.code) {
            (Some(m), Some(c)) => write!(f, ": {m} ({})", c.as_str()),
            (Some(m), None) => write!(f, ": {m}"),
            (None, Some(c)) => write!(f, ": {}", c.as_str()),
            (None, None) => Ok(()),
        }
    }
}

/// `text` trimmed, redacted, without control characters, and cut to
/// [`MAX_HUB_SAYS_CHARS`] characters. Redaction comes before the cut, so
/// a token straddling the cut is still found whole.
fn bounded_redacted(text: &str) -> String {
    let redacted = ftpipe_secrets::redact(text.trim());
    let clean: String = redacted
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    match clean.char_indices().nth(MAX_HUB_SAYS_CHARS) {
        Some((cut, _)) => format!("{}…", &clean[..cut]),
        None => clean,
    }
}

#[cfg(test)]
mod tests {
    use reqwest::header::HeaderValue;

    use super::*;

    #[test]
    fn the_hubs_words_are_bounded_and_redacted() {
        ftpipe_secrets::register("hf_says_secret_token");
        let mut h = HeaderMap::new();
        let long = format!("{} hf_says_secret_token", "x".repeat(5000));
        h.insert("x-error-message", HeaderValue::from_str(&long).unwrap());
        h.insert("x-error-code", HeaderValue::from_static("GatedRepo"));
        let says = HubSays::from_headers(&h);
        assert_eq!(says.code, Some(HubErrorCode::GatedRepo));
        let m = says.message.unwrap();
        assert_eq!(m.chars().count(), MAX_HUB_SAYS_CHARS + 1, "cut and marked");
        assert!(!m.contains("hf_says"), "{m}");
        let mut h = HeaderMap::new();
        h.insert(
            "x-error-message",
            HeaderValue::from_static("denied hf_says_secret_token"),
        );
        let m = HubSays::from_headers(&h).to_string();
        assert!(
            !m.contains("hf_says_secret_token") && m.starts_with(": denied"),
            "{m}"
        );
        assert_eq!(HubSays::from_headers(&HeaderMap::new()).to_string(), "");
    }
}
