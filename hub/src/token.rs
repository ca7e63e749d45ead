//! Where the hub token comes from, read as huggingface_hub resolves it:
//! `--token-file`, then `HF_TOKEN` (or the older `HUGGING_FACE_HUB_TOKEN`),
//! then the file at `HF_TOKEN_PATH` (default `$HF_HOME/token`).
//!
//! Each of these is controlled by the user or another program, and the
//! token ends up in an HTTP header. So a token file goes through the bounded
//! reader (at most [`MAX_TOKEN_BYTES`]; `/dev/zero` is refused without
//! filling memory). A pipe is read, since process substitution
//! (`--token-file <(pass show hf)`) is how tokens are kept out of files: up
//! to the same limit, within [`TOKEN_PIPE_WAIT`], so a pipe nobody writes
//! ends with an error naming it instead of a hang. A token must be printable ASCII
//! without spaces once trimmed, so a stray CR/LF is an error naming where the
//! token came from instead of "failed to parse header value" from the HTTP
//! client. No error ever holds the token itself.

use std::path::{Path, PathBuf};

use std::time::Duration;

use ftpipe_fs::bounded::{BoundedReadError, read_bounded_or_pipe};

use crate::client::Token;

/// Largest token file read (hub tokens are well under 100 bytes).
pub const MAX_TOKEN_BYTES: u64 = 4096;

/// How long a token pipe's writer has to send the token and close it.
pub const TOKEN_PIPE_WAIT: Duration = Duration::from_secs(5);

fn read_token_file(path: &Path) -> Result<Vec<u8>, BoundedReadError> {
    read_bounded_or_pipe(path, MAX_TOKEN_BYTES, TOKEN_PIPE_WAIT)
}

/// Where the token came from (reported, never the token itself).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenSource {
    /// `--token-file`.
    TokenFile,
    /// `HF_TOKEN` (or the older `HUGGING_FACE_HUB_TOKEN`).
    Env,
    /// The file at `HF_TOKEN_PATH`.
    TokenPath,
    /// `$HF_HOME/token` (`hf auth login`).
    HfHome,
    /// No token.
    None,
}

/// Why no usable token could be loaded; names the source, never the value.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The token file could not be read as a small regular file.
    #[error("token from {origin}: {source}")]
    Read {
        /// The option or variable and the file it named.
        origin: String,
        /// What the bounded reader found.
        #[source]
        source: BoundedReadError,
    },
    /// `--token-file` names an empty file.
    #[error("token from {origin} is empty")]
    Empty {
        /// The option or variable (and file) the token came from.
        origin: String,
    },
    /// The token holds a byte no HTTP header token may hold.
    #[error(
        "token from {origin} is not a valid token: {problem} (a token is at least 8 bytes \
         of printable ASCII without spaces, line breaks, quotes or backslashes)"
    )]
    Invalid {
        /// The option or variable (and file) the token came from.
        origin: String,
        /// Which byte is wrong and what it is (never the token).
        problem: String,
    },
}

/// A trimmed token checked to be printable ASCII without spaces; `Ok(None)`
/// when only whitespace was given.
pub fn parse_token(raw: &[u8], origin: &str) -> Result<Option<Token>, TokenError> {
    let trimmed = raw.trim_ascii();
    if trimmed.is_empty() {
        return Ok(None);
    }
    if let Some((at, b)) = trimmed
        .iter()
        .enumerate()
        .find(|(_, b)| !b.is_ascii_graphic())
    {
        let what = match b {
            b'\r' => "a carriage return (CR)".to_owned(),
            b'\n' => "a line feed (LF)".to_owned(),
            b' ' => "a space".to_owned(),
            b'\t' => "a tab".to_owned(),
            0x00..=0x1f | 0x7f => format!("the control byte 0x{b:02x}"),
            _ => format!("the non-ASCII byte 0x{b:02x}"),
        };
        return Err(TokenError::Invalid {
            origin: origin.to_owned(),
            problem: format!("byte {at} (after trimming) is {what}"),
        });
    }
    if let Some((at, b)) = trimmed
        .iter()
        .enumerate()
        .find(|(_, b)| matches!(b, b'"' | b'\\'))
    {
        let what = if *b == b'"' {
            "a double quote"
        } else {
            "a backslash"
        };
        return Err(TokenError::Invalid {
            origin: origin.to_owned(),
            problem: format!(
                "byte {at} (after trimming) is {what}, which JSON output escapes, so the \
                 redaction of output could not find the token there"
            ),
        });
    }
    if trimmed.len() < ftpipe_secrets::MIN_SECRET_LEN {
        return Err(TokenError::Invalid {
            origin: origin.to_owned(),
            problem: format!(
                "it is {} bytes, shorter than {} (output is redacted by searching for the \
                 token, and a shorter value would match ordinary text)",
                trimmed.len(),
                ftpipe_secrets::MIN_SECRET_LEN
            ),
        });
    }
    // Every byte is printable ASCII, so this is UTF-8.
    let text = std::str::from_utf8(trimmed).map_err(|_| TokenError::Invalid {
        origin: origin.to_owned(),
        problem: "not UTF-8".to_owned(),
    })?;
    Ok(Token::new(text))
}

