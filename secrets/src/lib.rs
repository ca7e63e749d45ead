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

/// `text` with every registered credential replaced by [`REDACTED`];
/// borrowed (no copy) when it holds none.
pub fn redact(text: &str) -> Cow<'_, str> {
    let all = SECRETS
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut out = Cow::Borrowed(text);
    for secret in all.iter().filter(|s| s.len() >= MIN_SECRET_LEN) {
        if out.contains(secret.as_str()) {
            out = Cow::Owned(out.replace(secret.as_str(), REDACTED));
        }
    }
    out
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
    all.iter().any(|secret| {
        let needle = secret.as_bytes();
        bytes.windows(needle.len()).any(|w| w == needle)
    })
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
}
