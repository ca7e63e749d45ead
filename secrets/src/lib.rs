//! The one redaction point: the credentials this process holds, and the
//! redaction every string from outside passes before it reaches the state
//! database, stderr, logs, `--json`, the audit or the bundle.
//!
//! Why a registry rather than care at each call site: a hostile or broken
//! server can echo a credential back anywhere it controls (an `ETag`, a
//! `Content-Range`, an `X-Error-Message`, a redirect URL), and those
//! strings travel far before anything prints or stores them. Cleaning them
//! where they arrive would need every parser to know every credential;
//! cleaning them where they leave (a handful of sinks: the store's text
//! columns, the binary's error and JSON printers, the log writer, the
//! bundle guard) needs only this one list, filled once where a credential
//! is resolved ([`register`]), whatever its source (`HF_TOKEN`, a token
//! file, later object-store keys).
//!
//! A URL's userinfo (`s3://KEY:SECRET@bucket`, `http://user:pw@host`) is a
//! credential too, but one nobody registered: a user typed it, and the URL
//! may be refused before anything could register it. [`redact`] therefore
//! also cuts the userinfo out of every `scheme://` it finds
//! ([`strip_userinfo`]), whatever the secret is, and the parsers of URLs
//! and locations keep only the stripped form in their errors.
//!
//! Redaction replaces every occurrence with [`REDACTED`]; a value shorter
//! than [`MIN_SECRET_LEN`] is still registered and scanned for by
//! [`contains_secret`], but not replaced in text, where it would match by
//! chance and mangle unrelated output (no real credential is that short).

use std::borrow::Cow;
use std::sync::RwLock;

/// What a credential is replaced with.
pub const REDACTED: &str = "<redacted>";

/// Shortest credential replaced in text.
pub const MIN_SECRET_LEN: usize = 8;

/// The credentials this process holds (never printed, never serialized).
static SECRETS: RwLock<Vec<String>> = RwLock::new(Vec::new());

/// Remembers `secret` for every later redaction and scan. Registering an
/// empty string or one already known does nothing.
pub fn register(secret: &str) {
    if secret.is_empty() {
        return;
    }
    let mut all = SECRETS
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if !all.iter().any(|s| s == secret) {
        all.push(secret.to_owned());
        // Longest first: a credential holding another is replaced whole.
        all.sort_by_key(|s| std::cmp::Reverse(s.len()));
    }
}

/// `text` with every registered credential and every URL's userinfo
/// replaced by [`REDACTED`]; borrowed (no copy) when it holds none.
pub fn redact(text: &str) -> Cow<'_, str> {
    let all = SECRETS
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut out = strip_userinfo(text);
    for secret in all.iter().filter(|s| s.len() >= MIN_SECRET_LEN) {
        if out.contains(secret.as_str()) {
            out = Cow::Owned(out.replace(secret.as_str(), REDACTED));
        }
    }
    out
}

/// Bytes that end a URL's authority (`scheme://AUTHORITY/...`) in text.
fn ends_authority(c: char) -> bool {
    matches!(c, '/' | '?' | '#' | '"' | '\'' | '<' | '>' | '`' | '\\') || c.is_whitespace()
}

/// `text` with the userinfo of every `scheme://userinfo@host` in it
/// replaced by [`REDACTED`] (`s3://<redacted>@bucket/p`); borrowed when
/// there is none. Works on text that is not a valid URL (a bad port, a
/// bucket name S3 refuses): it looks only for `://` and the last `@`
/// before the authority ends.
pub fn strip_userinfo(text: &str) -> Cow<'_, str> {
    let mut out = String::new();
    let mut copied = 0;
    let mut search = 0;
    while let Some(found) = text.get(search..).and_then(|rest| rest.find("://")) {
        let authority_start = search + found + 3;
        let rest = text.get(authority_start..).unwrap_or_default();
        let authority_len = rest.find(ends_authority).unwrap_or(rest.len());
        let authority = rest.get(..authority_len).unwrap_or_default();
        if let Some(at) = authority.rfind('@') {
            out.push_str(text.get(copied..authority_start).unwrap_or_default());
            out.push_str(REDACTED);
            copied = authority_start + at;
        }
        search = authority_start + authority_len;
    }
    if copied == 0 {
        return Cow::Borrowed(text);
    }
    out.push_str(text.get(copied..).unwrap_or_default());
    Cow::Owned(out)
}

/// Whether `url` (or any URL in it) carries userinfo (`user:pw@`), which
/// ftpipe refuses without echoing it.
pub fn has_userinfo(url: &str) -> bool {
    matches!(strip_userinfo(url), Cow::Owned(_))
}

/// [`redact`] for an optional string (a column that may be NULL).
pub fn redact_opt(text: Option<&str>) -> Option<Cow<'_, str>> {
    text.map(redact)
}

/// True when `bytes` hold any registered credential, whatever its length
/// (the bundle guard refuses rather than writes).
pub fn contains_secret(bytes: &[u8]) -> bool {
    let all = SECRETS
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    all.iter()
        .any(|secret| memchr::memmem::find(bytes, secret.as_bytes()).is_some())
}

/// How many credentials are registered (for reports; never the values).
pub fn registered() -> usize {
    SECRETS
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .len()
}

#[cfg(test)]
mod tests {
    use super::*;

    // One test: the registry is process-wide, so the cases run in order.
    #[test]
    fn registered_values_are_replaced_and_found() {
        assert_eq!(redact("etag abc"), "etag abc");
        register("hf_longer_secret_value");
        register("hf_longer_secret");
        register("short");
        register("");
        assert_eq!(registered(), 3);
        let t = redact("a hf_longer_secret_value b hf_longer_secret c short");
        assert_eq!(t, "a <redacted> b <redacted> c short");
        assert!(matches!(redact("nothing here"), Cow::Borrowed(_)));
        assert!(contains_secret(b"xx short yy"));
        assert!(!contains_secret(b"hf_longer_secre"));
        assert_eq!(redact_opt(None), None);
    }

    #[test]
    fn userinfo_is_cut_from_every_url_whatever_the_secret() {
        let cases = [
            ("s3://AKID:SECRET@bkt/p", "s3://<redacted>@bkt/p"),
            (
                "bad endpoint http://AKID:pw@host:99999 (port)",
                "bad endpoint http://<redacted>@host:99999 (port)",
            ),
            (
                "a https://u@h/x?y=a@b and s3://k:s@b/q",
                "a https://<redacted>@h/x?y=a@b and s3://<redacted>@b/q",
            ),
            ("\"http://us:er:p@ss@host\"", "\"http://<redacted>@host\""),
        ];
        for (given, want) in cases {
            assert_eq!(strip_userinfo(given), want, "{given}");
            assert_eq!(redact(given), want, "{given}");
            assert!(has_userinfo(given), "{given}");
        }
        for plain in ["s3://bkt/p", "http://host:9000/a@b", "mail a@b", "x://"] {
            assert!(matches!(strip_userinfo(plain), Cow::Borrowed(_)), "{plain}");
        }
    }
}