/// Non-empty environment variable.
fn env_var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// `HF_HOME` as huggingface_hub resolves it.
fn hf_home() -> Option<PathBuf> {
    if let Some(h) = env_var("HF_HOME") {
        return Some(PathBuf::from(h));
    }
    let base = env_var("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| env_var("HOME").map(|h| Path::new(&h).join(".cache")))?;
    Some(base.join("huggingface"))
}

/// The token as huggingface_hub resolves it: `--token-file` (`token_file`),
/// then `HF_TOKEN`, then the file at `HF_TOKEN_PATH` (default
/// `$HF_HOME/token`). A missing or empty file at the last means no token;
/// anything there that is not a small regular file or a pipe holding a
/// valid token is an error naming it.
pub fn load_token(token_file: Option<&Path>) -> Result<(Option<Token>, TokenSource), TokenError> {
    if let Some(path) = token_file {
        let origin = format!("--token-file {}", path.display());
        let raw = read_token_file(path).map_err(|source| TokenError::Read {
            origin: "--token-file".to_owned(),
            source,
        })?;
        return match parse_token(&raw, &origin)? {
            Some(t) => Ok((Some(t), TokenSource::TokenFile)),
            None => Err(TokenError::Empty { origin }),
        };
    }
    for var in ["HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"] {
        if let Some(raw) = env_var(var)
            && let Some(t) = parse_token(raw.as_bytes(), var)?
        {
            return Ok((Some(t), TokenSource::Env));
        }
    }
    let (path, source, var) = match env_var("HF_TOKEN_PATH") {
        Some(p) => (PathBuf::from(p), TokenSource::TokenPath, "HF_TOKEN_PATH"),
        None => match hf_home() {
            Some(h) => (h.join("token"), TokenSource::HfHome, "$HF_HOME/token"),
            None => return Ok((None, TokenSource::None)),
        },
    };
    match read_token_file(&path) {
        Ok(raw) => {
            let origin = format!("{var} {}", path.display());
            Ok(match parse_token(&raw, &origin)? {
                Some(t) => (Some(t), source),
                None => (None, TokenSource::None),
            })
        }
        Err(e) if e.is_not_found() => Ok((None, TokenSource::None)),
        Err(source) => Err(TokenError::Read {
            origin: var.to_owned(),
            source,
        }),
    }
}

/// Where [`load_token`] takes the token from, found without reading it
/// (a pipe given as `--token-file` can be read once only): the first of
/// `--token-file`, a non-empty `HF_TOKEN` (or `HUGGING_FACE_HUB_TOKEN`),
/// a non-empty file at `HF_TOKEN_PATH`, a non-empty `$HF_HOME/token`.
pub fn token_source(token_file: Option<&Path>) -> TokenSource {
    if token_file.is_some() {
        return TokenSource::TokenFile;
    }
    if ["HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"]
        .iter()
        .any(|v| env_var(v).is_some())
    {
        return TokenSource::Env;
    }
    let (path, source) = match env_var("HF_TOKEN_PATH") {
        Some(p) => (PathBuf::from(p), TokenSource::TokenPath),
        None => match hf_home() {
            Some(h) => (h.join("token"), TokenSource::HfHome),
            None => return TokenSource::None,
        },
    };
    match std::fs::metadata(&path) {
        Ok(m) if m.len() > 0 => source,
        _ => TokenSource::None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_trimmed_printable_ascii_and_errors_never_hold_them() {
        let t = parse_token(b"  hf_abcdefgh\r\n", "X").unwrap().unwrap();
        assert_eq!(format!("{t:?}"), "Token(<redacted>)");
        assert!(parse_token(b" \n", "X").unwrap().is_none());
        for (raw, what) in [
            (&b"hf_se\r\ncret"[..], "carriage return"),
            (b"hf_se\ncret", "line feed"),
            (b"hf se", "space"),
            (b"hf\x01se", "0x01"),
            (b"hf\xc3\xa9se", "non-ASCII"),
            (b"hf_se\"cret", "double quote"),
            (b"hf_se\\cret", "backslash"),
            (b"hf_se", "5 bytes, shorter than 8"),
        ] {
            let err = parse_token(raw, "HF_TOKEN").unwrap_err().to_string();
            assert!(err.contains("HF_TOKEN"), "{err}");
            assert!(err.contains(what), "{err}");
            assert!(!err.contains("hf_se") && !err.contains("cret"), "{err}");
        }
    }

    #[test]
    fn the_token_source_is_found_without_reading_the_token() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("tok");
        assert_eq!(
            token_source(Some(&p)),
            TokenSource::TokenFile,
            "not even opened"
        );
    }

    #[test]
    fn token_file_errors_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("tok");
        std::fs::write(&p, vec![b'a'; 5000]).unwrap();
        let err = load_token(Some(&p)).unwrap_err().to_string();
        assert!(err.contains("--token-file"), "{err}");
        assert!(err.contains(&p.display().to_string()), "{err}");
        assert!(err.contains("4096"), "{err}");
        let err = load_token(Some(Path::new("/dev/zero")))
            .unwrap_err()
            .to_string();
        assert!(err.contains("/dev/zero: is a character device"), "{err}");
        std::fs::write(&p, b"\n").unwrap();
        let err = load_token(Some(&p)).unwrap_err().to_string();
        assert!(err.contains("is empty"), "{err}");
    }
}
